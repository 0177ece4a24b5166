package coord

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Lock is a distributed mutex on a key (an etcd concurrency.Mutex under
// locks/<key>/): one holder at a time across every process, waiters served
// in arrival order. Each acquisition holds its own lease of the Lock's TTL,
// kept alive in the background; a holder that dies (or is cut off from etcd
// for longer than the TTL) loses the lock when the lease expires.
//
// A holder cut off from etcd cannot know at once that it lost the lock, so
// writes that must not come from a stale holder go through GuardedPut with
// the FencingToken of the acquisition.
//
// A Lock represents one holder; its methods are safe for concurrent use,
// but Acquire on a Lock that is already held fails rather than waiting.
type Lock struct {
	p   *Provider
	key string
	ttl time.Duration

	mu     sync.Mutex
	sess   *concurrency.Session // nil when not held
	fence  int64                // create revision of holder; 0 when not held
	holder string               // our waiter key of the last acquisition, kept after it ends
	stop   chan struct{}        // closed when the hold ends on purpose
	loss   *leaseLoss           // of the current hold
}

// NewLock returns a Lock on key with a lease of ttl (0: Config.KeepAlive;
// etcd counts whole seconds, so ttl is rounded up). Nothing is acquired yet.
func (p *Provider) NewLock(key string, ttl time.Duration) (*Lock, error) {
	if key == "" {
		return nil, errors.New("coord: lock key must not be empty")
	}
	ttl, err := p.ttlOrDefault(ttl)
	if err != nil {
		return nil, err
	}
	return &Lock{p: p, key: key, ttl: time.Duration(leaseSeconds(ttl)) * time.Second}, nil
}

// Key returns the lock's key, as given to NewLock.
func (l *Lock) Key() string { return l.key }

// TTL returns the lease TTL of each acquisition.
func (l *Lock) TTL() time.Duration { return l.ttl }

// Acquire waits until the lock is ours or ctx ends.
func (l *Lock) Acquire(ctx context.Context) error { return l.acquire(ctx, true) }

// TryAcquire takes the lock if it is free and returns ErrLocked at once if
// another holder has it.
func (l *Lock) TryAcquire(ctx context.Context) error { return l.acquire(ctx, false) }

func (l *Lock) acquire(ctx context.Context, wait bool) error {
	p := l.p
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sess != nil {
		return fmt.Errorf("coord: lock %q is already held by this Lock", l.key)
	}
	if p.isClosed() {
		return ErrClosed
	}
	ctx, cancel := p.bind(ctx)
	defer cancel()
	sess, err := p.newSession(ctx, l.ttl)
	if err != nil {
		return fmt.Errorf("coord: lock %q: %w", l.key, err)
	}
	m := concurrency.NewMutex(sess, dirLocks+l.key)
	if wait {
		err = m.Lock(ctx)
	} else {
		err = m.TryLock(ctx)
	}
	if err != nil {
		cctx, ccancel := context.WithTimeout(context.Background(), p.cfg.DialTimeout)
		defer ccancel()
		_ = p.closeSession(cctx, sess) // deletes our waiter key if still there
		switch {
		case errors.Is(err, concurrency.ErrLocked):
			return fmt.Errorf("%w: %q", ErrLocked, l.key)
		case p.isClosed():
			return ErrClosed
		}
		return fmt.Errorf("coord: lock %q: %w", l.key, err)
	}
	owner := m.IsOwner() // CreateRevision(our key) == our create revision
	l.sess, l.holder, l.stop, l.loss = sess, m.Key(), make(chan struct{}), p.newLeaseLoss(kindLock)
	l.fence = owner.GetCompare().GetCreateRevision()

	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		rctx, rcancel := context.WithTimeout(context.Background(), p.cfg.DialTimeout)
		defer rcancel()
		_ = l.releaseLocked(rctx)
		return ErrClosed
	}
	p.locks[l] = struct{}{}
	p.mu.Unlock()
	if err := p.monitor(l.loss, sess, l.stop, nil); err != nil {
		return err // closing: Close releases l
	}
	return nil
}

// FencingToken returns the create revision of the current acquisition's
// key (0 when not held): it grows with every acquisition of the key by
// anyone, so a larger token is a later holder.
func (l *Lock) FencingToken() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fence
}

// Done returns a channel closed when the current hold ends: Unlock, Close,
// or the lease lost. It is closed already when the lock is not held.
func (l *Lock) Done() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sess == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return l.sess.Done()
}

// Remaining returns how long the lease of the current hold has left before
// it expires if not renewed (it is renewed in the background).
func (l *Lock) Remaining(ctx context.Context) (time.Duration, error) {
	l.mu.Lock()
	sess := l.sess
	l.mu.Unlock()
	if sess == nil {
		return 0, fmt.Errorf("%w: %q", ErrNotHeld, l.key)
	}
	resp, err := l.p.cli.TimeToLive(ctx, sess.Lease())
	if err != nil {
		return 0, fmt.Errorf("coord: lock %q: lease time to live: %w", l.key, err)
	}
	if resp.TTL <= 0 {
		return 0, fmt.Errorf("%w: %q: lease expired", ErrNotHeld, l.key)
	}
	return time.Duration(resp.TTL) * time.Second, nil
}

// Unlock releases the lock (revoking its lease). ErrNotHeld when the lock
// was not held — including when its lease was lost before Unlock, in which
// case another holder may have had it meanwhile.
func (l *Lock) Unlock(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sess == nil {
		return fmt.Errorf("%w: %q", ErrNotHeld, l.key)
	}
	l.p.mu.Lock()
	delete(l.p.locks, l)
	l.p.mu.Unlock()
	lost := isDone(l.sess.Done())
	if lost {
		l.loss.report(l.sess) // unless the monitor did
	}
	if err := l.releaseLocked(ctx); err != nil {
		return err
	}
	if lost {
		return fmt.Errorf("%w: %q: its lease was lost before Unlock", ErrNotHeld, l.key)
	}
	return nil
}

// release is Unlock for Provider.Close.
func (l *Lock) release(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sess == nil {
		return nil
	}
	return l.releaseLocked(ctx)
}

func (l *Lock) releaseLocked(ctx context.Context) error {
	close(l.stop)
	sess := l.sess
	l.sess, l.fence, l.stop = nil, 0, nil
	if err := l.p.closeSession(ctx, sess); err != nil {
		return fmt.Errorf("coord: unlock %q: %w", l.key, err)
	}
	return nil
}

// GuardedPut writes val to key (relative to the namespace, like every key
// of this package) only while fence is still the lock's current holder —
// that is, while the acquisition that returned fence from FencingToken has
// not ended (unlocked, expired, revoked). The check and the write are one
// etcd transaction, so a stale holder's write is rejected with ErrFenced
// however late it arrives.
func (l *Lock) GuardedPut(ctx context.Context, fence int64, key, val string) error {
	l.mu.Lock()
	holder := l.holder
	l.mu.Unlock()
	if holder == "" {
		return fmt.Errorf("%w: %q was never acquired", ErrNotHeld, l.key)
	}
	if fence <= 0 {
		// A missing key has create revision 0: never compare against it.
		return fmt.Errorf("%w: lock %q, token %d is not a token", ErrFenced, l.key, fence)
	}
	resp, err := l.p.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(holder), "=", fence)).
		Then(clientv3.OpPut(key, val)).
		Commit()
	if err != nil {
		return fmt.Errorf("coord: guarded put %q: %w", key, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: lock %q, token %d: put %q rejected", ErrFenced, l.key, fence, key)
	}
	return nil
}

// GuardedSet is GuardedPut into the config center: it stores v (as
// Set does) under key only while fence is still the lock's current holder,
// so Get, Watch and the other config functions read it.
func GuardedSet[T any](ctx context.Context, l *Lock, fence int64, key string, v T) error {
	ck, err := configKey(key)
	if err != nil {
		return err
	}
	val, err := encode(key, v)
	if err != nil {
		return err
	}
	return l.GuardedPut(ctx, fence, ck, val)
}
