-- Bad input (issue 6): every public function and option given nil, wrong
-- types, NaN, +-inf, negative, huge and fractional values, leases of other
-- and of closed pools, garbage checkout handles and misused tokens. Each
-- must raise a clear programming error (a message that starts with
-- "clientpool" and names the argument, raised at the caller's line, not
-- inside the library) or, where the value is valid, work; never crash and
-- never leave the pool unsound.
--
-- The seeded random-operation test: bad_input_fuzz_spec.lua.

local clientpool = require "clientpool"
local H = require "spec.helpers"

local NAN, INF = 0 / 0, math.huge

local contains = H.contains

-- The values every check runs through, by name.
local VALUES = {
  { "nil", nil }, { "a string", "x" }, { "an empty string", "" }, { "true", true }, { "false", false },
  { "a table", {} }, { "a function", function() end }, { "a coroutine", coroutine.create(function() end) },
  { "a userdata", io.stdout }, { "NaN", NAN }, { "inf", INF }, { "-inf", -INF }, { "-1", -1 }, { "0", 0 },
  { "0.5", 0.5 }, { "1.5", 1.5 }, { "2^31", 2 ^ 31 }, { "2^53", 2 ^ 53 }, { "2^64", 2 ^ 64 }, { "1e300", 1e300 },
  { "-1e300", -1e300 }, { "1", 1 },
}

-- Asserts that fn(...) raised a programming error naming every word, at the
-- caller's position (a location inside lua/clientpool/ means the error came
-- from deeper in the library than the argument check).
local function assert_api_error(what, words, fn, ...)
  local ok, err = pcall(fn, ...)
  assert(not ok, what .. ": accepted")
  assert(type(err) == "string", what .. ": raised a " .. type(err))
  assert(not err:find("clientpool/[%w_/]*%.lua:%d+:"), what .. ": raised inside the library: " .. err)
  local bare = err:gsub("^[^\n]-:%d+: ", "", 1)
  assert(bare:sub(1, 10) == "clientpool", what .. ": not a clientpool error: " .. err)
  for _, w in ipairs(words) do
    assert(contains(bare, w), what .. ": the message does not name '" .. w .. "': " .. err)
  end
  return err
end

local function CREATE() return {} end

-- The virtual loop, a pool on it, and body(sched, pool) run as a task.
local function with_pool(o, body)
  local sched = require("clientpool.loop").new { clock = "virtual" }
  local opts = { create = CREATE, max_live = 2, scheduler = sched }
  for k, v in pairs(o or {}) do opts[k] = v end
  local pool = clientpool.new(opts)
  local done = false
  sched.spawn(function()
    body(sched, pool)
    done = true
  end)
  sched.run()
  assert(done, "the scenario did not finish")
  return pool
end

-- The pool is sound and holds nothing.
local function assert_sound(pool)
  local s = H.check(pool)
  assert.equal(0, s.leases)
  assert.equal(0, s.waiting)
  assert.equal(0, s.creating)
  return s
end

local function is_key(v) return v == nil or type(v) == "string" end
local function is_finite_nonneg(v) return type(v) == "number" and v == v and v >= 0 and v < INF end

-------------------------------------------------------------------------------
describe("bad input to clientpool.new", function()
  -- option -> accepts(v) for a value given alone in { max_live = 4, create = fn }
  local COUNT = {
    max_live = 1, min_idle = 0, max_idle = 0, max_concurrency = 1, max_waiting = 0, capacity = 1,
    max_keys = 1, restarts = 0,
  }
  local function int_in(v, lo, hi)
    return type(v) == "number" and v == v and v >= lo and v <= hi and math.floor(v) == v
  end
  local ACCEPTS = {}
  for name, lo in pairs(COUNT) do
    ACCEPTS[name] = function(v)
      if v == nil then return true end
      if not int_in(v, lo, 2147483647) then return false end
      if name == "min_idle" or name == "max_idle" then return v <= 4 end
      return true
    end
  end
  ACCEPTS.max_live = function(v) return int_in(v, 1, 2147483647) end
  ACCEPTS.seed = function(v) return v == nil or int_in(v, 0, 2 ^ 63) end
  for _, name in ipairs { "acquire_timeout", "idle_timeout", "max_lifetime", "validate_after_idle",
                          "leak_threshold" } do
    ACCEPTS[name] = function(v) return v == nil or (type(v) == "number" and v > 0 and v < INF) end
  end
  for _, name in ipairs { "destroy", "validate", "policy" } do
    ACCEPTS[name] = function(v) return v == nil or type(v) == "function" end
  end
  ACCEPTS.create = function(v) return type(v) == "function" end
  ACCEPTS.pause_mode = function(v) return v == nil or v == "queue" or v == "fail" end
  ACCEPTS.probe = function(v) return v == nil or type(v) == "boolean" end
  ACCEPTS.keys = function(v) return v == nil or (type(v) == "table" and next(v) == nil) end
  ACCEPTS.per_key = function(v) return v == nil or (type(v) == "table" and next(v) == nil) end
  ACCEPTS.scheduler = function(v) return v == nil end
  ACCEPTS.backend = function(v) return v == nil end
  ACCEPTS.lifetime_jitter = function(v) return v == nil end -- needs max_lifetime: below

  local names = {}
  for name in pairs(ACCEPTS) do names[#names + 1] = name end
  table.sort(names)

  for _, name in ipairs(names) do
    it("option '" .. name .. "': every odd value is accepted or rejected by name", function()
      for _, case in ipairs(VALUES) do
        local v = case[2]
        local o = { max_live = 4, create = CREATE, scheduler = require("clientpool.loop").new { clock = "virtual" } }
        if name ~= "scheduler" then o[name] = v else o.scheduler = v end
        if name == "max_live" and v == nil then o.max_live = nil end
        local what = "option " .. name .. " = " .. case[1]
        if (name == "max_live" and v == nil) or not ACCEPTS[name](v) then
          assert_api_error(what, { name }, clientpool.new, o)
        else
          local ok, pool = pcall(clientpool.new, o)
          assert(ok, what .. ": rejected: " .. tostring(pool))
          assert_sound(pool)
        end
      end
    end)
  end

  it("lifetime_jitter, per_key fields, keys items: every odd value", function()
    for _, case in ipairs(VALUES) do
      local v = case[2]
      local ok_jitter = v == nil or (type(v) == "number" and v >= 0 and v < 1)
      local o = { max_live = 4, create = CREATE, max_lifetime = 10, lifetime_jitter = v }
      if ok_jitter then assert(pcall(clientpool.new, o), "lifetime_jitter = " .. case[1])
      else assert_api_error("lifetime_jitter = " .. case[1], { "lifetime_jitter" }, clientpool.new, o) end
      for _, f in ipairs { "max_live", "max_idle" } do
        local lo = f == "max_live" and 1 or 0
        local good = v == nil or (type(v) == "number" and v == v and v >= lo and v <= 4 and math.floor(v) == v)
        o = { max_live = 4, create = CREATE, per_key = { [f] = v } }
        if good then assert(pcall(clientpool.new, o), "per_key." .. f .. " = " .. case[1])
        else assert_api_error("per_key." .. f .. " = " .. case[1], { "per_key." .. f }, clientpool.new, o) end
      end
      if v ~= nil and type(v) ~= "string" then
        assert_api_error("keys = { " .. case[1] .. " }", { "keys" }, clientpool.new,
          { max_live = 4, create = CREATE, keys = { v } })
      end
    end
  end)

  it("a huge max_live with capacity > 1 does not overflow the default max_concurrency", function()
    for _, cap in ipairs { 2, 2147483647 } do
      local pool = clientpool.new { max_live = 2147483647, capacity = cap, create = CREATE,
                                    scheduler = require("clientpool.loop").new { clock = "virtual" } }
      local l = assert(pool:try_acquire())
      assert.equal(1, pool:stats().leases)
      l:release()
      assert_sound(pool)
    end
  end)

  it("anything but a table as the options", function()
    for _, case in ipairs(VALUES) do
      if type(case[2]) ~= "table" then
        assert_api_error("new(" .. case[1] .. ")", { "options" }, clientpool.new, case[2])
      end
    end
  end)
end)

-------------------------------------------------------------------------------
describe("bad arguments to pool methods", function()
  it("acquire, try_acquire, checkout, with, resume, retire: key", function()
    with_pool({}, function(_, pool)
      for _, case in ipairs(VALUES) do
        local v = case[2]
        if not is_key(v) then
          assert_api_error("acquire(" .. case[1] .. ")", { "acquire", "key" }, pool.acquire, pool, v)
          assert_api_error("try_acquire(" .. case[1] .. ")", { "try_acquire", "key" }, pool.try_acquire, pool, v)
          assert_api_error("checkout(" .. case[1] .. ")", { "checkout", "key" }, pool.checkout, pool, v)
          assert_api_error("with(" .. case[1] .. ")", { "with", "key" }, pool.with, pool, v, function() end)
          assert_api_error("resume(" .. case[1] .. ")", { "#1", "resume", "key" }, pool.resume, pool, v)
          assert_api_error("retire(" .. case[1] .. ")", { "#1", "retire", "key" }, pool.retire, pool, v)
          assert_api_error("pause('r', " .. case[1] .. ")", { "#2", "pause", "key" }, pool.pause, pool, "r", v)
        end
      end
      assert_sound(pool)
    end)
  end)

  it("acquire: opts, opts.timeout, opts.cancel, opts.on_drain", function()
    with_pool({}, function(_, pool)
      for _, case in ipairs(VALUES) do
        local v = case[2]
        local what = case[1]
        if v ~= nil and type(v) ~= "table" then
          assert_api_error("acquire opts = " .. what, { "acquire", "#2", "options" }, pool.acquire, pool, "k", v)
        end
        if v ~= nil and not is_finite_nonneg(v) then
          assert_api_error("timeout = " .. what, { "acquire", "timeout" }, pool.acquire, pool, "k", { timeout = v })
        elseif v ~= nil then
          -- a valid timeout, however long or short: nothing to wait for here
          local l = assert(pool:acquire("k", { timeout = v }))
          l:release()
        end
        if v ~= nil then
          assert_api_error("cancel = " .. what, { "acquire", "cancel" }, pool.acquire, pool, "k", { cancel = v })
        end
        if v ~= nil and v ~= "preserve" then
          assert_api_error("on_drain = " .. what, { "acquire", "on_drain" }, pool.acquire, pool, "k",
            { on_drain = v })
        end
        if not is_finite_nonneg(v) then
          assert_api_error("on_drain.cancel = " .. what, { "acquire", "on_drain" }, pool.acquire, pool, "k",
            { on_drain = { cancel = v } })
        end
      end
      -- a misspelt option name is an error, not a silent default
      assert_api_error("opts.timout", { "acquire", "#2", "unknown option 'timout'" }, pool.acquire, pool, "k",
        { timout = 0.01 })
      assert_api_error("opts[1]", { "acquire", "#2", "unknown option" }, pool.acquire, pool, "k", { 0.5 })
      assert_sound(pool)
    end)
  end)

  it("pool methods called with a dot instead of a colon say so", function()
    with_pool({}, function(_, pool)
      for _, m in ipairs { "acquire", "try_acquire", "with", "on", "off", "stats", "close", "drain",
                           "cancel_active", "pause", "resume", "retire", "run" } do
        assert_api_error("pool." .. m .. "()", { m, "colon" }, pool[m])
        assert_api_error("pool." .. m .. "('k')", { m, "colon" }, pool[m], "k")
      end
      assert_sound(pool)
    end)
  end)

  it("lease and token methods called with a dot instead of a colon say so", function()
    with_pool({}, function(_, pool)
      local lease = assert(pool:acquire("k"))
      for _, m in ipairs { "release", "destroy", "observe", "cancelled", "on_cancel" } do
        assert_api_error("lease." .. m .. "()", { m, "colon" }, lease[m])
        assert_api_error("lease." .. m .. "({})", { m, "colon" }, lease[m], {})
      end
      lease:release()
      local token = clientpool.token()
      assert_api_error("token.cancel()", { "cancel", "colon" }, token.cancel)
      assert_api_error("token.cancelled()", { "cancelled", "colon" }, token.cancelled)
      assert_sound(pool)
    end)
  end)

  it("C functions serve as hooks and as with()'s function (Lua 5.1 too)", function()
    with_pool({}, function(_, pool)
      assert.is_string(pool:with("k", type))    -- fn(client, lease) = type(client)
      assert_sound(pool)
    end)
    local p = clientpool.new { max_live = 1, create = os.clock, scheduler = require("clientpool.loop").new() }
    local l = assert(p:try_acquire())
    assert.is_number(l.client)
    l:release()
    assert.equal(0, p:stats().leases)
  end)

  it("with: fn", function()
    with_pool({}, function(_, pool)
      for _, case in ipairs(VALUES) do
        if type(case[2]) ~= "function" then
          assert_api_error("with(k, " .. case[1] .. ")", { "with", "function" }, pool.with, pool, "k", case[2])
        end
      end
      assert_sound(pool)
    end)
  end)

  it("on and off: event and listener", function()
    with_pool({}, function(_, pool)
      for _, case in ipairs(VALUES) do
        assert_api_error("on(" .. case[1] .. ")", { "on", "event" }, pool.on, pool, case[2], function() end)
        if type(case[2]) ~= "function" then
          assert_api_error("on('acquire', " .. case[1] .. ")", { "on", "function" }, pool.on, pool, "acquire",
            case[2])
        end
      end
      assert_api_error("on('Acquire')", { "on", "Acquire" }, pool.on, pool, "Acquire", function() end)
      for _, case in ipairs(VALUES) do
        assert_api_error("off(" .. case[1] .. ")", { "off", "event" }, pool.off, pool, case[2], function() end)
        if type(case[2]) ~= "function" then
          assert_api_error("off('acquire', " .. case[1] .. ")", { "off", "function" }, pool.off, pool, "acquire",
            case[2])
        end
      end
      assert_sound(pool)
    end)
  end)

  it("pause: reason; drain: timeout", function()
    with_pool({}, function(_, pool)
      for _, case in ipairs(VALUES) do
        local v = case[2]
        if type(v) ~= "string" then
          assert_api_error("pause(" .. case[1] .. ")", { "pause", "reason" }, pool.pause, pool, v)
        end
        if v ~= nil and not is_finite_nonneg(v) then
          assert_api_error("drain(" .. case[1] .. ")", { "drain", "timeout" }, pool.drain, pool, v)
        end
      end
      assert.is_false(pool:stats().paused)
      assert_sound(pool)
    end)
  end)

  it("checkin: garbage handles are rejected or ignored, never end another holder's checkout", function()
    with_pool({ max_live = 3 }, function(_, pool)
      local c1, h1 = pool:checkout()
      local c2, h2 = pool:checkout("k")
      assert(c1 and c2)
      local other = clientpool.new { create = CREATE, max_live = 1 }
      local _, oh = other:checkout()
      local lease = assert(pool:acquire())
      for _, case in ipairs(VALUES) do
        local v = case[2]
        if type(v) ~= "number" or v ~= v or v < 0 or v % 1 ~= 0 or v >= 2 ^ 53 then
          assert_api_error("checkin(" .. case[1] .. ")", { "checkin", "handle" }, pool.checkin, pool, v)
        elseif v ~= h1 and v ~= h2 then -- (the first handles are small integers: 0, 1, ...)
          assert(pcall(pool.checkin, pool, v), "checkin(" .. case[1] .. ") raised")
        end
        if v ~= nil and type(v) ~= "boolean" then
          assert_api_error("checkin(h, " .. case[1] .. ")", { "checkin", "#2" }, pool.checkin, pool, h1, v)
        end
      end
      -- handles near the stale ones: a generation that differs in high bits
      for _, h in ipairs { h1 + 2 ^ 21, h1 + 2 ^ 52, h1 + (2 ^ 32) * 2 ^ 21, h2 - 1, h2 + 1 } do
        if h < 2 ^ 53 and h ~= h1 and h ~= h2 then pool:checkin(h) end
      end
      assert_api_error("checkin(lease)", { "checkin", "handle" }, pool.checkin, pool, lease)
      -- another pool's handle is only a number: it must not raise (it may
      -- match a checkout of this pool: handles are not tagged by pool)
      assert.equal(3, pool:stats().leases)
      pool:checkin(h1)
      pool:checkin(h2)
      pool:checkin(h2)
      lease:release()
      other:checkin(oh)
      assert_sound(pool)
      assert_sound(other)
    end)
  end)

  it("a lease where a key, handle, reason or function is expected", function()
    with_pool({}, function(_, pool)
      local lease = assert(pool:acquire())
      assert_api_error("acquire(lease)", { "key" }, pool.acquire, pool, lease)
      assert_api_error("pause(lease)", { "reason" }, pool.pause, pool, lease)
      assert_api_error("with(k, lease)", { "function" }, pool.with, pool, "k", lease)
      assert_api_error("on_cancel(lease)", { "on_cancel" }, lease.on_cancel, lease, lease)
      lease:release()
      assert_sound(pool)
    end)
  end)
end)

-------------------------------------------------------------------------------
describe("leases and tokens misused", function()
  it("a lease of another pool: its methods act on its own pool only", function()
    with_pool({}, function(sched, a)
      local b = clientpool.new { create = CREATE, max_live = 1, scheduler = sched }
      local la, lb = assert(a:acquire()), assert(b:acquire())
      -- methods are per lease: la's release through Lease.release(lb) ends lb
      clientpool.Lease.release(lb)
      assert.equal(1, a:stats().leases)
      assert.equal(0, b:stats().leases)
      la:release()
      la:release()
      lb:release(false)
      assert_sound(a)
      assert_sound(b)
    end)
  end)

  it("release(reuse) and checkin(h, reuse): only nil, true or false", function()
    with_pool({}, function(_, pool)
      for _, case in ipairs(VALUES) do
        local v = case[2]
        if v ~= nil and type(v) ~= "boolean" then
          local l = assert(pool:acquire())
          assert_api_error("release(" .. case[1] .. ")", { "release", "#1" }, l.release, l, v)
          assert_api_error("destroy(" .. case[1] .. ")", { "release", "#1" }, l.release, l, v)
          l:release()
        end
      end
      assert_sound(pool)
    end)
  end)

  it("a lease of a closed pool: release destroys, the other methods work or say 'lease released'", function()
    local policy_calls = 0
    with_pool({ max_live = 3, policy = function() policy_calls = policy_calls + 1; return { pause = "x" } end },
      function(sched, pool)
        local a, b, c = assert(pool:acquire()), assert(pool:acquire("k")), assert(pool:acquire())
        pool:close()
        assert.is_false(a:cancelled())
        local fired = false
        a:on_cancel(function() fired = true end)
        -- observe on a closed pool: the policy runs, its pause is harmless
        assert.same({ pause = "x" }, b:observe("boom"))
        assert.equal(1, policy_calls)
        pool:cancel_active()
        assert.is_true(fired)
        a:release()
        b:destroy()
        c:release(false)
        for _, l in ipairs { a, b, c } do
          l:release()
          assert_api_error("observe after release", { "lease released" }, l.observe, l, "x")
          assert_api_error("cancelled after release", { "lease released" }, l.cancelled, l)
        end
        -- pool methods on the closed pool: runtime outcomes, no errors
        assert.same({ nil, "closed" }, { pool:acquire() })
        assert.same({ nil, "closed" }, { pool:try_acquire("z") })
        assert.same({ nil, "closed" }, { pool:checkout() })
        assert.same({ nil, "closed" }, { pool:with("k", function() error("never") end) })
        pool:pause("again")
        pool:resume()
        pool:retire()
        pool:checkin(12345)
        pool:run()
        assert.is_true(pool:drain(1))
        sched.sleep(0)
        local s = assert_sound(pool)
        assert.equal(0, s.live)
      end)
  end)

  it("tokens: cancelled before use, shared by pools, cancelled twice", function()
    with_pool({ max_live = 1 }, function(sched, pool)
      local other = clientpool.new { create = CREATE, max_live = 1, scheduler = sched }
      local held, oheld = assert(pool:acquire()), assert(other:acquire())
      local tok = clientpool.token()
      local got = {}
      for i, p in ipairs { pool, other } do
        sched.spawn(function() got[i] = { p:acquire(nil, { cancel = tok }) } end)
      end
      sched.sleep(1)
      tok:cancel()
      tok:cancel()
      sched.sleep(0)
      assert.same({ { nil, "cancelled" }, { nil, "cancelled" } }, got)
      assert.is_true(tok:cancelled())
      assert.same({ nil, "cancelled" }, { pool:acquire(nil, { cancel = tok }) })
      assert_api_error("cancel = a token-like table", { "cancel" }, pool.acquire, pool, nil,
        { cancel = { _cancelled = false, _waits = {} } })
      held:release()
      oheld:release()
      assert_sound(pool)
      assert_sound(other)
    end)
  end)
end)

-------------------------------------------------------------------------------
describe("bad input to clientpool.policy", function()
  local policy = require "clientpool.policy"
  it("http: options, statuses", function()
    for _, case in ipairs(VALUES) do
      local v = case[2]
      if v ~= nil and v ~= false and type(v) ~= "table" then
        assert_api_error("http(" .. case[1] .. ")", { "policy.http" }, policy.http, v)
      end
      if v ~= nil and v ~= false and type(v) ~= "table" then
        assert_api_error("http{ statuses = " .. case[1] .. " }", { "statuses" }, policy.http, { statuses = v })
      end
      if type(v) ~= "number" or v ~= v or v % 1 ~= 0 then
        if v ~= nil then
          assert_api_error("http{ statuses = { " .. case[1] .. " } }", { "statuses" }, policy.http,
            { statuses = { v } })
        end
      end
      if v ~= nil and v ~= false and v ~= "key" and v ~= "pool" then
        assert_api_error("http{ scope = " .. case[1] .. " }", { "scope" }, policy.http, { scope = v })
      end
    end
  end)

  it("redis: resume_after", function()
    for _, case in ipairs(VALUES) do
      local v = case[2]
      if v ~= nil and not is_finite_nonneg(v) then
        assert_api_error("redis{ resume_after = " .. case[1] .. " }", { "resume_after" }, policy.redis,
          { resume_after = v })
      elseif v ~= nil then
        assert.equal(v, policy.redis { resume_after = v }("LOADING").resume_after)
      end
    end
  end)

  it("the policies never raise on any outcome; Retry-After is finite or absent", function()
    local http, redis = policy.http(), policy.redis()
    local outcomes = {}
    for _, case in ipairs(VALUES) do
      outcomes[#outcomes + 1] = case[2]
      outcomes[#outcomes + 1] = { status = case[2] }
      outcomes[#outcomes + 1] = { status = 429, headers = { ["Retry-After"] = case[2] } }
      outcomes[#outcomes + 1] = { status = 503, headers = case[2] }
    end
    for _, ra in ipairs { string.rep("9", 400), "1e999", "-5", " 7 ", "inf", "nan", "0x10",
                          "Wed, 21 Oct 2015 07:28:00 GMT", "Xyz, 99 Abc 2015 99:99:99 GMT" } do
      outcomes[#outcomes + 1] = { status = 429, headers = { ["retry-after"] = ra } }
    end
    for _, o in ipairs(outcomes) do
      local ok, d = pcall(http, o)
      assert(ok, d)
      if d and d.resume_after ~= nil then
        assert(is_finite_nonneg(d.resume_after), "resume_after " .. tostring(d.resume_after))
      end
      assert(pcall(redis, o))
    end
    assert(pcall(redis, "-LOADING"))
    for _, case in ipairs(VALUES) do
      local r = policy.retry_after(case[2])
      assert(r == nil or is_finite_nonneg(r), "retry_after(" .. case[1] .. ") = " .. tostring(r))
    end
  end)

  it("a Retry-After too large for a number does not make observe raise", function()
    with_pool({ policy = policy.http() }, function(_, pool)
      local l = assert(pool:acquire("origin"))
      local ok, d = pcall(l.observe, l, { status = 429, headers = { ["Retry-After"] = string.rep("9", 400) } })
      assert(ok, d)
      assert.equal("http 429", d.pause)
      l:release()
      pool:resume("origin")
      assert_sound(pool)
    end)
  end)
end)
