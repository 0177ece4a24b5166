package testenv

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// fatalT records Fatalf instead of ending the test, so Eventually's
// timeout can be checked; Fatalf exits the goroutine as FailNow does.
type fatalT struct {
	testing.TB
	msg string
}

func (f *fatalT) Helper() {}
func (f *fatalT) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestEventually(t *testing.T) {
	n := 0
	took := Eventually(t, time.Second, func() error {
		n++
		return Check(n >= 3, "n = %d, want 3", n)
	})
	if n != 3 || took <= 0 {
		t.Fatalf("n = %d, took %s", n, took)
	}

	// A timeout fails with the last error, not only "timed out".
	f := &fatalT{TB: t}
	var wg sync.WaitGroup
	wg.Add(1)
	calls := 0
	go func() {
		defer wg.Done()
		Eventually(f, 30*time.Millisecond, func() error {
			calls++
			return fmt.Errorf("cursor c%d, want c9", calls)
		})
		t.Error("Eventually returned after its timeout")
	}()
	wg.Wait()
	want := fmt.Sprintf("cursor c%d, want c9", calls)
	if calls < 2 || !strings.Contains(f.msg, "not within 30ms") || !strings.HasSuffix(f.msg, want) {
		t.Fatalf("calls %d, fatal %q, want it to end with %q", calls, f.msg, want)
	}
	if err := Check(true, "unused"); err != nil {
		t.Fatal(err)
	}
	if err := Check(false, "x = %d", 4); err == nil || err.Error() != "x = 4" {
		t.Fatalf("Check(false) = %v", err)
	}
}

func TestMetricValueAndGathered(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c_total"}, []string{"result", "kf"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"})
	reg.MustRegister(c, g)
	c.WithLabelValues("ok", "a").Add(2)
	c.WithLabelValues("ok", "b").Add(3)
	c.WithLabelValues("error", "a").Inc()
	g.Set(-1.5)

	if v := MetricValue(c.WithLabelValues("ok", "b")); v != 3 {
		t.Errorf("MetricValue(counter) = %v, want 3", v)
	}
	if v := MetricValue(g); v != -1.5 {
		t.Errorf("MetricValue(gauge) = %v, want -1.5", v)
	}
	for _, tt := range []struct {
		name   string
		labels []string
		want   float64
		found  bool
	}{
		{"c_total", nil, 6, true},
		{"c_total", []string{"result", "ok"}, 5, true},
		{"c_total", []string{"result", "ok", "kf", "a"}, 2, true},
		{"c_total", []string{"result", "missing"}, 0, false},
		{"g", nil, -1.5, true},
		{"absent", nil, 0, false},
	} {
		v, found := Gathered(t, reg, tt.name, tt.labels...)
		if v != tt.want || found != tt.found {
			t.Errorf("Gathered(%s, %q) = %v, %v; want %v, %v", tt.name, tt.labels, v, found, tt.want, tt.found)
		}
	}
	f := &fatalT{TB: t}
	done := make(chan struct{})
	go func() { defer close(done); Gathered(f, reg, "c_total", "result") }()
	<-done
	if !strings.Contains(f.msg, "not name, value pairs") {
		t.Errorf("odd labels: fatal %q", f.msg)
	}
}
