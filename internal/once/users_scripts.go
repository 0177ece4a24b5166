package once

import "github.com/redis/go-redis/v9"

// The per-user store's scripts (Users). A lease's value is
// "<token>:<owner>": the token is a number from one counter (KEYS[2] of
// leaseAcquireScript), so every new lease of a user carries a larger token
// than any before it — downstream systems can fence on it — and the owner
// part tells this process's leases from another's.

// leaseAcquireScript takes or continues the user's lease. KEYS: the lease,
// the token counter. ARGV: owner, lease ms. Answers {1, value} when the
// lease is already this owner's (one it let lapse, still in Redis: nobody
// held the lease since), {2, value} for a new lease, {0, value} when
// another owner holds it.
var leaseAcquireScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v then
  local own = ':' .. ARGV[1]
  if string.sub(v, -string.len(own)) == own then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {1, v}
  end
  return {0, v}
end
local nv = redis.call('INCR', KEYS[2]) .. ':' .. ARGV[1]
redis.call('SET', KEYS[1], nv, 'PX', ARGV[2])
return {2, nv}
`)

// leaseRenewScript pushes out the expiry of the leases KEYS whose values are
// still ARGV[2..] by ARGV[1] ms; one answer (1 renewed, 0 gone or taken)
// per lease.
var leaseRenewScript = redis.NewScript(`
local res = {}
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[i + 1] then
    redis.call('PEXPIRE', KEYS[i], ARGV[1])
    res[i] = 1
  else
    res[i] = 0
  end
end
return res
`)

// leaseReleaseScript deletes the leases KEYS that still hold ARGV's values.
var leaseReleaseScript = redis.NewScript(`
local n = 0
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[i] then
    n = n + redis.call('DEL', KEYS[i])
  end
end
return n
`)

// markScript writes done marks, fenced by the lease. KEYS come in pairs
// (lease, done set) and ARGV in groups (lease value, expire-at ms or 0,
// count, members...). A group is written when the lease still holds the
// value (1) or when nobody holds it any more (2: the lease lapsed while the
// marks waited — the effects have happened and no other owner can be
// running them, so recording them is safe); it is refused (0) when another
// owner holds the lease: that owner decides from the set what still has to
// run, and a mark arriving from a fenced-out owner after its check is
// refused rather than mixed into its view.
var markScript = redis.NewScript(`
local res = {}
local a = 1
for i = 1, #KEYS, 2 do
  local v, exp, n = ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local cur = redis.call('GET', KEYS[i])
  local r = 0
  if cur == v then r = 1 elseif not cur then r = 2 end
  if r > 0 then
    redis.call('SADD', KEYS[i + 1], unpack(ARGV, a + 3, a + 2 + n))
    if exp > 0 then redis.call('PEXPIREAT', KEYS[i + 1], exp) end
  end
  res[#res + 1] = r
  a = a + 3 + n
end
return res
`)

var usersScripts = []*redis.Script{leaseAcquireScript, leaseRenewScript, leaseReleaseScript, markScript}
