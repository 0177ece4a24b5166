package chaos

import (
	"testing"
	"time"
)

// TestReportFailoverWindow: a repeat is put down to a Redis failover only
// when the first effect lies in the window just before it; any other
// repeat is still a dup, so a broken dedup fails the scenario.
func TestReportFailoverWindow(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	sent := []Sent{{MsgID: "a1", User: "a", Index: 0}, {MsgID: "a2", User: "a", Index: 1}}
	d := func(seq int, id string, ms int) Delivery {
		return Delivery{Seq: seq, MsgID: id, User: "a", Tag: "c.1", At: at(ms)}
	}
	failover := at(10000)
	tests := []struct {
		name                       string
		deliveries                 []Delivery
		dup, afterFailover, window int
	}{
		{"first effect 300 ms before the failover", []Delivery{d(0, "a1", 0), d(1, "a2", 9700), d(2, "a2", 14000)}, 0, 1, 1},
		{"first effect 3 s before the failover", []Delivery{d(0, "a1", 0), d(1, "a2", 7000), d(2, "a2", 14000)}, 1, 0, 0},
		{"first effect after the failover", []Delivery{d(0, "a1", 0), d(1, "a2", 12000), d(2, "a2", 14000)}, 1, 0, 0},
		{"no repeat", []Delivery{d(0, "a1", 9900), d(1, "a2", 10250)}, 0, 0, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := &Evidence{Sent: sent, Deliveries: tt.deliveries, Lease: 3 * time.Second,
				Failovers: []Failover{{Issued: failover, Done: failover.Add(200 * time.Millisecond)}}, FailoverWindow: time.Second}
			r := ev.Report("t", time.Second)
			if r.Dup != tt.dup || r.DupAfterFailover != tt.afterFailover || r.FailoverWindowEffects != tt.window {
				t.Errorf("dup=%d dup_after_failover=%d window=%d, want %d %d %d (%s)", r.Dup, r.DupAfterFailover,
					r.FailoverWindowEffects, tt.dup, tt.afterFailover, tt.window, r.Line())
			}
		})
	}
}

// TestReportCutWindow: a repeat of an effect the cut-off consumer made
// just before its cut (its done mark in flight) is a dup like any other —
// the message was finished when its handler returned and the commit
// listed it — and the effects of that window are counted, to show the
// window was exercised.
func TestReportCutWindow(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	sent := []Sent{{MsgID: "a1", User: "a", Index: 0}, {MsgID: "a2", User: "a", Index: 1}}
	d := func(seq int, id, tag string, ms int) Delivery {
		return Delivery{Seq: seq, MsgID: id, User: "a", Tag: tag, At: at(ms)}
	}
	cut := at(10000)
	tests := []struct {
		name        string
		deliveries  []Delivery
		dup, window int
	}{
		{"cut consumer's effect 300 ms before the cut, repeated", []Delivery{d(0, "a1", "c1.1", 0), d(1, "a2", "c1.1", 9700), d(2, "a2", "c2.1", 21000)}, 1, 1},
		{"other consumer's effect before the cut, repeated", []Delivery{d(0, "a1", "c1.1", 0), d(1, "a2", "c2.1", 9700), d(2, "a2", "c2.1", 21000)}, 1, 0},
		{"cut consumer's effect 3 s before the cut, repeated", []Delivery{d(0, "a1", "c1.1", 0), d(1, "a2", "c1.1", 7000), d(2, "a2", "c2.1", 21000)}, 1, 0},
		{"no repeat", []Delivery{d(0, "a1", "c1.1", 9900), d(1, "a2", "c2.1", 9950)}, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := &Evidence{Sent: sent, Deliveries: tt.deliveries, Lease: 3 * time.Second,
				Cuts: []Kill{{Tag: "c1.1", At: cut}}, FailoverWindow: time.Second}
			r := ev.Report("t", time.Second)
			if r.Dup != tt.dup || r.CutWindowEffects != tt.window {
				t.Errorf("dup=%d window=%d, want %d %d (%s)", r.Dup, r.CutWindowEffects, tt.dup, tt.window, r.Line())
			}
		})
	}
}
