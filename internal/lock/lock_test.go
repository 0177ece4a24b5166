package lock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func lockers(t *testing.T, opts ...Option) (*Locker, *redis.Client, string) {
	t.Helper()
	rdb, prefix := testenv.Redis(t)
	return New(rdb, prefix, opts...), rdb, prefix
}

func unlock(t *testing.T, m *Mutex) {
	t.Helper()
	if err := m.Unlock(context.Background()); err != nil {
		t.Fatalf("unlock: %v", err)
	}
}

func TestTryLockBusy(t *testing.T) {
	t.Parallel()
	l, rdb, prefix := lockers(t)
	ctx := ctxT(t, 10*time.Second)
	m, err := l.TryLock(ctx, "lock:sync:kf1", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if m.Name() != "lock:sync:kf1" || m.Key() != prefix+"lock:sync:kf1" || m.Value() == "" {
		t.Fatalf("name %q key %q value %q", m.Name(), m.Key(), m.Value())
	}
	if v, _ := rdb.Get(ctx, m.Key()).Result(); v != m.Value() {
		t.Fatalf("redis holds %q, want our value", v)
	}
	if _, err := l.TryLock(ctx, "lock:sync:kf1", time.Second); !errors.Is(err, ErrBusy) {
		t.Fatalf("second TryLock: %v, want ErrBusy", err)
	}
	// Another name is independent.
	other, err := l.TryLock(ctx, "lock:sync:kf2", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	unlock(t, other)
	unlock(t, m)
	if err := m.Unlock(ctx); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("second Unlock: %v", err)
	}
	again, err := l.TryLock(ctx, "lock:sync:kf1", time.Second)
	if err != nil {
		t.Fatalf("after Unlock: %v", err)
	}
	unlock(t, again)
}

func TestLockWaitsThenAcquires(t *testing.T) {
	t.Parallel()
	l, _, _ := lockers(t, WithRetryDelay(10*time.Millisecond))
	ctx := ctxT(t, 10*time.Second)
	holder, err := l.TryLock(ctx, "w", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *Mutex, 1)
	errc := make(chan error, 1)
	go func() {
		m, err := l.Lock(ctx, "w", 2*time.Second)
		if err != nil {
			errc <- err
			return
		}
		got <- m
	}()
	select {
	case <-got:
		t.Fatal("Lock acquired a held lock")
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(150 * time.Millisecond):
	}
	released := time.Now()
	unlock(t, holder)
	select {
	case m := <-got:
		if d := time.Since(released); d > time.Second {
			t.Fatalf("acquired %v after release", d)
		}
		unlock(t, m)
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(5 * time.Second):
		t.Fatal("Lock did not acquire after Unlock")
	}
}

func TestLockHonoursContext(t *testing.T) {
	t.Parallel()
	l, _, _ := lockers(t, WithRetryDelay(10*time.Millisecond))
	ctx := ctxT(t, 10*time.Second)
	holder, err := l.TryLock(ctx, "c", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock(t, holder)
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := l.Lock(wctx, "c", 2*time.Second); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock = %v, want deadline exceeded", err)
	}
}

func TestExtensionKeepsLockBeyondTTL(t *testing.T) {
	t.Parallel()
	l, rdb, _ := lockers(t)
	ctx := ctxT(t, 10*time.Second)
	const ttl = 300 * time.Millisecond
	m, err := l.TryLock(ctx, "ext", ttl)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * ttl)
	if other, err := l.TryLock(ctx, "ext", ttl); !errors.Is(err, ErrBusy) {
		if err == nil {
			unlock(t, other)
		}
		t.Fatalf("after 4×ttl the lock is not held: %v", err)
	}
	if v, _ := rdb.Get(ctx, m.Key()).Result(); v != m.Value() {
		t.Fatalf("redis holds %q", v)
	}
	select {
	case <-m.Lost():
		t.Fatal("Lost closed while the lock is held")
	default:
	}
	unlock(t, m)
	if n, _ := rdb.Exists(ctx, m.Key()).Result(); n != 0 {
		t.Fatal("key remains after Unlock")
	}
}

func TestSetIfHeldFencesAnExpiredHolder(t *testing.T) {
	t.Parallel()
	l, rdb, prefix := lockers(t, WithAutoExtend(false))
	ctx := ctxT(t, 10*time.Second)
	const ttl = 100 * time.Millisecond
	first, err := l.TryLock(ctx, "lock:sync:kf", ttl)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.SetIfHeld(ctx, "cursor:kf", "c1", 0); err != nil {
		t.Fatalf("write while held: %v", err)
	}
	if v, _ := rdb.Get(ctx, prefix+"cursor:kf").Result(); v != "c1" {
		t.Fatalf("cursor = %q", v)
	}
	time.Sleep(ttl + 50*time.Millisecond) // first's lock expires unnoticed
	second, err := l.TryLock(ctx, "lock:sync:kf", time.Second)
	if err != nil {
		t.Fatalf("second holder: %v", err)
	}
	if err := second.SetIfHeld(ctx, "cursor:kf", "c2", time.Hour); err != nil {
		t.Fatalf("second write: %v", err)
	}
	if err := first.SetIfHeld(ctx, "cursor:kf", "stale", 0); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("stale holder write: %v, want ErrNotHeld", err)
	}
	if v, _ := rdb.Get(ctx, prefix+"cursor:kf").Result(); v != "c2" {
		t.Fatalf("cursor = %q, want the second holder's c2", v)
	}
	if d, _ := rdb.PTTL(ctx, prefix+"cursor:kf").Result(); d <= 59*time.Minute {
		t.Fatalf("cursor PTTL %v, want ≈ 1h", d)
	}
	select {
	case <-first.Lost():
	default:
		t.Fatal("first.Lost not closed after a refused fenced write")
	}
	if err := first.Unlock(ctx); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("stale Unlock: %v", err)
	}
	if v, _ := rdb.Get(ctx, second.Key()).Result(); v != second.Value() {
		t.Fatal("stale Unlock removed the second holder's lock")
	}
	unlock(t, second)
}

func TestManualExtendWithoutAutoExtend(t *testing.T) {
	t.Parallel()
	l, _, _ := lockers(t, WithAutoExtend(false))
	ctx := ctxT(t, 10*time.Second)
	const ttl = 100 * time.Millisecond
	m, err := l.TryLock(ctx, "man", ttl)
	if err != nil {
		t.Fatal(err)
	}
	for range 4 {
		time.Sleep(ttl / 2)
		if err := m.Extend(ctx); err != nil {
			t.Fatalf("Extend: %v", err)
		}
	}
	unlock(t, m)
	if err := m.Extend(ctx); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Extend after Unlock: %v", err)
	}
}

func TestLostWhenKeyDeletedOrStolen(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		steal func(ctx context.Context, rdb *redis.Client, key string) error
	}{
		{"deleted", func(ctx context.Context, rdb *redis.Client, key string) error { return rdb.Del(ctx, key).Err() }},
		{"stolen", func(ctx context.Context, rdb *redis.Client, key string) error {
			return rdb.Set(ctx, key, "someone-else", time.Minute).Err()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			reg := prometheus.NewRegistry()
			l, rdb, _ := lockers(t, WithRegisterer(reg))
			ctx := ctxT(t, 10*time.Second)
			m, err := l.TryLock(ctx, "lost", 150*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			if err := tc.steal(ctx, rdb, m.Key()); err != nil {
				t.Fatal(err)
			}
			select {
			case <-m.Lost():
			case <-time.After(2 * time.Second):
				t.Fatal("Lost not closed")
			}
			if got := testenv.MetricValue(l.lost); got != 1 {
				t.Fatalf("kfpipe_lock_lost_total = %v", got)
			}
			if err := m.SetIfHeld(ctx, "x", "y", 0); !errors.Is(err, ErrNotHeld) {
				t.Fatalf("SetIfHeld after loss: %v", err)
			}
			if err := m.Unlock(ctx); !errors.Is(err, ErrNotHeld) {
				t.Fatalf("Unlock after loss: %v", err)
			}
			if tc.name == "stolen" {
				if v, _ := rdb.Get(ctx, m.Key()).Result(); v != "someone-else" {
					t.Fatalf("Unlock of a lost lock touched the new holder's key: %q", v)
				}
			}
		})
	}
}

func TestTTLTooShort(t *testing.T) {
	t.Parallel()
	l, _, _ := lockers(t)
	if _, err := l.Lock(context.Background(), "x", time.Millisecond); err == nil {
		t.Fatal("1ms ttl accepted")
	}
}
