-- Faults (issue 6) on the way back and while idle: destroy throwing, park
-- and unpark failing, a client dying while idle, and every hook failing at
-- once. After each fault the pool must recover, as in faults_spec.lua
-- (create and validate): counts consistent, no capacity lost, no waiter left
-- hanging, every failure reported to its caller.
--
-- Runs over H.schedulers() (the loop on a virtual clock): hangs of many
-- seconds cost nothing there (spec/faults_helpers.lua).

local H = require "spec.helpers"
local F = require "spec.faults_helpers"
local contains = H.contains
local factory = F.factory

F.each_scheduler(describe, function(_, B)
    local run, mkpool, settle, assert_recovered, assert_closed_clean =
          B.run, B.mkpool, B.settle, B.assert_recovered, B.assert_closed_clean

    describe("destroy throwing", function()
      it("is logged; the pool is unaffected (release(false), max_idle, expiry, close)", function()
        run(function(sched, ctx)
          local f = factory(sched)
          local pool = mkpool(sched, f, { max_live = 3, max_idle = 1, idle_timeout = 10 })
          f.plan.destroy = { "throw", { hang = 1, after = "throw" }, "throw_table", "throw", "throw", "throw" }
          local a, b, c = assert(pool:acquire()), assert(pool:acquire()), assert(pool:acquire())
          a:release(false)                                 -- error
          b:release()                                      -- idle
          c:release()                                      -- max_idle: destroyed
          settle(sched)
          sched.sleep(1)
          local s = H.check(pool)
          assert.equal(1, s.live)
          assert.equal(1, s.closed_by.error)
          assert.equal(1, s.closed_by.max_idle)
          sched.sleep(20)                                  -- idle_timeout
          s = H.check(pool)
          assert.equal(0, s.live)
          assert.equal(1, s.closed_by.idle)
          assert.equal(3, f.destroy_calls)
          local n = 0
          for _, m in ipairs(ctx.logs) do
            if contains(m, "destroy hook failed") then n = n + 1 end
          end
          assert.equal(3, n)
          assert.is_true(ctx.logged("destroy exploded"))
          f.plan.destroy = { "throw", "throw", "throw" }
          assert_recovered(sched, pool, f, 3)
          f.plan.destroy = { "throw", "throw", "throw" }
          assert_closed_clean(sched, pool, f)
          assert.equal(6, f.destroy_calls)
        end)
      end)
    end)

    ---------------------------------------------------------------------------
    describe("park and unpark", function()
      local function parking(f, o)
        o = o or {}
        o.park, o.unpark = f.park, f.unpark
        return o
      end

      it("park throwing retires the client at its release (logged); the next acquire creates", function()
        run(function(sched, ctx)
          local f = factory(sched)
          local pool = mkpool(sched, f, parking(f, { max_live = 2 }))
          local a, b = assert(pool:acquire()), assert(pool:acquire())
          f.plan.park = { "throw", "throw_table" }
          a:release()
          b:release()
          settle(sched)
          local s = H.check(pool)
          assert.equal(0, s.live)
          assert.equal(2, f.destroy_calls)
          assert.is_true(ctx.logged("park hook failed"))
          local l = assert(pool:acquire())
          assert.equal(3, l.client.id)
          l:release()
          assert.equal(1, H.check(pool).idle)
          assert_recovered(sched, pool, f, 2)
          assert_closed_clean(sched, pool, f)
        end)
      end)

      it("park throwing while a waiter queues: the waiter gets a fresh client", function()
        run(function(sched, ctx)
          local f = factory(sched)
          local pool = mkpool(sched, f, parking(f, { max_live = 1 }))
          local held = assert(pool:acquire())
          local got
          ctx.go(function()
            local l, code = pool:acquire(nil, { timeout = 5 })
            got = l and l.client.id or code
            if l then l:release() end
          end)
          sched.sleep(0.5)
          f.plan.park = { "throw" }
          held:release()
          sched.sleep(1)
          -- the released client went to the waiter without parking (a
          -- handoff), or was retired and the waiter created: never lost
          assert.is_number(got)
          assert_recovered(sched, pool, f, 1)
          assert_closed_clean(sched, pool, f)
        end)
      end)

      it("unpark throwing or returning nil retires the client; the same caller gets a fresh one", function()
        run(function(sched, ctx)
          local f = factory(sched)
          local pool = mkpool(sched, f, parking(f, { max_live = 3 }))
          local ls = {}
          for i = 1, 3 do ls[i] = assert(pool:acquire()) end
          for i = 1, 3 do ls[i]:release() end
          f.plan.unpark = { "throw", { hang = 1, after = "nil" }, "throw_table" }
          local l = assert(pool:acquire())
          assert.equal(4, l.client.id)
          local s = H.check(pool)
          assert.equal(3, s.closed_by.invalid)
          assert.is_true(ctx.logged("unpark hook failed"))
          l:release()
          assert_recovered(sched, pool, f, 3)
          assert_closed_clean(sched, pool, f)
        end)
      end)

      it("unpark throwing at max_live: the waiters behind are served", function()
        run(function(sched, ctx)
          local f = factory(sched)
          local pool = mkpool(sched, f, parking(f, { max_live = 1 }))
          assert(pool:acquire()):release()
          f.plan.unpark = { "throw" }
          local got = {}
          for i = 1, 3 do
            ctx.go(function()
              local l, code = pool:acquire(nil, { timeout = 5 })
              got[i] = l and l.client.id or code
              if l then sched.sleep(0.1); l:release() end
            end)
          end
          sched.sleep(3)
          assert.same({ 2, 2, 2 }, got)
          assert_recovered(sched, pool, f, 1)
          assert_closed_clean(sched, pool, f)
        end)
      end)
    end)

    ---------------------------------------------------------------------------
    describe("a client dying while idle", function()
      it("validate detects it: retired (invalid), the caller gets a live client", function()
        run(function(sched)
          local f = factory(sched)
          local pool = mkpool(sched, f, { max_live = 2, validate = f.validate })
          local a, b = assert(pool:acquire()), assert(pool:acquire())
          a:release()
          b:release()
          b.client = nil
          -- the server restarted: every idle client is dead
          for c in pairs(f.open) do c.alive = false end
          local l = assert(pool:acquire())
          assert.is_true(l.client.alive)
          assert.equal(3, l.client.id)
          local s = H.check(pool)
          assert.equal(2, s.closed_by.invalid)
          assert.equal(1, s.live)
          l:release()
          assert_recovered(sched, pool, f, 2)
          assert_closed_clean(sched, pool, f)
        end)
      end)

      it("without validate (or inside validate_after_idle) the caller sees it and retires it with release(false)",
        function()
          run(function(sched)
            local f = factory(sched)
            local pool = mkpool(sched, f, { max_live = 1, validate = f.validate, validate_after_idle = 10 })
            assert(pool:acquire()):release()
            for c in pairs(f.open) do c.alive = false end
            sched.sleep(1) -- idle less than validate_after_idle: not validated
            local l = assert(pool:acquire())
            assert.is_false(l.client.alive)
            l:release(false)
            l = assert(pool:acquire())
            assert.is_true(l.client.alive)
            l:release()
            local s = H.check(pool)
            assert.equal(1, s.closed_by.error)
            -- idle longer than validate_after_idle: validated, retired
            for c in pairs(f.open) do c.alive = false end
            sched.sleep(11)
            l = assert(pool:acquire())
            assert.is_true(l.client.alive)
            l:release()
            assert.equal(1, H.check(pool).closed_by.invalid)
            assert_recovered(sched, pool, f, 1)
            assert_closed_clean(sched, pool, f)
          end)
        end)
    end)

    ---------------------------------------------------------------------------
    describe("every hook failing at once", function()
      it("a burst of acquirers under failing create, validate, destroy, park and unpark: all answered", function()
        run(function(sched, ctx)
          local f = factory(sched)
          local pool = mkpool(sched, f, { max_live = 3, validate = f.validate, park = f.park, unpark = f.unpark,
                                          acquire_timeout = 2 })
          local faults = { "ok", "nil", "throw", { hang = 0.5, after = "ok" }, { hang = 3, after = "nil" },
                           "throw_table", "ok" }
          local seed = 7
          local function rand(n)
            seed = seed * 16807 % 2147483647
            return seed % n + 1
          end
          for _ = 1, 60 do
            f.plan.create[#f.plan.create + 1] = faults[rand(#faults)]
            f.plan.validate[#f.plan.validate + 1] = ({ "ok", "false", "throw" })[rand(3)]
            f.plan.destroy[#f.plan.destroy + 1] = ({ "ok", "throw" })[rand(2)]
            f.plan.park[#f.plan.park + 1] = ({ "ok", "ok", "throw" })[rand(3)]
            f.plan.unpark[#f.plan.unpark + 1] = ({ "ok", "nil", "throw" })[rand(3)]
          end
          local codes = {}
          for i = 1, 40 do
            ctx.go(function()
              sched.sleep((i % 7) * 0.25)
              local l, code = pool:acquire()
              local k = l and "lease" or code
              codes[k] = (codes[k] or 0) + 1
              if l then
                sched.sleep(0.1)
                l:release(i % 5 ~= 0)
              end
            end)
          end
          sched.sleep(60)
          local total = 0
          for k, n in pairs(codes) do
            assert(k == "lease" or k == "create" or k == "timeout", "unexpected outcome " .. tostring(k))
            total = total + n
          end
          assert.equal(40, total)
          assert.is_true((codes.lease or 0) > 0)
          assert.is_true((codes.create or 0) > 0)
          assert_recovered(sched, pool, f, 3)
          assert_closed_clean(sched, pool, f)
        end)
      end)
    end)
end)
