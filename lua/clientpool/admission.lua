--- clientpool.admission (internal): pausing and resuming admission.
--
-- Owns pause/resume (of the pool or of one key, with the generations that
-- let a resume_after timer act only on its own pause), retire (every
-- client created before now), the half-open probe (probe_passed: a probe
-- lease's outcome that continues opens the gate) and the policy's
-- directives (Pool:_apply, which lease:observe calls: retire, pause,
-- continue).

local base = require "clientpool.base"
local slot_of, lease_key = base.slot_of, base.lease_key
local events = require "clientpool.events"
local keys = require "clientpool.keys"
base.own_source()

local type, error, tostring, getmetatable = type, error, tostring, getmetatable
local math_huge = math.huge
local emit, now_of, not_a_pool = base.emit, base.now_of, base.not_a_pool
local pump = events.pump
local scope_key, known_key = keys.scope_key, keys.known_key
local Pool = base.Pool

local M = {}

-- Pauses the pool (name nil) or a key; resume_after schedules the resume.
function Pool:_pause(reason, key, resume_after, fname)
  local e = self._e
  local k, name = scope_key(self, key, fname, 2)
  if not k then
    if self._closed then return end
    error("clientpool: " .. fname .. "(): cannot open key '" .. key .. "' (max_keys keys exist)", 3)
  end
  if name then
    -- a paused key must not be forgotten; a warm key is pinned already (and
    -- pinning it again would take it off the warm floor)
    if not self._warm[name] then e:key_pin(k, true) end
    self._kpaused[name] = reason
  else
    self._paused = reason
  end
  -- the pause's generation, unique in the pool: its resume_after timer acts
  -- only if this pause is still the scope's own (not resumed, not paused
  -- again; a key forgotten and opened again gets new ones)
  local scope = name or false
  local gen = self._pgen_next + 1
  self._pgen_next = gen
  self._pgen[scope] = gen
  local _, pending = e:pause(k, now_of(self))
  if pending > 0 then pump(self) end
  emit(self, "pause", key, reason)
  if resume_after then
    local sched = self._sched
    base.background(self, function()
      sched.sleep(resume_after)
      if self._pgen[scope] == gen and not self._closed then self:resume(key) end
    end)
  end
end

--- Pauses admission of the pool, or of one key: new acquisitions queue (or
-- fail with "paused" under pause_mode = "fail") until resume().
function Pool:pause(reason, key)
  if getmetatable(self) ~= Pool then not_a_pool(self, "pause") end
  if type(reason) ~= "string" then
    error("clientpool: bad argument #1 to 'pause' (reason must be a string, got " .. type(reason) .. ")", 2)
  end
  base.check_key_arg(key, 2, "pause")
  self:_pause(reason, key, nil, "pause")
end

--- Resumes the pool or a key (half-open first when the pool has probe = true).
function Pool:resume(key)
  if getmetatable(self) ~= Pool then not_a_pool(self, "resume") end
  local e = self._e
  local k, name = known_key(self, key, "resume", 1)
  if not k then                  -- never paused: a paused key is pinned, so known
    if name then self._kpaused[name] = nil; self._pgen[name] = nil end   -- (stale entries, if any)
    return
  end
  local scope = name or false
  local was
  if name then
    was = self._kpaused[name]
    self._kpaused[name] = nil
    local _, pending = e:resume(k, self._c.probe, now_of(self))
    if pending > 0 then pump(self) end
    -- unpinned only after the resume (an empty key is forgotten at once),
    -- and not while half-open: the key's gate must outlive its probe, and
    -- probe_passed unpins it when the probe continues
    if not self._warm[name] and not self._c.probe then e:key_pin(k, false) end
  else
    was = self._paused
    self._paused = false
    local _, pending = e:resume(k, self._c.probe, now_of(self))
    if pending > 0 then pump(self) end
  end
  self._pgen[scope] = nil       -- no resume_after timer of an earlier pause acts now
  pump(self)
  if was then emit(self, "resume", key) end
end

--- Retires every client created before now, of the pool or of one key: idle
-- ones at once, leased ones at their release (failover, DNS changes).
function Pool:retire(key)
  if getmetatable(self) ~= Pool then not_a_pool(self, "retire") end
  local k = known_key(self, key, "retire", 1)
  if not k then return end       -- a key the pool does not know has no clients
  local _, pending = self._e:retire_before(k, -1, now_of(self))
  if pending > 0 then pump(self) end
end

-- The lease (slot l, generation g) of key name reports an outcome that
-- continues: if it was a probe, its gate opens, and a key pinned only for
-- its pause and probe is unpinned (forgotten once empty).
local function probe_passed(self, l, g, name)
  local e = self._e
  local was, pending = e:probe_ok(l, g, now_of(self))
  if pending > 0 then pump(self) end
  if was and not self._warm[name] and not self._kpaused[name] then
    local k = self._kids[name]
    if k then
      e:key_pin(k, false)
      pump(self)
    end
  end
end

M.probe_passed = probe_passed

-- Applies a policy directive for a lease.
local CONTINUE = { continue = true }
function Pool:_apply(d, lease)
  if d == nil then d = CONTINUE end
  if type(d) ~= "table" then
    error("clientpool: the policy returned a " .. type(d) .. " (a directive table or nil expected)", 3)
  end
  local e = self._e
  if d.retire ~= nil then
    if d.retire ~= "client" and d.retire ~= "key" then
      error("clientpool: policy directive 'retire' must be \"client\" or \"key\", got " .. tostring(d.retire), 3)
    end
    local _, _, rec = slot_of(self, lease)
    -- "key": this client and every client of its key created before it,
    -- by creation order (clients made at the same clock reading included)
    if d.retire == "key" then e:retire_upto(rec, now_of(self)) end
    e:retire(rec, now_of(self))
  end
  if d.pause ~= nil then
    if type(d.pause) ~= "string" then
      error("clientpool: policy directive 'pause' must be a reason string, got " .. type(d.pause), 3)
    end
    if d.scope ~= nil and d.scope ~= "key" and d.scope ~= "pool" and d.scope ~= "fleet" then
      error("clientpool: policy directive 'scope' must be \"key\", \"pool\" or \"fleet\", got " ..
            tostring(d.scope), 3)
    end
    if d.scope == "fleet" and not self._fleet then
      error("clientpool: policy directive scope \"fleet\" needs a pool on a fleet (option 'fleet')", 3)
    end
    local ra = d.resume_after
    if ra ~= nil and (type(ra) ~= "number" or ra ~= ra or ra < 0 or ra == math_huge) then
      error("clientpool: policy directive 'resume_after' must be a finite number >= 0, got " .. tostring(ra), 3)
    end
    -- scope "key" pauses the lease's key, the default key too (by its name,
    -- DEFAULT_KEY: resume(DEFAULT_KEY) lifts it); else the pool. (The
    -- default key's pause was the pool's: other keys were paused with it,
    -- issue 18.)
    local key = d.scope == "key" and lease_key(self, lease) or nil
    if d.scope == "fleet" then
      -- every member of the fleet (fleetlink: the fleet's gate, its deadline)
      self._fleet.pause_fleet(self, d.pause, ra)
    else
      self:_pause(d.pause, key, ra, "observe")
    end
  else
    -- an outcome that continues: a probe lease opens its gate
    local l, g, _, k = slot_of(self, lease)
    probe_passed(self, l, g, self._knames[k])
  end
  pump(self)
  return d
end

return M
