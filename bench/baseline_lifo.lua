-- bench/baseline_lifo.lua: the pool users write by hand, and the baseline
-- of B1 and B3. A bare LIFO stack of idle clients in a table: no limits, no
-- accounting, no expiry, no waiting. `pool:acquire()` pops the most
-- recently released client (or creates one), `pool:release(c)` pushes it.
local setmetatable = setmetatable

local Lifo = {}
Lifo.__index = Lifo

local M = {}

function M.new(create)
  return setmetatable({ create = create, free = {}, n = 0 }, Lifo)
end

function Lifo:acquire()
  local n = self.n
  if n > 0 then
    local free = self.free
    local c = free[n]
    free[n] = nil
    self.n = n - 1
    return c
  end
  return self.create()
end

function Lifo:release(c)
  local n = self.n + 1
  self.free[n] = c
  self.n = n
end

return M
