-- clientpool.acquire: acquire, try_acquire, with, validate, park/unpark,
-- and acquire outside a coroutine (docs/api.md; events, idle/lifetime
-- expiry, close, create failure and argument errors:
-- acquire_lifecycle_spec.lua; release/destroy: lease_spec.lua, leaks:
-- leak_spec.lua, stats: stats_spec.lua, waiting: acquire_wait_spec.lua).
-- The whole suite runs once per scheduler entry of spec/helpers.lua
-- (spec/acquire_helpers.lua). Times are written for a virtual clock, where
-- time only moves when tasks sleep, and multiplied by the entry's scale with
-- T(); on a real clock (cqueues, luv, copas) a time is checked as a lower bound.

local clientpool = require "clientpool"
local H = require "spec.helpers"
local A = require "spec.acquire_helpers"
local contains, errmsg, assert_api_error, wrap = H.contains, H.errmsg, H.assert_api_error, A.wrap

A.each_scheduler({ describe = describe, pending = pending, after_each = after_each }, function(S, P)
    local T, run, near, mkpool, settle, record_events =
          P.T, P.run, P.near, P.mkpool, P.settle, P.record_events

    describe("acquire", function()
      it("max_keys counts keys in use: an unused default key takes no place", function()
        run(function(sched)
          local pool = mkpool(sched, { max_keys = 1 })
          local a = assert(pool:acquire("redis-a"))
          local l, code, d = pool:acquire("redis-b")     -- a second key: over max_keys
          assert.is_nil(l)
          assert.equal("full", code)
          assert.equal("max_keys", d.reason)
          a:release()
          l, code = pool:acquire()                        -- the default key is a key too
          assert.is_nil(l)
          assert.equal("full", code)
          H.check(pool)
        end)
      end)

      it("creates lazily: nothing before the first acquire, one client per acquire", function()
        run(function(sched)
          local pool, f = mkpool(sched)
          assert.equal(0, f.created)
          local l = pool:acquire("k")
          assert.is_table(l)
          assert.equal(1, f.created)
          assert.is_table(l.client)
          assert.equal(1, l.client.id)
          assert.equal("k", l.client.key)
          local s = H.check(pool)
          assert.equal(1, s.opened)
          assert.equal(1, s.live)
          assert.equal(1, s.active)
          assert.equal(1, s.leases)
          assert.equal(0, s.idle)
          assert.equal(0, s.creating)
          assert.equal(0, s.reused)
          local l2 = assert(pool:acquire("k"))
          assert.equal(2, l2.client.id)
          assert.equal(2, f.created)
        end)
      end)

      it("hooks receive nil as the key for the default key", function()
        run(function(sched)
          local seen = {}
          local pool = mkpool(sched, {
            create = function(key) seen.create = { key } return {} end,
            validate = function(_, key) seen.validate = { key } return true end,
          })
          local l = assert(pool:acquire())
          l:release()
          l = assert(pool:acquire())
          assert.same({ {} }, { seen.create })
          assert.same({ {} }, { seen.validate })
          l:release()
        end)
      end)

      it("reuses a released client: reused counts, create is not called again", function()
        run(function(sched)
          local pool, f = mkpool(sched)
          local l = assert(pool:acquire("k"))
          local c = l.client
          l:release()
          local s = H.check(pool)
          assert.equal(1, s.idle)
          assert.equal(0, s.active)
          local l2 = assert(pool:acquire("k"))
          assert.equal(c, l2.client)
          assert.equal(1, f.created)
          s = H.check(pool)
          assert.equal(1, s.reused)
          assert.equal(1, s.opened)
          assert.equal(0, s.idle)
          assert.equal(1, s.active)
        end)
      end)

      it("takes the most recently released idle client first (LIFO)", function()
        run(function(sched)
          local pool = mkpool(sched)
          local a = assert(pool:acquire("k"))
          local b = assert(pool:acquire("k"))
          local ca, cb = a.client, b.client
          a:release()
          b:release()
          local x = assert(pool:acquire("k"))
          assert.equal(cb, x.client)
          local y = assert(pool:acquire("k"))
          assert.equal(ca, y.client)
        end)
      end)

      it("does not hand out a client of another key", function()
        run(function(sched)
          local pool, f = mkpool(sched)
          local a = assert(pool:acquire("a"))
          a:release()
          local b = assert(pool:acquire("b"))
          assert.equal("b", b.client.key)
          assert.equal(2, f.created)
        end)
      end)
    end)

    ---------------------------------------------------------------------------
    describe("validate", function()
      it("runs on idle reuse with (client, key, idle seconds), not on a fresh client", function()
        run(function(sched)
          local calls = {}
          local pool = mkpool(sched, {
            validate = function(c, key, idle)
              calls[#calls + 1] = { c = c, key = key, idle = idle, n = select("#", c, key, idle) }
              return true
            end,
          })
          local l = assert(pool:acquire("k"))
          local c = l.client
          assert.equal(0, #calls)
          sched.sleep(T(1))
          l:release()
          sched.sleep(T(2.5))
          local l2 = assert(pool:acquire("k"))
          assert.equal(c, l2.client)
          assert.equal(1, #calls)
          assert.equal(c, calls[1].c)
          assert.equal("k", calls[1].key)
          near(2.5, calls[1].idle, "idle seconds")
        end)
      end)

      it("returning false retires the client (invalid, destroy hook) and the same caller gets a new one", function()
        run(function(sched)
          local verdict = false
          local pool, f = mkpool(sched, { validate = function() return verdict end })
          local ev = record_events(pool, sched)
          local l = assert(pool:acquire("k"))
          local old = l.client
          l:release()
          local l2, code = pool:acquire("k")
          assert.is_table(l2, code)
          assert.are_not.equal(old, l2.client)
          assert.equal(2, l2.client.id)
          assert.equal(2, f.created)
          local s = H.check(pool)
          assert.equal(1, s.closed_by.invalid)
          assert.equal(1, s.closed)
          assert.equal(1, s.live)
          assert.equal(1, s.active)
          settle(sched)
          assert.equal(1, f.destroyed)
          assert.is_false(old.alive)
          local d = ev.of("destroy")
          assert.equal(1, #d)
          assert.equal(old, d[1][2])
          assert.equal("invalid", d[1][3])
          verdict = true
        end)
      end)

      it("an error in validate is treated as a failed validation (never raised)", function()
        run(function(sched)
          local pool, f = mkpool(sched, { validate = function() error("ping failed") end })
          local l = assert(pool:acquire("k"))
          local old = l.client
          l:release()
          local ok, l2, code = pcall(pool.acquire, pool, "k")
          assert.is_true(ok, l2)
          assert.is_table(l2, code)
          assert.are_not.equal(old, l2.client)
          local s = H.check(pool)
          assert.equal(1, s.closed_by.invalid)
          settle(sched)
          assert.equal(1, f.destroyed)
          assert.is_false(old.alive)
        end)
      end)

      it("with validate_after_idle, is skipped for a client idle less than that, run when idle longer", function()
        run(function(sched)
          local idles = {}
          local pool = mkpool(sched, {
            validate_after_idle = T(5),
            validate = function(_, _, idle) idles[#idles + 1] = idle; return true end,
          })
          local l = assert(pool:acquire("k"))
          l:release()
          sched.sleep(T(1))
          l = assert(pool:acquire("k"))
          assert.equal(0, #idles)
          l:release()
          sched.sleep(T(S.real and 2 or 4.9)) -- a real clock needs a margin below 5
          l = assert(pool:acquire("k"))
          assert.equal(0, #idles)
          l:release()
          sched.sleep(T(6))
          l = assert(pool:acquire("k"))
          assert.equal(1, #idles)
          near(6, idles[1], "idle seconds")
          l:release()
        end)
      end)
    end)

    ---------------------------------------------------------------------------
    describe("park/unpark", function()
      it("a client the release closes anyway (retired, past max_lifetime) is not parked", function()
        run(function(sched)
          local parks, destroyed = 0, {}
          local pool = clientpool.new { max_live = 2, max_lifetime = T(10), scheduler = sched,
            create = function() return { real = true } end,
            destroy = function(c) destroyed[#destroyed + 1] = c end,
            park = function(c) parks = parks + 1; return { stored = c } end,
            unpark = function(st) return st.stored end }
          local a = assert(pool:acquire())
          pool:retire()
          a:release()                               -- retired: closed, not parked
          local b = assert(pool:acquire())
          sched.sleep(T(11))
          b:release()                               -- past max_lifetime
          local _, h = pool:checkout()
          pool:retire()
          pool:checkin(h)                           -- the same through checkin
          local c = assert(pool:acquire())
          c:release()                               -- an ordinary release parks
          sched.sleep(0)
          sched.sleep(0)
          assert.equal(1, parks)
          assert.equal(3, #destroyed)
          for i = 1, 3 do assert.is_true(destroyed[i].real, "destroy " .. i .. " got the parked value") end
          pool:close()
        end)
      end)

      it("park(client, key) at release; unpark(stored, key) at reuse gives lease.client", function()
        run(function(sched)
          local calls = {}
          local pool, f = mkpool(sched, {
            park = function(c, key)
              calls[#calls + 1] = { "park", c, key }
              return { stored = c }
            end,
            unpark = function(stored, key)
              calls[#calls + 1] = { "unpark", stored, key }
              return { handle = stored.stored }
            end,
          })
          local l = assert(pool:acquire("k"))
          local c = l.client
          assert.equal(0, #calls) -- a fresh client is not unparked
          l:release()
          assert.equal(1, #calls)
          assert.equal("park", calls[1][1])
          assert.equal(c, calls[1][2])
          assert.equal("k", calls[1][3])
          local l2 = assert(pool:acquire("k"))
          assert.equal(2, #calls)
          assert.equal("unpark", calls[2][1])
          assert.same({ stored = c }, calls[2][2])
          assert.equal("k", calls[2][3])
          assert.same({ handle = c }, l2.client)
          assert.equal(1, f.created)
          assert.equal(1, H.check(pool).reused)
          l2:release()
          assert.equal("park", calls[3][1])
          assert.same({ handle = c }, calls[3][2]) -- the handle the lease had
        end)
      end)

      local function unpark_failure(unpark)
        run(function(sched)
          local pool, f = mkpool(sched, {
            park = function(c) return { stored = c } end,
            unpark = unpark,
            scheduler = wrap(sched, { log = function() end }),
          })
          local l = assert(pool:acquire("k"))
          local old = l.client
          l:release()
          local ok, l2, code = pcall(pool.acquire, pool, "k")
          assert.is_true(ok, l2)
          assert.is_table(l2, code)
          assert.equal(2, f.created)
          assert.are_not.equal(old, l2.client)
          assert.equal(2, l2.client.id)
          local s = H.check(pool)
          assert.equal(1, s.closed)
          assert.equal(1, s.closed_by.invalid)
          assert.equal(1, s.live)
          settle(sched)
          assert.equal(1, f.destroyed)
        end)
      end

      it("unpark returning nil retires the record and the caller gets a new client", function()
        unpark_failure(function() return nil end)
      end)

      it("unpark throwing retires the record and the caller gets a new client", function()
        unpark_failure(function() error("reconnect refused") end)
      end)
    end)

    ---------------------------------------------------------------------------
    describe("try_acquire", function()
      it("works outside a coroutine with an idle client or a create that does not yield", function()
        local sched = S.new()
        local pool, f = mkpool(sched)
        local l, code = pool:try_acquire("k")
        assert.is_table(l, code)
        assert.equal(1, f.created)
        local c = l.client
        l:release()
        local l2 = assert(pool:try_acquire("k"))
        assert.equal(c, l2.client)
        assert.equal(1, f.created)
        assert.equal(1, H.check(pool).reused)
        l2:release()
      end)

      it("never yields: run inside a coroutine it finishes in one resume", function()
        run(function(sched)
          local pool = mkpool(sched, nil, { latency = T(1) })
          for round = 1, 2 do
            local co = coroutine.create(function() return pool:try_acquire("k") end)
            local ok, l, code = coroutine.resume(co)
            assert.is_true(ok, l)
            assert.equal("dead", coroutine.status(co))
            if round == 1 then
              assert.is_nil(l)
              assert.equal("timeout", code)
              sched.sleep(T(2))
            else
              assert.is_table(l, code)
              l:release()
            end
          end
        end)
      end)

      it("returns nil, timeout when nothing is free (max_live reached) and queues nothing", function()
        local sched = S.new()
        local pool = mkpool(sched, { max_live = 1 })
        local held = assert(pool:try_acquire("k"))
        local t0 = sched.now()
        local l, code = pool:try_acquire("k")
        assert.is_nil(l)
        assert.equal("timeout", code)
        H.no_wait(S, t0, sched.now())
        local s = H.check(pool)
        assert.equal(0, s.waiting)
        assert.equal(1, s.live)
        local c = held.client
        held:release()
        -- a later acquisition gets the released client: nothing was left waiting for it
        local l2 = assert(pool:try_acquire("k"))
        assert.equal(c, l2.client)
        assert.equal(1, H.check(pool).reused)
      end)

      it("when create yields, returns nil, timeout at once; the created client then joins the idle pool", function()
        local sched = S.new()
        local pool, f = mkpool(sched, nil, { latency = T(1) })
        local l, code = pool:try_acquire("k")
        assert.is_nil(l)
        assert.equal("timeout", code)
        assert.equal(0, f.created)
        H.check(pool)
        S.run(sched, function() end) -- the scheduler finishes the creation
        assert.equal(1, f.created)
        local s = H.check(pool)
        assert.equal(1, s.idle)
        assert.equal(1, s.live)
        assert.equal(1, s.opened)
        assert.equal(0, s.creating)
        assert.equal(0, s.active)
        local l2 = assert(pool:try_acquire("k"))
        assert.equal(1, l2.client.id)
        assert.equal(1, f.created)
        l2:release()
      end)

      -- A create that yields a turn (sleep(0)) makes the grant's coroutine
      -- ready before the task that adopts it runs; the scheduler resumes it
      -- itself. Lua 5.1 runs hooks in a nested coroutine there, which the
      -- scheduler resumes without the grant around it: a known limit
      -- (docs/decisions.md), so 5.2+ only.
      local it52 = _VERSION ~= "Lua 5.1" and it or pending
      it52("when create yields a turn (sleep(0)), the created client joins the idle pool too, not a leak", function()
        local sched = S.new()
        local pool, f = mkpool(sched, nil, { latency = 0 })
        local l, code = pool:try_acquire("k")
        assert.is_nil(l)
        assert.equal("timeout", code)
        S.run(sched, function() end)
        collectgarbage(); collectgarbage()
        local s = H.check(pool)
        assert.equal(1, f.created)
        assert.equal(1, s.idle)
        assert.equal(0, s.active)
        assert.equal(0, s.leaked)
        local l2 = assert(pool:try_acquire("k"))
        assert.equal(1, l2.client.id)
        l2:release()
      end)

      it("inside a task, a yielding create also answers nil, timeout without the clock moving", function()
        run(function(sched)
          local pool, f = mkpool(sched, nil, { latency = T(3) })
          local t0 = sched.now()
          local l, code = pool:try_acquire("k")
          assert.is_nil(l)
          assert.equal("timeout", code)
          H.no_wait(S, t0, sched.now())
          assert.equal(1, H.check(pool).creating)
          sched.sleep(T(4))
          assert.equal(1, f.created)
          local s = H.check(pool)
          assert.equal(1, s.idle)
          assert.equal(0, s.creating)
        end)
      end)
    end)

    ---------------------------------------------------------------------------
    describe("acquire outside a coroutine", function()
      it("works when a client is free (idle or creatable)", function()
        local sched = S.new()
        local pool, f = mkpool(sched, { max_live = 1 })
        local l = assert(pool:acquire("k"))
        assert.equal(1, f.created)
        l:release()
        local l2 = assert(pool:acquire("k"))
        assert.equal(l2.client.id, 1)
        l2:release()
      end)

      it("raises an error saying it would wait when nothing is free, and leaves the pool sound", function()
        local sched = S.new()
        local pool = mkpool(sched, { max_live = 1 })
        local held = assert(pool:acquire("k"))
        local msg = errmsg(pool.acquire, pool, "k")
        assert_api_error(msg, "would wait")
        local s = H.check(pool)
        assert.equal(0, s.waiting)
        assert.equal(1, s.leases)
        held:release()
        s = H.check(pool)
        assert.equal(1, s.idle)
        assert.equal(0, s.active)
        assert.is_table((pool:acquire("k")))
      end)
    end)

    ---------------------------------------------------------------------------
    describe("with", function()
      it("returns fn's results (client, lease and extra arguments passed) and releases", function()
        run(function(sched)
          local pool, f = mkpool(sched)
          local seen
          local r = { pool:with("k", function(client, lease, x, y)
            seen = { client = client, lease = lease, lease_client = lease.client }
            return client.id, x + y, nil
          end, 2, 3) }
          assert.equal(1, r[1])
          assert.equal(5, r[2])
          assert.equal(1, seen.client.id)
          assert.equal(seen.client, seen.lease_client)
          local s = H.check(pool)
          assert.equal(1, s.idle)
          assert.equal(0, s.active)
          assert.equal(0, s.leases)
          -- the client is reused next time
          local id = pool:with("k", function(client) return client.id end)
          assert.equal(1, id)
          assert.equal(1, f.created)
          assert.equal(1, H.check(pool).reused)
        end)
      end)

      it("keeps every result, nils included", function()
        run(function(sched)
          local pool = mkpool(sched)
          local n = select("#", pool:with("k", function() return nil, 2, nil end))
          assert.equal(3, n)
        end)
      end)

      it("re-raises an error in fn (the same value) and destroys the client (closed_by.error)", function()
        run(function(sched)
          local pool, f = mkpool(sched)
          local boom = { "boom" }
          local client
          local ok, err = pcall(pool.with, pool, "k", function(c)
            client = c
            error(boom)
          end)
          assert.is_false(ok)
          assert.equal(boom, err)
          ok, err = pcall(pool.with, pool, "k", function() error("plain boom") end)
          assert.is_false(ok)
          assert.is_true(contains(tostring(err), "plain boom"))
          local s = H.check(pool)
          assert.equal(2, s.closed_by.error)
          assert.equal(0, s.live)
          assert.equal(0, s.leases)
          settle(sched)
          assert.equal(2, f.destroyed)
          assert.is_false(client.alive)
        end)
      end)

      it("returns nil, closed on a closed pool without calling fn", function()
        run(function(sched)
          local pool = mkpool(sched)
          pool:close()
          local called = false
          local r, code = pool:with("k", function() called = true end)
          assert.is_nil(r)
          assert.equal("closed", code)
          assert.is_false(called)
        end)
      end)
    end)
end)
