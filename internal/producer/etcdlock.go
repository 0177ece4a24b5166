package producer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kfpipe/kfpipe/internal/coord"
)

// EtcdLocker is Locker on etcd (sync.lock.backend: etcd): an account's
// sync lock is a coord.Lock (lease-bound, kept alive in the background)
// and its cursor lives in etcd, written only by coord.GuardedSet — one
// transaction that compares the lock key's create revision (the fencing
// token of the acquisition) — so a holder whose lease expired cannot move
// the cursor, however late its write arrives. Use it with EtcdState, which
// reads the cursors from where this writes them.
type EtcdLocker struct{ P *coord.Provider }

// TryLock takes the lock name without waiting (ErrLockBusy when held).
func (e EtcdLocker) TryLock(ctx context.Context, name string, ttl time.Duration) (Mutex, error) {
	l, err := e.P.NewLock("sync/"+name, ttl)
	if err != nil {
		return nil, err
	}
	err = l.TryAcquire(ctx)
	if errors.Is(err, coord.ErrLocked) {
		return nil, fmt.Errorf("%w: %w", ErrLockBusy, err)
	}
	if err != nil {
		return nil, err
	}
	return etcdMutex{l: l, fence: l.FencingToken()}, nil
}

// etcdMutex is one acquisition; fence is its token, taken when acquired.
type etcdMutex struct {
	l     *coord.Lock
	fence int64
}

func (m etcdMutex) Lost() <-chan struct{} { return m.l.Done() }

func (m etcdMutex) Unlock(ctx context.Context) error {
	err := m.l.Unlock(ctx)
	if errors.Is(err, coord.ErrNotHeld) {
		return fmt.Errorf("%w: %w", ErrNotHeld, err)
	}
	return err
}

// SetIfHeld writes value under key (an EtcdState.CursorKey) in the config
// center while the acquisition is current. ttl does not apply: cursors
// never expire.
func (m etcdMutex) SetIfHeld(ctx context.Context, key, value string, _ time.Duration) error {
	err := coord.GuardedSet(ctx, m.l, m.fence, key, value)
	if errors.Is(err, coord.ErrFenced) || errors.Is(err, coord.ErrNotHeld) {
		return fmt.Errorf("%w: %w", ErrNotHeld, err)
	}
	return err
}

// EtcdState is State with the cursors in etcd (config center key
// sync/cursors/<open_kfid>, a JSON string) for EtcdLocker, and the pending
// flags where RedisState keeps them. An account with no cursor in etcd yet
// starts from its Redis cursor, so switching sync.lock.backend from redis
// to etcd re-pulls nothing.
type EtcdState struct {
	*RedisState
	CC *coord.ConfigCenter
}

// CursorKey implements State: the config-center key of open_kfid's cursor.
func (e EtcdState) CursorKey(kf string) string { return "sync/cursors/" + kf }

// Cursor implements State.
func (e EtcdState) Cursor(ctx context.Context, kf string) (string, error) {
	v, err := coord.Get[string](ctx, e.CC, e.CursorKey(kf))
	if errors.Is(err, coord.ErrNotFound) {
		return e.RedisState.Cursor(ctx, kf)
	}
	if err != nil {
		return "", fmt.Errorf("read cursor from etcd: %w", err)
	}
	return v, nil
}
