package redisconn

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
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

// TestErrorsCountOOM: a Redis at maxmemory under noeviction refuses writes
// with OOM while it still answers PING and reads. The hook counts each
// refusal as oom — in a pipeline too — and the /readyz detail says so;
// a missing key (redis.Nil) and a script's first NOSCRIPT are not errors.
func TestErrorsCountOOM(t *testing.T) {
	addr := testenv.PrivateRedis(t)
	c := New(config.Redis{Mode: "single", Addr: addr, PoolSize: 2,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
	defer c.Close()
	reg := prometheus.NewRegistry()
	e := Instrument(c, reg)
	ctx := context.Background()
	count := func(kind string) float64 {
		var m dto.Metric
		if err := e.byKind.WithLabelValues(kind).Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}

	if err := c.Get(ctx, "missing").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("get missing: %v", err)
	}
	if err := redis.NewScript(`return 1`).Run(ctx, c, nil).Err(); err != nil {
		t.Fatal(err)
	}
	if e.OOMDetail() != "" || count("oom") != 0 || count("other") != 0 {
		t.Fatalf("errors before any refusal: oom %v other %v detail %q", count("oom"), count("other"), e.OOMDetail())
	}
	if err := c.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, "k", "v", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "OOM ") {
		t.Fatalf("set at maxmemory: %v, want OOM", err)
	}
	pipe := c.Pipeline()
	pipe.Set(ctx, "a", "1", 0)
	pipe.Set(ctx, "b", "1", 0)
	_, _ = pipe.Exec(ctx)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("ping at maxmemory: %v (readiness alone would not show it)", err)
	}
	if got := count("oom"); got != 3 {
		t.Fatalf("oom refusals counted %v, want 3", got)
	}
	if d := e.OOMDetail(); !strings.Contains(d, "out of memory") {
		t.Fatalf("detail %q", d)
	}
	if err := c.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
}
