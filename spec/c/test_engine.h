/*
 * test_engine.h - the harness of the engine's C tests (spec/c/test_engine.c
 * and spec/c/test_engine_*.c): checks that abandon a failing test, pools and
 * memory a test owns, the events of a drain, engine calls that run
 * clientpool_check() after each call (CALLED), and helpers that play the driver.
 * The harness itself is in test_engine.c, with the runner.
 */
#ifndef CLIENTPOOL_TEST_ENGINE_H
#define CLIENTPOOL_TEST_ENGINE_H

#include "whitebox.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A test, and the table each test file exports (NULL-terminated). */
typedef struct { const char *name; void (*fn)(void); } test_t;
#define T(f) { #f, f }

extern const test_t tests_basics[];   /* test_engine_basics.c */
extern const test_t tests_keys[];   /* test_engine_keys.c */
extern const test_t tests_waiters[];   /* test_engine_waiters.c */
extern const test_t tests_lifecycle[];   /* test_engine_lifecycle.c */
extern const test_t tests_scale[];   /* test_engine_scale.c */
extern const test_t tests_regress[];   /* test_engine_regress.c */
extern const test_t tests_faults[];   /* test_engine_faults.c */
extern const test_t tests_cap[];   /* test_engine_cap.c */
extern const test_t tests_live[];   /* test_engine_live.c */
extern const test_t tests_fleet[];   /* test_engine_fleet.c */
extern const test_t tests_untimed[];   /* test_engine_untimed.c */

/* ---- checks, events, engine calls, helpers ---------------------------- */

#define OWN_MAX 32   /* pools and blocks a test may own */

#define CHECK_AT(e, file, line) \
  do { if (!(e)) fail_at((file), (line), "CHECK(%s)", #e); } while (0)

#define CHECK(e) CHECK_AT(e, __FILE__, __LINE__)

/* a check whose failure message explains what was expected (regressions) */
#define CHECK_MSG(e, msg) \
  do { if (!(e)) fail_at(__FILE__, __LINE__, "CHECK(%s)\n  %s", #e, (msg)); } while (0)

#define CHECK_EQ(a, b) \
  do { long chk_a_ = (long)(a), chk_b_ = (long)(b); \
       if (chk_a_ != chk_b_) fail_at(__FILE__, __LINE__, "CHECK(%s == %s): %ld != %ld", \
                                     #a, #b, chk_a_, chk_b_); } while (0)

#define CHECK_NEAR(a, b) \
  do { double chk_x_ = (double)(a), chk_y_ = (double)(b); \
       if (!(fabs(chk_x_ - chk_y_) <= 1e-9)) fail_at(__FILE__, __LINE__, \
           "CHECK(%s ~= %s): %.17g != %.17g", #a, #b, chk_x_, chk_y_); } while (0)

#define CHECK_STATUS(got, want) \
  do { int chk_s_ = (got), chk_w_ = (want); \
       if (chk_s_ != chk_w_) fail_at(__FILE__, __LINE__, "CHECK(%s == %s): got %s (%d)", \
                                     #got, #want, status_name(chk_s_), chk_s_); } while (0)

#define EVCAP 2048
#define EVTYPES 16

#define EXPECT_DESTROY(rec, reason) \
  do { if (n_destroy((rec), (reason)) != 1) fail_at(__FILE__, __LINE__, \
       "expected one EV_DESTROY of record %d with reason %d, got %d (destroys this drain: %ld)", \
       (int)(rec), (int)(reason), n_destroy((rec), (reason)), n_events(CLIENTPOOL_EV_DESTROY)); } while (0)

#define EXPECT_WAKE(wh) \
  do { if (n_wake((wh).w, (wh).gen) != 1) fail_at(__FILE__, __LINE__, \
       "expected one EV_WAKE of waiter %d/%u, got %d", (int)(wh).w, (unsigned)(wh).gen, \
       n_wake((wh).w, (wh).gen)); } while (0)

#define EXPECT_NO_WAKE(wh) CHECK(n_wake((wh).w, (wh).gen) == 0)
#define INVARIANTS(p) check_full((p), __FILE__, __LINE__)
/* An engine call, then after() (clientpool_check() and the auto-destroys)
 * at the test's line; its result is the call's. */
#define CALLED_AT(p, file, line, call) after_call((p), (file), (line), #call, (long)(call))
#define CALLED(p, call) CALLED_AT(p, __FILE__, __LINE__, call)
#define CALLED_VOID(p, call) ((call), after((p), __FILE__, __LINE__, #call))
#define ACQUIRE(p, k, now, g) CALLED(p, clientpool_acquire((p), (k), (now), (g)))
#define WAIT_RAW(p, k, dl, now, gen) (int32_t)CALLED(p, clientpool_wait((p), (k), (dl), (now), (gen)))
#define CREATED(p, r, ok, now) CALLED(p, clientpool_created((p), (r), (ok), (now)))
#define RELEASE_RAW(p, l, gen, reason, now) CALLED(p, clientpool_release((p), (l), (gen), (reason), (now)))
#define CLAIM(p, wh, now, g) CALLED(p, clientpool_claim((p), (wh).w, (wh).gen, (now), (g)))
#define CANCEL(p, wh, st, now, g) CALLED(p, clientpool_cancel((p), (wh).w, (wh).gen, (st), (now), (g)))
#define ABANDON(p, wh, now) CALLED(p, clientpool_abandon((p), (wh).w, (wh).gen, (now)))
#define LEAK(p, h, now) CALLED(p, clientpool_leak((p), (h).lease, (h).gen, (now)))
#define RETIRE(p, r, now) CALLED(p, clientpool_retire((p), (r), (now)))
#define TICK(p, now) CALLED_VOID(p, clientpool_tick((p), (now)))
#define CLOSE(p, now) CALLED_VOID(p, clientpool_close((p), (now)))
#define KEY_OPEN(p) (int32_t)CALLED(p, clientpool_key_open(p))
#define KEY_PIN(p, k, on) CALLED(p, clientpool_key_pin((p), (k), (on)))
#define KEY_FORGET(p, k) CALLED(p, clientpool_key_forget((p), (k)))
#define DESTROYED(p, r, now) CALLED(p, clientpool_destroyed((p), (r), (now)))
#define CONFIGURE(p, c, now) CALLED(p, clientpool_configure((p), &(c), (now)))
#define KEY_CAPS(p, k, ml, mi, now) CALLED(p, clientpool_key_caps((p), (k), (ml), (mi), (now)))
#define KEEPALIVE_DONE(p, r, ok, now) CALLED(p, clientpool_keepalive_done((p), (r), (ok), (now)))
typedef struct { int32_t lease; uint32_t gen; int32_t record; int32_t key; } hold_t;
typedef struct { int32_t w; uint32_t gen; } waiter_h;
#define POOL(c) pool_at(&(c), __FILE__, __LINE__)
#define PKEY(p) key_at((p), 1, __FILE__, __LINE__)   /* pinned: never forgotten */
#define UKEY(p) key_at((p), 0, __FILE__, __LINE__)   /* forgotten once empty */
#define NEW_LEASE(p, k, now) lease_new_at((p), (k), (now), __FILE__, __LINE__)
#define WARM_RECORD(p, k, now) warm_record_at((p), (k), (now), __FILE__, __LINE__)
#define REUSE(p, k, now, g) lease_idle_at((p), (k), (now), (g), __FILE__, __LINE__)
#define RELEASE(p, h, now) release_at((p), (h), -1, (now), __FILE__, __LINE__)
#define RELEASE_AS(p, h, reason, now) release_at((p), (h), (reason), (now), __FILE__, __LINE__)
#define WAIT(p, k, deadline, now) wait_at((p), (k), (deadline), (now), __FILE__, __LINE__)
#define WAIT_PRIO(p, k, prio, now) wait_prio_at((p), (k), (prio), (now), __FILE__, __LINE__)
#define MUST_WAIT(p, k, now) must_wait_at((p), (k), (now), __FILE__, __LINE__)
#define KSTATS(p, k) kstats_at((p), (k), __FILE__, __LINE__)
#define CHECK_SUMS(p, keys, n) check_sums_at((p), (keys), (n), __FILE__, __LINE__)

/* ---- the harness's state (test_engine.c) ---------------------------- */
extern jmp_buf g_jump;
extern const char *g_test;
extern int g_failed;
extern char g_ctx[200];
extern long g_stride;
extern long g_calls;
extern clientpool_t *g_pools[OWN_MAX];
extern void *g_mem[OWN_MAX];
extern uint64_t g_rng;
extern clientpool_event_t g_ev[EVCAP];
extern int g_nev;
extern long g_evcount[EVTYPES];
extern long g_evby[CLIENTPOOL_BY_COUNT];
extern int g_auto_destroy;

/* ---- the harness's functions (test_engine.c) ------------------------ */
void fail_at(const char *file, int line, const char *fmt, ...);
void own_pool(clientpool_t *p);
void free_pool(clientpool_t *p);
void *own_mem(size_t n);
void free_owned(void);
void rng_seed(uint64_t s);
uint32_t rng_u32(void);
int rng_int(int n);
double rng_unit(void);
const char *status_name(int s);
void drain(clientpool_t *p);
long n_events(int type);
int find_ev(int type, int32_t a, int32_t b, int32_t c);
int count_ev(int type, int32_t a, int32_t b);
int n_destroy(int32_t rec, int32_t reason);
int n_wake(int32_t w, uint32_t gen);
int n_key_free(int32_t k);
int n_leak(int32_t l, uint32_t gen);
double last_timer(void);
void after(clientpool_t *p, const char *file, int line, const char *what);
void check_full(clientpool_t *p, const char *file, int line);
long after_call(clientpool_t *p, const char *file, int line, const char *what, long rc);
hold_t hold_of(const clientpool_grant_t *g);
clientpool_config_t cfg_base(void);
clientpool_config_t cfg_caps(int32_t max_live, int32_t max_idle);
clientpool_t *pool_at(const clientpool_config_t *c, const char *file, int line);
int32_t key_at(clientpool_t *p, int pinned, const char *file, int line);
hold_t lease_new_at(clientpool_t *p, int32_t k, double now, const char *file, int line);
int32_t warm_record_at(clientpool_t *p, int32_t k, double now, const char *file, int line);
hold_t lease_idle_at(clientpool_t *p, int32_t k, double now, clientpool_grant_t *out,
                            const char *file, int line);
void release_at(clientpool_t *p, hold_t h, int32_t reason, double now, const char *file, int line);
waiter_h wait_at(clientpool_t *p, int32_t k, double deadline, double now, const char *file, int line);
waiter_h wait_prio_at(clientpool_t *p, int32_t k, int32_t prio, double now, const char *file, int line);
void must_wait_at(clientpool_t *p, int32_t k, double now, const char *file, int line);
clientpool_stats_t pstats(const clientpool_t *p);
clientpool_stats_t kstats_at(const clientpool_t *p, int32_t k, const char *file, int line);
int stats_equal(const clientpool_stats_t *a, const clientpool_stats_t *b);
void check_sums_at(const clientpool_t *p, const int32_t *keys, int n, const char *file, int line);

#endif
