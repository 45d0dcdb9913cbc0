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
--
-- The parts (one concept each, dependencies one way: lib, defaults <- keys
-- <- pool <- request <- this file): clientpool.http.lib, .defaults, .keys,
-- .pool, .request.
require "clientpool"              -- loaded in this order, as before the split: the errors a
require "clientpool.http.lib"     -- missing core or lua-http gives stay the same
local _M = require "clientpool.http.defaults"
local keys = require "clientpool.http.keys"
local pool = require "clientpool.http.pool"

_M.tls_context, _M.key, _M.parse = keys.tls_context, keys.key, keys.parse
_M.info, _M.pool, _M.manager = pool.info, pool.pool, pool.manager
_M.request = require("clientpool.http.request").request

return _M
