-- clientpool.http.defaults: the public table of clientpool.http with its
-- defaults (a user may set them before making a pool: pool() reads them
-- there). clientpool.http adds its functions to this same table.
local _M = { _VERSION = "0.1.0" }

--- Defaults (seconds; see docs/http.md for why).
-- idle_timeout: below the shortest common server keep-alive (Apache httpd's
-- KeepAliveTimeout and Node.js's keepAliveTimeout are 5 s; nginx 75 s),
-- with a second of margin for the server's clock starting before ours.
_M.IDLE_TIMEOUT = 4
_M.CONNECT_TIMEOUT = 10
_M.REQUEST_TIMEOUT = 30
-- HTTP/2 streams per connection (the pool's capacity) when not given: RFC
-- 9113 asks servers for at least 100 (nginx: 128, Apache/h2o: 100).
_M.H2_CAPACITY = 100

return _M
