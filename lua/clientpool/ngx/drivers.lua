--- clientpool.ngx.drivers: presets of cpngx.driver{} for the lua-resty
-- drivers people use. Each preset knows its driver's connect signature,
-- method names and login, so a pool is one call:
--
--   clientpool.new(cpngx.driver { preset = "redis", host = "127.0.0.1", port = 6379,
--                                 password = pw, database = 1, max_live = 8 })
--
-- A preset is made per driver() call: preset(o, fail, what) returns a table
-- with any of
--   new            the constructor (when o.new is not given: the module's)
--   new_args(c, copts, args)   what new() is called with (default: nothing)
--   args(c, copts) a table made once per key, passed to connect
--   connect(obj, c, copts, args)  connects; ok or nil, err
--   setup(obj, c)  once per new connection, before on_connect (a login)
--   check(c)       refuses identities the driver cannot serve: nil, err
--   reused(obj)    getreusedtimes (default obj:get_reused_times())
--   keepalive, close   method names (default set_keepalive, close)
--   quit           the default of the option quit: the bytes that make the
--                  server close its end (so that a destroy returns once the
--                  server no longer counts the connection)
-- where c holds the key's identity (host, port, ssl, server_name,
-- ssl_verify, user, database, password) and copts the connect options
-- (connect_options, then pool = <name>, pool_size).
--
-- lua-resty-redis is tested here against redis-server (Debian's
-- lua-nginx-redis, 0.27, installs it as nginx.redis). lua-resty-mysql
-- (0.29), lua-resty-http (0.17) and pgmoon (1.17) are not in Debian: their
-- presets follow their public documentation and sources and are untested
-- here (docs/managers.md).
local type, pairs, tostring, tonumber, pcall, require, getmetatable, rawget =
      type, pairs, tostring, tonumber, pcall, require, getmetatable, rawget
local string_sub = string.sub

local M = {}

-- The constructor of the first module of `names` that loads.
local function load(names, fail, what, preset)
  for _, n in ipairs(names) do
    local ok, mod = pcall(require, n)
    if ok and type(mod) == "table" and type(mod.new) == "function" then return mod.new, mod end
  end
  fail("%s: preset '%s' needs %s (or give new = <the driver's constructor>)", what, preset,
       table.concat(names, " or "))
end

-- copts and then `t`'s fields in a new table.
local function merged(copts, t)
  local r = {}
  for k, v in pairs(copts) do r[k] = v end
  for k, v in pairs(t) do r[k] = v end
  return r
end

-- The login and address fields of a SQL driver's options: user, password,
-- database, host and port (or `path_field` = the unix socket's path), ssl.
local function sql_fields(c, path_field)
  local t = { user = c.user, password = c.password, database = c.database }
  if c.port then
    t.host, t.port = c.host, c.port
  else
    t[path_field] = string_sub(c.host, 6)     -- "unix:/path" -> "/path"
  end
  if c.ssl then t.ssl, t.ssl_verify = true, c.ssl_verify == true end
  return t
end

-- A check refusing server_name (drivers without an SNI option).
local function no_sni(preset, driver)
  return function(c)
    if c.server_name then return nil, "preset '" .. preset .. "': " .. driver .. " takes no server_name (SNI)" end
    return true
  end
end

--- lua-resty-redis: red:connect(host, port, { pool, pool_size, ssl,
-- server_name, ssl_verify }) (ssl: 0.28 and later), AUTH [user] password
-- and SELECT database on each new connection (any version: the login is
-- the preset's, not the driver's connect options), set_keepalive, close.
-- set_keepalive refuses a connection left subscribed ("subscribed state")
-- or in MULTI ("in transaction", 0.30+): the pool closes and retires it.
-- A close sends QUIT and waits for redis to close its end (quit = false
-- turns that off).
function M.redis(o, fail, what)
  local p = { quit = "QUIT\r\n" }
  local mod
  if o.new == nil then
    -- Debian's lua-nginx-redis installs the driver as nginx/redis.lua
    p.new, mod = load({ "resty.redis", "nginx.redis" }, fail, what, "redis")
  end
  -- before 0.28 the driver ignores ssl and would connect in clear
  local function no_tls(version)
    if (tonumber(version) or 0) >= 0.28 then return nil end
    return "ssl needs lua-resty-redis 0.28 or later (its connect option ssl); this one is " .. tostring(version)
  end
  function p.check(c)
    local err = c.ssl and mod and no_tls(mod._VERSION)
    if err then return nil, err end
    if c.database ~= nil and not tostring(c.database):match("^%d+$") then
      return nil, "preset 'redis': 'database' must be an integer >= 0, got " .. tostring(c.database)
    end
    if c.user ~= nil and c.password == nil then
      return nil, "preset 'redis': 'user' needs 'password' (AUTH user password)"
    end
    return true
  end
  function p.connect(red, c, copts)
    if c.ssl then
      -- a constructor given as new = ...: the version of the object's class
      local mt = getmetatable(red)
      local class = type(mt) == "table" and rawget(mt, "__index")
      local err = no_tls(type(class) == "table" and rawget(class, "_VERSION"))
      if err then return nil, err end
    end
    if c.port then return red:connect(c.host, c.port, copts) end
    return red:connect(c.host, copts)
  end
  function p.setup(red, c)
    local ok, err
    if c.password ~= nil then
      if c.user ~= nil then
        ok, err = red:auth(c.user, c.password)
      else
        ok, err = red:auth(c.password)
      end
      if not ok then return nil, "AUTH: " .. tostring(err) end
    end
    if c.database ~= nil and c.database ~= "0" then
      ok, err = red:select(c.database)
      if not ok then return nil, "SELECT " .. c.database .. ": " .. tostring(err) end
    end
    return true
  end
  return p
end

--- lua-resty-mysql: db:connect{ host, port | path, user, password,
-- database, ssl, ssl_verify, pool, pool_size, ... } (one table; the driver
-- logs in itself on a new connection), set_keepalive (refuses a connection
-- with a result not read: "cannot be reused in the current connection
-- state"), close (sends COM_QUIT).
function M.mysql(o, fail, what)
  local p = {}
  if o.new == nil then p.new = load({ "resty.mysql" }, fail, what, "mysql") end
  p.check = no_sni("mysql", "lua-resty-mysql")
  function p.args(c, copts) return merged(copts, sql_fields(c, "path")) end
  function p.connect(db, _, _, args) return db:connect(args) end
  return p
end

--- lua-resty-http: httpc:connect{ scheme, host, port, pool, pool_size,
-- ssl_server_name, ssl_verify, ... } (the driver does the TLS handshake on
-- a new connection), set_keepalive (returns 2, "connection must be
-- closed", after a response with Connection: close: it closed it), close.
-- Send requests with httpc:request{...} and read each body to its end;
-- httpc:request_uri() connects and keeps alive by itself, past the pool.
function M.http(o, fail, what)
  local p = {}
  if o.new == nil then p.new = load({ "resty.http" }, fail, what, "http") end
  function p.check(c)
    if c.ssl and c.ssl_verify == nil then
      return nil, "preset 'http': ssl = true needs ssl_verify = true or false (lua-resty-http verifies " ..
                  "unless told not to; say which, so that the key says it)"
    end
    if c.user or c.password or c.database then
      return nil, "preset 'http': user/password/database are not connection options (send credentials as headers)"
    end
    return true
  end
  function p.args(c, copts)
    local t = { host = c.host, port = c.port }
    if c.port then t.scheme = c.ssl and "https" or "http" end
    if c.ssl then t.ssl_server_name, t.ssl_verify = c.server_name, c.ssl_verify end
    return merged(copts, t)
  end
  function p.connect(httpc, _, _, args) return httpc:connect(args) end
  return p
end

--- pgmoon: pgmoon.new{ host, port | socket_path, user, password, database,
-- ssl, ssl_verify, pool_name, pool_size, ... } then pg:connect() (the driver
-- logs in itself on a new connection), pg:keepalive(timeout, size),
-- pg:disconnect(), pg:settimeout(ms); reused times from pg.sock.
function M.pgmoon(o, fail, what)
  local p = { keepalive = "keepalive", close = "disconnect" }
  if o.new == nil then p.new = load({ "pgmoon" }, fail, what, "pgmoon") end
  p.check = no_sni("pgmoon", "pgmoon")
  function p.args(c, copts)
    local r = merged(copts, sql_fields(c, "socket_path"))
    r.socket_type, r.pool_name, r.pool = "nginx", copts.pool, nil   -- pgmoon's name for it is pool_name
    return r
  end
  function p.new_args(_, _, args) return args end
  function p.connect(pg) return pg:connect() end
  function p.reused(pg) return pg.sock:getreusedtimes() end
  return p
end

return M
