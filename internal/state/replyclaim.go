package state

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A reply's claim: before a reply is sent, its owner writes, beside the
// reply's record in the partition's reply hash, a claim field (the
// record's field prefixed with "c") holding its lease's fencing token and
// until when, on Redis's clock, the send may still be under way. The
// look-up and the claim are one script call; the record that follows
// replaces the claim in one more (recordScript): two calls a reply. The
// claims and records of replies made at the same moment (the actors of
// different customers) share a round trip (replyBatch). An owner that
// meets a live claim of an older token waits for it to be recorded or to
// run out; one that meets a claim of a newer token is fenced out
// (ErrReplyFenced): the reply is the newer owner's.

// ErrReplyFenced is returned by ClaimReply when an owner with a newer
// fencing token claimed the reply: this owner must not send it.
var ErrReplyFenced = errors.New("state: the reply is claimed by a newer owner of the partition")

// claimScript: KEYS[1] the reply hash; ARGV record field, claim field,
// token, hold ms, hash TTL ms. Returns {1, record} when recorded, {2, ms}
// when an older owner's claim is live for ms more, {3} when a newer
// owner's claim exists, {0} when claimed for us.
var claimScript = redis.NewScript(`
local v = redis.call('HMGET', KEYS[1], ARGV[1], ARGV[2])
if v[1] then return {1, v[1]} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local c = v[2]
if c then
  local tok, untl = string.match(c, '^(%d+):(%d+)$')
  if tok then
    tok, untl = tonumber(tok), tonumber(untl)
    local mine = tonumber(ARGV[3])
    if tok > mine then return {3} end
    if tok < mine and untl > now then return {2, string.format('%.0f', untl - now)} end
  end
end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3] .. ':' .. string.format('%.0f', now + tonumber(ARGV[4])))
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return {0}
`)

// recordScript: KEYS[1] the reply hash; ARGV record field, claim field,
// record, hash TTL ms. The record replaces the claim.
var recordScript = redis.NewScript(`
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('HDEL', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
`)

// ClaimReply looks the reply it up and, when it is not recorded, claims
// it for this lease's token for hold (what the send may take at most).
// found is true (with the record) when it was recorded; wait > 0 when an
// older owner's claim is live that much longer (look again then);
// ErrReplyFenced when a newer owner claimed it.
func (l *Lease) ClaimReply(ctx context.Context, it Item, hold time.Duration) (record string, found bool, wait time.Duration, err error) {
	k := l.s.replyKey(l.s.tag(l.topic, l.partition), it.SendTime)
	f := strconv.FormatInt(Digest(it.Key), 10)
	res, err := l.s.replies.run(ctx, l.s.cfg.Client, claimScript, []string{k}, f, "c"+f, l.tokenS,
		max(hold.Milliseconds(), 1), (l.s.cfg.TTL + l.s.cfg.TTL/64).Milliseconds())
	var vals []any
	if err == nil {
		vals, err = res.Slice()
	}
	if err != nil {
		return "", false, 0, fmt.Errorf("state: claim reply %s: %w", it.Key, err)
	}
	switch toInt(vals[0]) {
	case 1:
		return toStr(vals[1]), true, 0, nil
	case 2:
		return "", false, time.Duration(toInt(vals[1])) * time.Millisecond, nil
	case 3:
		return "", false, 0, ErrReplyFenced
	}
	return "", false, 0, nil
}

// RecordClaimedReply records the reply it as sent, with record, and drops
// its claim, in one call. A reply sent is a fact: it is recorded whoever
// owns the partition now.
func (l *Lease) RecordClaimedReply(ctx context.Context, it Item, record string) error {
	k := l.s.replyKey(l.s.tag(l.topic, l.partition), it.SendTime)
	f := strconv.FormatInt(Digest(it.Key), 10)
	if _, err := l.s.replies.run(ctx, l.s.cfg.Client, recordScript, []string{k}, f, "c"+f, record,
		(l.s.cfg.TTL + l.s.cfg.TTL/64).Milliseconds()); err != nil {
		return fmt.Errorf("state: record reply %s: %w", it.Key, err)
	}
	return nil
}

// replyBatch sends the claims and records of replies made at the same
// moment in one pipeline: the first caller sends its call at once, and
// the calls that arrive while a pipeline is out wait for it to return and
// go together in the next one, sent by the first of them (no goroutine,
// no timer: a lone reply waits for nothing). At a desk's pace every reply
// is alone; when many customers are answered at once a round trip carries
// many (issue 45: a reply's CPU was mostly its own round trips). The zero
// value is ready.
type replyBatch struct {
	mu    sync.Mutex
	busy  bool // a caller is sending a pipeline
	queue []*replyCall
}

// replyCall is one script call waiting for, or carried by, a pipeline.
type replyCall struct {
	script *redis.Script
	keys   []string
	args   []any
	cmd    *redis.Cmd
	done   chan struct{} // closed when cmd has its answer, or when lead is set
	lead   bool          // this caller sends the next pipeline
}

// replyBatchTimeout bounds a pipeline of claims and records: it runs on
// behalf of several callers, so not under any one caller's context.
const replyBatchTimeout = 5 * time.Second

// run calls script through the batch and returns its answer.
func (b *replyBatch) run(ctx context.Context, client redis.UniversalClient, script *redis.Script, keys []string, args ...any) (*redis.Cmd, error) {
	c := &replyCall{script: script, keys: keys, args: args, done: make(chan struct{})}
	b.mu.Lock()
	b.queue = append(b.queue, c)
	lead := !b.busy
	b.busy = true
	b.mu.Unlock()
	if !lead {
		<-c.done
		lead = c.lead
	}
	if lead {
		b.send(ctx, client, c)
	}
	if err := c.cmd.Err(); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
		// Redis lost its scripts (a restart): Run loads it again.
		c.cmd = script.Run(ctx, client, keys, args...)
	}
	return c.cmd, c.cmd.Err()
}

// send sends every queued call (self among them) in one pipeline, answers
// the others, and hands the next pipeline to the first call that queued
// meanwhile.
func (b *replyBatch) send(ctx context.Context, client redis.UniversalClient, self *replyCall) {
	b.mu.Lock()
	calls := b.queue
	b.queue = nil
	b.mu.Unlock()
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), replyBatchTimeout)
	pipe := client.Pipeline()
	for _, c := range calls {
		c.cmd = c.script.EvalSha(pctx, pipe, c.keys, c.args...)
	}
	_, _ = pipe.Exec(pctx) // each command carries its own error
	cancel()
	for _, c := range calls {
		if c != self {
			close(c.done)
		}
	}
	b.mu.Lock()
	if len(b.queue) > 0 {
		next := b.queue[0]
		next.lead = true
		close(next.done)
	} else {
		b.busy = false
	}
	b.mu.Unlock()
}
