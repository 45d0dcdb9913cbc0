-- clientpool.token: cancel tokens (clientpool.token()) and the
-- acquisitions that wait on them.

local clientpool = require "clientpool"
local Loop = require "clientpool.loop"

describe("clientpool.token", function()
  it("is not cancelled until cancel(); a second cancel is a no-op", function()
    local t = clientpool.token()
    assert.is_false(t:cancelled())
    t:cancel()
    assert.is_true(t:cancelled())
    t:cancel()
    assert.is_true(t:cancelled())
  end)

  it("cancel() ends every acquisition waiting on it with cancelled, at once", function()
    local sched = Loop.new { clock = "virtual" }
    local pool = clientpool.new { create = function() return {} end, max_live = 1, scheduler = sched }
    local t = clientpool.token()
    local held = assert(pool:acquire())
    local got = {}
    for i = 1, 2 do
      sched.spawn(function()
        local l, code = pool:acquire(nil, { cancel = t, timeout = 10 })
        got[i] = { l, code, sched.now() }
      end)
    end
    sched.spawn(function() sched.sleep(1); t:cancel() end)
    sched.run()
    assert.same({ { nil, "cancelled", 1 }, { nil, "cancelled", 1 } }, got)
    assert.equal(0, pool:stats().waiting)
    held:release()
  end)

  it("an acquisition given a cancelled token returns cancelled without looking", function()
    local pool = clientpool.new { create = function() return {} end, max_live = 1,
                                  scheduler = Loop.new { clock = "virtual" } }
    local t = clientpool.token()
    t:cancel()
    local l, code = pool:acquire(nil, { cancel = t })
    assert.is_nil(l)
    assert.equal("cancelled", code)
    assert.equal(0, pool:stats().opened)
  end)

  it("its methods need the token as self", function()
    local t = clientpool.token()
    for _, m in ipairs { "cancel", "cancelled" } do
      local ok, err = pcall(t[m])
      assert.is_false(ok)
      assert.truthy(tostring(err):find(m .. " needs the token as self", 1, true), tostring(err))
    end
  end)
end)
