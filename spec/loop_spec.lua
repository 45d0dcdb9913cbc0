-- clientpool.loop: the built-in coroutine scheduler.
-- Almost everything runs on virtual-clock instances, so timeouts complete at
-- once and in a fixed order. Real-clock tests are pending until the C module
-- (clientpool.core) is built.

local loop = require "clientpool.loop"

local unpack = table.unpack or unpack -- luacheck: ignore 143

local has_core, core = pcall(require, "clientpool.core")
has_core = has_core and type(core) == "table" and type(core.monotime) == "function"
local it_core = has_core and it or pending

local has_socket, socket = pcall(require, "socket")
has_socket = has_socket and type(socket) == "table" and type(socket.gettime) == "function"
local it_socket = has_socket and it or pending

local it_close = coroutine.close and it or pending -- Lua 5.4

local function vloop(start)
  return loop.new { clock = "virtual", start = start }
end

local function errmsg(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok)
  return tostring(err)
end

local function contains(s, part)
  return s:find(part, 1, true) ~= nil
end

describe("clientpool.loop", function()

  describe("module", function()
    it("is a real-clock instance of plain functions", function()
      for _, name in ipairs { "spawn", "background", "sleep", "now", "run", "current",
                              "wait", "wake", "log", "stats", "new" } do
        assert.is_function(loop[name], name)
      end
      assert.is_true(loop.monotonic)
    end)

    it("is the adapter clientpool.sched.loop", function()
      assert.equal(loop, require "clientpool.sched.loop")
    end)

    it("makes virtual and real instances", function()
      local v = vloop()
      assert.is_false(v.monotonic)
      assert.equal(0, v.now())
      assert.equal(42.5, vloop(42.5).now())
      assert.is_true(loop.new().monotonic)
      assert.are_not.equal(loop, loop.new())
    end)

    it("rejects bad options", function()
      assert.is_true(contains(errmsg(loop.new, { clock = "wall" }), "option clock"))
      assert.is_true(contains(errmsg(loop.new, { clock = "virtual", start = "x" }), "option start"))
      assert.is_true(contains(errmsg(loop.new, { start = 1 }), "option start"))
      assert.is_true(contains(errmsg(loop.new, 5), "options table"))
    end)

    it("writes log messages to stderr", function()
      local got = {}
      local saved = io.stderr
      -- log() looks io.stderr up at each call, so a stand-in catches it.
      io.stderr = { write = function(_, ...) got[#got + 1] = table.concat({ ... }) end } -- luacheck: ignore 122
      local ok, err = pcall(loop.log, "clientpool: hello")
      io.stderr = saved -- luacheck: ignore 122
      assert(ok, err)
      assert.same({ "clientpool: hello\n" }, got)
    end)
  end)

  describe("spawn", function()
    it("starts tasks in spawn order at run(), with their arguments", function()
      local L = vloop()
      local order = {}
      local h = L.spawn(function(a, b, c, d)
        order[#order + 1] = { "a", a, b, c, d, select("#", a, b, c, d) }
      end, 1, nil, 3)
      L.spawn(function() order[#order + 1] = { "b" } end)
      L.spawn(function(x) order[#order + 1] = { "c", x } end, "x")
      assert.equal("thread", type(h))
      assert.equal(0, #order)
      L.run()
      assert.same({ { "a", 1, nil, 3, nil, 4 }, { "b" }, { "c", "x" } }, order)
      assert.equal("dead", coroutine.status(h))
      assert.same({ ready = 0, timers = 0, tasks = 0 }, L.stats())
    end)

    it("starts a task spawned during run() after those already ready", function()
      local L = vloop()
      local order = {}
      L.spawn(function()
        order[#order + 1] = "a"
        L.spawn(function() order[#order + 1] = "child" end)
      end)
      L.spawn(function() order[#order + 1] = "b" end)
      L.run()
      assert.same({ "a", "b", "child" }, order)
    end)

    it("rejects a non-function", function()
      assert.is_true(contains(errmsg(loop.spawn, 42), "spawn expects a function"))
    end)

    it("run() returns at once with nothing to do", function()
      local L = vloop()
      L.run()
      assert.equal(0, L.now())
    end)
  end)

  describe("sleep", function()
    it("wakes sleepers in deadline order", function()
      local L = vloop()
      local order = {}
      for _, d in ipairs { 3, 1, 2 } do
        L.spawn(function()
          L.sleep(d)
          order[#order + 1] = d .. "@" .. L.now()
        end)
      end
      L.run()
      assert.same({ "1@1", "2@2", "3@3" }, order)
    end)

    it("breaks ties in FIFO order", function()
      local L = vloop()
      local order = {}
      for _, name in ipairs { "a", "b", "c", "d", "e", "f", "g", "h" } do
        L.spawn(function()
          L.sleep(1)
          order[#order + 1] = name
          L.sleep(1)
          order[#order + 1] = name
        end)
      end
      L.run()
      assert.equal("abcdefghabcdefgh", table.concat(order))
      assert.equal(2, L.now())
    end)

    it("jumps the virtual clock: a 100 s sleep completes at once", function()
      local L = vloop()
      local t0 = os.clock()
      local done = false
      L.spawn(function()
        L.sleep(100)
        done = true
      end)
      L.run()
      assert.is_true(done)
      assert.equal(100, L.now())
      assert.is_true(os.clock() - t0 < 1)
    end)

    it("sleep(0) lets the other ready tasks run", function()
      local L = vloop()
      local order = {}
      for _, name in ipairs { "a", "b" } do
        L.spawn(function()
          order[#order + 1] = name .. "1"
          L.sleep(0)
          order[#order + 1] = name .. "2"
        end)
      end
      L.run()
      assert.same({ "a1", "b1", "a2", "b2" }, order)
      assert.equal(0, L.now())
    end)

    it("treats a bare coroutine.yield() in a task like sleep(0)", function()
      local L = vloop()
      local order = {}
      L.spawn(function()
        order[#order + 1] = "a1"
        coroutine.yield()
        order[#order + 1] = "a2"
      end)
      L.spawn(function() order[#order + 1] = "b" end)
      L.run()
      assert.same({ "a1", "b", "a2" }, order)
    end)

    it("raises outside a coroutine and on bad durations", function()
      assert.is_true(contains(errmsg(loop.sleep, 1), "clientpool.loop: sleep outside a coroutine"))
      local L = vloop()
      local errs = {}
      for _, bad in ipairs { -1, "1", 0 / 0, math.huge } do
        L.spawn(function()
          local ok, err = pcall(L.sleep, bad)
          errs[#errs + 1] = not ok and contains(err, "sleep expects") or false
        end)
      end
      L.run()
      assert.same({ true, true, true, true }, errs)
    end)

    it("resumes a coroutine that is not a task", function()
      local L = vloop()
      local log = {}
      local co = coroutine.create(function()
        L.sleep(5)
        log[#log + 1] = L.now()
      end)
      assert.is_true(coroutine.resume(co))
      assert.equal("suspended", coroutine.status(co))
      L.run()
      assert.same({ 5 }, log)
      assert.equal("dead", coroutine.status(co))
    end)
  end)

  describe("adapter", function()
    it("current() gives the running coroutine, or nil and a reason", function()
      local h, why = loop.current()
      assert.is_nil(h)
      assert.equal("not in a coroutine", why)
      local L = vloop()
      local got, co
      co = L.spawn(function() got = L.current() end)
      L.run()
      assert.equal(co, got)
    end)

    it("wait() outside a coroutine returns nil and a reason", function()
      local ok, why = loop.wait(nil, nil)
      assert.is_nil(ok)
      assert.equal("not in a coroutine", why)
    end)

    it("wait() rejects a handle that is not the running coroutine", function()
      local L = vloop()
      local other = coroutine.create(function() end)
      local err
      L.spawn(function()
        local ok, e = pcall(L.wait, other)
        err = not ok and e
      end)
      L.run()
      assert.is_true(contains(err, "handle is not the running coroutine"))
    end)

    it("wait() without a deadline returns true on wake, at the next turn", function()
      local L = vloop()
      local log = {}
      local waiter = L.spawn(function()
        local h = L.current()
        local r = L.wait(h)
        log[#log + 1] = "woken " .. tostring(r) .. " @" .. L.now()
      end)
      L.spawn(function()
        L.sleep(5)
        assert.is_true(L.wake(waiter))
        log[#log + 1] = "after wake" -- the waiter has not run yet
      end)
      L.run()
      assert.same({ "after wake", "woken true @5" }, log)
    end)

    it("wait() with a deadline times out at the deadline", function()
      local L = vloop(10)
      local r1, r2, at
      L.spawn(function()
        r1, r2 = L.wait(L.current(), L.now() + 2.5)
        at = L.now()
      end)
      L.run()
      assert.is_nil(r1)
      assert.equal("timeout", r2)
      assert.equal(12.5, at)
      assert.same({ ready = 0, timers = 0, tasks = 0 }, L.stats())
    end)

    it("wait() with a deadline returns true when woken before it", function()
      local L = vloop()
      local r, at, timers
      local waiter = L.spawn(function()
        r = L.wait(L.current(), 100)
        at = L.now()
      end)
      L.spawn(function()
        L.sleep(1)
        assert.equal(1, L.stats().timers) -- the waiter's deadline (our sleep's fired)
        L.wake(waiter)
        timers = L.stats().timers -- the deadline left the heap with the wake
      end)
      L.run()
      assert.is_true(r)
      assert.equal(1, at)
      assert.equal(0, timers)
      assert.equal(1, L.now()) -- no jump to the dropped deadline
    end)

    it("wait() with a past deadline returns at once", function()
      local L = vloop(5)
      local r1, r2
      L.spawn(function() r1, r2 = L.wait(L.current(), 4) end)
      L.run()
      assert.is_nil(r1)
      assert.equal("timeout", r2)
      assert.equal(5, L.now())
    end)

    it("remembers a wake that comes before the wait; several count once", function()
      local L = vloop()
      local log = {}
      L.spawn(function()
        local h = L.current()
        assert.is_true(L.wake(h))
        assert.is_true(L.wake(h))
        log[#log + 1] = { L.wait(h, L.now() + 1) }
        log[#log + 1] = L.now()
        log[#log + 1] = { L.wait(h, L.now() + 1) }
        log[#log + 1] = L.now()
      end)
      L.run()
      assert.same({ { true }, 0, { nil, "timeout" }, 1 }, log)
    end)

    it("a wake before the task starts is kept for its first wait", function()
      local L = vloop()
      local r
      local co = L.spawn(function() r = L.wait(L.current()) end)
      assert.is_true(L.wake(co))
      L.run()
      assert.is_true(r)
    end)

    it("a wake does not cut a sleep short but is kept for the next wait", function()
      local L = vloop()
      local log = {}
      local co = L.spawn(function()
        L.sleep(10)
        log[#log + 1] = L.now()
        log[#log + 1] = L.wait(L.current(), L.now() + 5)
        log[#log + 1] = L.now()
      end)
      L.spawn(function()
        L.sleep(1)
        L.wake(co)
      end)
      L.run()
      assert.same({ 10, true, 10 }, log)
    end)

    it("a wake after the deadline fired, before the waiter ran, wins", function()
      local L = vloop()
      local r
      local waiter
      L.spawn(function()
        L.sleep(5) -- registered first: runs first at t = 5
        L.wake(waiter)
      end)
      waiter = L.spawn(function() r = { L.wait(L.current(), 5) } end)
      L.run()
      assert.same({ true }, r)
    end)

    it("wake() of a dead coroutine returns false", function()
      local L = vloop()
      local co = L.spawn(function() end)
      L.run()
      assert.is_false(L.wake(co))
      local failed = coroutine.create(function() error("x") end)
      coroutine.resume(failed)
      assert.is_false(L.wake(failed))
      assert.is_true(L.wake(coroutine.create(function() end))) -- not started: kept
      local dead = coroutine.create(function() end)
      coroutine.resume(dead)
      assert.is_false(L.wake(dead))
      assert.is_true(contains(errmsg(L.wake, "nope"), "wake expects a coroutine"))
    end)

    it("waits and is woken in a coroutine that is not a task", function()
      local L = vloop()
      local log = {}
      local co = coroutine.create(function()
        local h = assert(L.current())
        log[#log + 1] = { L.wait(h) }
        log[#log + 1] = { L.wait(h, L.now() + 3) }
        log[#log + 1] = L.now()
      end)
      assert.is_true(coroutine.resume(co))
      assert.is_true(L.wake(co))
      assert.same({}, log) -- never resumed synchronously
      L.run()
      assert.same({ { true }, { nil, "timeout" }, 3 }, log)
    end)

    it("follows a nested coroutine whose yields pass through its task (5.1 pcall style)", function()
      local L = vloop()
      -- What a yield-transparent pcall does on Lua 5.1: run f in a coroutine
      -- and relay its yields to whoever resumes the caller.
      local function passthrough(f)
        local c = coroutine.create(f)
        local r = { coroutine.resume(c) }
        while coroutine.status(c) == "suspended" do
          r = { coroutine.resume(c, coroutine.yield(unpack(r, 2, 3))) }
        end
        return unpack(r, 1, 2)
      end
      local log, nested
      L.spawn(function()
        log = { passthrough(function()
          nested = L.current()
          L.sleep(2)
          local a, b = L.wait(nested, L.now() + 1)
          assert.is_nil(a); assert.equal("timeout", b)
          return L.wait(nested) -- woken by the other task
        end) }
        log[#log + 1] = L.now()
      end)
      L.spawn(function()
        L.sleep(10)
        assert.is_true(L.wake(nested))
      end)
      L.run()
      assert.same({ true, true, 10 }, log)
    end)
  end)

  describe("background", function()
    it("does not keep run() alive and goes on at the next run()", function()
      local L = vloop()
      local ticks = 0
      L.background(function()
        while true do
          L.sleep(1)
          ticks = ticks + 1
        end
      end)
      L.spawn(function() L.sleep(3.5) end)
      L.run()
      assert.equal(3, ticks)
      assert.equal(3.5, L.now())
      assert.same({ ready = 0, timers = 1, tasks = 0 }, L.stats())
      L.run() -- only background work: returns at once
      assert.equal(3.5, L.now())
      L.spawn(function() L.sleep(2) end)
      L.run()
      assert.equal(5, ticks)
      assert.equal(5.5, L.now())
    end)

    it("runs when ready, also when only background tasks are left; its timers keep nothing going", function()
      -- (issue 18: a background task woken after the program's tasks ended,
      -- the pool's timer task told of a collected lease, waited for the
      -- next run() with foreground work before)
      local L = vloop()
      local started, ticks = false, 0
      L.background(function()
        started = true
        while true do L.sleep(1); ticks = ticks + 1 end
      end)
      L.run()
      assert.is_true(started)
      assert.equal(0, ticks)
      assert.equal(0, L.now())
      local bg
      bg = L.background(function() L.wait(L.current()) end)
      L.run()                              -- it waits: run() returns
      assert.is_true(L.wake(bg))           -- woken with no task left
      L.run()
      assert.equal("dead", coroutine.status(bg))
      assert.equal(0, L.now())
    end)

    it("its timers still run while a task waits for them", function()
      local L = vloop()
      local fg, r
      L.background(function()
        L.sleep(7)
        L.wake(fg)
      end)
      fg = L.spawn(function() r = L.wait(L.current()) end)
      L.run()
      assert.is_true(r)
      assert.equal(7, L.now())
    end)

    it("run() reports a deadlock when tasks wait and nothing can wake them", function()
      local L = vloop()
      L.spawn(function() L.wait(L.current()) end)
      L.background(function() L.wait(L.current()) end)
      local err = errmsg(L.run)
      assert.is_true(contains(err, "clientpool.loop: deadlock: 1 task(s)"))
    end)
  end)

  describe("errors", function()
    it("run() re-raises a task's error with the task's traceback", function()
      local L = vloop()
      local function deep_in_the_task()
        L.sleep(1)
        error("boom from the task")
      end
      L.spawn(function() deep_in_the_task() end)
      local err = errmsg(L.run)
      assert.is_true(contains(err, "boom from the task"))
      assert.is_true(contains(err, "stack traceback:"))
      assert.is_true(contains(err, "deep_in_the_task"))
      assert.equal(0, L.stats().tasks)
    end)

    it("the other tasks stay scheduled and run() goes on with them", function()
      local L = vloop()
      local order = {}
      L.spawn(function() order[#order + 1] = "a" end)
      L.spawn(function() error("b fails") end)
      L.spawn(function() order[#order + 1] = "c" end)
      L.spawn(function() L.sleep(1); order[#order + 1] = "d" end)
      assert.is_true(contains(errmsg(L.run), "b fails"))
      assert.same({ "a" }, order)
      L.run()
      assert.same({ "a", "c", "d" }, order)
    end)

    it("passes a non-string error value through unchanged", function()
      local L = vloop()
      local obj = { code = 7 }
      L.spawn(function() error(obj) end)
      local ok, err = pcall(L.run)
      assert.is_false(ok)
      assert.equal(obj, err)
    end)

    it("run() is not re-entrant", function()
      local L = vloop()
      L.spawn(function() L.run() end)
      local err = errmsg(L.run)
      assert.is_true(contains(err, "not re-entrant"))
      L.run() -- usable again afterwards
    end)

    it_close("skips a sleeper killed elsewhere (coroutine.close)", function()
      local L = vloop()
      local reached = false
      local victim = L.spawn(function()
        L.sleep(10)
        reached = true
      end)
      L.spawn(function()
        L.sleep(1)
        assert.is_true(coroutine.close(victim))
      end)
      L.run()
      assert.is_false(reached)
      assert.same({ ready = 0, timers = 0, tasks = 0 }, L.stats())
      assert.equal(10, L.now()) -- its timer still fired, and was skipped
      assert.is_false(L.wake(victim))
    end)

    it_close("forgets a waiter without deadline killed elsewhere", function()
      local L = vloop()
      local victim = L.spawn(function() L.wait(L.current()) end)
      L.spawn(function()
        L.sleep(1)
        coroutine.close(victim)
      end)
      L.run() -- no deadlock: the dead task does not count
      assert.equal(0, L.stats().tasks)
    end)
  end)

  describe("resources", function()
    it("the heap does not grow over 100k wait/wake cycles", function()
      local L = vloop()
      local N = 100000
      local a, b
      local max_timers, max_ready = 0, 0
      local function ping(other_ref)
        return function()
          local me = L.current()
          for _ = 1, N do
            local r = L.wait(me, L.now() + 1000)
            assert(r == true)
            L.wake(other_ref())
            local s = L.stats()
            if s.timers > max_timers then max_timers = s.timers end
            if s.ready > max_ready then max_ready = s.ready end
          end
        end
      end
      a = L.spawn(ping(function() return b end))
      b = L.spawn(ping(function() return a end))
      L.spawn(function() L.wake(a) end)
      L.run()
      assert.is_true(max_timers <= 2)
      assert.is_true(max_ready <= 2)
      assert.same({ ready = 0, timers = 0, tasks = 0 }, L.stats())
      assert.equal(0, L.now()) -- every deadline left with its wake
    end)

    it("instances do not interfere", function()
      local A, B = vloop(), vloop(100)
      local log = {}
      A.spawn(function() A.sleep(5); log[#log + 1] = "A" .. A.now() end)
      B.spawn(function() B.sleep(1); log[#log + 1] = "B" .. B.now() end)
      B.run()
      assert.same({ "B101" }, log)
      assert.equal(0, A.now())
      assert.same({ ready = 1, timers = 0, tasks = 1 }, A.stats())
      A.run()
      assert.same({ "B101", "A5" }, log)
      assert.equal(101, B.now())
    end)

    it("an instance runs inside another instance's task", function()
      local A, B = vloop(), vloop()
      local log = {}
      A.spawn(function()
        B.spawn(function() B.sleep(3); log[#log + 1] = "B" .. B.now() end)
        B.run()
        A.sleep(1)
        log[#log + 1] = "A" .. A.now()
      end)
      A.run()
      assert.same({ "B3", "A1" }, log)
    end)
  end)

  describe("real clock", function()
    it_core("sleeps for real, without an upper bound check", function()
      local L = loop.new()
      local t0 = core.monotime()
      local slept
      L.spawn(function()
        local s = L.now()
        L.sleep(0.02)
        slept = L.now() - s
      end)
      L.run()
      assert.is_true(core.monotime() - t0 >= 0.015)
      assert.is_true(slept >= 0.015)
    end)

    it_core("the default instance reads clientpool.core.monotime", function()
      local a = loop.now()
      local b = core.monotime()
      assert.is_true(b >= a)
      assert.is_true(b - a < 60)
    end)

    it_core("times out a wait on the real clock", function()
      local L = loop.new()
      local r1, r2, waited
      L.spawn(function()
        local t = L.now()
        r1, r2 = L.wait(L.current(), t + 0.02)
        waited = L.now() - t
      end)
      L.run()
      assert.is_nil(r1)
      assert.equal("timeout", r2)
      assert.is_true(waited >= 0.015)
    end)

    it_socket("sleeps for real on a custom clock function", function()
      local L = loop.new { clock = socket.gettime }
      assert.is_false(L.monotonic)
      local t0 = socket.gettime()
      local order = {}
      L.spawn(function() L.sleep(0.02); order[#order + 1] = "late" end)
      L.spawn(function() L.sleep(0.01); order[#order + 1] = "early" end)
      L.run()
      assert.is_true(socket.gettime() - t0 >= 0.015)
      assert.same({ "early", "late" }, order)
    end)
  end)

  -- The adapter contract every scheduler keeps (spec/sched_contract.lua), on
  -- a real-clock instance (the contract asks for a monotonic clock).
  describe("on the real clock", function()
    if not has_core then
      pending("not run: the real clock needs clientpool.core")
      return
    end
    local S = {
      name = "loop (real clock)", lib = "loop", scale = 0.01, real = true,
      new = function() return loop.new() end,
      run = function(sched, fn, ...)
        local args = { n = select("#", ...), ... }
        sched.spawn(function() fn(unpack(args, 1, args.n)) end)
        sched.run()
      end,
      finish = function() end,
    }
    require "spec.sched_contract"(S, { describe = describe, it = it, after_each = after_each, assert = assert })
  end)
end)
