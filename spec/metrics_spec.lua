-- clientpool.metrics: the text exposition of pools, read back with a strict
-- parser (spec/prom_text.lua) and checked by promtool; every value against
-- pool:stats(). The nginx /metrics across workers is spec/nginx/cases/
-- metrics.lua; a real Prometheus server scraping it is spec/prometheus/.

local clientpool = require "clientpool"
local metrics = require "clientpool.metrics"
local P = require "spec.prom_text"

local function vloop() return require("clientpool.loop").new { clock = "virtual" } end

-- A pool on a virtual clock with some history: waits, a timeout, an error
-- release, two keys.
local function busy_pool(o)
  local L = vloop()
  local n = 0
  local opts = {
    create = function() n = n + 1; return { id = n } end, destroy = function() end,
    max_live = 2, max_waiting = 10, scheduler = L,
  }
  for k, v in pairs(o or {}) do opts[k] = v end
  local pool = clientpool.new(opts)
  return pool, L
end

local function history(pool, L)
  for i = 1, 6 do
    L.spawn(function()
      local lease = pool:acquire(i % 2 == 0 and "k2" or nil, { timeout = i == 6 and 0.001 or nil })
      if not lease then return end
      L.sleep(0.01 * i)
      lease:release(i ~= 3)
    end)
  end
  L.run()
end

describe("clientpool.metrics", function()
  describe("prometheus()", function()
    it("renders every stats() value under its family, pool-wide and per key", function()
      local pool, L = busy_pool()
      metrics.track(pool)
      history(pool, L)
      local text = metrics.prometheus { main = pool }
      local doc = assert(P.parse(text))
      local s = pool:stats()
      local l = { pool = "main" }
      for _, f in ipairs { "live", "idle", "active", "leases", "waiting", "creating", "closing" } do
        if f ~= "closing" or s.closing ~= nil then
          assert.equal(s[f], P.value(doc, "clientpool_" .. f, l), f)
          assert.equal("gauge", doc.types["clientpool_" .. f])
        end
      end
      assert.equal(0, P.value(doc, "clientpool_floor_spent", l))
      local counters = { opened = "opened_total", reused = "reused_total", timeouts = "timeouts_total",
                         rejected = "rejected_total", cancelled = "cancelled_total",
                         create_failed = "create_failed_total", leaked = "leaked_total",
                         wait_count = "waits_total", wait_time = "wait_time_seconds_total" }
      for f, name in pairs(counters) do
        assert.equal(s[f], P.value(doc, "clientpool_" .. name, l), f)
        assert.equal("counter", doc.types["clientpool_" .. name])
      end
      assert.is_true(s.timeouts >= 1 and s.wait_count >= 3 and s.closed_by.error == 1)
      for reason, v in pairs(s.closed_by) do
        assert.equal(v, P.value(doc, "clientpool_closed_total", { pool = "main", reason = reason }), reason)
      end
      assert.equal(0, P.value(doc, "clientpool_paused", l))
      -- per key: the default key is ""
      for kname, ks in pairs(s.keys) do
        local kl = { pool = "main", key = kname }
        assert.equal(ks.live, P.value(doc, "clientpool_key_live", kl))
        assert.equal(ks.opened, P.value(doc, "clientpool_key_opened_total", kl))
        assert.equal(ks.closed_by.error, P.value(doc, "clientpool_key_closed_total",
                                                 { pool = "main", key = kname, reason = "error" }))
      end
      assert.is_table(s.keys[""])
      assert.is_table(s.keys.k2)
    end)

    it("names are prefixed clientpool_, each family once with HELP and TYPE, counters end in _total", function()
      local pool, L = busy_pool()
      history(pool, L)
      local doc = assert(P.parse(metrics.prometheus { a = pool, b = pool }))
      assert.is_true(#doc.order >= 30)
      for _, fam in ipairs(doc.order) do
        assert.truthy(fam:find("^clientpool_"), fam)
        assert.is_string(doc.helps[fam], fam)
        if doc.types[fam] == "counter" then assert.truthy(fam:find("_total$"), fam) end
      end
      for _, smp in ipairs(doc.samples) do assert.is_string(smp.labels.pool) end
    end)

    it("promtool check metrics accepts it, odd pool and key names included", function()
      assert.is_true(P.have_promtool(), "promtool is missing (Debian: prometheus; scripts/deps.sh installs it)")
      local pool, L = busy_pool()
      metrics.track(pool)
      history(pool, L)
      L.spawn(function()
        local a = assert(pool:acquire('we"ird\\key\nline 2'))
        local b = assert(pool:acquire("ключ ü"))
        a:release(); b:release()
      end)
      L.run()
      pool:pause("maintenance")
      local text = metrics.prometheus({ ['pool "x"\\\n'] = pool, plain = pool }, { labels = { instance = "h:1" } })
      local ok, out = P.promtool(text)
      assert.is_true(ok, out)
      local doc = assert(P.parse(text))
      assert.equal(1, P.value(doc, "clientpool_key_live", { instance = "h:1", pool = 'pool "x"\\\n',
                                                              key = 'we"ird\\key\nline 2' }))
      assert.equal(1, P.value(doc, "clientpool_paused", { instance = "h:1", pool = "plain" }))
      pool:resume()
    end)

    it("the wait-time histogram of a tracked pool: every wait that got a client or timed out", function()
      local pool, L = busy_pool { max_live = 1 }
      metrics.track(pool, { 0.01, 0.1, 1 })
      L.spawn(function()
        local a = assert(pool:acquire())
        L.spawn(function()                                  -- waits 0.05 s
          local l = assert(pool:acquire()); l:release()
        end)
        L.spawn(function()                                  -- times out after 0.02 s
          assert.is_nil(pool:acquire(nil, { timeout = 0.02 }))
        end)
        L.sleep(0.05)
        a:release()
        L.sleep(0.01)
        local c = assert(pool:acquire())                    -- no wait: not in the histogram
        L.spawn(function()                                  -- waits 0.5 s
          local l = assert(pool:acquire()); l:release()
        end)
        L.sleep(0.5)
        c:release()
      end)
      L.run()
      local doc = assert(P.parse(metrics.prometheus { p = pool }))
      local function b(le) return P.value(doc, "clientpool_wait_duration_seconds_bucket", { pool = "p", le = le }) end
      assert.equal("histogram", doc.types.clientpool_wait_duration_seconds)
      assert.equal(0, b("0.01"))
      assert.equal(2, b("0.1"))          -- 0.02 (timeout) and 0.05
      assert.equal(3, b("1"))            -- and 0.5
      assert.equal(3, b("+Inf"))
      assert.equal(3, P.value(doc, "clientpool_wait_duration_seconds_count", { pool = "p" }))
      assert.near(0.57, P.value(doc, "clientpool_wait_duration_seconds_sum", { pool = "p" }), 1e-6)
      assert.equal(pool:stats().wait_count, P.value(doc, "clientpool_waits_total", { pool = "p" }))
    end)

    it("without a tracker (track = false) the histogram is its +Inf bucket: wait_count and wait_time", function()
      local pool, L = busy_pool()
      history(pool, L)
      local doc = assert(P.parse(metrics.prometheus({ p = pool }, { track = false })))
      local s = pool:stats()
      assert.equal(1, #P.select(doc, "clientpool_wait_duration_seconds_bucket", { pool = "p" }))
      assert.equal(s.wait_count, P.value(doc, "clientpool_wait_duration_seconds_bucket", { pool = "p", le = "+Inf" }))
      assert.near(s.wait_time, P.value(doc, "clientpool_wait_duration_seconds_sum", { pool = "p" }), 1e-9)
      assert.equal(s.wait_count, P.value(doc, "clientpool_wait_duration_seconds_count", { pool = "p" }))
    end)

    it("keys = false leaves the per-key families out", function()
      local pool, L = busy_pool()
      history(pool, L)
      local doc = assert(P.parse(metrics.prometheus({ p = pool }, { keys = false })))
      for _, fam in ipairs(doc.order) do assert.is_nil(fam:find("^clientpool_key_"), fam) end
    end)

    it("a fleet name renders clientpool.fleet's fleet-wide gauges; fleet_stats is replaceable", function()
      local fleet = require "clientpool.fleet"
      local name = "mspec" .. tostring(os.time()) .. "-" .. math.random(1e6)
      fleet.new(name, { max_live = 4, members = 4 })
      local ok, text = pcall(metrics.prometheus, { shared = name })
      local fs = fleet.stats(name)
      fleet.remove(name)
      assert.is_true(ok, text)
      local doc = assert(P.parse(text))
      assert.equal(fs.live, P.value(doc, "clientpool_live", { pool = "shared" }))
      assert.equal(fs.leases, P.value(doc, "clientpool_leases", { pool = "shared" }))
      assert.equal(0, P.value(doc, "clientpool_paused", { pool = "shared" }))
      assert.is_nil(doc.types.clientpool_wait_duration_seconds)     -- a fleet keeps no waits
      assert.is_true(P.promtool(text))
      assert.is_false((pcall(metrics.prometheus, { f = name })))     -- removed: fleet.stats raises
      local pool, L = busy_pool()
      history(pool, L)
      local saved = metrics.fleet_stats
      metrics.fleet_stats = function(n) assert.equal("other", n); return pool:stats() end
      local doc2 = assert(P.parse(metrics.prometheus { f = "other" }))
      metrics.fleet_stats = saved
      assert.equal(pool:stats().opened, P.value(doc2, "clientpool_opened_total", { pool = "f" }))
    end)

    it("bad input raises a clientpool.metrics error naming it", function()
      local pool = busy_pool()
      local function err(fn, ...)
        local ok, e = pcall(fn, ...)
        assert.is_false(ok)
        assert.truthy(tostring(e):find("^clientpool.metrics: ") or tostring(e):find(": clientpool.metrics: "), e)
        return tostring(e)
      end
      assert.truthy(err(metrics.prometheus, pool):find("table of name %-> pool"))
      assert.truthy(err(metrics.prometheus, { p = 42 }):find("must be a pool or a fleet name"))
      assert.truthy(err(metrics.prometheus, { p = pool }, { nope = 1 }):find("unknown option 'nope'"))
      assert.truthy(err(metrics.prometheus, { p = pool }, { labels = { ["bad-name"] = "x" } }):find("bad label name"))
      assert.truthy(err(metrics.prometheus, { p = pool }, { labels = { pool = "x" } }):find("own"))
      assert.truthy(err(metrics.track, {}):find("expects a pool"))
      assert.truthy(err(metrics.track, pool, { 1, 0.5 }):find("increasing"))
      local ok, e = pcall(metrics.publish, "d", {})
      assert.is_false(ok)
      assert.truthy(tostring(e):find("needs OpenResty", 1, true))
    end)

    it("numbers: integers plainly, fractions in their shortest exact form, infinities as +Inf", function()
      assert.equal("3", metrics.format_number(3))
      assert.equal("0.0025", metrics.format_number(0.0025))
      assert.equal("0.1", metrics.format_number(0.1))
      assert.equal("+Inf", metrics.format_number(math.huge))
      assert.equal("NaN", metrics.format_number(0 / 0))
      assert.equal(1 / 3, tonumber(metrics.format_number(1 / 3)))
      assert.equal('a\\"b\\\\c\\nd', metrics.escape_label('a"b\\c\nd'))
    end)
  end)
end)
