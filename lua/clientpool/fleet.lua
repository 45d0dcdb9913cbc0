--- clientpool.fleet: one budget across the processes of a machine.
--
-- A fleet is a named shared-memory segment (csrc/fleet.c; design and
-- bounds in docs/fleet.md) whose max_live, max_idle, min_idle and
-- max_concurrency are fleet-wide, never multiplied by the number of
-- processes. This module creates and inspects fleets; pools take their
-- budget from one with `clientpool.new{ fleet = name, ... }` (the engine
-- integration, docs/fleet.md "Integration plan").
--
--   local fleet = require "clientpool.fleet"
--   fleet.new("redis-main", { max_live = 20, per_key = { max_live = 10 } })
--   fleet.stats("redis-main")             -- fleet-wide, per key, per member (pid)
--   fleet.pause("redis-main", "503")      -- every member stops admitting
--   fleet.resume("redis-main")
--   fleet.remove("redis-main")            -- unlinks the segment
--
-- In nginx, call fleet.new in init_by_lua (the master, before it forks):
-- the workers inherit the mapping. The segment is private to the user
-- that made it (mode 0600).
local IS_JIT = rawget(_G, "jit") ~= nil
local JIT = IS_JIT and require "jit" or nil

local function load_backend(name)
  if name ~= "ffi" and name ~= "core" then return nil, "must be \"core\" or \"ffi\"" end
  if name == "ffi" and not IS_JIT then return nil, "\"ffi\" needs LuaJIT" end
  if name == "ffi" then return require "clientpool.fleet_ffi" end
  return require("clientpool.core").fleet
end
local BACKEND = os.getenv("CLIENTPOOL_BACKEND")
if BACKEND == nil or BACKEND == "" then BACKEND = (IS_JIT and JIT.status()) and "ffi" or "core" end
local B, backend_err = load_backend(BACKEND)
if not B then error("clientpool: CLIENTPOOL_BACKEND=" .. BACKEND .. ": " .. backend_err, 0) end

local error, pairs, type, tostring, select = error, pairs, type, tostring, select
local pcall, setmetatable = pcall, setmetatable
local math_huge, string_format = math.huge, string.format
local unpack = table.unpack or unpack

local monotime = require("clientpool.core").monotime
local caps = require "clientpool.caps"

local _M = { _VERSION = "0.1", backend = BACKEND }

-- Values from 2^30 up mean "none" inside the segment (no counter overflow).
local NONE = 1073741824
local INT_MAX = 2147483647

local function fail(fmt, ...)
  local args = { n = select("#", ...), ... }
  for i = 1, args.n do
    if type(args[i]) ~= "string" and type(args[i]) ~= "number" then args[i] = tostring(args[i]) end
  end
  error("clientpool: " .. string_format((fmt:gsub("%%d", "%%s")), unpack(args, 1, args.n)), 0)
end

local function check_name(name, fn)
  if type(name) ~= "string" or #name == 0 or #name > B.NAME_MAX or name:find("\0", 1, true) then
    fail("%s: the fleet name must be a non-empty string of at most %d bytes without NUL, got %s",
         fn, B.NAME_MAX, type(name) == "string" and string_format("%q", name:sub(1, 40)) or type(name))
  end
end

local KNOWN = {
  max_live = true, max_idle = true, min_idle = true, max_concurrency = true, per_key = true,
  max_keys = true, members = true, attempts = true, backend = true,
}

local function check_count(o, name, min, default, max)
  return caps.check_count(o, name, min, default, max, fail, "fleet option")
end

-- The limits clientpool.core.fleet.open takes, from fleet.new's options.
local function validate(o)
  if type(o) ~= "table" then fail("fleet.new expects an options table, got %s", type(o)) end
  for k in pairs(o) do
    if not KNOWN[k] then fail("unknown fleet option '%s'", tostring(k)) end
  end
  if o.backend ~= nil and o.backend ~= "shm" then
    fail("fleet option 'backend' must be \"shm\" (one machine) or \"redis\" (across machines), got %s",
         tostring(o.backend))
  end
  if o.max_live == nil then fail("fleet option 'max_live' is required (an integer >= 1)") end
  local l = {}
  l.max_live = check_count(o, "max_live", 1)
  l.min_idle = check_count(o, "min_idle", 0, 0)
  l.max_idle = check_count(o, "max_idle", 0, l.max_live)
  l.max_concurrency = check_count(o, "max_concurrency", 1, INT_MAX)
  l.max_keys = check_count(o, "max_keys", 1, 256, 65536)
  l.members = check_count(o, "members", 1, 64, 4096)
  l.attempts = check_count(o, "attempts", 1, 3)
  caps.check_order(l, fail, "fleet option")
  if l.members * l.max_keys > 2097152 then
    fail("fleet options 'members' x 'max_keys' (%d x %d) must be <= 2097152 " ..
         "(the segment holds a cell per member and key)", l.members, l.max_keys)
  end
  l.key_max_live, l.key_max_idle = -1, -1
  if o.per_key ~= nil then
    local kl, ki = caps.check(o.per_key, l, fail, "fleet option")
    l.key_max_live, l.key_max_idle = kl or -1, ki or -1
  end
  return l
end

-- The handles this process keeps open, by fleet name: the mapping made in
-- nginx's master (init_by_lua) is what its workers inherit.
local registry = {}

local Fleet = {}
local fleet_mt = { __index = Fleet, __tostring = function(self) return "clientpool.fleet: " .. self.name end }

-- backend = "redis" (across machines): clientpool.redisfleet; the
-- registered handle is this machine's local fleet, whose cap is the share
-- the machine holds from Redis (docs/fleet.md section 14).
local function redis_new(name, opts)
  local rf = require "clientpool.redisfleet"
  local f = registry[name]
  -- Both refusals come before anything is opened: a refused call leaves
  -- no machine-local segment behind.
  if f and not f._redis then fail("fleet.new('%s'): this process has it as a one-machine fleet", name) end
  if f then
    local ok, new = pcall(rf.validate, opts)
    if not ok then error(new, 0) end
    -- The agent derived its lease's ttl, its Redis connection and its
    -- member name from the first attach: a second one with others would
    -- fence on one ttl while Redis keeps the lease for another. Only the
    -- figures read at every lease (max_live, block) may change.
    local old = f._redis.cfg
    local function differs(what, x, y)
      if x ~= y then
        if what == "redis.password" then x, y = "(hidden)", "(hidden)" end
        fail("fleet.new('%s'): option '%s' differs from this process's first attach (%s, now %s): a Redis"
          .. " fleet's ttl, machine, redis and budgets but max_live are fixed while the process is attached",
          name, what, x, y)
      end
    end
    differs("ttl", old.ttl, new.ttl)
    differs("machine", old.machine, new.machine)
    -- (the agent's budgets are made at the first attach: budgets.lua)
    differs("max_concurrency", tostring(old.max_concurrency), tostring(new.max_concurrency))
    differs("max_idle", tostring(old.idle_given), tostring(new.idle_given))
    differs("per_key.max_live", tostring(old.key_max_live), tostring(new.key_max_live))
    differs("min_idle", old.min_idle, new.min_idle)
    for k, v in pairs(old.redis) do differs("redis." .. k, v, new.redis[k]) end
    for k, v in pairs(new.redis) do differs("redis." .. k, old.redis[k], v) end
    f._redis.cfg = new                    -- attach again: max_live and block apply at the next lease
    return f
  end
  local ok, h, R = pcall(rf.new, name, opts, B)
  if not ok then error(h, 0) end
  f = setmetatable({ name = name, created = false, _h = h, _redis = R }, fleet_mt)
  registry[name] = f
  return f
end

--- Creates fleet `name`, or attaches to it and updates its limits (held
-- units stay held; a lower cap admits nothing new until holdings are
-- under it). members and max_keys size the segment at creation: later
-- calls may lower them, or raise them back up to that size, not beyond.
-- Returns the fleet object (name, created, and the functions below as
-- methods).
function _M.new(name, opts)
  check_name(name, "fleet.new")
  if type(opts) == "table" and opts.backend == "redis" then return redis_new(name, opts) end
  local ok, l = pcall(validate, opts)
  if not ok then error(l, 2) end
  local h, created, msg = B.open(name, l)
  if not h then error("clientpool: fleet.new('" .. name .. "'): " .. msg, 2) end
  local f = registry[name]
  if f then
    -- the update is done: keep the first mapping, unless the segment it
    -- maps was removed meanwhile (this call made a new one)
    if created then f._h:close(); f._h = h else h:close() end
    f.created = created
    return f
  end
  f = setmetatable({ name = name, created = created, _h = h }, fleet_mt)
  registry[name] = f
  return f
end

-- This process's handle of fleet `name`: the registered one, else a
-- temporary attach (closed by the caller). Raises for an unknown fleet.
local function handle(name, fn)
  check_name(name, fn)
  local f = registry[name]
  if f then return f._h, false end
  local h, code, msg = B.open(name)
  if not h then
    if code == "enoent" then fail("%s: no fleet '%s' (fleet.new creates it)", fn, name) end
    fail("%s('%s'): %s", fn, name, msg)
  end
  return h, true
end

local function gate_value(paused, reason)
  if not paused then return false end
  return reason
end

local function none(v) if v >= NONE then return nil end return v end

--- Fleet-wide counts, per key and per member: a plain table.
function _M.stats(name)
  local rf = registry[name] and registry[name]._redis
  local h, temp = handle(name, "fleet.stats")
  local s = h:stats()
  local lim = s.limits
  local t = {
    name = name,
    live = s.live, idle = s.idle, leases = s.leases, refilling = s.refilling,
    waiting = s.demand_live + s.demand_lease, demand = { live = s.demand_live, lease = s.demand_lease },
    waiting_members = s.waiting_members, pledged = s.pledged,
    paused = gate_value(h:gate()),
    limits = {
      max_live = lim.max_live, max_idle = lim.max_idle, min_idle = lim.min_idle,
      max_concurrency = none(lim.max_concurrency), max_keys = lim.max_keys, members = lim.members,
      attempts = lim.attempts,
      per_key = { max_live = lim.key_max_live >= 0 and lim.key_max_live or nil,
                  max_idle = lim.key_max_idle >= 0 and lim.key_max_idle or nil },
    },
    member_count = s.members, key_count = s.keys, rows = s.rows, keys_cap = s.keys_cap,
    reclaimed = s.reclaimed, repairs = s.repairs, repaired_units = s.repaired_units, resets = s.resets,
    joins = s.joins, repair_pending = s.repair_pending == 1, seq = s.seq,
    keys = {}, members = {},
  }
  for slot = 0, s.keys_cap - 1 do
    local kname, ks = h:key_stats(slot)
    if kname then
      t.keys[kname] = { live = ks.live, idle = ks.idle, leases = ks.leases, refilling = ks.refilling,
                        demand = ks.demand_live, members = ks.refs, paused = gate_value(h:gate(slot)) }
    end
  end
  for row = 0, s.rows - 1 do
    local m = h:member_stats(row)
    if m then
      t.members[#t.members + 1] = {
        row = row, pid = m.pid, alive = m.alive == 1, self = m.self == 1,
        state = m.state == 1 and "joining" or m.state == 2 and "alive" or "reclaiming",
        live = m.live, idle = m.idle, leases = m.leases, refilling = m.refilling,
        demand = { live = m.demand_live, lease = m.demand_lease }, pledged = m.pledged, keys = m.keys,
        start = m.start, heartbeat_age = m.heartbeat_age,
      }
    end
  end
  if temp then h:close() end
  if rf then
    -- across machines: Redis's view (t itself is this machine's fleet)
    t.backend, t.machine = "redis", rf.cfg.machine
    local rs, err = require("clientpool.redisfleet").agent.stats(rf)
    t.redis = rs or { error = err }
  end
  return t
end

--- Unlinks the named segment. Processes attached keep using their mapping
-- until they close it; the next fleet.new makes a new segment. Returns
-- true, or false when there was no such fleet.
function _M.remove(name)
  check_name(name, "fleet.remove")
  local f = registry[name]
  if f then
    registry[name] = nil
    f._h:close()
    if f._redis then
      -- this machine's segments (Redis keeps the leases until their TTL)
      f._redis.eh:close()
      B.remove(f._redis.local_name .. ".agent")
      name = f._redis.local_name
    end
  end
  local ok, code, msg = B.remove(name)
  if ok then return true end
  if code == "enoent" then return false end
  fail("fleet.remove('%s'): %s", name, msg)
end

local function check_key(key, fn)
  if key ~= nil and (type(key) ~= "string" or #key > B.KEY_MAX) then
    fail("%s: key must be a string of at most %d bytes, got %s", fn, B.KEY_MAX,
         type(key) == "string" and (#key .. " bytes") or type(key))
  end
end

--- Pauses admission in every member of the fleet, or of one key of it.
-- opts.resume_after (seconds) reopens the gate by itself, fleet-wide.
function _M.pause(name, reason, key, opts)
  if type(reason) ~= "string" then
    fail("fleet.pause: reason must be a string, got %s", type(reason))
  end
  check_key(key, "fleet.pause")
  local till = -1
  if opts ~= nil then
    if type(opts) ~= "table" then fail("fleet.pause: options must be a table, got %s", type(opts)) end
    for k in pairs(opts) do
      if k ~= "resume_after" then fail("fleet.pause: unknown option '%s'", tostring(k)) end
    end
    local ra = opts.resume_after
    if ra ~= nil then
      if type(ra) ~= "number" or ra ~= ra or ra == math_huge or ra <= 0 then
        fail("fleet.pause: option 'resume_after' must be a finite number of seconds > 0, got %s", tostring(ra))
      end
      till = monotime() + ra
    end
  end
  local h, temp = handle(name, "fleet.pause")
  local rf = registry[name] and registry[name]._redis
  local ok, code, msg = h:pause(reason, key, till)
  if temp then h:close() end
  if ok and rf then
    -- every machine: through Redis (this one's gate is closed already)
    local ms = till >= 0 and math.max(1, math.ceil((till - monotime()) * 1000)) or 0   -- 0: no expiry
    local A = require("clientpool.redisfleet").agent
    local rok, err
    if key ~= nil then rok, err = A.kpause(rf, key, reason, ms) else rok, err = A.pause(rf, reason, ms) end
    if not rok then fail("fleet.pause('%s'): paused here, but not across machines: redis: %s", name, err) end
  end
  if not ok then
    if code == "ekeys" then fail("fleet.pause('%s'): max_keys keys are in use, no room for key '%s'", name, key) end
    fail("fleet.pause('%s'): %s", name, msg)
  end
  return true
end

--- Resumes the fleet, or one key of it (a no-op when it was not paused).
function _M.resume(name, key)
  check_key(key, "fleet.resume")
  local h, temp = handle(name, "fleet.resume")
  local rf = registry[name] and registry[name]._redis
  local ok, _, msg = h:resume(key)
  if temp then h:close() end
  if ok and rf then
    local A = require("clientpool.redisfleet").agent
    local rok, err
    if key ~= nil then rok, err = A.kresume(rf, key) else rok, err = A.resume(rf) end
    if not rok then fail("fleet.resume('%s'): resumed here, but not across machines: redis: %s", name, err) end
  end
  if not ok then fail("fleet.resume('%s'): %s", name, msg) end
  return true
end

-- The fleet object's methods: the module's functions on its name.
function Fleet:stats() return _M.stats(self.name) end
function Fleet:pause(reason, key, opts) return _M.pause(self.name, reason, key, opts) end
function Fleet:resume(key) return _M.resume(self.name, key) end
function Fleet:remove() return _M.remove(self.name) end

--- For the engine integration (docs/fleet.md): this process's open handle
-- of a fleet made by fleet.new, or nil. Not part of the public API.
function _M._handle(name)
  local f = registry[name]
  return f and f._h or nil
end

--- For clientpool.fleetlink: the limits pools default to (a Redis
-- fleet's configured figures, not the machine's current share), and the
-- Redis state (nil for a one-machine fleet).
function _M._limits(name)
  local f = registry[name]
  if f and f._redis then return require("clientpool.redisfleet").limits(f._redis) end
  return f and f._h:limits() or nil
end
function _M._redis(name)
  local f = registry[name]
  return f and f._redis or nil
end

_M._backend = B

return _M
