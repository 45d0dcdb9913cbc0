-- clientpool: the cap is physical (DESIGN.md section 3, issue 12). A client
-- counts against max_live from its reservation until its destroy hook has
-- returned or failed; stats().closing counts the clients being closed. The
-- hooks count the clients the upstream would see: create increments before
-- it returns, destroy decrements when it returns.

local clientpool = require "clientpool"
local loop = require "clientpool.loop"

-- hooks that count clients open at once; destroy takes `slow` seconds (a
-- graceful QUIT round trip) and fails every `fail_every`-th time
local function counting(sched, slow, fail_every)
  local c = { open = 0, peak = 0, created = 0, destroyed = 0 }
  function c.create(key)
    c.open = c.open + 1
    if c.open > c.peak then c.peak = c.open end
    c.created = c.created + 1
    return { id = c.created, key = key }
  end
  function c.destroy()
    if slow then sched.sleep(slow) end
    c.destroyed = c.destroyed + 1
    c.open = c.open - 1
    if fail_every and c.destroyed % fail_every == 0 then error("destroy failed") end
  end
  return c
end

-- the adapter, with destroy-hook errors logged to a list instead of stderr
local function quiet(sched, logged)
  return setmetatable({ log = function(msg) logged[#logged + 1] = msg end }, { __index = sched })
end

local function run(fn)
  local sched = loop.new { clock = "virtual" }
  sched.spawn(fn, sched)
  sched.run()
end

describe("clientpool: the cap is physical", function()
  it("never has more than max_live clients with a slow destroy hook (issue 12: 14 of 2)", function()
    run(function(sched)
      local c = counting(sched, 0.5)
      local pool = clientpool.new { create = c.create, destroy = c.destroy, max_live = 2,
                                    scheduler = sched }
      local done = 0
      for i = 1, 20 do
        sched.spawn(function()
          for _ = 1, 3 do
            local l = assert(pool:acquire(i % 2 == 0 and "a" or "b", { timeout = 100 }))
            sched.sleep(0.1)
            l:release(false)
          end
          done = done + 1
        end)
      end
      local seen_closing = 0
      while done < 20 do
        sched.sleep(0.05)
        local s = pool:stats()
        assert(s.live + s.creating + s.closing <= 2, "live + creating + closing > max_live")
        assert(c.open <= 2, "the hooks count " .. c.open .. " clients")
        if s.closing > seen_closing then seen_closing = s.closing end
      end
      sched.sleep(1)
      assert.equal(2, c.peak)
      assert.equal(60, c.created)
      assert.equal(60, c.destroyed)
      assert.is_true(seen_closing > 0)
      local s = pool:stats()
      assert.equal(0, s.closing)
      assert.equal(0, s.live)
      pool:close()
    end)
  end)

  it("counts a client until its destroy hook returns, then serves the waiter from its room", function()
    run(function(sched)
      local c = counting(sched, 0.5, 1)            -- every destroy takes 0.5 s and fails
      local logged = {}
      local pool = clientpool.new { create = c.create, destroy = c.destroy, max_live = 1,
                                    scheduler = quiet(sched, logged) }
      local l = assert(pool:acquire())
      local got, at
      sched.spawn(function()
        local l2 = assert(pool:acquire(nil, { timeout = 5 }))
        got, at = l2.client.id, sched.now()
        l2:release()
      end)
      sched.sleep(0.1)
      local t0 = sched.now()
      l:release(false)
      local s = pool:stats()
      assert.equal(0, s.live)
      assert.equal(1, s.closed)
      assert.equal(1, s.closing)
      local kc = 0
      for _, ks in pairs(s.keys) do kc = kc + ks.closing end
      assert.equal(1, kc)
      sched.sleep(0.25)
      assert.is_nil(got)                            -- still closing: no room
      assert.equal(1, c.open)
      sched.sleep(0.5)
      assert.equal(2, got)                          -- served once the hook returned (and failed)
      assert.is_true(at - t0 >= 0.5)
      assert.equal(0, pool:stats().closing)
      assert.equal(1, c.peak)
      assert.is_truthy(tostring(logged[1]):find("destroy hook failed", 1, true))
      pool:close()
      sched.sleep(1)
      assert.equal(0, c.open)
    end)
  end)

  it("closes at once without a destroy hook: stats show nothing closing", function()
    local pool = clientpool.new { create = function() return {} end, max_live = 1 }
    for _ = 1, 3 do
      local l = assert(pool:acquire())
      l:release(false)
      assert.equal(0, pool:stats().closing)
    end
    assert.equal(3, pool:stats().opened)
    pool:close()
  end)
end)

-- The hard cap on every host (issue 12 "Proof"): random slow, instant and
-- failing destroy hooks, counted in the hooks (create increments before it
-- returns, destroy decrements when it returns or raises). On the virtual
-- loop and, where their libraries load, cqueues, luv and copas on their
-- real clocks (times scaled by S.scale). nginx has its own suite.
local H = require "spec.helpers"

for _, M in ipairs(H.missing_schedulers()) do
  describe("clientpool: the hard cap on " .. M.name, function()
    pending("not run: " .. M.reason)
  end)
end

for _, S in ipairs(H.schedulers { hosts = true }) do
  describe("clientpool: the hard cap on " .. S.name, function()
    after_each(function() if S.finish then S.finish() end end)
    local function T(x) return x * S.scale end

    for _, max_live in ipairs { 1, 2 } do
      it("max_live = " .. max_live .. ": never more clients than that under random slow and failing destroys",
         function()
        local sched = S.new()
        local logged = {}
        local adapter = quiet(sched, logged)
        -- a fixed stream of choices (the virtual loop replays it exactly)
        local seed = 12345
        local function rnd(n)
          seed = (seed * 16807) % 2147483647   -- (exact in doubles)
          return seed % n
        end
        local c = { open = 0, peak = 0, created = 0, destroyed = 0, over = 0 }
        local pool
        local function create()
          if c.open >= max_live then c.over = c.over + 1 end
          c.open = c.open + 1
          if c.open > c.peak then c.peak = c.open end
          c.created = c.created + 1
          return { id = c.created }
        end
        local function destroy()
          local kind = rnd(4)           -- 0: instant, 1: slow, 2: slow then raises, 3: raises at once
          if kind == 1 or kind == 2 then sched.sleep(T(0.05 + rnd(50) / 100)) end
          c.destroyed = c.destroyed + 1
          c.open = c.open - 1
          if kind >= 2 then error("destroy failed (" .. kind .. ")") end
        end
        pool = clientpool.new { create = create, destroy = destroy, max_live = max_live,
                                max_waiting = 100, scheduler = adapter }
        local done, failed = 0, {}
        S.run(sched, function()
          for i = 1, 12 do
            sched.spawn(function()
              for _ = 1, 4 do
                local l, code = pool:acquire(i % 3 == 0 and "b" or "a", { timeout = T(1000) })
                if not l then failed[#failed + 1] = code else
                  sched.sleep(T(rnd(10) / 100))
                  l:release(rnd(3) == 0)      -- mostly release(false): a destroy each
                end
              end
              done = done + 1
            end)
          end
          while done < 12 do
            sched.sleep(T(0.05))
            local s = pool:stats()
            assert(s.live + s.creating + s.closing <= max_live, "live + creating + closing > max_live")
          end
          pool:close()
          while c.open > 0 do sched.sleep(T(0.05)) end
        end)
        assert.same({}, failed)
        assert.equal(0, c.over)
        assert.equal(max_live, c.peak)
        assert.equal(c.created, c.destroyed)
        local s = pool:stats()
        assert.equal(0, s.closing)
        assert.equal(0, s.live)
        assert.equal(c.created, s.opened)
        assert.is_true(#logged > 0)             -- some destroys failed, and were logged
      end)
    end
  end)
end
