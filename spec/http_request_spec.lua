-- clientpool.http.request: request(pool, req), the one call a user writes:
-- its argument checks and what it says when there is nothing to connect
-- to. Needs lua-http (Lua 5.1 and LuaJIT); pending elsewhere. Exchanges
-- with a real server (HTTP/1.1 keep-alive, HTTP/2) are in http_spec.lua.

local have_http = pcall(require, "http.client")

describe("clientpool.http.request", function()
  if not have_http then
    pending("not run: lua-http does not load under " .. (rawget(_G, "jit") and "LuaJIT" or _VERSION))
    return
  end
  local clientpool = require "clientpool"
  local cphttp = require "clientpool.http"
  local cqueues = require "cqueues"
  local csched = require "clientpool.sched.cqueues"

  local function err_of(fn)
    local ok, e = pcall(fn)
    assert.is_false(ok)
    return tostring(e)
  end

  it("bad requests raise clientpool.http errors naming the problem", function()
    local pool = clientpool.new((cphttp.pool { max_live = 1 }))
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
    local cq = cqueues.new()
    local sched = csched.new(cq)
    local pool = clientpool.new((cphttp.pool { max_live = 1, scheduler = sched }))
    local err, code
    sched.spawn(function()
      local _
      _, err, code = cphttp.request(pool, { path = "/x" })
    end)
    sched.run()
    pool:close()
    assert(cq:loop())
    assert.equal("create", code)
    assert.truthy(err:find("no 'origin'", 1, true))
  end)
end)
