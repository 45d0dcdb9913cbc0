--- Ready-made protocol policies for clientpool.
--
-- A policy is called by `lease:observe(outcome)` and returns a directive:
-- nil (or { continue = true }) for no change, { pause = reason [, scope =
-- "key"] [, resume_after = s] } to pause admission, { retire = "client" |
-- "key" } to retire the client (and, for "key", every older client of its
-- key). Policies never touch the outcome or the operation that produced it.
-- The built-ins are callable tables, so they can also be inspected
-- (`policy.statuses`).
--
-- The pool never invents a resume deadline (DESIGN section 3), so a
-- ready-made policy declares its own: where the outcome carries none (an
-- HTTP 429 or 503 without Retry-After, a Redis LOADING), it pauses for a
-- backoff that doubles with each pause in a row of the same scope (base,
-- 2 base, 4 base, ... up to max) and starts over once that scope observes an
-- outcome that continues. A pause is never for good.
-- @module clientpool.policy

local type, tonumber, tostring, setmetatable, pairs, rawget = type, tonumber, tostring, setmetatable, pairs, rawget
local driver_base = require "clientpool.base"
local pool_of, lease_key = driver_base.pool_of, driver_base.lease_key
local os_time, os_date = os.time, os.date
local math_huge = math.huge
local string_match, string_lower = string.match, string.lower

local _M = {}

local MONTHS = { jan = 1, feb = 2, mar = 3, apr = 4, may = 5, jun = 6,
                 jul = 7, aug = 8, sep = 9, oct = 10, nov = 11, dec = 12 }

-- Seconds from now until an HTTP-date (RFC 7231 IMF-fixdate), or nil.
local function http_date_delay(v, now)
  local d, mon, y, h, mi, sec = string_match(v, "^%a+, (%d%d) (%a%a%a) (%d%d%d%d) (%d%d):(%d%d):(%d%d) GMT$")
  if not d then return nil end
  local m = MONTHS[string_lower(mon)]
  if not m then return nil end
  -- os.time reads the table as local time: correct by the zone offset
  local t = os_time { year = tonumber(y), month = m, day = tonumber(d),
                      hour = tonumber(h), min = tonumber(mi), sec = tonumber(sec), isdst = false }
  local utc = os_date("!*t", t)
  utc.isdst = false
  local offset = os_time(utc) - t
  return (t - offset) - now
end

--- Parses a Retry-After value: delay seconds or an HTTP-date. Returns
-- seconds (>= 0) or nil when absent or malformed.
function _M.retry_after(v, now)
  if v == nil then return nil end
  if type(v) == "table" then v = v[1] end   -- a header given more than once
  if type(v) == "number" then return v >= 0 and v < math_huge and v or nil end
  if type(v) ~= "string" then return nil end
  local n = string_match(v, "^%s*(%d+)%s*$")
  if n then
    n = tonumber(n)
    return n < math_huge and n or nil     -- too many digits for a number
  end
  local delay = http_date_delay(v, now or os_time())
  if delay == nil then return nil end
  return delay > 0 and delay or 0
end

local function header(headers, name)
  if type(headers) ~= "table" then return nil end
  -- a lua-http headers object (clientpool.http responses): lower-case names
  local get = headers.get
  if type(get) == "function" then return get(headers, string_lower(name)) end
  local v = headers[name]
  if v ~= nil then return v end
  local lname = string_lower(name)
  for k, hv in pairs(headers) do
    if type(k) == "string" and string_lower(k) == lname then return hv end
  end
  return nil
end


---------------------------------------------------------------------------
-- The backoff of pauses a policy declares itself.
---------------------------------------------------------------------------

-- Defaults, seconds: the first pause of a scope lasts `base`, each pause in
-- a row doubles it, up to `max`.
_M.BACKOFF = { base = 1, max = 30 }

local function check_backoff(who, b)
  if b == nil then return _M.BACKOFF.base, _M.BACKOFF.max end
  if type(b) ~= "table" then
    error("clientpool.policy." .. who .. ": backoff must be a table { base = s, max = s }, got " .. type(b), 3)
  end
  for k in pairs(b) do
    if k ~= "base" and k ~= "max" then
      error("clientpool.policy." .. who .. ": unknown backoff field '" .. tostring(k) .. "' (base, max)", 3)
    end
  end
  local base, max = b.base or _M.BACKOFF.base, b.max
  if max == nil then   -- a base alone above the default max: pauses of base each
    max = _M.BACKOFF.max
    if type(base) == "number" and base > max then max = base end
  end
  for name, v in pairs { base = base, max = max } do
    if type(v) ~= "number" or not (v > 0 and v < math_huge) then
      error("clientpool.policy." .. who .. ": backoff." .. name .. " must be a finite number > 0, got " ..
            tostring(v), 3)
    end
  end
  if max < base then
    error("clientpool.policy." .. who .. ": backoff.max (" .. tostring(max) .. ") must be >= backoff.base (" ..
          tostring(base) .. ")", 3)
  end
  return base, max
end

-- The clock of the pool a lease belongs to (its scheduler's now(), which
-- is what resume_after is measured on), or the wall clock without a lease.
local function now_of(lease)
  local p = pool_of(lease)
  local sched = type(p) == "table" and rawget(p, "_sched")
  if sched then return sched.now() end
  return os_time()
end

-- The state of one scope (the pool, or a key of it) a policy paused:
-- { n = pauses in a row, ends = when the latest one ends }. A policy object
-- may serve several pools: states are kept per pool (weak), then per scope.
local function scope_state(self, lease, scope, create)
  local p = pool_of(lease) or false
  local per_pool = self._states[p]
  if not per_pool then
    if not create then return nil end
    per_pool = {}
    self._states[p] = per_pool
  end
  local name = scope == "key" and p and lease_key(p, lease) or ""
  local st = per_pool[name]
  if not st and create then
    st = { n = 0, ends = -math_huge }
    per_pool[name] = st
  end
  return st, per_pool, name
end

-- The pause a policy declares for an outcome with no deadline of its own.
-- An outcome observed while the scope's previous pause still runs (a lease
-- admitted before it) repeats what is left of that pause instead of growing
-- it: concurrent requests that all meet the same 429 count as one.
local function backoff_delay(self, lease, scope)
  local st = scope_state(self, lease, scope, true)
  local now = now_of(lease)
  if now < st.ends then return st.ends - now end
  st.n = st.n + 1
  local d = self.backoff_base * 2 ^ (st.n - 1)
  if d > self.backoff_max then d = self.backoff_max end
  st.ends = now + d
  return d
end

-- An outcome that continues: the scope's backoff starts over.
local function backoff_reset(self, lease, scope)
  local st, per_pool, name = scope_state(self, lease, scope, false)
  if st then per_pool[name] = nil end
end

local WEAK_KEYS = { __mode = "k" }

local Http = {}
Http.__index = Http

--- An HTTP policy: the statuses it pauses on (default 429 and 503), with
-- Retry-After honoured as resume_after. The outcome is a status number, or
-- a table { status = n, headers = { ["Retry-After"] = ... } } (lua-resty-http
-- responses have this shape; headers may also be a lua-http http.headers
-- object, as in clientpool.http responses). scope = "key" (default) pauses
-- only the key (the origin); "pool" pauses the whole pool. Without
-- Retry-After (or with retry_after = false) the pause lasts the policy's
-- backoff (opts.backoff = { base = s, max = s }, default policy.BACKOFF),
-- which grows while the outcome repeats and starts over after a status
-- that continues.
function _M.http(opts)
  opts = opts or {}
  if type(opts) ~= "table" then error("clientpool.policy.http: options table expected", 2) end
  local statuses = {}
  local list = opts.statuses or { 429, 503 }
  if type(list) ~= "table" then
    error("clientpool.policy.http: statuses must be a list of status numbers, got " .. type(list), 2)
  end
  for _, st in pairs(list) do
    if type(st) ~= "number" or st ~= st or st % 1 ~= 0 then
      error("clientpool.policy.http: statuses must be integer status numbers, got " .. tostring(st), 2)
    end
    statuses[st] = true
  end
  local scope = opts.scope or "key"
  if scope ~= "key" and scope ~= "pool" then
    error("clientpool.policy.http: scope must be \"key\" or \"pool\", got " .. tostring(scope), 2)
  end
  local base, max = check_backoff("http", opts.backoff)
  return setmetatable({ statuses = statuses, scope = scope, retry_after = opts.retry_after ~= false,
                        backoff_base = base, backoff_max = max,
                        _states = setmetatable({}, WEAK_KEYS) }, Http)
end

Http.__call = function(self, outcome, lease)
  local status, headers
  if type(outcome) == "number" then
    status = outcome
  elseif type(outcome) == "table" then
    status, headers = tonumber(outcome.status), outcome.headers
  end
  if not status or not self.statuses[status] then
    if status then backoff_reset(self, lease, self.scope) end
    return nil
  end
  local d = { pause = "http " .. status, scope = self.scope }
  if self.retry_after then d.resume_after = _M.retry_after(header(headers, "Retry-After")) end
  if d.resume_after == nil then d.resume_after = backoff_delay(self, lease, self.scope) end
  return d
end

local Redis = {}
Redis.__index = Redis

-- What a Redis error reply's first word asks of the pool. The outcome of
-- one command never rewrites or retries it; these only gate admission:
--   LOADING, BUSY, MASTERDOWN, CLUSTERDOWN: the server (the key) cannot
--     serve anyone for a while: pause the key for the backoff;
--   READONLY: the primary failed over: retire this client and every older
--     client of the key (they reach the same, now replica, server);
--   MOVED, ASK, TRYAGAIN: a Redis Cluster redirect or a resharding retry
--     concerns this command's hash slot, not the connection or the server:
--     the caller follows it; the pool continues (no pause, no retire).
local REDIS_PAUSE = { LOADING = true, BUSY = true, MASTERDOWN = true, CLUSTERDOWN = true }
_M.REDIS_CONTINUE = { MOVED = true, ASK = true, TRYAGAIN = true }

--- A Redis policy. The outcome is the error string of a reply (or nil on
-- success). LOADING, BUSY, MASTERDOWN and CLUSTERDOWN pause the key (the
-- server) for opts.resume_after seconds if given, else for the policy's
-- backoff (opts.backoff, default policy.BACKOFF: growing while the error
-- repeats, starting over after a reply that continues); READONLY (a
-- failed-over primary) retires the client and every client of its key
-- created before it; MOVED, ASK and TRYAGAIN continue.
function _M.redis(opts)
  opts = opts or {}
  if type(opts) ~= "table" then error("clientpool.policy.redis: options table expected", 2) end
  local ra = opts.resume_after
  if ra ~= nil and (type(ra) ~= "number" or not (ra >= 0 and ra < math_huge)) then
    error("clientpool.policy.redis: resume_after must be a finite number >= 0, got " .. tostring(ra), 2)
  end
  local base, max = check_backoff("redis", opts.backoff)
  return setmetatable({ resume_after = opts.resume_after, backoff_base = base, backoff_max = max,
                        _states = setmetatable({}, WEAK_KEYS) }, Redis)
end

Redis.__call = function(self, outcome, lease)
  if type(outcome) ~= "string" then
    backoff_reset(self, lease, "key")
    return nil
  end
  local word = string_match(outcome, "^%-?(%u+)")
  if REDIS_PAUSE[word] then
    return { pause = "redis " .. word, scope = "key",
             resume_after = self.resume_after or backoff_delay(self, lease, "key") }
  elseif word == "READONLY" then
    return { retire = "key" }
  end
  -- any other reply, errors of the command itself included, shows the
  -- server serving: the backoff starts over
  backoff_reset(self, lease, "key")
  return nil
end

return _M
