-- spec/nginx/fleet_common.lua: what the fleet suites' nginx handlers share
-- (spec/nginx/fleet/fleet_app.lua, spec/nginx/redisfleet/rfleet_app.lua):
-- one PING through a pool of raw cosockets to a redis-server.
local M = {}

-- One PING on sock: true, or nil and why.
function M.ping(sock)
  local ok, err = sock:send("PING\r\n")
  if not ok then return nil, err end
  local line
  line, err = sock:receive("*l")
  if line ~= "+PONG" then return nil, err or line end
  return true
end

-- The /redis handler: a lease from pool, one PING, "PONG" (503 when no
-- lease, 502 when the PING failed: the client is closed, not kept).
-- retire: the client is closed after a good PING too (release(false)).
function M.redis(pool, retire)
  local lease, code, detail = pool:acquire()
  if not lease then
    ngx.status = 503
    ngx.say("acquire: ", tostring(code), " ", tostring(detail))
    return
  end
  local ok, err = M.ping(lease.client)
  if not ok then
    lease:release(false)
    ngx.status = 502
    ngx.say("ping: ", tostring(err))
    return
  end
  lease:release(not retire)
  ngx.say("PONG")
end

return M
