-- clientpool.ngx.tcp: tcp{}, the manager of raw cosockets (TLS, client
-- certificates): its adapter for clientpool.ngx.manager. Part of
-- clientpool.ngx (the public API).
local ngx = ngx
local type, error, ipairs, tostring, pcall, require = type, error, ipairs, tostring, pcall, require

local keys = require "clientpool.ngx.keys"
local new_manager = require("clientpool.ngx.manager").new_manager
local fail, certs = keys.fail, keys.certs

local ngx_tcp = ngx.socket.tcp

local _M = {}

local function tcp_adapter(o, ctx)
  for _, k in ipairs { "user", "password", "database" } do
    if o[k] ~= nil then
      fail("tcp(): '%s': tcp() does not log in (AUTH in on_connect, or use driver{ preset = \"redis\" })", k)
    end
  end
  local ct, st, rt, stats = ctx.ct, ctx.st, ctx.rt, ctx.stats
  local ad = { raw = true }
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
-- fail the connection), quit (bytes sent before a close, which then waits
-- for the peer's, at most quit_timeout: docs/managers.md). Every other
-- option is clientpool.new's;
-- idle_timeout also sets setkeepalive's timeout, and max_live (or
-- per_key.max_live) nginx's pool size.
function _M.tcp(o)
  local ok, opts, mgr = pcall(new_manager, o, "tcp()", {}, tcp_adapter)
  if not ok then error(opts, 2) end
  return opts, mgr
end

return _M
