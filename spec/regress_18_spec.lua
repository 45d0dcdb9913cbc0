-- Issue 18: five defects a model-based stress test found (its repro
-- scripts, made specs). Each failed on the code before the fix, on every
-- interpreter and both LuaJIT backends (3 is the FFI backend's own: on PUC
-- Lua and the C API backend it is a control that passed already). Times on
-- the virtual clock.

local clientpool = require "clientpool"
local H = require "spec.helpers"

local IS_JIT = rawget(_G, "jit") ~= nil

local function vloop() return require("clientpool.loop").new { clock = "virtual" } end

-- spec/regress_18_check.lua in a fresh interpreter; asserts it printed OK.
local function fresh(args)
  local out = H.run_fresh("spec/regress_18_check.lua " .. args)
  assert(out:find("^OK") and out:find("rc=0", 1, true), out)
  return out
end

describe("issue 18", function()
  -------------------------------------------------------------------------
  describe("1. shared leases: a share granted just before a co-holder retires the client", function()
    -- A and two waiters share one client (capacity 3): the creation grants
    -- B and C their shares at once; B retires it before C has run. C must
    -- not come back with a plain lease on the lost client.
    local function scenario(c_takes)
      local loop = vloop()
      local f = H.factory(loop, { latency = 0.01 })
      local pool = clientpool.new { max_live = 1, capacity = 3, scheduler = loop,
                                    create = f.create, destroy = f.destroy }
      local r = {}
      loop.spawn(function()
        local a = assert(pool:acquire())
        r.a_client = a.client
        -- A learns the client is lost and gives it back, as a user would
        a:on_cancel(function() r.a_lost = a.lost; a:release() end)
      end)
      loop.spawn(function()
        local b = assert(pool:acquire())
        b:release(false)
      end)
      loop.spawn(function() c_takes(pool, r) end)
      loop.run()
      pool:close()
      loop.run()
      return r, f, pool
    end

    it("acquire: C gets a usable client (a new one), not the lost one", function()
      local r, f = scenario(function(pool, r)
        local c, code = pool:acquire(nil, { timeout = 5 })
        assert(c, code)
        r.c_client, r.c_lost, r.c_cancelled = c.client, c.lost, c:cancelled()
        r.c_alive = c.client.alive
        c:release()
      end)
      assert.is_true(r.a_lost)
      assert.are_not.equal(r.a_client, r.c_client)
      assert.is_nil(r.c_lost)
      assert.is_false(r.c_cancelled)
      assert.is_true(r.c_alive)
      assert.equal(2, f.created)
      assert.equal(0, f.count_open())
    end)

    it("checkout: C gets a usable client, not the lost one", function()
      local r, f = scenario(function(pool, r)
        local client, h = pool:checkout()
        assert(client, h)
        r.c_client, r.c_alive = client, client.alive
        pool:checkin(h)
      end)
      assert.is_true(r.a_lost)
      assert.are_not.equal(r.a_client, r.c_client)
      assert.is_true(r.c_alive)
      assert.equal(2, f.created)
      assert.equal(0, f.count_open())
    end)
  end)

  -------------------------------------------------------------------------
  describe("2. a grant that a collected (leaked) lease makes possible", function()
    it("is made at the time of the collection (virtual clock): validate runs, wait_time counts", function()
      fresh("stale-clock virtual")
    end)

    it("is made at the time of the collection (real clock)", function()
      fresh("stale-clock real")
    end)
  end)

  -------------------------------------------------------------------------
  describe("3. pools that handed out leases, dropped, are collected with their engines", function()
    it("C API backend: 12 rounds of 1000 pools, all collected, Lua heap and RSS flat", function()
      fresh("pools core 1000")
    end)

    local jit_it = IS_JIT and it or pending
    jit_it("FFI backend (LuaJIT): 12 rounds of 1000 pools, all collected, Lua heap and RSS flat", function()
      fresh("pools ffi 1000")
    end)
  end)

  -------------------------------------------------------------------------
  describe("4. the warm floor and max_idle", function()
    -- The floor refills while its idle client is leased; the lease comes
    -- back before the refill is done: idle must never pass max_idle.
    local function floor_run(o)
      local loop = vloop()
      local f = H.factory(loop, { latency = 0.01 })
      local opts = { max_live = 4, max_idle = 1, min_idle = 1, keys = { "w" }, scheduler = loop,
                     create = f.create, destroy = f.destroy }
      for k, v in pairs(o or {}) do opts[k] = v end
      local pool = clientpool.new(opts)
      local worst, worst_key = 0, 0
      local function sample()
        local s = H.check(pool)
        if s.idle > worst then worst = s.idle end
        if s.keys.w and s.keys.w.idle > worst_key then worst_key = s.keys.w.idle end
        return s
      end
      local final
      loop.spawn(function() pool:run() end)
      loop.spawn(function()
        loop.sleep(0.1)
        for _ = 1, 3 do
          local l = assert(pool:acquire("w"))   -- the floor starts a refill
          sample()
          loop.sleep(0.005)
          l:release()                           -- back before the refill is done
          sample()
          for _ = 1, 10 do loop.sleep(0.01); sample() end
        end
        loop.sleep(10)
        final = sample()
        pool:close()
      end)
      loop.run()
      return worst, worst_key, final, f
    end

    it("never keeps more idle clients than max_idle", function()
      local worst, _, final = floor_run()
      assert.equal(1, final.idle)
      assert(worst <= 1, "idle reached " .. worst .. " with max_idle = 1")
    end)

    it("never keeps more idle clients of a key than per_key.max_idle", function()
      local worst, worst_key, final = floor_run { max_idle = 2, per_key = { max_idle = 1 } }
      assert.equal(1, final.keys.w.idle)
      assert(worst_key <= 1, "the key's idle reached " .. worst_key .. " with per_key.max_idle = 1")
      assert(worst <= 2)
    end)
  end)

  -------------------------------------------------------------------------
  describe("5. a key-scope pause observed on a default-key lease", function()
    local function mkpool(loop, o)
      local opts = { max_live = 2, scheduler = loop, create = function() return {} end,
                     policy = function(outcome)
                       if outcome == 429 then return { pause = "429", scope = "key" } end
                     end }
      for k, v in pairs(o or {}) do opts[k] = v end
      return clientpool.new(opts)
    end

    it("pauses the default key alone: other keys are served", function()
      local loop = vloop()
      local pool = mkpool(loop)
      local r = {}
      loop.spawn(function()
        local l = assert(pool:acquire())
        l:observe(429)
        l:release()
        local s = pool:stats()
        r.pool_paused, r.key_paused = s.paused, s.keys[""].paused
        local o, code = pool:acquire("other", { timeout = 1 })
        r.other = o and "lease" or code
        if o then o:release() end
        local d
        d, code = pool:acquire(nil, { timeout = 1 })
        r.default = d and "lease" or code
      end)
      loop.run()
      assert.is_false(r.pool_paused)
      assert.equal("429", r.key_paused)
      assert.equal("lease", r.other)
      assert.equal("timeout", r.default)
    end)

    it("clientpool.DEFAULT_KEY names the default key in pause, resume and retire", function()
      assert.equal("string", type(clientpool.DEFAULT_KEY))
      local loop = vloop()
      local f = H.factory(loop)
      local pool = mkpool(loop, { create = f.create, destroy = f.destroy, max_live = 3 })
      local r = {}
      loop.spawn(function()
        pool:pause("manual", clientpool.DEFAULT_KEY)
        local s = pool:stats()
        r.paused1, r.kpaused1 = s.paused, s.keys[clientpool.DEFAULT_KEY].paused
        local o = assert(pool:acquire("other", { timeout = 1 }))
        local _, code = pool:acquire(nil, { timeout = 1 })
        r.default1 = code
        pool:resume(clientpool.DEFAULT_KEY)
        local d = assert(pool:acquire(nil, { timeout = 1 }))
        d:release(); o:release()
        assert.equal(2, pool:stats().idle)
        pool:retire(clientpool.DEFAULT_KEY)           -- the default key's client only
        s = pool:stats()
        r.idle_after_retire, r.other_idle = s.idle, s.keys.other.idle
        -- no key still means the whole pool
        pool:pause("all")
        r.paused2 = pool:stats().paused
        _, code = pool:acquire("other", { timeout = 1 })
        r.other2 = code
        pool:resume()
        pool:retire()
        r.idle_end = pool:stats().idle
        pool:close()
      end)
      loop.run()
      assert.is_false(r.paused1)
      assert.equal("manual", r.kpaused1)
      assert.equal("timeout", r.default1)
      assert.equal(1, r.idle_after_retire)
      assert.equal(1, r.other_idle)
      assert.equal("all", r.paused2)
      assert.equal("timeout", r.other2)
      assert.equal(0, r.idle_end)
      assert.equal(0, f.count_open())
    end)

    it("resume_after of a default-key pause resumes the default key", function()
      local loop = vloop()
      local pool = mkpool(loop, { policy = function() return { pause = "503", scope = "key", resume_after = 2 } end })
      local r = {}
      loop.spawn(function()
        local l = assert(pool:acquire())
        l:observe("x")
        l:release()
        local t0 = loop.now()
        local d = assert(pool:acquire(nil, { timeout = 5 }))
        r.waited = loop.now() - t0
        r.paused = pool:stats().keys[""].paused
        d:release()
      end)
      loop.run()
      assert.equal(2, r.waited)
      assert.is_false(r.paused)
    end)
  end)
  -------------------------------------------------------------------------
  -- The issue's surprising behaviours, decided (docs/decisions.md).
  describe("decisions", function()
    it("try_acquire: nothing free is a timeout, also with max_waiting waiters; max_keys is full", function()
      local loop = vloop()
      local pool = clientpool.new { max_live = 1, max_waiting = 1, max_keys = 1, scheduler = loop,
                                    create = function() return {} end }
      local r = {}
      loop.spawn(function()
        local held = assert(pool:acquire("k"))
        loop.spawn(function() pool:acquire("k", { timeout = 1 }) end)   -- the queue is full now
        loop.sleep(0)
        local l, code, detail = pool:try_acquire("k")
        r.l, r.code, r.reason = l, code, detail and detail.reason
        r.code2, r.detail2 = select(2, pool:try_acquire("other"))
        held:release()
      end)
      loop.run()
      assert.is_nil(r.l)
      assert.equal("timeout", r.code)
      assert.equal("timeout", r.reason)
      assert.equal("full", r.code2)
      assert.equal("max_keys", r.detail2.reason)
    end)

    it("try_acquire: an idle client whose validate yields is a timeout; validated, it is idle again", function()
      local loop = vloop()
      local calls = 0
      local pool = clientpool.new { max_live = 1, scheduler = loop, create = function() return {} end,
                                    validate = function() calls = calls + 1; loop.sleep(0.1); return true end,
                                    validate_after_idle = 1 }
      local r = {}
      loop.spawn(function()
        pool:acquire():release()
        loop.sleep(2)
        local l, code = pool:try_acquire()
        r.code, r.l = code, l
        loop.sleep(0.2)                    -- the validate ends in the background
        local s = pool:stats()
        r.idle, r.leases = s.idle, s.leases
        local l2 = pool:try_acquire()      -- used just now: no validate
        r.l2 = l2 ~= nil
        if l2 then l2:release() end
      end)
      loop.run()
      assert.is_nil(r.l)
      assert.equal("timeout", r.code)
      assert.equal(1, r.idle)
      assert.equal(0, r.leases)
      assert.is_true(r.l2)
      assert.equal(1, calls)
    end)

    it("a lease collected when no task is left is carried out by the next loop.run() alone", function()
      fresh("leak-after-run")
    end)

    it("capacity > 1: a share handed out while its client's validate runs is lost if that validate fails", function()
      local loop = vloop()
      local f = H.factory(loop)
      local pool = clientpool.new { max_live = 2, capacity = 2, scheduler = loop, create = f.create,
                                    destroy = f.destroy,
                                    validate = function() loop.sleep(0.1); return false end }
      local r = {}
      loop.spawn(function()
        assert(pool:acquire()):release()   -- one idle client
        loop.spawn(function()
          local a = assert(pool:acquire())   -- its validate fails: a new client
          r.a_client = a.client
          a:release()
        end)
        loop.sleep(0.05)
        local b = assert(pool:acquire())     -- a share of the client being validated
        r.b_client = b.client
        loop.sleep(0.1)
        r.b_lost, r.b_cancelled = b.lost, b:cancelled()
        b:release()
      end)
      loop.run()
      assert.equal(1, r.b_client.id)
      assert.is_true(r.b_lost)
      assert.is_true(r.b_cancelled)
      assert.equal(2, r.a_client.id)
      assert.is_false(r.b_client.alive)
    end)

    it("a token cancelled beforehand: cancelled even with a free client, closed after close()", function()
      local loop = vloop()
      local pool = clientpool.new { max_live = 1, scheduler = loop, create = function() return {} end }
      local tok = clientpool.token()
      tok:cancel()
      local r = {}
      loop.spawn(function()
        r[1] = select(2, pool:acquire(nil, { cancel = tok }))
        pool:close()
        r[2] = select(2, pool:acquire(nil, { cancel = tok }))
      end)
      loop.run()
      assert.same({ "cancelled", "closed" }, r)
    end)

    it("release(false) and destroy() close the client with reason \"error\"", function()
      local loop = vloop()
      local pool = clientpool.new { max_live = 1, scheduler = loop, create = function() return {} end }
      local reasons = {}
      pool:on("destroy", function(_, _, reason) reasons[#reasons + 1] = reason end)
      loop.spawn(function()
        assert(pool:acquire()):release(false)
        assert(pool:acquire()):destroy()
      end)
      loop.run()
      assert.same({ "error", "error" }, reasons)
      assert.equal(2, pool:stats().closed_by.error)
    end)

    it("a waiter whose grant falls through (validate fails while paused) keeps its deadline", function()
      local loop = vloop()
      local pool
      pool = clientpool.new { max_live = 1, scheduler = loop, create = function() return {} end,
                              validate = function()
                                loop.sleep(0.1)
                                pool:pause("meanwhile")
                                return false
                              end }
      local r = {}
      loop.spawn(function()
        local held = assert(pool:acquire())
        loop.spawn(function()
          local t0 = loop.now()
          local l, code = pool:acquire(nil, { timeout = 1 })
          r.code, r.t = l and "lease" or code, loop.now() - t0
        end)
        loop.sleep(0.5)
        held:release()                       -- to the waiter: validate, which fails
      end)
      loop.run()
      assert.equal("timeout", r.code)
      assert(math.abs(r.t - 1) < 1e-9, "the waiter ended after " .. r.t .. " s, its timeout was 1 s")
    end)

    it("a waiter whose shared grant was lost before it ran keeps its deadline", function()
      local loop = vloop()
      local pool = clientpool.new { max_live = 1, capacity = 3, scheduler = loop,
                                    create = function() loop.sleep(0.01); return {} end }
      local r = {}
      loop.spawn(function() r.a = assert(pool:acquire()) end)   -- holds the lost client
      loop.spawn(function() assert(pool:acquire()):release(false) end)
      loop.spawn(function()
        local t0 = loop.now()
        local l, code = pool:acquire(nil, { timeout = 1 })
        r.code, r.t = l and "lease" or code, loop.now() - t0
        r.a:release()
      end)
      loop.run()
      assert.equal("timeout", r.code)
      assert(math.abs(r.t - 1) < 1e-9, "the waiter ended after " .. r.t .. " s, its timeout was 1 s")
    end)
  end)
  -------------------------------------------------------------------------
  -- Found by the driver's stress test with the collector running on its
  -- own (spec/stress_model.lua).
  describe("found by the stress test", function()
    it("a collection while a lease is released (or its create fails) does not report it as leaked", function()
      fresh("release-gc")
    end)

    it("stats() is one snapshot when a lease is collected while it reads the engine", function()
      fresh("stats-snapshot")
    end)
  end)
end)
