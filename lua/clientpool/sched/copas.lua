--- Scheduler adapter "copas": waiting inside a copas dispatcher.
--
-- Copas resumes coroutines when their sockets are ready; Debian's copas (1.x)
-- has no timers and no wakeup. The adapter keeps its own ready queue and
-- timer heap (clientpool.sched.hosted) and drives them between copas.step calls
-- whose select timeout is the next deadline. Coroutines move between the two
-- by copas' own yield protocol, `coroutine.yield(object, queue)` answered by
-- `queue:insert(object); queue:push(object, co)` (kept by copas up to 4.x):
-- a task of the adapter that does socket I/O with copas.send/receive/connect
-- is handed to copas' socket queue; a coroutine copas runs (a server handler,
-- a copas.addthread thread) that waits in the pool is handed to the adapter.
--
--   local copas = require "copas"
--   local sched = require "clientpool.sched.copas"
--   local pool = clientpool.new { create = ..., max_live = 8, scheduler = "copas" }
--   copas.addserver(server, function(skt) ... pool:acquire() ... end)
--   sched.spawn(function() ... end)
--   sched.run()      -- until the adapter's own tasks are done
--   -- or, serving forever: while true do sched.step() end
--
-- Contract details (docs/decisions.md, "Hosts"): handle = the running
-- coroutine; wake never resumes synchronously (the coroutine runs at the
-- next step); a task's error is re-raised by run()/step() with its traceback
-- (an error in a coroutine copas resumes is copas' to report). A coroutine
-- copas started that ends while the adapter resumed it is not closed by copas'
-- autoclose: close its socket yourself (a copas.addserver handler is taken
-- care of: see the wrapper below).

local copas = require "copas"
local hosted = require "clientpool.sched.hosted"
local core = require "clientpool.core"

local error = error
local monotime = core.monotime

local NAME = "clientpool.sched.copas"

local new

-- The instance whose step()/run() is in copas.step now (see addserver).
local stepping

-- copas.addserver, wrapped (issue 12, finding 7). copas ends a handler
-- in its own resume and then closes the socket that resume was for
-- (autoclose): a handler whose last wait was its pooled connection (it
-- read the upstream's reply, released the lease, answered its client
-- without blocking) had that connection closed, idle in the pool by then,
-- and the next handler got a dead socket. A wrapped TCP handler that
-- returns while an instance of this adapter is stepping copas takes one
-- turn of that instance (sleep(0): the coroutine moves to its queue, as a
-- wait in the pool does) and ends there, where copas closes nothing; it
-- then closes its own client socket when copas.autoclose is on, as copas
-- would have for a handler whose last wait was its client. A handler that
-- raises is copas' to report, as before. Installed once per copas module,
-- when this adapter is first required: servers added before keep copas'
-- behaviour (docs/hosts.md).
if type(copas.addserver) == "function" and not copas._clientpool_addserver then
  local addserver = copas.addserver
  copas._clientpool_addserver = addserver
  copas.addserver = function(server, handler, timeout)
    if type(handler) ~= "function" or tostring(server):sub(1, 3) == "udp" then
      return addserver(server, handler, timeout)
    end
    return addserver(server, function(skt, ...)
      handler(skt, ...)
      local A = stepping
      if A == nil then return end     -- copas.loop() without the adapter: as before
      A.sleep(0)
      if copas.autoclose and skt then skt:close() end
    end, timeout)
  end
end

new = function()
  local A = { name = "copas", monotonic = true }
  -- end_in_turn: copas 1.x to 4.x close the socket a coroutine waited on
  -- last when it ends while copas resumed it; a task ending right after
  -- its last receive would lose the pooled connection it read from
  local q = hosted.new { now = monotime, name = NAME, end_in_turn = true }
  A.now = monotime
  hosted.adapt(A, q)   -- current, wait, wake, spawn, background, sleep, stats, log

  -- select timeout until the adapter needs the CPU again (nil = none)
  local function timeout(max)
    local t
    if q.ready() > 0 then
      t = 0
    else
      local d = q.deadline()
      if d then
        t = d - monotime()
        if t < 0 then t = 0 end
      end
    end
    if max ~= nil and (t == nil or max < t) then t = max end
    return t
  end

  --- One round: the adapter's ready coroutines (timers due included), then
  -- copas.step with a select timeout of at most max seconds (nil = until a
  -- socket is ready or the adapter's next deadline). Raises a task's error.
  function A.step(max)
    local err = q.turn()
    if err ~= nil then error(err, 0) end
    local prev = stepping
    stepping = A
    copas.step(timeout(max))
    stepping = prev
  end

  --- Steps until no foreground task, timer or ready coroutine of the adapter
  -- is left (copas servers do not count). Re-raises a task's error; the
  -- other tasks stay scheduled. Raises when tasks are left that wait with no
  -- deadline while none of them waits on a socket (nothing can wake them).
  function A.run()
    while true do
      local err = q.turn()
      if err ~= nil then error(err, 0) end
      if not q.busy() then return end
      if q.ready() == 0 and not q.moving() then
        if not q.busy() then return end
        error(("%s: deadlock: %d task(s) wait with no deadline and nothing left to wake them")
              :format(NAME, q.stats().tasks), 2)
      end
      local prev = stepping
      stepping = A
      copas.step(timeout(nil))
      stepping = prev
    end
  end

  A.new = new
  return A
end

return new()
