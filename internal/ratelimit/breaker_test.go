package ratelimit

import (
	"errors"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/testenv"
	"github.com/prometheus/client_golang/prometheus"
)

// The third layer of isolation, with the original settings: 100 consecutive failures open the breaker for
// 30 s; half-open admits 5 trials; 5 successes close it; a failure re-opens.
func TestBreakerLifecycle(t *testing.T) {
	clock := newFakeClock()
	cfg := config.Breaker{FailureThreshold: 100, OpenTimeout: 30 * time.Second, HalfOpenMax: 5}
	bs, err := NewBreakers(cfg, WithClock(clock), WithRegisterer(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	allow := func() func(bool) {
		t.Helper()
		done, err := bs.Allow("u")
		if err != nil {
			t.Fatalf("Allow in %s: %v", bs.State("u"), err)
		}
		return done
	}
	refused := func() {
		t.Helper()
		if _, err := bs.Allow("u"); !errors.Is(err, ErrCircuitOpen) {
			t.Fatalf("Allow in %s: %v, want ErrCircuitOpen", bs.State("u"), err)
		}
	}
	wantState := func(s State) {
		t.Helper()
		if got := bs.State("u"); got != s {
			t.Fatalf("state %s, want %s", got, s)
		}
	}
	// A success in between resets the consecutive count.
	for range 99 {
		allow()(false)
	}
	allow()(true)
	for range 99 {
		allow()(false)
	}
	wantState(StateClosed)
	allow()(false) // the 100th consecutive failure
	wantState(StateOpen)
	refused()
	if v := testenv.MetricValue(bs.m.open); v != 1 {
		t.Errorf("breakers_open = %v, want 1", v)
	}
	clock.Advance(30*time.Second - time.Nanosecond)
	refused()
	clock.Advance(time.Nanosecond)
	wantState(StateHalfOpen)
	dones := make([]func(bool), 5)
	for i := range dones {
		dones[i] = allow()
	}
	refused() // the 6th trial while 5 are out
	for _, d := range dones[:4] {
		d(true)
	}
	wantState(StateHalfOpen)
	dones[4](false) // a failed trial re-opens
	wantState(StateOpen)
	clock.Advance(29 * time.Second)
	refused() // the open period restarted at the failure
	clock.Advance(time.Second)
	for range 5 {
		allow()(true)
	}
	wantState(StateClosed)
	if v := testenv.MetricValue(bs.m.open); v != 0 {
		t.Errorf("breakers_open = %v, want 0", v)
	}
	if o, h, c := testenv.MetricValue(bs.m.toOpen), testenv.MetricValue(bs.m.toHalfOpen), testenv.MetricValue(bs.m.toClosed); o != 2 || h != 2 || c != 1 {
		t.Errorf("transitions open %v half-open %v closed %v, want 2 2 1", o, h, c)
	}
	// Other users never noticed.
	if s := bs.State("other"); s != StateClosed {
		t.Errorf("other user %s", s)
	}
}

// A result of a message admitted before a transition does not count in the
// new state.
func TestBreakerIgnoresStaleResults(t *testing.T) {
	clock := newFakeClock()
	bs, err := NewBreakers(config.Breaker{FailureThreshold: 2, OpenTimeout: time.Second, HalfOpenMax: 1}, WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	early, _ := bs.Allow("u")
	d1, _ := bs.Allow("u")
	d2, _ := bs.Allow("u")
	d1(false)
	d2(false)
	if bs.State("u") != StateOpen {
		t.Fatal("not open")
	}
	clock.Advance(time.Second)
	trial, err := bs.Allow("u")
	if err != nil {
		t.Fatal(err)
	}
	early(false) // from the closed generation: ignored
	if s := bs.State("u"); s != StateHalfOpen {
		t.Fatalf("stale failure moved the breaker to %s", s)
	}
	trial(true)
	if s := bs.State("u"); s != StateClosed {
		t.Fatalf("state %s after the trial succeeded", s)
	}
	bs.Forget("u")
	if s := bs.State("u"); s != StateClosed {
		t.Fatalf("forgotten user %s", s)
	}
}

func TestBreakerConfigRejected(t *testing.T) {
	for _, cfg := range []config.Breaker{
		{FailureThreshold: 0, OpenTimeout: time.Second, HalfOpenMax: 1},
		{FailureThreshold: 1, OpenTimeout: 0, HalfOpenMax: 1},
		{FailureThreshold: 1, OpenTimeout: time.Second, HalfOpenMax: 0},
	} {
		if _, err := NewBreakers(cfg); err == nil {
			t.Errorf("NewBreakers(%+v) accepted", cfg)
		}
	}
}
