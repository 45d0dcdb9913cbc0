-- clientpool.http.keys: the pool keys of origins (key, parse), URL
-- splitting, and the registry of TLS contexts keys refer to by name. Needs
-- lua-http (Lua 5.1 and LuaJIT); pending elsewhere.

local missing = require("spec.helpers").lua_http_missing()

describe("clientpool.http.keys", function()
  if missing then
    pending("not run: " .. missing)
    return
  end
  local keys = require "clientpool.http.keys"
  local cphttp = require "clientpool.http"

  local function err_of(fn, ...)
    local ok, e = pcall(fn, ...)
    assert.is_false(ok)
    return tostring(e)
  end

  it("key() is the origin with its TLS settings, injective and parseable", function()
    assert.equal("http://example.com:80", cphttp.key("http://Example.com/path?q"))
    assert.equal("https://example.com:443", cphttp.key("https://example.com"))
    assert.equal("https://[::1]:8443|noverify", cphttp.key("https://[::1]:8443/", { verify = false }))
    local k = cphttp.key("https://h:1", { ca_file = "/x|y%", sni = false })
    local p = assert(cphttp.parse(k))
    assert.equal("/x|y%", p.ca_file)
    assert.is_false(p.sni)
    assert.equal(1, p.port)
    assert.is_nil(cphttp.parse("redis://x:1"))
  end)

  it("split_url: scheme, host, port and target; nil and why for what is not an http(s) URL", function()
    assert.same({ "https", "example.com", 443, "/a?b" }, { keys.split_url("HTTPS://user@Example.com/a?b#frag") })
    assert.same({ "http", "[::1]", 8080, "/?q" }, { keys.split_url("http://[::1]:8080?q") })
    assert.same({ "http", "h", 80, "/" }, { keys.split_url("http://h") })
    local none, why = keys.split_url("ftp://h/")
    assert.is_nil(none)
    assert.equal("scheme must be http or https, got ftp", why)
    assert.truthy(select(2, keys.split_url("http://h:0/")):find("bad port", 1, true))
    assert.truthy(select(2, keys.split_url("http:///x")):find("no host", 1, true))
    assert.truthy(select(2, keys.split_url("h/x")):find("not an absolute", 1, true))
  end)

  it("parse() gives the parts back, the authority and origin as a request writes them", function()
    local p = assert(keys.parse(keys.key("https://api.example.com:8443", { sni = "other.example" })))
    assert.equal("https", p.scheme)
    assert.is_true(p.tls)
    assert.is_true(p.verify)
    assert.equal("other.example", p.sni)
    assert.equal("api.example.com:8443", p.authority)
    assert.equal("https://api.example.com:8443", p.origin)
    p = assert(keys.parse(keys.key("http://h:80")))
    assert.equal("h", p.authority)                     -- the default port is left out
    assert.is_nil(keys.parse("http://h:80|noverify"))  -- TLS settings on http
    assert.is_nil(keys.parse("https://h:443|bogus"))
    assert.is_nil(keys.parse(42))
  end)

  it("tls settings: each option checked, raising at key()'s caller", function()
    assert.truthy(err_of(keys.key, "http://x", { verify = false }):find("need an https origin", 1, true))
    assert.truthy(err_of(keys.key, "https://x", { nope = 1 }):find("unknown tls option 'nope'", 1, true))
    assert.truthy(err_of(keys.key, "https://x", { verify = 1 }):find("tls.verify must be a boolean", 1, true))
    assert.truthy(err_of(keys.key, "https://x", { sni = 3 }):find("tls.sni must be a server name or false", 1, true))
    assert.truthy(err_of(keys.key, "https://x", { ctx = "never-registered" }):find("unknown tls.ctx", 1, true))
    assert.truthy(err_of(keys.key, 12):find("the origin must be a URL string, got number", 1, true))
  end)

  it("tls_context: a name for a context, one context per name", function()
    local ctx = require("http.tls").new_client_context()
    local other = require("http.tls").new_client_context()
    assert.equal("spec-keys-ctx", keys.tls_context("spec-keys-ctx", ctx))
    assert.equal("spec-keys-ctx", keys.tls_context("spec-keys-ctx", ctx))   -- the same again: fine
    assert.truthy(err_of(keys.tls_context, "spec-keys-ctx", other):find("names another context", 1, true))
    assert.truthy(err_of(keys.tls_context, "a|b", ctx):find("without '|'", 1, true))
    assert.truthy(err_of(keys.tls_context, "x", {}):find("must be an openssl.ssl.context", 1, true))
    local k = keys.key("https://h", { ctx = "spec-keys-ctx" })
    assert.equal("https://h:443|ctx=spec-keys-ctx", k)
    assert.equal(ctx, keys.context_for(assert(keys.parse(k))))
  end)
end)
