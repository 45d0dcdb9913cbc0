-- clientpool.sched.loop: the adapter named "loop" is the built-in
-- scheduler's default instance (clientpool.loop), the one a pool made
-- outside any host uses.

local clientpool = require "clientpool"

describe("clientpool.sched.loop", function()
  it("is clientpool.loop, the same table", function()
    assert.equal(require "clientpool.loop", require "clientpool.sched.loop")
  end)

  it("is what scheduler = \"loop\" and the default (outside any host) resolve to", function()
    local loop = require "clientpool.sched.loop"
    local options = require "clientpool.options"
    assert.equal(loop, options.scheduler("loop"))
    assert.equal(loop, options.scheduler(nil))
    local named = clientpool.new { create = function() return {} end, max_live = 1, scheduler = "loop" }
    local default = clientpool.new { create = function() return {} end, max_live = 1 }
    -- acquisitions of both run on that loop: spawned there, they end when it runs
    local got = {}
    for i, pool in ipairs { named, default } do
      loop.spawn(function()
        local lease = assert(pool:acquire())
        got[i] = true
        lease:release()
      end)
    end
    loop.run()
    assert.same({ true, true }, got)
    named:close(); default:close()
  end)
end)
