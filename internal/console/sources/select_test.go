package sources

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/console"
	"github.com/kfpipe/kfpipe/internal/dlq"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestSelectWithLimitTakesTheOldest: a retry of "at most 3" of a user's
// 10 letters takes the user's 3 oldest, in order. It took the 3 newest
// (the list is newest first): the scheduler, which sends a user's letters
// back in the user's order, then held them behind the 7 older ones still
// waiting — for a blocked user until the block's old end, an hour after
// the dry run said a minute.
func TestSelectWithLimitTakesTheOldest(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()
	idx := dlq.NewIndex(rdb, prefix)
	base := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	var ids []string
	for i := range 10 {
		due := base.Add(time.Hour)
		dl := &chatmsg.DeadLetter{ID: fmt.Sprintf("sel-%02d", i), Reason: "rate_limited", UserID: "sel-user",
			FailureTime: base.Add(time.Duration(i) * time.Second), SourcePartition: 0, SourceOffset: int64(100 + i), NextRetryTime: &due}
		if _, err := idx.Index(ctx, dl, dlq.Coord{Partition: 0, Offset: int64(i)}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, dl.ID)
	}
	ls, err := DLQStore{x: idx, rdb: rdb, prefix: prefix}.Select(ctx, console.DLQFilter{User: "sel-user", Limit: 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]string, len(ls))
	for i, l := range ls {
		got[i] = l.ID
	}
	if !slices.Equal(got, ids[:3]) {
		t.Fatalf("selected %v, want the 3 oldest %v", got, ids[:3])
	}
}
