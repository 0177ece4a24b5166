package dlq

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/redisconn"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// On a Redis Cluster the whole index is one slot (prefix+{dlq}:): every
// key it writes for letters of many users and reasons is in slot
// Slot("{dlq}") on one master, and no other master gets any. The test
// logs that master's script CPU per indexed letter (docs/operations.md,
// "Redis Cluster").
func TestIndexIsOneSlotOnCluster(t *testing.T) {
	rdb, prefix := testenv.RedisCluster(t)
	ctx := context.Background()
	clk := newClock()
	idx := NewIndex(rdb, prefix, WithClock(clk))
	evalUsec := func() map[string]float64 {
		var mu sync.Mutex
		out := map[string]float64{}
		_ = rdb.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			info, err := m.Info(ctx, "commandstats").Result()
			if err != nil {
				return err
			}
			var us float64
			for _, l := range strings.Split(info, "\n") {
				if strings.HasPrefix(l, "cmdstat_evalsha:") || strings.HasPrefix(l, "cmdstat_eval:") {
					for _, f := range strings.Split(strings.TrimSpace(l[strings.IndexByte(l, ':')+1:]), ",") {
						if v, ok := strings.CutPrefix(f, "usec="); ok {
							n, _ := strconv.ParseFloat(v, 64)
							us += n
						}
					}
				}
			}
			mu.Lock()
			out[m.Options().Addr] = us
			mu.Unlock()
			return nil
		})
		return out
	}
	before := evalUsec()
	const letters = 600
	for i := range letters {
		dl := deadLetter(fmt.Sprintf("user-%d", i%60), []Reason{ReasonDownstreamError, ReasonRateLimited, ReasonQueueFull}[i%3],
			int64(i), clk.Now())
		NewPolicy(testRecovery()).Place(ctx, dl)
		if _, err := idx.Index(ctx, dl, Coord{Partition: 0, Offset: int64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	after := evalUsec()
	slot := redisconn.Slot(prefix + "{dlq}:")
	holders := map[string]int{}
	var mu sync.Mutex
	err := rdb.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		keys, err := m.Keys(ctx, prefix+"*").Result()
		if err != nil {
			return err
		}
		for _, k := range keys {
			if s := redisconn.Slot(k); s != slot {
				return fmt.Errorf("key %s in slot %d, want the index's slot %d", k, s, slot)
			}
		}
		if len(keys) > 0 {
			mu.Lock()
			holders[m.Options().Addr] += len(keys)
			mu.Unlock()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(holders) != 1 {
		t.Fatalf("index keys on %d masters (%v), want one", len(holders), holders)
	}
	for addr, n := range holders {
		if n < letters {
			t.Fatalf("%d index keys on %s for %d letters", n, addr, letters)
		}
		t.Logf("slot %d on master %s: %d keys for %d letters of 60 users; script CPU %.1f µs per letter there "+
			"(other masters: %v → %v µs, traffic of other tests included)",
			slot, addr, n, letters, (after[addr]-before[addr])/letters, before, after)
	}
}
