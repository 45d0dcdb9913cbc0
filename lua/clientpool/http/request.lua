-- clientpool.http.request: request(), the one call: a request normalized,
-- sent on a lease (HTTP/1.1 or an HTTP/2 stream), its response read whole,
-- the connection's reuse decided, and the retries (a reused connection the
-- server closed, a stream it refused). Part of clientpool.http (the public API).
local clientpool = require "clientpool"
local lib = require "clientpool.http.lib"
local keys = require "clientpool.http.keys"
local hpool = require "clientpool.http.pool"
local cqueues, ce, http_headers, h2_error = lib.cqueues, lib.ce, lib.http_headers, lib.h2_error
local MAX_CONCURRENT_STREAMS, REFUSED_STREAM = lib.MAX_CONCURRENT_STREAMS, lib.REFUSED_STREAM
local split_url, host_port, key_of = keys.split_url, keys.host_port, keys.key_of
local conns, retiring = hpool.conns, hpool.retiring

local type, error, pairs, ipairs, tostring, tonumber, pcall, getmetatable =
      type, error, pairs, ipairs, tostring, tonumber, pcall, getmetatable
local string_format, string_find, string_sub, string_lower =
      string.format, string.find, string.sub, string.lower
local math_huge = math.huge
local table_concat = table.concat
local monotime = cqueues.monotime

-- A protected call the function may yield through (cqueues polls): pcall
-- on LuaJIT and Lua 5.2+, a pass-through coroutine on PUC Lua 5.1.
local ycall = require("clientpool.base").ycall

local _M = {}

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

-- HTTP/1.1 reads with lua-http's own waits (which take the seconds left).
local function h1_headers(stream, _, deadline) return stream:get_headers(left(deadline)) end
local function h1_body(stream, _, deadline) return stream:get_body_as_string(left(deadline)) end

-- One exchange on conn: the stream, the response headers, the body, and
-- on failure err, errno (stream first: the caller resets it).
local function exchange(conn, h2, h, body, method, deadline)
  local read_headers, read_body = h1_headers, h1_body
  if h2 then read_headers, read_body = h2_headers, h2_body end
  local stream = conn:new_stream()
  if not stream then return nil, nil, nil, ce.strerror(ce.EPIPE), ce.EPIPE end
  local ok, err, errno = stream:write_headers(h, body == nil, left(deadline))
  if ok and body then ok, err, errno = stream:write_chunk(body, true, left(deadline)) end
  if not ok then return stream, nil, nil, err, errno end
  local rh
  repeat
    rh, err, errno = read_headers(stream, conn, deadline)
    if not rh then return stream, nil, nil, err or "connection closed", errno end
    local status = rh:get(":status")
  until string_sub(status, 1, 1) ~= "1" or status == "101"
  if method == "HEAD" then return stream, rh, "" end
  local data
  data, err, errno = read_body(stream, conn, deadline)
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
