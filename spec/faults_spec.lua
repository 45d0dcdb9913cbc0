-- Faults (issue 6): hooks that fail, throw or hang, and clients that die
-- while idle. After each fault the pool must recover: its counts are
-- consistent (H.check), no capacity is lost (max_live acquisitions at once
-- succeed, and one more waits), no waiter is left hanging (every task this
-- spec spawns finishes, and the loop reports no deadlock), and every failure
-- reached its caller as an error code (asserted per scenario).
--
-- Runs over H.schedulers() (the loop on a virtual clock): hangs of many
-- seconds cost nothing there.

local clientpool = require "clientpool"
local H = require "spec.helpers"
-- PUC Lua 5.1: a create runs in its caller, past the deadline (docs/decisions.md "Deadlines")
local IS_51 = _VERSION == "Lua 5.1" and rawget(_G, "jit") == nil

local unpack = table.unpack or unpack -- luacheck: ignore 143

local function contains(s, part)
  return type(s) == "string" and s:find(part, 1, true) ~= nil
end

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

for _, S in ipairs(H.schedulers()) do
  describe("faults on " .. S.name, function()
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

    ---------------------------------------------------------------------------
    describe("create", function()
      it("returning nil: every caller gets nil, 'create', err; waiters get the forfeited slots", function()
        run(function(sched, ctx)
          local f = factory(sched)
          local pool = mkpool(sched, f, { max_live = 2 })
          f.plan.create = { { hang = 1, after = "nil" }, { hang = 1, after = "ok" }, { hang = 1, after = "nil" },
                            { hang = 1, after = "nil" }, { hang = 1, after = "ok" } }
          local res = {}
          for i = 1, 6 do
            ctx.go(function()
              local l, code, err = pool:acquire(nil, { timeout = 20 })
              res[i] = { l, code, err }
              if l then sched.sleep(0.5); l:release() end
            end)
          end
          sched.sleep(30)
          local ok, failed = 0, 0
          for i = 1, 6 do
            local r = assert(res[i], "caller " .. i .. " never returned")
            if r[1] then
              ok = ok + 1
            else
              failed = failed + 1
              assert.equal("create", r[2])
              assert.equal("refused", r[3])
            end
          end
          assert.equal(3, failed)
          assert.equal(3, ok)
          local s = H.check(pool)
          assert.equal(3, s.create_failed)
          assert_recovered(sched, pool, f, 2)
          assert_closed_clean(sched, pool, f)
        end)
      end)

      it("throwing (a string or any value, before or after yielding): nil, 'create', the error", function()
        run(function(sched, ctx)
          local f = factory(sched)
          local pool = mkpool(sched, f, { max_live = 1 })
          f.plan.create = { "throw", "throw_table", { hang = 2, after = "throw" } }
          local l, code, err = pool:acquire()
          assert.is_nil(l)
          assert.equal("create", code)
          assert.is_true(contains(err, "create exploded"), tostring(err))
          sched.sleep(0.05)      -- past the create backoff's window (one failure: <= 0.05 s)
          l, code, err = pool:acquire()
          assert.is_nil(l)
          assert.equal("create", code)
          assert.same({ hook = "create" }, err)
          sched.sleep(0.1)       -- two failures in a row: <= 0.1 s
          -- the third throws after a yield, with a waiter queued behind it
          local second
          ctx.go(function()
            local r = { pool:acquire(nil, { timeout = 10 }) }
            second = r
            if r[1] then r[1]:release() end
          end)
          l, code, err = pool:acquire()
          assert.is_nil(l)
          assert.equal("create", code)
          assert.is_true(contains(err, "create exploded"), tostring(err))
          sched.sleep(1)
          assert.is_table(second[1], tostring(second[2]))
          assert.equal(1, f.created)
          assert_recovered(sched, pool, f, 1)
          assert_closed_clean(sched, pool, f)
        end)
      end)

      it("hanging past the acquire timeout: the waiters behind it get 'timeout'; its client is kept", function()
        run(function(sched, ctx)
          local f = factory(sched)
          local pool = mkpool(sched, f, { max_live = 1, acquire_timeout = 1 })
          f.plan.create = { { hang = 5 } }
          local first, behind = {}, {}
          ctx.go(function()
            first = { pool:acquire() }
            first.at = sched.now()
          end)
          sched.sleep(0.5)
          for i = 1, 3 do
            ctx.go(function()
              local t0 = sched.now()
              behind[i] = { pool:acquire() }
              behind[i].waited = sched.now() - t0
            end)
          end
          sched.sleep(1.5)
          -- the acquire timeout bounds waiting in the queue: the waiters
          -- behind the hanging create fail with timeout, its detail shows why
          for i = 1, 3 do
            assert.is_nil(behind[i][1])
            assert.equal("timeout", behind[i][2])
            assert.equal(1, behind[i][3].creating)
            assert.equal(1, behind[i].waited)
          end
          local s = H.check(pool)
          assert.equal(1, s.creating)
          assert.equal(0, s.waiting)
          assert.equal(IS_51 and 3 or 4, s.timeouts)
          -- the deadline bounds the caller's own create too (DESIGN
          -- "Deadlines"; on Lua 5.1 it runs in the caller, which waits for
          -- it): the create goes on in the background and its client joins
          -- the idle set
          if IS_51 then
            sched.sleep(5)
            local l = assert(first[1], tostring(first[2]))
            assert.equal(5, first.at)
            l:release()
          else
            assert.is_nil(first[1])
            assert.equal("timeout", first[2])
            assert.equal(1, first.at)
            sched.sleep(5)
          end
          s = H.check(pool)
          assert.equal(1, s.live)
          assert.equal(1, s.idle)
          local l = assert(pool:acquire())
          assert.equal(1, l.client.id)
          l:release()
          s = assert_recovered(sched, pool, f, 1)
          assert.equal(1, s.opened)
          assert_closed_clean(sched, pool, f)
        end)
      end)

      it("hanging, then failing: the waiter that is still queued gets the slot and creates", function()
        run(function(sched, ctx)
          local f = factory(sched)
          local pool = mkpool(sched, f, { max_live = 1 })
          f.plan.create = { { hang = 5, after = "nil" } }
          local first, short, long
          ctx.go(function() first = { pool:acquire() } end)
          sched.sleep(0.1)
          ctx.go(function() short = { pool:acquire(nil, { timeout = 1 }) } end)
          ctx.go(function()
            long = { pool:acquire(nil, { timeout = 10 }) }
            long.id = long[1] and long[1].client.id
            if long[1] then long[1]:release() end
          end)
          sched.sleep(10)
          assert.same({ nil, "create", "refused" }, first)
          assert.is_nil(short[1])
          assert.equal("timeout", short[2])
          assert.is_table(long[1], tostring(long[2]))
          assert.equal(1, long.id)
          assert_recovered(sched, pool, f, 1)
          assert_closed_clean(sched, pool, f)
        end)
      end)

      it("hanging while the pool closes: the late client is destroyed at its release, nothing leaks", function()
        run(function(sched, ctx)
          local f = factory(sched)
          local pool = mkpool(sched, f, { max_live = 1 })
          f.plan.create = { { hang = 5 } }
          local first, waiter
          ctx.go(function()
            first = { pool:acquire() }
            if first[1] then first[1]:release() end
          end)
          sched.sleep(0.1)
          ctx.go(function() waiter = { pool:acquire() } end)
          sched.sleep(1)
          pool:close()
          sched.sleep(0)
          assert.same({ nil, "closed" }, waiter)
          sched.sleep(5)
          assert(first, "the creating caller never returned")
          -- whatever it got, the client it made is gone
          assert(first[1] or first[2] == "closed", tostring(first[2]))
          settle(sched)
          local s = H.check(pool)
          assert.equal(0, s.live)
          assert.equal(0, s.leases)
          assert.equal(0, s.creating)
          assert.equal(0, f.nopen())
          assert.equal(f.created, f.destroy_calls)
        end)
      end)

      it("hanging under try_acquire: 'timeout' at once, the client then joins the idle pool", function()
        run(function(sched)
          local f = factory(sched)
          local pool = mkpool(sched, f, { max_live = 1 })
          f.plan.create = { { hang = 5 } }
          local t0 = sched.now()
          local l, code, detail = pool:try_acquire()
          assert.is_nil(l)
          assert.equal("timeout", code)
          assert.equal(1, detail.creating)
          assert.equal(t0, sched.now())
          sched.sleep(6)
          local s = H.check(pool)
          assert.equal(1, s.idle)
          assert.equal(0, s.leases)
          l = assert(pool:try_acquire())
          assert.equal(1, l.client.id)
          l:release()
          assert_recovered(sched, pool, f, 1)
          assert_closed_clean(sched, pool, f)
        end)
      end)

      it("hanging under try_acquire, then failing or throwing: the slot comes back", function()
        run(function(sched)
          local f = factory(sched)
          local pool = mkpool(sched, f, { max_live = 1 })
          f.plan.create = { { hang = 5, after = "nil" } }
          assert.equal("timeout", select(2, pool:try_acquire()))
          sched.sleep(6)
          local s = H.check(pool)
          assert.equal(0, s.live)
          assert.equal(0, s.creating)
          f.plan.create = { { hang = 5, after = "throw" } }
          assert.equal("timeout", select(2, pool:try_acquire()))
          sched.sleep(6)
          s = H.check(pool)
          assert.equal(0, s.creating)
          assert.equal(2, s.create_failed)
          assert_recovered(sched, pool, f, 1)
          assert_closed_clean(sched, pool, f)
        end)
      end)

      it("hanging under try_acquire while the pool closes: the late client is destroyed", function()
        run(function(sched)
          local f = factory(sched)
          local pool = mkpool(sched, f, { max_live = 1 })
          f.plan.create = { { hang = 5 } }
          assert.equal("timeout", select(2, pool:try_acquire()))
          sched.sleep(1)
          pool:close()
          sched.sleep(6)
          local s = H.check(pool)
          assert.equal(0, s.live)
          assert.equal(0, s.creating)
          assert.equal(1, f.created)
          assert.equal(0, f.nopen())
        end)
      end)

      it("hanging in a coroutine that is killed: the reservation is forfeited once collected", function()
        run(function(sched, ctx)
          local f = factory(sched)
          local pool = mkpool(sched, f, { max_live = 1 })
          f.plan.create = { { hang = 5 } }
          local victim = ctx.go(function() pool:acquire() end)
          sched.sleep(1)
          assert.equal(1, H.check(pool).creating)
          kill(victim.co)
          ctx.live = ctx.live - 1 -- killed: it will never finish
          victim = nil -- luacheck: ignore 311
          -- the loop lets the dead coroutine go when its sleep is due
          sched.sleep(5)
          for _ = 1, 3 do
            collectgarbage("collect")
            settle(sched)
          end
          local s = H.check(pool)
          assert.equal(0, s.creating)
          assert.equal(0, s.leases)
          assert.equal(1, s.leaked)
          assert_recovered(sched, pool, f, 1)
          assert_closed_clean(sched, pool, f)
        end)
      end)
    end)

    ---------------------------------------------------------------------------
    describe("validate", function()
      it("throwing (before or after yielding) retires the client; the same caller gets a fresh one", function()
        run(function(sched)
          local f = factory(sched)
          local pool = mkpool(sched, f, { max_live = 3, validate = f.validate })
          local ls = {}
          for i = 1, 3 do ls[i] = assert(pool:acquire()) end
          for i = 1, 3 do ls[i]:release() end
          -- all three idle clients fail validation, one way or another: the
          -- caller goes through them and then creates
          f.plan.validate = { "throw", { hang = 1, after = "throw" }, "throw_table" }
          local t0 = sched.now()
          local l = assert(pool:acquire())
          assert.equal(1, sched.now() - t0)
          assert.equal(4, l.client.id)
          local s = H.check(pool)
          assert.equal(3, s.closed_by.invalid)
          assert.equal(1, s.live)
          l:release()
          assert_recovered(sched, pool, f, 3)
          assert_closed_clean(sched, pool, f)
        end)
      end)

      it("throwing at max_live: the retired client's slot serves the caller and the waiters", function()
        run(function(sched, ctx)
          local f = factory(sched)
          local pool = mkpool(sched, f, { max_live = 1, validate = f.validate })
          assert(pool:acquire()):release()
          local held = assert(pool:acquire())
          f.plan.validate = { "throw", "throw" }
          local got = {}
          for i = 1, 3 do
            ctx.go(function()
              local l, code = pool:acquire(nil, { timeout = 5 })
              got[i] = l and l.client.id or code
              if l then sched.sleep(0.1); l:release() end
            end)
          end
          sched.sleep(0.5)
          held:release()
          sched.sleep(3)
          -- two validations fail, each retires client and the slot is used
          -- to create: everybody is served within its timeout
          for i = 1, 3 do assert.is_number(got[i], tostring(got[i])) end
          assert.equal(3, f.created)
          assert.equal(2, H.check(pool).closed_by.invalid)
          assert_recovered(sched, pool, f, 1)
          assert_closed_clean(sched, pool, f)
        end)
      end)

      it("validate failing keeps the caller's place in the queue and its deadline", function()
        run(function(sched, ctx)
          local f = factory(sched)
          local pool = mkpool(sched, f, { max_live = 1, validate = f.validate })
          assert(pool:acquire()):release()
          local held = assert(pool:acquire())
          f.plan.validate = { "throw" }            -- the first validation only
          local order, got, t1 = {}, {}, {}
          for i = 1, 3 do
            ctx.go(function()
              local l, code = pool:acquire(nil, { timeout = 2 })
              order[#order + 1] = i
              got[i], t1[i] = l and l.client.id or code, sched.now()
              if l then sched.sleep(0.1); l:release() end
            end)
          end
          sched.sleep(0.5)
          local t0 = sched.now()
          held:release()        -- to waiter 1, whose validate throws: it creates, in its place
          sched.sleep(3)
          assert.same({ 1, 2, 3 }, order)
          assert.same({ 2, 2, 2 }, got)             -- the new client, served in turn
          assert.is_true(t1[1] - t0 < 0.1, "waiter 1 was served after " .. (t1[1] - t0))
          local s = H.check(pool)
          assert.equal(1, s.closed_by.invalid)
          assert.equal(0, s.timeouts)
          assert_recovered(sched, pool, f, 1)
          assert_closed_clean(sched, pool, f)
        end)
      end)

      it("a pause that comes while validate runs holds the caller's new grant until resume", function()
        run(function(sched, ctx)
          local f = factory(sched)
          local pool = mkpool(sched, f, { max_live = 2, validate = f.validate })
          assert(pool:acquire()):release()
          f.plan.validate = { { hang = 1, after = "throw" } }   -- yields 1 s, then throws
          local got, at
          ctx.go(function()
            local l, code = pool:acquire(nil, { timeout = 10 })
            got, at = l and l.client.id or code, sched.now()
            if l then l:release() end
          end)
          local t0 = sched.now()
          sched.sleep(0.5)
          pool:pause("LOADING")
          sched.sleep(1)
          assert.is_nil(got)                        -- no create while paused
          assert.equal(1, f.created)
          assert.is_true(ctx.logged("validate hook failed"))
          pool:resume()
          sched.sleep(0.5)
          assert.equal(2, got)
          assert.is_true(at - t0 >= 1.5, "served at " .. (at - t0))
          assert.equal(1, H.check(pool).closed_by.invalid)
          assert_recovered(sched, pool, f, 2)
          assert_closed_clean(sched, pool, f)
        end)
      end)

      it("a caller with nothing queued keeps trying its own idle clients, then creates", function()
        run(function(sched)
          local f = factory(sched)
          local pool = mkpool(sched, f, { max_live = 2, validate = f.validate })
          local a, b = assert(pool:acquire()), assert(pool:acquire())
          a:release()
          b:release()
          f.plan.validate = { "false", "false" }
          local l = assert(pool:acquire())          -- both idle clients refused: a new one
          assert.equal(3, l.client.id)
          assert.equal(2, H.check(pool).closed_by.invalid)
          l:release()
          assert_recovered(sched, pool, f, 2)
          assert_closed_clean(sched, pool, f)
        end)
      end)
    end)

    ---------------------------------------------------------------------------
    describe("destroy throwing", function()
      it("is logged; the pool is unaffected (release(false), max_idle, expiry, close)", function()
        run(function(sched, ctx)
          local f = factory(sched)
          local pool = mkpool(sched, f, { max_live = 3, max_idle = 1, idle_timeout = 10 })
          f.plan.destroy = { "throw", { hang = 1, after = "throw" }, "throw_table", "throw", "throw", "throw" }
          local a, b, c = assert(pool:acquire()), assert(pool:acquire()), assert(pool:acquire())
          a:release(false)                                 -- error
          b:release()                                      -- idle
          c:release()                                      -- max_idle: destroyed
          settle(sched)
          sched.sleep(1)
          local s = H.check(pool)
          assert.equal(1, s.live)
          assert.equal(1, s.closed_by.error)
          assert.equal(1, s.closed_by.max_idle)
          sched.sleep(20)                                  -- idle_timeout
          s = H.check(pool)
          assert.equal(0, s.live)
          assert.equal(1, s.closed_by.idle)
          assert.equal(3, f.destroy_calls)
          local n = 0
          for _, m in ipairs(ctx.logs) do
            if contains(m, "destroy hook failed") then n = n + 1 end
          end
          assert.equal(3, n)
          assert.is_true(ctx.logged("destroy exploded"))
          f.plan.destroy = { "throw", "throw", "throw" }
          assert_recovered(sched, pool, f, 3)
          f.plan.destroy = { "throw", "throw", "throw" }
          assert_closed_clean(sched, pool, f)
          assert.equal(6, f.destroy_calls)
        end)
      end)
    end)

    ---------------------------------------------------------------------------
    describe("park and unpark", function()
      local function parking(f, o)
        o = o or {}
        o.park, o.unpark = f.park, f.unpark
        return o
      end

      it("park throwing retires the client at its release (logged); the next acquire creates", function()
        run(function(sched, ctx)
          local f = factory(sched)
          local pool = mkpool(sched, f, parking(f, { max_live = 2 }))
          local a, b = assert(pool:acquire()), assert(pool:acquire())
          f.plan.park = { "throw", "throw_table" }
          a:release()
          b:release()
          settle(sched)
          local s = H.check(pool)
          assert.equal(0, s.live)
          assert.equal(2, f.destroy_calls)
          assert.is_true(ctx.logged("park hook failed"))
          local l = assert(pool:acquire())
          assert.equal(3, l.client.id)
          l:release()
          assert.equal(1, H.check(pool).idle)
          assert_recovered(sched, pool, f, 2)
          assert_closed_clean(sched, pool, f)
        end)
      end)

      it("park throwing while a waiter queues: the waiter gets a fresh client", function()
        run(function(sched, ctx)
          local f = factory(sched)
          local pool = mkpool(sched, f, parking(f, { max_live = 1 }))
          local held = assert(pool:acquire())
          local got
          ctx.go(function()
            local l, code = pool:acquire(nil, { timeout = 5 })
            got = l and l.client.id or code
            if l then l:release() end
          end)
          sched.sleep(0.5)
          f.plan.park = { "throw" }
          held:release()
          sched.sleep(1)
          -- the released client went to the waiter without parking (a
          -- handoff), or was retired and the waiter created: never lost
          assert.is_number(got)
          assert_recovered(sched, pool, f, 1)
          assert_closed_clean(sched, pool, f)
        end)
      end)

      it("unpark throwing or returning nil retires the client; the same caller gets a fresh one", function()
        run(function(sched, ctx)
          local f = factory(sched)
          local pool = mkpool(sched, f, parking(f, { max_live = 3 }))
          local ls = {}
          for i = 1, 3 do ls[i] = assert(pool:acquire()) end
          for i = 1, 3 do ls[i]:release() end
          f.plan.unpark = { "throw", { hang = 1, after = "nil" }, "throw_table" }
          local l = assert(pool:acquire())
          assert.equal(4, l.client.id)
          local s = H.check(pool)
          assert.equal(3, s.closed_by.invalid)
          assert.is_true(ctx.logged("unpark hook failed"))
          l:release()
          assert_recovered(sched, pool, f, 3)
          assert_closed_clean(sched, pool, f)
        end)
      end)

      it("unpark throwing at max_live: the waiters behind are served", function()
        run(function(sched, ctx)
          local f = factory(sched)
          local pool = mkpool(sched, f, parking(f, { max_live = 1 }))
          assert(pool:acquire()):release()
          f.plan.unpark = { "throw" }
          local got = {}
          for i = 1, 3 do
            ctx.go(function()
              local l, code = pool:acquire(nil, { timeout = 5 })
              got[i] = l and l.client.id or code
              if l then sched.sleep(0.1); l:release() end
            end)
          end
          sched.sleep(3)
          assert.same({ 2, 2, 2 }, got)
          assert_recovered(sched, pool, f, 1)
          assert_closed_clean(sched, pool, f)
        end)
      end)
    end)

    ---------------------------------------------------------------------------
    describe("a client dying while idle", function()
      it("validate detects it: retired (invalid), the caller gets a live client", function()
        run(function(sched)
          local f = factory(sched)
          local pool = mkpool(sched, f, { max_live = 2, validate = f.validate })
          local a, b = assert(pool:acquire()), assert(pool:acquire())
          a:release()
          b:release()
          b.client = nil
          -- the server restarted: every idle client is dead
          for c in pairs(f.open) do c.alive = false end
          local l = assert(pool:acquire())
          assert.is_true(l.client.alive)
          assert.equal(3, l.client.id)
          local s = H.check(pool)
          assert.equal(2, s.closed_by.invalid)
          assert.equal(1, s.live)
          l:release()
          assert_recovered(sched, pool, f, 2)
          assert_closed_clean(sched, pool, f)
        end)
      end)

      it("without validate (or inside validate_after_idle) the caller sees it and retires it with release(false)",
        function()
          run(function(sched)
            local f = factory(sched)
            local pool = mkpool(sched, f, { max_live = 1, validate = f.validate, validate_after_idle = 10 })
            assert(pool:acquire()):release()
            for c in pairs(f.open) do c.alive = false end
            sched.sleep(1) -- idle less than validate_after_idle: not validated
            local l = assert(pool:acquire())
            assert.is_false(l.client.alive)
            l:release(false)
            l = assert(pool:acquire())
            assert.is_true(l.client.alive)
            l:release()
            local s = H.check(pool)
            assert.equal(1, s.closed_by.error)
            -- idle longer than validate_after_idle: validated, retired
            for c in pairs(f.open) do c.alive = false end
            sched.sleep(11)
            l = assert(pool:acquire())
            assert.is_true(l.client.alive)
            l:release()
            assert.equal(1, H.check(pool).closed_by.invalid)
            assert_recovered(sched, pool, f, 1)
            assert_closed_clean(sched, pool, f)
          end)
        end)
    end)

    ---------------------------------------------------------------------------
    describe("every hook failing at once", function()
      it("a burst of acquirers under failing create, validate, destroy, park and unpark: all answered", function()
        run(function(sched, ctx)
          local f = factory(sched)
          local pool = mkpool(sched, f, { max_live = 3, validate = f.validate, park = f.park, unpark = f.unpark,
                                          acquire_timeout = 2 })
          local faults = { "ok", "nil", "throw", { hang = 0.5, after = "ok" }, { hang = 3, after = "nil" },
                           "throw_table", "ok" }
          local seed = 7
          local function rand(n)
            seed = seed * 16807 % 2147483647
            return seed % n + 1
          end
          for _ = 1, 60 do
            f.plan.create[#f.plan.create + 1] = faults[rand(#faults)]
            f.plan.validate[#f.plan.validate + 1] = ({ "ok", "false", "throw" })[rand(3)]
            f.plan.destroy[#f.plan.destroy + 1] = ({ "ok", "throw" })[rand(2)]
            f.plan.park[#f.plan.park + 1] = ({ "ok", "ok", "throw" })[rand(3)]
            f.plan.unpark[#f.plan.unpark + 1] = ({ "ok", "nil", "throw" })[rand(3)]
          end
          local codes = {}
          for i = 1, 40 do
            ctx.go(function()
              sched.sleep((i % 7) * 0.25)
              local l, code = pool:acquire()
              local k = l and "lease" or code
              codes[k] = (codes[k] or 0) + 1
              if l then
                sched.sleep(0.1)
                l:release(i % 5 ~= 0)
              end
            end)
          end
          sched.sleep(60)
          local total = 0
          for k, n in pairs(codes) do
            assert(k == "lease" or k == "create" or k == "timeout", "unexpected outcome " .. tostring(k))
            total = total + n
          end
          assert.equal(40, total)
          assert.is_true((codes.lease or 0) > 0)
          assert.is_true((codes.create or 0) > 0)
          assert_recovered(sched, pool, f, 3)
          assert_closed_clean(sched, pool, f)
        end)
      end)
    end)
  end)
end
