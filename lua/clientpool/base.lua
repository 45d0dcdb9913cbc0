--- clientpool.base (internal): what every file of the driver may use.
--
-- Owns the engine binding's choice (clientpool.core or clientpool.ffi), the
-- Pool and Lease metatables (empty here: each file of the driver adds the
-- methods of its concept), the default key's name, protected calls that
-- let a hook yield, the pool's clock, log and listener emit. It requires no
-- other file of the driver: the files of lua/clientpool/ that make up the
-- driver (docs/design.md) only ever require files below them, with this
-- one at the bottom.

-- The engine binding (backend): clientpool.core (the C API) or, on LuaJIT
-- with the JIT on, clientpool.ffi, whose calls the JIT compiles (C API calls
-- it does not; with the JIT off, as on iOS or under -joff, FFI calls are
-- the slower ones). Both have the same surface. CLIENTPOOL_BACKEND=core|ffi
-- or the option `backend` overrides the default.
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

local type, pcall, select, tostring = type, pcall, select, tostring
local rawget, error, getmetatable = rawget, error, getmetatable
local co_create, co_resume, co_status, co_yield = coroutine.create, coroutine.resume, coroutine.status, coroutine.yield
local unpack = table.unpack or unpack
local monotime = core.monotime

local B = {}

B.core = core             -- the default backend (its constants are every backend's)
B.BACKEND = BACKEND
B.load_backend = load_backend
B.monotime = monotime
B.unpack = unpack
B.WEAK_KEYS = { __mode = "k" }  -- the metatable of tables with weak keys
B.DEFAULT = ""             -- the default key's name: hooks receive nil for it
B.BY = core.BY             -- reasons a client is closed: name -> code
local BY_NAME = {}
for name, code in pairs(core.BY) do BY_NAME[code] = name end
B.BY_NAME = BY_NAME

-- The user's objects. Each file of the driver adds the methods of its
-- concept; init.lua exports both.
local Pool = {}
Pool.__index = Pool
local Lease = {}
Lease.__index = Lease
B.Pool, B.Lease = Pool, Lease

-- A lease table (lease.lua's new_lease) holds its client and, at
-- SENTINEL, its leak sentinel, which holds its slot and generation; its
-- pool is named by its metatable (one per pool, lease.lua's metatable).
-- SENTINEL is the smaller layout, measured: on PUC Lua index 1 (an array
-- slot costs 16 B where a hash node costs 24-40 B: 120 B per lease on 5.1,
-- 104 B on 5.3, 96 B on 5.4), under LuaJIT a second hash field (112 B; the
-- array form costs 128 B there).
local SENTINEL = IS_JIT and "_s" or 1
B.SENTINEL = SENTINEL

-- The pool a lease belongs to, or nil for anything but a lease. (mt._pool,
-- not rawget: under the JIT a rawget here aborted the try_acquire loop's
-- trace, "leaving loop in root trace"; a metatable is a plain table.)
function B.pool_of(lease)
  local mt = getmetatable(lease)
  if type(mt) == "table" then return mt._pool end
  return nil
end

-- The lease's slot, generation, record and key id in pool self (the
-- engine's: E:guarded), or nil once it ended.
function B.slot_of(self, lease)
  local s = lease[SENTINEL]
  if s == nil then return nil end
  return self._e:guarded(s)
end

-- The name of the held lease's key in pool self (nil once it ended).
function B.lease_key(self, lease)
  local l, _, _, k = B.slot_of(self, lease)
  if l == nil then return nil end
  return self._knames[k]
end

-- Whether the lease is held (not ended).
function B.is_held(lease)
  return lease[SENTINEL] ~= nil
end

---------------------------------------------------------------------------
-- Protected calls that let the function yield.
---------------------------------------------------------------------------

local pack = table.pack or function(...) return { n = select("#", ...), ... } end
B.pack = pack

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
B.ycall = ycall

---------------------------------------------------------------------------
-- Clock, log, listeners, key names
---------------------------------------------------------------------------

function B.log(self, msg)
  local l = self._sched.log
  if l then pcall(l, msg) else io.stderr:write("clientpool: ", msg, "\n") end
end
local log = B.log

-- Parks rec's client with the park hook (protected, not yieldable: it runs
-- inside release); the record keeps what park returns (OpenResty: nothing).
-- Returns true, or false and the hook's error, which it logs.
function B.park(self, rec, client, key)
  local ok, stored = pcall(self._park, client, key)
  if not ok then
    log(self, "park hook failed: " .. tostring(stored))
    return false, stored
  end
  self._clients[rec] = stored
  self._parked[rec] = true
  return true
end

-- Runs fn(...) as a task of the pool's own: through the scheduler's
-- background where it has one (a task that must not hold the host open: in
-- nginx, a request that started it, or the worker at exit), else spawn.
function B.background(self, fn, ...)
  local sched = self._sched
  local bg = sched.background or sched.spawn
  bg(fn, ...)
end

function B.emit(self, name, ...)
  local ls = self._on[name]
  if not ls then return end
  for i = 1, #ls do
    local ok, err = pcall(ls[i], ...)
    if not ok then log(self, "listener for '" .. name .. "' failed: " .. tostring(err)) end
  end
end

-- The key name hooks and listeners see: nil for the default key.
function B.hook_key(name)
  if name == B.DEFAULT then return nil end
  return name
end

-- The engine's time argument: nil lets the C binding read the monotonic clock.
function B.now_of(self)
  if self._mono then return nil end
  return self._sched.now()
end

-- The engine's time argument on the hot path (an acquisition's first
-- call; docs/performance.md "Time per turn"): the scheduler's time for the
-- turn running (self._turn: its turn_clock), so that a turn of many
-- acquisitions reads the clock once; outside a turn, as now_of. (Not for
-- a release: it starts the client's idle time, from which idle_timeout and
-- keepalive count, and stamped up to a turn early they would fire early.)
function B.turn_of(self)
  local c = self._turn
  if c then
    local t = c.now
    if t then return t end
  end
  if self._mono then
    -- (the FFI backend: the clock read here, not in the binding, so that
    -- the time is a number in and out of turns alike: one type less for
    -- the JIT's traces to split on; but not in a pool that needs no time,
    -- where the engine's untimed path reads none: a clock read was a third
    -- of a checkout pair under the JIT)
    local m = self._mclock
    if m and not self._untimed then return m() end
    return nil        -- (the engine reads the clock, only if it needs it)
  end
  return self._sched.now()
end

-- Whether the pool takes the turn's time (self._turn): where the scheduler
-- has one, and no promise would be broken by a time up to a turn old: not
-- with leak_threshold (a lease stamped early would be reported early) nor
-- with a validate hook and validate_after_idle (a client idle long enough
-- must not skip its validate because the turn's time says it was not).
-- new() and configure() call it.
function B.turn_setup(self)
  local c, t = self._c, self._sched.turn_clock
  if type(t) ~= "table" or c.leak_threshold or (self._validate and c.validate_after_idle) then t = nil end
  self._turn = t
end

function B.clock(self)
  if self._mono then return monotime() end
  return self._sched.now()
end

---------------------------------------------------------------------------
-- Errors at the user's line
---------------------------------------------------------------------------

-- The sources of the driver's files: a frame of one of them is the pool's
-- own, not the user's (outside_level). Each file adds itself.
local SOURCES = {}
function B.own_source(level)
  SOURCES[debug.getinfo((level or 1) + 1, "S").source] = true
end
B.own_source()

-- The stack level, counted as error() and debug.traceback() count from the
-- function that calls this one, of the first Lua frame outside the driver:
-- the user's code, past the pool's own frames, its C functions (the fast
-- path) and tail calls (frames of their own on Lua 5.1). nil if none.
function B.outside_level()
  local level = 3                       -- 1: here, 2: the caller
  while true do
    local info = debug.getinfo(level, "S")
    if info == nil then return nil end
    if not SOURCES[info.source] and info.what ~= "C" and info.what ~= "tail" then return level - 1 end
    level = level + 1
  end
end

-- pool.acquire(...) instead of pool:acquire(...): say so, not "attempt to
-- index a nil value" from somewhere inside. (Not on checkout/checkin, whose
-- cost is measured against a bare table pool.) level: as error() counts
-- from here (3: the caller's caller).
function B.not_a_pool(self, name, level)
  error("clientpool: " .. name .. " needs the pool as self, got " .. type(self) ..
        " (call pool:" .. name .. "(...) with a colon)", level or 3)
end

-- Raises for a key argument (number n of method fname) that is neither a
-- string nor nil, at the level of the method's caller.
function B.check_key_arg(key, n, fname)
  if key ~= nil and type(key) ~= "string" then
    error("clientpool: bad argument #" .. n .. " to '" .. fname .. "' (key must be a string or nil, got " ..
          type(key) .. ")", 3)
  end
end

return B
