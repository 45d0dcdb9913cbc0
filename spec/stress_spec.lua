-- The driver under a randomized, seeded, model-checked workload (issue 18;
-- the model and what it checks: spec/stress_model.lua; the configuration
-- and the random operations: spec/stress_ops.lua). `make test` runs
-- a few hundred seeds on every interpreter; `make stress` more:
--   CLIENTPOOL_STRESS_SEEDS=n      seeds to run (default 200)
--   CLIENTPOOL_STRESS_SEED=s       the first seed (default 1)
--   CLIENTPOOL_STRESS_TRACE=1      print every step (replay one seed)
--   CLIENTPOOL_STRESS_PHYSICAL=1|0 the physical cap (clients alive in the
--                                  hooks): on, off; default on once stats()
--                                  has `closing` (issue 12's engine change)
--   CLIENTPOOL_STRESS_STRICT_DEADLINE=1|0  a call with a deadline ends by
--                                  it (or its token's earlier cancel), its
--                                  own hooks included; default on where the
--                                  driver bounds the hooks (issue 12: not
--                                  on PUC Lua 5.1, docs/api.md "Deadlines")
-- A seed that fails prints the check, its config, the last steps and how
-- to replay it.

local clientpool = require "clientpool"
local model = require "spec.stress_model"

local function env_num(name, default)
  local v = tonumber(os.getenv(name) or "")
  return v or default
end

local function env_flag(name)
  local v = os.getenv(name)
  if v == nil or v == "" then return nil end
  return v ~= "0"
end

local SEEDS = env_num("CLIENTPOOL_STRESS_SEEDS", 200)
local FIRST = env_num("CLIENTPOOL_STRESS_SEED", 1)

-- the physical cap needs the engine to count clients until their destroy
-- returns: with it, stats() has `closing`
local function engine_counts_closing()
  local pool = clientpool.new { max_live = 1, create = function() return {} end,
                                scheduler = require("clientpool.loop").new { clock = "virtual" } }
  return pool:stats().closing ~= nil
end

-- the strict deadline needs a driver that bounds its callers' hooks: an
-- acquisition whose create outlasts its deadline returns at the deadline
local function driver_bounds_hooks()
  local loop = require("clientpool.loop").new { clock = "virtual" }
  local bounded = false
  loop.spawn(function()
    local pool = clientpool.new { max_live = 1, scheduler = loop, acquire_timeout = 0.5,
                                  create = function() loop.sleep(1); return {} end }
    local t0 = loop.now()
    local lease, code = pool:acquire()
    bounded = lease == nil and code == "timeout" and loop.now() - t0 <= 0.5
    if lease then lease:release() end
    loop.sleep(1)
    pool:close()
  end)
  loop.run()
  return bounded
end

describe("clientpool under a model-checked random workload", function()
  it(("holds every invariant over %d seeds (from %d)"):format(SEEDS, FIRST), function()
    local physical = env_flag("CLIENTPOOL_STRESS_PHYSICAL")
    if physical == nil then physical = engine_counts_closing() end
    local strict = env_flag("CLIENTPOOL_STRESS_STRICT_DEADLINE")
    if strict == nil then strict = driver_bounds_hooks() end
    local opts = {
      physical = physical,
      strict_deadline = strict,
      trace = env_flag("CLIENTPOOL_STRESS_TRACE"),
    }
    local total = { ops = 0, checks = 0, grants = 0, leaks = 0, physical = 0, strict_deadline = 0,
                    unvalidated_shares = 0, uncollected = 0, opened = 0 }
    local failed = {}
    local first_failure
    local t0 = os.clock()
    local pools = setmetatable({}, { __mode = "k" })   -- every seed's pool, to be collected
    for seed = FIRST, FIRST + SEEDS - 1 do
      local ok, r = pcall(model.run, seed, opts)
      collectgarbage("restart")
      if ok then
        for k in pairs(total) do total[k] = total[k] + (r[k] or 0) end
        if r.pool[1] then pools[r.pool[1]] = seed end
      else
        failed[#failed + 1] = seed
        first_failure = first_failure or tostring(r)
        if #failed >= 20 then break end
      end
    end
    io.write(("\nstress: %d seeds in %.1f s cpu: %d steps, %d checks, %d grants, %d clients, %d leaked leases " ..
              "collected (%d not), %d failed seeds\n"):format(SEEDS, os.clock() - t0, total.ops, total.checks,
              total.grants, total.opened, total.leaks, total.uncollected, #failed))
    io.write(("stress: physical cap %s (%d times over max_live in the hooks); strict deadline %s (%d calls " ..
              "past it by their own hooks); %d shares handed out while their client's validate ran\n")
             :format(physical and "checked" or "not checked", total.physical,
                     opts.strict_deadline and "checked" or "not checked", total.strict_deadline,
                     total.unvalidated_shares))
    -- closed pools, their clients and leases gone, are collected, engines
    -- and all (one a stale stack slot still holds is allowed for; LuaJIT's
    -- traces hold constants of what they compiled: flushed first)
    if rawget(_G, "jit") then require("jit").flush() end
    collectgarbage(); collectgarbage()
    local left = {}
    for _, seed in pairs(pools) do left[#left + 1] = seed end
    if #left > 1 and not first_failure then
      table.sort(left)
      first_failure = ("%d pools of finished seeds were not collected (seeds %s)"):format(#left,
        table.concat(left, " ", 1, math.min(#left, 10)))
    end
    if first_failure then
      error(("%d seed(s) failed: %s\n\nthe first one:\n%s"):format(#failed, table.concat(failed, " "),
            first_failure), 0)
    end
  end)
end)
