--- clientpool.redisfleet (internal): fleet.new(name, { backend = "redis" })
-- and the fleet functions across machines (docs/fleet.md section 14).
--
--   fleet.new("db-main", { backend = "redis", max_live = 200, ttl = 3,
--     redis = { host = "10.0.0.5", port = 6379, password = "...", db = 0 },
--     machine = "gw-3" })     -- default: the host name
--   clientpool.new { fleet = "db-main", ... }   -- as with one machine
--
-- This machine's processes share a machine-local fleet named
-- "<name>.<machine>" whose cap is the share this machine leases from
-- Redis (agent.lua); `machine` names the machine in Redis and the local
-- segment, so several processes given different `machine` names on one
-- host behave as that many machines (the specs simulate machines so). Two
-- real machines must never share a name.
local agent = require "clientpool.redisfleet.agent"

local type, pairs, tostring, error = type, pairs, tostring, error
local math_floor, math_max, math_ceil = math.floor, math.max, math.ceil

local M = {}

local INT_MAX = 2147483647
local NONE = 1073741824

local function fail(fmt, ...)
  error("clientpool: " .. string.format(fmt, ...), 0)
end

local function is_int(v) return type(v) == "number" and v == v and v == math_floor(v) and v > -1e300 and v < 1e300 end

local KNOWN = {
  backend = true, max_live = true, max_idle = true, min_idle = true, max_concurrency = true, per_key = true,
  max_keys = true, members = true, attempts = true, redis = true, ttl = true, machine = true, block = true,
}
local REDIS_KNOWN = { host = true, port = true, password = true, username = true, db = true, timeout = true,
                      prefix = true }

local function hostname()
  local f = io.open("/proc/sys/kernel/hostname", "r")
  local n = f and f:read("*l")
  if f then f:close() end
  if not n or n == "" then n = os.getenv("HOSTNAME") end
  return n
end

--- The configuration of a Redis fleet from fleet.new's options.
function M.validate(o)
  for k in pairs(o) do
    if not KNOWN[k] then fail("unknown fleet option '%s'", tostring(k)) end
  end
  local ml = o.max_live
  if ml == nil then fail("fleet option 'max_live' is required (an integer >= 1)") end
  if not is_int(ml) or ml < 1 or ml > NONE - 1 then
    fail("fleet option 'max_live' must be an integer in [1, %d], got %s", NONE - 1, tostring(ml))
  end
  -- max_live, max_concurrency and max_idle are leased across machines
  -- (budgets.lua); the rest not yet
  local kml
  if o.per_key ~= nil then
    if type(o.per_key) ~= "table" then fail("fleet option 'per_key' must be a table, got %s", type(o.per_key)) end
    for k in pairs(o.per_key) do
      if k ~= "max_live" then
        fail("fleet option 'per_key.%s' is not supported with backend = \"redis\" yet " ..
             "(per_key.max_live is leased across machines)", tostring(k))
      end
    end
    kml = o.per_key.max_live
    if kml ~= nil and (not is_int(kml) or kml < 1 or kml > ml) then
      fail("fleet option 'per_key.max_live' must be an integer in [1, max_live (%d)], got %s", ml, tostring(kml))
    end
  end
  local mi = o.max_idle
  if mi ~= nil and (not is_int(mi) or mi < 0 or mi > ml) then
    fail("fleet option 'max_idle' must be an integer in [0, max_live (%d)], got %s", ml, tostring(mi))
  end
  local mn = o.min_idle
  if mn ~= nil and (not is_int(mn) or mn < 0 or mn > (mi or ml)) then
    fail("fleet option 'min_idle' must be an integer in [0, max_idle (%d)], got %s", mi or ml, tostring(mn))
  end
  local mc = o.max_concurrency
  if mc ~= nil and (not is_int(mc) or mc < 1 or mc > NONE - 1) then
    fail("fleet option 'max_concurrency' must be an integer in [1, %d], got %s", NONE - 1, tostring(mc))
  end
  local r = o.redis
  if type(r) ~= "table" then fail("fleet option 'redis' must be a table { host, port, ... }, got %s", type(r)) end
  for k in pairs(r) do
    if not REDIS_KNOWN[k] then fail("unknown fleet option 'redis.%s'", tostring(k)) end
  end
  if r.host ~= nil and (type(r.host) ~= "string" or r.host == "") then
    fail("fleet option 'redis.host' must be a non-empty string, got %s", type(r.host))
  end
  if r.port ~= nil and (not is_int(r.port) or r.port < 1 or r.port > 65535) then
    fail("fleet option 'redis.port' must be an integer in [1, 65535], got %s", tostring(r.port))
  end
  for _, k in ipairs({ "password", "username", "prefix" }) do
    if r[k] ~= nil and type(r[k]) ~= "string" then
      fail("fleet option 'redis.%s' must be a string, got %s", k, type(r[k]))
    end
  end
  if r.username ~= nil and r.password == nil then fail("fleet option 'redis.username' needs 'redis.password'") end
  if r.db ~= nil and (not is_int(r.db) or r.db < 0) then
    fail("fleet option 'redis.db' must be an integer >= 0, got %s", tostring(r.db))
  end
  if r.timeout ~= nil and (type(r.timeout) ~= "number" or r.timeout ~= r.timeout or r.timeout <= 0
                           or r.timeout == math.huge) then
    fail("fleet option 'redis.timeout' must be a finite number of seconds > 0, got %s", tostring(r.timeout))
  end
  local ttl = o.ttl
  if ttl == nil then ttl = 3 end
  if type(ttl) ~= "number" or ttl ~= ttl or ttl < 0.2 or ttl > 3600 then
    fail("fleet option 'ttl' must be a number of seconds in [0.2, 3600], got %s", tostring(o.ttl))
  end
  local machine = o.machine
  if machine == nil then machine = hostname() end
  if type(machine) ~= "string" or not machine:match("^[A-Za-z0-9._-]+$") or #machine > 64 then
    fail("fleet option 'machine' must be 1 to 64 bytes of [A-Za-z0-9._-], got %s",
         type(machine) == "string" and string.format("%q", machine:sub(1, 70)) or type(machine))
  end
  local block = o.block
  if block == nil then block = math_max(1, math_ceil(ml / 8)) end
  if not is_int(block) or block < 1 or block > ml then
    fail("fleet option 'block' must be an integer in [1, max_live (%d)], got %s", ml, tostring(o.block))
  end
  local c = {
    max_live = ml, ttl = ttl, machine = machine, block = block, max_idle = mi or ml, idle_given = mi,
    max_concurrency = mc, min_idle = mn or 0,
    redis = { host = r.host or "127.0.0.1", port = r.port or 6379, password = r.password, username = r.username,
              db = r.db or 0, timeout = r.timeout or 1, prefix = r.prefix or "clientpool:fleet:" },
  }
  for _, k in ipairs({ "max_keys", "members", "attempts" }) do
    if o[k] ~= nil and (not is_int(o[k]) or o[k] < 1) then
      fail("fleet option '%s' must be an integer >= 1, got %s", k, tostring(o[k]))
    end
  end
  c.max_keys, c.members, c.attempts = o.max_keys or 256, o.members or 64, o.attempts or 3
  c.key_max_live = kml
  if kml and o.max_keys == nil then c.max_keys = 64 end
  -- (every key's share rides on each lease call: their number is bounded)
  if kml and c.max_keys > 64 then
    fail("fleet option 'max_keys' must be <= 64 with per_key.max_live and backend = \"redis\", got %d", c.max_keys)
  end
  return c
end

-- Opens a machine-local segment: attaches when it exists (its limits are
-- the agent's to set: attaching must not reset the share), else creates
-- it with `lim`.
local function open_local(B, name, lim)
  local h, code, msg = B.open(name)
  if h then return h end
  if code ~= "enoent" then fail("fleet.new: machine-local fleet '%s': %s", name, tostring(msg)) end
  local created
  h, created, msg = B.open(name, lim)
  if not h then fail("fleet.new: machine-local fleet '%s': %s", name, tostring(created and msg or msg)) end
  return h
end

--- fleet.new for backend "redis": returns the fields fleet.lua registers
-- (the local handle as _h, the Redis state as _redis).
function M.new(name, o, B)
  local c = M.validate(o)
  local local_name = name .. "." .. c.machine
  local h = open_local(B, local_name, {
    max_live = 0, max_idle = 0, min_idle = 0, max_concurrency = c.max_concurrency and 0 or INT_MAX,
    max_keys = c.max_keys, members = c.members, attempts = c.attempts, key_max_live = c.key_max_live and 0 or -1,
    key_max_idle = -1,
  })
  local eh = open_local(B, local_name .. ".agent", {
    max_live = 1, max_idle = 0, min_idle = 0, max_concurrency = INT_MAX, max_keys = 1, members = c.members,
    attempts = 1, key_max_live = -1, key_max_idle = -1,
  })
  local R = agent.new(name, c, h, eh, B)
  R.local_name = local_name
  return h, R
end

--- The limits a pool on this fleet defaults to (fleetlink.options): the
-- configured, fleet-wide ones, not the machine's current share.
function M.limits(R)
  local c = R.cfg
  return { max_live = c.max_live, max_idle = c.max_idle, min_idle = c.min_idle,
           max_concurrency = c.max_concurrency or NONE,
           key_max_live = c.key_max_live or -1, key_max_idle = -1, max_keys = c.max_keys, members = c.members }
end

M.agent = agent
return M
