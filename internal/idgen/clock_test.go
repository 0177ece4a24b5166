package idgen

import (
	"time"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

// fakeClock is the shared test clock: its Sleep advances its own time, so
// the waiting tiers can be checked to the nanosecond without waiting.
type fakeClock = testenv.Clock

func newFakeClock(t time.Time) *fakeClock { return testenv.NewClock(t) }
