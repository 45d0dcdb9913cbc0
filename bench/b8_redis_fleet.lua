-- B8: admission through a fleet across machines (backend = "redis",
-- docs/fleet.md section 14) against the one-machine fleet, in the same run,
-- with a private redis-server on a free 127.0.0.1 port (stopped by pid).
--   B8.pair   the uncontended pair on a pool of each (the hot path: the
--             Redis fleet's pools see a machine-local fleet; goal <= 1.5x)
--   B8.tasks  8 tasks on the built-in loop acquiring, yielding and
--             releasing while the agent renews its lease in the same loop:
--             CPU time per acquisition, Redis fleet / one-machine fleet
--   B8.cmds   Redis commands the agent sent per 1000 acquisitions there
package.path = "./?.lua;" .. package.path
local clientpool = require "clientpool"
local fleet = require "clientpool.fleet"

local TTL = 1

return function(U)
  local okr, server = pcall(require, "spec.redisfleet.redis_server")
  local has = okr and os.execute("command -v redis-server >/dev/null 2>&1")
  if not (has == true or has == 0) then
    U.row("B8.pair", "redis fleet pair / one-machine fleet pair: skipped (no redis-server or luasocket)", nil, "x")
    return
  end
  local r = server.start()
  local ok, err = pcall(function()
    local loop = require("clientpool.loop").new()
    local function new_client() return {} end
    local tag = string.format("%d-%d", os.time(), math.random(1, 1e9))
    local shm_name, redis_name = "bench-b8-shm-" .. tag, "bench-b8-redis-" .. tag
    fleet.new(shm_name, { max_live = 16 })
    fleet.new(redis_name, { backend = "redis", max_live = 16, ttl = TTL, machine = "bench",
                            redis = { port = r.port }, block = 16 })
    local shm = clientpool.new { fleet = shm_name, create = new_client, scheduler = loop }
    local red = clientpool.new { fleet = redis_name, create = new_client, scheduler = loop, acquire_timeout = 10 }
    -- the first lease (after the fresh server's quiet ttl), clients made
    loop.spawn(function()
      local ls = {}
      for i = 1, 8 do ls[i] = assert(red:acquire()); ls[i + 8] = assert(shm:acquire()) end
      for i = 1, 16 do ls[i]:release() end
    end)
    loop.run()

    local p_shm = U.loop("pool", "local lease = pool:acquire(); lease:release()", shm)
    local p_red = U.loop("pool", "local lease = pool:acquire(); lease:release()", red)
    -- the loop does not run during the pair, so the agent cannot renew:
    -- the machine's validity is moved out of the way (a deadline stays
    -- set, so the pair pays the engines' validity check as in service)
    local R0 = fleet._redis(redis_name)
    assert(R0.h:agent_update(R0.epoch, nil, require("clientpool.core").monotime() + 3600))
    local rt = U.ratio(p_red, p_shm)
    U.row("B8.pair", "redis fleet acquire+release pair / one-machine fleet pair (goal <= 1.5x)", rt, "x")

    -- tasks that yield, the agent renewing meanwhile (every ttl/4)
    local R = fleet._redis(redis_name)
    local function tasks(pool, secs)
      local n, t_end = 0, require("clientpool.core").monotime() + secs
      local c0 = os.clock()
      for _ = 1, 8 do
        loop.spawn(function()
          local monotime = require("clientpool.core").monotime
          while monotime() < t_end do
            local l = assert(pool:acquire())
            loop.sleep(0)
            l:release()
            n = n + 1
          end
        end)
      end
      loop.run()
      return (os.clock() - c0) / n, n
    end
    local best_shm, best_red, cmds, acq = math.huge, math.huge, 0, 0
    for _ = 1, 3 do
      local a = tasks(shm, 0.3)
      local c1 = R.conn and R.conn.commands or 0
      local b, n = tasks(red, 0.3)
      cmds, acq = cmds + (R.conn and R.conn.commands or 0) - c1, acq + n
      if a < best_shm then best_shm = a end
      if b < best_red then best_red = b end
    end
    U.row("B8.tasks", "8 yielding tasks, redis fleet / one-machine fleet, CPU per acquisition (goal <= 1.5x)",
          best_red / best_shm, "x")
    U.row("B8.cmds", string.format("redis commands per 1000 acquisitions there (ttl %g s: %d for %d)", TTL, cmds, acq),
          math.floor(cmds * 1e6 / acq + 0.5) / 1000, "")
    shm:close(); red:close()
    loop.run()
    fleet.remove(shm_name); fleet.remove(redis_name)
  end)
  server.stop(r)
  if not ok then error(err, 0) end
end
