-- Shared spec helpers: the schedulers the semantic suite runs on, simulated
-- clients, and an invariant check over pool:stats().
local H = {}

-- Each entry makes a fresh scheduler adapter and runs a test body as a task
-- until everything is done. Timeouts use the virtual clock where the
-- scheduler has one, so no test sleeps for real. Hosts add entries here
-- (cqueues, luv, copas) so the same suite runs on every adapter.
function H.schedulers()
  return {
    {
      name = "loop (virtual clock)",
      new = function()
        return require("clientpool.loop").new { clock = "virtual" }
      end,
      -- run(sched, fn): runs fn in a task and the scheduler to completion
      run = function(sched, fn, ...)
        local args = { n = select("#", ...), ... }
        sched.spawn(function() fn((table.unpack or unpack)(args, 1, args.n)) end)
        sched.run()
      end,
    },
  }
end

-- A simulated client factory: counts creates/destroys, optional latency and
-- failure injection. `sched` is the adapter (for sleep).
function H.factory(sched, o)
  o = o or {}
  local f = { created = 0, destroyed = 0, open = {}, log = {}, fail_next = 0, throw_next = 0 }
  function f.create(key)
    if o.latency then sched.sleep(o.latency) end
    if f.throw_next > 0 then f.throw_next = f.throw_next - 1; error("create exploded") end
    if f.fail_next > 0 then f.fail_next = f.fail_next - 1; return nil, "refused" end
    f.created = f.created + 1
    local c = { id = f.created, key = key, alive = true }
    f.open[c] = true
    f.log[#f.log + 1] = "create " .. c.id
    return c
  end
  function f.destroy(c)
    f.destroyed = f.destroyed + 1
    if c then c.alive = false; f.open[c] = nil end
    f.log[#f.log + 1] = "destroy " .. tostring(c and c.id)
  end
  function f.count_open()
    local n = 0
    for _ in pairs(f.open) do n = n + 1 end
    return n
  end
  return f
end

-- Checks the identities every pool must keep; returns the stats.
function H.check(pool)
  local s = pool:stats()
  assert(s.opened - s.closed == s.live, "opened - closed ~= live")
  assert(s.idle <= s.live, "idle > live")
  assert(s.active + s.idle <= s.live, "active + idle > live")
  assert(s.leases >= s.active, "leases < active")
  local sum = { live = 0, idle = 0, leases = 0, waiting = 0 }
  for _, ks in pairs(s.keys) do
    for f in pairs(sum) do sum[f] = sum[f] + ks[f] end
  end
  for f, v in pairs(sum) do assert(v == s[f], "keys' " .. f .. " do not sum to the pool's") end
  return s
end

return H
