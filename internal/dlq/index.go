package dlq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/redisconn"
)

// Index states of an entry.
const (
	StateDue     = "due"     // in dlq:due, the scheduler re-injects it at its score
	StateReview  = "review"  // in dlq:review, waits for an operator
	StateRetried = "retried" // re-injected into the main topic; kept for history until it expires
	// StateDone: the message of a retried letter is done (its retry was
	// processed: the dedup store holds it); kept for history until it
	// expires, never selected again.
	StateDone = "done"
)

// ErrNotFound is returned by Get, Requeue and MoveToReview for an ID the
// index does not hold.
var ErrNotFound = errors.New("dlq: entry not found")

// ErrBadCursor is returned by List for a cursor it did not issue: the
// caller's mistake, not a store failure.
var ErrBadCursor = errors.New("dlq: bad cursor")

// Index is the Redis view of the DLQ topic, which stays the source of
// truth (Rebuild recreates the view from it). It is compact: per dead
// letter one small hash of its summary and its DLQ coordinates, and its ID
// in three sorted sets; the whole letter is read back from the topic by
// its coordinates (WithLetters) when it is re-injected, opened or
// exported. Every write of an entry is one Lua script, so an entry, its
// sets and the counters never disagree, and indexing the same ID twice is
// a no-op.
//
// Keys, under prefix + "dlq:":
//
//	msg:<id>       hash, the summary (field names kept to one letter: the
//	               hash stays in Redis's compact encoding, see hashFields)
//	reason:<r>     sorted set of the reason's entries by failure time; the
//	               reasons' sets together list every entry
//	user:<u>       sorted set of the user's entries by failure time
//	due            sorted set of entries waiting for a retry, by due time
//	review         sorted set of entries waiting for an operator, by failure time
//	stats          hash of counters: total, retried, reason:<r>
//	retried        sorted set of retried entries whose message is not known
//	               done yet, by when last looked at (Unsettled, MarkDone)
//	ttl            hash reason → the shortest TTL (ms) of its entries, so
//	               PurgeExpired walks only the part of a reason's set that
//	               may have expired
//
// Retried entries are in neither due nor review. The scripts that take an
// ID alone derive the user and reason keys from the stored entry (and get
// the key base in ARGV). On a Redis Cluster the base is prefix + "{dlq}:":
// the whole index is one hash slot, on one master, so every script's keys
// (declared or derived) are local to the node that runs it. That is a
// deliberate placement: the index is one view with global sets (due,
// review, stats) bounded by dlq_index.max_entries, not per-message state;
// docs/operations.md ("Redis Cluster") gives its slot's measured load.
type Index struct {
	rdb     redis.UniversalClient
	prefix  string
	base    string // prefix + "dlq:", on a Cluster prefix + "{dlq}:" (one slot)
	clock   Clock
	events  EventSink // records purges in the DLQ topic; may be nil
	letters Letters   // reads whole letters back; may be nil
	max     int64     // dlq_index.max_entries; 0 unbounded
	log     *zap.Logger
	m       indexMetrics
}

type indexMetrics struct {
	indexed            *prometheus.CounterVec
	undecodableEntries prometheus.Counter
	gone               prometheus.Counter
}

// Stats summarises the index.
type Stats struct {
	Total    int64            `json:"total"`     // entries in the index
	ByReason map[string]int64 `json:"by_reason"` // entries by failure reason
	Due      int64            `json:"due"`       // scheduled for a retry
	DueNow   int64            `json:"due_now"`   // of which due by now
	Review   int64            `json:"review"`    // waiting for manual review
	Retried  int64            `json:"retried"`   // re-injected into the main topic
	Done     int64            `json:"done"`      // retried, and the message is done
}

// Entry is an indexed dead letter with its index state. From List it
// carries the index's summary only (Whole false): ID, reason, user,
// failure, due and expiry times, attempts, retry count, source partition
// and offset, Preview and At. From Get and Export, and with WithLetters,
// DeadLetterMessage is the whole letter read from the DLQ topic (Whole).
type Entry struct {
	*DeadLetterMessage
	State     string     `json:"state"`
	RetriedAt *time.Time `json:"retried_at,omitempty"`
	// Preview is the start of the message text (see Preview).
	Preview string `json:"preview,omitempty"`
	// At is where the letter sits in the DLQ topic.
	At Coord `json:"dlq_at"`
	// Whole says DeadLetterMessage was read whole from the DLQ topic.
	Whole bool `json:"-"`
	// Failures is how many times the letter's message failed (its first
	// dead-lettering and each failed retry); FirstFailure is when it
	// first did (nil for entries indexed before it was kept).
	Failures     int        `json:"failures"`
	FirstFailure *time.Time `json:"first_failure,omitempty"`
	// Batch is the operator batch that last requeued the letter.
	Batch string `json:"batch,omitempty"`
	// claimedUntil: a scheduler holds the letter until then (it is being
	// re-injected).
	claimedUntil time.Time
}

// Filter selects entries. Empty fields match everything.
type Filter struct {
	User   string
	Reason string
	Review *bool  // true: only entries in review; false: only those not in review
	Cursor string // from a previous List; empty for the first page
	Limit  int    // page size; <= 0 means 100
}

// NewIndex returns the index under prefix (e.g. "kfpipe:"). Options:
// WithLetters, WithMaxEntries, WithEventSink, WithClock, WithLogger,
// WithRegisterer.
func NewIndex(rdb redis.UniversalClient, prefix string, opts ...Option) *Index {
	o := buildOptions(opts)
	return &Index{rdb: rdb, prefix: prefix, base: prefix + redisconn.Tag(rdb, "dlq") + ":", clock: o.clock, events: o.events, letters: o.letters, max: o.maxEntries,
		log: o.log, m: indexMetrics{
			indexed: register(o.reg, prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "kfpipe_dlq_index_total", Help: "DLQ records applied to the Redis index, by result (new, duplicate, expired, event, full)."},
				[]string{"result"})),
			undecodableEntries: register(o.reg, prometheus.NewCounter(prometheus.CounterOpts{
				Name: "kfpipe_dlq_index_undecodable_entries_total",
				Help: "Index entries the scheduler could not decode; each is moved to review instead of failing the scan."})),
			gone: register(o.reg, prometheus.NewCounter(prometheus.CounterOpts{
				Name: "kfpipe_dlq_letters_gone_total",
				Help: "Due dead letters the DLQ topic no longer held (retention shorter than the index TTL); each is moved to review."})),
		}}
}

func (x *Index) key(parts ...string) string { return x.base + strings.Join(parts, ":") }
func (x *Index) msgKey(id string) string    { return x.key("msg", id) }

// entryKeys are the keys deleteScript and moveScript declare.
func (x *Index) entryKeys(id string) []string {
	return []string{x.msgKey(id), x.key("due"), x.key("review"), x.key("retried"), x.key("stats")}
}

// A message has one letter: a retried message that fails again carries its
// letter's ID (chatmsg.HeaderDLQID, set by PrepareRetry), so its new DLQ
// record updates the entry instead of adding one. The entry then points at
// the newest record (k), with the newest reason, state and due time; n
// counts the failures the letter holds and f keeps the first one's time.
// The older records stay in the topic (history; a rebuild reads them in
// order and collapses them the same way).

// hashFields are the summary's fields in msg:<id>. One letter each: with
// names spelled out a letter's hash took 30 bytes more, and the whole
// entry's budget is 600 bytes (BENCHMARKS.md, "DLQ index bytes").
//
//	r reason   u user       s state     e expires_at (ms, 0 never)
//	a attempts k DLQ coord  o source partition:offset
//	p preview  c retry_count t retried_at (ms)
//	n failures the letter holds (absent: 1)
//	f first failure (ms; absent: the failure time, the letter failed once)
//	l claimed by a scheduler until (ms)        b the batch that requeued it
//
// The failure time is the entry's score in reason:<r>, the due time its
// score in due.

// indexScript applies one DLQ record. Returns 1 new entry, 0 duplicate or
// stale event, -1 already expired, 2 event applied, -2 index full, 3 an
// existing letter updated by a later failure of its message.
// KEYS: msg, user set, reason set, due, review, stats, ttl, retried.
var indexScript = redis.NewScript(`
local id = ARGV[1]
if ARGV[9] == 'retried' then
  if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
  local a = tonumber(redis.call('HGET', KEYS[1], 'a') or '0')
  local n = tonumber(ARGV[10])
  if n <= a then return 0 end
  local st = redis.call('HGET', KEYS[1], 's')
  redis.call('HSET', KEYS[1], 'a', n, 's', 'retried', 't', ARGV[8])
  redis.call('HDEL', KEYS[1], 'l')
  redis.call('ZREM', KEYS[4], id)
  redis.call('ZREM', KEYS[5], id)
  if st == 'done' then redis.call('HINCRBY', KEYS[6], 'done', -1) end
  if st ~= 'retried' then redis.call('HINCRBY', KEYS[6], 'retried', 1) end
  redis.call('ZADD', KEYS[8], ARGV[8], id)
  return 2
end
if ARGV[9] == 'done' then
  local st = redis.call('HGET', KEYS[1], 's')
  if st ~= 'retried' then return 0 end
  redis.call('ZREM', KEYS[8], id)
  redis.call('HSET', KEYS[1], 's', 'done')
  redis.call('HINCRBY', KEYS[6], 'retried', -1)
  redis.call('HINCRBY', KEYS[6], 'done', 1)
  return 2
end
local exp = tonumber(ARGV[7])
if exp > 0 and exp <= tonumber(ARGV[8]) then return -1 end
-- place files the letter under its reason and user and in the due or the
-- review set, and keeps the reason's shortest time to live.
local function place()
  redis.call('ZADD', KEYS[3], ARGV[6], id)
  if ARGV[3] ~= '' then redis.call('ZADD', KEYS[2], ARGV[6], id) end
  if ARGV[4] == 'due' then
    redis.call('ZADD', KEYS[4], ARGV[5], id)
  else
    redis.call('ZADD', KEYS[5], ARGV[6], id)
  end
  if exp > 0 then
    local ttl = exp - tonumber(ARGV[6])
    local cur = tonumber(redis.call('HGET', KEYS[7], ARGV[2]) or '-1')
    if cur < 0 or ttl < cur then redis.call('HSET', KEYS[7], ARGV[2], ttl) end
  end
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  -- A later failure of the letter's message (a retry: another source
  -- record) updates it; the same record read again, the same source
  -- record dead-lettered again (a consumer crash before its commit), or
  -- an older one changes nothing.
  local h = redis.call('HMGET', KEYS[1], 'k', 'r', 's', 'n', 'o', 'f')
  if h[5] == ARGV[12] then return 0 end
  local op, oo = string.match(h[1] or '', '^(-?%d+):(-?%d+)$')
  local np, no = string.match(ARGV[11], '^(-?%d+):(-?%d+)$')
  if not op or not np then return 0 end
  local rbase = string.sub(KEYS[3], 1, #KEYS[3] - #ARGV[2])
  local r0, s0 = h[2], h[3]
  local f0 = redis.call('ZSCORE', rbase .. r0, id)
  if op == np then
    if tonumber(no) <= tonumber(oo) then return 0 end
  elseif f0 and tonumber(ARGV[6]) <= tonumber(f0) then
    return 0
  end
  -- The first failure's time, kept from the first update on (a new
  -- entry's is its failure time: no field, for the index's byte budget).
  if not h[6] and f0 then redis.call('HSET', KEYS[1], 'f', f0) end
  if r0 ~= ARGV[2] then
    redis.call('ZREM', rbase .. r0, id)
    redis.call('HINCRBY', KEYS[6], 'reason:' .. r0, -1)
    redis.call('HINCRBY', KEYS[6], 'reason:' .. ARGV[2], 1)
  end
  if s0 == 'retried' then redis.call('HINCRBY', KEYS[6], 'retried', -1) end
  if s0 == 'done' then redis.call('HINCRBY', KEYS[6], 'done', -1) end
  redis.call('HSET', KEYS[1], 'r', ARGV[2], 's', ARGV[4], 'e', ARGV[7], 'k', ARGV[11], 'o', ARGV[12],
    'p', ARGV[13], 'c', ARGV[14], 'n', tonumber(h[4] or '1') + 1)
  redis.call('HDEL', KEYS[1], 'l', 'b')
  redis.call('ZREM', KEYS[8], id)
  redis.call('ZREM', KEYS[4], id)
  redis.call('ZREM', KEYS[5], id)
  place()
  return 3
end
local max = tonumber(ARGV[15])
if max > 0 and tonumber(redis.call('HGET', KEYS[6], 'total') or '0') >= max then return -2 end
redis.call('HSET', KEYS[1], 'r', ARGV[2], 'u', ARGV[3], 's', ARGV[4], 'e', ARGV[7], 'a', 0,
  'k', ARGV[11], 'o', ARGV[12], 'p', ARGV[13], 'c', ARGV[14])
place()
redis.call('HINCRBY', KEYS[6], 'total', 1)
redis.call('HINCRBY', KEYS[6], 'reason:' .. ARGV[2], 1)
return 1
`)

// deleteScript removes one entry from every set. KEYS: msg, due, review,
// retried, stats; the entry's user and reason sets are named from the
// stored entry (base + 'user:' ..), in the same slot on a Cluster. ARGV:
// key base, id.
var deleteScript = redis.NewScript(`
local p, id = ARGV[1], ARGV[2]
local mk = KEYS[1]
local h = redis.call('HMGET', mk, 'r', 'u', 's')
if not h[1] then return 0 end
redis.call('DEL', mk)
if h[2] and h[2] ~= '' then redis.call('ZREM', p .. 'user:' .. h[2], id) end
redis.call('ZREM', p .. 'reason:' .. h[1], id)
redis.call('ZREM', KEYS[2], id)
redis.call('ZREM', KEYS[3], id)
redis.call('ZREM', KEYS[4], id)
redis.call('HINCRBY', KEYS[5], 'total', -1)
redis.call('HINCRBY', KEYS[5], 'reason:' .. h[1], -1)
if h[3] == 'retried' then redis.call('HINCRBY', KEYS[5], 'retried', -1) end
if h[3] == 'done' then redis.call('HINCRBY', KEYS[5], 'done', -1) end
return 1
`)

// moveScript puts an entry into due (ARGV[3]='due', score ARGV[4]) or
// review (ARGV[3]='review'), unless ARGV[5] >= 0 and the entry's attempts
// exceed it (a stale move: -1). Returns 0 for no entry, else 1 + the
// entry's attempts. KEYS: msg, due, review, retried, stats (the reason set
// is named from the entry). ARGV: key base, id, state, score_ms, attempts
// seen (-1: no check).
var moveScript = redis.NewScript(`
local p, id = ARGV[1], ARGV[2]
local mk = KEYS[1]
local h = redis.call('HMGET', mk, 's', 'r', 'a')
local st = h[1]
if not st then return 0 end
local seen = tonumber(ARGV[5])
local a = tonumber(h[3] or '0')
if seen >= 0 and a > seen then return -1 end
if st == 'retried' then redis.call('HINCRBY', KEYS[5], 'retried', -1) end
if st == 'done' then redis.call('HINCRBY', KEYS[5], 'done', -1) end
redis.call('HDEL', mk, 'l')
redis.call('ZREM', KEYS[4], id)
if ARGV[3] == 'due' then
  redis.call('ZREM', KEYS[3], id)
  redis.call('ZADD', KEYS[2], ARGV[4], id)
  redis.call('HSET', mk, 's', 'due')
else
  redis.call('ZREM', KEYS[2], id)
  local failed = redis.call('ZSCORE', p .. 'reason:' .. h[2], id) or '0'
  redis.call('ZADD', KEYS[3], failed, id)
  redis.call('HSET', mk, 's', 'review')
end
return 1 + a
`)

// claimScript hands out due entries and pushes their score forward by a
// lease, so a second scheduler (or this one after a crash) takes them
// again only when the lease ran out without MarkRetried. KEYS: due (the
// entries' hashes are named from the IDs it holds). ARGV: key base,
// now_ms, limit, lease_ms. Returns id, DLQ coordinates, attempts triples.
var claimScript = redis.NewScript(`
local p = ARGV[1]
local due = KEYS[1]
local ids = redis.call('ZRANGEBYSCORE', due, '-inf', ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
local until_ms = tonumber(ARGV[2]) + tonumber(ARGV[4])
local out = {}
for _, id in ipairs(ids) do
  local h = redis.call('HMGET', p .. 'msg:' .. id, 'k', 'a')
  if h[1] then
    redis.call('ZADD', due, 'XX', until_ms, id)
    redis.call('HSET', p .. 'msg:' .. id, 'l', until_ms)
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
// still due, and ends its claim. KEYS: due, msg. ARGV: key base, id, score_ms.
var rescheduleScript = redis.NewScript(`
local p, id = ARGV[1], ARGV[2]
redis.call('ZADD', KEYS[1], 'XX', ARGV[3], id)
redis.call('HDEL', KEYS[2], 'l')
return 1
`)

// loadScript reads summaries: per ID false, or {r, u, s, e, a, k, o, p, c,
// t, n, f, l, b, failure time, due time}. ARGV: prefix, ids.
var loadScript = redis.NewScript(`
local p = ARGV[1]
local out = {}
for i = 2, #ARGV do
  local id = ARGV[i]
  local h = redis.call('HMGET', p .. 'msg:' .. id, 'r', 'u', 's', 'e', 'a', 'k', 'o', 'p', 'c', 't', 'n', 'f', 'l', 'b')
  if h[1] then
    h[15] = redis.call('ZSCORE', p .. 'reason:' .. h[1], id) or '0'
    h[16] = '0'
    if h[3] == 'due' then h[16] = redis.call('ZSCORE', p .. 'due', id) or '0' end
    for j = 1, 16 do if not h[j] then h[j] = '' end end
    out[#out + 1] = h
  else
    out[#out + 1] = false
  end
end
return out
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
func (x *Index) Index(ctx context.Context, dl *DeadLetterMessage, at Coord) (IndexResult, error) {
	dl.EnsureID()
	res, err := x.applyAt(ctx, dl, at, 0)
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
func (x *Index) indexParked(ctx context.Context, dl *DeadLetterMessage, at Coord) (IndexResult, error) {
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

// unparkScript makes a parked entry due at its real time, unless an event
// moved it meanwhile (its score is no longer the parked one). KEYS: due.
// ARGV: key base, id, real score, parked score.
var unparkScript = redis.NewScript(`
local p, id = ARGV[1], ARGV[2]
local sc = redis.call('ZSCORE', KEYS[1], id)
if sc and tonumber(sc) == tonumber(ARGV[4]) then
  redis.call('ZADD', KEYS[1], ARGV[3], id)
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

// applyAt indexes dl with the due score of a new due entry set to dueAt
// (0: its NextRetryTime).
func (x *Index) applyAt(ctx context.Context, dl *DeadLetterMessage, at Coord, dueAt int64) (IndexResult, error) {
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
	res, err := x.Index(ctx, &DeadLetterMessage{ID: id, Event: EventRetried, Attempts: attempts}, Coord{})
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
	ev := &DeadLetterMessage{ID: id, Event: EventMoved, Reason: e.Reason, UserID: e.UserID,
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
		e.DeadLetterMessage, e.Whole = dl, true
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
		dl := &DeadLetterMessage{ID: ids[i], Reason: Reason(f(0)), UserID: f(1)}
		e := &Entry{DeadLetterMessage: dl, State: f(2), Preview: f(7)}
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
			x.recordPurge(e.DeadLetterMessage)
		}
	}
	return out, nil
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

// claimed is a due entry handed to the scheduler.
type claimed struct {
	id       string
	dl       *DeadLetterMessage
	attempts int
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
	for i := 0; i+2 < len(vals); i += 3 {
		id, _ := vals[i].(string)
		k, _ := vals[i+1].(string)
		att, _ := strconv.Atoi(fmt.Sprint(vals[i+2]))
		c, ok := parseCoord(k)
		if !ok {
			x.toReview(ctx, id, "undecodable DLQ index entry; moved to review", fmt.Errorf("bad coordinates %q", k))
			x.m.undecodableEntries.Inc()
			continue
		}
		ids, at, atts = append(ids, id), append(at, c), append(atts, att)
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
		out = append(out, claimed{id: ids[i], dl: dl, attempts: atts[i]})
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
	return rescheduleScript.Run(ctx, x.rdb, []string{x.key("due"), x.msgKey(id)}, x.base, id, at.UnixMilli()).Err()
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
