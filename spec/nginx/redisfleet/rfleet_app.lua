-- spec/nginx/redisfleet/rfleet_app.lua: the handlers of
-- spec/nginx/redisfleet/run.sh's nginx instances. Each instance is one
-- machine of a Redis fleet (its workers share the machine-local fleet; one
-- worker's timer is the agent). rfleet_conf (written by run.sh per
-- instance) holds the fleet's name, the machine's name and the ports.
--
--   init()        init_by_lua (the master): fleet.new{ backend = "redis" }
--   init_worker() this worker's pool on the fleet (cpngx.tcp to the target)
--   /redis        one PING to the target through the pool
--   /fleet        across machines: leased live max_live machines, then this
--                 machine's local: live cap
--   /stats        this worker's pool: pid opened live agent|- closed_by...
local conf = require "rfleet_conf"
local clientpool = require "clientpool"
local cpngx = require "clientpool.ngx"
local fleet = require "clientpool.fleet"
local common = require "fleet_common"

local M = {}
local pool

function M.init()
  fleet.new(conf.name, { backend = "redis", max_live = conf.max_live, ttl = conf.ttl, machine = conf.machine,
                         redis = { port = conf.coord_port } })
end

function M.init_worker()
  pool = clientpool.new(cpngx.tcp {
    host = "127.0.0.1", port = conf.target_port, connect_timeout = 0.2,
    quit = "QUIT\r\n", quit_timeout = 1,   -- a close returns once redis let go (the cap at redis)
    fleet = conf.name, acquire_timeout = 10, max_waiting = 1000,
  })
end

function M.redis() common.redis(pool) end

function M.fleet()
  local s = fleet.stats(conf.name)
  local r = s.redis
  local n = 0
  for _ in pairs(r.machines or {}) do n = n + 1 end
  ngx.say(tostring(r.leased), " ", tostring(r.live), " ", tostring(r.max_live), " ", n, " ", s.live, " ",
          s.limits.max_live, " ", tostring(r.error))
end

--- /stats: this worker's pool: pid opened live, then closed_by reason=n
function M.stats()
  local s = pool:stats()
  local by = {}
  for k, v in pairs(s.closed_by or {}) do if v > 0 then by[#by + 1] = k .. "=" .. v end end
  table.sort(by)
  local R = fleet._redis(conf.name)
  ngx.say(ngx.worker.pid(), " ", tostring(s.opened), " ", s.live, " ", R.is_agent and "agent" or "-", " ",
          table.concat(by, " "))
end

return M
