-- clientpool (init.lua): the public surface, and the rule that holds the
-- driver's files together: a file never requires one above it (docs/design.md
-- "Layers").

local clientpool = require "clientpool"

-- The driver's files, lowest first (init.lua's header).
local LAYERS = { "base", "options", "token", "events", "keys", "leak", "stats", "floor", "keepalive", "lease",
                 "admission", "drain", "acquire", "checkout", "configure", "init" }

local function read(path)
  local f = assert(io.open(path, "r"))
  local s = f:read("*a")
  f:close()
  return s
end

describe("clientpool", function()
  it("exports new, token, codes, backend, Pool, Lease, policy and _VERSION", function()
    assert.is_function(clientpool.new)
    assert.is_function(clientpool.token)
    assert.is_table(clientpool.codes)
    assert.is_string(clientpool.backend)
    assert.is_table(clientpool.Pool)
    assert.is_table(clientpool.Lease)
    assert.equal(require "clientpool.policy", clientpool.policy)
    assert.is_string(clientpool._VERSION)
  end)

  it("names its outcome codes once, as the stable strings", function()
    assert.same({ timeout = "timeout", full = "full", closed = "closed", cancelled = "cancelled",
                  create = "create", paused = "paused" }, clientpool.codes)
  end)

  it("new() performs no I/O: no hook runs until an acquisition", function()
    local calls = 0
    local pool = clientpool.new { create = function() calls = calls + 1; return {} end, max_live = 2,
                                  scheduler = require("clientpool.loop").new { clock = "virtual" } }
    assert.equal(0, calls)
    assert.equal(0, pool:stats().live)
  end)

  it("a file of the driver requires only files below it", function()
    local rank = {}
    for i, name in ipairs(LAYERS) do rank[name] = i end
    for _, name in ipairs(LAYERS) do
      local text = read("lua/clientpool/" .. name .. ".lua")
      for dep in text:gmatch("require%s*%(?%s*[\"']clientpool%.([%w_]+)[\"']") do
        if rank[dep] then
          assert.is_true(rank[dep] < rank[name], name .. ".lua requires " .. dep .. ".lua, which is above it")
        end
      end
    end
  end)

  it("every file of the driver opens with one comment saying what it owns", function()
    for _, name in ipairs(LAYERS) do
      local text = read("lua/clientpool/" .. name .. ".lua")
      assert.truthy(text:find("^%-%-%- clientpool"), name .. ".lua has no opening comment")
    end
  end)
end)
