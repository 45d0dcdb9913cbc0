-- The code blocks of README.md and docs/*.md run (issue 13: "Every code
-- block in README and docs/ still runs in CI"; issue 4 before it).
--
-- The convention (docs/testing.md, "Documentation code blocks"): every
-- fenced block declares its language; every lua and nginx block has a
-- marker on the line before it:
--   <!-- spec:NAME -->                 run here, by CHECKS[NAME]
--   <!-- spec:NAME nginx -->           run by spec/nginx/run.sh, which takes
--                                      it from the file as written; a Lua
--                                      one is parsed here
--   <!-- spec:NAME parse: REASON -->   only parsed, for the reason given
-- sh blocks must name make targets that exist and paths that exist; text
-- blocks are not code.
--
-- The checks run a block one of two ways. In a sandbox: the block is
-- compiled with its free names (connect, pool, key, request, ...) as stubs
-- in its environment, `loop` a virtual clientpool.loop and `clientpool` a
-- copy whose new() uses that loop unless the block names a scheduler; it
-- runs as a task of the loop with a `return` of its locals appended, so the
-- check can look at what it did. Or as written, in a fresh interpreter
-- (H.run_fresh), comparing what it prints; a block that talks to Redis on
-- 127.0.0.1:6379 gets a redis-server this spec starts on a free port (the
-- port is put in place of 6379) and stops by its pid, and the check counts
-- the connections redis saw.

local clientpool = require "clientpool"
local cploop = require "clientpool.loop"
local H = require "spec.helpers"

local unpack = table.unpack or unpack -- luacheck: ignore 143

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

local function write(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

-- One shell command's output.
local function sh(cmd)
  local f = assert(io.popen(cmd))
  local out = f:read("*a")
  f:close()
  return out
end

---------------------------------------------------------------------------
-- The blocks
---------------------------------------------------------------------------

local FILES = { "README.md", "CHANGELOG.md" }
for path in sh("ls docs/*.md 2>/dev/null"):gmatch("[^\n]+") do FILES[#FILES + 1] = path end

local LANGS = { lua = true, nginx = true, sh = true, text = true }

-- Every fenced block of a file: { file, line, lang, code, mark, mode, reason }.
local function blocks_of(path)
  local list, cur, prev, n = {}, nil, nil, 0
  for line in (read(path) .. "\n"):gmatch("([^\n]*)\n") do
    n = n + 1
    if cur then
      if line:match("^```%s*$") then
        cur.code = table.concat(cur.code, "\n")
        list[#list + 1] = cur
        cur = nil
      else
        cur.code[#cur.code + 1] = line
      end
    else
      local lang = line:match("^```(.*)$")
      if lang then
        cur = { file = path, line = n, lang = lang, code = {} }
        local name, rest = (prev or ""):match("^<!%-%- spec:([%w_%-]+)(.-) %-%->$")
        if name then
          cur.mark = name
          if rest == "" then
            cur.mode = "run"
          elseif rest == " nginx" then
            cur.mode = "nginx"
          elseif rest:match("^ parse: ") then
            cur.mode, cur.reason = "parse", rest:match("^ parse: (.*)$")
          else
            cur.mode = "bad: " .. rest
          end
        elseif (prev or ""):match("spec:") then
          cur.mode = "bad: " .. prev
        end
      end
    end
    prev = line
  end
  assert(cur == nil, path .. ": a code block opened at line " .. (cur and cur.line or 0) .. " is never closed")
  return list
end

local ALL, BY_NAME = {}, {}
for _, path in ipairs(FILES) do
  for _, b in ipairs(blocks_of(path)) do
    ALL[#ALL + 1] = b
    if b.mark and not BY_NAME[b.mark] then BY_NAME[b.mark] = b end
  end
end

local function where(b) return b.file .. ":" .. b.line end

-- Compiles code with env as its globals (Lua 5.1 and LuaJIT: setfenv).
local function compile(code, name, env)
  local setfenv_, loadstring_ = rawget(_G, "setfenv"), rawget(_G, "loadstring")
  if setfenv_ and loadstring_ then
    local f, err = loadstring_(code, "=" .. name)
    if not f then return nil, err end
    return setfenv_(f, env)
  end
  return load(code, "=" .. name, "t", env)
end

local function block(name)
  return assert(BY_NAME[name], "no code block marked <!-- spec:" .. name .. " --> in README.md or docs/")
end

---------------------------------------------------------------------------
-- Running a block
---------------------------------------------------------------------------

-- A fresh virtual loop, a clientpool whose new() uses it, and an
-- environment for a block: the stubs given, over _G.
local function sandbox(stubs)
  local vloop = cploop.new { clock = "virtual" }
  local cp = setmetatable({
    new = function(o)
      if o.scheduler == nil then o.scheduler = vloop end
      return clientpool.new(o)
    end,
  }, { __index = clientpool })
  local env = setmetatable({ clientpool = cp, loop = vloop }, { __index = _G })
  for k, v in pairs(stubs or {}) do env[k] = v end
  return env, vloop
end

-- Runs block `name` as a task of the sandbox's loop with `ret` (a list of
-- the block's locals) returned, then after(vloop, results...) in the same
-- task; runs the loop until every task is done.
local function run_snippet(name, env, vloop, ret, after)
  local b = block(name)
  local chunk = assert(compile(b.code .. "\nreturn " .. ret, where(b), env))
  local done = false
  vloop.spawn(function()
    local r = { n = 0 }
    local function keep(...) r = { n = select("#", ...), ... } end
    keep(chunk())
    after(vloop, unpack(r, 1, r.n))
    done = true
  end)
  vloop.run()
  assert.is_true(done, "the block's task did not finish")
end

-- Runs block `name` as written in a fresh interpreter of the running kind
-- (6379 replaced by `port` when given); returns what it printed and its
-- "rc=N" line.
local function run_fresh(name, port)
  local b = block(name)
  local code = b.code
  if port then
    local n
    code, n = code:gsub("6379", tostring(port))
    assert(n > 0, where(b) .. " names no port 6379")
  end
  local path = os.tmpname()
  write(path, code)
  local ok, out = pcall(H.run_fresh, path)
  os.remove(path)
  assert(ok, out)
  return out
end

-- A simulated client: a table with an id, closed by destroy.
local function sim(key, n)
  return { id = n, key = key, open = true, close = function(self) self.open = false end }
end

---------------------------------------------------------------------------
-- A redis-server for the blocks that talk to one
---------------------------------------------------------------------------

-- Started on a free 127.0.0.1 port; a watchdog shell stops it if this
-- interpreter dies first. Returns { port, pid, dir } or nil and a reason.
local function start_redis()
  local okp, socket = pcall(require, "socket")
  if not okp then return nil, "luasocket does not load here" end
  if not sh("command -v redis-server"):match("%S") then return nil, "no redis-server (redis-server package)" end
  local s = assert(socket.bind("127.0.0.1", 0))
  local _, port = s:getsockname()
  s:close()
  local dir = os.tmpname()
  os.remove(dir)
  sh("mkdir -p '" .. dir .. "'")
  -- $PPID is this interpreter: the watchdog ends redis once it is gone
  local pid = sh(("lua_pid=$PPID; env -u LD_PRELOAD redis-server --port %s --bind 127.0.0.1 --save '' " ..
    "--appendonly no --dir '%s' --logfile '%s/redis.log' >/dev/null 2>&1 & r=$!; echo $r; " ..
    "(while kill -0 $lua_pid 2>/dev/null && kill -0 $r 2>/dev/null; do sleep 1; done; " ..
    "kill $r 2>/dev/null) >/dev/null 2>&1 &"):format(port, dir, dir)):match("%d+")
  local r = { port = tonumber(port), pid = pid, dir = dir, socket = socket }
  for _ = 1, 100 do
    local c = socket.connect("127.0.0.1", r.port)
    if c then
      c:settimeout(5)
      c:send("PING\r\n")
      local line = c:receive("*l")
      c:close()
      if line == "+PONG" then return r end
    end
    socket.sleep(0.05)
  end
  return nil, "redis-server did not answer on port " .. port .. ": " .. sh("cat '" .. dir .. "/redis.log'")
end

local function stop_redis(r)
  if not r then return end
  if r.pid then
    sh("kill " .. r.pid .. " 2>/dev/null; for i in $(seq 1 50); do kill -0 " .. r.pid ..
       " 2>/dev/null || break; sleep 0.1; done; kill -9 " .. r.pid .. " 2>/dev/null")
  end
  sh("rm -rf '" .. r.dir .. "'")
end

-- Connections redis has accepted so far (the one asking included).
local function redis_connections(r)
  local c = assert(r.socket.connect("127.0.0.1", r.port))
  c:settimeout(5)
  c:send("INFO stats\r\n")
  local len = tonumber(assert(c:receive("*l")):match("^%$(%d+)"))
  local body = c:receive(len + 2)
  c:close()
  return tonumber(body:match("total_connections_received:(%d+)"))
end

---------------------------------------------------------------------------
-- The checks, one per <!-- spec:NAME --> block
---------------------------------------------------------------------------

local CHECKS = {}

-- README quick starts -----------------------------------------------------

CHECKS["quickstart"] = function()
  -- as a user runs it: the real clock of the default loop
  assert.equal("4\t96\nrc=0\n", run_fresh("quickstart"))
end

-- docs/metrics.md -----------------------------------------------------------

CHECKS["metrics-quick"] = function()
  -- as written: five tasks, two clients, three waits; a valid exposition
  local P = require "spec.prom_text"
  local out = run_fresh("metrics-quick")
  local text, rc = out:match("^(.*)rc=(%d+)\n$")
  assert.equal("0", rc, out)
  local doc = assert(P.parse(text))
  assert.equal(2, P.value(doc, "clientpool_opened_total", { pool = "main" }))
  assert.equal(3, P.value(doc, "clientpool_waits_total", { pool = "main" }))
  assert.equal(3, P.value(doc, "clientpool_wait_duration_seconds_count", { pool = "main" }))
  local ok, promtool_out = P.promtool(text)
  assert.is_true(ok, promtool_out)
end

CHECKS["hosts-game"] = function()
  assert.equal("2\t8\nrc=0\n", run_fresh("hosts-game"))
end

-- The host programs that talk to Redis: 50 requests over at most 4
-- connections (fewer when redis answers before the next request starts),
-- and redis accepted exactly as many as the program reports.
local REDIS_HOSTS = {
  ["quickstart-cqueues"] = "cqueues", ["hosts-cqueues"] = "cqueues",
  ["hosts-luv"] = "luv", ["hosts-copas"] = "copas",
}
local redis, redis_err

local function redis_host_check(name)
  return function()
    local why = H.host_missing(REDIS_HOSTS[name])
    if why then return pending(why) end
    if not redis then return pending("no redis-server: " .. tostring(redis_err)) end
    local before = redis_connections(redis)
    local out = run_fresh(name, redis.port)
    local opened = tonumber(out:match("^(%d+)\nrc=0\n$"))
    assert(opened and opened >= 1 and opened <= 4, "the program printed:\n" .. out)
    -- this count's own connection is the one more
    assert.equal(opened, redis_connections(redis) - before - 1, "connections redis accepted for the program")
  end
end
for name in pairs(REDIS_HOSTS) do CHECKS[name] = redis_host_check(name) end

-- README API summary ----------------------------------------------------------

CHECKS["api"] = function()
  local made = 0
  local printed = {}
  local options = {
    create = function(key)
      made = made + 1
      local c = sim(key, made)
      function c.query(_, q) return q end
      return c
    end,
    destroy = function(c) c:close() end,
    max_live = 2, min_idle = 1, keys = { "db" }, max_idle = 2,
  }
  local env, vloop = sandbox { options = options, key = "db", outcome = "ok",
                               print = function(...) printed[#printed + 1] = table.concat({ ... }, " ") end }
  run_snippet("api", env, vloop, "pool, res, c, h, s, token", function(lp, pool, res, c, h, s, token)
    assert.equal("x", res)                         -- with() returned what fn returned
    assert.is_table(c)
    assert.is_number(h)
    assert.is_false(token:cancelled())
    assert.is_table(s.keys.db)
    assert.same({ nil, "closed" }, { pool:acquire("db") })
    lp.sleep(1)                                    -- run() returned at close; destroy hooks ran
    local after = pool:stats()
    assert.equal(0, after.live)
    assert.equal(0, after.leases)
    assert.equal(1, after.closed_by.error)         -- quick:destroy()
    assert.same({}, printed)                       -- no timeout happened
  end)
end

-- docs/api.md -----------------------------------------------------------------

CHECKS["checkout"] = function()
  local env, vloop = sandbox()
  local n = 0
  env.pool = env.clientpool.new { create = function(k) n = n + 1; return sim(k, n) end, max_live = 1 }
  env.key = "db"
  run_snippet("checkout", env, vloop, "client, h", function(_, client, h)
    assert.equal(1, client.id)
    assert.is_number(h)
    local s = env.pool:stats()
    assert.equal(0, s.leases)                      -- checked in
    assert.equal(1, s.idle)
    local again = env.pool:checkout("db")          -- the same client, reused
    assert.equal(client, again)
  end)
end

CHECKS["events"] = function()
  local printed = {}
  local env, vloop = sandbox { print = function(...) printed[#printed + 1] = table.concat({ ... }, " ") end }
  env.connect = function(k) return sim(k, 1) end
  run_snippet("events", env, vloop, "pool", function(lp, pool)
    local first = assert(pool:acquire("db"))
    lp.spawn(function() lp.sleep(2); first:release() end)
    local second = assert(pool:acquire("db"))      -- waits 2 s
    assert.same({ "waited 2.0 s for db" }, printed)
    lp.sleep(31)                                   -- held past leak_threshold
    assert.equal(2, #printed)
    assert.truthy(printed[2]:find("^held 30%.0 s; acquired\n"), printed[2])   -- and the traceback
    second:release()
    pool:close()
  end)
end

CHECKS["loop-virtual"] = function()
  local printed = {}
  local env = setmetatable({ clientpool = clientpool,
                             print = function(...) printed[#printed + 1] = { ... } end }, { __index = _G })
  local b = block("loop-virtual")
  local chunk = assert(compile(b.code .. "\nreturn vloop, pool", where(b), env))
  local vloop, pool = chunk()
  assert.equal(30, vloop.now())                    -- virtual seconds; no real wait
  assert.equal(1, #printed)
  assert.equal("timeout", printed[1][1])
  assert.equal("timeout after 30.000s (live=1, idle=0, active=1, waiting=1)", tostring(printed[1][2]))
  assert.equal(0, pool:stats().leases)
end

CHECKS["policy"] = function()
  local hits = 0
  local function connect_http(key)
    hits = hits + 1
    local c = sim(key, hits)
    function c.request(_, req)
      assert.are.equal("GET", req.method)
      return { status = 429, headers = { ["Retry-After"] = "5" } }   -- the origin says: slow down
    end
    return c
  end
  local env, vloop = sandbox { connect_http = connect_http, req = { method = "GET", path = "/" } }
  run_snippet("policy", env, vloop, "pool, lease, res", function(lp, pool, lease, res)
    assert.are.equal(429, res.status)
    assert.is_nil(lease.client)                  -- released
    local s = pool:stats()
    assert.are.equal("http 429", s.keys["api.example.com:443"].paused)
    assert.are.equal(false, s.paused)            -- only the origin (key)
    assert.are.equal(1, s.idle)
    -- an acquisition for that origin waits until the Retry-After has passed
    local t0 = lp.now()
    local l = assert(pool:acquire("api.example.com:443"))
    assert.are.equal(5, lp.now() - t0)
    assert.are.equal(false, pool:stats().keys["api.example.com:443"].paused)
    -- half-open (probe = true): this lease goes alone until it sees a 2xx
    assert.is_nil(pool:try_acquire("api.example.com:443"))
    l:observe({ status = 200 })
    l:release()
    local l2 = assert(pool:try_acquire("api.example.com:443"))
    l2:release()
    assert.are.equal(1, hits)                    -- one connection all along
    pool:close()
  end)
end

CHECKS["live"] = function()
  local made, pings = 0, 0
  local env, vloop = sandbox {
    connect = function(k) made = made + 1; return sim(k, made) end,
    close = function(c) c:close() end,
    ping = function(c) pings = pings + 1; return c.open end,
    key = "game",
  }
  run_snippet("live", env, vloop, "pool", function(lp, pool)
    assert.equal(16, pool._c.max_live)
    assert.equal(0.5, pool._c.acquire_timeout)
    assert.equal(30, pool._c.keepalive)
    lp.sleep(31)                                   -- the idle client is checked in the background
    assert.equal(1, pings)
    assert.equal(1, pool:stats().keepalive)
    pool:close()
  end)
end

CHECKS["drain"] = function()
  local env, vloop = sandbox()
  local n = 0
  env.pool = env.clientpool.new {
    create = function(key) n = n + 1; return sim(key, n) end,
    destroy = function(c) c:close() end,
    max_live = 2,
  }
  env.key = "api"
  local request = { aborted_at = nil }
  function request.abort(self) self.aborted = true end
  function request.run(self, client)             -- a 60 s call, in 0.1 s steps, unless aborted
    assert.is_true(client.open)
    for _ = 1, 600 do
      if self.aborted then self.aborted_at = vloop.now(); return false end
      vloop.sleep(0.1)
    end
    return true
  end
  env.request = request
  local drained
  env.print = function(what, ok, code) drained = { what = what, ok = ok, code = code } end
  local t0 = vloop.now()
  run_snippet("drain", env, vloop, "lease", function(lp, lease)
    while not drained do lp.sleep(0.1) end        -- drain runs in a task of its own
    assert.equal("drained", drained.what)
    assert.is_true(drained.ok)
    assert.is_nil(drained.code)
    assert.is_nil(lease.client)                  -- released by the request's task
    local took = lp.now() - t0
    assert.is_true(took >= 5 and took < 5.2, "drain took " .. took)
    local aborted = request.aborted_at - t0      -- the cancellation came at the grace
    assert.is_true(aborted >= 5 and aborted < 5.2, "aborted after " .. aborted)
    local s = env.pool:stats()
    assert.are.equal(0, s.live)
    assert.are.equal(0, s.leases)
    assert.are.equal(1, s.closed_by.error)       -- released with false
    assert.are.same({ nil, "closed" }, { env.pool:acquire(env.key) })
  end)
end

CHECKS["floor"] = function()
  local created = {}
  local env, vloop = sandbox()
  function env.connect(key)                      -- a 10 ms connect
    vloop.sleep(0.01)
    created[key] = (created[key] or 0) + 1
    return sim(key, created[key])
  end
  run_snippet("floor", env, vloop, "pool", function(lp, pool)
    lp.sleep(1)
    local s = pool:stats()
    assert.are.equal(4, s.keys["redis-a"].idle)
    assert.are.equal(4, s.keys["redis-b"].idle)
    assert.are.same({ ["redis-a"] = 4, ["redis-b"] = 4 }, created)
    -- a lost client is replaced
    local l = assert(pool:acquire("redis-a"))
    l:release(false)
    lp.sleep(1)
    assert.are.equal(4, pool:stats().keys["redis-a"].idle)
    pool:close()                                 -- run() returns: the loop's tasks all end
  end)
end

CHECKS["shared"] = function()
  local opened, printed = 0, {}
  local function connect_h2(key)
    opened = opened + 1
    return sim(key, opened)
  end
  local env, vloop = sandbox { connect_h2 = connect_h2,
                               print = function(...) printed[#printed + 1] = table.concat({ ... }, "\t") end }
  run_snippet("shared", env, vloop, "pool, a, b", function(_, pool, a, b)
    assert.are.equal(1, opened)                  -- one connection for both leases
    assert.is_true(b.lost)
    assert.are.same({ "stream b: connection lost" }, printed)  -- b's cancellation fired
    local s = pool:stats()
    assert.are.equal(0, s.live)
    assert.are.equal(0, s.leases)
    assert.is_nil(a.client)
    pool:close()
  end)
end

-- docs/design.md --------------------------------------------------------------

CHECKS["design-protocol"] = function()
  -- it asserts every step itself
  local b = block("design-protocol")
  local chunk = assert(compile(b.code, where(b), setmetatable({}, { __index = _G })))
  chunk()
end

---------------------------------------------------------------------------
-- The specs
---------------------------------------------------------------------------

-- make's targets, from the Makefile's rule heads: simple variables put in,
-- % and $(1) (a define's parameter) as wildcards; a head with any other
-- variable is left out.
local function make_targets()
  local text = read("Makefile")
  local vars = {}
  for name, value in text:gmatch("\n([%w_]+)%s*[:?]?=%s*([^\n]*)") do
    if vars[name] == nil then vars[name] = value end
  end
  local heads = {}
  for line in text:gmatch("[^\n]+") do
    local head = line:match("^([^%s#:=][^:=]*):[^=]") or line:match("^([^%s#:=][^:=]*):$")
    if head then
      head = head:gsub("%$%$?%(([%w_]+)%)", function(v)
        if v == "1" then return "\1" end
        return vars[v]
      end)
      if not head:find("$", 1, true) then
        for word in head:gmatch("%S+") do
          local pat = word:gsub("%%", "\1"):gsub("[%^%$%(%)%.%[%]%*%+%-%?]", "%%%0")
          heads[#heads + 1] = "^" .. pat:gsub("\1", ".+") .. "$"   -- (\1: a wildcard)
        end
      end
    end
  end
  return function(target)
    for _, p in ipairs(heads) do if target:match(p) then return true end end
    return false
  end
end

-- GitHub's anchor of a heading: lowercase, punctuation dropped, spaces as
-- hyphens; a repeated heading gets -1, -2, ...
local function anchors_of(path)
  local list, seen, fence = {}, {}, false
  for line in (read(path) .. "\n"):gmatch("([^\n]*)\n") do
    if line:match("^```") then
      fence = not fence
    elseif not fence then
      local h = line:match("^#+%s+(.-)%s*$")
      if h then
        local a = h:lower():gsub("[^%w%s_%-]", ""):gsub("%s", "-")
        local n = seen[a]
        seen[a] = (n or 0) + 1
        list[n and (a .. "-" .. n) or a] = true
      end
    end
  end
  return list
end

describe("documentation code blocks", function()
  it("every relative link names a file that exists, and a heading of it", function()
    for _, path in ipairs(FILES) do
      local dir = path:match("^(.*)/") or "."
      local prose, fence = {}, false
      for line in (read(path) .. "\n"):gmatch("([^\n]*)\n") do
        if line:match("^```") then fence = not fence elseif not fence then prose[#prose + 1] = line end
      end
      for target in table.concat(prose, "\n"):gmatch("%]%(([^)%s]+)%)") do
        if not target:match("^%a+:") then        -- not http:, https:, mailto:
          local file, anchor = target:match("^([^#]*)#?(.*)$")
          local full = file == "" and path or (dir .. "/" .. file):gsub("^%./", ""):gsub("[^/]+/%.%./", "")
          local f = io.open(full, "rb")
          assert(f, path .. ": a link to " .. target .. ": no file " .. full)
          f:close()
          if anchor ~= "" then
            assert(full:match("%.md$") and anchors_of(full)[anchor], path .. ": a link to " .. target ..
                   ": " .. full .. " has no heading #" .. anchor)
          end
        end
      end
    end
  end)

  it("every block declares a known language; every lua and nginx block is marked, once per name", function()
    local names = {}
    for _, b in ipairs(ALL) do
      assert(LANGS[b.lang], where(b) .. ": a code block must declare lua, nginx, sh or text, got '" .. b.lang .. "'")
      if b.mode and b.mode:match("^bad") then
        error(where(b) .. ": a malformed marker (" .. b.mode .. "); see docs/testing.md")
      end
      if b.lang == "lua" or b.lang == "nginx" then
        assert(b.mark, where(b) .. ": an unmarked ```" .. b.lang .. " block; mark it (docs/testing.md):\n" .. b.code)
      else
        assert(b.mark == nil, where(b) .. ": a marker on a ```" .. b.lang .. " block, which is not run")
      end
      if b.mark then
        assert(names[b.mark] == nil, where(b) .. ": the name '" .. b.mark .. "' is used at " .. tostring(names[b.mark]))
        names[b.mark] = where(b)
      end
      if b.mode == "parse" then assert(b.reason:match("%S"), where(b) .. ": a parse-only marker needs its reason") end
      if b.lang == "nginx" then assert(b.mode == "nginx", where(b) .. ": an nginx block runs in spec/nginx") end
    end
  end)

  it("every block run here has its check, and every check its block", function()
    for _, b in ipairs(ALL) do
      if b.mode == "run" then
        assert(CHECKS[b.mark], where(b) .. ": no check for spec:" .. b.mark .. " in spec/docs_spec.lua")
      end
    end
    for name in pairs(CHECKS) do
      local b = block(name)
      assert.equal("run", b.mode, where(b))
    end
  end)

  it("every block for spec/nginx is named there", function()
    local runner = read("spec/nginx/run.sh")
    for _, b in ipairs(ALL) do
      if b.mode == "nginx" then
        local quoted = b.mark:gsub("%p", "%%%0")
        assert(runner:find("doc_block " .. quoted .. "%f[^%w_%-]"), where(b) .. ": spec/nginx/run.sh never takes " ..
               "spec:" .. b.mark .. " (doc_block " .. b.mark .. ")")
      end
    end
  end)

  it("every Lua block parses", function()
    for _, b in ipairs(ALL) do
      if b.lang == "lua" then
        local f, err = compile(b.code, where(b), {})
        assert(f, err)
      end
    end
  end)

  it("sh blocks name make targets and files that exist", function()
    local is_target = make_targets()
    for _, b in ipairs(ALL) do
      if b.lang == "sh" then
        for line in (b.code .. "\n"):gmatch("([^\n]*)\n") do
          local cmd = line:gsub("#.*$", "")
          for part in cmd:gmatch("[^;&|]+") do          -- each command of the line
            local args = part:match("^%s*make%s+(.*)$") or part:match("^%s*[%w_]+=%S*%s+make%s+(.*)$")
            for target in (args or ""):gmatch("%S+") do
              if not target:find("=", 1, true) and not target:match("^%-") then
                assert(is_target(target), where(b) .. ": `make " .. target .. "`: no such target in the Makefile")
              end
            end
          end
          for path in cmd:gmatch("%f[%w%.]([%w_]+/[%w_%./%-]+)") do
            local top = path:match("^[^/]+")
            if top == "scripts" or top == "spec" or top == "rockspec" or top == "bench" or top == "examples" then
              assert(io.open(path, "rb"), where(b) .. ": " .. path .. " does not exist")
            end
          end
        end
      end
    end
  end)

  describe("each block does what the text says", function()
    setup(function() redis, redis_err = start_redis() end)
    teardown(function() stop_redis(redis); redis = nil end)

    local names = {}
    for name in pairs(CHECKS) do names[#names + 1] = name end
    table.sort(names)
    for _, name in ipairs(names) do
      local b = BY_NAME[name]
      it(name .. " (" .. (b and where(b) or "missing") .. ")", CHECKS[name])
    end
  end)
end)
