package console

import (
	"context"
	"fmt"
	"time"
)

// ArchiveSource is a CustomerSource that can also read the conversation
// archive (PostgreSQL): the timeline then answers for any window up to
// the archive's retention, and scans the main topic only for what the
// archiver has not reached yet.
type ArchiveSource interface {
	// ArchiveRetention is how far back the archive answers; 0 when no
	// archive is configured (the timeline scans the main topic).
	ArchiveRetention() time.Duration
	// ArchivedRecords reads the user's messages sent in [since, until),
	// the newest max at most, and how far the archiver has come on the
	// user's partition.
	ArchivedRecords(ctx context.Context, user string, since, until time.Time, max int) (ArchiveRead, error)
}

// ArchiveRead is what the timeline read of the archive.
type ArchiveRead struct {
	Retention time.Duration `json:"-"`
	// From and To are the send times read ([From, To)); From is later
	// than asked when the window held more than max_records messages.
	From      time.Time `json:"from"`
	To        time.Time `json:"to"`
	Truncated bool      `json:"truncated"`
	// Partition is the user's partition of the main topic;
	// ArchivedOffset the first of its offsets not archived yet, and
	// ArchivedUpTo the time of the last record archived.
	Partition      int32     `json:"partition"`
	ArchivedOffset int64     `json:"archived_offset"`
	ArchivedUpTo   time.Time `json:"archived_up_to"`
	// BehindBy is how many records of the partition the archiver has not
	// written yet ("archive behind by N").
	BehindBy int64         `json:"behind_by"`
	Records  []TopicRecord `json:"-"`
}

// readArchive fills tl's records from the archive, and the archiver's
// lag from the main topic's newest records. It returns the records as a
// scan, and whether the whole window was read; ok false when the archive
// is off or failed (the caller scans the main topic).
func (s *timelines) readArchive(ctx context.Context, tl *Timeline, src CustomerSource, max int) (scan *TopicScan, complete, ok bool) {
	as, _ := src.(ArchiveSource)
	if as == nil || as.ArchiveRetention() <= 0 {
		return nil, false, false
	}
	// Send times may run a little ahead of our clock.
	ar, err := as.ArchivedRecords(ctx, tl.User, tl.Since, tl.Time.Add(24*time.Hour), max)
	if err != nil {
		s.log.Warn("timeline: archive not read: " + err.Error())
		tl.Sources["archive"] = "unavailable"
		return nil, false, false
	}
	tl.Sources["archive"] = "ok"
	tl.Archive = &ar
	scan = &TopicScan{Partition: ar.Partition, Records: ar.Records}
	complete = !ar.Truncated && !tl.Since.Before(tl.Time.Add(-ar.Retention))
	if ar.Truncated {
		tl.Notes = append(tl.Notes, fmt.Sprintf("archive: only the newest %d messages of the window were read (max_records): those sent since %s",
			max, ar.From.UTC().Format(time.RFC3339)))
	}
	if tl.Since.Before(tl.Time.Add(-ar.Retention)) {
		tl.Notes = append(tl.Notes, fmt.Sprintf("archive: messages are kept %s (archive.retention); older ones are gone", ar.Retention))
	}
	if ar.BehindBy > 0 {
		// The archiver has not reached the newest records: they are read
		// from the main topic, from the last archived record's time on.
		from := ar.ArchivedUpTo
		if from.Before(tl.Since) {
			from = tl.Since // nothing of the window archived yet (or never: zero)
		}
		tail, err := src.UserRecords(ctx, tl.User, from, max)
		switch {
		case err != nil:
			complete = false
			tl.Sources["main_topic"] = "unavailable"
			tl.Notes = append(tl.Notes, fmt.Sprintf("archive behind by %d record(s) on partition %d (archived up to %s), and the main topic could not be read: the newest messages may be missing",
				ar.BehindBy, ar.Partition, ar.ArchivedUpTo.UTC().Format(time.RFC3339)))
		default:
			tl.Sources["main_topic"] = "ok"
			tail.Records = mergeRecords(scan.Records, tail.Records)
			scan.Topic = tail.Topic
			scan.Records = tail.Records
			tl.Notes = append(tl.Notes, fmt.Sprintf("archive behind by %d record(s) on partition %d (archived up to %s): the newer ones were read from the main topic",
				ar.BehindBy, ar.Partition, ar.ArchivedUpTo.UTC().Format(time.RFC3339)))
			if tail.Truncated || tail.Incomplete != "" {
				complete = false
				tl.Notes = append(tl.Notes, "main topic: the records since the archive's last were not all read: the newest messages may be missing")
			}
		}
	}
	return scan, complete, true
}

// mergeRecords adds to archived the tail's records it does not hold
// (same partition and offset).
func mergeRecords(archived, tail []TopicRecord) []TopicRecord {
	seen := make(map[sourceAt]bool, len(archived))
	for _, r := range archived {
		seen[sourceAt{r.Partition, r.Offset}] = true
	}
	out := archived
	for _, r := range tail {
		if !seen[sourceAt{r.Partition, r.Offset}] {
			out = append(out, r)
		}
	}
	return out
}

// maxWindow is the longest window the timeline reads: the archive's
// retention when there is one, else timelineMaxWindow.
func (s *timelines) maxWindow() time.Duration {
	if as, ok := s.cfg.Pipeline.(ArchiveSource); ok {
		if r := as.ArchiveRetention(); r > timelineMaxWindow {
			return r
		}
	}
	return timelineMaxWindow
}

// readRange says what range of time the timeline's messages were read
// for: the archive's, else the main topic's.
func readRange(tl *Timeline) string {
	switch {
	case tl.Archive != nil:
		from := tl.Since
		if tl.Archive.Truncated {
			from = tl.Archive.From
		}
		s := fmt.Sprintf("the archive (messages sent since %s)", from.UTC().Format(time.RFC3339))
		if tl.Archive.BehindBy > 0 && tl.Topic != nil {
			s += fmt.Sprintf(" and the main topic after it (partition %d)", tl.Topic.Partition)
		}
		return s
	case tl.Topic != nil:
		from := tl.Since
		if (tl.Topic.Truncated || tl.Topic.Expired) && !tl.Topic.FromTime.IsZero() {
			from = tl.Topic.FromTime
		}
		to := "now"
		if tl.Topic.Incomplete != "" {
			to = fmt.Sprintf("offset %d", tl.Topic.To)
		}
		return fmt.Sprintf("the main topic (partition %d, records from %s to %s)", tl.Topic.Partition,
			from.UTC().Format(time.RFC3339), to)
	}
	return ""
}
