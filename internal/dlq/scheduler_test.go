package dlq

import (
	"bytes"
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

type eventLog struct {
	mu     sync.Mutex
	events []*DeadLetterMessage
}

func (l *eventLog) Send(dl *DeadLetterMessage, done func(error)) {
	l.mu.Lock()
	l.events = append(l.events, dl)
	l.mu.Unlock()
	done(nil)
}

func newScheduler(t *testing.T, cfgBrokers, mainTopic string, idx *Index, clk Clock, opts ...Option) *Scheduler {
	t.Helper()
	rdb, _ := idx.rdb, idx.prefix
	cfg := testConfig(t, cfgBrokers, mainTopic, "unused-dlq")
	s, err := NewScheduler(SchedulerConfig{Kafka: cfg.Kafka, Recovery: testRecovery(), RateLimit: cfg.RateLimit, Prefix: idx.prefix},
		rdb, idx, NewPolicy(testRecovery()), append([]Option{WithClock(clk)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	return s
}

// A recoverable dead letter becomes due after its backoff; the scheduler
// puts the original back on the main topic with the retry headers, and
// the index learns about it only then.
func TestSchedulerRetriesWhenDue(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	mainTopic := testenv.Topic(t, 2)
	rdb, prefix := testenv.Redis(t)
	clk := newClock()
	idx := NewIndex(rdb, prefix, WithClock(clk), WithLetters(mem))
	ctx := context.Background()
	dl := deadLetter("ivy", ReasonDownstreamError, 3, clk.Now())
	NewPolicy(testRecovery()).Place(ctx, dl)
	if _, err := indexDL(t, ctx, idx, dl); err != nil {
		t.Fatal(err)
	}
	events := &eventLog{}
	s := newScheduler(t, brokers, mainTopic, idx, clk, WithEventSink(events))

	clk.Add(59 * time.Second)
	if n, err := s.ScanOnce(ctx); err != nil || n != 0 {
		t.Fatalf("before due: sent %d %v", n, err)
	}
	clk.Add(2 * time.Second)
	if n, err := s.ScanOnce(ctx); err != nil || n != 1 {
		t.Fatalf("when due: sent %d %v", n, err)
	}
	msgs := readTopic(t, brokers, mainTopic, 1, 300*time.Millisecond)
	if len(msgs) != 1 {
		t.Fatalf("%d records on main topic", len(msgs))
	}
	m := msgs[0]
	if string(m.Key) != "ivy" || !bytes.Equal(m.Value, dl.OriginalValue) {
		t.Errorf("record key %q value %q", m.Key, m.Value)
	}
	if header(m, chatmsg.HeaderRetryFromDLQ) != "true" || header(m, chatmsg.HeaderRetryCount) != "1" ||
		header(m, chatmsg.HeaderOriginalFailure) != "downstream_error" || header(m, chatmsg.HeaderMsgType) != "text" {
		t.Errorf("headers %v", m.Headers)
	}
	e, _ := idx.Get(ctx, dl.ID)
	st, _ := idx.Stats(ctx)
	if e.State != StateRetried || st.Due != 0 || st.Retried != 1 {
		t.Errorf("index after ack: %s %+v", e.State, st)
	}
	if got := len(events.events); got != 1 || events.events[0].Event != EventRetried || events.events[0].ID != dl.ID {
		t.Errorf("events %+v", events.events)
	}
	// Nothing more to send.
	clk.Add(time.Hour)
	if n, _ := s.ScanOnce(ctx); n != 0 {
		t.Errorf("sent again: %d", n)
	}

	// The retried message fails again in the consumer: dead-lettered with
	// the header's retry_count, it is scheduled with a doubled delay, and
	// after max retries it goes to review.
	again := New(Source{Topic: mainTopic, Partition: m.TopicPartition.Partition, Offset: int64(m.TopicPartition.Offset),
		Key: m.Key, Value: m.Value, Headers: toHeaders(m)}, ReasonDownstreamError, "again", clk.Now())
	NewPolicy(testRecovery()).Place(ctx, again)
	if again.RetryCount != 1 || again.NextRetryTime.Sub(clk.Now()) != 2*time.Minute {
		t.Fatalf("again: retry %d next %v", again.RetryCount, again.NextRetryTime)
	}
	last := deadLetter("ivy", ReasonDownstreamError, 4, clk.Now())
	last.RetryCount = 5
	NewPolicy(testRecovery()).Place(ctx, last)
	if _, err := indexDL(t, ctx, idx, last); err != nil {
		t.Fatal(err)
	}
	if st, _ := idx.Stats(ctx); st.Review != 1 {
		t.Fatalf("exhausted not in review: %+v", st)
	}
}

func toHeaders(m *kafka.Message) []Header {
	hs := make([]Header, len(m.Headers))
	for i, h := range m.Headers {
		hs[i] = Header{Key: h.Key, Value: h.Value}
	}
	return hs
}

// Kafka never acknowledges: the index is not touched and the entry is due
// again after its lease.
func TestSchedulerNoAckNoIndexUpdate(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	clk := newClock()
	idx := NewIndex(rdb, prefix, WithClock(clk), WithLetters(mem))
	ctx := context.Background()
	dl := deadLetter("jay", ReasonQueueFull, 1, clk.Now())
	NewPolicy(testRecovery()).Place(ctx, dl)
	if _, err := indexDL(t, ctx, idx, dl); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, "127.0.0.1:1", "nowhere", "unused")
	cfg.Kafka.Producer.DeliveryTimeout = 500 * time.Millisecond
	cfg.Kafka.Producer.LingerMs = 0
	s, err := NewScheduler(SchedulerConfig{Kafka: cfg.Kafka, Recovery: testRecovery(), RateLimit: cfg.RateLimit, Prefix: prefix},
		rdb, idx, NewPolicy(testRecovery()), WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	clk.Add(2 * time.Minute)
	n, err := s.ScanOnce(ctx)
	if n != 0 || err == nil {
		t.Fatalf("sent %d err %v, want 0 and an error", n, err)
	}
	e, _ := idx.Get(ctx, dl.ID)
	if e.State != StateDue || e.Attempts != 0 {
		t.Fatalf("entry changed without ack: %+v", e)
	}
	st, _ := idx.Stats(ctx)
	if st.Due != 1 || st.Retried != 0 {
		t.Fatalf("stats %+v", st)
	}
	clk.Add(2 * time.Minute) // past the reschedule
	if c, _ := idx.claim(ctx, clk.Now(), 10, time.Minute); len(c) != 1 {
		t.Fatalf("not due again: %d", len(c))
	}
}

// Two replicas on the same Redis: every due retry goes out once.
func TestTwoSchedulersSendOnce(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	mainTopic := testenv.Topic(t, 2)
	rdb, prefix := testenv.Redis(t)
	clk := newClock()
	idx := NewIndex(rdb, prefix, WithClock(clk), WithLetters(mem))
	ctx := context.Background()
	const n = 30
	for i := range n {
		dl := deadLetter("user-"+strconv.Itoa(i%7), ReasonDownstreamError, int64(i), clk.Now())
		NewPolicy(testRecovery()).Place(ctx, dl)
		if _, err := indexDL(t, ctx, idx, dl); err != nil {
			t.Fatal(err)
		}
	}
	a := newScheduler(t, brokers, mainTopic, idx, clk)
	b := newScheduler(t, brokers, mainTopic, NewIndex(rdb, prefix, WithClock(clk), WithLetters(mem)), clk)
	a.Start()
	b.Start()
	clk.Add(time.Minute)
	waitFor(t, "all retried", 20*time.Second, func() bool {
		st, _ := idx.Stats(ctx)
		return st.Retried == n
	})
	// Both also scan directly, racing the loops: claims are leased.
	_, _ = a.ScanOnce(ctx)
	_, _ = b.ScanOnce(ctx)
	msgs := readTopic(t, brokers, mainTopic, n, time.Second)
	if len(msgs) != n {
		t.Fatalf("%d retries on the main topic, want %d", len(msgs), n)
	}
	seen := map[string]bool{}
	for _, m := range msgs {
		seen[string(m.Value)] = true
	}
	if len(seen) != n {
		t.Fatalf("%d distinct retries, want %d", len(seen), n)
	}
}

// The schedule lives in Redis: a scheduler that stops before the due time
// loses nothing, the next one sends it.
func TestSchedulerRestartLosesNothing(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	mainTopic := testenv.Topic(t, 1)
	rdb, prefix := testenv.Redis(t)
	clk := newClock()
	idx := NewIndex(rdb, prefix, WithClock(clk), WithLetters(mem))
	ctx := context.Background()
	dl := deadLetter("kim", ReasonCircuitOpen, 1, clk.Now())
	NewPolicy(testRecovery()).Place(ctx, dl)
	if _, err := indexDL(t, ctx, idx, dl); err != nil {
		t.Fatal(err)
	}
	first := newScheduler(t, brokers, mainTopic, idx, clk)
	first.Start()
	time.Sleep(100 * time.Millisecond) // it scans, nothing is due
	if err := first.Close(ctx); err != nil {
		t.Fatal(err)
	}
	clk.Add(time.Minute)
	second := newScheduler(t, brokers, mainTopic, NewIndex(rdb, prefix, WithClock(clk), WithLetters(mem)), clk)
	second.Start()
	waitFor(t, "retried by the second scheduler", 10*time.Second, func() bool {
		e, err := idx.Get(ctx, dl.ID)
		return err == nil && e.State == StateRetried
	})
	readTopic(t, brokers, mainTopic, 1, 0)
}

// rate_limited retries of one user are paced at max_messages/2 per window.
func TestSchedulerPacesRateLimitedUser(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	mainTopic := testenv.Topic(t, 1)
	rdb, prefix := testenv.Redis(t)
	clk := newClock()
	idx := NewIndex(rdb, prefix, WithClock(clk), WithLetters(mem))
	ctx := context.Background()
	for i := range 6 {
		dl := deadLetter("loud", ReasonRateLimited, int64(i), clk.Now())
		NewPolicy(testRecovery()).Place(ctx, dl)
		if _, err := indexDL(t, ctx, idx, dl); err != nil {
			t.Fatal(err)
		}
	}
	s := newScheduler(t, brokers, mainTopic, idx, clk) // normal group: 5 per 10 s ⇒ 2 per window
	clk.Add(time.Minute)
	if n, err := s.ScanOnce(ctx); err != nil || n != 2 {
		t.Fatalf("first window sent %d %v, want 2", n, err)
	}
	if n, _ := s.ScanOnce(ctx); n != 0 {
		t.Fatalf("same window sent %d more", n)
	}
	clk.Add(10*time.Second + 10*time.Millisecond)
	if n, _ := s.ScanOnce(ctx); n != 2 {
		t.Fatalf("second window sent %d, want 2", n)
	}
}
