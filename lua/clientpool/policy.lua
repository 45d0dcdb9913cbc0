--- Ready-made protocol policies for clientpool.
--
-- A policy is called by `lease:observe(outcome)` and returns a directive:
-- nil (or { continue = true }) for no change, { pause = reason [, scope =
-- "key"] [, resume_after = s] } to pause admission, { retire = "client" |
-- "key" } to retire the client (and, for "key", every older client of its
-- key). Policies never touch the outcome or the operation that produced it.
-- The built-ins are callable tables, so they can also be inspected
-- (`policy.statuses`).
-- @module clientpool.policy

local type, tonumber, tostring, setmetatable, pairs = type, tonumber, tostring, setmetatable, pairs
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

local Http = {}
Http.__index = Http

--- An HTTP policy: the statuses it pauses on (default 429 and 503), with
-- Retry-After honoured as resume_after. The outcome is a status number, or
-- a table { status = n, headers = { ["Retry-After"] = ... } } (lua-resty-http
-- responses have this shape; headers may also be a lua-http http.headers
-- object, as in clientpool.http responses). scope = "key" (default) pauses only the key
-- (the origin); "pool" pauses the whole pool.
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
  return setmetatable({ statuses = statuses, scope = scope,
                        retry_after = opts.retry_after ~= false }, Http)
end

Http.__call = function(self, outcome)
  local status, headers
  if type(outcome) == "number" then
    status = outcome
  elseif type(outcome) == "table" then
    status, headers = tonumber(outcome.status), outcome.headers
  end
  if not status or not self.statuses[status] then return nil end
  local d = { pause = "http " .. status, scope = self.scope }
  if self.retry_after then d.resume_after = _M.retry_after(header(headers, "Retry-After")) end
  return d
end

local Redis = {}
Redis.__index = Redis

--- A Redis policy. The outcome is the error string of a reply (or nil on
-- success). LOADING and BUSY pause the key (the server) until resume or
-- resume_after; READONLY (a failed-over primary) retires the client and
-- every client of its key created before it.
function _M.redis(opts)
  opts = opts or {}
  if type(opts) ~= "table" then error("clientpool.policy.redis: options table expected", 2) end
  local ra = opts.resume_after
  if ra ~= nil and (type(ra) ~= "number" or not (ra >= 0 and ra < math_huge)) then
    error("clientpool.policy.redis: resume_after must be a finite number >= 0, got " .. tostring(ra), 2)
  end
  return setmetatable({ resume_after = opts.resume_after }, Redis)
end

Redis.__call = function(self, outcome)
  if type(outcome) ~= "string" then return nil end
  local word = string_match(outcome, "^%-?(%u+)")
  if word == "LOADING" or word == "BUSY" then
    return { pause = "redis " .. word, scope = "key", resume_after = self.resume_after }
  elseif word == "READONLY" then
    return { retire = "key" }
  end
  return nil
end

return _M
