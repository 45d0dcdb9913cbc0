--- clientpool.stats (internal): what a pool reports about itself.
--
-- Owns pool:stats() (the engine's counters as a plain table, per key too)
-- and the detail of a timeout or full refusal (snapshot: the counts at
-- that moment, printable like HikariCP's exhaustion message).

local base = require "clientpool.base"
local events = require "clientpool.events"
base.own_source()

local pairs, setmetatable, tostring, getmetatable = pairs, setmetatable, tostring, getmetatable
local string_format = string.format
local hook_key, not_a_pool, emit = base.hook_key, base.not_a_pool, base.emit
local pump, reap_dead_waiters = events.pump, events.reap_dead_waiters
local Pool = base.Pool

local M = {}

---------------------------------------------------------------------------
-- Details of timeout and full: counts, printable like HikariCP's message.
---------------------------------------------------------------------------

local Detail = {}
Detail.__index = Detail
Detail.__tostring = function(d)
  local head
  if d.reason == "timeout" then
    head = string_format("timeout after %.3fs", d.waited or 0)
  elseif d.reason == "max_keys" then
    head = "max_keys keys exist"
  else
    head = "max_waiting acquisitions wait already"
  end
  local s = string_format("%s (live=%d, idle=%d, active=%d, waiting=%d)", head, d.live, d.idle, d.active, d.waiting)
  if d.paused then s = s .. ", paused: " .. tostring(d.paused) end
  return s
end
Detail.__concat = function(a, b) return tostring(a) .. tostring(b) end

local function snapshot(self, reason, name, waited)
  -- the scratch table: read at once, and a fresh stats table (with its
  -- closed_by) per timeout was most of the garbage of a timed-out wait
  local s = self._e:stats(-1, self._scratch)
  -- paused: why admission was held (the key's or the pool's pause reason,
  -- "probe" while a half-open gate admits one at a time), else nil
  local paused = self._paused or (name and self._kpaused[name]) or nil
  if not paused and self._c.probe then
    local k = name and self._kids[name]
    if self._e:gate(-1) == 2 or (k and self._e:gate(k) == 2) then paused = "probe" end
  end
  -- eight fields in the constructor, key and paused set only when they
  -- are there: a constructor naming ten (nil ones count) sizes the hash
  -- part for sixteen, half of it empty in the common case (the default key
  -- unpaused): 440 B -> 248 B of garbage per timed-out wait on Lua 5.4,
  -- 449 B -> 257 B under LuaJIT (bench B3.wait, issue 17)
  local d = setmetatable({ live = s.live, idle = s.idle, active = s.active, waiting = s.waiting,
                           leases = s.leases, creating = s.creating, waited = waited, reason = reason }, Detail)
  local key = hook_key(name)
  if key ~= nil then d.key = key end
  if paused ~= nil then d.paused = paused end
  return d
end
M.snapshot = snapshot

-- A timeout the driver decides: a caller's create or validate outlived its
-- deadline (acquire.lua's bounded). Counted with the engine's timeouts
-- (stats().timeouts, pool and key), with the detail and the `timeout` event
-- of a wait that timed out. Returns the caller's nil, "timeout", detail.
function M.timed_out(self, name, waited)
  self._timeouts = self._timeouts + 1
  local kt = self._ktimeouts
  kt[name] = (kt[name] or 0) + 1
  local d = snapshot(self, "timeout", name, waited)
  emit(self, "timeout", hook_key(name), d)
  return nil, "timeout", d
end

-- The engine's refusals of an acquisition (acquire, try_acquire and
-- checkout map them the same way): REFUSED[st] is true for them, and
-- refused(self, st, name) returns the caller's nil, code[, detail].
local core = base.core
local FULL, PAUSED, CLOSED, BACKOFF = core.FULL, core.PAUSED, core.CLOSED, core.BACKOFF
M.REFUSED = { [FULL] = true, [PAUSED] = true, [CLOSED] = true, [BACKOFF] = true }

-- A refusal as full (max_waiting acquisitions wait, reason "full", or
-- max_keys keys exist, "max_keys"): the `full` event, then the caller's
-- nil, "full", detail.
local function full(self, name, reason)
  local d = snapshot(self, reason, name)
  if self._on.full then emit(self, "full", hook_key(name), d) end
  return nil, "full", d
end
M.full = full

function M.refused(self, st, name)
  if st == FULL then
    return full(self, name, "full")
  elseif st == PAUSED then
    return nil, "paused", self._kpaused[name] or self._paused or (self._fleet and self._fleet.reason_of(self, name))
      or "probe"
  elseif st == BACKOFF then     -- creates of the key fail: fail fast with the last error
    return nil, "create", self._create_err[name] or "create backing off"
  end
  return nil, "closed"
end

-- A key that could not be opened (keys.lua's key_id failed with kerr).
function M.no_key(self, kerr, name)
  if kerr == core.EKEYS then return full(self, name, "max_keys") end
  return nil, "closed"
end

--- A plain table of counters; `keys` holds the same per key.
local function stats_once(self)
  self._kicked = false          -- (a finalizer sets it: see Pool:stats)
  pump(self)
  reap_dead_waiters(self)
  local e = self._e
  local s = e:stats(-1, {})
  s.paused = self._paused
  s.floor_spent = self._spent
  s.timeouts = s.timeouts + self._timeouts      -- (and the driver's: timed_out)
  local keys, kt = {}, self._ktimeouts
  for name, k in pairs(self._kids) do
    local ks = e:stats(k, {})
    if ks then
      ks.paused = self._kpaused[name] or false
      ks.timeouts = ks.timeouts + (kt[name] or 0)
      keys[name] = ks
    end
  end
  s.keys = keys
  if self._fleet then s.fleet = self._fleet.stats(self) end
  return s
end

function Pool:stats()
  if getmetatable(self) ~= Pool then not_a_pool(self, "stats") end
  -- one snapshot: a lease collected while it was read (the tables it makes
  -- can run the collector, and the finalizer changes the engine at once)
  -- made the pool's counts and its keys' disagree, or `closed` count a
  -- destroy whose event was not carried out yet (the driver's stress test
  -- found it, issue 18): read again, a few times at most
  local s = stats_once(self)
  for _ = 1, 4 do
    if not self._kicked then break end
    s = stats_once(self)
  end
  return s
end

return M
