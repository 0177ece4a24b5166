package wecom

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// CallbackConfig configures the callback handler.
type CallbackConfig struct {
	// MaxBodyBytes caps a POST body; larger bodies get 413. 0 ⇒ 1 MiB.
	MaxBodyBytes int64
	// TimestampWindow rejects requests whose timestamp is further than this
	// from Clock() in either direction (401). 0 disables the check.
	TimestampWindow time.Duration
	// ReplayWindow is how long a (timestamp, nonce, signature) triple is
	// remembered; a repeat within it is acknowledged without a second
	// trigger. 0 (or a nil ReplayCache) disables replay detection.
	ReplayWindow time.Duration
	// Clock returns the current time; nil ⇒ time.Now.
	Clock func() time.Time
}

// ReplayCache remembers callback identities. FirstSeen records key for ttl
// and reports whether it was not already recorded; an error means the
// answer is unknown.
type ReplayCache interface {
	FirstSeen(ctx context.Context, key string, ttl time.Duration) (bool, error)
}

// RedisReplayCache is a ReplayCache shared by all replicas through Redis.
type RedisReplayCache struct {
	rdb    redis.UniversalClient
	prefix string
}

// NewRedisReplayCache returns a replay cache writing prefix+"wecom:nonce:"+key.
func NewRedisReplayCache(rdb redis.UniversalClient, prefix string) *RedisReplayCache {
	return &RedisReplayCache{rdb: rdb, prefix: prefix}
}

// FirstSeen implements ReplayCache with SET NX PX, atomic across replicas.
func (r *RedisReplayCache) FirstSeen(ctx context.Context, key string, ttl time.Duration) (bool, error) {
	ok, err := r.rdb.SetNX(ctx, r.prefix+"wecom:nonce:"+key, 1, ttl).Result()
	if err != nil {
		return false, fmt.Errorf("replay cache: %w", err)
	}
	return ok, nil
}

// Results of a callback request, the values of the result label of
// kfpipe_callback_requests_total.
const (
	ResultOK             = "ok"
	ResultIgnored        = "ignored" // authentic, but not an event we act on
	ResultBadSignature   = "bad_signature"
	ResultStaleTimestamp = "stale_timestamp"
	ResultBadRequest     = "bad_request"
	ResultMethod         = "method"
	ResultTooLarge       = "too_large"
	ResultReplay         = "replay"
	ResultUnavailable    = "unavailable"
)

var allResults = []string{ResultOK, ResultIgnored, ResultBadSignature, ResultStaleTimestamp,
	ResultBadRequest, ResultMethod, ResultTooLarge, ResultReplay, ResultUnavailable}

// TriggerFunc is told that openKfID has something to sync, with the token
// from the callback. It must return quickly (enqueue, don't sync): WeChat
// retries a callback not answered within 5 s. ctx is the request's context
// and ends with the request: do not keep it for the sync itself.
type TriggerFunc func(ctx context.Context, openKfID, token string)

// HandlerOption configures NewCallbackHandler.
type HandlerOption func(*CallbackHandler)

// WithHandlerLogger sets the logger (default: no-op).
func WithHandlerLogger(l *zap.Logger) HandlerOption {
	return func(h *CallbackHandler) {
		if l != nil {
			h.log = l
		}
	}
}

// WithHandlerRegisterer registers the handler's metrics with r (default:
// not registered). A collector already registered under the same name is
// reused, so several handlers may share one registry.
func WithHandlerRegisterer(r prometheus.Registerer) HandlerOption {
	return func(h *CallbackHandler) { h.reg = r }
}

// WithAccountsChanged calls f (which must return quickly) for every
// authentic kf_account_auth_change callback, with the accounts it added
// and removed: kf-producer lists the accounts again.
func WithAccountsChanged(f func(added, removed []string)) HandlerOption {
	return func(h *CallbackHandler) { h.accounts = f }
}

// CallbackHandler is the http.Handler for WeChat's KF callback URL.
type CallbackHandler struct {
	cfg      CallbackConfig
	crypto   *Crypto
	replay   ReplayCache
	accounts func(added, removed []string)
	trigger  TriggerFunc
	log      *zap.Logger
	reg      prometheus.Registerer
	results  map[string]prometheus.Counter
}

const defaultMaxBodyBytes = 1 << 20

// NewCallbackHandler returns the callback handler. GET answers WeChat's URL
// verification; POST verifies, decrypts and parses an event, calls trigger
// for kf_msg_or_event and answers "success". replay may be nil (no replay
// detection). It panics when crypto or trigger is nil: a wiring mistake.
// cfg comes from the callback section, which internal/config checked.
func NewCallbackHandler(cfg CallbackConfig, crypto *Crypto, replay ReplayCache, trigger TriggerFunc, opts ...HandlerOption) *CallbackHandler {
	if crypto == nil || trigger == nil {
		panic("wecom: NewCallbackHandler needs a Crypto and a trigger")
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = defaultMaxBodyBytes
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	h := &CallbackHandler{cfg: cfg, crypto: crypto, replay: replay, trigger: trigger, log: zap.NewNop()}
	for _, o := range opts {
		o(h)
	}
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kfpipe_callback_requests_total",
		Help: "WeChat callback requests by result.",
	}, []string{"result"})
	if h.reg != nil {
		if err := h.reg.Register(vec); err != nil {
			are := &prometheus.AlreadyRegisteredError{}
			if !errors.As(err, are) {
				panic("wecom: register metrics: " + err.Error())
			}
			vec = are.ExistingCollector.(*prometheus.CounterVec)
		}
	}
	h.results = make(map[string]prometheus.Counter, len(allResults))
	for _, r := range allResults {
		h.results[r] = vec.WithLabelValues(r)
	}
	return h
}

// ServeHTTP implements http.Handler.
func (h *CallbackHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet:
		h.verifyURL(w, r)
	case http.MethodPost:
		h.event(w, r)
	default:
		w.Header().Set("Allow", "GET, POST")
		h.reply(w, r, http.StatusMethodNotAllowed, ResultMethod, "method not allowed")
	}
}

// query is the signed part of a callback URL.
type query struct {
	sig, timestamp, nonce string
}

func readQuery(r *http.Request) query {
	q := r.URL.Query()
	return query{sig: q.Get("msg_signature"), timestamp: q.Get("timestamp"), nonce: q.Get("nonce")}
}

// check authenticates the request: signature first, then the timestamp
// window. It writes the rejection and returns false when it fails.
func (h *CallbackHandler) check(w http.ResponseWriter, r *http.Request, q query, encrypted string) bool {
	if q.sig == "" || q.timestamp == "" || q.nonce == "" {
		h.reply(w, r, http.StatusUnauthorized, ResultBadSignature, "missing msg_signature, timestamp or nonce")
		return false
	}
	if !h.crypto.Verify(q.sig, q.timestamp, q.nonce, encrypted) {
		h.reply(w, r, http.StatusUnauthorized, ResultBadSignature, "bad msg_signature")
		return false
	}
	if h.cfg.TimestampWindow > 0 {
		ts, err := strconv.ParseInt(q.timestamp, 10, 64)
		if err != nil {
			h.reply(w, r, http.StatusBadRequest, ResultBadRequest, "timestamp is not a number")
			return false
		}
		d := h.cfg.Clock().Sub(time.Unix(ts, 0))
		if d > h.cfg.TimestampWindow || d < -h.cfg.TimestampWindow {
			h.reply(w, r, http.StatusUnauthorized, ResultStaleTimestamp, "timestamp outside the allowed window")
			return false
		}
	}
	return true
}

// verifyURL answers the URL check WeChat makes when the callback URL is
// configured: the decrypted echostr, as is.
func (h *CallbackHandler) verifyURL(w http.ResponseWriter, r *http.Request) {
	q := readQuery(r)
	echo := r.URL.Query().Get("echostr")
	// Base64 has no spaces: a space is a '+' that the sender left
	// unescaped and the query decoder turned into a space.
	echo = strings.ReplaceAll(echo, " ", "+")
	if echo == "" {
		h.reply(w, r, http.StatusBadRequest, ResultBadRequest, "missing echostr")
		return
	}
	if !h.check(w, r, q, echo) {
		return
	}
	plain, err := h.crypto.Decrypt(echo)
	if err != nil {
		h.reply(w, r, http.StatusBadRequest, ResultBadRequest, "cannot decrypt echostr")
		return
	}
	h.results[ResultOK].Inc()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(plain)
}

func (h *CallbackHandler) event(w http.ResponseWriter, r *http.Request) {
	q := readQuery(r)
	if q.sig == "" {
		// Cheap rejection before reading a body nobody signed.
		h.reply(w, r, http.StatusUnauthorized, ResultBadSignature, "missing msg_signature")
		return
	}
	if r.ContentLength > h.cfg.MaxBodyBytes {
		h.reply(w, r, http.StatusRequestEntityTooLarge, ResultTooLarge, "body too large")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			h.reply(w, r, http.StatusRequestEntityTooLarge, ResultTooLarge, "body too large")
			return
		}
		h.reply(w, r, http.StatusBadRequest, ResultBadRequest, "cannot read body")
		return
	}
	env, err := ParseEnvelope(body)
	if err != nil {
		h.reply(w, r, http.StatusBadRequest, ResultBadRequest, "body is not a callback envelope")
		return
	}
	if !h.check(w, r, q, env.Encrypt) {
		return
	}
	plain, err := h.crypto.Decrypt(env.Encrypt)
	if err != nil {
		reason := "cannot decrypt"
		if errors.Is(err, ErrReceiveIDMismatch) {
			reason = "wrong receive id"
		}
		h.reply(w, r, http.StatusBadRequest, ResultBadRequest, reason)
		return
	}
	ev, err := ParseEvent(plain)
	if err != nil {
		h.reply(w, r, http.StatusBadRequest, ResultBadRequest, "decrypted message is not a callback event")
		return
	}
	if h.replay != nil && h.cfg.ReplayWindow > 0 {
		first, err := h.replay.FirstSeen(r.Context(), replayKey(q), h.cfg.ReplayWindow)
		if err != nil {
			// Our side failed: 503 makes WeChat retry instead of us
			// triggering without replay protection or dropping the event.
			h.log.Warn("callback replay cache", zap.Error(err))
			h.reply(w, r, http.StatusServiceUnavailable, ResultUnavailable, "temporarily unavailable")
			return
		}
		if !first {
			h.success(w, ResultReplay)
			return
		}
	}
	if ev.IsAccountAuthChange() && h.accounts != nil {
		h.log.Info("customer-service accounts changed", zap.Strings("added", ev.AuthAdd), zap.Strings("removed", ev.AuthDel))
		h.accounts(ev.AuthAdd, ev.AuthDel)
		h.success(w, ResultOK)
		return
	}
	if !ev.IsKFMsgOrEvent() {
		h.log.Debug("callback event ignored", zap.String("msg_type", ev.MsgType), zap.String("event", ev.Event))
		h.success(w, ResultIgnored)
		return
	}
	h.trigger(r.Context(), ev.OpenKfID, ev.Token)
	h.success(w, ResultOK)
}

// replayKey identifies a callback delivery by its verified signature
// alone. WeChat's own retries of one delivery carry the same signature, so
// they are recognised too. Keying on (timestamp, nonce, signature) would
// not do: the signature hashes its parts sorted and concatenated, so the
// same signature verifies for a request with timestamp and nonce swapped
// (or the boundary between them moved) — a new triple, a second trigger.
func replayKey(q query) string {
	sum := sha1.Sum([]byte(q.sig))
	return hex.EncodeToString(sum[:])
}

func (h *CallbackHandler) success(w http.ResponseWriter, result string) {
	h.results[result].Inc()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, "success")
}

func (h *CallbackHandler) reply(w http.ResponseWriter, r *http.Request, code int, result, reason string) {
	h.results[result].Inc()
	// Debug, not Info: a flood of forged requests must not flood the logs;
	// the counter shows them.
	h.log.Debug("callback rejected", zap.Int("status", code), zap.String("result", result),
		zap.String("reason", reason), zap.String("remote", r.RemoteAddr))
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = io.WriteString(w, reason+"\n")
}
