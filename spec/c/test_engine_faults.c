/*
 * test_engine_faults.c - the engine's C tests: out of memory, and
 * clientpool_check catching corruption (sections 21-22).
 * Harness: spec/c/test_engine.h; runner: spec/c/test_engine.c.
 */
#include "test_engine.h"

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
  hold_t h = NEW_LEASE(p, k, 0);
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
  waiter_h w = WAIT(p, k, 1, 0);
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
  int32_t k, x, y;
  hold_t h, held[7];
  clientpool_grant_t g;
  int i, st;
  c.capacity = 2; c.max_live = 8; c.max_idle = 8; c.max_concurrency = 16;
  clientpool_t *p = POOL(c);
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
  int32_t a, b, k3, d, e, f, kg, kc;
  hold_t h, h2;
  clientpool_grant_t g;
  g_auto_destroy = 0;                       /* kc's record stays closing */
  c.capacity = 2; c.max_live = 9; c.max_idle = 8; c.max_concurrency = 3;
  c.leak_threshold = 100; c.max_lifetime = 1000; c.keepalive = 1000;
  p = POOL(c);
  a = PKEY(p); b = PKEY(p); k3 = PKEY(p); d = PKEY(p); e = PKEY(p); f = PKEY(p); kg = PKEY(p); kc = PKEY(p);
  (void)PKEY(p);                            /* (the key array grows: a slot stays unused) */
  h = NEW_LEASE(p, kg, 0);                  /* kg: two idle (the keepalive heap holds three) */
  CHECK_STATUS(ACQUIRE(p, kg, 0, &g), CLIENTPOOL_GRANT_IDLE);   /* its second share */
  h2 = NEW_LEASE(p, kg, 0);
  RELEASE(p, h, 0);
  RELEASE(p, hold_of(&g), 0);
  RELEASE(p, h2, 0);
  h = NEW_LEASE(p, kc, 0);
  RELEASE_AS(p, h, CLIENTPOOL_BY_ERROR, 0); /* kc: closing */
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

const test_t tests_faults[] = {
  /* 21 out of memory */
  T(t_oom_new_keys_waiters),
  T(t_oom_records_leases_deadlines),
  T(t_oom_shared),
  /* 22 the checker */
  T(t_check_catches_corruption),
  { NULL, NULL }
};
