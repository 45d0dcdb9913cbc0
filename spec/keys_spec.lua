-- clientpool.keys: key names and the engine's key ids: the default key,
-- max_keys, forgotten keys opened again, the checks of a scope key.

local clientpool = require "clientpool"
local Loop = require "clientpool.loop"

local function mkpool(o)
  local opts = { create = function() return {} end, max_live = 4, scheduler = Loop.new { clock = "virtual" } }
  for k, v in pairs(o or {}) do opts[k] = v end
  return clientpool.new(opts)
end

describe("clientpool.keys", function()
  it("acquire() without a key uses the default key, listed as '' in stats", function()
    local pool = mkpool()
    local l = assert(pool:acquire())
    assert.equal(1, pool:stats().keys[""].leases)
    l:release()
  end)

  it("a key beyond max_keys is refused as full, with the reason in the detail", function()
    local pool = mkpool { max_keys = 1 }
    local a = assert(pool:acquire("a"))
    local l, code, detail = pool:acquire("b")
    assert.is_nil(l)
    assert.equal("full", code)
    assert.equal("max_keys", detail.reason)
    assert.equal("b", detail.key)
    a:release()
  end)

  it("an empty key is forgotten; its name is opened again at its next use", function()
    local pool = mkpool { max_idle = 0, max_keys = 1 }
    assert(pool:acquire("a")):release()       -- no idle client is kept: "a" is empty
    assert.is_nil(pool:stats().keys.a)
    local b = assert(pool:acquire("b"))       -- its place under max_keys is free again
    b:release()
    assert(pool:acquire("a")):release()
  end)

  it("a key must be a string or nil, in every method that takes one", function()
    local pool = mkpool()
    for _, call in ipairs {
      { "acquire", function() return pool:acquire(1) end },
      { "try_acquire", function() return pool:try_acquire(true) end },
      { "resume", function() return pool:resume(1) end },
      { "retire", function() return pool:retire({}) end },
    } do
      local ok, err = pcall(call[2])
      assert.is_false(ok, call[1])
      assert.truthy(tostring(err):find("bad argument #1 to '" .. call[1] .. "' (key must be a string or nil",
                                       1, true), tostring(err))
    end
  end)

  it("resume and retire of a key the pool does not know open none", function()
    local pool = mkpool { max_keys = 1 }
    pool:resume("never")
    pool:retire("never")
    assert.is_nil(pool:stats().keys.never)
    assert(pool:acquire("a")):release()       -- max_keys still has its place
  end)
end)
