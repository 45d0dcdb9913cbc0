-- clientpool.ffibase (LuaJIT only): what the two FFI bindings share: the C
-- library loaded once with a header declared once, and the handle type
-- whose ended state raises on every method as the C bindings do.

local IS_JIT = rawget(_G, "jit") ~= nil

describe("clientpool.ffibase", function()
  if not IS_JIT then
    pending("not run: the FFI needs LuaJIT")
    return
  end
  local ffi = require "ffi"
  local ffibase = require "clientpool.ffibase"

  it("library(): one shared object for both bindings, each header declared once", function()
    local a = ffibase.library("spec", "clientpool_grant_t", "clientpool.cdef")
    local b = ffibase.library("spec", "clientpool_fleet_limits_t", "clientpool.fleet_cdef")
    assert.equal(a, b)
    -- a second call would raise "attempt to redefine" if it declared again
    assert.equal(a, ffibase.library("spec", "clientpool_grant_t", "clientpool.cdef"))
    assert.equal("cdata", type(a.clientpool_monotime))
    assert.is_true(pcall(ffi.typeof, "clientpool_fleet_limits_t"))
  end)

  -- busted unloads the modules a spec file loaded (package.loaded), and so
  -- may any host that reloads code; a handle made by the unloaded modules
  -- may outlive them. The library handle was a local of this module: once
  -- the collector took it, the shared object was unmapped (dlclose), and
  -- the fleet handle's finalizer, a function pointer into it, jumped into
  -- nothing (a segmentation fault; one CI run of the FFI suite died so).
  -- Run in a child interpreter: the failure kills the process.
  it("library(): the shared object stays loaded when the modules are unloaded and collected", function()
    local script = os.tmpname()
    local f = assert(io.open(script, "w"))
    f:write([=[
      local function unload()
        for k in pairs(package.loaded) do
          if k:match("^clientpool") then package.loaded[k] = nil end
        end
      end
      local keep = {}
      for i = 1, 3 do
        unload()
        local name = "ffibase-spec-" .. i .. "-" .. tostring(os.time())
        local F = require "clientpool.fleet_ffi"
        local h = assert(F.open(name, { max_live = 3 }))
        F.remove(name)
        keep[i] = h.p                         -- the handle's cdata: its finalizer only
        local E = require "clientpool.ffi"
        keep[#keep + 1] = E.monotime          -- a function of the module, calling into the library
        unload()
        h, F, E = nil, nil, nil -- luacheck: ignore
        collectgarbage(); collectgarbage()
      end
      for i = 4, #keep do assert(keep[i]() > 0) end
      keep = nil -- luacheck: ignore
      collectgarbage(); collectgarbage()
      io.write("ok\n")
    ]=])
    f:close()
    local p = assert(io.popen(("ulimit -c 0; LUA_PATH=%q LUA_CPATH=%q luajit %q 2>&1; echo \"exit $?\""):format(
      package.path, package.cpath, script)))
    local out = p:read("*a")
    p:close()
    os.remove(script)
    assert.truthy(out:find("^ok\nexit 0"), out)
  end)

  it("handle_type(): tostring and the ended handle's methods, as the C bindings'", function()
    local methods, live_mt, ended_mt = ffibase.handle_type("spec.Thing", "free", "freed", "spec.Thing")
    function methods.poke() return "poked" end
    local cell = ffi.new("int[1]")
    local h = setmetatable({ p = cell }, live_mt)
    assert.equal("poked", h.poke())
    assert.truthy(tostring(h):find("^spec%.Thing: 0x%x+$"), tostring(h))
    setmetatable(h, ended_mt)
    assert.equal("spec.Thing: (freed)", tostring(h))
    assert.has_no.errors(function() h:free(); h:free() end)
    local ok, err = pcall(function() return h:poke() end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("bad argument #1 to 'poke' (spec.Thing is freed)", 1, true), tostring(err))
  end)

  it("the bindings' ended handles say what the C bindings say", function()
    local e = require("clientpool.ffi").new { max_live = 1 }
    e:free()
    local _, err = pcall(e.acquire, e, 0)
    assert.truthy(tostring(err):find("(clientpool.Engine is freed)", 1, true), tostring(err))
    assert.equal("clientpool.Engine: (freed)", tostring(e))
  end)
end)
