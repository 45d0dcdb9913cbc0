-- Build with `luarocks make rockspec/clientpool-scm-1.rockspec` from the
-- repository root.  Every lua/clientpool/**.lua file must be listed below
-- (`make check-rockspec`, part of `make test`, checks it).
rockspec_format = "3.0"
package = "clientpool"
version = "scm-1"

source = {
  -- The project's repository; `luarocks make` builds the working tree and
  -- never fetches it (`luarocks install` of this rockspec would clone it).
  url = "git+https://github.com/clientpool/clientpool.git",
}

description = {
  summary = "Pool of outbound clients with bounded admission, driven by the host's scheduler",
  detailed = [[
clientpool pools outbound clients (HTTP keep-alive, Redis, SQL, game-backend
sockets) for Lua 5.1-5.4, LuaJIT and OpenResty: bounded admission, client
lifetime and reuse, protocol-driven pausing and cooperative drain. Waiting
suspends the calling coroutine on the host's scheduler (OpenResty, cqueues,
luv, copas, or the built-in loop). The accounting engine is written in C.
]],
  license = "MIT",
}

dependencies = {
  "lua >= 5.1, < 5.5",
  -- Schedulers (cqueues, luv, copas, OpenResty) stay optional, and so does
  -- lua-http, which only clientpool.http needs.
}

build = {
  type = "builtin",
  modules = {
    ["clientpool.core"] = {
      sources = { "csrc/engine.c", "csrc/clock.c", "csrc/lclientpool.c", "csrc/lfastpath.c", "csrc/fleet.c", "csrc/lfleet.c" },
      incdirs = { "csrc" },
    },
    ["clientpool"] = "lua/clientpool/init.lua",
    ["clientpool.base"] = "lua/clientpool/base.lua",
    ["clientpool.options"] = "lua/clientpool/options.lua",
    ["clientpool.configure"] = "lua/clientpool/configure.lua",
    ["clientpool.keepalive"] = "lua/clientpool/keepalive.lua",
    ["clientpool.token"] = "lua/clientpool/token.lua",
    ["clientpool.events"] = "lua/clientpool/events.lua",
    ["clientpool.keys"] = "lua/clientpool/keys.lua",
    ["clientpool.leak"] = "lua/clientpool/leak.lua",
    ["clientpool.stats"] = "lua/clientpool/stats.lua",
    ["clientpool.floor"] = "lua/clientpool/floor.lua",
    ["clientpool.lease"] = "lua/clientpool/lease.lua",
    ["clientpool.admission"] = "lua/clientpool/admission.lua",
    ["clientpool.drain"] = "lua/clientpool/drain.lua",
    ["clientpool.acquire"] = "lua/clientpool/acquire.lua",
    ["clientpool.checkout"] = "lua/clientpool/checkout.lua",
    ["clientpool.loop"] = "lua/clientpool/loop.lua",
    ["clientpool.ffi"] = "lua/clientpool/ffi.lua",
    ["clientpool.ffibase"] = "lua/clientpool/ffibase.lua",
    ["clientpool.cdef"] = "lua/clientpool/cdef.lua",
    ["clientpool.policy"] = "lua/clientpool/policy.lua",
    ["clientpool.sched.loop"] = "lua/clientpool/sched/loop.lua",
    ["clientpool.sched.core"] = "lua/clientpool/sched/core.lua",
    ["clientpool.sched.hosted"] = "lua/clientpool/sched/hosted.lua",
    ["clientpool.sched.cqueues"] = "lua/clientpool/sched/cqueues.lua",
    ["clientpool.sched.luv"] = "lua/clientpool/sched/luv.lua",
    ["clientpool.sched.copas"] = "lua/clientpool/sched/copas.lua",
    ["clientpool.sched.ngx"] = "lua/clientpool/sched/ngx.lua",
    ["clientpool.ngx"] = "lua/clientpool/ngx.lua",
    ["clientpool.keyparts"] = "lua/clientpool/keyparts.lua",
    ["clientpool.caps"] = "lua/clientpool/caps.lua",
    ["clientpool.http"] = "lua/clientpool/http.lua",
    ["clientpool.http.lib"] = "lua/clientpool/http/lib.lua",
    ["clientpool.http.defaults"] = "lua/clientpool/http/defaults.lua",
    ["clientpool.http.keys"] = "lua/clientpool/http/keys.lua",
    ["clientpool.http.pool"] = "lua/clientpool/http/pool.lua",
    ["clientpool.http.request"] = "lua/clientpool/http/request.lua",
    ["clientpool.metrics"] = "lua/clientpool/metrics.lua",
    ["clientpool.ngx.drivers"] = "lua/clientpool/ngx/drivers.lua",
    ["clientpool.ngx.keys"] = "lua/clientpool/ngx/keys.lua",
    ["clientpool.ngx.manager"] = "lua/clientpool/ngx/manager.lua",
    ["clientpool.ngx.tcp"] = "lua/clientpool/ngx/tcp.lua",
    ["clientpool.ngx.driver"] = "lua/clientpool/ngx/driver.lua",
    ["clientpool.fleet"] = "lua/clientpool/fleet.lua",
    ["clientpool.fleet_ffi"] = "lua/clientpool/fleet_ffi.lua",
    ["clientpool.fleet_cdef"] = "lua/clientpool/fleet_cdef.lua",
    ["clientpool.fleetlink"] = "lua/clientpool/fleetlink.lua",
    ["clientpool.redisfleet"] = "lua/clientpool/redisfleet/init.lua",
    ["clientpool.redisfleet.agent"] = "lua/clientpool/redisfleet/agent.lua",
    ["clientpool.redisfleet.budgets"] = "lua/clientpool/redisfleet/budgets.lua",
    ["clientpool.redisfleet.scripts"] = "lua/clientpool/redisfleet/scripts.lua",
    ["clientpool.redisfleet.resp"] = "lua/clientpool/redisfleet/resp.lua",
    ["clientpool.owners"] = "lua/clientpool/owners.lua",
  },
}
