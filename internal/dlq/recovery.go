package dlq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/deadletter"
)

// DefaultMaxRetries applies to a reason that neither recovery.max_retries
// nor the reason table names.
const DefaultMaxRetries = deadletter.DefaultMaxRetries

// BlockLookup tells until when a user is blocked by the rate limiter
// (the ratelimit package implements it); ok is false when not blocked.
type BlockLookup interface {
	BlockedUntil(ctx context.Context, user string) (until time.Time, ok bool, err error)
}

// RetryRecord is what goes back to the main topic.
type RetryRecord struct {
	Key     []byte
	Value   []byte
	Headers []chatmsg.Header
}

// RecoveryStrategy decides how a dead letter of one reason is recovered
// (the strategy column of the reason table, package deadletter). CanRecover
// false sends it to manual review.
type RecoveryStrategy interface {
	CanRecover(ctx context.Context, dl *chatmsg.DeadLetter) bool
	// CalculateRetryDelay is counted from dl.FailureTime, so placing the
	// same dead letter twice (a rebuild) gives the same due time.
	CalculateRetryDelay(ctx context.Context, dl *chatmsg.DeadLetter) time.Duration
	PrepareRetry(dl *chatmsg.DeadLetter) (*RetryRecord, error)
	OnSuccess(dl *chatmsg.DeadLetter)
	OnFailure(dl *chatmsg.DeadLetter, err error)
}

// ErrNothingToRetry is returned by PrepareRetry for a dead letter without
// an original message.
var ErrNothingToRetry = errors.New("dlq: dead letter has no original message")

// backoff is the default strategy: base × 2^retry, capped, up to
// maxRetries re-injections.
type backoff struct {
	maxRetries int
	base, cap  time.Duration
	log        *zap.Logger
}

func (b *backoff) CanRecover(_ context.Context, dl *chatmsg.DeadLetter) bool {
	return dl.Recoverable && dl.RetryCount < b.maxRetries
}

func (b *backoff) CalculateRetryDelay(_ context.Context, dl *chatmsg.DeadLetter) time.Duration {
	d := b.base
	for i := 0; i < dl.RetryCount && d < b.cap; i++ {
		d *= 2
	}
	return min(d, b.cap)
}

func (b *backoff) PrepareRetry(dl *chatmsg.DeadLetter) (*RetryRecord, error) {
	value := dl.OriginalValue
	if len(value) == 0 && dl.Original != nil {
		v, err := chatmsg.Encode(dl.Original)
		if err != nil {
			return nil, err
		}
		value = v
	}
	if len(value) == 0 {
		return nil, ErrNothingToRetry
	}
	key := []byte(dl.UserID)
	if len(key) == 0 {
		key = dl.OriginalKey
	}
	hs := make([]chatmsg.Header, 0, len(dl.OriginalHeaders)+3)
	for _, h := range dl.OriginalHeaders {
		switch h.Key {
		case chatmsg.HeaderRetryFromDLQ, chatmsg.HeaderRetryCount, chatmsg.HeaderOriginalFailure, chatmsg.HeaderDLQID:
			continue // replaced below
		}
		hs = append(hs, h)
	}
	hs = append(hs,
		chatmsg.Header{Key: chatmsg.HeaderRetryFromDLQ, Value: []byte("true")},
		chatmsg.Header{Key: chatmsg.HeaderRetryCount, Value: []byte(strconv.Itoa(dl.RetryCount + 1))},
		chatmsg.Header{Key: chatmsg.HeaderOriginalFailure, Value: []byte(dl.Reason)},
		chatmsg.Header{Key: chatmsg.HeaderDLQID, Value: []byte(dl.ID)},
	)
	return &RetryRecord{Key: key, Value: value, Headers: hs}, nil
}

func (b *backoff) OnSuccess(dl *chatmsg.DeadLetter) {
	b.log.Info("dead letter re-injected", zap.String("dlq_id", dl.ID), zap.String("user_id", dl.UserID),
		zap.String("reason", string(dl.Reason)), zap.Int("retry", dl.RetryCount+1))
}

func (b *backoff) OnFailure(dl *chatmsg.DeadLetter, err error) {
	b.log.Warn("dead letter re-injection failed", zap.String("dlq_id", dl.ID), zap.String("user_id", dl.UserID),
		zap.String("reason", string(dl.Reason)), zap.Error(err))
}

// blocked waits until the user's block ends (never before the backoff).
type blocked struct {
	backoff
	lookup BlockLookup
}

func (b *blocked) CalculateRetryDelay(ctx context.Context, dl *chatmsg.DeadLetter) time.Duration {
	d := b.backoff.CalculateRetryDelay(ctx, dl)
	if b.lookup == nil {
		return d
	}
	until, ok, err := b.lookup.BlockedUntil(ctx, dl.UserID)
	if err != nil {
		b.log.Warn("block lookup failed; using backoff", zap.String("user_id", dl.UserID), zap.Error(err))
		return d
	}
	if ok {
		// A second past the end so the limiter has surely let go.
		if w := until.Sub(dl.FailureTime) + time.Second; w > d {
			return w
		}
	}
	return d
}

// never is for reasons that no retry can fix (invalid_message,
// handler_rejected).
type never struct{ backoff }

func (never) CanRecover(context.Context, *chatmsg.DeadLetter) bool { return false }

// Policy holds the strategy of every reason and places dead letters: it
// fills max retries, TTL and expiry from config.Recovery and decides due
// (with its time) or manual review.
type Policy struct {
	cfg        config.Recovery
	strategies map[Reason]RecoveryStrategy
	def        RecoveryStrategy
}

// NewPolicy builds the strategies from cfg. Options: WithBlockLookup,
// WithLogger.
func NewPolicy(cfg config.Recovery, opts ...Option) *Policy {
	o := buildOptions(opts)
	log := o.log.Named("dlq-recovery")
	mk := func(r Reason) backoff {
		n, ok := cfg.MaxRetries[string(r)]
		if !ok {
			n = DefaultMaxRetries
		}
		return backoff{maxRetries: n, base: cfg.BaseDelay, cap: cfg.MaxDelay, log: log}
	}
	p := &Policy{cfg: cfg, strategies: map[Reason]RecoveryStrategy{}}
	for _, r := range Reasons {
		switch deadletter.StrategyOf(r) {
		case deadletter.StrategyNever:
			p.strategies[r] = &never{mk(r)}
		case deadletter.StrategyAfterBlock:
			// A rate-limited message of a user the limiter has since
			// blocked would only be refused again as user_blocked: it
			// waits for the block's end as well.
			p.strategies[r] = &blocked{backoff: mk(r), lookup: o.blocks}
		default:
			b := mk(r)
			p.strategies[r] = &b
		}
	}
	def := backoff{maxRetries: DefaultMaxRetries, base: cfg.BaseDelay, cap: cfg.MaxDelay, log: log}
	p.def = &def
	return p
}

// Strategy returns the strategy of reason r.
func (p *Policy) Strategy(r Reason) RecoveryStrategy {
	if s, ok := p.strategies[r]; ok {
		return s
	}
	if n, ok := p.cfg.MaxRetries[string(r)]; ok {
		return &backoff{maxRetries: n, base: p.cfg.BaseDelay, cap: p.cfg.MaxDelay, log: p.def.(*backoff).log}
	}
	return p.def
}

// MaxRetries returns the configured max retries of r.
func (p *Policy) MaxRetries(r Reason) int {
	if n, ok := p.cfg.MaxRetries[string(r)]; ok {
		return n
	}
	return DefaultMaxRetries
}

// TTL returns how long dead letters of r stay in the index.
func (p *Policy) TTL(r Reason) time.Duration {
	if d, ok := p.cfg.TTL[string(r)]; ok && d > 0 {
		return d
	}
	return p.cfg.DefaultTTL
}

// Place fills the recovery fields of dl and decides where it goes: due at
// dl.NextRetryTime, or manual review (dl.ManualReview) when its strategy
// cannot recover it (not recoverable, or retries exhausted). A dead letter
// the sender already flagged for review stays there.
func (p *Policy) Place(ctx context.Context, dl *chatmsg.DeadLetter) {
	dl.MaxRetries = p.MaxRetries(dl.Reason)
	dl.TTL = p.TTL(dl.Reason)
	if !dl.FailureTime.IsZero() && dl.TTL > 0 {
		dl.ExpiresAt = dl.FailureTime.Add(dl.TTL)
	}
	dl.Recoverable = dl.Recoverable && IsRecoverable(dl.Reason)
	s := p.Strategy(dl.Reason)
	if dl.ManualReview || !s.CanRecover(ctx, dl) {
		dl.ManualReview = true
		dl.NextRetryTime = nil
		if dl.Recoverable {
			dl.SuggestedAction = ActionEscalate // retries exhausted
		} else {
			dl.SuggestedAction = ActionManualReview
		}
		return
	}
	t := dl.FailureTime.Add(s.CalculateRetryDelay(ctx, dl))
	dl.NextRetryTime = &t
}

// String describes the policy for logs.
func (p *Policy) String() string {
	return fmt.Sprintf("backoff %s..%s, max retries %v", p.cfg.BaseDelay, p.cfg.MaxDelay, p.cfg.MaxRetries)
}
