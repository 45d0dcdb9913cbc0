/*
 * test_engine_lifecycle.c - the engine's C tests: retire, close, time,
 * stats identities; gates, pins, retire_before, floor edges, queries,
 * shared records (sections 13-16, 20).
 * Harness: spec/c/test_engine.h; runner: spec/c/test_engine.c.
 */
#include "test_engine.h"

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
  int32_t k, k2, k3;
  hold_t idle1, held;
  clientpool_grant_t res, g;
  waiter_h w1, w2;
  uint32_t gen;
  c.max_concurrency = 2;                    /* waiters queue behind it while a record is idle */
  clientpool_t *p = POOL(c);
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
  clientpool_stats_t s = pstats(p);
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
  RELEASE(p, a, 1);
  RELEASE(p, b, 1);
  drain(p);
  CLOSE(p, 2);
  drain(p);
  EXPECT_DESTROY(a.record, CLIENTPOOL_BY_DRAIN);
  EXPECT_DESTROY(b.record, CLIENTPOOL_BY_DRAIN);
  CHECK_EQ(n_key_free(k2), 1);              /* empty keys go */
  clientpool_stats_t s = pstats(p);
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
  clientpool_config_t c = cfg_caps(1, 1);
  clientpool_grant_t g;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  hold_t h = NEW_LEASE(p, k, 0);
  waiter_h w = WAIT(p, k, -1, 0);
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
  clientpool_config_t c = cfg_caps(1, 1);
  clientpool_grant_t g;
  c.idle_timeout = 10;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  hold_t h = NEW_LEASE(p, k, 10);
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
  waiter_h w = WAIT(p, k, 25, 2);                    /* enqueued at 19 */
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
  clientpool_grant_t g;
  c.idle_timeout = 10;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  hold_t h = NEW_LEASE(p, k, 4);
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
  clientpool_config_t c = cfg_caps(4, 3);
  int32_t keys[3];
  hold_t h[3], x;
  clientpool_grant_t g;
  int i;
  c.key_max_live = 2; c.max_waiting = 4;
  c.idle_timeout = 20; c.max_lifetime = 50; c.leak_threshold = 10;
  clientpool_t *p = POOL(c);
  for (i = 0; i < 3; i++) keys[i] = PKEY(p);
  CHECK_SUMS(p, keys, 3);
  for (i = 0; i < 3; i++) { h[i] = NEW_LEASE(p, keys[i], i); CHECK_SUMS(p, keys, 3); }
  CHECK_STATUS(ACQUIRE(p, keys[0], 3, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK_EQ(CREATED(p, g.record, 0, 3), 0);                /* create failure */
  CHECK_SUMS(p, keys, 3);
  x = NEW_LEASE(p, keys[0], 3);                           /* key 0 at its cap */
  MUST_WAIT(p, keys[0], 3);
  waiter_h w = WAIT(p, keys[0], 8, 3);
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
/* 20. gates, keys, retire_before, shared records, queries: the edges     */
/* ===================================================================== */

static void t_gate_states_and_probe(void) {
  clientpool_config_t c = cfg_base();
  clientpool_grant_t g;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
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
  hold_t h = NEW_LEASE(p, k, 1);                   /* the probe */
  MUST_WAIT(p, k, 1);                       /* admitted alone */
  waiter_h w = WAIT(p, k, -1, 1);
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
  int32_t a, b, d, r, kk;
  c.min_idle = 1;
  clientpool_t *p = POOL(c);
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
  clientpool_config_t c = cfg_caps(2, 2);
  hold_t h1, h2;
  clientpool_grant_t g;
  waiter_h w;
  c.max_concurrency = 2;
  clientpool_t *p = POOL(c);
  int32_t a = PKEY(p);
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
  clientpool_config_t c = cfg_caps(5, 5);
  int32_t a, b;
  hold_t h1, h2, h3, h4, hb;
  c.max_concurrency = 5;
  clientpool_t *p = POOL(c);
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
  int32_t a, b;
  hold_t h1, h2, h3;
  clientpool_grant_t g;
  clientpool_t *p = POOL(c);
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
  int32_t k, kk, r;
  clientpool_grant_t g;
  c.min_idle = 1;
  clientpool_t *p = POOL(c);
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

/* The warm floor stays within max_idle (issue 18): a refill that completes
 * after a release filled max_idle is closed as max_idle, and the floor
 * does not start refills max_idle has no room for; once an idle record of
 * another key goes, it refills. */
static void t_floor_within_max_idle(void) {
  clientpool_config_t c = cfg_caps(4, 1);
  int32_t w, o, r2, kk;
  hold_t h, ho;
  c.min_idle = 1;
  clientpool_t *p = POOL(c);
  w = PKEY(p);
  WARM_RECORD(p, w, 0);
  CHECK_EQ(clientpool_refill(p, 0, &kk), -1);   /* (the floor is met: the driver stops asking) */
  drain(p);
  h = REUSE(p, w, 1, NULL);                 /* the floor's client leased: a refill */
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_REFILL), 1);
  r2 = clientpool_refill(p, 1, &kk);
  CHECK(r2 >= 0 && kk == w);
  CHECK_EQ(clientpool_refill(p, 1, &kk), -1);
  RELEASE(p, h, 2);                         /* back before the refill is done: kept */
  CHECK_EQ(pstats(p).idle, 1);
  drain(p);
  CHECK_EQ(CREATED(p, r2, 1, 3), 0);        /* no room left for it */
  drain(p);
  EXPECT_DESTROY(r2, CLIENTPOOL_BY_MAX_IDLE);
  CHECK_EQ(n_events(CLIENTPOOL_EV_REFILL), 0);
  CHECK_EQ(pstats(p).idle, 1);
  /* another key's idle record fills max_idle: the floor waits for room */
  o = PKEY(p);
  h = REUSE(p, w, 4, NULL);
  ho = NEW_LEASE(p, o, 4);
  RELEASE(p, ho, 5);                        /* o's idle record: max_idle reached */
  drain(p);
  CHECK_EQ(clientpool_refill(p, 5, &kk), -1);
  CHECK_EQ(pstats(p).creating, 0);
  REUSE(p, o, 6, NULL);                     /* o's idle record goes: room */
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_REFILL), 1);
  r2 = clientpool_refill(p, 6, &kk);
  CHECK(r2 >= 0 && kk == w);
  CHECK_EQ(CREATED(p, r2, 1, 7), 0);
  CHECK_EQ(KSTATS(p, w).idle, 1);
  RELEASE(p, h, 8);                         /* max_idle reached: this one is closed */
  CHECK_EQ(pstats(p).idle, 1);
}

/* The engine takes a floor above per_key.max_idle (the driver refuses
 * one): the key's max_idle caps the refills, so none is made only to be
 * closed as max_idle. */
static void t_floor_within_key_max_idle(void) {
  clientpool_config_t c = cfg_caps(4, 4);
  int32_t w, r, kk;
  c.min_idle = 2; c.key_max_idle = 1;
  clientpool_t *p = POOL(c);
  w = PKEY(p);
  r = WARM_RECORD(p, w, 0);
  CHECK(r >= 0);
  CHECK_EQ(clientpool_refill(p, 0, &kk), -1);   /* the key is at its max_idle */
  drain(p);
  CHECK_EQ(KSTATS(p, w).idle, 1);
  CHECK_EQ(pstats(p).creating, 0);
}

/* The floor signals only for warm keys; a closed pool never refills. */
static void t_floor_edges(void) {
  clientpool_config_t c = cfg_base();
  int32_t k, kk;
  c.min_idle = 1; c.max_live = 1; c.max_idle = 1;
  clientpool_t *p = POOL(c);
  k = PKEY(p);                              /* pinned, not warm */
  clientpool_floor(p, 1, 0);
  hold_t h = NEW_LEASE(p, k, 0);
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
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  CHECK_EQ(clientpool_record_key(p, -1), -1);
  CHECK_EQ(clientpool_record_key(p, 1 << 20), -1);
  CHECK(clientpool_record_created(p, -1) < 0);
  CHECK(clientpool_record_created(p, 1 << 20) < 0);
  CHECK(clientpool_lease_age(p, -1, 0, 0) < 0);
  CHECK(clientpool_lease_age(p, 1 << 20, 0, 0) < 0);
  CHECK_STATUS(CREATED(p, -1, 1, 0), CLIENTPOOL_STALE);
  CHECK_STATUS(CREATED(p, 1 << 20, 1, 0), CLIENTPOOL_STALE);
  hold_t h = NEW_LEASE(p, k, 2);
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
  int32_t k, r;
  hold_t held[24], h1, h2, h3;
  clientpool_grant_t g;
  int n = 0, i, step;
  c.capacity = 3; c.max_live = 4; c.max_idle = 4; c.max_concurrency = 12;
  clientpool_t *p = POOL(c);
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
  hold_t h1, h2, h3;
  clientpool_grant_t g;
  c.capacity = 2; c.max_lifetime = 10;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
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

const test_t tests_lifecycle[] = {
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
  /* 20 edges */
  T(t_gate_states_and_probe),
  T(t_key_pin_modes),
  T(t_retire_before_variants),
  T(t_retire_upto),
  T(t_regrant_keeps_place),
  T(t_retired_refill_is_not_reused),
  T(t_floor_edges),
  T(t_floor_within_max_idle),
  T(t_floor_within_key_max_idle),
  T(t_queries_and_stale_handles),
  T(t_shared_fewest_leases_and_loss),
  T(t_shared_lifetime),
  { NULL, NULL }
};
