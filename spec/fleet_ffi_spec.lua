-- The fleet's two bindings, clientpool.core.fleet (csrc/lfleet.c, the Lua C
-- API) and clientpool.fleet_ffi (LuaJIT's FFI, on LuaJIT): each binding's
-- surface (open, limits, take/give, gates, stats, errors), and the same
-- results from both for the same calls on one fleet.

local core = require "clientpool.core"
local H = require "spec.helpers"

local IS_JIT = rawget(_G, "jit") ~= nil
local name_for, cleanup = H.fleet_names("binding")

local BACKENDS = { { "core", core.fleet } }
if IS_JIT then BACKENDS[2] = { "ffi", require "clientpool.fleet_ffi" } end

for _, b in ipairs(BACKENDS) do
  local bname, F = b[1], b[2]
  describe("fleet binding (" .. bname .. ")", function()
    after_each(cleanup)

    it("creates, attaches, and reports an unknown fleet as a result, not an error", function()
      local name = name_for("open")
      local h, code, msg = F.open(name)
      assert.is_nil(h)
      assert.equal("enoent", code)
      assert.truthy(msg:find("does not exist", 1, true))
      local a, created = assert(F.open(name, { max_live = 3 }))
      assert.is_true(created)
      local c, created2 = assert(F.open(name))
      assert.is_false(created2)
      assert.equal(3, c:limits().max_live)
      assert.truthy(tostring(a):find("^clientpool.Fleet: 0x"))
      a:close()
      a:close()                                   -- idempotent
      assert.truthy(tostring(a):find("closed"))
      assert.has_error(function() a:join() end)
      c:close()
      assert.truthy(F.shm_name(name):find("^/clientpool%.%d+%.n%."))
      assert.equal(true, F.remove(name))
      local ok, rcode = F.remove(name)
      assert.is_nil(ok)
      assert.equal("enoent", rcode)
    end)

    it("takes and gives budget, per key and fleet-wide", function()
      local name = name_for("budget")
      local a = assert(F.open(name, { max_live = 2, key_max_live = 1, max_keys = 4, members = 4 }))
      local c = assert(F.open(name))
      assert(a:join())
      assert(c:join())
      assert.are_not.equal(a:row(), c:row())
      local ka, kc = assert(a:key_open("redis-a")), assert(c:key_open("redis-a"))
      assert.equal(ka, kc)
      local kb = assert(c:key_open("redis-b"))
      assert.equal(F.TAKEN, a:take(F.LIVE, ka))
      assert.equal(F.REFUSED_KEY, c:take(F.LIVE, kc))
      assert.equal(F.TAKEN, c:take(F.LIVE, kb))
      assert.equal(F.REFUSED, a:take(F.LIVE))
      local s = a:stats()
      assert.equal(2, s.live)
      assert.equal(2, s.members)
      assert.equal(2, s.keys)
      assert.equal(2, a:count(F.LIVE))
      assert.equal(1, a:count(F.LIVE, ka))
      -- limits change in place; a bad one is refused with its rule
      assert(c:update { max_live = 3, key_max_live = 1, max_keys = 4, members = 4 })
      assert.equal(3, a:limits().max_live)
      local uok, ucode, umsg = c:update { max_live = 3, max_keys = 5, members = 4 }
      assert.is_nil(uok)
      assert.equal("egeometry", ucode)
      assert.truthy(umsg:find("max_keys = 4", 1, true), umsg)
      assert(c:update { max_live = 2, key_max_live = 1, max_keys = 4, members = 4 })
      local kname, ks = a:key_stats(ka)
      assert.equal("redis-a", kname)
      assert.equal(1, ks.live)
      assert.equal(2, ks.refs)
      local m = a:member_stats(a:row())
      assert.equal(1, m.live)
      assert.equal(1, m.self)
      assert.equal(1, m.alive)
      assert.is_true(m.pid > 0)
      -- a waiter learns of freed budget from the sequence number
      assert.equal(0, a:waiting())
      local s0 = c:demand(F.LIVE, -1, 1)
      assert.equal(1, a:waiting())
      assert.equal(F.REFUSED, c:take(F.LIVE))
      assert.equal(0, a:give(F.LIVE, ka))
      assert.are_not.equal(s0, c:poll())
      assert.equal(F.REFUSED_TURN, a:take(F.LIVE, ka))  -- c waited: its turn
      assert.equal(F.TAKEN, c:take(F.LIVE, kc))
      c:demand(F.LIVE, -1, 0)
      assert.equal(0, c:give(F.LIVE, kc))
      assert.equal(0, c:give(F.LIVE, kb))
      assert.equal(-14, c:give(F.LIVE, kb))             -- ENOTHELD: nothing changes
      assert.equal(0, a:stats().live)
      assert(c:key_close(kb))
      assert.is_nil(a:key_stats(kb))
      local ok, code = c:key_close(kb)
      assert.is_nil(ok)
      assert.equal("enotheld", code)
      assert.equal(0, c:scan(true))
      a:close()
      c:close()
    end)

    it("pauses and resumes the fleet or a key, with a reason", function()
      local name = name_for("gate")
      local a = assert(F.open(name, { max_live = 2 }))
      assert.is_false(a:gate())
      local g0 = a:gates_gen()
      assert(a:pause("429 from upstream"))
      assert.are_not.equal(g0, a:gates_gen())
      local paused, reason, till = a:gate()
      assert.is_true(paused)
      assert.equal("429 from upstream", reason)
      assert.is_nil(till)
      assert(a:resume())
      assert.is_false(a:gate())
      assert(a:pause("slow", "k1", core.monotime() + 3600))
      local slot = assert(a:key_find("k1"))
      paused, reason, till = a:gate(slot)
      assert.is_true(paused)
      assert.equal("slow", reason)
      assert.is_true(till > core.monotime())
      assert(a:resume("k1"))
      local none, code = a:key_find("k1")
      assert.is_nil(none)
      assert.equal("enoent", code)
      a:close()
    end)

    it("refuses bad limits with a sentence naming the limit", function()
      local h, code, msg = F.open(name_for("bad"), { max_live = 4, max_idle = 9 })
      assert.is_nil(h)
      assert.equal("einval", code)
      assert.truthy(msg:find("max_idle (9) must be <= max_live (4)", 1, true), msg)
      assert.has_error(function() F.open("x", { max_live = "many" }) end,
                       "clientpool: fleet limit 'max_live' must be a 32-bit integer")
      h, code = F.open("", { max_live = 1 })
      assert.is_nil(h)
      assert.equal("einval", code)
    end)

    it("has the surface of the other binding", function()
      local other = bname == "core" and (IS_JIT and require "clientpool.fleet_ffi") or core.fleet
      for _, k in ipairs { "LIVE", "IDLE", "LEASE", "FLOOR", "TAKEN", "REFUSED", "REFUSED_KEY", "REFUSED_TURN",
                           "NAME_MAX", "KEY_MAX", "REASON_MAX" } do
        assert.equal(other[k], F[k], k)
      end
      local name = name_for("surface")
      local a = assert(F.open(name, { max_live = 2 }))
      local o = assert(other.open(name))
      assert(a:join())
      local ka = assert(a:key_open("k"))
      a:take(F.LIVE, ka)
      local function keys(t)
        local r = {}
        for k in pairs(t) do r[#r + 1] = k end
        table.sort(r)
        return table.concat(r, ",")
      end
      local sa, so = a:stats(), o:stats()
      assert.equal(keys(sa), keys(so))
      assert.equal(keys(sa.limits), keys(so.limits))
      for k, v in pairs(sa) do
        if type(v) ~= "table" and k ~= "created" then assert.equal(v, so[k], k) end
      end
      local n1, k1 = a:key_stats(ka)
      local n2, k2 = o:key_stats(ka)
      assert.equal(n1, n2)
      assert.same(k1, k2)
      local m1, m2 = a:member_stats(a:row()), o:member_stats(a:row())
      assert.equal(keys(m1), keys(m2))
      assert.equal(m1.pid, m2.pid)
      assert.equal(m1.live, m2.live)
      assert.same({ F.strerror(-3) }, { other.strerror(-3) })
      a:close()
      o:close()
    end)
  end)
end
