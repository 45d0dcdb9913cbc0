-- clientpool.http.lib: what clientpool.http takes from lua-http and
-- cqueues, loaded once, with one clear error when they do not load; and the
-- HTTP/2 codes it reads. Part of clientpool.http (the public API).
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

return {
  cqueues = cqueues, ce = ce, condition = condition, http_client = http_client, http_headers = http_headers,
  http_tls = http_tls, h2_error = h2_error, openssl_ctx = openssl_ctx,
  MAX_CONCURRENT_STREAMS = 0x3, -- the SETTINGS parameter's id
  REFUSED_STREAM = h2_error.errors.REFUSED_STREAM.code,
}
