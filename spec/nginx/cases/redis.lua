-- clientpool.ngx against a real redis-server: reuse is real, and under
-- concurrent load in one worker redis never sees more than max_live
-- connections from the pool.
local H = require "harness"
local app = require "app"

-- A pool whose connections are named "cp-<name>" in redis.
local function redis_pool(name, o) return app.redis_pool(name, o, "cp-" .. name) end

describe("PING over the ngx manager", function()
  it("reuses one connection across requests", function()
    local pool, mgr = redis_pool("reuse", { max_live = 2 })
    local r = assert(H.redis())
    local before = r:connected_clients()
    local reused = {}
    for i = 1, 20 do
      local status, body = H.http("/app/redis_ping?pool=reuse")
      assert.are.equal(200, status, body)
      reused[i] = tonumber(body:match("^PONG reused=(%d+)"))
    end
    assert.are.equal(0, reused[1])
    for i = 2, 20 do assert.are.equal(i - 1, reused[i]) end -- the same connection, again and again
    assert.are.equal(1, r:clients("cp-reuse"))
    assert.are.equal(before + 1, r:connected_clients())
    assert.are.equal(1, mgr.stats.connects)
    assert.are.equal(19, mgr.stats.reuses)
    assert.are.equal(20, mgr.stats.parked)
    local s = pool:stats()
    assert.are.equal(1, s.opened)
    assert.are.equal(19, s.reused)
    assert.are.equal(1, s.idle)
    r:close()
    pool:close()
  end)

  it("under 50 concurrent requests in one worker, redis never sees more than max_live", function()
    local max_live = 4
    local pool, mgr = redis_pool("load", { max_live = max_live, acquire_timeout = 10 })
    local stop = H.sample_clients("cp-load", 0.001)
    local ok_count, bad = 0, {}
    local threads = {}
    for c = 1, 50 do
      threads[c] = ngx.thread.spawn(function()
        for _ = 1, 10 do
          local status, body = H.http("/app/redis_ping?pool=load&hold=0.002")
          if status == 200 and body:match("^PONG") then ok_count = ok_count + 1
          else bad[#bad + 1] = tostring(status) .. " " .. tostring(body) end
        end
      end)
    end
    for _, t in ipairs(threads) do ngx.thread.wait(t) end
    local max_seen, samples = stop()
    assert.are.same({}, bad)
    assert.are.equal(500, ok_count)
    assert.is_true(samples > 20, "only " .. samples .. " samples")
    assert.is_true(max_seen >= 1 and max_seen <= max_live, "redis saw " .. max_seen .. " connections")
    local s = pool:stats()
    assert.is_true(s.opened <= max_live)
    assert.are.equal(0, s.leases)
    assert.are.equal(0, s.waiting)
    assert.is_true(s.wait_count > 0, "nobody waited: the load did not exceed max_live")
    assert.is_true(mgr.stats.connects <= max_live)
    ngx.log(ngx.NOTICE, string.format("redis load: max %d connections seen in %d samples; %d waits, %.3fs waited",
      max_seen, samples, s.wait_count, s.wait_time))
    pool:close()
  end, 60)

  it("max_idle: a release beyond it closes the connection", function()
    local pool, mgr = redis_pool("maxidle", { max_live = 4, max_idle = 1, acquire_timeout = 5 })
    local r = assert(H.redis())
    local leases = {}
    for i = 1, 4 do leases[i] = assert(pool:acquire()) end
    assert.are.equal(4, r:clients("cp-maxidle"))
    for i = 1, 4 do leases[i]:release() end
    assert.truthy(H.wait_until(function() return r:clients("cp-maxidle") == 1 end, 2))
    local s = pool:stats()
    assert.are.equal(1, s.live)
    assert.are.equal(1, s.idle)
    assert.are.equal(3, s.closed_by.max_idle)
    -- parked at the release, then taken back from nginx's pool and closed
    assert.are.equal(3, mgr.stats.closed + mgr.stats.closed_parked)
    r:close()
    pool:close()
  end)

  it("a lease released in the log phase while a request waits: the waiter gets a live connection", function()
    local pool = redis_pool("logrel", { max_live = 1, acquire_timeout = 5 })
    app.probes["logrel:content"] = function()
      app.logrel_held = assert(pool:acquire())
      ngx.sleep(0.2)                       -- the waiter below queues meanwhile
    end
    app.probes["logrel"] = function()      -- the log phase: the socket's handler is over
      app.logrel_held:release()
      return "released"
    end
    local req = ngx.thread.spawn(H.http, "/phase/log?probe=logrel")
    ngx.sleep(0.05)
    local l, code = pool:acquire(nil, { timeout = 5 })
    assert.truthy(l, tostring(code))
    local pong, err = H.command(l.client, "PING")
    assert.are.equal("PONG", pong, "the waiter's connection: " .. tostring(err))
    l:release()
    assert.truthy(ngx.thread.wait(req))
    local s = pool:stats()
    assert.are.equal(0, s.leases)
    assert.are.equal(s.live, s.idle)
    pool:close()
  end)

  it("idle_timeout: nginx and the pool let the parked connection go", function()
    local pool = redis_pool("idle", { max_live = 2, idle_timeout = 0.1 })
    local r = assert(H.redis())
    assert(pool:acquire()):release()
    assert.are.equal(1, r:clients("cp-idle"))
    assert.truthy(H.wait_until(function() return r:clients("cp-idle") == 0 end, 2))
    assert.truthy(H.wait_until(function() return pool:stats().live == 0 end, 2))
    r:close()
    pool:close()
  end)

  it("close: parked connections are taken back and closed", function()
    local pool, mgr = redis_pool("close", { max_live = 3 })
    local r = assert(H.redis())
    local a, b = assert(pool:acquire()), assert(pool:acquire())
    a:release(); b:release()
    assert.are.equal(2, r:clients("cp-close"))
    pool:close()
    assert.truthy(H.wait_until(function() return r:clients("cp-close") == 0 end, 2))
    assert.are.equal(2, mgr.stats.closed_parked)
    r:close()
  end)
end)
