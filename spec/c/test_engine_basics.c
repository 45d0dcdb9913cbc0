/*
 * test_engine_basics.c - the engine's C tests: config, lazy creation, reuse
 * and validate, idle timeout, lifetime, max_idle (sections 1-6).
 * Harness: spec/c/test_engine.h; runner: spec/c/test_engine.c.
 */
#include "test_engine.h"

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

  CHECK_STATUS(ACQUIRE(p, k, 0, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK(g.record >= 0 && g.lease >= 0 && g.key == k && g.validate == 0);
  CHECK_EQ(clientpool_record_key(p, g.record), k);
  clientpool_stats_t s = pstats(p);
  CHECK(s.creating == 1 && s.live == 0 && s.leases == 1 && s.active == 0 && s.opened == 0);
  /* a reservation's lease is not valid before created(ok) */
  CHECK_STATUS(RELEASE_RAW(p, g.lease, g.lease_gen, -1, 0), CLIENTPOOL_STALE);
  drain(p);

  CHECK_EQ(CREATED(p, g.record, 1, 0.5), 0);
  drain(p);
  int i = find_ev(CLIENTPOOL_EV_CREATED, g.record, -1, k);
  CHECK(i >= 0);
  s = pstats(p);
  CHECK(s.live == 1 && s.opened == 1 && s.active == 1 && s.creating == 0 && s.leases == 1);
  s = KSTATS(p, k);
  CHECK(s.live == 1 && s.opened == 1 && s.active == 1);
  CHECK_NEAR(clientpool_lease_age(p, g.lease, g.lease_gen, 1.0), 1.0);   /* held since the grant at 0 */
  CHECK_STATUS(CREATED(p, g.record, 1, 1), CLIENTPOOL_STALE);            /* not creating any more */
  /* the record and key of a held lease are the engine's (the driver keeps neither) */
  int32_t lk = -7;
  CHECK_EQ(clientpool_lease_record(p, g.lease, g.lease_gen, &lk), g.record);
  CHECK_EQ(lk, k);
  CHECK_EQ(clientpool_lease_record(p, g.lease, g.lease_gen, NULL), g.record);
  CHECK_EQ(clientpool_lease_record(p, g.lease, g.lease_gen + 1, &lk), -1);   /* another generation */
  CHECK_EQ(clientpool_lease_record(p, -1, g.lease_gen, &lk), -1);
  CHECK_EQ(clientpool_lease_record(p, 1 << 30, g.lease_gen, &lk), -1);

  RELEASE(p, hold_of(&g), 1);
  s = pstats(p);
  CHECK(s.live == 1 && s.idle == 1 && s.active == 0 && s.leases == 0);
  lk = -7;
  CHECK_EQ(clientpool_lease_record(p, g.lease, g.lease_gen, &lk), -1);   /* released: stale */
  CHECK_EQ(lk, -7);
}

static void t_create_failure_forfeits(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  clientpool_grant_t g;

  CHECK_STATUS(ACQUIRE(p, k, 0, &g), CLIENTPOOL_GRANT_CREATE);
  drain(p);
  CHECK_EQ(CREATED(p, g.record, 0, 1), 0);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_DESTROY), 0);   /* no client was made: nothing to destroy */
  CHECK_EQ(n_events(CLIENTPOOL_EV_CREATED), 0);
  clientpool_stats_t s = pstats(p);
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
  clientpool_config_t c = cfg_caps(1, 1);
  clientpool_grant_t g1, g2;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);

  CHECK_STATUS(ACQUIRE(p, k, 0, &g1), CLIENTPOOL_GRANT_CREATE);
  MUST_WAIT(p, k, 0);
  waiter_h w = WAIT(p, k, -1, 0);
  CHECK_STATUS(CLAIM(p, w, 0, &g2), CLIENTPOOL_PENDING);
  drain(p);

  CHECK_EQ(CREATED(p, g1.record, 0, 2), 0);
  drain(p);
  EXPECT_WAKE(w);
  CHECK_STATUS(CLAIM(p, w, 2, &g2), CLIENTPOOL_GRANT_CREATE);
  CHECK_NEAR(g2.waited, 2);
  CHECK(g2.key == k && g2.record >= 0);
  CHECK_EQ(CREATED(p, g2.record, 1, 3), 0);
  clientpool_stats_t s = pstats(p);
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
  clientpool_stats_t s = pstats(p);
  CHECK(s.reused == 2 && s.opened == 2 && s.idle == 0 && s.active == 2);
  CHECK(KSTATS(p, k).reused == 2);
  RELEASE(p, x, 5);                         /* h1's record back on top */
  x = REUSE(p, k, 6, &g);
  CHECK_EQ(x.record, h1.record);
  CHECK(pstats(p).reused == 3);
}

/* A lease marked a checkout's (the driver's checkout form) is the only kind
 * clientpool_checkout_record answers for; the mark ends with the lease, and
 * the slot's next lease starts unmarked. */
static void t_checkout_mark(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p), lk = -7;
  hold_t a, b;

  a = NEW_LEASE(p, k, 0);
  CHECK_EQ(clientpool_checkout_record(p, a.lease, a.gen, &lk), -1);        /* the acquire form */
  CHECK_EQ(lk, -7);
  CHECK_EQ(clientpool_lease_checkout(p, a.lease, a.gen + 1), -1);          /* stale */
  CHECK_EQ(clientpool_lease_checkout(p, -1, a.gen), -1);
  CHECK_EQ(clientpool_lease_checkout(p, 1 << 30, a.gen), -1);
  CHECK_EQ(clientpool_checkout_record(p, a.lease, a.gen, &lk), -1);
  CHECK_EQ(clientpool_lease_checkout(p, a.lease, a.gen), 0);
  CHECK_EQ(clientpool_checkout_record(p, a.lease, a.gen, &lk), a.record);
  CHECK_EQ(lk, k);
  CHECK_EQ(clientpool_checkout_record(p, a.lease, a.gen + 1, &lk), -1);    /* another generation */
  CHECK_EQ(clientpool_checkout_record(p, -1, a.gen, &lk), -1);
  CHECK_EQ(clientpool_checkout_record(p, 1 << 30, a.gen, &lk), -1);
  RELEASE(p, a, 1);
  CHECK_EQ(clientpool_checkout_record(p, a.lease, a.gen, &lk), -1);        /* released */
  b = REUSE(p, k, 2, NULL);
  CHECK_EQ(b.lease, a.lease);                                              /* the slot again */
  CHECK_EQ(clientpool_checkout_record(p, b.lease, b.gen, &lk), -1);        /* unmarked */
  RELEASE(p, b, 3);
}

static void t_validate_after_idle(void) {
  clientpool_config_t c = cfg_base();
  clientpool_grant_t g;

  c.validate_after_idle = 1.0;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  hold_t h = NEW_LEASE(p, k, 0);
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
  hold_t h, x;
  clientpool_grant_t g;
  c.idle_timeout = 10;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);        /* unpinned: t_regress_acquire_expired_idle_keeps_key */

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
  clientpool_stats_t s = pstats(p);
  CHECK(s.closed_by[CLIENTPOOL_BY_IDLE] == 1 && s.live == 0 && s.creating == 1 && s.idle == 0);
}

static void t_idle_timeout_by_tick(void) {
  clientpool_config_t c = cfg_base();
  hold_t h1, h2, x;
  c.idle_timeout = 10;
  clientpool_t *p = POOL(c);
  int32_t k = UKEY(p);

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
  clientpool_stats_t s = pstats(p);
  CHECK(s.live == 0 && s.idle == 0 && s.closed_by[CLIENTPOOL_BY_IDLE] == 2 && s.closed == 2);
}

static void t_timer_events(void) {
  clientpool_config_t c = cfg_caps(2, 2);
  int32_t a, b;
  hold_t la, lb;
  clientpool_grant_t g;
  c.key_max_live = 1; c.idle_timeout = 10;
  clientpool_t *p = POOL(c);
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
  waiter_h w = WAIT(p, a, 5, 2);
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
  c.max_lifetime = 10;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  hold_t h = NEW_LEASE(p, k, 2);
  RELEASE(p, h, 3);
  CHECK_NEAR(clientpool_next_deadline(p), 12);
  drain(p);
  TICK(p, 12);
  drain(p);
  EXPECT_DESTROY(h.record, CLIENTPOOL_BY_LIFETIME);
}

static void t_lifetime_leased_destroyed_at_release(void) {
  clientpool_config_t c = cfg_base();
  hold_t h, h2;
  c.max_lifetime = 10;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);

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
  clientpool_grant_t g;
  c.max_lifetime = 10;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  hold_t h = NEW_LEASE(p, k, 0);
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
  hold_t h1, h2, h3;
  c.max_idle = 2;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  h1 = NEW_LEASE(p, k, 0);
  h2 = NEW_LEASE(p, k, 0);
  h3 = NEW_LEASE(p, k, 0);
  RELEASE(p, h1, 1);
  RELEASE(p, h2, 1);
  drain(p);
  RELEASE(p, h3, 2);
  drain(p);
  EXPECT_DESTROY(h3.record, CLIENTPOOL_BY_MAX_IDLE);
  clientpool_stats_t s = pstats(p);
  CHECK(s.idle == 2 && s.live == 2 && s.closed_by[CLIENTPOOL_BY_MAX_IDLE] == 1);
}

static void t_key_max_idle_on_release(void) {
  clientpool_config_t c = cfg_base();
  int32_t a, b;
  hold_t a1, a2, b1;
  c.key_max_idle = 1;
  clientpool_t *p = POOL(c);
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
  clientpool_config_t c = cfg_caps(1, 0);
  hold_t h, x;
  clientpool_grant_t g;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  h = NEW_LEASE(p, k, 0);
  MUST_WAIT(p, k, 0);
  waiter_h w = WAIT(p, k, -1, 0);
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

const test_t tests_basics[] = {
  /* 1 config */
  T(t_config_rejects_outside_envelope),
  T(t_config_accepts_envelope_edges),
  /* 2 lazy creation */
  T(t_create_first_acquire_reserves),
  T(t_create_failure_forfeits),
  T(t_create_failure_hands_capacity_to_waiter),
  /* 3 reuse */
  T(t_reuse_lifo),
  T(t_checkout_mark),
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
  { NULL, NULL }
};
