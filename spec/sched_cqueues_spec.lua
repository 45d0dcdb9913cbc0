-- clientpool.sched.cqueues: the adapter contract, and a pool of real TCP
-- connections (cqueues.socket) to an echo server in the same controller, on
-- 127.0.0.1 and an ephemeral port.

local clientpool = require "clientpool"
local H = require "spec.helpers"
local contract = require "spec.sched_contract"

local S, missing = H.host("cqueues")

describe("clientpool.sched.cqueues", function()
  if not S then
    pending("not run: " .. missing)
    return
  end

  local cqueues = require "cqueues"
  local socket = require "cqueues.socket"
  local csched = require "clientpool.sched.cqueues"
  local function T(x) return x * S.scale end

  contract(S, { describe = describe, it = it, after_each = after_each, assert = assert })

  describe("controllers", function()
    it("new() rejects what is not a controller", function()
      assert.has_error(function() csched.new({}) end)
      assert.has_error(function() csched.new(42) end)
    end)

    it("current() in a coroutine no controller runs gives nil and a reason", function()
      local sched = S.new()
      local co = coroutine.create(function() return sched.current() end)
      local _, h, why = coroutine.resume(co)
      assert.is_nil(h)
      assert.is_truthy(tostring(why):find("cqueues", 1, true))
    end)

    it("the default instance waits in the running controller; a pool uses it by name", function()
      local cq = cqueues.new()
      local got
      local pool = clientpool.new { create = function() return {} end, max_live = 1, scheduler = "cqueues" }
      local held = assert(pool:acquire())
      cq:wrap(function()
        local t0 = cqueues.monotime()
        local l, code = pool:acquire(nil, { timeout = T(1) })
        got = { l, code, cqueues.monotime() - t0 }
      end)
      cq:wrap(function()
        cqueues.sleep(T(0.5))
        assert(csched.wake(coroutine.running()))
      end)
      assert(cq:loop())
      assert.is_nil(got[1])
      assert.equal("timeout", got[2])
      H.time(S, 1, got[3], "the timeout")
      held:release()
      pool:close()
      assert(cq:loop())
    end)

    it("a pool's timer thread ends at close, so cq:loop() returns", function()
      local cq = cqueues.new()
      local sched = csched.new(cq)
      local pool = clientpool.new { create = function() return {} end, max_live = 2,
                                    idle_timeout = 3600, scheduler = sched }
      cq:wrap(function()
        local l = assert(pool:acquire())
        l:release()              -- idle: the timer thread waits for its expiry
        cqueues.sleep(T(0.2))
        pool:close()
      end)
      local t0 = cqueues.monotime()
      assert(cq:loop())
      assert.is_true(cq:empty())
      assert.is_true(cqueues.monotime() - t0 < 60)
    end)
  end)

  describe("with TCP connections", function()
    -- An echo server: every line comes back. accepted counts connections.
    local function echo_server(cq)
      local srv = assert(socket.listen { host = "127.0.0.1", port = 0, reuseaddr = true })
      assert(srv:listen())
      local _, host, port = srv:localname()
      local server = { host = host, port = port, accepted = 0, open = 0, stop = false }
      cq:wrap(function()
        while not server.stop do
          local con = srv:accept(0.02)
          if con then
            server.accepted = server.accepted + 1
            server.open = server.open + 1
            cq:wrap(function()
              con:setmode("tl", "tl")
              -- (no `for line in con:lines()`: Lua 5.1 cannot yield in an iterator)
              local line = con:read("*l")
              while line do
                con:write(line, "\n")
                con:flush()
                line = con:read("*l")
              end
              con:close()
              server.open = server.open - 1
            end)
          end
        end
        srv:close()
      end)
      return server
    end

    -- A pool whose clients are connections to the server.
    local function tcp_pool(sched, server, o)
      local opts = {
        create = function()
          local con = socket.connect { host = server.host, port = server.port }
          local ok, err = con:connect(T(100))
          if not ok then return nil, err end
          con:setmode("tl", "tl")
          return con
        end,
        destroy = function(con) con:close() end,
        max_live = 1, scheduler = sched,
      }
      for k, v in pairs(o or {}) do opts[k] = v end
      return clientpool.new(opts)
    end

    local function request(con, line)
      assert(con:write(line, "\n"))
      assert(con:flush())
      return con:read("*l")
    end

    local cq, sched, server
    before_each(function()
      sched = S.new()
      cq = sched.controller()
      server = echo_server(cq)
    end)
    after_each(function()
      server.stop = true
      assert(cq:loop())  -- the server thread and its connections end
      assert.equal(0, server.open)
    end)

    -- the cases every host runs: spec/sched_tcp_cases.lua
    require "spec.sched_tcp_cases" {
      it = it, assert = assert, S = S, tcp_pool = tcp_pool, request = function(_, c, line) return request(c, line) end,
      get = function() return sched, server end,
    }
  end)
end)
