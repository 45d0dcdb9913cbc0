/*
 * test_engine.h - the harness of the engine's C tests (spec/c/test_engine.c
 * and spec/c/test_engine_*.c): checks that abandon a failing test, pools and
 * memory a test owns, the events of a drain, engine-call wrappers that run
 * clientpool_check() after each call, and helpers that play the driver.
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

/* ---- checks, events, wrappers, helpers -------------------------------- */

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
#define ACQUIRE(p, k, now, g) w_acquire((p), (k), (now), (g), __FILE__, __LINE__)
#define WAIT_RAW(p, k, dl, now, gen) w_wait((p), (k), (dl), (now), (gen), __FILE__, __LINE__)
#define CREATED(p, r, ok, now) w_created((p), (r), (ok), (now), __FILE__, __LINE__)
#define RELEASE_RAW(p, l, gen, reason, now) w_release((p), (l), (gen), (reason), (now), __FILE__, __LINE__)
#define CLAIM(p, wh, now, g) w_claim((p), (wh).w, (wh).gen, (now), (g), __FILE__, __LINE__)
#define CANCEL(p, wh, st, now, g) w_cancel((p), (wh).w, (wh).gen, (st), (now), (g), __FILE__, __LINE__)
#define ABANDON(p, wh, now) w_abandon((p), (wh).w, (wh).gen, (now), __FILE__, __LINE__)
#define LEAK(p, h, now) w_leak((p), (h).lease, (h).gen, (now), __FILE__, __LINE__)
#define RETIRE(p, r, now) w_retire((p), (r), (now), __FILE__, __LINE__)
#define TICK(p, now) w_tick((p), (now), __FILE__, __LINE__)
#define CLOSE(p, now) w_close((p), (now), __FILE__, __LINE__)
#define KEY_OPEN(p) w_key_open((p), __FILE__, __LINE__)
#define KEY_PIN(p, k, on) w_key_pin((p), (k), (on), __FILE__, __LINE__)
#define KEY_FORGET(p, k) w_key_forget((p), (k), __FILE__, __LINE__)
#define DESTROYED(p, r, now) w_destroyed((p), (r), (now), __FILE__, __LINE__)
#define CONFIGURE(p, c, now) w_configure((p), &(c), (now), __FILE__, __LINE__)
#define KEY_CAPS(p, k, ml, mi, now) w_key_caps((p), (k), (ml), (mi), (now), __FILE__, __LINE__)
#define KEEPALIVE_DONE(p, r, ok, now) w_keepalive_done((p), (r), (ok), (now), __FILE__, __LINE__)
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
int w_acquire(clientpool_t *p, int32_t k, double now, clientpool_grant_t *g,
                     const char *file, int line);
int32_t w_wait(clientpool_t *p, int32_t k, double deadline, double now, uint32_t *gen,
                      const char *file, int line);
int w_created(clientpool_t *p, int32_t r, int32_t ok, double now, const char *file, int line);
int w_release(clientpool_t *p, int32_t l, uint32_t gen, int32_t reason, double now,
                     const char *file, int line);
int w_claim(clientpool_t *p, int32_t w, uint32_t gen, double now, clientpool_grant_t *g,
                   const char *file, int line);
int w_cancel(clientpool_t *p, int32_t w, uint32_t gen, int32_t st, double now,
                    clientpool_grant_t *g, const char *file, int line);
int w_abandon(clientpool_t *p, int32_t w, uint32_t gen, double now, const char *file, int line);
int w_leak(clientpool_t *p, int32_t l, uint32_t gen, double now, const char *file, int line);
int w_retire(clientpool_t *p, int32_t r, double now, const char *file, int line);
void w_tick(clientpool_t *p, double now, const char *file, int line);
void w_close(clientpool_t *p, double now, const char *file, int line);
int32_t w_key_open(clientpool_t *p, const char *file, int line);
int w_key_pin(clientpool_t *p, int32_t k, int32_t on, const char *file, int line);
int w_key_forget(clientpool_t *p, int32_t k, const char *file, int line);
int w_destroyed(clientpool_t *p, int32_t r, double now, const char *file, int line);
int w_configure(clientpool_t *p, const clientpool_config_t *c, double now, const char *file, int line);
int w_key_caps(clientpool_t *p, int32_t k, int32_t ml, int32_t mi, double now, const char *file, int line);
int w_keepalive_done(clientpool_t *p, int32_t r, int32_t ok, double now, const char *file, int line);
hold_t hold_of(const clientpool_grant_t *g);
clientpool_config_t cfg_base(void);
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
