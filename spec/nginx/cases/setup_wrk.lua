-- Makes the pool that spec/nginx/run.sh loads with wrk (not run on its own).
local H = require "harness"
local clientpool = require "clientpool"
local cpngx = require "clientpool.ngx"
local app = require "app"

it("makes the wrk pool (max_live 4)", function()
  local opts, mgr = cpngx.tcp {
    host = "127.0.0.1", port = H.conf.redis_port, connect_timeout = 1, read_timeout = 5,
    max_live = 4, acquire_timeout = 10, max_waiting = 4096,
    on_connect = function(sock) return H.command(sock, "CLIENT", "SETNAME", "cp-wrk") end,
  }
  app.pools.wrk = clientpool.new(opts)
  app.managers.wrk = mgr
end)
