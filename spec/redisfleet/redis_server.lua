-- A private redis-server for the Redis fleet's specs: a free 127.0.0.1
-- port, no persistence, stopped by its pid (a watchdog shell stops it if
-- the interpreter that started it dies first).
local socket = require "socket"
local M = {}

local function sh(cmd)
  local p = assert(io.popen(cmd, "r"))
  local out = p:read("*a")
  p:close()
  return out
end
M.sh = sh

function M.free_port()
  local s = assert(socket.bind("127.0.0.1", 0))
  local _, port = s:getsockname()
  s:close()
  return tonumber(port)
end

local function ping(port)
  local c = socket.connect("127.0.0.1", port)
  if not c then return false end
  c:settimeout(2)
  c:send("PING\r\n")
  local l = c:receive("*l")
  c:close()
  return l == "+PONG"
end

-- Starts redis-server on `port` (a free one if nil): { port, pid, dir };
-- `extra`: more command-line options (a string).
function M.start(port, dir, extra)
  port = port or M.free_port()
  if not dir then
    dir = os.tmpname()
    os.remove(dir)
    sh("mkdir -p '" .. dir .. "'")
  end
  local pid = sh(("lua_pid=$PPID; env -u LD_PRELOAD spec/redisfleet/closefds.sh " ..
    "redis-server --port %d --bind 127.0.0.1 --save '' " ..
    "--appendonly no --dir '%s' --logfile '%s/redis-%d.log' %s >/dev/null 2>&1 & r=$!; echo $r; " ..
    "(while kill -0 $lua_pid 2>/dev/null && kill -0 $r 2>/dev/null; do sleep 1; done; " ..
    "kill $r 2>/dev/null) >/dev/null 2>&1 &"):format(port, dir, dir, port, extra or "")):match("%d+")
  local r = { port = port, pid = tonumber(pid), dir = dir }
  for _ = 1, 200 do
    if ping(port) then return r end
    socket.sleep(0.02)
  end
  error("redis-server did not answer on port " .. port .. ": " .. sh("cat '" .. dir .. "/redis-" .. port .. ".log'"))
end

function M.kill(r, sig)
  if r and r.pid then
    -- (gone, or a zombie: its sockets are closed)
    sh("kill -" .. (sig or "KILL") .. " " .. r.pid .. " 2>/dev/null; for i in $(seq 1 100); do kill -0 " .. r.pid ..
       " 2>/dev/null || break; grep -q ') Z' /proc/" .. r.pid .. "/stat 2>/dev/null && break; sleep 0.05; done")
    r.pid = nil
  end
end

function M.stop(r, keep_dir)
  if not r then return end
  M.kill(r, "TERM")
  if not keep_dir then sh("rm -rf '" .. r.dir .. "'") end
end

-- One command on a fresh connection (blocking): the reply's first line
-- and body.
function M.cmd(port, ...)
  local resp = require "clientpool.redisfleet.resp"
  local c = resp.new({ port = port, timeout = 2 }, "blocking")
  assert(c:open())
  local v, err = c:raw(...)
  c:close()
  return v, err
end

-- connected_clients from INFO clients (the asking connection excluded).
function M.clients(port)
  local v = M.cmd(port, "INFO", "clients")
  return tonumber(tostring(v):match("connected_clients:(%d+)")) - 1
end

return M
