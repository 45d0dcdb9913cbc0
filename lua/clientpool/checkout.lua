--- clientpool.checkout (internal): the zero-allocation form, and the C fast path.
--
-- Owns pool:checkout() and pool:checkin(): a lease without a lease object,
-- named by an integer handle (lease slot and generation), which allocates
-- nothing when an idle client is at hand; and install_fastpath, which puts
-- the binding's C closures (clientpool.core's fastpath) in front of
-- checkout/checkin and acquire/release where the common case needs no Lua.
-- The C side knows only what install_fastpath hands it: the pool's tables,
-- the names of the lease's fields (lease.FIELDS), HSLOTS and
-- the Lua functions it hands the rest to.
--
-- checkout, checkin and the handle arithmetic stay together in one trace
-- under the JIT (spec/jit_spec.lua): no loop, no closure on that path; the
-- slow paths (checkout_grant) retry by tail calls.

local type, error, tostring, getmetatable, setmetatable = type, error, tostring, getmetatable, setmetatable

local base = require "clientpool.base"
base.own_source()
local core, Pool, Lease = base.core, base.Pool, base.Lease
local GRANT_IDLE, GRANT_CREATE, MUST_WAIT, CLOSED, STALE = core.GRANT_IDLE, core.GRANT_CREATE, core.MUST_WAIT,
                                                           core.CLOSED, core.STALE
local emit, hook_key, now_of, not_a_pool, DEFAULT, BY = base.emit, base.hook_key, base.now_of, base.not_a_pool,
                                                        base.DEFAULT, base.BY
local turn_of = base.turn_of
local events = require "clientpool.events"
local pump, reap_if_full, wake_drainers = events.pump, events.reap_if_full, events.wake_drainers
local keys = require "clientpool.keys"
local key_id, stale_key = keys.key_id, keys.stale_key
local stats = require "clientpool.stats"
local REFUSED, refused, no_key = stats.REFUSED, stats.refused, stats.no_key
local lease_m = require "clientpool.lease"
local park_first, hold = lease_m.park_first, lease_m.hold
local probe_passed = require("clientpool.admission").probe_passed
local report_early = require("clientpool.leak").report_early
local acquire = require "clientpool.acquire"
local grant, wait_for, ready_idle, create_client = acquire.grant, acquire.wait_for, acquire.ready_idle,
                                                   acquire.create_client
local unpark = acquire.unpark
local acquire_from, acquire_opts, try_from = acquire.acquire_from, acquire.acquire_opts, acquire.try_from
local retry_opts = acquire.retry_opts
local bound_of, bounded, hand_over = acquire.bound_of, acquire.bounded, acquire.hand_over
local lost_share, regrant = acquire.lost_share, acquire.regrant

local M = {}

-- A checkout handle packs the lease slot (low 21 bits) and its generation
-- (32 bits): below 2^53, exact in a double and in a Lua 5.3+ integer. The
-- engine checks the generation, so a stale handle is a no-op.
local HSLOTS = 2097152
-- Each pool offsets the generation in its handles by a base of its own, so
-- a handle of another pool, or a small forged integer, does not name one of
-- this pool's leases (generations start at 0 in every pool).
local GENS = 4294967296
local BY_ERROR = BY.error

local checkout_body, checkout_grant, checkout_taken, checkout_regranted

-- checkout's slow path: anything but an idle client usable as it is (no
-- key id yet: k nil; a refusal, a create, unpark or validate: the grant gr).
-- Returns client, nil, rec, lease, gen, waited or nil, code[, detail]. No
-- loop: a retry is a tail call. (LuaJIT: a loop here would abort every
-- trace recorded through a create, and enough aborts blacklist checkout
-- itself, hot path included.) deadline (k nil): a wait before, whose
-- grant fell through, bounds the wait here too (acquire's retry_opts).
-- inb: already in a bounded body (acquire.lua's deadlines over the hooks),
-- whose deadline acquire_timeout set.
function checkout_grant(self, key, k, name, gr, deadline, inb)
  if k == nil then
    local kerr
    k, name, kerr = key_id(self, key, "checkout")
    if not k then return no_key(self, kerr, name) end
    if self._nwaiters > 0 then reap_if_full(self) end
    local st, rec, l, g, validate, idle, pending = self._e:acquire(k, now_of(self), false)
    if pending > 0 then pump(self) end
    local waited
    if st == MUST_WAIT then
      local ok, _
      ok, st, rec, l, g, validate, idle, waited, _, deadline =
        wait_for(self, k, name, deadline and retry_opts(self, nil, deadline), true)
      if not ok then
        if st == STALE then return checkout_grant(self, key, nil, name, nil, deadline, inb) end
        return nil, st, rec
      end
    elseif st == STALE then
      stale_key(self, k, name)
      return checkout_grant(self, key, nil, name, nil, deadline, inb)
    end
    gr = grant(st, rec, l, g, validate, idle, waited)
    gr.deadline = deadline
  end
  if REFUSED[gr.st] then return refused(self, gr.st, name) end
  if not inb then
    local bound, timeout = bound_of(self, gr, nil, gr.deadline)
    if bound then
      return checkout_taken(self, key, k, name, bound,
                            bounded(self, name, bound, timeout, nil, checkout_body, key, k, name, gr))
    end
  end
  -- a leak sentinel while the hooks run (they may yield): if this coroutine
  -- dies meanwhile, the collector gives the lease or reservation back, as
  -- for acquire; the handle holds it once they are done
  local l, g = gr.l, gr.g
  local sentinel = self._e:sentinel(l, g) -- luacheck: ignore sentinel (kept alive by this frame)
  if gr.st == GRANT_CREATE then
    local client, code, err = create_client(self, name, gr.rec, nil)
    if client == nil then return nil, code, err end
    self._e:disarm(l, g)
    return client, nil, gr.rec, l, g, gr.waited
  end
  local client = ready_idle(self, name, gr, false)
  if client ~= nil then
    self._e:disarm(l, g)
    return client, nil, gr.rec, l, g, gr.waited
  end
  return checkout_regranted(self, key, k, name, gr, inb)
end

-- The idle record of grant gr failed validate/unpark and is retired: this
-- caller was granted again in its place, gr (or, out of memory, looks again
-- from scratch); the wait is not reported twice.
function checkout_regranted(self, key, k, name, gr, inb)
  local st = gr.st
  if st == GRANT_IDLE or st == GRANT_CREATE or st == CLOSED then
    gr.waited = nil
    return checkout_grant(self, key, k, name, gr, nil, inb)
  end
  -- nothing free: it waits again. A bounded body leaves that to its caller
  -- (checkout_taken), as acquire does: waiting here, its wait outlived a
  -- caller that left at its deadline (a waiter for nobody, that took the
  -- next room), and had no deadline of its own when the first grant had
  -- not waited (issue 18's stress test)
  if inb then return nil end
  return checkout_grant(self, key, nil, name, nil, gr.deadline, inb)
end

-- The results of a bounded checkout body, as its caller takes them up.
-- Nothing (the granted client failed validate and nothing else was free):
-- the caller waits again within its deadline, as acquire's does (the place
-- the engine kept for it holds if no other acquisition came in the turn
-- between: see docs/decisions.md). A client that a co-holder lost after
-- the body handed it over, before this caller ran (capacity > 1: a waiter
-- granted a share of the client as it was created ran first), is not
-- taken up: as for a share lost before its hand-over, the caller looks
-- again in its place (acquire.lua's take_late).
function checkout_taken(self, key, k, name, deadline, client, code, rec, l, g, waited)
  if client == nil then
    if code ~= nil then return nil, code, rec end
    return checkout_grant(self, key, nil, name, nil, deadline, nil)   -- looks again
  end
  if not lost_share(self, rec) then return client, code, rec, l, g, waited end
  local gr = grant(nil, rec, l, g)
  regrant(self, gr, false)
  local st = gr.st
  gr.deadline = deadline
  if st == GRANT_IDLE or st == GRANT_CREATE or st == CLOSED then
    return checkout_grant(self, key, k, name, gr, nil, nil)
  end
  return checkout_grant(self, key, nil, name, nil, deadline, nil)
end

-- A checkout whose caller left at its deadline while the hooks ran: its
-- client goes back to the pool (idle, or the next waiter).
local function checkin_orphan(self, client, _, _, l, g)
  if client == nil then return end
  local _, pending = self._e:release(l, g, -1, now_of(self))
  if pending > 0 then pump(self) end
end

function checkout_body(self, key, k, name, gr)
  return hand_over(self, checkin_orphan, checkout_grant(self, key, k, name, gr, nil, true))
end

-- Raises for a checkout key that is neither a string nor nil, at the
-- level of checkout's caller. (Called before checkout_from's tail call: on
-- Lua 5.1 an error raised after a tail call has no position.)
local function check_checkout_key(key)
  if key ~= nil and type(key) ~= "string" then
    error("clientpool: bad argument #1 to 'checkout' (key must be a string or nil, got " .. type(key) .. ")", 3)
  end
end

-- checkout_from's idle record rec, parked: the client unparked, under a
-- leak sentinel while the hook runs (it may yield), as checkout_grant's;
-- or nil and the grant the caller was given in its place (regrant) when
-- unpark failed and the record is retired. The caller's looking again
-- (checkout_regranted) runs after this frame is gone: the sentinel, taken
-- back by the regrant and then another lease's, must not stay reachable
-- from a checkout that waits (review: a lease dropped by its holder on
-- that slot was never reported as leaked, and the waiter starved).
local function checkout_unpark(self, name, st, rec, l, g, validate, idle, deadline)
  local e = self._e
  local sentinel = e:sentinel(l, g)
  local client = unpark(self, name, rec)
  if client ~= nil then
    e:disarm(l, g)
    return client
  end
  local gr = grant(st, rec, l, g, validate, idle, nil, sentinel)
  gr.deadline = deadline
  -- (the caller's own acquisition, never an orphaned grant body: regrant,
  -- not acquire.lua's unusable; gr.sentinel is the new grant's: none)
  regrant(self, gr, false)
  return nil, gr
end

-- checkout from the engine's answer to acquire (st nil: no key id yet, or
-- waiters to reap first). Shared by Pool:checkout and the C fast path's
-- wrapper (fastpath below), which hands over whatever it does not finish.
local function checkout_from(self, key, k, name, st, rec, l, g, validate, idle, pending)
  if pending and pending > 0 then pump(self) end
  local client, waited, deadline
  if st == MUST_WAIT then
    -- waited for here, not in checkout_grant: a waiting coroutine's stack
    -- is one frame shallower (memory per waiter)
    local ok, _
    ok, st, rec, l, g, validate, idle, waited, _, deadline = wait_for(self, k, name, nil, true)
    if not ok then
      if st ~= STALE then return nil, st, rec end
      st, k = nil, nil            -- looked up and acquired again (checkout_grant)
    end
  elseif st == STALE then
    stale_key(self, k, name)
    st, k = nil, nil
  end
  if st == GRANT_IDLE and not (validate and self._validate) and
     not (self._lost and self._lost[rec]) then   -- (acquire's lost_share, inline: the hot path)
    client = self._clients[rec]
    if self._parked[rec] then
      -- unparked here, with no grant record (OpenResty's common case: bench
      -- B5), under a leak sentinel while the hook runs, as checkout_grant's
      local gr
      client, gr = checkout_unpark(self, name, st, rec, l, g, validate, idle, deadline)
      if client == nil then
        local code, w
        client, code, rec, l, g, w = checkout_regranted(self, key, k, name, gr, nil)
        if client == nil then return nil, code, rec end
        waited = waited or w
      end
    end
  elseif k ~= nil and REFUSED[st] then
    return refused(self, st, name)
  else
    local code, w, gr
    if k then
      gr = grant(st, rec, l, g, validate, idle, waited)
      gr.deadline = deadline
    end
    client, code, rec, l, g, w = checkout_grant(self, key, k, name, gr)
    if client == nil then return nil, code, rec end
    waited = waited or w
  end
  if l >= HSLOTS then
    self._e:release(l, g, -1, now_of(self))
    pump(self)
    error("clientpool: checkout: more than " .. HSLOTS .. " leases at once (use acquire)", 2)
  end
  local h = ((g + self._hbase) % GENS) * HSLOTS + l
  self._e:mark_checkout(l, g)     -- (checkin finds the record and key through it)
  if self._early_leaks then report_early(self, l, g) end
  local rl = self._rec_leases
  if rl then hold(rl, rec, h) end
  if self._on.acquire then emit(self, "acquire", hook_key(name), client, waited) end
  return client, h
end

--- Acquires a client without a lease object: returns client, h (an integer
-- handle for checkin) or nil, code[, detail] as acquire does, and may wait
-- as acquire does. Allocates nothing when an idle client is at hand. No
-- leak detection by the collector: a handle never checked in holds its
-- client until the pool is gone (leak_threshold still reports it).
function Pool:checkout(key)
  local name = key
  if name == nil then name = DEFAULT end
  local k = self._kids[name]      -- only strings are keys: anything else takes the slow path
  if k ~= nil then
    local now = turn_of(self)
    if self._nwaiters > 0 then reap_if_full(self) end
    return checkout_from(self, key, k, name, self._e:acquire(k, now, false))
  end
  check_checkout_key(key)
  return checkout_from(self, key, nil, name)
end

-- checkin's less common work: shared records, events, drain, park, listeners
-- (k: the key's id; its name is read before the events, which may forget it).
local function checkin_rest(self, h, rec, client, reuse, pending, k)
  local name = self._knames[k]
  local rl = self._rec_leases
  if rl and rl[rec] then rl[rec][h] = nil end
  if pending > 0 then pump(self) end
  if self._drain_hs then wake_drainers(self) end
  if self._on.release then emit(self, "release", hook_key(name), client, reuse ~= false) end
end

-- Raises for bad checkin arguments, at the level of checkin's caller.
local function check_checkin_args(h, reuse)
  if type(h) ~= "number" or h < 0 or h % 1 ~= 0 or h >= 9007199254740992 then
    error("clientpool: bad argument #1 to 'checkin' (a handle from checkout expected, got " .. tostring(h) .. ")", 3)
  end
  if reuse ~= nil and reuse ~= true and reuse ~= false then
    error("clientpool: bad argument #2 to 'checkin' (boolean or nil expected, got " .. type(reuse) .. ")", 3)
  end
end

--- Ends a checkout: returns the client for reuse, or retires it when reuse
-- is false. A stale or repeated handle is a no-op: it never ends another
-- holder's lease. Never yields.
function Pool:checkin(h, reuse)
  check_checkin_args(h, reuse)
  local l = h % HSLOTS
  local g = ((h - l) / HSLOTS - self._hbase) % GENS
  -- the engine knows which leases checkouts hold (checkout_from marks them):
  -- a stale handle, or one naming a lease of the acquire form, is a no-op
  local rec, k = self._e:checkout_record(l, g)
  if rec == nil then return end
  local client = self._clients[rec]
  -- a checkout has no observe: its checkin for reuse is the outcome that
  -- lets a probe pass (checkin(h, false) lets the next acquisition probe)
  if reuse ~= false and self._c.probe then probe_passed(self, l, g, self._knames[k]) end
  local now
  if not self._mono then now = self._sched.now() end
  local reason = reuse == false and BY_ERROR or -1
  if reason == -1 and self._park then
    -- parked before the release (see park_first)
    if not park_first(self, rec, client, self._knames[k], h, l, g, now) then reason = BY.retired end
  end
  local ok, pending = self._e:release(l, g, reason, now)
  if not ok then return end                     -- stale: another holder's lease or none
  if pending > 0 or self._rec_leases or self._drain_hs or self._on.release then
    checkin_rest(self, h, rec, client, reuse, pending, k)
  end
end


-- What the C fast path is told rather than reads (lfastpath.c's FP_ON_*):
-- acquire and release listeners, and a drain under way (its waiters learn
-- of each release), each of which hands the call to Lua. Pool:on, Pool:off
-- and drain call it (self._fpsync) wherever one changes.
local function fastpath_sync(self)
  local fp = self._fp
  if fp then
    local on = self._on
    fp.set_flags((on.acquire and 1 or 0) + (on.release and 2 or 0) + (self._drain_hs and 4 or 0))
  end
end

-- The fast path's acquire or try_acquire (name) did nothing: their
-- argument checks, raised at the caller's line (level, as error() counts
-- from here), before Pool.acquire or Pool.try_acquire do it all.
local function check_lease_args(s, key, opts, name, level)
  if getmetatable(s) ~= Pool then not_a_pool(s, name, level + 1) end
  if opts ~= nil then acquire_opts(s, opts, level + 1) end
  if key ~= nil and type(key) ~= "string" then
    error("clientpool: bad argument #1 to '" .. name .. "' (key must be a string or nil, got " .. type(key) ..
          ")", level)
  end
end

-- What the C acquire_direct and try_direct (Lua 5.3+) hand back when they
-- did nothing (4: past their C frame, the caller's line).
local function acquire_rest(s, key, opts)
  check_lease_args(s, key, opts, "acquire", 4)
  return Pool.acquire(s, key, opts)
end

local function try_rest(s, key)
  check_lease_args(s, key, nil, "try_acquire", 4)
  return Pool.try_acquire(s, key)
end

-- The engine's calls given no time (the real clock's) try its fast path
-- without a clock read first (E:untimed) where it needs no time: not with
-- a validate hook, which reads the idle time (the C fast path decides
-- alike), nor with a duration option, where the engine would decline (a
-- call for nothing). install_fastpath and configure (fastpath_leases) call
-- it.
local function clock_setup(self)
  local c = self._c
  local untimed = self._mono and not self._validate and not (c.idle_timeout or c.max_lifetime or
                  c.validate_after_idle or c.keepalive or c.leak_threshold)
  self._e:untimed(untimed)
  -- (the FFI backend reads the acquisition's clock in Lua, base.turn_of:
  -- not where the engine's untimed path is tried first)
  self._untimed = untimed and true or false
end

-- The lease form of the fast path (self._fp, made by install_fastpath) is
-- the pool's acquire and release unless leak_threshold is set: then each
-- lease records where it was taken, in Lua. configure() calls this again
-- when leak_threshold changes.
function M.fastpath_leases(self)
  clock_setup(self)
  local fp = self._fp
  if not fp then return end
  -- (and where leases have owners: owners.lua records one on each lease)
  if self._c.leak_threshold or self._owner then
    self.acquire, self.try_acquire, self._frel = nil, nil, nil
    self._lmt.__index = Lease
  else
    self.acquire, self.try_acquire, self._frel = fp.acquire, fp.try_acquire, fp.release
    self._lmt.__index = fp.lease_methods
  end
end

-- The common case of checkout/checkin and acquire/release in C
-- (clientpool.core's fastpath): on PUC Lua, and LuaJIT with the JIT off,
-- most of a pair was the driver's Lua. Installed as the pool's own methods
-- (their leases' release method the C lease_release; Lease.release calls
-- self._frel) only where that case needs no Lua at
-- all: the engine reads the real clock, capacity 1, no probe, no park hook.
-- (The FFI backend has no fastpath: under the JIT the Lua path compiles.)
-- Anything else the C closures hand back to checkout_from, acquire_from,
-- Pool.checkout/checkin/acquire or checkin_rest, so both paths share one
-- set of rules. What the C side reads and writes it is told here, by
-- name: the tables, the lease's fields (lease_fields), the handle layout
-- (hslots) and the functions to call; what changes rarely (listeners, a
-- drain) it is told as it changes (fastpath_sync). It never sees a parked
-- client: pools with a park hook (set at new() only) go without it.
function M.install_fastpath(self, mod)
  local c = self._c
  clock_setup(self)
  if not mod.fastpath or not self._mono or c.capacity > 1 or c.probe or self._park then return end
  local checkout, checkin, lua_acquire, lua_try = Pool.checkout, Pool.checkin, Pool.acquire, Pool.try_acquire
  local fp = mod.fastpath(self._e, self, {
    kids = self._kids, clients = self._clients, default = DEFAULT, hbase = self._hbase, hslots = HSLOTS,
    validate = self._validate and true or false, checkout = checkout, checkin = checkin,
    checkout_from = checkout_from, checkin_rest = checkin_rest,
    held = self._held, lease_mt = self._lmt, pump = pump,
    drain_wake = wake_drainers,
    lease_fields = lease_m.FIELDS, release = Lease.release,
    acquire_from = acquire_from, try_from = try_from, acquire_rest = acquire_rest, try_rest = try_rest,
  })
  -- the lease form (installed by fastpath_leases). On Lua 5.1 and LuaJIT
  -- (no continuations) acquire and try_acquire are Lua wrappers of the C
  -- closure: what it hands back to Pool.acquire may wait, and must raise
  -- its argument errors at the caller's line. On Lua 5.3+ the C closures
  -- do that themselves (fp.acquire_direct, fp.try_direct: a Lua wrapper
  -- was about 75 ns of a lua5.4 lease pair), handing the rest to
  -- acquire_from/try_from, or to acquire_rest/try_rest.
  self._fp = { release = fp.release, set_flags = fp.set_flags,
               lease_methods = setmetatable({ release = fp.lease_release }, { __index = Lease }) }
  if fp.direct then
    self._fp.acquire, self._fp.try_acquire = fp.acquire_direct, fp.try_direct
  else
    local ac = fp.acquire
    self._fp.acquire = function(s, key, opts)
      if opts == nil then
        local lease, got, k, st, rec, l, g, validate, idle, pending, sentinel = ac(s, key)
        if lease then return lease end
        if got == false then
          return acquire_from(s, key, nil, nil, k, key == nil and DEFAULT or key, st, rec, l, g, validate,
                              idle, pending, sentinel)
        end
      end
      -- nothing done: Pool.acquire does it all, its errors raised here first
      -- (on Lua 5.1 an error raised after a tail call has no position)
      check_lease_args(s, key, opts, "acquire", 3)
      return lua_acquire(s, key, opts)
    end
    -- try_acquire: the same C closure (opts nil); a grant it did not
    -- finish goes on in try_from, as Pool.try_acquire's would
    self._fp.try_acquire = function(s, key)
      local lease, got, k, st, rec, l, g, validate, idle, pending, sentinel = ac(s, key)
      if lease then return lease end
      if got == false then
        return try_from(s, key, k, key == nil and DEFAULT or key, st, rec, l, g, validate, idle, pending, sentinel)
      end
      check_lease_args(s, key, nil, "try_acquire", 3)
      return lua_try(s, key)
    end
  end
  self._fpsync = fastpath_sync
  fastpath_sync(self)
  M.fastpath_leases(self)
  -- checkin is the C closure on every Lua (it never yields: it needs no
  -- continuation), but on Lua 5.1 and LuaJIT inside OpenResty: there a
  -- destroy's coroutine.resume yields the caller, which LuaJIT cannot do
  -- across a C call, so a Lua wrapper calls what the C part hands back;
  -- checkout is the C closure on Lua 5.3+
  local ngx = rawget(_G, "ngx")
  if fp.direct or not (type(ngx) == "table" and type(ngx.get_phase) == "function") then
    self.checkin = fp.checkin
  else
    local ci = fp.checkin_parts
    self.checkin = function(s, h, reuse)
      local done, rec, pending, k = ci(s, h, reuse)
      if done then return end
      if done == nil then
        check_checkin_args(h, reuse)
        return checkin(s, h, reuse)
      end
      checkin_rest(s, h, rec, s._clients[rec], reuse, pending, k)
    end
  end
  if fp.direct then
    self.checkout = fp.checkout
    return
  end
  local co = fp.checkout
  self.checkout = function(s, key)
    local client, h, k, st, rec, l, g, validate, idle, pending = co(s, key)
    if h then return client, h end
    if h == nil then
      check_checkout_key(key)
      return checkout(s, key)
    end
    return checkout_from(s, key, k, key == nil and DEFAULT or key, st, rec, l, g, validate, idle, pending)
  end
end

return M
