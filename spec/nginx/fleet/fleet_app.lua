-- spec/nginx/fleet/fleet_app.lua: the handlers of spec/nginx/fleet/run.sh's
-- nginx (4 workers, one fleet). fleet_conf (written by run.sh) holds the
-- fleet's name and redis's port.
--
--   init()        init_by_lua (the master, before it forks): fleet.new
--   init_worker() init_worker_by_lua: this worker's pool on the fleet
--   /redis        one PING through the pool (503 when the acquire fails)
--   /fleet        the fleet's figures: live idle members reclaimed (one line)
--   /stats        this worker's pool: pid live fleet.member.live
local conf = require "fleet_conf"
local clientpool = require "clientpool"
local cpngx = require "clientpool.ngx"
local fleet = require "clientpool.fleet"

local M = {}
local pool

function M.init()
  fleet.new(conf.name, { max_live = conf.max_live })
end

function M.init_worker()
  pool = clientpool.new(cpngx.tcp {
    host = "127.0.0.1", port = conf.redis_port, connect_timeout = 1,
    fleet = conf.name, acquire_timeout = 5, max_waiting = 1000,
  })
end

local function ping(sock)
  local ok, err = sock:send("PING\r\n")
  if not ok then return nil, err end
  local line
  line, err = sock:receive("*l")
  if line ~= "+PONG" then return nil, err or line end
  return true
end

function M.redis()
  local lease, code, detail = pool:acquire()
  if not lease then
    ngx.status = 503
    ngx.say("acquire: ", tostring(code), " ", tostring(detail))
    return
  end
  local ok, err = ping(lease.client)
  if not ok then
    lease:release(false)
    ngx.status = 502
    ngx.say("ping: ", tostring(err))
    return
  end
  lease:release()
  ngx.say("PONG")
end

function M.fleet()
  local s = fleet.stats(conf.name)
  local alive = 0
  for _, m in ipairs(s.members) do if m.alive then alive = alive + 1 end end
  ngx.say(s.live, " ", s.idle, " ", s.member_count, " ", s.reclaimed, " ", alive)
end

function M.stats()
  local s = pool:stats()
  ngx.say(ngx.worker.pid(), " ", s.live, " ", s.fleet.member and s.fleet.member.live or -1)
end

return M
