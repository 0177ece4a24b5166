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

// lyLua is the Lua shared by the scripts that read a layout: lyParse
// turns a record's ly field into a list of {from, bk}; lyFormat back.
const lyLua = `
local function lyParse(s)
  local g = {}
  for f, b in string.gmatch(s or '', '(%d+):(%d+)') do g[#g + 1] = {tonumber(f), tonumber(b)} end
  return g
end
local function lyFormat(g)
  local p = {}
  for i = 1, #g do p[i] = string.format('%.0f:%.0f', g[i][1], g[i][2]) end
  return table.concat(p, ',')
end
`

// acquireScript: ARGV owner, lease µs, grace µs, configured buckets, slot
// seconds, TTL seconds. The record is free when it has no owner, when it
// is ours, or when its lease ran out grace ago. The bucket layout (ly,
// lyv; see layout) is set by the first owner from its configured buckets,
// or from the old fields bk, bk0, bkfrom a binary before layouts had
// generations wrote; a newer generation one of those binaries recorded
// (bkfrom after the last) is appended. A configured count does not change
// an existing layout: the owner's Marker does, from the observed rate.
// Returns {1, token, hw, previous owner (empty when released), ly, lyv}
// when taken, {0, µs to wait, owner} when held by another owner.
var acquireScript = redis.NewScript(lyLua + `
local o = redis.call('HMGET', KEYS[1], 'owner', 'token', 'until', 'hw', 'bk', 'bk0', 'bkfrom', 'ly', 'lyv')
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
local g = lyParse(o[8])
local ver = tonumber(o[9] or '0')
local changed = false
if #g == 0 then
  if o[5] then
    local bk, bk0, from = tonumber(o[5]), tonumber(o[6] or o[5]), tonumber(o[7] or '0')
    if bk0 ~= bk and from > 0 then g = {{0, bk0}, {from, bk}} else g = {{0, bk}} end
  else
    g = {{0, tonumber(ARGV[4])}}
  end
  changed = true
elseif o[5] and o[7] and tonumber(o[7]) > g[#g][1] and tonumber(o[5]) ~= g[#g][2] then
  g[#g + 1] = {tonumber(o[7]), tonumber(o[5])}
  changed = true
end
if changed then
  ver = ver + 1
  local prev = g[math.max(#g - 1, 1)]
  redis.call('HSET', KEYS[1], 'ly', lyFormat(g), 'lyv', ver, 'bk', g[#g][2], 'bk0', prev[2], 'bkfrom', string.format('%.0f', g[#g][1]))
end
return {1, tokS, o[4] or '-1', owner, lyFormat(g), string.format('%.0f', ver)}
`)

// relayoutScript changes the bucket count of the partition's later slots:
// ARGV owner, token, the layout version the caller knows, the first slot
// it asks for, the bucket count, the first slot whose marks may still be
// written or live (older generations are dropped). Only the owner changes
// a layout. The new generation starts after every slot marked so far (ms)
// and at the asked slot at the earliest, so no mark already written is
// hidden. Returns {1, ly, lyv} when changed, {0, ly, lyv} when the caller's
// version is stale or the lease is not the caller's (nothing changed).
var relayoutScript = redis.NewScript(lyLua + `
local o = redis.call('HMGET', KEYS[1], 'owner', 'token', 'ly', 'lyv', 'ms')
local ver = tonumber(o[4] or '0')
if o[1] ~= ARGV[1] or o[2] ~= ARGV[2] or ver ~= tonumber(ARGV[3]) then
  return {0, o[3] or '', string.format('%.0f', ver)}
end
local g = lyParse(o[3])
local from = math.max(tonumber(ARGV[4]), tonumber(o[5] or '-1') + 1)
local bk = tonumber(ARGV[5])
while #g > 0 and g[#g][1] >= from do g[#g] = nil end
if #g > 0 and g[#g][2] == bk then
  return {0, o[3] or '', string.format('%.0f', ver)}
end
g[#g + 1] = {from, bk}
local keep = tonumber(ARGV[6])
while #g > 1 and g[2][1] <= keep do table.remove(g, 1) end
ver = ver + 1
local prev = g[math.max(#g - 1, 1)]
local s = lyFormat(g)
redis.call('HSET', KEYS[1], 'ly', s, 'lyv', ver, 'bk', g[#g][2], 'bk0', prev[2], 'bkfrom', string.format('%.0f', g[#g][1]))
return {1, s, string.format('%.0f', ver)}
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
// the digest buckets (same hash tag). ARGV owner, token, hw, the layout
// version the buckets were chosen under, the highest slot of the batch,
// slot seconds, then per bucket: n, expire seconds (0: leave as is), n
// digests. A layout version other than the record's means the buckets may
// be the wrong ones: nothing is written and -1 returned (the caller reads
// the layout again). Otherwise the digests are added whoever owns the
// partition now — an effect that happened is a fact — and hw is raised
// either way, so that the owner that took over looks the offset up; ms,
// the highest slot marked, is raised too (slots more than an hour ahead
// of Redis's clock are not counted: a layout change never waits on a
// clock gone wrong). Returns 1 when the lease is still ours, 0 when the
// mark was fenced (recorded, but the caller lost the partition).
var markScript = redis.NewScript(`
local o = redis.call('HMGET', KEYS[1], 'owner', 'token', 'hw', 'lyv', 'ms')
if tonumber(o[4] or '0') ~= tonumber(ARGV[4]) then return -1 end
local i = 7
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
local ms = tonumber(ARGV[5])
if ms > tonumber(o[5] or '-1') then
  local t = redis.call('TIME')
  if ms <= math.floor(tonumber(t[1]) / tonumber(ARGV[6])) + 360 then
    redis.call('HSET', KEYS[1], 'ms', ARGV[5])
  end
end
if o[1] == ARGV[1] and o[2] == ARGV[2] then return 1 end
return 0
`)
