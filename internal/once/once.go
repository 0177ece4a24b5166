// Package once makes an effect happen at most once per key (invariant I3).
//
// A call claims the key ("processing", with a lease), runs f, and on success
// replaces the claim with a "done" marker that lives for the caller's ttl.
// When f fails the claim is deleted so a later call can retry. A caller that
// finds someone else's claim waits until it becomes done (and then returns
// without calling f) or disappears (and then claims it itself); it never
// treats a claim as done. A claimer that crashes blocks its key for at most
// the lease.
//
// Every step that decides on a key's state is one Lua script, so the
// check-and-set is atomic. With Config.Batch the scripts of concurrent calls
// share pipelines.
package once

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// Idempotent runs a function at most once per key.
type Idempotent interface {
	// Do runs f unless key is already done. It returns nil without calling
	// f when the key is done, f's error (after releasing the key so a retry
	// can run) when f fails, and nil after recording the key as done for
	// ttl when f succeeds. When another caller is running the same key, Do
	// waits for it, bounded by ctx.
	Do(ctx context.Context, key string, ttl time.Duration, f func(ctx context.Context) error) error
	// Execute is Do for a function with a result: the result is stored with
	// the done marker, and every caller of the same key — concurrent
	// waiters and later callers — gets that stored result.
	Execute(ctx context.Context, key string, ttl time.Duration, callback func(ctx context.Context) ([]byte, error)) ([]byte, error)
}

// Status says what a call did with its function.
type Status uint8

// Statuses returned by DoStatus and ExecuteStatus.
const (
	// StatusNone: the function was not called and the key was not found
	// done (an error occurred before, e.g. the context ended while waiting).
	StatusNone Status = iota
	// StatusExecuted: the function was called (its error, if any, is
	// returned alongside).
	StatusExecuted
	// StatusDuplicate: the key was already done; the function was not
	// called.
	StatusDuplicate
)

// String returns the status's name.
func (s Status) String() string {
	switch s {
	case StatusExecuted:
		return "executed"
	case StatusDuplicate:
		return "duplicate"
	default:
		return "none"
	}
}

// Client implements Idempotent on Redis. It is safe for concurrent use.
type Client struct {
	rdb       redis.UniversalClient
	ownsRDB   bool
	prefix    string
	lease     time.Duration
	leaseMs   int64
	poll      time.Duration
	opTimeout time.Duration
	owner     string // "p:<random>:" — a call appends its sequence number
	seq       atomic.Uint64
	log       *zap.Logger
	m         *metrics
	b         *batcher // nil without batching

	closeOnce sync.Once
	closeErr  error
}

var _ Idempotent = (*Client)(nil)

// New returns a Client. It loads the Lua scripts, so it fails when Redis is
// unreachable within ctx. serviceName labels metrics and the claims'
// owners (visible in Redis when debugging a stuck key).
func New(ctx context.Context, serviceName string, cfg Config, opts ...Option) (*Client, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	o := options{}
	for _, opt := range opts {
		opt(&o)
	}
	if o.log == nil {
		o.log = zap.NewNop()
	}
	if serviceName == "" {
		serviceName = "kfpipe"
	}
	c := &Client{
		rdb:       cfg.Client,
		prefix:    cfg.KeyPrefix,
		lease:     cfg.Lease,
		leaseMs:   cfg.Lease.Milliseconds(),
		poll:      cfg.PollInterval,
		opTimeout: cfg.OpTimeout,
		owner:     processingPrefix + serviceName + ":" + randomID() + ":",
		log:       o.log,
		m:         newMetrics(serviceName, o.reg),
	}
	if c.rdb == nil {
		c.rdb = redis.NewClient(&redis.Options{Addr: cfg.Addr})
		c.ownsRDB = true
	}
	// Loading up front makes the pipelined EVALSHA path hit on the first
	// batch; NOSCRIPT (after a Redis restart) is still handled per command.
	for _, s := range allScripts {
		if err := s.Load(ctx, c.rdb).Err(); err != nil {
			if c.ownsRDB {
				_ = c.rdb.Close()
			}
			return nil, fmt.Errorf("once: load scripts: %w", err)
		}
	}
	if cfg.Batch.Enabled {
		c.b = newBatcher(c.rdb, cfg.Batch, cfg.OpTimeout, c.m.batchOps)
	}
	return c, nil
}

func randomID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Close stops the batcher after the operations it holds were sent, and
// closes the Redis client when New created it. Calls after Close fail with
// ErrClosed (batching) or a Redis error (owned client).
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		if c.b != nil {
			c.b.close()
		}
		if c.ownsRDB {
			c.closeErr = c.rdb.Close()
		}
	})
	return c.closeErr
}

// Do implements Idempotent.
func (c *Client) Do(ctx context.Context, key string, ttl time.Duration, f func(ctx context.Context) error) error {
	_, err := c.DoStatus(ctx, key, ttl, f)
	return err
}

// Execute implements Idempotent.
func (c *Client) Execute(ctx context.Context, key string, ttl time.Duration, callback func(ctx context.Context) ([]byte, error)) ([]byte, error) {
	res, _, err := c.ExecuteStatus(ctx, key, ttl, callback)
	return res, err
}

// DoStatus is Do that also reports whether f ran or the key was a
// duplicate, for callers that count duplicates. It is outside Idempotent so
// that interface stays the two-method contract.
func (c *Client) DoStatus(ctx context.Context, key string, ttl time.Duration, f func(ctx context.Context) error) (Status, error) {
	_, st, err := c.run(ctx, key, ttl, func(ctx context.Context) ([]byte, error) { return nil, f(ctx) })
	return st, err
}

// ExecuteStatus is Execute that also reports whether callback ran or the
// key was a duplicate.
func (c *Client) ExecuteStatus(ctx context.Context, key string, ttl time.Duration, callback func(ctx context.Context) ([]byte, error)) ([]byte, Status, error) {
	return c.run(ctx, key, ttl, callback)
}

func (c *Client) run(ctx context.Context, key string, ttl time.Duration, f func(ctx context.Context) ([]byte, error)) ([]byte, Status, error) {
	if ttl < time.Millisecond {
		c.m.errored.Inc()
		return nil, StatusNone, ErrInvalidTTL
	}
	rkey := c.prefix + key
	claim := c.owner + strconv.FormatUint(c.seq.Add(1), 10)

	var timer *time.Timer
	waited := false
	for {
		v, err := c.script(ctx, claimScript, rkey, claim, c.leaseMs)
		if err != nil {
			c.m.errored.Inc()
			return nil, StatusNone, fmt.Errorf("once: claim %q: %w", key, err)
		}
		var s string
		switch v := v.(type) {
		case int64: // claimed
			if timer != nil {
				timer.Stop()
			}
			return c.execute(ctx, key, rkey, claim, ttl, f)
		case string:
			s = v
		default:
			c.m.errored.Inc()
			return nil, StatusNone, fmt.Errorf("once: claim %q: unexpected reply %T", key, v)
		}
		switch {
		case strings.HasPrefix(s, donePrefix):
			if timer != nil {
				timer.Stop()
			}
			c.m.duplicate.Inc()
			return []byte(s[len(donePrefix):]), StatusDuplicate, nil
		case strings.HasPrefix(s, processingPrefix):
			// Someone else is running this key: wait, then look again. It
			// either finishes (done), fails (key gone: we claim it) or
			// crashes (lease expires: we claim it).
			if !waited {
				waited = true
				c.m.waits.Inc()
			}
			if timer == nil {
				timer = time.NewTimer(c.poll)
			} else {
				timer.Reset(c.poll)
			}
			select {
			case <-ctx.Done():
				timer.Stop()
				c.m.errored.Inc()
				return nil, StatusNone, fmt.Errorf("once: waiting for %q: %w", key, ctx.Err())
			case <-timer.C:
			}
		default:
			c.m.errored.Inc()
			return nil, StatusNone, fmt.Errorf("%w: %q", ErrUnexpectedValue, key)
		}
	}
}

// execute runs f under our claim and records the outcome.
func (c *Client) execute(ctx context.Context, key, rkey, claim string, ttl time.Duration, f func(ctx context.Context) ([]byte, error)) (res []byte, st Status, err error) {
	fctx, cancel := context.WithCancelCause(ctx)
	ext := startExtender(c, key, rkey, claim, cancel)
	finished := false
	defer func() {
		ext.stop()
		cancel(nil)
		if !finished {
			// f panicked: free the key for a retry, then let the panic go on.
			_ = c.release(ctx, rkey, claim)
		}
	}()
	res, ferr := f(fctx)
	finished = true
	ext.stop()

	// ctx may have ended while f ran; the outcome must still be recorded.
	if ferr != nil {
		c.m.failed.Inc()
		if rerr := c.release(ctx, rkey, claim); rerr != nil {
			// The claim stays until its lease expires; a retry then runs.
			return nil, StatusExecuted, errors.Join(ferr, fmt.Errorf("once: release %q: %w", key, rerr))
		}
		return nil, StatusExecuted, ferr
	}
	done := make([]byte, 0, len(donePrefix)+len(res))
	done = append(append(done, donePrefix...), res...)
	v, err := c.script(context.WithoutCancel(ctx), finishScript, rkey, claim, done, ttl.Milliseconds())
	if err != nil {
		c.m.errored.Inc()
		return res, StatusExecuted, fmt.Errorf("once: mark %q done: %w", key, err)
	}
	if n, _ := v.(int64); n != 1 {
		c.m.leaseLost.Inc()
		c.log.Warn("once: claim expired while f ran; key recorded done anyway",
			zap.String("key", key), zap.Int64("finish", n), zap.Duration("lease", c.lease))
	}
	c.m.executed.Inc()
	return res, StatusExecuted, nil
}

func (c *Client) release(ctx context.Context, rkey, claim string) error {
	_, err := c.script(context.WithoutCancel(ctx), releaseScript, rkey, claim)
	return err
}

// script runs s on one key, through the batcher when batching is on.
func (c *Client) script(ctx context.Context, s *redis.Script, rkey string, args ...any) (any, error) {
	if c.b != nil {
		return c.b.do(ctx, s, rkey, args)
	}
	ctx, cancel := context.WithTimeout(ctx, c.opTimeout)
	defer cancel()
	return s.Run(ctx, c.rdb, []string{rkey}, args...).Result()
}
