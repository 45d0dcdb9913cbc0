-- The helpers of the fault suites (faults_spec.lua, faults_idle_spec.lua):
-- a client factory whose hooks fail on demand, and per scheduler a run()
-- that tracks every task a scenario spawns, so that none is left hanging.
local clientpool = require "clientpool"
local H = require "spec.helpers"
-- (busted gives its assert to the spec files, not to the modules they require)
local assert = require "luassert"

local F = {}

-- PUC Lua 5.1: a create runs in its caller, past the deadline (docs/decisions.md "Deadlines")
local IS_51 = _VERSION == "Lua 5.1" and rawget(_G, "jit") == nil

local unpack = table.unpack or unpack -- luacheck: ignore 143

local contains = H.contains

-- Kills a coroutine suspended in the scheduler (a task whose hook hangs):
-- Lua 5.4 closes it; elsewhere a count hook raises in it as soon as it is
-- resumed from here (spec/wait_helpers.lua's kill).
local wait_kill = require("spec.wait_helpers").kill
local function kill(co) wait_kill(co, coroutine.close and "close" or "error") end

-- A client factory whose hooks fail on demand. Faults are queued per hook:
-- f.plan.create = { "nil", "throw", { hang = 5, after = "nil" }, ... } is
-- consumed one entry per call ("ok" once the queue is empty). destroy, park
-- and unpark count every call, the failing ones too.
local function factory(sched)
  local f = {
    plan = { create = {}, validate = {}, destroy = {}, park = {}, unpark = {} },
    created = 0, create_calls = 0, destroy_calls = 0, validate_calls = 0,
    park_calls = 0, unpark_calls = 0, open = {}, destroyed = {},
  }
  local function next_fault(hook)
    return table.remove(f.plan[hook], 1) or "ok"
  end
  -- a fault entry: "ok", "nil"/"false", "throw", "throw_table", or
  -- { hang = seconds, after = fault }
  local function apply(fault, what)
    if type(fault) == "table" then
      sched.sleep(fault.hang)
      fault = fault.after or "ok"
    end
    if fault == "throw" then error(what .. " exploded") end
    if fault == "throw_table" then error({ hook = what }) end
    return fault
  end
  function f.create(key)
    f.create_calls = f.create_calls + 1
    local fault = apply(next_fault("create"), "create")
    if fault == "nil" then return nil, "refused" end
    f.created = f.created + 1
    local c = { id = f.created, key = key, alive = true }
    f.open[c] = true
    return c
  end
  function f.destroy(c)
    f.destroy_calls = f.destroy_calls + 1
    -- the client is gone whatever the hook does next
    f.open[c] = nil
    f.destroyed[#f.destroyed + 1] = c
    if c then c.alive = false end
    apply(next_fault("destroy"), "destroy")
  end
  function f.validate(c)
    f.validate_calls = f.validate_calls + 1
    local fault = apply(next_fault("validate"), "validate")
    if fault == "false" then return false end
    return c.alive
  end
  function f.park(c)
    f.park_calls = f.park_calls + 1
    apply(next_fault("park"), "park")
    c.parked = true
    return c
  end
  function f.unpark(c)
    f.unpark_calls = f.unpark_calls + 1
    local fault = apply(next_fault("unpark"), "unpark")
    if fault == "nil" then return nil end
    c.parked = false
    return c
  end
  function f.nopen()
    local n = 0
    for _ in pairs(f.open) do n = n + 1 end
    return n
  end
  function f.clear()
    for _, q in pairs(f.plan) do
      for i = #q, 1, -1 do q[i] = nil end
    end
  end
  return f
end

F.IS_51, F.kill, F.factory = IS_51, kill, factory

-- The helpers bound to scheduler entry S:
--   run(body)                                 body(sched, ctx) as a task on a fresh scheduler, every task tracked
--   mkpool(sched, f, o)                       a pool over f's hooks (max_live 2)
--   settle(sched)                             lets the tasks spawned so far run
--   assert_recovered(sched, pool, f, n, key)  nothing lost and all of max_live n can be had again
--   assert_closed_clean(sched, pool, f)       close destroys every client ever created
local function bind(S)
  -- Runs body(sched, ctx) as a task on a fresh scheduler whose log is
  -- captured. ctx.go(fn) spawns a tracked task; the scenario ends only when
  -- every tracked task finished, and S.run raises if any waits forever.
  local function run(body)
    local sched = S.new()
    local logs = {}
    local wrapped = setmetatable({ log = function(m) logs[#logs + 1] = tostring(m) end }, { __index = sched })
    local ctx = { logs = logs, live = 0, started = 0 }
    function ctx.go(fn, ...)
      local args = { n = select("#", ...), ... }
      ctx.live = ctx.live + 1
      ctx.started = ctx.started + 1
      local task = {}
      sched.spawn(function()
        task.co = coroutine.running()
        fn(unpack(args, 1, args.n))
        task.done = true
        ctx.live = ctx.live - 1
      end)
      return task
    end
    function ctx.logged(part)
      for _, m in ipairs(logs) do if contains(m, part) then return true end end
      return false
    end
    S.run(sched, function()
      body(wrapped, ctx)
      -- no waiter left hanging: every tracked task ends (generous bound:
      -- the clock is virtual)
      for _ = 1, 1000 do
        if ctx.live == 0 then break end
        sched.sleep(1)
      end
      assert(ctx.live == 0, ctx.live .. " task(s) still hang after the scenario")
    end)
    assert.equal(0, sched.stats().tasks)
    return sched, ctx
  end

  local function mkpool(sched, f, o)
    local opts = { create = f.create, destroy = f.destroy, max_live = 2, scheduler = sched }
    for k, v in pairs(o or {}) do opts[k] = v end
    return clientpool.new(opts)
  end

  -- Lets tasks spawned so far (destroy hooks, background creates) run.
  local function settle(sched)
    for _ = 1, 3 do sched.sleep(0) end
  end

  -- The pool recovered: nothing leased, waiting or being created, counts
  -- consistent, and all of max_live at once can be had again (one more
  -- waits and times out: no capacity gained either). f's faults are cleared.
  local function assert_recovered(sched, pool, f, max_live, key)
    settle(sched)
    f.clear()
    local s = H.check(pool)
    assert.equal(0, s.leases)
    assert.equal(0, s.waiting)
    assert.equal(0, s.creating)
    assert.equal(s.live, s.idle)
    assert.equal(s.live, f.nopen())
    local held = {}
    for i = 1, max_live do
      local l, code, detail = pool:acquire(key, { timeout = 1 })
      assert(l, "capacity lost: acquisition " .. i .. " of " .. max_live .. " got " .. tostring(code)
                .. " " .. tostring(detail))
      assert.is_true(l.client.alive)
      held[i] = l
    end
    local t0 = sched.now()
    local l, code = pool:acquire(key, { timeout = 1 })
    assert.is_nil(l)
    assert.equal("timeout", code)
    assert.is_true(sched.now() - t0 >= 1)
    s = H.check(pool)
    assert.equal(max_live, s.leases)
    assert.equal(max_live, s.live)
    for i = 1, max_live do held[i]:release() end
    s = H.check(pool)
    assert.equal(0, s.leases)
    assert.equal(s.live, s.idle)
    return s
  end

  -- Closes the pool and checks that every client ever created was
  -- destroyed (the destroy hook ran for it).
  local function assert_closed_clean(sched, pool, f)
    pool:close()
    settle(sched)
    local s = H.check(pool)
    assert.equal(0, s.live)
    assert.equal(0, s.leases)
    assert.equal(0, f.nopen())
  end

  return { run = run, mkpool = mkpool, settle = settle, assert_recovered = assert_recovered,
           assert_closed_clean = assert_closed_clean }
end

-- fn(S, B) inside a describe "faults on <name>" for each scheduler entry S,
-- B its bound helpers (bind). describe is the spec file's (busted gives it
-- to the file, not to the modules it requires).
function F.each_scheduler(describe, fn)
  for _, S in ipairs(H.schedulers()) do
    describe("faults on " .. S.name, function()
      fn(S, bind(S))
    end)
  end
end

return F
