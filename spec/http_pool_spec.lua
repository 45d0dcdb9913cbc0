-- clientpool.http.pool: pool{...}, the options for clientpool.new with the
-- hooks filled in, and its manager (mgr.stats). Needs lua-http (Lua 5.1
-- and LuaJIT); pending elsewhere. Connections to a real server are counted
-- in http_spec.lua (nginx's access log).

local H = require "spec.helpers"
local missing = H.lua_http_missing()

describe("clientpool.http.pool", function()
  if missing then
    pending("not run: " .. missing)
    return
  end
  local clientpool = require "clientpool"
  local cphttp = require "clientpool.http"
  local CQ = H.host("cqueues")

  local function err_of(fn)
    local ok, e = pcall(fn)
    assert.is_false(ok)
    return tostring(e)
  end

  it("fills in the hooks and the defaults, keeps its own options to itself", function()
    local opts, mgr = cphttp.pool { origin = "http://127.0.0.1:1", max_live = 2, max_requests = 5,
                                    connect_timeout = 1, version = 1.1 }
    for _, hook in ipairs { "create", "validate", "destroy" } do assert.is_function(opts[hook], hook) end
    assert.equal("cqueues", opts.scheduler)
    assert.equal(2, opts.max_live)
    for _, own in ipairs { "origin", "max_requests", "connect_timeout", "version" } do
      assert.is_nil(opts[own], own)
    end
    assert.equal(mgr, cphttp.manager(opts))
    assert.equal(0, mgr.stats.connects)
    assert.equal(0, mgr.stats.connect_failed)
  end)

  it("bad options raise clientpool.http errors naming the problem", function()
    assert.truthy(err_of(function() cphttp.pool { max_live = 1, create = function() end } end)
                  :find("fills in 'create'"))
    assert.truthy(err_of(function() cphttp.pool { max_live = 1, version = 3 } end):find("'version' must be 1.1 or 2"))
    assert.truthy(err_of(function() cphttp.pool { max_live = 1, capacity = 2 } end):find("needs version = 2"))
    assert.truthy(err_of(function() cphttp.pool { max_live = 1, origin = "ftp://x" } end):find("http or https"))
    assert.truthy(err_of(function() cphttp.pool { max_live = 1, max_requests = 0 } end):find("max_requests"))
  end)

  it("a refused connection is a create failure; the pool keeps no client", function()
    local sched = CQ.new()
    local opts, mgr = cphttp.pool { origin = "http://127.0.0.1:1", max_live = 1, scheduler = sched }
    local pool = clientpool.new(opts)
    local err, code
    CQ.run(sched, function()
      local _
      _, err, code = cphttp.request(pool, { path = "/x" })
    end)
    pool:close()
    assert.equal("create", code)
    assert.truthy(err:find("refused", 1, true), err)
    assert.equal(1, mgr.stats.connect_failed)
    assert.equal(0, pool:stats().live)
  end)
end)
