package dlq

import (
	"context"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

// An operator retries a blocked user's letters without unblocking the user
// first (the dry run warns): the scheduler holds them until the block's end.
// They are then no longer the batch's: after an unblock, the next retry
// selects them (the unblock's answer says to), instead of finding them
// busy — requeued by a batch — until the block's old end, an hour later.
func TestBlockHoldReleasesABatchsLetters(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	mainTopic := testenv.Topic(t, 1)
	rdb, prefix := testenv.Redis(t)
	clk, idx, unaware := indexRig(rdb, prefix)
	ctx := context.Background()
	var ids []string
	for i := range 2 {
		dl := deadLetter("bot", ReasonUserBlocked, int64(i), clk.Now())
		placeIndexed(t, ctx, idx, unaware, dl)
		ids = append(ids, dl.ID)
	}
	blockEnd := clk.Now().Add(time.Hour)
	cfg := testConfig(t, brokers, mainTopic, testenv.Topic(t, 2))
	pol := NewPolicy(testRecovery(), WithBlockLookup(blockedUsers{"bot": blockEnd}))
	s, err := NewScheduler(SchedulerConfig{Kafka: cfg.Kafka, Recovery: testRecovery(), RateLimit: cfg.RateLimit, Prefix: prefix},
		rdb, idx, pol, WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	warmUp(t, s)

	vs, err := idx.RetrySelected(ctx, ids, RetryRequest{Batch: "b1", At: clk.Now()})
	if err != nil || vs[0] != VerdictRetry || vs[1] != VerdictRetry {
		t.Fatalf("the first batch: %v %v, want both retried", vs, err)
	}
	clk.Add(time.Second)
	if n, err := s.ScanOnce(ctx); err != nil || n != 0 {
		t.Fatalf("scan sent %d %v, want the blocked user's letters held", n, err)
	}
	es, err := idx.Summaries(ctx, ids)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if e == nil || e.State != StateDue || e.Batch != "" || e.NextRetryTime == nil || e.NextRetryTime.Before(blockEnd) {
			t.Fatalf("held letter %+v, want due after the block's end and no batch's", e)
		}
	}
	// The user unblocked, a second batch retries them now.
	vs, err = idx.RetrySelected(ctx, ids, RetryRequest{Batch: "b2", DryRun: true})
	if err != nil || vs[0] != VerdictRetry || vs[1] != VerdictRetry {
		t.Fatalf("the second batch's dry run: %v %v, want both retried, not busy", vs, err)
	}
}
