/* compat.h - the few differences between Lua 5.1 (and LuaJIT) and 5.2-5.4
 * that the binding meets.  Only lclientpool.c includes it. */
#ifndef CLIENTPOOL_COMPAT_H
#define CLIENTPOOL_COMPAT_H

#include <lua.h>
#include <lauxlib.h>

#if LUA_VERSION_NUM == 501
/* luaL_setfuncs with upvalues; LuaJIT exports its own luaL_setfuncs, so the
 * shim has a name of ours. */
static void lcp_setfuncs(lua_State *L, const luaL_Reg *l, int nup) {
  luaL_checkstack(L, nup, "too many upvalues");
  for (; l->name; l++) {
    int i;
    for (i = 0; i < nup; i++) lua_pushvalue(L, -nup);
    lua_pushcclosure(L, l->func, nup);
    lua_setfield(L, -(nup + 2), l->name);
  }
  lua_pop(L, nup);
}
#define lcp_newlib(L, l) (lua_newtable(L), lcp_setfuncs(L, l, 0))
#define lcp_rawlen(L, i) ((int)lua_objlen(L, i))
/* a userdata's private table: its environment on 5.1 */
#define lcp_getuservalue(L, i) lua_getfenv(L, i)
#define lcp_setuservalue(L, i) ((void)lua_setfenv(L, i))
#else
#define lcp_getuservalue(L, i) ((void)lua_getuservalue(L, i))
#define lcp_setuservalue(L, i) lua_setuservalue(L, i)
#define lcp_setfuncs luaL_setfuncs
#define lcp_newlib luaL_newlib
#define lcp_rawlen(L, i) ((int)lua_rawlen(L, i))
#endif

#endif
