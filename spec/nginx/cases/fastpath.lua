-- The C API backend's fast path inside OpenResty (eighth session): a
-- checkin that closes its client runs its destroy. Inside OpenResty a
-- destroy's coroutine.resume yields the caller, which LuaJIT cannot do
-- across a C call: there checkin is a Lua wrapper of the C part.
local clientpool = require "clientpool"

describe("the C API backend's fast path in nginx", function()
  it("runs the destroy of a client checked in to be closed", function()
    local made, destroyed = 0, 0
    local pool = clientpool.new {
      backend = "core", max_live = 2, max_lifetime = 0.05,
      create = function() made = made + 1; return { id = made } end,
      destroy = function() destroyed = destroyed + 1 end,
    }
    assert.is_table(pool._fp)                      -- (the fast path is installed)
    local _, h = pool:checkout()
    pool:checkin(h, false)                         -- retired
    assert.are.equal(1, destroyed)
    local c, h2 = pool:checkout()
    assert.are.equal(2, c.id)
    ngx.sleep(0.06)
    pool:checkin(h2)                               -- past max_lifetime
    assert.are.equal(2, destroyed)
    assert.are.equal(0, pool:stats().closing)
    local slow = clientpool.new {
      backend = "core", max_live = 1,
      create = function() return {} end,
      destroy = function() ngx.sleep(0.01); destroyed = destroyed + 10 end,   -- a destroy that yields
    }
    local _, h3 = slow:checkout()
    slow:checkin(h3, false)
    ngx.sleep(0.05)
    assert.are.equal(12, destroyed)
    assert.are.equal(0, slow:stats().closing)
    pool:close()
    slow:close()
  end)
end)
