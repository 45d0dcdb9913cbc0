-- clientpool.core (csrc/lclientpool.c) and clientpool.ffi: the engine calls
-- the driver builds on, as the bindings expose them (the engine's own
-- semantics are spec/c/'s). Each scenario runs on the C API binding and,
-- under LuaJIT, on the FFI one.

local backends = { { name = "core", mod = require "clientpool.core" } }
if rawget(_G, "jit") then backends[2] = { name = "ffi", mod = require "clientpool.ffi" } end

local function cfg(over)
  local c = { max_live = 2, max_idle = 2, max_concurrency = 4, max_waiting = 4, seed = 1 }
  for k, v in pairs(over or {}) do c[k] = v end
  return c
end

-- drains the events: { type, a, b, c, t } each
local function drain(e)
  local evs = {}
  while true do
    local t, a, b, c, tt = e:next_event()
    if not t then return evs end
    evs[#evs + 1] = { t, a, b, c, tt }
  end
end

local function find(evs, t)
  for _, ev in ipairs(evs) do if ev[1] == t then return ev end end
end

for _, B in ipairs(backends) do
  local core = B.mod
  describe("engine binding (" .. B.name .. ")", function()
    it("destroyed: a record counts (closing) until its destroy is reported", function()
      local e = core.new(cfg { max_live = 1, max_idle = 1 })
      local k = e:key_open()
      e:key_pin(k, true)
      local st, rec, l, g = e:acquire(k, 1)
      assert.equal(core.GRANT_CREATE, st)
      assert.is_true((e:created(rec, true, 1)))
      assert.is_true((e:release(l, g, core.BY.error, 1)))
      local ev = find(drain(e), core.EV_DESTROY)
      assert.equal(rec, ev[2])
      local s = e:stats(-1, {})
      assert.equal(1, s.closing)
      assert.equal(0, s.live)
      assert.equal(1, e:stats(k, {}).closing)
      assert.equal(core.MUST_WAIT, (e:acquire(k, 2)))
      local ok, pending = e:destroyed(rec, 2)
      assert.is_true(ok)
      assert.is_number(pending)
      assert.is_false((e:destroyed(rec, 2)))      -- once per EV_DESTROY
      assert.equal(0, e:stats(-1, {}).closing)
      assert.equal(core.GRANT_CREATE, (e:acquire(k, 2)))
      e:free()
    end)

    it("create backoff: BACKOFF while the window is open", function()
      local e = core.new(cfg { create_backoff = 1, create_backoff_max = 2 })
      local k = e:key_open()
      local _, rec = e:acquire(k, 1)
      e:created(rec, false, 1)
      assert.equal(1, e:stats(k, {}).create_failed)
      assert.equal(core.BACKOFF, (e:acquire(k, 1.1)))
      local d = e:next_deadline()
      assert.is_true(d >= 1.5 and d <= 2)
      e:tick(d)
      assert.equal(core.GRANT_CREATE, (e:acquire(k, d)))
      e:free()
    end)

    it("wait with a priority: the higher first, arrival order within one", function()
      local e = core.new(cfg { max_live = 1, max_idle = 1 })
      local k = e:key_open()
      local _, rec, l, g = e:acquire(k, 1)
      e:created(rec, true, 1)
      local ws = {}
      for i, prio in ipairs { 0, 1, 0, 2 } do
        local w, wg = e:wait(k, -1, 1, prio)
        ws[i] = { w, wg }
      end
      local order = {}
      for _ = 1, 4 do
        e:release(l, g, -1, 2)
        for _, ev in ipairs(drain(e)) do
          if ev[1] == core.EV_WAKE then
            for i, w in ipairs(ws) do
              if w[1] == ev[2] and w[2] == ev[3] then
                order[#order + 1] = i
                local st, _
                st, _, l, g = e:claim(w[1], w[2], 2)
                assert.equal(core.GRANT_IDLE, st)
              end
            end
          end
        end
      end
      assert.same({ 4, 2, 1, 3 }, order)
      e:free()
    end)

    it("keepalive: EV_KEEPALIVE at the exact time, keepalive_done back or destroyed", function()
      local e = core.new(cfg { keepalive = 5 })
      local k = e:key_open()
      e:key_pin(k, true)
      local _, rec, l, g = e:acquire(k, 0)
      e:created(rec, true, 0)
      e:release(l, g, -1, 1)
      drain(e)
      assert.equal(6, e:next_deadline())
      e:tick(6)
      local ev = find(drain(e), core.EV_KEEPALIVE)
      assert.equal(rec, ev[2])
      assert.equal(k, ev[4])
      assert.equal(5, ev[5])                      -- seconds idle
      assert.equal(1, e:stats(-1, {}).keepalive)
      assert.equal(1, e:stats(-1, {}).idle)       -- still idle, not granted
      assert.is_true((e:keepalive_done(rec, true, 7)))
      assert.is_false((e:keepalive_done(rec, true, 7)))
      assert.equal(12, e:next_deadline())
      e:tick(12)
      drain(e)
      assert.is_true((e:keepalive_done(rec, false, 12)))
      ev = find(drain(e), core.EV_DESTROY)
      assert.equal(core.BY.invalid, ev[3])
      assert.equal(1, e:stats(k, {}).keepalive_failed)
      assert.equal(2, core.KEEPALIVE_MAX)
      assert.equal(64, core.PRIORITY_STEP)
      e:free()
    end)

    it("configure and key_caps: changes caps live, refuses what cannot change", function()
      local e = core.new(cfg { max_live = 3, max_idle = 3 })
      local k = e:key_open()
      e:key_pin(k, true)
      local held = {}
      for i = 1, 3 do
        local _, rec, l, g = e:acquire(k, 1)
        e:created(rec, true, 1)
        held[i] = { l, g }
      end
      for i = 1, 3 do e:release(held[i][1], held[i][2], -1, 1 + i) end
      drain(e)
      local ok, code = e:configure(cfg { max_live = 3, max_idle = 3, capacity = 2 }, 5)
      assert.is_false(ok)
      assert.equal(core.EINVAL, code)
      ok, code = e:configure(cfg { max_live = 1, max_idle = 3 }, 5)    -- max_idle > max_live
      assert.is_false(ok)
      assert.equal(core.EINVAL, code)
      assert.equal(0, #drain(e))                  -- nothing changed
      assert.is_true((e:configure(cfg { max_live = 1, max_idle = 1 }, 5)))
      local evs = drain(e)
      local n = 0
      for _, ev in ipairs(evs) do
        if ev[1] == core.EV_DESTROY then
          n = n + 1
          assert.equal(core.BY.resized, ev[3])
          e:destroyed(ev[2], 5)
        end
      end
      assert.equal(2, n)
      assert.equal(2, e:stats(-1, {}).closed_by.resized)
      assert.is_false((e:key_caps(k, 5, -1, 6)))  -- above max_live
      assert.is_true((e:key_caps(k, 0, 0, 6)))
      local ev = find(drain(e), core.EV_DESTROY)
      assert.equal(core.BY.resized, ev[3])
      e:destroyed(ev[2], 6)
      assert.equal(core.MUST_WAIT, (e:acquire(k, 7)))
      assert.is_true((e:key_caps(k, nil, nil, 7)))
      assert.equal(core.GRANT_CREATE, (e:acquire(k, 7)))
      e:close(8)
      ok, code = e:configure(cfg(), 9)
      assert.is_false(ok)
      assert.equal(core.ECLOSED, code)
      e:free()
    end)
  end)
end

-- One leak sentinel per lease slot (C API binding): a released lease's is
-- disarmed in place and armed again for the slot's next lease (issue 17: no
-- sentinel built per lease); one still armed is never shared.
describe("leak sentinels (core)", function()
  local core = require "clientpool.core"
  local function grant(e, k, now)
    local st, rec, l, g, _, _, _, s = e:acquire(k, now, true)
    assert.is_true(st == core.GRANT_CREATE or st == core.GRANT_IDLE)
    if st == core.GRANT_CREATE then assert.is_true((e:created(rec, true, now))) end
    return rec, l, g, s
  end
  local function pool()
    local e = core.new(cfg { max_live = 1, max_idle = 1 })
    local k = e:key_open()
    e:key_pin(k, true)
    return e, k
  end

  it("a released lease's sentinel is disarmed, then guards the slot's next lease", function()
    local e, k = pool()
    local rec, l, g, s = grant(e, k, 1)
    assert.equal("userdata", type(s))
    assert.same({ l, g, rec, k }, { e:guarded(s) })
    assert.is_true((e:release(l, g, -1, 2)))
    assert.equal(0, select("#", e:guarded(s)))   -- released: nothing
    local rec2, l2, g2, s2 = grant(e, k, 3)
    assert.equal(l, l2)
    assert.are_not.equal(g, g2)
    assert.is_true(rawequal(s, s2))               -- the same sentinel, armed again
    assert.same({ l2, g2, rec2, k }, { e:guarded(s2) })
    e:release(l2, g2, -1, 4)
    e:free()
  end)

  it("a lease dropped after its sentinel was reused is reported leaked", function()
    local e, k = pool()
    local _, l, g = grant(e, k, 1)
    e:release(l, g, -1, 2)
    local _, l2, g2, s2 = grant(e, k, 3)
    assert.is_true(e:lease_age(l2, g2, 3) >= 0)
    assert.equal(l2, (e:guarded(s2)))              -- (held until here)
    s2 = nil   -- luacheck: ignore s2
    collectgarbage()
    collectgarbage()
    assert.equal(1, e:stats(-1, {}).leaked)
    assert.is_nil(e:lease_age(l2, g2, 4))         -- the engine took it back
    e:free()
  end)

  it("a sentinel still armed (the lease ended as leaked) is never shared", function()
    local e, k = pool()
    local _, l, g, s = grant(e, k, 1)
    e:leak(l, g, 2)
    for _, ev in ipairs(drain(e)) do if ev[1] == core.EV_DESTROY then e:destroyed(ev[2], 2) end end
    local rec2, l2, g2, s2 = grant(e, k, 3)
    assert.equal(l, l2)
    assert.is_false(rawequal(s, s2))
    assert.same({ l, g }, { e:guarded(s) })       -- its own lease's slot, nothing held
    assert.same({ l2, g2, rec2, k }, { e:guarded(s2) })
    local before = e:stats(-1, {}).leaked
    s = nil   -- luacheck: ignore s
    collectgarbage()
    collectgarbage()
    assert.equal(before, e:stats(-1, {}).leaked)  -- the stale one reports nothing
    assert.is_true(e:lease_age(l2, g2, 4) >= 0)   -- and the new lease is still held
    e:release(l2, g2, -1, 5)
    e:free()
  end)

  it("a disarmed or released sentinel collected reports nothing", function()
    local e, k = pool()
    local _, l, g, s = grant(e, k, 1)
    e:disarm(l, g)
    assert.equal(0, select("#", e:guarded(s)))
    s = nil   -- luacheck: ignore s
    collectgarbage()
    collectgarbage()
    assert.equal(0, e:stats(-1, {}).leaked)
    assert.is_true((e:release(l, g, -1, 2)))
    local _, l2, g2, s2 = grant(e, k, 3)
    e:release(l2, g2, -1, 4)
    assert.equal(0, select("#", e:guarded(s2)))  -- released: disarmed
    s2 = nil   -- luacheck: ignore s2
    collectgarbage()
    collectgarbage()
    assert.equal(0, e:stats(-1, {}).leaked)
    e:free()
  end)
end)
