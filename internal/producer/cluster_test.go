package producer

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/lock"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// On a Redis Cluster the sync lock and the cursor it fences share the
// account's slot, so the fenced cursor write (one script over both keys)
// runs; a holder that lost the lock still cannot write. Without the tag the
// two keys land in different slots and the script is refused.
func TestFencedCursorOnCluster(t *testing.T) {
	rdb, prefix := testenv.RedisCluster(t)
	ctx := context.Background()
	st := NewRedisState(rdb, prefix)
	kf := "wkAccount" + testenv.Short()
	if st.LockKey(kf) != prefix+"lock:sync:{"+kf+"}" || st.CursorKey(kf) != prefix+"cursor:{"+kf+"}" {
		t.Fatalf("keys %q %q are not tagged by the account", st.LockKey(kf), st.CursorKey(kf))
	}
	l := lock.New(rdb, "")
	m, err := l.TryLock(ctx, st.LockKey(kf), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.SetIfHeld(ctx, st.CursorKey(kf), "c1", 0); err != nil {
		t.Fatalf("fenced write on the cluster: %v", err)
	}
	if c, err := st.Cursor(ctx, kf); err != nil || c != "c1" {
		t.Fatalf("cursor %q %v", c, err)
	}
	// The lock taken over by someone else: the old holder is fenced out.
	if err := rdb.Set(ctx, st.LockKey(kf), "someone-else", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if err := m.SetIfHeld(ctx, st.CursorKey(kf), "c2", 0); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("write after losing the lock: %v, want ErrNotHeld", err)
	}
	if c, _ := st.Cursor(ctx, kf); c != "c1" {
		t.Fatalf("cursor %q after a fenced-out write, want c1", c)
	}
	_ = m.Unlock(ctx)
}
