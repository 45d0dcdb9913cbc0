-- Run by spec/leak_spec.lua in a fresh interpreter: a lease
-- collected while held counts as leaked. A fresh process, because inside a
-- long busted run a stale slot somewhere can keep one particular lease
-- alive for a while, which made the in-process version flaky.
-- usage: gc_leak_check.lua [capacity [recycled]] (capacity > 1: a shared
-- lease, whose co-holder bookkeeping must not keep it from the collector;
-- recycled: the leaked lease's sentinel is one a released lease had, and
-- that released lease is still referenced); a third argument "real" runs
-- it on a real clock, where C API pools acquire and release in C
-- (clientpool.core.fastpath)
local capacity = tonumber(arg and arg[1]) or 1
local recycled = arg and arg[2] == "recycled"
local clientpool = require "clientpool"
local loop = require("clientpool.loop").new { clock = arg and arg[3] == "real" and "real" or "virtual" }

local created, destroyed = 0, 0
local alive = {}
local pool = clientpool.new {
  max_live = 1, capacity = capacity, scheduler = loop,
  create = function() created = created + 1; alive[created] = true; return { id = created } end,
  destroy = function(c) destroyed = destroyed + 1; alive[c.id] = false end,
}
local leaks = {}
pool:on("leak", function(key, info) leaks[#leaks + 1] = { key = key, info = info } end)

local function check(cond, what)
  if not cond then io.write("FAIL ", what, "\n"); os.exit(1) end
end

local kept
loop.spawn(function()
  if recycled then
    for i = 1, 3 do
      local l = assert(pool:acquire("k"))
      l:release()
      if i == 1 then kept = l end
    end
  end
  -- every lease the client can carry (one, or `capacity` shared ones) is
  -- dropped; the collector waits until they are counted as held (a cycle
  -- of its own in between collected them before that count)
  collectgarbage("stop")
  local co = coroutine.create(function()
    local id
    for _ = 1, capacity do id = assert(pool:acquire("k")).client.id end
    return id
  end)
  local ok, id = coroutine.resume(co)
  check(ok and id == 1, "acquire")
  co = nil -- luacheck: ignore
  check(pool:stats().leases == capacity, "leases held")
  collectgarbage("restart")
  for _ = 1, 4 do collectgarbage("collect") end
  local s = pool:stats()
  check(s.leaked == capacity, "leaked " .. s.leaked)
  check(s.closed_by.leaked == 1, "closed_by.leaked")
  check(s.live == 0 and s.leases == 0 and s.active == 0, "counts back to 0")
  loop.sleep(0); loop.sleep(0)
  check(destroyed == 1 and alive[1] == false, "client destroyed")
  check(#leaks == capacity, "one leak event per lease: " .. #leaks)
  for i = 1, capacity do
    check(leaks[i].key == "k" and leaks[i].info.leaked == true, "leak event " .. i)
  end
  local l, code = pool:try_acquire("k")
  check(type(l) == "table", "capacity back: " .. tostring(code))
  check(l.client.id == 2, "a new client")
  l:release()
  check(not recycled or kept ~= nil, "the released lease kept")
  io.write("OK\n")
end)
loop.run()
