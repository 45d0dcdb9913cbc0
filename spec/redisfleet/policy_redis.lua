-- The Redis fleet refuses a Redis that may evict its keys (docs/fleet.md
-- 14.13): a real redis-server started with --maxmemory-policy allkeys-lru;
-- the agent reads INFO memory on its connection and leases nothing (the
-- server never sees a key of the fleet, the create hook never runs) until
-- the policy is noeviction.
local server = require "spec.redisfleet.redis_server"

describe("a Redis fleet on a Redis whose maxmemory-policy evicts", function()
  local r
  setup(function()
    r = server.start(nil, nil, "--maxmemory 64mb --maxmemory-policy allkeys-lru")
  end)
  teardown(function()
    server.stop(r)
    os.execute("rm -f /dev/shm/clientpool.*.n.spec-evict-* 2>/dev/null")
  end)

  it("leases nothing and says why while the policy evicts, and leases once it is noeviction", function()
    local clientpool = require "clientpool"
    local fleet = require "clientpool.fleet"
    local loop = require("clientpool.loop").new()
    local name, ttl = "spec-evict-" .. os.time() % 100000 .. "-" .. math.random(0, 999), 0.4
    fleet.new(name, { backend = "redis", max_live = 3, ttl = ttl, machine = "ev1",
                      redis = { port = r.port, timeout = 0.2 } })
    local created = 0
    local pool = clientpool.new { fleet = name, scheduler = loop, max_waiting = 10,
                                  create = function() created = created + 1; return {} end }
    local first, err_seen, keys_before, second, second_after
    loop.spawn(function()
      -- two ttls: the agent's first asks are long done
      local l, code = pool:acquire(nil, { timeout = 2 * ttl })
      first = l and "granted" or code
      keys_before = server.cmd(r.port, "KEYS", "clientpool:fleet:{" .. name .. "}*")
      local s = fleet.stats(name)     -- (its script writes the fleet's run id)
      err_seen = s.redis.agent and s.redis.agent.last_err
      assert(server.cmd(r.port, "CONFIG", "SET", "maxmemory-policy", "noeviction"))
      -- the agent tries again once a ttl, then the new server's quiet ttl
      -- and a renewal (ttl / 4): generous, relative to the ttl
      local t0 = loop.now()
      l, code = pool:acquire(nil, { timeout = 8 * ttl })
      second, second_after = l and "granted" or code, loop.now() - t0
      if l then l:release() end
      pool:close()
    end)
    loop:run()
    print(string.format("\n  allkeys-lru: the acquire ended '%s', %d creates, %d keys in redis; after CONFIG SET " ..
      "noeviction: '%s' %.0f ms later (ttl %g s)", tostring(first), created, #keys_before, tostring(second),
      second_after * 1000, ttl))
    assert.equal("timeout", first)
    assert.equal(0, #keys_before)                   -- no lease was written
    assert.is_string(err_seen)
    assert.is_truthy(err_seen:find("maxmemory-policy 'allkeys-lru'", 1, true), err_seen)
    assert.is_truthy(err_seen:find("noeviction", 1, true))
    assert.equal("granted", second)
    assert.equal(1, created)
    fleet.remove(name)
  end)
end)
