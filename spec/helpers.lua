-- Shared spec helpers: the schedulers the semantic suite runs on, simulated
-- clients, and an invariant check over pool:stats().
local H = {}

-- busted insulates each spec file: the modules a file loaded are unloaded
-- after it. luv must be opened once per process: every copy drives libuv's
-- default loop, and collecting the first copy closes that loop under the
-- second. So the first copy is kept in the registry and handed back.
do
  local reg = debug.getregistry()
  local kept = reg["clientpool.spec.luv"]
  if kept then
    package.loaded.luv = kept
  else
    local ok, luv = pcall(require, "luv")
    if ok then reg["clientpool.spec.luv"] = luv end
  end
end

-- Each entry makes a fresh scheduler adapter and runs a test body as a task
-- until everything is done. Fields:
--   name   what the suite's describe() says
--   new()  a fresh adapter
--   run(sched, fn, ...)  runs fn(...) in a task and the scheduler until its
--          foreground tasks are done; re-raises a task's error
--   scale  seconds of this entry's clock per second of a spec's (virtual)
--          time: specs write times for a virtual clock and multiply them by
--          scale, so a 0.5 s timeout is 5 ms on a real clock
--   real   the clock is real: times are lower bounds (a wait never ends
--          before its deadline), never exact, and never bounded above
--   finish()  (optional) retires the adapters made so far; specs call it
--          in after_each
-- H.schedulers() is the virtual loop alone; H.schedulers{ hosts = true }
-- adds the hosts (cqueues, luv, copas) where their library loads under the
-- running interpreter, for specs whose times go through `scale` and whose
-- time assertions go through H.time (a spec written for the virtual clock
-- alone would be slow and wrong on a real one). H.missing_schedulers() lists
-- the hosts that do not load, with the reason, so specs can mark them pending.
local unpack = table.unpack or unpack -- luacheck: ignore 143

local function task_run(sched, fn, ...)
  local args = { n = select("#", ...), ... }
  sched.spawn(function() fn(unpack(args, 1, args.n)) end)
  sched.run()
end

-- Real clocks: 1 spec second = 30 ms. A spec's steps are a few tenths of a
-- spec second apart, and a loop stalled longer than a step (a loaded CI
-- machine, at 10 ms: seen on cqueues) runs two due deadlines in either
-- order; 30 ms costs a few seconds per host (the lua5.4 suite: 76 s at
-- 10 ms, 82 s at 20 ms, under load). CLIENTPOOL_SPEC_SCALE changes it: the
-- Makefile's ASan and valgrind steps, where every turn is slower, set more.
local REAL_SCALE = tonumber(os.getenv("CLIENTPOOL_SPEC_SCALE")) or 0.03

local HOSTS = {
  {
    name = "cqueues (real clock)", lib = "cqueues",
    new = function()
      return require("clientpool.sched.cqueues").new(require("cqueues").new())
    end,
  },
  {
    name = "luv (real clock)", lib = "luv",
    new = function() return require("clientpool.sched.luv").new() end,
    -- luv instances share the default uv loop: retire each with close()
    closes = true,
  },
  {
    name = "copas (real clock)", lib = "copas",
    new = function() return require("clientpool.sched.copas").new() end,
  },
}

local function interp()
  return rawget(_G, "jit") and "LuaJIT" or _VERSION
end

-- nil if the host library loads here, else the reason it does not.
function H.host_missing(lib)
  local ok, err = pcall(require, lib)
  if ok then return nil end
  return lib .. " does not load under " .. interp() .. " (" .. tostring(err):match("^[^\n]*") .. ")"
end

function H.schedulers(opts)
  local list = {
    {
      name = "loop (virtual clock)",
      new = function()
        return require("clientpool.loop").new { clock = "virtual" }
      end,
      run = task_run,
      scale = 1,
      real = false,
    },
  }
  for _, h in ipairs(HOSTS) do
    if opts and opts.hosts and not H.host_missing(h.lib) then
      list[#list + 1] = H.host(h.lib)
    end
  end
  return list
end

-- The entry of one host ("cqueues", "luv", "copas"), or nil and the reason
-- it does not load here.
function H.host(lib)
  for _, h in ipairs(HOSTS) do
    if h.lib == lib then
      local why = H.host_missing(lib)
      if why then return nil, why end
      local made = {}
      return {
        name = h.name, lib = lib, run = task_run, scale = REAL_SCALE, real = true,
        new = function()
          local sched = h.new()
          if h.closes then made[#made + 1] = sched end
          return sched
        end,
        -- Retires the adapters made since the last call (after_each). A
        -- scenario that ends with leases held leaves its pool to the garbage
        -- collector, whose lease finalizers wake the pool's timer task: on a
        -- loop shared by every scenario (luv's) that task would run in a
        -- later scenario, after its pool was freed.
        finish = function()
          if #made == 0 then return end
          for i = #made, 1, -1 do
            made[i].close()
            made[i] = nil
          end
          -- let libuv finish the closes now, not while Lua shuts down
          require("luv").run("nowait")
        end,
      }
    end
  end
  error("spec.helpers: no host " .. tostring(lib))
end

-- { name, reason } for each host whose library does not load here.
function H.missing_schedulers()
  local list = {}
  for _, h in ipairs(HOSTS) do
    local why = H.host_missing(h.lib)
    if why then list[#list + 1] = { name = h.name, reason = why } end
  end
  return list
end

-- Time assertions for entry S. `got` is a time in S's seconds, `expected`
-- in spec seconds. Virtual clocks: equal (to 1e-6). Real clocks: not less
-- (nothing may end before its time); a slow machine may make it later.
function H.time(S, expected, got, what)
  what = what or "time"
  if type(got) ~= "number" then
    error(what .. ": expected a number, got " .. tostring(got), 2)
  end
  if S.real then
    if got < expected * S.scale - 1e-9 then
      error(("%s: %.6fs on a real clock is earlier than %g spec seconds (%.6fs)")
            :format(what, got, expected, expected * S.scale), 2)
    end
  elseif math.abs(got - expected) >= 1e-6 then
    error(("%s: expected %s, got %s"):format(what, tostring(expected), tostring(got)), 2)
  end
end

-- Asserts that no time passed between t0 and t1 (the call did not wait).
-- Only a virtual clock can tell; on a real clock the spec's other
-- assertions (nothing waiting, no wait counted) carry the point.
function H.no_wait(S, t0, t1)
  if not S.real then
    if t0 ~= t1 then error(("the clock moved from %s to %s"):format(tostring(t0), tostring(t1)), 2) end
  elseif t1 < t0 then
    error("the clock went back", 2)
  end
end

-- A simulated client factory: counts creates/destroys, optional latency and
-- failure injection. `sched` is the adapter (for sleep).
function H.factory(sched, o)
  o = o or {}
  local f = { created = 0, destroyed = 0, open = {}, log = {}, fail_next = 0, throw_next = 0 }
  function f.create(key)
    if o.latency then sched.sleep(o.latency) end
    if f.throw_next > 0 then f.throw_next = f.throw_next - 1; error("create exploded") end
    if f.fail_next > 0 then f.fail_next = f.fail_next - 1; return nil, "refused" end
    f.created = f.created + 1
    local c = { id = f.created, key = key, alive = true }
    f.open[c] = true
    f.log[#f.log + 1] = "create " .. c.id
    return c
  end
  function f.destroy(c)
    f.destroyed = f.destroyed + 1
    if c then c.alive = false; f.open[c] = nil end
    f.log[#f.log + 1] = "destroy " .. tostring(c and c.id)
  end
  function f.count_open()
    local n = 0
    for _ in pairs(f.open) do n = n + 1 end
    return n
  end
  return f
end

-- Checks the identities every pool must keep; returns the stats.
function H.check(pool)
  local s = pool:stats()
  assert(s.opened - s.closed == s.live, "opened - closed ~= live")
  assert(s.idle <= s.live, "idle > live")
  assert(s.active + s.idle <= s.live, "active + idle > live")
  assert(s.leases >= s.active, "leases < active")
  local sum = { live = 0, idle = 0, leases = 0, waiting = 0 }
  for _, ks in pairs(s.keys) do
    for f in pairs(sum) do sum[f] = sum[f] + ks[f] end
  end
  for f, v in pairs(sum) do assert(v == s[f], "keys' " .. f .. " do not sum to the pool's") end
  return s
end

--- Runs `args` (a script path and its arguments, or `-e "code"`) in a
-- fresh interpreter of the running kind, with this run's module paths;
-- returns everything it printed (stdout and stderr) and its exit status
-- line "rc=N". For what only shows at process exit or needs a clean heap.
function H.run_fresh(args)
  local interp_cmd = arg and arg[-1] or "lua"
  local cmd = string.format("LUA_PATH='%s' LUA_CPATH='%s' LUA_PATH_5_4='%s' LUA_CPATH_5_4='%s' " ..
    "LUA_PATH_5_3='%s' LUA_CPATH_5_3='%s' %s %s 2>&1; echo \"rc=$?\"",
    package.path, package.cpath, package.path, package.cpath, package.path, package.cpath, interp_cmd, args)
  local fh = assert(io.popen(cmd))
  local out = fh:read("*a")
  fh:close()
  return out
end

-- nil where lua-http loads (Lua 5.1 and LuaJIT), else why not: the reason
-- clientpool.http's specs are pending.
function H.lua_http_missing()
  local ok, err = pcall(require, "http.client")
  if ok then return nil end
  return "lua-http does not load under " .. (rawget(_G, "jit") and "LuaJIT" or _VERSION) .. " (Debian's lua-http " ..
         "is for Lua 5.1 and LuaJIT; 5.3 lacks lpeg_patterns, 5.4 has no build): " .. tostring(err):match("^[^\n]*")
end

-- A file's whole text.
function H.read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-- Fleet names for one spec file (file: a word of its own): unique per
-- process (the pid), file and call, so concurrent runs and files never
-- share a fleet. Returns name_for(tag), cleanup() (removes every name made
-- since, whatever the test did: for after_each) and the list of them.
function H.fleet_names(file)
  local pid = assert(H.read("/proc/self/stat"):match("^(%d+)"))
  local seq, made = 0, {}
  local function name_for(tag)
    seq = seq + 1
    local n = string.format("fs%s-%s-%s-%d", pid, file, tag, seq)
    made[#made + 1] = n
    return n
  end
  local function cleanup()
    local fleet = require("clientpool.core").fleet
    for i = #made, 1, -1 do
      fleet.remove(made[i])
      made[i] = nil
    end
  end
  return name_for, cleanup, made
end

-- Whether s is a string holding part (plain text).
function H.contains(s, part)
  return type(s) == "string" and s:find(part, 1, true) ~= nil
end

-- The message of the error fn raises (it must raise).
function H.errmsg(fn, ...)
  local ok, err = pcall(fn, ...)
  assert(not ok, "expected an error")
  return tostring(err)
end

-- The message of the error fn raises (it must raise), without its position.
function H.errmsg_bare(fn, ...)
  return (H.errmsg(fn, ...):gsub("^[^\n]-:%d+: ", "", 1))
end

-- A programming error: "clientpool:" first (after a position prefix) and
-- every word given.
function H.assert_api_error(msg, ...)
  local bare = msg:gsub("^[^\n]-:%d+: ", "", 1)
  assert(bare:sub(1, 11) == "clientpool:", "not a 'clientpool:' error: " .. msg)
  for i = 1, select("#", ...) do
    local w = select(i, ...)
    assert(H.contains(bare, w), "error does not mention '" .. w .. "': " .. msg)
  end
end

-- Spawns a task on sched that acquires key from pool and records the
-- outcome in the returned table: co (the task's coroutine), t0/t1 (the
-- clock before and after), lease, client, code, detail, done. then_fn(w),
-- if given, runs after the acquire.
function H.waiter(sched, pool, key, opts, then_fn)
  local w = { done = false }
  sched.spawn(function()
    w.co = coroutine.running()
    w.t0 = sched.now()
    w.lease, w.code, w.detail = pool:acquire(key, opts)
    w.client = w.lease and w.lease.client -- release clears lease.client
    w.t1 = sched.now()
    w.done = true
    if then_fn then then_fn(w) end
  end)
  return w
end

-- Takes the binding's C fast path off pool (checkout.lua's
-- install_fastpath): its methods, the lease form's release (the pool's
-- leases' method table) included; the Lua path alone is left.
function H.without_fastpath(pool)
  pool.checkout, pool.checkin, pool.acquire, pool.try_acquire, pool._frel, pool._fp = nil, nil, nil, nil, nil, nil
  pool._lmt.__index = require("clientpool").Lease
end

-- Lua bytes allocated per call of step(n) (n calls), the least of three
-- rounds with the collector stopped, after a warm-up (and the JIT's
-- compilation).
function H.bytes_per(step)
  step(20000)
  local best = math.huge
  for _ = 1, 3 do
    collectgarbage("collect")
    collectgarbage("stop")
    step(10)    -- a full collection shrinks the coroutine's stack: grow it back
    local before = collectgarbage("count")
    step(2000)
    local bytes = (collectgarbage("count") - before) * 1024 / 2000
    collectgarbage("restart")
    if bytes < best then best = bytes end
  end
  return best
end

-- The task kit most scheduler-parametrised suites share, bound to scheduler
-- entry S; defaults are the pool options mkpool starts from (o overrides):
--   run(body)                          body(sched) as a task on a fresh scheduler
--   mkpool(sched, o, fo)               a pool over H.factory(sched, fo)'s clients
--   settle(sched)                      lets the tasks spawned so far run
--   waiter(sched, pool, key, opts, f)  a task that acquires key and records
--                                      co, t0, t1, lease, client, code, detail, done
function H.kit(S, defaults)
  local function run(body)
    local sched = S.new()
    S.run(sched, body, sched)
    return sched
  end
  local function mkpool(sched, o, fo)
    local f = H.factory(sched, fo)
    local opts = { create = f.create, destroy = f.destroy, scheduler = sched }
    for k, v in pairs(defaults or {}) do opts[k] = v end
    for k, v in pairs(o or {}) do opts[k] = v end
    return require("clientpool").new(opts), f
  end
  local function settle(sched)
    sched.sleep(0)
    sched.sleep(0)
  end
  return run, mkpool, settle, H.waiter
end

return H
