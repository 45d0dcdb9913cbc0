-- clientpool.http.pool: pool{}, the manager of lua-http connections: the
-- hooks (create connects, validate probes an idle connection, destroy
-- closes), the policy that retires a connection after a response, and each
-- connection's state (info). Part of clientpool.http (the public API).
local lib = require "clientpool.http.lib"
local defaults = require "clientpool.http.defaults"
local keys = require "clientpool.http.keys"
local cqueues, ce, condition, http_client = lib.cqueues, lib.ce, lib.condition, lib.http_client
local MAX_CONCURRENT_STREAMS = lib.MAX_CONCURRENT_STREAMS
local fail, key_of, context_for, parse = keys.fail, keys.key_of, keys.context_for, keys.parse

local type, error, pairs, ipairs, tostring, pcall, setmetatable, getmetatable =
      type, error, pairs, ipairs, tostring, pcall, setmetatable, getmetatable
local string_find =
      string.find
local math_floor, math_huge = math.floor, math.huge
local monotime = cqueues.monotime

-- A protected call the function may yield through (cqueues polls): pcall
-- on LuaJIT and Lua 5.2+, a pass-through coroutine on PUC Lua 5.1.
local ycall = require("clientpool.base").ycall

local _M = {}

-- connection -> its state: mgr, p (parsed key), requests (sent on it),
-- inflight and cond (HTTP/2 streams open, signalled when one ends).
local conns = setmetatable({}, { __mode = "k" })

--- The manager state of a pooled connection (lease.client): { requests =
-- n, origin = "https://host", version = 1.1 | 2 }, or nil.
function _M.info(conn)
  local st = conns[conn]
  if not st then return nil end
  return { requests = st.requests, origin = st.p.origin, version = st.h2 and 2 or 1.1, inflight = st.inflight }
end

-- Whether an idle HTTP/1.1 connection can carry a request: no EOF, no
-- error, and nothing to read (bytes nobody asked for, such as a 408, make
-- it unusable too). fill(1, 0) never waits.
local function h1_alive(conn)
  local s = conn.socket
  if s == nil or s:eof("r") or s:eof("w") then return false end
  local ok, _, errno = s:fill(1, 0)
  if ok then return false end
  if errno == ce.ETIMEDOUT then
    s:clearerr("r")
    return true
  end
  return false
end

-- Reads the frames an idle HTTP/2 connection received (PING, SETTINGS,
-- GOAWAY) without waiting; false if it is closed or going away.
local function h2_alive(conn)
  if conn.socket == nil then return false end
  for _ = 1, 64 do
    if conn.recv_goaway_lowest or conn:empty() then return false end
    local ok = conn:step(0)
    if not ok then return false end
    if conn.had_eagain then break end
  end
  return not conn.recv_goaway_lowest and not conn:empty()
end

---------------------------------------------------------------------------
-- pool(): the options table with hooks filled in
---------------------------------------------------------------------------

local OWN = {
  origin = true, tls = true, version = true, connect_timeout = true, request_timeout = true,
  max_requests = true, retry = true,
}
local HOOKS = { "create", "destroy", "validate", "park", "unpark" }

local managers = setmetatable({}, { __mode = "k" }) -- options table -> manager

local function check_secs(o, name, default)
  local v = o[name]
  if v == nil then return default end
  if type(v) ~= "number" or v ~= v or v <= 0 or v == math_huge then
    fail("pool(): '%s' must be a finite number of seconds > 0, got %s", name, tostring(v))
  end
  return v
end

-- A directive that retires the client at its release (the engine's retire:
-- no new leases, destroyed when the last one ends).
local RETIRE = { retire = "client" }
-- lease -> true: the next observe retires the client (see request)
local retiring = setmetatable({}, { __mode = "k" })

local function pool_impl(o)
  if type(o) ~= "table" then fail("pool() expects an options table, got %s", type(o)) end
  for _, h in ipairs(HOOKS) do
    if o[h] ~= nil then fail("pool() fills in '%s' itself", h) end
  end
  local version = o.version
  if version == nil then version = 1.1 end
  if version ~= 1.1 and version ~= 2 then fail("pool(): 'version' must be 1.1 or 2, got %s", tostring(version)) end
  local h2 = version == 2
  local ct = check_secs(o, "connect_timeout", defaults.CONNECT_TIMEOUT)
  local rt = check_secs(o, "request_timeout", defaults.REQUEST_TIMEOUT)
  local max_requests = o.max_requests
  if max_requests ~= nil and (type(max_requests) ~= "number" or max_requests < 1 or
                              math_floor(max_requests) ~= max_requests or max_requests == math_huge) then
    fail("pool(): 'max_requests' must be an integer >= 1, got %s", tostring(max_requests))
  end
  if o.retry ~= nil and type(o.retry) ~= "boolean" then fail("pool(): 'retry' must be a boolean") end
  local default
  if o.origin ~= nil then
    default = key_of(o.origin, o.tls, "pool()")
  elseif o.tls ~= nil then
    fail("pool(): 'tls' without 'origin' (give the TLS settings in key(url, tls) instead)")
  end

  local opts = {}
  for k, v in pairs(o) do
    if not OWN[k] then opts[k] = v end
  end
  if opts.scheduler == nil then opts.scheduler = "cqueues" end
  if o.idle_timeout == nil then
    opts.idle_timeout = defaults.IDLE_TIMEOUT
  elseif o.idle_timeout == false then
    opts.idle_timeout = nil
  end
  if h2 then
    if opts.capacity == nil then opts.capacity = defaults.H2_CAPACITY end
  elseif opts.capacity ~= nil and opts.capacity ~= 1 then
    fail("pool(): 'capacity' %s needs version = 2 (an HTTP/1.1 connection carries one request at a time)",
         tostring(opts.capacity))
  end

  local stats = {
    connects = 0,          -- connections opened
    connect_failed = 0,
    closed = 0,            -- connections closed by destroy
    requests = 0,          -- requests sent (retries included)
    reused = 0,            -- of which on a connection that had carried one before
    responses = 0,         -- complete responses
    server_close = 0,      -- the response ended the connection: Connection: close, HTTP/1.0, read-to-close body
    server_goaway = 0,     -- HTTP/2 connections the server sent GOAWAY on
    server_idle_close = 0, -- idle connections the probe found closed by the server (validate)
    server_stale = 0,      -- reused connections that failed before any response (closed by the server)
    client_close = 0,      -- the request asked for Connection: close
    max_requests = 0,      -- connections retired at max_requests
    errors = 0,            -- requests that failed (timeouts included)
    timeouts = 0,
    retries = 0,           -- requests sent again on another connection
    refused_streams = 0,   -- HTTP/2 streams the server refused (REFUSED_STREAM), sent again
    stream_waits = 0,      -- HTTP/2 requests that waited for the peer's MAX_CONCURRENT_STREAMS
    peer_max_streams = nil, -- the lowest MAX_CONCURRENT_STREAMS a server announced
  }
  local mgr = {
    stats = stats, version = version, h2 = h2, connect_timeout = ct, request_timeout = rt,
    max_requests = max_requests, retry = o.retry ~= false, default = default,
    observe = o.policy ~= nil or o.probe == true,
  }

  local cache, ncache = {}, 0
  local function entry(key)
    local k = key
    if k == nil then
      k = default
      if not k then return nil, "clientpool.http: no 'origin' given to pool(): request full URLs or pass a key" end
    end
    local p = cache[k]
    if p then return p end
    local err
    p, err = parse(k)
    if not p then return nil, "clientpool.http: " .. err end
    if ncache >= 1024 then cache, ncache = {}, 0 end
    ncache = ncache + 1
    cache[k] = p
    return p
  end

  local function connect(p)
    local ctx, err
    if p.tls then
      ctx, err = context_for(p)
      if not ctx then return nil, err end
    end
    local deadline = monotime() + ct
    local conn, cerr = http_client.connect({
      host = p.host, port = p.port, tls = p.tls, ctx = ctx, version = version,
      sendname = p.tls and p.sni or nil,
    }, ct)
    if not conn then
      if h2 and p.tls and string_find(tostring(cerr), "no application protocol", 1, true) then
        cerr = tostring(cerr) .. " (the server does not offer HTTP/2 through ALPN)"
      end
      return nil, cerr
    end
    local ok
    ok, cerr = conn:connect(math.max(0, deadline - monotime()))
    if not ok then
      pcall(conn.close, conn)
      return nil, cerr
    end
    if h2 then
      if p.tls then
        local ssl = conn:checktls()
        local alpn = ssl and ssl:getAlpnSelected()
        if alpn ~= "h2" then
          pcall(conn.close, conn)
          return nil, "the server did not negotiate HTTP/2 (ALPN: " .. tostring(alpn) .. ")"
        end
      end
      -- the preface and our SETTINGS are buffered: send them, then read
      -- the server's SETTINGS (its MAX_CONCURRENT_STREAMS)
      ok, cerr = conn:flush(math.max(0, deadline - monotime()))
      while ok and not conn.has_first_settings do
        local left = deadline - monotime()
        if left <= 0 then ok, cerr = nil, "timeout waiting for the server's SETTINGS" break end
        ok, cerr = conn:step(left)
        if ok and conn:empty() then ok, cerr = nil, "closed before SETTINGS (not an HTTP/2 server?)" end
      end
      if not ok then
        pcall(conn.close, conn)
        return nil, tostring(cerr)
      end
      local n = conn.peer_settings[MAX_CONCURRENT_STREAMS]
      if stats.peer_max_streams == nil or n < stats.peer_max_streams then stats.peer_max_streams = n end
    end
    return conn
  end

  function opts.create(key)
    local p, err = entry(key)
    if not p then return nil, err end
    local ok, conn, cerr = ycall(connect, p)
    if not ok or not conn then
      stats.connect_failed = stats.connect_failed + 1
      return nil, "connect to " .. p.origin .. ": " .. tostring(ok and cerr or conn)
    end
    stats.connects = stats.connects + 1
    conns[conn] = { mgr = mgr, p = p, requests = 0, inflight = 0, h2 = h2, cond = h2 and condition.new() or nil }
    return conn
  end

  -- the idle probe: a connection the server closed while it sat idle is
  -- found here, before a request is written on it
  function opts.validate(conn)
    local ok, alive = ycall(h2 and h2_alive or h1_alive, conn)
    if ok and alive then return true end
    stats.server_idle_close = stats.server_idle_close + 1
    return false
  end

  function opts.destroy(conn)
    if conns[conn] then conns[conn] = nil end
    if conn ~= nil and ycall(conn.close, conn) then stats.closed = stats.closed + 1 end
  end

  -- The user's policy sees every outcome; a response after which the
  -- connection must not be reused also retires the client.
  local user_policy = o.policy
  if user_policy ~= nil then
    local pm = getmetatable(user_policy)
    if type(user_policy) ~= "function" and not (pm and pm.__call) then
      fail("pool(): 'policy' must be a function or a callable policy, got %s", type(user_policy))
    end
  end
  opts.policy = function(outcome, lease)
    local r = retiring[lease]
    if r then retiring[lease] = nil end
    local d
    if user_policy and r ~= "only" then d = user_policy(outcome, lease) end
    if not r or (d ~= nil and type(d) ~= "table") then return d end  -- (a bad directive: new() says so)
    if d == nil or d.continue then return RETIRE end
    local c = {}
    for k, v in pairs(d) do c[k] = v end
    c.continue = nil
    if c.retire == nil then c.retire = "client" end
    return c
  end

  managers[opts] = mgr
  return opts, mgr
end

--- Returns the options table for clientpool.new (create, validate, destroy
-- and policy filled in) and the manager (`mgr.stats`). Own options:
-- origin (the default key's URL), tls ({ verify, ca_file, sni, ctx } of
-- that origin), version (1.1, the default, or 2), connect_timeout (10 s),
-- request_timeout (30 s: a request's I/O unless the call gives a timeout),
-- max_requests (requests per connection), retry (true: an idempotent
-- request that failed on a reused connection before any response is sent
-- once more). Everything else is clientpool.new's, with these defaults:
-- scheduler "cqueues", idle_timeout 4 (false: none), and for version 2
-- capacity 100 (streams per connection). A `policy` given here sees every
-- response (`res`) request() gets.
function _M.pool(o)
  local ok, opts, mgr = pcall(pool_impl, o)
  if not ok then error(opts, 2) end
  return opts, mgr
end

--- The manager of an options table made by pool().
function _M.manager(opts)
  return managers[opts]
end

_M.conns, _M.retiring = conns, retiring

return _M
