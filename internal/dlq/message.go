// Package dlq owns the dead-letter side of the pipeline (I6):
// the DLQ record's wire form (chatmsg.DeadLetter: Encode, Decode), the DLQ producer with its fsync'd
// emergency file and replayer, the DLQ consumer that indexes the topic into
// Redis, the recovery strategies, and the scheduler that sends due retries
// back to the main topic.
//
// The DLQ topic is the source of truth; the Redis index is a view that
// Rebuild can recreate from the topic. Retries that the scheduler sent are
// recorded in the topic too (an event record, see EventRetried), so a
// rebuild does not send them a second time; so are purges (EventPurged) and
// moves to review or back to due (EventMoved), so a rebuild does not bring
// purged entries back and puts moved ones where they were.
package dlq

import (
	"encoding/json"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/deadletter"
)

// Reason says why a message left the main flow; the table of reasons
// (recoverable, priority, action, strategy, default max retries) is owned
// by package deadletter.
type Reason = deadletter.Reason

// Failure reasons, as named in package deadletter. Every refusal or failure
// of the consumer maps to one (I6).
const (
	ReasonRateLimited     = deadletter.RateLimited
	ReasonUserBlocked     = deadletter.UserBlocked
	ReasonCircuitOpen     = deadletter.CircuitOpen
	ReasonQueueFull       = deadletter.QueueFull
	ReasonProcessTimeout  = deadletter.ProcessTimeout
	ReasonKafkaFailure    = deadletter.KafkaFailure
	ReasonInvalidMessage  = deadletter.InvalidMessage
	ReasonHandlerRejected = deadletter.HandlerRejected
	ReasonDownstreamError = deadletter.DownstreamError
	ReasonSystemOverload  = deadletter.SystemOverload
)

// Reasons lists every known reason, for metrics and the admin API.
var Reasons = deadletter.Reasons()

// Action is the suggested handling of a dead letter.
type Action = deadletter.Action

// Suggested actions.
const (
	ActionAutoRetry    = deadletter.ActionAutoRetry
	ActionDelayedRetry = deadletter.ActionDelayedRetry
	ActionManualReview = deadletter.ActionManualReview
	ActionDiscard      = deadletter.ActionDiscard
	ActionEscalate     = deadletter.ActionEscalate
)

// Event kinds carried by records of the DLQ topic. A plain dead letter has
// no event; EventRetried records that the scheduler re-injected the dead
// letter with the same ID into the main topic (Attempts says how often), so
// that a rebuilt index does not schedule it again.
const (
	EventRetried = "retried"
	// EventPurged records that an operator purged the entry from the index
	// (admin API), so that a rebuilt index does not bring it back.
	EventPurged = "purged"
	// EventMoved records that the entry was moved into manual review
	// (ManualReview set: the scheduler gave up, or an operator) or requeued
	// for a retry at NextRetryTime (an operator's retry), so that a rebuilt
	// index has it where it was.
	EventMoved = "moved"
	// EventDone records that the message of a retried letter is done (its
	// retry was processed), so that a rebuilt index shows it done.
	EventDone = "done"
)

// Header names on DLQ records.
const (
	HeaderReason = "failure_reason"
	HeaderUser   = "user_id"
	HeaderSource = "source"
	HeaderDLQID  = "dlq_id"
	HeaderEvent  = "dlq_event"
)

// IsRecoverable reports whether a retry of r can succeed (the reason
// table; unknown reasons are assumed recoverable).
func IsRecoverable(r Reason) bool { return deadletter.IsRecoverable(r) }

// CalculatePriority is the reason table's priority rule: 5, +3 for VIP
// users, plus the reason's adjustment (-3 blocked, -1 rate-limited),
// clamped to [1, 10].
func CalculatePriority(group string, r Reason) int { return deadletter.CalculatePriority(group, r) }

// SuggestAction maps a reason to the action an operator would take (the
// reason table).
func SuggestAction(r Reason) Action { return deadletter.SuggestAction(r) }

// Encode returns the wire form of dl.
func Encode(dl *chatmsg.DeadLetter) ([]byte, error) { return json.Marshal(dl) }

// Decode parses a DLQ record value.
func Decode(b []byte) (*chatmsg.DeadLetter, error) {
	var dl chatmsg.DeadLetter
	if err := json.Unmarshal(b, &dl); err != nil {
		return nil, err
	}
	return &dl, nil
}
