--- clientpool.fleetlink (internal): a pool's link to its fleet.
--
-- `clientpool.new{ fleet = name, ... }` takes the pool's budget from the
-- machine-local fleet `name` (made by clientpool.fleet.new in this
-- process, or, in nginx, in init_by_lua before the workers forked). The
-- engine takes and gives the fleet's units itself, in the same calls where
-- it counts its own (csrc/engine.c "the fleet"); this file does what needs
-- a clock or a system call (docs/fleet.md section 10):
--
--   options   the pool's defaults come from the fleet's limits, and no
--             option may exceed them (max_live given: a cap on this
--             process's share);
--   attach    joins the fleet (once per process: after a fork the child
--             joins afresh), hands the engine the handle, and gives every
--             engine key its fleet key slot (reference counted per handle:
--             two pools of a process may use one key);
--   the poll  one background task per pool. While the engine says its
--             waiters wait for the fleet (EV_BLOCKED) it posts the demand,
--             retries at once (a give between the refusal and the post did
--             not bump the sequence), then polls the fleet's sequence every
--             POLL_MIN doubling to POLL_MAX seconds and retries when it
--             moved (or a turn was refused), with a full scan of the member
--             rows every SCAN_BLOCKED seconds (a dead member's share comes
--             back within that). Otherwise it ticks every TICK seconds:
--             heartbeat and cheap scan, the fleet's gates mirrored into the
--             engine, and rebalance (idle clients given back while other
--             members wait).
--   EV_GATES  a pause of the fleet (or of a key of it) seen by the engine
--             at an acquire: the gates are read and mirrored.
--
-- The bounds: a waiter blocked on the fleet learns of a unit freed in
-- another process within POLL_MAX (plus its scheduler's timer latency); a
-- member killed while others are blocked is reclaimed within SCAN_BLOCKED,
-- otherwise within the fleet's stale-heartbeat age (0.5 s) plus TICK; idle
-- clients of other members are shed within TICK of a demand.

local base = require "clientpool.base"
local events = require "clientpool.events"
base.own_source()

local type, error, pairs, tostring = type, error, pairs, tostring
local math_min, math_floor = math.min, math.floor
local setmetatable = setmetatable
local core, DEFAULT, clock, now_of, log = base.core, base.DEFAULT, base.clock, base.now_of, base.log
local pump = events.pump

local M = {}
local LIVE, LEASE = 0, 2   -- the fleet's kinds (set from the binding at attach)

M.POLL_MIN, M.POLL_MAX = 0.001, 0.008   -- the blocked poll: 1 ms doubling to 8 ms
M.SCAN_BLOCKED = 0.1                    -- full scans while blocked
M.TICK = 0.25                           -- heartbeat, gates, rebalance

-- Values from 2^30 up mean "none" inside the segment.
local NONE = 1073741824

local function fail(fmt, ...)
  error("clientpool: " .. string.format(fmt, ...), 0)
end

-- The fleet module, loaded on first use (a pool without a fleet never
-- loads it).
local fleet_mod
local function fleet()
  if not fleet_mod then fleet_mod = require "clientpool.fleet" end
  return fleet_mod
end

-- The fleet binding of an engine: the C API's (clientpool.core.fleet)
-- for a clientpool.core engine (a userdata), else the FFI's.
local function binding_of(e)
  if type(e) == "userdata" then return require("clientpool.core").fleet end
  return require "clientpool.fleet_ffi"
end

-- The handle engine e uses for fleet `name`: the fleet module's own when
-- it is of the same binding (a userdata for clientpool.core, a table for
-- the FFI), else one opened (attached by name) for that binding, kept for
-- the process.
local other = {}
local function handle_for(name, e)
  local h = fleet()._handle(name)
  if not h then fail("option 'fleet': no fleet '%s' in this process (clientpool.fleet.new creates it)", name) end
  local want_ffi = type(e) ~= "userdata"
  local is_ffi = type(h) == "table"
  if want_ffi == is_ffi then return h end
  local key = (want_ffi and "ffi:" or "core:") .. name
  if other[key] then return other[key] end
  local B = binding_of(e)
  local h2, _, msg = B.open(name)
  if not h2 then fail("option 'fleet': attaching to fleet '%s': %s", name, tostring(msg)) end
  other[key] = h2
  return h2
end

---------------------------------------------------------------------------
-- Options
---------------------------------------------------------------------------

local function none(v) if v == nil or v < 0 or v >= NONE then return nil end return v end

--- The options with the fleet's defaults filled in (a copy; opts is not
-- changed), after checking that none exceeds the fleet's.
function M.options(opts)
  local name = opts.fleet
  if type(name) ~= "string" or name == "" then
    fail("option 'fleet' must be the name of a fleet (a non-empty string), got %s", type(name))
  end
  local h = fleet()._handle(name)
  if not h then fail("option 'fleet': no fleet '%s' in this process (clientpool.fleet.new creates it)", name) end
  local lim = fleet()._limits(name)
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  local R = fleet()._redis(name)
  if R and type(o.create) == "function" then
    -- the fence (docs/fleet.md section 14): no client is created on a
    -- share whose lease may have lapsed, whatever this machine's agent does
    local create, valid = o.create, require("clientpool.redisfleet").agent.valid
    o.create = function(...)
      if not valid(R) then
        return nil, "clientpool: fleet '" .. name .. "': this machine's lease from redis lapsed: no new client"
      end
      return create(...)
    end
  end
  local function cap(field, fv, what)
    local v = o[field]
    if v == nil then return end
    if type(v) == "number" and fv and v > fv then
      fail("option '%s' (%s) must be <= the fleet's %s (%d): the fleet's figures are fleet-wide",
           field, tostring(v), what, fv)
    end
  end
  cap("max_live", lim.max_live, "max_live")
  cap("max_idle", lim.max_idle, "max_idle")
  cap("min_idle", lim.min_idle, "min_idle")
  cap("max_concurrency", none(lim.max_concurrency), "max_concurrency")
  if o.max_live == nil then o.max_live = lim.max_live end
  if o.max_idle == nil and type(o.max_live) == "number" then o.max_idle = math_min(lim.max_idle, o.max_live) end
  if o.min_idle == nil and type(o.max_idle) == "number" then o.min_idle = math_min(lim.min_idle, o.max_idle) end
  if o.max_concurrency == nil and none(lim.max_concurrency) and type(o.max_live) == "number" then
    local cp = type(o.capacity) == "number" and o.capacity or 1
    o.max_concurrency = math_min(lim.max_concurrency, o.max_live * cp)
  end
  local kl, ki = none(lim.key_max_live), none(lim.key_max_idle)
  if kl or ki then
    local pk = {}
    if type(o.per_key) == "table" then for k, v in pairs(o.per_key) do pk[k] = v end end
    if type(pk.max_live) == "number" and kl and pk.max_live > kl then
      fail("option 'per_key.max_live' (%s) must be <= the fleet's per_key.max_live (%d)", tostring(pk.max_live), kl)
    end
    if type(pk.max_idle) == "number" and ki and pk.max_idle > ki then
      fail("option 'per_key.max_idle' (%s) must be <= the fleet's per_key.max_idle (%d)", tostring(pk.max_idle), ki)
    end
    if pk.max_live == nil and kl and type(o.max_live) == "number" then pk.max_live = math_min(kl, o.max_live) end
    if pk.max_idle == nil and ki and type(o.max_idle) == "number" then
      pk.max_idle = math_min(ki, o.max_idle, pk.max_live or ki)
    end
    o.per_key = pk
  end
  return o
end

---------------------------------------------------------------------------
-- Keys
---------------------------------------------------------------------------

-- Per handle: fleet slot -> how many engine keys of this process use it.
local KREFS = setmetatable({}, { __mode = "k" })

local function fleet_key_name(name)
  if name == DEFAULT then return "" end
  return name
end

-- Engine key k (of name) was opened: give it its fleet slot. A key the
-- fleet cannot hold (longer than its KEY_MAX, or max_keys slots in use)
-- has no per-key accounting in the fleet (slot -1): the fleet-wide caps
-- still hold it.
local function on_key(self, k, name)
  local f = self._fleet
  local kn = fleet_key_name(name)
  local slot = -1
  if #kn <= f.key_max then
    local s, code, msg = f.h:key_open(kn)
    if s then
      slot = s
      local refs = KREFS[f.h]
      refs[s] = (refs[s] or 0) + 1
    else
      log(self, "fleet '" .. f.name .. "': key not accounted per key: " .. tostring(msg or code))
    end
  end
  f.slots[k] = slot
  if slot >= 0 then
    self._e:key_fleet(k, slot)
    f.kgate[k] = nil
    -- a gate the fleet holds for this key applies at once
    local paused, reason = f.h:gate(slot)
    if paused then f.kgate[k] = reason; self._e:gate_fleet(k, true, now_of(self)) end
  end
end

-- Engine key k was forgotten (EV_KEY_FREE): its demand withdrawn, its slot
-- closed once no key of this process uses it.
local function on_key_free(self, k)
  local f = self._fleet
  local slot = f.slots[k]
  f.slots[k] = nil
  f.kgate[k] = nil
  if slot == nil or slot < 0 then return end
  if f.posted[slot] then f.h:demand(LIVE, slot, 0); f.posted[slot] = nil end
  local refs = KREFS[f.h]
  local n = (refs[slot] or 1) - 1
  refs[slot] = n > 0 and n or nil
  if n <= 0 then f.h:key_close(slot) end
end

---------------------------------------------------------------------------
-- Gates
---------------------------------------------------------------------------

-- Mirrors the fleet's gates (its own and its keys') into the engine.
local function apply_gates(self)
  local f = self._fleet
  f.gen = f.h:gates_gen()
  local e, now = self._e, now_of(self)
  local paused, reason = f.h:gate()
  f.reason = paused and reason or nil
  e:gate_fleet(-1, paused and true or false, now)
  for k, slot in pairs(f.slots) do
    if slot >= 0 then
      local kp, kr = f.h:gate(slot)
      f.kgate[k] = kp and kr or nil
      e:gate_fleet(k, kp and true or false, now)
    end
  end
end

-- A policy's { pause = reason, scope = "fleet" }: the fleet's own gate, in
-- every member (resume_after: the gate's deadline, fleet-wide); applied
-- here at once, in the other members at their next acquire or tick.
local function pause_fleet(self, reason, resume_after)
  if resume_after == 0 then return end
  fleet().pause(self._fleet.name, reason, nil, resume_after and { resume_after = resume_after } or nil)
  apply_gates(self)
end

-- The reason a fleet gate holds key `name` (or the pool), for a refused
-- acquisition's third value.
local function reason_of(self, name)
  local f = self._fleet
  local k = name ~= nil and self._kids[name]
  return (k and f.kgate[k]) or f.reason
end

---------------------------------------------------------------------------
-- Demand and the poll
---------------------------------------------------------------------------


-- Posts what the engine's waiters wait for (absolute numbers); a slot's
-- demand is posted only while there is some.
local function post(self)
  local f, e, h = self._fleet, self._e, self._fleet.h
  h:demand(LIVE, -1, e:blocked(LIVE, -1))
  if f.use_leases then h:demand(LEASE, -1, e:blocked(LEASE, -1)) end
  for k, slot in pairs(f.slots) do
    if slot >= 0 then
      local n = e:blocked(LIVE, k)
      if n > 0 or f.posted[slot] then
        h:demand(LIVE, slot, n)
        f.posted[slot] = n > 0 or nil
      end
    end
  end
end

local function withdraw(self)
  local f, h = self._fleet, self._fleet.h
  h:demand(LIVE, -1, 0)
  if f.use_leases then h:demand(LEASE, -1, 0) end
  for slot in pairs(f.posted) do h:demand(LIVE, slot, 0) end
  f.posted = {}
end

-- The engine tries the fleet again; EV_BLOCKED (during the pump) says its
-- waiters are still refused.
local function retry(self)
  local f = self._fleet
  f.blocked, f.turn = false, false
  local _, pending = self._e:retry(now_of(self))
  if pending > 0 then pump(self) end
  f.retries = f.retries + 1
end

local function tick(self)
  local f = self._fleet
  local rc = f.h:scan(false)
  if type(rc) == "number" and rc == -12 then     -- ENOTMEMBER: forked, or the row was lost
    f.h:join()
  end
  if f.h:gates_gen() ~= f.gen then apply_gates(self) end
  local _, pending = self._e:rebalance(now_of(self))
  if pending > 0 then pump(self) end
end

local function poll_task(self)
  local f, sched = self._fleet, self._sched
  local h = sched.current()
  f.task, f.awake = h, true
  local delay = M.POLL_MIN
  local next_tick = clock(self) + M.TICK
  local next_scan, fresh = 0, true
  while not self._closed do
    local now = clock(self)
    if f.blocked then
      if now >= next_scan then
        f.h:scan(true)
        next_scan = now + M.SCAN_BLOCKED
      end
      post(self)
      local s = f.h:poll()
      if fresh or s ~= f.seq or f.turn then
        f.seq = s
        fresh = false
        retry(self)
      end
      if f.blocked then
        f.awake = false
        sched.wait(h, now + delay)
        f.awake = true
        delay = math_min(delay * 2, M.POLL_MAX)
        -- (a wake: the engine refused again, or a new block: look at once)
        if f.woken then f.woken = false; delay = M.POLL_MIN end
      else
        withdraw(self)
        delay, fresh = M.POLL_MIN, true
      end
    else
      if now >= next_tick then
        tick(self)
        next_tick = now + M.TICK
      end
      if not f.blocked and not self._closed then
        f.awake = false
        sched.wait(h, next_tick)
        f.awake = true
      end
      f.woken = false
    end
  end
  withdraw(self)
  f.task = nil
end

local function poll_main(self)
  local ok, err = base.ycall(poll_task, self)
  self._fleet.task = nil
  self._fleet.spawned = false
  -- an exiting worker (nginx after a reload: its waits end with "worker
  -- exiting"): its units stay with its row until the process is dead and
  -- reclaimed, since its parked connections close only then
  local exiting = self._sched.exiting
  if exiting and exiting() then self._fleet.h:detach() end
  if self._fleet.redis then require("clientpool.redisfleet").agent.stop(self._fleet.redis) end
  if not ok then log(self, "fleet poll task failed: " .. tostring(err)) end
end

local function start(self)
  local f = self._fleet
  if f.task then
    f.woken = true
    if not f.awake then self._sched.wake(f.task) end   -- (awake: it looks again before it waits)
  elseif not f.spawned then
    f.spawned = true
    base.background(self, poll_main, self)
  end
end

events.on[core.EV_BLOCKED] = function(self, _, a)
  local f = self._fleet
  if not f then return end
  f.blocked = true
  if math_floor(a / core.BLOCKED_TURN) % 2 == 1 then f.turn = true end
  f.blocks = f.blocks + 1
  start(self)
end

events.on[core.EV_GATES] = function(self)
  if self._fleet then apply_gates(self) end
end

---------------------------------------------------------------------------
-- Attach
---------------------------------------------------------------------------

--- Links pool self (its engine made, no key opened yet) to its fleet.
function M.attach(self)
  local name = self._c.fleet
  local h = handle_for(name, self._e)
  local ok, code, msg = h:join()
  if not ok then fail("option 'fleet': joining fleet '%s': %s", name, tostring(msg or code)) end
  local B = binding_of(self._e)
  LIVE, LEASE = B.LIVE, B.LEASE
  local lim = h:limits()
  local use_leases = none(lim.max_concurrency) ~= nil
  local eok = self._e:set_fleet(h, use_leases)
  if not eok then fail("option 'fleet': the engine refused fleet '%s'", name) end
  if not KREFS[h] then KREFS[h] = {} end
  self._fleet = {
    name = name, h = h, use_leases = use_leases, key_max = B.KEY_MAX,
    slots = {}, kgate = {}, posted = {}, gen = -1, reason = nil,
    blocked = false, turn = false, woken = false, seq = 0, retries = 0, blocks = 0,
    on_key = on_key, on_key_free = on_key_free, reason_of = reason_of, stats = M.stats,
    pause_fleet = pause_fleet,
  }
  apply_gates(self)
  start(self)
  local R = fleet()._redis(name)
  if R then
    self._fleet.redis = R
    require("clientpool.redisfleet").agent.start(R, self._sched)
  end
end

--- pool:stats().fleet: the fleet-wide view and this process's share.
function M.stats(self)
  local f = self._fleet
  local s = f.h:stats()
  local row = f.h:row()
  local me = row >= 0 and f.h:member_stats(row) or nil
  return {
    name = f.name, live = s.live, idle = s.idle, leases = s.leases,
    waiting = s.demand_live + s.demand_lease, members = s.members,
    max_live = s.limits.max_live,
    member = me and { row = row, pid = me.pid, live = me.live, idle = me.idle, leases = me.leases,
                      refilling = me.refilling } or nil,
    blocked = f.blocked, blocks = f.blocks, retries = f.retries,
  }
end

return M
