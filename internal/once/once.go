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
// Every step that decides on a key's state is one atomic Redis command. On
// Redis 7.0+ the claim is SET NX PX GET; the done marker, the release and
// the lease extension are Lua scripts because they must compare the stored
// claim before they write (a done mark never overwrites another caller's
// claim); older servers get scripts throughout. A claim whose renewals
// fail for most of a lease is given up by its owner before Redis can let
// someone else take it (see keeper).
// With Config.Batch the commands of concurrent calls share pipelines.
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
	leaseMs   any // Lease in milliseconds (int64), boxed once for command arguments
	ttlBox    atomic.Pointer[boxedTTL]
	poll      time.Duration
	opTimeout time.Duration
	owner     string // "p:<random>:" — a call appends its sequence number
	seq       atomic.Uint64
	log       *zap.Logger
	m         *metrics
	b         *batcher // nil without batching
	keep      *keeper  // renews the claims of running calls
	waits     waitSet  // calls waiting on someone else's claim
	// setGet: the server accepts SET … NX GET, so a claim is one plain
	// command instead of a script (detected once by New).
	setGet bool

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
	o := applyOptions(opts)
	if serviceName == "" {
		serviceName = "kfpipe"
	}
	c := &Client{
		rdb:       cfg.Client,
		prefix:    cfg.KeyPrefix,
		lease:     cfg.Lease,
		leaseMs:   any(cfg.Lease.Milliseconds()),
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
	if !o.scriptClaim {
		ok, err := probeSetNXGet(ctx, c.rdb, c.prefix)
		if err != nil {
			if c.ownsRDB {
				_ = c.rdb.Close()
			}
			return nil, fmt.Errorf("once: probe SET NX GET: %w", err)
		}
		c.setGet = ok
		if !ok {
			c.log.Info("once: Redis rejects SET NX GET (older than 7.0); claiming with a Lua script")
		}
	}
	if cfg.Batch.Enabled {
		c.b = newBatcher(c.rdb, cfg.Batch, cfg.OpTimeout, c.m.batchOps)
	}
	c.keep = newKeeper(c)
	registerWaitGauges(serviceName, o.reg, c)
	return c, nil
}

// probeSetNXGet reports whether the server accepts SET with both NX and
// GET (Redis 7.0+). Before 7.0 the combination is a syntax error, which is
// the answer "no"; any other error (e.g. the network) is returned.
func probeSetNXGet(ctx context.Context, rdb redis.UniversalClient, prefix string) (bool, error) {
	key := prefix + "once-probe:" + randomID()
	err := rdb.Do(ctx, "set", key, "1", "px", 10000, "nx", "get").Err()
	if err == nil || errors.Is(err, redis.Nil) {
		return true, rdb.Del(ctx, key).Err()
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		return false, nil
	}
	return false, err
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
		c.keep.close()
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
	_, st, err := c.run(ctx, key, ttl, true, func(ctx context.Context) ([]byte, error) { return nil, f(ctx) })
	return st, err
}

// ExecuteStatus is Execute that also reports whether callback ran or the
// key was a duplicate.
func (c *Client) ExecuteStatus(ctx context.Context, key string, ttl time.Duration, callback func(ctx context.Context) ([]byte, error)) ([]byte, Status, error) {
	return c.run(ctx, key, ttl, false, callback)
}

// run is Do (noResult) and Execute.
func (c *Client) run(ctx context.Context, key string, ttl time.Duration, noResult bool, f func(ctx context.Context) ([]byte, error)) ([]byte, Status, error) {
	if ttl < time.Millisecond {
		c.m.errored.Inc()
		return nil, StatusNone, ErrInvalidTTL
	}
	return c.runClaim(ctx, key, c.prefix+key, c.newClaim(), ttl, noResult, f, Hooks{})
}

// newClaim returns a claim value no other call uses.
func (c *Client) newClaim() string { return c.owner + strconv.FormatUint(c.seq.Add(1), 10) }

// runClaim is run with the key's Redis name and the claim value to set.
// Finding that very claim value already set means the claim is ours, taken
// ahead by ClaimAhead: it is confirmed (and its lease renewed) instead of
// waited on. h is execute's.
func (c *Client) runClaim(ctx context.Context, key, rkey, claim string, ttl time.Duration, noResult bool,
	f func(ctx context.Context) ([]byte, error), h Hooks) ([]byte, Status, error) {
	var timer *time.Timer
	var w *waiter
	defer func() {
		if timer != nil {
			timer.Stop()
		}
		c.waits.remove(w)
	}()
	for {
		sent := time.Now()
		s, claimed, err := c.claim(ctx, rkey, claim)
		if err != nil {
			c.m.errored.Inc()
			return nil, StatusNone, fmt.Errorf("once: claim %q: %w", key, err)
		}
		if !claimed && s == claim {
			// Our own claim from ClaimAhead: make sure it is still ours.
			sent = time.Now()
			if claimed, err = c.extend(ctx, rkey, claim); err != nil {
				c.m.errored.Inc()
				return nil, StatusNone, fmt.Errorf("once: claim %q: %w", key, err)
			}
			if !claimed {
				continue // it expired meanwhile: claim again
			}
		}
		if claimed {
			c.waits.remove(w)
			w = nil
			return c.execute(ctx, key, rkey, claim, sent, ttl, noResult, f, h)
		}
		switch {
		case strings.HasPrefix(s, donePrefix):
			c.m.duplicate.Inc()
			return []byte(s[len(donePrefix):]), StatusDuplicate, nil
		case strings.HasPrefix(s, processingPrefix):
			// Someone else is running this key: wait, then look again. It
			// either finishes (done), fails (key gone: we claim it) or
			// crashes (lease expires: we claim it).
			if w == nil {
				w = c.waits.add(key, sent)
				c.m.waits.Inc()
			}
			if timer == nil {
				timer = time.NewTimer(c.poll)
			} else {
				timer.Reset(c.poll)
			}
			select {
			case <-ctx.Done():
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

// execute runs f under our claim, which was taken (or last renewed) at
// claimedAt, and records the outcome. The keeper renews the claim while f
// runs and until the done mark is acknowledged; when it finds the claim
// lost — Redis says so, or no renewal has succeeded for long enough that
// the claim may have expired (see keeper) — it cancels f's context with
// ErrLeaseLost, or, with h.Lost set, f gets ctx as it is and h.Lost is
// called instead. With h.Marked set, a successful f's done mark is not
// waited for when it can be sent asynchronously (Do with batching):
// execute returns at once and h.Marked gets the mark's outcome later (see
// markAsync); otherwise h.Marked(nil) is called before a successful return.
func (c *Client) execute(ctx context.Context, key, rkey, claim string, claimedAt time.Time, ttl time.Duration, noResult bool,
	f func(ctx context.Context) ([]byte, error), h Hooks) (res []byte, st Status, err error) {
	fctx, lost := ctx, h.Lost
	if lost == nil {
		var cancel context.CancelCauseFunc
		fctx, cancel = context.WithCancelCause(ctx)
		defer cancel(nil)
		lost = cancel
	}
	hd := c.keep.add(key, rkey, claim, claimedAt, lost)
	kept := true // hd is registered; whoever ends the call removes it
	defer func() {
		if kept {
			c.keep.remove(hd)
			if st == StatusNone {
				// f panicked: free the key for a retry, then let the panic go on.
				_ = c.release(ctx, rkey, claim)
			}
		}
	}()
	res, ferr := f(fctx)
	st = StatusExecuted

	// ctx may have ended while f ran; the outcome must still be recorded.
	if ferr != nil {
		c.keep.remove(hd)
		kept = false
		c.m.failed.Inc()
		if rerr := c.release(ctx, rkey, claim); rerr != nil {
			// The claim stays until its lease expires; a retry then runs.
			return nil, st, errors.Join(ferr, fmt.Errorf("once: release %q: %w", key, rerr))
		}
		return nil, st, ferr
	}
	marked := h.Marked
	if marked != nil && noResult && c.b != nil {
		// The keeper goes on renewing the claim until the mark is written:
		// a slow mark must not let the claim expire after f succeeded.
		kept = false
		c.markAsync(ctx, key, rkey, claim, ttl, 50*time.Millisecond, func(err error) {
			c.keep.remove(hd)
			marked(err)
		})
		return nil, st, nil
	}
	// f's effect has happened: the done mark is retried until it is
	// written or the caller gives up. Returning an error here instead would
	// make the caller run f again once Redis is back and the claim expired.
	var n int64
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		n, err = c.finish(context.WithoutCancel(ctx), rkey, claim, res, ttl)
		if err == nil || errors.Is(err, ErrClosed) || ctx.Err() != nil {
			break
		}
		c.log.Warn("once: marking done failed after f ran; retrying", zap.String("key", key), zap.Error(err))
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
	if err != nil {
		c.m.errored.Inc()
		return res, st, fmt.Errorf("once: mark %q done: %w", key, err)
	}
	c.recordDone(key, n)
	if marked != nil {
		marked(nil)
	}
	return res, st, nil
}

// recordDone counts an executed call whose done mark was sent with
// finishScript outcome n.
func (c *Client) recordDone(key string, n int64) {
	switch n {
	case 2:
		c.m.leaseLost.Inc()
		c.log.Warn("once: claim expired while f ran; key recorded done anyway",
			zap.String("key", key), zap.Duration("lease", c.lease))
	case 3:
		c.m.leaseLost.Inc()
		c.log.Warn("once: claim expired while f ran and another caller already recorded the key done",
			zap.String("key", key), zap.Duration("lease", c.lease))
	case 4:
		c.m.leaseLost.Inc()
		c.m.markConflict.Inc()
		c.log.Error("once: claim expired while f ran and another caller holds the key now; its claim is left alone and it may run the effect again",
			zap.String("key", key), zap.Duration("lease", c.lease))
	}
	c.m.executed.Inc()
}

// ttlArg returns ttl in milliseconds as a command argument, boxed once
// for the TTL a caller keeps using (the consumer has one).
func (c *Client) ttlArg(ttl time.Duration) any {
	if b := c.ttlBox.Load(); b != nil && b.ttl == ttl {
		return b.ms
	}
	b := &boxedTTL{ttl: ttl, ms: ttl.Milliseconds()}
	c.ttlBox.Store(b)
	return b.ms
}

// boxedTTL is a TTL in milliseconds as a command argument.
type boxedTTL struct {
	ttl time.Duration
	ms  any
}

// doneArg is Do's done marker as a command argument, boxed once.
var doneArg any = donePrefix

// markAsync sends Do's done mark without waiting (execute with marked). The
// reply is handled on the batcher's goroutine: marked(nil) once the mark is
// sent and answered; a failed send is repeated after wait (doubling up to
// 2 s) until it is answered, the client is closed or ctx ends — then marked
// gets the error, as the waiting execute would have returned it.
func (c *Client) markAsync(ctx context.Context, key, rkey, claim string, ttl, wait time.Duration, marked func(error)) {
	cmd := []any{"evalsha", finishScript.Hash(), 1, rkey, claim, doneArg, c.ttlArg(ttl)}
	c.b.sendAsync(finishScript, cmd, func(v any, err error) {
		switch {
		case err == nil:
			n, _ := v.(int64)
			c.recordDone(key, n)
			marked(nil)
		case errors.Is(err, ErrClosed) || ctx.Err() != nil:
			c.m.errored.Inc()
			marked(fmt.Errorf("once: mark %q done: %w", key, err))
		default:
			c.log.Warn("once: marking done failed after f ran; retrying", zap.String("key", key), zap.Error(err))
			time.AfterFunc(wait, func() {
				c.markAsync(ctx, key, rkey, claim, ttl, min(2*wait, 2*time.Second), marked)
			})
		}
	})
}

// extend renews our claim's lease; false when the key no longer holds it.
func (c *Client) extend(ctx context.Context, rkey, claim string) (bool, error) {
	v, err := c.script(ctx, extendScript, rkey, claim, c.leaseMs)
	if err != nil {
		return false, err
	}
	n, _ := v.(int64)
	return n == 1, nil
}

// finish replaces our claim with the done marker carrying res and returns
// finishScript's outcome: 1 our claim became done, 2 our claim was gone and
// done was written anyway, 3 someone else's done marker was kept, 4 someone
// else's claim was found and left alone.
func (c *Client) finish(ctx context.Context, rkey, claim string, res []byte, ttl time.Duration) (int64, error) {
	done := doneArg
	if len(res) > 0 {
		done = donePrefix + string(res)
	}
	v, err := c.script(ctx, finishScript, rkey, claim, done, c.ttlArg(ttl))
	if err != nil {
		return 0, err
	}
	n, _ := v.(int64)
	return n, nil
}

func (c *Client) release(ctx context.Context, rkey, claim string) error {
	_, err := c.script(context.WithoutCancel(ctx), releaseScript, rkey, claim)
	return err
}

// claim sets our claim on rkey when it is absent. Otherwise it returns the
// value found (someone's claim or a done marker) and claimed false.
func (c *Client) claim(ctx context.Context, rkey, claim string) (cur string, claimed bool, err error) {
	var v any
	if c.setGet {
		// nil: the key was absent and now holds our claim; else the value
		// that kept NX from setting it.
		v, err = c.do(ctx, nil, []any{"set", rkey, claim, "px", c.leaseMs, "nx", "get"})
		if errors.Is(err, redis.Nil) {
			return "", true, nil
		}
	} else {
		v, err = c.script(ctx, claimScript, rkey, claim, c.leaseMs)
	}
	if err != nil {
		return "", false, err
	}
	switch v := v.(type) {
	case int64: // claimScript: claimed
		return "", true, nil
	case string:
		return v, false, nil
	default:
		return "", false, fmt.Errorf("unexpected reply %T", v)
	}
}

// script runs s on one key by hash (EVALSHA).
func (c *Client) script(ctx context.Context, s *redis.Script, rkey string, args ...any) (any, error) {
	cmd := make([]any, 0, 4+len(args))
	cmd = append(append(cmd, "evalsha", s.Hash(), 1, rkey), args...)
	return c.do(ctx, s, cmd)
}

// do sends one command, through the batcher when batching is on. script is
// set when cmd is that script's EVALSHA.
func (c *Client) do(ctx context.Context, script *redis.Script, cmd []any) (any, error) {
	if c.b != nil {
		return c.b.do(ctx, script, cmd)
	}
	ctx, cancel := context.WithTimeout(ctx, c.opTimeout)
	defer cancel()
	v, err := c.rdb.Do(ctx, cmd...).Result()
	if err != nil && script != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		return runScript(ctx, c.rdb, script, cmd)
	}
	return v, err
}

// runScript sends in full the script whose EVALSHA command is cmd
// ("evalsha", hash, numkeys, keys…, args…), after Redis lost its script
// cache. The key count is the command's own: the lease and mark scripts
// have more than one key (issue #30, hole 5).
func runScript(ctx context.Context, rdb redis.Scripter, s *redis.Script, cmd []any) (any, error) {
	n, ok := cmd[2].(int)
	if !ok || n < 0 || 3+n > len(cmd) {
		return nil, fmt.Errorf("once: malformed script command (numkeys %v)", cmd[2])
	}
	keys := make([]string, n)
	for i := range keys {
		k, ok := cmd[3+i].(string)
		if !ok {
			return nil, fmt.Errorf("once: malformed script command (key %d is %T)", i, cmd[3+i])
		}
		keys[i] = k
	}
	return s.Eval(ctx, rdb, keys, cmd[3+n:]...).Result()
}

// scriptAt is scripts[i], or nil when scripts is nil (no command is a
// script).
func scriptAt(scripts []*redis.Script, i int) *redis.Script {
	if scripts == nil {
		return nil
	}
	return scripts[i]
}

// pipelineAll sends cmds in one pipeline without the batcher.
func (c *Client) pipelineAll(ctx context.Context, scripts []*redis.Script, cmds [][]any, res []any, errs []error) {
	ctx, cancel := context.WithTimeout(ctx, c.opTimeout)
	defer cancel()
	pipe := c.rdb.Pipeline()
	rc := make([]*redis.Cmd, len(cmds))
	for i, cmd := range cmds {
		rc[i] = pipe.Do(ctx, cmd...)
	}
	_, _ = pipe.Exec(ctx) // errors are per command
	for i, cmd := range rc {
		res[i], errs[i] = cmd.Result()
		if sc := scriptAt(scripts, i); errs[i] != nil && sc != nil && redis.HasErrorPrefix(errs[i], "NOSCRIPT") {
			res[i], errs[i] = runScript(ctx, c.rdb, sc, cmds[i])
		}
	}
}

// Hooks are execute's optional callbacks.
type Hooks struct {
	// Marked, when set, lets a successful f's done mark be sent without
	// waiting for it when the client batches (Redis 7.0+): execute returns
	// (StatusExecuted, nil) as soon as f returns and Marked is called once,
	// from another goroutine, with nil when the mark is written — only then
	// is the key done — or with the error that ended its retries (the
	// client was closed or ctx ended). Without batching the mark is waited
	// for and Marked is called before DoTicket returns. Marked is called
	// only when execute returned (StatusExecuted, nil).
	Marked func(error)
	// Lost, when set, is how a caller that bounds f itself learns that
	// the claim was lost while f ran (it expired, someone else took the
	// key, or no renewal succeeded for two thirds of the lease): f then
	// gets ctx as it is, without a context of its own, and
	// Lost(ErrLeaseLost) is called at most once, from another goroutine;
	// the caller makes f return. It may also come after execute returned,
	// while an asynchronous done mark is on its way (before Marked), when
	// it only reports. Without Lost, f's context is cancelled with cause
	// ErrLeaseLost.
	Lost func(error)
}

// DoTicket is DoStatus for the key of a ticket from ClaimAhead: it runs f
