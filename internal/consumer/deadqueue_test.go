package consumer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/offsets"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// stallingDLQ is a DeadLetters whose Send blocks, for the letters of the
// stalled partitions, until release is closed — as the DLQ producer's Send
// blocks while its emergency queue is full — and confirms every letter as
// durable. It records how often each (partition, offset) was sent.
type stallingDLQ struct {
	stalled map[int32]bool
	release chan struct{}
	once    sync.Once

	mu    sync.Mutex
	sends map[[2]int64]int
	calls atomic.Int64
	// failFirst makes the first send of every letter fail (not durable).
	failFirst bool
	// failing makes every send fail while set: the DLQ topic and the
	// emergency file both refuse.
	failing atomic.Bool
}

func newStallingDLQ(stalled ...int32) *stallingDLQ {
	d := &stallingDLQ{stalled: map[int32]bool{}, release: make(chan struct{}), sends: map[[2]int64]int{}}
	for _, p := range stalled {
		d.stalled[p] = true
	}
	return d
}

func (d *stallingDLQ) Send(dl *chatmsg.DeadLetter, done func(error)) {
	d.calls.Add(1)
	if d.stalled[dl.SourcePartition] {
		<-d.release
	}
	k := [2]int64{int64(dl.SourcePartition), dl.SourceOffset}
	d.mu.Lock()
	d.sends[k]++
	first := d.sends[k] == 1
	d.mu.Unlock()
	if d.failFirst && first {
		done(errors.New("dlq refused"))
		return
	}
	if d.failing.Load() {
		done(errors.New("dlq: kafka: topic unreachable; emergency file: no space left on device"))
		return
	}
	done(nil)
}

func (d *stallingDLQ) unblock() { d.once.Do(func() { close(d.release) }) }

// sent returns how many letters of partition were sent, and the largest
// number of sends of one of them.
func (d *stallingDLQ) sent(partition int32) (letters, maxSends int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for k, n := range d.sends {
		if k[0] == int64(partition) {
			letters++
			maxSends = max(maxSends, n)
		}
	}
	return letters, maxSends
}

// queuedConsumer is a Consumer without Kafka whose partitions 0 and 1 have
// their dead-letter queues running; closing the queues is registered as
// cleanup (after dlq's release, so no sender is left blocked).
func queuedConsumer(t *testing.T, dlq *stallingDLQ) (*Consumer, [2]*partition) {
	t.Helper()
	c, _ := unitConsumer(t, NoopHandler, dlq, nil)
	c.cfg.Processor.DeadLetterQueue = 1024
	var ps [2]*partition
	for i := range ps {
		ps[i] = &partition{topic: "t", id: int32(i), tracker: offsets.NewTracker(int32(i)), label: strconv.Itoa(i)}
		c.dead.startQueue(ps[i])
	}
	t.Cleanup(func() {
		dlq.unblock()
		c.cancelRun()
		c.dead.stopRetries()
		for _, p := range ps {
			c.dead.stopQueue(p)
		}
		c.dead.wait()
	})
	return c, ps
}

// deadLetterAll dead-letters offsets [0, n) of p and fails the test if
// that takes long: deadLetter must only queue.
func deadLetterAll(t *testing.T, c *Consumer, p *partition, n int) {
	t.Helper()
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		for off := range n {
			p.tracker.Add(int64(off))
			env := &envelope{km: &kafka.Message{TopicPartition: kafka.TopicPartition{Offset: kafka.Offset(off)}}, part: p, user: "u"}
			c.dead.deadLetter(env, ReasonInvalidMessage, "poison", 0)
		}
	}()
	select {
	case <-returned:
	case <-time.After(5 * time.Second):
		t.Fatalf("dead-lettering %d messages of partition %d blocked the caller", n, p.id)
	}
}

// TestBlockedDeadLetterSendBlocksNoDispatch: the DLQ's Send blocks for
// partition 0's letters. Dead-lettering partition 0's messages still
// returns at once (the poll goroutine and the actors only queue), partition
// 1's letters become durable and its offsets committable meanwhile, and
// partition 0's letters wait, counted in kfpipe_dead_letters_waiting,
// uncommitted. Released, each is sent once and the partition's offsets
// become committable. With Send called by the dead-lettering goroutine (the
// poll goroutine before), the first letter of partition 0 blocked it.
func TestBlockedDeadLetterSendBlocksNoDispatch(t *testing.T) {
	dlq := newStallingDLQ(0)
	c, ps := queuedConsumer(t, dlq)
	deadLetterAll(t, c, ps[0], 50)
	deadLetterAll(t, c, ps[1], 50)
	waitCommittable(t, 5*time.Second, ps[1], 50)
	if n, _ := dlq.sent(1); n != 50 {
		t.Fatalf("partition 1: %d letters sent, want 50", n)
	}
	if got := ps[0].dead.waiting.Load(); got != 50 {
		t.Fatalf("partition 0: %d letters waiting, want 50", got)
	}
	if got := testenv.MetricValue(c.m.part.deadWaiting.WithLabelValues("0")); got != 50 {
		t.Fatalf("kfpipe_dead_letters_waiting{partition=0} = %v, want 50", got)
	}
	if _, ok := ps[0].tracker.Committable(); ok {
		t.Fatal("partition 0 committable before its dead letters are durable (I6)")
	}
	dlq.unblock()
	waitCommittable(t, 5*time.Second, ps[0], 50)
	if n, most := dlq.sent(0); n != 50 || most != 1 {
		t.Fatalf("partition 0: %d letters sent, one of them %d times; want 50, once each", n, most)
	}
	if got := testenv.MetricValue(c.m.part.deadWaiting.WithLabelValues("0")); got != 0 {
		t.Fatalf("kfpipe_dead_letters_waiting{partition=0} = %v after all were durable", got)
	}
}

// TestDeadLetterRetriedThroughQueue: a send that is not durable is tried
// again after its backoff by the partition's sender; the letter is counted
// waiting once until it is durable, and its message is finished once.
func TestDeadLetterRetriedThroughQueue(t *testing.T) {
	dlq := newStallingDLQ()
	dlq.failFirst = true
	c, ps := queuedConsumer(t, dlq)
	deadLetterAll(t, c, ps[0], 10)
	waitCommittable(t, 5*time.Second, ps[0], 10)
	if n, most := dlq.sent(0); n != 10 || most != 2 {
		t.Fatalf("%d letters, sent at most %d times; want 10, each twice (refused, then durable)", n, most)
	}
	if got := ps[0].dead.waiting.Load(); got != 0 {
		t.Fatalf("%d letters waiting after all were durable", got)
	}
}

// TestDeadLetterDetailWhileNotRecorded: while neither the DLQ topic nor
// the emergency file takes dead letters, /readyz's dead_letters detail
// says how many wait and why, and their offsets are not committable; when
// the DLQ takes them again every one is recorded and the detail clears.
func TestDeadLetterDetailWhileNotRecorded(t *testing.T) {
	dlq := newStallingDLQ()
	dlq.failing.Store(true)
	c, ps := queuedConsumer(t, dlq)
	c.own.mu.Lock()
	c.own.parts = map[tpKey]*partition{{"t", 0}: ps[0], {"t", 1}: ps[1]}
	c.own.mu.Unlock()
	if d := c.DeadLetterDetail(); d != "" {
		t.Fatalf("detail before any failure: %q", d)
	}
	deadLetterAll(t, c, ps[0], 10)
	testenv.Eventually(t, 5*time.Second, func() error {
		d := c.DeadLetterDetail()
		return testenv.Check(strings.Contains(d, "10 dead letters not recorded") && strings.Contains(d, "no space left on device"),
			"dead letter detail %q, want 10 not recorded for lack of space", d)
	})
	if _, ok := ps[0].tracker.Committable(); ok {
		t.Fatal("offsets committable while their dead letters are recorded nowhere (I6)")
	}
	dlq.failing.Store(false)
	waitCommittable(t, 10*time.Second, ps[0], 10)
	if d := c.DeadLetterDetail(); d != "" {
		t.Fatalf("detail after every letter was recorded: %q", d)
	}
}

// TestHaltedDeadQueueLeavesMessagesUnfinished: letters still queued when
// the partition goes (revoke, shutdown) are dropped, not sent, and their
// messages stay unfinished, so the next reader reads them again (I2).
func TestHaltedDeadQueueLeavesMessagesUnfinished(t *testing.T) {
	dlq := newStallingDLQ(0)
	c, ps := queuedConsumer(t, dlq)
	deadLetterAll(t, c, ps[0], 20)
	waitCount(t, 5*time.Second, "sends", &dlq.calls, 1) // the first is in Send
	c.dead.stopQueue(ps[0])
	dlq.unblock()
	time.Sleep(100 * time.Millisecond)
	if n := dlq.calls.Load(); n != 1 {
		t.Fatalf("%d sends after the queue was halted with one in Send, want 1", n)
	}
	if next, ok := ps[0].tracker.Committable(); !ok || next != 1 {
		t.Fatalf("committable %d %v, want 1 (only the letter that was in Send is durable)", next, ok)
	}
	c.dead.deadLetter(&envelope{km: &kafka.Message{TopicPartition: kafka.TopicPartition{Offset: 20}}, part: ps[0]},
		ReasonInvalidMessage, "late", 0)
	if n := dlq.calls.Load(); n != 1 {
		t.Fatal("a letter pushed after halt was sent")
	}
}

// TestPauseReasonsCompose: a partition paused by the in-flight cap and by
// a full dead-letter queue stays paused until both clear, whichever clears
// first; each reason has its own metric; a revoke clears both.
func TestPauseReasonsCompose(t *testing.T) {
	topic := testenv.Topic(t, 1)
	kc, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": testenv.KafkaBrokers(t),
		"group.id": testenv.Name(t, "group"), "enable.auto.commit": false})
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	if err := kc.Assign([]kafka.TopicPartition{{Topic: &topic, Partition: 0, Offset: kafka.OffsetBeginning}}); err != nil {
		t.Fatal(err)
	}
	k := &core{log: zap.NewNop(), m: newMetrics(prometheus.NewRegistry())}
	c := &Consumer{core: k, kc: kc, own: &ownership{core: k, parts: map[tpKey]*partition{}}}
	c.poll = newPoller(k, kc, c.own, nil, nil, nil, nil, nil)
	c.cfg.Processor.MaxInFlight, c.cfg.Processor.ResumeBelow, c.cfg.Processor.DeadLetterQueue = 4, 2, 4
	p := &partition{topic: topic, id: 0, tracker: offsets.NewTracker(0), label: "0"}
	p.dead = newDeadQueue(c.m.part.deadWaiting.WithLabelValues("0")) // no sender: waiting is set by hand
	c.own.parts[tpKey{topic, 0}] = p

	type state struct{ paused, cap, dead bool }
	check := func(step string, want state) {
		t.Helper()
		c.poll.flow.flowControl()
		if got := (state{p.pause.on, p.pause.cap, p.pause.dead}); got != want {
			t.Fatalf("%s: paused/cap/dead = %+v, want %+v", step, got, want)
		}
		if v := testenv.MetricValue(c.m.part.paused); v != b2f(want.cap) {
			t.Fatalf("%s: kfpipe_partitions_paused = %v", step, v)
		}
		if v := testenv.MetricValue(c.m.part.deadPaused); v != b2f(want.dead) {
			t.Fatalf("%s: kfpipe_partitions_paused_dead_letters = %v", step, v)
		}
	}
	for off := range 4 {
		p.tracker.Add(int64(off))
	}
	check("in-flight cap", state{true, true, false})
	p.dead.waiting.Store(4)
	check("and dead letters", state{true, true, true})
	for off := range 4 {
		p.tracker.Done(int64(off))
	}
	check("in flight drained, letters wait", state{true, false, true})
	p.dead.waiting.Store(2) // the low mark is half of 4: not below yet
	check("letters at the low mark", state{true, false, true})
	p.dead.waiting.Store(1)
	check("letters below the low mark", state{false, false, false})
	// The other order: dead letters first, the cap clears last.
	p.dead.waiting.Store(5)
	check("dead letters again", state{true, false, true})
	for off := 4; off < 8; off++ {
		p.tracker.Add(int64(off))
	}
	check("and the cap", state{true, true, true})
	p.dead.waiting.Store(0)
	check("letters drained, cap holds", state{true, true, false})
	if v := testenv.MetricValue(c.m.part.deadPauses); v != 2 {
		t.Fatalf("kfpipe_dead_letter_pauses_total = %v, want 2", v)
	}
	p.dead.waiting.Store(9)
	check("both", state{true, true, true})
	c.poll.flow.resumeForRevoke(kc, []*partition{p})
	if p.pause.on || p.pause.cap || p.pause.dead || testenv.MetricValue(c.m.part.paused) != 0 || testenv.MetricValue(c.m.part.deadPaused) != 0 {
		t.Fatal("revoke left a pause reason or a paused gauge")
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// produceTo writes recs to one partition of topic and waits for delivery.
func produceTo(t *testing.T, topic string, partition int32, recs []testenv.Record) {
	t.Helper()
	p, err := kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": testenv.KafkaBrokers(t), "acks": "all",
		"enable.idempotence": true, "linger.ms": 5})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	dr := make(chan kafka.Event, len(recs))
	for _, r := range recs {
		m := &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: partition}, Key: r.Key, Value: r.Value}
		if err := p.Produce(m, dr); err != nil {
			t.Fatal(err)
		}
	}
	for range recs {
		if m := (<-dr).(*kafka.Message); m.TopicPartition.Error != nil {
			t.Fatal(m.TopicPartition.Error)
		}
	}
}

// TestFullDeadLetterQueuePausesOnlyItsPartition is issue #19's done-when
// on the real broker: partition 0 holds only poison records (half without
// key, refused on the poll goroutine; half keyed, refused by their users'
// actors) and partition 1 ordinary messages. The DLQ's Send blocks for
// partition 0's letters until released, as the DLQ producer's does while
// its emergency file takes fsync'd writes. Partition 0 is paused once
// processor.dead_letter_queue letters wait and stops being read; every
// partition-1 message is handled meanwhile. Released, every partition-0
// record is dead-lettered exactly once, the partition resumes and both
// partitions' offsets are committed to the end: nothing lost. With the
// DLQ's Send on the poll goroutine, partition 1 stalled behind partition
// 0's first letter; without the pause, partition 0 was read to its end
// into memory.
func TestFullDeadLetterQueuePausesOnlyItsPartition(t *testing.T) {
	const poison, good, mark = 1200, 300, 20
	topic := testenv.Topic(t, 2)
	var bad []testenv.Record
	for i := range poison {
		r := testenv.Record{Value: []byte(fmt.Sprintf("not json %d", i))}
		if i%2 == 1 {
			r.Key = []byte(fmt.Sprintf("poisoner-%d", i%10))
		}
		bad = append(bad, r)
	}
	produceTo(t, topic, 0, bad)
	var ok []testenv.Record
	for i := range good {
		m := chat(fmt.Sprintf("user-%02d", i%20), i)
		b, err := chatmsg.Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		ok = append(ok, testenv.Record{Key: []byte(m.ExternalUserID), Value: b})
	}
	produceTo(t, topic, 1, ok)

	cfg := testConfig(t, topic)
	cfg.Processor.DeadLetterQueue = mark
	dlq := newStallingDLQ(0)
	var handled atomic.Int64
	c := startConsumer(t, cfg, HandlerFunc(func(context.Context, *chatmsg.ChatMessage) error {
		handled.Add(1)
		return nil
	}), dlq, WithRegisterer(prometheus.NewRegistry()))
	t.Cleanup(dlq.unblock) // runs before the consumer's Close: no sender left blocked

	waitCount(t, 60*time.Second, "handled", &handled, good)
	waitMetric(t, 10*time.Second, "partitions paused for dead letters", c.m.part.deadPaused, 1)
	if v := testenv.MetricValue(c.m.part.deadPauses); v != 1 {
		t.Fatalf("kfpipe_dead_letter_pauses_total = %v, want 1", v)
	}
	// Partition 0 stops being read: the records read from it are all
	// letters waiting (once the actors queued theirs), and no more are read.
	waiting := func() float64 { return testenv.MetricValue(c.m.part.deadWaiting.WithLabelValues("0")) }
	consumed := func() float64 { return testenv.MetricValue(c.m.consumed) }
	testenv.Eventually(t, 10*time.Second, func() error {
		w, read := waiting(), consumed()-good
		return testenv.Check(w == read, "%v letters waiting, want all %v records read from partition 0", w, read)
	})
	read := consumed() - good
	time.Sleep(time.Second)
	t.Logf("partition 0 paused with %v of its %d records read, all waiting for the DLQ (mark %d)", read, poison, mark)
	if got := consumed() - good; got != read || waiting() != read {
		t.Fatalf("partition 0 still read while paused: %v → %v records read, %v waiting", read, got, waiting())
	}
	if read < mark || read >= poison/2 {
		t.Fatalf("%v records of partition 0 read: want at least the mark %d and far fewer than its %d records", read, mark, poison)
	}
	if got := committed(t, cfg.Kafka.Consumer.GroupID, topic, 2); got[0] > 0 {
		t.Fatalf("partition 0 committed to %d while its dead letters were not durable", got[0])
	}

	dlq.unblock()
	testenv.Eventually(t, 60*time.Second, func() error {
		got := committed(t, cfg.Kafka.Consumer.GroupID, topic, 2)
		return testenv.Check(got[0] == poison && got[1] == good, "committed %v, want [%d %d]", got, poison, good)
	})
	if n, most := dlq.sent(0); n != poison || most != 1 {
		t.Fatalf("partition 0: %d records dead-lettered, one of them %d times; want %d, each once", n, most, poison)
	}
	if n, _ := dlq.sent(1); n != 0 {
		t.Fatalf("%d letters from partition 1, whose messages are all good", n)
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		p, w := testenv.MetricValue(c.m.part.deadPaused), waiting()
		return testenv.Check(p == 0 && w == 0, "%v partitions paused for dead letters, %v letters waiting; want none", p, w)
	})
	if v := testenv.MetricValue(c.m.result(ReasonInvalidMessage)); v != poison {
		t.Fatalf("invalid_message results %v, want %d", v, poison)
	}
}

// instantDLQ confirms every letter at once, from the caller.
type instantDLQ struct{}

func (instantDLQ) Send(_ *chatmsg.DeadLetter, done func(error)) { done(nil) }

// BenchmarkDeadLetter compares a dead letter sent by the dead-lettering
// goroutine (a partition without queue: what the poll goroutine did before)
// with one queued and sent by the partition's goroutine, with a DLQ that is
// durable at once: the cost of the hop. ns/op is per letter, up to durable.
func BenchmarkDeadLetter(b *testing.B) {
	for _, queued := range []bool{false, true} {
		b.Run(map[bool]string{false: "direct", true: "queued"}[queued], func(b *testing.B) {
			c, _ := unitConsumer(b, NoopHandler, instantDLQ{}, nil)
			c.cfg.Kafka.Consumer.CommitEveryN = 1 << 30
			p := &partition{topic: "t", id: 0, tracker: offsets.NewTracker(0), label: "0"}
			if queued {
				c.dead.startQueue(p)
			}
			envs := make([]*envelope, b.N)
			for i := range envs {
				p.tracker.Add(int64(i))
				envs[i] = &envelope{km: &kafka.Message{TopicPartition: kafka.TopicPartition{Offset: kafka.Offset(i)}}, part: p, user: "u"}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for _, env := range envs {
				c.dead.deadLetter(env, ReasonRateLimited, "over the limit", 0)
			}
			for p.tracker.InFlight() > 0 {
				time.Sleep(10 * time.Microsecond)
			}
			b.StopTimer()
			if queued {
				c.dead.stopQueue(p)
				c.dead.wait()
			}
			c.cancelRun()
		})
	}
}
