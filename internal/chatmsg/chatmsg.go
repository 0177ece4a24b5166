// Package chatmsg defines the record that travels on the main topic: the
// producer writes it, the consumer decodes it, the DLQ carries it. It is a
// leaf package so that producer, consumer and dlq share one wire format
// without depending on each other.
package chatmsg

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// Header names on main-topic records; the DLQ scheduler sets the retry ones
// on messages it sends back.
const (
	HeaderMsgType       = "msg_type"
	HeaderMsgID         = "msg_id"
	HeaderUpstreamMsgID = "upstream_msgid"
	HeaderOpenKfID      = "open_kfid"
	HeaderTimestamp     = "timestamp"
	// HeaderSendTime is WeChat's send_time (Unix seconds): the consumer's
	// rate limiter counts the customer's behaviour by it, not by when the
	// record happens to be processed.
	HeaderSendTime        = "send_time"
	HeaderRetryFromDLQ    = "retry_from_dlq"
	HeaderRetryCount      = "retry_count"
	HeaderOriginalFailure = "original_failure"
	// HeaderDLQID is the ID of the dead letter a retried message came
	// from: when it fails again, its new DLQ record updates that letter.
	HeaderDLQID = "dlq_id"
)

// ChatMessage is one customer-service message as produced to Kafka.
type ChatMessage struct {
	// MessageID is our Snowflake ID, new on every pull.
	MessageID int64 `json:"message_id,string"`
	// UpstreamMsgID and OpenKfID identify the message upstream; together
	// they are the dedup key (I3) because they survive re-pulls.
	UpstreamMsgID  string `json:"upstream_msgid"`
	OpenKfID       string `json:"open_kfid"`
	ExternalUserID string `json:"external_userid"`
	MsgType        string `json:"msg_type"`
	Origin         int    `json:"origin,omitempty"`
	ServicerUserID string `json:"servicer_userid,omitempty"`
	// SendTime is WeChat's send_time (Unix seconds).
	SendTime int64 `json:"send_time"`
	// ProducedAt is when kf-producer handed the record to Kafka (Unix ms);
	// the consumer measures end-to-end latency from it.
	ProducedAt int64 `json:"produced_at"`
	// Content is WeChat's message item exactly as received, so no message
	// type is ever lost for being unknown to us.
	Content json.RawMessage `json:"content,omitempty"`
}

// Errors returned by Decode; each means the payload goes to the DLQ as
// invalid_message (I7), never a crash loop.
var (
	// ErrMalformed is returned when the payload is not a JSON ChatMessage.
	ErrMalformed = errors.New("chatmsg: malformed payload")
	// ErrMissingField is returned when a required field is empty.
	ErrMissingField = errors.New("chatmsg: missing required field")
)

// Encode returns the wire form of m.
func Encode(m *ChatMessage) ([]byte, error) {
	return json.Marshal(m)
}

// Decode parses and checks a main-topic payload. It returns exactly what
// encoding/json's Unmarshal gives, faster for the form Encode writes.
func Decode(b []byte) (*ChatMessage, error) {
	m, err := decodeJSON(b)
	if err != nil {
		return nil, err
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return m, nil
}

// decodeJSON parses b without checking required fields.
func decodeJSON(b []byte) (*ChatMessage, error) {
	m := new(ChatMessage)
	if decodeFast(b, m) {
		return m, nil
	}
	*m = ChatMessage{}
	if err := json.Unmarshal(b, m); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return m, nil
}

// Validate checks the fields every consumer relies on.
func (m *ChatMessage) Validate() error {
	switch {
	case m.UpstreamMsgID == "":
		return fmt.Errorf("%w: upstream_msgid", ErrMissingField)
	case m.OpenKfID == "":
		return fmt.Errorf("%w: open_kfid", ErrMissingField)
	case m.ExternalUserID == "":
		return fmt.Errorf("%w: external_userid", ErrMissingField)
	}
	return nil
}

// DedupKey is the upstream identity of m (I3): stable across re-pulls.
func (m *ChatMessage) DedupKey() string {
	return m.OpenKfID + ":" + m.UpstreamMsgID
}

// Headers returns the Kafka headers for m as name/value pairs.
func (m *ChatMessage) Headers() [][2]string {
	return [][2]string{
		{HeaderMsgType, m.MsgType},
		{HeaderMsgID, strconv.FormatInt(m.MessageID, 10)},
		{HeaderUpstreamMsgID, m.UpstreamMsgID},
		{HeaderOpenKfID, m.OpenKfID},
		{HeaderTimestamp, strconv.FormatInt(m.ProducedAt, 10)},
		{HeaderSendTime, strconv.FormatInt(m.SendTime, 10)},
	}
}
