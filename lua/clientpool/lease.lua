--- clientpool.lease (internal): the Lease object.
--
-- Owns what a lease is (new_lease: its fields, registration in _held and
-- in the co-holder sets of a shared client), how it ends (finish_lease;
-- release, destroy, __close), parking a client released for reuse
-- (park_first, which checkin uses too), observe (the policy's directive is
-- applied by admission.lua's Pool:_apply) and its cancellation (fire_cancel,
-- cancelled, on_cancel; EV_LOST: a co-holder retired the shared client).
--
-- A lease table holds two values: its client and its leak sentinel (which
-- holds the lease's slot and generation: E:guarded); its pool is named by
-- its metatable (one per pool, M.metatable), its record and key are the
-- engine's (E:guarded answers them with the slot), its owner the pool's
-- (_lor, _loc by lease slot + 1), so the table
-- stays small (bench B4.alloc_lease: 96-120 B; as 8 fields it was 248-384
-- B; on Lua 5.1 the table header alone is 64 B, and a hash node 40 B).
-- What only some leases have (on_drain, leak_threshold's traceback, a
-- cancellation) is added to it when needed.
-- FIELDS names the two for the binding's C fast path (checkout.lua hands
-- it over at installation): it builds and ends leases of the common case
-- itself, so the names are given to it here, next to new_lease, their one
-- definition.

local base = require "clientpool.base"
local events = require "clientpool.events"
local leak = require "clientpool.leak"
base.own_source()

local type, error, pcall, pairs, setmetatable, tostring = type, error, pcall, pairs, setmetatable, tostring
local string_format = string.format
local emit, hook_key, now_of, outside_level = base.emit, base.hook_key, base.now_of, base.outside_level
local WEAK_KEYS, BY, park = base.WEAK_KEYS, base.BY, base.park
local pump, wake_drainers = events.pump, events.wake_drainers
local report_early = leak.report_early
local Lease = base.Lease

local M = {}

-- The lease table's fields, by what they hold (see new_lease; base.lua
-- reads them: pool_of, slot_of, is_held).
local SENTINEL = base.SENTINEL
assert(SENTINEL == 1 or SENTINEL == "_s", "new_lease's constructors name the sentinel's place")
M.FIELDS = { client = "client", sentinel = SENTINEL }
M.SENTINEL = SENTINEL
local pool_of, lease_key = base.pool_of, base.lease_key

-- A lease's cancellation: fired at drain (on_drain = { cancel = grace }),
-- by cancel_active(), or when a shared client is lost by a co-holder.
local function fire_cancel(lease)
  if lease._cancelled then return end
  lease._cancelled = true
  local fns = lease._on_cancel
  if fns then
    lease._on_cancel = nil
    local p = pool_of(lease)
    for i = 1, #fns do
      local ok, err = pcall(fns[i], lease)
      if not ok and p then
        local l = p._sched.log
        if l then pcall(l, "on_cancel callback failed: " .. tostring(err)) end
      end
    end
  end
end
M.fire_cancel = fire_cancel

-- a co-holder retired a shared client: every other lease learns it, and a
-- share granted but not yet taken up is not handed out (acquire.lua's
-- lost_share: its caller looks again); _lost keeps the record until its
-- EV_DESTROY
events.on[base.core.EV_LOST] = function(self, _, a)
  if self._lost then self._lost[a] = true end
  local set = self._rec_leases and self._rec_leases[a]
  if set then
    for lease in pairs(set) do
      if type(lease) == "table" then   -- else a checkout handle: no object to tell
        lease.lost = true
        fire_cancel(lease)
      end
    end
  end
end

-- Registers holder (a lease, or a checkout handle) among the co-holders of
-- the shared record rec (capacity > 1; rl: the pool's _rec_leases). Weak
-- keys: a co-holder set must not keep a dropped lease from the collector
-- (its finalizer reports the leak).
local function hold(rl, rec, holder)
  local set = rl[rec]
  if not set then set = setmetatable({}, WEAK_KEYS); rl[rec] = set end
  set[holder] = true
end
M.hold = hold

-- sentinel: the leak guard the engine call returned (a C userdata, or FFI
-- cdata): it reports the lease to the engine if the lease is collected while
-- held. The bindings re-arm a released lease's sentinel for a later lease,
-- so no finalizer runs per lease (a __gc on the lease table itself, possible
-- from Lua 5.2 on, ran one for every lease);
-- drain: the acquisition's on_drain ("preserve" = nil, or a grace in seconds)
local function new_lease(self, rec, l, g, client, sentinel, drain)
  local lease
  local own = self._owner
  -- (every lease has a sentinel: it is the lease's slot and generation)
  if sentinel == nil then sentinel = self._e:sentinel(l, g) end
  if own then
    -- OpenResty: the request (or timer) it belongs to, given back when that
    -- ends (owners.lua): the pool's, by slot, as the record and key are
    local ref, ctx = own()
    self._lor[l + 1], self._loc[l + 1] = ref or false, ctx or false
  end
  if SENTINEL == 1 then
    lease = setmetatable({ sentinel, client = client }, self._lmt)
  else
    lease = setmetatable({ _s = sentinel, client = client }, self._lmt)
  end
  if drain then lease._drain = drain end
  self._held[l] = lease   -- weak: for cancel_active, drain and leak reports
  if self._c.leak_threshold then
    -- the traceback starts at the caller's frame (else, in a coroutine of
    -- the pool's own, here)
    lease._where = debug.traceback("acquired", outside_level() or 2)
  end
  local rl = self._rec_leases
  if rl then hold(rl, rec, lease) end
  if drain and self._drain_started then self:_schedule_cancel(lease) end
  if self._early_leaks then report_early(self, l, g) end
  return lease
end

M.new_lease = new_lease

-- Ends the engine side of a lease; reason nil = reuse. The lease lets go
-- of its sentinel (so the binding can arm it for a later lease) only once
-- the engine has the release: with nothing but the binding's weak reference
-- left before, a collection in between (any call can run one) finalized it
-- and reported the lease as leaked, its client destroyed as such (issue
-- 18's stress test, with the collector running on its own).
-- (l, g, rec: the lease's slot, generation and record.)
local function finish_lease(self, lease, l, g, rec, reason)
  if self._held[l] == lease then self._held[l] = nil end
  if self._owner then self._loc[l + 1] = nil end   -- (the request's ngx.ctx: not kept past the lease)
  local rl = self._rec_leases
  if rl and rl[rec] then rl[rec][lease] = nil end
  local ok, pending = self._e:release(l, g, reason or -1, now_of(self))
  lease[SENTINEL] = nil
  if pending > 0 then pump(self) end
  if self._drain_hs then wake_drainers(self) end
  return ok
end
M.finish_lease = finish_lease

-- lease.release() instead of lease:release(): say so.
local function not_a_lease(self, name, level)
  error("clientpool: " .. name .. " needs the lease as self, got " .. type(self) ..
        " (call lease:" .. name .. "(...) with a colon)", level or 3)
end

local function check_held(lease, what)
  local p = pool_of(lease)
  if p == nil then not_a_lease(lease, what, 4) end
  if lease[SENTINEL] == nil then error("clientpool: lease released (" .. what .. ")", 3) end
  return p
end

-- Parks a client that is being released for reuse (lease slot l,
-- generation g) before the engine sees the release: the record may go to a
-- waiter at once, and that waiter must find it parked (in OpenResty: in
-- nginx's keepalive pool, not as the releasing request's cosocket). Not
-- when the release closes it anyway (the engine says: retired, past
-- max_lifetime, pool closed; a stale handle parks nothing either), nor
-- while co-holders other than `holder` (a lease, or a checkout handle)
-- still use it. Returns false when park failed (logged): the client is
-- then retired at the release.
local function park_first(self, rec, client, name, holder, l, g, now)
  if client == nil or self._clients[rec] ~= client or self._parked[rec] then return true end
  if self._e:release_closes(l, g, now) ~= false then return true end
  local rl = self._rec_leases
  if rl and rl[rec] then
    for other in pairs(rl[rec]) do
      if other ~= holder then return true end
    end
  end
  return (park(self, rec, client, hook_key(name)))
end
M.park_first = park_first

--- Returns the client for reuse; release(false) retires it. Idempotent;
-- never yields.
-- (Its errors are raised at the caller's line counted past the fast
-- path's C lease_release, which hands them here: outside_level.)
-- (tried: from the C lease_release, which hands here what it declined: no
-- second try of the fast path; a lease of another pool's then takes this
-- Lua path, by the same rules.)
function Lease.release(lease, reuse, tried)
  local self = pool_of(lease)
  if self == nil then not_a_lease(lease, "release", (outside_level() or 1) + 1) end
  if reuse ~= nil and reuse ~= true and reuse ~= false then
    error("clientpool: bad argument #1 to 'release' (boolean or nil expected, got " .. type(reuse) .. ")",
          outside_level() or 2)
  end
  local s = lease[SENTINEL]
  if s == nil then return end                 -- idempotent
  local fast = self._frel                     -- the C fast path (install_fastpath)
  if fast and not tried and fast(lease, reuse) then return end
  local l, g, rec, k = self._e:guarded(s)
  if l == nil then return end                 -- (released: its sentinel disarmed)
  local name = self._knames[k]
  local client = self._clients[rec]
  if reuse == false then
    finish_lease(self, lease, l, g, rec, BY.error)
  elseif self._park and not park_first(self, rec, client, name, lease, l, g, now_of(self)) then
    finish_lease(self, lease, l, g, rec, BY.retired)   -- as before: a failed park retires it
  else
    finish_lease(self, lease, l, g, rec, nil)
  end
  lease.client = nil
  if self._on.release then emit(self, "release", hook_key(name), client, reuse ~= false) end
end

--- Retires the client. Idempotent; never yields.
function Lease:destroy()
  if pool_of(self) == nil then not_a_lease(self, "destroy") end
  return self:release(false)
end

--- Passes the outcome of an operation to the pool's policy, which may
-- pause admission. Never touches the outcome or the operation; leases held
-- stay with their callers. Returns the directive (or nil).
function Lease:observe(outcome)
  local p = check_held(self, "observe")
  local policy = p._c.policy
  local d
  if policy then d = policy(outcome, self) end
  return p:_apply(d, self)
end

--- Whether the lease's cancellation fired (drain grace over, cancel_active,
-- or its shared client lost by a co-holder).
function Lease:cancelled()
  check_held(self, "cancelled")
  return self._cancelled == true
end

--- Calls fn(lease) when the lease's cancellation fires (at once if it has).
function Lease:on_cancel(fn)
  check_held(self, "on_cancel")
  if type(fn) ~= "function" then
    error("clientpool: bad argument #1 to 'on_cancel' (function expected, got " .. type(fn) .. ")", 2)
  end
  if self._cancelled then
    fn(self)
    return
  end
  local fns = self._on_cancel
  if not fns then fns = {}; self._on_cancel = fns end
  fns[#fns + 1] = fn
end

Lease.__close = function(lease, err)
  if err ~= nil then lease:release(false) else lease:release() end
end

Lease.__tostring = function(lease)
  local p = pool_of(lease)
  local name = p and lease_key(p, lease)
  if name == nil then return "clientpool.Lease (released)" end
  return string_format("clientpool.Lease: key '%s'", name)
end

-- The pool's Lease metatable: the methods (Lease), and the pool it names
-- (pool_of), in place of a field in every lease table.
function M.metatable(pool)
  return { __index = Lease, __close = Lease.__close, __tostring = Lease.__tostring, _pool = pool }
end

return M
