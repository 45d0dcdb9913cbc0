--- clientpool.redisfleet.resp (internal): the few Redis commands the
-- Redis fleet needs (SCRIPT LOAD, EVALSHA, AUTH, SELECT), spoken in RESP2
-- over the host's own socket.
--
-- Why not a packaged client: lua-nginx-redis (resty.redis) runs only on
-- cosockets, and lua-redis (redis-lua) only on blocking LuaSocket, which
-- would stop a plain Lua program's loop for a whole round trip (or a
-- connect timeout when Redis is down). The fleet issues one script call
-- per lease renewal, so the protocol part is small (an array of bulk
-- strings out; simple strings, errors, integers, bulk strings and arrays
-- back) and one codec serves every transport:
--
--   "ngx"       ngx.socket.tcp (a cosocket: yields to nginx's loop; use it
--               from a timer, never on a request's path)
--   "luasocket" LuaSocket in non-blocking mode; while a read or a write
--               would block, the calling task sleeps on its scheduler
--               (`sleep`, 0.5 ms doubling to 4 ms), so the loop keeps
--               serving everything else
--   "blocking"  LuaSocket blocking (with the timeout): for calls outside
--               any scheduler (fleet.stats, fleet.pause from a script)
--
-- A connection error closes the connection (the next call reconnects); a
-- Redis error reply ("-ERR ...") is returned as nil, message, "redis".
local tonumber, tostring, type, select, error = tonumber, tostring, type, select, error
local concat, string_sub, string_byte = table.concat, string.sub, string.byte
local math_min = math.min

local monotime = require("clientpool.core").monotime

local M = {}

---------------------------------------------------------------------------
-- Transports: connect(host, port) -> sock | nil, err; sock:send(s);
-- sock:receive("*l" | n); sock:close()
---------------------------------------------------------------------------

-- LuaSocket without blocking: each operation retried, sleeping on the
-- task's scheduler between tries, until done or `timeout` seconds.
local function nb_socket(sleep, timeout)
  local socket = require "socket"
  local S = {}
  S.__index = S
  local function backoff(d) return math_min(d * 2, 0.004) end
  function S:send(data)
    local i, deadline, d = 1, monotime() + timeout, 0.0005
    while true do
      local last, err, partial = self.s:send(data, i)
      if last then return last end
      if err ~= "timeout" then return nil, err end
      i = partial + 1
      if monotime() >= deadline then return nil, "timeout" end
      sleep(d); d = backoff(d)
    end
  end
  function S:receive(pat)
    local acc, deadline, d = "", monotime() + timeout, 0.0005
    while true do
      local want = pat
      if type(pat) == "number" then want = pat - #acc end
      local got, err, partial = self.s:receive(want)
      if got then return acc .. got end
      if err ~= "timeout" then return nil, err end
      acc = acc .. partial
      if monotime() >= deadline then return nil, "timeout" end
      sleep(d); d = backoff(d)
    end
  end
  function S:close() self.s:close() end
  return function(host, port)
    local s, err = socket.tcp()
    if not s then return nil, err end
    s:settimeout(0)
    s:setoption("tcp-nodelay", true)
    local ok
    ok, err = s:connect(host, port)
    local deadline, d = monotime() + timeout, 0.0005
    while not ok do
      if err == "already connected" then break end
      if err ~= "timeout" and err ~= "Operation already in progress" then s:close(); return nil, err end
      if monotime() >= deadline then s:close(); return nil, "timeout" end
      sleep(d); d = backoff(d)
      local _, w = socket.select(nil, { s }, 0)
      if w and w[1] then ok, err = s:connect(host, port) end
    end
    return setmetatable({ s = s }, S)
  end
end

local function blocking_socket(timeout)
  local socket = require "socket"
  return function(host, port)
    local s, err = socket.tcp()
    if not s then return nil, err end
    s:settimeout(timeout)
    local ok
    ok, err = s:connect(host, port)
    if not ok then s:close(); return nil, err end
    s:setoption("tcp-nodelay", true)
    return s
  end
end

local function ngx_socket(timeout)
  return function(host, port)
    local s = ngx.socket.tcp() -- luacheck: ignore 113
    s:settimeout(timeout * 1000)
    local ok, err = s:connect(host, port)
    if not ok then return nil, err end
    return s
  end
end

---------------------------------------------------------------------------
-- The codec
---------------------------------------------------------------------------

local function encode(args, n)
  local out = { "*", n, "\r\n" }
  for i = 1, n do
    local a = tostring(args[i])
    out[#out + 1] = "$"; out[#out + 1] = #a; out[#out + 1] = "\r\n"
    out[#out + 1] = a; out[#out + 1] = "\r\n"
  end
  return concat(out)
end
M.encode = encode

local PLUS, MINUS, COLON, DOLLAR, STAR = 43, 45, 58, 36, 42

-- One reply: value | nil, err, kind ("redis": an error reply; "io": the
-- connection failed).
local function read_reply(sock)
  local line, err = sock:receive("*l")
  if not line then return nil, err, "io" end
  local c, rest = string_byte(line, 1), string_sub(line, 2)
  if c == PLUS then return rest end
  if c == MINUS then return nil, rest, "redis" end
  if c == COLON then return tonumber(rest) end
  if c == DOLLAR then
    local n = tonumber(rest)
    if not n then return nil, "bad reply: " .. line, "io" end
    if n < 0 then return false end
    local data
    data, err = sock:receive(n + 2)
    if not data then return nil, err, "io" end
    return string_sub(data, 1, n)
  end
  if c == STAR then
    local n = tonumber(rest)
    if not n then return nil, "bad reply: " .. line, "io" end
    if n < 0 then return false end
    local t = {}
    for i = 1, n do
      local v, e, kind = read_reply(sock)
      if v == nil and kind == "io" then return nil, e, kind end
      if v == nil then v = { err = e } end       -- an error inside an array
      t[i] = v
    end
    return t
  end
  return nil, "bad reply: " .. line, "io"
end
M.read_reply = read_reply

---------------------------------------------------------------------------
-- Connections
---------------------------------------------------------------------------

local Conn = {}
Conn.__index = Conn

--- A connection to Redis (made at the first call). o: host, port,
-- password, username, db, timeout (seconds, default 1); transport
-- "luasocket" (needs o.sleep), "ngx" or "blocking".
function M.new(o, transport, sleep)
  local timeout = o.timeout or 1
  local connect
  if transport == "ngx" then connect = ngx_socket(timeout)
  elseif transport == "luasocket" then connect = nb_socket(sleep, timeout)
  elseif transport == "blocking" then connect = blocking_socket(timeout)
  else error("clientpool: redisfleet: unknown transport " .. tostring(transport), 2) end
  return setmetatable({ o = o, connect = connect, sock = nil, shas = {}, commands = 0, connects = 0 }, Conn)
end

function Conn:close()
  if self.sock then self.sock:close() end
  self.sock, self.shas = nil, {}
end

-- Sends one command, reads its reply; on an I/O error the connection is
-- closed and nil, err, "io" returned.
function Conn:raw(...)
  local n = select("#", ...)
  local ok, err = self.sock:send(encode({ ... }, n))
  self.commands = self.commands + 1
  if not ok then self:close(); return nil, err, "io" end
  local v, e, kind = read_reply(self.sock)
  if v == nil and kind == "io" then self:close() end
  return v, e, kind
end

function Conn:open()
  if self.sock then return true end
  local o = self.o
  local sock, err = self.connect(o.host or "127.0.0.1", o.port or 6379)
  if not sock then return nil, err, "io" end
  self.sock = sock
  self.connects = self.connects + 1
  local v, kind
  if o.password then
    if o.username then v, err, kind = self:raw("AUTH", o.username, o.password)
    else v, err, kind = self:raw("AUTH", o.password) end
    if not v then self:close(); return nil, "AUTH: " .. tostring(err), kind end
  end
  if o.db and o.db ~= 0 then
    v, err, kind = self:raw("SELECT", o.db)
    if not v then self:close(); return nil, "SELECT: " .. tostring(err), kind end
  end
  return true
end

--- Runs script `name` (its text: src) with keys and args: EVALSHA, the
-- script loaded once per connection (and again after NOSCRIPT: a
-- restarted server forgot it).
function Conn:script(name, src, keys, args)
  local ok, err, kind = self:open()
  if not ok then return nil, err, kind end
  for _ = 1, 2 do
    local sha = self.shas[name]
    if not sha then
      sha, err, kind = self:raw("SCRIPT", "LOAD", src)
      if not sha then return nil, err, kind end
      self.shas[name] = sha
    end
    local cmd = { "EVALSHA", sha, #keys }
    for i = 1, #keys do cmd[#cmd + 1] = keys[i] end
    for i = 1, #args do cmd[#cmd + 1] = args[i] end
    local v, e, k = self:raw((table.unpack or unpack)(cmd)) -- luacheck: ignore 143
    if v ~= nil or k ~= "redis" or not tostring(e):find("^NOSCRIPT") then return v, e, k end
    self.shas[name] = nil
  end
  return nil, "NOSCRIPT twice", "redis"
end

return M
