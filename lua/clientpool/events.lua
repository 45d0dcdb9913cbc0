--- clientpool.events (internal): the engine's events, carried out.
--
-- Owns the event pump (pump: the engine's queued events, one at a time and
-- in order), the table of handlers the pump dispatches through, the pool's
-- timer task (one background task ticking the engine at its next
-- deadline), kick (a collected lease's finalizer asks for a pump), the
-- destroy hook's runner, the registry of waiting handles that EV_WAKE wakes
-- (give_back, reaping dead waiters) and the wake of drain() waiters.
--
-- The pump sits low: the files above register the handlers of the events
-- that are theirs (M.on[code] = fn(self, e, a, b, c, tt): EV_LOST in
-- lease.lua, EV_KEY_FREE in keys.lua, EV_LEAK in leak.lua, EV_REFILL in
-- floor.lua), so this file requires none of them. An event with no
-- handler is ignored.

local base = require "clientpool.base"
base.own_source()

local core = base.core
local type, pairs, tostring = type, pairs, tostring
local co_status = coroutine.status
local ycall, log, emit, hook_key, now_of, clock = base.ycall, base.log, base.emit, base.hook_key, base.now_of,
                                                  base.clock
local BY_NAME = base.BY_NAME
local EV_WAKE, EV_DESTROY, EV_TIMER = core.EV_WAKE, core.EV_DESTROY, core.EV_TIMER

local M = {}
local ON = {}        -- event code -> handler(self, e, a, b, c, tt)
M.on = ON

local pump

-- The cap is physical: the record counts against max_live until its
-- destroy hook returned or failed, which the engine learns here.
local function destroy_task(self, destroy, client, name, rec)
  local ok, err = ycall(destroy, client, hook_key(name))
  if not ok then log(self, "destroy hook failed: " .. tostring(err)) end
  local _, pending = self._e:destroyed(rec, now_of(self))
  if pending > 0 then pump(self) end
end

-- (No closure here or in start_timer: LuaJIT cannot compile closure
-- creation, and an abort in a path this common blacklists its callers.)
local function run_destroy(self, rec, client, name, reason)
  local destroy = self._destroy
  if destroy then self._sched.spawn(destroy_task, self, destroy, client, name, rec)
  else self._e:destroyed(rec, now_of(self)) end   -- (its events: this pump drains them)
  emit(self, "destroy", hook_key(name), client, reason)
end

-- The pool's timer: one background task waits for the engine's next
-- deadline and ticks it; EV_TIMER moves the deadline earlier. A kick (a lease
-- reported by the garbage collector) has it carry out the engine's events.
local function timer_task(self)
  local sched = self._sched
  local h = sched.current()
  self._timer_h = h
  while self._kicked or (self._timer_at and not self._closed) do
    if self._kicked then
      self._kicked = false
      pump(self)
    else
      local t = self._timer_at
      if clock(self) < t then sched.wait(h, t) end
      if self._timer_at and clock(self) >= self._timer_at then
        self._timer_at = nil
        self._e:tick(now_of(self))
        pump(self)
      end
    end
  end
  self._timer_h = nil
end

local function timer_main(self)
  local ok, err = ycall(timer_task, self)
  self._timer_spawned = false
  self._timer_h = nil
  if not ok then log(self, "timer task failed: " .. tostring(err)) end
end

local function start_timer(self)
  if self._timer_h then
    self._sched.wake(self._timer_h)
  elseif not self._timer_spawned then
    self._timer_spawned = true
    local bg = self._sched.background or self._sched.spawn
    bg(timer_main, self)
  end
end

local function arm(self, t)
  if self._closed then return end
  if self._timer_at and self._timer_at <= t then return end
  self._timer_at = t
  start_timer(self)
end

-- Runs inside a finalizer: only schedules the work, and not even that
-- while the host is exiting (OpenResty runs the finalizers of leases its
-- aborted requests left from lua_close at worker exit, where waking a
-- semaphore or starting a timer touches requests that are gone).
local function kick(self)
  self._kicked = true
  local exiting = self._sched.exiting
  if exiting and exiting() then return end
  start_timer(self)
end

-- wake() returned true, but the adapter learned later that the waiter died
-- before it ran (OpenResty: killed or aborted between the post and its
-- resumption): the adapter calls this, and the grant goes back.
local function give_back(self, w, g)
  if self._waiters[w] == nil or self._wgen[w] ~= g then return end
  self._waiters[w] = nil
  self._nwaiters = self._nwaiters - 1
  self._wgen[w] = nil
  self._e:abandon(w, g, now_of(self))
  pump(self)
end

-- Whether a waiter's handle can still run: the adapter's alive(h) if it has
-- one, else a coroutine handle that is not dead.
local function handle_alive(h)
  return type(h) ~= "thread" or co_status(h) ~= "dead"
end

-- Ends the queued waiters whose coroutine died without a wake to tell (a
-- coroutine closed, an nginx light thread killed, a request aborted): they
-- leave the queue as cancelled and free their max_waiting slots. Called
-- where a count of waiters matters (a full queue, stats()). O(waiters).
local function reap_dead_waiters(self)
  local alive = self._sched.alive or handle_alive
  local e, n = self._e, 0
  for w, h in pairs(self._waiters) do
    if not alive(h) then
      local g = self._wgen[w]
      self._waiters[w] = nil
      self._nwaiters = self._nwaiters - 1
      self._wgen[w] = nil
      e:abandon(w, g, now_of(self))
      n = n + 1
    end
  end
  if n > 0 then pump(self) end
  return n
end

-- Before an acquisition that the engine could refuse as full: with the
-- queue at max_waiting, dead waiters are reaped first. A queue full of live
-- waiters costs each refusal a scan of it (one liveness check per waiter):
-- the price of never refusing on behalf of the dead.
local function reap_if_full(self)
  if self._nwaiters >= self._c.max_waiting then reap_dead_waiters(self) end
end

-- drain() waits until no lease is held: whatever ended the last one (a
-- release, a failed create, a collected lease, a checkin) calls this where
-- a drain may wait (self._drain_hs).
local function wake_drainers(self)
  if self._e:stats(-1, self._scratch).leases == 0 then
    for h in pairs(self._drain_hs) do self._sched.wake(h) end
  end
end
M.wake_drainers = wake_drainers

-- The built-in handlers: the engine's own bookkeeping of waiters, timers
-- and destroyed records.
ON[EV_WAKE] = function(self, e, a, b)
  local h = self._waiters[a]
  if h ~= nil and self._wgen[a] == b then
    if not self._sched.wake(h, give_back, self, a, b) then
      -- the waiting coroutine is gone: give its grant back
      self._waiters[a] = nil
      self._nwaiters = self._nwaiters - 1
      e:abandon(a, b, now_of(self))
    end
  end
end

ON[EV_DESTROY] = function(self, _, a, b, c)
  local client = self._clients[a]
  self._clients[a] = nil
  self._parked[a] = nil
  if self._rec_leases then self._rec_leases[a] = nil; self._lost[a] = nil end
  local reason = BY_NAME[b]
  local name = self._knames[c]
  run_destroy(self, a, client, name, reason)
end

ON[EV_TIMER] = function(self, _, _, _, _, tt)
  arm(self, tt)
end

-- Carries out the engine's queued events, one at a time and in order, so a
-- hook that re-enters the pool sees them in order too. A tail call per
-- event, not a loop: under LuaJIT a loop here aborts every trace recorded
-- through it (create, wait, destroy paths), and the aborts blacklist the
-- functions they start in, checkout and acquire included, hot path and all.
pump = function(self)
  local e = self._e
  local t, a, b, c, tt = e:next_event()
  if not t then
    if self._drain_hs then wake_drainers(self) end
    return
  end
  local h = ON[t]
  if h then h(self, e, a, b, c, tt) end
  return pump(self)
end
M.pump = pump

M.kick, M.arm, M.start_timer = kick, arm, start_timer
M.reap_dead_waiters, M.reap_if_full = reap_dead_waiters, reap_if_full

return M
