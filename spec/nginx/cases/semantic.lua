-- The shared semantic suite (spec/acquire_wait_spec.lua,
-- spec/acquire_wait_dead_spec.lua, spec/acquire_spec.lua,
-- spec/acquire_lifecycle_spec.lua, spec/lease_spec.lua, spec/leak_spec.lua
-- and spec/stats_spec.lua, written
-- once for every adapter) on the
-- ngx adapter, inside nginx, on its real clock: 1 spec second = 10 ms, times
-- checked as lower bounds, as for the other hosts (spec/helpers.lua).
--
-- The spec files are loaded as they are, with this file's describe/it and
-- a spec.helpers whose schedulers() is the ngx entry alone.
local H = require "harness"
local base = require "clientpool.sched.ngx"
local semaphore = require "ngx.semaphore"

-- An adapter instance that knows its tasks, so run() can wait for them and
-- re-raise their errors (the other hosts' run()).
local function new_sched()
  local s = setmetatable({}, { __index = base })
  local live, errors = 0, {}
  local done = semaphore.new(0)
  local function task(fn, ...)
    local ok, err = xpcall(fn, debug.traceback, ...)
    if not ok then errors[#errors + 1] = err end
    live = live - 1
    -- run() returns when all tasks are done, or raises at the first error
    -- (tasks left waiting then would never end)
    if live == 0 or not ok then done:post(1) end
  end
  function s.spawn(fn, ...)
    live = live + 1
    return base.spawn(task, fn, ...)
  end
  function s.run()
    while live > 0 and not errors[1] do
      local ok, err = done:wait(60)
      if not ok then error("ngx run(): tasks still running after 60 s (" .. tostring(err) .. ")", 0) end
    end
    if errors[1] then
      local e = errors[1]
      errors = {}
      error(e, 0)
    end
  end
  return s
end

local ENTRY = {
  name = "ngx (real clock)", lib = "ngx", scale = 0.01, real = true,
  new = new_sched,
  run = function(sched, fn, ...)
    sched.spawn(fn, ...)
    sched.run()
  end,
}

-- spec.helpers without the other hosts' libraries (luv must not be loaded
-- into nginx), its schedulers() the ngx entry.
local saved = {}
for _, lib in ipairs { "luv", "cqueues", "copas" } do
  saved[lib] = package.preload[lib]
  package.preload[lib] = function() error("not loaded inside nginx") end
end
local helpers = dofile(H.conf.root .. "/spec/helpers.lua")
for lib, v in pairs(saved) do package.preload[lib] = v end
helpers.schedulers = function() return { ENTRY } end
helpers.missing_schedulers = function() return {} end
package.loaded["spec.helpers"] = helpers

-- Scenarios that do not apply inside nginx, with the reason; the nginx
-- cases named cover the same point the nginx way.
local KILL = "kills or resumes a waiting coroutine from outside the scheduler (debug hook, coroutine.resume), " ..
             "which ngx_lua does not allow for light threads; ngx.thread.kill and client aborts: kill.lua"
local YIELD = "a hook that yields inside try_acquire: in nginx a sleep or I/O inside a coroutine suspends " ..
              "whoever resumed it, so try_acquire waits for such a hook (docs/decisions.md, OpenResty)"
local SKIP = {
  ["a waiting coroutine killed by an error never swallows a grant"] = KILL,
  ["a dead waiter granted a free slot (not a client) hands the slot on"] = KILL,
  ["a granted waiter that dies inside create gives the slot back once collected"] = KILL,
  ["a checkout whose coroutine dies inside create gives its reservation back once collected"] = KILL,
  ["a checkout whose coroutine dies inside validate gives its client back once collected"] = KILL,
  ["a checkout whose coroutine dies inside unpark gives its client back once collected"] = KILL,
  ["a spurious resume of a waiter does not end its wait"] = KILL,
  ["a dead waiter with a deadline leaves the queue at its deadline"] = KILL,
  ["a dead waiter with a pending cancel token leaves the token working"] = KILL,
  ["never yields: run inside a coroutine it finishes in one resume"] = YIELD,
  ["when create yields, returns nil, timeout at once; the created client then joins the idle pool"] = YIELD,
  ["inside a task, a yielding create also answers nil, timeout without the clock moving"] = YIELD,
  ["raises an error saying it would wait when nothing is free, and leaves the pool sound"] =
    "nothing runs outside a coroutine in nginx; where waiting is impossible is a matter of phase: phases.lua",
}

local env = getfenv(1)
local it = env.it
env.it = function(desc, fn, ...)
  local why = SKIP[desc]
  if why then return env.pending(desc .. " [not in nginx: " .. why .. "]") end
  return it(desc, fn, ...)
end
for _, name in ipairs { "acquire_wait_spec", "acquire_wait_dead_spec", "acquire_spec", "acquire_lifecycle_spec",
                        "lease_spec", "leak_spec", "stats_spec" } do
  local chunk = assert(loadfile(H.conf.root .. "/spec/" .. name .. ".lua"))
  setfenv(chunk, env)
  describe(name, chunk)
end
env.it = it
