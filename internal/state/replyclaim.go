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
// replaces the claim (HSET, HDEL, PEXPIRE: plain commands, which cost
// Redis less than a script call would). The claims and records of replies
// made at the same moment (the actors of different customers) share a
// round trip (replyBatch). An owner that meets a live claim of an older
// token waits for it to be recorded or to run out; one that meets a claim
// of a newer token is fenced out (ErrReplyFenced): the reply is the newer
// owner's.

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

// ClaimReply looks the reply it up and, when it is not recorded, claims
// it for this lease's token for hold (what the send may take at most).
// found is true (with the record) when it was recorded; wait > 0 when an
// older owner's claim is live that much longer (look again then);
// ErrReplyFenced when a newer owner claimed it.
func (l *Lease) ClaimReply(ctx context.Context, it Item, hold time.Duration) (record string, found bool, wait time.Duration, err error) {
	k := l.s.replyKey(l.s.tag(l.topic, l.partition), it.SendTime)
	f := strconv.FormatInt(Digest(it.Key), 10)
	args := []any{f, "c" + f, l.tokenS, max(hold.Milliseconds(), 1), (l.s.cfg.TTL + l.s.cfg.TTL/64).Milliseconds()}
	var cmd *redis.Cmd
	l.s.replies.run(ctx, l.s.cfg.Client, func(ctx context.Context, pipe redis.Pipeliner) {
		cmd = claimScript.EvalSha(ctx, pipe, []string{k}, args...)
	})
	if err := cmd.Err(); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
		cmd = claimScript.Run(ctx, l.s.cfg.Client, []string{k}, args...) // Redis lost its scripts (a restart)
	}
	vals, err := cmd.Slice()
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
// its claim, in one round trip. A reply sent is a fact: it is recorded
// whoever owns the partition now.
func (l *Lease) RecordClaimedReply(ctx context.Context, it Item, record string) error {
	k := l.s.replyKey(l.s.tag(l.topic, l.partition), it.SendTime)
	f := strconv.FormatInt(Digest(it.Key), 10)
	var cmds [3]redis.Cmder
	l.s.replies.run(ctx, l.s.cfg.Client, func(ctx context.Context, pipe redis.Pipeliner) {
		cmds[0] = pipe.HSet(ctx, k, f, record)
		cmds[1] = pipe.HDel(ctx, k, "c"+f)
		cmds[2] = pipe.PExpire(ctx, k, l.s.cfg.TTL+l.s.cfg.TTL/64)
	})
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			return fmt.Errorf("state: record reply %s: %w", it.Key, err)
		}
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

// replyCall is one caller's commands waiting for, or carried by, a
// pipeline.
type replyCall struct {
	queue func(ctx context.Context, pipe redis.Pipeliner) // adds the caller's commands
	done  chan struct{}                                   // closed when they have their answers, or when lead is set
	lead  bool                                            // this caller sends the next pipeline
}

// replyBatchTimeout bounds a pipeline of claims and records: it runs on
// behalf of several callers, so not under any one caller's context.
const replyBatchTimeout = 5 * time.Second

// run has queue add its commands to a pipeline and returns once they have
// their answers (each command carries its own error).
func (b *replyBatch) run(ctx context.Context, client redis.UniversalClient, queue func(ctx context.Context, pipe redis.Pipeliner)) {
	c := &replyCall{queue: queue, done: make(chan struct{})}
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
		c.queue(pctx, pipe)
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
