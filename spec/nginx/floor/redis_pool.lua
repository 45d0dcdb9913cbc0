-- spec/nginx/floor/redis_pool.lua: the pool of the warm-floor pattern for
-- OpenResty (docs/hosts.md, OpenResty): one pool per worker, made at the first
-- require, started by the init_worker block there (spec/nginx/run.sh uses
-- that block as it is written). Its connections are named
-- cp-floor-<worker pid> in redis, so the runner can count them per worker.
local clientpool = require "clientpool"
local cpngx = require "clientpool.ngx"
local conf = require "spec_conf"

local MIN_IDLE = 2

-- CLIENT SETNAME cp-floor-<pid> on each new connection.
local function setname(sock)
  local name = "cp-floor-" .. ngx.worker.pid()
  local ok, err = sock:send(string.format("*3\r\n$6\r\nCLIENT\r\n$7\r\nSETNAME\r\n$%d\r\n%s\r\n", #name, name))
  if not ok then return nil, err end
  local line
  line, err = sock:receive("*l")
  if line ~= "+OK" then return nil, line or err end
  return true
end

local opts, mgr = cpngx.tcp {
  host = "127.0.0.1", port = conf.redis_port, connect_timeout = 1, read_timeout = 2,
  on_connect = setname,
  max_live = 4, min_idle = MIN_IDLE,
}

-- for spec/nginx/cases/floor.lua
package.loaded["redis_pool.manager"] = mgr
package.loaded["redis_pool.min_idle"] = MIN_IDLE

return clientpool.new(opts)
