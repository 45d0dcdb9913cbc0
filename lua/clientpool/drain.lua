--- clientpool.drain (internal): close, drain, cancel_active.
--
-- Owns stopping a pool: close() (admission stops, waiters end "closed",
-- idle clients are retired, the drain clock starts), the cancellation of
-- leases acquired with on_drain = { cancel = grace } (_schedule_cancel,
-- which lease.lua's new_lease calls for a lease granted after close),
-- drain() (close, then wait until every lease is back: events.lua's
-- wake_drainers wakes it) and cancel_active().

local type, error, pairs, tostring, getmetatable = type, error, pairs, tostring, getmetatable
local math_huge = math.huge

local base = require "clientpool.base"
local is_held = base.is_held
base.own_source()
local now_of, clock, not_a_pool, DEFAULT, Pool = base.now_of, base.clock, base.not_a_pool, base.DEFAULT, base.Pool
local pump = require("clientpool.events").pump
local fire_cancel = require("clientpool.lease").fire_cancel
local snapshot = require("clientpool.stats").snapshot
local owners_before_wait = require("clientpool.owners").before_wait

--- Stops admission, wakes waiters with "closed", destroys idle clients;
-- leases stay with their holders and their clients are destroyed at release.
-- Starts the drain: leases acquired with on_drain = { cancel = grace } have
-- their cancellation fired grace seconds from now.
function Pool:close()
  if getmetatable(self) ~= Pool then not_a_pool(self, "close") end
  if self._closed then return end
  self._closed = true
  self._drain_started = clock(self)
  self._e:close(now_of(self))
  pump(self)
  self._timer_at = nil
  if self._timer_h then self._sched.wake(self._timer_h) end
  if self._run_h then self._sched.wake(self._run_h) end
  for _, lease in pairs(self._held) do
    if is_held(lease) and lease._drain then self:_schedule_cancel(lease) end
  end
end

function Pool:_schedule_cancel(lease)
  local grace = lease._drain
  if grace <= 0 then
    fire_cancel(lease)
    return
  end
  local sched = self._sched
  base.background(self, function()
    sched.sleep(grace)
    if is_held(lease) then fire_cancel(lease) end
  end)
end

--- close(), then waits (yields) until every lease is back. Returns true, or
-- nil, "timeout", detail when `timeout` seconds pass first.
function Pool:drain(timeout)
  if getmetatable(self) ~= Pool then not_a_pool(self, "drain") end
  if timeout ~= nil and (type(timeout) ~= "number" or timeout ~= timeout or timeout < 0
                         or timeout == math_huge) then
    error("clientpool: bad argument #1 to 'drain' (timeout must be a finite number >= 0, got "
          .. tostring(timeout) .. ")", 2)
  end
  self:close()
  local e = self._e
  -- OpenResty: leases of ended requests never come back by themselves
  -- (owners.lua gives them back now, and watches while this waits)
  if self._owner then owners_before_wait(self, true) end
  if e:stats(-1, self._scratch).leases == 0 then return true end
  local sched = self._sched
  local h, why = sched.current()
  if not h then
    error("clientpool: drain() must wait for leases, but " .. tostring(why or "the caller cannot yield"), 2)
  end
  local hs = self._drain_hs
  if not hs then
    hs = {}
    self._drain_hs = hs
    if self._fpsync then self:_fpsync() end   -- (the C fast path hands releases to Lua now)
  end
  hs[h] = true
  local deadline = timeout and clock(self) + timeout
  while e:stats(-1, self._scratch).leases > 0 do
    if deadline and clock(self) >= deadline then
      hs[h] = nil
      return nil, "timeout", snapshot(self, "timeout", DEFAULT, timeout)
    end
    sched.wait(h, deadline)
  end
  hs[h] = nil
  return true
end

--- Fires every held lease's cancellation; only once admission stopped.
function Pool:cancel_active()
  if getmetatable(self) ~= Pool then not_a_pool(self, "cancel_active") end
  if not self._closed then
    error("clientpool: cancel_active() is allowed only after close() or drain() stopped admission", 2)
  end
  for _, lease in pairs(self._held) do
    if is_held(lease) then fire_cancel(lease) end
  end
end

return {}
