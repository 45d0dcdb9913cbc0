-- examples/gateway/redis_pool.lua: the gateway's Redis pools, configured in
-- this one place (make demo). Each pool is made per nginx worker, at the
-- first require in that worker (no I/O until the first acquire).
--
-- Budgets: `pool` caps each worker (4 workers x max_live 8 = at most 32
-- connections to redis); `fleet_pool()` takes the budget of the fleet
-- "demo_conf.fleet", made in init_by_lua (fleet.new, max_live for the whole
-- machine, never multiplied by the workers). The bare lua-resty-redis
-- handlers the demo compares against take their pool_size and backlog from
-- here too, so those rows have the same per-worker number.
local conf = require "demo_conf"           -- written by examples/gateway/run.sh
local clientpool = require "clientpool"
local cpngx = require "clientpool.ngx"

local M = {
  host = "127.0.0.1",
  port = conf.redis_port,
  per_worker = conf.per_worker,            -- clientpool's max_live; the bare driver's pool_size
  backlog = conf.backlog,                  -- the bare driver's backlog
  timeout_ms = 2000,
}

M.pool = clientpool.new(cpngx.driver {
  preset = "redis",                        -- the real lua-resty-redis (resty.redis or Debian's nginx.redis)
  host = M.host, port = M.port,
  connect_timeout = 1, read_timeout = M.timeout_ms / 1000,
  max_live = M.per_worker,
  acquire_timeout = 2, max_waiting = 4096,
})

-- The fleet's pool: made at its first use in each worker, so the rows
-- that do not use it never join the fleet.
function M.fleet_pool()
  if not M.fpool then
    M.fpool = clientpool.new(cpngx.driver {
      preset = "redis", host = M.host, port = M.port,
      connect_timeout = 1, read_timeout = M.timeout_ms / 1000,
      fleet = conf.fleet,                  -- max_live: the fleet's, for all workers
      acquire_timeout = 2, max_waiting = 4096,
    })
  end
  return M.fpool
end

-- init_by_lua (the master, before it forks): the fleet every worker joins.
function M.init_fleet()
  require("clientpool.fleet").new(conf.fleet, { max_live = conf.fleet_max_live })
end

return M
