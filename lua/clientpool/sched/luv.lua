--- Scheduler adapter "luv": waiting inside a libuv event loop (luv).
--
-- libuv runs callbacks, not coroutines, so the adapter keeps its own ready
-- queue and timer heap (clientpool.sched.hosted: clientpool.loop's core) and
-- drives them from one uv timer on the default loop: armed at 0 ms while
-- something is ready, else at the next deadline. The timer is referenced
-- only while foreground work is ready or has a deadline, so uv.run() returns
-- when the program's own tasks are done (the pool's timer task is a
-- background task and does not hold the loop).
--
--   local uv = require "luv"
--   local sched = require "clientpool.sched.luv"
--   local pool = clientpool.new { create = ..., max_live = 8, scheduler = "luv" }
--   sched.spawn(function() local lease = assert(pool:acquire()) ... end)
--   uv.run()            -- or sched.run(): until the adapter's tasks are done,
--                       -- re-raising a task's error
--
-- Contract details (docs/decisions.md, "Hosts"):
-- * handle = the running coroutine. A coroutine waits in any coroutine, a
--   task of the adapter or not: wait yields, and the adapter resumes the
--   coroutine itself when it is woken or its deadline passes. A task that
--   yields anything else (the usual luv pattern: start a request whose
--   callback resumes coroutine.running()) is left alone until it waits here
--   again.
-- * On PUC Lua 5.1 the driver runs hooks in a pass-through coroutine; the
--   adapter learns the outer coroutine from the relayed yield (the hosted yield
--   protocol) and resumes that one, which passes the resume down.
-- * await(start) runs a luv request and waits for its callback through the
--   adapter: the way to use luv's callback APIs inside hooks.
-- * Errors never reach libuv (luv exits the process on a callback error): a
--   task's error is re-raised by sched.run(), or written to stderr (with its
--   traceback) when the loop was started by someone else.

local uv = require "luv"
local hosted = require "clientpool.sched.hosted"
local core = require "clientpool.core"

local error, pcall, select, tostring = error, pcall, select, tostring
local unpack = table.unpack or unpack
local math_ceil = math.ceil
local monotime = core.monotime

local NAME = "clientpool.sched.luv"

local new

new = function()
  local A = { name = "luv", monotonic = true }
  local timer          -- the one uv timer, made at first use
  local closed = false -- close() was called: nothing runs any more
  local in_run = false -- inside A.run()
  local failure        -- { err } of a task, while in run()
  local q
  local on_timer

  -- (Re)arms the timer for what q needs next; references it only while
  -- foreground work is ready or has a deadline.
  local function arm()
    if closed then return end
    if not timer then timer = uv.new_timer() end
    if q.ready() > 0 then
      timer:start(0, 0, on_timer)
    else
      local d = q.deadline()
      if d then
        uv.update_time()
        local ms = (d - monotime()) * 1000
        if ms <= 0 then ms = 0 else ms = math_ceil(ms) end
        timer:start(ms, 0, on_timer)
      else
        timer:stop()
      end
    end
    if q.fgwork() then timer:ref() else timer:unref() end
  end

  local function report(err)
    if in_run then
      if not failure then failure = { err } end
      uv.stop()
    else
      pcall(A.log, NAME .. ": task failed: " .. tostring(err))
    end
  end

  on_timer = function()
    local ok, err = pcall(q.turn)
    if not ok then
      report(err)
    elseif err ~= nil then
      report(err)
    end
    -- run() stops at a task's error: no more turns until it re-raised it
    -- (a 0 ms timer re-armed here would run in this same loop iteration)
    if failure then return end
    local aok, aerr = pcall(arm)
    if not aok then report(aerr) end
  end

  q = hosted.new { now = monotime, name = NAME, changed = function() arm() end }
  A.now = monotime
  hosted.adapt(A, q)   -- current, wait, wake, spawn, background, sleep, stats, log

  --- Runs the uv default loop until no foreground task, timer or ready
  -- coroutine of this adapter is left. Other handles (a server, say) are
  -- served meanwhile but do not keep run() going. Re-raises a task's error
  -- (with its traceback) after stopping the loop; the other tasks stay
  -- scheduled and the next run() goes on with them. Raises if tasks are left
  -- that wait and nothing can wake them. Not re-entrant.
  function A.run()
    if in_run then error(NAME .. ": run() is already running (it is not re-entrant)", 2) end
    if not q.busy() then return end
    in_run = true
    failure = nil
    arm()
    -- after every loop iteration: stop once this adapter's work is done
    local check = uv.new_check()
    check:start(function()
      if not q.busy() then uv.stop() end
    end)
    check:unref()
    local ok, err = pcall(uv.run, "default")
    check:close()
    -- one more turn runs the close: a handle still closing when the Lua
    -- state closes makes luv's loop finalizer crash (SIGSEGV at exit)
    pcall(uv.run, "nowait")
    in_run = false
    local f = failure
    failure = nil
    if not ok then error(err, 0) end
    if f then
      arm()
      error(f[1], 0)
    end
    if not q.moving() and q.busy() then
      local n = q.stats().tasks
      error(("%s: deadlock: %d task(s) wait with no deadline and nothing left to wake them"):format(NAME, n), 2)
    end
  end

  --- Starts a luv request and waits for its callback: start(cb) is called
  -- with a callback to pass to luv (`uv.fs_stat(path, cb)`, `tcp:connect(
  -- host, port, cb)`, ...); await returns the arguments the callback got.
  -- It waits through this adapter (wait/wake), so it works in hooks on PUC
  -- Lua 5.1 too, where resuming coroutine.running() from a callback would
  -- bypass the driver's pass-through coroutine.
  function A.await(start)
    local h, why = q.current()
    if not h then error(NAME .. ": await: " .. tostring(why), 2) end
    local r
    start(function(...)
      if not r then
        r = { n = select("#", ...), ... }
        q.wake(h)
      end
    end)
    while not r do q.wait(h) end
    return unpack(r, 1, r.n)
  end

  --- Retires the instance: closes its uv timer, and nothing it holds runs
  -- any more (a pool still using it would wait forever). For programs that
  -- make instances with new() and drop them while the uv loop goes on.
  function A.close()
    closed = true
    if timer and not timer:is_closing() then timer:close() end
    timer = nil
  end

  A.new = new
  return A
end

return new()
