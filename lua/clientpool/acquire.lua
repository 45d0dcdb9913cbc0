--- clientpool.acquire (internal): acquire, try_acquire, with, and waiting.
--
-- Owns an acquisition from the engine's first answer to a lease: the
-- refusals, the wait in the FIFO queue (wait_for: registration, claim,
-- timeout, cancel tokens), the grant (on_grant: an idle record made usable
-- by unpark and validate, ready_idle, or a reservation filled by create,
-- create_client) and try_acquire's grant in a coroutine of its own.
-- checkout.lua builds the zero-allocation form on the same functions
-- (wait_for, ready_idle, create_client, acquire_from, acquire_opts).
--
-- A grant travels as a record (grant()) on the paths that wait, create,
-- validate or unpark, which allocate anyway. The common case, an idle
-- client at hand, stays positional from the engine's answer to the lease
-- (acquire_from's parameters are the engine's multiple returns): a record
-- there would allocate per acquisition (bench B4.alloc_lease). It is one
-- JIT trace from Pool:acquire to new_lease: no loop and no closure on that
-- path (a retry is a tail call), or LuaJIT aborts the trace and blacklists
-- acquire (spec/jit_spec.lua).

local type, error, pairs, tostring, getmetatable = type, error, pairs, tostring, getmetatable
local math_huge = math.huge
local co_create, co_resume, co_status, co_yield = coroutine.create, coroutine.resume, coroutine.status, coroutine.yield
local co_running = coroutine.running

local base = require "clientpool.base"
base.own_source()
local core, Pool = base.core, base.Pool
local GRANT_IDLE, GRANT_CREATE, MUST_WAIT, PENDING = core.GRANT_IDLE, core.GRANT_CREATE, core.MUST_WAIT, core.PENDING
local FULL, CLOSED, STALE, TIMEOUT, CANCELLED = core.FULL, core.CLOSED, core.STALE, core.TIMEOUT, core.CANCELLED
local pack, unpack, ycall, log, emit = base.pack, base.unpack, base.ycall, base.log, base.emit
local hook_key, now_of, clock, outside_level = base.hook_key, base.now_of, base.clock, base.outside_level
local turn_of = base.turn_of
local not_a_pool, check_key_arg = base.not_a_pool, base.check_key_arg
local events = require "clientpool.events"
local pump, reap_if_full = events.pump, events.reap_if_full
local keys = require "clientpool.keys"
local key_id, stale_key = keys.key_id, keys.stale_key
local stats = require "clientpool.stats"
local snapshot, REFUSED, refused, no_key = stats.snapshot, stats.REFUSED, stats.refused, stats.no_key
local timed_out = stats.timed_out
local floor = require "clientpool.floor"
local owners_before_wait = require("clientpool.owners").before_wait
local lease_m = require "clientpool.lease"
local new_lease, SENTINEL = lease_m.new_lease, lease_m.SENTINEL
local Token = require("clientpool.token").Token

local M = {}

-- PUC Lua 5.1's pcall cannot yield, so a hook runs in a pass-through
-- coroutine nested in the caller's (base.ycall): run detached, such a hook's
-- first turn could be taken by the scheduler directly (sleep(0)), leaving
-- the outer coroutine suspended for good. There the deadline bounds the
-- wait only, and the hooks run in the caller as before (docs/decisions.md).
local IS_51 = _VERSION == "Lua 5.1" and rawget(_G, "jit") == nil
local co_isyieldable = coroutine.isyieldable   -- (5.3+, LuaJIT)
local BY_INVALID = base.BY.invalid

-- A grant of the engine as a record: status, record, lease slot and
-- generation, whether validate is due, the seconds it sat idle, the
-- seconds its caller waited, its leak sentinel.
local function grant(st, rec, l, g, validate, idle, waited, sentinel)
  return { st = st, rec = rec, l = l, g = g, validate = validate, idle = idle, waited = waited,
           sentinel = sentinel }
end

-- (capacity > 1) Whether shared record rec was lost by a co-holder: a share
-- granted before the loss but not yet taken up (its caller had not run) is
-- not handed out. Like a client that failed validate, its caller looks
-- again, in its place (issue 18: it came back with a plain lease on the
-- lost client; the engine was right to grant it, the hand-over was late).
local function lost_share(self, rec)
  local lost = self._lost
  return lost ~= nil and lost[rec] == true
end
M.grant, M.lost_share = grant, lost_share

-- The granted idle record failed unpark or validate: it is retired as
-- invalid and the same caller granted again at once, keeping its place in
-- the queue (DESIGN: "the same caller looks again"): gr is that new grant
-- now (its status nil-like when nothing was granted: out of memory).
-- want: a leak sentinel for the new grant.
local function regrant(self, gr, want)
  local st, rec, l, g, validate, idle, pending, sentinel = self._e:regrant(gr.l, gr.g, now_of(self), want)
  if pending > 0 then pump(self) end
  gr.st, gr.rec, gr.l, gr.g, gr.validate, gr.idle, gr.sentinel = st, rec, l, g, validate, idle, sentinel
  return nil
end
M.regrant = regrant

-- Whether the running code is a grant whose caller left at its deadline
-- (see bounded): what it makes goes back to the pool, and it reports no
-- `acquire` (the caller's `timeout` was reported).
local function orphaned(self)
  return self._adopted[co_running()] == true
end

-- The `acquire` event of grant gr's lease, from its body: at once when its
-- caller has it at once (the code running is the caller's, or a bounded
-- body's first turn); none when the caller left (orphaned); when the caller
-- waits for a bounded body, later, as the caller takes the lease up
-- (gr.late: take_late below), for it may not take this one up after all.
local function acquired(self, name, gr, client)
  local a = self._adopted[co_running()]
  if a == nil then
    emit(self, "acquire", hook_key(name), client, gr.waited)
  elseif a ~= true then
    gr.late = true
  end
end

-- The granted idle record failed unpark or validate after its caller left
-- (its deadline passed while the hook ran in the background: see bounded):
-- the record is retired and nothing more is done for that caller (gr.st =
-- CLOSED: on_grant and checkout_grant end there, and nobody takes the
-- answer).
local function retire_orphan(self, gr)
  gr.sentinel = nil
  local _, pending = self._e:release(gr.l, gr.g, BY_INVALID, now_of(self))
  if pending > 0 then pump(self) end
  gr.st = CLOSED
  return nil
end

-- The parked client of idle record rec back from the unpark hook: the
-- client, or nil when the hook failed or returned nothing (logged; the
-- record keeps what it stored, for its destroy). No table: the granted
-- idle record's common case in OpenResty (bench B5) goes through here.
local function unpark(self, name, rec)
  local stored = self._clients[rec]
  local ok, c = ycall(self._unpark, stored, hook_key(name))
  if not ok or c == nil then
    if not ok then log(self, "unpark hook failed: " .. tostring(c)) end
    self._clients[rec] = stored
    return nil
  end
  self._clients[rec] = c
  self._parked[rec] = nil
  return c
end

-- The granted idle record of gr failed unpark or validate: retired, and
-- gr the caller's new grant (regrant), or CLOSED for a caller that left.
local function unusable(self, gr, want)
  if orphaned(self) then return retire_orphan(self, gr) end
  return regrant(self, gr, want)
end

-- Makes the granted idle record of gr usable: unpark and validate. Returns
-- the client, or nil when the record failed and gr holds a new grant (see
-- regrant).
local function ready_idle(self, name, gr, want)
  local rec = gr.rec
  if lost_share(self, rec) then return regrant(self, gr, want) end
  local client = self._clients[rec]
  if self._parked[rec] then
    client = unpark(self, name, rec)
    if client == nil then return unusable(self, gr, want) end
  end
  local v = self._validate
  if v and gr.validate then
    local ok, good = ycall(v, client, hook_key(name), gr.idle)
    if not ok or not good then
      if not ok then log(self, "validate hook failed: " .. tostring(good)) end
      return unusable(self, gr, want)
    end
    -- (capacity > 1) a co-holder lost it while validate ran (a share may be
    -- handed out meanwhile: docs/decisions.md "Shared leases")
    if lost_share(self, rec) then return regrant(self, gr, want) end
  end
  return client
end
M.ready_idle, M.unpark = ready_idle, unpark

-- Runs create for reservation rec. Returns the client, or nil, "create",
-- err. A lease given (acquire; checkout has none) is disarmed on failure and
-- gets the client on success.
local function create_client(self, name, rec, lease)
  local ok, client, err = ycall(self._create, hook_key(name))
  local e = self._e
  if not ok or client == nil then
    if ok then err = err or "create returned nil" else err = client end
    self._create_err[name] = err   -- what an acquisition refused by the backoff returns
    local _, pending = e:created(rec, false, now_of(self))
    if lease then lease[SENTINEL] = nil end   -- (after: see lease.lua's finish_lease)
    if pending > 0 then pump(self) end
    if self._on.create_failed then emit(self, "create_failed", hook_key(name), err) end
    return nil, "create", err
  end
  self._create_err[name] = nil
  self._clients[rec] = client
  if lease then lease.client = client end
  local _, pending = e:created(rec, true, now_of(self))
  if pending > 0 then pump(self) end
  floor.fresh(self)
  emit(self, "create", hook_key(name), client)
  return client
end
M.create_client = create_client

-- The grant gr (a record) made a lease: an idle record after unpark and
-- validate, or a reservation after create. Returns the lease, or nil,
-- code[, err], or nil alone when nothing was granted (out of memory): the
-- caller acquires anew.
local on_grant

-- on_grant's answer once gr's idle record failed and gr holds what the
-- caller was granted in its place (regrant): its lease, or nil, "closed",
-- or nil alone (nothing granted, out of memory: the caller acquires anew).
local function on_regrant(self, name, gr, drain)
  local st = gr.st
  if st == GRANT_IDLE or st == GRANT_CREATE then return on_grant(self, name, gr, drain) end  -- in its place
  if st == CLOSED then return nil, "closed" end
  return nil
end

function on_grant(self, name, gr, drain)
  local st = gr.st
  if st == GRANT_IDLE then
    local client = ready_idle(self, name, gr, gr.sentinel ~= nil)
    if client == nil then return on_regrant(self, name, gr, drain) end
    local lease = new_lease(self, gr.rec, gr.l, gr.g, client, gr.sentinel, drain)
    if self._on.acquire then acquired(self, name, gr, client) end
    return lease
  end
  -- the lease exists before create runs: if the creating coroutine is killed
  -- and collected, the lease's collection forfeits the reservation
  local lease = new_lease(self, gr.rec, gr.l, gr.g, nil, gr.sentinel, drain)
  local client, code, err = create_client(self, name, gr.rec, lease)
  if client == nil then return nil, code, err end
  if self._on.acquire then acquired(self, name, gr, lease.client) end
  return lease
end

---------------------------------------------------------------------------
-- Deadlines over the hooks (DESIGN section 3 "Deadlines", issue 12): a
-- caller's deadline bounds its own create and validate too. Such a grant
-- runs in a coroutine of its own (the technique of try_acquire); if a hook
-- yields, the coroutine goes on as a task (adopt_task) and the caller waits
-- for it until its deadline. At the deadline the caller returns nil,
-- "timeout" and leaves the grant to the task: `_adopted[co]` is then true,
-- and the body hands what it got back to the pool (a client joins the idle
-- set or serves the next waiter; a client that failed validate is retired).
-- While the caller waits, `_adopted[co]` is its record w, through which the
-- body hands it the results. A hook that does not yield cannot be cut
-- short: its caller gets what it made.
---------------------------------------------------------------------------

-- The deadline and timeout that bound grant gr's hooks, or nil when they
-- run in the caller as before: nothing to bound (an idle client without
-- validate), no timeout, Lua 5.1, or a caller that could not wait anyway.
-- deadline: the one a wait before set (checkout's grant: the wait it was
-- granted in, or the first wait of a retry; see retry_opts), kept as it is.
-- (Rebuilt from what was left of it, less the time waited, it counted the
-- wait twice: a checkout timed out before its deadline, issue 18's stress
-- test.)
local function bound_of(self, gr, opts, deadline)
  if IS_51 then return nil end
  local st = gr.st
  if st ~= GRANT_CREATE and not (st == GRANT_IDLE and gr.validate and self._validate) then return nil end
  local timeout = opts and opts.timeout
  if timeout == nil then timeout = self._c.acquire_timeout end
  if timeout == nil and deadline == nil then return nil end
  local co, main = co_running()
  if co == nil or main or (co_isyieldable and not co_isyieldable()) then return nil end
  local yieldable = self._sched.yieldable
  if yieldable and not yieldable() then return nil end
  -- (the timeout reported: from the start of the wait it was granted in)
  if deadline then return deadline, deadline - clock(self) + (gr.waited or 0) end
  -- from the start of the acquisition: a waiter's time queued counts
  return clock(self) - (gr.waited or 0) + timeout, timeout
end
M.bound_of = bound_of

-- The end of a bounded body: its results r... go to whoever is owed them.
-- Run to its end at once, the caller has them (returned); with the caller
-- waiting, they are handed over and the caller woken; with the caller gone
-- (or dead), orphan(self, ...) gives them back to the pool.
local function hand_over(self, orphan, ...)
  local co = co_running()
  local w = self._adopted[co]
  if w == nil then return ... end
  if w ~= true then
    w.r = pack(...)
    if self._sched.wake(w.h) then return end
    self._adopted[co] = true
  end
  return orphan(self, ...)
end
M.hand_over = hand_over

local function release_orphan(_, lease)
  if lease then lease:release() end
end

local function lease_body(self, name, gr, drain)
  return hand_over(self, release_orphan, on_grant(self, name, gr, drain))
end

-- A grant coroutine whose hook yielded, as a task: its yields are passed
-- through to the scheduler and the scheduler's answers back down. An error
-- goes to the caller waiting for it, else to the log. (No closure here.)
local function adopt_task(self, co, ...)
  local r = pack(...)
  while co_status(co) == "suspended" do
    r = pack(co_resume(co, co_yield(unpack(r, 1, r.n))))
    if not r[1] then
      local w = self._adopted[co]
      if type(w) == "table" then
        w.err = r[2]
        if self._sched.wake(w.h) then return end
      end
      log(self, "background acquisition failed: " .. tostring(r[2]))
      return
    end
    r = pack(unpack(r, 2, r.n))
  end
end

-- After the first resume of a bounded body: finished, its results; else the
-- caller waits for them until its deadline (or its cancel token).
local function bounded_wait(self, name, deadline, timeout, token, co, ok, ...)
  if co_status(co) ~= "suspended" then
    if not ok then error((...), 0) end
    return ...
  end
  local sched = self._sched
  local h = sched.current()
  local w = { h = h }
  self._adopted[co] = w
  sched.spawn(adopt_task, self, co, ...)
  if h == nil then                  -- (an adapter that says it cannot wait after all)
    self._adopted[co] = true
    return timed_out(self, name, timeout)
  end
  if token then token._waits[h] = sched end
  while w.r == nil and w.err == nil and not (token and token._cancelled) and clock(self) < deadline do
    sched.wait(h, deadline)
  end
  if token then token._waits[h] = nil end
  if sched.done then sched.done(h) end
  if w.err ~= nil then error(w.err, 0) end
  if w.r then return unpack(w.r, 1, w.r.n) end
  self._adopted[co] = true          -- the caller leaves; the body goes on without it
  if token and token._cancelled then return nil, "cancelled" end
  return timed_out(self, name, timeout + (clock(self) - deadline))
end

-- Runs body(self, ...) bounded by deadline (see above).
local function bounded(self, name, deadline, timeout, token, body, a, b, c, d, e)
  local co = co_create(body)
  return bounded_wait(self, name, deadline, timeout, token, co, co_resume(co, self, a, b, c, d, e))
end
M.bounded = bounded

---------------------------------------------------------------------------
-- Waiting
---------------------------------------------------------------------------

-- After a wait of waiter w (generation g): the engine's claim, or the
-- cancel or timeout that ends the wait. Returns the claim's results (status
-- PENDING: not granted yet, wait again). want: a leak sentinel for a grant.
local function wait_claim(self, w, g, deadline, token, want)
  local e = self._e
  -- (a claim only reads the waiter's result: its time is unused, so 0
  -- rather than a clock read per handoff)
  local st, rec, l, lg, validate, idle, pending, waited, sentinel = e:claim(w, g, 0, want)
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
  -- OpenResty: a lease whose request ended gives its room first (the
  -- caller looks again), else a watch runs while this waits (owners.lua)
  if self._owner and owners_before_wait(self) then return nil, STALE end
  local sched = self._sched
  local h, why = sched.current()
  if h == nil then
    -- One look more before giving up: an eviction whose destroy did not
    -- yield has freed its room by now (the events were carried out), and
    -- a caller that cannot wait could not be served from it otherwise.
    local st, rec, l, lg, validate, idle, pending, sentinel = self._e:acquire(k, now_of(self), not bare)
    if pending > 0 then pump(self) end
    if st == GRANT_IDLE or st == GRANT_CREATE then return true, st, rec, l, lg, validate, idle, nil, sentinel end
    if REFUSED[st] then return refused(self, st, name) end
    self._e:key_forget(k)
    pump(self)
    local what = bare and "checkout" or "acquire"
    error("clientpool: " .. what .. " would wait, but " .. (why or "the caller cannot yield") ..
          " (use try_acquire, or call " .. what .. " from a coroutine the scheduler runs)", outside_level() or 0)
  end
  local done = sched.done        -- (optional) h is over: see below
  local timeout = opts and opts.timeout
  if timeout == nil then timeout = self._c.acquire_timeout end
  -- a deadline is timed on the clock (never early); without one the queue
  -- entry takes the acquisition's time (the turn's where the host has one:
  -- a clock read less per handoff; `waited` may then count up to a turn more)
  local start
  if timeout then start = clock(self) else start = turn_of(self) end
  local deadline = timeout and start + timeout
  local e = self._e
  if self._nwaiters > 0 then reap_if_full(self) end
  -- the same clock: one read, not two; a priority moves the waiter's place
  -- (clientpool_wait_priority), checkout has none
  local w, g, pending = e:wait(k, deadline or -1, start, opts and opts.priority)
  if not w then
    if done then done(h) end
    if g == STALE then
      stale_key(self, k, name)
      return nil, STALE         -- the caller acquires again (see stale_key)
    end
    pump(self)
    if g == FULL then return stats.full(self, name, "full") end
    return nil, "closed"
  end
  self._waiters[w] = h
  self._nwaiters = self._nwaiters + 1
  self._wgen[w] = g
  local token = opts and opts.cancel
  if token then token._waits[h] = sched end
  if pending > 0 then pump(self) end
  -- (the claim's locals after the wait, not before: the wait's frame sits
  -- eight slots lower in a waiting coroutine's stack, a margin under the
  -- doubling of Lua 5.4's stack that bench B4.lua_waiter shows)
  sched.wait(h, deadline)
  local st, rec, l, lg, validate, idle, waited, sentinel
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
    return true, st, rec, l, lg, validate, idle, waited, sentinel, deadline
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
local ACQUIRE_OPTS = { timeout = true, cancel = true, on_drain = true, priority = true }

-- Checks acquire's options, raising at the level of acquire's caller (or
-- at level, as error() counts from here: the fast path's checks);
-- returns the cancel token and the on_drain grace (nil: preserve).
local function acquire_opts(self, opts, level)
  level = level or 3
  if opts ~= nil then
    if type(opts) ~= "table" then
      error("clientpool: bad argument #2 to 'acquire' (options table expected, got " .. type(opts) .. ")", level)
    end
    -- a misspelt option (timout = 1) must not pass silently; a table seen
    -- once is not walked again (weak cache: no pairs() on the hot path)
    local seen = self._opts_seen
    if not seen[opts] then
      for name in pairs(opts) do
        if not ACQUIRE_OPTS[name] then
          error("clientpool: bad argument #2 to 'acquire' (unknown option '" .. tostring(name) ..
                "'; the options are timeout, cancel, on_drain and priority)", level)
        end
      end
      seen[opts] = true
    end
  end
  local token = opts and opts.cancel
  if token ~= nil and getmetatable(token) ~= Token then
    error("clientpool: bad argument #2 to 'acquire' (opts.cancel must be a clientpool.token())", level)
  end
  if opts and opts.timeout ~= nil then
    local t = opts.timeout
    if type(t) ~= "number" or t ~= t or t < 0 or t == math_huge then
      error("clientpool: bad argument #2 to 'acquire' (opts.timeout must be a finite number >= 0, got "
            .. tostring(t) .. ")", level)
    end
  end
  if opts and opts.priority ~= nil then
    local p = opts.priority
    if type(p) ~= "number" or p ~= p or p % 1 ~= 0 or p < -2147483648 or p > 2147483647 then
      error("clientpool: bad argument #2 to 'acquire' (opts.priority must be an integer in " ..
            "[-2^31, 2^31), got " .. tostring(p) .. ")", level)
    end
  end
  local drain
  if opts and opts.on_drain ~= nil and opts.on_drain ~= "preserve" then
    local od = opts.on_drain
    local grace = type(od) == "table" and od.cancel
    if type(grace) ~= "number" or grace ~= grace or grace < 0 or grace == math_huge then
      error("clientpool: bad argument #2 to 'acquire' (opts.on_drain must be \"preserve\" or " ..
            "{ cancel = grace_s } with a finite grace >= 0)", level)
    end
    drain = grace
  end
  return token, drain
end

-- The options of an acquisition that waited, was granted a client that
-- failed validate or was lost, and must look again with nothing else free
-- (a fresh acquisition): the same, with what is left until its deadline.
-- (The timeout started over before: a waiter could end a whole timeout
-- past its deadline; issue 18. The priority was left out when issue 19
-- added it: a retry queued at priority 0.)
-- (Every option of ACQUIRE_OPTS but timeout is copied by name: no loop on
-- a path the hot path reaches, see the opening comment.)
local function retry_opts(self, opts, deadline)
  local left = deadline - clock(self)
  if left < 0 then left = 0 end
  return { timeout = left, cancel = opts and opts.cancel, on_drain = opts and opts.on_drain,
           priority = opts and opts.priority }
end
M.retry_opts = retry_opts

local acquire_from, lease_of

-- An acquisition's answer: the lease, or nil, code[, err]; or nil alone when
-- the idle record it was granted failed validate/unpark (or was lost) and
-- nothing else was free: it looks again (a tail call, not a loop: a loop
-- here keeps the JIT from compiling the caller's acquire/release loop,
-- "inner loop in root trace"), within what is left of the deadline it
-- waited for.
local function or_again(self, key, opts, deadline, lease, code, err)
  if lease or code then return lease, code, err end
  if deadline then return self:acquire(key, retry_opts(self, opts, deadline)) end
  return self:acquire(key, opts)
end

-- acquire_from's parked idle record failed unpark: it is retired and the
-- caller granted again in its place, as on_grant does. gr holds the
-- lease's sentinel until the regrant takes it back (nothing else does: a
-- sentinel held past it could be another lease's by then, whose leak its
-- collection would report). The caller's own acquisition, never an
-- orphaned grant body: regrant, not unusable.
local function unparked_not(self, key, opts, drain, name, gr, deadline)
  regrant(self, gr, gr.sentinel ~= nil)
  return or_again(self, key, opts, deadline, on_regrant(self, name, gr, drain))
end

function Pool:acquire(key, opts)
  if getmetatable(self) ~= Pool then not_a_pool(self, "acquire") end
  local token, drain = acquire_opts(self, opts)
  local e = self._e
  -- a token cancelled beforehand: the caller wants no client, not even a
  -- free one; a closed pool says so first (docs/decisions.md)
  if token and token._cancelled then return nil, self._closed and "closed" or "cancelled" end
  local k, name, kerr = key_id(self, key, "acquire")
  if not k then return no_key(self, kerr, name) end
  if self._nwaiters > 0 then reap_if_full(self) end
  return acquire_from(self, key, opts, drain, k, name, e:acquire(k, turn_of(self), true))
end

-- acquire from the engine's answer. Shared by Pool:acquire and the C fast
-- path (checkout.lua's install_fastpath), which hands over whatever it does
-- not finish.
function acquire_from(self, key, opts, drain, k, name, st, rec, l, g, validate, idle, pending, sentinel)
  if pending > 0 then pump(self) end
  local waited, deadline
  if st == MUST_WAIT then
    local ok
    ok, st, rec, l, g, validate, idle, waited, sentinel, deadline = wait_for(self, k, name, opts)
    if not ok then
      if st == STALE then return self:acquire(key, opts) end
      return nil, st, rec
    end
  elseif st == STALE then
    stale_key(self, k, name)
    return self:acquire(key, opts)
  elseif REFUSED[st] then
    return refused(self, st, name)
  end
  if st == GRANT_IDLE and not (validate and self._validate) and
     not (self._lost and self._lost[rec]) then   -- (lost_share, inline: the hot path)
    -- the common case: an idle client usable as it is, or once unparked
    -- (OpenResty's: bench B5), with no grant record either way
    local client = self._clients[rec]
    if self._parked[rec] then
      client = unpark(self, name, rec)
      if client == nil then   -- (a tail call: this frame's sentinel is gr's alone)
        return unparked_not(self, key, opts, drain, name, grant(st, rec, l, g, validate, idle, waited, sentinel),
                            deadline)
      end
    end
    local lease = new_lease(self, rec, l, g, client, sentinel, drain)
    if self._on.acquire then emit(self, "acquire", hook_key(name), client, waited) end
    return lease
  end
  return lease_of(self, key, opts, drain, name, grant(st, rec, l, g, validate, idle, waited, sentinel), deadline)
end

-- A lease a bounded body handed over after its caller waited for it
-- (gr.late), as the caller takes it up: its `acquire` event now; or, when
-- a co-holder lost the client in between (capacity > 1: a waiter granted a
-- share of the client as it was created ran first), not taken up: like a
-- share lost before its hand-over (lost_share), the caller looks again in
-- its place (regrant; the engine takes the lease back). Returns the lease,
-- or nil when gr holds the new grant.
local function take_late(self, name, gr, lease)
  gr.late = nil
  if lease.lost ~= true then
    if self._on.acquire then emit(self, "acquire", hook_key(name), lease.client, gr.waited) end
    return lease
  end
  local l = gr.l
  if self._held[l] == lease then self._held[l] = nil end
  local rl = self._rec_leases
  if rl and rl[gr.rec] then rl[gr.rec][lease] = nil end
  lease.client = nil
  regrant(self, gr, true)
  lease[SENTINEL] = nil      -- (after: see lease.lua's finish_lease)
  return nil
end

-- The grant gr of acquire_from made a lease, bounded by the acquisition's
-- deadline where its hooks are (deadline: a wait's before, else nil).
function lease_of(self, key, opts, drain, name, gr, deadline)
  local lease, code, err
  local bound, timeout = bound_of(self, gr, opts, deadline)
  if bound then
    deadline = bound         -- (the whole acquisition's: a wait before counts)
    lease, code, err = bounded(self, name, bound, timeout, opts and opts.cancel, lease_body, name, gr, drain)
    if lease and gr.late then
      lease = take_late(self, name, gr, lease)
      if lease == nil then
        local st = gr.st
        if st == GRANT_IDLE or st == GRANT_CREATE then return lease_of(self, key, opts, drain, name, gr, deadline) end
        if st == CLOSED then return nil, "closed" end
      end
    end
  else
    lease, code, err = on_grant(self, name, gr, drain)
  end
  return or_again(self, key, opts, deadline, lease, code, err)
end

-- try_acquire's grant gr, in a coroutine of its own. Once a hook yielded,
-- the caller went on (nil, "timeout") and the coroutine is adopted: its
-- lease goes straight back to the pool, here, whoever resumes the
-- coroutine (the adopting task, or the scheduler itself: a hook that made
-- this coroutine ready at once, sleep(0), is resumed before that task runs).
local function try_grant(self, name, gr)
  local lease, code, err = on_grant(self, name, gr)
  if self._adopted[co_running()] then
    if lease then lease:release() end
    return
  end
  return lease, code, err
end

local try_from

--- Never waits or yields: an idle client, or a new one if create need not
-- yield; else nil, "timeout".
function Pool:try_acquire(key)
  if getmetatable(self) ~= Pool then not_a_pool(self, "try_acquire") end
  local k, name, kerr = key_id(self, key, "try_acquire")
  if not k then return no_key(self, kerr, name) end
  if self._nwaiters > 0 then reap_if_full(self) end
  return try_from(self, key, k, name, self._e:acquire(k, turn_of(self), true))
end

-- try_acquire from the engine's answer. Shared by Pool:try_acquire and the
-- C fast path (checkout.lua's install_fastpath), which hands over whatever
-- it does not finish. An idle client usable as it is becomes the lease
-- here, as in acquire_from: no grant record and no coroutine (the path
-- below, where a hook may yield, needs both: bench B1.try, B4.alloc_try).
-- No loop: a retry is a tail call (see lease_of).
function try_from(self, key, k, name, st, rec, l, g, validate, idle, pending, sentinel)
  if pending > 0 then pump(self) end
  if st == MUST_WAIT or st == FULL then
    -- nothing free now: "timeout", also when max_waiting acquisitions
    -- wait (the engine refuses it as full: try_acquire never queues, so
    -- the queue's length is not its answer; issue 18)
    if st == MUST_WAIT then self._e:key_forget(k) end
    pump(self)
    return nil, "timeout", snapshot(self, "timeout", name, 0)
  elseif REFUSED[st] then
    return refused(self, st, name)
  elseif st == STALE then
    stale_key(self, k, name)
    return self:try_acquire(key)
  end
  if st == GRANT_IDLE and not self._parked[rec] and not (validate and self._validate) and
     not (self._lost and self._lost[rec]) then   -- (lost_share, inline: the hot path)
    local lease = new_lease(self, rec, l, g, self._clients[rec], sentinel, nil)
    if self._on.acquire then emit(self, "acquire", hook_key(name), lease.client, 0) end
    return lease
  end
  local gr = grant(st, rec, l, g, validate, idle, 0, sentinel)
  -- where the host cannot yield at all (OpenResty's log, set, filter and
  -- init_worker phases, which also refuse its coroutine API), no hook can
  -- yield either: the grant runs right here
  local yieldable = self._sched.yieldable
  if yieldable and not yieldable() then
    local lease, code, err = on_grant(self, name, gr)
    if lease or code then return lease, code, err end
  else
    -- run the grant in a coroutine of its own: if a hook yields, the work
    -- finishes in the background and this caller does not wait for it
    local co = co_create(try_grant)
    local ok, lease, code, err = co_resume(co, self, name, gr)
    if co_status(co) == "suspended" then
      self._adopted[co] = true
      self:_adopt(co, lease, code, err)
      return nil, "timeout", snapshot(self, "timeout", name, 0)
    end
    if not ok then error(lease, 0) end
    if lease or code then return lease, code, err end
  end
  return self:try_acquire(key)   -- nothing granted (out of memory): anew
end

-- A grant started by try_acquire yielded in a hook: the scheduler resumes it
-- (its yields are passed through a task), and a lease it produces is
-- released straight back to the pool.
function Pool:_adopt(co, ...)
  self._sched.spawn(adopt_task, self, co, ...)
end

--- acquire, pcall fn(client, lease, ...), then release (destroy on error).
-- Returns fn's results, or nil, code[, detail] when nothing was acquired;
-- an error in fn is raised again after the client is destroyed.
function Pool:with(key, fn, ...)
  if getmetatable(self) ~= Pool then not_a_pool(self, "with") end
  if type(fn) ~= "function" then
    error("clientpool: bad argument #2 to 'with' (function expected, got " .. type(fn) .. ")", 2)
  end
  check_key_arg(key, 1, "with")
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

M.wait_for, M.acquire_opts, M.acquire_from, M.try_from = wait_for, acquire_opts, acquire_from, try_from

return M
