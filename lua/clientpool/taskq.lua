--- clientpool.taskq: the coroutine side of a scheduler adapter, for hosts
-- that resume no coroutines themselves (luv, copas).
--
-- `taskq.new{ now = clock }` makes an instance with the adapter functions of
-- docs/design.md (now, current, wait, wake, spawn, background, sleep)
-- plus what a host needs to drive it: `turn()` runs the coroutines that are
-- ready (timers due included), `deadline()` is the time of the next timer,
-- and `changed` (an option) is called when a coroutine becomes ready or a
-- timer is set outside a turn, so the host can re-arm its own timer. clientpool.sched.luv drives an
-- instance with one uv timer, clientpool.sched.copas with copas.step.
--
-- The scheduling is clientpool.loop's: a FIFO ready queue in turns (what
-- becomes ready during a turn runs in the next one), a binary heap of timers
-- with FIFO ties, one reusable entry per coroutine in a weak-keyed table (the
-- entry never references its coroutine), a binary semaphore per coroutine
-- for wake-before-wait. A wait/wake cycle allocates nothing. One difference,
-- for real clocks: a turn fires only the earliest due timer, so timers that
-- fall due together (the process was busy) take effect in deadline order,
-- each with its consequences, as they would on a virtual clock.
--
-- Yield protocol. wait and sleep yield `co, WQ`, where WQ is a table with
-- `insert` and `push` methods, the protocol copas uses for its socket queues
-- (`q:insert(x); q:push(x, co)` by whoever resumed co). So:
-- * when a turn resumes a task and gets `x, q` back with q:push, it calls
--   `q:insert(x); q:push(x, task)`: for WQ that records which coroutine the
--   turn must resume to reach a nested waiter (Lua 5.1's pass-through pcall
--   relays a nested coroutine's yields through its task); for a copas socket
--   queue it hands the task to copas until the socket is ready;
-- * when copas resumes a coroutine that then waits, copas calls WQ's push
--   itself and the outer coroutine is learned the same way.
-- A coroutine that yields anything else is left alone: whoever it waits for
-- (a luv callback, say) resumes it.

local coroutine, debug, math = coroutine, debug, math
local error, pairs, pcall, select, setmetatable, tostring, type =
      error, pairs, pcall, select, setmetatable, tostring, type
local unpack = table.unpack or unpack

local co_create, co_resume, co_yield = coroutine.create, coroutine.resume, coroutine.yield
local co_running, co_status = coroutine.running, coroutine.status
local co_isyieldable = coroutine.isyieldable -- Lua 5.3+, LuaJIT 2.1
local co_close = coroutine.close             -- Lua 5.4
local traceback = debug.traceback
local huge = math.huge

local M = {}

-- entry.state
local IDLE, WAITING, READY = 0, 1, 2
-- entry.res: what a READY coroutine is resumed with
local RES_NONE, RES_WAKE, RES_TIMEOUT, RES_START = 0, 1, 2, 3

local function running_co()
  local co, ismain = co_running()
  if co == nil or ismain then return nil end
  return co
end

local function noop() end

--- Makes an instance. opts.now: the clock (required); opts.changed: called
-- (without arguments) when a coroutine becomes ready or a timer is set while
-- no turn runs (after a turn the host looks at ready() and deadline()
-- anyway); opts.end_in_turn: a task that ends while the host resumed it
-- goes round the queue once more, so it ends in a turn (copas closes the
-- socket a coroutine last waited on when it ends in copas' hands);
-- opts.name: prefix of messages.
function M.new(opts)
  if type(opts) ~= "table" or type(opts.now) ~= "function" then
    error("clientpool.taskq: new expects { now = function }", 2)
  end
  local now = opts.now
  local changed = opts.changed or noop
  local end_in_turn = opts.end_in_turn
  local name = opts.name or "clientpool.taskq"

  local Q = {}
  local in_turn = false
  local resuming -- the coroutine a turn is resuming

  ---------------------------------------------------------------- entries
  local entries = setmetatable({}, { __mode = "k" })
  local tasks, ntasks = {}, 0 -- live foreground tasks (strong until they end)

  local function entry_of(co)
    local e = entries[co]
    if not e then
      e = {
        state = IDLE, res = RES_NONE, gen = 0,
        pos = 0, time = 0, seq = 0,
        woke = false, sleeping = false,
        task = false, bg = false,
        target = nil, -- the coroutine to resume to reach this one (pass-through)
        away = false, -- a task that yielded to someone else (a copas queue, a luv callback)
        nested = false, -- a task whose nested coroutine waits here (pass-through)
        args = nil,
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

  -- A wake that never reached its coroutine (it died first, say closed with
  -- coroutine.close while ready): the waker's give-back runs, so a grant it
  -- carried is not swallowed. e may be nil.
  local function lost_wake(e)
    local f = e and e.lost
    if f then
      local a, b, c = e.la, e.lb, e.lc
      e.lost, e.la, e.lb, e.lc = nil, nil, nil, nil
      f(a, b, c)
    end
  end

  ---------------------------------------------------------------- timer heap
  local hent, hco, hn = {}, {}, 0
  local seq = 0
  local fgtimers = 0

  local function less(a, b)
    return a.time < b.time or (a.time == b.time and a.seq < b.seq)
  end

  local function sift_up(i)
    local e, co = hent[i], hco[i]
    while i > 1 do
      local p = (i - i % 2) / 2
      local pe = hent[p]
      if less(pe, e) then break end
      hent[i] = pe; hco[i] = hco[p]; pe.pos = i
      i = p
    end
    hent[i] = e; hco[i] = co; e.pos = i
  end

  local function sift_down(i)
    local e, co = hent[i], hco[i]
    while true do
      local c = i * 2
      if c > hn then break end
      local ce = hent[c]
      if c < hn and less(hent[c + 1], ce) then c = c + 1; ce = hent[c] end
      if less(e, ce) then break end
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
    if not in_turn then changed() end
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
      if i > 1 and less(le, hent[(i - i % 2) / 2]) then sift_up(i) else sift_down(i) end
    end
  end

  local function set_bg(e, bg)
    if e.bg ~= bg then
      if e.pos > 0 then fgtimers = fgtimers + (bg and -1 or 1) end
      e.bg = bg
    end
  end

  ---------------------------------------------------------------- ready queues
  local rq_co, rq_gen, rq_fg, rqn = {}, {}, {}, 0
  local sp_co, sp_gen, sp_fg = {}, {}, {}
  local fgready = 0

  local function make_ready(co, e, res)
    if e.pos > 0 then heap_remove(e) end
    e.state = READY
    e.res = res
    local gen = e.gen + 1
    e.gen = gen
    rqn = rqn + 1
    rq_co[rqn] = co; rq_gen[rqn] = gen
    local fg = not e.bg
    rq_fg[rqn] = fg
    if fg then fgready = fgready + 1 end
    if not in_turn then changed() end
  end

  local function cancel(e)
    if e.pos > 0 then heap_remove(e) end
    e.state = IDLE
  end

  -- The queue a waiting coroutine yields (see the header).
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
  Q.WQ = WQ

  ---------------------------------------------------------------- adapter
  Q.now = now

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
        if resuming ~= co then Q.sleep(0) end
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

  --- Starts fn(...) in a new task at the next turn; tasks start in spawn order.
  function Q.spawn(fn, ...)
    local co = spawn_task(false, fn, ...)
    return co
  end

  --- Like spawn, but the task does not keep the host's loop alive.
  function Q.background(fn, ...)
    local co = spawn_task(true, fn, ...)
    return co
  end

  --- Suspends the running coroutine for s seconds; sleep(0) lets the other
  -- ready coroutines run first. A wake does not cut it short.
  function Q.sleep(s)
    local co = running_co()
    if not co or (co_isyieldable and not co_isyieldable()) then
      error(name .. ": sleep outside a coroutine", 2)
    end
    if type(s) ~= "number" or s ~= s or s < 0 or s == huge then
      error(name .. ": sleep expects a finite number of seconds >= 0", 2)
    end
    local e = entry_of(co)
    if e.state ~= IDLE then cancel(e) end
    e.sleeping = true
    if s == 0 then
      make_ready(co, e, RES_NONE)
    else
      e.state = WAITING
      heap_push(e, co, now() + s)
    end
    co_yield(co, WQ)
    if e.state ~= IDLE then cancel(e) end
  end

  --- The running coroutine, or nil and a reason where it cannot wait.
  function Q.current()
    local co = running_co()
    if not co then return nil, "not in a coroutine" end
    if co_isyieldable and not co_isyieldable() then
      return nil, "coroutine cannot yield here"
    end
    return co
  end

  --- Suspends the running coroutine h until wake(h) or the absolute deadline
  -- (nil = none): true when woken (or resumed by someone else), nil,
  -- "timeout" at the deadline. A wake that came first returns true at once.
  function Q.wait(h, deadline)
    local co = running_co()
    if not co then return nil, "not in a coroutine" end
    if co_isyieldable and not co_isyieldable() then
      return nil, "coroutine cannot yield here"
    end
    if h ~= co then
      error(name .. ": wait: handle is not the running coroutine", 2)
    end
    if deadline ~= nil and (type(deadline) ~= "number" or deadline ~= deadline) then
      error(name .. ": wait: deadline must be a number or nil", 2)
    end
    local e = entry_of(co)
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
    local a, b = co_yield(co, WQ)
    if e.state ~= IDLE then
      cancel(e) -- resumed by someone else: a spurious return
      return true
    end
    return a, b
  end

  --- Schedules h (waiting in wait) for the next turn, never synchronously;
  -- remembered if it is not waiting. False if h is dead.
  function Q.wake(h, lost, la, lb, lc)
    if type(h) ~= "thread" then
      error(name .. ": wake expects a coroutine handle", 2)
    end
    local e = entries[h]
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
      make_ready(h, e, RES_WAKE)
    elseif state == READY and e.res == RES_TIMEOUT then
      e.res = RES_WAKE
    else
      e.woke = true
    end
    -- the waker's give-back, should h die before this wake reaches it; a
    -- wake without one (a cancel token's) keeps the grant's
    if lost then e.lost, e.la, e.lb, e.lc = lost, la, lb, lc end
    return true
  end

  ---------------------------------------------------------------- driving

  -- One timer a turn, the earliest due: when several are due at once (the
  -- host was busy), each one's coroutine, and what it makes ready, runs
  -- before the next one fires, as on a virtual clock, where time only moves
  -- on when nothing is ready. Every turn fires one, so none starves.
  local function fire_timer(t)
    local e = hent[1]
    if e.time <= t then
      make_ready(hco[1], e, e.sleeping and RES_NONE or RES_TIMEOUT)
    end
  end

  -- After resuming target. Returns an error value or nil.
  local function settle(target, ok, a, b)
    if not ok then
      local err = a
      local ta = type(a)
      if ta == "string" or ta == "number" then err = traceback(target, tostring(a)) end
      forget(target)
      if co_close then pcall(co_close, target) end
      if err == nil then err = name .. ": task failed with nil" end
      return err
    end
    if co_status(target) == "dead" then
      forget(target)
      local te = entries[target]
      if te then te.state = IDLE end
      return nil
    end
    if b == WQ then
      WQ.push(WQ, a, target)
      return nil
    end
    if type(b) == "table" and a ~= nil and type(b.push) == "function" and type(b.insert) == "function" then
      -- a host queue (copas): the host resumes the task from now on
      entry_of(target).away = true
      b:insert(a)
      b:push(a, target)
      return nil
    end
    -- something else resumes it (or nobody): leave it alone
    entry_of(target).away = true
    return nil
  end

  --- Runs one turn: fires the earliest timer that is due, then resumes
  -- what was ready when the turn began, in order. Returns a task's error (with its
  -- traceback), the rest of the turn staying queued, or nil.
  function Q.turn()
    if hn > 0 then fire_timer(now()) end
    if rqn == 0 then return nil end
    in_turn = true
    local l_co, l_gen, l_fg, n = rq_co, rq_gen, rq_fg, rqn
    rq_co, rq_gen, rq_fg, rqn = sp_co, sp_gen, sp_fg, 0
    sp_co, sp_gen, sp_fg = l_co, l_gen, l_fg
    for i = 1, n do
      local co, gen = l_co[i], l_gen[i]
      if l_fg[i] then fgready = fgready - 1 end
      l_co[i] = nil; l_gen[i] = nil; l_fg[i] = nil
      local e = entries[co]
      if e and e.gen == gen and e.state == READY then
        local target = e.target or co
        e.target = nil
        e.state = IDLE
        if co_status(co) == "dead" then
          forget(co)
          lost_wake(e)
        elseif co_status(target) == "suspended" then
          local te = target ~= co and entries[target] or e
          if te then te.away = false; te.nested = false end
          local res, ok, a, b = e.res
          e.lost = nil
          resuming = target
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
          resuming = nil
          local err = settle(target, ok, a, b)
          if err ~= nil then
            -- keep what was still due this turn ahead of what came after
            local m = 0
            for j = i + 1, n do
              m = m + 1
              l_co[m], l_gen[m], l_fg[m] = l_co[j], l_gen[j], l_fg[j]
            end
            for j = 1, rqn do
              m = m + 1
              l_co[m], l_gen[m], l_fg[m] = rq_co[j], rq_gen[j], rq_fg[j]
              rq_co[j], rq_gen[j], rq_fg[j] = nil, nil, nil
            end
            for j = m + 1, n do l_co[j], l_gen[j], l_fg[j] = nil, nil, nil end
            sp_co, sp_gen, sp_fg = rq_co, rq_gen, rq_fg
            rq_co, rq_gen, rq_fg, rqn = l_co, l_gen, l_fg, m
            in_turn = false
            return err
          end
        end
      end
    end
    in_turn = false
    return nil
  end

  --- Number of coroutines ready to run.
  function Q.ready() return rqn end

  --- Time of the next timer (now() units), or nil.
  function Q.deadline()
    if hn == 0 then return nil end
    return hent[1].time
  end

  local function sweep()
    for co in pairs(tasks) do
      if co_status(co) == "dead" then forget(co) end
    end
    return ntasks
  end

  --- Whether foreground work is left: a live task, a foreground timer or a
  -- ready foreground coroutine. (Tasks that ended while someone else
  -- resumed them are forgotten here, when only tasks are left.)
  function Q.busy()
    return fgready > 0 or fgtimers > 0 or (ntasks > 0 and sweep() > 0)
  end

  --- Whether a foreground coroutine is ready or has a timer.
  function Q.fgwork()
    return fgready > 0 or fgtimers > 0
  end

  --- Whether foreground work can still move on its own: something ready, a
  -- foreground timer, or a live task away (handed to the host, or waiting for
  -- something else to resume it). False with live tasks means every one of
  -- them waits for a wake that nothing here will give.
  function Q.moving()
    if fgready > 0 or fgtimers > 0 then return true end
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

  --- Counters: ready, timers, tasks (live foreground tasks).
  function Q.stats(t)
    t = t or {}
    t.ready = rqn
    t.timers = hn
    t.tasks = ntasks
    return t
  end

  return Q
end

return M
