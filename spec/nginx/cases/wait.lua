-- Waiting across requests: waiters wait on ngx.semaphore and are woken by
-- other requests' releases.
local H = require "harness"
local clientpool = require "clientpool"
local sched = require "clientpool.sched.ngx"
local app = require "app"

local function get(path)
  return ngx.thread.spawn(function() return H.http(path) end)
end

local function join(th)
  local ok, status, body = ngx.thread.wait(th)
  assert(ok, status)
  return status, body
end

local function counts(pool)
  local s = pool:stats()
  return { live = s.live, idle = s.idle, leases = s.leases, waiting = s.waiting }
end

describe("a pool in OpenResty", function()
  it("picks the ngx scheduler by itself", function()
    local f = app.factory()
    local pool = clientpool.new { create = f.create, max_live = 1 }
    assert.are.equal(sched, pool._sched)
    local l = assert(pool:acquire())
    l:release()
  end)

  it("request A holds the only client, B waits, A releases, B gets it", function()
    local pool = app.plain_pool("ab", { max_live = 1 })
    local a = assert(pool:acquire())                -- this request is A
    local b = get("/app/acquire?pool=ab&timeout=5")  -- B, another request
    assert.truthy(H.wait_until(function() return pool:stats().waiting == 1 end, 2))
    ngx.sleep(0.05)
    assert.are.same({ live = 1, idle = 0, leases = 1, waiting = 1 }, counts(pool))
    a:release()
    local status, body = join(b)
    assert.are.equal(200, status)
    local id, waited = body:match("^ok (%d+) waited=([%d.]+)")
    assert.are.equal("1", id, body)                  -- the same client, reused
    assert.is_true(tonumber(waited) >= 0.05, body)
    assert.are.same({ live = 1, idle = 1, leases = 0, waiting = 0 }, counts(pool))
    assert.are.equal(1, app.factories.ab.created)
  end)

  it("serves waiters from several requests in arrival order", function()
    local pool = app.plain_pool("fifo", { max_live = 1 })
    app.log["fifo:got"] = {}
    local a = assert(pool:acquire())
    local threads = {}
    for i = 1, 5 do
      threads[i] = get("/app/acquire?pool=fifo&timeout=5&hold=0.01&tag=" .. i)
      assert.truthy(H.wait_until(function() return pool:stats().waiting == i end, 2))
    end
    a:release()
    for i = 1, 5 do
      local status, body = join(threads[i])
      assert.are.equal(200, status)
      assert.matches("^ok 1 ", body)
    end
    assert.are.same({ "1", "2", "3", "4", "5" }, app.log["fifo:got"])
    assert.are.same({ live = 1, idle = 1, leases = 0, waiting = 0 }, counts(pool))
  end)

  it("a waiter in another request times out with the counts", function()
    local pool = app.plain_pool("to", { max_live = 1 })
    local a = assert(pool:acquire())
    local status, body = join(get("/app/acquire?pool=to&timeout=0.1"))
    assert.are.equal(200, status)
    assert.matches("^err timeout timeout after 0%.1%d%ds %(live=1, idle=0, active=1, waiting=1%)", body)
    a:release()
    local s = pool:stats()
    assert.are.equal(1, s.timeouts)
    assert.are.equal(0, s.waiting)
  end)

  it("max_waiting bounds the queue", function()
    local pool = app.plain_pool("full", { max_live = 1, max_waiting = 1 })
    local a = assert(pool:acquire())
    local b = get("/app/acquire?pool=full&timeout=5")
    assert.truthy(H.wait_until(function() return pool:stats().waiting == 1 end, 2))
    local status, body = join(get("/app/acquire?pool=full&timeout=5"))
    assert.are.equal(200, status)
    assert.matches("^err full", body)
    a:release()
    assert.matches("^ok 1", select(2, join(b)))
  end)

  it("close wakes waiters in other requests with closed", function()
    local pool = app.plain_pool("close", { max_live = 1 })
    local a = assert(pool:acquire())
    local b = get("/app/acquire?pool=close&timeout=5")
    assert.truthy(H.wait_until(function() return pool:stats().waiting == 1 end, 2))
    pool:close()
    assert.matches("^err closed", select(2, join(b)))
    a:release()
    assert.are.equal(0, pool:stats().live)
  end)

  it("hundreds of waiters in light threads and requests share two clients", function()
    local pool, f = app.plain_pool("many", { max_live = 2, acquire_timeout = 10 })
    local served, failed = 0, 0
    local threads = {}
    for _ = 1, 200 do
      threads[#threads + 1] = ngx.thread.spawn(function()
        local l, code = pool:acquire()
        if not l then failed = failed + 1; return code end
        ngx.sleep(0.001)
        l:release()
        served = served + 1
      end)
    end
    local reqs = {}
    for i = 1, 20 do reqs[i] = get("/app/acquire?pool=many&hold=0.001") end
    for _, t in ipairs(threads) do ngx.thread.wait(t) end
    for _, t in ipairs(reqs) do
      local status, body = join(t)
      assert.are.equal(200, status)
      assert.matches("^ok ", body)
    end
    assert.are.equal(200, served)
    assert.are.equal(0, failed)
    assert.are.equal(2, f.created)
    assert.are.same({ live = 2, idle = 2, leases = 0, waiting = 0 }, counts(pool))
  end, 30)

  it("waits in a timer and is woken by a request", function()
    local pool = app.plain_pool("timer", { max_live = 1 })
    local a = assert(pool:acquire())
    local res
    ngx.timer.at(0, function()
      local l, code = pool:acquire(nil, { timeout = 5 })
      res = l and "lease" or code
      if l then l:release() end
    end)
    assert.truthy(H.wait_until(function() return pool:stats().waiting == 1 end, 2))
    a:release()
    assert.are.equal("lease", H.wait_until(function() return res end, 2))
  end)

  it("a cancel token ends a waiter", function()
    local pool = app.plain_pool("cancel", { max_live = 1 })
    local a = assert(pool:acquire())
    local token = clientpool.token()
    local res
    local t = ngx.thread.spawn(function()
      local l, code = pool:acquire(nil, { cancel = token, timeout = 5 })
      res = l and "lease" or code
    end)
    ngx.sleep(0.01)
    token:cancel()
    ngx.thread.wait(t)
    assert.are.equal("cancelled", res)
    a:release()
    assert.are.same({ live = 1, idle = 1, leases = 0, waiting = 0 }, counts(pool))
  end)

  it("idle_timeout closes idle clients by the pool's timer", function()
    local pool, f = app.plain_pool("idle", { max_live = 2, idle_timeout = 0.05 })
    local l1, l2 = assert(pool:acquire()), assert(pool:acquire())
    l1:release(); l2:release()
    assert.are.equal(2, pool:stats().idle)
    assert.truthy(H.wait_until(function() return pool:stats().idle == 0 end, 2))
    assert.truthy(H.wait_until(function() return f.destroyed == 2 end, 2))
    assert.are.equal(2, pool:stats().closed_by.idle)
  end)
end)
