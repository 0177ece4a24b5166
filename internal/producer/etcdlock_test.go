package producer

import (
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kfpipe/kfpipe/internal/coord/coordtest"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestEtcdLockFencesCursorWrite: with sync.lock.backend etcd an account's
// lock excludes a second holder, and a holder whose lease was lost (here
// revoked behind its back, as an expiry during a pause would) cannot move
// the cursor any more — its write is rejected by the transaction on the
// lock key's create revision — while the new holder's write lands. A
// cursor that is only in Redis (before the switch to etcd) is read from
// there.
func TestEtcdLockFencesCursorWrite(t *testing.T) {
	raw, ns := testenv.Etcd(t)
	rdb, prefix := testenv.Redis(t)
	ctx := t.Context()
	a, b := coordtest.Provider(t, ns), coordtest.Provider(t, ns)
	st := EtcdState{RedisState: NewRedisState(rdb, prefix), CC: a.Config()}
	const kf = "wk-fence"
	name := prefix + "lock:sync:" + kf

	ma, err := EtcdLocker{P: a}.TryLock(ctx, name, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (EtcdLocker{P: b}).TryLock(ctx, name, 5*time.Second); !errors.Is(err, ErrLockBusy) {
		t.Fatalf("second TryLock: %v, want ErrLockBusy", err)
	}
	if err := ma.SetIfHeld(ctx, st.CursorKey(kf), "c1", 0); err != nil {
		t.Fatal(err)
	}
	if c, err := st.Cursor(ctx, kf); err != nil || c != "c1" {
		t.Fatalf("cursor = %q, %v; want c1", c, err)
	}

	// A's lease goes away without A noticing yet.
	resp, err := raw.Get(ctx, ns+"locks/sync/"+name+"/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("lock keys: %v %v", resp, err)
	}
	if _, err := raw.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	var mb Mutex
	deadline := time.Now().Add(10 * time.Second)
	for mb == nil {
		if mb, err = (EtcdLocker{P: b}).TryLock(ctx, name, 5*time.Second); err != nil && !errors.Is(err, ErrLockBusy) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("B did not get the lock after A's lease was revoked")
		}
	}
	if err := ma.SetIfHeld(ctx, st.CursorKey(kf), "stale", 0); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("stale holder's cursor write: %v, want ErrNotHeld", err)
	}
	if err := mb.SetIfHeld(ctx, st.CursorKey(kf), "c2", 0); err != nil {
		t.Fatal(err)
	}
	if c, _ := st.Cursor(ctx, kf); c != "c2" {
		t.Fatalf("cursor = %q, want the new holder's c2", c)
	}
	if err := mb.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	if err := rdb.Set(ctx, prefix+"cursor:wk-redis-only", "from-redis", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if c, err := st.Cursor(ctx, "wk-redis-only"); err != nil || c != "from-redis" {
		t.Fatalf("cursor only in Redis = %q, %v; want from-redis", c, err)
	}
}
