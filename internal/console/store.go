package console

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// The admin API depends only on these two small interfaces, so the DLQ
// index and the rate-limit admin can change without touching the HTTP
// layer; the daemon adapts the concrete types to them.

// DLQStore is the DLQ Redis index as the admin API uses it.
//
// Errors: ErrNotFound for an unknown ID, ErrConflict when the message
// cannot be retried in its state (already due now, or a reason no retry
// can fix, invalid_message or handler_rejected, without IncludeInvalid),
// ErrBadCursor for a cursor
// the store did not issue. Any other error is a store failure (503).
type DLQStore interface {
	Stats(ctx context.Context) (DLQStats, error)
	// List returns one page matching f and the cursor of the next page
	// ("" after the last).
	List(ctx context.Context, f DLQFilter) ([]DLQMessage, string, error)
	Get(ctx context.Context, id string) (DLQMessage, error)
	// Retry schedules the message for a retry now (o.DryRun: decides
	// only), deciding as RetryLetters does: ErrConflict, with the reason
	// in words, when the retry would not act on it.
	Retry(ctx context.Context, id string, o RetryOptions) error
	// Select returns every letter f selects (Cursor ignored), up to
	// f.Limit (0: all), in their messages' order (source partition and
	// offset: each user's order). With retry set (a batch retry or its
	// dry run) each letter's Skip says whether and why the retry would
	// not act on it, decided by the same function as RetryLetters.
	Select(ctx context.Context, f DLQFilter, retry *RetryOptions) ([]Letter, error)
	// RetryLetters schedules ls for a retry, ls[i] due at from + i ms
	// (those it acts on), and says what became of each. A letter this
	// batch (o.Batch) requeued already counts as OutcomeActed (a batch
	// resumed after a crash acts on no letter twice); one whose message is
	// now done is skipped.
	RetryLetters(ctx context.Context, ls []Letter, from time.Time, o RetryOptions) ([]Outcome, error)
	// PurgeLetters deletes ls from the index.
	PurgeLetters(ctx context.Context, ls []Letter) ([]Outcome, error)
	// Delivery says where each of the letters ids, which batch requeued
	// at since or later, stands: back in the main topic (re-injected by
	// the scheduler since; it may have failed again after), still waiting
	// in the DLQ for its due time (the scheduler's per-user pacing holds a
	// user's letters past its window; a blocked user's wait for the block),
	// or gone (purged, expired, or taken by another batch before it went
	// back).
	Delivery(ctx context.Context, ids []string, batch string, since time.Time) ([]Delivery, error)
	// Export calls fn for every message matching f (Cursor and Limit
	// ignored), stopping at the first error fn returns.
	Export(ctx context.Context, f DLQFilter, fn func(DLQMessage) error) error
	// Inflow counts, per reason, the messages whose last failure lies in
	// each of n buckets of step ending at to, oldest first.
	Inflow(ctx context.Context, to time.Time, step time.Duration, n int) (map[string][]int64, error)
}

// Letter is one dead letter a batch acts on.
type Letter struct {
	ID     string `json:"id"`
	User   string `json:"user"`
	Reason string `json:"reason"`
	// Key is the store's own handle on the letter (e.g. its message's
	// dedup key), kept with the batch so a resumed batch needs no lookup.
	Key string `json:"key,omitempty"`
	// SendTime is the letter's message's send time (Unix seconds), which
	// with User finds it in a per-user dedup store.
	SendTime int64 `json:"send_time,omitempty"`
	// Done: the dedup store holds the letter's message as processed.
	Done bool `json:"done,omitempty"`
	// Skip is why a retry would not act on the letter ("" : it would):
	// one of the Skip… values. Set by Select for a retry.
	Skip string `json:"skip,omitempty"`
}

// Why a retry skips a letter (Letter.Skip).
const (
	// SkipDone: its message is done in the dedup store.
	SkipDone = "done"
	// SkipNotRetryable: its reason is never retried (invalid_message,
	// handler_rejected) and the retry did not include those
	// (include_invalid).
	SkipNotRetryable = "not_retryable"
	// SkipSettled: retried already, or done: never selected again until
	// its message fails again.
	SkipSettled = "settled"
	// SkipBusy: due now, or being re-injected by the scheduler.
	SkipBusy = "busy"
	// SkipGone: no longer in the index.
	SkipGone = "gone"
)

// RetryOptions are an operator's choices for a retry, the same for one
// letter and a batch.
type RetryOptions struct {
	DryRun bool
	// IncludeInvalid retries letters whose reason no retry can fix (the
	// reason table's non-recoverable rows: invalid_message,
	// handler_rejected), e.g. once the bot that refused them is fixed.
	IncludeInvalid bool
	// Batch is the batch acting ("" for one letter).
	Batch string
}

// Outcome is what a batch did with one letter.
type Outcome uint8

// Outcomes of RetryLetters and PurgeLetters.
const (
	// OutcomeActed: retried (scheduled now) or purged.
	OutcomeActed Outcome = iota
	// OutcomeDone: skipped, its message is done in the dedup store.
	OutcomeDone
	// OutcomeGone: no longer there (purged, expired) or no longer
	// retryable; nothing done.
	OutcomeGone
)

// Delivery is where a letter a batch requeued stands (DLQStore.Delivery).
type Delivery struct {
	State DeliveryState
	// Due is a waiting letter's due time: when the scheduler re-injects it.
	Due time.Time
}

// DeliveryState is a requeued letter's way back to the main topic.
type DeliveryState uint8

// Delivery states.
const (
	// DeliveryWaiting: requeued, waiting in the DLQ for its due time.
	DeliveryWaiting DeliveryState = iota
	// DeliveryDelivered: the scheduler put it back in the main topic.
	DeliveryDelivered
	// DeliveryGone: purged or expired before it went back.
	DeliveryGone
)

// Pipeline is what the overview shows beyond the DLQ. Each method's error
// is shown in the overview next to the part it concerns; the rest still
// answers.
type Pipeline interface {
	// Accounts returns the sync status kf-producer published per open_kfid.
	Accounts(ctx context.Context) ([]AccountSync, error)
	// Lag returns the schedule-consumers' group's offsets on the main
	// topic, per partition.
	Lag(ctx context.Context) ([]PartitionLag, error)
	// Consumers returns the statuses the schedule-consumers published.
	Consumers(ctx context.Context) ([]ConsumerStatus, error)
}

// ConsumerStatus is what one schedule-consumer process published of
// itself (its actors and breakers live in its memory).
type ConsumerStatus struct {
	Node         string    `json:"node"`
	Actors       int       `json:"actors"`
	OpenBreakers int       `json:"open_breakers"`
	Partitions   int       `json:"partitions"`
	Reported     time.Time `json:"reported"`
	// OutageGateOpen: the process's downstream gate is open (the handler
	// fails for many users at once; messages wait).
	OutageGateOpen bool `json:"outage_gate_open,omitempty"`
	// HandlerLimit, HandlerInFlight and HandlerWaiting are the process's
	// adaptive limit on handler calls, the calls in flight and the
	// messages waiting for a slot; HandlerLatency the mean latency of its
	// last window of calls, in seconds. Messages waiting mean the
	// downstream is slower than the traffic ("downstream slow").
	HandlerLimit    int     `json:"handler_limit,omitempty"`
	HandlerInFlight int     `json:"handler_in_flight,omitempty"`
	HandlerWaiting  int     `json:"handler_waiting,omitempty"`
	HandlerLatency  float64 `json:"handler_latency_seconds,omitempty"`
	// Stale: not reported for three intervals (stopped, or lost Redis);
	// set by the overview, not counted in its totals.
	Stale bool `json:"stale,omitempty"`
}

// AccountSync is one open_kfid's sync as kf-producer published it.
type AccountSync struct {
	OpenKfID string `json:"open_kfid"`
	// LastSuccess is the last successful pass (nil: none since the
	// publishing replica started).
	LastSuccess *time.Time `json:"last_success,omitempty"`
	// OldestWaiting is since when messages may wait in WeChat, not yet in
	// Kafka (nil: nothing waits).
	OldestWaiting *time.Time `json:"oldest_waiting,omitempty"`
	// Reported is when kf-producer wrote this status.
	Reported time.Time `json:"reported"`
	// Days are the account's statistics of the last 7 days, oldest
	// first, as kf-producer last collected them (get_corp_statistic);
	// absent before its first collection.
	Days []AccountDay `json:"days,omitempty"`
}

// AccountDay is one day of an account's statistics.
type AccountDay struct {
	// Day is the day's start, midnight UTC+8 as WeChat counts.
	Day time.Time `json:"day"`
	// Sessions served, Customers served, CustomerMessages customers
	// sent, HandedOn customers handed to a servicer or another service.
	Sessions         int `json:"sessions"`
	Customers        int `json:"customers"`
	CustomerMessages int `json:"customer_messages"`
	HandedOn         int `json:"handed_on"`
}

// PartitionLag is one main-topic partition as the schedule-consumers'
// group sees it.
type PartitionLag struct {
	Partition int32 `json:"partition"`
	End       int64 `json:"end_offset"`
	// Committed is -1 when the group has committed nothing there.
	Committed int64 `json:"committed_offset"`
	Lag       int64 `json:"lag"`
	// CommitAgeSeconds is how long the committed offset has not moved, as
	// the admin server has seen it (it samples every 15 s); with
	// CommitAgeAtLeast it has not moved since the server's first sample.
	CommitAgeSeconds *int64 `json:"commit_age_seconds,omitempty"`
	CommitAgeAtLeast bool   `json:"commit_age_at_least,omitempty"`
}

// RateLimitAdmin is the rate limiter's operator interface (unblock, groups,
// whitelist).
//
// Errors: ErrUnknownGroup from SetGroup, ErrConflict from RemoveWhitelist
// for a user who is not whitelisted. Unblock of a user who is not blocked
// succeeds (the operator's intent holds).
type RateLimitAdmin interface {
	Status(ctx context.Context, user string) (RateLimitStatus, error)
	Unblock(ctx context.Context, user string) error
	// Block blocks user for d; d == 0 blocks permanently.
	Block(ctx context.Context, user string, d time.Duration) error
	SetGroup(ctx context.Context, user, group string) error
	Whitelist(ctx context.Context, user string) error
	RemoveWhitelist(ctx context.Context, user string) error
	// ListBlocked returns one page from cursor (0 first) and the next
	// cursor (0 after the last page).
	ListBlocked(ctx context.Context, cursor, limit int) ([]BlockedUser, int, error)
	// Rules returns the group rules in force with their version.
	Rules(ctx context.Context) (RateRules, error)
	// SetRules replaces the group rules if they are still at version and
	// returns the new version: a *VersionConflictError (409) when they are
	// not, ErrInvalidRules (422) when the rules are unusable.
	SetRules(ctx context.Context, groups map[string]RateRule, version int64) (int64, error)
}

// RateRules is the rate limiter's group rules and where they live.
type RateRules struct {
	// Backend is rate_limit.rules_backend: redis or etcd.
	Backend string `json:"backend"`
	// Version is the version a change must name (0: the configured rules,
	// never changed).
	Version int64               `json:"version"`
	Groups  map[string]RateRule `json:"groups"`
}

// VersionConflictError is SetRules' refusal when the rules changed since
// the version the caller read: 409 with current_version.
type VersionConflictError struct{ Current int64 }

func (e *VersionConflictError) Error() string {
	return "the rules changed since the version you read: read them again (current_version) and re-apply your change"
}

// Is makes errors.Is(err, ErrConflict) true.
func (e *VersionConflictError) Is(target error) bool { return target == ErrConflict }

// ErrInvalidRules is SetRules' refusal of unusable rules (422); the
// wrapped message names the key.
var ErrInvalidRules = errors.New("admin: invalid rules")

// Store errors the handlers map to HTTP statuses; adapters wrap theirs.
var (
	// ErrNotFound is returned for an unknown message ID (404).
	ErrNotFound = errors.New("admin: not found")
	// ErrConflict is returned when the target's state forbids the write (409).
	ErrConflict = errors.New("admin: conflict")
	// ErrBadCursor is returned by List for a cursor it did not issue (400).
	ErrBadCursor = errors.New("admin: bad cursor")
	// ErrUnknownGroup is returned by SetGroup for a group not in the rules (422).
	ErrUnknownGroup = errors.New("admin: unknown group")
)

// DLQStats summarises the DLQ index.
type DLQStats struct {
	Total    int64            `json:"total"`
	ByReason map[string]int64 `json:"by_reason"`
	Due      int64            `json:"due"`
	DueNow   int64            `json:"due_now"`
	Review   int64            `json:"review"`
	Retried  int64            `json:"retried"`
	Done     int64            `json:"done"`
}

// DLQFilter selects DLQ messages; empty fields match everything.
type DLQFilter struct {
	User   string
	Reason string // failure reason, not the audit reason
	Review *bool  // true: only in manual review; false: only not in review
	Cursor string
	Limit  int
}

// DLQMessage is one dead letter as the API shows it.
type DLQMessage struct {
	ID          string    `json:"id"`
	User        string    `json:"user"`
	OpenKfID    string    `json:"open_kfid,omitempty"`
	Reason      string    `json:"reason"`
	Details     string    `json:"details,omitempty"`
	State       string    `json:"state"`
	FailureTime time.Time `json:"failure_time"`
	RetryCount  int       `json:"retry_count"`
	// Failures is how many times the message failed: its letter holds
	// its first dead-lettering and every failed retry (one letter a
	// message); FirstFailure is when it first failed.
	Failures        int        `json:"failures,omitempty"`
	FirstFailure    *time.Time `json:"first_failure,omitempty"`
	NextRetryTime   *time.Time `json:"next_retry_time,omitempty"`
	SourceTopic     string     `json:"source_topic,omitempty"`
	SourcePartition int32      `json:"source_partition"`
	SourceOffset    int64      `json:"source_offset"`
	// Preview is the start of the message's text (lists show it).
	Preview string `json:"preview,omitempty"`
	// DLQPartition and DLQOffset are where the letter sits in the DLQ
	// topic (kcat -p … -o …).
	DLQPartition int32 `json:"dlq_partition"`
	DLQOffset    int64 `json:"dlq_offset"`
	// Message is the original message, read from the DLQ topic: in a
	// single letter and in exports, not in lists.
	Message json.RawMessage `json:"message,omitempty"`
}

// RateLimitStatus is what an operator sees of one user.
type RateLimitStatus struct {
	User         string     `json:"user"`
	Group        string     `json:"group"`
	Blocked      bool       `json:"blocked"`
	BlockedUntil *time.Time `json:"blocked_until,omitempty"`
	Permanent    bool       `json:"permanent"`
	// Rule is the user's group's rule (none for the whitelist).
	Rule *RateRule `json:"rule,omitempty"`
	// BlockHistory are the automatic blocks the progressive penalty
	// remembers, oldest first.
	BlockHistory []time.Time `json:"block_history,omitempty"`
	// RecentLetters counts the user's dead letters of the last hour by
	// reason (rate_limited ones are the limiter's refusals). The sliding
	// window and the violation count live in each schedule-consumer's
	// memory and are not shown.
	RecentLetters map[string]int `json:"recent_letters,omitempty"`
}

// RateRule is a rate-limit group's rule: at most MaxMessages in any
// WindowSeconds; PenaltyThreshold refusals block the user for BlockHours.
type RateRule struct {
	WindowSeconds    float64 `json:"window_seconds"`
	MaxMessages      int     `json:"max_messages"`
	PenaltyThreshold int     `json:"penalty_threshold"`
	BlockHours       float64 `json:"block_hours"`
}

// BlockedUser is one entry of the blocked list.
type BlockedUser struct {
	User         string     `json:"user"`
	BlockedUntil *time.Time `json:"blocked_until,omitempty"`
	Permanent    bool       `json:"permanent"`
}
