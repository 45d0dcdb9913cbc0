-- Faults (issue 6): redis-server killed (SIGKILL) and restarted in the
-- middle of a load run. The redis-server here is a second one that
-- spec/nginx/faultctl.sh starts and kills when this case asks (run.sh
-- starts faultctl.sh; the other cases keep their redis).
--
-- During the outage every request fails cleanly: acquire returns "create"
-- (connection refused) or "timeout", a PING on a connection that died with
-- the server fails and its client is destroyed (release(false)); nothing
-- raises, nothing hangs. After the restart PING works again through the
-- same pool, and its counts are consistent with nothing leaked.
local H = require "harness"
local clientpool = require "clientpool"
local cpngx = require "clientpool.ngx"
local app = require "app"

local MAX_LIVE = 4
local NAME = "cp-restart"

local fault = H.fault

-- Connections named NAME that the second redis sees.
local function named_clients()
  local r = assert(H.redis(H.conf.redis2_port))
  local n = r:clients(NAME)
  r:close()
  return n
end

if not H.conf.redis2_port then
  pending("redis-server killed and restarted under load: run.sh starts no faultctl.sh (no redis2_port)")
  return
end

describe("redis-server killed and restarted under load", function()
  local stop = false

  after_each(function()
    stop = true
    fault("kill")
    local pool = app.pools.restart
    if pool then pool:close() end
  end)

  it("requests fail cleanly while it is down, PING works again after the restart, counts stay sound", function()
    assert.are.equal("up", fault("start"))
    local popts, mgr = cpngx.tcp {
      host = "127.0.0.1", port = H.conf.redis2_port, scheduler = "ngx",
      connect_timeout = 0.2, send_timeout = 1, read_timeout = 1,
      max_live = MAX_LIVE, acquire_timeout = 1,
      on_connect = function(sock) return H.command(sock, "CLIENT", "SETNAME", NAME) end,
    }
    local pool = clientpool.new(popts)
    app.pools.restart = pool
    app.managers.restart = mgr

    -- outcomes by the phase a request started and ended in
    local phase = "before"
    local seen = { before = {}, down = {}, after = {} }
    local after_list = {}
    local function count(ph, what)
      local t = seen[ph]
      t[what] = (t[what] or 0) + 1
      if ph == "after" then after_list[#after_list + 1] = what end
    end
    local threads = {}
    for i = 1, 16 do
      threads[i] = ngx.thread.spawn(function()
        while not stop do
          local ph = phase
          local status, body = H.http("/app/redis_ping?pool=restart", { timeout = 10 })
          local what
          if status == 200 and body:match("^PONG") then what = "ok"
          elseif status == 503 and body:match("^err create ") then what = "create"
          elseif status == 503 and body:match("^err timeout ") then what = "timeout"
          elseif status == 502 and body:match("^err ping ") then what = "ping failed"
          else what = "bad: " .. tostring(status) .. " " .. tostring(body) end
          -- requests in flight while the phase changed count nowhere
          if ph == phase and seen[ph] then count(ph, what) end
          ngx.sleep(0.002)
        end
      end)
    end

    ngx.sleep(0.5)
    phase = "killing"
    assert.are.equal("down", fault("kill"))
    phase = "down"
    ngx.sleep(0.5)
    phase = "restarting"
    assert.are.equal("up", fault("start"))
    phase = "after"
    -- until a good run of PONGs after the restart (or 5 s)
    H.wait_until(function()
      local n = #after_list
      if n < 50 then return false end
      for j = n - 29, n do if after_list[j] ~= "ok" then return false end end
      return true
    end, 5)
    stop = true
    for _, t in ipairs(threads) do assert(ngx.thread.wait(t)) end

    local function show(t)
      local parts = {}
      for k, v in pairs(t) do parts[#parts + 1] = k .. "=" .. v end
      table.sort(parts)
      return table.concat(parts, " ")
    end
    ngx.log(ngx.NOTICE, "redis restart: before: ", show(seen.before), "; down: ", show(seen.down),
            "; after: ", show(seen.after), "; manager: ", show(mgr.stats))

    -- before: all good
    assert.is_true((seen.before.ok or 0) > 0, show(seen.before))
    for k in pairs(seen.before) do assert.are.equal("ok", k, show(seen.before)) end
    -- down: every request failed cleanly, acquire saying "create"
    assert.is_true((seen.down.create or 0) > 0, "no acquire failed with create while down: " .. show(seen.down))
    for k in pairs(seen.down) do
      assert(k == "create" or k == "timeout" or k == "ping failed", "while down: " .. show(seen.down))
    end
    -- after: nothing bad, and the last 30 are PONGs
    for k in pairs(seen.after) do
      assert(k == "ok" or k == "create" or k == "timeout" or k == "ping failed", "after: " .. show(seen.after))
    end
    local n = #after_list
    assert.is_true(n >= 50, "only " .. n .. " requests after the restart")
    for j = n - 29, n do assert.are.equal("ok", after_list[j], "after: " .. show(seen.after)) end

    -- PING through the pool itself, sequentially
    for _ = 1, 5 do
      local lease = assert(pool:acquire())
      assert.are.equal("PONG", H.command(lease.client, "PING"))
      lease:release()
    end

    -- counts: nothing held, waiting or being created; identities hold
    assert.truthy(H.wait_until(function()
      local s = pool:stats()
      return s.leases == 0 and s.waiting == 0 and s.creating == 0
    end, 2))
    local s = pool:stats()
    assert.are.equal(s.live, s.opened - s.closed)
    assert.are.equal(s.live, s.idle)
    assert.is_true(s.live >= 1 and s.live <= MAX_LIVE, "live " .. s.live)
    assert.is_true(s.create_failed > 0)
    assert.is_true(mgr.stats.connect_failed > 0)
    -- redis sees no more connections than the pool counts live
    assert.truthy(H.wait_until(function() return named_clients() <= s.live end, 2))
    -- and the whole of max_live can be had at once
    local held = {}
    for i = 1, MAX_LIVE do held[i] = assert(pool:acquire()) end
    for i = 1, MAX_LIVE do assert.are.equal("PONG", H.command(held[i].client, "PING")) end
    for i = 1, MAX_LIVE do held[i]:release() end
    s = pool:stats()
    assert.are.equal(0, s.leases)
    assert.are.equal(MAX_LIVE, s.live)
  end, 40)
end)
