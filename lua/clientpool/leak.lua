--- clientpool.leak (internal): leases held too long, and leases lost.
--
-- Owns the engine's EV_LEAK events: a lease collected while held (one
-- `leak` event per lease; the engine destroys its client) and, with
-- leak_threshold, a lease or checkout held longer than that, reported
-- with the place it was acquired. A report that comes while the grant's
-- create/validate/unpark hooks still run (the lease or checkout is
-- registered after them) is kept in _early_leaks and made when it is
-- registered (report_early).

local base = require "clientpool.base"
local slot_of = base.slot_of
local events = require "clientpool.events"
base.own_source()

local tostring, string_format = tostring, string.format
local log, emit, hook_key, clock = base.log, base.emit, base.hook_key, base.clock

local M = {}

-- Reports lease slot l (generation g), held since `since` past
-- leak_threshold, if a lease or a checkout holds it; false if none does.
local function report_held(self, l, g, since)
  local lease = self._held[l]
  local _, lg, k
  if lease then _, lg, _, k = slot_of(self, lease) end
  if lease and lg == g then
    local name = self._knames[k]
    -- (no traceback for a lease taken before configure() set leak_threshold)
    local info = { leaked = false, held = clock(self) - since, lease = lease,
                   where = lease._where or "acquired before leak_threshold was set" }
    if self._on.leak then
      emit(self, "leak", hook_key(name), info)
    else
      log(self, string_format("lease of key '%s' held %.3fs (leak_threshold), %s",
        name, info.held, tostring(lease._where)))
    end
    return true
  end
  -- a checkout (no lease object, no traceback; _held may still name the
  -- slot's last lease, released: the C fast release leaves its entry)
  local rec
  rec, k = self._e:checkout_record(l, g)
  if rec ~= nil then
    local name = self._knames[k]
    local info = { leaked = false, held = clock(self) - since, where = "checkout" }
    if self._on.leak then
      emit(self, "leak", hook_key(name), info)
    else
      log(self, string_format("checkout of key '%s' held %.3fs (leak_threshold)", name, info.held))
    end
    return true
  end
  return false
end

-- A lease or checkout of slot l (generation g) was just registered: the
-- engine's leak_threshold report, if it came while its hooks still ran.
local function report_early(self, l, g)
  local early = self._early_leaks
  local r = early[l]
  if r == nil then return end
  early[l] = nil
  if r[1] == g then report_held(self, l, g, r[2]) end
end

events.on[base.core.EV_LEAK] = function(self, _, a, b, c, tt)
  -- b: the lease's generation, a uint32 the event carries as an int32
  -- (negative past 2^31 reuses of the slot); grants and E:guarded give it
  -- unsigned
  b = b % 4294967296
  if a < 0 then
    -- a lease collected while held (one report per lease; its client is
    -- destroyed when its last lease ends)
    emit(self, "leak", hook_key(self._knames[c]), { leaked = true })
  elseif not report_held(self, a, b, tt) then
    -- granted, but its create/validate/unpark still runs (the lease or
    -- checkout is registered after them): reported when it is
    local early = self._early_leaks
    if not early then early = {}; self._early_leaks = early end
    early[a] = { b, tt }     -- generation, and since when it is held
  end
end

M.report_early = report_early

return M
