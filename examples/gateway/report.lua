-- examples/gateway/report.lua: make demo's table and picture. Reads what
-- examples/gateway/run.sh left in the run dir for each configuration
-- (<cfg>.wrk: wrk --latency's output; <cfg>.sample: the sampler's summary
-- line; <cfg>.series: "<ms> <connections>" every ~10 ms), prints a
-- Markdown table and writes an SVG of the upstream connections over time.
-- Plain Lua (5.1-5.4), no dependency.
--
-- usage: lua report.lua RUN_DIR SVG_PATH WORKERS PER_WORKER BACKLOG SECS CONNECTIONS [FLEET]
local run, svg_path = arg[1], arg[2]
local workers, per_worker, backlog = tonumber(arg[3]), tonumber(arg[4]), tonumber(arg[5])
local secs, conns = tonumber(arg[6]), tonumber(arg[7])
local fleet = tonumber(arg[8]) or 0        -- the fleet's max_live, all workers together
assert(run and svg_path and workers and per_worker and backlog and secs and conns,
       "usage: report.lua RUN_DIR SVG_PATH WORKERS PER_WORKER BACKLOG SECS CONNECTIONS")
local cap = workers * per_worker

local CONFIGS = {
  { id = "cp", name = "clientpool: cpngx.driver, max_live " .. per_worker .. " per worker", color = "#1b9e77",
    cap = cap },
  { id = "fleet", name = "clientpool on a fleet, max_live " .. fleet .. " for all workers", color = "#e7298a",
    cap = fleet },
  { id = "size", name = "lua-resty-redis keepalive, pool_size " .. per_worker, color = "#d95f02" },
  { id = "backlog", name = "lua-resty-redis pool_size " .. per_worker .. " + backlog " .. backlog,
    color = "#7570b3" },
}

local function slurp(path)
  local f = io.open(path)
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

-- "2.51ms" -> seconds
local function duration(s)
  local n, unit = s:match("^([%d%.]+)(%a+)$")
  n = tonumber(n)
  if not n then return nil end
  local scale = { us = 1e-6, ms = 1e-3, s = 1, m = 60 }
  return n * (scale[unit] or 0)
end

local function parse_wrk(text)
  local r = {}
  r.requests = tonumber(text:match("(%d+) requests in"))
  r.rps = tonumber(text:match("Requests/sec:%s*([%d%.]+)"))
  r.p50 = duration(text:match("\n%s*50%%%s+(%S+)") or "")
  r.p99 = duration(text:match("\n%s*99%%%s+(%S+)") or "")
  local errs = tonumber(text:match("Non%-2xx or 3xx responses:%s*(%d+)")) or 0
  local sock = text:match("Socket errors:([^\n]*)")
  if sock then
    for n in sock:gmatch("(%d+)") do errs = errs + tonumber(n) end
  end
  r.errors = errs
  return r
end

local function ms(s)
  if not s then return "?" end
  if s < 0.001 then return string.format("%.0f µs", s * 1e6) end
  return string.format("%.1f ms", s * 1e3)
end

local rows = {}
for _, c in ipairs(CONFIGS) do
  local wrk = slurp(run .. "/" .. c.id .. ".wrk")
  local sample = slurp(run .. "/" .. c.id .. ".sample") or ""
  if wrk then
    local r = parse_wrk(wrk)
    r.cfg = c
    r.max = tonumber(sample:match("max=(%d+)"))
    r.opened = tonumber(sample:match("opened=(%d+)"))
    r.series = {}
    for line in (slurp(run .. "/" .. c.id .. ".series") or ""):gmatch("[^\n]+") do
      local t, n = line:match("^(%d+) (%d+)$")
      if t then r.series[#r.series + 1] = { tonumber(t) / 1000, tonumber(n) } end
    end
    rows[#rows + 1] = r
  end
end
if #rows == 0 then
  io.stderr:write("report.lua: no results in ", run, "\n")
  os.exit(1)
end

---------------------------------------------------------------------------
-- the table
---------------------------------------------------------------------------

local header = { "gateway", "most upstream connections", "new connections / request",
                 "p50", "p99", "errors", "req/s" }
local out = {}
for _, r in ipairs(rows) do
  local newc = (r.opened and r.requests and r.requests > 0)
    and string.format("%.2f%% (%d / %d)", 100 * r.opened / r.requests, r.opened, r.requests) or "?"
  out[#out + 1] = {
    r.cfg.name,
    r.max and (tostring(r.max) .. ((not r.cfg.cap or r.max <= r.cfg.cap) and "" or (" (> " .. r.cfg.cap .. ")")))
      or "?",
    newc, ms(r.p50), ms(r.p99), tostring(r.errors or "?"),
    r.rps and string.format("%.0f", r.rps) or "?",
  }
end
local widths = {}
for i, h in ipairs(header) do
  widths[i] = #h
  for _, o in ipairs(out) do
    local len = #o[i]:gsub("[\128-\191]", "")    -- UTF-8 continuation bytes take no column
    if len > widths[i] then widths[i] = len end
  end
end
local function line(cells, right)
  local t = {}
  for i, v in ipairs(cells) do
    local pad = string.rep(" ", widths[i] - #v:gsub("[\128-\191]", ""))
    t[i] = (i > 1 and right) and (pad .. v) or (v .. pad)
  end
  return "| " .. table.concat(t, " | ") .. " |"
end
print(string.format("%d nginx workers, per-worker budget %d (at most %d connections to redis with clientpool), " ..
                    "fleet budget %d in total; wrk %d connections, %d s per row; one GET per request",
                    workers, per_worker, cap, fleet, conns, secs))
print()
print(line(header))
local sep = {}
for i = 1, #header do
  sep[i] = i == 1 and string.rep("-", widths[i] + 2) or (string.rep("-", widths[i] + 1) .. ":")
end
print("|" .. table.concat(sep, "|") .. "|")
for _, o in ipairs(out) do print(line(o, true)) end

---------------------------------------------------------------------------
-- the picture: upstream connections over time, one line per configuration
---------------------------------------------------------------------------

local W, H = 900, 440
local L, R, T, B = 70, 30, 50, 130          -- margins (legend below the plot)
local pw, ph = W - L - R, H - T - B
local ymax = cap
for _, r in ipairs(rows) do
  for _, p in ipairs(r.series) do if p[2] > ymax then ymax = p[2] end end
end
-- a round top for the axis
local step = 10
while ymax / step > 8 do step = step * 2 end
ymax = math.ceil(ymax * 1.05 / step) * step
local xmax = secs
for _, r in ipairs(rows) do
  local last = r.series[#r.series]
  if last and last[1] > xmax then xmax = last[1] end
end
local function X(t) return L + pw * t / xmax end
local function Y(n) return T + ph * (1 - n / ymax) end

local svg = {}
local function add(...) svg[#svg + 1] = table.concat({ ... }) end
add('<svg xmlns="http://www.w3.org/2000/svg" width="', W, '" height="', H, '" viewBox="0 0 ', W, ' ', H,
    '" font-family="sans-serif" font-size="13">')
add('<rect width="100%" height="100%" fill="white"/>')
add('<text x="', L, '" y="28" font-size="16" font-weight="bold">Connections redis sees, ', workers,
    ' nginx workers, wrk -c', conns, '</text>')
-- grid and axes
for v = 0, ymax, step do
  add(string.format('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#e5e5e5"/>', L, Y(v), L + pw, Y(v)))
  add(string.format('<text x="%d" y="%.1f" text-anchor="end">%d</text>', L - 8, Y(v) + 4, v))
end
for t = 0, math.floor(xmax) do
  add(string.format('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#f0f0f0"/>', X(t), T, X(t), T + ph))
  add(string.format('<text x="%.1f" y="%d" text-anchor="middle">%d s</text>', X(t), T + ph + 18, t))
end
add(string.format('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>', L, T + ph, L + pw, T + ph))
add(string.format('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>', L, T, L, T + ph))
add(string.format('<text transform="translate(18,%d) rotate(-90)" text-anchor="middle">upstream connections</text>',
    T + ph / 2))
-- the cap
add(string.format('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#555555" stroke-dasharray="6,4"/>',
    L, Y(cap), L + pw, Y(cap)))
add(string.format('<text x="%d" y="%.1f" text-anchor="end" fill="#555555">cap %d = %d workers x %d</text>',
    L + pw - 4, Y(cap) - 6, cap, workers, per_worker))
if fleet > 0 then
  add(string.format('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#e7298a" stroke-dasharray="6,4"/>',
      L, Y(fleet), L + pw, Y(fleet)))
  add(string.format('<text x="%d" y="%.1f" text-anchor="end" fill="#e7298a">fleet cap %d, all workers</text>',
      L + pw - 4, Y(fleet) - 6, fleet))
end
-- the lines
for _, r in ipairs(rows) do
  local pts = {}
  for _, p in ipairs(r.series) do pts[#pts + 1] = string.format("%.1f,%.1f", X(p[1]), Y(p[2])) end
  if #pts > 0 then
    add('<polyline fill="none" stroke="', r.cfg.color, '" stroke-width="1.8" points="',
        table.concat(pts, " "), '"/>')
  end
end
-- legend
for i, r in ipairs(rows) do
  local y = T + ph + 40 + (i - 1) * 20
  add(string.format('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/>', L, y - 4, L + 24, y - 4,
      r.cfg.color))
  add(string.format('<text x="%d" y="%d">%s: most %s, %s new connections per request</text>', L + 32, y,
      r.cfg.name, tostring(r.max or "?"),
      (r.opened and r.requests and r.requests > 0) and string.format("%.2f%%", 100 * r.opened / r.requests) or "?"))
end
add('</svg>')

local f = assert(io.open(svg_path, "w"))
f:write(table.concat(svg, "\n"), "\n")
f:close()
