package testenv

import (
	"fmt"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/obs/gather"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Eventually calls cond until it returns nil and returns how long that
// took. cond's error says what is still not so ("cursor c0, want c1"); when
// timeout passes first, the test fails with t.Fatalf and the last error.
// cond is called at once, then at intervals growing from 1ms to 50ms.
//
// Eventually ends the test with t.Fatalf, so call it only from the
// goroutine running the test (testing.T.FailNow's rule); a goroutine of
// its own must poll without it and hand its error back to the test.
func Eventually(t testing.TB, timeout time.Duration, cond func() error) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(timeout)
	wait := time.Millisecond
	for {
		err := cond()
		if err == nil {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %v", timeout, err)
		}
		time.Sleep(wait)
		if wait < 50*time.Millisecond {
			wait *= 2
		}
	}
}

// Check is the error of a condition for Eventually that tests one thing:
// nil when ok, otherwise an error made of format and args (which should
// say what the value is now, not only what is awaited).
func Check(ok bool, format string, args ...any) error {
	if ok {
		return nil
	}
	return fmt.Errorf(format, args...)
}

// MetricValue reads a counter, gauge or untyped metric (a Counter, Gauge
// or one series of a Vec, as WithLabelValues returns it). It panics when
// the metric cannot be written, which client_golang's own metrics never
// do, so it can be called from any goroutine.
func MetricValue(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		panic(fmt.Sprintf("testenv.MetricValue: %v", err))
	}
	switch {
	case d.Counter != nil:
		return d.Counter.GetValue()
	case d.Gauge != nil:
		return d.Gauge.GetValue()
	case d.Untyped != nil:
		return d.Untyped.GetValue()
	}
	panic(fmt.Sprintf("testenv.MetricValue: %s is not a counter, gauge or untyped metric", m.Desc()))
}

// Gathered sums the counter, gauge or untyped series of the family name in
// g whose labels include every pair of labels ("result", "ok", ...), and
// reports whether any series matched. A Gather error or an odd number of
// label arguments fails the test (t.Fatalf: call it from the test's
// goroutine).
func Gathered(t testing.TB, g prometheus.Gatherer, name string, labels ...string) (float64, bool) {
	t.Helper()
	sum, found, err := gather.Sum(g, name, labels...)
	if err != nil {
		t.Fatalf("testenv.Gathered: %v", err)
	}
	return sum, found
}
