-- spec/nginx/fleet/fleet_app.lua: the handlers of spec/nginx/fleet/run.sh's
-- nginx (4 workers, one fleet). fleet_conf (written by run.sh) holds the
-- fleet's name and redis's port.
--
--   init()        init_by_lua (the master, before it forks): fleet.new
--   init_worker() init_worker_by_lua: this worker's pool on the fleet
--   /redis        one PING through the pool (503 when the acquire fails)
--   /retire       ... and the connection retired (release(false)): every
--                 request closes one and opens one. ?noquit=1: through a
--                 pool of the same cap on a fleet of its own whose close
--                 does not wait for redis's (option quit off)
--   /fleet        the fleet's figures: live idle members reclaimed (one line)
--   /stats        this worker's pool: pid live fleet.member.live
--   /fill?n=      the rebalance case: a worker holding nothing takes n
--                 clients at once and releases them (idle, the fleet's);
--                 "filled <pid> <idle>", or "busy <pid>" if it holds some
--   /want?n=      ... a worker holding nothing has n callers wait for a
--                 client at once (acquire_timeout 3 s), each holding its
--                 client 0.2 s: "want <pid> <served> <longest wait ms>",
--                 or "holder <pid>" if it holds some
local conf = require "fleet_conf"
local clientpool = require "clientpool"
local cpngx = require "clientpool.ngx"
local fleet = require "clientpool.fleet"
local common = require "fleet_common"
local ping = common.ping

local M = {}
local pool, noquit

-- The second fleet (the /retire?noquit=1 comparison).
local function noquit_name() return conf.name .. "-noquit" end
M.noquit_name = noquit_name

function M.init()
  fleet.new(conf.name, { max_live = conf.max_live })
  fleet.new(noquit_name(), { max_live = conf.max_live })
end

function M.init_worker()
  -- quit: a close returns once redis has closed its end, so the fleet's
  -- slot is free only when redis no longer counts the connection
  pool = clientpool.new(cpngx.tcp {
    host = "127.0.0.1", port = conf.redis_port, connect_timeout = 1,
    quit = "QUIT\r\n", quit_timeout = 1,
    fleet = conf.name, acquire_timeout = 5, max_waiting = 1000,
  })
  noquit = clientpool.new(cpngx.tcp {
    host = "127.0.0.1", port = conf.redis_port, connect_timeout = 1,
    fleet = noquit_name(), acquire_timeout = 5, max_waiting = 1000,
  })
end

function M.redis() common.redis(pool) end

function M.retire() common.redis(ngx.var.arg_noquit and noquit or pool, true) end

function M.fleet()
  local s = fleet.stats(conf.name)
  local alive = 0
  for _, m in ipairs(s.members) do if m.alive then alive = alive + 1 end end
  ngx.say(s.live, " ", s.idle, " ", s.member_count, " ", s.reclaimed, " ", alive)
end

local function holds()
  local s = pool:stats()
  return s.live + s.creating > 0
end

function M.fill()
  if holds() then ngx.say("busy ", ngx.worker.pid()) return end
  local n, held = tonumber(ngx.var.arg_n), {}
  for i = 1, n do
    local lease, code, detail = pool:acquire()
    if not lease then
      for j = 1, i - 1 do held[j]:release() end
      ngx.status = 503
      ngx.say("acquire: ", tostring(code), " ", tostring(detail))
      return
    end
    held[i] = lease
    local ok = ping(lease.client)
    if not ok then lease:release(false); held[i] = nil; ngx.status = 502; ngx.say("ping failed") return end
  end
  for i = 1, n do held[i]:release() end
  ngx.say("filled ", ngx.worker.pid(), " ", pool:stats().idle)
end

function M.want()
  if holds() then ngx.say("holder ", ngx.worker.pid()) return end
  local n, threads = tonumber(ngx.var.arg_n), {}
  for i = 1, n do
    threads[i] = ngx.thread.spawn(function()
      ngx.update_time()
      local t0 = ngx.now()
      local lease = pool:acquire(nil, { timeout = 3 })
      ngx.update_time()
      local waited = ngx.now() - t0
      if not lease then return false, waited end
      local ok = ping(lease.client)
      ngx.sleep(0.2)
      lease:release(not ok and false or nil)
      return ok, waited
    end)
  end
  local served, longest = 0, 0
  for i = 1, n do
    local _, ok, waited = ngx.thread.wait(threads[i])
    if ok then served = served + 1 end
    if waited and waited > longest then longest = waited end
  end
  ngx.say("want ", ngx.worker.pid(), " ", served, " ", math.floor(longest * 1000 + 0.5))
end

-- The fleet's members: "<pid>:<live>:<idle>" for each living one.
function M.members()
  local t = {}
  for _, m in ipairs(fleet.stats(conf.name).members) do
    if m.alive then t[#t + 1] = m.pid .. ":" .. m.live .. ":" .. m.idle end
  end
  ngx.say(table.concat(t, " "))
end

function M.stats()
  local s = pool:stats()
  ngx.say(ngx.worker.pid(), " ", s.live, " ", s.fleet.member and s.fleet.member.live or -1)
end

return M
