package dlq

import (
	"context"
	"fmt"
	"testing"

	"github.com/kfpipe/kfpipe/internal/deadletter"
	"github.com/kfpipe/kfpipe/internal/testenv"
	"github.com/redis/go-redis/v9"
)

// The operator's retry (the admin API's single and batch retry, through
// RetrySelected) refuses exactly the reasons the reason table marks not
// recoverable, read from the table: a new non-recoverable row is refused
// without another list to update, and include_invalid still retries it.
func TestRetrySelectionReadsTheReasonTable(t *testing.T) {
	testenv.EachRedis(t, eachRetrySelectionReadsTheReasonTable)
}

func eachRetrySelectionReadsTheReasonTable(t *testing.T, rdb redis.UniversalClient, prefix string) {
	ctx := context.Background()
	rows := deadletter.Rows()
	refused := 0
	for i, row := range rows {
		clk := newClock()
		idx := NewIndex(rdb, fmt.Sprintf("%sreason%d:", prefix, i), WithClock(clk), WithLetters(mem))
		dl := deadLetter("u1", row.Reason, int64(500000+i), clk.Now())
		if _, err := indexDL(t, ctx, idx, dl); err != nil {
			t.Fatal(err)
		}
		mustNil(t, idx.MoveToReview(ctx, dl.ID))
		want := VerdictRetry
		if !row.Recoverable {
			want = VerdictNotRetryable
			refused++
		}
		got, err := idx.RetrySelected(ctx, []string{dl.ID}, RetryRequest{DryRun: true})
		if err != nil || len(got) != 1 || got[0] != want {
			t.Errorf("%s (recoverable %v): verdicts %v (%v), want %v", row.Reason, row.Recoverable, got, err, want)
		}
		got, err = idx.RetrySelected(ctx, []string{dl.ID}, RetryRequest{DryRun: true, IncludeNotRetryable: true})
		if err != nil || len(got) != 1 || got[0] != VerdictRetry {
			t.Errorf("%s with include_invalid: verdicts %v (%v), want %v", row.Reason, got, err, VerdictRetry)
		}
	}
	if refused == 0 {
		t.Fatal("the reason table has no non-recoverable row: the test checks nothing refused")
	}
}
