-- clientpool.sched.copas: the adapter contract, and a pool of real TCP
-- connections (LuaSocket driven by copas) to a copas echo server in the same
-- process, on 127.0.0.1 and an ephemeral port. Debian's copas installs for
-- Lua 5.1 (LuaJIT loads it too); elsewhere this spec is pending.

local clientpool = require "clientpool"
local H = require "spec.helpers"
local contract = require "spec.sched_contract"

local S, missing = H.host("copas")

describe("clientpool.sched.copas", function()
  if not S then
    pending("not run: " .. missing)
    return
  end

  local copas = require "copas"
  local socket = require "socket"
  local csched = require "clientpool.sched.copas"
  local function T(x) return x * S.scale end

  contract(S, { describe = describe, it = it, after_each = after_each, assert = assert })

  describe("copas coroutines", function()
    it("a coroutine copas runs (copas.addthread) waits in the pool and is handed back to copas", function()
      local sched = S.new()
      local pool = clientpool.new { create = function() return {} end, max_live = 1, scheduler = sched }
      local held = assert(pool:acquire())
      local got = {}
      copas.addthread(function()   -- copas 1.x runs it at once, up to its first wait
        local t0 = sched.now()
        got.l, got.code = pool:acquire(nil, { timeout = T(1) })
        got.waited = sched.now() - t0
        local l = assert(pool:acquire(nil, { timeout = T(100) }))
        got.second = true
        l:release()
      end)
      S.run(sched, function()
        sched.sleep(T(2))
        held:release()
        while not got.second do sched.sleep(T(0.1)) end
      end)
      assert.is_nil(got.l)
      assert.equal("timeout", got.code)
      H.time(S, 1, got.waited, "the timeout")
      assert.is_true(got.second)
      pool:close()
    end)

    it("step() runs ready tasks and polls copas at most the given time", function()
      local sched = S.new()
      local ran = false
      sched.spawn(function() ran = true end)
      local t0 = sched.now()
      sched.step(T(1))
      assert.is_true(ran)
      sched.step(T(1))                 -- nothing ready: copas polls for up to T(1)
      assert.is_true(sched.now() - t0 < 60)
      csched.step(0)
    end)
  end)

  describe("with TCP connections", function()
    -- A copas echo server; accepted counts connections.
    local function echo_server()
      local srv = assert(socket.bind("127.0.0.1", 0))
      local _, port = srv:getsockname()
      local server = { port = port, accepted = 0, open = 0 }
      copas.addserver(srv, function(skt)
        server.accepted = server.accepted + 1
        server.open = server.open + 1
        while true do
          local line = copas.receive(skt, "*l")
          if not line then break end
          copas.send(skt, line .. "\n")
        end
        server.open = server.open - 1
      end)                            -- copas closes skt when the handler returns
      function server.close() srv:close() end
      return server
    end

    local function connect(port)
      local skt = socket.tcp()
      local ok, err = copas.connect(skt, "127.0.0.1", port)
      if not ok and err ~= "already connected" then
        skt:close()
        return nil, err
      end
      return skt
    end

    local function request(skt, line)
      assert(copas.send(skt, line .. "\n"))
      return copas.receive(skt, "*l")
    end

    local function tcp_pool(sched, server, o)
      local opts = {
        create = function() return connect(server.port) end,
        destroy = function(skt) skt:close() end,
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
      -- let the server's handlers see the closes
      local t_end = sched.now() + 5
      while server.open > 0 and sched.now() < t_end do copas.step(0.01) end
      server.close()
      assert.equal(0, server.open)
    end)

    -- the cases every host runs: spec/sched_tcp_cases.lua
    require "spec.sched_tcp_cases" {
      it = it, assert = assert, S = S, tcp_pool = tcp_pool, request = function(_, c, line) return request(c, line) end,
      get = function() return sched, server end,
    }

    -- issue 12, finding 7: a server handler whose last resume was for its
    -- pooled socket (it waited for the upstream's reply, then answered
    -- without blocking) ended in copas' resume, and copas' autoclose
    -- closed that socket, idle in the pool by then: the next handler got
    -- a closed socket and never answered.
    it("copas server handlers that use the pool: 20 clients x 10 connections, max_live = 2, 200 of 200 replies",
       function()
      local replies, bad, handled = 0, {}, 0
      local pool = tcp_pool(sched, server, { max_live = 2 })
      local fsrv = assert(socket.bind("127.0.0.1", 0))
      local _, fport = fsrv:getsockname()
      copas.addserver(fsrv, function(skt)
        local line = copas.receive(skt, "*l")
        if not line then return end
        local l, code = pool:acquire(nil, { timeout = T(1000) })
        if not l then copas.send(skt, "err " .. tostring(code) .. "\n"); return end
        local r = request(l.client, line)    -- the last wait: the pooled socket
        l:release(r ~= nil)
        copas.send(skt, tostring(r) .. "\n")  -- (a short answer: no wait)
        handled = handled + 1
      end)
      S.run(sched, function()
        local done = 0
        for i = 1, 20 do
          sched.spawn(function()
            for j = 1, 10 do
              local c = assert(connect(fport))
              local want = "q " .. i .. " " .. j
              local got = request(c, want)
              c:close()
              if got == want then replies = replies + 1 else bad[#bad + 1] = tostring(got) end
            end
            done = done + 1
          end)
        end
        local t_end = sched.now() + T(3000)
        while done < 20 and sched.now() < t_end do sched.sleep(T(0.1)) end
      end)
      fsrv:close()
      assert.are.same({}, bad)
      assert.equal(200, replies)
      assert.equal(200, handled)
      local s = H.check(pool)
      assert.is_true(s.opened <= 2, "opened " .. s.opened)   -- nothing lost: the two are reused
      assert.equal(0, s.leases)
      pool:close()
    end)
  end)
end)
