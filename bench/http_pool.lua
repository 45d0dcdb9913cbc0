-- bench/http_pool.lua: the same HTTP load with clientpool.http and without
-- (lua-http's own request:go(), one connection per request, which is what a
-- lua-http user writes), against a private nginx (spec/http_nginx.lua).
-- Prints, per form, the TCP connections nginx saw (distinct $connection in
-- its access log), requests/s and failed requests. Run by `make bench-http`
-- (luajit, or BENCH_LUA=lua5.1): lua-http loads on Lua 5.1 and LuaJIT only.
--
-- The forms run in turn, `rounds` times (the machine is shared and noisy):
-- connections are those of one round, requests/s the best round of each.
--
--   bench/http_pool.lua [--requests N] [--concurrency C] [--max-live M] [--rounds R]
local args = { requests = 2000, concurrency = 50, ["max-live"] = 8, rounds = 5 }
do
  local i = 1
  while arg[i] do
    local name = arg[i]:match("^%-%-(.+)$")
    if not name or args[name] == nil or not tonumber(arg[i + 1]) then
      io.stderr:write("usage: bench/http_pool.lua [--requests N] [--concurrency C] [--max-live M] [--rounds R]\n")
      os.exit(2)
    end
    args[name] = tonumber(arg[i + 1])
    i = i + 2
  end
end

local clientpool = require "clientpool"
local cphttp = require "clientpool.http"
local cqueues = require "cqueues"
local http_request = require "http.request"
local NGX = require "spec.http_nginx"

local srv = assert(NGX.start())
local ok_run, err_run = pcall(function()
  local N, C = args.requests, args.concurrency
  local rows = {}

  local function load(name, one, fresh)
    local cq = cqueues.new()
    local sched = require("clientpool.sched.cqueues").new(cq)
    local tag = "/b" .. #rows + 1 .. "x" .. os.time()
    local ctx = fresh(sched)
    local next_i, done, failed = 0, 0, 0
    local t0 = cqueues.monotime()
    for _ = 1, C do
      sched.spawn(function()
        while next_i < N do
          next_i = next_i + 1
          if one(ctx, tag .. "/r" .. next_i) then done = done + 1 else failed = failed + 1 end
        end
      end)
    end
    sched.run()
    local secs = cqueues.monotime() - t0
    if ctx and ctx.close then ctx:close(); assert(cq:loop()) end
    local conns = srv:connections(tag, N)
    rows[#rows + 1] = { name = name, conns = conns, rps = done / secs, failed = failed }
  end

  local base = "http://127.0.0.1:" .. srv.ports.keep
  local forms = {
    { "lua-http request:go() (a connection per request)", function(_, path)
      local h, s = http_request.new_from_uri(base .. path):go(10)
      if not h then return false end
      local body = s:get_body_as_string(10)
      s:shutdown()
      pcall(s.connection.close, s.connection)   -- (lua-http may have closed it already)
      return body ~= nil and h:get(":status") == "200"
    end, function() return nil end },
    { "clientpool.http, max_live " .. args["max-live"], function(pool, path)
      local res = cphttp.request(pool, { path = path })
      return res ~= nil and res.status == 200
    end, function(sched)
      return clientpool.new(cphttp.pool { origin = base, max_live = args["max-live"], scheduler = sched })
    end },
  }
  -- warm-up round, not counted
  for _, f in ipairs(forms) do load(f[1], f[2], f[3]) end
  rows = {}
  local best = {}
  for _ = 1, args.rounds do
    for i, f in ipairs(forms) do
      load(f[1], f[2], f[3])
      local r = rows[#rows]
      local b = best[i]
      if not b then best[i] = r; b = r end
      if r.rps > b.rps then r.failed = r.failed + b.failed; best[i] = r else b.failed = b.failed + r.failed end
      if r.conns > best[i].conns then best[i].conns = r.conns end
    end
  end
  rows = best

  local nginx_v = (io.popen("nginx -v 2>&1"):read("*l") or ""):match("[%d.]+$") or "?"
  print(string.format("== clientpool.http bench (%s): %d GET requests a round, %d tasks at once, %d rounds, " ..
                      "nginx %s on 127.0.0.1:%d", rawget(_G, "jit") and "LuaJIT" or _VERSION, N, C, args.rounds,
                      nginx_v, srv.ports.keep))
  print("| form | TCP connections nginx saw (a round) | requests/s (best round) | failed (all rounds) |")
  print("|---|---:|---:|---:|")
  for _, r in ipairs(rows) do
    print(string.format("| %s | %d | %.0f | %d |", r.name, r.conns, r.rps, r.failed))
  end
  print(string.format("ratio: connections %.0fx fewer, requests/s %.2fx", rows[1].conns / rows[2].conns,
                      rows[2].rps / rows[1].rps))
end)
srv:stop()
if not ok_run then error(err_run, 0) end
