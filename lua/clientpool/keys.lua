--- clientpool.keys (internal): key names and the engine's key ids.
--
-- Owns the two maps of a pool between the names users give (strings; the
-- default key is base.DEFAULT) and the engine's integer ids (_kids: name ->
-- id, _knames: id -> name): looking a name up (key_id, which opens the key
-- in the engine the first time), the STALE answer (stale_key), the checks
-- of a pause/resume/retire scope, and EV_KEY_FREE, the engine forgetting
-- an empty key.

local base = require "clientpool.base"
local events = require "clientpool.events"
base.own_source()

local type, error = type, error
local DEFAULT = base.DEFAULT
local pump = events.pump

local M = {}

events.on[base.core.EV_KEY_FREE] = function(self, _, a)
  local name = self._knames[a]
  if self._fleet then self._fleet.on_key_free(self, a) end
  if name ~= nil then
    self._knames[a] = nil
    self._kids[name] = nil
    self._create_err[name] = nil
    self._ktimeouts[name] = nil
  end
end

local function key_id(self, key, fname)
  local name = key
  if name == nil then
    name = DEFAULT
  elseif type(name) ~= "string" then
    error("clientpool: bad argument #1 to '" .. fname .. "' (key must be a string or nil, got " .. type(key) .. ")", 3)
  end
  -- a finalizer (a collected lease) may have forgotten keys meanwhile: their
  -- EV_KEY_FREE events take the names off _kids before a name is looked up
  if self._kicked then
    self._kicked = false
    pump(self)
  end
  local k = self._kids[name]
  if k then return k, name end
  local err
  k, err = self._e:key_open()
  if not k then return nil, name, err end
  self._kids[name] = k
  self._knames[k] = name
  if self._fleet then self._fleet.on_key(self, k, name) end
  return k, name
end

-- The engine answered STALE for key id k of name: a finalizer forgot the
-- key after name was looked up. Its EV_KEY_FREE drops the name (pump); the
-- caller then looks the name up again.
local function stale_key(self, k, name)
  pump(self)
  if self._kids[name] == k then
    self._kids[name] = nil
    self._knames[k] = nil
  end
end

-- The engine key of a scope (-1: the pool), raising at the caller of the
-- method that called it; nil when the key cannot be opened (closed pool,
-- max_keys keys exist): such a key has nothing to pause, resume or retire.
-- A scope key (not nil): raises for one that is not a string, at the caller
-- of the method that called scope_key or known_key; then carries out the
-- queued events: called from a listener (a destroy listener that pauses its
-- key), the key may have been forgotten by an event not yet carried out,
-- and a pause of its old id would be lost.
local function scope_name(self, key, fname, argn)
  if type(key) ~= "string" then
    error("clientpool: bad argument #" .. argn .. " to '" .. fname .. "' (key must be a string or nil, got "
          .. type(key) .. ")", 4)
  end
  if self._e:pending() > 0 then pump(self) end
end

local function scope_key(self, key, fname, argn)
  if key == nil then return -1, nil end
  scope_name(self, key, fname, argn)
  return key_id(self, key, fname)
end

-- As scope_key, for calls that have nothing to do for a key the pool does
-- not know (resume, retire): its id, or nil (never opens one: a key opened
-- here would be held for good, against max_keys).
local function known_key(self, key, fname, argn)
  if key == nil then return -1, nil end
  scope_name(self, key, fname, argn)
  return self._kids[key], key
end


M.key_id, M.stale_key, M.scope_key, M.known_key = key_id, stale_key, scope_key, known_key

return M
