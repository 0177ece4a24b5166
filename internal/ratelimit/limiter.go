package ratelimit

import (
	"context"
	"fmt"
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/deadletter"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// Reasons a message is refused (Decision.Reason; also the DLQ reason, from
// the reason table of package deadletter).
const (
	ReasonRateLimited = string(deadletter.RateLimited)
	ReasonUserBlocked = string(deadletter.UserBlocked)
)

// numShards spreads the user map over independent locks so many actors
// can look their users up in parallel.
const numShards = 64

// loadRetry is how long (in message time) a user whose record could not be
// loaded runs on defaults before the next attempt.
const loadRetry = time.Second

// Decision is the limiter's answer for one message.
type Decision struct {
	Allowed bool
	// Reason is "" when allowed, else ReasonRateLimited or ReasonUserBlocked.
	Reason string
	// BlockedUntil is the end of the user's block (zero when not blocked or
	// when the block is permanent).
	BlockedUntil time.Time
	// Permanent is set when the user is blocked without end.
	Permanent bool
	// Violations is the user's violation count after this message; on the
	// message that starts a block it is the count that reached the threshold.
	Violations int
	// Group is the group whose rule decided.
	Group string
	// NewBlock is set on the refused message whose violation started a block.
	NewBlock bool
}

// Limiter is the per-user sliding-window limiter (I5). A rule is
// "at most X messages in any N-second window (ms precision); Y violations
// block the user for Z": a message is allowed when the window holds fewer
// than X earlier allowed messages; a refusal is a violation; the Y-th
// violation blocks the user (that message is still refused as
// rate_limited, every later one as user_blocked until the block ends); the
// violation count resets when, after an allowed message, the window holds
// at most X/2 messages.
//
// Allow must not be called concurrently for the same user (the consumer
// calls it from the user's actor); different users may be decided in
// parallel. The hot path does no Redis round trip: a user's group, block and
// block history are read once when its state is created and kept fresh by
// events on rl:events.
type Limiter struct {
	cfg   config.RateLimit
	store *Store
	o     options
	m     *limiterMetrics
	seed  maphash.Seed

	rules atomic.Pointer[ruleSet]
	// epoch is bumped when events may have been missed (pub/sub
	// reconnect); a user state loaded in an older epoch reloads.
	epoch atomic.Uint64
	// pausedUntil (message time, unix ms): after a read of a user's record
	// failed, no read is tried for any user before it, and users run on
	// defaults as after their own failure. A Redis that does not answer
	// then costs the caller (the consumer's poll goroutine) one timeout a
	// loadRetry, not one per new user of a polled batch.
	pausedUntil atomic.Int64

	shards [numShards]shard

	writer    *blockWriter
	pubsub    *redis.PubSub
	wg        sync.WaitGroup
	closeOnce sync.Once

	// With WithEtcdRules: the group assignments as the watch reports them
	// (user → group), and stopWatch ends the watch.
	egMu      sync.RWMutex
	egroups   map[string]string
	stopWatch context.CancelFunc
}

type shard struct {
	mu    sync.RWMutex
	users map[string]*userState
	_     [32]byte // keep neighbouring shard locks off one cache line
}

// userState is one user's state: about 128 bytes plus the ring (8 bytes per
// slot, grown on demand up to the rule's X) and the block history.
type userState struct {
	mu         sync.Mutex
	group      string // from rl:group; "" = default group
	rule       *rule
	ruleGen    uint64
	epoch      uint64
	seq        uint32 // bumped by every applied event, so a load never overwrites a newer event
	violations int32
	head, n    int32
	// blockedUntil is the block end in unix ms; 0 = none; permanentMs.
	blockedUntil int64
	// retryAt (unix ms of message time) is when to retry a failed load; 0 = loaded.
	retryAt int64
	ring    []int64 // allowed-message timestamps (unix ms), oldest at head
	history []int64 // automatic block times inside the progressive history window
}

// New returns a Limiter for cfg. With a nil store the limiter is local to
// the process (blocks are neither shared nor persisted); with a store it
// subscribes to rl:events and applies the rules override in rl:rules, and
// fails when Redis cannot be reached within the Redis timeout.
// Close releases it.
func New(cfg config.RateLimit, store *Store, opts ...Option) (*Limiter, error) {
	if err := validateGroups(cfg.Groups, cfg.DefaultGroup); err != nil {
		return nil, err
	}
	if p := cfg.Progressive; p.Enabled && (p.Base <= 0 || p.Max < p.Base || p.History <= 0) {
		return nil, fmt.Errorf("%w: rate_limit.progressive needs base > 0, max >= base and history > 0, got %s, %s, %s",
			ErrInvalidRules, p.Base, p.Max, p.History)
	}
	l := &Limiter{cfg: cfg, store: store, o: buildOptions(opts), seed: maphash.MakeSeed()}
	for i := range l.shards {
		l.shards[i].users = make(map[string]*userState)
	}
	l.m = newLimiterMetrics(l.o.reg, l.blockedCurrent)
	l.rules.Store(compileRules(cfg.Groups, cfg.DefaultGroup, 1, l.m))
	if store == nil {
		return l, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.o.timeout)
	defer cancel()
	// Subscribe before reading the rules so no change falls between the two.
	ps := store.rdb.Subscribe(ctx, store.channel())
	if _, err := ps.Receive(ctx); err != nil {
		_ = ps.Close()
		return nil, fmt.Errorf("subscribe %s: %w", store.channel(), err)
	}
	if err := l.refreshRules(ctx); err != nil {
		_ = ps.Close()
		return nil, err
	}
	if l.o.etcd != nil {
		if err := l.followEtcd(ctx); err != nil {
			_ = ps.Close()
			return nil, err
		}
	}
	l.pubsub = ps
	l.writer = newBlockWriter(store, l.o.logger, l.o.timeout)
	ch := ps.ChannelWithSubscriptions()
	l.wg.Add(2)
	go func() { defer l.wg.Done(); l.writer.run() }()
	go func() { defer l.wg.Done(); l.listen(ch) }()
	return l, nil
}

// Close stops listening for events, writes the blocks still queued (bounded
// by the Redis timeout) and waits for its goroutines. Allow must not be
// called after Close.
func (l *Limiter) Close() error {
	l.closeOnce.Do(func() {
		if l.stopWatch != nil {
			l.stopWatch()
		}
		if l.pubsub != nil {
			_ = l.pubsub.Close()
			l.writer.close()
		}
		l.wg.Wait()
	})
	return nil
}

func (l *Limiter) shard(user string) *shard {
	return &l.shards[maphash.String(l.seed, user)%numShards]
}

func (l *Limiter) lookup(user string) *userState {
	sh := l.shard(user)
	sh.mu.RLock()
	st := sh.users[user]
	sh.mu.RUnlock()
	return st
}

// Allow decides one message of user sent at now: the message's own time
// (the consumer passes WeChat's send_time), not the time it is processed,
// so that a backlog read at catch-up speed is judged by how fast the
// customer sent it; a block then covers what the user sent until it ends.
// A time earlier than the user's newest one counts as that newest one (the
// window stays sorted); for that reason the consumer does not hand a letter
// re-injected from the DLQ its old send time: it judges one the limiter
// refused at its re-injection time, and one that failed after the limiter's
// yes not at all (consumer.limitAt). ctx bounds the one
// Redis read made when the user's state is first created (or reloaded after
// a pub/sub reconnect); if that read fails the user runs on defaults (fail
// open: refusing everyone because Redis blinked would send every message to
// the DLQ) and the read is retried a second later.
func (l *Limiter) Allow(ctx context.Context, user string, now time.Time) Decision {
	if !l.cfg.Enabled {
		l.m.allowed.Inc()
		return Decision{Allowed: true}
	}
	nowMs := now.UnixMilli()
	st := l.lookup(user)
	if st == nil {
		st = l.create(ctx, user, nowMs)
	}
	st.mu.Lock()
	if l.store != nil && (st.epoch != l.epoch.Load() || (st.retryAt != 0 && nowMs >= st.retryAt)) {
		st.mu.Unlock()
		l.load(ctx, st, user, nowMs)
		st.mu.Lock()
	}
	d, w, blocked := l.decide(st, user, nowMs)
	st.mu.Unlock()
	if blocked {
		l.o.logger.Warn("user blocked by rate limiter", zap.String("user_id", user), zap.String("group", d.Group),
			zap.Int("violations", d.Violations), zap.Time("blocked_until", d.BlockedUntil))
		if l.writer != nil {
			l.writer.enqueue(w)
		}
	}
	return d
}

// Prefetch reads the Redis records of those of users that have no state yet
// (or whose state must be read again) in one pipelined round trip, so that
// Allow then answers each of them from memory. The consumer calls it with
// the users of a batch of polled records before deciding any of them: one
// round trip per batch instead of one per new user. It has Allow's contract
// (not concurrently with Allow or Prefetch for the same user), and the same
// failure mode: a user whose read fails runs on defaults and is read again
// a second later. Without a store, or with limiting disabled, it does
// nothing.
func (l *Limiter) Prefetch(ctx context.Context, users []string, now time.Time) {
	if !l.cfg.Enabled || l.store == nil || len(users) == 0 {
		return
	}
	nowMs := now.UnixMilli()
	epoch := l.epoch.Load()
	var (
		names  []string
		states []*userState
		seqs   []uint32
		seen   map[*userState]struct{}
	)
	for _, user := range users {
		st := l.lookup(user)
		if st == nil {
			st = l.insert(user)
		}
		st.mu.Lock()
		due := st.epoch != epoch || (st.retryAt != 0 && nowMs >= st.retryAt)
		seq := st.seq
		st.mu.Unlock()
		if !due {
			continue
		}
		if seen == nil {
			seen = make(map[*userState]struct{}, len(users))
		}
		if _, dup := seen[st]; dup {
			continue
		}
		seen[st] = struct{}{}
		names, states, seqs = append(names, user), append(states, st), append(seqs, seq)
	}
	if len(names) == 0 {
		return
	}
	if l.readsPaused(states, epoch, nowMs) {
		return
	}
	historySince := int64(-1)
	if l.cfg.Progressive.Enabled {
		historySince = nowMs - l.cfg.Progressive.History.Milliseconds()
	}
	lctx, cancel := context.WithTimeout(ctx, l.o.timeout)
	recs, errs := l.store.loadMany(lctx, names, historySince)
	cancel()
	var failed error
	for i, st := range states {
		st.mu.Lock()
		switch {
		case errs[i] != nil:
			st.epoch, st.retryAt = epoch, nowMs+loadRetry.Milliseconds()
			failed = errs[i]
		case st.seq == seqs[i]:
			l.applyRecord(st, names[i], recs[i])
			st.epoch, st.retryAt = epoch, 0
		default:
			// An event changed the state while we read: read it alone,
			// with load's re-read on a race.
			st.mu.Unlock()
			l.load(ctx, st, names[i], nowMs)
			continue
		}
		st.mu.Unlock()
	}
	if failed != nil {
		l.pauseReads(nowMs)
		l.o.logger.Warn("rate limiter runs on defaults for users", zap.Int("users", len(names)), zap.Error(failed))
	}
}

// pauseReads stops reads of users' records for loadRetry after nowMs (a
// read just failed; see pausedUntil).
func (l *Limiter) pauseReads(nowMs int64) { l.pausedUntil.Store(nowMs + loadRetry.Milliseconds()) }

// readsPaused reports whether reads are paused at nowMs; if so, states run
// on defaults until the pause ends, as after a failed read of their own.
func (l *Limiter) readsPaused(states []*userState, epoch uint64, nowMs int64) bool {
	until := l.pausedUntil.Load()
	if nowMs >= until {
		return false
	}
	for _, st := range states {
		st.mu.Lock()
		st.epoch, st.retryAt = epoch, until
		st.mu.Unlock()
	}
	return true
}

// insert adds a state for user that is due for loading (retryAt in the
// past), so that Allow loads it if nobody else did; it returns the existing
// state when there is one.
func (l *Limiter) insert(user string) *userState {
	sh := l.shard(user)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	st, ok := sh.users[user]
	if !ok {
		st = &userState{epoch: l.epoch.Load(), retryAt: 1}
		sh.users[user] = st
	}
	return st
}

// create adds a state for user and loads its record. The state is in the
// map before the read so an event arriving meanwhile is not lost (the
// load's seq check keeps it).
func (l *Limiter) create(ctx context.Context, user string, nowMs int64) *userState {
	sh := l.shard(user)
	sh.mu.Lock()
	st, ok := sh.users[user]
	if !ok {
		st = &userState{epoch: l.epoch.Load()}
		sh.users[user] = st
	}
	sh.mu.Unlock()
	if !ok && l.store != nil {
		l.load(ctx, st, user, nowMs)
	}
	return st
}

// load reads user's record from Redis into st.
func (l *Limiter) load(ctx context.Context, st *userState, user string, nowMs int64) {
	historySince := int64(-1)
	if l.cfg.Progressive.Enabled {
		historySince = nowMs - l.cfg.Progressive.History.Milliseconds()
	}
	epoch := l.epoch.Load()
	if l.readsPaused([]*userState{st}, epoch, nowMs) {
		return
	}
	for attempt := 0; attempt < 3; attempt++ {
		st.mu.Lock()
		seq := st.seq
		st.mu.Unlock()
		lctx, cancel := context.WithTimeout(ctx, l.o.timeout)
		rec, err := l.store.load(lctx, user, historySince)
		cancel()
		st.mu.Lock()
		if err != nil {
			st.epoch, st.retryAt = epoch, nowMs+loadRetry.Milliseconds()
			st.mu.Unlock()
			l.pauseReads(nowMs)
			l.o.logger.Warn("rate limiter runs on defaults for user", zap.String("user_id", user), zap.Error(err))
			return
		}
		if st.seq == seq {
			l.applyRecord(st, user, rec)
			st.epoch, st.retryAt = epoch, 0
			st.mu.Unlock()
			return
		}
		st.mu.Unlock() // an event changed the state while we read: read again
	}
	// Events kept arriving; what they set is newer than any read.
	st.mu.Lock()
	st.epoch, st.retryAt = epoch, 0
	st.mu.Unlock()
}

// applyRecord installs a record read from Redis; st.mu is held. A block this
// node decided but has not written yet is newer than the read.
func (l *Limiter) applyRecord(st *userState, user string, rec userRecord) {
	if l.o.etcd != nil {
		l.egMu.RLock()
		rec.group = l.egroups[user]
		l.egMu.RUnlock()
	}
	st.group, st.ruleGen = rec.group, 0
	st.blockedUntil, st.history = rec.blockedUntil, rec.history
	if w, ok := l.writer.pendingFor(user); ok {
		if w.until > st.blockedUntil {
			st.blockedUntil = w.until
		}
		if w.keepMs > 0 && (len(st.history) == 0 || st.history[len(st.history)-1] < w.nowMs) {
			st.history = append(st.history, w.nowMs)
		}
	}
}

// decide applies the rule to one message; st.mu is held.
func (l *Limiter) decide(st *userState, user string, nowMs int64) (d Decision, w blockWrite, blocked bool) {
	if rs := l.rules.Load(); st.ruleGen != rs.gen {
		st.resolve(rs)
	}
	r := st.rule
	d.Group = r.name
	if st.blockedUntil != 0 {
		if nowMs < st.blockedUntil {
			l.m.userBlocked.Inc()
			d.Reason, d.Violations = ReasonUserBlocked, int(st.violations)
			d.setBlock(st.blockedUntil)
			return d, w, false
		}
		st.blockedUntil = 0
	}
	if r.whitelist {
		l.m.allowed.Inc()
		d.Allowed = true
		return d, w, false
	}
	st.prune(nowMs - r.windowMs)
	if st.n >= r.max {
		st.violations++
		l.m.rateLimited.Inc()
		r.violations.Inc()
		d.Reason, d.Violations = ReasonRateLimited, int(st.violations)
		if st.violations >= r.threshold && r.block > 0 {
			dur := l.blockFor(st, r, nowMs)
			st.blockedUntil = nowMs + dur.Milliseconds()
			// The count starts afresh after the block: a user who served
			// a block gets the full threshold again.
			st.violations = 0
			r.blocks.Inc()
			d.NewBlock = true
			d.setBlock(st.blockedUntil)
			// The block is in the messages' time (it covers what the user
			// sent until it ends); Redis keeps it until then by the wall
			// clock, so a block decided while catching up on a backlog
			// lasts only what is left of it.
			ttl := st.blockedUntil - l.o.clock.Now().UnixMilli()
			w = blockWrite{user: user, until: st.blockedUntil, ttlMs: min(ttl, dur.Milliseconds()), nowMs: nowMs}
			if l.cfg.Progressive.Enabled {
				w.keepMs = l.cfg.Progressive.History.Milliseconds()
			}
			return d, w, true
		}
		return d, w, false
	}
	st.push(max(nowMs, st.last()))
	if st.n <= r.max/2 {
		st.violations = 0
	}
	l.m.allowed.Inc()
	d.Allowed, d.Violations = true, int(st.violations)
	return d, w, false
}

func (d *Decision) setBlock(until int64) {
	if until == permanentMs {
		d.Permanent = true
		return
	}
	d.BlockedUntil = time.UnixMilli(until)
}

// blockFor returns the length of a new block; st.mu is held. With the
// progressive penalty the k-th automatic block inside the history window
// lasts base·2^(k-1), capped at max — but never less than the group's own
// block, so a stricter group (suspicious: 24h) is not softened by it.
func (l *Limiter) blockFor(st *userState, r *rule, nowMs int64) time.Duration {
	p := l.cfg.Progressive
	if !p.Enabled {
		return r.block
	}
	since := nowMs - p.History.Milliseconds()
	recent := st.history[:0]
	for _, t := range st.history {
		if t >= since {
			recent = append(recent, t)
		}
	}
	st.history = append(recent, nowMs)
	d := p.Base
	for i := 1; i < len(st.history) && d < p.Max; i++ {
		d *= 2
	}
	return max(min(d, p.Max), r.block)
}

// resolve picks the rule for the state's group from rs; a smaller X keeps
// the newest timestamps.
func (st *userState) resolve(rs *ruleSet) {
	st.rule, st.ruleGen = rs.lookup(st.group), rs.gen
	if limit := int(st.rule.max); len(st.ring) > limit {
		keep := min(int(st.n), limit)
		ring := make([]int64, limit)
		for i := 0; i < keep; i++ {
			ring[i] = st.ring[(int(st.head)+int(st.n)-keep+i)%len(st.ring)]
		}
		st.ring, st.head, st.n = ring, 0, int32(keep)
	}
}

// prune drops timestamps at or before cutoff: each timestamp is dropped
// once, so the cost per message is O(1) amortised.
func (st *userState) prune(cutoff int64) {
	for st.n > 0 && st.ring[st.head] <= cutoff {
		st.head++
		if int(st.head) == len(st.ring) {
			st.head = 0
		}
		st.n--
	}
}

// last returns the newest timestamp in the window (0 when empty). A user's
// messages arrive in send order, but a time may still step back (two
// devices' clocks, a send time in seconds beside a re-injection time in
// milliseconds): the window keeps its timestamps sorted by counting such a
// message at the newest time seen.
func (st *userState) last() int64 {
	if st.n == 0 {
		return 0
	}
	return st.ring[(int(st.head)+int(st.n)-1)%len(st.ring)]
}

// push appends a timestamp; the caller checked n < rule.max, and the ring
// grows (doubling, at most to rule.max) only when it is full, so an idle
// user with a large X costs little.
func (st *userState) push(ts int64) {
	if int(st.n) == len(st.ring) {
		size := min(int(st.rule.max), max(8, 2*len(st.ring)))
		ring := make([]int64, size)
		for i := 0; i < int(st.n); i++ {
			ring[i] = st.ring[(int(st.head)+i)%len(st.ring)]
		}
		st.ring, st.head = ring, 0
	}
	st.ring[(int(st.head)+int(st.n))%len(st.ring)] = ts
	st.n++
}

// Forget drops user's in-memory state (its window and violations) when its
// actor ends. Blocks and groups live in Redis and are read again if the user
// comes back; a block not yet written stays with the writer. Without a
// store nothing outlives Forget, blocks included.
//
// A user with violations counted is kept: forgetting them would hand an
// abuser whose messages are all refused (its actor idles meanwhile) a
// fresh count.
func (l *Limiter) Forget(user string) {
	sh := l.shard(user)
	sh.mu.Lock()
	if st := sh.users[user]; st != nil {
		st.mu.Lock()
		keep := st.violations > 0
		st.mu.Unlock()
		if !keep {
			delete(sh.users, user)
		}
	}
	sh.mu.Unlock()
}

// Users returns how many users' state the limiter holds in memory.
func (l *Limiter) Users() int {
	n := 0
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.RLock()
		n += len(sh.users)
		sh.mu.RUnlock()
	}
	return n
}

// listen applies events until the subscription is closed.
func (l *Limiter) listen(ch <-chan any) {
	for msg := range ch {
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind != "subscribe" {
				continue
			}
			// A resubscription after a reconnect: events may have been lost,
			// so every user reloads its record on its next message.
			l.epoch.Add(1)
			ctx, cancel := context.WithTimeout(context.Background(), l.o.timeout)
			if err := l.refreshRules(ctx); err != nil {
				l.o.logger.Error("reload rate-limit rules", zap.Error(err))
			}
			cancel()
		case *redis.Message:
			ev, err := decodeEvent(m.Payload)
			if err != nil {
				l.o.logger.Warn("ignore rate-limit event", zap.Error(err))
				continue
			}
			l.apply(ev)
		}
	}
}

func (l *Limiter) apply(ev event) {
	if ev.Op == opRules {
		ctx, cancel := context.WithTimeout(context.Background(), l.o.timeout)
		defer cancel()
		if err := l.refreshRules(ctx); err != nil {
			l.o.logger.Error("reload rate-limit rules; keeping the current ones", zap.Error(err))
		}
		return
	}
	st := l.lookup(ev.User)
	if st == nil {
		return // read from Redis when the user shows up
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	st.seq++
	switch ev.Op {
	case opBlock:
		st.blockedUntil = ev.Until
		if ev.Until < 0 {
			st.blockedUntil = permanentMs
		}
	case opUnblock:
		st.blockedUntil, st.violations = 0, 0
	case opGroup:
		st.group, st.ruleGen = ev.Group, 0
	}
}

// refreshRules installs the rules in rl:rules, or the configured ones when
// there is no override. Only New and the listener call it.
func (l *Limiter) refreshRules(ctx context.Context) error {
	if l.o.etcd != nil {
		return nil // the etcd watch installs them (followEtcd)
	}
	groups := l.cfg.Groups
	override, ok, err := l.store.loadRules(ctx)
	if err != nil {
		return err
	}
	if ok {
		groups = fromJSONGroups(override)
		if err := validateGroups(groups, l.cfg.DefaultGroup); err != nil {
			return fmt.Errorf("%s: %w", l.store.rulesKey(), err)
		}
	}
	l.rules.Store(compileRules(groups, l.cfg.DefaultGroup, l.rules.Load().gen+1, l.m))
	return nil
}

// blockedCurrent is kfpipe_blocked_users_current: cluster-wide from Redis
// with a store, else this process's blocked users.
func (l *Limiter) blockedCurrent() float64 {
	nowMs := l.o.clock.Now().UnixMilli()
	if l.store != nil {
		ctx, cancel := context.WithTimeout(context.Background(), l.o.timeout)
		defer cancel()
		n, err := l.store.rdb.ZCount(ctx, l.store.blockedKey(), fmt.Sprintf("(%d", nowMs), "+inf").Result()
		if err != nil {
			l.o.logger.Warn("count blocked users", zap.Error(err))
			return math.NaN()
		}
		return float64(n)
	}
	var n int
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.RLock()
		for _, st := range sh.users {
			st.mu.Lock()
			if st.blockedUntil > nowMs {
				n++
			}
			st.mu.Unlock()
		}
		sh.mu.RUnlock()
	}
	return float64(n)
}
