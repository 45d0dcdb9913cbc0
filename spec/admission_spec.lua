-- clientpool.admission: lease:observe and the policy's directives, pause,
-- and the keys pause, resume and retire hold (docs/api.md "Policies, pause
-- and resume"; issue 4 "Protocol policy"). resume_after, pause_mode, probe
-- and pool:retire(): admission_resume_spec.lua. The ready-made http and
-- redis policies: policy_spec.lua.
--
-- Every scenario runs as a task on each scheduler of H.schedulers(), on a
-- virtual clock (spec/admission_helpers.lua).

local H = require "spec.helpers"
local P = require "spec.admission_helpers"
local contains, errmsg, assert_api_error = H.contains, H.errmsg, H.assert_api_error
local near, copy = P.near, P.copy

P.each_scheduler(describe, function(_, B)
    local run, mkpool, settle, waiter, record_gate_events =
          B.run, B.mkpool, B.settle, B.waiter, B.record_gate_events

    describe("lease:observe", function()
      it("calls the policy with the outcome and the lease", function()
        run(function(sched)
          local calls = {}
          local pool = mkpool(sched, { policy = function(...)
            calls[#calls + 1] = { n = select("#", ...), ... }
          end })
          local l = assert(pool:acquire("k"))
          local outcome = { status = 200 }
          l:observe(outcome)
          l:observe("text")
          assert.equal(2, #calls)
          assert.equal(outcome, calls[1][1])
          assert.equal(l, calls[1][2])
          assert.equal("text", calls[2][1])
          assert.equal(l, calls[2][2])
          l:release()
        end)
      end)

      it("nil and { continue = true } change nothing", function()
        run(function(sched)
          local pool, f = mkpool(sched)
          local ev = record_gate_events(pool, sched)
          local l = assert(pool:acquire("k"))
          l:observe(nil)
          l:observe({ continue = true })
          local s = H.check(pool)
          assert.is_false(s.paused)
          assert.is_false(s.keys.k.paused)
          assert.equal(0, #ev)
          -- admission is open: the next acquisitions are served at once
          local l2 = assert(pool:try_acquire("k"))
          local l3 = assert(pool:try_acquire("other"))
          assert.equal(3, f.created)
          assert.equal(1, l.client.id)
          l:release(); l2:release(); l3:release()
          s = H.check(pool)
          assert.equal(3, s.idle)
          assert.equal(0, s.closed)
        end)
      end)

      it("never changes the outcome, nor cancels or retries the operation", function()
        run(function(sched)
          local pool, f = mkpool(sched, { policy = function(o)
            if type(o) == "table" and o.status == 429 then return { pause = "throttled" } end
          end })
          local l = assert(pool:acquire("k"))
          local client = l.client
          local outcome = { status = 429, body = "slow down", headers = { ["Retry-After"] = "1" } }
          local before = copy(outcome)
          l:observe(outcome)
          assert.same(before, outcome)
          -- the pause happened, but the operation and its lease are untouched
          local s = H.check(pool)
          assert.equal("throttled", s.paused)
          assert.equal(1, f.created)
          assert.equal(1, s.leases)
          assert.equal(client, l.client)
          assert.is_true(client.alive)
          assert.is_false(l:cancelled())
          -- a directive given as the outcome is not rewritten either
          local echo_pool = mkpool(sched)
          local l2 = assert(echo_pool:acquire("k"))
          local d = { pause = "busy", resume_after = 5 }
          l2:observe(d)
          assert.same({ pause = "busy", resume_after = 5 }, d)
          l:release()
          l2:release()
          assert.equal(1, H.check(pool).idle)
        end)
      end)

      it("raises 'lease released' on a released lease", function()
        run(function(sched)
          local pool = mkpool(sched)
          local l = assert(pool:acquire("k"))
          l:release()
          assert_api_error(errmsg(l.observe, l, { pause = "x" }), "lease released")
          assert.is_false(H.check(pool).paused)
          local l2 = assert(pool:acquire("k"))
          l2:destroy()
          assert_api_error(errmsg(l2.observe, l2, nil), "lease released")
        end)
      end)

      it("raises a 'clientpool:' error naming the field of a bad directive, and changes nothing", function()
        run(function(sched)
          local cases = {
            { d = "pause", words = { "policy" } },
            { d = 42, words = { "policy" } },
            { d = { pause = 42 }, words = { "pause" } },
            { d = { pause = true }, words = { "pause" } },
            { d = { pause = "x", scope = "world" }, words = { "scope" } },
            { d = { pause = "x", scope = 1 }, words = { "scope" } },
            { d = { pause = "x", resume_after = -1 }, words = { "resume_after" } },
            { d = { pause = "x", resume_after = 0 / 0 }, words = { "resume_after" } },
            { d = { pause = "x", resume_after = math.huge }, words = { "resume_after" } },
            { d = { pause = "x", resume_after = "5" }, words = { "resume_after" } },
          }
          local box = {}
          local pool = mkpool(sched, { policy = function() return box.d end })
          local l = assert(pool:acquire("k"))
          for i, c in ipairs(cases) do
            box.d = c.d
            local msg = errmsg(l.observe, l, "outcome")
            assert_api_error(msg, (table.unpack or unpack)(c.words))
            local s = H.check(pool)
            assert(s.paused == false, "case " .. i .. " paused the pool")
            assert(s.keys.k.paused == false, "case " .. i .. " paused the key")
          end
          -- still usable, and admission still open
          assert.is_table((pool:try_acquire("k")))
          l:release()
        end)
      end)
    end)

    ---------------------------------------------------------------------------
    describe("pause", function()
      it("a wait that times out on a paused key or pool says so in its detail", function()
        run(function(sched)
          local pool = mkpool(sched)
          pool:pause("LOADING", "a")
          local l, code, d = pool:acquire("a", { timeout = 1 })
          assert.is_nil(l)
          assert.equal("timeout", code)
          assert.equal("LOADING", d.paused)
          assert.is_true(contains(tostring(d), "paused: LOADING"), tostring(d))
          l, code = pool:acquire("b", { timeout = 0 })       -- another key: not paused
          assert.is_table(l, tostring(code))
          l:release()
          pool:pause("maintenance")
          l, code, d = pool:acquire("b", { timeout = 1 })
          assert.is_nil(l)
          assert.equal("timeout", code)
          assert.equal("maintenance", d.paused)
        end)
      end)

      it("{ pause = reason } pauses the pool: later acquisitions queue, held leases stay usable", function()
        run(function(sched)
          local pool, f = mkpool(sched)
          local ev = record_gate_events(pool, sched)
          local held = assert(pool:acquire("k"))
          local client = held.client
          held:observe({ pause = "busy" })
          local s = H.check(pool)
          assert.equal("busy", s.paused)
          assert.equal(1, #ev)
          assert.equal("pause", ev[1].name)
          assert.is_nil(ev[1][1])
          assert.equal("busy", ev[1][2])
          -- room to create, yet every key queues
          local w1 = waiter(sched, pool, "k")
          local w2 = waiter(sched, pool, "other")
          sched.sleep(1)
          assert.is_false(w1.done)
          assert.is_false(w2.done)
          s = H.check(pool)
          assert.equal(2, s.waiting)
          assert.equal(1, f.created)
          -- the held lease works and releases normally: its client goes idle,
          -- and a paused pool does not hand it to the waiter
          assert.equal(client, held.client)
          assert.is_true(client.alive)
          held:release()
          settle(sched)
          s = H.check(pool)
          assert.equal(1, s.idle)
          assert.equal(0, s.closed)
          assert.equal(2, s.waiting)
          assert.is_false(w1.done)
          sched.sleep(10)
          assert.is_false(w1.done)
          pool:resume()
          settle(sched)
          assert.is_true(w1.done and w2.done)
          assert.is_table(w1.lease, tostring(w1.code))
          assert.is_table(w2.lease, tostring(w2.code))
          assert.equal(client, w1.client)     -- the idle client, reused
          near(11, w1.t1, "w1 granted at")
          s = H.check(pool)
          assert.is_false(s.paused)
          assert.equal(2, #ev)
          assert.equal("resume", ev[2].name)
          assert.is_nil(ev[2][1])
          w1.lease:release()
          w2.lease:release()
        end)
      end)

      it("pool:pause(reason) queues acquisitions too, and try_acquire does not get through", function()
        run(function(sched)
          local pool, f = mkpool(sched)
          pool:pause("maintenance")
          assert.equal("maintenance", H.check(pool).paused)
          local l, code = pool:try_acquire("k")
          assert.is_nil(l)
          assert.are.not_equal(nil, code)
          local w = waiter(sched, pool, "k", { timeout = 1 })
          sched.sleep(2)
          assert.is_true(w.done)
          assert.equal("timeout", w.code)
          assert.equal(0, f.created)
          pool:resume()
          assert.is_table((pool:acquire("k")))
        end)
      end)

      it("queued acquisitions stay within max_waiting and time out by their own timeouts", function()
        run(function(sched)
          local pool = mkpool(sched, { max_waiting = 2, acquire_timeout = 100 })
          pool:pause("maintenance")
          local w1 = waiter(sched, pool, "k", { timeout = 1 })
          local w2 = waiter(sched, pool, "k", { timeout = 3 })
          sched.sleep(0)
          local l, code = pool:acquire("k", { timeout = 50 })
          assert.is_nil(l)
          assert.equal("full", code)
          local s = H.check(pool)
          assert.equal(2, s.waiting)
          assert.equal(1, s.rejected)
          sched.sleep(1)
          sched.sleep(0)
          assert.is_true(w1.done)
          assert.equal("timeout", w1.code)
          near(1, w1.t1, "w1 timed out at")
          assert.is_false(w2.done)
          sched.sleep(2)
          sched.sleep(0)
          assert.is_true(w2.done)
          assert.equal("timeout", w2.code)
          near(3, w2.t1, "w2 timed out at")
          s = H.check(pool)
          assert.equal(2, s.timeouts)
          assert.equal(0, s.waiting)
          assert.equal("maintenance", s.paused)
        end)
      end)

      it("pool:resume() lets the queued acquisitions through in their arrival order", function()
        run(function(sched)
          local pool = mkpool(sched, { max_live = 1 })
          pool:pause("busy")
          local delays = { 7, 3, 9, 1, 5, 2, 8, 4, 6 }
          local order = {}
          for i = 1, #delays do
            sched.spawn(function()
              sched.sleep(delays[i] / 100)
              local l = assert(pool:acquire("k"))
              order[#order + 1] = delays[i]
              sched.sleep(0.5)
              l:release()
            end)
          end
          sched.sleep(1)
          assert.equal(0, #order)
          assert.equal(#delays, H.check(pool).waiting)
          pool:resume()
          sched.sleep(10)
          assert.same({ 1, 2, 3, 4, 5, 6, 7, 8, 9 }, order)
        end)
      end)

      it("scope = \"key\" pauses only that key: other keys proceed", function()
        run(function(sched)
          local pool = mkpool(sched)
          local ev = record_gate_events(pool, sched)
          local la = assert(pool:acquire("a"))
          la:observe({ pause = "slow", scope = "key" })
          local s = H.check(pool)
          assert.is_false(s.paused)
          assert.equal("slow", s.keys.a.paused)
          assert.equal(1, #ev)
          assert.equal("a", ev[1][1])
          assert.equal("slow", ev[1][2])
          -- key b is served at once, key a queues
          local lb = assert(pool:try_acquire("b"))
          assert.is_false(H.check(pool).keys.b.paused)
          local wa = waiter(sched, pool, "a")
          local wb = waiter(sched, pool, "b")
          sched.sleep(1)
          assert.is_false(wa.done)
          assert.is_true(wb.done)
          assert.is_table(wb.lease)
          near(0, wb.t1, "b granted at")
          pool:resume("a")
          settle(sched)
          assert.is_true(wa.done)
          assert.is_table(wa.lease, tostring(wa.code))
          assert.is_false(H.check(pool).keys.a.paused)
          assert.equal("resume", ev[2].name)
          assert.equal("a", ev[2][1])
          la:release(); lb:release(); wa.lease:release(); wb.lease:release()
        end)
      end)

      it("pool:pause(reason, key) pauses one key; pool:resume() of the pool leaves it paused", function()
        run(function(sched)
          local pool = mkpool(sched)
          pool:pause("drain-a", "a")
          local s = H.check(pool)
          assert.equal("drain-a", s.keys.a.paused)
          assert.is_false(s.paused)
          local wa = waiter(sched, pool, "a")
          assert.is_table((pool:acquire("b")))
          sched.sleep(1)
          assert.is_false(wa.done)
          pool:resume()          -- the pool was not paused: key a stays paused
          sched.sleep(1)
          assert.is_false(wa.done)
          pool:resume("a")
          settle(sched)
          assert.is_table(wa.lease, tostring(wa.code))
        end)
      end)

      it("pool:pause raises on a reason that is not a string", function()
        run(function(sched)
          local pool = mkpool(sched)
          assert_api_error(errmsg(pool.pause, pool), "reason")
          assert_api_error(errmsg(pool.pause, pool, 42), "reason")
          assert_api_error(errmsg(pool.pause, pool, { "x" }), "reason")
          assert_api_error(errmsg(pool.pause, pool, "x", 42), "key")
          local s = H.check(pool)
          assert.is_false(s.paused)
          assert.is_table((pool:try_acquire("k")))
        end)
      end)
    end)

    ---------------------------------------------------------------------------
    describe("keys held by pause, resume and retire", function()
      local function nkeys(pool)
        local n = 0
        for _ in pairs(pool:stats().keys) do n = n + 1 end
        return n
      end

      it("resume or retire of a key the pool does not know opens none (max_keys stays free)", function()
        run(function(sched)
          local pool = mkpool(sched, { max_keys = 1 })
          pool:pause("429", "a")
          pool:resume("a")
          pool:resume("a")                    -- again: a manual resume after resume_after's
          pool:resume("ghost")
          pool:retire("ghost")
          assert.equal(0, nkeys(pool))
          local l, code = pool:try_acquire("b")
          assert.is_table(l, tostring(code))
          l:release()
        end)
      end)

      it("a pause from a destroy listener for the key's last client holds (the key was being forgotten)", function()
        run(function(sched)
          local pool = mkpool(sched)
          pool:on("destroy", function(key, _, reason)
            if reason == "error" then pool:pause("broken", key) end   -- a circuit breaker
          end)
          local l = assert(pool:acquire("x"))
          l:release(false)                    -- x's only client closed: x empties
          local l2, code, d = pool:acquire("x", { timeout = 1 })
          assert.is_nil(l2)
          assert.equal("timeout", code)
          assert.equal("broken", d.paused)
          pool:resume("x")
          assert(pool:acquire("x")):release()
        end)
      end)

      it("paused and resumed keys leave nothing behind; an old resume_after never resumes a new pause", function()
        run(function(sched)
          local pool = mkpool(sched)
          for i = 1, 200 do
            pool:_pause("busy", "k" .. i, 1, "pause")   -- as { pause = ..., scope = "key", resume_after = 1 }
            pool:resume("k" .. i)
          end
          assert.equal(0, nkeys(pool))
          assert.is_nil(next(pool._pgen))
          -- k1 paused again before its first resume_after fires: that timer
          -- must not end this pause
          pool:pause("again", "k1")
          sched.sleep(2)
          assert.equal("again", pool:stats().keys.k1.paused)
          pool:resume("k1")
        end)
      end)
    end)

end)
