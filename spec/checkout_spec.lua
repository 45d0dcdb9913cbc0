-- pool:checkout(key) -> client, h and pool:checkin(h [, reuse]): the
-- zero-allocation form of acquire/release (issue 5). Runs on both engine
-- bindings (the ffi one only on LuaJIT) and every scheduler of
-- spec/helpers.lua; time only moves on the scheduler's virtual clock.

local clientpool = require "clientpool"
local H = require "spec.helpers"
local contains, errmsg = H.contains, H.errmsg

local IS_JIT = rawget(_G, "jit") ~= nil

-- n checkout/checkin pairs of key "k" (H.bytes_per's step)
local function checkout_pairs(pool)
  return function(n)
    for _ = 1, n do
      local _, h = pool:checkout("k")
      pool:checkin(h)
    end
  end
end

-- The handle a checkout of lease slot l, generation g would have had
-- (checkout.lua's layout): what a caller who forged a number could pass.
local function forged_handle(pool, lease)
  local l, g = require("clientpool.base").slot_of(pool, lease)
  return ((g + pool._hbase) % 2 ^ 32) * 2097152 + l
end

local function is_int(v)
  return type(v) == "number" and v >= 0 and math.floor(v) == v
end

for _, backend in ipairs { "core", "ffi" } do
  local bit = (backend == "core" or IS_JIT) and it or pending
  for _, S in ipairs(H.schedulers()) do
    describe("checkout/checkin (" .. backend .. " backend) on " .. S.name, function()

      local function run(body)
        local sched = S.new()
        S.run(sched, body, sched)
      end

      local function mkpool(sched, o)
        local f = H.factory(sched)
        local opts = { create = f.create, destroy = f.destroy, max_live = 4, scheduler = sched, backend = backend }
        for k, v in pairs(o or {}) do opts[k] = v end
        return clientpool.new(opts), f
      end

      local function settle(sched)
        sched.sleep(0)
        sched.sleep(0)
      end

      bit("ends no lease of the acquire form given a handle forged to name it (the engine marks checkouts)", function()
        run(function(sched)
          local pool = mkpool(sched)
          local _, h = pool:checkout("k")
          local lease = assert(pool:acquire("k"))
          local forged = forged_handle(pool, lease)
          assert.are_not.equal(h, forged)
          pool:checkin(forged)
          pool:checkin(forged, false)
          assert.equal(2, H.check(pool).leases)
          lease:release()
          assert.equal(1, H.check(pool).leases)
          pool:checkin(h)
          assert.equal(0, H.check(pool).leases)
        end)
      end)

      bit("hands out a client and an integer handle; checkin returns the client for reuse", function()
        run(function(sched)
          local pool, f = mkpool(sched)
          local c, h = pool:checkout("k")
          assert.is_table(c)
          assert.equal("k", c.key)
          assert.is_true(is_int(h), tostring(h))
          local s = H.check(pool)
          assert.equal(1, s.leases)
          assert.equal(1, s.active)
          pool:checkin(h)
          s = H.check(pool)
          assert.equal(0, s.leases)
          assert.equal(1, s.idle)
          local c2, h2 = pool:checkout("k")
          assert.equal(c, c2)                -- LIFO reuse
          assert.are_not.equal(h, h2)        -- a new generation
          assert.equal(1, f.created)
          s = H.check(pool)
          assert.equal(1, s.reused)
          pool:checkin(h2)
          -- the default key, and acquire/release mixed with checkout
          local c3, h3 = pool:checkout()
          local lease = assert(pool:acquire())
          assert.are_not.equal(c3, lease.client)
          lease:release()
          pool:checkin(h3)
          s = H.check(pool)
          assert.equal(0, s.leases)
          assert.equal(3, s.idle)
        end)
      end)

      bit("a repeated or stale checkin is a no-op and never ends another holder's lease", function()
        run(function(sched)
          local pool = mkpool(sched, { max_live = 1 })
          local c1, h1 = pool:checkout()
          pool:checkin(h1)
          pool:checkin(h1)                   -- repeated
          local c2, h2 = pool:checkout()     -- the same slot, next generation
          assert.equal(c1, c2)
          pool:checkin(h1)                   -- stale: must not end h2
          local s = H.check(pool)
          assert.equal(1, s.leases)
          assert.equal(1, s.active)
          -- forged handles: other slots, other generations, huge numbers
          for _, bad in ipairs { h2 + 1, h2 + 2097152, h2 - 2097152 >= 0 and h2 - 2097152 or 7,
                                 2 ^ 52, 123456789 } do
            if bad ~= h2 then pool:checkin(bad) end
          end
          s = H.check(pool)
          assert.equal(1, s.leases)
          pool:checkin(h2)
          s = H.check(pool)
          assert.equal(0, s.leases)
          -- a stale handle whose slot now carries a lease object
          local lease = assert(pool:acquire())
          pool:checkin(h2)
          pool:checkin(h1)
          s = H.check(pool)
          assert.equal(1, s.leases)
          assert.equal(c1, lease.client)
          lease:release()
          -- and the other way round: a stale handle after release() of a lease
          local c3, h3 = pool:checkout()
          assert.equal(c1, c3)
          pool:checkin(h3)
          local lease2 = assert(pool:acquire())
          pool:checkin(h3)
          s = H.check(pool)
          assert.equal(1, s.leases)
          lease2:release()
          assert.equal(0, H.check(pool).leases)
        end)
      end)

      bit("a handle of another pool, or a small forged integer, ends no lease", function()
        run(function(sched)
          local a, b = mkpool(sched), mkpool(sched)
          local ca, ha = a:checkout("k")
          local cb, hb = b:checkout("k")
          assert.are_not.equal(ha, hb)          -- generations start at 0 in both
          b:checkin(ha)
          for i = 0, 4 do b:checkin(i); b:checkin(i * 2097152) end
          assert.equal(1, H.check(b).leases)     -- b's checkout is still held
          local cb2 = b:checkout("k")            -- a second client, not cb again
          assert.are_not.equal(cb, cb2)
          b:checkin(hb)
          a:checkin(ha)
          assert.equal(0, H.check(a).leases)
          assert.is_table(ca)
        end)
      end)

      bit("checkin(h, false) retires the client", function()
        run(function(sched)
          local pool, f = mkpool(sched)
          local destroyed = {}
          pool:on("destroy", function(_, client, reason) destroyed[#destroyed + 1] = { client, reason } end)
          local released = {}
          pool:on("release", function(key, client, reuse) released[#released + 1] = { key, client, reuse } end)
          local c, h = pool:checkout("k")
          pool:checkin(h, false)
          settle(sched)
          assert.equal(1, f.destroyed)
          assert.is_false(c.alive)
          assert.same({ { c, "error" } }, destroyed)
          assert.same({ { "k", c, false } }, released)
          local s = H.check(pool)
          assert.equal(0, s.live)
          assert.equal(1, s.closed_by.error)
          local c2, h2 = pool:checkout("k")
          assert.are_not.equal(c, c2)
          assert.equal(2, f.created)
          pool:checkin(h2, true)
          assert.equal(1, H.check(pool).idle)
        end)
      end)

      bit("waits like acquire: a checkin hands the client to the first waiter", function()
        run(function(sched)
          local pool = mkpool(sched, { max_live = 1 })
          local order = {}
          local c0, h0 = pool:checkout()
          for i = 1, 3 do
            sched.spawn(function()
              local c, h = pool:checkout()
              order[#order + 1] = i
              assert.equal(c0, c)
              sched.sleep(1)
              pool:checkin(h)
            end)
          end
          settle(sched)
          assert.equal(3, H.check(pool).waiting)
          pool:checkin(h0)
          sched.sleep(10)
          assert.same({ 1, 2, 3 }, order)
          local s = H.check(pool)
          assert.equal(0, s.leases)
          assert.equal(0, s.waiting)
          assert.equal(1, s.opened)
        end)
      end)

      bit("a waiting checkout times out with the acquire_timeout and a detail", function()
        run(function(sched)
          local pool = mkpool(sched, { max_live = 1, acquire_timeout = 2 })
          local _, h = pool:checkout()
          local t0 = sched.now()
          local c, code, detail = pool:checkout()
          assert.is_nil(c)
          assert.equal("timeout", code)
          assert.is_true(sched.now() - t0 >= 2)
          assert.equal(1, detail.live)
          assert.is_true(contains(tostring(detail), "timeout after"))
          pool:checkin(h)
        end)
      end)

      bit("fails like acquire: create failure, closed pool, full queue", function()
        run(function(sched)
          local pool, f = mkpool(sched, { max_live = 1, max_waiting = 0 })
          f.fail_next = 1
          local c, code, err = pool:checkout()
          assert.is_nil(c)
          assert.equal("create", code)
          assert.equal("refused", err)
          c, code, err = pool:checkout()           -- the key backs off: fails fast, same error
          assert.is_nil(c)
          assert.equal("create", code)
          assert.equal("refused", err)
          assert.equal(0, f.created)
          sched.sleep(0.05)                        -- past the backoff's window
          local _, h = pool:checkout()
          c, code = pool:checkout()
          assert.is_nil(c)
          assert.equal("full", code)
          pool:close()
          c, code = pool:checkout()
          assert.is_nil(c)
          assert.equal("closed", code)
          -- the holder still owns its client; its checkin destroys it
          pool:checkin(h)
          settle(sched)
          local s = H.check(pool)
          assert.equal(0, s.live)
          assert.equal(1, s.closed_by.drain)
        end)
      end)

      bit("runs validate and park/unpark on reuse", function()
        run(function(sched)
          local calls, idles = {}, {}
          local pool = mkpool(sched, {
            validate = function(_, _, idle)
              calls[#calls + 1] = "validate"
              idles[#idles + 1] = idle
              return #calls < 4
            end,
            park = function(c) calls[#calls + 1] = "park"; return { parked = c } end,
            unpark = function(st) calls[#calls + 1] = "unpark"; return st.parked end,
          })
          local c, h = pool:checkout()
          pool:checkin(h)
          sched.sleep(1)
          local c2, h2 = pool:checkout()
          assert.equal(c, c2)
          pool:checkin(h2)
          -- validate fails now: the record is retired and checkout looks again
          local c3, h3 = pool:checkout()
          assert.are_not.equal(c, c3)
          pool:checkin(h3)
          assert.same({ "park", "unpark", "validate", "park", "unpark", "validate", "park" }, calls)
          assert.is_true(idles[1] >= 1 and idles[1] < 1.5, tostring(idles[1]))
          assert.is_true(idles[2] >= 0 and idles[2] < 0.5, tostring(idles[2]))
          assert.equal(1, H.check(pool).closed_by.invalid)
        end)
      end)

      -- a parked idle client is unparked on checkout's own path, with no
      -- grant record (issue 17, bench B5): what the hook gives back, its
      -- failures and a waiter's place behave as on the general path
      for _, how in ipairs { "returns nil", "raises" } do
        bit("unpark that " .. how .. " retires the parked record, and checkout gets a new client", function()
          run(function(sched)
            local logged, unparks = {}, 0
            local pool, f = mkpool(sched, {
              max_live = 1,
              scheduler = setmetatable({ log = function(m) logged[#logged + 1] = m end }, { __index = sched }),
              park = function(c) return { parked = c } end,
              unpark = function(st)
                unparks = unparks + 1
                if unparks == 1 then
                  if how == "raises" then error("reconnect refused") end
                  return nil
                end
                return st.parked
              end,
            })
            local c1, h1 = pool:checkout("k")
            pool:checkin(h1)
            local c2, h2 = pool:checkout("k")     -- unpark fails: retired, a new client in its place
            assert.is_table(c2, h2)
            assert.are_not.equal(c1, c2)
            assert.equal(2, f.created)
            local s = H.check(pool)
            assert.equal(1, s.closed_by.invalid)
            assert.equal(1, s.live)
            assert.equal(1, s.leases)
            pool:checkin(h2)
            local c3, h3 = pool:checkout("k")     -- this unpark succeeds
            assert.equal(c2, c3)
            pool:checkin(h3)
            settle(sched)
            assert.equal(1, f.destroyed)
            assert.equal(how == "raises" and 1 or 0, #logged, table.concat(logged, "; "))
            s = H.check(pool)
            assert.equal(0, s.leases)
            assert.equal(1, s.idle)
          end)
        end)
      end

      -- what the upstream sees through the unparked-without-record path,
      -- with hooks that take time: a slow unpark (it yields), one that
      -- fails once, a slow destroy; connections counted where they are
      -- opened and closed, never above max_live, and in the end what the
      -- pool counts live
      bit("slow and failing unparks and a slow destroy: the upstream never sees more than max_live", function()
        run(function(sched)
          local conns, open, most, n, unparks = {}, 0, 0, 0, 0
          local pool = mkpool(sched, {
            max_live = 2,
            scheduler = setmetatable({ log = function() end }, { __index = sched }),
            create = function()
              n = n + 1
              local c = { id = n }
              conns[c], open = true, open + 1
              most = math.max(most, open)
              return c
            end,
            destroy = function(x)                 -- a parked record's stored value, or the client
              sched.sleep(0.5)
              local c = x.conn or x
              assert(conns[c], "a connection closed twice, or never opened")
              conns[c], open = nil, open - 1
            end,
            park = function(c) return { conn = c } end,
            unpark = function(st)
              unparks = unparks + 1
              local nth = unparks                 -- (the two tasks' unparks overlap)
              sched.sleep(0.5)
              if nth == 3 then return nil end     -- one fails: retired, its caller served again
              return st.conn
            end,
          })
          local done = 0
          for _ = 1, 2 do
            sched.spawn(function()
              for _ = 1, 4 do
                local c, h = pool:checkout("k")
                assert.is_table(c, h)
                sched.sleep(0.1)
                pool:checkin(h)
              end
              done = done + 1
            end)
          end
          for _ = 1, 200 do
            if done == 2 then break end
            sched.sleep(0.1)
          end
          sched.sleep(1)                          -- the slow destroy ends
          assert.equal(2, done)
          assert.is_true(most <= 2, "the upstream saw " .. most .. " connections")
          local st = H.check(pool)
          assert.equal(open, st.live)
          assert.equal(1, st.closed_by.invalid, "unparks " .. unparks .. ", created " .. n)
          assert.equal(0, st.leases)
          assert.is_true(unparks >= 4, tostring(unparks))
        end)
      end)

      -- (review of issue 17's change: the sentinel held while unpark ran
      -- stayed on the stack while the checkout waited again; taken back by
      -- the regrant, it was another lease's by then, whose leak was never
      -- reported: the waiter starved)
      bit("a checkout whose unpark failed holds no leak sentinel while it waits again", function()
        run(function(sched)
          local unparks, leaks, pool = 0, 0, nil
          pool = mkpool(sched, {
            max_live = 1,
            park = function(c) return { parked = c } end,
            unpark = function(st)
              unparks = unparks + 1
              if unparks == 1 then pool:pause("test", "a"); return nil end   -- B must wait again
              return st.parked
            end,
          })
          pool:on("leak", function(_, info) if info.leaked then leaks = leaks + 1 end end)
          local _, h = pool:checkout("a")
          pool:checkin(h)
          local got
          sched.spawn(function()
            local c, h2 = pool:checkout("a")      -- unpark fails: retired; B waits (key paused)
            got = c ~= nil
            if c then pool:checkin(h2) end
          end)
          sched.sleep(0.1)
          assert.equal(1, H.check(pool).waiting)
          -- the room B waits for, on B's lease slot, dropped without a release: a leak
          assert(pool:acquire("b"))
          pool:resume("a")
          for _ = 1, 10 do
            if got ~= nil then break end
            collectgarbage("collect")
            sched.sleep(1)
          end
          assert.is_true(got, "the waiter was never served")
          assert.equal(1, leaks)
          local s = H.check(pool)
          assert.equal(0, s.leases)
          assert.equal(0, s.waiting)
        end)
      end)

      -- (PUC Lua 5.1: pcall cannot yield there, so every hook runs in a
      -- coroutine of its own, base.ycall: that coroutine is allocated)
      local IS_PUC51 = _VERSION == "Lua 5.1" and not IS_JIT
      bit("a parked client is unparked with the key, and its checkout allocates nothing" ..
          (IS_PUC51 and " (PUC Lua 5.1: but its hook's coroutine)" or ""), function()
        run(function(sched)
          local keys = {}
          local stored = {}
          local pool = mkpool(sched, {
            park = function(c) stored.c = c; return stored end,
            unpark = function(st, key) keys[#keys + 1] = key; return st.c end,
          })
          local c, h = pool:checkout("k")
          pool:checkin(h)
          local c2, h2 = pool:checkout("k")
          assert.equal(c, c2)
          pool:checkin(h2)
          assert.same({ "k" }, keys)
          if not IS_PUC51 then assert.equal(0, H.bytes_per(checkout_pairs(pool))) end
          assert.equal(1, H.check(pool).live)
        end)
      end)

      bit("capacity > 1: a shared client is parked only when its last holder checks in", function()
        run(function(sched)
          local parks = 0
          local pool = mkpool(sched, {
            max_live = 1, capacity = 2,
            park = function(c) parks = parks + 1; return c end,
            unpark = function(c) return c end,
          })
          local c1, h1 = pool:checkout()
          local c2, h2 = pool:checkout()
          assert.equal(c1, c2)
          pool:checkin(h1)
          assert.equal(0, parks)
          pool:checkin(h2)
          assert.equal(1, parks)
          -- a holder retiring the shared client: the other keeps its handle
          local _, h3 = pool:checkout()
          local _, h4 = pool:checkout()
          pool:checkin(h3, false)
          assert.equal(1, H.check(pool).leases)
          pool:checkin(h4)
          settle(sched)
          local s = H.check(pool)
          assert.equal(0, s.leases)
          assert.equal(0, s.live)
        end)
      end)

      bit("drain() waits for checkouts", function()
        run(function(sched)
          local pool = mkpool(sched)
          local _, h = pool:checkout()
          local drained
          sched.spawn(function() drained = pool:drain() end)
          settle(sched)
          assert.is_nil(drained)
          pool:checkin(h)
          settle(sched)
          assert.is_true(drained)
        end)
      end)

      bit("leak_threshold reports a checkout held too long", function()
        run(function(sched)
          local pool = mkpool(sched, { leak_threshold = 5 })
          local got = {}
          pool:on("leak", function(key, info) got[#got + 1] = { key = key, info = info } end)
          local _, h = pool:checkout("k")
          sched.sleep(6)
          assert.equal(1, #got)
          assert.equal("k", got[1].key)
          assert.is_false(got[1].info.leaked)
          assert.equal("checkout", got[1].info.where)
          assert.is_true(got[1].info.held >= 5)
          pool:checkin(h)
          assert.equal(0, H.check(pool).leaked)
        end)
      end)

      bit("bad arguments raise", function()
        run(function(sched)
          local pool = mkpool(sched)
          local _, h = pool:checkout()
          for _, bad in ipairs { "1", -1, 1.5, 0 / 0, math.huge, {} } do
            local msg = errmsg(pool.checkin, pool, bad)
            assert.is_true(contains(msg, "clientpool: bad argument #1 to 'checkin'"), msg)
          end
          assert.is_true(contains(errmsg(pool.checkin, pool), "bad argument #1 to 'checkin'"))
          local msg = errmsg(pool.checkin, pool, h, "no")
          assert.is_true(contains(msg, "bad argument #2 to 'checkin'"), msg)
          msg = errmsg(pool.checkout, pool, 42)
          assert.is_true(contains(msg, "clientpool: bad argument #1 to 'checkout'"), msg)
          assert.equal(1, H.check(pool).leases)   -- none of it touched the lease
          pool:checkin(h)
        end)
      end)

      bit("allocates nothing per checkout/checkin pair", function()
        run(function(sched)
          local pool = mkpool(sched)
          assert.equal(0, H.bytes_per(checkout_pairs(pool)))
        end)
      end)
    end)
  end
end

-- clientpool.core's fastpath: on the C API backend a pool that reads the
-- real clock (capacity 1, no probe, no park hook) does checkout/checkin's
-- common case in C (init.lua's install_fastpath). The same random script
-- runs on such a pool and on one with the fast path removed (the Lua path
-- alone); every result, listener call and count must agree.
describe("checkout/checkin, acquire/release and try_acquire: the C fast path agrees with the Lua path", function()
  -- One script on a real-clock loop of its own: checkouts and acquires
  -- (some of them waiting, in tasks), try_acquires, checkins and releases for reuse or
  -- not, stale checkins, repeated releases, failing validates (odd seeds),
  -- listeners added halfway.
  local function script(seed, fast)
    local loop = require("clientpool.loop").new()
    local made, destroyed = 0, 0
    local log = {}
    local function say(...) log[#log + 1] = table.concat({ ... }, " ") end
    local fails = {}
    local pool = clientpool.new {
      backend = "core", max_live = 3, max_waiting = 4, acquire_timeout = 30, scheduler = loop,
      create = function(key)
        made = made + 1
        return { id = made, key = key }
      end,
      destroy = function(c) destroyed = destroyed + 1; say("destroy", c.id) end,
      validate = seed % 2 == 1 and function(c)
        if fails[c.id] then fails[c.id] = nil; return false end
        return true
      end or nil,
    }
    assert(rawget(pool, "checkout") ~= nil and rawget(pool, "acquire") ~= nil, "fast path installed")
    assert(rawget(pool, "try_acquire") ~= nil, "fast path's try_acquire installed")
    if not fast then
      H.without_fastpath(pool)
    end
    local cap = 3   -- max_live, changed by configure() on the way
    local rnd = seed
    local function r(n)
      rnd = (rnd * 1103515245 + 12345) % 2147483648
      return rnd % n + 1
    end
    local held, old, leases, released = {}, {}, {}, {}
    local keys = { nil, "a", "b" }
    -- (issue 17) acquisitions made while waiters are queued but fewer than
    -- max_waiting: the fast path's engine call since then (before, the Lua
    -- path's); counted so that the test proves the script reaches it
    local short = 0
    local function queued_short()
      local n = rawget(pool, "_nwaiters")
      return n > 0 and n < pool._c.max_waiting
    end
    local function checkout(step, key)
      if queued_short() then short = short + 1 end
      local c, h, detail = pool:checkout(key)
      if c then
        held[#held + 1] = h
        say(step, "checkout", tostring(key), c.id, tostring(c.key))
      else
        say(step, "checkout", tostring(key), "->", h, type(detail))
      end
    end
    local function acquire(step, key)
      if queued_short() then short = short + 1 end
      local lease, code, detail = pool:acquire(key)
      if lease then
        leases[#leases + 1] = lease
        say(step, "acquire", tostring(key), lease.client.id, tostring(lease.client.key))
      else
        say(step, "acquire", tostring(key), "->", code, type(detail))
      end
    end
    local function try_acquire(step, key)
      local lease, code, detail = pool:try_acquire(key)
      if lease then
        leases[#leases + 1] = lease
        say(step, "try_acquire", tostring(key), lease.client.id, tostring(lease.client.key))
      else
        say(step, "try_acquire", tostring(key), "->", code, type(detail))
      end
    end
    loop.spawn(function()
      for step = 1, 300 do
        local op = r(19)
        local now = pool:stats()
        if op <= 3 and now.leases < cap and now.waiting == 0 then
          checkout(step, keys[r(3)])             -- does not wait
        elseif op <= 5 then
          local key = keys[r(3)]
          loop.spawn(function() checkout(step, key) end)   -- may wait
        elseif op <= 9 and #held > 0 then
          local h = table.remove(held, r(#held))
          local reuse = ({ nil, true, false })[r(3)]
          pool:checkin(h, reuse)
          old[#old + 1] = h
          say(step, "checkin", tostring(reuse))
        elseif op == 10 and #old > 0 then
          pool:checkin(old[r(#old)])        -- stale: a no-op
          say(step, "stale checkin")
        elseif op == 11 then
          fails[r(made + 1)] = true          -- the next validate of that client fails
        elseif op == 12 and now.leases < cap and now.waiting == 0 then
          acquire(step, keys[r(3)])              -- does not wait
        elseif op == 13 then
          local key = keys[r(3)]
          loop.spawn(function() acquire(step, key) end)    -- may wait
        elseif op <= 16 and #leases > 0 then
          local lease = table.remove(leases, r(#leases))
          local reuse = ({ nil, true, false })[r(3)]
          local id = lease.client.id
          lease:release(reuse)
          released[#released + 1] = lease
          say(step, "release", id, tostring(reuse), tostring(lease.client))
        elseif op == 17 and #released > 0 then
          released[r(#released)]:release()     -- again: a no-op
          say(step, "release again")
        elseif op >= 18 then
          try_acquire(step, keys[r(3)])          -- never waits: may time out
        end
        -- configure() on the way: a lower cap and queue, then a higher cap with
        -- leak_threshold (the lease form leaves the fast path), then without
        if step == 100 then
          cap = 2
          say("configure", tostring(pool:configure { max_live = 2, max_waiting = 2 }))
        elseif step == 200 then
          cap = 3
          say("configure", tostring(pool:configure { max_live = 3, max_waiting = 4, leak_threshold = 1000 }))
          assert(rawget(pool, "acquire") == nil and rawget(pool, "try_acquire") == nil,
                 "leak_threshold: acquire and try_acquire in Lua")
        elseif step == 250 then
          say("configure", tostring(pool:configure { leak_threshold = false, validate_after_idle = 1000 }))
          assert((rawget(pool, "acquire") ~= nil) == fast, "the fast path's acquire again (fast run only)")
        end
        if step == 150 then
          pool:on("acquire", function(key, c) say("on acquire", tostring(key), c.id) end)
          pool:on("release", function(key, c, reuse) say("on release", tostring(key), c.id, tostring(reuse)) end)
        end
        loop.sleep(0)          -- a waiter woken by this step runs now
        say("made", made, "destroyed", destroyed)   -- before stats(), which drains the events
        local s = pool:stats()
        say("stats", s.live, s.idle, s.active, s.leases, s.waiting, s.opened, s.closed, s.reused)
      end
      while #held > 0 or #leases > 0 or pool:stats().waiting > 0 do
        for _, h in ipairs(held) do pool:checkin(h) end
        for _, lease in ipairs(leases) do lease:release() end
        held, leases = {}, {}
        loop.sleep(0)
      end
      pool:close()
    end)
    loop.run()
    local s = pool:stats()
    say("end", s.live, s.idle, s.leases, s.waiting, s.opened, s.closed, s.timeouts)
    return log, short
  end

  it("on random scripts (every result, event and count), configure() on the way", function()
    local short = 0
    for seed = 1, 12 do
      local a, n = script(seed, true)
      local b = script(seed, false)
      short = short + n
      for i = 1, math.max(#a, #b) do
        assert(a[i] == b[i], "seed " .. seed .. ", line " .. i .. ": fast '" .. tostring(a[i]) ..
               "', Lua '" .. tostring(b[i]) .. "'")
      end
    end
    -- the fast path with waiters queued (issue 17) was compared too
    assert(short >= 50, "acquisitions with a short queue: " .. short)
  end)

  -- (eighth session: the C checkout and checkin take their arguments as
  -- given, without a lua_settop, and put them right for the paths off the
  -- common case; checkin is the C closure on every Lua)
  it("takes fewer or more arguments than it reads on every path", function()
    local loop = require("clientpool.loop").new()
    local made, destroyed = 0, 0
    local pool = clientpool.new {
      backend = "core", max_live = 1, scheduler = loop,
      create = function() made = made + 1; return { id = made } end,
      destroy = function() destroyed = destroyed + 1 end,
    }
    assert.are.equal("C", debug.getinfo(rawget(pool, "checkin"), "S").what)   -- on 5.1 too
    local c, h = pool:checkout(nil, "extra")
    assert.is_table(c)
    assert.is_nil(pool:checkin(h, nil, "extra"))
    local _
    _, h = pool:checkout()
    pool:checkin(h)                               -- reuse absent: kept
    assert.are.equal(0, destroyed)
    -- a waiter queued: checkin's events go to Lua (checkin_rest) with the
    -- reuse argument absent, nil or false, and extra arguments
    local function handoff(...)
      local got
      local _, held = pool:checkout()
      loop.spawn(function()
        local wc, wh = pool:checkout()
        got = wc
        pool:checkin(wh)
      end)
      loop.sleep(0)                                 -- the waiter queues
      pool:checkin(held, ...)
      loop.sleep(0)
      return got
    end
    loop.spawn(function()
      assert.is_table(handoff())
      assert.is_table(handoff(nil, "extra"))
      assert.are.equal(0, destroyed)
      local got = handoff(false)                    -- retired: the waiter gets a new client
      assert.is_table(got)
      assert.are.equal(1, destroyed)
      assert.are.equal(2, made)
      -- a release listener: the whole call goes to the Lua checkin
      local seen = {}
      pool:on("release", function(_, _, reuse) seen[#seen + 1] = reuse end)
      local _, h2 = pool:checkout()
      pool:checkin(h2)
      _, h2 = pool:checkout("k")
      pool:checkin(h2, false, "extra")
      assert.are.same({ true, false }, seen)
    end)
    loop.run()
    local ok, err = pcall(pool.checkin, pool)
    assert.is_false(ok)
    assert.truthy(err:find("bad argument #1 to 'checkin' (a handle from checkout expected, got nil)", 1, true), err)
    ok, err = pcall(function() pool:checkin() end)
    assert.truthy(not ok and err:find("checkout_spec.lua:%d+: clientpool: bad argument #1 to 'checkin'"), err)
    pool:close()
  end)

  it("ends no lease of the acquire form given a handle forged to name it, as the Lua path", function()
    for _, fast in ipairs { true, false } do
      local pool = clientpool.new { backend = "core", max_live = 2, create = function() return {} end }
      assert(rawget(pool, "checkin") ~= nil, "fast path installed")
      if not fast then H.without_fastpath(pool) end
      local _, h = pool:checkout()
      local lease = assert(pool:acquire())
      local forged = forged_handle(pool, lease)
      pool:checkin(forged)
      pool:checkin(forged, false)
      assert.equal(2, H.check(pool).leases)
      lease:release()
      pool:checkin(h)
      assert.equal(0, H.check(pool).leases)
      pool:close()
    end
  end)

  it("is installed only where its common case needs no Lua", function()
    local function fast(o, field)
      o.create = function() return {} end
      o.backend, o.max_live = "core", 2
      local pool = clientpool.new(o)
      local on = rawget(pool, field or "checkout") ~= nil
      pool:close()
      return on
    end
    assert.is_true(fast {})
    assert.is_true(fast({}, "acquire"))
    assert.is_false(fast({ leak_threshold = 10 }, "acquire"))   -- a traceback per lease: Lua
    assert.is_true(fast({}, "try_acquire"))
    assert.is_false(fast({ leak_threshold = 10 }, "try_acquire"))
    assert.is_true(fast { leak_threshold = 10 })
    assert.is_false(fast { capacity = 2 })
    assert.is_false(fast { probe = true })
    assert.is_false(fast { park = function() end, unpark = function(c) return c end })
    assert.is_false(fast { scheduler = require("clientpool.loop").new { clock = "virtual" } })
  end)

  it("keeps the Lua path's errors (position: the caller's line)", function()
    local pool = clientpool.new { create = function() return {} end, backend = "core", max_live = 1 }
    local _, h = pool:checkout()
    local ok, err = pcall(pool.checkin, pool, "x")
    assert.is_false(ok)
    assert.truthy(err:find("bad argument #1 to 'checkin'", 1, true), err)
    ok, err = pcall(pool.checkin, pool, h, 1)
    assert.is_false(ok)
    assert.truthy(err:find("bad argument #2 to 'checkin'", 1, true), err)
    ok, err = pcall(function() pool:checkin(-1) end)
    assert.is_false(ok)
    assert.truthy(err:find("checkout_spec.lua:%d+: clientpool: bad argument #1 to 'checkin'"), err)
    ok, err = pcall(function() pool:try_acquire(123) end)
    assert.is_false(ok)
    assert.truthy(err:find("checkout_spec.lua:%d+: clientpool: bad argument #1 to 'try_acquire' " ..
                           "%(key must be a string"), err)
    ok, err = pcall(function() pool:checkout(123) end)
    assert.is_false(ok)
    assert.truthy(err:find("checkout_spec.lua:%d+: clientpool: bad argument #1 to 'checkout' " ..
                           "%(key must be a string"), err)
    ok, err = pcall(function() pool:acquire(123) end)
    assert.is_false(ok)
    assert.truthy(err:find("checkout_spec.lua:%d+: clientpool: bad argument #1 to 'acquire' " ..
                           "%(key must be a string"), err)
    ok, err = pcall(function() pool:acquire(nil, { timout = 1 }) end)
    assert.is_false(ok)
    assert.truthy(err:find("checkout_spec.lua:%d+: clientpool: bad argument #2 to 'acquire' " ..
                           "%(unknown option 'timout'"), err)
    ok, err = pcall(function() pool.acquire() end)
    assert.is_false(ok)
    assert.truthy(err:find("checkout_spec.lua:%d+: clientpool: acquire needs the pool as self"), err)
    -- the only client is out: a checkout or acquire outside a task would
    -- wait, and says so at the caller's line (a known key, a new one, a lease)
    local line
    ok, err = pcall(function() line = debug.getinfo(1, "l").currentline; local x = pool:checkout(); return x end)
    assert.is_false(ok)
    assert.truthy(err:find("checkout_spec.lua:" .. line .. ": clientpool: checkout would wait", 1, true), err)
    ok, err = pcall(function() line = debug.getinfo(1, "l").currentline; local x = pool:checkout("new"); return x end)
    assert.is_false(ok)
    assert.truthy(err:find("checkout_spec.lua:" .. line .. ": clientpool: checkout would wait", 1, true), err)
    ok, err = pcall(function() line = debug.getinfo(1, "l").currentline; local x = pool:acquire(); return x end)
    assert.is_false(ok)
    assert.truthy(err:find("checkout_spec.lua:" .. line .. ": clientpool: acquire would wait", 1, true), err)
    ok, err = pcall(function() pool:checkin(h, "yes") end)
    assert.is_false(ok)
    assert.truthy(err:find("checkout_spec.lua:%d+: clientpool: bad argument #2 to 'checkin' " ..
                           "%(boolean or nil expected, got string%)"), err)
    pool:checkin(h)
    pool:close()
  end)
end)
