package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/handler"
	"github.com/kfpipe/kfpipe/internal/state"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// storeState is the state store on the test Redis as the consumer's State
// (what package service adapts, without its batching).
type storeState struct{ s *state.Store }

func newStoreState(t testing.TB, prefix, owner string, lease time.Duration) storeState {
	t.Helper()
	rdb, _ := testenv.Redis(t)
	s, err := state.New(context.Background(), state.Config{Client: rdb, KeyPrefix: prefix, Owner: owner, Lease: lease, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return storeState{s}
}

func (r storeState) Acquire(ctx context.Context, topic string, partition int32) (Lease, error) {
	l, err := r.s.Acquire(ctx, topic, partition)
	if err != nil {
		return nil, err
	}
	return &storeLease{l: l, partition: partition}, nil
}

type storeLease struct {
	l         *state.Lease
	partition int32
}

func items(its []StateItem) []state.Item {
	out := make([]state.Item, len(its))
	for i, it := range its {
		out[i] = state.Item{Key: it.Key, SendTime: it.SendTime, User: it.User}
	}
	return out
}

func (rl *storeLease) Token() int64          { return rl.l.Token() }
func (rl *storeLease) Lost() <-chan struct{} { return rl.l.Lost() }
func (rl *storeLease) Deadline() time.Time   { return rl.l.Deadline() }
func (rl *storeLease) Lapse()                { rl.l.Lapse() }
func (rl *storeLease) Seen(ctx context.Context, its []StateItem) ([]bool, error) {
	return rl.l.Seen(ctx, items(its))
}
func (rl *storeLease) Mark(it StateItem, off int64, done func(bool)) {
	err := rl.l.Mark(context.Background(), off, items([]StateItem{it}))
	done(err == nil || errors.Is(err, state.ErrFenced))
}
func (rl *storeLease) Replied(ctx context.Context, it StateItem) (string, bool, error) {
	return rl.l.Replied(ctx, items([]StateItem{it})[0])
}
func (rl *storeLease) RecordReply(ctx context.Context, it StateItem, record string) error {
	return rl.l.RecordReply(ctx, items([]StateItem{it})[0], record)
}
func (rl *storeLease) Release(ctx context.Context) error {
	if err := rl.l.Release(ctx); err != nil && !errors.Is(err, state.ErrFenced) {
		return err
	}
	return nil
}

// runs tracks handler runs per message across consumers: how many run at
// once, and how often a run started while another of the same message
// still ran (two owners at once).
type runs struct {
	mu      sync.Mutex
	running map[string]int
	overlap []string
	started map[string]int
}

func newRuns() *runs { return &runs{running: map[string]int{}, started: map[string]int{}} }

func (r *runs) begin(who, id string) func() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running[id] > 0 {
		r.overlap = append(r.overlap, who+":"+id)
	}
	r.running[id]++
	r.started[id]++
	return func() {
		r.mu.Lock()
		r.running[id]--
		r.mu.Unlock()
	}
}

func (r *runs) overlaps() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.overlap...)
}

// slowHandler blocks each message until its context ends (or a minute
// passes), recording the run in rs.
func slowHandler(who string, rs *runs) Handler {
	return HandlerFunc(func(ctx context.Context, m *chatmsg.ChatMessage) error {
		defer rs.begin(who, m.UpstreamMsgID)()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Minute):
			return nil
		}
	})
}

// TestRevokeEndsWorkBeforeHandOver: a consumer whose handlers are slow (an
// LLM-backed bot) loses one of its two partitions to a consumer that
// joins. The attempts running on the moving partition are cancelled at
// revoke_drain_limit and awaited; the lease is given back only then, so
// the new owner never runs a message beside the old one. Meanwhile the
// partition the first consumer keeps goes on being served: no gap as long
// as the drain in its handling of a steady stream of quick messages.
// Before, the revoke released the lease while the handlers still ran (the
// next owner ran the same messages beside them), and the drain held the
// poll goroutine, stalling the kept partition for the whole limit.
func TestRevokeEndsWorkBeforeHandOver(t *testing.T) {
	const parts = 2
	topic := testenv.Topic(t, parts)
	_, prefix := testenv.Redis(t)
	cfg := testConfig(t, topic)
	limit := 4 * time.Second
	cfg.Kafka.Consumer.RevokeDrainLimit = limit
	cfg.Processor.AttemptTimeout = time.Minute
	cfg.Dedup.Lease = 10 * time.Second
	var slow []*chatmsg.ChatMessage
	for i := 0; i < 16; i++ {
		slow = append(slow, chat(fmt.Sprintf("slow%02d", i), 0))
	}
	produce(t, topic, slow)
	rs := newRuns()
	// quick[p] are the times consumer A handled a quick message of
	// partition p.
	var qmu sync.Mutex
	quick := map[int32][]time.Time{}
	handlerOf := func(who string) Handler {
		sh := slowHandler(who, rs)
		return HandlerFunc(func(ctx context.Context, m *chatmsg.ChatMessage) error {
			if m.ExternalUserID[:4] == "slow" {
				return sh.Handle(ctx, m)
			}
			hl, _ := handler.LeaseOf(ctx)
			if rl, ok := hl.(*storeLease); ok && who == "a" {
				qmu.Lock()
				quick[rl.partition] = append(quick[rl.partition], time.Now())
				qmu.Unlock()
			}
			return nil
		})
	}
	regA := prometheus.NewRegistry()
	a := startConsumer(t, cfg, handlerOf("a"), &memDLQ{}, WithRegisterer(regA),
		WithState(newStoreState(t, prefix, "a", cfg.Dedup.Lease)))
	testenv.Eventually(t, 60*time.Second, func() error {
		n := 0
		for _, m := range slow {
			rs.mu.Lock()
			n += min(rs.running[m.UpstreamMsgID], 1)
			rs.mu.Unlock()
		}
		return testenv.Check(n == len(slow), "%d of %d slow handlers running on A", n, len(slow))
	})

	// A steady stream of quick messages on both partitions, from before B
	// joins until well after A's hand-over ended.
	stop := make(chan struct{})
	streamed := make(chan struct{})
	go func() {
		defer close(streamed)
		p, err := kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": testenv.KafkaBrokers(t), "linger.ms": 1,
			"partitioner": "murmur2_random"})
		if err != nil {
			t.Error(err)
			return
		}
		defer p.Close()
		for i := 0; ; i++ {
			select {
			case <-stop:
				p.Flush(5000)
				return
			case <-time.After(100 * time.Millisecond):
			}
			for u := 0; u < 16; u++ {
				b, _ := chatmsg.Encode(chat(fmt.Sprintf("quick%d", u), i))
				_ = p.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: kafka.PartitionAny},
					Key: []byte(fmt.Sprintf("quick%d", u)), Value: b}, nil)
			}
		}
	}()
	time.Sleep(time.Second)
	b := startConsumer(t, cfg, handlerOf("b"), &memDLQ{}, WithRegisterer(prometheus.NewRegistry()),
		WithState(newStoreState(t, prefix, "b", cfg.Dedup.Lease)))
	// B runs the moved partition's slow messages (after A's hand-over).
	testenv.Eventually(t, 60*time.Second, func() error {
		return testenv.Check(len(b.Partitions()) == 1, "B holds %v", b.Partitions())
	})
	testenv.Eventually(t, 60*time.Second, func() error {
		rs.mu.Lock()
		defer rs.mu.Unlock()
		n := 0
		for _, m := range slow {
			if rs.started[m.UpstreamMsgID] > 1 {
				n++
			}
		}
		return testenv.Check(n > 0, "B ran none of the moved slow messages")
	})
	time.Sleep(2 * time.Second)
	close(stop)
	<-streamed

	if o := rs.overlaps(); len(o) > 0 {
		t.Fatalf("%d runs started while the previous owner's run of the same message still ran: %v", len(o), o)
	}
	if v, _ := testenv.Gathered(t, regA, "kfpipe_handover_attempts_total", "fate", "cancelled"); v == 0 {
		t.Fatal("no attempt cancelled at the drain limit")
	}
	kept := a.Partitions()
	if len(kept) != 1 {
		t.Fatalf("A holds %v, want one partition", kept)
	}
	qmu.Lock()
	ts := quick[kept[0]]
	qmu.Unlock()
	var gap time.Duration
	for i := 1; i < len(ts); i++ {
		gap = max(gap, ts[i].Sub(ts[i-1]))
	}
	t.Logf("kept partition %d: %d quick messages handled by A, longest gap %v (drain limit %v)", kept[0], len(ts), gap, limit)
	if len(ts) < 10 || gap >= limit/2 {
		t.Fatalf("kept partition stalled during the hand-over: %d quick messages, longest gap %v (limit %v)", len(ts), gap, limit)
	}
}

// TestCloseHandsOverWithinDrainLimit: SIGTERM under load. A consumer with
// slow handlers running and many messages queued behind them stops with
// the shutdown's 20 s: it stops starting attempts, cancels the running
// ones at revoke_drain_limit, awaits them, gives its leases back (another
// owner takes them at once) and returns no error, within the limit and a
// few seconds. Before, Close waited for every queued message until its
// context ended and returned ErrDrainTimeout (the daemon exited 1).
func TestCloseHandsOverWithinDrainLimit(t *testing.T) {
	topic := testenv.Topic(t, 2)
	_, prefix := testenv.Redis(t)
	cfg := testConfig(t, topic)
	limit := 2 * time.Second
	cfg.Kafka.Consumer.RevokeDrainLimit = limit
	cfg.Processor.AttemptTimeout = time.Minute
	var msgs []*chatmsg.ChatMessage
	for i := 0; i < 10; i++ {
		for u := 0; u < 12; u++ {
			msgs = append(msgs, chat(fmt.Sprintf("u%02d", u), i))
		}
	}
	produce(t, topic, msgs)
	rs := newRuns()
	reg := prometheus.NewRegistry()
	c, err := New(cfg, slowHandler("a", rs), &memDLQ{}, WithRegisterer(reg),
		WithState(newStoreState(t, prefix, "a", cfg.Dedup.Lease)))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, func() error {
		rs.mu.Lock()
		defer rs.mu.Unlock()
		n := 0
		for _, v := range rs.running {
			n += v
		}
		return testenv.Check(n == 12, "%d handlers running, want 12", n)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	err = c.Close(ctx)
	took := time.Since(start)
	t.Logf("Close took %v (drain limit %v): %v", took, limit, err)
	if err != nil {
		t.Fatalf("Close: %v", err)
	}
	if took > limit+5*time.Second {
		t.Fatalf("Close took %v, want within the drain limit %v and a few seconds", took, limit)
	}
	if v, _ := testenv.Gathered(t, reg, "kfpipe_handover_attempts_total", "fate", "cancelled"); v != 12 {
		t.Fatalf("cancelled attempts %v, want 12", v)
	}
	// The leases were given back: another owner takes them at once.
	other := newStoreState(t, prefix, "b", cfg.Dedup.Lease)
	for p := int32(0); p < 2; p++ {
		actx, acancel := context.WithTimeout(context.Background(), time.Second)
		l, err := other.Acquire(actx, topic, p)
		acancel()
		if err != nil {
			t.Fatalf("partition %d's lease not given back: %v", p, err)
		}
		_ = l.Release(context.Background())
	}
	var started int
	rs.mu.Lock()
	for _, v := range rs.started {
		started += v
	}
	rs.mu.Unlock()
	if started != 12 {
		t.Fatalf("%d attempts started, want the 12 running at the stop (no new one after it)", started)
	}
}

// frozenLease is a lease on the test Redis whose loss the consumer learns
// late: the owner was paused (GC, SIGSTOP, a VM migration) and, resumed,
// its actor reaches the handler before its renewal goroutine has run and
// closed Lost. The lease itself is real; only the loss signal is late.
type frozenLease struct {
	*storeLease
	lost   chan struct{}
	looked chan struct{} // closed after the first look-up
	once   sync.Once
}

func (f *frozenLease) Lost() <-chan struct{} { return f.lost }

func (f *frozenLease) Seen(ctx context.Context, its []StateItem) ([]bool, error) {
	seen, err := f.storeLease.Seen(ctx, its)
	f.once.Do(func() {
		// The pause, between the look-up and the handler: the lease runs
		// out meanwhile (no renewal).
		f.l.Lapse()
		time.Sleep(time.Until(f.l.Deadline()) + 50*time.Millisecond)
		close(f.looked)
	})
	return seen, err
}

type frozenState struct {
	storeState
	mu    sync.Mutex
	lease *frozenLease
}

func (s *frozenState) Acquire(ctx context.Context, topic string, partition int32) (Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lease != nil {
		<-ctx.Done() // the next owner holds it now
		return nil, ctx.Err()
	}
	l, err := s.storeState.Acquire(ctx, topic, partition)
	if err != nil {
		return nil, err
	}
	s.lease = &frozenLease{storeLease: l.(*storeLease), lost: make(chan struct{}), looked: make(chan struct{})}
	return s.lease, nil
}

// TestNoAttemptPastLeaseDeadline: an owner resumed from a pause between
// its look-up and its handler, its lease's deadline passed (another owner
// may hold it now), does not call the handler, and does not dead-letter
// the message: it waits for the next lease. Before, the handler ran under
// a lease another owner could already hold.
func TestNoAttemptPastLeaseDeadline(t *testing.T) {
	_, prefix := testenv.Redis(t)
	st := &frozenState{storeState: newStoreState(t, prefix, "a", time.Second)}
	var calls atomic.Int64
	h := HandlerFunc(func(context.Context, *chatmsg.ChatMessage) error {
		calls.Add(1)
		return nil
	})
	dlq := &memDLQ{}
	c, p := unitConsumer(t, h, dlq, st)
	c.cfg.Dedup.Lease = time.Second
	p.tracker.Add(0)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.proc.process(&envelope{km: &kafka.Message{}, msg: chat("u", 1), part: p})
	}()
	testenv.Eventually(t, 10*time.Second, func() error {
		st.mu.Lock()
		defer st.mu.Unlock()
		return testenv.Check(st.lease != nil, "no lease taken")
	})
	<-st.lease.looked
	time.Sleep(500 * time.Millisecond) // the actor, resumed, would call the handler now
	if n := calls.Load(); n != 0 {
		t.Fatalf("handler called %d times after the lease's deadline", n)
	}
	// Another owner takes the partition; this one learns of the loss.
	other := newStoreState(t, prefix, "b", time.Second)
	actx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	next, err := other.Acquire(actx, "t", 0)
	if err != nil {
		t.Fatalf("the next owner did not get the lease: %v", err)
	}
	defer func() { _ = next.Release(context.Background()) }()
	close(st.lease.lost)
	c.cancelRun()
	<-done
	if n := calls.Load(); n != 0 {
		t.Fatalf("handler called %d times by the old owner", n)
	}
	if l := dlq.all(); len(l) != 0 {
		t.Fatalf("dead-lettered %+v", l)
	}
	if _, ok := p.tracker.Committable(); ok {
		t.Fatal("message finished by the old owner; it is the next owner's")
	}
	if v := testenv.MetricValue(c.m.own.notOwner); v == 0 {
		t.Fatal("no attempt counted as refused for the lease's deadline")
	}
}

// TestLeaseLapsesWhileHandlerIgnoresCancel: a handler that does not return
// when its context is cancelled still runs after the stop's hand-over.
// Its partition's lease is not given back — another owner cannot take it
// while the handler may still have its effect — but left to lapse: the
// next owner takes it once it ran out (and the grace passed). Close says
// so with ErrDrainTimeout. Before, the stop gave the lease back with the
// handler still running, and the next owner could run the message beside
// it.
func TestLeaseLapsesWhileHandlerIgnoresCancel(t *testing.T) {
	topic := testenv.Topic(t, 1)
	_, prefix := testenv.Redis(t)
	cfg := testConfig(t, topic)
	cfg.Kafka.Consumer.RevokeDrainLimit = time.Second
	cfg.Processor.AttemptTimeout = time.Minute
	lease := 3 * time.Second
	cfg.Dedup.Lease = lease
	produce(t, topic, []*chatmsg.ChatMessage{chat("u", 0)})
	running, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	h := HandlerFunc(func(context.Context, *chatmsg.ChatMessage) error {
		close(running)
		<-release // ignores its context
		return nil
	})
	c, err := New(cfg, h, &memDLQ{}, WithRegisterer(prometheus.NewRegistry()),
		WithState(newStoreState(t, prefix, "a", lease)))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-running:
	case <-time.After(60 * time.Second):
		t.Fatal("handler not called")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = c.Close(ctx)
	stopped := time.Now()
	if !errors.Is(err, ErrDrainTimeout) {
		t.Fatalf("Close: %v, want ErrDrainTimeout (a handler still runs)", err)
	}
	other := newStoreState(t, prefix, "b", lease)
	actx, acancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	l, err := other.Acquire(actx, topic, 0)
	acancel()
	if err == nil {
		_ = l.Release(context.Background())
		t.Fatal("the lease was given back while its handler still ran")
	}
	actx, acancel = context.WithTimeout(context.Background(), 2*lease)
	defer acancel()
	l, err = other.Acquire(actx, topic, 0)
	if err != nil {
		t.Fatalf("the lease did not lapse: %v", err)
	}
	_ = l.Release(context.Background())
	t.Logf("next owner took the lapsed lease %v after the stop", time.Since(stopped).Round(time.Millisecond))
}
