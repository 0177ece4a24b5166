package dlq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// Index states of an entry.
const (
	StateDue     = "due"     // in dlq:due, the scheduler re-injects it at its score
	StateReview  = "review"  // in dlq:review, waits for an operator
	StateRetried = "retried" // re-injected into the main topic; kept for history until it expires
)

// ErrNotFound is returned by Get, Requeue and MoveToReview for an ID the
// index does not hold.
var ErrNotFound = errors.New("dlq: entry not found")

// ErrBadCursor is returned by List for a cursor it did not issue: the
// caller's mistake, not a store failure.
var ErrBadCursor = errors.New("dlq: bad cursor")

// Index is the Redis view of the DLQ topic, which stays the source of
// truth (Rebuild recreates the view from it). Every
// write of an entry is one Lua script, so an entry, its sets and the
// counters never disagree, and indexing the same ID twice is a no-op.
//
// The scripts that take an ID alone derive the user and reason keys from
// the stored entry; that is fine for a single node or Sentinel (never
// Redis Cluster).
type Index struct {
	rdb    redis.UniversalClient
	prefix string
	clock  Clock
	events EventSink // records purges in the DLQ topic; may be nil
	log    *zap.Logger
	m      indexMetrics
}

type indexMetrics struct {
	indexed            *prometheus.CounterVec
	undecodableEntries prometheus.Counter
}

// Stats summarises the index.
type Stats struct {
	Total    int64            `json:"total"`     // entries in the index
	ByReason map[string]int64 `json:"by_reason"` // entries by failure reason
	Due      int64            `json:"due"`       // scheduled for a retry
	DueNow   int64            `json:"due_now"`   // of which due by now
	Review   int64            `json:"review"`    // waiting for manual review
	Retried  int64            `json:"retried"`   // re-injected into the main topic
}

// Entry is an indexed dead letter with its index state.
type Entry struct {
	*DeadLetterMessage
	State     string     `json:"state"`
	RetriedAt *time.Time `json:"retried_at,omitempty"`
}

// Filter selects entries. Empty fields match everything.
type Filter struct {
	User   string
	Reason string
	Review *bool  // true: only entries in review; false: only those not in review
	Cursor string // from a previous List; empty for the first page
	Limit  int    // page size; <= 0 means 100
}

// NewIndex returns the index under prefix (e.g. "kfpipe:").
func NewIndex(rdb redis.UniversalClient, prefix string, opts ...Option) *Index {
	o := buildOptions(opts)
	return &Index{rdb: rdb, prefix: prefix, clock: o.clock, events: o.events, log: o.log, m: indexMetrics{
		indexed: register(o.reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kfpipe_dlq_index_total", Help: "DLQ records applied to the Redis index, by result (new, duplicate, expired, event)."},
			[]string{"result"})),
		undecodableEntries: register(o.reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kfpipe_dlq_index_undecodable_entries_total",
			Help: "Index entries the scheduler could not decode; each is moved to review instead of failing the scan."})),
	}}
}

func (x *Index) key(parts ...string) string { return x.prefix + "dlq:" + strings.Join(parts, ":") }
func (x *Index) msgKey(id string) string    { return x.key("msg", id) }

// indexScript applies one DLQ record. Returns 1 new entry, 0 duplicate or
// stale event, -1 already expired, 2 event applied.
var indexScript = redis.NewScript(`
local id = ARGV[1]
if ARGV[10] == 'retried' then
  if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
  local a = tonumber(redis.call('HGET', KEYS[1], 'attempts') or '0')
  local n = tonumber(ARGV[11])
  if n <= a then return 0 end
  local st = redis.call('HGET', KEYS[1], 'state')
  redis.call('HSET', KEYS[1], 'attempts', n, 'state', 'retried', 'retried_at', ARGV[9])
  redis.call('ZREM', KEYS[5], id)
  redis.call('ZREM', KEYS[6], id)
  if st ~= 'retried' then redis.call('HINCRBY', KEYS[8], 'retried', 1) end
  return 2
end
local exp = tonumber(ARGV[8])
if exp > 0 and exp <= tonumber(ARGV[9]) then return -1 end
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'json', ARGV[2], 'reason', ARGV[3], 'user', ARGV[4], 'state', ARGV[5],
  'failed_at', ARGV[7], 'next_retry', ARGV[6], 'expires_at', ARGV[8], 'attempts', 0)
redis.call('ZADD', KEYS[2], ARGV[7], id)
if ARGV[4] ~= '' then redis.call('ZADD', KEYS[3], ARGV[7], id) end
redis.call('ZADD', KEYS[4], ARGV[7], id)
if ARGV[5] == 'due' then
  redis.call('ZADD', KEYS[5], ARGV[6], id)
else
  redis.call('ZADD', KEYS[6], ARGV[7], id)
end
if exp > 0 then redis.call('ZADD', KEYS[7], exp, id) end
redis.call('HINCRBY', KEYS[8], 'total', 1)
redis.call('HINCRBY', KEYS[8], 'reason:' .. ARGV[3], 1)
return 1
`)

// deleteScript removes one entry from every set. ARGV: prefix, id.
var deleteScript = redis.NewScript(`
local p, id = ARGV[1], ARGV[2]
local mk = p .. 'dlq:msg:' .. id
local h = redis.call('HMGET', mk, 'reason', 'user', 'state')
if not h[1] then return 0 end
redis.call('DEL', mk)
redis.call('ZREM', p .. 'dlq:all', id)
if h[2] and h[2] ~= '' then redis.call('ZREM', p .. 'dlq:user:' .. h[2], id) end
redis.call('ZREM', p .. 'dlq:reason:' .. h[1], id)
redis.call('ZREM', p .. 'dlq:due', id)
redis.call('ZREM', p .. 'dlq:review', id)
redis.call('ZREM', p .. 'dlq:expiry', id)
redis.call('HINCRBY', p .. 'dlq:stats', 'total', -1)
redis.call('HINCRBY', p .. 'dlq:stats', 'reason:' .. h[1], -1)
if h[3] == 'retried' then redis.call('HINCRBY', p .. 'dlq:stats', 'retried', -1) end
return 1
`)

// moveScript puts an entry into due (ARGV[3]='due', score ARGV[4]) or
// review (ARGV[3]='review'). ARGV: prefix, id, state, score_ms.
var moveScript = redis.NewScript(`
local p, id = ARGV[1], ARGV[2]
local mk = p .. 'dlq:msg:' .. id
local st = redis.call('HGET', mk, 'state')
if not st then return 0 end
if st == 'retried' then redis.call('HINCRBY', p .. 'dlq:stats', 'retried', -1) end
if ARGV[3] == 'due' then
  redis.call('ZREM', p .. 'dlq:review', id)
  redis.call('ZADD', p .. 'dlq:due', ARGV[4], id)
  redis.call('HSET', mk, 'state', 'due', 'next_retry', ARGV[4])
else
  redis.call('ZREM', p .. 'dlq:due', id)
  redis.call('ZADD', p .. 'dlq:review', redis.call('HGET', mk, 'failed_at'), id)
  redis.call('HSET', mk, 'state', 'review')
end
return 1
`)

// claimScript hands out due entries and pushes their score forward by a
// lease, so a second scheduler (or this one after a crash) takes them
// again only when the lease ran out without MarkRetried. ARGV: prefix,
// now_ms, limit, lease_ms. Returns id, json, attempts triples.
var claimScript = redis.NewScript(`
local p = ARGV[1]
local due = p .. 'dlq:due'
local ids = redis.call('ZRANGEBYSCORE', due, '-inf', ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
local until_ms = tonumber(ARGV[2]) + tonumber(ARGV[4])
local out = {}
for _, id in ipairs(ids) do
  local h = redis.call('HMGET', p .. 'dlq:msg:' .. id, 'json', 'attempts')
  if h[1] then
    redis.call('ZADD', due, 'XX', until_ms, id)
    table.insert(out, id)
    table.insert(out, h[1])
    table.insert(out, h[2] or '0')
  else
    redis.call('ZREM', due, id)
  end
end
return out
`)

// rescheduleScript moves a due entry to a later score, only if it is
// still due. ARGV: prefix, id, score_ms.
var rescheduleScript = redis.NewScript(`
local p, id = ARGV[1], ARGV[2]
if redis.call('ZADD', p .. 'dlq:due', 'XX', 'CH', ARGV[3], id) == 1 then
  redis.call('HSET', p .. 'dlq:msg:' .. id, 'next_retry', ARGV[3])
end
return 1
`)

func ms(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// IndexResult says what Index did with a record.
type IndexResult int

// Index results.
const (
	IndexExpired   IndexResult = -1 // past its TTL: not indexed
	IndexDuplicate IndexResult = 0  // ID already indexed (or stale event): nothing changed
	IndexNew       IndexResult = 1  // a new entry
	IndexEvent     IndexResult = 2  // an event record changed an entry
)

// Index adds dl to the index, placed in review when dl.ManualReview is set
// and in due at dl.NextRetryTime otherwise. Indexing an ID that is already
// there changes nothing, so the DLQ topic can be re-read at will. An
// EventRetried record marks the entry as re-injected instead, an
// EventMoved record moves it to review or due, and an EventPurged record
// deletes it.
func (x *Index) Index(ctx context.Context, dl *DeadLetterMessage) (IndexResult, error) {
	dl.EnsureID()
	res, err := x.apply(ctx, dl)
	if err == nil {
		x.m.indexed.WithLabelValues(res.String()).Inc()
	}
	return res, err
}

// parkedScore is the due score (year 9999) Rebuild gives the dead letters
// it indexes until it has read the rest of the topic: a letter's later
// retried, moved or purged event may come many records after it, and the
// running scheduler must not re-send it meanwhile.
const parkedScore int64 = 253402300799000

// parkedKey is the hash of the letters Rebuild parked: id → real due time.
func (x *Index) parkedKey() string { return x.key("rebuild", "parked") }

// indexParked is Index for Rebuild: a new entry that would be due is
// parked (not due) and its due time remembered for unpark.
func (x *Index) indexParked(ctx context.Context, dl *DeadLetterMessage) (IndexResult, error) {
	dl.EnsureID()
	if dl.Event != "" || dl.ManualReview || dl.NextRetryTime == nil {
		return x.Index(ctx, dl)
	}
	real := ms(*dl.NextRetryTime)
	// Remembered first: an entry parked without it would stay parked.
	if err := x.rdb.HSet(ctx, x.parkedKey(), dl.ID, real).Err(); err != nil {
		return 0, fmt.Errorf("dlq park %s: %w", dl.ID, err)
	}
	res, err := x.applyAt(ctx, dl, parkedScore)
	if err == nil {
		x.m.indexed.WithLabelValues(res.String()).Inc()
	}
	return res, err
}

// unparkScript makes a parked entry due at its real time, unless an event
// moved it meanwhile (its score is no longer the parked one). ARGV: prefix,
// id, real score, parked score.
var unparkScript = redis.NewScript(`
local p, id = ARGV[1], ARGV[2]
local sc = redis.call('ZSCORE', p .. 'dlq:due', id)
if sc and tonumber(sc) == tonumber(ARGV[4]) then
  redis.call('ZADD', p .. 'dlq:due', ARGV[3], id)
  redis.call('HSET', p .. 'dlq:msg:' .. id, 'next_retry', ARGV[3])
  return 1
end
return 0
`)

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
		v, err := unparkScript.Run(ctx, x.rdb, []string{x.key("due")}, x.prefix, id, real, parkedScore).Int()
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

// apply is Index without the metric.
func (x *Index) apply(ctx context.Context, dl *DeadLetterMessage) (IndexResult, error) {
	return x.applyAt(ctx, dl, 0)
}

// applyAt is apply with the due score of a new due entry set to dueAt
// (0: its NextRetryTime).
func (x *Index) applyAt(ctx context.Context, dl *DeadLetterMessage, dueAt int64) (IndexResult, error) {
	switch dl.Event {
	case EventMoved:
		state, at := StateReview, time.Time{}
		if !dl.ManualReview && dl.NextRetryTime != nil {
			state, at = StateDue, *dl.NextRetryTime
		}
		err := x.move(ctx, dl.ID, state, at)
		if errors.Is(err, ErrNotFound) {
			return IndexDuplicate, nil // purged or expired since
		}
		return IndexEvent, err
	case EventPurged:
		ok, err := x.Delete(ctx, dl.ID)
		if !ok {
			return IndexDuplicate, err // already gone: the live index, where the purge happened
		}
		return IndexEvent, err
	}
	body, err := Encode(dl)
	if err != nil {
		return 0, fmt.Errorf("dlq index: encode: %w", err)
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
	keys := []string{x.msgKey(dl.ID), x.key("all"), x.key("user", dl.UserID), x.key("reason", string(dl.Reason)),
		x.key("due"), x.key("review"), x.key("expiry"), x.key("stats")}
	n, err := indexScript.Run(ctx, x.rdb, keys, dl.ID, body, string(dl.Reason), dl.UserID, state,
		next, ms(dl.FailureTime), ms(dl.ExpiresAt), x.clock.Now().UnixMilli(), dl.Event, dl.Attempts).Int()
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
	default:
		return "duplicate"
	}
}

// MarkRetried records that the entry was re-injected for the attempts-th
// time. Applying the same attempt twice is a no-op.
func (x *Index) MarkRetried(ctx context.Context, id string, attempts int) (bool, error) {
	res, err := x.Index(ctx, &DeadLetterMessage{ID: id, Event: EventRetried, Attempts: attempts})
	return res == IndexEvent, err
}

// Requeue schedules the entry for a retry at `at` (from review or from
// retried): the operator's manual retry. With an event sink the move is
// recorded in the DLQ topic (EventMoved).
func (x *Index) Requeue(ctx context.Context, id string, at time.Time) error {
	if err := x.move(ctx, id, StateDue, at); err != nil {
		return err
	}
	x.recordMove(ctx, id, false, at)
	return nil
}

// RequeueInOrder is Requeue for a batch (an operator's batch retry): the
// entries are due from at on, one millisecond apart in their source order
// (SortBySource), so the scheduler re-injects each user's letters in the
// order the user's messages had — not in the order of their IDs, which is
// what equal due times gave. It returns how many were requeued.
func (x *Index) RequeueInOrder(ctx context.Context, es []*Entry, at time.Time) (int, error) {
	es = slices.Clone(es)
	SortBySource(es, func(e *Entry) *DeadLetterMessage { return e.DeadLetterMessage })
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
func SortBySource[T any](ts []T, dl func(T) *DeadLetterMessage) {
	slices.SortStableFunc(ts, func(a, b T) int {
		x, y := dl(a), dl(b)
		return cmp.Or(cmp.Compare(x.SourceTopic, y.SourceTopic), cmp.Compare(x.SourcePartition, y.SourcePartition),
			cmp.Compare(x.SourceOffset, y.SourceOffset), x.FailureTime.Compare(y.FailureTime))
	})
}

// MoveToReview takes the entry out of due and into manual review. With an
// event sink the move is recorded in the DLQ topic (EventMoved).
func (x *Index) MoveToReview(ctx context.Context, id string) error {
	if err := x.move(ctx, id, StateReview, time.Time{}); err != nil {
		return err
	}
	x.recordMove(ctx, id, true, time.Time{})
	return nil
}

// recordMove writes the EventMoved record of a move, keyed like the dead
// letter (read back for that) so it follows it in the same partition.
func (x *Index) recordMove(ctx context.Context, id string, review bool, at time.Time) {
	if x.events == nil {
		return
	}
	e, err := x.Get(ctx, id)
	if err != nil {
		x.log.Warn("moved event not recorded; a rebuild would put this dead letter back where it was",
			zap.String("dlq_id", id), zap.Error(err))
		return
	}
	ev := &DeadLetterMessage{ID: id, Event: EventMoved, Reason: e.Reason, UserID: e.UserID,
		OriginalKey: e.OriginalKey, FailureTime: x.clock.Now(), ManualReview: review}
	if !review {
		ev.NextRetryTime = &at
	}
	x.sendEvent(ev)
}

func (x *Index) move(ctx context.Context, id, state string, at time.Time) error {
	n, err := moveScript.Run(ctx, x.rdb, []string{x.msgKey(id)}, x.prefix, id, state, ms(at)).Int()
	if err != nil {
		return fmt.Errorf("dlq index move %s: %w", id, err)
	}
	if n == 0 {
		return ErrNotFound
	}
	return nil
}

// Delete removes one entry from every set; false if it was not there.
func (x *Index) Delete(ctx context.Context, id string) (bool, error) {
	n, err := deleteScript.Run(ctx, x.rdb, []string{x.msgKey(id)}, x.prefix, id).Int()
	if err != nil {
		return false, fmt.Errorf("dlq index delete %s: %w", id, err)
	}
	return n == 1, nil
}

// Get returns one entry.
func (x *Index) Get(ctx context.Context, id string) (*Entry, error) {
	es, err := x.load(ctx, []string{id})
	if err != nil {
		return nil, err
	}
	if es[0] == nil {
		return nil, ErrNotFound
	}
	return es[0], nil
}

// load reads entries in one pipeline; a missing ID yields nil.
func (x *Index) load(ctx context.Context, ids []string) ([]*Entry, error) {
	pipe := x.rdb.Pipeline()
	cmds := make([]*redis.SliceCmd, len(ids))
	for i, id := range ids {
		cmds[i] = pipe.HMGet(ctx, x.msgKey(id), "json", "state", "attempts", "retried_at", "next_retry")
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("dlq index load: %w", err)
	}
	out := make([]*Entry, len(ids))
	for i, c := range cmds {
		v := c.Val()
		body, ok := v[0].(string)
		if !ok {
			continue
		}
		dl, err := Decode([]byte(body))
		if err != nil {
			return nil, fmt.Errorf("dlq index load %s: %w", ids[i], err)
		}
		e := &Entry{DeadLetterMessage: dl}
		e.State, _ = v[1].(string)
		if s, ok := v[2].(string); ok {
			dl.Attempts, _ = strconv.Atoi(s)
		}
		if s, ok := v[3].(string); ok {
			if n, err := strconv.ParseInt(s, 10, 64); err == nil {
				t := time.UnixMilli(n).UTC()
				e.RetriedAt = &t
			}
		}
		if s, ok := v[4].(string); ok && e.State == StateDue {
			if n, err := strconv.ParseInt(s, 10, 64); err == nil && n > 0 {
				t := time.UnixMilli(n).UTC()
				dl.NextRetryTime = &t
			}
		}
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
		case strings.HasPrefix(k, "reason:") && n != 0:
			s.ByReason[strings.TrimPrefix(k, "reason:")] = n
		}
	}
	return s, nil
}

// List returns one page of entries matching f, newest failure first, and
// the cursor of the next page ("" when there is none).
func (x *Index) List(ctx context.Context, f Filter) ([]*Entry, string, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	base := x.key("all")
	switch {
	case f.User != "":
		base = x.key("user", f.User)
	case f.Reason != "":
		base = x.key("reason", f.Reason)
	case f.Review != nil && *f.Review:
		base = x.key("review")
	}
	maxScore, curScore, curID := "+inf", int64(0), ""
	if f.Cursor != "" {
		s, id, ok := strings.Cut(f.Cursor, ":")
		n, err := strconv.ParseInt(s, 10, 64)
		if !ok || err != nil || id == "" {
			return nil, "", fmt.Errorf("dlq list: %w %q", ErrBadCursor, f.Cursor)
		}
		maxScore, curScore, curID = s, n, id
	}
	var out []*Entry
	var last redis.Z
	batch := int64(max(limit, 50))
	for offset := int64(0); ; offset += batch {
		zs, err := x.rdb.ZRevRangeByScoreWithScores(ctx, base, &redis.ZRangeBy{
			Max: maxScore, Min: "-inf", Offset: offset, Count: batch}).Result()
		if err != nil {
			return nil, "", fmt.Errorf("dlq list: %w", err)
		}
		ids := make([]string, 0, len(zs))
		zsKept := make([]redis.Z, 0, len(zs))
		for _, z := range zs {
			id := z.Member.(string)
			// Equal scores come in reverse lexicographic order: after
			// the cursor only smaller IDs of its score remain.
			if f.Cursor != "" && int64(z.Score) == curScore && id >= curID {
				continue
			}
			ids = append(ids, id)
			zsKept = append(zsKept, z)
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
			last = zsKept[i]
			if len(out) == limit {
				return out, fmt.Sprintf("%d:%s", int64(last.Score), last.Member.(string)), nil
			}
		}
		if int64(len(zs)) < batch {
			return out, "", nil
		}
	}
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

// Export streams every entry matching f (Cursor and Limit ignored) to fn;
// an error from fn stops it and is returned.
func (x *Index) Export(ctx context.Context, f Filter, fn func(*DeadLetterMessage) error) error {
	return x.each(ctx, f, func(es []*Entry) error {
		for _, e := range es {
			if err := fn(e.DeadLetterMessage); err != nil {
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

// Purge deletes every entry matching f (Cursor and Limit ignored). With an
// event sink (WithEventSink, normally the DLQ Producer) each deletion is
// recorded in the DLQ topic as an EventPurged record, keyed like the dead
// letter so it follows it in the same partition, and a Rebuild deletes the
// entry again; without one (or when the record cannot be written, which is
// logged) a Rebuild brings back those not yet expired.
func (x *Index) Purge(ctx context.Context, f Filter) (int, error) {
	n := 0
	err := x.each(ctx, f, func(es []*Entry) error {
		for _, e := range es {
			ok, err := x.Delete(ctx, e.ID)
			if err != nil {
				return err
			}
			if ok {
				n++
				x.recordPurge(e.DeadLetterMessage)
			}
		}
		return nil
	})
	return n, err
}

// recordPurge writes the EventPurged record of a purged entry.
func (x *Index) recordPurge(dl *DeadLetterMessage) {
	if x.events == nil {
		return
	}
	x.sendEvent(&DeadLetterMessage{ID: dl.ID, Event: EventPurged, Reason: dl.Reason, UserID: dl.UserID,
		OriginalKey: dl.OriginalKey, FailureTime: x.clock.Now()})
}

// sendEvent writes an event record through the event sink; a failure is
// logged (the index already changed; only a later rebuild would differ).
func (x *Index) sendEvent(ev *DeadLetterMessage) {
	x.events.Send(ev, func(err error) {
		if err != nil {
			x.log.Warn("DLQ event not recorded; a rebuild would not reproduce it",
				zap.String("dlq_id", ev.ID), zap.String("event", ev.Event), zap.Error(err))
		}
	})
}

// PurgeExpired deletes every entry whose TTL (per reason) ended by now.
func (x *Index) PurgeExpired(ctx context.Context, now time.Time) (int, error) {
	n := 0
	for {
		ids, err := x.rdb.ZRangeByScore(ctx, x.key("expiry"), &redis.ZRangeBy{
			Min: "-inf", Max: strconv.FormatInt(now.UnixMilli(), 10), Count: 500}).Result()
		if err != nil {
			return n, fmt.Errorf("dlq purge expired: %w", err)
		}
		if len(ids) == 0 {
			return n, nil
		}
		for _, id := range ids {
			ok, err := x.Delete(ctx, id)
			if err != nil {
				return n, err
			}
			if ok {
				n++
			} else {
				// An expiry member without entry: drop it or we loop.
				x.rdb.ZRem(ctx, x.key("expiry"), id)
			}
		}
	}
}

// Reset deletes the whole index (before a Rebuild).
func (x *Index) Reset(ctx context.Context) error {
	iter := x.rdb.Scan(ctx, 0, x.prefix+"dlq:*", 1000).Iterator()
	var batch []string
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 500 {
			if err := x.rdb.Del(ctx, batch...).Err(); err != nil {
				return fmt.Errorf("dlq reset: %w", err)
			}
			batch = batch[:0]
		}
	}
	if err := iter.Err(); err != nil {
		return fmt.Errorf("dlq reset: %w", err)
	}
	if len(batch) > 0 {
		if err := x.rdb.Del(ctx, batch...).Err(); err != nil {
			return fmt.Errorf("dlq reset: %w", err)
		}
	}
	return nil
}

// claimed is a due entry handed to the scheduler.
type claimed struct {
	id       string
	dl       *DeadLetterMessage
	attempts int
}

// claim hands out up to limit entries due by now, leased for lease.
func (x *Index) claim(ctx context.Context, now time.Time, limit int, lease time.Duration) ([]claimed, error) {
	vals, err := claimScript.Run(ctx, x.rdb, []string{x.key("due")}, x.prefix, now.UnixMilli(), limit, lease.Milliseconds()).Slice()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("dlq claim: %w", err)
	}
	out := make([]claimed, 0, len(vals)/3)
	for i := 0; i+2 < len(vals); i += 3 {
		id, _ := vals[i].(string)
		body, _ := vals[i+1].(string)
		att, _ := strconv.Atoi(fmt.Sprint(vals[i+2]))
		dl, err := Decode([]byte(body))
		if err != nil {
			// One bad entry must not fail every scan's whole batch: it goes
			// to manual review, where an operator can see and purge it.
			x.m.undecodableEntries.Inc()
			x.log.Error("undecodable DLQ index entry; moved to review", zap.String("dlq_id", id), zap.Error(err))
			if err := x.move(ctx, id, StateReview, time.Time{}); err != nil && !errors.Is(err, ErrNotFound) {
				x.log.Warn("move undecodable DLQ index entry to review", zap.String("dlq_id", id), zap.Error(err))
			}
			continue
		}
		out = append(out, claimed{id: id, dl: dl, attempts: att})
	}
	return out, nil
}

// reschedule moves a still-due entry to at.
func (x *Index) reschedule(ctx context.Context, id string, at time.Time) error {
	return rescheduleScript.Run(ctx, x.rdb, []string{x.key("due")}, x.prefix, id, at.UnixMilli()).Err()
}

// reviewCount is the manual-review backlog.
func (x *Index) reviewCount(ctx context.Context) (int64, error) {
	return x.rdb.ZCard(ctx, x.key("review")).Result()
}
