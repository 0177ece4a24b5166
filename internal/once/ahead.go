package once

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Ticket is a key claimed ahead of its call by ClaimAhead. It belongs to
// one caller, which runs it with DoTicket or gives it back with Release;
// it is not safe for concurrent use.
type Ticket struct {
	key, rkey, claim string
	at               time.Time // when the claim was sent
	claimed          bool      // ClaimAhead set our claim and DoTicket has not used it yet
	cur              string    // otherwise the value ClaimAhead found ("" when none or on error)
}

// Key returns the ticket's key.
func (t *Ticket) Key() string { return t.key }

// ClaimAhead claims keys for DoTicket calls that follow, in one round trip
// (one pipeline) instead of one per call: a caller with a queue of keys to
// run in turn, such as a consumer's per-user actor, claims the queue's keys
// together and then runs each without waiting for its claim. The claims are
// the ones Do would make — a "processing" value with the lease — so every
// other caller waits on them as on any claim; they are only taken earlier.
// A key found done, or claimed by someone else, or whose claim failed, gets
// a ticket too: DoTicket then does what Do does for it. Tickets not run
// must be given back with Release (else their keys stay claimed until the
// lease expires).
func (c *Client) ClaimAhead(ctx context.Context, keys []string) []*Ticket {
	// One allocation each for the tickets and the command arguments: an
	// actor claims a few keys at a time, many times a second.
	ts := make([]*Ticket, len(keys))
	tickets := make([]Ticket, len(keys))
	cmds := make([][]any, len(keys))
	var scripts []*redis.Script // nil: no command is a script
	width := 7
	if !c.setGet {
		scripts, width = make([]*redis.Script, len(keys)), 6
	}
	args := make([]any, width*len(keys))
	now := time.Now()
	for i, k := range keys {
		t := &tickets[i]
		*t = Ticket{key: k, rkey: c.prefix + k, claim: c.newClaim(), at: now}
		ts[i] = t
		cmd := args[i*width : (i+1)*width : (i+1)*width]
		if c.setGet {
			cmd[0], cmd[1], cmd[2], cmd[3], cmd[4], cmd[5], cmd[6] = "set", t.rkey, t.claim, "px", c.leaseMs, "nx", "get"
		} else {
			scripts[i] = claimScript
			cmd[0], cmd[1], cmd[2], cmd[3], cmd[4], cmd[5] = "evalsha", claimScript.Hash(), 1, t.rkey, t.claim, c.leaseMs
		}
		cmds[i] = cmd
	}
	res := make([]any, len(keys))
	errs := make([]error, len(keys))
	if c.b != nil {
		c.b.doAll(ctx, scripts, cmds, res, errs)
	} else {
		c.pipelineAll(ctx, scripts, cmds, res, errs)
	}
	for i, t := range ts {
		err := errs[i]
		if errors.Is(err, redis.Nil) { // SET NX GET: the key was absent, now ours
			t.claimed = true
			continue
		}
		if err != nil {
			// Unknown whether the claim was set: DoTicket's claim finds out
			// (our own value counts as ours).
			continue
		}
		switch v := res[i].(type) {
		case int64: // claimScript: claimed
			t.claimed = true
		case string:
			t.cur = v
		}
	}
	return ts
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

// Hooks are DoTicket's optional callbacks.
type Hooks struct {
	// Marked, when set, lets a successful f's done mark be sent without
	// waiting for it when the client batches (Redis 7.0+): DoTicket returns
	// (StatusExecuted, nil) as soon as f returns and Marked is called once,
	// from another goroutine, with nil when the mark is written — only then
	// is the key done — or with the error that ended its retries (the
	// client was closed or ctx ended). Without batching the mark is waited
	// for and Marked is called before DoTicket returns. Marked is called
	// only when DoTicket returned (StatusExecuted, nil).
	Marked func(error)
	// Lost, when set, is how a caller that bounds f itself learns that
	// the claim was lost while f ran (it expired, someone else took the
	// key, or no renewal succeeded for two thirds of the lease): f then
	// gets ctx as it is, without a context of its own, and
	// Lost(ErrLeaseLost) is called at most once, from another goroutine;
	// the caller makes f return. It may also come after DoTicket returned,
	// while an asynchronous done mark is on its way (before Marked), when
	// it only reports. Without Lost, f's context is cancelled with cause
	// ErrLeaseLost.
	Lost func(error)
}

// DoTicket is DoStatus for the key of a ticket from ClaimAhead: it runs f
// under the ticket's claim when ClaimAhead got it (renewing the claim
// first when it is older than a quarter of the lease), and otherwise does
// what DoStatus does (a done key is a duplicate, someone else's claim is
// waited on). A ticket may be run again after a call that failed before f
// ran; the claim taken ahead is still recognised as ours. h is optional.
func (c *Client) DoTicket(ctx context.Context, t *Ticket, ttl time.Duration, f func(ctx context.Context) error, h Hooks) (Status, error) {
	if ttl < time.Millisecond {
		c.m.errored.Inc()
		return StatusNone, ErrInvalidTTL
	}
	fr := func(ctx context.Context) ([]byte, error) { return nil, f(ctx) }
	claimed, cur, at := t.claimed, t.cur, t.at
	t.claimed, t.cur = false, "" // a second call takes the general path
	if claimed && time.Since(at) >= c.lease/4 {
		// Renewed before f starts, so that the keeper's first renewal
		// (a quarter of the lease after this one) is due well within the
		// lease whatever the ticket's age.
		at = time.Now()
		ok, err := c.extend(ctx, t.rkey, t.claim)
		if err != nil {
			c.m.errored.Inc()
			return StatusNone, fmt.Errorf("once: claim %q: %w", t.key, err)
		}
		claimed = ok
	}
	if claimed {
		_, st, err := c.execute(ctx, t.key, t.rkey, t.claim, at, ttl, true, fr, h)
		return st, err
	}
	if strings.HasPrefix(cur, donePrefix) {
		c.m.duplicate.Inc()
		return StatusDuplicate, nil
	}
	_, st, err := c.runClaim(ctx, t.key, t.rkey, t.claim, ttl, true, fr, h)
	return st, err
}

// Release gives back the claims of tickets that will not be run, without
// waiting (a key keeps its claim until the lease expires when the release
// fails). A claim is deleted only while it is still the ticket's, so a
// ticket already run, or a key meanwhile claimed by someone else, is left
// alone.
func (c *Client) Release(ts ...*Ticket) {
	for _, t := range ts {
		if t == nil {
			continue
		}
		t.claimed, t.cur = false, ""
		cmd := []any{"evalsha", releaseScript.Hash(), 1, t.rkey, t.claim}
		if c.b != nil {
			c.b.sendAsync(releaseScript, cmd, func(any, error) {})
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), c.opTimeout)
		_, _ = c.do(ctx, releaseScript, cmd)
		cancel()
	}
}
