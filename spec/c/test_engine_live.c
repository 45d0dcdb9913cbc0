/*
 * test_engine_live.c - the engine's C tests: configure and per-key caps,
 * priorities, keepalive (sections 26-28).
 * Harness: spec/c/test_engine.h; runner: spec/c/test_engine.c.
 */
#include "test_engine.h"

/* ===================================================================== */
/* 26. configure and per-key caps of a live engine                       */
/* ===================================================================== */

/* A config clientpool_new would refuse, another capacity or seed: EINVAL,
 * and nothing changes; a closed pool: ECLOSED. */
static void t_configure_refuses_and_changes_nothing(void) {
  clientpool_config_t c = cfg_base(), bad;
  c.max_lifetime = 50; c.leak_threshold = 20;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  hold_t h = NEW_LEASE(p, k, 0);
  (void)h;
  drain(p);
  clientpool_stats_t before = pstats(p);
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
  hold_t h[6];
  clientpool_grant_t g;
  int i;
  g_auto_destroy = 0;
  c.max_live = 6; c.max_idle = 6; c.max_concurrency = 6;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  for (i = 0; i < 6; i++) h[i] = NEW_LEASE(p, k, 0);
  RELEASE(p, h[4], 1);                       /* two idle, h[4] the older */
  RELEASE(p, h[5], 2);
  drain(p);
  c.max_live = 2; c.max_idle = 2; c.max_concurrency = 2;
  CHECK_EQ(CONFIGURE(p, c, 3), 0);
  drain(p);
  EXPECT_DESTROY(h[4].record, CLIENTPOOL_BY_RESIZED);
  EXPECT_DESTROY(h[5].record, CLIENTPOOL_BY_RESIZED);
  clientpool_stats_t s = pstats(p);
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
  waiter_h w = WAIT(p, k, -1, 5);
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
  clientpool_config_t c = cfg_caps(1, 1);
  hold_t h, i1, i2, i3;
  waiter_h w1, w2, w3;
  uint32_t gen;
  clientpool_grant_t g;
  c.max_concurrency = 8; c.max_waiting = 4;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
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
  hold_t h, h2;
  c.max_lifetime = 100; c.leak_threshold = 50;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
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
  clientpool_config_t c = cfg_caps(4, 4);
  int32_t k, u;
  hold_t h[3];
  clientpool_grant_t g;
  int i;
  c.key_max_live = 3; c.max_concurrency = 4;
  clientpool_t *p = POOL(c);
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
  waiter_h w = WAIT(p, k, -1, 5);
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
  waiter_h ws[6];
  int order[6], i;
  static const int prio[6] = { 0, 1, 0, 1, 5, -3 };
  static const int want[6] = { 4, 1, 3, 0, 2, 5 };
  c.max_live = 1; c.max_idle = 1;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  hold_t h = NEW_LEASE(p, k, 0);
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
  clientpool_grant_t g;
  waiter_h low, high[200];
  int i, served_before = 0, nh = 2 * CLIENTPOOL_PRIORITY_STEP + 8;
  c.max_live = 1; c.max_idle = 1; c.max_waiting = 300;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  hold_t h = NEW_LEASE(p, k, 0);
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
  clientpool_config_t c = cfg_caps(2, 2);
  int32_t a, b, d;
  hold_t h, hb;
  waiter_h wa, wb, wd, wmax, wmin;
  clientpool_grant_t g;
  c.key_max_live = 1;
  clientpool_t *p = POOL(c);
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
  hold_t h, h2;
  clientpool_grant_t g;
  int i;
  c.keepalive = 10; c.max_live = 2; c.max_idle = 2;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
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
  clientpool_stats_t s = pstats(p);
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
  int32_t k, out[8];
  hold_t h[5];
  clientpool_grant_t g;
  int i, n;
  c.keepalive = 5; c.max_live = 5; c.max_idle = 5; c.max_concurrency = 8;
  clientpool_t *p = POOL(c);
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
  waiter_h w = WAIT(p, k, -1, 7);
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
  int32_t k, b;
  hold_t h[4];
  clientpool_grant_t g;
  int i;
  g_auto_destroy = 1;
  c.keepalive = 1; c.max_live = 4; c.max_idle = 4; c.idle_timeout = 3; c.max_lifetime = 100;
  c.create_backoff = 10; c.create_backoff_max = 10;
  clientpool_t *p = POOL(c);
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
  clientpool_config_t c = cfg_caps(2, 2);
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  hold_t h = NEW_LEASE(p, k, 0);
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


/* ===================================================================== */
/* 29. edges of the closing state, backoff, configure and keepalive      */
/* ===================================================================== */

/* Reasons a record out for a keepalive is destroyed at its report when the
 * timer has not run yet (retire_before, its lifetime, idle_timeout), and
 * the ones the timer finds while it is out (its lifetime). */
static void t_edges_keepalive_reasons(void) {
  clientpool_config_t c = cfg_base();
  int32_t k, o[2];
  hold_t h[2];
  int i, n;
  c.keepalive = 1; c.max_live = 4; c.max_idle = 4; c.idle_timeout = 10; c.max_lifetime = 20;
  clientpool_t *p = POOL(c);
  k = PKEY(p);
  h[0] = NEW_LEASE(p, k, 0);
  h[1] = NEW_LEASE(p, k, 1);
  RELEASE(p, h[0], 0);
  RELEASE(p, h[1], 1);
  TICK(p, 2);
  drain(p);
  for (i = n = 0; i < g_nev; i++) if (g_ev[i].type == CLIENTPOOL_EV_KEEPALIVE) o[n++] = g_ev[i].a;
  CHECK_EQ(n, 2);
  CHECK(o[0] == h[0].record || o[1] == h[0].record);
  if (o[1] == h[0].record) { o[1] = o[0]; o[0] = h[0].record; }
  CHECK_EQ(clientpool_retire_before(p, -1, 0.5, 2), 0);   /* h[0], created at 0: retired by age */
  CHECK_EQ(KEEPALIVE_DONE(p, o[0], 1, 2), 0);
  drain(p);
  EXPECT_DESTROY(o[0], CLIENTPOOL_BY_RETIRED);
  CHECK_EQ(KEEPALIVE_DONE(p, -1, 1, 2), CLIENTPOOL_STALE);
  /* past idle_timeout at the report (idle since 1), before any tick saw it */
  CHECK_EQ(clientpool_keepalive_done(p, o[1], 1, 11), 0);
  drain(p);
  EXPECT_DESTROY(o[1], CLIENTPOOL_BY_IDLE);
  /* past its lifetime at the report (no tick), and found so by the tick */
  for (i = 0; i < 2; i++) h[i] = NEW_LEASE(p, k, 11);
  for (i = 0; i < 2; i++) RELEASE(p, h[i], 11);
  TICK(p, 12);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_KEEPALIVE), 2);
  CHECK_EQ(clientpool_keepalive_done(p, h[0].record, 1, 31.5), 0);   /* its lifetime: 31 */
  drain(p);
  EXPECT_DESTROY(h[0].record, CLIENTPOOL_BY_LIFETIME);
  TICK(p, 32);                               /* h[1]'s lifetime, while out */
  CHECK(wb_rec_retire(p, h[1].record));
  CHECK_EQ(KEEPALIVE_DONE(p, h[1].record, 1, 32), 0);
  drain(p);
  EXPECT_DESTROY(h[1].record, CLIENTPOOL_BY_LIFETIME);
}

/* keepalive with the other features: a key backing off whose only client
 * is out waits instead of failing fast; retire_before passes one that is
 * out; turning lifetimes on counts one that is out; a leased one gets no
 * keepalive clock; a deadline earlier than the next keepalive is the timer's;
 * out of memory an idle record goes without a keepalive. */
static void t_edges_keepalive_with_the_rest(void) {
  clientpool_config_t c = cfg_base();
  hold_t h, l;
  clientpool_grant_t g;
  c.keepalive = 1; c.max_live = 4; c.max_idle = 4; c.create_backoff = 5; c.create_backoff_max = 5;
  clientpool_t *p = POOL(c);
  int32_t k = PKEY(p);
  h = NEW_LEASE(p, k, 0);
  l = NEW_LEASE(p, k, 0);
  RELEASE(p, h, 0);
  RELEASE_AS(p, l, CLIENTPOOL_BY_ERROR, 0);
  TICK(p, 1);                               /* h out */
  CHECK_STATUS(ACQUIRE(p, k, 1, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK_EQ(CREATED(p, g.record, 0, 1), 0);  /* a window opens */
  MUST_WAIT(p, k, 1);                       /* h may come back: no BACKOFF */
  waiter_h w = WAIT(p, k, -1, 1);
  CHECK_EQ(clientpool_retire_before(p, -1, -1, 1), 0);   /* passes h (out): at its report */
  c.max_lifetime = 100;                     /* lifetimes on: h's too */
  CHECK_EQ(CONFIGURE(p, c, 1), 0);
  CHECK_EQ(KEEPALIVE_DONE(p, h.record, 1, 2), 0);
  drain(p);
  EXPECT_DESTROY(h.record, CLIENTPOOL_BY_RETIRED);
  EXPECT_NO_WAKE(w);
  CHECK_EQ(CANCEL(p, w, CLIENTPOOL_CANCELLED, 2, &g), CLIENTPOOL_CANCELLED);
  /* keepalive turned on: the idle record gets a clock, the leased one not;
   * a deadline before the next keepalive is the timer's */
  c.keepalive = -1; c.max_lifetime = -1; c.key_max_live = 1;
  p = POOL(c);
  k = PKEY(p);
  {
    int32_t k2 = PKEY(p);
    h = NEW_LEASE(p, k2, 0);
    RELEASE(p, h, 0);
  }
  l = NEW_LEASE(p, k, 0);
  w = WAIT(p, k, 0.5, 0);                   /* k at its cap: it waits */
  c.keepalive = 2;
  CHECK_EQ(CONFIGURE(p, c, 0), 0);
  CHECK(clientpool_next_deadline(p) == 0.5);
  TICK(p, 0.5);
  CHECK(clientpool_next_deadline(p) == 2);
  RELEASE(p, l, 1);
  (void)w;
  /* out of memory: a record goes idle without a keepalive */
  c.keepalive = 1; c.key_max_live = -1;
  p = POOL(c);
  k = PKEY(p);
  h = NEW_LEASE(p, k, 0);
  wb_alloc_fail(1);                         /* the keepalive heap */
  RELEASE(p, h, 0);
  wb_alloc_fail(0);
  CHECK_EQ(pstats(p).idle, 1);
  CHECK(clientpool_next_deadline(p) == -1);
}

/* configure: lower max_concurrency and max_keys let what is there stay (and
 * the check holds it to no more); out of memory nothing changes; a refill
 * that completes over a lowered cap is closed; key_caps on a closed pool. */
static void t_edges_configure(void) {
  clientpool_config_t c = cfg_base();
  int32_t k, u[3], r, kk;
  hold_t h[3];
  clientpool_grant_t g;
  int i;
  c.max_keys = 4; c.max_live = 4; c.max_idle = 4; c.max_concurrency = 4; c.min_idle = 1;
  clientpool_t *p = POOL(c);
  for (i = 0; i < 3; i++) { u[i] = UKEY(p); h[i] = NEW_LEASE(p, u[i], i); }
  c.max_keys = 1; c.max_concurrency = 1;
  CHECK_EQ(CONFIGURE(p, c, 3), 0);
  CHECK_EQ(KEY_OPEN(p), CLIENTPOOL_EKEYS);
  CHECK_STATUS(ACQUIRE(p, u[0], 3, &g), CLIENTPOOL_MUST_WAIT);
  CHECK_EQ(KEY_FORGET(p, u[0]), 0);
  for (i = 0; i < 3; i++) RELEASE_AS(p, h[i], CLIENTPOOL_BY_ERROR, 4);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_KEY_FREE), 3);
  k = KEY_OPEN(p);
  CHECK(k >= 0);
  CHECK_EQ(KEY_PIN(p, k, 1), 0);
  /* lifetimes on, in creation order whatever the slots; then out of memory */
  c.max_keys = 4; c.max_concurrency = 4; c.lifetime_jitter = 0.5;
  CHECK_EQ(CONFIGURE(p, c, 5), 0);
  for (i = 0; i < 3; i++) h[i] = NEW_LEASE(p, k, 5 + i);
  RELEASE(p, h[1], 8);
  RELEASE(p, h[0], 8);
  c.max_lifetime = 50;
  wb_alloc_fail(1);                         /* the records' list */
  CHECK_EQ(CONFIGURE(p, c, 9), CLIENTPOOL_ENOMEM);
  CHECK(clientpool_next_deadline(p) == -1);
  wb_alloc_fail(2);                         /* the heap's growth */
  CHECK_EQ(CONFIGURE(p, c, 9), CLIENTPOOL_ENOMEM);
  wb_alloc_fail(0);
  CHECK_EQ(CONFIGURE(p, c, 9), 0);
  CHECK(clientpool_next_deadline(p) > 9);
  /* a refill under way when max_live is lowered below the leased ones */
  h[0] = REUSE(p, k, 10, &g);
  h[1] = REUSE(p, k, 10, &g);
  CHECK_EQ(KEY_PIN(p, k, 2), 0);
  clientpool_floor(p, 1, 10);
  r = clientpool_refill(p, 10, &kk);
  CHECK(r >= 0 && kk == k);
  c.max_live = 3; c.max_idle = 3;
  CHECK_EQ(CONFIGURE(p, c, 11), 0);
  CHECK_EQ(CREATED(p, r, 1, 11), 0);
  drain(p);
  EXPECT_DESTROY(r, CLIENTPOOL_BY_RESIZED);
  /* key caps: a key's own max_idle; on a closed pool */
  for (i = 0; i < 3; i++) RELEASE(p, h[i], 12);
  CHECK_EQ(KEY_CAPS(p, k, -1, 1, 12), 0);
  drain(p);
  CHECK_EQ(g_evby[CLIENTPOOL_BY_MAX_IDLE], 2);
  h[0] = REUSE(p, k, 13, &g);               /* (k stays in use after close) */
  CLOSE(p, 13);
  CHECK_EQ(KEY_CAPS(p, k, 1, 1, 13), CLIENTPOOL_ECLOSED);
  RELEASE(p, h[0], 14);
}

/* The closing state and backoff: a kept place keeps an unpinned key; out of
 * memory the backoff window goes (one create at a time instead); a key with
 * caps of its own goes at close. */
static void t_edges_closing_backoff_caps(void) {
  clientpool_config_t c = cfg_caps(1, 1);
  clientpool_grant_t g, g2;
  c.create_backoff = 1; c.create_backoff_max = 1;
  clientpool_t *p = POOL(c);
  int32_t u = UKEY(p);
  hold_t h = NEW_LEASE(p, u, 0);
  RELEASE(p, h, 0);
  h = REUSE(p, u, 1, &g);
  CHECK_EQ(clientpool_regrant(p, h.lease, h.gen, 1, &g), CLIENTPOOL_MUST_WAIT);
  CHECK_EQ(clientpool_destroyed(p, h.record, 1), 0);   /* the key holds nothing now... */
  drain(p);
  CHECK_EQ(n_key_free(u), 0);                          /* ...but its caller kept a place */
  CHECK_STATUS(ACQUIRE(p, u, 1, &g), CLIENTPOOL_GRANT_CREATE);
  wb_alloc_fail(1);                                    /* the window's deadline */
  CHECK_EQ(CREATED(p, g.record, 0, 1), 0);
  wb_alloc_fail(0);
  CHECK(clientpool_next_deadline(p) == -1);
  CHECK_STATUS(ACQUIRE(p, u, 1, &g), CLIENTPOOL_GRANT_CREATE);   /* no window: one create */
  c.max_live = 2; c.max_idle = 2;
  CHECK_EQ(CONFIGURE(p, c, 1), 0);
  CHECK_STATUS(ACQUIRE(p, u, 1, &g2), CLIENTPOOL_MUST_WAIT);     /* one in flight */
  CHECK_EQ(CREATED(p, g.record, 1, 1), 0);
  CHECK_EQ(KEY_CAPS(p, u, 1, -1, 2), 0);
  RELEASE(p, hold_of(&g), 2);
  CLOSE(p, 3);
  drain(p);
  CHECK_EQ(n_key_free(u), 1);                          /* caps keep a key until close */
}

const test_t tests_live[] = {
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
  /* 29 edges */
  T(t_edges_keepalive_reasons),
  T(t_edges_keepalive_with_the_rest),
  T(t_edges_configure),
  T(t_edges_closing_backoff_caps),
  { NULL, NULL }
};
