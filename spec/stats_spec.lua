-- clientpool.stats: pool:stats() (the counters, per key, wait_count and
-- wait_time) . The whole suite runs once per scheduler entry of
-- spec/helpers.lua, as spec/acquire_spec.lua does (same helpers).

local clientpool = require "clientpool"
local H = require "spec.helpers"

local NUM_FIELDS = { "opened", "reused", "closed", "leaked", "live", "idle", "active", "leases", "creating",
                     "waiting", "timeouts", "rejected", "cancelled", "wait_count", "wait_time" }
local COUNT_FIELDS = { "opened", "reused", "closed", "leaked", "live", "idle", "active", "leases", "creating",
                       "waiting", "timeouts", "rejected", "cancelled", "wait_count" }
local BY_FIELDS = { "idle", "lifetime", "invalid", "error", "max_idle", "drain", "leaked", "retired" }

for _, M in ipairs(H.missing_schedulers()) do
  describe("clientpool stats on " .. M.name, function()
    pending("not run: " .. M.reason)
  end)
end

for _, S in ipairs(H.schedulers { hosts = true }) do
  describe("clientpool stats on " .. S.name, function()
    after_each(function() if S.finish then S.finish() end end)

    -- Spec seconds to the entry's seconds.
    local function T(x) return x * S.scale end

    -- run, mkpool: spec/helpers.lua H.kit
    local run, mkpool = H.kit(S, { max_live = 4 })

    -- The duration got (the entry's seconds) is `expected` spec seconds.
    local function near(expected, got, what) H.time(S, expected, got, what) end

    ---------------------------------------------------------------------------
    describe("stats", function()
      local function check_fields(s, what)
        for _, name in ipairs(NUM_FIELDS) do
          assert(type(s[name]) == "number", what .. "." .. name .. " is " .. type(s[name]))
        end
        for _, name in ipairs(COUNT_FIELDS) do
          assert(s[name] >= 0 and math.floor(s[name]) == s[name], what .. "." .. name .. " is not a count")
        end
        assert(type(s.closed_by) == "table", what .. ".closed_by is " .. type(s.closed_by))
        for _, name in ipairs(BY_FIELDS) do
          assert(type(s.closed_by[name]) == "number",
                 what .. ".closed_by." .. name .. " is " .. type(s.closed_by[name]))
        end
        assert(s.paused == false, what .. ".paused is " .. tostring(s.paused))
      end

      it("has every field of the contract, with its type, for the pool and per key", function()
        run(function(sched)
          local pool = mkpool(sched)
          check_fields(pool:stats(), "stats")
          local a = assert(pool:acquire("a"))
          local b = assert(pool:acquire("b"))
          local s = H.check(pool)
          check_fields(s, "stats")
          assert.is_nil(getmetatable(s))
          assert.is_table(s.keys)
          assert.is_table(s.keys.a)
          assert.is_table(s.keys.b)
          check_fields(s.keys.a, "stats.keys.a")
          check_fields(s.keys.b, "stats.keys.b")
          assert.equal(1, s.keys.a.live)
          assert.equal(1, s.keys.b.active)
          -- a plain table, a new one each time
          s.opened = 99
          assert.equal(2, pool:stats().opened)
          a:release()
          b:release()
        end)
      end)

      it("counts a scripted sequence exactly", function()
        run(function(sched)
          local pool = mkpool(sched, { max_live = 2, max_waiting = 1 })
          local function expect(want)
            local s = H.check(pool)
            for k, v in pairs(want) do
              if k == "closed_by" then
                for r, n in pairs(v) do assert(s.closed_by[r] == n, "closed_by." .. r .. ": " .. s.closed_by[r]) end
              elseif k == "wait_time" then
                near(v, s.wait_time, "wait_time")
              else
                assert(s[k] == v, k .. ": expected " .. tostring(v) .. ", got " .. tostring(s[k]))
              end
            end
            return s
          end
          expect { opened = 0, live = 0, idle = 0, active = 0, leases = 0, waiting = 0 }

          local a1 = assert(pool:acquire("a"))
          expect { opened = 1, live = 1, active = 1, leases = 1, idle = 0, creating = 0 }
          local b1 = assert(pool:acquire("b"))
          local s = expect { opened = 2, live = 2, active = 2, leases = 2 }
          assert.equal(1, s.keys.a.live)
          assert.equal(1, s.keys.b.live)

          local w1
          sched.spawn(function() w1 = { pool:acquire("a", { timeout = T(1) }) } end)
          -- two turns, not a timed sleep: on a real clock a loop stalled past
          -- w1's deadline would time it out before this check
          sched.sleep(0)
          sched.sleep(0)
          s = expect { waiting = 1, wait_count = 0 }
          assert.equal(1, s.keys.a.waiting)

          local l, code, detail = pool:acquire("a", { timeout = T(5) })
          assert.is_nil(l)
          assert.equal("full", code)
          assert.equal(2, detail.live)
          assert.equal(1, detail.waiting)
          expect { rejected = 1, waiting = 1 }

          sched.sleep(T(1.5))
          assert.equal("timeout", w1[2])
          expect { waiting = 0, timeouts = 1, wait_count = 1, wait_time = 1 }

          a1:release()
          expect { idle = 1, active = 1, leases = 1, live = 2 }
          local a2 = assert(pool:acquire("a"))
          expect { reused = 1, idle = 0, active = 2 }
          a2:release(false)
          -- its destroy hook ran at once (it does not yield): nothing closing
          expect { closed = 1, live = 1, opened = 2, active = 1, closing = 0, closed_by = { error = 1 } }
          b1:release()
          expect { idle = 1, active = 0, leases = 0, live = 1 }

          local x = assert(pool:acquire("b"))
          local y = assert(pool:acquire("a"))
          expect { reused = 2, opened = 3, live = 2, active = 2, idle = 0 }
          local token = clientpool.token()
          local w2
          sched.spawn(function() w2 = { pool:acquire("a", { cancel = token }) } end)
          sched.sleep(0)       -- w2 waits from now: 0.5 s until the cancel
          sched.sleep(T(0.5))
          expect { waiting = 1 }
          token:cancel()
          sched.sleep(0)
          sched.sleep(0)
          assert.is_nil(w2[1])
          assert.equal("cancelled", w2[2])
          expect { waiting = 0, cancelled = 1, wait_count = 2, wait_time = 1.5 }
          x:release()
          y:release()
          expect {
            opened = 3, reused = 2, closed = 1, leaked = 0, live = 2, idle = 2, active = 0, leases = 0,
            creating = 0, waiting = 0, timeouts = 1, rejected = 1, cancelled = 1, wait_count = 2,
            closed_by = { idle = 0, lifetime = 0, invalid = 0, error = 1, max_idle = 0, drain = 0,
                          leaked = 0, retired = 0 },
          }
        end)
      end)
    end)

  end)
end
