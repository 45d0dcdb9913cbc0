-- clientpool.http.lib: lua-http and cqueues, loaded once for
-- clientpool.http, with one clear error where they do not load; and the
-- HTTP/2 codes it reads from lua-http.

local have_http = pcall(require, "http.client")

describe("clientpool.http.lib", function()
  if have_http then
    it("hands out the libraries clientpool.http uses and the HTTP/2 codes", function()
      local lib = require "clientpool.http.lib"
      assert.equal(require "cqueues", lib.cqueues)
      assert.equal(require "cqueues.errno", lib.ce)
      assert.equal(require "http.client", lib.http_client)
      assert.equal(require "http.headers", lib.http_headers)
      assert.equal(3, lib.MAX_CONCURRENT_STREAMS)   -- RFC 9113 6.5.2
      assert.equal(7, lib.REFUSED_STREAM)           -- RFC 9113 7
    end)
  else
    it("raises one clientpool.http error naming what does not load, under this interpreter", function()
      local ok, err = pcall(require, "clientpool.http.lib")
      assert.is_false(ok)
      err = tostring(err)
      assert.equal(1, err:find("clientpool.http: needs lua-http on cqueues", 1, true), err)
      assert.truthy(err:find(rawget(_G, "jit") and "LuaJIT" or _VERSION, 1, true), err)
      assert.is_nil(err:find("\n", 1, true), "one line: " .. err)
    end)
  end
end)
