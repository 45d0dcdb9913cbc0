--- clientpool.loop: a small coroutine scheduler for plain Lua.
--
-- The default scheduler of clientpool outside any host (OpenResty, cqueues,
-- luv, copas). `require "clientpool.loop"` is a ready instance on the real
-- monotonic clock; `loop.new{ clock = "virtual" }` makes an independent one
-- whose clock jumps to the next timer when nothing is ready, so timeout tests
-- finish at once and always in the same order.
--
-- Every function is a plain closure over its instance (`loop.spawn(f)`, not
-- `loop:spawn(f)`), so an instance doubles as a scheduler adapter table
-- (docs/design.md, "The scheduler adapter contract").
--
-- This file is the clock (real, virtual or a function) and run(); the run
-- queue, timer heap, wait/wake and the rest are the scheduler core's
-- (clientpool.sched.core, shared with the hosted form that luv and copas
-- pump), with the loop's yield protocol.

local sched_core = require "clientpool.sched.core"

local error, pcall, require, tostring, type = error, pcall, require, tostring, type
local huge = math.huge

-- Busy-wait: only when neither clientpool.core.sleep nor luasocket exist.
-- It burns a CPU until the deadline, but keeps timers exact; os.execute
-- ("sleep") cannot sleep below a second portably and forks a process.
local function busy_wait(s, now)
  local t = now() + s
  repeat until now() >= t
end

local new

new = function(opts)
  if opts ~= nil and type(opts) ~= "table" then
    error("clientpool.loop: new expects an options table or nil", 2)
  end
  opts = opts or {}
  local clock = opts.clock
  if clock == nil then clock = "real" end
  if clock ~= "real" and clock ~= "virtual" and type(clock) ~= "function" then
    error("clientpool.loop: option clock must be \"real\", \"virtual\" or a function", 2)
  end
  local start = opts.start
  if start ~= nil then
    if clock ~= "virtual" then
      error("clientpool.loop: option start needs clock = \"virtual\"", 2)
    end
    if type(start) ~= "number" or start ~= start or start == huge or start == -huge then
      error("clientpool.loop: option start must be a finite number", 2)
    end
  end

  local virtual = clock == "virtual"

  ---------------------------------------------------------------- clock
  local vnow = start or 0
  local monotime, napfn

  local now
  if virtual then
    now = function() return vnow end
  elseif clock == "real" then
    -- Looked up at first use: requiring this module must work before the C
    -- module is built, and a virtual instance never loads it.
    now = function()
      if not monotime then
        local ok, core = pcall(require, "clientpool.core")
        if not ok or type(core) ~= "table" or type(core.monotime) ~= "function" then
          error("clientpool.loop: the real clock needs clientpool.core.monotime ("
                .. tostring(ok and "missing" or core) .. ")", 2)
        end
        monotime = core.monotime
      end
      return monotime()
    end
  else
    now = clock
  end

  -- Block the process for s seconds (real clocks only, s > 0).
  local function nap(s)
    if not napfn then
      local ok, core = pcall(require, "clientpool.core")
      if ok and type(core) == "table" and type(core.sleep) == "function" then
        napfn = core.sleep -- nanosleep
      else
        local sok, socket = pcall(require, "socket")
        if sok and type(socket) == "table" and type(socket.sleep) == "function" then
          napfn = socket.sleep
        else
          napfn = function(d) return busy_wait(d, now) end
        end
      end
    end
    napfn(s)
  end

  ---------------------------------------------------------------- run
  -- the instance is the core's adapter table, with run() and log
  local L, I = sched_core.new { now = now, name = "clientpool.loop" }
  local running = false       -- inside run()

  -- Nothing is ready: go to the next timer's time t.
  local function advance(t)
    if virtual then
      if t > vnow then vnow = t end
    else
      local d = t - now()
      if d > 0 then nap(d) end
    end
  end

  --- Run tasks until no task and no timer is left (background ones aside).
  -- Re-raises a task's error with the task's traceback; the other tasks stay
  -- scheduled. Not re-entrant. Raises if tasks wait forever with no timer.
  function L.run()
    if running then
      error("clientpool.loop: run() is already running (it is not re-entrant)", 2)
    end
    running = true
    local ok, err = pcall(I.drive, advance)
    running = false
    if not ok then error(err, 0) end
    if err ~= nil then error(err, 0) end
  end

  --- Report a message (listener and destroy-hook errors) on stderr.
  L.log = sched_core.log

  --- now() is clientpool.core.monotime (real clock instances only).
  L.monotonic = clock == "real"
  L.new = new
  return L
end

return new()
