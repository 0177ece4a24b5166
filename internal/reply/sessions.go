package reply

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/kf"
)

// DefaultSessionTTL bounds how long a customer's session state is cached
// when no session_status_change event says it changed: a change WeChat
// announces with no event (a new session after an ended one, when the
// customer writes again) is seen at the latest this late.
const DefaultSessionTTL = 5 * time.Minute

// Sessions caches customers' session states (service_state/get) in Redis,
// per (open_kfid, user), so a bot that asks before each reply whether a
// human serves the customer does not call WeChat for every message. An
// entry is dropped when the pipeline handles the customer's
// session_status_change event (a servicer took, transferred or ended the
// session), when the handler changes the state itself (Transfer) and when
// WeChat refuses a reply with 95018; it expires after the TTL otherwise.
// Messages of a user are handled in order, so a message after the event
// reads the state after it.
//
// Sessions also records, per message, the routine refusal a handler
// finished it with (the customer timeline shows it). A nil *Sessions
// caches nothing and records nothing.
type Sessions struct {
	rdb    redis.UniversalClient
	prefix string
	ttl    time.Duration
}

// NewSessions returns a cache under keyPrefix ("<prefix>session:…",
// "<prefix>replyskip:…"); ttl 0 is DefaultSessionTTL.
func NewSessions(rdb redis.UniversalClient, keyPrefix string, ttl time.Duration) *Sessions {
	if ttl <= 0 {
		ttl = DefaultSessionTTL
	}
	return &Sessions{rdb: rdb, prefix: keyPrefix, ttl: ttl}
}

// WithSessions caches session states and records skipped replies in s.
func WithSessions(s *Sessions) Option { return func(fx *Effects) { fx.sessions = s } }

func (s *Sessions) key(openKfID, user string) string {
	return s.prefix + "session:" + openKfID + ":" + user
}

// SkipKey is the Redis key (under the key prefix) of the routine refusal
// recorded for a message.
func SkipKey(openKfID, upstreamMsgID string) string {
	return "replyskip:" + openKfID + ":" + upstreamMsgID
}

// State returns user's session state: the cached one, or WeChat's
// (service_state/get), which is then cached. A session that ended is not
// cached: the customer's next message opens a new one without an event.
func (s *Sessions) State(ctx context.Context, kc *kf.Client, openKfID, user string) (kf.State, string, error) {
	if s != nil {
		if v, err := s.rdb.Get(ctx, s.key(openKfID, user)).Result(); err == nil {
			st, servicer, _ := strings.Cut(v, "|")
			if n, err := strconv.Atoi(st); err == nil {
				return kf.State(n), servicer, nil
			}
		}
	}
	return s.fetch(ctx, kc, openKfID, user)
}

// fetch asks WeChat for user's session state and caches it (not an ended
// one).
func (s *Sessions) fetch(ctx context.Context, kc *kf.Client, openKfID, user string) (kf.State, string, error) {
	st, servicer, err := kc.ServiceState(ctx, openKfID, user)
	if err != nil || s == nil || st == kf.StateEnded {
		return st, servicer, err
	}
	if err := s.rdb.Set(ctx, s.key(openKfID, user), strconv.Itoa(int(st))+"|"+servicer, s.ttl).Err(); err != nil {
		return st, servicer, nil // WeChat's answer stands; the next call asks again
	}
	return st, servicer, nil
}

// Forget drops user's cached session state.
func (s *Sessions) Forget(ctx context.Context, openKfID, user string) {
	if s == nil {
		return
	}
	// A failure leaves the entry to its TTL.
	_ = s.rdb.Del(context.WithoutCancel(ctx), s.key(openKfID, user)).Err()
}

// Cached returns user's cached state (ok false when none is cached).
func (s *Sessions) Cached(ctx context.Context, openKfID, user string) (kf.State, bool) {
	if s == nil {
		return 0, false
	}
	v, err := s.rdb.Get(ctx, s.key(openKfID, user)).Result()
	if err != nil {
		return 0, false
	}
	st, _, _ := strings.Cut(v, "|")
	n, err := strconv.Atoi(st)
	return kf.State(n), err == nil
}

// recordSkip records that the message to was finished with a routine
// refusal (reason), for as long as its replies' marks live.
func (s *Sessions) recordSkip(to Target, reason string, log *zap.Logger) {
	if s == nil || to.UpstreamMsgID == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.rdb.Set(ctx, s.prefix+SkipKey(to.OpenKfID, to.UpstreamMsgID), reason, TTL).Err(); err != nil {
		log.Warn("recording a skipped reply for the customer timeline failed", zap.String("open_kfid", to.OpenKfID),
			zap.String("upstream_msgid", to.UpstreamMsgID), zap.String("reason", reason), zap.Error(err))
	}
}

// Skips returns the routine refusal recorded for each message ("" none).
func Skips(ctx context.Context, rdb redis.UniversalClient, prefix string, openKfIDs, upstream []string) ([]string, error) {
	out := make([]string, len(upstream))
	if len(upstream) == 0 {
		return out, nil
	}
	keys := make([]string, len(upstream))
	for i := range upstream {
		keys[i] = prefix + SkipKey(openKfIDs[i], upstream[i])
	}
	vals, err := rdb.MGet(ctx, keys...).Result()
	if err != nil {
		return nil, fmt.Errorf("reading skipped replies: %w", err)
	}
	for i, v := range vals {
		if s, ok := v.(string); ok {
			out[i] = s
		}
	}
	return out, nil
}

// Observe drops the cached session state of a session_status_change
// event's customer before the event (and every later message of the
// customer) is handled.
func (fx *Effects) Observe(ctx context.Context, c *chatmsg.ChatMessage) {
	if fx == nil || fx.sessions == nil || c.MsgType != chatmsg.TypeEvent {
		return
	}
	if b, err := c.Body(); err == nil && b.Event.Type == "session_status_change" {
		fx.sessions.Forget(ctx, c.OpenKfID, c.ExternalUserID)
	}
}

// SessionState returns the session state of the customer of the handler
// call ctx belongs to, from the cache when there is one. The first state a
// message's handler read is kept with the message (as long as its reply
// marks), and a handler that runs again for the message reads that one:
// a bot that hands the customer over and then runs again (a retry, a
// crash) must not see its own hand-off and answer differently. Within one
// handler call the state is read once: a second call answers from the
// call's own memory. The message's kept state and the customer's cached
// one are read in one round trip.
func SessionState(ctx context.Context) (kf.State, string, error) {
	s, _ := ctx.Value(stateKey{}).(*state)
	if s == nil || s.fx == nil {
		return 0, "", ErrNoReplier
	}
	s.mu.Lock()
	read := s.session
	s.mu.Unlock()
	if read != nil {
		return read.st, read.servicer, nil
	}
	st, servicer, err := s.fx.sessionState(ctx, s.to)
	if err == nil {
		s.mu.Lock()
		s.session = &sessionRead{st: st, servicer: servicer}
		s.mu.Unlock()
	}
	return st, servicer, err
}

// sessionRead is the session state a handler call read.
type sessionRead struct {
	st       kf.State
	servicer string
}

// parseSession reads a cached "state|servicer" value.
func parseSession(v string) (kf.State, string, bool) {
	st, servicer, _ := strings.Cut(v, "|")
	n, err := strconv.Atoi(st)
	return kf.State(n), servicer, err == nil
}

// sessionState is SessionState's read for the message to.
func (fx *Effects) sessionState(ctx context.Context, to Target) (kf.State, string, error) {
	ss := fx.sessions
	if ss == nil || to.UpstreamMsgID == "" {
		return ss.State(ctx, fx.kf, to.OpenKfID, to.User)
	}
	key := ss.prefix + "sessionat:" + to.OpenKfID + ":" + to.UpstreamMsgID
	pipe := ss.rdb.Pipeline()
	at := pipe.Get(ctx, key)
	cached := pipe.Get(ctx, ss.key(to.OpenKfID, to.User))
	_, _ = pipe.Exec(ctx) // each read carries its own error; a failed one counts as absent
	if v, err := at.Result(); err == nil {
		if st, servicer, ok := parseSession(v); ok {
			return st, servicer, nil
		}
	}
	var (
		st       kf.State
		servicer string
		ok       bool
	)
	if v, err := cached.Result(); err == nil {
		st, servicer, ok = parseSession(v)
	}
	if !ok {
		var err error
		if st, servicer, err = ss.fetch(ctx, fx.kf, to.OpenKfID, to.User); err != nil {
			return st, servicer, err
		}
	}
	v := strconv.Itoa(int(st)) + "|" + servicer
	if ok, err := ss.rdb.SetNX(ctx, key, v, TTL).Result(); err == nil && !ok {
		// A concurrent run kept its read first: use it.
		if v2, err := ss.rdb.Get(ctx, key).Result(); err == nil {
			if st2, servicer2, ok := parseSession(v2); ok {
				return st2, servicer2, nil
			}
		}
	}
	return st, servicer, nil
}

// ForgetSession drops the cached session state of the customer of the
// handler call ctx belongs to (after the handler changed it).
func ForgetSession(ctx context.Context) {
	if s, _ := ctx.Value(stateKey{}).(*state); s != nil && s.fx != nil {
		s.fx.sessions.Forget(ctx, s.to.OpenKfID, s.to.User)
	}
}

// Made returns how many replies the handler call ctx belongs to has made
// so far (ok false outside one).
func Made(ctx context.Context) (n int, ok bool) {
	s, _ := ctx.Value(stateKey{}).(*state)
	if s == nil || s.fx == nil {
		return 0, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n, true
}
