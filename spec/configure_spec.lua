-- clientpool: pool:configure(opts), the options of a running pool (DESIGN
-- section 3 "Operating a live pool", issue 19; docs/api.md "Configure").
--
-- Every scenario runs as a task on each scheduler of H.schedulers { hosts =
-- true }: times are written for the virtual clock and scaled with T() on
-- the hosts' real clocks, where they are lower bounds; the counts the
-- hooks see are the proof. The hooks count the clients the upstream would
-- see: create increments before it returns, destroy decrements when it
-- returns (it takes a while: a graceful QUIT).

local clientpool = require "clientpool"
local H = require "spec.helpers"
local contains, errmsg = H.contains, H.errmsg_bare

-- Hooks that count clients open at once; destroy takes `slow` seconds.
local function counting(sched, slow)
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
  end
  return c
end

-- stats() without the fields a read changes nothing of: a comparable copy.
local function snapshot(pool)
  local s = pool:stats()
  local function flat(t, out, prefix)
    for k, v in pairs(t) do
      if type(v) == "table" then flat(v, out, prefix .. k .. ".") else out[prefix .. k] = v end
    end
    return out
  end
  return flat(s, {}, "")
end

for _, M in ipairs(H.missing_schedulers()) do
  describe("clientpool configure on " .. M.name, function()
    pending("not run: " .. M.reason)
  end)
end

for _, S in ipairs(H.schedulers { hosts = true }) do
  local function T(x) return x * S.scale end
  local function run(body)
    local sched = S.new()
    S.run(sched, body, sched)
  end
  -- Lets the tasks spawned so far (destroy hooks, woken waiters) run.
  local function settle(sched)
    for _ = 1, 4 do sched.sleep(0) end
  end
  -- Waits (polling the scheduler's clock) until cond() or `secs` spec seconds.
  local function wait_until(sched, cond, secs)
    local deadline = sched.now() + T(secs)
    while not cond() do
      if sched.now() > deadline then return false end
      sched.sleep(T(0.01))
    end
    return true
  end
  local function waiter(sched, pool, key, opts)
    local w = { done = false }
    sched.spawn(function()
      w.lease, w.code, w.detail = pool:acquire(key, opts)
      w.t1 = sched.now()
      w.done = true
    end)
    return w
  end

  describe("clientpool configure on " .. S.name, function()
    after_each(function() if S.finish then S.finish() end end)

    it("down under load: never more clients than the old cap, the new cap once the old leases end", function()
      run(function(sched)
        local c = counting(sched, T(0.5))
        local pool = clientpool.new { create = c.create, destroy = c.destroy, max_live = 8,
                                      scheduler = sched }
        local held, stop, done = {}, false, 0
        for i = 1, 12 do
          sched.spawn(function()
            while not stop do
              local l = assert(pool:acquire(i % 3 == 0 and "b" or nil, { timeout = T(1000) }))
              held[l] = true
              sched.sleep(T(0.1 * (i % 4 + 1)))
              held[l] = nil
              l:release()
            end
            done = done + 1
          end)
        end
        sched.sleep(T(1))
        assert.equal(8, c.open)                        -- the load holds all 8
        local old = {}
        for l in pairs(held) do old[#old + 1] = l end
        local at_configure = c.open
        assert.is_true(pool:configure { max_live = 3 })
        local old_ended, under = false, false
        local samples = 0
        while samples < 400 do
          samples = samples + 1
          sched.sleep(T(0.01))
          local s = pool:stats()
          assert.is_true(c.open <= at_configure, "the hooks count " .. c.open .. " clients, more than at configure")
          assert.is_true(s.live + s.creating + s.closing <= 8, "more than the old cap")
          if not old_ended then
            old_ended = true
            for _, l in ipairs(old) do if l.client ~= nil then old_ended = false end end
          elseif not under and s.closing == 0 then
            under = true                               -- the old leases ended, their destroys returned
          end
          if under then
            assert.is_true(c.open <= 3, "the hooks count " .. c.open .. " clients after the old leases ended")
            assert.is_true(s.live + s.creating + s.closing <= 3, "more than the new cap")
          end
        end
        assert.is_true(under, "the pool never got under its new cap")
        stop = true
        assert.is_true(wait_until(sched, function() return done == 12 end, 100))
        local s = H.check(pool)
        -- over the cap: resized (idle at configure, or leased and released while over); also
        -- max_idle (= max_live, 3) and evicted (two keys share the cap) once under it
        assert.is_true(s.closed_by.resized >= 1, "closed_by.resized = " .. s.closed_by.resized)
        assert.is_true(s.closed >= 5)
        assert.equal(s.closed, s.closed_by.resized + s.closed_by.max_idle + s.closed_by.evicted)
        assert.is_true(s.live <= 3)
        assert.equal(8, c.peak)
        pool:close()
        assert.is_true(wait_until(sched, function() return c.open == 0 end, 10))
      end)
    end)

    it("down: idle clients are retired at once, least recently used first", function()
      run(function(sched)
        local c = counting(sched)
        local pool = clientpool.new { create = c.create, destroy = c.destroy, max_live = 4, scheduler = sched }
        local ls = {}
        for i = 1, 4 do ls[i] = assert(pool:acquire()) end
        for i = 1, 4 do ls[i]:release() end            -- client 4 released last: the most recent
        assert.is_true(pool:configure { max_live = 2 })
        settle(sched)
        assert.equal(2, c.open)
        local s = H.check(pool)
        assert.equal(2, s.idle)
        assert.equal(2, s.closed_by.resized)
        local a, b = assert(pool:acquire()), assert(pool:acquire())
        assert.same({ 4, 3 }, { a.client.id, b.client.id })   -- LIFO: the two kept are the newest
        local _, code = pool:acquire(nil, { timeout = 0 })
        assert.equal("timeout", code)                  -- the new cap holds
        a:release()
        b:release()
        pool:close()
      end)
    end)

    it("up: queued waiters are served at once", function()
      run(function(sched)
        local c = counting(sched)
        local pool = clientpool.new { create = c.create, destroy = c.destroy, max_live = 1, scheduler = sched }
        local l = assert(pool:acquire())
        local ws = {}
        for i = 1, 3 do ws[i] = waiter(sched, pool, nil, { timeout = T(100) }) end
        sched.sleep(0)
        assert.equal(3, pool:stats().waiting)
        local t0 = sched.now()
        assert.is_true(pool:configure { max_live = 4 })
        settle(sched)
        for i = 1, 3 do assert.is_true(ws[i].done); assert.truthy(ws[i].lease, tostring(ws[i].code)) end
        H.no_wait(S, t0, ws[3].t1)
        assert.equal(4, c.open)
        local s = H.check(pool)
        assert.equal(0, s.waiting)
        assert.equal(4, s.leases)
        for i = 1, 3 do ws[i].lease:release() end
        l:release()
        pool:close()
      end)
    end)

    it("up: a raised max_concurrency and per_key.max_live serve waiters at once", function()
      run(function(sched)
        local c = counting(sched)
        local pool = clientpool.new { create = c.create, destroy = c.destroy, max_live = 4, max_concurrency = 1,
                                      per_key = { max_live = 1 }, scheduler = sched }
        local a = assert(pool:acquire("a"))
        local w = waiter(sched, pool, "b", { timeout = T(100) })   -- held by max_concurrency
        sched.sleep(0)
        assert.is_false(w.done)
        assert.is_true(pool:configure { max_concurrency = 4, per_key = { max_live = 1 } })
        settle(sched)
        assert.truthy(w.lease)
        local w2 = waiter(sched, pool, "a", { timeout = T(100) })  -- held by per_key.max_live
        sched.sleep(0)
        assert.is_false(w2.done)
        assert.is_true(pool:configure { per_key = { max_live = 2 } })
        settle(sched)
        assert.truthy(w2.lease)
        a:release(); w.lease:release(); w2.lease:release()
        pool:close()
      end)
    end)

    it("a lower max_waiting refuses new waiters and keeps the queued ones", function()
      run(function(sched)
        local c = counting(sched)
        local pool = clientpool.new { create = c.create, destroy = c.destroy, max_live = 1, max_waiting = 4,
                                      scheduler = sched }
        local l = assert(pool:acquire())
        local ws = {}
        for i = 1, 3 do ws[i] = waiter(sched, pool, nil, { timeout = T(100) }) end
        sched.sleep(0)
        assert.is_true(pool:configure { max_waiting = 1 })
        local _, code, detail = pool:acquire(nil, { timeout = T(100) })
        assert.equal("full", code)
        assert.equal(3, detail.waiting)
        assert.equal(3, pool:stats().waiting)         -- still queued
        l:release()
        for i = 1, 3 do
          settle(sched)
          assert.truthy(ws[i].lease, "waiter " .. i .. ": " .. tostring(ws[i].code))
          ws[i].lease:release()
        end
        pool:close()
      end)
    end)

    it("a lower max_idle or per_key.max_idle retires idle clients at once", function()
      run(function(sched)
        local c = counting(sched)
        local pool = clientpool.new { create = c.create, destroy = c.destroy, max_live = 6, scheduler = sched }
        local ls = {}
        for i = 1, 6 do ls[i] = assert(pool:acquire(i <= 3 and "a" or "b")) end
        for i = 1, 6 do ls[i]:release() end
        assert.is_true(pool:configure { max_idle = 4 })
        settle(sched)
        local s = H.check(pool)
        assert.equal(4, s.idle)
        assert.equal(2, s.closed_by.max_idle)
        assert.is_true(pool:configure { max_idle = 4, per_key = { max_idle = 1 } })
        settle(sched)
        s = H.check(pool)
        assert.equal(1, s.keys.a.idle)
        assert.equal(1, s.keys.b.idle)
        assert.equal(2, c.open)
        pool:close()
      end)
    end)

    it("durations: a new idle_timeout and max_lifetime retire idle clients by the timer, false removes them", function()
      run(function(sched)
        local c = counting(sched)
        local pool = clientpool.new { create = c.create, destroy = c.destroy, max_live = 4, scheduler = sched }
        local l1, l2 = assert(pool:acquire()), assert(pool:acquire())
        l1:release(); l2:release()
        sched.sleep(T(10))
        assert.equal(2, pool:stats().idle)
        assert.is_true(pool:configure { idle_timeout = T(15) })   -- measured from when they went idle
        sched.sleep(T(4))
        if not S.real then assert.equal(2, pool:stats().idle) end   -- idle 14 s (a real clock may be late)
        if S.real then
          assert.is_true(wait_until(sched, function() return pool:stats().idle == 0 end, 10))
        else
          sched.sleep(0.999)
          assert.equal(2, pool:stats().idle)
          sched.sleep(0.002)
          assert.equal(0, pool:stats().idle)           -- at 15 s idle, by the timer
        end
        assert.equal(2, pool:stats().closed_by.idle)
        assert.is_true(pool:configure { idle_timeout = false, max_lifetime = T(3) })
        local l3 = assert(pool:acquire())
        l3:release()
        assert.is_true(wait_until(sched, function() return pool:stats().idle == 0 end, 10))
        assert.equal(1, pool:stats().closed_by.lifetime)
        assert.is_true(pool:configure { max_lifetime = false })
        local l4 = assert(pool:acquire())
        l4:release()
        sched.sleep(T(20))
        assert.equal(1, pool:stats().idle)             -- no duration left
        pool:close()
      end)
    end)

    it("acquire_timeout: new waits take the new one, queued waiters keep theirs", function()
      run(function(sched)
        local pool = clientpool.new { create = function() return {} end, max_live = 1, acquire_timeout = T(2),
                                      scheduler = sched }
        local l = assert(pool:acquire())
        local t0 = sched.now()
        local old = waiter(sched, pool)
        sched.sleep(0)
        assert.is_true(pool:configure { acquire_timeout = T(6) })
        local new = waiter(sched, pool)
        assert.is_true(wait_until(sched, function() return old.done and new.done end, 20))
        assert.equal("timeout", old.code)
        assert.equal("timeout", new.code)
        H.time(S, 2, old.t1 - t0, "the queued waiter's timeout")
        H.time(S, 6, new.t1 - t0, "the new waiter's timeout")
        if not S.real then assert.is_true(new.t1 - t0 < 6 + 1e-6) end
        l:release()
        pool:close()
      end)
    end)

    it("min_idle raised on a running floor: the default key becomes warm and is filled", function()
      run(function(sched)
        local c = counting(sched)
        local pool = clientpool.new { create = c.create, destroy = c.destroy, max_live = 4, scheduler = sched }
        local r = false
        sched.spawn(function() pool:run(); r = true end)
        settle(sched)
        assert.equal(0, c.created)                     -- min_idle 0: nothing to keep
        assert.is_true(pool:configure { min_idle = 2 })
        assert.is_true(wait_until(sched, function() return pool:stats().idle == 2 end, 10))
        assert.equal(2, c.open)
        local l = assert(pool:acquire())
        l:release(false)                               -- a loss: the floor refills
        assert.is_true(wait_until(sched, function() return pool:stats().idle == 2 and c.open == 2 end, 10))
        assert.is_true(pool:configure { min_idle = 3 })
        assert.is_true(wait_until(sched, function() return pool:stats().idle == 3 end, 10))
        pool:close()
        assert.is_true(wait_until(sched, function() return r end, 10))
      end)
    end)

    it("pause_mode and create_backoff change live", function()
      run(function(sched)
        local fails = true
        local pool = clientpool.new { create = function() if fails then return nil, "down" end; return {} end,
                                      max_live = 2, scheduler = sched }
        local _, code, err = pool:acquire()
        assert.equal("create", code); assert.equal("down", err)
        _, code, err = pool:acquire()                  -- inside the backoff window: fails fast
        assert.equal("create", code); assert.equal("down", err)
        assert.is_true(pool:configure { create_backoff = false })
        fails = false
        local l = assert(pool:acquire())               -- no window any more
        l:release()
        pool:pause("maintenance")
        assert.is_true(pool:configure { pause_mode = "fail", create_backoff = 0.1 })
        local _, code2, reason = pool:acquire()
        assert.equal("paused", code2)
        assert.equal("maintenance", reason)
        pool:resume()
        pool:close()
      end)
    end)

    it("a bad value raises, naming it as new() does, and leaves the pool as it was", function()
      run(function(sched)
        local c = counting(sched)
        local opts = { create = c.create, destroy = c.destroy, max_live = 3, max_waiting = 3,
                       per_key = { max_live = 1 }, acquire_timeout = T(5), scheduler = sched }
        local pool = clientpool.new(opts)
        local held = assert(pool:acquire("a"))
        assert(pool:acquire("b")):release()
        local w = waiter(sched, pool, "a")
        sched.sleep(0)
        local before = snapshot(pool)
        local c_before = pool._c
        -- each patch, and the error new() gives for the same options
        local bad = {
          { max_idle = 5 }, { max_live = 0 }, { max_live = 1.5 }, { max_live = "8" }, { min_idle = 3 },
          { per_key = { max_live = 5 } }, { per_key = { max_lve = 1 } }, { per_key = 4 },
          { idle_timeout = -1 }, { idle_timeout = 0 / 0 }, { idle_timeout = math.huge }, { acquire_timeout = "1" },
          { lifetime_jitter = 0.5 }, { pause_mode = "drop" }, { max_waiting = -1 }, { max_keys = 0 },
          { create_backoff = 1, create_backoff_max = 0.5 }, { restarts = -1 },
          { max_live = 4, max_idle = 8 },                -- one good value, one bad: neither applies
          { max_live = 1, min_idle = 2, max_idle = 2 },
        }
        for _, patch in ipairs(bad) do
          local merged = {}
          for k, v in pairs(opts) do merged[k] = v end
          for k, v in pairs(patch) do merged[k] = v end
          local want = errmsg(clientpool.new, merged)
          local got = errmsg(pool.configure, pool, patch)
          assert.equal(want, got)
          assert.truthy(got:find("^clientpool: "), got)
          assert.same(before, snapshot(pool))
          assert.equal(c_before, pool._c)
        end
        -- what cannot change, names that are no option, a table that is none
        for _, name in ipairs { "create", "destroy", "validate", "park", "unpark", "policy", "capacity", "keys",
                                "probe", "scheduler", "seed", "backend" } do
          local msg = errmsg(pool.configure, pool, { [name] = false })
          assert.truthy(msg:find("^clientpool: option '" .. name .. "' cannot change on a running pool"), msg)
          assert.truthy(contains(msg, "configure() changes "), msg)
        end
        assert.equal("clientpool: unknown option 'max_lve'", errmsg(pool.configure, pool, { max_lve = 1 }))
        assert.equal("clientpool: configure() expects an options table, got nil", errmsg(pool.configure, pool))
        assert.truthy(contains(errmsg(pool.configure), "configure needs the pool as self"))
        -- raised at the caller's line
        local ok, err = pcall(function() pool:configure { max_idle = 5 } end)
        assert.is_false(ok)
        assert.truthy(tostring(err):find("configure_spec%.lua:%d+: clientpool: option 'max_idle'"), err)
        assert.same(before, snapshot(pool))
        -- and it behaves as before: max_live 3, one idle for "b", one lease a key, the waiter
        -- keeps its deadline
        local b = assert(pool:acquire("b"))
        local cl = assert(pool:acquire("c", { timeout = 0 }))
        local _, code = pool:acquire("d", { timeout = 0 })
        assert.equal("timeout", code)
        _, code = pool:acquire("c", { timeout = 0 })
        assert.equal("timeout", code)
        assert.is_true(wait_until(sched, function() return w.done end, 20))
        assert.equal("timeout", w.code)
        b:release(); cl:release()
        held:release()
        assert.equal(3, c.created)
        pool:close()
      end)
    end)

    it("false sets an option back to what new() does without it", function()
      run(function(sched)
        local pool = clientpool.new { create = function() return {} end, max_live = 4, max_idle = 2,
                                      leak_threshold = 10, scheduler = sched }
        assert.equal(2, pool._c.max_idle)
        assert.is_true(pool:configure { max_idle = false, max_live = 6 })
        assert.equal(6, pool._c.max_idle)              -- follows max_live again
        assert.equal(6, pool._c.max_concurrency)
        assert.is_true(pool:configure { leak_threshold = false, max_live = 3 })
        assert.is_nil(pool._c.leak_threshold)
        assert.equal(3, pool._c.max_idle)
        pool:close()
      end)
    end)

    it("a closed pool: nil, \"closed\", and nothing changes; bad values still raise", function()
      run(function(sched)
        local pool = clientpool.new { create = function() return {} end, max_live = 4, scheduler = sched }
        pool:close()
        local ok, code = pool:configure { max_live = 8 }
        assert.is_nil(ok)
        assert.equal("closed", code)
        assert.equal(4, pool._c.max_live)
        assert.truthy(contains(errmsg(pool.configure, pool, { max_live = 0 }), "max_live"))
      end)
    end)

    it("leak_threshold set live reports a lease held since before it", function()
      run(function(sched)
        local pool = clientpool.new { create = function() return {} end, max_live = 2, scheduler = sched }
        local reports = {}
        pool:on("leak", function(_, info) reports[#reports + 1] = info end)
        local l = assert(pool:acquire())
        sched.sleep(T(1))
        assert.is_true(pool:configure { leak_threshold = T(2) })
        local l2 = assert(pool:acquire())
        assert.is_true(wait_until(sched, function() return #reports == 2 end, 10))
        assert.equal("acquired before leak_threshold was set", reports[1].where)
        assert.truthy(contains(reports[2].where, "configure_spec.lua"), reports[2].where)
        l:release(); l2:release()
        pool:close()
      end)
    end)
  end)
end

describe("clientpool configure and the C fast path", function()
  it("leak_threshold set live takes the lease form off the fast path; cleared, puts it back", function()
    local pool = clientpool.new { create = function() return {} end, backend = "core", max_live = 2 }
    local fast_acquire = rawget(pool, "acquire")
    assert.is_function(fast_acquire)
    assert.is_function(rawget(pool, "_frel"))
    local l0 = assert(pool:acquire())
    local fast_release = l0.release             -- the C lease_release
    assert.are_not.equal(clientpool.Lease.release, fast_release)
    l0:release()
    assert.is_true(pool:configure { leak_threshold = 30 })
    assert.is_nil(rawget(pool, "acquire"))
    assert.is_nil(rawget(pool, "_frel"))
    local l = assert(pool:acquire())
    assert.equal(clientpool.Lease.release, l.release)
    assert.truthy(contains(l._where, "configure_spec.lua"), l._where)
    assert.is_function(rawget(pool, "checkout"))   -- checkout keeps it (no traceback there)
    assert.is_true(pool:configure { leak_threshold = false })
    assert.equal(fast_acquire, rawget(pool, "acquire"))
    assert.equal(fast_release, l.release)   -- (the method table is the pool's, not the lease's)
    l:release()
    pool:close()
  end)
end)
