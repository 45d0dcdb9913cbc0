--- clientpool.redisfleet.agent (internal): one machine's agent of a fleet
-- across machines (docs/fleet.md section 14).
--
-- The machine keeps a machine-local fleet (the shared-memory one of
-- csrc/fleet.c) whose max_live is not the configured figure but the share
-- this machine holds from Redis right now. Engines and drivers see only
-- that local fleet, so an acquire never costs a Redis round trip. One
-- process of the machine is its agent: it leases blocks of units with the
-- lease script (scripts.lua), renews them every ttl/4, and sets the local
-- cap with clientpool_fleet_update (a raised cap moves the sequence, so
-- local waiters look again).
--
-- Election. Every process with a pool on the fleet runs this task. The
-- agent is whoever holds the agent's place of the machine-local fleet
-- (clientpool_fleet_agent_claim): an epoch bumped by every claim and the
-- holder's beat. A candidate claims the place when it is vacant or its
-- holder has not beaten for STALL seconds: dead or stopped (SIGSTOP, a
-- paused VM), which a pid check cannot tell from alive. A stopped holder
-- may resume anywhere, so it is fenced by its epoch: every write it makes
-- to the segment (the share, the validity) is refused once its epoch is
-- stale (checked under the lock claims take), its beat before every Redis
-- call tells it to step down, and each epoch leases under its own member
-- name in Redis (`<machine>~<epoch>`): a call of a resumed stale agent
-- already on the wire refreshes only its own row, which overcounts the
-- machine until it lapses (availability), never overwrites the new
-- agent's (the cap). The new agent drops the previous epoch's row once
-- its own first lease claims all the machine may hold.
--
-- Fencing. The validity of a lease is measured from before its request
-- was sent, on this machine's CLOCK_MONOTONIC: valid_until = sent + 3/4
-- ttl, while Redis keeps the lease at least until received + ttl. Without
-- a renewal by sent + ttl/2 the cap comes down to what the machine holds
-- (nothing new is admitted; held leases stay with their callers), and at
-- valid_until to 0. valid_until is written as the machine-local fleet's
-- validity (clientpool_fleet_set_valid), which every engine reads at
-- acquire and release (past it nothing is granted, idle or new, and
-- released clients are closed) and every process's create hook checks
-- (fleetlink): even with the agent stopped, no client is created and none
-- is reused on a lapsed share.
local scripts = require "clientpool.redisfleet.scripts"
local budgets = require "clientpool.redisfleet.budgets"
local resp = require "clientpool.redisfleet.resp"
local monotime = require("clientpool.core").monotime
local ycall = require("clientpool.base").ycall   -- a pcall tasks may yield through (Lua 5.1)

local math_min, math_max, math_floor, math_ceil = math.min, math.max, math.floor, math.ceil
local tostring, type = tostring, type

local M = {}
M.ELECT = 0.25        -- candidates look at the agent's place
M.POLL = 0.01         -- the agent's look at local demand and the fence
M.IDLE = 0.05         -- the agent's look when nobody waits
M.ASK_MIN, M.ASK_MAX = 0.005, 0.1  -- re-asks while callers wait and Redis said no

local ENOTMEMBER = -12

-- An agent that has not beaten for this long is replaced: longer than its
-- longest quiet spell while it runs (a Redis call: its timeout, at most
-- ttl/4), so a slow Redis does not make it look stopped.
-- A silent holder whose process is gone is replaced after DEAD seconds.
function M.stall(ttl) return math_max(0.5, ttl / 4 + 0.25) end
M.DEAD = 0.5

-- The Redis member name of an epoch's agent.
local function member_of(R, epoch) return R.cfg.machine .. "~" .. string.format("%d", epoch) end
M.member_of = member_of

-- The state of fleet `name` in this process (fleet.new makes it).
--   cfg: max_live, ttl (s), redis (host, port, password, username, db,
--        timeout, prefix), machine, block (the largest block)
--   h, eh: the local fleet's and the election fleet's handles; B: binding
function M.new(name, cfg, h, eh, B)
  return {
    name = name, cfg = cfg, h = h, eh = eh, B = B, bud = budgets.new(cfg, B), kb = {},
    member = cfg.machine, epoch = 0, prev_member = nil, keys = scripts.keys(cfg.redis.prefix, name),
    ttl_ms = math_floor(cfg.ttl * 1000),
    users = 0, task = false, is_agent = false, joined = false,
    share = 0, valid_until = -1, fence_at = -1, next_due = 0, next_ask = 0, ask_gap = M.ASK_MIN,
    block = 1, others = 0, quiet = 0, machines = 1, pause_seen = "-", kpgen = -1, kpaused = {},
    -- counters (fleet.stats().redis.agent)
    asks = 0, fails = 0, last_err = nil, conn = nil,
  }
end

-- This process is no longer the agent (its epoch went stale: another took
-- the place while it was stopped): it touches neither the share nor Redis.
local function step_down(R)
  R.is_agent = false
  R.stepped_down = (R.stepped_down or 0) + 1
  if R.conn then R.conn:close(); R.conn = nil end
end

-- Sets the local cap to n (the share) and the other budgets' limits to
-- their shares (budgets.lua), keeping the segment's other limits, and
-- (until given) the validity: every engine of the machine closes its
-- admission past it (no idle grant, no release kept idle) until the next
-- renewal moves it, whether or not this process runs then. Written only
-- while this process's epoch is current; false when it is not.
local function set_cap(R, n, till)
  local lim = R.h:limits()
  lim.max_live, lim.max_idle, lim.min_idle = n, n, 0
  lim.key_max_live, lim.key_max_idle = -1, -1
  budgets.limits(R.bud, lim, R.cfg.key_max_live)
  local ok, code = R.h:agent_update(R.epoch, lim, till)
  if not ok then
    if code == "estale" then step_down(R) end
    return false
  end
  R.share = n
  return true
end

--- The create fence: true while this machine's lease is valid (the
-- validity the agent last wrote on the machine-local fleet).
function M.valid(R)
  -- (the agent's own figure too: a resumed agent that was replaced has
  -- not looked yet, and its valid_until is stale)
  return R.h:valid_until() ~= nil and not R.h:lapsed()
end

local function mirror_pause(R, p, ms)
  if p == R.pause_seen then return end
  R.pause_seen = p
  if p == "-" then R.h:resume()
  else R.h:pause(p:sub(2), nil, (ms and ms >= 0) and (monotime() + ms / 1000) or -1) end
end

-- Redis must not evict the fleet's keys (docs/fleet.md 14.13): each has an
-- expiry, so under an evicting maxmemory-policy one could go (a machine's
-- units, its exp entry) while the run id stays, and the sum would read low
-- with no quiet period. Read once per connection from INFO memory (no
-- CONFIG permission needed); nil, message when the policy evicts.
local function check_policy(R)
  local c = R.conn
  if c.sock and c.policy_of == c.connects then return true end
  local ok, err = c:open()
  if not ok then return nil, err end
  local v, e = c:raw("INFO", "memory")
  if type(v) ~= "string" then return nil, "INFO memory: " .. tostring(e) end
  local policy = v:match("maxmemory_policy:([%w_%-]+)")
  if policy and policy ~= "noeviction" then
    c:close()                     -- (the next try reconnects and reads it again)
    return nil, "clientpool: fleet '" .. R.name .. "': redis at " .. tostring(R.cfg.redis.host) .. ":" ..
      tostring(R.cfg.redis.port) .. " has maxmemory-policy '" .. policy .. "', which may evict the fleet's " ..
      "keys and break the cap: this machine leases nothing until it is 'noeviction' (docs/fleet.md 14.13)", true
  end
  c.policy_of = c.connects
  return true
end
M.check_policy = check_policy

-- The keys' pauses from a lease reply (from index at: the generation,
-- then, when it moved, the count and { key, reason, ms left (-1: none) }
-- each): mirrored into the local fleet's key gates; a key no longer
-- listed is resumed here. A pause whose deadline passed opens here by
-- itself (the local gate has the deadline too).
local function mirror_keys(R, v, at)
  local gen, cnt = v[at], v[at + 1]
  if gen == nil or cnt == nil or gen == R.kpgen then return end
  local now, t = {}, monotime()
  for i = 0, cnt - 1 do
    local key, why, ms = v[at + 2 + 3 * i], v[at + 3 + 3 * i], v[at + 4 + 3 * i]
    if ms ~= 0 then
      now[key] = true
      local ok, code, msg = R.h:pause(why, key, ms > 0 and t + ms / 1000 or -1)
      if not ok then R.last_err = "key '" .. tostring(key) .. "' not paused here: " .. tostring(msg or code) end
    end
  end
  for key in pairs(R.kpaused) do if not now[key] then R.h:resume(key) end end
  R.kpaused, R.kpgen = now, gen
end

-- One lease call: asks for `want` units, keeping `need` accounted.
local function ask(R, t, held, waiting)
  local cfg = R.cfg
  local want
  if waiting > 0 then
    if R.share - held < waiting then R.block = math_min(R.block * 2, cfg.block) end
    want = held + waiting + R.block
  elseif R.others > 0 then
    want = held                   -- others wait: keep only what is used
  else
    if R.share - held > R.block then R.block = math_max(1, math_floor(R.block / 2)) end
    want = held + R.block
  end
  -- the warm floor this machine keeps needs room for its clients
  want = math_max(want, budgets.floor(R.bud))
  -- others wait: no more than a fair share (the cap over the machines
  -- holding or waiting), given back as this machine's clients end
  local fair = false
  if R.others > 0 then
    local f = math_max(1, math_ceil(cfg.max_live / math_max(1, R.machines)))
    if want > f then want, fair = f, true end
  end
  want = math_min(want, cfg.max_live)
  -- shrink locally first (a cap below what is held admits nothing and
  -- closes released clients above it); what may be held during the call
  -- is claimed
  local c = math_min(R.share, want)
  local need = math_max(c, held)
  -- still the agent? (a resumed stale one steps down before it writes or
  -- calls: the key caps below are not fenced by the epoch)
  if not R.h:agent_beat(R.epoch) then step_down(R); return end
  local args = { R.ttl_ms, R.member, want, need, waiting, cfg.max_live, "lease" }
  local list = budgets.collect(R)
  local lowered = budgets.ask(list, R.h, waiting, R.others, R.machines, args)
  args[#args + 1] = R.kpgen
  if (c < R.share or lowered) and not set_cap(R, c) then return end
  budgets.apply_keys(list, R.h)
  if not R.conn then R.conn = resp.new(R.redis_opts, R.transport, R.sleep) end
  local t0 = monotime()
  R.asks = R.asks + 1
  local v, err, evicting = check_policy(R)
  if evicting then
    -- refused: said once per episode, tried again once a ttl
    R.fails = R.fails + 1
    if R.last_err ~= err then
      local ngx_ = rawget(_G, "ngx")
      if ngx_ and ngx_.log then ngx_.log(ngx_.ERR, err) else io.stderr:write(err, "\n") end
    end
    R.last_err = err
    R.next_due = monotime() + cfg.ttl
    R.next_ask = R.next_due
    return
  end
  if v then v, err = R.conn:script("lease", scripts.lease, R.keys, args) end
  if type(v) ~= "table" then
    R.fails = R.fails + 1
    R.last_err = tostring(err)
    R.next_due = monotime() + math_min(0.1, cfg.ttl / 8)
    R.next_ask = R.next_due       -- (waiters do not make it retry sooner)
    return
  end
  local ttl = cfg.ttl
  local n = v[1]
  -- the first lease of a new agent counted the previous epoch's row as
  -- another machine's, so its grant is short by this machine's own units:
  -- it only claims (what it stored covers c, kept as the cap) until the
  -- row is gone and the share asked again, at once (below); the other
  -- budgets' grants are applied as they are (short at worst: availability)
  if R.prev_member then n = c end
  budgets.granted(list, v)
  -- (the share and the validity together, only while still the agent)
  if not set_cap(R, n, t0 + ttl * 0.75) then return end
  budgets.apply_keys(list, R.h)
  R.valid_until, R.fence_at = t0 + ttl * 0.75, t0 + ttl * 0.5
  R.others, R.quiet, R.machines = v[7], v[4], v[8]
  mirror_pause(R, v[5], v[6])
  mirror_keys(R, v, 10 + 2 * #list)
  R.next_due = t0 + ttl / 4
  if fair and n >= want then
    R.next_ask = R.next_due       -- its fair share while others wait: no sooner
  elseif n < want and waiting > 0 then
    R.next_ask = monotime() + R.ask_gap
    R.ask_gap = math_min(R.ask_gap * 2, M.ASK_MAX)
  else
    R.ask_gap = M.ASK_MIN
    R.next_ask = 0
  end
  R.last_err = nil
  if R.prev_member then
    -- this lease claims all the machine may hold: the previous epoch's row
    -- (an agent that exited, died or was replaced) goes, and the share is
    -- asked again at once without it
    R.conn:script("lease", scripts.lease, R.keys, { R.ttl_ms, R.prev_member, 0, 0, 0, cfg.max_live, "leave" })
    R.prev_member, R.next_due = nil, 0
  end
  return t
end

-- The agent's turn: fence, then ask when due or short. Returns the delay
-- to its next turn.
local function step(R, t)
  local h, LIVE = R.h, R.B.LIVE
  if t >= R.fence_at then
    local held = h:count(LIVE, -1)
    local cap = t >= R.valid_until and 0 or math_min(R.share, held)
    local lowered = budgets.fence(R.bud, h, t >= R.valid_until, R.kb, LIVE)
    if (cap < R.share or lowered) and not set_cap(R, math_min(cap, R.share)) then return M.ELECT end
  end
  local held, waiting = h:count(LIVE, -1), h:waiting()
  local short = waiting > 0 and (R.share - held < waiting or
                                 budgets.short(R.cfg.key_max_live and budgets.collect(R) or R.bud, h, waiting))
  if t >= R.next_due or (short and t >= R.next_ask) then ask(R, t, held, waiting) end
  if not R.is_agent then return M.ELECT end
  if h:waiting() > 0 then return M.POLL end
  return math_min(M.IDLE, math_max(0.001, R.next_due - monotime()))
end

local function h_share(R)
  return R.h:limits().max_live
end

-- A candidate's look: claims the agent's place when it is vacant or its
-- holder stalled.
local function elect(R, t)
  local h = R.h
  local epoch, pid, age = h:agent()
  -- (past 0.5 s silent the claim also checks whether its process is gone)
  if pid ~= 0 and age < M.DEAD then return end
  local e = h:agent_claim(epoch, R.stall)
  if e == 0 then return end
  R.is_agent, R.epoch, R.member, R.next_due = true, e, member_of(R, e), 0
  R.agents = (R.agents or 0) + 1
  R.took_at = t
  -- the previous epoch's row in Redis, dropped after this one's first lease
  R.prev_member = epoch > 0 and member_of(R, epoch) or nil
  -- the share and validity a previous agent set are the machine's until renewed
  R.share = h_share(R)
  budgets.adopt(R.bud, h:limits())
  local till = h:valid_until()
  R.valid_until, R.fence_at = till or -1, till and till - R.cfg.ttl / 4 or -1
end

local function run(R, sched)
  local eh = R.eh
  local next_elect = 0
  R.stall = M.stall(R.cfg.ttl)
  while R.users > 0 do
    local t = monotime()
    local rc = eh:scan(false)
    if type(rc) == "number" and rc == ENOTMEMBER then eh:join() end
    -- the holder's beat (and the news that it was replaced)
    if R.is_agent and not R.h:agent_beat(R.epoch) then step_down(R) end
    if not R.is_agent and t >= next_elect then
      elect(R, t)
      next_elect = t + M.ELECT
    end
    local delay = M.ELECT
    if R.is_agent then delay = step(R, t) end
    sched.sleep(delay)
  end
  if R.is_agent and R.h:agent_beat(R.epoch) then
    -- the last pool of this process closed: hand the machine's lease to
    -- the next agent (or leave, when nothing of the machine holds a unit)
    local s = R.h:stats()
    if s.live == 0 and s.members <= 1 and R.conn then
      R.conn:script("lease", scripts.lease, R.keys, { R.ttl_ms, R.member, 0, 0, 0, R.cfg.max_live, "leave" })
      budgets.reset(R.bud)
      set_cap(R, 0)
    end
  end
end

-- The agent's place back to the machine's other processes (the task
-- ended: its last pool closed, or an exiting nginx worker's timer was
-- ended).
local function hand_over(R)
  if R.is_agent then
    R.h:agent_release(R.epoch)
    R.is_agent = false
  end
  if R.conn then R.conn:close(); R.conn = nil end
end

--- A pool of this process linked to the fleet (fleetlink.attach): the
-- first one starts this process's task on its scheduler.
function M.start(R, sched)
  R.users = R.users + 1
  if R.task then return end
  if not R.joined then
    local ok, code, msg = R.eh:join()
    if not ok then error("clientpool: fleet '" .. R.name .. "': joining its agent election: " ..
                         tostring(msg or code), 0) end
    R.joined = true
  end
  R.task = true
  R.sleep = sched.sleep
  local ngx_ = rawget(_G, "ngx")
  R.transport = (ngx_ and ngx_.socket) and "ngx" or "luasocket"
  local o = {}
  for k, v in pairs(R.cfg.redis) do o[k] = v end
  o.timeout = math_min(o.timeout or 1, R.cfg.ttl / 4)
  R.redis_opts = o
  local bg = sched.background or sched.spawn
  bg(function()
    local ok, err = ycall(run, R, sched)
    R.task = false
    -- an exiting worker (HUP) hands over at once: its old units stay with
    -- its row until it is dead, but the machine's lease must go on
    hand_over(R)
    local exiting = sched.exiting and sched.exiting()
    if not ok and not exiting then
      io.stderr:write("clientpool: fleet '", R.name, "' agent failed: ", tostring(err), "\n")
    end
  end)
end

--- A pool linked to the fleet closed.
function M.stop(R)
  if R.users > 0 then R.users = R.users - 1 end
end

-- A blocking connection for the calls made outside any task (fleet.stats,
-- fleet.pause, fleet.resume).
local function oneshot(R, name, src, args)
  local o = {}
  for k, v in pairs(R.cfg.redis) do o[k] = v end
  local ngx_ = rawget(_G, "ngx")
  local cosockets = ngx_ and ngx_.socket and ngx_.get_phase and ngx_.get_phase() ~= "init"
  local c = resp.new(o, cosockets and "ngx" or "blocking")
  local v, err = c:script(name, src, R.keys, args)
  c:close()
  return v, err
end

--- Across machines: { leased, live, max_live, quiet_ms, paused, machines =
-- { [machine] = { units, held, demand, ttl_ms } } } or nil, err.
function M.stats(R)
  local v, err = oneshot(R, "stats", scripts.stats, { R.ttl_ms })
  if type(v) ~= "table" then return nil, tostring(err) end
  local t = { leased = v[1], max_live = v[2] >= 0 and v[2] or R.cfg.max_live, quiet_ms = v[3],
              paused = v[4] ~= "-" and v[4]:sub(2) or false, live = 0, machines = {},
              agent = R.is_agent and { asks = R.asks, fails = R.fails, last_err = R.last_err,
                                       commands = R.conn and R.conn.commands or 0, share = R.share,
                                       block = R.block, epoch = R.epoch, budgets = budgets.view(R.bud) } or nil }
  -- the other budgets: units per machine, and leased in all
  local NAMES = { c = "concurrency", i = "idle" }
  for _, b in ipairs(R.bud) do t[NAMES[b.name]] = { leased = 0, max = b.cap } end
  local i = 7
  while i <= #v do
    -- (a machine's rows of several epochs, while an old one lapses: summed,
    -- as Redis counts them)
    local name = v[i]:match("^(.-)~%d+$") or v[i]
    local m = t.machines[name]
    if not m then m = { units = 0, held = 0, demand = 0, ttl_ms = v[i + 4], rows = 0 }; t.machines[name] = m end
    m.units, m.held, m.demand = m.units + v[i + 1], m.held + v[i + 2], m.demand + v[i + 3]
    m.ttl_ms, m.rows = math_max(m.ttl_ms, v[i + 4]), m.rows + 1
    t.live = t.live + v[i + 2]
    local nb = v[i + 5]
    for j = 1, nb do
      local bname, units = v[i + 4 + 2 * j], v[i + 5 + 2 * j]
      local f = NAMES[bname]
      if f then
        m[f] = (m[f] or 0) + units
        if t[f] then t[f].leased = t[f].leased + units end
      end
    end
    i = i + 6 + 2 * nb
  end
  return t
end

function M.pause(R, reason, ms)
  local v, err = oneshot(R, "pause", scripts.pause, { reason, ms or 0 })
  if not v then return nil, tostring(err) end
  R.pause_seen = "p" .. reason
  return true
end

function M.resume(R)
  local v, err = oneshot(R, "resume", scripts.resume, {})
  if v == nil then return nil, tostring(err) end
  R.pause_seen = "-"
  return true
end

--- One key paused (resume_after ms, 0: none) or resumed on every machine;
-- each agent mirrors it at its next lease reply (ttl / 4).
function M.kpause(R, key, reason, ms)
  local v, err = oneshot(R, "kpause", scripts.kpause, { key, reason, ms or 0, R.cfg.max_keys })
  if v == nil then return nil, tostring(err) end
  if v == 0 then return nil, "max_keys (" .. R.cfg.max_keys .. ") keys are paused across machines" end
  return true
end

function M.kresume(R, key)
  local v, err = oneshot(R, "kresume", scripts.kresume, { key })
  if v == nil then return nil, tostring(err) end
  return true
end

return M
