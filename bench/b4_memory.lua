-- B4: memory. Bytes per idle client and per waiter, on the C side (the
-- engine's malloc'd slot arrays: read with glibc's mallinfo2 through the
-- FFI, so LuaJIT only; LuaJIT's own heap is not malloc's) and on the Lua
-- side (collectgarbage("count") deltas after full collections). Lua
-- allocations per pair with the collector stopped, for both forms.
--
-- Idle clients are made by the warm floor (min_idle = N, pool:run()), so no
-- lease history inflates the figure; the clients themselves are made
-- before the first reading and do not count. The engine's slot arrays grow
-- by an eighth: at N = 100k they hold up to 12% spare slots.
local clientpool = require "clientpool"
local Loop = require "clientpool.loop"

local N = 100000

return function(U)
  -- idle clients
  local clients = {}
  for i = 1, N do clients[i] = {} end
  local made = 0
  local function create()
    made = made + 1
    return clients[made]
  end
  local loop = Loop.new()
  local pool = clientpool.new { min_idle = N, max_idle = N, max_live = N, create = create, scheduler = loop }
  local lua0, c0 = U.lua_kb(), U.c_bytes()
  local lua1, c1
  loop.spawn(function() pool:run() end)
  loop.spawn(function()
    while made < N do loop.sleep(0) end
    loop.sleep(0)
    assert(pool:stats().idle == N)
    lua1, c1 = U.lua_kb(), U.c_bytes()
    pool:close()
  end)
  loop.run()
  U.row("B4.c_idle", "C bytes per idle client (engine)", c1 and (c1 - c0) / N, "B",
        c1 and "" or "mallinfo2 via the FFI: LuaJIT only")
  U.row("B4.lua_idle", "Lua bytes per idle client (driver)", (lua1 - lua0) * 1024 / N, "B")
  pool, clients = nil, nil -- luacheck: ignore

  -- waiters: N tasks queued on a pool whose client is held, against N tasks
  -- waiting on the loop alone
  local function waiters(with_pool)
    local l = Loop.new()
    local p = clientpool.new { max_live = 1, max_waiting = N, create = function() return {} end, scheduler = l }
    local _, held = p:checkout()
    local handles = {}
    local la, ca = U.lua_kb(), U.c_bytes()
    local lb, cb
    for i = 1, N do
      if with_pool then
        l.spawn(function() p:checkout() end)
      else
        l.spawn(function() handles[i] = l.current(); l.wait(handles[i]) end)
      end
    end
    l.spawn(function()
      lb, cb = U.lua_kb(), U.c_bytes()
      assert(not with_pool or p:stats().waiting == N)
      p:close()
      p:checkin(held)
      for i = 1, #handles do l.wake(handles[i]) end
    end)
    l.run()
    return (lb - la) * 1024 / N, cb and (cb - ca) / N
  end
  local lua_pool, c_pool = waiters(true)
  local lua_loop = waiters(false)
  U.row("B4.c_waiter", "C bytes per waiter (engine)", c_pool, "B", c_pool and "" or "LuaJIT only")
  U.row("B4.lua_waiter", "Lua bytes per waiter (driver, over a bare loop.wait)", lua_pool - lua_loop, "B",
        string.format("a task waiting on the loop alone: %.0f B", lua_loop))

  -- Lua allocations per pair
  local p = clientpool.new { max_live = 4, create = function() return {} end }
  local lease_pairs = U.loop("pool", "local lease = pool:acquire(); lease:release()", p)
  local checkout_pairs = U.loop("pool", "local _, h = pool:checkout(); pool:checkin(h)", p)
  local try_pairs = U.loop("pool", "local lease = pool:try_acquire(); lease:release()", p)
  local function per_pair(fn)
    fn(20000)             -- warm up (LuaJIT: traces recorded)
    collectgarbage("collect")
    collectgarbage("stop")
    fn(10)                -- the collection shrank the stack: grow it back
    local before = collectgarbage("count")
    fn(10000)
    local bytes = (collectgarbage("count") - before) * 1024 / 10000
    collectgarbage("restart")
    return bytes
  end
  U.row("B4.alloc_lease", "Lua bytes allocated per acquire/release pair", per_pair(lease_pairs), "B")
  U.row("B4.alloc_try", "Lua bytes allocated per try_acquire/release pair", per_pair(try_pairs), "B")
  U.row("B4.alloc_checkout", "Lua bytes allocated per checkout/checkin pair", per_pair(checkout_pairs), "B")
  p:close()

  -- (reference) the same pairs on a pool that parks its idle clients, as
  -- clientpool.ngx's do: each checkout unparks (issue 17, bench B5). A
  -- grant record per unpark before (256 B under LuaJIT, 248 B on Lua 5.4);
  -- on PUC Lua 5.1 a hook runs in a coroutine of its own (base.ycall).
  local stored = {}
  local pp = clientpool.new { max_live = 4, create = function() return {} end,
                              park = function(c) stored.c = c; return stored end,
                              unpark = function(st) return st.c end }
  U.row("B4.alloc_parked_lease", "(reference) Lua bytes per acquire/release pair, park/unpark hooks",
        per_pair(U.loop("pool", "local lease = pool:acquire(); lease:release()", pp)), "B")
  U.row("B4.alloc_parked_checkout", "(reference) Lua bytes per checkout/checkin pair, park/unpark hooks",
        per_pair(U.loop("pool", "local _, h = pool:checkout(); pool:checkin(h)", pp)), "B")
  pp:close()
end
