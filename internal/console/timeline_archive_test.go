package console

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

// memArchive is a memCustomers with an archive: the archived records per
// user and the archiver's lag on the user's partition.
type memArchive struct {
	memCustomers
	archived map[string][]TopicRecord
	behindBy int64
	upTo     time.Time
	more     bool
}

func (a *memArchive) ArchiveRetention() time.Duration { return 30 * 24 * time.Hour }

func (a *memArchive) ArchivedRecords(_ context.Context, user string, since, until time.Time, max int) (ArchiveRead, error) {
	ar := ArchiveRead{Retention: a.ArchiveRetention(), From: since, To: until, Partition: 2, BehindBy: a.behindBy,
		ArchivedUpTo: a.upTo, Truncated: a.more}
	for _, r := range a.archived[user] {
		if !r.Time.Before(since) {
			r.Archived = true
			ar.Records = append(ar.Records, r)
		}
	}
	return ar, nil
}

func archiveFixture(t *testing.T, a *memArchive) *fixture {
	t.Helper()
	f := &fixture{dlq: newMemDLQ(t0), rl: newMemRL(t0)}
	f.rdb, f.prefix = testenv.Redis(t)
	return f.start(t, Config{Pipeline: a})
}

// The timeline reads the archive for a window the topic could not: a
// message ten days old, the whole window read. When the archiver lags,
// the newer records come from the main topic and the notes say "archive
// behind by N"; when the topic's read of them is cut short, the window is
// not whole and a user with nothing found is not "nothing known".
func TestTimelineFromArchive(t *testing.T) {
	a := &memArchive{
		memCustomers: memCustomers{records: map[string][]TopicRecord{
			"cust-lag": {rec(70, t0.Add(-time.Minute), "lag-new", false)},
		}, effects: map[string]MessageEffects{"old-1": {Done: DoneYes, Replies: []ReplyMark{{Key: "wk1:old-1:0"}}}}},
		archived: map[string][]TopicRecord{
			"cust-old": {rec(5, t0.Add(-10*24*time.Hour), "old-1", false)},
			"cust-lag": {rec(60, t0.Add(-time.Hour), "lag-old", false)},
		},
		upTo: t0.Add(-30 * time.Minute),
	}
	f := archiveFixture(t, a)

	tl := f.timeline(t, "/admin/customers/cust-old/timeline?window=336h")
	if len(tl.Messages) != 1 || tl.Messages[0].UpstreamMsgID != "old-1" || !tl.Messages[0].Received[0].Archived ||
		!tl.Complete || tl.Sources["archive"] != "ok" || tl.Topic != nil ||
		!strings.Contains(tl.Summary, "the whole 336h0m0s window read from the archive") {
		t.Fatalf("ten-day-old message: %+v", tl)
	}
	// Past the topic-scan bound, up to the archive's retention.
	f.timeline(t, "/admin/customers/cust-old/timeline?window=720h")

	a.behindBy = 3
	tl = f.timeline(t, "/admin/customers/cust-lag/timeline")
	if len(tl.Messages) != 2 || !tl.Complete || tl.Topic == nil || !strings.Contains(strings.Join(tl.Notes, ";"), "archive behind by 3 record(s) on partition 2") {
		t.Fatalf("lagging archive: %+v", tl)
	}

	// The tail's read cut short: not the whole window, and a user with
	// nothing found is not "nothing known".
	a.incomplete = "the read stopped at offset 80"
	tl = f.timeline(t, "/admin/customers/cust-none/timeline")
	if tl.Complete || tl.Known || strings.HasPrefix(tl.Summary, "nothing known") ||
		!strings.HasPrefix(tl.Summary, "nothing found about user cust-none in what was read") {
		t.Fatalf("incomplete read: complete=%v summary %q", tl.Complete, tl.Summary)
	}
	a.incomplete, a.behindBy = "", 0
	tl = f.timeline(t, "/admin/customers/cust-none/timeline")
	if !tl.Complete || !strings.HasPrefix(tl.Summary, "nothing known about user cust-none") {
		t.Fatalf("whole window, nothing: complete=%v summary %q", tl.Complete, tl.Summary)
	}
	// More than max_records messages: the range read is stated.
	a.more = true
	tl = f.timeline(t, "/admin/customers/cust-old/timeline?window=336h")
	if tl.Complete || !strings.Contains(tl.Summary, "not the whole window") {
		t.Fatalf("truncated archive read: complete=%v summary %q", tl.Complete, tl.Summary)
	}
}
