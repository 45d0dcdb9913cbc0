-- clientpool.events: the event pump, the handler table the driver's files
-- fill (one handler per engine event they own), and the pool's timer task.

local clientpool = require "clientpool"
local base = require "clientpool.base"
local events = require "clientpool.events"
local Loop = require "clientpool.loop"

local core = base.core

describe("clientpool.events", function()
  it("has a handler for every engine event the driver acts on once it is loaded", function()
    for _, ev in ipairs { "EV_WAKE", "EV_DESTROY", "EV_TIMER", "EV_KEY_FREE", "EV_LEAK", "EV_REFILL", "EV_LOST" } do
      assert.is_function(events.on[core[ev]], ev)
    end
    -- EV_CREATED is the engine's own news: nothing to carry out
    assert.is_nil(events.on[core.EV_CREATED])
  end)

  it("dispatches each event to its handler, in order; one without a handler is passed over", function()
    local sched = Loop.new { clock = "virtual" }
    local pool = clientpool.new { create = function() return {} end, destroy = function() end,
                                  max_live = 1, max_idle = 0, scheduler = sched }
    local seen = {}
    local destroy = events.on[core.EV_DESTROY]
    events.on[core.EV_CREATED] = function(self, _, a) seen[#seen + 1] = { "created", self == pool, a } end
    events.on[core.EV_DESTROY] = function(self, ...)
      seen[#seen + 1] = { "destroy", self == pool }
      return destroy(self, ...)
    end
    local ok, err = pcall(function()
      local l = assert(pool:acquire())
      l:release()                  -- max_idle 0: destroyed
    end)
    events.on[core.EV_CREATED] = nil
    events.on[core.EV_DESTROY] = destroy
    assert(ok, err)
    assert.equal(2, #seen)
    assert.same({ "created", true }, { seen[1][1], seen[1][2] })
    assert.same({ "destroy", true }, seen[2])
    assert.equal(1, pool:stats().closed_by.max_idle)
    events.pump(pool)              -- nothing queued: a no-op
  end)

  it("the pool's timer retires an idle client at idle_timeout, with no acquire to look", function()
    local sched = Loop.new { clock = "virtual" }
    local pool = clientpool.new { create = function() return {} end, max_live = 1, idle_timeout = 2,
                                  scheduler = sched }
    sched.spawn(function()
      assert(pool:acquire()):release()
      sched.sleep(3)
    end)
    sched.run()
    local s = pool:stats()
    assert.equal(1, s.closed_by.idle)
    assert.equal(0, s.live)
  end)

  it("wake_drainers wakes drain() once no lease is held", function()
    local sched = Loop.new { clock = "virtual" }
    local pool = clientpool.new { create = function() return {} end, max_live = 1, scheduler = sched }
    local r = {}
    local held = assert(pool:acquire())
    sched.spawn(function() r.ok = pool:drain(); r.at = sched.now() end)
    sched.spawn(function() sched.sleep(1); held:release() end)
    sched.run()
    assert.same({ ok = true, at = 1 }, r)
  end)
end)
