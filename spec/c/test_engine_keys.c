/*
 * test_engine_keys.c - the engine's C tests: per-key caps and eviction,
 * keys, max_concurrency, max_waiting, FIFO and cross-key order (sections
 * 7-8).
 * Harness: spec/c/test_engine.h; runner: spec/c/test_engine.c.
 */
#include "test_engine.h"

/* ===================================================================== */
/* 7a. per-key caps under the global caps; eviction                       */
/* ===================================================================== */

static void t_key_max_live_under_global(void) {
  clientpool_config_t c = cfg_base();
  int32_t a, b, k3;
  hold_t a1, x;
  clientpool_grant_t g;
  c.key_max_live = 2;
  clientpool_t *p = POOL(c);
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
  clientpool_config_t c = cfg_caps(3, 3);
  int32_t a, b, k3;
  hold_t ha, hb, hc;
  clientpool_grant_t g;
  clientpool_stats_t s;
  clientpool_t *p = POOL(c);
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
  clientpool_config_t c = cfg_caps(2, 2);
  int32_t a, b;
  c.key_max_live = 1;
  clientpool_t *p = POOL(c);
  a = PKEY(p); b = PKEY(p);
  (void)NEW_LEASE(p, a, 0);
  hold_t hb = NEW_LEASE(p, b, 0);
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
  clientpool_config_t c = cfg_caps(2, 2);
  int32_t a, b;
  hold_t h[2];
  waiter_h wb, wa;
  clientpool_grant_t g;
  int i;
  c.max_concurrency = 2;
  clientpool_t *p = POOL(c);
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
  int32_t k0, k1, k2;
  clientpool_grant_t g;
  clientpool_stats_t s;
  c.max_keys = 2;
  clientpool_t *p = POOL(c);
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
  clientpool_config_t c = cfg_caps(1, 1);
  int32_t pk, k, k2;
  clientpool_t *p = POOL(c);
  pk = PKEY(p);
  hold_t h = NEW_LEASE(p, pk, 0);
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
  hold_t a, b;
  clientpool_grant_t g;
  c.max_live = 4; c.max_concurrency = 2;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  a = NEW_LEASE(p, k, 0);
  b = NEW_LEASE(p, k, 0);
  MUST_WAIT(p, k, 0);                       /* two of four records live: still must wait */
  clientpool_stats_t s = pstats(p);
  CHECK(s.live == 2 && s.leases == 2);
  waiter_h w = WAIT(p, k, -1, 0);
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
  clientpool_grant_t g1, g2, g3;
  c.max_live = 4; c.max_concurrency = 2;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  CHECK_STATUS(ACQUIRE(p, k, 0, &g1), CLIENTPOOL_GRANT_CREATE);
  CHECK_STATUS(ACQUIRE(p, k, 0, &g2), CLIENTPOOL_GRANT_CREATE);
  MUST_WAIT(p, k, 0);
  waiter_h w = WAIT(p, k, -1, 0);
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
  clientpool_config_t c = cfg_caps(1, 1);
  clientpool_grant_t g;
  uint32_t gen;
  c.max_waiting = 2;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  waiter_h w;
  (void)NEW_LEASE(p, k, 0);
  CHECK(!clientpool_queue_full(p));
  MUST_WAIT(p, k, 0);
  (void)WAIT(p, k, -1, 0);
  CHECK(!clientpool_queue_full(p));         /* one of two */
  MUST_WAIT(p, k, 0);
  w = WAIT(p, k, -1, 0);
  CHECK(clientpool_queue_full(p));          /* (the binding's fast path hands over here) */
  CHECK_STATUS(ACQUIRE(p, k, 1, &g), CLIENTPOOL_FULL);
  CHECK(clientpool_queue_full(p));
  CHECK_EQ(clientpool_abandon(p, w.w, w.gen, 1), 0);
  CHECK(!clientpool_queue_full(p));
  (void)WAIT(p, k, -1, 1);
  CHECK(clientpool_queue_full(p));
  CHECK_EQ(WAIT_RAW(p, k, -1, 1, &gen), -CLIENTPOOL_FULL);
  clientpool_stats_t s = pstats(p);
  CHECK(s.rejected == 2 && s.waiting == 2);
  CHECK(KSTATS(p, k).rejected == 2);
}

/* A waiter granted a client and not yet claimed still counts: its caller
 * may be dead, and only the driver's reaping (the fast path hands over
 * while queue_full) gives the client back. */
static void t_queue_full_counts_unclaimed(void) {
  clientpool_config_t c = cfg_caps(1, 1);
  clientpool_grant_t g;
  c.max_waiting = 1;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  hold_t h = NEW_LEASE(p, k, 0);
  MUST_WAIT(p, k, 0);
  waiter_h w = WAIT(p, k, -1, 0);
  CHECK(clientpool_queue_full(p));
  RELEASE(p, h, 1);                         /* granted to w, not claimed */
  drain(p);
  CHECK_EQ(pstats(p).waiting, 0);
  CHECK(clientpool_queue_full(p));
  CHECK_EQ(clientpool_abandon(p, w.w, w.gen, 2), 0);   /* (reaped: its caller died) */
  CHECK(!clientpool_queue_full(p));
  CHECK_STATUS(ACQUIRE(p, k, 3, &g), CLIENTPOOL_GRANT_IDLE);   /* the client went back to idle */
}

static void t_max_waiting_zero_fails_fast(void) {
  clientpool_config_t c = cfg_caps(1, 1);
  clientpool_grant_t g;
  uint32_t gen;
  c.max_waiting = 0;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  (void)NEW_LEASE(p, k, 0);                 /* room: no waiting needed */
  CHECK(!clientpool_queue_full(p));         /* nobody waits: nothing to reap */
  CHECK_STATUS(ACQUIRE(p, k, 0, &g), CLIENTPOOL_FULL);
  CHECK_EQ(WAIT_RAW(p, k, -1, 0, &gen), -CLIENTPOOL_FULL);
  CHECK(pstats(p).rejected == 2 && pstats(p).waiting == 0);
}

/* ===================================================================== */
/* 8. strict FIFO, cross-key order                                       */
/* ===================================================================== */

static void t_fifo_one_key(void) {
  clientpool_config_t c = cfg_caps(1, 1);
  waiter_h w[3];
  clientpool_grant_t g;
  int i;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  hold_t h = NEW_LEASE(p, k, 0);
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
  clientpool_config_t c = cfg_caps(2, 2);
  int32_t a, b;
  hold_t la, lb;
  waiter_h wb, wa;
  clientpool_grant_t g;
  c.key_max_live = 1;
  clientpool_t *p = POOL(c);
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
  clientpool_config_t c = cfg_caps(1, 1);
  int32_t a, b;
  waiter_h wb, wa;
  clientpool_grant_t g;
  clientpool_t *p = POOL(c);
  a = PKEY(p); b = PKEY(p);

  /* capacity freed (record destroyed): both can use it, B queued first */
  hold_t la = NEW_LEASE(p, a, 0);
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

const test_t tests_keys[] = {
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
  T(t_queue_full_counts_unclaimed),
  T(t_max_waiting_zero_fails_fast),
  /* 8 FIFO */
  T(t_fifo_one_key),
  T(t_fifo_cross_key_capped_does_not_block),
  T(t_fifo_cross_key_earlier_servable_wins),
  { NULL, NULL }
};
