-- clientpool.admission: lease:observe and the policy's directives,
-- pause/resume, pause_mode, probe, resume_after and pool:retire() (docs/api.md
-- "Policies, pause and resume"; issue 4 "Protocol policy"). The
-- ready-made http and redis policies: policy_spec.lua.
--
-- Every scenario runs as a task on each scheduler of H.schedulers(), on a
-- virtual clock: time only moves when tasks sleep, so resume_after deadlines
-- and acquire timeouts are exact and nothing sleeps for real.

local clientpool = require "clientpool"
local H = require "spec.helpers"

local function contains(s, part)
  return type(s) == "string" and s:find(part, 1, true) ~= nil
end

-- The message of the error fn raises (it must raise).
local function errmsg(fn, ...)
  local ok, err = pcall(fn, ...)
  assert(not ok, "expected an error")
  return tostring(err)
end

-- A programming error: "clientpool:" first (after a position prefix) and
-- every word given.
local function assert_api_error(msg, ...)
  local bare = msg:gsub("^[^\n]-:%d+: ", "", 1)
  assert(bare:sub(1, 11) == "clientpool:", "not a 'clientpool:' error: " .. msg)
  for i = 1, select("#", ...) do
    local w = select(i, ...)
    assert(contains(bare, w), "error does not mention '" .. w .. "': " .. msg)
  end
end

local function near(expected, got, what)
  assert(type(got) == "number" and math.abs(got - expected) < 1e-6,
         (what or "value") .. ": expected " .. tostring(expected) .. ", got " .. tostring(got))
end

-- The policy most scenarios use: the outcome is the directive itself, so a
-- test reads `lease:observe { pause = "busy" }`.
local function echo(outcome)
  return outcome
end

-- A deep copy of plain tables, to show an outcome is left as it was.
local function copy(v)
  if type(v) ~= "table" then return v end
  local t = {}
  for k, x in pairs(v) do t[k] = copy(x) end
  return t
end

for _, S in ipairs(H.schedulers()) do
  describe("clientpool policies on " .. S.name, function()

    -- Runs body(sched) as a task on a fresh scheduler, to completion.
    local function run(body)
      local sched = S.new()
      S.run(sched, body, sched)
      return sched
    end

    -- A pool over simulated clients: max_live 4 and the echo policy unless o
    -- says otherwise. fo: factory options.
    local function mkpool(sched, o, fo)
      local f = H.factory(sched, fo)
      local opts = { create = f.create, destroy = f.destroy, max_live = 4, policy = echo, scheduler = sched }
      for k, v in pairs(o or {}) do opts[k] = v end
      return clientpool.new(opts), f
    end

    -- Lets tasks spawned so far (destroy hooks, woken waiters) run.
    local function settle(sched)
      sched.sleep(0)
      sched.sleep(0)
    end

    -- Spawns a task that acquires key and records the outcome: t0/t1
    -- (virtual time before and after), lease, client, code, detail, done.
    -- then_fn(w), if given, runs after the acquire.
    local function waiter(sched, pool, key, opts, then_fn)
      local w = { done = false }
      sched.spawn(function()
        w.t0 = sched.now()
        w.lease, w.code, w.detail = pool:acquire(key, opts)
        w.client = w.lease and w.lease.client
        w.t1 = sched.now()
        w.done = true
        if then_fn then then_fn(w) end
      end)
      return w
    end

    -- Listeners recording pause and resume events in order.
    local function record_gate_events(pool, sched)
      local rec = {}
      for _, name in ipairs { "pause", "resume" } do
        pool:on(name, function(...)
          rec[#rec + 1] = { name = name, n = select("#", ...), at = sched.now(), ... }
        end)
      end
      return rec
    end

    ---------------------------------------------------------------------------
    describe("lease:observe", function()
      it("calls the policy with the outcome and the lease", function()
        run(function(sched)
          local calls = {}
          local pool = mkpool(sched, { policy = function(...)
            calls[#calls + 1] = { n = select("#", ...), ... }
          end })
          local l = assert(pool:acquire("k"))
          local outcome = { status = 200 }
          l:observe(outcome)
          l:observe("text")
          assert.equal(2, #calls)
          assert.equal(outcome, calls[1][1])
          assert.equal(l, calls[1][2])
          assert.equal("text", calls[2][1])
          assert.equal(l, calls[2][2])
          l:release()
        end)
      end)

      it("nil and { continue = true } change nothing", function()
        run(function(sched)
          local pool, f = mkpool(sched)
          local ev = record_gate_events(pool, sched)
          local l = assert(pool:acquire("k"))
          l:observe(nil)
          l:observe({ continue = true })
          local s = H.check(pool)
          assert.is_false(s.paused)
          assert.is_false(s.keys.k.paused)
          assert.equal(0, #ev)
          -- admission is open: the next acquisitions are served at once
          local l2 = assert(pool:try_acquire("k"))
          local l3 = assert(pool:try_acquire("other"))
          assert.equal(3, f.created)
          assert.equal(1, l.client.id)
          l:release(); l2:release(); l3:release()
          s = H.check(pool)
          assert.equal(3, s.idle)
          assert.equal(0, s.closed)
        end)
      end)

      it("never changes the outcome, nor cancels or retries the operation", function()
        run(function(sched)
          local pool, f = mkpool(sched, { policy = function(o)
            if type(o) == "table" and o.status == 429 then return { pause = "throttled" } end
          end })
          local l = assert(pool:acquire("k"))
          local client = l.client
          local outcome = { status = 429, body = "slow down", headers = { ["Retry-After"] = "1" } }
          local before = copy(outcome)
          l:observe(outcome)
          assert.same(before, outcome)
          -- the pause happened, but the operation and its lease are untouched
          local s = H.check(pool)
          assert.equal("throttled", s.paused)
          assert.equal(1, f.created)
          assert.equal(1, s.leases)
          assert.equal(client, l.client)
          assert.is_true(client.alive)
          assert.is_false(l:cancelled())
          -- a directive given as the outcome is not rewritten either
          local echo_pool = mkpool(sched)
          local l2 = assert(echo_pool:acquire("k"))
          local d = { pause = "busy", resume_after = 5 }
          l2:observe(d)
          assert.same({ pause = "busy", resume_after = 5 }, d)
          l:release()
          l2:release()
          assert.equal(1, H.check(pool).idle)
        end)
      end)

      it("raises 'lease released' on a released lease", function()
        run(function(sched)
          local pool = mkpool(sched)
          local l = assert(pool:acquire("k"))
          l:release()
          assert_api_error(errmsg(l.observe, l, { pause = "x" }), "lease released")
          assert.is_false(H.check(pool).paused)
          local l2 = assert(pool:acquire("k"))
          l2:destroy()
          assert_api_error(errmsg(l2.observe, l2, nil), "lease released")
        end)
      end)

      it("raises a 'clientpool:' error naming the field of a bad directive, and changes nothing", function()
        run(function(sched)
          local cases = {
            { d = "pause", words = { "policy" } },
            { d = 42, words = { "policy" } },
            { d = { pause = 42 }, words = { "pause" } },
            { d = { pause = true }, words = { "pause" } },
            { d = { pause = "x", scope = "world" }, words = { "scope" } },
            { d = { pause = "x", scope = 1 }, words = { "scope" } },
            { d = { pause = "x", resume_after = -1 }, words = { "resume_after" } },
            { d = { pause = "x", resume_after = 0 / 0 }, words = { "resume_after" } },
            { d = { pause = "x", resume_after = math.huge }, words = { "resume_after" } },
            { d = { pause = "x", resume_after = "5" }, words = { "resume_after" } },
          }
          local box = {}
          local pool = mkpool(sched, { policy = function() return box.d end })
          local l = assert(pool:acquire("k"))
          for i, c in ipairs(cases) do
            box.d = c.d
            local msg = errmsg(l.observe, l, "outcome")
            assert_api_error(msg, (table.unpack or unpack)(c.words))
            local s = H.check(pool)
            assert(s.paused == false, "case " .. i .. " paused the pool")
            assert(s.keys.k.paused == false, "case " .. i .. " paused the key")
          end
          -- still usable, and admission still open
          assert.is_table((pool:try_acquire("k")))
          l:release()
        end)
      end)
    end)

    ---------------------------------------------------------------------------
    describe("pause", function()
      it("a wait that times out on a paused key or pool says so in its detail", function()
        run(function(sched)
          local pool = mkpool(sched)
          pool:pause("LOADING", "a")
          local l, code, d = pool:acquire("a", { timeout = 1 })
          assert.is_nil(l)
          assert.equal("timeout", code)
          assert.equal("LOADING", d.paused)
          assert.is_true(contains(tostring(d), "paused: LOADING"), tostring(d))
          l, code = pool:acquire("b", { timeout = 0 })       -- another key: not paused
          assert.is_table(l, tostring(code))
          l:release()
          pool:pause("maintenance")
          l, code, d = pool:acquire("b", { timeout = 1 })
          assert.is_nil(l)
          assert.equal("timeout", code)
          assert.equal("maintenance", d.paused)
        end)
      end)

      it("{ pause = reason } pauses the pool: later acquisitions queue, held leases stay usable", function()
        run(function(sched)
          local pool, f = mkpool(sched)
          local ev = record_gate_events(pool, sched)
          local held = assert(pool:acquire("k"))
          local client = held.client
          held:observe({ pause = "busy" })
          local s = H.check(pool)
          assert.equal("busy", s.paused)
          assert.equal(1, #ev)
          assert.equal("pause", ev[1].name)
          assert.is_nil(ev[1][1])
          assert.equal("busy", ev[1][2])
          -- room to create, yet every key queues
          local w1 = waiter(sched, pool, "k")
          local w2 = waiter(sched, pool, "other")
          sched.sleep(1)
          assert.is_false(w1.done)
          assert.is_false(w2.done)
          s = H.check(pool)
          assert.equal(2, s.waiting)
          assert.equal(1, f.created)
          -- the held lease works and releases normally: its client goes idle,
          -- and a paused pool does not hand it to the waiter
          assert.equal(client, held.client)
          assert.is_true(client.alive)
          held:release()
          settle(sched)
          s = H.check(pool)
          assert.equal(1, s.idle)
          assert.equal(0, s.closed)
          assert.equal(2, s.waiting)
          assert.is_false(w1.done)
          sched.sleep(10)
          assert.is_false(w1.done)
          pool:resume()
          settle(sched)
          assert.is_true(w1.done and w2.done)
          assert.is_table(w1.lease, tostring(w1.code))
          assert.is_table(w2.lease, tostring(w2.code))
          assert.equal(client, w1.client)     -- the idle client, reused
          near(11, w1.t1, "w1 granted at")
          s = H.check(pool)
          assert.is_false(s.paused)
          assert.equal(2, #ev)
          assert.equal("resume", ev[2].name)
          assert.is_nil(ev[2][1])
          w1.lease:release()
          w2.lease:release()
        end)
      end)

      it("pool:pause(reason) queues acquisitions too, and try_acquire does not get through", function()
        run(function(sched)
          local pool, f = mkpool(sched)
          pool:pause("maintenance")
          assert.equal("maintenance", H.check(pool).paused)
          local l, code = pool:try_acquire("k")
          assert.is_nil(l)
          assert.are.not_equal(nil, code)
          local w = waiter(sched, pool, "k", { timeout = 1 })
          sched.sleep(2)
          assert.is_true(w.done)
          assert.equal("timeout", w.code)
          assert.equal(0, f.created)
          pool:resume()
          assert.is_table((pool:acquire("k")))
        end)
      end)

      it("queued acquisitions stay within max_waiting and time out by their own timeouts", function()
        run(function(sched)
          local pool = mkpool(sched, { max_waiting = 2, acquire_timeout = 100 })
          pool:pause("maintenance")
          local w1 = waiter(sched, pool, "k", { timeout = 1 })
          local w2 = waiter(sched, pool, "k", { timeout = 3 })
          sched.sleep(0)
          local l, code = pool:acquire("k", { timeout = 50 })
          assert.is_nil(l)
          assert.equal("full", code)
          local s = H.check(pool)
          assert.equal(2, s.waiting)
          assert.equal(1, s.rejected)
          sched.sleep(1)
          sched.sleep(0)
          assert.is_true(w1.done)
          assert.equal("timeout", w1.code)
          near(1, w1.t1, "w1 timed out at")
          assert.is_false(w2.done)
          sched.sleep(2)
          sched.sleep(0)
          assert.is_true(w2.done)
          assert.equal("timeout", w2.code)
          near(3, w2.t1, "w2 timed out at")
          s = H.check(pool)
          assert.equal(2, s.timeouts)
          assert.equal(0, s.waiting)
          assert.equal("maintenance", s.paused)
        end)
      end)

      it("pool:resume() lets the queued acquisitions through in their arrival order", function()
        run(function(sched)
          local pool = mkpool(sched, { max_live = 1 })
          pool:pause("busy")
          local delays = { 7, 3, 9, 1, 5, 2, 8, 4, 6 }
          local order = {}
          for i = 1, #delays do
            sched.spawn(function()
              sched.sleep(delays[i] / 100)
              local l = assert(pool:acquire("k"))
              order[#order + 1] = delays[i]
              sched.sleep(0.5)
              l:release()
            end)
          end
          sched.sleep(1)
          assert.equal(0, #order)
          assert.equal(#delays, H.check(pool).waiting)
          pool:resume()
          sched.sleep(10)
          assert.same({ 1, 2, 3, 4, 5, 6, 7, 8, 9 }, order)
        end)
      end)

      it("scope = \"key\" pauses only that key: other keys proceed", function()
        run(function(sched)
          local pool = mkpool(sched)
          local ev = record_gate_events(pool, sched)
          local la = assert(pool:acquire("a"))
          la:observe({ pause = "slow", scope = "key" })
          local s = H.check(pool)
          assert.is_false(s.paused)
          assert.equal("slow", s.keys.a.paused)
          assert.equal(1, #ev)
          assert.equal("a", ev[1][1])
          assert.equal("slow", ev[1][2])
          -- key b is served at once, key a queues
          local lb = assert(pool:try_acquire("b"))
          assert.is_false(H.check(pool).keys.b.paused)
          local wa = waiter(sched, pool, "a")
          local wb = waiter(sched, pool, "b")
          sched.sleep(1)
          assert.is_false(wa.done)
          assert.is_true(wb.done)
          assert.is_table(wb.lease)
          near(0, wb.t1, "b granted at")
          pool:resume("a")
          settle(sched)
          assert.is_true(wa.done)
          assert.is_table(wa.lease, tostring(wa.code))
          assert.is_false(H.check(pool).keys.a.paused)
          assert.equal("resume", ev[2].name)
          assert.equal("a", ev[2][1])
          la:release(); lb:release(); wa.lease:release(); wb.lease:release()
        end)
      end)

      it("pool:pause(reason, key) pauses one key; pool:resume() of the pool leaves it paused", function()
        run(function(sched)
          local pool = mkpool(sched)
          pool:pause("drain-a", "a")
          local s = H.check(pool)
          assert.equal("drain-a", s.keys.a.paused)
          assert.is_false(s.paused)
          local wa = waiter(sched, pool, "a")
          assert.is_table((pool:acquire("b")))
          sched.sleep(1)
          assert.is_false(wa.done)
          pool:resume()          -- the pool was not paused: key a stays paused
          sched.sleep(1)
          assert.is_false(wa.done)
          pool:resume("a")
          settle(sched)
          assert.is_table(wa.lease, tostring(wa.code))
        end)
      end)

      it("pool:pause raises on a reason that is not a string", function()
        run(function(sched)
          local pool = mkpool(sched)
          assert_api_error(errmsg(pool.pause, pool), "reason")
          assert_api_error(errmsg(pool.pause, pool, 42), "reason")
          assert_api_error(errmsg(pool.pause, pool, { "x" }), "reason")
          assert_api_error(errmsg(pool.pause, pool, "x", 42), "key")
          local s = H.check(pool)
          assert.is_false(s.paused)
          assert.is_table((pool:try_acquire("k")))
        end)
      end)
    end)

    ---------------------------------------------------------------------------
    describe("keys held by pause, resume and retire", function()
      local function nkeys(pool)
        local n = 0
        for _ in pairs(pool:stats().keys) do n = n + 1 end
        return n
      end

      it("resume or retire of a key the pool does not know opens none (max_keys stays free)", function()
        run(function(sched)
          local pool = mkpool(sched, { max_keys = 1 })
          pool:pause("429", "a")
          pool:resume("a")
          pool:resume("a")                    -- again: a manual resume after resume_after's
          pool:resume("ghost")
          pool:retire("ghost")
          assert.equal(0, nkeys(pool))
          local l, code = pool:try_acquire("b")
          assert.is_table(l, tostring(code))
          l:release()
        end)
      end)

      it("a pause from a destroy listener for the key's last client holds (the key was being forgotten)", function()
        run(function(sched)
          local pool = mkpool(sched)
          pool:on("destroy", function(key, _, reason)
            if reason == "error" then pool:pause("broken", key) end   -- a circuit breaker
          end)
          local l = assert(pool:acquire("x"))
          l:release(false)                    -- x's only client closed: x empties
          local l2, code, d = pool:acquire("x", { timeout = 1 })
          assert.is_nil(l2)
          assert.equal("timeout", code)
          assert.equal("broken", d.paused)
          pool:resume("x")
          assert(pool:acquire("x")):release()
        end)
      end)

      it("paused and resumed keys leave nothing behind; an old resume_after never resumes a new pause", function()
        run(function(sched)
          local pool = mkpool(sched)
          for i = 1, 200 do
            pool:_pause("busy", "k" .. i, 1, "pause")   -- as { pause = ..., scope = "key", resume_after = 1 }
            pool:resume("k" .. i)
          end
          assert.equal(0, nkeys(pool))
          assert.is_nil(next(pool._pgen))
          -- k1 paused again before its first resume_after fires: that timer
          -- must not end this pause
          pool:pause("again", "k1")
          sched.sleep(2)
          assert.equal("again", pool:stats().keys.k1.paused)
          pool:resume("k1")
        end)
      end)
    end)

    describe("resume_after", function()
      it("resumes by itself after that many seconds", function()
        run(function(sched)
          local pool = mkpool(sched)
          local ev = record_gate_events(pool, sched)
          local l = assert(pool:acquire("k"))
          l:observe({ pause = "retry", resume_after = 5 })
          local w = waiter(sched, pool, "k")
          sched.sleep(4.9)
          assert.is_false(w.done)
          assert.equal("retry", H.check(pool).paused)
          sched.sleep(1)
          assert.is_true(w.done)
          assert.is_table(w.lease, tostring(w.code))
          near(5, w.t1, "granted at")
          assert.is_false(H.check(pool).paused)
          assert.equal("resume", ev[#ev].name)
          near(5, ev[#ev].at, "resume event at")
          l:release(); w.lease:release()
        end)
      end)

      it("resume_after = 0 resumes at once (in the next turn)", function()
        run(function(sched)
          local pool = mkpool(sched)
          local l = assert(pool:acquire("k"))
          l:observe({ pause = "blip", resume_after = 0 })
          local w = waiter(sched, pool, "k")
          settle(sched)
          sched.sleep(0)
          assert.is_true(w.done)
          assert.is_table(w.lease, tostring(w.code))
          near(0, w.t1, "granted at")
        end)
      end)

      it("resumes only its key when scope = \"key\"", function()
        run(function(sched)
          local pool = mkpool(sched)
          local l = assert(pool:acquire("a"))
          l:observe({ pause = "slow", scope = "key", resume_after = 2 })
          local w = waiter(sched, pool, "a")
          sched.sleep(1)
          assert.is_false(w.done)
          assert.equal("slow", H.check(pool).keys.a.paused)
          sched.sleep(1.5)
          assert.is_true(w.done)
          near(2, w.t1, "granted at")
          assert.is_false(H.check(pool).keys.a.paused)
        end)
      end)

      it("a manual resume and a later pause cancel the scheduled resume", function()
        run(function(sched)
          local pool = mkpool(sched)
          local l = assert(pool:acquire("k"))
          l:observe({ pause = "retry", resume_after = 5 })
          sched.sleep(2)
          pool:resume()
          sched.sleep(1)                    -- t = 3
          pool:pause("manual")
          local w = waiter(sched, pool, "k")
          sched.sleep(4)                    -- t = 7: the old timer (t = 5) did nothing
          assert.is_false(w.done)
          assert.equal("manual", H.check(pool).paused)
          pool:resume()
          settle(sched)
          assert.is_true(w.done)
          near(7, w.t1, "granted at")
        end)
      end)

      it("a later pause is not undone by the timer of an earlier one", function()
        run(function(sched)
          local pool = mkpool(sched)
          local l = assert(pool:acquire("k"))
          l:observe({ pause = "first", resume_after = 5 })
          sched.sleep(2)
          l:observe({ pause = "second", resume_after = 10 })
          local w = waiter(sched, pool, "k")
          sched.sleep(4)                    -- t = 6
          assert.is_false(w.done)
          assert.equal("second", H.check(pool).paused)
          sched.sleep(7)                    -- t = 13
          assert.is_true(w.done)
          near(12, w.t1, "granted at")
        end)
      end)

      it("a manual resume of a key cancels that key's scheduled resume only", function()
        run(function(sched)
          local pool = mkpool(sched)
          local la = assert(pool:acquire("a"))
          la:observe({ pause = "slow", scope = "key", resume_after = 3 })
          pool:resume("a")
          pool:pause("held", "a")
          sched.sleep(5)
          assert.equal("held", H.check(pool).keys.a.paused)
          pool:resume("a")
          assert.is_false(H.check(pool).keys.a.paused)
        end)
      end)
    end)

    ---------------------------------------------------------------------------
    describe("pause_mode = \"fail\"", function()
      it("paused acquisitions fail at once with nil, \"paused\", reason", function()
        run(function(sched)
          local pool, f = mkpool(sched, { pause_mode = "fail" })
          local l = assert(pool:acquire("k"))
          l:observe({ pause = "overloaded" })
          local t = sched.now()
          local l2, code, reason = pool:acquire("k")
          assert.is_nil(l2)
          assert.equal("paused", code)
          assert.equal("overloaded", reason)
          assert.equal(t, sched.now())
          local l3, code3, reason3 = pool:acquire("other", { timeout = 5 })
          assert.is_nil(l3)
          assert.equal("paused", code3)
          assert.equal("overloaded", reason3)
          local l4, code4, reason4 = pool:try_acquire("k")
          assert.is_nil(l4)
          assert.equal("paused", code4)
          assert.equal("overloaded", reason4)
          local s = H.check(pool)
          assert.equal(3, s.rejected)
          assert.equal(0, s.waiting)
          assert.equal(1, f.created)
          pool:resume()
          assert.is_table((pool:acquire("k")))
        end)
      end)

      it("with a key paused, only that key fails", function()
        run(function(sched)
          local pool = mkpool(sched, { pause_mode = "fail" })
          pool:pause("key-down", "a")
          local l, code, reason = pool:acquire("a")
          assert.is_nil(l)
          assert.equal("paused", code)
          assert.equal("key-down", reason)
          assert.is_table((pool:acquire("b")))
          local s = H.check(pool)
          assert.equal(1, s.rejected)
          assert.equal(1, s.keys.a.rejected)
        end)
      end)
    end)

    ---------------------------------------------------------------------------
    describe("probe = true", function()
      it("after resume admits one acquisition alone until its lease observes an outcome that continues", function()
        run(function(sched)
          local pool = mkpool(sched, { probe = true })
          pool:pause("down")
          local w1 = waiter(sched, pool, "k")
          local w2 = waiter(sched, pool, "k")
          local w3 = waiter(sched, pool, "other")
          sched.sleep(1)
          pool:resume()
          sched.sleep(1)
          assert.is_true(w1.done)
          assert.is_table(w1.lease, tostring(w1.code))
          assert.is_false(w2.done)
          assert.is_false(w3.done)
          -- a new acquisition waits too
          local w4 = waiter(sched, pool, "k")
          sched.sleep(1)
          assert.is_false(w4.done)
          assert.equal(3, H.check(pool).waiting)
          w1.lease:observe(nil)              -- the probe continued: the rest go
          settle(sched)
          assert.is_true(w2.done and w3.done and w4.done)
          assert.is_table(w2.lease, tostring(w2.code))
          assert.is_table(w3.lease, tostring(w3.code))
          assert.is_table(w4.lease, tostring(w4.code))
          w2.lease:release()
          assert.is_table((pool:try_acquire("k")))   -- served at once again
        end)
      end)

      it("{ continue = true } from the probe opens the gate too", function()
        run(function(sched)
          local pool = mkpool(sched, { probe = true })
          pool:pause("down")
          pool:resume()
          local probe = assert(pool:acquire("k"))
          local w = waiter(sched, pool, "k")
          sched.sleep(1)
          assert.is_false(w.done)
          probe:observe({ continue = true })
          settle(sched)
          assert.is_true(w.done)
          assert.is_table(w.lease, tostring(w.code))
        end)
      end)

      it("a probe that observes a pause outcome pauses the pool again", function()
        run(function(sched)
          local pool = mkpool(sched, { probe = true })
          pool:pause("down")
          local w1 = waiter(sched, pool, "k")
          local w2 = waiter(sched, pool, "k")
          sched.sleep(1)
          pool:resume()
          sched.sleep(1)
          assert.is_table(w1.lease, tostring(w1.code))
          w1.lease:observe({ pause = "still down" })
          assert.equal("still down", H.check(pool).paused)
          w1.lease:release()
          sched.sleep(5)
          assert.is_false(w2.done)
          pool:resume()
          sched.sleep(1)
          assert.is_true(w2.done)             -- the next probe
          local w3 = waiter(sched, pool, "k")
          sched.sleep(1)
          assert.is_false(w3.done)
          w2.lease:observe(nil)
          settle(sched)
          assert.is_true(w3.done)
        end)
      end)

      it("a probe lease released without observing lets the next acquisition probe", function()
        run(function(sched)
          local pool = mkpool(sched, { probe = true })
          pool:pause("down")
          local w1 = waiter(sched, pool, "k")
          local w2 = waiter(sched, pool, "k")
          local w3 = waiter(sched, pool, "k")
          sched.sleep(1)
          pool:resume()
          sched.sleep(1)
          assert.is_true(w1.done)
          assert.is_false(w2.done)
          w1.lease:release()
          sched.sleep(1)
          assert.is_true(w2.done)             -- w2 is the probe now, alone
          assert.is_table(w2.lease, tostring(w2.code))
          assert.is_false(w3.done)
          w2.lease:observe(nil)
          settle(sched)
          assert.is_true(w3.done)
          assert.is_table(w3.lease, tostring(w3.code))
        end)
      end)

      it("a probe whose create fails lets the next acquisition probe", function()
        run(function(sched)
          local pool, f = mkpool(sched, { probe = true })
          pool:pause("down")
          pool:resume()
          f.fail_next = 1
          local l, code = pool:acquire("k")
          assert.is_nil(l)
          assert.equal("create", code)
          sched.sleep(0.05)                    -- the create backoff's window (<= 0.05 s after one failure)
          local w = waiter(sched, pool, "k", { timeout = 5 })
          sched.sleep(1)
          assert.is_true(w.done)
          assert.is_table(w.lease, tostring(w.code))
          near(0.05, w.t1, "the next probe admitted at")
          local w2 = waiter(sched, pool, "k", { timeout = 5 })
          sched.sleep(1)
          assert.is_false(w2.done)             -- w's lease is the probe now
          w.lease:observe(nil)
          settle(sched)
          assert.is_true(w2.done)
          assert.is_table(w2.lease, tostring(w2.code))
        end)
      end)

      it("probes a key paused by an observed outcome and resumed on its own", function()
        run(function(sched)
          local pool = mkpool(sched, { probe = true, max_live = 8 })
          local first = assert(pool:acquire("a"))
          first:observe({ pause = "down", scope = "key" })
          first:release()
          local w1 = waiter(sched, pool, "a")
          local w2 = waiter(sched, pool, "a")
          sched.sleep(1)
          pool:resume("a")
          sched.sleep(1)
          assert.is_true(w1.done)
          assert.is_table(w1.lease, tostring(w1.code))
          assert.is_false(w2.done)
          assert.is_table((pool:acquire("b")))   -- other keys are not gated
          w1.lease:observe(nil)
          settle(sched)
          assert.is_true(w2.done)
          assert.is_table(w2.lease, tostring(w2.code))
        end)
      end)

      it("probes a key resumed on its own even when the key holds nothing", function()
        run(function(sched)
          local pool = mkpool(sched, { probe = true })
          pool:pause("down", "a")
          pool:resume("a")
          local probe = assert(pool:acquire("a"))
          local wa = waiter(sched, pool, "a")
          assert.is_table((pool:acquire("b")))   -- other keys are not gated
          sched.sleep(1)
          assert.is_false(wa.done)
          probe:observe(nil)
          settle(sched)
          assert.is_true(wa.done)
        end)
      end)

      it("forgets a key once its probe passed and it is empty (max_keys is not used up)", function()
        run(function(sched)
          local pool = mkpool(sched, { probe = true, max_keys = 2 })
          for _, key in ipairs { "a", "b", "c", "d" } do
            local l = assert(pool:acquire(key))
            l:observe({ pause = "429", scope = "key" })
            l:release()
            pool:resume(key)
            local p = assert(pool:acquire(key))   -- the probe
            p:observe(nil)
            p:release()
            pool:retire(key)                      -- the key holds nothing now
            settle(sched)
            assert.is_nil(H.check(pool).keys[key], key .. " still known")
          end
        end)
      end)

      it("checkin of a checkout lets the probe pass; checkin(h, false) passes it on", function()
        run(function(sched)
          local pool = mkpool(sched, { probe = true })
          pool:pause("maintenance")
          pool:resume()
          local _, h1 = pool:checkout()           -- the probe
          local w = waiter(sched, pool, "k")
          sched.sleep(1)
          assert.is_false(w.done)                 -- admitted alone
          pool:checkin(h1, false)                 -- failed: w probes next
          settle(sched)
          assert.is_true(w.done)
          local w2 = waiter(sched, pool, "k")
          sched.sleep(1)
          assert.is_false(w2.done)
          w.lease:release()                       -- a lease needs observe: w2 probes next
          settle(sched)
          assert.is_true(w2.done)
          w2.lease:release()
          local _, h2 = pool:checkout()           -- the probe again
          local w3 = waiter(sched, pool, "k")
          sched.sleep(1)
          assert.is_false(w3.done)
          pool:checkin(h2)                        -- for reuse: the gate opens
          settle(sched)
          assert.is_true(w3.done)
          local a, ha = pool:checkout()
          local b, hb = pool:checkout()
          assert.is_truthy(a and b)               -- no longer one at a time
          pool:checkin(ha)
          pool:checkin(hb)
          w3.lease:release()
          H.check(pool)
        end)
      end)

      it("without probe, resume lets every queued acquisition go at once", function()
        run(function(sched)
          local pool = mkpool(sched)
          pool:pause("down")
          local w1 = waiter(sched, pool, "k")
          local w2 = waiter(sched, pool, "k")
          sched.sleep(1)
          pool:resume()
          settle(sched)
          assert.is_true(w1.done and w2.done)
        end)
      end)
    end)

    ---------------------------------------------------------------------------
    describe("pool:retire", function()
      it("destroys idle clients created before now at once and leased ones at release", function()
        run(function(sched)
          local pool, f = mkpool(sched)
          local held = assert(pool:acquire("a"))
          local l2 = assert(pool:acquire("b"))
          local l3 = assert(pool:acquire("a"))
          local c1, c2, c3 = held.client, l2.client, l3.client
          l2:release()
          l3:release()
          sched.sleep(1)
          pool:retire()
          settle(sched)
          local s = H.check(pool)
          assert.equal(2, s.closed_by.retired)
          assert.equal(0, s.idle)
          assert.equal(1, s.live)
          assert.is_false(c2.alive)
          assert.is_false(c3.alive)
          assert.is_true(c1.alive)
          assert.equal(c1, held.client)
          held:release()
          settle(sched)
          s = H.check(pool)
          assert.equal(3, s.closed_by.retired)
          assert.is_false(c1.alive)
          assert.equal(0, s.live)
          assert.equal(3, f.destroyed)
        end)
      end)

      it("keeps clients created afterwards", function()
        run(function(sched)
          local pool, f = mkpool(sched)
          local l = assert(pool:acquire("a"))
          l:release()
          sched.sleep(1)
          pool:retire()
          sched.sleep(1)
          local n = assert(pool:acquire("a"))
          assert.equal(2, n.client.id)
          n:release()
          sched.sleep(1)
          local s = H.check(pool)
          assert.equal(1, s.idle)
          assert.equal(1, s.closed_by.retired)
          local again = assert(pool:acquire("a"))
          assert.equal(2, again.client.id)
          assert.equal(2, f.created)
        end)
      end)

      it("keeps a client created right after the retire, at the same instant", function()
        run(function(sched)
          local pool, f = mkpool(sched)
          local l = assert(pool:acquire("a"))
          l:release()
          sched.sleep(1)
          pool:retire()                       -- t = 1
          local n = assert(pool:acquire("a")) -- t = 1, created after the retire
          assert.equal(2, n.client.id)
          n:release()
          settle(sched)
          local s = H.check(pool)
          assert.equal(1, s.closed_by.retired)
          assert.equal(1, s.idle)
          assert.equal(1, f.destroyed)
        end)
      end)

      it("with a key touches only that key", function()
        run(function(sched)
          local pool, f = mkpool(sched)
          local la = assert(pool:acquire("a"))
          local la2 = assert(pool:acquire("a"))
          local lb = assert(pool:acquire("b"))
          local lb2 = assert(pool:acquire("b"))
          local ca, cb = la.client, lb.client
          la2:release()
          lb2:release()
          sched.sleep(1)
          pool:retire("a")
          settle(sched)
          local s = H.check(pool)
          assert.equal(1, s.closed_by.retired)
          assert.equal(0, s.keys.a.idle)
          assert.equal(1, s.keys.b.idle)
          la:release()
          lb:release()
          settle(sched)
          s = H.check(pool)
          assert.equal(2, s.closed_by.retired)
          assert.is_false(ca.alive)
          assert.is_true(cb.alive)
          assert.equal(2, s.keys.b.idle)
          assert.equal(0, s.keys.a and s.keys.a.live or 0)
          assert.equal(2, f.destroyed)
        end)
      end)

      it("raises on a key that is not a string", function()
        run(function(sched)
          local pool = mkpool(sched)
          assert_api_error(errmsg(pool.retire, pool, 42), "key")
        end)
      end)
    end)
  end)
end
