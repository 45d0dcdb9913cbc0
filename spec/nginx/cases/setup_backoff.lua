-- Makes the pools that spec/nginx/run.sh loads with wrk while it kills and
-- restarts the second redis-server (not run on its own; check_backoff.lua
-- reads what they recorded). lua-resty-redis through cpngx.driver's
-- preset; each create attempt is counted (the connects redis would see).
local H = require "harness"
local clientpool = require "clientpool"
local cpngx = require "clientpool.ngx"
local sched = require "clientpool.sched.ngx"
local app = require "app"

local function make(name, o)
  local opts, mgr = cpngx.driver {
    preset = "redis", host = "127.0.0.1", port = H.conf.redis2_port, scheduler = "ngx",
    connect_timeout = 0.2, read_timeout = 1, max_live = 4, acquire_timeout = 0.5, max_waiting = 4096,
  }
  for k, v in pairs(o or {}) do opts[k] = v end
  local d = { max_acquire = 0, outcomes = {}, attempts = {}, failed = {} }
  local create = opts.create
  opts.create = function(...)
    d.attempts[#d.attempts + 1] = sched.now()
    local c, err = create(...)
    if c == nil then d.failed[#d.failed + 1] = sched.now() end
    return c, err
  end
  if app.pools[name] then app.pools[name]:close() end
  app.pools[name] = clientpool.new(opts)
  app.managers[name] = mgr
  app.deadline[name] = d
end

it("makes the backoff pools (max_live 4, acquire_timeout 0.5; one with create_backoff = false)", function()
  make("backoff")
  make("nobackoff", { create_backoff = false })
end)
