package dlq

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// The DLQ consumer indexes what the producer sent (an undecodable record
// becomes a review item), the scheduler's retried events travel through
// the topic, and Rebuild from the topic reproduces the same Stats.
// rebuildEnv is what the rebuild tests share: the broker, fresh main and
// DLQ topics in cfg, a Redis key prefix and a manual clock.
type rebuildEnv struct {
	brokers, mainTopic, dlqTopic string
	cfg                          *config.DLQConsumer
	rdb                          *redis.Client
	prefix                       string
	clk                          *manualClock
}

func newRebuildEnv(t *testing.T) *rebuildEnv {
	e := &rebuildEnv{brokers: testenv.KafkaBrokers(t), dlqTopic: testenv.Topic(t, 2), mainTopic: testenv.Topic(t, 2), clk: newClock()}
	e.rdb, e.prefix = testenv.Redis(t)
	e.cfg = testConfig(t, e.brokers, e.mainTopic, e.dlqTopic)
	return e
}

func TestConsumerIndexesAndRebuild(t *testing.T) {
	e := newRebuildEnv(t)
	brokers, dlqTopic, rdb, prefix, clk, cfg := e.brokers, e.dlqTopic, e.rdb, e.prefix, e.clk, e.cfg
	idx := NewIndex(rdb, prefix, WithClock(clk), WithLetters(topicLetters(t, cfg)))
	pol := NewPolicy(testRecovery())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	p, err := NewProducer(ProducerConfig{Kafka: cfg.Kafka, DLQ: cfg.DLQ})
	if err != nil {
		t.Fatal(err)
	}
	defer closeProducer(t, p)
	reasons := []Reason{ReasonRateLimited, ReasonDownstreamError, ReasonInvalidMessage, ReasonQueueFull}
	const n = 20
	for i := range n {
		dl := deadLetter(fmt.Sprintf("u%d", i%4), reasons[i%len(reasons)], int64(i), clk.Now())
		sendSync(t, p, dl)
		if i == 3 {
			sendSync(t, p, dl) // a re-sent duplicate
		}
	}
	// A record that is not a dead letter at all.
	raw, err := kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": brokers})
	if err != nil {
		t.Fatal(err)
	}
	dch := make(chan kafka.Event, 1)
	if err := raw.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &dlqTopic, Partition: 0},
		Key: []byte("zz"), Value: []byte("{not json")}, dch); err != nil {
		t.Fatal(err)
	}
	if m := (<-dch).(*kafka.Message); m.TopicPartition.Error != nil {
		t.Fatal(m.TopicPartition.Error)
	}
	raw.Close()

	c, err := NewConsumer(ConsumerConfig{Kafka: cfg.Kafka}, idx, pol, WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	runDone := make(chan error, 1)
	runCtx, stopRun := context.WithCancel(ctx)
	go func() { runDone <- c.Run(runCtx) }()
	defer func() {
		stopRun()
		if err := <-runDone; err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	testenv.Eventually(t, 30*time.Second, func() error {
		s, _ := idx.Stats(ctx)
		return testenv.Check(s.Total == n+1, "indexed: total %d, want %d", s.Total, n+1)
	})
	st, _ := idx.Stats(ctx)
	// 5 invalid_message + the undecodable record go to review.
	if st.Review != 6 || st.Due != n-5 || st.ByReason["invalid_message"] != 6 || st.ByReason["rate_limited"] != 5 {
		t.Fatalf("stats %+v", st)
	}
	// The index keeps a summary; the whole letter comes from the topic.
	es, _, _ := idx.List(ctx, Filter{User: "zz"})
	if len(es) != 1 || es[0].Preview != "{not json" || es[0].Whole {
		t.Fatalf("undecodable entry's summary %+v", es)
	}
	whole, err := idx.Get(ctx, es[0].ID)
	if err != nil || !whole.Whole || !strings.Contains(whole.Details, "undecodable") || string(whole.OriginalValue) != "{not json" ||
		whole.State != StateReview {
		t.Fatalf("undecodable entry %+v %v", whole, err)
	}
	if testenv.MetricValue(c.m.undecodable) != 1 || testenv.MetricValue(c.m.unrecoverable) != 6 {
		t.Errorf("undecodable %v unrecoverable %v", testenv.MetricValue(c.m.undecodable), testenv.MetricValue(c.m.unrecoverable))
	}

	// Retry the due ones; their events go to the DLQ topic in the
	// retries' transaction.
	s := schedulerWith(t, cfg, idx, clk)
	clk.Add(time.Minute) // base delay: every first retry is due (u0's rate_limited ones are paced)
	sent, err := s.ScanOnce(ctx)
	if err != nil || sent == 0 {
		t.Fatalf("scan sent %d %v", sent, err)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		s, _ := idx.Stats(ctx)
		return testenv.Check(s.Retried == int64(sent), "events consumed: retried %d, want %d", s.Retried, sent)
	})
	before, _ := idx.Stats(ctx)
	retried := map[string]bool{}
	all, _, _ := idx.List(ctx, Filter{Limit: 1000})
	for _, e := range all {
		if e.State == StateRetried {
			retried[e.ID] = true
		}
	}
	if len(retried) != sent {
		t.Fatalf("%d retried entries, sent %d", len(retried), sent)
	}

	applied, err := c.Rebuild(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if applied < n+2+sent { // dead letters, the duplicate, the junk record, the events
		t.Errorf("rebuild applied %d records", applied)
	}
	after, _ := idx.Stats(ctx)
	// DueNow is a view of the clock against scores that pacing moved
	// (pacing is not recorded in the topic); every count must match.
	before.DueNow, after.DueNow = 0, 0
	if fmt.Sprint(before) != fmt.Sprint(after) {
		t.Fatalf("rebuild changed stats:\n before %+v\n after  %+v", before, after)
	}
	for id := range retried {
		if e, err := idx.Get(ctx, id); err != nil || e.State != StateRetried || e.Attempts != 1 {
			t.Fatalf("after rebuild %s: %+v %v", id, e, err)
		}
	}
}

// What operators and the scheduler do to entries survives a rebuild: the
// index records each purge and each move (to review, or requeued for a
// retry) in the DLQ topic, and replaying the topic repeats them. Without the
// recorded events a rebuild would bring purged entries back (the topic still
// holds the dead letters) and put moved ones back where they first were.
func TestOperatorActionsSurviveRebuild(t *testing.T) {
	e := newRebuildEnv(t)
	rdb, prefix, clk, cfg := e.rdb, e.prefix, e.clk, e.cfg
	ctx := context.Background()
	p, err := NewProducer(ProducerConfig{Kafka: cfg.Kafka, DLQ: cfg.DLQ})
	if err != nil {
		t.Fatal(err)
	}
	defer closeProducer(t, p)
	sink := &sinkWaiter{p: p}
	idx := NewIndex(rdb, prefix, WithClock(clk), WithEventSink(sink), WithLetters(topicLetters(t, cfg)))
	const n = 12
	for i := range n {
		sendSync(t, p, deadLetter(fmt.Sprintf("u%d", i%3), ReasonDownstreamError, int64(i), clk.Now()))
	}
	c, err := NewConsumer(ConsumerConfig{Kafka: cfg.Kafka}, idx, NewPolicy(testRecovery()), WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stopRun := context.WithCancel(ctx)
	runDone := make(chan error, 1)
	go func() { runDone <- c.Run(runCtx) }()
	testenv.Eventually(t, 30*time.Second, func() error {
		s, _ := idx.Stats(ctx)
		return testenv.Check(s.Total == n, "indexed: total %d, want %d", s.Total, n)
	})

	purged, err := idx.Purge(ctx, Filter{User: "u1"})
	if err != nil || purged != n/3 {
		t.Fatalf("purge: %d %v, want %d", purged, err, n/3)
	}
	u0, _, _ := idx.List(ctx, Filter{User: "u0"})
	u2, _, _ := idx.List(ctx, Filter{User: "u2"})
	if len(u0) == 0 || len(u2) == 0 {
		t.Fatalf("entries of u0 %d, u2 %d", len(u0), len(u2))
	}
	reviewed, requeued := u0[0].ID, u2[0].ID
	requeueAt := clk.Now().Add(90 * time.Minute).Truncate(time.Millisecond)
	if err := idx.MoveToReview(ctx, reviewed); err != nil {
		t.Fatal(err)
	}
	if err := idx.MoveToReview(ctx, requeued); err != nil {
		t.Fatal(err)
	}
	if err := idx.Requeue(ctx, requeued, requeueAt); err != nil {
		t.Fatal(err)
	}
	sink.wg.Wait() // the events are durable in the topic
	kept, _, _ := idx.List(ctx, Filter{Limit: 100})
	if len(kept) != n-n/3 {
		t.Fatalf("%d entries after purge, want %d", len(kept), n-n/3)
	}
	checkMoved := func(when string) {
		t.Helper()
		if e, err := idx.Get(ctx, reviewed); err != nil || e.State != StateReview {
			t.Fatalf("%s: entry moved to review is %+v (%v)", when, e, err)
		}
		e, err := idx.Get(ctx, requeued)
		if err != nil || e.State != StateDue || e.NextRetryTime == nil || !e.NextRetryTime.Equal(requeueAt) {
			t.Fatalf("%s: requeued entry is %+v (%v), want due at %v", when, e, err, requeueAt)
		}
	}
	// The running consumer applies the events it reads back from the topic
	// too (moved to review, then requeued): wait until it applied both, or
	// the check can catch the index between them.
	testenv.Eventually(t, 20*time.Second, func() error {
		r, err1 := idx.Get(ctx, reviewed)
		q, err2 := idx.Get(ctx, requeued)
		return testenv.Check(err1 == nil && err2 == nil && r.State == StateReview && q.State == StateDue &&
			q.NextRetryTime != nil && q.NextRetryTime.Equal(requeueAt), "the consumer applied the move events")
	})
	checkMoved("before the rebuild")
	stopRun()
	if err := <-runDone; err != nil {
		t.Fatalf("run: %v", err)
	}

	if _, err := c.Rebuild(ctx); err != nil {
		t.Fatal(err)
	}
	after, _, _ := idx.List(ctx, Filter{Limit: 100})
	if len(after) != len(kept) {
		t.Fatalf("rebuild left %d entries, want the %d kept", len(after), len(kept))
	}
	for _, e := range after {
		if e.UserID == "u1" {
			t.Fatalf("purged entry %s came back with the rebuild", e.ID)
		}
	}
	if st, _ := idx.Stats(ctx); st.Total != int64(len(kept)) || st.ByReason[string(ReasonDownstreamError)] != int64(len(kept)) ||
		st.Review != 1 {
		t.Fatalf("stats after rebuild %+v, want %d entries, 1 in review", st, len(kept))
	}
	checkMoved("after the rebuild")
}

// TestFullIndexHoldsLettersInTheTopic: the guard rail. With room for 5
// entries and 8 dead letters in the topic, the consumer indexes 5, reports
// the index full and indexes nothing more — the rest wait in the topic,
// uncommitted; when an operator purges 3, it resumes and indexes the other
// 3. Nothing is skipped: every one of the 8 was indexed at some point.
func TestFullIndexHoldsLettersInTheTopic(t *testing.T) {
	e := newRebuildEnv(t)
	ctx := context.Background()
	idx := NewIndex(e.rdb, e.prefix, WithClock(e.clk), WithLetters(topicLetters(t, e.cfg)), WithMaxEntries(5))
	p, err := NewProducer(ProducerConfig{Kafka: e.cfg.Kafka, DLQ: e.cfg.DLQ})
	if err != nil {
		t.Fatal(err)
	}
	defer closeProducer(t, p)
	want := map[string]bool{}
	for i := range 8 {
		dl := deadLetter("held", ReasonDownstreamError, int64(i), e.clk.Now())
		want[dl.ID] = true
		sendSync(t, p, dl)
	}
	c, err := NewConsumer(ConsumerConfig{Kafka: e.cfg.Kafka}, idx, NewPolicy(testRecovery()), WithClock(e.clk))
	if err != nil {
		t.Fatal(err)
	}
	runConsumer(t, c)
	seen := map[string]bool{}
	note := func() {
		es, _, err := idx.List(ctx, Filter{User: "held"})
		if err != nil {
			t.Fatal(err)
		}
		for _, en := range es {
			seen[en.ID] = true
		}
	}
	testenv.Eventually(t, 30*time.Second, func() error { return testenv.Check(testenv.MetricValue(c.m.indexFull) == 1, "index full") })
	time.Sleep(500 * time.Millisecond) // would index more if it did not hold
	if n, _ := idx.Size(ctx); n != 5 {
		t.Fatalf("index holds %d entries, want its 5", n)
	}
	note()
	es, _, _ := idx.List(ctx, Filter{User: "held", Limit: 3})
	for _, en := range es {
		if _, err := idx.Delete(ctx, en.ID); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		note()
		return testenv.Check(len(seen) == 8 && testenv.MetricValue(c.m.indexFull) == 0, "the held letters indexed")
	})
	for id := range want {
		if !seen[id] {
			t.Errorf("letter %s never indexed", id)
		}
	}
}
