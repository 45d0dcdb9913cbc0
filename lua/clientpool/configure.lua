--- clientpool.configure (internal): pool:configure(), changing a running pool.
--
-- Owns configure(opts): the counts, caps and durations of a running pool
-- changed with new()'s rules (options.lua's merge and validate: one set of
-- checks and messages), handed to the engine in one call (E:configure,
-- which retires what is over a lowered cap and serves waiters from a
-- raised one), then the driver's own copies of the options (self._c, the
-- options as given in self._o, the default key's warm-floor role, the C
-- fast path's lease form). Nothing changes unless everything is accepted:
-- the checks run first (on a fleet, fleetlink.options's too: the fleet's
-- figures bound the values and give the defaults, as in new()), the
-- engine's call changes nothing when it refuses, and the driver's copies
-- are replaced only after it accepted.

local base = require "clientpool.base"
local options = require "clientpool.options"
local events = require "clientpool.events"
local checkout = require "clientpool.checkout"
local fleetlink = require "clientpool.fleetlink"
base.own_source()

local pcall, error, pairs, getmetatable = pcall, error, pairs, getmetatable
local core, Pool, DEFAULT = base.core, base.Pool, base.DEFAULT
local now_of, not_a_pool = base.now_of, base.not_a_pool
local pump = events.pump
local ECLOSED, ENOMEM = core.ECLOSED, core.ENOMEM

local M = {}

-- Without `keys` the default key is the warm key, open and pinned only
-- while a floor needs it (init.lua): a configure that gives such a pool
-- its first min_idle makes it one. Whether it must (raising, before
-- anything changed, when it is not open and max_keys keys exist):
local function needs_warm_default(self, c)
  if c.keys or c.min_idle == 0 or self._warm[DEFAULT] then return false end
  if self._kids[DEFAULT] == nil and c.max_keys then
    local n = 0
    for _ in pairs(self._kids) do n = n + 1 end
    if n >= c.max_keys then
      error("clientpool: option 'min_idle' (" .. c.min_idle .. ") makes the default key a warm key, " ..
            "but max_keys (" .. c.max_keys .. ") keys exist already", 0)
    end
  end
  return true
end

-- ... and, once the engine took the new options, doing it.
local function make_warm_default(self)
  local e = self._e
  local k = self._kids[DEFAULT]
  if k == nil then
    k = e:key_open()
    self._kids[DEFAULT] = k
    self._knames[k] = DEFAULT
  end
  e:key_pin(k, 2)   -- pinned and warm
  self._warm[DEFAULT] = true
end

--- Changes a running pool's counts, caps and durations (max_live,
-- max_idle, min_idle, max_concurrency, max_waiting, per_key, max_keys,
-- restarts, pause_mode, acquire_timeout, idle_timeout, max_lifetime,
-- lifetime_jitter, validate_after_idle, leak_threshold, create_backoff,
-- create_backoff_max) with new()'s rules; false resets one to what new()
-- does without it. A bad value raises and changes nothing. Returns true,
-- or nil, "closed" for a closed pool (nothing changes).
function Pool:configure(opts)
  if getmetatable(self) ~= Pool then not_a_pool(self, "configure") end
  local ok, merged = pcall(options.merge, self._o, opts)
  if not ok then error(merged, 2) end
  local checked = merged
  if self._c.fleet then
    -- the fleet's figures bound the new values as they bound new()'s, and
    -- an option given false (or never) takes the fleet's default again
    -- (its current limits: an attach may have changed them)
    ok, checked = pcall(fleetlink.options, merged)
    if not ok then error(checked, 2) end
  end
  local c
  ok, c = pcall(options.validate, checked)
  if not ok then error(c, 2) end
  if self._closed then return nil, "closed" end
  local e = self._e
  if e:pending() > 0 then pump(self) end    -- the key names up to date
  local warm
  ok, warm = pcall(needs_warm_default, self, c)
  if not ok then error(warm, 2) end
  local done, pending = e:configure(options.engine_config(c), now_of(self))
  if not done then
    if pending == ECLOSED then return nil, "closed" end
    if pending == ENOMEM then error("clientpool: configure(): out of memory (nothing changed)", 2) end
    -- the checks above are the engine's own rules: a refusal is a bug
    error("clientpool: configure(): the engine refused the checked options (code " .. tostring(pending) .. ")", 2)
  end
  self._c, self._o = c, merged
  if pending > 0 then pump(self) end
  if warm then make_warm_default(self) end
  checkout.fastpath_leases(self)
  base.turn_setup(self)
  if e:pending() > 0 then pump(self) end
  -- a higher min_idle or restarts: the floor looks again (the engine's
  -- EV_REFILL says when a key is short; waking it costs one turn)
  if self._run_h then self._sched.wake(self._run_h) end
  return true
end

return M
