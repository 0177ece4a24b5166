package state_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/state"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestMarkOutlivesEveryReturn (issue 43, item 5): with the shipped
// configurations, a done mark lives at least WeChat's 3-day re-pull
// window plus the DLQ's longest retry horizon after it was written: a
// copy re-pulled on day 3, refused (limiter, breaker, full mailbox) and
// dead-lettered without a look-up is retryable a horizon from its own
// failure, and must still find the mark when it is retried.
func TestMarkOutlivesEveryReturn(t *testing.T) {
	for _, file := range []string{"production.yaml", "development.yaml"} {
		t.Run(file, func(t *testing.T) {
			cfg, err := config.LoadConsumer(filepath.Join(testenv.RepoRoot(t), "config", file))
			if err != nil {
				t.Fatal(err)
			}
			horizon := cfg.Recovery.DefaultTTL
			for _, d := range cfg.Recovery.TTL {
				horizon = max(horizon, d)
			}
			need := 72*time.Hour + horizon
			testenv.EachRedis(t, func(t *testing.T, rdb redis.UniversalClient, prefix string) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				s, err := state.New(ctx, state.Config{Client: rdb, KeyPrefix: prefix, Owner: "a", Lease: 2 * time.Second, TTL: cfg.Dedup.TTL})
				if err != nil {
					t.Fatal(err)
				}
				l, err := s.Acquire(ctx, "t", 0)
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = l.Release(context.Background()) }()
				sent := time.Now().Unix()
				it := state.Item{Key: "wk:retained", SendTime: sent}
				if err := l.Mark(ctx, 1, []state.Item{it}); err != nil {
					t.Fatal(err)
				}
				keys, err := scanKeys(ctx, rdb, fmt.Sprintf("%sst:{t:0}:d:*", prefix))
				if err != nil || len(keys) != 1 {
					t.Fatalf("bucket keys %v (%v), want 1", keys, err)
				}
				ttl, err := rdb.TTL(ctx, keys[0]).Result()
				if err != nil {
					t.Fatal(err)
				}
				if ttl < need {
					t.Fatalf("dedup.ttl %s: the mark lives %s after its write, but a copy re-pulled 72h later and dead-lettered stays retryable until %s after it", cfg.Dedup.TTL, ttl, need)
				}
			})
		})
	}
}

// scanKeys lists the keys matching match on every master.
func scanKeys(ctx context.Context, rdb redis.UniversalClient, match string) ([]string, error) {
	var keys []string
	scan := func(ctx context.Context, c redis.Cmdable) error {
		iter := c.Scan(ctx, 0, match, 1000).Iterator()
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		return iter.Err()
	}
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		return keys, cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return scan(ctx, m) })
	}
	return keys, scan(ctx, rdb)
}
