-- A worker that is exiting (here: nginx reloads with HUP while this request
-- runs in the old worker) closes released connections instead of parking
-- them. Runs last: after it, a new worker serves.
local H = require "harness"
local clientpool = require "clientpool"
local cpngx = require "clientpool.ngx"
local sched = require "clientpool.sched.ngx"

local function master_pid()
  local f = assert(io.open(H.conf.pid_file))
  local pid = tonumber(f:read("*l"))
  f:close()
  return pid
end

it("closes a connection released after the reload instead of parking it", function()
  local opts, mgr = cpngx.tcp {
    host = "127.0.0.1", port = H.conf.redis_port, connect_timeout = 1, max_live = 3,
    idle_timeout = 60, scheduler = "ngx",
    on_connect = function(sock) return H.command(sock, "CLIENT", "SETNAME", "cp-exiting") end,
  }
  local pool = clientpool.new(opts)
  -- the same with quit: the destroy that retires the record quits it
  local qopts, qmgr = cpngx.tcp {
    host = "127.0.0.1", port = H.conf.redis_port, connect_timeout = 1, max_live = 1, scheduler = "ngx",
    quit = "QUIT\r\n", quit_timeout = 1,
    on_connect = function(sock) return H.command(sock, "CLIENT", "SETNAME", "cp-exiting-q") end,
  }
  local qpool = clientpool.new(qopts)
  local r = assert(H.redis())
  local qheld = assert(qpool:acquire())
  local held = assert(pool:acquire())
  local parked = assert(pool:acquire())
  parked:release()                    -- idle for 60 s: the pool's timer task waits that long
  assert.are.equal(2, r:clients("cp-exiting"))
  assert.is_false(ngx.worker.exiting())

  assert.are.equal(0, os.execute("kill -HUP " .. master_pid()))
  assert.truthy(H.wait_until(function() return ngx.worker.exiting() end, 5), "the worker did not start exiting")

  held:release()
  qheld:release()
  -- redis let it go before the release returned (no wait here)
  assert.are.equal(0, r:clients("cp-exiting-q"))
  assert.are.same({ closed_exiting = 1, quit = 1, closed = 1, parked = 0 },
                  { closed_exiting = qmgr.stats.closed_exiting, quit = qmgr.stats.quit,
                    closed = qmgr.stats.closed, parked = qmgr.stats.parked })
  assert.are.equal(0, qpool:stats().live)
  assert.are.equal(1, mgr.stats.closed_exiting)
  assert.are.equal(1, mgr.stats.parked)             -- only the one parked before the reload
  local s = pool:stats()
  assert.are.equal(0, s.leases)
  assert.are.equal(1, s.closed_by.retired)
  -- redis sees the released connection go (nginx also drops the parked one on exit)
  assert.truthy(H.wait_until(function() return r:clients("cp-exiting") == 0 end, 2))
  r:close()
  -- waits in timers end in an exiting worker instead of holding it
  local res
  ngx.timer.at(0, function()
    local h = sched.current()
    local ok, err = pcall(sched.wait, h, sched.now() + 30)
    res = ok and "returned" or err
  end)
  assert.are.equal(sched.EXITING, H.wait_until(function() return res end, 3))
  -- an acquire that would wait in a timer ends with that error too, and the
  -- grant a release makes for it later is not lost with it
  local pool2 = clientpool.new { max_live = 1, create = function() return {} end, scheduler = "ngx" }
  local held2 = assert(pool2:acquire())
  local res2
  ngx.timer.at(0, function()
    local ok, err = pcall(pool2.acquire, pool2, nil, { timeout = 30 })
    res2 = ok and "returned" or tostring(err)
  end)
  assert.truthy(H.wait_until(function() return res2 end, 3))
  assert.truthy(res2:find(sched.EXITING, 1, true), res2)
  held2:release()
  local s2 = pool2:stats()
  assert.are.same({ leases = 0, waiting = 0, idle = 1 }, { leases = s2.leases, waiting = s2.waiting, idle = s2.idle })
  local again = assert(pool2:try_acquire())
  again:release()
end, 30)
