package consumer

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// TestHTTPTimeoutRunsFromTheSend: with one connection to a receiver that
// answers in 200 ms, three calls at once each wait for the connection;
// handler.http.timeout (300 ms) bounds the receiver's answer, not that
// wait, so none times out. Measured from the call, the third (400 ms of
// waiting) timed out after the receiver had done its work.
func TestHTTPTimeoutRunsFromTheSend(t *testing.T) {
	var served atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(200 * time.Millisecond)
		served.Add(1)
	}))
	defer srv.Close()
	h, err := NewHandler(config.Handler{Type: "http", HTTP: config.HTTPHandler{URL: srv.URL, Timeout: 300 * time.Millisecond, MaxConns: 1}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = h.Handle(context.Background(), chat("u", i))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("call %d: %v", i, err)
		}
	}
	if served.Load() != 3 {
		t.Fatalf("receiver served %d, want 3", served.Load())
	}
}

// TestHTTPTimeoutCountedAsTimeout: a receiver that does not answer within
// handler.http.timeout (well inside processor.attempt_timeout) is a
// timeout — outcome="timeout", the message's reason process_timeout — not
// a failed call.
func TestHTTPTimeoutCountedAsTimeout(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(time.Second):
		}
	}))
	defer srv.Close()
	h, err := NewHandler(config.Handler{Type: "http", HTTP: config.HTTPHandler{URL: srv.URL, Timeout: 20 * time.Millisecond, MaxConns: 4}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	dlq := &memDLQ{}
	c, p := unitConsumer(t, h, dlq, newMemState())
	c.cfg.Processor.AttemptTimeout = 5 * time.Second
	p.tracker.Add(1)
	c.proc.process(&envelope{km: &kafka.Message{TopicPartition: kafka.TopicPartition{Offset: 1}}, msg: chat("u", 1), part: p})
	dlq.wg.Wait()
	if v := testenv.MetricValue(c.m.attempts[attemptTimeout]); v != 3 {
		t.Fatalf("timeout attempts = %v, want 3 (failed: %v)", v, testenv.MetricValue(c.m.attempts[attemptFailed]))
	}
	if r := dlq.byReason(); len(r) != 1 || r[ReasonProcessTimeout] != 1 {
		t.Fatalf("dead letters %v, want one %s", r, ReasonProcessTimeout)
	}
}

// TestTimeoutWhileSlowWaitsInsteadOfDeadLettering: a message whose calls
// time out while the downstream is slow (the limit was cut) is not
// dead-lettered after its attempts: it waits and is retried, and finishes
// once the downstream answers.
func TestTimeoutWhileSlowWaitsInsteadOfDeadLettering(t *testing.T) {
	var calls atomic.Int64
	h := HandlerFunc(func(ctx context.Context, _ *chatmsg.ChatMessage) error {
		if calls.Add(1) <= 5 {
			<-ctx.Done() // the receiver does not answer in time
			return ctx.Err()
		}
		return nil
	})
	dlq := &memDLQ{}
	c, p := unitConsumer(t, h, dlq, newMemState())
	c.cfg.Processor.AttemptTimeout = 10 * time.Millisecond
	c.cfg.Outage.Window = time.Minute
	c.proc.down = newDownstream(config.Consumer{Overload: config.Overload{MaxInFlight: 8, InitialLimit: 8, Tolerance: 1.3}}, time.Now, nil)
	c.proc.down.timedOut("another user", time.Now()) // the downstream is slow for others too
	p.tracker.Add(1)
	c.proc.process(&envelope{km: &kafka.Message{TopicPartition: kafka.TopicPartition{Offset: 1}}, msg: chat("u", 1), part: p})
	dlq.wg.Wait()
	if r := dlq.byReason(); len(r) != 0 {
		t.Fatalf("dead letters %v for a message of a slow downstream", r)
	}
	if n := calls.Load(); n != 6 {
		t.Fatalf("%d calls, want 6 (5 timed out, then the answer)", n)
	}
	if next, ok := p.tracker.Committable(); !ok || next != 2 {
		t.Fatalf("message not finished: %d %v", next, ok)
	}
}

// TestOneUsersTimeoutsAreDeadLettered: a customer whose calls alone time
// out (its request hangs at the receiver, nobody else's does) is
// dead-lettered after its attempts, though its own timeouts cut the limit.
func TestOneUsersTimeoutsAreDeadLettered(t *testing.T) {
	var calls atomic.Int64
	h := HandlerFunc(func(ctx context.Context, _ *chatmsg.ChatMessage) error {
		calls.Add(1)
		<-ctx.Done()
		return ctx.Err()
	})
	dlq := &memDLQ{}
	c, p := unitConsumer(t, h, dlq, newMemState())
	c.cfg.Processor.AttemptTimeout = 10 * time.Millisecond
	c.cfg.Outage.Window = time.Minute
	c.proc.down = newDownstream(config.Consumer{Overload: config.Overload{MaxInFlight: 8, InitialLimit: 8, Tolerance: 1.3}}, time.Now, nil)
	p.tracker.Add(1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.proc.process(&envelope{km: &kafka.Message{TopicPartition: kafka.TopicPartition{Offset: 1}}, msg: chat("u", 1), part: p})
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		c.cancelRun()
		<-done
		t.Fatalf("the message still waits after 5 s (%d calls): its own timeouts were taken for a slow downstream", calls.Load())
	}
	dlq.wg.Wait()
	if r := dlq.byReason(); r[ReasonProcessTimeout] != 1 {
		t.Fatalf("dead letters %v, want one %s", r, ReasonProcessTimeout)
	}
	if n := calls.Load(); n != 3 {
		t.Fatalf("%d calls, want processor.retry_attempts 3", n)
	}
}

// TestNoLimitWhenMaxInFlightIsZero: overload.max_in_flight 0 turns the
// limit off: every call goes at once, however many, and the limit's
// metrics read 0.
func TestNoLimitWhenMaxInFlightIsZero(t *testing.T) {
	cfg := config.Consumer{Overload: config.Overload{MaxInFlight: 0, InitialLimit: 1, Tolerance: 1.3}}
	d := newDownstream(cfg, time.Now, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for i := range 100 {
		if _, ok := d.acquire(ctx, i%2 == 1); !ok {
			t.Fatalf("call %d waited with the limit off", i)
		}
	}
	if st := d.limit.Stats(); st.Limit != 0 || st.InFlight != 0 {
		t.Fatalf("stats %+v with the limit off", st)
	}
	cfg.Overload.MaxInFlight = 4
	d = newDownstream(cfg, time.Now, nil)
	if _, ok := d.acquire(ctx, false); !ok {
		t.Fatal("first call refused")
	}
	short, cancelShort := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancelShort()
	if _, ok := d.acquire(short, true); ok {
		t.Fatal("a second call passed a limit of 1")
	}
}

// TestRetryFloorFromConfig: with no first calls, the retry budget lets
// overload.retry_floor retries a second go once its saved-up burst is
// spent — the pace at which a backlog of failing messages reaches the
// DLQ when most traffic fails (chaos recovery-after-fix).
func TestRetryFloorFromConfig(t *testing.T) {
	for _, floor := range []float64{5, 50} {
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		cfg := config.Consumer{Overload: config.Overload{RetryBudget: 0.5, RetryFloor: floor}}
		d := newDownstream(cfg, func() time.Time { return now }, nil)
		for d.retry() { // the burst
		}
		got := 0
		for range 100 { // ten seconds in steps of 100 ms
			now = now.Add(100 * time.Millisecond)
			for d.retry() {
				got++
			}
		}
		if want := int(10 * floor); got < want-1 || got > want+1 {
			t.Errorf("retry_floor %v: %d retries in 10 s with no first calls, want %d", floor, got, want)
		}
	}
}
