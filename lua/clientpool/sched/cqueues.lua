--- Scheduler adapter "cqueues": waiting on a cqueues controller.
--
-- A waiting coroutine polls its own condition variable (cqueues.condition)
-- through cqueues' yield protocol, so the controller goes on running every
-- other thread and socket meanwhile. `require "clientpool.sched.cqueues"` is
-- the default instance: it spawns on the controller that is running, or
-- (outside any) on the last one it saw, or on its own (`controller()`).
-- `.new(cq)` makes an instance bound to the controller cq, which is what a
-- program normally wants:
--
--   local cq = cqueues.new()
--   local sched = require("clientpool.sched.cqueues").new(cq)
--   local pool = clientpool.new { create = ..., max_live = 8, scheduler = sched }
--   cq:wrap(function() local lease = assert(pool:acquire()) ... end)
--   assert(cq:loop())   -- or sched.run(): until this adapter's tasks are done
--
-- Contract details (docs/decisions.md, "Schedulers" and "Hosts"):
-- * handle = the running coroutine; current() returns nil and a reason
--   outside a coroutine, where it cannot yield, or outside any controller.
-- * wait(h, deadline) yields `cqueues._POLL, entry`, where entry is a
--   pollable object (pollfd = its condition, timeout = what is left until
--   the deadline, or 0 when a wake is pending), so a wake that arrives before
--   the controller has seen the poll (say a wait relayed by a pass-through
--   coroutine) is not lost. The yield goes through cqueues' protocol
--   directly, never through cqueues.poll's blocking fallback, so a wait in a
--   coroutine the controller does not run yet (try_acquire's) yields too.
-- * wake(h) sets the handle's semaphore and signals the condition if the
--   coroutine is polling it: the controller resumes it at its next step.
--   False for a dead coroutine.
-- * Tasks start in spawn order (cqueues itself starts new threads last in,
--   first out: each new thread runs the oldest spawned function not started).
-- * sleep(s) ends with two zero-timeout polls: it returns after every thread
--   that was ready by then had its turn (cqueues runs threads made ready in
--   the same step last in, first out; without this, of two timers due in one
--   step the later one could run first). sleep(0) is just that turn.
-- * There is no background task in cqueues' sense: a thread keeps cq:loop()
--   going until it ends. background(fn) is spawn that run() does not wait
--   for; the pool's timer thread ends once nothing is left to expire or the
--   pool is closed, so call pool:close() before expecting cq:loop() to end.

local cqueues = require "cqueues"
local condition = require "cqueues.condition"
local core = require "clientpool.core"
local sched_core = require "clientpool.sched.core"

local coroutine, debug = coroutine, debug
local error, pairs, pcall, select, setmetatable, tostring, type =
      error, pairs, pcall, select, setmetatable, tostring, type
local unpack = table.unpack or unpack

local co_running, co_status, co_yield = coroutine.running, coroutine.status, coroutine.yield
local co_close = coroutine.close
local cq_running = cqueues.running
local monotime = core.monotime
local huge = math.huge
local _POLL = cqueues._POLL

local NAME = "clientpool.sched.cqueues"

-- The pollable object a waiting coroutine yields: its condition, and the
-- time left (0 when a wake is already pending).
local Entry = {}
Entry.__index = Entry
function Entry:pollfd() return self.cond end
function Entry.events() return "r" end
function Entry:timeout()
  if self.woke then return 0 end
  return self.t
end

-- (the scheduler core's helpers: one definition of waking and its checks)
local running_co, cannot_wait = sched_core.running_co, sched_core.cannot_wait
local wait_start, check_sleep, lost_wake = sched_core.wait_start, sched_core.check_sleep, sched_core.lost_wake
local take_wake = sched_core.take_wake

local new

new = function(bound)
  if bound ~= nil and (type(bound) ~= "userdata" or type(bound.wrap) ~= "function") then
    error(NAME .. ": new expects a cqueues controller (cqueues.new()) or nil", 2)
  end
  local A = { name = "cqueues", monotonic = true, now = monotime }

  local entries = setmetatable({}, { __mode = "k" }) -- co -> Entry (never references co)
  local own = bound   -- the controller used outside any running controller
  local last          -- default instance: the last controller seen running
  local queues = setmetatable({}, { __mode = "k" })  -- cq -> FIFO of spawned functions
  local live = setmetatable({}, { __mode = "k" })    -- cq -> foreground tasks not finished
  local tasks = setmetatable({}, { __mode = "k" })   -- started foreground task -> cq

  local function entry_of(co)
    local e = entries[co]
    if not e then
      e = setmetatable({ woke = false, waiting = false, t = nil, cond = false }, Entry)
      entries[co] = e
    end
    return e
  end

  --- The controller this adapter spawns on outside a running controller
  -- (bound instance: its controller; default instance: the last one seen
  -- running, else one of its own, made at first use).
  function A.controller()
    if bound then return bound end
    if last then return last end
    if not own then own = cqueues.new() end
    return own
  end

  local function spawn_cq()
    if bound then return bound end
    local cq = cq_running()
    if cq then last = cq; return cq end
    return A.controller()
  end

  --- Monotonic seconds (the clock of cqueues' timers: CLOCK_MONOTONIC).
  -- A.now is clientpool.core.monotime; A.monotonic tells the driver so.

  --- A handle for the running coroutine (the coroutine), or nil and a
  -- reason where it cannot wait.
  function A.current()
    local co = running_co()
    local why = cannot_wait(co)
    if why then return nil, why end
    local cq = cq_running()
    if not cq then return nil, "not in a coroutine run by a cqueues controller" end
    if not bound then last = cq end
    return co
  end

  --- Suspends the running coroutine h until wake(h) or the absolute
  -- deadline (nil = none): true when woken (or resumed by someone else),
  -- nil, "timeout" at the deadline.
  function A.wait(h, deadline)
    local co, why = wait_start(NAME, h, deadline)
    if not co then return nil, why end
    local e = entry_of(co)
    if take_wake(e) then return true end
    local t
    if deadline and deadline < huge then
      t = deadline - monotime()
      if t <= 0 then return nil, "timeout" end
    end
    if not e.cond then e.cond = condition.new() end
    e.t = t
    e.waiting = true
    co_yield(_POLL, e)
    e.waiting = false
    if take_wake(e) then return true end
    if deadline and monotime() >= deadline then return nil, "timeout" end
    return true -- spurious: the driver looks again
  end

  --- Makes h's wait return at the controller's next step (never
  -- synchronously); remembered if h is not waiting. False if h is dead.
  function A.wake(h, lost, la, lb, lc)
    if type(h) ~= "thread" then error(NAME .. ": wake expects a coroutine handle", 2) end
    if co_status(h) == "dead" then
      lost_wake(entries[h])
      entries[h] = nil
      return false
    end
    local e = entry_of(h)
    if not e.woke then
      e.woke = true
      if e.waiting then e.cond:signal() end
    end
    -- the waker's give-back, should h die before this wake reaches it; a
    -- wake without one (a cancel token's) keeps the grant's
    if lost then e.lost, e.la, e.lb, e.lc = lost, la, lb, lc end
    return true
  end

  local function turn()
    co_yield(_POLL, 0)
    co_yield(_POLL, 0)
  end

  --- Suspends the running coroutine for s seconds (s >= 0); returns after
  -- every thread ready by then had its turn. A wake does not cut it short.
  function A.sleep(s)
    check_sleep(NAME, s)
    if s > 0 then
      local t_end = monotime() + s
      repeat
        co_yield(_POLL, t_end - monotime())
      until monotime() >= t_end
    end
    turn()
  end

  -- Each new cqueues thread runs the oldest spawned function not started.
  local function runner(q, cq)
    local i = q.first
    local item = q[i]
    q[i] = nil
    q.first = i + 1
    local co = co_running()
    if not item.bg then tasks[co] = cq end
    item.fn(unpack(item, 1, item.n))
    if not item.bg then
      tasks[co] = nil
      live[cq] = live[cq] - 1
    end
  end

  local function spawn_task(bg, fn, ...)
    if type(fn) ~= "function" then
      error(NAME .. ": " .. (bg and "background" or "spawn") .. " expects a function", 3)
    end
    local cq = spawn_cq()
    local q = queues[cq]
    if not q then
      q = { first = 1, last = 0 }
      queues[cq] = q
    end
    local n = q.last + 1
    q.last = n
    q[n] = { fn = fn, bg = bg, n = select("#", ...), ... }
    if not bg then live[cq] = (live[cq] or 0) + 1 end
    cq:wrap(runner, q, cq)
  end

  --- Starts fn(...) in a new thread of the controller (see the header);
  -- threads start in spawn order.
  function A.spawn(fn, ...)
    spawn_task(false, fn, ...)
  end

  --- Like spawn, but run() does not wait for it.
  function A.background(fn, ...)
    spawn_task(true, fn, ...)
  end

  -- Forgets foreground tasks killed from outside (dead without finishing).
  local function sweep(cq)
    for co, tcq in pairs(tasks) do
      if tcq == cq and co_status(co) == "dead" then
        tasks[co] = nil
        live[cq] = live[cq] - 1
      end
    end
  end

  local CAP = 0.05 -- longest single step: killed tasks are swept at least this often

  --- Steps this adapter's controller (see controller()) until every
  -- foreground task spawned on it has finished. Re-raises a thread's error
  -- with its traceback; the other threads stay scheduled. A thread killed
  -- from outside (coroutine.close, an error raised in it by someone else's
  -- resume) is not an error: cqueues reports it when it next tries to
  -- resume it, and run() passes over that.
  function A.run()
    if cq_running() then error(NAME .. ": run() inside a running controller", 2) end
    local cq = A.controller()
    local steps = 0
    while (live[cq] or 0) > 0 do
      local t0 = monotime()
      local ok, err, _, co = cq:step(CAP)
      steps = steps + 1
      if not ok then
        local killed = type(err) == "string" and
          (err:find("cannot resume dead coroutine", 1, true) or
           err:find("cannot resume non-suspended coroutine", 1, true))
        if type(co) == "thread" and tasks[co] then
          tasks[co] = nil
          live[cq] = live[cq] - 1
        end
        if killed and type(co) == "thread" then lost_wake(entries[co]) end
        if not killed then
          if type(co) == "thread" then
            if type(err) == "string" or type(err) == "number" then err = debug.traceback(co, tostring(err)) end
            if co_close then pcall(co_close, co) end
          end
          error(err, 0)
        end
      end
      if steps % 16 == 0 or monotime() - t0 >= CAP * 0.9 then sweep(cq) end
    end
  end

  --- Reports a message (listener and destroy-hook errors) on stderr.
  A.log = sched_core.log

  A.new = new
  return A
end

return new()
