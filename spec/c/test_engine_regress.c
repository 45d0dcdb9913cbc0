/*
 * test_engine_regress.c - the engine's C tests: regressions: engine bugs
 * found by this suite (section 19).
 * Harness: spec/c/test_engine.h; runner: spec/c/test_engine.c.
 */
#include "test_engine.h"

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
  clientpool_grant_t g;
  clientpool_stats_t s;
  char buf[256];
  c.idle_timeout = 10;
  clientpool_t *p = POOL(c);
  int32_t k = UKEY(p);
  hold_t h = NEW_LEASE(p, k, 0);
  RELEASE(p, h, 1);
  drain(p);
  int st = clientpool_acquire(p, k, 20, &g);    /* raw call: checked step by step below */
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
  clientpool_config_t c = cfg_caps(1, 1);
  int32_t a, b, k2;
  waiter_h w1, w2;
  clientpool_grant_t g;
  clientpool_t *p = POOL(c);
  b = PKEY(p);
  a = UKEY(p);
  hold_t hb = NEW_LEASE(p, b, 0);                  /* fills max_live */
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
  int32_t k, j, x;
  waiter_h w1, w2;
  c.capacity = 2; c.max_live = 4; c.max_idle = 4; c.max_concurrency = 2; c.key_max_live = 1;
  clientpool_t *p = POOL(c);
  k = PKEY(p); j = PKEY(p); x = PKEY(p);
  (void)NEW_LEASE(p, k, 0);                 /* k's only record, open for one more share */
  hold_t hx = NEW_LEASE(p, x, 0);                  /* max_concurrency reached */
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
  int32_t k, j, x, kk = -1, r;
  waiter_h w1, w2;
  c.max_live = 4; c.max_idle = 4; c.min_idle = 1; c.max_concurrency = 1; c.key_max_live = 1;
  clientpool_t *p = POOL(c);
  k = UKEY(p); j = PKEY(p); x = PKEY(p);
  CHECK_EQ(KEY_PIN(p, k, 2), 0);            /* warm */
  hold_t hx = NEW_LEASE(p, x, 0);                  /* max_concurrency reached */
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

const test_t tests_regress[] = {
  /* 19 regressions */
  T(t_regress_acquire_expired_idle_keeps_key),
  T(t_regress_key_kept_for_unclaimed_waiter),
  T(t_regress_take_open_stale_key_starves_others),
  T(t_regress_refill_at_cap_starves_others),
  { NULL, NULL }
};
