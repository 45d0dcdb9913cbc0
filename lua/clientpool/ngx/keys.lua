-- clientpool.ngx.keys: the pool keys of upstream identities (cpngx.key,
-- cpngx.parse), their validation, and the registries a key refers to by id
-- (client certificates, passwords). Part of clientpool.ngx (the public API).
local ngx = ngx
local type, error, pairs, ipairs, tostring, tonumber, pcall =
      type, error, pairs, ipairs, tostring, tonumber, pcall
local string_find, string_sub = string.find, string.sub
local math_floor, math_huge = math.floor, math.huge
local table_concat = table.concat

local keyparts = require "clientpool.keyparts"

local _M = {}

local fail = keyparts.failer("clientpool.ngx")   -- raised without a position
_M.fail = fail

local esc, unesc = keyparts.esc, keyparts.unesc

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

_M.check_params, _M.encode, _M.certs, _M.secrets = check_params, encode, certs, secrets

return _M
