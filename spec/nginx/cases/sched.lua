-- The ngx scheduler adapter on its own, in a real nginx.
local H = require "harness"
local sched = require "clientpool.sched.ngx"
local app = require "app"

local function probe(path, name, fn)
  app.probes[name] = fn
  ngx.shared.spec:delete(name)
  local status, body = H.http(path .. "?probe=" .. name)
  assert.are.equal(200, status)
  return body
end

describe("current()", function()
  it("gives a handle in the content phase and in a timer", function()
    assert.is_table((sched.current()))
    local got
    ngx.timer.at(0, function() got = sched.current() and "handle" or "nil" end)
    assert.truthy(H.wait_until(function() return got end, 2))
    assert.are.equal("handle", got)
  end)

  it("gives a handle in rewrite and access phases", function()
    local fn = function() local h, why = sched.current(); return h and "handle" or why end
    assert.are.equal("handle\n", probe("/phase/rewrite", "cur_rewrite", fn))
    assert.are.equal("handle\n", probe("/phase/access", "cur_access", fn))
  end)

  it("names the phase where it cannot wait", function()
    local fn = function() local h, why = sched.current(); return h and "handle" or why end
    assert.are.equal("cannot wait in the set phase\n", probe("/phase/set", "cur_set", fn))
    probe("/phase/log", "cur_log", fn)
    assert.are.equal("cannot wait in the log phase",
      H.wait_until(function() return ngx.shared.spec:get("cur_log") end))
    probe("/phase/header_filter", "cur_hf", fn)
    assert.are.equal("cannot wait in the header_filter phase", ngx.shared.spec:get("cur_hf"))
    probe("/phase/body_filter", "cur_bf", fn)
    assert.are.equal("cannot wait in the body_filter phase", ngx.shared.spec:get("cur_bf"))
    assert.are.equal("cannot wait in the init_worker phase", ngx.shared.spec:get("init_worker:current"))
  end)
end)

describe("wait() and wake()", function()
  it("times out at the deadline, not before", function()
    local h = sched.current()
    local t0 = sched.now()
    local ok, err = sched.wait(h, t0 + 0.05)
    local took = sched.now() - t0
    assert.is_nil(ok)
    assert.are.equal("timeout", err)
    assert.is_true(took >= 0.05, "woke after " .. took)
    assert.is_true(took < 0.5, "woke after " .. took)
  end)

  it("returns at once for a past deadline", function()
    local h = sched.current()
    assert.are.same({ nil, "timeout" }, { sched.wait(h, sched.now() - 1) })
  end)

  it("remembers a wake that came before the wait (once)", function()
    local h = sched.current()
    assert.is_true(sched.wake(h))
    assert.is_true(sched.wake(h))
    local t0 = sched.now()
    assert.is_true(sched.wait(h, t0 + 1))
    assert.is_true(sched.now() - t0 < 0.05)
    -- two wakes before the wait count once
    assert.are.same({ nil, "timeout" }, { sched.wait(h, sched.now() + 0.02) })
  end)

  it("wakes a light thread that waits", function()
    local h = sched.current() -- the handle of the test's thread, unused
    local hw, result
    local t = ngx.thread.spawn(function()
      hw = sched.current()
      result = { sched.wait(hw, sched.now() + 5) }
    end)
    assert.is_table(hw)
    assert.is_nil(result)
    assert.is_true(sched.wake(hw))
    ngx.thread.wait(t)
    assert.are.same({ true }, result)
    assert.is_table(h)
  end)

  it("wakes a waiter in another request", function()
    local th = ngx.thread.spawn(function() return H.http("/app/sched_wait?id=x1&timeout=5") end)
    assert.truthy(H.wait_until(function() return app.handles.x1 end, 2))
    ngx.sleep(0.01)
    assert.is_true(sched.wake(app.handles.x1))
    local _, status, body = ngx.thread.wait(th)
    assert.are.equal(200, status)
    assert.are.equal("woken\n", body)
  end)

  it("wake() returns false once the waiting light thread was killed", function()
    local hw
    local t = ngx.thread.spawn(function()
      hw = sched.current()
      sched.wait(hw, sched.now() + 5)
      error("never resumed")
    end)
    assert.truthy(ngx.thread.kill(t))
    assert.is_false(sched.wake(hw))
    assert.is_false(sched.wake(hw))
  end)

  it("a wake posted before the waiter was killed is reported to the lost callback", function()
    local hw
    local t = ngx.thread.spawn(function()
      hw = sched.current()
      sched.wait(hw, sched.now() + 5)
    end)
    local got
    assert.is_true(sched.wake(hw, function(a, b) got = { a, b } end, "w", 7))
    -- killed after the post, before the posted event resumes it
    assert.truthy(ngx.thread.kill(t))
    assert.truthy(H.wait_until(function() return got end, 2))
    assert.are.same({ "w", 7 }, got)
    assert.is_false(sched.wake(hw))
  end)

  it("no lost report when the woken waiter resumed", function()
    local hw, res
    local t = ngx.thread.spawn(function()
      hw = sched.current()
      res = sched.wait(hw, sched.now() + 5)
    end)
    local got
    assert.is_true(sched.wake(hw, function() got = true end))
    ngx.thread.wait(t)
    ngx.sleep(0.02)
    assert.is_true(res)
    assert.is_nil(got)
  end)
end)

describe("semaphores", function()
  it("are recycled, not made per wait", function()
    collectgarbage()
    sched._sweep()
    local before = sched.stats().semaphores
    for i = 1, 2000 do
      local h = sched.current()
      sched.wake(h)
      assert(sched.wait(h, sched.now() + 1))
      if i % 200 == 0 then collectgarbage() end
    end
    collectgarbage()
    sched._sweep()
    local s = sched.stats()
    assert.is_true(s.semaphores - before < 300, "made " .. (s.semaphores - before) .. " semaphores for 2000 waits")
    assert.is_true(s.free > 0)
  end)

  it("done() gives the semaphore back at once", function()
    local s0 = sched.stats().semaphores
    for _ = 1, 500 do
      local h = sched.current()
      sched.wake(h)
      sched.wait(h, sched.now() + 1)
      sched.done(h)
    end
    assert.is_true(sched.stats().semaphores - s0 <= 1)
  end)

  it("done() keeps the handle's table for the next current(), with nothing of its wait", function()
    local h = sched.current()
    sched.wake(h)                       -- a post never taken: not the next wait's
    sched.done(h)
    local h2 = sched.current()
    assert.are.equal(h, h2)             -- the same table: no allocation per wait
    assert.are.same({ nil, "timeout" }, { sched.wait(h2, sched.now() + 0.01) })
    assert.is_true(sched.wake(h2))
    assert.is_true(sched.wait(h2, sched.now() + 1))
    sched.done(h2)
    -- a handle that died (its wait's thread killed) is not kept
    local dead = sched.current()
    local t = ngx.thread.spawn(function() sched.wait(dead, sched.now() + 5) end)
    ngx.thread.kill(t)
    assert.is_false(sched.wake(dead))
    sched.done(dead)
    assert.are_not.equal(dead, sched.current())
  end)

  -- TASKS light threads hand one client (max_live = 1) round, ROUNDS times
  -- each, with the collector stopped: what a handoff leaves behind shows.
  -- probe(), if given, runs in each thread after each release.
  local function ring(tasks, rounds, probe_fn)
    local clientpool = require "clientpool"
    local pool = clientpool.new { max_live = 1, max_waiting = tasks, create = function() return {} end }
    local first = true
    local threads = {}
    collectgarbage("stop")
    local ok, err = pcall(function()
      for i = 1, tasks do
        threads[i] = ngx.thread.spawn(function()
          for _ = 1, rounds do
            local lease = assert(pool:acquire())
            if first then first = false; ngx.sleep(0) end
            lease:release()
            if probe_fn then probe_fn() end
          end
        end)
      end
      for i = 1, tasks do assert(ngx.thread.wait(threads[i])) end
    end)
    collectgarbage("restart")
    assert(ok, err)
    local waits = pool:stats().wait_count
    pool:close()
    return waits
  end

  it("a pool gives a waiter's semaphore back when its wait ends, not at a collection", function()
    collectgarbage()
    sched._sweep()
    local before = sched.stats().semaphores
    local waits = ring(50, 20)
    assert.is_true(waits >= 900, "waits: " .. waits)
    local made = sched.stats().semaphores - before
    -- at most one per waiting thread (and a spare); one per wait without done()
    assert.is_true(made <= 55, "made " .. made .. " semaphores for " .. waits .. " waits")
  end)

  it("the lost-wake watch holds only the wakes still on their way", function()
    local most = 0
    local waits = ring(50, 20, function()
      local w = sched.stats().watching
      if w > most then most = w end
    end)
    assert.is_true(waits >= 900, "waits: " .. waits)
    -- the handoffs of one event-loop turn: one wake on its way at a time
    assert.is_true(most <= 2, "watching " .. most .. " handles after " .. waits .. " handoffs")
  end)

  -- Not a timing test: what LuaJIT's recorder gave up on, from jit.v.
  it("a handoff's traces do not abort on a loop in the adapter's wait or the driver's", function()
    local file = H.conf.run .. "/jitv-handoff.txt"
    os.remove(file)
    local v = require "jit.v"
    jit.flush()
    v.on(file)
    local ok, err = pcall(ring, 50, 40)
    v.off()
    assert(ok, err)
    local bad = {}
    for line in io.lines(file) do
      if line:find("inner loop in root trace at ngx.lua", 1, true) or
         line:find("inner loop in root trace at init.lua", 1, true) then
        bad[#bad + 1] = line
      end
    end
    assert.are.same({}, bad)
  end)

  it("a killed waiter's semaphore is taken back by a sweep", function()
    local threads = {}
    for i = 1, 20 do
      threads[i] = ngx.thread.spawn(function()
        local h = sched.current()
        app.handles["k" .. i] = h
        sched.wait(h, sched.now() + 10)
      end)
    end
    for i = 1, 20 do ngx.thread.kill(threads[i]) end
    local free0 = sched.stats().free
    sched._sweep()
    assert.is_true(sched.stats().free >= free0 + 20)
    for i = 1, 20 do
      assert.is_false(sched.wake(app.handles["k" .. i]))
      app.handles["k" .. i] = nil
    end
  end)
end)

describe("spawn()", function()
  it("runs at once in a light thread of the request", function()
    local ran
    sched.spawn(function(a) ran = a end, "now")
    assert.are.equal("now", ran)
  end)

  it("runs in a timer from the log phase and from init_worker", function()
    probe("/phase/log", "spawn_log", function()
      sched.spawn(function() ngx.shared.spec:set("spawn_log:ran", ngx.get_phase()) end)
      return "spawned"
    end)
    assert.are.equal("timer", H.wait_until(function() return ngx.shared.spec:get("spawn_log:ran") end))
    assert.are.equal("timer", ngx.shared.spec:get("init_worker:spawned_phase"))
  end)

  it("an error in a task is logged, not raised", function()
    assert.has_no.errors(function() sched.spawn(function() error("task boom") end) end)
  end)
end)

describe("background() and sleep()", function()
  it("background runs in a timer that outlives the request", function()
    local phase
    sched.background(function() ngx.sleep(0.01); phase = ngx.get_phase() end)
    assert.are.equal("timer", H.wait_until(function() return phase end, 2))
  end)

  it("sleep sleeps; now() is monotonic seconds", function()
    local t0 = sched.now()
    sched.sleep(0.02)
    local d = sched.now() - t0
    assert.is_true(d >= 0.019 and d < 0.5, "slept " .. d)
    assert.is_true(sched.monotonic)
  end)
end)
