package ratelimit

import (
	"context"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/testenv"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// t0 is the start of every timeline ("T0" of the scenarios below).
var t0 = time.Date(2030, 1, 1, 8, 0, 0, 0, time.UTC)

// fakeClock is the shared test clock.
type fakeClock = testenv.Clock

func newFakeClock() *fakeClock { return testenv.NewClock(t0) }

// seedConfig is the limiter configuration the project started from (normal
// 10 s / 5 messages, 3 violations block 1 h; vip and suspicious likewise),
// written out here so the tests check it, not whatever the defaults become.
func seedConfig() config.RateLimit {
	return config.RateLimit{
		Enabled:      true,
		DefaultGroup: "normal",
		Groups: map[string]config.RateGroup{
			"normal":     {WindowSeconds: 10, MaxMessages: 5, PenaltyThreshold: 3, BlockHours: 1},
			"vip":        {WindowSeconds: 10, MaxMessages: 20, PenaltyThreshold: 10, BlockHours: 0.5},
			"suspicious": {WindowSeconds: 30, MaxMessages: 3, PenaltyThreshold: 1, BlockHours: 24},
			"whitelist":  {WindowSeconds: 1, MaxMessages: 9999, PenaltyThreshold: 9999, BlockHours: 0},
		},
		Progressive: config.Progressive{Base: time.Hour, Max: 24 * time.Hour, History: 24 * time.Hour},
	}
}

// redisStore returns a Store on the test Redis under a fresh prefix.
func redisStore(t *testing.T) *Store {
	t.Helper()
	rdb, prefix := testenv.Redis(t)
	return NewStore(rdb, prefix)
}

// eachStore runs fn on a Store on the single test Redis and on one on the
// test Redis Cluster (subtests "single" and "cluster").
func eachStore(t *testing.T, fn func(t *testing.T, store *Store)) {
	t.Helper()
	testenv.EachRedis(t, func(t *testing.T, rdb redis.UniversalClient, prefix string) { fn(t, NewStore(rdb, prefix)) })
}

func newLimiter(t testing.TB, cfg config.RateLimit, store *Store, opts ...Option) *Limiter {
	t.Helper()
	l, err := New(cfg, store, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func newAdmin(t *testing.T, cfg config.RateLimit, store *Store, clock Clock) *Admin {
	t.Helper()
	a, err := NewAdmin(store, cfg, WithClock(clock))
	if err != nil {
		t.Fatalf("NewAdmin: %v", err)
	}
	return a
}

var bg = context.Background()

func seedBreaker() config.Breaker {
	return config.Breaker{FailureThreshold: 100, OpenTimeout: 30 * time.Second, HalfOpenMax: 5}
}
