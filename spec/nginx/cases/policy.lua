-- Protocol policy in a real nginx (issue 4): an upstream location of this
-- nginx answers 429 with Retry-After: 1; requests reach it through a pool of
-- HTTP/1.1 keep-alive connections (clientpool.ngx) and observe each response
-- with clientpool.policy.http(). The 429 pauses the pool, requests that come
-- during the pause queue, and the pool resumes by itself after the
-- Retry-After, when they complete.
local H = require "harness"
local policy = require "clientpool.policy"
local sched = require "clientpool.sched.ngx"
local app = require "app"

local function get(path)
  return ngx.thread.spawn(function() return H.http(path) end)
end

local function join(th)
  local ok, status, body = ngx.thread.wait(th)
  assert(ok, status)
  assert.are.equal(200, status, body)
  return body
end

-- The pause of the pool's one origin, its default key (policy.http()
-- pauses the key of the lease: issue 18, a key pause of the default key is
-- that key's, not the pool's).
local function paused(pool)
  local k = pool:stats().keys[require("clientpool").DEFAULT_KEY]
  return k and k.paused
end

-- Records the pool's pause and resume events with their times.
local function watch(pool)
  local events = {}
  pool:on("pause", function(key, reason) events[#events + 1] = { "pause", reason, sched.now(), key } end)
  pool:on("resume", function(key) events[#events + 1] = { "resume", nil, sched.now(), key } end)
  return events
end

describe("policy.http() over keep-alive connections to an upstream in this nginx", function()
  it("429 with Retry-After: 1 pauses its origin; requests in the pause queue and complete after it resumes by itself",
  function()
    local up = app.upstream_state("api", { script = { 429 } })
    local pool, mgr = app.http_pool("api", { max_live = 2, acquire_timeout = 10, policy = policy.http() })
    local events = watch(pool)

    -- a request gets the 429 and observes it: the pool pauses
    local body = join(get("/app/http_get?pool=api"))
    assert.matches("^status 429 ", body)
    assert.are.equal("http 429", paused(pool))
    assert.are.equal(false, pool:stats().paused)   -- the origin's pause, not the pool's
    assert.are.equal(1, #events)
    assert.are.same({ "pause", "http 429" }, { events[1][1], events[1][2] })
    local paused_at = events[1][3]

    -- five requests during the pause: they queue, none reaches the upstream
    local threads = {}
    for i = 1, 5 do
      threads[i] = get("/app/http_get?pool=api&tag=" .. i)
      assert.truthy(H.wait_until(function() return pool:stats().waiting == i end, 2))
    end
    ngx.sleep(0.2)
    local s = pool:stats()
    assert.are.equal(5, s.waiting)
    assert.are.equal("http 429", paused(pool))
    assert.are.equal(1, up.hits)
    assert.are.equal(0, s.leases)

    -- after the Retry-After the pool resumes by itself; the queued complete
    local conns = {}
    for i = 1, 5 do
      body = join(threads[i])
      local conn, reqs, waited = body:match("^status 200 conn=(%d+) reqs=(%d+) waited=([%d.]+)")
      assert.truthy(conn, body)
      conns[conn] = true
      assert.is_true(tonumber(waited) > 0.5, body)
      assert.is_true(tonumber(reqs) >= 1, body)
    end
    assert.are.equal(2, #events)
    assert.are.equal("resume", events[2][1])
    local paused_for = events[2][3] - paused_at
    assert.is_true(paused_for >= 1 and paused_for < 2, "paused for " .. paused_for .. " s")
    assert.are.same({ "1", "2", "3", "4", "5" }, app.log["api:got"]) -- in arrival order
    s = pool:stats()
    assert.are.equal(false, paused(pool))
    assert.are.equal(0, s.waiting)
    assert.are.equal(6, up.hits)
    -- keep-alive: at most max_live connections, reused across requests
    local n = 0
    for _ in pairs(conns) do n = n + 1 end
    assert.is_true(n <= 2, n .. " upstream connections")
    assert.is_true(mgr.stats.connects <= 2, mgr.stats.connects .. " connects")
    assert.is_true(mgr.stats.reuses >= 4, mgr.stats.reuses .. " reuses")
    assert.are.equal(s.opened, mgr.stats.connects)
    pool:close()
  end, 30)

  it("pause_mode = \"fail\": during the pause requests fail at once with paused; after Retry-After they pass",
  function()
    local up = app.upstream_state("apifail", { script = { 503 } })
    local pool = app.http_pool("apifail", { max_live = 2, policy = policy.http(), pause_mode = "fail" })
    assert.matches("^status 503 ", join(get("/app/http_get?pool=apifail")))
    local t0 = H.now()
    assert.matches("^err paused http 503", join(get("/app/http_get?pool=apifail")))
    assert.is_true(H.now() - t0 < 0.5)
    assert.are.equal(1, up.hits)
    assert.truthy(H.wait_until(function() return paused(pool) == false end, 3))
    assert.matches("^status 200 ", join(get("/app/http_get?pool=apifail")))
    assert.are.equal(2, up.hits)
    pool:close()
  end, 30)

  it("probe = true: after each Retry-After one request goes alone; a 429 pauses again, a 200 lets the rest through",
  function()
    local up = app.upstream_state("probe", { script = { 429, 429 } })
    local pool = app.http_pool("probe", { max_live = 3, acquire_timeout = 10, policy = policy.http(),
                                          probe = true })
    local events = watch(pool)
    assert.matches("^status 429 ", join(get("/app/http_get?pool=probe")))
    local threads = {}
    for i = 1, 4 do
      threads[i] = get("/app/http_get?pool=probe&sleep=0.1&tag=" .. i)
      assert.truthy(H.wait_until(function() return pool:stats().waiting == i end, 2))
    end
    local bodies = {}
    for i = 1, 4 do bodies[i] = join(threads[i]) end
    -- request 1 probed and got the second 429; request 2 probed after the
    -- next Retry-After and got 200; requests 3 and 4 then went together
    assert.matches("^status 429 ", bodies[1])
    for i = 2, 4 do assert.matches("^status 200 ", bodies[i]) end
    local kinds = {}
    for _, ev in ipairs(events) do kinds[#kinds + 1] = ev[1] end
    assert.are.same({ "pause", "resume", "pause", "resume" }, kinds)
    assert.is_true(events[2][3] - events[1][3] >= 1)
    assert.is_true(events[4][3] - events[3][3] >= 1)
    -- each probe was alone at the upstream: request #2 (the first probe)
    -- ended before #3 (the second probe) started, #3 ended before #4 and #5
    local order = {}
    for _, ev in ipairs(up.events) do order[#order + 1] = ev[1] .. ev[2] end
    assert.are.same({ "start1", "end1", "start2", "end2", "start3", "end3" },
                    { unpack(order, 1, 6) })
    assert.are.equal(5, up.hits)
    assert.are.equal(2, up.max_inflight)           -- #4 and #5 together, after the probe
    assert.are.equal(false, pool:stats().paused)
    pool:close()
  end, 30)
end)
