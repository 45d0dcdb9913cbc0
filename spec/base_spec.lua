-- clientpool.base: what every file of the driver shares: the backend's
-- choice, the Pool and Lease metatables the files fill, key names for
-- hooks, listener emit, errors at the user's line, yieldable hooks.

local clientpool = require "clientpool"
local base = require "clientpool.base"
local Loop = require "clientpool.loop"

local function vloop() return Loop.new { clock = "virtual" } end

describe("clientpool.base", function()
  it("chooses the backend the pools use by default", function()
    assert.equal(base.BACKEND, clientpool.backend)
    assert.is_truthy(base.BACKEND == "core" or base.BACKEND == "ffi")
    assert.equal(require("clientpool." .. base.BACKEND), base.core)
    local _, err = base.load_backend("c")
    assert.equal("must be \"core\" or \"ffi\"", err)
  end)

  it("holds the Pool and Lease metatables, with every concept's methods", function()
    assert.equal(base.Pool, clientpool.Pool)
    assert.equal(base.Lease, clientpool.Lease)
    for _, m in ipairs { "acquire", "try_acquire", "with", "checkout", "checkin", "stats", "on", "off", "close",
                         "drain", "cancel_active", "pause", "resume", "retire", "run" } do
      assert.is_function(clientpool.Pool[m], m)
    end
    for _, m in ipairs { "release", "destroy", "observe", "cancelled", "on_cancel", "__close", "__tostring" } do
      assert.is_function(clientpool.Lease[m], m)
    end
  end)

  it("gives hooks and listeners nil for the default key, the name for the others", function()
    assert.is_nil(base.hook_key(base.DEFAULT))
    assert.equal("k", base.hook_key("k"))
    local sched = vloop()
    local keys = {}
    local pool = clientpool.new { create = function(key) keys[#keys + 1] = key or "nil"; return {} end,
                                  max_live = 2, scheduler = sched }
    pool:on("acquire", function(key) keys[#keys + 1] = "acquire " .. tostring(key) end)
    assert(pool:acquire()):release()
    assert(pool:acquire("k")):release()
    assert.same({ "nil", "acquire nil", "k", "acquire k" }, keys)
  end)

  it("emit: a listener that raises is logged and the next one still runs", function()
    local logs, got = {}, {}
    local sched = setmetatable({ log = function(m) logs[#logs + 1] = m end }, { __index = vloop() })
    local pool = clientpool.new { create = function() return {} end, max_live = 1, scheduler = sched }
    pool:on("release", function() error("listener boom") end)
    pool:on("release", function() got[#got + 1] = "second" end)
    assert(pool:acquire()):release()
    assert.same({ "second" }, got)
    assert.equal(1, #logs)
    assert.truthy(logs[1]:find("listener for 'release' failed", 1, true), logs[1])
  end)

  it("errors raised deep in the driver point at the user's line", function()
    local pool = clientpool.new { create = function() return {} end, max_live = 1, scheduler = vloop() }
    local held = assert(pool:acquire())
    local line = debug.getinfo(1, "l").currentline + 1
    local ok, err = pcall(function() local l = pool:acquire(); return l end)   -- would wait
    assert.is_false(ok)
    assert.truthy(tostring(err):find("base_spec.lua:" .. line .. ": clientpool: acquire would wait", 1, true),
                  tostring(err))
    held:release()
  end)

  it("lets hooks yield (ycall), on every Lua", function()
    local sched = vloop()
    local got
    local pool = clientpool.new { create = function() sched.sleep(1); return { id = 1 } end,
                                  max_live = 1, scheduler = sched }
    sched.spawn(function()
      local l = assert(pool:acquire())
      got = { l.client.id, sched.now() }
      l:release()
    end)
    sched.run()
    assert.same({ 1, 1 }, got)
    local ok, a, b = base.ycall(function(x, y) return x + y, "two" end, 1, 2)
    assert.same({ true, 3, "two" }, { ok, a, b })
  end)
end)

-- Time per turn (base.turn_of, the scheduler core's turn_clock;
-- docs/performance.md "Time per turn"): inside a turn of its scheduler an
-- acquisition's first engine call takes the time the turn began with (a
-- release still reads the clock), so a pair reads the clock once, not
-- twice; outside any turn every call reads it. A clock function here counts the reads and
-- moves only when the spec moves it (no timers: nothing waits on it).
describe("clientpool.base: time per turn", function()
  local function counted()
    local c = { t = 0, reads = 0 }
    c.loop = Loop.new { clock = function() c.reads = c.reads + 1; return c.t end }
    return c
  end

  it("reads the clock for releases only, not for acquisitions, inside the loop", function()
    local c = counted()
    local pool = clientpool.new { max_live = 2, create = function() return {} end, scheduler = c.loop }
    local during
    c.loop.spawn(function()
      assert(pool:acquire()):release()          -- the client exists
      local before = c.reads
      for _ = 1, 50 do
        assert(pool:acquire()):release()
        assert(pool:try_acquire()):release()
        local _, h = pool:checkout()
        pool:checkin(h)
      end
      during = c.reads - before
    end)
    c.loop.run()
    assert.is_true(during <= 150, "reads: " .. during)   -- 150 pairs: one read each, for the release
    pool:close()
  end)

  it("the hosted form (luv, copas) publishes its turn's time too", function()
    local hosted = require "clientpool.sched.hosted"
    local c = { t = 0, reads = 0 }
    local function now() c.reads = c.reads + 1; return c.t end
    local q = hosted.new { now = now }
    local A = hosted.adapt({ name = "hosted test", now = now }, q)
    assert.equal(q.turn_clock, A.turn_clock)
    local pool = clientpool.new { max_live = 2, create = function() return {} end, scheduler = A }
    local during
    A.spawn(function()
      assert(pool:acquire()):release()
      local before = c.reads
      for _ = 1, 20 do assert(pool:acquire()):release() end
      during = c.reads - before
    end)
    while q.busy() do
      local err = q.turn()
      if err ~= nil then error(err, 0) end
    end
    assert.is_true(during <= 20, "reads: " .. during)    -- 20 pairs: one read each, for the release
    assert.is_false(A.turn_clock.now)      -- between turns
    pool:close()
  end)

  it("reads the clock for each call outside any turn (a plain script)", function()
    local c = counted()
    local pool = clientpool.new { max_live = 2, create = function() return {} end, scheduler = c.loop }
    assert(pool:acquire()):release()
    local before = c.reads
    for _ = 1, 10 do assert(pool:acquire()):release() end
    assert.is_true(c.reads - before >= 20, "reads: " .. (c.reads - before))
    pool:close()
  end)

  it("never skips a validate because of it (validate_after_idle)", function()
    local c = counted()
    local validated = 0
    local pool = clientpool.new { max_live = 1, create = function() return {} end, scheduler = c.loop,
                                  validate = function() validated = validated + 1; return true end,
                                  validate_after_idle = 1 }
    c.loop.spawn(function()
      assert(pool:acquire()):release()
      c.t = 5                  -- within the same turn: the client sat idle 5 s
      assert(pool:acquire()):release()
    end)
    c.loop.run()
    assert.equal(1, validated)
    pool:close()
  end)

  it("is not used with leak_threshold, nor with validate_after_idle and a validate hook", function()
    local c = counted()
    local function pool_with(o)
      o.create, o.scheduler, o.max_live = function() return {} end, c.loop, 1
      return clientpool.new(o)
    end
    local p = pool_with {}
    assert.equal(c.loop.turn_clock, rawget(p, "_turn"))
    p:configure { leak_threshold = 10 }
    assert.is_nil(rawget(p, "_turn"))
    p:configure { leak_threshold = false }
    assert.equal(c.loop.turn_clock, rawget(p, "_turn"))
    p:close()
    p = pool_with { validate = function() return true end, validate_after_idle = 1 }
    assert.is_nil(rawget(p, "_turn"))
    p:close()
    p = pool_with { validate_after_idle = 1 }     -- no validate hook: nothing to skip
    assert.equal(c.loop.turn_clock, rawget(p, "_turn"))
    p:close()
  end)

  it("keeps no idle client past idle_timeout: a later turn's time expires it", function()
    local c = counted()
    local made = 0
    local pool = clientpool.new { max_live = 1, idle_timeout = 1, scheduler = c.loop,
                                  create = function() made = made + 1; return { id = made } end }
    local first, second
    c.loop.spawn(function()
      local l = assert(pool:acquire())
      first = l.client.id
      l:release()
      c.t = 2                  -- the next turn begins past the idle timeout
      c.loop.sleep(0)
      l = assert(pool:acquire())
      second = l.client.id
      l:release()
    end)
    c.loop.run()
    assert.equal(1, first)
    assert.equal(2, second)
    pool:close()
  end)
end)
