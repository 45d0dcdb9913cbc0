-- spec/preload.lua: the C libraries whose second luaopen is unsafe are
-- opened once per busted process, before any spec file.
local seen = package.loaded["_cqueues"] -- before this file requires anything

describe("spec/preload.lua (busted helper)", function()
  local ok = pcall(require, "cqueues")
  local it_cq = ok and it or pending

  it_cq("cqueues was loaded before this spec file began", function()
    assert.is_not_nil(seen)
    assert.are.equal(seen, package.loaded["_cqueues"])
  end)
end)
