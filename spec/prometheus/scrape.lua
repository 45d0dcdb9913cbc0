-- spec/prometheus/scrape.lua: a real Prometheus server (Debian's
-- prometheus) scrapes clientpool.metrics from a small HTTP server in this
-- process (cqueues, 127.0.0.1, a free port), and the values read back
-- through Prometheus's HTTP API must match pool:stats(). Prometheus runs
-- with a temporary config (scrape_interval 1s), its own data dir under
-- build/, on a free loopback port, and is stopped by its pid whatever
-- happens. `make test-prometheus` (part of `make test`); ends with
-- "N passed, M failed".
local cqueues = require "cqueues"
local socket = require "cqueues.socket"
local clientpool = require "clientpool"
local metrics = require "clientpool.metrics"
local P = require "spec.prom_text"

local passed, failed = 0, 0
local function check(name, ok, detail)
  if ok then
    passed = passed + 1
    print("ok - " .. name)
  else
    failed = failed + 1
    print("not ok - " .. name .. (detail and ("\n    " .. tostring(detail):gsub("\n", "\n    ")) or ""))
  end
end

local function sh(cmd)
  local ok = os.execute(cmd)
  return ok == true or ok == 0
end

local free_port = require("spec.http_nginx").free_port

-- A minimal JSON reader (Prometheus API answers).
local function json_decode(s)
  local pos = 1
  local function ws() pos = s:find("[^ \t\r\n]", pos) or #s + 1 end
  local value
  local function str()
    local out = {}
    pos = pos + 1
    while true do
      local c = s:sub(pos, pos)
      if c == '"' then pos = pos + 1; return table.concat(out) end
      if c == "\\" then
        local e = s:sub(pos + 1, pos + 1)
        local map = { n = "\n", t = "\t", r = "\r", b = "\b", f = "\f" }
        if e == "u" then
          local code = tonumber(s:sub(pos + 2, pos + 5), 16)
          if code < 0x80 then out[#out + 1] = string.char(code)
          elseif code < 0x800 then
            out[#out + 1] = string.char(0xC0 + math.floor(code / 64), 0x80 + code % 64)
          else
            out[#out + 1] = string.char(0xE0 + math.floor(code / 4096), 0x80 + math.floor(code / 64) % 64,
                                        0x80 + code % 64)
          end
          pos = pos + 6
        else
          out[#out + 1] = map[e] or e
          pos = pos + 2
        end
      elseif c == "" then
        error("unterminated string")
      else
        out[#out + 1] = c
        pos = pos + 1
      end
    end
  end
  value = function()
    ws()
    local c = s:sub(pos, pos)
    if c == "{" then
      local t = {}
      pos = pos + 1
      ws()
      if s:sub(pos, pos) == "}" then pos = pos + 1; return t end
      while true do
        ws()
        local k = str()
        ws(); pos = pos + 1          -- :
        t[k] = value()
        ws()
        local sep = s:sub(pos, pos); pos = pos + 1
        if sep == "}" then return t end
      end
    elseif c == "[" then
      local t = {}
      pos = pos + 1
      ws()
      if s:sub(pos, pos) == "]" then pos = pos + 1; return t end
      while true do
        t[#t + 1] = value()
        ws()
        local sep = s:sub(pos, pos); pos = pos + 1
        if sep == "]" then return t end
      end
    elseif c == '"' then
      return str()
    elseif s:sub(pos, pos + 3) == "true" then pos = pos + 4; return true
    elseif s:sub(pos, pos + 4) == "false" then pos = pos + 5; return false
    elseif s:sub(pos, pos + 3) == "null" then pos = pos + 4; return nil
    else
      local n = s:match("^-?[%d.eE+-]+", pos)
      pos = pos + #n
      return tonumber(n)
    end
  end
  return value()
end

local function urlencode(q)
  return (q:gsub("[^%w%-_.~]", function(c) return string.format("%%%02X", c:byte()) end))
end

-- GET http://127.0.0.1:port/path on a cqueues socket: status, body.
local function http_get(port, path)
  local con = socket.connect { host = "127.0.0.1", port = port }
  -- (cqueues raises "Connection refused" while prometheus is still
  -- starting: that is a failed try of the caller's loop, not the end)
  local called, ok = pcall(con.connect, con, 5)
  if not (called and ok) then
    pcall(con.close, con)
    return nil, "connect failed"
  end
  con:setmode("b", "b")
  con:write("GET " .. path .. " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
  con:flush()
  local data = con:read("*a")
  con:close()
  if not data then return nil, "no answer" end
  local status = tonumber(data:match("^HTTP/%d%.%d (%d+)"))
  return status, data:match("\r\n\r\n(.*)$")
end

local root = os.getenv("PWD") or "."
local dir = root .. "/build/prometheus-spec"
sh("rm -rf '" .. dir .. "' && mkdir -p '" .. dir .. "/data'")
local prom_pid

local function stop_prometheus()
  if not prom_pid then return end
  sh("kill -TERM " .. prom_pid .. " 2>/dev/null")
  for _ = 1, 100 do
    if not sh("kill -0 " .. prom_pid .. " 2>/dev/null") then prom_pid = nil; return end
    sh("sleep 0.1")
  end
  sh("kill -KILL " .. prom_pid .. " 2>/dev/null")
  prom_pid = nil
end

local ok_run, err_run = xpcall(function()
  if not sh("command -v prometheus >/dev/null 2>&1") then
    check("prometheus is installed (Debian: prometheus; scripts/deps.sh)", false)
    return
  end
  local cq = cqueues.new()
  local sched = require("clientpool.sched.cqueues").new(cq)

  -- two pools with a history: waits, a timeout, an error, keys
  local n = 0
  local function pool_of(max_live)
    local p = clientpool.new { create = function() n = n + 1; return { n } end, destroy = function() end,
                               max_live = max_live, scheduler = sched }
    metrics.track(p)
    return p
  end
  local pools = { redis = pool_of(2), ['api "v2"'] = pool_of(1) }
  for i = 1, 8 do
    sched.spawn(function()
      local p = i % 2 == 0 and pools.redis or pools['api "v2"']
      local lease = p:acquire(i % 3 == 0 and "replica" or nil, { timeout = i == 7 and 0.005 or nil })
      if not lease then return end
      cqueues.sleep(0.02)
      lease:release(i ~= 4)
    end)
  end
  sched.run()
  local expected = metrics.prometheus(pools)
  check("the exposition passes promtool check metrics", P.promtool(expected))

  -- the endpoint
  local port = free_port()
  local server = socket.listen { host = "127.0.0.1", port = port }
  local scrapes = 0
  cq:wrap(function()
    for con in server:clients() do
      cq:wrap(function()
        con:setmode("b", "b")
        local line = con:read("*l")
        repeat local h = con:read("*l") until not h or h == "" or h == "\r"
        local body = metrics.prometheus(pools)
        local status = line and line:match("^GET /metrics ") and "200 OK" or "404 Not Found"
        if status == "200 OK" then scrapes = scrapes + 1 else body = "" end
        con:write("HTTP/1.1 " .. status .. "\r\nContent-Type: " .. metrics.CONTENT_TYPE ..
                  "\r\nContent-Length: " .. #body .. "\r\nConnection: close\r\n\r\n" .. body)
        con:flush()
        con:close()
      end)
    end
  end)

  -- Prometheus
  local pport = free_port()
  local conf = io.open(dir .. "/prometheus.yml", "w")
  conf:write(([[
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: clientpool
    static_configs:
      - targets: ["127.0.0.1:%d"]
]]):format(port))
  conf:close()
  local cmd = ("prometheus --config.file='%s/prometheus.yml' --storage.tsdb.path='%s/data' " ..
               "--web.listen-address=127.0.0.1:%d --log.level=warn >'%s/prometheus.log' 2>&1 & echo $! >'%s/pid'")
              :format(dir, dir, pport, dir, dir)
  sh(cmd)
  local pf = io.open(dir .. "/pid")
  prom_pid = pf and tonumber(pf:read("*a"))
  if pf then pf:close() end
  check("prometheus started (pid " .. tostring(prom_pid) .. ", 127.0.0.1:" .. pport .. ")", prom_pid ~= nil)

  local result
  local querying = prom_pid ~= nil
  cq:wrap(function()
    -- until the target is up and a scrape is stored
    local deadline = cqueues.monotime() + 60
    local series
    while cqueues.monotime() < deadline do
      cqueues.sleep(0.5)
      local st, body = http_get(pport, "/api/v1/query?query=" ..
                                       urlencode('{__name__=~"clientpool_.+",job="clientpool"}'))
      if st == 200 then
        local doc = json_decode(body)
        if doc and doc.status == "success" and #doc.data.result > 0 then
          local up_st, up_body = http_get(pport, "/api/v1/query?query=" .. urlencode('up{job="clientpool"}'))
          local up = up_st == 200 and json_decode(up_body)
          if up and up.data.result[1] and up.data.result[1].value[2] == "1" then
            series = doc.data.result
            break
          end
        end
      end
    end
    result = series
    querying = false
  end)
  while querying do
    local ok, err = cq:step(0.5)
    if not ok then error(err) end
  end
  local log = io.open(dir .. "/prometheus.log")
  check("prometheus scraped the endpoint (" .. scrapes .. " scrapes) and stores clientpool_* series",
        result ~= nil and scrapes >= 1, result == nil and log and ("prometheus.log:\n" .. log:read("*a")) or nil)
  if log then log:close() end
  if not result then return end

  -- every sample of the exposition, read back through the API
  local doc = assert(P.parse(expected))
  local by = {}
  for _, s in ipairs(result) do
    local m = s.metric
    local labels = {}
    for k, v in pairs(m) do
      if k ~= "__name__" and k ~= "job" and k ~= "instance" then labels[#labels + 1] = k .. "=" .. v end
    end
    table.sort(labels)
    by[m.__name__ .. "{" .. table.concat(labels, ",") .. "}"] = tonumber(s.value[2])
  end
  local missing, wrong = {}, {}
  for _, smp in ipairs(doc.samples) do
    local labels = {}
    -- an empty label value is no label in Prometheus (the default key, key="")
    for k, v in pairs(smp.labels) do if v ~= "" then labels[#labels + 1] = k .. "=" .. v end end
    table.sort(labels)
    local id = smp.name .. "{" .. table.concat(labels, ",") .. "}"
    local got = by[id]
    if got == nil then missing[#missing + 1] = id
    elseif math.abs(got - smp.value) > 1e-9 * math.max(1, math.abs(smp.value)) then
      wrong[#wrong + 1] = id .. " = " .. got .. ", exposed " .. smp.value
    end
  end
  check("all " .. #doc.samples .. " exposed samples are in Prometheus with the same values",
        #missing == 0 and #wrong == 0, table.concat(missing, "\n") .. "\n" .. table.concat(wrong, "\n"))

  -- and those values are pool:stats()
  local mism = {}
  for name, p in pairs(pools) do
    local s = p:stats()
    local function q(metric, extra)
      local labels = { "pool=" .. name }
      for k, v in pairs(extra or {}) do if v ~= "" then labels[#labels + 1] = k .. "=" .. v end end
      table.sort(labels)
      return by[metric .. "{" .. table.concat(labels, ",") .. "}"]
    end
    local want = {
      { "clientpool_live", s.live }, { "clientpool_idle", s.idle }, { "clientpool_leases", s.leases },
      { "clientpool_waiting", s.waiting }, { "clientpool_opened_total", s.opened },
      { "clientpool_reused_total", s.reused }, { "clientpool_timeouts_total", s.timeouts },
      { "clientpool_waits_total", s.wait_count }, { "clientpool_wait_time_seconds_total", s.wait_time },
      { "clientpool_closed_total", s.closed_by.error, { reason = "error" } },
    }
    for kname, ks in pairs(s.keys) do
      want[#want + 1] = { "clientpool_key_opened_total", ks.opened, { key = kname } }
      want[#want + 1] = { "clientpool_key_live", ks.live, { key = kname } }
    end
    for _, w in ipairs(want) do
      local got = q(w[1], w[3])
      if got == nil or math.abs(got - w[2]) > 1e-9 then
        mism[#mism + 1] = name .. " " .. w[1] .. ": prometheus " .. tostring(got) .. ", stats " .. tostring(w[2])
      end
    end
  end
  check("values read back through the API match pool:stats() (gauges, counters, closed by reason, per key)",
        #mism == 0, table.concat(mism, "\n"))
  local timeouts = by['clientpool_timeouts_total{pool=api "v2"}']
  check("the pool name with a quote survived the round trip, and the timeout is counted",
        timeouts ~= nil and timeouts >= 1, tostring(timeouts))
  server:close()
  for _, p in pairs(pools) do p:close() end
end, debug.traceback)

stop_prometheus()
check("prometheus stopped by its pid", prom_pid == nil)
if not ok_run then check("the scrape test ran to its end", false, err_run) end
sh("rm -rf '" .. dir .. "'")
print(passed .. " passed, " .. failed .. " failed")
os.exit(failed == 0 and 0 or 1)
