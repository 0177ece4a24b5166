package ratelimit

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

// roundTrips counts the commands and pipelines a client sends, and the
// commands inside those pipelines.
type roundTrips struct{ cmds, pipes, piped atomic.Int64 }

func (h *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.cmds.Add(1)
		return next(ctx, cmd)
	}
}

func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.pipes.Add(1)
		h.piped.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

func (h *roundTrips) total() int64 { return h.cmds.Load() + h.pipes.Load() }

// TestPrefetch: Prefetch reads the records of a batch of new users in one
// round trip, after which Allow answers them from memory with what Redis
// says — a user blocked in Redis is refused from its first message, a vip
// gets the vip rule. A failed read runs the user on defaults and is
// retried by Allow a second later (message time).
func TestPrefetch(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	store := NewStore(rdb, prefix)
	clock := newFakeClock()
	cfg := seedConfig()
	a := newAdmin(t, cfg, store, clock)
	for _, u := range []string{"blocked", "late"} {
		if err := a.Block(bg, u, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.SetGroup(bg, "vip", "vip"); err != nil {
		t.Fatal(err)
	}
	l := newLimiter(t, cfg, store, WithClock(clock))
	rt := &roundTrips{}
	rdb.AddHook(rt)

	l.Prefetch(bg, []string{"blocked", "vip", "plain", "blocked", "vip"}, t0)
	if rt.pipes.Load() != 1 || rt.cmds.Load() != 0 {
		t.Fatalf("prefetch of 3 users: %d pipelines, %d commands; want 1 pipeline", rt.pipes.Load(), rt.cmds.Load())
	}
	if d := l.Allow(bg, "blocked", t0); d.Reason != ReasonUserBlocked {
		t.Fatalf("first message of a user blocked in Redis: %+v", d)
	}
	for i := range 20 {
		if d := l.Allow(bg, "vip", t0); !d.Allowed || d.Group != "vip" {
			t.Fatalf("vip message %d: %+v", i, d)
		}
	}
	if d := l.Allow(bg, "plain", t0); !d.Allowed || d.Group != "normal" {
		t.Fatalf("plain: %+v", d)
	}
	l.Prefetch(bg, []string{"blocked", "vip", "plain"}, t0)
	if n := rt.total(); n != 1 {
		t.Fatalf("%d round trips after prefetching known users and deciding them; want only the first", n)
	}

	// A read that fails: the user runs on defaults (fail open) without a
	// second read until loadRetry has passed, then Allow reads it.
	dead := redis.NewClient(&redis.Options{Addr: unusedAddr(t), MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { _ = dead.Close() })
	l.store = NewStore(dead, prefix)
	l.Prefetch(bg, []string{"late"}, t0)
	if d := l.Allow(bg, "late", t0); !d.Allowed {
		t.Fatalf("user whose read failed: %+v, want allowed on defaults", d)
	}
	l.store = store
	if d := l.Allow(bg, "late", t0.Add(loadRetry/2)); !d.Allowed {
		t.Fatalf("before loadRetry: %+v, want still on defaults (no read)", d)
	}
	if d := l.Allow(bg, "late", t0.Add(loadRetry)); d.Reason != ReasonUserBlocked {
		t.Fatalf("after loadRetry: %+v, want user_blocked from Redis", d)
	}
}

// TestPrefetchNewUsersOneCommand: a batch of users never seen costs Redis
// one command per loadChunk users (an MGET of their group and block keys),
// not two a user, on a single Redis and on a Cluster (where every rl key
// is in one slot) — a service desk's customers mostly write once, and
// each used to cost two GETs. What Redis holds still decides: a blocked
// user among them is refused, a regrouped one gets its group, the rest
// the default.
func TestPrefetchNewUsersOneCommand(t *testing.T) {
	eachStore(t, func(t *testing.T, store *Store) {
		clock := newFakeClock()
		cfg := seedConfig()
		a := newAdmin(t, cfg, store, clock)
		if err := a.Block(bg, "u-17", time.Hour); err != nil {
			t.Fatal(err)
		}
		if err := a.SetGroup(bg, "u-600", "vip"); err != nil {
			t.Fatal(err)
		}
		l := newLimiter(t, cfg, store, WithClock(clock))
		rt := &roundTrips{}
		store.rdb.AddHook(rt)
		users := make([]string, loadChunk+88)
		for i := range users {
			users[i] = fmt.Sprintf("u-%d", i)
		}
		l.Prefetch(bg, users, t0)
		if rt.pipes.Load() != 1 || rt.cmds.Load() != 0 || rt.piped.Load() != 2 {
			t.Fatalf("prefetch of %d new users: %d pipelines of %d commands, %d commands alone; want 1 pipeline of 2 MGETs",
				len(users), rt.pipes.Load(), rt.piped.Load(), rt.cmds.Load())
		}
		for i, u := range users {
			d := l.Allow(bg, u, t0)
			switch {
			case i == 17:
				if d.Reason != ReasonUserBlocked {
					t.Fatalf("%s, blocked in Redis: %+v", u, d)
				}
			case i == 600:
				if !d.Allowed || d.Group != "vip" {
					t.Fatalf("%s, vip in Redis: %+v", u, d)
				}
			default:
				if !d.Allowed || d.Group != "normal" {
					t.Fatalf("%s: %+v, want allowed in the default group", u, d)
				}
			}
		}
		if n := rt.total(); n != 1 {
			t.Fatalf("%d round trips after deciding the prefetched users; want only the prefetch", n)
		}
	})
}

// unusedAddr returns a loopback address nobody listens on.
func unusedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// After a read fails, the new users of the same moment run on defaults
// without a read each: a Redis that does not answer costs one timeout a
// loadRetry (message time), not one per user (the consumer's poll goroutine
// makes these reads, and a batch of 256 new users each waiting on a
// blackholed Redis held it for minutes). After loadRetry reads resume.
func TestFailedReadPausesReads(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	l := newLimiter(t, seedConfig(), NewStore(rdb, prefix), WithClock(newFakeClock()))
	rt := &roundTrips{}
	dead := redis.NewClient(&redis.Options{Addr: unusedAddr(t), MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	dead.AddHook(rt)
	t.Cleanup(func() { _ = dead.Close() })
	l.store = NewStore(dead, prefix) // Redis gone after the start
	t0 := time.Now()
	l.Prefetch(bg, []string{"first"}, t0)
	if rt.total() != 1 {
		t.Fatalf("prefetch: %d round trips, want 1", rt.total())
	}
	for i := range 20 {
		if d := l.Allow(bg, fmt.Sprintf("new-%d", i), t0.Add(time.Duration(i)*time.Millisecond)); !d.Allowed {
			t.Fatalf("new user %d while reads pause: %+v, want allowed on defaults", i, d)
		}
	}
	l.Prefetch(bg, []string{"other-1", "other-2"}, t0.Add(loadRetry/2))
	if n := rt.total(); n != 1 {
		t.Fatalf("%d round trips within loadRetry of the failure, want only the failed one", n)
	}
	if d := l.Allow(bg, "later", t0.Add(loadRetry)); !d.Allowed || rt.total() != 2 {
		t.Fatalf("after loadRetry: %+v, %d round trips; want a read (2) and defaults", d, rt.total())
	}
}
