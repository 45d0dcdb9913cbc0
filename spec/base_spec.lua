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
