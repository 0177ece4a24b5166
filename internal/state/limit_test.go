package state

import (
	"context"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestLimitMemory: a group's saved handler limit is read back by another
// store (a restarted consumer), kept for its ttl only, and 0 when none was
// saved.
func TestLimitMemory(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()
	a := newStore(t, rdb, prefix, "a", nil)
	b := newStore(t, rdb, prefix, "b", nil)
	if n, err := b.LoadLimit(ctx, "g"); err != nil || n != 0 {
		t.Fatalf("nothing saved: LoadLimit = %d, %v; want 0, nil", n, err)
	}
	if err := a.SaveLimit(ctx, "g", 27, time.Minute); err != nil {
		t.Fatal(err)
	}
	if n, err := b.LoadLimit(ctx, "g"); err != nil || n != 27 {
		t.Fatalf("LoadLimit = %d, %v; want 27", n, err)
	}
	if n, _ := b.LoadLimit(ctx, "other"); n != 0 {
		t.Fatalf("another group's limit = %d, want 0", n)
	}
	ttl, err := rdb.PTTL(ctx, a.limitKey("g")).Result()
	if err != nil || ttl <= 0 || ttl > time.Minute {
		t.Fatalf("saved limit's ttl = %s, %v; want (0, 1m]", ttl, err)
	}
}
