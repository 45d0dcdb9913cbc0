/*
 * test_engine.c - the harness and runner of the engine's C tests
 * (csrc/engine.c); the tests themselves are in spec/c/test_engine_*.c, one
 * file per group of sections, over the harness header spec/c/test_engine.h.
 *
 * The engine is a pure, clock-injected state machine: every test passes the
 * time in explicitly and drains the engine's events itself, playing the part
 * of the driver.
 *
 * Build and run (also built by `make test-c` and, under ASan/UBSan, by
 * `make test-c-asan`):
 *
 *   gcc -std=c11 -Wall -Wextra -Werror -pedantic -Wshadow -Wmissing-prototypes \
 *       -Wstrict-prototypes -O1 -g -Icsrc spec/c/test_engine.c spec/c/test_engine_*.c \
 *       spec/c/whitebox.c csrc/clock.c -lm -o build/test_engine && ./build/test_engine
 *
 *   ./build/test_engine [substring]   runs only the tests whose name contains it
 *   CLIENTPOOL_FUZZ_SEED=n            changes the seed of the randomized test
 *
 * Harness.  Each test is a function, listed in its file's table (tests_*).
 * A failing CHECK prints file:line and the expression, marks the test failed
 * and abandons it (longjmp back to the runner, which frees the pools and
 * memory the test registered), and the next test runs.  The program ends by
 * printing one line `N passed, N failed` and exits non-zero if any test
 * failed.
 *
 * Every mutating engine call goes through CALLED (test_engine.h; the
 * macros ACQUIRE, RELEASE_RAW, TICK, ... are made of it), which runs
 * clientpool_check() right after the call and fails the test if an
 * invariant is broken.  The only exception is the scale test,
 * where the O(pool size) checker runs every 1000 calls and at each phase
 * boundary (running it after each of ~300k calls on a 100k-record pool would
 * take minutes).  The driver the harness plays has no destroy hook: every
 * destroy is reported done right after the call that started it, unless a
 * test of the closing state turns that off (g_auto_destroy).
 *
 * The engine is linked through spec/c/whitebox.c (csrc/engine.c unchanged,
 * plus allocation-failure injection and internal views), which sections 21
 * and 22 use.
 *
 * Files and sections:
 *   test_engine_basics.c     1 config, 2 lazy creation, 3 reuse and validate,
 *                            4 idle timeout, 5 lifetime, 6 max_idle
 *   test_engine_keys.c       7a-7d per-key caps, eviction, keys, max_concurrency,
 *                            max_waiting; 8 FIFO and cross-key order
 *   test_engine_waiters.c    9 deadlines and cancel, 10 abandon, 11 release, 12 leaks
 *   test_engine_lifecycle.c  13 retire, 14 close, 15 time, 16 stats identities,
 *                            20 gates, pins, retire_before, floor edges, queries,
 *                            shared records (capacity > 1)
 *   test_engine_scale.c      17 scale, 18 randomized test against a model,
 *                            23 memory per idle record, idle expiry exactness
 *   test_engine_regress.c    19 regressions (engine bugs; a test for one not fixed
 *                            yet is named KNOWN_BUG_* and says what it expected)
 *   test_engine_faults.c     21 out of memory, 22 clientpool_check catches corruption
 *   test_engine_cap.c        24 the physical cap (closing records), 25 create backoff
 *   test_engine_live.c       26 configure and per-key caps, 27 priorities, 28 keepalive
 *   test_engine_fleet.c      30 engines on a fleet
 *
 * The model-based fuzzer (spec/c/fuzz_engine.c against spec/c/model.c, `make
 * fuzz`) covers what this suite's randomized test predates: capacity > 1,
 * pause/resume/probe, pause_fail, the warm floor, retire_before, the closing
 * state, backoff, configure, priorities and keepalive.
 */
#include "test_engine.h"

/* ===================================================================== */
/* harness                                                               */
/* ===================================================================== */

jmp_buf g_jump;
const char *g_test = "";
int g_failed;
char g_ctx[200];          /* context printed with a failure (fuzz seed, step) */
long g_stride = 1;        /* run clientpool_check every g_stride calls */
long g_calls;

clientpool_t *g_pools[OWN_MAX];
void *g_mem[OWN_MAX];

void fail_at(const char *file, int line, const char *fmt, ...) {
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

void own_pool(clientpool_t *p) {
  int i;
  for (i = 0; i < OWN_MAX; i++) if (!g_pools[i]) { g_pools[i] = p; return; }
  abort();
}

void free_pool(clientpool_t *p) {   /* frees an owned pool before the test ends */
  int i;
  for (i = 0; i < OWN_MAX; i++) if (g_pools[i] == p) g_pools[i] = NULL;
  clientpool_free(p);
}

void *own_mem(size_t n) {
  int i;
  void *m = calloc(1, n);
  if (!m) abort();
  for (i = 0; i < OWN_MAX; i++) if (!g_mem[i]) { g_mem[i] = m; return m; }
  abort();
}

void free_owned(void) {
  int i;
  for (i = 0; i < OWN_MAX; i++) {
    clientpool_free(g_pools[i]);
    free(g_mem[i]);
    g_pools[i] = NULL;
    g_mem[i] = NULL;
  }
}

/* deterministic PRNG for the tests (xorshift64*) */
uint64_t g_rng = 1;
void rng_seed(uint64_t s) { g_rng = s ? s : 0x9E3779B97F4A7C15ULL; }
uint32_t rng_u32(void) {
  uint64_t x = g_rng;
  x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
  g_rng = x;
  return (uint32_t)((x * 2685821657736338717ULL) >> 32);
}
int rng_int(int n) { return (int)(rng_u32() % (uint32_t)n); }
double rng_unit(void) { return (double)rng_u32() / 4294967296.0; }

const char *status_name(int s) {
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

/* ===================================================================== */
/* events: drain the queue into g_ev and ask questions about it           */
/* ===================================================================== */

clientpool_event_t g_ev[EVCAP];
int g_nev;
long g_evcount[EVTYPES];      /* by type, this drain */
long g_evby[CLIENTPOOL_BY_COUNT];   /* DESTROY by reason, this drain */

void drain(clientpool_t *p) {
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

long n_events(int type) { return g_evcount[type]; }

/* index of the first event matching, or -1; a field < 0 (or gen ~0) matches anything */
int find_ev(int type, int32_t a, int32_t b, int32_t c) {
  int i;
  for (i = 0; i < g_nev; i++) {
    const clientpool_event_t *e = &g_ev[i];
    if (e->type == type && (a < 0 || e->a == a) && (b < 0 || e->b == b) && (c < 0 || e->c == c))
      return i;
  }
  return -1;
}

int count_ev(int type, int32_t a, int32_t b) {
  int i, n = 0;
  for (i = 0; i < g_nev; i++)
    if (g_ev[i].type == type && (a < 0 || g_ev[i].a == a) && (b < 0 || g_ev[i].b == b)) n++;
  return n;
}

int n_destroy(int32_t rec, int32_t reason) { return count_ev(CLIENTPOOL_EV_DESTROY, rec, reason); }
int n_wake(int32_t w, uint32_t gen) { return count_ev(CLIENTPOOL_EV_WAKE, w, (int32_t)gen); }
int n_key_free(int32_t k) { return count_ev(CLIENTPOOL_EV_KEY_FREE, k, -1); }
int n_leak(int32_t l, uint32_t gen) { return count_ev(CLIENTPOOL_EV_LEAK, l, (int32_t)gen); }

double last_timer(void) {   /* t of the last EV_TIMER of this drain, or -1 */
  int i;
  for (i = g_nev - 1; i >= 0; i--) if (g_ev[i].type == CLIENTPOOL_EV_TIMER) return g_ev[i].t;
  return -1;
}

/* ===================================================================== */
/* after an engine call (CALLED): clientpool_check() and the destroys    */
/* ===================================================================== */

/* The driver of most tests has no destroy hook: it reports every destroy
 * done at once (clientpool_destroyed), right after the call that started
 * it.  Tests of the closing state itself turn this off (g_auto_destroy = 0)
 * and report destroys when they choose. */
int g_auto_destroy = 1;

void after(clientpool_t *p, const char *file, int line, const char *what) {
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

void check_full(clientpool_t *p, const char *file, int line) {
  long s = g_stride;
  g_stride = 1;
  after(p, file, line, "(explicit check)");
  g_stride = s;
}

/* after_call: what CALLED (test_engine.h) runs once the engine call made
 * its result rc: after() (the invariant check and the auto-destroys), then
 * rc handed back to the test. */
long after_call(clientpool_t *p, const char *file, int line, const char *what, long rc) {
  after(p, file, line, what);
  return rc;
}

/* ===================================================================== */
/* helpers                                                               */
/* ===================================================================== */

hold_t hold_of(const clientpool_grant_t *g) {
  hold_t h;
  h.lease = g->lease; h.gen = g->lease_gen; h.record = g->record; h.key = g->key;
  return h;
}

clientpool_config_t cfg_base(void) {
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

/* cfg_base with other caps (most tests' pool: one client, cfg_caps(1, 1)) */
clientpool_config_t cfg_caps(int32_t max_live, int32_t max_idle) {
  clientpool_config_t c = cfg_base();
  c.max_live = max_live;
  c.max_idle = max_idle;
  return c;
}

clientpool_t *pool_at(const clientpool_config_t *c, const char *file, int line) {
  clientpool_t *p = NULL;
  int rc = clientpool_new(c, &p);
  if (rc != CLIENTPOOL_OK || !p) fail_at(file, line, "clientpool_new failed: %d", rc);
  own_pool(p);
  after(p, file, line, "clientpool_new");
  return p;
}

int32_t key_at(clientpool_t *p, int pinned, const char *file, int line) {
  int32_t k = (int32_t)CALLED_AT(p, file, line, clientpool_key_open(p));
  if (k < 0) fail_at(file, line, "clientpool_key_open failed: %d", (int)k);
  if (pinned && CALLED_AT(p, file, line, clientpool_key_pin(p, k, 1)) != 0) fail_at(file, line, "key_pin failed");
  return k;
}

/* an acquire that must reserve, followed by a successful create */
hold_t lease_new_at(clientpool_t *p, int32_t k, double now, const char *file, int line) {
  clientpool_grant_t g;
  int st = (int)CALLED_AT(p, file, line, clientpool_acquire(p, k, now, &g));
  if (st != CLIENTPOOL_GRANT_CREATE)
    fail_at(file, line, "acquire(key %d) gave %s, expected GRANT_CREATE", (int)k, status_name(st));
  CHECK_AT(g.record >= 0 && g.lease >= 0 && g.key == k, file, line);
  if (CALLED_AT(p, file, line, clientpool_created(p, g.record, 1, now)) != 0) fail_at(file, line, "created(ok) failed");
  return hold_of(&g);
}

/* k made the warm key, the floor on, and the record its refill reserves
 * created at `now` (idle from then on); returns the record */
int32_t warm_record_at(clientpool_t *p, int32_t k, double now, const char *file, int line) {
  int32_t r, kk = -1;
  if (CALLED_AT(p, file, line, clientpool_key_pin(p, k, 2)) != 0) fail_at(file, line, "key_pin(%d, 2) failed", (int)k);
  clientpool_floor(p, 1, now);
  r = clientpool_refill(p, now, &kk);
  CHECK_AT(r >= 0 && kk == k, file, line);
  if (CALLED_AT(p, file, line, clientpool_created(p, r, 1, now)) != 0) fail_at(file, line, "created(ok) failed");
  return r;
}

/* an acquire that must hand out an idle record; *g (optional) gets the grant */
hold_t lease_idle_at(clientpool_t *p, int32_t k, double now, clientpool_grant_t *out,
                            const char *file, int line) {
  clientpool_grant_t g;
  int st = (int)CALLED_AT(p, file, line, clientpool_acquire(p, k, now, &g));
  if (st != CLIENTPOOL_GRANT_IDLE)
    fail_at(file, line, "acquire(key %d) gave %s, expected GRANT_IDLE", (int)k, status_name(st));
  CHECK_AT(g.record >= 0 && g.lease >= 0 && g.key == k, file, line);
  if (out) *out = g;
  return hold_of(&g);
}

void release_at(clientpool_t *p, hold_t h, int32_t reason, double now, const char *file, int line) {
  int rc = (int)CALLED_AT(p, file, line, clientpool_release(p, h.lease, h.gen, reason, now));
  if (rc != 0) fail_at(file, line, "release(lease %d/%u) gave %s", (int)h.lease, (unsigned)h.gen, status_name(rc));
}

waiter_h wait_at(clientpool_t *p, int32_t k, double deadline, double now, const char *file, int line) {
  waiter_h wh;
  wh.gen = 0;
  wh.w = (int32_t)CALLED_AT(p, file, line, clientpool_wait(p, k, deadline, now, &wh.gen));
  if (wh.w < 0) fail_at(file, line, "wait(key %d) gave %d", (int)k, (int)wh.w);
  return wh;
}

waiter_h wait_prio_at(clientpool_t *p, int32_t k, int32_t prio, double now, const char *file, int line) {
  waiter_h wh;
  wh.gen = 0;
  wh.w = clientpool_wait_priority(p, k, -1, prio, now, &wh.gen);
  after(p, file, line, "clientpool_wait_priority");
  if (wh.w < 0) fail_at(file, line, "wait_priority(key %d, %d) gave %d", (int)k, (int)prio, (int)wh.w);
  return wh;
}

void must_wait_at(clientpool_t *p, int32_t k, double now, const char *file, int line) {
  clientpool_grant_t g;
  int st = (int)CALLED_AT(p, file, line, clientpool_acquire(p, k, now, &g));
  if (st != CLIENTPOOL_MUST_WAIT)
    fail_at(file, line, "acquire(key %d) gave %s, expected MUST_WAIT", (int)k, status_name(st));
}

clientpool_stats_t pstats(const clientpool_t *p) {
  clientpool_stats_t s;
  clientpool_stats(p, -1, &s);
  return s;
}

clientpool_stats_t kstats_at(const clientpool_t *p, int32_t k, const char *file, int line) {
  clientpool_stats_t s;
  memset(&s, 0, sizeof s);
  if (clientpool_stats(p, k, &s) != 0) fail_at(file, line, "stats of key %d: unknown key", (int)k);
  return s;
}

int stats_equal(const clientpool_stats_t *a, const clientpool_stats_t *b) {
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
void check_sums_at(const clientpool_t *p, const int32_t *keys, int n, const char *file, int line) {
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

/* ===================================================================== */
/* runner                                                                */
/* ===================================================================== */

static const test_t *const suites[] = {
  tests_basics,
  tests_keys,
  tests_waiters,
  tests_lifecycle,
  tests_scale,
  tests_regress,
  tests_faults,
  tests_cap,
  tests_live,
  tests_fleet,
  tests_untimed,
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
  size_t s;
  const test_t *t;
  for (s = 0; s < sizeof suites / sizeof suites[0]; s++)
    for (t = suites[s]; t->name; t++) {
      if (argc > 1 && !strstr(t->name, argv[1])) continue;
      if (run_one(t)) failed++; else passed++;
    }
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
