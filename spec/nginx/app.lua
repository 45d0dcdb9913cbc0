-- spec/nginx/app.lua: the handlers the nginx specs call over HTTP, and the
-- shared state they inspect. Specs run in the same (single) worker, so they
-- put pools into app.pools and read what the handlers recorded.
--
-- Endpoints (content phase, GET, arguments in the query string):
--   /app/acquire?pool=P[&key=K][&timeout=S][&hold=S][&destroy=1][&tag=T]
--       acquire, hold S seconds, release (or destroy); says
--       "ok <client id> waited=<s>" or "err <code> <detail>"
--   /app/redis_ping?pool=P[&key=K]     acquire, PING, release
--   /app/driver_cmd?pool=P[&habit=keepalive|close]   a cpngx.driver pool's
--                                      resty.redis object: SET, GET, the habit, release
--   /app/sched_wait?id=X[&timeout=S]   a raw adapter wait, woken by a spec
--   /app/wait_abort?pool=P            says "waiting", then acquires (abort tests)
--   /app/sample?name=N&secs=S         samples redis CLIENT LIST for S seconds,
--                                      says the most clients named N seen at once
--   /app/http_get?pool=P[&up=U][&sleep=S][&on_drain=preserve|cancel:G][&tag=T]
--       acquire from an HTTP pool (A.http_pool), GET /upstream/U over the
--       pooled keep-alive connection, lease:observe(response), release; the
--       lease's on_cancel aborts the request. Says "status <n> conn=<id>
--       reqs=<n> waited=<s>", "aborted cancel_after=<s>" or "err <code> ..."
--   /app/drain?pool=P[&timeout=S]     pool:drain(S); says "drained <ok> <code> in <s>"
--   /app/configure?pool=P&<option>=<number>...   pool:configure{...} with the
--                                      numeric arguments ("false" for false);
--                                      says "ok", "err <code>" or "raised <message>"
--   /upstream/<U>[?sleep=S]           the HTTP upstream (A.upstream): answers
--                                      the statuses scripted in A.upstreams[U]
-- Phase locations (see nginx.conf): /phase/set, /phase/log, /phase/header_filter,
-- /phase/rewrite, /phase/access; each runs app.phase_probe(phase) there.
local clientpool = require "clientpool"
local cpngx = require "clientpool.ngx"
local sched = require "clientpool.sched.ngx"
local semaphore = require "ngx.semaphore"
local H -- harness, loaded lazily (it needs spec_conf)

local A = {
  pools = {},      -- name -> pool
  managers = {},   -- name -> clientpool.ngx manager
  factories = {},  -- name -> plain client factory
  handles = {},    -- id -> adapter handle (sched_wait)
  log = {},        -- name -> list of events recorded by handlers
  probes = {},     -- name -> function(phase) run by the phase locations
  upstreams = {},  -- name -> state of /upstream/<name> (A.upstream_state)
  drain_started = {}, -- pool name -> now() when /app/drain began
}

local function harness()
  if not H then H = require "harness" end
  return H
end

--- A plain client factory (no I/O): counts creates and destroys.
function A.factory(name, o)
  o = o or {}
  local f = { created = 0, destroyed = 0, open = {}, destroyed_in = {} }
  function f.create(key)
    if o.create_delay then ngx.sleep(o.create_delay) end
    f.created = f.created + 1
    local c = { id = f.created, key = key }
    f.open[c] = true
    return c
  end
  function f.destroy(c)
    f.destroyed = f.destroyed + 1
    f.destroyed_in[#f.destroyed_in + 1] = ngx.get_phase()
    if c then f.open[c] = nil end
  end
  function f.nopen()
    local n = 0
    for _ in pairs(f.open) do n = n + 1 end
    return n
  end
  if name then A.factories[name] = f end
  return f
end

--- A pool of plain clients on the ngx scheduler.
function A.plain_pool(name, o)
  local f = A.factory(name, o and o.factory)
  local opts = { create = f.create, destroy = f.destroy, scheduler = "ngx" }
  for k, v in pairs(o or {}) do if k ~= "factory" then opts[k] = v end end
  local pool = clientpool.new(opts)
  A.pools[name] = pool
  return pool, f
end

local function record(name, v)
  local l = A.log[name]
  if not l then l = {}; A.log[name] = l end
  l[#l + 1] = v
end
A.record = record

local function arg(name)
  return ngx.var["arg_" .. name]
end

---------------------------------------------------------------------------
-- HTTP: an upstream in this nginx and a tiny HTTP/1.1 keep-alive client
---------------------------------------------------------------------------

--- The state of /upstream/<name>: `script`, the statuses of the next
-- responses (then 200); `retry_after`, the Retry-After of a 429 or 503
-- ("1"); `hits`; `inflight`, `max_inflight`; `aborted`, requests whose
-- client closed the connection first; `events`, { "start"|"end"|"abort", n }
-- in order. Reset by a spec before use.
function A.upstream_state(name, o)
  local u = { script = {}, retry_after = "1", hits = 0, inflight = 0, max_inflight = 0, aborted = 0,
              events = {} }
  for k, v in pairs(o or {}) do u[k] = v end
  A.upstreams[name] = u
  return u
end

--- /upstream/<name>[?sleep=S]: sleeps S, answers the next scripted status
-- with a Content-Length (so the client keeps the connection), and says which
-- connection served it (X-Conn, X-Conn-Requests).
function A.upstream()
  local name = ngx.var.uri:match("^/upstream/([%w_]+)$")
  local u = name and A.upstreams[name]
  if not u then
    ngx.status = 404
    ngx.header["Content-Length"] = 0
    return
  end
  u.hits = u.hits + 1
  local n = u.hits
  u.inflight = u.inflight + 1
  if u.inflight > u.max_inflight then u.max_inflight = u.inflight end
  u.events[#u.events + 1] = { "start", n }
  ngx.on_abort(function()                   -- lua_check_client_abort on (nginx.conf)
    u.inflight = u.inflight - 1
    u.aborted = u.aborted + 1
    u.events[#u.events + 1] = { "abort", n }
    ngx.exit(499)
  end)
  local secs = tonumber(ngx.var.arg_sleep)
  if secs then ngx.sleep(secs) end
  u.inflight = u.inflight - 1
  u.events[#u.events + 1] = { "end", n }
  local status = table.remove(u.script, 1) or 200
  ngx.status = status
  if status == 429 or status == 503 then ngx.header["Retry-After"] = u.retry_after end
  ngx.header["X-Conn"] = ngx.var.connection
  ngx.header["X-Conn-Requests"] = ngx.var.connection_requests
  local body = "status " .. status .. " #" .. n .. "\n"
  ngx.header["Content-Length"] = #body
  ngx.print(body)
end

--- GET path on a connected cosocket, HTTP/1.1 keep-alive, a response with a
-- Content-Length. Returns { status = n, headers = { name = value }, body },
-- or nil, err (the connection is then unusable).
function A.http_request(sock, path)
  local ok, err = sock:send("GET " .. path .. " HTTP/1.1\r\nHost: upstream\r\n\r\n")
  if not ok then return nil, "send: " .. tostring(err) end
  local line
  line, err = sock:receive("*l")
  if not line then return nil, "receive: " .. tostring(err) end
  local status = tonumber(line:match("^HTTP/1%.%d (%d%d%d)"))
  if not status then return nil, "bad status line: " .. line end
  local headers = {}
  while true do
    line, err = sock:receive("*l")
    if not line then return nil, "receive: " .. tostring(err) end
    if line == "" then break end
    local k, v = line:match("^([^:]+):%s*(.-)%s*$")
    if k then headers[k] = v end
  end
  local len = tonumber(headers["Content-Length"])
  if not len then return nil, "no Content-Length" end
  local body = ""
  if len > 0 then
    body, err = sock:receive(len)
    if not body then return nil, "receive: " .. tostring(err) end
  end
  return { status = status, headers = headers, body = body }
end

--- A pool made by a clientpool.ngx manager (make: cpngx.tcp or cpngx.driver)
-- from `defaults` and then `o`, registered as app.pools[name] and
-- app.managers[name]. Returns pool, manager.
function A.manager_pool(name, make, defaults, o)
  local opts = {}
  for k, v in pairs(defaults) do opts[k] = v end
  for k, v in pairs(o or {}) do opts[k] = v end
  local popts, mgr = make(opts)
  local pool = clientpool.new(popts)
  A.pools[name] = pool
  A.managers[name] = mgr
  return pool, mgr
end

--- A pool of tcp{} cosockets to the private redis whose connections are
-- named `client_name` there (CLIENT SETNAME; default: name), so they can
-- be counted apart from the spec's own (r:clients(client_name)).
function A.redis_pool(name, o, client_name)
  local conf = require "spec_conf"
  client_name = client_name or name
  return A.manager_pool(name, cpngx.tcp, {
    host = "127.0.0.1", port = conf.redis_port, connect_timeout = 1, read_timeout = 5, scheduler = "ngx",
    on_connect = function(sock) return harness().command(sock, "CLIENT", "SETNAME", client_name) end,
  }, o)
end

--- A pool of keep-alive HTTP connections to this nginx (clientpool.ngx).
function A.http_pool(name, o)
  local conf = require "spec_conf"
  return A.manager_pool(name, cpngx.tcp, { host = "127.0.0.1", port = conf.port, connect_timeout = 1,
                                           read_timeout = 10, scheduler = "ngx" }, o)
end

-- An acquire from app.pools[?pool=] for a handler: the lease, or nil after
-- "err nopool" or a 503 "err <code> <detail>".
local function acquire_or_503()
  local pool = A.pools[arg("pool")]
  if not pool then ngx.say("err nopool"); return nil end
  local lease, code, detail = pool:acquire(arg("key"))
  if not lease then
    ngx.status = 503
    ngx.say("err ", tostring(code), " ", tostring(detail))
  end
  return lease
end

local handlers = {}

function handlers.acquire()
  local pool = A.pools[arg("pool")]
  if not pool then ngx.say("err nopool"); return end
  local timeout = tonumber(arg("timeout"))
  local tag = arg("tag")
  if tag then record(arg("pool") .. ":asked", tag) end
  local t0 = sched.now()
  local lease, code, detail = pool:acquire(arg("key"), timeout and { timeout = timeout } or nil)
  if not lease then
    ngx.say("err ", tostring(code), " ", tostring(detail))
    return
  end
  A.granted_at[arg("pool")] = sched.now()
  local waited = sched.now() - t0
  if tag then record(arg("pool") .. ":got", tag) end
  local hold = tonumber(arg("hold"))
  if hold then ngx.sleep(hold) end
  local id = type(lease.client) == "table" and lease.client.id or tostring(lease.client)
  if arg("destroy") then lease:release(false) else lease:release() end
  ngx.say(string.format("ok %s waited=%.3f", tostring(id), waited))
end

-- /app/hold_end?pool=P&how=H[&hold=S]: acquire, then end the request while
-- the lease is held (cases/request_end.lua), by how: "raise" (error()),
-- "exit500" (ngx.exit(500)), "exit200" (ngx.say, then ngx.exit(200)),
-- "read_timeout" (a redis BLPOP past a 50 ms read timeout, assert()ed),
-- "ctx_raise" (ngx.ctx = {}, then error()),
-- "sleep" (holds S seconds, for a client abort, /app/hold_abort), "timer"
-- (a timer does it all: acquire, then raise). Sleeps S first when given
-- (the lease held meanwhile).
A.ended_at, A.granted_at = {}, {}
function handlers.hold_end()
  local name, how = arg("pool"), arg("how")
  local pool = A.pools[name]
  if not pool then ngx.say("err nopool"); return end
  local hold = tonumber(arg("hold"))
  local function body()
    local lease, code = pool:acquire()
    if not lease then record(name .. ":hold_end", "err " .. tostring(code)); return end
    record(name .. ":hold_end", "held")
    if how == "sleep" then
      ngx.say("holding")
      ngx.flush(true)
    end
    if hold then ngx.sleep(hold) end
    A.ended_at[name] = sched.now()
    if how == "ctx_raise" then
      ngx.ctx = { replaced = true }
      error("handler failed after replacing ngx.ctx")
    end
    if how == "raise" or how == "timer" then
      error("handler failed while holding a lease")
    elseif how == "exit500" then
      ngx.exit(500)
    elseif how == "exit200" then
      ngx.say("exiting")
      ngx.exit(200)
    elseif how == "read_timeout" then
      local sock = lease.client.sock
      sock:settimeout(50)
      local r, err = harness().command(sock, "BLPOP", "cp-no-such-list", "5")
      assert(r, "BLPOP: " .. tostring(err))
    end
    record(name .. ":hold_end", "returned")   -- not reached
  end
  if how == "timer" then
    assert(ngx.timer.at(0, function() body() end))
    ngx.say("timer started")
    return
  end
  body()
end

-- /app/redis_deadline?pool=P: acquire (the pool's acquire_timeout), PING
-- with the lua-resty-redis object, release; records how long the acquire
-- took and its outcome in A.deadline[P] (cases/setup_backoff.lua reads it).
-- Says "PONG" (200) or "err <code>" (503).
A.deadline = {}
function handlers.redis_deadline()
  local name = arg("pool")
  local pool = A.pools[name]
  if not pool then ngx.say("err nopool"); return end
  local d = A.deadline[name]
  local t0 = sched.now()
  local lease, code = pool:acquire()
  local took = sched.now() - t0
  if took > d.max_acquire then d.max_acquire = took end
  d.outcomes[code or "ok"] = (d.outcomes[code or "ok"] or 0) + 1
  if not lease then
    ngx.status = 503
    ngx.say("err ", tostring(code))
    return
  end
  local r, err = lease.client:ping()
  if r == "PONG" then lease:release() else lease:release(false) end
  ngx.status = r and 200 or 502
  ngx.say(r or ("err ping " .. tostring(err)))
end

-- /app/mark?name=N: A.marks[N] = now() (run.sh marks fault times).
A.marks = {}
function handlers.mark()
  A.marks[arg("name")] = sched.now()
  ngx.say("ok")
end

function handlers.redis_ping()
  local lease = acquire_or_503()
  if not lease then return end
  local sock = lease.client
  local reused = sock:getreusedtimes()
  local r, err = harness().command(sock, "PING")
  if r ~= "PONG" then
    lease:release(false)
    ngx.status = 502
    ngx.say("err ping ", tostring(err))
    return
  end
  local hold = tonumber(arg("hold"))
  if hold then ngx.sleep(hold) end
  lease:release()
  ngx.say("PONG reused=", reused)
end

-- /app/driver_cmd?pool=P[&habit=keepalive|close]: acquire a lua-resty-redis
-- object from a cpngx.driver pool, SET and GET a key through it, then the
-- caller's habit from the bare driver (red:set_keepalive(10000, 100) or
-- red:close()), then release. Says "ok reused=<n> habit=<what it returned>".
local driver_n = 0
function handlers.driver_cmd()
  local lease = acquire_or_503()
  if not lease then return end
  local red = lease.client
  driver_n = driver_n + 1
  local k = "cp-driver:" .. driver_n
  local reused = red:get_reused_times()
  local ok, err = red:set(k, driver_n)
  local v
  if ok then v, err = red:get(k) end
  if tonumber(v) ~= driver_n then
    lease:release(false)
    ngx.status = 502
    ngx.say("err command ", tostring(err or v))
    return
  end
  local habit, r1, r2 = arg("habit"), nil, nil
  if habit == "keepalive" then
    r1, r2 = red:set_keepalive(10000, 100)
  elseif habit == "close" then
    r1, r2 = red:close()
  end
  lease:release()
  ngx.say("ok reused=", reused, " habit=", tostring(r1), " ", tostring(r2))
end

function handlers.http_get()
  local name = arg("pool")
  local pool = A.pools[name]
  if not pool then ngx.say("err nopool"); return end
  local opts
  local od = arg("on_drain")
  if od then
    local grace = od:match("^cancel:(.+)$")
    opts = { on_drain = grace and { cancel = tonumber(grace) } or od }
  end
  local tag = arg("tag")
  if tag then record(name .. ":asked", tag) end
  local t0 = sched.now()
  local lease, code, detail = pool:acquire(nil, opts)
  if not lease then
    ngx.say("err ", tostring(code), " ", tostring(detail))
    return
  end
  local waited = sched.now() - t0
  if tag then record(name .. ":got", tag) end
  -- the lease's cancellation aborts the request: the reader is killed
  local cancel = semaphore.new()
  local cancelled_at
  lease:on_cancel(function()
    cancelled_at = sched.now()
    cancel:post(1)
  end)
  local path = "/upstream/" .. (arg("up") or name) .. (arg("sleep") and ("?sleep=" .. arg("sleep")) or "")
  local reader = ngx.thread.spawn(A.http_request, lease.client, path)
  local canceller = ngx.thread.spawn(function()
    local ok = cancel:wait(60)
    return ok and "cancelled" or "no cancel"
  end)
  local ok, res, err = ngx.thread.wait(reader, canceller)
  if res == "cancelled" then
    ngx.thread.kill(reader)
    lease:release(false)               -- a request cut short: its connection is unusable
    if tag then record(name .. ":done", tag) end
    local started = A.drain_started[name]
    ngx.say(string.format("aborted cancel_after=%.3f", cancelled_at - (started or cancelled_at)))
    return
  end
  ngx.thread.kill(canceller)
  if not ok or type(res) ~= "table" then
    lease:release(false)
    ngx.say("err request ", tostring(ok and err or res))
    return
  end
  lease:observe(res)                   -- the policy reads the response
  lease:release()
  if tag then record(name .. ":done", tag) end
  ngx.say(string.format("status %d conn=%s reqs=%s waited=%.3f", res.status,
    tostring(res.headers["X-Conn"]), tostring(res.headers["X-Conn-Requests"]), waited))
end

function handlers.drain()
  local name = arg("pool")
  local pool = A.pools[name]
  if not pool then ngx.say("err nopool"); return end
  local t0 = sched.now()
  A.drain_started[name] = t0
  local ok, code = pool:drain(tonumber(arg("timeout")))
  record(name .. ":done", "drain")
  ngx.say(string.format("drained %s %s in %.3f", tostring(ok), tostring(code), sched.now() - t0))
end

function handlers.sched_wait()
  local id = arg("id")
  local h, why = sched.current()
  if not h then ngx.say("err ", why); return end
  A.handles[id] = h
  local ok, err = sched.wait(h, sched.now() + (tonumber(arg("timeout")) or 5))
  A.handles[id] = nil
  ngx.say(ok and "woken" or ("err " .. tostring(err)))
end

function handlers.wait_abort()
  local name = arg("pool")
  local pool = A.pools[name]
  ngx.say("waiting")
  ngx.flush(true)
  local lease, code = pool:acquire(nil, { timeout = tonumber(arg("timeout")) or 10 })
  -- reached only if the request was not aborted
  record(name .. ":abort_result", lease and "lease" or tostring(code))
  if lease then lease:release() end
  ngx.say("done")
end

function handlers.sample()
  local name = arg("name")
  local secs = tonumber(arg("secs")) or 1
  local r = assert(harness().redis())
  local max, samples = 0, 0
  local deadline = harness().now() + secs
  while harness().now() < deadline do
    local n = r:clients(name)
    samples = samples + 1
    if n > max then max = n end
    ngx.sleep(0.002)
  end
  r:close()
  ngx.say("max=", max, " samples=", samples)
end

function handlers.configure()
  local pool = A.pools[arg("pool")]
  if not pool then ngx.say("err nopool"); return end
  local opts = {}
  for k, v in pairs(ngx.req.get_uri_args()) do
    if k ~= "pool" then
      if v == "false" then opts[k] = false else opts[k] = tonumber(v) or v end
    end
  end
  local ok, done, code = pcall(pool.configure, pool, opts)
  if not ok then ngx.say("raised ", tostring(done)) elseif done then ngx.say("ok") else ngx.say("err ", code) end
end

function handlers.pool_stats()
  local pool = A.pools[arg("pool")]
  if not pool then ngx.say("err nopool"); return end
  local s = pool:stats()
  ngx.say(string.format("live=%d idle=%d leases=%d waiting=%d opened=%d closed=%d",
    s.live, s.idle, s.leases, s.waiting, s.opened, s.closed))
end

--- /app/<name>
function A.content()
  local name = ngx.var.uri:match("^/app/([%w_]+)$")
  local h = name and handlers[name]
  if not h then
    ngx.status = 404
    ngx.say("no handler")
    return
  end
  h()
end

--- /app/<uri> served by handlers[name] (a location of its own).
function A.content_as(name)
  handlers[name]()
end

--- Runs the probe a spec registered for this location (A.probes[name]) in
-- the current phase; its result goes to the shared dict under name.
function A.phase_probe(phase)
  local name = ngx.var.arg_probe
  local fn = name and A.probes[name]
  if not fn then return "noprobe" end
  local ok, res = pcall(fn, phase)
  local v = ok and tostring(res) or ("error: " .. tostring(res))
  ngx.shared.spec:set(name, v)
  return v
end

--- init_worker: what acquire and try_acquire do there (specs read it).
function A.init_worker()
  local dict = ngx.shared.spec
  local function step(name, fn)
    local ok, v = pcall(fn)
    dict:set("init_worker:" .. name, ok and tostring(v) or ("error: " .. tostring(v)))
  end
  local h, why = sched.current()
  dict:set("init_worker:current", h and "handle" or tostring(why))
  -- a task spawned in init_worker runs in a timer
  step("spawn", function()
    sched.spawn(function() dict:set("init_worker:spawned_phase", ngx.get_phase()) end)
    return "ok"
  end)
  local pool, f = A.plain_pool("init_worker", { max_live = 1 })
  local held
  step("try_acquire", function()
    local l, code = pool:try_acquire()
    held = l
    return l and "lease" or code
  end)
  -- max_live is 1 and held: acquire would have to wait
  step("acquire", function() pool:acquire(); return "returned" end)
  step("release", function() if held then held:release() end; return pool:stats().idle end)
  step("created", function() return f.created end)
  -- the warm floor, as docs/hosts.md's init_worker block starts it (the runner
  -- counts its connections before the first request; cases/floor.lua)
  local floor = require "redis_pool"
  A.pools.floor = floor
  ngx.timer.at(0, function() floor:run() end)
end
return A
