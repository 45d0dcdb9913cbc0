/*
 * test_engine_untimed.c - the engine's C tests: the untimed calls
 * (clientpool_acquire_untimed, clientpool_release_untimed; issue 17), the
 * fast path without a clock read.  What they do, what they decline, and
 * that a duration configured later counts their stamps in the safe
 * direction.  Harness: spec/c/test_engine.h; runner: spec/c/test_engine.c.
 */
#include "test_engine.h"

#define ACQUIRE_UNTIMED(p, k, g) (int)CALLED(p, clientpool_acquire_untimed((p), (k), (g)))
#define RELEASE_UNTIMED(p, l, gen, reason) (int)CALLED(p, clientpool_release_untimed((p), (l), (gen), (reason)))

/* A pool of cfg c with one idle record of a pinned key, made at time 10
 * (the engine's latest time). */
static clientpool_t *one_idle(clientpool_config_t c, int32_t *k, int32_t *rec) {
  clientpool_t *p = POOL(c);
  hold_t h;
  *k = PKEY(p);
  h = NEW_LEASE(p, *k, 10);
  RELEASE(p, h, 10);
  drain(p);
  *rec = h.record;
  return p;
}

/* The pair, with the engine's latest time for stamps; STALE for a lease
 * already ended; the release for retirement and a busy pool decline. */
static void t_untimed_pair(void) {
  clientpool_grant_t g;
  clientpool_stats_t before, after;
  int32_t k, rec;
  clientpool_t *p = one_idle(cfg_base(), &k, &rec);
  CHECK_STATUS(ACQUIRE_UNTIMED(p, k, &g), CLIENTPOOL_GRANT_IDLE);
  CHECK_EQ(g.record, rec);
  CHECK_EQ(g.key, k);
  CHECK(g.validate == 1 && g.idle == 0);        /* not measured */
  CHECK_EQ(RELEASE_UNTIMED(p, g.lease, g.lease_gen, -1), 0);
  CHECK_EQ(RELEASE_UNTIMED(p, g.lease, g.lease_gen, -1), CLIENTPOOL_STALE);
  CHECK_EQ(KSTATS(p, k).idle, 1);
  CHECK_EQ(KSTATS(p, k).reused, 1);
  /* a release to destroy, and an acquire with nothing idle: the general path's */
  CHECK_STATUS(ACQUIRE_UNTIMED(p, k, &g), CLIENTPOOL_GRANT_IDLE);
  before = pstats(p);
  CHECK_EQ(RELEASE_UNTIMED(p, g.lease, g.lease_gen, CLIENTPOOL_BY_ERROR), CLIENTPOOL_UNTIMED);
  after = pstats(p);
  CHECK(stats_equal(&before, &after));
  RELEASE_RAW(p, g.lease, g.lease_gen, CLIENTPOOL_BY_ERROR, 11);
  drain(p);
  before = pstats(p);
  CHECK_EQ(ACQUIRE_UNTIMED(p, k, &g), CLIENTPOOL_UNTIMED);
  after = pstats(p);
  CHECK(stats_equal(&before, &after));
}

/* Every duration option makes them decline, with nothing changed. */
static void t_untimed_declines_with_a_duration(void) {
  int i;
  for (i = 0; i < 5; i++) {
    clientpool_config_t c = cfg_base();
    clientpool_grant_t g;
    clientpool_stats_t before, after;
    int32_t k, rec;
    clientpool_t *p;
    if (i == 0) c.idle_timeout = 60;
    if (i == 1) c.max_lifetime = 60;
    if (i == 2) c.validate_after_idle = 60;
    if (i == 3) c.keepalive = 60;
    if (i == 4) c.leak_threshold = 60;
    p = one_idle(c, &k, &rec);
    before = pstats(p);
    CHECK_EQ(ACQUIRE_UNTIMED(p, k, &g), CLIENTPOOL_UNTIMED);
    after = pstats(p);
    CHECK(stats_equal(&before, &after));
    CHECK_STATUS(ACQUIRE(p, k, 11, &g), CLIENTPOOL_GRANT_IDLE);
    CHECK_EQ(RELEASE_UNTIMED(p, g.lease, g.lease_gen, -1), CLIENTPOOL_UNTIMED);
    CHECK_EQ(KSTATS(p, k).active, 1);
    RELEASE_RAW(p, g.lease, g.lease_gen, -1, 11);
  }
  /* ... and a configure that sets one, or clears the last one */
  {
    clientpool_config_t c = cfg_base();
    clientpool_grant_t g;
    int32_t k, rec;
    clientpool_t *p = one_idle(c, &k, &rec);
    c.idle_timeout = 60;
    CHECK_EQ(CONFIGURE(p, c, 11), 0);
    CHECK_EQ(ACQUIRE_UNTIMED(p, k, &g), CLIENTPOOL_UNTIMED);
    c.idle_timeout = -1;
    CHECK_EQ(CONFIGURE(p, c, 12), 0);
    CHECK_STATUS(ACQUIRE_UNTIMED(p, k, &g), CLIENTPOOL_GRANT_IDLE);
  }
}

/* Stamped with the engine's latest time (10) while the true time went on
 * (to 100, say): idle_timeout and validate_after_idle configured at 100
 * count the idle time from 10, long: closed or validated, never kept. */
static void t_untimed_idle_counted_long(void) {
  clientpool_config_t c = cfg_base();
  clientpool_grant_t g;
  int32_t k, rec;
  clientpool_t *p = one_idle(c, &k, &rec);
  CHECK_STATUS(ACQUIRE_UNTIMED(p, k, &g), CLIENTPOOL_GRANT_IDLE);
  CHECK_EQ(RELEASE_UNTIMED(p, g.lease, g.lease_gen, -1), 0);   /* idle since 10 */
  c.validate_after_idle = 80;
  CHECK_EQ(CONFIGURE(p, c, 100), 0);
  CHECK_STATUS(ACQUIRE(p, k, 100, &g), CLIENTPOOL_GRANT_IDLE);
  CHECK(g.validate == 1);
  CHECK_NEAR(g.idle, 90);
  RELEASE_RAW(p, g.lease, g.lease_gen, -1, 100);
  drain(p);
  /* untimed again (no duration), then idle_timeout = 50 at 200 */
  c.validate_after_idle = -1;
  CHECK_EQ(CONFIGURE(p, c, 100), 0);
  CHECK_STATUS(ACQUIRE_UNTIMED(p, k, &g), CLIENTPOOL_GRANT_IDLE);
  CHECK_EQ(RELEASE_UNTIMED(p, g.lease, g.lease_gen, -1), 0);   /* idle since 100 */
  c.idle_timeout = 50;
  CHECK_EQ(CONFIGURE(p, c, 200), 0);
  drain(p);
  CHECK_STATUS(ACQUIRE(p, k, 200, &g), CLIENTPOOL_GRANT_CREATE);
  drain(p);
  CHECK_EQ(pstats(p).closed_by[CLIENTPOOL_BY_IDLE], 1);
}

/* A lease taken untimed (stamped 10) and held: leak_threshold = 5 set at
 * 100 counts it from 100, not from its stamp (which would report it at
 * once, maybe early): reported at 105, not before. */
static void t_untimed_leak_counted_from_configure(void) {
  clientpool_config_t c = cfg_base();
  clientpool_grant_t g;
  int32_t k, rec;
  clientpool_t *p = one_idle(c, &k, &rec);
  CHECK_STATUS(ACQUIRE_UNTIMED(p, k, &g), CLIENTPOOL_GRANT_IDLE);
  c.leak_threshold = 5;
  CHECK_EQ(CONFIGURE(p, c, 100), 0);
  drain(p);
  CHECK_EQ(n_leak(g.lease, g.lease_gen), 0);
  TICK(p, 104);
  drain(p);
  CHECK_EQ(n_leak(g.lease, g.lease_gen), 0);
  TICK(p, 105);
  drain(p);
  CHECK_EQ(n_leak(g.lease, g.lease_gen), 1);
}

const test_t tests_untimed[] = {
  /* issue 17: the untimed calls */
  T(t_untimed_pair),
  T(t_untimed_declines_with_a_duration),
  T(t_untimed_idle_counted_long),
  T(t_untimed_leak_counted_from_configure),
  { NULL, NULL }
};
