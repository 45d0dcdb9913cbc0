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
-- agent is whoever holds the one LIVE unit of a second local fleet,
-- `<local name>.agent` (max_live 1): its take is increment-then-check, and
-- a dead holder's unit comes back through the fleet's own reclaim (pid and
-- start time; within the stale-heartbeat age 0.5 s plus this task's 0.25 s
-- look), so a new agent takes over in under a second.
--
-- Fencing. The validity of a lease is measured from before its request
-- was sent, on this machine's CLOCK_MONOTONIC: valid_until = sent + 3/4
-- ttl, while Redis keeps the lease at least until received + ttl. Without
-- a renewal by sent + ttl/2 the cap comes down to what the machine holds
-- (nothing new is admitted; held leases stay with their callers), and at
-- valid_until to 0. valid_until is published as the gate deadline of the
-- `.agent` fleet, so every process's create hook checks it (fleetlink):
-- even with the agent stopped, no client is created on a lapsed share.
local scripts = require "clientpool.redisfleet.scripts"
local budgets = require "clientpool.redisfleet.budgets"
local resp = require "clientpool.redisfleet.resp"
local monotime = require("clientpool.core").monotime
local ycall = require("clientpool.base").ycall   -- a pcall tasks may yield through (Lua 5.1)

local math_min, math_max, math_floor, math_ceil = math.min, math.max, math.floor, math.ceil
local tostring, type = tostring, type

local M = {}
M.ELECT = 0.25        -- candidates look for a free agent unit
M.POLL = 0.01         -- the agent's look at local demand and the fence
M.IDLE = 0.05         -- the agent's look when nobody waits
M.ASK_MIN, M.ASK_MAX = 0.005, 0.1  -- re-asks while callers wait and Redis said no

local ENOTMEMBER = -12

-- The state of fleet `name` in this process (fleet.new makes it).
--   cfg: max_live, ttl (s), redis (host, port, password, username, db,
--        timeout, prefix), machine, block (the largest block)
--   h, eh: the local fleet's and the election fleet's handles; B: binding
function M.new(name, cfg, h, eh, B)
  return {
    name = name, cfg = cfg, h = h, eh = eh, B = B, bud = budgets.new(cfg, B), kb = {},
    member = cfg.machine, keys = scripts.keys(cfg.redis.prefix, name),
    ttl_ms = math_floor(cfg.ttl * 1000),
    users = 0, task = false, is_agent = false, joined = false,
    share = 0, valid_until = -1, fence_at = -1, next_due = 0, next_ask = 0, ask_gap = M.ASK_MIN,
    block = 1, others = 0, quiet = 0, machines = 1, pause_seen = "-", kpgen = -1, kpaused = {},
    -- counters (fleet.stats().redis.agent)
    asks = 0, fails = 0, last_err = nil, conn = nil,
  }
end

-- Sets the local cap to n (the share), and the other budgets' limits to
-- their shares (budgets.lua), keeping the segment's other limits.
local function set_cap(R, n)
  local lim = R.h:limits()
  lim.max_live, lim.max_idle, lim.min_idle = n, n, 0
  lim.key_max_live, lim.key_max_idle = -1, -1
  budgets.limits(R.bud, lim, R.cfg.key_max_live)
  local rc = R.h:update(lim)
  if rc == nil or rc == false then return false end
  R.share = n
  return true
end
M.set_cap = set_cap

-- Publishes valid_until to every process of the machine: the election
-- fleet's gate reads closed until then (fleetlink's create fence reads it).
local function publish(R)
  R.eh:pause("lease", nil, R.valid_until)
end

--- The create fence: true while this machine's lease is valid.
function M.valid(R)
  if R.is_agent then return monotime() < R.valid_until end
  local closed = R.eh:gate()
  return closed and true or false
end

local function mirror_pause(R, p, ms)
  if p == R.pause_seen then return end
  R.pause_seen = p
  if p == "-" then R.h:resume()
  else R.h:pause(p:sub(2), nil, (ms and ms >= 0) and (monotime() + ms / 1000) or -1) end
end

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
  local args = { R.ttl_ms, R.member, want, need, waiting, cfg.max_live, "lease" }
  local list = budgets.collect(R)
  local lowered = budgets.ask(list, R.h, waiting, R.others, R.machines, args)
  args[#args + 1] = R.kpgen
  if c < R.share or lowered then set_cap(R, c) end
  budgets.apply_keys(list, R.h)
  if not R.conn then R.conn = resp.new(R.redis_opts, R.transport, R.sleep) end
  local t0 = monotime()
  R.asks = R.asks + 1
  local v, err = R.conn:script("lease", scripts.lease, R.keys, args)
  if type(v) ~= "table" then
    R.fails = R.fails + 1
    R.last_err = tostring(err)
    R.next_due = monotime() + math_min(0.1, cfg.ttl / 8)
    R.next_ask = R.next_due       -- (waiters do not make it retry sooner)
    return
  end
  local ttl = cfg.ttl
  R.valid_until, R.fence_at = t0 + ttl * 0.75, t0 + ttl * 0.5
  publish(R)
  local n = v[1]
  budgets.granted(list, v)
  set_cap(R, n)
  budgets.apply_keys(list, R.h)
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
    if cap < R.share or lowered then set_cap(R, math_min(cap, R.share)) end
  end
  local held, waiting = h:count(LIVE, -1), h:waiting()
  local short = waiting > 0 and (R.share - held < waiting or
                                 budgets.short(R.cfg.key_max_live and budgets.collect(R) or R.bud, h, waiting))
  if t >= R.next_due or (short and t >= R.next_ask) then ask(R, t, held, waiting) end
  if h:waiting() > 0 then return M.POLL end
  return math_min(M.IDLE, math_max(0.001, R.next_due - monotime()))
end

local function h_share(R)
  return R.h:limits().max_live
end

local function run(R, sched)
  local eh, LIVE, TAKEN = R.eh, R.B.LIVE, R.B.TAKEN
  local next_elect = 0
  while R.users > 0 do
    local t = monotime()
    local rc = eh:scan(false)
    if type(rc) == "number" and rc == ENOTMEMBER then eh:join(); R.is_agent = false end
    if not R.is_agent and t >= next_elect then
      if eh:take(LIVE, -1) == TAKEN then
        R.is_agent, R.next_due, R.agents = true, 0, (R.agents or 0) + 1
        -- the share a previous agent set is the machine's until renewed
        R.share = h_share(R)
        budgets.adopt(R.bud, R.h:limits())
        R.valid_until, R.fence_at = -1, -1
        local closed, _, till = eh:gate()
        if closed and till then R.valid_until, R.fence_at = till, till - R.cfg.ttl / 4 end
      else
        next_elect = t + M.ELECT
      end
    end
    local delay = M.ELECT
    if R.is_agent then delay = step(R, t) end
    sched.sleep(delay)
  end
  if R.is_agent then
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

-- The agent unit back to the machine's other processes (the task ended:
-- its last pool closed, or an exiting nginx worker's timer was ended).
local function hand_over(R)
  if R.is_agent then
    R.eh:give(R.B.LIVE, -1)
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
                                       block = R.block, budgets = budgets.view(R.bud) } or nil }
  -- the other budgets: units per machine, and leased in all
  local NAMES = { c = "concurrency", i = "idle" }
  for _, b in ipairs(R.bud) do t[NAMES[b.name]] = { leased = 0, max = b.cap } end
  local i = 7
  while i <= #v do
    local m = { units = v[i + 1], held = v[i + 2], demand = v[i + 3], ttl_ms = v[i + 4] }
    t.machines[v[i]] = m
    t.live = t.live + v[i + 2]
    local nb = v[i + 5]
    for j = 1, nb do
      local name, units = v[i + 4 + 2 * j], v[i + 5 + 2 * j]
      local f = NAMES[name]
      if f then
        m[f] = units
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
