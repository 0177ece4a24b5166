// Package kfpipetest unit-tests a kfpipe.Handler: builders for every kind
// of inbound message and event (Text, MenuClick, ServicerText,
// EnterSession, …), and a Harness that runs the handler in-process the way
// the consumer does — attempts, in-place retries, Permanent, dead letters
// — with kfpipe's real reply path (each reply claimed, sent and marked
// done exactly once per message) over an in-memory Redis and a fake WeChat
// that applies WeChat's rules (5 replies per customer message, welcome
// codes valid once, session states). Every Reply, Welcome and Transfer is
// recorded in order, and RunTwice checks the rule exactly-once replies
// rest on: a handler run again for a message replies the same way.
//
// A customer's media (ImageWith, FileWith, MediaWith) is served by the fake
// WeChat and kept in a temporary media store before the handler runs, so
// kfpipe.OpenMedia works in a test.
//
// FailNext makes the fake WeChat answer an errcode to the next calls of an
// API (a reply, a transfer, a media download or upload): how a handler
// meets WeChat busy (-1), throttling (45009), a stale token (40014) or a
// human holding the session (95018). ExpectNoReplies checks that a
// message got no reply of any kind.
//
// Nothing is started outside the test process; no Kafka, Redis or network
// is needed.
package kfpipetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe"
	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/deadletter"
	"github.com/kfpipe/kfpipe/internal/history"
	"github.com/kfpipe/kfpipe/internal/media"
	"github.com/kfpipe/kfpipe/internal/reply"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
	"github.com/kfpipe/kfpipe/kf"
)

// Reply kinds (Reply.Kind): which of kfpipe's exactly-once calls made the
// reply.
const (
	// KindReply is kfpipe.Reply (send_msg); a long kf.Text split into
	// parts is one KindReply per part.
	KindReply = "reply"
	// KindWelcome is kfpipe.Welcome (send_msg_on_event with an
	// enter_session's welcome_code).
	KindWelcome = "welcome"
	// KindTransfer is kfpipe.Transfer (service_state/trans): Reply.State
	// and Reply.Servicer say what it asked for; Message is nil.
	KindTransfer = "transfer"
	// KindEventMessage is kfpipe.SendEventMessage (send_msg_on_event with
	// the msg_code a Transfer returned).
	KindEventMessage = "event_message"
)

// Reply outcomes (Reply.Outcome), as kfpipe_replies_total{outcome} counts
// them, and what the call returned to the handler.
const (
	// Sent: WeChat accepted it; the call returned nil.
	Sent = "sent"
	// Skipped: an earlier attempt or Run already sent this reply of the
	// message (the same number); nothing was sent, the call returned nil
	// (and a Transfer the earlier run's msg_code).
	Skipped = "skipped"
	// Refused: WeChat refused it for good; the call returned a
	// kfpipe.Permanent error. A routine refusal also matches
	// kfpipe.ErrReplyWindow (95001/95002), ErrSessionEnded (95013) or
	// ErrWelcomeCodeExpired (95017): a handler that returns it finishes
	// the message (Done), any other Permanent error dead-letters it.
	Refused = "refused"
	// Failed: it failed in a way a retry may fix (WeChat busy after the
	// client's own retries, the network, the reply store); the call
	// returned an error the handler returns, and the message is retried.
	Failed = "failed"
	// ServicerSession: WeChat refused it with 95018 because a human
	// servicer holds the session; the call returned
	// kfpipe.ErrServicerSession, which finishes the message (Done) when
	// the handler returns it.
	ServicerSession = "servicer_session"
)

// Reply is one Reply, Welcome, Transfer or SendEventMessage the handler
// made, in any attempt.
type Reply struct {
	// Kind is KindReply, KindWelcome, KindTransfer or KindEventMessage.
	Kind string
	// N is the reply's number in its handler call (0, 1, …): kfpipe sends
	// a message's n-th reply once.
	N int
	// Message is what Reply, Welcome and SendEventMessage sent (kf.Text,
	// kf.Menu, kf.Image, …); nil for a Transfer.
	Message kf.Message
	// State and Servicer are what Transfer asked for.
	State    kf.State
	Servicer string
	// Outcome is Sent, Skipped, Refused, Failed or ServicerSession; Err
	// the error the call returned to the handler (nil when Sent or
	// Skipped).
	Outcome string
	Err     error
	// Attempt is the handler call (1, 2, … within one Run) that made it.
	Attempt int
}

// Text returns a text reply's content ("" for other replies).
func (r Reply) Text() string {
	if t, ok := r.Message.(kf.Text); ok {
		return t.Content
	}
	return ""
}

// String describes the reply: `reply kf.Text{Content:"hi"}`,
// `transfer to state 3 (alice)`.
func (r Reply) String() string {
	if r.Kind == KindTransfer {
		return fmt.Sprintf("transfer to state %d (%s)", r.State, r.Servicer)
	}
	return fmt.Sprintf("%s %#v", r.Kind, r.Message)
}

// same reports whether two replies ask for the same thing.
func (r Reply) same(o Reply) bool {
	return r.Kind == o.Kind && reflect.DeepEqual(r.Message, o.Message) && r.State == o.State && r.Servicer == o.Servicer
}

// Outcome is what the consumer does with a message after handling it.
type Outcome string

// Outcomes of Result.
const (
	// Done: an attempt returned nil; the message is finished.
	Done Outcome = "done"
	// DeadLettered: the message went to the dead-letter queue with
	// Result.Reason.
	DeadLettered Outcome = "dead_lettered"
)

// Dead-letter reasons (Result.Reason), as the consumer records them.
const (
	ReasonHandlerRejected = string(deadletter.HandlerRejected) // the handler returned Permanent (or a WeChat refusal retrying cannot fix)
	ReasonDownstreamError = string(deadletter.DownstreamError) // every attempt failed
	ReasonProcessTimeout  = string(deadletter.ProcessTimeout)  // the last attempt timed out
	// ReasonInvalidMessage is the consumer's reason for a record that
	// cannot be decoded or is too large, before any handler sees it; the
	// harness hands the handler built messages, so it never gives it. A
	// Permanent error is ReasonHandlerRejected.
	ReasonInvalidMessage = string(deadletter.InvalidMessage)
)

// Result is what one Run did with a message.
type Result struct {
	// Message is the message Run handled; for RunBatch, the batch's
	// first message (the key of its replies), and Batch the whole batch.
	Message *kfpipe.Message
	Batch   []*kfpipe.Message
	// Outcome is Done or DeadLettered; Reason says why it was
	// dead-lettered.
	Outcome Outcome
	Reason  string
	// Attempts is how many times the handler was called; more than one
	// means the message was retried in place.
	Attempts int
	// Err is the last attempt's error (nil when Done).
	Err error
	// Replies are the replies every attempt made, in order.
	Replies []Reply

	t TB
}

// Retried reports whether the handler was called more than once.
func (r *Result) Retried() bool { return r.Attempts > 1 }

// Permanent reports whether the handler's error was marked
// kfpipe.Permanent, or is a WeChat refusal retrying cannot fix (the
// message is dead-lettered at once as handler_rejected).
func (r *Result) Permanent() bool { return kfpipe.IsPermanent(r.Err) }

// LastCall returns the replies of the last attempt: what a handler call
// that ran to its end replied.
func (r *Result) LastCall() []Reply {
	var out []Reply
	for _, rp := range r.Replies {
		if rp.Attempt == r.Attempts {
			out = append(out, rp)
		}
	}
	return out
}

// Texts returns the contents of the text replies of the last attempt, in
// order.
func (r *Result) Texts() []string {
	var out []string
	for _, rp := range r.LastCall() {
		if rp.Kind != KindTransfer && rp.Text() != "" {
			out = append(out, rp.Text())
		}
	}
	return out
}

// ExpectDone fails the test unless the message was finished (a handler
// call returned nil).
func (r *Result) ExpectDone() *Result {
	r.t.Helper()
	if r.Outcome != Done {
		r.t.Fatalf("kfpipetest: message %s: %s (%s) after %d attempt(s), want done; last error: %v", r.Message.UpstreamMsgID,
			r.Outcome, r.Reason, r.Attempts, r.Err)
	}
	return r
}

// ExpectPermanent fails the test unless the handler returned a
// kfpipe.Permanent error (or a WeChat refusal retrying cannot fix), so the
// message was dead-lettered at once as handler_rejected
// (ReasonHandlerRejected).
func (r *Result) ExpectPermanent() *Result {
	r.t.Helper()
	if !r.Permanent() || r.Outcome != DeadLettered || r.Reason != ReasonHandlerRejected || r.Attempts != 1 {
		r.t.Fatalf("kfpipetest: message %s: %s after %d attempt(s) with error %v, want dead-lettered at once by a Permanent error",
			r.Message.UpstreamMsgID, r.Outcome, r.Attempts, r.Err)
	}
	return r
}

// ExpectRetried fails the test unless the handler failed at least once
// and a retry then finished the message.
func (r *Result) ExpectRetried() *Result {
	r.t.Helper()
	if r.Outcome != Done || r.Attempts < 2 {
		r.t.Fatalf("kfpipetest: message %s: %s after %d attempt(s) (last error %v), want done after a retry",
			r.Message.UpstreamMsgID, r.Outcome, r.Attempts, r.Err)
	}
	return r
}

// ExpectDeadLettered fails the test unless the message was dead-lettered
// with reason (any reason when "").
func (r *Result) ExpectDeadLettered(reason string) *Result {
	r.t.Helper()
	if r.Outcome != DeadLettered || (reason != "" && r.Reason != reason) {
		r.t.Fatalf("kfpipetest: message %s: %s (%s) after %d attempt(s), want dead-lettered (%s); last error: %v",
			r.Message.UpstreamMsgID, r.Outcome, r.Reason, r.Attempts, reason, r.Err)
	}
	return r
}

// ExpectTexts fails the test unless the last attempt's text replies are
// exactly texts, in order. It looks at text replies only: a Transfer or
// an image is not a text; ExpectNoReplies checks for no reply of any
// kind.
func (r *Result) ExpectTexts(texts ...string) *Result {
	r.t.Helper()
	if got := r.Texts(); !reflect.DeepEqual(got, texts) && (len(got) != 0 || len(texts) != 0) {
		r.t.Fatalf("kfpipetest: message %s: text replies %q, want %q (all replies: %v)", r.Message.UpstreamMsgID, got, texts,
			r.Replies)
	}
	return r
}

// TB is the part of testing.TB the Harness uses; *testing.T and
// *testing.B are TBs.
type TB interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// Option configures a Harness.
type Option func(*Harness)

// Attempts sets how many times a failing message is handled before it is
// dead-lettered (processor.retry_attempts; default 3).
func Attempts(n int) Option { return func(h *Harness) { h.attempts = n } }

// AttemptTimeout bounds each handler call (processor.attempt_timeout;
// default 10 s).
func AttemptTimeout(d time.Duration) Option { return func(h *Harness) { h.timeout = d } }

// Harness runs one handler against an in-memory Redis and a fake WeChat.
// Run it from one goroutine.
type Harness struct {
	t        TB
	h        kfpipe.Handler
	bh       kfpipe.BatchHandler // NewBatch's
	attempts int
	timeout  time.Duration
	fake     *wecomtest.Server
	kc       *kf.Client
	fx       *reply.Effects
	keeper   *media.Keeper
	maxMedia int64
	history  *history.Memory // what kfpipe.History serves (history.go)

	mu      sync.Mutex
	attempt int     // the running handler call's number within its Run
	cur     []Reply // the running Run's replies
	all     []Reply
	seen    map[string]bool
}

// New returns a Harness that runs h; it is torn down when the test ends.
func New(t TB, h kfpipe.Handler, opts ...Option) *Harness {
	t.Helper()
	hs := &Harness{t: t, h: h, attempts: 3, timeout: 10 * time.Second, seen: map[string]bool{}}
	for _, o := range opts {
		o(hs)
	}
	if hs.attempts < 1 || hs.timeout <= 0 {
		t.Fatalf("kfpipetest: Attempts must be at least 1 and AttemptTimeout positive (got %d, %v)", hs.attempts, hs.timeout)
	}
	mini := miniredis.NewMiniRedis()
	if err := mini.Start(); err != nil {
		t.Fatalf("kfpipetest: in-memory Redis: %v", err)
	}
	t.Cleanup(mini.Close)
	rdb := redis.NewClient(&redis.Options{Addr: mini.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	hs.fake = wecomtest.New(wecomtest.Options{Accounts: []string{OpenKfID}})
	t.Cleanup(hs.fake.Close)
	kc, err := kf.New(kf.Config{BaseURL: hs.fake.URL(), CorpID: hs.fake.CorpID(), Secret: hs.fake.Secret()})
	if err != nil {
		t.Fatalf("kfpipetest: %v", err)
	}
	hs.kc = kc
	if hs.keeper, err = hs.newKeeper(); err != nil {
		t.Fatalf("kfpipetest: %v", err)
	}
	hs.fx = reply.New(kc, nil, reply.WithObserver(hs.observe),
		reply.WithSessions(reply.NewSessions(rdb, "kfpipetest:", 0)))
	return hs
}

// observe records a reply of the running handler call.
func (hs *Harness) observe(a reply.Attempt) {
	r := Reply{Kind: a.What, N: a.N, Outcome: a.Outcome, Err: a.Err}
	switch c := a.Content.(type) {
	case kf.Message:
		r.Message = c
	case reply.Transfer:
		r.State, r.Servicer = c.State, c.Servicer
	}
	hs.mu.Lock()
	defer hs.mu.Unlock()
	r.Attempt = hs.attempt
	hs.cur = append(hs.cur, r)
	hs.all = append(hs.all, r)
}

// Client is a kf client of the fake WeChat, for what a test prepares
// there (UploadMedia before a handler replies with an image).
func (hs *Harness) Client() *kf.Client { return hs.kc }

// Replies returns every reply of every Run so far, in order.
func (hs *Harness) Replies() []Reply {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	return append([]Reply(nil), hs.all...)
}

// Delivered returns the text of every message the fake WeChat delivered to
// user, in order (text replies only; other types as "<msgtype>"): what the
// customer saw.
func (hs *Harness) Delivered(user string) []string {
	var out []string
	for _, d := range hs.fake.Replies(OpenKfID, user) {
		var body struct {
			Content string `json:"content"`
		}
		if d.MsgType == "text" && json.Unmarshal(d.Body, &body) == nil {
			out = append(out, body.Content)
		} else {
			out = append(out, "<"+d.MsgType+">")
		}
	}
	return out
}

// SessionState returns user's session state at the fake WeChat (0
// untreated … 3 with a servicer, 4 ended).
func (hs *Harness) SessionState(user string) kf.State {
	return kf.State(hs.fake.SessionState(OpenKfID, user))
}

// SetSessionState sets user's session state at the fake WeChat without an
// event (Run a SessionStatusChange to change it the way WeChat announces
// it): kf.StateServicer with servicer makes replies answer 95018.
func (hs *Harness) SetSessionState(user string, state kf.State, servicer string) {
	hs.fake.SetSessionState(OpenKfID, user, int(state), servicer)
}

// Run handles m as the consumer does: the handler is called, an error is
// retried in place up to Attempts times, a Permanent error dead-letters
// the message at once (handler_rejected). Each call gets a reply context of its own, as after
// a crash or a redelivery: replies an earlier call or Run already sent for
// m are skipped, not sent again. The first Run of a message shows it to
// the fake WeChat (a customer's message opens their reply window, an
// enter_session event's welcome_code becomes valid).
func (hs *Harness) Run(m *kfpipe.Message) *Result {
	hs.t.Helper()
	return hs.run([]*kfpipe.Message{m})
}

// NewBatch returns a Harness that runs the batch handler bh
// (kfpipe.NewBatchConsumer) with RunBatch; Run hands it a batch of one.
func NewBatch(t TB, bh kfpipe.BatchHandler, opts ...Option) *Harness {
	t.Helper()
	if bh == nil {
		t.Fatalf("kfpipetest: NewBatch needs a batch handler")
	}
	hs := New(t, nil, opts...)
	hs.bh = bh
	return hs
}

// RunBatch handles msgs, one user's consecutive messages, as a batch
// consumer does: the batch handler is called with them, an error is
// retried in place up to Attempts times, then every message is
// dead-lettered (Permanent: at once). The replies are keyed by the first
// message, as in the consumer: a RunBatch again with the same first
// message (a re-run after a crash) skips the replies already sent.
func (hs *Harness) RunBatch(msgs ...*kfpipe.Message) *Result {
	hs.t.Helper()
	if hs.bh == nil {
		hs.t.Fatalf("kfpipetest: RunBatch needs a Harness made by NewBatch")
	}
	if len(msgs) == 0 {
		hs.t.Fatalf("kfpipetest: RunBatch needs at least one message")
	}
	return hs.run(msgs)
}

func (hs *Harness) run(msgs []*kfpipe.Message) *Result {
	hs.t.Helper()
	for _, m := range msgs {
		if m == nil || len(m.Raw) == 0 || m.UpstreamMsgID == "" {
			hs.t.Fatalf("kfpipetest: Run needs a message with Raw and UpstreamMsgID: build it with kfpipetest.Text, EnterSession, …")
		}
		if m.ExternalUserID != msgs[0].ExternalUserID {
			hs.t.Fatalf("kfpipetest: a batch is one user's messages: %s and %s", msgs[0].ExternalUserID, m.ExternalUserID)
		}
	}
	hs.mu.Lock()
	hs.cur = nil
	hs.mu.Unlock()
	for _, m := range msgs {
		hs.show(m)
	}
	return hs.handle(msgs)
}

// show shows m to the fake WeChat the first time it is run.
func (hs *Harness) show(m *kfpipe.Message) {
	hs.mu.Lock()
	first := !hs.seen[m.UpstreamMsgID]
	hs.seen[m.UpstreamMsgID] = true
	hs.mu.Unlock()
	if first {
		hs.fake.Append(m.OpenKfID, m.Raw)
		if ev, ok := m.Event(); ok && ev.Type == kfpipe.EventSessionStatusChange {
			// The change the event announces has happened at WeChat.
			switch ev.ChangeType {
			case wecomtest.ChangeEnded:
				hs.fake.SetSessionState(m.OpenKfID, m.ExternalUserID, int(kf.StateEnded), "")
			default:
				hs.fake.SetSessionState(m.OpenKfID, m.ExternalUserID, int(kf.StateServicer), ev.NewServicerUserID)
			}
		}
	}
}

// chatOf is m as the consumer reads it.
func chatOf(m *kfpipe.Message) *chatmsg.ChatMessage {
	return &chatmsg.ChatMessage{MessageID: m.ID, UpstreamMsgID: m.UpstreamMsgID, OpenKfID: m.OpenKfID,
		ExternalUserID: m.ExternalUserID, MsgType: m.MsgType, Origin: m.Origin, ServicerUserID: m.ServicerUserID,
		SendTime: m.SendTime.Unix(), Content: m.Raw}
}

// handle calls the handler for msgs until it succeeds, fails for good
// or runs out of attempts.
func (hs *Harness) handle(msgs []*kfpipe.Message) *Result {
	m := msgs[0]
	c := chatOf(m)
	res := &Result{Message: m, t: hs.t}
	if hs.bh != nil {
		res.Batch = msgs
	}
	for res.Attempts < hs.attempts {
		res.Attempts++
		hs.mu.Lock()
		hs.attempt = res.Attempts
		hs.mu.Unlock()
		to := reply.TargetOf(c)
		for _, b := range msgs {
			hs.fx.Observe(context.Background(), chatOf(b)) // a session_status_change drops the cached state
		}
		err, timedOut := hs.call(hs.withHistory(media.WithKeeper(reply.With(context.Background(), hs.fx, to), hs.keeper), msgs), msgs)
		// A routine refusal of a reply (kfpipe.ErrReplyWindow, …) the
		// handler returns finishes the message, as in the consumer.
		err = hs.fx.Settle(to, err)
		res.Err = err
		switch {
		case err == nil:
			res.Outcome = Done
		case kfpipe.IsPermanent(err):
			res.Outcome, res.Reason = DeadLettered, ReasonHandlerRejected
		case res.Attempts == hs.attempts:
			res.Outcome, res.Reason = DeadLettered, ReasonDownstreamError
			if timedOut {
				res.Reason = ReasonProcessTimeout
			}
		default:
			continue
		}
		break
	}
	hs.mu.Lock()
	res.Replies = hs.cur
	hs.cur = nil
	hs.mu.Unlock()
	return res
}

// call runs one attempt, bounded by the attempt timeout; a panic is a
// failed attempt, as in the consumer.
func (hs *Harness) call(ctx context.Context, msgs []*kfpipe.Message) (err error, timedOut bool) {
	ctx, cancel := context.WithTimeout(ctx, hs.timeout)
	defer cancel()
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("kfpipetest: the handler panicked: %v", p)
		}
		timedOut = err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded)
	}()
	for _, m := range msgs {
		if err := hs.keepMedia(ctx, m); err != nil {
			return err, false
		}
	}
	if hs.bh != nil {
		return hs.bh.HandleBatch(ctx, msgs), false
	}
	return hs.h.Handle(ctx, msgs[0]), false
}

// RunTwice runs m, then runs it again as the consumer would after a crash
// between the replies and the message's done mark, and fails the test
// when the second run's replies differ from the first's — in number, kind
// or content — naming the first reply that differs and its position.
// kfpipe sends a message's n-th reply once: a second run's different reply
// at a position already sent is skipped (and counted in
// kfpipe_reply_mismatch_total), an extra one is sent, a missing one leaves
// the customer with the first run's. A handler must therefore reply only
// from the message and from state a second run sees the same.
func (hs *Harness) RunTwice(m *kfpipe.Message) (first, second *Result) {
	hs.t.Helper()
	first = hs.Run(m)
	second = hs.Run(m)
	if msg := compareRuns(first.LastCall(), second.LastCall()); msg != "" {
		hs.t.Errorf("kfpipetest: the handler replied differently when it ran again for message %s (%s from %s): %s",
			m.UpstreamMsgID, m.MsgType, m.ExternalUserID, msg)
	}
	return first, second
}

// compareRuns describes the first difference between two runs' replies
// ("" when they agree).
func compareRuns(a, b []Reply) string {
	for i := 0; i < len(a) || i < len(b); i++ {
		switch {
		case i >= len(b):
			return fmt.Sprintf("reply %d (%s) was made on the first run only; the second run made %d replies", i, a[i], len(b))
		case i >= len(a):
			return fmt.Sprintf("reply %d (%s) was made on the second run only: it would reach the customer as an extra reply", i, b[i])
		case !a[i].same(b[i]):
			return fmt.Sprintf("reply %d was %s on the first run and %s on the second: the second is skipped, the customer only ever sees the first",
				i, a[i], b[i])
		}
	}
	return ""
}

// Mismatches returns how many replies the real reply path skipped because
// an earlier run made a different reply at their position
// (kfpipe_reply_mismatch_total in a consumer).
func (hs *Harness) Mismatches() int { return hs.fx.Mismatches() }
