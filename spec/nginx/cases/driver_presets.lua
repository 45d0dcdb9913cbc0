-- The presets for drivers Debian does not ship (lua-resty-mysql,
-- lua-resty-http, pgmoon) against stand-ins of their documented call
-- shapes: each stand-in records what it was called with and keeps a real
-- cosocket to the private redis underneath, so nginx's pool, reuse and
-- park are real; the protocol is not (a PING stands for the login). What
-- this proves is the plumbing (connect signature, options, method names,
-- reused times); the real drivers stay untested here (docs/managers.md).
local H = require "harness"
local clientpool = require "clientpool"
local cpngx = require "clientpool.ngx"

-- A stand-in driver module. shape.connect(self, ...) returns host, port,
-- { pool = ..., pool_size = ... } from the driver's own arguments;
-- shape.keepalive, shape.close, shape.timeout: its method names.
local function standin(shape)
  local M = { seen = {}, logins = 0 }
  local mt = { __index = M }
  function M.new(config)
    local self = setmetatable({ sock = ngx.socket.tcp(), config = config }, mt)
    M.seen.new = config
    return self
  end
  M[shape.timeout] = function(self, ms)
    M.seen.timeouts = (M.seen.timeouts or 0) + 1
    self.sock:settimeout(ms)
  end
  function M.connect(self, ...)
    M.seen.connect = { ... }
    local host, port, popts = shape.connect(self, ...)
    M.seen.popts = popts
    local ok, err = self.sock:connect(host, port, popts)
    if not ok then return nil, err end
    if self.sock:getreusedtimes() == 0 then
      M.logins = M.logins + 1                   -- the driver's own login, on a new connection
      if H.command(self.sock, "PING") ~= "PONG" then return nil, "login failed" end
    end
    return 1
  end
  M[shape.keepalive] = function(self, ...) return self.sock:setkeepalive(...) end
  M[shape.close] = function(self) return self.sock:close() end
  function M.get_reused_times(self) return self.sock:getreusedtimes() end
  return M
end

-- Two acquire/release cycles on one pool; returns the manager's stats.
local function two_cycles(o)
  local opts, mgr = cpngx.driver(o)
  local pool = clientpool.new(opts)
  for _ = 1, 2 do
    local lease = assert(pool:acquire())
    assert.are.equal("PONG", H.command(lease.client.sock, "PING"))
    lease:release()
  end
  pool:close()
  return mgr
end

local PORT = H.conf.redis_port

describe("driver presets against stand-ins of their documented shapes", function()
  it("mysql: db:connect{ host, port, user, password, database, pool, pool_size, ... }, set_timeout", function()
    local mysql = standin {
      timeout = "set_timeout", keepalive = "set_keepalive", close = "close",
      connect = function(_, t) return t.host, t.port, { pool = t.pool, pool_size = t.pool_size } end,
    }
    local mgr = two_cycles { preset = "mysql", new = mysql.new, host = "127.0.0.1", port = PORT,
                             user = "app", password = "pw", database = "shop", connect_timeout = 1,
                             read_timeout = 2, connect_options = { charset = "utf8mb4" },
                             max_live = 2, scheduler = "ngx" }
    local t = mysql.seen.connect[1]
    assert.are.equal(1, #mysql.seen.connect)               -- one table
    assert.are.same({ host = "127.0.0.1", port = PORT, user = "app", password = "pw", database = "shop",
                      charset = "utf8mb4", pool = mgr.name(), pool_size = 2 }, t)
    assert.are.equal(1, mysql.logins)
    assert.are.equal(1, mgr.stats.connects)
    assert.are.equal(1, mgr.stats.reuses)
    assert.are.equal(4, mysql.seen.timeouts)               -- connect, then read: per acquire
    assert.matches("|user=app|db=shop|pw=%x+$", mgr.name())
  end)

  it("http: httpc:connect{ scheme, host, port, pool, pool_size, ssl_server_name, ssl_verify }", function()
    local http = standin {
      timeout = "set_timeouts", keepalive = "set_keepalive", close = "close",
      connect = function(_, t) return t.host, t.port, { pool = t.pool, pool_size = t.pool_size } end,
    }
    local mgr = two_cycles { preset = "http", new = http.new, host = "127.0.0.1", port = PORT,
                             max_live = 3, scheduler = "ngx" }
    assert.are.same({ scheme = "http", host = "127.0.0.1", port = PORT, pool = mgr.name(), pool_size = 3 },
                    http.seen.connect[1])
    assert.are.equal(1, mgr.stats.connects)
    -- TLS: the driver's handshake options from the key
    local opts = cpngx.driver { preset = "http", new = http.new, host = "127.0.0.1", port = PORT, ssl = true,
                                server_name = "api.example", ssl_verify = true, max_live = 1 }
    assert.is_table(opts)
    local ok, err = pcall(cpngx.driver, { preset = "http", new = http.new, host = "h", port = 443, ssl = true,
                                          max_live = 1 })
    assert.is_false(ok)
    assert.matches("ssl = true needs ssl_verify = true or false", err, 1, true)
  end)

  it("pgmoon: pgmoon.new{ ..., pool_name, pool_size }, pg:connect(), keepalive, disconnect, settimeout", function()
    local pg = standin {
      timeout = "settimeout", keepalive = "keepalive", close = "disconnect",
      connect = function(self)
        local c = self.config
        return c.host, c.port, { pool = c.pool_name, pool_size = c.pool_size }
      end,
    }
    pg.get_reused_times = nil                               -- pgmoon has none: pg.sock:getreusedtimes()
    local mgr = two_cycles { preset = "pgmoon", new = pg.new, host = "127.0.0.1", port = PORT, user = "app",
                             password = "pw", database = "shop", max_live = 2, scheduler = "ngx" }
    assert.are.same({}, pg.seen.connect)                    -- pg:connect() takes nothing
    assert.are.same({ host = "127.0.0.1", port = PORT, user = "app", password = "pw", database = "shop",
                      socket_type = "nginx", pool_name = mgr.name(), pool_size = 2 }, pg.seen.new)
    assert.are.equal(1, pg.logins)
    assert.are.equal(1, mgr.stats.reuses)
    assert.are.equal(2, mgr.stats.parked)                   -- through pg:keepalive()
  end)

  it("a driver object without the methods a preset names: a create failure that says which", function()
    local bare = standin {
      timeout = "set_timeout", keepalive = "set_keepalive", close = "close",
      connect = function(_, host, port, popts) return host, port, popts end,
    }
    local pool = clientpool.new((cpngx.driver { preset = "pgmoon", new = bare.new, host = "127.0.0.1", port = PORT,
                                                max_live = 1, scheduler = "ngx" }))
    local lease, code, err = pool:acquire()
    assert.is_nil(lease)
    assert.are.equal("create", code)
    assert.matches("the driver object has no method 'keepalive'", err, 1, true)
  end)
end)
