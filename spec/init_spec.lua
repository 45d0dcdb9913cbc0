-- clientpool (init.lua): the public surface, and the rule that holds the
-- driver's files together: a file never requires one above it (docs/design.md
-- "Layers").

local clientpool = require "clientpool"

-- The driver's files, lowest first (init.lua's header).
local LAYERS = { "base", "options", "token", "events", "keys", "leak", "stats", "floor", "keepalive", "lease",
                 "admission", "drain", "acquire", "checkout", "configure", "init" }

local function read(path)
  local f = assert(io.open(path, "r"))
  local s = f:read("*a")
  f:close()
  return s
end

describe("clientpool", function()
  it("exports new, token, codes, backend, Pool, Lease, policy and _VERSION", function()
    assert.is_function(clientpool.new)
    assert.is_function(clientpool.token)
    assert.is_table(clientpool.codes)
    assert.is_string(clientpool.backend)
    assert.is_table(clientpool.Pool)
    assert.is_table(clientpool.Lease)
    assert.equal(require "clientpool.policy", clientpool.policy)
    assert.is_string(clientpool._VERSION)
  end)

  it("names its outcome codes once, as the stable strings", function()
    assert.same({ timeout = "timeout", full = "full", closed = "closed", cancelled = "cancelled",
                  create = "create", paused = "paused" }, clientpool.codes)
  end)

  it("new() performs no I/O: no hook runs until an acquisition", function()
    local calls = 0
    local pool = clientpool.new { create = function() calls = calls + 1; return {} end, max_live = 2,
                                  scheduler = require("clientpool.loop").new { clock = "virtual" } }
    assert.equal(0, calls)
    assert.equal(0, pool:stats().live)
  end)

  it("a file of the driver requires only files below it", function()
    local rank = {}
    for i, name in ipairs(LAYERS) do rank[name] = i end
    for _, name in ipairs(LAYERS) do
      local text = read("lua/clientpool/" .. name .. ".lua")
      for dep in text:gmatch("require%s*%(?%s*[\"']clientpool%.([%w_]+)[\"']") do
        if rank[dep] then
          assert.is_true(rank[dep] < rank[name], name .. ".lua requires " .. dep .. ".lua, which is above it")
        end
      end
    end
  end)

  it("every file of the driver opens with one comment saying what it owns", function()
    for _, name in ipairs(LAYERS) do
      local text = read("lua/clientpool/" .. name .. ".lua")
      assert.truthy(text:find("^%-%-%- clientpool"), name .. ".lua has no opening comment")
    end
  end)

  -- Listeners (DESIGN section 3 "Statistics": events create_failed and
  -- full, pool:off; issue 12 "Events and listeners").
  describe("listeners", function()
    local loop = require "clientpool.loop"

    it("off removes a listener; an emit under way calls the listeners it started with", function()
      local pool = clientpool.new { create = function() return {} end, max_live = 1 }
      local got = {}
      local function a() got[#got + 1] = "a" end
      local b
      b = function() got[#got + 1] = "b"; pool:off("release", b) end   -- removes itself
      local function c() got[#got + 1] = "c" end
      assert.equal(pool, pool:on("release", a))
      pool:on("release", b):on("release", c):on("release", a)
      assert(pool:acquire()):release()
      assert.same({ "a", "b", "c", "a" }, got)
      got = {}
      assert.equal(pool, pool:off("release", a))   -- every registration of a
      assert(pool:acquire()):release()
      assert.same({ "c" }, got)
      pool:off("release", c)
      pool:off("release", c)                        -- not registered: a no-op
      pool:off("acquire", c)                        -- no listener at all: a no-op
      got = {}
      assert(pool:acquire()):release()
      assert.same({}, got)
      assert.is_nil(pool._on.release)               -- none left: the fast paths see no listener
    end)

    it("create_failed fires with the key and create's error, for acquire and the warm floor", function()
      local sched = loop.new { clock = "virtual" }
      local fails = {}
      local pool = clientpool.new { create = function(key) return nil, "refused " .. tostring(key) end,
                                    max_live = 2, min_idle = 1, keys = { "warm" }, restarts = 0,
                                    scheduler = setmetatable({ log = function() end }, { __index = sched }) }
      pool:on("create_failed", function(key, err) fails[#fails + 1] = { key = key, err = err } end)
      sched.spawn(function()
        local l, code, err = pool:acquire()
        assert.is_nil(l)
        assert.equal("create", code)
        assert.equal("refused nil", err)
        assert.is_nil((pool:acquire("k")))
        sched.spawn(function() pool:run() end)
        sched.sleep(0.01)
        local s = pool:stats()
        assert.equal(3, s.create_failed)
        assert.equal(1, s.keys.warm.create_failed)
        assert.equal(1, s.keys.k.create_failed)       -- (kept while it backs off)
        pool:close()
      end)
      sched.run()
      assert.same({ { key = nil, err = "refused nil" }, { key = "k", err = "refused k" },
                    { key = "warm", err = "refused warm" } }, fails)
    end)

    it("full fires with the key and the detail the caller gets (max_waiting, max_keys)", function()
      local sched = loop.new { clock = "virtual" }
      local fulls = {}
      local pool = clientpool.new { create = function() return {} end, max_live = 1, max_waiting = 1,
                                    max_keys = 1, scheduler = sched }
      pool:on("full", function(key, d) fulls[#fulls + 1] = { key = key, d = d } end)
      sched.spawn(function()
        local held = assert(pool:acquire("a"))
        sched.spawn(function() pool:acquire("a", { timeout = 1 }) end)
        sched.sleep(0.1)
        local l, code, d = pool:acquire("a", { timeout = 1 })
        assert.is_nil(l)
        assert.equal("full", code)
        assert.equal(d, fulls[1].d)
        local l2, code2, d2 = pool:acquire("b")          -- max_keys: a second key cannot exist
        assert.is_nil(l2)
        assert.equal("full", code2)
        assert.equal(d2, fulls[2].d)
        held:release()
      end)
      sched.run()
      assert.equal(2, #fulls)
      assert.equal("a", fulls[1].key)
      assert.equal("full", fulls[1].d.reason)
      assert.equal(1, fulls[1].d.waiting)
      assert.equal("b", fulls[2].key)
      assert.equal("max_keys", fulls[2].d.reason)
      assert.equal(1, pool:stats().rejected)
    end)
  end)
end)
