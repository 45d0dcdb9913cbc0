--- clientpool.redisfleet.scripts (internal): the server-side scripts of
-- the Redis fleet (docs/fleet.md section 14), as EVAL text.
--
-- Every change to a fleet's budget in Redis is one of these scripts, so
-- two machines can never together exceed the cap: Redis runs a script
-- whole before any other command. Times are Redis's own (TIME, inside the
-- script) and TTLs are relative, so the machines' clocks never meet.
--
-- The keys of fleet NAME (one hash tag, so a cluster keeps them on one
-- slot), in KEYS order:
--   1 cfg     hash: run_id (the server that holds the leases), quiet_until
--             (ms, Redis time: no new units before it), max_live (the last
--             member's figure, for stats)
--   2 units   hash member -> units leased to that member
--   3 exp     zset member -> its lease's expiry (ms, Redis time)
--   4 held    hash member -> units the member said it physically holds
--   5 demand  hash member -> callers waiting on that member
--   6 pause   string: the fleet-wide pause reason (PX: resume_after)
--   7 bud     hash "<budget>|<member>" -> units of another budget leased to
--             that member (max_concurrency "c", max_idle "i", a key's
--             max_live "k:<key>"; member names hold no '|')
--   8 mb      hash member -> the budgets it holds units of (cjson list), so
--             a lapsed member's units of each are dropped
--   9 bsum    hash budget -> the units of it leased to all members (kept
--             with every change, so a call costs O(its budgets), not
--             O(members x budgets))
--  10 kpause  hash key -> "<until_ms>|<reason>": the keys paused on every
--             machine (until_ms: Redis time, -1 none); cfg's kpgen moves
--             at every change, so a lease reply carries the list only to a
--             member that has not seen it
--
-- lease(ttl_ms, member, want, need, demand, max_live, mode): grants the
-- member n units (the cap it may use until its next call) and returns
--   { n, sum, max_live, quiet_ms, pause, pause_ms, others_demand, members,
--     stored }
-- where n = min(want, free), free = max_live - (what the other members
-- hold). What is stored for the member is max(n, need): `need` (what it
-- may physically hold) is always accounted, even above the cap, so the
-- others are granted nothing while it holds it, but it is never granted:
-- a member whose lease lapsed (its units went to others) gets back only
-- what is free, and closes its clients down to that (its idle cap is n).
-- Take, renew and return are this one call (a member asks for the
-- holding it wants); mode "leave" drops the member's lease.
-- The other budgets ride on the same call (one round trip): ARGV[8] = how
-- many, then per budget name, want, need, cap; each is granted by the same
-- rule against its own cap (n = min(want, cap - others'), stored max(n,
-- need), only need while quiet), and the reply goes on with n, sum per
-- budget. A member holding nothing of any budget, with nobody waiting, has
-- no row.
-- While quiet (for one ttl after Redis is first seen by a fleet, after it
-- restarted, lost its data or failed over: its run_id changed) nothing
-- is granted beyond what members claim to hold (n = need: their leases
-- were valid, the server lost them; the server's own rows may be stale,
-- e.g. a replica's, so they grant nothing), so a member that may still be
-- admitting within its own validity is never overbooked.
local M = {}

-- The keys of fleet `name` under `prefix`.
function M.keys(prefix, name)
  local base = prefix .. "{" .. name .. "}:"
  return { base .. "cfg", base .. "units", base .. "exp", base .. "held", base .. "demand", base .. "pause",
           base .. "bud", base .. "mb", base .. "bsum", base .. "kpause" }
end

-- Shared head of lease and stats: the time, the restart check, the purge
-- of lapsed leases and the sum of what stays.
local HEAD = [[
-- (Redis < 5 replicates scripts verbatim and refuses writes after TIME
-- unless told to replicate effects; from 5 on this is the default)
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1]) or 0
local run_id = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)') or '?'
local quiet_until = tonumber(redis.call('HGET', KEYS[1], 'quiet_until') or '0')
if redis.call('HGET', KEYS[1], 'run_id') ~= run_id then
  -- first sight, a restart (data lost or reloaded) or a failover: any
  -- member may still be admitting on a lease this server does not know
  quiet_until = now + ttl
  redis.call('HSET', KEYS[1], 'run_id', run_id, 'quiet_until', quiet_until)
end
local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
for i = 1, #gone do
  redis.call('HDEL', KEYS[2], gone[i]); redis.call('HDEL', KEYS[4], gone[i])
  redis.call('HDEL', KEYS[5], gone[i]); redis.call('ZREM', KEYS[3], gone[i])
  local held_b = redis.call('HGET', KEYS[8], gone[i])
  if held_b then
    for _, b in ipairs(cjson.decode(held_b)) do
      local f = b .. '|' .. gone[i]
      redis.call('HINCRBY', KEYS[9], b, -tonumber(redis.call('HGET', KEYS[7], f) or '0'))
      redis.call('HDEL', KEYS[7], f)
    end
    redis.call('HDEL', KEYS[8], gone[i])
  end
end
local sum, vals = 0, redis.call('HVALS', KEYS[2])
for i = 1, #vals do sum = sum + tonumber(vals[i]) end
local quiet = quiet_until - now
if quiet < 0 then quiet = 0 end
local pause, pause_ms = redis.call('GET', KEYS[6]), -1
if pause then pause = 'p' .. pause; pause_ms = redis.call('PTTL', KEYS[6]) else pause = '-' end
]]

M.lease = HEAD .. [[
local member, want, need = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local demand, max_live, mode = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
local cur = tonumber(redis.call('HGET', KEYS[2], member) or '0')
local n, stored = 0, 0
if mode ~= 'leave' then
  if quiet > 0 then
    n = need
  else
    n = math.max(0, math.min(want, max_live - (sum - cur)))
  end
  stored = math.max(n, need)
end
-- the other budgets: the same rule, each against its own cap
local out_b, had = {}, {}
local held_b = redis.call('HGET', KEYS[8], member)
if held_b then for _, b in ipairs(cjson.decode(held_b)) do had[b] = true end end
local list, any = {}, false
local nb = tonumber(ARGV[8] or '0')
for j = 0, nb - 1 do
  local b, bwant, bneed, bcap = ARGV[9 + 4 * j], tonumber(ARGV[10 + 4 * j]), tonumber(ARGV[11 + 4 * j]),
                                tonumber(ARGV[12 + 4 * j])
  local f = b .. '|' .. member
  local bcur = tonumber(redis.call('HGET', KEYS[7], f) or '0')
  local btotal = tonumber(redis.call('HGET', KEYS[9], b) or '0')
  local bn, bstored = 0, 0
  if mode ~= 'leave' then
    if quiet > 0 then bn = bneed else bn = math.max(0, math.min(bwant, bcap - (btotal - bcur))) end
    bstored = math.max(bn, bneed)
  end
  if bstored ~= bcur then redis.call('HINCRBY', KEYS[9], b, bstored - bcur) end
  if bstored > 0 then
    redis.call('HSET', KEYS[7], f, bstored)
    list[#list + 1] = b
    any = true
  else
    redis.call('HDEL', KEYS[7], f)
  end
  had[b] = nil
  out_b[#out_b + 1] = bn
  out_b[#out_b + 1] = btotal - bcur + bstored
end
-- budgets it held and no longer asks for go back
for b in pairs(had) do
  local f = b .. '|' .. member
  redis.call('HINCRBY', KEYS[9], b, -tonumber(redis.call('HGET', KEYS[7], f) or '0'))
  redis.call('HDEL', KEYS[7], f)
end
if any then redis.call('HSET', KEYS[8], member, cjson.encode(list)) else redis.call('HDEL', KEYS[8], member) end
if stored > 0 or any then
  redis.call('HSET', KEYS[2], member, stored)
  redis.call('ZADD', KEYS[3], now + ttl, member)
  redis.call('HSET', KEYS[4], member, need)
  redis.call('HSET', KEYS[5], member, demand)
elseif mode ~= 'leave' and demand > 0 then
  -- holding nothing but waiting: still a machine, its demand in the others'
  -- replies (fairness), lapsing with its exp entry like any lease
  redis.call('HDEL', KEYS[2], member); redis.call('HDEL', KEYS[4], member)
  redis.call('ZADD', KEYS[3], now + ttl, member)
  redis.call('HSET', KEYS[5], member, demand)
else
  redis.call('HDEL', KEYS[2], member); redis.call('HDEL', KEYS[4], member)
  redis.call('HDEL', KEYS[5], member); redis.call('ZREM', KEYS[3], member)
end
sum = sum - cur + stored
redis.call('HSET', KEYS[1], 'max_live', max_live)
-- an abandoned fleet's keys go away by themselves
local keep = math.max(ttl * 20, 60000)
for i = 1, 9 do if i ~= 6 then redis.call('PEXPIRE', KEYS[i], keep) end end
local others = 0
local ds = redis.call('HGETALL', KEYS[5])
for i = 1, #ds, 2 do if ds[i] ~= member then others = others + tonumber(ds[i + 1]) end end
local r = { n, sum, max_live, quiet, pause, pause_ms, others, redis.call('ZCARD', KEYS[3]), stored }
for i = 1, #out_b do r[9 + i] = out_b[i] end
-- the keys' pauses: the generation, and the list when the member's seen
-- generation (the argument after the budgets) differs
local seen = tonumber(ARGV[9 + 4 * nb] or '')
local gen = tonumber(redis.call('HGET', KEYS[1], 'kpgen') or '0')
r[#r + 1] = gen
if seen and seen ~= gen then
  local kp = redis.call('HGETALL', KEYS[10])
  r[#r + 1] = #kp / 2
  for i = 1, #kp, 2 do
    local till, why = string.match(kp[i + 1], '^(%-?%d+)|(.*)$')
    till = tonumber(till)
    r[#r + 1] = kp[i]
    r[#r + 1] = why
    r[#r + 1] = till < 0 and -1 or math.max(0, till - now)
  end
end
return r
]]

-- stats(ttl_ms): { sum, max_live, quiet_ms, pause, pause_ms, now_ms,
--            { member, units, held, demand, ttl_ms, nb, { budget, units }
--            x nb }... } (flattened)
M.stats = HEAD .. [[
local out = { sum, tonumber(redis.call('HGET', KEYS[1], 'max_live') or '-1'), quiet, pause, pause_ms, now }
local ms = redis.call('ZRANGE', KEYS[3], 0, -1, 'WITHSCORES')
for i = 1, #ms, 2 do
  local m = ms[i]
  out[#out + 1] = m
  out[#out + 1] = tonumber(redis.call('HGET', KEYS[2], m) or '0')
  out[#out + 1] = tonumber(redis.call('HGET', KEYS[4], m) or '0')
  out[#out + 1] = tonumber(redis.call('HGET', KEYS[5], m) or '0')
  out[#out + 1] = tonumber(ms[i + 1]) - now
  local bs = cjson.decode(redis.call('HGET', KEYS[8], m) or '[]')
  out[#out + 1] = #bs
  for _, b in ipairs(bs) do
    out[#out + 1] = b
    out[#out + 1] = tonumber(redis.call('HGET', KEYS[7], b .. '|' .. m) or '0')
  end
end
return out
]]

-- pause(reason, resume_after_ms): the fleet-wide gate (0: until resumed);
-- resume(): lifted. Members see it in their next lease reply.
M.pause = [[
if tonumber(ARGV[2]) > 0 then
  redis.call('SET', KEYS[6], ARGV[1], 'PX', ARGV[2])
else
  redis.call('SET', KEYS[6], ARGV[1])
end
return 1
]]

M.resume = [[
return redis.call('DEL', KEYS[6])
]]

-- kpause(key, reason, resume_after_ms (0: until resumed), max_keys): one
-- key paused on every machine; 0 when max_keys other keys are paused.
-- kresume(key): lifted. Both drop the entries whose deadline passed and
-- move the generation the lease replies carry.
local KHEAD = [[
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local kp = redis.call('HGETALL', KEYS[10])
for i = 1, #kp, 2 do
  local till = tonumber(string.match(kp[i + 1], '^(%-?%d+)|'))
  if till >= 0 and till <= now then redis.call('HDEL', KEYS[10], kp[i]) end
end
redis.call('HINCRBY', KEYS[1], 'kpgen', 1)
]]

M.kpause = KHEAD .. [[
if redis.call('HEXISTS', KEYS[10], ARGV[1]) == 0 and redis.call('HLEN', KEYS[10]) >= tonumber(ARGV[4]) then
  return 0
end
local ms = tonumber(ARGV[3])
redis.call('HSET', KEYS[10], ARGV[1], (ms > 0 and (now + ms) or -1) .. '|' .. ARGV[2])
return 1
]]

M.kresume = KHEAD .. [[
return redis.call('HDEL', KEYS[10], ARGV[1])
]]

return M
