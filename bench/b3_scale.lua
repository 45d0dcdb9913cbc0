-- B3: scale. The checkout/checkin pair (the zero-allocation form) with 1,
-- 1k and 100k idle clients on its key; with 1, 1k and 100k keys (each
-- holding an idle client), on one hot key and cycling through all keys; and
-- acquire+cancel (an acquisition that queues and times out at once) with
-- 1, 1k and 100k waiters queued ahead of it. Each figure is a ratio to the
-- bare LIFO pair of the same run; flat = the largest size's figure over
-- the smallest's (target <= 1.2).
local clientpool = require "clientpool"
local Loop = require "clientpool.loop"
local lifo = require "baseline_lifo"

local SIZES = { 1, 1000, 100000 }
local LABEL = { [1] = "1", [1000] = "1k", [100000] = "100k" }

return function(U)
  local function new_client() return {} end
  local bare = lifo.new(new_client)
  bare:release(bare:acquire())
  local bare_pairs = U.loop("bare", "local c = bare:acquire(); bare:release(c)", bare)

  local function flat(id, what, figures)
    U.row(id, what, figures[#figures] / figures[1], "x")
  end

  -- idle clients
  local figures = {}
  for _, size in ipairs(SIZES) do
    local pool = clientpool.new { max_live = size, create = new_client }
    local hs = {}
    for i = 1, size do hs[i] = select(2, assert(pool:checkout("k"))) end
    for i = 1, size do pool:checkin(hs[i]) end
    hs = nil -- luacheck: ignore
    local pairs_n = U.loop("pool", "local _, h = pool:checkout('k'); pool:checkin(h)", pool)
    local r = U.ratio(pairs_n, bare_pairs)
    figures[#figures + 1] = r
    U.row("B3.idle." .. LABEL[size], "pair, " .. LABEL[size] .. " idle clients / bare pair", r, "x")
    pool:close()
  end
  flat("B3.idle.flat", "pair: 100k idle clients / 1 idle client", figures)

  -- keys
  local hot, cycling = {}, {}
  local cycling_1_ns
  for _, size in ipairs(SIZES) do
    local pool = clientpool.new { max_live = size, create = new_client }
    local keys = {}
    for i = 1, size do keys[i] = "key" .. i end
    for i = 1, size do
      local _, h = assert(pool:checkout(keys[i]))
      pool:checkin(h)
    end
    local hot_pairs = U.loop("pool", "local _, h = pool:checkout('key1'); pool:checkin(h)", pool)
    local cycling_pairs = U.loop("pool, keys, size, j", [[
      j = j % size + 1
      local _, h = pool:checkout(keys[j])
      pool:checkin(h)]], pool, keys, size, 0)
    local r = U.ratio(hot_pairs, bare_pairs)
    hot[#hot + 1] = r
    U.row("B3.keys." .. LABEL[size], "pair on one key, " .. LABEL[size] .. " keys / bare pair", r, "x")
    local cycling_ns
    r, cycling_ns = U.ratio(cycling_pairs, bare_pairs)
    cycling_1_ns = cycling_1_ns or cycling_ns
    cycling[#cycling + 1] = r
    U.row("B3.keyscyc." .. LABEL[size], "pair cycling through " .. LABEL[size] .. " keys / bare pair", r, "x")
    pool:close()
  end
  flat("B3.keys.flat", "pair on one key: 100k keys / 1 key", hot)
  flat("B3.keyscyc.flat", "pair cycling: 100k keys / 1 key", cycling)

  -- (reference) the floor under B3.keyscyc.flat: a pool keyed by Lua
  -- strings looks each name up in a table, and what that lookup costs more
  -- at 100k keys than at 1 (no pool: a bare table of "key" .. i names,
  -- cycled the same way) is added to the pair at 1 key (docs/performance.md,
  -- "B3.keyscyc: the name lookup is the floor")
  local function lookups(size)
    local ids, names = {}, {}
    for i = 1, size do names[i] = "key" .. i; ids[names[i]] = i end
    return U.loop("ids, names, size, j", [=[
      j = j % size + 1
      if not ids[names[j]] then error("lost " .. j) end]=], ids, names, size, 0)
  end
  local _, lookup_100k, lookup_1 = U.ratio(lookups(SIZES[#SIZES]), lookups(1))
  U.row("B3.keyscyc.floor", "(reference) its floor: 1 + the name lookup's growth / pair",
        1 + (lookup_100k - lookup_1) / cycling_1_ns, "x")

  -- waiters: size tasks queue (acquire_timeout set, so each has a deadline
  -- in the heap); the measured acquisitions queue behind them and time out
  -- at once (timeout = 0): enqueue, dequeue, deadline heap insert and remove
  figures = {}
  for _, size in ipairs(SIZES) do
    local loop = Loop.new()
    local pool = clientpool.new { max_live = 1, max_waiting = size + 1, acquire_timeout = 3600,
                                  create = new_client, scheduler = loop }
    local _, held = pool:checkout()
    for _ = 1, size do loop.spawn(function() pool:checkout() end) end
    local r
    local opts = { timeout = 0 }
    loop.spawn(function()
      local cancels = U.loop("pool, opts", "local lease = pool:acquire(nil, opts); assert(lease == nil)", pool, opts)
      r = U.ratio(cancels, bare_pairs)
      assert(pool:stats().waiting == size)
      pool:close()
      pool:checkin(held)
    end)
    loop.run()
    figures[#figures + 1] = r
    U.row("B3.wait." .. LABEL[size], "acquire+cancel, " .. LABEL[size] .. " waiters / bare pair", r, "x")
  end
  flat("B3.wait.flat", "acquire+cancel: 100k waiters / 1 waiter", figures)
end
