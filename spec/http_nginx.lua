-- spec/http_nginx.lua: a private nginx (Debian's, with the Lua module for a
-- few handlers) on 127.0.0.1 free ports, for the clientpool.http specs.
-- Its access log has one line per request, "$server_port $connection
-- $connection_requests $request_uri $status $server_protocol", so a spec
-- counts the TCP connections the server really saw. Stopped by its pid.
--
--   local N = require "spec.http_nginx"
--   local srv = assert(N.start())        -- srv.ports.keep, .short, .nreq, .h2, .h2c, .h2goaway
--   srv:lines("/t1/")                    -- access log lines whose URI has this tag
--   srv:connections("/t1/")              -- distinct connections that served them
--   srv:stop()
--
-- Servers:
--   keep      HTTP/1.1, keepalive_timeout 60 s
--   short     HTTP/1.1, keepalive_timeout 1 s (stale keep-alive connections)
--   nreq      HTTP/1.1, keepalive_requests 3 (Connection: close on the 3rd)
--   h2        HTTP/2 over TLS (a self-signed certificate made now with
--             openssl; nil without openssl), http2_max_concurrent_streams 4
--   h2goaway  the same with keepalive_requests 3 and keepalive_timeout 1 s
--   h2c       HTTP/2 without TLS (prior knowledge), max concurrent streams 4
--   tls11     HTTP/1.1 over TLS only (ALPN offers no h2), keepalive_timeout 60 s
-- Locations on each: /<tag>/... answers "ok <uri>"; /<tag>/slow?s=S sleeps
-- S seconds first and counts the requests in flight per connection (most
-- at once: GET /inflight?c=<connection>); /<tag>/close answers with
-- Connection: close; /<tag>/busy answers 429 with Retry-After: 2; /<tag>/echo answers the request body; /<tag>/chunked
-- sends its body in pieces (chunked); /<tag>/big?n=N sends N bytes.
local N = {}

local function sh(cmd)
  local ok = os.execute(cmd)
  return ok == true or ok == 0
end

local function read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

--- A free 127.0.0.1 port (bound to port 0, read back, closed).
function N.free_port()
  local socket = require "cqueues.socket"
  local s = socket.listen { host = "127.0.0.1", port = 0 }
  local _, _, port = s:localname()
  s:close()
  return port
end

local function sleep(s)
  local cqueues = require "cqueues"
  if cqueues.running() then cqueues.sleep(s) else sh("sleep " .. s) end
end

N.have_nginx = sh("command -v nginx >/dev/null 2>&1") and
               read("/usr/lib/nginx/modules/ngx_http_lua_module.so") ~= nil
N.have_openssl = sh("command -v openssl >/dev/null 2>&1")

local LOCATIONS = [[
    location /inflight {
      content_by_lua_block { ngx.say(ngx.shared.cp:get("max:" .. (ngx.var.arg_c or "")) or 0) }
    }
    location ~ ^/[A-Za-z0-9_]+/slow$ {
      content_by_lua_block {
        local d, c = ngx.shared.cp, ngx.var.connection
        local n = d:incr("now:" .. c, 1, 0)
        if n > (d:get("max:" .. c) or 0) then d:set("max:" .. c, n) end
        ngx.sleep(tonumber(ngx.var.arg_s) or 0.2)
        d:incr("now:" .. c, -1)
        ngx.say("slow ", ngx.var.request_uri, " conn=", c)
      }
    }
    location ~ ^/[A-Za-z0-9_]+/busy$ { add_header Retry-After 2 always; return 429 "busy\n"; }
    location ~ ^/[A-Za-z0-9_]+/close$ { keepalive_timeout 0; return 200 "bye $request_uri\n"; }
    location ~ ^/[A-Za-z0-9_]+/echo$ {
      client_body_buffer_size 1m;
      content_by_lua_block { ngx.req.read_body(); ngx.print(ngx.req.get_body_data() or "") }
    }
    location ~ ^/[A-Za-z0-9_]+/chunked$ {
      content_by_lua_block { for i = 1, 5 do ngx.print("piece", i, ";"); ngx.flush(true) end }
    }
    location ~ ^/[A-Za-z0-9_]+/big$ {
      content_by_lua_block { ngx.print(string.rep("x", tonumber(ngx.var.arg_n) or 100000)) }
    }
    location / { return 200 "ok $request_uri\n"; }
]]

--- Starts the nginx; returns the server object or nil, err.
function N.start()
  if not N.have_nginx then return nil, "no nginx with the Lua module (nginx, libnginx-mod-http-lua)" end
  local root = os.getenv("PWD") or "."
  local dir = root .. "/build/http-spec/" .. tostring(os.time()) .. "-" .. tostring(math.random(1e9))
  if not sh("mkdir -p '" .. dir .. "/tmp'") then return nil, "cannot make " .. dir end
  local ports = {}
  for _, name in ipairs { "keep", "short", "nreq", "h2", "h2goaway", "h2c", "tls11" } do
    local p
    repeat
      p = N.free_port()
      local dup = false
      for _, q in pairs(ports) do if q == p then dup = true end end
    until not dup
    ports[name] = p
  end
  local tls = N.have_openssl and sh(
    "openssl req -x509 -newkey rsa:2048 -nodes -keyout '" .. dir .. "/key.pem' -out '" .. dir ..
    "/cert.pem' -days 2 -subj /CN=localhost -addext 'subjectAltName=DNS:localhost,IP:127.0.0.1' >/dev/null 2>&1")
  local h2servers = ""
  if tls then
    h2servers = ([[
  server { listen 127.0.0.1:%d ssl http2; ssl_certificate %s/cert.pem; ssl_certificate_key %s/key.pem;
           http2_max_concurrent_streams 4; keepalive_timeout 60s;
%s  }
  server { listen 127.0.0.1:%d ssl http2; ssl_certificate %s/cert.pem; ssl_certificate_key %s/key.pem;
           http2_max_concurrent_streams 4; keepalive_requests 3; keepalive_timeout 1s;
%s  }
  server { listen 127.0.0.1:%d ssl; ssl_certificate %s/cert.pem; ssl_certificate_key %s/key.pem;
           keepalive_timeout 60s;
%s  }
]]):format(ports.h2, dir, dir, LOCATIONS, ports.h2goaway, dir, dir, LOCATIONS, ports.tls11, dir, dir, LOCATIONS)
  else
    ports.h2, ports.h2goaway, ports.tls11 = nil, nil, nil
  end
  local mods = "/usr/lib/nginx/modules"
  local conf = ([[
load_module %s/ndk_http_module.so;
load_module %s/ngx_http_lua_module.so;
%s
worker_processes 1;
pid %s/nginx.pid;
error_log %s/error.log info;
events { worker_connections 1024; }
http {
  log_format conn '$server_port $connection $connection_requests $request_uri $status $server_protocol';
  access_log %s/access.log conn;
  client_body_temp_path %s/tmp/body; proxy_temp_path %s/tmp/proxy; fastcgi_temp_path %s/tmp/fastcgi;
  uwsgi_temp_path %s/tmp/uwsgi; scgi_temp_path %s/tmp/scgi;
  lua_shared_dict cp 1m;
  server { listen 127.0.0.1:%d; keepalive_timeout 60s; keepalive_requests 100000;
%s  }
  server { listen 127.0.0.1:%d; keepalive_timeout 1s;
%s  }
  server { listen 127.0.0.1:%d; keepalive_requests 3;
%s  }
  server { listen 127.0.0.1:%d http2; http2_max_concurrent_streams 4;
%s  }
%s}
]]):format(mods, mods, (sh("[ \"$(id -u)\" = 0 ]") and "user root;" or ""), dir, dir, dir, dir, dir, dir, dir, dir,
           ports.keep, LOCATIONS, ports.short, LOCATIONS, ports.nreq, LOCATIONS, ports.h2c, LOCATIONS, h2servers)
  local f = assert(io.open(dir .. "/nginx.conf", "w"))
  f:write(conf)
  f:close()
  if not sh("nginx -p '" .. dir .. "' -c '" .. dir .. "/nginx.conf' -e '" .. dir .. "/error.log' 2>'" ..
            dir .. "/start.log'") then
    return nil, "nginx did not start: " .. tostring(read(dir .. "/start.log"))
  end
  local srv = setmetatable({ dir = dir, ports = ports, tls = tls, cert = tls and (dir .. "/cert.pem") or nil },
                           { __index = N })
  for _ = 1, 100 do
    local pid = read(dir .. "/nginx.pid")
    if pid and pid:match("%d+") then srv.pid = tonumber(pid:match("%d+")); break end
    sh("sleep 0.05")
  end
  if not srv.pid then return nil, "nginx wrote no pid file" end
  -- every port answers
  for _ = 1, 100 do
    if sh("curl -fs --max-time 5 -o /dev/null http://127.0.0.1:" .. ports.keep .. "/ready/") then return srv end
    sh("sleep 0.05")
  end
  srv:stop()
  return nil, "nginx does not answer"
end

--- Stops the nginx by its pid (TERM: fast shutdown; KILL after 5 s) and removes its dir.
function N:stop()
  if self.pid then
    sh("kill -TERM " .. self.pid .. " 2>/dev/null")
    for _ = 1, 100 do
      if not sh("kill -0 " .. self.pid .. " 2>/dev/null") then break end
      sh("sleep 0.05")
    end
    if sh("kill -0 " .. self.pid .. " 2>/dev/null") then
      sh("pkill -KILL -P " .. self.pid .. " 2>/dev/null; kill -KILL " .. self.pid .. " 2>/dev/null")
    end
    self.pid = nil
  end
  if self.dir and os.getenv("KEEP") ~= "1" then sh("rm -rf '" .. self.dir .. "'") end
end

--- Access log lines whose URI contains tag: { port, conn, conn_requests, uri, status, proto }.
-- Waits up to 2 s for at least `want` lines (nginx logs after it answered).
function N:lines(tag, want)
  local out
  for _ = 1, 200 do
    out = {}
    for line in (read(self.dir .. "/access.log") or ""):gmatch("[^\n]+") do
      local port, conn, nreq, uri, status, proto = line:match("^(%d+) (%d+) (%d+) (%S+) (%d+) (%S+)$")
      if uri and uri:find(tag, 1, true) then
        out[#out + 1] = { port = tonumber(port), conn = tonumber(conn), conn_requests = tonumber(nreq),
                          uri = uri, status = tonumber(status), proto = proto }
      end
    end
    if not want or #out >= want then return out end
    sleep(0.01)
  end
  return out
end

--- Distinct connections that served the lines with tag (and the lines).
function N:connections(tag, want)
  local lines = self:lines(tag, want)
  local seen, n = {}, 0
  for _, l in ipairs(lines) do
    if not seen[l.conn] then seen[l.conn] = true; n = n + 1 end
  end
  return n, lines
end

--- The most requests in flight at once on nginx connection c (/slow).
function N:inflight(c)
  local p = io.popen("curl -fs --max-time 30 'http://127.0.0.1:" .. self.ports.keep .. "/inflight?c=" .. c .. "'")
  local s = p:read("*a")
  p:close()
  return tonumber(s)
end

N.sleep = sleep
N.read = read

return N
