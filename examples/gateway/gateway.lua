-- examples/gateway/gateway.lua: the demo gateway's handlers (make demo).
-- Each request reads one key from redis through lua-resty-redis:
--   /cp        clientpool: cpngx.driver's pool (redis_pool.lua), lease.client
--              is the resty.redis object
--   /fleet     clientpool on a fleet: one budget for all workers
--   /size      bare lua-resty-redis: connect with pool_size, set_keepalive
--   /backlog   the same with backlog (connect waits when pool_size
--              connections of the pool are open in this worker)
local P = require "redis_pool"

local ok, redis = pcall(require, "resty.redis")
if not ok then redis = require "nginx.redis" end   -- Debian's lua-nginx-redis

local KEY = "demo:greeting"
local M = {}

local function fail(status, what, err)
  ngx.status = status
  ngx.say(what, ": ", tostring(err))
end

local function pooled(pool)
  local lease, code, detail = pool:acquire()
  if not lease then return fail(503, "acquire", tostring(code) .. " " .. tostring(detail)) end
  local v, err = lease.client:get(KEY)
  lease:release(v ~= nil)                  -- a failed command retires the connection
  if not v then return fail(502, "get", err) end
  ngx.say(v)
end

function M.cp() return pooled(P.pool) end
function M.fleet() return pooled(P.fleet_pool()) end

local SIZE = { pool = "demo-size", pool_size = P.per_worker }
local BACKLOG = { pool = "demo-backlog", pool_size = P.per_worker, backlog = P.backlog }

local function bare(opts)
  local red = redis:new()
  red:set_timeout(P.timeout_ms)
  local cok, err = red:connect(P.host, P.port, opts)
  if not cok then return fail(503, "connect", err) end
  local v
  v, err = red:get(KEY)
  if not v then
    red:close()
    return fail(502, "get", err)
  end
  red:set_keepalive(60000, P.per_worker)
  ngx.say(v)
end

function M.size() return bare(SIZE) end
function M.backlog() return bare(BACKLOG) end

return M
