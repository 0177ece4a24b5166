package chatmsg

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"time"

	"github.com/kfpipe/kfpipe/internal/deadletter"
)

// The record of the DLQ topic. The consumer builds it from the main-topic
// record it gives up on (NewDeadLetter), the DLQ producer writes it, the
// DLQ consumer indexes it, the console and kfpipectl show it: one shape
// from the consumer to the index.

// Header is one Kafka header. Values are bytes because Kafka headers are;
// JSON carries them as base64.
type Header struct {
	Key   string `json:"key"`
	Value []byte `json:"value"`
}

// DeadLetter is one record of the DLQ topic: the original message
// kept whole, why it failed, where it came from and how to recover it.
type DeadLetter struct {
	// ID is stable for a source record (see DeadLetterID): re-sending or re-reading
	// the same dead letter never creates a second index entry. A retried
	// message carries it (HeaderDLQID), so when it fails again its
	// new record keeps the ID and updates the same entry.
	ID string `json:"id"`
	// Event is empty for a dead letter; the DLQ's own records of what
	// became of it name theirs (package dlq: EventRetried, …).
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
	Original *ChatMessage `json:"original_message,omitempty"`
	// OriginalKey is the main-topic record key.
	OriginalKey []byte `json:"original_key,omitempty"`
	// OriginalHeaders are the main-topic record headers.
	OriginalHeaders []Header `json:"original_headers,omitempty"`

	Reason      deadletter.Reason `json:"failure_reason"`
	Details     string            `json:"failure_details"`
	FailureTime time.Time         `json:"failure_time"`
	ProcessorID string            `json:"processor_id,omitempty"`
	NodeID      string            `json:"node_id,omitempty"`
	// HandlerAttempts is how many times the consumer ran the handler
	// before it gave up (0: it never ran, e.g. a refusal of the limiter).
	HandlerAttempts int `json:"handler_attempts,omitempty"`

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

	SuggestedAction deadletter.Action `json:"suggested_action"`
	ManualReview    bool              `json:"manual_review"`
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
	// Decoded is Value decoded, when the caller has it (the consumer
	// does for every record it could decode); nil: NewDeadLetter parses
	// Value.
	Decoded *ChatMessage
}

// NewDeadLetter builds the dead letter of src failing with reason at now. It parses
// the payload when it can (a malformed one is kept raw), takes the user
// from the payload or the key, and copies retry_count from the headers so
// a retried message that fails again counts towards its max retries.
func NewDeadLetter(src Source, reason deadletter.Reason, details string, now time.Time) *DeadLetter {
	dl := &DeadLetter{
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
	m := src.Decoded
	if m == nil {
		// Unmarshal without Validate: a message missing a field is still
		// worth showing parsed; invalidity is what Reason says.
		if err := json.Unmarshal(src.Value, &m); err != nil {
			m = nil
		}
	}
	if m != nil {
		dl.Original = m
		if m.ExternalUserID != "" {
			dl.UserID = m.ExternalUserID
		}
		dl.OpenKfID, dl.UpstreamMsgID = m.OpenKfID, m.UpstreamMsgID
	}
	for _, h := range src.Headers {
		switch h.Key {
		case HeaderDLQID:
			// A retried message that failed again: its letter's ID, so
			// the new record updates that letter (one letter a message).
			if len(h.Value) > 0 && len(h.Value) <= 64 {
				dl.ID = string(h.Value)
			}
		case HeaderRetryCount:
			if n, err := strconv.Atoi(string(h.Value)); err == nil && n >= 0 {
				dl.RetryCount = n
			}
		case HeaderOpenKfID:
			if dl.OpenKfID == "" {
				dl.OpenKfID = string(h.Value)
			}
		case HeaderUpstreamMsgID:
			if dl.UpstreamMsgID == "" {
				dl.UpstreamMsgID = string(h.Value)
			}
		}
	}
	dl.Recoverable = deadletter.IsRecoverable(reason)
	dl.Priority = deadletter.CalculatePriority(dl.UserGroup, reason)
	dl.SuggestedAction = deadletter.SuggestAction(reason)
	dl.ManualReview = !dl.Recoverable
	if dl.ID == "" {
		dl.ID = dl.stableID()
	}
	return dl
}

// DeadLetterID returns the stable ID of the dead letter of a source record: the same
// topic/partition/offset always yields the same ID, so a consumer that
// re-processes a record after a crash and dead-letters it again, or a
// replayed emergency record, lands on the same index entry.
func DeadLetterID(topic string, partition int32, offset int64) string {
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
func (dl *DeadLetter) stableID() string {
	if dl.SourceTopic != "" {
		return DeadLetterID(dl.SourceTopic, dl.SourcePartition, dl.SourceOffset)
	}
	h := sha256.New()
	h.Write([]byte("nosource\x00"))
	h.Write(dl.OriginalValue)
	h.Write([]byte("\x00" + string(dl.Reason) + "\x00" + dl.UserID + "\x00"))
	h.Write([]byte(dl.FailureTime.UTC().Format(time.RFC3339Nano)))
	return hex.EncodeToString(h.Sum(nil)[:12])
}

// EnsureID sets ID from the source coordinates when it is empty.
func (dl *DeadLetter) EnsureID() {
	if dl.ID == "" {
		dl.ID = dl.stableID()
	}
}

// Key is the Kafka key of the dead letter: the user, so one user's dead
// letters stay in order in one partition.
func (dl *DeadLetter) Key() []byte {
	if dl.UserID != "" {
		return []byte(dl.UserID)
	}
	return dl.OriginalKey
}
