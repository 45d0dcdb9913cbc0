-- clientpool: an acquisition's deadline bounds the whole acquire (DESIGN.md
-- section 3 "Deadlines", issue 12 finding 3: acquire(key, { timeout = 0.5 })
-- whose create took 5 s returned a lease after 5 s). The deadline (per-call
-- timeout, else acquire_timeout) bounds the wait and the caller's own create
-- and validate: at the deadline the caller gets nil, "timeout", detail; a
-- create still running finishes in the background and its client joins the
-- idle set or serves the next waiter, counted against max_live meanwhile; a
-- validate still running finishes too, and its client is idle again or
-- retired. On the virtual clock, and on the hosts' real clocks where their
-- libraries load.

local clientpool = require "clientpool"
local loop = require "clientpool.loop"
local H = require "spec.helpers"

-- PUC Lua 5.1: hooks run in the caller (docs/decisions.md "Deadlines")
local IS_51 = _VERSION == "Lua 5.1" and rawget(_G, "jit") == nil
local it51 = IS_51 and pending or it

-- (run() re-raises a task's error)
local function run(fn)
  local sched = loop.new { clock = "virtual" }
  sched.spawn(fn, sched)
  sched.run()
  return sched
end

-- Hooks that count clients open (create increments when it returns a
-- client, destroy decrements) and creates in flight; create takes
-- `latency` seconds of sched (0: it does not yield).
local function counting(sched, latency, max_live)
  local c = { open = 0, peak = 0, n = 0, inflight = 0, attempts = 0, over = 0, fail = false }
  function c.create()
    c.attempts = c.attempts + 1
    c.inflight = c.inflight + 1
    if c.open + c.inflight > max_live then c.over = c.over + 1 end
    if latency > 0 then sched.sleep(latency) end
    c.inflight = c.inflight - 1
    if c.fail then return nil, "refused" end
    c.n = c.n + 1
    c.open = c.open + 1
    if c.open > c.peak then c.peak = c.open end
    return { id = c.n }
  end
  function c.destroy()
    c.open = c.open - 1
  end
  return c
end

describe("clientpool deadlines over the whole acquire", function()
  it51("a create slower than the deadline: timeout at the deadline; the client serves the next caller", function()
    run(function(sched)
      local c = counting(sched, 5, 1)
      local pool = clientpool.new { create = c.create, destroy = c.destroy, max_live = 1, scheduler = sched }
      local timeouts, acquires = {}, {}
      pool:on("timeout", function(_, d) timeouts[#timeouts + 1] = d end)
      pool:on("acquire", function(_, _, waited) acquires[#acquires + 1] = waited or 0 end)
      local got = {}
      sched.spawn(function()
        sched.sleep(1)
        local t0 = sched.now()
        local l = assert(pool:acquire(nil, { timeout = 10 }))   -- waits for the create A started
        got.id, got.waited = l.client.id, sched.now() - t0
        l:release()
      end)
      local t0 = sched.now()
      local l, code, detail = pool:acquire(nil, { timeout = 0.5 })
      assert.is_nil(l)
      assert.equal("timeout", code)
      assert.equal(0.5, sched.now() - t0)
      assert.equal(1, detail.creating)                -- still running, counted against max_live
      assert.equal(0.5, detail.waited)
      assert.truthy(tostring(detail):find("timeout after 0.500s", 1, true))
      assert.equal(1, #timeouts)
      local s = pool:stats()
      assert.equal(1, s.creating)
      assert.equal(1, s.timeouts)
      sched.sleep(6)
      assert.equal(1, got.id)                         -- the background create's client
      assert.equal(4, got.waited)                     -- from 1 to 5: when the create finished
      assert.same({ 4 }, acquires)                    -- B's; none for the caller that left
      assert.equal(1, c.attempts)
      assert.equal(0, c.over)
      s = pool:stats()
      assert.equal(1, s.opened)
      assert.equal(1, s.idle)
      assert.equal(0, s.creating)
      pool:close()
      assert.equal(0, c.open)
    end)
  end)

  it51("with nobody waiting, the late client joins the idle set", function()
    run(function(sched)
      local c = counting(sched, 5, 2)
      local pool = clientpool.new { create = c.create, destroy = c.destroy, max_live = 2, scheduler = sched,
                                    acquire_timeout = 0.5 }    -- the pool's timeout, no per-call one
      local t0 = sched.now()
      local l, code = pool:acquire()
      assert.is_nil(l)
      assert.equal("timeout", code)
      assert.equal(0.5, sched.now() - t0)
      sched.sleep(5)
      local s = pool:stats()
      assert.equal(1, s.idle)
      assert.equal(0, s.leases)
      l = assert(pool:acquire())                      -- reused, no second create
      assert.equal(1, l.client.id)
      assert.equal(1, pool:stats().reused)
      l:release()
      pool:close()
    end)
  end)

  it51("a waiter's deadline counts from the start of its acquire, across the create it is granted", function()
    run(function(sched)
      local c = counting(sched, 5, 1)
      local pool = clientpool.new { create = function() return { id = 0 } end, destroy = c.destroy,
                                    max_live = 1, scheduler = sched }
      local held = assert(pool:acquire())
      pool._create = c.create                         -- from now on creates take 5 s
      local r = {}
      sched.spawn(function()
        local t0 = sched.now()
        r.l, r.code = pool:acquire(nil, { timeout = 1 })
        r.t = sched.now() - t0
      end)
      sched.sleep(0.6)
      held:release(false)                             -- the waiter is granted a reservation: create
      sched.sleep(2)
      assert.is_nil(r.l)
      assert.equal("timeout", r.code)
      assert.equal(1, r.t)
      assert.equal(1, pool:stats().creating)
      sched.sleep(5)
      assert.equal(1, pool:stats().idle)
      pool:close()
    end)
  end)

  it51("a validate slower than the deadline: timeout; validated in the background, the client is reused", function()
    run(function(sched)
      local calls = 0
      local pool = clientpool.new { create = function() return {} end, max_live = 1, scheduler = sched,
                                    validate = function() calls = calls + 1; sched.sleep(5); return true end }
      assert(pool:acquire()):release()
      local got
      sched.spawn(function()
        sched.sleep(1)
        local l = assert(pool:acquire(nil, { timeout = 10 }))
        got = sched.now()
        l:release()
      end)
      local t0 = sched.now()
      local l, code, detail = pool:acquire(nil, { timeout = 0.5 })
      assert.is_nil(l)
      assert.equal("timeout", code)
      assert.equal(0.5, sched.now() - t0)
      assert.equal(1, detail.active)                  -- the client being validated
      sched.sleep(10)
      -- the waiter got it when validate passed (at 5), and validated it
      -- again itself (no validate_after_idle: every idle reuse validates)
      assert.equal(10, got - t0)
      assert.equal(2, calls)
      local s = pool:stats()
      assert.equal(1, s.opened)
      assert.equal(0, s.closed)
      assert.equal(1, s.idle)
      pool:close()
    end)
  end)

  it51("a validate that fails after the deadline retires its client and looks no further", function()
    run(function(sched)
      local attempts = 0
      local pool = clientpool.new { create = function() attempts = attempts + 1; return {} end, max_live = 2,
                                    scheduler = sched,
                                    validate = function() sched.sleep(5); return false end }
      assert(pool:acquire()):release()
      local l, code = pool:acquire(nil, { timeout = 0.5 })
      assert.is_nil(l)
      assert.equal("timeout", code)
      sched.sleep(6)
      local s = pool:stats()
      assert.equal(1, s.closed_by.invalid)
      assert.equal(1, attempts)                       -- no create for a caller that left
      assert.equal(0, s.live + s.creating + s.closing + s.leases)
      pool:close()
    end)
  end)

  it51("a create that fails after the deadline is counted, and nothing is left reserved", function()
    run(function(sched)
      local c = counting(sched, 5, 1)
      c.fail = true
      local failed = {}
      local pool = clientpool.new { create = c.create, max_live = 1, scheduler = sched }
      pool:on("create_failed", function(key, err) failed[#failed + 1] = { key, err } end)
      local _, code = pool:acquire(nil, { timeout = 0.5 })
      assert.equal("timeout", code)
      sched.sleep(5)
      local s = pool:stats()
      assert.equal(1, s.create_failed)
      assert.equal(0, s.creating + s.live + s.leases)
      assert.same({ { nil, "refused" } }, { { failed[1][1], failed[1][2] } })
      pool:close()
    end)
  end)

  it51("a cancel token ends the wait for a create", function()
    run(function(sched)
      local c = counting(sched, 5, 1)
      local pool = clientpool.new { create = c.create, destroy = c.destroy, max_live = 1, scheduler = sched }
      local token = clientpool.token()
      sched.spawn(function() sched.sleep(1); token:cancel() end)
      local t0 = sched.now()
      local l, code = pool:acquire(nil, { timeout = 3, cancel = token })
      assert.is_nil(l)
      assert.equal("cancelled", code)
      assert.equal(1, sched.now() - t0)
      sched.sleep(5)
      assert.equal(1, pool:stats().idle)
      pool:close()
    end)
  end)

  it51("checkout: acquire_timeout bounds its create too", function()
    run(function(sched)
      local c = counting(sched, 5, 1)
      local pool = clientpool.new { create = c.create, destroy = c.destroy, max_live = 1, scheduler = sched,
                                    acquire_timeout = 0.5 }
      local t0 = sched.now()
      local client, code = pool:checkout()
      assert.is_nil(client)
      assert.equal("timeout", code)
      assert.equal(0.5, sched.now() - t0)
      sched.sleep(5)
      local h
      client, h = pool:checkout()
      assert.equal(1, client.id)
      pool:checkin(h)
      assert.equal(1, pool:stats().idle)
      pool:close()
    end)
  end)

  it("a create that does not yield cannot be cut short: its caller gets the client", function()
    -- a clock the create moves itself: 2 s pass inside it, with no yield
    local t = 0
    local sched = loop.new { clock = function() return t end }
    local pool = clientpool.new { max_live = 1, scheduler = sched,
                                  create = function() t = t + 2; return { id = 1 } end }
    local l
    sched.spawn(function() l = pool:acquire(nil, { timeout = 0.5 }) end)
    sched.run()
    assert.is_table(l)
    assert.equal(1, l.client.id)
    l:release()
    pool:close()
  end)

  it51("without a deadline, create runs in the caller as before", function()
    run(function(sched)
      local co
      local pool = clientpool.new { max_live = 1, scheduler = sched,
                                    create = function() co = coroutine.running(); sched.sleep(1); return {} end }
      local l = assert(pool:acquire())
      assert.equal(coroutine.running(), co)
      l:release()
      pool:close()
    end)
  end)
end)

-- The same on the hosts' real clocks: the caller is back before the create
-- ends, and the client serves the next caller.
for _, M in ipairs(H.missing_schedulers()) do
  describe("clientpool deadlines on " .. M.name, function()
    pending("not run: " .. M.reason)
  end)
end

for _, S in ipairs(H.schedulers { hosts = true }) do
  if S.real then
    describe("clientpool deadlines on " .. S.name, function()
      after_each(function() if S.finish then S.finish() end end)
      local function T(x) return x * S.scale end

      it51("a create slower than the deadline: timeout first, then the client serves the next caller", function()
        local sched = S.new()
        local c = counting(sched, T(5), 1)
        local pool = clientpool.new { create = c.create, destroy = c.destroy, max_live = 1, scheduler = sched }
        local r = {}
        S.run(sched, function()
          local t0 = sched.now()
          r.l, r.code = pool:acquire(nil, { timeout = T(0.5) })
          r.t = sched.now() - t0
          r.made = c.n                                 -- the create is not done yet
          local l = assert(pool:acquire(nil, { timeout = T(100) }))
          r.id = l.client.id
          l:release()
          pool:close()
        end)
        assert.is_nil(r.l)
        assert.equal("timeout", r.code)
        H.time(S, 0.5, r.t, "timeout")
        assert.equal(0, r.made)
        assert.equal(1, r.id)
        assert.equal(1, c.attempts)
        assert.equal(0, c.over)
      end)
    end)
  end
end
