-- Run by spec/leak_spec.lua in a fresh interpreter (see
-- spec/gc_leak_check.lua for why): a lease collected while held empties its
-- key and destroys its client from a finalizer, and the driver learns of it
-- only when it drains the engine's events. A call for that key made before
-- then, in the same task, must not be handed the key id or the record slot
-- of the leak, which the engine may have given to another key or client
-- (it once was: another key's leased client, or a client of another key
-- created into the slot of the one being destroyed).
-- usage: gc_leak_key_check.lua FORM [real]
--   FORM acquire | checkout | try_acquire; "real": a real clock, where C API
--   pools acquire and check out in C (clientpool.core.fastpath)
local form = arg and arg[1] or "acquire"
local clientpool = require "clientpool"
local loop = require("clientpool.loop").new { clock = arg and arg[2] == "real" and "real" or "virtual" }

local n, open, destroyed = 0, {}, {}
local pool = clientpool.new {
  max_live = 4, scheduler = loop,
  create = function(key) n = n + 1; local c = { key = key, id = n }; open[c] = true; return c end,
  destroy = function(c) open[c] = nil; destroyed[#destroyed + 1] = c.key .. c.id end,
}

local function check(cond, what)
  if not cond then io.write("FAIL ", what, "\n"); os.exit(1) end
end

loop.spawn(function()
  local a = assert(pool:acquire("y"))           -- y1, held throughout
  local y1 = a.client
  -- the x lease, seen only through a weak table (a pool call here would
  -- drain the events this check is about)
  local seen = setmetatable({}, { __mode = "k" })
  local co = coroutine.create(function()
    local l = assert(pool:acquire("x"))
    seen[l] = true
    return l.client.id
  end)
  local ok, id = coroutine.resume(co)
  check(ok and id == 2, "the x lease")
  co = nil -- luacheck: ignore
  for _ = 1, 4 do collectgarbage("collect") end
  check(next(seen) == nil, "the x lease was not collected")
  -- at once, no yield: the leak's events are still queued
  local c, h
  if form == "checkout" then
    c, h = pool:checkout("x")
  elseif form == "try_acquire" then
    local l = pool:try_acquire("x")
    h = l
    c = l and l.client
  else
    local l = pool:acquire("x")
    h = l
    c = l and l.client
  end
  check(type(c) == "table", form .. " got no client")
  check(c ~= a.client, form .. " got the client another lease holds")
  check(c.key == "x", form .. " got a client of key " .. tostring(c.key))
  check(open[c], form .. " got a destroyed client")
  check(open[a.client], "the held client was destroyed")
  if form == "checkout" then pool:checkin(h) else h:release() end
  a:release()
  local d = assert(pool:acquire("y"))
  check(d.client == y1, "key y's idle client is not y1")
  d:release()
  loop.sleep(0); loop.sleep(0)
  check(pool:stats().leaked == 1, "leaked " .. pool:stats().leaked)
  check(#destroyed == 1 and destroyed[1] == "x2", "destroyed: " .. table.concat(destroyed, " "))
  local s = pool:stats()
  local nopen = 0
  for _ in pairs(open) do nopen = nopen + 1 end
  check(s.live == nopen and s.idle == nopen and s.leases == 0, "counts: live " .. s.live .. ", open " .. nopen)
  pool:close()
  loop.sleep(0); loop.sleep(0)
  check(next(open) == nil, "open after close")
  io.write("OK\n")
end)
loop.run()
