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
  -- parked: a pool with park/unpark hooks (no C fast path: the Lua path
  -- unparks without a grant record, issue 17's bench B5; try_acquire runs
  -- a hook in a coroutine of its own, so acquire only, and so does every
  -- hook on PUC Lua 5.1, base.ycall, so not there)
  local parked = not (_VERSION == "Lua 5.1" and not rawget(_G, "jit")) and "parked" or nil
  for _, path in ipairs { "fast", "lua", parked } do
    for _, try in ipairs(path == "parked" and { false } or { false, true }) do
      local what = (try and "try_acquire" or "acquire") .. "/release, " .. path .. " path"
      it(what, function()
        local o = { max_live = 2, create = function() return {} end }
        if path == "parked" then
          local stored = {}
          o.park = function(c) stored.c = c; return stored end
          o.unpark = function(st) return st.c end
        end
        local pool = clientpool.new(o)
        if path == "lua" then
          H.without_fastpath(pool)
        end
        local bytes = per_pair(pool, try)
        pool:close()
        assert(bytes <= 128, what .. ": " .. bytes .. " bytes per pair")
        assert(bytes > 0, what .. ": nothing allocated: the measurement is broken")
      end)
    end
  end
end)

-- The binding's C fast path makes the lease's release method itself a C
-- function (lfastpath.c's lease_release, in the pool's leases' method
-- table): the common case without the Lua Lease.release in front of it.
-- What it does not do it hands to Lease.release, whose errors must still
-- name the caller's line, and whose other cases (another pool's lease, a
-- listener, a drain) must still happen.
describe("a lease's release on the C fast path", function()
  local fast = clientpool.backend == "core"
  local it_fast = fast and it or pending
  local function counted(o)
    local f = { made = 0, destroyed = 0 }
    local opts = { max_live = 2, create = function() f.made = f.made + 1; return { n = f.made } end,
                   destroy = function() f.destroyed = f.destroyed + 1 end }
    for k, v in pairs(o or {}) do opts[k] = v end
    return clientpool.new(opts), f
  end

  -- each case: { what, fn, words }: fn raises a clientpool error naming
  -- the words, at a line of this file
  local function errors_at_caller(cases)
    for _, case in ipairs(cases) do
      local err = H.errmsg(case[2])
      assert_api_error(err, table.unpack and table.unpack(case[3]) or unpack(case[3]))
      assert.truthy(err:find("lease_spec%.lua:%d+:"), case[1] .. ": no caller's line: " .. err)
    end
  end

  it_fast("is a C function, and a pair leaves the pool as it found it", function()
    local pool, f = counted()
    local l = assert(pool:acquire("k"))
    assert.equal("C", debug.getinfo(l.release, "S").what)
    l:release()
    for _ = 1, 100 do assert(pool:acquire("k")):release() end
    local s = H.check(pool)
    assert.equal(1, f.made)
    assert.equal(0, f.destroyed)
    assert.equal(1, s.idle)
    assert.equal(0, s.leases)
    pool:close()
  end)

  it("raises its argument errors at the caller's line", function()
    local pool = counted()
    local l = assert(pool:acquire("k"))
    errors_at_caller({
      { "release(5)", function() l:release(5) end, { "release", "#1", "boolean" } },
      { "release('x') of a released lease", function() l:release(); l:release("x") end, { "release", "#1" } },
      { "lease.release()", function() l.release() end, { "release", "colon" } },
      { "lease.release({})", function() l.release({}) end, { "release", "colon" } },
    })
    assert.equal(0, H.check(pool).leases)
    pool:close()
  end)

  it("acquire and try_acquire raise their argument errors at the caller's line", function()
    local pool = counted()
    if fast and tonumber(_VERSION:match("%d+%.%d+")) >= 5.3 then   -- (Lua 5.3+: the C closures themselves)
      assert.equal("C", debug.getinfo(rawget(pool, "acquire"), "S").what)
      assert.equal("C", debug.getinfo(rawget(pool, "try_acquire"), "S").what)
    end
    errors_at_caller({
      { "acquire(5)", function() pool:acquire(5) end, { "acquire", "#1", "key" } },
      { "acquire('k', 5)", function() pool:acquire("k", 5) end, { "acquire", "#2" } },
      { "acquire('k', { timout = 1 })", function() pool:acquire("k", { timout = 1 }) end, { "timout" } },
      { "acquire(5, {})", function() pool:acquire(5, {}) end, { "acquire", "#1", "key" } },
      { "pool.acquire()", function() pool.acquire() end, { "acquire", "colon" } },
      { "pool.acquire('k')", function() pool.acquire("k") end, { "acquire", "colon" } },
      { "try_acquire(5)", function() pool:try_acquire(5) end, { "try_acquire", "#1", "key" } },
      { "pool.try_acquire({})", function() pool.try_acquire({}) end, { "try_acquire", "colon" } },
    })
    local s = H.check(pool)
    assert.equal(0, s.leases)
    assert.equal(0, s.waiting)
    pool:close()
  end)

  it("acquire with options, and a grant it hands on (a create), on the fast pool", function()
    local pool, f = counted()
    local l1 = assert(pool:acquire("k", { timeout = 1 }))   -- create: handed to acquire_from
    local l2 = assert(pool:try_acquire("j"))               -- create: handed to try_from
    assert.equal(2, f.made)
    l1:release()
    l2:release()
    local l3 = assert(pool:acquire("k", {}))
    assert.equal(1, l3.client.n)
    l3:release()
    local s = H.check(pool)
    assert.equal(2, s.idle)
    assert.equal(0, s.leases)
    pool:close()
  end)

  it("of another pool's lease ends that lease, in its own pool", function()
    local a, fa = counted()
    local b, fb = counted()
    local la, lb = assert(a:acquire()), assert(b:acquire())
    la.release(lb, false)                -- la's method, lb's lease
    assert.equal(1, H.check(a).leases)
    assert.equal(0, H.check(b).leases)
    assert.equal(1, fb.destroyed)
    la:release()
    lb:release()
    assert.equal(0, fa.destroyed)
    assert.equal(1, H.check(a).idle)
    a:close()
    b:close()
  end)

  -- lfastpath.c knows the pool, the leases' metatable and the sentinels'
  -- by identity (pointers): a table that only looks like them is not ended
  -- by the fast path, and reaches the Lua path, which ends nothing of it
  it_fast("of a forged or tampered lease ends nothing, and the real lease still ends", function()
    local S = require("clientpool.lease").SENTINEL   -- (the sentinel's field: 1, or "_s" on LuaJIT)
    local pool, f = counted()
    local l = assert(pool:acquire("k"))
    local mt = getmetatable(l)
    assert.equal("table", type(mt))
    assert.truthy(pcall(function() setmetatable({}, mt):release() end))
    assert.truthy(pcall(function() setmetatable({ [S] = io.stdout, client = {} }, mt):release() end))
    local saved = l[S]
    l[S] = io.stdout                     -- another userdata where the sentinel was
    assert.truthy(pcall(function() l:release() end))
    local other = counted()
    local lo = assert(other:acquire("k"))
    l[S] = lo[S]                         -- another pool's sentinel
    assert.truthy(pcall(function() l:release() end))
    assert.equal(1, H.check(pool).leases)
    assert.equal(1, H.check(other).leases)
    lo:release()
    other:close()
    l[S] = saved
    l:release()
    local s = H.check(pool)
    assert.equal(0, s.leases)
    assert.equal(1, s.idle)
    assert.equal(0, f.destroyed)
    -- any value can be given the leases' metatable by the debug library:
    -- a number or a file handle as the lease (it crashed the C release,
    -- which indexed it as a table)
    for _, v in ipairs({ 5, io.stdout }) do
      local was = debug.getmetatable(v)
      debug.setmetatable(v, mt)
      local ok = pcall(mt.release or l.release, v)
      debug.setmetatable(v, was)
      assert.is_boolean(ok)
    end
    assert.is_false(pcall(pool.acquire, setmetatable({}, getmetatable(pool))))   -- not the pool
    assert.equal(0, H.check(pool).leases)
    pool:close()
  end)

  it("release(false) and destroy retire the client, and repeat as no-ops", function()
    local pool, f = counted()
    local l = assert(pool:acquire())
    l:release(false)
    l:release(false)
    l:destroy()
    assert.equal(1, f.destroyed)
    local l2 = assert(pool:acquire())
    l2:destroy()
    l2:release()
    assert.equal(2, f.destroyed)
    local s = H.check(pool)
    assert.equal(0, s.leases)
    assert.equal(0, s.idle)
    pool:close()
  end)

  it("with a release listener, or a waiter, still tells the listener and hands the client over", function()
    local loop = require("clientpool.loop").new()
    local pool, f = counted { max_live = 1, scheduler = loop }
    local heard = {}
    local got
    loop.spawn(function()
      local l = assert(pool:acquire("k"))
      loop.spawn(function()
        local l2 = assert(pool:acquire("k", { timeout = 5 }))
        got = l2.client
        l2:release()
      end)
      loop.sleep(0)                      -- the second task waits
      l:release()                        -- a waiter: pending events
      loop.sleep(0)
      pool:on("release", function(key, _, reuse) heard[#heard + 1] = key .. ":" .. tostring(reuse) end)
      local l3 = assert(pool:acquire("k"))
      l3:release()
    end)
    loop.run()
    assert.equal(1, got and got.n)
    assert.same({ "k:true" }, heard)
    assert.equal(1, f.made)
    assert.equal(1, H.check(pool).idle)
    pool:close()
  end)
end)

-- What the C fast path is told rather than reads (checkout.lua's
-- fastpath_sync): listeners added and removed, and a drain that began,
-- must reach it at once, in both pool forms. (A drain closes the pool, so
-- its releases also wake it through the events they queue: the drain
-- cases guard the whole, not the flag alone.)
describe("the C fast path learns of listeners and drains as they change", function()
  local function real_pool(o)
    local loop = require("clientpool.loop").new()
    local opts = { max_live = 2, create = function() return {} end, scheduler = loop }
    for k, v in pairs(o or {}) do opts[k] = v end
    return clientpool.new(opts), loop
  end

  it("an acquire or release listener added later hears both forms; removed, no more", function()
    local pool = real_pool()
    local heard = {}
    local function on_acquire(key) heard[#heard + 1] = "acquire " .. key end
    local function on_release(key, _, reuse) heard[#heard + 1] = "release " .. key .. " " .. tostring(reuse) end
    local function both()
      local _, h = pool:checkout("k")
      pool:checkin(h)
      assert(pool:acquire("k")):release()
      assert(pool:try_acquire("k")):release(false)
    end
    both()
    assert.same({}, heard)
    pool:on("acquire", on_acquire)
    both()
    assert.same({ "acquire k", "acquire k", "acquire k" }, heard)
    pool:on("release", on_release)
    pool:off("acquire", on_acquire)
    heard = {}
    both()
    assert.same({ "release k true", "release k true", "release k false" }, heard)
    pool:off("release", on_release)
    heard = {}
    both()
    assert.same({}, heard)
    pool:close()
  end)

  for _, form in ipairs { "lease", "checkout" } do
    it("a drain waiting for a " .. form .. " ends at its release", function()
      local pool, loop = real_pool()
      local drained
      loop.spawn(function()
        local lease, h
        if form == "lease" then lease = assert(pool:acquire("k")) else _, h = pool:checkout("k") end
        loop.spawn(function() drained = pool:drain() end)
        loop.sleep(0.01)                 -- drain() waits for this one
        assert.is_nil(drained)
        if lease then lease:release() else pool:checkin(h) end
      end)
      loop.run()                         -- (raises if the drain waited on, with no timer)
      assert.is_true(drained)
      assert.equal(0, pool:stats().leases)
    end)
  end
end)

-- With the queue at max_waiting the fast path leaves the acquisition to
-- the driver, which reaps dead waiters before the engine could refuse it
-- as full (lfastpath.c asks the engine: clientpool_queue_full).
describe("the C fast path with the queue at max_waiting", function()
  -- One client (max_live 1, max_waiting 1), held; a waiter queued for it,
  -- closed with coroutine.close (it54: Lua 5.4) while queued, or once
  -- granted the client and before it ran (off the engine's queue, but
  -- holding the client until the driver reaps it); then `form` takes the
  -- client. Returns the client taken (or nil and the code), and the pool.
  local function past_dead_waiter(form, granted)
    local loop = require("clientpool.loop").new()
    local pool = clientpool.new { max_live = 1, max_waiting = 1, create = function() return {} end,
                                  scheduler = loop }
    local got, code
    local function take()               -- (no options: the fast path's call)
      if form == "checkout" then
        local h
        got, h = pool:checkout("k")
        if got then pool:checkin(h) else code = h end
      else
        local l
        l, code = pool[form](pool, "k")
        got = l and l.client
        if l then l:release() end
      end
    end
    loop.spawn(function()
      local held = assert(pool:acquire("k"))
      local dead
      loop.spawn(function()
        dead = coroutine.running()
        pool:acquire("k")
      end)
      loop.sleep(0.01)
      if granted then
        held:release()                   -- granted to the waiter, which has not run
        assert(coroutine.close(dead))
        take()
      else
        assert(coroutine.close(dead))
        assert.equal(1, pool._nwaiters)  -- (not reaped yet: the queue is full)
        loop.spawn(take)                 -- it waits, not "full"
        loop.sleep(0.01)
        held:release()
      end
    end)
    loop.run()
    return got, code, pool
  end

  for _, form in ipairs { "try_acquire", "acquire", "checkout" } do
    it54(form .. " gets the client a dead waiter was granted and never took", function()
      local got, code, pool = past_dead_waiter(form, true)
      assert.is_table(got, tostring(code))
      local s = H.check(pool)
      assert.equal(0, s.waiting)
      assert.equal(1, s.idle)
      assert.equal(1, s.live)
      pool:close()
    end)
  end

  for _, form in ipairs { "acquire", "checkout" } do
    it54(form .. " reaps a dead waiter first: it waits, not 'full'", function()
      local got, code, pool = past_dead_waiter(form, false)
      assert.is_table(got, tostring(code))
      local s = H.check(pool)
      assert.equal(0, s.waiting)
      assert.equal(1, s.idle)
      pool:close()
    end)
  end
end)
