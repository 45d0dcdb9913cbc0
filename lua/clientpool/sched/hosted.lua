--- clientpool.sched.hosted (internal): the scheduler core, pumped by a host.
--
-- For hosts that resume no coroutines themselves (luv, copas): the adapter
-- functions of docs/design.md "The scheduler adapter contract" (now, current, wait, wake, spawn,
-- background, sleep) over a ready queue and timer heap of their own
-- (clientpool.sched.core, with the hosted yield protocol), plus what the
-- host needs to drive them: `turn()` runs the coroutines that are ready
-- (the earliest due timer included), `deadline()` is the time of the next
-- timer, and `changed` (an option) is called when a coroutine becomes ready
-- or a timer is set outside a turn, so the host can re-arm its own timer.
-- clientpool.sched.luv drives an instance with one uv timer,
-- clientpool.sched.copas with copas.step. The built-in loop
-- (clientpool.loop) is the same core driven by its own run().
--
-- One difference from the loop, for real clocks: a turn fires only the
-- earliest due timer, so timers that fall due together (the process was
-- busy) take effect in deadline order, each with its consequences, as they
-- would on a virtual clock.

local core = require "clientpool.sched.core"

local error, type = error, type

local M = {}

--- Makes an instance. opts.now: the clock (required); opts.changed: called
-- (without arguments) when a coroutine becomes ready or a timer is set while
-- no turn runs (after a turn the host looks at ready() and deadline()
-- anyway); opts.end_in_turn: a task that ends while the host resumed it
-- goes round the queue once more, so it ends in a turn (copas closes the
-- socket a coroutine last waited on when it ends in copas' hands);
-- opts.name: prefix of messages.
function M.new(opts)
  if type(opts) ~= "table" or type(opts.now) ~= "function" then
    error("clientpool.sched.hosted: new expects { now = function }", 2)
  end
  local Q, I = core.new { now = opts.now, name = opts.name or "clientpool.sched.hosted", hosted = true,
                          changed = opts.changed, end_in_turn = opts.end_in_turn }
  --- turn() -> a task's error or nil; ready() -> coroutines ready to run;
  -- deadline() -> the next timer's time or nil; busy(), fgwork(), moving():
  -- whether foreground work is left, ready or timed, able to move on its
  -- own (see clientpool.sched.core).
  Q.turn, Q.ready, Q.deadline = I.turn, I.ready, I.deadline
  Q.busy, Q.fgwork, Q.moving = I.busy, I.fgwork, I.moving
  Q.WQ = I.WQ
  return Q
end

local ADAPTER = { "current", "wait", "wake", "spawn", "background", "sleep", "stats" }

--- Gives adapter A the functions of instance q that a host adapter hands
-- on as they are, and the stderr log.
function M.adapt(A, q)
  for i = 1, #ADAPTER do A[ADAPTER[i]] = q[ADAPTER[i]] end
  A.turn_clock = q.turn_clock   -- (set while q's turn runs: docs/performance.md "Time per turn")
  A.log = core.log
  return A
end

return M
