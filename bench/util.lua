-- bench/util.lua: timing and reporting for bench/run.lua.
--
-- A measured function takes n and runs n operations in a loop of its own
-- (U.loop compiles each from source, so LuaJIT traces each separately).
-- ratio() times a subject and its baseline alternately, several samples
-- each, and divides the fastest samples: the machine may be shared, and
-- another process only ever makes a sample slower. Time is the process's
-- CPU time (os.clock), so time spent preempted does not count either.
local floor = math.floor
local concat = table.concat
local clock = os.clock

local U = {}

-- Seconds one sample should take; samples per measurement.
U.SAMPLE_S = tonumber(os.getenv("BENCH_SAMPLE_S")) or 0.003
U.SAMPLES = tonumber(os.getenv("BENCH_SAMPLES")) or 15

local function fastest(t)
  local m = t[1]
  for i = 2, #t do if t[i] < m then m = t[i] end end
  return m
end

-- Seconds fn(n) takes.
local function run(fn, n)
  local t0 = clock()
  fn(n)
  return clock() - t0
end

-- The n for which fn(n) takes about SAMPLE_S (fn warmed up on the way).
function U.calibrate(fn, start)
  local n = start or 100
  while true do
    local t = run(fn, n)
    if t >= U.SAMPLE_S / 4 or n >= 2 ^ 30 then
      local want = floor(n * U.SAMPLE_S / (t > 0 and t or 1e-9))
      if want < 1 then want = 1 end
      return want
    end
    n = n * 4
  end
end

--- A measured function from source: `function(n) for _ = 1, n do BODY end
-- end` over the upvalues NAMES (a comma-separated list) bound to the
-- values given. Each call compiles a new prototype, so under LuaJIT every
-- measurement gets traces of its own instead of inheriting ones recorded
-- for another pool or key.
function U.loop(names, body, ...)
  local src = "local " .. names .. " = ...\nreturn function(n)\n  for _ = 1, n do\n    " .. body ..
              "\n  end\nend\n"
  local chunk = assert((rawget(_G, "loadstring") or load)(src, "=bench " .. body))
  return chunk(...)
end

--- ns per operation of fn (the fastest of SAMPLES samples).
function U.ns(fn, start)
  local n = U.calibrate(fn, start)
  local t = {}
  for i = 1, U.SAMPLES do t[i] = run(fn, n) / n * 1e9 end
  return fastest(t)
end

--- subject / baseline ns per operation, each the fastest of samples taken
-- alternately. Returns ratio, subject ns, baseline ns. start: operations
-- of the first calibration run.
function U.ratio(subject, baseline, start)
  collectgarbage("collect")
  local ns_b, ns_s = U.calibrate(baseline, start), U.calibrate(subject, start)
  local tb, ts = {}, {}
  for i = 1, U.SAMPLES do
    tb[i] = run(baseline, ns_b) / ns_b * 1e9
    ts[i] = run(subject, ns_s) / ns_s * 1e9
  end
  local b, s = fastest(tb), fastest(ts)
  return s / b, s, b
end

--- KiB of Lua memory in use after a full collection.
function U.lua_kb()
  collectgarbage("collect")
  collectgarbage("collect")
  return collectgarbage("count")
end

-- glibc's mallinfo2 through the FFI (LuaJIT only; its own heap is not
-- malloc's, so the figure is the C side alone). Bytes malloc has handed
-- out, or nil where it cannot be read.
local mallinfo
do
  local ok, ffi = pcall(require, "ffi")
  if ok then
    local ok2 = pcall(ffi.cdef, [[
      struct clientpool_bench_mallinfo2 {
        size_t arena, ordblks, smblks, hblks, hblkhd, usmblks, fsmblks, uordblks, fordblks, keepcost;
      };
      struct clientpool_bench_mallinfo2 mallinfo2(void);
    ]])
    if ok2 and pcall(function() return ffi.C.mallinfo2 end) then
      mallinfo = function()
        local m = ffi.C.mallinfo2()
        return tonumber(m.uordblks) + tonumber(m.hblkhd)
      end
    end
  end
end

--- Bytes malloc has handed out (LuaJIT), or nil.
function U.c_bytes()
  if mallinfo then
    collectgarbage("collect")
    collectgarbage("collect")
    return mallinfo()
  end
  return nil
end

--- The interpreter's label in the tables: lua5.1, lua5.3, lua5.4, luajit
-- -joff or luajit.
function U.interp()
  local jit = rawget(_G, "jit")
  if jit then return jit.status() and "luajit" or "luajit -joff" end
  return "lua" .. _VERSION:match("%d+%.%d+")
end

---------------------------------------------------------------------------
-- Results: printed as a table, optionally appended to a TSV file.
---------------------------------------------------------------------------

local rows = {}

--- Records a row: id (B1.acquire ...), what it is, the value, its unit
-- ("x" for ratios, "B" for bytes), a note (the baseline's absolute figure).
function U.row(id, what, value, unit, note)
  rows[#rows + 1] = { id = id, what = what, value = value, unit = unit, note = note or "" }
  io.stdout:write(string.format("  %-14s %-58s %10s  %s\n", id, what, U.fmt(value, unit), note or ""))
  io.stdout:flush()
end

function U.fmt(value, unit)
  if value == nil then return "n/a" end
  if unit == "x" then return string.format("%.2fx", value) end
  if unit == "B" then return string.format("%.0f B", value) end
  if unit == "ns" then return string.format("%.1f ns", value) end
  return tostring(value) .. (unit or "")
end

--- Appends every row to a TSV file: interp, id, what, value, unit, note.
function U.save(path, interp)
  local f = assert(io.open(path, "a"))
  for _, r in ipairs(rows) do
    f:write(concat({ interp, r.id, r.what, r.value == nil and "" or string.format("%.6g", r.value),
                     r.unit or "", r.note }, "\t"), "\n")
  end
  f:close()
end

return U
