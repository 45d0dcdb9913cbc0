-- Faults (issue 6) in create and validate: hooks that fail, throw or hang.
-- After each fault the pool must recover: its counts are consistent
-- (H.check), no capacity is lost (max_live acquisitions at once succeed,
-- and one more waits), no waiter is left hanging (every task this spec
-- spawns finishes, and the loop reports no deadlock), and every failure
-- reached its caller as an error code (asserted per scenario). destroy,
-- park/unpark, clients dying while idle and every hook at once:
-- faults_idle_spec.lua.
--
-- Runs over H.schedulers() (the loop on a virtual clock): hangs of many
-- seconds cost nothing there (spec/faults_helpers.lua).

local H = require "spec.helpers"
local F = require "spec.faults_helpers"
local contains = H.contains
local IS_51, kill, factory = F.IS_51, F.kill, F.factory

F.each_scheduler(describe, function(_, B)
    local run, mkpool, settle, assert_recovered, assert_closed_clean =
          B.run, B.mkpool, B.settle, B.assert_recovered, B.assert_closed_clean

    describe("create", function()
      it("returning nil: every caller gets nil, 'create', err; waiters get the forfeited slots", function()
        run(function(sched, ctx)
          local f = factory(sched)
          local pool = mkpool(sched, f, { max_live = 2 })
          f.plan.create = { { hang = 1, after = "nil" }, { hang = 1, after = "ok" }, { hang = 1, after = "nil" },
                            { hang = 1, after = "nil" }, { hang = 1, after = "ok" } }
          local res = {}
          for i = 1, 6 do
            ctx.go(function()
              local l, code, err = pool:acquire(nil, { timeout = 20 })
              res[i] = { l, code, err }
              if l then sched.sleep(0.5); l:release() end
            end)
          end
          sched.sleep(30)
          local ok, failed = 0, 0
          for i = 1, 6 do
            local r = assert(res[i], "caller " .. i .. " never returned")
            if r[1] then
              ok = ok + 1
            else
              failed = failed + 1
              assert.equal("create", r[2])
              assert.equal("refused", r[3])
            end
          end
          assert.equal(3, failed)
          assert.equal(3, ok)
          local s = H.check(pool)
          assert.equal(3, s.create_failed)
          assert_recovered(sched, pool, f, 2)
          assert_closed_clean(sched, pool, f)
        end)
      end)

      it("throwing (a string or any value, before or after yielding): nil, 'create', the error", function()
        run(function(sched, ctx)
          local f = factory(sched)
          local pool = mkpool(sched, f, { max_live = 1 })
          f.plan.create = { "throw", "throw_table", { hang = 2, after = "throw" } }
          local l, code, err = pool:acquire()
          assert.is_nil(l)
          assert.equal("create", code)
          assert.is_true(contains(err, "create exploded"), tostring(err))
          sched.sleep(0.05)      -- past the create backoff's window (one failure: <= 0.05 s)
          l, code, err = pool:acquire()
          assert.is_nil(l)
          assert.equal("create", code)
          assert.same({ hook = "create" }, err)
          sched.sleep(0.1)       -- two failures in a row: <= 0.1 s
          -- the third throws after a yield, with a waiter queued behind it
          local second
          ctx.go(function()
            local r = { pool:acquire(nil, { timeout = 10 }) }
            second = r
            if r[1] then r[1]:release() end
          end)
          l, code, err = pool:acquire()
          assert.is_nil(l)
          assert.equal("create", code)
          assert.is_true(contains(err, "create exploded"), tostring(err))
          sched.sleep(1)
          assert.is_table(second[1], tostring(second[2]))
          assert.equal(1, f.created)
          assert_recovered(sched, pool, f, 1)
          assert_closed_clean(sched, pool, f)
        end)
      end)

      it("hanging past the acquire timeout: the waiters behind it get 'timeout'; its client is kept", function()
        run(function(sched, ctx)
          local f = factory(sched)
          local pool = mkpool(sched, f, { max_live = 1, acquire_timeout = 1 })
          f.plan.create = { { hang = 5 } }
          local first, behind = {}, {}
          ctx.go(function()
            first = { pool:acquire() }
            first.at = sched.now()
          end)
          sched.sleep(0.5)
          for i = 1, 3 do
            ctx.go(function()
              local t0 = sched.now()
              behind[i] = { pool:acquire() }
              behind[i].waited = sched.now() - t0
            end)
          end
          sched.sleep(1.5)
          -- the acquire timeout bounds waiting in the queue: the waiters
          -- behind the hanging create fail with timeout, its detail shows why
          for i = 1, 3 do
            assert.is_nil(behind[i][1])
            assert.equal("timeout", behind[i][2])
            assert.equal(1, behind[i][3].creating)
            assert.equal(1, behind[i].waited)
          end
          local s = H.check(pool)
          assert.equal(1, s.creating)
          assert.equal(0, s.waiting)
          assert.equal(IS_51 and 3 or 4, s.timeouts)
          -- the deadline bounds the caller's own create too (DESIGN
          -- "Deadlines"; on Lua 5.1 it runs in the caller, which waits for
          -- it): the create goes on in the background and its client joins
          -- the idle set
          if IS_51 then
            sched.sleep(5)
            local l = assert(first[1], tostring(first[2]))
            assert.equal(5, first.at)
            l:release()
          else
            assert.is_nil(first[1])
            assert.equal("timeout", first[2])
            assert.equal(1, first.at)
            sched.sleep(5)
          end
          s = H.check(pool)
          assert.equal(1, s.live)
          assert.equal(1, s.idle)
          local l = assert(pool:acquire())
          assert.equal(1, l.client.id)
          l:release()
          s = assert_recovered(sched, pool, f, 1)
          assert.equal(1, s.opened)
          assert_closed_clean(sched, pool, f)
        end)
      end)

      it("hanging, then failing: the waiter that is still queued gets the slot and creates", function()
        run(function(sched, ctx)
          local f = factory(sched)
          local pool = mkpool(sched, f, { max_live = 1 })
          f.plan.create = { { hang = 5, after = "nil" } }
          local first, short, long
          ctx.go(function() first = { pool:acquire() } end)
          sched.sleep(0.1)
          ctx.go(function() short = { pool:acquire(nil, { timeout = 1 }) } end)
          ctx.go(function()
            long = { pool:acquire(nil, { timeout = 10 }) }
            long.id = long[1] and long[1].client.id
            if long[1] then long[1]:release() end
          end)
          sched.sleep(10)
          assert.same({ nil, "create", "refused" }, first)
          assert.is_nil(short[1])
          assert.equal("timeout", short[2])
          assert.is_table(long[1], tostring(long[2]))
          assert.equal(1, long.id)
          assert_recovered(sched, pool, f, 1)
          assert_closed_clean(sched, pool, f)
        end)
      end)

      it("hanging while the pool closes: the late client is destroyed at its release, nothing leaks", function()
        run(function(sched, ctx)
          local f = factory(sched)
          local pool = mkpool(sched, f, { max_live = 1 })
          f.plan.create = { { hang = 5 } }
          local first, waiter
          ctx.go(function()
            first = { pool:acquire() }
            if first[1] then first[1]:release() end
          end)
          sched.sleep(0.1)
          ctx.go(function() waiter = { pool:acquire() } end)
          sched.sleep(1)
          pool:close()
          sched.sleep(0)
          assert.same({ nil, "closed" }, waiter)
          sched.sleep(5)
          assert(first, "the creating caller never returned")
          -- whatever it got, the client it made is gone
          assert(first[1] or first[2] == "closed", tostring(first[2]))
          settle(sched)
          local s = H.check(pool)
          assert.equal(0, s.live)
          assert.equal(0, s.leases)
          assert.equal(0, s.creating)
          assert.equal(0, f.nopen())
          assert.equal(f.created, f.destroy_calls)
        end)
      end)

      it("hanging under try_acquire: 'timeout' at once, the client then joins the idle pool", function()
        run(function(sched)
          local f = factory(sched)
          local pool = mkpool(sched, f, { max_live = 1 })
          f.plan.create = { { hang = 5 } }
          local t0 = sched.now()
          local l, code, detail = pool:try_acquire()
          assert.is_nil(l)
          assert.equal("timeout", code)
          assert.equal(1, detail.creating)
          assert.equal(t0, sched.now())
          sched.sleep(6)
          local s = H.check(pool)
          assert.equal(1, s.idle)
          assert.equal(0, s.leases)
          l = assert(pool:try_acquire())
          assert.equal(1, l.client.id)
          l:release()
          assert_recovered(sched, pool, f, 1)
          assert_closed_clean(sched, pool, f)
        end)
      end)

      it("hanging under try_acquire, then failing or throwing: the slot comes back", function()
        run(function(sched)
          local f = factory(sched)
          local pool = mkpool(sched, f, { max_live = 1 })
          f.plan.create = { { hang = 5, after = "nil" } }
          assert.equal("timeout", select(2, pool:try_acquire()))
          sched.sleep(6)
          local s = H.check(pool)
          assert.equal(0, s.live)
          assert.equal(0, s.creating)
          f.plan.create = { { hang = 5, after = "throw" } }
          assert.equal("timeout", select(2, pool:try_acquire()))
          sched.sleep(6)
          s = H.check(pool)
          assert.equal(0, s.creating)
          assert.equal(2, s.create_failed)
          assert_recovered(sched, pool, f, 1)
          assert_closed_clean(sched, pool, f)
        end)
      end)

      it("hanging under try_acquire while the pool closes: the late client is destroyed", function()
        run(function(sched)
          local f = factory(sched)
          local pool = mkpool(sched, f, { max_live = 1 })
          f.plan.create = { { hang = 5 } }
          assert.equal("timeout", select(2, pool:try_acquire()))
          sched.sleep(1)
          pool:close()
          sched.sleep(6)
          local s = H.check(pool)
          assert.equal(0, s.live)
          assert.equal(0, s.creating)
          assert.equal(1, f.created)
          assert.equal(0, f.nopen())
        end)
      end)

      it("hanging in a coroutine that is killed: the reservation is forfeited once collected", function()
        run(function(sched, ctx)
          local f = factory(sched)
          local pool = mkpool(sched, f, { max_live = 1 })
          f.plan.create = { { hang = 5 } }
          local victim = ctx.go(function() pool:acquire() end)
          sched.sleep(1)
          assert.equal(1, H.check(pool).creating)
          kill(victim.co)
          ctx.live = ctx.live - 1 -- killed: it will never finish
          victim = nil -- luacheck: ignore 311
          -- the loop lets the dead coroutine go when its sleep is due
          sched.sleep(5)
          for _ = 1, 3 do
            collectgarbage("collect")
            settle(sched)
          end
          local s = H.check(pool)
          assert.equal(0, s.creating)
          assert.equal(0, s.leases)
          assert.equal(1, s.leaked)
          assert_recovered(sched, pool, f, 1)
          assert_closed_clean(sched, pool, f)
        end)
      end)
    end)

    ---------------------------------------------------------------------------
    describe("validate", function()
      it("throwing (before or after yielding) retires the client; the same caller gets a fresh one", function()
        run(function(sched)
          local f = factory(sched)
          local pool = mkpool(sched, f, { max_live = 3, validate = f.validate })
          local ls = {}
          for i = 1, 3 do ls[i] = assert(pool:acquire()) end
          for i = 1, 3 do ls[i]:release() end
          -- all three idle clients fail validation, one way or another: the
          -- caller goes through them and then creates
          f.plan.validate = { "throw", { hang = 1, after = "throw" }, "throw_table" }
          local t0 = sched.now()
          local l = assert(pool:acquire())
          assert.equal(1, sched.now() - t0)
          assert.equal(4, l.client.id)
          local s = H.check(pool)
          assert.equal(3, s.closed_by.invalid)
          assert.equal(1, s.live)
          l:release()
          assert_recovered(sched, pool, f, 3)
          assert_closed_clean(sched, pool, f)
        end)
      end)

      it("throwing at max_live: the retired client's slot serves the caller and the waiters", function()
        run(function(sched, ctx)
          local f = factory(sched)
          local pool = mkpool(sched, f, { max_live = 1, validate = f.validate })
          assert(pool:acquire()):release()
          local held = assert(pool:acquire())
          f.plan.validate = { "throw", "throw" }
          local got = {}
          for i = 1, 3 do
            ctx.go(function()
              local l, code = pool:acquire(nil, { timeout = 5 })
              got[i] = l and l.client.id or code
              if l then sched.sleep(0.1); l:release() end
            end)
          end
          sched.sleep(0.5)
          held:release()
          sched.sleep(3)
          -- two validations fail, each retires client and the slot is used
          -- to create: everybody is served within its timeout
          for i = 1, 3 do assert.is_number(got[i], tostring(got[i])) end
          assert.equal(3, f.created)
          assert.equal(2, H.check(pool).closed_by.invalid)
          assert_recovered(sched, pool, f, 1)
          assert_closed_clean(sched, pool, f)
        end)
      end)

      it("validate failing keeps the caller's place in the queue and its deadline", function()
        run(function(sched, ctx)
          local f = factory(sched)
          local pool = mkpool(sched, f, { max_live = 1, validate = f.validate })
          assert(pool:acquire()):release()
          local held = assert(pool:acquire())
          f.plan.validate = { "throw" }            -- the first validation only
          local order, got, t1 = {}, {}, {}
          for i = 1, 3 do
            ctx.go(function()
              local l, code = pool:acquire(nil, { timeout = 2 })
              order[#order + 1] = i
              got[i], t1[i] = l and l.client.id or code, sched.now()
              if l then sched.sleep(0.1); l:release() end
            end)
          end
          sched.sleep(0.5)
          local t0 = sched.now()
          held:release()        -- to waiter 1, whose validate throws: it creates, in its place
          sched.sleep(3)
          assert.same({ 1, 2, 3 }, order)
          assert.same({ 2, 2, 2 }, got)             -- the new client, served in turn
          assert.is_true(t1[1] - t0 < 0.1, "waiter 1 was served after " .. (t1[1] - t0))
          local s = H.check(pool)
          assert.equal(1, s.closed_by.invalid)
          assert.equal(0, s.timeouts)
          assert_recovered(sched, pool, f, 1)
          assert_closed_clean(sched, pool, f)
        end)
      end)

      it("a pause that comes while validate runs holds the caller's new grant until resume", function()
        run(function(sched, ctx)
          local f = factory(sched)
          local pool = mkpool(sched, f, { max_live = 2, validate = f.validate })
          assert(pool:acquire()):release()
          f.plan.validate = { { hang = 1, after = "throw" } }   -- yields 1 s, then throws
          local got, at
          ctx.go(function()
            local l, code = pool:acquire(nil, { timeout = 10 })
            got, at = l and l.client.id or code, sched.now()
            if l then l:release() end
          end)
          local t0 = sched.now()
          sched.sleep(0.5)
          pool:pause("LOADING")
          sched.sleep(1)
          assert.is_nil(got)                        -- no create while paused
          assert.equal(1, f.created)
          assert.is_true(ctx.logged("validate hook failed"))
          pool:resume()
          sched.sleep(0.5)
          assert.equal(2, got)
          assert.is_true(at - t0 >= 1.5, "served at " .. (at - t0))
          assert.equal(1, H.check(pool).closed_by.invalid)
          assert_recovered(sched, pool, f, 2)
          assert_closed_clean(sched, pool, f)
        end)
      end)

      it("a caller with nothing queued keeps trying its own idle clients, then creates", function()
        run(function(sched)
          local f = factory(sched)
          local pool = mkpool(sched, f, { max_live = 2, validate = f.validate })
          local a, b = assert(pool:acquire()), assert(pool:acquire())
          a:release()
          b:release()
          f.plan.validate = { "false", "false" }
          local l = assert(pool:acquire())          -- both idle clients refused: a new one
          assert.equal(3, l.client.id)
          assert.equal(2, H.check(pool).closed_by.invalid)
          l:release()
          assert_recovered(sched, pool, f, 2)
          assert_closed_clean(sched, pool, f)
        end)
      end)
    end)

    ---------------------------------------------------------------------------
end)
