-- spec/nginx/harness.lua: runs a spec file inside nginx and reports TAP-like
-- lines ("ok N - name", "not ok N - name" plus "# ..." details) and a last
-- line "N passed, M failed", which spec/nginx/run.sh adds up.
--
-- A spec file (spec/nginx/cases/NAME.lua) is loaded with describe, it,
-- before_each, after_each, pending and assert (luassert) in its environment,
-- like a busted spec. Each test runs in its own light thread of the request
-- that runs the file, with a deadline (default 20 s; `it(name, fn, secs)`);
-- a test past its deadline is killed and fails.
--
-- Helpers for specs: H.http (a small HTTP/1.0 client to this nginx), H.redis
-- (a RESP client to the private redis-server), H.conf (ports and paths from
-- the runner), H.wait_until.
local conf = require "spec_conf"

local H = { conf = conf }

local luassert = require "luassert"

---------------------------------------------------------------------------
-- HTTP client (to this nginx)
---------------------------------------------------------------------------

--- GET path on this nginx. Returns status, body, or nil, err. opts.timeout
-- (seconds, default 30).
function H.http(path, opts)
  opts = opts or {}
  local sock = ngx.socket.tcp()
  sock:settimeouts(2000, 5000, (opts.timeout or 30) * 1000)
  local ok, err = sock:connect("127.0.0.1", conf.port)
  if not ok then return nil, "connect: " .. tostring(err) end
  ok, err = sock:send("GET " .. path .. " HTTP/1.0\r\nHost: localhost\r\n\r\n")
  if not ok then sock:close(); return nil, "send: " .. tostring(err) end
  local data
  data, err = sock:receive("*a")
  sock:close()
  if not data then return nil, "receive: " .. tostring(err) end
  local status = tonumber(data:match("^HTTP/%d%.%d (%d+)"))
  local body = data:match("\r\n\r\n(.*)$") or ""
  return status, body
end

--- Starts GET path and returns the socket once the request is sent and the
-- first body line is read (for client-abort tests: close it to abort).
-- HTTP/1.1: nginx holds back the body of an HTTP/1.0 response until its end.
function H.http_open(path)
  local sock = ngx.socket.tcp()
  sock:settimeouts(2000, 5000, 10000)
  local ok, err = sock:connect("127.0.0.1", conf.port)
  if not ok then return nil, err end
  ok, err = sock:send("GET " .. path .. " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
  if not ok then return nil, err end
  local chunked = false
  while true do
    local line
    line, err = sock:receive("*l")
    if not line then return nil, err end
    if line == "" then break end
    if line:lower():match("^transfer%-encoding:%s*chunked") then chunked = true end
  end
  if chunked then
    local size
    size, err = sock:receive("*l")
    if not size then return nil, err end
  end
  local first
  first, err = sock:receive("*l")
  if not first then return nil, err end
  return sock, first
end

---------------------------------------------------------------------------
-- Redis client (RESP)
---------------------------------------------------------------------------

local Redis = {}
Redis.__index = Redis

local function read_reply(sock)
  local line, err = sock:receive("*l")
  if not line then return nil, err end
  local t, rest = line:sub(1, 1), line:sub(2)
  if t == "+" then return rest end
  if t == "-" then return false, rest end
  if t == ":" then return tonumber(rest) end
  if t == "$" then
    local n = tonumber(rest)
    if n < 0 then return ngx.null end
    local data
    data, err = sock:receive(n + 2)
    if not data then return nil, err end
    return data:sub(1, n)
  end
  if t == "*" then
    local n = tonumber(rest)
    if n < 0 then return ngx.null end
    local list = {}
    for i = 1, n do
      local v, e = read_reply(sock)
      if v == nil then return nil, e end
      list[i] = v
    end
    return list
  end
  return nil, "bad reply: " .. line
end
H.read_reply = read_reply

local function encode(...)
  local n = select("#", ...)
  local t = { "*" .. n .. "\r\n" }
  for i = 1, n do
    local a = tostring((select(i, ...)))
    t[#t + 1] = "$" .. #a .. "\r\n" .. a .. "\r\n"
  end
  return table.concat(t)
end
H.resp = encode

--- Sends a command on a connected socket and reads the reply.
function H.command(sock, ...)
  local ok, err = sock:send(encode(...))
  if not ok then return nil, err end
  return read_reply(sock)
end

--- Counts the connections named `name` in the private redis (CLIENT
-- LIST) from a light thread of its own, every `every` seconds (nil: as
-- often as redis answers), until the returned stop() is called; stop()
-- returns the most seen at once and the number of samples.
function H.sample_clients(name, every)
  local stopped, max_seen, samples = false, 0, 0
  local t = ngx.thread.spawn(function()
    local r = assert(H.redis())
    while not stopped do
      local n = r:clients(name)
      samples = samples + 1
      if n > max_seen then max_seen = n end
      if every then ngx.sleep(every) end
    end
    r:close()
  end)
  return function()
    stopped = true
    ngx.thread.wait(t)
    return max_seen, samples
  end
end

--- A fresh connection to the private redis (not pooled), or to the one
-- on `port` (the second redis, conf.redis2_port); `password`: AUTH first.
function H.redis(port, password)
  local sock = ngx.socket.tcp()
  sock:settimeouts(1000, 2000, 5000)
  local ok, err = sock:connect("127.0.0.1", port or conf.redis_port)
  if not ok then return nil, err end
  local r = setmetatable({ sock = sock }, Redis)
  if password then
    ok, err = r:cmd("AUTH", password)
    if not ok then sock:close(); return nil, err end
  end
  return r
end

--- Asks spec/nginx/faultctl.sh to "start" or "kill" the second redis-server
-- (conf.redis2_port); returns its status line ("up", "down" or "error ...").
-- A case cannot start a server itself (faultctl.sh says why).
function H.fault(cmd, secs)
  local ctl = conf.run .. "/ctl/"
  os.remove(ctl .. "redis2.status")
  local f, err = io.open(ctl .. "redis2.cmd.tmp", "w")
  assert(f, "spec/nginx/faultctl.sh is not running (" .. tostring(err) .. ")")
  f:write(cmd)
  f:close()
  assert(os.rename(ctl .. "redis2.cmd.tmp", ctl .. "redis2.cmd"))
  return H.wait_until(function()
    local sf = io.open(ctl .. "redis2.status")
    if not sf then return nil end
    local s = sf:read("*l")
    sf:close()
    return s
  end, secs or 5) or "no answer from faultctl.sh"
end

--- The real lua-resty-redis: resty.redis, or Debian's lua-nginx-redis,
-- which installs it as nginx.redis.
function H.resty_redis()
  local ok, redis = pcall(require, "resty.redis")
  if ok then return redis end
  return require "nginx.redis"
end

function Redis:cmd(...)
  return H.command(self.sock, ...)
end

function Redis:close()
  self.sock:close()
end

--- Clients redis sees, by name (CLIENT SETNAME), or all but this one.
function Redis:clients(name)
  local list = assert(self:cmd("CLIENT", "LIST"))
  local n = 0
  for line in list:gmatch("[^\n]+") do
    local nm = line:match(" name=(%S*)")
    if name then
      if nm == name then n = n + 1 end
    else
      n = n + 1
    end
  end
  if not name then n = n - 1 end
  return n
end

--- INFO clients' connected_clients (this connection included).
function Redis:connected_clients()
  return self:info("clients", "connected_clients")
end

--- A number of INFO <section> (e.g. "stats", "total_connections_received").
function Redis:info(section, field)
  local info = assert(self:cmd("INFO", section))
  return tonumber(info:match(field .. ":(%d+)"))
end

---------------------------------------------------------------------------
-- Misc
---------------------------------------------------------------------------

--- Polls fn() every 5 ms until it returns a true value or secs pass.
function H.wait_until(fn, secs)
  local deadline = ngx.now() + (secs or 5)
  while true do
    local v = fn()
    if v then return v end
    ngx.update_time()
    if ngx.now() >= deadline then return nil end
    ngx.sleep(0.005)
  end
end

function H.now()
  ngx.update_time()
  return ngx.now()
end

---------------------------------------------------------------------------
-- Runner
---------------------------------------------------------------------------

local function out(...)
  ngx.say(...)
  ngx.flush(true)
end

--- Runs spec/nginx/cases/<name>.lua; prints results and the summary line.
function H.run(name)
  if not name:match("^[%w_]+$") then
    ngx.status = 400
    out("bad spec name")
    return
  end
  local path = conf.root .. "/spec/nginx/cases/" .. name .. ".lua"
  local chunk, lerr = loadfile(path)
  local tests, befores, afters, prefix = {}, {}, {}, {}
  local passed, failed, skipped = 0, 0, 0
  if not chunk then
    out("not ok 1 - load ", name)
    out("# ", lerr)
    out("0 passed, 1 failed")
    return
  end
  local env = setmetatable({}, { __index = _G })
  env.assert = luassert
  function env.describe(desc, fn)
    prefix[#prefix + 1] = desc
    local nb, na = #befores, #afters
    fn()
    for i = #befores, nb + 1, -1 do befores[i] = nil end
    for i = #afters, na + 1, -1 do afters[i] = nil end
    prefix[#prefix] = nil
  end
  function env.it(desc, fn, secs)
    local full = table.concat(prefix, " ") .. (#prefix > 0 and " " or "") .. desc
    tests[#tests + 1] = { name = full, fn = fn, secs = secs or 20, before = { unpack(befores) },
                          after = { unpack(afters) } }
  end
  function env.pending(desc)
    tests[#tests + 1] = { name = desc, pending = true }
  end
  function env.before_each(fn) befores[#befores + 1] = fn end
  function env.after_each(fn) afters[#afters + 1] = fn end
  setfenv(chunk, env)
  local ok, err = xpcall(chunk, debug.traceback)
  if not ok then
    out("not ok 1 - load ", name)
    out("# ", (tostring(err):gsub("\n", "\n# ")))
    out("0 passed, 1 failed")
    return
  end
  out("# ", name, ": ", #tests, " tests")
  for i, t in ipairs(tests) do
    if t.pending then
      skipped = skipped + 1
      out("ok ", i, " - ", t.name, " # SKIP pending")
    else
      local started = H.now()
      local th = ngx.thread.spawn(function()
        for _, b in ipairs(t.before) do b() end
        local r = { xpcall(t.fn, debug.traceback) }
        for _, a in ipairs(t.after) do
          local aok, aerr = xpcall(a, debug.traceback)
          if r[1] and not aok then r = { false, aerr } end
        end
        return "done", r[1], r[2]
      end)
      local wd = ngx.thread.spawn(function()
        ngx.sleep(t.secs)
        return "deadline"
      end)
      local tok, what, res, terr = ngx.thread.wait(th, wd)
      if what == "done" then
        ngx.thread.kill(wd)
      else
        ngx.thread.kill(th)
      end
      local took = H.now() - started
      if tok and what == "done" and res then
        passed = passed + 1
        out(string.format("ok %d - %s (%.3fs)", i, t.name, took))
      else
        failed = failed + 1
        out(string.format("not ok %d - %s (%.3fs)", i, t.name, took))
        local msg
        if not tok then
          msg = "test thread failed: " .. tostring(what)
        elseif what ~= "done" then
          msg = "no result within " .. t.secs .. " s (killed)"
        else
          msg = tostring(terr)
        end
        out("# ", (msg:gsub("\n", "\n# ")))
      end
    end
  end
  if skipped > 0 then out("# ", skipped, " pending") end
  out(passed, " passed, ", failed, " failed")
end

return H
