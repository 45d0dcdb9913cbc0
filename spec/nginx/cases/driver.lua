-- cpngx.driver{} with the real lua-resty-redis (Debian's lua-nginx-redis)
-- against the real redis-server: the driver object is lease.client, a
-- connection left subscribed is retired instead of parked, and the bare
-- driver's habits (set_keepalive(), close() on a leased object) leave no
-- connection the pool does not count (issue 15). Connections are named
-- (CLIENT SETNAME) and counted in CLIENT LIST; new connections are counted
-- by redis itself (INFO stats total_connections_received).
local H = require "harness"
local clientpool = require "clientpool"
local cpngx = require "clientpool.ngx"
local app = require "app"

local redis = H.resty_redis()

-- A pool of resty.redis objects whose connections redis sees named cp-<name>.
-- Pools made by a test, closed after it.
local made = {}
local function driver_pool(name, o)
  local pool, mgr = app.manager_pool(name, cpngx.driver, {
    preset = "redis", host = "127.0.0.1", port = H.conf.redis_port, connect_timeout = 1, read_timeout = 5,
    scheduler = "ngx", on_connect = function(red) return red:client("setname", "cp-" .. name) end,
  }, o)
  made[#made + 1] = pool
  return pool, mgr
end

-- The pool's counts (stats(); `retired`: closed_by.retired) and the
-- manager's (mgr.stats) named in `want` are as it says.
local function check_counts(pool, mgr, want)
  local s, have = pool:stats(), {}
  for k in pairs(want) do
    if k == "retired" then
      have[k] = s.closed_by.retired
    elseif s[k] ~= nil then
      have[k] = s[k]
    else
      have[k] = mgr.stats[k]
    end
  end
  assert.are.same(want, have)
end

local function total_connections(r)
  return r:info("stats", "total_connections_received")
end

-- n requests to /app/driver_cmd on pool `name`; returns the bodies that were not "ok ...".
local function requests(name, n, habit)
  local bad = {}
  for _ = 1, n do
    local status, body = H.http("/app/driver_cmd?pool=" .. name .. (habit and ("&habit=" .. habit) or ""))
    if status ~= 200 or not body:match("^ok ") then bad[#bad + 1] = tostring(status) .. " " .. tostring(body) end
  end
  return bad
end

describe("cpngx.driver with lua-resty-redis", function()
  local r   -- this spec's own connection to redis, to count what it sees

  before_each(function() r = assert(H.redis()) end)
  after_each(function()
    r:close()
    for i = #made, 1, -1 do
      made[i]:close()
      made[i] = nil
    end
  end)

  it("lease.client is the connected resty.redis object, reused across requests", function()
    local pool, mgr = driver_pool("drv", { max_live = 2 })
    local lease = assert(pool:acquire())
    local red = lease.client
    assert.are.equal(redis.new, getmetatable(red).__index.new)   -- a resty.redis object
    assert.are.equal(0, red:get_reused_times())
    assert.are.equal("OK", red:set("cp-drv:k", "v1"))
    assert.are.equal("v1", red:get("cp-drv:k"))
    lease:release()
    for i = 1, 5 do
      local l = assert(pool:acquire())
      assert.are.equal(i, l.client:get_reused_times())
      assert.are.equal("v1", l.client:get("cp-drv:k"))
      l:release()
    end
    assert.are.equal(1, r:clients("cp-drv"))
    assert.are.same({}, requests("drv", 10))
    assert.are.equal(1, r:clients("cp-drv"))
    check_counts(pool, mgr, { connects = 1, reuses = 15, opened = 1, live = 1 })
    pool:close()
    assert.truthy(H.wait_until(function() return r:clients("cp-drv") == 0 end, 2))
  end)

  it("DESIGN's form: new = redis.new, on_connect selects the database once per new connection", function()
    local selects = 0
    local popts, mgr = cpngx.driver {
      new = redis.new, host = "127.0.0.1", port = H.conf.redis_port, connect_timeout = 1, read_timeout = 2,
      on_connect = function(red)
        selects = selects + 1
        return red:select(1)
      end,
      max_live = 8, scheduler = "ngx",
    }
    local pool = clientpool.new(popts)
    made[#made + 1] = pool
    for _ = 1, 3 do
      local lease = assert(pool:acquire())
      local res = lease.client:set("cp-drv:db1", "in one")
      lease:release(res ~= nil)
    end
    assert.are.equal(1, selects)
    assert.are.equal(1, mgr.stats.connects)
    assert.are.equal(ngx.null, r:cmd("GET", "cp-drv:db1"))
    assert.are.equal("OK", r:cmd("SELECT", 1))
    assert.are.equal("in one", r:cmd("GET", "cp-drv:db1"))
  end)

  it("SUBSCRIBE then release: the connection is retired, the next 20 requests on that pool all succeed", function()
    local pool, mgr = driver_pool("sub", { max_live = 1, acquire_timeout = 5 })
    local lease = assert(pool:acquire())
    assert.truthy(lease.client:subscribe("cp-drv-channel"))
    lease:release()                       -- set_keepalive refuses: "subscribed state"
    check_counts(pool, mgr, { retired = 1, live = 0, park_failed = 1 })
    assert.truthy(H.wait_until(function() return r:clients("cp-sub") == 0 end, 2))
    assert.are.same({}, requests("sub", 20))
    assert.are.equal(1, r:clients("cp-sub"))
    check_counts(pool, mgr, { opened = 2, live = 1 })
  end)

  it("a habitual red:set_keepalive() before release: parked the pool's way, no new connection per request", function()
    local pool, mgr = driver_pool("habit", { max_live = 2 })
    assert.are.same({}, requests("habit", 1))
    local before = total_connections(r)
    local bad = {}
    for _ = 1, 50 do
      local status, body = H.http("/app/driver_cmd?pool=habit&habit=keepalive")
      -- the caller sees what the bare driver says: 1
      if status ~= 200 or not body:match("^ok reused=%d+ habit=1 nil\n") then bad[#bad + 1] = body end
    end
    assert.are.same({}, bad)
    -- redis: no new connection (this spec's own sampler connection aside), one named
    assert.are.equal(before, total_connections(r))
    assert.are.equal(1, r:clients("cp-habit"))
    check_counts(pool, mgr, { habit_keepalive = 50, connects = 1, opened = 1, reused = 50, live = 1, idle = 1 })
  end)

  it("set_keepalive() then release(false): the connection it parked is taken back and closed", function()
    local pool, mgr = driver_pool("habitd", { max_live = 2 })
    local lease = assert(pool:acquire())
    assert.are.equal(1, lease.client:set_keepalive(10000, 100))
    lease:release(false)
    assert.truthy(H.wait_until(function() return r:clients("cp-habitd") == 0 end, 2))
    check_counts(pool, mgr, { closed_parked = 1, live = 0 })
  end)

  it("set_keepalive() while subscribed: the driver's refusal, and the release retires it", function()
    local pool = driver_pool("habits", { max_live = 1 })
    local lease = assert(pool:acquire())
    assert.truthy(lease.client:subscribe("cp-drv-channel"))
    local ok, err = lease.client:set_keepalive(10000, 100)
    assert.is_nil(ok)
    assert.are.equal("subscribed state", err)
    lease:release()
    assert.are.equal(1, pool:stats().closed_by.retired)
    assert.truthy(H.wait_until(function() return r:clients("cp-habits") == 0 end, 2))
    assert.are.same({}, requests("habits", 3))
  end)

  it("a habitual red:close() before release: closed and retired, counted; nothing left open", function()
    local pool, mgr = driver_pool("habitc", { max_live = 2 })
    local before = total_connections(r)
    assert.are.same({}, requests("habitc", 5, "close"))
    assert.are.equal(before + 5, total_connections(r))    -- what the caller asked for: one each
    check_counts(pool, mgr, { habit_close = 5, opened = 5, retired = 5, live = 0 })
    assert.truthy(H.wait_until(function() return r:clients("cp-habitc") == 0 end, 2))
  end)

  it("a lease dropped after set_keepalive(): the collector's leak destroy takes its connection back", function()
    local pool, mgr = driver_pool("habitl", { max_live = 2 })
    local function drop()
      local lease = assert(pool:acquire())
      assert.are.equal(1, lease.client:set_keepalive(10000, 100))
    end
    drop()
    assert.are.equal(1, r:clients("cp-habitl"))          -- parked in nginx's pool, its record still leased
    assert.truthy(H.wait_until(function()
      collectgarbage()
      collectgarbage()
      return pool:stats().leaked == 1
    end, 2))
    assert.truthy(H.wait_until(function() return r:clients("cp-habitl") == 0 end, 2))
    check_counts(pool, mgr, { closed_parked = 1, live = 0 })
  end)

  it("acquires by key: cpngx.key with a database, the preset SELECTs it on new connections", function()
    local popts, mgr = cpngx.driver { preset = "redis", connect_timeout = 1, max_live = 4, scheduler = "ngx" }
    local pool = clientpool.new(popts)
    made[#made + 1] = pool
    local k2 = mgr.key { host = "127.0.0.1", port = H.conf.redis_port, database = 2 }
    local k3 = cpngx.key { host = "127.0.0.1", port = H.conf.redis_port, database = 3 }
    assert.are.equal("127.0.0.1:" .. H.conf.redis_port .. "|db=2", k2)
    for _, k in ipairs { k2, k3, k2 } do
      local lease = assert(pool:acquire(k))
      assert.are.equal("OK", lease.client:set("cp-drv:which", k))
      lease:release()
    end
    assert.are.equal(2, mgr.stats.connects)
    assert.are.equal("OK", r:cmd("SELECT", 2))
    assert.are.equal(k2, r:cmd("GET", "cp-drv:which"))
    assert.are.equal("OK", r:cmd("SELECT", 3))
    assert.are.equal(k3, r:cmd("GET", "cp-drv:which"))
  end)
end)

describe("cpngx.driver options", function()
  it("keys carry user and database, and a password only as a salted hash", function()
    local a = cpngx.key { host = "h", port = 1, user = "alice", database = 1, password = "s3cret" }
    local b = cpngx.key { host = "h", port = 1, user = "alice", database = 1, password = "other" }
    assert.are_not.equal(a, b)
    assert.is_nil(a:find("s3cret", 1, true))
    assert.matches("^h:1|user=alice|db=1|pw=%x+$", a)
    local p = assert(cpngx.parse(a))
    assert.are.equal("alice", p.user)
    assert.are.equal("1", p.database)
    assert.are.equal(a, cpngx.key { host = "h", port = 1, user = "alice", database = "1", password = "s3cret" })
    -- a user part that looks like ours stays a user part
    assert.are_not.equal(cpngx.key { host = "h", port = 1, database = 1 },
                         cpngx.key { host = "h", port = 1, parts = "db=1" })
  end)

  it("refuses what it cannot do, naming it", function()
    local function err_of(o)
      local ok, e = pcall(cpngx.driver, o)
      assert.is_false(ok)
      return e
    end
    assert.matches("clientpool.ngx: driver%(%): unknown preset 'mongo'",
      err_of { preset = "mongo", host = "h", port = 1, max_live = 1 })
    assert.matches("'new' must be the driver's constructor",
      err_of { host = "h", port = 1, max_live = 1 })
    assert.matches("connect_options.pool: clientpool names and sizes nginx's pool itself",
      err_of { new = redis.new, connect_options = { pool = "x" }, host = "h", port = 1, max_live = 1 })
    assert.matches("user/password/database need a preset or a 'connect' function",
      err_of { new = redis.new, host = "h", port = 1, password = "x", max_live = 1 })
    assert.matches("preset 'redis': 'database' must be an integer",
      err_of { preset = "redis", host = "h", port = 1, database = "main", max_live = 1 })
    assert.matches("preset 'mysql' needs resty.mysql",
      err_of { preset = "mysql", host = "h", port = 3306, max_live = 1 })
    assert.matches("driver%(%) fills in 'park' itself",
      err_of { preset = "redis", host = "h", port = 1, max_live = 1, park = print })
    if (tonumber(redis._VERSION) or 0) < 0.28 then
      -- Debian's 0.27 ignores ssl: refused rather than connect in clear, whichever way it is given
      assert.matches("ssl needs lua-resty-redis 0.28 or later",
        err_of { preset = "redis", host = "127.0.0.1", port = H.conf.redis_port, ssl = true, max_live = 1 }, 1, true)
      local pool = clientpool.new((cpngx.driver { preset = "redis", new = redis.new, host = "127.0.0.1",
                                                  port = H.conf.redis_port, ssl = true, max_live = 1 }))
      local lease, code, cerr = pool:acquire()
      assert.is_nil(lease)
      assert.are.equal("create", code)
      assert.matches("ssl needs lua-resty-redis 0.28 or later", cerr, 1, true)
    end
    local ok, e = pcall(cpngx.tcp, { host = "h", port = 1, password = "x", max_live = 1 })
    assert.is_false(ok)
    assert.matches("tcp() does not log in", e, 1, true)
  end)
end)
