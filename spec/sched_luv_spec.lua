-- clientpool.sched.luv: the adapter contract, and a pool of real TCP
-- connections (luv tcp handles) to an echo server on the same uv loop, on
-- 127.0.0.1 and an ephemeral port.

local clientpool = require "clientpool"
local H = require "spec.helpers"
local contract = require "spec.sched_contract"

local S, missing = H.host("luv")

describe("clientpool.sched.luv", function()
  if not S then
    pending("not run: " .. missing)
    return
  end

  local uv = require "luv"
  local lsched = require "clientpool.sched.luv"
  local function T(x) return x * S.scale end

  contract(S, { describe = describe, it = it, after_each = after_each, assert = assert })

  describe("the default instance", function()
    it("sched.run() leaves nothing that crashes the process at exit", function()
      -- a fresh interpreter: the crash (SIGSEGV in luv's loop finalizer, from
      -- a handle run() closed without another loop turn) comes at lua_close
      local code = "local S = require 'clientpool.sched.luv'; S.spawn(function() S.sleep(0.01) end); " ..
                   "S.run(); io.write('done ')"
      local out = H.run_fresh('-e "' .. code .. '"')
      assert.equal("done rc=0\n", out)
    end)

    it("runs under a plain uv.run(); a pool finds it by name", function()
      local got = {}
      local pool = clientpool.new { create = function() return {} end, max_live = 1, scheduler = "luv" }
      local held = assert(pool:acquire())
      lsched.spawn(function()
        local t0 = lsched.now()
        got.l, got.code = pool:acquire(nil, { timeout = T(1) })
        got.waited = lsched.now() - t0
        got.l2 = pool:acquire(nil, { timeout = T(100) }) -- served by the release below
      end)
      lsched.spawn(function()
        lsched.sleep(T(2))
        held:release()
      end)
      uv.run()
      assert.is_nil(got.l)
      assert.equal("timeout", got.code)
      H.time(S, 1, got.waited, "the timeout")
      assert.is_table(got.l2)
      got.l2:release()
      pool:close()
      uv.run()
    end)

    it("logs a task's error under a plain uv.run() and goes on", function()
      local sched = S.new()
      local logs, after = {}, false
      sched.log = function(m) logs[#logs + 1] = tostring(m) end
      sched.spawn(function() error("luv task boom") end)
      sched.spawn(function() sched.sleep(T(0.1)); after = true end)
      uv.run()
      assert.is_true(after)
      assert.equal(1, #logs)
      assert.is_truthy(logs[1]:find("luv task boom", 1, true), logs[1])
    end)

    it("run() reports tasks that wait and nothing can wake", function()
      local sched = S.new()
      sched.spawn(function() sched.wait(sched.current()) end)
      local ok, err = pcall(sched.run)
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find("deadlock", 1, true), tostring(err))
    end)

    it("await() returns what a luv callback got, inside a pool hook too", function()
      local got = {}
      local sched = S.new()
      local pool = clientpool.new {
        create = function()
          return { fired = sched.await(function(cb)
            local t = uv.new_timer()
            uv.update_time() -- a uv timer counts from the loop's cached time
            t:start(math.ceil(T(1) * 1000), 0, function() t:close(); cb("fired", 42) end)
          end) }
        end,
        max_live = 1, scheduler = sched,
      }
      S.run(sched, function()
        local t0 = sched.now()
        got.r = { sched.await(function(cb) cb("at once") end) }
        local l = assert(pool:acquire())
        got.elapsed = sched.now() - t0
        got.fired = l.client.fired
        l:release()
        pool:close()
      end)
      assert.same({ "at once" }, got.r)
      assert.equal("fired", got.fired)
      -- libuv counts timers in whole milliseconds of its cached loop time:
      -- its timer may fire up to 1 ms early by the monotonic clock
      H.time(S, 1, got.elapsed + 0.001, "create")
    end)
  end)

  describe("with TCP connections", function()
    -- An echo server on the default loop; accepted counts connections.
    local function echo_server()
      local srv = uv.new_tcp()
      assert(srv:bind("127.0.0.1", 0))
      local server = { port = srv:getsockname().port, accepted = 0, open = 0 }
      assert(srv:listen(64, function(err)
        if err then return end
        local c = uv.new_tcp()
        if not srv:accept(c) then
          c:close()
          return
        end
        server.accepted = server.accepted + 1
        server.open = server.open + 1
        c:read_start(function(rerr, data)
          if rerr or not data then
            c:close()
            server.open = server.open - 1
          else
            c:write(data)
          end
        end)
      end))
      function server.close() srv:close() end
      return server
    end

    -- A line client over a luv tcp handle, waiting through the adapter.
    local function connect(sched, port)
      local tcp = uv.new_tcp()
      local err = sched.await(function(cb) tcp:connect("127.0.0.1", port, cb) end)
      if err then
        tcp:close()
        return nil, err
      end
      local c = { tcp = tcp, buf = "", eof = false, reader = nil }
      tcp:read_start(function(rerr, data)
        if rerr or not data then c.eof = true else c.buf = c.buf .. data end
        local h = c.reader
        if h then
          c.reader = nil
          sched.wake(h)
        end
      end)
      return c
    end

    local function request(sched, c, line)
      c.tcp:write(line .. "\n")
      local h = sched.current()
      while not c.buf:find("\n", 1, true) and not c.eof do
        c.reader = h
        sched.wait(h)
      end
      local reply, rest = c.buf:match("^(.-)\n(.*)$")
      c.buf = rest or ""
      return reply
    end

    local function tcp_pool(sched, server, o)
      local opts = {
        create = function() return connect(sched, server.port) end,
        destroy = function(c) if not c.tcp:is_closing() then c.tcp:close() end end,
        max_live = 1, scheduler = sched,
      }
      for k, v in pairs(o or {}) do opts[k] = v end
      return clientpool.new(opts)
    end

    local server, sched
    before_each(function()
      server = echo_server()
      sched = S.new()
    end)
    after_each(function()
      server.close()
      uv.run() -- the closes go through; nothing is left on the loop
      assert.equal(0, server.open)
      S.finish()
    end)

    -- the cases every host runs: spec/sched_tcp_cases.lua
    require "spec.sched_tcp_cases" {
      it = it, assert = assert, S = S, tcp_pool = tcp_pool, request = request,
      get = function() return sched, server end,
    }
  end)
end)
