package producer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/redisconn"
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

// CursorKey implements State. On a Redis Cluster the account is a hash tag
// (cursor:{open_kfid}), so the cursor and its sync lock share a slot and
// the fenced write (one script over both) runs; elsewhere the names are
// unchanged.
func (r *RedisState) CursorKey(kf string) string {
	return r.prefix + "cursor:" + redisconn.Tag(r.c, kf)
}

// LockKey is the Redis key of open_kfid's sync lock (lock:sync:{open_kfid}
// on a Cluster, in the cursor's slot).
func (r *RedisState) LockKey(kf string) string {
	return r.prefix + "lock:sync:" + redisconn.Tag(r.c, kf)
}

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

// statusKey is the hash of the accounts' SyncStatus, one field per
// open_kfid.
func (r *RedisState) statusKey() string { return r.prefix + "sync:status" }

// WriteSyncStatus implements StatusWriter: one HSET of the accounts' JSON.
func (r *RedisState) WriteSyncStatus(ctx context.Context, st []SyncStatus) error {
	args := make([]any, 0, 2*len(st))
	for _, s := range st {
		b, err := json.Marshal(s)
		if err != nil {
			return err
		}
		args = append(args, s.OpenKfID, b)
	}
	if err := r.c.HSet(ctx, r.statusKey(), args...).Err(); err != nil {
		return fmt.Errorf("write sync status: %w", err)
	}
	return nil
}

// RemoveSyncStatus drops the status of accounts no longer synced, so the
// console stops listing them.
func (r *RedisState) RemoveSyncStatus(ctx context.Context, kfs []string) error {
	if len(kfs) == 0 {
		return nil
	}
	return r.c.HDel(ctx, r.statusKey(), kfs...).Err()
}

// SyncStatuses returns every account's last published SyncStatus, sorted
// by open_kfid; a field that does not decode is skipped.
func (r *RedisState) SyncStatuses(ctx context.Context) ([]SyncStatus, error) {
	m, err := r.c.HGetAll(ctx, r.statusKey()).Result()
	if err != nil {
		return nil, fmt.Errorf("read sync status: %w", err)
	}
	out := make([]SyncStatus, 0, len(m))
	for kf, v := range m {
		var s SyncStatus
		if json.Unmarshal([]byte(v), &s) != nil {
			continue
		}
		s.OpenKfID = kf
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b SyncStatus) int { return strings.Compare(a.OpenKfID, b.OpenKfID) })
	return out, nil
}
