-- The cap is physical in nginx too (issue 12, finding 1): max_live = 2,
-- 20 light threads acquiring and releasing (half of the releases with
-- false) while destroy hooks are slow (a 0.5 s pause, then QUIT), fail
-- (raise after closing) or are quick, at random. Counted where the
-- upstream is: the hooks (create increments, destroy's return or failure
-- decrements) and the connections redis-server sees (CLIENT SETNAME
-- cp-hardcap, sampled every 2 ms). Neither ever exceeds max_live.
local H = require "harness"
local clientpool = require "clientpool"
local app = require "app"

local NAME = "cp-hardcap"
local MAX_LIVE = 2

describe("the cap in nginx, with slow and failing destroys", function()
  it("hooks and redis never count more than max_live clients", function()
    math.randomseed(12)
    local f = { open = 0, max_open = 0, created = 0, slow = 0, failed = 0 }
    local pool = clientpool.new {
      max_live = MAX_LIVE, scheduler = "ngx", acquire_timeout = 10,
      create = function()
        local sock = ngx.socket.tcp()
        sock:settimeouts(1000, 2000, 2000)
        local ok, err = sock:connect("127.0.0.1", H.conf.redis_port)
        if not ok then return nil, err end
        if H.command(sock, "CLIENT", "SETNAME", NAME) ~= "OK" then sock:close(); return nil, "setname" end
        f.created = f.created + 1
        f.open = f.open + 1
        if f.open > f.max_open then f.max_open = f.open end
        return sock
      end,
      destroy = function(sock)
        local r = math.random(3)
        if r == 1 then                         -- a graceful QUIT after a slow half second
          f.slow = f.slow + 1
          ngx.sleep(0.5)
          H.command(sock, "QUIT")
          sock:close()
          f.open = f.open - 1
        elseif r == 2 then                     -- a destroy that fails (after closing)
          f.failed = f.failed + 1
          sock:close()
          f.open = f.open - 1
          error("destroy failed on purpose")
        else
          sock:close()
          f.open = f.open - 1
        end
      end,
    }
    app.pools.hard_cap = pool
    local stop = H.sample_clients(NAME, 0.002)
    local threads, errors = {}, {}
    for i = 1, 20 do
      threads[i] = ngx.thread.spawn(function()
        for _ = 1, 5 do
          local l, code = pool:acquire()
          if not l then errors[#errors + 1] = code else
            if H.command(l.client, "PING") ~= "PONG" then errors[#errors + 1] = "ping" end
            ngx.sleep(math.random() * 0.01)
            l:release(math.random(2) == 1)
          end
        end
      end)
    end
    for i = 1, 20 do assert(ngx.thread.wait(threads[i])) end
    assert.truthy(H.wait_until(function() return pool:stats().closing == 0 end, 5))
    pool:close()
    assert.truthy(H.wait_until(function() return pool:stats().live == 0 end, 5))
    local max_seen, samples = stop()
    ngx.say(string.format("# %d clients made, %d slow and %d failing destroys; at once: hooks %d, redis %d " ..
      "(%d samples)", f.created, f.slow, f.failed, f.max_open, max_seen, samples))
    assert.are.same({}, errors)
    assert.is_true(f.slow > 0 and f.failed > 0)
    assert.is_true(f.max_open <= MAX_LIVE, "the hooks counted " .. f.max_open)
    assert.is_true(max_seen <= MAX_LIVE, "redis saw " .. max_seen)
    assert.are.equal(0, f.open)
  end, 60)
end)
