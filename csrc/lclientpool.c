/*
 * lclientpool.c - the Lua C API binding of the engine: clientpool.core.
 *
 * Thin on purpose: it converts arguments and results and nothing more; every
 * decision is the engine's, every action the Lua driver's (lua/clientpool/).
 * The fast path of checkout/checkin and acquire/release is lfastpath.c.
 *
 * Objects:
 *   clientpool.Engine    an engine handle (the driver's, not the user's pool)
 *   clientpool.Sentinel  a leak sentinel: on Lua 5.1 and LuaJIT, where tables
 *                        have no __gc, a lease table holds one so a lease
 *                        collected while held is reported to the engine.
 * Both point at a shared, reference-counted box (lcp_box, lbinding.h), so a
 * sentinel collected after its engine never touches freed memory.
 *
 * A `now` argument left out (nil) means CLOCK_MONOTONIC read here, so a hot
 * call is one C call, not two.
 */
#include "lbinding.h"
#include "compat.h"

#include <stdlib.h>
#include <string.h>

enum { UV_GUARDS = 1 };   /* the pool's private table's array of sentinels */


static void box_unref(lcp_box *b) {
  if (--b->refs == 0) free(b);
}

/* Whether E (argument 1, checked by lcp_self) skips the clock (E:untimed). */
static int lcp_skips_clock(lua_State *L) {
  return (*(lcp_box **)lua_touserdata(L, 1))->skip_clock;
}

/* The pool metatable is upvalue 1 of every method: checking a self argument
 * is one lua_rawequal instead of a registry lookup (luaL_checkudata). */
static clientpool_t *lcp_self(lua_State *L) {
  lcp_box **u = (lcp_box **)lua_touserdata(L, 1);
  int same;
  if (u == NULL || !lua_getmetatable(L, 1)) luaL_argerror(L, 1, LCP_ENGINE_MT " expected");
  same = lua_rawequal(L, -1, lua_upvalueindex(1));
  lua_pop(L, 1);
  if (!same) luaL_argerror(L, 1, LCP_ENGINE_MT " expected");
  if (*u == NULL || (*u)->p == NULL) luaL_argerror(L, 1, LCP_ENGINE_MT " is freed");
  return (*u)->p;
}

static double opt_now(lua_State *L, int i) {
  return lua_isnoneornil(L, i) ? clientpool_monotime() : (double)lua_tonumber(L, i);
}

static int32_t opt_int(lua_State *L, int t, const char *name, int32_t def) {
  int32_t v = def;
  lua_getfield(L, t, name);
  if (!lua_isnil(L, -1)) v = (int32_t)luaL_checkinteger(L, -1);
  lua_pop(L, 1);
  return v;
}

static double opt_num(lua_State *L, int t, const char *name, double def) {
  double v = def;
  lua_getfield(L, t, name);
  if (!lua_isnil(L, -1)) v = (double)luaL_checknumber(L, -1);
  lua_pop(L, 1);
  return v;
}

/* The config table at index 1 (new and configure read it alike: a field
 * left out takes new()'s default). */
static void read_config(lua_State *L, clientpool_config_t *cfg) {
  clientpool_config_t c;
  luaL_checktype(L, 1, LUA_TTABLE);
  memset(&c, 0, sizeof c);
  c.max_live = opt_int(L, 1, "max_live", 0);
  c.min_idle = opt_int(L, 1, "min_idle", 0);
  c.max_idle = opt_int(L, 1, "max_idle", c.max_live);
  c.capacity = opt_int(L, 1, "capacity", 1);
  {
    /* The default is max_live * capacity, which can pass INT32_MAX (both
     * may be huge): saturate instead of overflowing. */
    int64_t dflt = (int64_t)c.max_live * (int64_t)c.capacity;
    c.max_concurrency = opt_int(L, 1, "max_concurrency", dflt > INT32_MAX ? INT32_MAX : (int32_t)dflt);
  }
  c.max_waiting = opt_int(L, 1, "max_waiting", 1024);
  c.key_max_live = opt_int(L, 1, "key_max_live", -1);
  c.key_max_idle = opt_int(L, 1, "key_max_idle", -1);
  c.max_keys = opt_int(L, 1, "max_keys", -1);
  c.pause_fail = opt_int(L, 1, "pause_fail", 0);
  c.idle_timeout = opt_num(L, 1, "idle_timeout", -1);
  c.max_lifetime = opt_num(L, 1, "max_lifetime", -1);
  c.lifetime_jitter = opt_num(L, 1, "lifetime_jitter", 0);
  c.validate_after_idle = opt_num(L, 1, "validate_after_idle", -1);
  c.leak_threshold = opt_num(L, 1, "leak_threshold", -1);
  c.create_backoff = opt_num(L, 1, "create_backoff", -1);
  c.create_backoff_max = opt_num(L, 1, "create_backoff_max", -1);
  c.keepalive = opt_num(L, 1, "keepalive", -1);
  c.seed = (uint64_t)opt_num(L, 1, "seed", 0);
  *cfg = c;
}

/* core.new(cfg): cfg is already validated by the driver; the engine checks
 * the envelope again and an inconsistent one raises here. */
static int lcp_new(lua_State *L) {
  clientpool_config_t c;
  clientpool_t *p;
  lcp_box **u;
  int rc;
  read_config(L, &c);
  u = (lcp_box **)lua_newuserdata(L, sizeof *u);
  *u = NULL;
  rc = clientpool_new(&c, &p);
  if (rc == CLIENTPOOL_EINVAL) return luaL_error(L, "clientpool: options outside the capacity envelope");
  if (rc != CLIENTPOOL_OK) return luaL_error(L, "clientpool: out of memory");
  *u = (lcp_box *)malloc(sizeof **u);
  if (*u == NULL) { clientpool_free(p); return luaL_error(L, "clientpool: out of memory"); }
  (*u)->p = p;
  (*u)->refs = 1;
  (*u)->skip_clock = 0;
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_setmetatable(L, -2);
  /* the pool's private table: holds the driver's notify function, and is
   * shared by its sentinels so a collected lease can call it; [UV_GUARDS]
   * the sentinels by lease slot + 1, armed or disarmed (weak: a dropped
   * lease's sentinel must be collectable) */
  lua_newtable(L);
  lua_newtable(L);
  lua_newtable(L);
  lua_pushliteral(L, "v");
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
  lua_rawseti(L, -2, UV_GUARDS);
  lcp_setuservalue(L, -2);
  return 1;
}

/* E:set_notify(fn [, now]): fn() runs (protected) after a collected lease
 * was reported, so the driver can carry out the engine's events; now(), if
 * given, is the time of that report (else the engine's latest time: the
 * last call's, which a grant the report makes would then be dated at). */
static int lcp_set_notify(lua_State *L) {
  lcp_self(L);
  lua_settop(L, 3);
  lcp_getuservalue(L, 1);
  lua_pushvalue(L, 2);
  lua_setfield(L, -2, "notify");
  lua_pushvalue(L, 3);
  lua_setfield(L, -2, "now");
  return 0;
}

/* The time a finalizer reports a collected lease at: the driver's clock
 * (the private table's "now", called protected), else -1, the engine's
 * latest time.  t: the private table's stack index. */
static double finalizer_now(lua_State *L, int t) {
  double now = -1;
  if (!lua_istable(L, t)) return now;
  lua_getfield(L, t, "now");
  if (lua_isfunction(L, -1) && lua_pcall(L, 0, 1, 0) == 0 && lua_type(L, -1) == LUA_TNUMBER)
    now = (double)lua_tonumber(L, -1);
  lua_pop(L, 1);
  return now;
}

/* One idempotent free backs :free() and __gc. */
static int lcp_pool__gc(lua_State *L) {
  lcp_box **u = (lcp_box **)lua_touserdata(L, 1);
  if (u && *u) {
    clientpool_free((*u)->p);
    (*u)->p = NULL;
    box_unref(*u);
    *u = NULL;
  }
  return 0;
}

static int lcp_pool__tostring(lua_State *L) {
  lcp_box **u = (lcp_box **)lua_touserdata(L, 1);
  if (u && *u) lua_pushfstring(L, LCP_ENGINE_MT ": %p", (void *)u);
  else lua_pushfstring(L, LCP_ENGINE_MT ": %p (freed)", (void *)u);
  return 1;
}

/* Pushes a leak sentinel for (lease, gen) of the pool at index e: a lease
 * table holds one, so a lease collected while held is reported to the
 * engine.  One sentinel per lease slot: a released lease's is disarmed in
 * place (lcp_recycle_sentinel_in) and armed again for the slot's next
 * lease, so no finalizer runs per lease and a lease table needs no __gc of
 * its own; the lookup that finds it is the one that stores it.  A slot's
 * sentinel still armed (a lease ended as leaked by the driver, E:leak, its
 * sentinel not yet collected) is never shared: that lease gets a new one. */
void lcp_push_sentinel_in(lua_State *L, int e, int guards, int32_t lease, uint32_t gen) {
  lcp_guard *s;
  lua_rawgeti(L, guards, lease + 1);           /* s|nil */
  s = (lcp_guard *)lua_touserdata(L, -1);
  if (s == NULL || s->box == NULL || s->lease != LCP_DISARMED) {
    lcp_box **u = (lcp_box **)lua_touserdata(L, e);
    lua_pop(L, 1);
    s = (lcp_guard *)lua_newuserdata(L, sizeof *s);
    s->box = *u;
    s->box->refs++;
    luaL_getmetatable(L, LCP_SENTINEL_MT);
    lua_setmetatable(L, -2);
    lcp_getuservalue(L, e);                    /* (the private table: its notify) */
    lcp_setuservalue(L, -2);
    lua_pushvalue(L, -1);
    lua_rawseti(L, guards, lease + 1);
  }
  s->lease = lease;
  s->gen = gen;
}

void lcp_push_guards(lua_State *L, int e) {
  lcp_getuservalue(L, e);
  lua_rawgeti(L, -1, UV_GUARDS);
  lua_remove(L, -2);
}

void lcp_push_sentinel(lua_State *L, int e, int32_t lease, uint32_t gen) {
  int top = lua_gettop(L);
  lcp_push_guards(L, e);
  lcp_push_sentinel_in(L, e, top + 1, lease, gen);
  lua_remove(L, top + 1);
}

void lcp_recycle_sentinel_in(lua_State *L, int guards, int32_t lease, uint32_t gen) {
  lcp_guard *s;
  lua_rawgeti(L, guards, lease + 1);           /* s|nil */
  s = (lcp_guard *)lua_touserdata(L, -1);
  if (s && s->box && s->lease == lease && s->gen == gen) s->lease = LCP_DISARMED;
  lua_pop(L, 1);
}

void lcp_recycle_sentinel(lua_State *L, int e, int32_t lease, uint32_t gen) {
  int top = lua_gettop(L);
  lcp_push_guards(L, e);
  lcp_recycle_sentinel_in(L, top + 1, lease, gen);
  lua_settop(L, top);
}

/* E:sentinel(lease, gen) -> a leak sentinel */
static int lcp_sentinel(lua_State *L) {
  lcp_self(L);
  lcp_push_sentinel(L, 1, (int32_t)lua_tointeger(L, 2), (uint32_t)lua_tointeger(L, 3));
  return 1;
}

/* The sentinel at stack index i if it is one of the engine box's, else
 * NULL (its metatable the registry's; lfastpath.c's fp_guard is the hot
 * path's own, comparing the metatable's address). */
static lcp_guard *guard_at(lua_State *L, int i, const lcp_box *box) {
  lcp_guard *s = (lcp_guard *)lua_touserdata(L, i);
  int same;
  if (s == NULL || lua_type(L, i) != LUA_TUSERDATA || !lua_getmetatable(L, i)) return NULL;
  luaL_getmetatable(L, LCP_SENTINEL_MT);
  same = lua_rawequal(L, -1, -2);
  lua_pop(L, 2);
  return same && s->box == box ? s : NULL;
}

/* E:guarded(sentinel) -> lease, gen, record, key of the lease a sentinel of
 * this engine's guards (record and key only while the engine holds the
 * lease: a lease table keeps its slot and generation in its sentinel, the
 * rest is the engine's), or nothing (not one, or disarmed: released) */
static int lcp_guarded(lua_State *L) {
  const lcp_guard *s;
  clientpool_t *p = lcp_self(L);
  int32_t rec, key;
  s = guard_at(L, 2, *(lcp_box **)lua_touserdata(L, 1));
  if (s == NULL || s->lease == LCP_DISARMED) return 0;
  lua_pushinteger(L, s->lease);
  lua_pushinteger(L, (lua_Integer)s->gen);
  if ((rec = clientpool_lease_record(p, s->lease, s->gen, &key)) < 0) return 2;
  lua_pushinteger(L, rec);
  lua_pushinteger(L, key);
  return 4;
}

/* E:disarm(lease, gen): the lease's sentinel guards it no more (checkout
 * takes one only while its hooks run: the handle holds the lease after). */
static int lcp_disarm(lua_State *L) {
  lcp_self(L);
  lcp_recycle_sentinel(L, 1, (int32_t)lua_tointeger(L, 2), (uint32_t)lua_tointeger(L, 3));
  return 0;
}

/* Pushes a grant: status, record, lease, gen, validate, idle, pending
 * [, waited] [, sentinel]: the sentinel only for a grant and when asked for
 * (sentinel: the engine's stack index, or 0), so a hot acquire stays one C
 * call on every Lua. */
int lcp_push_grant(lua_State *L, const clientpool_grant_t *g, clientpool_t *p, int waited, int sentinel) {
  int n;
  lua_pushinteger(L, g->status);
  lua_pushinteger(L, g->record);
  lua_pushinteger(L, g->lease);
  lua_pushinteger(L, (lua_Integer)g->lease_gen);
  lua_pushboolean(L, g->validate);
  lua_pushnumber(L, g->idle);
  lua_pushinteger(L, clientpool_pending(p));
  n = 7;
  if (waited) { lua_pushnumber(L, g->waited); n++; }
  if (sentinel && (g->status == CLIENTPOOL_GRANT_IDLE || g->status == CLIENTPOOL_GRANT_CREATE)) {
    lcp_push_sentinel(L, sentinel, g->lease, g->lease_gen);
    n++;
  }
  return n;
}

/* E:acquire(key [, now [, sentinel]]) -> status, record, lease, gen, validate, idle, pending [, sentinel] */
static int lcp_acquire(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  clientpool_grant_t g;
  int32_t k = (int32_t)lua_tointeger(L, 2);
  if (!lua_isnoneornil(L, 3) || !lcp_skips_clock(L) || clientpool_acquire_untimed(p, k, &g) != CLIENTPOOL_GRANT_IDLE)
    clientpool_acquire(p, k, opt_now(L, 3), &g);
  return lcp_push_grant(L, &g, p, 0, lua_toboolean(L, 4) ? 1 : 0);
}

/* E:untimed(on): whether the calls given no time (acquire, release) try the
 * engine's fast path without a clock read first (clientpool_acquire_untimed);
 * the driver turns it on for a pool without a validate hook (the grant's
 * idle is not measured there). */
static int lcp_untimed(lua_State *L) {
  lcp_self(L);
  (*(lcp_box **)lua_touserdata(L, 1))->skip_clock = lua_toboolean(L, 2);
  return 0;
}

/* E:release_closes(lease, gen [, now]) -> boolean (nil for a stale lease) */
static int lcp_release_closes(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  int rc = clientpool_release_closes(p, (int32_t)lua_tointeger(L, 2), (uint32_t)lua_tointeger(L, 3),
                                     opt_now(L, 4));
  if (rc < 0) lua_pushnil(L); else lua_pushboolean(L, rc);
  return 1;
}

/* E:regrant(lease, gen [, now [, sentinel]]) -> as acquire */
static int lcp_regrant(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  clientpool_grant_t g;
  int32_t lease = (int32_t)lua_tointeger(L, 2);
  uint32_t gen = (uint32_t)lua_tointeger(L, 3);
  clientpool_regrant(p, lease, gen, opt_now(L, 4), &g);
  if (g.status != CLIENTPOOL_STALE) lcp_recycle_sentinel(L, 1, lease, gen);
  return lcp_push_grant(L, &g, p, 0, lua_toboolean(L, 5) ? 1 : 0);
}

/* E:release(lease, gen, reason [, now]) -> ok, pending */
static int lcp_release(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  int32_t lease = (int32_t)lua_tointeger(L, 2);
  uint32_t gen = (uint32_t)lua_tointeger(L, 3);
  int32_t reason = (int32_t)luaL_optinteger(L, 4, -1);
  int rc = lua_isnoneornil(L, 5) && lcp_skips_clock(L) ? clientpool_release_untimed(p, lease, gen, reason)
                                                       : CLIENTPOOL_UNTIMED;
  if (rc == CLIENTPOOL_UNTIMED) rc = clientpool_release(p, lease, gen, reason, opt_now(L, 5));
  if (rc == 0) lcp_recycle_sentinel(L, 1, lease, gen);
  lua_pushboolean(L, rc == 0);
  lua_pushinteger(L, clientpool_pending(p));
  return 2;
}

/* E:wait(key, deadline [, now [, priority]]) -> waiter, gen, pending | nil, status
 * (priority: an integer, default 0; see clientpool_wait_priority) */
static int lcp_wait(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  uint32_t gen = 0;
  int32_t w = clientpool_wait_priority(p, (int32_t)lua_tointeger(L, 2), (double)luaL_optnumber(L, 3, -1),
                                       (int32_t)luaL_optinteger(L, 5, 0), opt_now(L, 4), &gen);
  if (w < 0) {
    lua_pushnil(L);
    lua_pushinteger(L, -w);
    return 2;
  }
  lua_pushinteger(L, w);
  lua_pushinteger(L, (lua_Integer)gen);
  lua_pushinteger(L, clientpool_pending(p));
  return 3;
}

/* E:claim(waiter, gen [, now [, sentinel]]) -> status, record, lease, gen, validate, idle, pending, waited [, sentinel] */
static int lcp_claim(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  clientpool_grant_t g;
  clientpool_claim(p, (int32_t)lua_tointeger(L, 2), (uint32_t)lua_tointeger(L, 3), opt_now(L, 4), &g);
  return lcp_push_grant(L, &g, p, 1, lua_toboolean(L, 5) ? 1 : 0);
}

/* E:cancel(waiter, gen, status [, now [, sentinel]]) -> as claim */
static int lcp_cancel(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  clientpool_grant_t g;
  clientpool_cancel(p, (int32_t)lua_tointeger(L, 2), (uint32_t)lua_tointeger(L, 3),
                    (int32_t)lua_tointeger(L, 4), opt_now(L, 5), &g);
  return lcp_push_grant(L, &g, p, 1, lua_toboolean(L, 6) ? 1 : 0);
}

static int push_rc(lua_State *L, int rc, clientpool_t *p) {
  lua_pushboolean(L, rc == 0);
  lua_pushinteger(L, clientpool_pending(p));
  return 2;
}

/* E:created(record, ok [, now]) -> ok, pending */
static int lcp_created(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  return push_rc(L, clientpool_created(p, (int32_t)lua_tointeger(L, 2), lua_toboolean(L, 3),
                                       opt_now(L, 4)), p);
}

/* E:abandon(waiter, gen [, now]) -> ok, pending */
static int lcp_abandon(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  return push_rc(L, clientpool_abandon(p, (int32_t)lua_tointeger(L, 2), (uint32_t)lua_tointeger(L, 3),
                                       opt_now(L, 4)), p);
}

/* E:leak(lease, gen [, now]) -> ok, pending */
static int lcp_leak(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  return push_rc(L, clientpool_leak(p, (int32_t)lua_tointeger(L, 2), (uint32_t)lua_tointeger(L, 3),
                                    opt_now(L, 4)), p);
}

/* E:destroyed(record [, now]) -> ok, pending: the destroy hook of the
 * record an EV_DESTROY named returned or failed (or there is none) */
static int lcp_destroyed(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  return push_rc(L, clientpool_destroyed(p, (int32_t)lua_tointeger(L, 2), opt_now(L, 3)), p);
}

/* E:configure(cfg [, now]) -> true, pending | false, code (EINVAL: outside
 * the envelope, or another capacity or seed; ECLOSED; ENOMEM): cfg as for
 * new(), every field (one left out takes new()'s default) */
static int lcp_configure(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  clientpool_config_t c;
  int rc;
  lua_remove(L, 1);                  /* (read_config reads index 1) */
  read_config(L, &c);
  rc = clientpool_configure(p, &c, opt_now(L, 2));
  if (rc != 0) {
    lua_pushboolean(L, 0);
    lua_pushinteger(L, rc);
    return 2;
  }
  return push_rc(L, 0, p);
}

/* E:keepalive_done(record, ok [, now]) -> ok, pending: the background
 * validate an EV_KEEPALIVE asked for is over (ok: the client is good) */
static int lcp_keepalive_done(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  return push_rc(L, clientpool_keepalive_done(p, (int32_t)lua_tointeger(L, 2), lua_toboolean(L, 3), opt_now(L, 4)), p);
}

/* E:key_caps(key, max_live, max_idle [, now]) -> ok, pending (< 0: the pool's caps) */
static int lcp_key_caps(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  return push_rc(L, clientpool_key_caps(p, (int32_t)lua_tointeger(L, 2), (int32_t)luaL_optinteger(L, 3, -1),
                                        (int32_t)luaL_optinteger(L, 4, -1), opt_now(L, 5)), p);
}

/* E:retire(record [, now]) -> ok, pending */
static int lcp_retire(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  return push_rc(L, clientpool_retire(p, (int32_t)lua_tointeger(L, 2), opt_now(L, 3)), p);
}

/* E:retire_before(key, before [, now]) -> ok, pending (key < 0: the pool) */
/* E:retire_upto(record [, now]) -> ok, pending */
static int lcp_retire_upto(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  return push_rc(L, clientpool_retire_upto(p, (int32_t)lua_tointeger(L, 2), opt_now(L, 3)), p);
}

static int lcp_retire_before(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  return push_rc(L, clientpool_retire_before(p, (int32_t)lua_tointeger(L, 2), (double)lua_tonumber(L, 3),
                                             opt_now(L, 4)), p);
}

/* ---- the fleet (clientpool.h "the fleet", docs/fleet.md) ---- */

/* E:set_fleet(fleet_handle, use_leases) -> ok, pending: the engine takes its
 * budget from the (joined) handle and retains it until it is freed */
static int lcp_set_fleet(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  struct clientpool_fleet *f = lcp_fleet_to(L, 2);
  luaL_argcheck(L, f != NULL, 2, "open clientpool.Fleet expected");
  return push_rc(L, clientpool_set_fleet(p, f, lua_toboolean(L, 3) ? CLIENTPOOL_FLEET_USE_LEASES : 0), p);
}

/* E:key_fleet(key, slot) -> ok, pending */
static int lcp_key_fleet(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  return push_rc(L, clientpool_key_fleet(p, (int32_t)lua_tointeger(L, 2), (int32_t)lua_tointeger(L, 3)), p);
}

/* E:blocked(kind, key) -> n */
static int lcp_blocked(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  lua_pushinteger(L, clientpool_blocked(p, (int32_t)lua_tointeger(L, 2), (int32_t)luaL_optinteger(L, 3, -1)));
  return 1;
}

/* E:retry([now]) -> marks, pending */
static int lcp_retry(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  lua_pushinteger(L, clientpool_retry(p, opt_now(L, 2)));
  lua_pushinteger(L, clientpool_pending(p));
  return 2;
}

/* E:rebalance([now]) -> shed, pending */
static int lcp_rebalance(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  lua_pushinteger(L, clientpool_rebalance(p, opt_now(L, 2)));
  lua_pushinteger(L, clientpool_pending(p));
  return 2;
}

/* E:gate_fleet(key, paused [, now]) -> ok, pending */
static int lcp_gate_fleet(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  return push_rc(L, clientpool_gate_fleet(p, (int32_t)lua_tointeger(L, 2), lua_toboolean(L, 3), opt_now(L, 4)), p);
}

/* E:pause(key [, now]) -> ok, pending */
static int lcp_pause(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  return push_rc(L, clientpool_pause(p, (int32_t)lua_tointeger(L, 2), opt_now(L, 3)), p);
}

/* E:resume(key, probe [, now]) -> ok, pending */
static int lcp_resume(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  return push_rc(L, clientpool_resume(p, (int32_t)lua_tointeger(L, 2), lua_toboolean(L, 3),
                                      opt_now(L, 4)), p);
}

/* E:probe_ok(lease, gen [, now]) -> was_probe, pending */
static int lcp_probe_ok(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  int was = clientpool_probe_ok(p, (int32_t)lua_tointeger(L, 2), (uint32_t)lua_tointeger(L, 3),
                                opt_now(L, 4));
  lua_pushboolean(L, was);
  lua_pushinteger(L, clientpool_pending(p));
  return 2;
}

/* E:gate(key) -> 0 open, 1 paused, 2 half-open */
static int lcp_gate(lua_State *L) {
  lua_pushinteger(L, clientpool_gate(lcp_self(L), (int32_t)luaL_optinteger(L, 2, -1)));
  return 1;
}

/* E:floor(on [, now]) -> pending */
static int lcp_floor(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  clientpool_floor(p, lua_toboolean(L, 2), opt_now(L, 3));
  lua_pushinteger(L, clientpool_pending(p));
  return 1;
}

/* E:refill([now]) -> record, key, pending | nil, nil, pending */
static int lcp_refill(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  int32_t key = -1;
  int32_t r = clientpool_refill(p, opt_now(L, 2), &key);
  if (r < 0) { lua_pushnil(L); lua_pushnil(L); }
  else { lua_pushinteger(L, r); lua_pushinteger(L, key); }
  lua_pushinteger(L, clientpool_pending(p));
  return 3;
}

/* E:tick([now]) -> pending */
static int lcp_tick(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  clientpool_tick(p, opt_now(L, 2));
  lua_pushinteger(L, clientpool_pending(p));
  return 1;
}

/* E:close([now]) -> pending */
static int lcp_close(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  clientpool_close(p, opt_now(L, 2));
  lua_pushinteger(L, clientpool_pending(p));
  return 1;
}

/* E:key_open() -> key | nil, status */
static int lcp_key_open(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  int32_t k = clientpool_key_open(p);
  if (k < 0) {
    lua_pushnil(L);
    lua_pushinteger(L, k);
    return 2;
  }
  lua_pushinteger(L, k);
  return 1;
}

static int lcp_key_pin(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  int pin = lua_isboolean(L, 3) ? lua_toboolean(L, 3) : (int)lua_tointeger(L, 3);
  lua_pushboolean(L, clientpool_key_pin(p, (int32_t)lua_tointeger(L, 2), pin) == 0);
  return 1;
}

static int lcp_key_forget(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  lua_pushboolean(L, clientpool_key_forget(p, (int32_t)lua_tointeger(L, 2)));
  return 1;
}

/* E:next_event() -> type, a, b, c, t, left | nil (left: events still queued) */
static int lcp_next_event(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  clientpool_event_t ev;
  if (clientpool_next_event(p, &ev) == CLIENTPOOL_EV_NONE) return 0;
  lua_pushinteger(L, ev.type);
  lua_pushinteger(L, ev.a);
  lua_pushinteger(L, ev.b);
  lua_pushinteger(L, ev.c);
  lua_pushnumber(L, ev.t);
  /* how many are still queued: a driver that knows it queued nothing since
   * need not ask again to learn the queue is empty (a call per pump) */
  lua_pushinteger(L, clientpool_pending(p));
  return 6;
}

static int lcp_pending(lua_State *L) {
  lua_pushinteger(L, clientpool_pending(lcp_self(L)));
  return 1;
}

static int lcp_next_deadline(lua_State *L) {
  double d = clientpool_next_deadline(lcp_self(L));
  if (d < 0) lua_pushnil(L); else lua_pushnumber(L, d);
  return 1;
}

static int lcp_is_closed(lua_State *L) {
  lua_pushboolean(L, clientpool_is_closed(lcp_self(L)));
  return 1;
}

static int lcp_record_created(lua_State *L) {
  double t = clientpool_record_created(lcp_self(L), (int32_t)lua_tointeger(L, 2));
  if (t < 0) lua_pushnil(L); else lua_pushnumber(L, t);
  return 1;
}

static int lcp_lease_age(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  double a = clientpool_lease_age(p, (int32_t)lua_tointeger(L, 2), (uint32_t)lua_tointeger(L, 3),
                                  opt_now(L, 4));
  if (a < 0) lua_pushnil(L); else lua_pushnumber(L, a);
  return 1;
}

/* E:mark_checkout(lease, gen) -> true, or false for a stale handle: the
 * lease is a checkout's (clientpool_lease_checkout) */
static int lcp_mark_checkout(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  lua_pushboolean(L, clientpool_lease_checkout(p, (int32_t)lua_tointeger(L, 2), (uint32_t)lua_tointeger(L, 3)) == 0);
  return 1;
}

/* E:checkout_record(lease, gen) -> record, key of a lease a checkout holds,
 * or nothing (stale, or a lease of the acquire form) */
static int lcp_checkout_record(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  int32_t key, rec = clientpool_checkout_record(p, (int32_t)lua_tointeger(L, 2), (uint32_t)lua_tointeger(L, 3), &key);
  if (rec < 0) return 0;
  lua_pushinteger(L, rec);
  lua_pushinteger(L, key);
  return 2;
}

static const char *const by_names[CLIENTPOOL_BY_COUNT] = {
  "idle", "lifetime", "invalid", "error", "max_idle", "drain", "leaked", "retired", "evicted", "resized",
  "shed"
};

static void set_num(lua_State *L, const char *k, double v) {
  lua_pushnumber(L, v);
  lua_setfield(L, -2, k);
}

/* Counters are whole numbers: integers on Lua 5.3+ so they print as such. */
static void set_count(lua_State *L, const char *k, double v) {
  lua_pushinteger(L, (lua_Integer)v);
  lua_setfield(L, -2, k);
}

static void set_int(lua_State *L, const char *k, int32_t v) {
  lua_pushinteger(L, v);
  lua_setfield(L, -2, k);
}

/* E:stats(key, t) -> t filled (key < 0: the whole pool), or nil */
static int lcp_stats(lua_State *L) {
  clientpool_t *p = lcp_self(L);
  clientpool_stats_t s;
  int i;
  if (clientpool_stats(p, (int32_t)luaL_optinteger(L, 2, -1), &s) != 0) return 0;
  if (lua_type(L, 3) == LUA_TTABLE) lua_pushvalue(L, 3); else lua_newtable(L);
  set_count(L, "opened", s.opened);
  set_count(L, "reused", s.reused);
  set_count(L, "closed", s.closed);
  set_count(L, "leaked", s.leaked);
  set_count(L, "timeouts", s.timeouts);
  set_count(L, "rejected", s.rejected);
  set_count(L, "cancelled", s.cancelled);
  set_count(L, "create_failed", s.create_failed);
  set_count(L, "wait_count", s.wait_count);
  set_count(L, "keepalive", s.keepalive);
  set_count(L, "keepalive_failed", s.keepalive_failed);
  set_num(L, "wait_time", s.wait_time);
  set_int(L, "live", s.live);
  set_int(L, "idle", s.idle);
  set_int(L, "active", s.active);
  set_int(L, "leases", s.leases);
  set_int(L, "creating", s.creating);
  set_int(L, "waiting", s.waiting);
  set_int(L, "closing", s.closing);
  lua_getfield(L, -1, "closed_by");
  if (!lua_istable(L, -1)) {
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushvalue(L, -1);
    lua_setfield(L, -3, "closed_by");
  }
  for (i = 0; i < CLIENTPOOL_BY_COUNT; i++) set_count(L, by_names[i], s.closed_by[i]);
  lua_pop(L, 1);
  return 1;
}

static int lcp_lease__gc(lua_State *L) {
  lcp_guard *s = (lcp_guard *)luaL_checkudata(L, 1, LCP_SENTINEL_MT);
  if (s->box && s->lease == LCP_DISARMED) {   /* released: nothing to report */
    box_unref(s->box);
    s->box = NULL;
  } else if (s->box) {
    int reported = 0;
    /* at the driver's time (a grant this report makes is dated then; the
     * engine's latest time was the driver's last call); a released lease
     * is stale and the engine ignores it */
    lcp_getuservalue(L, 1);
    if (s->box->p) reported = clientpool_leak(s->box->p, s->lease, s->gen, finalizer_now(L, 2)) == 0;
    box_unref(s->box);
    s->box = NULL;
    if (reported && lua_istable(L, 2)) {
      lua_getfield(L, 2, "notify");
      if (lua_isfunction(L, -1)) lua_pcall(L, 0, 0, 0);
    }
  }
  return 0;
}

static int lcp_lease__tostring(lua_State *L) {
  lua_pushfstring(L, LCP_SENTINEL_MT ": %p", lua_touserdata(L, 1));
  return 1;
}

static int lcp_monotime(lua_State *L) {
  lua_pushnumber(L, clientpool_monotime());
  return 1;
}

static int lcp_sleep(lua_State *L) {
  clientpool_sleep((double)luaL_checknumber(L, 1));
  return 0;
}

static const luaL_Reg pool_methods[] = {
  {"acquire", lcp_acquire}, {"untimed", lcp_untimed}, {"release", lcp_release}, {"wait", lcp_wait},
  {"claim", lcp_claim}, {"cancel", lcp_cancel}, {"created", lcp_created},
  {"abandon", lcp_abandon}, {"leak", lcp_leak}, {"retire", lcp_retire}, {"destroyed", lcp_destroyed},
  {"configure", lcp_configure}, {"key_caps", lcp_key_caps}, {"keepalive_done", lcp_keepalive_done},
  {"tick", lcp_tick}, {"close", lcp_close}, {"key_open", lcp_key_open},
  {"key_pin", lcp_key_pin}, {"key_forget", lcp_key_forget},
  {"next_event", lcp_next_event}, {"pending", lcp_pending},
  {"next_deadline", lcp_next_deadline}, {"is_closed", lcp_is_closed},
  {"lease_age", lcp_lease_age}, {"stats", lcp_stats}, {"sentinel", lcp_sentinel}, {"disarm", lcp_disarm},
  {"guarded", lcp_guarded}, {"mark_checkout", lcp_mark_checkout}, {"checkout_record", lcp_checkout_record},
  {"set_notify", lcp_set_notify}, {"retire_before", lcp_retire_before},
  {"retire_upto", lcp_retire_upto}, {"regrant", lcp_regrant},
  {"release_closes", lcp_release_closes},
  {"set_fleet", lcp_set_fleet}, {"key_fleet", lcp_key_fleet}, {"blocked", lcp_blocked},
  {"retry", lcp_retry}, {"rebalance", lcp_rebalance}, {"gate_fleet", lcp_gate_fleet},
  {"pause", lcp_pause}, {"resume", lcp_resume}, {"probe_ok", lcp_probe_ok},
  {"gate", lcp_gate}, {"record_created", lcp_record_created}, {"floor", lcp_floor}, {"refill", lcp_refill},
  {NULL, NULL}
};

int luaopen_clientpool_core(lua_State *L);

int luaopen_clientpool_core(lua_State *L) {
  static const luaL_Reg funcs[] = {
    {"monotime", lcp_monotime}, {"sleep", lcp_sleep}, {"fastpath", lcp_fastpath}, {NULL, NULL}
  };
  /* Lease sentinel metatable */
  luaL_newmetatable(L, LCP_SENTINEL_MT);
  lua_pushcfunction(L, lcp_lease__gc);
  lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, lcp_lease__tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);

  lcp_newlib(L, funcs);
  /* Pool metatable: methods carry it as upvalue 1 */
  luaL_newmetatable(L, LCP_ENGINE_MT);
  lua_pushvalue(L, -1);
  lcp_setfuncs(L, pool_methods, 1);
  lua_pushvalue(L, -1);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, lcp_pool__gc);
  lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, lcp_pool__gc);
  lua_setfield(L, -2, "free");
  lua_pushcfunction(L, lcp_pool__tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pushvalue(L, -1);
  lua_pushcclosure(L, lcp_new, 1);
  lua_setfield(L, -3, "new");
  lua_pop(L, 1);

  /* status and reason codes, so the driver names them once */
  lua_pushinteger(L, CLIENTPOOL_GRANT_IDLE); lua_setfield(L, -2, "GRANT_IDLE");
  lua_pushinteger(L, CLIENTPOOL_GRANT_CREATE); lua_setfield(L, -2, "GRANT_CREATE");
  lua_pushinteger(L, CLIENTPOOL_MUST_WAIT); lua_setfield(L, -2, "MUST_WAIT");
  lua_pushinteger(L, CLIENTPOOL_PENDING); lua_setfield(L, -2, "PENDING");
  lua_pushinteger(L, CLIENTPOOL_FULL); lua_setfield(L, -2, "FULL");
  lua_pushinteger(L, CLIENTPOOL_CLOSED); lua_setfield(L, -2, "CLOSED");
  lua_pushinteger(L, CLIENTPOOL_TIMEOUT); lua_setfield(L, -2, "TIMEOUT");
  lua_pushinteger(L, CLIENTPOOL_CANCELLED); lua_setfield(L, -2, "CANCELLED");
  lua_pushinteger(L, CLIENTPOOL_STALE); lua_setfield(L, -2, "STALE");
  lua_pushinteger(L, CLIENTPOOL_PAUSED); lua_setfield(L, -2, "PAUSED");
  lua_pushinteger(L, CLIENTPOOL_BACKOFF); lua_setfield(L, -2, "BACKOFF");
  lua_pushinteger(L, CLIENTPOOL_EV_REFILL); lua_setfield(L, -2, "EV_REFILL");
  lua_pushinteger(L, CLIENTPOOL_EV_LOST); lua_setfield(L, -2, "EV_LOST");
  lua_pushinteger(L, CLIENTPOOL_EKEYS); lua_setfield(L, -2, "EKEYS");
  lua_pushinteger(L, CLIENTPOOL_EINVAL); lua_setfield(L, -2, "EINVAL");
  lua_pushinteger(L, CLIENTPOOL_ECLOSED); lua_setfield(L, -2, "ECLOSED");
  lua_pushinteger(L, CLIENTPOOL_ENOMEM); lua_setfield(L, -2, "ENOMEM");
  lua_pushinteger(L, CLIENTPOOL_EV_WAKE); lua_setfield(L, -2, "EV_WAKE");
  lua_pushinteger(L, CLIENTPOOL_EV_DESTROY); lua_setfield(L, -2, "EV_DESTROY");
  lua_pushinteger(L, CLIENTPOOL_EV_TIMER); lua_setfield(L, -2, "EV_TIMER");
  lua_pushinteger(L, CLIENTPOOL_EV_KEY_FREE); lua_setfield(L, -2, "EV_KEY_FREE");
  lua_pushinteger(L, CLIENTPOOL_EV_LEAK); lua_setfield(L, -2, "EV_LEAK");
  lua_pushinteger(L, CLIENTPOOL_EV_CREATED); lua_setfield(L, -2, "EV_CREATED");
  lua_pushinteger(L, CLIENTPOOL_EV_KEEPALIVE); lua_setfield(L, -2, "EV_KEEPALIVE");
  lua_pushinteger(L, CLIENTPOOL_KEEPALIVE_MAX); lua_setfield(L, -2, "KEEPALIVE_MAX");
  lua_pushinteger(L, CLIENTPOOL_PRIORITY_STEP); lua_setfield(L, -2, "PRIORITY_STEP");
  lua_pushinteger(L, CLIENTPOOL_EV_BLOCKED); lua_setfield(L, -2, "EV_BLOCKED");
  lua_pushinteger(L, CLIENTPOOL_EV_GATES); lua_setfield(L, -2, "EV_GATES");
  lua_pushinteger(L, CLIENTPOOL_BLOCKED_LIVE); lua_setfield(L, -2, "BLOCKED_LIVE");
  lua_pushinteger(L, CLIENTPOOL_BLOCKED_LEASE); lua_setfield(L, -2, "BLOCKED_LEASE");
  lua_pushinteger(L, CLIENTPOOL_BLOCKED_TURN); lua_setfield(L, -2, "BLOCKED_TURN");
  lua_pushinteger(L, CLIENTPOOL_BLOCKED_KEY); lua_setfield(L, -2, "BLOCKED_KEY");
  {
    int i;
    lua_newtable(L);
    for (i = 0; i < CLIENTPOOL_BY_COUNT; i++) {
      lua_pushinteger(L, i);
      lua_setfield(L, -2, by_names[i]);
    }
    lua_setfield(L, -2, "BY");
  }
  lua_pushliteral(L, "clientpool.core");
  lua_setfield(L, -2, "_NAME");
  lcp_fleet_register(L);   /* clientpool.core.fleet (lfleet.c) */
  return 1;
}
