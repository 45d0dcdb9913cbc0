-- The helpers of the acquire suites (acquire_spec.lua,
-- acquire_lifecycle_spec.lua): each scenario runs as a task on each
-- scheduler of H.schedulers { hosts = true }, its times written for a
-- virtual clock and scaled with T(); on real clocks a time is a lower bound
-- (H.time).
local clientpool = require "clientpool"
local H = require "spec.helpers"

local A = {}

-- An adapter that is sched with some fields replaced (say `log`, or a
-- `background` that never runs so the pool has no timer).
local function wrap(sched, fields)
  return setmetatable(fields, { __index = sched })
end

A.wrap = wrap

-- The helpers bound to scheduler entry S (one table per describe):
--   T(x)                     spec seconds to the entry's seconds
--   run(body)                runs body(sched) as a task on a fresh scheduler
--   near(expected, got, w)   the duration got is `expected` spec seconds
--   at(expected, t, w)       the clock value t is `expected` spec seconds into the scenario
--   mkpool(sched, o, fo)     a pool over simulated clients (max_live 4)
--   settle(sched)            lets the tasks spawned so far run
--   record_events(pool, s)   listeners recording every event
--   base()                   the clock when the running scenario began
local function bind(S)
  -- Spec seconds to the entry's seconds.
  local function T(x) return x * S.scale end

  local base = 0 -- the clock when the running scenario began

  -- Runs body(sched) as a task on a fresh scheduler, to completion.
  local function run(body)
    local sched = S.new()
    S.run(sched, function(...) base = sched.now(); return body(...) end, sched)
    return sched
  end

  -- The duration got (the entry's seconds) is `expected` spec seconds.
  local function near(expected, got, what) H.time(S, expected, got, what) end
  -- The clock value t is `expected` spec seconds into the scenario.
  local function at(expected, t, what) H.time(S, expected, t - base, what) end

  -- A pool over simulated clients: max_live 4 unless o says otherwise.
  -- fo: factory options (latency).
  local function mkpool(sched, o, fo)
    local f = H.factory(sched, fo)
    -- the create backoff's defaults, in this entry's seconds
    local opts = { create = f.create, destroy = f.destroy, max_live = 4, scheduler = sched,
                   create_backoff = T(0.05), create_backoff_max = T(2) }
    for k, v in pairs(o or {}) do opts[k] = v end
    return clientpool.new(opts), f
  end

  -- Lets tasks spawned so far (destroy hooks) run.
  local function settle(sched)
    sched.sleep(0)
    sched.sleep(0)
  end

  -- Listeners recording every event: rec.list in order, rec.of(name).
  local function record_events(pool, sched)
    local rec = { list = {} }
    for _, name in ipairs { "create", "acquire", "release", "destroy", "timeout", "leak" } do
      pool:on(name, function(...)
        rec.list[#rec.list + 1] = { name = name, n = select("#", ...), at = sched.now(), ... }
      end)
    end
    function rec.of(name)
      local r = {}
      for _, e in ipairs(rec.list) do
        if e.name == name then r[#r + 1] = e end
      end
      return r
    end
    return rec
  end

  return { T = T, run = run, near = near, at = at, mkpool = mkpool, settle = settle,
           record_events = record_events, base = function() return base end }
end

-- fn(S, P) inside a describe "clientpool acquire/release on <name>" for each
-- scheduler entry S, P its bound helpers (bind), after a pending describe for
-- each scheduler that cannot run here. B holds the spec file's describe,
-- pending and after_each (busted, and nginx's semantic suite, give them to
-- the file, not to the modules it requires).
function A.each_scheduler(B, fn)
  for _, M in ipairs(H.missing_schedulers()) do
    B.describe("clientpool acquire/release on " .. M.name, function()
      B.pending("not run: " .. M.reason)
    end)
  end
  for _, S in ipairs(H.schedulers { hosts = true }) do
    B.describe("clientpool acquire/release on " .. S.name, function()
      B.after_each(function() if S.finish then S.finish() end end)
      fn(S, bind(S))
    end)
  end
end

return A
