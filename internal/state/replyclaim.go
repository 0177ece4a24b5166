package state

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// A reply's claim: before a reply is sent, its owner writes, beside the
// reply's record in the partition's reply hash, a claim field (the
// record's field prefixed with "c") holding its lease's fencing token and
// until when, on Redis's clock, the send may still be under way. The
// look-up and the claim are one script call; the record that follows
// replaces the claim in one more (HSET, HDEL, PEXPIRE pipelined: plain
// commands, which cost Redis less than a script call would): two round
// trips a reply. An owner that meets a live claim of an older token waits
// for it to be recorded or to run out; one that meets a claim of a newer
// token is fenced out (ErrReplyFenced): the reply is the newer owner's.

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
	vals, err := claimScript.Run(ctx, l.s.cfg.Client, []string{k}, args...).Slice()
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
	pipe := l.s.cfg.Client.Pipeline()
	pipe.HSet(ctx, k, f, record)
	pipe.HDel(ctx, k, "c"+f)
	pipe.PExpire(ctx, k, l.s.cfg.TTL+l.s.cfg.TTL/64)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("state: record reply %s: %w", it.Key, err)
	}
	return nil
}
