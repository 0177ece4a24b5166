// Package kfpipe is what a business team imports to answer WeChat Work
// customer-service (微信客服) messages with kfpipe: the Message a handler
// receives, the Handler it implements, middleware, replies that reach the
// customer exactly once, and RunConsumer, which runs the schedule-consumer
// daemon with that handler from the same config file the daemon reads.
//
// The consumer calls a Handler with one user's messages one at a time, in
// the order the user sent them, and different users' messages in
// parallel. nil finishes the message; an error is retried in place
// (processor.retry_attempts) and then dead-lettered and retried from the
// DLQ later; Permanent(err) dead-letters it at once. See docs/handlers.md.
//
// A reply (Reply, Welcome, Transfer) is an effect like any other: kfpipe
// claims it in Redis keyed by (open_kfid, upstream msgid, reply number),
// sends it to WeChat with a msgid derived from the same key, and marks it
// done, so a handler that runs again for the same message — a retry, a
// consumer crash, a rebalance, a DLQ recovery — does not send a reply
// twice. The one window left is a crash after WeChat accepted a reply and
// before its done mark was written; the resend then carries the same msgid
// (see docs/replies.md).
//
// Router routes messages to handlers by event type, menu item, keyword and
// message type, with middleware; Memo keeps a side step's result (an
// upload's media_id) with the message, so a handler that runs again
// replies the same way.
//
// NewConsumer and Run build the consumer in code from a Config (LoadConfig
// reads the daemons' file into one). Package kfpipetest unit-tests a
// handler in-process with the real reply path.
package kfpipe

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/handler"
)

// Message is one customer-service message or event, as kf-producer read it
// from WeChat's sync_msg: the handler's view of the record on the main
// topic, built once per delivery; its typed content is read the first
// time an accessor asks for it, and kept.
type Message struct {
	// ID is kfpipe's Snowflake ID, new each time WeChat's message is pulled.
	ID int64
	// UpstreamMsgID and OpenKfID identify the message at WeChat; together
	// they are its idempotency key (IdempotencyKey).
	UpstreamMsgID string
	OpenKfID      string
	// ExternalUserID is the customer.
	ExternalUserID string
	// MsgType is WeChat's msgtype: MsgText, MsgImage, … MsgEvent.
	MsgType string
	// Origin is who wrote it: OriginCustomer, OriginSystem (an event) or
	// OriginServicer. FromCustomer tells the messages a bot answers.
	Origin int
	// ServicerUserID is the servicer of a message a servicer sent.
	ServicerUserID string
	// SendTime is when the customer sent it (WeChat's send_time).
	SendTime time.Time
	// Raw is WeChat's message item exactly as received, whatever its
	// type; Text, MenuID, Event and Media read their content from it.
	Raw json.RawMessage
	// RetryFromDLQ is true when this delivery is a retry from the
	// dead-letter queue (an operator's or the DLQ consumer's), possibly
	// hours after the message was sent (Age); RetryCount is how many times
	// the message was put back from the DLQ (1 the first time).
	RetryFromDLQ bool
	RetryCount   int

	// content is Raw's typed content (Text, MenuID, Event, Media), read
	// once, by the first accessor that asks, in a Message the consumer
	// built; nil in a Message built by hand, whose Raw the accessors read
	// at each call.
	content *content
}

// content is what ParseBody makes of raw for msgType, made at most once
// (a handler that reads no content costs no parse).
type content struct {
	raw     json.RawMessage
	msgType string
	once    sync.Once
	body    chatmsg.Body
	err     error
}

// body is m's typed content: read once for the Message the consumer
// built, as long as Raw and MsgType are still the ones it was built with.
func (m *Message) body() (chatmsg.Body, error) {
	if c := m.content; c != nil && c.msgType == m.MsgType && len(c.raw) == len(m.Raw) &&
		(len(m.Raw) == 0 || &c.raw[0] == &m.Raw[0]) {
		c.once.Do(func() { c.body, c.err = chatmsg.ParseBody(c.msgType, c.raw) })
		return c.body, c.err
	}
	return chatmsg.ParseBody(m.MsgType, m.Raw)
}

// Age is how long ago the customer sent the message (SendTime): large for
// a DLQ retry or a backlog read after an outage. A welcome_code is valid
// 20 seconds after an enter_session; WeChat accepts replies within 48
// hours of the customer's last message.
func (m *Message) Age() time.Duration { return time.Since(m.SendTime) }

// IdempotencyKey is the message's identity at WeChat, stable across
// re-pulls, retries and redeliveries: "<open_kfid>:<upstream msgid>". A
// downstream system that stores it with an effect can drop a repeat.
func (m *Message) IdempotencyKey() string { return m.OpenKfID + ":" + m.UpstreamMsgID }

// FencingToken returns the token of the partition lease the handler runs
// under (ok false outside a handler). Each new owner of a customer's
// partition — another consumer after a crash or a rebalance — holds a
// larger token, so a downstream system that keeps the largest token it
// accepted per customer and refuses smaller ones cannot take an effect
// from an owner that lost the partition while it was paused. The HTTP
// handler sends it as Kfpipe-Fencing-Token.
func FencingToken(ctx context.Context) (token int64, ok bool) { return handler.FencingToken(ctx) }

// Text returns a text message's content (ok false for other types, and
// for a text message whose Raw carries no readable "text" object). A tap
// on a menu item comes back as a text message too; MenuID gives its item.
func (m *Message) Text() (content string, ok bool) {
	if m.MsgType != MsgText {
		return "", false
	}
	b, err := m.body()
	if err != nil || !b.HasText {
		return "", false
	}
	return b.Text, true
}

// MenuID returns the id of the menu item the customer tapped, when this
// text message answers a Menu ("" otherwise).
func (m *Message) MenuID() string {
	if m.MsgType != MsgText {
		return ""
	}
	b, err := m.body()
	if err != nil {
		return ""
	}
	return b.MenuID
}

// Event is an event message's content (MsgType "event").
type Event struct {
	// Type is WeChat's event_type: EventEnterSession, EventMsgSendFail,
	// EventSessionStatusChange, …
	Type string
	// OpenKfID and ExternalUserID are the account and the customer the
	// event concerns (also in Message.OpenKfID and ExternalUserID).
	OpenKfID       string
	ExternalUserID string
	// ServicerUserID is the servicer of a servicer_status_change.
	ServicerUserID string
	// WelcomeCode is enter_session's code for the welcome message
	// (Welcome), valid 20 seconds.
	WelcomeCode string
	// Scene and SceneParam say where the customer came from
	// (enter_session).
	Scene      string
	SceneParam string
	// ChangeType, OldServicerUserID and NewServicerUserID describe a
	// session_status_change: 1 a servicer took the session from the queue,
	// 2 it was transferred, 3 a servicer ended it, 4 it was reopened.
	ChangeType        int
	OldServicerUserID string
	NewServicerUserID string
	// MsgCode is a session_status_change's code for the message about
	// the change (SendEventMessage), valid 20 seconds, once.
	MsgCode string
	// FailMsgID and FailType describe a msg_send_fail: the msgid of the
	// message that was not delivered and WeChat's reason code.
	FailMsgID string
	FailType  int
	// Status is a servicer_status_change's new status: 1 on duty, 2 off.
	Status int
	// RecallMsgID is the msgid of the message a user_recall_msg or
	// servicer_recall_msg recalled.
	RecallMsgID string
}

// Event returns an event message's content (ok false for other types, and
// for an event message whose Raw carries no readable "event" object).
func (m *Message) Event() (Event, bool) {
	if m.MsgType != MsgEvent {
		return Event{}, false
	}
	b, err := m.body()
	if err != nil || !b.HasEvent {
		return Event{}, false
	}
	return Event(b.Event), true
}

// Location is a location message's content (MsgType "location"): a place
// the customer shared.
type Location struct {
	Latitude, Longitude float64
	Name, Address       string
}

// Location returns a location message's content (ok false for other
// types, and for a location message whose Raw carries no readable
// "location" object).
func (m *Message) Location() (Location, bool) {
	if m.MsgType != MsgLocation {
		return Location{}, false
	}
	b, err := m.body()
	if err != nil || !b.HasLocation {
		return Location{}, false
	}
	return Location(b.Location), true
}

// fromChat is the handler's view of the record c: the one copy between
// Kafka and a handler. Its typed content is read later, once, if asked.
func fromChat(c *chatmsg.ChatMessage) *Message {
	m := &Message{ID: c.MessageID, UpstreamMsgID: c.UpstreamMsgID, OpenKfID: c.OpenKfID,
		ExternalUserID: c.ExternalUserID, MsgType: c.MsgType, Origin: c.Origin, ServicerUserID: c.ServicerUserID,
		SendTime: time.Unix(c.SendTime, 0), Raw: c.Content}
	m.content = &content{raw: m.Raw, msgType: m.MsgType}
	return m
}

// Handler handles one message. It must be safe for concurrent use (other
// users' messages) and return when ctx ends (each attempt is bounded by
// processor.attempt_timeout).
type Handler interface {
	Handle(ctx context.Context, m *Message) error
}

// HandlerFunc is a function used as a Handler.
type HandlerFunc func(ctx context.Context, m *Message) error

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, m *Message) error { return f(ctx, m) }

// Permanent marks err as a failure that retrying cannot fix: the message
// is dead-lettered at once (reason handler_rejected: the handler refused it
// for good) instead of retried.
func Permanent(err error) error { return handler.Permanent(err) }

// IsPermanent reports whether err (or an error it wraps) is permanent:
// marked with Permanent, or a WeChat refusal from the kf client that
// retrying cannot fix (kf.IsPermanent).
func IsPermanent(err error) bool { return handler.IsPermanent(err) }

// Middleware wraps a Handler with behaviour of its own (logging, timeouts,
// metrics), as in Watermill's message router.
type Middleware func(Handler) Handler

// Chain returns h wrapped in mw: the first middleware is the outermost, so
// Chain(h, a, b) runs a, then b, then h, and their after-parts in reverse.
func Chain(h Handler, mw ...Middleware) Handler {
	for i := len(mw) - 1; i >= 0; i-- {
		h = mw[i](h)
	}
	return h
}

// Timeout bounds each call of the handler to d (on top of the consumer's
// processor.attempt_timeout).
func Timeout(d time.Duration) Middleware {
	return func(next Handler) Handler {
		return HandlerFunc(func(ctx context.Context, m *Message) error {
			ctx, cancel := context.WithTimeout(ctx, d)
			defer cancel()
			return next.Handle(ctx, m)
		})
	}
}

// Logging calls logf after each message with the message, the error (nil
// on success) and how long the handler took.
func Logging(logf func(m *Message, err error, took time.Duration)) Middleware {
	return func(next Handler) Handler {
		return HandlerFunc(func(ctx context.Context, m *Message) error {
			start := time.Now()
			err := next.Handle(ctx, m)
			logf(m, err, time.Since(start))
			return err
		})
	}
}
