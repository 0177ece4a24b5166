package main

import (
	"testing"
	"time"
)

func TestParseGapAndBurst(t *testing.T) {
	for s, mean := range map[string]time.Duration{"exp:2s": 2 * time.Second, "uniform:1s-3s": 2 * time.Second, "fixed:500ms": 500 * time.Millisecond} {
		g, err := parseGap(s)
		if err != nil || g.mean() != mean {
			t.Fatalf("%s: %v mean %s", s, err, g.mean())
		}
	}
	for _, bad := range []string{"2s", "exp:x", "uniform:3s-1s", "uniform:1s", "normal:1s", "fixed:-1s"} {
		if _, err := parseGap(bad); err == nil {
			t.Fatalf("%q: no error", bad)
		}
	}
	if b, err := parseBurst("2-5"); err != nil || b != (burstRange{2, 5}) {
		t.Fatalf("2-5: %+v %v", b, err)
	}
	if b, err := parseBurst("3"); err != nil || b != (burstRange{3, 3}) {
		t.Fatalf("3: %+v %v", b, err)
	}
	for _, bad := range []string{"0", "5-2", "x", "1-"} {
		if _, err := parseBurst(bad); err == nil {
			t.Fatalf("%q: no error", bad)
		}
	}
}

// TestConversations: users send conversations of exactly burst messages
// spaced by the gap, with longer pauses between them, and the average
// rate is the profile's.
func TestConversations(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	gap, _ := parseGap("fixed:2s")
	const users, perMin = 50, 2.0
	c := newConversations(users, perMin, burstRange{3, 3}, gap, start, 2*time.Hour, 7)
	times := map[int][]time.Time{}
	end := start.Add(2 * time.Hour)
	for now := start; now.Before(end); now = now.Add(100 * time.Millisecond) {
		c.due(now, func(u int, at time.Time) { times[u] = append(times[u], at) })
	}
	total := 0
	for u, ts := range times {
		total += len(ts)
		// Within each conversation the gap is 2 s exactly; the first
		// message of each conversation follows a pause drawn around the
		// mean (3 min x 1/2 per message ... at least not the gap).
		for i := 1; i < len(ts); i++ {
			d := ts[i].Sub(ts[i-1])
			if i%3 != 0 && d != 2*time.Second {
				t.Fatalf("user %d message %d: gap %s inside a conversation, want 2s", u, i, d)
			}
		}
	}
	want := users * perMin * 120
	if float64(total) < 0.85*want || float64(total) > 1.15*want {
		t.Fatalf("%d messages in 2 h, want about %.0f (the profile's rate)", total, want)
	}
}

// TestConversationsShortRun: in a run shorter than a cycle every user
// starts within its first half.
func TestConversationsShortRun(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	gap, _ := parseGap("fixed:100ms")
	c := newConversations(40, 2, burstRange{2, 2}, gap, start, 4*time.Second, 3)
	seen := map[int]int{}
	for now := start; now.Before(start.Add(4 * time.Second)); now = now.Add(10 * time.Millisecond) {
		c.due(now, func(u int, _ time.Time) { seen[u]++ })
	}
	for u := range 40 {
		if seen[u] < 2 {
			t.Fatalf("user %d sent %d messages in the run, want a whole conversation (2)", u, seen[u])
		}
	}
}
