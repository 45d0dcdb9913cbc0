-- clientpool.sched.hosted: the scheduler core in the form a host pumps
-- (luv's timer and copas' step do; a game server's tick loop would). The
-- adapter contract on a tick-loop host built here on it, then what the
-- form gives its host: turn(), ready(), deadline(), busy(), fgwork(),
-- moving(), changed, and the hosted yield protocol.

local hosted = require "clientpool.sched.hosted"
local core = require "clientpool.core"
local clientpool = require "clientpool"
local contract = require "spec.sched_contract"

local it_close = coroutine.close and it or pending -- Lua 5.4
local unpack = table.unpack or unpack -- luacheck: ignore 143

-- A host of the hosted form, as a game server's tick loop is: each tick
-- runs a turn; when nothing is ready, the process sleeps until the next
-- deadline. run() returns when no foreground work is left.
local function tick_host(now, sleep)
  now = now or core.monotime
  sleep = sleep or core.sleep
  local q = hosted.new { now = now, name = "tick" }
  local A = hosted.adapt({ monotonic = now == core.monotime, now = now }, q)
  function A.run()
    while true do
      local err = q.turn()
      if err ~= nil then error(err, 0) end
      if not q.busy() then return end
      if q.ready() == 0 then
        local d = q.deadline()
        if d == nil then error("tick: deadlock: tasks wait and nothing is left to wake them", 2) end
        local s = d - now()
        if s > 0 then sleep(s) end
      end
    end
  end
  A.q = q
  return A
end

-- A clock the spec moves by hand.
local function manual_clock()
  local c = { t = 0 }
  function c.now() return c.t end
  return c
end

describe("clientpool.sched.hosted", function()
  describe("on a tick-loop host (real clock)", function()
    local S = {
      name = "tick (real clock)", scale = 0.01, real = true,
      new = function() return tick_host() end,
      run = function(sched, fn, ...)
        local args = { n = select("#", ...), ... }
        sched.spawn(function() fn(unpack(args, 1, args.n)) end)
        sched.run()
      end,
      finish = function() end,
    }
    contract(S, { describe = describe, it = it, after_each = after_each, assert = assert })
  end)

  describe("new", function()
    it("needs a clock", function()
      local ok, err = pcall(hosted.new, {})
      assert.is_false(ok)
      assert.truthy(tostring(err):find("clientpool.sched.hosted: new expects { now = function }", 1, true))
      assert.is_false((pcall(hosted.new)))
    end)

    it("is no scheduler a pool finds by name", function()
      for _, name in ipairs { "hosted", "core" } do
        local ok, err = pcall(clientpool.new, { create = function() return {} end, max_live = 1, scheduler = name })
        assert.is_false(ok)
        assert.truthy(tostring(err):find("no scheduler named '" .. name .. "'", 1, true), tostring(err))
      end
    end)

    it("adapt() hands on the adapter functions and a log", function()
      local q = hosted.new { now = manual_clock().now }
      local A = hosted.adapt({}, q)
      for _, f in ipairs { "current", "wait", "wake", "spawn", "background", "sleep", "stats" } do
        assert.equal(q[f], A[f], f)
      end
      assert.is_function(A.log)
    end)
  end)

  describe("what the host drives", function()
    it("turn() runs what was ready when it began; what it makes ready runs next turn", function()
      local q = hosted.new { now = manual_clock().now }
      local log = {}
      q.spawn(function()
        log[#log + 1] = "a"
        q.spawn(function() log[#log + 1] = "c" end)
      end)
      q.spawn(function() log[#log + 1] = "b" end)
      assert.equal(2, q.ready())
      assert.is_nil(q.turn())
      assert.same({ "a", "b" }, log)
      assert.equal(1, q.ready())
      q.turn()
      assert.same({ "a", "b", "c" }, log)
      assert.equal(0, q.ready())
      assert.is_false(q.busy())
    end)

    it("turn() fires one due timer a turn, the earliest first", function()
      local c = manual_clock()
      local q = hosted.new { now = c.now }
      local log = {}
      q.spawn(function() q.sleep(2); log[#log + 1] = 2 end)
      q.spawn(function() q.sleep(1); log[#log + 1] = 1 end)
      q.turn()
      assert.equal(1, q.deadline())
      assert.is_true(q.fgwork())
      c.t = 5                       -- both due: they fire in deadline order
      q.turn()
      assert.same({ 1 }, log)
      q.turn()
      assert.same({ 1, 2 }, log)
      assert.is_nil(q.deadline())
      assert.is_false(q.busy())
    end)

    it("changed() is called for work made outside a turn, not inside one", function()
      local calls = 0
      local c = manual_clock()
      local q = hosted.new { now = c.now, changed = function() calls = calls + 1 end }
      q.spawn(function() q.sleep(1) end)      -- ready: outside a turn
      assert.equal(1, calls)
      q.turn()                                  -- its timer is set inside the turn
      assert.equal(1, calls)
      q.spawn(function() end)
      assert.equal(2, calls)
    end)

    it("a background task keeps no foreground work alive", function()
      local q = hosted.new { now = manual_clock().now }
      q.background(function() q.sleep(10) end)
      q.turn()
      assert.equal(10, q.deadline())
      assert.is_false(q.busy())
      assert.is_false(q.fgwork())
    end)

    it("moving() is false once every task waits with nothing to wake it", function()
      local q = hosted.new { now = manual_clock().now }
      local h
      q.spawn(function()
        h = q.current()
        q.wait(h)
      end)
      assert.is_true(q.moving())
      q.turn()
      assert.is_true(q.busy())
      assert.is_false(q.moving())
      q.wake(h)
      assert.is_true(q.moving())
      q.turn()
      assert.is_false(q.busy())
    end)

    it("a task that yields to a host queue (insert/push) is handed to it", function()
      local q = hosted.new { now = manual_clock().now }
      local got = {}
      local hostq = {
        insert = function(_, x) got.inserted = x end,
        push = function(_, x, co) got.pushed, got.co = x, co end,
      }
      local task = q.spawn(function()
        coroutine.yield("socket", hostq)
        got.back = true
      end)
      q.turn()
      assert.equal("socket", got.inserted)
      assert.equal("socket", got.pushed)
      assert.equal(task, got.co)
      assert.is_true(q.moving())              -- away: the host resumes it
      assert.is_true(coroutine.resume(task))  -- as copas would
      assert.is_true(got.back)
      assert.is_false(q.busy())
    end)

    it("a task that yields anything else is left alone until its resumer comes", function()
      local q = hosted.new { now = manual_clock().now }
      local done = false
      local task = q.spawn(function()
        coroutine.yield("a luv callback resumes me")
        done = true
      end)
      q.turn()
      assert.equal(0, q.ready())
      assert.is_true(q.moving())
      coroutine.resume(task)
      assert.is_true(done)
    end)

    it_close("a wake whose pass-through task was closed gives its grant back (lost-wake callback)", function()
      local q = hosted.new { now = manual_clock().now }
      local inner
      -- the task runs a nested coroutine whose wait passes through it
      local task = q.spawn(function()
        local co = coroutine.create(function()
          inner = coroutine.running()
          q.wait(inner)
        end)
        local ok, a, b = coroutine.resume(co)
        while ok and coroutine.status(co) == "suspended" do
          ok, a, b = coroutine.resume(co, coroutine.yield(a, b))
        end
      end)
      q.turn()                      -- the nested wait is relayed: the task is its target
      assert.equal("suspended", coroutine.status(inner))
      assert.is_true(coroutine.close(task))
      local lost = {}
      assert.is_true(q.wake(inner, function(a, b, c) lost[#lost + 1] = { a, b, c } end, 1, 2, 3))
      q.turn()                      -- the wake cannot reach the waiter: its grant goes back
      assert.same({ { 1, 2, 3 } }, lost)
      assert.is_false(q.busy())
    end)
  end)

  describe("a pool on it", function()
    it("waits and hands off through the host's turns", function()
      local c = manual_clock()
      local A = tick_host(c.now, function(s) c.t = c.t + s end)
      local pool = clientpool.new { create = function() return {} end, max_live = 1, scheduler = A }
      local got = {}
      A.spawn(function()
        local l = assert(pool:acquire())
        A.sleep(1)
        l:release()
      end)
      A.spawn(function()
        local t0 = A.now()
        local l, code = pool:acquire(nil, { timeout = 5 })
        got.waited, got.lease, got.code = A.now() - t0, l, code
        if l then l:release() end
      end)
      A.run()
      assert.is_table(got.lease, tostring(got.code))
      assert.equal(1, got.waited)
      pool:close()
    end)
  end)
end)
