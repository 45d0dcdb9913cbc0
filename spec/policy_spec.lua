-- clientpool.policy: the ready-made http and redis policies, applied
-- through lease:observe (docs/api.md "Policies, pause and resume"; issue
-- 4 "Protocol policy"; the directives themselves: admission_spec.lua).
--
-- Every scenario runs as a task on each scheduler of H.schedulers(), on a
-- virtual clock: time only moves when tasks sleep, so resume_after deadlines
-- and acquire timeouts are exact and nothing sleeps for real.

local clientpool = require "clientpool"
local policy = require "clientpool.policy"
local H = require "spec.helpers"

local function near(expected, got, what)
  assert(type(got) == "number" and math.abs(got - expected) < 1e-6,
         (what or "value") .. ": expected " .. tostring(expected) .. ", got " .. tostring(got))
end

-- The policy most scenarios use: the outcome is the directive itself, so a
-- test reads `lease:observe { pause = "busy" }`.
local function echo(outcome)
  return outcome
end

for _, S in ipairs(H.schedulers()) do
  describe("clientpool ready-made policies on " .. S.name, function()

    -- run, mkpool, settle, waiter: spec/helpers.lua H.kit
    local run, mkpool, settle, waiter = H.kit(S, { max_live = 4, policy = echo })

    ---------------------------------------------------------------------------
    describe("clientpool.policy.http", function()
      it("is reachable as clientpool.policy", function()
        assert.equal(policy, clientpool.policy)
        assert.is_function(policy.http)
        assert.is_function(policy.redis)
        assert.is_function(policy.retry_after)
      end)

      it("pauses on 429 and 503 by default (key scope), continues on 200 and 500", function()
        local P = policy.http()
        local d = P(429)
        assert.is_table(d)
        assert.is_string(d.pause)
        assert.equal("key", d.scope)
        d = P(503)
        assert.is_table(d)
        assert.is_string(d.pause)
        assert.is_nil(P(200))
        assert.is_nil(P(500))
        assert.is_nil(P(404))
        assert.is_nil(P(nil))
      end)

      it("in a pool: 429 pauses the lease's key only; 200 and 500 change nothing", function()
        run(function(sched)
          local pool = mkpool(sched, { policy = policy.http { backoff = { base = 60 } } })
          local l = assert(pool:acquire("api"))
          l:observe(200)
          l:observe({ status = 500, headers = {} })
          local s = H.check(pool)
          assert.is_false(s.paused)
          assert.is_false(s.keys.api.paused)
          l:observe({ status = 429, headers = {} })
          s = H.check(pool)
          assert.is_false(s.paused)
          assert.is_string(s.keys.api.paused)
          assert.is_table((pool:try_acquire("other")))
          local w = waiter(sched, pool, "api")
          sched.sleep(30)
          assert.is_false(w.done)            -- no Retry-After: the policy's backoff (60 s here)
          pool:resume("api")
          settle(sched)
          assert.is_true(w.done)
        end)
      end)

      it("honours Retry-After: \"5\" resumes the key after 5 seconds", function()
        run(function(sched)
          local pool = mkpool(sched, { policy = policy.http() })
          local l = assert(pool:acquire("api"))
          l:observe({ status = 503, headers = { ["Retry-After"] = "5" } })
          local w = waiter(sched, pool, "api")
          sched.sleep(4.5)
          assert.is_false(w.done)
          sched.sleep(1)
          assert.is_true(w.done)
          assert.is_table(w.lease, tostring(w.code))
          near(5, w.t1, "granted at")
        end)
      end)

      it("reads Retry-After in any header case", function()
        local P = policy.http()
        for _, name in ipairs { "Retry-After", "retry-after", "RETRY-AFTER", "rEtRy-AfTeR" } do
          local d = P({ status = 429, headers = { [name] = "7" } })
          assert.is_table(d, name)
          assert.equal(7, d.resume_after, name)
        end
        -- no Retry-After: the policy's own backoff, never none
        assert.equal(policy.BACKOFF.base, P({ status = 429, headers = { ["X-Other"] = "7" } }).resume_after)
      end)

      it("turns an HTTP-date Retry-After into the seconds until then", function()
        local date = "Wed, 21 Oct 2015 07:28:00 GMT"   -- 1445412480 (Unix time)
        assert.equal(120, policy.retry_after(date, 1445412480 - 120))
        assert.equal(0, policy.retry_after(date, 1445412480 + 60))   -- in the past: at once
        assert.equal(0, policy.retry_after(date, 1445412480))
        assert.equal(7, policy.retry_after("7"))
        assert.equal(7, policy.retry_after(" 7 "))
        assert.is_nil(policy.retry_after(nil))
        assert.is_nil(policy.retry_after("soon"))
        assert.is_nil(policy.retry_after("-3"))
        -- through the policy, relative to the wall clock
        local future = os.date("!%a, %d %b %Y %H:%M:%S GMT", os.time() + 30)
        local d = policy.http()({ status = 429, headers = { ["retry-after"] = future } })
        assert.is_number(d.resume_after)
        assert(d.resume_after >= 28 and d.resume_after <= 30, "resume_after " .. tostring(d.resume_after))
      end)

      it("pauses on the configured statuses only", function()
        run(function(sched)
          local P = policy.http { statuses = { 418, 502 } }
          assert.is_table(P(418))
          assert.is_table(P(502))
          assert.is_nil(P(429))
          assert.is_nil(P(503))
          local pool = mkpool(sched, { policy = P })
          local l = assert(pool:acquire("api"))
          l:observe(429)
          assert.is_false(H.check(pool).keys.api.paused)
          l:observe({ status = 418 })
          assert.is_string(H.check(pool).keys.api.paused)
        end)
      end)

      it("accepts the outcome as a status number or a { status, headers } table", function()
        run(function(sched)
          local pool = mkpool(sched, { policy = policy.http { backoff = { base = 60 } } })
          local l = assert(pool:acquire("a"))
          l:observe(429)
          local l2 = assert(pool:acquire("b"))
          l2:observe({ status = 429, headers = { ["retry-after"] = "3" } })
          local s = H.check(pool)
          assert.is_string(s.keys.a.paused)
          assert.is_string(s.keys.b.paused)
          sched.sleep(3)
          settle(sched)
          s = H.check(pool)
          assert.is_string(s.keys.a.paused)
          assert.is_false(s.keys.b.paused)
        end)
      end)

      it("a pause of the default key (acquire without a key) is the key's: resume(DEFAULT_KEY) lifts it", function()
        run(function(sched)
          local pool = mkpool(sched, { policy = policy.http { backoff = { base = 60 } } })
          local l = assert(pool:acquire())
          l:observe(429)                      -- no Retry-After: a 60 s backoff, or the owner resumes
          assert.is_false(H.check(pool).paused)
          local w = waiter(sched, pool, nil, { timeout = 5 })
          sched.sleep(1)
          assert.is_false(w.done)
          pool:resume()                       -- the pool's gate: not this pause
          settle(sched)
          assert.is_false(w.done)
          pool:resume(clientpool.DEFAULT_KEY)
          settle(sched)
          assert.is_true(w.done)
          assert.is_table(w.lease, tostring(w.code))
        end)
      end)

      it("scope = \"pool\" pauses the whole pool", function()
        run(function(sched)
          local pool = mkpool(sched, { policy = policy.http { scope = "pool" } })
          local l = assert(pool:acquire("a"))
          l:observe(503)
          assert.is_string(H.check(pool).paused)
        end)
      end)
    end)

    ---------------------------------------------------------------------------
    describe("clientpool.policy.redis", function()
      it("LOADING and BUSY pause the key", function()
        run(function(sched)
          local pool = mkpool(sched, { policy = policy.redis { backoff = { base = 60 } } })
          local l1 = assert(pool:acquire("r1"))
          local l2 = assert(pool:acquire("r2"))
          l1:observe("LOADING Redis is loading the dataset in memory")
          local s = H.check(pool)
          assert.is_false(s.paused)
          assert.is_string(s.keys.r1.paused)
          assert.is_false(s.keys.r2.paused)
          l2:observe("BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSCRIPT.")
          s = H.check(pool)
          assert.is_string(s.keys.r2.paused)
          assert.is_table((pool:try_acquire("r3")))
          local w = waiter(sched, pool, "r1")
          sched.sleep(1)
          assert.is_false(w.done)
          pool:resume("r1")
          settle(sched)
          assert.is_true(w.done)
        end)
      end)

      it("other errors and nil continue", function()
        run(function(sched)
          local pool, f = mkpool(sched, { policy = policy.redis() })
          local l = assert(pool:acquire("r"))
          l:observe(nil)
          l:observe("ERR unknown command 'FOO'")
          l:observe("WRONGTYPE Operation against a key holding the wrong kind of value")
          local s = H.check(pool)
          assert.is_false(s.paused)
          assert.is_false(s.keys.r.paused)
          l:release()
          s = H.check(pool)
          assert.equal(1, s.idle)
          assert.equal(0, s.closed)
          assert.equal(1, f.created)
        end)
      end)

      it("READONLY retires the client and every client of its key created before it", function()
        run(function(sched)
          local pool, f = mkpool(sched, { policy = policy.redis(), max_live = 8 })
          local a = assert(pool:acquire("r"))     -- t = 0
          sched.sleep(1)
          local b = assert(pool:acquire("r"))     -- t = 1, stays leased
          sched.sleep(1)
          local c = assert(pool:acquire("r"))     -- t = 2, sees READONLY
          sched.sleep(1)
          local d = assert(pool:acquire("r"))     -- t = 3, newer
          local o = assert(pool:acquire("other")) -- another key, older than c
          local ca, cb, cc, cd, co = a.client, b.client, c.client, d.client, o.client
          a:release()
          d:release()
          o:release()
          sched.sleep(1)
          c:observe("READONLY You can't write against a read only replica.")
          settle(sched)
          local s = H.check(pool)
          assert.equal(1, s.closed_by.retired)     -- the idle older one, at once
          assert.is_false(ca.alive)
          assert.is_true(cb.alive)                 -- leased: at release
          assert.is_true(cc.alive)                 -- the observer keeps its client
          assert.equal(cc, c.client)
          assert.is_true(cd.alive)
          assert.is_true(co.alive)
          assert.is_false(s.keys.r.paused)
          c:release()
          settle(sched)
          s = H.check(pool)
          assert.equal(2, s.closed_by.retired)
          assert.is_false(cc.alive)
          b:release()
          settle(sched)
          s = H.check(pool)
          assert.equal(3, s.closed_by.retired)
          assert.is_false(cb.alive)
          -- the newer client and the other key survive
          assert.is_true(cd.alive)
          assert.is_true(co.alive)
          assert.equal(1, s.keys.r.idle)
          assert.equal(1, s.keys.other.idle)
          local again = assert(pool:acquire("r"))
          assert.equal(cd, again.client)
          assert.equal(5, f.created)
          assert.equal(3, f.destroyed)
        end)
      end)

      it("READONLY orders clients created at the same clock reading by creation", function()
        run(function(sched)
          local pool = mkpool(sched, { policy = policy.redis(), max_live = 8 })
          -- four clients at one instant (a game frame, a coarse clock)
          local l = {}
          for i = 1, 4 do l[i] = assert(pool:acquire("r")) end
          local c = {}
          for i = 1, 4 do c[i] = l[i].client end
          l[1]:release()
          l[2]:release()
          l[4]:release()
          l[3]:observe("READONLY You can't write against a read only replica.")
          settle(sched)
          local s = H.check(pool)
          assert.equal(2, s.closed_by.retired)    -- the two older idle ones
          assert.is_false(c[1].alive)
          assert.is_false(c[2].alive)
          assert.is_true(c[4].alive)              -- created after the observer
          l[3]:release()
          settle(sched)
          s = H.check(pool)
          assert.equal(3, s.closed_by.retired)
          assert.is_false(c[3].alive)
          assert.equal(1, s.keys.r.idle)
        end)
      end)
    end)

  end)
end
