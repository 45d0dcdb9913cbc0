-- clientpool.events: the event pump, the handler table the driver's files
-- fill (one handler per engine event they own), and the pool's timer task.

local clientpool = require "clientpool"
local base = require "clientpool.base"
local events = require "clientpool.events"
local Loop = require "clientpool.loop"

local core = base.core

describe("clientpool.events", function()
  it("has a handler for every engine event the driver acts on once it is loaded", function()
    for _, ev in ipairs { "EV_WAKE", "EV_DESTROY", "EV_TIMER", "EV_KEY_FREE", "EV_LEAK", "EV_REFILL", "EV_LOST" } do
      assert.is_function(events.on[core[ev]], ev)
    end
    -- EV_CREATED is the engine's own news: nothing to carry out
    assert.is_nil(events.on[core.EV_CREATED])
  end)

  it("dispatches each event to its handler, in order; one without a handler is passed over", function()
    local sched = Loop.new { clock = "virtual" }
    local pool = clientpool.new { create = function() return {} end, destroy = function() end,
                                  max_live = 1, max_idle = 0, scheduler = sched }
    local seen = {}
    local destroy = events.on[core.EV_DESTROY]
    events.on[core.EV_CREATED] = function(self, _, a) seen[#seen + 1] = { "created", self == pool, a } end
    events.on[core.EV_DESTROY] = function(self, ...)
      seen[#seen + 1] = { "destroy", self == pool }
      return destroy(self, ...)
    end
    local ok, err = pcall(function()
      local l = assert(pool:acquire())
      l:release()                  -- max_idle 0: destroyed
    end)
    events.on[core.EV_CREATED] = nil
    events.on[core.EV_DESTROY] = destroy
    assert(ok, err)
    assert.equal(2, #seen)
    assert.same({ "created", true }, { seen[1][1], seen[1][2] })
    assert.same({ "destroy", true }, seen[2])
    assert.equal(1, pool:stats().closed_by.max_idle)
    events.pump(pool)              -- nothing queued: a no-op
  end)

  -- The engine's events carry a waiter's generation (a uint32) in an int32
  -- field: past 2^31 waits on a slot (hours of a busy pool on slot 0) it
  -- arrives negative, and a wake that did not match the waiter's
  -- generation was dropped: the waiter slept until its timeout. Here every
  -- wake is handed over as the engine would send generation + 2^32 (the
  -- same uint32).
  it("a wake whose generation passed 2^31 (the event's int32) still wakes its waiter", function()
    local sched = Loop.new { clock = "virtual" }
    local pool = clientpool.new { create = function() return {} end, max_live = 1, acquire_timeout = 10,
                                  scheduler = sched }
    local wake = events.on[core.EV_WAKE]
    events.on[core.EV_WAKE] = function(self, e, a, b, ...)
      if b >= 0 and b < 2 ^ 31 then b = b - 2 ^ 32 end
      return wake(self, e, a, b, ...)
    end
    local got, waited
    local ok, err = pcall(function()
      local held = assert(pool:acquire())
      sched.spawn(function()
        local t0 = sched.now()
        local lease, e2 = pool:acquire()
        got, waited = lease or e2, sched.now() - t0
        if lease then lease:release() end
      end)
      sched.spawn(function()
        sched.sleep(1)
        held:release()
      end)
      sched.run()
    end)
    events.on[core.EV_WAKE] = wake
    assert(ok, err)
    assert.is_table(got)
    assert.equal(1, waited)
    assert.equal(0, pool:stats().timeouts)
  end)

  it("the pool's timer retires an idle client at idle_timeout, with no acquire to look", function()
    local sched = Loop.new { clock = "virtual" }
    local pool = clientpool.new { create = function() return {} end, max_live = 1, idle_timeout = 2,
                                  scheduler = sched }
    sched.spawn(function()
      assert(pool:acquire()):release()
      sched.sleep(3)
    end)
    sched.run()
    local s = pool:stats()
    assert.equal(1, s.closed_by.idle)
    assert.equal(0, s.live)
  end)

  it("wake_drainers wakes drain() once no lease is held", function()
    local sched = Loop.new { clock = "virtual" }
    local pool = clientpool.new { create = function() return {} end, max_live = 1, scheduler = sched }
    local r = {}
    local held = assert(pool:acquire())
    sched.spawn(function() r.ok = pool:drain(); r.at = sched.now() end)
    sched.spawn(function() sched.sleep(1); held:release() end)
    sched.run()
    assert.same({ ok = true, at = 1 }, r)
  end)

  ---------------------------------------------------------------------------
  -- Destroy starts at once (DESIGN section 3 "Release", issue 12 findings 1
  -- and 2): a destroy hook runs in the caller's context when the destroy
  -- starts, and goes to the scheduler only if it yields. In a plain script
  -- (no loop.run()) release(false) and close() returned without calling
  -- destroy, and the room of a client being closed came a turn later.
  describe("destroy starts at once", function()
    -- hooks that count the clients open; destroy runs `slow` (a function
    -- of the hook's sched) when given
    local function counting(slow)
      local c = { open = 0, peak = 0, n = 0, destroyed = 0, keys = {} }
      function c.create()
        c.n = c.n + 1
        c.open = c.open + 1
        if c.open > c.peak then c.peak = c.open end
        return { id = c.n }
      end
      function c.destroy(client, key)
        if slow then slow(client) end
        c.destroyed = c.destroyed + 1
        c.open = c.open - 1
        c.keys[#c.keys + 1] = key or "(default)"
      end
      return c
    end

    -- A hook that re-enters the pool through a coroutine of its own (as
    -- the pool's bounded acquisitions and try_acquire do) must not start
    -- the queued destroys inside itself: one nested hook per queued
    -- destroy grows the C stack until a resume fails (a review found it
    -- when the check looked at the running coroutine alone).
    it("a hook re-entering the pool from a nested coroutine runs no queued destroy inside itself", function()
      local depth, deepest, held = 0, 0, nil
      local pool
      pool = clientpool.new {
        create = function() return {} end, max_live = 8,
        destroy = function()
          depth = depth + 1
          if depth > deepest then deepest = depth end
          if held then
            local l = held
            held = nil
            coroutine.wrap(function() l:release() end)()   -- max_idle 0: queues its destroy too
          end
          depth = depth - 1
        end,
      }
      local ls = {}
      for i = 1, 4 do ls[i] = assert(pool:try_acquire()) end
      for i = 1, 3 do ls[i]:release() end
      held = ls[4]
      pool:configure { max_idle = 0 }       -- the 3 idle ones: destroys queued, the first runs
      assert.are.equal(1, deepest)
      local s = pool:stats()
      assert.are.same({ live = 0, closing = 0 }, { live = s.live, closing = s.closing })
    end)

    it("in a plain script: release(false), destroy() and close() have closed their clients when they return", function()
      local c = counting()
      local pool = clientpool.new { create = c.create, destroy = c.destroy, max_live = 2 }
      local a, b = assert(pool:acquire()), assert(pool:acquire())
      a:release(false)
      assert.equal(1, c.destroyed)
      b:destroy()
      assert.equal(2, c.destroyed)
      local s = pool:stats()
      assert.equal(0, s.closing)
      assert.equal(0, s.live)
      assert(pool:acquire()):release()
      assert(pool:acquire("k")):release()
      assert.equal(2, pool:stats().idle)
      pool:close()                              -- no loop runs: idle clients closed all the same
      assert.equal(4, c.destroyed)
      assert.equal(0, c.open)
      assert.equal(0, pool:stats().closing)
    end)

    it("max_live = 1: three acquire(); release(false) in one turn never hold 2 clients and never wait", function()
      local sched = Loop.new { clock = "virtual" }
      local c = counting()
      local pool = clientpool.new { create = c.create, destroy = c.destroy, max_live = 1, scheduler = sched }
      local r = {}
      sched.spawn(function()
        local t0 = sched.now()
        for _ = 1, 3 do
          local l = assert(pool:acquire(nil, { timeout = 1 }))
          r[#r + 1] = l.client.id
          l:release(false)
        end
        r.t = sched.now() - t0
      end)
      sched.run()
      assert.same({ 1, 2, 3 }, { r[1], r[2], r[3] })
      assert.equal(0, r.t)
      assert.equal(1, c.peak)
      assert.equal(3, c.destroyed)
      assert.equal(0, pool:stats().wait_count)
      -- and outside any coroutine, where a wait would raise
      for _ = 1, 3 do assert(pool:acquire()):release(false) end
      assert.equal(6, c.destroyed)
      assert.equal(1, c.peak)
    end)

    it("in a plain script an acquisition that evicts another key's idle client takes its room at once", function()
      for _, with_hook in ipairs { true, false } do
        local c = counting()
        local pool = clientpool.new { create = c.create, destroy = with_hook and c.destroy or nil, max_live = 1 }
        assert(pool:acquire("a")):release()
        local l = assert(pool:acquire("b"))     -- (it raised "acquire would wait": a wait for the eviction)
        assert.equal(2, l.client.id)
        assert.equal(1, pool:stats().closed_by.evicted)
        if with_hook then assert.equal(1, c.destroyed) end
        l:release()
        pool:close()
      end
    end)

    it("max_idle overflow and a failed validate run the destroy hook before the call returns", function()
      local c = counting()
      local valid = true
      local pool = clientpool.new { create = c.create, destroy = c.destroy, max_live = 3, max_idle = 1,
                                    validate = function() return valid end }
      local a, b = assert(pool:acquire()), assert(pool:acquire())
      a:release()
      b:release()                               -- max_idle 1: closed
      assert.equal(1, c.destroyed)
      assert.equal(1, pool:stats().closed_by.max_idle)
      valid = false
      local l = assert(pool:acquire())          -- the idle one fails validate: closed, a new one made
      assert.equal(2, c.destroyed)
      assert.equal(3, l.client.id)
      assert.equal(1, pool:stats().closed_by.invalid)
      l:release(false)
      pool:close()
      assert.equal(0, c.open)
    end)

    it("idle expiry runs the hook in the timer's turn; a collected lease's, in the next pool call", function()
      local sched = Loop.new { clock = "virtual" }
      local c = counting()
      local pool = clientpool.new { create = c.create, destroy = c.destroy, max_live = 2, idle_timeout = 2,
                                    scheduler = sched }
      local r = {}
      sched.spawn(function()
        assert(pool:acquire()):release()
        sched.sleep(2.5)
        r.idle_destroyed, r.closing = c.destroyed, pool:stats().closing
      end)
      sched.run()
      assert.equal(1, r.idle_destroyed)
      assert.equal(0, r.closing)
      -- a lease the collector finds: the finalizer only schedules; the
      -- next call into the pool carries it out, hook included
      local co = coroutine.create(function() assert(pool:acquire()) end)
      assert(coroutine.resume(co))
      co = nil -- luacheck: ignore 311
      for _ = 1, 4 do collectgarbage("collect") end
      assert.equal(1, c.destroyed)              -- not inside the collector
      local s = pool:stats()
      assert.equal(1, s.leaked)
      assert.equal(2, c.destroyed)
      assert.equal(0, s.closing + s.live)
      pool:close()
    end)

    it("a hook that yields goes on as a task, its client counted until it returns", function()
      local sched = Loop.new { clock = "virtual" }
      local c = counting(function() sched.sleep(0.5) end)
      local pool = clientpool.new { create = c.create, destroy = c.destroy, max_live = 1, scheduler = sched }
      local l = assert(pool:acquire())
      l:release(false)                          -- outside any coroutine: release never yields
      assert.equal(0, c.destroyed)
      assert.equal(1, pool:stats().closing)
      local r = {}
      sched.spawn(function()
        local t0 = sched.now()
        local l2 = assert(pool:acquire(nil, { timeout = 5 }))
        r.waited = sched.now() - t0
        r.destroyed = c.destroyed
        l2:release()
      end)
      sched.run()
      assert.equal(0.5, r.waited)
      assert.equal(1, r.destroyed)
      assert.equal(1, c.peak)
      pool:close()
    end)

    it("hooks run after the events are carried out, and may re-enter the pool", function()
      local c = counting()
      local pool
      local seen = {}
      local inner = c.destroy
      c.destroy = function(client, key)
        local s = pool:stats()                  -- consistent: the client is closing, not live
        seen[#seen + 1] = { id = client.id, closing = s.closing, live = s.live, idle = s.idle }
        if client.id == 1 then
          local l = assert(pool:acquire("again"))   -- a hook may call back into the pool
          seen.again = l.client.id
          l:release()
        end
        inner(client, key)
      end
      pool = clientpool.new { create = c.create, destroy = c.destroy, max_live = 3 }
      local a, b = assert(pool:acquire()), assert(pool:acquire())
      a:release(false)
      assert.same({ id = 1, closing = 1, live = 1, idle = 0 }, seen[1])
      assert.equal(3, seen.again)
      assert.equal(1, c.destroyed)
      b:release()
      pool:close()                              -- two idle clients: both closing when the first hook runs
      assert.equal(3, #seen)
      assert.same({ closing = 2, live = 0, idle = 0 }, { closing = seen[2].closing, live = seen[2].live,
                                                          idle = seen[2].idle })
      assert.equal(3, c.destroyed)
      assert.equal(0, c.open)
      assert.equal(0, pool:stats().closing)
    end)

    it("hooks that call into the pool run one after another, not nested (close() of 1000 idle clients)", function()
      local pool
      local n, depth, max_depth = 0, 0, 0
      pool = clientpool.new { create = function() return {} end, max_live = 1000,
                              destroy = function()
                                depth = depth + 1
                                if depth > max_depth then max_depth = depth end
                                n = n + 1
                                pool:stats()          -- pumps: must not start the next hook in this one
                                depth = depth - 1
                              end }
      local ls = {}
      for i = 1, 1000 do ls[i] = assert(pool:acquire()) end
      for i = 1, 1000 do ls[i]:release() end
      pool:close()
      assert.equal(1000, n)
      assert.equal(1, max_depth)                -- (nested, Lua 5.4 hit "C stack overflow" at about 100)
      assert.equal(0, pool:stats().closing)
    end)

    it("where the host cannot yield at all (adapter yieldable() false), the hook goes to the scheduler", function()
      local sched = Loop.new { clock = "virtual" }
      local adapter = setmetatable({ yieldable = function() return false end }, { __index = sched })
      local c = counting()
      local pool = clientpool.new { create = c.create, destroy = c.destroy, max_live = 1, scheduler = adapter }
      assert(pool:acquire()):release(false)
      assert.equal(0, c.destroyed)
      assert.equal(1, pool:stats().closing)
      sched.run()
      assert.equal(1, c.destroyed)
      assert.equal(0, pool:stats().closing)
    end)

    it("a destroy hook that raises is logged and its room freed at once", function()
      local logged = {}
      local sched = Loop.new { clock = "virtual" }
      local adapter = setmetatable({ log = function(m) logged[#logged + 1] = m end }, { __index = sched })
      local pool = clientpool.new { create = function() return {} end, max_live = 1, scheduler = adapter,
                                    destroy = function() error("boom") end }
      assert(pool:acquire()):release(false)
      assert.equal(0, pool:stats().closing)
      assert.truthy(tostring(logged[1]):find("destroy hook failed", 1, true))
      assert.truthy(tostring(logged[1]):find("boom", 1, true))
      assert(pool:acquire()):release(false)     -- room again, no wait
      assert.equal(2, #logged)
    end)
  end)
end)
