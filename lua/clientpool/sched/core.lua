--- clientpool.sched.core (internal): the scheduler core of clientpool.loop
-- and of the hosted form (clientpool.sched.hosted, which luv and copas pump).
--
-- Owns, once for both: the run queue, the timer heap, wait/wake/sleep with
-- the remembered wake (wake-before-wait) and the lost-wake callback, spawn
-- and background tasks, and the two yield protocols. `core.new(opts)` makes
-- an instance: an adapter table S (now, current, wait, wake, spawn,
-- background, sleep, stats; docs/design.md "The scheduler adapter contract") and the internals I that
-- the form driving it uses (drive for loop.run, turn and the counters for a
-- host's pump). cqueues' adapter reuses the module helpers (lost_wake,
-- running_co, cannot_wait, wait_start, check_sleep, log).
--
-- Internals, in short:
-- * Each coroutine the instance has seen owns one reusable record (`entry`)
--   in a weak-keyed table: state, heap position, pending-wake flag. The
--   entry never references its coroutine, so an abandoned coroutine is
--   collected even on Lua 5.1/LuaJIT, whose weak tables are not ephemerons.
-- * Timers are a binary min-heap over (deadline, insertion sequence): ties
--   fire in FIFO order. An entry knows its heap index, so a wake removes its
--   timer in O(log n) at once; the heap never holds stale entries.
-- * Ready coroutines sit in two swapped queues (parallel arrays, reused): a
--   turn runs what was ready when it began, in order; what becomes ready
--   during the turn runs in the next one. Queue items carry the entry's
--   generation, so an item made stale by an outside resume is skipped.
-- * A wait/wake cycle allocates nothing: no closures, no tables.
--
-- Yield protocols (opts.hosted):
-- * loop: wait and sleep yield MARK, co. A turn that gets MARK with a
--   coroutine other than the one it resumed (Lua 5.1's pass-through pcall
--   relays a nested coroutine's yields through its task) resumes the outer
--   one from then on, which resumes the nested one in turn. A bare
--   coroutine.yield() goes round again, like sleep(0). MARK is shared by all
--   loop instances: one that sees another's leaves the coroutine alone.
-- * hosted: wait and sleep yield `co, WQ`, where WQ is a table with `insert`
--   and `push` methods, the protocol copas uses for its socket queues
--   (`q:insert(x); q:push(x, co)` by whoever resumed co). When a turn
--   resumes a task and gets `x, q` back with q:push, it calls
--   `q:insert(x); q:push(x, task)`: for WQ that records which coroutine the
--   turn must resume to reach a nested waiter; for a copas socket queue it
--   hands the task to copas until the socket is ready. When copas resumes a
--   coroutine that then waits, copas calls WQ's push itself and the outer
--   coroutine is learned the same way. A coroutine that yields anything
--   else is left alone: whoever it waits for (a luv callback, say) resumes
--   it.

local coroutine, debug, io = coroutine, debug, io
local error, pairs, pcall, select, setmetatable, tostring, type =
      error, pairs, pcall, select, setmetatable, tostring, type
local unpack = table.unpack or unpack

local co_create, co_resume, co_yield = coroutine.create, coroutine.resume, coroutine.yield
local co_running, co_status = coroutine.running, coroutine.status
local co_isyieldable = coroutine.isyieldable -- Lua 5.3+, LuaJIT 2.1; nil on 5.1
local co_close = coroutine.close             -- Lua 5.4 only
local traceback = debug.traceback
local huge = math.huge

local M = {}

-- What sleep and wait yield under the loop protocol, followed by the
-- coroutine that registered (see the header).
local MARK = setmetatable({}, { __tostring = function() return "clientpool.loop.MARK" end })

-- entry.state
local IDLE, WAITING, READY = 0, 1, 2
-- entry.res: what a READY coroutine is resumed with
local RES_NONE, RES_WAKE, RES_TIMEOUT, RES_START = 0, 1, 2, 3

--- The running coroutine, or nil in the main thread (5.1 and 5.2+ semantics).
local function running_co()
  local co, ismain = co_running()
  if co == nil or ismain then return nil end
  return co
end
M.running_co = running_co

--- Why the running coroutine co (running_co()) cannot wait, or nil.
local function cannot_wait(co)
  if not co then return "not in a coroutine" end
  if co_isyieldable and not co_isyieldable() then return "coroutine cannot yield here" end
  return nil
end
M.cannot_wait = cannot_wait

--- Why a coroutine the built-in loop is not resuming (outside its turn)
-- cannot wait on it: it runs under another host, whose resume would get
-- the loop's yield (issue 12: cqueues raised a foreign "attempt to yield
-- from outside a coroutine"). Detectable: a cqueues controller's own
-- thread (cqueues.running() says so), a luv callback (uv.loop_mode() is
-- set while uv.run runs). Debian's copas 1.2 keeps no such state. nil
-- when none is detected.
local loaded = package.loaded
local function foreign_host()
  local cq = loaded.cqueues
  if type(cq) == "table" and type(cq.running) == "function" then
    local ctl, own = cq.running()
    if ctl ~= nil and own then
      return "it runs in a cqueues controller, not on the built-in loop: " ..
             "create the pool with scheduler = \"cqueues\""
    end
  end
  local uv = loaded.luv
  if type(uv) == "table" and type(uv.loop_mode) == "function" and uv.loop_mode() ~= nil then
    return "it runs in a luv callback, not on the built-in loop: create the pool with scheduler = \"luv\""
  end
  return nil
end
M.foreign_host = foreign_host

--- sleep's argument checks, raising at the level of sleep's caller.
local function check_sleep(name, s)
  local co = running_co()
  if not co or (co_isyieldable and not co_isyieldable()) then
    error(name .. ": sleep outside a coroutine", 3)
  end
  if type(s) ~= "number" or s ~= s or s < 0 or s == huge then
    error(name .. ": sleep expects a finite number of seconds >= 0", 3)
  end
  return co
end
M.check_sleep = check_sleep

--- The start of wait(h, deadline): the running coroutine, or nil and why
-- it cannot wait; raises for bad arguments at the level of wait's caller.
local function wait_start(name, h, deadline)
  local co = running_co()
  local why = cannot_wait(co)
  if why then return nil, why end
  if h ~= co then
    error(name .. ": wait: handle is not the running coroutine", 3)
  end
  if deadline ~= nil and (type(deadline) ~= "number" or deadline ~= deadline) then
    error(name .. ": wait: deadline must be a number or nil", 3)
  end
  return co
end
M.wait_start = wait_start

--- A wake that never reached its coroutine (it died first, say closed with
-- coroutine.close while ready): the waker's give-back runs, so a grant it
-- carried is not swallowed. e (an entry with lost, la, lb, lc) may be nil.
local function lost_wake(e)
  local f = e and e.lost
  if f then
    local a, b, c = e.la, e.lb, e.lc
    e.lost, e.la, e.lb, e.lc = nil, nil, nil, nil
    f(a, b, c)
  end
end
M.lost_wake = lost_wake

--- A wait takes the wake remembered for its coroutine (entry e's woke,
-- set by a wake that came while it was not waiting) and the give-back it
-- carried, which is not needed now: true if there was one.
local function take_wake(e)
  if not e.woke then return false end
  e.woke = false
  e.lost = nil
  return true
end
M.take_wake = take_wake

--- Reports a message (listener and destroy-hook errors) on stderr.
function M.log(msg)
  io.stderr:write(tostring(msg), "\n")
end

local function noop() end

--- Makes an instance: returns the adapter table S and the internals I.
-- opts.now: the clock; opts.name: prefix of messages; opts.hosted: the
-- hosted yield protocol (else the loop's); opts.changed: called (without
-- arguments) when a coroutine becomes ready or a timer is set while no turn
-- runs; opts.end_in_turn: a task that ends while the host resumed it goes
-- round the queue once more, so it ends in a turn (copas closes the socket
-- a coroutine last waited on when it ends in copas' hands).
function M.new(opts)
  local now, name, hosted = opts.now, opts.name, opts.hosted == true
  local changed = opts.changed
  local end_in_turn = opts.end_in_turn

  local S, I = {}, {}
  -- What wait and sleep yield, nil standing for the coroutine: MARK, co
  -- (loop) or co, WQ (hosted). Chosen here, not by a branch at the yield: a
  -- register more in wait grew a waiting coroutine's Lua 5.3 stack (bench
  -- B4.lua_waiter, +40 B per waiter).
  local Y1, Y2
  local in_turn = false
  -- The turn's time (S.turn_clock, docs/performance.md "Time per turn"):
  -- now() read as a turn begins, false between turns. The driver hands it
  -- to the engine on its hot path instead of reading the clock per call.
  local turn_clock = { now = false }
  S.turn_clock = turn_clock
  local resuming -- the coroutine a turn is resuming

  ---------------------------------------------------------------- entries
  -- co -> entry. Weak keys: a coroutine nobody references any more (say a
  -- waiter whose pool was dropped) goes away with its entry. Foreground tasks
  -- are also held strongly by `tasks` until they end.
  local entries = setmetatable({}, { __mode = "k" })
  local tasks, ntasks = {}, 0 -- live foreground tasks

  local function entry_of(co)
    local e = entries[co]
    if not e then
      e = {
        state = IDLE, res = RES_NONE, gen = 0,
        pos = 0, time = 0, seq = 0, -- heap slot (pos 0 = no timer)
        woke = false,               -- a wake arrived while not waiting
        sleeping = false,           -- in sleep (wake does not cut it short)
        task = false, bg = false,   -- spawned here; does not keep run() alive
        target = nil,               -- the coroutine to resume instead (5.1 pass-through)
        away = false,   -- (hosted) a task that yielded to someone else (a copas queue, a luv callback)
        nested = false, -- (hosted) a task whose nested coroutine waits here (pass-through)
        args = nil,                 -- spawn arguments, until the first resume
      }
      entries[co] = e
    end
    return e
  end

  local function forget(co)
    if tasks[co] then
      tasks[co] = nil
      ntasks = ntasks - 1
    end
  end

  ---------------------------------------------------------------- timer heap
  -- Parallel arrays: hent[i] the entry, hco[i] its coroutine; entry.pos = i.
  local hent, hco, hn = {}, {}, 0
  local seq = 0
  local fgtimers = 0 -- timers of coroutines that keep run() alive

  local function sift_up(i)
    local e, co = hent[i], hco[i]
    local t, s = e.time, e.seq
    while i > 1 do
      local p = (i - i % 2) / 2
      local pe = hent[p]
      local pt = pe.time
      if pt < t or (pt == t and pe.seq < s) then break end
      hent[i] = pe; hco[i] = hco[p]; pe.pos = i
      i = p
    end
    hent[i] = e; hco[i] = co; e.pos = i
  end

  local function sift_down(i)
    local e, co = hent[i], hco[i]
    local t, s = e.time, e.seq
    while true do
      local c = i * 2
      if c > hn then break end
      local ce = hent[c]
      if c < hn then
        local re = hent[c + 1]
        if re.time < ce.time or (re.time == ce.time and re.seq < ce.seq) then
          c = c + 1; ce = re
        end
      end
      if t < ce.time or (t == ce.time and s < ce.seq) then break end
      hent[i] = ce; hco[i] = hco[c]; ce.pos = i
      i = c
    end
    hent[i] = e; hco[i] = co; e.pos = i
  end

  local function heap_push(e, co, t)
    seq = seq + 1
    e.time = t; e.seq = seq
    hn = hn + 1
    hent[hn] = e; hco[hn] = co
    if not e.bg then fgtimers = fgtimers + 1 end
    sift_up(hn)
    if changed and not in_turn then changed() end
  end

  local function heap_remove(e)
    local i = e.pos
    e.pos = 0
    if not e.bg then fgtimers = fgtimers - 1 end
    local last = hn
    local le, lco = hent[last], hco[last]
    hent[last] = nil; hco[last] = nil
    hn = last - 1
    if i ~= last then
      hent[i] = le; hco[i] = lco; le.pos = i
      local p = (i - i % 2) / 2
      local pe = hent[p]
      if i > 1 and (le.time < pe.time or (le.time == pe.time and le.seq < pe.seq)) then
        sift_up(i)
      else
        sift_down(i)
      end
    end
  end

  -- Background-ness can change after the fact (a nested coroutine adopts its
  -- task's); keep the foreground timer count right.
  local function set_bg(e, bg)
    if e.bg ~= bg then
      if e.pos > 0 then fgtimers = fgtimers + (bg and -1 or 1) end
      e.bg = bg
    end
  end

  ---------------------------------------------------------------- ready queues
  -- Items: rq_co[i], rq_gen[i] (entry.gen when queued). sp_* is the spare
  -- set, swapped in each turn. (A third array, whether an item kept run()
  -- alive, was counted and never read: gone, issue 17.)
  local rq_co, rq_gen, rqn = {}, {}, 0
  local sp_co, sp_gen = {}, {}

  local function make_ready(co, e, res)
    if e.pos > 0 then heap_remove(e) end
    e.state = READY
    e.res = res
    local gen = e.gen + 1
    e.gen = gen
    rqn = rqn + 1
    rq_co[rqn] = co; rq_gen[rqn] = gen
    if changed and not in_turn then changed() end
  end

  -- A coroutine came back from a sleep/wait without the instance resuming it.
  local function cancel(e)
    if e.pos > 0 then heap_remove(e) end
    e.state = IDLE -- a queued item, if any, is now stale
  end

  -- The hosted protocol's queue a waiting coroutine yields (see the header).
  local WQ = {
    insert = noop,
    push = function(_, inner, outer)
      local we = entries[inner]
      if we == nil then return end
      if outer ~= inner and type(outer) == "thread" and we.state ~= IDLE then
        we.target = outer
        local oe = entries[outer]
        if oe then
          oe.away = false
          oe.nested = true
          if not we.task then set_bg(we, oe.bg) end
        end
      elseif outer == inner then
        we.away = false
      end
    end,
  }

  if hosted then Y2 = WQ else Y1 = MARK end

  ---------------------------------------------------------------- adapter

  --- Current time in seconds.
  S.now = now

  -- Starts fn(...) in a new task at the next turn. Tasks start in spawn order.
  local function spawn_task(bg, fn, ...)
    if type(fn) ~= "function" then
      error(name .. ": " .. (bg and "background" or "spawn") .. " expects a function", 3)
    end
    local co
    if end_in_turn then
      co = co_create(function(...)
        fn(...)
        -- resumed by the host (copas, from a socket queue)? go round once
        -- more, so that the task ends in a turn of this queue
        if resuming ~= co then S.sleep(0) end
      end)
    else
      co = co_create(fn)
    end
    local e = entry_of(co)
    e.task = true
    e.bg = bg
    local res = RES_NONE
    local n = select("#", ...)
    if n > 0 then
      e.args = { n = n, ... }
      res = RES_START
    end
    if not bg then
      tasks[co] = true
      ntasks = ntasks + 1
    end
    make_ready(co, e, res)
    return co
  end

  --- Start `fn(...)` in a new task at the next turn. Returns the task (its
  -- coroutine). Tasks start in spawn order.
  function S.spawn(fn, ...)
    local co = spawn_task(false, fn, ...) -- not a tail call: error level 3
    return co
  end

  --- Like spawn, but the task does not keep run() (or the host's loop)
  -- going: run() returns when only background tasks and their timers are
  -- left; they stay suspended and go on at the next run(). A background task
  -- is held weakly while it waits without a deadline, so it is collected
  -- with whatever alone could wake it.
  function S.background(fn, ...)
    local co = spawn_task(true, fn, ...)
    return co
  end

  --- Suspend the running coroutine for s seconds (s >= 0). sleep(0) lets the
  -- other ready tasks run first. A wake does not cut it short. Raises
  -- outside a coroutine.
  function S.sleep(s)
    local co = check_sleep(name, s)
    local e = entry_of(co)
    if e.state ~= IDLE then cancel(e) end
    e.sleeping = true
    if s == 0 then
      make_ready(co, e, RES_NONE)
    else
      e.state = WAITING
      heap_push(e, co, now() + s)
    end
    co_yield(Y1 or co, Y2 or co)
    if e.state ~= IDLE then cancel(e) end -- resumed by someone else: stop here
  end

  --- A handle for the running coroutine (the coroutine itself), or
  -- nil, reason where it cannot wait.
  -- (current and wait check inline, calling none of the helpers above,
  -- which cqueues' adapter uses: fewer calls per handoff, and a frame
  -- more under a waiting coroutine's C calls grew its Lua 5.4 stack past a
  -- doubling, bench B4.lua_waiter 797 -> 2077 B per waiter; sleep, off the
  -- handoff, uses check_sleep)
  function S.current()
    local co, ismain = co_running()
    if co == nil or ismain then return nil, "not in a coroutine" end
    if co_isyieldable and not co_isyieldable() then
      return nil, "coroutine cannot yield here"
    end
    if not in_turn and not hosted then
      local why = foreign_host()
      if why then return nil, why end
    end
    return co
  end

  --- Suspend the running coroutine (whose handle is h) until wake(h) or the
  -- absolute deadline (now() units; nil = none). Returns true when woken,
  -- nil, "timeout" at the deadline. A wake that came first makes it return
  -- true at once. Returns nil, "not in a coroutine" where it cannot wait.
  -- Spurious returns (true) happen if someone else resumes the coroutine.
  function S.wait(h, deadline)
    -- (wait_start and take_wake inline: three calls less per handoff; the
    -- call to wait_start, f13d0c6, is what first grew a waiting
    -- coroutine's Lua 5.4 stack past a doubling, bench B4.lua_waiter 797 ->
    -- 2077 B; ismain in a block keeps the frame at its old 8 slots)
    local co
    do
      local c, ismain = co_running()
      if c == nil or ismain then return nil, "not in a coroutine" end
      co = c
    end
    if co_isyieldable and not co_isyieldable() then return nil, "coroutine cannot yield here" end
    if h ~= co then
      error(name .. ": wait: handle is not the running coroutine", 2)
    end
    if deadline ~= nil and (type(deadline) ~= "number" or deadline ~= deadline) then
      error(name .. ": wait: deadline must be a number or nil", 2)
    end
    local e = entries[co] or entry_of(co)
    if e.state ~= IDLE then cancel(e) end
    if e.woke then
      e.woke = false
      e.lost = nil
      return true
    end
    if deadline and deadline <= now() then return nil, "timeout" end
    e.sleeping = false
    e.state = WAITING
    if deadline and deadline < huge then heap_push(e, co, deadline) end
    local a, b = co_yield(Y1 or co, Y2 or co)
    if e.state ~= IDLE then
      cancel(e) -- resumed by someone else: a spurious return
      return true
    end
    return a, b
  end

  --- Schedule the coroutine h, waiting in wait(), to resume at the next turn
  -- (never synchronously). If it is not waiting, the wake is remembered for
  -- its next wait (several count once). Returns false if h is dead. lost
  -- (optional) is called as lost(la, lb, lc) if h dies before the wake
  -- reaches it.
  function S.wake(h, lost, la, lb, lc)
    local e = entries[h]   -- (only coroutines are keys: no type() call for a known one)
    if e == nil and type(h) ~= "thread" then
      error(name .. ": wake expects a coroutine handle", 2)
    end
    if co_status(h) == "dead" then
      if e then
        if e.pos > 0 then heap_remove(e) end
        e.state = IDLE
      end
      forget(h)
      lost_wake(e)
      return false
    end
    if not e then
      e = entry_of(h)
      e.woke = true
      e.lost, e.la, e.lb, e.lc = lost, la, lb, lc
      return true
    end
    local state = e.state
    if state == WAITING and not e.sleeping then
      -- (make_ready, inline: a call less per handoff)
      if e.pos > 0 then heap_remove(e) end
      e.state = READY
      e.res = RES_WAKE
      local gen = e.gen + 1
      e.gen = gen
      rqn = rqn + 1
      rq_co[rqn] = h; rq_gen[rqn] = gen
      if changed and not in_turn then changed() end
    elseif state == READY and e.res == RES_TIMEOUT then
      e.res = RES_WAKE -- timed out but not resumed yet: the wake wins
    else
      e.woke = true
    end
    -- the waker's give-back, should h die before this wake reaches it; a
    -- wake without one (a cancel token's) keeps the grant's
    if lost then e.lost, e.la, e.lb, e.lc = lost, la, lb, lc end
    return true
  end

  --- Debug counters: ready queue length, timers in the heap, live
  -- foreground tasks. Fills t if given.
  function S.stats(t)
    t = t or {}
    t.ready = rqn
    t.timers = hn
    t.tasks = ntasks
    return t
  end

  ---------------------------------------------------------------- turns

  -- After resuming target and its yield: the hosted protocol.
  local function yielded_hosted(target, a, b)
    if b == WQ then
      WQ.push(WQ, a, target)
    elseif type(b) == "table" and a ~= nil and type(b.push) == "function" and type(b.insert) == "function" then
      -- a host queue (copas): the host resumes the task from now on
      entry_of(target).away = true
      b:insert(a)
      b:push(a, target)
    else
      -- something else resumes it (or nobody): leave it alone
      entry_of(target).away = true
    end
  end

  -- After resuming target: a finished, failed or yielded coroutine.
  -- Returns an error value to raise, or nil.
  local function settle(target, ok, a, b)
    if not ok then
      local err = a
      local ta = type(a)
      if ta == "string" or ta == "number" then err = traceback(target, tostring(a)) end
      forget(target)
      -- Lua 5.4 does not unwind a coroutine that failed: close it so its
      -- to-be-closed variables (leases held with <close>) are released.
      if co_close then pcall(co_close, target) end
      if err == nil then err = name .. ": task failed with nil" end
      return err
    end
    if co_status(target) == "dead" then
      forget(target)
      local te = entries[target]
      if te then te.state = IDLE end
    elseif hosted then
      yielded_hosted(target, a, b)
    elseif a == MARK then
      -- (the loop protocol inline: settle runs at every resume of a handoff)
      if b ~= target and type(b) == "thread" then
        -- A nested coroutine's sleep/wait passed through the task (5.1
        -- pass-through pcall): resume the task when it is due.
        local we = entries[b]
        if we and we.state ~= IDLE then
          we.target = target
          local te = entries[target]
          if te and not we.task then set_bg(we, te.bg) end
        end
      end
    else
      -- A bare coroutine.yield(): go round again, like sleep(0).
      make_ready(target, entry_of(target), RES_NONE)
    end
    return nil
  end

  -- Runs what is ready now, in order. Returns a task's error (with its
  -- traceback), the rest of the turn staying queued, or nil.
  local function run_ready()
    in_turn = true
    turn_clock.now = now()
    local l_co, l_gen, n = rq_co, rq_gen, rqn
    rq_co, rq_gen, rqn = sp_co, sp_gen, 0
    sp_co, sp_gen = l_co, l_gen
    for i = 1, n do
      local co, gen = l_co[i], l_gen[i]
      l_co[i] = nil; l_gen[i] = nil
      local e = entries[co]
      if e and e.gen == gen and e.state == READY then
        local target = e.target or co
        e.target = nil
        e.state = IDLE
        -- (one status call where the coroutine is its own target: a handoff)
        local st = co_status(co)
        local tst = st
        if target ~= co and st ~= "dead" then tst = co_status(target) end
        if st == "dead" then
          forget(co) -- killed elsewhere (coroutine.close) while it slept
          lost_wake(e)
        elseif tst == "suspended" then
          if hosted then   -- (only the hosted form tracks these: not on the loop's handoff)
            local te = target ~= co and entries[target] or e
            if te then te.away = false; te.nested = false end
            resuming = target
          end
          local res, ok, a, b = e.res
          e.lost = nil
          if res == RES_WAKE then
            ok, a, b = co_resume(target, true)
          elseif res == RES_TIMEOUT then
            ok, a, b = co_resume(target, nil, "timeout")
          elseif res == RES_START then
            local args = e.args
            e.args = nil
            ok, a, b = co_resume(target, unpack(args, 1, args.n))
          else
            ok, a, b = co_resume(target)
          end
          if hosted then resuming = nil end
          local err
          -- (settle, inline for what a handoff leaves: the coroutine waits
          -- again in its own wait or sleep, so it is neither dead nor
          -- nested: its entry is not IDLE)
          if a == MARK and b == co and target == co and ok and not hosted and e.state ~= IDLE then
            err = nil
          else
            err = settle(target, ok, a, b)
          end
          if err ~= nil then
            -- Keep what was still due this turn ahead of what came after.
            local m = 0
            for j = i + 1, n do
              m = m + 1
              l_co[m], l_gen[m] = l_co[j], l_gen[j]
            end
            for j = 1, rqn do
              m = m + 1
              l_co[m], l_gen[m] = rq_co[j], rq_gen[j]
              rq_co[j], rq_gen[j] = nil, nil
            end
            for j = m + 1, n do l_co[j], l_gen[j] = nil, nil end
            sp_co, sp_gen = rq_co, rq_gen
            rq_co, rq_gen, rqn = l_co, l_gen, m
            in_turn = false
            turn_clock.now = false
            return err
          end
        elseif tst == "dead" then
          forget(target) -- (5.1) the task around a nested waiter was killed elsewhere
          lost_wake(e)
        end
      end
    end
    in_turn = false
    turn_clock.now = false
    return nil
  end

  -- Forgets the foreground tasks that died without the instance seeing it
  -- (killed elsewhere, or ended while someone else resumed them); returns
  -- how many are left.
  local function sweep()
    for co in pairs(tasks) do
      if co_status(co) == "dead" then forget(co) end
    end
    return ntasks
  end

  --- (loop) Runs until no foreground task or timer and no ready coroutine
  -- (background ones too) is left: turns, and between them, when nothing is
  -- ready, advance(t) to the next timer's time t. Returns an error value (a
  -- task's, or a deadlock), or nil. A background task that is ready runs:
  -- only its timers do not keep the loop going (issue 18: the pool's timer
  -- task, woken by a lease the collector found after the program's tasks
  -- ended, did nothing until the next pool call).
  function I.drive(advance)
    while true do
      if hn > 0 then
        -- every timer that is due fires before the turn
        local t = now()
        while hn > 0 do
          local e = hent[1]
          if e.time > t then break end
          make_ready(hco[1], e, e.sleeping and RES_NONE or RES_TIMEOUT)
        end
      end
      if ntasks == 0 and fgtimers == 0 and rqn == 0 then return end
      if rqn > 0 then
        local err = run_ready()
        if err ~= nil then return err end
      else
        if fgtimers == 0 then
          -- Only tasks that wait are left: any killed elsewhere (say by
          -- coroutine.close) no longer count. Background timers may still
          -- wake the others; with no timer at all, nothing ever will.
          if sweep() == 0 then return end
          if hn == 0 then
            return (name .. ": deadlock: %d task(s) wait with no deadline and nothing left to wake them")
                   :format(ntasks)
          end
        end
        -- Nothing ready: go to the next timer.
        advance(hent[1].time)
      end
    end
  end

  --- (hosted) Runs one turn: fires the earliest timer that is due, then
  -- resumes what was ready when the turn began, in order. Returns a task's
  -- error (with its traceback), the rest of the turn staying queued, or nil.
  -- One timer a turn, the earliest due: when several are due at once (the
  -- host was busy), each one's coroutine, and what it makes ready, runs
  -- before the next one fires, as on a virtual clock, where time only moves
  -- on when nothing is ready. Every turn fires one, so none starves.
  function I.turn()
    if hn > 0 then
      local e = hent[1]
      if e.time <= now() then
        make_ready(hco[1], e, e.sleeping and RES_NONE or RES_TIMEOUT)
      end
    end
    if rqn == 0 then return nil end
    return run_ready()
  end

  --- Number of coroutines ready to run.
  function I.ready() return rqn end

  --- Time of the next timer (now() units), or nil.
  function I.deadline()
    if hn == 0 then return nil end
    return hent[1].time
  end

  --- Whether work is left: a live task, a foreground timer or a ready
  -- coroutine (a background one too: only background timers do not count,
  -- as for drive). (Tasks that ended while someone else resumed them are
  -- forgotten here, when only tasks are left.)
  function I.busy()
    return rqn > 0 or fgtimers > 0 or (ntasks > 0 and sweep() > 0)
  end

  --- Whether a coroutine is ready, or a foreground one has a timer.
  function I.fgwork()
    return rqn > 0 or fgtimers > 0
  end

  --- Whether foreground work can still move on its own: something ready, a
  -- foreground timer, or a live task away (handed to the host, or waiting for
  -- something else to resume it). False with live tasks means every one of
  -- them waits for a wake that nothing here will give.
  function I.moving()
    if rqn > 0 or fgtimers > 0 then return true end
    for co in pairs(tasks) do
      if co_status(co) == "dead" then
        forget(co)
      else
        local e = entries[co]
        if e == nil or e.away or not (e.state == WAITING or e.nested) then return true end
      end
    end
    return false
  end

  I.WQ = WQ
  return S, I
end

return M
