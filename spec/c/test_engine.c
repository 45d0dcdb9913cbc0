/*
 * test_engine.c - C tests of the clientpool engine (csrc/engine.c).
 *
 * The engine is a pure, clock-injected state machine: every test passes the
 * time in explicitly and drains the engine's events itself, playing the part
 * of the driver.
 *
 * Build and run (also built by `make test-c` and, under ASan/UBSan, by
 * `make test-c-asan`):
 *
 *   gcc -std=c11 -Wall -Wextra -Werror -pedantic -Wshadow -Wmissing-prototypes \
 *       -Wstrict-prototypes -O1 -g -Icsrc spec/c/test_engine.c spec/c/whitebox.c \
 *       csrc/clock.c -lm -o build/test_engine && ./build/test_engine
 *
 *   ./build/test_engine [substring]   runs only the tests whose name contains it
 *   CLIENTPOOL_FUZZ_SEED=n            changes the seed of the randomized test
 *
 * Harness.  Each test is a function.  A failing CHECK prints file:line and
 * the expression, marks the test failed and abandons it (longjmp back to the
 * runner, which frees the pools and memory the test registered), and the
 * next test runs.  The program ends by printing one line `N passed, N
 * failed` and exits non-zero if any test failed.
 *
 * Every mutating engine call goes through a wrapper (ACQUIRE, RELEASE_RAW,
 * TICK, ...) that runs clientpool_check() right after the call and fails the
 * test if an invariant is broken.  The only exception is the scale test,
 * where the O(pool size) checker runs every 1000 calls and at each phase
 * boundary (running it after each of ~300k calls on a 100k-record pool would
 * take minutes).
 *
 * Section 19 holds regression tests for engine bugs found while this suite
 * was written or by the fuzzer (see the comment above each).  A test for a
 * bug that is not fixed yet is named KNOWN_BUG_* and fails with a message
 * that says what was expected and what happened.
 *
 * The engine is linked through spec/c/whitebox.c (csrc/engine.c unchanged,
 * plus allocation-failure injection and internal views), which sections 21
 * and 22 use.
 *
 * Sections:
 *   harness - events - engine-call wrappers - helpers
 *   1 config            8 FIFO and cross-key order  14 close
 *   2 lazy creation     9 waiter deadlines/cancel   15 time
 *   3 reuse, validate  10 abandon                   16 stats identities
 *   4 idle timeout     11 release                   17 scale
 *   5 lifetime         12 leak, leak_threshold      18 randomized model test
 *   6 max_idle         13 retire                    19 regressions (engine bugs)
 *   7 keys, caps, max_keys, max_concurrency, max_waiting (7a-7d)
 *  20 gates and probe, pin modes, retire_before, warm-floor edges, queries,
 *     shared records (capacity > 1)
 *  21 out of memory     22 clientpool_check catches corruption
 *
 * The model-based fuzzer (spec/c/fuzz_engine.c against spec/c/model.c, `make
 * fuzz`) covers the features this suite's randomized test predates:
 * capacity > 1, pause/resume/probe, pause_fail, the warm floor and
 * clientpool_retire_before.
 */
#include "whitebox.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __GLIBC__
#include <malloc.h>   /* mallinfo2: t_idle_record_bytes */
#endif

/* ===================================================================== */
/* harness                                                               */
/* ===================================================================== */

static jmp_buf g_jump;
static const char *g_test = "";
static int g_failed;
static char g_ctx[200];          /* context printed with a failure (fuzz seed, step) */
static long g_stride = 1;        /* run clientpool_check every g_stride calls */
static long g_calls;

#define OWN_MAX 32
static clientpool_t *g_pools[OWN_MAX];
static void *g_mem[OWN_MAX];

static void fail_at(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  printf("FAIL %s\n  %s:%d: ", g_test, file, line);
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf("\n");
  if (g_ctx[0]) printf("  (%s)\n", g_ctx);
  fflush(stdout);
  g_failed = 1;
  longjmp(g_jump, 1);
}

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

static void own_pool(clientpool_t *p) {
  int i;
  for (i = 0; i < OWN_MAX; i++) if (!g_pools[i]) { g_pools[i] = p; return; }
  abort();
}

static void free_pool(clientpool_t *p) {   /* frees an owned pool before the test ends */
  int i;
  for (i = 0; i < OWN_MAX; i++) if (g_pools[i] == p) g_pools[i] = NULL;
  clientpool_free(p);
}

static void *own_mem(size_t n) {
  int i;
  void *m = calloc(1, n);
  if (!m) abort();
  for (i = 0; i < OWN_MAX; i++) if (!g_mem[i]) { g_mem[i] = m; return m; }
  abort();
}

static void free_owned(void) {
  int i;
  for (i = 0; i < OWN_MAX; i++) {
    clientpool_free(g_pools[i]);
    free(g_mem[i]);
    g_pools[i] = NULL;
    g_mem[i] = NULL;
  }
}

/* deterministic PRNG for the tests (xorshift64*) */
static uint64_t g_rng = 1;
static void rng_seed(uint64_t s) { g_rng = s ? s : 0x9E3779B97F4A7C15ULL; }
static uint32_t rng_u32(void) {
  uint64_t x = g_rng;
  x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
  g_rng = x;
  return (uint32_t)((x * 2685821657736338717ULL) >> 32);
}
static int rng_int(int n) { return (int)(rng_u32() % (uint32_t)n); }
static double rng_unit(void) { return (double)rng_u32() / 4294967296.0; }

static const char *status_name(int s) {
  switch (s) {
  case CLIENTPOOL_GRANT_IDLE: return "GRANT_IDLE";
  case CLIENTPOOL_GRANT_CREATE: return "GRANT_CREATE";
  case CLIENTPOOL_MUST_WAIT: return "MUST_WAIT";
  case CLIENTPOOL_PENDING: return "PENDING";
  case CLIENTPOOL_FULL: return "FULL";
  case CLIENTPOOL_CLOSED: return "CLOSED";
  case CLIENTPOOL_TIMEOUT: return "TIMEOUT";
  case CLIENTPOOL_CANCELLED: return "CANCELLED";
  case CLIENTPOOL_STALE: return "STALE";
  case CLIENTPOOL_PAUSED: return "PAUSED";
  case CLIENTPOOL_BACKOFF: return "BACKOFF";
  default: return "?";
  }
}

#define CHECK_STATUS(got, want) \
  do { int chk_s_ = (got), chk_w_ = (want); \
       if (chk_s_ != chk_w_) fail_at(__FILE__, __LINE__, "CHECK(%s == %s): got %s (%d)", \
                                     #got, #want, status_name(chk_s_), chk_s_); } while (0)

/* ===================================================================== */
/* events: drain the queue into g_ev and ask questions about it           */
/* ===================================================================== */

#define EVCAP 2048
static clientpool_event_t g_ev[EVCAP];
static int g_nev;
#define EVTYPES 16
static long g_evcount[EVTYPES];      /* by type, this drain */
static long g_evby[CLIENTPOOL_BY_COUNT];   /* DESTROY by reason, this drain */

static void drain(clientpool_t *p) {
  clientpool_event_t e;
  g_nev = 0;
  memset(g_evcount, 0, sizeof g_evcount);
  memset(g_evby, 0, sizeof g_evby);
  while (clientpool_next_event(p, &e) != CLIENTPOOL_EV_NONE) {
    if (e.type >= 0 && e.type < EVTYPES) g_evcount[e.type]++;
    if (e.type == CLIENTPOOL_EV_DESTROY && e.b >= 0 && e.b < CLIENTPOOL_BY_COUNT) g_evby[e.b]++;
    if (g_nev < EVCAP) g_ev[g_nev++] = e;
  }
}

static long n_events(int type) { return g_evcount[type]; }

/* index of the first event matching, or -1; a field < 0 (or gen ~0) matches anything */
static int find_ev(int type, int32_t a, int32_t b, int32_t c) {
  int i;
  for (i = 0; i < g_nev; i++) {
    const clientpool_event_t *e = &g_ev[i];
    if (e->type == type && (a < 0 || e->a == a) && (b < 0 || e->b == b) && (c < 0 || e->c == c))
      return i;
  }
  return -1;
}

static int count_ev(int type, int32_t a, int32_t b) {
  int i, n = 0;
  for (i = 0; i < g_nev; i++)
    if (g_ev[i].type == type && (a < 0 || g_ev[i].a == a) && (b < 0 || g_ev[i].b == b)) n++;
  return n;
}

static int n_destroy(int32_t rec, int32_t reason) { return count_ev(CLIENTPOOL_EV_DESTROY, rec, reason); }
static int n_wake(int32_t w, uint32_t gen) { return count_ev(CLIENTPOOL_EV_WAKE, w, (int32_t)gen); }
static int n_key_free(int32_t k) { return count_ev(CLIENTPOOL_EV_KEY_FREE, k, -1); }
static int n_leak(int32_t l, uint32_t gen) { return count_ev(CLIENTPOOL_EV_LEAK, l, (int32_t)gen); }

static double last_timer(void) {   /* t of the last EV_TIMER of this drain, or -1 */
  int i;
  for (i = g_nev - 1; i >= 0; i--) if (g_ev[i].type == CLIENTPOOL_EV_TIMER) return g_ev[i].t;
  return -1;
}

#define EXPECT_DESTROY(rec, reason) \
  do { if (n_destroy((rec), (reason)) != 1) fail_at(__FILE__, __LINE__, \
       "expected one EV_DESTROY of record %d with reason %d, got %d (destroys this drain: %ld)", \
       (int)(rec), (int)(reason), n_destroy((rec), (reason)), n_events(CLIENTPOOL_EV_DESTROY)); } while (0)
#define EXPECT_WAKE(wh) \
  do { if (n_wake((wh).w, (wh).gen) != 1) fail_at(__FILE__, __LINE__, \
       "expected one EV_WAKE of waiter %d/%u, got %d", (int)(wh).w, (unsigned)(wh).gen, \
       n_wake((wh).w, (wh).gen)); } while (0)
#define EXPECT_NO_WAKE(wh) CHECK(n_wake((wh).w, (wh).gen) == 0)

/* ===================================================================== */
/* engine-call wrappers: each runs clientpool_check() after the call      */
/* ===================================================================== */

/* The driver of most tests has no destroy hook: it reports every destroy
 * done at once (clientpool_destroyed), right after the call that started
 * it.  Tests of the closing state itself turn this off (g_auto_destroy = 0)
 * and report destroys when they choose. */
static int g_auto_destroy = 1;

static void after(clientpool_t *p, const char *file, int line, const char *what) {
  char buf[512];
  int32_t closing[64], n = 0, i;
  int checked = !(g_stride > 1 && ++g_calls % g_stride != 0);
  buf[0] = 0;
  if (checked && clientpool_check(p, buf, sizeof buf) != 0)
    fail_at(file, line, "clientpool_check after %s: %s", what, buf);
  if (!g_auto_destroy) return;
  do {
    n = wb_closing(p, closing, 64);
    for (i = 0; i < n && i < 64; i++)
      if (clientpool_destroyed(p, closing[i], -1) != 0)
        fail_at(file, line, "clientpool_destroyed(%d) after %s failed", (int)closing[i], what);
  } while (n > 64);
  if (n > 0 && checked && clientpool_check(p, buf, sizeof buf) != 0)
    fail_at(file, line, "clientpool_check after %s and its destroys: %s", what, buf);
}

static void check_full(clientpool_t *p, const char *file, int line) {
  long s = g_stride;
  g_stride = 1;
  after(p, file, line, "(explicit check)");
  g_stride = s;
}
#define INVARIANTS(p) check_full((p), __FILE__, __LINE__)

static int w_acquire(clientpool_t *p, int32_t k, double now, clientpool_grant_t *g,
                     const char *file, int line) {
  int rc = clientpool_acquire(p, k, now, g);
  after(p, file, line, "clientpool_acquire");
  return rc;
}
static int32_t w_wait(clientpool_t *p, int32_t k, double deadline, double now, uint32_t *gen,
                      const char *file, int line) {
  int32_t rc = clientpool_wait(p, k, deadline, now, gen);
  after(p, file, line, "clientpool_wait");
  return rc;
}
static int w_created(clientpool_t *p, int32_t r, int32_t ok, double now, const char *file, int line) {
  int rc = clientpool_created(p, r, ok, now);
  after(p, file, line, "clientpool_created");
  return rc;
}
static int w_release(clientpool_t *p, int32_t l, uint32_t gen, int32_t reason, double now,
                     const char *file, int line) {
  int rc = clientpool_release(p, l, gen, reason, now);
  after(p, file, line, "clientpool_release");
  return rc;
}
static int w_claim(clientpool_t *p, int32_t w, uint32_t gen, double now, clientpool_grant_t *g,
                   const char *file, int line) {
  int rc = clientpool_claim(p, w, gen, now, g);
  after(p, file, line, "clientpool_claim");
  return rc;
}
static int w_cancel(clientpool_t *p, int32_t w, uint32_t gen, int32_t st, double now,
                    clientpool_grant_t *g, const char *file, int line) {
  int rc = clientpool_cancel(p, w, gen, st, now, g);
  after(p, file, line, "clientpool_cancel");
  return rc;
}
static int w_abandon(clientpool_t *p, int32_t w, uint32_t gen, double now, const char *file, int line) {
  int rc = clientpool_abandon(p, w, gen, now);
  after(p, file, line, "clientpool_abandon");
  return rc;
}
static int w_leak(clientpool_t *p, int32_t l, uint32_t gen, double now, const char *file, int line) {
  int rc = clientpool_leak(p, l, gen, now);
  after(p, file, line, "clientpool_leak");
  return rc;
}
static int w_retire(clientpool_t *p, int32_t r, double now, const char *file, int line) {
  int rc = clientpool_retire(p, r, now);
  after(p, file, line, "clientpool_retire");
  return rc;
}
static void w_tick(clientpool_t *p, double now, const char *file, int line) {
  clientpool_tick(p, now);
  after(p, file, line, "clientpool_tick");
}
static void w_close(clientpool_t *p, double now, const char *file, int line) {
  clientpool_close(p, now);
  after(p, file, line, "clientpool_close");
}
static int32_t w_key_open(clientpool_t *p, const char *file, int line) {
  int32_t k = clientpool_key_open(p);
  after(p, file, line, "clientpool_key_open");
  return k;
}
static int w_key_pin(clientpool_t *p, int32_t k, int32_t on, const char *file, int line) {
  int rc = clientpool_key_pin(p, k, on);
  after(p, file, line, "clientpool_key_pin");
  return rc;
}
static int w_key_forget(clientpool_t *p, int32_t k, const char *file, int line) {
  int rc = clientpool_key_forget(p, k);
  after(p, file, line, "clientpool_key_forget");
  return rc;
}

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

static int w_destroyed(clientpool_t *p, int32_t r, double now, const char *file, int line) {
  int rc = clientpool_destroyed(p, r, now);
  after(p, file, line, "clientpool_destroyed");
  return rc;
}
#define DESTROYED(p, r, now) w_destroyed((p), (r), (now), __FILE__, __LINE__)

static int w_configure(clientpool_t *p, const clientpool_config_t *c, double now, const char *file, int line) {
  int rc = clientpool_configure(p, c, now);
  after(p, file, line, "clientpool_configure");
  return rc;
}
#define CONFIGURE(p, c, now) w_configure((p), &(c), (now), __FILE__, __LINE__)


static int w_key_caps(clientpool_t *p, int32_t k, int32_t ml, int32_t mi, double now, const char *file, int line) {
  int rc = clientpool_key_caps(p, k, ml, mi, now);
  after(p, file, line, "clientpool_key_caps");
  return rc;
}
#define KEY_CAPS(p, k, ml, mi, now) w_key_caps((p), (k), (ml), (mi), (now), __FILE__, __LINE__)

static int w_keepalive_done(clientpool_t *p, int32_t r, int32_t ok, double now, const char *file, int line) {
  int rc = clientpool_keepalive_done(p, r, ok, now);
  after(p, file, line, "clientpool_keepalive_done");
  return rc;
}
#define KEEPALIVE_DONE(p, r, ok, now) w_keepalive_done((p), (r), (ok), (now), __FILE__, __LINE__)

/* ===================================================================== */
/* helpers                                                               */
/* ===================================================================== */

typedef struct { int32_t lease; uint32_t gen; int32_t record; int32_t key; } hold_t;
typedef struct { int32_t w; uint32_t gen; } waiter_h;

static hold_t hold_of(const clientpool_grant_t *g) {
  hold_t h;
  h.lease = g->lease; h.gen = g->lease_gen; h.record = g->record; h.key = g->key;
  return h;
}

static clientpool_config_t cfg_base(void) {
  clientpool_config_t c;
  memset(&c, 0, sizeof c);
  c.min_idle = 0;
  c.max_idle = 4;
  c.max_live = 4;
  c.max_concurrency = 4;
  c.max_waiting = 8;
  c.capacity = 1;
  c.key_max_live = -1;
  c.key_max_idle = -1;
  c.max_keys = -1;
  c.idle_timeout = -1;
  c.max_lifetime = -1;
  c.lifetime_jitter = 0;
  c.validate_after_idle = -1;
  c.leak_threshold = -1;
  c.create_backoff = c.create_backoff_max = -1;
  c.keepalive = -1;
  c.seed = 1;
  return c;
}

static clientpool_t *pool_at(const clientpool_config_t *c, const char *file, int line) {
  clientpool_t *p = NULL;
  int rc = clientpool_new(c, &p);
  if (rc != CLIENTPOOL_OK || !p) fail_at(file, line, "clientpool_new failed: %d", rc);
  own_pool(p);
  after(p, file, line, "clientpool_new");
  return p;
}
#define POOL(c) pool_at(&(c), __FILE__, __LINE__)

static int32_t key_at(clientpool_t *p, int pinned, const char *file, int line) {
  int32_t k = w_key_open(p, file, line);
  if (k < 0) fail_at(file, line, "clientpool_key_open failed: %d", (int)k);
  if (pinned && w_key_pin(p, k, 1, file, line) != 0) fail_at(file, line, "key_pin failed");
  return k;
}
#define PKEY(p) key_at((p), 1, __FILE__, __LINE__)   /* pinned: never forgotten */
#define UKEY(p) key_at((p), 0, __FILE__, __LINE__)   /* forgotten once empty */

/* an acquire that must reserve, followed by a successful create */
static hold_t lease_new_at(clientpool_t *p, int32_t k, double now, const char *file, int line) {
  clientpool_grant_t g;
  int st = w_acquire(p, k, now, &g, file, line);
  if (st != CLIENTPOOL_GRANT_CREATE)
    fail_at(file, line, "acquire(key %d) gave %s, expected GRANT_CREATE", (int)k, status_name(st));
  CHECK_AT(g.record >= 0 && g.lease >= 0 && g.key == k, file, line);
  if (w_created(p, g.record, 1, now, file, line) != 0) fail_at(file, line, "created(ok) failed");
  return hold_of(&g);
}
#define NEW_LEASE(p, k, now) lease_new_at((p), (k), (now), __FILE__, __LINE__)

/* k made the warm key, the floor on, and the record its refill reserves
 * created at `now` (idle from then on); returns the record */
static int32_t warm_record_at(clientpool_t *p, int32_t k, double now, const char *file, int line) {
  int32_t r, kk = -1;
  if (w_key_pin(p, k, 2, file, line) != 0) fail_at(file, line, "key_pin(%d, 2) failed", (int)k);
  clientpool_floor(p, 1, now);
  r = clientpool_refill(p, now, &kk);
  CHECK_AT(r >= 0 && kk == k, file, line);
  if (w_created(p, r, 1, now, file, line) != 0) fail_at(file, line, "created(ok) failed");
  return r;
}
#define WARM_RECORD(p, k, now) warm_record_at((p), (k), (now), __FILE__, __LINE__)

/* an acquire that must hand out an idle record; *g (optional) gets the grant */
static hold_t lease_idle_at(clientpool_t *p, int32_t k, double now, clientpool_grant_t *out,
                            const char *file, int line) {
  clientpool_grant_t g;
  int st = w_acquire(p, k, now, &g, file, line);
  if (st != CLIENTPOOL_GRANT_IDLE)
    fail_at(file, line, "acquire(key %d) gave %s, expected GRANT_IDLE", (int)k, status_name(st));
  CHECK_AT(g.record >= 0 && g.lease >= 0 && g.key == k, file, line);
  if (out) *out = g;
  return hold_of(&g);
}
#define REUSE(p, k, now, g) lease_idle_at((p), (k), (now), (g), __FILE__, __LINE__)

static void release_at(clientpool_t *p, hold_t h, int32_t reason, double now, const char *file, int line) {
  int rc = w_release(p, h.lease, h.gen, reason, now, file, line);
  if (rc != 0) fail_at(file, line, "release(lease %d/%u) gave %s", (int)h.lease, (unsigned)h.gen, status_name(rc));
}
#define RELEASE(p, h, now) release_at((p), (h), -1, (now), __FILE__, __LINE__)
#define RELEASE_AS(p, h, reason, now) release_at((p), (h), (reason), (now), __FILE__, __LINE__)

static waiter_h wait_at(clientpool_t *p, int32_t k, double deadline, double now, const char *file, int line) {
  waiter_h wh;
  wh.gen = 0;
  wh.w = w_wait(p, k, deadline, now, &wh.gen, file, line);
  if (wh.w < 0) fail_at(file, line, "wait(key %d) gave %d", (int)k, (int)wh.w);
  return wh;
}
#define WAIT(p, k, deadline, now) wait_at((p), (k), (deadline), (now), __FILE__, __LINE__)

static waiter_h wait_prio_at(clientpool_t *p, int32_t k, int32_t prio, double now, const char *file, int line) {
  waiter_h wh;
  wh.gen = 0;
  wh.w = clientpool_wait_priority(p, k, -1, prio, now, &wh.gen);
  after(p, file, line, "clientpool_wait_priority");
  if (wh.w < 0) fail_at(file, line, "wait_priority(key %d, %d) gave %d", (int)k, (int)prio, (int)wh.w);
  return wh;
}
#define WAIT_PRIO(p, k, prio, now) wait_prio_at((p), (k), (prio), (now), __FILE__, __LINE__)

static void must_wait_at(clientpool_t *p, int32_t k, double now, const char *file, int line) {
  clientpool_grant_t g;
  int st = w_acquire(p, k, now, &g, file, line);
  if (st != CLIENTPOOL_MUST_WAIT)
    fail_at(file, line, "acquire(key %d) gave %s, expected MUST_WAIT", (int)k, status_name(st));
}
#define MUST_WAIT(p, k, now) must_wait_at((p), (k), (now), __FILE__, __LINE__)

static clientpool_stats_t pstats(const clientpool_t *p) {
  clientpool_stats_t s;
  clientpool_stats(p, -1, &s);
  return s;
}

static clientpool_stats_t kstats_at(const clientpool_t *p, int32_t k, const char *file, int line) {
  clientpool_stats_t s;
  memset(&s, 0, sizeof s);
  if (clientpool_stats(p, k, &s) != 0) fail_at(file, line, "stats of key %d: unknown key", (int)k);
  return s;
}
#define KSTATS(p, k) kstats_at((p), (k), __FILE__, __LINE__)

static int stats_equal(const clientpool_stats_t *a, const clientpool_stats_t *b) {
  int i;
  if (a->opened != b->opened || a->reused != b->reused || a->closed != b->closed ||
      a->leaked != b->leaked || a->timeouts != b->timeouts || a->rejected != b->rejected ||
      a->cancelled != b->cancelled || a->create_failed != b->create_failed ||
      a->wait_count != b->wait_count || a->wait_time != b->wait_time) return 0;
  for (i = 0; i < CLIENTPOOL_BY_COUNT; i++) if (a->closed_by[i] != b->closed_by[i]) return 0;
  return a->live == b->live && a->idle == b->idle && a->active == b->active &&
         a->leases == b->leases && a->creating == b->creating && a->waiting == b->waiting;
}

/* The pool's counters equal the sum over the given keys (all keys in use,
 * none ever forgotten), opened - closed == live and sum(closed_by) == closed. */
static void check_sums_at(const clientpool_t *p, const int32_t *keys, int n, const char *file, int line) {
  clientpool_stats_t s = pstats(p), sum, k;
  double by = 0;
  int i, j;
  memset(&sum, 0, sizeof sum);
  for (i = 0; i < n; i++) {
    double kby = 0;
    k = kstats_at(p, keys[i], file, line);
    CHECK_AT(k.opened - k.closed == k.live, file, line);
    for (j = 0; j < CLIENTPOOL_BY_COUNT; j++) { sum.closed_by[j] += k.closed_by[j]; kby += k.closed_by[j]; }
    CHECK_AT(kby == k.closed, file, line);
    sum.opened += k.opened; sum.reused += k.reused; sum.closed += k.closed; sum.leaked += k.leaked;
    sum.timeouts += k.timeouts; sum.rejected += k.rejected; sum.cancelled += k.cancelled;
    sum.create_failed += k.create_failed; sum.wait_count += k.wait_count; sum.wait_time += k.wait_time;
    sum.live += k.live; sum.idle += k.idle; sum.active += k.active; sum.leases += k.leases;
    sum.creating += k.creating; sum.waiting += k.waiting;
  }
  for (j = 0; j < CLIENTPOOL_BY_COUNT; j++) by += s.closed_by[j];
  CHECK_AT(s.opened - s.closed == s.live, file, line);
  CHECK_AT(by == s.closed, file, line);
  CHECK_AT(fabs(sum.wait_time - s.wait_time) < 1e-9, file, line);
  sum.wait_time = s.wait_time;
  if (!stats_equal(&sum, &s))
    fail_at(file, line, "per-key stats do not sum to the pool's (live %d/%d idle %d/%d leases %d/%d "
            "opened %g/%g closed %g/%g)", sum.live, s.live, sum.idle, s.idle, sum.leases, s.leases,
            sum.opened, s.opened, sum.closed, s.closed);
}
#define CHECK_SUMS(p, keys, n) check_sums_at((p), (keys), (n), __FILE__, __LINE__)

/* ===================================================================== */
/* 1. config                                                             */
/* ===================================================================== */

static void t_config_rejects_outside_envelope(void) {
  struct { const char *what; clientpool_config_t c; } bad[32];
  clientpool_config_t c;
  int n = 0, i;
  clientpool_t *p;
  /* each case breaks exactly one rule of a good config */
#define BAD(stmt) do { c = cfg_base(); stmt; bad[n].what = #stmt; bad[n].c = c; n++; } while (0)
  BAD(c.max_live = 0; c.max_idle = 0);
  BAD(c.max_live = -1; c.max_idle = 0);
  BAD(c.min_idle = 3; c.max_idle = 2);
  BAD(c.min_idle = -1);
  BAD(c.max_idle = 5);                      /* > max_live 4 */
  BAD(c.max_idle = -1);
  BAD(c.max_concurrency = 0);
  BAD(c.capacity = 0);
  BAD(c.capacity = -1);
  BAD(c.max_waiting = -1);
  BAD(c.key_max_live = 5);                  /* > max_live 4 */
  BAD(c.key_max_live = 0);
  BAD(c.key_max_idle = 5);                  /* > max_idle 4 */
  BAD(c.max_keys = 0);
  BAD(c.lifetime_jitter = -0.01);
  BAD(c.lifetime_jitter = 1.0);
  BAD(c.lifetime_jitter = 2.0);
  BAD(c.lifetime_jitter = NAN);
  BAD(c.lifetime_jitter = INFINITY);
  BAD(c.create_backoff = 1; c.create_backoff_max = 0.5);   /* max below the base */
  BAD(c.create_backoff = NAN);
  BAD(c.create_backoff = INFINITY; c.create_backoff_max = INFINITY);
  BAD(c.create_backoff = 1; c.create_backoff_max = INFINITY);
  BAD(c.create_backoff = 1; c.create_backoff_max = NAN);
  BAD(c.keepalive = 0);
  BAD(c.keepalive = NAN);
  BAD(c.keepalive = INFINITY);
#undef BAD
  for (i = 0; i < n; i++) {
    int rc;
    p = (clientpool_t *)&c;                 /* poison: must come back NULL */
    rc = clientpool_new(&bad[i].c, &p);
    if (rc == CLIENTPOOL_OK && p) clientpool_free(p);
    if (rc != CLIENTPOOL_EINVAL || p != NULL)
      fail_at(__FILE__, __LINE__, "config { %s } gave rc %d (want EINVAL and *out NULL)", bad[i].what, rc);
  }
  p = (clientpool_t *)&c;
  CHECK(clientpool_new(NULL, &p) == CLIENTPOOL_EINVAL && p == NULL);
}

static void t_config_accepts_envelope_edges(void) {
  clientpool_config_t good[10], c;
  int n = 0, i;
  good[n++] = cfg_base();
  c = cfg_base(); c.min_idle = 4; c.max_idle = 4; c.max_live = 4; good[n++] = c;
  c = cfg_base(); c.max_idle = 0; c.max_waiting = 0; good[n++] = c;
  c = cfg_base(); c.key_max_live = 4; c.key_max_idle = 4; c.max_keys = 1; good[n++] = c;
  c = cfg_base(); c.key_max_live = 1; c.key_max_idle = 0; good[n++] = c;
  c = cfg_base(); c.lifetime_jitter = 0.999; c.max_lifetime = 10; good[n++] = c;
  c = cfg_base(); c.max_concurrency = 1000; c.max_live = 1; c.max_idle = 1; good[n++] = c;
  c = cfg_base(); c.capacity = 8; good[n++] = c;     /* shared records (HTTP/2-style) */
  c = cfg_base(); c.idle_timeout = 1; c.max_lifetime = 2; c.validate_after_idle = 0.5;
  c.leak_threshold = 3; c.seed = 0; good[n++] = c;
  for (i = 0; i < n; i++) {
    clientpool_t *p = NULL;
    clientpool_stats_t s;
    CHECK_EQ(clientpool_new(&good[i], &p), CLIENTPOOL_OK);
    CHECK(p != NULL);
    own_pool(p);
    INVARIANTS(p);
    s = pstats(p);
    CHECK(s.live == 0 && s.idle == 0 && s.leases == 0 && s.waiting == 0 && s.opened == 0);
    CHECK_NEAR(clientpool_next_deadline(p), -1);
    CHECK_EQ(clientpool_pending(p), 0);
    CHECK_EQ(clientpool_is_closed(p), 0);
    free_pool(p);
  }
  clientpool_free(NULL);                    /* accepted */
}

/* ===================================================================== */
/* 2. lazy creation                                                      */
/* ===================================================================== */

static void t_create_first_acquire_reserves(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  clientpool_grant_t g;
  clientpool_stats_t s;
  int i;

  CHECK_STATUS(ACQUIRE(p, k, 0, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK(g.record >= 0 && g.lease >= 0 && g.key == k && g.validate == 0);
  CHECK_EQ(clientpool_record_key(p, g.record), k);
  s = pstats(p);
  CHECK(s.creating == 1 && s.live == 0 && s.leases == 1 && s.active == 0 && s.opened == 0);
  /* a reservation's lease is not valid before created(ok) */
  CHECK_STATUS(RELEASE_RAW(p, g.lease, g.lease_gen, -1, 0), CLIENTPOOL_STALE);
  drain(p);

  CHECK_EQ(CREATED(p, g.record, 1, 0.5), 0);
  drain(p);
  i = find_ev(CLIENTPOOL_EV_CREATED, g.record, -1, k);
  CHECK(i >= 0);
  s = pstats(p);
  CHECK(s.live == 1 && s.opened == 1 && s.active == 1 && s.creating == 0 && s.leases == 1);
  s = KSTATS(p, k);
  CHECK(s.live == 1 && s.opened == 1 && s.active == 1);
  CHECK_NEAR(clientpool_lease_age(p, g.lease, g.lease_gen, 1.0), 1.0);   /* held since the grant at 0 */
  CHECK_STATUS(CREATED(p, g.record, 1, 1), CLIENTPOOL_STALE);            /* not creating any more */

  RELEASE(p, hold_of(&g), 1);
  s = pstats(p);
  CHECK(s.live == 1 && s.idle == 1 && s.active == 0 && s.leases == 0);
}

static void t_create_failure_forfeits(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  clientpool_grant_t g;
  clientpool_stats_t s;

  CHECK_STATUS(ACQUIRE(p, k, 0, &g), CLIENTPOOL_GRANT_CREATE);
  drain(p);
  CHECK_EQ(CREATED(p, g.record, 0, 1), 0);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_DESTROY), 0);   /* no client was made: nothing to destroy */
  CHECK_EQ(n_events(CLIENTPOOL_EV_CREATED), 0);
  s = pstats(p);
  CHECK(s.live == 0 && s.creating == 0 && s.leases == 0 && s.idle == 0);
  CHECK(s.create_failed == 1 && s.opened == 0 && s.closed == 0);
  CHECK(KSTATS(p, k).create_failed == 1);
  CHECK_EQ(clientpool_record_key(p, g.record), -1);
  CHECK_STATUS(CREATED(p, g.record, 0, 1), CLIENTPOOL_STALE);
  CHECK_STATUS(CREATED(p, g.record, 1, 1), CLIENTPOOL_STALE);
  CHECK_STATUS(RELEASE_RAW(p, g.lease, g.lease_gen, -1, 1), CLIENTPOOL_STALE);
  /* the capacity is back: a new acquire reserves again */
  CHECK_STATUS(ACQUIRE(p, k, 2, &g), CLIENTPOOL_GRANT_CREATE);
}

static void t_create_failure_hands_capacity_to_waiter(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  clientpool_grant_t g1, g2;
  waiter_h w;
  clientpool_stats_t s;
  c.max_live = 1; c.max_idle = 1;
  p = POOL(c);
  k = PKEY(p);

  CHECK_STATUS(ACQUIRE(p, k, 0, &g1), CLIENTPOOL_GRANT_CREATE);
  MUST_WAIT(p, k, 0);
  w = WAIT(p, k, -1, 0);
  CHECK_STATUS(CLAIM(p, w, 0, &g2), CLIENTPOOL_PENDING);
  drain(p);

  CHECK_EQ(CREATED(p, g1.record, 0, 2), 0);
  drain(p);
  EXPECT_WAKE(w);
  CHECK_STATUS(CLAIM(p, w, 2, &g2), CLIENTPOOL_GRANT_CREATE);
  CHECK_NEAR(g2.waited, 2);
  CHECK(g2.key == k && g2.record >= 0);
  CHECK_EQ(CREATED(p, g2.record, 1, 3), 0);
  s = pstats(p);
  CHECK(s.live == 1 && s.opened == 1 && s.create_failed == 1 && s.leases == 1 && s.waiting == 0);
  RELEASE(p, hold_of(&g2), 4);
  CHECK_STATUS(RELEASE_RAW(p, g1.lease, g1.lease_gen, -1, 4), CLIENTPOOL_STALE);
}

/* ===================================================================== */
/* 3. reuse (LIFO) and validate                                          */
/* ===================================================================== */

static void t_reuse_lifo(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  hold_t h1, h2, x;
  clientpool_grant_t g;
  clientpool_stats_t s;

  h1 = NEW_LEASE(p, k, 0);
  h2 = NEW_LEASE(p, k, 0);
  RELEASE(p, h1, 1);
  RELEASE(p, h2, 2);
  x = REUSE(p, k, 3, &g);                   /* most recently released first */
  CHECK_EQ(x.record, h2.record);
  CHECK_NEAR(g.idle, 1);
  x = REUSE(p, k, 4, &g);
  CHECK_EQ(x.record, h1.record);
  CHECK_NEAR(g.idle, 3);
  s = pstats(p);
  CHECK(s.reused == 2 && s.opened == 2 && s.idle == 0 && s.active == 2);
  CHECK(KSTATS(p, k).reused == 2);
  RELEASE(p, x, 5);                         /* h1's record back on top */
  x = REUSE(p, k, 6, &g);
  CHECK_EQ(x.record, h1.record);
  CHECK(pstats(p).reused == 3);
}

static void t_validate_after_idle(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  hold_t h;
  clientpool_grant_t g;

  c.validate_after_idle = 1.0;
  p = POOL(c);
  k = PKEY(p);
  h = NEW_LEASE(p, k, 0);
  RELEASE(p, h, 0);
  h = REUSE(p, k, 0.5, &g);
  CHECK(g.validate == 0); CHECK_NEAR(g.idle, 0.5);     /* used recently: skip validate */
  RELEASE(p, h, 0.5);
  h = REUSE(p, k, 1.5, &g);
  CHECK(g.validate == 1); CHECK_NEAR(g.idle, 1.0);     /* idle == validate_after_idle */
  RELEASE(p, h, 1.5);
  h = REUSE(p, k, 4, &g);
  CHECK(g.validate == 1); CHECK_NEAR(g.idle, 2.5);
  RELEASE(p, h, 4);

  c.validate_after_idle = -1;                          /* none: always validate */
  p = POOL(c);
  k = PKEY(p);
  h = NEW_LEASE(p, k, 0);
  RELEASE(p, h, 0);
  h = REUSE(p, k, 0, &g);
  CHECK(g.validate == 1); CHECK_NEAR(g.idle, 0);

  c.validate_after_idle = 0;
  p = POOL(c);
  k = PKEY(p);
  h = NEW_LEASE(p, k, 0);
  RELEASE(p, h, 1);
  h = REUSE(p, k, 1, &g);
  CHECK(g.validate == 1);
}

/* ===================================================================== */
/* 4. idle timeout, next_deadline, EV_TIMER                              */
/* ===================================================================== */

static void t_idle_timeout_at_acquire(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  hold_t h, x;
  clientpool_grant_t g;
  clientpool_stats_t s;
  c.idle_timeout = 10;
  p = POOL(c);
  k = PKEY(p);        /* unpinned: t_regress_acquire_expired_idle_keeps_key */

  h = NEW_LEASE(p, k, 0);
  RELEASE(p, h, 1);
  x = REUSE(p, k, 10.5, &g);                /* 9.5s idle: still fresh */
  CHECK_EQ(x.record, h.record);
  RELEASE(p, x, 11);
  drain(p);
  CHECK_STATUS(ACQUIRE(p, k, 21, &g), CLIENTPOOL_GRANT_CREATE);   /* idle exactly 10s */
  drain(p);
  EXPECT_DESTROY(h.record, CLIENTPOOL_BY_IDLE);
  CHECK(find_ev(CLIENTPOOL_EV_DESTROY, h.record, CLIENTPOOL_BY_IDLE, k) >= 0);
  s = pstats(p);
  CHECK(s.closed_by[CLIENTPOOL_BY_IDLE] == 1 && s.live == 0 && s.creating == 1 && s.idle == 0);
}

static void t_idle_timeout_by_tick(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  hold_t h1, h2, x;
  clientpool_stats_t s;
  c.idle_timeout = 10;
  p = POOL(c);
  k = UKEY(p);

  h1 = NEW_LEASE(p, k, 0);
  h2 = NEW_LEASE(p, k, 0);
  CHECK_NEAR(clientpool_next_deadline(p), -1);          /* nothing idle, no other deadline */
  RELEASE(p, h1, 1);
  RELEASE(p, h2, 3);
  CHECK_NEAR(clientpool_next_deadline(p), 11);          /* oldest idle_since + idle_timeout */
  x = REUSE(p, k, 4, NULL);                             /* takes h2 (LIFO) */
  CHECK_EQ(x.record, h2.record);
  CHECK_NEAR(clientpool_next_deadline(p), 11);
  RELEASE(p, x, 5);                                     /* h2 idle since 5 */
  CHECK_NEAR(clientpool_next_deadline(p), 11);
  drain(p);

  TICK(p, 10.99);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_DESTROY), 0);
  TICK(p, 11);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_DESTROY), 1);
  EXPECT_DESTROY(h1.record, CLIENTPOOL_BY_IDLE);
  CHECK_NEAR(clientpool_next_deadline(p), 15);
  TICK(p, 15);
  drain(p);
  EXPECT_DESTROY(h2.record, CLIENTPOOL_BY_IDLE);
  CHECK_EQ(n_key_free(k), 1);                           /* unpinned and empty now */
  CHECK_NEAR(clientpool_next_deadline(p), -1);
  s = pstats(p);
  CHECK(s.live == 0 && s.idle == 0 && s.closed_by[CLIENTPOOL_BY_IDLE] == 2 && s.closed == 2);
}

static void t_timer_events(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t a, b;
  hold_t la, lb;
  waiter_h w;
  clientpool_grant_t g;
  c.max_live = 2; c.max_idle = 2; c.key_max_live = 1; c.idle_timeout = 10;
  p = POOL(c);
  a = PKEY(p);
  b = PKEY(p);

  la = NEW_LEASE(p, a, 0);
  lb = NEW_LEASE(p, b, 0);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_TIMER), 0);           /* no deadline yet */
  RELEASE(p, lb, 1);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_TIMER), 1);
  CHECK_NEAR(last_timer(), 11);
  MUST_WAIT(p, a, 2);                                   /* a is at its per-key cap */
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_TIMER), 0);           /* deadline unchanged: no timer */
  w = WAIT(p, a, 5, 2);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_TIMER), 1);           /* an earlier deadline appeared */
  CHECK_NEAR(last_timer(), 5);
  CHECK_NEAR(clientpool_next_deadline(p), 5);
  TICK(p, 4);                                           /* the timer is re-armed after a tick */
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_TIMER), 1);
  CHECK_NEAR(last_timer(), 5);
  CHECK_EQ(n_events(CLIENTPOOL_EV_WAKE), 0);
  TICK(p, 5);
  drain(p);
  EXPECT_WAKE(w);
  CHECK_EQ(n_events(CLIENTPOOL_EV_TIMER), 1);
  CHECK_NEAR(last_timer(), 11);
  CHECK_STATUS(CLAIM(p, w, 5, &g), CLIENTPOOL_TIMEOUT);
  TICK(p, 11);
  drain(p);
  EXPECT_DESTROY(lb.record, CLIENTPOOL_BY_IDLE);
  CHECK_EQ(n_events(CLIENTPOOL_EV_TIMER), 0);
  CHECK_NEAR(clientpool_next_deadline(p), -1);
  RELEASE(p, la, 12);
  drain(p);
  CHECK_NEAR(last_timer(), 22);
}

/* ===================================================================== */
/* 5. max_lifetime and jitter                                            */
/* ===================================================================== */

/* Creates n records one after another with max_lifetime 100 and jitter 0.5,
 * lets each sit idle until tick destroys it, and stores its lifetime. */
static void lifetimes(uint64_t seed, double *out, int n) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  double now = 0;
  int i;
  c.max_live = 1; c.max_idle = 1; c.max_lifetime = 100; c.lifetime_jitter = 0.5; c.seed = seed;
  p = POOL(c);
  k = PKEY(p);
  for (i = 0; i < n; i++) {
    hold_t h = NEW_LEASE(p, k, now);
    double d;
    RELEASE(p, h, now);
    d = clientpool_next_deadline(p);
    CHECK(d >= now + 50 && d <= now + 100);              /* [created + L(1-j), created + L] */
    out[i] = d - now;
    drain(p);
    TICK(p, d - 1e-6);
    drain(p);
    CHECK_EQ(n_events(CLIENTPOOL_EV_DESTROY), 0);
    TICK(p, d);
    drain(p);
    EXPECT_DESTROY(h.record, CLIENTPOOL_BY_LIFETIME);
    now = d + 1;
  }
  CHECK(pstats(p).closed_by[CLIENTPOOL_BY_LIFETIME] == n);
  free_pool(p);
}

static void t_lifetime_jitter_window_and_seed(void) {
  double a[20], b[20], d[20], lo = 1e9, hi = -1;
  int i, differ = 0;
  lifetimes(42, a, 20);
  lifetimes(42, b, 20);
  lifetimes(7, d, 20);
  for (i = 0; i < 20; i++) {
    CHECK(a[i] == b[i]);                    /* same seed: same lifetimes */
    if (a[i] != d[i]) differ++;
    if (a[i] < lo) lo = a[i];
    if (a[i] > hi) hi = a[i];
  }
  CHECK(differ > 0);                        /* another seed: other lifetimes */
  CHECK(hi - lo > 5);                       /* the jitter really spreads them */
}

static void t_lifetime_without_jitter_exact(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  hold_t h;
  c.max_lifetime = 10;
  p = POOL(c);
  k = PKEY(p);
  h = NEW_LEASE(p, k, 2);
  RELEASE(p, h, 3);
  CHECK_NEAR(clientpool_next_deadline(p), 12);
  drain(p);
  TICK(p, 12);
  drain(p);
  EXPECT_DESTROY(h.record, CLIENTPOOL_BY_LIFETIME);
}

static void t_lifetime_leased_destroyed_at_release(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  hold_t h, h2;
  c.max_lifetime = 10;
  p = POOL(c);
  k = PKEY(p);

  h = NEW_LEASE(p, k, 0);                   /* expires at 10 */
  CHECK_NEAR(clientpool_next_deadline(p), 10);
  drain(p);
  TICK(p, 10);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_DESTROY), 0);      /* leased: stays with its holder */
  CHECK_EQ(pstats(p).live, 1);
  CHECK(clientpool_lease_age(p, h.lease, h.gen, 10) >= 0);
  RELEASE(p, h, 12);
  drain(p);
  EXPECT_DESTROY(h.record, CLIENTPOOL_BY_LIFETIME);
  CHECK(pstats(p).idle == 0 && pstats(p).live == 0);

  h2 = NEW_LEASE(p, k, 20);                 /* expires at 30; released before: idle */
  RELEASE(p, h2, 25);
  CHECK_EQ(pstats(p).idle, 1);
  drain(p);
  TICK(p, 30);
  drain(p);
  EXPECT_DESTROY(h2.record, CLIENTPOOL_BY_LIFETIME);
  CHECK(pstats(p).closed_by[CLIENTPOOL_BY_LIFETIME] == 2);
}

static void t_lifetime_at_acquire(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  hold_t h;
  clientpool_grant_t g;
  c.max_lifetime = 10;
  p = POOL(c);
  k = PKEY(p);
  h = NEW_LEASE(p, k, 0);
  RELEASE(p, h, 5);
  drain(p);
  CHECK_STATUS(ACQUIRE(p, k, 10, &g), CLIENTPOOL_GRANT_CREATE);   /* met on the way, no tick */
  drain(p);
  EXPECT_DESTROY(h.record, CLIENTPOOL_BY_LIFETIME);
}

/* ===================================================================== */
/* 6. max_idle and key_max_idle                                          */
/* ===================================================================== */

static void t_max_idle_on_release(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  hold_t h1, h2, h3;
  clientpool_stats_t s;
  c.max_idle = 2;
  p = POOL(c);
  k = PKEY(p);
  h1 = NEW_LEASE(p, k, 0);
  h2 = NEW_LEASE(p, k, 0);
  h3 = NEW_LEASE(p, k, 0);
  RELEASE(p, h1, 1);
  RELEASE(p, h2, 1);
  drain(p);
  RELEASE(p, h3, 2);
  drain(p);
  EXPECT_DESTROY(h3.record, CLIENTPOOL_BY_MAX_IDLE);
  s = pstats(p);
  CHECK(s.idle == 2 && s.live == 2 && s.closed_by[CLIENTPOOL_BY_MAX_IDLE] == 1);
}

static void t_key_max_idle_on_release(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t a, b;
  hold_t a1, a2, b1;
  c.key_max_idle = 1;
  p = POOL(c);
  a = PKEY(p);
  b = PKEY(p);
  a1 = NEW_LEASE(p, a, 0);
  a2 = NEW_LEASE(p, a, 0);
  b1 = NEW_LEASE(p, b, 0);
  RELEASE(p, a1, 1);
  drain(p);
  RELEASE(p, a2, 1);
  drain(p);
  EXPECT_DESTROY(a2.record, CLIENTPOOL_BY_MAX_IDLE);
  RELEASE(p, b1, 1);                        /* b's own cap: still room */
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_DESTROY), 0);
  CHECK_EQ(pstats(p).idle, 2);
  CHECK(KSTATS(p, a).closed_by[CLIENTPOOL_BY_MAX_IDLE] == 1 && KSTATS(p, a).idle == 1);
  CHECK_EQ(KSTATS(p, b).idle, 1);
}

static void t_max_idle_zero_still_hands_to_waiter(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  hold_t h, x;
  waiter_h w;
  clientpool_grant_t g;
  c.max_live = 1; c.max_idle = 0;
  p = POOL(c);
  k = PKEY(p);
  h = NEW_LEASE(p, k, 0);
  MUST_WAIT(p, k, 0);
  w = WAIT(p, k, -1, 0);
  drain(p);
  RELEASE(p, h, 1);                         /* goes straight to the waiter */
  drain(p);
  EXPECT_WAKE(w);
  CHECK_EQ(n_events(CLIENTPOOL_EV_DESTROY), 0);
  CHECK_STATUS(CLAIM(p, w, 1, &g), CLIENTPOOL_GRANT_IDLE);
  CHECK_EQ(g.record, h.record);
  x = hold_of(&g);
  RELEASE(p, x, 2);                         /* nobody waits: max_idle 0 destroys it */
  drain(p);
  EXPECT_DESTROY(h.record, CLIENTPOOL_BY_MAX_IDLE);
}

/* ===================================================================== */
/* 7a. per-key caps under the global caps; eviction                       */
/* ===================================================================== */

static void t_key_max_live_under_global(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t a, b, k3;
  hold_t a1, x;
  clientpool_grant_t g;
  c.key_max_live = 2;
  p = POOL(c);
  a = PKEY(p); b = PKEY(p); k3 = PKEY(p);
  a1 = NEW_LEASE(p, a, 0);
  (void)NEW_LEASE(p, a, 0);
  MUST_WAIT(p, a, 0);                       /* per-key cap, the pool has room */
  CHECK_EQ(pstats(p).live, 2);
  (void)NEW_LEASE(p, b, 0);
  (void)NEW_LEASE(p, b, 0);
  MUST_WAIT(p, b, 0);
  MUST_WAIT(p, k3, 0);                      /* global cap, nothing idle */
  CHECK(KSTATS(p, a).live == 2 && KSTATS(p, b).live == 2 && KSTATS(p, k3).live == 0);

  RELEASE(p, a1, 1);
  x = REUSE(p, a, 2, NULL);                 /* idle records of a key under its cap are usable */
  CHECK_EQ(x.record, a1.record);
  RELEASE(p, x, 3);
  drain(p);
  /* evicting a's idle one: the room comes when its destroy is reported
   * (here at once, after the call), so this acquisition waits */
  CHECK_STATUS(ACQUIRE(p, k3, 4, &g), CLIENTPOOL_MUST_WAIT);
  drain(p);
  EXPECT_DESTROY(a1.record, CLIENTPOOL_BY_EVICTED);
  CHECK(find_ev(CLIENTPOOL_EV_DESTROY, a1.record, CLIENTPOOL_BY_EVICTED, a) >= 0);
  CHECK_STATUS(ACQUIRE(p, k3, 4, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK(pstats(p).live + pstats(p).creating == 4);
}

static void t_evict_lru_idle_of_other_key(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t a, b, k3;
  hold_t ha, hb, hc;
  clientpool_grant_t g;
  clientpool_stats_t s;
  c.max_live = 3; c.max_idle = 3;
  p = POOL(c);
  a = UKEY(p); b = UKEY(p); k3 = UKEY(p);
  ha = NEW_LEASE(p, a, 0);
  hb = NEW_LEASE(p, b, 0);
  hc = NEW_LEASE(p, k3, 0);
  RELEASE(p, ha, 1);                        /* least recently used */
  RELEASE(p, hb, 2);
  drain(p);
  /* the eviction starts; its room is the waiter's once the destroy is
   * reported done (at once here, after the call) */
  CHECK_STATUS(ACQUIRE(p, k3, 3, &g), CLIENTPOOL_MUST_WAIT);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_DESTROY), 1);
  EXPECT_DESTROY(ha.record, CLIENTPOOL_BY_EVICTED);
  CHECK_EQ(n_key_free(a), 1);               /* a held only that record */
  CHECK_EQ(KSTATS(p, b).idle, 1);
  CHECK_STATUS(ACQUIRE(p, k3, 3, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK_EQ(CREATED(p, g.record, 1, 3), 0);
  drain(p);
  CHECK_STATUS(ACQUIRE(p, k3, 4, &g), CLIENTPOOL_MUST_WAIT);
  drain(p);
  EXPECT_DESTROY(hb.record, CLIENTPOOL_BY_EVICTED);
  CHECK_STATUS(ACQUIRE(p, k3, 4, &g), CLIENTPOOL_GRANT_CREATE);
  s = pstats(p);
  CHECK(s.closed_by[CLIENTPOOL_BY_EVICTED] == 2 && s.idle == 0);
  RELEASE(p, hc, 5);
}

static void t_no_eviction_when_key_capped(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t a, b;
  hold_t hb;
  c.max_live = 2; c.max_idle = 2; c.key_max_live = 1;
  p = POOL(c);
  a = PKEY(p); b = PKEY(p);
  (void)NEW_LEASE(p, a, 0);
  hb = NEW_LEASE(p, b, 0);
  RELEASE(p, hb, 1);
  drain(p);
  MUST_WAIT(p, a, 2);                       /* evicting b's record would not help a */
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_DESTROY), 0);
  CHECK_EQ(pstats(p).idle, 1);
}

/* A waiter that must create, held back because younger waiters of another
 * key can take idle records, is passed over at most max_live times; then it
 * evicts.  Without the bound, continuous load on key a starves key b. */
static void t_starvation_bound(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t a, b;
  hold_t h[2];
  waiter_h wb, wa;
  clientpool_grant_t g;
  int i;
  c.max_live = 2; c.max_idle = 2; c.max_concurrency = 2;
  p = POOL(c);
  a = PKEY(p); b = PKEY(p);
  h[0] = NEW_LEASE(p, a, 0);
  h[1] = NEW_LEASE(p, a, 0);
  MUST_WAIT(p, b, 1); wb = WAIT(p, b, -1, 1);    /* b must create: no room, nothing idle */
  for (i = 0; i < 2; i++) {                       /* a's later waiters go first, twice */
    MUST_WAIT(p, a, 2 + i); wa = WAIT(p, a, -1, 2 + i);
    drain(p);
    RELEASE(p, h[i], 2 + i);
    drain(p);
    EXPECT_WAKE(wa);
    EXPECT_NO_WAKE(wb);
    CHECK_EQ(n_events(CLIENTPOOL_EV_DESTROY), 0);
    CHECK_STATUS(CLAIM(p, wa, 2 + i, &g), CLIENTPOOL_GRANT_IDLE);
    h[i] = hold_of(&g);
  }
  /* passed over max_live (2) times: the next record freed is evicted for b,
   * though a's waiter (younger than b's) could take it as it is */
  MUST_WAIT(p, a, 4); wa = WAIT(p, a, -1, 4);
  drain(p);
  RELEASE(p, h[0], 5);
  drain(p);
  EXPECT_WAKE(wb);
  EXPECT_NO_WAKE(wa);
  EXPECT_DESTROY(h[0].record, CLIENTPOOL_BY_EVICTED);
  CHECK_STATUS(CLAIM(p, wb, 5, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK_NEAR(g.waited, 4);
  CHECK_EQ(CREATED(p, g.record, 1, 5), 0);
  drain(p);
  RELEASE(p, hold_of(&g), 6);                     /* a's waiter evicts b's idle record */
  drain(p);
  EXPECT_WAKE(wa);
  CHECK_STATUS(CLAIM(p, wa, 6, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK_EQ(CREATED(p, g.record, 1, 6), 0);
  RELEASE(p, hold_of(&g), 7);
  RELEASE(p, h[1], 7);
  CHECK_EQ(pstats(p).leases, 0);
}

/* ===================================================================== */
/* 7b. keys: max_keys, forgetting, pinning                               */
/* ===================================================================== */

static void t_max_keys(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k0, k1, k2;
  clientpool_grant_t g;
  clientpool_stats_t s;
  c.max_keys = 2;
  p = POOL(c);
  k0 = UKEY(p);
  k1 = UKEY(p);
  CHECK(k0 != k1);
  CHECK_EQ(KEY_OPEN(p), CLIENTPOOL_EKEYS);
  CHECK_STATUS(ACQUIRE(p, k1, 0, &g), CLIENTPOOL_GRANT_CREATE);
  drain(p);
  CHECK_EQ(CREATED(p, g.record, 0, 1), 0);  /* k1 holds nothing now: forgotten */
  drain(p);
  CHECK_EQ(n_key_free(k1), 1);
  CHECK_EQ(n_key_free(k0), 0);
  CHECK(clientpool_stats(p, k1, &s) == CLIENTPOOL_EINVAL);
  k2 = KEY_OPEN(p);
  CHECK_EQ(k2, k1);                         /* the id is reused */
  CHECK_EQ(KSTATS(p, k2).create_failed, 0); /* with fresh counters */
  CHECK_EQ(KEY_OPEN(p), CLIENTPOOL_EKEYS);
}

static void t_key_forgotten_after_last_record(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p = POOL(c);
  int32_t k = UKEY(p);
  hold_t h = NEW_LEASE(p, k, 0);
  clientpool_grant_t g;
  clientpool_stats_t s;
  uint32_t gen;
  int id, ik;
  RELEASE(p, h, 1);                          /* an idle record keeps the key */
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_KEY_FREE), 0);
  h = REUSE(p, k, 2, NULL);
  RELEASE_AS(p, h, CLIENTPOOL_BY_ERROR, 3);
  drain(p);
  id = find_ev(CLIENTPOOL_EV_DESTROY, h.record, CLIENTPOOL_BY_ERROR, k);
  ik = find_ev(CLIENTPOOL_EV_KEY_FREE, k, -1, -1);
  CHECK(id >= 0 && ik > id);                 /* destroyed, then forgotten */
  CHECK_EQ(clientpool_stats(p, k, &s), CLIENTPOOL_EINVAL);
  CHECK_STATUS(ACQUIRE(p, k, 4, &g), CLIENTPOOL_STALE);
  CHECK_EQ(WAIT_RAW(p, k, -1, 4, &gen), -CLIENTPOOL_STALE);
  CHECK_EQ(KEY_FORGET(p, k), 0);
}

static void t_key_pinned_not_forgotten(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  hold_t h = NEW_LEASE(p, k, 0);
  RELEASE_AS(p, h, CLIENTPOOL_BY_ERROR, 1);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_KEY_FREE), 0);
  CHECK_EQ(KEY_FORGET(p, k), 0);            /* pinned */
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_KEY_FREE), 0);
  CHECK_EQ(KSTATS(p, k).closed, 1);
  CHECK_EQ(KEY_PIN(p, k, 0), 0);            /* unpinned while empty: forgotten */
  drain(p);
  CHECK_EQ(n_key_free(k), 1);
  CHECK_EQ(KEY_PIN(p, k, 1), CLIENTPOOL_EINVAL);
  CHECK_EQ(KEY_PIN(p, 99, 1), CLIENTPOOL_EINVAL);
  CHECK_EQ(KEY_PIN(p, -1, 1), CLIENTPOOL_EINVAL);
}

static void t_key_forget(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t pk, k, k2;
  hold_t h;
  c.max_live = 1; c.max_idle = 1;
  p = POOL(c);
  pk = PKEY(p);
  h = NEW_LEASE(p, pk, 0);
  k = UKEY(p);
  MUST_WAIT(p, k, 0);                       /* changes nothing: k is still open and empty */
  drain(p);
  CHECK_EQ(KEY_FORGET(p, pk), 0);           /* pinned and in use */
  CHECK_EQ(KEY_FORGET(p, k), 1);            /* the driver gives up: k is forgotten */
  drain(p);
  CHECK_EQ(n_key_free(k), 1);
  CHECK_EQ(KEY_FORGET(p, k), 0);
  CHECK_EQ(KEY_FORGET(p, -1), 0);
  CHECK_EQ(KEY_FORGET(p, 1000), 0);
  k2 = UKEY(p);
  MUST_WAIT(p, k2, 1);
  (void)WAIT(p, k2, -1, 1);
  CHECK_EQ(KEY_FORGET(p, k2), 0);           /* holds a waiter */
  CHECK_EQ(KEY_PIN(p, pk, 0), 0);
  CHECK_EQ(KEY_FORGET(p, pk), 0);           /* holds a lease */
  RELEASE(p, h, 2);                         /* goes to k2's waiter by eviction */
  drain(p);
  CHECK_EQ(n_key_free(pk), 1);
}

/* ===================================================================== */
/* 7c. max_concurrency                                                   */
/* ===================================================================== */

static void t_max_concurrency_independent_of_max_live(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  hold_t a, b;
  waiter_h w;
  clientpool_grant_t g;
  clientpool_stats_t s;
  c.max_live = 4; c.max_concurrency = 2;
  p = POOL(c);
  k = PKEY(p);
  a = NEW_LEASE(p, k, 0);
  b = NEW_LEASE(p, k, 0);
  MUST_WAIT(p, k, 0);                       /* two of four records live: still must wait */
  s = pstats(p);
  CHECK(s.live == 2 && s.leases == 2);
  w = WAIT(p, k, -1, 0);
  drain(p);
  RELEASE(p, a, 1);
  drain(p);
  EXPECT_WAKE(w);
  CHECK_STATUS(CLAIM(p, w, 1, &g), CLIENTPOOL_GRANT_IDLE);
  CHECK_EQ(g.record, a.record);
  RELEASE_AS(p, b, CLIENTPOOL_BY_ERROR, 2);
  CHECK_STATUS(ACQUIRE(p, k, 2, &g), CLIENTPOOL_GRANT_CREATE);   /* back under the cap */
}

static void t_max_concurrency_counts_reservations(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  clientpool_grant_t g1, g2, g3;
  waiter_h w;
  c.max_live = 4; c.max_concurrency = 2;
  p = POOL(c);
  k = PKEY(p);
  CHECK_STATUS(ACQUIRE(p, k, 0, &g1), CLIENTPOOL_GRANT_CREATE);
  CHECK_STATUS(ACQUIRE(p, k, 0, &g2), CLIENTPOOL_GRANT_CREATE);
  MUST_WAIT(p, k, 0);
  w = WAIT(p, k, -1, 0);
  drain(p);
  CHECK_EQ(CREATED(p, g1.record, 0, 1), 0);
  drain(p);
  EXPECT_WAKE(w);
  CHECK_STATUS(CLAIM(p, w, 1, &g3), CLIENTPOOL_GRANT_CREATE);
  CHECK_EQ(pstats(p).leases, 2);
}

/* ===================================================================== */
/* 7d. max_waiting                                                        */
/* ===================================================================== */

static void t_max_waiting_full(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  clientpool_grant_t g;
  uint32_t gen;
  clientpool_stats_t s;
  c.max_live = 1; c.max_idle = 1; c.max_waiting = 2;
  p = POOL(c);
  k = PKEY(p);
  (void)NEW_LEASE(p, k, 0);
  MUST_WAIT(p, k, 0);
  (void)WAIT(p, k, -1, 0);
  MUST_WAIT(p, k, 0);
  (void)WAIT(p, k, -1, 0);
  CHECK_STATUS(ACQUIRE(p, k, 1, &g), CLIENTPOOL_FULL);
  CHECK_EQ(WAIT_RAW(p, k, -1, 1, &gen), -CLIENTPOOL_FULL);
  s = pstats(p);
  CHECK(s.rejected == 2 && s.waiting == 2);
  CHECK(KSTATS(p, k).rejected == 2);
}

static void t_max_waiting_zero_fails_fast(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  clientpool_grant_t g;
  uint32_t gen;
  c.max_live = 1; c.max_idle = 1; c.max_waiting = 0;
  p = POOL(c);
  k = PKEY(p);
  (void)NEW_LEASE(p, k, 0);                 /* room: no waiting needed */
  CHECK_STATUS(ACQUIRE(p, k, 0, &g), CLIENTPOOL_FULL);
  CHECK_EQ(WAIT_RAW(p, k, -1, 0, &gen), -CLIENTPOOL_FULL);
  CHECK(pstats(p).rejected == 2 && pstats(p).waiting == 0);
}

/* ===================================================================== */
/* 8. strict FIFO, cross-key order                                       */
/* ===================================================================== */

static void t_fifo_one_key(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  hold_t h;
  waiter_h w[3];
  clientpool_grant_t g;
  int i;
  c.max_live = 1; c.max_idle = 1;
  p = POOL(c);
  k = PKEY(p);
  h = NEW_LEASE(p, k, 0);
  for (i = 0; i < 3; i++) { MUST_WAIT(p, k, i); w[i] = WAIT(p, k, -1, i); }
  for (i = 0; i < 3; i++) {
    int j;
    drain(p);
    RELEASE(p, h, 10 + i);
    drain(p);
    EXPECT_WAKE(w[i]);
    CHECK_EQ(n_events(CLIENTPOOL_EV_WAKE), 1);
    for (j = i + 1; j < 3; j++) CHECK_STATUS(CLAIM(p, w[j], 10 + i, &g), CLIENTPOOL_PENDING);
    CHECK_STATUS(CLAIM(p, w[i], 10 + i, &g), CLIENTPOOL_GRANT_IDLE);
    CHECK_NEAR(g.waited, 10);
    h = hold_of(&g);
  }
  CHECK_EQ(pstats(p).wait_count, 3);
  CHECK_NEAR(pstats(p).wait_time, 30);
}

/* A waiter of key B queued first but blocked by B's per-key cap does not
 * hold up a later waiter of key A that can use what was freed. */
static void t_fifo_cross_key_capped_does_not_block(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t a, b;
  hold_t la, lb;
  waiter_h wb, wa;
  clientpool_grant_t g;
  c.max_live = 2; c.max_idle = 2; c.key_max_live = 1;
  p = POOL(c);
  a = PKEY(p); b = PKEY(p);
  la = NEW_LEASE(p, a, 0);
  lb = NEW_LEASE(p, b, 0);
  MUST_WAIT(p, b, 1); wb = WAIT(p, b, -1, 1);
  MUST_WAIT(p, a, 2); wa = WAIT(p, a, -1, 2);
  drain(p);
  RELEASE(p, la, 3);
  drain(p);
  EXPECT_WAKE(wa);
  EXPECT_NO_WAKE(wb);
  CHECK_STATUS(CLAIM(p, wa, 3, &g), CLIENTPOOL_GRANT_IDLE);
  CHECK_EQ(g.record, la.record);
  CHECK_STATUS(CLAIM(p, wb, 3, &g), CLIENTPOOL_PENDING);
  RELEASE_AS(p, lb, CLIENTPOOL_BY_ERROR, 4);      /* B's cap frees up */
  drain(p);
  EXPECT_WAKE(wb);
  CHECK_STATUS(CLAIM(p, wb, 4, &g), CLIENTPOOL_GRANT_CREATE);
}

/* Among waiters that can use what was freed, the earliest is served. */
static void t_fifo_cross_key_earlier_servable_wins(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t a, b;
  hold_t la;
  waiter_h wb, wa;
  clientpool_grant_t g;
  c.max_live = 1; c.max_idle = 1;
  p = POOL(c);
  a = PKEY(p); b = PKEY(p);

  /* capacity freed (record destroyed): both can use it, B queued first */
  la = NEW_LEASE(p, a, 0);
  MUST_WAIT(p, b, 1); wb = WAIT(p, b, -1, 1);
  MUST_WAIT(p, a, 2); wa = WAIT(p, a, -1, 2);
  drain(p);
  RELEASE_AS(p, la, CLIENTPOOL_BY_ERROR, 3);
  drain(p);
  EXPECT_WAKE(wb);
  EXPECT_NO_WAKE(wa);
  CHECK_STATUS(CLAIM(p, wb, 3, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK_EQ(CREATED(p, g.record, 1, 3), 0);
  la = hold_of(&g);                                  /* now B holds the only record */

  /* B's record freed while A's waiter (earlier) and B's waiter (later) wait:
   * the record is B's client, so B's waiter takes it; A's waiter would have
   * to evict it and waits (engine rule: a waiter that must create evicts only
   * when no waiter can take an idle record) */
  MUST_WAIT(p, b, 4);
  wb = WAIT(p, b, -1, 4);
  drain(p);
  RELEASE(p, la, 5);
  drain(p);
  EXPECT_WAKE(wb);
  EXPECT_NO_WAKE(wa);
  CHECK_EQ(n_events(CLIENTPOOL_EV_DESTROY), 0);
  CHECK_STATUS(CLAIM(p, wb, 5, &g), CLIENTPOOL_GRANT_IDLE);
  CHECK_EQ(g.record, la.record);
  la = hold_of(&g);
  CHECK_STATUS(CLAIM(p, wa, 5, &g), CLIENTPOOL_PENDING);

  /* B's record freed with no B waiter: A's waiter evicts it */
  RELEASE(p, la, 6);
  drain(p);
  EXPECT_WAKE(wa);
  EXPECT_DESTROY(la.record, CLIENTPOOL_BY_EVICTED);
  CHECK_STATUS(CLAIM(p, wa, 6, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK_NEAR(g.waited, 4);
}

/* ===================================================================== */
/* 9. waiter deadlines, cancel, claim                                    */
/* ===================================================================== */

static void t_waiter_timeout_by_tick(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  waiter_h w;
  clientpool_grant_t g;
  clientpool_stats_t s;
  c.max_live = 1; c.max_idle = 1;
  p = POOL(c);
  k = PKEY(p);
  (void)NEW_LEASE(p, k, 0);
  MUST_WAIT(p, k, 1);
  w = WAIT(p, k, 5, 1);
  CHECK_NEAR(clientpool_next_deadline(p), 5);
  drain(p);
  TICK(p, 4.9);
  drain(p);
  EXPECT_NO_WAKE(w);
  CHECK_STATUS(CLAIM(p, w, 4.9, &g), CLIENTPOOL_PENDING);
  TICK(p, 5);
  drain(p);
  EXPECT_WAKE(w);
  CHECK(find_ev(CLIENTPOOL_EV_WAKE, w.w, (int32_t)w.gen, k) >= 0);
  s = pstats(p);
  CHECK(s.waiting == 0 && s.timeouts == 1 && s.wait_count == 1);
  CHECK_NEAR(s.wait_time, 4);
  CHECK_STATUS(CLAIM(p, w, 6, &g), CLIENTPOOL_TIMEOUT);
  CHECK_NEAR(g.waited, 4);
  CHECK_EQ(g.key, k);
  CHECK_STATUS(CLAIM(p, w, 6, &g), CLIENTPOOL_STALE);    /* the slot was freed */
  CHECK(KSTATS(p, k).timeouts == 1);
  CHECK_NEAR(clientpool_next_deadline(p), -1);
}

static void t_waiter_cancel_queued(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  waiter_h w1, w2, w3;
  clientpool_grant_t g;
  clientpool_stats_t s;
  c.max_live = 1; c.max_idle = 1;
  p = POOL(c);
  k = PKEY(p);
  (void)NEW_LEASE(p, k, 0);
  w1 = WAIT(p, k, 10, 0);
  w2 = WAIT(p, k, -1, 0);
  w3 = WAIT(p, k, -1, 0);
  CHECK_STATUS(CANCEL(p, w1, CLIENTPOOL_TIMEOUT, 2, &g), CLIENTPOOL_TIMEOUT);
  CHECK_NEAR(g.waited, 2);
  CHECK_NEAR(clientpool_next_deadline(p), -1);          /* its deadline left with it */
  CHECK_STATUS(CANCEL(p, w2, CLIENTPOOL_CANCELLED, 3, &g), CLIENTPOOL_CANCELLED);
  CHECK_STATUS(CANCEL(p, w3, 12345, 3, &g), CLIENTPOOL_CANCELLED);   /* other codes: cancelled */
  s = pstats(p);
  CHECK(s.waiting == 0 && s.timeouts == 1 && s.cancelled == 2 && s.wait_count == 3);
  CHECK_NEAR(s.wait_time, 8);
  CHECK_STATUS(CANCEL(p, w1, CLIENTPOOL_CANCELLED, 4, &g), CLIENTPOOL_STALE);
  CHECK_STATUS(CLAIM(p, w2, 4, &g), CLIENTPOOL_STALE);
}

static void t_waiter_cancel_after_grant_returns_grant(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  hold_t h;
  waiter_h w;
  clientpool_grant_t g;
  c.max_live = 1; c.max_idle = 1;
  p = POOL(c);
  k = PKEY(p);
  h = NEW_LEASE(p, k, 0);
  w = WAIT(p, k, 10, 0);
  RELEASE(p, h, 1);
  drain(p);
  EXPECT_WAKE(w);
  CHECK_STATUS(CANCEL(p, w, CLIENTPOOL_TIMEOUT, 2, &g), CLIENTPOOL_GRANT_IDLE);
  CHECK_EQ(g.record, h.record);
  CHECK(pstats(p).timeouts == 0 && pstats(p).leases == 1);
  RELEASE(p, hold_of(&g), 3);               /* the grant is a valid lease */
  CHECK(pstats(p).leases == 0 && pstats(p).idle == 1);
}

static void t_waiter_claim_pending_and_stale(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  waiter_h w, bad;
  clientpool_grant_t g;
  c.max_live = 1; c.max_idle = 1;
  p = POOL(c);
  k = PKEY(p);
  (void)NEW_LEASE(p, k, 0);
  w = WAIT(p, k, -1, 0);
  CHECK_STATUS(CLAIM(p, w, 1, &g), CLIENTPOOL_PENDING);
  CHECK_EQ(g.key, k);
  CHECK_STATUS(CLAIM(p, w, 1, &g), CLIENTPOOL_PENDING);  /* still queued */
  bad = w; bad.gen++;
  CHECK_STATUS(CLAIM(p, bad, 1, &g), CLIENTPOOL_STALE);
  CHECK_STATUS(CANCEL(p, bad, CLIENTPOOL_CANCELLED, 1, &g), CLIENTPOOL_STALE);
  CHECK_EQ(ABANDON(p, bad, 1), CLIENTPOOL_STALE);
  bad.w = -1;
  CHECK_STATUS(CLAIM(p, bad, 1, &g), CLIENTPOOL_STALE);
  bad.w = 100000;
  CHECK_STATUS(CLAIM(p, bad, 1, &g), CLIENTPOOL_STALE);
  CHECK_EQ(ABANDON(p, bad, 1), CLIENTPOOL_STALE);
  CHECK_EQ(pstats(p).waiting, 1);
}

static void t_waiter_served_at_once(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  waiter_h w;
  clientpool_grant_t g;
  drain(p);
  w = WAIT(p, k, 5, 1);                     /* room: granted right away */
  drain(p);
  EXPECT_WAKE(w);
  CHECK_STATUS(CLAIM(p, w, 1, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK_NEAR(g.waited, 0);
  CHECK_NEAR(clientpool_next_deadline(p), -1);
}

/* ===================================================================== */
/* 10. abandon                                                           */
/* ===================================================================== */

static void t_abandon_queued(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  waiter_h w;
  clientpool_grant_t g;
  c.max_live = 1; c.max_idle = 1;
  p = POOL(c);
  k = PKEY(p);
  (void)NEW_LEASE(p, k, 0);
  w = WAIT(p, k, 9, 0);
  CHECK_EQ(ABANDON(p, w, 1), 0);
  CHECK(pstats(p).waiting == 0 && pstats(p).cancelled == 1);
  CHECK_NEAR(clientpool_next_deadline(p), -1);
  CHECK_STATUS(CLAIM(p, w, 1, &g), CLIENTPOOL_STALE);
  CHECK_EQ(ABANDON(p, w, 1), CLIENTPOOL_STALE);
}

static void t_abandon_granted_idle_back_to_stack(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  hold_t h, x;
  waiter_h w;
  clientpool_stats_t s;
  c.max_live = 1; c.max_idle = 1;
  p = POOL(c);
  k = PKEY(p);
  h = NEW_LEASE(p, k, 0);
  w = WAIT(p, k, -1, 0);
  RELEASE(p, h, 1);
  drain(p);
  EXPECT_WAKE(w);
  CHECK(pstats(p).reused == 1 && pstats(p).leases == 1);
  CHECK_EQ(ABANDON(p, w, 2), 0);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_DESTROY), 0);
  s = pstats(p);
  CHECK(s.idle == 1 && s.leases == 0 && s.active == 0 && s.live == 1);
  CHECK(s.reused == 0 && s.cancelled == 1);              /* handed back unused */
  x = REUSE(p, k, 3, NULL);
  CHECK_EQ(x.record, h.record);
}

static void t_abandon_granted_idle_to_next_waiter(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  hold_t h;
  waiter_h w1, w2;
  clientpool_grant_t g;
  c.max_live = 1; c.max_idle = 1;
  p = POOL(c);
  k = PKEY(p);
  h = NEW_LEASE(p, k, 0);
  w1 = WAIT(p, k, -1, 0);
  w2 = WAIT(p, k, -1, 0);
  RELEASE(p, h, 1);
  drain(p);
  EXPECT_WAKE(w1);
  EXPECT_NO_WAKE(w2);
  CHECK_EQ(ABANDON(p, w1, 2), 0);
  drain(p);
  EXPECT_WAKE(w2);
  CHECK_STATUS(CLAIM(p, w2, 2, &g), CLIENTPOOL_GRANT_IDLE);
  CHECK_EQ(g.record, h.record);
  CHECK(pstats(p).leases == 1 && pstats(p).idle == 0 && pstats(p).live == 1);
}

static void t_abandon_granted_reservation_forfeited(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  clientpool_grant_t g, g2;
  waiter_h w1, w2;
  clientpool_stats_t s;
  hold_t x;
  c.max_live = 1; c.max_idle = 1;
  p = POOL(c);
  k = PKEY(p);
  CHECK_STATUS(ACQUIRE(p, k, 0, &g), CLIENTPOOL_GRANT_CREATE);
  w1 = WAIT(p, k, -1, 0);
  w2 = WAIT(p, k, -1, 0);
  CHECK_EQ(CREATED(p, g.record, 0, 1), 0);    /* w1 gets the capacity */
  drain(p);
  EXPECT_WAKE(w1);
  CHECK_EQ(pstats(p).creating, 1);
  CHECK_EQ(ABANDON(p, w1, 2), 0);             /* its reservation is forfeited: w2 gets it */
  drain(p);
  EXPECT_WAKE(w2);
  CHECK_STATUS(CLAIM(p, w2, 2, &g2), CLIENTPOOL_GRANT_CREATE);
  CHECK_EQ(CREATED(p, g2.record, 1, 3), 0);
  s = pstats(p);
  CHECK(s.live == 1 && s.creating == 0 && s.leases == 1 && s.waiting == 0);
  CHECK(s.create_failed == 1 && s.cancelled == 1 && s.opened == 1);
  x = hold_of(&g2);
  RELEASE(p, x, 4);                           /* no capacity lost */
  x = REUSE(p, k, 5, NULL);
  CHECK_EQ(x.record, g2.record);
}

/* ===================================================================== */
/* 11. release                                                           */
/* ===================================================================== */

static void t_release_idempotent(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  hold_t h = NEW_LEASE(p, k, 0);
  clientpool_stats_t before, now;
  RELEASE(p, h, 1);
  drain(p);
  before = pstats(p);
  CHECK_STATUS(RELEASE_RAW(p, h.lease, h.gen, -1, 2), CLIENTPOOL_STALE);
  CHECK_STATUS(RELEASE_RAW(p, h.lease, h.gen, CLIENTPOOL_BY_ERROR, 2), CLIENTPOOL_STALE);
  now = pstats(p);
  CHECK(stats_equal(&before, &now));
  CHECK_EQ(clientpool_pending(p), 0);
  CHECK_STATUS(RELEASE_RAW(p, -1, 0, -1, 2), CLIENTPOOL_STALE);
  CHECK_STATUS(RELEASE_RAW(p, 100000, 0, -1, 2), CLIENTPOOL_STALE);
}

static void t_release_stale_cannot_end_new_holder(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  hold_t old = NEW_LEASE(p, k, 0), cur;
  clientpool_stats_t before, now;
  RELEASE(p, old, 1);
  cur = REUSE(p, k, 2, NULL);
  CHECK_EQ(cur.lease, old.lease);           /* the same lease slot ... */
  CHECK(cur.gen != old.gen);                /* ... with a new generation */
  drain(p);
  before = pstats(p);
  CHECK_STATUS(RELEASE_RAW(p, old.lease, old.gen, -1, 3), CLIENTPOOL_STALE);
  CHECK_STATUS(RELEASE_RAW(p, old.lease, old.gen, CLIENTPOOL_BY_ERROR, 3), CLIENTPOOL_STALE);
  CHECK_EQ(LEAK(p, old, 3), CLIENTPOOL_STALE);
  now = pstats(p);
  CHECK(stats_equal(&before, &now));
  CHECK_EQ(clientpool_pending(p), 0);
  CHECK(clientpool_lease_age(p, cur.lease, cur.gen, 3) >= 0);   /* still held */
  CHECK_NEAR(clientpool_lease_age(p, old.lease, old.gen, 3), -1);
  RELEASE(p, cur, 4);
}

static void t_release_reasons(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  hold_t h1 = NEW_LEASE(p, k, 0), h2 = NEW_LEASE(p, k, 0), h3 = NEW_LEASE(p, k, 0);
  drain(p);
  RELEASE_AS(p, h1, CLIENTPOOL_BY_ERROR, 1);
  RELEASE_AS(p, h2, CLIENTPOOL_BY_INVALID, 1);
  RELEASE_AS(p, h3, 77, 1);                 /* out of range: an error */
  drain(p);
  EXPECT_DESTROY(h1.record, CLIENTPOOL_BY_ERROR);
  EXPECT_DESTROY(h2.record, CLIENTPOOL_BY_INVALID);
  EXPECT_DESTROY(h3.record, CLIENTPOOL_BY_ERROR);
  CHECK(pstats(p).live == 0 && pstats(p).closed_by[CLIENTPOOL_BY_ERROR] == 2);
}

/* ===================================================================== */
/* 12. leak and leak_threshold                                           */
/* ===================================================================== */

static void t_leak(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  hold_t h = NEW_LEASE(p, k, 0);
  clientpool_stats_t s, before;
  drain(p);
  CHECK_EQ(LEAK(p, h, 1), 0);
  drain(p);
  EXPECT_DESTROY(h.record, CLIENTPOOL_BY_LEAKED);
  CHECK_EQ(count_ev(CLIENTPOOL_EV_LEAK, -1, 0), 1);  /* one report per collected lease */
  s = pstats(p);
  CHECK(s.leaked == 1 && s.closed_by[CLIENTPOOL_BY_LEAKED] == 1 && s.live == 0 && s.leases == 0);
  CHECK(KSTATS(p, k).leaked == 1);
  before = s;
  CHECK_EQ(LEAK(p, h, 2), CLIENTPOOL_STALE);  /* stale: a no-op */
  CHECK_STATUS(RELEASE_RAW(p, h.lease, h.gen, -1, 2), CLIENTPOOL_STALE);
  s = pstats(p);
  CHECK(stats_equal(&before, &s));
  CHECK_EQ(clientpool_pending(p), 0);
}

/* A finalizer's leak destroys a record and forgets its key while the driver
 * still maps both: neither the record slot nor the key id is reused before
 * the driver has read the EV_DESTROY and EV_KEY_FREE that announce them
 * (until then the key id is STALE, not another key's). */
static void t_ids_reused_only_after_their_event(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p = POOL(c);
  int32_t kx = UKEY(p), ky, k2;
  hold_t hx, hy;
  clientpool_grant_t g;
  hx = NEW_LEASE(p, kx, 0);
  drain(p);
  CHECK_EQ(LEAK(p, hx, 1), 0);          /* kx empty: forgotten; hx's record destroyed */
  CHECK_STATUS(ACQUIRE(p, kx, 2, &g), CLIENTPOOL_STALE);
  ky = KEY_OPEN(p);
  CHECK(ky >= 0 && ky != kx);
  CHECK_STATUS(ACQUIRE(p, ky, 2, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK(g.record != hx.record);
  CHECK_EQ(CREATED(p, g.record, 1, 2), 0);
  hy = hold_of(&g);
  drain(p);                             /* the driver learns of both */
  CHECK(find_ev(CLIENTPOOL_EV_DESTROY, hx.record, CLIENTPOOL_BY_LEAKED, kx) >= 0);
  CHECK(find_ev(CLIENTPOOL_EV_KEY_FREE, kx, -1, -1) >= 0);
  k2 = KEY_OPEN(p);                     /* now they are free to reuse (LIFO) */
  CHECK_EQ(k2, kx);
  CHECK_STATUS(ACQUIRE(p, k2, 3, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK_EQ(g.record, hx.record);
  CHECK_EQ(CREATED(p, g.record, 1, 3), 0);
  RELEASE(p, hy, 4);
  RELEASE(p, hold_of(&g), 4);
  INVARIANTS(p);
}

static void t_leak_threshold_reports_once(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  hold_t h, h2;
  int i;
  c.leak_threshold = 5;
  p = POOL(c);
  k = PKEY(p);
  h = NEW_LEASE(p, k, 1);
  CHECK_NEAR(clientpool_next_deadline(p), 6);
  drain(p);
  TICK(p, 5.9);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_LEAK), 0);
  TICK(p, 6);
  drain(p);
  CHECK_EQ(n_leak(h.lease, h.gen), 1);
  i = find_ev(CLIENTPOOL_EV_LEAK, h.lease, (int32_t)h.gen, k);
  CHECK(i >= 0);
  CHECK_NEAR(g_ev[i].t, 1);                 /* when the lease was granted */
  TICK(p, 100);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_LEAK), 0);  /* once */
  CHECK_EQ(pstats(p).leases, 1);            /* a report, not an end */
  RELEASE(p, h, 101);
  h2 = REUSE(p, k, 102, NULL);              /* released in time: never reported */
  RELEASE(p, h2, 104);
  drain(p);
  TICK(p, 200);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_LEAK), 0);
  CHECK_NEAR(clientpool_next_deadline(p), -1);
}

/* ===================================================================== */
/* 13. retire                                                            */
/* ===================================================================== */

static void t_retire(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  hold_t h1 = NEW_LEASE(p, k, 0), h2 = NEW_LEASE(p, k, 0);
  clientpool_grant_t g;
  RELEASE(p, h1, 1);
  drain(p);
  CHECK_EQ(RETIRE(p, h1.record, 2), 0);     /* idle: destroyed at once */
  drain(p);
  EXPECT_DESTROY(h1.record, CLIENTPOOL_BY_RETIRED);
  CHECK_EQ(RETIRE(p, h1.record, 2), CLIENTPOOL_STALE);
  CHECK_EQ(RETIRE(p, -1, 2), CLIENTPOOL_STALE);
  CHECK_EQ(RETIRE(p, 100000, 2), CLIENTPOOL_STALE);

  CHECK_EQ(RETIRE(p, h2.record, 3), 0);     /* leased: at its release */
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_DESTROY), 0);
  RELEASE(p, h2, 4);
  drain(p);
  EXPECT_DESTROY(h2.record, CLIENTPOOL_BY_RETIRED);

  CHECK_STATUS(ACQUIRE(p, k, 5, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK_EQ(RETIRE(p, g.record, 5), 0);      /* still being created */
  CHECK_EQ(CREATED(p, g.record, 1, 6), 0);
  RELEASE(p, hold_of(&g), 7);
  drain(p);
  EXPECT_DESTROY(g.record, CLIENTPOOL_BY_RETIRED);
  CHECK(pstats(p).closed_by[CLIENTPOOL_BY_RETIRED] == 3 && pstats(p).live == 0);
}

/* ===================================================================== */
/* 14. close                                                             */
/* ===================================================================== */

static void t_close(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k, k2, k3;
  hold_t idle1, held;
  clientpool_grant_t res, g;
  waiter_h w1, w2;
  uint32_t gen;
  clientpool_stats_t s;
  c.max_concurrency = 2;                    /* waiters queue behind it while a record is idle */
  p = POOL(c);
  k = PKEY(p);
  k2 = UKEY(p);
  k3 = PKEY(p);
  held = NEW_LEASE(p, k, 0);
  idle1 = NEW_LEASE(p, k3, 0);
  RELEASE(p, idle1, 1);
  CHECK_STATUS(ACQUIRE(p, k2, 1, &res), CLIENTPOOL_GRANT_CREATE);   /* being created */
  MUST_WAIT(p, k, 1);
  w1 = WAIT(p, k, 50, 1);
  w2 = WAIT(p, k2, -1, 1);
  drain(p);
  s = pstats(p);
  CHECK(s.waiting == 2 && s.idle == 1 && s.leases == 2 && s.creating == 1);

  CLOSE(p, 2);
  drain(p);
  EXPECT_WAKE(w1);
  EXPECT_WAKE(w2);
  EXPECT_DESTROY(idle1.record, CLIENTPOOL_BY_DRAIN);
  CHECK_EQ(n_key_free(k3), 1);              /* close unpins: k3 held only the idle record */
  CHECK_EQ(clientpool_is_closed(p), 1);
  CHECK_STATUS(CLAIM(p, w1, 2, &g), CLIENTPOOL_CLOSED);
  CHECK_NEAR(g.waited, 1);
  CHECK_STATUS(CLAIM(p, w2, 2, &g), CLIENTPOOL_CLOSED);
  s = pstats(p);
  CHECK(s.waiting == 0 && s.idle == 0 && s.wait_count == 2 && s.timeouts == 0 && s.cancelled == 0);
  CHECK(s.closed_by[CLIENTPOOL_BY_DRAIN] == 1);
  CHECK_NEAR(clientpool_next_deadline(p), -1);

  CHECK_STATUS(ACQUIRE(p, k, 3, &g), CLIENTPOOL_CLOSED);
  CHECK_EQ(WAIT_RAW(p, k, -1, 3, &gen), -CLIENTPOOL_CLOSED);
  CHECK_EQ(KEY_OPEN(p), CLIENTPOOL_ECLOSED);

  RELEASE(p, held, 4);                      /* released after close: destroyed */
  drain(p);
  EXPECT_DESTROY(held.record, CLIENTPOOL_BY_DRAIN);
  CHECK_EQ(n_key_free(k), 1);
  CHECK_EQ(CREATED(p, res.record, 1, 5), 0);   /* created after close: a lease ... */
  CHECK(pstats(p).live == 1 && pstats(p).leases == 1);
  RELEASE(p, hold_of(&res), 6);                /* ... destroyed at release */
  drain(p);
  EXPECT_DESTROY(res.record, CLIENTPOOL_BY_DRAIN);
  CHECK_EQ(n_key_free(k2), 1);
  s = pstats(p);
  CHECK(s.live == 0 && s.leases == 0 && s.closed_by[CLIENTPOOL_BY_DRAIN] == 3);
}

static void t_close_destroys_idle_and_is_idempotent(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p), k2 = UKEY(p);
  hold_t a = NEW_LEASE(p, k, 0), b = NEW_LEASE(p, k2, 0), held = NEW_LEASE(p, k, 0);
  clientpool_grant_t g;
  clientpool_stats_t s;
  RELEASE(p, a, 1);
  RELEASE(p, b, 1);
  drain(p);
  CLOSE(p, 2);
  drain(p);
  EXPECT_DESTROY(a.record, CLIENTPOOL_BY_DRAIN);
  EXPECT_DESTROY(b.record, CLIENTPOOL_BY_DRAIN);
  CHECK_EQ(n_key_free(k2), 1);              /* empty keys go */
  s = pstats(p);
  CHECK(s.idle == 0 && s.live == 1 && s.closed_by[CLIENTPOOL_BY_DRAIN] == 2);
  CLOSE(p, 3);                              /* idempotent */
  drain(p);
  CHECK_EQ(g_nev, 0);
  s = pstats(p);
  CHECK(s.closed_by[CLIENTPOOL_BY_DRAIN] == 2);
  RELEASE(p, held, 4);
  drain(p);
  EXPECT_DESTROY(held.record, CLIENTPOOL_BY_DRAIN);
  CHECK_EQ(n_key_free(k), 1);               /* close unpins keys */
  CHECK_STATUS(ACQUIRE(p, k, 5, &g), CLIENTPOOL_CLOSED);
  TICK(p, 100);
  CHECK(pstats(p).live == 0 && pstats(p).leases == 0);
}

static void t_close_with_granted_unclaimed_waiter(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  hold_t h;
  waiter_h w;
  clientpool_grant_t g;
  c.max_live = 1; c.max_idle = 1;
  p = POOL(c);
  k = PKEY(p);
  h = NEW_LEASE(p, k, 0);
  w = WAIT(p, k, -1, 0);
  RELEASE(p, h, 1);                         /* w is granted, not yet claimed */
  CLOSE(p, 2);
  drain(p);
  CHECK_STATUS(CLAIM(p, w, 3, &g), CLIENTPOOL_GRANT_IDLE);   /* keeps its grant */
  RELEASE(p, hold_of(&g), 4);
  drain(p);
  EXPECT_DESTROY(h.record, CLIENTPOOL_BY_DRAIN);
  CHECK(pstats(p).live == 0);
}

/* ===================================================================== */
/* 15. time never runs backwards                                         */
/* ===================================================================== */

static void t_time_never_backwards(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  hold_t h;
  clientpool_grant_t g;
  waiter_h w;
  c.max_live = 1; c.max_idle = 1; c.idle_timeout = 10;
  p = POOL(c);
  k = PKEY(p);
  h = NEW_LEASE(p, k, 10);
  RELEASE(p, h, 5);                         /* 5 < 10: taken as 10 */
  CHECK_NEAR(clientpool_next_deadline(p), 20);
  h = REUSE(p, k, 3, &g);
  CHECK_NEAR(g.idle, 0);
  RELEASE(p, h, 10);
  drain(p);
  TICK(p, 19);
  TICK(p, 0);                               /* backwards: nothing happens */
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_DESTROY), 0);
  CHECK_EQ(pstats(p).idle, 1);
  h = REUSE(p, k, 1, &g);                   /* seen as 19 */
  CHECK_NEAR(g.idle, 9);
  w = WAIT(p, k, 25, 2);                    /* enqueued at 19 */
  TICK(p, 25);
  drain(p);
  EXPECT_WAKE(w);
  CHECK_STATUS(CLAIM(p, w, 25, &g), CLIENTPOOL_TIMEOUT);
  CHECK_NEAR(g.waited, 6);
  CHECK_NEAR(pstats(p).wait_time, 6);
  RELEASE(p, h, 26);
}

static void t_time_nan(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  hold_t h;
  clientpool_grant_t g;
  c.idle_timeout = 10;
  p = POOL(c);
  k = PKEY(p);
  h = NEW_LEASE(p, k, 4);
  RELEASE(p, h, NAN);                       /* NaN: the last time seen (4) */
  CHECK_NEAR(clientpool_next_deadline(p), 14);
  drain(p);
  TICK(p, NAN);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_DESTROY), 0);
  h = REUSE(p, k, NAN, &g);
  CHECK_NEAR(g.idle, 0);
  RELEASE(p, h, 6);
  TICK(p, 1000);                            /* far future: everything idle expires */
  drain(p);
  EXPECT_DESTROY(h.record, CLIENTPOOL_BY_IDLE);
  TICK(p, 7);
  CHECK(pstats(p).live == 0);
}

/* ===================================================================== */
/* 16. stats identities                                                  */
/* ===================================================================== */

static void t_stats_identities(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t keys[3];
  hold_t h[3], x;
  waiter_h w;
  clientpool_grant_t g;
  int i;
  c.max_live = 4; c.max_idle = 3; c.key_max_live = 2; c.max_waiting = 4;
  c.idle_timeout = 20; c.max_lifetime = 50; c.leak_threshold = 10;
  p = POOL(c);
  for (i = 0; i < 3; i++) keys[i] = PKEY(p);
  CHECK_SUMS(p, keys, 3);
  for (i = 0; i < 3; i++) { h[i] = NEW_LEASE(p, keys[i], i); CHECK_SUMS(p, keys, 3); }
  CHECK_STATUS(ACQUIRE(p, keys[0], 3, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK_EQ(CREATED(p, g.record, 0, 3), 0);                /* create failure */
  CHECK_SUMS(p, keys, 3);
  x = NEW_LEASE(p, keys[0], 3);                           /* key 0 at its cap */
  MUST_WAIT(p, keys[0], 3);
  w = WAIT(p, keys[0], 8, 3);
  CHECK_SUMS(p, keys, 3);
  TICK(p, 8);                                             /* timeout */
  CHECK_STATUS(CLAIM(p, w, 8, &g), CLIENTPOOL_TIMEOUT);
  CHECK_SUMS(p, keys, 3);
  MUST_WAIT(p, keys[1], 9);                               /* global cap */
  w = WAIT(p, keys[1], -1, 9);
  CHECK_STATUS(CANCEL(p, w, CLIENTPOOL_CANCELLED, 9, &g), CLIENTPOOL_CANCELLED);
  CHECK_SUMS(p, keys, 3);
  w = WAIT(p, keys[2], -1, 9);
  RELEASE(p, h[0], 10);                                   /* to w (key 2) by eviction */
  CHECK_STATUS(CLAIM(p, w, 10, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK_EQ(CREATED(p, g.record, 1, 10), 0);
  CHECK_SUMS(p, keys, 3);
  RELEASE_AS(p, h[1], CLIENTPOOL_BY_ERROR, 11);
  CHECK_EQ(LEAK(p, x, 11), 0);
  CHECK_SUMS(p, keys, 3);
  TICK(p, 30);                                            /* leak report, nothing else */
  RELEASE(p, hold_of(&g), 31);
  RELEASE(p, h[2], 31);
  x = REUSE(p, keys[2], 32, NULL);
  RELEASE(p, x, 33);
  CHECK_SUMS(p, keys, 3);
  TICK(p, 60);                                            /* idle and lifetime expiry */
  CHECK_SUMS(p, keys, 3);
  CHECK(pstats(p).live == 0);
  CLOSE(p, 61);                             /* unpins and forgets the (empty) keys */
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_KEY_FREE), 3);
  CHECK(pstats(p).opened - pstats(p).closed == pstats(p).live);
}

/* ===================================================================== */
/* 17. scale                                                             */
/* ===================================================================== */

static void t_scale_100k_idle_1k_keys(void) {
  enum { NKEYS = 1000, PER = 100, N = NKEYS * PER, PAIRS = 50000 };
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t *keys = own_mem(sizeof *keys * NKEYS);
  hold_t *h = own_mem(sizeof *h * N);
  long destroys = 0, by_idle = 0, key_frees = 0;
  clientpool_stats_t s;
  int i;
  c.max_live = N; c.max_idle = N; c.max_concurrency = N; c.max_waiting = 16;
  c.max_keys = NKEYS; c.idle_timeout = 100; c.validate_after_idle = 1;
  p = POOL(c);
  g_stride = 1000;
  for (i = 0; i < NKEYS; i++) keys[i] = UKEY(p);
  CHECK_EQ(KEY_OPEN(p), CLIENTPOOL_EKEYS);
  for (i = 0; i < N; i++) {
    h[i] = NEW_LEASE(p, keys[i % NKEYS], 0);
    if (i % 1024 == 0) drain(p);
  }
  for (i = 0; i < N; i++) {
    RELEASE(p, h[i], 1);
    if (i % 1024 == 0) drain(p);
  }
  drain(p);
  INVARIANTS(p);
  s = pstats(p);
  CHECK(s.live == N && s.idle == N && s.opened == N && s.leases == 0);
  CHECK_EQ(KSTATS(p, keys[0]).idle, PER);

  rng_seed(99);
  for (i = 0; i < PAIRS; i++) {
    int32_t k = keys[rng_int(NKEYS)];
    double now = 2 + i * 1e-4;
    hold_t x = REUSE(p, k, now, NULL);
    RELEASE(p, x, now);
    if (i % 1024 == 0) drain(p);
  }
  drain(p);
  INVARIANTS(p);
  s = pstats(p);
  CHECK(s.reused == PAIRS && s.live == N && s.idle == N && s.opened == N && s.closed == 0);

  TICK(p, 1000);
  {
    clientpool_event_t e;
    while (clientpool_next_event(p, &e) != CLIENTPOOL_EV_NONE) {
      if (e.type == CLIENTPOOL_EV_DESTROY) { destroys++; if (e.b == CLIENTPOOL_BY_IDLE) by_idle++; }
      if (e.type == CLIENTPOOL_EV_KEY_FREE) key_frees++;
    }
  }
  INVARIANTS(p);
  CHECK_EQ(destroys, N);
  CHECK_EQ(by_idle, N);
  CHECK_EQ(key_frees, NKEYS);
  s = pstats(p);
  CHECK(s.live == 0 && s.idle == 0 && s.closed == N);
  CHECK_NEAR(clientpool_next_deadline(p), -1);
  for (i = 0; i < NKEYS; i++) CHECK(UKEY(p) >= 0);   /* every id is free again */
  g_stride = 1;
}

/* ===================================================================== */
/* 18. randomized test against a model                                   */
/* ===================================================================== */

/*
 * A seeded PRNG drives FZ_OPS operations in episodes of a few thousand, each
 * on a fresh pool with a small random config (max_live 1..6, up to 8 keys,
 * random caps, durations, jitter, leak_threshold).  Operations: acquire (and
 * wait or give up), created ok/fail, release for reuse or with a reason,
 * leak, wait without acquire, claim, cancel, abandon, retire, tick with
 * advancing (sometimes backwards or NaN) time, key pin/unpin/forget, and
 * deliberately stale lease and waiter handles.
 *
 * The model tracks every lease, reservation and waiter handed out, the
 * state of every record slot it has seen, the open keys, and the time the
 * engine has seen, so it only ever passes valid handles (or stale ones on
 * purpose).  After every call: clientpool_check, and the model cross-checks
 * events and counters (no destroy of a held record, no wake of an unknown
 * waiter, no forgotten key still in use, idle reuse never past idle_timeout,
 * max_lifetime or a retire, counters equal to the events seen, per-key counts
 * summing to the pool's, the driver's timer never later than the next
 * deadline, no waiter left queued past its deadline after a tick).  Each
 * episode ends with close, settling every waiter and lease, and checks that
 * nothing is left.  Every interesting path must be reached at least once.
 */

#define FZ_OPS 200000
#define FZ_NAMES 8
#define FZ_MAXL 64
#define FZ_MAXW 64
#define FZ_MAXR 1024
#define FZ_MAXK 256
#define FZ_DEAD 16

enum { FR_FREE = 0, FR_CREATING, FR_LEASED, FR_RELEASED };   /* model record states */

typedef struct { int32_t l; uint32_t gen; int32_t rec, key; int created, leak_seen; } fz_lease;
typedef struct { int32_t w; uint32_t gen; int32_t key; int woken; double deadline; } fz_waiter;
typedef struct { int32_t a; uint32_t b; } fz_handle;

typedef struct {
  clientpool_t *p;
  clientpool_config_t cfg;
  double now, armed;
  double enow;                  /* the engine's time: the latest time passed in */
  int nnames;
  int32_t name_key[FZ_NAMES];
  int name_pinned[FZ_NAMES];
  int key_name[FZ_MAXK];
  fz_lease L[FZ_MAXL]; int nl;
  fz_waiter W[FZ_MAXW]; int nw;
  int rstate[FZ_MAXR]; int32_t rkey[FZ_MAXR];
  double rcreated[FZ_MAXR];     /* engine time of created(ok) */
  int rretired[FZ_MAXR];        /* retire() was called on it */
  fz_handle dead_l[FZ_DEAD], dead_w[FZ_DEAD]; int ndl, ndw;
  double destroys, by[CLIENTPOOL_BY_COUNT], created, rejected;
} fz_t;

static fz_t fz;

/* what the fuzzer reached, over all episodes: each must be > 0 at the end */
enum { CV_IDLE, CV_CREATE, CV_MUST_WAIT, CV_FULL, CV_EKEYS, CV_WAIT, CV_WAKE, CV_TIMEOUT,
       CV_CLAIM_GRANT, CV_CANCEL_QUEUED, CV_CANCEL_GRANT, CV_ABANDON_QUEUED, CV_ABANDON_WOKEN,
       CV_KEY_FREE, CV_LEAK_EV, CV_CREATE_FAIL, CV_STALE, CV_TIMER, CV_N };
static const char *const cv_name[CV_N] = {
  "grant idle", "grant create", "must wait", "full", "max_keys", "wait", "wake", "timeout",
  "claimed grant", "cancel queued", "cancel granted", "abandon queued", "abandon woken",
  "key free", "leak report", "create failed", "stale handle", "timer"
};
static long fz_cov[CV_N];
static long fz_by_reason[CLIENTPOOL_BY_COUNT];

static void fz_dead_lease(int32_t l, uint32_t gen) {
  fz.dead_l[fz.ndl % FZ_DEAD].a = l; fz.dead_l[fz.ndl % FZ_DEAD].b = gen; fz.ndl++;
}
static void fz_dead_waiter(int32_t w, uint32_t gen) {
  fz.dead_w[fz.ndw % FZ_DEAD].a = w; fz.dead_w[fz.ndw % FZ_DEAD].b = gen; fz.ndw++;
}
static void fz_drop_lease(int i) { fz.L[i] = fz.L[--fz.nl]; }
static void fz_drop_waiter(int i) { fz.W[i] = fz.W[--fz.nw]; }

static void fz_add_lease(const clientpool_grant_t *g, int created) {
  fz_lease *x;
  CHECK(fz.nl < FZ_MAXL);
  x = &fz.L[fz.nl++];
  x->l = g->lease; x->gen = g->lease_gen; x->rec = g->record; x->key = g->key;
  x->created = created; x->leak_seen = 0;
}

/* the model's side of a grant (from acquire, claim or cancel) */
static void fz_grant(const clientpool_grant_t *g, int32_t key) {
  CHECK(g->record >= 0 && g->record < FZ_MAXR && g->lease >= 0);
  CHECK_EQ(g->key, key);
  if (g->status == CLIENTPOOL_GRANT_IDLE) {
    CHECK(fz.rstate[g->record] == FR_RELEASED);     /* only a released record is reused */
    CHECK_EQ(fz.rkey[g->record], key);
    CHECK(g->idle >= 0);
    if (fz.cfg.idle_timeout >= 0) CHECK(g->idle < fz.cfg.idle_timeout);
    if (fz.cfg.validate_after_idle < 0) CHECK(g->validate == 1);
    else CHECK(g->validate == (g->idle >= fz.cfg.validate_after_idle));
    fz.rstate[g->record] = FR_LEASED;
    fz_add_lease(g, 1);
  } else {
    CHECK_STATUS(g->status, CLIENTPOOL_GRANT_CREATE);
    CHECK(fz.rstate[g->record] == FR_FREE);         /* a fresh slot */
    fz.rstate[g->record] = FR_CREATING;
    fz.rretired[g->record] = 0;
    fz.rkey[g->record] = key;
    fz_add_lease(g, 0);
  }
}

static void fz_drain(void) {
  clientpool_event_t e;
  int i;
  while (clientpool_next_event(fz.p, &e) != CLIENTPOOL_EV_NONE) {
    switch (e.type) {
    case CLIENTPOOL_EV_WAKE:
      for (i = 0; i < fz.nw; i++)
        if (fz.W[i].w == e.a && fz.W[i].gen == (uint32_t)e.b) break;
      if (i == fz.nw || fz.W[i].woken)
        fail_at(__FILE__, __LINE__, "EV_WAKE of waiter %d/%d that is not queued", e.a, e.b);
      CHECK_EQ(e.c, fz.W[i].key);
      fz.W[i].woken = 1;
      fz_cov[CV_WAKE]++;
      break;
    case CLIENTPOOL_EV_DESTROY:
      CHECK(e.a >= 0 && e.a < FZ_MAXR && e.b >= 0 && e.b < CLIENTPOOL_BY_COUNT);
      if (fz.rstate[e.a] != FR_RELEASED)   /* never one being created or held */
        fail_at(__FILE__, __LINE__, "EV_DESTROY of record %d in model state %d", e.a, fz.rstate[e.a]);
      CHECK_EQ(e.c, fz.rkey[e.a]);
      fz.rstate[e.a] = FR_FREE;
      fz.destroys++;
      fz.by[e.b]++;
      fz_by_reason[e.b]++;
      break;
    case CLIENTPOOL_EV_TIMER:
      CHECK(e.t >= 0);
      if (fz.armed < 0 || e.t < fz.armed) fz.armed = e.t;
      fz_cov[CV_TIMER]++;
      break;
    case CLIENTPOOL_EV_KEY_FREE: {
      int n;
      CHECK(e.a >= 0 && e.a < FZ_MAXK);
      n = fz.key_name[e.a];
      if (n < 0) fail_at(__FILE__, __LINE__, "EV_KEY_FREE of key %d that is not open", e.a);
      CHECK(!fz.name_pinned[n]);
      for (i = 0; i < fz.nl; i++)
        if (fz.L[i].key == e.a)
          fail_at(__FILE__, __LINE__, "EV_KEY_FREE of key %d while lease %d/%u (record %d, %s) "
                  "is held on it", e.a, fz.L[i].l, (unsigned)fz.L[i].gen, fz.L[i].rec,
                  fz.L[i].created ? "created" : "reservation");
      for (i = 0; i < fz.nw; i++) CHECK(fz.W[i].woken || fz.W[i].key != e.a);
      for (i = 0; i < FZ_MAXR; i++) CHECK(fz.rstate[i] == FR_FREE || fz.rkey[i] != e.a);
      fz.name_key[n] = -1;
      fz.key_name[e.a] = -1;
      fz_cov[CV_KEY_FREE]++;
      break;
    }
    case CLIENTPOOL_EV_LEAK:
      if (e.a == -1) break;                           /* a collected lease's report */
      CHECK(fz.cfg.leak_threshold >= 0);
      CHECK(clientpool_lease_age(fz.p, e.a, (uint32_t)e.b, fz.now) >= fz.cfg.leak_threshold - 1e-9);
      for (i = 0; i < fz.nl; i++)
        if (fz.L[i].l == e.a && fz.L[i].gen == (uint32_t)e.b) {
          CHECK(!fz.L[i].leak_seen);                  /* reported once */
          fz_cov[CV_LEAK_EV]++;
          fz.L[i].leak_seen = 1;
        }
      break;
    case CLIENTPOOL_EV_CREATED:
      CHECK(e.a >= 0 && e.a < FZ_MAXR);
      CHECK(fz.rstate[e.a] == FR_LEASED);
      fz.created++;
      break;
    default:
      fail_at(__FILE__, __LINE__, "unknown event type %d", e.type);
    }
  }
}

/* cross-checks of engine and model after every operation */
static void fz_verify(void) {
  clientpool_stats_t s = pstats(fz.p), sum;
  int i, queued = 0, woken = 0, res = 0, held = 0;
  double d;
  fz_drain();
  for (i = 0; i < fz.nw; i++) { if (fz.W[i].woken) woken++; else queued++; }
  for (i = 0; i < fz.nl; i++) { if (fz.L[i].created) held++; else res++; }
  CHECK_EQ(s.waiting, queued);
  CHECK(s.leases >= res + held && s.leases <= res + held + woken);
  CHECK(s.creating >= res && s.creating <= res + woken);
  CHECK(s.closed == fz.destroys && s.opened == fz.created && s.rejected == fz.rejected);
  CHECK(s.idle <= fz.cfg.max_idle);
  for (i = 0; i < CLIENTPOOL_BY_COUNT; i++) CHECK(s.closed_by[i] == fz.by[i]);
  /* the driver's timer never misses a deadline */
  d = clientpool_next_deadline(fz.p);
  if (d >= 0 && !(fz.armed >= 0 && fz.armed <= d))
    fail_at(__FILE__, __LINE__, "next deadline %g but the timer is armed at %g", d, fz.armed);
  /* the open keys are exactly the model's, and their counts sum to the pool's */
  memset(&sum, 0, sizeof sum);
  for (i = 0; i < fz.nnames; i++) {
    clientpool_stats_t k;
    if (fz.name_key[i] < 0) continue;
    k = KSTATS(fz.p, fz.name_key[i]);
    if (fz.cfg.key_max_idle >= 0) CHECK(k.idle <= fz.cfg.key_max_idle);
    if (fz.cfg.key_max_live >= 0) CHECK(k.live + k.creating <= fz.cfg.key_max_live);
    sum.live += k.live; sum.idle += k.idle; sum.active += k.active;
    sum.leases += k.leases; sum.creating += k.creating; sum.waiting += k.waiting;
  }
  CHECK(sum.live == s.live && sum.idle == s.idle && sum.active == s.active &&
        sum.leases == s.leases && sum.creating == s.creating && sum.waiting == s.waiting);
}

static void fz_advance(void) {
  if (rng_int(10) < 3) fz.now += rng_unit() * 0.2;
}

static double fz_seen(double t) {   /* records a time passed to the engine */
  if (t >= fz.enow) fz.enow = t;
  return t;
}

/* the time passed to a call: usually now, sometimes earlier (clamped) or NaN */
static double fz_time(void) {
  int r = rng_int(50);
  if (r == 0) return fz_seen(fz.now - 1);
  if (r == 1) return NAN;
  return fz_seen(fz.now);
}

static void fz_tick(double t) {
  int i;
  double d;
  fz.armed = -1;                            /* the timer fired */
  TICK(fz.p, fz_seen(t));
  fz_drain();
  for (i = 0; i < fz.nw; i++)
    if (!fz.W[i].woken && fz.W[i].deadline >= 0 && fz.W[i].deadline <= fz.enow)
      fail_at(__FILE__, __LINE__, "waiter %d still queued past its deadline %g (now %g)",
              fz.W[i].w, fz.W[i].deadline, fz.enow);
  d = clientpool_next_deadline(fz.p);
  if (!(d < 0 || d > fz.enow))
    fail_at(__FILE__, __LINE__, "after tick(%g): next deadline %.17g is not in the future (now %.17g)",
            t, d, fz.enow);
}

static int fz_mapped(void) {
  int i, n = 0;
  for (i = 0; i < fz.nnames; i++) if (fz.name_key[i] >= 0) n++;
  return n;
}

/* the key id of a name, opening it if needed; -1 when max_keys keys exist */
static int32_t fz_key(int name) {
  int32_t k = fz.name_key[name];
  if (k >= 0) return k;
  k = KEY_OPEN(fz.p);
  if (k == CLIENTPOOL_EKEYS) {
    CHECK(fz.cfg.max_keys >= 0 && fz_mapped() >= fz.cfg.max_keys);
    fz_cov[CV_EKEYS]++;
    return -1;
  }
  CHECK(k >= 0 && k < FZ_MAXK && fz.key_name[k] < 0);
  CHECK(fz.cfg.max_keys < 0 || fz_mapped() < fz.cfg.max_keys);
  fz.name_key[name] = k;
  fz.key_name[k] = name;
  fz.name_pinned[name] = name == 0 || rng_int(4) == 0;
  if (fz.name_pinned[name]) CHECK_EQ(KEY_PIN(fz.p, k, 1), 0);
  return k;
}

static void fz_wait(int32_t k) {
  uint32_t gen = 0;
  double deadline = rng_int(2) ? -1 : fz.now + rng_unit() * 3;
  int queued = 0, i;
  int32_t w;
  for (i = 0; i < fz.nw; i++) if (!fz.W[i].woken) queued++;
  if (fz.nw >= FZ_MAXW) return;
  w = WAIT_RAW(fz.p, k, deadline, fz_time(), &gen);
  if (w == -CLIENTPOOL_FULL) {
    CHECK(queued >= fz.cfg.max_waiting);
    fz.rejected++;
    return;
  }
  CHECK(w >= 0);
  CHECK(queued < fz.cfg.max_waiting);
  fz_cov[CV_WAIT]++;
  fz.W[fz.nw].w = w; fz.W[fz.nw].gen = gen; fz.W[fz.nw].key = k;
  fz.W[fz.nw].woken = 0; fz.W[fz.nw].deadline = deadline;
  fz.nw++;
}

static void fz_op_acquire(void) {
  int name = rng_int(fz.nnames);
  int32_t k = fz_key(name);
  clientpool_grant_t g;
  int st, i, queued = 0;
  if (k < 0) return;
  if (fz.nl >= FZ_MAXL - 1) return;
  st = ACQUIRE(fz.p, k, fz_time(), &g);
  fz_drain();                               /* evictions come before the grant */
  for (i = 0; i < fz.nw; i++) if (!fz.W[i].woken) queued++;
  switch (st) {
  case CLIENTPOOL_GRANT_IDLE:
  case CLIENTPOOL_GRANT_CREATE:
    fz_cov[st == CLIENTPOOL_GRANT_IDLE ? CV_IDLE : CV_CREATE]++;
    fz_grant(&g, k);
    /* granted now (a waiter's grant may predate a retire or expiry) */
    if (st == CLIENTPOOL_GRANT_IDLE && fz.cfg.max_lifetime >= 0)
      CHECK(fz.enow < fz.rcreated[g.record] + fz.cfg.max_lifetime);
    if (st == CLIENTPOOL_GRANT_IDLE) CHECK(!fz.rretired[g.record]);   /* never reused */
    break;
  case CLIENTPOOL_MUST_WAIT:
    fz_cov[CV_MUST_WAIT]++;
    CHECK(queued < fz.cfg.max_waiting);
    if (rng_int(10) < 7) fz_wait(k);
    else if (KEY_FORGET(fz.p, k)) {         /* the driver gives up (as init.lua does) */
      fz_drain();
      CHECK(fz.name_key[name] < 0);
    }
    break;
  case CLIENTPOOL_FULL:
    fz_cov[CV_FULL]++;
    CHECK(queued >= fz.cfg.max_waiting);
    fz.rejected++;
    break;
  default:
    fail_at(__FILE__, __LINE__, "acquire gave %s", status_name(st));
  }
}

static int fz_pick_lease(int created) {
  int i, n = 0, pick;
  for (i = 0; i < fz.nl; i++) if (fz.L[i].created == created) n++;
  if (!n) return -1;
  pick = rng_int(n);
  for (i = 0; i < fz.nl; i++) if (fz.L[i].created == created && pick-- == 0) return i;
  return -1;
}

static void fz_op_created(void) {
  int i = fz_pick_lease(0);
  fz_lease x;
  if (i < 0) return;
  x = fz.L[i];
  if (rng_int(10) < 8) {
    CHECK_EQ(CREATED(fz.p, x.rec, 1, fz_time()), 0);
    fz.rstate[x.rec] = FR_LEASED;
    fz.rcreated[x.rec] = fz.enow;
    fz.L[i].created = 1;
    CHECK_STATUS(CREATED(fz.p, x.rec, 1, fz_time()), CLIENTPOOL_STALE);
  } else {
    /* no second created() here: records carry no generation in this call, and
     * the freed slot may already be another waiter's reservation */
    fz.rstate[x.rec] = FR_FREE;
    fz_drop_lease(i);
    fz_dead_lease(x.l, x.gen);
    CHECK_EQ(CREATED(fz.p, x.rec, 0, fz_time()), 0);
    fz_cov[CV_CREATE_FAIL]++;
  }
}

static void fz_op_release(int leak) {
  int i = fz_pick_lease(1), r;
  int32_t reason;
  fz_lease x;
  double leaked_before = fz.by[CLIENTPOOL_BY_LEAKED];
  if (i < 0) return;
  x = fz.L[i];
  fz_drop_lease(i);
  fz_dead_lease(x.l, x.gen);
  fz.rstate[x.rec] = FR_RELEASED;           /* set before its DESTROY is drained */
  if (leak) {
    CHECK_EQ(w_leak(fz.p, x.l, x.gen, fz_time(), __FILE__, __LINE__), 0);
    fz_drain();
    CHECK(fz.by[CLIENTPOOL_BY_LEAKED] == leaked_before + 1);
    CHECK(fz.rstate[x.rec] == FR_FREE);
    return;
  }
  r = rng_int(10);
  reason = r < 7 ? -1 : r < 9 ? CLIENTPOOL_BY_ERROR : rng_int(CLIENTPOOL_BY_COUNT + 2);
  CHECK_EQ(RELEASE_RAW(fz.p, x.l, x.gen, reason, fz_time()), 0);
  fz_drain();
  if (reason >= 0) CHECK(fz.rstate[x.rec] == FR_FREE);   /* destroyed at once */
}

static void fz_op_stale(void) {
  clientpool_stats_t before, after_;
  clientpool_grant_t g;
  fz_handle h;
  waiter_h wh;
  fz_drain();
  before = pstats(fz.p);
  /* these calls clamp time even when the handle is stale: fz_seen */
  if (fz.ndl && rng_int(2)) {
    fz_seen(fz.now);
    h = fz.dead_l[rng_int(fz.ndl < FZ_DEAD ? fz.ndl : FZ_DEAD)];
    CHECK_STATUS(RELEASE_RAW(fz.p, h.a, h.b, -1, fz.now), CLIENTPOOL_STALE);
    CHECK_STATUS(w_leak(fz.p, h.a, h.b, fz.now, __FILE__, __LINE__), CLIENTPOOL_STALE);
  } else if (fz.ndw) {
    fz_seen(fz.now);
    h = fz.dead_w[rng_int(fz.ndw < FZ_DEAD ? fz.ndw : FZ_DEAD)];
    wh.w = h.a; wh.gen = h.b;
    CHECK_STATUS(CLAIM(fz.p, wh, fz.now, &g), CLIENTPOOL_STALE);
    CHECK_STATUS(CANCEL(fz.p, wh, CLIENTPOOL_CANCELLED, fz.now, &g), CLIENTPOOL_STALE);
    CHECK_STATUS(ABANDON(fz.p, wh, fz.now), CLIENTPOOL_STALE);
  }
  after_ = pstats(fz.p);
  CHECK(stats_equal(&before, &after_));
  fz_cov[CV_STALE]++;
  CHECK_EQ(clientpool_pending(fz.p), 0);
}

/* claim (mode 0), cancel (1) or abandon (2) a random waiter */
static void fz_op_waiter(int mode) {
  int i, st;
  fz_waiter x;
  waiter_h wh;
  clientpool_grant_t g;
  if (!fz.nw || fz.nl >= FZ_MAXL - 1) return;
  i = rng_int(fz.nw);
  x = fz.W[i];
  wh.w = x.w; wh.gen = x.gen;
  if (mode == 2) {
    fz_drop_waiter(i);
    fz_dead_waiter(x.w, x.gen);
    CHECK_EQ(ABANDON(fz.p, wh, fz_time()), 0);
    fz_cov[x.woken ? CV_ABANDON_WOKEN : CV_ABANDON_QUEUED]++;
    return;
  }
  if (mode == 0) {
    st = CLAIM(fz.p, wh, fz.now, &g);       /* claim reads no time: not "seen" */
    if (!x.woken) { CHECK_STATUS(st, CLIENTPOOL_PENDING); return; }
  } else {
    int want = rng_int(3) == 0 ? 999 : rng_int(2) ? CLIENTPOOL_TIMEOUT : CLIENTPOOL_CANCELLED;
    st = CANCEL(fz.p, wh, want, fz_time(), &g);
    if (!x.woken) {
      CHECK_STATUS(st, want == CLIENTPOOL_TIMEOUT ? CLIENTPOOL_TIMEOUT : CLIENTPOOL_CANCELLED);
      CHECK(g.waited >= 0);
      fz_drop_waiter(i);
      fz_dead_waiter(x.w, x.gen);
      fz_cov[CV_CANCEL_QUEUED]++;
      return;
    }
  }
  fz_drop_waiter(i);
  fz_dead_waiter(x.w, x.gen);
  CHECK(g.waited >= 0);
  if (st == CLIENTPOOL_GRANT_IDLE || st == CLIENTPOOL_GRANT_CREATE) {
    fz_cov[mode == 0 ? CV_CLAIM_GRANT : CV_CANCEL_GRANT]++;
    fz_grant(&g, x.key);
  } else if (st == CLIENTPOOL_TIMEOUT) {
    CHECK(x.deadline >= 0 && x.deadline <= fz.enow);
    fz_cov[CV_TIMEOUT]++;
  }
  else fail_at(__FILE__, __LINE__, "woken waiter gave %s", status_name(st));
}

static void fz_op_retire(void) {
  int32_t cand[FZ_MAXR];
  int i, n = 0;
  for (i = 0; i < FZ_MAXR; i++) if (fz.rstate[i] != FR_FREE) cand[n++] = i;
  if (!n) return;
  i = cand[rng_int(n)];
  CHECK_EQ(RETIRE(fz.p, i, fz_time()), 0);
  fz.rretired[i] = 1;
}

static void fz_op_tick(void) {
  int r = rng_int(10);
  if (r < 6) fz.now += rng_unit() * 0.5;
  else if (r < 8) fz.now += rng_unit() * 2;
  else if (r < 9) fz.now += rng_unit() * 10;
  if (rng_int(20) == 0) { fz_tick(fz.now - 2); return; }   /* backwards: clamped */
  if (rng_int(40) == 0) { fz_tick(NAN); return; }
  fz_tick(fz.now);
}

static void fz_op_keys(void) {
  int name = 1 + rng_int(fz.nnames > 1 ? fz.nnames - 1 : 1);
  int32_t k;
  if (name >= fz.nnames || fz.name_key[name] < 0) return;
  k = fz.name_key[name];
  if (rng_int(2)) {
    int on = !fz.name_pinned[name];
    CHECK_EQ(KEY_PIN(fz.p, k, on), 0);
    fz.name_pinned[name] = on;
    fz_drain();
  } else if (KEY_FORGET(fz.p, k)) {
    fz_drain();
    CHECK(fz.name_key[name] < 0);
  } else {
    fz_drain();
  }
}

static clientpool_config_t fz_config(void) {
  clientpool_config_t c = cfg_base();
  c.max_live = 1 + rng_int(6);
  c.max_idle = rng_int(4) ? c.max_live : rng_int(c.max_live + 1);
  c.min_idle = rng_int(c.max_idle + 1);
  c.max_concurrency = 1 + rng_int(8);
  c.max_waiting = rng_int(7);
  c.key_max_live = rng_int(2) ? -1 : 1 + rng_int(c.max_live);
  c.key_max_idle = rng_int(3) ? -1 : rng_int(c.max_idle + 1);
  c.max_keys = rng_int(3) ? -1 : 1 + rng_int(FZ_NAMES);
  c.idle_timeout = rng_int(3) ? 0.5 + rng_unit() * 10 : -1;
  c.max_lifetime = rng_int(3) ? 1 + rng_unit() * 10 : -1;
  c.lifetime_jitter = rng_int(2) ? rng_unit() * 0.5 : 0;
  c.validate_after_idle = rng_int(2) ? rng_unit() * 2 : -1;
  c.leak_threshold = rng_int(3) ? -1 : 1 + rng_unit() * 5;
  c.seed = rng_u32();
  return c;
}

static void fz_episode_start(void) {
  int i;
  memset(&fz, 0, sizeof fz);
  fz.cfg = fz_config();
  fz.p = POOL(fz.cfg);
  fz.armed = -1;
  fz.now = rng_unit() * 100;
  fz.enow = 0;
  fz.nnames = 1 + rng_int(FZ_NAMES);
  for (i = 0; i < FZ_NAMES; i++) fz.name_key[i] = -1;
  for (i = 0; i < FZ_MAXK; i++) fz.key_name[i] = -1;
}

/* closes the pool, settles every lease and waiter, and checks nothing is left */
static void fz_episode_end(void) {
  clientpool_stats_t s;
  clientpool_grant_t g;
  uint32_t gen;
  int i;
  fz.now += 1;
  for (i = 0; i < FZ_NAMES; i++) fz.name_pinned[i] = 0;    /* close unpins every key */
  CLOSE(fz.p, fz_seen(fz.now));
  fz_drain();
  for (i = 0; i < fz.nw; i++) CHECK(fz.W[i].woken);        /* every queued waiter woken */
  CHECK_EQ(clientpool_is_closed(fz.p), 1);
  CHECK_EQ(KEY_OPEN(fz.p), CLIENTPOOL_ECLOSED);
  for (i = 0; i < fz.nnames; i++)
    if (fz.name_key[i] >= 0) {
      CHECK_STATUS(ACQUIRE(fz.p, fz.name_key[i], fz.now, &g), CLIENTPOOL_CLOSED);
      CHECK_EQ(WAIT_RAW(fz.p, fz.name_key[i], -1, fz.now, &gen), -CLIENTPOOL_CLOSED);
    }
  while (fz.nw) {
    fz_waiter x = fz.W[fz.nw - 1];
    waiter_h wh;
    int st;
    wh.w = x.w; wh.gen = x.gen;
    fz.nw--;
    st = CLAIM(fz.p, wh, fz.now, &g);
    if (st == CLIENTPOOL_GRANT_IDLE || st == CLIENTPOOL_GRANT_CREATE) fz_grant(&g, x.key);
    else CHECK(st == CLIENTPOOL_CLOSED || st == CLIENTPOOL_TIMEOUT);
    fz_drain();
  }
  while (fz.nl) {
    fz_lease x = fz.L[fz.nl - 1];
    if (!x.created) {
      int ok = rng_int(2);
      CHECK_EQ(CREATED(fz.p, x.rec, ok, fz.now), 0);
      fz.rstate[x.rec] = ok ? FR_LEASED : FR_FREE;
      if (!ok) fz.nl--;
      fz_drain();
      if (!ok) continue;
      fz.L[fz.nl - 1].created = 1;
    }
    fz.nl--;
    fz.rstate[x.rec] = FR_RELEASED;
    CHECK_EQ(RELEASE_RAW(fz.p, x.l, x.gen, -1, fz.now), 0);
    fz_drain();
    CHECK(fz.rstate[x.rec] == FR_FREE);                      /* destroyed: BY_DRAIN */
  }
  fz_verify();
  s = pstats(fz.p);
  CHECK(s.live == 0 && s.idle == 0 && s.active == 0 && s.leases == 0);
  CHECK(s.creating == 0 && s.waiting == 0);
  for (i = 0; i < FZ_MAXR; i++) CHECK(fz.rstate[i] == FR_FREE);
  CHECK_EQ(fz_mapped(), 0);                                  /* every key forgotten */
  for (i = 0; i < 64; i++) CHECK(clientpool_stats(fz.p, i, &s) == CLIENTPOOL_EINVAL);
  free_pool(fz.p);
  fz.p = NULL;
}

static void t_fuzz_random_ops(void) {
  const char *env = getenv("CLIENTPOOL_FUZZ_SEED");
  uint64_t seed = env ? strtoull(env, NULL, 10) : 20240601u;
  long op = 0, episodes = 0;
  int i;
  rng_seed(seed);
  memset(fz_cov, 0, sizeof fz_cov);
  memset(fz_by_reason, 0, sizeof fz_by_reason);
  while (op < FZ_OPS) {
    long len = 200 + rng_int(4000), j;
    snprintf(g_ctx, sizeof g_ctx, "fuzz seed %llu, episode %ld start",
             (unsigned long long)seed, episodes);
    fz_episode_start();
    for (j = 0; j < len && op < FZ_OPS; j++, op++) {
      int r = rng_int(100);
      snprintf(g_ctx, sizeof g_ctx, "fuzz seed %llu, episode %ld, op %ld (r=%d)",
               (unsigned long long)seed, episodes, op, r);
      fz_advance();
      /* saturated (every lease taken): mostly release instead of piling up waits */
      if (r < 22 && fz.nl >= fz.cfg.max_concurrency && rng_int(4) != 0) r = 40;
      if (r < 22) fz_op_acquire();
      else if (r < 32) fz_op_created();
      else if (r < 52) fz_op_release(0);
      else if (r < 54) fz_op_release(1);
      else if (r < 57) fz_op_stale();
      else if (r < 60) {                    /* wait without acquire first */
        int name = rng_int(fz.nnames);
        int32_t k = fz_key(name);
        if (k >= 0) fz_wait(k);
      }
      else if (r < 71) fz_op_waiter(0);
      else if (r < 75) fz_op_waiter(1);
      else if (r < 78) fz_op_waiter(2);
      else if (r < 81) fz_op_retire();
      else if (r < 96) fz_op_tick();
      else fz_op_keys();
      fz_verify();
    }
    snprintf(g_ctx, sizeof g_ctx, "fuzz seed %llu, episode %ld end", (unsigned long long)seed, episodes);
    fz_episode_end();
    episodes++;
  }
  g_ctx[0] = 0;
  CHECK(episodes > 10);
  if (getenv("CLIENTPOOL_FUZZ_VERBOSE")) {
    for (i = 0; i < CV_N; i++) fprintf(stderr, "  fuzz %-16s %ld\n", cv_name[i], fz_cov[i]);
    for (i = 0; i < CLIENTPOOL_BY_COUNT; i++) fprintf(stderr, "  fuzz destroy/%d %ld\n", i, fz_by_reason[i]);
  }
  for (i = 0; i < CV_N; i++)
    if (fz_cov[i] == 0) fail_at(__FILE__, __LINE__, "the fuzzer never reached: %s", cv_name[i]);
  for (i = 0; i < CLIENTPOOL_BY_COUNT; i++)
    if (fz_by_reason[i] == 0) fail_at(__FILE__, __LINE__, "the fuzzer never destroyed a record by reason %d", i);
}

/* ===================================================================== */
/* 19. regressions: engine bugs found by this suite                      */
/* ===================================================================== */

/*
 * Bug (fixed by the key hold in clientpool_acquire): an acquire on an
 * unpinned key whose only record is an expired idle one forgot the key in
 * the middle of the call, then reserved a record on the forgotten key.
 * take_idle met the expired record and destroy() called key_maybe_free(k);
 * the key was empty at that moment, so it was freed (EV_KEY_FREE) and
 * reserve() put the new record on a dead key: stats(k) = EINVAL,
 * clientpool_check "record N on dead key K", and the next key_open handed the
 * id (with zeroed counters) to another key.  In the Lua driver: any request
 * for a non-warm key arriving after its last client sat idle past
 * idle_timeout (or max_lifetime) but before the timer task ticked.
 *
 * Expected: DESTROY(BY_IDLE), GRANT_CREATE, and key k still open.
 */
static void t_regress_acquire_expired_idle_keeps_key(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  hold_t h;
  clientpool_grant_t g;
  clientpool_stats_t s;
  char buf[256];
  int st;
  c.idle_timeout = 10;
  p = POOL(c);
  k = UKEY(p);
  h = NEW_LEASE(p, k, 0);
  RELEASE(p, h, 1);
  drain(p);
  st = clientpool_acquire(p, k, 20, &g);    /* raw call: checked step by step below */
  drain(p);
  CHECK_STATUS(st, CLIENTPOOL_GRANT_CREATE);
  EXPECT_DESTROY(h.record, CLIENTPOOL_BY_IDLE);
  CHECK_MSG(n_key_free(k) == 0,
            "expected key k to stay open (the acquire is reserving a record on it); "
            "got EV_KEY_FREE(k) from inside clientpool_acquire");
  CHECK_MSG(clientpool_stats(p, k, &s) == 0 && s.creating == 1,
            "expected stats(k) to show the reservation; got EINVAL (key forgotten)");
  CHECK_MSG(clientpool_check(p, buf, sizeof buf) == 0, buf);
  CHECK_EQ(CREATED(p, g.record, 0, 21), 0); /* now empty: forgotten */
  drain(p);
  CHECK_EQ(n_key_free(k), 1);

  /* the same through max_lifetime */
  c.idle_timeout = -1; c.max_lifetime = 5;
  p = POOL(c);
  k = UKEY(p);
  h = NEW_LEASE(p, k, 0);
  RELEASE(p, h, 1);
  drain(p);
  CHECK_STATUS(ACQUIRE(p, k, 6, &g), CLIENTPOOL_GRANT_CREATE);
  drain(p);
  EXPECT_DESTROY(h.record, CLIENTPOOL_BY_LIFETIME);
  CHECK_EQ(n_key_free(k), 0);
}

/*
 * Bug (fixed by counting waiter slots per key, key_t_.wrefs): a key was
 * forgotten while a resolved but unclaimed waiter still named it, and that
 * waiter's claim later forgot whichever key had reused the id.  Two waiters
 * of key A time out in one tick; claiming the first forgot A (only queued
 * waiters were counted); key_open handed A's id to a new key K; claiming the
 * second waiter then forgot K under its owner, and acquire(K) said STALE.
 *
 * Expected: A stays until its last waiter slot is claimed; K survives.
 */
static void t_regress_key_kept_for_unclaimed_waiter(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t a, b, k2;
  waiter_h w1, w2;
  clientpool_grant_t g;
  hold_t hb;
  c.max_live = 1; c.max_idle = 1;
  p = POOL(c);
  b = PKEY(p);
  a = UKEY(p);
  hb = NEW_LEASE(p, b, 0);                  /* fills max_live */
  MUST_WAIT(p, a, 0);
  w1 = WAIT(p, a, 5, 0);
  w2 = WAIT(p, a, 5, 0);
  TICK(p, 5);
  drain(p);
  EXPECT_WAKE(w1);
  EXPECT_WAKE(w2);
  CHECK_STATUS(CLAIM(p, w1, 5, &g), CLIENTPOOL_TIMEOUT);
  drain(p);
  CHECK_MSG(n_key_free(a) == 0, "expected key a to stay while w2 is unclaimed; got EV_KEY_FREE(a)");
  CHECK_EQ(KEY_FORGET(p, a), 0);
  k2 = KEY_OPEN(p);
  CHECK(k2 >= 0 && k2 != a);
  CHECK_STATUS(CLAIM(p, w2, 5, &g), CLIENTPOOL_TIMEOUT);
  drain(p);
  CHECK_EQ(n_key_free(a), 1);               /* the last slot naming a is gone */
  CHECK_MSG(n_key_free(k2) == 0,
            "expected the claim of an old waiter of key a to leave the new key k2 alone; "
            "got EV_KEY_FREE(k2)");
  RELEASE(p, hb, 6);
  CHECK_MSG(ACQUIRE(p, k2, 6, &g) != CLIENTPOOL_STALE,
            "expected acquire on the freshly opened key to grant; got STALE (key forgotten)");
}

/*
 * Bug (found by spec/c/fuzz_engine.c; fixed by the key_refresh in take_open):
 * with capacity > 1, take_open retired a shared record it found stale (past
 * max_lifetime or retired by age) and took it out of its key's open heap,
 * but left the key sorted as "has an open record".  When that key's head
 * waiter then could not create either (its key cap), dispatch saw the same
 * key first again and stopped: a waiter of another key that could be served
 * stayed queued (and clientpool_check: "ready-heap membership wrong").
 * Regression input: spec/c/regress/take-open-stale-ready-heap.
 *
 * Expected: the waiter of key j is served when a lease frees.
 */
static void t_regress_take_open_stale_key_starves_others(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k, j, x;
  hold_t hx;
  waiter_h w1, w2;
  c.capacity = 2; c.max_live = 4; c.max_idle = 4; c.max_concurrency = 2; c.key_max_live = 1;
  p = POOL(c);
  k = PKEY(p); j = PKEY(p); x = PKEY(p);
  (void)NEW_LEASE(p, k, 0);                 /* k's only record, open for one more share */
  hx = NEW_LEASE(p, x, 0);                  /* max_concurrency reached */
  CHECK_EQ(clientpool_retire_before(p, -1, -1, 1), 0);   /* k's record: retired by age */
  INVARIANTS(p);
  MUST_WAIT(p, k, 1);
  w1 = WAIT(p, k, -1, 1);
  MUST_WAIT(p, j, 2);
  w2 = WAIT(p, j, -1, 2);
  drain(p);
  RELEASE_AS(p, hx, CLIENTPOOL_BY_ERROR, 3);  /* w1 cannot be served (k is at its cap), w2 can */
  drain(p);
  CHECK_MSG(n_wake(w2.w, w2.gen) == 1,
            "expected the waiter of key j to be served; it was left queued behind key k");
  EXPECT_NO_WAKE(w1);
}

/*
 * Bug (found by spec/c/fuzz_engine.c; fixed by the key_refresh in
 * clientpool_refill): a refill reservation that brought a warm key to its
 * key_max_live left the key sorted as "can create", so dispatch picked it,
 * could not reserve, and stopped: waiters of other keys were left queued.
 * Regression input: spec/c/regress/refill-stale-ready-heap.
 */
static void t_regress_refill_at_cap_starves_others(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k, j, x, kk = -1, r;
  hold_t hx;
  waiter_h w1, w2;
  c.max_live = 4; c.max_idle = 4; c.min_idle = 1; c.max_concurrency = 1; c.key_max_live = 1;
  p = POOL(c);
  k = UKEY(p); j = PKEY(p); x = PKEY(p);
  CHECK_EQ(KEY_PIN(p, k, 2), 0);            /* warm */
  hx = NEW_LEASE(p, x, 0);                  /* max_concurrency reached */
  MUST_WAIT(p, k, 1);
  w1 = WAIT(p, k, -1, 1);
  MUST_WAIT(p, j, 1);
  w2 = WAIT(p, j, -1, 1);
  clientpool_floor(p, 1, 1);
  INVARIANTS(p);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_REFILL), 1);
  r = clientpool_refill(p, 1, &kk);
  CHECK(r >= 0 && kk == k);                 /* k is now at its cap */
  INVARIANTS(p);
  drain(p);
  RELEASE_AS(p, hx, CLIENTPOOL_BY_ERROR, 2);
  drain(p);
  CHECK_MSG(n_wake(w2.w, w2.gen) == 1,
            "expected the waiter of key j to be served; it was left queued behind key k");
  EXPECT_NO_WAKE(w1);
}

/* ===================================================================== */
/* 20. gates, keys, retire_before, shared records, queries: the edges     */
/* ===================================================================== */

static void t_gate_states_and_probe(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  hold_t h;
  clientpool_grant_t g;
  waiter_h w;
  p = POOL(c);
  k = PKEY(p);
  CHECK_EQ(clientpool_gate(p, -1), 0);
  CHECK_EQ(clientpool_gate(p, k), 0);
  CHECK_EQ(clientpool_gate(p, 999), 0);     /* unknown key: open */
  CHECK_EQ(clientpool_pause(p, 999, 0), CLIENTPOOL_EINVAL);
  CHECK_EQ(clientpool_resume(p, 999, 0, 0), CLIENTPOOL_EINVAL);
  CHECK_EQ(clientpool_pause(p, -1, 0), 0);
  CHECK_EQ(clientpool_gate(p, -1), 1);
  CHECK_EQ(clientpool_resume(p, -1, 1, 0), 0);
  CHECK_EQ(clientpool_gate(p, -1), 2);      /* half-open */
  CHECK_EQ(clientpool_resume(p, -1, 0, 0), 0);
  CHECK_EQ(clientpool_gate(p, -1), 2);      /* resume of an open gate changes nothing */
  h = NEW_LEASE(p, k, 1);                   /* the probe */
  MUST_WAIT(p, k, 1);                       /* admitted alone */
  w = WAIT(p, k, -1, 1);
  CHECK_EQ(clientpool_probe_ok(p, h.lease, h.gen + 1, 2), 0);   /* stale handle */
  CHECK_EQ(clientpool_probe_ok(p, h.lease, h.gen, 2), 1);
  INVARIANTS(p);
  CHECK_EQ(clientpool_gate(p, -1), 0);
  drain(p);
  EXPECT_WAKE(w);                           /* the gate opened: w creates */
  CHECK_STATUS(CLAIM(p, w, 2, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK_EQ(clientpool_pause(p, k, 3), 0);
  CHECK_EQ(clientpool_gate(p, k), 1);
  CHECK_EQ(clientpool_resume(p, k, 0, 3), 0);
  CHECK_EQ(clientpool_gate(p, k), 0);
  RELEASE(p, h, 4);
}

static void t_key_pin_modes(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t a, b, d, r, kk;
  c.min_idle = 1;
  p = POOL(c);
  a = UKEY(p); b = UKEY(p); d = UKEY(p);
  CHECK_EQ(KEY_PIN(p, 999, 1), CLIENTPOOL_EINVAL);
  CHECK_EQ(KEY_PIN(p, a, -5), 0);           /* out of range: pinned */
  CHECK_EQ(KEY_FORGET(p, a), 0);
  CHECK_EQ(KEY_PIN(p, a, 7), 0);            /* still pinned: no change */
  CHECK_EQ(KEY_PIN(p, a, 2), 0);            /* three warm keys */
  CHECK_EQ(KEY_PIN(p, b, 2), 0);
  CHECK_EQ(KEY_PIN(p, d, 2), 0);
  CHECK_EQ(KEY_PIN(p, b, 1), 0);            /* b leaves the warm list from its middle */
  CHECK_EQ(KEY_PIN(p, d, 0), 0);            /* d leaves it and is forgotten */
  drain(p);
  CHECK_EQ(n_key_free(d), 1);
  clientpool_floor(p, 1, 0);
  INVARIANTS(p);
  r = clientpool_refill(p, 0, &kk);
  CHECK(r >= 0 && kk == a);                 /* only a is warm */
  CHECK_EQ(CREATED(p, r, 1, 0), 0);
  CHECK_EQ(clientpool_refill(p, 0, &kk), -1);
  CHECK_EQ(KSTATS(p, b).idle, 0);
}

/* regrant: validate failed on idle reuse; the record is destroyed and the
 * same caller granted again ahead of the queue (an idle record, else a
 * reservation where there is room); at max_live the room comes when the
 * destroy is reported, and the caller keeps its place until then. */
static void t_regrant_keeps_place(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t a;
  hold_t h1, h2;
  clientpool_grant_t g;
  waiter_h w;
  c.max_live = 2; c.max_idle = 2; c.max_concurrency = 2;
  p = POOL(c);
  a = PKEY(p);
  h1 = NEW_LEASE(p, a, 0);
  h2 = NEW_LEASE(p, a, 0);
  RELEASE(p, h1, 1);
  h1 = REUSE(p, a, 2, &g);                   /* the caller whose validate fails */
  MUST_WAIT(p, a, 2); w = WAIT(p, a, -1, 2); /* queued behind it */
  drain(p);
  CHECK_EQ(clientpool_regrant(p, h1.lease, h1.gen, 3, &g), CLIENTPOOL_MUST_WAIT);
  drain(p);
  EXPECT_DESTROY(h1.record, CLIENTPOOL_BY_INVALID);
  CHECK_EQ(pstats(p).closing, 1);            /* still counts: max_live is reached */
  CHECK_EQ(clientpool_destroyed(p, h1.record, 3), 0);
  drain(p);
  EXPECT_NO_WAKE(w);                         /* the room is kept for the same caller */
  CHECK_STATUS(ACQUIRE(p, a, 3, &g), CLIENTPOOL_GRANT_CREATE);   /* past w: its place */
  drain(p);
  EXPECT_NO_WAKE(w);
  CHECK_EQ(CREATED(p, g.record, 1, 3), 0);
  h1 = hold_of(&g);
  CHECK_EQ(clientpool_regrant(p, h1.lease, h1.gen ^ 1u, 3, &g), CLIENTPOOL_STALE);
  RELEASE(p, h2, 4);                         /* the waiter gets the other one */
  drain(p);
  EXPECT_WAKE(w);
  CHECK_STATUS(CLAIM(p, w, 4, &g), CLIENTPOOL_GRANT_IDLE);
  h2 = hold_of(&g);
  /* an idle record of the key is taken before a reservation */
  RELEASE(p, h2, 5);
  CHECK_EQ(clientpool_regrant(p, h1.lease, h1.gen, 6, &g), CLIENTPOOL_GRANT_IDLE);
  CHECK_EQ(g.record, h2.record);
  h1 = hold_of(&g);
  /* release_closes: an ordinary lease is kept; a retired one is closed */
  CHECK_EQ(clientpool_release_closes(p, h1.lease, h1.gen, 6), 0);
  CHECK_EQ(clientpool_release_closes(p, h1.lease, h1.gen ^ 1u, 6), -CLIENTPOOL_STALE);
  CHECK_EQ(clientpool_retire(p, h1.record, 6), 0);
  CHECK_EQ(clientpool_release_closes(p, h1.lease, h1.gen, 6), 1);
  /* closed meanwhile: destroyed all the same, the caller gets CLOSED */
  CLOSE(p, 7);
  CHECK_EQ(clientpool_regrant(p, h1.lease, h1.gen, 7, &g), CLIENTPOOL_CLOSED);
  CHECK_EQ(pstats(p).live, 0);
  CHECK_EQ(pstats(p).leases, 0);
}

/* retire_upto: the record and every older record of its key, by creation
 * order, even when all were created at the same instant. */
static void t_retire_upto(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t a, b;
  hold_t h1, h2, h3, h4, hb;
  c.max_live = 5; c.max_idle = 5; c.max_concurrency = 5;
  p = POOL(c);
  a = PKEY(p); b = PKEY(p);
  h1 = NEW_LEASE(p, a, 1);                  /* all created at t = 1 */
  h2 = NEW_LEASE(p, a, 1);
  h3 = NEW_LEASE(p, a, 1);
  h4 = NEW_LEASE(p, a, 1);
  hb = NEW_LEASE(p, b, 1);
  RELEASE(p, h1, 1);
  RELEASE(p, h4, 1);
  RELEASE(p, hb, 1);
  drain(p);
  CHECK_EQ(clientpool_retire_upto(p, -1, 2), CLIENTPOOL_EINVAL);
  CHECK_EQ(clientpool_retire_upto(p, 999, 2), CLIENTPOOL_EINVAL);
  CHECK_EQ(clientpool_retire_upto(p, h3.record, 2), 0);  /* h3 leased: h1, h2 are older */
  drain(p);
  EXPECT_DESTROY(h1.record, CLIENTPOOL_BY_RETIRED);        /* idle: at once */
  CHECK_EQ(n_events(CLIENTPOOL_EV_DESTROY), 1);           /* h4 (younger) and b's stay */
  RELEASE(p, h2, 3);
  RELEASE(p, h3, 3);
  drain(p);
  EXPECT_DESTROY(h2.record, CLIENTPOOL_BY_RETIRED);        /* leased: at release */
  EXPECT_DESTROY(h3.record, CLIENTPOOL_BY_RETIRED);
  CHECK_EQ(n_events(CLIENTPOOL_EV_DESTROY), 2);
  CHECK_EQ(KSTATS(p, a).idle, 1);
  CHECK_EQ(KSTATS(p, b).idle, 1);
  CHECK_EQ(clientpool_retire_upto(p, h4.record, 4), 0);  /* an idle record itself */
  drain(p);
  EXPECT_DESTROY(h4.record, CLIENTPOOL_BY_RETIRED);
  CHECK_EQ(clientpool_retire_upto(p, h4.record, 4), CLIENTPOOL_EINVAL);  /* gone */
  CHECK_EQ(pstats(p).live, 1);
}

static void t_retire_before_variants(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t a, b;
  hold_t h1, h2, h3;
  clientpool_grant_t g;
  p = POOL(c);
  a = PKEY(p); b = PKEY(p);
  h1 = NEW_LEASE(p, a, 1);
  h2 = NEW_LEASE(p, a, 2);
  h3 = NEW_LEASE(p, b, 3);
  RELEASE(p, h1, 4);
  RELEASE(p, h2, 4);
  RELEASE(p, h3, 4);
  drain(p);
  CHECK_EQ(clientpool_retire_before(p, 999, 1, 5), CLIENTPOOL_EINVAL);
  CHECK_EQ(clientpool_retire_before(p, a, 1.5, 5), 0);   /* a's record created at 1 */
  drain(p);
  EXPECT_DESTROY(h1.record, CLIENTPOOL_BY_RETIRED);
  CHECK_EQ(n_events(CLIENTPOOL_EV_DESTROY), 1);
  CHECK_EQ(clientpool_retire_before(p, a, 1.0, 5), 0);   /* earlier than before: no change */
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_DESTROY), 0);
  CHECK_EQ(clientpool_retire_before(p, -1, 2.5, 5), 0);  /* the pool: a's second record */
  drain(p);
  EXPECT_DESTROY(h2.record, CLIENTPOOL_BY_RETIRED);
  CHECK_EQ(clientpool_retire_before(p, -1, 2.0, 5), 0);  /* earlier: no change */
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_DESTROY), 0);
  h1 = REUSE(p, b, 6, &g);                  /* b's record, leased */
  CHECK_EQ(clientpool_retire_before(p, b, -1, 6), 0);    /* every record of b so far */
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_DESTROY), 0);          /* leased: at release */
  RELEASE(p, h1, 7);
  drain(p);
  EXPECT_DESTROY(h3.record, CLIENTPOOL_BY_RETIRED);
  h2 = NEW_LEASE(p, b, 7);                  /* created after: survives */
  RELEASE(p, h2, 8);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_DESTROY), 0);
  h2 = NEW_LEASE(p, a, 9);
  CHECK_EQ(clientpool_retire_before(p, -1, -1, 9), 0);   /* every record of the pool so far */
  RELEASE(p, h2, 10);
  drain(p);
  EXPECT_DESTROY(h2.record, CLIENTPOOL_BY_RETIRED);
  CHECK_EQ(pstats(p).idle, 0);              /* b's idle one went at once */
}

/* A refill reservation retired before its client exists goes idle marked,
 * and the first acquire that meets it destroys it. */
static void t_retired_refill_is_not_reused(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k, kk, r;
  clientpool_grant_t g;
  c.min_idle = 1;
  p = POOL(c);
  k = UKEY(p);
  CHECK_EQ(KEY_PIN(p, k, 2), 0);
  clientpool_floor(p, 1, 0);
  r = clientpool_refill(p, 0, &kk);
  CHECK(r >= 0 && kk == k);
  CHECK_EQ(RETIRE(p, r, 0), 0);
  CHECK_EQ(CREATED(p, r, 1, 1), 0);
  CHECK_EQ(KSTATS(p, k).idle, 1);
  drain(p);
  CHECK_STATUS(ACQUIRE(p, k, 2, &g), CLIENTPOOL_GRANT_CREATE);
  drain(p);
  EXPECT_DESTROY(r, CLIENTPOOL_BY_RETIRED);
  CHECK_EQ(CREATED(p, g.record, 1, 2), 0);
}

/* The floor signals only for warm keys; a closed pool never refills. */
static void t_floor_edges(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k, kk;
  hold_t h;
  c.min_idle = 1; c.max_live = 1; c.max_idle = 1;
  p = POOL(c);
  k = PKEY(p);                              /* pinned, not warm */
  clientpool_floor(p, 1, 0);
  h = NEW_LEASE(p, k, 0);
  RELEASE_AS(p, h, CLIENTPOOL_BY_ERROR, 1);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_REFILL), 0);
  CHECK_EQ(KEY_PIN(p, k, 2), 0);
  h = NEW_LEASE(p, k, 1);                   /* max_live reached: no room to refill */
  CHECK_EQ(clientpool_refill(p, 1, &kk), -1);
  RELEASE(p, h, 2);
  CLOSE(p, 3);
  clientpool_floor(p, 1, 3);
  CHECK_EQ(clientpool_refill(p, 3, &kk), -1);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_REFILL), 0);
}

static void t_queries_and_stale_handles(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  hold_t h;
  p = POOL(c);
  k = PKEY(p);
  CHECK_EQ(clientpool_record_key(p, -1), -1);
  CHECK_EQ(clientpool_record_key(p, 1 << 20), -1);
  CHECK(clientpool_record_created(p, -1) < 0);
  CHECK(clientpool_record_created(p, 1 << 20) < 0);
  CHECK(clientpool_lease_age(p, -1, 0, 0) < 0);
  CHECK(clientpool_lease_age(p, 1 << 20, 0, 0) < 0);
  CHECK_STATUS(CREATED(p, -1, 1, 0), CLIENTPOOL_STALE);
  CHECK_STATUS(CREATED(p, 1 << 20, 1, 0), CLIENTPOOL_STALE);
  h = NEW_LEASE(p, k, 2);
  CHECK_EQ(clientpool_record_key(p, h.record), k);
  CHECK(clientpool_record_created(p, h.record) == 2);
  CHECK(clientpool_lease_age(p, h.lease, h.gen, 5) == 3);
  CHECK(clientpool_lease_age(p, h.lease, h.gen + 1, 5) < 0);
  CHECK_STATUS(CREATED(p, h.record, 1, 2), CLIENTPOOL_STALE);   /* already created */
  RELEASE_AS(p, h, CLIENTPOOL_BY_ERROR, 3);
  CHECK_EQ(clientpool_record_key(p, h.record), -1);  /* free slot */
  CHECK(clientpool_record_created(p, h.record) < 0);
  CHECK(clientpool_lease_age(p, h.lease, h.gen, 5) < 0);
  CHECK_EQ(clientpool_probe_ok(p, h.lease, h.gen, 5), 0);
}

/* capacity > 1: every share goes to an open record with the fewest leases;
 * one holder's loss dooms the record for all (EV_LOST once), and the last
 * release destroys it with the first loss's reason. */
static void t_shared_fewest_leases_and_loss(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k, r;
  hold_t held[24], h1, h2, h3;
  clientpool_grant_t g;
  int n = 0, i, step;
  c.capacity = 3; c.max_live = 4; c.max_idle = 4; c.max_concurrency = 12;
  p = POOL(c);
  k = PKEY(p);
  rng_seed(7);
  for (step = 0; step < 3000; step++) {
    if (n < 12 && (n == 0 || rng_int(3) != 0)) {
      int st = ACQUIRE(p, k, 0, &g), min = 99;
      CHECK(st == CLIENTPOOL_GRANT_IDLE || st == CLIENTPOOL_GRANT_CREATE);
      if (st == CLIENTPOOL_GRANT_CREATE) {
        CHECK_EQ(CREATED(p, g.record, 1, 0), 0);
      } else if (g.shared) {
        /* the record chosen had (before this lease) the fewest leases among open ones */
        for (r = 0; r < wb_nrec(p); r++)
          if (r != g.record && wb_rec_state(p, r) == WB_LEASED && wb_rec_nleases(p, r) < c.capacity &&
              wb_rec_nleases(p, r) < min) min = wb_rec_nleases(p, r);
        CHECK(wb_rec_nleases(p, g.record) - 1 <= min);
      }
      held[n++] = hold_of(&g);
    } else {
      i = rng_int(n);
      RELEASE(p, held[i], 0);
      held[i] = held[--n];
    }
    drain(p);
  }
  while (n) RELEASE(p, held[--n], 0);
  /* three holders of one record */
  p = POOL(c);
  k = PKEY(p);
  h1 = NEW_LEASE(p, k, 1);
  CHECK_STATUS(ACQUIRE(p, k, 1, &g), CLIENTPOOL_GRANT_IDLE);
  h2 = hold_of(&g);
  CHECK_STATUS(ACQUIRE(p, k, 1, &g), CLIENTPOOL_GRANT_IDLE);
  h3 = hold_of(&g);
  CHECK(h2.record == h1.record && h3.record == h1.record);
  drain(p);
  RELEASE_AS(p, h1, CLIENTPOOL_BY_ERROR, 2);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_LOST), 1);
  RELEASE_AS(p, h2, CLIENTPOOL_BY_INVALID, 2);  /* doomed already: no second EV_LOST */
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_LOST), 0);
  RELEASE(p, h3, 3);
  drain(p);
  EXPECT_DESTROY(h1.record, CLIENTPOOL_BY_ERROR);
}

/* capacity > 1: a shared record past max_lifetime takes no new share after
 * the tick (and none at acquire even before it). */
static void t_shared_lifetime(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  hold_t h1, h2, h3;
  clientpool_grant_t g;
  c.capacity = 2; c.max_lifetime = 10;
  p = POOL(c);
  k = PKEY(p);
  h1 = NEW_LEASE(p, k, 0);
  TICK(p, 10);                              /* leased: retired, destroyed at release */
  CHECK_STATUS(ACQUIRE(p, k, 10, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK(g.record != h1.record);
  CHECK_EQ(CREATED(p, g.record, 1, 10), 0);
  h2 = hold_of(&g);
  CHECK_STATUS(ACQUIRE(p, k, 20, &g), CLIENTPOOL_GRANT_CREATE);  /* h2's is expired, not ticked */
  CHECK(g.record != h2.record);
  CHECK_EQ(CREATED(p, g.record, 1, 20), 0);
  h3 = hold_of(&g);
  drain(p);
  RELEASE(p, h1, 21);
  RELEASE(p, h2, 21);
  RELEASE(p, h3, 21);
  drain(p);
  EXPECT_DESTROY(h1.record, CLIENTPOOL_BY_LIFETIME);
  EXPECT_DESTROY(h2.record, CLIENTPOOL_BY_LIFETIME);
  CHECK_EQ(pstats(p).idle, 1);
}

/* ===================================================================== */
/* 21. out of memory (spec/c/whitebox.c fails allocations on demand)      */
/* ===================================================================== */

/* Every allocation failure leaves a consistent engine that works on once
 * memory is back: the call reports ENOMEM, or degrades as documented (a
 * deadline or leak report lost, a reservation or grant not made). */
static void t_oom_new_keys_waiters(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p = NULL;
  int32_t k, n;
  hold_t h;
  uint32_t gen;
  char buf[256];
  wb_alloc_fail(1);
  CHECK_EQ(clientpool_new(&c, &p), CLIENTPOOL_ENOMEM);
  CHECK(p == NULL);
  for (n = 1; n <= 3; n++) {                /* keys, then either ready heap */
    p = POOL(c);
    wb_alloc_fail(n);
    CHECK_EQ(clientpool_key_open(p), CLIENTPOOL_ENOMEM);
    wb_alloc_fail(0);
    INVARIANTS(p);
    k = PKEY(p);
    (void)NEW_LEASE(p, k, 0);
  }
  wb_alloc_fail(1);                         /* the warm list */
  CHECK_EQ(KEY_PIN(p, k, 2), CLIENTPOOL_ENOMEM);
  CHECK_EQ(KEY_PIN(p, k, 2), 0);
  wb_alloc_fail(1);                         /* clientpool_check's own scratch */
  CHECK_EQ(clientpool_check(p, buf, sizeof buf), -1);
  CHECK(strstr(buf, "out of memory") != NULL);
  c.max_live = 1; c.max_idle = 1;
  p = POOL(c);
  k = PKEY(p);
  h = NEW_LEASE(p, k, 0);
  MUST_WAIT(p, k, 0);
  wb_alloc_fail(1);                         /* the key's queue */
  CHECK_EQ(WAIT_RAW(p, k, -1, 0, &gen), CLIENTPOOL_ENOMEM);
  wb_alloc_fail(2);                         /* (the queue again, then) the waiter array */
  CHECK_EQ(WAIT_RAW(p, k, -1, 0, &gen), CLIENTPOOL_ENOMEM);
  (void)WAIT(p, k, -1, 0);
  RELEASE(p, h, 1);
}

static void t_oom_records_leases_deadlines(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k, r, kk, x;
  hold_t h, held[8];
  clientpool_grant_t g;
  waiter_h w;
  int i;
  /* the first reserve: record array, then lease array */
  for (i = 1; i <= 2; i++) {
    p = POOL(c);
    k = PKEY(p);
    wb_alloc_fail(i);
    CHECK_STATUS(ACQUIRE(p, k, 0, &g), CLIENTPOOL_MUST_WAIT);
    (void)NEW_LEASE(p, k, 0);
  }
  /* deadlines: a lease's leak report, a record's lifetime, a waiter's deadline */
  c.leak_threshold = 5; c.max_lifetime = 50; c.max_live = 1; c.max_idle = 1;
  p = POOL(c);
  k = PKEY(p);
  wb_alloc_fail(3);                         /* record, lease, then the deadline heap */
  CHECK_STATUS(ACQUIRE(p, k, 0, &g), CLIENTPOOL_GRANT_CREATE);
  wb_alloc_fail(1);
  CHECK_EQ(CREATED(p, g.record, 1, 0), 0);  /* its lifetime is lost */
  h = hold_of(&g);
  MUST_WAIT(p, k, 0);
  wb_alloc_fail(3);                         /* the key's queue, waiter array, then the heap */
  w = WAIT(p, k, 1, 0);
  CHECK(clientpool_next_deadline(p) < 0);   /* nothing armed */
  TICK(p, 100);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_WAKE) + n_events(CLIENTPOOL_EV_LEAK), 0);
  RELEASE(p, h, 100);
  drain(p);
  EXPECT_WAKE(w);                           /* served, though past its deadline */
  /* take_idle and reserve when the lease array is full: a warm floor record
   * (no lease) is idle while eight leases fill the array */
  c = cfg_base();
  c.max_live = 10; c.max_idle = 10; c.max_concurrency = 10; c.min_idle = 1;
  p = POOL(c);
  k = UKEY(p); x = PKEY(p);
  r = WARM_RECORD(p, k, 0);
  for (i = 0; i < 8; i++) held[i] = NEW_LEASE(p, x, 0);
  drain(p);
  wb_alloc_fail_all(1);
  i = clientpool_acquire(p, k, 0, &g);      /* raw: clientpool_check allocates too */
  wb_alloc_fail_all(0);
  CHECK_STATUS(i, CLIENTPOOL_MUST_WAIT);
  INVARIANTS(p);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_DESTROY), 0);
  CHECK_EQ(KSTATS(p, k).idle, 1);
  h = REUSE(p, k, 0, &g);
  CHECK_EQ(h.record, r);
  RELEASE(p, h, 1);
  for (i = 0; i < 8; i++) RELEASE(p, held[i], 1);
  /* refill: the record array */
  p = POOL(c);
  k = UKEY(p);
  CHECK_EQ(KEY_PIN(p, k, 2), 0);
  clientpool_floor(p, 1, 0);
  wb_alloc_fail(1);
  CHECK_EQ(clientpool_refill(p, 0, &kk), -1);
  INVARIANTS(p);
  CHECK(clientpool_refill(p, 0, &kk) >= 0);
}

/* capacity > 1: a share when the lease array is full; an open record whose
 * key's open heap cannot grow takes no more shares. */
static void t_oom_shared(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k, x, y;
  hold_t h, held[7];
  clientpool_grant_t g;
  int i, st;
  c.capacity = 2; c.max_live = 8; c.max_idle = 8; c.max_concurrency = 16;
  p = POOL(c);
  k = PKEY(p);
  h = NEW_LEASE(p, k, 0);                   /* open: one share free */
  for (i = 0; i < 7; i++) {                 /* one lease per record: the lease array (8) */
    y = UKEY(p);                            /* is full and max_live is reached */
    held[i] = NEW_LEASE(p, y, 0);
  }
  drain(p);
  wb_alloc_fail_all(1);
  st = clientpool_acquire(p, k, 0, &g);     /* raw: clientpool_check allocates too */
  wb_alloc_fail_all(0);
  CHECK_STATUS(st, CLIENTPOOL_MUST_WAIT);
  INVARIANTS(p);
  CHECK_STATUS(ACQUIRE(p, k, 0, &g), CLIENTPOOL_GRANT_IDLE);
  CHECK(g.shared && g.record == h.record);
  RELEASE(p, hold_of(&g), 1);
  RELEASE(p, h, 1);
  for (i = 0; i < 7; i++) RELEASE(p, held[i], 1);
  /* the open heap of a fresh key cannot grow: its record is not shared.
   * clientpool_check flags an open record missing from its heap, so raw
   * calls until it is released. */
  p = POOL(c);
  y = PKEY(p);
  (void)NEW_LEASE(p, y, 0);                 /* the event queue exists from here on */
  drain(p);
  x = PKEY(p);
  CHECK_STATUS(ACQUIRE(p, x, 0, &g), CLIENTPOOL_GRANT_CREATE);
  wb_alloc_fail(1);
  CHECK_EQ(clientpool_created(p, g.record, 1, 0), 0);
  h = hold_of(&g);
  CHECK_EQ(clientpool_acquire(p, x, 0, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK(g.record != h.record);
  CHECK_EQ(clientpool_created(p, g.record, 1, 0), 0);
  CHECK_EQ(clientpool_release(p, h.lease, h.gen, -1, 1), 0);
  INVARIANTS(p);
  RELEASE(p, hold_of(&g), 1);
}

/* ===================================================================== */
/* 22. clientpool_check catches corruption (spec/c/whitebox.c)            */
/* ===================================================================== */

/* The pool shape wb_corrupt expects: see spec/c/whitebox.c. */
static clientpool_t *corruptible_pool(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t a, b, k3, d, e, f;
  hold_t h;
  clientpool_grant_t g;
  c.capacity = 2; c.max_live = 8; c.max_idle = 8; c.max_concurrency = 3;
  c.leak_threshold = 100; c.max_lifetime = 1000;
  p = POOL(c);
  a = PKEY(p); b = PKEY(p); k3 = PKEY(p); d = PKEY(p); e = PKEY(p); f = PKEY(p);
  h = NEW_LEASE(p, a, 0);
  RELEASE(p, h, 1);                         /* a: idle */
  (void)NEW_LEASE(p, b, 2);                 /* b: open */
  (void)NEW_LEASE(p, k3, 3);
  CHECK_STATUS(ACQUIRE(p, k3, 4, &g), CLIENTPOOL_GRANT_IDLE);   /* k3: full; concurrency reached */
  MUST_WAIT(p, a, 5);
  (void)WAIT(p, a, 50, 5);
  (void)WAIT(p, a, 51, 6);
  (void)WAIT(p, d, 60, 7);
  (void)WAIT(p, e, 61, 8);
  (void)WAIT(p, f, 62, 9);
  drain(p);
  return p;
}

static void t_check_catches_corruption(void) {
  int what, caught = 0;
  for (what = 0; what < WB_CORRUPTIONS; what++) {
    clientpool_t *p = corruptible_pool();
    char buf[512], msg[640];
    const char *want = wb_corrupt(p, what);
    int rc;
    snprintf(msg, sizeof msg, "corruption %d: the pool lacks what it needs", what);
    CHECK_MSG(want != NULL, msg);
    buf[0] = 0;
    rc = clientpool_check(p, buf, sizeof buf);
    snprintf(msg, sizeof msg, "corruption %d: expected clientpool_check to report '%s', got %d '%s'",
             what, want, rc, buf);
    CHECK_MSG(rc == -1 && strstr(buf, want) != NULL, msg);
    caught++;
    free_pool(p);
  }
  CHECK_EQ(caught, WB_CORRUPTIONS);
}

/* ===================================================================== */
/* runner                                                                */
/* ===================================================================== */

typedef struct { const char *name; void (*fn)(void); } test_t;
/* The warm floor renews an idle record's expiry clock each idle_timeout;
 * the idle time validate_after_idle reads must stay exact however many
 * renewals (a float offset re-rounded at every renewal drifted by about
 * 1e-3 relative: validate was skipped for a client idle long enough). */
static void t_floor_renewals_keep_idle_time(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k, r, i;
  clientpool_grant_t g;
  double t = 0;
  c.min_idle = c.max_idle = c.max_live = 1;
  c.idle_timeout = 0.7;
  c.validate_after_idle = 0.7 * 3000 + 0.3;   /* the idle time at the acquire below */
  p = POOL(c);
  k = UKEY(p);
  r = WARM_RECORD(p, k, 0);
  for (i = 1; i <= 3000; i++) {
    t = 0.7 * i;
    TICK(p, t);
  }
  CHECK_EQ(KSTATS(p, k).idle, 1);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_DESTROY), 0);
  t += 0.3;
  CHECK_STATUS(ACQUIRE(p, k, t, &g), CLIENTPOOL_GRANT_IDLE);
  CHECK(g.record == r);
  CHECK(g.idle == t);               /* went idle at 0: exactly now */
  CHECK_EQ(g.validate, 1);
}

/* idle_timeout is a lower bound in the caller's own arithmetic too: 0.7 +
 * 0.1 rounds below 0.8, and a deadline of that sum closed the client after
 * 0.0999999999999999778 s of idle. */
static void t_idle_expiry_never_early_by_rounding(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  hold_t h;
  double d;
  c.idle_timeout = 0.1;
  p = POOL(c);
  k = UKEY(p);
  h = NEW_LEASE(p, k, 0.7);
  RELEASE(p, h, 0.7);
  d = clientpool_next_deadline(p);
  CHECK(d - 0.7 >= 0.1);
  TICK(p, nextafter(d, -HUGE_VAL));
  CHECK_EQ(KSTATS(p, k).idle, 1);
  TICK(p, d);
  CHECK_EQ(KSTATS(p, -1).idle, 0);   /* (the pool: the key is forgotten) */
}

/* B4: an idle record costs at most 64 bytes of C heap (the record and its
 * share of the slot array's spare room), measured with glibc's mallinfo2
 * over 100k records made by the warm floor.  Under ASan the allocator is
 * not glibc's and the reading is 0: the test then checks nothing. */
#ifdef __GLIBC__
static size_t heap_bytes(void) {   /* in use: arena chunks and mmap'd blocks */
  struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}
#endif

static void t_idle_record_bytes(void) {
#ifdef __GLIBC__
  enum { N = 100000 };
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  clientpool_event_t e;
  int32_t k, kk, r, i;
  size_t before, after;
  c.max_live = c.max_idle = c.min_idle = N;
  c.max_concurrency = N;
  p = POOL(c);
  k = UKEY(p);
  CHECK_EQ(KEY_PIN(p, k, 2), 0);
  clientpool_floor(p, 1, 0);
  before = heap_bytes();
  for (i = 0; i < N; i++) {
    r = clientpool_refill(p, 0, &kk);
    CHECK(r >= 0 && kk == k);
    CHECK_EQ(clientpool_created(p, r, 1, 0), 0);
    while (clientpool_next_event(p, &e) != CLIENTPOOL_EV_NONE) {}
  }
  after = heap_bytes();
  CHECK_EQ(KSTATS(p, k).idle, N);
  if (after > before) {
    double per = (double)(after - before) / N;
    printf("  (%s: %.1f bytes per idle record)\n", g_test, per);
    CHECK(per <= 64);
  }
#endif
}


/* ===================================================================== */
/* 24. the physical cap: closing records                                 */
/* ===================================================================== */

/* A record counts against max_live from its reservation until its destroy
 * is reported done: EV_DESTROY starts the destroy, clientpool_destroyed
 * ends it, and only then does a waiter get the room (issue 12: a 0.5 s
 * destroy let 14 clients exist under max_live = 2). */
static void t_closing_counts_against_max_live(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  hold_t h;
  waiter_h w;
  clientpool_grant_t g;
  clientpool_stats_t s;
  g_auto_destroy = 0;
  c.max_live = 1; c.max_idle = 1; c.max_concurrency = 4;
  p = POOL(c);
  k = PKEY(p);
  h = NEW_LEASE(p, k, 0);
  RELEASE_AS(p, h, CLIENTPOOL_BY_ERROR, 1);
  drain(p);
  EXPECT_DESTROY(h.record, CLIENTPOOL_BY_ERROR);
  s = pstats(p);
  CHECK(s.live == 0 && s.closed == 1 && s.closing == 1 && s.opened - s.closed == s.live);
  CHECK_EQ(KSTATS(p, k).closing, 1);
  CHECK_EQ(clientpool_record_key(p, h.record), k);    /* still a record of k */
  CHECK_EQ(clientpool_retire(p, h.record, 1), CLIENTPOOL_STALE);
  MUST_WAIT(p, k, 1);                        /* no room while it closes */
  w = WAIT(p, k, -1, 1);
  drain(p);
  EXPECT_NO_WAKE(w);
  CHECK_EQ(DESTROYED(p, h.record, 2), 0);    /* the destroy hook returned */
  drain(p);
  EXPECT_WAKE(w);
  CHECK_STATUS(CLAIM(p, w, 2, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK_EQ(pstats(p).closing, 0);
  CHECK_EQ(DESTROYED(p, h.record, 2), CLIENTPOOL_STALE);   /* once per EV_DESTROY */
  CHECK_EQ(DESTROYED(p, -1, 2), CLIENTPOOL_STALE);
  CHECK_EQ(DESTROYED(p, 9999, 2), CLIENTPOOL_STALE);
  CHECK_EQ(DESTROYED(p, g.record, 2), CLIENTPOOL_STALE);   /* creating, not closing */
  CHECK_EQ(CREATED(p, g.record, 1, 2), 0);
  CHECK_EQ(pstats(p).live, 1);
}

/* The per-key cap is physical too, and a key holding only closing records
 * is not forgotten (its destroy hook still needs the key's name). */
static void t_closing_key_cap_and_key_kept(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t a, b;
  hold_t h, hb;
  clientpool_grant_t g;
  g_auto_destroy = 0;
  c.max_live = 4; c.key_max_live = 1;
  p = POOL(c);
  a = UKEY(p); b = PKEY(p);
  h = NEW_LEASE(p, a, 0);
  hb = NEW_LEASE(p, b, 0);
  RELEASE_AS(p, h, CLIENTPOOL_BY_ERROR, 1);
  drain(p);
  CHECK_EQ(n_key_free(a), 0);               /* held by its closing record */
  CHECK_EQ(KSTATS(p, a).closing, 1);
  MUST_WAIT(p, a, 1);                       /* a's cap: the pool has room */
  CHECK_EQ(KEY_FORGET(p, a), 0);
  CHECK_EQ(DESTROYED(p, h.record, 2), 0);
  drain(p);
  CHECK_EQ(n_key_free(a), 1);               /* empty now */
  RELEASE_AS(p, hb, CLIENTPOOL_BY_ERROR, 3);
  /* the slot of a destroyed record is reused only once the event is read
   * and the destroy reported: here reported first, read later */
  CHECK_EQ(DESTROYED(p, hb.record, 3), 0);
  CHECK_STATUS(ACQUIRE(p, b, 3, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK(g.record != hb.record);
  drain(p);
  EXPECT_DESTROY(hb.record, CLIENTPOOL_BY_ERROR);
  CHECK_EQ(CREATED(p, g.record, 1, 3), 0);
}

/* Eviction for another key starts the destroy; the waiter is served once
 * it is reported, and no second client is evicted for room on its way. */
static void t_closing_eviction_waits_for_destroy(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t a, b;
  hold_t h1, h2;
  waiter_h w, w2;
  clientpool_grant_t g;
  g_auto_destroy = 0;
  c.max_live = 2; c.max_idle = 2;
  p = POOL(c);
  a = PKEY(p); b = PKEY(p);
  h1 = NEW_LEASE(p, a, 0);
  h2 = NEW_LEASE(p, a, 0);
  RELEASE(p, h1, 1);
  RELEASE(p, h2, 2);
  drain(p);
  CHECK_STATUS(ACQUIRE(p, b, 3, &g), CLIENTPOOL_MUST_WAIT);
  drain(p);
  EXPECT_DESTROY(h1.record, CLIENTPOOL_BY_EVICTED);    /* the least recently used */
  w = WAIT(p, b, -1, 3);
  w2 = WAIT(p, b, -1, 3);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_DESTROY), 0);        /* room is on its way: no second eviction */
  EXPECT_NO_WAKE(w);
  CHECK_EQ(DESTROYED(p, h1.record, 4), 0);
  drain(p);
  EXPECT_WAKE(w);
  EXPECT_DESTROY(h2.record, CLIENTPOOL_BY_EVICTED);    /* now for w2 */
  EXPECT_NO_WAKE(w2);
  CHECK_STATUS(CLAIM(p, w, 4, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK_EQ(CREATED(p, g.record, 1, 4), 0);
  CHECK_EQ(DESTROYED(p, h2.record, 5), 0);
  drain(p);
  EXPECT_WAKE(w2);
  CHECK(pstats(p).live + pstats(p).creating + pstats(p).closing <= 2);
}

/* regrant at max_live: the invalid record's room comes when its destroy is
 * reported; the caller queues again ahead of the waiters that were behind
 * it, and nothing is served meanwhile. */
static void t_closing_regrant_keeps_place(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t a, b;
  hold_t h1, h2;
  waiter_h w, wb, wme;
  clientpool_grant_t g;
  g_auto_destroy = 0;
  c.max_live = 2; c.max_idle = 2; c.max_concurrency = 4;
  p = POOL(c);
  a = PKEY(p); b = PKEY(p);
  h1 = NEW_LEASE(p, a, 0);
  h2 = NEW_LEASE(p, a, 0);
  RELEASE(p, h1, 1);
  h1 = REUSE(p, a, 2, &g);
  w = WAIT(p, a, -1, 2);                      /* behind the caller */
  wb = WAIT(p, b, -1, 2);                     /* another key, behind it too */
  drain(p);
  CHECK_EQ(clientpool_regrant(p, h1.lease, h1.gen, 3, &g), CLIENTPOOL_MUST_WAIT);
  drain(p);
  EXPECT_DESTROY(h1.record, CLIENTPOOL_BY_INVALID);
  CHECK_STATUS(ACQUIRE(p, a, 3, &g), CLIENTPOOL_MUST_WAIT);
  wme = WAIT(p, a, -1, 3);                    /* queued ahead of w and wb */
  RELEASE(p, h2, 4);                          /* an idle record for a: the caller's */
  drain(p);
  EXPECT_WAKE(wme);
  EXPECT_NO_WAKE(w);
  CHECK_STATUS(CLAIM(p, wme, 4, &g), CLIENTPOOL_GRANT_IDLE);
  h2 = hold_of(&g);
  CHECK_EQ(DESTROYED(p, h1.record, 5), 0);    /* the room: w is older than wb */
  drain(p);
  EXPECT_WAKE(w);
  EXPECT_NO_WAKE(wb);
  CHECK_STATUS(CLAIM(p, w, 5, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK_EQ(CREATED(p, g.record, 1, 5), 0);
  /* reported before the caller is back: the room is held for it, and a
   * kept place the caller gives up (key_forget) serves the others again */
  CHECK_EQ(clientpool_regrant(p, h2.lease, h2.gen, 7, &g), CLIENTPOOL_MUST_WAIT);
  CHECK_EQ(DESTROYED(p, h2.record, 7), 0);
  drain(p);
  EXPECT_NO_WAKE(wb);                         /* held for the caller */
  CHECK_EQ(KEY_FORGET(p, a), 0);
  drain(p);
  EXPECT_WAKE(wb);
}

/* The warm floor's refill waits for the room too, and is signalled again
 * when the destroy is reported. */
static void t_closing_floor_refill(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k, r, kk;
  g_auto_destroy = 0;
  c.max_live = 1; c.max_idle = 1; c.min_idle = 1;
  p = POOL(c);
  k = PKEY(p);
  r = WARM_RECORD(p, k, 0);
  CHECK_EQ(clientpool_refill(p, 0, &kk), -1);   /* the floor is met */
  drain(p);
  CHECK_EQ(RETIRE(p, r, 1), 0);
  drain(p);
  EXPECT_DESTROY(r, CLIENTPOOL_BY_RETIRED);
  CHECK_EQ(n_events(CLIENTPOOL_EV_REFILL), 1);
  CHECK_EQ(clientpool_refill(p, 1, &kk), -1);   /* no room yet */
  CHECK_EQ(DESTROYED(p, r, 2), 0);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_REFILL), 1);  /* signalled again */
  r = clientpool_refill(p, 2, &kk);
  CHECK(r >= 0 && kk == k);
  CHECK_EQ(CREATED(p, r, 1, 2), 0);
  /* close leaves closing records to their destroys */
  CLOSE(p, 3);
  drain(p);
  CHECK_EQ(pstats(p).closing, 1);
  CHECK_EQ(KEY_PIN(p, k, 0), 0);
  drain(p);
  CHECK_EQ(n_key_free(k), 0);
  CHECK_EQ(DESTROYED(p, r, 4), 0);
  drain(p);
  CHECK_EQ(n_key_free(k), 1);
  CHECK_EQ(pstats(p).closing, 0);
}


/* ===================================================================== */
/* 25. create backoff                                                    */
/* ===================================================================== */

static double backoff_end(const clientpool_t *p) { return clientpool_next_deadline(p); }

/* Failed creates of a key open a jittered, doubling, bounded window in which
 * an acquisition that would create fails fast (BACKOFF) when no client of
 * the key may come back; waiters queued meanwhile get a reservation when
 * the window ends, one create at a time until one succeeds (issue 12: with
 * redis down, about 2000 connect attempts per second). */
static void t_backoff_window_fail_fast_and_probe(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  clientpool_grant_t g, g2;
  waiter_h w1, w2;
  double end, prev;
  int i;
  c.create_backoff = 1; c.create_backoff_max = 4;
  p = POOL(c);
  k = PKEY(p);
  CHECK_STATUS(ACQUIRE(p, k, 10, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK_EQ(CREATED(p, g.record, 0, 10), 0);
  CHECK(pstats(p).create_failed == 1 && KSTATS(p, k).create_failed == 1);
  end = backoff_end(p);
  CHECK(end >= 10.5 && end <= 11);          /* d = 1: [d/2, d] */
  drain(p);
  CHECK(last_timer() == end);               /* the driver's timer is told */
  CHECK_STATUS(ACQUIRE(p, k, 10.2, &g), CLIENTPOOL_BACKOFF);   /* fail fast */
  CHECK_EQ(pstats(p).creating, 0);
  w1 = WAIT(p, k, -1, 10.3);                /* a driver may queue all the same */
  w2 = WAIT(p, k, -1, 10.3);
  TICK(p, end - 1e-6);
  drain(p);
  EXPECT_NO_WAKE(w1);
  TICK(p, end);                             /* the window ends: one create */
  drain(p);
  EXPECT_WAKE(w1);
  EXPECT_NO_WAKE(w2);
  CHECK_STATUS(CLAIM(p, w1, end, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK_STATUS(ACQUIRE(p, k, end, &g2), CLIENTPOOL_MUST_WAIT);   /* one in flight: wait */
  CHECK_EQ(CREATED(p, g.record, 0, end), 0); /* fails again: 2 in a row, d = 2 */
  prev = end;
  end = backoff_end(p);
  CHECK(end >= prev + 1 && end <= prev + 2);
  drain(p);
  EXPECT_NO_WAKE(w2);
  TICK(p, end);
  drain(p);
  EXPECT_WAKE(w2);
  CHECK_STATUS(CLAIM(p, w2, end, &g), CLIENTPOOL_GRANT_CREATE);
  /* the window is bounded by create_backoff_max */
  for (i = 0; i < 6; i++) {
    CHECK_EQ(CREATED(p, g.record, 0, end), 0);
    prev = end;
    end = backoff_end(p);
    CHECK(end >= prev + 2 && end <= prev + 4);   /* d = 4, then max */
    CHECK_STATUS(ACQUIRE(p, k, end, &g), CLIENTPOOL_GRANT_CREATE);   /* at its end, lazily */
  }
  CHECK_EQ(KSTATS(p, k).create_failed, 8);
  CHECK_EQ(CREATED(p, g.record, 1, end), 0);  /* a success ends the backoff */
  CHECK_EQ(clientpool_next_deadline(p), -1);
  CHECK_STATUS(ACQUIRE(p, k, end, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK_STATUS(ACQUIRE(p, k, end, &g2), CLIENTPOOL_GRANT_CREATE);   /* several at once again */
}

/* While a client of the key may come back (one leased, or a create in
 * flight), an acquisition waits as usual instead of failing fast. */
static void t_backoff_waits_when_a_client_may_come_back(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  hold_t h;
  clientpool_grant_t g;
  waiter_h w;
  c.create_backoff = 1; c.create_backoff_max = 1;
  p = POOL(c);
  k = PKEY(p);
  h = NEW_LEASE(p, k, 0);
  CHECK_STATUS(ACQUIRE(p, k, 0, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK_EQ(CREATED(p, g.record, 0, 0), 0);
  MUST_WAIT(p, k, 0.1);                     /* h is leased: it may come back */
  w = WAIT(p, k, -1, 0.1);
  RELEASE(p, h, 0.2);                       /* and it does, inside the window */
  drain(p);
  EXPECT_WAKE(w);
  CHECK_STATUS(CLAIM(p, w, 0.2, &g), CLIENTPOOL_GRANT_IDLE);
  /* off (create_backoff <= 0): no window at all */
  c.create_backoff = 0;
  p = POOL(c);
  k = PKEY(p);
  CHECK_STATUS(ACQUIRE(p, k, 0, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK_EQ(CREATED(p, g.record, 0, 0), 0);
  CHECK_STATUS(ACQUIRE(p, k, 0, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK_EQ(clientpool_next_deadline(p), -1);
}

/* The window is jittered from the pool's seeded generator: the same seed
 * gives the same windows, others spread them over [d/2, d]. */
static void t_backoff_jitter_by_seed(void) {
  double ends[8];
  int s, distinct = 0, i;
  for (s = 0; s < 8; s++) {
    clientpool_config_t c = cfg_base();
    clientpool_t *p;
    int32_t k;
    clientpool_grant_t g;
    c.create_backoff = 2; c.create_backoff_max = 2; c.seed = (uint64_t)(s % 4 + 1);
    p = POOL(c);
    k = PKEY(p);
    CHECK_STATUS(ACQUIRE(p, k, 0, &g), CLIENTPOOL_GRANT_CREATE);
    CHECK_EQ(CREATED(p, g.record, 0, 0), 0);
    ends[s] = backoff_end(p);
    CHECK(ends[s] >= 1 && ends[s] <= 2);
    free_pool(p);
  }
  for (s = 0; s < 4; s++) {
    CHECK(ends[s] == ends[s + 4]);
    for (i = 0; i < s; i++) if (ends[i] == ends[s]) break;
    if (i == s) distinct++;
  }
  CHECK(distinct >= 3);
}

/* A failed warm-floor refill counts the same; the floor is signalled again
 * when the window ends.  The failures are forgotten create_backoff_max
 * after the window with no create, and a key that backs off is not
 * forgotten before (its next acquisition must still back off). */
static void t_backoff_refill_and_forget(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k, u, r, kk;
  clientpool_grant_t g;
  double end;
  c.create_backoff = 1; c.create_backoff_max = 1; c.min_idle = 1;
  p = POOL(c);
  k = KEY_OPEN(p);
  CHECK_EQ(KEY_PIN(p, k, 2), 0);
  clientpool_floor(p, 1, 0);
  r = clientpool_refill(p, 0, &kk);
  CHECK(r >= 0 && kk == k);
  CHECK_EQ(CREATED(p, r, 0, 0), 0);         /* the refill failed */
  CHECK(KSTATS(p, k).create_failed == 1);
  CHECK_EQ(clientpool_refill(p, 0.1, &kk), -1);
  end = backoff_end(p);
  drain(p);
  TICK(p, end);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_REFILL), 1);
  r = clientpool_refill(p, end, &kk);
  CHECK(r >= 0 && kk == k);
  CHECK_EQ(CREATED(p, r, 1, end), 0);
  /* an unpinned key keeps its failures while it backs off */
  u = UKEY(p);
  CHECK_STATUS(ACQUIRE(p, u, 5, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK_EQ(CREATED(p, g.record, 0, 5), 0);
  drain(p);
  CHECK_EQ(n_key_free(u), 0);
  CHECK_STATUS(ACQUIRE(p, u, 5.1, &g), CLIENTPOOL_BACKOFF);
  drain(p);
  CHECK_EQ(n_key_free(u), 0);
  end = backoff_end(p);
  TICK(p, end);                             /* the window ends; max later... */
  drain(p);
  CHECK_EQ(n_key_free(u), 0);
  CHECK_STATUS(ACQUIRE(p, u, end + 0.5, &g), CLIENTPOOL_GRANT_CREATE);   /* one create */
  CHECK_EQ(CREATED(p, g.record, 0, end + 0.5), 0);   /* 2 in a row */
  end = backoff_end(p);
  TICK(p, end);
  TICK(p, end + 1);                         /* max after the window, nothing in flight */
  drain(p);
  CHECK_EQ(n_key_free(u), 1);               /* failures forgotten with the key */
  /* close ends every backoff: nothing is left */
  u = UKEY(p);
  CHECK_STATUS(ACQUIRE(p, u, 20, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK_EQ(CREATED(p, g.record, 0, 20), 0);
  CLOSE(p, 20);
  drain(p);
  CHECK_EQ(n_key_free(u), 1);
  CHECK_EQ(clientpool_next_deadline(p), -1);
}


/* ===================================================================== */
/* 26. configure and per-key caps of a live engine                       */
/* ===================================================================== */

/* A config clientpool_new would refuse, another capacity or seed: EINVAL,
 * and nothing changes; a closed pool: ECLOSED. */
static void t_configure_refuses_and_changes_nothing(void) {
  clientpool_config_t c = cfg_base(), bad;
  clientpool_t *p;
  clientpool_stats_t before;
  int32_t k;
  hold_t h;
  c.max_lifetime = 50; c.leak_threshold = 20;
  p = POOL(c);
  k = PKEY(p);
  h = NEW_LEASE(p, k, 0);
  (void)h;
  drain(p);
  before = pstats(p);
  bad = c; bad.capacity = 2;
  CHECK_EQ(CONFIGURE(p, bad, 1), CLIENTPOOL_EINVAL);
  bad = c; bad.seed = 99;
  CHECK_EQ(CONFIGURE(p, bad, 1), CLIENTPOOL_EINVAL);
  bad = c; bad.max_idle = 5;                 /* > max_live */
  CHECK_EQ(CONFIGURE(p, bad, 1), CLIENTPOOL_EINVAL);
  bad = c; bad.max_live = 0; bad.max_idle = 0;
  CHECK_EQ(CONFIGURE(p, bad, 1), CLIENTPOOL_EINVAL);
  bad = c; bad.create_backoff = 1; bad.create_backoff_max = 0.5;
  CHECK_EQ(CONFIGURE(p, bad, 1), CLIENTPOOL_EINVAL);
  CHECK_EQ(clientpool_configure(p, NULL, 1), CLIENTPOOL_EINVAL);
  drain(p);
  CHECK_EQ(g_nev, 0);
  {
    clientpool_stats_t now_s = pstats(p);
    CHECK(stats_equal(&before, &now_s));
  }
  CHECK(clientpool_next_deadline(p) == 20);  /* the lease's report, as before */
  CHECK_EQ(CONFIGURE(p, c, 1), 0);           /* the same config: nothing to do */
  CLOSE(p, 2);
  CHECK_EQ(CONFIGURE(p, c, 2), CLIENTPOOL_ECLOSED);
}

/* A lower max_live retires idle clients at once and closes leased ones at
 * their release while over it; new creates wait until the physical count is
 * under it; the count never grows meanwhile. */
static void t_configure_lower_max_live(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  hold_t h[6];
  clientpool_grant_t g;
  clientpool_stats_t s;
  waiter_h w;
  int i;
  g_auto_destroy = 0;
  c.max_live = 6; c.max_idle = 6; c.max_concurrency = 6;
  p = POOL(c);
  k = PKEY(p);
  for (i = 0; i < 6; i++) h[i] = NEW_LEASE(p, k, 0);
  RELEASE(p, h[4], 1);                       /* two idle, h[4] the older */
  RELEASE(p, h[5], 2);
  drain(p);
  c.max_live = 2; c.max_idle = 2; c.max_concurrency = 2;
  CHECK_EQ(CONFIGURE(p, c, 3), 0);
  drain(p);
  EXPECT_DESTROY(h[4].record, CLIENTPOOL_BY_RESIZED);
  EXPECT_DESTROY(h[5].record, CLIENTPOOL_BY_RESIZED);
  s = pstats(p);
  CHECK(s.live == 4 && s.closing == 2 && s.closed_by[CLIENTPOOL_BY_RESIZED] == 2);
  RELEASE(p, h[0], 4);                       /* over the cap: closed at release */
  RELEASE(p, h[1], 4);
  drain(p);
  EXPECT_DESTROY(h[0].record, CLIENTPOOL_BY_RESIZED);
  EXPECT_DESTROY(h[1].record, CLIENTPOOL_BY_RESIZED);
  CHECK_EQ(pstats(p).live, 2);
  RELEASE(p, h[2], 5);                       /* at the cap now: kept idle */
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_DESTROY), 0);
  h[2] = REUSE(p, k, 5, &g);
  MUST_WAIT(p, k, 5);                        /* 2 live + 4 closing: no room */
  w = WAIT(p, k, -1, 5);
  for (i = 0; i < 3; i++) CHECK_EQ(DESTROYED(p, h[i == 2 ? 4 : i].record, 6), 0);
  drain(p);
  EXPECT_NO_WAKE(w);                         /* 2 live + 1 closing = 3 > 2 */
  CHECK_EQ(DESTROYED(p, h[5].record, 6), 0);
  drain(p);
  EXPECT_NO_WAKE(w);                         /* 2 live: at the cap */
  RELEASE_AS(p, h[3], CLIENTPOOL_BY_ERROR, 7);
  CHECK_EQ(DESTROYED(p, h[3].record, 7), 0);
  drain(p);
  EXPECT_WAKE(w);
  CHECK_STATUS(CLAIM(p, w, 7, &g), CLIENTPOOL_GRANT_CREATE);
  s = pstats(p);
  CHECK(s.live + s.creating + s.closing <= 2);
}

/* A higher cap serves waiters at once; a lower max_waiting keeps the queued
 * ones and refuses new ones; a lower max_idle retires idle clients. */
static void t_configure_raise_and_waiting(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  hold_t h, i1, i2, i3;
  waiter_h w1, w2, w3;
  uint32_t gen;
  clientpool_grant_t g;
  c.max_live = 1; c.max_idle = 1; c.max_concurrency = 8; c.max_waiting = 4;
  p = POOL(c);
  k = PKEY(p);
  h = NEW_LEASE(p, k, 0);
  w1 = WAIT(p, k, -1, 0); w2 = WAIT(p, k, -1, 0); w3 = WAIT(p, k, -1, 0);
  c.max_waiting = 1;
  CHECK_EQ(CONFIGURE(p, c, 1), 0);
  CHECK_EQ(pstats(p).waiting, 3);            /* the queued ones stay */
  CHECK_EQ(WAIT_RAW(p, k, -1, 1, &gen), -CLIENTPOOL_FULL);
  c.max_live = 4; c.max_idle = 4;
  CHECK_EQ(CONFIGURE(p, c, 2), 0);           /* room: all three served at once */
  drain(p);
  EXPECT_WAKE(w1); EXPECT_WAKE(w2); EXPECT_WAKE(w3);
  CHECK_STATUS(CLAIM(p, w1, 2, &g), CLIENTPOOL_GRANT_CREATE); CHECK_EQ(CREATED(p, g.record, 1, 2), 0);
  i1 = hold_of(&g);
  CHECK_STATUS(CLAIM(p, w2, 2, &g), CLIENTPOOL_GRANT_CREATE); CHECK_EQ(CREATED(p, g.record, 1, 2), 0);
  i2 = hold_of(&g);
  CHECK_STATUS(CLAIM(p, w3, 2, &g), CLIENTPOOL_GRANT_CREATE); CHECK_EQ(CREATED(p, g.record, 1, 2), 0);
  i3 = hold_of(&g);
  CHECK(WAIT_RAW(p, k, -1, 2, &gen) >= 0);   /* under max_waiting again */
  RELEASE(p, h, 3); RELEASE(p, i1, 4); RELEASE(p, i2, 5);
  drain(p);
  CHECK_EQ(pstats(p).idle, 2);               /* the waiter took the first */
  RELEASE(p, i3, 6);
  CHECK_EQ(pstats(p).idle, 3);
  c.max_idle = 1;
  CHECK_EQ(CONFIGURE(p, c, 7), 0);
  drain(p);
  CHECK_EQ(g_evby[CLIENTPOOL_BY_MAX_IDLE], 2);
  EXPECT_DESTROY(i1.record, CLIENTPOOL_BY_MAX_IDLE);   /* least recently used first */
  CHECK_EQ(pstats(p).idle, 1);
}

/* Durations: lifetimes are scaled (jitter kept), set or dropped; leak
 * reports follow the new threshold; an earlier deadline is announced. */
static void t_configure_durations(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  hold_t h, h2;
  c.max_lifetime = 100; c.leak_threshold = 50;
  p = POOL(c);
  k = PKEY(p);
  h = NEW_LEASE(p, k, 0);
  h2 = NEW_LEASE(p, k, 10);
  RELEASE(p, h2, 10);
  drain(p);
  CHECK(clientpool_next_deadline(p) == 50);  /* h's leak report */
  c.max_lifetime = 20; c.leak_threshold = 30;
  CHECK_EQ(CONFIGURE(p, c, 11), 0);
  drain(p);
  CHECK(clientpool_next_deadline(p) == 20);  /* h's lifetime: 0 + 100 * 20/100 */
  CHECK(last_timer() == 20);
  TICK(p, 20);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_DESTROY), 0);   /* leased: at its release */
  CHECK(clientpool_next_deadline(p) == 30);  /* h2 (10 + 20), h's report (0 + 30) */
  TICK(p, 30);
  drain(p);
  EXPECT_DESTROY(h2.record, CLIENTPOOL_BY_LIFETIME);
  CHECK_EQ(n_leak(h.lease, h.gen), 1);
  c.leak_threshold = 5;                      /* a report made is not made again */
  CHECK_EQ(CONFIGURE(p, c, 31), 0);
  TICK(p, 40);
  drain(p);
  CHECK_EQ(n_leak(h.lease, h.gen), 0);
  RELEASE(p, h, 41);
  drain(p);
  EXPECT_DESTROY(h.record, CLIENTPOOL_BY_LIFETIME);
  /* off, then on again: records that had none get one (created + L) */
  c.max_lifetime = -1; c.leak_threshold = -1;
  CHECK_EQ(CONFIGURE(p, c, 42), 0);
  h = NEW_LEASE(p, k, 42);
  h2 = NEW_LEASE(p, k, 44);
  RELEASE(p, h, 44);
  CHECK(clientpool_next_deadline(p) == -1);
  c.max_lifetime = 10; c.leak_threshold = 3;
  CHECK_EQ(CONFIGURE(p, c, 45), 0);
  CHECK(clientpool_next_deadline(p) == 47);  /* h2's report: 44 + 3 */
  TICK(p, 47);
  drain(p);
  CHECK_EQ(n_leak(h2.lease, h2.gen), 1);
  CHECK(clientpool_next_deadline(p) == 52);  /* h's lifetime: 42 + 10 */
  TICK(p, 52);
  drain(p);
  EXPECT_DESTROY(h.record, CLIENTPOOL_BY_LIFETIME);
  /* idle_timeout from now; backoff off ends a window */
  c.create_backoff = 1; c.create_backoff_max = 1;
  CHECK_EQ(CONFIGURE(p, c, 53), 0);
  {
    clientpool_grant_t g;
    int32_t b = PKEY(p);
    CHECK_STATUS(ACQUIRE(p, b, 53, &g), CLIENTPOOL_GRANT_CREATE);
    CHECK_EQ(CREATED(p, g.record, 0, 53), 0);
    CHECK_STATUS(ACQUIRE(p, b, 53, &g), CLIENTPOOL_BACKOFF);
    c.create_backoff = -1;
    CHECK_EQ(CONFIGURE(p, c, 53), 0);
    CHECK_STATUS(ACQUIRE(p, b, 53, &g), CLIENTPOOL_GRANT_CREATE);
  }
}

/* A key's own caps (the fleet's share of a key's budget). */
static void t_key_caps(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k, u;
  hold_t h[3];
  clientpool_grant_t g;
  waiter_h w;
  int i;
  c.max_live = 4; c.max_idle = 4; c.key_max_live = 3; c.max_concurrency = 4;
  p = POOL(c);
  k = PKEY(p);
  for (i = 0; i < 3; i++) h[i] = NEW_LEASE(p, k, 0);
  for (i = 0; i < 3; i++) RELEASE(p, h[i], 1 + i);
  CHECK_EQ(KEY_CAPS(p, k, 5, -1, 4), CLIENTPOOL_EINVAL);    /* > max_live */
  CHECK_EQ(KEY_CAPS(p, k, -1, 5, 4), CLIENTPOOL_EINVAL);    /* > max_idle */
  CHECK_EQ(KEY_CAPS(p, 99, 1, 1, 4), CLIENTPOOL_EINVAL);
  drain(p);
  CHECK_EQ(KEY_CAPS(p, k, 1, -1, 4), 0);
  drain(p);
  EXPECT_DESTROY(h[0].record, CLIENTPOOL_BY_RESIZED);       /* oldest idle first */
  EXPECT_DESTROY(h[1].record, CLIENTPOOL_BY_RESIZED);
  CHECK_EQ(KSTATS(p, k).live, 1);
  h[2] = REUSE(p, k, 5, &g);
  MUST_WAIT(p, k, 5);                        /* the key's cap: the pool has room */
  w = WAIT(p, k, -1, 5);
  CHECK_EQ(KEY_CAPS(p, k, 0, 0, 6), 0);      /* a share of nothing */
  RELEASE(p, h[2], 7);
  drain(p);
  EXPECT_DESTROY(h[2].record, CLIENTPOOL_BY_RESIZED);       /* over the key's cap */
  EXPECT_NO_WAKE(w);
  CHECK_EQ(KEY_CAPS(p, k, -1, -1, 8), 0);    /* the pool's per-key caps again */
  drain(p);
  EXPECT_WAKE(w);
  CHECK_STATUS(CLAIM(p, w, 8, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK_EQ(CREATED(p, g.record, 1, 8), 0);
  /* a key with caps of its own is kept until they are cleared */
  u = UKEY(p);
  CHECK_EQ(KEY_CAPS(p, u, 2, 1, 9), 0);
  drain(p);
  CHECK_EQ(KEY_FORGET(p, u), 0);
  CHECK_EQ(KEY_CAPS(p, u, -1, -1, 9), 0);
  drain(p);
  CHECK_EQ(n_key_free(u), 1);
  /* a warm key's floor is signalled when its min_idle rises */
  c.min_idle = 2;
  u = KEY_OPEN(p);
  CHECK_EQ(KEY_PIN(p, u, 2), 0);
  CHECK_EQ(CONFIGURE(p, c, 10), 0);
  clientpool_floor(p, 1, 10);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_REFILL), 1);
}


/* ===================================================================== */
/* 27. priorities                                                        */
/* ===================================================================== */

/* Which of the n waiters was woken by this drain (-1: none). */
static int woken_of(const waiter_h *ws, int n) {
  int i;
  for (i = 0; i < n; i++) if (n_wake(ws[i].w, ws[i].gen) == 1) return i;
  return -1;
}

/* Serves the n waiters one release at a time; order[i] = the index served
 * i-th. */
static void serve_in_turn(clientpool_t *p, hold_t h, waiter_h *ws, int n, int *order) {
  int i;
  clientpool_grant_t g;
  for (i = 0; i < n; i++) {
    int j;
    RELEASE(p, h, 1 + i);
    drain(p);
    j = woken_of(ws, n);
    CHECK(j >= 0);
    order[i] = j;
    CHECK_STATUS(CLAIM(p, ws[j], 1 + i, &g), CLIENTPOOL_GRANT_IDLE);
    h = hold_of(&g);
  }
  RELEASE(p, h, 1 + n);
}

/* Higher priority first, arrival order within a priority. */
static void t_priority_order(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  hold_t h;
  waiter_h ws[6];
  int order[6], i;
  static const int prio[6] = { 0, 1, 0, 1, 5, -3 };
  static const int want[6] = { 4, 1, 3, 0, 2, 5 };
  c.max_live = 1; c.max_idle = 1;
  p = POOL(c);
  k = PKEY(p);
  h = NEW_LEASE(p, k, 0);
  for (i = 0; i < 6; i++) ws[i] = WAIT_PRIO(p, k, prio[i], 0);
  drain(p);
  serve_in_turn(p, h, ws, 6, order);
  for (i = 0; i < 6; i++) CHECK_EQ(order[i], want[i]);
}

/* The aging bound: a waiter is passed over by at most (P - n) *
 * PRIORITY_STEP waiters that queued after it; then it is served before
 * every later one, whatever their priority. */
static void t_priority_aging_bound(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  hold_t h;
  clientpool_grant_t g;
  waiter_h low, high[200];
  int i, served_before = 0, nh = 2 * CLIENTPOOL_PRIORITY_STEP + 8;
  c.max_live = 1; c.max_idle = 1; c.max_waiting = 300;
  p = POOL(c);
  k = PKEY(p);
  h = NEW_LEASE(p, k, 0);
  low = WAIT_PRIO(p, k, 0, 0);
  for (i = 0; i < nh; i++) high[i] = WAIT_PRIO(p, k, i < CLIENTPOOL_PRIORITY_STEP + 4 ? 1 : 2, 0);
  drain(p);
  for (;;) {
    RELEASE(p, h, 1);
    drain(p);
    if (n_wake(low.w, low.gen)) {
      CHECK_STATUS(CLAIM(p, low, 1, &g), CLIENTPOOL_GRANT_IDLE);
      break;
    }
    i = woken_of(high, nh);
    CHECK(i >= 0);
    CHECK_STATUS(CLAIM(p, high[i], 1, &g), CLIENTPOOL_GRANT_IDLE);
    h = hold_of(&g);
    served_before++;
  }
  /* priority 2 waiters that queued within 2 steps, priority 1 within 1 */
  CHECK_EQ(served_before, (CLIENTPOOL_PRIORITY_STEP - 1) +
                          (2 * CLIENTPOOL_PRIORITY_STEP - 1 - (CLIENTPOOL_PRIORITY_STEP + 4)));
  CHECK(served_before <= 2 * CLIENTPOOL_PRIORITY_STEP);
}

/* Across keys: among the waiters that can use a freed slot, the higher
 * priority first; one that cannot use it holds nobody up; the extremes of
 * int32 neither overflow nor pass a kept place. */
static void t_priority_cross_key_and_extremes(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t a, b, d;
  hold_t h, hb;
  waiter_h wa, wb, wd, wmax, wmin;
  clientpool_grant_t g;
  c.max_live = 2; c.max_idle = 2; c.key_max_live = 1;
  p = POOL(c);
  a = PKEY(p); b = PKEY(p); d = PKEY(p);
  h = NEW_LEASE(p, a, 0);
  hb = NEW_LEASE(p, b, 0);
  wa = WAIT_PRIO(p, a, 0, 1);               /* a is at its cap: cannot create */
  wd = WAIT_PRIO(p, d, 0, 1);
  wb = WAIT_PRIO(p, b, 3, 1);               /* later, higher */
  RELEASE_AS(p, hb, CLIENTPOOL_BY_ERROR, 2); /* a free slot: b's waiter before d's */
  drain(p);
  EXPECT_WAKE(wb);
  EXPECT_NO_WAKE(wd);
  EXPECT_NO_WAKE(wa);
  CHECK_STATUS(CLAIM(p, wb, 2, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK_EQ(CREATED(p, g.record, 1, 2), 0);
  hb = hold_of(&g);
  wmax = WAIT_PRIO(p, a, INT32_MAX, 3);
  wmin = WAIT_PRIO(p, a, INT32_MIN, 3);
  RELEASE(p, h, 4);                         /* a's idle client: the highest of a's */
  drain(p);
  EXPECT_WAKE(wmax);
  CHECK_STATUS(CLAIM(p, wmax, 4, &g), CLIENTPOOL_GRANT_IDLE);
  h = hold_of(&g);
  /* a regrant's kept place beats any priority: the invalid record's room
   * (its destroy is reported after the acquire) goes to the caller, past
   * wmin, wa and the older wd */
  wmax = WAIT_PRIO(p, a, INT32_MAX, 5);
  CHECK_EQ(clientpool_regrant(p, h.lease, h.gen, 5, &g), CLIENTPOOL_MUST_WAIT);
  MUST_WAIT(p, a, 5);
  drain(p);
  {
    waiter_h wk = WAIT(p, a, -1, 5);
    drain(p);
    EXPECT_WAKE(wk);
  }
  EXPECT_NO_WAKE(wmax);
  EXPECT_NO_WAKE(wd);
  EXPECT_NO_WAKE(wa);
  EXPECT_NO_WAKE(wmin);
}


/* ===================================================================== */
/* 28. keepalive: background validates of idle clients                   */
/* ===================================================================== */

static int n_keepalive(int32_t r) { return count_ev(CLIENTPOOL_EV_KEEPALIVE, r, -1); }

/* An idle client idle for `keepalive` is handed out for a background
 * validate at that exact time (no polling): not granted meanwhile, still
 * idle; a good report puts it back on top with a fresh keepalive clock and
 * its idle time from its last use; a bad one destroys it. */
static void t_keepalive_exact_time_ok_and_fail(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  hold_t h, h2;
  clientpool_grant_t g;
  clientpool_stats_t s;
  int i;
  c.keepalive = 10; c.max_live = 2; c.max_idle = 2;
  p = POOL(c);
  k = PKEY(p);
  h = NEW_LEASE(p, k, 0);
  RELEASE(p, h, 0);
  drain(p);
  CHECK(clientpool_next_deadline(p) == 10);
  CHECK(last_timer() == 10);
  TICK(p, 9.999);
  drain(p);
  CHECK_EQ(n_keepalive(h.record), 0);
  TICK(p, 10);
  drain(p);
  CHECK_EQ(n_keepalive(h.record), 1);
  CHECK(g_ev[find_ev(CLIENTPOOL_EV_KEEPALIVE, h.record, -1, k)].t == 10);   /* seconds idle */
  s = pstats(p);
  CHECK(s.idle == 1 && s.keepalive == 1 && KSTATS(p, k).keepalive == 1);
  h2 = NEW_LEASE(p, k, 10);                  /* not granted while out: a new client */
  CHECK(h2.record != h.record);
  CHECK_EQ(KEEPALIVE_DONE(p, h.record, 1, 11), 0);
  CHECK_EQ(KEEPALIVE_DONE(p, h.record, 1, 11), CLIENTPOOL_STALE);   /* once */
  CHECK(clientpool_next_deadline(p) == 21);  /* fresh keepalive clock */
  h = REUSE(p, k, 12, &g);                   /* back on top; idle since its last use */
  CHECK_NEAR(g.idle, 12);
  RELEASE(p, h, 12);
  RELEASE(p, h2, 13);
  for (i = 0; i < 2; i++) {
    TICK(p, 22 + i);
    drain(p);
  }
  CHECK_EQ(pstats(p).keepalive, 3);
  CHECK_EQ(KEEPALIVE_DONE(p, h.record, 0, 24), 0);   /* found dead */
  drain(p);
  EXPECT_DESTROY(h.record, CLIENTPOOL_BY_INVALID);
  s = pstats(p);
  CHECK(s.keepalive_failed == 1 && s.idle == 1 && s.closed_by[CLIENTPOOL_BY_INVALID] == 1);
  CHECK_EQ(KEEPALIVE_DONE(p, h2.record, 1, 24), 0);
  CHECK_EQ(KEEPALIVE_DONE(p, 9999, 1, 24), CLIENTPOOL_STALE);
  CHECK_EQ(KEEPALIVE_DONE(p, h2.record, 1, 24), CLIENTPOOL_STALE);   /* idle, not out */
}

/* At most CLIENTPOOL_KEEPALIVE_MAX at once: the others wait their turn and
 * are handed out as reports come; a waiter of the key gets a client that
 * comes back. */
static void t_keepalive_bounded_and_waiters(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k, out[8];
  hold_t h[5];
  clientpool_grant_t g;
  waiter_h w;
  int i, n;
  c.keepalive = 5; c.max_live = 5; c.max_idle = 5; c.max_concurrency = 8;
  p = POOL(c);
  k = PKEY(p);
  for (i = 0; i < 5; i++) h[i] = NEW_LEASE(p, k, 0);
  for (i = 0; i < 5; i++) RELEASE(p, h[i], 1);
  TICK(p, 6);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_KEEPALIVE), CLIENTPOOL_KEEPALIVE_MAX);
  CHECK(clientpool_next_deadline(p) == -1);  /* the others wait for a report, no timer */
  for (i = n = 0; i < g_nev; i++) if (g_ev[i].type == CLIENTPOOL_EV_KEEPALIVE) out[n++] = g_ev[i].a;
  CHECK_EQ(KEEPALIVE_DONE(p, out[0], 1, 7), 0);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_KEEPALIVE), 1);   /* the next one, at once */
  /* the three left idle are taken; a waiter then gets one coming back */
  for (i = 0; i < 3; i++) { hold_t x = REUSE(p, k, 7, &g); (void)x; }
  CHECK_STATUS(ACQUIRE(p, k, 7, &g), CLIENTPOOL_MUST_WAIT);   /* max_live 5: all are in use */
  w = WAIT(p, k, -1, 7);
  CHECK_EQ(KEEPALIVE_DONE(p, out[1], 1, 8), 0);
  drain(p);
  EXPECT_WAKE(w);
  CHECK_STATUS(CLAIM(p, w, 8, &g), CLIENTPOOL_GRANT_IDLE);
  CHECK_EQ(g.record, out[1]);
}

/* A record out for a keepalive that was retired, went past its lifetime
 * or idle_timeout, is over a lowered cap, or whose pool closed, is
 * destroyed at the report; while one is out its key does not fail fast. */
static void t_keepalive_while_out(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k, b;
  hold_t h[4];
  clientpool_grant_t g;
  int i;
  g_auto_destroy = 1;
  c.keepalive = 1; c.max_live = 4; c.max_idle = 4; c.idle_timeout = 3; c.max_lifetime = 100;
  c.create_backoff = 10; c.create_backoff_max = 10;
  p = POOL(c);
  k = PKEY(p); b = PKEY(p);
  for (i = 0; i < 2; i++) h[i] = NEW_LEASE(p, k, 0);
  for (i = 0; i < 2; i++) RELEASE(p, h[i], 0);
  TICK(p, 1);                               /* both out */
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_KEEPALIVE), 2);
  CHECK_EQ(RETIRE(p, h[0].record, 1), 0);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_DESTROY), 0);       /* at its report */
  TICK(p, 3);                               /* h[1] past idle_timeout while out */
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_DESTROY), 0);
  CHECK(clientpool_next_deadline(p) == 100);   /* lifetimes; the idle list is empty */
  CHECK_EQ(KEEPALIVE_DONE(p, h[0].record, 1, 3), 0);
  CHECK_EQ(KEEPALIVE_DONE(p, h[1].record, 1, 3), 0);
  drain(p);
  EXPECT_DESTROY(h[0].record, CLIENTPOOL_BY_RETIRED);
  EXPECT_DESTROY(h[1].record, CLIENTPOOL_BY_IDLE);
  /* lifetime, a lower cap and close while out */
  for (i = 0; i < 3; i++) h[i] = NEW_LEASE(p, b, 10);
  for (i = 0; i < 3; i++) RELEASE(p, h[i], 10);
  TICK(p, 11);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_KEEPALIVE), 2);
  /* b's create fails: a window; with clients of b out it waits, not fails */
  CHECK_STATUS(ACQUIRE(p, b, 11, &g), CLIENTPOOL_GRANT_IDLE);   /* the third, not out */
  CHECK_STATUS(ACQUIRE(p, b, 11, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK_EQ(CREATED(p, g.record, 0, 11), 0);
  CHECK_STATUS(ACQUIRE(p, b, 11, &g), CLIENTPOOL_MUST_WAIT);
  c.max_live = 1; c.max_idle = 1;
  CHECK_EQ(CONFIGURE(p, c, 12), 0);
  {
    int32_t o[2], n = 0;
    for (i = 0; i < 3; i++) if (wb_rec_state(p, h[i].record) == WB_CHECKING) o[n++] = h[i].record;
    CHECK_EQ(n, 2);
    CHECK_EQ(KEEPALIVE_DONE(p, o[0], 1, 12), 0);
    drain(p);
    EXPECT_DESTROY(o[0], CLIENTPOOL_BY_RESIZED);
    CLOSE(p, 13);
    CHECK_EQ(KEEPALIVE_DONE(p, o[1], 1, 13), 0);
    drain(p);
    EXPECT_DESTROY(o[1], CLIENTPOOL_BY_DRAIN);
  }
}

/* configure: keepalive on for idle records (measured from when they went
 * idle), a new value for those armed, off. */
static void t_keepalive_configure(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p;
  int32_t k;
  hold_t h;
  c.max_live = 2; c.max_idle = 2;
  p = POOL(c);
  k = PKEY(p);
  h = NEW_LEASE(p, k, 0);
  RELEASE(p, h, 2);
  CHECK(clientpool_next_deadline(p) == -1);
  c.keepalive = 10;
  CHECK_EQ(CONFIGURE(p, c, 5), 0);
  CHECK(clientpool_next_deadline(p) == 12);  /* idle since 2 */
  c.keepalive = 4;
  CHECK_EQ(CONFIGURE(p, c, 5), 0);
  CHECK(clientpool_next_deadline(p) == 6);
  c.keepalive = 2;                          /* already due: handed out at once */
  CHECK_EQ(CONFIGURE(p, c, 5), 0);
  drain(p);
  CHECK_EQ(n_keepalive(h.record), 1);
  CHECK_EQ(KEEPALIVE_DONE(p, h.record, 1, 5), 0);
  c.keepalive = -1;
  CHECK_EQ(CONFIGURE(p, c, 6), 0);
  CHECK(clientpool_next_deadline(p) == -1);
  c.keepalive = 0;
  CHECK_EQ(CONFIGURE(p, c, 6), CLIENTPOOL_EINVAL);
}

#define T(f) { #f, f }

static const test_t tests[] = {
  /* 1 config */
  T(t_config_rejects_outside_envelope),
  T(t_config_accepts_envelope_edges),
  /* 2 lazy creation */
  T(t_create_first_acquire_reserves),
  T(t_create_failure_forfeits),
  T(t_create_failure_hands_capacity_to_waiter),
  /* 3 reuse */
  T(t_reuse_lifo),
  T(t_validate_after_idle),
  /* 4 idle timeout */
  T(t_idle_timeout_at_acquire),
  T(t_idle_timeout_by_tick),
  T(t_timer_events),
  /* 5 lifetime */
  T(t_lifetime_jitter_window_and_seed),
  T(t_lifetime_without_jitter_exact),
  T(t_lifetime_leased_destroyed_at_release),
  T(t_lifetime_at_acquire),
  /* 6 max_idle */
  T(t_max_idle_on_release),
  T(t_key_max_idle_on_release),
  T(t_max_idle_zero_still_hands_to_waiter),
  /* 7 keys and budgets */
  T(t_key_max_live_under_global),
  T(t_evict_lru_idle_of_other_key),
  T(t_no_eviction_when_key_capped),
  T(t_starvation_bound),
  T(t_max_keys),
  T(t_key_forgotten_after_last_record),
  T(t_key_pinned_not_forgotten),
  T(t_key_forget),
  T(t_max_concurrency_independent_of_max_live),
  T(t_max_concurrency_counts_reservations),
  T(t_max_waiting_full),
  T(t_max_waiting_zero_fails_fast),
  /* 8 FIFO */
  T(t_fifo_one_key),
  T(t_fifo_cross_key_capped_does_not_block),
  T(t_fifo_cross_key_earlier_servable_wins),
  /* 9 waiters */
  T(t_waiter_timeout_by_tick),
  T(t_waiter_cancel_queued),
  T(t_waiter_cancel_after_grant_returns_grant),
  T(t_waiter_claim_pending_and_stale),
  T(t_waiter_served_at_once),
  /* 10 abandon */
  T(t_abandon_queued),
  T(t_abandon_granted_idle_back_to_stack),
  T(t_abandon_granted_idle_to_next_waiter),
  T(t_abandon_granted_reservation_forfeited),
  /* 11 release */
  T(t_release_idempotent),
  T(t_release_stale_cannot_end_new_holder),
  T(t_release_reasons),
  /* 12 leak */
  T(t_leak),
  T(t_ids_reused_only_after_their_event),
  T(t_leak_threshold_reports_once),
  /* 13 retire */
  T(t_retire),
  /* 14 close */
  T(t_close),
  T(t_close_destroys_idle_and_is_idempotent),
  T(t_close_with_granted_unclaimed_waiter),
  /* 15 time */
  T(t_time_never_backwards),
  T(t_time_nan),
  /* 16 stats */
  T(t_stats_identities),
  /* 17 scale */
  T(t_scale_100k_idle_1k_keys),
  /* 18 randomized */
  T(t_fuzz_random_ops),
  /* 19 regressions */
  T(t_regress_acquire_expired_idle_keeps_key),
  T(t_regress_key_kept_for_unclaimed_waiter),
  T(t_regress_take_open_stale_key_starves_others),
  T(t_regress_refill_at_cap_starves_others),
  /* 20 edges */
  T(t_gate_states_and_probe),
  T(t_key_pin_modes),
  T(t_retire_before_variants),
  T(t_retire_upto),
  T(t_regrant_keeps_place),
  T(t_retired_refill_is_not_reused),
  T(t_floor_renewals_keep_idle_time),
  T(t_idle_expiry_never_early_by_rounding),
  T(t_floor_edges),
  T(t_queries_and_stale_handles),
  T(t_shared_fewest_leases_and_loss),
  T(t_shared_lifetime),
  /* 21 out of memory */
  T(t_oom_new_keys_waiters),
  T(t_oom_records_leases_deadlines),
  T(t_oom_shared),
  /* 22 the checker */
  T(t_check_catches_corruption),
  /* 23 memory */
  T(t_idle_record_bytes),
  /* 24 the physical cap */
  T(t_closing_counts_against_max_live),
  T(t_closing_key_cap_and_key_kept),
  T(t_closing_eviction_waits_for_destroy),
  T(t_closing_regrant_keeps_place),
  T(t_closing_floor_refill),
  /* 25 create backoff */
  T(t_backoff_window_fail_fast_and_probe),
  T(t_backoff_waits_when_a_client_may_come_back),
  T(t_backoff_jitter_by_seed),
  T(t_backoff_refill_and_forget),
  /* 26 configure, key caps */
  T(t_configure_refuses_and_changes_nothing),
  T(t_configure_lower_max_live),
  T(t_configure_raise_and_waiting),
  T(t_configure_durations),
  T(t_key_caps),
  /* 27 priorities */
  T(t_priority_order),
  T(t_priority_aging_bound),
  T(t_priority_cross_key_and_extremes),
  /* 28 keepalive */
  T(t_keepalive_exact_time_ok_and_fail),
  T(t_keepalive_bounded_and_waiters),
  T(t_keepalive_while_out),
  T(t_keepalive_configure),
};

/* runs one test; a failed CHECK longjmps back here.  Returns 1 if it failed. */
static int run_one(const test_t *t) {
  g_test = t->name;
  g_failed = 0;
  g_auto_destroy = 1;
  g_stride = 1;
  g_calls = 0;
  g_ctx[0] = 0;
  if (setjmp(g_jump) == 0) t->fn();
  free_owned();
  return g_failed;
}

int main(int argc, char **argv) {
  int passed = 0, failed = 0;
  size_t i;
  for (i = 0; i < sizeof tests / sizeof tests[0]; i++) {
    if (argc > 1 && !strstr(tests[i].name, argv[1])) continue;
    if (run_one(&tests[i])) failed++; else passed++;
  }
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
