// Package deadletter owns the reasons a message leaves the main flow for
// the DLQ (I6): one table with one row per reason, read by everything that
// emits, prices, retries or documents a dead letter. The consumer and the
// rate limiter emit reasons, dlq fills recoverable, priority and suggested
// action from the table and picks the recovery strategy, config takes the
// default recovery.max_retries from it, and docs/operations.md lists the
// same rows (a test compares them).
//
// The package is a leaf (it imports nothing of the project) so that config,
// ratelimit, consumer and dlq can all depend on it without cycles.
//
// To add a reason: add a constant and a row to table below, then the row to
// the reasons table in docs/operations.md; the tests of this package fail
// until both agree and until no package emits a reason the table lacks.
// Regenerate docs/config.md (recovery.max_retries lists every reason). A
// reason that takes a case from another (handler_rejected from
// invalid_message) also changes whatever names the old one for that case:
// docs/architecture.md, "Where things go", has the list.
package deadletter

import (
	"fmt"
	"strings"
)

// Reason says why a message left the main flow; its string is the wire
// value of the DLQ record's failure_reason field and header.
type Reason string

// The reasons. Every refusal or failure of the consumer maps to one (I6).
const (
	RateLimited     Reason = "rate_limited"
	UserBlocked     Reason = "user_blocked"
	CircuitOpen     Reason = "circuit_open"
	QueueFull       Reason = "queue_full"
	ProcessTimeout  Reason = "process_timeout"
	KafkaFailure    Reason = "kafka_failure"
	InvalidMessage  Reason = "invalid_message"
	HandlerRejected Reason = "handler_rejected"
	DownstreamError Reason = "downstream_error"
	SystemOverload  Reason = "system_overload"
)

// Action is the suggested handling of a dead letter.
type Action string

// Suggested actions.
const (
	ActionAutoRetry    Action = "auto_retry"
	ActionDelayedRetry Action = "delayed_retry"
	ActionManualReview Action = "manual_review"
	ActionDiscard      Action = "discard"
	// ActionEscalate is not a row's action: recovery sets it on a
	// recoverable dead letter whose retries are exhausted.
	ActionEscalate Action = "escalate"
)

// Strategy names how the DLQ recovers dead letters of a reason.
type Strategy string

// Recovery strategies.
const (
	// StrategyBackoff retries after base × 2^retry, capped, up to the
	// reason's max retries.
	StrategyBackoff Strategy = "backoff"
	// StrategyAfterBlock is StrategyBackoff that also waits until the
	// user's rate-limit block ends: a retry inside the block would only be
	// refused again.
	StrategyAfterBlock Strategy = "after_block"
	// StrategyNever sends the dead letter to manual review: no retry can
	// fix it.
	StrategyNever Strategy = "never"
)

// BasePriority is the priority of a dead letter before its reason's and
// its user group's adjustments; priorities are clamped to
// [MinPriority, MaxPriority].
const (
	BasePriority = 5
	// VIPPriority is added for users of the "vip" group.
	VIPPriority = 3
	MinPriority = 1
	MaxPriority = 10
)

// DefaultMaxRetries applies to a reason the table does not know (a record
// written by a newer version) and recovery.max_retries does not name.
const DefaultMaxRetries = 3

// Row is everything the project knows about one reason.
type Row struct {
	Reason Reason
	// Recoverable is false when no retry can succeed.
	Recoverable bool
	// Priority is added to BasePriority (the priority rule).
	Priority int
	// Action is the suggested handling shown to operators.
	Action Action
	// Strategy is how the DLQ recovers it.
	Strategy Strategy
	// MaxRetries is the default of recovery.max_retries.<reason>.
	MaxRetries int
	// PastLimiter: the consumer gives the reason only after the rate
	// limiter admitted the message (it routes breaker → limiter → mailbox
	// → handler), so a re-injection of the letter was judged once already
	// and the limiter does not judge it again: no window slot, no
	// violation, no block (a user's recovered letters never block the
	// user). A reason the limiter or the breaker gives, or that may come
	// before them (an invalid record), is judged again at re-injection.
	PastLimiter bool
	// Doc says in a few words when the reason is given.
	Doc string
}

// table is the one list of reasons; keep it in the order of the reasons
// table in docs/operations.md.
var table = []Row{
	{RateLimited, true, -1, ActionDelayedRetry, StrategyAfterBlock, 5, false, "the user is over the rate limit of its group"},
	{UserBlocked, true, -3, ActionDelayedRetry, StrategyAfterBlock, 3, false, "the user is blocked by the rate limiter"},
	{CircuitOpen, true, 0, ActionDelayedRetry, StrategyBackoff, 5, false, "the user's circuit breaker is open after handler failures"},
	{QueueFull, true, 0, ActionDelayedRetry, StrategyBackoff, 5, true, "the user's mailbox is full"},
	{ProcessTimeout, true, 0, ActionAutoRetry, StrategyBackoff, 5, true, "the handler did not finish within processor.attempt_timeout"},
	{KafkaFailure, true, 0, ActionAutoRetry, StrategyBackoff, 3, false, "a Kafka write failed (not emitted today; accepted on the wire)"},
	{InvalidMessage, false, 0, ActionManualReview, StrategyNever, 0, false, "the payload is malformed or too large"},
	{HandlerRejected, false, 0, ActionManualReview, StrategyNever, 0, true, "the handler refused the message for good (Permanent): no retry can fix it"},
	{DownstreamError, true, 0, ActionAutoRetry, StrategyBackoff, 5, true, "the handler failed"},
	{SystemOverload, true, 0, ActionDelayedRetry, StrategyBackoff, 3, false, "the node is overloaded (not emitted today; accepted on the wire)"},
}

var byReason = func() map[Reason]Row {
	m := make(map[Reason]Row, len(table))
	for _, r := range table {
		if _, dup := m[r.Reason]; dup {
			panic("deadletter: reason " + string(r.Reason) + " twice in the table")
		}
		m[r.Reason] = r
	}
	return m
}()

// Reasons lists every known reason in table order, for metrics, the admin
// API and config defaults.
func Reasons() []Reason {
	out := make([]Reason, len(table))
	for i, r := range table {
		out[i] = r.Reason
	}
	return out
}

// Rows returns a copy of the table.
func Rows() []Row { return append([]Row(nil), table...) }

// Lookup returns the row of r; ok is false for a reason the table lacks.
func Lookup(r Reason) (row Row, ok bool) {
	row, ok = byReason[r]
	return row, ok
}

// Known reports whether r is in the table.
func (r Reason) Known() bool {
	_, ok := byReason[r]
	return ok
}

// Parse returns s as a Reason, or an error listing the known ones.
func Parse(s string) (Reason, error) {
	if r := Reason(s); r.Known() {
		return r, nil
	}
	return "", fmt.Errorf("unknown dead-letter reason %q (known: %s)", s, strings.Join(Names(), ", "))
}

// Names lists every known reason as strings, in table order.
func Names() []string {
	out := make([]string, len(table))
	for i, r := range table {
		out[i] = string(r.Reason)
	}
	return out
}

// DefaultMaxRetriesByName is the default of recovery.max_retries: one entry
// per known reason.
func DefaultMaxRetriesByName() map[string]int {
	m := make(map[string]int, len(table))
	for _, r := range table {
		m[string(r.Reason)] = r.MaxRetries
	}
	return m
}

// IsRecoverable reports whether a retry of r can succeed; a reason the
// table lacks is assumed recoverable (a newer writer's transient reason).
func IsRecoverable(r Reason) bool {
	if row, ok := byReason[r]; ok {
		return row.Recoverable
	}
	return true
}

// PastLimiter reports whether r is given only after the rate limiter
// admitted the message (Row.PastLimiter); false for a reason the table
// lacks: a letter of it is judged again.
func PastLimiter(r Reason) bool { return byReason[r].PastLimiter }

// CalculatePriority applies the priority rule: BasePriority, plus
// VIPPriority for the "vip" group, plus the reason's adjustment, clamped
// to [MinPriority, MaxPriority].
func CalculatePriority(group string, r Reason) int {
	p := BasePriority
	if group == "vip" {
		p += VIPPriority
	}
	p += byReason[r].Priority
	return min(max(p, MinPriority), MaxPriority)
}

// SuggestAction returns the row's action; a reason the table lacks gets
// ActionAutoRetry.
func SuggestAction(r Reason) Action {
	if row, ok := byReason[r]; ok {
		return row.Action
	}
	return ActionAutoRetry
}

// StrategyOf returns the row's recovery strategy; a reason the table lacks
// gets StrategyBackoff.
func StrategyOf(r Reason) Strategy {
	if row, ok := byReason[r]; ok {
		return row.Strategy
	}
	return StrategyBackoff
}
