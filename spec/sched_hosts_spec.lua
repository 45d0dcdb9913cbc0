-- Host traps (issue 12, finding 8): a pool with no scheduler named, used
-- under another host. Made inside a cqueues controller (or a luv callback)
-- it uses that host's adapter; made elsewhere and waiting inside one, its
-- acquire raises a clientpool: error naming the scheduler option, not a
-- foreign "attempt to yield from outside a coroutine" from cq:loop().

local clientpool = require "clientpool"

local function plain_opts(o)
  local f = { created = 0, destroyed = 0 }
  local opts = {
    max_live = 1,
    create = function() f.created = f.created + 1; return { id = f.created } end,
    destroy = function() f.destroyed = f.destroyed + 1 end,
  }
  for k, v in pairs(o or {}) do opts[k] = v end
  return opts, f
end

describe("a pool with no scheduler named", function()
  local has_cq, cqueues = pcall(require, "cqueues")

  describe("under cqueues", function()
    if not has_cq then
      pending("not run: no cqueues for " .. _VERSION)
      return
    end

    it("made outside any controller, raises a clientpool: error naming scheduler = \"cqueues\" when it would wait",
       function()
      local opts = plain_opts()
      local pool = clientpool.new(opts)
      local cq = cqueues.new()
      local err, held
      cq:wrap(function()
        held = assert(pool:acquire())
        local ok, e = pcall(pool.acquire, pool)
        err = not ok and e or "returned"
      end)
      local ok, lerr = cq:loop()
      assert.is_true(ok, tostring(lerr))                 -- nothing foreign reached cqueues
      assert.is_string(err)
      assert.truthy(err:find("clientpool: acquire would wait", 1, true), err)
      assert.truthy(err:find('scheduler = "cqueues"', 1, true), err)
      held:release()
      assert.are.equal(1, pool:stats().idle)             -- nothing lost
      pool:close()
    end)

    it("made inside a controller, uses it: a waiter is served, the pool's timer runs there", function()
      local cq = cqueues.new()
      local pool, f, order = nil, nil, {}
      cq:wrap(function()
        local opts
        opts, f = plain_opts { idle_timeout = 0.05 }
        pool = clientpool.new(opts)
        local a = assert(pool:acquire())
        cq:wrap(function()
          local b = assert(pool:acquire(nil, { timeout = 5 }))   -- waits in this controller
          order[#order + 1] = "b got it"
          b:release()
        end)
        cqueues.sleep(0.01)
        order[#order + 1] = "a releases"
        a:release()
      end)
      local ok, err = cq:loop(5)
      assert.is_true(ok, tostring(err))
      assert.are.same({ "a releases", "b got it" }, order)
      assert.are.equal(require("clientpool.sched.cqueues"), pool._sched)
      -- the idle client was retired at idle_timeout by the pool's timer,
      -- a thread of that controller: cq:loop() ran it
      assert.are.equal(1, f.created)
      assert.are.equal(1, f.destroyed)
      assert.are.equal(0, pool:stats().live)
      pool:close()
    end)
  end)

  describe("under luv", function()
    local has_uv, uv = pcall(require, "luv")
    if not has_uv then
      pending("not run: no luv for " .. _VERSION)
      return
    end

    it("made outside uv.run, raises a clientpool: error naming scheduler = \"luv\" when it would wait in a callback",
       function()
      local pool = clientpool.new(plain_opts())
      local err, held
      local t = uv.new_timer()
      t:start(0, 0, function()
        t:close()
        coroutine.wrap(function()
          held = assert(pool:acquire())
          local ok, e = pcall(pool.acquire, pool)
          err = not ok and e or "returned"
        end)()
      end)
      uv.run()
      assert.is_string(err)
      assert.truthy(err:find('scheduler = "luv"', 1, true), err)
      held:release()
      pool:close()
    end)

    it("made in a luv callback, uses the luv adapter", function()
      local pool
      local t = uv.new_timer()
      t:start(0, 0, function()
        t:close()
        pool = clientpool.new(plain_opts())
      end)
      uv.run()
      assert.are.equal(require("clientpool.sched.luv"), pool._sched)
      pool:close()
    end)
  end)
end)
