package once

import "github.com/redis/go-redis/v9"

// Values stored under a key. A claim is "p:<owner>", where owner is unique
// per call, so only the call that made a claim can finish or release it. A
// done marker is "d:<result>"; Do stores an empty result.
const (
	processingPrefix = "p:"
	donePrefix       = "d:"
)

// claimScript returns 1 when it set the claim (KEYS[1] was absent), else the
// current value, so one round trip both claims and tells a waiter what it is
// waiting for. It is the claim only on servers that reject SET … NX GET
// (Redis < 7.0); newer ones get that one plain command, which does the same.
var claimScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v then return v end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
`)

// finishScript records the done marker. 1: our claim became done. When our
// claim is gone (the lease expired while f ran) the effect has nevertheless
// happened, so the marker is still written unless another call already
// recorded done: 2 = written after the lease was lost, 3 = someone else's
// done marker was kept. Overwriting another caller's claim is deliberate: it
// turns that caller's later finish into 3 and its release into a no-op, so
// the key ends up done, which is the truth. A Do (empty result) on Redis 7.0+
// uses a plain SET … GET instead (see Client.finishDo).
var finishScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
if v and string.sub(v, 1, 2) == 'd:' then return 3 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 2
`)

// releaseScript deletes the key only while it still holds our claim, so a
// failed call never deletes another caller's claim or done marker.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

// extendScript pushes our claim's expiry out by ARGV[2] ms; 0 when the claim
// is no longer ours.
var extendScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
`)

var allScripts = []*redis.Script{claimScript, finishScript, releaseScript, extendScript}
