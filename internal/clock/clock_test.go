package clock_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/clock"
	"github.com/kfpipe/kfpipe/internal/console"
	"github.com/kfpipe/kfpipe/internal/consumer"
	"github.com/kfpipe/kfpipe/internal/dlq"
	"github.com/kfpipe/kfpipe/internal/idgen"
	"github.com/kfpipe/kfpipe/internal/producer"
	"github.com/kfpipe/kfpipe/internal/ratelimit"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// The packages' Clocks are this package's, not look-alikes: a pointer to
// one is assignable to a pointer to the other only when the types are
// identical, so a second definition stops this file compiling.
var (
	_ *ratelimit.Clock = (*clock.Clock)(nil)
	_ *dlq.Clock       = (*clock.Clock)(nil)
	_ *console.Clock   = (*clock.Clock)(nil)
	_ *idgen.Clock     = (*clock.SleepClock)(nil)
	_ *producer.Clock  = (*clock.AfterClock)(nil)
	_ *consumer.Clock  = (*clock.TimerClock)(nil)
	_ *consumer.Timer  = (*clock.Timer)(nil)
	_ clock.SleepClock = (*testenv.Clock)(nil)
	_ clock.AfterClock = (*testenv.Clock)(nil)
	_ ratelimit.Clock  = (*idgen.SystemClock)(nil)
	_ clock.TimerClock = clock.System
	_ idgen.Clock      = clock.System
	_ producer.Clock   = clock.System
	_ dlq.Clock        = dlq.SystemClock
	_ ratelimit.Clock  = ratelimit.SystemClock{}
)

// TestSystem: the wall clock tells the time and waits for real.
func TestSystem(t *testing.T) {
	before := time.Now()
	if now := clock.System.Now(); now.Before(before) || now.Sub(before) > time.Second {
		t.Fatalf("Now = %v, want about %v", now, before)
	}
	start := time.Now()
	clock.System.Sleep(5 * time.Millisecond)
	if el := time.Since(start); el < 5*time.Millisecond {
		t.Fatalf("Sleep(5ms) returned after %v", el)
	}
	select {
	case <-clock.System.After(time.Millisecond):
	case <-time.After(5 * time.Second):
		t.Fatal("After(1ms) did not fire")
	}
	var ran atomic.Bool
	done := make(chan struct{})
	clock.System.AfterFunc(time.Millisecond, func() { ran.Store(true); close(done) })
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("AfterFunc(1ms) did not run")
	}
	stopped := clock.System.AfterFunc(time.Hour, func() { t.Error("a stopped timer ran") })
	if !stopped.Stop() || !ran.Load() {
		t.Fatal("Stop of a pending timer reported it had fired")
	}
}
