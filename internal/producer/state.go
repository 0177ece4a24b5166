package producer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// State is the sync loop's Redis state besides the lock: the cursor (read
// here, written only through the fenced Mutex.SetIfHeld) and the pending
// flag that hands a trigger to the current lock holder.
type State interface {
	// CursorKey is the Redis key of open_kfid's cursor, for SetIfHeld.
	CursorKey(openKfID string) string
	// Cursor returns the stored cursor, "" when there is none.
	Cursor(ctx context.Context, openKfID string) (string, error)
	// MarkPending records that a sync of openKfID must start after now.
	MarkPending(ctx context.Context, openKfID string, ttl time.Duration) error
	// TakePending clears the flag and reports whether it was set.
	TakePending(ctx context.Context, openKfID string) (bool, error)
	// HasPending reports whether the flag is set, without clearing it.
	HasPending(ctx context.Context, openKfID string) (bool, error)
}

// RedisState is State on Redis, keys prefix+"cursor:{open_kfid}" and
// prefix+"sync:pending:{open_kfid}" (hash tags keep an account's keys in one
// slot).
type RedisState struct {
	c      redis.UniversalClient
	prefix string
}

// NewRedisState returns the State under prefix (e.g. "kfpipe:").
func NewRedisState(c redis.UniversalClient, prefix string) *RedisState {
	return &RedisState{c: c, prefix: prefix}
}

// CursorKey implements State.
func (r *RedisState) CursorKey(kf string) string { return r.prefix + "cursor:" + kf }

func (r *RedisState) pendingKey(kf string) string { return r.prefix + "sync:pending:" + kf }

// Cursor implements State.
func (r *RedisState) Cursor(ctx context.Context, kf string) (string, error) {
	v, err := r.c.Get(ctx, r.CursorKey(kf)).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read cursor: %w", err)
	}
	return v, nil
}

// MarkPending implements State.
func (r *RedisState) MarkPending(ctx context.Context, kf string, ttl time.Duration) error {
	if err := r.c.Set(ctx, r.pendingKey(kf), "1", ttl).Err(); err != nil {
		return fmt.Errorf("set pending flag: %w", err)
	}
	return nil
}

// TakePending implements State with GETDEL, so a flag set after the read
// survives for the next check.
func (r *RedisState) TakePending(ctx context.Context, kf string) (bool, error) {
	err := r.c.GetDel(ctx, r.pendingKey(kf)).Err()
	if errors.Is(err, redis.Nil) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("take pending flag: %w", err)
	}
	return true, nil
}

// HasPending implements State.
func (r *RedisState) HasPending(ctx context.Context, kf string) (bool, error) {
	n, err := r.c.Exists(ctx, r.pendingKey(kf)).Result()
	if err != nil {
		return false, fmt.Errorf("check pending flag: %w", err)
	}
	return n > 0, nil
}
