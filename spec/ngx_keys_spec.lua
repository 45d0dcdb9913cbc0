-- clientpool.ngx.keys: the pool keys of upstream identities (key, parse)
-- and their validation, outside nginx: what needs nginx itself (passwords
-- kept by ngx.md5, parsed certificates, the drivers that log in) is tested
-- in nginx (spec/nginx/cases/driver_auth.lua, driver.lua).

local keys = require "clientpool.ngx.keys"

local function err_of(fn, ...)
  local ok, e = pcall(fn, ...)
  assert.is_false(ok)
  return tostring(e)
end

describe("clientpool.ngx.keys", function()
  it("key() is readable and parse() gives the parameters back", function()
    local k = keys.key { host = "redis.local", port = 6379, database = 2, user = "app",
                         ssl = true, server_name = "r.example", ssl_verify = true, parts = { "tenant|7" } }
    assert.equal("redis.local:6379|tls|sni=r.example|verify|user=app|db=2|u=tenant%7C7", k)
    local p = assert(keys.parse(k))
    assert.same({ host = "redis.local", port = 6379, ssl = true, server_name = "r.example", ssl_verify = true,
                  user = "app", database = "2", parts = { "tenant|7" } }, p)
    assert.equal("unix:/run/redis.sock", keys.key { host = "unix:/run/redis.sock" })
    assert.same({ host = "unix:/run/redis.sock", ssl = false }, keys.parse("unix:/run/redis.sock"))
  end)

  it("different identities give different keys", function()
    local seen = {}
    for _, o in ipairs {
      { host = "h", port = 1 }, { host = "h", port = 2 }, { host = "h", port = 1, ssl = true },
      { host = "h", port = 1, database = 0 }, { host = "h", port = 1, database = "0x" },
      { host = "h", port = 1, user = "a" }, { host = "h", port = 1, parts = "a|b" },
      { host = "h", port = 1, parts = { "a", "b" } }, { host = "h|u=x", port = 1 },
    } do
      local k = keys.key(o)
      assert.is_nil(seen[k], k)
      seen[k] = true
    end
  end)

  it("every bad parameter raises a clientpool.ngx error at key()'s caller", function()
    local cases = {
      { nil, "key() expects a table, got nil" },
      { { port = 1 }, "'host' must be a non-empty string, got nil" },
      { { host = "h", port = 0 }, "'port' must be an integer in 1..65535, got 0" },
      { { host = "unix:/s", port = 1 }, "'port' must be nil for a unix socket" },
      { { host = "h", port = 1, ssl = "yes" }, "'ssl' must be a boolean, got string" },
      { { host = "h", port = 1, server_name = "x" }, "'server_name' needs ssl = true" },
      { { host = "h", port = 1, ssl_verify = true }, "'ssl_verify' needs ssl = true" },
      { { host = "h", port = 1, database = -1 }, "'database' must be a non-empty string or an integer >= 0" },
      { { host = "h", port = 1, user = "" }, "'user' must be a non-empty string" },
      { { host = "h", port = 1, parts = { "a", {} } }, "'parts' item 2 must be a string, got table" },
      { { host = "h", port = 1, parts = { x = "a" } }, "'parts' must be a list" },
    }
    for _, c in ipairs(cases) do
      local e = err_of(keys.key, c[1])
      assert.truthy(e:find("clientpool.ngx: key()", 1, true), e)
      assert.truthy(e:find(c[2], 1, true), "want " .. c[2] .. ", got " .. e)
    end
  end)

  it("parse() refuses what key() does not make", function()
    assert.is_nil((keys.parse("no-port")))
    assert.is_nil((keys.parse("h:1|bogus=1")))
    assert.truthy(err_of(keys.parse, 42):find("parse() expects a key string, got number", 1, true))
  end)
end)
