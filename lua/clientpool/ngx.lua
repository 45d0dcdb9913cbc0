--- clientpool.ngx: a ready-made manager for TCP and TLS upstreams in OpenResty.
--
-- A cosocket belongs to the handler that made it, so it cannot sit in a pool
-- across requests. The idle record keeps no socket: `park` hands the
-- connection to nginx's own keepalive pool (sock:setkeepalive) and `unpark`
-- makes a fresh cosocket and connects with `pool = <name>`, which picks the
-- parked connection up. The clientpool engine still owns admission and the
-- budget; its counts are an upper bound on the real connections (nginx may
-- close a parked one: getreusedtimes() == 0 after an unpark says the
-- connection is new, and stats.lost counts it).
--
--   local cpngx = require "clientpool.ngx"
--   local pool = clientpool.new(cpngx.tcp { host = "127.0.0.1", port = 6379,
--                                           connect_timeout = 1, max_live = 8 })
--   -- many upstreams: leave host out and acquire by key
--   local key = cpngx.key { host = h, port = 443, ssl = true, server_name = h, ssl_verify = true }
--   local lease = assert(pool:acquire(key))
--
-- The nginx pool name of a key is a per-manager prefix plus the key, so two
-- identities (host, port, TLS, SNI, verify mode, client certificate, user
-- parts) never share a connection, and two managers never take each other's
-- parked connections. See docs/decisions.md ("OpenResty").
local ngx = ngx
local type, error, pairs, ipairs, tostring, tonumber, pcall, setmetatable =
      type, error, pairs, ipairs, tostring, tonumber, pcall, setmetatable
local string_format, string_gsub, string_find, string_sub = string.format, string.gsub, string.find, string.sub
local math_floor, math_huge = math.floor, math.huge
local table_concat = table.concat

local get_phase = ngx.get_phase
local ngx_tcp = ngx.socket.tcp
local worker_exiting = ngx.worker.exiting

local _M = { _VERSION = "0.1.0" }

-- Phases with cosockets.
local COSOCKET = {
  rewrite = true, server_rewrite = true, access = true, content = true, timer = true,
  ssl_cert = true, ssl_session_fetch = true, ssl_client_hello = true,
}

-- Raised without a position; the public functions re-raise at their caller.
local function fail(fmt, ...)
  error("clientpool.ngx: " .. string_format(fmt, ...), 0)
end

---------------------------------------------------------------------------
-- Keys
---------------------------------------------------------------------------

-- '%' and '|' are escaped in every part, so the encoding is injective.
local function esc(s)
  return (string_gsub(s, "[%%|]", function(c) return c == "%" and "%25" or "%7C" end))
end

local function unesc(s)
  return (string_gsub(s, "%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
end

-- Client certificates by id: a key holds the id, the registry the objects.
local certs = {}

local function is_int(v)
  return type(v) == "number" and v == v and v ~= math_huge and v ~= -math_huge and math_floor(v) == v
end

-- Validates key parameters; returns a normalized copy.
local function check_params(o, what)
  if type(o) ~= "table" then fail("%s expects a table, got %s", what, type(o)) end
  local host = o.host
  if type(host) ~= "string" or host == "" then
    fail("%s: 'host' must be a non-empty string, got %s", what, type(host) == "string" and '""' or type(host))
  end
  local p = { host = host }
  local unix = string_sub(host, 1, 5) == "unix:"
  if unix then
    if o.port ~= nil then fail("%s: 'port' must be nil for a unix socket (%s)", what, host) end
  else
    if not is_int(o.port) or o.port < 1 or o.port > 65535 then
      fail("%s: 'port' must be an integer in 1..65535, got %s", what, tostring(o.port))
    end
    p.port = o.port
  end
  if o.ssl ~= nil and type(o.ssl) ~= "boolean" then fail("%s: 'ssl' must be a boolean, got %s", what, type(o.ssl)) end
  p.ssl = o.ssl == true
  if o.server_name ~= nil then
    if type(o.server_name) ~= "string" or o.server_name == "" then
      fail("%s: 'server_name' must be a non-empty string", what)
    end
    if not p.ssl then fail("%s: 'server_name' needs ssl = true", what) end
    p.server_name = o.server_name
  end
  if o.ssl_verify ~= nil then
    if type(o.ssl_verify) ~= "boolean" then
      fail("%s: 'ssl_verify' must be a boolean, got %s", what, type(o.ssl_verify))
    end
    if not p.ssl then fail("%s: 'ssl_verify' needs ssl = true", what) end
    p.ssl_verify = o.ssl_verify
  end
  local cert, pkey, id = o.client_cert, o.client_priv_key, o.client_cert_id
  if cert ~= nil or pkey ~= nil or id ~= nil then
    if not p.ssl then fail("%s: a client certificate needs ssl = true", what) end
    if id ~= nil and (type(id) ~= "string" or id == "") then
      fail("%s: 'client_cert_id' must be a non-empty string", what)
    end
    if (cert == nil) ~= (pkey == nil) then
      fail("%s: 'client_cert' and 'client_priv_key' go together", what)
    end
    if cert ~= nil then
      local tc, tk = type(cert), type(pkey)
      if (tc ~= "string" and tc ~= "cdata") or (tk ~= "string" and tk ~= "cdata") then
        fail("%s: 'client_cert'/'client_priv_key' must be PEM strings or parsed cdata", what)
      end
      if id == nil then
        if tc ~= "string" then
          fail("%s: a parsed client_cert needs 'client_cert_id' (a stable name or fingerprint)", what)
        end
        id = ngx.md5(cert)
      end
      local have = certs[id]
      if have and have.cert ~= cert then
        -- the same id for another certificate would let two identities share
        fail("%s: client_cert_id '%s' names another certificate already", what, id)
      end
      if not have then certs[id] = { cert = cert, pkey = pkey } end
    elseif not certs[id] then
      fail("%s: unknown client_cert_id '%s' (give client_cert and client_priv_key once)", what, id)
    end
    p.client_cert_id = id
  end
  local parts = o.parts
  if parts ~= nil then
    if type(parts) == "string" then parts = { parts } end
    if type(parts) ~= "table" then fail("%s: 'parts' must be a string or a list of strings", what) end
    local list = {}
    for i, v in ipairs(parts) do
      if type(v) ~= "string" and type(v) ~= "number" then
        fail("%s: 'parts' item %d must be a string, got %s", what, i, type(v))
      end
      list[i] = tostring(v)
    end
    for k in pairs(parts) do
      if type(k) ~= "number" or list[k] == nil then fail("%s: 'parts' must be a list", what) end
    end
    p.parts = list
  end
  return p
end

local function encode(p)
  local t = { p.port and (esc(p.host) .. ":" .. p.port) or esc(p.host) }
  if p.ssl then
    t[#t + 1] = "tls"
    if p.server_name then t[#t + 1] = "sni=" .. esc(p.server_name) end
    if p.ssl_verify then t[#t + 1] = "verify" end
    if p.client_cert_id then t[#t + 1] = "cert=" .. esc(p.client_cert_id) end
  end
  if p.parts then
    for _, v in ipairs(p.parts) do t[#t + 1] = "u=" .. esc(v) end
  end
  return table_concat(t, "|")
end

--- The pool key of an upstream identity: host, port, ssl, server_name,
-- ssl_verify, client certificate (client_cert + client_priv_key, PEM or
-- parsed, with client_cert_id; a PEM's id defaults to its md5) and `parts`
-- (a string or list of strings: user name, database, a hash of a password).
-- Different identities give different keys. The key is readable:
-- "host:port|tls|sni=name|verify|cert=id|u=part".
function _M.key(o)
  local ok, p = pcall(check_params, o, "key()")
  if not ok then error(p, 2) end
  return encode(p)
end

--- The parameters of a key made by key() (client certificates by id).
function _M.parse(key)
  if type(key) ~= "string" then error("clientpool.ngx: parse() expects a key string, got " .. type(key), 2) end
  local p = {}
  local first = true
  local pos = 1
  while pos <= #key + 1 do
    local bar = string_find(key, "|", pos, true)
    local seg = string_sub(key, pos, bar and bar - 1 or #key)
    pos = (bar or #key) + 1
    if first then
      first = false
      if string_sub(seg, 1, 5) == "unix:" then
        p.host = unesc(seg)
      else
        local h, port = seg:match("^(.*):(%d+)$")
        if not h then return nil, "not a clientpool.ngx key (no host:port): " .. key end
        p.host, p.port = unesc(h), tonumber(port)
      end
    elseif seg == "tls" then
      p.ssl = true
    elseif seg == "verify" then
      p.ssl_verify = true
    elseif string_sub(seg, 1, 4) == "sni=" then
      p.server_name = unesc(string_sub(seg, 5))
    elseif string_sub(seg, 1, 5) == "cert=" then
      p.client_cert_id = unesc(string_sub(seg, 6))
    elseif string_sub(seg, 1, 2) == "u=" then
      p.parts = p.parts or {}
      p.parts[#p.parts + 1] = unesc(string_sub(seg, 3))
    else
      return nil, "not a clientpool.ngx key (unknown part '" .. seg .. "'): " .. key
    end
    if not bar then break end
  end
  p.ssl = p.ssl == true
  return p
end

---------------------------------------------------------------------------
-- Parked connections and stand-ins
---------------------------------------------------------------------------

--- What an idle record keeps: the connection itself is in nginx's pool.
local PARKED = setmetatable({}, { __tostring = function() return "clientpool.ngx.PARKED" end })
_M.PARKED = PARKED

-- lease.client when a parked connection is granted in a phase without
-- cosockets (log, header_filter, body_filter, set, ...): the connection stays
-- parked, every method raises, release puts the record back as it was.
local STANDIN_MT = {
  __index = function(_, name)
    return function()
      error("clientpool.ngx: '" .. tostring(name) .. "' on a connection granted in the " ..
            tostring(get_phase()) .. " phase: cosockets are disabled there (release the lease)", 2)
    end
  end,
  __tostring = function() return "clientpool.ngx.STANDIN" end,
}
local STANDIN = setmetatable({}, STANDIN_MT)
_M.STANDIN = STANDIN

---------------------------------------------------------------------------
-- tcp(): the options table with hooks filled in
---------------------------------------------------------------------------

-- tcp()'s own options; everything else goes to clientpool.new.
local CONN = {
  host = true, port = true, ssl = true, server_name = true, ssl_verify = true,
  client_cert = true, client_priv_key = true, client_cert_id = true, parts = true,
  connect_timeout = true, send_timeout = true, read_timeout = true, on_connect = true,
}
local HOOKS = { "create", "destroy", "park", "unpark" }

local managers = setmetatable({}, { __mode = "k" }) -- options table -> manager
local tcp_impl
local nmanagers = 0

local function check_timeout(o, name)
  local v = o[name]
  if v == nil then return nil end
  if type(v) ~= "number" or v ~= v or v <= 0 or v == math_huge then
    fail("tcp(): '%s' must be a finite number of seconds > 0, got %s", name, tostring(v))
  end
  return math_floor(v * 1000 + 0.5)
end

--- Returns the options table for clientpool.new (create/destroy/park/unpark
-- filled in) and the manager (`mgr.stats`, `mgr.name(key)`).
-- Connection options: host, port, ssl, server_name, ssl_verify,
-- client_cert, client_priv_key, client_cert_id, parts (the default key's
-- identity; leave host out to acquire by cpngx.key{...} only),
-- connect_timeout, send_timeout, read_timeout (seconds) and on_connect(sock,
-- key) (runs on each new connection, after the TLS handshake: AUTH, SELECT;
-- return a false value and an error to fail the connection). Every other
-- option is clientpool.new's; idle_timeout also sets setkeepalive's timeout,
-- and max_live (or per_key.max_live) nginx's pool size.
function _M.tcp(o)
  local ok, opts, mgr = pcall(tcp_impl, o)
  if not ok then error(opts, 2) end
  return opts, mgr
end

tcp_impl = function(o)
  if type(o) ~= "table" then fail("tcp() expects an options table, got %s", type(o)) end
  for _, h in ipairs(HOOKS) do
    if o[h] ~= nil then fail("tcp() fills in '%s' itself (use on_connect or validate)", h) end
  end
  local opts = {}
  for k, v in pairs(o) do
    if not CONN[k] then opts[k] = v end
  end
  local ct, st, rt = check_timeout(o, "connect_timeout"), check_timeout(o, "send_timeout"),
                     check_timeout(o, "read_timeout")
  local on_connect = o.on_connect
  if on_connect ~= nil and type(on_connect) ~= "function" then
    fail("tcp(): 'on_connect' must be a function, got %s", type(on_connect))
  end
  local default
  if o.host ~= nil then
    default = check_params(o, "tcp()")
  else
    for k in pairs(CONN) do
      if o[k] ~= nil and k ~= "connect_timeout" and k ~= "send_timeout" and k ~= "read_timeout"
         and k ~= "on_connect" then
        fail("tcp(): '%s' without 'host' (give the identity in cpngx.key{...} instead)", k)
      end
    end
  end

  -- setkeepalive(timeout, size): the pool's idle_timeout and max_idle. With
  -- a warm floor (min_idle > 0) 0: nginx never times a parked connection
  -- out, since the pool spares the ones its floor needs from idle_timeout
  -- and retires the others itself (destroy takes one back and closes it)
  local idle_ms
  if type(o.min_idle) == "number" and o.min_idle > 0 then
    idle_ms = 0
  elseif type(o.idle_timeout) == "number" and o.idle_timeout > 0 and o.idle_timeout < math_huge then
    idle_ms = math_floor(o.idle_timeout * 1000 + 0.5)
  end
  -- nginx's pool for a key must hold every connection the key can have
  -- parked: max_idle idle records, plus records already handed to waiters
  -- that have not picked theirs up yet. Sized max_live (per key if capped):
  -- smaller, nginx closed the oldest under load and the pool counted them
  -- lost; the pool's own max_idle still bounds what stays idle.
  local pool_size = (type(o.per_key) == "table" and o.per_key.max_live) or o.max_live
  if type(pool_size) ~= "number" or pool_size < 1 then pool_size = 1 end
  pool_size = math_floor(pool_size)

  nmanagers = nmanagers + 1
  local prefix = "clientpool#" .. nmanagers .. "#"

  local stats = {
    connects = 0,       -- new connections opened (create or unpark)
    reuses = 0,         -- connections taken from nginx's keepalive pool
    lost = 0,           -- unpark found its parked connection gone and opened a new one
    set_aside = 0,      -- parked connections create found, set aside and parked again
    parked = 0,         -- connections handed to nginx's keepalive pool
    park_failed = 0,    -- setkeepalive failed (the connection was closed)
    closed = 0,         -- connections closed by destroy
    closed_parked = 0,  -- parked connections taken back and closed by destroy
    closed_exiting = 0, -- released connections closed because the worker is exiting
    handshakes = 0,     -- TLS handshakes
    connect_failed = 0,
  }
  local mgr = { stats = stats, prefix = prefix }

  -- key -> { params, name, connect options }, reset when it grows large
  local cache, ncache = {}, 0
  local function entry(key)
    local e = cache[key or false]
    if e then return e end
    local p, err
    if key == nil then
      p = default
      if not p then return nil, "clientpool.ngx: no host given to tcp(): acquire by cpngx.key{...}" end
      key = encode(p)
      local name = prefix .. key
      e = { p = p, name = name, copts = { pool = name, pool_size = pool_size } }
      cache[false] = e
      return e
    end
    p, err = _M.parse(key)
    if not p then return nil, err end
    local name = prefix .. key
    e = { p = p, name = name, copts = { pool = name, pool_size = pool_size } }
    if ncache >= 1024 then
      local d = cache[false]
      cache, ncache = { [false] = d }, 0
    end
    ncache = ncache + 1
    cache[key] = e
    return e
  end

  --- The nginx keepalive pool name of a key (nil = the default key).
  function mgr.name(key)
    local e, err = entry(key)
    if not e then return nil, err end
    return e.name
  end

  -- A connected cosocket for entry e and its reused count, or nil, err.
  local function open(e)
    local p = e.p
    local sock = ngx_tcp()
    if ct or st or rt then sock:settimeouts(ct, st, rt) end
    local ok, err
    if p.port then
      ok, err = sock:connect(p.host, p.port, e.copts)
    else
      ok, err = sock:connect(p.host, e.copts)
    end
    if not ok then
      stats.connect_failed = stats.connect_failed + 1
      return nil, "connect to " .. p.host .. (p.port and (":" .. p.port) or "") .. ": " .. tostring(err)
    end
    return sock, sock:getreusedtimes()
  end

  -- Connects for key; returns sock, reused count, or nil, err. With fresh
  -- (create), a parked connection is never taken: it belongs to an idle
  -- record (the warm floor creates while idle records are parked). Each one
  -- found is set aside until a new connection is open, then parked again.
  local function connect(key, fresh)
    local phase = get_phase()
    if not COSOCKET[phase] then
      return nil, "clientpool.ngx: cannot connect in the " .. phase .. " phase (cosockets are disabled there)"
    end
    local e, err = entry(key)
    if not e then return nil, err end
    if not fresh and e.aside_until then
      -- an unpark while a create of this key holds parked connections aside
      -- (below): wait for them rather than open one more connection than
      -- the pool counts; never past the create's own deadline, so a create
      -- killed meanwhile (ngx.exit, a kill) cannot hold unparks up for good
      while e.aside_until and ngx.now() < e.aside_until do
        ngx.sleep(0.001)
        ngx.update_time()
      end
    end
    local p = e.p
    local sock, reused = open(e)
    if not sock then return nil, reused end
    if fresh and reused > 0 then
      -- nginx keeps at most pool_size parked connections per name. While
      -- they are set aside (the fresh connect below yields), an unpark of
      -- this key waits for them (e.aside_until) instead of opening one more.
      local aside, n = {}, 0
      e.aside_until = ngx.now() + (ct or 1000) / 1000 + 0.1   -- see the unpark wait above
      repeat
        n = n + 1
        aside[n] = sock
        sock, reused = open(e)
      until not sock or reused == 0 or n > pool_size
      for i = 1, n do
        local s = aside[i]
        local ok = s:setkeepalive(idle_ms, pool_size)
        if not ok then
          pcall(s.close, s)
          stats.park_failed = stats.park_failed + 1
        end
      end
      e.aside_until = nil
      stats.set_aside = stats.set_aside + n
      if not sock then return nil, reused end
    end
    local ok
    if reused > 0 then
      stats.reuses = stats.reuses + 1
      return sock, reused
    end
    stats.connects = stats.connects + 1
    if p.ssl then
      if p.client_cert_id then
        local c = certs[p.client_cert_id]
        if not c then
          sock:close()
          return nil, "clientpool.ngx: unknown client_cert_id '" .. p.client_cert_id .. "'"
        end
        if not c.parsed then
          local ssl = require "ngx.ssl"
          local cert, pkey = c.cert, c.pkey
          if type(cert) == "string" then
            cert, err = ssl.parse_pem_cert(cert)
            if not cert then sock:close(); return nil, "client_cert: " .. tostring(err) end
          end
          if type(pkey) == "string" then
            pkey, err = ssl.parse_pem_priv_key(pkey)
            if not pkey then sock:close(); return nil, "client_priv_key: " .. tostring(err) end
          end
          c.parsed = { cert, pkey }
        end
        ok, err = sock:setclientcert(c.parsed[1], c.parsed[2])
        if not ok then sock:close(); return nil, "setclientcert: " .. tostring(err) end
      end
      local sess
      sess, err = sock:sslhandshake(nil, p.server_name, p.ssl_verify == true)
      if not sess then
        sock:close()
        return nil, "TLS handshake with " .. p.host .. ": " .. tostring(err)
      end
      stats.handshakes = stats.handshakes + 1
    end
    if on_connect then
      local okc, r1, r2 = pcall(on_connect, sock, key)
      if not okc or not r1 then
        sock:close()
        return nil, "on_connect: " .. tostring(okc and r2 or r1)
      end
    end
    return sock, 0
  end

  function opts.create(key)
    local sock, err = connect(key, true)
    if not sock then return nil, err end
    return sock
  end

  function opts.unpark(stored, key) -- luacheck: ignore stored
    if not COSOCKET[get_phase()] then return STANDIN end
    local sock, reused = connect(key)
    if not sock then return nil, reused end
    -- the parked connection was closed (idle timeout, peer): a new one
    if reused == 0 then stats.lost = stats.lost + 1 end
    return sock
  end

  function opts.park(sock, key) -- luacheck: ignore key
    if sock == STANDIN then return PARKED end
    if worker_exiting() then
      pcall(sock.close, sock)
      stats.closed_exiting = stats.closed_exiting + 1
      error("clientpool.ngx: worker exiting: connection closed instead of parked", 0)
    end
    local e, err = entry(key)
    local ok
    if e then ok, err = sock:setkeepalive(idle_ms, pool_size) end
    if not ok then
      pcall(sock.close, sock)
      stats.park_failed = stats.park_failed + 1
      error("clientpool.ngx: setkeepalive failed: " .. tostring(err) ..
            " (a cosocket is closed when the handler that made it ends: release in that handler)", 0)
    end
    stats.parked = stats.parked + 1
    return PARKED
  end

  function opts.destroy(client, key)
    if client == PARKED or client == STANDIN then
      -- take one parked connection back from nginx's pool and close it: a
      -- connect to "unix:" with pool = name returns a pooled connection if
      -- there is one and fails at once, without any I/O, if there is none
      if not COSOCKET[get_phase()] then return end
      local e = entry(key)
      if not e then return end
      local sock = ngx_tcp()
      local ok = sock:connect("unix:", e.copts)
      if ok then
        sock:close()
        stats.closed_parked = stats.closed_parked + 1
      end
      return
    end
    if client ~= nil then
      -- another handler's socket raises "bad request": nginx closes it when
      -- that handler ends
      local ok, r = pcall(client.close, client)
      if ok and r then stats.closed = stats.closed + 1 end
    end
  end

  managers[opts] = mgr
  return opts, mgr
end

--- The manager of an options table made by tcp() (its stats and names).
function _M.manager(opts)
  return managers[opts]
end

--- The counters of an options table made by tcp().
function _M.stats(opts)
  local m = managers[opts]
  return m and m.stats
end

return _M
