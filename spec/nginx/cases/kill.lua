-- Dead waiters never swallow a grant: light threads killed with
-- ngx.thread.kill, and requests aborted by their client, while they wait.
local H = require "harness"
local app = require "app"

local function counts(pool)
  local s = pool:stats()
  return { live = s.live, idle = s.idle, leases = s.leases, waiting = s.waiting }
end

local function waiter(pool, res, i, timeout)
  return ngx.thread.spawn(function()
    local l, code = pool:acquire(nil, timeout ~= false and { timeout = timeout or 5 } or nil)
    res[i] = l and "lease" or code
    if l then
      ngx.sleep(0.001)
      l:release()
    end
  end)
end

describe("a light thread killed while it waits", function()
  it("does not take the client released after its death", function()
    local pool = app.plain_pool("kill1", { max_live = 1 })
    local a = assert(pool:acquire())
    local res = {}
    local t = waiter(pool, res, 1)
    ngx.sleep(0.01)
    assert.are.equal(1, pool:stats().waiting)
    assert.truthy(ngx.thread.kill(t))
    a:release()
    -- the grant went back: the client is idle, and the next acquire gets it at once
    assert.are.same({ live = 1, idle = 1, leases = 0, waiting = 0 }, counts(pool))
    local b = assert(pool:try_acquire())
    b:release()
    assert.is_nil(res[1])
    assert.are.equal(1, pool:stats().cancelled)
  end)

  it("gives its max_waiting slot back at once, with no release to find it dead", function()
    local pool = app.plain_pool("kill0", { max_live = 1, max_waiting = 1 })
    local a = assert(pool:acquire())
    local res = {}
    local t = waiter(pool, res, 1, false)   -- no timeout: only a release would end it
    ngx.sleep(0.01)
    assert.truthy(ngx.thread.kill(t))
    local s = pool:stats()
    assert.are.equal(0, s.waiting)
    assert.are.equal(1, s.cancelled)
    local l, code = pool:acquire(nil, { timeout = 0.05 })   -- queues (not "full"), times out
    assert.is_nil(l)
    assert.are.equal("timeout", code)
    a:release()
    assert.are.same({ live = 1, idle = 1, leases = 0, waiting = 0 }, counts(pool))
    assert.are.equal(0, pool:stats().rejected)
  end)

  it("killed right after its wake was posted, before it ran, gives the grant back", function()
    local pool = app.plain_pool("kill2", { max_live = 1 })
    local a = assert(pool:acquire())
    local res = {}
    local t = waiter(pool, res, 1)
    ngx.sleep(0.01)
    a:release()          -- the wake is posted; the waiter runs later in this turn
    assert.truthy(ngx.thread.kill(t))
    assert.is_nil(res[1])
    -- the adapter finds the waiter gone with its wake and the driver takes the grant back
    assert.truthy(H.wait_until(function() return pool:stats().leases == 0 end, 2),
      "the grant was swallowed: leases=" .. pool:stats().leases)
    assert.are.same({ live = 1, idle = 1, leases = 0, waiting = 0 }, counts(pool))
    local b = assert(pool:try_acquire())
    b:release()
  end)

  -- A cancel token's wake carries no lost-wake callback; the grant's does.
  for _, order in ipairs { "cancel, then grant", "grant, then cancel" } do
    it("woken by its cancel token and a grant (" .. order .. "), killed before it ran, gives the grant back",
       function()
      local pool = app.plain_pool("kill-tok-" .. order:sub(1, 1), { max_live = 1 })
      local a = assert(pool:acquire())
      local res = {}
      local tok = require("clientpool").token()
      local t = ngx.thread.spawn(function()
        local l, code = pool:acquire(nil, { timeout = 5, cancel = tok })
        res[1] = l and "lease" or code
        if l then l:release() end
      end)
      ngx.sleep(0.01)
      if order == "cancel, then grant" then
        tok:cancel()
        a:release()
      else
        a:release()
        tok:cancel()
      end
      assert.truthy(ngx.thread.kill(t))
      assert.is_nil(res[1])
      assert.truthy(H.wait_until(function() return pool:stats().leases == 0 end, 2),
        "the grant was swallowed: leases=" .. pool:stats().leases)
      assert.are.same({ live = 1, idle = 1, leases = 0, waiting = 0 }, counts(pool))
    end)
  end

  it("keeps the queue moving when half of many waiters are killed", function()
    local pool, f = app.plain_pool("kill3", { max_live = 2, acquire_timeout = 5 })
    local a, b = assert(pool:acquire()), assert(pool:acquire())
    local res, threads = {}, {}
    for i = 1, 40 do threads[i] = waiter(pool, res, i) end
    ngx.sleep(0.01)
    assert.are.equal(40, pool:stats().waiting)
    for i = 1, 40, 2 do assert.truthy(ngx.thread.kill(threads[i])) end
    a:release()
    b:release()
    for i = 2, 40, 2 do ngx.thread.wait(threads[i]) end
    for i = 1, 40 do
      if i % 2 == 0 then assert.are.equal("lease", res[i], "waiter " .. i) else assert.is_nil(res[i]) end
    end
    assert.are.same({ live = 2, idle = 2, leases = 0, waiting = 0 }, counts(pool))
    assert.are.equal(2, f.created)
  end)

  it("killed while its wake and a kill race in many rounds, counts stay right", function()
    local pool = app.plain_pool("kill4", { max_live = 1 })
    for round = 1, 50 do
      local a = assert(pool:acquire())
      local res = {}
      local t1 = waiter(pool, res, 1)
      local t2 = waiter(pool, res, 2)
      ngx.sleep(0)
      if round % 2 == 0 then
        a:release()
        ngx.thread.kill(t1)
      else
        ngx.thread.kill(t1)
        a:release()
      end
      ngx.thread.wait(t2)
      assert.are.equal("lease", res[2], "round " .. round)
      assert.truthy(H.wait_until(function() return pool:stats().leases == 0 end, 2), "round " .. round)
    end
    assert.are.same({ live = 1, idle = 1, leases = 0, waiting = 0 }, counts(pool))
  end)
end)

-- The parked idle client's path (issue 17: unparked by acquire and
-- checkout without a grant record): a light thread killed while its unpark
-- hook yields holds a leak sentinel, whose collection gives the lease back.
describe("a light thread killed inside unpark", function()
  for _, form in ipairs { "acquire", "checkout" } do
    it("(" .. form .. ") gives its client back once collected", function()
      local leaks = 0
      local pool = app.plain_pool("kill_unpark_" .. form, {
        max_live = 1,
        park = function(c) return { parked = c } end,
        unpark = function(st) ngx.sleep(5); return st.parked end,
      })
      pool:on("leak", function() leaks = leaks + 1 end)
      assert(pool:acquire()):release()          -- one parked idle client
      local t = ngx.thread.spawn(function()
        if form == "acquire" then pool:acquire() else pool:checkout() end
      end)
      ngx.sleep(0.01)                           -- inside unpark's sleep
      assert.are.equal(1, pool:stats().leases)
      assert.truthy(ngx.thread.kill(t))
      t = nil -- luacheck: ignore t
      assert.truthy(H.wait_until(function()
        collectgarbage("collect")
        return pool:stats().leases == 0
      end, 2))
      assert.are.equal(1, leaks)
      local s = pool:stats()
      assert.are.equal(0, s.waiting)
      -- the capacity is back: the next acquisition gets a client at once
      local l = assert(pool:try_acquire())
      l:release()
      pool:close()
    end)
  end
end)

describe("a request aborted by its client while it waits", function()
  it("does not take the client (lua_check_client_abort on)", function()
    local pool = app.plain_pool("abort", { max_live = 1 })
    app.log["abort:abort_result"] = nil
    local a = assert(pool:acquire())
    local sock, first = H.http_open("/app/wait_abort?pool=abort&timeout=5")
    assert.are.equal("waiting", first)
    assert.truthy(H.wait_until(function() return pool:stats().waiting == 1 end, 2))
    sock:close()           -- the client goes away
    ngx.sleep(0.05)        -- nginx notices and finalizes that request
    a:release()
    assert.are.same({ live = 1, idle = 1, leases = 0, waiting = 0 }, counts(pool))
    assert.is_nil(app.log["abort:abort_result"])
    local b = assert(pool:try_acquire())
    b:release()
  end)

  it("aborted right after its wake was posted does not keep the grant", function()
    local pool = app.plain_pool("abort2", { max_live = 1 })
    local a = assert(pool:acquire())
    local sock, first = H.http_open("/app/wait_abort?pool=abort2&timeout=5")
    assert.are.equal("waiting", first)
    assert.truthy(H.wait_until(function() return pool:stats().waiting == 1 end, 2))
    sock:close()
    a:release()            -- most likely before nginx has seen the abort
    assert.truthy(H.wait_until(function() return pool:stats().leases == 0 end, 2))
    assert.are.same({ live = 1, idle = 1, leases = 0, waiting = 0 }, counts(pool))
  end)
end)
