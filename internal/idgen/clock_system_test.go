package idgen

import (
	"testing"
	"time"
)

func TestSystemClockTracksWallClock(t *testing.T) {
	var c SystemClock
	prev := int64(0)
	deadline := time.Now().Add(3 * resyncEvery) // spans several resyncs
	for time.Now().Before(deadline) {
		before := time.Now().UnixNano()
		got := c.UnixNano()
		after := time.Now().UnixNano()
		// The anchor may be off by maxAnchorSkew on a busy machine.
		if got < before-int64(maxAnchorSkew) || got > after+int64(maxAnchorSkew) {
			t.Fatalf("UnixNano %d outside wall readings [%d, %d]", got, before, after)
		}
		if got < prev-int64(maxAnchorSkew) {
			t.Fatalf("UnixNano went back from %d to %d", prev, got)
		}
		prev = got
	}
	if d := time.Since(c.Now()); d.Abs() > time.Millisecond {
		t.Fatalf("Now is %s away from time.Now", d)
	}
}

func TestSystemClockSleep(t *testing.T) {
	var c SystemClock
	for _, d := range []time.Duration{300 * time.Microsecond, 5 * time.Millisecond} {
		start := time.Now()
		c.Sleep(d)
		if got := time.Since(start); got < d {
			t.Errorf("Sleep(%s) returned after %s", d, got)
		}
	}
}

// nanoClock has a fast path that disagrees with Now, to prove which one the
// generator reads.
type nanoClock struct{ *fakeClock }

func (c nanoClock) UnixNano() int64 { return c.Now().Add(time.Hour).UnixNano() }

func TestGeneratorUsesFastPath(t *testing.T) {
	g := newTestGen(t, nanoClock{newFakeClock(t0)})
	if p := mustNext(t, g); !p.Time.Equal(t0.Add(time.Hour)) {
		t.Fatalf("id time %s, want the UnixNano reading %s", p.Time, t0.Add(time.Hour))
	}
}
