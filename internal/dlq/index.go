package dlq

import (
	"errors"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
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
//
// Its code is split by concern: index.go the type, keys and schema,
// index_scripts.go the Lua scripts, index_write.go the writes (index,
// move, requeue, purge), index_query.go the read side (get, list, stats,
// export), index_loops.go the background steps (the scheduler's claim,
// PurgeExpired, Rebuild's parking) and index_metrics.go its counters.
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
// chatmsg.DeadLetter is the whole letter read from the DLQ topic (Whole).
type Entry struct {
	*chatmsg.DeadLetter
	State     string     `json:"state"`
	RetriedAt *time.Time `json:"retried_at,omitempty"`
	// Preview is the start of the message text (see Preview).
	Preview string `json:"preview,omitempty"`
	// At is where the letter sits in the DLQ topic.
	At Coord `json:"dlq_at"`
	// Whole says the DeadLetter was read whole from the DLQ topic.
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

// NewIndex returns the index under prefix (e.g. "kfpipe:"). Options:
// WithLetters, WithMaxEntries, WithEventSink, WithClock, WithLogger,
// WithRegisterer.
func NewIndex(rdb redis.UniversalClient, prefix string, opts ...Option) *Index {
	o := buildOptions(opts)
	return &Index{rdb: rdb, prefix: prefix, base: prefix + redisconn.Tag(rdb, "dlq") + ":", clock: o.clock, events: o.events, letters: o.letters, max: o.maxEntries,
		log: o.log, m: newIndexMetrics(o.reg)}
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

func ms(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}
