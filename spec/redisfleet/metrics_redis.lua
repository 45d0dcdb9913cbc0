-- clientpool.metrics over a Redis fleet's name (docs/metrics.md "Fleets"):
-- the machine-local figures as for one machine, plus the cross-machine
-- ones of fleet.stats(name).redis (clientpool_redis_fleet_*), read back
-- by the strict parser, checked by promtool, every value against what a
-- second connection reads from the real redis-server itself.
local server = require "spec.redisfleet.redis_server"
local scripts = require "clientpool.redisfleet.scripts"
local P = require "spec.prom_text"

describe("clientpool.metrics over a Redis fleet", function()
  local r
  setup(function() r = server.start() end)
  teardown(function()
    server.stop(r)
    os.execute("rm -f /dev/shm/clientpool.*.n.spec-rmetrics-* 2>/dev/null")
  end)

  it("renders the figures across machines, which promtool accepts and Redis confirms", function()
    local clientpool = require "clientpool"
    local fleet = require "clientpool.fleet"
    local metrics = require "clientpool.metrics"
    local loop = require("clientpool.loop").new()
    local name, ttl = "spec-rmetrics-" .. os.time() % 100000 .. "-" .. math.random(0, 999), 0.4
    fleet.new(name, { backend = "redis", max_live = 4, ttl = ttl, machine = "mx-1",
                      redis = { port = r.port, timeout = 0.2 } })
    local pool = clientpool.new { fleet = name, scheduler = loop, create = function() return {} end }
    local text, units, held
    loop.spawn(function()
      -- two leases held (the agent's first lease comes after the new
      -- server's quiet ttl), then a renewal reports them (ttl / 4)
      local a = assert(pool:acquire(nil, { timeout = 8 * ttl }))
      local b = assert(pool:acquire(nil, { timeout = 8 * ttl }))
      loop.sleep(ttl / 2)
      text = metrics.prometheus { db = name }
      -- the same figures, read from Redis directly
      -- (the machine's row in Redis is its agent's: "mx-1~<epoch>")
      local keys, member = scripts.keys("clientpool:fleet:", name), fleet._redis(name).member
      assert.equal("mx-1~1", member)
      units = tonumber(server.cmd(r.port, "HGET", keys[2], member))
      held = tonumber(server.cmd(r.port, "HGET", keys[4], member))
      a:release(); b:release()
      pool:close()
    end)
    loop:run()
    local doc = P.parse(text)
    local L = { pool = "db" }
    assert.equal(1, P.value(doc, "clientpool_redis_fleet_up", L))
    assert.equal(4, P.value(doc, "clientpool_redis_fleet_max_live", L))
    assert.equal(units, P.value(doc, "clientpool_redis_fleet_leased", L))
    assert.equal(held, P.value(doc, "clientpool_redis_fleet_live", L))
    -- (held: what the machine may hold until its next renewal, its two
    -- clients and what its share lets it open meanwhile)
    assert.is_true(held >= 2 and units >= held, units .. " units, " .. held .. " held")
    assert.equal(units, P.value(doc, "clientpool_redis_fleet_machine_units", { pool = "db", machine = "mx-1" }))
    assert.equal(held, P.value(doc, "clientpool_redis_fleet_machine_held", { pool = "db", machine = "mx-1" }))
    assert.equal(0, P.value(doc, "clientpool_redis_fleet_machine_demand", { pool = "db", machine = "mx-1" }))
    assert.equal(0, P.value(doc, "clientpool_redis_fleet_paused", L))
    -- this machine's local fleet, as for one machine: its two clients
    assert.equal(2, P.value(doc, "clientpool_live", L))
    assert.is_true(P.have_promtool(), "promtool is missing (Debian: prometheus; scripts/deps.sh installs it)")
    local ok, out = P.promtool(text)
    assert.is_true(ok, out)
    -- Redis gone: up 0, the other redis families left out, still valid
    server.stop(r)
    text = metrics.prometheus { db = name }
    doc = P.parse(text)
    assert.equal(0, P.value(doc, "clientpool_redis_fleet_up", L))
    assert.is_nil(P.value(doc, "clientpool_redis_fleet_max_live", L))
    ok, out = P.promtool(text)
    assert.is_true(ok, out)
    r = server.start(r.port)
    fleet.remove(name)
  end)
end)
