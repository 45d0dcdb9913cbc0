-- bench/run.lua: the benchmark suite for one interpreter (`make bench` runs
-- it under lua5.1, lua5.3, lua5.4, luajit -joff and luajit).
--
-- usage: LUA bench/run.lua [--out FILE] [B1 B2 ...]
--
-- Every figure is a ratio against a baseline measured in the same run, or a
-- byte count. --out appends the rows as TSV for bench/report.lua, which
-- prints one table with a column per interpreter.
package.path = "./bench/?.lua;" .. package.path

local U = require "util"

local out
local only = {}
local i = 1
while arg[i] do
  if arg[i] == "--out" then out = arg[i + 1]; i = i + 1 else only[arg[i]] = true end
  i = i + 1
end

local SUITES = {
  { "B1", "b1_pair" }, { "B2", "b2_handoff" }, { "B3", "b3_scale" }, { "B4", "b4_memory" },
}

local interp = U.interp()
io.stdout:write(string.format("== clientpool bench: %s, backend %s\n", interp, require("clientpool").backend))
local t0 = os.clock()
for _, s in ipairs(SUITES) do
  if next(only) == nil or only[s[1]] then
    local t = os.clock()
    require(s[2])(U)
    io.stdout:write(string.format("  (%s: %.1f s)\n", s[1], os.clock() - t))
  end
end
io.stdout:write(string.format("  (total %.1f s)\n", os.clock() - t0))
if out then U.save(out, interp) end
