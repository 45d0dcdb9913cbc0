-- clientpool.keyparts: what the managers' keys share (clientpool.ngx.keys,
-- clientpool.http.keys): the escaping of a key's parts and the form of a
-- manager's option errors.

local keyparts = require "clientpool.keyparts"

describe("clientpool.keyparts", function()
  it("esc escapes '%' and '|' only; unesc undoes it", function()
    assert.equal("a%7Cb%25c", keyparts.esc("a|b%c"))
    assert.equal("plain:host-1.example", keyparts.esc("plain:host-1.example"))
    for _, s in ipairs { "", "|", "%", "%7C", "a|b|%25|c", "\0|x" } do
      assert.equal(s, keyparts.unesc(keyparts.esc(s)))
    end
  end)

  it("esc is injective: parts joined with '|' split back the same", function()
    local parts = { "h|st", "80%", "" }
    local esc = {}
    for i, p in ipairs(parts) do esc[i] = keyparts.esc(p) end
    local joined = table.concat(esc, "|")
    local back = {}
    for f in (joined .. "|"):gmatch("([^|]*)|") do back[#back + 1] = keyparts.unesc(f) end
    assert.same(parts, back)
    assert.are_not.equal(table.concat({ keyparts.esc("a|b"), keyparts.esc("c") }, "|"),
                         table.concat({ keyparts.esc("a"), keyparts.esc("b|c") }, "|"))
  end)

  it("failer raises the manager's message without a position", function()
    local fail = keyparts.failer("clientpool.http")
    local ok, err = pcall(fail, "option '%s' must be a %s", "host", "string")
    assert.is_false(ok)
    assert.equal("clientpool.http: option 'host' must be a string", err)
  end)
end)
