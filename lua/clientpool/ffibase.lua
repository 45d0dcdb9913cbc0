--- clientpool.ffibase (internal): what the two LuaJIT FFI bindings share,
-- clientpool.ffi (the engine, csrc/clientpool.h) and clientpool.fleet_ffi
-- (the fleet, csrc/fleet.h): the C library and the header's declarations,
-- each made once per process, and the handle type, whose two metatables
-- stand for what the C bindings check on every call: a live handle (a table
-- whose field p is the C pointer) and one that was freed or closed, whose
-- every method raises as the C binding's do, but the one that ended it,
-- which does nothing.
local ffi = require "ffi"

local error, pcall, tostring, assert = error, pcall, tostring, assert

local _M = {}

-- clientpool.core's shared object, loaded once per process and anchored in
-- the registry: a module-level local went with this module when the
-- modules were unloaded (busted does between spec files; a host reloading
-- code may), the collector then closed the library (dlclose), and a handle
-- that outlived the modules called into unmapped code (the fleet handle's
-- finalizer is a function pointer into it).
local ANCHOR = "clientpool.ffibase: the C library"
local registry = debug and debug.getregistry and debug.getregistry() or {}
local lib = registry[ANCHOR]

--- library(who, probe, cdef): the C library, with the header whose C type
-- probe names declared (module cdef's text) if it is not yet; who names
-- the binding in the error that says the library is not on package.cpath.
function _M.library(who, probe, cdef)
  if lib == nil then
    lib = ffi.load(assert(package.searchpath("clientpool.core", package.cpath),
                          who .. ": clientpool.core (the C module) not found on package.cpath"))
    registry[ANCHOR] = lib
  end
  -- a second cdef of the same struct would raise "attempt to redefine"
  if not pcall(ffi.typeof, probe) then ffi.cdef(require(cdef)) end
  return lib
end

--- handle_type(name, ender, ended, what) -> methods, live_mt, ended_mt:
-- tostring gives "<name>: 0x..." while live, "<name>: (<ended>)" after; an
-- ended handle's methods raise "bad argument #1 to '<method>' (<what> is
-- <ended>)", its method ender does nothing (ending twice is harmless).
function _M.handle_type(name, ender, ended, what)
  local methods = {}
  local live_mt = { __index = methods }
  live_mt.__tostring = function(self)
    return name .. ": " .. tostring(ffi.cast("void *", self.p)):match("0x%x+")
  end
  local ended_mt = {
    __index = function(_, method)
      if method == ender then return function() end end
      return function()
        error("bad argument #1 to '" .. tostring(method) .. "' (" .. what .. " is " .. ended .. ")", 2)
      end
    end,
    __tostring = function() return name .. ": (" .. ended .. ")" end,
  }
  return methods, live_mt, ended_mt
end

return _M
