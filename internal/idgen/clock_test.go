package idgen

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

// fakeClock is the shared test clock: its Sleep advances its own time, so
// the waiting tiers can be checked to the nanosecond without waiting.
type fakeClock = testenv.Clock

func newFakeClock(t time.Time) *fakeClock { return testenv.NewClock(t) }

// counterValue reads a counter without prometheus/testutil (which would add
// a module to go.sum).
func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatalf("read counter: %v", err)
	}
	return m.GetCounter().GetValue()
}
