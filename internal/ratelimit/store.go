package ratelimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/redisconn"
)

// permanentMs marks a block without end in memory; Redis stores it as the
// value "permanent" without TTL, and as score +inf in rl:blocked.
const permanentMs = math.MaxInt64

const permanentValue = "permanent"

// Event operations on the rl:events channel.
const (
	opBlock   = "block"
	opUnblock = "unblock"
	opGroup   = "group"
	opRules   = "rules"
)

// event is one message on the rl:events channel.
type event struct {
	Op    string `json:"op"`
	User  string `json:"user,omitempty"`
	Group string `json:"group,omitempty"`
	// Until is the block end in unix ms; -1 = permanent.
	Until int64 `json:"until,omitempty"`
}

// Store is the Redis side of rate limiting, shared by every Limiter and
// Admin on the same Redis and prefix. It is safe for concurrent use.
type Store struct {
	rdb    redis.UniversalClient
	prefix string
}

// NewStore returns a Store using rdb with keys under prefix (e.g. "kfpipe:").
func NewStore(rdb redis.UniversalClient, prefix string) *Store {
	return &Store{rdb: rdb, prefix: prefix}
}

// base is prefix + "rl:", and prefix + "{rl}:" on a Redis Cluster: the
// limiter's and breaker's Redis state is one slot there, because a block
// writes the user's block and history keys and the global blocked set in
// one script, and the rules and their version change in one MULTI. It is
// small (blocked, regrouped and penalised users only; the hot window is in
// memory) and read once per actor start, so one master carries it
// (docs/operations.md, "Redis Cluster").
func (s *Store) base() string                  { return s.prefix + redisconn.Tag(s.rdb, "rl") + ":" }
func (s *Store) blockKey(user string) string   { return s.base() + "block:" + user }
func (s *Store) groupKey(user string) string   { return s.base() + "group:" + user }
func (s *Store) historyKey(user string) string { return s.base() + "history:" + user }
func (s *Store) blockedKey() string            { return s.base() + "blocked" }
func (s *Store) rulesKey() string              { return s.base() + "rules" }
func (s *Store) rulesVersionKey() string       { return s.base() + "rules:version" }

// channel is not a key (PUBLISH reaches every node of a Cluster), so it
// keeps its name in every mode.
func (s *Store) channel() string { return s.prefix + "rl:events" }

// userRecord is what Redis knows about a user.
type userRecord struct {
	group        string
	blockedUntil int64   // unix ms; 0 = none; permanentMs
	history      []int64 // automatic block times (unix ms) still inside the history window
}

// parseBlock reads an rl:block value.
func parseBlock(v string) (int64, error) {
	if v == permanentValue {
		return permanentMs, nil
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("bad rl:block value %q", v)
	}
	return ms, nil
}

// load reads a user's group, block and (historySince >= 0) block history in
// one round trip.
func (s *Store) load(ctx context.Context, user string, historySince int64) (userRecord, error) {
	recs, errs := s.loadMany(ctx, []string{user}, historySince)
	return recs[0], errs[0]
}

// loadChunk is how many users one MGET reads (two keys each), so that a
// large batch is a few bounded commands rather than one huge reply.
const loadChunk = 512

// loadMany reads the records of users in one pipelined round trip; errs[i]
// is the error of users[i] (a connection failure is every user's). The
// groups and blocks of up to loadChunk users are one MGET (every rl key is
// in one slot on a Cluster, see base), so a batch of new users costs Redis
// one command, not two a user; the block history (progressive penalty
// only) is one ZRANGEBYSCORE a user in the same pipeline.
func (s *Store) loadMany(ctx context.Context, users []string, historySince int64) (recs []userRecord, errs []error) {
	pipe := s.rdb.Pipeline()
	mgets := make([]*redis.SliceCmd, 0, (len(users)+loadChunk-1)/loadChunk)
	keys := make([]string, 0, 2*min(len(users), loadChunk))
	for i := 0; i < len(users); i += loadChunk {
		keys = keys[:0]
		for _, user := range users[i:min(i+loadChunk, len(users))] {
			keys = append(keys, s.groupKey(user), s.blockKey(user))
		}
		mgets = append(mgets, pipe.MGet(ctx, keys...))
	}
	var hist []*redis.StringSliceCmd
	if historySince >= 0 {
		hist = make([]*redis.StringSliceCmd, len(users))
		by := &redis.ZRangeBy{Min: strconv.FormatInt(historySince, 10), Max: "+inf"}
		for i, user := range users {
			hist[i] = pipe.ZRangeByScore(ctx, s.historyKey(user), by)
		}
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	recs, errs = make([]userRecord, len(users)), make([]error, len(users))
	for i, user := range users {
		m := mgets[i/loadChunk]
		if err := m.Err(); err != nil {
			errs[i] = fmt.Errorf("load rate-limit state of %s: %w", user, err)
			continue
		}
		vals, j := m.Val(), 2*(i%loadChunk)
		if len(vals) < j+2 {
			errs[i] = fmt.Errorf("load rate-limit state of %s: MGET answered %d values", user, len(vals))
			continue
		}
		var h *redis.StringSliceCmd
		if hist != nil {
			h = hist[i]
		}
		recs[i], errs[i] = record(user, vals[j], vals[j+1], h)
	}
	return recs, errs
}

// record builds a user's record from its MGET values (group, block: nil
// when absent) and its history read (nil without the progressive penalty).
func record(user string, group, block any, h *redis.StringSliceCmd) (userRecord, error) {
	var rec userRecord
	if v, ok := group.(string); ok {
		rec.group = v
	}
	if v, ok := block.(string); ok {
		ms, err := parseBlock(v)
		if err != nil {
			return userRecord{}, err
		}
		rec.blockedUntil = ms
	}
	if h != nil {
		if err := h.Err(); err != nil {
			return userRecord{}, fmt.Errorf("load rate-limit history of %s: %w", user, err)
		}
		for _, m := range h.Val() {
			if ms, err := strconv.ParseInt(m, 10, 64); err == nil {
				rec.history = append(rec.history, ms)
			}
		}
	}
	return rec, nil
}

// blockScript writes a block, its listing entry, optionally a history
// entry, and announces it, atomically.
//
//	KEYS: block, blocked zset, history zset
//	ARGV: user, until ms (-1 = permanent), ttl ms, force (0|1), now ms,
//	      history keep ms (0 = no history entry), channel, event JSON,
//	      history cutoff ("(ms", exclusive)
//
// Without force (an automatic block) it never shortens an existing block or
// replaces a permanent one: an operator's decision wins over the limiter's.
var blockScript = redis.NewScript(`
local ends = tonumber(ARGV[2])
if ARGV[4] == '0' then
  local cur = redis.call('GET', KEYS[1])
  if cur then
    if cur == 'permanent' then return 0 end
    local c = tonumber(cur)
    if c and c >= ends then return 0 end
  end
end
if ends < 0 then
  redis.call('SET', KEYS[1], 'permanent')
  redis.call('ZADD', KEYS[2], '+inf', ARGV[1])
else
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
end
local keep = tonumber(ARGV[6])
if keep > 0 then
  redis.call('ZADD', KEYS[3], ARGV[5], ARGV[5])
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', ARGV[9])
  redis.call('PEXPIRE', KEYS[3], keep)
end
redis.call('PUBLISH', ARGV[7], ARGV[8])
return 1
`)

// blockWrite is one block to persist.
type blockWrite struct {
	user   string
	until  int64 // unix ms; permanentMs
	ttlMs  int64
	nowMs  int64
	keepMs int64 // > 0: record in the history, kept this long
	force  bool
}

func (s *Store) blockArgs(w blockWrite) ([]string, []any, error) {
	until := w.until
	ev := event{Op: opBlock, User: w.user, Until: until}
	if until == permanentMs {
		until, ev.Until = -1, -1
	}
	payload, err := json.Marshal(ev)
	if err != nil {
		return nil, nil, err
	}
	force := "0"
	if w.force {
		force = "1"
	}
	keys := []string{s.blockKey(w.user), s.blockedKey(), s.historyKey(w.user)}
	cutoff := "(" + strconv.FormatInt(w.nowMs-w.keepMs, 10)
	args := []any{w.user, until, max(w.ttlMs, 1), force, w.nowMs, w.keepMs, s.channel(), string(payload), cutoff}
	return keys, args, nil
}

// writeBlocks persists blocks in one pipeline; it returns the writes that
// failed (to be retried) and the first error.
func (s *Store) writeBlocks(ctx context.Context, ws []blockWrite) ([]blockWrite, error) {
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(ws))
	for i, w := range ws {
		keys, args, err := s.blockArgs(w)
		if err != nil {
			return nil, err // only a JSON failure; cannot happen for these types
		}
		// EVAL rather than EVALSHA: a pipeline cannot fall back on NOSCRIPT,
		// and blocks are rare enough that the script text costs nothing.
		cmds[i] = blockScript.Eval(ctx, pipe, keys, args...)
	}
	_, _ = pipe.Exec(ctx)
	var failed []blockWrite
	var first error
	for i, c := range cmds {
		if err := c.Err(); err != nil && !errors.Is(err, redis.Nil) {
			failed = append(failed, ws[i])
			if first == nil {
				first = err
			}
		}
	}
	return failed, first
}

func (s *Store) publish(ctx context.Context, pipe redis.Pipeliner, ev event) error {
	payload, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	pipe.Publish(ctx, s.channel(), payload)
	return nil
}

// unblock removes a block and announces it.
func (s *Store) unblock(ctx context.Context, user string) error {
	_, err := s.rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.Del(ctx, s.blockKey(user))
		pipe.ZRem(ctx, s.blockedKey(), user)
		return s.publish(ctx, pipe, event{Op: opUnblock, User: user})
	})
	if err != nil {
		return fmt.Errorf("unblock %s: %w", user, err)
	}
	return nil
}

// loadRules returns the rules override in Redis; ok is false when there is none.
func (s *Store) loadRules(ctx context.Context) (rules map[string]groupJSON, ok bool, err error) {
	v, err := s.rdb.Get(ctx, s.rulesKey()).Result()
	if errors.Is(err, redis.Nil) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("load rate-limit rules: %w", err)
	}
	if err := json.Unmarshal([]byte(v), &rules); err != nil {
		return nil, false, fmt.Errorf("%w: %s holds invalid JSON: %w", ErrInvalidRules, s.rulesKey(), err)
	}
	return rules, true, nil
}

// decodeEvent parses a channel payload.
func decodeEvent(payload string) (event, error) {
	var ev event
	if err := json.Unmarshal([]byte(payload), &ev); err != nil {
		return ev, fmt.Errorf("bad rate-limit event %q: %w", payload, err)
	}
	return ev, nil
}
