-- Bad input at random (issue 6): thousands of short sequences of random
-- operations with random hook failures on the loop's virtual clock,
-- checking the invariants through stats() after every step and that
-- everything is released at the end. The argument checks one by one:
-- bad_input_spec.lua.
-- CLIENTPOOL_FUZZ_SEQS=n runs n sequences (default 1500),
-- CLIENTPOOL_FUZZ_SEED=s starts at seed s.

local clientpool = require "clientpool"
local H = require "spec.helpers"

-- Park-Miller minimal standard generator: exact in doubles, the same
-- sequence on every interpreter.
local function rng(seed)
  local x = seed % 2147483646 + 1
  local r = {}
  function r.int(n) -- 1..n
    x = x * 16807 % 2147483647
    return x % n + 1
  end
  function r.chance(p) return r.int(1000000) <= p * 1000000 end
  function r.pick(t) return t[r.int(#t)] end
  return r
end

local CODES = { timeout = true, full = true, closed = true, cancelled = true, create = true, paused = true }

-- One sequence: a random pool, `steps` random operations, then everything
-- released and closed. Returns nothing; raises with the seed and the
-- operation log on any broken invariant.
local function sequence(seed, steps)
  local R = rng(seed)
  local sched = require("clientpool.loop").new { clock = "virtual" }
  local log = {}
  local function note(s) log[#log + 1] = s end
  local logs = {}
  local wrapped = setmetatable({ log = function(m) logs[#logs + 1] = m end }, { __index = sched })

  -- hooks with random failures
  local fail = { create = R.int(4) - 1, validate = R.int(4) - 1, destroy = R.int(3) - 1, park = R.int(3) - 1 }
  local open, created, nopen = {}, 0, 0
  local function create(key)
    local roll = R.int(10)
    if roll <= fail.create then
      if R.chance(0.5) then return nil, "refused" end
      error("create exploded")
    end
    if R.chance(0.3) then sched.sleep(R.int(3) * 0.25) end
    if R.chance(0.1) then error("create exploded late") end
    created = created + 1
    local c = { id = created, key = key, alive = true }
    open[c] = true
    nopen = nopen + 1
    return c
  end
  local function destroy(c)
    if open[c] then open[c] = nil; nopen = nopen - 1 end
    if R.int(10) <= fail.destroy then
      if R.chance(0.5) then sched.sleep(0.1) end
      error("destroy exploded")
    end
  end
  local function validate(c)
    local roll = R.int(10)
    if roll <= fail.validate then
      if R.chance(0.5) then return false end
      error("validate exploded")
    end
    return c.alive
  end
  local function park(c)
    if R.int(10) <= fail.park then error("park exploded") end
    return c
  end
  local function unpark(c)
    if R.int(10) <= fail.park then
      if R.chance(0.5) then return nil end
      error("unpark exploded")
    end
    return c
  end

  local max_live = R.int(4)
  local capacity = R.chance(0.2) and 2 or 1
  local o = {
    create = create, destroy = destroy, scheduler = wrapped, max_live = max_live, capacity = capacity,
    max_waiting = R.int(7) - 1, seed = seed,
  }
  if R.chance(0.3) then o.max_concurrency = R.int(max_live * capacity) end
  if R.chance(0.5) then o.validate = validate end
  if R.chance(0.3) then o.park, o.unpark = park, unpark end
  if R.chance(0.4) then o.acquire_timeout = R.int(4) * 0.5 end
  if R.chance(0.3) then o.idle_timeout = R.int(4) end
  if R.chance(0.3) then o.max_lifetime = R.int(6) end
  if R.chance(0.3) then o.max_idle = R.int(max_live + 1) - 1 end
  if R.chance(0.3) then o.per_key = { max_live = R.int(max_live) } end
  if R.chance(0.2) then o.pause_mode = "fail" end
  if R.chance(0.2) then o.probe = true end
  if R.chance(0.2) then o.min_idle = math.min(1, o.max_idle or max_live) end
  local KEYS = { nil, "a", "b" }
  local nkeys = R.int(3)
  local pool = clientpool.new(o)
  local run_floor = o.min_idle and R.chance(0.7)

  local held = {}      -- leases and checkout handles: { lease = l } or { h = h }
  local tokens = {}
  local tasks, finished = 0, 0
  local finishing = false

  local function check(step)
    local ok, err = pcall(function()
      local s = H.check(pool)
      assert(s.leases <= (o.max_concurrency or max_live * capacity), "leases > max_concurrency")
      assert(s.live + s.creating <= max_live, "live + creating > max_live")
      assert(s.waiting <= o.max_waiting, "waiting > max_waiting")
      assert(s.idle + s.active <= s.live, "idle + active > live")
      if o.per_key then
        for _, ks in pairs(s.keys) do
          assert(ks.live + ks.creating <= o.per_key.max_live, "a key's live + creating > per_key.max_live")
        end
      end
      -- a destroyed record's client is destroyed by a task that may not
      -- have run yet: never fewer clients open than live records
      assert(nopen >= s.live, "fewer clients open than live records")
    end)
    if not ok then
      error(("seed %d, step %s: %s\n  ops: %s"):format(seed, tostring(step), tostring(err),
        table.concat(log, "; ")), 0)
    end
  end

  local function outcome(what, l, code, detail)
    if l then return end
    if not CODES[code] then
      error(("seed %d: %s returned an unknown code %s (%s)"):format(seed, what, tostring(code), tostring(detail)), 0)
    end
  end

  local function keep(entry)
    if finishing then
      if entry.lease then entry.lease:release() else pool:checkin(entry.h) end
    else
      held[#held + 1] = entry
    end
  end

  local function spawn_acquirer(key, opts)
    tasks = tasks + 1
    sched.spawn(function()
      local l, code, detail = pool:acquire(key, opts)
      outcome("acquire", l, code, detail)
      if l then keep({ lease = l }) end
      finished = finished + 1
    end)
  end

  local ops = {
    function() -- acquire in a task (it may wait)
      local key = KEYS[R.int(nkeys)]
      local opts
      local roll = R.int(4)
      if roll == 1 then opts = { timeout = R.int(5) * 0.25 - 0.25 }
      elseif roll == 2 then
        local t = clientpool.token()
        tokens[#tokens + 1] = t
        opts = { cancel = t, timeout = R.chance(0.5) and 3 or nil }
      end
      note("acquire " .. tostring(key))
      spawn_acquirer(key, opts)
    end,
    function() -- try_acquire
      local key = KEYS[R.int(nkeys)]
      note("try " .. tostring(key))
      local l, code, detail = pool:try_acquire(key)
      outcome("try_acquire", l, code, detail)
      if l then keep({ lease = l }) end
    end,
    function() -- checkout in a task
      local key = KEYS[R.int(nkeys)]
      note("checkout " .. tostring(key))
      tasks = tasks + 1
      sched.spawn(function()
        local c, h = pool:checkout(key)
        outcome("checkout", c, h)
        if c then keep({ h = h }) end
        finished = finished + 1
      end)
    end,
    function() -- release one held (for reuse, or not)
      if #held == 0 then return end
      local i = R.int(#held)
      local entry = table.remove(held, i)
      local reuse = not R.chance(0.25)
      note("release " .. tostring(reuse))
      if entry.lease then
        if R.chance(0.1) then entry.lease.client.alive = false end
        entry.lease:release(reuse)
        if R.chance(0.2) then entry.lease:release() end -- idempotent
      else
        pool:checkin(entry.h, reuse)
        if R.chance(0.2) then pool:checkin(entry.h) end
      end
    end,
    function() -- destroy one held lease
      for i, entry in ipairs(held) do
        if entry.lease then
          table.remove(held, i)
          note("destroy")
          entry.lease:destroy()
          return
        end
      end
    end,
    function() -- time passes: waiters time out, hooks finish, clients expire
      local dt = R.pick { 0, 0, 0.1, 0.3, 1, 2.5 }
      note("sleep " .. dt)
      sched.sleep(dt)
    end,
    function() -- cancel a token
      if #tokens == 0 then return end
      note("cancel")
      table.remove(tokens, R.int(#tokens)):cancel()
    end,
    function() -- pause / resume the pool or a key
      local key = R.chance(0.5) and KEYS[R.int(nkeys)] or nil
      if R.chance(0.5) then
        note("pause " .. tostring(key))
        pool:pause("fuzz", key)
      else
        note("resume " .. tostring(key))
        pool:resume(key)
      end
    end,
    function() -- retire
      local key = R.chance(0.5) and KEYS[R.int(nkeys)] or nil
      note("retire " .. tostring(key))
      pool:retire(key)
    end,
    function() -- a client dies while idle (validate may notice)
      for c in pairs(open) do
        if R.chance(0.3) then c.alive = false end
      end
      note("kill idle")
    end,
    function() -- close (rarely): everything after sees "closed"
      if R.chance(0.15) then
        note("close")
        pool:close()
      end
    end,
  }
  local WEIGHTS = { 6, 3, 2, 6, 1, 4, 1, 1, 1, 1, 1 }
  local total = 0
  for _, w in ipairs(WEIGHTS) do total = total + w end
  local function pick_op()
    local n = R.int(total)
    for i, w in ipairs(WEIGHTS) do
      if n <= w then return ops[i] end
      n = n - w
    end
  end

  local main_done = false
  if run_floor then
    tasks = tasks + 1
    sched.spawn(function()
      pool:run()
      finished = finished + 1
    end)
  end
  sched.spawn(function()
    check("start")
    for step = 1, steps do
      pick_op()()
      check(step)
    end
    -- the end: nothing new; every task finishes, everything goes back
    finishing = true
    note("finish")
    for _, t in ipairs(tokens) do t:cancel() end
    pool:resume()
    pool:resume("a")
    pool:resume("b")
    for i = #held, 1, -1 do
      local entry = held[i]
      held[i] = nil
      if entry.lease then entry.lease:release() else pool:checkin(entry.h) end
      check("finish")
    end
    pool:close()
    for _ = 1, 100 do
      if finished == tasks then break end
      sched.sleep(1)
      check("finish")
    end
    for _ = 1, 3 do sched.sleep(0) end
    main_done = true
  end)
  local ok, err = pcall(sched.run)
  if not ok then
    error(("seed %d: the loop failed: %s\n  ops: %s"):format(seed, tostring(err), table.concat(log, "; ")), 0)
  end
  local s = pool:stats()
  local why
  if not main_done then why = "the sequence did not finish"
  elseif finished ~= tasks then why = (tasks - finished) .. " task(s) never finished"
  elseif s.live ~= 0 or s.leases ~= 0 or s.waiting ~= 0 or s.creating ~= 0 then
    why = ("at the end live %d, leases %d, waiting %d, creating %d"):format(s.live, s.leases, s.waiting, s.creating)
  elseif nopen ~= 0 then why = nopen .. " client(s) never destroyed"
  elseif sched.stats().tasks ~= 0 then why = "tasks left in the loop"
  end
  if why then
    error(("seed %d: %s\n  ops: %s"):format(seed, why, table.concat(log, "; ")), 0)
  end
  check("end")
  return created
end

describe("seeded random operations on the virtual loop", function()
  it("keep the invariants after every step and end with everything released", function()
    local n = tonumber(os.getenv("CLIENTPOOL_FUZZ_SEQS")) or 1500
    local first = tonumber(os.getenv("CLIENTPOOL_FUZZ_SEED")) or 1
    local made = 0
    for seed = first, first + n - 1 do
      made = made + sequence(seed, 40)
    end
    assert.is_true(made > n) -- the hooks did create clients
  end)
end)
