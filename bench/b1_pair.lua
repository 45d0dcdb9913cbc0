-- B1: an uncontended pair (acquire with an idle client, release) against
-- the bare table pool (bench/baseline_lifo.lua). Both pool forms: the lease
-- object (acquire/release, try_acquire/release) and the zero-allocation one
-- (checkout/checkin).
-- The pool runs on the built-in loop's real clock, the default outside a
-- host: every engine call reads CLOCK_MONOTONIC.
local clientpool = require "clientpool"
local lifo = require "baseline_lifo"
local Loop = require "clientpool.loop"

return function(U)
  local function new_client() return {} end

  local bare = lifo.new(new_client)
  bare:release(bare:acquire())
  local bare_pairs = U.loop("bare", "local c = bare:acquire(); bare:release(c)", bare)

  local pool = clientpool.new { max_live = 16, create = new_client }
  assert(pool:acquire()):release()
  local lease_pairs = U.loop("pool", "local lease = pool:acquire(); lease:release()", pool)
  local try_pairs = U.loop("pool", "local lease = pool:try_acquire(); lease:release()", pool)
  local checkout_pairs = U.loop("pool", "local _, h = pool:checkout(); pool:checkin(h)", pool)

  local r, _, b = U.ratio(lease_pairs, bare_pairs)
  U.row("B1.lease", "acquire+release pair / bare LIFO pair", r, "x")
  local rt, _, bt = U.ratio(try_pairs, bare_pairs)
  U.row("B1.try", "try_acquire+release pair / bare LIFO pair", rt, "x")
  local r2, _, b2 = U.ratio(checkout_pairs, bare_pairs)
  U.row("B1.checkout", "checkout+checkin pair / bare LIFO pair", r2, "x")
  U.row("B1.base", "(baseline: bare LIFO pair, ns)", math.min(b, bt, b2), "ns")
  pool:close()

  -- (reference) a pool with a duration option: its stamps need the time,
  -- so each engine call reads the clock (issue 17: without one the fast
  -- path reads none)
  local timed = clientpool.new { max_live = 16, create = new_client, idle_timeout = 60 }
  assert(timed:acquire()):release()
  U.row("B1.lease.timed", "(reference) acquire+release pair, idle_timeout = 60 / bare pair",
        U.ratio(U.loop("pool", "local lease = pool:acquire(); lease:release()", timed), bare_pairs), "x")
  U.row("B1.checkout.timed", "(reference) checkout+checkin pair, idle_timeout = 60 / bare pair",
        U.ratio(U.loop("pool", "local _, h = pool:checkout(); pool:checkin(h)", timed), bare_pairs), "x")
  timed:close()

  -- (reference) the same pairs inside a task of the built-in loop, where a
  -- turn's calls share the time the turn began with (docs/performance.md
  -- "Time per turn"): n pairs in one task, the spawn and run counted
  local loop = Loop.new()
  local tpool = clientpool.new { max_live = 16, create = new_client, scheduler = loop }
  assert(tpool:acquire()):release()
  local function in_task(fn)
    return function(n)
      loop.spawn(fn, n)
      loop.run()
    end
  end
  local t_lease = in_task(U.loop("pool", "local lease = pool:acquire(); lease:release()", tpool))
  local t_checkout = in_task(U.loop("pool", "local _, h = pool:checkout(); pool:checkin(h)", tpool))
  U.row("B1.lease.turn", "(reference) acquire+release pair in a loop task / bare pair",
        U.ratio(t_lease, bare_pairs), "x")
  U.row("B1.checkout.turn", "(reference) checkout+checkin pair in a loop task / bare pair",
        U.ratio(t_checkout, bare_pairs), "x")
  tpool:close()
end
