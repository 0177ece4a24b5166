package coord

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/testenv"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func newLock(t *testing.T, p *Provider, key string, ttl time.Duration) *Lock {
	t.Helper()
	l, err := p.NewLock(key, ttl)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestLockExcludesOtherProviders(t *testing.T) {
	raw, ns := testenv.Etcd(t)
	p1, p2 := newProvider(t, ns), newProvider(t, ns)
	ctx := t.Context()
	a, b := newLock(t, p1, "job", 0), newLock(t, p2, "job", 0)
	if a.Key() != "job" || a.TTL() != DefaultKeepAlive {
		t.Fatalf("Key, TTL = %q, %s", a.Key(), a.TTL())
	}

	if err := a.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	if rem, err := a.Remaining(ctx); err != nil || rem <= 0 || rem > a.TTL() {
		t.Fatalf("Remaining = %s, %v", rem, err)
	}
	start := time.Now()
	if err := b.TryAcquire(ctx); !errors.Is(err, ErrLocked) {
		t.Fatalf("TryAcquire of a held lock: %v, want ErrLocked", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("TryAcquire took %s: it must not wait", d)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err := b.Acquire(short)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire of a held lock: %v, want to wait until the deadline", err)
	}

	acquired := make(chan error, 1)
	go func() { acquired <- b.Acquire(ctx) }()
	fa := a.FencingToken()
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := recv(t, (<-chan error)(acquired)); err != nil {
		t.Fatalf("Acquire after Unlock: %v", err)
	}
	if fb := b.FencingToken(); fb <= fa || a.FencingToken() != 0 {
		t.Fatalf("tokens: first holder %d, second %d, first after Unlock %d; want increasing and 0", fa, fb, a.FencingToken())
	}
	if err := a.Unlock(ctx); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("second Unlock: %v, want ErrNotHeld", err)
	}
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if resp, err := raw.Get(ctx, ns+dirLocks, clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || resp.Count != 0 {
		t.Fatalf("lock keys left after Unlock: %v %v", resp.Count, err)
	}

	// Mutual exclusion under contention: a read-modify-write of a plain key
	// inside the lock loses no increment.
	const workers, rounds = 4, 5
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := []*Provider{p1, p2}[w%2].NewLock("counter", 0)
			if err != nil {
				errc <- err
				return
			}
			for range rounds {
				if err := increment(ctx, l, raw, ns+"n"); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	resp, err := raw.Get(ctx, ns+"n")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != strconv.Itoa(workers*rounds) {
		t.Fatalf("counter = %+v, %v; want %d", resp.Kvs, err, workers*rounds)
	}
}

func increment(ctx context.Context, l *Lock, raw *clientv3.Client, key string) error {
	if err := l.Acquire(ctx); err != nil {
		return err
	}
	resp, err := raw.Get(ctx, key)
	if err != nil {
		return err
	}
	n := 0
	if len(resp.Kvs) == 1 {
		n, _ = strconv.Atoi(string(resp.Kvs[0].Value))
	}
	if _, err := raw.Put(ctx, key, strconv.Itoa(n+1)); err != nil {
		return err
	}
	return l.Unlock(ctx)
}

// A holder that lost the lock (lease revoked) while another took it cannot
// write with its old fencing token.
func TestLockStaleHolderIsFenced(t *testing.T) {
	raw, ns := testenv.Etcd(t)
	p1, p2 := newProvider(t, ns), newProvider(t, ns)
	ctx := t.Context()
	// A short TTL for a: its keep-alive, which learns of the loss, runs every TTL/3.
	a, b := newLock(t, p1, "cursor", 3*time.Second), newLock(t, p2, "cursor", 0)

	if err := a.GuardedPut(ctx, 1, "cursor-value", "x"); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("GuardedPut before any Acquire: %v, want ErrNotHeld", err)
	}
	if err := a.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	fa := a.FencingToken()
	if err := a.GuardedPut(ctx, fa, "cursor-value", "from-a"); err != nil {
		t.Fatalf("GuardedPut by the holder: %v", err)
	}
	if err := a.GuardedPut(ctx, 0, "cursor-value", "from-a"); !errors.Is(err, ErrFenced) {
		t.Fatalf("GuardedPut with token 0: %v, want ErrFenced", err)
	}

	// a's lease is revoked behind its back (as when it was cut off for
	// longer than the TTL); b takes the lock.
	resp, err := raw.Get(ctx, ns+dirLocks+"cursor/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("lock keys: %v %v", resp, err)
	}
	if _, err := raw.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	if err := b.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	fb := b.FencingToken()
	if fb <= fa {
		t.Fatalf("token of the new holder %d <= old %d", fb, fa)
	}
	if err := b.GuardedPut(ctx, fb, "cursor-value", "from-b"); err != nil {
		t.Fatalf("GuardedPut by the new holder: %v", err)
	}
	if err := a.GuardedPut(ctx, fa, "cursor-value", "stale"); !errors.Is(err, ErrFenced) {
		t.Fatalf("GuardedPut by the stale holder: %v, want ErrFenced", err)
	}
	if err := b.GuardedPut(ctx, fa, "cursor-value", "stale"); !errors.Is(err, ErrFenced) {
		t.Fatalf("GuardedPut with the old token on the new holder: %v, want ErrFenced", err)
	}
	got, err := raw.Get(ctx, ns+"cursor-value")
	if err != nil || len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "from-b" {
		t.Fatalf("value = %+v, %v; want from-b", got.Kvs, err)
	}
	select {
	case <-a.Done():
	case <-time.After(wait):
		t.Fatal("Done of the stale holder not closed")
	}
	if err := a.Unlock(ctx); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Unlock after the loss: %v, want ErrNotHeld", err)
	}
	if n := testenv.MetricValue(p1.m.lost.WithLabelValues(kindLock)); n != 1 {
		t.Fatalf("lock lease losses = %v, want 1", n)
	}
}
