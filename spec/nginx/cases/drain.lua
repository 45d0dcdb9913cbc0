-- Drain in a real nginx (issue 4): requests hold leases of a pool of
-- HTTP/1.1 keep-alive connections (clientpool.ngx) to a slow upstream
-- location of this nginx while another request, or a timer, drains the pool.
-- on_drain = "preserve": the request completes and drain() waits for it.
-- on_drain = { cancel = grace }: the lease's on_cancel fires grace seconds
-- after drain starts, and the request aborts (its reader is killed and its
-- connection destroyed) long before the upstream would have answered.
local H = require "harness"
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

-- Waits until n requests hold leases and the upstream serves all of them.
local function in_flight(pool, up, n)
  assert.truthy(H.wait_until(function() return pool:stats().leases == n and up.inflight == n end, 3),
                "requests not in flight")
end

describe("drain during in-flight requests", function()
  it("on_drain = \"preserve\" (drain from another request): the requests complete, drain returns after them", function()
    local up = app.upstream_state("dpres")
    local pool, mgr = app.http_pool("dpres", { max_live = 2, acquire_timeout = 10 })
    app.log["dpres:done"] = {}
    local reqs = {}
    for i = 1, 2 do reqs[i] = get("/app/http_get?pool=dpres&sleep=0.5&on_drain=preserve&tag=" .. i) end
    in_flight(pool, up, 2)
    local queued = get("/app/http_get?pool=dpres&tag=queued")     -- max_live 2: it waits
    assert.truthy(H.wait_until(function() return pool:stats().waiting == 1 end, 2))

    local t0 = sched.now()
    local drain = get("/app/drain?pool=dpres&timeout=5")
    assert.truthy(H.wait_until(function() return app.drain_started.dpres end, 2))
    -- admission stopped: the queued request and a new one get "closed"
    assert.matches("^err closed", join(queued))
    assert.matches("^err closed", join(get("/app/http_get?pool=dpres")))
    assert.are.equal(2, pool:stats().leases)         -- the leases stay with their requests

    for i = 1, 2 do assert.matches("^status 200 ", join(reqs[i])) end
    local body = join(drain)
    local took = tonumber(body:match("^drained true nil in ([%d.]+)"))
    assert.truthy(took, body)
    assert.is_true(sched.now() - t0 >= 0.3)
    -- drain returned after both requests were done
    local done = app.log["dpres:done"]
    assert.are.equal("drain", done[#done], table.concat(done, " "))
    assert.are.equal(3, #done)
    assert.are.equal(2, up.hits)
    -- their connections were closed at release, not parked
    local s = pool:stats()
    assert.are.equal(0, s.live)
    assert.are.equal(2, s.closed_by.drain)
    assert.are.equal(2, mgr.stats.closed)
    assert.are.equal(0, mgr.stats.parked)
  end, 30)

  it("on_drain = { cancel = 0.3 } (drain from a timer): on_cancel fires 0.3 s after drain starts, the requests abort",
  function()
    local up = app.upstream_state("dcan")
    local pool, mgr = app.http_pool("dcan", { max_live = 2 })
    local reqs = {}
    for i = 1, 2 do reqs[i] = get("/app/http_get?pool=dcan&sleep=5&on_drain=cancel:0.3&tag=" .. i) end
    in_flight(pool, up, 2)

    local res
    ngx.timer.at(0, function()
      local t0 = sched.now()
      app.drain_started.dcan = t0
      local ok, code = pool:drain(10)
      res = { ok = ok, code = code, took = sched.now() - t0 }
    end)
    for i = 1, 2 do
      local body = join(reqs[i])
      local after = tonumber(body:match("^aborted cancel_after=([%d.]+)"))
      assert.truthy(after, body)
      assert.is_true(after >= 0.3 and after < 2, body)    -- at the grace, not at the upstream's answer
    end
    assert.truthy(H.wait_until(function() return res end, 3))
    assert.is_true(res.ok, tostring(res.code))
    assert.is_true(res.took >= 0.3 and res.took < 2, "drain took " .. res.took)
    local s = pool:stats()
    assert.are.equal(0, s.live)
    assert.are.equal(0, s.leases)
    local by = {}
    for k, v in pairs(s.closed_by) do if v > 0 then by[k] = v end end
    assert.are.same({ error = 2 }, by)              -- released with false: the connections are unusable
    -- their connections were closed (the upstream saw its clients go), not parked
    assert.truthy(H.wait_until(function() return up.aborted == 2 end, 2))
    assert.are.equal(0, up.inflight)
    assert.are.equal(0, mgr.stats.parked)
  end, 30)

  it("both policies in one drain: the preserved request completes, the cancelled one aborts at its grace", function()
    local up = app.upstream_state("dmix")
    local pool = app.http_pool("dmix", { max_live = 2 })
    app.log["dmix:done"] = {}
    local keep = get("/app/http_get?pool=dmix&sleep=0.6&tag=keep")                -- "preserve" by default
    local cut = get("/app/http_get?pool=dmix&sleep=5&on_drain=cancel:0.1&tag=cut")
    in_flight(pool, up, 2)
    local drain = get("/app/drain?pool=dmix&timeout=5")
    local cut_body = join(cut)
    assert.matches("^aborted cancel_after=0%.[1-9]", cut_body)
    assert.are.equal(1, pool:stats().leases)         -- the preserved request still runs
    assert.matches("^status 200 ", join(keep))
    assert.matches("^drained true nil in ", join(drain))
    assert.are.same({ "cut", "keep", "drain" }, app.log["dmix:done"])
    assert.are.equal(0, pool:stats().live)
  end, 30)
end)
