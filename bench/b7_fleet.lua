-- B7: an uncontended pair through a pool on a fleet (clientpool.new{ fleet
-- = name }: every acquire and release also takes and gives the fleet's
-- units in the shared segment, csrc/fleet.c) against the same pair through
-- a local pool, in the same run. Goal (issue 14): <= 1.5x. Both pool forms:
-- the lease object and checkout/checkin.
local clientpool = require "clientpool"
local fleet = require "clientpool.fleet"

return function(U)
  local function new_client() return {} end
  local name = string.format("bench-b7-%d-%d", os.time(), math.random(1, 1e9))
  fleet.new(name, { max_live = 16 })

  local loc = clientpool.new { max_live = 16, create = new_client }
  assert(loc:acquire()):release()
  local fl = clientpool.new { fleet = name, create = new_client }
  assert(fl:acquire()):release()

  local local_lease = U.loop("pool", "local lease = pool:acquire(); lease:release()", loc)
  local fleet_lease = U.loop("pool", "local lease = pool:acquire(); lease:release()", fl)
  local local_co = U.loop("pool", "local _, h = pool:checkout(); pool:checkin(h)", loc)
  local fleet_co = U.loop("pool", "local _, h = pool:checkout(); pool:checkin(h)", fl)

  local r, _, b = U.ratio(fleet_lease, local_lease)
  U.row("B7.lease", "fleet acquire+release pair / local pair (goal <= 1.5x)", r, "x")
  local r2, _, b2 = U.ratio(fleet_co, local_co)
  U.row("B7.checkout", "fleet checkout+checkin pair / local pair (goal <= 1.5x)", r2, "x")
  U.row("B7.base", "(baseline: local acquire+release pair, ns)", b, "ns")
  U.row("B7.cobase", "(baseline: local checkout+checkin pair, ns)", b2, "ns")
  loc:close()
  fl:close()
  fleet.remove(name)
end
