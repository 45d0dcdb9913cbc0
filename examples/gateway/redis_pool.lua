-- examples/gateway/redis_pool.lua: the gateway's Redis pool, configured in
-- this one place (make demo). One pool per nginx worker, made at the first
-- require in that worker (no I/O until the first acquire).
--
-- Budget: per worker for now, so 4 workers x max_live 8 = at most 32
-- connections to redis. When the fleet budget lands (DESIGN section 5),
-- this file names the fleet instead (fleet.new in init_by_lua, `fleet =
-- "redis-main"` below, max_live fleet-wide) and nothing else in the demo
-- changes. The bare lua-resty-redis handlers the demo compares against take
-- their pool_size and backlog from here too, so every row has the same
-- per-worker number.
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

return M
