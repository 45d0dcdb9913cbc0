-- bench/b2_count.lua: what one B2 handoff costs, counted rather than timed
-- (docs/performance.md "The handoff, counted"). B2's setup: TASKS tasks on
-- the built-in loop (real clock) share one client; every release hands it
-- to the longest waiter.
--
-- usage: LUA bench/b2_count.lua [lease|checkout|ring] [N]
--   prints the CPU time per handoff and the Lua VM instructions per handoff
--   (a count hook on every task: a second run, slower); ring is the loop's
--   own wait/wake handoff without a pool. For clock reads per handoff, run
--   it under bench/c/count_clock.c's LD_PRELOAD wrapper with HANDOFFS=2N (the
--   handoffs run twice: timed, then counted).
local clientpool = require "clientpool"
local Loop = require "clientpool.loop"

local form, N = arg[1] or "lease", tonumber(arg[2]) or 20000
local TASKS = 100
local STEP = 10   -- the count hook's period, in instructions

local function pool_run(hook)
  local loop = Loop.new()
  local pool = clientpool.new { max_live = 1, max_waiting = TASKS, create = function() return {} end,
                                scheduler = loop }
  local per, first = math.ceil(N / TASKS), true
  for _ = 1, TASKS do
    loop.spawn(function()
      if hook then debug.sethook(hook, "", STEP) end
      for _ = 1, per do
        if form == "lease" then
          local lease = pool:acquire()
          if first then first = false; loop.sleep(0) end
          lease:release()
        else
          local _, h = pool:checkout()
          if first then first = false; loop.sleep(0) end
          pool:checkin(h)
        end
      end
    end)
  end
  loop.run()
  return pool:stats().wait_count
end

local function ring_run(hook)
  local loop = Loop.new()
  local handles, per = {}, math.ceil(N / TASKS)
  for i = 1, TASKS do
    loop.spawn(function()
      if hook then debug.sethook(hook, "", STEP) end
      handles[i] = loop.current()
      for _ = 1, per do
        loop.wait(handles[i])
        loop.wake(handles[i % TASKS + 1])
      end
    end)
  end
  loop.spawn(function() loop.wake(handles[1]) end)
  loop.run()
  return per * TASKS
end

local run = form == "ring" and ring_run or pool_run
local t = os.clock()
local n = run()
t = os.clock() - t
local count = 0
local function hook() count = count + 1 end
debug.sethook(hook, "", STEP)     -- the main thread: the loop's turns
run(hook)
debug.sethook()
print(string.format("%s: %d handoffs, %.0f ns CPU per handoff, %.0f Lua VM instructions per handoff",
                    form, n, t / n * 1e9, count * STEP / n))
