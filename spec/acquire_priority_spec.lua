-- clientpool: acquire(key, { priority = n }) (DESIGN section 3 "Operating a
-- live pool", issue 19; docs/api.md "Acquiring"). Among the waiters that can
-- use a freed client a higher priority is served first, arrival order
-- within one priority; the cross-key rule and max_waiting are unchanged,
-- and a waiter is passed over by at most (P - n) x 64 waiters that queued
-- after it (the aging bound: core.PRIORITY_STEP arrivals per step).
--
-- Every scenario runs as a task on each scheduler of H.schedulers { hosts =
-- true }; the order of the grants is the proof, so the clock does not
-- matter.

local clientpool = require "clientpool"
local H = require "spec.helpers"
local errmsg = H.errmsg
local core = require "clientpool.core"

local STEP = core.PRIORITY_STEP

for _, M in ipairs(H.missing_schedulers()) do
  describe("clientpool acquire priorities on " .. M.name, function()
    pending("not run: " .. M.reason)
  end)
end

for _, S in ipairs(H.schedulers { hosts = true }) do
  local function run(body)
    local sched = S.new()
    S.run(sched, body, sched)
  end

  describe("clientpool acquire priorities on " .. S.name, function()
    after_each(function() if S.finish then S.finish() end end)

    -- A pool of one client, held by the scenario; `order` lists the tags
    -- of the waiters in the order they were served (each holds the client
    -- for a turn, then releases it).
    local function contended(sched, o)
      local opts = { create = function() return {} end, max_live = 1, max_waiting = 10000, scheduler = sched }
      for k, v in pairs(o or {}) do opts[k] = v end
      local pool = clientpool.new(opts)
      local held = assert(pool:acquire())
      local order, n = {}, 0
      local function queue(tag, priority, key)
        n = n + 1
        sched.spawn(function()
          local l = assert(pool:acquire(key, { priority = priority, timeout = 1e6 }))
          order[#order + 1] = tag
          sched.sleep(0)
          l:release()
        end)
      end
      local function serve(count)
        sched.sleep(0)                       -- every waiter queued
        assert.equal(n, pool:stats().waiting)
        held:release()
        while #order < count do sched.sleep(0) end
      end
      return pool, queue, serve, order
    end

    it("serves a higher priority first, arrival order within one", function()
      run(function(sched)
        local pool, queue, serve, order = contended(sched)
        queue("low1", 0); queue("high1", 1); queue("low2"); queue("high2", 1); queue("top", 5); queue("neg", -1)
        queue("low3", 0)
        serve(7)
        assert.same({ "top", "high1", "high2", "low1", "low2", "low3", "neg" }, order)
        pool:close()
      end)
    end)

    it("ages: a low waiter is passed over by at most (P - n) x PRIORITY_STEP later waiters", function()
      run(function(sched)
        assert.equal(64, STEP)
        local pool, queue, serve, order = contended(sched)
        queue("low", 0)
        for i = 1, 2 * STEP do queue("high" .. i, 1) end
        serve(2 * STEP + 1)
        -- 63 high waiters that came after it go first; the 64th arrived a full step later: the
        -- low one is served before it
        assert.equal("low", order[STEP])
        for i = 1, STEP - 1 do assert.equal("high" .. i, order[i]) end
        assert.equal("high" .. STEP, order[STEP + 1])
        pool:close()
      end)
    end)

    it("ages by the priority difference: two steps wait twice as long", function()
      run(function(sched)
        local pool, queue, serve, order = contended(sched)
        queue("low", 0)
        for i = 1, 3 * STEP do queue("high" .. i, 2) end
        serve(3 * STEP + 1)
        assert.equal("low", order[2 * STEP])
        pool:close()
      end)
    end)

    it("keeps the cross-key rule: a priority waiter of a key that cannot use the client does not hold others up",
      function()
      run(function(sched)
        local pool = clientpool.new { create = function() return {} end, max_live = 2, per_key = { max_live = 1 },
                                      scheduler = sched }
        local a = assert(pool:acquire("a"))
        local b = assert(pool:acquire("b"))
        local order = {}
        sched.spawn(function()
          local l = assert(pool:acquire("a", { priority = 9, timeout = 1e6 }))
          order[#order + 1] = "a9"
          l:release()
        end)
        sched.spawn(function()
          local l = assert(pool:acquire("b", { priority = 0, timeout = 1e6 }))
          order[#order + 1] = "b0"
          l:release()
        end)
        sched.sleep(0)
        b:release()                                -- only b's waiter can use it (a is at its cap)
        for _ = 1, 4 do sched.sleep(0) end
        assert.same({ "b0" }, order)
        a:release()
        for _ = 1, 4 do sched.sleep(0) end
        assert.same({ "b0", "a9" }, order)
        pool:close()
      end)
    end)

    it("keeps max_waiting: a high priority is refused when the queue is full", function()
      run(function(sched)
        local pool = clientpool.new { create = function() return {} end, max_live = 1, max_waiting = 1,
                                      scheduler = sched }
        local held = assert(pool:acquire())
        local w
        sched.spawn(function() w = { pool:acquire(nil, { timeout = 1e6 }) } end)
        sched.sleep(0)
        local lease, code = pool:acquire(nil, { priority = 100 })
        assert.is_nil(lease)
        assert.equal("full", code)
        held:release()
        for _ = 1, 4 do sched.sleep(0) end
        assert.truthy(w[1])
        w[1]:release()
        pool:close()
      end)
    end)
  end)
end

-- (found reading the merges on main at be41697: the retry of an
-- acquisition whose granted client failed validate with nothing free, or
-- paused, copied its options by name without the priority live19 added,
-- and the caller queued again at priority 0)
describe("clientpool acquire priorities: a retry", function()
  it("keeps its priority after its client failed validate and it queues again", function()
    local sched = require("clientpool.loop").new { clock = "virtual" }
    local order = {}
    sched.spawn(function()
      local pool
      local fail_once = true
      pool = clientpool.new {
        create = function() return {} end, max_live = 1, scheduler = sched,
        validate = function()
          if not fail_once then return true end
          fail_once = false
          pool:pause("upstream")          -- paused meanwhile: the caller queues anew, like anyone
          return false
        end }
      local held = assert(pool:acquire())
      local function queue(tag, priority)
        sched.spawn(function()
          local l = assert(pool:acquire(nil, { priority = priority, timeout = 1e6 }))
          order[#order + 1] = tag
          sched.sleep(0)
          l:release()
        end)
      end
      queue("low", 0)
      queue("high", 5)
      sched.sleep(0)
      assert.equal(2, pool:stats().waiting)
      held:release()                      -- to "high"; its validate fails; it queues again
      sched.sleep(0)
      sched.sleep(0)
      assert.equal(2, pool:stats().waiting)
      pool:resume()
      for _ = 1, 6 do sched.sleep(0) end
      assert.same({ "high", "low" }, order)
      pool:close()
    end)
    sched.run()
    assert.same({ "high", "low" }, order)
  end)
end)

describe("clientpool acquire priorities: bad input", function()
  it("raises naming the option for a priority that is not an int32", function()
    local pool = clientpool.new { create = function() return {} end, max_live = 1 }
    for _, bad in ipairs { 1.5, "1", true, 0 / 0, math.huge, -math.huge, 2 ^ 31, -2 ^ 31 - 1 } do
      local msg = errmsg(function() local l = pool:acquire(nil, { priority = bad }); return l end)
      assert.truthy(msg:find("acquire_priority_spec%.lua:%d+: clientpool: bad argument #2 to 'acquire' " ..
                             "%(opts%.priority must be an integer in %[%-2%^31, 2%^31%), got "), msg)
    end
    local l = assert(pool:acquire(nil, { priority = 2 ^ 31 - 1 }))   -- the extremes are priorities
    l:release()
    l = assert(pool:acquire(nil, { priority = -2 ^ 31 }))
    l:release()
    assert.truthy(errmsg(function() local x = pool:acquire(nil, { prio = 1 }); return x end)
                  :find("the options are timeout, cancel, on_drain and priority", 1, true))
    pool:close()
  end)
end)
