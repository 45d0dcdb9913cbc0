-- Issue 17: the fast path without a clock read. A pool on the real clock
-- with no duration option (idle_timeout, max_lifetime, validate_after_idle,
-- keepalive, leak_threshold) stamps what its fast path stamps with the
-- engine's latest time (clientpool_acquire_untimed, _release_untimed:
-- csrc/clientpool.h). What a user can see must not change: a duration
-- configured later counts those stamps long (an idle client closed early,
-- never kept), and a validate hook always gets the true idle time (such a
-- pool reads the clock). Times here are lower bounds of the monotonic
-- clock, never upper ones. The engine side: spec/c/test_engine_untimed.c.

local clientpool = require "clientpool"
local base = require "clientpool.base"

local monotime = base.monotime
local ffi_backend = clientpool.backend == "ffi"

-- Spins until at least s seconds went by on the pool's clock.
local function spin(s)
  local t0 = monotime()
  while monotime() - t0 < s do end
end

local function counting(o)
  local made = 0
  o.create = function() made = made + 1; return { id = made } end
  return clientpool.new(o)
end

describe("clientpool without a duration option (issue 17: no clock read on the fast path)", function()
  it("an idle_timeout configured later closes a client idle longer, after untimed pairs", function()
    for _, form in ipairs { "lease", "checkout" } do
      local pool = counting { max_live = 2 }
      for _ = 1, 5 do
        if form == "lease" then assert(pool:acquire()):release()
        else local _, h = pool:checkout(); pool:checkin(h) end
      end
      spin(0.02)
      assert(pool:configure { idle_timeout = 0.01 })
      local id
      if form == "lease" then
        local lease = assert(pool:acquire())
        id = lease.client.id
        lease:release()
      else
        local c, h = pool:checkout()
        id = c.id
        pool:checkin(h)
      end
      assert.equal(2, id, form .. ": the client idle past idle_timeout is not handed out")
      assert.equal(1, pool:stats().closed_by.idle, form)
      pool:close()
    end
  end)

  it("a validate hook gets the true idle time (such a pool reads the clock)", function()
    local seen
    local pool = counting {
      max_live = 1, validate = function(_, _, idle_s) seen = idle_s; return true end,
    }
    for _ = 1, 3 do assert(pool:acquire()):release() end
    spin(0.02)
    local lease = assert(pool:acquire())
    assert.is_true(seen >= 0.02, "idle_s " .. tostring(seen))
    lease:release()
    spin(0.02)
    local _, h = pool:checkout()
    assert.is_true(seen >= 0.02, "idle_s " .. tostring(seen))
    pool:checkin(h)
    seen = nil
    assert(pool:try_acquire()):release()
    assert.is_true(seen >= 0, "validate ran: " .. tostring(seen))
    pool:close()
  end)

  it("leaves the lease pair's and the checkout pair's results as they were", function()
    local pool = counting { max_live = 2 }
    local a = assert(pool:acquire())
    local b = assert(pool:acquire())
    a:release(); b:release(false)
    for _ = 1, 10 do
      local lease = assert(pool:try_acquire())
      assert.equal(1, lease.client.id)
      lease:release()
      local c, h = pool:checkout()
      assert.equal(1, c.id)
      pool:checkin(h)
      pool:checkin(h)                   -- stale: a no-op
    end
    local s = pool:stats()
    assert.same({ 1, 0, 1, 2 }, { s.live, s.active, s.idle, s.opened })
    pool:close()
  end)

  local ffi_it = ffi_backend and it or pending
  ffi_it("the FFI engine skips the clock only without a validate hook", function()
    local plain = counting { max_live = 1 }
    local hooked = counting { max_live = 1, validate = function() return true end }
    assert.is_true(plain._e.skip_clock)
    assert.is_false(hooked._e.skip_clock)
    plain:close(); hooked:close()
  end)

  -- The FFI backend reads an acquisition's time in Lua (base.turn_of), so
  -- that the engine's untimed path was never tried on acquire: a clock read
  -- a pair, a third of a checkout pair under the JIT (found 2026-12-03).
  -- Counted through the backend's monotime, which that read goes through.
  local jit_it = rawget(_G, "jit") and it or pending
  jit_it("the FFI backend's pairs read no clock in Lua without a duration option", function()
    local ffimod = require "clientpool.ffi"
    local real, reads = ffimod.monotime, 0
    ffimod.monotime = function() reads = reads + 1; return real() end
    local ok, err = pcall(function()
      local function pairs_of(o)
        o.backend = "ffi"
        local pool = counting(o)
        reads = 0
        for _ = 1, 10 do
          assert(pool:acquire()):release()
          assert(pool:try_acquire()):release()
          local _, h = pool:checkout()
          pool:checkin(h)
        end
        local n = reads
        pool:close()
        return n
      end
      assert.equal(0, pairs_of { max_live = 2 }, "reads without a duration option")
      assert.is_true(pairs_of { max_live = 2, idle_timeout = 60 } >= 30, "a timed pool's reads are counted")
    end)
    ffimod.monotime = real
    assert(ok, err)
  end)
end)
