-- clientpool.fleet: fleet.new validates its options as clientpool.new
-- does; separate plain Lua processes attach to one fleet by
-- name and share its budget, and a killed one's share comes back.
-- The bindings are in fleet_ffi_spec.lua, the FFI declarations in
-- fleet_cdef_spec.lua; the C tests (spec/c/test_fleet.c) cover the core
-- under forked hammering.

local core = require "clientpool.core"

local IS_JIT = rawget(_G, "jit") ~= nil
local INTERP = (arg and arg[-1]) or (IS_JIT and "luajit" or ("lua" .. _VERSION:match("%d+%.%d+")))
local sleep = core.sleep

local H = require "spec.helpers"
local name_for, cleanup, made = H.fleet_names("fleet")

-- the bindings the children of "across processes" use
local BACKENDS = { { "core" } }
if IS_JIT then BACKENDS[2] = { "ffi" } end

describe("clientpool.fleet", function()
  local fleet = require "clientpool.fleet"
  after_each(cleanup)

  local function err_of(fn, ...)
    local ok, e = pcall(fn, ...)
    assert.is_false(ok, "expected an error")
    return tostring(e)
  end

  it("validates options as clientpool.new does, naming the option and the rule", function()
    local cases = {
      { nil, "fleet.new expects an options table, got nil" },
      { {}, "fleet option 'max_live' is required" },
      { { max_live = 0 }, "fleet option 'max_live' must be >= 1, got 0" },
      { { max_live = 1.5 }, "fleet option 'max_live' must be an integer, got 1.5" },
      { { max_live = "2" }, "fleet option 'max_live' must be an integer, got string" },
      { { max_live = 4, max_idle = 5 }, "fleet option 'max_idle' (5) must be <= max_live (4)" },
      { { max_live = 4, max_idle = 2, min_idle = 3 }, "fleet option 'min_idle' (3) must be <= max_idle (2)" },
      { { max_live = 4, max_concurrency = 0 }, "fleet option 'max_concurrency' must be >= 1, got 0" },
      { { max_live = 4, per_key = 3 }, "fleet option 'per_key' must be a table, got number" },
      { { max_live = 4, per_key = { max_live = 5 } }, "fleet option 'per_key.max_live' (5) must be <= max_live (4)" },
      { { max_live = 4, per_key = { max_idle = 5 } }, "fleet option 'per_key.max_idle' (5) must be <= max_idle (4)" },
      { { max_live = 4, per_key = { max_live = 2, max_idle = 3 } },
        "fleet option 'per_key.max_idle' (3) must be <= per_key.max_live (2)" },
      { { max_live = 4, min_idle = 3, per_key = { max_live = 2 } },
        "fleet option 'min_idle' (3) must be <= per_key.max_live (2)" },
      { { max_live = 4, per_key = { max_waiting = 1 } }, "unknown fleet option 'per_key.max_waiting'" },
      { { max_live = 4, max_keys = 0 }, "fleet option 'max_keys' must be >= 1, got 0" },
      { { max_live = 4, max_keys = 70000 }, "fleet option 'max_keys' must be <= 65536, got 70000" },
      { { max_live = 4, members = 5000 }, "fleet option 'members' must be <= 4096, got 5000" },
      { { max_live = 4, members = 4096, max_keys = 4096 }, "fleet options 'members' x 'max_keys' (4096 x 4096)" },
      { { max_live = 4, attempts = 0 }, "fleet option 'attempts' must be >= 1, got 0" },
      { { max_live = 4, max_waiting = 3 }, "unknown fleet option 'max_waiting'" },
      { { max_live = 4, backend = "redis" }, "fleet option 'redis' must be a table { host, port, ... }, got nil" },
    }
    for _, c in ipairs(cases) do
      local e = err_of(fleet.new, name_for("v"), c[1])
      assert.truthy(e:find("clientpool: ", 1, true) == 1, e)
      assert.truthy(e:find(c[2], 1, true), "expected '" .. c[2] .. "' in: " .. e)
    end
    for _, bad in ipairs { "", 42, ("x"):rep(201), "a\0b" } do
      local e = err_of(fleet.new, bad, { max_live = 1 })
      assert.truthy(e:find("clientpool: fleet.new: the fleet name must be", 1, true), e)
    end
    -- nothing was created by a refused call
    local e = err_of(fleet.stats, made[1])
    assert.truthy(e:find("no fleet", 1, true), e)
  end)

  it("creates, then attaches and updates the limits", function()
    local name = name_for("new")
    local f = fleet.new(name, { max_live = 8, per_key = { max_live = 4 }, max_keys = 16, members = 8 })
    assert.is_true(f.created)
    assert.equal(name, f.name)
    local s = fleet.stats(name)
    assert.equal(8, s.limits.max_live)
    assert.equal(8, s.limits.max_idle)
    assert.equal(0, s.limits.min_idle)
    assert.is_nil(s.limits.max_concurrency)     -- none unless given
    assert.equal(4, s.limits.per_key.max_live)
    assert.is_nil(s.limits.per_key.max_idle)
    assert.equal(16, s.limits.max_keys)
    assert.equal(8, s.rows)
    local again = fleet.new(name, { max_live = 20, max_idle = 10, min_idle = 2, max_concurrency = 100,
                                    max_keys = 8, members = 4 })
    assert.equal(f, again)                      -- one object per process and name
    assert.is_false(again.created)
    s = f:stats()
    assert.equal(20, s.limits.max_live)
    assert.equal(10, s.limits.max_idle)
    assert.equal(2, s.limits.min_idle)
    assert.equal(100, s.limits.max_concurrency)
    assert.is_nil(s.limits.per_key.max_live)
    assert.equal(8, s.limits.max_keys)
    local e = err_of(fleet.new, name, { max_live = 20, members = 9 })
    assert.truthy(e:find("members = 8, max_keys = 16", 1, true), e)
    assert.truthy(e:find("fleet.remove", 1, true), e)
    -- remove unlinks; the next new makes a fresh segment
    assert.is_true(fleet.remove(name))
    assert.is_false(fleet.remove(name))
    local f2 = fleet.new(name, { max_live = 3 })
    assert.is_true(f2.created)
    assert.equal(3, fleet.stats(name).limits.max_live)
  end)

  it("validates a Redis fleet's budgets, naming what is not leased across machines yet", function()
    local base = { backend = "redis", max_live = 4, ttl = 1, machine = "m1", redis = { host = "127.0.0.1", port = 6 } }
    local function with(t)
      local o = {}
      for k, v in pairs(base) do o[k] = v end
      for k, v in pairs(t) do o[k] = v end
      return o
    end
    for _, c in ipairs {
      { with { max_idle = 5 }, "fleet option 'max_idle' must be an integer in [0, max_live (4)], got 5" },
      { with { max_idle = -1 }, "fleet option 'max_idle' must be an integer in [0, max_live (4)], got -1" },
      { with { max_concurrency = 0 }, "fleet option 'max_concurrency' must be an integer in [1, 1073741823], got 0" },
      { with { max_concurrency = 1.5 },
        "fleet option 'max_concurrency' must be an integer in [1, 1073741823], got 1.5" },
      { with { min_idle = 5 }, "fleet option 'min_idle' must be an integer in [0, max_idle (4)], got 5" },
      { with { max_idle = 2, min_idle = 3 }, "fleet option 'min_idle' must be an integer in [0, max_idle (2)], got 3" },
      { with { per_key = { max_idle = 2 } },
        "fleet option 'per_key.max_idle' is not supported with backend = \"redis\" yet" },
      { with { per_key = { max_live = 5 } },
        "fleet option 'per_key.max_live' must be an integer in [1, max_live (4)]" },
      { with { per_key = { max_live = 2 }, max_keys = 65 },
        "fleet option 'max_keys' must be <= 64 with per_key.max_live and backend = \"redis\", got 65" },
    } do
      local e = err_of(fleet.new, name_for("rv"), c[1])
      assert.truthy(e:find("clientpool: " .. c[2], 1, true), e)
    end
    local name = name_for("rb")
    local f = fleet.new(name, with { max_idle = 2, max_concurrency = 3, per_key = { max_live = 2 } })
    assert.equal(2, f._redis.cfg.max_idle); assert.equal(3, f._redis.cfg.max_concurrency)
    assert.equal(2, #f._redis.bud); assert.equal(2, f._redis.cfg.key_max_live); assert.equal(64, f._redis.cfg.max_keys)
    -- before its first lease the machine's local shares admit nothing (a
    -- key: nothing until its own cap is set)
    local lim = assert(fleet._backend.open(name .. ".m1")):limits()
    assert.equal(0, lim.max_live); assert.equal(0, lim.max_concurrency); assert.equal(0, lim.key_max_live)
    fleet.remove(name)
  end)

  it("refuses a second attach of a Redis fleet with another ttl, machine or redis (the agent's lease keeps the first)",
     function()
    local name = name_for("rattach")
    local base = { backend = "redis", max_live = 4, ttl = 1, machine = "m1", redis = { host = "127.0.0.1", port = 6 } }
    local function with(k, v)
      local o = {}
      for k2, v2 in pairs(base) do o[k2] = v2 end
      o[k] = v
      return o
    end
    local f = fleet.new(name, base)               -- no Redis call at new: port 6 is never dialled here
    for _, c in ipairs {
      { with("ttl", 10), "option 'ttl' differs from this process's first attach (1, now 10)" },
      { with("machine", "m2"), "option 'machine' differs from this process's first attach (m1, now m2)" },
      { with("redis", { host = "127.0.0.1", port = 7 }), "option 'redis.port' differs" },
      { with("redis", { host = "127.0.0.1", port = 6, password = "x" }), "option 'redis.password' differs" },
      { with("max_concurrency", 3), "option 'max_concurrency' differs from this process's first attach (nil, now 3)" },
      { with("max_idle", 2), "option 'max_idle' differs from this process's first attach (nil, now 2)" },
      { with("per_key", { max_live = 2 }), "option 'per_key.max_live' differs from this process's first attach" },
    } do
      local e = err_of(fleet.new, name, c[1])
      assert.truthy(e:find("clientpool: fleet.new('" .. name .. "'): " .. c[2], 1, true), e)
    end
    -- nothing was opened by a refused call: no local segment for machine m2
    assert.is_nil((fleet._backend.open(name .. ".m2")))
    assert.is_nil((fleet._backend.open(name .. ".m2.agent")))
    assert.equal(f, fleet.new(name, with("max_live", 6)))   -- figures read at every lease may change
    assert.equal(6, f._redis.cfg.max_live)
    assert.equal(1, f._redis.cfg.ttl)
    fleet.remove(name)
  end)

  it("reports counts fleet-wide, per key and per member, and pauses fleet-wide or per key", function()
    local name = name_for("stats")
    fleet.new(name, { max_live = 4 })
    local h = assert(fleet._backend.open(name))
    assert(h:join())
    local k = assert(h:key_open("origin-a"))
    h:take(fleet._backend.LIVE, k)
    h:take(fleet._backend.IDLE, k)
    local s = fleet.stats(name)
    assert.equal(1, s.live)
    assert.equal(1, s.idle)
    assert.equal(1, s.member_count)
    assert.equal(1, #s.members)
    assert.equal(1, s.members[1].live)
    assert.is_true(s.members[1].alive)
    assert.equal(1, s.keys["origin-a"].live)
    assert.equal(1, s.keys["origin-a"].members)
    assert.is_false(s.paused)
    assert.is_false(s.keys["origin-a"].paused)
    fleet.pause(name, "maintenance")
    assert.equal("maintenance", fleet.stats(name).paused)
    local paused, reason = h:gate()
    assert.is_true(paused)
    assert.equal("maintenance", reason)
    fleet.resume(name)
    assert.is_false(fleet.stats(name).paused)
    fleet.pause(name, "503", "origin-a")
    assert.equal("503", fleet.stats(name).keys["origin-a"].paused)
    assert.is_true((h:gate(k)))
    fleet.resume(name, "origin-a")
    assert.is_false((h:gate(k)))
    fleet.pause(name, "retry-after", nil, { resume_after = 3600 })
    assert.equal("retry-after", fleet.stats(name).paused)
    fleet.resume(name)
    assert.truthy(err_of(fleet.pause, name, 42):find("reason must be a string", 1, true))
    assert.truthy(err_of(fleet.pause, name, "r", nil, { resume_after = -1 }):find("resume_after", 1, true))
    assert.truthy(err_of(fleet.pause, name, "r", ("k"):rep(300)):find("key must be a string of at most 256", 1, true))
    assert.truthy(err_of(fleet.pause, "nope-" .. name, "r"):find("no fleet 'nope-", 1, true))
    h:close()
    assert.equal(0, fleet.stats(name).live)      -- closing a member gives its units back
  end)

  -- Plain Lua processes, started with this interpreter, attaching by name.
  describe("across processes", function()
    local script
    setup(function()
      script = os.tmpname()
      local f = assert(io.open(script, "w"))
      f:write([=[
local name, backend, lpath, cpath, out = arg[1], arg[2], arg[3], arg[4], arg[5]
package.path, package.cpath = lpath, cpath
local B = backend == "ffi" and require "clientpool.fleet_ffi" or require("clientpool.core").fleet
local function say(...)
  local o = assert(io.open(out, "a"))
  o:write(table.concat({ ... }, " "), "\n")
  o:close()
end
local pid = assert(io.open("/proc/self/stat")):read("*l"):match("^(%d+)")
local h = assert(B.open(name))
assert(h:join())
say("pid", pid)
local keys = {}
for line in io.lines() do
  local cmd, a = line:match("^(%S+)%s*(%S*)")
  local k = -1
  if a ~= "" then keys[a] = keys[a] or assert(h:key_open(a)); k = keys[a] end
  if cmd == "take" then say("take", h:take(B.LIVE, k))
  elseif cmd == "give" then say("give", h:give(B.LIVE, k))
  elseif cmd == "gate" then local p, r = h:gate(); say("gate", tostring(p), r or "-")
  elseif cmd == "new" then
    local fleet = require "clientpool.fleet"
    fleet.new(name, { max_live = tonumber(a) })
    say("new", "ok")
  elseif cmd == "scan" then say("scan", h:scan(true))
  elseif cmd == "leave" then h:close(); say("leave", "ok"); break
  elseif cmd == "exit" then say("exit", "ok"); os.exit(0) end    -- holding: reclaimed as dead
end
]=])
      f:close()
    end)
    teardown(function() os.remove(script) end)

    local children = {}
    after_each(function()
      for _, c in ipairs(children) do
        if c.pid then os.execute("kill -9 " .. c.pid .. " 2>/dev/null") end
        pcall(c.p.close, c.p)
        os.remove(c.out)
      end
      children = {}
    end)

    local function lines_of(path)
      local f = io.open(path, "r")
      if not f then return {} end
      local t = {}
      for l in f:lines() do t[#t + 1] = l end
      f:close()
      return t
    end

    local function spawn(name, backend)
      local c = { out = os.tmpname(), n = 0 }
      os.remove(c.out)
      local cmd = string.format("exec %s %q %q %q %q %q %q", INTERP, script, name, backend,
                                package.path, package.cpath, c.out)
      c.p = assert(io.popen(cmd, "w"))
      children[#children + 1] = c
      for _ = 1, 1000 do                        -- its first line: the pid
        local l = lines_of(c.out)
        if l[1] then c.pid = tonumber(l[1]:match("pid (%d+)")); c.n = 1; return c end
        sleep(0.01)
      end
      error("child did not start: " .. cmd)
    end

    local function send(c, line)
      c.p:write(line, "\n")
      c.p:flush()
      for _ = 1, 1000 do
        local l = lines_of(c.out)
        if #l > c.n then c.n = c.n + 1; return l[c.n] end
        sleep(0.01)
      end
      error("child " .. tostring(c.pid) .. " did not answer '" .. line .. "'")
    end

    for _, b in ipairs(BACKENDS) do
      local bname = b[1]
      it("share one budget; a killed member's share comes back (" .. bname .. " in the children)", function()
        local name = name_for("procs")
        fleet.new(name, { max_live = 5, per_key = { max_live = 3 } })
        local cs = { spawn(name, bname), spawn(name, bname), spawn(name, bname) }
        local taken, refused = 0, 0
        for round = 1, 3 do
          for _, c in ipairs(cs) do
            local r = send(c, "take k" .. (round % 2))
            if r == "take 0" then taken = taken + 1 else refused = refused + 1 end
          end
        end
        assert.equal(5, taken)                   -- the fleet's cap, not 5 per process
        assert.equal(4, refused)
        local s = fleet.stats(name)
        assert.equal(5, s.live)
        assert.equal(3, s.member_count)
        assert.is_true(s.keys.k0.live <= 3 and s.keys.k1.live <= 3)
        local pids = {}
        for _, m in ipairs(s.members) do pids[m.pid] = m.live end
        for _, c in ipairs(cs) do assert.is_not_nil(pids[c.pid], "member pid " .. c.pid) end
        -- a fleet-wide pause reaches every member
        fleet.pause(name, "draining")
        assert.equal("gate true draining", send(cs[2], "gate"))
        fleet.resume(name)
        assert.equal("gate false -", send(cs[3], "gate"))
        -- attaching with other limits updates them for everybody
        assert.equal("new ok", send(cs[1], "new 6"))
        assert.equal(6, fleet.stats(name).limits.max_live)
        -- kill -9 the member holding the most; another member's scan reclaims it
        local victim = cs[1]
        local held = pids[victim.pid]
        assert.is_true(held > 0)
        os.execute("kill -9 " .. victim.pid)
        victim.p:close()
        victim.pid = nil
        assert.equal("scan 1", send(cs[2], "scan"))
        s = fleet.stats(name)
        assert.equal(5 - held, s.live)
        assert.equal(2, s.member_count)
        assert.equal(1, s.reclaimed)
        assert.equal("take 0", send(cs[3], "take k0"))
        -- one leaves cleanly, the other exits holding: both end at zero
        assert.equal("leave ok", send(cs[2], "leave"))
        cs[2].p:close(); cs[2].pid = nil
        assert.equal("exit ok", send(cs[3], "exit"))
        cs[3].p:close(); cs[3].pid = nil
        -- no member is left alive: the next attach recovers the stale segment
        local h = assert(fleet._backend.open(name))
        s = fleet.stats(name)
        assert.equal(0, s.live)
        assert.equal(0, s.member_count)
        assert.equal(2, s.reclaimed)
        assert.equal(1, s.resets)
        h:close()
      end)
    end
  end)
end)
