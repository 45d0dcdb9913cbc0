-- clientpool.policy: the pauses a ready-made policy declares itself (issue
-- 12, finding 5: a 429 or 503 without Retry-After paused an origin for good,
-- still paused a day later). Without a deadline in the outcome, http() and
-- redis() pause for a backoff that doubles with each pause in a row of the
-- same scope, up to a maximum, and starts over after an outcome that
-- continues. Redis Cluster replies (MOVED, ASK, TRYAGAIN, CLUSTERDOWN,
-- MASTERDOWN) each have a documented choice. On the virtual clock: exact.

local clientpool = require "clientpool"
local policy = require "clientpool.policy"
local H = require "spec.helpers"
local errmsg = H.errmsg

local function near(expected, got, what)
  assert(type(got) == "number" and math.abs(got - expected) < 1e-6,
         (what or "value") .. ": expected " .. tostring(expected) .. ", got " .. tostring(got))
end

-- Runs body(loop) as a task on a fresh virtual-clock loop, to completion.
local function run(body)
  local loop = require("clientpool.loop").new { clock = "virtual" }
  loop.spawn(body, loop)
  loop.run()
end

local function mkpool(loop, o)
  local f = H.factory(loop)
  local opts = { create = f.create, destroy = f.destroy, max_live = 4, scheduler = loop }
  for k, v in pairs(o or {}) do opts[k] = v end
  return clientpool.new(opts), f
end

-- Observes `outcome` on a lease of key, releases it, and returns when the
-- key's pause (if any) ends: the seconds it lasted (0: no pause).
local function pause_length(loop, pool, key, outcome)
  local l = assert(pool:acquire(key, { timeout = 1e6 }))
  l:observe(outcome)
  l:release()
  local t0 = loop.now()
  local probe = assert(pool:acquire(key, { timeout = 1e6 }))   -- waits out the pause
  probe:release()
  return loop.now() - t0
end

describe("policy.http() without Retry-After", function()
  it("pauses for 1 s, then 2, 4, 8 ... while the 429 repeats, up to the max (30 s), never for good", function()
    run(function(loop)
      local pool = mkpool(loop, { policy = policy.http() })
      local got = {}
      for i = 1, 8 do got[i] = pause_length(loop, pool, "api", 429) end
      assert.same({ 1, 2, 4, 8, 16, 30, 30, 30 }, got)
      -- the bug of the issue: a day later the origin was still paused
      local l = assert(pool:acquire("api"))
      l:observe({ status = 503, headers = {} })
      l:release()
      loop.sleep(86400)
      assert.is_false(pool:stats().keys.api.paused)
      pool:close()
    end)
  end)

  it("starts over after a status that continues", function()
    run(function(loop)
      local pool = mkpool(loop, { policy = policy.http() })
      assert.equal(1, pause_length(loop, pool, "api", 429))
      assert.equal(2, pause_length(loop, pool, "api", 429))
      assert.equal(4, pause_length(loop, pool, "api", 503))   -- 503 repeats the same trouble
      assert.equal(0, pause_length(loop, pool, "api", 200))   -- served: the backoff starts over
      assert.equal(1, pause_length(loop, pool, "api", 429))
      pool:close()
    end)
  end)

  it("keeps one backoff per key (origin): another origin's 429s do not grow it", function()
    run(function(loop)
      local pool = mkpool(loop, { policy = policy.http() })
      assert.equal(1, pause_length(loop, pool, "a", 429))
      assert.equal(2, pause_length(loop, pool, "a", 429))
      assert.equal(1, pause_length(loop, pool, "b", 429))
      assert.equal(4, pause_length(loop, pool, "a", 429))
      pool:close()
    end)
  end)

  it("requests admitted before the pause that meet the same 429 do not grow it", function()
    run(function(loop)
      local pool = mkpool(loop, { policy = policy.http() })
      local held = {}
      for i = 1, 4 do held[i] = assert(pool:acquire("api")) end
      local d1 = held[1]:observe(429)
      near(1, d1.resume_after, "first pause")
      loop.sleep(0.25)
      for i = 2, 4 do
        local d = held[i]:observe(429)
        near(0.75, d.resume_after, "a concurrent 429, 0.25 s into the pause")
      end
      for i = 1, 4 do held[i]:release() end
      local t0 = loop.now()
      local l = assert(pool:acquire("api", { timeout = 10 }))
      near(0.75, loop.now() - t0, "resumed at the first pause's end")
      l:release()
      -- the next pause in a row is the second, not the fifth
      assert.equal(2, pause_length(loop, pool, "api", 429))
      pool:close()
    end)
  end)

  it("Retry-After still wins; scope = \"pool\" keeps one backoff for the pool", function()
    run(function(loop)
      local pool = mkpool(loop, { policy = policy.http { scope = "pool" } })
      local l = assert(pool:acquire("a"))
      near(5, l:observe({ status = 429, headers = { ["Retry-After"] = "5" } }).resume_after, "Retry-After")
      l:release()
      loop.sleep(5)
      l = assert(pool:acquire("b"))
      near(1, l:observe(429).resume_after, "first backoff of the pool")
      l:release()
      loop.sleep(1)
      l = assert(pool:acquire("c"))
      near(2, l:observe(503).resume_after, "the pool's second, from another key")
      l:release()
      pool:close()
    end)
  end)

  it("takes backoff = { base, max }, and refuses a bad one naming it", function()
    run(function(loop)
      local pool = mkpool(loop, { policy = policy.http { backoff = { base = 0.5, max = 1.5 } } })
      local got = {}
      for i = 1, 4 do got[i] = pause_length(loop, pool, "api", 429) end
      assert.same({ 0.5, 1, 1.5, 1.5 }, got)
      pool:close()
    end)
    for _, bad in ipairs { { 5 }, { base = 0 }, { base = -1 }, { max = 1 / 0 }, { base = 0 / 0 },
                           { base = 3, max = 2 }, { base = "1" }, { sometimes = 1 } } do
      local msg = errmsg(policy.http, { backoff = bad })
      assert(msg:find("clientpool.policy.http: ", 1, true) and msg:find("backoff", 1, true), msg)
      msg = errmsg(policy.redis, { backoff = bad })
      assert(msg:find("clientpool.policy.redis: ", 1, true) and msg:find("backoff", 1, true), msg)
    end
    assert(errmsg(policy.http, { backoff = 3 }):find("backoff must be a table", 1, true))
  end)
end)

describe("policy.redis()", function()
  it("LOADING, BUSY, MASTERDOWN and CLUSTERDOWN pause the key for a growing backoff", function()
    run(function(loop)
      local pool = mkpool(loop, { policy = policy.redis() })
      assert.equal(1, pause_length(loop, pool, "r", "LOADING Redis is loading the dataset in memory"))
      assert.equal(2, pause_length(loop, pool, "r", "BUSY Redis is busy running a script."))
      assert.equal(4, pause_length(loop, pool, "r",
        "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."))
      assert.equal(8, pause_length(loop, pool, "r", "CLUSTERDOWN The cluster is down"))
      assert.equal(0, pause_length(loop, pool, "r", nil))     -- a reply: served, starts over
      assert.equal(1, pause_length(loop, pool, "r", "-LOADING Redis is loading"))
      assert.equal(0, pause_length(loop, pool, "r", "ERR unknown command 'FOO'"))  -- the server answers
      assert.equal(1, pause_length(loop, pool, "r", "CLUSTERDOWN Hash slot not served"))
      pool:close()
    end)
  end)

  it("a fixed resume_after still applies to every pause", function()
    run(function(loop)
      local pool = mkpool(loop, { policy = policy.redis { resume_after = 3 } })
      assert.equal(3, pause_length(loop, pool, "r", "LOADING x"))
      assert.equal(3, pause_length(loop, pool, "r", "LOADING x"))
      pool:close()
    end)
  end)

  it("MOVED, ASK and TRYAGAIN continue: no pause, no retire (the caller follows the redirect)", function()
    run(function(loop)
      local pool, f = mkpool(loop, { policy = policy.redis() })
      for _, reply in ipairs { "MOVED 3999 127.0.0.1:6381", "ASK 3999 127.0.0.1:6381",
                               "TRYAGAIN Multiple keys request during rehashing of slot" } do
        local l = assert(pool:acquire("r"))
        assert.is_nil(policy.redis()(reply), reply)
        assert.is_true(l:observe(reply).continue, reply)
        l:release()
        local s = pool:stats()
        assert.is_false(s.keys.r.paused, reply)
        assert.equal(0, s.closed, reply)
      end
      assert.equal(1, f.created)
      assert.is_true(policy.REDIS_CONTINUE.MOVED and policy.REDIS_CONTINUE.ASK and policy.REDIS_CONTINUE.TRYAGAIN)
      pool:close()
    end)
  end)
end)
