-- quickstart: several hundred coroutines share a small pool of simulated
-- clients on the built-in loop. Each simulated client takes a little while to
-- connect and to answer, and now and then fails to connect or breaks.
--
--   make demo                      (or: lua5.4 examples/quickstart.lua)
--   QUICKSTART_TASKS=2000 QUICKSTART_VIRTUAL=1 lua5.4 examples/quickstart.lua
--
-- QUICKSTART_VIRTUAL=1 runs on the loop's virtual clock: the same program,
-- finished at once, handy for tests.
local clientpool = require "clientpool"
local looplib = require "clientpool.loop"

local TASKS = tonumber(os.getenv("QUICKSTART_TASKS")) or 400
local CALLS = tonumber(os.getenv("QUICKSTART_CALLS")) or 5
local loop = looplib
if os.getenv("QUICKSTART_VIRTUAL") == "1" then loop = looplib.new { clock = "virtual" } end

math.randomseed(42)

-- A simulated backend connection: connecting costs 5-15 ms and fails 5% of
-- the time; a call costs 1-4 ms and breaks the connection 2% of the time.
local next_id = 0
local function connect(key)
  loop.sleep(0.005 + math.random() * 0.010)
  if math.random() < 0.05 then return nil, "connection refused" end
  next_id = next_id + 1
  return { id = next_id, key = key, calls = 0 }
end

local function call(conn)
  loop.sleep(0.001 + math.random() * 0.003)
  conn.calls = conn.calls + 1
  if math.random() < 0.02 then return nil, "connection reset" end
  return "ok"
end

local pool = clientpool.new {
  create = connect,
  destroy = function(conn) conn.closed = true end,
  validate = function(conn) return not conn.closed end,
  max_live = 8, max_idle = 4, max_waiting = 1000,
  acquire_timeout = 0.25, idle_timeout = 30, max_lifetime = 300, lifetime_jitter = 0.1,
  scheduler = loop,
}

local waits, ok_calls, failed_calls, create_failures, timeouts = {}, 0, 0, 0, 0
pool:on("acquire", function(_, _, waited) if waited then waits[#waits + 1] = waited end end)

local function worker(n)
  for _ = 1, CALLS do
    local lease, code, detail = pool:acquire(n % 3 == 0 and "replica" or nil)
    if not lease then
      if code == "timeout" then timeouts = timeouts + 1
      elseif code == "create" then create_failures = create_failures + 1
      else error("unexpected: " .. tostring(code) .. " " .. tostring(detail)) end
    else
      local res = call(lease.client)
      if res then
        ok_calls = ok_calls + 1
        lease:release()
      else
        failed_calls = failed_calls + 1
        lease:release(false)     -- a broken client must not be reused
      end
    end
    loop.sleep(math.random() * 0.01)
  end
end

for n = 1, TASKS do loop.spawn(worker, n) end

-- progress, every 100 ms while workers run
local done = false
loop.spawn(function()
  while not done do
    loop.sleep(0.1)
    local s = pool:stats()
    io.write(string.format("  t=%5.2fs  calls ok=%-5d live=%d idle=%d active=%d waiting=%-4d opened=%d\n",
      loop.now() - (loop.started or 0), ok_calls, s.live, s.idle, s.active, s.waiting, s.opened))
  end
end)
loop.started = loop.now()
loop.spawn(function()
  -- ends the progress reporter once every worker is done
  while ok_calls + failed_calls + create_failures + timeouts < TASKS * CALLS do loop.sleep(0.05) end
  done = true
end)
loop.run()
pool:close()
loop.run()   -- the destroy hooks close() started run as tasks of the loop

table.sort(waits)
local function pct(p)
  if #waits == 0 then return 0 end
  return waits[math.max(1, math.ceil(#waits * p))]
end
local s = pool:stats()
print(string.format([[

clientpool quickstart: %d coroutines x %d calls over max_live=%d
  opened         %d
  reused         %d
  waited         %d acquisitions (p50 %.1f ms, p99 %.1f ms)
  timeouts       %d
  create failed  %d
  call failures  %d (client retired)
  calls ok       %d
  closed_by      idle=%d lifetime=%d invalid=%d error=%d max_idle=%d evicted=%d drain=%d
  live at end    %d]],
  TASKS, CALLS, 8, s.opened, s.reused, s.wait_count, pct(0.5) * 1000, pct(0.99) * 1000,
  s.timeouts, create_failures, failed_calls, ok_calls,
  s.closed_by.idle, s.closed_by.lifetime, s.closed_by.invalid, s.closed_by.error,
  s.closed_by.max_idle, s.closed_by.evicted, s.closed_by.drain, s.live))
assert(s.live == 0 and s.leases == 0 and s.waiting == 0, "the pool did not end empty")
