package chaos

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// Report is a scenario's outcome and its one-line summary.
type Report struct {
	Name         string
	Sent         int
	Effects      int // distinct sent messages with at least one effect
	DLQ          int // distinct sent messages with a dead letter
	Lost         int
	Dup          int
	Reordered    int
	Redelivered  int // second effects explained by a kill -9 (at-least-once window)
	Deliveries   int // effects counted with repetitions
	InKafka      int // distinct sent messages found on the main topic
	KafkaRecords int // records on the main topic (re-pulls after a crash add copies)
	Kills        int
	Duration     time.Duration
	// With a Redis failover: repeats explained by it, and the effects in
	// the failover window (the most that can be repeated).
	Failovers             int
	DupAfterFailover      int
	FailoverWindowEffects int
	// With a consumer cut off from Redis: its effects in the second before
	// the cut, whose done marks were in flight when the link went. A repeat
	// of one is a dup: the message was finished when its handler returned
	// and the commit listed it, so no new owner may run it again.
	Cuts             int
	CutWindowEffects int

	extra    []string
	problems []string
	notes    []string
}

// Extra appends key=value to the line.
func (r *Report) Extra(key string, value any) {
	r.extra = append(r.extra, fmt.Sprintf("%s=%v", key, value))
}

// Problem records a scenario-specific failure; the scenario then fails.
func (r *Report) Problem(format string, args ...any) {
	r.problems = append(r.problems, fmt.Sprintf(format, args...))
}

func (r *Report) note(format string, args ...any) {
	r.notes = append(r.notes, fmt.Sprintf(format, args...))
}

// OK reports whether the scenario passed.
func (r *Report) OK() bool {
	return r.Lost == 0 && r.Dup == 0 && r.Reordered == 0 && len(r.problems) == 0
}

// Line is the scenario's summary line.
func (r *Report) Line() string {
	var b strings.Builder
	fmt.Fprintf(&b, "scenario=%s sent=%d effects=%d dlq=%d lost=%d dup=%d reordered=%d duration=%s",
		r.Name, r.Sent, r.Effects, r.DLQ, r.Lost, r.Dup, r.Reordered, r.Duration.Round(100*time.Millisecond))
	fmt.Fprintf(&b, " redelivered_after_kill=%d deliveries=%d kills=%d in_kafka=%d kafka_records=%d",
		r.Redelivered, r.Deliveries, r.Kills, r.InKafka, r.KafkaRecords)
	if r.Failovers > 0 {
		fmt.Fprintf(&b, " failovers=%d dup_after_failover=%d failover_window_effects=%d",
			r.Failovers, r.DupAfterFailover, r.FailoverWindowEffects)
	}
	if r.Cuts > 0 {
		fmt.Fprintf(&b, " cuts=%d cut_window_effects=%d", r.Cuts, r.CutWindowEffects)
	}
	for _, e := range r.extra {
		b.WriteString(" " + e)
	}
	if len(r.problems) > 0 {
		fmt.Fprintf(&b, " problems=%d", len(r.problems))
	}
	return b.String()
}

var reportMu sync.Mutex

// Finish prints the line (t.Log, stdout and the EnvReport file) and fails
// the test unless the scenario is clean.
func Finish(t *testing.T, r *Report) {
	t.Helper()
	line := r.Line()
	t.Log(line)
	reportMu.Lock()
	fmt.Println(line)
	if path := os.Getenv(EnvReport); path != "" {
		if f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			_, _ = fmt.Fprintln(f, line)
			_ = f.Close()
		}
	}
	reportMu.Unlock()
	for _, n := range r.notes {
		t.Log(n)
	}
	for _, p := range r.problems {
		t.Errorf("%s: %s", r.Name, p)
	}
	if r.Lost > 0 || r.Dup > 0 || r.Reordered > 0 {
		t.Errorf("%s: lost=%d dup=%d reordered=%d (details above)", r.Name, r.Lost, r.Dup, r.Reordered)
	}
}

// absorb takes over o's extra fields, problems and notes (what a fault
// recorded before the counts were computed).
func (r *Report) absorb(o *Report) {
	r.extra = append(o.extra, r.extra...)
	r.problems = append(o.problems, r.problems...)
	r.notes = append(o.notes, r.notes...)
}
