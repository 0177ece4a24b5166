package dlq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
)

// parkedScore is the due score (year 9999) Rebuild gives the dead letters
// it indexes until it has read the rest of the topic: a letter's later
// retried, moved or purged event may come many records after it, and the
// running scheduler must not re-send it meanwhile.
const parkedScore int64 = 253402300799000

// parkedKey is the hash of the letters Rebuild parked: id → real due time.
func (x *Index) parkedKey() string { return x.key("rebuild", "parked") }

// indexParked is Index for Rebuild: a new entry that would be due is
// parked (not due) and its due time remembered for unpark.
func (x *Index) indexParked(ctx context.Context, dl *chatmsg.DeadLetter, at Coord) (IndexResult, error) {
	dl.EnsureID()
	if dl.Event != "" || dl.ManualReview || dl.NextRetryTime == nil {
		return x.Index(ctx, dl, at)
	}
	real := ms(*dl.NextRetryTime)
	// Remembered first: an entry parked without it would stay parked.
	if err := x.rdb.HSet(ctx, x.parkedKey(), dl.ID, real).Err(); err != nil {
		return 0, fmt.Errorf("dlq park %s: %w", dl.ID, err)
	}
	res, err := x.applyAt(ctx, dl, at, parkedScore)
	if err == nil {
		x.m.indexed.WithLabelValues(res.String()).Inc()
	}
	return res, err
}

// unpark makes every entry Rebuild parked due at its real time, now that
// the whole topic was read (each letter's final state is known).
func (x *Index) unpark(ctx context.Context) (int, error) {
	n := 0
	iter := x.rdb.HScan(ctx, x.parkedKey(), 0, "", 500).Iterator()
	for iter.Next(ctx) {
		id := iter.Val()
		if !iter.Next(ctx) {
			break
		}
		real := iter.Val()
		v, err := unparkScript.Run(ctx, x.rdb, []string{x.key("due")}, x.base, id, real, parkedScore).Int()
		if err != nil {
			return n, fmt.Errorf("dlq unpark %s: %w", id, err)
		}
		n += v
	}
	if err := iter.Err(); err != nil {
		return n, fmt.Errorf("dlq unpark: %w", err)
	}
	return n, x.rdb.Del(ctx, x.parkedKey()).Err()
}

// PurgeExpired deletes every entry whose TTL (per reason) ended by now.
// It walks each reason's set from its oldest failure up to now minus the
// reason's shortest TTL (dlq:ttl): no later entry can have expired.
func (x *Index) PurgeExpired(ctx context.Context, now time.Time) (int, error) {
	ttls, err := x.rdb.HGetAll(ctx, x.key("ttl")).Result()
	if err != nil {
		return 0, fmt.Errorf("dlq purge expired: %w", err)
	}
	n := 0
	for reason, v := range ttls {
		ttl, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			continue
		}
		upto := strconv.FormatInt(now.UnixMilli()-ttl, 10)
		var offset int64
		for {
			ids, err := x.rdb.ZRangeByScore(ctx, x.key("reason", reason), &redis.ZRangeBy{
				Min: "-inf", Max: upto, Offset: offset, Count: 500}).Result()
			if err != nil {
				return n, fmt.Errorf("dlq purge expired: %w", err)
			}
			if len(ids) == 0 {
				break
			}
			pipe := x.rdb.Pipeline()
			exps := make([]*redis.StringCmd, len(ids))
			for i, id := range ids {
				exps[i] = pipe.HGet(ctx, x.msgKey(id), "e")
			}
			if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
				return n, fmt.Errorf("dlq purge expired: %w", err)
			}
			for i, id := range ids {
				exp, err := exps[i].Int64()
				switch {
				case errors.Is(err, redis.Nil):
					// A member without entry: drop it.
					x.rdb.ZRem(ctx, x.key("reason", reason), id)
				case err == nil && exp > 0 && exp <= now.UnixMilli():
					ok, err := x.Delete(ctx, id)
					if err != nil {
						return n, err
					}
					if ok {
						n++
					}
				default:
					offset++ // kept: a longer TTL, or none
				}
			}
		}
	}
	return n, nil
}

// claimed is a due entry handed to the scheduler.
type claimed struct {
	id       string
	dl       *chatmsg.DeadLetter
	attempts int
	// batch is the operator batch that requeued the letter ("" for the
	// scheduler's own retries).
	batch string
}

// claim hands out up to limit entries due by now, leased for lease, with
// their whole letters read from the DLQ topic. A letter the topic no
// longer holds cannot be re-injected: it goes to review (counted and
// logged), as does a record that does not decode.
func (x *Index) claim(ctx context.Context, now time.Time, limit int, lease time.Duration) ([]claimed, error) {
	if x.letters == nil {
		return nil, errors.New("dlq claim: the index reads no letters (WithLetters)")
	}
	vals, err := claimScript.Run(ctx, x.rdb, []string{x.key("due")}, x.base, now.UnixMilli(), limit, lease.Milliseconds()).Slice()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("dlq claim: %w", err)
	}
	var ids []string
	var at []Coord
	var atts []int
	var batches []string
	for i := 0; i+3 < len(vals); i += 4 {
		id, _ := vals[i].(string)
		k, _ := vals[i+1].(string)
		att, _ := strconv.Atoi(fmt.Sprint(vals[i+2]))
		batch, _ := vals[i+3].(string)
		c, ok := parseCoord(k)
		if !ok {
			x.toReview(ctx, id, "undecodable DLQ index entry; moved to review", fmt.Errorf("bad coordinates %q", k))
			x.m.undecodableEntries.Inc()
			continue
		}
		ids, at, atts, batches = append(ids, id), append(at, c), append(atts, att), append(batches, batch)
	}
	if len(ids) == 0 {
		return nil, nil
	}
	dls, err := x.letters.Read(ctx, at)
	if err != nil {
		// Unread claims are due again when their lease ends.
		return nil, fmt.Errorf("dlq claim: read letters: %w", err)
	}
	out := make([]claimed, 0, len(ids))
	for i, dl := range dls {
		if dl == nil || dl.ID != ids[i] {
			x.m.gone.Inc()
			x.toReview(ctx, ids[i], "due dead letter no longer in the DLQ topic (retention shorter than its TTL); moved to review",
				fmt.Errorf("not at %s", at[i]))
			continue
		}
		out = append(out, claimed{id: ids[i], dl: dl, attempts: atts[i], batch: batches[i]})
	}
	return out, nil
}

// toReview moves an entry the scheduler cannot re-inject to review.
func (x *Index) toReview(ctx context.Context, id, msg string, why error) {
	x.log.Error(msg, zap.String("dlq_id", id), zap.Error(why))
	if _, err := x.move(ctx, id, StateReview, time.Time{}); err != nil && !errors.Is(err, ErrNotFound) {
		x.log.Warn("move DLQ index entry to review", zap.String("dlq_id", id), zap.Error(err))
	}
}

// reschedule moves a still-due entry to at.
func (x *Index) reschedule(ctx context.Context, id string, at time.Time) error {
	return rescheduleScript.Run(ctx, x.rdb, []string{x.key("due"), x.msgKey(id)}, x.base, id, at.UnixMilli(), "0").Err()
}

// release is reschedule for a letter that waits for something other than
// its turn (its user's block): the operator batch that requeued it no
// longer holds it, so a later retry — after an unblock — may select it
// again instead of finding it busy until the block's old end.
func (x *Index) release(ctx context.Context, id string, at time.Time) error {
	return rescheduleScript.Run(ctx, x.rdb, []string{x.key("due"), x.msgKey(id)}, x.base, id, at.UnixMilli(), "1").Err()
}
