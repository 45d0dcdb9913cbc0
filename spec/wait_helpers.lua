-- The helpers of the waiting suites (acquire_wait_spec.lua,
-- acquire_wait_dead_spec.lua): each scenario runs as a task on each
-- scheduler of H.schedulers(), its times written for a virtual clock and
-- scaled with T(); on real clocks a time is a lower bound (H.time).
local clientpool = require "clientpool"
local H = require "spec.helpers"
-- (busted gives its assert to the spec files, not to the modules they require)
local assert = require "luassert"

local co_close = coroutine.close -- Lua 5.4 only
local unpack = table.unpack or unpack -- luacheck: ignore 143

-- pcall that lets the function yield: plain pcall on Lua 5.2+ and LuaJIT; on
-- PUC Lua 5.1 the function runs in a coroutine whose yields are passed up.
local ypcall = pcall
if _VERSION == "Lua 5.1" and not rawget(_G, "jit") then
  local function pack(...) return { n = select("#", ...), ... } end
  ypcall = function(fn, ...)
    local co = coroutine.create(fn)
    local r = pack(coroutine.resume(co, ...))
    while r[1] and coroutine.status(co) == "suspended" do
      r = pack(coroutine.resume(co, coroutine.yield(unpack(r, 2, r.n))))
    end
    return unpack(r, 1, r.n)
  end
end

local function contains(s, part)
  return tostring(s):find(part, 1, true) ~= nil
end

-- The clock when the running scenario began (at() measures from it).
local base = 0

-- Runs body(sched) as a task of a fresh scheduler of entry S, to completion.
local function run(S, body)
  local sched = S.new()
  S.run(sched, function(...) base = sched.now(); return body(...) end, sched)
  return sched
end

-- A pool on sched with the factory's hooks; o holds further options.
local function new_pool(sched, f, o)
  o = o or {}
  o.create = o.create or f.create
  o.destroy = o.destroy or f.destroy
  o.max_live = o.max_live or 1
  o.scheduler = sched
  return clientpool.new(o)
end

-- A task that acquires and records the outcome: spec/helpers.lua H.waiter.
local waiter = H.waiter

-- Makes a coroutine that is suspended inside a wait dead. Lua 5.4 closes it;
-- elsewhere a count hook raises an error in it as soon as it is resumed (the
-- resume comes from outside the scheduler). LuaJIT hooks are global, so the
-- hook checks where it runs and is removed afterwards; its compiled traces
-- are flushed first, as compiled code runs no count hook.
local function kill(co, how)
  assert.equal("suspended", coroutine.status(co))
  if how == "close" then
    assert.is_true((co_close(co)))
  else
    local jit = rawget(_G, "jit")
    if jit then jit.flush() end
    debug.sethook(co, function()
      if coroutine.running() == co then error("killed", 0) end
    end, "", 1)
    local ok, err = coroutine.resume(co)
    debug.sethook(co)
    debug.sethook()
    assert.is_false(ok)
    assert.equal("killed", err)
  end
  assert.equal("dead", coroutine.status(co))
end

-- Asserts that no lease is lost: nothing leased, waiting or being created,
-- every live client idle, and the pool's identities hold.
-- The cap is physical: a destroyed client counts against max_live until its
-- destroy hook returned, and the hook runs in a task of its own. A turn for
-- that task, then one for the waiter served from the room it freed.
local function after_destroy(sched)
  sched.sleep(0)
  sched.sleep(0)
end

local function assert_settled(pool)
  local s = H.check(pool)
  assert.equal(0, s.leases)
  assert.equal(0, s.active)
  assert.equal(0, s.waiting)
  assert.equal(0, s.creating)
  assert.equal(s.live, s.idle)
  return s
end

local W = {
  co_close = co_close, ypcall = ypcall, contains = contains, run = run, new_pool = new_pool,
  waiter = waiter, kill = kill, after_destroy = after_destroy, assert_settled = assert_settled,
}

-- fn(S, T, at, took, it_virtual) for each scheduler entry S, after a
-- pending describe for each scheduler that cannot run here. B holds the
-- spec file's describe, it and pending (busted gives them to the file,
-- not to the modules it requires).
--   T(x)                      spec seconds to the entry's seconds
--   at(expected, t, what)     the clock value t is `expected` spec seconds into the scenario
--   took(expected, d, what)   the duration d (the entry's seconds) is `expected` spec seconds
--   it_virtual(name, why, f)  a scenario that only a virtual clock runs in reasonable time
function W.each_scheduler(B, fn)
  for _, M in ipairs(H.missing_schedulers()) do
    B.describe("clientpool waiting on " .. M.name, function()
      B.pending("not run: " .. M.reason)
    end)
  end
  for _, S in ipairs(H.schedulers { hosts = true }) do
    local function T(x) return x * S.scale end
    local function at(expected, t, what) H.time(S, expected, t - base, what) end
    local function took(expected, d, what) H.time(S, expected, d, what) end
    local function it_virtual(name, why, f)
      if S.real then B.pending(name .. " [virtual clock only: " .. why .. "]") else B.it(name, f) end
    end
    fn(S, T, at, took, it_virtual)
  end
end

return W
