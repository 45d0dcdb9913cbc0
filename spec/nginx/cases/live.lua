-- Operating a live pool in a real nginx (issue 19): configure() from one
-- request changes what the next ones get; keepalive finds a parked
-- connection that nginx dropped (its peer, this nginx's own server side,
-- closed it after a short keepalive_timeout) before any request gets it;
-- keepalive with validate round-trips a parked connection (redis sees the
-- PING) and keeps it; a partial loss retires only the gone connections;
-- priorities across requests.
local H = require "harness"
local app = require "app"
local sched = require "clientpool.sched.ngx"

local function get(path)
  return ngx.thread.spawn(function() return H.http(path) end)
end

local function join(th)
  local ok, status, body = ngx.thread.wait(th)
  assert(ok, status)
  assert.are.equal(200, status, body)
  return body
end

local function waited(body)
  return tonumber(body:match("waited=([%d.]+)"))
end

describe("configure from a request", function()
  it("raises max_live for the next requests, and serves a queued one at once", function()
    local pool, f = app.plain_pool("live_cfg", { max_live = 1 })
    local holder = get("/app/acquire?pool=live_cfg&hold=2")
    assert.truthy(H.wait_until(function() return pool:stats().leases == 1 end, 2))
    assert.matches("^err timeout", join(get("/app/acquire?pool=live_cfg&timeout=0.05")))
    local queued = get("/app/acquire?pool=live_cfg&timeout=10")
    assert.truthy(H.wait_until(function() return pool:stats().waiting == 1 end, 2))
    local t0 = sched.now()
    assert.are.equal("ok\n", join(get("/app/configure?pool=live_cfg&max_live=3")))
    local body = join(queued)
    assert.matches("^ok ", body)
    assert.is_true(sched.now() - t0 < 1.5, body)          -- not after the holder's 2 s
    assert.is_true(waited(body) < 1.5, body)
    assert.matches("waited=0%.0", join(get("/app/acquire?pool=live_cfg&timeout=0.05")))
    assert.matches("^ok ", join(holder))
    assert.are.equal(3, pool._c.max_live)
    assert.is_true(f.created <= 3)
    pool:close()
  end, 30)

  it("a bad value from a request raises there and the next request sees the pool as it was", function()
    local pool = app.plain_pool("live_bad", { max_live = 2 })
    local body = join(get("/app/configure?pool=live_bad&max_live=4&max_idle=9"))
    assert.matches("^raised .*clientpool: option 'max_idle' %(9%) must be <= max_live %(4%)", body)
    body = join(get("/app/configure?pool=live_bad&capacity=2"))
    assert.matches("^raised .*option 'capacity' cannot change on a running pool", body)
    local h1 = get("/app/acquire?pool=live_bad&hold=0.5")
    local h2 = get("/app/acquire?pool=live_bad&hold=0.5")
    assert.truthy(H.wait_until(function() return pool:stats().leases == 2 end, 2))
    assert.matches("^err timeout", join(get("/app/acquire?pool=live_bad&timeout=0.05")))   -- still 2
    join(h1); join(h2)
    assert.are.equal(2, pool._c.max_live)
    pool:close()
  end, 30)

  it("lowers max_live under load: redis never sees more than the old cap, the new one after", function()
    local r = assert(H.redis())
    local pool = app.manager_pool("live_down", require("clientpool.ngx").tcp, {
      host = "127.0.0.1", port = H.conf.redis_port, scheduler = "ngx", max_live = 6,
      on_connect = function(s) return H.command(s, "CLIENT", "SETNAME", "cp-live-down") end,
    })
    local reqs = {}
    for i = 1, 12 do reqs[i] = get("/app/redis_ping?pool=live_down&hold=" .. (0.1 + (i % 3) * 0.1)) end
    assert.truthy(H.wait_until(function() return r:clients("cp-live-down") >= 6 end, 3))
    assert.are.equal("ok\n", join(get("/app/configure?pool=live_down&max_live=2")))
    for i = 1, 12 do
      assert.matches("^PONG", join(reqs[i]))
      assert.is_true(r:clients("cp-live-down") <= 6)
    end
    assert.truthy(H.wait_until(function() return r:clients("cp-live-down") <= 2 end, 3))
    for _ = 1, 6 do assert.matches("^PONG", join(get("/app/redis_ping?pool=live_down"))) end
    assert.is_true(r:clients("cp-live-down") <= 2)
    local s = pool:stats()
    assert.is_true(s.live <= 2)
    assert.is_true(s.closed_by.resized >= 1)
    pool:close()
    assert.truthy(H.wait_until(function() return r:clients("cp-live-down") == 0 end, 3))
    r:close()
  end, 30)
end)

describe("keepalive in nginx", function()
  it("finds a parked connection its server closed (keepalive_timeout 300ms) before any request gets it", function()
    local pool, mgr = app.http_pool("live_ka", { max_live = 2, keepalive = 0.6 })
    local l = assert(pool:acquire())
    local res = assert(app.http_request(l.client, "/short_keepalive"))
    assert.are.equal(200, res.status)
    l:release()                                            -- parked in nginx's pool
    assert.are.equal(1, pool:stats().idle)
    ngx.sleep(0.45)                                        -- the server closed it; nginx dropped it
    assert.are.equal(1, pool:stats().idle)                 -- the pool cannot know yet
    assert.truthy(H.wait_until(function() return pool:stats().keepalive_failed == 1 end, 3))
    local s = pool:stats()
    assert.are.equal(0, s.idle)
    assert.are.equal(1, s.closed_by.invalid)
    assert.are.equal(1, mgr.stats.keepalive_lost)
    -- the next request gets a new connection, and no request met the lost one
    l = assert(pool:acquire())
    res = assert(app.http_request(l.client, "/short_keepalive"))
    assert.are.equal(200, res.status)
    l:release()
    assert.are.equal(0, mgr.stats.lost)
    assert.are.equal(2, mgr.stats.connects)
    pool:close()
  end, 30)

  it("without keepalive the next request's unpark meets the lost connection (the control)", function()
    local pool, mgr = app.http_pool("live_noka", { max_live = 2 })
    local l = assert(pool:acquire())
    assert(app.http_request(l.client, "/short_keepalive"))
    l:release()
    ngx.sleep(0.45)
    l = assert(pool:acquire())
    assert.are.equal(0, l.client:getreusedtimes())         -- a new connection in its place
    l:release()
    assert.are.equal(1, mgr.stats.lost)
    pool:close()
  end, 30)

  it("with validate: a parked connection is taken, PINGed and parked again (redis sees the PING)", function()
    local r = assert(H.redis())
    local pings = 0
    local pool, mgr = app.manager_pool("live_kav", require("clientpool.ngx").tcp, {
      host = "127.0.0.1", port = H.conf.redis_port, scheduler = "ngx", max_live = 2, keepalive = 0.2,
      on_connect = function(s) return H.command(s, "CLIENT", "SETNAME", "cp-live-kav") end,
      validate = function(sock)
        pings = pings + 1
        return H.command(sock, "PING") == "PONG"
      end,
      validate_after_idle = 100,                           -- (no validate on reuse in this case)
    })
    local l = assert(pool:acquire())
    assert.are.equal("PONG", H.command(l.client, "PING"))
    l:release()
    -- (keepalive counts checks started; the second PING may still be on its way)
    assert.truthy(H.wait_until(function() return pool:stats().keepalive >= 2 and pings >= 2 end, 3))
    assert.is_true(pings >= 2)
    local list = assert(r:cmd("CLIENT", "LIST"))
    local line = list:match("[^\n]*name=cp%-live%-kav [^\n]*")
    assert.truthy(line, list)
    assert.matches("cmd=ping", line)
    assert.is_true(tonumber(line:match(" idle=(%d+)")) <= 1, line)
    local s = pool:stats()
    assert.are.equal(0, s.keepalive_failed)
    assert.are.equal(1, s.idle)
    assert.are.equal(1, mgr.stats.connects)                -- the same connection all along
    assert.are.equal(1, r:clients("cp-live-kav"))
    pool:close()
    assert.truthy(H.wait_until(function() return r:clients("cp-live-kav") == 0 end, 3))
    r:close()
  end, 30)

  it("a partial loss: one of two parked connections killed by redis, only one record goes", function()
    local r = assert(H.redis())
    local pool, mgr = app.manager_pool("live_kap", require("clientpool.ngx").tcp, {
      host = "127.0.0.1", port = H.conf.redis_port, scheduler = "ngx", max_live = 3, keepalive = 0.3,
      on_connect = function(s) return H.command(s, "CLIENT", "SETNAME", "cp-live-kap") end,
    })
    local a, b = assert(pool:acquire()), assert(pool:acquire())
    a:release(); b:release()
    assert.are.equal(2, r:clients("cp-live-kap"))
    local id = assert(r:cmd("CLIENT", "LIST")):match("id=(%d+) [^\n]* name=cp%-live%-kap ")
    assert.are.equal(1, r:cmd("CLIENT", "KILL", "ID", id))
    assert.truthy(H.wait_until(function() return pool:stats().keepalive >= 2 end, 3))
    ngx.sleep(0.1)
    local s = pool:stats()
    assert.are.equal(1, s.keepalive_failed)
    assert.are.equal(1, s.idle)
    assert.are.equal(1, mgr.stats.keepalive_lost)
    assert.are.equal(1, r:clients("cp-live-kap"))
    -- the checks go on without losing the one left
    ngx.sleep(0.4)
    s = pool:stats()
    assert.are.equal(1, s.keepalive_failed)
    assert.are.equal(1, s.idle)
    local l = assert(pool:acquire())
    assert.is_true(l.client:getreusedtimes() > 0)
    l:release()
    assert.are.equal(0, mgr.stats.lost)
    pool:close()
    assert.truthy(H.wait_until(function() return r:clients("cp-live-kap") == 0 end, 3))
    r:close()
  end, 30)
end)

describe("keepalive options of the managers", function()
  it("tcp{} passes keepalive on and fills in keepalive_check; driver{} takes a number as the pool's", function()
    local cpngx = require "clientpool.ngx"
    local opts = cpngx.tcp { host = "127.0.0.1", port = 1, max_live = 1, keepalive = 5 }
    assert.are.equal(5, opts.keepalive)
    assert.is_function(opts.keepalive_check)
    assert.has_error(function() cpngx.tcp { host = "h", port = 1, max_live = 1, keepalive_check = print } end,
      "clientpool.ngx: tcp() fills in 'keepalive_check' itself (use on_connect or validate)")
    local red = require("clientpool.ngx.drivers") and (pcall(require, "resty.redis") and require("resty.redis")
                or require("nginx.redis"))
    local d = cpngx.driver { new = red.new, host = "127.0.0.1", port = 1, max_live = 1, keepalive = 7 }
    assert.are.equal(7, d.keepalive)
    d = cpngx.driver { new = red.new, host = "127.0.0.1", port = 1, max_live = 1, keepalive = "set_keepalive" }
    assert.is_nil(d.keepalive)
  end)
end)

describe("priorities across requests", function()
  it("a queued high-priority acquisition goes before earlier low ones", function()
    local pool = app.plain_pool("live_prio", { max_live = 1 })
    local held = assert(pool:acquire())
    local order = {}
    local threads = {}
    local function queue(tag, prio)
      threads[#threads + 1] = ngx.thread.spawn(function()
        local l = assert(pool:acquire(nil, { priority = prio, timeout = 5 }))
        order[#order + 1] = tag
        ngx.sleep(0.01)
        l:release()
      end)
    end
    queue("low1", 0); queue("low2", 0); queue("high", 1)
    assert.truthy(H.wait_until(function() return pool:stats().waiting == 3 end, 2))
    held:release()
    for _, th in ipairs(threads) do ngx.thread.wait(th) end
    assert.are.same({ "high", "low1", "low2" }, order)
    pool:close()
  end, 30)
end)
