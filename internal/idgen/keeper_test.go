package idgen

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

// scriptedAlloc is an Allocator whose outcome the test sets: Allocate
// returns id or err, KeepAlive reports what the test sends on ka.
type scriptedAlloc struct {
	id      int
	err     error
	ka      chan error
	mu      sync.Mutex
	stopped bool
}

func (a *scriptedAlloc) Allocate(context.Context) (int, error) { return a.id, a.err }

func (a *scriptedAlloc) KeepAlive(ctx context.Context) <-chan error {
	out := make(chan error)
	go func() {
		defer close(out)
		for {
			select {
			case <-ctx.Done():
				return
			case err := <-a.ka:
				select {
				case out <- err:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out
}

func (a *scriptedAlloc) Stop(context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.stopped = true
	return nil
}

func (a *scriptedAlloc) isStopped() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stopped
}

// keeperRig records what a Keeper tells its owner.
type keeperRig struct {
	mu        sync.Mutex
	allocs    []*scriptedAlloc // handed out by NewAllocator, in order
	next      []*scriptedAlloc // still to hand out
	installed []int
	lost      []error
	regained  int
}

func (r *keeperRig) config(clk AfterClock) KeeperConfig {
	return KeeperConfig{
		NewAllocator: func() (Allocator, error) {
			r.mu.Lock()
			defer r.mu.Unlock()
			a := r.next[0]
			r.next = r.next[1:]
			r.allocs = append(r.allocs, a)
			return a, nil
		},
		Install: func(id int) error {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.installed = append(r.installed, id)
			return nil
		},
		Lost: func(err error) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.lost = append(r.lost, err)
		},
		Regained: func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.regained++
		},
		Clock: clk,
	}
}

func (r *keeperRig) handedOut() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.allocs)
}

// A lost worker ID pauses (Lost), frees the old key, and is re-allocated
// with the shipped backoff (1 s, doubling, at most 5 s) on the keeper's
// clock until the store answers; then Regained. Close waits for the
// goroutine and frees the new ID.
func TestKeeperReallocatesWithBackoff(t *testing.T) {
	clk := testenv.NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	down := errors.New("store down")
	first := &scriptedAlloc{id: 7, ka: make(chan error)}
	rig := &keeperRig{next: []*scriptedAlloc{first}}
	for range 4 {
		rig.next = append(rig.next, &scriptedAlloc{err: down})
	}
	second := &scriptedAlloc{id: 9, ka: make(chan error)}
	rig.next = append(rig.next, second)
	k, err := NewKeeper(rig.config(clk))
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Err(); !errors.Is(err, ErrNotAllocated) {
		t.Fatalf("Err before Allocate = %v, want ErrNotAllocated", err)
	}
	if err := k.Allocate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := k.Err(); err != nil {
		t.Fatalf("Err while held = %v", err)
	}
	k.Start(context.Background())

	first.ka <- errors.New("renew timeout") // transient: kept
	first.ka <- ErrKeyStolen
	// The first attempt is immediate, then waits of 1 s, 2 s, 4 s.
	for i, wait := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second} {
		attempts := 2 + i
		testenv.Eventually(t, 10*time.Second, func() error {
			return testenv.Check(rig.handedOut() == attempts && clk.Waiters() == 1, "keeper waiting")
		})
		clk.Advance(wait - time.Millisecond)
		time.Sleep(20 * time.Millisecond)
		if n := rig.handedOut(); n != attempts {
			t.Fatalf("attempt %d came before its wait of %s", n, wait)
		}
		clk.Advance(time.Millisecond)
	}
	if err := k.Err(); !errors.Is(err, ErrKeyStolen) {
		t.Fatalf("Err while lost = %v, want ErrKeyStolen", err)
	}
	if !first.isStopped() {
		t.Fatal("the lost allocator was not stopped")
	}
	// The fourth failure waits 5 s (8 s capped), then the store answers.
	testenv.Eventually(t, 10*time.Second, func() error { return testenv.Check(rig.handedOut() == 5 && clk.Waiters() == 1, "keeper waiting") })
	clk.Advance(5 * time.Second)
	testenv.Eventually(t, 10*time.Second, func() error { return testenv.Check(k.Err() == nil, "regained: %v", k.Err()) })

	rig.mu.Lock()
	installed, lost, regained := append([]int(nil), rig.installed...), append([]error(nil), rig.lost...), rig.regained
	rig.mu.Unlock()
	if len(installed) != 2 || installed[0] != 7 || installed[1] != 9 {
		t.Fatalf("installed %v, want [7 9]", installed)
	}
	if len(lost) != 1 || !errors.Is(lost[0], ErrKeyStolen) || regained != 1 {
		t.Fatalf("lost %v regained %d, want one ErrKeyStolen then one regain", lost, regained)
	}
	if err := k.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !second.isStopped() {
		t.Fatal("Close did not free the held ID")
	}
}

// Close of a keeper waiting between re-allocations returns at once: the
// wait is on the keeper's context, not only on its clock.
func TestKeeperCloseWhileWaiting(t *testing.T) {
	clk := testenv.NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	first := &scriptedAlloc{id: 1, ka: make(chan error)}
	rig := &keeperRig{next: []*scriptedAlloc{first, {err: errors.New("store down")}}}
	k, err := NewKeeper(rig.config(clk))
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Allocate(context.Background()); err != nil {
		t.Fatal(err)
	}
	k.Start(context.Background())
	first.ka <- ErrLeaseExpired
	testenv.Eventually(t, 10*time.Second, func() error {
		return testenv.Check(clk.Waiters() == 1, "keeper waiting: %d waiters, want 1", clk.Waiters())
	})
	done := make(chan error, 1)
	go func() { done <- k.Close(context.Background()) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return while the keeper waited")
	}
}

// On the real store: a stolen worker ID is replaced by another one.
func TestKeeperRedisStolenIDReplaced(t *testing.T) {
	b := redisBackend(t)
	var mu sync.Mutex
	var installed []int
	lost := make(chan error, 1)
	k, err := NewKeeper(KeeperConfig{
		NewAllocator: func() (Allocator, error) { return b.newAlloc(t, 4, b.ttl), nil },
		Install: func(id int) error {
			mu.Lock()
			defer mu.Unlock()
			installed = append(installed, id)
			return nil
		},
		Lost: func(err error) { lost <- err },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := k.Allocate(ctx); err != nil {
		t.Fatal(err)
	}
	k.Start(ctx)
	defer func() {
		if err := k.Close(ctx); err != nil {
			t.Error(err)
		}
	}()
	mu.Lock()
	first := installed[0]
	mu.Unlock()
	b.steal(t, first, "someone-else")
	select {
	case err := <-lost:
		if !errors.Is(err, ErrKeyStolen) {
			t.Fatalf("lost with %v, want ErrKeyStolen", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the stolen ID was not noticed")
	}
	testenv.Eventually(t, 10*time.Second, func() error { return testenv.Check(k.Err() == nil, "a new worker ID: %v", k.Err()) })
	mu.Lock()
	defer mu.Unlock()
	if len(installed) != 2 || installed[1] == first {
		t.Fatalf("installed %v, want a second ID other than %d", installed, first)
	}
}
