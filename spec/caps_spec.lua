-- clientpool.caps: the capacity options' rules that clientpool.new
-- (options.lua) and fleet.new (fleet.lua) share, tested on their own: each
-- caller passes its fail and the word its messages use.

local caps = require "clientpool.caps"

-- A fail that raises its formatted message, as the callers' do.
local function fail(fmt, ...)
  error(string.format((fmt:gsub("%%d", "%%s")), ...), 0)
end

local function err_of(f, ...)
  local ok, e = pcall(f, ...)
  assert.is_false(ok)
  return e
end

describe("clientpool.caps", function()
  it("is_int: integers only, no NaN, no infinity, no strings", function()
    for _, v in ipairs { 0, 1, -3, 2^40 } do assert.is_true(caps.is_int(v)) end
    for _, v in ipairs { 0.5, 0 / 0, math.huge, -math.huge, "1", true } do assert.is_false(caps.is_int(v)) end
    assert.is_false(caps.is_int(nil))
  end)

  it("check_count: the default when left out, the value when a count in range", function()
    assert.equal(7, caps.check_count({}, "n", 1, 7, nil, fail, "option"))
    assert.is_nil(caps.check_count({}, "n", 1, nil, nil, fail, "option"))
    assert.equal(3, caps.check_count({ n = 3 }, "n", 1, 7, nil, fail, "option"))
    assert.equal(2147483647, caps.check_count({ n = 2147483647 }, "n", 0, 0, nil, fail, "option"))
    assert.equal(4096, caps.check_count({ n = 4096 }, "n", 1, 64, 4096, fail, "fleet option"))
  end)

  it("check_count: one error per rule, in the caller's word", function()
    assert.equal("option 'n' must be an integer, got 1.5",
                 err_of(caps.check_count, { n = 1.5 }, "n", 1, 1, nil, fail, "option"))
    assert.equal("option 'n' must be an integer, got string",
                 err_of(caps.check_count, { n = "2" }, "n", 1, 1, nil, fail, "option"))
    assert.equal("fleet option 'n' must be >= 1, got 0",
                 err_of(caps.check_count, { n = 0 }, "n", 1, 1, nil, fail, "fleet option"))
    assert.equal("fleet option 'members' must be <= 4096, got 4097",
                 err_of(caps.check_count, { members = 4097 }, "members", 1, 64, 4096, fail, "fleet option"))
    -- without max: the engine's int32_t
    assert.matches("^option 'n' must be <= 2147483647, got ",
                   err_of(caps.check_count, { n = 2147483648 }, "n", 1, 1, nil, fail, "option"))
  end)

  it("check_order: max_idle <= max_live, min_idle <= max_idle", function()
    caps.check_order({ max_live = 4, max_idle = 4, min_idle = 4 }, fail, "option")
    assert.equal("option 'max_idle' (5) must be <= max_live (4)",
                 err_of(caps.check_order, { max_live = 4, max_idle = 5, min_idle = 0 }, fail, "option"))
    assert.equal("fleet option 'min_idle' (3) must be <= max_idle (2)",
                 err_of(caps.check_order, { max_live = 4, max_idle = 2, min_idle = 3 }, fail, "fleet option"))
  end)

  it("check: per_key's max_live and max_idle, nil where not given", function()
    local c = { max_live = 10, max_idle = 6, min_idle = 1 }
    local ml, mi = caps.check({}, c, fail, "option")
    assert.is_nil(ml); assert.is_nil(mi)
    ml, mi = caps.check({ max_live = 5, max_idle = 3 }, c, fail, "option")
    assert.equal(5, ml); assert.equal(3, mi)
    ml, mi = caps.check({ max_idle = 6 }, c, fail, "option")
    assert.is_nil(ml); assert.equal(6, mi)
  end)

  it("check: every per_key rule raises naming the option", function()
    local c = { max_live = 10, max_idle = 6, min_idle = 2 }
    assert.equal("option 'per_key' must be a table, got number", err_of(caps.check, 3, c, fail, "option"))
    assert.equal("unknown option 'per_key.min_idle'", err_of(caps.check, { min_idle = 1 }, c, fail, "option"))
    assert.equal("option 'per_key.max_live' must be an integer >= 1, got 0",
                 err_of(caps.check, { max_live = 0 }, c, fail, "option"))
    assert.equal("option 'per_key.max_live' (11) must be <= max_live (10)",
                 err_of(caps.check, { max_live = 11 }, c, fail, "option"))
    assert.equal("option 'min_idle' (2) must be <= per_key.max_live (1)",
                 err_of(caps.check, { max_live = 1 }, c, fail, "option"))
    assert.equal("fleet option 'per_key.max_idle' (5) must be <= per_key.max_live (4)",
                 err_of(caps.check, { max_live = 4, max_idle = 5 }, c, fail, "fleet option"))
    assert.equal("option 'min_idle' (2) must be <= per_key.max_idle (1)",
                 err_of(caps.check, { max_idle = 1 }, c, fail, "option"))
    assert.equal("option 'per_key.max_idle' (7) must be <= max_idle (6)",
                 err_of(caps.check, { max_idle = 7 }, c, fail, "option"))
  end)
end)
