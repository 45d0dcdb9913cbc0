-- clientpool.new(): every option rule (docs/api.md, "Options"), the
-- defaults and their effect, and no I/O at construction.
--
-- Every bad option must raise a programming error: a message that starts
-- with "clientpool:" (after the position Lua adds, which must then be the
-- caller's line, not a line inside the library) and names the option.

local clientpool = require "clientpool"
local H = require "spec.helpers"
local contains = H.contains

local NAN, INF = 0 / 0, math.huge
local NONE = {} -- in an override table: leave the option out

local function CREATE() return {} end
local function FN() end

-- A complete adapter table (for "a table lacking a function").
local function adapter_without(missing)
  local a = {
    now = function() return 0 end, current = function() return nil, "test" end,
    wait = FN, wake = function() return true end, spawn = FN, sleep = FN,
  }
  if missing then a[missing] = nil end
  return a
end

-- Options: a valid base with overrides (NONE removes an option).
local function opts(over)
  local o = { max_live = 4, create = CREATE }
  for k, v in pairs(over or {}) do
    if v == NONE then o[k] = nil else o[k] = v end
  end
  return o
end

-- Not a tail call: the position Lua puts in front of the message must be
-- this line (the caller of new), never a line of lua/clientpool/init.lua.
local function try_new(o)
  local pool = clientpool.new(o)
  return pool
end

local function new_error(o)
  local ok, err = pcall(try_new, o)
  assert(not ok, "clientpool.new accepted a bad option")
  return tostring(err)
end

-- The message without a "chunk:line: " position prefix.
local function strip_position(msg)
  return (msg:gsub("^[^\n]-:%d+: ", "", 1))
end

-- Asserts the rejection: "clientpool:" first, and every name mentioned.
local function assert_rejects(o, names)
  local msg = new_error(o)
  local bare = strip_position(msg)
  assert(bare:sub(1, 11) == "clientpool:", "message does not start with 'clientpool:': " .. msg)
  for _, name in ipairs(names) do
    assert(contains(bare, name), "message does not name '" .. name .. "': " .. msg)
  end
  return msg
end

-- Every bad-option case: description, options, words the message must hold.
local CASES = {
  -- max_live
  { "max_live missing", opts { max_live = NONE }, { "max_live" } },
  { "max_live 0", opts { max_live = 0 }, { "max_live" } },
  { "max_live negative", opts { max_live = -3 }, { "max_live" } },
  { "max_live fractional", opts { max_live = 1.5 }, { "max_live" } },
  { "max_live NaN", opts { max_live = NAN }, { "max_live" } },
  { "max_live inf", opts { max_live = INF }, { "max_live" } },
  { "max_live -inf", opts { max_live = -INF }, { "max_live" } },
  { "max_live a string", opts { max_live = "4" }, { "max_live" } },
  { "max_live a boolean", opts { max_live = true }, { "max_live" } },
  -- the envelope min_idle <= max_idle <= max_live
  { "min_idle > max_idle", opts { max_idle = 2, min_idle = 3 }, { "min_idle" } },
  { "min_idle > max_live (max_idle defaulted)", opts { min_idle = 5 }, { "min_idle" } },
  { "min_idle negative", opts { min_idle = -1 }, { "min_idle" } },
  { "min_idle fractional", opts { min_idle = 0.5 }, { "min_idle" } },
  { "max_idle > max_live", opts { max_live = 2, max_idle = 3 }, { "max_idle" } },
  { "max_idle negative", opts { max_idle = -1 }, { "max_idle" } },
  { "max_idle a string", opts { max_idle = "2" }, { "max_idle" } },
  -- other counts
  { "max_concurrency 0", opts { max_concurrency = 0 }, { "max_concurrency" } },
  { "max_concurrency fractional", opts { max_concurrency = 2.5 }, { "max_concurrency" } },
  { "max_concurrency NaN", opts { max_concurrency = NAN }, { "max_concurrency" } },
  { "max_waiting -1", opts { max_waiting = -1 }, { "max_waiting" } },
  { "max_waiting fractional", opts { max_waiting = 0.5 }, { "max_waiting" } },
  { "max_waiting inf", opts { max_waiting = INF }, { "max_waiting" } },
  { "capacity 0", opts { capacity = 0 }, { "capacity" } },
  { "capacity a string", opts { capacity = "1" }, { "capacity" } },
  { "max_keys 0", opts { max_keys = 0 }, { "max_keys" } },
  { "restarts -1", opts { restarts = -1 }, { "restarts" } },
  { "seed negative", opts { seed = -1 }, { "seed" } },
  { "seed fractional", opts { seed = 1.5 }, { "seed" } },
  -- per_key
  { "per_key a number", opts { per_key = 4 }, { "per_key" } },
  { "per_key a string", opts { per_key = "max_live=1" }, { "per_key" } },
  { "per_key with an unknown field", opts { per_key = { max_lvie = 1 } }, { "per_key", "max_lvie" } },
  { "per_key.max_live > max_live", opts { per_key = { max_live = 5 } }, { "per_key", "max_live" } },
  { "per_key.max_live 0", opts { per_key = { max_live = 0 } }, { "per_key", "max_live" } },
  { "per_key.max_live fractional", opts { per_key = { max_live = 1.5 } }, { "per_key", "max_live" } },
  { "per_key.max_idle > max_idle", opts { max_idle = 2, per_key = { max_idle = 3 } }, { "per_key", "max_idle" } },
  { "per_key.max_idle > max_live (max_idle defaulted)", opts { per_key = { max_idle = 5 } },
    { "per_key", "max_idle" } },
  { "per_key.max_idle fractional", opts { per_key = { max_idle = 0.5 } }, { "per_key", "max_idle" } },
  { "per_key.max_idle negative", opts { per_key = { max_idle = -1 } }, { "per_key", "max_idle" } },
  { "per_key.max_idle > per_key.max_live", opts { per_key = { max_live = 2, max_idle = 3 } },
    { "per_key", "max_idle" } },
  -- keys
  { "keys a string", opts { keys = "redis-a" }, { "keys" } },
  { "keys a map", opts { keys = { a = "redis-a" } }, { "keys" } },
  { "keys a list with a map part", opts { keys = { "redis-a", extra = "redis-b" } }, { "keys" } },
  { "keys a list with a hole", opts { keys = { [1] = "redis-a", [3] = "redis-b" } }, { "keys" } },
  { "keys with a number item", opts { keys = { "redis-a", 5 } }, { "keys" } },
  { "keys with a table item", opts { keys = { {} } }, { "keys" } },
  { "keys with a duplicate", opts { keys = { "redis-a", "redis-b", "redis-a" } }, { "keys", "redis-a" } },
  { "min_idle over per_key.max_live", opts { min_idle = 3, per_key = { max_live = 2 } },
    { "min_idle", "per_key.max_live" } },
  { "keys more than max_keys", opts { max_keys = 2, keys = { "a", "b", "c" } }, { "keys", "max_keys" } },
  -- lifetime_jitter
  { "lifetime_jitter negative", opts { max_lifetime = 10, lifetime_jitter = -0.1 }, { "lifetime_jitter" } },
  { "lifetime_jitter 1", opts { max_lifetime = 10, lifetime_jitter = 1 }, { "lifetime_jitter" } },
  { "lifetime_jitter > 1", opts { max_lifetime = 10, lifetime_jitter = 1.5 }, { "lifetime_jitter" } },
  { "lifetime_jitter NaN", opts { max_lifetime = 10, lifetime_jitter = NAN }, { "lifetime_jitter" } },
  { "lifetime_jitter a string", opts { max_lifetime = 10, lifetime_jitter = "0.1" }, { "lifetime_jitter" } },
  { "lifetime_jitter without max_lifetime", opts { lifetime_jitter = 0.1 }, { "lifetime_jitter", "max_lifetime" } },
  -- modes and flags
  { "pause_mode unknown", opts { pause_mode = "drop" }, { "pause_mode" } },
  { "pause_mode a number", opts { pause_mode = 1 }, { "pause_mode" } },
  { "probe a string", opts { probe = "yes" }, { "probe" } },
  { "probe a number", opts { probe = 1 }, { "probe" } },
  -- hooks
  { "create missing", opts { create = NONE }, { "create" } },
  { "create a table", opts { create = {} }, { "create" } },
  { "create a string", opts { create = "connect" }, { "create" } },
  { "destroy not a function", opts { destroy = 5 }, { "destroy" } },
  { "validate not a function", opts { validate = {} }, { "validate" } },
  { "park without unpark", opts { park = FN }, { "park", "unpark" } },
  { "unpark without park", opts { unpark = FN }, { "park", "unpark" } },
  { "park not a function", opts { park = 1, unpark = FN }, { "park" } },
  { "unpark not a function", opts { park = FN, unpark = "x" }, { "unpark" } },
  { "policy not a function", opts { policy = { pause = "429" } }, { "policy" } },
  -- names
  { "an unknown option (typo)", opts { max_idel = 2 }, { "max_idel" } },
  { "an unknown option (camel case)", opts { maxLive = 2 }, { "maxLive" } },
  -- scheduler
  { "scheduler: an unknown name", opts { scheduler = "no-such-host" },
    { "scheduler", "no scheduler named 'no-such-host'", "built in: loop, ngx" } },
  -- outside OpenResty the ngx adapter's host is missing, not the adapter
  { "scheduler: an adapter whose host library is missing", opts { scheduler = "ngx" },
    { "scheduler", "the 'ngx' adapter cannot load here", "ngx" } },
  { "scheduler: a number", opts { scheduler = 42 }, { "scheduler" } },
  { "scheduler: a table lacking sleep", opts { scheduler = adapter_without "sleep" }, { "scheduler", "sleep" } },
  { "scheduler: a table lacking wake", opts { scheduler = adapter_without "wake" }, { "scheduler", "wake" } },
  { "scheduler: a table whose now is not a function",
    opts { scheduler = (function() local a = adapter_without(); a.now = 0; return a end)() },
    { "scheduler", "now" } },
  { "min_idle x warm keys above max_idle (the floor would churn)",
    opts { keys = { "a", "b", "c" }, min_idle = 2, max_idle = 4, max_live = 10 },
    { "min_idle", "keys", "max_idle", "a floor of 6" } },
  { "min_idle x warm keys, capped by max_live, above max_idle",
    opts { keys = { "a", "b", "c" }, min_idle = 2, max_idle = 4, max_live = 5 },
    { "min_idle", "max_idle", "a floor of 5" } },
  { "scheduler: a table whose optional done is not a function",
    opts { scheduler = (function() local a = adapter_without(); a.done = true; return a end)() },
    { "scheduler", "done", "must be a function when given" } },
  { "scheduler: a table whose optional background is not a function",
    opts { scheduler = (function() local a = adapter_without(); a.background = {}; return a end)() },
    { "scheduler", "background" } },
}

-- Durations: 0, negative, NaN, inf, -inf and a string, for each of them.
for _, name in ipairs { "acquire_timeout", "idle_timeout", "max_lifetime", "validate_after_idle", "leak_threshold" } do
  for _, bad in ipairs { { "0", 0 }, { "negative", -1 }, { "NaN", NAN }, { "inf", INF }, { "-inf", -INF },
                         { "a string", "1" }, { "a table", {} } } do
    CASES[#CASES + 1] = { name .. " " .. bad[1], opts { [name] = bad[2] }, { name } }
  end
end

describe("clientpool.new options", function()

  describe("rejects", function()
    for _, case in ipairs(CASES) do
      it(case[1], function()
        assert_rejects(case[2], case[3])
      end)
    end

    it("a non-table argument", function()
      for _, v in ipairs { 5, "max_live=1", true } do
        assert_rejects(v, { "table" })
      end
      assert_rejects(nil, { "table" })
    end)

    it("every bad option with an error located at the caller, not inside the library", function()
      local wrong = {}
      for _, case in ipairs(CASES) do
        local msg = new_error(case[2])
        if not (msg:find("^clientpool:") or msg:find("^[^\n]-options_spec%.lua:%d+: clientpool:")) then
          wrong[#wrong + 1] = case[1] .. ": " .. msg:match("^[^\n]*")
        end
      end
      local shown = {}
      for i = 1, math.min(#wrong, 6) do shown[i] = wrong[i] end
      assert(#wrong == 0, #wrong .. " of " .. #CASES .. " rejections do not start with 'clientpool:' "
        .. "(or the caller's position), e.g.:\n  " .. table.concat(shown, "\n  "))
    end)
  end)

  describe("accepts", function()
    it("the boundaries of the envelope", function()
      local CASES_OK = {
        opts { max_live = 1 },
        opts { max_live = 2, max_idle = 2, min_idle = 2 },
        opts { max_live = 3, max_idle = 0, min_idle = 0 },
        opts { max_live = 4.0 }, -- an integer-valued float is an integer
        opts { max_concurrency = 1 },
        opts { max_concurrency = 100 }, -- independent of max_live
        opts { max_waiting = 0 },
        opts { capacity = 1 },
        opts { per_key = {} },
        opts { per_key = { max_live = 4, max_idle = 4 } },
        opts { max_idle = 2, per_key = { max_live = 1, max_idle = 1 } },
        opts { keys = {} },
        opts { keys = { "a", "b" }, max_keys = 2 },
        opts { keys = { "a" }, min_idle = 1 },
        opts { acquire_timeout = 0.001, idle_timeout = 1e-3, max_lifetime = 1e6,
               validate_after_idle = 0.5, leak_threshold = 30 },
        opts { max_lifetime = 10, lifetime_jitter = 0 },
        opts { max_lifetime = 10, lifetime_jitter = 0.999 },
        opts { pause_mode = "queue" }, opts { pause_mode = "fail" },
        opts { probe = true }, opts { probe = false },
        opts { destroy = FN, validate = FN, park = FN, unpark = FN, policy = FN },
        opts { restarts = 0 }, opts { seed = 0 }, opts { seed = 12345 },
        opts { scheduler = "loop" },
        opts { scheduler = adapter_without() },
      }
      for i, o in ipairs(CASES_OK) do
        local ok, err = pcall(try_new, o)
        assert(ok, "case " .. i .. " was rejected: " .. tostring(err))
        assert.is_table(err)
      end
    end)

    it("does not keep or change the options table", function()
      local o = opts { max_idle = 2 }
      local copy = {}
      for k, v in pairs(o) do copy[k] = v end
      try_new(o)
      assert.same(copy, o)
    end)
  end)

  describe("construction", function()
    it("performs no I/O: create is not called by new(), even with a warm floor", function()
      for _, S in ipairs(H.schedulers()) do
        local sched = S.new()
        local f = H.factory(sched)
        local pool = clientpool.new { max_live = 4, min_idle = 2, max_idle = 4, keys = { "a", "b" },
                                      create = f.create, destroy = f.destroy, scheduler = sched }
        assert.equal(0, f.created)
        -- not later in the background either: the floor is pool:run()'s job
        S.run(sched, function() sched.sleep(10) end)
        assert.equal(0, f.created)
        local s = H.check(pool)
        assert.equal(0, s.opened)
        assert.equal(0, s.live)
        assert.equal(0, s.creating)
      end
    end)

    it("calls no hook at all in new()", function()
      local called = {}
      local function spy(name) return function() called[#called + 1] = name end end
      try_new(opts { create = spy "create", destroy = spy "destroy", validate = spy "validate",
                     park = spy "park", unpark = spy "unpark", policy = spy "policy", min_idle = 1 })
      assert.same({}, called)
    end)
  end)

  describe("defaults", function()
    it("a pool with only max_live and create works (default scheduler, outside coroutines)", function()
      local n = 0
      local pool = clientpool.new { max_live = 1, create = function() n = n + 1; return { id = n } end }
      local l = assert(pool:try_acquire())
      assert.equal(1, l.client.id)
      l:release()
      local l2 = assert(pool:acquire()) -- a free client: no wait, so no coroutine needed
      assert.equal(1, l2.client.id)
      local s = H.check(pool)
      assert.equal(1, s.opened)
      assert.equal(1, s.reused)
      assert.is_false(s.paused)
      l2:release()
      pool:close()
    end)

    for _, S in ipairs(H.schedulers()) do
      describe("on " .. S.name, function()
        local function run(body)
          local sched = S.new()
          S.run(sched, body, sched)
        end

        it("max_concurrency = max_live: max_live + 1 acquisitions, the last one waits (with no deadline)", function()
          run(function(sched)
            local f = H.factory(sched)
            local pool = clientpool.new { max_live = 2, create = f.create, destroy = f.destroy, scheduler = sched }
            local got = {}
            for i = 1, 3 do
              sched.spawn(function()
                local l, code = pool:acquire()
                got[i] = { lease = l, code = code, at = sched.now() }
                if i <= 2 then
                  sched.sleep(1000) -- far past any duration a pool could pick by itself
                  l:release()
                end
              end)
            end
            sched.sleep(1)
            local s = H.check(pool)
            assert.equal(2, s.leases)
            assert.equal(2, s.live)
            assert.equal(1, s.waiting)
            assert.is_nil(got[3])
            sched.sleep(1000)
            assert.is_table(got[3] and got[3].lease)
            assert.equal(1000, got[3].at)
            assert.equal(2, f.created)
            got[3].lease:release()
            s = H.check(pool)
            assert.equal(0, s.timeouts)
            assert.equal(1, s.wait_count)
          end)
        end)

        it("max_idle = max_live, and no idle_timeout or max_lifetime", function()
          run(function(sched)
            local f = H.factory(sched)
            local pool = clientpool.new { max_live = 3, create = f.create, destroy = f.destroy, scheduler = sched }
            local ls = {}
            for i = 1, 3 do ls[i] = assert(pool:acquire()) end
            for i = 1, 3 do ls[i]:release() end
            local s = H.check(pool)
            assert.equal(3, s.idle)
            assert.equal(0, s.closed_by.max_idle)
            sched.sleep(1e6)
            s = H.check(pool)
            assert.equal(3, s.idle)
            assert.equal(0, s.closed)
            assert.equal(0, f.destroyed)
          end)
        end)

        it("capacity 1: concurrent leases get distinct clients", function()
          run(function(sched)
            local f = H.factory(sched)
            local pool = clientpool.new { max_live = 2, create = f.create, scheduler = sched }
            local a, b = assert(pool:acquire()), assert(pool:acquire())
            assert.are_not.equal(a.client, b.client)
            local s = H.check(pool)
            assert.equal(2, s.active)
            assert.equal(2, s.leases)
          end)
        end)

        it("max_waiting = 1024: the 1025th waiting acquisition fails with full", function()
          run(function(sched)
            local f = H.factory(sched)
            local pool = clientpool.new { max_live = 1, create = f.create, scheduler = sched }
            local held = assert(pool:acquire())
            local codes = {}
            for _ = 1, 1025 do
              sched.spawn(function()
                local l, code = pool:acquire(nil, { timeout = 1 })
                assert.is_nil(l)
                codes[code] = (codes[code] or 0) + 1
              end)
            end
            sched.sleep(0.5)
            local s = H.check(pool)
            assert.equal(1024, s.waiting)
            assert.equal(1, s.rejected)
            assert.same({ full = 1 }, codes)
            sched.sleep(1)
            assert.same({ full = 1, timeout = 1024 }, codes)
            held:release()
          end)
        end)

        it("max_waiting = 0 fails fast with full", function()
          run(function(sched)
            local f = H.factory(sched)
            local pool = clientpool.new { max_live = 1, max_waiting = 0, create = f.create, scheduler = sched }
            local held = assert(pool:acquire())
            local t0 = sched.now()
            local l, code = pool:acquire(nil, { timeout = 5 })
            assert.is_nil(l)
            assert.equal("full", code)
            assert.equal(t0, sched.now())
            held:release()
          end)
        end)

        it("an explicit max_concurrency below max_live admits only that many leases", function()
          run(function(sched)
            local f = H.factory(sched)
            local pool = clientpool.new { max_live = 4, max_concurrency = 1, create = f.create, scheduler = sched }
            local a = assert(pool:acquire())
            local l, code = pool:acquire(nil, { timeout = 1 })
            assert.is_nil(l)
            assert.equal("timeout", code)
            assert.equal(1, f.created)
            a:release()
            assert.is_table((pool:acquire(nil, { timeout = 1 })))
          end)
        end)
      end)
    end
  end)
end)
