-- Phases: acquire waits only where a light thread can yield; try_acquire,
-- release and close work in every phase.
local H = require "harness"
local clientpool = require "clientpool"
local cpngx = require "clientpool.ngx"
local app = require "app"
local dict = ngx.shared.spec

-- Runs fn(phase) in the location's phase; returns what it returned (as a string).
local function probe(phase, name, fn, content_fn)
  app.probes[name] = fn
  app.probes[name .. ":content"] = content_fn
  dict:delete(name)
  local status, body = H.http("/phase/" .. phase .. "?probe=" .. name)
  assert.are.equal(200, status, body)
  return H.wait_until(function() return dict:get(name) end, 2)
end

local function acquire_error(pool)
  return function()
    local ok, err = pcall(pool.acquire, pool)
    return ok and "returned" or err
  end
end

describe("acquire that must wait", function()
  local pool, held
  before_each(function()
    pool = app.plain_pool("phases", { max_live = 1 })
    held = assert(pool:acquire())
  end)
  after_each(function()
    held:release()
    pool:close()
  end)

  for _, phase in ipairs { "set", "log", "header_filter", "body_filter" } do
    it("fails at once in the " .. phase .. " phase, naming it", function()
      local t0 = H.now()
      local res = probe(phase, "wait_" .. phase, acquire_error(pool))
      assert.matches("clientpool: acquire would wait, but cannot wait in the " .. phase .. " phase", res, 1, true)
      assert.is_true(H.now() - t0 < 1)
      local s = pool:stats()
      assert.are.equal(0, s.waiting)
      assert.are.equal(1, s.leases)
    end)
  end

  it("fails at once in init_worker, naming it; try_acquire works there", function()
    assert.matches("cannot wait in the init_worker phase", dict:get("init_worker:acquire"), 1, true)
    assert.are.equal("lease", dict:get("init_worker:try_acquire"))
    assert.are.equal("1", dict:get("init_worker:release"))
    assert.are.equal("1", dict:get("init_worker:created"))
  end)

  it("waits in the access phase and is woken from this request", function()
    app.probes.wait_access = function()
      local l, code = pool:acquire(nil, { timeout = 5 })
      if not l then return code end
      l:release()
      return "lease"
    end
    dict:delete("wait_access")
    local th = ngx.thread.spawn(H.http, "/phase/access?probe=wait_access")
    assert.truthy(H.wait_until(function() return pool:stats().waiting == 1 end, 2))
    held:release()
    local _, status, body = ngx.thread.wait(th)
    assert.are.equal(200, status)
    assert.are.equal("lease\n", body)
    held = assert(pool:acquire())
  end)
end)

describe("in the log phase", function()
  it("acquire works when it need not wait", function()
    local pool = app.plain_pool("log_acq", { max_live = 2 })
    local res = probe("log", "log_acq", function()
      local l = assert(pool:acquire())
      local id = l.client.id
      l:release()
      return id
    end)
    assert.are.equal("1", res)
    assert.are.equal(1, pool:stats().idle)
  end)

  it("try_acquire, release, release(false) and close work", function()
    local pool, f = app.plain_pool("log_try", { max_live = 2 })
    assert(pool:acquire()):release() -- one idle client
    local res = probe("log", "log_try", function()
      local out = {}
      local a = pool:try_acquire()               -- the idle one
      out[#out + 1] = a and a.client.id or "nil"
      local b, code = pool:try_acquire()         -- a new one: create need not yield
      out[#out + 1] = b and b.client.id or tostring(code)
      local c, code2 = pool:try_acquire()        -- max_live reached
      out[#out + 1] = c and "lease" or tostring(code2)
      a:release()
      b:release(false)
      local s = pool:stats()
      out[#out + 1] = s.live .. "/" .. s.idle .. "/" .. s.leases
      pool:close()
      s = pool:stats()
      out[#out + 1] = s.live .. "/" .. s.idle
      return table.concat(out, " ")
    end)
    assert.are.equal("1 2 timeout 1/1/0 0/0", res)
    assert.truthy(H.wait_until(function() return f.destroyed == 2 end, 2))
    -- destroy hooks spawned in the log phase ran in timers
    assert.are.same({ "timer", "timer" }, f.destroyed_in)
  end)

  it("a lease from the content phase is released there", function()
    local pool = app.plain_pool("log_rel", { max_live = 1 })
    local res = probe("log", "log_rel", function()
      ngx.ctx.lease:release()
      local s = pool:stats()
      return s.idle .. "/" .. s.leases
    end, function()
      ngx.ctx.lease = assert(pool:acquire())
    end)
    assert.are.equal("1/0", res)
  end)
end)

describe("clientpool.ngx in the log phase", function()
  local function redis_pool(name, extra)
    local o = { host = "127.0.0.1", port = H.conf.redis_port, connect_timeout = 1, max_live = 2,
                scheduler = "ngx" }
    for k, v in pairs(extra or {}) do o[k] = v end
    local opts, mgr = cpngx.tcp(o)
    local pool = clientpool.new(opts)
    app.pools[name] = pool
    app.managers[name] = mgr
    return pool, mgr
  end

  it("a connection released in the log phase is retired (nginx closed it with its handler)", function()
    local pool, mgr = redis_pool("log_ngx_rel")
    local res = probe("log", "log_ngx_rel", function()
      ngx.ctx.lease:release()
      local s = pool:stats()
      return s.live .. "/" .. s.idle .. "/" .. s.leases
    end, function()
      local l = assert(pool:acquire())
      assert(H.command(l.client, "PING") == "PONG")
      ngx.ctx.lease = l
    end)
    assert.are.equal("0/0/0", res)
    assert.are.equal(1, mgr.stats.park_failed)
    pool:close()
  end)

  it("try_acquire gets a stand-in for a parked connection and leaves it parked", function()
    local pool, mgr = redis_pool("log_ngx_try")
    local l = assert(pool:acquire())
    assert.are.equal("PONG", H.command(l.client, "PING"))
    l:release()
    assert.are.equal(1, mgr.stats.parked)
    local res = probe("log", "log_ngx_try", function()
      local lease = assert(pool:try_acquire())
      local ok, err = pcall(function() return lease.client:send("PING\r\n") end)
      lease:release()
      local s = pool:stats()
      return tostring(ok) .. "|" .. tostring(err) .. "|" .. s.live .. "/" .. s.idle
    end)
    local ok, err, counts = res:match("^(.-)|(.-)|(.*)$")
    assert.are.equal("false", ok)
    assert.matches("cosockets are disabled there", err, 1, true)
    assert.matches("log phase", err, 1, true)
    assert.are.equal("1/1", counts)
    -- still parked in nginx's pool: the next acquire reuses it
    local l2 = assert(pool:acquire())
    assert.is_true(l2.client:getreusedtimes() > 0)
    l2:release()
    assert.are.equal(1, mgr.stats.connects)
    pool:close()
  end)

  it("try_acquire that must connect fails with create, naming the phase", function()
    local pool = redis_pool("log_ngx_create")
    local res = probe("log", "log_ngx_create", function()
      local lease, code, err = pool:try_acquire()
      return tostring(lease) .. "|" .. tostring(code) .. "|" .. tostring(err)
    end)
    assert.matches("^nil|create|.*cannot connect in the log phase", res)
    local s = pool:stats()
    assert.are.equal(0, s.live)
    assert.are.equal(0, s.creating)
    pool:close()
  end)

  it("close works in the log phase; the parked connection is closed", function()
    local pool, mgr = redis_pool("log_ngx_close")
    assert(pool:acquire()):release()
    local res = probe("log", "log_ngx_close", function()
      pool:close()
      local s = pool:stats()
      return s.live .. "/" .. s.idle
    end)
    assert.are.equal("0/0", res)
    local code = select(2, pool:acquire())
    assert.are.equal("closed", code)
    assert.truthy(H.wait_until(function() return mgr.stats.closed_parked == 1 end, 2))
  end)
end)
