package redisconn

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

func TestSingleNodePing(t *testing.T) {
	c := New(config.Redis{Mode: "single", Addr: testenv.RedisAddr(t), PoolSize: 2,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
	defer c.Close()
	if _, ok := c.(*redis.Client); !ok {
		t.Fatalf("single mode gave %T, want *redis.Client", c)
	}
	if err := Ping(c)(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestSentinelModeBuildsFailoverClient(t *testing.T) {
	c := New(config.Redis{Mode: "sentinel", MasterName: "kfpipe", SentinelAddrs: []string{"127.0.0.1:1"},
		PoolSize: 2, DialTimeout: 100 * time.Millisecond, ReadTimeout: time.Second, WriteTimeout: time.Second})
	defer c.Close()
	if _, ok := c.(*redis.Client); !ok {
		// go-redis returns a failover *redis.Client for MasterName.
		t.Fatalf("sentinel mode gave %T", c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := Ping(c)(ctx); err == nil {
		t.Fatal("ping through an unreachable sentinel succeeded")
	}
}

// The start-up check refuses every policy that may evict kfpipe's keys
// (all of them carry TTLs, so volatile-* counts too), passes noeviction,
// and refuses a server that hides CONFIG naming the override.
func TestCheckEvictionPolicy(t *testing.T) {
	addr := testenv.PrivateRedis(t)
	c := New(config.Redis{Mode: "single", Addr: addr, PoolSize: 2,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
	defer c.Close()
	ctx := context.Background()
	for _, tc := range []struct {
		policy string
		ok     bool
	}{
		{"noeviction", true},
		{"allkeys-lru", false}, {"allkeys-lfu", false}, {"allkeys-random", false},
		{"volatile-lru", false}, {"volatile-lfu", false}, {"volatile-random", false}, {"volatile-ttl", false},
	} {
		if err := c.ConfigSet(ctx, "maxmemory-policy", tc.policy).Err(); err != nil {
			t.Fatal(err)
		}
		got, err := CheckEvictionPolicy(ctx, c)
		if got != tc.policy {
			t.Errorf("%s: read policy %q", tc.policy, got)
		}
		switch {
		case tc.ok && err != nil:
			t.Errorf("%s refused: %v", tc.policy, err)
		case !tc.ok && err == nil:
			t.Errorf("%s accepted: it may evict dedup marks and cursors", tc.policy)
		case !tc.ok && (!errors.Is(err, ErrEvictionPolicy) || !strings.Contains(err.Error(), "maxmemory-policy is \""+tc.policy+"\"")):
			t.Errorf("%s: error %v does not name the setting and its value", tc.policy, err)
		}
	}

	hidden := New(config.Redis{Mode: "single", Addr: testenv.PrivateRedis(t, "--rename-command", "CONFIG", ""),
		PoolSize: 2, DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
	defer hidden.Close()
	_, err := CheckEvictionPolicy(ctx, hidden)
	if !errors.Is(err, ErrEvictionPolicy) || !strings.Contains(err.Error(), "redis.skip_eviction_policy_check") {
		t.Errorf("CONFIG hidden: got %v, want an error naming redis.skip_eviction_policy_check", err)
	}

	down := New(config.Redis{Mode: "single", Addr: testenv.FreeAddr(t), PoolSize: 1,
		DialTimeout: 100 * time.Millisecond, ReadTimeout: time.Second, WriteTimeout: time.Second})
	defer down.Close()
	if _, err := CheckEvictionPolicy(ctx, down); err == nil || errors.Is(err, ErrEvictionPolicy) {
		t.Errorf("unreachable Redis: got %v, want a connection error to retry on", err)
	}
}
