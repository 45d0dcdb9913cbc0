--- clientpool: a pool of outbound clients with coroutine-native waiting.
--
-- This file is the public API and the driver: it validates options, calls
-- the engine (clientpool.core, a C state machine), and carries out what the
-- engine decides: calling the user's hooks, waking coroutines through the
-- scheduler adapter, arming the pool's timer. See docs/decisions.md.
-- @module clientpool

-- The engine binding (backend): clientpool.core (the C API) or, on LuaJIT
-- with the JIT on, clientpool.ffi, whose calls the JIT compiles (C API calls
-- it does not; with the JIT off, as on iOS or under -joff, FFI calls are
-- the slower ones). Both have the same surface. CLIENTPOOL_BACKEND=core|ffi
-- or the option `backend` overrides the default.
local WEAK_KEYS = { __mode = "k" }  -- the metatable of tables with weak keys
local THIS_SOURCE = debug.getinfo(1, "S").source
local pools_made = 0   -- spreads the checkout handle bases of pools (see checkout)
local JIT = rawget(_G, "jit")
local IS_JIT = JIT ~= nil
local function load_backend(name)
  if name ~= "ffi" and name ~= "core" then return nil, "must be \"core\" or \"ffi\"" end
  if name == "ffi" and not IS_JIT then return nil, "\"ffi\" needs LuaJIT" end
  return require("clientpool." .. name)
end
local BACKEND = os.getenv("CLIENTPOOL_BACKEND")
if BACKEND == nil or BACKEND == "" then BACKEND = (IS_JIT and JIT.status()) and "ffi" or "core" end
local core, backend_err = load_backend(BACKEND)
if not core then error("clientpool: CLIENTPOOL_BACKEND=" .. BACKEND .. ": " .. backend_err, 0) end

local type, error, pcall, select, setmetatable, tostring = type, error, pcall, select, setmetatable, tostring
local pairs, ipairs, rawget, getmetatable = pairs, ipairs, rawget, getmetatable
local math_floor, math_huge, string_format = math.floor, math.huge, string.format
local co_create, co_resume, co_status, co_yield = coroutine.create, coroutine.resume, coroutine.status, coroutine.yield
local co_running = coroutine.running
local unpack = table.unpack or unpack
local monotime = core.monotime

local GRANT_IDLE, GRANT_CREATE = core.GRANT_IDLE, core.GRANT_CREATE
local MUST_WAIT, PENDING, FULL, CLOSED = core.MUST_WAIT, core.PENDING, core.FULL, core.CLOSED
local PAUSED, STALE = core.PAUSED, core.STALE
local TIMEOUT, CANCELLED = core.TIMEOUT, core.CANCELLED
local EV_WAKE, EV_DESTROY, EV_TIMER = core.EV_WAKE, core.EV_DESTROY, core.EV_TIMER
local EV_KEY_FREE, EV_LEAK = core.EV_KEY_FREE, core.EV_LEAK
local EV_REFILL, EV_LOST = core.EV_REFILL, core.EV_LOST
-- warm-floor creates in flight at once, so a restart does not open every
-- connection in the same instant
local REFILL_CONCURRENCY = 2
local BY = core.BY
local BY_NAME = {}
for name, code in pairs(BY) do BY_NAME[code] = name end

local _M = { _VERSION = "0.1.0" }

--- The engine binding pools use unless their option `backend` says
-- otherwise: "ffi" (LuaJIT) or "core".
_M.backend = BACKEND

--- Runtime outcome codes, returned as the second value of a failed acquire.
_M.codes = { timeout = "timeout", full = "full", closed = "closed", cancelled = "cancelled",
             create = "create", paused = "paused" }

local DEFAULT = "" -- the default key's name: hooks receive nil for it

---------------------------------------------------------------------------
-- Protected calls that let the function yield.
---------------------------------------------------------------------------

local pack = table.pack or function(...) return { n = select("#", ...), ... } end

-- pcall is yieldable on Lua 5.2+ and LuaJIT. On PUC Lua 5.1 the function runs
-- in its own coroutine and every yield is passed up to the caller's
-- scheduler, whose resume values are passed back down.
local ycall = pcall
if _VERSION == "Lua 5.1" and not rawget(_G, "jit") then
  ycall = function(fn, ...)
    -- 5.1's coroutine.create takes Lua functions only; a C function (a
    -- hook such as os.clock, print given to with()) cannot yield anyway
    local made, co = pcall(co_create, fn)
    if not made then return pcall(fn, ...) end
    local r = pack(co_resume(co, ...))
    while r[1] and co_status(co) == "suspended" do
      r = pack(co_resume(co, co_yield(unpack(r, 2, r.n))))
    end
    return unpack(r, 1, r.n)
  end
end

---------------------------------------------------------------------------
-- Option validation: every bad option raises naming the option and the rule.
---------------------------------------------------------------------------

-- Raised without a position: new() re-raises it at its caller's line.
-- Numbers are printed with %s: %d raises on a float with no integer
-- representation (a bad option such as -1e300 or 2^64).
local function fail(fmt, ...)
  local args = pack(...)
  for i = 1, args.n do
    local v = args[i]
    if type(v) == "number" and math_floor(v) == v and v > -2^53 and v < 2^53 then
      args[i] = string_format("%d", v)
    end
  end
  error("clientpool: " .. string_format((fmt:gsub("%%d", "%%s")), unpack(args, 1, args.n)), 0)
end

local function is_int(v)
  return type(v) == "number" and v == v and v ~= math_huge and v ~= -math_huge and math_floor(v) == v
end

local KNOWN = {
  create = true, destroy = true, validate = true, park = true, unpark = true,
  min_idle = true, max_idle = true, max_live = true, max_concurrency = true,
  max_waiting = true, per_key = true, keys = true, capacity = true,
  acquire_timeout = true, idle_timeout = true, max_lifetime = true,
  lifetime_jitter = true, validate_after_idle = true, max_keys = true,
  leak_threshold = true, policy = true, pause_mode = true, probe = true,
  restarts = true, scheduler = true, seed = true, backend = true,
}

local function check_count(o, name, min, default)
  local v = o[name]
  if v == nil then return default end
  if not is_int(v) then
    fail("option '%s' must be an integer, got %s", name, type(v) == "number" and tostring(v) or type(v))
  end
  if v < min then fail("option '%s' must be >= %d, got %d", name, min, v) end
  if v > 2147483647 then fail("option '%s' must be <= 2147483647, got %s", name, tostring(v)) end
  return v
end

local function check_duration(o, name)
  local v = o[name]
  if v == nil then return nil end
  if type(v) ~= "number" then fail("option '%s' must be a number of seconds, got %s", name, type(v)) end
  if v ~= v or v == math_huge or v == -math_huge then
    fail("option '%s' must be finite, got %s", name, tostring(v))
  end
  if v <= 0 then fail("option '%s' must be > 0 seconds, got %s", name, tostring(v)) end
  return v
end

local function check_fn(o, name, required)
  local v = o[name]
  if v == nil and not required then return nil end
  if type(v) ~= "function" then
    fail("option '%s' must be a function, got %s", name, type(v))
  end
  return v
end

local function validate_options(o)
  if type(o) ~= "table" then fail("new() expects an options table, got %s", type(o)) end
  for k in pairs(o) do
    if not KNOWN[k] then fail("unknown option '%s'", tostring(k)) end
  end
  local c = {}
  c.create = check_fn(o, "create", true)
  c.destroy = check_fn(o, "destroy")
  c.validate = check_fn(o, "validate")
  c.park = check_fn(o, "park")
  c.unpark = check_fn(o, "unpark")
  if (c.park == nil) ~= (c.unpark == nil) then
    fail("options 'park' and 'unpark' go together: give both or neither")
  end
  if o.policy ~= nil then
    local pm = getmetatable(o.policy)
    if type(o.policy) ~= "function" and not (pm and pm.__call) then
      fail("option 'policy' must be a function or a callable policy, got %s", type(o.policy))
    end
    c.policy = o.policy
  end
  if o.max_live == nil then fail("option 'max_live' is required (an integer >= 1)") end
  c.max_live = check_count(o, "max_live", 1)
  c.capacity = check_count(o, "capacity", 1, 1)
  c.min_idle = check_count(o, "min_idle", 0, 0)
  c.max_idle = check_count(o, "max_idle", 0, c.max_live)
  c.max_concurrency = check_count(o, "max_concurrency", 1, math.min(c.max_live * c.capacity, 2147483647))
  c.max_waiting = check_count(o, "max_waiting", 0, 1024)
  c.max_keys = check_count(o, "max_keys", 1)
  c.restarts = check_count(o, "restarts", 0, 3)
  if c.max_idle > c.max_live then
    fail("option 'max_idle' (%d) must be <= max_live (%d)", c.max_idle, c.max_live)
  end
  if c.min_idle > c.max_idle then
    fail("option 'min_idle' (%d) must be <= max_idle (%d)", c.min_idle, c.max_idle)
  end
  if o.per_key ~= nil then
    local pk = o.per_key
    if type(pk) ~= "table" then fail("option 'per_key' must be a table, got %s", type(pk)) end
    for k in pairs(pk) do
      if k ~= "max_live" and k ~= "max_idle" then fail("unknown option 'per_key.%s'", tostring(k)) end
    end
    if pk.max_live ~= nil then
      if not is_int(pk.max_live) or pk.max_live < 1 then
        fail("option 'per_key.max_live' must be an integer >= 1, got %s", tostring(pk.max_live))
      end
      if pk.max_live > c.max_live then
        fail("option 'per_key.max_live' (%d) must be <= max_live (%d)", pk.max_live, c.max_live)
      end
      if c.min_idle > pk.max_live then  -- the floor of a key could never be met
        fail("option 'min_idle' (%d) must be <= per_key.max_live (%d)", c.min_idle, pk.max_live)
      end
      c.key_max_live = pk.max_live
    end
    if pk.max_idle ~= nil then
      if not is_int(pk.max_idle) or pk.max_idle < 0 then
        fail("option 'per_key.max_idle' must be an integer >= 0, got %s", tostring(pk.max_idle))
      end
      if pk.max_idle > c.max_idle then
        fail("option 'per_key.max_idle' (%d) must be <= max_idle (%d)", pk.max_idle, c.max_idle)
      end
      if c.key_max_live and pk.max_idle > c.key_max_live then
        fail("option 'per_key.max_idle' (%d) must be <= per_key.max_live (%d)", pk.max_idle, c.key_max_live)
      end
      if c.min_idle > pk.max_idle then
        fail("option 'min_idle' (%d) must be <= per_key.max_idle (%d)", c.min_idle, pk.max_idle)
      end
      c.key_max_idle = pk.max_idle
    end
  end
  if o.keys ~= nil then
    if type(o.keys) ~= "table" then fail("option 'keys' must be a list of strings, got %s", type(o.keys)) end
    local seen = {}
    for i, k in ipairs(o.keys) do
      if type(k) ~= "string" then fail("option 'keys' must hold strings, item %d is a %s", i, type(k)) end
      if seen[k] then fail("option 'keys' lists '%s' twice", k) end
      seen[k] = true
    end
    for k in pairs(o.keys) do
      if type(k) ~= "number" or not seen[o.keys[k]] then fail("option 'keys' must be a list (array)") end
    end
    if c.max_keys and #o.keys > c.max_keys then
      fail("option 'keys' lists %d keys, more than max_keys (%d)", #o.keys, c.max_keys)
    end
    -- the floor fills min_idle idle clients per warm key, up to max_live in
    -- all; more than max_idle and every release would close one that the
    -- floor then opens again (a floor capped by max_live = max_idle is fine)
    local floor = math.min(c.min_idle * #o.keys, c.max_live)
    if floor > c.max_idle then
      fail("options 'min_idle' (%d) x %d warm keys ('keys'), up to max_live (%d): a floor of %d idle clients, " ..
           "more than max_idle (%d): every release would close a client the warm floor opens again",
           c.min_idle, #o.keys, c.max_live, floor, c.max_idle)
    end
    c.keys = o.keys
  end
  c.acquire_timeout = check_duration(o, "acquire_timeout")
  c.idle_timeout = check_duration(o, "idle_timeout")
  c.max_lifetime = check_duration(o, "max_lifetime")
  c.validate_after_idle = check_duration(o, "validate_after_idle")
  c.leak_threshold = check_duration(o, "leak_threshold")
  if o.lifetime_jitter ~= nil then
    local j = o.lifetime_jitter
    if type(j) ~= "number" or j ~= j then fail("option 'lifetime_jitter' must be a number, got %s", tostring(j)) end
    if j < 0 or j >= 1 then fail("option 'lifetime_jitter' must be in [0, 1), got %s", tostring(j)) end
    if not c.max_lifetime then fail("option 'lifetime_jitter' needs max_lifetime") end
    c.lifetime_jitter = j
  end
  if o.pause_mode ~= nil and o.pause_mode ~= "queue" and o.pause_mode ~= "fail" then
    fail("option 'pause_mode' must be \"queue\" or \"fail\", got %s", tostring(o.pause_mode))
  end
  if o.probe ~= nil and type(o.probe) ~= "boolean" then
    fail("option 'probe' must be a boolean, got %s", type(o.probe))
  end
  c.pause_mode = o.pause_mode or "queue"
  c.probe = o.probe == true
  if o.seed ~= nil and (not is_int(o.seed) or o.seed < 0 or o.seed >= 2^64) then
    fail("option 'seed' must be an integer in [0, 2^64), got %s", tostring(o.seed))
  end
  c.seed = o.seed
  if o.backend ~= nil then
    local _, err = load_backend(o.backend)
    if err then fail("option 'backend' %s (got %s)", err, tostring(o.backend)) end
    c.backend = o.backend
  end
  return c
end

---------------------------------------------------------------------------
-- Schedulers
---------------------------------------------------------------------------

local ADAPTER_FIELDS = { "now", "current", "wait", "wake", "spawn", "sleep" }
-- Optional; the driver calls each one it finds (docs/decisions.md, "Schedulers").
local ADAPTER_OPTIONAL = { "background", "done", "alive", "yieldable", "exiting", "log" }

local function resolve_scheduler(s)
  if s == nil then
    local ngx = rawget(_G, "ngx")
    if type(ngx) == "table" and type(ngx.get_phase) == "function" then s = "ngx" else s = "loop" end
  end
  if type(s) == "string" then
    local ok, mod = pcall(require, "clientpool.sched." .. s)
    if not ok then
      local msg = tostring(mod)
      if msg:find("module 'clientpool.sched." .. s .. "' not found", 1, true) then
        error("clientpool: option 'scheduler': no scheduler named '" .. s ..
              "' (built in: loop, ngx, cqueues, luv, copas; or give an adapter table)", 3)
      end
      -- the adapter is there, its host is not (copas not installed for this
      -- Lua, ngx outside OpenResty): say that, with the first line of why
      error("clientpool: option 'scheduler': the '" .. s .. "' adapter cannot load here: " ..
            (msg:match("^[^\n]*"):gsub("^[^:]+:%d+: ", "")), 3)
    end
    s = mod
  end
  if type(s) ~= "table" then
    error("clientpool: option 'scheduler' must be a name or an adapter table, got " .. type(s), 3)
  end
  for _, f in ipairs(ADAPTER_FIELDS) do
    if type(s[f]) ~= "function" then
      error("clientpool: option 'scheduler': the adapter lacks function '" .. f .. "'", 3)
    end
  end
  for _, f in ipairs(ADAPTER_OPTIONAL) do
    local v = s[f]
    if v ~= nil and type(v) ~= "function" then
      error("clientpool: option 'scheduler': the adapter's '" .. f .. "' must be a function when given, got " ..
            type(v), 3)
    end
  end
  return s
end

---------------------------------------------------------------------------
-- Cancel tokens
---------------------------------------------------------------------------

local Token = {}
Token.__index = Token

--- A cancel token: pass it as `opts.cancel` to acquire; `token:cancel()`
-- ends the acquisitions waiting on it with `nil, "cancelled"`.
function _M.token()
  return setmetatable({ _cancelled = false, _waits = {} }, Token)
end

local function check_token(self, name)
  if getmetatable(self) ~= Token then
    error("clientpool: " .. name .. " needs the token as self, got " .. type(self) ..
          " (call token:" .. name .. "() with a colon)", 3)
  end
end

function Token:cancelled()
  check_token(self, "cancelled")
  return self._cancelled
end

function Token:cancel()
  check_token(self, "cancel")
  if self._cancelled then return end
  self._cancelled = true
  local waits = self._waits
  self._waits = {}
  for handle, adapter in pairs(waits) do adapter.wake(handle) end
end

---------------------------------------------------------------------------
-- Details of timeout and full: counts, printable like HikariCP's message.
---------------------------------------------------------------------------

local Detail = {}
Detail.__index = Detail
Detail.__tostring = function(d)
  local head
  if d.reason == "timeout" then
    head = string_format("timeout after %.3fs", d.waited or 0)
  elseif d.reason == "max_keys" then
    head = "max_keys keys exist"
  else
    head = "max_waiting acquisitions wait already"
  end
  local s = string_format("%s (live=%d, idle=%d, active=%d, waiting=%d)", head, d.live, d.idle, d.active, d.waiting)
  if d.paused then s = s .. ", paused: " .. tostring(d.paused) end
  return s
end
Detail.__concat = function(a, b) return tostring(a) .. tostring(b) end

---------------------------------------------------------------------------
-- Pool
---------------------------------------------------------------------------

local Pool = {}
local install_fastpath   -- the C fast path of checkout/checkin (defined at the end)
local acquire_from       -- Pool:acquire after the engine's answer (defined below it)
Pool.__index = Pool
local Lease = {}
Lease.__index = Lease

local EVENTS = { create = true, acquire = true, release = true, destroy = true,
                 pause = true, resume = true, timeout = true, leak = true }

-- A lease's cancellation: fired at drain (on_drain = { cancel = grace }),
-- by cancel_active(), or when a shared client is lost by a co-holder.
local function fire_cancel(lease)
  if lease._cancelled then return end
  lease._cancelled = true
  local fns = lease._on_cancel
  if fns then
    lease._on_cancel = nil
    local p = lease._p
    for i = 1, #fns do
      local ok, err = pcall(fns[i], lease)
      if not ok and p then
        local l = p._sched.log
        if l then pcall(l, "on_cancel callback failed: " .. tostring(err)) end
      end
    end
  end
end

local function log(self, msg)
  local l = self._sched.log
  if l then pcall(l, msg) else io.stderr:write("clientpool: ", msg, "\n") end
end

local function emit(self, name, ...)
  local ls = self._on[name]
  if not ls then return end
  for i = 1, #ls do
    local ok, err = pcall(ls[i], ...)
    if not ok then log(self, "listener for '" .. name .. "' failed: " .. tostring(err)) end
  end
end

local function hook_key(name)
  if name == DEFAULT then return nil end
  return name
end

-- The engine's time argument: nil lets the C binding read the monotonic clock.
local function now_of(self)
  if self._mono then return nil end
  return self._sched.now()
end

local function clock(self)
  if self._mono then return monotime() end
  return self._sched.now()
end

local pump, report_held

local function destroy_task(self, destroy, client, name)
  local ok, err = ycall(destroy, client, hook_key(name))
  if not ok then log(self, "destroy hook failed: " .. tostring(err)) end
end

-- (No closure here or in start_timer: LuaJIT cannot compile closure
-- creation, and an abort in a path this common blacklists its callers.)
local function run_destroy(self, client, name, reason)
  local destroy = self._destroy
  if destroy then self._sched.spawn(destroy_task, self, destroy, client, name) end
  emit(self, "destroy", hook_key(name), client, reason)
end

-- The pool's timer: one background task waits for the engine's next
-- deadline and ticks it; EV_TIMER moves the deadline earlier. A kick (a lease
-- reported by the garbage collector) has it carry out the engine's events.
local function timer_task(self)
  local sched = self._sched
  local h = sched.current()
  self._timer_h = h
  while self._kicked or (self._timer_at and not self._closed) do
    if self._kicked then
      self._kicked = false
      pump(self)
    else
      local t = self._timer_at
      if clock(self) < t then sched.wait(h, t) end
      if self._timer_at and clock(self) >= self._timer_at then
        self._timer_at = nil
        self._e:tick(now_of(self))
        pump(self)
      end
    end
  end
  self._timer_h = nil
end

local function timer_main(self)
  local ok, err = ycall(timer_task, self)
  self._timer_spawned = false
  self._timer_h = nil
  if not ok then log(self, "timer task failed: " .. tostring(err)) end
end

local function start_timer(self)
  if self._timer_h then
    self._sched.wake(self._timer_h)
  elseif not self._timer_spawned then
    self._timer_spawned = true
    local bg = self._sched.background or self._sched.spawn
    bg(timer_main, self)
  end
end

local function arm(self, t)
  if self._closed then return end
  if self._timer_at and self._timer_at <= t then return end
  self._timer_at = t
  start_timer(self)
end

-- Runs inside a finalizer: only schedules the work, and not even that
-- while the host is exiting (OpenResty runs the finalizers of leases its
-- aborted requests left from lua_close at worker exit, where waking a
-- semaphore or starting a timer touches requests that are gone).
local function kick(self)
  self._kicked = true
  local exiting = self._sched.exiting
  if exiting and exiting() then return end
  start_timer(self)
end

-- wake() returned true, but the adapter learned later that the waiter died
-- before it ran (OpenResty: killed or aborted between the post and its
-- resumption): the adapter calls this, and the grant goes back.
local function give_back(self, w, g)
  if self._waiters[w] == nil or self._wgen[w] ~= g then return end
  self._waiters[w] = nil
  self._nwaiters = self._nwaiters - 1
  self._wgen[w] = nil
  self._e:abandon(w, g, now_of(self))
  pump(self)
end

-- Whether a waiter's handle can still run: the adapter's alive(h) if it has
-- one, else a coroutine handle that is not dead.
local function handle_alive(h)
  return type(h) ~= "thread" or co_status(h) ~= "dead"
end

-- Ends the queued waiters whose coroutine died without a wake to tell (a
-- coroutine closed, an nginx light thread killed, a request aborted): they
-- leave the queue as cancelled and free their max_waiting slots. Called
-- where a count of waiters matters (a full queue, stats()). O(waiters).
local function reap_dead_waiters(self)
  local alive = self._sched.alive or handle_alive
  local e, n = self._e, 0
  for w, h in pairs(self._waiters) do
    if not alive(h) then
      local g = self._wgen[w]
      self._waiters[w] = nil
      self._nwaiters = self._nwaiters - 1
      self._wgen[w] = nil
      e:abandon(w, g, now_of(self))
      n = n + 1
    end
  end
  if n > 0 then pump(self) end
  return n
end

-- Before an acquisition that the engine could refuse as full: with the
-- queue at max_waiting, dead waiters are reaped first. A queue full of live
-- waiters costs each refusal a scan of it (one liveness check per waiter):
-- the price of never refusing on behalf of the dead.
local function reap_if_full(self)
  if self._nwaiters >= self._c.max_waiting then reap_dead_waiters(self) end
end

-- Reports lease slot l (generation g), held since `since` past
-- leak_threshold, if a lease or a checkout holds it; false if none does.
report_held = function(self, l, g, since)
  local lease = self._held[l]
  if lease and lease._g == g then
    local info = { leaked = false, held = clock(self) - since, where = lease._where, lease = lease }
    if self._on.leak then
      emit(self, "leak", hook_key(lease._key), info)
    else
      log(self, string_format("lease of key '%s' held %.3fs (leak_threshold), %s",
        lease._key, info.held, tostring(lease._where)))
    end
    return true
  elseif lease == nil and self._co_rec[l + 1] ~= nil then
    -- a checkout (no lease object, no traceback)
    local name = self._co_key[l + 1]
    local info = { leaked = false, held = clock(self) - since, where = "checkout" }
    if self._on.leak then
      emit(self, "leak", hook_key(name), info)
    else
      log(self, string_format("checkout of key '%s' held %.3fs (leak_threshold)", name, info.held))
    end
    return true
  end
  return false
end

-- A lease or checkout of slot l (generation g) was just registered: the
-- engine's leak_threshold report, if it came while its hooks still ran.
local function report_early(self, l, g)
  local early = self._early_leaks
  local r = early[l]
  if r == nil then return end
  early[l] = nil
  if r[1] == g then report_held(self, l, g, r[2]) end
end

-- Carries out one engine event (pump's body).
local function handle_event(self, e, t, a, b, c, tt)
  do
    if t == EV_WAKE then
      local h = self._waiters[a]
      if h ~= nil and self._wgen[a] == b then
        if not self._sched.wake(h, give_back, self, a, b) then
          -- the waiting coroutine is gone: give its grant back
          self._waiters[a] = nil
          self._nwaiters = self._nwaiters - 1
          e:abandon(a, b, now_of(self))
        end
      end
    elseif t == EV_DESTROY then
      local client = self._clients[a]
      self._clients[a] = nil
      self._parked[a] = nil
      if self._rec_leases then self._rec_leases[a] = nil end
      local reason = BY_NAME[b]
      local name = self._knames[c]
      run_destroy(self, client, name, reason)
    elseif t == EV_TIMER then
      arm(self, tt)
    elseif t == EV_REFILL then
      if self._run_h then self._sched.wake(self._run_h) end
    elseif t == EV_LOST then
      -- a co-holder retired a shared client: every other lease learns it
      local set = self._rec_leases and self._rec_leases[a]
      if set then
        for lease in pairs(set) do
          if type(lease) == "table" then   -- else a checkout handle: no object to tell
            lease.lost = true
            fire_cancel(lease)
          end
        end
      end
    elseif t == EV_KEY_FREE then
      local name = self._knames[a]
      if name ~= nil then
        self._knames[a] = nil
        self._kids[name] = nil
      end
    elseif t == EV_LEAK and a < 0 then
      -- a lease collected while held (one report per lease; its client is
      -- destroyed when its last lease ends)
      emit(self, "leak", hook_key(self._knames[c]), { leaked = true })
    elseif t == EV_LEAK then
      if not report_held(self, a, b, tt) then
        -- granted, but its create/validate/unpark still runs (the lease or
        -- checkout is registered after them): reported when it is
        local early = self._early_leaks
        if not early then early = {}; self._early_leaks = early end
        early[a] = { b, tt }     -- generation, and since when it is held
      end
    end
  end
end

-- Carries out the engine's queued events, one at a time and in order, so a
-- hook that re-enters the pool sees them in order too. A tail call per
-- event, not a loop: under LuaJIT a loop here aborts every trace recorded
-- through it (create, wait, destroy paths), and the aborts blacklist the
-- functions they start in, checkout and acquire included, hot path and all.
-- drain() waits until no lease is held: whatever ended the last one (a
-- release, a failed create, a collected lease) went through an event pump.
local function wake_drainers(self)
  if self._e:stats(-1, self._scratch).leases == 0 then
    for h in pairs(self._drain_hs) do self._sched.wake(h) end
  end
end

pump = function(self)
  local e = self._e
  local t, a, b, c, tt = e:next_event()
  if not t then
    if self._drain_hs then wake_drainers(self) end
    return
  end
  handle_event(self, e, t, a, b, c, tt)
  return pump(self)
end

local function snapshot(self, reason, name, waited)
  -- the scratch table: read at once, and a fresh stats table (with its
  -- closed_by) per timeout was most of the garbage of a timed-out wait
  local s = self._e:stats(-1, self._scratch)
  -- paused: why admission was held (the key's or the pool's pause reason,
  -- "probe" while a half-open gate admits one at a time), else nil
  local paused = self._paused or (name and self._kpaused[name]) or nil
  if not paused and self._c.probe then
    local k = name and self._kids[name]
    if self._e:gate(-1) == 2 or (k and self._e:gate(k) == 2) then paused = "probe" end
  end
  return setmetatable({ live = s.live, idle = s.idle, active = s.active, waiting = s.waiting,
                        leases = s.leases, creating = s.creating, key = hook_key(name),
                        waited = waited, reason = reason, paused = paused }, Detail)
end

--- Creates a pool. Performs no I/O.
function _M.new(opts)
  local ok, c = pcall(validate_options, opts)
  if not ok then error(c, 2) end
  local sched = resolve_scheduler(opts.scheduler)
  local mod = c.backend and load_backend(c.backend) or core
  local e = mod.new {
    max_live = c.max_live, min_idle = c.min_idle, max_idle = c.max_idle,
    max_concurrency = c.max_concurrency, max_waiting = c.max_waiting, capacity = c.capacity,
    key_max_live = c.key_max_live, key_max_idle = c.key_max_idle, max_keys = c.max_keys,
    idle_timeout = c.idle_timeout, max_lifetime = c.max_lifetime,
    lifetime_jitter = c.lifetime_jitter, validate_after_idle = c.validate_after_idle,
    leak_threshold = c.leak_threshold, seed = c.seed,
    pause_fail = c.pause_mode == "fail" and 1 or 0,
  }
  pools_made = pools_made + 1
  local self = setmetatable({
    _e = e, _c = c, _sched = sched, _mono = sched.monotonic == true,
    _create = c.create, _destroy = c.destroy, _validate = c.validate,
    _park = c.park, _unpark = c.unpark,
    _clients = {}, _parked = {}, _kids = {}, _knames = {},
    _waiters = {}, _wgen = {}, _nwaiters = 0,
    _opts_seen = setmetatable({}, WEAK_KEYS), _on = {}, _closed = false,
    _held = setmetatable({}, { __mode = "v" }),
    _paused = false, _kpaused = {}, _pause_gen = 0,
    _strikes = 0, _spent = false, _refilling = 0,
    _rec_leases = c.capacity > 1 and {} or nil,
    _scratch = {}, _drain_hs = nil, _pgen = {}, _pgen_next = 0, _adopted = setmetatable({}, WEAK_KEYS),
    _co_rec = {}, _co_key = {},   -- checkouts: lease slot + 1 -> record, key name
    _hbase = (pools_made * 2654435761 + 2246822519) % 4294967296,   -- see checkout
  }, Pool)
  -- a collected lease is reported at the pool's clock: a grant it makes is
  -- dated then (its wait, its client's idle time), not at the last call
  e:set_notify(function() kick(self) end, self._mono and monotime or sched.now)
  install_fastpath(self, mod)
  -- The warm keys are opened and pinned now. Without `keys` the default key
  -- is the warm key, but only a floor (min_idle > 0) needs it open before
  -- use: otherwise it is opened at its first acquire like any key, so an
  -- unused default key does not count against max_keys.
  local warm = c.keys or (c.min_idle > 0 and { DEFAULT }) or {}
  self._warm = {}
  for _, name in ipairs(warm) do
    self._warm[name] = true
    local k = e:key_open()
    e:key_pin(k, 2)   -- pinned and warm
    self._kids[name] = k
    self._knames[k] = name
  end
  return self
end

local function key_id(self, key, fname)
  local name = key
  if name == nil then
    name = DEFAULT
  elseif type(name) ~= "string" then
    error("clientpool: bad argument #1 to '" .. fname .. "' (key must be a string or nil, got " .. type(key) .. ")", 3)
  end
  -- a finalizer (a collected lease) may have forgotten keys meanwhile: their
  -- EV_KEY_FREE events take the names off _kids before a name is looked up
  if self._kicked then
    self._kicked = false
    pump(self)
  end
  local k = self._kids[name]
  if k then return k, name end
  local err
  k, err = self._e:key_open()
  if not k then return nil, name, err end
  self._kids[name] = k
  self._knames[k] = name
  return k, name
end

-- The engine answered STALE for key id k of name: a finalizer forgot the
-- key after name was looked up. Its EV_KEY_FREE drops the name (pump); the
-- caller then looks the name up again.
local function stale_key(self, k, name)
  pump(self)
  if self._kids[name] == k then
    self._kids[name] = nil
    self._knames[k] = nil
  end
end

-- The stack level, counted as error() and debug.traceback() count from the
-- function that calls this one, of the first Lua frame outside this file:
-- the user's code, past the pool's own frames, its C functions (the fast
-- path) and tail calls (frames of their own on Lua 5.1). nil if none.
local function outside_level()
  local level = 3                       -- 1: here, 2: the caller
  while true do
    local info = debug.getinfo(level, "S")
    if info == nil then return nil end
    if info.source ~= THIS_SOURCE and info.what ~= "C" and info.what ~= "tail" then return level - 1 end
    level = level + 1
  end
end

-- sentinel: the leak guard the engine call returned (a C userdata, or FFI
-- cdata): it reports the lease to the engine if the lease is collected while
-- held. The bindings re-arm a released lease's sentinel for a later lease,
-- so no finalizer runs per lease (a __gc on the lease table itself, possible
-- from Lua 5.2 on, ran one for every lease);
-- drain: the acquisition's on_drain ("preserve" = nil, or a grace in seconds)
local function new_lease(self, name, rec, l, g, client, sentinel, drain)
  local lease = setmetatable({ client = client, _p = self, _key = name, _r = rec, _l = l, _g = g,
                               _s = sentinel, _drain = drain }, Lease)
  self._held[l] = lease   -- weak: for cancel_active, drain and leak reports
  if self._c.leak_threshold then
    -- the traceback starts at the caller's frame (else, in a coroutine of
    -- the pool's own, here)
    lease._where = debug.traceback("acquired", outside_level() or 2)
  end
  local rl = self._rec_leases
  if rl then
    -- weak keys: a co-holder set must not keep a dropped lease from the
    -- collector (its finalizer reports the leak)
    local set = rl[rec]
    if not set then set = setmetatable({}, WEAK_KEYS); rl[rec] = set end
    set[lease] = true
  end
  if drain and self._drain_started then self:_schedule_cancel(lease) end
  if self._early_leaks then report_early(self, l, g) end
  return lease
end

-- A lease or checkout ended while a drain waits: it ends when none is left.
local function drain_wake(self)
  if self._e:stats(-1, self._scratch).leases == 0 then
    for h in pairs(self._drain_hs) do self._sched.wake(h) end
  end
end

-- Ends the engine side of a lease; reason nil = reuse.
local function finish_lease(self, lease, reason)
  local l, g = lease._l, lease._g
  lease._g = nil
  if lease._s then lease._s = nil end
  if self._held[l] == lease then self._held[l] = nil end
  local rl = self._rec_leases
  if rl and rl[lease._r] then rl[lease._r][lease] = nil end
  local ok, pending = self._e:release(l, g, reason or -1, now_of(self))
  if pending > 0 then pump(self) end
  if self._drain_hs then drain_wake(self) end
  return ok
end

-- The granted idle record failed unpark or validate: it is retired as
-- invalid and the same caller granted again at once, keeping its place in
-- the queue (docs/api.md, Acquiring: "the same caller looks again"). Returns nil and the new
-- grant: status, record, lease, gen, validate, idle, sentinel.
local function regrant(self, l, g, want)
  local st, rec, l2, g2, validate, idle, pending, sentinel = self._e:regrant(l, g, now_of(self), want)
  if pending > 0 then pump(self) end
  return nil, st, rec, l2, g2, validate, idle, sentinel
end

-- Makes a granted idle record usable: unpark and validate. Returns the
-- client, or nil and a new grant (see regrant). want: a leak sentinel for
-- the new grant.
local function ready_idle(self, name, rec, l, g, validate, idle, want)
  local client = self._clients[rec]
  if self._parked[rec] then
    local ok, c = ycall(self._unpark, client, hook_key(name))
    if not ok or c == nil then
      if not ok then log(self, "unpark hook failed: " .. tostring(c)) end
      self._clients[rec] = client
      return regrant(self, l, g, want)
    end
    client = c
    self._clients[rec] = c
    self._parked[rec] = nil
  end
  local v = self._validate
  if v and validate then
    local ok, good = ycall(v, client, hook_key(name), idle)
    if not ok or not good then
      if not ok then log(self, "validate hook failed: " .. tostring(good)) end
      return regrant(self, l, g, want)
    end
  end
  return client
end

-- Runs create for a reservation. Returns the lease, or nil, "create", err.
-- Runs create for reservation rec. Returns the client, or nil, "create",
-- err. A lease given (acquire; checkout has none) is disarmed on failure and
-- gets the client on success.
local function create_client(self, name, rec, lease)
  local ok, client, err = ycall(self._create, hook_key(name))
  local e = self._e
  if not ok or client == nil then
    if lease then
      lease._g = nil
      lease._s = nil
    end
    local _, pending = e:created(rec, false, now_of(self))
    if pending > 0 then pump(self) end
    if ok then err = err or "create returned nil" else err = client end
    return nil, "create", err
  end
  self._clients[rec] = client
  if lease then lease.client = client end
  local _, pending = e:created(rec, true, now_of(self))
  if pending > 0 then pump(self) end
  -- a fresh client granted: the warm floor's strikes start over
  self._strikes = 0
  if self._spent then
    self._spent = false
    if self._run_h then self._sched.wake(self._run_h) end
  end
  emit(self, "create", hook_key(name), client)
  return client
end

local function do_create(self, name, rec, l, g, sentinel, drain)
  -- the lease exists before create runs: if the creating coroutine is killed
  -- and collected, the lease's collection forfeits the reservation
  local lease = new_lease(self, name, rec, l, g, nil, sentinel, drain)
  local client, code, err = create_client(self, name, rec, lease)
  if client == nil then return nil, code, err end
  return lease
end

local function on_grant(self, name, st, rec, l, g, validate, idle, waited, sentinel, drain)
  if st == GRANT_IDLE then
    local client, st2, rec2, l2, g2, v2, i2, s2 = ready_idle(self, name, rec, l, g, validate, idle,
                                                              sentinel ~= nil)
    if client == nil then
      if st2 == GRANT_IDLE or st2 == GRANT_CREATE then      -- looks again, in its place
        return on_grant(self, name, st2, rec2, l2, g2, v2, i2, waited, s2, drain)
      elseif st2 == CLOSED then
        return nil, "closed"
      end
      return nil   -- nothing granted (out of memory): the caller acquires anew
    end
    local lease = new_lease(self, name, rec, l, g, client, sentinel, drain)
    if self._on.acquire then emit(self, "acquire", hook_key(name), client, waited) end
    return lease
  end
  local lease, code, err = do_create(self, name, rec, l, g, sentinel, drain)
  if lease and self._on.acquire then emit(self, "acquire", hook_key(name), lease.client, waited) end
  return lease, code, err
end

-- After a wait of waiter w (generation g): the engine's claim, or the
-- cancel or timeout that ends the wait. Returns the claim's results (status
-- PENDING: not granted yet, wait again). want: a leak sentinel for a grant.
local function wait_claim(self, w, g, deadline, token, want)
  local e = self._e
  local st, rec, l, lg, validate, idle, pending, waited, sentinel = e:claim(w, g, now_of(self), want)
  if st == PENDING then
    if token and token._cancelled then
      local _
      _, pending = e:abandon(w, g, now_of(self))
      st = CANCELLED
    elseif deadline and clock(self) >= deadline then
      return e:cancel(w, g, TIMEOUT, now_of(self), want)
    end
  end
  return st, rec, l, lg, validate, idle, pending, waited, sentinel
end

-- The waits after the first (woken early, spuriously): a loop of its own,
-- off the path of a handoff. LuaJIT gives up a trace that meets a loop it
-- did not start at ("inner loop in root trace"), so a loop in wait_for left
-- every handoff to the interpreter. (The first wait stays in wait_for: a
-- waiting coroutine's stack is a frame shallower, B4's bytes per waiter.)
local function wait_on(self, h, w, g, deadline, token, want)
  while true do
    self._sched.wait(h, deadline)
    local st, rec, l, lg, validate, idle, pending, waited, sentinel = wait_claim(self, w, g, deadline, token, want)
    if st ~= PENDING then return st, rec, l, lg, validate, idle, pending, waited, sentinel end
  end
end

-- bare: no leak sentinel (checkout)
local function wait_for(self, k, name, opts, bare)
  local sched = self._sched
  local h, why = sched.current()
  if h == nil then
    self._e:key_forget(k)
    pump(self)
    local what = bare and "checkout" or "acquire"
    error("clientpool: " .. what .. " would wait, but " .. (why or "the caller cannot yield") ..
          " (use try_acquire, or call " .. what .. " from a coroutine the scheduler runs)", outside_level() or 0)
  end
  local done = sched.done        -- (optional) h is over: see below
  local timeout = opts and opts.timeout
  if timeout == nil then timeout = self._c.acquire_timeout end
  local start = clock(self)
  local deadline = timeout and start + timeout
  local e = self._e
  if self._nwaiters > 0 then reap_if_full(self) end
  local w, g, pending = e:wait(k, deadline or -1, start)   -- the same clock: one read, not two
  if not w then
    if done then done(h) end
    if g == STALE then
      stale_key(self, k, name)
      return nil, STALE         -- the caller acquires again (see stale_key)
    end
    pump(self)
    if g == FULL then
      return nil, "full", snapshot(self, "full", name)
    end
    return nil, "closed"
  end
  self._waiters[w] = h
  self._nwaiters = self._nwaiters + 1
  self._wgen[w] = g
  local token = opts and opts.cancel
  if token then token._waits[h] = sched end
  if pending > 0 then pump(self) end
  local st, rec, l, lg, validate, idle, waited, sentinel
  sched.wait(h, deadline)
  st, rec, l, lg, validate, idle, pending, waited, sentinel = wait_claim(self, w, g, deadline, token, not bare)
  if st == PENDING then
    st, rec, l, lg, validate, idle, pending, waited, sentinel = wait_on(self, h, w, g, deadline, token, not bare)
  end
  self._waiters[w] = nil
  self._nwaiters = self._nwaiters - 1
  self._wgen[w] = nil
  if token then token._waits[h] = nil end
  -- nothing wakes h any more: an adapter that recycles what a handle holds
  -- (ngx: its semaphore) takes it back now rather than from the collector
  if done then done(h) end
  if pending > 0 then pump(self) end
  if st == GRANT_IDLE or st == GRANT_CREATE then
    return true, st, rec, l, lg, validate, idle, waited, sentinel
  elseif st == TIMEOUT then
    local d = snapshot(self, "timeout", name, waited)
    d.waiting = d.waiting + 1   -- the caller was waiting too, until now
    emit(self, "timeout", hook_key(name), d)
    return nil, "timeout", d
  elseif st == CANCELLED then
    return nil, "cancelled"
  end
  return nil, "closed"
end

--- Acquires a client for key (nil = the default key).
-- Returns a lease, or nil, code[, detail] with code one of timeout, full,
-- closed, cancelled, create.
local ACQUIRE_OPTS = { timeout = true, cancel = true, on_drain = true }

-- pool.acquire(...) instead of pool:acquire(...): say so, not "attempt to
-- index a nil value" from somewhere inside. (Not on checkout/checkin, whose
-- cost is measured against a bare table pool.)
local function not_a_pool(self, name)
  error("clientpool: " .. name .. " needs the pool as self, got " .. type(self) ..
        " (call pool:" .. name .. "(...) with a colon)", 3)
end
-- Checks acquire's options, raising at the level of acquire's caller;
-- returns the cancel token and the on_drain grace (nil: preserve).
local function acquire_opts(self, opts)
  if opts ~= nil then
    if type(opts) ~= "table" then
      error("clientpool: bad argument #2 to 'acquire' (options table expected, got " .. type(opts) .. ")", 3)
    end
    -- a misspelt option (timout = 1) must not pass silently; a table seen
    -- once is not walked again (weak cache: no pairs() on the hot path)
    local seen = self._opts_seen
    if not seen[opts] then
      for name in pairs(opts) do
        if not ACQUIRE_OPTS[name] then
          error("clientpool: bad argument #2 to 'acquire' (unknown option '" .. tostring(name) ..
                "'; the options are timeout, cancel and on_drain)", 3)
        end
      end
      seen[opts] = true
    end
  end
  local token = opts and opts.cancel
  if token ~= nil and getmetatable(token) ~= Token then
    error("clientpool: bad argument #2 to 'acquire' (opts.cancel must be a clientpool.token())", 3)
  end
  if opts and opts.timeout ~= nil then
    local t = opts.timeout
    if type(t) ~= "number" or t ~= t or t < 0 or t == math_huge then
      error("clientpool: bad argument #2 to 'acquire' (opts.timeout must be a finite number >= 0, got "
            .. tostring(t) .. ")", 3)
    end
  end
  local drain
  if opts and opts.on_drain ~= nil and opts.on_drain ~= "preserve" then
    local od = opts.on_drain
    local grace = type(od) == "table" and od.cancel
    if type(grace) ~= "number" or grace ~= grace or grace < 0 or grace == math_huge then
      error("clientpool: bad argument #2 to 'acquire' (opts.on_drain must be \"preserve\" or " ..
            "{ cancel = grace_s } with a finite grace >= 0)", 3)
    end
    drain = grace
  end
  return token, drain
end

function Pool:acquire(key, opts)
  if getmetatable(self) ~= Pool then not_a_pool(self, "acquire") end
  local token, drain = acquire_opts(self, opts)
  local e = self._e
  if token and token._cancelled then return nil, "cancelled" end
  local k, name, kerr = key_id(self, key, "acquire")
  if not k then
    if kerr == core.EKEYS then return nil, "full", snapshot(self, "max_keys", name) end
    return nil, "closed"
  end
  if self._nwaiters > 0 then reap_if_full(self) end
  return acquire_from(self, key, opts, drain, k, name, e:acquire(k, now_of(self), true))
end

-- acquire from the engine's answer. Shared by Pool:acquire and the C fast
-- path (install_fastpath), which hands over whatever it does not finish.
function acquire_from(self, key, opts, drain, k, name, st, rec, l, g, validate, idle, pending, sentinel)
  if pending > 0 then pump(self) end
  local waited
  if st == MUST_WAIT then
    local ok
    ok, st, rec, l, g, validate, idle, waited, sentinel = wait_for(self, k, name, opts)
    if not ok then
      if st == STALE then return self:acquire(key, opts) end
      return nil, st, rec
    end
  elseif st == STALE then
    stale_key(self, k, name)
    return self:acquire(key, opts)
  elseif st == FULL then
    return nil, "full", snapshot(self, "full", name)
  elseif st == PAUSED then
    return nil, "paused", self._kpaused[name] or self._paused or "probe"
  elseif st == CLOSED then
    return nil, "closed"
  end
  local lease, code, err = on_grant(self, name, st, rec, l, g, validate, idle, waited, sentinel, drain)
  if lease or code then return lease, code, err end
  -- the idle record failed validate/unpark and is retired: look again (a
  -- tail call, not a loop: a loop here keeps the JIT from compiling the
  -- caller's acquire/release loop, "inner loop in root trace")
  return self:acquire(key, opts)
end

-- try_acquire's grant, in a coroutine of its own. Once a hook yielded, the
-- caller went on (nil, "timeout") and the coroutine is adopted: its lease
-- goes straight back to the pool, here, whoever resumes the coroutine (the
-- adopting task, or the scheduler itself: a hook that made this coroutine
-- ready at once, sleep(0), is resumed before that task runs).
local function try_grant(self, name, st, rec, l, g, validate, idle, sentinel)
  local lease, code, err = on_grant(self, name, st, rec, l, g, validate, idle, 0, sentinel)
  if self._adopted[co_running()] then
    if lease then lease:release() end
    return
  end
  return lease, code, err
end

--- Never waits or yields: an idle client, or a new one if create need not
-- yield; else nil, "timeout".
function Pool:try_acquire(key)
  if getmetatable(self) ~= Pool then not_a_pool(self, "try_acquire") end
  local e = self._e
  while true do
    local k, name, kerr = key_id(self, key, "try_acquire")
    if not k then
      if kerr == core.EKEYS then return nil, "full", snapshot(self, "max_keys", name) end
      return nil, "closed"
    end
    if self._nwaiters > 0 then reap_if_full(self) end
    local st, rec, l, g, validate, idle, pending, sentinel = e:acquire(k, now_of(self), true)
    if pending > 0 then pump(self) end
    if st == MUST_WAIT then
      e:key_forget(k)
      pump(self)
      return nil, "timeout", snapshot(self, "timeout", name, 0)
    elseif st == FULL then
      return nil, "full", snapshot(self, "full", name)
    elseif st == PAUSED then
      return nil, "paused", self._kpaused[name] or self._paused or "probe"
    elseif st == CLOSED then
      return nil, "closed"
    elseif st == STALE then
      stale_key(self, k, name)
      return self:try_acquire(key)
    end
    -- where the host cannot yield at all (OpenResty's log, set, filter and
    -- init_worker phases, which also refuse its coroutine API), no hook can
    -- yield either: the grant runs right here
    local yieldable = self._sched.yieldable
    if yieldable and not yieldable() then
      local lease, code, err = on_grant(self, name, st, rec, l, g, validate, idle, 0, sentinel)
      if lease or code then return lease, code, err end
    else
      -- run the grant in a coroutine of its own: if a hook yields, the work
      -- finishes in the background and this caller does not wait for it
      local co = co_create(try_grant)
      local ok, lease, code, err = co_resume(co, self, name, st, rec, l, g, validate, idle, sentinel)
      if co_status(co) == "suspended" then
        self._adopted[co] = true
        self:_adopt(co, lease, code, err)
        return nil, "timeout", snapshot(self, "timeout", name, 0)
      end
      if not ok then error(lease, 0) end
      if lease or code then return lease, code, err end
    end
  end
end

-- A grant started by try_acquire yielded in a hook: the scheduler resumes it
-- (its yields are passed through a task), and a lease it produces is
-- released straight back to the pool.
function Pool:_adopt(co, ...)
  local first = pack(...)
  self._sched.spawn(function()
    local r = first
    while co_status(co) == "suspended" do
      r = pack(co_resume(co, co_yield(unpack(r, 1, r.n))))
      if not r[1] then log(self, "background acquisition failed: " .. tostring(r[2])); return end
      r = pack(unpack(r, 2, r.n))
    end
    -- (try_grant released the lease, if any)
  end)
end

--- acquire, pcall fn(client, lease, ...), then release (destroy on error).
-- Returns fn's results, or nil, code[, detail] when nothing was acquired;
-- an error in fn is raised again after the client is destroyed.
function Pool:with(key, fn, ...)
  if getmetatable(self) ~= Pool then not_a_pool(self, "with") end
  if type(fn) ~= "function" then
    error("clientpool: bad argument #2 to 'with' (function expected, got " .. type(fn) .. ")", 2)
  end
  if key ~= nil and type(key) ~= "string" then
    error("clientpool: bad argument #1 to 'with' (key must be a string or nil, got " .. type(key) .. ")", 2)
  end
  local lease, code, detail = self:acquire(key)
  if not lease then return nil, code, detail end
  local r = pack(ycall(fn, lease.client, lease, ...))
  if r[1] then
    lease:release()
    return unpack(r, 2, r.n)
  end
  lease:release(false)
  error(r[2], 0)
end

--- Registers a listener: create, acquire, release, destroy, pause, resume,
-- timeout, leak. Listeners must not yield; their errors are logged.
function Pool:on(event, fn)
  if getmetatable(self) ~= Pool then not_a_pool(self, "on") end
  if not EVENTS[event] then
    error("clientpool: bad argument #1 to 'on' (unknown event '" .. tostring(event) .. "')", 2)
  end
  if type(fn) ~= "function" then
    error("clientpool: bad argument #2 to 'on' (function expected, got " .. type(fn) .. ")", 2)
  end
  local ls = self._on[event]
  if not ls then ls = {}; self._on[event] = ls end
  ls[#ls + 1] = fn
  return self
end

--- A plain table of counters; `keys` holds the same per key.
function Pool:stats()
  if getmetatable(self) ~= Pool then not_a_pool(self, "stats") end
  pump(self)
  reap_dead_waiters(self)
  local e = self._e
  local s = e:stats(-1, {})
  s.paused = self._paused
  s.floor_spent = self._spent
  local keys = {}
  for name, k in pairs(self._kids) do
    local ks = e:stats(k, {})
    if ks then ks.paused = self._kpaused[name] or false; keys[name] = ks end
  end
  s.keys = keys
  return s
end

--- Stops admission, wakes waiters with "closed", destroys idle clients;
-- leases stay with their holders and their clients are destroyed at release.
-- Starts the drain: leases acquired with on_drain = { cancel = grace } have
-- their cancellation fired grace seconds from now.
function Pool:close()
  if getmetatable(self) ~= Pool then not_a_pool(self, "close") end
  if self._closed then return end
  self._closed = true
  self._drain_started = clock(self)
  self._e:close(now_of(self))
  pump(self)
  self._timer_at = nil
  if self._timer_h then self._sched.wake(self._timer_h) end
  if self._run_h then self._sched.wake(self._run_h) end
  for _, lease in pairs(self._held) do
    if lease._g and lease._drain then self:_schedule_cancel(lease) end
  end
end

function Pool:_schedule_cancel(lease)
  local grace = lease._drain
  if grace <= 0 then
    fire_cancel(lease)
    return
  end
  local sched = self._sched
  -- background: in nginx a close() from a request must not hold it open
  local bg = sched.background or sched.spawn
  bg(function()
    sched.sleep(grace)
    if lease._g then fire_cancel(lease) end
  end)
end

--- close(), then waits (yields) until every lease is back. Returns true, or
-- nil, "timeout", detail when `timeout` seconds pass first.
function Pool:drain(timeout)
  if getmetatable(self) ~= Pool then not_a_pool(self, "drain") end
  if timeout ~= nil and (type(timeout) ~= "number" or timeout ~= timeout or timeout < 0
                         or timeout == math_huge) then
    error("clientpool: bad argument #1 to 'drain' (timeout must be a finite number >= 0, got "
          .. tostring(timeout) .. ")", 2)
  end
  self:close()
  local e = self._e
  if e:stats(-1, self._scratch).leases == 0 then return true end
  local sched = self._sched
  local h, why = sched.current()
  if not h then
    error("clientpool: drain() must wait for leases, but " .. tostring(why or "the caller cannot yield"), 2)
  end
  local hs = self._drain_hs
  if not hs then hs = {}; self._drain_hs = hs end
  hs[h] = true
  local deadline = timeout and clock(self) + timeout
  while e:stats(-1, self._scratch).leases > 0 do
    if deadline and clock(self) >= deadline then
      hs[h] = nil
      return nil, "timeout", snapshot(self, "timeout", DEFAULT, timeout)
    end
    sched.wait(h, deadline)
  end
  hs[h] = nil
  return true
end

--- Fires every held lease's cancellation; only once admission stopped.
function Pool:cancel_active()
  if getmetatable(self) ~= Pool then not_a_pool(self, "cancel_active") end
  if not self._closed then
    error("clientpool: cancel_active() is allowed only after close() or drain() stopped admission", 2)
  end
  for _, lease in pairs(self._held) do
    if lease._g then fire_cancel(lease) end
  end
end

-- The engine key of a scope (-1: the pool), raising at the caller of the
-- method that called it; nil when the key cannot be opened (closed pool,
-- max_keys keys exist): such a key has nothing to pause, resume or retire.
-- A scope key (not nil): raises for one that is not a string, at the caller
-- of the method that called scope_key or known_key; then carries out the
-- queued events: called from a listener (a destroy listener that pauses its
-- key), the key may have been forgotten by an event not yet carried out,
-- and a pause of its old id would be lost.
local function scope_name(self, key, fname, argn)
  if type(key) ~= "string" then
    error("clientpool: bad argument #" .. argn .. " to '" .. fname .. "' (key must be a string or nil, got "
          .. type(key) .. ")", 4)
  end
  if self._e:pending() > 0 then pump(self) end
end

local function scope_key(self, key, fname, argn)
  if key == nil then return -1, nil end
  scope_name(self, key, fname, argn)
  return key_id(self, key, fname)
end

-- As scope_key, for calls that have nothing to do for a key the pool does
-- not know (resume, retire): its id, or nil (never opens one: a key opened
-- here would be held for good, against max_keys).
local function known_key(self, key, fname, argn)
  if key == nil then return -1, nil end
  scope_name(self, key, fname, argn)
  return self._kids[key], key
end

-- Pauses the pool (name nil) or a key; resume_after schedules the resume.
function Pool:_pause(reason, key, resume_after, fname)
  local e = self._e
  local k, name = scope_key(self, key, fname, 2)
  if not k then
    if self._closed then return end
    error("clientpool: " .. fname .. "(): cannot open key '" .. key .. "' (max_keys keys exist)", 3)
  end
  if name then
    -- a paused key must not be forgotten; a warm key is pinned already (and
    -- pinning it again would take it off the warm floor)
    if not self._warm[name] then e:key_pin(k, true) end
    self._kpaused[name] = reason
  else
    self._paused = reason
  end
  -- the pause's generation, unique in the pool: its resume_after timer acts
  -- only if this pause is still the scope's own (not resumed, not paused
  -- again; a key forgotten and opened again gets new ones)
  local scope = name or false
  local gen = self._pgen_next + 1
  self._pgen_next = gen
  self._pgen[scope] = gen
  local _, pending = e:pause(k, now_of(self))
  if pending > 0 then pump(self) end
  emit(self, "pause", key, reason)
  if resume_after then
    local sched = self._sched
    local bg = sched.background or sched.spawn
    bg(function()
      sched.sleep(resume_after)
      if self._pgen[scope] == gen and not self._closed then self:resume(key) end
    end)
  end
end

--- Pauses admission of the pool, or of one key: new acquisitions queue (or
-- fail with "paused" under pause_mode = "fail") until resume().
function Pool:pause(reason, key)
  if getmetatable(self) ~= Pool then not_a_pool(self, "pause") end
  if type(reason) ~= "string" then
    error("clientpool: bad argument #1 to 'pause' (reason must be a string, got " .. type(reason) .. ")", 2)
  end
  if key ~= nil and type(key) ~= "string" then
    error("clientpool: bad argument #2 to 'pause' (key must be a string or nil, got " .. type(key) .. ")", 2)
  end
  self:_pause(reason, key, nil, "pause")
end

--- Resumes the pool or a key (half-open first when the pool has probe = true).
function Pool:resume(key)
  if getmetatable(self) ~= Pool then not_a_pool(self, "resume") end
  local e = self._e
  local k, name = known_key(self, key, "resume", 1)
  if not k then                  -- never paused: a paused key is pinned, so known
    if name then self._kpaused[name] = nil; self._pgen[name] = nil end   -- (stale entries, if any)
    return
  end
  local scope = name or false
  local was
  if name then
    was = self._kpaused[name]
    self._kpaused[name] = nil
    local _, pending = e:resume(k, self._c.probe, now_of(self))
    if pending > 0 then pump(self) end
    -- unpinned only after the resume (an empty key is forgotten at once),
    -- and not while half-open: the key's gate must outlive its probe, and
    -- probe_passed unpins it when the probe continues
    if not self._warm[name] and not self._c.probe then e:key_pin(k, false) end
  else
    was = self._paused
    self._paused = false
    local _, pending = e:resume(k, self._c.probe, now_of(self))
    if pending > 0 then pump(self) end
  end
  self._pgen[scope] = nil       -- no resume_after timer of an earlier pause acts now
  pump(self)
  if was then emit(self, "resume", key) end
end

--- Retires every client created before now, of the pool or of one key: idle
-- ones at once, leased ones at their release (failover, DNS changes).
function Pool:retire(key)
  if getmetatable(self) ~= Pool then not_a_pool(self, "retire") end
  local k = known_key(self, key, "retire", 1)
  if not k then return end       -- a key the pool does not know has no clients
  local _, pending = self._e:retire_before(k, -1, now_of(self))
  if pending > 0 then pump(self) end
end

-- The lease (slot l, generation g) of key name reports an outcome that
-- continues: if it was a probe, its gate opens, and a key pinned only for
-- its pause and probe is unpinned (forgotten once empty).
local function probe_passed(self, l, g, name)
  local e = self._e
  local was, pending = e:probe_ok(l, g, now_of(self))
  if pending > 0 then pump(self) end
  if was and not self._warm[name] and not self._kpaused[name] then
    local k = self._kids[name]
    if k then
      e:key_pin(k, false)
      pump(self)
    end
  end
end

-- Applies a policy directive for a lease.
local CONTINUE = { continue = true }
function Pool:_apply(d, lease)
  if d == nil then d = CONTINUE end
  if type(d) ~= "table" then
    error("clientpool: the policy returned a " .. type(d) .. " (a directive table or nil expected)", 3)
  end
  local e = self._e
  if d.retire ~= nil then
    if d.retire ~= "client" and d.retire ~= "key" then
      error("clientpool: policy directive 'retire' must be \"client\" or \"key\", got " .. tostring(d.retire), 3)
    end
    local rec = lease._r
    -- "key": this client and every client of its key created before it,
    -- by creation order (clients made at the same clock reading included)
    if d.retire == "key" then e:retire_upto(rec, now_of(self)) end
    e:retire(rec, now_of(self))
  end
  if d.pause ~= nil then
    if type(d.pause) ~= "string" then
      error("clientpool: policy directive 'pause' must be a reason string, got " .. type(d.pause), 3)
    end
    if d.scope ~= nil and d.scope ~= "key" and d.scope ~= "pool" then
      error("clientpool: policy directive 'scope' must be \"key\" or \"pool\", got " .. tostring(d.scope), 3)
    end
    local ra = d.resume_after
    if ra ~= nil and (type(ra) ~= "number" or ra ~= ra or ra < 0 or ra == math_huge) then
      error("clientpool: policy directive 'resume_after' must be a finite number >= 0, got " .. tostring(ra), 3)
    end
    -- the default key is the pool's one upstream: its pause is the pool's,
    -- so pool:resume() lifts it
    local key = d.scope == "key" and lease._key ~= DEFAULT and lease._key or nil
    self:_pause(d.pause, key, ra, "observe")
  else
    -- an outcome that continues: a probe lease opens its gate
    probe_passed(self, lease._l, lease._g, lease._key)
  end
  pump(self)
  return d
end

-- A refill failed (create, or park of what it created): one strike more;
-- past `restarts` in a row the floor is spent.
local function refill_failed(self, why)
  self._strikes = self._strikes + 1
  if self._strikes > self._c.restarts then
    self._spent = true
    log(self, string_format("warm floor spent after %d failed refills in a row (last: %s); " ..
      "acquire still creates lazily", self._strikes, why))
  end
end

local function refill_task(self, rec, name)
  local ok, client, err = ycall(self._create, hook_key(name))
  local e = self._e
  self._refilling = self._refilling - 1
  if ok and client ~= nil then
    self._clients[rec] = client
    local _, pending = e:created(rec, true, now_of(self))
    -- its events first: a pool closed meanwhile destroys it at once, unparked
    if pending > 0 then pump(self) end
    -- an idle record keeps what park returns (OpenResty: nothing)
    local parked = true
    if self._park and self._clients[rec] == client then
      local pok, stored = pcall(self._park, client, hook_key(name))
      if pok then
        self._clients[rec] = stored
        self._parked[rec] = true
      else
        parked = false
        log(self, "park hook failed: " .. tostring(stored))
        local _, p2 = e:retire(rec, now_of(self))
        if p2 > 0 then pump(self) end
        -- a strike like a failed create: a park that always fails must not
        -- make the floor create and destroy for good
        refill_failed(self, "park hook failed: " .. tostring(stored))
      end
    end
    if parked then self._strikes = 0 end
    emit(self, "create", hook_key(name), client)
  else
    local _, pending = e:created(rec, false, now_of(self))
    if pending > 0 then pump(self) end
    refill_failed(self, tostring(ok and (err or "create returned nil") or client))
  end
  if self._run_h then self._sched.wake(self._run_h) end
end

-- run()'s loop, in a yieldable protected call: on PUC Lua 5.1 its own
-- coroutine, so it takes its handle itself (as the timer task does).
local function run_loop(self)
  local sched, e = self._sched, self._e
  local h = sched.current()
  self._run_h = h
  local pending = e:floor(true, now_of(self))
  if pending > 0 then pump(self) end
  while not self._closed do
    while not self._spent and self._refilling < REFILL_CONCURRENCY do
      local rec, k
      rec, k, pending = e:refill(now_of(self))
      if pending > 0 then pump(self) end
      if not rec then break end
      self._refilling = self._refilling + 1
      sched.spawn(refill_task, self, rec, self._knames[k])
    end
    if self._closed then break end
    self._run_waits = true
    sched.wait(h, nil)
    self._run_waits = false
  end
end

--- Keeps min_idle idle clients for each warm key until close/drain: refills
-- after losses, a few creates at a time; after more than `restarts` failed
-- refills in a row the floor is spent until a fresh client is granted.
-- Also returns when the adapter's wait raises (logged; OpenResty raises in
-- an exiting worker). Expiry of idle clients runs by the pool's timer
-- whether or not run() runs.
function Pool:run()
  if getmetatable(self) ~= Pool then not_a_pool(self, "run") end
  local sched = self._sched
  local h, why = sched.current()
  if not h then
    error("clientpool: run() waits: call it from a coroutine the scheduler runs (" .. tostring(why) .. ")", 2)
  end
  if self._run_h then error("clientpool: run() is already running", 2) end
  if self._closed then return end
  self._run_h = h
  local ok, err = ycall(run_loop, self)
  self._e:floor(false, now_of(self))
  self._run_h = nil
  if not ok then
    if not self._run_waits then error(err, 0) end
    -- the adapter ended the wait with an error (OpenResty: the worker is
    -- exiting): run() returns, and the error goes to the adapter's log
    self._run_waits = false
    log(self, "run() stopped: " .. tostring(err))
  end
end

---------------------------------------------------------------------------
-- Lease
---------------------------------------------------------------------------

-- lease.release() instead of lease:release(): say so.
local function not_a_lease(self, name, level)
  error("clientpool: " .. name .. " needs the lease as self, got " .. type(self) ..
        " (call lease:" .. name .. "(...) with a colon)", level or 3)
end

local function check_held(lease, what)
  if getmetatable(lease) ~= Lease then not_a_lease(lease, what, 4) end
  if lease._g == nil then error("clientpool: lease released (" .. what .. ")", 3) end
end

-- Parks a client that is being released for reuse (lease slot l,
-- generation g) before the engine sees the release: the record may go to a
-- waiter at once, and that waiter must find it parked (in OpenResty: in
-- nginx's keepalive pool, not as the releasing request's cosocket). Not
-- when the release closes it anyway (the engine says: retired, past
-- max_lifetime, pool closed; a stale handle parks nothing either), nor
-- while co-holders other than `holder` (a lease, or a checkout handle)
-- still use it. Returns false when park failed (logged): the client is
-- then retired at the release.
local function park_first(self, rec, client, name, holder, l, g, now)
  if client == nil or self._clients[rec] ~= client or self._parked[rec] then return true end
  if self._e:release_closes(l, g, now) ~= false then return true end
  local rl = self._rec_leases
  if rl and rl[rec] then
    for other in pairs(rl[rec]) do
      if other ~= holder then return true end
    end
  end
  local ok, stored = pcall(self._park, client, hook_key(name))
  if not ok then
    log(self, "park hook failed: " .. tostring(stored))
    return false
  end
  self._clients[rec] = stored
  self._parked[rec] = true
  return true
end

--- Returns the client for reuse; release(false) retires it. Idempotent;
-- never yields.
function Lease.release(lease, reuse)
  if getmetatable(lease) ~= Lease then not_a_lease(lease, "release") end
  if reuse ~= nil and reuse ~= true and reuse ~= false then
    error("clientpool: bad argument #1 to 'release' (boolean or nil expected, got " .. type(reuse) .. ")", 2)
  end
  local g = lease._g
  if g == nil then return end                 -- idempotent
  local self = lease._p
  local fast = self._frel                     -- the C fast path (install_fastpath)
  if fast and fast(lease, reuse) then return end
  local rec, name = lease._r, lease._key
  local client = self._clients[rec]
  if reuse == false then
    finish_lease(self, lease, BY.error)
  elseif self._park and not park_first(self, rec, client, name, lease, lease._l, g, now_of(self)) then
    finish_lease(self, lease, BY.retired)     -- as before: a failed park retires it
  else
    finish_lease(self, lease, nil)
  end
  lease.client = nil
  if self._on.release then emit(self, "release", hook_key(name), client, reuse ~= false) end
end

--- Retires the client. Idempotent; never yields.
function Lease:destroy()
  if getmetatable(self) ~= Lease then not_a_lease(self, "destroy") end
  return self:release(false)
end

--- Passes the outcome of an operation to the pool's policy, which may
-- pause admission. Never touches the outcome or the operation; leases held
-- stay with their callers. Returns the directive (or nil).
function Lease:observe(outcome)
  check_held(self, "observe")
  local p = self._p
  local policy = p._c.policy
  local d
  if policy then d = policy(outcome, self) end
  return p:_apply(d, self)
end

--- Whether the lease's cancellation fired (drain grace over, cancel_active,
-- or its shared client lost by a co-holder).
function Lease:cancelled()
  check_held(self, "cancelled")
  return self._cancelled == true
end

--- Calls fn(lease) when the lease's cancellation fires (at once if it has).
function Lease:on_cancel(fn)
  check_held(self, "on_cancel")
  if type(fn) ~= "function" then
    error("clientpool: bad argument #1 to 'on_cancel' (function expected, got " .. type(fn) .. ")", 2)
  end
  if self._cancelled then
    fn(self)
    return
  end
  local fns = self._on_cancel
  if not fns then fns = {}; self._on_cancel = fns end
  fns[#fns + 1] = fn
end

Lease.__close = function(lease, err)
  if err ~= nil then lease:release(false) else lease:release() end
end

Lease.__tostring = function(lease)
  if lease._g == nil then return "clientpool.Lease (released)" end
  return string_format("clientpool.Lease: key '%s'", lease._key)
end

---------------------------------------------------------------------------
-- Zero-allocation form: checkout / checkin
---------------------------------------------------------------------------

-- A checkout handle packs the lease slot (low 21 bits) and its generation
-- (32 bits): below 2^53, exact in a double and in a Lua 5.3+ integer. The
-- engine checks the generation, so a stale handle is a no-op.
local HSLOTS = 2097152
-- Each pool offsets the generation in its handles by a base of its own, so
-- a handle of another pool, or a small forged integer, does not name one of
-- this pool's leases (generations start at 0 in every pool).
local GENS = 4294967296
local BY_ERROR = BY.error

-- checkout's slow path: anything but an idle client usable as it is (no
-- key id yet, a refusal, a create, unpark or validate). Returns client,
-- nil, rec, lease, gen, waited or nil, code[, detail]. No loop: a retry is a
-- tail call. (LuaJIT: a loop here would abort every trace recorded through a
-- create, and enough aborts blacklist checkout itself, hot path included.)
local function checkout_grant(self, key, k, name, st, rec, l, g, validate, idle)
  local waited
  if k == nil then
    local kerr, pending
    k, name, kerr = key_id(self, key, "checkout")
    if not k then
      if kerr == core.EKEYS then return nil, "full", snapshot(self, "max_keys", name) end
      return nil, "closed"
    end
    if self._nwaiters > 0 then reap_if_full(self) end
    st, rec, l, g, validate, idle, pending = self._e:acquire(k, now_of(self), false)
    if pending > 0 then pump(self) end
    if st == MUST_WAIT then
      local ok
      ok, st, rec, l, g, validate, idle, waited = wait_for(self, k, name, nil, true)
      if not ok then
        if st == STALE then return checkout_grant(self, key, nil, name) end
        return nil, st, rec
      end
    elseif st == STALE then
      stale_key(self, k, name)
      return checkout_grant(self, key, nil, name)
    end
  end
  if st == FULL then
    return nil, "full", snapshot(self, "full", name)
  elseif st == PAUSED then
    return nil, "paused", self._kpaused[name] or self._paused or "probe"
  elseif st == CLOSED then
    return nil, "closed"
  end
  -- a leak sentinel while the hooks run (they may yield): if this coroutine
  -- dies meanwhile, the collector gives the lease or reservation back, as
  -- for acquire; the handle holds it once they are done
  local sentinel = self._e:sentinel(l, g) -- luacheck: ignore sentinel (kept alive by this frame)
  if st == GRANT_CREATE then
    local client, code, err = create_client(self, name, rec, nil)
    if client == nil then return nil, code, err end
    self._e:disarm(l, g)
    return client, nil, rec, l, g, waited
  end
  local client, st2, rec2, l2, g2, v2, i2 = ready_idle(self, name, rec, l, g, validate, idle, false)
  if client ~= nil then
    self._e:disarm(l, g)
    return client, nil, rec, l, g, waited
  end
  -- the idle record failed validate/unpark and is retired: this caller was
  -- granted again in its place (or, out of memory, looks again from scratch)
  if st2 == GRANT_IDLE or st2 == GRANT_CREATE or st2 == CLOSED then
    return checkout_grant(self, key, k, name, st2, rec2, l2, g2, v2, i2)
  end
  return checkout_grant(self, key, nil, name)
end

-- Raises for a checkout key that is neither a string nor nil, at the
-- level of checkout's caller. (Called before checkout_from's tail call: on
-- Lua 5.1 an error raised after a tail call has no position.)
local function check_checkout_key(key)
  if key ~= nil and type(key) ~= "string" then
    error("clientpool: bad argument #1 to 'checkout' (key must be a string or nil, got " .. type(key) .. ")", 3)
  end
end

-- checkout from the engine's answer to acquire (st nil: no key id yet, or
-- waiters to reap first). Shared by Pool:checkout and the C fast path's
-- wrapper (fastpath below), which hands over whatever it does not finish.
local function checkout_from(self, key, k, name, st, rec, l, g, validate, idle, pending)
  if pending and pending > 0 then pump(self) end
  local client, waited
  if st == MUST_WAIT then
    -- waited for here, not in checkout_grant: a waiting coroutine's stack
    -- is one frame shallower (memory per waiter)
    local ok
    ok, st, rec, l, g, validate, idle, waited = wait_for(self, k, name, nil, true)
    if not ok then
      if st ~= STALE then return nil, st, rec end
      st, k = nil, nil            -- looked up and acquired again (checkout_grant)
    end
  elseif st == STALE then
    stale_key(self, k, name)
    st, k = nil, nil
  end
  if st == GRANT_IDLE and not self._parked[rec] and not (validate and self._validate) then
    client = self._clients[rec]
  else
    local code, w
    client, code, rec, l, g, w = checkout_grant(self, key, k, name, st, rec, l, g, validate, idle)
    if client == nil then return nil, code, rec end
    waited = waited or w
  end
  if l >= HSLOTS then
    self._e:release(l, g, -1, now_of(self))
    pump(self)
    error("clientpool: checkout: more than " .. HSLOTS .. " leases at once (use acquire)", 2)
  end
  local h = ((g + self._hbase) % GENS) * HSLOTS + l
  self._co_rec[l + 1] = rec
  self._co_key[l + 1] = name
  if self._early_leaks then report_early(self, l, g) end
  local rl = self._rec_leases
  if rl then
    local set = rl[rec]
    if not set then set = setmetatable({}, WEAK_KEYS); rl[rec] = set end
    set[h] = true
  end
  if self._on.acquire then emit(self, "acquire", hook_key(name), client, waited) end
  return client, h
end

--- Acquires a client without a lease object: returns client, h (an integer
-- handle for checkin) or nil, code[, detail] as acquire does, and may wait
-- as acquire does. Allocates nothing when an idle client is at hand. No
-- leak detection by the collector: a handle never checked in holds its
-- client until the pool is gone (leak_threshold still reports it).
function Pool:checkout(key)
  local name = key
  if name == nil then name = DEFAULT end
  local k = self._kids[name]      -- only strings are keys: anything else takes the slow path
  if k ~= nil then
    local now
    if not self._mono then now = self._sched.now() end
    if self._nwaiters > 0 then reap_if_full(self) end
    return checkout_from(self, key, k, name, self._e:acquire(k, now, false))
  end
  check_checkout_key(key)
  return checkout_from(self, key, nil, name)
end

-- checkin's less common work: shared records, events, drain, park, listeners.
local function checkin_rest(self, h, rec, client, reuse, pending, name)
  local rl = self._rec_leases
  if rl and rl[rec] then rl[rec][h] = nil end
  if pending > 0 then pump(self) end
  if self._drain_hs then drain_wake(self) end
  if self._on.release then emit(self, "release", hook_key(name), client, reuse ~= false) end
end

-- Raises for bad checkin arguments, at the level of checkin's caller.
local function check_checkin_args(h, reuse)
  if type(h) ~= "number" or h < 0 or h % 1 ~= 0 or h >= 9007199254740992 then
    error("clientpool: bad argument #1 to 'checkin' (a handle from checkout expected, got " .. tostring(h) .. ")", 3)
  end
  if reuse ~= nil and reuse ~= true and reuse ~= false then
    error("clientpool: bad argument #2 to 'checkin' (boolean or nil expected, got " .. type(reuse) .. ")", 3)
  end
end

--- Ends a checkout: returns the client for reuse, or retires it when reuse
-- is false. A stale or repeated handle is a no-op: it never ends another
-- holder's lease. Never yields.
function Pool:checkin(h, reuse)
  check_checkin_args(h, reuse)
  local l = h % HSLOTS
  local cr = self._co_rec
  local rec = cr[l + 1]
  if rec == nil then return end                 -- no checkout holds the slot
  local client = self._clients[rec]
  local g = ((h - l) / HSLOTS - self._hbase) % GENS
  -- a checkout has no observe: its checkin for reuse is the outcome that
  -- lets a probe pass (checkin(h, false) lets the next acquisition probe)
  if reuse ~= false and self._c.probe then probe_passed(self, l, g, self._co_key[l + 1]) end
  local now
  if not self._mono then now = self._sched.now() end
  local reason = reuse == false and BY_ERROR or -1
  if reason == -1 and self._park then
    -- parked before the release (see park_first)
    if not park_first(self, rec, client, self._co_key[l + 1], h, l, g, now) then reason = BY.retired end
  end
  local ok, pending = self._e:release(l, g, reason, now)
  if not ok then return end                     -- stale: another holder's lease or none
  cr[l + 1] = nil
  if pending > 0 or self._rec_leases or self._drain_hs or self._park or self._on.release then
    checkin_rest(self, h, rec, client, reuse, pending, self._co_key[l + 1])
  end
end

-- The common case of checkout/checkin and acquire/release in C
-- (clientpool.core's fastpath): on PUC Lua, and LuaJIT with the JIT off,
-- most of a pair was this file's Lua. Installed as the pool's own methods
-- (Lease.release calls self._frel) only where that case needs no Lua at
-- all: the engine reads the real clock, capacity 1, no probe, no park hook.
-- (The FFI backend has no fastpath: under the JIT the Lua path compiles.)
-- Anything else the C closures hand back to checkout_from, acquire_from,
-- Pool.checkout/checkin/acquire or checkin_rest, so both paths share one
-- set of rules.
function install_fastpath(self, mod)
  local c = self._c
  if not mod.fastpath or not self._mono or c.capacity > 1 or c.probe or self._park then return end
  local checkout, checkin, acquire = Pool.checkout, Pool.checkin, Pool.acquire
  local fp = mod.fastpath(self._e, self, {
    kids = self._kids, clients = self._clients, parked = self._parked, co_rec = self._co_rec,
    co_key = self._co_key, on = self._on, default = DEFAULT, hbase = self._hbase,
    validate = self._validate and true or false, checkout = checkout, checkin = checkin,
    checkout_from = checkout_from, checkin_rest = checkin_rest,
    held = self._held, lease_mt = Lease, pump = pump, drain_wake = drain_wake,
  })
  -- the lease form: not with leak_threshold (each lease records where it
  -- was taken, in Lua). acquire stays a Lua function on every Lua: what it
  -- hands back to Pool.acquire must raise its argument errors at the
  -- caller's line, which a C caller (lua_callk) would hide; a lease pair is
  -- long enough that the extra call is a few percent
  if not c.leak_threshold then
    local ac = fp.acquire
    self._frel = fp.release
    self.acquire = function(s, key, opts)
      if opts == nil then
        local lease, got, k, st, rec, l, g, validate, idle, pending, sentinel = ac(s, key)
        if lease then return lease end
        if got == false then
          return acquire_from(s, key, nil, nil, k, key == nil and DEFAULT or key, st, rec, l, g, validate,
                              idle, pending, sentinel)
        end
      end
      -- nothing done: Pool.acquire does it all, its errors raised here first
      -- (on Lua 5.1 an error raised after a tail call has no position)
      if getmetatable(s) ~= Pool then not_a_pool(s, "acquire") end
      acquire_opts(s, opts)
      if key ~= nil and type(key) ~= "string" then
        error("clientpool: bad argument #1 to 'acquire' (key must be a string or nil, got " .. type(key) .. ")", 2)
      end
      return acquire(s, key, opts)
    end
  end
  if fp.direct then   -- Lua 5.3+: the C closures finish the job themselves
    self.checkout, self.checkin = fp.checkout, fp.checkin
    return
  end
  local co, ci = fp.checkout, fp.checkin
  self.checkout = function(s, key)
    local client, h, k, st, rec, l, g, validate, idle, pending = co(s, key)
    if h then return client, h end
    if h == nil then
      check_checkout_key(key)
      return checkout(s, key)
    end
    return checkout_from(s, key, k, key == nil and DEFAULT or key, st, rec, l, g, validate, idle, pending)
  end
  self.checkin = function(s, h, reuse)
    local done, rec, pending, l = ci(s, h, reuse)
    if done then return end
    if done == nil then
      check_checkin_args(h, reuse)
      return checkin(s, h, reuse)
    end
    checkin_rest(s, h, rec, s._clients[rec], reuse, pending, s._co_key[l + 1])
  end
end

_M.Pool = Pool
_M.Lease = Lease
_M.policy = require "clientpool.policy"
return _M
