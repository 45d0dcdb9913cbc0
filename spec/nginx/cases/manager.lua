-- clientpool.ngx: keys, options, hooks (redis for the connections).
local H = require "harness"
local clientpool = require "clientpool"
local cpngx = require "clientpool.ngx"

local PEM_CERT = [[
-----BEGIN CERTIFICATE-----
MIIBfakecertificatefortestsonly
-----END CERTIFICATE-----
]]

describe("cpngx.key", function()
  it("derives readable keys from host, port, TLS, SNI, verify, certificate and parts", function()
    assert.are.equal("127.0.0.1:6379", cpngx.key { host = "127.0.0.1", port = 6379 })
    assert.are.equal("api.example.com:443|tls|sni=api.example.com|verify",
      cpngx.key { host = "api.example.com", port = 443, ssl = true, server_name = "api.example.com",
                  ssl_verify = true })
    assert.are.equal("unix:/run/redis.sock|u=db1",
      cpngx.key { host = "unix:/run/redis.sock", parts = "db1" })
    assert.are.equal("h:1|u=alice|u=2", cpngx.key { host = "h", port = 1, parts = { "alice", 2 } })
  end)

  it("gives different keys to different identities", function()
    local base = { host = "h.example", port = 443, ssl = true, server_name = "h.example", ssl_verify = true }
    local function with(k, v)
      local t = {}
      for a, b in pairs(base) do t[a] = b end
      t[k] = v
      return cpngx.key(t)
    end
    local keys = {
      cpngx.key(base),
      with("port", 8443),
      with("server_name", "other.example"),
      with("ssl_verify", false),
      with("parts", "alice"),
      with("parts", "bob"),
      with("parts", { "a|b" }),
      with("parts", { "a", "b" }),
      with("client_cert_id", nil),
      cpngx.key { host = "h.example", port = 443 },
      cpngx.key { host = "h.example", port = 443, ssl = true },
    }
    keys[#keys + 1] = cpngx.key { host = "h.example", port = 443, ssl = true, client_cert = PEM_CERT,
                                  client_priv_key = "KEY" }
    keys[#keys + 1] = cpngx.key { host = "h.example", port = 443, ssl = true, client_cert = PEM_CERT .. "x",
                                  client_priv_key = "KEY" }
    local seen = {}
    for i, k in ipairs(keys) do
      if i ~= 9 then -- with("client_cert_id", nil) is base itself
        assert.is_nil(seen[k], "two identities share key " .. k)
        seen[k] = true
      end
    end
    assert.are.equal(keys[1], keys[9])
  end)

  it("parses back what it made", function()
    local o = { host = "a|b%c", port = 1, ssl = true, server_name = "s|n", ssl_verify = true,
                parts = { "x|y", "%7C" } }
    local p = assert(cpngx.parse(cpngx.key(o)))
    assert.are.same({ host = "a|b%c", port = 1, ssl = true, server_name = "s|n", ssl_verify = true,
                      parts = { "x|y", "%7C" } }, p)
    assert.is_nil((cpngx.parse("nonsense")))
  end)

  it("names a certificate by its md5 or a given id, never two certificates by one id", function()
    local k = cpngx.key { host = "h", port = 1, ssl = true, client_cert = PEM_CERT, client_priv_key = "K" }
    assert.are.equal("h:1|tls|cert=" .. ngx.md5(PEM_CERT), k)
    assert.are.equal("h:1|tls|cert=svc",
      cpngx.key { host = "h", port = 1, ssl = true, client_cert = PEM_CERT, client_priv_key = "K",
                  client_cert_id = "svc" })
    -- the id alone, once registered
    assert.are.equal("h:1|tls|cert=svc", cpngx.key { host = "h", port = 1, ssl = true, client_cert_id = "svc" })
    assert.has_error(function()
      cpngx.key { host = "h", port = 1, ssl = true, client_cert = PEM_CERT .. "other", client_priv_key = "K",
                  client_cert_id = "svc" }
    end, "clientpool.ngx: key(): client_cert_id 'svc' names another certificate already")
  end)

  it("refuses bad parameters, naming them", function()
    local cases = {
      { {}, "'host' must be a non-empty string" },
      { { host = "h" }, "'port' must be an integer in 1..65535" },
      { { host = "h", port = 70000 }, "'port' must be an integer in 1..65535" },
      { { host = "unix:/x", port = 1 }, "'port' must be nil for a unix socket" },
      { { host = "h", port = 1, server_name = "h" }, "'server_name' needs ssl = true" },
      { { host = "h", port = 1, ssl_verify = true }, "'ssl_verify' needs ssl = true" },
      { { host = "h", port = 1, ssl = "yes" }, "'ssl' must be a boolean" },
      { { host = "h", port = 1, ssl = true, client_cert = PEM_CERT }, "go together" },
      { { host = "h", port = 1, ssl = true, client_cert_id = "nope" }, "unknown client_cert_id 'nope'" },
      { { host = "h", port = 1, parts = { {} } }, "'parts' item 1 must be a string" },
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(function() local k = cpngx.key(c[1]); return k end)
      assert.is_false(ok)
      assert.matches(c[2], err, 1, true)
      assert.matches("manager%.lua:%d+: clientpool%.ngx: key%(%): ", err) -- raised at the caller
    end
  end)
end)

describe("cpngx.tcp", function()
  it("fills in the hooks and passes the pool options through", function()
    local opts, mgr = cpngx.tcp { host = "127.0.0.1", port = 6379, connect_timeout = 1, max_live = 8,
                                  max_idle = 4, idle_timeout = 30 }
    for _, h in ipairs { "create", "destroy", "park", "unpark" } do assert.is_function(opts[h]) end
    assert.are.equal(8, opts.max_live)
    assert.are.equal(4, opts.max_idle)
    assert.are.equal(30, opts.idle_timeout)
    assert.is_nil(opts.host)
    assert.is_nil(opts.connect_timeout)
    assert.are.equal(mgr, cpngx.manager(opts))
    assert.are.equal(mgr.stats, cpngx.stats(opts))
    assert.matches("^clientpool#%d+#127%.0%.0%.1:6379$", mgr.name())
    -- clientpool.new takes it as is
    local pool = clientpool.new(opts)
    pool:close()
  end)

  it("gives each manager its own nginx pools", function()
    local _, m1 = cpngx.tcp { host = "127.0.0.1", port = 6379, max_live = 1 }
    local _, m2 = cpngx.tcp { host = "127.0.0.1", port = 6379, max_live = 1 }
    assert.are_not.equal(m1.name(), m2.name())
    assert.are.equal(m1.prefix .. "a:1|tls", m1.name(cpngx.key { host = "a", port = 1, ssl = true }))
  end)

  it("refuses hooks it fills in and bad connection options", function()
    assert.has_error(function() cpngx.tcp { host = "h", port = 1, max_live = 1, create = print } end,
      "clientpool.ngx: tcp() fills in 'create' itself (use on_connect or validate)")
    assert.has_error(function() cpngx.tcp { host = "h", port = 1, max_live = 1, connect_timeout = 0 } end,
      "clientpool.ngx: tcp(): 'connect_timeout' must be a finite number of seconds > 0, got 0")
    assert.has_error(function() cpngx.tcp { port = 1, max_live = 1 } end,
      "clientpool.ngx: tcp(): 'port' without 'host' (give the identity in cpngx.key{...} instead)")
    -- pool options are clientpool.new's to check
    local opts = cpngx.tcp { host = "h", port = 1, max_live = 1, max_idel = 1 }
    assert.has_error(function() clientpool.new(opts) end, "clientpool: unknown option 'max_idel'")
  end)

  it("acquires by key when tcp() has no host", function()
    local opts, mgr = cpngx.tcp { connect_timeout = 1, max_live = 2, scheduler = "ngx" }
    local pool = clientpool.new(opts)
    local key = cpngx.key { host = "127.0.0.1", port = H.conf.redis_port }
    local l = assert(pool:acquire(key))
    assert.are.equal("PONG", H.command(l.client, "PING"))
    l:release()
    local l2 = assert(pool:acquire(key))
    assert.is_true(l2.client:getreusedtimes() > 0)
    l2:release()
    -- no default key without a host
    local lease, code, err = pool:acquire()
    assert.is_nil(lease)
    assert.are.equal("create", code)
    assert.matches("no host given to tcp()", err, 1, true)
    assert.are.equal(1, mgr.stats.connects)
    assert.are.equal(1, mgr.stats.reuses)
    pool:close()
  end)

  it("a failed connect is a create failure with the address", function()
    local opts = cpngx.tcp { host = "127.0.0.1", port = 1, connect_timeout = 1, max_live = 1 }
    local pool = clientpool.new(opts)
    local lease, code, err = pool:acquire()
    assert.is_nil(lease)
    assert.are.equal("create", code)
    assert.matches("connect to 127.0.0.1:1: connection refused", err, 1, true)
    assert.are.equal(0, pool:stats().live)
  end)

  it("on_connect runs once per new connection and can refuse it", function()
    local calls = 0
    local opts, mgr = cpngx.tcp {
      host = "127.0.0.1", port = H.conf.redis_port, max_live = 1,
      on_connect = function(sock)
        calls = calls + 1
        return H.command(sock, "CLIENT", "SETNAME", "cp-onconnect")
      end,
    }
    local pool = clientpool.new(opts)
    for _ = 1, 3 do
      local l = assert(pool:acquire())
      assert.are.equal("cp-onconnect", H.command(l.client, "CLIENT", "GETNAME"))
      l:release()
    end
    assert.are.equal(1, calls)
    assert.are.equal(1, mgr.stats.connects)
    pool:close()
    local bad = clientpool.new((cpngx.tcp { host = "127.0.0.1", port = H.conf.redis_port, max_live = 1,
                                            on_connect = function() return nil, "AUTH failed" end }))
    local lease, code, err = bad:acquire()
    assert.is_nil(lease)
    assert.are.equal("create", code)
    assert.are.equal("on_connect: AUTH failed", err)
  end)

  it("validate sees the unparked socket; a failed validate closes it and the caller looks again", function()
    local fail_next = false
    local opts, mgr = cpngx.tcp {
      host = "127.0.0.1", port = H.conf.redis_port, max_live = 2,
      validate = function(sock)
        if fail_next then fail_next = false; return false end
        return H.command(sock, "PING") == "PONG"
      end,
    }
    local pool = clientpool.new(opts)
    local l = assert(pool:acquire())
    l:release()
    fail_next = true
    local l2 = assert(pool:acquire())        -- the idle one fails validate: a new connection
    assert.are.equal(0, l2.client:getreusedtimes())
    l2:release()
    local s = pool:stats()
    assert.are.equal(1, s.closed_by.invalid)
    assert.are.equal(1, s.live)
    assert.are.equal(2, mgr.stats.connects)
    assert.truthy(H.wait_until(function() return mgr.stats.closed == 1 end, 1))
    pool:close()
  end)

  it("release(false) closes the connection at once", function()
    local opts, mgr = cpngx.tcp { host = "127.0.0.1", port = H.conf.redis_port, max_live = 1,
                                  on_connect = function(s) return H.command(s, "CLIENT", "SETNAME", "cp-destroy") end }
    local pool = clientpool.new(opts)
    local r = assert(H.redis())
    local l = assert(pool:acquire())
    assert.are.equal(1, r:clients("cp-destroy"))
    l:release(false)
    assert.are.equal(1, mgr.stats.closed)
    assert.truthy(H.wait_until(function() return r:clients("cp-destroy") == 0 end, 1))
    assert.are.equal(0, pool:stats().live)
    r:close()
  end)

  it("unpark counts a parked connection nginx closed as lost, and opens a new one", function()
    local opts, mgr = cpngx.tcp { host = "127.0.0.1", port = H.conf.redis_port, max_live = 1,
                                  on_connect = function(s) return H.command(s, "CLIENT", "SETNAME", "cp-lost") end }
    local pool = clientpool.new(opts)
    assert(pool:acquire()):release()
    -- redis drops the parked connection; nginx notices and closes it
    local r = assert(H.redis())
    local id = assert(r:cmd("CLIENT", "LIST")):match("id=(%d+) [^\n]* name=cp%-lost ")
    assert.are.equal(1, r:cmd("CLIENT", "KILL", "ID", id))
    r:close()
    ngx.sleep(0.02)
    local l = assert(pool:acquire())
    assert.are.equal(0, l.client:getreusedtimes())
    assert.are.equal("PONG", H.command(l.client, "PING"))
    l:release()
    assert.are.equal(1, mgr.stats.lost)
    assert.are.equal(2, mgr.stats.connects)
    pool:close()
  end)

  it("an idle connection retired by the pool is taken out of nginx's pool and closed", function()
    local opts, mgr = cpngx.tcp { host = "127.0.0.1", port = H.conf.redis_port, max_live = 2,
                                  max_lifetime = 0.05,
                                  on_connect = function(s) return H.command(s, "CLIENT", "SETNAME", "cp-life") end }
    local pool = clientpool.new(opts)
    local r = assert(H.redis())
    assert(pool:acquire()):release()
    assert.are.equal(1, r:clients("cp-life"))
    assert.truthy(H.wait_until(function() return pool:stats().live == 0 end, 2))
    assert.truthy(H.wait_until(function() return r:clients("cp-life") == 0 end, 2))
    assert.are.equal(1, mgr.stats.closed_parked)
    r:close()
    pool:close()
  end)

  -- (issue 17: what a park or unpark without its pcall would have to rule
  -- out; docs/performance.md, "B5, issue 17")
  it("a lease released from another request (a timer) is retired: no slot, no error, a new connection next", function()
    local opts, mgr = cpngx.tcp { host = "127.0.0.1", port = H.conf.redis_port, max_live = 1 }
    local pool = clientpool.new(opts)
    local l = assert(pool:acquire())
    assert.are.equal("PONG", H.command(l.client, "PING"))
    local done, rel_ok, rel_err
    assert(ngx.timer.at(0, function()
      -- setkeepalive raises "bad request" on another request's socket
      rel_ok, rel_err = pcall(l.release, l)
      done = true
    end))
    assert.truthy(H.wait_until(function() return done end, 2))
    assert.is_true(rel_ok, tostring(rel_err))
    local s = pool:stats()
    assert.are.equal(0, s.leases)
    assert.are.equal(0, s.idle)
    assert.are.equal(1, mgr.stats.park_failed)
    assert.are.equal(0, mgr.stats.parked)
    local l2 = assert(pool:acquire())
    assert.are.equal("PONG", H.command(l2.client, "PING"))
    l2:release()
    assert.are.equal(2, mgr.stats.connects)
    assert.are.equal(1, pool:stats().idle)
    pool:close()
  end)

  it("on_connect raising on a reconnect in unpark: the caller gets a connection, no slot leaks", function()
    local fail_next = false
    local opts, mgr = cpngx.tcp { host = "127.0.0.1", port = H.conf.redis_port, max_live = 1,
                                  on_connect = function(s)
                                    if fail_next then fail_next = false; error("boom") end
                                    return H.command(s, "CLIENT", "SETNAME", "cp-raise")
                                  end }
    local pool = clientpool.new(opts)
    assert(pool:acquire()):release()
    local r = assert(H.redis())
    local id = assert(r:cmd("CLIENT", "LIST")):match("id=(%d+) [^\n]* name=cp%-raise ")
    assert.are.equal(1, r:cmd("CLIENT", "KILL", "ID", id))
    ngx.sleep(0.02)
    fail_next = true
    -- unpark finds the parked connection gone, the new one's on_connect
    -- raises: the record is retired and the same caller creates
    local l = assert(pool:acquire())
    assert.are.equal("PONG", H.command(l.client, "PING"))
    l:release()
    local s = pool:stats()
    assert.are.equal(1, s.live)
    assert.are.equal(0, s.leases)
    assert.are.equal(3, mgr.stats.connects)
    assert.truthy(H.wait_until(function() return r:clients("cp-raise") == 1 end, 2))
    r:close()
    pool:close()
  end)
end)
