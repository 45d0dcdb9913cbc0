-- spec/nginx/metrics/my_pools.lua: the pools module of docs/metrics.md's
-- nginx recipe ("my_pools": name -> pool, one set per worker, made at the
-- first require), for the metrics nginx that spec/nginx/run.sh starts with
-- three workers. Each worker opens worker id + 1 clients of pool "plain"
-- at once, so /metrics tells the workers apart; GET /work (a location of
-- that nginx only) acquires and releases once in whichever worker serves it.
local clientpool = require "clientpool"

local n = 0
local plain = clientpool.new {
  create = function() n = n + 1; return { id = n } end,
  max_live = 8, scheduler = "ngx",
}
-- in a timer of its own: a require cannot yield (ngx_lua runs the pool's
-- coroutines by yielding to its scheduler)
ngx.timer.at(0, function()
  local leases = {}
  for i = 0, ngx.worker.id() do
    leases[#leases + 1] = assert(plain:acquire("k" .. i))
  end
  for _, l in ipairs(leases) do l:release() end
end)

return { plain = plain }
