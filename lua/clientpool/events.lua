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
local co_status, rawget, pcall = coroutine.status, rawget, pcall
local ycall, log, emit, hook_key, now_of, clock = base.ycall, base.log, base.emit, base.hook_key, base.now_of,
                                                  base.clock
local BY_NAME = base.BY_NAME
local EV_WAKE, EV_DESTROY, EV_TIMER = core.EV_WAKE, core.EV_DESTROY, core.EV_TIMER

local M = {}
local ON = {}        -- event code -> handler(self, e, a, b, c, tt)
M.on = ON

local pump

---------------------------------------------------------------------------
-- The destroy runner (DESIGN section 3 "Release", issue 12). A destroy hook
-- starts at once, in the caller's context, and goes to the scheduler only
-- if it yields; the record counts against max_live until the hook returned
-- or failed, which the engine learns by destroyed(). EV_DESTROY only queues
-- the destroy (_dq): the pump runs the queued hooks once the engine's events
-- are carried out, so a hook sees a consistent pool and may re-enter it.
-- Each hook runs in a coroutine of its own, so a hook that yields never
-- makes release (or a listener, or the timer's turn) yield: it goes on as a
-- task that passes its yields through to the scheduler (adopt_destroy).
---------------------------------------------------------------------------

local co_create, co_resume, co_yield, co_running = coroutine.create, coroutine.resume, coroutine.yield,
                                                   coroutine.running
local pack, unpack = base.pack, base.unpack
-- PUC Lua 5.1's pcall cannot yield: there the hook is called bare in its
-- coroutine (the coroutine's resume is the protected call), not through a
-- pass-through coroutine nested in it, whose turn a scheduler could take
-- directly (a hook whose first yield is sleep(0)), leaving the outer one
-- suspended for good
local IS_51 = _VERSION == "Lua 5.1" and rawget(_G, "jit") == nil

-- The host context the running code belongs to (the adapter's optional
-- context(): OpenResty's request or timer), or nil.
local function context_of(self)
  local ctx = self._sched.context
  return ctx and ctx()
end

-- The hook has returned or failed: its record's room is free.
local function destroy_done(self, rec, ok, err)
  if not ok then log(self, "destroy hook failed: " .. tostring(err)) end
  local _, pending = self._e:destroyed(rec, now_of(self))
  return pending
end

-- The body of a destroy's coroutine. Run to its end by the destroyer's
-- first resume (_dsync[co]: it never yielded to it), the destroyer reports
-- it; else whoever resumed it last (the adopting task, or the scheduler
-- itself) is past that point, and the body reports it here. Per coroutine,
-- not one field: in OpenResty a hook's cosocket I/O suspends its destroyer
-- without a yield to it, and other requests run destroys of their own
-- meanwhile (one at a time, a destroy of one request's connection queued
-- behind another request's round trip ran after its own request had ended
-- and nginx had closed that connection behind the pool's back).
local function destroy_body(self, destroy, client, key, rec)
  local ok, err = true, nil
  if IS_51 then destroy(client, key) else ok, err = pcall(destroy, client, key) end
  if self._dsync[co_running()] then return ok, err end
  if destroy_done(self, rec, ok, err) > 0 then pump(self) end
end

-- A destroy whose hook yielded, as a task: its yields are passed through
-- to the scheduler and the scheduler's answers back down (as for
-- try_acquire's adopted grants). No closure: LuaJIT aborts a trace at
-- closure creation.
local function adopt_destroy(self, co, rec, ...)
  local r = pack(...)
  while co_status(co) == "suspended" do
    r = pack(co_resume(co, co_yield(unpack(r, 1, r.n))))
    if not r[1] then        -- (Lua 5.1: the hook raised)
      if destroy_done(self, rec, false, r[2]) > 0 then pump(self) end
      return
    end
    r = pack(unpack(r, 2, r.n))
  end
end

-- Where the host cannot yield at all (the adapter's yieldable() is false:
-- OpenResty's log, filter and set phases, which refuse its coroutine API
-- and cosockets too), a hook that closes a connection could not run here:
-- it goes to the scheduler whole, as a task (OpenResty: a timer).
local function destroy_task(self, destroy, client, key, rec)
  local ok, err = ycall(destroy, client, key)
  if destroy_done(self, rec, ok, err) > 0 then pump(self) end
end

-- After the first resume of a destroy's coroutine: dead, the hook returned
-- (or raised); suspended, it yielded (the yield's values follow ok) and the
-- rest runs as a task, which passes that yield on.
local function resumed(self, co, rec, ok, a, ...)
  self._dsync[co] = nil
  if co_status(co) == "dead" then
    if not ok then return destroy_done(self, rec, false, a) end   -- (5.1: the hook raised)
    if IS_51 then return destroy_done(self, rec, true) end
    return destroy_done(self, rec, a, (...))                      -- (a, ...: pcall's results)
  end
  self._sched.spawn(adopt_destroy, self, co, rec, a, ...)
  return 0
end

-- Starts the destroy hook of record rec; returns the engine's pending
-- events (the caller pumps them).
local function run_destroy(self, destroy, rec, client, name)
  local key = hook_key(name)
  local yieldable = self._sched.yieldable
  if yieldable and not yieldable() then
    self._sched.spawn(destroy_task, self, destroy, client, key, rec)
    return 0
  end
  local co = co_create(destroy_body)
  self._dsync[co] = context_of(self) or true
  return resumed(self, co, rec, co_resume(co, self, destroy, client, key, rec))
end

-- Runs the queued destroys, one at a time and in order, each hook after
-- the events its predecessor's report queued (a tail call per destroy: no
-- loop, see pump).
local function run_queued(self)
  local q, h = self._dq, self._dqh
  local rec, client, name, reason = q[h], q[h + 1], q[h + 2], q[h + 3]
  q[h], q[h + 1], q[h + 2], q[h + 3] = nil, nil, nil, nil
  h = h + 4
  if h > self._dqt then h, self._dqt = 1, 0 end
  self._dqh = h
  emit(self, "destroy", hook_key(name), client, reason)
  run_destroy(self, self._destroy, rec, client, name)
  return pump(self)      -- the events of its report, then the next destroy
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
    base.background(self, timer_main, self)
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
-- and destroyed records. A handler returns true when it called the engine
-- not at all (so queued nothing): see pump.
ON[EV_WAKE] = function(self, e, a, b)
  -- b: the waiter's generation, a uint32 the event carries as an int32
  -- (negative past 2^31 waits on the slot); E:wait gave it unsigned
  b = b % 4294967296
  local h = self._waiters[a]
  if h ~= nil and self._wgen[a] == b then
    if self._sched.wake(h, give_back, self, a, b) then return true end
    -- the waiting coroutine is gone: give its grant back
    self._waiters[a] = nil
    self._nwaiters = self._nwaiters - 1
    e:abandon(a, b, now_of(self))
    return
  end
  return true
end

ON[EV_DESTROY] = function(self, _, a, b, c)
  local client = self._clients[a]
  self._clients[a] = nil
  self._parked[a] = nil
  if self._rec_leases then self._rec_leases[a] = nil; self._lost[a] = nil end
  local reason = BY_NAME[b]
  local name = self._knames[c]
  if self._destroy then
    -- queued: the hook runs once the pump has carried out every event
    local q, t = self._dq, self._dqt
    q[t + 1], q[t + 2], q[t + 3], q[t + 4] = a, client, name, reason
    self._dqt = t + 4
  else
    self._e:destroyed(a, now_of(self))   -- (its events: this pump drains them)
    emit(self, "destroy", hook_key(name), client, reason)
  end
end

ON[EV_TIMER] = function(self, _, _, _, _, tt)
  arm(self, tt)
end

-- Whether this call runs inside a destroy hook's first resume: one of
-- those coroutines (_dsync) is running, or is "normal", having resumed the
-- coroutine that runs (a hook that calls into the pool, through coroutines
-- of the pool's own or the user's). In OpenResty a hook suspended by its
-- cosocket I/O still reads "running" to other requests, which are not
-- inside it: there _dsync holds the hook's request (sched.context()), and
-- only a hook of this request counts. (Called only when destroys are
-- queued: the loop stays off the hot path.)
local function in_destroy(self)
  local cur = context_of(self)
  for co, at in pairs(self._dsync) do
    local st = co_status(co)
    if (st == "running" or st == "normal") and (at == true or at == cur) then return true end
  end
  return false
end

-- Carries out the engine's queued events, one at a time and in order, so a
-- hook that re-enters the pool sees them in order too. A tail call per
-- event, not a loop: under LuaJIT a loop here aborts every trace recorded
-- through it (create, wait, destroy paths), and the aborts blacklist the
-- functions they start in, checkout and acquire included, hot path and all.
-- The last event taken (left == 0) by a handler that queued nothing (it
-- returned true: a handoff's wake) ends the pump without one more
-- next_event to learn the queue is empty (issue 17: a call per handoff).
local function pump_done(self)
  -- (not from inside a destroy hook that runs now: the run_queued that
  -- started it goes on once it returns, so hooks that call into the pool
  -- do not nest one coroutine per queued destroy)
  if self._dqt >= self._dqh and not in_destroy(self) then return run_queued(self) end
  if self._drain_hs then wake_drainers(self) end
end

pump = function(self)
  local e = self._e
  local t, a, b, c, tt, left = e:next_event()
  if not t then return pump_done(self) end
  local h = ON[t]
  if h then
    if h(self, e, a, b, c, tt) == true and left == 0 then return pump_done(self) end
  elseif left == 0 then
    return pump_done(self)
  end
  return pump(self)
end
M.pump = pump

M.kick, M.arm, M.start_timer = kick, arm, start_timer
M.reap_dead_waiters, M.reap_if_full = reap_dead_waiters, reap_if_full

return M
