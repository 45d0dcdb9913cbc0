-- A plain Lua process standing in for a machine of a Redis fleet
-- (spec/redisfleet/members_redis.lua): its own `machine` name, so its own
-- machine-local fleet and its own lease in Redis.
--
--   <interp> member.lua lpath cpath name machine out coord_port target_port max_live ttl tasks secs
--     [block [burst [keep [budgets [stall]]]]]
--
-- `tasks` coroutines acquire and release for `secs` seconds (held 0-3 ms,
-- one release in 8 destroys the client). A client is a real TCP
-- connection to the target redis-server (its INFO clients counts them;
-- the destroy waits for the server's close);
-- the hooks log "c <t>" when a create starts (after the fence) and "d <t>"
-- when a destroy has closed it, "g <t>" per grant, on CLOCK_MONOTONIC (one
-- clock for every process here). `burst`: that many more tasks start at
-- once when the process finds it was stopped (its clock jumped by more
-- than 0.5 s between two 20 ms sleeps), so it wants new clients the moment
-- it resumes. `keep`: the word "keep" and no release destroys. At the end: "stats <grants> <failures>
-- <asks> <commands>", then "done".
local lpath, cpath, name, machine, out = arg[1], arg[2], arg[3], arg[4], arg[5]
local coord_port, target_port = tonumber(arg[6]), tonumber(arg[7])
local max_live, ttl, tasks, secs = tonumber(arg[8]), tonumber(arg[9]), tonumber(arg[10]), tonumber(arg[11])
package.path, package.cpath = lpath, cpath
local socket = require "socket"
local clientpool = require "clientpool"
local fleet = require "clientpool.fleet"
local monotime = require("clientpool.core").monotime
local loop = require("clientpool.loop").new()

local lines = {}
local function log(...) lines[#lines + 1] = table.concat({ ... }, " ") end
local function say(...)
  local o = assert(io.open(out, "a"))
  o:write(table.concat({ ... }, " "), "\n")
  o:close()
end
local function flush()
  local o = assert(io.open(out, "a"))
  if #lines > 0 then o:write(table.concat(lines, "\n"), "\n") end
  o:close()
  lines = {}
end

-- `stall` (arg 16): seconds before a silent agent is replaced (default:
-- the agent's own, max(0.5, ttl/4 + 0.25)); a large one keeps a stopped
-- agent in place (a dead one is still replaced)
if tonumber(arg[16]) then
  local stall = tonumber(arg[16])
  require("clientpool.redisfleet").agent.stall = function() return stall end
end
-- `budgets` (arg 15, e.g. "c=4,i=2"): the fleet's max_concurrency and
-- max_idle; then every lease brackets its use with INCR / DECR of
-- spec:inuse at the target (the highest INCR reply: the most leases the
-- target saw at once), and the tasks stop 0.8 s before the end with the
-- pool open ("q <t>" once the last is done), so that every client left is
-- idle
local budgets = arg[15] ~= "" and arg[15] or nil
local fo = { backend = "redis", max_live = max_live, ttl = ttl, machine = machine, block = tonumber(arg[12]),
             redis = { port = coord_port, timeout = 0.2 } }
-- ("k=N,keys=M": per_key.max_live N, and task i uses key "k<i % M>"; each
-- client names itself after its key at the target, CLIENT SETNAME)
local nkeys
if budgets then
  fo.max_concurrency = tonumber(budgets:match("c=(%d+)"))
  fo.max_idle = tonumber(budgets:match("i=(%d+)"))
  fo.min_idle = tonumber(budgets:match("m=(%d+)"))
  local kml = tonumber(budgets:match("k=(%d+)"))
  if kml then fo.per_key = { max_live = kml } end
  nkeys = tonumber(budgets:match("keys=(%d+)"))
end
fleet.new(name, fo)
local pid = assert(io.open("/proc/self/stat")):read("*l"):match("^(%d+)")
say("pid", pid)

local pool = clientpool.new {
  fleet = name, scheduler = loop, acquire_timeout = 60, max_waiting = 1000,
  create = function(key)
    log("c", string.format("%.6f", monotime()))
    local s = socket.tcp()
    s:settimeout(1)
    local ok, err = s:connect("127.0.0.1", target_port)
    if not ok then return nil, err end
    if nkeys then
      s:send("CLIENT SETNAME " .. key .. "\r\n")
      assert(s:receive("*l") == "+OK")
    end
    return s
  end,
  destroy = function(s)
    -- QUIT, then wait for the server's close: once it is seen, the target
    -- no longer counts the connection (a bare close() returns before the
    -- server has processed it, and its INFO would count the client until
    -- then, after the unit came back to the fleet)
    s:send("QUIT\r\n")
    repeat local _, err = s:receive("*l") until err
    s:close()
    log("d", string.format("%.6f", monotime()))
  end,
}

-- no release destroys its client ("keep", and with budgets: what is left
-- open in the quiet phase is what max_idle kept)
local keep = arg[14] == "keep" or budgets ~= nil
local grants, failures, rnd = 0, 0, tonumber(pid)
local function random(n)
  rnd = (rnd * 1103515245 + 12345) % 2147483648
  return rnd % n
end
local t_end = monotime() + secs
local t_stop = budgets and t_end - 0.8 or t_end
local inuse_max = 0
local function upstream(s, cmd)
  s:send(cmd .. " spec:inuse\r\n")
  return tonumber((assert(s:receive("*l")):match("^:(%-?%d+)")))
end
local n_workers, active = 0, 0
local function worker()
    n_workers, active = n_workers + 1, active + 1
    local key = nkeys and ("k" .. (n_workers % nkeys)) or nil
    while monotime() < t_stop do
      local l, err = pool:acquire(key)
      if l then
        grants = grants + 1
        log("g", string.format("%.6f", monotime()))
        if budgets then
          local n = upstream(l.client, "INCR")
          if n > inuse_max then inuse_max = n end
        end
        loop.sleep(random(4) / 1000)
        if budgets then upstream(l.client, "DECR") end
        if random(8) == 0 and not keep then l:release(false) else l:release() end
      else
        failures = failures + 1
        log("f", string.format("%.6f", monotime()), tostring(err))
        -- (as a caller's next try comes later: a failure can be immediate,
        -- e.g. inside the create backoff after fenced creates, and a retry
        -- without yielding would starve this loop's agent)
        loop.sleep(0.001)
      end
    end
    -- (the last task done: every client left is idle from now on)
    active = active - 1
    if active == 0 and budgets then log("q", string.format("%.6f %.6f", monotime(), t_end)) end
end
for _ = 1, tasks do loop.spawn(worker) end
if fo.min_idle then
  -- the warm floor: pool:run() keeps it until the pool closes, at the end
  loop.spawn(function() pool:run() end)
  loop.spawn(function() loop.sleep(t_end - monotime()); pool:close() end)
end

local burst = tonumber(arg[13])
if burst then
  loop.spawn(function()
    local last = monotime()
    while monotime() < t_end do
      loop.sleep(0.02)
      local now = monotime()
      if now - last > 0.5 then
        log("resumed", string.format("%.6f", now))
        for _ = 1, burst do loop.spawn(worker) end
      end
      last = now
    end
  end)
end
-- the log goes out every 0.1 s (a SIGKILL loses at most that); "agent
-- <t>" when this process became its machine's agent, "valid <t> <till>"
-- when the machine's published lease validity (the machine-local fleet's
-- validity deadline) changed, "stepdown <t>" when it found it was replaced
loop.spawn(function()
  local R, was, n = fleet._redis(name), false, 0
  while monotime() < t_end do
    loop.sleep(0.01)
    if R.is_agent and not was then log("agent", string.format("%.6f", monotime())) end
    if (R.stepped_down or 0) > (R.spec_down or 0) then
      R.spec_down = R.stepped_down
      log("stepdown", string.format("%.6f", monotime()))
    end
    -- "valid <t> <deadline>" when the machine's published validity changed
    -- (the time read first: a stop between the two makes the line early,
    -- never a value read before the stop stamped after it)
    local now = monotime()
    local till = R.h:valid_until()
    if till and till ~= R.spec_till then
      R.spec_till = till
      log("valid", string.format("%.6f %.6f", now, till))
    end
    was = R.is_agent
    n = n + 1
    if n % 10 == 0 then flush() end
  end
end)
loop:run()
local R = fleet._redis(name)
local asks, commands = R.asks, R.conn and R.conn.commands or 0
pool:close()
loop:run()
flush()
say("stats", grants, failures, asks, commands)
if budgets then say("inuse", inuse_max) end
say("done")
