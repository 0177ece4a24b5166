package dlq

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
)

// Filter selects entries. Empty fields match everything.
type Filter struct {
	User   string
	Reason string
	Review *bool  // true: only entries in review; false: only those not in review
	Cursor string // from a previous List; empty for the first page
	Limit  int    // page size; <= 0 means 100
}

// summary returns one entry's summary.
func (x *Index) summary(ctx context.Context, id string) (*Entry, error) {
	es, err := x.load(ctx, []string{id})
	if err != nil {
		return nil, err
	}
	if es[0] == nil {
		return nil, ErrNotFound
	}
	return es[0], nil
}

// Get returns one entry, whole when the index reads letters (WithLetters)
// and the DLQ topic still holds it; a letter the topic no longer holds, or
// a topic that does not answer, leaves the summary (logged).
func (x *Index) Get(ctx context.Context, id string) (*Entry, error) {
	e, err := x.summary(ctx, id)
	if err != nil || x.letters == nil {
		return e, err
	}
	if err := x.Whole(ctx, []*Entry{e}); err != nil {
		x.log.Warn("dead letter not read from the DLQ topic; showing its summary", zap.String("dlq_id", id), zap.Error(err))
	}
	return e, nil
}

// Whole replaces the summaries of es (from List) by their whole letters,
// read from the DLQ topic (WithLetters), keeping the index's state
// (attempts, due time). An entry the topic no longer holds keeps its
// summary (Whole false).
func (x *Index) Whole(ctx context.Context, es []*Entry) error {
	if x.letters == nil || len(es) == 0 {
		return nil
	}
	at := make([]Coord, len(es))
	for i, e := range es {
		at[i] = e.At
	}
	dls, err := x.letters.Read(ctx, at)
	if err != nil {
		return err
	}
	for i, dl := range dls {
		e := es[i]
		if dl == nil || dl.ID != e.ID {
			continue
		}
		dl.Attempts, dl.NextRetryTime = e.Attempts, e.NextRetryTime
		e.DeadLetter, e.Whole = dl, true
	}
	return nil
}

// Summaries returns the summaries of ids (as List has them) in one round
// trip; an ID the index does not hold yields nil.
func (x *Index) Summaries(ctx context.Context, ids []string) ([]*Entry, error) {
	return x.load(ctx, ids)
}

// load reads summaries in one script; a missing ID yields nil.
func (x *Index) load(ctx context.Context, ids []string) ([]*Entry, error) {
	out := make([]*Entry, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	args := make([]any, 0, len(ids)+1)
	args = append(args, x.base)
	for _, id := range ids {
		args = append(args, id)
	}
	vals, err := loadScript.Run(ctx, x.rdb, []string{x.key("due")}, args...).Slice()
	if err != nil {
		return nil, fmt.Errorf("dlq index load: %w", err)
	}
	for i, v := range vals {
		h, ok := v.([]any)
		if !ok || len(h) < 16 || i >= len(out) {
			continue
		}
		f := func(j int) string { s, _ := h[j].(string); return s }
		num := func(j int) int64 { n, _ := strconv.ParseInt(f(j), 10, 64); return n }
		dl := &chatmsg.DeadLetter{ID: ids[i], Reason: Reason(f(0)), UserID: f(1)}
		e := &Entry{DeadLetter: dl, State: f(2), Preview: f(7)}
		if n := num(3); n > 0 {
			dl.ExpiresAt = time.UnixMilli(n).UTC()
		}
		dl.Attempts = int(num(4))
		e.At, _ = parseCoord(f(5))
		if c, ok := parseCoord(f(6)); ok {
			dl.SourcePartition, dl.SourceOffset = c.Partition, c.Offset
		}
		dl.RetryCount = int(num(8))
		if n := num(9); n > 0 {
			t := time.UnixMilli(n).UTC()
			e.RetriedAt = &t
		}
		e.Failures = max(int(num(10)), 1)
		if n := num(11); n > 0 {
			t := time.UnixMilli(n).UTC()
			e.FirstFailure = &t
		}
		if n := num(12); n > 0 {
			e.claimedUntil = time.UnixMilli(n).UTC()
		}
		e.Batch = f(13)
		if n, err := strconv.ParseFloat(f(14), 64); err == nil && n > 0 {
			dl.FailureTime = time.UnixMilli(int64(n)).UTC()
			if e.FirstFailure == nil {
				t := dl.FailureTime
				e.FirstFailure = &t
			}
		}
		if n, err := strconv.ParseFloat(f(15), 64); err == nil && n > 0 && e.State == StateDue {
			t := time.UnixMilli(int64(n)).UTC()
			dl.NextRetryTime = &t
		}
		dl.Recoverable = IsRecoverable(dl.Reason)
		dl.ManualReview = e.State == StateReview
		out[i] = e
	}
	return out, nil
}

// Stats returns the counters and set sizes.
func (x *Index) Stats(ctx context.Context) (Stats, error) {
	pipe := x.rdb.Pipeline()
	h := pipe.HGetAll(ctx, x.key("stats"))
	due := pipe.ZCard(ctx, x.key("due"))
	dueNow := pipe.ZCount(ctx, x.key("due"), "-inf", strconv.FormatInt(x.clock.Now().UnixMilli(), 10))
	review := pipe.ZCard(ctx, x.key("review"))
	if _, err := pipe.Exec(ctx); err != nil {
		return Stats{}, fmt.Errorf("dlq stats: %w", err)
	}
	s := Stats{ByReason: map[string]int64{}, Due: due.Val(), DueNow: dueNow.Val(), Review: review.Val()}
	for k, v := range h.Val() {
		n, _ := strconv.ParseInt(v, 10, 64)
		switch {
		case k == "total":
			s.Total = n
		case k == "retried":
			s.Retried = n
		case k == "done":
			s.Done = n
		case strings.HasPrefix(k, "reason:") && n != 0:
			s.ByReason[strings.TrimPrefix(k, "reason:")] = n
		}
	}
	return s, nil
}

// List returns one page of entry summaries matching f, newest failure
// first, and the cursor of the next page ("" when there is none). Without
// a user, reason or review filter it merges the reasons' sets.
func (x *Index) List(ctx context.Context, f Filter) ([]*Entry, string, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	var bases []string
	switch {
	case f.User != "":
		bases = []string{x.key("user", f.User)}
	case f.Reason != "":
		bases = []string{x.key("reason", f.Reason)}
	case f.Review != nil && *f.Review:
		bases = []string{x.key("review")}
	default:
		reasons, err := x.reasons(ctx)
		if err != nil {
			return nil, "", err
		}
		for _, r := range reasons {
			bases = append(bases, x.key("reason", r))
		}
	}
	cur := listPos{score: math.MaxInt64}
	if f.Cursor != "" {
		s, id, ok := strings.Cut(f.Cursor, ":")
		n, err := strconv.ParseInt(s, 10, 64)
		if !ok || err != nil || id == "" {
			return nil, "", fmt.Errorf("dlq list: %w %q", ErrBadCursor, f.Cursor)
		}
		cur = listPos{score: n, id: id}
	}
	batch := int64(max(limit, 50))
	its := make([]*zsetIter, len(bases))
	for i, b := range bases {
		its[i] = &zsetIter{key: b, after: cur, batch: batch}
	}
	var out []*Entry
	for {
		// The next batch in merged order: up to batch heads.
		var page []listPos
		for int64(len(page)) < batch {
			var best *zsetIter
			for _, it := range its {
				if err := it.fill(ctx, x.rdb); err != nil {
					return nil, "", fmt.Errorf("dlq list: %w", err)
				}
				if len(it.buf) > 0 && (best == nil || it.buf[0].before(best.buf[0])) {
					best = it
				}
			}
			if best == nil {
				break
			}
			page = append(page, best.buf[0])
			best.buf = best.buf[1:]
		}
		if len(page) == 0 {
			return out, "", nil
		}
		ids := make([]string, len(page))
		for i, p := range page {
			ids[i] = p.id
		}
		es, err := x.load(ctx, ids)
		if err != nil {
			return nil, "", err
		}
		for i, e := range es {
			if e == nil || !f.match(e) {
				continue
			}
			out = append(out, e)
			if len(out) == limit {
				return out, fmt.Sprintf("%d:%s", page[i].score, page[i].id), nil
			}
		}
	}
}

// reasons lists the reasons the index has entries of.
func (x *Index) reasons(ctx context.Context) ([]string, error) {
	h, err := x.rdb.HGetAll(ctx, x.key("stats")).Result()
	if err != nil {
		return nil, fmt.Errorf("dlq stats: %w", err)
	}
	var rs []string
	for k, v := range h {
		if r, ok := strings.CutPrefix(k, "reason:"); ok && v != "0" {
			rs = append(rs, r)
		}
	}
	slices.Sort(rs)
	return rs, nil
}

// listPos is a place in List's order: failure time descending, then ID
// descending (how ZREVRANGEBYSCORE orders equal scores).
type listPos struct {
	score int64
	id    string
}

func (p listPos) before(q listPos) bool {
	return p.score > q.score || (p.score == q.score && p.id > q.id)
}

// zsetIter walks one sorted set in List's order, after a position.
type zsetIter struct {
	key    string
	after  listPos
	batch  int64
	offset int64
	buf    []listPos
	done   bool
}

// fill reads the next batch when the buffer is empty.
func (it *zsetIter) fill(ctx context.Context, rdb redis.UniversalClient) error {
	for len(it.buf) == 0 && !it.done {
		max := "+inf"
		if it.after.score != math.MaxInt64 {
			max = strconv.FormatInt(it.after.score, 10)
		}
		zs, err := rdb.ZRevRangeByScoreWithScores(ctx, it.key, &redis.ZRangeBy{
			Max: max, Min: "-inf", Offset: it.offset, Count: it.batch}).Result()
		if err != nil {
			return err
		}
		it.offset += int64(len(zs))
		it.done = int64(len(zs)) < it.batch
		for _, z := range zs {
			p := listPos{score: int64(z.Score), id: z.Member.(string)}
			if it.after.before(p) {
				it.buf = append(it.buf, p)
			}
		}
	}
	return nil
}

func (f Filter) match(e *Entry) bool {
	if f.User != "" && e.UserID != f.User {
		return false
	}
	if f.Reason != "" && string(e.Reason) != f.Reason {
		return false
	}
	if f.Review != nil && (e.State == StateReview) != *f.Review {
		return false
	}
	return true
}

// Export streams every entry matching f (Cursor and Limit ignored) to fn,
// each whole when the index reads letters (WithLetters) and the DLQ topic
// still holds it; an error from fn stops it and is returned.
func (x *Index) Export(ctx context.Context, f Filter, fn func(*Entry) error) error {
	return x.each(ctx, f, func(es []*Entry) error {
		if err := x.Whole(ctx, es); err != nil {
			return fmt.Errorf("dlq export: read letters: %w", err)
		}
		for _, e := range es {
			if err := fn(e); err != nil {
				return err
			}
		}
		return nil
	})
}

func (x *Index) each(ctx context.Context, f Filter, fn func([]*Entry) error) error {
	f.Cursor, f.Limit = "", 500
	for {
		es, next, err := x.List(ctx, f)
		if err != nil {
			return err
		}
		if err := fn(es); err != nil {
			return err
		}
		if next == "" {
			return nil
		}
		f.Cursor = next
	}
}

// Size is the number of entries in the index.
func (x *Index) Size(ctx context.Context) (int64, error) {
	n, err := x.rdb.HGet(ctx, x.key("stats"), "total").Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	return n, err
}

// MaxEntries is the bound set by WithMaxEntries (0: none).
func (x *Index) MaxEntries() int64 { return x.max }

// Room reports whether a new entry fits under WithMaxEntries.
func (x *Index) Room(ctx context.Context) (bool, error) {
	if x.max <= 0 {
		return true, nil
	}
	n, err := x.Size(ctx)
	return n < x.max, err
}

// reviewCount is the manual-review backlog.
func (x *Index) reviewCount(ctx context.Context) (int64, error) {
	return x.rdb.ZCard(ctx, x.key("review")).Result()
}

// Inflow counts, per reason, the entries whose last failure lies in each
// of n buckets of step ending at to (oldest first): the DLQ's inflow by
// reason for the console's overview. A letter that failed again after a
// retry counts at its last failure; purged and expired letters are gone.
// One pipelined ZCOUNT per reason and bucket.
func (x *Index) Inflow(ctx context.Context, to time.Time, step time.Duration, n int) (map[string][]int64, error) {
	if n <= 0 || step <= 0 {
		return nil, fmt.Errorf("dlq inflow: %d buckets of %s", n, step)
	}
	reasons, err := x.reasons(ctx)
	if err != nil {
		return nil, err
	}
	from := to.Add(-time.Duration(n) * step)
	pipe := x.rdb.Pipeline()
	cmds := make(map[string][]*redis.IntCmd, len(reasons))
	for _, r := range reasons {
		for i := range n {
			lo := from.Add(time.Duration(i) * step).UnixMilli()
			hi := from.Add(time.Duration(i+1) * step).UnixMilli()
			cmds[r] = append(cmds[r], pipe.ZCount(ctx, x.key("reason", r), strconv.FormatInt(lo, 10), "("+strconv.FormatInt(hi, 10)))
		}
	}
	if len(reasons) > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, fmt.Errorf("dlq inflow: %w", err)
		}
	}
	out := make(map[string][]int64, len(reasons))
	for r, cs := range cmds {
		counts := make([]int64, n)
		for i, c := range cs {
			counts[i] = c.Val()
		}
		out[r] = counts
	}
	return out, nil
}
