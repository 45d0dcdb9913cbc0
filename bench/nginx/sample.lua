-- bench/nginx/sample.lua: samples a redis-server from outside nginx while
-- wrk loads it (bench/nginx/run.sh B6, examples/gateway/run.sh: make demo).
-- Runs under lua5.1 with LuaSocket, on one connection of its own.
--
-- usage: lua5.1 bench/nginx/sample.lua PORT SECS [INTERVAL [SERIES]]
--
-- Every INTERVAL seconds (default 0.001) for SECS seconds it reads INFO
-- clients; at the start and the end, INFO stats. With SERIES, each sample
-- is also written there as a line "<ms since start> <clients>" (flushed,
-- so a progress display can read the last one). Prints one line:
--   max=<most clients seen at once, this connection excluded>
--   samples=<n> opened=<total_connections_received delta>
local socket = require "socket"

local port, secs = tonumber(arg[1]), tonumber(arg[2])
local interval = tonumber(arg[3]) or 0.001
assert(port and secs, "usage: sample.lua PORT SECS [INTERVAL [SERIES]]")
local series = arg[4] and assert(io.open(arg[4], "w"))

local c = assert(socket.connect("127.0.0.1", port))
c:settimeout(5)
c:setoption("tcp-nodelay", true)

-- INFO <section>: the bulk reply's text.
local function info(section)
  assert(c:send("INFO " .. section .. "\r\n"))
  local head = assert(c:receive("*l"))
  local n = assert(tonumber(head:match("^%$(%d+)")), "bad reply: " .. head)
  local body = assert(c:receive(n + 2))
  return body
end

local function field(text, name)
  return tonumber(text:match(name .. ":(%d+)"))
end

local opened0 = field(info("stats"), "total_connections_received")
local max, samples = 0, 0
local start = socket.gettime()
local deadline = start + secs
while socket.gettime() < deadline do
  local n = field(info("clients"), "connected_clients") - 1
  if n > max then max = n end
  samples = samples + 1
  if series then
    series:write(string.format("%d %d\n", (socket.gettime() - start) * 1000, n))
    series:flush()
  end
  socket.sleep(interval)
end
local opened = field(info("stats"), "total_connections_received") - opened0
c:close()
if series then series:close() end
io.write(string.format("max=%d samples=%d opened=%d\n", max, samples, opened))
