-- clientpool.leak: leases collected while held (the leak event, the
-- client destroyed, no capacity lost) and leak_threshold reports with the
-- place a lease was acquired. The whole suite runs once per scheduler entry
-- of spec/helpers.lua, as spec/acquire_spec.lua does (same helpers).

local H = require "spec.helpers"
local contains = H.contains

local SPEC_NAME = "leak_spec"

-- Full collections, after overwriting stack slots a finished call may have
-- left a lease in (dead stack slots can keep an object one cycle too long).
local function scrub()
  local a, b, c, d, e, f, g, h = 0, 0, 0, 0, 0, 0, 0, 0
  return a + b + c + d + e + f + g + h
end
local function collect()
  for _ = 1, 4 do
    scrub()
    collectgarbage("collect")
  end
end

-- An adapter that is sched with some fields replaced (say `log`, or a
-- `background` that never runs so the pool has no timer).
local function wrap(sched, fields)
  return setmetatable(fields, { __index = sched })
end

for _, M in ipairs(H.missing_schedulers()) do
  describe("clientpool leaks on " .. M.name, function()
    pending("not run: " .. M.reason)
  end)
end

for _, S in ipairs(H.schedulers { hosts = true }) do
  describe("clientpool leaks on " .. S.name, function()
    after_each(function() if S.finish then S.finish() end end)

    -- Spec seconds to the entry's seconds.
    local function T(x) return x * S.scale end

    -- run, mkpool, settle: spec/helpers.lua H.kit
    local run, mkpool, settle = H.kit(S, { max_live = 4 })

    -- The duration got (the entry's seconds) is `expected` spec seconds.
    local function near(expected, got, what) H.time(S, expected, got, what) end

    ---------------------------------------------------------------------------
    describe("leaks", function()
      -- Acquires in a coroutine that ends, so no stack slot keeps the lease.
      local function leak_one(pool, key)
        local co = coroutine.create(function()
          local l = assert(pool:acquire(key))
          return l.client
        end)
        local ok, client = coroutine.resume(co)
        assert(ok, client)
        return client
      end

      -- in a fresh interpreter (see spec/gc_leak_check.lua for why)
      local function gc_leak_check(capacity, mode)
        assert.equal("OK\nrc=0\n", H.run_fresh("spec/gc_leak_check.lua " .. capacity .. " " .. (mode or "")))
      end

      it("a lease collected while held counts as leaked: client destroyed, leak event, capacity back", function()
        if S.name ~= "loop (virtual clock)" then return end -- one run is enough: it has its own scheduler
        gc_leak_check(1)
      end)

      it("a shared lease (capacity > 1) collected while held counts as leaked too", function()
        if S.name ~= "loop (virtual clock)" then return end
        gc_leak_check(2)
      end)

      it("a lease collected while held is a leak though its sentinel was a released lease's", function()
        if S.name ~= "loop (virtual clock)" then return end
        gc_leak_check(1, "recycled")
        gc_leak_check(1, "recycled real")   -- the C fast path's release (C API backend)
      end)

      it("a call for a key right after a lease of it was collected gets that key's client, no other's", function()
        if S.name ~= "loop (virtual clock)" then return end
        for _, form in ipairs { "acquire", "checkout", "try_acquire" } do
          for _, clock in ipairs { "", "real" } do   -- real: the C fast path on the C API backend
            assert.equal("OK\nrc=0\n", H.run_fresh("spec/gc_leak_key_check.lua " .. form .. " " .. clock),
                         form .. " " .. clock)
          end
        end
      end)

      it("a released lease that is collected is not a leak", function()
        run(function(sched)
          local pool, f = mkpool(sched, { max_live = 1 })
          local co = coroutine.create(function() assert(pool:acquire("k")):release() end)
          assert(coroutine.resume(co))
          collect()
          local s = H.check(pool)
          assert.equal(0, s.leaked)
          assert.equal(1, s.idle)
          settle(sched)
          assert.equal(0, f.destroyed)
        end)
      end)

      it("collecting leases (released or leaked) does not move the pool's clock", function()
        run(function(sched)
          local idles = {}
          local IT = S.real and 10 or 60 -- shorter on a real clock, which really waits
          -- on a real clock the collection below takes real time (a large
          -- heap left by earlier specs: a few hundred ms): the idle timeout
          -- must outlast it
          local c0 = sched.now()
          collect()
          if S.real then IT = math.max(IT, math.ceil((sched.now() - c0) * 4 / (S.scale or 1))) end
          local pool = mkpool(sched, {
            max_live = 2, idle_timeout = T(IT),
            validate = function(_, _, idle) idles[#idles + 1] = idle; return true end,
          })
          local co = coroutine.create(function() assert(pool:acquire("k")):release() end)
          assert(coroutine.resume(co))
          leak_one(pool, "x")
          collect()
          H.check(pool)
          sched.sleep(T(1))
          local l = assert(pool:acquire("k"))
          near(1, idles[1], "idle seconds after a collection")
          l:release()
          sched.sleep(T(5))
          l = assert(pool:acquire("k"))
          near(5, idles[2], "idle seconds after a collection")
          l:release()
          -- and the idle timer still fires on the scheduler's time
          sched.sleep(T(IT + 1))
          local s = H.check(pool)
          assert.equal(1, s.closed_by.idle)
          assert.equal(0, s.live)
        end)
      end)

      it("leak_threshold reports a lease held too long, with where it was acquired", function()
        run(function(sched)
          local pool = mkpool(sched, { leak_threshold = T(5) })
          local got = {}
          pool:on("leak", function(key, info) got[#got + 1] = { key = key, info = info, at = sched.now() } end)
          local quick = assert(pool:acquire("k"))
          local slow = assert(pool:acquire("k"))
          sched.sleep(T(3))
          quick:release()
          sched.sleep(T(3))
          assert.equal(1, #got)
          local info = got[1].info
          assert.equal("k", got[1].key)
          assert.is_false(info.leaked)
          assert.is_true(contains(info.where, "acquired"), tostring(info.where))
          assert.is_true(contains(info.where, SPEC_NAME), tostring(info.where))
          -- the first frame is the caller's, not the pool's own
          local first = info.where:match("stack traceback:\n%s*([^\n]*)")
          assert.is_true(contains(first, SPEC_NAME), "first frame: " .. tostring(first))
          assert.is_number(info.held)
          near(5, info.held, "info.held")
          assert.equal(slow, info.lease)
          -- a report is not a leak: the lease is still the caller's
          local s = H.check(pool)
          assert.equal(0, s.leaked)
          assert.equal(1, s.active)
          slow:release()
          s = H.check(pool)
          assert.equal(2, s.idle)
          sched.sleep(T(10))
          assert.equal(1, #got)
        end)
      end)

      -- The engine's events carry a lease's generation (a uint32) in an
      -- int32 field: past 2^31 reuses of a slot (hours of a busy worker on
      -- slot 0) it arrives negative. Fed what the engine would send for
      -- this lease's generation + 2^32 (the same uint32), the report must
      -- still find the lease, and the checkout.
      it("leak_threshold reports leases whose generation passed 2^31 (the event's int32)", function()
        run(function(sched)
          local pool = mkpool(sched, { leak_threshold = T(1000) })
          local got = {}
          pool:on("leak", function(key, info) got[#got + 1] = { key = key, info = info } end)
          local lease = assert(pool:acquire("k"))
          local base = require "clientpool.base"
          local l, g, _, k = base.slot_of(pool, lease)
          local on_leak = require("clientpool.events").on[base.core.EV_LEAK]
          on_leak(pool, nil, l, g - 2 ^ 32, k, sched.now())
          assert.equal(1, #got)
          assert.equal(lease, got[1].info.lease)
          local _, h = pool:checkout("c")
          assert(h)
          local cl = h % 2097152                            -- (checkout.lua's handle layout)
          local cg = ((h - cl) / 2097152 - pool._hbase) % 2 ^ 32
          local _, ck = pool._e:checkout_record(cl, cg)
          on_leak(pool, nil, cl, cg - 2 ^ 32, ck, sched.now())
          assert.equal(2, #got)
          assert.equal("c", got[2].key)
          assert.equal("checkout", got[2].info.where)
          pool:checkin(h)
          lease:release()
          assert.is_nil(pool._early_leaks and next(pool._early_leaks))
        end)
      end)

      it("leak_threshold reports a lease or checkout whose validate or create outlasted it, once it is held", function()
        run(function(sched)
          local pool = mkpool(sched, {
            leak_threshold = T(2),
            validate = function() sched.sleep(T(3)); return true end,
          }, { latency = T(3) })
          local got = {}
          pool:on("leak", function(key, info) got[#got + 1] = { key = key, info = info, at = sched.now() } end)
          local l = assert(pool:acquire("k"))         -- created in 3 (reported at 2: it was registered)
          l:release()
          got = {}
          local t0 = sched.now()
          local l2 = assert(pool:acquire("k"))        -- validate takes 3, past the threshold
          local c, h = pool:checkout("c")             -- create takes 3, past the threshold
          assert.is_table(c, tostring(h))
          assert.equal(2, #got)
          assert.equal(l2, got[1].info.lease)
          near(t0 + 3, got[1].at, "the lease's report")
          near(3, got[1].info.held, "held")
          assert.equal("c", got[2].key)
          assert.equal("checkout", got[2].info.where)
          sched.sleep(T(20))
          assert.equal(2, #got)                        -- once each
          l2:release()
          pool:checkin(h)
        end)
      end)

      it("leak_threshold without a leak listener logs the report", function()
        run(function(sched)
          local logs = {}
          local pool = mkpool(sched, {
            leak_threshold = T(2),
            scheduler = wrap(sched, { log = function(m) logs[#logs + 1] = tostring(m) end }),
          })
          local l = assert(pool:acquire("k"))
          sched.sleep(T(3))
          assert.equal(1, #logs)
          assert.is_true(contains(logs[1], "acquired"), logs[1])
          assert.is_true(contains(logs[1], SPEC_NAME), logs[1])
          l:release()
        end)
      end)
    end)

  end)
end
