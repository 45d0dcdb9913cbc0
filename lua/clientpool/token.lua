--- clientpool.token (internal): cancel tokens (clientpool.token()).
--
-- Owns the Token object. A waiting acquisition registers its handle in
-- the token's `_waits` (acquire.lua) and checks `_cancelled` after each
-- wait; cancel() wakes every handle registered.

local base = require "clientpool.base"
base.own_source()

local type, error, pairs, setmetatable, getmetatable = type, error, pairs, setmetatable, getmetatable

local Token = {}
Token.__index = Token

local M = { Token = Token }

--- A cancel token: pass it as `opts.cancel` to acquire; `token:cancel()`
-- ends the acquisitions waiting on it with `nil, "cancelled"`.
function M.new()
  return setmetatable({ _cancelled = false, _waits = {} }, Token)
end

local function check_token(self, name)
  if getmetatable(self) ~= Token then
    error("clientpool: " .. name .. " needs the token as self, got " .. type(self) ..
          " (call token:" .. name .. "() with a colon)", 3)
  end
end

function Token:cancelled()
  check_token(self, "cancelled")
  return self._cancelled
end

function Token:cancel()
  check_token(self, "cancel")
  if self._cancelled then return end
  self._cancelled = true
  local waits = self._waits
  self._waits = {}
  for handle, adapter in pairs(waits) do adapter.wake(handle) end
end


return M
