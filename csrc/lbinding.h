/*
 * lbinding.h - what the two files of the Lua binding (clientpool.core)
 * share: lclientpool.c (the engine's methods, leak sentinels) and
 * lfastpath.c (the C fast path of checkout/checkin and acquire/release).
 * Internal: not part of the C ABI (clientpool.h), and hidden from the
 * shared object's dynamic symbols, which an nginx process full of modules
 * shares.
 */
#ifndef CLIENTPOOL_LBINDING_H
#define CLIENTPOOL_LBINDING_H

#include "clientpool.h"

#include <lua.h>
#include <lauxlib.h>

/* luaL_tolstring, which Lua 5.1 lacks: the global tostring's answer (what
 * the Lua driver's messages show). */
#if LUA_VERSION_NUM >= 502
#define lcp_tolstring(L, i) luaL_tolstring(L, i, NULL)
#else
static inline const char *lcp_tolstring(lua_State *L, int i) {
  lua_getfield(L, LUA_GLOBALSINDEX, "tostring");
  lua_pushvalue(L, i);
  lua_call(L, 1, 1);
  return lua_tostring(L, -1);
}
#endif

/* lua_tointegerx, which Lua 5.1 lacks: one call for "an integer here?" */
#if LUA_VERSION_NUM >= 502
#define lcp_tointegerx lua_tointegerx
#else
static inline lua_Integer lcp_tointegerx(lua_State *L, int i, int *isnum) {
  *isnum = lua_type(L, i) == LUA_TNUMBER;
  return *isnum ? lua_tointeger(L, i) : 0;
}
#endif

#if defined(__GNUC__)
#define LCP_INTERNAL __attribute__((visibility("hidden")))
#else
#define LCP_INTERNAL
#endif

/* The metatables: an engine handle (the driver's, never the user's Pool)
 * and a lease's leak sentinel (never the user's Lease). */
#define LCP_ENGINE_MT "clientpool.Engine"
#define LCP_SENTINEL_MT "clientpool.Sentinel"

/* What an engine handle and its sentinels point at: shared and
 * reference-counted, so a sentinel collected after its engine never
 * touches freed memory. */
typedef struct lcp_box {
  clientpool_t *p;     /* NULL once the engine is freed */
  int refs;
  int skip_clock;      /* E:untimed: calls given no time try the untimed ones first */
} lcp_box;

/* A leak sentinel: the lease (slot, generation) it guards.  A lease table
 * holds its sentinel and nothing else of the engine's: the driver reads the
 * lease's slot and generation from it (E:guarded, lfastpath.c). */
typedef struct lcp_guard {
  lcp_box *box;
  int32_t lease;       /* LCP_DISARMED once released: it guards nothing */
  uint32_t gen;
} lcp_guard;
#define LCP_DISARMED (-1)

/* Pushes a leak sentinel for (lease, gen) of the engine at stack index e
 * (absolute or an upvalue's, as every index here). */
LCP_INTERNAL void lcp_push_sentinel(lua_State *L, int e, int32_t lease, uint32_t gen);
/* The lease (lease, gen) of the engine at index e ended: its sentinel is
 * disarmed in place, kept (weakly) for the slot's next lease. */
LCP_INTERNAL void lcp_recycle_sentinel(lua_State *L, int e, int32_t lease, uint32_t gen);
/* Pushes the table of the engine at index e that holds its sentinels by
 * lease slot + 1 (weak).  It lasts as long as the engine: the fast path
 * keeps it as an upvalue and calls the two below, two table lookups fewer
 * per call. */
LCP_INTERNAL void lcp_push_guards(lua_State *L, int e);
/* lcp_push_sentinel and lcp_recycle_sentinel, given that table's index. */
LCP_INTERNAL void lcp_push_sentinel_in(lua_State *L, int e, int guards, int32_t lease, uint32_t gen);
LCP_INTERNAL void lcp_recycle_sentinel_in(lua_State *L, int guards, int32_t lease, uint32_t gen);
/* Pushes a grant: status, record, lease, gen, validate, idle, pending
 * [, waited] [, sentinel]; returns how many values. */
LCP_INTERNAL int lcp_push_grant(lua_State *L, const clientpool_grant_t *g, clientpool_t *p, int waited,
                                int sentinel);
/* core.fastpath(engine, pool, parts) (lfastpath.c). */
LCP_INTERNAL int lcp_fastpath(lua_State *L);
/* Sets field "fleet" of the module table on the top of the stack: the
 * machine-local fleet's binding (lfleet.c). */
LCP_INTERNAL int lcp_fleet_register(lua_State *L);
/* The open fleet handle of the clientpool.Fleet userdata at idx (lfleet.c),
 * or NULL (not one, or closed): for the engine's set_fleet. */
LCP_INTERNAL struct clientpool_fleet *lcp_fleet_to(lua_State *L, int idx);

#endif
