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
--
-- The parts (one concept each, dependencies one way: keys <- manager <-
-- tcp, driver <- this file): clientpool.ngx.keys, clientpool.ngx.manager,
-- clientpool.ngx.tcp, clientpool.ngx.driver (presets: clientpool.ngx.drivers).
local keys = require "clientpool.ngx.keys"
local manager = require "clientpool.ngx.manager"

local _M = { _VERSION = "0.1.0" }

_M.key, _M.parse = keys.key, keys.parse
_M.PARKED, _M.STANDIN = manager.PARKED, manager.STANDIN
_M.tcp = require("clientpool.ngx.tcp").tcp
_M.driver = require("clientpool.ngx.driver").driver
_M.manager, _M.stats = manager.manager, manager.stats

return _M
