--- clientpool.options (internal): what new() accepts.
--
-- Owns option validation (every bad option raises one error naming the
-- option and the rule it breaks) and the resolution of the `scheduler`
-- option to an adapter table (docs/design.md "The scheduler adapter contract"). Returns the checked
-- options as a plain table; new() (init.lua) builds the pool from it.

local base = require "clientpool.base"
local caps = require "clientpool.caps"
base.own_source()

local type, error, pcall, tostring, require = type, error, pcall, tostring, require
local pairs, ipairs, getmetatable = pairs, ipairs, getmetatable
local math_floor, math_huge, string_format = math.floor, math.huge, string.format
local pack, unpack, load_backend = base.pack, base.unpack, base.load_backend

local M = {}

---------------------------------------------------------------------------
-- Option validation: every bad option raises naming the option and the rule.
---------------------------------------------------------------------------

-- Raised without a position: new() re-raises it at its caller's line.
-- Numbers are printed with %s: %d raises on a float with no integer
-- representation (a bad option such as -1e300 or 2^64).
local function fail(fmt, ...)
  local args = pack(...)
  for i = 1, args.n do
    local v = args[i]
    if type(v) == "number" and math_floor(v) == v and v > -2^53 and v < 2^53 then
      args[i] = string_format("%d", v)
    end
  end
  error("clientpool: " .. string_format((fmt:gsub("%%d", "%%s")), unpack(args, 1, args.n)), 0)
end

local is_int = caps.is_int

local KNOWN = {
  create = true, destroy = true, validate = true, park = true, unpark = true,
  min_idle = true, max_idle = true, max_live = true, max_concurrency = true,
  max_waiting = true, per_key = true, keys = true, capacity = true,
  acquire_timeout = true, idle_timeout = true, max_lifetime = true,
  lifetime_jitter = true, validate_after_idle = true, max_keys = true,
  leak_threshold = true, policy = true, pause_mode = true, probe = true,
  restarts = true, scheduler = true, seed = true, backend = true,
  create_backoff = true, create_backoff_max = true, keepalive = true, keepalive_check = true,
  fleet = true,
}

-- Create backoff defaults (docs/decisions.md): after failed creates in a
-- row a key's creates wait a jittered window starting at 0.05 s and
-- doubling up to 2 s; false turns it off.
local CREATE_BACKOFF, CREATE_BACKOFF_MAX = 0.05, 2

local function check_count(o, name, min, default)
  return caps.check_count(o, name, min, default, nil, fail, "option")
end

local function check_duration(o, name)
  local v = o[name]
  if v == nil then return nil end
  if type(v) ~= "number" then fail("option '%s' must be a number of seconds, got %s", name, type(v)) end
  if v ~= v or v == math_huge or v == -math_huge then
    fail("option '%s' must be finite, got %s", name, tostring(v))
  end
  if v <= 0 then fail("option '%s' must be > 0 seconds, got %s", name, tostring(v)) end
  return v
end

local function check_fn(o, name, required)
  local v = o[name]
  if v == nil and not required then return nil end
  if type(v) ~= "function" then
    fail("option '%s' must be a function, got %s", name, type(v))
  end
  return v
end

function M.validate(o)
  if type(o) ~= "table" then fail("new() expects an options table, got %s", type(o)) end
  for k in pairs(o) do
    if not KNOWN[k] then fail("unknown option '%s'", tostring(k)) end
  end
  local c = {}
  c.create = check_fn(o, "create", true)
  c.destroy = check_fn(o, "destroy")
  c.validate = check_fn(o, "validate")
  c.park = check_fn(o, "park")
  c.unpark = check_fn(o, "unpark")
  if (c.park == nil) ~= (c.unpark == nil) then
    fail("options 'park' and 'unpark' go together: give both or neither")
  end
  if o.policy ~= nil then
    local pm = getmetatable(o.policy)
    if type(o.policy) ~= "function" and not (pm and pm.__call) then
      fail("option 'policy' must be a function or a callable policy, got %s", type(o.policy))
    end
    c.policy = o.policy
  end
  if o.max_live == nil then fail("option 'max_live' is required (an integer >= 1)") end
  c.max_live = check_count(o, "max_live", 1)
  c.capacity = check_count(o, "capacity", 1, 1)
  c.min_idle = check_count(o, "min_idle", 0, 0)
  c.max_idle = check_count(o, "max_idle", 0, c.max_live)
  c.max_concurrency = check_count(o, "max_concurrency", 1, math.min(c.max_live * c.capacity, 2147483647))
  c.max_waiting = check_count(o, "max_waiting", 0, 1024)
  c.max_keys = check_count(o, "max_keys", 1)
  c.restarts = check_count(o, "restarts", 0, 3)
  caps.check_order(c, fail, "option")
  if o.per_key ~= nil then
    c.key_max_live, c.key_max_idle = caps.check(o.per_key, c, fail, "option")
  end
  if o.keys ~= nil then
    if type(o.keys) ~= "table" then fail("option 'keys' must be a list of strings, got %s", type(o.keys)) end
    local seen = {}
    for i, k in ipairs(o.keys) do
      if type(k) ~= "string" then fail("option 'keys' must hold strings, item %d is a %s", i, type(k)) end
      if seen[k] then fail("option 'keys' lists '%s' twice", k) end
      seen[k] = true
    end
    for k in pairs(o.keys) do
      if type(k) ~= "number" or not seen[o.keys[k]] then fail("option 'keys' must be a list (array)") end
    end
    if c.max_keys and #o.keys > c.max_keys then
      fail("option 'keys' lists %d keys, more than max_keys (%d)", #o.keys, c.max_keys)
    end
    -- the floor fills min_idle idle clients per warm key, up to max_live in
    -- all; more than max_idle and every release would close one that the
    -- floor then opens again (a floor capped by max_live = max_idle is fine)
    local floor = math.min(c.min_idle * #o.keys, c.max_live)
    if floor > c.max_idle then
      fail("options 'min_idle' (%d) x %d warm keys ('keys'), up to max_live (%d): a floor of %d idle clients, " ..
           "more than max_idle (%d): every release would close a client the warm floor opens again",
           c.min_idle, #o.keys, c.max_live, floor, c.max_idle)
    end
    c.keys = o.keys
  end
  c.acquire_timeout = check_duration(o, "acquire_timeout")
  c.idle_timeout = check_duration(o, "idle_timeout")
  c.max_lifetime = check_duration(o, "max_lifetime")
  c.validate_after_idle = check_duration(o, "validate_after_idle")
  c.leak_threshold = check_duration(o, "leak_threshold")
  c.keepalive = check_duration(o, "keepalive")
  c.keepalive_check = check_fn(o, "keepalive_check")
  if c.keepalive and not (c.keepalive_check or c.validate) then
    fail("option 'keepalive' needs a check to run: a validate hook or keepalive_check")
  end
  if o.create_backoff == false then
    if o.create_backoff_max ~= nil then fail("option 'create_backoff_max' needs create_backoff (it is false)") end
  else
    c.create_backoff = check_duration(o, "create_backoff") or CREATE_BACKOFF
    c.create_backoff_max = check_duration(o, "create_backoff_max") or math.max(CREATE_BACKOFF_MAX, c.create_backoff)
    if c.create_backoff_max < c.create_backoff then
      fail("option 'create_backoff_max' (%s) must be >= create_backoff (%s)",
           tostring(c.create_backoff_max), tostring(c.create_backoff))
    end
  end
  if o.lifetime_jitter ~= nil then
    local j = o.lifetime_jitter
    if type(j) ~= "number" or j ~= j then fail("option 'lifetime_jitter' must be a number, got %s", tostring(j)) end
    if j < 0 or j >= 1 then fail("option 'lifetime_jitter' must be in [0, 1), got %s", tostring(j)) end
    if not c.max_lifetime then fail("option 'lifetime_jitter' needs max_lifetime") end
    c.lifetime_jitter = j
  end
  if o.pause_mode ~= nil and o.pause_mode ~= "queue" and o.pause_mode ~= "fail" then
    fail("option 'pause_mode' must be \"queue\" or \"fail\", got %s", tostring(o.pause_mode))
  end
  if o.probe ~= nil and type(o.probe) ~= "boolean" then
    fail("option 'probe' must be a boolean, got %s", type(o.probe))
  end
  c.pause_mode = o.pause_mode or "queue"
  c.probe = o.probe == true
  if o.seed ~= nil and (not is_int(o.seed) or o.seed < 0 or o.seed >= 2^64) then
    fail("option 'seed' must be an integer in [0, 2^64), got %s", tostring(o.seed))
  end
  c.seed = o.seed
  if o.backend ~= nil then
    local _, err = load_backend(o.backend)
    if err then fail("option 'backend' %s (got %s)", err, tostring(o.backend)) end
    c.backend = o.backend
  end
  c.fleet = o.fleet      -- (checked, and its defaults filled in, by fleetlink.options)
  return c
end

-- The engine's config (clientpool_config_t, by the bindings' field names)
-- for checked options c: new() and configure() hand the engine the same.
function M.engine_config(c)
  return {
    max_live = c.max_live, min_idle = c.min_idle, max_idle = c.max_idle,
    max_concurrency = c.max_concurrency, max_waiting = c.max_waiting, capacity = c.capacity,
    key_max_live = c.key_max_live, key_max_idle = c.key_max_idle, max_keys = c.max_keys,
    idle_timeout = c.idle_timeout, max_lifetime = c.max_lifetime,
    lifetime_jitter = c.lifetime_jitter, validate_after_idle = c.validate_after_idle,
    leak_threshold = c.leak_threshold, seed = c.seed,
    pause_fail = c.pause_mode == "fail" and 1 or 0,
    create_backoff = c.create_backoff or -1, create_backoff_max = c.create_backoff_max or -1,
    keepalive = c.keepalive or -1,
  }
end

---------------------------------------------------------------------------
-- configure(): the options of a running pool
---------------------------------------------------------------------------

-- What configure() may change: the counts, caps and durations. The rest is
-- what the pool is (its hooks and policy, capacity, warm keys, probe,
-- scheduler, seed, backend): fixed at new().
local LIVE = {
  max_live = true, max_idle = true, min_idle = true, max_concurrency = true, max_waiting = true,
  per_key = true, max_keys = true, restarts = true, pause_mode = true,
  acquire_timeout = true, idle_timeout = true, max_lifetime = true, lifetime_jitter = true,
  validate_after_idle = true, leak_threshold = true, create_backoff = true, create_backoff_max = true,
  keepalive = true,
}
M.LIVE = LIVE
local LIVE_LIST = {}
for name in pairs(LIVE) do LIVE_LIST[#LIVE_LIST + 1] = name end
table.sort(LIVE_LIST)
LIVE_LIST = table.concat(LIVE_LIST, ", ")

-- The options a pool keeps (what new() was given, by name): a copy, so a
-- caller who changes its table later changes nothing; per_key and keys are
-- copied too.
local function copy_options(o)
  local m = {}
  for k, v in pairs(o) do
    if type(v) == "table" and (k == "per_key" or k == "keys") then
      local t = {}
      for a, b in pairs(v) do t[a] = b end
      v = t
    end
    m[k] = v
  end
  return m
end
M.copy_options = copy_options

-- The options configure(patch) makes of a pool's current ones (`current`,
-- as kept by copy_options): patch's values over them, false for "as if not
-- given" (none, or the default; create_backoff = false is off, as in
-- new()). Raises for a name that is not an option or cannot change. The
-- result is then checked by validate(), as new()'s options are: an option
-- never given keeps following its default (max_idle = max_live, ...).
function M.merge(current, patch)
  if type(patch) ~= "table" then fail("configure() expects an options table, got %s", type(patch)) end
  for k in pairs(patch) do
    if not KNOWN[k] then fail("unknown option '%s'", tostring(k)) end
    if not LIVE[k] then
      fail("option '%s' cannot change on a running pool (configure() changes %s; make a new pool for the rest)",
           tostring(k), LIVE_LIST)
    end
  end
  local m = copy_options(current)
  for k, v in pairs(copy_options(patch)) do
    if v == false and k ~= "create_backoff" then m[k] = nil else m[k] = v end
  end
  return m
end

---------------------------------------------------------------------------
-- Schedulers
---------------------------------------------------------------------------

local ADAPTER_FIELDS = { "now", "current", "wait", "wake", "spawn", "sleep" }
-- Optional; the driver calls each one it finds (docs/decisions.md, "Schedulers").
local ADAPTER_OPTIONAL = { "background", "done", "alive", "yieldable", "exiting", "log", "owner", "owner_alive",
                           "watch_owners" }
-- Modules of clientpool/sched/ that are building blocks, not adapters.
local NOT_ADAPTERS = { core = true, hosted = true }

function M.scheduler(s)
  if s == nil then
    local ngx = rawget(_G, "ngx")
    if type(ngx) == "table" and type(ngx.get_phase) == "function" then
      s = "ngx"
    else
      -- a pool made inside a cqueues controller or a luv callback belongs
      -- to that host (issue 12: the built-in loop nobody runs there kept
      -- its timer, and its waits yielded to cqueues); elsewhere the
      -- built-in loop, whose waits raise a clientpool: error naming the
      -- scheduler option under a host they detect (sched/core.lua)
      local host = require("clientpool.sched.core").foreign_host()
      if host and host:find('"cqueues"', 1, true) then
        s = "cqueues"
      elseif host and host:find('"luv"', 1, true) then
        s = "luv"
      else
        s = "loop"
      end
    end
  end
  if type(s) == "string" then
    local ok, mod
    if NOT_ADAPTERS[s] then
      ok, mod = false, "module 'clientpool.sched." .. s .. "' not found"
    else
      ok, mod = pcall(require, "clientpool.sched." .. s)
    end
    if not ok then
      local msg = tostring(mod)
      if msg:find("module 'clientpool.sched." .. s .. "' not found", 1, true) then
        error("clientpool: option 'scheduler': no scheduler named '" .. s ..
              "' (built in: loop, ngx, cqueues, luv, copas; or give an adapter table)", 3)
      end
      -- the adapter is there, its host is not (copas not installed for this
      -- Lua, ngx outside OpenResty): say that, with the first line of why
      error("clientpool: option 'scheduler': the '" .. s .. "' adapter cannot load here: " ..
            (msg:match("^[^\n]*"):gsub("^[^:]+:%d+: ", "")), 3)
    end
    s = mod
  end
  if type(s) ~= "table" then
    error("clientpool: option 'scheduler' must be a name or an adapter table, got " .. type(s), 3)
  end
  for _, f in ipairs(ADAPTER_FIELDS) do
    if type(s[f]) ~= "function" then
      error("clientpool: option 'scheduler': the adapter lacks function '" .. f .. "'", 3)
    end
  end
  for _, f in ipairs(ADAPTER_OPTIONAL) do
    local v = s[f]
    if v ~= nil and type(v) ~= "function" then
      error("clientpool: option 'scheduler': the adapter's '" .. f .. "' must be a function when given, got " ..
            type(v), 3)
    end
  end
  return s
end

return M
