--- clientpool.metrics: pool statistics in the Prometheus text exposition
-- format (version 0.0.4).
--
--   local metrics = require "clientpool.metrics"
--   metrics.track(pool)                        -- optional, at creation: the wait-time histogram
--   local text = metrics.prometheus { redis = pool, api = other }
--
-- Families (all prefixed clientpool_, labelled pool="<name>"):
--   gauges   live idle active leases waiting creating closing (when the pool's
--            stats have it) paused (1 while paused) floor_spent
--   counters opened_total reused_total closed_total{reason} timeouts_total
--            rejected_total cancelled_total create_failed_total leaked_total
--            waits_total wait_time_seconds_total
--   histogram wait_duration_seconds
-- and the same gauges and counters per key as clientpool_key_* with
-- key="<name>" too (opts.keys = false leaves them out). A key's counters
-- start again at 0 when the key is forgotten and opened again (rate()
-- takes that as a counter reset); the pool-wide ones never go back.
--
-- The wait-time histogram: a pool whose stats() carry `wait_histogram`
-- ({ bounds = {...}, counts = {...}, sum = s, count = n }, counts per
-- bucket, the last one +Inf) is rendered from that; else from the waits a
-- tracker saw (metrics.track: the pool's `acquire` event carries `waited`,
-- the `timeout` event's detail `waited`; waits that end cancelled or closed
-- have no event and are not in it); else as the +Inf bucket alone, from
-- wait_count and wait_time (exact, without a distribution).
--
-- nginx: metrics.publish(dict, pools) in init_worker_by_lua makes each
-- worker write its families into a lua_shared_dict every second;
-- metrics.serve(dict) in a location answers for every worker, labelled
-- worker="<pid>" (docs/metrics.md has the recipe).
--
-- A pool's place in `pools` may hold a fleet name (a string) instead: its
-- statistics then come from metrics.fleet_stats(name) (clientpool.fleet's
-- stats: the fleet-wide gauges, per key too). For a Redis fleet those are
-- this machine's local fleet, and clientpool_redis_fleet_* add the figures
-- across machines (fleet.stats(name).redis; per machine labelled machine=).
local type, error, pairs, ipairs, tostring, tonumber, pcall, select, setmetatable, getmetatable =
      type, error, pairs, ipairs, tostring, tonumber, pcall, select, setmetatable, getmetatable
local string_format, string_gsub, string_find, string_sub = string.format, string.gsub, string.find, string.sub
local math_floor, math_huge = math.floor, math.huge
local table_concat, table_sort = table.concat, table.sort

local _M = { _VERSION = "0.1.0" }

--- Upper bounds (seconds) of the wait-time histogram's buckets when a
-- tracker is made without its own.
_M.BUCKETS = { 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10 }

_M.CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

local function fail(fmt, ...)
  error("clientpool.metrics: " .. string_format(fmt, ...), 0)
end

---------------------------------------------------------------------------
-- The families
---------------------------------------------------------------------------

-- { stat field, metric name, help } in output order
local GAUGES = {
  { "live", "live", "Clients open: created and not yet destroyed (being closed included)." },
  { "idle", "idle", "Clients idle in the pool." },
  { "active", "active", "Clients carrying at least one lease." },
  { "leases", "leases", "Leases held." },
  { "waiting", "waiting", "Acquisitions waiting in the queue." },
  { "creating", "creating", "Clients being created." },
  { "closing", "closing", "Clients whose destroy hook has not returned yet." },
}
local COUNTERS = {
  { "opened", "opened_total", "Clients created." },
  { "reused", "reused_total", "Idle clients handed out again." },
  { "timeouts", "timeouts_total", "Acquisitions that reached their deadline." },
  { "rejected", "rejected_total", "Acquisitions refused because the queue was full (or max_keys)." },
  { "cancelled", "cancelled_total", "Waiting acquisitions cancelled or abandoned." },
  { "create_failed", "create_failed_total", "Creates that failed." },
  { "leaked", "leaked_total", "Leases collected by the garbage collector while held." },
  { "wait_count", "waits_total", "Waits in the queue that ended, whatever the outcome." },
  { "wait_time", "wait_time_seconds_total", "Seconds spent in those waits." },
}
local CLOSED_HELP = "Clients destroyed, by reason."
local PAUSED_HELP = "1 while admission is paused (pool:pause, a policy), else 0."
local SPENT_HELP = "1 while the warm floor is spent (refills failed more than `restarts` times in a row), else 0."
local HIST_HELP = "Seconds acquisitions waited in the queue."

-- The meta of every family name: type, help (serve() needs it for the
-- samples other workers wrote).
local META = {}
local ORDER = {}
local function family(name, typ, help)
  META[name] = { typ, help }
  ORDER[#ORDER + 1] = name
end
for _, scope in ipairs { "", "key_" } do
  for _, g in ipairs(GAUGES) do family("clientpool_" .. scope .. g[2], "gauge", g[3]) end
  family("clientpool_" .. scope .. "paused", "gauge", PAUSED_HELP)
  if scope == "" then family("clientpool_floor_spent", "gauge", SPENT_HELP) end
  for _, c in ipairs(COUNTERS) do family("clientpool_" .. scope .. c[2], "counter", c[3]) end
  family("clientpool_" .. scope .. "closed_total", "counter", CLOSED_HELP)
  if scope == "" then family("clientpool_wait_duration_seconds", "histogram", HIST_HELP) end
end

-- A Redis fleet's figures across machines (fleet.stats(name).redis): the
-- pool families above render this machine's local fleet (its share).
-- { stats field, name, help }; the machine ones are labelled machine=.
local REDIS_GAUGES = {
  { "leased", "clientpool_redis_fleet_leased",
    "Units leased in Redis by all machines of the fleet (what each may hold until its lease ends)." },
  { "live", "clientpool_redis_fleet_live",
    "Clients the machines said they may hold (open, or to open before their next renewal), summed." },
  { "max_live", "clientpool_redis_fleet_max_live", "The fleet-wide cap across machines." },
}
local REDIS_MACHINE = {
  { "units", "clientpool_redis_fleet_machine_units", "Units leased in Redis to this machine." },
  { "held", "clientpool_redis_fleet_machine_held",
    "Clients this machine said it may hold (open, or to open before its next renewal)." },
  { "demand", "clientpool_redis_fleet_machine_demand", "Callers waiting on this machine at its last renewal." },
}
family("clientpool_redis_fleet_up", "gauge",
       "1 when the fleet's Redis answered for these figures, else 0 (and the other redis families are left out).")
for _, g in ipairs(REDIS_GAUGES) do family(g[2], "gauge", g[3]) end
family("clientpool_redis_fleet_quiet_seconds", "gauge",
       "Seconds left of the quiet period (a new or restarted Redis grants no new units for one ttl).")
family("clientpool_redis_fleet_paused", "gauge", "1 while the fleet is paused across machines (fleet.pause), else 0.")
for _, g in ipairs(REDIS_MACHINE) do family(g[2], "gauge", g[3]) end
local RANK = {}
for i, name in ipairs(ORDER) do RANK[name] = i end

---------------------------------------------------------------------------
-- Text format
---------------------------------------------------------------------------

-- Label values: backslash, double quote and line feed escaped.
local function esc_label(v)
  return (string_gsub(tostring(v), '[\\"\n]', { ["\\"] = "\\\\", ['"'] = '\\"', ["\n"] = "\\n" }))
end
_M.escape_label = esc_label

local function esc_help(v)
  return (string_gsub(v, "[\\\n]", { ["\\"] = "\\\\", ["\n"] = "\\n" }))
end

local function num(v)
  if v ~= v then return "NaN" end
  if v == math_huge then return "+Inf" end
  if v == -math_huge then return "-Inf" end
  if math_floor(v) == v and v > -2^53 and v < 2^53 then return string_format("%d", v) end
  -- the shortest form that reads back as the same number
  for _, f in ipairs { "%.15g", "%.16g" } do
    local t = string_format(f, v)
    if tonumber(t) == v then return t end
  end
  return string_format("%.17g", v)
end
_M.format_number = num

-- labels: a list name, value, name, value...; returns `{a="x",b="y"}` or "".
local function labelstr(labels)
  if #labels == 0 then return "" end
  local t = {}
  for i = 1, #labels, 2 do t[#t + 1] = labels[i] .. '="' .. esc_label(labels[i + 1]) .. '"' end
  return "{" .. table_concat(t, ",") .. "}"
end

---------------------------------------------------------------------------
-- Wait-time trackers (the event source)
---------------------------------------------------------------------------

local trackers = setmetatable({}, { __mode = "k" })   -- pool -> histogram

local function new_hist(bounds)
  local counts = {}
  for i = 1, #bounds + 1 do counts[i] = 0 end
  return { bounds = bounds, counts = counts, sum = 0, count = 0 }
end

local function observe(h, s)
  if type(s) ~= "number" or s ~= s then return end
  local b = h.bounds
  local i = 1
  while b[i] and s > b[i] do i = i + 1 end
  h.counts[i] = h.counts[i] + 1
  h.sum = h.sum + s
  h.count = h.count + 1
end

local function check_bounds(bounds)
  if type(bounds) ~= "table" or #bounds == 0 then fail("buckets must be a non-empty list of numbers") end
  local prev = -math_huge
  for i, v in ipairs(bounds) do
    if type(v) ~= "number" or v ~= v or v <= prev or v == math_huge then
      fail("buckets must be increasing finite numbers (item %d: %s)", i, tostring(v))
    end
    prev = v
  end
  local copy = {}
  for i, v in ipairs(bounds) do copy[i] = v end
  return copy
end

local function is_pool(p)
  local clientpool = package.loaded.clientpool
  return type(p) == "table" and clientpool ~= nil and getmetatable(p) == clientpool.Pool
end

--- Counts the pool's waits into a histogram from now on: each acquisition
-- that waited (the `acquire` event's waited) and each that timed out (the
-- `timeout` event's detail.waited). Idempotent; returns the pool.
-- buckets: upper bounds in seconds (default metrics.BUCKETS).
function _M.track(pool, buckets)
  if not is_pool(pool) then error("clientpool.metrics: track expects a pool, got " .. type(pool), 2) end
  if trackers[pool] then return pool end
  local ok, bounds = pcall(check_bounds, buckets or _M.BUCKETS)
  if not ok then error(bounds, 2) end
  local h = new_hist(bounds)
  trackers[pool] = h
  pool:on("acquire", function(_, _, waited) if waited then observe(h, waited) end end)
  pool:on("timeout", function(_, detail) if type(detail) == "table" then observe(h, detail.waited) end end)
  return pool
end

---------------------------------------------------------------------------
-- Collecting: families from pools
---------------------------------------------------------------------------

--- Statistics of a fleet name: clientpool.fleet.stats(name), whose
-- fleet-wide live, idle, leases, waiting, paused and keys render like a
-- pool's (a fleet keeps no counters or waits of its own; its members' pools
-- do). Replaceable, for a fleet of another kind.
function _M.fleet_stats(name)
  local ok, fleet = pcall(require, "clientpool.fleet")
  if not ok or type(fleet) ~= "table" or type(fleet.stats) ~= "function" then
    fail("'%s' is a fleet name, but clientpool.fleet is not available (a table of name -> pool works today)",
         tostring(name))
  end
  return fleet.stats(name)
end

-- families: name -> list of samples { sample name, labels list, value }
local function add(fams, fam, sample, labels, v)
  if v == nil then return end
  local list = fams[fam]
  if not list then list = {}; fams[fam] = list end
  list[#list + 1] = { sample, labels, v }
end

local function with(base, ...)
  local t = {}
  for i = 1, #base do t[i] = base[i] end
  for i = 1, select("#", ...) do t[#t + 1] = (select(i, ...)) end
  return t
end

local function sorted_keys(t)
  local ks = {}
  for k in pairs(t) do ks[#ks + 1] = k end
  table_sort(ks, function(a, b) return tostring(a) < tostring(b) end)
  return ks
end

local function scope_samples(fams, prefix, s, labels)
  for _, g in ipairs(GAUGES) do
    local v = s[g[1]]
    if type(v) == "number" then add(fams, prefix .. g[2], prefix .. g[2], labels, v) end
  end
  -- (no reason label: reasons such as "http 429" come and go, a series each)
  if s.paused ~= nil then add(fams, prefix .. "paused", prefix .. "paused", labels, s.paused and 1 or 0) end
  if s.floor_spent ~= nil and prefix == "clientpool_" then
    add(fams, "clientpool_floor_spent", "clientpool_floor_spent", labels, s.floor_spent and 1 or 0)
  end
  for _, c in ipairs(COUNTERS) do
    local v = s[c[1]]
    if type(v) == "number" then add(fams, prefix .. c[2], prefix .. c[2], labels, v) end
  end
  if type(s.closed_by) == "table" then
    for _, reason in ipairs(sorted_keys(s.closed_by)) do
      add(fams, prefix .. "closed_total", prefix .. "closed_total", with(labels, "reason", reason), s.closed_by[reason])
    end
  end
end

-- fleet.stats(name).redis: { leased, live, max_live, quiet_ms, paused,
-- machines = { [m] = { units, held, demand } } } or { error = ... }
local function redis_samples(fams, r, labels)
  local up = r.error == nil and type(r.max_live) == "number"
  add(fams, "clientpool_redis_fleet_up", "clientpool_redis_fleet_up", labels, up and 1 or 0)
  if not up then return end
  for _, g in ipairs(REDIS_GAUGES) do
    if type(r[g[1]]) == "number" then add(fams, g[2], g[2], labels, r[g[1]]) end
  end
  if type(r.quiet_ms) == "number" then
    add(fams, "clientpool_redis_fleet_quiet_seconds", "clientpool_redis_fleet_quiet_seconds", labels, r.quiet_ms / 1000)
  end
  if r.paused ~= nil then
    add(fams, "clientpool_redis_fleet_paused", "clientpool_redis_fleet_paused", labels, r.paused and 1 or 0)
  end
  if type(r.machines) == "table" then
    for _, m in ipairs(sorted_keys(r.machines)) do
      local row, ml = r.machines[m], with(labels, "machine", tostring(m))
      for _, g in ipairs(REDIS_MACHINE) do
        if type(row[g[1]]) == "number" then add(fams, g[2], g[2], ml, row[g[1]]) end
      end
    end
  end
end

local function hist_samples(fams, h, labels)
  local name = "clientpool_wait_duration_seconds"
  local cum = 0
  for i, le in ipairs(h.bounds) do
    cum = cum + (h.counts[i] or 0)
    add(fams, name, name .. "_bucket", with(labels, "le", num(le)), cum)
  end
  add(fams, name, name .. "_bucket", with(labels, "le", "+Inf"), h.count)
  add(fams, name, name .. "_sum", labels, h.sum)
  add(fams, name, name .. "_count", labels, h.count)
end

local OPTS = { keys = true, labels = true, track = true }

local function check_opts(opts, what)
  if opts == nil then return {} end
  if type(opts) ~= "table" then fail("%s: options must be a table, got %s", what, type(opts)) end
  for k in pairs(opts) do
    if not OPTS[k] then fail("%s: unknown option '%s' (keys, labels, track)", what, tostring(k)) end
  end
  if opts.labels ~= nil then
    if type(opts.labels) ~= "table" then fail("%s: labels must be a table of name = value", what) end
    for k, v in pairs(opts.labels) do
      if type(k) ~= "string" or not string_find(k, "^[%a_][%w_]*$") or string_sub(k, 1, 2) == "__" then
        fail("%s: bad label name %s", what, string_format("%q", tostring(k)))
      end
      if k == "pool" or k == "key" or k == "reason" or k == "le" or k == "worker" or k == "machine" then
        fail("%s: label '%s' is clientpool.metrics' own", what, k)
      end
      if type(v) ~= "string" and type(v) ~= "number" then fail("%s: label '%s' must be a string or number", what, k) end
    end
  end
  return opts
end

-- Families of all pools: fams (name -> samples). base: labels first on every sample.
local function collect(pools, opts, base, what)
  if type(pools) ~= "table" or is_pool(pools) then
    fail("%s expects a table of name -> pool (or fleet name), got %s", what, is_pool(pools) and "a pool" or type(pools))
  end
  base = base or {}
  if opts.labels then
    for _, k in ipairs(sorted_keys(opts.labels)) do base[#base + 1] = k; base[#base + 1] = opts.labels[k] end
  end
  local fams = {}
  for _, name in ipairs(sorted_keys(pools)) do
    local src = pools[name]
    if type(name) ~= "string" and type(name) ~= "number" then fail("%s: pool names must be strings", what) end
    local s, h
    if is_pool(src) then
      s = src:stats()
      if opts.track ~= false and not trackers[src] then _M.track(src) end
      h = s.wait_histogram or trackers[src]
    elseif type(src) == "string" then
      s = _M.fleet_stats(src)
      h = type(s) == "table" and s.wait_histogram or nil
    else
      fail("%s: '%s' must be a pool or a fleet name, got %s", what, tostring(name), type(src))
    end
    local labels = with(base, "pool", tostring(name))
    scope_samples(fams, "clientpool_", s, labels)
    if not h and s.wait_count then
      -- no distribution: the +Inf bucket alone, exact
      h = { bounds = {}, counts = {}, sum = s.wait_time or 0, count = s.wait_count }
    end
    if h then hist_samples(fams, h, labels) end   -- (a fleet's stats have no waits)
    if type(s.redis) == "table" then redis_samples(fams, s.redis, labels) end
    if opts.keys ~= false and type(s.keys) == "table" then
      for _, kname in ipairs(sorted_keys(s.keys)) do
        scope_samples(fams, "clientpool_key_", s.keys[kname], with(labels, "key", tostring(kname)))
      end
    end
  end
  return fams
end

local function render(fams, out)
  out = out or {}
  local names = sorted_keys(fams)
  table_sort(names, function(a, b) return (RANK[a] or 1e9) < (RANK[b] or 1e9) end)
  for _, fam in ipairs(names) do
    local meta = META[fam]
    out[#out + 1] = "# HELP " .. fam .. " " .. esc_help(meta[2]) .. "\n"
    out[#out + 1] = "# TYPE " .. fam .. " " .. meta[1] .. "\n"
    for _, smp in ipairs(fams[fam]) do
      local v = smp[3]
      out[#out + 1] = smp[1] .. (type(smp[2]) == "string" and smp[2] or labelstr(smp[2])) .. " " ..
                      (type(v) == "string" and v or num(v)) .. "\n"
    end
  end
  return table_concat(out)
end

--- The Prometheus text exposition of the pools: pools is a table of name
-- -> pool (or fleet name). opts: keys = false (no clientpool_key_*
-- families), labels = { name = value } (put on every sample), track =
-- false (do not start a wait-time tracker for pools that have none).
function _M.prometheus(pools, opts)
  local ok, text = pcall(function()
    return render(collect(pools, check_opts(opts, "prometheus()"), nil, "prometheus()"))
  end)
  if not ok then error(text, 2) end
  return text
end

---------------------------------------------------------------------------
-- nginx: every worker's pools through a lua_shared_dict
---------------------------------------------------------------------------

-- A worker's families as one string: fields "<len>:<bytes>", in groups of
-- four (family, sample name, label string, value).
local function encode(fams)
  local out = {}
  local function put(s)
    out[#out + 1] = #s .. ":" .. s
  end
  for fam, list in pairs(fams) do
    for _, smp in ipairs(list) do
      put(fam); put(smp[1]); put(labelstr(smp[2])); put(num(smp[3]))
    end
  end
  return table_concat(out)
end

-- Adds the samples of an encoded worker to fams, with worker="<pid>" first.
local function decode_into(fams, data, pid)
  local pos, n = 1, #data
  local fields = {}
  local wl = 'worker="' .. esc_label(pid) .. '"'
  while pos <= n do
    for i = 1, 4 do
      local colon = string_find(data, ":", pos, true)
      if not colon then return false end
      local len = tonumber(string_sub(data, pos, colon - 1))
      if not len then return false end
      fields[i] = string_sub(data, colon + 1, colon + len)
      pos = colon + len + 1
    end
    local fam, sample, labels, value = fields[1], fields[2], fields[3], fields[4]
    if META[fam] then
      if labels == "" then labels = "{" .. wl .. "}" else labels = "{" .. wl .. "," .. string_sub(labels, 2) end
      add(fams, fam, sample, labels, value)
    end
  end
  return true
end

local PREFIX = "clientpool:w:"

local function shdict(name, what)
  local ngx = rawget(_G, "ngx")
  if not ngx or not ngx.shared then fail("%s needs OpenResty (ngx.shared)", what) end
  if type(name) ~= "string" then fail("%s: the lua_shared_dict name must be a string", what) end
  local d = ngx.shared[name]
  if not d then
    fail("%s: no lua_shared_dict '%s' (add `lua_shared_dict %s 1m;` to the http block)", what, name, name)
  end
  return d, ngx
end

-- this worker's publisher: { dict name, pools (table or function), opts, ttl }
local published

local function pools_of(p)
  if type(p) == "function" then return p() end
  return p
end

local function write_own(d, ngx)
  local p = published
  local ok, fams = pcall(collect, pools_of(p.pools) or {}, p.opts, nil, "publish()")
  if not ok then
    ngx.log(ngx.ERR, "clientpool.metrics: publish: ", fams)
    return
  end
  local sok, err, forcible = d:set(PREFIX .. ngx.worker.pid(), encode(fams), p.ttl)
  if not sok then
    ngx.log(ngx.ERR, "clientpool.metrics: publish: lua_shared_dict '", p.dict, "': ", err)
  elseif forcible then
    ngx.log(ngx.WARN, "clientpool.metrics: lua_shared_dict '", p.dict,
            "' is full: entries were evicted (make it larger)")
  end
end

--- In init_worker_by_lua: this worker writes its pools' families into the
-- lua_shared_dict `dict` now and every `opts.interval` seconds (default
-- 1), kept for 3 intervals (so the entry of a worker that died goes), and
-- removes them when it exits. pools: a table name -> pool, or a function
-- returning one (called each time: pools made after init_worker count).
-- opts also takes prometheus()'s keys, labels and track.
function _M.publish(dict, pools, opts)
  local d, ngx = shdict(dict, "publish()")
  if type(pools) ~= "table" and type(pools) ~= "function" then
    error("clientpool.metrics: publish() expects a table of name -> pool or a function returning one", 2)
  end
  opts = opts or {}
  if type(opts) ~= "table" then error("clientpool.metrics: publish(): options must be a table", 2) end
  local interval = opts.interval or 1
  if type(interval) ~= "number" or interval ~= interval or interval <= 0 or interval == math_huge then
    error("clientpool.metrics: publish(): interval must be a finite number of seconds > 0", 2)
  end
  local popts = {}
  for k, v in pairs(opts) do if k ~= "interval" then popts[k] = v end end
  local ok, err = pcall(check_opts, popts, "publish()")
  if not ok then error(err, 2) end
  published = { dict = dict, pools = pools, opts = popts, ttl = interval * 3 + 1 }
  local function tick(premature)
    if premature or ngx.worker.exiting() then
      d:delete(PREFIX .. ngx.worker.pid())
      return
    end
    write_own(d, ngx)
  end
  local tok, terr = ngx.timer.every(interval, tick)
  if not tok then error("clientpool.metrics: publish(): ngx.timer.every: " .. tostring(terr), 2) end
  -- the first write from a timer too: init_worker may not yield, and
  -- pool:stats() is cheap but pools may be made just after this call
  ngx.timer.at(0, tick)
end

--- The families of every worker that published into `dict` (this one's
-- refreshed first), labelled worker="<pid>", as Prometheus text. extra:
-- name -> pool or fleet name rendered once, without a worker label (a
-- fleet is machine-wide: every worker sees the same).
function _M.collect(dict, extra, opts)
  local d, ngx = shdict(dict, "collect()")
  if published and published.dict == dict then write_own(d, ngx) end
  local fams = {}
  local keys = d:get_keys(0)
  table_sort(keys)
  for _, k in ipairs(keys) do
    if string_sub(k, 1, #PREFIX) == PREFIX then
      local data = d:get(k)
      if data and not decode_into(fams, data, string_sub(k, #PREFIX + 1)) then
        ngx.log(ngx.ERR, "clientpool.metrics: bad entry ", k, " in lua_shared_dict '", dict, "'")
      end
    end
  end
  if extra ~= nil then
    local ef = collect(extra, check_opts(opts, "collect()"), nil, "collect()")
    for fam, list in pairs(ef) do
      for _, smp in ipairs(list) do add(fams, fam, smp[1], smp[2], smp[3]) end
    end
  end
  return render(fams)
end

--- A content handler: answers the text of collect(dict, extra, opts) with
-- the exposition format's Content-Type.
function _M.serve(dict, extra, opts)
  local ok, text = pcall(_M.collect, dict, extra, opts)
  local ngx = rawget(_G, "ngx")
  if not ok then
    ngx.status = 500
    ngx.log(ngx.ERR, tostring(text))
    ngx.say("clientpool.metrics: ", tostring(text))
    return
  end
  ngx.header["Content-Type"] = _M.CONTENT_TYPE
  ngx.print(text)
end

return _M
