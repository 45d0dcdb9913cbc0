-- Pools taking their budget from a fleet (clientpool.new{ fleet = name }),
-- in several plain Lua processes attaching by name (spec/fleet_member.lua,
-- started with this interpreter): the clients alive at once, counted from
-- the hooks of every process, never exceed the fleet's max_live; each
-- pool's stats agree with its member row; a member killed with kill -9
-- gives its share back to a member waiting for it (docs/fleet.md).
local core = require "clientpool.core"
local fleet = require "clientpool.fleet"
local clientpool = require "clientpool"

local IS_JIT = rawget(_G, "jit") ~= nil
local INTERP = (arg and arg[-1]) or (IS_JIT and "luajit" or ("lua" .. _VERSION:match("%d+%.%d+")))
local sleep, monotime = core.sleep, core.monotime
local MEMBER = "spec/fleet_member.lua"
local unpack = table.unpack or unpack

local n_made = 0
local function fresh(tag)
  n_made = n_made + 1
  return string.format("spec-pool-%s-%d-%d-%d", tag, n_made, os.time(), math.random(1, 1e9))
end

local function lines_of(path)
  local f = io.open(path, "r")
  if not f then return {} end
  local t = {}
  for l in f:lines() do t[#t + 1] = l end
  f:close()
  return t
end

describe("pools on a fleet, across processes", function()
  local children, names = {}, {}
  local min_idle_env   -- the fleet's min_idle, for the members' attach (which sets the limits)
  after_each(function()
    for _, c in ipairs(children) do
      if c.pid then os.execute("kill -9 " .. c.pid .. " 2>/dev/null") end
      pcall(c.p.close, c.p)
      os.remove(c.out)
    end
    children = {}
    min_idle_env = nil
    for _, n in ipairs(names) do fleet.remove(n) end
    names = {}
  end)

  local function new_fleet(tag, lim)
    local n = fresh(tag)
    names[#names + 1] = n
    fleet.new(n, lim)
    return n
  end

  local function spawn(mode, name, max_live, ...)
    local c = { out = os.tmpname() }
    os.remove(c.out)
    local args = {}
    for i, v in ipairs({ ... }) do args[i] = string.format("%q", tostring(v)) end
    local cmd = string.format("FLEET_MIN_IDLE=%d FLEET_MAX_LIVE=%d exec %s %s %s %q %q %q %q %s",
                              min_idle_env or 0, max_live, INTERP, MEMBER, mode, name,
                              c.out, package.path, package.cpath, table.concat(args, " "))
    c.p = assert(io.popen(cmd, "r"))
    children[#children + 1] = c
    for _ = 1, 2000 do
      local l = lines_of(c.out)
      if l[1] then c.pid = tonumber(l[1]:match("pid (%d+)")); return c end
      sleep(0.005)
    end
    error("member did not start: " .. cmd)
  end

  -- Waits until c's output has a line matching pat; returns its captures.
  local function expect(c, pat, limit)
    for _ = 1, (limit or 6000) do
      for _, l in ipairs(lines_of(c.out)) do
        local m = { l:match(pat) }
        if m[1] then return unpack(m) end
      end
      sleep(0.005)
    end
    error("member " .. tostring(c.pid) .. " never said " .. pat .. ":\n" .. table.concat(lines_of(c.out), "\n"))
  end

  it("never hold more than the fleet's max_live between them (4 processes x 6 tasks, max_live = 5)", function()
    local name = new_fleet("cap", { max_live = 5 })
    local cs = {}
    for i = 1, 4 do cs[i] = spawn("work", name, 5, 6, 60) end
    local ev, grants = {}, {}
    for i, c in ipairs(cs) do
      local live, member, g, failures = expect(c, "^stats (%d+) (%d+) (%d+) (%d+)$")
      assert.equal(live, member)               -- the pool's stats agree with its member row
      assert.equal("0", failures)
      grants[i] = tonumber(g)
      assert.equal("0", (expect(c, "^closed (%d+)$")))
      for _, l in ipairs(lines_of(c.out)) do
        local kind, t = l:match("^([cd]) (%S+)$")
        if kind then ev[#ev + 1] = { tonumber(t), kind == "c" and 1 or -1 } end
      end
    end
    table.sort(ev, function(a, b) if a[1] ~= b[1] then return a[1] < b[1] end return a[2] < b[2] end)
    local n, peak, creates = 0, 0, 0
    for _, e in ipairs(ev) do
      n = n + e[2]
      if e[2] > 0 then creates = creates + 1 end
      if n > peak then peak = n end
    end
    print(string.format("\n  fleet max_live 5, 4 processes: %d clients made, peak alive at once %d, " ..
                        "grants per process %s", creates, peak, table.concat(grants, " ")))
    assert.is_true(peak <= 5, "peak " .. peak)
    assert.is_true(peak >= 2)                  -- (the processes did overlap)
    assert.equal(0, n)
    for i = 1, 4 do assert.equal(360, grants[i]) end
    -- every member closed its pool: nothing is held
    local s = fleet.stats(name)
    assert.equal(0, s.live)
    assert.equal(0, s.idle)
  end)

  it("a member killed with kill -9 gives its share to a member waiting for it", function()
    local name = new_fleet("kill", { max_live = 3 })
    local holder = spawn("hold", name, 3, 3)
    expect(holder, "^held 3$")
    local waiter = spawn("wait", name, 3, 2, 20)
    expect(waiter, "^waiting 2$")
    sleep(0.2)                                 -- it is queued, blocked on the fleet
    assert.equal(0, #(function() local t = {} for _, l in ipairs(lines_of(waiter.out)) do
      if l:match("^got") then t[#t + 1] = l end end return t end)())
    local t_kill = monotime()
    os.execute("kill -9 " .. holder.pid)
    holder.pid = nil
    local got = tonumber(expect(waiter, "^got (%S+)$"))
    local fl, mine = expect(waiter, "^fleet (%d+) (%d+) 2$")
    print(string.format("\n  kill -9 of the member holding the fleet's 3: the waiter's grant %.1f ms later",
                        (got - t_kill) * 1000))
    assert.equal("2", fl)
    assert.equal("2", mine)
    assert.is_true(fleet.stats(name).reclaimed >= 1)
  end)

  it("a policy's pause with scope = \"fleet\" gates every member, resume_after fleet-wide", function()
    local name = new_fleet("pause", { max_live = 4 })
    local probe = spawn("probe", name, 4, 3)
    expect(probe, "^ok ")
    local pool = clientpool.new { fleet = name, create = function() return {} end, pause_mode = "fail",
      policy = function(outcome) if outcome == "down" then return { pause = "down", scope = "fleet",
                                                                      resume_after = 0.5 } end end }
    local l = assert(pool:try_acquire())
    local t_pause = monotime()
    l:observe("down")
    l:release()
    -- this member at once
    local ok, code, reason = pool:try_acquire()
    assert.is_nil(ok)
    assert.equal("paused", code)
    assert.equal("down", reason)
    -- the other process sees the fleet's pause, then the gate opens by itself
    expect(probe, "^paused down ")
    local t_open
    for _ = 1, 400 do
      local seen_pause = false
      for _, ln in ipairs(lines_of(probe.out)) do
        if ln:match("^paused down ") then seen_pause = true
        elseif seen_pause and ln:match("^ok ") then t_open = tonumber(ln:match("^ok (%S+)")) break end
      end
      if t_open then break end
      sleep(0.01)
    end
    assert.is_not_nil(t_open, "the probe never saw the gate open again")
    print(string.format("\n  fleet pause (resume_after 0.5 s): the other member admits again %.0f ms after the pause",
                        (t_open - t_pause) * 1000))
    assert.is_true(t_open - t_pause >= 0.5)
    expect(probe, "^end$")
    pool:close()
  end)

  it("rebalance: idle clients of another member are shed for a member whose callers wait", function()
    local name = new_fleet("shed", { max_live = 4 })
    local a = spawn("idle", name, 4, 4, 3)
    assert.equal("4", (expect(a, "^idle (%d+)$")))
    assert.equal(4, fleet.stats(name).idle)   -- the fleet's cap, held idle by one process
    local w = spawn("wait", name, 4, 2, 20)
    expect(w, "^waiting 2$")
    local t0 = monotime()
    local fl, mine = expect(w, "^fleet (%d+) (%d+) 2$")
    local dt = monotime() - t0
    print(string.format("\n  2 callers of a member against 4 idle clients of another: served in %.0f ms " ..
                        "(the idle member's tick sheds its share above the fair one)", dt * 1000))
    assert.equal("2", mine)
    assert.is_true(tonumber(fl) <= 4)
    local shed, left = expect(a, "^shed (%d+) (%d+)$")
    assert.equal("2", shed)                  -- down to its fair share: ceil(4 / 2 members)
    assert.equal("2", left)
  end)

  -- The clients alive now by the hooks of the members in `cs` (created
  -- minus destroyed): with nobody acquiring, all of them are idle.
  local function alive(cs)
    local n = 0
    for _, c in ipairs(cs) do
      for _, l in ipairs(lines_of(c.out)) do
        if l:match("^c ") then n = n + 1 elseif l:match("^d ") then n = n - 1 end
      end
    end
    return n
  end

  it("the warm floor is kept once across the fleet, and rebuilt by the others when its holder is killed", function()
    min_idle_env = 2
    local name = new_fleet("floor", { max_live = 8, min_idle = 2 })
    local cs = {}
    for i = 1, 4 do cs[i] = spawn("floor", name, 8, 30) end
    for _, c in ipairs(cs) do expect(c, "^floor ") end
    -- the fleet's floor of 2, not 4 members x 2: settled, and stays so
    local t0 = monotime()
    while alive(cs) < 2 and monotime() - t0 < 5 do sleep(0.01) end
    sleep(1.0)                                 -- (four ticks of every member: nobody adds one)
    local total = alive(cs)
    local s = fleet.stats(name)
    print(string.format("\n  fleet min_idle 2, 4 members each with min_idle 2: %d clients alive (fleet idle %d)",
                        total, s.idle))
    assert.equal(2, total)
    assert.equal(2, s.idle)
    -- kill -9 every member holding the floor: the others rebuild it
    local holders, rest = {}, {}
    for _, c in ipairs(cs) do
      if alive({ c }) > 0 then holders[#holders + 1] = c else rest[#rest + 1] = c end
    end
    assert.is_true(#rest >= 2)
    local t_kill = monotime()
    for _, c in ipairs(holders) do os.execute("kill -9 " .. c.pid); c.pid = nil end
    local t_back
    while monotime() - t_kill < 5 do
      if alive(rest) >= 2 then t_back = monotime() break end
      sleep(0.005)
    end
    assert.is_not_nil(t_back, "the floor was not rebuilt by the other members within 5 s")
    print(string.format("  kill -9 of the %d member(s) holding the floor: rebuilt by the others %.0f ms later",
                        #holders, (t_back - t_kill) * 1000))
    sleep(0.6)
    assert.equal(2, alive(rest))               -- once, again
    assert.equal(2, fleet.stats(name).idle)
    assert.is_true(fleet.stats(name).reclaimed >= #holders)
  end)

  it("refuses options above the fleet's figures, and an unknown fleet", function()
    local name = new_fleet("opts", { max_live = 4, max_idle = 2 })
    local function err_of(o)
      local ok, e = pcall(clientpool.new, o)
      assert.is_false(ok)
      return e
    end
    local e = err_of { fleet = name, max_live = 5, create = function() return {} end }
    assert.truthy(e:find("clientpool: option 'max_live' (5) must be <= the fleet's max_live (4)", 1, true), e)
    e = err_of { fleet = name, max_idle = 3, create = function() return {} end }
    assert.truthy(e:find("option 'max_idle' (3) must be <= the fleet's max_idle (2)", 1, true), e)
    e = err_of { fleet = "no-such-fleet-x", create = function() return {} end }
    assert.truthy(e:find("clientpool: option 'fleet': no fleet 'no-such-fleet-x'", 1, true), e)
    e = err_of { fleet = 42, create = function() return {} end }
    assert.truthy(e:find("option 'fleet' must be the name of a fleet", 1, true), e)
    -- the defaults are the fleet's; a local max_live caps this process's share
    local p = clientpool.new { fleet = name, create = function() return {} end, max_live = 2 }
    local a, b = assert(p:try_acquire()), assert(p:try_acquire())
    assert.is_nil((p:try_acquire()))          -- its own share's cap
    local s = p:stats()
    assert.equal(2, s.live)
    assert.equal(2, s.fleet.live)
    assert.equal(2, s.fleet.member.live)
    a:release(); b:release()
    p:close()
  end)

  it("configure() checks the new values against the fleet's figures, as new() does", function()
    local name = new_fleet("conf", { max_live = 4, max_idle = 3, min_idle = 1, per_key = { max_live = 3 } })
    local p = clientpool.new { fleet = name, create = function() return {} end, max_live = 2 }
    local function err_of(o)
      local ok, e = pcall(p.configure, p, o)
      assert.is_false(ok)
      return e
    end
    local before = p._c
    local e = err_of { max_live = 5 }
    assert.truthy(e:find("clientpool: option 'max_live' (5) must be <= the fleet's max_live (4)", 1, true), e)
    e = err_of { max_idle = 4 }
    assert.truthy(e:find("clientpool: option 'max_idle' (4) must be <= the fleet's max_idle (3)", 1, true), e)
    e = err_of { min_idle = 2 }
    assert.truthy(e:find("clientpool: option 'min_idle' (2) must be <= the fleet's min_idle (1)", 1, true), e)
    e = err_of { per_key = { max_live = 4 } }
    assert.truthy(e:find("clientpool: option 'per_key.max_live' (4) must be <= the fleet's per_key.max_live (3)",
                         1, true), e)
    -- nothing changed on refusal
    assert.equal(before, p._c)
    local a, b = assert(p:try_acquire()), assert(p:try_acquire())
    assert.is_nil((p:try_acquire()))          -- still its share's cap of 2
    -- within the fleet's figures: accepted, the share's cap raised
    assert.is_true(p:configure { max_live = 4 })
    local c = assert(p:try_acquire())
    assert.equal(3, p:stats().fleet.member.live)
    -- false: back to the fleet's default (its max_live), not the engine's
    assert.is_true(p:configure { max_live = false })
    assert.equal(4, p._c.max_live)
    a:release(); b:release(); c:release()
    p:close()
  end)
end)
