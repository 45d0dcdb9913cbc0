-- bench/soak.lua: a long run of one pool under random failures (make soak).
--
-- 10k coroutines on the built-in loop (virtual clock by default) take 1M
-- acquisitions between them through every form (acquire with and without a
-- timeout or a cancel token, try_acquire, checkout/checkin, with), over a
-- few warm keys and many short-lived ones, while the hooks fail at random
-- (create returns nil, throws or is slow; validate says no or throws;
-- destroy throws; idle clients die). The Lua heap after a full collection
-- is printed after the warm-up (a fifth of the acquisitions) and at the end,
-- with every coroutine still alive in both; the end must be within a small
-- margin of the warm-up (a leak of a few bytes per acquisition would not
-- be). The heap still creeps up slowly after the warm-up and levels off
-- (Lua 5.4, 10k coroutines: +2.6 % from 200k to 1M acquisitions, flat
-- from about 1.75M on): each coroutine's stack keeps the deepest call
-- path it has been suspended in, and rarer paths reach more coroutines as
-- the run goes on. Then everything is released and closed: no lease, waiter, client or
-- task may be left. Ends with an error (exit status 1) on any failure; on
-- success the script returns normally, so the interpreter closes its state
-- (valgrind's leak check sees everything freed: make soak-valgrind).
--
-- usage: lua bench/soak.lua [--coroutines N] [--acquisitions M] [--margin F]
--                           [--clock virtual|real] [--seed S] [--trace K]
--   defaults: 10000 coroutines, 1000000 acquisitions, margin 0.05 (5 %),
--   virtual clock, seed 1. --trace K prints the heap every K acquisitions.
local clientpool = require "clientpool"
local Loop = require "clientpool.loop"

local opts = { coroutines = 10000, acquisitions = 1000000, margin = 0.05, clock = "virtual", seed = 1, trace = false }
do
  local i = 1
  while i <= #arg do
    local a = arg[i]
    local name = a:match("^%-%-(.+)$")
    if name and opts[name] ~= nil then
      local v = arg[i + 1]
      if v == nil then error("soak: " .. a .. " needs a value", 0) end
      opts[name] = tonumber(v) or v
      i = i + 2
    else
      error("soak: unknown argument " .. tostring(a) ..
            " (--coroutines N --acquisitions M --margin F --clock virtual|real --seed S --trace K)", 0)
    end
  end
end
local N, M = opts.coroutines, opts.acquisitions

local function say(...)
  io.write("soak: ", string.format(...), "\n")
  io.flush()
end

-- Park-Miller: the same sequence on every interpreter.
local seed = opts.seed % 2147483646 + 1
local function rand(n)
  seed = seed * 16807 % 2147483647
  return seed % n + 1
end
local function chance(p) return rand(1000000) <= p * 1000000 end

-- Resident set size in MB (Linux), or nil.
local function rss_mb()
  local f = io.open("/proc/self/statm")
  if not f then return nil end
  local _, pages = f:read("*n", "*n")  -- second field: resident pages
  f:close()
  return pages and pages * 4096 / 1048576
end

local function heap_kb()
  collectgarbage("collect")
  collectgarbage("collect")
  return collectgarbage("count")
end

local loop = Loop.new { clock = opts.clock }
local logged = 0
local sched = setmetatable({ log = function() logged = logged + 1 end }, { __index = loop })

-- hooks ------------------------------------------------------------------
local open_clients, created, destroy_calls = 0, 0, 0
local function create()
  local r = rand(100)
  if r <= 4 then return nil, "refused" end
  if r <= 6 then error("create exploded") end
  if r <= 20 then sched.sleep(rand(5) * 0.001) end
  created = created + 1
  open_clients = open_clients + 1
  return { id = created, alive = true, uses = 0 }
end
local function destroy(c)
  destroy_calls = destroy_calls + 1
  if c and c.alive ~= nil then
    c.alive = nil
    open_clients = open_clients - 1
  end
  if chance(0.05) then error("destroy exploded") end
end
local function validate(c)
  local r = rand(100)
  if r <= 2 then return false end
  if r <= 3 then error("validate exploded") end
  return c.alive
end

local pool = clientpool.new {
  create = create, destroy = destroy, validate = validate, scheduler = sched,
  max_live = 64, max_idle = 48, max_waiting = N + 16, acquire_timeout = 2,
  idle_timeout = 5, max_lifetime = 30, lifetime_jitter = 0.2, keys = { "a", "b", "c" }, seed = opts.seed,
}

-- workers ----------------------------------------------------------------
local granted, attempts, stop = 0, 0, false
local outcomes = {}
local warm_kb, warm_rss, end_kb, end_rss
local WARM = math.floor(M / 5)
local running = 0
local failure
local next_trace = opts.trace or 0

local function count(code)
  outcomes[code] = (outcomes[code] or 0) + 1
end

local KEYS = { "a", "b", "c", "a", "b", "c", "a" }
local function pick_key()
  if chance(0.1) then return "e" .. rand(50) end -- a short-lived key
  return KEYS[rand(#KEYS)]
end

local function use(client, reuse_ok)
  client.uses = client.uses + 1
  if chance(0.3) then sched.sleep(rand(4) * 0.001) end
  if chance(0.005) then client.alive = false end        -- dies; seen by validate after release
  return reuse_ok and not chance(0.03)
end

local function worker()
  running = running + 1
  while not stop do
    attempts = attempts + 1
    local key = pick_key()
    local form = rand(20)
    if form <= 12 then
      local o
      if form <= 2 then o = { timeout = 0.05 }
      elseif form == 3 then
        local t = clientpool.token()
        o = { cancel = t }
        if chance(0.5) then sched.spawn(function() sched.sleep(0.01); t:cancel() end) end
      end
      local lease, code = pool:acquire(key, o)
      if lease then
        granted = granted + 1
        count("lease")
        lease:release(use(lease.client, true))
      else
        count(code)
      end
    elseif form <= 14 then
      local lease, code = pool:try_acquire(key)
      if lease then
        granted = granted + 1
        count("lease")
        lease:release(use(lease.client, true))
      else
        count(code)
        sched.sleep(0.001)
      end
    elseif form <= 18 then
      local client, h = pool:checkout(key)
      if client then
        granted = granted + 1
        count("lease")
        pool:checkin(h, use(client, true))
      else
        count(h)
      end
    else
      local ok, a, code = pcall(pool.with, pool, key, function(client)
        granted = granted + 1
        count("lease")
        use(client, true)
        if chance(0.02) then error("request failed") end
        return true
      end)
      if ok and not a then count(code) end
    end
    if opts.trace and granted >= next_trace then
      next_trace = next_trace + opts.trace
      say("  %d acquisitions: Lua heap %.1f KB", granted, heap_kb())
    end
    if not warm_kb and granted >= WARM then
      warm_kb, warm_rss = heap_kb(), rss_mb()
      say("warm-up (%d acquisitions): Lua heap %.1f KB, RSS %s MB", granted, warm_kb,
          warm_rss and string.format("%.1f", warm_rss) or "?")
    elseif not end_kb and granted >= M then
      end_kb, end_rss = heap_kb(), rss_mb()
      say("end (%d acquisitions): Lua heap %.1f KB (%+.2f %% of the warm-up), RSS %s MB", granted, end_kb,
          (end_kb - warm_kb) / warm_kb * 100, end_rss and string.format("%.1f", end_rss) or "?")
      stop = true
    end
    -- check the pool's identities now and then
    if attempts % 4096 == 0 then
      local s = pool:stats()
      if s.opened - s.closed ~= s.live or s.live + s.creating > 64 or s.idle + s.active > s.live
         or s.waiting > N + 16 then
        failure = failure or ("counts inconsistent at attempt " .. attempts)
      end
    end
  end
  running = running - 1
end

say("%s, %d coroutines, %d acquisitions, %s clock, seed %d",
    rawget(_G, "jit") and "LuaJIT" or _VERSION, N, M, opts.clock, opts.seed)
local t0 = os.clock()
loop.spawn(function()
  for _ = 1, N do loop.spawn(worker) end
  -- wait for the workers, then close
  repeat loop.sleep(1) until stop and running == 0
  pool:close()
  loop.sleep(0)
end)
loop.run()
local cpu = os.clock() - t0

-- results ----------------------------------------------------------------
local s = pool:stats()
local parts = {}
for k, v in pairs(outcomes) do parts[#parts + 1] = k .. " " .. v end
table.sort(parts)
say("outcomes: %s (%d attempts, %.1f s CPU)", table.concat(parts, ", "), attempts, cpu)
say("pool: opened %d, closed %d, reused %d, timeouts %d, cancelled %d, create failures %d, leaked %d; " ..
    "%d hook errors logged", s.opened, s.closed, s.reused, s.timeouts, s.cancelled, s.create_failed, s.leaked,
    logged)

local problems = {}
if failure then problems[#problems + 1] = failure end
if not warm_kb or not end_kb then problems[#problems + 1] = "the run ended before the end measurement" end
if granted < M then problems[#problems + 1] = ("only %d acquisitions"):format(granted) end
if end_kb and warm_kb and end_kb > warm_kb * (1 + opts.margin) then
  problems[#problems + 1] = ("the Lua heap grew %.1f KB (%.2f %%), more than the margin (%.1f %%)")
    :format(end_kb - warm_kb, (end_kb - warm_kb) / warm_kb * 100, opts.margin * 100)
end
if s.live ~= 0 or s.leases ~= 0 or s.waiting ~= 0 or s.creating ~= 0 then
  problems[#problems + 1] = ("after close: live %d, leases %d, waiting %d, creating %d")
    :format(s.live, s.leases, s.waiting, s.creating)
end
if open_clients ~= 0 then problems[#problems + 1] = open_clients .. " client(s) never destroyed" end
if loop.stats().tasks ~= 0 then problems[#problems + 1] = loop.stats().tasks .. " task(s) left" end
if s.leaked ~= 0 then problems[#problems + 1] = s.leaked .. " lease(s) leaked" end
if (outcomes.lease or 0) == 0 or (outcomes.create or 0) == 0 or (outcomes.timeout or 0) == 0 then
  problems[#problems + 1] = "the run did not see leases, create failures and timeouts"
end
if #problems > 0 then
  error("soak: FAILED: " .. table.concat(problems, "; "), 0)
end
say("ok: Lua heap at the end within %.1f %% of the warm-up; nothing left after close", opts.margin * 100)
