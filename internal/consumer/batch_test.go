package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/deadletter"
	"github.com/kfpipe/kfpipe/internal/handler"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestBatchActorTakesQueuedMessages: a user's messages sent quickly reach
// the batch handler in order, in batches of at most max; a batch that is
// not full waits for the wait, not longer.
func TestBatchActorTakesQueuedMessages(t *testing.T) {
	var mu sync.Mutex
	var got [][]int64
	all := make(chan struct{})
	var n int
	r := newRegistry(100, time.Minute, nil, func(*envelope) { t.Error("single-message path used in batch mode") }, nil)
	r.batch = batchMode{max: 3, wait: 300 * time.Millisecond, handle: func(envs []*envelope) {
		mu.Lock()
		defer mu.Unlock()
		var offs []int64
		for _, e := range envs {
			offs = append(offs, int64(e.km.TopicPartition.Offset))
		}
		got = append(got, offs)
		if n += len(envs); n == 5 {
			close(all)
		}
	}}
	defer r.close()
	start := time.Now()
	for i := range 5 {
		if !r.send("u", &envelope{km: &kafka.Message{TopicPartition: kafka.TopicPartition{Offset: kafka.Offset(i)}}}) {
			t.Fatal("send refused")
		}
	}
	select {
	case <-all:
	case <-time.After(5 * time.Second):
		t.Fatalf("batches %v after 5s", got)
	}
	took := time.Since(start)
	mu.Lock()
	defer mu.Unlock()
	var flat []int64
	for _, b := range got {
		if len(b) == 0 || len(b) > 3 {
			t.Fatalf("batch of %d messages (max 3): %v", len(b), got)
		}
		flat = append(flat, b...)
	}
	if !slices.Equal(flat, []int64{0, 1, 2, 3, 4}) {
		t.Fatalf("batches %v: want offsets 0..4 in order", got)
	}
	if len(got) != 2 {
		t.Fatalf("batches %v: want [0 1 2] [3 4] (five messages queued at once, max 3)", got)
	}
	if took < 250*time.Millisecond || took > 3*time.Second {
		t.Fatalf("the last, partial batch took %v: want it handed over after the 300ms wait", took)
	}
}

// batchEnvs returns envelopes of n messages of user u at offsets 0..n-1 of
// p, their offsets added to p's tracker.
func batchEnvs(p *partition, u string, n int) []*envelope {
	envs := make([]*envelope, n)
	for i := range n {
		p.tracker.Add(int64(i))
		envs[i] = &envelope{km: &kafka.Message{TopicPartition: kafka.TopicPartition{Offset: kafka.Offset(i)}}, msg: chat(u, i), part: p}
	}
	return envs
}

// batchRecorder is a handler that records the batches it is called with
// (the upstream msgids) and returns err.
type batchRecorder struct {
	mu      sync.Mutex
	batches [][]string
	firsts  []string
	err     error
}

func (b *batchRecorder) Handle(ctx context.Context, m *chatmsg.ChatMessage) error {
	var ids []string
	for _, it := range handler.BatchFrom(ctx) {
		ids = append(ids, it.Msg.UpstreamMsgID)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.batches = append(b.batches, ids)
	b.firsts = append(b.firsts, m.UpstreamMsgID)
	return b.err
}

func TestProcessBatchSuccessMarksEachMessage(t *testing.T) {
	st := newMemState()
	h := &batchRecorder{}
	c, p := unitConsumer(t, h, &memDLQ{}, st)
	envs := batchEnvs(p, "u", 3)
	setBatch(c, 8, 0) // batch mode: the handler sees the batch
	c.proc.processBatch(envs)
	want := []string{envs[0].msg.UpstreamMsgID, envs[1].msg.UpstreamMsgID, envs[2].msg.UpstreamMsgID}
	if len(h.batches) != 1 || !slices.Equal(h.batches[0], want) || h.firsts[0] != want[0] {
		t.Fatalf("handler calls %v (first %v), want one call with %v", h.batches, h.firsts, want)
	}
	for _, e := range envs {
		if !st.isDone(e.msg.DedupKey()) {
			t.Fatalf("%s not marked done", e.msg.DedupKey())
		}
	}
	if next, ok := p.tracker.Committable(); !ok || next != 3 {
		t.Fatalf("offsets not finished: %d %v", next, ok)
	}
}

// TestProcessBatchRerunAfterPartialMarks: a crash after some of a batch's
// done marks landed. The marks are queued last message first, so the
// marks that landed are the batch's tail; the re-run batch is handed only
// the not-done messages, and it begins with the same first message (the
// key of the batch's replies).
func TestProcessBatchRerunAfterPartialMarks(t *testing.T) {
	st := newMemState()
	order := &markOrder{memState: st}
	h := &batchRecorder{}
	c, p := unitConsumer(t, h, &memDLQ{}, order)
	envs := batchEnvs(p, "u", 4)
	setBatch(c, 8, 0) // batch mode: the handler sees the batch
	c.proc.processBatch(envs)
	keys := func(envs []*envelope) []string {
		var k []string
		for _, e := range envs {
			k = append(k, e.msg.DedupKey())
		}
		return k
	}
	all := keys(envs)
	if want := []string{all[3], all[2], all[1], all[0]}; !slices.Equal(order.keys(), want) {
		t.Fatalf("done marks queued %v, want the last message's first: %v", order.keys(), want)
	}
	// The crash: only the first two marks queued (the last two messages)
	// landed.
	st2 := newMemState(all[3], all[2])
	h2 := &batchRecorder{}
	c2, p2 := unitConsumer(t, h2, &memDLQ{}, st2)
	envs2 := batchEnvs(p2, "u", 4)
	setBatch(c2, 8, 0) // batch mode: the handler sees the batch
	c2.proc.processBatch(envs2)
	want := []string{envs2[0].msg.UpstreamMsgID, envs2[1].msg.UpstreamMsgID}
	if len(h2.batches) != 1 || !slices.Equal(h2.batches[0], want) {
		t.Fatalf("re-run batches %v, want only the not-done %v", h2.batches, want)
	}
	if h2.firsts[0] != h.firsts[0] {
		t.Fatalf("re-run's first message %s, first run's %s: their replies would be keyed differently", h2.firsts[0], h.firsts[0])
	}
	if next, ok := p2.tracker.Committable(); !ok || next != 4 {
		t.Fatalf("offsets not finished: %d %v", next, ok)
	}
	for _, k := range all {
		if !st2.isDone(k) {
			t.Fatalf("%s not done after the re-run", k)
		}
	}
	// A third run finds every message done: the handler is not called.
	c3, p3 := unitConsumer(t, h2, &memDLQ{}, st2)
	setBatch(c3, 8, 0) // batch mode: the handler sees the batch
	c3.proc.processBatch(batchEnvs(p3, "u", 4))
	if len(h2.batches) != 1 {
		t.Fatalf("handler called for a batch of done messages: %v", h2.batches)
	}
	if next, ok := p3.tracker.Committable(); !ok || next != 4 {
		t.Fatalf("duplicates not finished: %d %v", next, ok)
	}
}

func TestProcessBatchFailureDeadLettersEachMessage(t *testing.T) {
	for _, tt := range []struct {
		name         string
		err          error
		reason       string
		recoverable  bool
		wantAttempts int
	}{
		{"retried", errors.New("boom"), ReasonDownstreamError, true, 3},
		{"permanent", handler.Permanent(errors.New("bad")), ReasonHandlerRejected, false, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st := newMemState()
			h := &batchRecorder{err: tt.err}
			dlq := &memDLQ{}
			c, p := unitConsumer(t, h, dlq, st)
			envs := batchEnvs(p, "u", 3)
			setBatch(c, 8, 0) // batch mode: the handler sees the batch
			c.proc.processBatch(envs)
			dlq.wg.Wait()
			if len(h.batches) != tt.wantAttempts {
				t.Fatalf("handler called %d times, want %d", len(h.batches), tt.wantAttempts)
			}
			letters := dlq.all()
			if len(letters) != 3 {
				t.Fatalf("%d dead letters, want one per message", len(letters))
			}
			for i, l := range letters {
				if l.SourceOffset != int64(i) || string(l.Reason) != tt.reason || deadletter.IsRecoverable(deadletter.Reason(l.Reason)) != tt.recoverable ||
					l.HandlerAttempts != tt.wantAttempts || l.Original.UpstreamMsgID != envs[i].msg.UpstreamMsgID {
					t.Fatalf("letter %d: %+v", i, l)
				}
				if st.isDone(envs[i].msg.DedupKey()) {
					t.Fatalf("a failed batch's message marked done")
				}
			}
			if next, ok := p.tracker.Committable(); !ok || next != 3 {
				t.Fatalf("offsets not finished after the dead letters: %d %v", next, ok)
			}
		})
	}
}

// TestProcessBatchUndecodable: a record that cannot be decoded is
// dead-lettered alone; the batch runs with the others.
func TestProcessBatchUndecodable(t *testing.T) {
	h := &batchRecorder{}
	dlq := &memDLQ{}
	c, p := unitConsumer(t, h, dlq, newMemState())
	envs := batchEnvs(p, "u", 3)
	envs[1].msg, envs[1].km.Value = nil, []byte("not json")
	setBatch(c, 8, 0) // batch mode: the handler sees the batch
	c.proc.processBatch(envs)
	dlq.wg.Wait()
	if len(h.batches) != 1 || len(h.batches[0]) != 2 {
		t.Fatalf("batches %v, want one of the 2 good messages", h.batches)
	}
	if l := dlq.all(); len(l) != 1 || l[0].SourceOffset != 1 || string(l[0].Reason) != ReasonInvalidMessage {
		t.Fatalf("dead letters %+v", l)
	}
	if next, ok := p.tracker.Committable(); !ok || next != 3 {
		t.Fatalf("offsets not finished: %d %v", next, ok)
	}
}

// markOrder is a State recording the order of the done marks queued.
type markOrder struct {
	*memState
	mu    sync.Mutex
	order []string
}

func (s *markOrder) Acquire(ctx context.Context, topic string, partition int32) (Lease, error) {
	l, err := s.memState.Acquire(ctx, topic, partition)
	if err != nil {
		return nil, err
	}
	return &orderLease{memLease: l.(*memLease), s: s}, nil
}

func (s *markOrder) keys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.order)
}

type orderLease struct {
	*memLease
	s *markOrder
}

func (l *orderLease) Mark(it StateItem, off int64, done func(bool)) {
	l.s.mu.Lock()
	l.s.order = append(l.s.order, it.Key)
	l.s.mu.Unlock()
	l.memLease.Mark(it, off, done)
}

// TestBatchActorOnePartitionPerBatch: a batch never mixes partitions (a
// user's records keyed differently); it ends where the partition changes.
func TestBatchActorOnePartitionPerBatch(t *testing.T) {
	p1, p2 := &partition{id: 1}, &partition{id: 2}
	got := make(chan []int64, 10)
	r := newRegistry(100, time.Minute, nil, func(*envelope) { t.Error("single-message path used in batch mode") }, nil)
	r.batch = batchMode{max: 5, wait: 200 * time.Millisecond, handle: func(envs []*envelope) {
		var offs []int64
		for _, e := range envs {
			if e.part != envs[0].part {
				t.Errorf("a batch with two partitions")
			}
			offs = append(offs, int64(e.km.TopicPartition.Offset))
		}
		got <- offs
	}}
	defer r.close()
	for i, p := range []*partition{p1, p1, p2} {
		r.send("u", &envelope{km: &kafka.Message{TopicPartition: kafka.TopicPartition{Offset: kafka.Offset(i)}}, part: p})
	}
	for _, want := range [][]int64{{0, 1}, {2}} {
		select {
		case b := <-got:
			if !slices.Equal(b, want) {
				t.Fatalf("batch %v, want %v", b, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no batch %v after 5s", want)
		}
	}
}

// TestBatchRevokeEndsWorkBeforeHandOver: TestRevokeEndsWorkBeforeHandOver
// in batch mode. A consumer handing users' batches to a slow handler loses
// one of its two partitions to a consumer that joins: the batches running
// on the moving partition are cancelled at revoke_drain_limit and awaited
// before its lease is given back, so the new owner never runs a message
// beside the old one; both consumers then stop with batches running and
// return no error.
func TestBatchRevokeEndsWorkBeforeHandOver(t *testing.T) {
	topic := testenv.Topic(t, 2)
	_, prefix := testenv.Redis(t)
	cfg := testConfig(t, topic)
	cfg.Kafka.Consumer.RevokeDrainLimit = 2 * time.Second
	cfg.Processor.AttemptTimeout = time.Minute
	cfg.Dedup.Lease = 10 * time.Second
	var slow []*chatmsg.ChatMessage
	for i := 0; i < 16; i++ {
		slow = append(slow, chat(fmt.Sprintf("slow%02d", i), 0), chat(fmt.Sprintf("slow%02d", i), 1))
	}
	produce(t, topic, slow)
	rs := newRuns()
	regA := prometheus.NewRegistry()
	a := startConsumer(t, cfg, slowHandler("a", rs), &memDLQ{}, WithRegisterer(regA), WithBatch(4, 0),
		WithState(newStoreState(t, prefix, "a", cfg.Dedup.Lease)))
	testenv.Eventually(t, 60*time.Second, func() error {
		rs.mu.Lock()
		defer rs.mu.Unlock()
		n := 0
		for _, r := range rs.running {
			n += min(r, 1)
		}
		return testenv.Check(n == 16, "%d of 16 users' batches running on A", n)
	})
	b := startConsumer(t, cfg, slowHandler("b", rs), &memDLQ{}, WithRegisterer(prometheus.NewRegistry()), WithBatch(4, 0),
		WithState(newStoreState(t, prefix, "b", cfg.Dedup.Lease)))
	testenv.Eventually(t, 60*time.Second, func() error {
		return testenv.Check(len(b.Partitions()) == 1, "B holds %v", b.Partitions())
	})
	// B runs the moved partition's batches (after A's hand-over).
	testenv.Eventually(t, 60*time.Second, func() error {
		rs.mu.Lock()
		defer rs.mu.Unlock()
		n := 0
		for _, c := range rs.started {
			if c > 1 {
				n++
			}
		}
		return testenv.Check(n > 0, "B ran none of the moved batches")
	})
	if o := rs.overlaps(); len(o) > 0 {
		t.Fatalf("%d batch runs started while the previous owner's run of the same batch still ran: %v", len(o), o)
	}
	if v, _ := testenv.Gathered(t, regA, "kfpipe_handover_attempts_total", "fate", "cancelled"); v == 0 {
		t.Fatal("no batch attempt cancelled at the drain limit")
	}
	// Both stop with their batches still running: each hands its
	// partitions over (cancel, await, give the leases back) and returns
	// no error.
	for name, c := range map[string]*Consumer{"B": b, "A": a} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := c.Close(ctx)
		cancel()
		if err != nil {
			t.Errorf("close %s: %v", name, err)
		}
	}
}
