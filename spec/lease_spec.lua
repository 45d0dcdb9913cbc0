-- clientpool.lease: release and destroy (idempotence, reuse, retirement,
-- the release listener) and to-be-closed leases (Lua 5.4's <close>). The
-- whole suite runs once per scheduler entry of spec/helpers.lua, as
-- spec/acquire_spec.lua does (same helpers); times are spec seconds x T().

local clientpool = require "clientpool"
local H = require "spec.helpers"
local contains, errmsg, assert_api_error = H.contains, H.errmsg, H.assert_api_error

local it54 = _VERSION == "Lua 5.4" and it or pending

for _, M in ipairs(H.missing_schedulers()) do
  describe("clientpool leases on " .. M.name, function()
    pending("not run: " .. M.reason)
  end)
end

for _, S in ipairs(H.schedulers { hosts = true }) do
  describe("clientpool leases on " .. S.name, function()
    after_each(function() if S.finish then S.finish() end end)

    -- run, mkpool, settle: spec/helpers.lua H.kit
    local run, mkpool, settle = H.kit(S, { max_live = 4 })

    ---------------------------------------------------------------------------
    describe("release and destroy", function()
      it("release is idempotent: a second release changes nothing", function()
        run(function(sched)
          local pool, f = mkpool(sched)
          local l = assert(pool:acquire("k"))
          l:release()
          local s1 = pool:stats()
          l:release()
          l:release(false)
          l:destroy()
          assert.same(s1, pool:stats())
          settle(sched)
          assert.equal(0, f.destroyed)
        end)
      end)

      it("a stale release never ends the lease of the client's next holder", function()
        run(function(sched)
          local pool = mkpool(sched)
          local l1 = assert(pool:acquire("k"))
          l1:release()
          local l2 = assert(pool:acquire("k")) -- the same client, a new lease
          l1:release()
          l1:destroy()
          local s = H.check(pool)
          assert.equal(1, s.active)
          assert.equal(1, s.leases)
          assert.equal(0, s.idle)
          assert.equal(0, s.closed)
          l2:release()
          assert.equal(1, H.check(pool).idle)
        end)
      end)

      it("destroy retires the client (closed_by.error, destroy hook) and is idempotent", function()
        run(function(sched)
          local pool, f = mkpool(sched)
          local l = assert(pool:acquire("k"))
          local c = l.client
          l:destroy()
          l:destroy()
          l:release()
          local s = H.check(pool)
          assert.equal(1, s.closed)
          assert.equal(1, s.closed_by.error)
          assert.equal(0, s.live)
          assert.equal(0, s.idle)
          settle(sched)
          assert.equal(1, f.destroyed)
          assert.is_false(c.alive)
        end)
      end)

      it("release(false) retires the client (closed_by.error)", function()
        run(function(sched)
          local pool, f = mkpool(sched)
          local l = assert(pool:acquire("k"))
          local c = l.client
          l:release(false)
          local s = H.check(pool)
          assert.equal(1, s.closed_by.error)
          assert.equal(0, s.live)
          settle(sched)
          assert.equal(1, f.destroyed)
          assert.is_false(c.alive)
          local l2 = assert(pool:acquire("k"))
          assert.are_not.equal(c, l2.client)
        end)
      end)

      it("release then destroy is a no-op: the client stays idle", function()
        run(function(sched)
          local pool, f = mkpool(sched)
          local l = assert(pool:acquire("k"))
          l:release()
          l:destroy()
          local s = H.check(pool)
          assert.equal(1, s.idle)
          assert.equal(0, s.closed)
          settle(sched)
          assert.equal(0, f.destroyed)
        end)
      end)

      it("observe on a released lease raises 'lease released'; on a held one it does not", function()
        run(function(sched)
          local pool = mkpool(sched)
          local l = assert(pool:acquire("k"))
          l:observe({ status = 200 })
          l:release()
          assert_api_error(errmsg(l.observe, l, { status = 200 }), "lease released")
          local l2 = assert(pool:acquire("k"))
          l2:destroy()
          assert_api_error(errmsg(l2.observe, l2, {}), "lease released")
        end)
      end)

      it("never yields: release and destroy work outside the scheduler", function()
        local sched = S.new()
        local pool, f = mkpool(sched)
        local a, b = assert(pool:acquire("k")), assert(pool:acquire("k"))
        a:release()
        b:destroy()
        local s = H.check(pool)
        assert.equal(1, s.idle)
        assert.equal(1, s.closed_by.error)
        S.run(sched, function() end) -- the destroy hook runs as a task
        assert.equal(1, f.destroyed)
      end)
    end)

    ---------------------------------------------------------------------------
    describe("to-be-closed leases", function()
      it54("leaving the scope releases the lease", function()
        run(function(sched)
          local pool, f = mkpool(sched)
          local chunk = assert(load([[
            local pool, seen = ...
            do
              local lease <close> = assert(pool:acquire("k"))
              seen.client = lease.client
              seen.active = pool:stats().active
            end
            seen.idle_after = pool:stats().idle
          ]]))
          local seen = {}
          chunk(pool, seen)
          assert.equal(1, seen.active)
          assert.equal(1, seen.idle_after)
          local s = H.check(pool)
          assert.equal(0, s.leases)
          assert.equal(0, s.closed)
          local l = assert(pool:acquire("k"))
          assert.equal(seen.client, l.client)
          assert.equal(1, f.created)
        end)
      end)

      it54("an error in the scope destroys the client", function()
        run(function(sched)
          local pool, f = mkpool(sched)
          local chunk = assert(load([[
            local pool, seen = ...
            local lease <close> = assert(pool:acquire("k"))
            seen.client = lease.client
            error("request failed")
          ]]))
          local seen = {}
          local ok, err = pcall(chunk, pool, seen)
          assert.is_false(ok)
          assert.is_true(contains(tostring(err), "request failed"))
          local s = H.check(pool)
          assert.equal(0, s.leases)
          assert.equal(0, s.live)
          assert.equal(1, s.closed_by.error)
          settle(sched)
          assert.equal(1, f.destroyed)
          assert.is_false(seen.client.alive)
        end)
      end)
    end)

  end)
end

-- The lease table's size (issue 17, bench B4.alloc_lease): a lease pair
-- allocates the lease table alone, which holds its client and its leak
-- sentinel (record, key, slot and generation are the pool's), at most 128
-- bytes on every interpreter (it was an 8-field table, 248-384 B). Both the
-- binding's C fast path (PUC Lua, LuaJIT with the JIT off) and the Lua path
-- (the fast path's methods removed, as in checkout_spec's differential
-- spec; the FFI backend's only path).
describe("a lease pair allocates at most 128 bytes", function()
  local function per_pair(pool, try)
    local function pairs_n(n)
      for _ = 1, n do
        local lease = try and pool:try_acquire("k") or pool:acquire("k")
        lease:release()
      end
    end
    return H.bytes_per(pairs_n)
  end
  for _, path in ipairs { "fast", "lua" } do
    for _, try in ipairs { false, true } do
      local what = (try and "try_acquire" or "acquire") .. "/release, " .. path .. " path"
      it(what, function()
        local pool = clientpool.new { max_live = 2, create = function() return {} end }
        if path == "lua" then
          pool.acquire, pool.try_acquire, pool._frel, pool._fp = nil, nil, nil, nil
        end
        local bytes = per_pair(pool, try)
        pool:close()
        assert(bytes <= 128, what .. ": " .. bytes .. " bytes per pair")
        assert(bytes > 0, what .. ": nothing allocated: the measurement is broken")
      end)
    end
  end
end)
