// Package dlq owns the dead-letter side of the pipeline (I6):
// the DeadLetterMessage wire format, the DLQ producer with its fsync'd
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
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"time"

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

// Header is one Kafka header. Values are bytes because Kafka headers are;
// JSON carries them as base64.
type Header struct {
	Key   string `json:"key"`
	Value []byte `json:"value"`
}

// DeadLetterMessage is one record of the DLQ topic: the original message
// kept whole, why it failed, where it came from and how to recover it.
type DeadLetterMessage struct {
	// ID is stable for a source record (see ID): re-sending or re-reading
	// the same dead letter never creates a second index entry. A retried
	// message carries it (chatmsg.HeaderDLQID), so when it fails again its
	// new record keeps the ID and updates the same entry.
	ID string `json:"id"`
	// Event is empty for a dead letter; see EventRetried.
	Event string `json:"event,omitempty"`
	// Attempts counts re-injections by the scheduler; set on event records.
	Attempts int `json:"attempts,omitempty"`
	// AttemptsSeen is set on an EventMoved record: the entry's attempts
	// when it was moved. The move is stale, and not applied, once the
	// entry has been re-injected since (its attempts are higher): the
	// index consumes its own events after the live index changed, and a
	// late move must not put a re-injected letter back in due. Absent on
	// records written before it existed (applied as before).
	AttemptsSeen *int `json:"attempts_seen,omitempty"`

	// OriginalValue is the main-topic record value byte for byte, so even
	// a payload we cannot parse is kept (base64 in JSON).
	OriginalValue []byte `json:"original_value"`
	// Original is OriginalValue parsed, when it parses.
	Original *chatmsg.ChatMessage `json:"original_message,omitempty"`
	// OriginalKey is the main-topic record key.
	OriginalKey []byte `json:"original_key,omitempty"`
	// OriginalHeaders are the main-topic record headers.
	OriginalHeaders []Header `json:"original_headers,omitempty"`

	Reason      Reason    `json:"failure_reason"`
	Details     string    `json:"failure_details"`
	FailureTime time.Time `json:"failure_time"`
	ProcessorID string    `json:"processor_id,omitempty"`
	NodeID      string    `json:"node_id,omitempty"`

	// RetryCount is how many times this message already came back from
	// the DLQ (the consumer copies it from the retry_count header).
	RetryCount    int        `json:"retry_count"`
	LastRetryTime *time.Time `json:"last_retry_time,omitempty"`
	NextRetryTime *time.Time `json:"next_retry_time,omitempty"`

	SourceTopic     string    `json:"source_topic"`
	SourcePartition int32     `json:"source_partition"`
	SourceOffset    int64     `json:"source_offset"`
	SourceTimestamp time.Time `json:"source_timestamp"`

	UserID        string `json:"user_id"`
	UserGroup     string `json:"user_group,omitempty"`
	OpenKfID      string `json:"open_kfid,omitempty"`
	SessionID     string `json:"session_id,omitempty"`
	UpstreamMsgID string `json:"upstream_msgid,omitempty"`

	Recoverable bool `json:"recoverable"`
	Priority    int  `json:"priority"`
	MaxRetries  int  `json:"max_retries"`
	// TTL is how long the dead letter is kept in the index (nanoseconds
	// in JSON, as time.Duration); ExpiresAt = FailureTime + TTL.
	TTL       time.Duration `json:"ttl"`
	ExpiresAt time.Time     `json:"expires_at"`

	SuggestedAction Action `json:"suggested_action"`
	ManualReview    bool   `json:"manual_review"`
}

// Source is the main-topic record that failed.
type Source struct {
	Topic     string
	Partition int32
	Offset    int64
	Timestamp time.Time
	Key       []byte
	Value     []byte
	Headers   []Header
}

// New builds a dead letter for src failing with reason at now. It parses
// the payload when it can (a malformed one is kept raw), takes the user
// from the payload or the key, and copies retry_count from the headers so
// a retried message that fails again counts towards its max retries.
func New(src Source, reason Reason, details string, now time.Time) *DeadLetterMessage {
	dl := &DeadLetterMessage{
		OriginalValue:   src.Value,
		OriginalKey:     src.Key,
		OriginalHeaders: src.Headers,
		Reason:          reason,
		Details:         details,
		FailureTime:     now,
		SourceTopic:     src.Topic,
		SourcePartition: src.Partition,
		SourceOffset:    src.Offset,
		SourceTimestamp: src.Timestamp,
		UserID:          string(src.Key),
	}
	var m chatmsg.ChatMessage
	// Unmarshal without Validate: a message missing a field is still
	// worth showing parsed; invalidity is what Reason says.
	if json.Unmarshal(src.Value, &m) == nil {
		dl.Original = &m
		if m.ExternalUserID != "" {
			dl.UserID = m.ExternalUserID
		}
		dl.OpenKfID, dl.UpstreamMsgID = m.OpenKfID, m.UpstreamMsgID
	}
	for _, h := range src.Headers {
		switch h.Key {
		case chatmsg.HeaderDLQID:
			// A retried message that failed again: its letter's ID, so
			// the new record updates that letter (one letter a message).
			if len(h.Value) > 0 && len(h.Value) <= 64 {
				dl.ID = string(h.Value)
			}
		case chatmsg.HeaderRetryCount:
			if n, err := strconv.Atoi(string(h.Value)); err == nil && n >= 0 {
				dl.RetryCount = n
			}
		case chatmsg.HeaderOpenKfID:
			if dl.OpenKfID == "" {
				dl.OpenKfID = string(h.Value)
			}
		case chatmsg.HeaderUpstreamMsgID:
			if dl.UpstreamMsgID == "" {
				dl.UpstreamMsgID = string(h.Value)
			}
		}
	}
	dl.Recoverable = IsRecoverable(reason)
	dl.Priority = CalculatePriority(dl.UserGroup, reason)
	dl.SuggestedAction = SuggestAction(reason)
	dl.ManualReview = !dl.Recoverable
	if dl.ID == "" {
		dl.ID = dl.stableID()
	}
	return dl
}

// ID returns the stable ID of the dead letter of a source record: the same
// topic/partition/offset always yields the same ID, so a consumer that
// re-processes a record after a crash and dead-letters it again, or a
// replayed emergency record, lands on the same index entry.
func ID(topic string, partition int32, offset int64) string {
	h := sha256.New()
	h.Write([]byte(topic))
	var b [13]byte
	b[0] = 0
	binary.BigEndian.PutUint32(b[1:5], uint32(partition))
	binary.BigEndian.PutUint64(b[5:], uint64(offset))
	h.Write(b[:])
	return hex.EncodeToString(h.Sum(nil)[:12])
}

// stableID derives the ID from the source coordinates, or, for a dead
// letter without a source, from its content (still stable for re-sends).
func (dl *DeadLetterMessage) stableID() string {
	if dl.SourceTopic != "" {
		return ID(dl.SourceTopic, dl.SourcePartition, dl.SourceOffset)
	}
	h := sha256.New()
	h.Write([]byte("nosource\x00"))
	h.Write(dl.OriginalValue)
	h.Write([]byte("\x00" + string(dl.Reason) + "\x00" + dl.UserID + "\x00"))
	h.Write([]byte(dl.FailureTime.UTC().Format(time.RFC3339Nano)))
	return hex.EncodeToString(h.Sum(nil)[:12])
}

// EnsureID sets ID from the source coordinates when it is empty.
func (dl *DeadLetterMessage) EnsureID() {
	if dl.ID == "" {
		dl.ID = dl.stableID()
	}
}

// Key is the Kafka key of the dead letter: the user, so one user's dead
// letters stay in order in one partition.
func (dl *DeadLetterMessage) Key() []byte {
	if dl.UserID != "" {
		return []byte(dl.UserID)
	}
	return dl.OriginalKey
}

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
func Encode(dl *DeadLetterMessage) ([]byte, error) { return json.Marshal(dl) }

// Decode parses a DLQ record value.
func Decode(b []byte) (*DeadLetterMessage, error) {
	var dl DeadLetterMessage
	if err := json.Unmarshal(b, &dl); err != nil {
		return nil, err
	}
	return &dl, nil
}
