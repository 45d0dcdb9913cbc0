/*
 * test_engine_cap.c - the engine's C tests: the physical cap (closing
 * records) and create backoff (sections 24-25).
 * Harness: spec/c/test_engine.h; runner: spec/c/test_engine.c.
 */
#include "test_engine.h"

/* ===================================================================== */
/* 24. the physical cap: closing records                                 */
/* ===================================================================== */

/* A record counts against max_live from its reservation until its destroy
 * is reported done: EV_DESTROY starts the destroy, clientpool_destroyed
 * ends it, and only then does a waiter get the room (issue 12: a 0.5 s
 * destroy let 14 clients exist under max_live = 2). */
static void t_closing_counts_against_max_live(void) {
  clientpool_config_t c = cfg_base();
  clientpool_grant_t g;
  g_auto_destroy = 0;
  c.max_live = 1; c.max_idle = 1; c.max_concurrency = 4;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  hold_t h = NEW_LEASE(p, k, 0);
  RELEASE_AS(p, h, CLIENTPOOL_BY_ERROR, 1);
  drain(p);
  EXPECT_DESTROY(h.record, CLIENTPOOL_BY_ERROR);
  clientpool_stats_t s = pstats(p);
  CHECK(s.live == 0 && s.closed == 1 && s.closing == 1 && s.opened - s.closed == s.live);
  CHECK_EQ(KSTATS(p, k).closing, 1);
  CHECK_EQ(clientpool_record_key(p, h.record), k);    /* still a record of k */
  CHECK_EQ(clientpool_retire(p, h.record, 1), CLIENTPOOL_STALE);
  MUST_WAIT(p, k, 1);                        /* no room while it closes */
  waiter_h w = WAIT(p, k, -1, 1);
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
  int32_t a, b;
  hold_t h, hb;
  clientpool_grant_t g;
  g_auto_destroy = 0;
  c.max_live = 4; c.key_max_live = 1;
  clientpool_t *p = POOL(c);
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
  int32_t a, b;
  hold_t h1, h2;
  waiter_h w, w2;
  clientpool_grant_t g;
  g_auto_destroy = 0;
  c.max_live = 2; c.max_idle = 2;
  clientpool_t *p = POOL(c);
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
  int32_t a, b;
  hold_t h1, h2;
  waiter_h w, wb, wme;
  clientpool_grant_t g;
  g_auto_destroy = 0;
  c.max_live = 2; c.max_idle = 2; c.max_concurrency = 4;
  clientpool_t *p = POOL(c);
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
  int32_t k, r, kk;
  g_auto_destroy = 0;
  c.max_live = 1; c.max_idle = 1; c.min_idle = 1;
  clientpool_t *p = POOL(c);
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
  clientpool_grant_t g, g2;
  waiter_h w1, w2;
  double end, prev;
  int i;
  c.create_backoff = 1; c.create_backoff_max = 4;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
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
  clientpool_grant_t g;
  c.create_backoff = 1; c.create_backoff_max = 1;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  hold_t h = NEW_LEASE(p, k, 0);
  CHECK_STATUS(ACQUIRE(p, k, 0, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK_EQ(CREATED(p, g.record, 0, 0), 0);
  MUST_WAIT(p, k, 0.1);                     /* h is leased: it may come back */
  waiter_h w = WAIT(p, k, -1, 0.1);
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
  int32_t k, u, r, kk;
  clientpool_grant_t g;
  c.create_backoff = 1; c.create_backoff_max = 1; c.min_idle = 1;
  clientpool_t *p = POOL(c);
  k = KEY_OPEN(p);
  CHECK_EQ(KEY_PIN(p, k, 2), 0);
  clientpool_floor(p, 1, 0);
  r = clientpool_refill(p, 0, &kk);
  CHECK(r >= 0 && kk == k);
  CHECK_EQ(CREATED(p, r, 0, 0), 0);         /* the refill failed */
  CHECK(KSTATS(p, k).create_failed == 1);
  CHECK_EQ(clientpool_refill(p, 0.1, &kk), -1);
  double end = backoff_end(p);
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

const test_t tests_cap[] = {
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
  { NULL, NULL }
};
