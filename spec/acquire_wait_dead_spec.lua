-- clientpool: waiting when something else than a grant ends a wait or
-- comes in between (docs/api.md "Acquiring"; docs/decisions.md "Acquire,
-- wait, release"): dead waiters, create failure, idle_timeout and
-- max_lifetime, close, many waiters, and the garbage of timed-out waits.
-- The first half of the waiting semantics is acquire_wait_spec.lua; both
-- run every scenario on each scheduler (spec/wait_helpers.lua).

local clientpool = require "clientpool"
local H = require "spec.helpers"
local W = require "spec.wait_helpers"
local co_close, ypcall, contains = W.co_close, W.ypcall, W.contains
local run, new_pool, waiter, kill, after_destroy, assert_settled =
      W.run, W.new_pool, W.waiter, W.kill, W.after_destroy, W.assert_settled
local it_close = co_close and it or pending

W.each_scheduler({ describe = describe, it = it, pending = pending }, function(S, T, at)

describe("clientpool waiting on " .. S.name, function()
  after_each(function() if S.finish then S.finish() end end)

  describe("dead waiters", function()
    it_close("a waiting coroutine closed with coroutine.close never swallows a grant", function()
      run(S, function(sched)
        local f = H.factory(sched)
        local pool = new_pool(sched, f, { max_live = 1 })
        local held = assert(pool:acquire("k"))
        local w1 = waiter(sched, pool, "k")
        local w2 = waiter(sched, pool, "k")
        sched.sleep(T(0.5))
        kill(w1.co, "close")
        local client = held.client
        held:release()
        sched.sleep(0)
        assert.is_false(w1.done)
        assert.is_true(w2.done)
        assert.is_table(w2.lease, tostring(w2.code))
        assert.equal(client, w2.lease.client)
        w2.lease:release()
        local s = assert_settled(pool)
        assert.equal(1, s.live)
        assert.equal(1, f.created)
      end)
    end)

    it_close("a waiting coroutine closed with coroutine.close gives its max_waiting slot back", function()
      run(S, function(sched)
        local pool = new_pool(sched, H.factory(sched), { max_live = 1, max_waiting = 1 })
        local held = assert(pool:acquire("k"))
        local w1 = waiter(sched, pool, "k")        -- no timeout: only a release could end it
        sched.sleep(T(0.5))
        kill(w1.co, "close")
        local s = H.check(pool)                    -- stats() sees it gone
        assert.equal(0, s.waiting)
        assert.equal(1, s.cancelled)
        -- a deadline far past the check: on a real clock a stalled loop must
        -- not time w2 out before it
        local w2 = waiter(sched, pool, "k", { timeout = T(50) })
        sched.sleep(T(0.5))
        assert.is_false(w2.done)                   -- queued, not "full"
        held:release()
        sched.sleep(0)
        sched.sleep(0)
        assert.is_true(w2.done)
        assert.is_table(w2.lease, tostring(w2.code))
        w2.lease:release()
        s = assert_settled(pool)
        assert.equal(0, s.rejected)
      end)
    end)

    it_close("a waiter closed right after another was reaped gives its slot back too", function()
      run(S, function(sched)
        local pool = new_pool(sched, H.factory(sched), { max_live = 1, max_waiting = 1 })
        local held = assert(pool:acquire("k"))
        local w1 = waiter(sched, pool, "k")
        sched.sleep(T(0.1))
        kill(w1.co, "close")
        local w2 = waiter(sched, pool, "k")          -- reaps w1, takes its slot
        sched.sleep(0)
        kill(w2.co, "close")                          -- at once: no time has passed
        local l, code = pool:acquire("k", { timeout = T(0.2) })
        assert.is_nil(l)
        assert.equal("timeout", code)                 -- it queued: not "full"
        held:release()
        local s = assert_settled(pool)
        assert.equal(0, s.rejected)
        assert.equal(2, s.cancelled)
      end)
    end)

    it_close("a full queue of closed waiters does not refuse a new acquisition", function()
      run(S, function(sched)
        local pool = new_pool(sched, H.factory(sched), { max_live = 1, max_waiting = 2 })
        local held = assert(pool:acquire("k"))
        local w1 = waiter(sched, pool, "k")
        local w2 = waiter(sched, pool, "k")
        sched.sleep(T(0.5))
        kill(w1.co, "close")
        kill(w2.co, "close")
        local l, code = pool:acquire("k", { timeout = T(0.5) })   -- waits, then times out
        assert.is_nil(l)
        assert.equal("timeout", code)
        held:release()
        local s = assert_settled(pool)
        assert.equal(0, s.rejected)
        assert.equal(2, s.cancelled)
      end)
    end)

    -- w1 died with the grant of `client`, which went on to w2; nothing lost.
    local function assert_passed_on(pool, f, w1, w2, client)
      assert.is_false(w1.done)
      assert.is_true(w2.done)
      assert.is_table(w2.lease, tostring(w2.code))
      assert.equal(client, w2.lease.client)
      w2.lease:release()
      local s = assert_settled(pool)
      assert.equal(1, s.live)
      assert.equal(1, f.created)
    end

    it_close("a waiter closed after it was woken with a grant, before it ran, never swallows it", function()
      run(S, function(sched)
        local f = H.factory(sched)
        local pool = new_pool(sched, f, { max_live = 1 })
        local held = assert(pool:acquire("k"))
        local w1 = waiter(sched, pool, "k")
        local w2 = waiter(sched, pool, "k")
        sched.sleep(T(0.5))
        local client = held.client
        held:release()            -- w1 is woken with the client, not resumed yet
        kill(w1.co, "close")
        sched.sleep(0)
        sched.sleep(0)
        assert_passed_on(pool, f, w1, w2, client)
      end)
    end)

    -- A cancel token's wake carries no lost-wake callback; the grant's does.
    -- Whichever comes first, the grant must come back when the waiter dies.
    for _, order in ipairs { "cancel, then grant", "grant, then cancel" } do
      it_close("a waiter woken by its cancel token and a grant (" .. order .. "), closed before it ran, " ..
               "never swallows the grant", function()
        run(S, function(sched)
          local f = H.factory(sched)
          local pool = new_pool(sched, f, { max_live = 1 })
          local held = assert(pool:acquire("k"))
          local tok = clientpool.token()
          local w1 = waiter(sched, pool, "k", { cancel = tok })
          local w2 = waiter(sched, pool, "k")
          sched.sleep(T(0.5))
          local client = held.client
          if order == "cancel, then grant" then
            tok:cancel()
            held:release()
          else
            held:release()
            tok:cancel()
          end
          kill(w1.co, "close")
          sched.sleep(0)
          sched.sleep(0)
          assert_passed_on(pool, f, w1, w2, client)
        end)
      end)
    end

    -- checkout has no lease object: it holds a leak sentinel while its hooks
    -- run (PUC Lua 5.1: see it_puc51 below, the same limit)
    local it_not_puc51 = (_VERSION == "Lua 5.1" and not rawget(_G, "jit")) and pending or it
    -- (unpark: the parked idle client's path without a grant record,
    -- checkout.lua's checkout_unpark, issue 17)
    for _, hook in ipairs { "create", "validate", "unpark" } do
      it_not_puc51("a checkout whose coroutine dies inside " .. hook .. " gives its " ..
         (hook == "create" and "reservation" or "client") .. " back once collected", function()
        run(S, function(sched)
          local f = H.factory(sched)
          local slow = function() sched.sleep(T(10)); return true end
          local pool = new_pool(sched, f, {
            create = hook == "create" and function(key) sched.sleep(T(10)); return f.create(key) end or nil,
            validate = hook == "validate" and slow or nil,
            park = hook == "unpark" and function(c) return { parked = c } end or nil,
            unpark = hook == "unpark" and function(st) sched.sleep(T(10)); return st.parked end or nil,
          })
          if hook ~= "create" then assert(pool:acquire("k")):release() end   -- an idle client to validate/unpark
          local leaks = 0
          pool:on("leak", function(_, info) if info.leaked then leaks = leaks + 1 end end)
          local w = {}
          sched.spawn(function() w.co = coroutine.running(); w.client = pool:checkout("k") end)
          sched.sleep(T(1))
          kill(w.co, co_close and "close" or "error")   -- inside the hook
          w.co = nil
          sched.sleep(T(11))                      -- the hook's sleep timer has fired for the dead task
          for _ = 1, 4 do collectgarbage("collect") end
          sched.sleep(T(1))
          assert.equal(1, leaks)
          local s = assert_settled(pool)
          assert.equal(0, s.live)
        end)
      end)
    end

    it_close("a grant for a closed waiting coroutine with no one behind stays idle", function()
      run(S, function(sched)
        local pool = new_pool(sched, H.factory(sched), { max_live = 1 })
        local held = assert(pool:acquire("k"))
        local w = waiter(sched, pool, "k")
        sched.sleep(T(0.5))
        kill(w.co, "close")
        held:release()
        sched.sleep(0)
        assert.is_false(w.done)
        local s = assert_settled(pool)
        assert.equal(1, s.idle)
        assert.equal(1, s.live)
        local again = assert(pool:acquire("k", { timeout = T(1) }))
        again:release()
      end)
    end)

    it("a waiting coroutine killed by an error never swallows a grant", function()
      run(S, function(sched)
        local f = H.factory(sched)
        local pool = new_pool(sched, f, { max_live = 1 })
        local held = assert(pool:acquire("k"))
        local w1 = waiter(sched, pool, "k")
        local w2 = waiter(sched, pool, "k")
        sched.sleep(T(0.5))
        kill(w1.co, "error")
        local client = held.client
        held:release()
        sched.sleep(0)
        assert.is_false(w1.done)
        assert.is_true(w2.done)
        assert.is_table(w2.lease, tostring(w2.code))
        assert.equal(client, w2.lease.client)
        w2.lease:release()
        local s = assert_settled(pool)
        assert.equal(1, s.live)
        assert.equal(1, f.created)
      end)
    end)

    it("a dead waiter granted a free slot (not a client) hands the slot on", function()
      run(S, function(sched)
        local f = H.factory(sched)
        local pool = new_pool(sched, f, { max_live = 1 })
        local held = assert(pool:acquire("k"))
        local w1 = waiter(sched, pool, "k")
        local w2 = waiter(sched, pool, "other")
        sched.sleep(T(0.5))
        kill(w1.co, co_close and "close" or "error")
        held:release(false)  -- a slot: granted to dead w1 as a reservation
        after_destroy(sched)
        assert.is_false(w1.done)
        assert.is_table(w2.lease, tostring(w2.code))
        assert.equal("other", w2.client.key)
        local s = H.check(pool)
        assert.equal(0, s.creating)
        assert.equal(1, s.live)
        w2.lease:release()
        assert_settled(pool)
        -- with no one behind, the slot is simply free again
        local h2 = assert(pool:acquire("k"))
        local w3 = waiter(sched, pool, "k")
        sched.sleep(T(0.5))
        kill(w3.co, co_close and "close" or "error")
        h2:release(false)
        sched.sleep(0)
        s = assert_settled(pool)
        assert.equal(0, s.live)
        local again = assert(pool:acquire("k", { timeout = T(1) }))
        again:release()
      end)
    end)

    -- PUC Lua 5.1 can only simulate the death (debug hook). There create runs
    -- in the driver's pass-through coroutine, whose timer the loop fires for
    -- the dead task without forgetting it, so the loop keeps the dead task
    -- (and the reservation on its stack) reachable: not the pool's doing.
    local it_puc51 = (_VERSION == "Lua 5.1" and not rawget(_G, "jit")) and pending or it
    it_puc51("a granted waiter that dies inside create gives the slot back once collected", function()
      run(S, function(sched)
        local calls = 0
        local pool = new_pool(sched, H.factory(sched), {
          max_live = 1,
          create = function(key)
            calls = calls + 1
            sched.sleep(T(1))
            return { id = calls, key = key, alive = true }
          end,
        })
        local w1 = waiter(sched, pool, "k")
        local w2 = waiter(sched, pool, "k", { timeout = T(10) })
        sched.sleep(T(0.5))     -- w1 is inside create, w2 waits behind it
        local s = H.check(pool)
        assert.equal(1, s.creating)
        assert.equal(1, s.waiting)
        kill(w1.co, co_close and "close" or "error")
        w1.co = nil
        sched.sleep(T(1))       -- t = 1.5: create's sleep timer has fired for the dead task
        for _ = 1, 4 do collectgarbage() end
        -- nothing else touches the pool: the waiter must still be served
        -- (its create takes 1 s: done by t = 2.5, long before its deadline)
        sched.sleep(T(2))
        assert.is_false(w1.done)
        assert.is_true(w2.done)
        assert.is_table(w2.lease, tostring(w2.code))
        assert.equal(2, w2.client.id)
        s = H.check(pool)
        assert.equal(0, s.creating)
        assert.equal(1, s.live)
        assert.equal(1, s.leases)
        w2.lease:release()
        assert_settled(pool)
      end)
    end)

    it("a lease collected while held hands its capacity to a waiter", function()
      run(S, function(sched)
        local f = H.factory(sched)
        local pool = new_pool(sched, f, { max_live = 1 })
        local leaks = 0
        pool:on("leak", function() leaks = leaks + 1 end)
        sched.spawn(function() pool:acquire("k") end) -- drops its lease
        sched.sleep(0)
        assert.equal(1, H.check(pool).leases)
        local w = waiter(sched, pool, "k", { timeout = T(10) })
        sched.sleep(T(0.5))
        assert.equal(1, H.check(pool).waiting)
        for _ = 1, 4 do collectgarbage() end
        -- nothing else touches the pool: the waiter must still be served
        sched.sleep(T(1))
        assert.is_true(w.done)
        assert.is_table(w.lease, tostring(w.code))
        assert.equal(2, w.client.id)
        assert.equal(1, leaks)
        local s = H.check(pool)
        assert.equal(1, s.leaked)
        assert.equal(1, s.closed_by.leaked)
        assert.equal(1, s.live)
        w.lease:release()
        assert_settled(pool)
      end)
    end)

    it("a spurious resume of a waiter does not end its wait", function()
      run(S, function(sched)
        local pool = new_pool(sched, H.factory(sched), { max_live = 1 })
        local held = assert(pool:acquire("k"))
        local w = waiter(sched, pool, "k", { timeout = T(5) })
        sched.sleep(T(0.5))
        assert.is_true((coroutine.resume(w.co))) -- resumed by someone else
        assert.equal("suspended", coroutine.status(w.co))
        assert.is_false(w.done)
        assert.equal(1, H.check(pool).waiting)
        sched.sleep(T(0.5))
        assert.is_false(w.done)
        local client = held.client
        held:release()
        sched.sleep(0)
        assert.is_true(w.done)
        assert.equal(client, w.client)
        at(1, w.t1)
        w.lease:release()
        assert_settled(pool)
      end)
    end)

    it("a dead waiter with a deadline leaves the queue at its deadline", function()
      run(S, function(sched)
        local pool = new_pool(sched, H.factory(sched), { max_live = 1 })
        local held = assert(pool:acquire("k"))
        local w = waiter(sched, pool, "k", { timeout = T(2) })
        sched.sleep(T(0.5))
        kill(w.co, co_close and "close" or "error")
        sched.sleep(T(2))
        assert.equal(0, H.check(pool).waiting)
        held:release()
        assert.equal(1, assert_settled(pool).idle)
      end)
    end)

    it("a dead waiter with a pending cancel token leaves the token working", function()
      run(S, function(sched)
        local pool = new_pool(sched, H.factory(sched), { max_live = 1 })
        local held = assert(pool:acquire("k"))
        local token = clientpool.token()
        local w1 = waiter(sched, pool, "k", { cancel = token })
        local w2 = waiter(sched, pool, "k", { cancel = token })
        local w3 = waiter(sched, pool, "k")
        sched.sleep(T(0.5))
        kill(w1.co, co_close and "close" or "error")
        token:cancel()       -- no error; the live waiter on the token ends
        assert.is_true(token:cancelled())
        token:cancel()
        sched.sleep(0)
        assert.is_false(w1.done)
        assert.equal("cancelled", w2.code)
        assert.is_false(w3.done)
        local client = held.client
        held:release()
        sched.sleep(0)
        assert.is_table(w3.lease, tostring(w3.code))
        assert.equal(client, w3.lease.client)
        w3.lease:release()
        assert_settled(pool)
        -- the cancelled token still fails later acquisitions
        local l, code = pool:acquire("k", { cancel = token })
        assert.is_nil(l)
        assert.equal("cancelled", code)
      end)
    end)

    it("an error in another task does not affect the pool's counts", function()
      run(S, function(sched)
        local f = H.factory(sched)
        local pool = new_pool(sched, f, { max_live = 1 })
        local perr
        sched.spawn(function()
          local ok, err = ypcall(pool.with, pool, "k", function()
            sched.sleep(T(1))
            error("boom", 0)
          end)
          assert(not ok)
          perr = err
        end)
        sched.sleep(0)
        assert.equal(1, H.check(pool).leases)
        local w = waiter(sched, pool, "k")
        sched.sleep(T(0.5))
        local s = H.check(pool)
        assert.equal(1, s.waiting)
        assert.equal(1, s.leases)
        -- far past the task's wake at 1 s: on a real clock a loop stalled
        -- past both deadlines may run them in either order
        sched.sleep(T(5))
        assert.equal("boom", perr)
        assert.is_table(w.lease, tostring(w.code))
        assert.equal(2, w.lease.client.id)  -- the failed one was destroyed
        s = H.check(pool)
        assert.equal(1, s.live)
        assert.equal(1, s.leases)
        assert.equal(1, s.closed_by.error)
        w.lease:release()
        assert_settled(pool)
      end)
    end)

    it("an uncaught error in another task leaves waiters and counts alone", function()
      local sched = S.new()
      local pool, held, w
      local ok, err = pcall(S.run, sched, function()
        pool = new_pool(sched, H.factory(sched), { max_live = 1 })
        held = assert(pool:acquire("k"))
        w = waiter(sched, pool, "k")
        sched.spawn(function() sched.sleep(T(0.5)); error("unrelated boom", 0) end)
      end)
      assert.is_false(ok)
      assert.is_true(contains(err, "unrelated boom"), tostring(err))
      -- the scheduler keeps the other tasks: run on
      S.run(sched, function()
        local s = H.check(pool)
        assert.equal(1, s.waiting)
        assert.equal(1, s.leases)
        assert.equal(1, s.live)
        assert.is_false(w.done)
        local client = held.client
        held:release()
        sched.sleep(0)
        assert.is_table(w.lease, tostring(w.code))
        assert.equal(client, w.lease.client)
        w.lease:release()
        assert_settled(pool)
      end)
    end)

    it_close("a task failing with a <close> lease hands its capacity to the waiter", function()
      local sched = S.new()
      local f = H.factory(sched)
      local pool = new_pool(sched, f, { max_live = 1 })
      local holder = assert(load([[
        local pool, sched, hold = ...
        return function()
          local l <close> = assert(pool:acquire("k"))
          sched.sleep(hold)
          error("holder boom", 0)
        end
      ]]))(pool, sched, T(0.5))
      local w
      local ok, err = pcall(S.run, sched, function()
        sched.spawn(holder)
        sched.sleep(0)
        w = waiter(sched, pool, "k")
        sched.sleep(T(1))
      end)
      assert.is_false(ok)
      assert.is_true(contains(err, "holder boom"), tostring(err))
      S.run(sched, function()
        sched.sleep(T(1))
        assert.is_table(w.lease, tostring(w.code))
        assert.equal(2, w.lease.client.id) -- the failed task's client was retired
        local s = H.check(pool)
        assert.equal(1, s.live)
        assert.equal(1, s.leases)
        assert.equal(1, s.closed_by.error)
        w.lease:release()
        assert_settled(pool)
      end)
    end)
  end)

  describe("create failure", function()
    local function failing_create(sched, how)
      local calls = 0
      return function(key)
        calls = calls + 1
        local n = calls
        sched.sleep(T(0.1))
        if n == 1 then
          if how == "throw" then error("kaboom", 0) end
          if how == "throw table" then error({ reason = "kaboom" }) end
          return nil, "boom"
        end
        return { id = n, key = key, alive = true }
      end, function() return calls end
    end

    for _, how in ipairs { "nil, err", "throw", "throw table" } do
      it("hands the capacity of a failed create (" .. how .. ") to the next waiter", function()
        run(S, function(sched)
          local create, calls = failing_create(sched, how)
          local pool = new_pool(sched, H.factory(sched), { max_live = 1, create = create,
                                                          create_backoff = T(0.05), create_backoff_max = T(2) })
          local w1 = waiter(sched, pool, "k")
          local w2 = waiter(sched, pool, "k")
          -- both have started (in nginx a spawned task may start a turn
          -- after this one resumes: look again for a few turns)
          for _ = 1, 20 do
            if pool:stats().waiting == 1 then break end
            sched.sleep(0)
          end
          local s = H.check(pool)
          assert.equal(1, s.creating)
          assert.equal(1, s.waiting)
          sched.sleep(T(1))
          assert.is_nil(w1.lease)
          assert.equal("create", w1.code)
          if how == "throw table" then
            assert.same({ reason = "kaboom" }, w1.detail)
          elseif how == "throw" then
            assert.equal("kaboom", w1.detail)
          else
            assert.equal("boom", w1.detail)
          end
          at(0.1, w1.t1)
          -- (a loaded machine's real clock may be late: wait a little more)
          for _ = 1, 50 do
            if w2.done then break end
            sched.sleep(T(0.1))
          end
          assert.is_table(w2.lease, tostring(w2.code))
          assert.equal(2, w2.lease.client.id)
          assert.equal(2, calls())
          s = H.check(pool)
          assert.equal(0, s.creating)
          assert.equal(1, s.live)
          assert.equal(1, s.opened)
          assert.equal(1, s.leases)
          assert.equal(0, s.waiting)
          w2.lease:release()
          assert.equal(1, assert_settled(pool).idle)
        end)
      end)
    end
  end)

  describe("idle_timeout and max_lifetime", function()
    it("do not touch a leased client, except at its release", function()
      run(S, function(sched)
        local f = H.factory(sched)
        local pool = new_pool(sched, f, { max_live = 1, idle_timeout = T(1), max_lifetime = T(5) })
        local l = assert(pool:acquire("k"))
        local c = l.client
        local w = waiter(sched, pool, "k")
        sched.sleep(T(3))       -- leased past idle_timeout
        local s = H.check(pool)
        assert.equal(1, s.live)
        assert.equal(0, s.closed)
        assert.is_true(c.alive)
        l:release()          -- idle time starts at release: the waiter gets it
        sched.sleep(0)
        assert.is_table(w.lease, tostring(w.code))
        assert.equal(c, w.lease.client)
        local w2 = waiter(sched, pool, "k")
        sched.sleep(T(3))       -- t = 6, leased past max_lifetime
        s = H.check(pool)
        assert.equal(1, s.live)
        assert.equal(0, s.closed_by.lifetime)
        assert.is_true(c.alive)
        w.lease:release()    -- retired now; the waiter gets a fresh client
        s = H.check(pool)
        assert.equal(1, s.closed_by.lifetime)
        after_destroy(sched)
        assert.is_false(c.alive)
        assert.is_table(w2.lease, tostring(w2.code))
        assert.are_not.equal(c, w2.lease.client)
        assert.equal(2, f.created)
        sched.sleep(T(6))       -- t = 12: w2's client (created at 6) is past its lifetime
        assert.equal(1, H.check(pool).live)
        w2.lease:release()   -- no one waits: retired at release all the same
        s = assert_settled(pool)
        assert.equal(0, s.live)
        assert.equal(2, s.closed_by.lifetime)
        local l3 = assert(pool:acquire("k"))
        l3:release()
        sched.sleep(T(1.5))     -- idle past idle_timeout: retired by the timer
        s = assert_settled(pool)
        assert.equal(0, s.live)
        assert.equal(1, s.closed_by.idle)
        assert.equal(2, s.closed_by.lifetime)
      end)
    end)
  end)

  describe("close", function()
    it("wakes every waiter with closed", function()
      run(S, function(sched)
        local f = H.factory(sched)
        local pool = new_pool(sched, f, { max_live = 1 })
        local held = assert(pool:acquire("k"))
        local ws = {
          waiter(sched, pool, "k"),
          waiter(sched, pool, "k", { timeout = T(50) }),
          waiter(sched, pool, "other", { cancel = clientpool.token() }),
        }
        sched.sleep(T(1))
        assert.equal(3, H.check(pool).waiting)
        pool:close()
        sched.sleep(0)
        for i, w in ipairs(ws) do
          assert.is_true(w.done, "waiter " .. i)
          assert.is_nil(w.lease)
          assert.equal("closed", w.code)
          at(1, w.t1)
        end
        local s = H.check(pool)
        assert.equal(0, s.waiting)
        assert.equal(3, s.wait_count)
        local l, code = pool:acquire("k")
        assert.is_nil(l)
        assert.equal("closed", code)
        held:release()       -- destroyed: the pool is closed
        s = H.check(pool)
        assert.equal(0, s.live)
        assert.equal(0, s.leases)
        assert.equal(1, s.closed_by.drain)
      end)
    end)
  end)

  describe("many waiters", function()
    it("serves 1000 tasks over max_live 3 with create latency", function()
      run(S, function(sched)
        local f = H.factory(sched, { latency = T(0.01) })
        local pool = new_pool(sched, f, { max_live = 3 })
        local done, n = 0, 1000
        for i = 1, n do
          sched.spawn(function()
            sched.sleep(T((i % 10) / 1000))
            local l, code = pool:acquire("k")
            assert(l, code)
            sched.sleep(T(0.002))
            l:release()
            done = done + 1
          end)
        end
        sched.sleep(T(0.005))
        local mid = H.check(pool)
        if S.real then
          -- 50 us on a real clock: a busy machine may get here before any
          -- task asked; some must wait while the 1000 are served
          while mid.waiting == 0 and done < n do
            sched.sleep(0)
            mid = H.check(pool)
          end
        end
        assert.is_true(mid.waiting > 0)
        while done < n do sched.sleep(T(0.1)) end
        local s = assert_settled(pool)
        assert.is_true(s.opened <= 3, "opened " .. s.opened)
        assert.equal(0, s.live - s.idle)
        assert.is_true(s.wait_count > 0)
        assert.equal(0, s.timeouts + s.rejected + s.cancelled)
      end)
    end)
  end)
end)

end)

describe("clientpool timed-out acquisitions", function()
  -- Garbage per timed-out wait is what the collector pays for while many
  -- coroutines wait (B3: acquire+cancel with 100k waiters queued). Measured:
  -- 450-700 B (the detail table and the wait itself); a fresh stats table
  -- per detail made it 1.7-2.3 KB.
  it("allocate less than 1 KB each, detail included", function()
    local Loop = require "clientpool.loop"
    local loop = Loop.new()
    local pool = clientpool.new { max_live = 1, max_waiting = 10, acquire_timeout = 3600,
                                  create = function() return {} end, scheduler = loop }
    local _, held = pool:checkout()
    loop.spawn(function() pool:checkout() end)   -- one waiter queued ahead
    local best = math.huge
    loop.spawn(function()
      local opts = { timeout = 0 }
      local function timeouts(n)
        for _ = 1, n do
          local l, code, d = pool:acquire(nil, opts)
          assert(l == nil and code == "timeout" and d.waiting >= 1)
        end
      end
      timeouts(2000)
      for _ = 1, 3 do
        collectgarbage("collect")
        collectgarbage("stop")
        timeouts(10)
        local before = collectgarbage("count")
        timeouts(1000)
        local per = (collectgarbage("count") - before) * 1024 / 1000
        collectgarbage("restart")
        if per < best then best = per end
      end
      pool:close()
    end)
    loop.run()
    pool:checkin(held)
    assert.is_true(best < 1024, string.format("%.0f bytes per timed-out acquire", best))
    assert.equal(0, pool:stats().live)
  end)
end)
