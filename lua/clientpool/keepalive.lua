--- clientpool.keepalive (internal): idle clients checked in the background.
--
-- Owns the engine's EV_KEEPALIVE (option `keepalive`, HikariCP's
-- keepaliveTime): an idle client that sat idle that long is handed to the
-- driver, which checks it in a task of its own and reports the result
-- (E:keepalive_done): a good client goes back on top of its key's idle
-- stack, a bad one is destroyed (closed_by.invalid; stats keepalive,
-- keepalive_failed). The engine arms the time (the pool's timer, no
-- polling), bounds how many checks run at once (core.KEEPALIVE_MAX) and
-- grants no client while it is out, so no caller and no fast path sees one
-- being checked.
--
-- The check: the keepalive_check hook if there is one (a manager's own
-- probe: it gets what the idle record keeps, parked or not, and may hand
-- back what the record keeps from then on), else the validate hook on the
-- client, unparked first and parked again after when the pool parks.

local base = require "clientpool.base"
local events = require "clientpool.events"
base.own_source()

local tostring = tostring
local ycall, log, hook_key, now_of, park = base.ycall, base.log, base.hook_key, base.now_of, base.park
local pump = events.pump

local M = {}

-- Runs the check of record rec (key id k, name), idle for idle_s seconds.
-- Returns whether the client is good; leaves in self._clients[rec] what
-- its destroy hook should get if it is not.
local function check(self, rec, k, name, idle_s)
  local key = hook_key(name)
  local kc = self._c.keepalive_check
  if kc then
    -- idle: the key's idle clients, this one included (a manager whose idle
    -- clients share one upstream pool, nginx's, compares the two)
    local idle = self._e:stats(k, self._scratch).idle
    local ok, good, stored = ycall(kc, self._clients[rec], key, idle_s, idle)
    if not ok then
      log(self, "keepalive_check hook failed: " .. tostring(good))
      return false
    end
    if stored ~= nil then self._clients[rec] = stored end
    return good and true or false
  end
  local client = self._clients[rec]
  local parked = self._parked[rec]
  if parked then
    local ok, c = ycall(self._unpark, client, key)
    if not ok or c == nil then
      if not ok then log(self, "unpark hook failed: " .. tostring(c)) end
      return false                    -- destroy gets what park stored
    end
    client = c
    self._clients[rec] = c
    self._parked[rec] = nil
  end
  local ok, good = ycall(self._validate, client, key, idle_s)
  if not ok then
    log(self, "validate hook failed: " .. tostring(good))
    return false
  end
  if not good then return false end
  if parked then return (park(self, rec, client, key)) end
  return true
end

-- The background task of one check; its report lets the engine hand out
-- the next one due.
local function keepalive_task(self, rec, k, name, idle_s)
  local good = check(self, rec, k, name, idle_s)
  local _, pending = self._e:keepalive_done(rec, good, now_of(self))
  if pending > 0 then pump(self) end
end

events.on[base.core.EV_KEEPALIVE] = function(self, _, a, _, c, tt)
  self._sched.spawn(keepalive_task, self, a, c, self._knames[c], tt)
end

return M
