-- clientpool.caps (internal): the rules of the capacity options, one set
-- for clientpool.new (options.lua) and fleet.new (fleet.lua): an integer
-- count (check_count), max_idle <= max_live, min_idle <= max_idle, and per_key. Each
-- caller passes its own fail (its error form) and the word its messages use
-- ("option", "fleet option"). Requires nothing.
local type, pairs, tostring = type, pairs, tostring
local math_floor, math_huge = math.floor, math.huge

local _M = {}

-- An integer count (no NaN, no infinity): the test of every count option,
-- per_key's and the others' (options.lua and fleet.lua use it too).
local function is_int(v)
  return type(v) == "number" and v == v and v ~= math_huge and v ~= -math_huge and math_floor(v) == v
end
_M.is_int = is_int

-- Option o[name]: default if not given, else an integer count in [min,
-- max] (max: 2^31 - 1 if nil, the engine's int32_t).
function _M.check_count(o, name, min, default, max, fail, what)
  local v = o[name]
  if v == nil then return default end
  if not is_int(v) then
    fail("%s '%s' must be an integer, got %s", what, name, type(v) == "number" and tostring(v) or type(v))
  end
  if v < min then fail("%s '%s' must be >= %d, got %d", what, name, min, v) end
  max = max or 2147483647
  if v > max then fail("%s '%s' must be <= %d, got %s", what, name, max, tostring(v)) end
  return v
end

-- per_key.<name>: an integer >= min, no larger than the pool's own cap c[name].
local function check_cap(pk, name, min, c, fail, what)
  local v = pk[name]
  if not is_int(v) or v < min then
    fail("%s 'per_key.%s' must be an integer >= %d, got %s", what, name, min, tostring(v))
  end
  if v > c[name] then
    fail("%s 'per_key.%s' (%d) must be <= %s (%d)", what, name, v, name, c[name])
  end
end

-- max_idle <= max_live and min_idle <= max_idle, for the checked counts c.
function _M.check_order(c, fail, what)
  if c.max_idle > c.max_live then
    fail("%s 'max_idle' (%d) must be <= max_live (%d)", what, c.max_idle, c.max_live)
  end
  if c.min_idle > c.max_idle then
    fail("%s 'min_idle' (%d) must be <= max_idle (%d)", what, c.min_idle, c.max_idle)
  end
end

-- Checks pk (the per_key option) against c (the checked max_live, max_idle,
-- min_idle); returns per_key's max_live and max_idle, nil where not given.
function _M.check(pk, c, fail, what)
  if type(pk) ~= "table" then fail("%s 'per_key' must be a table, got %s", what, type(pk)) end
  for k in pairs(pk) do
    if k ~= "max_live" and k ~= "max_idle" then fail("unknown %s 'per_key.%s'", what, tostring(k)) end
  end
  local key_max_live, key_max_idle
  if pk.max_live ~= nil then
    check_cap(pk, "max_live", 1, c, fail, what)
    if c.min_idle > pk.max_live then  -- the floor of a key could never be met
      fail("%s 'min_idle' (%d) must be <= per_key.max_live (%d)", what, c.min_idle, pk.max_live)
    end
    key_max_live = pk.max_live
  end
  if pk.max_idle ~= nil then
    check_cap(pk, "max_idle", 0, c, fail, what)
    if key_max_live and pk.max_idle > key_max_live then
      fail("%s 'per_key.max_idle' (%d) must be <= per_key.max_live (%d)", what, pk.max_idle, key_max_live)
    end
    if c.min_idle > pk.max_idle then
      fail("%s 'min_idle' (%d) must be <= per_key.max_idle (%d)", what, c.min_idle, pk.max_idle)
    end
    key_max_idle = pk.max_idle
  end
  return key_max_live, key_max_idle
end

return _M
