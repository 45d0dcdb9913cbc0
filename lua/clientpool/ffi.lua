--- clientpool.ffi: the LuaJIT FFI binding of the engine (csrc/clientpool.h).
--
-- The same surface as the C API binding clientpool.core (csrc/lclientpool.c):
-- the status and event constants, BY, monotime, sleep and new(cfg), whose
-- object has the same methods with the same arguments and results. The
-- driver (clientpool/init.lua) picks this backend on LuaJIT, where calls
-- through the C API are not compiled by the JIT and FFI calls are.
--
-- A call allocates nothing: each engine object owns its scratch grant,
-- event, stats and out-parameter cells. The engine is freed by ffi.gc (or
-- free()); a freed object swaps its metatable so every later call raises.
-- Leak sentinels are small cdata whose finalizer reports the lease to the
-- engine, then calls the driver's notify function (the contract of
-- lcp_lease__gc in lclientpool.c). A sentinel whose lease is released
-- through release() is kept for the next lease instead of being left to
-- the collector: the driver drops its reference before it releases, so no
-- one else holds it, and a finalizer call per lease is what would make the
-- acquire/release pair slow (LuaJIT runs finalizers outside compiled code).
local ffi = require "ffi"
local ffibase = require "clientpool.ffibase"

local C = ffibase.library("clientpool.ffi", "clientpool_grant_t", "clientpool.cdef")

local error, pcall, setmetatable, type = error, pcall, setmetatable, type
local math_floor = math.floor
local ffi_gc, ffi_cast = ffi.gc, ffi.cast

local _M = { _NAME = "clientpool.ffi" }

local GRANT_IDLE, GRANT_CREATE = C.CLIENTPOOL_GRANT_IDLE, C.CLIENTPOOL_GRANT_CREATE
local UNTIMED = C.CLIENTPOOL_UNTIMED
local EV_NONE = C.CLIENTPOOL_EV_NONE

-- Status and reason codes, named as clientpool.core names them (CLIENTPOOL_<name>).
for _, name in ipairs {
  "GRANT_IDLE", "GRANT_CREATE", "MUST_WAIT", "PENDING", "FULL", "CLOSED", "TIMEOUT", "CANCELLED", "STALE",
  "PAUSED", "BACKOFF", "EV_REFILL", "EV_LOST", "EKEYS", "EINVAL", "ECLOSED", "ENOMEM", "EV_WAKE",
  "EV_DESTROY", "EV_TIMER", "EV_KEY_FREE", "EV_LEAK", "EV_CREATED", "EV_KEEPALIVE", "KEEPALIVE_MAX",
  "PRIORITY_STEP", "EV_BLOCKED", "EV_GATES", "BLOCKED_LIVE", "BLOCKED_LEASE", "BLOCKED_TURN", "BLOCKED_KEY",
} do _M[name] = C["CLIENTPOOL_" .. name] end

local BY_NAMES = { "idle", "lifetime", "invalid", "error", "max_idle", "drain", "leaked", "retired", "evicted",
                   "resized", "shed" }
assert(#BY_NAMES == C.CLIENTPOOL_BY_COUNT, "clientpool.ffi: BY names out of date with clientpool.h")
_M.BY = {}
for i, name in ipairs(BY_NAMES) do _M.BY[name] = i - 1 end

local monotime = C.clientpool_monotime
_M.monotime = function() return monotime() end

function _M.sleep(s)
  if type(s) ~= "number" then
    error("bad argument #1 to 'sleep' (number expected, got " .. type(s) .. ")", 2)
  end
  C.clientpool_sleep(s)
end

local grant_t = ffi.typeof("clientpool_grant_t")
local event_t = ffi.typeof("clientpool_event_t")
local stats_t = ffi.typeof("clientpool_stats_t")
local config_t = ffi.typeof("clientpool_config_t")
local u32_1 = ffi.typeof("uint32_t[1]")
local i32_1 = ffi.typeof("int32_t[1]")
local engine_pp = ffi.typeof("clientpool_t *[1]")
local engine_ptr_t = ffi.typeof("clientpool_t *")
-- A leak sentinel: the lease it guards. Its finalizer is the pool's.
local ffi_istype = ffi.istype
local sentinel_t = ffi.typeof("struct { int32_t lease; uint32_t gen; }")

-- After free(): every method raises, as the C binding's do.
local Engine, engine_mt, freed_mt = ffibase.handle_type("clientpool.Engine", "free", "freed", "clientpool.Engine")

local WEAK_VALUES = { __mode = "v" }

-- The time a finalizer reports a collected lease at: the driver's clock
-- (protected), else -1, the engine's latest time.
local function finalizer_now(now)
  if now then
    local ok, t = pcall(now)
    if ok and type(t) == "number" then return t end
  end
  return -1
end

local function opt_int(cfg, name, def)
  local v = cfg[name]
  if v == nil then return def end
  if type(v) ~= "number" or math_floor(v) ~= v then
    error("bad argument #1 (field '" .. name .. "': integer expected)", 4)
  end
  return v
end

local function opt_num(cfg, name, def)
  local v = cfg[name]
  if v == nil then return def end
  if type(v) ~= "number" then error("bad argument #1 (field '" .. name .. "': number expected)", 4) end
  return v
end

-- The engine config for table cfg (new and configure read it alike: a
-- field left out takes new()'s default).
local function read_config(cfg, fname)
  if type(cfg) ~= "table" then
    error("bad argument #1 to '" .. fname .. "' (table expected, got " .. type(cfg) .. ")", 3)
  end
  local c = config_t()
  c.max_live = opt_int(cfg, "max_live", 0)
  c.min_idle = opt_int(cfg, "min_idle", 0)
  c.max_idle = opt_int(cfg, "max_idle", c.max_live)
  c.capacity = opt_int(cfg, "capacity", 1)
  c.max_concurrency = opt_int(cfg, "max_concurrency", c.max_live * c.capacity)
  c.max_waiting = opt_int(cfg, "max_waiting", 1024)
  c.key_max_live = opt_int(cfg, "key_max_live", -1)
  c.key_max_idle = opt_int(cfg, "key_max_idle", -1)
  c.max_keys = opt_int(cfg, "max_keys", -1)
  c.pause_fail = opt_int(cfg, "pause_fail", 0)
  c.idle_timeout = opt_num(cfg, "idle_timeout", -1)
  c.max_lifetime = opt_num(cfg, "max_lifetime", -1)
  c.lifetime_jitter = opt_num(cfg, "lifetime_jitter", 0)
  c.validate_after_idle = opt_num(cfg, "validate_after_idle", -1)
  c.leak_threshold = opt_num(cfg, "leak_threshold", -1)
  c.create_backoff = opt_num(cfg, "create_backoff", -1)
  c.create_backoff_max = opt_num(cfg, "create_backoff_max", -1)
  c.keepalive = opt_num(cfg, "keepalive", -1)
  c.seed = opt_num(cfg, "seed", 0)
  return c
end

--- new(cfg): an engine for a config the driver already validated.
function _M.new(cfg)
  local c = read_config(cfg, "new")
  local out = engine_pp()
  local rc = C.clientpool_new(c, out)
  if rc == C.CLIENTPOOL_EINVAL then error("clientpool: options outside the capacity envelope", 2) end
  if rc ~= C.CLIENTPOOL_OK then error("clientpool: out of memory", 2) end
  -- Collection.  LuaJIT keeps cdata finalizers in a weak-keyed table whose
  -- values are marked strongly, so a finalizer must not reach its own cdata,
  -- nor anything that holds it: the engine's finalizer sees only `life`; the
  -- sentinels' finalizer sees `life` and `box`: a raw pointer without
  -- finalizer, and the driver's notify and clock functions in a table with
  -- weak values (the engine object holds them strongly). Held strongly
  -- there, they reached the pool, its engine object and the spare
  -- sentinels it keeps, whose finalizer is this one: no pool that ever
  -- released a lease was collected (issue 18). A lease still held keeps
  -- its pool alive through the lease itself. Whatever order the collector
  -- or lua_close runs the finalizers in, the engine is freed once and never
  -- touched after.
  local life = { freed = false }
  local box = { raw = ffi_cast(engine_ptr_t, out[0]), fns = setmetatable({}, WEAK_VALUES) }
  local self = { g = grant_t(), ev = event_t(), st = stats_t(), u32 = u32_1(), i32 = i32_1(),
                 life = life, box = box,
                 -- lease slot + 1 -> its sentinel (weak: a dropped lease must
                 -- let its sentinel be collected); released ones kept in spare
                 guards = setmetatable({}, { __mode = "v" }), spare = {}, nspare = 0,
                 skip_clock = false }
  self.p = ffi_gc(out[0], function(p)
    if not life.freed then
      life.freed = true
      C.clientpool_free(p)
    end
  end)
  self.on_sentinel = function(s)
    if life.freed then return end
    local fns = box.fns
    if C.clientpool_leak(box.raw, s.lease, s.gen, finalizer_now(fns[2])) == 0 then
      local notify = fns[1]
      if notify then pcall(notify) end
    end
  end
  return setmetatable(self, engine_mt)
end

--- E:free(): frees the engine now (idempotent).
function Engine:free()
  local p = self.p
  self.life.freed = true
  setmetatable(self, freed_mt)
  ffi_gc(p, nil)
  C.clientpool_free(p)
  self.p = nil
end

--- E:set_notify(fn [, now]): fn() runs (protected) after a collected lease
-- was reported, so the driver can carry out the engine's events; now(), if
-- given, is the time of that report (else the engine's latest time: the
-- last call's, which a grant the report makes would then be dated at).
function Engine:set_notify(fn, now)
  self.notify_fns = { fn, now }        -- strongly here; the finalizers' copy is weak
  self.box.fns[1], self.box.fns[2] = fn, now
end

-- A leak sentinel for (lease, gen): its collection reports the lease as
-- leaked (a released lease is stale, and the engine ignores it).
local function new_sentinel(self, lease, gen)
  local n = self.nspare
  local s
  if n > 0 then
    local spare = self.spare
    s = spare[n]
    spare[n] = nil
    self.nspare = n - 1
  else
    s = ffi_gc(sentinel_t(), self.on_sentinel)
  end
  s.lease = lease
  s.gen = gen
  self.guards[lease + 1] = s
  return s
end

function Engine:sentinel(lease, gen)
  return new_sentinel(self, lease, gen)
end

-- (E:guarded's out-argument: read right after the call, which never yields)
local key_out = i32_1()

--- E:guarded(sentinel) -> lease, gen, record, key of the lease a leak
-- sentinel guards (record and key only while the engine holds the lease: a
-- lease table keeps its slot and generation in its sentinel, the rest is the
-- engine's), or nothing (not a sentinel)
function Engine:guarded(s)
  if ffi_istype(sentinel_t, s) then
    local l, g = s.lease, s.gen
    local rec = C.clientpool_lease_record(self.p, l, g, key_out)
    if rec < 0 then return l, g end
    return l, g, rec, key_out[0]
  end
end

--- E:mark_checkout(lease, gen) -> true, or false for a stale handle: the
-- lease is a checkout's (clientpool_lease_checkout)
function Engine:mark_checkout(lease, gen)
  return C.clientpool_lease_checkout(self.p, lease, gen) == 0
end

--- E:checkout_record(lease, gen) -> record, key of a lease a checkout holds,
-- or nothing (stale, or a lease of the acquire form)
function Engine:checkout_record(lease, gen)
  local rec = C.clientpool_checkout_record(self.p, lease, gen, key_out)
  if rec >= 0 then return rec, key_out[0] end
end

-- status, record, lease, gen, validate, idle, pending [, sentinel]
local function grant_results(self, st, p, g, sentinel)
  if sentinel and (st == GRANT_IDLE or st == GRANT_CREATE) then
    return st, g.record, g.lease, g.lease_gen, g.validate ~= 0, g.idle, C.clientpool_pending(p),
           new_sentinel(self, g.lease, g.lease_gen)
  end
  return st, g.record, g.lease, g.lease_gen, g.validate ~= 0, g.idle, C.clientpool_pending(p)
end

-- as grant_results, with waited after pending
local function claim_results(self, st, p, g, sentinel)
  if sentinel and (st == GRANT_IDLE or st == GRANT_CREATE) then
    return st, g.record, g.lease, g.lease_gen, g.validate ~= 0, g.idle, C.clientpool_pending(p), g.waited,
           new_sentinel(self, g.lease, g.lease_gen)
  end
  return st, g.record, g.lease, g.lease_gen, g.validate ~= 0, g.idle, C.clientpool_pending(p), g.waited
end

--- E:untimed(on): whether the calls given no time try the engine's fast
-- path without a clock read first (clientpool_acquire_untimed); the driver
-- turns it on for a pool without a validate hook (the grant's idle is not
-- measured there).
function Engine:untimed(on)
  self.skip_clock = on and true or false
end

--- E:acquire(key [, now [, sentinel]]) -> status, record, lease, gen, validate, idle, pending [, sentinel]
function Engine:acquire(key, now, sentinel)
  local p, g = self.p, self.g
  local st
  if now ~= nil then
    st = C.clientpool_acquire(p, key, now, g)
  else
    if self.skip_clock then st = C.clientpool_acquire_untimed(p, key, g) end
    if st ~= GRANT_IDLE then st = C.clientpool_acquire(p, key, monotime(), g) end
  end
  return grant_results(self, st, p, g, sentinel)
end

-- The sentinel of an ended lease (if it has one) is nobody's now: keep it.
local function recycle_sentinel(self, lease, gen)
  local guards = self.guards
  local s = guards[lease + 1]
  if s ~= nil and s.gen == gen then
    guards[lease + 1] = nil
    local n = self.nspare + 1
    self.spare[n] = s
    self.nspare = n
  end
end

--- E:disarm(lease, gen): the lease's sentinel guards it no more (checkout
-- takes one only while its hooks run: the handle holds the lease after).
function Engine:disarm(lease, gen)
  recycle_sentinel(self, lease, gen)
end

--- E:release(lease, gen, reason [, now]) -> ok, pending
function Engine:release(lease, gen, reason, now)
  local p = self.p
  local rc
  if now ~= nil then
    rc = C.clientpool_release(p, lease, gen, reason or -1, now)
  else
    if self.skip_clock then rc = C.clientpool_release_untimed(p, lease, gen, reason or -1) end
    if rc == nil or rc == UNTIMED then rc = C.clientpool_release(p, lease, gen, reason or -1, monotime()) end
  end
  if rc == 0 then recycle_sentinel(self, lease, gen) end
  return rc == 0, C.clientpool_pending(p)
end

--- E:release_closes(lease, gen [, now]) -> boolean (nil for a stale lease)
function Engine:release_closes(lease, gen, now)
  if now == nil then now = monotime() end
  local rc = C.clientpool_release_closes(self.p, lease, gen, now)
  if rc < 0 then return nil end
  return rc ~= 0
end

--- E:regrant(lease, gen [, now [, sentinel]]) -> as acquire: the lease's
-- record is destroyed as invalid and its caller granted again at once
function Engine:regrant(lease, gen, now, sentinel)
  local p, g = self.p, self.g
  if now == nil then now = monotime() end
  local st = C.clientpool_regrant(p, lease, gen, now, g)
  if st ~= C.CLIENTPOOL_STALE then recycle_sentinel(self, lease, gen) end
  return grant_results(self, st, p, g, sentinel)
end

--- E:wait(key, deadline [, now [, priority]]) -> waiter, gen, pending | nil, status
-- (priority: an integer, default 0; see clientpool_wait_priority)
function Engine:wait(key, deadline, now, priority)
  local p, gen = self.p, self.u32
  if now == nil then now = monotime() end
  local w = C.clientpool_wait_priority(p, key, deadline or -1, priority or 0, now, gen)
  if w < 0 then return nil, -w end
  return w, gen[0], C.clientpool_pending(p)
end

--- E:claim(waiter, gen [, now [, sentinel]])
-- -> status, record, lease, gen, validate, idle, pending, waited [, sentinel]
function Engine:claim(waiter, gen, now, sentinel)
  local p, g = self.p, self.g
  if now == nil then now = monotime() end
  local st = C.clientpool_claim(p, waiter, gen, now, g)
  return claim_results(self, st, p, g, sentinel)
end

--- E:cancel(waiter, gen, status [, now [, sentinel]]) -> as claim
function Engine:cancel(waiter, gen, status, now, sentinel)
  local p, g = self.p, self.g
  if now == nil then now = monotime() end
  local st = C.clientpool_cancel(p, waiter, gen, status or 0, now, g)
  return claim_results(self, st, p, g, sentinel)
end

-- The results of a call that returns a status and queues events: ok, pending.
local function done(p, rc)
  return rc == 0, C.clientpool_pending(p)
end

-- The methods that hand their arguments to one C call, the time last (now
-- if not given), and answer ok, pending: E:name(a [, now]), E:name(a, b
-- [, now]) with b_default for a nil b, and E:name(a, flag [, now]) with
-- the flag a boolean the C call takes as 1 or 0.
local function status_method(cfn)
  return function(self, a, now)
    local p = self.p
    return done(p, cfn(p, a, now or monotime()))
  end
end
local function status_method2(cfn, b_default)
  return function(self, a, b, now)
    local p = self.p
    if b == nil then b = b_default end
    return done(p, cfn(p, a, b, now or monotime()))
  end
end
local function flag_method(cfn)
  return function(self, a, flag, now)
    local p = self.p
    return done(p, cfn(p, a, flag and 1 or 0, now or monotime()))
  end
end

--- E:created(record, ok [, now]); E:keepalive_done(record, ok [, now]): the
-- background validate an EV_KEEPALIVE asked for is over (ok: the client is good)
Engine.created = flag_method(C.clientpool_created)
Engine.keepalive_done = flag_method(C.clientpool_keepalive_done)
--- E:abandon(waiter, gen [, now]); E:leak(lease, gen [, now])
Engine.abandon = status_method2(C.clientpool_abandon)
Engine.leak = status_method2(C.clientpool_leak)
--- E:destroyed(record [, now]): the destroy hook of the record an EV_DESTROY
-- named returned or failed (or there is none)
Engine.destroyed = status_method(C.clientpool_destroyed)
--- E:retire(record [, now]); E:retire_upto(record [, now]); E:retire_before(key,
-- before [, now]) (key < 0: the pool)
Engine.retire = status_method(C.clientpool_retire)
Engine.retire_upto = status_method(C.clientpool_retire_upto)
Engine.retire_before = status_method2(C.clientpool_retire_before, 0)
--- E:pause(key [, now]); E:resume(key, probe [, now]); E:gate_fleet(key, paused [, now])
Engine.pause = status_method(C.clientpool_pause)
Engine.resume = flag_method(C.clientpool_resume)
Engine.gate_fleet = flag_method(C.clientpool_gate_fleet)

--- E:configure(cfg [, now]) -> true, pending | false, code (EINVAL, ECLOSED,
-- ENOMEM): cfg as for new(), every field
function Engine:configure(cfg, now)
  local p = self.p
  local c = read_config(cfg, "configure")
  if now == nil then now = monotime() end
  local rc = C.clientpool_configure(p, c, now)
  if rc ~= 0 then return false, rc end
  return true, C.clientpool_pending(p)
end

--- E:key_caps(key, max_live, max_idle [, now]) -> ok, pending (< 0 or nil: the pool's)
function Engine:key_caps(key, max_live, max_idle, now)
  local p = self.p
  if now == nil then now = monotime() end
  local rc = C.clientpool_key_caps(p, key, max_live or -1, max_idle or -1, now)
  return rc == 0, C.clientpool_pending(p)
end

-- ---- the fleet (clientpool.h "the fleet", docs/fleet.md)

--- E:set_fleet(fleet_handle, use_leases) -> ok, pending: fleet_handle is a
-- clientpool.fleet_ffi handle (its p, a joined clientpool_fleet_t *); the
-- engine retains it until it is freed.
function Engine:set_fleet(fh, use_leases)
  local p = self.p
  if type(fh) ~= "table" or fh.p == nil then
    error("bad argument #1 to 'set_fleet' (open clientpool.Fleet expected)", 2)
  end
  return done(p, C.clientpool_set_fleet(p, fh.p, use_leases and C.CLIENTPOOL_FLEET_USE_LEASES or 0))
end

--- E:key_fleet(key, slot) -> ok, pending
function Engine:key_fleet(key, slot)
  local p = self.p
  return done(p, C.clientpool_key_fleet(p, key, slot))
end

--- E:blocked(kind, key) -> n
function Engine:blocked(kind, key)
  return C.clientpool_blocked(self.p, kind, key or -1)
end

--- E:retry([now]) -> marks, pending
function Engine:retry(now)
  local p = self.p
  return C.clientpool_retry(p, now or monotime()), C.clientpool_pending(p)
end

--- E:rebalance([now]) -> shed, pending
function Engine:rebalance(now)
  local p = self.p
  return C.clientpool_rebalance(p, now or monotime()), C.clientpool_pending(p)
end

--- E:probe_ok(lease, gen [, now]) -> was_probe, pending
function Engine:probe_ok(lease, gen, now)
  local p = self.p
  if now == nil then now = monotime() end
  local was = C.clientpool_probe_ok(p, lease, gen, now)
  return was ~= 0, C.clientpool_pending(p)
end

--- E:gate([key]) -> 0 open, 1 paused, 2 half-open
function Engine:gate(key)
  return C.clientpool_gate(self.p, key or -1)
end

--- E:floor(on [, now]) -> pending
function Engine:floor(on, now)
  local p = self.p
  if now == nil then now = monotime() end
  C.clientpool_floor(p, on and 1 or 0, now)
  return C.clientpool_pending(p)
end

--- E:refill([now]) -> record, key, pending | nil, nil, pending
function Engine:refill(now)
  local p, key = self.p, self.i32
  if now == nil then now = monotime() end
  key[0] = -1
  local r = C.clientpool_refill(p, now, key)
  if r < 0 then return nil, nil, C.clientpool_pending(p) end
  return r, key[0], C.clientpool_pending(p)
end

-- The methods of a C call that takes only the time (now if not given) and
-- queues events: E:name([now]) -> pending.
local function pending_method(cfn)
  return function(self, now)
    local p = self.p
    cfn(p, now or monotime())
    return C.clientpool_pending(p)
  end
end

--- E:tick([now]) -> pending; E:close([now]) -> pending
Engine.tick = pending_method(C.clientpool_tick)
Engine.close = pending_method(C.clientpool_close)

--- E:key_open() -> key | nil, status
function Engine:key_open()
  local k = C.clientpool_key_open(self.p)
  if k < 0 then return nil, k end
  return k
end

function Engine:key_pin(key, pinned)
  -- true/false as the C binding takes them; 2 pins a warm key
  if type(pinned) ~= "number" then pinned = pinned and 1 or 0 end
  return C.clientpool_key_pin(self.p, key, pinned) == 0
end

function Engine:key_forget(key)
  return C.clientpool_key_forget(self.p, key) ~= 0
end

--- E:next_event() -> type, a, b, c, t, left | nothing (left: events still queued)
function Engine:next_event()
  local ev, p = self.ev, self.p
  if C.clientpool_next_event(p, ev) == EV_NONE then return end
  return ev.type, ev.a, ev.b, ev.c, ev.t, C.clientpool_pending(p)
end

function Engine:pending()
  return C.clientpool_pending(self.p)
end

function Engine:next_deadline()
  local d = C.clientpool_next_deadline(self.p)
  if d < 0 then return nil end
  return d
end

function Engine:is_closed()
  return C.clientpool_is_closed(self.p) ~= 0
end

function Engine:record_created(record)
  local t = C.clientpool_record_created(self.p, record)
  if t < 0 then return nil end
  return t
end

function Engine:lease_age(lease, gen, now)
  local p = self.p
  if now == nil then now = monotime() end
  local a = C.clientpool_lease_age(p, lease, gen, now)
  if a < 0 then return nil end
  return a
end

--- E:stats(key, t) -> t filled (key < 0 or nil: the whole pool), or nil
function Engine:stats(key, t)
  local s = self.st
  if C.clientpool_stats(self.p, key or -1, s) ~= 0 then return nil end
  if type(t) ~= "table" then t = {} end
  t.opened = s.opened
  t.reused = s.reused
  t.closed = s.closed
  t.leaked = s.leaked
  t.timeouts = s.timeouts
  t.rejected = s.rejected
  t.cancelled = s.cancelled
  t.create_failed = s.create_failed
  t.wait_count = s.wait_count
  t.wait_time = s.wait_time
  t.keepalive = s.keepalive
  t.keepalive_failed = s.keepalive_failed
  t.live = s.live
  t.idle = s.idle
  t.active = s.active
  t.leases = s.leases
  t.creating = s.creating
  t.waiting = s.waiting
  t.closing = s.closing
  local by = t.closed_by
  if type(by) ~= "table" then by = {}; t.closed_by = by end
  for i = 1, #BY_NAMES do by[BY_NAMES[i]] = s.closed_by[i - 1] end
  return t
end

return _M
