-- The TCP cases every host adapter's spec runs (sched_copas_spec.lua,
-- sched_cqueues_spec.lua, sched_luv_spec.lua): a pool of real connections to
-- an echo server on 127.0.0.1 that counts accepted and open connections,
-- driven by that host. env: it, assert, S (the host's scheduler entry),
-- get() -> sched, server (fresh for each case: the spec's before_each),
-- tcp_pool(sched, server, o) (max_live 1 unless o says otherwise) and
-- request(sched, client, line) -> the echoed line.
local clientpool = require "clientpool"
local H = require "spec.helpers"

return function(env)
  local it, assert, S, tcp_pool, request = env.it, env.assert, env.S, env.tcp_pool, env.request
  local function T(x) return x * S.scale end

  it("tasks wait for one connection and all reuse it (the server accepts once)", function()
    local sched, server = env.get()
    local replies = {}
    S.run(sched, function()
      local pool = tcp_pool(sched, server)
      for i = 1, 20 do
        sched.spawn(function()
          local l = assert(pool:acquire(nil, { timeout = T(500) }))
          replies[i] = request(sched, l.client, "ping " .. i)
          l:release()
        end)
      end
      sched.sleep(0)
      assert.is_true(H.check(pool).waiting > 0)
      while #replies < 20 or H.check(pool).leases > 0 do sched.sleep(T(0.1)) end
      local s = H.check(pool)
      assert.equal(1, s.opened)
      assert.is_true(s.wait_count > 0)
      pool:close()
    end)
    for i = 1, 20 do assert.equal("ping " .. i, replies[i]) end
    assert.equal(1, server.accepted)
  end)

  it("an acquire times out while the connection is busy; the connection still works", function()
    local sched, server = env.get()
    local got = {}
    S.run(sched, function()
      local pool = tcp_pool(sched, server)
      local l = assert(pool:acquire())
      sched.spawn(function()
        local t0 = sched.now()
        got.l, got.code, got.detail = pool:acquire(nil, { timeout = T(1) })
        got.waited = sched.now() - t0
      end)
      got.reply = request(sched, l.client, "busy")
      sched.sleep(T(2))
      l:release()
      local again = assert(pool:acquire())
      got.reply2 = request(sched, again.client, "again")
      again:release()
      got.stats = H.check(pool)
      pool:close()
    end)
    assert.is_nil(got.l)
    assert.equal("timeout", got.code)
    assert.equal(1, got.detail.live)
    H.time(S, 1, got.waited, "the timeout")
    assert.equal("busy", got.reply)
    assert.equal("again", got.reply2)
    assert.equal(1, got.stats.timeouts)
    assert.equal(1, server.accepted)
  end)

  it("a cancelled waiter leaves; the connection goes to the next one", function()
    local sched, server = env.get()
    local got = {}
    S.run(sched, function()
      local pool = tcp_pool(sched, server)
      local l = assert(pool:acquire())
      local token = clientpool.token()
      sched.spawn(function() got.a = { pool:acquire(nil, { cancel = token }) } end)
      sched.spawn(function()
        local l2 = assert(pool:acquire())
        got.b = request(sched, l2.client, "second")
        l2:release()
      end)
      sched.sleep(T(0.5))
      token:cancel()
      sched.sleep(T(0.5))
      assert.equal("cancelled", got.a[2])
      l:release()
      while not got.b do sched.sleep(T(0.1)) end
      got.stats = H.check(pool)
      pool:close()
    end)
    assert.equal("second", got.b)
    assert.equal(1, got.stats.cancelled)
    assert.equal(1, server.accepted)
  end)

  it("a connection released with false is closed and replaced", function()
    local sched, server = env.get()
    local got = {}
    S.run(sched, function()
      local pool = tcp_pool(sched, server, { max_live = 2 })
      local l = assert(pool:acquire())
      got[1] = request(sched, l.client, "one")
      l:release(false)
      l = assert(pool:acquire())
      got[2] = request(sched, l.client, "two")
      l:release()
      local t_end = sched.now() + 5
      while server.open > 1 and sched.now() < t_end do sched.sleep(T(0.1)) end
      got.open = server.open
      got.stats = H.check(pool)
      pool:close()
    end)
    assert.same({ "one", "two" }, { got[1], got[2] })
    assert.equal(2, server.accepted)
    assert.equal(1, got.open)
    assert.equal(1, got.stats.closed_by.error)
  end)
end
