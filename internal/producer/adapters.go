package producer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kfpipe/kfpipe/internal/lock"
	"github.com/kfpipe/kfpipe/internal/wecom"
)

// WeComSource adapts the WeChat client to Source, mapping its API errors to
// the sync loop's sentinels.
type WeComSource struct{ Client *wecom.Client }

// SyncMsg fetches one page.
func (w WeComSource) SyncMsg(ctx context.Context, req SyncRequest) (*SyncResponse, error) {
	resp, err := w.Client.SyncMsg(ctx, wecom.SyncRequest{Cursor: req.Cursor, Token: req.Token, Limit: req.Limit, OpenKfID: req.OpenKfID})
	switch {
	case err == nil:
	case wecom.IsTokenExpired(err):
		return nil, fmt.Errorf("%w: %w", ErrTokenInvalid, err)
	case wecom.IsRateLimited(err):
		return nil, fmt.Errorf("%w: %w", ErrRateLimited, err)
	default:
		return nil, err
	}
	return &SyncResponse{NextCursor: resp.NextCursor, HasMore: resp.HasMore, MsgList: resp.MsgList, Invalid: resp.Invalid}, nil
}

// LockAdapter adapts internal/lock to Locker. The Locker must be built
// with an empty prefix: the Syncer passes full Redis keys.
type LockAdapter struct{ Locker *lock.Locker }

// TryLock takes name without waiting.
func (a LockAdapter) TryLock(ctx context.Context, name string, ttl time.Duration) (Mutex, error) {
	m, err := a.Locker.TryLock(ctx, name, ttl)
	if errors.Is(err, lock.ErrBusy) {
		return nil, fmt.Errorf("%w: %w", ErrLockBusy, err)
	}
	if err != nil {
		return nil, err
	}
	return lockMutex{m}, nil
}

type lockMutex struct{ m *lock.Mutex }

func (l lockMutex) Lost() <-chan struct{}            { return l.m.Lost() }
func (l lockMutex) Unlock(ctx context.Context) error { return l.m.Unlock(ctx) }

func (l lockMutex) SetIfHeld(ctx context.Context, key, value string, ttl time.Duration) error {
	err := l.m.SetIfHeld(ctx, key, value, ttl)
	if errors.Is(err, lock.ErrNotHeld) {
		return fmt.Errorf("%w: %w", ErrNotHeld, err)
	}
	return err
}

// Remaining implements LockRemainer: the lock key's remaining time to live
// (0 when the key is gone).
func (a LockAdapter) Remaining(ctx context.Context, name string) (time.Duration, error) {
	return a.Locker.Remaining(ctx, name)
}
