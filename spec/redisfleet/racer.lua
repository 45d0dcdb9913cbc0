-- A member racing others for a Redis fleet's units (spec/redisfleet/scripts_redis.lua):
--   lua racer.lua lpath cpath port name member max_live rounds out
-- Each round asks for a random holding of 0..max_live units (need 0) and
-- writes "<n> <sum>" per reply: the script's own sum must never pass the cap.
local lpath, cpath, port, name, member, max_live, rounds, out =
  arg[1], arg[2], tonumber(arg[3]), arg[4], arg[5], tonumber(arg[6]), tonumber(arg[7]), arg[8]
package.path, package.cpath = lpath, cpath
local resp = require "clientpool.redisfleet.resp"
local scripts = require "clientpool.redisfleet.scripts"
local c = resp.new({ port = port, timeout = 5 }, "blocking")
local keys = scripts.keys("clientpool:fleet:", name)
local o = assert(io.open(out, "w"))
local rnd = tonumber(member:match("%d+")) * 7919
for _ = 1, rounds do
  rnd = (rnd * 1103515245 + 12345) % 2147483648
  local want = rnd % (max_live + 1)
  local r = assert(c:script("lease", scripts.lease, keys, { 60000, member, want, 0, 0, max_live, "lease" }))
  o:write(r[1], " ", r[2], "\n")
end
o:close()
c:close()
