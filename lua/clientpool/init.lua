--- clientpool: a pool of outbound clients with coroutine-native waiting.
--
-- This file is the public surface: new(), token(), the outcome codes and
-- the exports. The driver behind it (validating options, calling the
-- engine, clientpool.core, a C state machine, and carrying out what it
-- decides) is split by concept into the files it requires, each of which
-- only requires files below it (docs/design.md):
--
--   base       backend, Pool/Lease metatables, clock, log, emit, key names
--   options    option validation, scheduler resolution
--   token      cancel tokens
--   events     the event pump and its handler table, the pool's timer, kick
--   keys       key names <-> engine key ids
--   leak       leases held past leak_threshold, leases collected while held
--   owners     leases whose owner (an OpenResty request or timer) ended
--   stats      pool:stats(), the timeout/full detail, refusals
--   floor      pool:run(), the warm floor
--   keepalive  idle clients checked in the background (option keepalive)
--   lease      the Lease object
--   admission  pause, resume, retire, probe, the policy's directives
--   drain      close, drain, cancel_active
--   acquire    acquire, try_acquire, with, waiting, grants
--   checkout   checkout/checkin and the C fast path's installation
--   configure  pool:configure(), a running pool's options changed
--   fleetlink  option fleet: the budget taken from a machine-wide fleet
-- @module clientpool

local base = require "clientpool.base"
local options = require "clientpool.options"
local token = require "clientpool.token"
local events = require "clientpool.events"
require "clientpool.keys"
require "clientpool.leak"
require "clientpool.owners"
require "clientpool.stats"
require "clientpool.floor"
require "clientpool.keepalive"
local lease = require "clientpool.lease"
require "clientpool.admission"
require "clientpool.drain"
require "clientpool.acquire"
local checkout = require "clientpool.checkout"
require "clientpool.configure"
local fleetlink = require "clientpool.fleetlink"
base.own_source()

local type, error, pcall, setmetatable, tostring, ipairs, getmetatable = type, error, pcall, setmetatable,
                                                                        tostring, ipairs, getmetatable
local core, DEFAULT, WEAK_KEYS = base.core, base.DEFAULT, base.WEAK_KEYS
local not_a_pool = base.not_a_pool
local kick = events.kick
local Pool, Lease = base.Pool, base.Lease
local pools_made = 0   -- spreads the checkout handle bases of pools (see checkout)

local _M = { _VERSION = "0.1.0" }

--- The engine binding pools use unless their option `backend` says
-- otherwise: "ffi" (LuaJIT) or "core".
_M.backend = base.BACKEND

--- The default key's name (acquire without a key, or with nil, uses it):
-- pause, resume and retire take it to mean the default key alone (no key
-- means the whole pool); stats().keys and the pause and resume events name
-- the default key so. Hooks receive nil for it.
_M.DEFAULT_KEY = DEFAULT

--- Runtime outcome codes, returned as the second value of a failed acquire.
_M.codes = { timeout = "timeout", full = "full", closed = "closed", cancelled = "cancelled",
             create = "create", paused = "paused" }

--- A cancel token: pass it as `opts.cancel` to acquire; `token:cancel()`
-- ends the acquisitions waiting on it with `nil, "cancelled"`.
_M.token = token.new

--- Creates a pool. Performs no I/O.
function _M.new(opts)
  local given = opts   -- (configure() merges into these: a fleet's defaults are derived again then)
  if type(opts) == "table" and opts.fleet ~= nil then
    -- the fleet's limits are the defaults and the bounds (docs/fleet.md)
    local fok, o = pcall(fleetlink.options, opts)
    if not fok then error(o, 2) end
    opts = o
  end
  local ok, c = pcall(options.validate, opts)
  if not ok then error(c, 2) end
  local sched = options.scheduler(opts.scheduler)
  local mod = c.backend and base.load_backend(c.backend) or core
  local e = mod.new(options.engine_config(c))
  pools_made = pools_made + 1
  -- The pool's private fields, by the file that owns them (the others read
  -- some of them). Lazily set: _timer_at, _timer_h, _timer_spawned, _kicked,
  -- _early_leaks (leak), _run_h, _run_waits (floor), _drain_started
  -- (drain), _frel, _fp, _fpsync (checkout), _warm (here).
  local self = setmetatable({
    _e = e, _c = c, _sched = sched, _mono = sched.monotonic == true,          -- base, options
    _o = options.copy_options(given),       -- configure: the options as given, changed by configure()
    _create = c.create, _destroy = c.destroy, _validate = c.validate,         -- the hooks
    _park = c.park, _unpark = c.unpark,
    _clients = {}, _parked = {},            -- record -> client (or what park stored), parked flag
    _kids = {}, _knames = {},               -- keys: name -> engine id, id -> name
    _waiters = {}, _wgen = {}, _nwaiters = 0,   -- events/acquire: waiter -> handle, generation
    _opts_seen = setmetatable({}, WEAK_KEYS),   -- acquire: option tables checked once
    _on = {}, _closed = false,              -- listeners (base.emit); drain
    _held = setmetatable({}, { __mode = "v" }),   -- lease: slot -> lease (weak)
    _lor = {}, _loc = {},                   -- lease, owners: lease slot + 1 -> its owner (ref, ctx)
    _paused = false, _kpaused = {}, _pause_gen = 0,   -- admission
    _strikes = 0, _spent = false, _refilling = 0,     -- floor (and _spends, _retry_at, _retry_due)
    _spends = 0, _retry_at = 0, _retry_due = false,
    _rec_leases = c.capacity > 1 and {} or nil,       -- lease: record -> its co-holders
    _lost = c.capacity > 1 and {} or nil,             -- lease: shared records lost, until destroyed
    _scratch = {}, _drain_hs = nil,         -- stats' scratch table; drain: drain() waiters
    _pgen = {}, _pgen_next = 0,             -- admission: pause generations
    _adopted = setmetatable({}, WEAK_KEYS), -- acquire: try_acquire's adopted coroutines
    _create_err = {},             -- key name -> the error of its last failed create (BACKOFF)
    _timeouts = 0, _ktimeouts = {},   -- stats: timeouts the driver decided (deadlines over hooks), by key
    _dq = {}, _dqh = 1, _dqt = 0, -- events: destroys queued until the pump is done (rec, client, name, reason)
    _dsync = setmetatable({}, WEAK_KEYS), -- events: destroy coroutines still in their destroyer's first resume
    _hbase = (pools_made * 2654435761 + 2246822519) % 4294967296,   -- see checkout
    -- owners: the adapter's owner() (OpenResty: leases end with their request)
    _owner = type(sched.owner) == "function" and type(sched.owner_alive) == "function" and sched.owner or nil,
    _owner_watch = false,
    _untimed = false,     -- checkout.lua's clock_setup: the engine's untimed path is tried first
  }, Pool)
  self._lmt = lease.metatable(self)         -- lease: its leases' metatable (names the pool)
  -- (base.turn_of: the FFI backend's clock, read in Lua)
  if (c.backend or base.BACKEND) == "ffi" then self._mclock = mod.monotime end
  base.turn_setup(self)
  -- a collected lease is reported at the pool's clock: a grant it makes is
  -- dated then (its wait, its client's idle time), not at the last call
  e:set_notify(function() kick(self) end, self._mono and base.monotime or sched.now)
  if c.fleet then
    local fok, err = pcall(fleetlink.attach, self)
    if not fok then e:close(); error(err, 2) end
  end
  checkout.install_fastpath(self, mod)
  -- The warm keys are opened and pinned now. Without `keys` the default key
  -- is the warm key, but only a floor (min_idle > 0) needs it open before
  -- use: otherwise it is opened at its first acquire like any key, so an
  -- unused default key does not count against max_keys.
  local warm = c.keys or (c.min_idle > 0 and { DEFAULT }) or {}
  self._warm = {}
  for _, name in ipairs(warm) do
    self._warm[name] = true
    local k = e:key_open()
    e:key_pin(k, 2)   -- pinned and warm
    self._kids[name] = k
    self._knames[k] = name
    if self._fleet then self._fleet.on_key(self, k, name) end
  end
  return self
end

local EVENTS = { create = true, create_failed = true, acquire = true, release = true, destroy = true,
                 pause = true, resume = true, timeout = true, full = true, leak = true }
local EVENT_NAMES = "create, create_failed, acquire, release, destroy, pause, resume, timeout, full, leak"

local function check_listener(event, fn, fname)
  if not EVENTS[event] then
    error("clientpool: bad argument #1 to '" .. fname .. "' (unknown event '" .. tostring(event) ..
          "'; the events are " .. EVENT_NAMES .. ")", 3)
  end
  if type(fn) ~= "function" then
    error("clientpool: bad argument #2 to '" .. fname .. "' (function expected, got " .. type(fn) .. ")", 3)
  end
end

--- Registers a listener: create, create_failed, acquire, release, destroy,
-- pause, resume, timeout, full, leak. Listeners must not yield; their errors
-- are logged. Returns the pool.
function Pool:on(event, fn)
  if getmetatable(self) ~= Pool then not_a_pool(self, "on") end
  check_listener(event, fn, "on")
  local ls = self._on[event]
  if not ls then ls = {}; self._on[event] = ls end
  ls[#ls + 1] = fn
  if self._fpsync then self:_fpsync() end   -- (the C fast path hands listened calls to Lua)
  return self
end

--- Removes every registration of fn for event (none: a no-op). Returns the
-- pool. The list is replaced, not changed in place, so an emit under way
-- (a listener that removes itself) calls the listeners it started with;
-- an event left with none has no list, which is what the hot path and the
-- C fast path test for.
function Pool:off(event, fn)
  if getmetatable(self) ~= Pool then not_a_pool(self, "off") end
  check_listener(event, fn, "off")
  local ls = self._on[event]
  if not ls then return self end
  local kept = {}
  for i = 1, #ls do
    if ls[i] ~= fn then kept[#kept + 1] = ls[i] end
  end
  self._on[event] = #kept > 0 and kept or nil
  if self._fpsync then self:_fpsync() end
  return self
end

_M.Pool = Pool
_M.Lease = Lease
_M.policy = require "clientpool.policy"
return _M
