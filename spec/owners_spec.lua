-- clientpool.owners: leases whose owner ended (the engine side of "a lease
-- ends with its request", issue 12). Simulated owners on the virtual
-- loop: an adapter with owner()/owner_alive()/watch_owners() whose owners
-- are tables a test ends by hand, as nginx frees a request. The real
-- thing runs in nginx (spec/nginx/cases/request_end.lua).

local clientpool = require "clientpool"
local H = require "spec.helpers"

-- The virtual loop plus owners: `current_owner` is the owner of leases
-- acquired now (nil: none); owner.ended = true ends it. watch_owners runs
-- its function every `poll` seconds in a background task.
local function owned_sched(poll)
  local loop = require("clientpool.loop").new { clock = "virtual" }
  local A = setmetatable({}, { __index = loop })
  A.current_owner = nil
  A.watches = 0
  function A.owner()
    local o = A.current_owner
    if o then return o, o.gen end
    return nil
  end
  function A.owner_alive(o, gen)
    return not o.ended and o.gen == gen
  end
  function A.watch_owners(fn, a)
    A.watches = A.watches + 1
    loop.background(function()
      repeat loop.sleep(poll or 0.002) until not fn(a)
    end)
    return true
  end
  return A, loop
end

local function owner() return { gen = 1 } end

describe("clientpool.owners (simulated owners, virtual clock)", function()
  it("a lease whose owner ended is given back as leaked when an acquisition would wait", function()
    local sched, loop = owned_sched()
    local f = H.factory(loop)
    local pool = clientpool.new { create = f.create, destroy = f.destroy, max_live = 1, scheduler = sched }
    local got
    H.schedulers()[1].run(loop, function()
      local o = owner()
      sched.current_owner = o
      local held = assert(pool:acquire())
      sched.current_owner = nil
      o.ended = true                        -- its request ended, the lease still held
      local t0 = loop.now()
      local l, code = pool:acquire(nil, { timeout = 1 })
      got = { lease = l, code = code, waited = loop.now() - t0 }
      assert.equal("clientpool.Lease (released)", tostring(held))   -- the old lease is finished
      if l then l:release() end
    end)
    assert.is_table(got.lease, tostring(got.code))
    assert.are.equal(0, got.waited)         -- at once
    local s = pool:stats()
    assert.are.equal(1, s.leaked)
    assert.are.equal(1, s.closed_by.leaked)
    assert.are.equal(2, f.created)
    assert.are.equal(1, f.destroyed)
    assert.are.equal(0, sched.watches)      -- nobody had to wait: no watch
    pool:close()
  end)

  it("a waiter queued before the owner ends gets the client within the watch's period", function()
    local sched, loop = owned_sched(0.002)
    local f = H.factory(loop)
    local pool = clientpool.new { create = f.create, destroy = f.destroy, max_live = 1, scheduler = sched }
    local leaks = 0
    pool:on("leak", function(_, info) if info.leaked then leaks = leaks + 1 end end)
    local o = owner()
    local res = {}
    local held
    H.schedulers()[1].run(loop, function()
      sched.current_owner = o
      -- held by o, never released; referenced, so that the collector does
      -- not give it back first (a lease dropped was collected before 0.5 s
      -- when lease_spec's allocation checks ran just before this spec)
      held = assert(pool:acquire())
      sched.current_owner = nil
      loop.spawn(function()
        local t0 = loop.now()
        local l, code = pool:acquire(nil, { timeout = 5 })
        res.lease, res.code, res.waited = l, code, loop.now() - t0
        if l then l:release() end
      end)
      loop.sleep(0.5)
      assert.are.equal(1, pool:stats().waiting)
      o.ended = true                        -- the holder's request ends at 0.5
      loop.sleep(1)
    end)
    assert.is_table(res.lease, tostring(res.code))
    assert.is_true(res.waited >= 0.5 and res.waited <= 0.5 + 0.002 + 1e-9, "waited " .. res.waited)
    assert.equal("clientpool.Lease (released)", tostring(held))   -- given back by the owners' watch
    assert.are.equal(1, leaks)
    assert.are.equal(1, sched.watches)
    pool:close()
  end)

  it("leaves leases of live owners and leases without an owner alone", function()
    local sched, loop = owned_sched()
    local f = H.factory(loop)
    local pool = clientpool.new { create = f.create, destroy = f.destroy, max_live = 2, scheduler = sched }
    local res = {}
    H.schedulers()[1].run(loop, function()
      sched.current_owner = owner()
      local a = assert(pool:acquire())      -- a live owner
      sched.current_owner = nil
      local b = assert(pool:acquire())      -- no owner (init_worker, SSL phases)
      res.l, res.code = pool:acquire(nil, { timeout = 0.1 })
      a:release()
      b:release()
    end)
    assert.is_nil(res.l)
    assert.are.equal("timeout", res.code)
    assert.are.equal(0, pool:stats().leaked)
    assert.are.equal(2, pool:stats().idle)
    pool:close()
  end)

  -- whatever the order owners come and go in (several at once; one after
  -- another, with or without a wait in between), an ended owner's lease is
  -- given back before a wait (a guard for any shortcut of before_wait's scan)
  it("gives back an ended owner's lease among several owners, and after the sole owner changed", function()
    local sched, loop = owned_sched()
    local f = H.factory(loop)
    local pool = clientpool.new { create = f.create, destroy = f.destroy, max_live = 2, scheduler = sched }
    local res = {}
    H.schedulers()[1].run(loop, function()
      local o1, o2, o3, o4 = owner(), owner(), owner(), owner()
      -- two owners hold a lease each; the second one ends
      sched.current_owner = o1
      local a = assert(pool:acquire())
      sched.current_owner = o2
      assert(pool:acquire())
      sched.current_owner = o1
      o2.ended = true
      local t0 = loop.now()
      local b, code = pool:acquire(nil, { timeout = 1 })
      res[1] = { lease = b, code = code, waited = loop.now() - t0 }
      a:release()
      if b then b:release() end
      -- a sole owner whose leases were all released, then another one's,
      -- which ends: without a wait in between (nothing held seen)...
      sched.current_owner = o3
      local c = assert(pool:acquire())
      local d = assert(pool:acquire())
      c:release()
      d:release()
      sched.current_owner = o4
      assert(pool:acquire())
      assert(pool:acquire())
      o4.ended = true
      sched.current_owner = o3
      t0 = loop.now()
      local e
      e, code = pool:acquire(nil, { timeout = 1 })
      res[2] = { lease = e, code = code, waited = loop.now() - t0 }
      if e then e:release() end
      -- ...and with one (a wait with nothing held forgets the owner)
      local g1 = assert(pool:acquire())
      local g2 = assert(pool:acquire())
      local l, why = pool:acquire(nil, { timeout = 0.01 })   -- waits: o3 holds both, alive
      res[3] = { lease = l, code = why }
      g1:release()
      g2:release()
      local o5 = owner()
      sched.current_owner = o5
      assert(pool:acquire())
      assert(pool:acquire())
      o5.ended = true
      sched.current_owner = nil
      t0 = loop.now()
      e, code = pool:acquire(nil, { timeout = 1 })
      res[4] = { lease = e, code = code, waited = loop.now() - t0 }
      if e then e:release() end
    end)
    for i = 1, 2 do
      assert.is_table(res[i].lease, i .. ": " .. tostring(res[i].code))
      assert.are.equal(0, res[i].waited)
    end
    assert.is_nil(res[3].lease)
    assert.are.equal("timeout", res[3].code)
    assert.is_table(res[4].lease, tostring(res[4].code))
    assert.are.equal(0, res[4].waited)
    -- o2's lease, o4's two, o5's two
    assert.are.equal(5, pool:stats().leaked)
    pool:close()
  end)

  it("drain() waiting for the lease of an owner that ends returns without the collector", function()
    local sched, loop = owned_sched(0.002)
    local f = H.factory(loop)
    local pool = clientpool.new { create = f.create, destroy = f.destroy, max_live = 2, scheduler = sched }
    local o = owner()
    local res = {}
    H.schedulers()[1].run(loop, function()
      sched.current_owner = o
      assert(pool:acquire())                -- never released
      sched.current_owner = nil
      loop.spawn(function()
        loop.sleep(0.3)
        o.ended = true
      end)
      local t0 = loop.now()
      res.ok, res.code = pool:drain(5)
      res.took = loop.now() - t0
    end)
    assert.is_true(res.ok, tostring(res.code))
    assert.is_true(res.took >= 0.3 and res.took <= 0.3 + 0.002 + 1e-9, "took " .. res.took)
    assert.are.equal(1, pool:stats().leaked)
    assert.are.equal(0, pool:stats().live)
  end)
end)
