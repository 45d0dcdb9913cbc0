/*
 * lfleet.c - the Lua C API binding of the machine-local fleet (fleet.h):
 * clientpool.core.fleet, a table with open, remove, shm_name, strerror and
 * the constants, and the "clientpool.Fleet" userdata.  Thin: every method
 * is one fleet.h call.  lua/clientpool/fleet_ffi.lua is the same surface
 * through LuaJIT's FFI (spec/fleet_spec.lua runs both).
 *
 * Results mirror the C calls: take, give, shed and scan return the C
 * status as an integer (TAKEN, REFUSED..., or a negative error code), so
 * the hot path allocates nothing; calls that can fail for a reason the
 * caller reports return true or nil, error name, message.
 *
 * Registered from luaopen_clientpool_core (lclientpool.c) by one call to
 * lcp_fleet_register, which sets field "fleet" of the module table on the
 * top of the stack.
 */
#include "compat.h"
#include "fleet.h"
#include "lbinding.h"

#include <string.h>

#define FLEET_MT "clientpool.Fleet"

typedef struct { clientpool_fleet_t *f; } lcp_fleet_box;

/* The open fleet at argument 1; methods carry the metatable as upvalue 1,
 * so the type check is one rawequal. */
static clientpool_fleet_t *check_fleet(lua_State *L) {
  lcp_fleet_box *b = lua_touserdata(L, 1);
  int ok = b && lua_getmetatable(L, 1) && lua_rawequal(L, -1, lua_upvalueindex(1));
  if (b && ok) lua_pop(L, 1);
  luaL_argcheck(L, ok, 1, "clientpool.Fleet expected");
  luaL_argcheck(L, b->f != NULL, 1, "fleet handle is closed");
  return b->f;
}

static const char *err_name(int code) {
  switch (code) {
  case CLIENTPOOL_FLEET_EINVAL: return "einval";
  case CLIENTPOOL_FLEET_ENOMEM: return "enomem";
  case CLIENTPOOL_FLEET_ENOENT: return "enoent";
  case CLIENTPOOL_FLEET_EACCES: return "eacces";
  case CLIENTPOOL_FLEET_ECORRUPT: return "ecorrupt";
  case CLIENTPOOL_FLEET_EVERSION: return "eversion";
  case CLIENTPOOL_FLEET_EGEOMETRY: return "egeometry";
  case CLIENTPOOL_FLEET_ENAME: return "ename";
  case CLIENTPOOL_FLEET_EMEMBERS: return "emembers";
  case CLIENTPOOL_FLEET_EKEYS: return "ekeys";
  case CLIENTPOOL_FLEET_EBUSY: return "ebusy";
  case CLIENTPOOL_FLEET_ENOTMEMBER: return "enotmember";
  case CLIENTPOOL_FLEET_ESYS: return "esys";
  case CLIENTPOOL_FLEET_ENOTHELD: return "enotheld";
  case CLIENTPOOL_FLEET_ETIMEDOUT: return "etimedout";
  case CLIENTPOOL_FLEET_ESTALE: return "estale";
  default: return "unknown";
  }
}

/* nil, error name, message (the given one, or the code's sentence). */
static int push_fail(lua_State *L, int code, const char *msg) {
  lua_pushnil(L);
  lua_pushstring(L, err_name(code));
  lua_pushstring(L, msg && msg[0] ? msg : clientpool_fleet_strerror(code));
  return 3;
}

static int push_status(lua_State *L, int rc) {
  if (rc < 0) return push_fail(L, rc, NULL);
  lua_pushboolean(L, 1);
  return 1;
}

static void push_u64(lua_State *L, uint64_t v) {
#if LUA_VERSION_NUM >= 503
  lua_pushinteger(L, (lua_Integer)v);
#else
  lua_pushnumber(L, (lua_Number)v);
#endif
}

static int32_t opt_i32(lua_State *L, int t, const char *field, int32_t dflt) {
  int32_t v = dflt;
  lua_getfield(L, t, field);
  if (!lua_isnil(L, -1)) {
    lua_Number n = lua_tonumber(L, -1);
    if (!lua_isnumber(L, -1) || n != n || n < -2147483648.0 || n > 2147483647.0)
      luaL_error(L, "clientpool: fleet limit '%s' must be a 32-bit integer", field);
    v = (int32_t)n;
  }
  lua_pop(L, 1);
  return v;
}

/* A limits table (fields of clientpool_fleet_limits_t; the defaults of
 * clientpool.fleet_ffi's open) at index t. */
static void read_limits(lua_State *L, int t, clientpool_fleet_limits_t *lim) {
  luaL_checktype(L, t, LUA_TTABLE);
  lim->max_live = opt_i32(L, t, "max_live", 0);
  lim->max_idle = opt_i32(L, t, "max_idle", lim->max_live);
  lim->min_idle = opt_i32(L, t, "min_idle", 0);
  lim->max_concurrency = opt_i32(L, t, "max_concurrency", lim->max_live);
  lim->key_max_live = opt_i32(L, t, "key_max_live", -1);
  lim->key_max_idle = opt_i32(L, t, "key_max_idle", -1);
  lim->max_keys = opt_i32(L, t, "max_keys", 256);
  lim->members = opt_i32(L, t, "members", 64);
  lim->attempts = opt_i32(L, t, "attempts", 3);
}

/* fleet.open(name [, limits]) -> handle, created | nil, err, message */
static int lcp_fleet_open(lua_State *L) {
  size_t len;
  const char *name = luaL_checklstring(L, 1, &len);
  clientpool_fleet_limits_t lim, *lp = NULL;
  clientpool_fleet_t *f = NULL;
  lcp_fleet_box *b;
  char err[320];
  int rc;
  if (!lua_isnoneornil(L, 2)) {
    read_limits(L, 2, &lim);
    lp = &lim;
  }
  b = lua_newuserdata(L, sizeof *b);
  b->f = NULL;
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_setmetatable(L, -2);
  rc = clientpool_fleet_open(name, len, lp, &f, err, sizeof err);
  if (rc < 0) return push_fail(L, rc, err);
  b->f = f;
  lua_pushboolean(L, rc == 1);
  return 2;
}

static int lcp_fleet_remove(lua_State *L) {
  size_t len;
  const char *name = luaL_checklstring(L, 1, &len);
  char err[320];
  int rc = clientpool_fleet_remove(name, len, err, sizeof err);
  if (rc < 0) return push_fail(L, rc, err);
  lua_pushboolean(L, 1);
  return 1;
}

static int lcp_fleet_shm_name(lua_State *L) {
  size_t len;
  const char *name = luaL_checklstring(L, 1, &len);
  char buf[96];
  int n = clientpool_fleet_shm_name(name, len, buf, sizeof buf);
  if (n < 0) return push_fail(L, n, NULL);
  lua_pushlstring(L, buf, (size_t)n);
  return 1;
}

static int lcp_fleet_strerror(lua_State *L) {
  int code = (int)luaL_checkinteger(L, 1);
  lua_pushstring(L, clientpool_fleet_strerror(code));
  lua_pushstring(L, code < 0 ? err_name(code) : "ok");
  return 2;
}

/* ---- methods ----------------------------------------------------------- */

static int lcp_fleet__gc(lua_State *L) {
  lcp_fleet_box *b = luaL_checkudata(L, 1, FLEET_MT);
  clientpool_fleet_close(b->f);
  b->f = NULL;
  return 0;
}

static int lcp_fleet__tostring(lua_State *L) {
  lcp_fleet_box *b = luaL_checkudata(L, 1, FLEET_MT);
  if (b->f) lua_pushfstring(L, FLEET_MT ": %p", (void *)b->f);
  else lua_pushfstring(L, FLEET_MT ": %p (closed)", (void *)b);
  return 1;
}

static int lcp_fleet_join(lua_State *L) { return push_status(L, clientpool_fleet_join(check_fleet(L))); }
static int lcp_fleet_detach(lua_State *L) { clientpool_fleet_detach(check_fleet(L)); return 0; }
static int lcp_fleet_leave(lua_State *L) { return push_status(L, clientpool_fleet_leave(check_fleet(L))); }

static int lcp_fleet_row(lua_State *L) {
  lua_pushinteger(L, clientpool_fleet_row(check_fleet(L)));
  return 1;
}

static int push_slot(lua_State *L, int32_t s) {
  if (s < 0) return push_fail(L, s, NULL);
  lua_pushinteger(L, s);
  return 1;
}

static int lcp_fleet_key_open(lua_State *L) {
  clientpool_fleet_t *f = check_fleet(L);
  size_t len;
  const char *k = luaL_checklstring(L, 2, &len);
  return push_slot(L, clientpool_fleet_key_open(f, k, len));
}

static int lcp_fleet_key_find(lua_State *L) {
  clientpool_fleet_t *f = check_fleet(L);
  size_t len;
  const char *k = luaL_checklstring(L, 2, &len);
  return push_slot(L, clientpool_fleet_key_find(f, k, len));
}

static int lcp_fleet_key_cap(lua_State *L) {
  clientpool_fleet_t *f = check_fleet(L);
  size_t len;
  const char *k = luaL_checklstring(L, 2, &len);
  lua_Integer cap = luaL_checkinteger(L, 3);
  return push_slot(L, clientpool_fleet_key_cap(f, k, len, cap < 0 ? -1 : cap > INT32_MAX ? INT32_MAX : (int32_t)cap));
}

static int lcp_fleet_key_close(lua_State *L) {
  clientpool_fleet_t *f = check_fleet(L);
  return push_status(L, clientpool_fleet_key_close(f, (int32_t)luaL_checkinteger(L, 2)));
}

static int lcp_fleet_take(lua_State *L) {
  clientpool_fleet_t *f = check_fleet(L);
  lua_pushinteger(L, clientpool_fleet_take(f, (int32_t)luaL_checkinteger(L, 2), (int32_t)luaL_optinteger(L, 3, -1)));
  return 1;
}

static int lcp_fleet_give(lua_State *L) {
  clientpool_fleet_t *f = check_fleet(L);
  lua_pushinteger(L, clientpool_fleet_give(f, (int32_t)luaL_checkinteger(L, 2), (int32_t)luaL_optinteger(L, 3, -1)));
  return 1;
}

static int lcp_fleet_demand(lua_State *L) {
  clientpool_fleet_t *f = check_fleet(L);
  push_u64(L, clientpool_fleet_demand(f, (int32_t)luaL_checkinteger(L, 2), (int32_t)luaL_optinteger(L, 3, -1),
                                      (int32_t)luaL_checkinteger(L, 4)));
  return 1;
}

static int lcp_fleet_seq(lua_State *L) { push_u64(L, clientpool_fleet_seq(check_fleet(L))); return 1; }

static int lcp_fleet_waiting(lua_State *L) {
  lua_pushinteger(L, clientpool_fleet_waiting(check_fleet(L)));
  return 1;
}
static int lcp_fleet_poll(lua_State *L) { push_u64(L, clientpool_fleet_poll(check_fleet(L))); return 1; }
static int lcp_fleet_gates_gen(lua_State *L) { push_u64(L, clientpool_fleet_gates_gen(check_fleet(L))); return 1; }

static int lcp_fleet_shed(lua_State *L) {
  clientpool_fleet_t *f = check_fleet(L);
  lua_pushinteger(L, clientpool_fleet_shed(f, (int32_t)luaL_optinteger(L, 2, -1)));
  return 1;
}

static int lcp_fleet_scan(lua_State *L) {
  clientpool_fleet_t *f = check_fleet(L);
  lua_pushinteger(L, clientpool_fleet_scan(f, lua_toboolean(L, 2)));
  return 1;
}

/* f:pause(reason [, key [, until]]) */
static int lcp_fleet_pause(lua_State *L) {
  clientpool_fleet_t *f = check_fleet(L);
  size_t rlen, klen = 0;
  const char *reason = luaL_checklstring(L, 2, &rlen);
  const char *key = luaL_optlstring(L, 3, NULL, &klen);
  double until = luaL_optnumber(L, 4, -1);
  return push_status(L, clientpool_fleet_pause(f, key, klen, reason, rlen, until));
}

static int lcp_fleet_resume(lua_State *L) {
  clientpool_fleet_t *f = check_fleet(L);
  size_t klen = 0;
  const char *key = luaL_optlstring(L, 2, NULL, &klen);
  return push_status(L, clientpool_fleet_resume(f, key, klen));
}

/* f:set_valid(until) -> true | nil, code, msg (until < 0: none) */
static int lcp_fleet_set_valid(lua_State *L) {
  clientpool_fleet_t *f = check_fleet(L);
  return push_status(L, clientpool_fleet_set_valid(f, luaL_checknumber(L, 2)));
}

/* f:lapsed() -> boolean; f:valid_until() -> seconds | nil */
static int lcp_fleet_lapsed(lua_State *L) {
  lua_pushboolean(L, clientpool_fleet_lapsed(check_fleet(L)) == 1);
  return 1;
}

static int lcp_fleet_valid_until(lua_State *L) {
  double u = clientpool_fleet_valid_until(check_fleet(L));
  if (u < 0) lua_pushnil(L); else lua_pushnumber(L, u);
  return 1;
}

/* f:gate([slot]) -> paused, reason, until|nil */
static int lcp_fleet_gate(lua_State *L) {
  clientpool_fleet_t *f = check_fleet(L);
  char reason[CLIENTPOOL_FLEET_REASON_MAX + 1];
  double until = -1;
  int rc = clientpool_fleet_gate(f, (int32_t)luaL_optinteger(L, 2, -1), reason, sizeof reason, &until);
  if (rc < 0) return push_fail(L, rc, NULL);
  lua_pushboolean(L, rc == 1);
  if (rc != 1) return 1;
  lua_pushstring(L, reason);
  if (until >= 0) lua_pushnumber(L, until); else lua_pushnil(L);
  return 3;
}

#define SETI(name, v) (lua_pushinteger(L, (v)), lua_setfield(L, -2, name))
#define SETN(name, v) (lua_pushnumber(L, (v)), lua_setfield(L, -2, name))

static void push_limits(lua_State *L, const clientpool_fleet_limits_t *l) {
  lua_createtable(L, 0, 9);
  SETI("max_live", l->max_live);
  SETI("max_idle", l->max_idle);
  SETI("min_idle", l->min_idle);
  SETI("max_concurrency", l->max_concurrency);
  SETI("key_max_live", l->key_max_live);
  SETI("key_max_idle", l->key_max_idle);
  SETI("max_keys", l->max_keys);
  SETI("members", l->members);
  SETI("attempts", l->attempts);
}

static int lcp_fleet_limits(lua_State *L) {
  clientpool_fleet_limits_t l;
  clientpool_fleet_limits(check_fleet(L), &l);
  push_limits(L, &l);
  return 1;
}

static int lcp_fleet_update(lua_State *L) {
  clientpool_fleet_t *f = check_fleet(L);
  clientpool_fleet_limits_t lim;
  char err[320];
  int rc;
  read_limits(L, 2, &lim);
  rc = clientpool_fleet_update(f, &lim, err, sizeof err);
  if (rc < 0) return push_fail(L, rc, err);
  lua_pushboolean(L, 1);
  return 1;
}

/* f:agent() -> epoch, pid, age (age -1: vacant) */
static int lcp_fleet_agent(lua_State *L) {
  int32_t pid = 0;
  double age = -1;
  uint32_t e = clientpool_fleet_agent(check_fleet(L), &pid, &age);
  lua_pushnumber(L, (lua_Number)e);
  lua_pushinteger(L, pid);
  lua_pushnumber(L, age);
  return 3;
}

/* f:agent_claim(epoch, stale) -> the new epoch, or 0 */
static int lcp_fleet_agent_claim(lua_State *L) {
  clientpool_fleet_t *f = check_fleet(L);
  lua_pushnumber(L, (lua_Number)clientpool_fleet_agent_claim(f, (uint32_t)luaL_checknumber(L, 2),
                                                             luaL_checknumber(L, 3)));
  return 1;
}

static int lcp_fleet_agent_beat(lua_State *L) {
  clientpool_fleet_t *f = check_fleet(L);
  return push_status(L, clientpool_fleet_agent_beat(f, (uint32_t)luaL_checknumber(L, 2)));
}

/* f:agent_update(epoch, limits | nil, until | nil) -> true | nil, code, msg */
static int lcp_fleet_agent_update(lua_State *L) {
  clientpool_fleet_t *f = check_fleet(L);
  clientpool_fleet_limits_t lim;
  char err[320];
  int rc;
  uint32_t e = (uint32_t)luaL_checknumber(L, 2);
  int has_lim = !lua_isnoneornil(L, 3);
  double until = lua_isnoneornil(L, 4) ? (0.0 / 0.0) : luaL_checknumber(L, 4);
  if (has_lim) read_limits(L, 3, &lim);
  rc = clientpool_fleet_agent_update(f, e, has_lim ? &lim : NULL, until, err, sizeof err);
  if (rc < 0) return push_fail(L, rc, err);
  lua_pushboolean(L, 1);
  return 1;
}

static int lcp_fleet_agent_release(lua_State *L) {
  clientpool_fleet_t *f = check_fleet(L);
  return push_status(L, clientpool_fleet_agent_release(f, (uint32_t)luaL_checknumber(L, 2)));
}

static int lcp_fleet_count(lua_State *L) {
  clientpool_fleet_t *f = check_fleet(L);
  lua_pushinteger(L, clientpool_fleet_count(f, (int32_t)luaL_checkinteger(L, 2), (int32_t)luaL_optinteger(L, 3, -1)));
  return 1;
}

static int lcp_fleet_stats(lua_State *L) {
  clientpool_fleet_stats_t s;
  clientpool_fleet_stats(check_fleet(L), &s);
  lua_createtable(L, 0, 24);
  push_limits(L, &s.limits);
  lua_setfield(L, -2, "limits");
  SETI("live", s.live);
  SETI("idle", s.idle);
  SETI("leases", s.leases);
  SETI("refilling", s.refilling);
  SETI("demand_live", s.demand_live);
  SETI("demand_lease", s.demand_lease);
  SETI("waiting_members", s.waiting_members);
  SETI("pledged", s.pledged);
  SETI("members", s.members);
  SETI("keys", s.keys);
  SETI("rows", s.rows);
  SETI("keys_cap", s.keys_cap);
  SETI("paused", s.paused);
  SETI("repair_pending", s.repair_pending);
  push_u64(L, s.seq); lua_setfield(L, -2, "seq");
  push_u64(L, s.gates_gen); lua_setfield(L, -2, "gates_gen");
  push_u64(L, s.limits_gen); lua_setfield(L, -2, "limits_gen");
  SETN("reclaimed", s.reclaimed);
  SETN("repairs", s.repairs);
  SETN("repaired_units", s.repaired_units);
  SETN("resets", s.resets);
  SETN("joins", s.joins);
  SETN("created", s.created);
  return 1;
}

/* f:key_stats(slot) -> nil (free) | name, table */
static int lcp_fleet_key_stats(lua_State *L) {
  clientpool_fleet_t *f = check_fleet(L);
  clientpool_fleet_key_stats_t s;
  char name[CLIENTPOOL_FLEET_KEY_MAX];
  int rc = clientpool_fleet_key_stats(f, (int32_t)luaL_checkinteger(L, 2), &s, name, sizeof name);
  if (rc < 0) return push_fail(L, rc, NULL);
  if (rc == 0) { lua_pushnil(L); return 1; }
  lua_pushlstring(L, name, (size_t)s.len);
  lua_createtable(L, 0, 7);
  SETI("live", s.live);
  SETI("idle", s.idle);
  SETI("leases", s.leases);
  SETI("refilling", s.refilling);
  SETI("demand_live", s.demand_live);
  SETI("refs", s.refs);
  SETI("paused", s.paused);
  return 2;
}

/* f:member_stats(row) -> nil (free) | table */
static int lcp_fleet_member_stats(lua_State *L) {
  clientpool_fleet_t *f = check_fleet(L);
  clientpool_fleet_member_stats_t s;
  int rc = clientpool_fleet_member_stats(f, (int32_t)luaL_checkinteger(L, 2), &s);
  if (rc < 0) return push_fail(L, rc, NULL);
  if (rc == 0) { lua_pushnil(L); return 1; }
  lua_createtable(L, 0, 14);
  SETI("state", s.state);
  SETI("pid", s.pid);
  SETI("alive", s.alive);
  SETI("self", s.self);
  SETI("live", s.live);
  SETI("idle", s.idle);
  SETI("leases", s.leases);
  SETI("refilling", s.refilling);
  SETI("demand_live", s.demand_live);
  SETI("demand_lease", s.demand_lease);
  SETI("pledged", s.pledged);
  SETI("keys", s.keys);
  SETN("start", s.start);
  SETN("heartbeat_age", s.heartbeat_age);
  return 1;
}

clientpool_fleet_t *lcp_fleet_to(lua_State *L, int idx) {
  lcp_fleet_box *b = (lcp_fleet_box *)lua_touserdata(L, idx);
  int ok;
  if (!b || !lua_getmetatable(L, idx)) return NULL;
  luaL_getmetatable(L, FLEET_MT);       /* (no luaL_testudata on 5.1) */
  ok = lua_rawequal(L, -1, -2);
  lua_pop(L, 2);
  return ok ? b->f : NULL;
}

int lcp_fleet_register(lua_State *L) {
  static const luaL_Reg methods[] = {
    {"join", lcp_fleet_join}, {"leave", lcp_fleet_leave}, {"detach", lcp_fleet_detach}, {"row", lcp_fleet_row},
    {"key_open", lcp_fleet_key_open}, {"key_find", lcp_fleet_key_find}, {"key_cap", lcp_fleet_key_cap}, {"key_close", lcp_fleet_key_close},
    {"take", lcp_fleet_take}, {"give", lcp_fleet_give}, {"demand", lcp_fleet_demand},
    {"seq", lcp_fleet_seq}, {"poll", lcp_fleet_poll}, {"shed", lcp_fleet_shed}, {"scan", lcp_fleet_scan},
    {"pause", lcp_fleet_pause}, {"resume", lcp_fleet_resume}, {"gate", lcp_fleet_gate},
    {"gates_gen", lcp_fleet_gates_gen}, {"set_valid", lcp_fleet_set_valid}, {"lapsed", lcp_fleet_lapsed},
    {"valid_until", lcp_fleet_valid_until}, {"agent", lcp_fleet_agent}, {"agent_claim", lcp_fleet_agent_claim},
    {"agent_beat", lcp_fleet_agent_beat}, {"agent_update", lcp_fleet_agent_update},
    {"agent_release", lcp_fleet_agent_release}, {"limits", lcp_fleet_limits}, {"stats", lcp_fleet_stats},
    {"update", lcp_fleet_update}, {"count", lcp_fleet_count}, {"waiting", lcp_fleet_waiting},
    {"key_stats", lcp_fleet_key_stats}, {"member_stats", lcp_fleet_member_stats},
    {NULL, NULL}
  };
  static const luaL_Reg funcs[] = {
    {"open", lcp_fleet_open}, {NULL, NULL}
  };
  static const struct { const char *name; int v; } consts[] = {
    {"LIVE", CLIENTPOOL_FLEET_LIVE}, {"IDLE", CLIENTPOOL_FLEET_IDLE}, {"LEASE", CLIENTPOOL_FLEET_LEASE},
    {"FLOOR", CLIENTPOOL_FLEET_FLOOR}, {"TAKEN", CLIENTPOOL_FLEET_TAKEN}, {"REFUSED", CLIENTPOOL_FLEET_REFUSED},
    {"REFUSED_KEY", CLIENTPOOL_FLEET_REFUSED_KEY}, {"REFUSED_TURN", CLIENTPOOL_FLEET_REFUSED_TURN},
    {"NAME_MAX", CLIENTPOOL_FLEET_NAME_MAX}, {"KEY_MAX", CLIENTPOOL_FLEET_KEY_MAX},
    {"REASON_MAX", CLIENTPOOL_FLEET_REASON_MAX},
  };
  size_t i;
  lua_newtable(L);                      /* the fleet table */
  luaL_newmetatable(L, FLEET_MT);
  lua_pushvalue(L, -1);
  lcp_setfuncs(L, methods, 1);
  lua_pushvalue(L, -1);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, lcp_fleet__gc);
  lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, lcp_fleet__gc);
  lua_setfield(L, -2, "close");
#if LUA_VERSION_NUM >= 504
  lua_pushcfunction(L, lcp_fleet__gc);
  lua_setfield(L, -2, "__close");
#endif
  lua_pushcfunction(L, lcp_fleet__tostring);
  lua_setfield(L, -2, "__tostring");
  lcp_setfuncs(L, funcs, 1);            /* open carries the metatable; pops it */
  lua_pushcfunction(L, lcp_fleet_remove);
  lua_setfield(L, -2, "remove");
  lua_pushcfunction(L, lcp_fleet_shm_name);
  lua_setfield(L, -2, "shm_name");
  lua_pushcfunction(L, lcp_fleet_strerror);
  lua_setfield(L, -2, "strerror");
  for (i = 0; i < sizeof consts / sizeof consts[0]; i++) {
    lua_pushinteger(L, consts[i].v);
    lua_setfield(L, -2, consts[i].name);
  }
  lua_pushliteral(L, "clientpool.core.fleet");
  lua_setfield(L, -2, "_NAME");
  lua_setfield(L, -2, "fleet");
  return 0;
}
