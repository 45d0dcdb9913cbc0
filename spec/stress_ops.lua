-- The random side of the driver's stress test (issue 18; the model and
-- what it checks: spec/stress_model.lua).
--
-- One seed: a random configuration (max_live 1-4, capacity 1-3, idle caps,
-- per-key caps, warm keys, timeouts, lifetimes, validate_after_idle,
-- max_waiting, max_concurrency, max_keys, pause_mode, probe) and random
-- hooks (create, validate and destroy that succeed, fail, throw or yield
-- for a while; slow destroys), then workers on the virtual-clock loop
-- doing random operations through the public API only: acquire (random
-- keys, timeouts, cancel tokens, on_drain), try_acquire, with() (whose
-- function may raise), checkout/checkin, observe() with a policy that
-- pauses (key or pool, resume_after) and retires, release / release(false) /
-- destroy(), dropped (leaked) leases and collectgarbage, retire, manual
-- pause and resume, on_cancel callbacks that release; a warm floor
-- (run()), and close or drain (then cancel_active) at a random moment.
--
-- Here: the seeded generator, the configuration, the workers and the task
-- that closes or drains the pool; every call reports to the model through
-- the functions it hands to O.start.
local clientpool = require "clientpool"

local unpack = table.unpack or unpack -- luacheck: ignore 143
local co_create, co_resume, co_status, co_yield = coroutine.create, coroutine.resume, coroutine.status, coroutine.yield

local O = {}
O.EPS = 1e-9
local EPS = O.EPS
O.KEYS = { false, "a", "b", "c" }           -- false: the default key (acquire without a key)
local KEYS = O.KEYS

---------------------------------------------------------------------------
-- A seeded generator, the same on every interpreter (Park-Miller: exact in
-- doubles and in 5.3 integers).
local function rng(seed)
  local x = seed % 2147483646 + 1
  local R = {}
  function R.next() x = (x * 48271) % 2147483647; return x end
  function R.int(a, b) return a + R.next() % (b - a + 1) end
  function R.chance(p) return R.next() % 10000 < p * 10000 end
  function R.ms(a, b) return R.int(a, b) / 1000 end
  return R
end
-- A protected call that lets fn yield (on PUC 5.1 through a coroutine of
-- its own, whose yields go up to the loop), as the driver's own.
local pack = table.pack or function(...) return { n = select("#", ...), ... } end
local ypcall = pcall
if _VERSION == "Lua 5.1" and not rawget(_G, "jit") then
  ypcall = function(fn, ...)
    local co = co_create(fn)
    local r = pack(co_resume(co, ...))
    while r[1] and co_status(co) == "suspended" do
      r = pack(co_resume(co, co_yield(unpack(r, 2, r.n))))
    end
    return unpack(r, 1, r.n)
  end
end

---------------------------------------------------------------------------
-- Configuration of one seed: always within new()'s rules.
local function gen_config(R)
  local c = {}
  c.max_live = R.int(1, 4)
  c.capacity = R.chance(0.3) and R.int(2, 3) or 1
  c.max_idle = R.int(R.chance(0.1) and 0 or 1, c.max_live)
  if R.chance(0.3) then
    c.per_key = { max_live = R.int(1, c.max_live) }
    if R.chance(0.6) then c.per_key.max_idle = R.int(0, math.min(c.max_idle, c.per_key.max_live)) end
  end
  c.min_idle = 0
  if R.chance(0.35) then
    local cap = c.max_idle
    if c.per_key then
      cap = math.min(cap, c.per_key.max_live, c.per_key.max_idle or cap)
    end
    if cap >= 1 then
      if R.chance(0.5) then
        c.keys = R.chance(0.5) and { "a" } or { "a", "b" }
        cap = math.min(cap, math.floor(c.max_idle / #c.keys))
        if #c.keys * cap > c.max_live then cap = math.floor(c.max_live / #c.keys) end
      end
      if cap >= 1 then c.min_idle = R.int(1, cap) else c.keys = nil end
    end
    c.floor_runs = R.chance(0.8)
  end
  c.max_waiting = R.chance(0.25) and R.int(0, 3) or R.int(4, 24)
  if R.chance(0.2) then c.max_concurrency = R.int(1, c.max_live * c.capacity) end
  if R.chance(0.5) then c.acquire_timeout = R.ms(50, 1000) end
  if R.chance(0.3) then c.idle_timeout = R.ms(100, 2000) end
  if R.chance(0.2) then c.max_lifetime = R.ms(300, 3000) end
  c.validate = R.chance(0.6)
  if c.validate and R.chance(0.5) then c.validate_after_idle = R.ms(20, 500) end
  if R.chance(0.2) then c.pause_mode = "fail" end
  c.probe = R.chance(0.15)
  if R.chance(0.1) then c.max_keys = R.int(c.keys and #c.keys or 1, 3) end
  -- hooks
  c.create_fail = R.chance(0.5) and R.int(0, 25) / 100 or 0
  c.create_throw = R.chance(0.3) and R.int(0, 15) / 100 or 0
  c.create_slow = R.int(0, 80) / 100
  c.create_max = R.int(1, 400)
  c.destroy_slow = R.int(0, 70) / 100
  c.destroy_max = R.int(1, 600)
  c.destroy_throw = R.chance(0.3) and 0.2 or 0
  c.validate_fail = R.int(0, 30) / 100
  c.validate_throw = R.chance(0.3) and 0.1 or 0
  c.validate_yield = R.int(0, 60) / 100
  -- the run
  c.workers = R.int(2, 10)
  c.steps = R.int(10, 60)
  c.close_at = R.ms(200, 6000)
  c.drain = R.chance(0.4)
  c.drain_timeout = R.ms(0, 2000)
  c.cancel_active = R.chance(0.3)
  -- the collector: stopped, running only when the model asks (it then knows
  -- which dropped leases went, when), or running on its own, often, at any
  -- allocation (finalizers inside the pool's calls; the model looks for
  -- what went at every check)
  c.gc_running = R.chance(0.3)
  -- create backoff (on by default): failed creates of a key space the next
  -- ones, and an acquisition that would create meanwhile fails fast
  if R.chance(0.3) then c.create_backoff = false end
  return c
end

local function describe_config(c)
  local keys = {}
  for k, v in pairs(c) do
    if type(v) == "table" then
      local parts = {}
      for kk, vv in pairs(v) do parts[#parts + 1] = tostring(kk) .. "=" .. tostring(vv) end
      table.sort(parts)
      keys[#keys + 1] = k .. "={" .. table.concat(parts, ",") .. "}"
    else
      keys[#keys + 1] = k .. "=" .. tostring(v)
    end
  end
  table.sort(keys)
  return table.concat(keys, " ")
end

O.rng, O.gen_config, O.describe_config = rng, gen_config, describe_config

---------------------------------------------------------------------------
-- Starts one seed's workload on the model's loop: the workers, the warm
-- floor's run() and the task that closes or drains the pool at cfg.close_at.
-- X: what the model shares with them (the names of stress_model.lua's
-- M.run: its generator, config, adapter, pool, model and checks).
function O.start(X)
  local R, cfg, S, W, Mo = X.R, X.cfg, X.S, X.W, X.Mo
  local pool, summary, now, log, fail = X.pool, X.summary, X.now, X.log, X.fail
  local check, collect, kname, begin_call, end_call = X.check, X.collect, X.kname, X.begin_call, X.end_call
  local granted, let_go, retire_client = X.granted, X.let_go, X.retire_client
  local gate_pause, gate_resume = X.gate_pause, X.gate_resume

  -- worker state: held = { { h, lease } }, cos = { { h, handle } }
  local function held_entry(w, pick)
    local free = {}
    for i, e in ipairs(w.held) do if not e.busy then free[#free + 1] = i end end
    if #free == 0 then return nil end
    return free[pick and R.int(1, #free) or #free]
  end

  local function release_entry(w, i, how)
    local e = table.remove(w.held, i)
    if how == "reuse" then let_go(e.h, nil) else let_go(e.h, false) end
    log("w%d release h%d c%d (%s)", w.id, e.h.hid, e.h.client.id, how)
    if how == "reuse" then e.lease:release()
    elseif how == "false" then e.lease:release(false)
    else e.lease:destroy() end
    local c = e.h.client
    -- every co-holder's lease learns a loss at once
    if how ~= "reuse" and c.nh > 0 then
      for _, ww in ipairs(W.workers) do
        for _, ee in ipairs(ww.held) do
          if ee.h.client == c and (ee.lease.lost ~= true or not ee.lease:cancelled()) then
            fail("w" .. ww.id .. "'s lease h" .. ee.h.hid .. " on c" .. c.id .. " was not told it is lost")
          end
        end
      end
    end
  end

  -- (decided by the handle, not the generator: callbacks of one loss run
  -- in the order of a table keyed by leases, which may differ between runs)
  local function on_cancelled(h)
    h.cancel_fired = true
    if h.released or h.dropped or h.hid % 3 == 0 then return end
    local w = h.w
    for i, e in ipairs(w.held) do
      if e.h == h and not e.busy then
        log("w%d on_cancel: releases h%d", w.id, h.hid)
        release_entry(w, i, h.hid % 3 == 1 and "false" or "reuse")
        return
      end
    end
  end

  local function keep_lease(w, h, lease)
    w.held[#w.held + 1] = { h = h, lease = lease }
    if R.chance(0.5) then lease:on_cancel(function() on_cancelled(h) end) end
  end

  local function pick_key()
    local k = KEYS[R.int(1, #KEYS)]
    return k or nil
  end

  local function acquire_opts()
    if R.chance(0.2) then return nil end
    local o = {}
    if R.chance(0.7) then o.timeout = R.ms(0, 800) end
    if R.chance(0.25) then
      local tok = clientpool.token()
      o.cancel = tok
      if R.chance(0.15) then
        Mo.token_at[tok] = now()
        tok:cancel()
      elseif R.chance(0.7) then
        local d = R.ms(0, 600)
        S.spawn(function()
          S.sleep(d)
          if not tok:cancelled() then Mo.token_at[tok] = now() end
          tok:cancel()
        end)
      end
    end
    if R.chance(0.2) then o.on_drain = { cancel = R.ms(0, 300) } end
    return o
  end

  local OUTCOMES = { { "ok" }, { "cont" }, { "pk" }, { "pp" }, { "rc" }, { "rk" } }

  local function observe(w, i)
    i = i or held_entry(w, true)
    if not i then return end
    local e = w.held[i]
    local o = OUTCOMES[R.int(1, #OUTCOMES)]
    local outcome = { o[1], R.chance(0.6) and R.ms(0, 1500) or nil }
    local d = e.lease:observe(outcome)
    log("w%d observe h%d c%d: %s %s", w.id, e.h.hid, e.h.client.id, outcome[1], tostring(outcome[2]))
    local c = e.h.client
    if o[1] == "pk" then
      gate_pause(c.key, "pk", outcome[2])
    elseif o[1] == "pp" then
      gate_pause(false, "pp", outcome[2])
    elseif o[1] == "rc" then
      retire_client(c, "policy retire client")
    elseif o[1] == "rk" then
      for _, x in pairs(Mo.clients) do
        if x.key == c.key and x.id <= c.id then retire_client(x, "policy retire key") end
      end
    end
    local _ = d
  end

  -- most leases serve one short request and go back at once; the rest
  -- stay held across the worker's next steps
  local function use_now(w)
    if not R.chance(0.65) then return end
    if R.chance(0.7) then S.sleep(R.ms(0, 60)) end
    local i = #w.held
    if i > 0 and R.chance(0.2) then observe(w, i) end
    i = #w.held                        -- (observe's on_cancel may have released it)
    if i > 0 and not w.held[i].busy then
      local x = R.int(1, 10)
      release_entry(w, i, x <= 8 and "reuse" or x <= 9 and "false" or "destroy")
    end
  end

  local function do_acquire(w)
    local key = pick_key()
    local o = acquire_opts()
    local call = begin_call(w, "acquire", key, o)
    local lease, code, detail = pool:acquire(key, o)
    end_call(call, lease ~= nil, code, detail)
    if lease then
      local h = granted(call, lease.client, "lease")
      keep_lease(w, h, lease)
      use_now(w)
    end
  end

  local function do_try(w)
    local key = pick_key()
    local call = begin_call(w, "try", key)
    local lease, code, detail = pool:try_acquire(key)
    end_call(call, lease ~= nil, code, detail)
    if lease then
      keep_lease(w, granted(call, lease.client, "lease"), lease)
      use_now(w)
    end
  end

  local function do_checkout(w)
    local key = pick_key()
    local call = begin_call(w, "checkout", key)
    local client, hd, detail = pool:checkout(key)
    end_call(call, client ~= nil, hd, detail)
    if client then
      local h = granted(call, client, "checkout")
      if R.chance(0.65) then
        if R.chance(0.7) then S.sleep(R.ms(0, 60)) end
        local reuse = R.chance(0.85)
        if reuse then let_go(h, nil) else let_go(h, false) end
        log("w%d checkin h%d c%d (%s)", w.id, h.hid, client.id, tostring(reuse))
        if reuse then pool:checkin(hd) else pool:checkin(hd, false) end
      else
        w.cos[#w.cos + 1] = { h = h, handle = hd }
      end
    end
  end

  local function do_with(w)
    local key = pick_key()
    local call = begin_call(w, "with", key)
    local entry
    local raise = R.chance(0.3)
    local ok, a, b, c = ypcall(pool.with, pool, key, function(client, lease, x)
      end_call(call, true)
      local h = granted(call, client, "lease")
      entry = { h = h, lease = lease, busy = true }
      w.held[#w.held + 1] = entry
      if R.chance(0.5) then S.sleep(R.ms(0, 300)) end
            for i, e in ipairs(w.held) do
        if e == entry then table.remove(w.held, i); break end
      end
      if raise then let_go(h, false) else let_go(h, nil) end
      log("w%d with h%d c%d: %s", w.id, h.hid, client.id, raise and "raises" or "returns")
      if raise then error("with body failed", 0) end
      return x, "r2"
    end, "r1")
        if ok and a == nil then
      end_call(call, false, b, c)      -- nothing was acquired
    elseif ok then
      if a ~= "r1" or b ~= "r2" then fail("with returned " .. tostring(a) .. ", " .. tostring(b)) end
    elseif a ~= "with body failed" then
      fail("with raised " .. tostring(a))
    end
  end

  local function do_release(w)
    local r = R.int(1, 10)
    if #w.cos > 0 and (r <= 3 or #w.held == 0) then
      local i = R.int(1, #w.cos)
      local e = table.remove(w.cos, i)
      local reuse = R.chance(0.7)
      if reuse then let_go(e.h, nil) else let_go(e.h, false) end
      log("w%d checkin h%d c%d (%s)", w.id, e.h.hid, e.h.client.id, tostring(reuse))
      if reuse then pool:checkin(e.handle) else pool:checkin(e.handle, false) end
      return
    end
    local i = held_entry(w, true)
    if not i then return end
    local x = R.int(1, 10)
    release_entry(w, i, x <= 7 and "reuse" or x <= 9 and "false" or "destroy")
  end

  local function do_drop(w)
    local i = held_entry(w, true)
    if not i then return end
    local e = table.remove(w.held, i)
    e.h.dropped = true
    Mo.dropped[e.lease] = e.h
    Mo.dropped_list[#Mo.dropped_list + 1] = e.h
    log("w%d drops h%d c%d", w.id, e.h.hid, e.h.client.id)
  end

  local function admin_key()
    if R.chance(0.3) then return nil end
    return kname(pick_key())
  end

  local function do_admin(w)
    local r = R.int(1, 10)
    if r <= 3 then
      local key = admin_key()
      log("w%d retire %s", w.id, tostring(key))
      for _, x in pairs(Mo.clients) do
        if key == nil or x.key == key then retire_client(x, "pool:retire") end
      end
      pool:retire(key)
    elseif r <= 7 and not cfg.max_keys then
      local key = admin_key()
      log("w%d pause %s", w.id, tostring(key))
      pool:pause("manual", key)
      gate_pause(key or false, "manual")
    else
      local key = admin_key()
      log("w%d resume %s", w.id, tostring(key))
      pool:resume(key)
      gate_resume(key or false)
    end
  end

  local OPS = {
    { 34, do_acquire }, { 9, do_try }, { 9, do_with }, { 7, do_checkout }, { 26, do_release },
    { 8, observe }, { 3, do_drop }, { 3, "gc" }, { 14, "sleep" }, { 4, do_admin },
  }
  local OPS_TOTAL = 0
  for _, o in ipairs(OPS) do OPS_TOTAL = OPS_TOTAL + o[1] end

  local function step(w)
    local r = R.int(1, OPS_TOTAL)
    for _, o in ipairs(OPS) do
      r = r - o[1]
      if r <= 0 then
                summary.ops = summary.ops + 1
        if o[2] == "gc" then
          log("w%d collectgarbage", w.id)
          collect()
        elseif o[2] == "sleep" then
          S.sleep(R.chance(0.3) and 0 or R.ms(0, 300))
        else
          o[2](w)
        end
        return
      end
    end
  end

  local function worker(w)
    for _ = 1, w.steps do
      step(w)
      check("after w" .. w.id .. "'s step")
    end
    -- give back whatever is still held
    while #w.cos > 0 do
      local e = table.remove(w.cos)
      let_go(e.h, nil)
      pool:checkin(e.handle)
    end
    while true do
      local i = held_entry(w)
      if not i then break end
      release_entry(w, i, R.chance(0.8) and "reuse" or "false")
    end
    check("w" .. w.id .. " done")
    w.done = true
  end

  for i = 1, cfg.workers do
    local w = { id = i, held = {}, cos = {}, steps = R.int(math.floor(cfg.steps / 2), cfg.steps) }
    W.workers[i] = w
    S.spawn(worker, w)
  end
  if cfg.min_idle > 0 and cfg.floor_runs then S.spawn(function() pool:run() end) end
  S.spawn(function()
    S.sleep(cfg.close_at)
    Mo.closed, Mo.close_time = true, now()
    if cfg.drain then
      log("drain(%.3f)", cfg.drain_timeout)
      local ok, code = pool:drain(cfg.drain_timeout)
      log("drain: %s %s", tostring(ok), tostring(code))
      if ok then
        if pool:stats().leases ~= 0 then fail("drain returned with leases held") end
      elseif code ~= "timeout" or math.abs(now() - Mo.close_time - cfg.drain_timeout) > EPS then
        fail("drain returned " .. tostring(code) .. " after " .. (now() - Mo.close_time))
      end
    else
      log("close")
      pool:close()
    end
    check("after close")
    if cfg.cancel_active then
      pool:cancel_active()
      for _, w in ipairs(W.workers) do
        for _, e in ipairs(w.held) do
          if not e.lease:cancelled() then fail("cancel_active left w" .. w.id .. "'s h" .. e.h.hid) end
        end
      end
      check("after cancel_active")
    end
  end)
end

return O
