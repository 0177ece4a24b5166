// Package outcome records what became of each message a schedule-consumer
// handled — handled, or recovered when it came back from the DLQ — and
// every reply its handler sent (sent, refused, skipped because a human
// servicer holds the session), as one Kafka record per handler call on
// archive.outcomes_topic, keyed by user. The archiver reads that topic
// beside the main topic and the DLQ topic (docs/architecture.md, "The
// conversation archive"), so the archive holds the whole conversation:
// the customer's and servicers' messages, the bot's replies, and each
// message's fate.
package outcome

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/kfpipe/kfpipe/kf"
)

// Outcomes of a message (Record.Outcome).
const (
	// Handled: the handler returned success (a routine refusal of its
	// reply included: the reply says so).
	Handled = "handled"
	// Recovered: a message the DLQ re-injected was handled.
	Recovered = "recovered"
)

// Record is one handler call's outcome for one message, and the replies
// the call made (on the first message of a batch call).
type Record struct {
	V        int    `json:"v"`
	MsgID    string `json:"msgid"`
	OpenKfID string `json:"open_kfid"`
	User     string `json:"external_userid"`
	// SendTime is the message's send_time (Unix seconds).
	SendTime int64 `json:"send_time"`
	// Retry is the message's retry count (how often the DLQ re-injected it).
	Retry int `json:"retry,omitempty"`
	// Outcome is Handled or Recovered; "" when the call failed (its dead
	// letter says why) and the record only carries the replies it sent.
	Outcome string `json:"outcome,omitempty"`
	// At is when the call ended.
	At      time.Time `json:"at"`
	Replies []Reply   `json:"replies,omitempty"`
}

// Reply is one reply of a handler call.
type Reply struct {
	// N is the reply's number in the call (its key with the message's).
	N int `json:"n"`
	// What is "reply", "welcome", "transfer" or "event_message".
	What string `json:"what"`
	// Outcome is the reply's: "sent", "skipped" (an earlier run sent it),
	// "refused" or "servicer_session" (95018: a human servicer holds the
	// session). Failed replies are not recorded: the message is retried.
	Outcome string `json:"outcome"`
	// WeChatMsgID is the msgid the reply was sent to WeChat with.
	WeChatMsgID string `json:"wechat_msgid,omitempty"`
	// MsgType and Content are the reply as WeChat's message item
	// (kf.Item), or a transfer's target.
	MsgType string          `json:"msgtype,omitempty"`
	Content json.RawMessage `json:"content,omitempty"`
	// Error is a refusal's error.
	Error string    `json:"error,omitempty"`
	At    time.Time `json:"at"`
}

// Decode reads a record of the outcomes topic.
func Decode(b []byte) (*Record, error) {
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// Sink is told of each reply a handler call makes.
type Sink func(Reply)

type sinkKey struct{}

// WithSink returns ctx whose replies are also told to f (after the sinks
// ctx already has).
func WithSink(ctx context.Context, f Sink) context.Context {
	prev, _ := ctx.Value(sinkKey{}).([]Sink)
	return context.WithValue(ctx, sinkKey{}, append(prev[:len(prev):len(prev)], f))
}

// Replied tells the sinks of ctx of a reply: what, its number n, its
// outcome and content (a kf.Message, or any value JSON can hold), the
// WeChat msgid and error. A failed reply is not told.
func Replied(ctx context.Context, what string, n int, result string, content any, wechatMsgID string, err error) {
	sinks, _ := ctx.Value(sinkKey{}).([]Sink)
	if len(sinks) == 0 || result == "failed" {
		return
	}
	r := Reply{N: n, What: what, Outcome: result, WeChatMsgID: wechatMsgID, At: time.Now().UTC()}
	switch c := content.(type) {
	case nil:
	case kf.Message:
		r.MsgType, r.Content, _ = kf.Item(c)
	default:
		r.MsgType = what
		r.Content, _ = json.Marshal(c)
	}
	if err != nil && result != "sent" && result != "skipped" {
		r.Error = err.Error()
	}
	for _, f := range sinks {
		f(r)
	}
}

// collector gathers a call's replies.
type collector struct {
	mu      sync.Mutex
	replies []Reply
}

func (c *collector) add(r Reply) {
	c.mu.Lock()
	c.replies = append(c.replies, r)
	c.mu.Unlock()
}

func (c *collector) take() []Reply {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.replies
}
