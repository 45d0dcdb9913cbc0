--- clientpool.http: HTTP/1.1 keep-alive and HTTP/2 pools for lua-http on cqueues.
--
-- `pool{...}` returns the options table for clientpool.new with the hooks
-- filled in (create connects and, for HTTP/2, waits for the server's
-- SETTINGS; validate is the idle probe; destroy closes), and the manager
-- (`mgr.stats`). `request(pool, req)` is the one call a user writes:
--
--   local cphttp = require "clientpool.http"
--   local pool = clientpool.new(cphttp.pool { origin = "http://127.0.0.1:8080", max_live = 8,
--                                             scheduler = sched })
--   local res, err = cphttp.request(pool, "http://127.0.0.1:8080/items?id=1")
--   if res then print(res.status, res.headers:get("content-type"), #res.body) end
--
-- Keys are origins: scheme, host, port and the TLS settings (verify mode,
-- CA file, SNI name, a registered context), so two identities never share a
-- connection (`key(url, tls)`). Reuse is decided after each response: the
-- body was read to its end, neither side said `Connection: close` (nor is
-- the body delimited by the close), `max_requests` is not reached, and for
-- HTTP/2 the server sent no GOAWAY. A connection that is not reused is
-- retired (closed_by.retired), a failed one destroyed (closed_by.error),
-- one the idle probe finds closed is invalid (closed_by.invalid): mgr.stats
-- tells the server's closes from errors. See docs/http.md.
local clientpool = require "clientpool"

local function need(name)
  local ok, m = pcall(require, name)
  if not ok then
    error("clientpool.http: needs lua-http on cqueues (Debian: lua-http, for Lua 5.1 and LuaJIT); '" ..
          name .. "' does not load under " .. (rawget(_G, "jit") and "LuaJIT" or _VERSION) .. ": " ..
          tostring(m):match("^[^\n]*"), 0)
  end
  return m
end
local cqueues = need "cqueues"
local ce = need "cqueues.errno"
local condition = need "cqueues.condition"
local http_client = need "http.client"
local http_headers = need "http.headers"
local http_tls = need "http.tls"
local h2_error = need "http.h2_error"
local openssl_ctx = need "openssl.ssl.context"

local type, error, pairs, ipairs, tostring, tonumber, pcall, setmetatable, getmetatable =
      type, error, pairs, ipairs, tostring, tonumber, pcall, setmetatable, getmetatable
local string_format, string_gsub, string_find, string_sub, string_lower, string_match =
      string.format, string.gsub, string.find, string.sub, string.lower, string.match
local math_floor, math_huge = math.floor, math.huge
local table_concat = table.concat
local monotime = cqueues.monotime

local _M = { _VERSION = "0.1.0" }

--- Defaults (seconds; see docs/http.md for why).
-- idle_timeout: below the shortest common server keep-alive (Apache httpd's
-- KeepAliveTimeout and Node.js's keepAliveTimeout are 5 s; nginx 75 s),
-- with a second of margin for the server's clock starting before ours.
_M.IDLE_TIMEOUT = 4
_M.CONNECT_TIMEOUT = 10
_M.REQUEST_TIMEOUT = 30
-- HTTP/2 streams per connection (the pool's capacity) when not given: RFC
-- 9113 asks servers for at least 100 (nginx: 128, Apache/h2o: 100).
_M.H2_CAPACITY = 100

local MAX_CONCURRENT_STREAMS = 0x3
local REFUSED_STREAM = h2_error.errors.REFUSED_STREAM.code

-- Raised without a position; public functions re-raise at their caller.
local function fail(fmt, ...)
  error("clientpool.http: " .. string_format(fmt, ...), 0)
end

-- A protected call the function may yield through (cqueues polls): pcall
-- on LuaJIT and Lua 5.2+, a pass-through coroutine on PUC Lua 5.1.
local ycall = require("clientpool.base").ycall

---------------------------------------------------------------------------
-- Keys: an origin and its TLS settings
---------------------------------------------------------------------------

local DEFAULT_PORT = { http = 80, https = 443 }

-- '%' and '|' are escaped in every part, so the encoding is injective.
local function esc(s)
  return (string_gsub(s, "[%%|]", function(c) return c == "%" and "%25" or "%7C" end))
end
local function unesc(s)
  return (string_gsub(s, "%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
end

-- Splits an absolute URL: scheme, host, port, target (path?query, "/" if
-- empty), or nil and why.
local function split_url(url)
  local scheme, rest = string_match(url, "^(%a[%w+.-]*)://(.*)$")
  if not scheme then return nil, "not an absolute http(s) URL: " .. url end
  scheme = string_lower(scheme)
  if not DEFAULT_PORT[scheme] then return nil, "scheme must be http or https, got " .. scheme end
  local auth, target = string_match(rest, "^([^/?#]*)(.*)$")
  auth = string_gsub(auth, "^.*@", "")            -- userinfo is not part of the origin
  local host, port
  if string_sub(auth, 1, 1) == "[" then
    host, port = string_match(auth, "^(%[[%x:.]+%])(.*)$")
  else
    host, port = string_match(auth, "^([^:]*)(.*)$")
  end
  if not host or host == "" then return nil, "no host in URL: " .. url end
  if port == "" then
    port = DEFAULT_PORT[scheme]
  else
    port = tonumber(string_match(port, "^:(%d+)$"))
    if not port or port < 1 or port > 65535 then return nil, "bad port in URL: " .. url end
  end
  target = string_gsub(target, "#.*$", "")
  if target == "" then target = "/" elseif string_sub(target, 1, 1) == "?" then target = "/" .. target end
  return scheme, string_lower(host), port, target
end

-- Client TLS contexts by id (strong: an id never names two contexts).
local contexts = {}

--- Registers a lua-http/luaossl client context (openssl.ssl.context) under
-- a name for keys: `key(url, { ctx = "name" })`. Returns the name.
function _M.tls_context(id, ctx)
  if type(id) ~= "string" or id == "" or string_find(id, "|", 1, true) then
    error("clientpool.http: tls_context: id must be a non-empty string without '|'", 2)
  end
  if ctx == nil or type(ctx) ~= "userdata" then
    error("clientpool.http: tls_context: ctx must be an openssl.ssl.context", 2)
  end
  local have = contexts[id]
  if have and have ~= ctx then
    error("clientpool.http: tls_context: '" .. id .. "' names another context already", 2)
  end
  contexts[id] = ctx
  return id
end

local TLS_OPTS = { verify = true, ca_file = true, sni = true, ctx = true }

-- The TLS part of a key: "" for http, else "|noverify|ca=..|sni=..|ctx=..".
local function tls_part(scheme, tls, what)
  if tls == nil then return "" end
  if type(tls) ~= "table" then fail("%s: 'tls' must be a table, got %s", what, type(tls)) end
  for k in pairs(tls) do
    if not TLS_OPTS[k] then
      fail("%s: unknown tls option '%s' (verify, ca_file, sni, ctx)", what, tostring(k))
    end
  end
  if scheme ~= "https" then
    if next(tls) ~= nil then fail("%s: tls options need an https origin", what) end
    return ""
  end
  local t = {}
  if tls.verify ~= nil and type(tls.verify) ~= "boolean" then
    fail("%s: tls.verify must be a boolean, got %s", what, type(tls.verify))
  end
  if tls.verify == false then t[#t + 1] = "noverify" end
  if tls.ca_file ~= nil then
    if type(tls.ca_file) ~= "string" or tls.ca_file == "" then fail("%s: tls.ca_file must be a path", what) end
    t[#t + 1] = "ca=" .. esc(tls.ca_file)
  end
  if tls.sni ~= nil then
    if tls.sni == false then
      t[#t + 1] = "nosni"
    elseif type(tls.sni) == "string" and tls.sni ~= "" then
      t[#t + 1] = "sni=" .. esc(tls.sni)
    else
      fail("%s: tls.sni must be a server name or false", what)
    end
  end
  if tls.ctx ~= nil then
    local id = tls.ctx
    if type(id) ~= "string" then
      fail("%s: tls.ctx must be a name given to tls_context()", what)
    end
    if not contexts[id] then fail("%s: unknown tls.ctx '%s' (register it with tls_context first)", what, id) end
    t[#t + 1] = "ctx=" .. esc(id)
  end
  if #t == 0 then return "" end
  return "|" .. table_concat(t, "|")
end

local function host_port(host, port, scheme)
  if port == DEFAULT_PORT[scheme] then return host end
  return host .. ":" .. port
end

local function key_of(url, tls, what)
  if type(url) ~= "string" then fail("%s: the origin must be a URL string, got %s", what, type(url)) end
  local scheme, host, port = split_url(url)
  if not scheme then fail("%s: %s", what, host) end
  return scheme .. "://" .. esc(host) .. ":" .. port .. tls_part(scheme, tls, what)
end

--- The pool key of an origin: `key("https://api.example.com", { verify =
-- true, ca_file = path, sni = name | false, ctx = name })`. Any path of the
-- URL is ignored. Different origins or TLS settings give different keys;
-- the key is readable: "https://api.example.com:443|ca=/etc/ca.pem".
function _M.key(url, tls)
  local ok, k = pcall(key_of, url, tls, "key()")
  if not ok then error(k, 2) end
  return k
end

--- The parts of a key made by key(): scheme, host, port, tls (boolean),
-- verify, ca_file, sni (nil = the host, false = none), ctx (a name), or
-- nil and why.
function _M.parse(key)
  if type(key) ~= "string" then return nil, "not a key: " .. type(key) end
  local first = string_find(key, "|", 1, true)
  local origin = first and string_sub(key, 1, first - 1) or key
  local scheme, host, port = string_match(origin, "^(https?)://(.+):(%d+)$")
  if not scheme then return nil, "not a clientpool.http key (scheme://host:port): " .. key end
  local p = { scheme = scheme, host = unesc(host), port = tonumber(port), tls = scheme == "https", verify = true }
  if first then
    for part in string.gmatch(string_sub(key, first + 1), "[^|]+") do
      if part == "noverify" then p.verify = false
      elseif part == "nosni" then p.sni = false
      elseif string_sub(part, 1, 3) == "ca=" then p.ca_file = unesc(string_sub(part, 4))
      elseif string_sub(part, 1, 4) == "sni=" then p.sni = unesc(string_sub(part, 5))
      elseif string_sub(part, 1, 4) == "ctx=" then p.ctx = unesc(string_sub(part, 5))
      else return nil, "not a clientpool.http key (unknown part '" .. part .. "'): " .. key end
    end
    if not p.tls then return nil, "not a clientpool.http key (TLS settings on http): " .. key end
  end
  p.authority = host_port(string_find(p.host, ":", 1, true) and not string_find(p.host, "^%[") and
                          ("[" .. p.host .. "]") or p.host, p.port, scheme)
  p.origin = scheme .. "://" .. p.authority
  return p
end

-- Client contexts made for verify/ca_file combinations, shared.
local made_ctx = {}

local function context_for(p)
  if p.ctx then
    local c = contexts[p.ctx]
    if not c then return nil, "unknown tls.ctx '" .. p.ctx .. "'" end
    return c
  end
  local id = (p.verify and "v" or "n") .. "|" .. (p.ca_file or "")
  local c = made_ctx[id]
  if c then return c end
  c = http_tls.new_client_context()
  if not p.verify then c:setVerify(openssl_ctx.VERIFY_NONE) end
  if p.ca_file then
    local ok, err = pcall(function() return c:getStore():add(p.ca_file) end)
    if not ok then return nil, "tls.ca_file " .. p.ca_file .. ": " .. tostring(err) end
  end
  made_ctx[id] = c
  return c
end

---------------------------------------------------------------------------
-- Connections
---------------------------------------------------------------------------

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
  local ct = check_secs(o, "connect_timeout", _M.CONNECT_TIMEOUT)
  local rt = check_secs(o, "request_timeout", _M.REQUEST_TIMEOUT)
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
    opts.idle_timeout = _M.IDLE_TIMEOUT
  elseif o.idle_timeout == false then
    opts.idle_timeout = nil
  end
  if h2 then
    if opts.capacity == nil then opts.capacity = _M.H2_CAPACITY end
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
    p, err = _M.parse(k)
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

---------------------------------------------------------------------------
-- request(): one call
---------------------------------------------------------------------------

local IDEMPOTENT = { GET = true, HEAD = true, OPTIONS = true, TRACE = true, PUT = true, DELETE = true }
local REQ_FIELDS = { url = true, key = true, path = true, method = true, headers = true, body = true,
                     tls = true, idempotent = true }

local function bad(fmt, ...)
  error("clientpool.http: request: " .. string_format(fmt, ...), 0)
end

local function add_header(list, name, value)
  if type(name) ~= "string" or not string_find(name, "^[^:\r\n%s][^:\r\n]*$") then
    bad("bad header name %s", string_format("%q", tostring(name)))
  end
  if type(value) == "number" then value = tostring(value) end
  if type(value) ~= "string" or string_find(value, "[\r\n]") then
    bad("bad value for header '%s'", name)
  end
  list[#list + 1] = string_lower(name)
  list[#list + 1] = value
end

local function has_token(value, token)
  if not value then return false end
  for t in string.gmatch(string_lower(value), "[^,%s]+") do
    if t == token then return true end
  end
  return false
end

-- The request as { key, target, method, headers (name, value, ...),
-- body, idempotent, authority }.
local function normalize(req)
  local r = { headers = {} }
  if type(req) == "string" then req = { url = req } end
  if type(req) ~= "table" then bad("expects a URL string or a request table, got %s", type(req)) end
  local hdrs = req.headers
  local luahttp = hdrs ~= nil and getmetatable(hdrs) == http_headers.mt and type(req.host) == "string"
  if luahttp then
    -- a lua-http request object (http.request.new_from_uri)
    local scheme = hdrs:get(":scheme") or (req.tls and "https" or "http")
    local url = scheme .. "://" .. (string_find(req.host, ":", 1, true) and ("[" .. req.host .. "]") or req.host) ..
                ":" .. tostring(req.port)
    r.key = key_of(url, nil, "request")
    if req.ctx then
      bad("a lua-http request with its own ctx: register it with tls_context() and pass { url, tls = { ctx } }")
    end
    r.method = hdrs:get(":method") or "GET"
    r.target = hdrs:get(":path") or "/"
    r.authority = hdrs:get(":authority")
    for name, value in hdrs:each() do
      if string_sub(name, 1, 1) ~= ":" then add_header(r.headers, name, value) end
    end
    if req.body ~= nil and type(req.body) ~= "string" then bad("only string bodies are supported") end
    r.body = req.body
  else
    for k in pairs(req) do
      if not REQ_FIELDS[k] then
        bad("unknown field '%s' (url, key, path, method, headers, body, tls, idempotent)", tostring(k))
      end
    end
    if req.url ~= nil then
      if req.key ~= nil or req.path ~= nil then bad("give url, or key and path, not both") end
      if type(req.url) ~= "string" then bad("url must be a string, got %s", type(req.url)) end
      local scheme, host, port, target = split_url(req.url)
      if not scheme then bad("%s", host) end
      r.key = key_of(req.url, req.tls, "request")
      r.target = target
      r.authority = host_port(host, port, scheme)
    else
      if req.tls ~= nil then bad("tls goes with url (or in the key: key(url, tls))") end
      if req.key ~= nil and type(req.key) ~= "string" then bad("key must be a string (key(url, tls))") end
      r.key = req.key
      local path = req.path or "/"
      if type(path) ~= "string" or string_sub(path, 1, 1) ~= "/" then bad("path must start with '/'") end
      r.target = path
    end
    local m = req.method or "GET"
    if type(m) ~= "string" or not string_find(m, "^[%u%d!#$%%&'*+.^_`|~-]+$") then
      bad("bad method %s", string_format("%q", tostring(m)))
    end
    r.method = m
    if hdrs ~= nil then
      if getmetatable(hdrs) == http_headers.mt then
        for name, value in hdrs:each() do
          if string_sub(name, 1, 1) ~= ":" then add_header(r.headers, name, value) end
        end
      elseif type(hdrs) == "table" then
        if hdrs[1] ~= nil then
          for i, pair in ipairs(hdrs) do
            if type(pair) ~= "table" then bad("headers[%d] must be a { name, value } pair", i) end
            add_header(r.headers, pair[1], pair[2])
          end
        else
          for name, value in pairs(hdrs) do add_header(r.headers, name, value) end
        end
      else
        bad("headers must be a table or http.headers, got %s", type(hdrs))
      end
    end
    if req.body ~= nil and type(req.body) ~= "string" then bad("body must be a string, got %s", type(req.body)) end
    r.body = req.body
    if req.idempotent ~= nil and type(req.idempotent) ~= "boolean" then bad("idempotent must be a boolean") end
    r.idempotent = req.idempotent
  end
  if r.idempotent == nil then r.idempotent = IDEMPOTENT[r.method] == true end
  -- a Host header names the authority
  local hs = r.headers
  for i = #hs - 1, 1, -2 do
    if hs[i] == "connection" and has_token(hs[i + 1], "close") then r.close = true end
    if hs[i] == "host" then
      r.authority = hs[i + 1]
      table.remove(hs, i + 1)
      table.remove(hs, i)
    elseif hs[i] == "content-length" or hs[i] == "transfer-encoding" then
      bad("'%s' is set by request() itself", hs[i])
    end
  end
  return r
end

local function left(deadline)
  local t = deadline - monotime()
  return t > 0 and t or 0
end

-- A stream the server will never answer: its id is above the last one a
-- GOAWAY promised to process (RFC 9113 6.8: safe to send again).
local NOT_PROCESSED = "not processed: the server sent GOAWAY before this stream"

-- HTTP/2 waits of our own instead of lua-http's get_headers and
-- get_next_chunk: those wait for the connection and step it, and once the
-- server closed it (after a GOAWAY that left this stream out) the
-- connection is readable at EOF for good, so they would spin until the
-- deadline. Here the stream also ends when the server left it out or the
-- connection reached EOF.
local function h2_wait(stream, conn, cond, deadline)
  local low = conn.recv_goaway_lowest
  if low and stream.id and stream.id > low then return nil, NOT_PROCESSED, "goaway" end
  if conn:empty() then return nil, "connection closed by the server", ce.EPIPE end
  local t = deadline - monotime()
  if t <= 0 then return nil, ce.strerror(ce.ETIMEDOUT), ce.ETIMEDOUT end
  -- a read first, never a poll first: the connection's pollable readiness
  -- comes from its socket's last operation, and after a write (our request)
  -- it would not wait for input at all; the read that finds nothing sets
  -- had_eagain and makes the socket wait for input
  local ok, err, errno = conn:step(0)
  if not ok then return nil, err, errno end
  if conn.had_eagain then cqueues.poll(cond, conn, t) end
  return true
end

local function h2_headers(stream, conn, deadline)
  while stream.recv_headers_fifo:length() < 1 do
    if stream.state == "closed" then return nil, stream.rst_stream_error or "stream closed" end
    local ok, err, errno = h2_wait(stream, conn, stream.recv_headers_cond, deadline)
    if not ok then return nil, err, errno end
  end
  return stream.recv_headers_fifo:pop()
end

local function h2_body(stream, conn, deadline)
  local parts, n = {}, 0
  while true do
    if stream.chunk_fifo:length() > 0 then
      local data, err, errno = stream:get_next_chunk(0)   -- pops, and updates the flow-control windows
      if data == nil then
        if err ~= nil then return nil, err, errno end
      else
        n = n + 1
        parts[n] = data
      end
    elseif stream.state == "closed" or stream.state == "half closed (remote)" then
      if stream.rst_stream_error then return nil, stream.rst_stream_error end
      return table_concat(parts, "", 1, n)
    else
      local ok, err, errno = h2_wait(stream, conn, stream.chunk_cond, deadline)
      if not ok then return nil, err, errno end
    end
  end
end

-- One exchange on conn: the stream, the response headers, the body, and
-- on failure err, errno (stream first: the caller resets it).
local function exchange(conn, h2, h, body, method, deadline)
  local stream = conn:new_stream()
  if not stream then return nil, nil, nil, ce.strerror(ce.EPIPE), ce.EPIPE end
  local ok, err, errno = stream:write_headers(h, body == nil, left(deadline))
  if ok and body then ok, err, errno = stream:write_chunk(body, true, left(deadline)) end
  if not ok then return stream, nil, nil, err, errno end
  local rh
  repeat
    if h2 then
      rh, err, errno = h2_headers(stream, conn, deadline)
    else
      rh, err, errno = stream:get_headers(left(deadline))
    end
    if not rh then return stream, nil, nil, err or "connection closed", errno end
    local status = rh:get(":status")
  until string_sub(status, 1, 1) ~= "1" or status == "101"
  if method == "HEAD" then return stream, rh, "" end
  local data
  if h2 then
    data, err, errno = h2_body(stream, conn, deadline)
  else
    data, err, errno = stream:get_body_as_string(left(deadline))
  end
  if not data then return stream, rh, nil, err or "connection closed", errno end
  return stream, rh, data
end

-- Why a connection must not carry another request after this response, or nil.
local function after_response(mgr, st, conn, stream, rh, r)
  if r.close then return "client_close" end
  if st.h2 then
    if conn.recv_goaway_lowest then return "server_goaway" end
    if conn:empty() then return "server_close" end
  else
    local c = rh:get_comma_separated("connection")
    if has_token(c, "close") or stream.body_read_type == "close" or
       (stream.peer_version == 1.0 and not has_token(c, "keep-alive")) then
      return "server_close"
    end
    local s = conn.socket
    if s == nil or s:eof("r") or s:eof("w") then return "server_close" end
  end
  if mgr.max_requests and st.requests >= mgr.max_requests then return "max_requests" end
  return nil
end

-- The lease's client must not be reused: its record is retired through the
-- pool's policy (the engine: no new leases; closed when the last ends).
local function retire(lease, outcome, only)
  retiring[lease] = only and "only" or true
  local ok, err = pcall(lease.observe, lease, outcome)
  if not ok then
    retiring[lease] = nil
    lease:release()
    error(err, 0)
  end
end

local function stream_done(st)
  if st.h2 then
    st.inflight = st.inflight - 1
    st.cond:signal(1)
  end
end

-- How often a request the server did not process is sent again (RFC 9113
-- 8.7: REFUSED_STREAM, or a stream above a GOAWAY's last id).
local UNPROCESSED_RETRIES = 3

local AGAIN = {}  -- try() result: acquire again (not an attempt)

-- One attempt on one lease. Returns res; or nil, err, code, retryable; or AGAIN.
local function try(lease, r, deadline)
  local conn = lease.client
  local st = conns[conn]
  if not st then
    lease:release(false)
    error("clientpool.http: request: the pool's clients are not clientpool.http connections " ..
          "(make the pool with clientpool.new(clientpool.http.pool{...}))", 0)
  end
  local mgr, stats = st.mgr, st.mgr.stats
  deadline = deadline or (monotime() + mgr.request_timeout)
  if st.h2 then
    -- shared grants are not validated: a connection the server is leaving
    -- takes no new stream
    if conn.recv_goaway_lowest or conn:empty() then
      if not st.gone then st.gone = true; stats.server_goaway = stats.server_goaway + 1 end
      retire(lease, nil, true)
      lease:release()
      return AGAIN
    end
    if mgr.max_requests and st.requests >= mgr.max_requests then
      retire(lease, nil, true)
      lease:release()
      return AGAIN
    end
    local limit = conn.peer_settings[MAX_CONCURRENT_STREAMS]
    if st.inflight >= limit then
      stats.stream_waits = stats.stream_waits + 1
      while st.inflight >= limit do
        local t = deadline - monotime()
        if t <= 0 then
          lease:release()
          stats.errors = stats.errors + 1
          stats.timeouts = stats.timeouts + 1
          return nil, "timeout waiting for a stream (MAX_CONCURRENT_STREAMS " .. limit .. ")", "timeout"
        end
        cqueues.poll(st.cond, t)
        if conn.recv_goaway_lowest or conn:empty() then return try(lease, r, deadline) end
        limit = conn.peer_settings[MAX_CONCURRENT_STREAMS]
      end
    end
    st.inflight = st.inflight + 1
  end
  st.requests = st.requests + 1
  local reused = st.requests > 1
  stats.requests = stats.requests + 1
  if reused then stats.reused = stats.reused + 1 end

  local p = st.p
  local h = http_headers.new()
  h:append(":method", r.method)
  h:append(":scheme", p.scheme)
  h:append(":authority", r.authority or p.authority)
  h:append(":path", r.target)
  local hs = r.headers
  for i = 1, #hs, 2 do h:append(hs[i], hs[i + 1]) end
  if r.body then h:append("content-length", tostring(#r.body)) end

  local ok, stream, rh, body, err, errno = ycall(exchange, conn, st.h2, h, r.body, r.method, deadline)
  if not ok then
    err, stream, rh, body = stream, nil, nil, nil   -- lua-http raised (an h2 error object)
  end
  if rh and body then
    stream_done(st)
    stats.responses = stats.responses + 1
    local res = { status = tonumber(rh:get(":status")), headers = rh, body = body,
                  version = st.h2 and 2 or stream.peer_version, reused = reused, requests = st.requests }
    local why = after_response(mgr, st, conn, stream, rh, r)
    if why then
      if why ~= "server_goaway" or not st.gone then stats[why] = stats[why] + 1 end
      if why == "server_goaway" then st.gone = true end
      retire(lease, res)
    elseif mgr.observe then
      local pok, perr = pcall(lease.observe, lease, res)
      if not pok then lease:release(); error(perr, 0) end
    end
    lease:release()
    return res
  end

  -- failed
  local msg = tostring(err)
  local timed_out = errno == ce.ETIMEDOUT
  if st.h2 then
    -- the server did not process it: refused, or left out by a GOAWAY
    local refused = (h2_error.is(err) and err.code == REFUSED_STREAM) or errno == "goaway"
    local broken = conn:empty() or (conn.socket and conn.socket:error()) ~= nil
    if stream and not broken then pcall(stream.shutdown, stream) end   -- RST_STREAM
    stream_done(st)
    if refused then
      stats.refused_streams = stats.refused_streams + 1
      lease:release()
      return nil, msg, "io", "unprocessed", mgr
    end
    local stale = broken and not rh and reused and not timed_out
    if stale then stats.server_stale = stats.server_stale + 1 else stats.errors = stats.errors + 1 end
    if timed_out then stats.timeouts = stats.timeouts + 1 end
    lease:release(not broken)
    return nil, msg, timed_out and "timeout" or "io", stale and r.idempotent and mgr.retry and "stale", mgr
  end
  local stale = not rh and reused and not timed_out
  if stale then stats.server_stale = stats.server_stale + 1 else stats.errors = stats.errors + 1 end
  if timed_out then stats.timeouts = stats.timeouts + 1 end
  lease:release(false)
  return nil, msg, timed_out and "timeout" or "io", stale and r.idempotent and mgr.retry and "stale", mgr
end

--- Sends one request through the pool and reads the whole response.
-- req: a URL string (GET), a table { url = ..., method = "GET", headers =
-- { name = value } or { { name, value }, ... } or http.headers, body =
-- string, tls = { ... } (with url), idempotent = bool } or { key = key(...)
-- or nil (the pool's origin), path = "/..." , ... }, or a lua-http request
-- object (http.request.new_from_uri(...)). ropts: { timeout = s } bounds the
-- whole call (the wait for a connection included); without it the pool's
-- acquire_timeout bounds the wait and pool{request_timeout} the exchange.
-- Returns res = { status = n, headers = http.headers, body = string,
-- version = 1.1 | 2, reused = bool, requests = n (on its connection) },
-- or nil, err, code: code is a clientpool acquire code (timeout, full,
-- closed, cancelled, create, paused) or "io". A request that failed on a
-- reused connection before any response (the server closed it meanwhile)
-- is sent once more if it is idempotent; an HTTP/2 stream the server
-- refused is sent again whatever its method.
function _M.request(pool, req, ropts)
  if getmetatable(pool) ~= clientpool.Pool then
    error("clientpool.http: request expects a clientpool pool as its first argument, got " .. type(pool), 2)
  end
  local ok, r = pcall(normalize, req)
  if not ok then error(r, 2) end
  local deadline
  if ropts ~= nil then
    if type(ropts) ~= "table" then error("clientpool.http: request: options must be a table", 2) end
    for k in pairs(ropts) do
      if k ~= "timeout" then error("clientpool.http: request: unknown option '" .. tostring(k) .. "' (timeout)", 2) end
    end
    local t = ropts.timeout
    if t ~= nil then
      if type(t) ~= "number" or t ~= t or t < 0 or t == math_huge then
        error("clientpool.http: request: timeout must be a finite number >= 0", 2)
      end
      deadline = monotime() + t
    end
  end
  local stale, unprocessed = 0, 0
  while true do
    local lease, code, detail
    if deadline then
      lease, code, detail = pool:acquire(r.key, { timeout = left(deadline) })
    else
      lease, code, detail = pool:acquire(r.key)
    end
    if not lease then
      return nil, tostring(code) .. (detail ~= nil and (": " .. tostring(detail)) or ""), code
    end
    local res, err, ecode, again, mgr = try(lease, r, deadline)
    if res == AGAIN then
      -- acquire again: the connection was leaving (not an attempt)
      if deadline and monotime() >= deadline then return nil, "timeout", "timeout" end
    elseif res then
      return res
    else
      -- a stale connection: once; a stream the server did not process
      -- (refused, or after its GOAWAY): up to UNPROCESSED_RETRIES times
      if again == "stale" then stale = stale + 1 elseif again then unprocessed = unprocessed + 1 end
      if not again or stale > 1 or unprocessed > UNPROCESSED_RETRIES or (deadline and monotime() >= deadline) then
        return nil, err, ecode
      end
      mgr.stats.retries = mgr.stats.retries + 1
    end
  end
end

return _M
