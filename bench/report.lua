-- bench/report.lua: one Markdown table from the TSV files bench/run.lua
-- wrote (one per interpreter): a row per figure, a column per interpreter.
--
-- usage: lua bench/report.lua FILE.tsv...
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
