-- clientpool: shared leases, capacity > 1 (docs/api.md "Shared leases",
-- "Acquiring"; issue 4 "Shared leases").
--
-- Every scenario runs as a task on each scheduler of H.schedulers(), on a
-- virtual clock.

local clientpool = require "clientpool"
local H = require "spec.helpers"

local function near(expected, got, what)
  assert(type(got) == "number" and math.abs(got - expected) < 1e-6,
         (what or "value") .. ": expected " .. tostring(expected) .. ", got " .. tostring(got))
end

for _, S in ipairs(H.schedulers()) do
  describe("clientpool shared leases on " .. S.name, function()

    -- Runs body(sched) as a task on a fresh scheduler, to completion.
    local function run(body)
      local sched = S.new()
      S.run(sched, body, sched)
      return sched
    end

    -- capacity 3, max_live 2 unless o says otherwise.
    local function mkpool(sched, o, fo)
      local f = H.factory(sched, fo)
      local opts = { create = f.create, destroy = f.destroy, max_live = 2, capacity = 3, scheduler = sched }
      for k, v in pairs(o or {}) do opts[k] = v end
      return clientpool.new(opts), f
    end

    local function settle(sched)
      sched.sleep(0)
      sched.sleep(0)
    end

    local function waiter(sched, pool, key, opts)
      local w = { done = false }
      sched.spawn(function()
        w.lease, w.code, w.detail = pool:acquire(key, opts)
        w.client = w.lease and w.lease.client
        w.t1 = sched.now()
        w.done = true
      end)
      return w
    end

    ---------------------------------------------------------------------------
    describe("sharing", function()
      it("lets up to capacity leases share one client", function()
        run(function(sched)
          local pool, f = mkpool(sched)
          local l1 = assert(pool:acquire("k"))
          local l2 = assert(pool:acquire("k"))
          local l3 = assert(pool:acquire("k"))
          assert.equal(l1.client, l2.client)
          assert.equal(l1.client, l3.client)
          assert.are_not.equal(l1, l2)
          local s = H.check(pool)
          assert.equal(3, s.leases)
          assert.equal(1, s.active)
          assert.equal(1, s.live)
          assert.equal(0, s.idle)
          assert.equal(1, f.created)
          assert.equal(1, s.keys.k.active)
          assert.equal(3, s.keys.k.leases)
          -- a fourth lease needs a second client
          local l4 = assert(pool:acquire("k"))
          assert.are_not.equal(l1.client, l4.client)
          s = H.check(pool)
          assert.equal(4, s.leases)
          assert.equal(2, s.active)
          assert.equal(2, s.live)
          assert.equal(2, f.created)
          l1:release(); l2:release(); l3:release(); l4:release()
        end)
      end)

      it("does not share between keys", function()
        run(function(sched)
          local pool, f = mkpool(sched)
          local a = assert(pool:acquire("a"))
          local b = assert(pool:acquire("b"))
          assert.are_not.equal(a.client, b.client)
          assert.equal("a", a.client.key)
          assert.equal("b", b.client.key)
          assert.equal(2, f.created)
          local a2 = assert(pool:acquire("a"))   -- joins a's client, not b's
          assert.equal(a.client, a2.client)
          assert.equal(2, f.created)
          a:release(); b:release(); a2:release()
        end)
      end)

      it("grants the open client with the fewest leases", function()
        run(function(sched)
          local pool, f = mkpool(sched)
          local l1 = assert(pool:acquire("k"))
          local l2 = assert(pool:acquire("k"))
          local l3 = assert(pool:acquire("k"))
          local c1 = l1.client
          local l4 = assert(pool:acquire("k"))   -- c1 is full: a new client
          local c2 = l4.client
          assert.are_not.equal(c1, c2)
          local l5 = assert(pool:acquire("k"))   -- c1 3 leases, c2 1: c2
          assert.equal(c2, l5.client)
          l1:release()
          l2:release()                            -- c1 1 lease, c2 2: c1
          local l6 = assert(pool:acquire("k"))
          assert.equal(c1, l6.client)
          local l7 = assert(pool:acquire("k"))   -- 2 and 2: either
          assert(l7.client == c1 or l7.client == c2)
          local l8 = assert(pool:acquire("k"))   -- the other one, now the fewest
          assert.are_not.equal(l7.client, l8.client)
          assert.equal(2, f.created)
          local s = H.check(pool)
          assert.equal(6, s.leases)
          assert.equal(2, s.active)
          l3:release(); l4:release(); l5:release(); l6:release(); l7:release(); l8:release()
          s = H.check(pool)
          assert.equal(2, s.idle)
          assert.equal(0, s.leases)
        end)
      end)

      it("prefers an idle client to sharing an open one", function()
        run(function(sched)
          local pool, f = mkpool(sched)
          local l1 = assert(pool:acquire("k"))
          local l2 = assert(pool:acquire("k"))
          local l3 = assert(pool:acquire("k"))
          local l4 = assert(pool:acquire("k"))   -- c2
          local c2 = l4.client
          l4:release()                            -- c2 idle; c1 carries 3
          l3:release()                            -- c1 open with 2
          local l5 = assert(pool:acquire("k"))
          assert.equal(c2, l5.client)
          assert.equal(2, f.created)
          l1:release(); l2:release(); l5:release()
        end)
      end)

      it("runs validate on idle reuse only, never for a shared grant", function()
        run(function(sched)
          local calls = 0
          local pool = mkpool(sched, { validate = function() calls = calls + 1; return true end })
          local l1 = assert(pool:acquire("k"))   -- created
          local l2 = assert(pool:acquire("k"))   -- shared
          local l3 = assert(pool:acquire("k"))   -- shared
          assert.equal(0, calls)
          l1:release(); l2:release(); l3:release()
          sched.sleep(1)
          local m1 = assert(pool:acquire("k"))   -- idle reuse: validated
          assert.equal(1, calls)
          local m2 = assert(pool:acquire("k"))   -- shared: not validated
          assert.equal(1, calls)
          assert.equal(m1.client, m2.client)
          m1:release(); m2:release()
        end)
      end)

      it("releasing every lease returns the client to idle, and it is reused", function()
        run(function(sched)
          local pool, f = mkpool(sched)
          local l1 = assert(pool:acquire("k"))
          local l2 = assert(pool:acquire("k"))
          local c = l1.client
          l1:release()
          local s = H.check(pool)
          assert.equal(0, s.idle)
          assert.equal(1, s.active)
          assert.equal(1, s.leases)
          assert.equal(c, l2.client)
          l2:release()
          s = H.check(pool)
          assert.equal(1, s.idle)
          assert.equal(0, s.active)
          assert.equal(0, s.leases)
          assert.equal(0, s.closed)
          local again = assert(pool:acquire("k"))
          assert.equal(c, again.client)
          assert.equal(1, f.created)
          again:release()
        end)
      end)

      it("acquisitions queued while the client is created share it once it exists", function()
        run(function(sched)
          local pool, f = mkpool(sched, { max_live = 1 }, { latency = 1 })
          local w1 = waiter(sched, pool, "k")
          local w2 = waiter(sched, pool, "k")
          local w3 = waiter(sched, pool, "k")
          sched.sleep(0.5)
          assert.equal(1, H.check(pool).creating)
          sched.sleep(1)
          assert.is_true(w1.done and w2.done and w3.done)
          assert.is_table(w1.lease, tostring(w1.code))
          assert.is_table(w2.lease, tostring(w2.code))
          assert.is_table(w3.lease, tostring(w3.code))
          assert.equal(w1.client, w2.client)
          assert.equal(w1.client, w3.client)
          near(1, w3.t1, "w3 granted at")
          assert.equal(1, f.created)
          w1.lease:release(); w2.lease:release(); w3.lease:release()
        end)
      end)

      it("hands a freed share to a waiter", function()
        run(function(sched)
          local pool = mkpool(sched, { max_live = 1, capacity = 2 })
          local l1 = assert(pool:acquire("k"))
          local l2 = assert(pool:acquire("k"))
          local w = waiter(sched, pool, "k")
          sched.sleep(1)
          assert.is_false(w.done)
          l1:release()
          settle(sched)
          assert.is_true(w.done)
          assert.is_table(w.lease, tostring(w.code))
          assert.equal(l2.client, w.client)
          near(1, w.t1, "granted at")
          l2:release(); w.lease:release()
        end)
      end)
    end)

    ---------------------------------------------------------------------------
    describe("max_concurrency", function()
      it("counts leases; the default is max_live x capacity", function()
        run(function(sched)
          local pool, f = mkpool(sched)
          local held = {}
          for i = 1, 6 do held[i] = assert(pool:acquire("k")) end
          assert.equal(2, f.created)
          local l, code = pool:acquire("k", { timeout = 1 })
          assert.is_nil(l)
          assert.equal("timeout", code)
          near(1, sched.now(), "timed out at")
          local s = H.check(pool)
          assert.equal(6, s.leases)
          for i = 1, 6 do held[i]:release() end
        end)
      end)

      it("an explicit max_concurrency caps leases below the clients' room", function()
        run(function(sched)
          local pool, f = mkpool(sched, { max_concurrency = 4 })
          local held = {}
          for i = 1, 4 do held[i] = assert(pool:acquire("k")) end
          local w = waiter(sched, pool, "k", { timeout = 10 })
          sched.sleep(1)
          assert.is_false(w.done)                 -- the second client has room, still waits
          assert.equal(1, H.check(pool).waiting)
          held[1]:release()
          settle(sched)
          assert.is_true(w.done)
          assert.is_table(w.lease, tostring(w.code))
          assert.equal(4, H.check(pool).leases)
          assert.equal(2, f.created)
          for i = 2, 4 do held[i]:release() end
          w.lease:release()
        end)
      end)
    end)

    ---------------------------------------------------------------------------
    describe("loss", function()
      it("one lease's destroy() ends the client for every co-holder", function()
        run(function(sched)
          local pool, f = mkpool(sched)
          local l1 = assert(pool:acquire("k"))
          local l2 = assert(pool:acquire("k"))
          local l3 = assert(pool:acquire("k"))
          local c = l1.client
          local fired = { [l2] = 0, [l3] = 0 }
          l2:on_cancel(function(l) fired[l] = fired[l] + 1 end)
          l3:on_cancel(function(l) fired[l] = fired[l] + 1 end)
          assert.is_falsy(l2.lost)
          assert.is_false(l2:cancelled())
          l1:destroy()
          -- the others learn it at once
          assert.is_true(l2.lost)
          assert.is_true(l3.lost)
          assert.is_true(l2:cancelled())
          assert.is_true(l3:cancelled())
          assert.equal(1, fired[l2])
          assert.equal(1, fired[l3])
          -- but the client lives until the last co-holder releases
          settle(sched)
          assert.is_true(c.alive)
          assert.equal(0, f.destroyed)
          assert.equal(c, l2.client)
          local s = H.check(pool)
          assert.equal(1, s.live)
          assert.equal(2, s.leases)
          -- no new lease joins a lost client
          local n = assert(pool:acquire("k"))
          assert.are_not.equal(c, n.client)
          assert.equal(2, f.created)
          l2:release()
          settle(sched)
          assert.is_true(c.alive)
          l3:release()                            -- asks for reuse: destroyed anyway
          settle(sched)
          assert.is_false(c.alive)
          assert.equal(1, f.destroyed)
          s = H.check(pool)
          assert.equal(1, s.closed_by.error)
          assert.equal(1, s.live)
          assert.equal(0, s.idle)
          assert.equal(1, fired[l2])              -- callbacks ran once each
          assert.equal(1, fired[l3])
          n:release()
        end)
      end)

      it("release(false) by a co-holder is a loss too", function()
        run(function(sched)
          local pool = mkpool(sched)
          local l1 = assert(pool:acquire("k"))
          local l2 = assert(pool:acquire("k"))
          l2:release(false)
          assert.is_true(l1.lost)
          assert.is_true(l1:cancelled())
          l1:release()
          local s = H.check(pool)
          assert.equal(0, s.live)
          assert.equal(1, s.closed_by.error)
        end)
      end)

      it("a plain release by a co-holder is not a loss", function()
        run(function(sched)
          local pool = mkpool(sched)
          local l1 = assert(pool:acquire("k"))
          local l2 = assert(pool:acquire("k"))
          l2:release()
          assert.is_falsy(l1.lost)
          assert.is_false(l1:cancelled())
          local l3 = assert(pool:acquire("k"))
          assert.equal(l1.client, l3.client)
          l1:release(); l3:release()
          assert.equal(0, H.check(pool).closed)
        end)
      end)

      it("a lost lease's own destroy() is quiet, and a waiter gets a new client", function()
        run(function(sched)
          local pool, f = mkpool(sched, { max_live = 1, capacity = 2 })
          local l1 = assert(pool:acquire("k"))
          local l2 = assert(pool:acquire("k"))
          local c = l1.client
          local w = waiter(sched, pool, "k", { timeout = 10 })
          sched.sleep(1)
          l1:destroy()
          settle(sched)
          assert.is_false(w.done)                 -- the lost client takes no lease
          l2:destroy()
          settle(sched)
          assert.is_true(w.done)
          assert.is_table(w.lease, tostring(w.code))
          assert.are_not.equal(c, w.client)
          assert.equal(2, f.created)
          assert.equal(1, H.check(pool).closed_by.error)
          w.lease:release()
        end)
      end)
    end)

    ---------------------------------------------------------------------------
    describe("retirement", function()
      it("a shared client past max_lifetime takes no new lease and is destroyed at its last release", function()
        run(function(sched)
          local pool, f = mkpool(sched, { max_lifetime = 10 })
          local l1 = assert(pool:acquire("k"))
          local c = l1.client
          sched.sleep(11)
          local l2 = assert(pool:acquire("k"))
          assert.are_not.equal(c, l2.client)
          assert.is_true(c.alive)
          l1:release()
          settle(sched)
          assert.is_false(c.alive)
          assert.equal(1, H.check(pool).closed_by.lifetime)
          assert.equal(2, f.created)
          l2:release()
        end)
      end)

      it("pool:retire() keeps new leases off a shared client created before it", function()
        run(function(sched)
          local pool = mkpool(sched)
          local l1 = assert(pool:acquire("k"))
          local c = l1.client
          sched.sleep(1)
          pool:retire()
          sched.sleep(1)
          local l2 = assert(pool:acquire("k"))
          assert.are_not.equal(c, l2.client)
          l1:release()
          settle(sched)
          assert.is_false(c.alive)
          assert.equal(1, H.check(pool).closed_by.retired)
          l2:release()
        end)
      end)

      it("a client retired by a policy (redis READONLY) takes no new lease", function()
        run(function(sched)
          local pool, f = mkpool(sched, { policy = clientpool.policy.redis() })
          local l1 = assert(pool:acquire("k"))
          local l2 = assert(pool:acquire("k"))
          local c = l1.client
          l1:observe("READONLY You can't write against a read only replica.")
          local l3 = assert(pool:acquire("k"))
          assert.are_not.equal(c, l3.client)
          assert.equal(2, f.created)
          l1:release()
          settle(sched)
          assert.is_true(c.alive)                 -- l2 still holds it
          l2:release()
          settle(sched)
          assert.is_false(c.alive)
          assert.equal(1, H.check(pool).closed_by.retired)
          l3:release()
        end)
      end)
    end)

    ---------------------------------------------------------------------------
    describe("park", function()
      it("is not called while co-holders remain; unpark runs once per idle reuse", function()
        run(function(sched)
          local parks, unparks = 0, 0
          local pool = mkpool(sched, {
            park = function(c) parks = parks + 1; return { stored = c } end,
            unpark = function(st) unparks = unparks + 1; return st.stored end,
          })
          local l1 = assert(pool:acquire("k"))
          local l2 = assert(pool:acquire("k"))
          local c = l1.client
          l1:release()
          assert.equal(0, parks)
          assert.equal(c, l2.client)
          l2:release()
          assert.equal(1, parks)
          local m1 = assert(pool:acquire("k"))
          assert.equal(1, unparks)
          assert.equal(c, m1.client)
          local m2 = assert(pool:acquire("k"))   -- shared: no unpark
          assert.equal(1, unparks)
          assert.equal(c, m2.client)
          m2:release()
          assert.equal(1, parks)
          m1:release()
          assert.equal(2, parks)
        end)
      end)
    end)
  end)
end
