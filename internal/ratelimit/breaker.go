package ratelimit

import (
	"fmt"
	"hash/maphash"
	"sync"

	"github.com/kfpipe/kfpipe/internal/config"
	"go.uber.org/zap"
)

// State is a circuit breaker's state.
type State int32

// Breaker states.
const (
	StateClosed State = iota
	StateOpen
	StateHalfOpen
)

// String returns closed, open or half-open (the metric label values).
func (s State) String() string {
	switch s {
	case StateClosed:
		return "closed"
	case StateOpen:
		return "open"
	case StateHalfOpen:
		return "half-open"
	}
	return fmt.Sprintf("state(%d)", int32(s))
}

// Breakers holds one circuit breaker per user, the third layer of the
// per-user isolation (I5): FailureThreshold consecutive failures (the consumer reports a full
// mailbox as one) open it; after OpenTimeout it lets HalfOpenMax trial
// messages through; that many successes close it, any failure re-opens it.
// A result reported for a message admitted before the last transition is
// ignored.
//
// This is gobreaker's state machine (sony/gobreaker/v2 TwoStepCircuitBreaker)
// written out rather than used, for two reasons: gobreaker reads time.Now
// itself, so the open timeout could only be tested by sleeping (STYLE: time
// is injected where behaviour depends on it); and one gobreaker per user
// carries its settings, callbacks and a counts allocation (a few hundred
// bytes), where this keeps 40 bytes per user.
type Breakers struct {
	cfg    config.Breaker
	o      options
	m      *breakerMetrics
	seed   maphash.Seed
	shards [numShards]breakerShard
}

type breakerShard struct {
	mu    sync.RWMutex
	users map[string]*breaker
	_     [32]byte
}

type breaker struct {
	mu        sync.Mutex
	state     State
	failures  int32 // consecutive, while closed
	admitted  int32 // trials let through, while half-open
	successes int32 // trial successes, while half-open
	gen       uint64
	openUntil int64 // unix ns, while open
}

// NewBreakers returns an empty registry for cfg.
func NewBreakers(cfg config.Breaker, opts ...Option) (*Breakers, error) {
	if cfg.FailureThreshold < 1 || cfg.OpenTimeout <= 0 || cfg.HalfOpenMax < 1 {
		return nil, fmt.Errorf("breaker: failure_threshold and half_open_max must be >= 1 and open_timeout > 0, got %d, %d, %s",
			cfg.FailureThreshold, cfg.HalfOpenMax, cfg.OpenTimeout)
	}
	bs := &Breakers{cfg: cfg, o: buildOptions(opts), seed: maphash.MakeSeed()}
	bs.m = newBreakerMetrics(bs.o.reg)
	for i := range bs.shards {
		bs.shards[i].users = make(map[string]*breaker)
	}
	return bs, nil
}

func (bs *Breakers) shard(user string) *breakerShard {
	return &bs.shards[maphash.String(bs.seed, user)%numShards]
}

func (bs *Breakers) get(user string, create bool) *breaker {
	sh := bs.shard(user)
	sh.mu.RLock()
	b := sh.users[user]
	sh.mu.RUnlock()
	if b != nil || !create {
		return b
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if b = sh.users[user]; b == nil {
		b = &breaker{}
		sh.users[user] = b
	}
	return b
}

// Allow asks whether user's next message may go on. On nil error the caller
// must report the outcome once with done (true: success, false: failure).
// While the breaker is open, or half-open with all trials admitted, it
// returns ErrCircuitOpen.
func (bs *Breakers) Allow(user string) (done func(success bool), err error) {
	b := bs.get(user, true)
	now := bs.o.clock.Now().UnixNano()
	b.mu.Lock()
	bs.advance(b, user, now)
	switch b.state {
	case StateOpen:
		b.mu.Unlock()
		return nil, ErrCircuitOpen
	case StateHalfOpen:
		if b.admitted >= int32(bs.cfg.HalfOpenMax) {
			b.mu.Unlock()
			return nil, ErrCircuitOpen
		}
		b.admitted++
	}
	gen := b.gen
	b.mu.Unlock()
	return func(success bool) { bs.done(b, user, gen, success) }, nil
}

func (bs *Breakers) done(b *breaker, user string, gen uint64, success bool) {
	now := bs.o.clock.Now().UnixNano()
	b.mu.Lock()
	defer b.mu.Unlock()
	if gen != b.gen {
		return
	}
	switch b.state {
	case StateClosed:
		if success {
			b.failures = 0
			return
		}
		b.failures++
		if b.failures >= int32(bs.cfg.FailureThreshold) {
			bs.transition(b, user, StateOpen, now)
		}
	case StateHalfOpen:
		if !success {
			bs.transition(b, user, StateOpen, now)
			return
		}
		b.successes++
		if b.successes >= int32(bs.cfg.HalfOpenMax) {
			bs.transition(b, user, StateClosed, now)
		}
	}
}

// advance moves an open breaker whose timeout has passed to half-open; b.mu is held.
func (bs *Breakers) advance(b *breaker, user string, now int64) {
	if b.state == StateOpen && now >= b.openUntil {
		bs.transition(b, user, StateHalfOpen, now)
	}
}

// transition enters state to; b.mu is held.
func (bs *Breakers) transition(b *breaker, user string, to State, now int64) {
	from := b.state
	b.state, b.gen = to, b.gen+1
	b.failures, b.admitted, b.successes = 0, 0, 0
	if from == StateOpen {
		bs.m.open.Dec()
	}
	switch to {
	case StateOpen:
		b.openUntil = now + bs.cfg.OpenTimeout.Nanoseconds()
		bs.m.open.Inc()
		bs.m.toOpen.Inc()
		bs.o.logger.Warn("circuit breaker opened", zap.String("user_id", user), zap.Stringer("from", from))
	case StateHalfOpen:
		bs.m.toHalfOpen.Inc()
	case StateClosed:
		bs.m.toClosed.Inc()
		bs.o.logger.Info("circuit breaker closed", zap.String("user_id", user))
	}
}

// State returns user's breaker state (closed for a user without one).
func (bs *Breakers) State(user string) State {
	b := bs.get(user, false)
	if b == nil {
		return StateClosed
	}
	now := bs.o.clock.Now().UnixNano()
	b.mu.Lock()
	defer b.mu.Unlock()
	bs.advance(b, user, now)
	return b.state
}

// Forget drops user's breaker when its actor ends; an outstanding done of
// that breaker then has no effect on a later one. A breaker that is not
// closed is kept: the user's messages are refused while it is open (so its
// actor idles), and forgetting it would let them all through again.
func (bs *Breakers) Forget(user string) {
	sh := bs.shard(user)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	b := sh.users[user]
	if b == nil {
		return
	}
	b.mu.Lock()
	closed := b.state == StateClosed
	if closed {
		b.gen++
	}
	b.mu.Unlock()
	if closed {
		delete(sh.users, user)
	}
}

// Users returns how many users' breakers are held in memory.
func (bs *Breakers) Users() int {
	n := 0
	for i := range bs.shards {
		sh := &bs.shards[i]
		sh.mu.Lock()
		n += len(sh.users)
		sh.mu.Unlock()
	}
	return n
}
