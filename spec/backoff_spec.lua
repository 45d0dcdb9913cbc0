-- clientpool: create backoff (DESIGN.md section 3 "Create failure", issue
-- 12 finding 4: with redis down, about 2000 connect attempts per second).
-- After failed creates in a row a key's creates are spaced by a bounded,
-- jittered exponential backoff (defaults 0.05 s doubling to 2 s); an
-- acquisition that would create inside the window fails fast with
-- nil, "create", last_err, unless a client of the key may come back soon.
-- On the built-in loop's virtual clock.

local clientpool = require "clientpool"
local loop = require "clientpool.loop"

-- (run() re-raises a task's error)
local function run(fn)
  local sched = loop.new { clock = "virtual" }
  sched.spawn(fn, sched)
  sched.run()
end

-- an upstream that is down until `up` is set; counts connect attempts
local function upstream()
  local u = { attempts = 0, up = false, n = 0 }
  function u.create()
    u.attempts = u.attempts + 1
    if not u.up then return nil, "connection refused #" .. u.attempts end
    u.n = u.n + 1
    return { id = u.n }
  end
  return u
end

local function errmsg(fn, ...)
  local ok, err = pcall(fn, ...)
  assert(not ok, "expected an error")
  return tostring(err)
end

describe("clientpool create backoff", function()
  it("bounds the connect attempts to a dead upstream, failing fast with the last error", function()
    run(function(sched)
      local u = upstream()
      local pool = clientpool.new { create = u.create, max_live = 8, scheduler = sched }
      local calls, fast, errs = 0, 0, {}
      for _ = 1, 50 do
        sched.spawn(function()
          while sched.now() < 20 do
            local t0 = sched.now()
            local l, code, err = pool:acquire(nil, { timeout = 1 })
            calls = calls + 1
            assert.is_nil(l)
            assert.equal("create", code)
            errs[err] = true
            if sched.now() == t0 then fast = fast + 1 end
            sched.sleep(0.01)
          end
        end)
      end
      sched.sleep(21)
      -- 50 callers retrying every 10 ms for 20 s: 100k acquisitions; the
      -- windows grow 0.05, 0.1, ... to 2 s (at least half of each), so
      -- about 20 attempts, never the thousands of one per acquisition
      assert.is_true(calls > 50000, "calls " .. calls)
      assert.is_true(u.attempts <= 30, "attempts " .. u.attempts)
      assert.is_true(u.attempts >= 10, "attempts " .. u.attempts)
      assert.is_true(fast > calls * 0.99, "fast " .. fast .. " of " .. calls)
      for e in pairs(errs) do assert.truthy(e:find("connection refused #", 1, true), e) end
      local s = pool:stats()
      assert.equal(u.attempts, s.create_failed)
      assert.equal(0, s.live + s.creating + s.closing)
      pool:close()
    end)
  end)

  it("serves again within the bound once the upstream is back; a success resets the backoff", function()
    run(function(sched)
      local u = upstream()
      local pool = clientpool.new { create = u.create, max_live = 2, scheduler = sched }
      for _ = 1, 8 do                        -- fail until the window reaches its bound
        pool:acquire()
        sched.sleep(2)
      end
      u.up = true
      local t0 = sched.now()
      local l
      repeat
        local code, err
        l, code, err = pool:acquire()
        if not l then
          assert.equal("create", code)
          assert.truthy(tostring(err):find("connection refused", 1, true))
          sched.sleep(0.01)
        end
      until l
      assert.is_true(sched.now() - t0 <= 2, "back after " .. (sched.now() - t0))
      -- reset: a second client is created at once, no window
      local l2 = assert(pool:acquire())
      assert.equal(2, l2.client.id)
      l:release(false)
      l2:release(false)
      u.up = false
      local a, code = pool:acquire()
      assert.is_nil(a)
      assert.equal("create", code)
      local before = u.attempts
      a, code = pool:acquire()                 -- in the first window again (0.05 s)
      assert.is_nil(a)
      assert.equal("create", code)
      assert.equal(before, u.attempts)
      sched.sleep(0.05)
      u.up = true
      assert(pool:acquire()):release()
      pool:close()
    end)
  end)

  it("waits instead of failing fast while a client of the key may come back", function()
    run(function(sched)
      local u = upstream()
      u.up = true
      local pool = clientpool.new { create = u.create, max_live = 2, scheduler = sched }
      local held = assert(pool:acquire())
      u.up = false
      assert.is_nil((pool:acquire()))          -- the second create fails: a window opens
      local got
      sched.spawn(function()
        got = { pool:acquire(nil, { timeout = 5 }) }
      end)
      sched.sleep(0.01)
      assert.is_nil(got)                       -- waiting: held may come back
      held:release()
      sched.sleep(0)
      assert.is_table(got[1])
      assert.equal(1, got[1].client.id)
      got[1]:release()
      pool:close()
    end)
  end)

  it("create_backoff = false: every acquisition creates", function()
    run(function(sched)
      local u = upstream()
      local pool = clientpool.new { create = u.create, max_live = 2, scheduler = sched, create_backoff = false }
      for _ = 1, 10 do
        local l, code, err = pool:acquire()
        assert.is_nil(l)
        assert.equal("create", code)
        assert.truthy(err:find("connection refused", 1, true))
      end
      assert.equal(10, u.attempts)
      pool:close()
    end)
  end)

  it("checks its options, naming the rule", function()
    local c = function() return {} end
    local cases = {
      { { create_backoff = 0 }, "create_backoff", "> 0" },
      { { create_backoff = -1 }, "create_backoff", "> 0" },
      { { create_backoff = "x" }, "create_backoff", "number" },
      { { create_backoff = 1 / 0 }, "create_backoff", "finite" },
      { { create_backoff_max = 0 }, "create_backoff_max", "> 0" },
      { { create_backoff = 1, create_backoff_max = 0.5 }, "create_backoff_max", ">= create_backoff" },
      { { create_backoff = false, create_backoff_max = 1 }, "create_backoff_max", "needs create_backoff" },
    }
    for _, case in ipairs(cases) do
      local o = { create = c, max_live = 1 }
      for k, v in pairs(case[1]) do o[k] = v end
      local msg = errmsg(clientpool.new, o)
      assert.truthy(msg:find("clientpool:", 1, true), msg)
      assert.truthy(msg:find(case[2], 1, true), msg)
      assert.truthy(msg:find(case[3], 1, true), msg)
    end
    -- a base above the default bound raises the bound with it
    clientpool.new { create = c, max_live = 1, create_backoff = 5 }:close()
  end)

  it("the warm floor's refills go through the backoff: each failed refill a strike and a failure", function()
    run(function(sched)
      local u = upstream()
      local logged = {}
      local failed = 0
      local pool = clientpool.new { create = u.create, max_live = 8, min_idle = 4, restarts = 1000,
                                    scheduler = setmetatable({ log = function(m) logged[#logged + 1] = m end },
                                                             { __index = sched }) }
      pool:on("create_failed", function() failed = failed + 1 end)
      sched.spawn(function() pool:run() end)
      sched.sleep(20)
      -- four refills wanted, two at a time: without the backoff the floor
      -- would retry at once, thousands of times
      assert.is_true(u.attempts <= 30, "attempts " .. u.attempts)
      assert.is_true(u.attempts >= 10, "attempts " .. u.attempts)
      local s = pool:stats()
      assert.equal(u.attempts, s.create_failed)
      assert.equal(u.attempts, failed)
      assert.equal(u.attempts, pool._strikes)
      assert.is_false(s.floor_spent)
      -- an acquisition meanwhile fails fast with the refills' last error
      local l, code, err = pool:acquire()
      assert.is_nil(l)
      assert.equal("create", code)
      assert.truthy(tostring(err):find("connection refused #", 1, true), tostring(err))
      u.up = true                              -- back: the floor fills within the bound, by itself
      sched.sleep(2.5)
      assert.equal(4, pool:stats().idle)
      assert.equal(0, pool._strikes)
      pool:close()
    end)
  end)
end)

-- A real dead upstream (issue 12 finding 4: with redis down, about 2000
-- connect attempts per second): create makes a TCP connect to a loopback
-- port nobody listens on (luasocket), 50 callers retry for 20 s of the
-- virtual clock, and the attempts counted in create stay bounded by the
-- backoff.
describe("clientpool create backoff against a closed port", function()
  local ok, socket = pcall(require, "socket")
  if not ok then
    pending("luasocket does not load here: " .. tostring(socket))
    return
  end

  -- a loopback port that was free a moment ago: bound, then closed
  local function closed_port()
    local srv = assert(socket.bind("127.0.0.1", 0))
    local _, port = srv:getsockname()
    srv:close()
    return tonumber(port)
  end

  it("connect attempts stay bounded by the backoff; every caller fails fast with the connect error", function()
    local port = closed_port()
    local attempts, refused = 0, 0
    local function create()
      attempts = attempts + 1
      local c = socket.tcp()
      c:settimeout(1)
      local done, err = c:connect("127.0.0.1", port)
      if done then return c end              -- (someone took the port meanwhile)
      c:close()
      refused = refused + 1
      return nil, err
    end
    run(function(sched)
      local pool = clientpool.new { create = create, destroy = function(c) c:close() end, max_live = 8,
                                    scheduler = sched }
      local calls, codes, errs = 0, {}, {}
      local per_second = {}
      for _ = 1, 50 do
        sched.spawn(function()
          while sched.now() < 20 do
            local before = attempts
            local l, code, err = pool:acquire(nil, { timeout = 1 })
            calls = calls + 1
            if l then l:release(false) else codes[code] = true; errs[tostring(err)] = true end
            if attempts > before then
              local sec = math.floor(sched.now()) + 1
              per_second[sec] = (per_second[sec] or 0) + (attempts - before)
            end
            sched.sleep(0.01)
          end
        end)
      end
      sched.sleep(21)
      pool:close()
      assert.equal(attempts, refused, "the port was taken meanwhile")
      assert.is_true(calls > 50000, "calls " .. calls)
      assert.is_true(attempts <= 30, "attempts " .. attempts)
      -- after the first second (windows of 0.05, 0.1, 0.2, 0.4 s ...) at
      -- most one attempt per second, as the window reaches its bound of 2 s
      for sec = 3, 20 do
        assert.is_true((per_second[sec] or 0) <= 1, "second " .. sec .. ": " .. tostring(per_second[sec]))
      end
      assert.same({ create = true }, codes)
      for e in pairs(errs) do assert.truthy(e:find("refused", 1, true), e) end
      assert.equal(attempts, pool:stats().create_failed)
    end)
  end)
end)
