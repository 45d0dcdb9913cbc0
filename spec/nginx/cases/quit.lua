-- Option quit of tcp{} and driver{} (the redis preset's default): a close
-- sends the bytes and waits for the peer to close its end, so a destroy
-- returns only once the upstream no longer counts the connection. Without
-- it redis counts a closed connection until it reads the FIN, later than
-- a new connection made in the slot freed meanwhile: under churn redis saw
-- more than max_live (docs/decisions.md, "The upstream's count").
local H = require "harness"
local clientpool = require "clientpool"
local cpngx = require "clientpool.ngx"
local app = require "app"

-- A pool of tcp{} cosockets to the private redis, its connections named
-- `name` there (app.redis_pool).
local tcp_pool = app.redis_pool

-- `workers` light threads each acquire, PING and retire (release(false):
-- the destroy closes a live connection) or release (parked, then closed by
-- max_idle = 0: the destroy takes a parked one back), `rounds` times, while
-- a sampler counts the pool's connections in redis (CLIENT LIST by name)
-- as often as it can. Returns the most seen at once and the samples.
-- ping(client): "PONG" (default: a raw cosocket's).
local function churn(pool, name, workers, rounds, ping)
  ping = ping or function(sock) return H.command(sock, "PING") end
  local stop = H.sample_clients(name)
  local threads, errors = {}, {}
  for i = 1, workers do
    threads[i] = ngx.thread.spawn(function()
      for j = 1, rounds do
        local l, code, detail = pool:acquire()
        if not l then errors[#errors + 1] = tostring(code) .. " " .. tostring(detail) else
          local pong = ping(l.client)
          if pong ~= "PONG" then errors[#errors + 1] = "ping: " .. tostring(pong) end
          l:release(j % 2 == 0 and pong == "PONG")
        end
      end
    end)
  end
  for i = 1, workers do assert(ngx.thread.wait(threads[i])) end
  assert.truthy(H.wait_until(function() return pool:stats().closing == 0 end, 5))
  local max_seen, samples = stop()
  assert.are.same({}, errors)
  return max_seen, samples
end

-- Two idle connections retired (configure max_idle = 0: the first
-- destroy's QUIT round trip suspends a light thread, the second waits its
-- turn) while a create sets the other parked connection aside and
-- connects; then what redis holds must be what the pool counts, each
-- connection taken back and closed (the third released past max_idle).
local function retire_during_set_aside(pool, mgr, name)
  local r = assert(H.redis())
  local a, b = assert(pool:acquire()), assert(pool:acquire())
  a:release(); b:release()
  assert.are.equal(2, r:clients(name))
  local retire = ngx.thread.spawn(function() pool:configure { max_idle = 0 } end)
  local l = assert(pool:acquire())
  assert(ngx.thread.wait(retire))
  l:release()
  assert.truthy(H.wait_until(function() return pool:stats().closing == 0 end, 3))
  local s = pool:stats()
  assert.truthy(H.wait_until(function() return r:clients(name) == s.live end, 2),
                "redis holds " .. r:clients(name) .. " of the pool's connections, the pool counts " .. s.live)
  assert.are.equal(1, mgr.stats.set_aside)
  assert.are.equal(3, mgr.stats.closed_parked)
  r:close()
end

-- A driver{ preset = "redis" } pool whose fresh connects take `login`
-- seconds more (a driver that logs in inside connect), options o on top.
local function slow_driver_pool(name, login, o)
  local opts = {
    preset = "redis", host = "127.0.0.1", port = H.conf.redis_port, connect_timeout = 0.2,
    max_live = 3, acquire_timeout = 5,
    connect = function(red, c, copts)
      local ok, err = red:connect(c.host, c.port, copts)
      if ok and red:get_reused_times() == 0 then ngx.sleep(login) end
      return ok, err
    end,
    on_connect = function(red) return red:client("setname", name) end,
  }
  for k, v in pairs(o or {}) do opts[k] = v end
  local popts, mgr = cpngx.driver(opts)
  local pool = clientpool.new(popts)
  app.pools[name] = pool
  return pool, mgr, popts
end

describe("quit: the close waits for the peer's", function()
  it("tcp{}: under churn, redis never counts more than max_live of the pool's connections", function()
    local NAME, MAX_LIVE = "cp-quit-tcp", 2
    local pool, mgr = tcp_pool(NAME, { quit = "QUIT\r\n", max_live = MAX_LIVE, max_idle = 0,
                                       acquire_timeout = 10 })
    local max_seen, samples = churn(pool, NAME, 6, 150)
    ngx.log(ngx.NOTICE, "quit tcp: redis saw at most ", max_seen, " in ", samples, " samples; ",
            mgr.stats.quit, " quits confirmed")
    assert.is_true(samples > 100, "only " .. samples .. " samples")
    assert.is_true(max_seen >= 1 and max_seen <= MAX_LIVE, "redis saw " .. max_seen .. " connections")
    local s = pool:stats()
    -- every connection closed went through QUIT, and redis confirmed each
    assert.are.equal(s.opened, mgr.stats.quit)
    assert.are.equal(0, mgr.stats.quit_unconfirmed)
    assert.are.equal(s.opened, mgr.stats.closed + mgr.stats.closed_parked)
    assert.are.equal(0, s.live)
    pool:close()
  end, 60)

  it("driver{ preset = \"redis\" } quits by default; quit = false closes at once", function()
    local function make(name, quit)
      local opts, mgr = cpngx.driver { preset = "redis", host = "127.0.0.1", port = H.conf.redis_port,
                                       connect_timeout = 1, read_timeout = 2, quit = quit,
                                       on_connect = function(red) return red:client("setname", name) end,
                                       max_live = 2, max_idle = 0, acquire_timeout = 10 }
      local pool = clientpool.new(opts)
      app.pools[name] = pool
      return pool, mgr
    end
    local pool, mgr = make("cp-quit-drv")
    local function ping(red) return red:ping() end
    local max_seen = churn(pool, "cp-quit-drv", 6, 100, ping)
    assert.is_true(max_seen >= 1 and max_seen <= 2, "redis saw " .. max_seen .. " connections")
    local s = pool:stats()
    assert.are.equal(s.opened, mgr.stats.quit)
    assert.are.equal(0, mgr.stats.quit_unconfirmed)
    pool:close()
    local pool2, mgr2 = make("cp-quit-off", false)
    churn(pool2, "cp-quit-off", 2, 10, ping)
    assert.are.equal(0, mgr2.stats.quit + mgr2.stats.quit_unconfirmed)
    assert.is_true(mgr2.stats.closed + mgr2.stats.closed_parked > 0)
    pool2:close()
  end, 60)

  it("a peer that does not close: the close waits quit_timeout, then closes anyway (counted)", function()
    local NAME = "cp-quit-deaf"
    -- PING is answered, never followed by a close: the wait runs out
    local pool, mgr = tcp_pool(NAME, { quit = "PING\r\n", quit_timeout = 0.2, max_live = 1, acquire_timeout = 5 })
    local r = assert(H.redis())
    local l = assert(pool:acquire())
    assert.are.equal(1, r:clients(NAME))
    -- in nginx the caller of release(false) waits for the close with it
    -- (the hook's cosocket wait suspends the request): released in a light
    -- thread of its own, the rest of this request looks meanwhile
    ngx.update_time()
    local t0 = ngx.now()
    local releaser = ngx.thread.spawn(function() l:release(false); ngx.update_time(); return ngx.now() end)
    -- the slot is held while the close waits (the upstream still has it)
    assert.are.equal(1, pool:stats().closing)
    local l2, code = pool:try_acquire()
    assert.is_nil(l2)
    assert.are.equal("timeout", code)      -- (try_acquire's answer at the cap)
    local _, t1 = assert(ngx.thread.wait(releaser))
    assert.is_true(t1 - t0 >= 0.19, "the close took " .. (t1 - t0) .. " s, quit_timeout is 0.2")
    assert.truthy(H.wait_until(function() return pool:stats().closing == 0 end, 2))
    assert.truthy(H.wait_until(function() return r:clients(NAME) == 0 end, 2))
    assert.are.equal(1, mgr.stats.quit_unconfirmed)
    assert.are.equal(0, mgr.stats.quit)
    assert.are.equal(1, mgr.stats.closed)
    r:close()
    pool:close()
  end)

  -- Two requests retire a connection each while the peer takes its time
  -- to answer the quit. The second destroy used to wait behind the first
  -- (one destroy at a time per pool): its release returned, its request
  -- ended and nginx closed its connection, plainly, before the destroy ran
  -- in the first request. Now each request runs its own.
  it("one request's slow close does not hold another request's destroy back", function()
    local pool, mgr = tcp_pool("cp-quit-two", { quit = "PING\r\n", quit_timeout = 0.3, max_live = 2,
                                                acquire_timeout = 5 })
    local function retire()
      local l = assert(pool:acquire())
      assert.are.equal("PONG", H.command(l.client, "PING"))
      l:release(false)
    end
    app.probes["quit-two-a:content"], app.probes["quit-two-b:content"] = retire, retire
    local a = ngx.thread.spawn(H.http, "/phase/log?probe=quit-two-a")
    ngx.sleep(0.05)                       -- a's close is waiting for its peer
    local b = ngx.thread.spawn(H.http, "/phase/log?probe=quit-two-b")
    assert(ngx.thread.wait(a)); assert(ngx.thread.wait(b))
    assert.truthy(H.wait_until(function() return pool:stats().closing == 0 end, 3))
    -- both quits were sent on open connections (not on one nginx had closed)
    assert.are.same({ quit_unconfirmed = 2, closed = 2 },
                    { quit_unconfirmed = mgr.stats.quit_unconfirmed, closed = mgr.stats.closed })
    assert.are.equal(0, pool:stats().live)
    pool:close()
  end)

  -- A destroy that takes a parked connection back while a create holds
  -- this key's parked connections aside (a fresh connect never reuses
  -- one) found none, returned, and freed the room: the set-aside one was
  -- parked again later, open for good and counted nowhere (redis saw 9 and
  -- 11 under make demo's fleet, cap 8). The take-back now waits for them.
  it("a take-back during a create's set-aside: no connection is left open uncounted", function()
    local pool, mgr = tcp_pool("cp-quit-aside", { quit = "QUIT\r\n", quit_timeout = 1, max_live = 3,
                                                  acquire_timeout = 5 })
    retire_during_set_aside(pool, mgr, "cp-quit-aside")
    assert.are.equal(3, mgr.stats.quit)
    pool:close()
  end)

  -- The same, with a create whose connect outlasts the wait's deadline (a
  -- driver that logs in inside connect): the take-back gives up waiting,
  -- and the create closes one set-aside connection for it instead of
  -- parking it again (before, it stayed open, uncounted).
  it("a take-back during a set-aside past its deadline: the create closes what it owes", function()
    local pool, mgr = slow_driver_pool("cp-quit-owed", 0.6, { read_timeout = 2, quit_timeout = 1 })
    retire_during_set_aside(pool, mgr, "cp-quit-owed")
    pool:close()
  end)

  -- A create killed while it holds parked connections aside never ends
  -- its set-aside: once its deadline has passed the count starts again,
  -- so a later set-aside does not keep unparks waiting after it ended.
  it("a create killed during its set-aside does not hold later unparks up", function()
    -- fresh connects take 50 ms more (a login): a set-aside lasts that long
    local pool, mgr, opts = slow_driver_pool("cp-quit-killed", 0.05)
    -- a connection parked under the pool's nginx name with no record: the
    -- next create sets it aside for its fresh connect
    local function stray()
      local sock = ngx.socket.tcp()
      assert(sock:connect("127.0.0.1", H.conf.redis_port, { pool = mgr.name() }))
      assert(sock:setkeepalive(1000, 10))
    end
    stray()
    -- the manager's create hook killed in its fresh connect (as ngx.exit
    -- kills a request's light threads), the stray set aside
    local killed = ngx.thread.spawn(opts.create)
    assert(ngx.thread.kill(killed))
    assert.are.equal(0, mgr.stats.set_aside)      -- (set aside, never parked again)
    ngx.sleep(0.35)                       -- past that set-aside's deadline (connect_timeout + 0.1)
    stray()
    local made = ngx.thread.spawn(function() return pool:acquire() end)
    local _, l = assert(ngx.thread.wait(made))
    assert.are.equal(1, mgr.stats.set_aside)      -- (the second stray)
    l:release()                           -- parked: the next acquire unparks it
    local done = false
    local t = ngx.thread.spawn(function()
      local l2 = assert(pool:acquire())
      done = true
      l2:release()
    end)
    assert.is_true(done, "the unpark waited (a set-aside still counted as held)")
    ngx.thread.wait(t)
    pool:close()
  end)

  it("a socket its caller closed: release(false) neither quits nor counts a close", function()
    local pool, mgr = tcp_pool("cp-quit-closed", { quit = "QUIT\r\n", max_live = 1 })
    local l = assert(pool:acquire())
    l.client:close()
    l:release(false)
    assert.are.same({ quit = 0, quit_unconfirmed = 0, closed = 0 },
                    { quit = mgr.stats.quit, quit_unconfirmed = mgr.stats.quit_unconfirmed,
                      closed = mgr.stats.closed })
    assert.are.equal(0, pool:stats().live)
    pool:close()
  end)

  it("a bad quit is refused, naming the option", function()
    for _, bad in ipairs { 1, "", true, {} } do
      local ok, err = pcall(cpngx.tcp, { host = "127.0.0.1", port = 1, quit = bad })
      assert.is_false(ok)
      assert.matches("tcp%(%): 'quit' must be the bytes to send before a close", err)
    end
    local ok, err = pcall(cpngx.driver, { preset = "redis", host = "127.0.0.1", port = 1, quit = 7 })
    assert.is_false(ok)
    assert.matches("driver%(%): 'quit' must be", err)
    -- a timeout nginx cannot take: 0 ms would be its 60 s default, more than 2^31-1 ms raises later
    for _, bad in ipairs { 0.0004, 3e6 } do
      ok, err = pcall(cpngx.tcp, { host = "127.0.0.1", port = 1, quit = "QUIT\r\n", quit_timeout = bad })
      assert.is_false(ok)
      assert.matches("tcp%(%): 'quit_timeout' must be from 0.001 to 2147483.647 seconds", err)
    end
    ok, err = pcall(cpngx.tcp, { host = "127.0.0.1", port = 1, quit_timeout = 1 })
    assert.is_false(ok)
    assert.matches("'quit_timeout' without 'quit'", err)
  end)
end)
