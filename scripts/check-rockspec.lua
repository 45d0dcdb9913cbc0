-- scripts/check-rockspec.lua ROCKSPEC
-- Checks that the rockspec's build.modules name every Lua file under
-- lua/clientpool/ (else `luarocks make` would install an incomplete module),
-- that every listed file exists, and that each Lua module name matches its
-- path (clientpool.x.y -> lua/clientpool/x/y.lua or .../init.lua).
local rockspec = assert(arg[1], "usage: check-rockspec.lua ROCKSPEC")
local env = {}
local chunk = assert((loadfile or load)(rockspec, "t", env))
if setfenv then setfenv(chunk, env) end
chunk()

local problems = {}
local function problem(fmt, ...) problems[#problems + 1] = fmt:format(...) end
local function exists(path)
  local f = io.open(path, "r")
  if f then f:close() return true end
  return false
end

local listed = {}
for name, spec in pairs(env.build and env.build.modules or {}) do
  if type(spec) == "string" then
    listed[spec] = name
    if not exists(spec) then problem("%s: %s does not exist", name, spec) end
    local want = "lua/" .. name:gsub("%.", "/")
    if spec ~= want .. ".lua" and spec ~= want .. "/init.lua" then
      problem("%s: file %s does not match the module name (%s.lua)", name, spec, want)
    end
  else
    for _, src in ipairs(spec.sources or {}) do
      if not exists(src) then problem("%s: source %s does not exist", name, src) end
    end
  end
end

local p = assert(io.popen("find lua/clientpool -name '*.lua' 2>/dev/null | sort"))
for file in p:lines() do
  if not listed[file] then problem("%s is not listed in %s", file, rockspec) end
end
p:close()

if #problems > 0 then
  io.stderr:write("check-rockspec: ", table.concat(problems, "\ncheck-rockspec: "), "\n")
  os.exit(1)
end
print("check-rockspec: " .. rockspec .. " lists every module")
