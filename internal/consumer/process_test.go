package consumer

import (
	"context"
	"errors"
	"fmt"
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
	"github.com/kfpipe/kfpipe/internal/offsets"
)

// memDeduper is an in-memory Deduper with the I3 protocol.
type memDeduper struct{ done map[string]bool }

func (d *memDeduper) Do(ctx context.Context, key string, _ time.Duration, f func(context.Context) error) (bool, error) {
	if d.done[key] {
		return true, nil
	}
	if err := f(ctx); err != nil {
		return false, err // released: not marked
	}
	d.done[key] = true
	return false, nil
}

// unitConsumer is a Consumer without Kafka for exercising process.
func unitConsumer(h Handler, dlq DeadLetters, d Deduper) (*Consumer, *partition) {
	c := &Consumer{handler: h, dlq: dlq, dedup: d, log: zap.NewNop(), clock: realClock{}, m: newMetrics(nil),
		kick: make(chan struct{}, 1)}
	c.cfg.Processor = config.Processor{RetryAttempts: 3, RetryBase: time.Millisecond, RetryMax: 4 * time.Millisecond,
		AttemptTimeout: 50 * time.Millisecond}
	c.cfg.Kafka.Consumer.CommitEveryN = 1000
	c.runCtx, c.cancelRun = context.WithCancel(context.Background())
	return c, &partition{topic: "t", id: 0, tracker: offsets.NewTracker(0)}
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
			return func(context.Context, *chatmsg.ChatMessage) error { return Permanent(errors.New("bad")) }
		}, ReasonInvalidMessage, false, 1},
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
			dd := &memDeduper{done: map[string]bool{}}
			c, p := unitConsumer(h, dlq, dd)
			p.tracker.Add(7)
			br := &fakeBreaker{}
			done, _ := br.Allow("u")
			msg := chat("u", 1)
			env := &envelope{km: &kafka.Message{TopicPartition: kafka.TopicPartition{Offset: 7}}, msg: msg, part: p, breakerDone: done}
			c.process(env)
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
			if len(letters) != 1 || letters[0].Reason != tt.wantReason || letters[0].Recoverable != tt.recoverable ||
				letters[0].Attempts != int(tt.wantAttempts) || letters[0].Offset != 7 || letters[0].Details == "" {
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
	c, p := unitConsumer(h, &memDLQ{}, &memDeduper{done: map[string]bool{msg.DedupKey(): true}})
	p.tracker.Add(0)
	c.process(&envelope{km: &kafka.Message{}, msg: msg, part: p})
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
		if (err != nil) != tc.wantErr || IsPermanent(err) != tc.wantPm {
			t.Errorf("status %d: err %v (permanent %v)", tc.status, err, IsPermanent(err))
		}
	}
	if _, err := NewHandler(config.Handler{Type: "nope"}, nil, nil); err == nil {
		t.Fatal("unknown handler type accepted")
	}
}

// lostClaimDeduper loses the claim of its first call while f runs (the way
// once reports a lease lost: AheadDeduper's lost callback for a ticket, a
// cancelled context for Do); every later call finds the key done by the
// owner that took it over.
type lostClaimDeduper struct {
	calls atomic.Int32
}

func (d *lostClaimDeduper) runLosing(ctx context.Context, f func(context.Context) error, lose func()) error {
	errc := make(chan error, 1)
	go func() { errc <- f(ctx) }()
	time.Sleep(20 * time.Millisecond) // f is running
	lose()
	return <-errc
}

func (d *lostClaimDeduper) Do(ctx context.Context, _ string, _ time.Duration, f func(context.Context) error) (bool, error) {
	if d.calls.Add(1) > 1 {
		return true, nil
	}
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	return false, d.runLosing(fctx, f, func() { cancel(errors.New("lease lost")) })
}

func (d *lostClaimDeduper) ClaimAhead(_ context.Context, keys []string) []Ticket {
	ts := make([]Ticket, len(keys))
	for i, k := range keys {
		ts[i] = k
	}
	return ts
}

func (d *lostClaimDeduper) DoTicket(ctx context.Context, _ Ticket, _ time.Duration, f func(context.Context) error, _, lost func(error)) (bool, error) {
	if d.calls.Add(1) > 1 {
		return true, nil
	}
	return false, d.runLosing(ctx, f, func() { lost(errors.New("lease lost")) })
}

func (d *lostClaimDeduper) Release([]Ticket) {}

// A claim lost while the handler runs stops the handler, and the message
// is settled by the dedup protocol (here: the new owner's done mark makes
// it a duplicate) — not dead-lettered, and not left unfinished, which would
// hold the partition's commits back until a restart.
func TestClaimLostStopsHandlerAndSettlesMessage(t *testing.T) {
	for _, ticket := range []bool{true, false} {
		t.Run(fmt.Sprintf("ticket=%v", ticket), func(t *testing.T) {
			var calls atomic.Int64
			h := HandlerFunc(func(ctx context.Context, _ *chatmsg.ChatMessage) error {
				calls.Add(1)
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(10 * time.Second):
					return errors.New("handler was not stopped")
				}
			})
			d := &lostClaimDeduper{}
			dlq := &memDLQ{}
			c, p := unitConsumer(h, dlq, d)
			c.cfg.Processor.AttemptTimeout = 30 * time.Second
			env := &envelope{km: &kafka.Message{}, msg: chat("u", 1), part: p}
			if ticket {
				c.ahead = d
				env.ticket = "k"
			}
			p.tracker.Add(0)
			start := time.Now()
			c.process(env)
			if el := time.Since(start); el > 5*time.Second {
				t.Fatalf("process took %v: the handler was not stopped", el)
			}
			if n := calls.Load(); n != 1 {
				t.Fatalf("handler ran %d times, want 1", n)
			}
			if n := d.calls.Load(); n != 2 {
				t.Fatalf("dedup consulted %d times, want 2 (the lost call, then the settled key)", n)
			}
			if len(dlq.letters) != 0 {
				t.Fatalf("dead-lettered: %+v", dlq.letters[0])
			}
			if next, ok := p.tracker.Committable(); !ok || next != 1 {
				t.Fatalf("message not finished (committable %d, %v)", next, ok)
			}
		})
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
	c, part := unitConsumer(h, dlq, &memDeduper{done: map[string]bool{}})
	p = part
	p.tracker.Add(3)
	env := &envelope{km: &kafka.Message{TopicPartition: kafka.TopicPartition{Offset: 3}}, msg: chat("u", 1), part: p}
	c.process(env)
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
	if v := metricValue(t, c.m.attempts[attemptAbandoned]); v != 1 {
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
	c, p := unitConsumer(h, &memDLQ{}, &memDeduper{done: map[string]bool{}})
	core, logs := observer.New(zapcore.DebugLevel)
	c.log = zap.New(core)
	p.tracker.Add(1)
	c.process(&envelope{km: &kafka.Message{TopicPartition: kafka.TopicPartition{Offset: 1}}, msg: chat("u", 1), part: p})
	if v := metricValue(t, c.m.attempts[attemptFailed]); v != 2 {
		t.Fatalf("failed attempts = %v, want 2", v)
	}
	if v := metricValue(t, c.m.attempts[attemptOK]); v != 1 {
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

func (d *failingDLQ) Send(_ *DeadLetter, done func(error)) {
	d.sends.Add(1)
	done(errors.New("dlq down"))
}

// TestDeadLetterRetriesStopAtShutdown: a dead letter that is not durable
// is retried with backoff while the consumer runs; shutdown stops the
// pending retry (no timer left behind, no attempt after it).
func TestDeadLetterRetriesStopAtShutdown(t *testing.T) {
	dlq := &failingDLQ{}
	c, p := unitConsumer(NoopHandler, dlq, nil)
	c.cfg.Processor.RetryBase, c.cfg.Processor.RetryMax = 5*time.Millisecond, 20*time.Millisecond
	p.tracker.Add(0)
	env := &envelope{km: &kafka.Message{TopicPartition: kafka.TopicPartition{Offset: 0}}, part: p}
	c.sendDead(&DeadLetter{Reason: "downstream_error"}, env, c.cfg.Processor.RetryBase)
	waitFor(t, 5*time.Second, func() bool { return dlq.sends.Load() >= 3 })
	c.cancelRun()
	c.stopRetries()
	c.retryMu.Lock()
	pending := len(c.retries)
	c.retryMu.Unlock()
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

// unmarkedDeduper runs f under a ticket and never confirms the done mark,
// as during a Redis outage that began after f's claim: the mark is retried
// in the background for as long as the outage lasts.
type unmarkedDeduper struct{ lostClaimDeduper }

func (d *unmarkedDeduper) DoTicket(ctx context.Context, _ Ticket, _ time.Duration, f func(context.Context) error, _, _ func(error)) (bool, error) {
	return false, f(ctx)
}

// A message whose handler succeeded is finished — its offset committable —
// although its done mark has not landed: the effect has happened, and a
// message left unfinished until the mark lands is run again by the
// partition's next owner once the outage outlasts its claim (a duplicate
// effect without any crash; found by the redis-outage chaos scenario).
func TestSuccessFinishesBeforeItsDoneMark(t *testing.T) {
	var calls atomic.Int64
	h := HandlerFunc(func(context.Context, *chatmsg.ChatMessage) error { calls.Add(1); return nil })
	d := &unmarkedDeduper{}
	c, p := unitConsumer(h, &memDLQ{}, d)
	c.ahead = d
	p.tracker.Add(0)
	c.process(&envelope{km: &kafka.Message{}, msg: chat("u", 1), part: p, ticket: "k"})
	if calls.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", calls.Load())
	}
	if next, ok := p.tracker.Committable(); !ok || next != 1 {
		t.Fatalf("message not finished while its done mark is pending (committable %d, %v)", next, ok)
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
