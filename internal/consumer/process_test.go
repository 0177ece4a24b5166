package consumer

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/deadletter"
	"github.com/kfpipe/kfpipe/internal/handler"
	"github.com/kfpipe/kfpipe/internal/offsets"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// memState is an in-memory State: every Acquire is a new lease with a
// larger token; loseLease loses the current one; with hold, marks are
// queued and never confirmed (a Redis outage after the handler ran).
type memState struct {
	mu    sync.Mutex
	done  map[string]bool
	token int64
	cur   *memLease
	hold  bool
	looks atomic.Int32
}

func newMemState(done ...string) *memState {
	s := &memState{done: map[string]bool{}}
	for _, k := range done {
		s.done[k] = true
	}
	return s
}

func (s *memState) Acquire(context.Context, string, int32) (Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.token++
	s.cur = &memLease{MemReplyLog: handler.NewMemReplyLog(), s: s, token: s.token, lost: make(chan struct{})}
	return s.cur, nil
}

func (s *memState) isDone(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.done[key]
}

func (s *memState) setDone(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.done[key] = true
}

// loseLease loses the current lease (another owner took the partition).
func (s *memState) loseLease() {
	s.mu.Lock()
	l := s.cur
	s.mu.Unlock()
	l.once.Do(func() { close(l.lost) })
}

type memLease struct {
	*handler.MemReplyLog
	s     *memState
	token int64
	lost  chan struct{}
	once  sync.Once
}

func (l *memLease) Token() int64          { return l.token }
func (l *memLease) Lost() <-chan struct{} { return l.lost }

func (l *memLease) Seen(_ context.Context, items []StateItem) ([]bool, error) {
	l.s.looks.Add(1)
	out := make([]bool, len(items))
	for i, it := range items {
		out[i] = l.s.isDone(it.Key)
	}
	return out, nil
}

func (l *memLease) Mark(it StateItem, _ int64, done func(bool)) {
	if l.s.hold {
		return
	}
	l.s.setDone(it.Key)
	done(true)
}

func (l *memLease) Release(context.Context) error { return nil }

// unitConsumer is a Consumer without Kafka for exercising process; with a
// State its partition holds a lease in it.
func unitConsumer(t testing.TB, h Handler, dlq DeadLetters, st State) (*Consumer, *partition) {
	return unitConsumerLog(t, h, dlq, st, zap.NewNop())
}

// unitConsumerLog is unitConsumer logging to log (set before the lease's
// keeper starts, which reads it).
func unitConsumerLog(t testing.TB, h Handler, dlq DeadLetters, st State, log *zap.Logger) (*Consumer, *partition) {
	k := &core{log: log, clock: realClock{}, m: newMetrics(nil)}
	k.cfg.Processor = config.Processor{RetryAttempts: 3, RetryBase: time.Millisecond, RetryMax: 4 * time.Millisecond,
		AttemptTimeout: 50 * time.Millisecond}
	k.cfg.Kafka.Consumer.CommitEveryN = 1000
	var cancel context.CancelFunc
	k.runCtx, cancel = context.WithCancel(context.Background())
	c := &Consumer{core: k, cancelRun: cancel, commits: &committer{}}
	c.own = &ownership{core: k, state: st, parts: map[tpKey]*partition{}}
	c.dead = newDeadLetterer(dlq, k.runCtx, c.commits.finish, k.cfg.Processor, k.clock, k.log, k.m)
	c.proc = &processor{core: k, handler: h, own: c.own, dead: c.dead, commits: c.commits}
	c.poll = newPoller(k, nil, c.own, nil, nil, nil, c.dead, c.commits)
	p := &partition{topic: "t", id: 0, tracker: offsets.NewTracker(0)}
	c.own.startLease(p)
	if p.lease != nil {
		t.Cleanup(func() {
			c.cancelRun()
			<-p.lease.done
		})
	}
	return c, p
}

// setBatch turns a unit consumer's batch mode on (WithBatch's).
func setBatch(c *Consumer, size int, wait time.Duration) {
	var o options
	WithBatch(size, wait)(&o)
	c.proc.batch = o.batch
}

func TestProcessOutcomes(t *testing.T) {
	tests := []struct {
		name         string
		h            func(calls *atomic.Int64) HandlerFunc
		wantReason   string // "" = finished without dead letter
		recoverable  bool
		wantAttempts int64
	}{
		{"ok", func(*atomic.Int64) HandlerFunc {
			return func(context.Context, *chatmsg.ChatMessage) error { return nil }
		}, "", false, 1},
		{"retried then ok", func(n *atomic.Int64) HandlerFunc {
			return func(context.Context, *chatmsg.ChatMessage) error {
				if n.Load() < 3 {
					return errors.New("flaky")
				}
				return nil
			}
		}, "", false, 3},
		{"downstream error after retries", func(*atomic.Int64) HandlerFunc {
			return func(context.Context, *chatmsg.ChatMessage) error { return errors.New("boom") }
		}, ReasonDownstreamError, true, 3},
		{"permanent is not retried", func(*atomic.Int64) HandlerFunc {
			return func(context.Context, *chatmsg.ChatMessage) error { return handler.Permanent(errors.New("bad")) }
		}, ReasonHandlerRejected, false, 1},
		{"timeout", func(*atomic.Int64) HandlerFunc {
			return func(ctx context.Context, _ *chatmsg.ChatMessage) error { <-ctx.Done(); return ctx.Err() }
		}, ReasonProcessTimeout, true, 3},
		{"panic is a failure", func(*atomic.Int64) HandlerFunc {
			return func(context.Context, *chatmsg.ChatMessage) error { panic("oops") }
		}, ReasonDownstreamError, true, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var calls atomic.Int64
			inner := tt.h(&calls)
			h := HandlerFunc(func(ctx context.Context, m *chatmsg.ChatMessage) error {
				calls.Add(1)
				return inner(ctx, m)
			})
			dlq := &memDLQ{}
			dd := newMemState()
			c, p := unitConsumer(t, h, dlq, dd)
			p.tracker.Add(7)
			br := &fakeBreaker{}
			done, _ := br.Allow("u")
			msg := chat("u", 1)
			env := &envelope{km: &kafka.Message{TopicPartition: kafka.TopicPartition{Offset: 7}}, msg: msg, part: p, breakerDone: done}
			c.proc.process(env)
			dlq.wg.Wait()
			if calls.Load() != tt.wantAttempts {
				t.Fatalf("handler called %d times, want %d", calls.Load(), tt.wantAttempts)
			}
			if next, ok := p.tracker.Committable(); !ok || next != 8 {
				t.Fatalf("offset not finished: %d %v", next, ok)
			}
			letters := dlq.all()
			if tt.wantReason == "" {
				if len(letters) != 0 || !dd.done[msg.DedupKey()] || br.ok.Load() != 1 {
					t.Fatalf("letters %v, dedup done %v, breaker ok %d", letters, dd.done, br.ok.Load())
				}
				return
			}
			if len(letters) != 1 || string(letters[0].Reason) != tt.wantReason || deadletter.IsRecoverable(deadletter.Reason(letters[0].Reason)) != tt.recoverable ||
				letters[0].HandlerAttempts != int(tt.wantAttempts) || letters[0].SourceOffset != 7 || letters[0].Details == "" {
				t.Fatalf("dead letters %+v", letters)
			}
			if dd.done[msg.DedupKey()] {
				t.Fatalf("dedup key marked done after a failure; a DLQ retry could never run it")
			}
			if br.failed.Load() != 1 {
				t.Fatalf("breaker failures %d, want 1", br.failed.Load())
			}
		})
	}
}

func TestProcessDuplicate(t *testing.T) {
	var calls atomic.Int64
	h := HandlerFunc(func(context.Context, *chatmsg.ChatMessage) error { calls.Add(1); return nil })
	msg := chat("u", 1)
	c, p := unitConsumer(t, h, &memDLQ{}, newMemState(msg.DedupKey()))
	p.tracker.Add(0)
	c.proc.process(&envelope{km: &kafka.Message{}, msg: msg, part: p})
	if calls.Load() != 0 {
		t.Fatalf("duplicate handled")
	}
	if next, ok := p.tracker.Committable(); !ok || next != 1 {
		t.Fatalf("duplicate not finished")
	}
}

func TestHTTPHandler(t *testing.T) {
	var status atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Header.Get("Idempotency-Key") == "" {
			w.WriteHeader(http.StatusMethodNotAllowed)
			return
		}
		if status.Load() == 0 { // slower than the handler's timeout
			time.Sleep(200 * time.Millisecond)
			return
		}
		w.WriteHeader(int(status.Load()))
	}))
	defer srv.Close()
	h, err := NewHandler(config.Handler{Type: "http", HTTP: config.HTTPHandler{URL: srv.URL, Timeout: 50 * time.Millisecond}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		status          int64
		wantErr, wantPm bool
	}{{200, false, false}, {204, false, false}, {400, true, true}, {422, true, true}, {500, true, false}, {503, true, false}, {0, true, false}} {
		status.Store(tc.status)
		err := h.Handle(context.Background(), chat("u", 1))
		if (err != nil) != tc.wantErr || handler.IsPermanent(err) != tc.wantPm {
			t.Errorf("status %d: err %v (permanent %v)", tc.status, err, handler.IsPermanent(err))
		}
	}
	if _, err := NewHandler(config.Handler{Type: "nope"}, nil, nil); err == nil {
		t.Fatal("unknown handler type accepted")
	}
}

// A partition lease lost while the handler runs stops the handler, and the
// message is looked up again under the next lease (here the new owner had
// done it: a duplicate) — not dead-lettered, and not left unfinished,
// which would hold the partition's commits back until a restart.
func TestLeaseLostStopsHandlerAndSettlesMessage(t *testing.T) {
	var calls atomic.Int64
	st := newMemState()
	msg := chat("u", 1)
	h := HandlerFunc(func(ctx context.Context, _ *chatmsg.ChatMessage) error {
		calls.Add(1)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Second):
			return errors.New("handler was not stopped")
		}
	})
	go func() {
		time.Sleep(50 * time.Millisecond) // the handler runs
		st.setDone(msg.DedupKey())        // the new owner ran it
		st.loseLease()
	}()
	dlq := &memDLQ{}
	c, p := unitConsumer(t, h, dlq, st)
	c.cfg.Processor.AttemptTimeout = 30 * time.Second
	p.tracker.Add(0)
	start := time.Now()
	c.proc.process(&envelope{km: &kafka.Message{}, msg: msg, part: p})
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("process took %v: the handler was not stopped", el)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	if n := st.looks.Load(); n != 2 {
		t.Fatalf("state looked up %d times, want 2 (under the lost lease, then under the next)", n)
	}
	if len(dlq.letters) != 0 {
		t.Fatalf("dead-lettered: %+v", dlq.letters[0])
	}
	if next, ok := p.tracker.Committable(); !ok || next != 1 {
		t.Fatalf("message not finished (committable %d, %v)", next, ok)
	}
}

// The handler gets the partition lease's fencing token.
func TestHandlerGetsFencingToken(t *testing.T) {
	st := newMemState()
	var got int64
	var ok bool
	h := HandlerFunc(func(ctx context.Context, _ *chatmsg.ChatMessage) error {
		got, ok = handler.FencingToken(ctx)
		return nil
	})
	c, p := unitConsumer(t, h, &memDLQ{}, st)
	p.tracker.Add(0)
	c.proc.process(&envelope{km: &kafka.Message{}, msg: chat("u", 1), part: p})
	if !ok || got != 1 {
		t.Fatalf("handler.FencingToken = %d, %v; want the lease's token 1", got, ok)
	}
	if _, ok := handler.FencingToken(context.Background()); ok {
		t.Fatal("handler.FencingToken outside a handler reported a token")
	}
}

// TestRetryStopsWhenPartitionDropped: the partition of a message whose
// handler fails is revoked (or lost) between attempts. The in-place retries
// stop and the message is neither finished nor dead-lettered: the new
// owner reads it again. Before, the old owner went on retrying beside the
// new one and dead-lettered a message the new owner handled.
func TestRetryStopsWhenPartitionDropped(t *testing.T) {
	var calls atomic.Int64
	dlq := &memDLQ{}
	var p *partition
	h := HandlerFunc(func(context.Context, *chatmsg.ChatMessage) error {
		calls.Add(1)
		p.dropped.Store(true) // revoked while the attempt ran
		return errors.New("downstream down")
	})
	c, part := unitConsumer(t, h, dlq, newMemState())
	p = part
	p.tracker.Add(3)
	env := &envelope{km: &kafka.Message{TopicPartition: kafka.TopicPartition{Offset: 3}}, msg: chat("u", 1), part: p}
	c.proc.process(env)
	dlq.wg.Wait()
	if n := calls.Load(); n != 1 {
		t.Fatalf("handler called %d times after its partition was dropped, want 1", n)
	}
	if letters := dlq.all(); len(letters) != 0 {
		t.Fatalf("dead-lettered %+v although the partition's new owner handles it", letters)
	}
	if _, ok := p.tracker.Committable(); ok {
		t.Fatal("message finished; it must be left to the new owner")
	}
	if v := testenv.MetricValue(c.m.attempts[attemptAbandoned]); v != 1 {
		t.Fatalf("abandoned attempts = %v, want 1", v)
	}
}

// TestRetriesLoggedAndCounted: each failed attempt is counted by outcome
// and each retry logged with the attempt, the error and the backoff — the
// first retry of a message at info, later ones at debug.
func TestRetriesLoggedAndCounted(t *testing.T) {
	var calls atomic.Int64
	h := HandlerFunc(func(context.Context, *chatmsg.ChatMessage) error {
		if calls.Add(1) < 3 {
			return errors.New("flaky")
		}
		return nil
	})
	core, logs := observer.New(zapcore.DebugLevel)
	c, p := unitConsumerLog(t, h, &memDLQ{}, newMemState(), zap.New(core))
	p.tracker.Add(1)
	c.proc.process(&envelope{km: &kafka.Message{TopicPartition: kafka.TopicPartition{Offset: 1}}, msg: chat("u", 1), part: p})
	if v := testenv.MetricValue(c.m.attempts[attemptFailed]); v != 2 {
		t.Fatalf("failed attempts = %v, want 2", v)
	}
	if v := testenv.MetricValue(c.m.attempts[attemptOK]); v != 1 {
		t.Fatalf("ok attempts = %v, want 1", v)
	}
	retries := logs.FilterMessage("handler attempt failed; retrying").All()
	if len(retries) != 2 || retries[0].Level != zapcore.InfoLevel || retries[1].Level != zapcore.DebugLevel {
		t.Fatalf("retry log lines %+v, want one at info then one at debug", retries)
	}
	f := retries[1].ContextMap()
	if f["attempt"] != int64(2) || f["error"] != "flaky" || f["backoff"] == nil || f["idempotency_key"] != chat("u", 1).DedupKey() {
		t.Fatalf("retry fields %v", f)
	}
}

// TestHTTPHandlerReusesConnections: 64 actors sending 10,000 messages
// through the built-in http handler open at most handler.http.max_conns
// connections, all reused. With Go's default transport (2 idle
// connections per host) the same load opened hundreds.
func TestHTTPHandlerReusesConnections(t *testing.T) {
	const senders, total = 64, 10000
	var opened atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(100 * time.Microsecond)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			opened.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	cfg := config.Handler{Type: "http", HTTP: config.HTTPHandler{URL: srv.URL, Timeout: 5 * time.Second, MaxConns: senders}}
	h, err := NewHandler(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= total; i = next.Add(1) {
				if err := h.Handle(context.Background(), chat("u", int(i))); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d messages from %d senders: %d connections opened", total, senders, opened.Load())
	// At most max_conns at a time; a few more over the run when the
	// transport replaces one (65 once, on a loaded machine) still means
	// reuse — without the cap the same load opens thousands.
	if n := opened.Load(); n > senders+senders/8 {
		t.Fatalf("%d connections opened for %d messages, want about handler.http.max_conns %d", n, total, senders)
	}
}

// failingDLQ refuses every dead letter, counting the attempts.
type failingDLQ struct{ sends atomic.Int64 }

func (d *failingDLQ) Send(_ *chatmsg.DeadLetter, done func(error)) {
	d.sends.Add(1)
	done(errors.New("dlq down"))
}

// TestDeadLetterRetriesStopAtShutdown: a dead letter that is not durable
// is retried with backoff while the consumer runs; shutdown stops the
// pending retry (no timer left behind, no attempt after it).
func TestDeadLetterRetriesStopAtShutdown(t *testing.T) {
	dlq := &failingDLQ{}
	c, p := unitConsumer(t, NoopHandler, dlq, nil)
	c.cfg.Processor.RetryBase, c.cfg.Processor.RetryMax = 5*time.Millisecond, 20*time.Millisecond
	p.tracker.Add(0)
	env := &envelope{km: &kafka.Message{TopicPartition: kafka.TopicPartition{Offset: 0}}, part: p}
	c.dead.send(&chatmsg.DeadLetter{Reason: deadletter.DownstreamError}, env, c.cfg.Processor.RetryBase)
	testenv.Eventually(t, 5*time.Second, func() error {
		n := dlq.sends.Load()
		return testenv.Check(n >= 3, "%d sends, want at least 3", n)
	})
	c.cancelRun()
	c.dead.stopRetries()
	c.dead.mu.Lock()
	pending := len(c.dead.retries)
	c.dead.mu.Unlock()
	if pending != 0 {
		t.Fatalf("%d retry timers left after shutdown", pending)
	}
	n := dlq.sends.Load()
	time.Sleep(100 * time.Millisecond) // several backoffs
	if got := dlq.sends.Load(); got != n {
		t.Fatalf("%d dead-letter attempts after shutdown", got-n)
	}
	if p.tracker.InFlight() != 1 {
		t.Fatal("a dead letter that never became durable was finished")
	}
}

// A message whose handler succeeded is finished — its offset committable —
// although its done mark has not landed: the effect has happened, and a
// message left unfinished until the mark lands is run again by the
// partition's next owner once the outage outlasts its lease (a duplicate
// effect without any crash; found by the redis-outage chaos scenario). A
// copy of it met meanwhile is a duplicate: the mark is pending here.
func TestSuccessFinishesBeforeItsDoneMark(t *testing.T) {
	var calls atomic.Int64
	h := HandlerFunc(func(context.Context, *chatmsg.ChatMessage) error { calls.Add(1); return nil })
	st := newMemState()
	st.hold = true
	c, p := unitConsumer(t, h, &memDLQ{}, st)
	p.tracker.Add(0)
	p.tracker.Add(1)
	c.proc.process(&envelope{km: &kafka.Message{}, msg: chat("u", 1), part: p})
	if calls.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", calls.Load())
	}
	if next, ok := p.tracker.Committable(); !ok || next != 1 {
		t.Fatalf("message not finished while its done mark is pending (committable %d, %v)", next, ok)
	}
	c.proc.process(&envelope{km: &kafka.Message{TopicPartition: kafka.TopicPartition{Offset: 1}}, msg: chat("u", 1), part: p})
	if calls.Load() != 1 {
		t.Fatalf("a copy met while the mark is pending ran the handler again (%d calls)", calls.Load())
	}
	if next, ok := p.tracker.Committable(); !ok || next != 2 {
		t.Fatalf("the copy was not finished as a duplicate (committable %d, %v)", next, ok)
	}
}

func TestMergeAbove(t *testing.T) {
	for _, tc := range []struct{ a, b, want []int64 }{
		{nil, nil, []int64{}},
		{[]int64{3, 5}, nil, []int64{3, 5}},
		{nil, []int64{4}, []int64{4}},
		{[]int64{3, 5, 9}, []int64{4, 5, 10}, []int64{3, 4, 5, 9, 10}},
	} {
		if got := mergeAbove(tc.a, tc.b); !slices.Equal(got, tc.want) {
			t.Errorf("mergeAbove(%v, %v) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}
