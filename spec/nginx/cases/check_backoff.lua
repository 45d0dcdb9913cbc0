-- Reads what the pools of setup_backoff.lua recorded while spec/nginx/run.sh
-- ran wrk against them and killed the second redis-server for a while
-- (app.marks: "down" when it was killed, "up" when it answered again).
-- Not run on its own.
local app = require "app"

-- Create attempts inside [a, b].
local function between(list, a, b)
  local n = 0
  for _, t in ipairs(list) do if t >= a and t <= b then n = n + 1 end end
  return n
end

local function show(t)
  local parts = {}
  for k, v in pairs(t) do parts[#parts + 1] = k .. "=" .. v end
  table.sort(parts)
  return table.concat(parts, " ")
end

-- The most create attempts one key can make in an outage of secs seconds
-- with create_backoff b: each failure opens a window of at least half of
-- b x 2^(n-1) (docs/api.md), so k windows need b/2 x (2^k - 1) seconds;
-- each window end lets at most max_live creates start (acquisitions that
-- came meanwhile failed fast), plus the max_live that were in flight when
-- the server died.
local function bound(secs, b, max_live)
  local k = math.floor(math.log(2 * secs / b + 1) / math.log(2))
  return max_live * (k + 2)
end

for _, name in ipairs { "backoff", "nobackoff" } do
  it(name .. ": create attempts while redis was down, and the longest acquire", function()
    local d = assert(app.deadline[name], "setup_backoff did not run")
    assert(app.marks[name .. ":down"], "no down mark")
    assert(app.marks[name .. ":up"], "no up mark")
    local down, up = app.marks[name .. ":down"], app.marks[name .. ":up"]
    local secs = up - down
    local n = between(d.attempts, down, up)
    local limit = bound(secs, 0.05, 4)
    ngx.say(string.format("# %s: redis down %.2f s: %d create attempts (%.0f/s; the backoff's bound %d), " ..
      "%d in all; longest acquire %.3f s (acquire_timeout 0.5); outcomes %s", name, secs, n, n / secs, limit,
      #d.attempts, d.max_acquire, show(d.outcomes)))
    assert.is_true((d.outcomes.ok or 0) > 0, "no request got a client")
    assert.is_true((d.outcomes.create or 0) > 0, "no request failed fast with create")
    if name == "backoff" then
      assert.is_true(n <= limit, n .. " attempts in " .. secs .. " s, over the bound " .. limit)
    else
      -- the same load without the backoff: the check above tells them apart
      assert.is_true(n > limit, "without backoff only " .. n .. " attempts (bound " .. limit .. ")")
    end
    -- nothing waited past its deadline (one nginx timer tick of slack)
    assert.is_true(d.max_acquire <= 0.5 * 1.2, "an acquire took " .. d.max_acquire .. " s")
  end)
end
