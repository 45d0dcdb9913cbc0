-- The Redis fleet's server-side scripts (lua/clientpool/redisfleet/scripts.lua)
-- run directly against a real redis-server on a free 127.0.0.1 port
-- (docs/fleet.md section 14): take, renew, return and leave in one lease
-- call, lapse by TTL, the quiet period after a new server, pause and
-- resume, stats, and members racing for the last units.
local server = require "spec.redisfleet.redis_server"
local resp = require "clientpool.redisfleet.resp"
local scripts = require "clientpool.redisfleet.scripts"
local socket = require "socket"

local IS_JIT = rawget(_G, "jit") ~= nil
local INTERP = (arg and arg[-1]) or (IS_JIT and "luajit" or ("lua" .. _VERSION:match("%d+%.%d+")))

describe("the Redis fleet's scripts", function()
  local r, c
  local n_fleet = 0
  setup(function()
    r = server.start()
    c = resp.new({ port = r.port, timeout = 2 }, "blocking")
  end)
  teardown(function()
    if c then c:close() end
    server.stop(r)
  end)

  local function fresh()
    n_fleet = n_fleet + 1
    return "spec-" .. n_fleet
  end
  -- lease(ttl, member, want, need, demand, max_live) -> the reply table
  -- budgets: { { name, want, need, cap }... }, their replies in r.b[name] = { n, sum }
  local function lease(name, ttl, member, want, need, max_live, mode, demand, budgets)
    local args = { ttl, member, want, need, demand or 0, max_live, mode or "lease", #(budgets or {}) }
    for _, b in ipairs(budgets or {}) do for i = 1, 4 do args[#args + 1] = b[i] end end
    local v, err = c:script("lease", scripts.lease, scripts.keys("clientpool:fleet:", name), args)
    assert(v, err)
    local res = { n = v[1], sum = v[2], max_live = v[3], quiet = v[4], pause = v[5], pause_ms = v[6],
                  others = v[7], members = v[8], stored = v[9], b = {} }
    for j, b in ipairs(budgets or {}) do res.b[b[1]] = { n = v[8 + 2 * j], sum = v[9 + 2 * j] } end
    return res
  end
  local function stats(name, ttl)
    local v = assert(c:script("stats", scripts.stats, scripts.keys("clientpool:fleet:", name), { ttl or 0 }))
    local s = { sum = v[1], max_live = v[2], quiet = v[3], pause = v[4], members = {} }
    local i = 7
    while i <= #v do
      local m = { units = v[i + 1], held = v[i + 2], demand = v[i + 3], ttl = v[i + 4], b = {} }
      s.members[v[i]] = m
      local nb = v[i + 5]
      for j = 1, nb do m.b[v[i + 4 + 2 * j]] = v[i + 5 + 2 * j] end
      i = i + 6 + 2 * nb
    end
    return s
  end
  -- a fleet past its first-sight quiet period
  local function ready(ttl)
    local name = fresh()
    local q = lease(name, ttl, "probe", 0, 0, 1)
    assert.equal(0, q.n)
    assert.is_true(q.quiet > 0 and q.quiet <= ttl)
    socket.sleep(q.quiet / 1000 + 0.02)
    return name
  end

  it("grants within the cap, accounts what a member holds even above it, returns and leaves", function()
    local name = ready(200)
    local a = lease(name, 60000, "a", 3, 0, 5)
    assert.equal(3, a.n); assert.equal(3, a.sum)
    local b = lease(name, 60000, "b", 5, 0, 5)
    assert.equal(2, b.n); assert.equal(5, b.sum)        -- the last 2, not 5
    -- a member holding 2 physically is accounted even with no room, never granted them
    local cc = lease(name, 60000, "c", 2, 2, 5)
    assert.equal(0, cc.n); assert.equal(2, cc.stored); assert.equal(7, cc.sum)
    -- then nothing is granted: b renews and its lease is what it holds
    b = lease(name, 60000, "b", 5, 1, 5, nil, 4)
    assert.equal(0, b.n); assert.equal(1, b.stored); assert.equal(6, b.sum)
    -- a returns units (want below its lease)
    a = lease(name, 60000, "a", 1, 1, 5)
    assert.equal(1, a.n); assert.equal(4, a.sum)
    assert.equal(4, a.others)                           -- b's demand, as the others see it
    local s = stats(name)
    assert.equal(4, s.sum); assert.equal(5, s.max_live)
    assert.equal(1, s.members.a.units); assert.equal(1, s.members.b.units); assert.equal(2, s.members.c.held)
    assert.is_true(s.members.a.ttl > 59000 and s.members.a.ttl <= 60000)
    -- leave
    local l = lease(name, 60000, "c", 0, 0, 5, "leave")
    assert.equal(0, l.n); assert.equal(2, l.sum)
    assert.is_nil(stats(name).members.c)
  end)

  it("a lease not renewed lapses after its ttl (Redis's clock) and its units go to others", function()
    local name = ready(200)
    assert.equal(4, lease(name, 300, "a", 4, 0, 4).n)
    assert.equal(0, lease(name, 300, "b", 4, 0, 4).n)
    socket.sleep(0.15)
    assert.equal(4, lease(name, 300, "a", 4, 4, 4).n)  -- renewed in time
    socket.sleep(0.2)
    assert.equal(0, lease(name, 300, "b", 4, 0, 4).n)  -- a's renewal holds (0.35 s after its take)
    socket.sleep(0.15)
    local b = lease(name, 300, "b", 4, 0, 4)            -- a lapsed 0.3 s after its renewal
    assert.equal(4, b.n)
    assert.is_nil(stats(name).members.a)
  end)

  it("is quiet for one ttl on first sight and when the server changed (run_id): claims only", function()
    local name = fresh()
    local q = lease(name, 300, "a", 3, 1, 5)
    assert.equal(1, q.n)                                -- what it holds, nothing more
    assert.is_true(q.quiet > 200 and q.quiet <= 300, q.quiet)
    socket.sleep(0.32)
    q = lease(name, 300, "a", 3, 1, 5)
    assert.equal(0, q.quiet); assert.equal(3, q.n)
    -- a restart / failover: another run_id in the config
    local keys = scripts.keys("clientpool:fleet:", name)
    assert(c:raw("HSET", keys[1], "run_id", "another-server"))
    q = lease(name, 300, "b", 2, 0, 5)
    assert.equal(0, q.n)                                -- 2 units are free, but not granted while quiet
    assert.is_true(q.quiet > 200)
    q = lease(name, 300, "a", 5, 2, 5)
    assert.equal(2, q.n)                                -- what it claims to hold (n = need), not its old lease 3
    socket.sleep(0.32)
    assert.equal(2, lease(name, 60000, "b", 2, 0, 5).n)
  end)

  it("while quiet grants only what is claimed, not the new server's stale rows (a replica's)", function()
    -- cap 6; the replica has a = 5; on the master a dropped to 1 and b took
    -- 5 (not replicated); the failover: another run_id, quiet
    local name = ready(300)
    assert.equal(5, lease(name, 60000, "a", 5, 0, 6).n)
    local keys = scripts.keys("clientpool:fleet:", name)
    assert(c:raw("HSET", keys[1], "run_id", "the-old-master"))
    local a = lease(name, 60000, "a", 5, 1, 6)          -- holding 1, wanting 5
    assert.is_true(a.quiet > 0)
    assert.equal(1, a.n); assert.equal(1, a.stored)
    local b = lease(name, 60000, "b", 5, 5, 6)          -- b claims the 5 it took on the master
    assert.equal(5, b.n)
    assert.equal(6, b.sum)                              -- 1 + 5: never above the cap
  end)

  -- (issue 16, the fairness defect: a machine holding nothing but waiting
  -- had no row, so the holders never saw it and kept their spare)
  it("a machine holding nothing but waiting is seen by the holders (others, machines) and gets their spare",
          function()
    local name = ready(200)
    local a = lease(name, 60000, "a", 6, 4, 6)          -- a holds 4 and takes the whole 6
    assert.equal(6, a.n)
    local b = lease(name, 60000, "b", 3, 0, 6, nil, 3)  -- b: 3 callers waiting, nothing free
    assert.equal(0, b.n); assert.equal(0, b.stored)
    assert.equal(2, b.members)
    local s = stats(name)
    assert.equal(0, s.members.b.units); assert.equal(3, s.members.b.demand)
    a = lease(name, 60000, "a", 6, 4, 6)                -- a's renewal sees b waiting
    assert.equal(3, a.others); assert.equal(2, a.members)
    -- the fairness rule (docs/fleet.md 14.5): others wait, a has no waiters,
    -- so it asks for what it holds and its spare block goes back
    a = lease(name, 60000, "a", 4, 4, 6)
    assert.equal(4, a.n); assert.equal(4, a.sum)
    b = lease(name, 60000, "b", 3, 0, 6, nil, 3)
    assert.equal(2, b.n); assert.equal(6, b.sum)
    -- a machine holding nothing with nobody waiting is no member
    assert.equal(0, lease(name, 60000, "c", 0, 0, 6).stored)
    assert.is_nil(stats(name).members.c)
  end)

  it("a waiting machine's row lapses with its ttl like any lease", function()
    local name = ready(200)
    assert.equal(2, lease(name, 60000, "a", 2, 2, 2).n)
    assert.equal(0, lease(name, 250, "b", 1, 0, 2, nil, 1).n)
    assert.equal(1, lease(name, 60000, "a", 2, 2, 2).others)
    socket.sleep(0.3)
    local a = lease(name, 60000, "a", 2, 2, 2)
    assert.equal(0, a.others); assert.equal(1, a.members)
    assert.is_nil(stats(name).members.b)
  end)

  it("leases the other budgets in the same call, each against its own cap", function()
    local name = ready(200)
    -- a: 2 live units, and 3 of max_concurrency 4, 1 of max_idle 2
    local a = lease(name, 60000, "a", 2, 0, 6, nil, 0, { { "c", 3, 0, 4 }, { "i", 1, 0, 2 } })
    assert.equal(2, a.n); assert.equal(3, a.b.c.n); assert.equal(1, a.b.i.n)
    assert.equal(3, a.b.c.sum); assert.equal(1, a.b.i.sum)
    -- b asks for 4 and 2: only what is left of each
    local b = lease(name, 60000, "b", 2, 0, 6, nil, 0, { { "c", 4, 0, 4 }, { "i", 2, 0, 2 } })
    assert.equal(2, b.n); assert.equal(1, b.b.c.n); assert.equal(1, b.b.i.n)
    assert.equal(4, b.b.c.sum); assert.equal(2, b.b.i.sum)
    -- what a member holds is accounted above the cap, never granted
    b = lease(name, 60000, "b", 2, 2, 6, nil, 0, { { "c", 3, 3, 4 }, { "i", 2, 2, 2 } })
    assert.equal(1, b.b.c.n); assert.equal(6, b.b.c.sum)     -- granted 1 (free), holds 3
    assert.equal(1, b.b.i.n); assert.equal(3, b.b.i.sum)
    -- a gives back: its concurrency down to 1, its idle budget not asked for any more
    a = lease(name, 60000, "a", 2, 2, 6, nil, 0, { { "c", 1, 1, 4 } })
    assert.equal(1, a.b.c.n); assert.equal(4, a.b.c.sum)
    local s = stats(name)
    assert.equal(1, s.members.a.b.c); assert.is_nil(s.members.a.b.i)
    assert.equal(3, s.members.b.b.c); assert.equal(2, s.members.b.b.i)
    -- a member asking for nothing of any budget has no row
    local d = lease(name, 60000, "d", 0, 0, 6, nil, 0, { { "c", 0, 0, 4 } })
    assert.equal(0, d.b.c.n); assert.is_nil(stats(name).members.d)
    -- leave drops every budget
    lease(name, 60000, "b", 0, 0, 6, "leave", 0, { { "c", 0, 0, 4 }, { "i", 0, 0, 2 } })
    a = lease(name, 60000, "a", 2, 2, 6, nil, 0, { { "c", 4, 1, 4 }, { "i", 2, 0, 2 } })
    assert.equal(4, a.b.c.n); assert.equal(2, a.b.i.n); assert.is_nil(stats(name).members.b)
  end)

  it("a lapsed member's units of every budget go back with its lease; quiet grants only claims", function()
    local name = ready(200)
    assert.equal(3, lease(name, 250, "a", 1, 1, 6, nil, 0, { { "c", 3, 3, 3 } }).b.c.n)
    assert.equal(0, lease(name, 60000, "b", 1, 0, 6, nil, 0, { { "c", 2, 0, 3 } }).b.c.n)
    socket.sleep(0.3)
    local b = lease(name, 60000, "b", 1, 0, 6, nil, 0, { { "c", 2, 0, 3 } })
    assert.equal(2, b.b.c.n); assert.equal(2, b.b.c.sum)
    assert.is_nil(stats(name).members.a)
    -- a new server (run_id changed): for one ttl only what is claimed
    local keys = scripts.keys("clientpool:fleet:", name)
    assert(c:raw("HSET", keys[1], "run_id", "another-server"))
    local q = lease(name, 200, "b", 3, 1, 6, nil, 0, { { "c", 3, 1, 3 } })
    assert.is_true(q.quiet > 0)
    assert.equal(1, q.n); assert.equal(1, q.b.c.n)
  end)

  it("pauses a key on every machine: the lease reply carries the list when its generation moved", function()
    local name = ready(100)
    local keys = scripts.keys("clientpool:fleet:", name)
    local function with_gen(member, seen)
      local v = assert(c:script("lease", scripts.lease, keys, { 1000, member, 1, 0, 0, 5, "lease", 0, seen }))
      local out = { gen = v[10], list = {} }
      if v[11] then
        for i = 0, v[11] - 1 do out.list[v[12 + 3 * i]] = { why = v[13 + 3 * i], ms = v[14 + 3 * i] } end
      end
      return out, v[11] ~= nil
    end
    local r0, listed = with_gen("a", -1)
    assert.is_true(listed); assert.is_nil(next(r0.list))
    assert.equal(1, c:script("kpause", scripts.kpause, keys, { "origin-a", "maintenance", 0, 2 }))
    assert.equal(1, c:script("kpause", scripts.kpause, keys, { "origin-b", "429", 150, 2 }))
    -- max_keys (2) keys paused: a third is refused, a paused one may change
    assert.equal(0, c:script("kpause", scripts.kpause, keys, { "origin-c", "x", 0, 2 }))
    assert.equal(1, c:script("kpause", scripts.kpause, keys, { "origin-a", "maintenance", 0, 2 }))
    local r1 = with_gen("a", r0.gen)
    assert.is_true(r1.gen > r0.gen)
    assert.equal("maintenance", r1.list["origin-a"].why); assert.equal(-1, r1.list["origin-a"].ms)
    assert.equal("429", r1.list["origin-b"].why)
    assert.is_true(r1.list["origin-b"].ms > 0 and r1.list["origin-b"].ms <= 150)
    -- seen: no list
    local _, again = with_gen("a", r1.gen)
    assert.is_false(again)
    -- a deadline passed: listed with 0 left, dropped at the next change
    socket.sleep(0.2)
    assert.equal(0, with_gen("a", -1).list["origin-b"].ms)
    assert.equal(1, c:script("kresume", scripts.kresume, keys, { "origin-a" }))
    local r2 = with_gen("a", r1.gen)
    assert.is_nil(next(r2.list))
  end)

  it("pauses fleet-wide, with a deadline, and resumes", function()
    local name = ready(100)
    local keys = scripts.keys("clientpool:fleet:", name)
    assert.equal(1, c:script("pause", scripts.pause, keys, { "maintenance", 0 }))
    local q = lease(name, 1000, "a", 1, 0, 5)
    assert.equal("pmaintenance", q.pause); assert.equal(-1, q.pause_ms)
    assert.equal(1, c:script("resume", scripts.resume, keys, {}))
    assert.equal("-", lease(name, 1000, "a", 1, 0, 5).pause)
    assert(c:script("pause", scripts.pause, keys, { "503", 200 }))
    q = lease(name, 1000, "a", 1, 0, 5)
    assert.equal("p503", q.pause); assert.is_true(q.pause_ms > 100 and q.pause_ms <= 200)
    socket.sleep(0.25)
    assert.equal("-", lease(name, 1000, "a", 1, 0, 5).pause)
    assert.equal("-", stats(name).pause)
  end)

  it("members racing for the last units never get more than the cap between them", function()
    local name = ready(100)
    local max_live, rounds, nproc = 5, 400, 4
    local outs, procs = {}, {}
    for i = 1, nproc do
      outs[i] = os.tmpname()
      procs[i] = assert(io.popen(string.format("exec %s spec/redisfleet/racer.lua %q %q %d %q m%d %d %d %q",
        INTERP, package.path, package.cpath, r.port, name, i, max_live, rounds, outs[i]), "r"))
    end
    -- meanwhile, sampled from outside: what Redis holds for the members
    local samples, peak = 0, 0
    local keys = scripts.keys("clientpool:fleet:", name)
    local running = true
    while running do
      local vals = c:raw("HVALS", keys[2])
      local sum = 0
      for _, v in ipairs(vals) do sum = sum + tonumber(v) end
      if sum > peak then peak = sum end
      samples = samples + 1
      running = false
      for i = 1, nproc do
        local f = io.open(outs[i]); local n = 0
        if f then for _ in f:lines() do n = n + 1 end f:close() end
        if n < rounds then running = true end
      end
      if samples > 200000 then break end
    end
    for i = 1, nproc do procs[i]:close() end
    local replies, at_cap, granted_peak = 0, 0, 0
    for i = 1, nproc do
      for l in io.lines(outs[i]) do
        local n, sum = l:match("^(%d+) (%d+)$")
        n, sum = tonumber(n), tonumber(sum)
        replies = replies + 1
        assert.is_true(sum <= max_live, "a reply's sum " .. sum)
        assert.is_true(n <= sum)
        if sum == max_live then at_cap = at_cap + 1 end
        if sum > granted_peak then granted_peak = sum end
      end
      os.remove(outs[i])
    end
    print(string.format("\n  %d members x %d racing leases on max_live %d: %d replies at the cap, " ..
                        "%d outside samples, peak %d", nproc, rounds, max_live, at_cap, samples, peak))
    assert.equal(nproc * rounds, replies)
    assert.is_true(peak <= max_live)
    assert.is_true(at_cap > 0)                        -- (they did contend)
  end)

  it("fleet.new refuses bad Redis options with a clientpool: message naming the option", function()
    local fleet = require "clientpool.fleet"
    local R = { port = 6379 }
    local cases = {
      { { max_live = 4 }, "fleet option 'redis' must be a table" },
      { { max_live = 4, redis = R, per_key = { max_idle = 2 } }, "fleet option 'per_key.max_idle' is not supported" },
      { { max_live = 4, redis = R, max_concurrency = 0 }, "fleet option 'max_concurrency' must be an integer in [1," },
      { { max_live = 4, redis = R, min_idle = 9 }, "fleet option 'min_idle' must be an integer in [0, max_idle (4)]" },
      { { max_live = 4, redis = R, max_idle = 5 }, "fleet option 'max_idle' must be an integer in [0, max_live (4)]" },
      { { max_live = 0, redis = R }, "fleet option 'max_live' must be an integer in [1," },
      { { redis = R }, "fleet option 'max_live' is required" },
      { { max_live = 4, redis = { port = 0 } }, "fleet option 'redis.port' must be an integer in [1, 65535]" },
      { { max_live = 4, redis = { host = 5 } }, "fleet option 'redis.host' must be a non-empty string" },
      { { max_live = 4, redis = { db = -1 } }, "fleet option 'redis.db' must be an integer >= 0" },
      { { max_live = 4, redis = { timeout = 0 } }, "fleet option 'redis.timeout' must be a finite number" },
      { { max_live = 4, redis = { username = "u" } }, "fleet option 'redis.username' needs 'redis.password'" },
      { { max_live = 4, redis = { hots = "x" } }, "unknown fleet option 'redis.hots'" },
      { { max_live = 4, redis = R, ttl = 0.1 }, "fleet option 'ttl' must be a number of seconds in [0.2, 3600]" },
      { { max_live = 4, redis = R, machine = "a b" }, "fleet option 'machine' must be 1 to 64 bytes" },
      { { max_live = 4, redis = R, block = 5 }, "fleet option 'block' must be an integer in [1, max_live (4)]" },
      { { max_live = 4, redis = R, tll = 1 }, "unknown fleet option 'tll'" },
    }
    for _, case in ipairs(cases) do
      local o = case[1]
      o.backend = "redis"
      local ok, err = pcall(fleet.new, "spec-bad-redis", o)
      assert.is_false(ok)
      assert.truthy(tostring(err):find("clientpool: " .. case[2], 1, true), tostring(err))
    end
    local ok, err = pcall(fleet.new, "spec-bad-redis", { max_live = 4, backend = "etcd" })
    assert.is_false(ok)
    assert.truthy(err:find("must be \"shm\" (one machine) or \"redis\" (across machines), got etcd", 1, true), err)
  end)
end)
