-- bench/run.lua: the benchmark suite for one interpreter (`make bench` runs
-- it under lua5.1, lua5.3, lua5.4, luajit -joff and luajit).
--
-- usage: LUA bench/run.lua [--out FILE] [B1 B2 ...]
--
-- Every figure is a ratio against a baseline measured in the same run, or a
-- byte count. Without suite names every suite runs, each in a fresh
-- interpreter (same command line): under LuaJIT the traces one suite leaves
-- would otherwise shape the next one's figures. --out appends the rows as
-- TSV for bench/report.lua, which prints one table with a column per
-- interpreter.
package.path = "./bench/?.lua;" .. package.path

local U = require "util"

local out
local only = {}
local i = 1
while arg[i] do
  if arg[i] == "--out" then out = arg[i + 1]; i = i + 1 else only[#only + 1] = arg[i] end
  i = i + 1
end

local SUITES = { B1 = "b1_pair", B2 = "b2_handoff", B3 = "b3_scale", B4 = "b4_memory", B7 = "b7_fleet",
                 B8 = "b8_redis_fleet" }
local ORDER = { "B1", "B2", "B3", "B4", "B7", "B8" }

local interp = U.interp()

if #only == 0 then
  -- the interpreter's own command line: arg[-n] .. arg[-1]
  local cmd, n = {}, -1
  while arg[n - 1] do n = n - 1 end
  for j = n, -1 do cmd[#cmd + 1] = arg[j] end
  io.stdout:write(string.format("== clientpool bench: %s, backend %s\n", interp, require("clientpool").backend))
  io.stdout:flush()
  if out then os.remove(out) end
  local t0 = os.time()
  for _, name in ipairs(ORDER) do
    local line = table.concat(cmd, " ") .. " bench/run.lua " .. (out and ("--out " .. out .. " ") or "") .. name
    local ok = os.execute(line)
    if ok ~= true and ok ~= 0 then error("bench: " .. line .. " failed") end
  end
  io.stdout:write(string.format("  (%s: about %d s)\n", interp, os.time() - t0))
  return
end

for _, name in ipairs(only) do
  local mod = SUITES[name]
  if not mod then error("bench: no suite " .. name .. " (B1, B2, B3, B4, B7, B8)") end
  local t = os.clock()
  require(mod)(U)
  io.stdout:write(string.format("  (%s: %.1f s)\n", name, os.clock() - t))
end
if out then U.save(out, interp) end
