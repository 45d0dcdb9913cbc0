-- bench/report.lua: one Markdown table from the TSV files bench/run.lua
-- wrote (one per interpreter): a row per figure, a column per interpreter.
--
-- usage: lua bench/report.lua FILE.tsv...
--
-- After the table, every target of issue 17 is printed met or MISSED with
-- its figure, one line per target and interpreter column it applies to
-- ("PUC" targets: lua5.1, lua5.3, lua5.4; "JIT" targets: luajit with the
-- JIT on; "all": every column). Targets in nginx (B2 there, B5) are printed
-- by bench/nginx/run.sh.
local ORDER = { "lua5.1", "lua5.3", "lua5.4", "luajit -joff", "luajit" }

local interps, seen = {}, {}
local rows, row_of = {}, {}
for _, path in ipairs(arg) do
  for line in io.lines(path) do
    local interp, id, what, value, unit, note = line:match("^([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)\t(.*)$")
    if interp then
      if not seen[interp] then seen[interp] = true; interps[#interps + 1] = interp end
      local r = row_of[id]
      if not r then
        r = { id = id, what = what, unit = unit, values = {}, notes = {} }
        row_of[id] = r
        rows[#rows + 1] = r
      end
      r.values[interp] = tonumber(value)
      r.notes[interp] = note
    end
  end
end
local rank = {}
for i, name in ipairs(ORDER) do rank[name] = i end
table.sort(interps, function(a, b) return (rank[a] or 99) < (rank[b] or 99) end)

local function fmt(v, unit)
  if v == nil then return "n/a" end
  if unit == "x" then return string.format("%.2fx", v) end
  if unit == "B" then return string.format("%.0f B", v) end
  if unit == "ns" then return string.format("%.1f ns", v) end
  return string.format("%.3g%s", v, unit)
end

local head = { "figure", "" }
for _, i in ipairs(interps) do head[#head + 1] = i end
print("| " .. table.concat(head, " | ") .. " |")
local sep = {}
for i = 1, #head do sep[i] = i <= 2 and "---" or "---:" end
print("|" .. table.concat(sep, "|") .. "|")
for _, r in ipairs(rows) do
  local cells = { r.id, r.what }
  for _, i in ipairs(interps) do cells[#cells + 1] = fmt(r.values[i], r.unit) end
  print("| " .. table.concat(cells, " | ") .. " |")
end

-- The targets (issue 17): figure id, limit, which columns, unit.
local PUC = { ["lua5.1"] = true, ["lua5.3"] = true, ["lua5.4"] = true }
local JIT = { luajit = true }
local TARGETS = {
  { "B1.checkout", 1.5, PUC }, { "B1.checkout", 3, JIT },
  { "B1.lease", 3, PUC }, { "B1.lease", 6, JIT },
  { "B1.try", 3, PUC }, { "B1.try", 6, JIT },
  { "B2.lease", 5 }, { "B2.checkout", 5 },
  { "B3.idle.flat", 1.2 }, { "B3.keys.flat", 1.2 }, { "B3.keyscyc.flat", 1.2 }, { "B3.wait.flat", 1.2 },
  { "B4.c_idle", 64 }, { "B4.alloc_checkout", 0 }, { "B4.alloc_lease", 128 }, { "B4.alloc_try", 128 },
}
print()
print("targets (issue 17):")
local met, missed = 0, 0
for _, t in ipairs(TARGETS) do
  local r = row_of[t[1]]
  if r then
    for _, i in ipairs(interps) do
      local v = r.values[i]
      if v ~= nil and (t[3] == nil or t[3][i]) then
        local ok = v <= t[2] + 1e-9
        if ok then met = met + 1 else missed = missed + 1 end
        local times = r.unit == "x" and string.format("(%.2f times the limit)", v / t[2]) or ""
        print(string.format("  %-7s %-18s %-13s %9s <= %-6s %s", ok and "met" or "MISSED", t[1], i,
                            fmt(v, r.unit), fmt(t[2], r.unit), times))
      end
    end
  end
end
print(string.format("targets: %d met, %d missed", met, missed))
