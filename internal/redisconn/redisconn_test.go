package redisconn

import (
	"context"
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
