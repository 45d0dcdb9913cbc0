-- The README's snippets for protocol policies, drain, the warm floor and
-- shared leases run (issue 4: "README documents each feature with a snippet
-- that a spec runs").
--
-- Every code block of those sections is marked in README.md with an HTML
-- comment on the line before it, <!-- spec:NAME -->. The Lua ones run here as
-- written, on a virtual clock (clientpool.loop.new{ clock = "virtual" }), with
-- simulated clients: their free names (connect, connect_http, req, pool, key,
-- request, ...) are stubs in the chunk's environment, `loop` is the virtual
-- loop and `clientpool.new` uses it unless the snippet names a scheduler. Each
-- chunk gets a `return` of its locals appended, so the spec can check what it
-- did. The nginx block (nginx-floor) runs in spec/nginx/run.sh, which takes it
-- from README.md as it is.

local clientpool = require "clientpool"
local cploop = require "clientpool.loop"

local unpack = table.unpack or unpack -- luacheck: ignore 143

local SECTIONS = { "Protocol policy and pause", "Drain", "Warm floor", "Shared leases" }

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-- The lines of section `title` ("### title" up to the next heading).
local function section(text, title)
  local lines, inside = {}, false
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    if line:match("^#+ ") then
      if inside then break end
      inside = line == "### " .. title
    elseif inside then
      lines[#lines + 1] = line
    end
  end
  assert(inside or #lines > 0, "README.md has no section '### " .. title .. "'")
  return lines
end

-- The fenced code blocks of a section: { lang, code, mark } (mark: the
-- NAME of a <!-- spec:NAME --> on the line before the fence, or nil).
local function blocks(lines)
  local list, cur, prev = {}, nil, nil
  for _, line in ipairs(lines) do
    if cur then
      if line:match("^```%s*$") then
        list[#list + 1] = cur
        cur = nil
      else
        cur.code[#cur.code + 1] = line
      end
    else
      local lang = line:match("^```(%w*)")
      if lang then
        cur = { lang = lang, code = {}, mark = prev and prev:match("^<!%-%- spec:([%w_%-]+) %-%->$") }
      end
    end
    prev = line
  end
  assert(cur == nil, "an unclosed code block")
  for _, b in ipairs(list) do b.code = table.concat(b.code, "\n") end
  return list
end

local README = read("README.md")
local SNIPPETS, ALL = {}, {}
for _, title in ipairs(SECTIONS) do
  for _, b in ipairs(blocks(section(README, title))) do
    b.section = title
    ALL[#ALL + 1] = b
    if b.mark then SNIPPETS[b.mark] = b end
  end
end

-- Compiles code with env as its globals (Lua 5.1 and LuaJIT: setfenv).
local function compile(code, name, env)
  local setfenv_, loadstring_ = rawget(_G, "setfenv"), rawget(_G, "loadstring")
  if setfenv_ and loadstring_ then
    local f = assert(loadstring_(code, "=README:" .. name))
    return setfenv_(f, env)
  end
  return assert(load(code, "=README:" .. name, "t", env))
end

-- A fresh virtual loop, a clientpool whose new() uses it, and an
-- environment for a snippet: the stubs given, over _G.
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

-- Runs snippet `name` as a task of the sandbox's loop with `ret` (a list of
-- the snippet's locals) returned, then after(vloop, results...) in the same
-- task; runs the loop until every task is done.
local function run_snippet(name, env, vloop, ret, after)
  local b = assert(SNIPPETS[name], "README.md has no <!-- spec:" .. name .. " --> block")
  local chunk = compile(b.code .. "\nreturn " .. ret, name, env)
  local done = false
  vloop.spawn(function()
    local r = { n = 0 }
    local function keep(...) r = { n = select("#", ...), ... } end
    keep(chunk())
    after(vloop, unpack(r, 1, r.n))
    done = true
  end)
  vloop.run()
  assert.is_true(done, "the snippet's task did not finish")
end

-- A simulated client: a table with an id, closed by destroy.
local function sim(key, n)
  return { id = n, key = key, open = true, close = function(self) self.open = false end }
end

describe("README snippets", function()
  it("every code block of the policy, drain, warm floor and shared leases sections is marked for a spec", function()
    local marks = {}
    for _, b in ipairs(ALL) do
      assert.is_string(b.mark, "an unmarked ```" .. b.lang .. " block in '" .. b.section .. "':\n" .. b.code)
      assert.is_nil(marks[b.mark], "two blocks marked " .. b.mark)
      marks[b.mark] = b.lang
    end
    assert.are.same({ policy = "lua", drain = "lua", floor = "lua", shared = "lua", ["nginx-floor"] = "nginx" },
                    marks)
    -- the nginx block is the one spec/nginx/run.sh puts in its nginx.conf
    assert.truthy(read("spec/nginx/run.sh"):find("<!-- spec:nginx-floor -->", 1, true))
  end)

  it("policy: a 429 with Retry-After: 5 pauses the origin; it resumes by itself 5 s later, half-open", function()
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
  end)

  it("drain: on_drain = { cancel = 5 } aborts the request 5 s after drain starts; drain returns then", function()
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
      local ok, code = drained.ok, drained.code
      assert.is_true(ok)
      assert.is_nil(code)
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
  end)

  it("warm floor: run() keeps min_idle idle clients for each warm key and returns at close()", function()
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
  end)

  it("shared leases: two leases share one client; one's release(false) loses it for both", function()
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
  end)
end)
