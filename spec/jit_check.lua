-- spec/jit_check.lua: run by spec/jit_spec.lua in a fresh LuaJIT (a VM whose
-- traces, hot counters and penalties no other spec has touched). Runs the
-- hot loop of one form on the FFI backend with jit.v on and prints what
-- jit.v reported, one line per trace, abort or NYI.
--
-- usage: luajit spec/jit_check.lua checkout|lease|try|burst
--   burst: checkout/checkin after a spell of contention (every checkout
--   waits) and a burst of creates, the slow paths a busy upstream or a
--   cold start take: aborts recorded there must not get checkout
--   blacklisted, or the hot path would stay interpreted for good. LuaJIT's
--   penalties are randomized, so this is a smoke test: it catches a path
--   that aborts every time, not one that aborts now and then.
local form = arg[1]
assert(form == "checkout" or form == "lease" or form == "try" or form == "burst",
       "usage: jit_check.lua checkout|lease|try|burst")
local clientpool = require "clientpool"
local loop = require("clientpool.loop").new()   -- real clock: the production path
local N = 20000
local pool = clientpool.new { max_live = N, max_waiting = N, create = function() return {} end,
                              scheduler = loop, backend = "ffi" }
local path = os.tmpname()
if form == "burst" then
  local tight = clientpool.new { max_live = 1, max_waiting = 100, create = function() return {} end,
                                 scheduler = loop, backend = "ffi" }
  local first = true
  for _ = 1, 100 do
    loop.spawn(function()
      for _ = 1, 200 do
        local _, h = tight:checkout("k")          -- waits: one client, 100 tasks
        if first then first = false; loop.sleep(0) end
        tight:checkin(h)
      end
    end)
  end
  loop.run()
  assert(tight:stats().wait_count >= 100 * 199, "no contention")
  tight:close()
  loop.spawn(function()
    local hs = {}
    for i = 1, N do hs[i] = select(2, assert(pool:checkout("k"))) end   -- N creates
    for i = 1, N do pool:checkin(hs[i]) end
  end)
  loop.run()
  form = "checkout"
end
loop.spawn(function()
  local _, h = pool:checkout("k")   -- the client exists: the loop takes the idle path
  pool:checkin(h)
  local v = require "jit.v"
  v.on(path)
  if form == "checkout" then
    for _ = 1, 200000 do local _, hh = pool:checkout("k"); pool:checkin(hh) end -- LOOP checkout
  elseif form == "try" then
    for _ = 1, 200000 do local lease = pool:try_acquire("k"); lease:release() end -- LOOP try
  else
    for _ = 1, 200000 do local lease = pool:acquire("k"); lease:release() end -- LOOP lease
  end
  v.off()
end)
loop.run()
local s = pool:stats()
assert(s.leases == 0 and s.reused >= 200000 and s.leaked == 0, "the loop did not take the idle path")
for line in io.lines(path) do print(line) end
os.remove(path)
