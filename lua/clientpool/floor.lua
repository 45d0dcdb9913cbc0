--- clientpool.floor (internal): the warm floor, pool:run().
--
-- Owns run(): keeping min_idle idle clients for each warm key until close
-- or drain, refilling after losses a few creates at a time (the engine's
-- EV_REFILL wakes it; a key's failed creates, refills' too, back off in the
-- engine), and the strikes: `restarts` = N allows N + 1 failed refills in a
-- row, no more (refills in flight count), the last of them spends the floor;
-- a spent floor makes one refill after a pause of its own (SPENT_RETRY,
-- doubling while the retries fail, up to SPENT_RETRY_MAX), and a fresh
-- client (a refill's, or acquire.lua's create: fresh) ends it.

local base = require "clientpool.base"
local events = require "clientpool.events"
base.own_source()

local error, tostring, getmetatable = error, tostring, getmetatable
local string_format = string.format
local ycall, log, emit, hook_key, now_of, not_a_pool = base.ycall, base.log, base.emit, base.hook_key,
                                                       base.now_of, base.not_a_pool
local clock, park = base.clock, base.park
local pump = events.pump
local Pool = base.Pool
-- warm-floor creates in flight at once, so a restart does not open every
-- connection in the same instant
local REFILL_CONCURRENCY = 2
-- A spent floor's own backoff (docs/decisions.md "Warm floor"): one refill
-- 5 s after it was spent, then 10, 20, 40 and 60 s after each retry failed,
-- 60 s from then on. Acquisitions still create lazily meanwhile.
local SPENT_RETRY, SPENT_RETRY_MAX = 5, 60

local M = {}

events.on[base.core.EV_REFILL] = function(self)
  if self._run_h then self._sched.wake(self._run_h) end
end

-- A fresh client was granted: the warm floor's strikes start over.
function M.fresh(self)
  self._strikes = 0
  if self._spent then
    self._spent = false
    self._spends, self._retry_due = 0, false
    if self._run_h then self._sched.wake(self._run_h) end
  end
end
local fresh = M.fresh

-- A refill failed (create, or park of what it created): one strike more;
-- the (restarts + 1)th in a row spends the floor, logged once. A failed
-- retry of a spent floor doubles the pause before the next.
local function refill_failed(self, why)
  self._strikes = self._strikes + 1
  if self._spent then
    self._spends = self._spends + 1
    local pause = SPENT_RETRY * 2 ^ (self._spends - 1)
    if pause > SPENT_RETRY_MAX then pause = SPENT_RETRY_MAX end
    self._retry_at = clock(self) + pause
  elseif self._strikes > self._c.restarts then
    self._spent, self._spends, self._retry_due = true, 1, false
    self._retry_at = clock(self) + SPENT_RETRY
    log(self, string_format("warm floor spent after %d failed refills in a row (last: %s); " ..
      "acquire still creates lazily, the floor tries again in %gs", self._strikes, why, SPENT_RETRY))
  end
end

-- Whether run() may start one more refill now: under REFILL_CONCURRENCY,
-- and never more refills in a streak than restarts + 1 (failures so far
-- plus those in flight); a spent floor, its one retry when it is due.
local function may_refill(self)
  if self._spent then return self._retry_due and self._refilling == 0 end
  return self._refilling < REFILL_CONCURRENCY and self._strikes + self._refilling <= self._c.restarts
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
      local pok, perr = park(self, rec, client, hook_key(name))
      if not pok then
        parked = false
        local _, p2 = e:retire(rec, now_of(self))
        if p2 > 0 then pump(self) end
        -- a strike like a failed create: a park that always fails must not
        -- make the floor create and destroy for good
        refill_failed(self, "park hook failed: " .. tostring(perr))
      end
    end
    if parked then fresh(self) end
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
    if self._spent and not self._retry_due and clock(self) >= self._retry_at then self._retry_due = true end
    while may_refill(self) do
      local rec, k
      rec, k, pending = e:refill(now_of(self))
      if pending > 0 then pump(self) end
      if not rec then break end
      self._refilling = self._refilling + 1
      -- (a spent floor's one retry: the next is due once it failed)
      if self._spent then self._retry_due, self._retry_at = false, math.huge end
      sched.spawn(refill_task, self, rec, self._knames[k])
    end
    if self._closed then break end
    self._run_waits = true
    sched.wait(h, self._spent and not self._retry_due and self._retry_at or nil)
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
