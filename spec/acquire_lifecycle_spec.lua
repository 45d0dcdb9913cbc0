-- clientpool.acquire over a pool's life: events, max_idle, idle_timeout
-- and max_lifetime, close, create failure and argument errors (docs/api.md;
-- acquire, try_acquire, with, validate, park/unpark: acquire_spec.lua).
-- The whole suite runs once per scheduler entry of spec/helpers.lua
-- (spec/acquire_helpers.lua). Times are written for a virtual clock, where
-- time only moves when tasks sleep, and multiplied by the entry's scale with
-- T(); on a real clock (cqueues, luv, copas) a time is checked as a lower bound.

local H = require "spec.helpers"
local A = require "spec.acquire_helpers"
local contains, errmsg, assert_api_error, wrap = H.contains, H.errmsg, H.assert_api_error, A.wrap

A.each_scheduler({ describe = describe, pending = pending, after_each = after_each }, function(S, P)
    local T, run, near, at, mkpool, settle, record_events =
          P.T, P.run, P.near, P.at, P.mkpool, P.settle, P.record_events

    describe("events", function()
      it("create, acquire, release and destroy fire with their arguments", function()
        run(function(sched)
          local pool = mkpool(sched)
          local ev = record_events(pool, sched)
          local l = assert(pool:acquire("k"))
          local c = l.client
          assert.equal(2, #ev.list)
          assert.equal("create", ev.list[1].name)
          assert.equal("k", ev.list[1][1])
          assert.equal(c, ev.list[1][2])
          assert.equal("acquire", ev.list[2].name)
          assert.equal("k", ev.list[2][1])
          assert.equal(c, ev.list[2][2])
          assert.is_nil(ev.list[2][3]) -- it did not wait

          l:release()
          local r = ev.of("release")
          assert.equal(1, #r)
          assert.same({ "k", c, true }, { r[1][1], r[1][2], r[1][3] })

          l = assert(pool:acquire("k"))
          assert.equal(1, #ev.of("create"))
          assert.equal(2, #ev.of("acquire"))
          assert.equal(c, ev.of("acquire")[2][2])

          l:release(false)
          r = ev.of("release")
          assert.equal(2, #r)
          assert.same({ "k", c, false }, { r[2][1], r[2][2], r[2][3] })
          local d = ev.of("destroy")
          assert.equal(1, #d)
          assert.same({ "k", c, "error" }, { d[1][1], d[1][2], d[1][3] })
        end)
      end)

      it("acquire reports how long a waiter waited", function()
        run(function(sched)
          local pool = mkpool(sched, { max_live = 1 })
          local ev = record_events(pool, sched)
          local held = assert(pool:acquire("k"))
          sched.spawn(function()
            sched.sleep(T(3))
            held:release()
          end)
          local l = assert(pool:acquire("k"))
          local a = ev.of("acquire")
          assert.equal(2, #a)
          assert.equal(l.client, a[2][2])
          near(3, a[2][3], "waited")
        end)
      end)

      it("timeout fires with the key and the detail", function()
        run(function(sched)
          local pool = mkpool(sched, { max_live = 1 })
          local ev = record_events(pool, sched)
          local held = assert(pool:acquire("k"))
          local l, code, detail = pool:acquire("k", { timeout = T(2) })
          assert.is_nil(l)
          assert.equal("timeout", code)
          local t = ev.of("timeout")
          assert.equal(1, #t)
          assert.equal("k", t[1][1])
          local d = t[1][2]
          assert.is_not_nil(d)
          assert.equal(1, d.live)
          assert.equal(1, d.active)
          near(2, d.waited, "detail.waited")
          assert.is_true(contains(tostring(d), "timeout"))
          assert.equal(1, detail.live)
          held:release()
        end)
      end)

      it("a listener that raises does not break the pool; later listeners still run", function()
        run(function(sched)
          local logs = {}
          local pool, f = mkpool(sched, {
            max_live = 1,
            scheduler = wrap(sched, { log = function(m) logs[#logs + 1] = tostring(m) end }),
          })
          local names = { "create", "acquire", "release", "destroy", "timeout", "leak" }
          for _, name in ipairs(names) do pool:on(name, function() error("listener boom") end) end
          local ev = record_events(pool, sched)
          local l = assert(pool:acquire("k"))
          l:release()
          l = assert(pool:acquire("k"))
          local none, code = pool:acquire("k", { timeout = T(1) })
          assert.is_nil(none)
          assert.equal("timeout", code)
          l:release(false)
          l = assert(pool:acquire("k"))
          l:release()
          settle(sched)
          local s = H.check(pool)
          assert.equal(1, s.idle)
          assert.equal(2, s.opened)
          assert.equal(1, f.destroyed)
          for _, name in ipairs { "create", "acquire", "release", "destroy", "timeout" } do
            assert(#ev.of(name) > 0, "the second " .. name .. " listener did not run")
          end
          assert.is_true(#logs > 0)
        end)
      end)

      it("on() rejects an unknown event or a non-function listener", function()
        local pool = mkpool(S.new())
        assert_api_error(errmsg(pool.on, pool, "acquired", function() end), "acquired")
        assert_api_error(errmsg(pool.on, pool, nil, function() end))
        assert_api_error(errmsg(pool.on, pool, "acquire", "not a function"), "function")
        assert_api_error(errmsg(pool.on, pool, "acquire"), "function")
      end)
    end)

    ---------------------------------------------------------------------------
    describe("max_idle", function()
      it("a client released while max_idle are idle is destroyed (closed_by.max_idle)", function()
        run(function(sched)
          local pool, f = mkpool(sched, { max_live = 2, max_idle = 1 })
          local ev = record_events(pool, sched)
          local a = assert(pool:acquire("k"))
          local b = assert(pool:acquire("k"))
          local ca, cb = a.client, b.client
          a:release()
          b:release()
          local s = H.check(pool)
          assert.equal(1, s.idle)
          assert.equal(1, s.live)
          assert.equal(1, s.closed_by.max_idle)
          settle(sched)
          assert.equal(1, f.destroyed)
          assert.is_false(cb.alive)
          assert.is_true(ca.alive)
          assert.equal("max_idle", ev.of("destroy")[1][3])
          assert.equal(ca, assert(pool:acquire("k")).client)
        end)
      end)
    end)

    ---------------------------------------------------------------------------
    describe("idle_timeout and max_lifetime", function()
      it("idle_timeout is enforced at acquire (even with no pool timer running)", function()
        run(function(sched)
          local pool, f = mkpool(sched, {
            idle_timeout = T(10),
            scheduler = wrap(sched, { background = function() end }), -- the pool's timer never runs
          })
          local l = assert(pool:acquire("k"))
          local old = l.client
          l:release()
          sched.sleep(T(11))
          l = assert(pool:acquire("k"))
          assert.are_not.equal(old, l.client)
          assert.equal(2, f.created)
          local s = H.check(pool)
          assert.equal(1, s.closed_by.idle)
          assert.equal(1, s.live)
          settle(sched)
          assert.equal(1, f.destroyed)
          assert.is_false(old.alive)
        end)
      end)

      it("max_lifetime is enforced at acquire for an idle client (even with no pool timer running)", function()
        run(function(sched)
          local pool, f = mkpool(sched, {
            max_lifetime = T(10),
            scheduler = wrap(sched, { background = function() end }),
          })
          local l = assert(pool:acquire("k"))
          l:release()
          sched.sleep(T(11))
          l = assert(pool:acquire("k"))
          assert.equal(2, l.client.id)
          assert.equal(1, H.check(pool).closed_by.lifetime)
          settle(sched)
          assert.equal(1, f.destroyed)
        end)
      end)

      it("a client retired at acquire never makes a key's client go to another key", function()
        run(function(sched)
          local pool = mkpool(sched, {
            idle_timeout = T(10),
            scheduler = wrap(sched, { background = function() end }),
          })
          local l = assert(pool:acquire("k"))
          l:release()
          sched.sleep(T(11))
          l = assert(pool:acquire("k")) -- the idle client expired here: a new one for "k"
          assert.equal("k", l.client.key)
          local o = assert(pool:acquire("other"))
          assert.equal("other", o.client.key)
          l:release()
          local o2 = assert(pool:acquire("other"))
          assert.equal("other", o2.client.key)
          o:release()
          o2:release()
          local k2 = assert(pool:acquire("k"))
          assert.equal("k", k2.client.key)
        end)
      end)

      it("the pool's timer retires idle clients at idle_timeout, with no acquire", function()
        run(function(sched)
          local pool, f = mkpool(sched, { idle_timeout = T(10) })
          local ev = record_events(pool, sched)
          local a = assert(pool:acquire("k"))
          local b = assert(pool:acquire("k"))
          local ca, cb = a.client, b.client
          a:release()          -- idle at 0
          sched.sleep(T(5))
          b:release()          -- idle at 5
          sched.sleep(T(7))       -- t = 12
          local s = H.check(pool)
          assert.equal(1, s.closed_by.idle)
          assert.equal(1, s.idle)
          assert.equal(1, s.live)
          assert.is_false(ca.alive)
          assert.is_true(cb.alive)
          local d = ev.of("destroy")
          assert.equal(1, #d)
          assert.equal(ca, d[1][2])
          assert.equal("idle", d[1][3])
          at(10, d[1].at, "time of the idle expiry")
          sched.sleep(T(4))       -- t = 16
          s = H.check(pool)
          assert.equal(2, s.closed_by.idle)
          assert.equal(0, s.live)
          at(15, ev.of("destroy")[2].at, "time of the second idle expiry")
          assert.equal(2, f.destroyed)
        end)
      end)

      it("a client held past max_lifetime is destroyed at its release (closed_by.lifetime)", function()
        run(function(sched)
          local pool, f = mkpool(sched, { max_lifetime = T(10) })
          local l = assert(pool:acquire("k"))
          local c = l.client
          sched.sleep(T(15))
          local s = H.check(pool)
          assert.equal(1, s.live) -- leased clients stay with their holders
          assert.equal(1, s.active)
          assert.equal(0, s.closed)
          l:release()
          s = H.check(pool)
          assert.equal(1, s.closed_by.lifetime)
          assert.equal(0, s.idle)
          assert.equal(0, s.live)
          settle(sched)
          assert.equal(1, f.destroyed)
          assert.is_false(c.alive)
        end)
      end)

      it("the pool's timer retires an idle client at max_lifetime, with no acquire", function()
        run(function(sched)
          local pool, f = mkpool(sched, { max_lifetime = T(10) })
          local ev = record_events(pool, sched)
          local l = assert(pool:acquire("k"))
          sched.sleep(T(2))
          l:release()
          sched.sleep(T(9)) -- t = 11
          local s = H.check(pool)
          assert.equal(1, s.closed_by.lifetime)
          assert.equal(0, s.live)
          assert.equal(1, f.destroyed)
          local d = ev.of("destroy")
          assert.equal(1, #d)
          assert.equal("lifetime", d[1][3])
          at(10, d[1].at, "time of the lifetime expiry")
        end)
      end)

      it("lifetime_jitter spreads the destroy times within [L/2, L] for jitter 0.5", function()
        run(function(sched)
          local N, L = 8, 10
          local pool = mkpool(sched, { max_live = N, max_lifetime = T(L), lifetime_jitter = 0.5 })
          local times = {}
          pool:on("destroy", function(_, _, reason)
            assert.equal("lifetime", reason)
            times[#times + 1] = sched.now()
          end)
          local ls = {}
          for i = 1, N do ls[i] = assert(pool:acquire("k")) end
          for i = 1, N do ls[i]:release() end
          sched.sleep(T(L + 1))
          assert.equal(N, #times)
          local lo, hi, distinct = math.huge, -math.huge, {}
          for _, abs in ipairs(times) do
            local t = (abs - P.base()) / S.scale
            assert(t >= L / 2 - 1e-9, "destroyed at " .. t .. ", before L/2")
            -- a real clock may fire late, and fire late timers together
            if not S.real then
              assert(t <= L + 1e-9, "destroyed at " .. t .. ", outside [L/2, L]")
              distinct[t] = true
            end
            lo, hi = math.min(lo, t), math.max(hi, t)
          end
          if not S.real then
            local nd = 0
            for _ in pairs(distinct) do nd = nd + 1 end
            assert(nd >= 4, "only " .. nd .. " distinct destroy times")
            assert(hi - lo >= 0.5, "destroy times spread over only " .. (hi - lo) .. "s")
          end
          assert.equal(N, H.check(pool).closed_by.lifetime)
        end)
      end)
    end)

    ---------------------------------------------------------------------------
    describe("close", function()
      it("makes later acquisitions return nil, closed", function()
        run(function(sched)
          local pool = mkpool(sched)
          pool:close()
          local l, code = pool:acquire("k")
          assert.is_nil(l)
          assert.equal("closed", code)
          l, code = pool:try_acquire("k")
          assert.is_nil(l)
          assert.equal("closed", code)
          l, code = pool:acquire()
          assert.is_nil(l)
          assert.equal("closed", code)
        end)
      end)

      it("destroys idle clients (destroy hook, closed_by.drain) and wakes waiters with closed", function()
        run(function(sched)
          -- max_concurrency 1: one lease at a time, so a waiter can coexist with idle clients
          local pool, f = mkpool(sched, { max_live = 3, max_concurrency = 1 })
          local la = assert(pool:acquire("a"))
          local ca = la.client
          la:release()
          local lb = assert(pool:acquire("b"))
          local cb = lb.client
          lb:release()
          local held = assert(pool:acquire("c"))
          local waiter
          sched.spawn(function() waiter = { pool:acquire("a") } end)
          sched.sleep(T(1))
          local s = H.check(pool)
          assert.equal(1, s.waiting)
          assert.equal(2, s.idle)
          pool:close()
          s = H.check(pool)
          assert.equal(2, s.closed_by.drain)
          assert.equal(0, s.idle)
          assert.equal(1, s.live)
          settle(sched)
          assert.equal(2, f.destroyed)
          assert.is_false(ca.alive)
          assert.is_false(cb.alive)
          assert.is_nil(waiter[1])
          assert.equal("closed", waiter[2])
          assert.equal(0, H.check(pool).waiting)
          held:release()
        end)
      end)

      it("destroys a lease held across close at its release", function()
        run(function(sched)
          local pool, f = mkpool(sched)
          local l = assert(pool:acquire("k"))
          local c = l.client
          pool:close()
          local s = H.check(pool)
          assert.equal(1, s.live)
          assert.equal(1, s.active)
          assert.is_true(c.alive)
          l:release()
          s = H.check(pool)
          assert.equal(0, s.live)
          assert.equal(0, s.idle)
          assert.equal(1, s.closed_by.drain)
          settle(sched)
          assert.equal(1, f.destroyed)
          assert.is_false(c.alive)
        end)
      end)

      it("is idempotent", function()
        run(function(sched)
          local pool, f = mkpool(sched)
          assert(pool:acquire("k")):release()
          pool:close()
          local s1 = pool:stats()
          pool:close()
          pool:close()
          assert.same(s1, pool:stats())
          settle(sched)
          assert.equal(1, f.destroyed)
        end)
      end)
    end)

    ---------------------------------------------------------------------------
    describe("create failure", function()
      it("create returning nil, err gives nil, 'create', err; no capacity is lost", function()
        run(function(sched)
          local pool, f = mkpool(sched, { max_live = 1 })
          f.fail_next = 1
          local l, code, err = pool:acquire("k")
          assert.is_nil(l)
          assert.equal("create", code)
          assert.equal("refused", err)
          local s = H.check(pool)
          assert.equal(0, s.live)
          assert.equal(0, s.creating)
          assert.equal(0, s.opened)
          assert.equal(0, s.leases)
          sched.sleep(T(0.05))       -- past the create backoff's window
          l = assert(pool:acquire("k"))
          assert.equal(1, l.client.id)
        end)
      end)

      it("create throwing gives nil, 'create', the error; no capacity is lost", function()
        run(function(sched)
          local pool, f = mkpool(sched, { max_live = 1 })
          f.throw_next = 1
          local ok, l, code, err = pcall(pool.acquire, pool, "k")
          assert.is_true(ok, l)
          assert.is_nil(l)
          assert.equal("create", code)
          assert.is_true(contains(tostring(err), "create exploded"), tostring(err))
          local s = H.check(pool)
          assert.equal(0, s.live)
          assert.equal(0, s.creating)
          assert.equal(0, s.leases)
          sched.sleep(T(0.05))       -- past the create backoff's window
          l = assert(pool:try_acquire("k"))
          assert.equal(1, l.client.id)
        end)
      end)

      it("hands the forfeited reservation to the next waiter", function()
        run(function(sched)
          local pool, f = mkpool(sched, { max_live = 1 }, { latency = T(1) })
          f.fail_next = 1
          local first, second
          sched.spawn(function() first = { pool:acquire("k") } end)
          sched.spawn(function() second = { pool:acquire("k", { timeout = T(10) }) } end)
          sched.sleep(T(0.5))
          local s = H.check(pool)
          assert.equal(1, s.creating)
          assert.equal(1, s.waiting)
          sched.sleep(T(3))
          assert.is_nil(first[1])
          assert.equal("create", first[2])
          assert.equal("refused", first[3])
          assert.is_table(second[1], second[2])
          assert.equal(1, second[1].client.id)
          s = H.check(pool)
          assert.equal(1, s.live)
          assert.equal(0, s.creating)
          assert.equal(0, s.waiting)
        end)
      end)
    end)

    ---------------------------------------------------------------------------
    describe("argument errors", function()
      it("acquire and try_acquire reject a key that is not a string, naming the key", function()
        run(function(sched)
          local pool = mkpool(sched)
          assert_api_error(errmsg(pool.acquire, pool, 42), "key")
          assert_api_error(errmsg(pool.acquire, pool, {}), "key")
          assert_api_error(errmsg(pool.acquire, pool, true), "key")
          assert_api_error(errmsg(pool.try_acquire, pool, 42), "key")
          assert_api_error(errmsg(pool.try_acquire, pool, {}), "key")
          local s = H.check(pool)
          assert.equal(0, s.live)
          assert.equal(0, s.leases)
        end)
      end)

      it("acquire rejects opts that are not a table", function()
        run(function(sched)
          local pool = mkpool(sched)
          assert_api_error(errmsg(pool.acquire, pool, "k", 5), "table")
          assert_api_error(errmsg(pool.acquire, pool, "k", "fast"), "table")
        end)
      end)

      it("acquire rejects a negative, NaN or non-number opts.timeout", function()
        run(function(sched)
          local pool = mkpool(sched)
          assert_api_error(errmsg(pool.acquire, pool, "k", { timeout = -1 }), "timeout")
          assert_api_error(errmsg(pool.acquire, pool, "k", { timeout = 0 / 0 }), "timeout")
          assert_api_error(errmsg(pool.acquire, pool, "k", { timeout = "1" }), "timeout")
          local s = H.check(pool)
          assert.equal(0, s.leases)
          assert.equal(0, s.waiting)
        end)
      end)

      it("with rejects a non-function", function()
        run(function(sched)
          local pool = mkpool(sched)
          assert_api_error(errmsg(pool.with, pool, "k", "nope"), "function")
        end)
      end)
    end)
end)
