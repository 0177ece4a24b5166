package state

import "github.com/redis/go-redis/v9"

// The partition's ownership record is one hash, KEYS[1], that never
// expires (a few dozen bytes per partition): owner, token, until (Redis
// TIME in µs) and hw (the highest offset any owner marked). The token is
// kept in the record itself — no counter beside it — and every new token
// is max(stored+1, now in µs): it grows even when the record was lost or
// is older than the last one handed out (a replica promoted by a Sentinel
// failover without the last write), as long as the new master's clock is
// not behind the old one's by more than the time between the two
// acquisitions (seconds: the failover and the lease).

// acquireScript: ARGV owner, lease µs, grace µs, configured buckets, slot
// seconds, TTL seconds. The record is free when it has no owner, when it
// is ours, or when its lease ran out grace ago. The bucket layout (bk,
// bk0, bkfrom) is set by the first owner; a different configured count
// takes effect from the next slot on Redis's clock (bkfrom), the slots
// before keep theirs — unless the last change is younger than the TTL
// (its earlier slots still live): then the recorded layout stays, so
// owners with different configurations during a rolling restart agree.
// Returns {1, token, hw, previous owner (empty when released), bk, bk0,
// bkfrom} when taken, {0, µs to wait, owner} when held by another owner.
var acquireScript = redis.NewScript(`
local o = redis.call('HMGET', KEYS[1], 'owner', 'token', 'until', 'hw', 'bk', 'bk0', 'bkfrom')
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local owner = o[1] or ''
local untl = tonumber(o[3] or '0')
if owner ~= '' and owner ~= ARGV[1] and untl + tonumber(ARGV[3]) > now then
  return {0, string.format('%.0f', untl + tonumber(ARGV[3]) - now), owner}
end
local tok = math.max(tonumber(o[2] or '0') + 1, now)
local tokS = string.format('%.0f', tok)
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'token', tokS, 'until', string.format('%.0f', now + tonumber(ARGV[2])))
local bk, bk0, from = o[5], o[6], o[7]
if not bk then
  bk, bk0, from = ARGV[4], ARGV[4], '0'
  redis.call('HSET', KEYS[1], 'bk', bk, 'bk0', bk0, 'bkfrom', from)
elseif bk ~= ARGV[4] and tonumber(t[1]) >= (tonumber(from) + 1) * tonumber(ARGV[5]) + tonumber(ARGV[6]) then
  bk0, bk = bk, ARGV[4]
  from = string.format('%.0f', math.floor(tonumber(t[1]) / tonumber(ARGV[5])) + 1)
  redis.call('HSET', KEYS[1], 'bk', bk, 'bk0', bk0, 'bkfrom', from)
end
return {1, tokS, o[4] or '-1', owner, bk, bk0 or bk, from or '0'}
`)

// renewScript: ARGV owner, token, lease µs. 1 when the lease is still
// ours (extended), 0 when another owner took it.
var renewScript = redis.NewScript(`
local o = redis.call('HMGET', KEYS[1], 'owner', 'token')
if o[1] ~= ARGV[1] or o[2] ~= ARGV[2] then return 0 end
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], 'until', string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2]) + tonumber(ARGV[3])))
return 1
`)

// releaseScript: ARGV owner, token. Gives the lease back (the token and
// hw stay); 1 when it was ours.
var releaseScript = redis.NewScript(`
local o = redis.call('HMGET', KEYS[1], 'owner', 'token')
if o[1] ~= ARGV[1] or o[2] ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'owner', '', 'until', '0')
return 1
`)

// markScript records done marks: KEYS[1] the ownership record, KEYS[2..]
// the digest buckets (same hash tag). ARGV owner, token, hw, then per
// bucket: n, expire seconds (0: leave as is), n digests. The digests are
// added whoever owns the partition now — an effect that happened is a
// fact — and hw is raised either way, so that the owner that took over
// looks the offset up. Returns 1 when the lease is still ours, 0 when the
// mark was fenced (recorded, but the caller lost the partition).
var markScript = redis.NewScript(`
local o = redis.call('HMGET', KEYS[1], 'owner', 'token', 'hw')
local i = 4
for k = 2, #KEYS do
  local n = tonumber(ARGV[i])
  local ex = tonumber(ARGV[i + 1])
  redis.call('SADD', KEYS[k], unpack(ARGV, i + 2, i + 1 + n))
  if ex > 0 then redis.call('EXPIRE', KEYS[k], ex) end
  i = i + 2 + n
end
if tonumber(ARGV[3]) > tonumber(o[3] or '-1') then
  redis.call('HSET', KEYS[1], 'hw', ARGV[3])
end
if o[1] == ARGV[1] and o[2] == ARGV[2] then return 1 end
return 0
`)
