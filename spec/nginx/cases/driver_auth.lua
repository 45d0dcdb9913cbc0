-- cpngx.driver{ preset = "redis" } logs in on new connections only: AUTH
-- (redis with requirepass) and SELECT, through the real lua-resty-redis.
-- The redis here is the second one (spec/nginx/faultctl.sh starts it), with
-- `CONFIG SET requirepass`; redis itself counts the AUTH and SELECT calls
-- (INFO commandstats) and the connections (total_connections_received).
local H = require "harness"
local clientpool = require "clientpool"
local cpngx = require "clientpool.ngx"

local PASSWORD = "s3cret-for-spec"

if not H.conf.redis2_port then
  pending("AUTH/SELECT through the driver: run.sh starts no faultctl.sh (no redis2_port)")
  return
end

local function admin()
  return assert(H.redis(H.conf.redis2_port, PASSWORD))
end

-- calls=<n> of INFO commandstats for cmd (0 when never called).
local function calls(r, cmd)
  local info = assert(r:cmd("INFO", "commandstats"))
  return tonumber(info:match("cmdstat_" .. cmd .. ":calls=(%d+)")) or 0
end

describe("AUTH and SELECT through cpngx.driver", function()
  local pools = {}
  local function pool_of(o)
    local opts = { preset = "redis", host = "127.0.0.1", port = H.conf.redis2_port, connect_timeout = 1,
                   read_timeout = 2, max_live = 2, scheduler = "ngx" }
    for k, v in pairs(o) do opts[k] = v end
    local popts, mgr = cpngx.driver(opts)
    local pool = clientpool.new(popts)
    pools[#pools + 1] = pool
    return pool, mgr
  end

  before_each(function()
    assert.are.equal("up", H.fault("start"))
    local r = assert(H.redis(H.conf.redis2_port))
    assert.are.equal("OK", r:cmd("CONFIG", "SET", "requirepass", PASSWORD))
    r:close()
    r = admin()
    assert.are.equal("OK", r:cmd("CONFIG", "RESETSTAT"))
    r:close()
  end)

  after_each(function()
    for _, p in ipairs(pools) do p:close() end
    pools = {}
    H.fault("kill")
  end)

  it("on new connections only: 20 requests, one AUTH and one SELECT; again after redis drops the connection", function()
    local pool, mgr = pool_of { password = PASSWORD, database = 3 }
    local r = admin()
    local opened0 = r:info("stats", "total_connections_received")
    for i = 1, 20 do
      local lease = assert(pool:acquire())
      assert.are.equal("OK", lease.client:set("cp-auth:" .. i, i))
      lease:release()
    end
    assert.are.equal(2, calls(r, "auth"))                  -- the pool's one, and this admin connection's
    assert.are.equal(1, calls(r, "select"))
    assert.are.equal(opened0 + 1, r:info("stats", "total_connections_received"))
    assert.are.equal(1, mgr.stats.connects)
    -- the data is in database 3
    assert.are.equal(ngx.null, r:cmd("GET", "cp-auth:20"))
    assert.are.equal("OK", r:cmd("SELECT", 3))
    assert.are.equal("20", r:cmd("GET", "cp-auth:20"))
    -- redis drops the pooled connection: the next acquire opens a new one
    -- (the driver sees getreusedtimes() == 0) and logs in again
    assert.are.equal(1, r:cmd("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"))
    ngx.sleep(0.02)
    local lease = assert(pool:acquire())
    assert.are.equal(0, lease.client:get_reused_times())
    assert.are.equal("OK", lease.client:set("cp-auth:21", 21))
    assert.are.equal("21", lease.client:get("cp-auth:21"))
    lease:release()
    assert.are.equal(3, calls(r, "auth"))
    assert.are.equal(2, calls(r, "select") - 1)            -- one SELECT was this spec's own
    assert.are.equal(1, mgr.stats.lost)
    r:close()
  end)

  it("a wrong password: create fails with redis's error, nothing stays open", function()
    local pool = pool_of { password = "wrong" }
    local r = admin()
    local before = r:connected_clients()
    local lease, code, err = pool:acquire()
    assert.is_nil(lease)
    assert.are.equal("create", code)
    assert.matches("^AUTH: WRONGPASS", err)
    assert.truthy(H.wait_until(function() return r:connected_clients() == before end, 2))
    assert.are.equal(0, pool:stats().live)
    -- no password at all: the driver's first command fails (NOAUTH), the caller sees it
    local nopw = pool_of {}
    lease = assert(nopw:acquire())
    local ok, cerr = lease.client:get("k")
    assert.is_false(ok)                   -- a Redis error reply
    assert.matches("NOAUTH", cerr)
    lease:release(false)
    r:close()
  end)

  it("two databases through one manager by key: connections never mix", function()
    local pool, mgr = pool_of { password = PASSWORD }         -- the default key: database 0
    local keys = {}
    for db = 4, 5 do keys[db] = mgr.key { host = "127.0.0.1", port = H.conf.redis2_port, password = PASSWORD,
                                          database = db } end
    assert.is_nil(keys[4]:find(PASSWORD, 1, true))
    for _ = 1, 3 do
      for db = 4, 5 do
        local lease = assert(pool:acquire(keys[db]))
        assert.are.equal("OK", lease.client:set("cp-auth:db", db))
        lease:release()
      end
    end
    local r = admin()
    assert.are.equal("OK", r:cmd("SELECT", 4))
    assert.are.equal("4", r:cmd("GET", "cp-auth:db"))
    assert.are.equal("OK", r:cmd("SELECT", 5))
    assert.are.equal("5", r:cmd("GET", "cp-auth:db"))
    assert.are.equal(2, mgr.stats.connects)
    assert.are.equal(4, mgr.stats.reuses)
    r:close()
  end)
end)
