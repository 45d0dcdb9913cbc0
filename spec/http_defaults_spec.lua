-- clientpool.http.defaults: the public table of clientpool.http with its
-- defaults; pool() reads them when it is called, so a user may set them
-- first.

local defaults = require "clientpool.http.defaults"
local have_http = pcall(require, "http.client")
local http_it = have_http and it or pending

describe("clientpool.http.defaults", function()
  it("holds the documented defaults (docs/http.md)", function()
    assert.equal(4, defaults.IDLE_TIMEOUT)
    assert.equal(10, defaults.CONNECT_TIMEOUT)
    assert.equal(30, defaults.REQUEST_TIMEOUT)
    assert.equal(100, defaults.H2_CAPACITY)
    assert.is_string(defaults._VERSION)
  end)

  http_it("is clientpool.http's own table, and pool() reads it at the call", function()
    local cphttp = require "clientpool.http"
    assert.equal(defaults, cphttp)
    local idle, cap = defaults.IDLE_TIMEOUT, defaults.H2_CAPACITY
    finally(function() defaults.IDLE_TIMEOUT, defaults.H2_CAPACITY = idle, cap end)
    assert.equal(4, (cphttp.pool { max_live = 1 }).idle_timeout)
    defaults.IDLE_TIMEOUT, defaults.H2_CAPACITY = 2.5, 16
    assert.equal(2.5, (cphttp.pool { max_live = 1 }).idle_timeout)
    assert.equal(16, (cphttp.pool { max_live = 1, version = 2 }).capacity)
    -- given options win; false turns the idle timeout off
    assert.equal(9, (cphttp.pool { max_live = 1, idle_timeout = 9 }).idle_timeout)
    assert.is_nil((cphttp.pool { max_live = 1, idle_timeout = false }).idle_timeout)
  end)
end)
