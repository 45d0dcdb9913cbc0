-- spec/jit_check.lua: run by spec/jit_spec.lua in a fresh LuaJIT (a VM whose
-- traces, hot counters and penalties no other spec has touched). Runs the
-- hot loop of one form on the FFI backend with jit.v on and prints what
-- jit.v reported, one line per trace, abort or NYI.
--
-- usage: luajit spec/jit_check.lua checkout|lease
local form = arg[1]
assert(form == "checkout" or form == "lease", "usage: jit_check.lua checkout|lease")
local clientpool = require "clientpool"
local loop = require("clientpool.loop").new()   -- real clock: the production path
local pool = clientpool.new { max_live = 4, create = function() return {} end, scheduler = loop, backend = "ffi" }
local path = os.tmpname()
loop.spawn(function()
  local _, h = pool:checkout("k")   -- the client exists: the loop takes the idle path
  pool:checkin(h)
  local v = require "jit.v"
  v.on(path)
  if form == "checkout" then
    for _ = 1, 200000 do local _, hh = pool:checkout("k"); pool:checkin(hh) end -- LOOP checkout
  else
    for _ = 1, 200000 do local lease = pool:acquire("k"); lease:release() end -- LOOP lease
  end
  v.off()
end)
loop.run()
local s = pool:stats()
assert(s.leases == 0 and s.opened == 1 and s.reused >= 200000 and s.leaked == 0, "the loop did not take the idle path")
for line in io.lines(path) do print(line) end
os.remove(path)
