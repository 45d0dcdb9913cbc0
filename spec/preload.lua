-- busted helper (.busted: helper), run once per busted process before any
-- spec file. busted insulates each spec file: what a file loaded is unloaded
-- after it, so the next file's require opens a C library again. cqueues'
-- luaopen is not safe to run twice: it installs its metatables' __gc first
-- and only then sets the upvalue that __gc checks the object's class
-- against, so a garbage cqueue finalized in that window raises "Continuation
-- Queue expected, got userdata" from the collector. Lua 5.2 and 5.3 raise
-- errors in __gc where the allocation happened, and busted died of it (CI,
-- test-busted-lua5.2). Repro without busted: drop the package.loaded entries
-- of cqueues between rounds of cqueues.new() under setpause 200 (lua5.2).
-- Loaded here, before the first file, these stay loaded for the whole run,
-- as in a real program; busted preloads LuaJIT's ffi for the same reason.
for _, name in ipairs {
  "cqueues", "cqueues.errno", "cqueues.auxlib", "cqueues.socket", "cqueues.condition",
  "cqueues.promise", "cqueues.dns", "cqueues.dns.resolvers",
} do
  pcall(require, name)
end
