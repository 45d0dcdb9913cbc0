--- clientpool.owners (internal): leases whose owner ended (OpenResty).
--
-- Owns "a lease ends with the request that acquired it" (issue 12): with
-- an adapter that knows owners (sched.owner / sched.owner_alive; the ngx
-- adapter: the running request or timer), each lease records its owner
-- (lease.lua's new_lease: the pool's _lor, _loc by lease slot + 1). A lease still held when its owner ended is
-- given back as leaked: nginx closed its cosocket with the request, so
-- the engine destroys the record (closed_by leaked, the leaked counter,
-- a `leak` event), and its capacity goes to the next waiter. Nothing runs
-- at a request's end, so the driver looks:
--   * before an acquisition queues (acquire.lua's wait_for): a request
--     that ended before this one started gives its slot at once;
--   * while acquisitions wait and owned leases are held, every
--     sched.OWNER_POLL seconds (the ngx adapter: 2 ms) from a timer, so a
--     holder that ends while others wait hands its slot on within that;
--   * the same for drain(), which waits for every lease.
-- docs/decisions.md ("OpenResty: a lease ends with its request").
--
-- The look is O(1) in the common case, with no loop on the path of a wait
-- (a loop there kept LuaJIT from compiling the acquisition that waits:
-- "inner loop in root trace"): the pool's owner() is M.record,
-- which notes whether every owned lease made since the held set was last
-- seen empty has one owner (_osref, _osctx: the sole owner) or not
-- (_omixed). With a sole owner still alive no held lease can be of an
-- ended owner, so nothing is scanned; with none, no owned lease is held.
-- Else (several owners, or the sole one ended or replaced its ngx.ctx) the
-- held leases are scanned as before, and the scan notes the sole owner
-- again if there is one.

local base = require "clientpool.base"
local slot_of, is_held, SENTINEL = base.slot_of, base.is_held, base.SENTINEL
local events = require "clientpool.events"
base.own_source()

local pairs, next = pairs, next
local now_of = base.now_of
local pump, wake_drainers = events.pump, events.wake_drainers

local M = {}

-- The held leases whose owner ended, as a list (nil if none), and whether
-- any held lease has an owner at all.
-- Notes the sole owner of the held owned leases (nil: none), or that
-- there are several (sref == false).
local function note_sole(self, sref, sctx)
  if sref == false then
    self._osref, self._osctx, self._omixed = nil, nil, true
  else
    self._osref, self._osctx, self._omixed = sref, sctx, false
  end
end

local function ended(self)
  local alive = self._sched.owner_alive
  local list, n, owned = nil, 0, false
  local lor, loc = self._lor, self._loc
  local sref, sctx = nil, nil     -- the sole owner of the live owned leases; false: several
  for l, lease in pairs(self._held) do
    local ref = lor[l + 1]
    if ref and is_held(lease) then
      owned = true
      local ctx = loc[l + 1]
      local ok, moved = alive(ref, ctx)
      if not ok then
        n = n + 1
        if not list then list = {} end
        list[n] = lease
      else
        if moved ~= nil then ctx = moved; loc[l + 1] = moved end
        if sref == nil then sref, sctx = ref, ctx
        elseif sref ~= ref or sctx ~= ctx then sref = false end
      end
    end
  end
  note_sole(self, sref, sctx)
  return list, owned
end

-- Ends lease as leaked (its owner is gone, its client with it).
local function give_back(self, lease)
  local l, g = slot_of(self, lease)
  if l == nil then return end
  if self._held[l] == lease then self._held[l] = nil end
  local rec = self._lrec[l + 1]
  self._lrec[l + 1], self._loc[l + 1] = nil, nil
  local rl = self._rec_leases
  if rl and rl[rec] then rl[rec][lease] = nil end
  local _, pending = self._e:leak(l, g, now_of(self))
  lease[SENTINEL] = nil
  lease.client = nil
  if pending > 0 then pump(self) end
end

--- Gives back the held leases whose owner ended. Returns how many, and
-- whether owned leases are still held.
function M.reclaim(self)
  local list, owned = ended(self)
  if not list then return 0, owned end
  for i = 1, #list do give_back(self, list[i]) end
  if self._drain_hs then wake_drainers(self) end
  return #list, true
end

-- The watch's step: look while acquisitions (or drain()) wait and owned
-- leases are held.
local function watch_step(self)
  if self._nwaiters == 0 and not (self._drain_hs and next(self._drain_hs)) then
    self._owner_watch = false
    return false
  end
  local _, owned = M.reclaim(self)
  if not owned then self._owner_watch = false end
  return owned
end

local function start_watch(self)
  local watch = self._sched.watch_owners
  if watch and watch(watch_step, self) then self._owner_watch = true end
end

-- before_wait with the held leases scanned.
local function scan_before_wait(self, always)
  local n, owned = M.reclaim(self)
  if n > 0 and not always then return true end
  if owned and not self._owner_watch then start_watch(self) end
  return false
end

--- An acquisition (or drain(): always) is about to wait: leases of ended
-- owners go first (returns true if any did: the caller looks again), else
-- the watch runs while it waits. O(1) while the owned leases held have
-- one owner, alive (see the opening comment).
function M.before_wait(self, always)
  if self._omixed then return scan_before_wait(self, always) end
  local ref = self._osref
  if ref == nil then return false end        -- no owned lease made since none was held
  if next(self._held) == nil then            -- none held now: forget the owner
    self._osref, self._osctx = nil, nil
    return false
  end
  local ok, moved = self._sched.owner_alive(ref, self._osctx)
  if not ok or moved ~= nil then return scan_before_wait(self, always) end
  -- (a lease of that owner may be held: the watch, as after a scan)
  if not self._owner_watch then start_watch(self) end
  return false
end

--- The pool's owner(self), for new_lease: the adapter's owner(), noting
-- whether the owned leases made have one owner (see the opening comment).
-- (One function for every pool, not a closure per pool: a call site
-- compiled for one pool's closure fails its guard on the next pool's.)
function M.record(self)
  local ref, ctx = self._sched.owner()
  if ref and not self._omixed then
    local sref = self._osref
    if sref == nil then
      self._osref, self._osctx = ref, ctx
    elseif sref ~= ref or self._osctx ~= ctx then
      self._osref, self._osctx, self._omixed = nil, nil, true
    end
  end
  return ref, ctx
end

return M
