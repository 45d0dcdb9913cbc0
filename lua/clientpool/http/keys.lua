-- clientpool.http.keys: the pool keys of origins and their TLS settings
-- (key, parse), URL splitting, the registry of client TLS contexts
-- (tls_context) and the contexts made for a key. Part of clientpool.http.
local lib = require "clientpool.http.lib"
local http_tls, openssl_ctx = lib.http_tls, lib.openssl_ctx

local type, error, pairs, tostring, tonumber, pcall =
      type, error, pairs, tostring, tonumber, pcall
local string_gsub, string_find, string_sub, string_lower, string_match =
      string.gsub, string.find, string.sub, string.lower, string.match
local table_concat = table.concat

local keyparts = require "clientpool.keyparts"

local _M = {}

local fail = keyparts.failer("clientpool.http")   -- raised without a position
_M.fail = fail

local DEFAULT_PORT = { http = 80, https = 443 }

local esc, unesc = keyparts.esc, keyparts.unesc

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

_M.split_url, _M.host_port, _M.key_of, _M.context_for = split_url, host_port, key_of, context_for

return _M
