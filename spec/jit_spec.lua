-- LuaJIT only: the zero-allocation hot path (checkout with an idle client,
-- checkin) on the FFI backend compiles. jit.v reports every trace, abort
-- and NYI while the loop runs; the loop must close a trace and nothing may
-- abort. Not a timing test.

local IS_JIT = rawget(_G, "jit") ~= nil
local jit_it = IS_JIT and it or pending
-- Locals, not globals: busted gives spec files an environment whose global
-- lookups run Lua code (traces of their own) while jit.v listens.
local pcall, collectgarbage, debug = pcall, collectgarbage, debug

-- Runs fn with jit.v writing to a file; returns the lines written.
local function verbose(fn)
  local path = os.tmpname()
  local v = require "jit.v"
  v.on(path)
  local ok, err = pcall(fn)
  v.off()
  local lines = {}
  for line in io.lines(path) do lines[#lines + 1] = line end
  os.remove(path)
  assert(ok, err)
  return lines
end

-- The line of this file the loop below is on (for the trace report).
local function here()
  return debug.getinfo(2, "l").currentline
end

describe("the checkout/checkin loop under the JIT", function()
  jit_it("compiles on the FFI backend: a looping trace, no abort, no NYI", function()
    local clientpool = require "clientpool"
    local loop = require("clientpool.loop").new()   -- real clock: the production path
    local pool = clientpool.new { max_live = 4, create = function() return {} end,
                                  scheduler = loop, backend = "ffi" }
    local lines, loop_line
    loop.spawn(function()
      local _, h = pool:checkout("k")   -- the client exists: the loop takes the idle path
      pool:checkin(h)
      -- no finalizer of an earlier spec may run while the loop is recorded
      collectgarbage("collect")
      collectgarbage("collect")
      loop_line = here() + 3
      jit.flush()
      lines = verbose(function()
        for _ = 1, 200000 do local _, hh = pool:checkout("k"); pool:checkin(hh) end
      end)
    end)
    loop.run()
    local report = table.concat(lines, "\n")
    local looped = false
    for _, line in ipairs(lines) do
      assert(not line:find("TRACE %-%-%-"), "trace abort on the hot path:\n" .. report)
      assert(not line:find("NYI", 1, true), "NYI on the hot path:\n" .. report)
      assert(not line:find("stitch", 1, true), "a C function was stitched on the hot path:\n" .. report)
      if line:find("jit_spec.lua:" .. loop_line .. " loop", 1, true) then looped = true end
    end
    assert(looped, "no looping trace for the loop at line " .. loop_line .. ":\n" .. report)
    local s = pool:stats()
    assert(s.leases == 0 and s.opened == 1 and s.reused >= 200000)
  end)
end)
