-- LuaJIT only: the hot path on the FFI backend compiles, in every form:
-- checkout/checkin (zero-allocation), acquire/release and
-- try_acquire/release (a lease object with a reused leak sentinel). spec/jit_check.lua runs the loop in a fresh
-- LuaJIT with jit.v on; the loop must close a looping trace and nothing may
-- abort, hit NYI or stitch around a C function. Not a timing test.

local IS_JIT = rawget(_G, "jit") ~= nil
local jit_it = IS_JIT and it or pending

local SCRIPT = "spec/jit_check.lua"

-- The line of SCRIPT holding the loop of form.
local function loop_line(form)
  local n = 0
  for line in io.lines(SCRIPT) do
    n = n + 1
    if line:find("-- LOOP " .. form, 1, true) then return n end
  end
  error("no loop for " .. form .. " in " .. SCRIPT)
end

-- jit.v's report of form's loop, from a fresh interpreter on our paths.
local function report(form)
  local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end
  local cmd = "env LUA_PATH=" .. q(package.path) .. " LUA_CPATH=" .. q(package.cpath) ..
              " luajit " .. SCRIPT .. " " .. form .. " 2>&1"
  local f = assert(io.popen(cmd))
  local lines = {}
  for line in f:lines() do lines[#lines + 1] = line end
  f:close()
  return lines
end

local function assert_compiled(form)
  local lines = report(form)
  local text = table.concat(lines, "\n")
  local at = "jit_check.lua:" .. loop_line(form == "burst" and "checkout" or form) .. " loop"
  local looped = false
  for _, line in ipairs(lines) do
    assert(line:find("^%[TRACE"), "jit_check.lua failed:\n" .. text)
    assert(not line:find("blacklisted", 1, true), "blacklisted on the hot path:\n" .. text)
    -- after a burst, side traces of traces the burst left may abort while
    -- the loop warms up (they fall back to the interpreter, the loop's own
    -- trace does not): only root traces count there
    local side = form == "burst" and line:find("^%[TRACE %-%-%- %(%d+/%d+%)")
    assert(side or not line:find("TRACE %-%-%-"), "trace abort on the hot path:\n" .. text)
    assert(not line:find("NYI", 1, true), "NYI on the hot path:\n" .. text)
    -- (a trace of jit.v's own v.lua, as the report is switched off, is not
    -- the hot path: it stitches jit.attach now and then)
    assert(not line:find("stitch", 1, true) or line:find(" v.lua:", 1, true),
           "a C function was stitched on the hot path:\n" .. text)
    if line:find(at, 1, true) then looped = true end
  end
  -- after a burst the loop may run on traces the burst left (linked side
  -- traces) instead of a loop of its own; what must not happen there is a
  -- blacklisted checkout, checked above
  assert(looped or form == "burst", "no looping trace at " .. at .. ":\n" .. text)
end

describe("the hot path under the JIT (FFI backend)", function()
  jit_it("checkout/checkin compiles: a looping trace, no abort, no NYI", function()
    assert_compiled("checkout")
  end)

  jit_it("acquire/release compiles too", function()
    assert_compiled("lease")
  end)

  jit_it("try_acquire/release compiles too", function()
    assert_compiled("try")
  end)

  jit_it("checkout/checkin still compiles after a burst of creates and a spell of contention", function()
    assert_compiled("burst")
  end)
end)
