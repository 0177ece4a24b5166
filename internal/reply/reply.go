// Package reply runs a handler's replies to the customer (send_msg,
// send_msg_on_event, service_state/trans) as exactly-once effects: each is
// claimed in Redis under (open_kfid, upstream msgid, reply number), sent
// with a WeChat msgid derived from the same key, and marked done (package
// once), so a handler that runs again for a message does not reply twice.
// The public functions kfpipe.Reply, Welcome and Transfer and the webhook
// answers of the http handler go through Do; the demo uses it directly.
package reply

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/consumer"
	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/once"
	"github.com/kfpipe/kfpipe/internal/wecom"
	"github.com/kfpipe/kfpipe/kf"
)

// ErrNoReplier is returned by Do outside a handler that Wrap wrapped, or
// when the consumer's configuration has no wecom.corp_id and wecom.secret.
var ErrNoReplier = errors.New("kfpipe: replies need a handler run by RunConsumer with wecom.corp_id and wecom.secret configured")

// TTL is how long a reply's done mark lives: as long as a message's
// (dedup.ttl's default), so a re-run of the handler within WeChat's 3-day
// re-pull window never sends it again.
const TTL = 4 * 24 * time.Hour

// Effects sends replies through one WeChat client under one claim store.
type Effects struct {
	once    *once.Client
	kf      *kf.Client
	outcome *prometheus.CounterVec
	counts  [len(outcomes)]atomic.Int64
}

// outcomes label kfpipe_replies_total, in Counts' order.
var outcomes = [...]string{"sent", "skipped", "refused", "failed"}

func (fx *Effects) count(i int) {
	fx.counts[i].Add(1)
	fx.outcome.WithLabelValues(outcomes[i]).Inc()
}

// New builds Effects on the given claim store and client; reg (nil: none)
// gets kfpipe_replies_total{outcome}.
func New(oc *once.Client, kc *kf.Client, reg prometheus.Registerer) *Effects {
	fx := &Effects{once: oc, kf: kc, outcome: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kfpipe_replies_total",
		Help: "Replies (send_msg, welcome messages, session transfers) by outcome: sent, skipped (already sent for this message: a re-run handler), refused (a WeChat refusal that retrying cannot fix), failed (retried with the message).",
	}, []string{"outcome"})}
	for _, o := range outcomes {
		fx.outcome.WithLabelValues(o)
	}
	if reg != nil {
		reg.MustRegister(fx.outcome)
	}
	return fx
}

// FromConfig builds the consumer's Effects from its configuration and
// daemon: nil (replies answer ErrNoReplier) without WeChat credentials.
// The access token is cached in Redis beside kf-producer's.
func FromConfig(ctx context.Context, cfg *config.Consumer, base *daemon.Base) (*Effects, func(), error) {
	if cfg.WeCom.CorpID == "" || cfg.WeCom.Secret == "" {
		return nil, func() {}, nil
	}
	kc, err := kf.New(kf.Config{BaseURL: cfg.WeCom.BaseURL, CorpID: cfg.WeCom.CorpID, Secret: cfg.WeCom.Secret,
		Timeout: cfg.WeCom.RequestTimeout, Tokens: wecom.NewRedisTokenCache(base.Redis, cfg.Redis.KeyPrefix)})
	if err != nil {
		return nil, nil, fmt.Errorf("wecom: %w", err)
	}
	oc, err := once.New(ctx, "replies", once.Config{Client: base.Redis, KeyPrefix: cfg.Redis.KeyPrefix + "reply:",
		Lease: cfg.Dedup.Lease, Batch: once.BatchConfig{Enabled: true}}, once.WithLogger(base.Log))
	if err != nil {
		return nil, nil, fmt.Errorf("replies: %w", err)
	}
	return New(oc, kc, base.Registry), func() { _ = oc.Close() }, nil
}

// Counts returns the replies counted so far by outcome.
func (fx *Effects) Counts() (sent, skipped, refused, failed int) {
	return int(fx.counts[0].Load()), int(fx.counts[1].Load()), int(fx.counts[2].Load()), int(fx.counts[3].Load())
}

// Target is the message being answered.
type Target struct {
	OpenKfID, UpstreamMsgID, User string
	// WelcomeCode is an enter_session event's code ("" otherwise).
	WelcomeCode string
}

// TargetOf returns the Target of a consumed message.
func TargetOf(c *chatmsg.ChatMessage) Target {
	t := Target{OpenKfID: c.OpenKfID, UpstreamMsgID: c.UpstreamMsgID, User: c.ExternalUserID}
	if c.MsgType == "event" {
		t.WelcomeCode = welcomeCode(c.Content)
	}
	return t
}

// state is one handler call's replies, carried in its context.
type state struct {
	fx *Effects
	to Target
	mu sync.Mutex
	n  int // replies made so far in this call: the next reply's number
}

type stateKey struct{}

// With returns ctx carrying a fresh reply state for a call about to.
func With(ctx context.Context, fx *Effects, to Target) context.Context {
	return context.WithValue(ctx, stateKey{}, &state{fx: fx, to: to})
}

// Wrap gives each call of h a context that carries its reply state.
func Wrap(h consumer.Handler, fx *Effects) consumer.Handler {
	return consumer.HandlerFunc(func(ctx context.Context, c *chatmsg.ChatMessage) error {
		return h.Handle(With(ctx, fx, TargetOf(c)), c)
	})
}

// Send is one reply's call to WeChat with the msgid to give it.
type Send func(ctx context.Context, kc *kf.Client, to Target, msgID string) error

// Do runs send once for the reply number this call has reached: its key is
// (open_kfid, upstream msgid, number), so a handler that runs again for
// the same message and replies the same way finds each reply done. A
// refusal of WeChat that retrying cannot fix is returned as Permanent.
func Do(ctx context.Context, what string, send Send) error {
	s, _ := ctx.Value(stateKey{}).(*state)
	if s == nil || s.fx == nil {
		return ErrNoReplier
	}
	s.mu.Lock()
	n := s.n
	s.n++
	s.mu.Unlock()
	to := s.to
	key := to.OpenKfID + ":" + to.UpstreamMsgID + ":" + strconv.Itoa(n)
	st, err := s.fx.once.DoStatus(ctx, key, TTL, func(ctx context.Context) error {
		return send(ctx, s.fx.kf, to, kf.MsgID(to.OpenKfID, to.UpstreamMsgID, n))
	})
	switch {
	case err == nil && st == once.StatusDuplicate:
		s.fx.count(1)
		return nil
	case err == nil:
		s.fx.count(0)
		return nil
	case kf.IsPermanent(err):
		// The 5-in-48h window, an ended session, an unknown user: retrying
		// the message cannot change WeChat's answer.
		s.fx.count(2)
		return consumer.Permanent(fmt.Errorf("%s: %w", what, err))
	default:
		s.fx.count(3)
		return fmt.Errorf("%s: %w", what, err)
	}
}

// welcomeCode reads an enter_session event's welcome_code from WeChat's
// item ("" when there is none).
func welcomeCode(item []byte) string {
	var m struct {
		Event struct {
			Type string `json:"event_type"`
			Code string `json:"welcome_code"`
		} `json:"event"`
	}
	if json.Unmarshal(item, &m) != nil || m.Event.Type != "enter_session" {
		return ""
	}
	return m.Event.Code
}
