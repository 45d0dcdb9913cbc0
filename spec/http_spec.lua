-- clientpool.http against a real nginx (spec/http_nginx.lua): connections
-- are counted in nginx's access log ($connection, $connection_requests),
-- never in the pool's own stats alone. lua-http runs on Lua 5.1 and LuaJIT
-- only; elsewhere the specs are pending with the reason. Each part's own
-- surface without a server: http_keys_spec, http_pool_spec,
-- http_request_spec, http_lib_spec, http_defaults_spec.

local H = require "spec.helpers"

describe("clientpool.http", function()
  local missing = H.lua_http_missing()
  if missing then
    pending("not run: " .. missing)
    return
  end
  local NGX = require "spec.http_nginx"
  if not NGX.have_nginx then
    pending("not run: no nginx with the Lua module")
    return
  end

  local clientpool = require "clientpool"
  local cphttp = require "clientpool.http"
  local cqueues = require "cqueues"
  local http_client = require "http.client"
  local http_headers = require "http.headers"
  local csched = require "clientpool.sched.cqueues"

  local srv
  setup(function()
    srv = assert(NGX.start())
  end)
  teardown(function()
    if srv then srv:stop() end
  end)

  -- A fresh controller and adapter; run(fn) runs fn in a task until every
  -- task is done, then closes the pools made and lets their destroys run.
  local function env()
    local cq = cqueues.new()
    local sched = csched.new(cq)
    local e = { cq = cq, sched = sched, pools = {} }
    function e.pool(o)
      o.scheduler = sched
      local opts, mgr = cphttp.pool(o)
      local p = clientpool.new(opts)
      e.pools[#e.pools + 1] = p
      return p, mgr
    end
    function e.run(fn)
      sched.spawn(fn)
      sched.run()
      for _, p in ipairs(e.pools) do p:close() end
      assert(cq:loop())
    end
    -- n tasks at once, each fn(i); returns when all are done
    function e.par(n, fn)
      local left = n
      local me = coroutine.running()
      for i = 1, n do
        sched.spawn(function()
          fn(i)
          left = left - 1
          if left == 0 then sched.wake(me) end
        end)
      end
      while left > 0 do sched.wait(me, nil) end
    end
    return e
  end

  local function url(port, path, scheme) return (scheme or "http") .. "://127.0.0.1:" .. port .. path end

  local tagn = 0
  local function tag()
    tagn = tagn + 1
    return "/t" .. tagn .. "x" .. math.random(1e6)
  end

  -- A plain lua-http GET on a connection (the control cases: no pool).
  local function raw_get(conn, authority, path, scheme)
    local s = conn:new_stream()
    local h = http_headers.new()
    h:append(":method", "GET"); h:append(":path", path)
    h:append(":scheme", scheme or "http"); h:append(":authority", authority)
    local ok, err = s:write_headers(h, true, 5)
    if not ok then return nil, err end
    local rh
    rh, err = s:get_headers(5)
    if not rh then return nil, err end
    local body
    body, err = s:get_body_as_string(5)
    if not body then return nil, err end
    return tonumber(rh:get(":status")), body
  end

  describe("HTTP/1.1 keep-alive", function()
    it("200 requests from 20 tasks share at most max_live connections, as nginx counts them", function()
      local e = env()
      local t = tag()
      local pool, mgr = e.pool { origin = url(srv.ports.keep, ""), max_live = 4 }
      local ok, failed = 0, {}
      e.run(function()
        e.par(20, function(i)
          for j = 1, 10 do
            local res, err = cphttp.request(pool, { path = t .. "/r" .. i .. "-" .. j })
            if res and res.status == 200 and res.body == "ok " .. t .. "/r" .. i .. "-" .. j .. "\n" then
              ok = ok + 1
            else
              failed[#failed + 1] = tostring(err)
            end
          end
        end)
      end)
      assert.same({}, failed)
      assert.equal(200, ok)
      local nconn, lines = srv:connections(t, 200)
      assert.equal(200, #lines)
      assert.is_true(nconn >= 1 and nconn <= 4, "nginx saw " .. nconn .. " connections")
      assert.equal(nconn, mgr.stats.connects)
      assert.equal(200 - nconn, mgr.stats.reused)
      assert.equal(0, mgr.stats.errors)
      -- each connection carried many requests, in order
      local most = 0
      for _, l in ipairs(lines) do if l.conn_requests > most then most = l.conn_requests end end
      assert.is_true(most >= 50, "most requests on one connection: " .. most)
    end)

    it("without the pool, the same 200 requests open 200 connections (control)", function()
      local e = env()
      local t = tag()
      local ok = 0
      e.run(function()
        e.par(20, function(i)
          for j = 1, 10 do
            local conn = assert(http_client.connect({ host = "127.0.0.1", port = srv.ports.keep, tls = false,
                                                      version = 1.1 }, 5))
            local st = raw_get(conn, "127.0.0.1", t .. "/r" .. i .. "-" .. j)
            if st == 200 then ok = ok + 1 end
            conn:close()
          end
        end)
      end)
      assert.equal(200, ok)
      assert.equal(200, (srv:connections(t, 200)))
    end)

    it("a stale keep-alive connection (closed by the server while idle) never fails a request", function()
      -- server keepalive_timeout 1 s, the pool's default idle_timeout 4 s
      local e = env()
      local t = tag()
      local pool, mgr = e.pool { origin = url(srv.ports.short, ""), max_live = 4 }
      local results = {}
      e.run(function()
        e.par(4, function(i)
          local res = cphttp.request(pool, { path = t .. "/slow?s=0.2&warm=" .. i })
          results[#results + 1] = res and res.status
        end)
        assert.equal(4, pool:stats().idle)
        NGX.sleep(1.6)                      -- nginx closes the four idle connections
        e.par(4, function(i)
          local res, err = cphttp.request(pool, { path = t .. "/after/" .. i })
          results[#results + 1] = res and res.status or err
        end)
      end)
      assert.same({ 200, 200, 200, 200, 200, 200, 200, 200 }, results)
      assert.equal(4, mgr.stats.server_idle_close)
      assert.equal(0, mgr.stats.errors)
      assert.equal(0, mgr.stats.server_stale)
      assert.equal(4, pool:stats().closed_by.invalid)
      -- each task looks again after a failed probe, so fewer than four new
      -- connections may serve the second round
      assert.is_true(mgr.stats.connects >= 5)
      assert.equal(mgr.stats.connects, (srv:connections(t, 8)))
    end)

    it("the same stale connections fail when reused as they are (control: the probe is what saves them)", function()
      local e = env()
      local t = tag()
      local conns, fails = {}, 0
      e.run(function()
        for i = 1, 4 do
          conns[i] = assert(http_client.connect({ host = "127.0.0.1", port = srv.ports.short, tls = false,
                                                  version = 1.1 }, 5))
          assert.equal(200, (raw_get(conns[i], "127.0.0.1", t .. "/warm" .. i)))
        end
        NGX.sleep(1.6)
        for i = 1, 4 do
          if not raw_get(conns[i], "127.0.0.1", t .. "/after" .. i) then fails = fails + 1 end
          conns[i]:close()
        end
      end)
      assert.equal(4, fails)
    end)

    it("a reused connection that fails before any response is retried once for an idempotent request", function()
      -- validate_after_idle skips the probe: the stale connection is used
      local e = env()
      local t = tag()
      local pool, mgr = e.pool { origin = url(srv.ports.short, ""), max_live = 1, validate_after_idle = 3600 }
      local got, post_err, post_code
      e.run(function()
        assert(cphttp.request(pool, { path = t .. "/a" }))
        NGX.sleep(1.6)
        got = assert(cphttp.request(pool, { path = t .. "/b" }))
        NGX.sleep(1.6)
        local res
        res, post_err, post_code = cphttp.request(pool, { method = "POST", path = t .. "/c", body = "x" })
        assert.is_nil(res)
      end)
      assert.equal(200, got.status)
      assert.is_false(got.reused)
      assert.equal(1, mgr.stats.retries)
      assert.equal(2, mgr.stats.server_stale)   -- the GET (then retried) and the POST (not retried)
      assert.equal("io", post_code)
      assert.is_string(post_err)
      assert.equal(0, mgr.stats.errors)
    end)

    it("Connection: close from the server is honoured: the connection is retired, not reused", function()
      local e = env()
      local t = tag()
      local pool, mgr = e.pool { origin = url(srv.ports.keep, ""), max_live = 2 }
      local r1, r2, r3
      e.run(function()
        r1 = assert(cphttp.request(pool, { path = t .. "/close" }))
        assert.equal(0, pool:stats().live)
        r2 = assert(cphttp.request(pool, { path = t .. "/next" }))
        r3 = assert(cphttp.request(pool, { path = t .. "/next2" }))
      end)
      assert.equal("close", r1.headers:get("connection"))
      assert.equal(1, mgr.stats.server_close)
      assert.equal(1, pool:stats().closed_by.retired)
      assert.equal(0, pool:stats().closed_by.error)
      assert.is_false(r2.reused)
      assert.is_true(r3.reused)
      local n, lines = srv:connections(t, 3)
      assert.equal(2, n)
      assert.equal(1, lines[1].conn_requests)
      assert.are_not.equal(lines[1].conn, lines[2].conn)
      assert.equal(lines[2].conn, lines[3].conn)
    end)

    it("Connection: close asked by the request retires the connection too", function()
      local e = env()
      local t = tag()
      local pool, mgr = e.pool { origin = url(srv.ports.keep, ""), max_live = 1 }
      e.run(function()
        assert(cphttp.request(pool, { path = t .. "/a", headers = { Connection = "close" } }))
        assert(cphttp.request(pool, { path = t .. "/b" }))
      end)
      assert.equal(1, mgr.stats.client_close)
      assert.equal(2, (srv:connections(t, 2)))
    end)

    it("a server that closes after 3 requests (keepalive_requests) costs no request", function()
      local e = env()
      local t = tag()
      local pool, mgr = e.pool { origin = url(srv.ports.nreq, ""), max_live = 2 }
      local ok, live = 0, nil
      e.run(function()
        e.par(2, function(i)
          for j = 1, 5 do
            if cphttp.request(pool, { path = t .. "/" .. i .. "-" .. j }) then ok = ok + 1 end
          end
        end)
        live = pool:stats().live
      end)
      assert.equal(10, ok)
      local n, lines = srv:connections(t, 10)
      for _, l in ipairs(lines) do assert.is_true(l.conn_requests <= 3) end
      assert.is_true(n >= 4, n .. " connections")
      assert.equal(n, mgr.stats.connects)
      assert.equal(0, mgr.stats.errors)
      assert.equal(0, mgr.stats.server_stale)
      -- every connection but those left open ended with the server's Connection: close
      assert.equal(n - live, mgr.stats.server_close)
      assert.equal(n - live, pool:stats().closed_by.retired)
    end)

    it("max_requests retires a connection after that many requests", function()
      local e = env()
      local t = tag()
      local pool, mgr = e.pool { origin = url(srv.ports.keep, ""), max_live = 1, max_requests = 2 }
      e.run(function()
        for i = 1, 5 do assert(cphttp.request(pool, { path = t .. "/" .. i })) end
      end)
      local n, lines = srv:connections(t, 5)
      assert.equal(3, n)
      for _, l in ipairs(lines) do assert.is_true(l.conn_requests <= 2) end
      assert.equal(2, mgr.stats.max_requests)
      assert.equal(2, pool:stats().closed_by.retired)
    end)

    it("bodies: POST with a body, a chunked response, a large one, HEAD", function()
      local e = env()
      local t = tag()
      local pool = e.pool { origin = url(srv.ports.keep, ""), max_live = 1 }
      local echo, chunked, big, head
      e.run(function()
        echo = assert(cphttp.request(pool, { method = "POST", path = t .. "/echo", body = ("abc"):rep(1000),
                                             headers = { ["Content-Type"] = "text/plain" } }))
        chunked = assert(cphttp.request(pool, { path = t .. "/chunked" }))
        big = assert(cphttp.request(pool, { path = t .. "/big?n=300000" }))
        head = assert(cphttp.request(pool, { method = "HEAD", path = t .. "/big?n=10" }))
      end)
      assert.equal(("abc"):rep(1000), echo.body)
      assert.equal("piece1;piece2;piece3;piece4;piece5;", chunked.body)
      assert.equal("chunked", chunked.headers:get("transfer-encoding"))
      assert.equal(300000, #big.body)
      assert.equal("", head.body)
      assert.equal(1, (srv:connections(t, 4)))
    end)

    it("a timed-out request destroys its connection (its state is unknown) and says timeout", function()
      local e = env()
      local t = tag()
      local pool, mgr = e.pool { origin = url(srv.ports.keep, ""), max_live = 1 }
      local res, err, code
      e.run(function()
        res, err, code = cphttp.request(pool, { path = t .. "/slow?s=1" }, { timeout = 0.2 })
      end)
      assert.is_nil(res)
      assert.equal("timeout", code)
      assert.is_string(err)
      assert.equal(1, mgr.stats.timeouts)
      assert.equal(1, pool:stats().closed_by.error)
    end)

    it("a policy sees every response: policy.http() pauses the origin on a 429 with Retry-After", function()
      local e = env()
      local t = tag()
      local pool = e.pool { origin = url(srv.ports.keep, ""), max_live = 1, policy = clientpool.policy.http(),
                            pause_mode = "fail" }
      local busy, err, code, paused
      e.run(function()
        busy = assert(cphttp.request(pool, { path = t .. "/busy" }))
        local s = pool:stats()
        paused = { pool = s.paused, key = s.keys[clientpool.DEFAULT_KEY].paused }
        local _
        _, err, code = cphttp.request(pool, { path = t .. "/next" })
        pool:resume(clientpool.DEFAULT_KEY)
        assert(cphttp.request(pool, { path = t .. "/after" }))
      end)
      assert.equal(429, busy.status)
      assert.equal("2", busy.headers:get("retry-after"))
      -- the origin is the pool's default key: the pause is that key's
      -- (issue 18: a key-scope pause of the default key no longer pauses
      -- the whole pool)
      assert.same({ pool = false, key = "http 429" }, paused)
      assert.equal("paused", code)
      assert.truthy(err:find("http 429", 1, true))
      assert.equal(2, #srv:lines(t, 2))     -- the paused request never reached nginx
    end)

    it("full URLs of several origins, and a lua-http request object", function()
      local e = env()
      local t = tag()
      local pool = e.pool { max_live = 4 }
      local a, b, c, keys
      e.run(function()
        a = assert(cphttp.request(pool, url(srv.ports.keep, t .. "/a?x=1")))
        b = assert(cphttp.request(pool, url(srv.ports.nreq, t .. "/b")))
        local req = require("http.request").new_from_uri(url(srv.ports.keep, t .. "/c"))
        c = assert(cphttp.request(pool, req))
        keys = pool:stats().keys
      end)
      assert.equal("ok " .. t .. "/a?x=1\n", a.body)
      assert.equal(200, b.status)
      assert.is_true(c.reused)
      assert.is_table(keys[cphttp.key(url(srv.ports.keep, "/"))])
      assert.is_table(keys[cphttp.key(url(srv.ports.nreq, "/"))])
    end)
  end)

  describe("HTTP/2", function()
    local function h2_cases(name, port_of, scheme, tls_of)
      describe(name, function()
        local function key(path)
          return cphttp.key(url(port_of(), path or "/", scheme), tls_of())
        end

        -- eight slow requests at once through a fresh pool of o; returns
        -- the pool's manager and how many succeeded
        local function eight(e, t, o)
          local pool, mgr = e.pool(o)
          local ok = 0
          e.run(function()
            e.par(8, function(i)
              if cphttp.request(pool, { key = key(), path = t .. "/slow?s=0.6&i=" .. i }) then ok = ok + 1 end
            end)
          end)
          return mgr, ok
        end

        it("streams from many tasks share one connection (capacity = the server's 4 streams)", function()
          local e = env()
          local t = tag()
          local pool, mgr = e.pool { version = 2, max_live = 1, capacity = 4 }
          local got = {}
          e.run(function()
            e.par(8, function(i)
              local res, err = cphttp.request(pool, { key = key(), path = t .. "/slow?s=0.6&i=" .. i })
              got[#got + 1] = res and res.status or err
            end)
          end)
          assert.same({ 200, 200, 200, 200, 200, 200, 200, 200 }, got)
          local n, lines = srv:connections(t, 8)
          assert.equal(1, n)
          assert.equal("HTTP/2.0", lines[1].proto)
          assert.equal(4, srv:inflight(lines[1].conn))   -- four streams at once on that connection
          assert.equal(4, mgr.stats.peer_max_streams)
          assert.equal(0, mgr.stats.errors)
          assert.equal(0, mgr.stats.refused_streams)
        end)

        it("with max_live 2, eight requests at once use two connections, four streams each", function()
          local t = tag()
          local _, ok = eight(env(), t, { version = 2, max_live = 2, capacity = 4 })
          assert.equal(8, ok)
          local n, lines = srv:connections(t, 8)
          assert.equal(2, n)
          -- never more than the server's 4 streams at once on either; (how
          -- the eight split depends on which connection was ready first)
          local per, most = {}, 0
          for _, l in ipairs(lines) do per[l.conn] = (per[l.conn] or 0) + 1 end
          for c in pairs(per) do
            local k = srv:inflight(c)
            assert.is_true(k >= 1 and k <= 4, k .. " streams at once")
            if k > most then most = k end
          end
          assert.equal(4, most)
        end)

        it("a capacity above the server's MAX_CONCURRENT_STREAMS waits for a stream, never refused", function()
          local t = tag()
          local mgr, ok = eight(env(), t, { version = 2, max_live = 1, capacity = 8 })
          assert.equal(8, ok)
          local n, lines = srv:connections(t, 8)
          assert.equal(1, n)
          assert.equal(4, srv:inflight(lines[1].conn))
          assert.is_true(mgr.stats.stream_waits >= 1)
          assert.equal(0, mgr.stats.refused_streams)
        end)

        it("eight raw lua-http streams on one connection: the server refuses four (control)", function()
          local e = env()
          local t = tag()
          local refused = 0
          e.run(function()
            local opts = { host = "127.0.0.1", port = port_of(), tls = scheme == "https", version = 2 }
            if scheme == "https" then
              local ctx = require("http.tls").new_client_context()
              ctx:getStore():add(srv.cert)
              opts.ctx = ctx
            end
            local conn = assert(http_client.connect(opts, 5))
            e.par(8, function(i)
              if not raw_get(conn, "127.0.0.1:" .. port_of(), t .. "/slow?s=0.6&i=" .. i, scheme) then
                refused = refused + 1
              end
            end)
            conn:close()
          end)
          assert.is_true(refused >= 1 and refused <= 4, refused .. " refused")
        end)

        it("a timed-out stream is reset; its connection stays for the others", function()
          local e = env()
          local t = tag()
          local pool, mgr = e.pool { version = 2, max_live = 1, capacity = 4 }
          local slow, fast
          e.run(function()
            e.par(2, function(i)
              if i == 1 then
                slow = { cphttp.request(pool, { key = key(), path = t .. "/slow?s=1" }, { timeout = 0.2 }) }
              else
                fast = cphttp.request(pool, { key = key(), path = t .. "/slow?s=0.4" })
              end
            end)
            assert(cphttp.request(pool, { key = key(), path = t .. "/after" }))
          end)
          assert.is_nil(slow[1])
          assert.equal("timeout", slow[3])
          assert.equal(200, fast.status)
          assert.equal(1, mgr.stats.connects)
          assert.equal(1, mgr.stats.timeouts)
          assert.equal(0, pool:stats().closed_by.error)
        end)
      end)
    end

    h2_cases("h2c (HTTP/2 without TLS)", function() return srv.ports.h2c end, "http", function() return nil end)

    if NGX.have_openssl then
      h2_cases("over TLS (a self-signed certificate made by the spec)", function() return srv.ports.h2 end, "https",
               function() return { ca_file = srv.cert } end)

      it("GOAWAY after 3 streams (keepalive_requests) costs no request; new streams go elsewhere", function()
        local e = env()
        local t = tag()
        local pool, mgr = e.pool { version = 2, max_live = 2, capacity = 4 }
        local key = cphttp.key(url(srv.ports.h2goaway, "/", "https"), { ca_file = srv.cert })
        local ok, errs = 0, {}
        e.run(function()
          e.par(5, function(i)
            for j = 1, 4 do
              local res, err = cphttp.request(pool, { key = key, path = t .. "/slow?s=0.05&i=" .. i .. "-" .. j })
              if res then ok = ok + 1 else errs[#errs + 1] = err end
            end
          end)
        end)
        assert.same({}, errs)
        assert.equal(20, ok)
        local n, lines = srv:connections(t, 20)
        for _, l in ipairs(lines) do assert.is_true(l.conn_requests <= 3) end
        assert.is_true(n >= 7, n .. " connections")
        assert.is_true(mgr.stats.server_goaway >= 6, mgr.stats.server_goaway .. " GOAWAYs")
        assert.equal(0, mgr.stats.errors)
      end)

      it("an idle HTTP/2 connection the server closed (GOAWAY at keepalive_timeout) is found by the probe", function()
        local e = env()
        local t = tag()
        local pool, mgr = e.pool { version = 2, max_live = 1 }
        local key = cphttp.key(url(srv.ports.h2goaway, "/", "https"), { ca_file = srv.cert })
        local r2
        e.run(function()
          assert(cphttp.request(pool, { key = key, path = t .. "/a" }))
          NGX.sleep(1.6)
          r2 = assert(cphttp.request(pool, { key = key, path = t .. "/b" }))
        end)
        assert.equal(200, r2.status)
        assert.is_false(r2.reused)
        assert.equal(1, mgr.stats.server_idle_close)
        assert.equal(0, mgr.stats.errors)
        assert.equal(2, (srv:connections(t, 2)))
      end)

      it("TLS settings are part of the key: no verified CA, no connection; the right CA connects", function()
        local e = env()
        local pool, mgr = e.pool { version = 2, max_live = 2 }
        local bad, bad_code, good
        e.run(function()
          local _
          _, bad, bad_code = cphttp.request(pool, url(srv.ports.h2, "/x", "https"))
          good = cphttp.request(pool, { url = url(srv.ports.h2, "/x", "https"), tls = { ca_file = srv.cert } })
        end)
        assert.equal("create", bad_code)
        assert.truthy(bad:find("certificate verify failed", 1, true), bad)
        assert.equal(200, good.status)
        assert.equal(1, mgr.stats.connect_failed)
        assert.are_not.equal(cphttp.key("https://127.0.0.1:1"), cphttp.key("https://127.0.0.1:1", { verify = false }))
        assert.are_not.equal(cphttp.key("https://h"), cphttp.key("https://h", { ca_file = "/a" }))
        assert.are_not.equal(cphttp.key("https://h"), cphttp.key("https://h", { sni = "other" }))
      end)

      it("version = 2 against an HTTP/1.1-only TLS server fails in create with the reason (ALPN)", function()
        local e = env()
        local pool = e.pool { version = 2, max_live = 1 }
        local err, code
        e.run(function()
          local _
          _, err, code = cphttp.request(pool, { url = url(srv.ports.tls11, "/x", "https"),
                                                tls = { ca_file = srv.cert } })
        end)
        assert.equal("create", code)
        -- nginx ends the handshake (no_application_protocol), or ALPN picks http/1.1
        assert.truthy(err:find("does not offer HTTP/2", 1, true) or err:find("did not negotiate HTTP/2", 1, true), err)
      end)

      it("HTTP/1.1 over TLS: requests share one verified connection", function()
        local e = env()
        local t = tag()
        local pool, mgr = e.pool { origin = url(srv.ports.tls11, "", "https"), tls = { ca_file = srv.cert },
                                   max_live = 2 }
        local ok = 0
        e.run(function()
          for i = 1, 10 do
            local res = cphttp.request(pool, { path = t .. "/" .. i })
            if res and res.version == 1.1 then ok = ok + 1 end
          end
        end)
        assert.equal(10, ok)
        assert.equal(1, (srv:connections(t, 10)))
        assert.equal(1, mgr.stats.connects)
      end)
    else
      pending("HTTP/2 over TLS: no openssl to make a certificate")
    end
  end)

  describe("docs/http.md", function()
    it("the quick start runs as written (its origin pointed at the spec's nginx)", function()
      local code = require("spec.doc_blocks")("docs/http.md", "http-quick")
      assert.truthy(code:find("http://127.0.0.1:8080", 1, true))
      code = code:gsub("http://127%.0%.0%.1:8080", url(srv.ports.keep, ""))
      local printed = {}
      local fenv = setmetatable({ print = function(...) printed[#printed + 1] = { ... } end }, { __index = _G })
      -- (5.1 and LuaJIT: setfenv; Lua 5.2, in make test since issue 19,
      -- has neither setfenv nor lua-http's 5.1-only limits: load's env)
      local setfenv_ = rawget(_G, "setfenv")
      local chunk
      if setfenv_ then
        chunk = setfenv_(assert(loadstring(code, "=docs/http.md")), fenv)
      else
        chunk = assert(load(code, "=docs/http.md", "t", fenv))
      end
      chunk()
      assert.equal(1, #printed)
      local connects, requests, reused = unpack(printed[1])
      assert.is_true(connects >= 1 and connects <= 8, connects)
      assert.equal(200, requests)
      assert.equal(200 - connects, reused)
    end)
  end)
end)
