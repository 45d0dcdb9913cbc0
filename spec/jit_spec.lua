-- LuaJIT only: the hot path on the FFI backend compiles, in both forms:
-- checkout/checkin (zero-allocation) and acquire/release (a lease object).
-- jit.v reports every trace, abort and NYI while the loop runs; the loop
-- must close a trace and nothing may abort. Not a timing test.

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

-- Checks jit.v's report: no abort, NYI or stitch; a looping trace for the
-- loop at line loop_line.
local function assert_compiled(lines, loop_line)
  local report = table.concat(lines, "\n")
  local looped = false
  for _, line in ipairs(lines) do
    assert(not line:find("TRACE %-%-%-"), "trace abort on the hot path:\n" .. report)
    assert(not line:find("NYI", 1, true), "NYI on the hot path:\n" .. report)
    assert(not line:find("stitch", 1, true), "a C function was stitched on the hot path:\n" .. report)
    if line:find("jit_spec.lua:" .. loop_line .. " loop", 1, true) then looped = true end
  end
  assert(looped, "no looping trace for the loop at line " .. loop_line .. ":\n" .. report)
end

-- A pool on the FFI backend and a real-clock loop (the production path),
-- its client created, and fn(pool) run as a task after full collections (no
-- finalizer of an earlier spec may run while the loop is recorded).
local function on_pool(fn)
  local clientpool = require "clientpool"
  local loop = require("clientpool.loop").new()
  local pool = clientpool.new { max_live = 4, create = function() return {} end,
                                scheduler = loop, backend = "ffi" }
  local result
  loop.spawn(function()
    local _, h = pool:checkout("k")   -- the client exists: loops take the idle path
    pool:checkin(h)
    collectgarbage("collect")
    collectgarbage("collect")
    jit.flush()
    result = fn(pool)
  end)
  loop.run()
  return pool, result
end

describe("the hot path under the JIT (FFI backend)", function()
  jit_it("checkout/checkin compiles: a looping trace, no abort, no NYI", function()
    local loop_line = here() + 3
    local pool, lines = on_pool(function(pool)
      return verbose(function()
        for _ = 1, 200000 do local _, hh = pool:checkout("k"); pool:checkin(hh) end
      end)
    end)
    assert_compiled(lines, loop_line)
    local s = pool:stats()
    assert(s.leases == 0 and s.opened == 1 and s.reused >= 200000)
  end)

  jit_it("acquire/release (a lease object, a reused leak sentinel) compiles too", function()
    local loop_line = here() + 3
    local pool, lines = on_pool(function(pool)
      return verbose(function()
        for _ = 1, 200000 do local lease = pool:acquire("k"); lease:release() end
      end)
    end)
    assert_compiled(lines, loop_line)
    local s = pool:stats()
    assert(s.leases == 0 and s.opened == 1 and s.reused >= 200000 and s.leaked == 0)
  end)
end)
