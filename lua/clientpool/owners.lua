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
local function ended(self)
  local alive = self._sched.owner_alive
  local list, n, owned = nil, 0, false
  local lor, loc = self._lor, self._loc
  for l, lease in pairs(self._held) do
    local ref = lor[l + 1]
    if ref and is_held(lease) then
      owned = true
      local ok, moved = alive(ref, loc[l + 1])
      if not ok then
        n = n + 1
        if not list then list = {} end
        list[n] = lease
      elseif moved ~= nil then
        loc[l + 1] = moved
      end
    end
  end
  return list, owned
end

-- Ends lease as leaked (its owner is gone, its client with it).
local function give_back(self, lease)
  local l, g, rec = slot_of(self, lease)
  if l == nil then return end
  if self._held[l] == lease then self._held[l] = nil end
  self._loc[l + 1] = nil
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

--- An acquisition (or drain(): always) is about to wait: leases of ended
-- owners go first (returns true if any did: the caller looks again), else
-- the watch runs while it waits.
function M.before_wait(self, always)
  local n, owned = M.reclaim(self)
  if n > 0 and not always then return true end
  if owned and not self._owner_watch then
    local watch = self._sched.watch_owners
    if watch and watch(watch_step, self) then self._owner_watch = true end
  end
  return false
end

return M
