/*
 * test_engine_waiters.c - the engine's C tests: waiter deadlines and
 * cancel, abandon, release, leaks (sections 9-12).
 * Harness: spec/c/test_engine.h; runner: spec/c/test_engine.c.
 */
#include "test_engine.h"

/* ===================================================================== */
/* 9. waiter deadlines, cancel, claim                                    */
/* ===================================================================== */

static void t_waiter_timeout_by_tick(void) {
  clientpool_config_t c = cfg_caps(1, 1);
  clientpool_grant_t g;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  (void)NEW_LEASE(p, k, 0);
  MUST_WAIT(p, k, 1);
  waiter_h w = WAIT(p, k, 5, 1);
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
  clientpool_stats_t s = pstats(p);
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
  clientpool_config_t c = cfg_caps(1, 1);
  waiter_h w1, w2, w3;
  clientpool_grant_t g;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  (void)NEW_LEASE(p, k, 0);
  w1 = WAIT(p, k, 10, 0);
  w2 = WAIT(p, k, -1, 0);
  w3 = WAIT(p, k, -1, 0);
  CHECK_STATUS(CANCEL(p, w1, CLIENTPOOL_TIMEOUT, 2, &g), CLIENTPOOL_TIMEOUT);
  CHECK_NEAR(g.waited, 2);
  CHECK_NEAR(clientpool_next_deadline(p), -1);          /* its deadline left with it */
  CHECK_STATUS(CANCEL(p, w2, CLIENTPOOL_CANCELLED, 3, &g), CLIENTPOOL_CANCELLED);
  CHECK_STATUS(CANCEL(p, w3, 12345, 3, &g), CLIENTPOOL_CANCELLED);   /* other codes: cancelled */
  clientpool_stats_t s = pstats(p);
  CHECK(s.waiting == 0 && s.timeouts == 1 && s.cancelled == 2 && s.wait_count == 3);
  CHECK_NEAR(s.wait_time, 8);
  CHECK_STATUS(CANCEL(p, w1, CLIENTPOOL_CANCELLED, 4, &g), CLIENTPOOL_STALE);
  CHECK_STATUS(CLAIM(p, w2, 4, &g), CLIENTPOOL_STALE);
}

static void t_waiter_cancel_after_grant_returns_grant(void) {
  clientpool_config_t c = cfg_caps(1, 1);
  clientpool_grant_t g;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  hold_t h = NEW_LEASE(p, k, 0);
  waiter_h w = WAIT(p, k, 10, 0);
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
  clientpool_config_t c = cfg_caps(1, 1);
  waiter_h w, bad;
  clientpool_grant_t g;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
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
  clientpool_grant_t g;
  drain(p);
  waiter_h w = WAIT(p, k, 5, 1);                     /* room: granted right away */
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
  clientpool_config_t c = cfg_caps(1, 1);
  clientpool_grant_t g;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  (void)NEW_LEASE(p, k, 0);
  waiter_h w = WAIT(p, k, 9, 0);
  CHECK_EQ(ABANDON(p, w, 1), 0);
  CHECK(pstats(p).waiting == 0 && pstats(p).cancelled == 1);
  CHECK_NEAR(clientpool_next_deadline(p), -1);
  CHECK_STATUS(CLAIM(p, w, 1, &g), CLIENTPOOL_STALE);
  CHECK_EQ(ABANDON(p, w, 1), CLIENTPOOL_STALE);
}

static void t_abandon_granted_idle_back_to_stack(void) {
  clientpool_config_t c = cfg_caps(1, 1);
  hold_t h, x;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  h = NEW_LEASE(p, k, 0);
  waiter_h w = WAIT(p, k, -1, 0);
  RELEASE(p, h, 1);
  drain(p);
  EXPECT_WAKE(w);
  CHECK(pstats(p).reused == 1 && pstats(p).leases == 1);
  CHECK_EQ(ABANDON(p, w, 2), 0);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_DESTROY), 0);
  clientpool_stats_t s = pstats(p);
  CHECK(s.idle == 1 && s.leases == 0 && s.active == 0 && s.live == 1);
  CHECK(s.reused == 0 && s.cancelled == 1);              /* handed back unused */
  x = REUSE(p, k, 3, NULL);
  CHECK_EQ(x.record, h.record);
}

static void t_abandon_granted_idle_to_next_waiter(void) {
  clientpool_config_t c = cfg_caps(1, 1);
  waiter_h w1, w2;
  clientpool_grant_t g;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  hold_t h = NEW_LEASE(p, k, 0);
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
  clientpool_config_t c = cfg_caps(1, 1);
  clientpool_grant_t g, g2;
  waiter_h w1, w2;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
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
  clientpool_stats_t s = pstats(p);
  CHECK(s.live == 1 && s.creating == 0 && s.leases == 1 && s.waiting == 0);
  CHECK(s.create_failed == 1 && s.cancelled == 1 && s.opened == 1);
  hold_t x = hold_of(&g2);
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
  hold_t h, h2;
  c.leak_threshold = 5;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  h = NEW_LEASE(p, k, 1);
  CHECK_NEAR(clientpool_next_deadline(p), 6);
  drain(p);
  TICK(p, 5.9);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_LEAK), 0);
  TICK(p, 6);
  drain(p);
  CHECK_EQ(n_leak(h.lease, h.gen), 1);
  int i = find_ev(CLIENTPOOL_EV_LEAK, h.lease, (int32_t)h.gen, k);
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

const test_t tests_waiters[] = {
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
  { NULL, NULL }
};
