-- The scheduler adapter contract (docs/design.md "The scheduler adapter contract", docs/decisions.md
-- "Schedulers" and "Hosts"), checked on one adapter. Each
-- spec/sched_<host>_spec.lua calls this with the host's entry from
-- spec/helpers.lua (H.host), then adds its own socket scenarios;
-- spec/loop_spec.lua runs it on a real-clock clientpool.loop and
-- spec/sched_hosted_spec.lua on a host built on clientpool.sched.hosted.
--
-- Times are spec seconds multiplied by S.scale; on a real clock they are
-- lower bounds (H.time).

local clientpool = require "clientpool"
local H = require "spec.helpers"

local unpack = table.unpack or unpack -- luacheck: ignore 143
local PUC51 = _VERSION == "Lua 5.1" and not rawget(_G, "jit")

-- A pcall whose function runs in a coroutine of its own, every yield passed
-- up to the caller's resumer and every resume passed down: the driver's
-- `ycall` on PUC Lua 5.1 (coxpcall style), built here on every interpreter.
local function passthrough(fn, ...)
  local function pack(...) return { n = select("#", ...), ... } end
  local co = coroutine.create(fn)
  local r = pack(coroutine.resume(co, ...))
  while r[1] and coroutine.status(co) == "suspended" do
    r = pack(coroutine.resume(co, coroutine.yield(unpack(r, 2, r.n))))
  end
  return unpack(r, 1, r.n)
end

-- bf: busted's functions of the calling spec file (describe, it,
-- after_each, assert), which a required module does not see.
return function(S, bf)
  local describe, it, after_each, assert = bf.describe, bf.it, bf.after_each, bf.assert
  local function T(x) return x * S.scale end

  -- Runs body(sched) in a task of a fresh adapter, to completion.
  local function run(body)
    local sched = S.new()
    S.run(sched, body, sched)
    return sched
  end

  describe("adapter contract", function()
    after_each(function() S.finish() end)

    it("has the functions of the contract, and a monotonic clock", function()
      local sched = S.new()
      for _, f in ipairs { "now", "current", "wait", "wake", "spawn", "sleep", "background", "run", "log" } do
        assert.is_function(sched[f], f)
      end
      assert.is_true(sched.monotonic)
      local t1 = sched.now()
      local t2 = sched.now()
      assert.is_true(t2 >= t1)
      assert.is_true(math.abs(t1 - require("clientpool.core").monotime()) < 1)
    end)

    -- (S.lib nil: an adapter with no name of its own, such as a host built
    -- on clientpool.sched.hosted, is given as the table itself)
    it(S.lib and "is found by name: scheduler = \"" .. S.lib .. "\"" or "is taken as an adapter table", function()
      local pool = clientpool.new { create = function() return {} end, max_live = 1, scheduler = S.lib or S.new() }
      local l = assert(pool:try_acquire())
      l:release()
      pool:close()
    end)

    it("current() outside a coroutine gives nil and a reason", function()
      local sched = S.new()
      local h, why = sched.current()
      assert.is_nil(h)
      assert.is_string(why)
    end)

    it("current() in a task gives the running coroutine", function()
      local got
      run(function(sched)
        got = { sched.current(), coroutine.running() }
      end)
      assert.is_not_nil(got[1])
      assert.equal(got[2], got[1])
    end)

    it("a wake resumes the waiter at a later turn, never synchronously", function()
      local log = {}
      run(function(sched)
        local h
        sched.spawn(function()
          h = sched.current()
          log[#log + 1] = "wait"
          local r = sched.wait(h)
          log[#log + 1] = "woke " .. tostring(r)
        end)
        sched.sleep(0)
        assert.same({ "wait" }, log)
        assert.is_true(sched.wake(h))
        log[#log + 1] = "waker goes on"
        sched.sleep(0)
        log[#log + 1] = "waker after its turn"
      end)
      assert.same({ "wait", "waker goes on", "woke true", "waker after its turn" }, log)
    end)

    it("remembers a wake that comes before the wait; several count once", function()
      local r = {}
      run(function(sched)
        local h = sched.current()
        assert.is_true(sched.wake(h))
        assert.is_true(sched.wake(h))
        local t0 = sched.now()
        r[1] = { sched.wait(h, sched.now() + T(1)) }
        r[2] = { sched.wait(h, sched.now() + T(1)) }
        r.elapsed = sched.now() - t0
      end)
      assert.same({ true }, r[1])
      assert.same({ nil, "timeout" }, r[2])
      H.time(S, 1, r.elapsed, "the second wait")
    end)

    it("wait returns nil, timeout at its deadline and not before", function()
      local r
      run(function(sched)
        local h = sched.current()
        local t0 = sched.now()
        local deadline = t0 + T(2.5)
        r = { sched.wait(h, deadline) }
        r.late = sched.now() - deadline
      end)
      assert.same({ nil, "timeout" }, { r[1], r[2] })
      assert.is_true(r.late >= 0, "returned " .. r.late .. "s before the deadline")
    end)

    it("wait with a past deadline returns at once", function()
      local r
      run(function(sched)
        r = { sched.wait(sched.current(), sched.now() - 1) }
      end)
      assert.same({ nil, "timeout" }, { r[1], r[2] })
    end)

    it("wait returns true when woken before its deadline", function()
      local r
      run(function(sched)
        local h = sched.current()
        sched.spawn(function() sched.sleep(T(0.5)); sched.wake(h) end)
        local t0 = sched.now()
        r = { sched.wait(h, t0 + T(100)) }
        r.elapsed = sched.now() - t0
      end)
      assert.same({ true }, { r[1] })
      H.time(S, 0.5, r.elapsed, "woken after")
    end)

    it("wake of a dead coroutine returns false", function()
      run(function(sched)
        local co = coroutine.create(function() end)
        coroutine.resume(co)
        assert.is_false(sched.wake(co))
      end)
    end)

    it("starts tasks in spawn order, with their arguments", function()
      local log = {}
      run(function(sched)
        for i = 1, 5 do
          sched.spawn(function(a, b, c) log[#log + 1] = { i, a, b, c } end, i * 10, nil, "x")
        end
      end)
      assert.same({ { 1, 10, nil, "x" }, { 2, 20, nil, "x" }, { 3, 30, nil, "x" },
                    { 4, 40, nil, "x" }, { 5, 50, nil, "x" } }, log)
    end)

    it("sleep(0) lets the tasks that are ready run first", function()
      local log = {}
      run(function(sched)
        for i = 1, 3 do sched.spawn(function() log[#log + 1] = i end) end
        sched.sleep(0)
        log[#log + 1] = "main"
      end)
      assert.same({ 1, 2, 3, "main" }, log)
    end)

    it("sleep(s) lasts at least s, and sleepers wake in deadline order", function()
      local log = {}
      run(function(sched)
        local t0 = sched.now()
        for _, d in ipairs { 3, 1, 2 } do
          sched.spawn(function() sched.sleep(T(d)); log[#log + 1] = d end)
        end
        sched.sleep(T(4))
        log.elapsed = sched.now() - t0
      end)
      assert.same({ 1, 2, 3 }, { log[1], log[2], log[3] })
      H.time(S, 4, log.elapsed, "sleep(4)")
    end)

    it("a wake does not cut a sleep short; it is kept for the next wait", function()
      local r
      run(function(sched)
        local h = sched.current()
        sched.spawn(function() sched.wake(h) end)
        local t0 = sched.now()
        sched.sleep(T(1))
        r = { slept = sched.now() - t0, sched.wait(h, sched.now() + T(5)) }
      end)
      H.time(S, 1, r.slept, "sleep(1)")
      assert.is_true(r[1])
    end)

    it("run() re-raises a task's error with its traceback; the others go on at the next run()", function()
      local sched = S.new()
      local done = false
      sched.spawn(function() sched.sleep(T(0.1)); error("task boom") end)
      -- (far apart: on a busy machine a real-clock loop can find both
      -- timers due in one turn, and the second task would finish first)
      sched.spawn(function() sched.sleep(T(3)); done = true end)
      local ok, err = pcall(sched.run)
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find("task boom", 1, true), tostring(err))
      assert.is_truthy(tostring(err):find("traceback", 1, true), tostring(err))
      assert.is_false(done)
      sched.run()
      assert.is_true(done)
    end)

    it("run() does not wait for a background task", function()
      local sched = S.new()
      local bg = 0
      sched.background(function()
        bg = 1
        sched.sleep(T(1000))
        bg = 2
      end)
      local t0 = sched.now()
      S.run(sched, function() sched.sleep(T(0.2)) end)
      assert.equal(1, bg)
      assert.is_true(sched.now() - t0 < T(1000))
    end)

    it("follows a nested coroutine whose yields pass through its task (Lua 5.1 pcall style)", function()
      local r = {}
      run(function(sched)
        local nested
        sched.spawn(function()
          sched.sleep(T(2))
          sched.wake(nested)
        end)
        r.ok, r[1], r[2], r[3] = passthrough(function()
          nested = sched.current()
          assert.equal(coroutine.running(), nested)
          local a, b = sched.wait(nested, sched.now() + T(1)) -- times out
          sched.sleep(T(0.5))
          return a, b, sched.wait(nested)                     -- woken by the other task
        end)
      end)
      assert.is_true(r.ok, r[1])
      assert.same({ nil, "timeout", true }, { r[1], r[2], r[3] })
    end)

    describe("with a pool", function()
      it("a nested acquire inside pool:with waits and is served" ..
         (PUC51 and " (through the driver's pass-through coroutine)" or ""), function()
        local got = {}
        run(function(sched)
          local outer = clientpool.new { create = function() return { name = "outer" } end,
                                         max_live = 1, scheduler = sched }
          local inner = clientpool.new { create = function() sched.sleep(T(0.1)); return { name = "inner" } end,
                                         max_live = 1, scheduler = sched }
          local held = assert(inner:acquire())
          sched.spawn(function()
            sched.sleep(T(1))
            held:release()
          end)
          local t0 = sched.now()
          got.r = { outer:with(nil, function(client)
            local l, code = inner:acquire(nil, { timeout = T(50) })
            assert(l, code)
            local name = l.client.name
            l:release()
            return client.name, name
          end) }
          got.elapsed = sched.now() - t0
          got.stats = inner:stats()
          outer:close()
          inner:close()
        end)
        assert.same({ "outer", "inner" }, got.r)
        H.time(S, 1, got.elapsed, "the nested wait")
        assert.equal(1, got.stats.wait_count)
        assert.equal(0, got.stats.timeouts)
      end)

      it("a nested acquire inside pool:with times out and is cancelled through the adapter", function()
        local got = {}
        run(function(sched)
          local outer = clientpool.new { create = function() return {} end, max_live = 1, scheduler = sched }
          local inner = clientpool.new { create = function() return {} end, max_live = 1, scheduler = sched }
          local held = assert(inner:acquire())
          local token = clientpool.token()
          sched.spawn(function() sched.sleep(T(2)); token:cancel() end)
          local t0 = sched.now()
          got.codes = { outer:with(nil, function()
            local _, c1 = inner:acquire(nil, { timeout = T(0.5) })
            local t1 = sched.now()
            local _, c2 = inner:acquire(nil, { cancel = token })
            return c1, c2, t1
          end) }
          got.t0 = t0
          got.t2 = sched.now()
          held:release()
          local s = inner:stats()
          got.timeouts, got.cancelled, got.idle = s.timeouts, s.cancelled, s.idle
          outer:close()
          inner:close()
        end)
        assert.equal("timeout", got.codes[1])
        assert.equal("cancelled", got.codes[2])
        H.time(S, 0.5, got.codes[3] - got.t0, "the timeout")
        H.time(S, 2, got.t2 - got.t0, "the cancel")
        assert.equal(1, got.timeouts)
        assert.equal(1, got.cancelled)
        assert.equal(1, got.idle)
      end)

      it("many tasks share a small pool; the pool's timer retires idle clients", function()
        local got = {}
        run(function(sched)
          local created, destroyed = 0, 0
          local pool = clientpool.new {
            create = function() created = created + 1; sched.sleep(T(0.05)); return { id = created } end,
            destroy = function() destroyed = destroyed + 1 end,
            max_live = 3, idle_timeout = T(3), scheduler = sched,
          }
          local done = 0
          for i = 1, 60 do
            sched.spawn(function()
              sched.sleep(T((i % 7) / 10))
              local l = assert(pool:acquire(nil, { timeout = T(100) }))
              sched.sleep(T(0.02))
              l:release()
              done = done + 1
            end)
          end
          while done < 60 do sched.sleep(T(0.1)) end
          got.mid = H.check(pool)
          sched.sleep(T(4))
          got.after = H.check(pool)
          got.created, got.destroyed = created, destroyed
        end)
        assert.is_true(got.mid.opened <= 3)
        assert.equal(0, got.mid.leases)
        assert.equal(0, got.after.live)
        assert.equal(got.created, got.destroyed)
        assert.equal(got.created, got.after.closed_by.idle)
      end)
    end)
  end)
end
