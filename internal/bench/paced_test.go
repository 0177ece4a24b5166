package bench

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// The paced schedule is a desk's traffic: every customer's pauses within
// the gaps, the rate users / mean gap, sorted, and the same seed giving the
// same schedule (a bench row that can be re-run).
func TestPacedSchedule(t *testing.T) {
	const users, d = 3000, 120 * time.Second
	lo, hi := 15*time.Second, 40*time.Second
	s := PacedSchedule(rand.New(rand.NewPCG(1, users)), users, d, lo, hi)
	if !slices.IsSortedFunc(s, func(a, b PacedSend) int { return int(a.At - b.At) }) {
		t.Fatal("schedule not sorted by time")
	}
	last := map[int]time.Duration{}
	for _, m := range s {
		if m.At < 0 || m.At >= d {
			t.Fatalf("send at %v outside [0, %v)", m.At, d)
		}
		if prev, ok := last[m.User]; ok {
			if gap := m.At - prev; gap < lo || gap > hi {
				t.Fatalf("user %d: gap %v outside [%v, %v]", m.User, gap, lo, hi)
			}
		}
		last[m.User] = m.At
	}
	// Past the first max gap every customer writes every 27.5 s on average:
	// 3000 / 27.5 ≈ 109 msg/s, the field run's pace.
	var steady int
	for _, m := range s {
		if m.At >= hi {
			steady++
		}
	}
	rate := float64(steady) / (d - hi).Seconds()
	if rate < 95 || rate > 125 {
		t.Errorf("steady rate %.1f msg/s, want ~109", rate)
	}
	again := PacedSchedule(rand.New(rand.NewPCG(1, users)), users, d, lo, hi)
	if !slices.Equal(s, again) {
		t.Error("the same seed gave another schedule")
	}
}
