package dlq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/redisconn"
)

// IndexResult says what Index did with a record.
type IndexResult int

// Index results.
const (
	IndexFull      IndexResult = -2 // a new entry would pass dlq_index.max_entries: not indexed
	IndexExpired   IndexResult = -1 // past its TTL: not indexed
	IndexDuplicate IndexResult = 0  // ID already indexed (or stale event): nothing changed
	IndexNew       IndexResult = 1  // a new entry
	IndexEvent     IndexResult = 2  // an event record changed an entry
	IndexUpdated   IndexResult = 3  // a later failure of a letter's message updated the letter
)

// Index adds dl, the DLQ record at `at`, to the index, placed in review
// when dl.ManualReview is set and in due at dl.NextRetryTime otherwise.
// Indexing an ID that is already there changes nothing, so the DLQ topic
// can be re-read at will. An EventRetried record marks the entry as
// re-injected instead, an EventMoved record moves it to review or due, and
// an EventPurged record deletes it. A new entry past WithMaxEntries is
// refused with IndexFull.
func (x *Index) Index(ctx context.Context, dl *chatmsg.DeadLetter, at Coord) (IndexResult, error) {
	dl.EnsureID()
	res, err := x.applyAt(ctx, dl, at, 0)
	if err == nil {
		x.m.indexed.WithLabelValues(res.String()).Inc()
	}
	return res, err
}

// applyAt indexes dl with the due score of a new due entry set to dueAt
// (0: its NextRetryTime).
func (x *Index) applyAt(ctx context.Context, dl *chatmsg.DeadLetter, at Coord, dueAt int64) (IndexResult, error) {
	switch dl.Event {
	case EventMoved:
		state, at := StateReview, time.Time{}
		if !dl.ManualReview && dl.NextRetryTime != nil {
			state, at = StateDue, *dl.NextRetryTime
		}
		_, applied, err := x.moveIf(ctx, dl.ID, state, at, dl.AttemptsSeen)
		if errors.Is(err, ErrNotFound) || (err == nil && !applied) {
			return IndexDuplicate, nil // purged or expired since, or re-injected since the move
		}
		return IndexEvent, err
	case EventPurged:
		ok, err := x.Delete(ctx, dl.ID)
		if !ok {
			return IndexDuplicate, err // already gone: the live index, where the purge happened
		}
		return IndexEvent, err
	}
	state := StateDue
	var next int64
	if dl.ManualReview || dl.NextRetryTime == nil {
		state = StateReview
	} else {
		next = ms(*dl.NextRetryTime)
		if dueAt != 0 {
			next = dueAt
		}
	}
	keys := []string{x.msgKey(dl.ID), x.key("user", dl.UserID), x.key("reason", string(dl.Reason)),
		x.key("due"), x.key("review"), x.key("stats"), x.key("ttl"), x.key("retried")}
	src := strconv.FormatInt(int64(dl.SourcePartition), 10) + ":" + strconv.FormatInt(dl.SourceOffset, 10)
	n, err := indexScript.Run(ctx, x.rdb, keys, dl.ID, string(dl.Reason), dl.UserID, state,
		next, ms(dl.FailureTime), ms(dl.ExpiresAt), x.clock.Now().UnixMilli(), dl.Event, dl.Attempts,
		at.String(), src, Preview(dl), dl.RetryCount, x.max).Int()
	if err != nil {
		return 0, fmt.Errorf("dlq index %s: %w", dl.ID, err)
	}
	return IndexResult(n), nil
}

func (r IndexResult) String() string {
	switch r {
	case IndexExpired:
		return "expired"
	case IndexNew:
		return "new"
	case IndexEvent:
		return "event"
	case IndexFull:
		return "full"
	case IndexUpdated:
		return "updated"
	default:
		return "duplicate"
	}
}

// MarkRetried records that the entry was re-injected for the attempts-th
// time. Applying the same attempt twice is a no-op.
func (x *Index) MarkRetried(ctx context.Context, id string, attempts int) (bool, error) {
	res, err := x.Index(ctx, &chatmsg.DeadLetter{ID: id, Event: EventRetried, Attempts: attempts}, Coord{})
	return res == IndexEvent, err
}

// Requeue schedules the entry for a retry at `at` (from review or from
// retried): the operator's manual retry. With an event sink the move is
// recorded in the DLQ topic (EventMoved).
func (x *Index) Requeue(ctx context.Context, id string, at time.Time) error {
	attempts, err := x.move(ctx, id, StateDue, at)
	if err != nil {
		return err
	}
	x.recordMove(ctx, id, false, at, attempts)
	return nil
}

// RequeueInOrder is Requeue for a batch (an operator's batch retry): the
// entries are due from at on, one millisecond apart in their source order
// (SortBySource), so the scheduler re-injects each user's letters in the
// order the user's messages had — not in the order of their IDs, which is
// what equal due times gave. It returns how many were requeued.
func (x *Index) RequeueInOrder(ctx context.Context, es []*Entry, at time.Time) (int, error) {
	es = slices.Clone(es)
	SortBySource(es, func(e *Entry) *chatmsg.DeadLetter { return e.DeadLetter })
	n := 0
	for i, e := range es {
		err := x.Requeue(ctx, e.ID, at.Add(time.Duration(i)*time.Millisecond))
		if errors.Is(err, ErrNotFound) {
			continue // purged meanwhile
		}
		if err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// SortBySource sorts letters into the order their messages had: source
// topic, partition and offset, then failure time. A user's messages are all
// in one partition, so this is each user's order.
func SortBySource[T any](ts []T, dl func(T) *chatmsg.DeadLetter) {
	slices.SortStableFunc(ts, func(a, b T) int {
		x, y := dl(a), dl(b)
		return cmp.Or(cmp.Compare(x.SourceTopic, y.SourceTopic), cmp.Compare(x.SourcePartition, y.SourcePartition),
			cmp.Compare(x.SourceOffset, y.SourceOffset), x.FailureTime.Compare(y.FailureTime))
	})
}

// MoveToReview takes the entry out of due and into manual review. With an
// event sink the move is recorded in the DLQ topic (EventMoved).
func (x *Index) MoveToReview(ctx context.Context, id string) error {
	attempts, err := x.move(ctx, id, StateReview, time.Time{})
	if err != nil {
		return err
	}
	x.recordMove(ctx, id, true, time.Time{}, attempts)
	return nil
}

// recordMove writes the EventMoved record of a move, keyed like the dead
// letter (read back for that) so it follows it in the same partition.
func (x *Index) recordMove(ctx context.Context, id string, review bool, at time.Time, attempts int) {
	if x.events == nil {
		return
	}
	e, err := x.summary(ctx, id)
	if err == nil {
		err = x.eventKey(ctx, e)
	}
	if err != nil {
		x.log.Warn("moved event not recorded; a rebuild would put this dead letter back where it was",
			zap.String("dlq_id", id), zap.Error(err))
		return
	}
	seen := attempts // as the move found them, not as they are now
	ev := &chatmsg.DeadLetter{ID: id, Event: EventMoved, Reason: e.Reason, UserID: e.UserID,
		OriginalKey: e.OriginalKey, FailureTime: x.clock.Now(), ManualReview: review, AttemptsSeen: &seen}
	if !review {
		ev.NextRetryTime = &at
	}
	x.sendEvent(ev)
}

// move moves the entry and returns its attempts at the move.
func (x *Index) move(ctx context.Context, id, state string, at time.Time) (int, error) {
	attempts, _, err := x.moveIf(ctx, id, state, at, nil)
	return attempts, err
}

// moveIf is move, not applied (false) when seen is set and the entry has
// been re-injected more often than that since.
func (x *Index) moveIf(ctx context.Context, id, state string, at time.Time, seen *int) (attempts int, applied bool, err error) {
	check := -1
	if seen != nil {
		check = *seen
	}
	n, err := moveScript.Run(ctx, x.rdb, x.entryKeys(id), x.base, id, state, ms(at), check).Int()
	if err != nil {
		return 0, false, fmt.Errorf("dlq index move %s: %w", id, err)
	}
	switch {
	case n == 0:
		return 0, false, ErrNotFound
	case n < 0:
		return 0, false, nil
	}
	return n - 1, true, nil
}

// Delete removes one entry from every set; false if it was not there.
func (x *Index) Delete(ctx context.Context, id string) (bool, error) {
	n, err := deleteScript.Run(ctx, x.rdb, x.entryKeys(id), x.base, id).Int()
	if err != nil {
		return false, fmt.Errorf("dlq index delete %s: %w", id, err)
	}
	return n == 1, nil
}

// eventKey makes sure e can key its event records like the letter (Key):
// by user, or, for a letter without one, by the original key, which only
// the whole letter has.
func (x *Index) eventKey(ctx context.Context, e *Entry) error {
	if e.UserID != "" || e.Whole || x.letters == nil {
		return nil
	}
	return x.Whole(ctx, []*Entry{e})
}

// errPurgeLimit ends Purge's walk once f.Limit entries are deleted.
var errPurgeLimit = errors.New("purge limit reached")

// Purge deletes the entries matching f, newest first, at most f.Limit of
// them when it is set (Cursor ignored). With an
// event sink (WithEventSink, normally the DLQ Producer) each deletion is
// recorded in the DLQ topic as an EventPurged record, keyed like the dead
// letter so it follows it in the same partition, and a Rebuild deletes the
// entry again; without one (or when the record cannot be written, which is
// logged) a Rebuild brings back those not yet expired.
func (x *Index) Purge(ctx context.Context, f Filter) (int, error) {
	n, limit := 0, f.Limit
	err := x.each(ctx, f, func(es []*Entry) error {
		if limit > 0 {
			es = es[:min(len(es), limit-n)]
		}
		gone, err := x.PurgeEntries(ctx, es)
		for _, g := range gone {
			if g {
				n++
			}
		}
		if err == nil && limit > 0 && n >= limit {
			return errPurgeLimit
		}
		return err
	})
	if errors.Is(err, errPurgeLimit) {
		err = nil
	}
	return n, err
}

// PurgeEntries deletes es (summaries from List or Summaries; nil ones are
// skipped) as Purge does, recording each purge, and reports which it
// deleted (false: not there any more).
func (x *Index) PurgeEntries(ctx context.Context, es []*Entry) ([]bool, error) {
	out := make([]bool, len(es))
	for i, e := range es {
		if e == nil {
			continue
		}
		if x.events != nil {
			if err := x.eventKey(ctx, e); err != nil {
				x.log.Warn("purged event keyed without the letter's original key", zap.String("dlq_id", e.ID), zap.Error(err))
			}
		}
		ok, err := x.Delete(ctx, e.ID)
		if err != nil {
			return out, err
		}
		if ok {
			out[i] = true
			x.recordPurge(e.DeadLetter)
		}
	}
	return out, nil
}

// recordPurge writes the EventPurged record of a purged entry.
func (x *Index) recordPurge(dl *chatmsg.DeadLetter) {
	if x.events == nil {
		return
	}
	x.sendEvent(&chatmsg.DeadLetter{ID: dl.ID, Event: EventPurged, Reason: dl.Reason, UserID: dl.UserID,
		OriginalKey: dl.OriginalKey, FailureTime: x.clock.Now()})
}

// sendEvent writes an event record through the event sink; a failure is
// logged (the index already changed; only a later rebuild would differ).
func (x *Index) sendEvent(ev *chatmsg.DeadLetter) {
	x.events.Send(ev, func(err error) {
		if err != nil {
			x.log.Warn("DLQ event not recorded; a rebuild would not reproduce it",
				zap.String("dlq_id", ev.ID), zap.String("event", ev.Event), zap.Error(err))
		}
	})
}

// Reset deletes the whole index (before a Rebuild).
func (x *Index) Reset(ctx context.Context) error {
	// One slot on a Cluster, so a batch of keys is one DEL there too.
	err := redisconn.ScanKeys(ctx, x.rdb, x.base+"*", 1000, func(keys []string) error {
		return x.rdb.Del(ctx, keys...).Err()
	})
	if err != nil {
		return fmt.Errorf("dlq reset: %w", err)
	}
	return nil
}
