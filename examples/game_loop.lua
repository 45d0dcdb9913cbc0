-- A game server's tick loop waiting on a clientpool: the custom-table
-- scheduler contract (docs/design.md, docs/hosts.md "A game loop").
--
-- The loop runs 60 frames a second of game time and resumes each script (a
-- coroutine) at most once a frame. NPC scripts make outbound calls to a
-- simulated backend through a pool of 4 connections; a call takes some
-- ticks, connecting takes more, and a few calls fail (the connection is then
-- retired). The pool waits through an adapter written below, against the
-- loop itself: no other scheduler is involved. Game time is virtual (frame /
-- 60), so the example runs as fast as the CPU allows; a real server would
-- pace frames and may take now() from its own frame clock all the same.
--
--   lua examples/game_loop.lua             -- 600 frames (10 s of game time)
--   GAME_LOOP_FRAMES=120 lua examples/game_loop.lua
--   loadfile("examples/game_loop.lua")({ frames = 120, quiet = true }) -- returns the summary
--
-- Prints a short summary: calls made, how many waited and how long, and how
-- few connections served them.

local clientpool = require "clientpool"

local opts = ...
if type(opts) ~= "table" then opts = {} end
local FRAMES = opts.frames or tonumber(os.getenv("GAME_LOOP_FRAMES") or "") or 600
local NPCS = opts.npcs or 24
local QUIET = opts.quiet

local TICK_RATE = 60            -- frames per second of game time
local function ticks(n) return n / TICK_RATE end

local co_create, co_resume, co_yield = coroutine.create, coroutine.resume, coroutine.yield
local co_running, co_status = coroutine.running, coroutine.status
local co_isyieldable = coroutine.isyieldable
local unpack = table.unpack or unpack

---------------------------------------------------------------------------
-- The tick loop and its scheduler adapter
---------------------------------------------------------------------------

-- What wait and sleep yield: the loop sees it, with the coroutine that waits.
-- A coroutine other than the script the loop resumed means a nested
-- coroutine whose yields pass through the script (on PUC Lua 5.1 the pool
-- runs hooks in one): the loop resumes the script, which passes it down.
local WAITING = {}

local function new_game()
  local game = { frame = 0, tasks = {}, over = false }
  local waits = setmetatable({}, { __mode = "k" }) -- co -> { deadline, woke, sleep }
  local kept = setmetatable({}, { __mode = "k" })  -- co -> a wake that came before the wait
  local running                                    -- the script being resumed

  local function now() return game.frame / TICK_RATE end

  -- The adapter: the custom-table contract.
  local sched = {}
  sched.now = now

  function sched.current()
    local co, ismain = co_running()
    if co == nil or ismain then return nil, "not in a game script" end
    if co_isyieldable and not co_isyieldable() then return nil, "the script cannot yield here" end
    if not running then return nil, "not in a game script" end
    return co
  end

  -- Suspends the script until wake(h) or the deadline; resumed by a frame.
  function sched.wait(h, deadline)
    if kept[h] then
      kept[h] = nil
      return true
    end
    if deadline and deadline <= now() then return nil, "timeout" end
    waits[h] = { deadline = deadline, woke = false }
    local r1, r2 = co_yield(WAITING, h)
    waits[h] = nil
    return r1, r2
  end

  -- Never resumes anything itself: the waiter runs at a frame.
  function sched.wake(h)
    if co_status(h) == "dead" then return false end
    local w = waits[h]
    if w and not w.sleep then w.woke = true else kept[h] = true end
    return true
  end

  function sched.sleep(s)
    local co = co_running()
    local until_t = now() + s
    repeat
      waits[co] = { deadline = until_t, sleep = true }
      co_yield(WAITING, co)
      waits[co] = nil
    until now() >= until_t
  end

  local function spawn_task(bg, fn, ...)
    local t = { co = co_create(fn), bg = bg, args = { n = select("#", ...), ... } }
    game.tasks[#game.tasks + 1] = t
    return t.co
  end
  function sched.spawn(fn, ...) return spawn_task(false, fn, ...) end
  -- The pool's timer task: it does not keep the game going.
  function sched.background(fn, ...) return spawn_task(true, fn, ...) end

  function sched.log(msg) io.stderr:write("game: ", tostring(msg), "\n") end

  -- One frame: every script that is due is resumed once, in spawn order. A
  -- script is due when it is new, woken, past its deadline, or yielded
  -- plainly (coroutine.yield(): "until the next frame").
  function game.step()
    game.frame = game.frame + 1
    local t_now = now()
    local list, n = game.tasks, #game.tasks
    local keep = {}
    for i = 1, n do
      local t = list[i]
      local co = t.co
      if co_status(co) ~= "dead" then
        local args, due
        if t.args then
          args, t.args, due = t.args, nil, true
        else
          local w = t.waiter and waits[t.waiter]
          if not w then
            due, args = true, { n = 0 }
          elseif w.woke then
            due, args = true, { n = 1, true }
          elseif w.deadline and t_now >= w.deadline then
            due, args = true, w.sleep and { n = 0 } or { n = 2, nil, "timeout" }
          end
        end
        if due then
          running = t
          local r = { co_resume(co, unpack(args, 1, args.n)) }
          running = nil
          if not r[1] then error(debug.traceback(co, tostring(r[2])), 0) end
          t.waiter = (r[2] == WAITING) and r[3] or nil
        end
        if co_status(co) ~= "dead" then keep[#keep + 1] = t end
      end
    end
    for i = n + 1, #list do keep[#keep + 1] = list[i] end -- spawned during the frame
    game.tasks = keep
  end

  -- Frames until no foreground script is left (or max frames).
  function game.run(max)
    for _ = 1, max do
      local fg = false
      for _, t in ipairs(game.tasks) do
        if not t.bg then fg = true; break end
      end
      if not fg then return end
      game.step()
    end
  end

  game.sched = sched
  return game
end

---------------------------------------------------------------------------
-- A simulated backend: connections with latency in ticks
---------------------------------------------------------------------------

local seed = 12345
local function random(n) -- deterministic, and the same on every interpreter
  seed = (seed * 16807) % 2147483647    -- Park-Miller: exact in doubles too
  return seed % n
end

local game = new_game()
local sched = game.sched

local backend = { opened = 0, closed = 0, calls = 0, broken = 0 }

local Conn = {}
Conn.__index = Conn

function backend.connect()
  sched.sleep(ticks(6))               -- handshake: 6 ticks
  backend.opened = backend.opened + 1
  return setmetatable({ id = backend.opened, open = true }, Conn)
end

function Conn:call(request)
  if not self.open then return nil, "closed" end
  sched.sleep(ticks(2 + random(4)))   -- a round trip: 2-5 ticks
  backend.calls = backend.calls + 1
  if random(50) == 0 then             -- 2% of calls break the connection
    backend.broken = backend.broken + 1
    return nil, "connection reset"
  end
  return "ok " .. request
end

function Conn:close()
  if self.open then
    self.open = false
    backend.closed = backend.closed + 1
  end
end

---------------------------------------------------------------------------
-- The pool and the scripts
---------------------------------------------------------------------------

local pool = clientpool.new {
  create = function() return backend.connect() end,
  destroy = function(conn) conn:close() end,
  max_live = 4,
  acquire_timeout = ticks(30),        -- half a second of game time
  idle_timeout = 5,
  scheduler = sched,                  -- the custom table
}

local result = { ok = 0, failed = 0, timeouts = 0, max_waiting = 0 }

local function npc(id)
  while not game.over do
    for _ = 1, 1 + random(40) do coroutine.yield() end -- think for a few frames
    if game.over then break end
    local lease, code = pool:acquire()
    if not lease then
      result.timeouts = result.timeouts + (code == "timeout" and 1 or 0)
    else
      local reply = lease.client:call("quest " .. id)
      if reply then
        result.ok = result.ok + 1
        lease:release()
      else
        result.failed = result.failed + 1
        lease:release(false)           -- the connection saw an error: retire it
      end
    end
  end
end

for id = 1, NPCS do sched.spawn(npc, id) end

-- A watcher script samples the queue each frame; it ends the game.
sched.spawn(function()
  while game.frame < FRAMES do
    local s = pool:stats()
    if s.waiting > result.max_waiting then result.max_waiting = s.waiting end
    coroutine.yield()
  end
  game.over = true
end)

game.run(FRAMES + 10 * TICK_RATE)      -- the game, then the calls in flight
pool:close()
game.run(TICK_RATE)                    -- destroy hooks of the closed pool

local s = pool:stats()
result.frames = game.frame
result.game_seconds = game.frame / TICK_RATE
result.npcs = NPCS
result.calls = backend.calls
result.opened = backend.opened
result.closed = backend.closed
result.wait_count = s.wait_count
result.wait_time = s.wait_time
result.live = s.live
result.leases = s.leases
result.max_live = 4

if not QUIET then
  print(("game loop: %d frames (%.1f s of game time), %d NPC scripts"):format(
    result.frames, result.game_seconds, NPCS))
  print(("  calls: %d ok, %d failed (connection retired), %d timed out"):format(
    result.ok, result.failed, result.timeouts))
  print(("  connections: %d opened for %d calls (max_live 4), all %d closed at the end"):format(
    result.opened, result.calls, result.closed))
  print(("  waiting: %d acquisitions waited, %.1f frames on average; at most %d waited at once"):format(
    s.wait_count, s.wait_count > 0 and s.wait_time / s.wait_count * TICK_RATE or 0, result.max_waiting))
end

return result
