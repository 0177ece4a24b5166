package dlq

import (
	"github.com/redis/go-redis/v9"
)

// indexScript applies one DLQ record. Returns 1 new entry, 0 duplicate or
// stale event, -1 already expired, 2 event applied, -2 index full, 3 an
// existing letter updated by a later failure of its message.
// KEYS: msg, user set, reason set, due, review, stats, ttl, retried.
var indexScript = redis.NewScript(`
local id = ARGV[1]
if ARGV[9] == 'retried' then
  if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
  local a = tonumber(redis.call('HGET', KEYS[1], 'a') or '0')
  local n = tonumber(ARGV[10])
  if n <= a then return 0 end
  local st = redis.call('HGET', KEYS[1], 's')
  redis.call('HSET', KEYS[1], 'a', n, 's', 'retried', 't', ARGV[8])
  redis.call('HDEL', KEYS[1], 'l')
  redis.call('ZREM', KEYS[4], id)
  redis.call('ZREM', KEYS[5], id)
  if st == 'done' then redis.call('HINCRBY', KEYS[6], 'done', -1) end
  if st ~= 'retried' then redis.call('HINCRBY', KEYS[6], 'retried', 1) end
  redis.call('ZADD', KEYS[8], ARGV[8], id)
  return 2
end
if ARGV[9] == 'done' then
  local st = redis.call('HGET', KEYS[1], 's')
  if st ~= 'retried' then return 0 end
  redis.call('ZREM', KEYS[8], id)
  redis.call('HSET', KEYS[1], 's', 'done')
  redis.call('HINCRBY', KEYS[6], 'retried', -1)
  redis.call('HINCRBY', KEYS[6], 'done', 1)
  return 2
end
local exp = tonumber(ARGV[7])
if exp > 0 and exp <= tonumber(ARGV[8]) then return -1 end
-- place files the letter under its reason and user and in the due or the
-- review set, and keeps the reason's shortest time to live.
local function place()
  redis.call('ZADD', KEYS[3], ARGV[6], id)
  if ARGV[3] ~= '' then redis.call('ZADD', KEYS[2], ARGV[6], id) end
  if ARGV[4] == 'due' then
    redis.call('ZADD', KEYS[4], ARGV[5], id)
  else
    redis.call('ZADD', KEYS[5], ARGV[6], id)
  end
  if exp > 0 then
    local ttl = exp - tonumber(ARGV[6])
    local cur = tonumber(redis.call('HGET', KEYS[7], ARGV[2]) or '-1')
    if cur < 0 or ttl < cur then redis.call('HSET', KEYS[7], ARGV[2], ttl) end
  end
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  -- A later failure of the letter's message (a retry: another source
  -- record) updates it; the same record read again, the same source
  -- record dead-lettered again (a consumer crash before its commit), or
  -- an older one changes nothing.
  local h = redis.call('HMGET', KEYS[1], 'k', 'r', 's', 'n', 'o', 'f')
  if h[5] == ARGV[12] then return 0 end
  local op, oo = string.match(h[1] or '', '^(-?%d+):(-?%d+)$')
  local np, no = string.match(ARGV[11], '^(-?%d+):(-?%d+)$')
  if not op or not np then return 0 end
  local rbase = string.sub(KEYS[3], 1, #KEYS[3] - #ARGV[2])
  local r0, s0 = h[2], h[3]
  local f0 = redis.call('ZSCORE', rbase .. r0, id)
  if op == np then
    if tonumber(no) <= tonumber(oo) then return 0 end
  elseif f0 and tonumber(ARGV[6]) <= tonumber(f0) then
    return 0
  end
  -- The first failure's time, kept from the first update on (a new
  -- entry's is its failure time: no field, for the index's byte budget).
  if not h[6] and f0 then redis.call('HSET', KEYS[1], 'f', f0) end
  if r0 ~= ARGV[2] then
    redis.call('ZREM', rbase .. r0, id)
    redis.call('HINCRBY', KEYS[6], 'reason:' .. r0, -1)
    redis.call('HINCRBY', KEYS[6], 'reason:' .. ARGV[2], 1)
  end
  if s0 == 'retried' then redis.call('HINCRBY', KEYS[6], 'retried', -1) end
  if s0 == 'done' then redis.call('HINCRBY', KEYS[6], 'done', -1) end
  redis.call('HSET', KEYS[1], 'r', ARGV[2], 's', ARGV[4], 'e', ARGV[7], 'k', ARGV[11], 'o', ARGV[12],
    'p', ARGV[13], 'c', ARGV[14], 'n', tonumber(h[4] or '1') + 1)
  redis.call('HDEL', KEYS[1], 'l', 'b')
  redis.call('ZREM', KEYS[8], id)
  redis.call('ZREM', KEYS[4], id)
  redis.call('ZREM', KEYS[5], id)
  place()
  return 3
end
local max = tonumber(ARGV[15])
if max > 0 and tonumber(redis.call('HGET', KEYS[6], 'total') or '0') >= max then return -2 end
redis.call('HSET', KEYS[1], 'r', ARGV[2], 'u', ARGV[3], 's', ARGV[4], 'e', ARGV[7], 'a', 0,
  'k', ARGV[11], 'o', ARGV[12], 'p', ARGV[13], 'c', ARGV[14])
place()
redis.call('HINCRBY', KEYS[6], 'total', 1)
redis.call('HINCRBY', KEYS[6], 'reason:' .. ARGV[2], 1)
return 1
`)

// deleteScript removes one entry from every set. KEYS: msg, due, review,
// retried, stats; the entry's user and reason sets are named from the
// stored entry (base + 'user:' ..), in the same slot on a Cluster. ARGV:
// key base, id.
var deleteScript = redis.NewScript(`
local p, id = ARGV[1], ARGV[2]
local mk = KEYS[1]
local h = redis.call('HMGET', mk, 'r', 'u', 's')
if not h[1] then return 0 end
redis.call('DEL', mk)
if h[2] and h[2] ~= '' then redis.call('ZREM', p .. 'user:' .. h[2], id) end
redis.call('ZREM', p .. 'reason:' .. h[1], id)
redis.call('ZREM', KEYS[2], id)
redis.call('ZREM', KEYS[3], id)
redis.call('ZREM', KEYS[4], id)
redis.call('HINCRBY', KEYS[5], 'total', -1)
redis.call('HINCRBY', KEYS[5], 'reason:' .. h[1], -1)
if h[3] == 'retried' then redis.call('HINCRBY', KEYS[5], 'retried', -1) end
if h[3] == 'done' then redis.call('HINCRBY', KEYS[5], 'done', -1) end
return 1
`)

// moveScript puts an entry into due (ARGV[3]='due', score ARGV[4]) or
// review (ARGV[3]='review'), unless ARGV[5] >= 0 and the entry's attempts
// exceed it (a stale move: -1). Returns 0 for no entry, else 1 + the
// entry's attempts. KEYS: msg, due, review, retried, stats (the reason set
// is named from the entry). ARGV: key base, id, state, score_ms, attempts
// seen (-1: no check).
var moveScript = redis.NewScript(`
local p, id = ARGV[1], ARGV[2]
local mk = KEYS[1]
local h = redis.call('HMGET', mk, 's', 'r', 'a')
local st = h[1]
if not st then return 0 end
local seen = tonumber(ARGV[5])
local a = tonumber(h[3] or '0')
if seen >= 0 and a > seen then return -1 end
if st == 'retried' then redis.call('HINCRBY', KEYS[5], 'retried', -1) end
if st == 'done' then redis.call('HINCRBY', KEYS[5], 'done', -1) end
redis.call('HDEL', mk, 'l')
redis.call('ZREM', KEYS[4], id)
if ARGV[3] == 'due' then
  redis.call('ZREM', KEYS[3], id)
  redis.call('ZADD', KEYS[2], ARGV[4], id)
  redis.call('HSET', mk, 's', 'due')
else
  redis.call('ZREM', KEYS[2], id)
  local failed = redis.call('ZSCORE', p .. 'reason:' .. h[2], id) or '0'
  redis.call('ZADD', KEYS[3], failed, id)
  redis.call('HSET', mk, 's', 'review')
end
return 1 + a
`)

// claimScript hands out due entries and pushes their score forward by a
// lease, so a second scheduler (or this one after a crash) takes them
// again only when the lease ran out without MarkRetried. KEYS: due (the
// entries' hashes are named from the IDs it holds). ARGV: key base,
// now_ms, limit, lease_ms. Returns id, DLQ coordinates, attempts triples.
var claimScript = redis.NewScript(`
local p = ARGV[1]
local due = KEYS[1]
local ids = redis.call('ZRANGEBYSCORE', due, '-inf', ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
local until_ms = tonumber(ARGV[2]) + tonumber(ARGV[4])
local out = {}
for _, id in ipairs(ids) do
  local h = redis.call('HMGET', p .. 'msg:' .. id, 'k', 'a', 'b')
  if h[1] then
    redis.call('ZADD', due, 'XX', until_ms, id)
    redis.call('HSET', p .. 'msg:' .. id, 'l', until_ms)
    table.insert(out, id)
    table.insert(out, h[1])
    table.insert(out, h[2] or '0')
    table.insert(out, h[3] or '')
  else
    redis.call('ZREM', due, id)
  end
end
return out
`)

// rescheduleScript moves a due entry to a later score, only if it is
// still due, and ends its claim; with release ('1') it also drops the
// batch that requeued it (b), so an operator's next retry may select it.
// KEYS: due, msg. ARGV: key base, id, score_ms, release.
var rescheduleScript = redis.NewScript(`
local p, id = ARGV[1], ARGV[2]
redis.call('ZADD', KEYS[1], 'XX', ARGV[3], id)
if ARGV[4] == '1' then
  redis.call('HDEL', KEYS[2], 'l', 'b')
else
  redis.call('HDEL', KEYS[2], 'l')
end
return 1
`)

// loadScript reads summaries: per ID false, or {r, u, s, e, a, k, o, p, c,
// t, n, f, l, b, failure time, due time}. ARGV: prefix, ids.
var loadScript = redis.NewScript(`
local p = ARGV[1]
local out = {}
for i = 2, #ARGV do
  local id = ARGV[i]
  local h = redis.call('HMGET', p .. 'msg:' .. id, 'r', 'u', 's', 'e', 'a', 'k', 'o', 'p', 'c', 't', 'n', 'f', 'l', 'b')
  if h[1] then
    h[15] = redis.call('ZSCORE', p .. 'reason:' .. h[1], id) or '0'
    h[16] = '0'
    if h[3] == 'due' then h[16] = redis.call('ZSCORE', p .. 'due', id) or '0' end
    for j = 1, 16 do if not h[j] then h[j] = '' end end
    out[#out + 1] = h
  else
    out[#out + 1] = false
  end
end
return out
`)

// unparkScript makes a parked entry due at its real time, unless an event
// moved it meanwhile (its score is no longer the parked one). KEYS: due.
// ARGV: key base, id, real score, parked score.
var unparkScript = redis.NewScript(`
local p, id = ARGV[1], ARGV[2]
local sc = redis.call('ZSCORE', KEYS[1], id)
if sc and tonumber(sc) == tonumber(ARGV[4]) then
  redis.call('ZADD', KEYS[1], ARGV[3], id)
  return 1
end
return 0
`)
