--- clientpool.redisfleet.budgets (internal): the budgets a machine leases
-- from Redis besides max_live (docs/fleet.md 14.5): max_concurrency
-- (leases in use) and max_idle below max_live (idle clients), each a
-- counter leased in blocks as max_live is, in the same lease call.
--
-- And per_key.max_live: each key's LIVE clients, a budget "k:<key>" per
-- key this machine uses (keys appear as pools open them: the local
-- fleet's key slots are read at each call), its share the key slot's own
-- cap (clientpool_fleet_key_cap; a key without one admits nothing, the
-- local key_max_live is 0).
--
-- And min_idle, the warm floor: budget "f" of cap min_idle, asked for whole
-- by every machine, so it goes to machines in lease order (the first to
-- ask holds it while it renews; when its lease lapses, the next machine's
-- renewal gets it). The machine's share is its local fleet's min_idle.
--
-- Each budget is { name (its field in the lease script), cap (the
-- configured, fleet-wide figure), kind (the machine-local fleet's counter
-- of what the machine holds of it), share (what this machine may use until
-- its next call), block, maxblock }. The machine-local fleet's limit of
-- each is its share, so the engines enforce it with no change: a lease
-- beyond the concurrency share waits as one beyond max_concurrency does, a
-- client released past the idle share is closed as past max_idle is.
local math_min, math_max, math_floor, math_ceil = math.min, math.max, math.floor, math.ceil

local M = {}
local INT_MAX = 2147483647

local function budget(name, cap, kind)
  return { name = name, cap = cap, kind = kind, share = 0, block = 1, maxblock = math_max(1, math_ceil(cap / 8)) }
end

-- What a budget holds and how many wait on it: the local fleet's counter,
-- and its callers waiting (fixed budgets), or the key slot's (keys).
local function counts(b, h, waiting)
  if b.key then return b.live, b.demand end
  if b.name == "f" then return 0, 0 end          -- (an assignment: nothing is held of it)
  return h:count(b.kind, -1), waiting
end

--- The budgets of configuration cfg (redisfleet.validate's) beyond
-- max_live, in lease-call order; B is the fleet binding (its kinds).
function M.new(cfg, B)
  local list = {}
  if cfg.max_concurrency then list[#list + 1] = budget("c", cfg.max_concurrency, B.LEASE) end
  if cfg.max_idle < cfg.max_live then list[#list + 1] = budget("i", cfg.max_idle, B.IDLE) end
  if cfg.min_idle > 0 then list[#list + 1] = budget("f", cfg.min_idle, nil) end
  return list
end

--- The budgets of one lease call: the fixed ones, then one per key of the
-- local fleet that holds clients, has callers waiting or a share (R.kb:
-- the per-key state, kept across calls). A key whose slot is gone (no
-- pool of the machine uses it) is not asked for: its units go back.
function M.collect(R)
  local list = R.bud
  local cap = R.cfg.key_max_live
  if not cap then return list end
  local out = {}
  for i = 1, #list do out[i] = list[i] end
  local h, seen, unsure = R.h, {}, false
  local n = h:stats().keys_cap
  for s = 0, n - 1 do
    local name, t = h:key_stats(s)
    if not name and t ~= nil then unsure = true end   -- (the admin lock was busy)
    if name then
      local b = R.kb[name]
      if b or t.live > 0 or t.demand_live > 0 then
        if not b then
          b = budget("k:" .. name, cap, nil)
          b.key = name
          R.kb[name] = b
        end
        b.live, b.demand = t.live, t.demand_live
        seen[name] = true
        out[#out + 1] = b
      end
    end
  end
  -- a key not read this time keeps its units (asked for with what was
  -- last seen) unless every slot was read: what is held stays accounted
  for name, b in pairs(R.kb) do
    if not seen[name] then
      if unsure then out[#out + 1] = b else R.kb[name] = nil end
    end
  end
  return out
end

--- The machine-local limits the shares make (lim: the local fleet's
-- limits, its max_live already the live share).
function M.limits(list, lim, cfg_keys)
  lim.max_concurrency = INT_MAX
  if cfg_keys then lim.key_max_live = 0 end
  for _, b in ipairs(list) do
    if b.name == "c" then lim.max_concurrency = b.share
    elseif b.name == "i" then lim.max_idle = math_min(lim.max_idle, b.share) end
  end
  for _, b in ipairs(list) do
    if b.name == "f" then lim.min_idle = math_min(b.share, lim.max_idle) end
  end
end

--- The floor this machine keeps (its share of min_idle), 0 without one.
function M.floor(list)
  for _, b in ipairs(list) do if b.name == "f" then return b.share end end
  return 0
end

-- What budget b asks for: its holding plus a block, as max_live's rule
-- (agent.lua), with `waiting` callers on the machine. The idle budget
-- does not grow with waiters (a waiter is handed a released client, which
-- never goes idle): its block doubles when the share is full, halves when
-- more than a block is unused. Others waiting: no more than a fair share.
local function want_of(b, held, waiting, others, machines)
  local want
  if b.key then waiting = b.demand end
  if b.name == "f" then return b.cap end           -- whole, first come first served
  if b.name == "i" then
    if held >= b.share then b.block = math_min(b.block * 2, b.maxblock)
    elseif b.share - held > b.block then b.block = math_max(1, math_floor(b.block / 2)) end
    want = held + b.block
  elseif waiting > 0 then
    if b.share - held < waiting then b.block = math_min(b.block * 2, b.maxblock) end
    want = held + waiting + b.block
  elseif others > 0 then
    want = held
  else
    if b.share - held > b.block then b.block = math_max(1, math_floor(b.block / 2)) end
    want = held + b.block
  end
  if others > 0 then want = math_min(want, math_max(1, math_ceil(b.cap / math_max(1, machines)))) end
  return math_min(want, b.cap)
end

--- Appends each budget's lease arguments (name, want, need, cap) to args
-- and shrinks the shares first (what may be held during the call is
-- claimed, as for max_live). h: the local fleet; returns whether a share
-- came down (the local limits need an update before the call).
function M.ask(list, h, waiting, others, machines, args)
  local lowered = false
  args[#args + 1] = #list
  for _, b in ipairs(list) do
    local held = counts(b, h, waiting)
    local want = want_of(b, held, waiting, others, machines)
    local c = math_min(b.share, want)
    if c < b.share then b.share, lowered = c, true end
    args[#args + 1] = b.name
    args[#args + 1] = want
    args[#args + 1] = math_max(c, held)
    args[#args + 1] = b.cap
  end
  return lowered
end

--- Whether callers wait that a budget's share has no room for (the agent
-- then asks again soon rather than at the next renewal).
function M.short(list, h, waiting)
  for _, b in ipairs(list) do
    if b.name ~= "i" then
      local held, w = counts(b, h, waiting)
      if w > 0 and b.share - held < w then return true end
    end
  end
  return false
end

--- Takes the shares from a lease reply v (n of budget j at v[8 + 2j]).
function M.granted(list, v)
  for j, b in ipairs(list) do b.share = tonumber(v[8 + 2 * j]) or 0 end
end

--- Each key's share into its slot's own cap (only when it changed).
function M.apply_keys(list, h)
  for _, b in ipairs(list) do
    if b.key and b.share ~= b.applied then
      h:key_cap(b.key, b.share)
      b.applied = b.share
    end
  end
end

--- The fence: at sent + ttl/2 no share above what is held, at
-- valid_until none. Returns whether a share came down.
function M.fence(list, h, lapsed, kb, LIVE)
  local lowered = false
  for _, b in ipairs(list) do
    -- (the floor: no refill on a lapsed lease; before that the live cap
    -- at what is held admits none anyway)
    local cap = lapsed and 0 or b.name == "f" and b.share or math_min(b.share, h:count(b.kind, -1))
    if cap < b.share then b.share, lowered = cap, true end
  end
  for name, b in pairs(kb or {}) do
    local held = 0
    if not lapsed then
      local s = h:key_find(name)
      if s then held = h:count(LIVE, s) end
    end
    local cap = math_min(b.share, held)
    if cap < b.share then b.share = cap; h:key_cap(name, cap); b.applied = cap end
  end
  return lowered
end

--- A new agent starts from the shares the previous one left in the local
-- fleet's limits (lim).
function M.adopt(list, lim)
  for _, b in ipairs(list) do
    if b.name == "c" then b.share = lim.max_concurrency < INT_MAX and lim.max_concurrency or 0
    elseif b.name == "i" then b.share = lim.max_idle
    elseif b.name == "f" then b.share = lim.min_idle end
  end
end

--- Every share to 0 (a leave).
function M.reset(list)
  for _, b in ipairs(list) do b.share = 0 end
end

--- { [name] = { share, block } } for fleet.stats().redis.agent.
function M.view(list)
  local t = {}
  for _, b in ipairs(list) do t[b.name] = { share = b.share, block = b.block, cap = b.cap } end
  return t
end

return M
