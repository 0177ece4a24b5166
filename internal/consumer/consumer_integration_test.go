package consumer

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestRoundTrip: 5000 messages over 100 users on 4 partitions; every
// upstream message has exactly one effect, per-user order holds, and the
// committed offsets reach the end of every partition.
func TestRoundTrip(t *testing.T) {
	const users, perUser, parts = 100, 50, 4
	topic := testenv.Topic(t, parts)
	rdb, prefix := testenv.Redis(t)
	var msgs []*chatmsg.ChatMessage
	for i := 0; i < perUser; i++ {
		for u := 0; u < users; u++ {
			msgs = append(msgs, chat(fmt.Sprintf("user-%03d", u), i))
		}
	}
	produce(t, topic, msgs)

	var mu sync.Mutex
	effects := map[string]int{}
	order := map[string][]int{}
	var seq atomic.Int64
	h := HandlerFunc(func(ctx context.Context, m *chatmsg.ChatMessage) error {
		if seq.Add(1)%97 == 0 {
			time.Sleep(time.Millisecond)
		}
		var i int
		fmt.Sscanf(m.UpstreamMsgID[len(m.UpstreamMsgID)-6:], "%d", &i)
		mu.Lock()
		defer mu.Unlock()
		effects[m.UpstreamMsgID]++
		order[m.ExternalUserID] = append(order[m.ExternalUserID], i)
		return nil
	})
	cfg := testConfig(t, topic)
	reg := prometheus.NewRegistry()
	dlq := &memDLQ{}
	c := startConsumer(t, cfg, h, dlq, WithState(&redisState{rdb: rdb, prefix: prefix, lease: 30 * time.Second}),
		WithRegisterer(reg))
	testenv.Eventually(t, 60*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		return testenv.Check(len(effects) == len(msgs), "%d messages had an effect, want %d", len(effects), len(msgs))
	})
	if err := c.Close(context.Background()); err != nil {
		t.Fatalf("close: %v", err)
	}
	for id, n := range effects {
		if n != 1 {
			t.Errorf("%s had %d effects", id, n)
		}
	}
	for u, s := range order {
		for i, v := range s {
			if v != i {
				t.Fatalf("user %s out of order at %d: %v", u, i, s[:i+1])
			}
		}
	}
	if n := len(dlq.all()); n != 0 {
		t.Fatalf("%d unexpected dead letters: %v", n, dlq.byReason())
	}
	got := committed(t, cfg.Kafka.Consumer.GroupID, topic, parts)
	var total int64
	for _, o := range got {
		total += o
	}
	if total != int64(len(msgs)) {
		t.Fatalf("committed offsets %v sum to %d, want %d", got, total, len(msgs))
	}
	if v := testenv.MetricValue(c.m.processed.WithLabelValues("ok")); v != float64(len(msgs)) {
		t.Fatalf("processed{ok} = %v", v)
	}
}

// TestCrashDoesNotLoseSlowMessage is the test the seed's strategy fails:
// slow user A's message sits at offset 0, fast user B's messages follow in
// the same partition and finish first. The consumer "crashes" (no drain, no
// final commit) while A is in flight; a new consumer in the group must
// handle A. With the seed's per-message commit (each finished message
// commits its own offset) the committed offset would already be past A,
// and A lost: the check that the commit stays at A fails without the
// offset tracker.
func TestCrashDoesNotLoseSlowMessage(t *testing.T) {
	cfg, c1 := stuckBehindA(t)
	time.Sleep(3 * cfg.Kafka.Consumer.CommitInterval) // periodic commits happen
	c1.abort()

	got := committed(t, cfg.Kafka.Consumer.GroupID, cfg.Kafka.Topics.Main.Name, 1)[0]
	t.Logf("committed offset after crash: %d (A is at 0)", got)

	var aHandled atomic.Bool
	second := HandlerFunc(func(ctx context.Context, m *chatmsg.ChatMessage) error {
		if m.ExternalUserID == "A" {
			aHandled.Store(true)
		}
		return nil
	})
	startConsumer(t, cfg, second, &memDLQ{})
	if got > 0 {
		t.Fatalf("committed offset %d passes unfinished A at 0 (I2)", got)
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		return testenv.Check(aHandled.Load(), "A's message not handled by the second consumer")
	})
}

// stuckBehindA produces, on a one-partition topic, a message of user A and
// then ten of user B, and starts a consumer (with no cleanup: the caller
// ends it) under whose handler A's message stays in flight until its
// context ends while B's finish. It returns the configuration and the
// consumer once A's message began and B's ten finished.
func stuckBehindA(t *testing.T) (config.Consumer, *Consumer) {
	t.Helper()
	topic := testenv.Topic(t, 1)
	msgs := []*chatmsg.ChatMessage{chat("A", 0)}
	for i := 0; i < 10; i++ {
		msgs = append(msgs, chat("B", i))
	}
	produce(t, topic, msgs)
	aStarted := make(chan struct{}, 1)
	var bDone atomic.Int64
	h := HandlerFunc(func(ctx context.Context, m *chatmsg.ChatMessage) error {
		if m.ExternalUserID == "A" {
			aStarted <- struct{}{}
			<-ctx.Done() // stuck: still in flight when the owner dies
			return ctx.Err()
		}
		bDone.Add(1)
		return nil
	})
	cfg := testConfig(t, topic)
	c, err := New(cfg, h, &memDLQ{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	<-aStarted
	waitCount(t, 30*time.Second, "B's messages finished", &bDone, 10)
	return cfg, c
}

// TestInvalidMessageDeadLettered: a malformed record in the middle of a
// partition goes to the DLQ as invalid_message, the partition keeps
// flowing, and the offset is committed past it only once the dead letter
// is durable.
func TestInvalidMessageDeadLettered(t *testing.T) {
	topic := testenv.Topic(t, 1)
	var recs [][2][]byte
	for i := 0; i < 11; i++ {
		v, _ := chatmsg.Encode(chat("u1", i))
		if i == 5 {
			v = []byte(`{"upstream_msgid": not json`)
		}
		recs = append(recs, [2][]byte{[]byte("u1"), v})
	}
	produceRaw(t, topic, recs)
	cfg := testConfig(t, topic)
	var handled atomic.Int64
	dlq := &memDLQ{gate: make(chan struct{})}
	c := startConsumer(t, cfg, HandlerFunc(func(context.Context, *chatmsg.ChatMessage) error {
		handled.Add(1)
		return nil
	}), dlq)
	waitCount(t, 30*time.Second, "handled", &handled, 10)
	time.Sleep(5 * cfg.Kafka.Consumer.CommitInterval)
	if got := committed(t, cfg.Kafka.Consumer.GroupID, topic, 1)[0]; got != 5 {
		t.Fatalf("committed %d while the dead letter at 5 is not durable; want 5", got)
	}
	close(dlq.gate)
	testenv.Eventually(t, 10*time.Second, func() error {
		n := c.InFlight()
		return testenv.Check(n == 0, "%d messages in flight, want 0", n)
	})
	waitCommitted(t, 10*time.Second, cfg.Kafka.Consumer.GroupID, topic, 11)
	letters := dlq.all()
	if len(letters) != 1 {
		t.Fatalf("%d dead letters, want 1", len(letters))
	}
	if l := letters[0]; string(l.Reason) != ReasonInvalidMessage || l.SourceOffset != 5 || l.Original != nil || l.UserID != "u1" || l.SourceTopic != topic {
		t.Fatalf("dead letter %+v", l)
	}
}

// fakeBreaker counts outcomes; it never opens.
type fakeBreaker struct{ ok, failed atomic.Int64 }

func (b *fakeBreaker) Allow(string) (func(bool), error) {
	return func(s bool) {
		if s {
			b.ok.Add(1)
		} else {
			b.failed.Add(1)
		}
	}, nil
}

// TestMailboxFullDeadLettered: a user whose handler is stuck overflows its
// own mailbox: the overflow goes to the DLQ as queue_full and counts as a
// breaker failure; another user in the same partition is unaffected.
func TestMailboxFullDeadLettered(t *testing.T) {
	topic := testenv.Topic(t, 1)
	var msgs []*chatmsg.ChatMessage
	for i := 0; i < 10; i++ {
		msgs = append(msgs, chat("stuck", i))
	}
	for i := 0; i < 2; i++ { // fits the other user's mailbox of 2
		msgs = append(msgs, chat("other", i))
	}
	produce(t, topic, msgs)
	cfg := testConfig(t, topic)
	cfg.Processor.MailboxSize = 2
	gate := make(chan struct{})
	var closeGate sync.Once
	t.Cleanup(func() { closeGate.Do(func() { close(gate) }) })
	var stuck, other atomic.Int64
	dlq := &memDLQ{}
	br := &fakeBreaker{}
	c := startConsumer(t, cfg, HandlerFunc(func(ctx context.Context, m *chatmsg.ChatMessage) error {
		if m.ExternalUserID == "stuck" {
			select {
			case <-gate:
			case <-ctx.Done():
				return ctx.Err()
			}
			stuck.Add(1)
			return nil
		}
		other.Add(1)
		return nil
	}), dlq, WithBreaker(br))
	waitCount(t, 30*time.Second, "the other user's messages handled", &other, 2)
	// The overflow is dead-lettered off the poll goroutine: it may land
	// just after the other user's messages ran (a fresh-clone CI run read
	// 0 at that instant). Each overflow counts as a breaker failure when
	// it is dispatched, before its dead letter is queued.
	testenv.Eventually(t, 10*time.Second, func() error {
		n, failed := dlq.byReason()[ReasonQueueFull], br.failed.Load()
		return testenv.Check(n >= 7 && int64(n) == failed,
			"%d queue_full dead letters and %d breaker failures, want the same number, at least 7", n, failed)
	})
	full := dlq.byReason()[ReasonQueueFull]
	if full < 7 || full > 8 {
		t.Fatalf("%d queue_full dead letters, want 7 or 8 (mailbox 2 + maybe one in progress)", full)
	}
	if br.failed.Load() != int64(full) {
		t.Fatalf("breaker failures %d, want %d", br.failed.Load(), full)
	}
	closeGate.Do(func() { close(gate) })
	waitCount(t, 10*time.Second, "the stuck user's messages handled", &stuck, int64(10-full))
	waitCommitted(t, 10*time.Second, cfg.Kafka.Consumer.GroupID, topic, 12)
	if c.InFlight() != 0 {
		t.Fatalf("in flight %d", c.InFlight())
	}
}

// TestPauseResume: when a partition's in-flight count reaches
// max_in_flight it is paused (no more records read), and resumed below
// resume_below; all messages are processed in the end.
func TestPauseResume(t *testing.T) {
	topic := testenv.Topic(t, 1)
	const n = 300
	var msgs []*chatmsg.ChatMessage
	for i := 0; i < n; i++ {
		msgs = append(msgs, chat(fmt.Sprintf("u%03d", i%100), i/100))
	}
	produce(t, topic, msgs)
	cfg := testConfig(t, topic)
	cfg.Processor.MaxInFlight, cfg.Processor.ResumeBelow = 40, 10
	gate := make(chan struct{})
	var closeGate sync.Once
	t.Cleanup(func() { closeGate.Do(func() { close(gate) }) })
	var handled atomic.Int64
	reg := prometheus.NewRegistry()
	c := startConsumer(t, cfg, HandlerFunc(func(ctx context.Context, m *chatmsg.ChatMessage) error {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
		handled.Add(1)
		return nil
	}), &memDLQ{}, WithRegisterer(reg))
	waitMetric(t, 30*time.Second, "paused partitions", c.m.part.paused, 1)
	time.Sleep(500 * time.Millisecond)
	if got := testenv.MetricValue(c.m.consumed); got != 40 {
		t.Fatalf("consumed %v records while paused at max_in_flight 40", got)
	}
	closeGate.Do(func() { close(gate) })
	waitCount(t, 30*time.Second, "handled", &handled, n)
	waitMetric(t, 5*time.Second, "paused partitions", c.m.part.paused, 0)
	if got := testenv.MetricValue(c.m.consumed); got != n {
		t.Fatalf("consumed %v, want %d", got, n)
	}
}

// TestPausedPartitionRevokedAndReassignedResumes: a partition paused at the
// in-flight cap is revoked (a second member joins), then assigned back (it
// leaves); its new records must be read again. librdkafka keeps the
// application's pause across unassign and assign, so without resuming on
// revoke the partition was never fetched again on this member, and its lag
// shows from the reassignment although it never finished a message.
func TestPausedPartitionRevokedAndReassignedResumes(t *testing.T) {
	const parts = 2
	topic := testenv.Topic(t, parts)
	var first []*chatmsg.ChatMessage
	for i := 0; i < 400; i++ {
		first = append(first, chat(fmt.Sprintf("u%03d", i%100), i/100))
	}
	produce(t, topic, first)
	cfg := testConfig(t, topic)
	cfg.Processor.MaxInFlight, cfg.Processor.ResumeBelow = 20, 5
	cfg.Kafka.Consumer.RevokeDrainLimit = 500 * time.Millisecond
	gate := make(chan struct{})
	var closeGate sync.Once
	t.Cleanup(func() { closeGate.Do(func() { close(gate) }) })
	var mu sync.Mutex
	handledA := map[string]bool{}
	regA := prometheus.NewRegistry()
	a := startConsumer(t, cfg, HandlerFunc(func(ctx context.Context, m *chatmsg.ChatMessage) error {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
		mu.Lock()
		handledA[m.UpstreamMsgID] = true
		mu.Unlock()
		return nil
	}), &memDLQ{}, WithRegisterer(regA))
	// Both partitions reach the cap and pause.
	waitMetric(t, 30*time.Second, "paused partitions", a.m.part.paused, parts)

	// B joins: one partition is revoked from A (its in-flight messages are
	// dropped after the drain limit) and B handles it.
	var handledB atomic.Int64
	b, err := New(cfg, HandlerFunc(func(context.Context, *chatmsg.ChatMessage) error {
		handledB.Add(1)
		return nil
	}), &memDLQ{}, WithRegisterer(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, func() error {
		return testenv.Check(handledB.Load() > 0, "B handled nothing yet")
	})
	waitMetric(t, 30*time.Second, "paused partitions of A", a.m.part.paused, 1)
	// B leaves: the partition comes back to A.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, func() error {
		a.own.mu.Lock()
		defer a.own.mu.Unlock()
		return testenv.Check(len(a.own.parts) == parts, "A owns %d partitions, want %d", len(a.own.parts), parts)
	})
	// New records on both partitions, then let A work: every record not
	// handled by B must reach A, including the returned partition's.
	var second []*chatmsg.ChatMessage
	for i := 0; i < 200; i++ {
		second = append(second, chat(fmt.Sprintf("u%03d", i%100), 10+i/100))
	}
	produce(t, topic, second)
	closeGate.Do(func() { close(gate) })
	testenv.Eventually(t, 60*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		missing := 0
		for _, m := range second {
			if !handledA[m.UpstreamMsgID] {
				missing++
			}
		}
		return testenv.Check(missing == 0, "%d of the %d new records not handled by A", missing, len(second))
	})
}

// TestNewOwnerSkipsWhatThePreviousOwnerFinished: messages finished behind
// an unfinished one are listed in the commit's metadata, and the
// partition's next owner does not run them again — only the unfinished
// one. Without the list every one of them would run twice here (no
// dedup guard, so nothing else stops the second run).
func TestNewOwnerSkipsWhatThePreviousOwnerFinished(t *testing.T) {
	cfg, c1 := stuckBehindA(t)
	topic := cfg.Kafka.Topics.Main.Name
	waitCommittedMetadata(t, 10*time.Second, cfg.Kafka.Consumer.GroupID, topic, 0, "kfpipe1:1-10")
	c1.abort() // a crash: nothing more is committed

	var aRuns, bRuns atomic.Int64
	c2 := startConsumer(t, cfg, HandlerFunc(func(ctx context.Context, m *chatmsg.ChatMessage) error {
		if m.ExternalUserID == "A" {
			aRuns.Add(1)
		} else {
			bRuns.Add(1)
		}
		return nil
	}), &memDLQ{})
	waitCount(t, 30*time.Second, "runs of A's message", &aRuns, 1)
	waitCommittedMetadata(t, 10*time.Second, cfg.Kafka.Consumer.GroupID, topic, 11, "")
	if n := bRuns.Load(); n != 0 {
		t.Fatalf("the new owner ran %d of the 10 messages the previous owner had finished", n)
	}
	if n := testenv.MetricValue(c2.m.priorFinished); n != 10 {
		t.Fatalf("kfpipe_consumer_finished_by_previous_owner_total = %v, want 10", n)
	}
}

// committedWithMetadata returns the group's committed offset of partition
// 0 of topic (-1 when none) and its metadata.
func committedWithMetadata(t testing.TB, group, topic string) (int64, string) {
	t.Helper()
	c, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": testenv.KafkaBrokers(t), "group.id": group})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	res, err := c.Committed([]kafka.TopicPartition{{Topic: &topic, Partition: 0}}, 10000)
	if err != nil || len(res) != 1 {
		t.Fatalf("committed: %v %v", res, err)
	}
	meta := ""
	if res[0].Metadata != nil {
		meta = *res[0].Metadata
	}
	if res[0].Offset < 0 {
		return -1, meta
	}
	return int64(res[0].Offset), meta
}

// waitCommittedMetadata waits until the group's commit on partition 0 of
// topic is offset with metadata meta.
func waitCommittedMetadata(t testing.TB, d time.Duration, group, topic string, offset int64, meta string) {
	t.Helper()
	testenv.Eventually(t, d, func() error {
		off, m := committedWithMetadata(t, group, topic)
		return testenv.Check(off == offset && m == meta, "committed %d with metadata %q, want %d with %q", off, m, offset, meta)
	})
}
