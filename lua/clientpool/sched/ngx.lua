--- clientpool.sched.ngx: the scheduler adapter for OpenResty (lua-nginx-module).
--
-- The adapter contract is in docs/design.md ("The scheduler adapter
-- contract"); the choices made for nginx are in docs/decisions.md
-- ("OpenResty"). In short:
--
-- * current() returns a fresh handle in the phases where a light thread can
--   yield (rewrite, server_rewrite, access, content, timer, ssl_cert,
--   ssl_session_fetch, ssl_client_hello) and `nil, "cannot wait in the <phase>
--   phase"` elsewhere, so the driver's error names the phase.
-- * A handle waits on an ngx.semaphore. Semaphores are recycled through a free
--   list: a handle gives its semaphore back when the garbage collector takes
--   the handle (nothing refers to it any more, so nothing can wake it), when
--   done(handle) says so (the driver calls it when an acquire's wait ends),
--   or when its waiter is found gone. A wait/wake cycle
--   allocates no semaphore; current() allocates one small table, or none:
--   done() keeps the handle's table for a later current().
-- * wake() posts the semaphore and remembers it (`pending`), so a wake that
--   comes before the wait, or while a wait times out, is not lost. It returns
--   false when the waiter left the semaphore's queue without returning from
--   wait(): ngx.thread.kill or the end of its request (client abort with
--   lua_check_client_abort, ngx.exit in another thread) ran the semaphore's
--   cleanup. sema:count() is resources minus queued waiters, so that state is
--   exact, not a guess from coroutine identities (ngx_lua reuses coroutines
--   across requests, so coroutine.status cannot tell).
-- * A waiter killed after its wake was posted but before it resumed (the
--   post is delivered by a posted event, later in the same event-loop turn)
--   cannot be reported by wake(): wake(h, lost, ...) takes an optional
--   callback that is called as lost(...) once that is detected (a check runs
--   from an ngx.timer once per batch of wakes), so the driver can give the
--   grant back.
-- * now() is the CLOCK_MONOTONIC clock of the C module (monotonic = true):
--   ngx.now() is the cached wall clock, which steps with NTP and is only
--   refreshed once per event-loop turn.
-- * spawn(fn, ...) starts fn at once in a light thread (ngx.thread.spawn) in
--   request phases and user timers, because a cosocket belongs to the
--   request (or timer) that made it: a destroy hook that closes a released
--   client must run there. In the pool's background tasks (long-lived: a
--   light thread leaves a record in its timer until the timer ends) and in
--   phases without light threads (log, header_filter, body_filter, set,
--   init_worker, ...), it uses ngx.timer.at(0). If no timer can be made (too many pending timers),
--   fn runs at once in a protected call.
-- * background(fn, ...) runs fn in ngx.timer.at(0): the task outlives the
--   request that started it.
-- * An exiting worker (HUP, QUIT) is kept alive by nginx while a timer
--   waits, up to the wait's deadline (a pool's timer task may wait for an
--   idle_timeout of minutes). So waits and sleeps in the timer phase go in
--   slices of at most a second and raise "clientpool.sched.ngx: worker
--   exiting" once the worker exits; the driver logs that (at info level:
--   log() demotes it). Requests wait as usual: nginx finishes them anyway.
-- * sleep(s) = ngx.sleep, continued until s passed by the monotonic clock;
--   sleep(0) is a turn (woken tasks run first), see sleep().
-- * log = ngx.log(ngx.ERR, ...).
local ngx = ngx
local semaphore = require "ngx.semaphore"

local type, error, pcall, tostring, select, setmetatable = type, error, pcall, tostring, select, setmetatable
local math_ceil = math.ceil
local co_running = coroutine.running
local unpack = table.unpack or unpack

local get_phase = ngx.get_phase
local thread_spawn = ngx.thread.spawn
local timer_at = ngx.timer.at
local ngx_sleep = ngx.sleep
local ngx_log, ERR, INFO = ngx.log, ngx.ERR, ngx.INFO
local worker_exiting = ngx.worker.exiting

local monotime
do
  local ok, b = pcall(require, "clientpool.ffi")
  if not ok or type(b) ~= "table" or type(b.monotime) ~= "function" then b = require "clientpool.core" end
  monotime = b.monotime
end

local M = { _NAME = "clientpool.sched.ngx", monotonic = true }

-- Phases in which a light thread may yield (ngx.semaphore:wait works there).
local WAITABLE = {
  rewrite = true, server_rewrite = true, access = true, content = true, timer = true,
  ssl_cert = true, ssl_session_fetch = true, ssl_client_hello = true,
}
-- Phases in which ngx.thread.spawn works and a request (not a timer) runs.
local REQUEST = {
  rewrite = true, server_rewrite = true, access = true, content = true,
  ssl_cert = true, ssl_session_fetch = true, ssl_client_hello = true,
}

-- The error a background task's wait raises in an exiting worker. log()
-- reports messages that carry it at info level.
local EXITING = "clientpool.sched.ngx: worker exiting"
M.EXITING = EXITING

-- One semaphore wait at most this long; longer waits loop (the C side takes
-- an int of milliseconds).
local MAX_WAIT = 86400
-- Longest slice of a wait or sleep in a timer (see wait()).
local TIMER_SLICE = 1

---------------------------------------------------------------------------
-- Semaphore slots and handles
---------------------------------------------------------------------------

-- handle.st
local HELD, WAITING, DEAD = 1, 2, 3

-- Slot i: S[i] the semaphore (kept for good), H[i] the handle using it
-- (weak: a handle nobody refers to is collected, and its slot is free).
local S = {}
local H = setmetatable({}, { __mode = "v" })
local nslots = 0
local free, nfree = {}, 0
local isfree = {}                 -- isfree[i]: slot i is on the free list
local sweep_at = 32               -- sweep when this many slots exist and none is free
-- Handle tables given back by done(), for current() to reuse.
local hfree, nhfree, HFREE_MAX = {}, 0, 256
local lost_count = 0              -- grants reported lost (diagnostics)
local wakes_refused = 0           -- wake() returned false (diagnostics)

local function release_slot(i)
  H[i] = nil
  if not isfree[i] then
    isfree[i] = true
    nfree = nfree + 1
    free[nfree] = i
  end
end

-- Ends a handle for good: later wakes return false, its slot is free.
local function retire(h)
  if h.st == DEAD then return end
  h.st = DEAD
  local i = h.i
  if H[i] == h then release_slot(i) end
end

-- The waiter of h (inside wait()) left the semaphore's queue without
-- returning: killed or its request finished. count() = resources - queued.
local function gone(h)
  return h.st == WAITING and S[h.i]:count() > (h.pending and 0 or -1)
end

-- Reports a grant that a woken-then-killed waiter took with it.
local function report_lost(h)
  local fn = h.lost
  lost_count = lost_count + 1
  if fn then
    local a, b, c = h.la, h.lb, h.lc
    h.lost, h.la, h.lb, h.lc = nil, nil, nil, nil
    local ok, err = pcall(fn, a, b, c)
    if not ok then ngx_log(ERR, "clientpool: lost-wake callback failed: ", tostring(err)) end
  else
    ngx_log(ERR, "clientpool: a waiter was killed after it was woken and before it ran; ",
            "its grant could not be given back (the driver passed no lost-wake callback)")
  end
end

local function sweep()
  local used = 0
  for i = 1, nslots do
    if not isfree[i] then
      local h = H[i]
      if h == nil then
        release_slot(i)
      elseif gone(h) then
        local had = h.pending
        retire(h)
        if had then report_lost(h) end
      else
        used = used + 1
      end
    end
  end
  sweep_at = used * 2
  if sweep_at < 32 then sweep_at = 32 end
end

-- A free slot with an empty semaphore. Runs where waiting is possible, so
-- leftover resources (a post that came after its waiter was gone) can be
-- taken with wait(0), which returns at once.
local function take_slot()
  if nfree == 0 and nslots >= sweep_at then sweep() end
  local i
  if nfree > 0 then
    i = free[nfree]
    free[nfree] = nil
    nfree = nfree - 1
    isfree[i] = nil
    local s = S[i]
    local c = s:count()
    while c > 0 do
      s:wait(0)
      c = c - 1
    end
  else
    local s, err = semaphore.new(0)
    if not s then error("clientpool.sched.ngx: cannot make a semaphore: " .. tostring(err), 0) end
    nslots = nslots + 1
    i = nslots
    S[i] = s
  end
  return i
end

---------------------------------------------------------------------------
-- Lost-wake watch: handles woken with a callback, checked after the
-- semaphores' posted events ran.
---------------------------------------------------------------------------

local watch, nwatch = {}, 0
local watch_armed = false

-- Takes h off the watch (its waiter resumed, or it was reported): the
-- last entry moves into its place. Keeps the watch as long as the wakes
-- still on their way, however many handoffs one event-loop turn runs.
local function unwatch(h)
  local i = h.wi
  h.wi = false
  local last = watch[nwatch]
  watch[nwatch] = nil
  nwatch = nwatch - 1
  if last ~= h then
    watch[i] = last
    last.wi = i
  end
end

-- Reports the watched handles whose waiter died between its wake and its
-- resumption; drops the ones that resumed.
local function run_watch()
  local i = 1
  while i <= nwatch do
    local h = watch[i]
    if h.st ~= DEAD and h.pending and h.lost and not gone(h) then
      i = i + 1                     -- still on its way: checked again
    else
      unwatch(h)                    -- the last entry moved to i: look at it next
      if h.st ~= DEAD and h.pending and h.lost then
        retire(h)
        report_lost(h)
      end
    end
  end
end
-- The first check runs at the next timer turn. A waiter still queued then
-- (its posted event has not run: a zero timer armed from inside a timer
-- handler fires in the same expiry loop, before posted events) is checked
-- again a millisecond later; a zero delay there would spin in that loop.
local arm_watch
local function watch_timer(premature) -- luacheck: ignore premature
  watch_armed = false
  run_watch()
  if nwatch > 0 then arm_watch(0.001) end
end

arm_watch = function(delay)
  if watch_armed then return end
  local ok = timer_at(delay or 0, watch_timer)
  if ok then watch_armed = true end
end

local bg_cos = setmetatable({}, { __mode = "k" }) -- coroutines running a background task

---------------------------------------------------------------------------
-- The adapter
---------------------------------------------------------------------------

--- Monotonic seconds (clientpool's CLOCK_MONOTONIC clock, not ngx.now()).
M.now = monotime

--- A handle for the running light thread, or nil, "cannot wait in the <phase>
-- phase".
function M.current()
  local phase = get_phase()
  if not WAITABLE[phase] then return nil, "cannot wait in the " .. phase .. " phase" end
  if nwatch > 0 and not watch_armed then run_watch() end
  local i = take_slot()
  local h
  if nhfree > 0 then
    h = hfree[nhfree]
    hfree[nhfree] = nil
    nhfree = nhfree - 1
    h.i, h.st, h.pending, h.tm = i, HELD, false, phase == "timer"
  else
    h = { i = i, st = HELD, pending = false, tm = phase == "timer",
          lost = nil, la = nil, lb = nil, lc = nil, wi = false }
  end
  H[i] = h
  return h
end

--- Whether the running code can yield (wait, connect, sleep) in this phase.
-- The driver runs try_acquire's grant in place where it cannot: there
-- OpenResty also refuses its coroutine API.
function M.yieldable()
  return WAITABLE[get_phase()] == true
end

-- Takes the one pending post of h.
local function consume(h)
  h.pending = false
  h.lost = nil
  if h.wi then unwatch(h) end
  S[h.i]:wait(0)
  return true
end

-- Ends a wait in a timer of an exiting worker with EXITING. The handle dies
-- first: the waiter's frames are gone once the error passes, so a later
-- wake must return false (the driver then gives the grant back) rather
-- than post to nobody.
local function exit_wait(h)
  retire(h)
  error(EXITING, 0)
end

-- One semaphore wait of h, at most a slice (TIMER_SLICE in a timer,
-- MAX_WAIT elsewhere) and never past the deadline. Returns true (woken),
-- nil, err (the deadline passed, or the semaphore failed) or false: the
-- slice ended, wait again.
local function wait_slice(h, s, deadline, tm)
  local secs = tm and TIMER_SLICE or MAX_WAIT
  if deadline then
    local rem = deadline - monotime()
    if rem <= 0 then return nil, "timeout" end
    -- whole milliseconds, rounded up: a wait never ends before the deadline
    if rem < secs then secs = math_ceil(rem * 1000) / 1000 end
  end
  h.st = WAITING
  local ok, err = s:wait(secs)
  h.st = HELD
  if ok then
    h.pending = false
    h.lost = nil
    if h.wi then unwatch(h) end
    return true
  end
  if err ~= "timeout" then return nil, err end
  -- a post that came as the wait timed out is still there: take it
  if h.pending then return consume(h) end
  if tm and worker_exiting() then exit_wait(h) end
  return false
end

-- The rest of a wait whose first slice ended. A loop of its own, out of
-- M.wait: LuaJIT gives up a trace that meets a loop it did not start at
-- ("inner loop in root trace"), so a loop on the path of every wait would
-- leave the driver's handoff to the interpreter.
local function wait_on(h, s, deadline, tm)
  while true do
    local ok, err = wait_slice(h, s, deadline, tm)
    if ok ~= false then return ok, err end
  end
end

--- Suspends until wake(h) or the absolute deadline (now() seconds; nil =
-- none). Returns true when woken (or spuriously), nil, "timeout" at the
-- deadline.
function M.wait(h, deadline)
  local st = h.st
  if st == DEAD then return nil, "dead handle" end
  if st == WAITING then error("clientpool.sched.ngx: wait: the handle is already waiting", 2) end
  if h.pending then return consume(h) end
  -- In a timer, nginx keeps an exiting worker alive while a wait lasts: such
  -- waits go in slices of at most TIMER_SLICE and end with EXITING.
  local tm = h.tm
  if tm and worker_exiting() then exit_wait(h) end
  local s = S[h.i]
  local ok, err = wait_slice(h, s, deadline, tm)
  if ok == false then return wait_on(h, s, deadline, tm) end
  return ok, err
end

-- Puts h (a waiting handle whose post is on its way) on the lost-wake
-- watch with the callback lost(a, b, c).
local function watch_lost(h, lost, a, b, c)
  h.lost, h.la, h.lb, h.lc = lost, a, b, c
  if not h.wi then
    nwatch = nwatch + 1
    watch[nwatch] = h
    h.wi = nwatch
  end
  arm_watch()
end

--- Wakes the waiter of h (at once if it waits, at its next wait otherwise).
-- Returns false when the waiter is gone (killed, or its request ended). With
-- lost, lost(a, b, c) is called later if the waiter dies before it resumes.
function M.wake(h, lost, a, b, c)
  local st = h.st
  if st == DEAD then
    wakes_refused = wakes_refused + 1
    return false
  end
  if h.pending then
    -- posted already, by a wake without a callback (a cancel token's): the
    -- grant's callback still counts, should the waiter die before it runs
    if lost and st == WAITING and not h.lost then watch_lost(h, lost, a, b, c) end
    return true
  end
  if st == WAITING and S[h.i]:count() >= 0 then
    retire(h)
    wakes_refused = wakes_refused + 1
    return false
  end
  h.pending = true
  S[h.i]:post(1)
  if lost and st == WAITING then watch_lost(h, lost, a, b, c) end
  return true
end

--- Whether the waiter of h can still run: false once its light thread was
-- killed or its request ended while it waited (and no wake is on its way,
-- which the lost-wake watch covers). The driver asks when it counts its
-- waiters, so the dead ones give their max_waiting slots back.
function M.alive(h)
  if h.st == DEAD then return false end
  if h.st == WAITING and not h.pending and S[h.i]:count() >= 0 then
    retire(h)
    return false
  end
  return true
end

--- Whether the worker is exiting (reload, quit): the driver then schedules
-- nothing from finalizers.
M.exiting = worker_exiting

--- Gives h's semaphore back at once (optional; without it the garbage
-- collector does). The handle must not be used again: its table is kept
-- for a later current() (a wait allocates no table then).
function M.done(h)
  if h.st == HELD then
    retire(h)
    -- (off the watch, no callback: nothing of the adapter refers to it)
    if not h.wi and nhfree < HFREE_MAX then
      h.lost, h.la, h.lb, h.lc = nil, nil, nil, nil
      nhfree = nhfree + 1
      hfree[nhfree] = h
    end
  end
end

local function log_task_error(err)
  local msg = tostring(err)
  if msg:find(EXITING, 1, true) then
    ngx_log(INFO, "clientpool: ", msg)
  else
    ngx_log(ERR, "clientpool: task failed: ", msg)
  end
end

local function run_protected(fn, ...)
  local ok, err = pcall(fn, ...)
  if not ok then log_task_error(err) end
end

local function timer_task(premature, fn, ...) -- luacheck: ignore premature
  return run_protected(fn, ...)
end

local function bg_task(premature, fn, ...)
  if premature then return end -- the worker is exiting: a background task has nothing left to do
  local co = co_running()
  bg_cos[co] = true
  local ok, err = pcall(fn, ...)
  bg_cos[co] = nil
  if not ok then log_task_error(err) end
end

-- Background tasks that could not get a timer (too many pending timers):
-- retried at the next spawn/background/wake that can make one.
local deferred, ndeferred = {}, 0

local function retry_deferred()
  local list, n = deferred, ndeferred
  deferred, ndeferred = {}, 0
  for i = 1, n do
    local t = list[i]
    local ok = timer_at(0, bg_task, t[1], unpack(t, 2, t.n))
    if not ok then
      ndeferred = ndeferred + 1
      deferred[ndeferred] = t
    end
  end
end

--- Runs fn(...) in a new task: at once in a light thread of the current
-- request (request phases), else in ngx.timer.at(0).
function M.spawn(fn, ...)
  if type(fn) ~= "function" then error("clientpool.sched.ngx: spawn expects a function", 2) end
  local phase = get_phase()
  if REQUEST[phase] or (phase == "timer" and not bg_cos[co_running()]) then
    local ok, t = pcall(thread_spawn, run_protected, fn, ...)
    if ok and t then return t end
  end
  if phase ~= "init" then
    local ok = timer_at(0, timer_task, fn, ...)
    if ok then return true end
  end
  run_protected(fn, ...)
  return true
end

--- Runs fn(...) in ngx.timer.at(0): a task that outlives the request.
function M.background(fn, ...)
  if type(fn) ~= "function" then error("clientpool.sched.ngx: background expects a function", 2) end
  if ndeferred > 0 then retry_deferred() end
  local ok, err = timer_at(0, bg_task, fn, ...)
  if ok then return true end
  if err == "process exiting" then return nil, err end
  ngx_log(ERR, "clientpool: cannot start a background task (", tostring(err), "); retrying later")
  ndeferred = ndeferred + 1
  deferred[ndeferred] = { n = select("#", ...) + 1, fn, ... }
  return nil, err
end

--- ngx.sleep; in a timer, in slices that end with EXITING when the worker
-- exits (see wait()).
local function wake_task(premature, h) -- luacheck: ignore premature
  M.wake(h)
end

function M.sleep(s)
  if s <= 0 then
    -- A turn: the tasks that wakes made ready run first. ngx.sleep(0) on
    -- nginx without OpenResty's posted-delayed-events patch is a zero timer,
    -- which runs before the posted events (the semaphore wakes) of the
    -- current turn when armed from a timer handler. A zero timer that posts
    -- this task's semaphore queues it behind them in both cases.
    local h = M.current()
    if h and timer_at(0, wake_task, h) then
      M.wait(h, nil)
      retire(h)
      return
    end
    return ngx_sleep(0.001)
  end
  -- nginx's timers count from its cached clock, so a sleep can end a little
  -- early by the monotonic clock: sleep on until s really passed
  local deadline = monotime() + s
  local tm = get_phase() == "timer"
  while true do
    if tm and worker_exiting() then error(EXITING, 0) end
    local rem = deadline - monotime()
    if rem <= 0 then return end
    local secs = math_ceil(rem * 1000) / 1000
    if tm and secs > TIMER_SLICE then secs = TIMER_SLICE end
    ngx_sleep(secs)
  end
end

--- Reports listener and hook errors in nginx's error log.
function M.log(msg)
  msg = tostring(msg)
  if msg:find("worker exiting", 1, true) then
    ngx_log(INFO, "clientpool: ", msg)
  else
    ngx_log(ERR, "clientpool: ", msg)
  end
end

---------------------------------------------------------------------------
-- Request liveness: the owner of a lease (issue 12, docs/decisions.md
-- "OpenResty: a lease ends with its request")
---------------------------------------------------------------------------
-- A lease still held when the request (or timer) that acquired it ends is
-- given back by the driver (clientpool.owners). What tells "that request
-- ended": lua-resty-core keeps every request's ngx.ctx table in the
-- registry's ngx_lua_ctx_tables at the request's ctx ref, and ngx_lua's
-- cleanup unrefs it when the request is freed (the slot then holds a
-- free-list integer, or the ctx of a later request that got the ref).
-- Coroutines cannot tell: ngx_lua recycles them across requests. So the
-- owner is (ref, ctx) and it is alive while ctxs[ref] is still ctx.
-- `ngx.ctx = t` replaces the table under the same ref: a wrapped setter
-- records old -> new (weak keys) so such a request stays alive.

-- Phases with a request ctx that is not the SSL handshake's (whose ctx
-- ref is kept apart): an owner is known there.
local OWNED = {
  rewrite = true, server_rewrite = true, access = true, content = true, timer = true,
  log = true, header_filter = true, body_filter = true, set = true, balancer = true,
}

local get_ctx_ref, get_request, ctxs
local moved = setmetatable({}, { __mode = "k" })   -- ctx replaced by ngx.ctx = t: old -> new
local tracked = setmetatable({}, { __mode = "k" }) -- ctx tables handed out by owner()
do
  local ok = pcall(function()
    local ffi = require "ffi"
    require "resty.core.ctx"                 -- declares ngx_http_lua_ffi_get_ctx_ref
    local fn = ffi.C.ngx_http_lua_ffi_get_ctx_ref
    local base = require "resty.core.base"
    local in_ssl, ssl_ref = ffi.new("int[1]"), ffi.new("int[1]")
    get_request = base.get_request
    get_ctx_ref = function(r) return fn(r, in_ssl, ssl_ref) end
    ctxs = debug.getregistry().ngx_lua_ctx_tables
  end)
  if not ok or type(ctxs) ~= "table" then get_ctx_ref, ctxs = nil, nil end
  -- the ctx setter, wrapped (found through the registration function's
  -- upvalue: resty.core.misc keeps the setters in a local table)
  if ctxs then
    local misc = require "resty.core.misc"
    local setters
    local getupvalue = debug.getupvalue
    for i = 1, 8 do
      local name, v = getupvalue(misc.register_ngx_magic_key_setter, i)
      if name == nil then break end
      if name == "ngx_magic_key_setters" then setters = v end
    end
    local orig = setters and setters.ctx
    if type(orig) == "function" then
      misc.register_ngx_magic_key_setter("ctx", function(new)
        local r = get_request()
        local old
        if r then
          local ref = get_ctx_ref(r)
          if ref > 0 then old = ctxs[ref] end
        end
        orig(new)
        if old ~= nil and tracked[old] and old ~= new then
          moved[old] = new
          tracked[new] = true
        end
      end)
    else
      -- without the wrapper, a replaced ngx.ctx would read as an ended
      -- request: no owners at all rather than wrong ones
      get_ctx_ref, ctxs = nil, nil
    end
  end
end

--- The owner of leases acquired now: the running request or timer, as
-- two values (its ctx ref and ctx table), or nil where there is none
-- (init_worker, SSL phases) or lua-resty-core is missing. Makes the
-- request's ngx.ctx table if it had none (one small table).
function M.owner()
  if not ctxs or not OWNED[get_phase()] then return nil end
  local r = get_request()
  if not r then return nil end
  -- the ctx the request has (no getter call: two FFI calls fewer), else
  -- made by the getter
  local ref = get_ctx_ref(r)
  local ctx
  if ref > 0 then ctx = ctxs[ref] end
  if type(ctx) ~= "table" then
    ctx = ngx.ctx
    ref = get_ctx_ref(r)
    if ref <= 0 or ctxs[ref] ~= ctx then return nil end
  end
  if not tracked[ctx] then tracked[ctx] = true end
  return ref, ctx
end

--- The request (or timer) the running code belongs to: lightuserdata,
-- or nil. The driver tells a destroy hook suspended by cosocket I/O (in
-- another request) from one the running code is nested in.
function M.context()
  return get_request and get_request() or nil
end

--- Whether the owner (ref, ctx) is still running; a second value, the
-- table that replaced ctx (ngx.ctx = t), when it was replaced.
function M.owner_alive(ref, ctx)
  local cur = ctxs[ref]
  if cur == ctx then return true end
  -- (a bounded walk: ngx.ctx = a, then b, then a again makes a cycle)
  local m = moved[ctx]
  for _ = 1, 32 do
    if m == nil then return false end
    if m == cur then return true, m end
    m = moved[m]
  end
  return false
end

-- How often the watch looks while waiters wait (seconds; the bound of
-- "within a few milliseconds": nginx's timers have 1 ms resolution).
M.OWNER_POLL = 0.002

local function owner_poll(premature, fn, a)
  if premature then return end
  local ok, again = pcall(fn, a)
  if not ok then
    ngx_log(ERR, "clientpool: owner watch failed: ", tostring(again))
  elseif again then
    timer_at(M.OWNER_POLL, owner_poll, fn, a)
  end
end

--- Calls fn(a) every OWNER_POLL seconds in a timer until it returns a
-- false value (the driver: while waiters wait and leases are owned).
function M.watch_owners(fn, a)
  return timer_at(M.OWNER_POLL, owner_poll, fn, a)
end

--- Counters for tests and diagnostics: semaphores made, free, handles
-- that still hold one, grants reported lost, wakes refused.
function M.stats(t)
  t = t or {}
  local held = 0
  for i = 1, nslots do
    if not isfree[i] and H[i] ~= nil then held = held + 1 end
  end
  t.semaphores = nslots
  t.free = nfree
  t.held = held
  t.watching = nwatch
  t.lost = lost_count
  t.refused = wakes_refused
  t.deferred = ndeferred
  return t
end

--- Sweeps the semaphore slots now (tests).
function M._sweep()
  sweep()
end

return M
