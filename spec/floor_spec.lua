-- clientpool: the warm floor, pool:run() (docs/api.md "The warm floor";
-- issue 4 "Warm floor").
--
-- Every scenario runs as a task on each scheduler of H.schedulers(), on a
-- virtual clock: create latencies, idle_timeout and max_lifetime are exact
-- and cost no real time. pool:run() runs in a task of its own and each
-- scenario ends with close(), which makes run() return.

local clientpool = require "clientpool"
local H = require "spec.helpers"
local contains, errmsg, assert_api_error = H.contains, H.errmsg, H.assert_api_error

-- H.factory with create instrumented: attempts (calls, failed or not),
-- inflight and max_inflight (creates running at once), keys (the key of
-- every successful create, in order), and `failing` (every create fails).
local function floor_factory(sched, latency)
  local f = H.factory(sched)
  local inner = f.create
  f.attempts, f.inflight, f.max_inflight, f.keys, f.failing = 0, 0, 0, {}, false
  f.create = function(key)
    f.attempts = f.attempts + 1
    f.inflight = f.inflight + 1
    if f.inflight > f.max_inflight then f.max_inflight = f.inflight end
    if latency then sched.sleep(latency) end
    f.inflight = f.inflight - 1
    if f.failing then return nil, "refused" end
    local c, err = inner(key)
    if c then f.keys[#f.keys + 1] = key or "(default)" end
    return c, err
  end
  return f
end

local function count(list, v)
  local n = 0
  for _, x in ipairs(list) do if x == v then n = n + 1 end end
  return n
end

for _, S in ipairs(H.schedulers()) do
  describe("clientpool warm floor on " .. S.name, function()

    -- Runs body(sched) as a task on a fresh scheduler, to completion.
    local function run(body)
      local sched = S.new()
      S.run(sched, body, sched)
      return sched
    end

    -- A pool over instrumented clients (create latency 0.1 s unless given).
    -- The adapter's log is captured in f.logged.
    local function mkpool(sched, o, latency)
      local f = floor_factory(sched, latency == nil and 0.1 or latency or nil)
      f.logged = {}
      local adapter = setmetatable({ log = function(m) f.logged[#f.logged + 1] = tostring(m) end },
                                   { __index = sched })
      local opts = { create = f.create, destroy = f.destroy, max_live = 4, scheduler = adapter }
      for k, v in pairs(o or {}) do opts[k] = v end
      return clientpool.new(opts), f
    end

    local function logged(f, part)
      for _, m in ipairs(f.logged) do
        if contains(m, part) then return true end
      end
      return false
    end

    -- Starts pool:run() in a task; r.done turns true when it returns.
    local function start(sched, pool)
      local r = { done = false }
      sched.spawn(function()
        r.results = { pool:run() }
        r.done = true
      end)
      return r
    end

    local function settle(sched)
      sched.sleep(0)
      sched.sleep(0)
    end

    -- Closes the pool and checks that run() returned.
    local function stop(sched, pool, r)
      pool:close()
      settle(sched)
      assert(r.done, "run() did not return after close()")
    end

    ---------------------------------------------------------------------------
    describe("filling", function()
      it("keeps min_idle idle clients of the default key before any acquire", function()
        run(function(sched)
          local pool, f = mkpool(sched, { min_idle = 2 })
          sched.sleep(5)
          assert.equal(0, f.attempts)            -- no floor without run()
          local r = start(sched, pool)
          sched.sleep(1)
          local s = H.check(pool)
          assert.equal(2, s.idle)
          assert.equal(2, s.live)
          assert.equal(0, s.leases)
          assert.equal(0, s.creating)
          assert.equal(2, f.created)
          assert.is_false(r.done)
          sched.sleep(50)                        -- and no more than that
          assert.equal(2, f.attempts)
          stop(sched, pool, r)
        end)
      end)

      it("keeps min_idle idle clients for each warm key", function()
        run(function(sched)
          local pool, f = mkpool(sched, { min_idle = 2, max_live = 8, keys = { "a", "b" } })
          local r = start(sched, pool)
          sched.sleep(2)
          local s = H.check(pool)
          assert.equal(4, s.idle)
          assert.equal(2, s.keys.a.idle)
          assert.equal(2, s.keys.b.idle)
          assert.equal(2, count(f.keys, "a"))
          assert.equal(2, count(f.keys, "b"))
          assert.equal(0, count(f.keys, "(default)"))
          stop(sched, pool, r)
        end)
      end)

      it("creates at most 2 clients at a time", function()
        run(function(sched)
          local pool, f = mkpool(sched, { min_idle = 4, max_live = 8, keys = { "a", "b" } }, 1)
          local r = start(sched, pool)
          sched.sleep(1.5)
          assert(H.check(pool).idle <= 2, "more than 2 creates ran in the first second")
          sched.sleep(5)
          local s = H.check(pool)
          assert.equal(8, s.idle)
          assert.equal(4, s.keys.a.idle)
          assert.equal(4, s.keys.b.idle)
          assert(f.max_inflight <= 2, "creates at once: " .. f.max_inflight)
          assert(f.max_inflight >= 1)
          stop(sched, pool, r)
        end)
      end)

      it("serves acquisitions from the floor and tops it up", function()
        run(function(sched)
          local pool, f = mkpool(sched, { min_idle = 2 })
          local r = start(sched, pool)
          sched.sleep(1)
          local l = assert(pool:acquire())
          assert(l.client.id <= 2, "not a floor client")
          assert.equal(1, H.check(pool).reused)
          sched.sleep(1)
          local s = H.check(pool)
          assert.equal(2, s.idle)
          assert.equal(3, f.created)
          l:release()
          stop(sched, pool, r)
        end)
      end)

      it("never goes over max_live", function()
        run(function(sched)
          local pool, f = mkpool(sched, { min_idle = 2, max_live = 2, keys = { "a", "b" } })
          local r = start(sched, pool)
          sched.sleep(5)
          local s = H.check(pool)
          assert.equal(2, s.live)
          assert.equal(2, f.attempts)
          stop(sched, pool, r)
        end)
      end)

      it("leaves a key paused by pool:pause(reason, key) out of the floor", function()
        run(function(sched)
          local pool, f = mkpool(sched, { min_idle = 1, keys = { "a" } })
          local r = start(sched, pool)
          sched.sleep(1)
          pool:pause("maintenance", "b")
          pool:retire("a")                       -- a loss: the floor runs again
          sched.sleep(2)
          local s = H.check(pool)
          assert.equal(1, s.keys.a.idle)
          assert.equal(0, count(f.keys, "b"))
          assert.equal(0, s.keys.b and s.keys.b.live or 0)
          stop(sched, pool, r)
        end)
      end)

      it("keeps a warm key on the floor after it was paused and resumed", function()
        for _, probe in ipairs { false, true } do
          run(function(sched)
            local pool = mkpool(sched, { min_idle = 2, keys = { "a" }, probe = probe })
            local r = start(sched, pool)
            sched.sleep(1)
            assert.equal(2, H.check(pool).keys.a.idle)
            pool:pause("LOADING", "a")
            pool:resume("a")
            if probe then                        -- let the probe pass
              local l = assert(pool:acquire("a"))
              l:observe(nil)
              l:release()
            end
            pool:retire("a")                     -- losses: the floor must refill
            sched.sleep(2)
            local s = H.check(pool)
            assert.equal(2, s.keys.a.idle, "probe = " .. tostring(probe))
            stop(sched, pool, r)
          end)
        end
      end)
    end)

    ---------------------------------------------------------------------------
    describe("losses and expiry", function()
      it("refills after clients are lost (lease:destroy())", function()
        run(function(sched)
          local pool, f = mkpool(sched, { min_idle = 2, max_live = 2 })
          local r = start(sched, pool)
          sched.sleep(1)
          local a = assert(pool:acquire())
          local b = assert(pool:acquire())
          sched.sleep(1)
          assert.equal(0, H.check(pool).idle)    -- max_live: no room yet
          a:destroy()
          b:destroy()
          sched.sleep(1)
          local s = H.check(pool)
          assert.equal(2, s.idle)
          assert.equal(4, f.created)
          assert.equal(2, s.closed_by.error)
          stop(sched, pool, r)
        end)
      end)

      it("refills after pool:retire()", function()
        run(function(sched)
          local pool, f = mkpool(sched, { min_idle = 2 })
          local r = start(sched, pool)
          sched.sleep(1)
          pool:retire()
          sched.sleep(1)
          local s = H.check(pool)
          assert.equal(2, s.closed_by.retired)
          assert.equal(2, s.idle)
          assert.equal(4, f.created)
          stop(sched, pool, r)
        end)
      end)

      it("idle_timeout spares the floor's own idle clients; the extra ones expire", function()
        run(function(sched)
          local pool, f = mkpool(sched, { min_idle = 2, idle_timeout = 10 })
          local r = start(sched, pool)
          sched.sleep(1)
          local a = assert(pool:acquire())
          local b = assert(pool:acquire())
          sched.sleep(1)                        -- t = 2: the floor made 2 more
          assert.equal(4, H.check(pool).live)
          a:release()
          b:release()
          assert.equal(4, H.check(pool).idle)
          sched.sleep(11)                       -- t = 13
          local s = H.check(pool)
          assert.equal(2, s.idle)
          assert.equal(2, s.closed_by.idle)
          sched.sleep(100)
          s = H.check(pool)
          assert.equal(2, s.idle)
          assert.equal(2, s.closed_by.idle)
          assert.equal(4, f.created)
          stop(sched, pool, r)
        end)
      end)

      it("max_lifetime retires the floor's clients and the floor refills", function()
        run(function(sched)
          local pool, f = mkpool(sched, { min_idle = 2, max_lifetime = 10 })
          local r = start(sched, pool)
          sched.sleep(11)                       -- created at 0.1, expired at 10.1
          local s = H.check(pool)
          assert.equal(2, s.closed_by.lifetime)
          assert.equal(2, s.idle)
          assert.equal(4, f.created)
          sched.sleep(10)                       -- t = 21
          s = H.check(pool)
          assert.equal(4, s.closed_by.lifetime)
          assert.equal(2, s.idle)
          assert.equal(6, f.created)
          stop(sched, pool, r)
        end)
      end)

      it("expires idle clients of other keys at idle_timeout without any acquire", function()
        run(function(sched)
          local pool = mkpool(sched, { min_idle = 1, keys = { "a" }, idle_timeout = 5 })
          local r = start(sched, pool)
          assert(pool:acquire("x")):release()
          sched.sleep(4.9)
          assert.equal(1, H.check(pool).keys.x.idle)
          sched.sleep(0.2)
          local s = H.check(pool)
          assert.equal(1, s.closed_by.idle)
          assert.equal(1, s.keys.a.idle)
          stop(sched, pool, r)
        end)
      end)
    end)

    ---------------------------------------------------------------------------
    describe("strikes", function()
      it("spends the floor after restarts + 1 failed refills in a row", function()
        run(function(sched)
          local pool, f = mkpool(sched, { min_idle = 1, restarts = 2 }, 0.5)
          f.failing = true
          local r = start(sched, pool)
          sched.sleep(0.75)
          assert.equal(2, f.attempts)
          assert.is_false(H.check(pool).floor_spent)
          sched.sleep(5)
          assert.equal(3, f.attempts)
          assert.is_true(H.check(pool).floor_spent)
          assert(logged(f, "spent"), "the spent floor was not reported")
          sched.sleep(0.5)                      -- no more attempts while spent ...
          assert.equal(3, f.attempts)
          sched.sleep(4)                        -- ... until its own pause is over (5 s)
          assert.equal(4, f.attempts)
          assert.is_true(H.check(pool).floor_spent)
          local s = H.check(pool)
          assert.equal(0, s.live)
          assert.equal(0, s.creating)
          assert.is_false(r.done)
          stop(sched, pool, r)
        end)
      end)

      it("counts a refill whose park hook fails as a failed refill (no create/destroy churn)", function()
        run(function(sched)
          local pool, f = mkpool(sched, {
            min_idle = 1, restarts = 2,
            park = function() error("park broken") end, unpark = function(stored) return stored end,
          }, 0.5)
          local r = start(sched, pool)
          sched.sleep(4)
          assert.equal(3, f.created)             -- restarts + 1, then spent
          assert.is_true(H.check(pool).floor_spent)
          assert(logged(f, "park hook failed"), "the park failure was not reported")
          local s = H.check(pool)
          assert.equal(0, s.live)
          assert.equal(3, s.closed_by.retired)
          stop(sched, pool, r)
        end)
      end)

      it("while spent, acquire still creates lazily; a successful create resets the floor", function()
        run(function(sched)
          local pool, f = mkpool(sched, { min_idle = 1, restarts = 1 })
          f.failing = true
          local r = start(sched, pool)
          sched.sleep(2)
          assert.is_true(H.check(pool).floor_spent)
          local attempts = f.attempts
          -- a failed acquire create leaves it spent
          local l, code = pool:acquire()
          assert.is_nil(l)
          assert.equal("create", code)
          assert.equal(attempts + 1, f.attempts)
          sched.sleep(1)
          assert.is_true(H.check(pool).floor_spent)
          assert.equal(attempts + 1, f.attempts)
          -- a successful one resets it: the floor fills again
          f.failing = false
          l = assert(pool:acquire())
          assert.is_false(H.check(pool).floor_spent)
          sched.sleep(1)
          local s = H.check(pool)
          assert.equal(1, s.idle)
          assert.equal(1, s.leases)
          assert.equal(2, f.created)
          l:release()
          stop(sched, pool, r)
        end)
      end)

      it("counts failures in a row only: a successful refill starts over", function()
        run(function(sched)
          local pool, f = mkpool(sched, { min_idle = 1, restarts = 1 })
          f.fail_next = 1                       -- fail, then succeed
          local r = start(sched, pool)
          sched.sleep(1)
          local s = H.check(pool)
          assert.equal(1, s.idle)
          assert.is_false(s.floor_spent)
          f.fail_next = 1
          pool:retire()                         -- a loss: fail once more, then succeed
          sched.sleep(1)
          s = H.check(pool)
          assert.is_false(s.floor_spent)
          assert.equal(1, s.idle)
          assert.equal(2, f.created)
          assert.equal(4, f.attempts)
          stop(sched, pool, r)
        end)
      end)

      it("reports the last create error when the floor is spent", function()
        run(function(sched)
          local pool, f = mkpool(sched, { min_idle = 1, restarts = 0 })
          f.failing = true
          local r = start(sched, pool)
          sched.sleep(5)
          assert.is_true(H.check(pool).floor_spent)
          assert(logged(f, "refused"), "log lacks create's error: " .. table.concat(f.logged, " | "))
          stop(sched, pool, r)
        end)
      end)

      -- issue 12 finding 5: restarts = N made up to N + 2 attempts (two
      -- refills at a time) and logged "spent" twice
      it("restarts = N means N + 1 failed refills in a row, never more, however many run at once", function()
        for _, restarts in ipairs { 0, 1, 2, 3 } do
          run(function(sched)
            local pool, f = mkpool(sched, { min_idle = 2, restarts = restarts, create_backoff = false }, 0.5)
            f.failing = true
            local r = start(sched, pool)
            sched.sleep(4)                      -- (the spent floor's first retry is 5 s away)
            assert.equal(restarts + 1, f.attempts)
            assert.is_true(H.check(pool).floor_spent)
            local n = 0
            for _, m in ipairs(f.logged) do if contains(m, "spent") then n = n + 1 end end
            assert.equal(1, n)
            stop(sched, pool, r)
          end)
        end
      end)

      it("a spent floor tries again by itself, one refill after a growing pause; spent is logged once", function()
        run(function(sched)
          local pool, f = mkpool(sched, { min_idle = 2, restarts = 1, create_backoff = false }, 0.1)
          f.failing = true
          local r = start(sched, pool)
          sched.sleep(1)
          assert.equal(2, f.attempts)
          assert.is_true(H.check(pool).floor_spent)
          local spent_at = 0.1                  -- the second failure
          -- retries at 5, 10, 20, 40, 60, 60 ... s after the last spend
          local due = { 5, 15, 35, 75, 135, 195 }
          for i, t in ipairs(due) do
            sched.sleep(spent_at + t + 0.05 - sched.now())
            assert.equal(2 + i, f.attempts, "retry " .. i .. " at " .. sched.now())
            assert.is_true(H.check(pool).floor_spent)
            spent_at = spent_at + 0.1           -- (each retry fails 0.1 s after it starts)
          end
          local n = 0
          for _, m in ipairs(f.logged) do if contains(m, "spent") then n = n + 1 end end
          assert.equal(1, n)
          -- the upstream is back: the next retry fills the floor, nobody acquires
          f.failing = false
          sched.sleep(61)
          local s = H.check(pool)
          assert.is_false(s.floor_spent)
          assert.equal(2, s.idle)
          assert.equal(0, s.reused)
          stop(sched, pool, r)
        end)
      end)

      it("restarts = 0 spends the floor at the first failure", function()
        run(function(sched)
          local pool, f = mkpool(sched, { min_idle = 1, restarts = 0 })
          f.failing = true
          local r = start(sched, pool)
          sched.sleep(5)
          assert.equal(1, f.attempts)
          assert.is_true(H.check(pool).floor_spent)
          stop(sched, pool, r)
        end)
      end)
    end)

    ---------------------------------------------------------------------------
    describe("run()", function()
      it("returns after close()", function()
        run(function(sched)
          local pool = mkpool(sched, { min_idle = 1 })
          local r = start(sched, pool)
          sched.sleep(10)
          assert.is_false(r.done)
          pool:close()
          settle(sched)
          assert.is_true(r.done)
          local s = H.check(pool)
          assert.equal(0, s.live)
          assert.equal(1, s.closed_by.drain)
        end)
      end)

      it("returns after drain()", function()
        run(function(sched)
          local pool = mkpool(sched, { min_idle = 1 })
          local r = start(sched, pool)
          sched.sleep(1)
          assert.is_true(pool:drain())
          settle(sched)
          assert.is_true(r.done)
        end)
      end)

      it("destroys the clients of refills still in flight at close", function()
        run(function(sched)
          local pool, f = mkpool(sched, { min_idle = 2 }, 1)
          local r = start(sched, pool)
          sched.sleep(0.5)
          assert.equal(2, H.check(pool).creating)
          pool:close()
          sched.sleep(2)
          assert.is_true(r.done)
          local s = H.check(pool)
          assert.equal(0, s.live)
          assert.equal(0, s.idle)
          assert.equal(0, s.creating)
          assert.equal(f.created, f.destroyed)
        end)
      end)

      it("does not park the client of a refill that finishes after close", function()
        run(function(sched)
          local parked = 0
          local pool, f = mkpool(sched, {
            min_idle = 2,
            park = function(c) parked = parked + 1; return c end, unpark = function(stored) return stored end,
          }, 1)
          local r = start(sched, pool)
          sched.sleep(0.5)
          assert.equal(2, H.check(pool).creating)
          pool:close()
          sched.sleep(2)
          assert.is_true(r.done)
          assert.equal(0, parked)                -- destroyed as created: nothing to park
          assert.equal(f.created, f.destroyed)
        end)
      end)

      it("returns at once on a closed pool", function()
        run(function(sched)
          local pool, f = mkpool(sched, { min_idle = 1 })
          pool:close()
          local r = start(sched, pool)
          settle(sched)
          assert.is_true(r.done)
          sched.sleep(5)
          assert.equal(0, f.attempts)
        end)
      end)

      it("returns when the adapter's wait raises (OpenResty: the worker exits), logging it", function()
        run(function(sched)
          local f = floor_factory(sched, 0.1)
          local logs, raising = {}, false
          local adapter = setmetatable({
            log = function(m) logs[#logs + 1] = tostring(m) end,
            wait = function(h, deadline)
              if raising then error("worker exiting", 0) end
              return sched.wait(h, deadline)
            end,
          }, { __index = sched })
          local pool = clientpool.new { create = f.create, destroy = f.destroy, max_live = 4, min_idle = 1,
                                        scheduler = adapter }
          local r = start(sched, pool)
          sched.sleep(1)
          assert.equal(1, H.check(pool).idle)
          raising = true
          local l = assert(pool:acquire())       -- wakes run(): it refills, then its wait raises
          settle(sched)
          raising = false
          assert.is_true(r.done)
          assert.is_true(contains(table.concat(logs, "\n"), "run() stopped: worker exiting"), table.concat(logs, "\n"))
          sched.sleep(1)
          l:destroy()                            -- no floor now: nothing refills
          sched.sleep(1)
          assert.equal(1, H.check(pool).idle)
          assert.equal(2, f.attempts)
          local r2 = start(sched, pool)          -- and run() may start again
          sched.sleep(1)
          assert.is_false(r2.done)
          stop(sched, pool, r2)
        end)
      end)

      it("raises outside a coroutine", function()
        local sched = S.new()
        local pool = mkpool(sched, { min_idle = 1 })
        assert_api_error(errmsg(pool.run, pool), "run()")
      end)

      it("raises when it is already running", function()
        run(function(sched)
          local pool = mkpool(sched, { min_idle = 1 })
          local r = start(sched, pool)
          sched.sleep(1)
          assert_api_error(errmsg(pool.run, pool), "run()", "already running")
          assert.is_false(r.done)
          assert.equal(1, H.check(pool).idle)
          stop(sched, pool, r)
        end)
      end)
    end)
  end)
end
