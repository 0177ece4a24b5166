package dlq

import (
	"context"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
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

// An operator retries letters whose retries are spent (in review): the
// re-injection starts a fresh budget (retry_count 1), so when the user's
// breaker, still open from the failures, refuses it on the way back, the
// new letter is recoverable and retried after its backoff — not put
// straight back in review, which stranded the letters of the dlq-kill9
// scenario (review=45 after the batch).
func TestOperatorRetryGivesAFreshBudget(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	mainTopic := testenv.Topic(t, 1)
	rdb, prefix := testenv.Redis(t)
	clk, idx, pol := indexRig(rdb, prefix)
	ctx := context.Background()
	dl := deadLetter("spent", ReasonDownstreamError, 7, clk.Now())
	dl.RetryCount = 5
	placeIndexed(t, ctx, idx, pol, dl)
	if e, err := idx.Get(ctx, dl.ID); err != nil || e.State != StateReview {
		t.Fatalf("a letter with its retries spent: %+v %v, want it in review", e, err)
	}
	s := newScheduler(t, brokers, mainTopic, idx, clk)
	warmUp(t, s)

	vs, err := idx.RetrySelected(ctx, []string{dl.ID}, RetryRequest{Batch: "b1", At: clk.Now()})
	if err != nil || vs[0] != VerdictRetry {
		t.Fatalf("the batch: %v %v, want retried", vs, err)
	}
	clk.Add(time.Second)
	if n, err := s.ScanOnce(ctx); err != nil || n != 1 {
		t.Fatalf("scan sent %d %v, want the requeued letter", n, err)
	}
	msgs := readTopic(t, brokers, mainTopic, 1, 300*time.Millisecond)
	if len(msgs) != 1 {
		t.Fatalf("%d records on the main topic, want 1", len(msgs))
	}
	if got := header(msgs[0], chatmsg.HeaderRetryCount); got != "1" {
		t.Fatalf("retry_count %q on the operator's retry, want 1 (a fresh budget)", got)
	}
}
