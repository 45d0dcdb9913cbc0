-- B2: contended handoff. TASKS coroutines on the built-in loop share one
-- client (max_live = 1); each takes it, gives it back and queues again, so
-- every release hands the client to the next waiter and every pair costs
-- one coroutine switch. Per handoff, against a raw coroutine resume/yield
-- round trip. For reference, the loop's own handoff (a task waking the next
-- one through loop.wait/loop.wake, no pool) shows the scheduler's share.
local clientpool = require "clientpool"
local Loop = require "clientpool.loop"

local TASKS = 100

return function(U)
  local co_resume, co_yield = coroutine.resume, coroutine.yield

  local co = coroutine.create(function() while true do co_yield() end end)
  local function round_trips(n)
    for _ = 1, n do co_resume(co) end
  end

  -- n handoffs between TASKS tasks through the pool, lease or checkout form
  local function pool_handoffs(form)
    return function(n)
      local loop = Loop.new()
      local pool = clientpool.new { max_live = 1, max_waiting = TASKS, create = function() return {} end,
                                    scheduler = loop }
      local per = math.ceil(n / TASKS)
      -- the first holder yields once while holding, so every other task
      -- queues: from then on each release is a handoff
      local first = true
      for _ = 1, TASKS do
        if form == "lease" then
          loop.spawn(function()
            for _ = 1, per do
              local lease = pool:acquire()
              if first then first = false; loop.sleep(0) end
              lease:release()
            end
          end)
        else
          loop.spawn(function()
            for _ = 1, per do
              local _, h = pool:checkout()
              if first then first = false; loop.sleep(0) end
              pool:checkin(h)
            end
          end)
        end
      end
      loop.run()
      local s = pool:stats()
      assert(s.wait_count >= per * TASKS - TASKS, "not a handoff per pair: " .. s.wait_count)
      pool:close()
    end
  end

  -- n handoffs around a ring of TASKS tasks: each waits, then wakes the next
  local function loop_handoffs(n)
    local loop = Loop.new()
    local handles = {}
    local per = math.ceil(n / TASKS)
    for i = 1, TASKS do
      loop.spawn(function()
        handles[i] = loop.current()
        for _ = 1, per do
          loop.wait(handles[i])
          loop.wake(handles[i % TASKS + 1])
        end
      end)
    end
    loop.spawn(function() loop.wake(handles[1]) end)
    loop.run()
  end

  local start = TASKS * 100   -- handoffs per sample at least: the setup (a loop, TASKS tasks) is noise
  local r, _, b = U.ratio(pool_handoffs("lease"), round_trips, start)
  U.row("B2.lease", "handoff, acquire/release, " .. TASKS .. " tasks / resume+yield", r, "x")
  r = U.ratio(pool_handoffs("checkout"), round_trips, start)
  U.row("B2.checkout", "handoff, checkout/checkin, " .. TASKS .. " tasks / resume+yield", r, "x")
  r = U.ratio(loop_handoffs, round_trips, start)
  U.row("B2.loop", "(reference) loop.wait/wake handoff, no pool / resume+yield", r, "x")
  U.row("B2.base", "(baseline: coroutine resume+yield round trip, ns)", b, "ns")
end
