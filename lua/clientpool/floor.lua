--- clientpool.floor (internal): the warm floor, pool:run().
--
-- Owns run(): keeping min_idle idle clients for each warm key until close
-- or drain, refilling after losses a few creates at a time (the engine's
-- EV_REFILL wakes it), and the strikes: more than `restarts` failed refills
-- in a row spend the floor until a fresh client is granted (fresh, called
-- by acquire.lua's create).

local base = require "clientpool.base"
local events = require "clientpool.events"
base.own_source()

local error, tostring, getmetatable, pcall = error, tostring, getmetatable, pcall
local string_format = string.format
local ycall, log, emit, hook_key, now_of, not_a_pool = base.ycall, base.log, base.emit, base.hook_key,
                                                       base.now_of, base.not_a_pool
local pump = events.pump
local Pool = base.Pool
-- warm-floor creates in flight at once, so a restart does not open every
-- connection in the same instant
local REFILL_CONCURRENCY = 2

local M = {}

events.on[base.core.EV_REFILL] = function(self)
  if self._run_h then self._sched.wake(self._run_h) end
end

-- A fresh client was granted: the warm floor's strikes start over.
function M.fresh(self)
  self._strikes = 0
  if self._spent then
    self._spent = false
    if self._run_h then self._sched.wake(self._run_h) end
  end
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
    local why = ok and (err or "create returned nil") or client
    self._create_err[name] = why   -- (the key backs off too: what a refused acquisition returns)
    if self._on.create_failed then emit(self, "create_failed", hook_key(name), why) end
    refill_failed(self, tostring(why))
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

return M
