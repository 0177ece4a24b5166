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

// finishScript records the done marker, only where that cannot take a key
// from another caller (I3: a claim owned by someone else is never
// overwritten). 1: our claim became done. 2: our claim was gone (the lease
// expired while f ran) and nobody holds the key: the effect has happened,
// so done is written anyway. 3: someone else's done marker was kept. 4:
// someone else holds a live claim on the key (ours expired and they took
// it): the key is left to them and the caller reports the conflict — the
// other caller may be running the effect a second time, and overwriting its
// claim would only hide that and cancel it midway.
var finishScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
if not v then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 2
end
if string.sub(v, 1, 2) == 'd:' then return 3 end
return 4
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
