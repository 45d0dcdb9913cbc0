-- luacheck configuration (make lint).
std = "max"            -- globals of Lua 5.1-5.4 and LuaJIT: sources run on all of them
max_line_length = 120
exclude_files = { "build/**", ".luarocks/**", "lua_modules/**" }

-- Generated from csrc/clientpool.h by `make cdef`.
files["lua/clientpool/cdef.lua"] = { max_line_length = false }
files["lua/clientpool/fleet_cdef.lua"] = { max_line_length = false }

files["spec"] = { std = "+busted" }
files["spec/nginx"] = { std = "+busted+ngx_lua" }
files["bench/nginx"] = { std = "+ngx_lua" }
files["examples/gateway"] = { std = "+ngx_lua" }
files["lua/clientpool/sched/ngx.lua"] = { std = "+ngx_lua" }
files["lua/clientpool/ngx.lua"] = { std = "+ngx_lua" }
files["lua/clientpool/ngx"] = { std = "+ngx_lua" }
