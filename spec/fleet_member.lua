-- A plain Lua process that is a member of a fleet through a pool
-- (clientpool.new{ fleet = name }), for spec/fleetlink_spec.lua.
--
--   <interp> spec/fleet_member.lua mode name out lpath cpath [args...]
--
-- mode "work" tasks rounds: `tasks` coroutines each acquire and release
--   `rounds` times (held 0-3 ms, one in 8 destroyed), and the hooks log each
--   client's life: "c <t>" when its create hook starts (the fleet's unit is
--   taken before it), "d <t>" when its destroy hook ends (the unit comes
--   back after it), on CLOCK_MONOTONIC, comparable across processes. At the
--   end: "stats <pool live> <member live> <grants> <failures>", the pool
--   closed, "closed <fleet live>".
-- mode "hold" n: takes n clients, says "held", then sleeps until killed.
-- mode "idle" n secs: n clients made and left idle; after secs "shed <k> <idle>".
-- mode "probe" secs: every 20 ms, try_acquire (pause_mode "fail"): says
--   "ok <t>" or "<code> <reason> <t>".
-- mode "floor" secs: pool:run() keeps the warm floor (min_idle: the
--   fleet's) for `secs`, the hooks' "c"/"d" lines written at once; then
--   the pool closed, "closed".
-- mode "wait" n timeout: says "waiting", acquires n clients (timeout each),
--   and says "got <t>" (or "failed <err>") for each.
local mode, name, out, lpath, cpath = arg[1], arg[2], arg[3], arg[4], arg[5]
package.path, package.cpath = lpath, cpath
local clientpool = require "clientpool"
local fleet = require "clientpool.fleet"
local monotime = require("clientpool.core").monotime
local loop = require("clientpool.loop").new()

local lines = {}
local function say(...)
  local o = assert(io.open(out, "a"))
  o:write(table.concat({ ... }, " "), "\n")
  o:close()
end
local function log(...) lines[#lines + 1] = table.concat({ ... }, " ") end
-- (the floor's members are read while they run, and some are killed: at once)
if mode == "floor" then log = say end

-- attach by name (the spec created it: these limits equal its own)
fleet.new(name, { max_live = tonumber(os.getenv("FLEET_MAX_LIVE") or "5"),
                  min_idle = tonumber(os.getenv("FLEET_MIN_IDLE") or "0") })
local pid = assert(io.open("/proc/self/stat")):read("*l"):match("^(%d+)")

local seq = 0
local pool = clientpool.new {
  fleet = name, scheduler = loop, acquire_timeout = tonumber(arg[8]) or 20,
  pause_mode = mode == "probe" and "fail" or nil,
  create = function() log("c", string.format("%.9f", monotime())); seq = seq + 1; return { id = seq } end,
  destroy = function() log("d", string.format("%.9f", monotime())) end,
}
say("pid", pid)

if mode == "work" then
  local tasks, rounds = tonumber(arg[6]), tonumber(arg[7])
  local grants, failures, rnd = 0, 0, tonumber(pid)
  local function random(n)   -- (a small LCG: math.random's seed differs by version)
    rnd = (rnd * 1103515245 + 12345) % 2147483648
    return rnd % n
  end
  for _ = 1, tasks do
    loop.spawn(function()
      for _ = 1, rounds do
        local l, err = pool:acquire()
        if l then
          grants = grants + 1
          loop.sleep(random(4) / 1000)
          if random(8) == 0 then l:release(false) else l:release() end
        else
          failures = failures + 1
          log("f", tostring(err))
        end
      end
    end)
  end
  loop:run()
  local s = pool:stats()
  pool:close()
  loop:run()
  -- (after the close: the destroys of the idle clients are logged too)
  local o = assert(io.open(out, "a"))
  o:write(table.concat(lines, "\n"), "\n")
  o:close()
  say("stats", s.live, s.fleet.member.live, grants, failures)
  say("closed", pool:stats().fleet.member.live)
elseif mode == "hold" then
  local n, held = tonumber(arg[6]), {}
  loop.spawn(function()
    for i = 1, n do held[i] = assert(pool:acquire()) end
    say("held", n)
    while #held > 0 do loop.sleep(1) end   -- (held until killed)
  end)
  loop:run()
elseif mode == "idle" then
  -- takes n clients, releases them (they stay idle: max_idle is the
  -- fleet's), says "idle n", then idles `secs` and says "shed <k>"
  local n, secs, held = tonumber(arg[6]), tonumber(arg[7]), {}
  loop.spawn(function()
    for i = 1, n do held[i] = assert(pool:acquire()) end
    for i = 1, n do held[i]:release() end
    say("idle", pool:stats().idle)
    loop.sleep(secs)
    say("shed", pool:stats().closed_by.shed, pool:stats().idle)
  end)
  loop:run()
elseif mode == "probe" then
  -- every 20 ms for `secs`: "ok" or "paused <reason>" (pause_mode fail)
  local secs = tonumber(arg[6])
  loop.spawn(function()
    local t_end = monotime() + secs
    while monotime() < t_end do
      local l, code, reason = pool:try_acquire()
      if l then l:release(); say("ok", string.format("%.3f", monotime()))
      else say(tostring(code), tostring(reason), string.format("%.3f", monotime())) end
      loop.sleep(0.02)
    end
    say("end")
  end)
  loop:run()
elseif mode == "floor" then
  local secs = tonumber(arg[6])
  loop.spawn(function() pool:run() end)
  loop.spawn(function()
    say("floor", pool:stats().fleet.member.live)
    loop.sleep(secs)
    pool:close()
  end)
  loop:run()
  say("closed")
elseif mode == "wait" then
  local n, timeout, got = tonumber(arg[6]), tonumber(arg[7]), {}
  loop.spawn(function()
    say("waiting", n)
    for i = 1, n do
      local l, err = pool:acquire(nil, { timeout = timeout })
      if l then got[i] = l; say("got", string.format("%.9f", monotime())) else say("failed", tostring(err)) end
    end
    say("fleet", pool:stats().fleet.live, pool:stats().fleet.member.live, #got)
  end)
  loop:run()
end
