package kfpipe

import (
	"context"
	"errors"

	"github.com/kfpipe/kfpipe/internal/reply"
	"github.com/kfpipe/kfpipe/kf"
)

// ErrNoReplier is returned by Reply, Welcome and Transfer outside a
// handler run by RunConsumer, or when the consumer's configuration has no
// wecom.corp_id and wecom.secret.
var ErrNoReplier = reply.ErrNoReplier

// WeChat's routine refusals of a reply, which a handler can test for with
// errors.Is: the 5-replies / 48-hours window (95001, 95002), an ended
// session (95013), a welcome_code or msg_code that expired or was used
// (95017), a session a human servicer holds (95018: ErrServicerSession,
// counted as its own reply outcome, servicer_session, and shown in the
// customer's timeline as a skipped reply). A
// handler that returns one (as a handler that just returns Reply's error
// does) finishes the message: the refusal is counted in
// kfpipe_reply_refusals_total{reason} and logged, not dead-lettered.
// Other refusals (an unknown user, a bad media_id…) are Permanent errors
// that dead-letter the message as handler_rejected.
var (
	ErrReplyWindow        = reply.ErrReplyWindow
	ErrSessionEnded       = reply.ErrSessionEnded
	ErrWelcomeCodeExpired = reply.ErrWelcomeCodeExpired
	ErrServicerSession    = reply.ErrServicerSession
)

// Reply sends msg to the customer of the message being handled, at most
// once per message however often the handler runs: the handler's n-th
// reply is sent once for that message. A handler that replies must reply
// the same way (the same number of replies, in the same order) when it
// runs again for a message: a different reply at a position an earlier run
// already sent is skipped all the same (the customer has the earlier one),
// counted in kfpipe_reply_mismatch_total and logged as a warning with the
// message's ids (kfpipetest's RunTwice finds this in a unit test). A
// refusal of WeChat that retrying cannot fix is returned as Permanent; the
// routine ones (ErrReplyWindow, ErrSessionEnded) also match their error.
//
// A kf.Text longer than WeChat's 2,048 bytes is split on UTF-8 character
// boundaries into numbered parts ("(1/3) …"), each a reply of its own
// (exactly once each, in order). WeChat takes at most 5 messages after a
// customer's message: a text that would need more parts than the replies
// this call has left of those 5 is refused as Permanent before any part is
// sent (a text cut short would read as a complete answer).
func Reply(ctx context.Context, msg kf.Message) error {
	if t, ok := msg.(kf.Text); ok && len(t.Content) > kf.MaxTextBytes {
		made, ok := reply.Made(ctx)
		if !ok {
			return ErrNoReplier
		}
		parts, err := kf.SplitText(t.Content, kf.MaxRepliesPerMessage-made)
		if err != nil {
			return Permanent(err)
		}
		for _, p := range parts {
			if err := reply1(ctx, kf.Text{Content: p}); err != nil {
				return err
			}
		}
		return nil
	}
	return reply1(ctx, msg)
}

func reply1(ctx context.Context, msg kf.Message) error {
	return reply.DoContent(ctx, "reply", msg, func(ctx context.Context, kc *kf.Client, to reply.Target, msgID string) error {
		_, err := kc.Send(ctx, to.OpenKfID, to.User, msgID, msg)
		return err
	})
}

// Welcome sends the welcome message of a session, for an enter_session
// event (its welcome_code is valid 20 seconds, and once), with the same
// exactly-once rule as Reply.
func Welcome(ctx context.Context, msg kf.Message) error {
	return reply.DoContent(ctx, "welcome", msg, func(ctx context.Context, kc *kf.Client, to reply.Target, msgID string) error {
		if to.WelcomeCode == "" {
			return Permanent(errors.New("the message is not an enter_session event with a welcome_code"))
		}
		_, err := kc.SendOnEvent(ctx, to.WelcomeCode, msgID, msg)
		return err
	})
}

// Transfer changes the customer's session state — kf.StateServicer with a
// servicer's userid hands the customer to a human, kf.StateQueue queues
// them, kf.StateEnded ends the session — with the same exactly-once rule.
// It returns WeChat's msg_code for the change ("" when WeChat gave none):
// SendEventMessage sends the message that belongs to it (valid 20
// seconds, once). A handler that runs again gets the msg_code of the run
// that made the transfer.
func Transfer(ctx context.Context, to kf.State, servicer string) (msgCode string, err error) {
	code, err := reply.DoResult(ctx, "transfer", reply.Transfer{State: to, Servicer: servicer}, func(ctx context.Context, kc *kf.Client, t reply.Target, _ string) (string, error) {
		return kc.TransServiceState(ctx, t.OpenKfID, t.User, to, servicer)
	})
	reply.ForgetSession(ctx)
	return code, err
}

// SendEventMessage sends the message of a change of session state (the
// hand-off to a human, the end of the session) with the msg_code Transfer
// returned, with the same exactly-once rule as Reply. Only kf.Text and
// kf.Menu are allowed. A msg_code that expired (20 seconds) or was used
// is ErrWelcomeCodeExpired, a routine refusal.
func SendEventMessage(ctx context.Context, msgCode string, msg kf.Message) error {
	return reply.DoContent(ctx, "event_message", msg, func(ctx context.Context, kc *kf.Client, _ reply.Target, msgID string) error {
		if msgCode == "" {
			return Permanent(errors.New("SendEventMessage needs the msg_code Transfer returned"))
		}
		_, err := kc.SendOnEvent(ctx, msgCode, msgID, msg)
		return err
	})
}

// Client returns the consumer's WeChat client, for the calls of the
// customer-service API a handler makes itself (UploadMedia before a
// kf.Image reply, Customers): ErrNoReplier outside a handler run by the
// consumer or without wecom.corp_id and wecom.secret. Its Send is not
// exactly-once: reply with Reply.
func Client(ctx context.Context) (*kf.Client, error) {
	kc, _, ok := reply.Client(ctx)
	if !ok {
		return nil, ErrNoReplier
	}
	return kc, nil
}

// SessionState returns the session state of the customer of the message
// being handled (kf.StateUntreated, StateBot, StateQueue, StateServicer
// with the servicer's userid, StateEnded), so a bot can stay quiet while a
// human serves. The consumer caches it in Redis per customer (WeChat's
// service_state/get is asked once); the customer's session_status_change
// event, a Transfer and a reply refused with 95018 drop the entry, and it
// expires after 5 minutes otherwise. The state a message's handler first
// read is kept with the message (as long as its reply marks), so a handler
// that runs again for it — after its own Transfer, say — reads the same
// state and replies the same way (see Reply).
func SessionState(ctx context.Context) (state kf.State, servicer string, err error) {
	return reply.SessionState(ctx)
}
