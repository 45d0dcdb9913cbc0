-- clientpool.ffi (LuaJIT only): the FFI backend has the surface of the C
-- binding and gives the same results for the same calls (its declarations,
-- clientpool.cdef, are checked in cdef_spec.lua).

local IS_JIT = rawget(_G, "jit") ~= nil
local jit_it = IS_JIT and it or pending

describe("clientpool.ffi", function()
  it("option backend picks the binding of a pool and is validated", function()
    local clientpool = require "clientpool"
    local function new(backend)
      return clientpool.new { max_live = 1, create = function() return {} end, backend = backend }
    end
    assert(tostring(new("core")._e):find("^clientpool.Engine: "))
    for _, bad in ipairs { "c", 1, true } do
      local ok, err = pcall(new, bad)
      assert(not ok and tostring(err):find("option 'backend' must be \"core\" or \"ffi\"", 1, true), tostring(err))
    end
    local ok, err = pcall(new, "ffi")
    if IS_JIT then
      assert(ok, err)
      assert(getmetatable(err._e) ~= getmetatable(new("core")._e))
    else
      assert(not ok and tostring(err):find("needs LuaJIT", 1, true), tostring(err))
    end
  end)

  jit_it("has the C binding's constants, BY table and engine methods", function()
    local core, cffi = require "clientpool.core", require "clientpool.ffi"
    for k, v in pairs(core) do
      if type(v) == "number" then
        assert(cffi[k] == v, "constant " .. k .. ": core " .. v .. ", ffi " .. tostring(cffi[k]))
      elseif type(v) == "table" and k ~= "fleet" then
        -- (core.fleet, the fleet's C binding, has its FFI twin in
        -- clientpool.fleet_ffi; spec/fleet_ffi_spec.lua mirrors the two)
        for name, code in pairs(v) do assert(cffi[k][name] == code, k .. "." .. name) end
        for name in pairs(cffi[k]) do assert(v[name] ~= nil, "ffi " .. k .. "." .. name .. " not in core") end
      elseif type(v) == "function" and k ~= "fastpath" then
        -- (fastpath is the C API's checkout/checkin for interpreted Lua;
        -- under the FFI the driver's Lua path compiles instead)
        assert(type(cffi[k]) == "function", "function " .. k .. " missing in clientpool.ffi")
      end
    end
    for k, v in pairs(cffi) do
      if k ~= "_NAME" then assert(core[k] ~= nil, "ffi has " .. k .. ", core has not (" .. type(v) .. ")") end
    end
    local ce, fe = core.new { max_live = 1 }, cffi.new { max_live = 1 }
    local cm, fm = getmetatable(ce).__index, getmetatable(fe).__index
    for name, fn in pairs(cm) do
      if type(fn) == "function" and not name:find("^__") then
        assert(type(fm[name]) == "function", "method " .. name .. " missing in clientpool.ffi")
      end
    end
    for name, fn in pairs(fm) do
      if type(fn) == "function" then assert(type(cm[name]) == "function", "ffi method " .. name .. " not in core") end
    end
    assert(type(cffi.monotime()) == "number")
    assert(cffi.monotime() >= 0)
  end)

  jit_it("a freed engine raises on use and free() is idempotent", function()
    local e = require("clientpool.ffi").new { max_live = 1 }
    e:free()
    e:free()
    local ok, err = pcall(e.acquire, e, 0)
    assert(not ok and tostring(err):find("freed", 1, true), tostring(err))
  end)

  jit_it("a collected sentinel reports its lease and calls notify; a released one does nothing", function()
    local cffi = require "clientpool.ffi"
    local e = cffi.new { max_live = 2 }
    local k = e:key_open()
    e:key_pin(k, true)
    local notified = 0
    e:set_notify(function() notified = notified + 1 end)
    -- each sentinel is made in a function of its own, so no stack slot
    -- keeps it alive
    local rec1 = (function()
      local st, rec, _, _, _, _, _, s = e:acquire(k, 1, true)
      assert(st == cffi.GRANT_CREATE and s ~= nil)
      return rec
    end)()
    e:created(rec1, true, 1)
    collectgarbage(); collectgarbage()
    assert(notified == 1, "notify not called")
    assert(e:stats(-1).leaked == 1)
    while e:next_event() do end
    -- a released lease: the sentinel's collection is a no-op
    ;(function()
      local _, rec, l, g, _, _, _, s = e:acquire(k, 2, true)
      assert(s ~= nil)
      e:created(rec, true, 2)
      assert(e:release(l, g, -1, 3))
    end)()
    collectgarbage(); collectgarbage()
    assert(notified == 1)
    assert(e:stats(-1).leaked == 1)
    -- a sentinel outliving its engine
    ;(function()
      local _, _, _, _, _, _, _, s = e:acquire(k, 4, true)
      assert(s ~= nil)
      e:free()
    end)()
    collectgarbage(); collectgarbage()
    assert(notified == 1)
  end)

  jit_it("a released lease's sentinel guards the next lease, and reports that one when dropped", function()
    local cffi = require "clientpool.ffi"
    local e = cffi.new { max_live = 2 }
    local k = e:key_open()
    e:key_pin(k, true)
    local notified = 0
    e:set_notify(function() notified = notified + 1 end)
    local first = (function()
      local _, rec, l, g, _, _, _, s = e:acquire(k, 1, true)
      e:created(rec, true, 1)
      assert(e:release(l, g, -1, 2))
      return s
    end)()
    collectgarbage(); collectgarbage()
    assert(notified == 0)
    -- the next lease gets the same sentinel, armed for it
    local l2, g2 = (function()
      local _, _, l, g, _, _, _, s = e:acquire(k, 3, true)
      assert(rawequal(s, first), "the released sentinel was not reused")
      assert(s.lease == l and s.gen == g)
      return l, g
    end)()
    assert(e:lease_age(l2, g2, 4) ~= nil)
    first = nil -- luacheck: ignore (the last reference: the lease is dropped)
    collectgarbage(); collectgarbage()
    assert(notified == 1, "the dropped lease was not reported")
    assert(e:lease_age(l2, g2, 5) == nil)
    assert(e:stats(-1).leaked == 1)
    -- a stale release never recycles the sentinel of the slot's new lease
    local keep = (function()
      local st, rec, l, g, _, _, _, s = e:acquire(k, 6, true)
      if st == cffi.GRANT_CREATE then e:created(rec, true, 6) end
      e:release(l2, g2, -1, 6)        -- stale (leaked above): a no-op
      assert(s.lease == l and s.gen == g)
      return { s = s, l = l, g = g }
    end)()
    assert(e:release(keep.l, keep.g, -1, 7))
  end)

  jit_it("engines are collected (finalizers do not keep them alive)", function()
    local cffi = require "clientpool.ffi"
    local freed = setmetatable({}, { __mode = "k" })
    for _ = 1, 50 do
      local e = cffi.new { max_live = 4 }
      local k = e:key_open()
      assert(select(8, e:acquire(k, 1, true)))
      e:set_notify(function() return e end)
      freed[e] = true
    end
    for _ = 1, 4 do collectgarbage() end
    assert(next(freed) == nil, "an engine object survived collection")
  end)

  jit_it("engines whose sentinels were released and kept for reuse are collected (issue 18)", function()
    local cffi = require "clientpool.ffi"
    local freed = setmetatable({}, { __mode = "k" })
    for _ = 1, 50 do
      local e = cffi.new { max_live = 4 }
      local k = e:key_open()
      local _, rec, l, g = e:acquire(k, 1, true)
      e:created(rec, true, 1)
      assert(e:release(l, g, -1, 2))        -- its sentinel goes to the spares
      e:set_notify(function() return e end, function() return 3 end)
      freed[e] = true
    end
    for _ = 1, 4 do collectgarbage() end
    assert(next(freed) == nil, "an engine object survived collection")
  end)

  jit_it("a collected sentinel is reported at the time set_notify's clock gives (issue 18)", function()
    local cffi = require "clientpool.ffi"
    for _, clock in ipairs { false, true } do
      -- (max_concurrency holds the waiter: the collection frees a lease at
      -- once, while the leaked client counts against max_live until its
      -- destroy is reported)
      local e = cffi.new { max_live = 2, max_concurrency = 1 }
      local k = e:key_open()
      e:key_pin(k, true)
      e:set_notify(function() end, clock and function() return 5 end or nil)
      ;(function()
        local _, rec = e:acquire(k, 1, true)
        e:created(rec, true, 1)
      end)()
      local w, wg = e:wait(k, -1, 1)         -- waits for the one lease there is
      collectgarbage(); collectgarbage()
      local st, _, _, _, _, _, _, waited = e:claim(w, wg, 6)
      assert(st == cffi.GRANT_CREATE, "not granted: " .. tostring(st))   -- (the leaked client is destroyed)
      assert(waited == (clock and 4 or 0), "waited " .. tostring(waited))
    end
  end)

  -- The same random sequence of engine calls on both backends must give the
  -- same results: the FFI binding converts like the C binding.
  jit_it("gives the same results as clientpool.core for the same calls", function()
    local core, cffi = require "clientpool.core", require "clientpool.ffi"
    local cfg = { max_live = 4, max_idle = 3, max_waiting = 5, max_keys = 3, idle_timeout = 5,
                  max_lifetime = 20, leak_threshold = 7, capacity = 1, key_max_live = 3 }
    local a, b = core.new(cfg), cffi.new(cfg)
    local seed = 12345
    local function rnd(n)
      seed = (seed * 16807) % 2147483647   -- Park-Miller: exact in doubles
      return seed % n + 1
    end
    local leases, waiters, creating, keys = {}, {}, {}, {}
    local now = 0
    local unpack = table.unpack or unpack
    local function pack(...) return { n = select("#", ...), ... } end
    -- calls method on both engines (once each) and compares the results
    local function same(method, ...)
      local r1, r2 = pack(a[method](a, ...)), pack(b[method](b, ...))
      assert(r1.n == r2.n, string.format("%s: core gave %d results, ffi %d", method, r1.n, r2.n))
      for i = 1, r1.n do
        local x, y = r1[i], r2[i]
        assert(x == y or (x ~= x and y ~= y),
               string.format("%s result %d: core %s, ffi %s", method, i, tostring(x), tostring(y)))
      end
      return unpack(r1, 1, r1.n)
    end
    for _ = 1, 3 do
      keys[#keys + 1] = same("key_open")
      same("key_pin", keys[#keys], true)
    end
    for step = 1, 3000 do
      now = now + rnd(100) / 100
      local op = rnd(12)
      local k = keys[rnd(#keys)]
      if op <= 3 then
        local st, rec, l, g = same("acquire", k, now, false)
        if st == cffi.GRANT_IDLE then leases[#leases + 1] = { l, g }
        elseif st == cffi.GRANT_CREATE then creating[#creating + 1] = { rec, l, g } end
      elseif op == 4 and #creating > 0 then
        local c = table.remove(creating, rnd(#creating))
        local ok = rnd(4) > 1
        same("created", c[1], ok, now)
        if ok then leases[#leases + 1] = { c[2], c[3] } end
      elseif op <= 6 and #leases > 0 then
        local i = rnd(#leases)
        local x = leases[i]
        same("release", x[1], x[2], rnd(3) == 1 and cffi.BY.error or -1, now)
        if rnd(5) > 1 then table.remove(leases, i) end   -- else: released again later (stale)
      elseif op == 7 then
        local w, g = same("wait", k, rnd(2) == 1 and now + rnd(10) or -1, now)
        if w then waiters[#waiters + 1] = { w, g } end
      elseif op == 8 and #waiters > 0 then
        local i = rnd(#waiters)
        local x = waiters[i]
        local st, rec, l, g
        if rnd(2) == 1 then
          st, rec, l, g = same("claim", x[1], x[2], now, false)
        else
          st, rec, l, g = same("cancel", x[1], x[2], rnd(2) == 1 and cffi.TIMEOUT or cffi.CANCELLED, now, false)
        end
        if st == cffi.GRANT_IDLE then leases[#leases + 1] = { l, g }; table.remove(waiters, i)
        elseif st == cffi.GRANT_CREATE then creating[#creating + 1] = { rec, l, g }; table.remove(waiters, i)
        elseif st ~= cffi.PENDING then table.remove(waiters, i) end
      elseif op == 9 then
        same("tick", now)
        same("next_deadline")
      elseif op == 10 then
        local sa, sb = a:stats(-1, {}), b:stats(-1, {})
        for f, v in pairs(sa) do
          if type(v) == "table" then
            for g, w in pairs(v) do assert(sb[f][g] == w, "stats " .. f .. "." .. g) end
          else
            assert(sb[f] == v, "stats " .. f .. ": core " .. tostring(v) .. ", ffi " .. tostring(sb[f]))
          end
        end
        same("gate", k)
        same("is_closed")
        same("pending")
      elseif op == 11 and #leases > 0 then
        local x = leases[rnd(#leases)]
        same("lease_age", x[1], x[2], now)
        same("probe_ok", x[1], x[2], now)
      elseif op == 12 then
        local r = rnd(5)
        if r == 1 then same("pause", k, now) elseif r == 2 then same("resume", k, rnd(2) == 1, now)
        elseif r == 3 then same("retire_before", k, now - 3, now) elseif r == 4 then same("record_created", rnd(6) - 1)
        elseif rnd(2) == 1 then
          -- a live change of caps and durations (sometimes outside the envelope)
          local c = {}
          for f, v in pairs(cfg) do c[f] = v end
          c.max_live = 2 + rnd(3)
          c.max_idle = c.max_live - (rnd(4) == 1 and 1 or 0) + (rnd(8) == 1 and 2 or 0)
          c.key_max_live = math.min(3, c.max_live)
          c.max_lifetime = rnd(3) == 1 and -1 or rnd(30)
          c.leak_threshold = rnd(3) == 1 and -1 or rnd(10)
          same("configure", c, now)
          same("configure", cfg, now)          -- and back (so the rest is exercised as before)
        else                                   -- a key's own caps, and back
          same("key_caps", k, rnd(2) == 1 and -1 or 1 + rnd(4), rnd(2) == 1 and -1 or rnd(4), now)
          same("key_caps", k, -1, -1, now)
        end
      end
      while true do
        local t, ea = same("next_event")
        if not t then break end
        -- no destroy hook: the destroy is done at once (the cap is physical)
        if t == cffi.EV_DESTROY then same("destroyed", ea, now) end
      end
      if step == 2500 then same("close", now) end
    end
    local st = a:stats(-1, {})
    assert(st.opened > 20 and st.reused > 20 and st.timeouts > 0,
           "the sequence exercised too little: " .. st.opened .. " " .. st.reused .. " " .. st.timeouts)
  end)
end)
