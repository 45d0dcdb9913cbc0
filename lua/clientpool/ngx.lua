--- clientpool.ngx: ready-made managers for OpenResty: tcp{} (raw cosockets,
-- TLS) and driver{} (lua-resty drivers: lua-resty-redis, lua-resty-mysql,
-- lua-resty-http, pgmoon; presets in clientpool.ngx.drivers). User docs:
-- docs/managers.md.
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
--   -- a lua-resty driver: lease.client is the driver object of this request
--   local pool = clientpool.new(cpngx.driver { preset = "redis", host = "127.0.0.1", port = 6379,
--                                              password = pw, database = 1, max_live = 8 })
--
-- The nginx pool name of a key is a per-manager prefix plus the key, so two
-- identities (host, port, TLS, SNI, verify mode, client certificate, user,
-- database, password, parts) never share a connection, and two managers
-- never take each other's parked connections. See docs/decisions.md
-- ("OpenResty").
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
-- Passwords by id (a salted md5): a key holds the id, never the password.
local secrets = {}

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
  -- credentials and database (drivers AUTH / SELECT / log in with them):
  -- the user and database as they are, a password by a salted hash only
  if o.user ~= nil then
    if type(o.user) ~= "string" or o.user == "" then fail("%s: 'user' must be a non-empty string", what) end
    p.user = o.user
  end
  if o.database ~= nil then
    local d = o.database
    if (type(d) ~= "string" or d == "") and not (is_int(d) and d >= 0) then
      fail("%s: 'database' must be a non-empty string or an integer >= 0, got %s", what, tostring(d))
    end
    p.database = tostring(d)
  end
  if o.password ~= nil then
    if type(o.password) ~= "string" then fail("%s: 'password' must be a string, got %s", what, type(o.password)) end
    local pid = ngx.md5("clientpool.ngx password\0" .. o.password)
    secrets[pid] = o.password
    p.password_id = pid
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
  if p.user then t[#t + 1] = "user=" .. esc(p.user) end
  if p.database then t[#t + 1] = "db=" .. esc(p.database) end
  if p.password_id then t[#t + 1] = "pw=" .. p.password_id end
  if p.parts then
    for _, v in ipairs(p.parts) do t[#t + 1] = "u=" .. esc(v) end
  end
  return table_concat(t, "|")
end

--- The pool key of an upstream identity: host, port, ssl, server_name,
-- ssl_verify, client certificate (client_cert + client_priv_key, PEM or
-- parsed, with client_cert_id; a PEM's id defaults to its md5), user,
-- database, password (kept by a salted md5; driver{} logs in with it) and
-- `parts` (a string or list of strings: anything else that makes an
-- identity). Different identities give different keys. The key is readable:
-- "host:port|tls|sni=name|verify|cert=id|user=u|db=d|pw=hash|u=part".
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
    elseif string_sub(seg, 1, 5) == "user=" then
      p.user = unesc(string_sub(seg, 6))
    elseif string_sub(seg, 1, 3) == "db=" then
      p.database = unesc(string_sub(seg, 4))
    elseif string_sub(seg, 1, 3) == "pw=" then
      p.password_id = string_sub(seg, 4)
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
-- What a record keeps once a keepalive check found its connection gone
-- from nginx's pool (or closed it): its destroy has nothing to take back.
local GONE = setmetatable({}, { __tostring = function() return "clientpool.ngx.GONE" end })

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
-- The manager: hooks around an adapter
---------------------------------------------------------------------------
--
-- tcp{} and driver{} are one manager. What differs is the adapter `ad`:
--   ad.open(e)                 a connection for entry e, connected with
--                              e.copts ({ pool = name, ... }): obj, reused
--                              (getreusedtimes) or nil, err
--   ad.setup(obj, e)           a new connection (reused == 0): TLS for tcp,
--                              a preset's AUTH/SELECT for a driver; true or
--                              nil, err
--   ad.keepalive(obj, ms, n)   parks it in nginx's pool: 1 (or true) when
--                              parked; anything else means it was not
--   ad.close(obj)
--   ad.prepare(e)              optional: completes a new entry (a driver's
--                              connect parameters); nil, err refuses the key
--   ad.adopt(obj), ad.state(obj), ad.done(obj)   optional (drivers): guard
--                              the object a caller gets, its state at park
--                              ("parked", "closed" + why), finished

-- The identity of the default key (cpngx.key's parameters) and the options
-- every manager takes; everything else goes to clientpool.new.
local IDENTITY = {
  host = true, port = true, ssl = true, server_name = true, ssl_verify = true,
  client_cert = true, client_priv_key = true, client_cert_id = true,
  user = true, database = true, password = true, parts = true,
}
local COMMON = { connect_timeout = true, send_timeout = true, read_timeout = true, on_connect = true }
local HOOKS = { "create", "destroy", "park", "unpark", "keepalive_check" }

local managers = setmetatable({}, { __mode = "k" }) -- options table -> manager
local nmanagers = 0

local function check_timeout(o, name, what)
  local v = o[name]
  if v == nil then return nil end
  if type(v) ~= "number" or v ~= v or v <= 0 or v == math_huge then
    fail("%s: '%s' must be a finite number of seconds > 0, got %s", what, name, tostring(v))
  end
  return math_floor(v * 1000 + 0.5)
end

-- Returns the options table for clientpool.new and the manager. `own`: the
-- names of the caller's own options (kept out of clientpool.new's);
-- make_adapter(o, ctx) returns the adapter (ctx: what, ct, st, rt in ms,
-- idle_ms, pool_size, stats, fail).
local function new_manager(o, what, own, make_adapter)
  if type(o) ~= "table" then fail("%s expects an options table, got %s", what, type(o)) end
  for _, h in ipairs(HOOKS) do
    if o[h] ~= nil then fail("%s fills in '%s' itself (use on_connect or validate)", what, h) end
  end
  local opts = {}
  for k, v in pairs(o) do
    if not IDENTITY[k] and not COMMON[k] and not own[k] then opts[k] = v end
  end
  local ct, st, rt = check_timeout(o, "connect_timeout", what), check_timeout(o, "send_timeout", what),
                     check_timeout(o, "read_timeout", what)
  local on_connect = o.on_connect
  if on_connect ~= nil and type(on_connect) ~= "function" then
    fail("%s: 'on_connect' must be a function, got %s", what, type(on_connect))
  end
  local default
  if o.host ~= nil then
    default = check_params(o, what)
  else
    for k in pairs(IDENTITY) do
      if o[k] ~= nil then
        fail("%s: '%s' without 'host' (give the identity in cpngx.key{...} instead)", what, k)
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
  if pool_size == nil and type(o.fleet) == "string" then
    -- a pool on a fleet: max_live defaults to the fleet's (docs/fleet.md)
    local h = require("clientpool.fleet")._handle(o.fleet)
    local lim = h and h:limits()
    pool_size = lim and (lim.key_max_live >= 0 and lim.key_max_live or lim.max_live)
  end
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
    park_failed = 0,    -- setkeepalive failed or was refused (the connection was closed)
    closed = 0,         -- connections closed by destroy
    closed_parked = 0,  -- parked connections taken back and closed by destroy
    closed_exiting = 0, -- released connections closed because the worker is exiting
    handshakes = 0,     -- TLS handshakes (tcp{}; a driver does its own)
    connect_failed = 0,
    keepalive_lost = 0, -- keepalive checks that found an idle record's connection gone from nginx's pool
  }
  local mgr = { stats = stats, prefix = prefix }
  local ad = make_adapter(o, { what = what, ct = ct, st = st, rt = rt, idle_ms = idle_ms,
                               pool_size = pool_size, stats = stats })
  local ad_state, ad_done, ad_adopt = ad.state, ad.done, ad.adopt

  -- key -> { p = params, name, copts = connect options, take = { pool = name } },
  -- reset when it grows large
  local cache, ncache = {}, 0
  local function new_entry(p, key)
    local name = prefix .. key
    local copts = { pool = name, pool_size = pool_size }
    local e = { p = p, name = name, copts = copts, take = copts }
    if ad.prepare then
      local ok, err = ad.prepare(e)
      if not ok then return nil, "clientpool.ngx: " .. what .. ": " .. tostring(err) end
    end
    return e
  end
  local function entry(key)
    local e = cache[key or false]
    if e then return e end
    local p, err
    if key == nil then
      p = default
      if not p then return nil, "clientpool.ngx: no host given to " .. what .. ": acquire by cpngx.key{...}" end
      e, err = new_entry(p, encode(p))
      if e then cache[false] = e end
      return e, err
    end
    p, err = _M.parse(key)
    if not p then return nil, err end
    e, err = new_entry(p, key)
    if not e then return nil, err end
    if ncache >= 1024 then
      local d = cache[false]
      cache, ncache = { [false] = d }, 0
    end
    ncache = ncache + 1
    cache[key] = e
    return e
  end
  if default then
    -- a default identity the adapter refuses is a bad option, said now
    local e, err = entry(nil)
    if not e then error(err, 0) end
  end

  --- The nginx keepalive pool name of a key (nil = the default key).
  function mgr.name(key)
    local e, err = entry(key)
    if not e then return nil, err end
    return e.name
  end

  --- The key of an identity (cpngx.key's parameters).
  mgr.key = _M.key

  -- A connected object for entry e and its reused count, or nil, err.
  local function open(e)
    local obj, reused = ad.open(e)
    if not obj then
      stats.connect_failed = stats.connect_failed + 1
      local p = e.p
      return nil, "connect to " .. p.host .. (p.port and (":" .. p.port) or "") .. ": " .. tostring(reused)
    end
    return obj, reused
  end

  -- Parks a connection of no record again (set aside by create, below).
  local function repark(obj)
    local pok, ok = pcall(ad.keepalive, obj, idle_ms, pool_size)
    if not pok or (ok ~= 1 and ok ~= true) then
      pcall(ad.close, obj)
      stats.park_failed = stats.park_failed + 1
    end
  end

  -- Connects for key; returns obj, reused count, or nil, err. With fresh
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
    local obj, reused = open(e)
    if not obj then return nil, reused end
    if fresh and reused > 0 then
      -- nginx keeps at most pool_size parked connections per name. While
      -- they are set aside (the fresh connect below yields), an unpark of
      -- this key waits for them (e.aside_until) instead of opening one more.
      local aside, n = {}, 0
      e.aside_until = ngx.now() + (ct or 1000) / 1000 + 0.1   -- see the unpark wait above
      repeat
        n = n + 1
        aside[n] = obj
        obj, reused = open(e)
      until not obj or reused == 0 or n > pool_size
      for i = 1, n do repark(aside[i]) end
      e.aside_until = nil
      stats.set_aside = stats.set_aside + n
      if not obj then return nil, reused end
    end
    if reused > 0 then
      stats.reuses = stats.reuses + 1
      return obj, reused
    end
    stats.connects = stats.connects + 1
    local ok
    ok, err = ad.setup(obj, e)
    if not ok then
      pcall(ad.close, obj)
      return nil, err
    end
    if on_connect then
      local okc, r1, r2 = pcall(on_connect, obj, key)
      if not okc or not r1 then
        pcall(ad.close, obj)
        return nil, "on_connect: " .. tostring(okc and r2 or r1)
      end
    end
    return obj, 0
  end

  function opts.create(key)
    local obj, err = connect(key, true)
    if not obj then return nil, err end
    if ad_adopt then ad_adopt(obj) end
    return obj
  end

  function opts.unpark(stored, key) -- luacheck: ignore stored
    if not COSOCKET[get_phase()] then return STANDIN end
    local obj, reused = connect(key)
    if not obj then return nil, reused end
    -- the parked connection was closed (idle timeout, peer): a new one
    if reused == 0 then stats.lost = stats.lost + 1 end
    if ad_adopt then ad_adopt(obj) end
    return obj
  end

  function opts.park(obj, key)
    if obj == STANDIN then return PARKED end
    if ad_state then
      local state, why = ad_state(obj)
      if state == "parked" then
        -- the caller's own set_keepalive() parked it the pool's way already
        ad_done(obj)
        stats.parked = stats.parked + 1
        return PARKED
      elseif state == "closed" then
        ad_done(obj)
        error("clientpool.ngx: " .. tostring(why) ..
              ": the record is retired (lease:release(false) retires a connection without this message)", 0)
      end
    end
    if worker_exiting() then
      pcall(ad.close, obj)
      if ad_done then ad_done(obj) end
      stats.closed_exiting = stats.closed_exiting + 1
      error("clientpool.ngx: worker exiting: connection closed instead of parked", 0)
    end
    local e, err = entry(key)
    local ok
    if e then
      -- pgmoon raises ("connection is busy") where the others return nil, err
      local pok
      pok, ok, err = pcall(ad.keepalive, obj, idle_ms, pool_size)
      if not pok then ok, err = nil, ok end
    end
    if ad_done then ad_done(obj) end
    if ok ~= 1 and ok ~= true then
      pcall(ad.close, obj)
      stats.park_failed = stats.park_failed + 1
      if ad_state then
        error("clientpool.ngx: " .. what .. ": the driver did not park the connection (" .. tostring(err) ..
              "): closed and retired", 0)
      end
      error("clientpool.ngx: setkeepalive failed: " .. tostring(err) ..
            " (a cosocket is closed when the handler that made it ends: release in that handler)", 0)
    end
    stats.parked = stats.parked + 1
    return PARKED
  end

  -- Takes one parked connection of key back from nginx's pool and closes
  -- it: a connect to "unix:" with pool = name returns a pooled connection if
  -- there is one and fails at once, without any I/O, if there is none.
  local function take_back(key)
    if not COSOCKET[get_phase()] then return end
    local e = entry(key)
    if not e then return end
    local sock = ngx_tcp()
    local ok = sock:connect("unix:", e.take)
    if ok then
      sock:close()
      stats.closed_parked = stats.closed_parked + 1
    end
  end

  function opts.destroy(client, key)
    if client == PARKED or client == STANDIN then return take_back(key) end
    if client == nil or client == GONE then return end
    if ad_state then
      local state = ad_state(client)
      ad_done(client)
      if state == "parked" then return take_back(key) end   -- its set_keepalive() parked it
      if state == "closed" or state == "done" then return end
    end
    -- another handler's socket raises "bad request": nginx closes it when
    -- that handler ends
    local ok, r = pcall(ad.close, client)
    if ok and r then stats.closed = stats.closed + 1 end
  end

  -- The pool's keepalive (option keepalive = s) checks an idle record in a
  -- timer (cosockets work there). Its connection is in nginx's pool under
  -- the key's name, which nginx keeps clean: it closes a parked connection
  -- whose peer closed it or that passed its keepalive timeout. So the check
  -- takes every connection parked there (a connect with the pool's name
  -- and no address returns a parked one at once, without I/O, or fails),
  -- parks them again in the same order, and compares: fewer than the key's
  -- idle records (`idle`, from the pool; connections this manager holds
  -- out for a check counted in) means one is gone, and this record goes
  -- (GONE: its destroy takes nothing back). With the pool's validate, one
  -- connection is then taken and validated too (a round trip, which also
  -- keeps middleboxes from dropping idle connections), and parked again.
  local validate = o.validate
  function opts.keepalive_check(stored, key, idle_s, idle)
    if stored ~= PARKED or not COSOCKET[get_phase()] then return true end
    local e = entry(key)
    -- a create holds parked connections aside meanwhile (connect): the count would be short
    if not e or e.aside_until then return true end
    local socks, n = {}, 0
    while n <= idle do
      local sock = ngx_tcp()
      if not sock:connect("unix:", e.take) then break end
      n = n + 1
      socks[n] = sock
    end
    for i = n, 1, -1 do
      local ok = socks[i]:setkeepalive(idle_ms, pool_size)
      if not ok then pcall(socks[i].close, socks[i]); n = n - 1 end
    end
    if n + (e.checking or 0) < idle then
      stats.keepalive_lost = stats.keepalive_lost + 1
      return false, GONE
    end
    if not validate then return true end
    local obj = opts.unpark(stored, key)
    if obj == nil then return false end          -- (nothing taken: destroy takes one back)
    e.checking = (e.checking or 0) + 1
    local ok, good = pcall(validate, obj, key, idle_s)
    e.checking = e.checking - 1
    if ok and good and pcall(opts.park, obj, key) then return true end
    if not (ok and good) then opts.destroy(obj, key) end   -- (a failed park closed it already)
    return false, GONE
  end

  managers[opts] = mgr
  return opts, mgr
end

---------------------------------------------------------------------------
-- tcp(): raw cosockets, TLS
---------------------------------------------------------------------------

local function tcp_adapter(o, ctx)
  for _, k in ipairs { "user", "password", "database" } do
    if o[k] ~= nil then
      fail("tcp(): '%s': tcp() does not log in (AUTH in on_connect, or use driver{ preset = \"redis\" })", k)
    end
  end
  local ct, st, rt, stats = ctx.ct, ctx.st, ctx.rt, ctx.stats
  local ad = {}
  function ad.open(e)
    local p = e.p
    local sock = ngx_tcp()
    if ct or st or rt then sock:settimeouts(ct, st, rt) end
    local ok, err
    if p.port then
      ok, err = sock:connect(p.host, p.port, e.copts)
    else
      ok, err = sock:connect(p.host, e.copts)
    end
    if not ok then return nil, err end
    return sock, sock:getreusedtimes()
  end
  function ad.setup(sock, e)
    local p = e.p
    if not p.ssl then return true end
    local err
    if p.client_cert_id then
      local c = certs[p.client_cert_id]
      if not c then return nil, "clientpool.ngx: unknown client_cert_id '" .. p.client_cert_id .. "'" end
      if not c.parsed then
        local ssl = require "ngx.ssl"
        local cert, pkey = c.cert, c.pkey
        if type(cert) == "string" then
          cert, err = ssl.parse_pem_cert(cert)
          if not cert then return nil, "client_cert: " .. tostring(err) end
        end
        if type(pkey) == "string" then
          pkey, err = ssl.parse_pem_priv_key(pkey)
          if not pkey then return nil, "client_priv_key: " .. tostring(err) end
        end
        c.parsed = { cert, pkey }
      end
      local ok
      ok, err = sock:setclientcert(c.parsed[1], c.parsed[2])
      if not ok then return nil, "setclientcert: " .. tostring(err) end
    end
    local sess
    sess, err = sock:sslhandshake(nil, p.server_name, p.ssl_verify == true)
    if not sess then return nil, "TLS handshake with " .. p.host .. ": " .. tostring(err) end
    stats.handshakes = stats.handshakes + 1
    return true
  end
  function ad.keepalive(sock, ms, n) return sock:setkeepalive(ms, n) end
  function ad.close(sock) return sock:close() end
  return ad
end

--- Returns the options table for clientpool.new (create/destroy/park/unpark
-- filled in) and the manager (`mgr.stats`, `mgr.name(key)`, `mgr.key{...}`).
-- Connection options: host, port, ssl, server_name, ssl_verify,
-- client_cert, client_priv_key, client_cert_id, user, database, password,
-- parts (the default key's identity; leave host out to acquire by
-- cpngx.key{...} only), connect_timeout, send_timeout, read_timeout
-- (seconds) and on_connect(sock, key) (runs on each new connection, after
-- the TLS handshake: AUTH, SELECT; return a false value and an error to
-- fail the connection). Every other option is clientpool.new's;
-- idle_timeout also sets setkeepalive's timeout, and max_live (or
-- per_key.max_live) nginx's pool size.
function _M.tcp(o)
  local ok, opts, mgr = pcall(new_manager, o, "tcp()", {}, tcp_adapter)
  if not ok then error(opts, 2) end
  return opts, mgr
end

---------------------------------------------------------------------------
-- driver(): any lua-resty driver of the common shape
---------------------------------------------------------------------------

-- driver()'s own options (IDENTITY and COMMON aside).
local DRIVER = {
  preset = true, new = true, connect = true, connect_options = true, keepalive = true, close = true,
  reused = true,
}

-- Private fields a driver object gets when a caller is handed it (rawset:
-- resty.redis makes a command method of every name its __index is asked).
local F_STATE, F_WHY, F_KA, F_CLOSE = "__clientpool_state", "__clientpool_why", "__clientpool_ka",
                                       "__clientpool_close"

-- Whether obj has a method `name`, without asking its __index function
-- (resty.redis would make a Redis command of any name).
local function has_method(obj, name)
  if type(rawget(obj, name)) == "function" then return true end
  local mt = getmetatable(obj)
  local idx = type(mt) == "table" and rawget(mt, "__index")
  while type(idx) == "table" do
    if type(rawget(idx, name)) == "function" then return true end
    local m2 = getmetatable(idx)
    idx = type(m2) == "table" and rawget(m2, "__index")
  end
  return false
end

local function driver_adapter(o, ctx)
  local what, stats = ctx.what, ctx.stats
  local preset
  if o.preset ~= nil then
    if type(o.preset) ~= "string" then fail("%s: 'preset' must be a string, got %s", what, type(o.preset)) end
    preset = rawget(require("clientpool.ngx.drivers"), o.preset)
    if type(preset) ~= "function" then
      fail("%s: unknown preset '%s' (redis, mysql, http, pgmoon)", what, o.preset)
    end
  end
  preset = preset and preset(o, fail, what) or {}
  local new = o.new
  if new == nil then new = preset.new end
  if type(new) ~= "function" then
    fail("%s: 'new' must be the driver's constructor (a function), got %s", what, type(new))
  end
  local connect = o.connect or preset.connect
  if connect ~= nil and type(connect) ~= "function" then
    fail("%s: 'connect' must be a function(obj, c, copts), got %s", what, type(connect))
  end
  local reused = o.reused or preset.reused
  if reused ~= nil and type(reused) ~= "function" then
    fail("%s: 'reused' must be a function(obj), got %s", what, type(reused))
  end
  local KA, CLOSE = o.keepalive or preset.keepalive or "set_keepalive", o.close or preset.close or "close"
  if type(KA) ~= "string" then fail("%s: 'keepalive' must be a method name, got %s", what, type(KA)) end
  if type(CLOSE) ~= "string" then fail("%s: 'close' must be a method name, got %s", what, type(CLOSE)) end
  local extra = o.connect_options
  if extra ~= nil then
    if type(extra) ~= "table" then fail("%s: 'connect_options' must be a table, got %s", what, type(extra)) end
    for _, k in ipairs { "pool", "pool_size", "pool_name" } do
      if extra[k] ~= nil then
        fail("%s: connect_options.%s: clientpool names and sizes nginx's pool itself", what, k)
      end
    end
  end
  if not connect and (o.user ~= nil or o.password ~= nil or o.database ~= nil) and not preset.setup then
    fail("%s: user/password/database need a preset or a 'connect' function that uses them", what)
  end
  local ct, st, rt, idle_ms, pool_size = ctx.ct, ctx.st, ctx.rt, ctx.idle_ms, ctx.pool_size
  local new_args, setup, make_args = preset.new_args, preset.setup, preset.args
  local timeouts -- how this driver's objects take timeouts (found on the first object)

  local ad = {}

  function ad.prepare(e)
    local p = e.p
    if p.client_cert_id then
      return nil, "client certificates: give the driver's own option in connect_options (tcp{} takes them)"
    end
    local c = { host = p.host, port = p.port, ssl = p.ssl, server_name = p.server_name,
                ssl_verify = p.ssl_verify, user = p.user, database = p.database, parts = p.parts }
    if p.password_id then
      c.password = secrets[p.password_id]
      if c.password == nil then
        return nil, "unknown password id '" .. p.password_id .. "' (make the key with cpngx.key{...} in this process)"
      end
    end
    if preset.check then
      local ok, err = preset.check(c)
      if not ok then return nil, err end
    end
    -- the driver's options, then the pool's: copts is what connect gets
    local copts = {}
    if extra then for k, v in pairs(extra) do copts[k] = v end end
    copts.pool, copts.pool_size = e.name, pool_size
    if not make_args and p.ssl then
      -- lua-resty-redis's (0.28+) names, the common ones
      copts.ssl, copts.server_name, copts.ssl_verify = true, p.server_name, p.ssl_verify == true
    end
    e.c, e.copts, e.take = c, copts, { pool = e.name }
    if make_args then e.args = make_args(c, copts) end
    return true
  end

  local function find_timeouts(obj)
    if has_method(obj, "set_timeouts") then return "set_timeouts" end
    if has_method(obj, "set_timeout") then return "set_timeout" end
    if has_method(obj, "settimeout") then return "settimeout" end
    return false
  end

  function ad.open(e)
    local c, copts = e.c, e.copts
    local obj, err
    if new_args then obj, err = new(new_args(c, copts, e.args)) else obj, err = new() end
    if type(obj) ~= "table" then
      if obj == nil then return nil, "new(): " .. tostring(err) end
      return nil, "new() must return a driver object (a table), got " .. type(obj)
    end
    if timeouts == nil then
      -- the first object: its methods (never through __index functions,
      -- which make a resty.redis command of any name)
      for _, m in ipairs { KA, CLOSE } do
        if not has_method(obj, m) then return nil, "the driver object has no method '" .. m .. "'" end
      end
      if not connect and not has_method(obj, "connect") then return nil, "the driver object has no method 'connect'" end
      if not reused and not has_method(obj, "get_reused_times") then
        return nil, "the driver object has no method 'get_reused_times' (give reused = function(obj))"
      end
      timeouts = find_timeouts(obj)
    end
    if timeouts == "set_timeouts" then
      if ct or st or rt then obj:set_timeouts(ct, st, rt) end
    elseif timeouts and ct then
      obj[timeouts](obj, ct)
    end
    local ok
    if connect then
      ok, err = connect(obj, c, copts, e.args)
    elseif c.port then
      ok, err = obj:connect(c.host, c.port, copts)
    else
      ok, err = obj:connect(c.host, copts)
    end
    if not ok then
      -- a driver may fail after the TCP connect (a refused login)
      local close = obj[CLOSE]
      if type(close) == "function" then pcall(close, obj) end
      return nil, err
    end
    if timeouts and timeouts ~= "set_timeouts" and (rt or st) then obj[timeouts](obj, rt or st) end
    local n
    if reused then
      n, err = reused(obj)
    else
      n, err = obj:get_reused_times()
    end
    if type(n) ~= "number" then
      pcall(obj[CLOSE], obj)
      return nil, "get_reused_times: " .. tostring(err)
    end
    return obj, n
  end

  function ad.setup(obj, e)
    if not setup then return true end
    return setup(obj, e.c)
  end

  -- The driver's own methods (a guarded object has them in private fields).
  local function real(obj, name, field)
    local f = rawget(obj, field)
    if f then return f end
    f = obj[name]
    if type(f) ~= "function" then fail("%s: the driver object has no method '%s'", what, name) end
    return f
  end
  function ad.keepalive(obj, ms, n) return real(obj, KA, F_KA)(obj, ms, n) end
  function ad.close(obj) return real(obj, CLOSE, F_CLOSE)(obj) end

  -- Counts a habit; its first one is a line in the error log, naming the fix.
  local warned = {}
  local function habit(name, method, does)
    stats[name] = stats[name] + 1
    if warned[name] then return end
    warned[name] = true
    ngx.log(ngx.WARN, "clientpool.ngx: ", what, ": ", method, "() on a leased driver object ", does,
            " (logged once per pool)")
  end
  -- A leased object's set_keepalive() (a habit from the bare driver) parks
  -- it the pool's way at once (the pool's timeout and size, not the
  -- caller's): lease:release() then only books it. A refusal (subscribed
  -- state, a transaction, unread data) is returned as the driver says it;
  -- the connection stays with the lease and its release retires it.
  -- docs/decisions.md ("Drivers") says why this is not an error.
  local function habit_keepalive(obj)
    if rawget(obj, F_STATE) ~= "leased" then return 1 end  -- parked or released already
    habit("habit_keepalive", KA, "parks it through the pool; lease:release() is enough")
    if worker_exiting() then return 1 end     -- its release closes it
    local pok, ok, err = pcall(rawget(obj, F_KA), obj, idle_ms, pool_size)
    if not pok then ok, err = nil, ok end
    if ok == 1 or ok == true then
      rawset(obj, F_STATE, "parked")
      return 1
    end
    if ok then
      -- not parked, though the driver said ok (lua-resty-http: 2, "connection must be closed")
      rawset(obj, F_STATE, "closed")
      rawset(obj, F_WHY, KA .. "() closed the connection (" .. tostring(err) .. ")")
    end
    return ok, err
  end
  -- A leased object's close() closes the connection; its lease's release
  -- then retires the record (counted), with a line in the error log.
  local function habit_close(obj)
    if rawget(obj, F_STATE) ~= "leased" then return nil, "closed" end
    habit("habit_close", CLOSE, "closes the connection; lease:release(false) retires it the pool's way")
    rawset(obj, F_STATE, "closed")
    rawset(obj, F_WHY, "the connection was closed by " .. CLOSE .. "() before its lease was released")
    return rawget(obj, F_CLOSE)(obj)
  end
  stats.habit_keepalive, stats.habit_close = 0, 0

  function ad.adopt(obj)
    rawset(obj, F_KA, real(obj, KA, F_KA))
    rawset(obj, F_CLOSE, real(obj, CLOSE, F_CLOSE))
    rawset(obj, KA, habit_keepalive)
    rawset(obj, CLOSE, habit_close)
    rawset(obj, F_STATE, "leased")
  end
  function ad.state(obj)
    return rawget(obj, F_STATE), rawget(obj, F_WHY)
  end
  function ad.done(obj)
    if rawget(obj, F_STATE) then rawset(obj, F_STATE, "done") end
  end
  return ad
end

--- Returns the options table for clientpool.new and the manager, for a
-- lua-resty driver (lua-resty-redis, lua-resty-mysql, lua-resty-http,
-- pgmoon, or any of the same shape). lease.client is the connected driver
-- object of this request. Options: preset ("redis", "mysql", "http",
-- "pgmoon": the driver's connect signature, methods and login); new (the
-- driver's constructor; a preset finds its module); connect(obj, c, copts)
-- (how to connect; default obj:connect(host, port, copts)); connect_options
-- (the driver's own options, copied into every connect); keepalive, close
-- (method names; a number as keepalive is the pool's option); reused(obj) (default obj:get_reused_times()); tcp{}'s
-- identity options (user, database, password log in through a preset) and
-- timeouts; on_connect(obj, key), once per new connection, after the
-- driver's own handshake. Everything else is clientpool.new's.
function _M.driver(o)
  -- `keepalive`: a method name (a string) is the driver's set_keepalive; a
  -- number is the pool's keepalive (seconds), passed on
  local pool_keepalive
  if type(o) == "table" and type(o.keepalive) == "number" then
    pool_keepalive = o.keepalive
    local c = {}
    for k, v in pairs(o) do c[k] = v end
    c.keepalive = nil
    o = c
  end
  local ok, opts, mgr = pcall(new_manager, o, "driver()", DRIVER, driver_adapter)
  if not ok then error(opts, 2) end
  opts.keepalive = pool_keepalive
  return opts, mgr
end

--- The manager of an options table made by tcp() or driver() (its stats and names).
function _M.manager(opts)
  return managers[opts]
end

--- The counters of an options table made by tcp() or driver().
function _M.stats(opts)
  local m = managers[opts]
  return m and m.stats
end

return _M
