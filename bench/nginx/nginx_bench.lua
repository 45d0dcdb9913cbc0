-- bench/nginx/nginx_bench.lua: the handlers bench/nginx/run.sh calls in its
-- private nginx (content phase; configuration from bench_conf.lua, which
-- run.sh writes into its run dir).
--
--   /b5?n=N&rounds=R[&ping=1]
--       B5: per-operation cost of the full cycle through clientpool.ngx
--       (acquire: unpark = tcp() + connect(pool=); release: park =
--       setkeepalive) against the bare tcp() + connect(pool=) + setkeepalive
--       a handler writes by hand, both on one parked connection to the
--       private redis-server. Each round times N operations of each form in
--       turn (the order rotates); prints one TSV line per figure: name,
--       median ratio to the bare cycle, median ns, median bare ns. ping=1
--       adds a PING round trip to every operation of every form.
--       profile=DIR (bench/nginx/run.sh B5_PROFILE=1): jit.v's trace log of
--       the whole run in DIR/jitv.txt, then each form alone for a second
--       under jit.profile: the share of samples per VM state (compiled,
--       interpreted, C code, GC) and per function, in DIR/jitp-<form>.txt;
--       then, in DIR/diag.txt, ns per op of a plain pool's checkout and
--       lease pairs (the accounting alone), of the same pairs on a pool
--       whose park/unpark hooks do nothing (the accounting of parking), of
--       the bare cycle with getreusedtimes() and of the manager's hooks
--       alone (unpark + park, no pool); then the Lua bytes each of these
--       and each measured form allocates per operation.
--   /b2?n=N&rounds=R
--       B2 in nginx: contended handoff between TASKS light threads
--       (ngx.thread.spawn) of one request sharing one client (max_live = 1):
--       each takes it, gives it back and queues again, so every release
--       hands it to the next waiter. Per handoff, against the same ring of
--       light threads sharing one unit of an ngx.semaphore (wait, post).
--       A reference form runs the ring on the ngx scheduler adapter alone
--       (no pool): its share of a handoff.
--       Each round times N handoffs of each form in turn; prints one TSV
--       line per figure: name, median ratio, median ns, median semaphore ns.
--       profile=DIR: then each form for a second under jit.profile, in
--       DIR/jitp-b2-<form>.txt (B5_PROFILE=1 B5_ROUNDS=0 bench/nginx/run.sh).
--   /b6/cp, /b6/size, /b6/backlog
--       B6: one PING to redis per request, through clientpool.ngx (max_live
--       per worker), through OpenResty's pool_size alone, and through
--       pool_size with backlog (connect waits when pool_size connections of
--       the pool are open in this worker).
--   /b6/fleet, /b6/split  (B6 with 4 workers and a fleet cap: init() in
--       init_by_lua makes the fleet conf.fleet of max_live conf.fleet_cap)
--       through clientpool.ngx on the fleet (the cap machine-wide), and
--       through OpenResty's pool_size + backlog with the cap split by hand
--       (conf.split per worker).
local conf = require "bench_conf"
local clientpool = require "clientpool"
local cpngx = require "clientpool.ngx"

local ngx = ngx
local tcp = ngx.socket.tcp
local monotime
do
  local ok, b = pcall(require, "clientpool.ffi")
  if not ok or type(b) ~= "table" then b = require "clientpool.core" end
  monotime = b.monotime
end

local HOST, PORT = "127.0.0.1", conf.redis_port
local POOL_SIZE = conf.pool_size      -- B6: per worker, for every config
local BACKLOG = conf.backlog

local M = {}

local function ping(sock)
  local ok, err = sock:send("PING\r\n")
  if not ok then return nil, err end
  local line
  line, err = sock:receive("*l")
  if line ~= "+PONG" then return nil, err or line end
  return true
end

---------------------------------------------------------------------------
-- B5
---------------------------------------------------------------------------

-- Pools made at the first /b5 of this worker: the same options as a handler
-- would give (no timeouts, as the bare cycle sets none).
local b5pool, b5mgr, b5opts
local function b5_pool()
  if not b5pool then
    local opts
    opts, b5mgr = cpngx.tcp { host = HOST, port = PORT, max_live = 10 }
    b5pool = clientpool.new(opts)
    b5opts = opts
  end
  return b5pool
end

local BARE_OPTS = { pool = "b5-bare", pool_size = 10 }

local forms = {}

function forms.bare(n, do_ping)
  for _ = 1, n do
    local sock = tcp()
    local ok, err = sock:connect(HOST, PORT, BARE_OPTS)
    if not ok then error("bare connect: " .. tostring(err)) end
    if do_ping then assert(ping(sock)) end
    ok, err = sock:setkeepalive(nil, 10)
    if not ok then error("bare setkeepalive: " .. tostring(err)) end
  end
end

function forms.lease(n, do_ping)
  local pool = b5_pool()
  for _ = 1, n do
    local lease, code, detail = pool:acquire()
    if not lease then error("acquire: " .. tostring(code) .. " " .. tostring(detail)) end
    if do_ping then assert(ping(lease.client)) end
    lease:release()
  end
end

function forms.checkout(n, do_ping)
  local pool = b5_pool()
  for _ = 1, n do
    local sock, h = pool:checkout()
    if not sock then error("checkout: " .. tostring(h)) end
    if do_ping then assert(ping(sock)) end
    pool:checkin(h)
  end
end

local ORDER = { "bare", "lease", "checkout" }

-- Diagnostics for B5_PROFILE: the pool's accounting alone (a plain pool: no
-- hooks, no I/O) and the bare cycle with the getreusedtimes() call the
-- manager makes.
-- (the pools: made after the measured forms, see b5. A loop of its own
-- for each pool, not one shared: LuaJIT records a trace per loop, and the
-- second pool through a loop the first one's trace was recorded for ran
-- 1.5-2x slower than through its own)
local dpool = {}
local diag = {}
function diag.plain_checkout(n)
  local p = dpool.plain
  for _ = 1, n do local _, h = p:checkout(); p:checkin(h) end
end
function diag.plain_lease(n)
  local p = dpool.plain
  for _ = 1, n do local l = p:acquire(); l:release() end
end
function diag.bare_reused(n)
  for _ = 1, n do
    local sock = tcp()
    local ok, err = sock:connect(HOST, PORT, BARE_OPTS)
    if not ok then error("bare connect: " .. tostring(err)) end
    if sock:getreusedtimes() == 0 then error("not reused") end
    ok, err = sock:setkeepalive(nil, 10)
    if not ok then error("bare setkeepalive: " .. tostring(err)) end
  end
end
-- the manager's hooks alone (unpark, park), no pool
function diag.hooks(n)
  local o = b5opts
  for _ = 1, n do o.park(o.unpark(cpngx.PARKED, nil), nil) end
end
-- the accounting of a pool that parks (park/unpark hooks that do nothing)
function diag.park_checkout(n)
  local p = dpool.parking
  for _ = 1, n do local _, h = p:checkout(); p:checkin(h) end
end
function diag.park_lease(n)
  local p = dpool.parking
  for _ = 1, n do local l = p:acquire(); l:release() end
end
local DIAG = { "bare_reused", "plain_checkout", "plain_lease", "park_checkout", "park_lease", "hooks" }

-- Lua bytes fn(n) allocates per operation, the collector stopped.
local function bytes_per(fn)
  fn(1000)
  collectgarbage("collect")
  collectgarbage("stop")
  local c0 = collectgarbage("count")
  fn(1000)
  local c1 = collectgarbage("count")
  collectgarbage("restart")
  return (c1 - c0) * 1024 / 1000
end

local function median(t)
  local s = {}
  for i = 1, #t do s[i] = t[i] end
  table.sort(s)
  local m = #s
  if m % 2 == 1 then return s[(m + 1) / 2] end
  return (s[m / 2] + s[m / 2 + 1]) / 2
end

local function time(fn, n, do_ping)
  local t0 = monotime()
  fn(n, do_ping)
  return (monotime() - t0) / n * 1e9
end

local VMSTATE = { N = "compiled", I = "interpreted", C = "C code", G = "garbage collector", J = "JIT compiler" }

-- Runs fn for a second under LuaJIT's sampling profiler (jit.profile)
-- and writes the share of samples per VM state, and per function and state.
function M.jit_profile(name, fn, do_ping, file)
  local profile = require "jit.profile"
  local states, funcs, total = {}, {}, 0
  collectgarbage("collect")
  profile.start("fi1", function(th, samples, vmstate)
    total = total + samples
    states[vmstate] = (states[vmstate] or 0) + samples
    local where = profile.dumpstack(th, "F", 1) .. " [" .. (VMSTATE[vmstate] or vmstate) .. "]"
    funcs[where] = (funcs[where] or 0) + samples
  end)
  local t_end = monotime() + 1
  repeat fn(1000, do_ping) until monotime() > t_end
  profile.stop()
  local out = assert(io.open(file, "w"))
  local function top(t, limit)
    local list = {}
    for k, v in pairs(t) do list[#list + 1] = { k, v } end
    table.sort(list, function(a, b) return a[2] > b[2] end)
    for i = 1, math.min(limit, #list) do
      out:write(string.format("%5.1f%%  %s\n", 100 * list[i][2] / total, VMSTATE[list[i][1]] or list[i][1]))
    end
  end
  out:write(string.format("%s: %d samples by VM state\n", name, total))
  top(states, 5)
  out:write("by function (innermost) and VM state\n")
  top(funcs, 15)
  out:close()
end

function M.b5()
  local n = tonumber(ngx.var.arg_n) or 20000
  local rounds = tonumber(ngx.var.arg_rounds) or 15
  local do_ping = ngx.var.arg_ping == "1"
  local suffix = do_ping and ".ping" or ""
  local profile = ngx.var.arg_profile
  if profile then require("jit.v").on(profile .. "/jitv.txt") end
  -- warm up: one connection parked in each pool, traces recorded
  for _, f in ipairs(ORDER) do forms[f](math.max(1, math.floor(n / 10)), do_ping) end
  local ns, ratio = {}, {}
  for _, f in ipairs(ORDER) do ns[f], ratio[f] = {}, {} end
  for r = 1, rounds do
    collectgarbage("collect")
    local this = {}
    for i = 0, #ORDER - 1 do
      local f = ORDER[(r + i - 1) % #ORDER + 1]
      this[f] = time(forms[f], n, do_ping)
    end
    for _, f in ipairs(ORDER) do
      ns[f][r] = this[f]
      ratio[f][r] = this[f] / this.bare
    end
  end
  if profile then
    require("jit.v").off()
    for _, f in ipairs(ORDER) do M.jit_profile(f, forms[f], do_ping, profile .. "/jitp-" .. f .. ".txt") end
    -- after the measured forms, so their traces formed without these
    dpool.plain = clientpool.new { create = function() return {} end, destroy = function() end, max_live = 10 }
    local stored = {}
    dpool.parking = clientpool.new { create = function() return {} end, destroy = function() end, max_live = 10,
                                     park = function() return stored end, unpark = function() return stored end }
    local out = assert(io.open(profile .. "/diag.txt", "w"))
    for _, f in ipairs(DIAG) do
      diag[f](n)
      local t = {}
      for r = 1, 7 do t[r] = time(diag[f], n) end
      out:write(string.format("%-15s %7.1f ns/op (median of 7 x %d)\n", f, median(t), n))
    end
    for _, f in ipairs(DIAG) do out:write(string.format("%-15s %7.1f B/op\n", f, bytes_per(diag[f]))) end
    for _, f in ipairs(ORDER) do out:write(string.format("%-15s %7.1f B/op\n", f, bytes_per(forms[f]))) end
    out:close()
  end
  local s, m = b5pool:stats(), b5mgr.stats
  for _, f in ipairs({ "lease", "checkout" }) do
    ngx.say(string.format("B5.%s%s\t%.4f\t%.1f\t%.1f", f, suffix, median(ratio[f]), median(ns[f]),
      median(ns.bare)))
  end
  ngx.say(string.format("# clientpool.ngx: live=%d idle=%d connects=%d reuses=%d lost=%d", s.live, s.idle,
    m.connects, m.reuses, m.lost))
end

---------------------------------------------------------------------------
-- B2 in nginx
---------------------------------------------------------------------------

local B2_TASKS = 100

-- Runs TASKS light threads of this request, each doing `per` rounds of
-- take(), (the first holder yields once, so every other thread queues) and
-- give(); waits for all of them. From the first give on, each give is a
-- handoff to the longest waiter.
local function b2_ring(per, take, give)
  local first = true
  local threads = {}
  for i = 1, B2_TASKS do
    threads[i] = ngx.thread.spawn(function()
      for _ = 1, per do
        local h = take()
        if first then first = false; ngx.sleep(0) end
        give(h)
      end
    end)
  end
  for i = 1, B2_TASKS do
    local ok, err = ngx.thread.wait(threads[i])
    if not ok then error("b2 thread: " .. tostring(err)) end
  end
end

local b2forms = {}

function b2forms.sema(per)
  local sema = assert(require("ngx.semaphore").new(1))
  b2_ring(per, function()
    local ok, err = sema:wait(60)
    if not ok then error("sema:wait: " .. tostring(err)) end
  end, function() sema:post(1) end)
end

local function b2_pool(per, form)
  local pool = clientpool.new { max_live = 1, max_waiting = B2_TASKS, acquire_timeout = 60,
                                create = function() return {} end }
  if form == "lease" then
    b2_ring(per, function()
      local lease, code, detail = pool:acquire()
      if not lease then error("acquire: " .. tostring(code) .. " " .. tostring(detail)) end
      return lease
    end, function(lease) lease:release() end)
  else
    b2_ring(per, function()
      local client, h = pool:checkout()
      if not client then error("checkout: " .. tostring(h)) end
      return h
    end, function(h) pool:checkin(h) end)
  end
  local s = pool:stats()
  if s.wait_count < per * B2_TASKS - B2_TASKS then error("not a handoff per pair: " .. s.wait_count) end
  pool:close()
end
function b2forms.lease(per) return b2_pool(per, "lease") end
function b2forms.checkout(per) return b2_pool(per, "checkout") end

-- (reference) the ngx scheduler adapter alone, no pool: a ring of TASKS
-- light threads, each waiting on a handle of its own and waking the next
-- (current, wait, wake and done per handoff, as the pool's wait uses them)
function b2forms.sched(per)
  local sched = require "clientpool.sched.ngx"
  local handles, threads = {}, {}
  for i = 1, B2_TASKS do
    threads[i] = ngx.thread.spawn(function()
      for _ = 1, per do
        local h = sched.current()
        handles[i] = h
        local ok, err = sched.wait(h, nil)
        if not ok then error("sched.wait: " .. tostring(err)) end
        sched.done(h)
        local nxt = handles[i % B2_TASKS + 1]
        handles[i % B2_TASKS + 1] = nil
        if nxt then sched.wake(nxt) end   -- (none after the next one's last round)
      end
    end)
  end
  local h1 = handles[1]
  handles[1] = nil
  sched.wake(h1)
  for i = 1, B2_TASKS do
    local ok, err = ngx.thread.wait(threads[i])
    if not ok then error("b2 thread: " .. tostring(err)) end
  end
end

local B2_ORDER = { "sema", "lease", "checkout", "sched" }

function M.b2()
  local n = tonumber(ngx.var.arg_n) or 20000
  local rounds = tonumber(ngx.var.arg_rounds) or 15
  local per = math.ceil(n / B2_TASKS)
  if ngx.var.arg_profile then require("jit.v").on(ngx.var.arg_profile .. "/jitv-b2.txt") end
  for _, f in ipairs(B2_ORDER) do b2forms[f](math.max(1, math.floor(per / 10))) end   -- warm up
  local ns, ratio = {}, {}
  for _, f in ipairs(B2_ORDER) do ns[f], ratio[f] = {}, {} end
  for r = 1, rounds do
    local this = {}
    for i = 0, #B2_ORDER - 1 do
      local f = B2_ORDER[(r + i - 1) % #B2_ORDER + 1]
      -- each form starts on a clean heap: none pays for the garbage of the one before
      collectgarbage("collect")
      local t0 = monotime()
      b2forms[f](per)
      this[f] = (monotime() - t0) / (per * B2_TASKS) * 1e9
    end
    for _, f in ipairs(B2_ORDER) do
      ns[f][r] = this[f]
      ratio[f][r] = this[f] / this.sema
    end
  end
  local profile = ngx.var.arg_profile
  if profile then
    require("jit.v").off()
    for _, f in ipairs(B2_ORDER) do
      M.jit_profile("b2 " .. f, function() b2forms[f](1000) end, nil, profile .. "/jitp-b2-" .. f .. ".txt")
    end
  end
  for _, f in ipairs({ "lease", "checkout", "sched" }) do
    ngx.say(string.format("B2.ngx.%s\t%.4f\t%.1f\t%.1f", f, median(ratio[f]), median(ns[f]), median(ns.sema)))
  end
end

---------------------------------------------------------------------------
-- B6
---------------------------------------------------------------------------

local b6pool
local function b6_pool()
  if not b6pool then
    b6pool = clientpool.new(cpngx.tcp {
      host = HOST, port = PORT, connect_timeout = 1, read_timeout = 5,
      max_live = POOL_SIZE, idle_timeout = 60, acquire_timeout = 10, max_waiting = 4096,
    })
  end
  return b6pool
end

-- B6 with 4 workers: the fleet, made by the master before it forks
function M.init()
  if conf.fleet then require("clientpool.fleet").new(conf.fleet, { max_live = conf.fleet_cap }) end
end

local b6fleet
local function b6_fleet_pool()
  if not b6fleet then
    b6fleet = clientpool.new(cpngx.tcp {
      host = HOST, port = PORT, connect_timeout = 1, read_timeout = 5,
      fleet = conf.fleet, idle_timeout = 60, acquire_timeout = 10, max_waiting = 4096,
    })
  end
  return b6fleet
end

local function fail(status, msg)
  ngx.status = status
  ngx.say(msg)
end

local function b6_through(pool)
  local lease, code, detail = pool:acquire()
  if not lease then return fail(503, "acquire: " .. tostring(code) .. " " .. tostring(detail)) end
  local ok, err = ping(lease.client)
  if not ok then
    lease:release(false)
    return fail(502, "ping: " .. tostring(err))
  end
  lease:release()
  ngx.say("PONG")
end

function M.b6_cp() return b6_through(b6_pool()) end
function M.b6_fleet() return b6_through(b6_fleet_pool()) end

local SIZE_OPTS = { pool = "b6-size", pool_size = POOL_SIZE }
local BACKLOG_OPTS = { pool = "b6-backlog", pool_size = POOL_SIZE, backlog = BACKLOG }
local SPLIT_OPTS = { pool = "b6-split", pool_size = conf.split or 1, backlog = BACKLOG }

local function bare(opts)
  local sock = tcp()
  sock:settimeouts(1000, 5000, 5000)
  local ok, err = sock:connect(HOST, PORT, opts)
  if not ok then return fail(503, "connect: " .. tostring(err)) end
  ok, err = ping(sock)
  if not ok then
    sock:close()
    return fail(502, "ping: " .. tostring(err))
  end
  sock:setkeepalive(60000, opts.pool_size)
  ngx.say("PONG")
end

function M.b6_size() return bare(SIZE_OPTS) end
function M.b6_backlog() return bare(BACKLOG_OPTS) end
function M.b6_split() return bare(SPLIT_OPTS) end

return M
