package config

import (
	"strings"
	"testing"

	"github.com/kfpipe/kfpipe/internal/deadletter"
)

// A mistyped reason under recovery.max_retries used to be ignored: the
// reason it meant kept its default without a word.
func TestRecoveryMaxRetriesUnknownReason(t *testing.T) {
	_, err := LoadDLQConsumer(writeYAML(t, "recovery:\n  max_retries:\n    rate_limitd: 2\n"))
	want := "recovery.max_retries.rate_limitd is not a dead-letter reason"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("error = %v\nwant it to contain %q", err, want)
	}
}

// Every reason of the table may be set, and each one not set keeps the
// table's default.
func TestRecoveryMaxRetriesFromReasonTable(t *testing.T) {
	var b strings.Builder
	b.WriteString("recovery:\n  max_retries:\n")
	for _, r := range deadletter.Names() {
		b.WriteString("    " + r + ": 7\n")
	}
	c, err := LoadDLQConsumer(writeYAML(t, b.String()))
	if err != nil {
		t.Fatalf("every table reason set: %v", err)
	}
	for _, r := range deadletter.Names() {
		if got := c.Recovery.MaxRetries[r]; got != 7 {
			t.Errorf("recovery.max_retries.%s = %d, want 7", r, got)
		}
	}

	c, err = LoadDLQConsumer(writeYAML(t, "recovery:\n  max_retries:\n    queue_full: 9\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range deadletter.Rows() {
		want := row.MaxRetries
		if row.Reason == deadletter.QueueFull {
			want = 9
		}
		if got, ok := c.Recovery.MaxRetries[string(row.Reason)]; !ok || got != want {
			t.Errorf("recovery.max_retries.%s = %d (set %v), want %d", row.Reason, got, ok, want)
		}
	}
	if len(c.Recovery.MaxRetries) != len(deadletter.Rows()) {
		t.Errorf("recovery.max_retries has %d entries, the reason table %d: %v", len(c.Recovery.MaxRetries), len(deadletter.Rows()), c.Recovery.MaxRetries)
	}
}
