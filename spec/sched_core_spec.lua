-- clientpool.sched.core: the scheduler core shared by clientpool.loop (its
-- run()) and clientpool.sched.hosted (a host's turn()), and the helpers
-- clientpool.sched.cqueues takes from it. The forms are specified in
-- loop_spec.lua and sched_hosted_spec.lua (the adapter contract on each);
-- here: the instance's two parts, the two yield protocols, the helpers.

local core = require "clientpool.sched.core"

local function instance(hosted)
  local c = { t = 0 }
  local S, I = core.new { now = function() return c.t end, name = "t", hosted = hosted }
  return S, I, c
end

local function errmsg(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok)
  return tostring(err)
end

describe("clientpool.sched.core", function()
  describe("an instance", function()
    it("is an adapter table and the internals of the form that drives it", function()
      local S, I = instance(false)
      for _, f in ipairs { "now", "current", "wait", "wake", "spawn", "background", "sleep", "stats" } do
        assert.is_function(S[f], f)
      end
      assert.is_nil(S.run)     -- the forms add run() or turn()
      for _, f in ipairs { "drive", "turn", "ready", "deadline", "busy", "fgwork", "moving" } do
        assert.is_function(I[f], f)
      end
    end)

    it("drive() runs turns and moves time to the next timer between them", function()
      local S, I, c = instance(false)
      local log = {}
      S.spawn(function() S.sleep(2); log[#log + 1] = "2 at " .. c.t end)
      S.spawn(function() S.sleep(1); log[#log + 1] = "1 at " .. c.t end)
      assert.is_nil(I.drive(function(t) c.t = t end))
      assert.same({ "1 at 1", "2 at 2" }, log)
      assert.same({ ready = 0, timers = 0, tasks = 0 }, S.stats())
    end)

    it("drive() returns a deadlock when tasks wait with nothing to wake them", function()
      local S, I = instance(false)
      S.spawn(function() S.wait(S.current()) end)
      local err = I.drive(function() end)
      assert.truthy(tostring(err):find("t: deadlock: 1 task(s) wait", 1, true), tostring(err))
    end)

    it("prefixes its errors with the name it was given", function()
      local S = instance(true)
      assert.truthy(errmsg(S.spawn, 42):find("t: spawn expects a function", 1, true))
      assert.truthy(errmsg(S.wake, 42):find("t: wake expects a coroutine handle", 1, true))
      assert.truthy(errmsg(S.sleep, 1):find("t: sleep outside a coroutine", 1, true))
    end)
  end)

  describe("the yield protocols", function()
    it("loop: a bare coroutine.yield() goes round again, like sleep(0)", function()
      local S, I = instance(false)
      local log = {}
      S.spawn(function() coroutine.yield(); log[#log + 1] = "a2" end)
      S.spawn(function() log[#log + 1] = "b" end)
      I.drive(function() end)
      assert.same({ "b", "a2" }, log)
    end)

    it("hosted: a bare coroutine.yield() leaves the task to whoever resumes it", function()
      local S, I = instance(true)
      local done = false
      local task = S.spawn(function() coroutine.yield(); done = true end)
      I.turn()
      assert.equal(0, I.ready())
      assert.is_false(done)
      coroutine.resume(task)
      assert.is_true(done)
    end)

    it("both: a wait relayed through an outer coroutine resumes the outer one", function()
      for _, hosted in ipairs { false, true } do
        local S, I, c = instance(hosted)
        local got
        S.spawn(function()
          local co = coroutine.create(function()
            local h = S.current()
            return S.wait(h, c.t + 1)
          end)
          local ok, a, b = coroutine.resume(co)
          while ok and coroutine.status(co) == "suspended" do
            ok, a, b = coroutine.resume(co, coroutine.yield(a, b))
          end
          got = { ok, a, b }
        end)
        if hosted then
          I.turn()
          c.t = 1
          I.turn()
        else
          I.drive(function(t) c.t = t end)
        end
        assert.same({ true, nil, "timeout" }, got, hosted and "hosted" or "loop")
      end
    end)
  end)

  describe("helpers", function()
    it("lost_wake calls the waker's give-back once, and takes nil", function()
      local calls = {}
      local e = { lost = function(...) calls[#calls + 1] = { ... } end, la = 1, lb = 2, lc = 3 }
      core.lost_wake(e)
      core.lost_wake(e)
      core.lost_wake(nil)
      assert.same({ { 1, 2, 3 } }, calls)
      assert.is_nil(e.lost)
    end)

    it("running_co and cannot_wait tell where a coroutine can wait", function()
      assert.is_nil(core.running_co())
      assert.equal("not in a coroutine", core.cannot_wait(core.running_co()))
      local co = coroutine.wrap(function() return core.running_co(), core.cannot_wait(core.running_co()) end)
      local got, why = co()
      assert.equal("thread", type(got))
      assert.is_nil(why)
    end)

    it("check_sleep and wait_start raise at the line of the caller's caller", function()
      local function sleep(s) core.check_sleep("x", s) end   -- (no tail call: a frame of its own)
      local line = debug.getinfo(1, "l").currentline + 1
      local ok, err = pcall(function() sleep(1) end)
      assert.is_false(ok)
      assert.truthy(tostring(err):find("sched_core_spec.lua:" .. line .. ": x: sleep outside a coroutine", 1, true),
                    tostring(err))
      local msg = errmsg(coroutine.wrap(function() core.wait_start("x", "h") end))
      assert.truthy(msg:find("x: wait: handle is not the running coroutine", 1, true), msg)
      msg = errmsg(coroutine.wrap(function() core.check_sleep("x", -1) end))
      assert.truthy(msg:find("x: sleep expects a finite number of seconds >= 0", 1, true), msg)
    end)

    it("log writes the message and a newline to stderr", function()
      local got = {}
      local saved = io.stderr
      io.stderr = { write = function(_, ...) got[#got + 1] = table.concat({ ... }) end } -- luacheck: ignore 122
      local ok, err = pcall(core.log, "hello")
      io.stderr = saved -- luacheck: ignore 122
      assert(ok, err)
      assert.same({ "hello\n" }, got)
    end)
  end)
end)
