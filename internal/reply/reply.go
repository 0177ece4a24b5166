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
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/handler"
	"github.com/kfpipe/kfpipe/internal/outcome"
	"github.com/kfpipe/kfpipe/internal/overload"
	statestore "github.com/kfpipe/kfpipe/internal/state"
	"github.com/kfpipe/kfpipe/internal/wecom"
	"github.com/kfpipe/kfpipe/kf"
)

// ErrNoReplier is returned by Do outside a handler that Wrap wrapped, or
// when the consumer's configuration has no wecom.corp_id and wecom.secret.
var ErrNoReplier = errors.New("kfpipe: replies need a handler run by RunConsumer with wecom.corp_id and wecom.secret configured")

// Routine refusals: WeChat refusing a reply for a reason that is part of
// ordinary chat, not a fault of the message or the handler. DoContent's
// error wraps one of them (and the kf.Error); a handler that returns it
// finishes the message (Settle) instead of dead-lettering it.
var (
	ErrReplyWindow        = errors.New("kfpipe: WeChat refused the reply: 5 replies were sent since the customer's last message, or it is 48 hours old (95001, 95002)")
	ErrSessionEnded       = errors.New("kfpipe: WeChat refused the reply: the session has ended (95013)")
	ErrWelcomeCodeExpired = errors.New("kfpipe: WeChat refused the welcome message: its welcome_code expired (20 s) or was used (95017)")
	ErrServicerSession    = errors.New("kfpipe: WeChat refused the reply: a human servicer holds the session (95018)")
)

// refusals are the routine refusals: WeChat's errcodes, the error a reply
// returns, the reason label of kfpipe_reply_refusals_total.
var refusals = []struct {
	codes  []int
	err    error
	reason string
}{
	{[]int{kf.CodeReplyLimit, kf.CodeReplyWindowClosed}, ErrReplyWindow, "reply_window"},
	{[]int{kf.CodeSessionEnded}, ErrSessionEnded, "session_ended"},
	{[]int{kf.CodeWelcomeCodeUsed}, ErrWelcomeCodeExpired, "welcome_code_expired"},
	{[]int{kf.CodeSessionInvalid}, ErrServicerSession, RefusalServicerSession},
}

// RefusalServicerSession is the reason (kfpipe_reply_refusals_total) and
// the reply outcome (kfpipe_replies_total) of a reply WeChat refused with
// 95018 because a human servicer holds the session: the bot stays out of
// the conversation, the message is finished, not dead-lettered.
const RefusalServicerSession = "servicer_session"

// routine returns the error of WeChat's routine refusal err (nil for any
// other error).
func routine(err error) error {
	var e *kf.Error
	if !errors.As(err, &e) {
		return nil
	}
	for _, r := range refusals {
		if slices.Contains(r.codes, e.Code) {
			return r.err
		}
	}
	return nil
}

// TTL is how long a reply's done mark lives: as long as a message's
// (dedup.ttl's default, the DLQ's retry horizon), so a re-run of the
// handler — a re-pulled copy within WeChat's 3 days, or a letter retried
// within the DLQ's 7 — never sends it again.
const TTL = 7 * 24 * time.Hour

// Effects sends replies through one WeChat client. Each reply is recorded
// in the reply log of the handler's context (handler.ReplyLogOf: the
// partition's lease, beside the message's done marks), or in a log of its
// own when the handler runs without one.
type Effects struct {
	own        *handler.MemReplyLog // the log of calls whose context has none
	recording  sync.Map             // reply key → record: sent, its record not written yet (claim.go)
	legacy     *legacyReplies       // the old reply claims, read during the switch-over
	kf         *kf.Client
	outcome    *prometheus.CounterVec
	counts     [len(outcomes)]atomic.Int64
	mismatch   prometheus.Counter
	mismatches atomic.Int64
	settled    *prometheus.CounterVec
	log        *zap.Logger
	observe    func(Attempt)
	sessions   *Sessions
	// limit bounds the replies in flight to WeChat and is cut by its
	// throttles (nil: none; WithLimiter).
	limit *overload.Limiter
	// sendTimeout is the WeChat client's request timeout: the least a
	// send is given once it started (claim.go).
	sendTimeout time.Duration
}

// MaxRepliesInFlight bounds the replies a consumer has in flight to
// WeChat at once (the adaptive limit starts at 10 and moves between 1 and
// it): WeChat answers 45033 to too many concurrent calls.
const MaxRepliesInFlight = 64

// WithLimiter bounds the replies in flight to WeChat with l, the same
// adaptive limit the consumer puts on its handler calls (package
// overload): WeChat's throttles (45009, 45011, 45033) cut it, so a
// throttled WeChat gets fewer calls, not a retry from every handler at
// once. A reply beyond it waits for a slot.
func WithLimiter(l *overload.Limiter) Option { return func(fx *Effects) { fx.limit = l } }

// defaultSendTimeout is kf.Config.Timeout's default.
const defaultSendTimeout = 5 * time.Second

// WithSendTimeout tells Effects the WeChat client's request timeout
// (kf.Config.Timeout; default 5s): a reply's send that started is given at
// least this long, whatever is left of the partition's lease.
func WithSendTimeout(d time.Duration) Option { return func(fx *Effects) { fx.sendTimeout = d } }

// Option configures Effects.
type Option func(*Effects)

// WithLogger logs mismatched replies (see Do) to l.
func WithLogger(l *zap.Logger) Option { return func(fx *Effects) { fx.log = l } }

// WithObserver calls f after every reply with what it did (kfpipetest
// records a handler's replies with it). f must be safe for concurrent use.
func WithObserver(f func(Attempt)) Option { return func(fx *Effects) { fx.observe = f } }

// Attempt is one reply of a handler call, as Do ran it.
type Attempt struct {
	Target Target
	// What is "reply", "welcome" or "transfer"; N the reply's number in
	// the call; Content what DoContent was given (nil from Do).
	What    string
	N       int
	Content any
	// Outcome is "sent", "skipped", "refused", "failed" or
	// "servicer_session" (95018: a human servicer holds the session); Err
	// the error Do returned.
	Outcome string
	Err     error
	// Earlier is the fingerprint of the reply an earlier run made at this
	// number when it differs from this one's (Fingerprint): this reply was
	// skipped, the customer got the earlier one. "" when they agree or
	// either is unknown.
	Earlier, Fingerprint string
}

// outcomes label kfpipe_replies_total, in Counts' order, then the
// replies skipped because a human servicer holds the session.
var outcomes = [...]string{"sent", "skipped", "refused", "failed", RefusalServicerSession}

func (fx *Effects) count(i int) {
	fx.counts[i].Add(1)
	fx.outcome.WithLabelValues(outcomes[i]).Inc()
}

// New builds Effects on the given client; reg (nil: none) gets
// kfpipe_replies_total{outcome} and kfpipe_reply_mismatch_total.
func New(kc *kf.Client, reg prometheus.Registerer, opts ...Option) *Effects {
	fx := &Effects{own: handler.NewMemReplyLog(), kf: kc, outcome: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kfpipe_replies_total",
		Help: "Replies (send_msg, welcome messages, session transfers) by outcome: sent, skipped (already sent for this message: a re-run handler), refused (a WeChat refusal that retrying cannot fix), failed (retried with the message), servicer_session (refused with 95018: a human servicer holds the session).",
	}, []string{"outcome"}), mismatch: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kfpipe_reply_mismatch_total",
		Help: "Replies skipped because an earlier run of the handler for the same message made a different reply at the same position: the handler does not reply the same way when it runs again, and the customer got the earlier reply.",
	}), settled: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kfpipe_reply_refusals_total",
		Help: "Messages finished although WeChat refused a reply for a routine reason (reply_window: 95001/95002, session_ended: 95013, welcome_code_expired: 95017, servicer_session: 95018) and the handler returned that refusal: recorded, not dead-lettered.",
	}, []string{"reason"}), log: zap.NewNop(), sendTimeout: defaultSendTimeout}
	for _, o := range outcomes {
		fx.outcome.WithLabelValues(o)
	}
	for _, r := range refusals {
		fx.settled.WithLabelValues(r.reason)
	}
	for _, o := range opts {
		o(fx)
	}
	if reg != nil {
		reg.MustRegister(fx.outcome, fx.mismatch, fx.settled)
		if fx.limit != nil {
			reg.MustRegister(
				prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kfpipe_reply_limit",
					Help: "The adaptive limit on replies in flight to WeChat: cut by its throttles (45009, 45011, 45033)."},
					func() float64 { return float64(fx.limit.Stats().Limit) }),
				prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kfpipe_reply_in_flight",
					Help: "Replies in flight to WeChat now."},
					func() float64 { return float64(fx.limit.Stats().InFlight) }))
		}
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
	opts := []Option{WithLogger(base.Log), WithSessions(NewSessions(base.Redis, cfg.Redis.KeyPrefix, 0)),
		WithLimiter(overload.New(overload.DefaultConfig(MaxRepliesInFlight), nil)), WithSendTimeout(cfg.WeCom.RequestTimeout)}
	if cfg.Dedup.Legacy == "read" {
		// For one dedup.ttl after the switch to the per-partition store:
		// the replies the old claims recorded (docs/operations.md).
		opts = append(opts, WithLegacyClaims(base.Redis, cfg.Redis.KeyPrefix+"reply:"))
	}
	return New(kc, base.Registry, opts...), func() {}, nil
}

// Counts returns the replies counted so far by outcome.
func (fx *Effects) Counts() (sent, skipped, refused, failed int) {
	return int(fx.counts[0].Load()), int(fx.counts[1].Load()), int(fx.counts[2].Load()), int(fx.counts[3].Load())
}

// ServicerSkips returns how many replies WeChat refused with 95018 because
// a human servicer held the session (kfpipe_replies_total{outcome="servicer_session"}).
func (fx *Effects) ServicerSkips() int { return int(fx.counts[4].Load()) }

// Mismatches returns how many replies were skipped because an earlier run
// made a different reply at their position (kfpipe_reply_mismatch_total).
func (fx *Effects) Mismatches() int { return int(fx.mismatches.Load()) }

// Target is the message being answered.
type Target struct {
	OpenKfID, UpstreamMsgID, User string
	// SendTime is the message's send_time (Unix seconds): its replies are
	// kept with its done mark, by send time.
	SendTime int64
	// WelcomeCode is an enter_session event's code ("" otherwise).
	WelcomeCode string
}

// TargetOf returns the Target of a consumed message.
func TargetOf(c *chatmsg.ChatMessage) Target {
	t := Target{OpenKfID: c.OpenKfID, UpstreamMsgID: c.UpstreamMsgID, User: c.ExternalUserID, SendTime: c.SendTime}
	if c.MsgType == chatmsg.TypeEvent {
		if b, err := c.Body(); err == nil && b.Event.Type == "enter_session" {
			t.WelcomeCode = b.Event.WelcomeCode
		}
	}
	return t
}

// state is one handler call's replies, carried in its context.
type state struct {
	fx      *Effects
	to      Target
	mu      sync.Mutex
	n       int          // replies made so far in this call: the next reply's number
	session *sessionRead // the session state this call read (SessionState)
}

type stateKey struct{}

// With returns ctx carrying a fresh reply state for a call about to.
func With(ctx context.Context, fx *Effects, to Target) context.Context {
	return context.WithValue(ctx, stateKey{}, &state{fx: fx, to: to})
}

// Wrap gives each call of h a context that carries its reply state, and
// settles the routine refusals it returns (Settle).
func Wrap(h handler.Handler, fx *Effects) handler.Handler {
	return handler.HandlerFunc(func(ctx context.Context, c *chatmsg.ChatMessage) error {
		to := TargetOf(c)
		if b := handler.BatchFrom(ctx); len(b) > 0 {
			// A batch (consumer.WithBatch): its replies are keyed by its
			// first message, c; every message is observed.
			for _, it := range b {
				fx.Observe(ctx, it.Msg)
			}
		} else {
			fx.Observe(ctx, c)
		}
		return fx.Settle(to, h.Handle(With(ctx, fx, to), c))
	})
}

// Settle returns nil for a handler's error that is a routine refusal of a
// reply (ErrReplyWindow, ErrSessionEnded, ErrWelcomeCodeExpired): the
// message is finished, the refusal counted in kfpipe_reply_refusals_total
// and logged. Any other error is returned as it is.
func (fx *Effects) Settle(to Target, err error) error {
	if err == nil || fx == nil {
		return err
	}
	for _, r := range refusals {
		if errors.Is(err, r.err) {
			fx.settled.WithLabelValues(r.reason).Inc()
			msg := "reply refused by WeChat for a routine reason; the message is finished, not dead-lettered"
			if r.reason == RefusalServicerSession {
				msg = "reply skipped: a human servicer holds the session; the message is finished, not dead-lettered"
			}
			fx.log.Info(msg, zap.String("open_kfid", to.OpenKfID), zap.String("upstream_msgid", to.UpstreamMsgID),
				zap.String("user_id", to.User), zap.String("reason", r.reason), zap.Error(err))
			fx.sessions.recordSkip(to, r.reason, fx.log)
			return nil
		}
	}
	return err
}

// Client returns the WeChat client and the message being answered of the
// handler call ctx belongs to (ok false outside one, or without WeChat
// credentials).
func Client(ctx context.Context) (kc *kf.Client, to Target, ok bool) {
	s, _ := ctx.Value(stateKey{}).(*state)
	if s == nil || s.fx == nil {
		return nil, Target{}, false
	}
	return s.fx.kf, s.to, true
}

// Send is one reply's call to WeChat with the msgid to give it.
type Send func(ctx context.Context, kc *kf.Client, to Target, msgID string) error

// Do is DoContent without the content: its reply is not compared with an
// earlier run's.
func Do(ctx context.Context, what string, send Send) error { return DoContent(ctx, what, nil, send) }

// DoContent runs send once for the reply number this call has reached: its
// key is (open_kfid, upstream msgid, number), so a handler that runs again
// for the same message and replies the same way finds each reply done. A
// refusal of WeChat that retrying cannot fix is returned as Permanent.
//
// content is the reply (a kf.Message, a transfer's target): its
// fingerprint is stored in the done mark, and a run that finds the mark
// done with a different fingerprint — the handler replied differently
// when it ran again — still skips the reply (the customer has the earlier
// one) but counts it in kfpipe_reply_mismatch_total and logs a warning
// with the message.
func DoContent(ctx context.Context, what string, content any, send Send) error {
	_, err := DoResult(ctx, what, content, func(ctx context.Context, kc *kf.Client, to Target, msgID string) (string, error) {
		return "", send(ctx, kc, to, msgID)
	})
	return err
}

// SendResult is a reply's call to WeChat that returns a result to keep
// with its done mark (a transfer's msg_code).
type SendResult func(ctx context.Context, kc *kf.Client, to Target, msgID string) (string, error)

// DoResult is DoContent for a call with a result: the result is stored in
// the reply's done mark, so a run that finds the reply done gets the
// result of the run that made it.
func DoResult(ctx context.Context, what string, content any, send SendResult) (string, error) {
	s, _ := ctx.Value(stateKey{}).(*state)
	if s == nil || s.fx == nil {
		return "", ErrNoReplier
	}
	s.mu.Lock()
	n := s.n
	s.n++
	s.mu.Unlock()
	to := s.to
	fx := s.fx
	it := handler.StateItem{Key: to.OpenKfID + ":" + to.UpstreamMsgID + ":" + strconv.Itoa(n), SendTime: to.SendTime, User: to.User}
	fp := Fingerprint(what, content)
	log, ok := handler.ReplyLogOf(ctx)
	if !ok {
		log = fx.own
	}
	mark, done, sctx, cancel, err := fx.claim(ctx, log, it)
	if err != nil {
		// The store, or the partition is no longer certainly ours: not
		// WeChat's answer. The message is retried (under the next lease).
		return "", fmt.Errorf("%s: %w", what, err)
	}
	var result string
	if !done {
		// In a slot under the replies' limit: a throttled WeChat cuts it.
		err = fx.limit.Call(sctx, func() error {
			// The lease, once more as the request leaves: a wait for a
			// slot may have outlasted it.
			if err := handler.CheckOwner(ctx); err != nil {
				return err
			}
			var serr error
			result, serr = send(sctx, fx.kf, to, kf.MsgID(to.OpenKfID, to.UpstreamMsgID, n))
			return serr
		}, kf.IsThrottled)
		cancel()
		if err == nil {
			record := fp
			if result != "" {
				record = fp + markSep + result
			}
			fx.record(ctx, log, it, record)
		}
	} else {
		cancel()
	}
	a := Attempt{Target: to, What: what, N: n, Content: content, Fingerprint: fp}
	switch {
	case err == nil && done:
		fx.count(1)
		a.Outcome = "skipped"
		earlier, r, _ := strings.Cut(mark, markSep)
		result = r
		if e := earlier; e != "" && fp != "" && e != fp {
			a.Earlier = e
			fx.mismatches.Add(1)
			fx.mismatch.Inc()
			fx.log.Warn("reply skipped: an earlier run of the handler made a different reply at this position; a handler must reply the same way when it runs again",
				zap.String("open_kfid", to.OpenKfID), zap.String("upstream_msgid", to.UpstreamMsgID),
				zap.String("user_id", to.User), zap.Int("reply", n), zap.String("earlier", e), zap.String("now", fp))
		}
	case err == nil:
		fx.count(0)
		a.Outcome = "sent"
	case routine(err) == ErrServicerSession:
		// Not a failure of the bot: a human serves the customer. The
		// session's cached state is stale.
		fx.count(4)
		a.Outcome = RefusalServicerSession
		fx.sessions.Forget(ctx, to.OpenKfID, to.User)
		err = handler.Permanent(fmt.Errorf("%s: %w: %w", what, ErrServicerSession, err))
	case kf.IsPermanent(err):
		// The 5-in-48h window, an ended session, an unknown user: retrying
		// the message cannot change WeChat's answer.
		fx.count(2)
		a.Outcome = "refused"
		if sentinel := routine(err); sentinel != nil {
			err = handler.Permanent(fmt.Errorf("%s: %w: %w", what, sentinel, err))
		} else {
			err = handler.Permanent(fmt.Errorf("%s: %w", what, err))
		}
	default:
		fx.count(3)
		a.Outcome = "failed"
		err = fmt.Errorf("%s: %w", what, err)
	}
	a.Err = err
	if fx.observe != nil {
		fx.observe(a)
	}
	// The conversation archive (package outcome) and History's memory.
	outcome.Replied(ctx, what, n, a.Outcome, content, kf.MsgID(to.OpenKfID, to.UpstreamMsgID, n), err)
	return result, err
}

// legacyReplies reads the replies the old claims store recorded (done
// markers under prefix), for one dedup.ttl after the switch to the
// per-partition store.
type legacyReplies struct {
	rdb    redis.UniversalClient
	prefix string
}

func (l *legacyReplies) replied(ctx context.Context, key string) (string, bool, error) {
	v, ok, err := statestore.LegacyDoneValue(ctx, l.rdb, l.prefix, key)
	if err != nil {
		return "", false, fmt.Errorf("read the old reply claims: %w", err)
	}
	return v, ok, nil
}

// WithLegacyClaims makes a reply the reply log has not recorded also be
// looked up among the old claims store's done markers under prefix (the
// consumer's key prefix + "reply:"): a handler that runs again after the
// switch to the per-partition store does not send again what it sent
// before it.
func WithLegacyClaims(rdb redis.UniversalClient, prefix string) Option {
	return func(fx *Effects) { fx.legacy = &legacyReplies{rdb: rdb, prefix: prefix} }
}

// markSep separates a done mark's fingerprint from the reply's result.
const markSep = "\x00"

// Transfer is a transfer's content: the state and servicer it asks for.
type Transfer struct {
	State    kf.State
	Servicer string
}

// Fingerprint identifies a reply's content: what, the content's Go type
// and a hash of its value ("" for nil content). Two runs that reply the
// same way have the same fingerprints.
func Fingerprint(what string, content any) string {
	if content == nil {
		return ""
	}
	sum := sha256.Sum256(fmt.Appendf(nil, "%#v", content))
	return fmt.Sprintf("%s %T %s", what, content, hex.EncodeToString(sum[:6]))
}
