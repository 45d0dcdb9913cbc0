-- clientpool.http.request: request(pool, req), the one call a user writes:
-- its argument checks and what it says when there is nothing to connect
-- to. Needs lua-http (Lua 5.1 and LuaJIT); pending elsewhere. Exchanges
-- with a real server (HTTP/1.1 keep-alive, HTTP/2) are in http_spec.lua.

local H = require "spec.helpers"
local missing = H.lua_http_missing()

describe("clientpool.http.request", function()
  if missing then
    pending("not run: " .. missing)
    return
  end
  local clientpool = require "clientpool"
  local cphttp = require "clientpool.http"

  it("bad requests raise clientpool.http errors naming the problem", function()
    local pool = clientpool.new((cphttp.pool { max_live = 1 }))
    local function err_of(fn)
      local ok, e = pcall(fn)
      assert.is_false(ok)
      return tostring(e)
    end
    assert.truthy(err_of(function() cphttp.request(nil, "http://x/") end):find("clientpool pool"))
    assert.truthy(err_of(function() cphttp.request(pool, "nope") end):find("not an absolute"))
    assert.truthy(err_of(function() cphttp.request(pool, { url = "http://x/", bogus = 1 }) end)
                  :find("unknown field 'bogus'"))
    assert.truthy(err_of(function()
      cphttp.request(pool, { url = "http://x/", headers = { ["X-A"] = "a\r\nInjected: 1" } })
    end):find("bad value for header 'X%-A'"))
    assert.truthy(err_of(function() cphttp.request(pool, { url = "http://x/", method = "G T" }) end)
                  :find("bad method"))
    assert.truthy(err_of(function() cphttp.request(pool, "http://x/", { timout = 1 }) end):find("unknown option"))
    pool:close()
  end)

  it("a pool without origin given a path-only request fails with create and says why", function()
    local cqs = H.host("cqueues")
    local sched = cqs.new()
    local pool = clientpool.new((cphttp.pool { max_live = 1, scheduler = sched }))
    local err, code
    cqs.run(sched, function()
      local _
      _, err, code = cphttp.request(pool, { path = "/x" })
    end)
    pool:close()
    assert.equal("create", code)
    assert.truthy(err:find("no 'origin'", 1, true))
  end)
end)
