--- clientpool.loop: a small coroutine scheduler for plain Lua.
--
-- The default scheduler of clientpool outside any host (OpenResty, cqueues,
-- luv, copas). `require "clientpool.loop"` is a ready instance on the real
-- monotonic clock; `loop.new{ clock = "virtual" }` makes an independent one
-- whose clock jumps to the next timer when nothing is ready, so timeout tests
-- finish at once and always in the same order.
--
-- Every function is a plain closure over its instance (`loop.spawn(f)`, not
-- `loop:spawn(f)`), so an instance doubles as a scheduler adapter table
-- (docs/design.md, "The scheduler adapter contract").
--
-- Internals, in short:
-- * Each coroutine the loop has seen owns one reusable record (`entry`) in a
--   weak-keyed table: state, heap position, pending-wake flag. The entry never
--   references its coroutine, so an abandoned coroutine is collected even on
--   Lua 5.1/LuaJIT, whose weak tables are not ephemerons.
-- * Timers are a binary min-heap over (deadline, insertion sequence): ties
--   fire in FIFO order. An entry knows its heap index, so a wake removes its
--   timer in O(log n) at once; the heap never holds stale entries.
-- * Ready coroutines sit in two swapped queues (parallel arrays, reused): a
--   turn runs what was ready when it began, in order; what becomes ready
--   during the turn runs in the next one. Queue items carry the entry's
--   generation, so an item made stale by an outside resume is skipped.
-- * A wait/wake cycle allocates nothing: no closures, no tables.

local coroutine, debug, io, math = coroutine, debug, io, math
local error, pairs, pcall, require, select, setmetatable, tostring, type =
      error, pairs, pcall, require, select, setmetatable, tostring, type
local unpack = table.unpack or unpack

local co_create, co_resume, co_yield = coroutine.create, coroutine.resume, coroutine.yield
local co_running, co_status = coroutine.running, coroutine.status
local co_isyieldable = coroutine.isyieldable -- Lua 5.3+, LuaJIT 2.1; nil on 5.1
local co_close = coroutine.close             -- Lua 5.4 only
local traceback = debug.traceback
local huge = math.huge

-- What sleep and wait yield, followed by the coroutine that registered. It is
-- shared by all instances: a loop that sees it leaves the coroutine alone
-- (whichever instance it waits on will resume it). On Lua 5.1 a pass-through
-- pcall (coxpcall style) relays the yield of a nested coroutine to the task:
-- the loop then sees MARK with a coroutine other than the one it resumed, and
-- from then on resumes the outer one, which resumes the nested one in turn.
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

-- Busy-wait: only when neither clientpool.core.sleep nor luasocket exist.
-- It burns a CPU until the deadline, but keeps timers exact; os.execute
-- ("sleep") cannot sleep below a second portably and forks a process.
local function busy_wait(s, now)
  local t = now() + s
  repeat until now() >= t
end

local new

new = function(opts)
  if opts ~= nil and type(opts) ~= "table" then
    error("clientpool.loop: new expects an options table or nil", 2)
  end
  opts = opts or {}
  local clock = opts.clock
  if clock == nil then clock = "real" end
  if clock ~= "real" and clock ~= "virtual" and type(clock) ~= "function" then
    error("clientpool.loop: option clock must be \"real\", \"virtual\" or a function", 2)
  end
  local start = opts.start
  if start ~= nil then
    if clock ~= "virtual" then
      error("clientpool.loop: option start needs clock = \"virtual\"", 2)
    end
    if type(start) ~= "number" or start ~= start or start == huge or start == -huge then
      error("clientpool.loop: option start must be a finite number", 2)
    end
  end

  local L = {}
  local virtual = clock == "virtual"

  ---------------------------------------------------------------- clock
  local vnow = start or 0
  local monotime, napfn

  local now
  if virtual then
    now = function() return vnow end
  elseif clock == "real" then
    -- Looked up at first use: requiring this module must work before the C
    -- module is built, and a virtual instance never loads it.
    now = function()
      if not monotime then
        local ok, core = pcall(require, "clientpool.core")
        if not ok or type(core) ~= "table" or type(core.monotime) ~= "function" then
          error("clientpool.loop: the real clock needs clientpool.core.monotime ("
                .. tostring(ok and "missing" or core) .. ")", 2)
        end
        monotime = core.monotime
      end
      return monotime()
    end
  else
    now = clock
  end

  -- Block the process for s seconds (real clocks only, s > 0).
  local function nap(s)
    if not napfn then
      local ok, core = pcall(require, "clientpool.core")
      if ok and type(core) == "table" and type(core.sleep) == "function" then
        napfn = core.sleep -- nanosleep
      else
        local sok, socket = pcall(require, "socket")
        if sok and type(socket) == "table" and type(socket.sleep) == "function" then
          napfn = socket.sleep
        else
          napfn = function(d) return busy_wait(d, now) end
        end
      end
    end
    napfn(s)
  end

  ---------------------------------------------------------------- entries
  -- co -> entry. Weak keys: a coroutine nobody references any more (say a
  -- waiter whose pool was dropped) goes away with its entry. Foreground tasks
  -- are also held strongly by `tasks` until they end.
  local entries = setmetatable({}, { __mode = "k" })
  local tasks, ntasks = {}, 0 -- live foreground tasks
  local running = false       -- inside run()

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
  -- Items: rq_co[i], rq_gen[i] (entry.gen when queued), rq_fg[i] (kept run()
  -- alive when queued). sp_* is the spare set, swapped in each turn.
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
  end

  -- A coroutine came back from a sleep/wait without the loop resuming it.
  local function cancel(e)
    if e.pos > 0 then heap_remove(e) end
    e.state = IDLE -- a queued item, if any, is now stale
  end

  ---------------------------------------------------------------- public API

  --- Current time in seconds (monotonic; virtual instances: the virtual clock).
  L.now = now

  --- Start `fn(...)` in a new task at the next turn of run(). Returns the task
  -- (its coroutine). Tasks start in spawn order.
  local function spawn_task(bg, fn, ...)
    if type(fn) ~= "function" then
      error("clientpool.loop: " .. (bg and "background" or "spawn") .. " expects a function", 3)
    end
    local co = co_create(fn)
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

  function L.spawn(fn, ...)
    local co = spawn_task(false, fn, ...) -- not a tail call: error level 3
    return co
  end

  --- Like spawn, but the task does not keep run() going: run() returns when
  -- only background tasks and their timers are left; they stay suspended and
  -- go on at the next run(). A background task is held weakly while it waits
  -- without a deadline, so it is collected with whatever alone could wake it.
  function L.background(fn, ...)
    local co = spawn_task(true, fn, ...)
    return co
  end

  --- Suspend the running coroutine for s seconds (s >= 0). sleep(0) lets the
  -- other ready tasks run first. Raises outside a coroutine.
  function L.sleep(s)
    local co = running_co()
    if not co or (co_isyieldable and not co_isyieldable()) then
      error("clientpool.loop: sleep outside a coroutine", 2)
    end
    if type(s) ~= "number" or s ~= s or s < 0 or s == huge then
      error("clientpool.loop: sleep expects a finite number of seconds >= 0", 2)
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
    co_yield(MARK, co)
    if e.state ~= IDLE then cancel(e) end -- resumed by someone else: stop here
  end

  --- A handle for the running coroutine (the coroutine itself), or
  -- nil, reason where it cannot wait.
  function L.current()
    local co = running_co()
    if not co then return nil, "not in a coroutine" end
    if co_isyieldable and not co_isyieldable() then
      return nil, "coroutine cannot yield here"
    end
    return co
  end

  --- Suspend the running coroutine (whose handle is h) until wake(h) or the
  -- absolute deadline (now() units; nil = none). Returns true when woken,
  -- nil, "timeout" at the deadline. A wake that came first makes it return
  -- true at once. Returns nil, "not in a coroutine" where it cannot wait.
  -- Spurious returns (true) happen if someone else resumes the coroutine.
  function L.wait(h, deadline)
    local co = running_co()
    if not co then return nil, "not in a coroutine" end
    if co_isyieldable and not co_isyieldable() then
      return nil, "coroutine cannot yield here"
    end
    if h ~= co then
      error("clientpool.loop: wait: handle is not the running coroutine", 2)
    end
    if deadline ~= nil and (type(deadline) ~= "number" or deadline ~= deadline) then
      error("clientpool.loop: wait: deadline must be a number or nil", 2)
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
    local a, b = co_yield(MARK, co)
    if e.state ~= IDLE then
      cancel(e)
      return true
    end
    return a, b
  end

  --- Schedule the coroutine h, waiting in wait(), to resume at the next turn
  -- (never synchronously). If it is not waiting, the wake is remembered for
  -- its next wait (several count once). Returns false if h is dead.
  function L.wake(h, lost, la, lb, lc)
    if type(h) ~= "thread" then
      error("clientpool.loop: wake expects a coroutine handle", 2)
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
      e.res = RES_WAKE -- timed out but not resumed yet: the wake wins
    else
      e.woke = true
    end
    -- the waker's give-back, should h die before this wake reaches it; a
    -- wake without one (a cancel token's) keeps the grant's
    if lost then e.lost, e.la, e.lb, e.lc = lost, la, lb, lc end
    return true
  end

  ---------------------------------------------------------------- run
  local function fire_timers(t)
    while hn > 0 do
      local e = hent[1]
      if e.time > t then break end
      make_ready(hco[1], e, e.sleeping and RES_NONE or RES_TIMEOUT)
    end
  end

  local function sweep_dead_tasks()
    for co in pairs(tasks) do
      if co_status(co) == "dead" then forget(co) end
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
      return err == nil and "clientpool.loop: task failed with nil" or err
    end
    if co_status(target) == "dead" then
      forget(target)
      local te = entries[target]
      if te then te.state = IDLE end
    elseif a == MARK then
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

  -- One turn: run what is ready now, in order. Returns an error value or nil.
  local function turn()
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
          forget(co) -- killed elsewhere (coroutine.close) while it slept
          lost_wake(e)
        elseif co_status(target) == "suspended" then
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
          local err = settle(target, ok, a, b)
          if err ~= nil then
            -- Keep what was still due this turn ahead of what came after.
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
            return err
          end
        elseif co_status(target) == "dead" then
          forget(target) -- (5.1) the task around a nested waiter was killed elsewhere
          lost_wake(e)
        end
      end
    end
    return nil
  end

  local function body()
    while true do
      if hn > 0 then fire_timers(now()) end
      if ntasks == 0 and fgtimers == 0 and fgready == 0 then return end
      if rqn > 0 then
        local err = turn()
        if err ~= nil then return err end
      else
        if fgtimers == 0 then
          -- Only tasks that wait are left: any killed elsewhere (say by
          -- coroutine.close) no longer count. Background timers may still
          -- wake the others; with no timer at all, nothing ever will.
          sweep_dead_tasks()
          if ntasks == 0 then return end
          if hn == 0 then
            return ("clientpool.loop: deadlock: %d task(s) wait with no deadline and nothing left to wake them")
                   :format(ntasks)
          end
        end
        -- Nothing ready: go to the next timer.
        local t = hent[1].time
        if virtual then
          if t > vnow then vnow = t end
        else
          local d = t - now()
          if d > 0 then nap(d) end
        end
      end
    end
  end

  --- Run tasks until no task and no timer is left (background ones aside).
  -- Re-raises a task's error with the task's traceback; the other tasks stay
  -- scheduled. Not re-entrant. Raises if tasks wait forever with no timer.
  function L.run()
    if running then
      error("clientpool.loop: run() is already running (it is not re-entrant)", 2)
    end
    running = true
    local ok, err = pcall(body)
    running = false
    if not ok then error(err, 0) end
    if err ~= nil then error(err, 0) end
  end

  --- Debug counters: ready queue length, timers in the heap, live
  -- foreground tasks. Fills t if given.
  function L.stats(t)
    t = t or {}
    t.ready = rqn
    t.timers = hn
    t.tasks = ntasks
    return t
  end

  --- Report a message (listener and destroy-hook errors) on stderr.
  function L.log(msg)
    io.stderr:write(tostring(msg), "\n")
  end

  --- now() is clientpool.core.monotime (real clock instances only).
  L.monotonic = clock == "real"
  L.new = new
  return L
end

return new()
