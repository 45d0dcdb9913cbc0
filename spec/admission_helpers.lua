-- The helpers of the policy suites (admission_spec.lua,
-- admission_resume_spec.lua): every scenario runs as a task on each
-- scheduler of H.schedulers(), on a virtual clock: time only moves when
-- tasks sleep, so resume_after deadlines and acquire timeouts are exact.
local H = require "spec.helpers"

local P = {}

local function near(expected, got, what)
  assert(type(got) == "number" and math.abs(got - expected) < 1e-6,
         (what or "value") .. ": expected " .. tostring(expected) .. ", got " .. tostring(got))
end

-- The policy most scenarios use: the outcome is the directive itself, so a
-- test reads `lease:observe { pause = "busy" }`.
local function echo(outcome)
  return outcome
end

-- A deep copy of plain tables, to show an outcome is left as it was.
local function copy(v)
  if type(v) ~= "table" then return v end
  local t = {}
  for k, x in pairs(v) do t[k] = copy(x) end
  return t
end

P.near, P.echo, P.copy = near, echo, copy

-- The helpers bound to scheduler entry S:
--   run(body)                           runs body(sched) as a task on a fresh scheduler
--   mkpool(sched, o, fo)                a pool over simulated clients (max_live 4, echo policy)
--   (run, mkpool, settle, waiter: H.kit of spec/helpers.lua)
--   settle(sched)                       lets the tasks spawned so far run
--   waiter(sched, pool, key, opts, f)   a task that acquires key and records the outcome
--   record_gate_events(pool, sched)     listeners recording pause and resume events
local function bind(S)
  local run, mkpool, settle, waiter = H.kit(S, { max_live = 4, policy = echo })

  -- Listeners recording pause and resume events in order.
  local function record_gate_events(pool, sched)
    local rec = {}
    for _, name in ipairs { "pause", "resume" } do
      pool:on(name, function(...)
        rec[#rec + 1] = { name = name, n = select("#", ...), at = sched.now(), ... }
      end)
    end
    return rec
  end

  return { run = run, mkpool = mkpool, settle = settle, waiter = waiter,
           record_gate_events = record_gate_events }
end

-- fn(S, B) inside a describe "clientpool policies on <name>" for each
-- scheduler entry S, B its bound helpers (bind). describe is the spec
-- file's (busted gives it to the file, not to the modules it requires).
function P.each_scheduler(describe, fn)
  for _, S in ipairs(H.schedulers()) do
    describe("clientpool policies on " .. S.name, function()
      fn(S, bind(S))
    end)
  end
end

return P
