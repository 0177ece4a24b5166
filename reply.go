package kfpipe

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/kfpipe/kfpipe/internal/once"
	"github.com/kfpipe/kfpipe/kf"
)

// ErrNoReplier is returned by Reply, Welcome and Transfer outside a
// handler run by RunConsumer, or when the consumer's configuration has no
// wecom.corp_id and wecom.secret.
var ErrNoReplier = errors.New("kfpipe: replies need a handler run by RunConsumer with wecom.corp_id and wecom.secret configured")

// replyTTL is how long a reply's done mark lives: as long as a message's
// (dedup.ttl's default), so a re-run of the handler within WeChat's 3-day
// re-pull window never sends it again.
const replyTTL = 4 * 24 * time.Hour

// effects runs the replies of one handler call as exactly-once effects.
type effects struct {
	once *once.Client
	kf   *kf.Client
}

// replier is one message's reply state, carried in the handler's context.
type replier struct {
	fx *effects
	m  *Message
	mu sync.Mutex
	n  int // replies made so far in this call: the next reply's number
}

type replierKey struct{}

func withReplier(ctx context.Context, fx *effects, m *Message) context.Context {
	return context.WithValue(ctx, replierKey{}, &replier{fx: fx, m: m})
}

// replierOf returns the reply state the consumer put in ctx.
func replierOf(ctx context.Context) (*replier, error) {
	r, _ := ctx.Value(replierKey{}).(*replier)
	if r == nil || r.fx == nil {
		return nil, ErrNoReplier
	}
	return r, nil
}

// effect runs send once for the reply number this call has reached: its
// key is (open_kfid, upstream msgid, number), so a handler that runs again
// for the same message and replies the same way finds each reply done.
func (r *replier) effect(ctx context.Context, what string, send func(ctx context.Context, msgID string) error) error {
	r.mu.Lock()
	n := r.n
	r.n++
	r.mu.Unlock()
	key := r.m.OpenKfID + ":" + r.m.UpstreamMsgID + ":" + strconv.Itoa(n)
	err := r.fx.once.Do(ctx, key, replyTTL, func(ctx context.Context) error {
		return send(ctx, kf.MsgID(r.m.OpenKfID, r.m.UpstreamMsgID, n))
	})
	if err == nil {
		return nil
	}
	if kf.IsPermanent(err) {
		// The 5-in-48h window, an ended session, an unknown user: retrying
		// the message cannot change WeChat's answer.
		return Permanent(fmt.Errorf("%s: %w", what, err))
	}
	return fmt.Errorf("%s: %w", what, err)
}

// Reply sends msg to the customer of the message being handled, at most
// once per message however often the handler runs: the handler's n-th
// reply is sent once for that message. A handler that replies must reply
// the same way (the same number of replies, in the same order) when it
// runs again for a message. A refusal of WeChat that retrying cannot fix
// is returned as Permanent.
func Reply(ctx context.Context, msg kf.Message) error {
	r, err := replierOf(ctx)
	if err != nil {
		return err
	}
	return r.effect(ctx, "reply", func(ctx context.Context, msgID string) error {
		_, err := r.fx.kf.Send(ctx, r.m.OpenKfID, r.m.ExternalUserID, msgID, msg)
		return err
	})
}

// Welcome sends the welcome message of a session, for an enter_session
// event (its welcome_code is valid 20 seconds, and once), with the same
// exactly-once rule as Reply.
func Welcome(ctx context.Context, msg kf.Message) error {
	r, err := replierOf(ctx)
	if err != nil {
		return err
	}
	ev, ok := r.m.Event()
	if !ok || ev.WelcomeCode == "" {
		return Permanent(errors.New("welcome: the message is not an enter_session event with a welcome_code"))
	}
	return r.effect(ctx, "welcome", func(ctx context.Context, msgID string) error {
		_, err := r.fx.kf.SendOnEvent(ctx, ev.WelcomeCode, msgID, msg)
		return err
	})
}

// Transfer changes the customer's session state — kf.StateServicer with a
// servicer's userid hands the customer to a human, kf.StateQueue queues
// them, kf.StateEnded ends the session — with the same exactly-once rule.
func Transfer(ctx context.Context, to kf.State, servicer string) error {
	r, err := replierOf(ctx)
	if err != nil {
		return err
	}
	return r.effect(ctx, "transfer", func(ctx context.Context, _ string) error {
		_, err := r.fx.kf.TransServiceState(ctx, r.m.OpenKfID, r.m.ExternalUserID, to, servicer)
		return err
	})
}
