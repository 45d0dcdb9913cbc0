-- The warm floor in a real nginx (issue 4). app.init_worker starts the pool
-- of spec/nginx/floor/redis_pool.lua (min_idle = 2) as docs/hosts.md's init_worker
-- block does: ngx.timer.at(0, function() pool:run() end). spec/nginx/run.sh
-- checks that redis sees its two connections before the first request; here:
-- they are parked in nginx's keepalive pool, requests pick them up, and the
-- floor refills after losses. Runs before any other case touches that pool.
local H = require "harness"
local clientpool = require "clientpool"
local cpngx = require "clientpool.ngx"

local pool = require "redis_pool"
local mgr = require "redis_pool.manager"
local MIN_IDLE = require "redis_pool.min_idle"
local NAME = "cp-floor-" .. ngx.worker.pid()

-- ids of the redis clients named name
local function client_ids(r, name)
  local ids = {}
  for line in assert(r:cmd("CLIENT", "LIST")):gmatch("[^\n]+") do
    if line:match(" name=(%S*)") == name then ids[#ids + 1] = line:match("^id=(%d+)") end
  end
  return ids
end

describe("the warm floor started in init_worker", function()
  it("parked min_idle connections in nginx's keepalive pool before any request used the pool", function()
    local s = pool:stats()
    assert.are.equal(MIN_IDLE, s.idle)
    assert.are.equal(MIN_IDLE, s.live)
    assert.are.equal(MIN_IDLE, s.opened)
    assert.are.equal(0, s.reused)
    assert.are.equal(MIN_IDLE, mgr.stats.connects)
    assert.are.equal(MIN_IDLE, mgr.stats.parked)
    local r = assert(H.redis())
    assert.are.equal(MIN_IDLE, r:clients(NAME))
    r:close()
  end)

  it("a request takes a floor connection from nginx's pool (no connect); the floor refills behind it", function()
    local status, body = H.http("/app/redis_ping?pool=floor")
    assert.are.equal(200, status, body)
    local reused = tonumber(body:match("^PONG reused=(%d+)"))
    assert.truthy(reused, body)
    assert.is_true(reused >= 1, body)              -- a parked connection, made by the floor
    assert.are.equal(1, pool:stats().reused)
    -- while the request held it, idle fell below min_idle: one more was made
    assert.truthy(H.wait_until(function() return pool:stats().idle == MIN_IDLE + 1 end, 2))
    assert.are.equal(MIN_IDLE + 1, mgr.stats.connects)
    local r = assert(H.redis())
    assert.are.equal(MIN_IDLE + 1, r:clients(NAME))
    r:close()
  end)

  it("pool:retire() closes the idle connections; the floor opens min_idle fresh ones", function()
    local r = assert(H.redis())
    local before = client_ids(r, NAME)
    assert.are.equal(MIN_IDLE + 1, #before)
    pool:retire()
    assert.truthy(H.wait_until(function()
      local now = client_ids(r, NAME)
      if #now ~= MIN_IDLE then return false end
      for _, id in ipairs(now) do
        for _, old in ipairs(before) do if id == old then return false end end
      end
      return true
    end, 3), "redis does not see " .. MIN_IDLE .. " fresh connections")
    local s = pool:stats()
    assert.are.equal(MIN_IDLE, s.idle)
    assert.are.equal(MIN_IDLE + 1, s.closed_by.retired)
    assert.are.equal(MIN_IDLE + 1, mgr.stats.closed_parked)
    r:close()
  end)

  it("floor connections outlive idle_timeout, in the pool and in nginx's keepalive pool", function()
    local opts, m = cpngx.tcp {
      host = "127.0.0.1", port = H.conf.redis_port, connect_timeout = 1, scheduler = "ngx",
      on_connect = function(sock) return H.command(sock, "CLIENT", "SETNAME", "cp-floor-idle") end,
      max_live = 4, min_idle = 2, idle_timeout = 0.2,
    }
    local p = clientpool.new(opts)
    local ended
    ngx.timer.at(0, function() p:run(); ended = true end)
    local r = assert(H.redis())
    assert.truthy(H.wait_until(function() return r:clients("cp-floor-idle") == 2 end, 2))
    ngx.sleep(0.6)                                  -- three idle timeouts
    assert.are.equal(2, p:stats().idle)
    assert.are.equal(2, r:clients("cp-floor-idle"))
    assert.are.equal(2, m.stats.connects)
    local l = assert(p:acquire())
    assert.is_true(l.client:getreusedtimes() >= 1)  -- still parked in nginx
    l:release()
    assert.are.equal(0, m.stats.lost)
    -- close() ends run() and closes the parked connections
    p:close()
    assert.truthy(H.wait_until(function() return ended end, 2))
    assert.truthy(H.wait_until(function() return r:clients("cp-floor-idle") == 0 end, 2))
    r:close()
  end)
end)
