-- /metrics of every worker (docs/metrics.md's nginx recipe): spec/nginx/run.sh
-- starts a second nginx with three workers and the recipe's block as it is
-- written (its pools: spec/nginx/metrics/my_pools.lua, where worker id i
-- opens i + 1 clients of pool "plain"). Whichever worker answers /metrics,
-- the answer must cover all three; work done in one worker must show in
-- the next answer of any; a killed worker's series must go.
local H = require "harness"
local P = require "spec.prom_text"

local conf = H.conf

-- GET path on the metrics nginx over a new connection: status, headers (lower-case names), body.
local function get(port, path)
  local sock = ngx.socket.tcp()
  sock:settimeouts(2000, 2000, 5000)
  local ok, err = sock:connect("127.0.0.1", port)
  if not ok then return nil, err end
  sock:send("GET " .. path .. " HTTP/1.0\r\nHost: localhost\r\n\r\n")
  local data = sock:receive("*a")
  sock:close()
  if not data then return nil, "no answer" end
  local head, body = data:match("^(.-)\r\n\r\n(.*)$")
  local headers = {}
  for k, v in head:gmatch("\n([^:\r\n]+):%s*([^\r\n]*)") do headers[k:lower()] = v end
  return tonumber(head:match("^HTTP/%d%.%d (%d+)")), headers, body
end

-- The worker pids of the metrics nginx, as a sorted list.
local function worker_pids()
  local f = io.open(conf.metrics_pid_file)
  local master = f and f:read("*a"):match("%d+")
  if f then f:close() end
  if not master then return {} end
  local p = io.popen("ps -o pid=,args= --ppid " .. master)
  local pids = {}
  for line in p:lines() do
    local pid = line:match("^%s*(%d+)%s+nginx: worker process")
    if pid then pids[#pids + 1] = pid end
  end
  p:close()
  table.sort(pids)
  return pids
end

-- One /metrics answer: doc, the answering worker's pid, worker -> opened of pool "plain".
local function scrape()
  local status, headers, body = get(conf.metrics_port, "/metrics")
  if status ~= 200 then return nil, "status " .. tostring(status) .. ": " .. tostring(body) end
  local doc, err = P.parse(body)
  if not doc then return nil, err end
  local opened = {}
  for _, s in ipairs(P.select(doc, "clientpool_opened_total", { pool = "plain" })) do
    opened[s.labels.worker] = s.value
  end
  return doc, headers["x-clientpool-worker"], opened, headers
end

local function keys_of(t)
  local ks = {}
  for k in pairs(t) do ks[#ks + 1] = k end
  table.sort(ks)
  return ks
end

describe("/metrics of docs/metrics.md's recipe in three workers", function()
  it("every answer covers all three workers, whichever worker gives it", function()
    local pids = worker_pids()
    assert.are.equal(conf.metrics_workers, #pids)
    -- each worker's pool has made its clients (a timer at its first publish)
    H.wait_until(function()
      local _, _, opened = scrape()
      local n = 0
      for _, v in pairs(opened or {}) do n = n + v end
      return n == 6
    end, 5)
    local answered_by = {}
    for _ = 1, 30 do
      local doc, by, opened = scrape()
      assert.is_table(doc, by)
      answered_by[by] = true
      assert.are.same(pids, keys_of(opened))
      local values = {}
      for _, v in pairs(opened) do values[#values + 1] = v end
      table.sort(values)
      assert.are.same({ 1, 2, 3 }, values)      -- worker id i opened i + 1 clients
      assert.is_number(P.value(doc, "clientpool_live", { worker = pids[1], pool = "plain" }))
    end
    assert.is_true(#keys_of(answered_by) >= 2, "answered by " .. table.concat(keys_of(answered_by), ", "))
  end)

  it("answers in the exposition format's Content-Type", function()
    local _, _, _, headers = scrape()
    assert.are.equal("text/plain; version=0.0.4; charset=utf-8", headers["content-type"])
  end)

  it("an acquisition in one worker shows in the next answers of any worker (within the 1 s interval)", function()
    local status, _, body = get(conf.metrics_work_port, "/work")
    assert.are.equal(200, status)
    local w = body:match("%d+")
    local function reused_of(doc)
      return P.value(doc, "clientpool_reused_total", { worker = w, pool = "plain" })
    end
    -- the reuse this /work made shows within the interval, then stays
    local seen = H.wait_until(function()
      local doc = scrape()
      return doc and reused_of(doc) and reused_of(doc) >= 1
    end, 3)
    assert.is_true(seen == true, "worker " .. w .. "'s reuse never showed")
    for _ = 1, 10 do
      local doc = assert(scrape())
      assert.is_true(reused_of(doc) >= 1)
    end
  end)

  it("a killed worker's series go within ttl; its replacement's come", function()
    local before = worker_pids()
    local victim = before[1]
    assert.are.equal(0, os.execute("kill -9 " .. victim))   -- (LuaJIT: the exit status)
    local after
    local ok = H.wait_until(function()
      local pids = worker_pids()
      if #pids ~= #before then return false end
      for _, p in ipairs(pids) do if p == victim then return false end end
      local _, _, opened = scrape()
      if not opened then return false end
      after = pids
      local got = keys_of(opened)
      return table.concat(got, ",") == table.concat(pids, ",")
    end, 10)
    assert.is_true(ok == true, "after killing " .. victim .. ": workers " .. table.concat(worker_pids(), ",") ..
                   ", /metrics has " .. table.concat(keys_of(select(3, scrape()) or {}), ","))
    assert.are.equal(#before, #after)
  end, 30)
end)
