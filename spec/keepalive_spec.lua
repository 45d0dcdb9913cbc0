-- clientpool: keepalive = s (HikariCP's keepaliveTime; DESIGN section 3
-- "Operating a live pool", issue 19; docs/api.md "Keepalive"). An idle
-- client idle for s is checked in the background (keepalive_check, else
-- validate) and retired if it fails, so a caller rarely meets a dead
-- connection: at the exact time (the pool's timer), a bounded number at
-- once (core.KEEPALIVE_MAX), counted in stats (keepalive, keepalive_failed).
--
-- Every scenario runs as a task on each scheduler of H.schedulers { hosts =
-- true }: times are written for the virtual clock and scaled with T() on
-- the hosts' real clocks (lower bounds there). The last scenarios use real
-- TCP connections (LuaSocket) to a server on 127.0.0.1 in this process that
-- drops connections left idle.

local clientpool = require "clientpool"
local H = require "spec.helpers"
local contains, errmsg = H.contains, H.errmsg_bare
local core = require "clientpool.core"
local socket_ok, socket = pcall(require, "socket")

-- A TCP server on 127.0.0.1 (an ephemeral port) stepped by a task of the
-- scheduler: it echoes lines and closes a connection idle (no line from
-- its client) for drop_after seconds of the scheduler's clock, as a
-- load balancer or a server's own idle timeout does.
local function idle_dropping_server(sched, drop_after)
  local srv = assert(socket.bind("127.0.0.1", 0))
  srv:settimeout(0)
  local _, port = srv:getsockname()
  local s = { port = tonumber(port), accepted = 0, dropped = 0, conns = {}, stop = false }
  sched.spawn(function()
    while not s.stop do
      local c = srv:accept()
      while c do
        c:settimeout(0)
        s.accepted = s.accepted + 1
        s.conns[c] = sched.now()
        c = srv:accept()
      end
      for conn, last in pairs(s.conns) do
        local line, err, partial = conn:receive("*l", s[conn])
        s[conn] = partial ~= "" and partial or nil
        if line then
          conn:send(line .. "\n")
          s.conns[conn] = sched.now()
        elseif err == "closed" then
          conn:close()
          s.conns[conn] = nil
        elseif sched.now() - last >= drop_after then
          conn:close()
          s.conns[conn] = nil
          s.dropped = s.dropped + 1
        end
      end
      sched.sleep(drop_after / 20)
    end
    for conn in pairs(s.conns) do conn:close() end
    srv:close()
  end)
  return s
end

-- A connection is alive when a read that must not wait finds nothing yet
-- (a closed peer reads as "closed").
local function alive(c)
  c:settimeout(0)
  local _, err, partial = c:receive(1)
  return err == "timeout" and partial == ""
end

for _, M in ipairs(H.missing_schedulers()) do
  describe("clientpool keepalive on " .. M.name, function()
    pending("not run: " .. M.reason)
  end)
end

for _, S in ipairs(H.schedulers { hosts = true }) do
  local function T(x) return x * S.scale end
  local function run(body)
    local sched = S.new()
    S.run(sched, body, sched)
  end
  local function wait_until(sched, cond, secs)
    local deadline = sched.now() + T(secs)
    while not cond() do
      if sched.now() > deadline then return false end
      sched.sleep(T(0.01))
    end
    return true
  end

  describe("clientpool keepalive on " .. S.name, function()
    after_each(function() if S.finish then S.finish() end end)

    it("checks an idle client in the background at the exact time, again after each check", function()
      run(function(sched)
        local f = H.factory(sched)
        local checks = {}
        local t0
        local pool = clientpool.new {
          create = f.create, destroy = f.destroy, max_live = 2, keepalive = T(10), scheduler = sched,
          validate = function(c, key, idle_s)
            checks[#checks + 1] = { id = c.id, key = key, at = sched.now() - t0, idle = idle_s }
            return true
          end,
        }
        local l = assert(pool:acquire("k"))
        t0 = sched.now()
        l:release()
        if S.real then
          assert.is_true(wait_until(sched, function() return #checks >= 3 end, 40))
        else
          sched.sleep(T(35))
        end
        assert.equal(3, #checks)
        for i, ch in ipairs(checks) do
          assert.equal(1, ch.id)
          assert.equal("k", ch.key)
          H.time(S, 10 * i, ch.at, "check " .. i)
          H.time(S, 10 * i, ch.idle, "idle time at check " .. i)   -- idle since its last use
        end
        local s = H.check(pool)
        assert.equal(3, s.keepalive)
        assert.equal(0, s.keepalive_failed)
        assert.equal(3, s.keys.k.keepalive)
        assert.equal(1, s.idle)
        assert.equal(0, s.reused)                      -- a check is not a reuse
        pool:close()
      end)
    end)

    it("retires a client that fails, before any acquire gets it", function()
      run(function(sched)
        local f = H.factory(sched)
        local pool = clientpool.new {
          create = f.create, destroy = f.destroy, max_live = 2, keepalive = T(5), scheduler = sched,
          validate = function(c) return c.alive end,
        }
        local a, b = assert(pool:acquire()), assert(pool:acquire())
        local dead = a.client
        a:release(); b:release()
        dead.alive = false                             -- its peer went away while it sat idle
        assert.is_true(wait_until(sched, function() return pool:stats().keepalive == 2 and f.destroyed == 1 end, 10))
        local s = H.check(pool)
        assert.equal(2, s.keepalive)
        assert.equal(1, s.keepalive_failed)
        assert.equal(1, s.closed_by.invalid)
        assert.equal(1, s.idle)
        assert.equal(1, f.destroyed)
        local l = assert(pool:acquire())
        assert.is_true(l.client.alive)
        assert.equal(0, pool:stats().closed_by.invalid - 1)   -- the acquire met no dead client
        l:release()
        pool:close()
      end)
    end)

    it("keeps idle_timeout and max_lifetime: a check does not make a client live for ever", function()
      run(function(sched)
        local f = H.factory(sched)
        local n = 0
        local pool = clientpool.new { create = f.create, destroy = f.destroy, max_live = 2, keepalive = T(10),
                                      idle_timeout = T(25), scheduler = sched,
                                      validate = function() n = n + 1; return true end }
        assert(pool:acquire()):release()
        assert.is_true(wait_until(sched, function() return pool:stats().idle == 0 end, 40))
        -- at 10 and 20, then idle_timeout at 25 (a real clock may be late for the second check:
        -- the client is past its idle_timeout by then, and goes)
        if S.real then assert.is_true(n == 1 or n == 2, tostring(n)) else assert.equal(2, n) end
        assert.equal(1, pool:stats().closed_by.idle)
        pool:close()
      end)
    end)

    it("bounds the checks at once; a client being checked is handed to nobody", function()
      run(function(sched)
        local f = H.factory(sched)
        local inflight, peak, checked = 0, 0, 0
        local leased = {}
        local pool = clientpool.new {
          create = f.create, destroy = f.destroy, max_live = 6, keepalive = T(5), scheduler = sched,
          validate = function(c)   -- (validate_after_idle: never on reuse here)
            assert(not leased[c], "a leased client is being checked")
            inflight = inflight + 1
            if inflight > peak then peak = inflight end
            sched.sleep(T(1))
            inflight = inflight - 1
            checked = checked + 1
            return true
          end,
          validate_after_idle = T(1000),               -- no check on reuse
        }
        local ls = {}
        for i = 1, 5 do ls[i] = assert(pool:acquire()) end
        for i = 1, 5 do ls[i]:release() end
        -- 2 out for their check, 3 waiting their turn
        if S.real then
          assert.is_true(wait_until(sched, function() return inflight == core.KEEPALIVE_MAX end, 10))
        else
          sched.sleep(T(5.5))
        end
        assert.equal(core.KEEPALIVE_MAX, inflight)
        local s = H.check(pool)
        assert.equal(5, s.idle)                        -- out for a check, still idle
        local got = {}
        for i = 1, 3 do
          local l = assert(pool:acquire(nil, { timeout = 0 }))
          leased[l.client] = true
          got[i] = l
        end
        for _, l in ipairs(got) do leased[l.client] = nil; l:release() end
        assert.is_true(wait_until(sched, function() return checked >= 5 end, 20))
        assert.equal(core.KEEPALIVE_MAX, peak)
        assert.equal(5, f.created)
        pool:close()
      end)
    end)

    it("a parking pool: validate sees the unparked client, which is parked again", function()
      run(function(sched)
        local f = H.factory(sched)
        local log = {}
        local pool = clientpool.new {
          create = f.create, destroy = f.destroy, max_live = 2, keepalive = T(5), scheduler = sched,
          park = function(c) log[#log + 1] = "park " .. c.id; return { parked = c.id } end,
          unpark = function(st) log[#log + 1] = "unpark " .. st.parked; return { id = st.parked, alive = true } end,
          validate = function(c)
            log[#log + 1] = "validate " .. c.id .. (c.parked and " parked" or "")
            return true
          end,
        }
        assert(pool:acquire()):release()
        assert.is_true(wait_until(sched, function() return #log == 4 end, 10))
        assert.same({ "park 1", "unpark 1", "validate 1", "park 1" }, log)
        assert.equal(1, pool:stats().keepalive)
        pool:close()
      end)
    end)

    it("keepalive_check runs instead of validate, on what the record keeps, and may replace it", function()
      run(function(sched)
        local f = H.factory(sched)
        local got, destroyed = {}, {}
        local pool = clientpool.new {
          create = f.create, max_live = 3, keepalive = T(5), scheduler = sched,
          destroy = function(c) destroyed[#destroyed + 1] = c end,
          park = function(c) return "parked " .. c.id end,
          unpark = function(st) return { id = tonumber(st:match("%d+")) } end,
          validate = function() error("validate must not run for a keepalive") end,
          validate_after_idle = T(1000),
          keepalive_check = function(stored, key, idle_s, idle)
            got[#got + 1] = { stored = stored, key = key, idle_s = idle_s, idle = idle }
            if stored == "parked 1" then return false, "gone 1" end
            return true
          end,
        }
        local a, b = assert(pool:acquire("k")), assert(pool:acquire("k"))
        a:release(); b:release()
        assert.is_true(wait_until(sched, function() return pool:stats().keepalive_failed == 1 end, 10))
        -- (on a real clock the second check may come a little later)
        assert.is_true(wait_until(sched, function() return #got == 2 end, 5))
        assert.equal(2, #got)
        assert.equal("k", got[1].key)
        assert.equal(2, got[1].idle)                   -- the key's idle clients, this one included
        H.time(S, 5, got[1].idle_s, "idle_s")
        local s = H.check(pool)
        assert.equal(1, s.keepalive_failed)
        assert.is_true(wait_until(sched, function() return #destroyed == 1 end, 5))
        assert.same({ "gone 1" }, destroyed)           -- what the check handed back
        pool:close()
      end)
    end)

    it("a check that raises fails the client (logged)", function()
      run(function(sched)
        local f = H.factory(sched)
        local logged = {}
        local quiet = setmetatable({ log = function(m) logged[#logged + 1] = m end }, { __index = sched })
        local pool = clientpool.new { create = f.create, destroy = f.destroy, max_live = 1, keepalive = T(5),
                                      scheduler = quiet, keepalive_check = function() error("probe broke") end }
        assert(pool:acquire()):release()
        assert.is_true(wait_until(sched, function() return pool:stats().keepalive_failed == 1 end, 10))
        assert.truthy(contains(logged[1], "keepalive_check hook failed"), tostring(logged[1]))
        assert.truthy(contains(logged[1], "probe broke"))
        pool:close()
      end)
    end)

    it("configure sets, changes and drops keepalive live", function()
      run(function(sched)
        local f = H.factory(sched)
        local n = 0
        local pool = clientpool.new { create = f.create, destroy = f.destroy, max_live = 1, scheduler = sched,
                                      validate = function() n = n + 1; return true end,
                                      validate_after_idle = T(1000) }
        assert(pool:acquire()):release()
        sched.sleep(T(20))
        assert.equal(0, n)
        assert.is_true(pool:configure { keepalive = T(30) })   -- idle 20 s already: due in 10
        if S.real then assert.is_true(wait_until(sched, function() return n == 1 end, 20)) else sched.sleep(T(11)) end
        assert.equal(1, n)
        assert.is_true(pool:configure { keepalive = false })
        sched.sleep(T(40))
        assert.equal(1, n)
        pool:close()
      end)
    end)

    if socket_ok then
      it("finds a real connection whose peer dropped it while idle, before any acquire gets it", function()
        run(function(sched)
          local srv = idle_dropping_server(sched, T(3))
          local opened, closed = 0, 0
          local pool = clientpool.new {
            max_live = 2, keepalive = T(5), scheduler = sched,
            create = function()
              local c = assert(socket.connect("127.0.0.1", srv.port))
              opened = opened + 1
              return c
            end,
            destroy = function(c) closed = closed + 1; c:close() end,
            keepalive_check = function(c) return alive(c) end,   -- no validate on reuse
          }
          -- a round trip; the server is a task of this scheduler, so the reply is waited for
          local function ping(c)
            c:settimeout(0)
            assert(c:send("ping\n"))
            local got, line, err, partial = "", nil, nil, nil
            assert(wait_until(sched, function()
              line, err, partial = c:receive("*l", got)
              got = partial or got
              return line ~= nil or err == "closed"
            end, 5))
            return line
          end
          local l = assert(pool:acquire())
          assert.equal("ping", ping(l.client))
          l:release()
          assert.is_true(wait_until(sched, function() return srv.dropped == 1 end, 10))   -- after 3 s idle
          if not S.real then assert.equal(1, pool:stats().idle) end   -- the pool cannot know yet
          assert.is_true(wait_until(sched, function() return pool:stats().keepalive_failed == 1 end, 10))
          local s = H.check(pool)
          assert.equal(0, s.idle)
          assert.equal(1, s.closed_by.invalid)
          assert.is_true(wait_until(sched, function() return closed == 1 end, 5))
          -- the next caller gets a new connection that works, not the dead one
          l = assert(pool:acquire())
          assert.equal("ping", ping(l.client))
          assert.equal(2, opened)
          assert.equal(0, pool:stats().reused)
          l:release()
          sched.sleep(T(1))
          -- a connection in use keeps the server from dropping it and passes its checks
          for _ = 1, 3 do
            l = assert(pool:acquire())
            assert.equal("ping", ping(l.client))
            l:release()
            sched.sleep(T(2))
          end
          assert.equal(2, opened)
          pool:close()
          srv.stop = true
          assert.is_true(wait_until(sched, function() return closed == 2 end, 5))
        end)
      end)

      it("without keepalive the caller meets the dead connection (the control)", function()
        run(function(sched)
          local srv = idle_dropping_server(sched, T(3))
          local pool = clientpool.new {
            max_live = 2, scheduler = sched,
            create = function() return assert(socket.connect("127.0.0.1", srv.port)) end,
            destroy = function(c) c:close() end,
          }
          assert(pool:acquire()):release()
          assert.is_true(wait_until(sched, function() return srv.dropped == 1 end, 10))
          sched.sleep(T(3))
          local l = assert(pool:acquire())
          assert.is_false(alive(l.client))
          l:release(false)
          pool:close()
          srv.stop = true
          sched.sleep(T(1))
        end)
      end)
    else
      pending("real TCP scenarios: LuaSocket does not load here")
    end
  end)
end

describe("clientpool keepalive: options", function()
  it("needs a check, and a duration > 0", function()
    local create = function() return {} end
    assert.equal("clientpool: option 'keepalive' needs a check to run: a validate hook or keepalive_check",
                 errmsg(clientpool.new, { create = create, max_live = 1, keepalive = 5 }))
    assert.equal("clientpool: option 'keepalive' must be > 0 seconds, got 0",
                 errmsg(clientpool.new, { create = create, max_live = 1, keepalive = 0, validate = print }))
    assert.equal("clientpool: option 'keepalive_check' must be a function, got number",
                 errmsg(clientpool.new, { create = create, max_live = 1, keepalive_check = 1 }))
    local pool = clientpool.new { create = create, max_live = 1 }
    assert.equal("clientpool: option 'keepalive' needs a check to run: a validate hook or keepalive_check",
                 errmsg(pool.configure, pool, { keepalive = 5 }))
    assert.truthy(contains(errmsg(pool.configure, pool, { keepalive_check = print }), "cannot change"))
    pool:close()
  end)
end)

describe("clientpool keepalive and the C fast path", function()
  it("never hands out a client being checked (real clock, fast path installed)", function()
    local loop = require("clientpool.loop").new()
    local leased, checking, checks = {}, {}, 0
    local pool = clientpool.new {
      backend = "core", max_live = 3, keepalive = 0.002, scheduler = loop,
      create = function() return {} end,
      validate = function(c)   -- (validate_after_idle: never on reuse here)
        assert(not leased[c], "a leased client is being checked")
        checking[c] = true
        loop.sleep(0.003)
        checking[c] = nil
        checks = checks + 1
        return true
      end,
      validate_after_idle = 1000,
    }
    assert.is_function(rawget(pool, "checkout"))
    loop.spawn(function()
      local deadline = loop.now() + 0.2
      while loop.now() < deadline do
        local c, h = pool:checkout()
        assert(not checking[c], "checkout got a client being checked")
        leased[c] = true
        local l = assert(pool:acquire())
        assert(not checking[l.client], "acquire got a client being checked")
        leased[l.client] = true
        loop.sleep(0.001)
        leased[c], leased[l.client] = nil, nil
        pool:checkin(h)
        l:release()
        loop.sleep(0.004)
      end
      pool:close()
    end)
    loop.run()
    assert.is_true(checks > 0)
  end)
end)
