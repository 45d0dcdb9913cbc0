/*
 * lfastpath.c - the common case of checkout/checkin and acquire/release in
 * C (clientpool.core's fastpath), for PUC Lua and LuaJIT with the JIT off,
 * where most of a pair was the driver's Lua (table reads, handle
 * arithmetic), not the engine.
 *
 * It stands on its own: everything it knows of the Lua driver is what the
 * driver hands it at installation (lua/clientpool/checkout.lua's
 * install_fastpath): the pool's tables, the names of the fields it reads
 * and writes (parts.lease_fields), the handle layout
 * (parts.hslots) and the Lua functions it hands the rest to. No name of the
 * driver's private fields is written here: a change of the driver's layout
 * is made in the driver alone.
 *
 * core.fastpath(engine, pool, parts) -> { checkout, checkin, acquire, release,
 *                                        lease_release, set_flags, direct
 *                                        [, acquire_direct, try_direct] }
 * parts: the driver's tables, names and functions, as in fp_parts below:
 *   kids, clients, held  the pool's tables
 *   default    the default key's name         hbase   the pool's handle base
 *   hslots     lease slots in a handle's low part (a handle is
 *              ((gen + hbase) mod 2^32) * hslots + slot)
 *   validate   whether the pool has a validate hook
 *   checkout, checkin, checkout_from, checkin_rest, pump, drain_wake,
 *   release, acquire_from, try_from, acquire_rest, try_rest
 *              the Lua functions the rest is handed to (release: the
 *              Lease.release that lease_release hands back to; the
 *              others: what acquire_direct and try_direct hand back)
 *   lease_mt   the pool's Lease metatable (one per pool: it names the pool)
 *   lease_fields { client =, sentinel = }: the lease table's fields (a
 *              name or an array index): its client, and its leak sentinel,
 *              which holds the lease's slot and generation
 *
 * These C closures do what Pool:checkout and Pool:checkin do when
 * nothing unusual happens, reading the driver's tables (their upvalues),
 * and give the rest back to it (checkin is the whole method on every Lua,
 * below; checkout on Lua 5.1 and LuaJIT answers the driver's wrapper so):
 *   checkout(pool, key) -> client, h               an idle client, done
 *                        | nil, false, k, status, record, lease, gen,
 *                          validate, idle, pending acquired: the driver goes
 *                                                  on from this grant
 *                        | (nothing)               nothing done: the driver
 *                                                  does it all
 *   checkin(pool, h, reuse)  the method itself: its argument errors, the
 *                            common case, and the rest handed to the Lua
 *                            Pool.checkin or checkin_rest with a plain call
 *                            (checkin never yields, so it needs no
 *                            continuation on Lua 5.1 either)
 *
 * acquire and release follow the same pattern for the lease form (below);
 * on Lua 5.1 and LuaJIT the driver wraps acquire in Lua, on 5.3+ it
 * installs acquire_direct and try_direct, which finish the job as the
 * direct checkout does.
 * lease_release is a lease's release method itself (the pool's leases'
 * method table holds it): it does release's common case and hands
 * anything else to the Lua Lease.release.
 *
 * On Lua 5.3 and 5.4 fastpath returns a checkout closure that finishes
 * the job itself: it raises its argument errors (at the caller's line, as
 * the Lua code does) and calls the Lua functions it is given for the rest,
 * with a continuation, so a checkout may still wait.  The pool installs it
 * and checkin as its own methods (a Lua wrapper is one call more per
 * method).  On Lua 5.1 and LuaJIT (no continuations) checkout is the one
 * above, for the driver to wrap.
 *
 * The driver installs them only for pools that read the real clock and
 * have capacity 1, no probe and no park hook; what they check each call
 * (the waiters queued, through the engine; validate) they read where the
 * Lua code does, so the two paths never disagree; whether acquire or release
 * listeners exist and a drain began, set_flags tells them (FP_ON_*): the
 * driver calls it wherever those change.
 */
#include "lbinding.h"

/* The closures' upvalues: the engine, the pool, the parts table's fields
 * named in fp_parts (same order), the field names of lease_fields
 * (fp_lease_fields: same order), then the sentinel metatable and the
 * engine's table of sentinels (lcp_push_guards). */
enum { FP_ENGINE = 1, FP_POOL, FP_KIDS, FP_CLIENTS,
       FP_DEFAULT, FP_LAYOUT, FP_HSLOTS, FP_VALIDATE, FP_LUA_CHECKOUT, FP_LUA_CHECKIN, FP_CHECKOUT_FROM,
       FP_CHECKIN_REST, FP_HELD, FP_LEASE_MT, FP_PUMP, FP_DRAIN_WAKE,
       FP_LUA_RELEASE, FP_ACQUIRE_FROM, FP_TRY_FROM, FP_ACQUIRE_REST, FP_TRY_REST,
       FP_L_CLIENT, FP_L_SENTINEL,
       FP_SENTINEL_MT, FP_GUARDS, FP_N };
static const char *const fp_parts[] = {
  "kids", "clients", "default", "hbase", "hslots", "validate",
  "checkout", "checkin", "checkout_from", "checkin_rest", "held",
  "lease_mt", "pump", "drain_wake", "release",
  "acquire_from", "try_from", "acquire_rest", "try_rest", NULL
};
static const char *const fp_lease_fields[] = { "client", "sentinel", NULL };
#define FP(i) lua_upvalueindex(FP_##i)

/* The numbers of parts, read once at installation into a userdata that
 * takes parts.hbase's upvalue: one lua_touserdata per call, not a number
 * conversion per use. */
typedef struct fp_layout {
  int64_t hslots;      /* lease slots in a handle's low part (parts.hslots, a power of 2) */
  int hbits;           /* log2(hslots): handles are split by shifts, not divisions */
  uint32_t hbase;      /* the pool's handle base (parts.hbase) */
  int validate;        /* the pool has a validate hook (parts.validate) */
  int flags;           /* FP_ON_*: what the driver tells it (set_flags) */
  int sentinel_at;     /* the lease's sentinel field as an array index (lease_fields.sentinel
                        * a number: lua_rawgeti/rawseti, one call fewer than a key), or 0 */
  /* the engine handle's box pointer (FP_ENGINE's userdata block): Lua never
   * moves a userdata's block, and each closure holds the handle as an
   * upvalue, so this stays valid as long as the closure */
  lcp_box *const *eng;
  /* the identities of the pool table, the leases' metatable and the
   * sentinels' (the upvalues FP_POOL, FP_LEASE_MT, FP_SENTINEL_MT): a
   * pointer compare per check, where lua_rawequal against an upvalue was
   * about 75 instructions on Lua 5.4.  Each closure holds the three as
   * upvalues, so no other object can have the address while it lives. */
  const void *pool, *lease_mt, *sentinel_mt;
} fp_layout;

/* What makes the common case not the common case, kept here by the driver
 * (checkout.lua's fastpath_sync calls set_flags whenever pool:on, pool:off
 * or drain changes one): a flag test per call, where a table lookup each
 * was three C API calls (about 40 ns of a lua5.4 pair for the three). */
enum {
  FP_ON_ACQUIRE = 1,   /* an acquire listener (pool:on("acquire")) */
  FP_ON_RELEASE = 2,   /* a release listener */
  FP_ON_DRAIN = 4      /* drain() began: its waiters learn of each release */
};

static const fp_layout *fp_lay(lua_State *L) {
  return (const fp_layout *)lua_touserdata(L, FP(LAYOUT));
}

/* Pushes a field name (an upvalue) as a key: t[key] = value then follows
 * with lua_rawset (the lease tables have no __newindex: a raw set is what
 * an assignment does), t[key] with lua_rawget. */
#define fp_key(L, name) lua_pushvalue(L, name)

/* Whether argument 1 is the pool (lay->pool: a table's identity) */
static int fp_is_pool(lua_State *L, const fp_layout *lay) {
  return lua_type(L, 1) == LUA_TTABLE && lua_topointer(L, 1) == lay->pool;
}

static clientpool_t *fp_engine(const fp_layout *lay) {
  return *lay->eng ? (*lay->eng)->p : NULL;
}

/* What checkout and acquire share.  The name of the key in argument 2 is
 * at index *name (2, or the default name's upvalue); its id is looked up;
 * then the engine's untimed grant of an idle client, else, unless a waiter
 * may need reaping (the engine's queue is at max_waiting: the driver's
 * reap_if_full reaps dead waiters before the engine could refuse the call
 * as full), the engine's acquire: also with waiters queued
 * (issue 17: a contended handoff took the whole Lua path, its argument
 * checks twice, before it queued).  Returns -1 when nothing was done (the
 * driver does it all), else 1 when the grant is the common case (an idle
 * client, no validate, no event pending, no acquire listener), 0 when the
 * driver must go on from it (fp_push_grant), with the name at index
 * nargs + 1 and the key's id at nargs + 2 for it.  (No client is ever parked
 * here: the driver installs the fast path only in pools without a park
 * hook, which configure cannot add.)  Its callers pass their arguments as
 * given (an absent key is none: no lua_settop in the common case, about
 * 50 instructions on Lua 5.4) and put them right (fp_args) before handing
 * a declined call on; they make room for FP_ROOM values first (the direct
 * forms of 5.3+ only for what follows a declined call: the fast one stays
 * within the LUA_MINSTACK slots every C call has). */
#define FP_ROOM 24                       /* 11 results over 8 slots, and push_sentinel's */
static int fp_acquire(lua_State *L, int nargs, const fp_layout *lay, clientpool_grant_t *g, int32_t *k,
                      clientpool_t **pp, int *name) {
  clientpool_t *p;
  int known;
  if (!fp_is_pool(L, lay)) return -1;
  *name = lua_isnoneornil(L, 2) ? FP(DEFAULT) : 2;
  lua_pushvalue(L, *name);
  lua_rawget(L, FP(KIDS));                                /* the key's id */
  *k = (int32_t)lcp_tointegerx(L, -1, &known);            /* (an id is an integer; nil is not) */
  if (!known || (p = fp_engine(lay)) == NULL) return -1;
  *pp = p;
  /* no clock read where nothing needs the time (the engine says; a validate
   * hook reads the idle time, so with one the stamps are always taken).
   * The queue is looked at only when the untimed grant declined: an idle
   * client granted at once never waits, so a full queue does not matter
   * to it (the dead waiters are reaped by the next call that could wait). */
  if (lay->validate || clientpool_acquire_untimed(p, *k, g) != CLIENTPOOL_GRANT_IDLE) {
    /* room for what follows a grant not finished here, made before the
     * engine acts (an overflow raised after it would lose the grant) */
    luaL_checkstack(L, 32, NULL);
    if (clientpool_queue_full(p)) return -1;
    clientpool_acquire(p, *k, clientpool_monotime(), g);
  }
  if (g->status != CLIENTPOOL_GRANT_IDLE || clientpool_pending(p) != 0 || g->lease >= lay->hslots ||
      (g->validate && lay->validate) || (lay->flags & FP_ON_ACQUIRE)) {
    /* the driver's layout: the nargs arguments, the name, the id */
    lua_pop(L, 1);
    lua_settop(L, nargs);
    lua_pushvalue(L, *name);
    lua_pushinteger(L, *k);
    return 0;
  }
  return 1;
}

/* The grant fp_acquire did not finish: nil, false, k, then push_grant's. */
static int fp_push_grant(lua_State *L, int32_t k, const clientpool_grant_t *g, clientpool_t *p, int sentinel) {
  lua_pushnil(L);
  lua_pushboolean(L, 0);
  lua_pushinteger(L, k);
  return 3 + lcp_push_grant(L, g, p, 0, sentinel);
}

static int fast_checkout(lua_State *L) {
  clientpool_grant_t g;
  clientpool_t *p;
  int32_t k;
  const fp_layout *lay = fp_lay(L);
  int fast, name;
#if LUA_VERSION_NUM < 503                /* (else lcp_direct_checkout did both) */
  lua_settop(L, 2);
  luaL_checkstack(L, FP_ROOM, NULL);
#endif
  fast = fp_acquire(L, 2, lay, &g, &k, &p, &name);
  if (fast < 0) return 0;
  if (fast) {
    /* the engine marks the lease a checkout's (checkin's test): where two
     * tables by lease slot, the record and the name, cost a fifth of a
     * lua5.4 pair (issue 17) */
    clientpool_lease_checkout(p, g.lease, g.lease_gen);
    lua_rawgeti(L, FP(CLIENTS), g.record);
    lua_pushinteger(L, (lua_Integer)(((int64_t)(uint32_t)(g.lease_gen + lay->hbase) << lay->hbits) + g.lease));
    return 2;
  }
  return fp_push_grant(L, k, &g, p, 0);
}

#define FP_DONE (-1)                     /* fp_checkin: done, nothing pushed */

/* The release reason for a reuse argument at index i, of type t: false
 * retires. */
static int32_t fp_reason(lua_State *L, int i, int t) {
  return t == LUA_TBOOLEAN && !lua_toboolean(L, i) ? CLIENTPOOL_BY_ERROR : -1;
}

/* Argument 2 as a checkout handle (an integer in [0, 2^53)), or -1. */
static int64_t fp_handle(lua_State *L) {
  lua_Number d;
#if LUA_VERSION_NUM >= 503
  if (lua_isinteger(L, 2)) {
    lua_Integer i = lua_tointeger(L, 2);
    return i >= 0 && i < ((lua_Integer)1 << 53) ? (int64_t)i : -1;
  }
#endif
  if (lua_type(L, 2) != LUA_TNUMBER) return -1;
  d = lua_tonumber(L, 2);
  if (!(d >= 0 && d < 9007199254740992.0) || (lua_Number)(int64_t)d != d) return -1;
  return (int64_t)d;
}

/* clientpool_release, without a clock read where nothing needs the time
 * (as fp_acquire: the stamp is the idle time a validate hook would read). */
static int fp_release(clientpool_t *p, const fp_layout *lay, int32_t l, uint32_t gen, int32_t reason) {
  int rc = lay->validate ? CLIENTPOOL_UNTIMED : clientpool_release_untimed(p, l, gen, reason);
  return rc == CLIENTPOOL_UNTIMED ? clientpool_release(p, l, gen, reason, clientpool_monotime()) : rc;
}

/* checkin of handle h (valid: fp_handle), reuse at index 3 nil or a
 * boolean (of type reuse_type): FP_DONE when done (or a no-op: nothing
 * pushed), 0 when nothing was done, else 4 (false, record, pending, key id
 * pushed: released, events pending). */
static int fp_checkin(lua_State *L, int64_t h, int reuse_type) {
  clientpool_t *p;
  const fp_layout *lay;
  int32_t l, rec, key, pending;
  uint32_t gen;
  lay = fp_lay(L);
  if (!fp_is_pool(L, lay)) return 0;
  if ((lay->flags & (FP_ON_DRAIN | FP_ON_RELEASE)) || (p = fp_engine(lay)) == NULL) return 0;
  l = (int32_t)(h & (lay->hslots - 1));
  gen = (uint32_t)(h >> lay->hbits) - lay->hbase;
  /* stale, or a lease of the acquire form (a forged handle): a no-op */
  if ((rec = clientpool_checkout_record(p, l, gen, &key)) < 0) return FP_DONE;
  if (fp_release(p, lay, l, gen, fp_reason(L, 3, reuse_type)) != 0) return FP_DONE;
  if ((pending = clientpool_pending(p)) == 0) return FP_DONE;
  lua_pushboolean(L, 0);
  lua_pushinteger(L, rec);
  lua_pushinteger(L, pending);
  lua_pushinteger(L, key);
  return 4;
}


#if LUA_VERSION_NUM < 503
/* checkin's parts for a Lua wrapper (Lua 5.1 and LuaJIT inside OpenResty,
 * where the rest may yield: a destroy's coroutine.resume yields the caller
 * there, and LuaJIT cannot yield across lua_call): true when done, false,
 * record, pending, key id when released with events pending, nothing when
 * nothing was done. */
static int fast_checkin(lua_State *L) {
  int64_t h;
  int n, reuse_type = lua_type(L, 3);
  if ((h = fp_handle(L)) < 0) return 0;   /* Lua raises */
  if (reuse_type != LUA_TNONE && reuse_type != LUA_TNIL && reuse_type != LUA_TBOOLEAN) return 0;
  if ((n = fp_checkin(L, h, reuse_type)) != FP_DONE) return n;
  lua_pushboolean(L, 1);
  return 1;
}
#endif

#if LUA_VERSION_NUM >= 503
static int fp_return(lua_State *L, int status, lua_KContext base) {
  (void)status;
  return lua_gettop(L) - (int)base;
}

/* Calls fn (an upvalue) with the n values pushed after it, returning what
 * it returns, even across a yield. */
static int fp_call(lua_State *L, int base, int n) {
  lua_callk(L, n, LUA_MULTRET, (lua_KContext)base, fp_return);
  return fp_return(L, LUA_OK, (lua_KContext)base);
}
#else
/* Lua 5.1 and LuaJIT have no continuations: a plain call, for checkin
 * alone, which never yields outside OpenResty (docs/api.md; its listeners
 * must not either); inside it the driver wraps fast_checkin instead. */
static int fp_call(lua_State *L, int base, int n) {
  lua_call(L, n, LUA_MULTRET);
  return lua_gettop(L) - base;
}
#endif

/* Nothing was done: the Lua method (upvalue fn) does it all, with the
 * nargs arguments this call got. */
/* The arguments of a call given `given` of them, as `want` (dropping what
 * the call pushed above them): for the paths off the common case. */
static void fp_args(lua_State *L, int given, int want) {
  lua_settop(L, given < want ? given : want);
  lua_settop(L, want);
}

static int fp_lua(lua_State *L, int fn, int nargs) {
  int base = lua_gettop(L), i;
  lua_pushvalue(L, fn);
  for (i = 1; i <= nargs; i++) lua_pushvalue(L, i);
  return fp_call(L, base, nargs);
}

#if LUA_VERSION_NUM >= 503

static int lcp_direct_checkout(lua_State *L) {
  int n, top, base, t, given = lua_gettop(L);
  t = lua_type(L, 2);
  if (t != LUA_TNONE && t != LUA_TNIL && t != LUA_TSTRING && lua_rawequal(L, 1, FP(POOL)))
    return luaL_error(L, "clientpool: bad argument #1 to 'checkout' (key must be a string or nil, got %s)",
                      lua_typename(L, t));
  /* (the common case pushes fewer than LUA_MINSTACK values: room is made
   * for what follows a declined one, FP_ROOM and then a call's) */
  n = fast_checkout(L);
  if (n == 2) return 2;
  luaL_checkstack(L, 32, NULL);
  if (n == 0) {
    fp_args(L, given, 2);
    return fp_lua(L, FP(LUA_CHECKOUT), 2);
  }
  top = lua_gettop(L);
  /* acquired: checkout_from(pool, key, k, name, status .. pending), the
   * call moved down over the results it copied: a waiter's Lua frames sit
   * that much lower, and its Lua 5.4 stack stays under a doubling (bench
   * B4.lua_waiter 2077 -> 797 B per waiter) */
  lua_pushvalue(L, FP(CHECKOUT_FROM));
  lua_pushvalue(L, 1);
  lua_pushvalue(L, 2);
  lua_pushvalue(L, top - 7);
  lua_pushvalue(L, 3);
  for (n = top - 6; n <= top; n++) lua_pushvalue(L, n);
  lua_rotate(L, 3, 12);
  lua_settop(L, 14);
  base = 2;
  return fp_call(L, base, 11);
}

#endif

/* checkin itself, on every Lua (it never yields: no continuation needed). */
static int lcp_direct_checkin(lua_State *L) {
  int n, top, t, given = lua_gettop(L);
  int64_t h;
  if ((h = fp_handle(L)) < 0) {
    fp_args(L, given, 3);                /* (an absent handle shows as nil) */
    return luaL_error(L, "clientpool: bad argument #1 to 'checkin' (a handle from checkout expected, got %s)",
                      lcp_tolstring(L, 2));
  }
  t = lua_type(L, 3);                    /* (none: absent, as nil) */
  if (t != LUA_TNONE && t != LUA_TNIL && t != LUA_TBOOLEAN)
    return luaL_error(L, "clientpool: bad argument #2 to 'checkin' (boolean or nil expected, got %s)",
                      lua_typename(L, t));
  n = fp_checkin(L, h, t);               /* (within LUA_MINSTACK, as checkout) */
  if (n == FP_DONE) return 0;
  luaL_checkstack(L, 32, NULL);
  if (n == 0) {
    fp_args(L, given, 3);
    return fp_lua(L, FP(LUA_CHECKIN), 3);
  }
  top = lua_gettop(L);
  /* released, events pending: checkin_rest(pool, h, rec, client, reuse, pending, k) */
  lua_pushvalue(L, FP(CHECKIN_REST));
  lua_pushvalue(L, 1);
  lua_pushvalue(L, 2);
  lua_pushvalue(L, top - 2);
  lua_rawgeti(L, FP(CLIENTS), lua_tointeger(L, top - 2));
  if (t == LUA_TNONE) lua_pushnil(L); else lua_pushvalue(L, 3);
  lua_pushvalue(L, top - 1);
  lua_pushvalue(L, top);
  return fp_call(L, top, 7);
}

/* acquire(pool, key, opts): the lease form's common case, as checkout's:
 * -> lease | nil, false, k, status, record, lease, gen, validate, idle,
 * pending, sentinel (acquired: the driver's acquire_from goes on) | nothing.
 * Only without opts (the driver checks them) and never for a pool with
 * leak_threshold (each lease records a traceback there). */
/* fast_acquire's work, once its caller set the top to 3 (opts nil) and
 * made room for FP_ROOM values. */
static int fp_lease(lua_State *L) {
  clientpool_grant_t g;
  clientpool_t *p;
  int32_t k;
  int fast, name;
  const fp_layout *lay = fp_lay(L);
  fast = fp_acquire(L, 3, lay, &g, &k, &p, &name);   /* 3: opts (nil) */
  if (fast < 0) return 0;
  if (fast) {                            /* as the driver's new_lease */
    int t;
    if (lay->sentinel_at) lua_createtable(L, 1, 1);    /* (its array slot) */
    else lua_createtable(L, 0, 2);
    t = lua_gettop(L);
    fp_key(L, FP(L_CLIENT));
    lua_rawgeti(L, FP(CLIENTS), g.record);
    lua_rawset(L, t);
    if (lay->sentinel_at) {
      lcp_push_sentinel_in(L, FP(ENGINE), FP(GUARDS), g.lease, g.lease_gen);
      lua_rawseti(L, t, lay->sentinel_at);
    } else {
      fp_key(L, FP(L_SENTINEL));
      lcp_push_sentinel_in(L, FP(ENGINE), FP(GUARDS), g.lease, g.lease_gen);
      lua_rawset(L, t);
    }
    lua_pushvalue(L, FP(LEASE_MT));
    lua_setmetatable(L, t);
    lua_pushvalue(L, t);
    lua_rawseti(L, FP(HELD), g.lease);
    return 1;
  }
  return fp_push_grant(L, k, &g, p, FP(ENGINE));   /* (a sentinel for a grant) */
}

static int fast_acquire(lua_State *L) {
  if (!lua_isnoneornil(L, 3)) return 0;
  lua_settop(L, 3);
  luaL_checkstack(L, FP_ROOM, NULL);
  return fp_lease(L);
}

/* The sentinel at index 4 (the lease's), if one of the engine's in box b,
 * else NULL: lclientpool.c's guard_at for the hot path, its metatable
 * compared by address and left at index 5 (the caller's pushes use no
 * relative index below it; a pop is about 20 instructions on Lua 5.4). */
static lcp_guard *fp_guard(lua_State *L, const fp_layout *lay, const lcp_box *b) {
  lcp_guard *s;
  if (lua_type(L, 4) != LUA_TUSERDATA || !lua_getmetatable(L, 4) || lua_topointer(L, 5) != lay->sentinel_mt)
    return NULL;
  s = (lcp_guard *)lua_touserdata(L, 4);
  return s->box == b ? s : NULL;
}

/* The common case of a lease's release (lease at 1, reuse at 2: nil or a
 * boolean): 1 when done (also for a lease already released), 0 when
 * nothing was done (not a lease of this pool's, a drain or a release
 * listener, the engine closed, ...): the Lua Lease.release does it all. */
static int fp_release_lease(lua_State *L, int reuse_type) {
  clientpool_t *p;
  lcp_guard *s;
  int32_t rc;
  const fp_layout *lay = fp_lay(L);
  lcp_box *b = *lay->eng;
  /* (its callers set the top to 2) */
  /* (a table: debug.setmetatable can give any value the leases' metatable,
   * and the lease is indexed raw below) */
  if (lua_type(L, 1) != LUA_TTABLE || !lua_getmetatable(L, 1)) return 0;   /* 3: the lease's metatable */
  if (lua_topointer(L, 3) != lay->lease_mt) return 0;
  if (lay->sentinel_at) lua_rawgeti(L, 1, lay->sentinel_at);
  else { fp_key(L, FP(L_SENTINEL)); lua_rawget(L, 1); }   /* 4: the sentinel (held here) */
  if (lua_isnil(L, 4)) return 1;                          /* released: idempotent */
  if ((lay->flags & (FP_ON_DRAIN | FP_ON_RELEASE)) || b == NULL || (p = b->p) == NULL ||
      (s = fp_guard(L, lay, b)) == NULL)
    return 0;
  if (s->lease == LCP_DISARMED) return 1;                 /* released (its field not yet cleared) */
  /* _held's entry for the slot stays: it is weak, every reader checks the
   * lease is still held, and the slot's next lease overwrites it (a lookup
   * and a store fewer per release) */
  rc = fp_release(p, lay, s->lease, s->gen, fp_reason(L, 2, reuse_type));
  /* as the driver's finish_lease: the sentinel is disarmed, and the lease
   * lets go of it, once the engine has the release (the stack holds it
   * until then) */
  if (rc == 0) s->lease = LCP_DISARMED;
  if (lay->sentinel_at) {
    lua_pushnil(L);
    lua_rawseti(L, 1, lay->sentinel_at);
  } else {
    fp_key(L, FP(L_SENTINEL));
    lua_pushnil(L);
    lua_rawset(L, 1);
  }
  if (clientpool_pending(p) > 0) {       /* release never yields: plain calls */
    lua_pushvalue(L, FP(PUMP));
    lua_pushvalue(L, FP(POOL));
    lua_call(L, 1, 0);
    if (lay->flags & FP_ON_DRAIN) {      /* a drain began meanwhile */
      lua_pushvalue(L, FP(DRAIN_WAKE));
      lua_pushvalue(L, FP(POOL));
      lua_call(L, 1, 0);
    }
  }
  fp_key(L, FP(L_CLIENT));
  lua_pushnil(L);
  lua_rawset(L, 1);
  return 1;
}

/* release(lease, reuse) -> true when done; false when nothing was done
 * (Lease.release calls it after its own checks, for a lease of a pool
 * with the fast path: pool._frel). */
static int lcp_fast_release(lua_State *L) {
  int t;
  lua_settop(L, 2);
  t = lua_type(L, 2);
  lua_pushboolean(L, (t == LUA_TNIL || t == LUA_TBOOLEAN) && fp_release_lease(L, t));
  return 1;
}

/* lease:release(reuse) itself: the pool's leases find it in their method
 * table (checkout.lua's fastpath_leases), so a release is one C call, not
 * the Lua Lease.release and then this (about 130 ns of a lua5.4 lease
 * pair).  Whatever it does not do, Lease.release (parts.release) does, its
 * checks and their errors included (raised at the caller's line: it counts
 * the levels past this C frame). */
static int lcp_lease_release(lua_State *L) {
  int t;
  /* (lease:release() has one argument: a push, where lua_settop is about
   * 50 instructions on Lua 5.4) */
  if (lua_gettop(L) == 1) lua_pushnil(L); else lua_settop(L, 2);
  t = lua_type(L, 2);
  if ((t == LUA_TNIL || t == LUA_TBOOLEAN) && fp_release_lease(L, t)) return 0;
  lua_settop(L, 2);
  lua_pushvalue(L, FP(LUA_RELEASE));
  lua_insert(L, 1);
  lua_pushboolean(L, 1);                 /* tried: not the fast path again */
  lua_call(L, 3, 0);
  return 0;
}

#if LUA_VERSION_NUM >= 503
/* acquire(pool, key, opts) (nargs 3) and try_acquire(pool, key) (nargs 2)
 * themselves, as lcp_direct_checkout: the lease of the common case; a
 * grant fast_acquire did not finish goes to from (acquire_from, try_from)
 * with the arguments the Lua wrappers pass it; anything else to rest
 * (acquire_rest, try_rest), which raises the argument errors at the
 * caller's line and does it all. */
static int fp_direct_lease(lua_State *L, int nargs, int from, int rest) {
  int n, top, first, i, pushed;
  /* the top set to 3 (opts nil) by pushes where the call has fewer
   * arguments (pool:acquire(): lua_settop is about 50 instructions on Lua
   * 5.4, a push 10) */
  top = lua_gettop(L);
  if (nargs == 2) {                      /* (try_acquire: a third argument is not opts) */
    if (top > 2) lua_settop(L, top = 2);
  } else if (top >= 3 && !lua_isnil(L, 3)) {   /* opts: the driver reads them */
    lua_settop(L, 3);
    return fp_lua(L, rest, 3);
  }
  if (top > 3) lua_settop(L, 3);
  else for (; top < 3; top++) lua_pushnil(L);
  luaL_checkstack(L, 40, NULL);          /* (FP_ROOM, then the call's 15 values) */
  n = fp_lease(L);
  if (n == 1) return 1;
  if (n == 0) return fp_lua(L, rest, nargs);
  top = lua_gettop(L);
  first = top - n + 1;                   /* nil, false, k, status .. pending[, sentinel] */
  lua_pushvalue(L, from);
  lua_pushvalue(L, 1);
  lua_pushvalue(L, 2);
  if (nargs == 3) { lua_pushnil(L); lua_pushnil(L); }   /* acquire_from's opts and drain */
  lua_pushvalue(L, first + 2);           /* k */
  lua_pushvalue(L, 4);                   /* the key's name (fp_acquire) */
  for (i = first + 3; i <= top; i++) lua_pushvalue(L, i);
  /* the call moved down over what it copied (as lcp_direct_checkout: a
   * waiter's frames sit that much lower) */
  pushed = lua_gettop(L) - top;
  lua_rotate(L, 3, pushed);
  lua_settop(L, 2 + pushed);
  return fp_call(L, 2, pushed - 1);
}

static int lcp_direct_acquire(lua_State *L) {
  return fp_direct_lease(L, 3, FP(ACQUIRE_FROM), FP(ACQUIRE_REST));
}

static int lcp_direct_try(lua_State *L) {
  return fp_direct_lease(L, 2, FP(TRY_FROM), FP(TRY_REST));
}
#endif

/* set_flags(n): the FP_ON_* flags the driver keeps (fastpath_sync). */
static int fp_set_flags(lua_State *L) {
  fp_layout *lay = (fp_layout *)lua_touserdata(L, FP(LAYOUT));
  lay->flags = (int)luaL_checkinteger(L, 1);
  return 0;
}

/* Pushes t[name] (t at index t), which must be a string: a field name the
 * driver hands over. */
static void fp_name(lua_State *L, int t, const char *what, const char *name) {
  lua_getfield(L, t, name);
  if (lua_type(L, -1) != LUA_TSTRING && lua_type(L, -1) != LUA_TNUMBER)
    luaL_error(L, "clientpool.core.fastpath: parts.%s.%s must be a field name (a string or an index)", what, name);
}

int lcp_fastpath(lua_State *L) {
  int i, parts;
  luaL_checkudata(L, 1, LCP_ENGINE_MT);
  luaL_checktype(L, 2, LUA_TTABLE);
  luaL_checktype(L, 3, LUA_TTABLE);
  lua_settop(L, 3);
  luaL_checkstack(L, 2 * FP_N + 4, NULL);   /* the upvalues, and a copy for each closure */
  for (i = 0; fp_parts[i]; i++) lua_getfield(L, 3, fp_parts[i]);
  if (lua_type(L, FP_HSLOTS + 1) != LUA_TNUMBER || lua_type(L, FP_LAYOUT + 1) != LUA_TNUMBER)
    return luaL_error(L, "clientpool.core.fastpath: parts.hslots and parts.hbase must be numbers");
  {                                      /* (the parts start at index 4) */
    fp_layout *lay = (fp_layout *)lua_newuserdata(L, sizeof *lay);
    lay->hslots = (int64_t)lua_tointeger(L, FP_HSLOTS + 1);
    for (lay->hbits = 0; lay->hbits < 31 && ((int64_t)1 << lay->hbits) < lay->hslots; lay->hbits++) {}
    if (((int64_t)1 << lay->hbits) != lay->hslots)
      return luaL_error(L, "clientpool.core.fastpath: parts.hslots must be a power of 2 up to 2^31");
    lay->hbase = (uint32_t)lua_tointeger(L, FP_LAYOUT + 1);
    lay->validate = lua_toboolean(L, FP_VALIDATE + 1);
    lay->flags = 0;
    lay->sentinel_at = 0;                /* (lease_fields is read below) */
    lay->eng = (lcp_box *const *)lua_touserdata(L, 1);
    lay->pool = lua_topointer(L, FP_POOL);
    lay->lease_mt = lua_istable(L, FP_LEASE_MT + 1) ? lua_topointer(L, FP_LEASE_MT + 1) : NULL;
    lua_replace(L, FP_LAYOUT + 1);       /* in parts.hbase's place */
  }
  lua_getfield(L, 3, "lease_fields");
  if (!lua_istable(L, -1))
    return luaL_error(L, "clientpool.core.fastpath: parts.lease_fields must be a table");
  parts = lua_gettop(L);
  for (i = 0; fp_lease_fields[i]; i++) fp_name(L, parts, "lease_fields", fp_lease_fields[i]);
  lua_remove(L, parts);
  if (lua_type(L, -1) == LUA_TNUMBER) {   /* the sentinel's field (last of fp_lease_fields) */
    lua_Number at = lua_tonumber(L, -1);
    if (at >= 1 && at <= 255 && at == (int)at)
      ((fp_layout *)lua_touserdata(L, FP_LAYOUT + 1))->sentinel_at = (int)at;
  }
  lua_remove(L, 3);                      /* 1 engine, 2 pool, 3.. the parts, then the names */
  luaL_getmetatable(L, LCP_SENTINEL_MT);
  lcp_push_guards(L, 1);
  ((fp_layout *)lua_touserdata(L, FP_LAYOUT))->sentinel_mt = lua_topointer(L, FP_SENTINEL_MT);
  lua_createtable(L, 0, 9);
  {
    static const struct { const char *name; lua_CFunction fn; } made[] = {
#if LUA_VERSION_NUM >= 503
      {"checkout", lcp_direct_checkout},
      {"acquire_direct", lcp_direct_acquire}, {"try_direct", lcp_direct_try},
#else
      {"checkout", fast_checkout}, {"checkin_parts", fast_checkin},
#endif
      {"checkin", lcp_direct_checkin},
      {"acquire", fast_acquire}, {"release", lcp_fast_release}, {"lease_release", lcp_lease_release},
      {"set_flags", fp_set_flags}, {NULL, NULL}
    };
    for (i = 0; made[i].name; i++) {
      int j;
      for (j = 1; j < FP_N; j++) lua_pushvalue(L, j);
      lua_pushcclosure(L, made[i].fn, FP_N - 1);
      lua_setfield(L, -2, made[i].name);
    }
  }
  lua_pushboolean(L, LUA_VERSION_NUM >= 503);
  lua_setfield(L, -2, "direct");
  return 1;
}
