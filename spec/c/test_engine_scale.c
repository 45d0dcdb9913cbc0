/*
 * test_engine_scale.c - the engine's C tests: scale, the randomized test
 * against a model, memory per idle record (sections 17, 18, 23).
 * Harness: spec/c/test_engine.h; runner: spec/c/test_engine.c.
 */
#include "test_engine.h"
#ifdef __GLIBC__
#include <malloc.h>   /* mallinfo2: t_idle_record_bytes */
#endif

/* ===================================================================== */
/* 17. scale                                                             */
/* ===================================================================== */

static void t_scale_100k_idle_1k_keys(void) {
  enum { NKEYS = 1000, PER = 100, N = NKEYS * PER, PAIRS = 50000 };
  clientpool_config_t c = cfg_base();
  int32_t *keys = own_mem(sizeof *keys * NKEYS);
  hold_t *h = own_mem(sizeof *h * N);
  long destroys = 0, by_idle = 0, key_frees = 0;
  int i;
  c.max_live = N; c.max_idle = N; c.max_concurrency = N; c.max_waiting = 16;
  c.max_keys = NKEYS; c.idle_timeout = 100; c.validate_after_idle = 1;
  clientpool_t *p = POOL(c);
  g_stride = 1000;
  for (i = 0; i < NKEYS; i++) keys[i] = UKEY(p);
  CHECK_EQ(KEY_OPEN(p), CLIENTPOOL_EKEYS);
  for (i = 0; i < N; i++) {
    h[i] = NEW_LEASE(p, keys[i % NKEYS], 0);
    if (i % 1024 == 0) drain(p);
  }
  for (i = 0; i < N; i++) {
    RELEASE(p, h[i], 1);
    if (i % 1024 == 0) drain(p);
  }
  drain(p);
  INVARIANTS(p);
  clientpool_stats_t s = pstats(p);
  CHECK(s.live == N && s.idle == N && s.opened == N && s.leases == 0);
  CHECK_EQ(KSTATS(p, keys[0]).idle, PER);

  rng_seed(99);
  for (i = 0; i < PAIRS; i++) {
    int32_t k = keys[rng_int(NKEYS)];
    double now = 2 + i * 1e-4;
    hold_t x = REUSE(p, k, now, NULL);
    RELEASE(p, x, now);
    if (i % 1024 == 0) drain(p);
  }
  drain(p);
  INVARIANTS(p);
  s = pstats(p);
  CHECK(s.reused == PAIRS && s.live == N && s.idle == N && s.opened == N && s.closed == 0);

  TICK(p, 1000);
  {
    clientpool_event_t e;
    while (clientpool_next_event(p, &e) != CLIENTPOOL_EV_NONE) {
      if (e.type == CLIENTPOOL_EV_DESTROY) { destroys++; if (e.b == CLIENTPOOL_BY_IDLE) by_idle++; }
      if (e.type == CLIENTPOOL_EV_KEY_FREE) key_frees++;
    }
  }
  INVARIANTS(p);
  CHECK_EQ(destroys, N);
  CHECK_EQ(by_idle, N);
  CHECK_EQ(key_frees, NKEYS);
  s = pstats(p);
  CHECK(s.live == 0 && s.idle == 0 && s.closed == N);
  CHECK_NEAR(clientpool_next_deadline(p), -1);
  for (i = 0; i < NKEYS; i++) CHECK(UKEY(p) >= 0);   /* every id is free again */
  g_stride = 1;
}

/* ===================================================================== */
/* 18. randomized test against a model                                   */
/* ===================================================================== */

/*
 * A seeded PRNG drives FZ_OPS operations in episodes of a few thousand, each
 * on a fresh pool with a small random config (max_live 1..6, up to 8 keys,
 * random caps, durations, jitter, leak_threshold).  Operations: acquire (and
 * wait or give up), created ok/fail, release for reuse or with a reason,
 * leak, wait without acquire, claim, cancel, abandon, retire, tick with
 * advancing (sometimes backwards or NaN) time, key pin/unpin/forget, and
 * deliberately stale lease and waiter handles.
 *
 * The model tracks every lease, reservation and waiter handed out, the
 * state of every record slot it has seen, the open keys, and the time the
 * engine has seen, so it only ever passes valid handles (or stale ones on
 * purpose).  After every call: clientpool_check, and the model cross-checks
 * events and counters (no destroy of a held record, no wake of an unknown
 * waiter, no forgotten key still in use, idle reuse never past idle_timeout,
 * max_lifetime or a retire, counters equal to the events seen, per-key counts
 * summing to the pool's, the driver's timer never later than the next
 * deadline, no waiter left queued past its deadline after a tick).  Each
 * episode ends with close, settling every waiter and lease, and checks that
 * nothing is left.  Every interesting path must be reached at least once.
 */

#define FZ_OPS 200000
#define FZ_NAMES 8
#define FZ_MAXL 64
#define FZ_MAXW 64
#define FZ_MAXR 1024
#define FZ_MAXK 256
#define FZ_DEAD 16

enum { FR_FREE = 0, FR_CREATING, FR_LEASED, FR_RELEASED };   /* model record states */

typedef struct { int32_t l; uint32_t gen; int32_t rec, key; int created, leak_seen; } fz_lease;
typedef struct { int32_t w; uint32_t gen; int32_t key; int woken; double deadline; } fz_waiter;
typedef struct { int32_t a; uint32_t b; } fz_handle;

typedef struct {
  clientpool_t *p;
  clientpool_config_t cfg;
  double now, armed;
  double enow;                  /* the engine's time: the latest time passed in */
  int nnames;
  int32_t name_key[FZ_NAMES];
  int name_pinned[FZ_NAMES];
  int key_name[FZ_MAXK];
  fz_lease L[FZ_MAXL]; int nl;
  fz_waiter W[FZ_MAXW]; int nw;
  int rstate[FZ_MAXR]; int32_t rkey[FZ_MAXR];
  double rcreated[FZ_MAXR];     /* engine time of created(ok) */
  int rretired[FZ_MAXR];        /* retire() was called on it */
  fz_handle dead_l[FZ_DEAD], dead_w[FZ_DEAD]; int ndl, ndw;
  double destroys, by[CLIENTPOOL_BY_COUNT], created, rejected;
} fz_t;

static fz_t fz;

/* what the fuzzer reached, over all episodes: each must be > 0 at the end */
enum { CV_IDLE, CV_CREATE, CV_MUST_WAIT, CV_FULL, CV_EKEYS, CV_WAIT, CV_WAKE, CV_TIMEOUT,
       CV_CLAIM_GRANT, CV_CANCEL_QUEUED, CV_CANCEL_GRANT, CV_ABANDON_QUEUED, CV_ABANDON_WOKEN,
       CV_KEY_FREE, CV_LEAK_EV, CV_CREATE_FAIL, CV_STALE, CV_TIMER, CV_N };
static const char *const cv_name[CV_N] = {
  "grant idle", "grant create", "must wait", "full", "max_keys", "wait", "wake", "timeout",
  "claimed grant", "cancel queued", "cancel granted", "abandon queued", "abandon woken",
  "key free", "leak report", "create failed", "stale handle", "timer"
};
static long fz_cov[CV_N];
static long fz_by_reason[CLIENTPOOL_BY_COUNT];

static void fz_dead_lease(int32_t l, uint32_t gen) {
  fz.dead_l[fz.ndl % FZ_DEAD].a = l; fz.dead_l[fz.ndl % FZ_DEAD].b = gen; fz.ndl++;
}
static void fz_dead_waiter(int32_t w, uint32_t gen) {
  fz.dead_w[fz.ndw % FZ_DEAD].a = w; fz.dead_w[fz.ndw % FZ_DEAD].b = gen; fz.ndw++;
}
static void fz_drop_lease(int i) { fz.L[i] = fz.L[--fz.nl]; }
static void fz_drop_waiter(int i) { fz.W[i] = fz.W[--fz.nw]; }

static void fz_add_lease(const clientpool_grant_t *g, int created) {
  fz_lease *x;
  CHECK(fz.nl < FZ_MAXL);
  x = &fz.L[fz.nl++];
  x->l = g->lease; x->gen = g->lease_gen; x->rec = g->record; x->key = g->key;
  x->created = created; x->leak_seen = 0;
}

/* the model's side of a grant (from acquire, claim or cancel) */
static void fz_grant(const clientpool_grant_t *g, int32_t key) {
  CHECK(g->record >= 0 && g->record < FZ_MAXR && g->lease >= 0);
  CHECK_EQ(g->key, key);
  if (g->status == CLIENTPOOL_GRANT_IDLE) {
    CHECK(fz.rstate[g->record] == FR_RELEASED);     /* only a released record is reused */
    CHECK_EQ(fz.rkey[g->record], key);
    CHECK(g->idle >= 0);
    if (fz.cfg.idle_timeout >= 0) CHECK(g->idle < fz.cfg.idle_timeout);
    if (fz.cfg.validate_after_idle < 0) CHECK(g->validate == 1);
    else CHECK(g->validate == (g->idle >= fz.cfg.validate_after_idle));
    fz.rstate[g->record] = FR_LEASED;
    fz_add_lease(g, 1);
  } else {
    CHECK_STATUS(g->status, CLIENTPOOL_GRANT_CREATE);
    CHECK(fz.rstate[g->record] == FR_FREE);         /* a fresh slot */
    fz.rstate[g->record] = FR_CREATING;
    fz.rretired[g->record] = 0;
    fz.rkey[g->record] = key;
    fz_add_lease(g, 0);
  }
}

static void fz_drain(void) {
  clientpool_event_t e;
  int i;
  while (clientpool_next_event(fz.p, &e) != CLIENTPOOL_EV_NONE) {
    switch (e.type) {
    case CLIENTPOOL_EV_WAKE:
      for (i = 0; i < fz.nw; i++)
        if (fz.W[i].w == e.a && fz.W[i].gen == (uint32_t)e.b) break;
      if (i == fz.nw || fz.W[i].woken)
        fail_at(__FILE__, __LINE__, "EV_WAKE of waiter %d/%d that is not queued", e.a, e.b);
      CHECK_EQ(e.c, fz.W[i].key);
      fz.W[i].woken = 1;
      fz_cov[CV_WAKE]++;
      break;
    case CLIENTPOOL_EV_DESTROY:
      CHECK(e.a >= 0 && e.a < FZ_MAXR && e.b >= 0 && e.b < CLIENTPOOL_BY_COUNT);
      if (fz.rstate[e.a] != FR_RELEASED)   /* never one being created or held */
        fail_at(__FILE__, __LINE__, "EV_DESTROY of record %d in model state %d", e.a, fz.rstate[e.a]);
      CHECK_EQ(e.c, fz.rkey[e.a]);
      fz.rstate[e.a] = FR_FREE;
      fz.destroys++;
      fz.by[e.b]++;
      fz_by_reason[e.b]++;
      break;
    case CLIENTPOOL_EV_TIMER:
      CHECK(e.t >= 0);
      if (fz.armed < 0 || e.t < fz.armed) fz.armed = e.t;
      fz_cov[CV_TIMER]++;
      break;
    case CLIENTPOOL_EV_KEY_FREE: {
      int n;
      CHECK(e.a >= 0 && e.a < FZ_MAXK);
      n = fz.key_name[e.a];
      if (n < 0) fail_at(__FILE__, __LINE__, "EV_KEY_FREE of key %d that is not open", e.a);
      CHECK(!fz.name_pinned[n]);
      for (i = 0; i < fz.nl; i++)
        if (fz.L[i].key == e.a)
          fail_at(__FILE__, __LINE__, "EV_KEY_FREE of key %d while lease %d/%u (record %d, %s) "
                  "is held on it", e.a, fz.L[i].l, (unsigned)fz.L[i].gen, fz.L[i].rec,
                  fz.L[i].created ? "created" : "reservation");
      for (i = 0; i < fz.nw; i++) CHECK(fz.W[i].woken || fz.W[i].key != e.a);
      for (i = 0; i < FZ_MAXR; i++) CHECK(fz.rstate[i] == FR_FREE || fz.rkey[i] != e.a);
      fz.name_key[n] = -1;
      fz.key_name[e.a] = -1;
      fz_cov[CV_KEY_FREE]++;
      break;
    }
    case CLIENTPOOL_EV_LEAK:
      if (e.a == -1) break;                           /* a collected lease's report */
      CHECK(fz.cfg.leak_threshold >= 0);
      CHECK(clientpool_lease_age(fz.p, e.a, (uint32_t)e.b, fz.now) >= fz.cfg.leak_threshold - 1e-9);
      for (i = 0; i < fz.nl; i++)
        if (fz.L[i].l == e.a && fz.L[i].gen == (uint32_t)e.b) {
          CHECK(!fz.L[i].leak_seen);                  /* reported once */
          fz_cov[CV_LEAK_EV]++;
          fz.L[i].leak_seen = 1;
        }
      break;
    case CLIENTPOOL_EV_CREATED:
      CHECK(e.a >= 0 && e.a < FZ_MAXR);
      CHECK(fz.rstate[e.a] == FR_LEASED);
      fz.created++;
      break;
    default:
      fail_at(__FILE__, __LINE__, "unknown event type %d", e.type);
    }
  }
}

/* cross-checks of engine and model after every operation */
static void fz_verify(void) {
  clientpool_stats_t s = pstats(fz.p), sum;
  int i, queued = 0, woken = 0, res = 0, held = 0;
  double d;
  fz_drain();
  for (i = 0; i < fz.nw; i++) { if (fz.W[i].woken) woken++; else queued++; }
  for (i = 0; i < fz.nl; i++) { if (fz.L[i].created) held++; else res++; }
  CHECK_EQ(s.waiting, queued);
  CHECK(s.leases >= res + held && s.leases <= res + held + woken);
  CHECK(s.creating >= res && s.creating <= res + woken);
  CHECK(s.closed == fz.destroys && s.opened == fz.created && s.rejected == fz.rejected);
  CHECK(s.idle <= fz.cfg.max_idle);
  for (i = 0; i < CLIENTPOOL_BY_COUNT; i++) CHECK(s.closed_by[i] == fz.by[i]);
  /* the driver's timer never misses a deadline */
  d = clientpool_next_deadline(fz.p);
  if (d >= 0 && !(fz.armed >= 0 && fz.armed <= d))
    fail_at(__FILE__, __LINE__, "next deadline %g but the timer is armed at %g", d, fz.armed);
  /* the open keys are exactly the model's, and their counts sum to the pool's */
  memset(&sum, 0, sizeof sum);
  for (i = 0; i < fz.nnames; i++) {
    clientpool_stats_t k;
    if (fz.name_key[i] < 0) continue;
    k = KSTATS(fz.p, fz.name_key[i]);
    if (fz.cfg.key_max_idle >= 0) CHECK(k.idle <= fz.cfg.key_max_idle);
    if (fz.cfg.key_max_live >= 0) CHECK(k.live + k.creating <= fz.cfg.key_max_live);
    sum.live += k.live; sum.idle += k.idle; sum.active += k.active;
    sum.leases += k.leases; sum.creating += k.creating; sum.waiting += k.waiting;
  }
  CHECK(sum.live == s.live && sum.idle == s.idle && sum.active == s.active &&
        sum.leases == s.leases && sum.creating == s.creating && sum.waiting == s.waiting);
}

static void fz_advance(void) {
  if (rng_int(10) < 3) fz.now += rng_unit() * 0.2;
}

static double fz_seen(double t) {   /* records a time passed to the engine */
  if (t >= fz.enow) fz.enow = t;
  return t;
}

/* the time passed to a call: usually now, sometimes earlier (clamped) or NaN */
static double fz_time(void) {
  int r = rng_int(50);
  if (r == 0) return fz_seen(fz.now - 1);
  if (r == 1) return NAN;
  return fz_seen(fz.now);
}

static void fz_tick(double t) {
  int i;
  double d;
  fz.armed = -1;                            /* the timer fired */
  TICK(fz.p, fz_seen(t));
  fz_drain();
  for (i = 0; i < fz.nw; i++)
    if (!fz.W[i].woken && fz.W[i].deadline >= 0 && fz.W[i].deadline <= fz.enow)
      fail_at(__FILE__, __LINE__, "waiter %d still queued past its deadline %g (now %g)",
              fz.W[i].w, fz.W[i].deadline, fz.enow);
  d = clientpool_next_deadline(fz.p);
  if (!(d < 0 || d > fz.enow))
    fail_at(__FILE__, __LINE__, "after tick(%g): next deadline %.17g is not in the future (now %.17g)",
            t, d, fz.enow);
}

static int fz_mapped(void) {
  int i, n = 0;
  for (i = 0; i < fz.nnames; i++) if (fz.name_key[i] >= 0) n++;
  return n;
}

/* the key id of a name, opening it if needed; -1 when max_keys keys exist */
static int32_t fz_key(int name) {
  int32_t k = fz.name_key[name];
  if (k >= 0) return k;
  k = KEY_OPEN(fz.p);
  if (k == CLIENTPOOL_EKEYS) {
    CHECK(fz.cfg.max_keys >= 0 && fz_mapped() >= fz.cfg.max_keys);
    fz_cov[CV_EKEYS]++;
    return -1;
  }
  CHECK(k >= 0 && k < FZ_MAXK && fz.key_name[k] < 0);
  CHECK(fz.cfg.max_keys < 0 || fz_mapped() < fz.cfg.max_keys);
  fz.name_key[name] = k;
  fz.key_name[k] = name;
  fz.name_pinned[name] = name == 0 || rng_int(4) == 0;
  if (fz.name_pinned[name]) CHECK_EQ(KEY_PIN(fz.p, k, 1), 0);
  return k;
}

static void fz_wait(int32_t k) {
  uint32_t gen = 0;
  double deadline = rng_int(2) ? -1 : fz.now + rng_unit() * 3;
  int queued = 0, i;
  int32_t w;
  for (i = 0; i < fz.nw; i++) if (!fz.W[i].woken) queued++;
  if (fz.nw >= FZ_MAXW) return;
  w = WAIT_RAW(fz.p, k, deadline, fz_time(), &gen);
  if (w == -CLIENTPOOL_FULL) {
    CHECK(queued >= fz.cfg.max_waiting);
    fz.rejected++;
    return;
  }
  CHECK(w >= 0);
  CHECK(queued < fz.cfg.max_waiting);
  fz_cov[CV_WAIT]++;
  fz.W[fz.nw].w = w; fz.W[fz.nw].gen = gen; fz.W[fz.nw].key = k;
  fz.W[fz.nw].woken = 0; fz.W[fz.nw].deadline = deadline;
  fz.nw++;
}

static void fz_op_acquire(void) {
  int name = rng_int(fz.nnames);
  int32_t k = fz_key(name);
  clientpool_grant_t g;
  int st, i, queued = 0;
  if (k < 0) return;
  if (fz.nl >= FZ_MAXL - 1) return;
  st = ACQUIRE(fz.p, k, fz_time(), &g);
  fz_drain();                               /* evictions come before the grant */
  for (i = 0; i < fz.nw; i++) if (!fz.W[i].woken) queued++;
  switch (st) {
  case CLIENTPOOL_GRANT_IDLE:
  case CLIENTPOOL_GRANT_CREATE:
    fz_cov[st == CLIENTPOOL_GRANT_IDLE ? CV_IDLE : CV_CREATE]++;
    fz_grant(&g, k);
    /* granted now (a waiter's grant may predate a retire or expiry) */
    if (st == CLIENTPOOL_GRANT_IDLE && fz.cfg.max_lifetime >= 0)
      CHECK(fz.enow < fz.rcreated[g.record] + fz.cfg.max_lifetime);
    if (st == CLIENTPOOL_GRANT_IDLE) CHECK(!fz.rretired[g.record]);   /* never reused */
    break;
  case CLIENTPOOL_MUST_WAIT:
    fz_cov[CV_MUST_WAIT]++;
    CHECK(queued < fz.cfg.max_waiting);
    if (rng_int(10) < 7) fz_wait(k);
    else if (KEY_FORGET(fz.p, k)) {         /* the driver gives up (as init.lua does) */
      fz_drain();
      CHECK(fz.name_key[name] < 0);
    }
    break;
  case CLIENTPOOL_FULL:
    fz_cov[CV_FULL]++;
    CHECK(queued >= fz.cfg.max_waiting);
    fz.rejected++;
    break;
  default:
    fail_at(__FILE__, __LINE__, "acquire gave %s", status_name(st));
  }
}

static int fz_pick_lease(int created) {
  int i, n = 0, pick;
  for (i = 0; i < fz.nl; i++) if (fz.L[i].created == created) n++;
  if (!n) return -1;
  pick = rng_int(n);
  for (i = 0; i < fz.nl; i++) if (fz.L[i].created == created && pick-- == 0) return i;
  return -1;
}

static void fz_op_created(void) {
  int i = fz_pick_lease(0);
  fz_lease x;
  if (i < 0) return;
  x = fz.L[i];
  if (rng_int(10) < 8) {
    CHECK_EQ(CREATED(fz.p, x.rec, 1, fz_time()), 0);
    fz.rstate[x.rec] = FR_LEASED;
    fz.rcreated[x.rec] = fz.enow;
    fz.L[i].created = 1;
    CHECK_STATUS(CREATED(fz.p, x.rec, 1, fz_time()), CLIENTPOOL_STALE);
  } else {
    /* no second created() here: records carry no generation in this call, and
     * the freed slot may already be another waiter's reservation */
    fz.rstate[x.rec] = FR_FREE;
    fz_drop_lease(i);
    fz_dead_lease(x.l, x.gen);
    CHECK_EQ(CREATED(fz.p, x.rec, 0, fz_time()), 0);
    fz_cov[CV_CREATE_FAIL]++;
  }
}

static void fz_op_release(int leak) {
  int i = fz_pick_lease(1), r;
  int32_t reason;
  fz_lease x;
  double leaked_before = fz.by[CLIENTPOOL_BY_LEAKED];
  if (i < 0) return;
  x = fz.L[i];
  fz_drop_lease(i);
  fz_dead_lease(x.l, x.gen);
  fz.rstate[x.rec] = FR_RELEASED;           /* set before its DESTROY is drained */
  if (leak) {
    CHECK_EQ(CALLED(fz.p, clientpool_leak(fz.p, x.l, x.gen, fz_time())), 0);
    fz_drain();
    CHECK(fz.by[CLIENTPOOL_BY_LEAKED] == leaked_before + 1);
    CHECK(fz.rstate[x.rec] == FR_FREE);
    return;
  }
  r = rng_int(10);
  reason = r < 7 ? -1 : r < 9 ? CLIENTPOOL_BY_ERROR : rng_int(CLIENTPOOL_BY_COUNT + 2);
  CHECK_EQ(RELEASE_RAW(fz.p, x.l, x.gen, reason, fz_time()), 0);
  fz_drain();
  if (reason >= 0) CHECK(fz.rstate[x.rec] == FR_FREE);   /* destroyed at once */
}

static void fz_op_stale(void) {
  clientpool_stats_t before, after_;
  clientpool_grant_t g;
  fz_handle h;
  waiter_h wh;
  fz_drain();
  before = pstats(fz.p);
  /* these calls clamp time even when the handle is stale: fz_seen */
  if (fz.ndl && rng_int(2)) {
    fz_seen(fz.now);
    h = fz.dead_l[rng_int(fz.ndl < FZ_DEAD ? fz.ndl : FZ_DEAD)];
    CHECK_STATUS(RELEASE_RAW(fz.p, h.a, h.b, -1, fz.now), CLIENTPOOL_STALE);
    CHECK_STATUS(CALLED(fz.p, clientpool_leak(fz.p, h.a, h.b, fz.now)), CLIENTPOOL_STALE);
  } else if (fz.ndw) {
    fz_seen(fz.now);
    h = fz.dead_w[rng_int(fz.ndw < FZ_DEAD ? fz.ndw : FZ_DEAD)];
    wh.w = h.a; wh.gen = h.b;
    CHECK_STATUS(CLAIM(fz.p, wh, fz.now, &g), CLIENTPOOL_STALE);
    CHECK_STATUS(CANCEL(fz.p, wh, CLIENTPOOL_CANCELLED, fz.now, &g), CLIENTPOOL_STALE);
    CHECK_STATUS(ABANDON(fz.p, wh, fz.now), CLIENTPOOL_STALE);
  }
  after_ = pstats(fz.p);
  CHECK(stats_equal(&before, &after_));
  fz_cov[CV_STALE]++;
  CHECK_EQ(clientpool_pending(fz.p), 0);
}

/* claim (mode 0), cancel (1) or abandon (2) a random waiter */
static void fz_op_waiter(int mode) {
  int i, st;
  fz_waiter x;
  waiter_h wh;
  clientpool_grant_t g;
  if (!fz.nw || fz.nl >= FZ_MAXL - 1) return;
  i = rng_int(fz.nw);
  x = fz.W[i];
  wh.w = x.w; wh.gen = x.gen;
  if (mode == 2) {
    fz_drop_waiter(i);
    fz_dead_waiter(x.w, x.gen);
    CHECK_EQ(ABANDON(fz.p, wh, fz_time()), 0);
    fz_cov[x.woken ? CV_ABANDON_WOKEN : CV_ABANDON_QUEUED]++;
    return;
  }
  if (mode == 0) {
    st = CLAIM(fz.p, wh, fz.now, &g);       /* claim reads no time: not "seen" */
    if (!x.woken) { CHECK_STATUS(st, CLIENTPOOL_PENDING); return; }
  } else {
    int want = rng_int(3) == 0 ? 999 : rng_int(2) ? CLIENTPOOL_TIMEOUT : CLIENTPOOL_CANCELLED;
    st = CANCEL(fz.p, wh, want, fz_time(), &g);
    if (!x.woken) {
      CHECK_STATUS(st, want == CLIENTPOOL_TIMEOUT ? CLIENTPOOL_TIMEOUT : CLIENTPOOL_CANCELLED);
      CHECK(g.waited >= 0);
      fz_drop_waiter(i);
      fz_dead_waiter(x.w, x.gen);
      fz_cov[CV_CANCEL_QUEUED]++;
      return;
    }
  }
  fz_drop_waiter(i);
  fz_dead_waiter(x.w, x.gen);
  CHECK(g.waited >= 0);
  if (st == CLIENTPOOL_GRANT_IDLE || st == CLIENTPOOL_GRANT_CREATE) {
    fz_cov[mode == 0 ? CV_CLAIM_GRANT : CV_CANCEL_GRANT]++;
    fz_grant(&g, x.key);
  } else if (st == CLIENTPOOL_TIMEOUT) {
    CHECK(x.deadline >= 0 && x.deadline <= fz.enow);
    fz_cov[CV_TIMEOUT]++;
  }
  else fail_at(__FILE__, __LINE__, "woken waiter gave %s", status_name(st));
}

static void fz_op_retire(void) {
  int32_t cand[FZ_MAXR];
  int i, n = 0;
  for (i = 0; i < FZ_MAXR; i++) if (fz.rstate[i] != FR_FREE) cand[n++] = i;
  if (!n) return;
  i = cand[rng_int(n)];
  CHECK_EQ(RETIRE(fz.p, i, fz_time()), 0);
  fz.rretired[i] = 1;
}

static void fz_op_tick(void) {
  int r = rng_int(10);
  if (r < 6) fz.now += rng_unit() * 0.5;
  else if (r < 8) fz.now += rng_unit() * 2;
  else if (r < 9) fz.now += rng_unit() * 10;
  if (rng_int(20) == 0) { fz_tick(fz.now - 2); return; }   /* backwards: clamped */
  if (rng_int(40) == 0) { fz_tick(NAN); return; }
  fz_tick(fz.now);
}

static void fz_op_keys(void) {
  int name = 1 + rng_int(fz.nnames > 1 ? fz.nnames - 1 : 1);
  int32_t k;
  if (name >= fz.nnames || fz.name_key[name] < 0) return;
  k = fz.name_key[name];
  if (rng_int(2)) {
    int on = !fz.name_pinned[name];
    CHECK_EQ(KEY_PIN(fz.p, k, on), 0);
    fz.name_pinned[name] = on;
    fz_drain();
  } else if (KEY_FORGET(fz.p, k)) {
    fz_drain();
    CHECK(fz.name_key[name] < 0);
  } else {
    fz_drain();
  }
}

static clientpool_config_t fz_config(void) {
  clientpool_config_t c = cfg_base();
  c.max_live = 1 + rng_int(6);
  c.max_idle = rng_int(4) ? c.max_live : rng_int(c.max_live + 1);
  c.min_idle = rng_int(c.max_idle + 1);
  c.max_concurrency = 1 + rng_int(8);
  c.max_waiting = rng_int(7);
  c.key_max_live = rng_int(2) ? -1 : 1 + rng_int(c.max_live);
  c.key_max_idle = rng_int(3) ? -1 : rng_int(c.max_idle + 1);
  c.max_keys = rng_int(3) ? -1 : 1 + rng_int(FZ_NAMES);
  c.idle_timeout = rng_int(3) ? 0.5 + rng_unit() * 10 : -1;
  c.max_lifetime = rng_int(3) ? 1 + rng_unit() * 10 : -1;
  c.lifetime_jitter = rng_int(2) ? rng_unit() * 0.5 : 0;
  c.validate_after_idle = rng_int(2) ? rng_unit() * 2 : -1;
  c.leak_threshold = rng_int(3) ? -1 : 1 + rng_unit() * 5;
  c.seed = rng_u32();
  return c;
}

static void fz_episode_start(void) {
  int i;
  memset(&fz, 0, sizeof fz);
  fz.cfg = fz_config();
  fz.p = POOL(fz.cfg);
  fz.armed = -1;
  fz.now = rng_unit() * 100;
  fz.enow = 0;
  fz.nnames = 1 + rng_int(FZ_NAMES);
  for (i = 0; i < FZ_NAMES; i++) fz.name_key[i] = -1;
  for (i = 0; i < FZ_MAXK; i++) fz.key_name[i] = -1;
}

/* closes the pool, settles every lease and waiter, and checks nothing is left */
static void fz_episode_end(void) {
  clientpool_stats_t s;
  clientpool_grant_t g;
  uint32_t gen;
  int i;
  fz.now += 1;
  for (i = 0; i < FZ_NAMES; i++) fz.name_pinned[i] = 0;    /* close unpins every key */
  CLOSE(fz.p, fz_seen(fz.now));
  fz_drain();
  for (i = 0; i < fz.nw; i++) CHECK(fz.W[i].woken);        /* every queued waiter woken */
  CHECK_EQ(clientpool_is_closed(fz.p), 1);
  CHECK_EQ(KEY_OPEN(fz.p), CLIENTPOOL_ECLOSED);
  for (i = 0; i < fz.nnames; i++)
    if (fz.name_key[i] >= 0) {
      CHECK_STATUS(ACQUIRE(fz.p, fz.name_key[i], fz.now, &g), CLIENTPOOL_CLOSED);
      CHECK_EQ(WAIT_RAW(fz.p, fz.name_key[i], -1, fz.now, &gen), -CLIENTPOOL_CLOSED);
    }
  while (fz.nw) {
    fz_waiter x = fz.W[fz.nw - 1];
    waiter_h wh;
    int st;
    wh.w = x.w; wh.gen = x.gen;
    fz.nw--;
    st = CLAIM(fz.p, wh, fz.now, &g);
    if (st == CLIENTPOOL_GRANT_IDLE || st == CLIENTPOOL_GRANT_CREATE) fz_grant(&g, x.key);
    else CHECK(st == CLIENTPOOL_CLOSED || st == CLIENTPOOL_TIMEOUT);
    fz_drain();
  }
  while (fz.nl) {
    fz_lease x = fz.L[fz.nl - 1];
    if (!x.created) {
      int ok = rng_int(2);
      CHECK_EQ(CREATED(fz.p, x.rec, ok, fz.now), 0);
      fz.rstate[x.rec] = ok ? FR_LEASED : FR_FREE;
      if (!ok) fz.nl--;
      fz_drain();
      if (!ok) continue;
      fz.L[fz.nl - 1].created = 1;
    }
    fz.nl--;
    fz.rstate[x.rec] = FR_RELEASED;
    CHECK_EQ(RELEASE_RAW(fz.p, x.l, x.gen, -1, fz.now), 0);
    fz_drain();
    CHECK(fz.rstate[x.rec] == FR_FREE);                      /* destroyed: BY_DRAIN */
  }
  fz_verify();
  s = pstats(fz.p);
  CHECK(s.live == 0 && s.idle == 0 && s.active == 0 && s.leases == 0);
  CHECK(s.creating == 0 && s.waiting == 0);
  for (i = 0; i < FZ_MAXR; i++) CHECK(fz.rstate[i] == FR_FREE);
  CHECK_EQ(fz_mapped(), 0);                                  /* every key forgotten */
  for (i = 0; i < 64; i++) CHECK(clientpool_stats(fz.p, i, &s) == CLIENTPOOL_EINVAL);
  free_pool(fz.p);
  fz.p = NULL;
}

static void t_fuzz_random_ops(void) {
  const char *env = getenv("CLIENTPOOL_FUZZ_SEED");
  uint64_t seed = env ? strtoull(env, NULL, 10) : 20240601u;
  long op = 0, episodes = 0;
  int i;
  rng_seed(seed);
  memset(fz_cov, 0, sizeof fz_cov);
  memset(fz_by_reason, 0, sizeof fz_by_reason);
  while (op < FZ_OPS) {
    long len = 200 + rng_int(4000), j;
    snprintf(g_ctx, sizeof g_ctx, "fuzz seed %llu, episode %ld start",
             (unsigned long long)seed, episodes);
    fz_episode_start();
    for (j = 0; j < len && op < FZ_OPS; j++, op++) {
      int r = rng_int(100);
      snprintf(g_ctx, sizeof g_ctx, "fuzz seed %llu, episode %ld, op %ld (r=%d)",
               (unsigned long long)seed, episodes, op, r);
      fz_advance();
      /* saturated (every lease taken): mostly release instead of piling up waits */
      if (r < 22 && fz.nl >= fz.cfg.max_concurrency && rng_int(4) != 0) r = 40;
      if (r < 22) fz_op_acquire();
      else if (r < 32) fz_op_created();
      else if (r < 52) fz_op_release(0);
      else if (r < 54) fz_op_release(1);
      else if (r < 57) fz_op_stale();
      else if (r < 60) {                    /* wait without acquire first */
        int name = rng_int(fz.nnames);
        int32_t k = fz_key(name);
        if (k >= 0) fz_wait(k);
      }
      else if (r < 71) fz_op_waiter(0);
      else if (r < 75) fz_op_waiter(1);
      else if (r < 78) fz_op_waiter(2);
      else if (r < 81) fz_op_retire();
      else if (r < 96) fz_op_tick();
      else fz_op_keys();
      fz_verify();
    }
    snprintf(g_ctx, sizeof g_ctx, "fuzz seed %llu, episode %ld end", (unsigned long long)seed, episodes);
    fz_episode_end();
    episodes++;
  }
  g_ctx[0] = 0;
  CHECK(episodes > 10);
  if (getenv("CLIENTPOOL_FUZZ_VERBOSE")) {
    for (i = 0; i < CV_N; i++) fprintf(stderr, "  fuzz %-16s %ld\n", cv_name[i], fz_cov[i]);
    for (i = 0; i < CLIENTPOOL_BY_COUNT; i++) fprintf(stderr, "  fuzz destroy/%d %ld\n", i, fz_by_reason[i]);
  }
  for (i = 0; i < CV_N; i++)
    if (fz_cov[i] == 0) fail_at(__FILE__, __LINE__, "the fuzzer never reached: %s", cv_name[i]);
  for (i = 0; i < CLIENTPOOL_BY_COUNT; i++)
    if (fz_by_reason[i] == 0) fail_at(__FILE__, __LINE__, "the fuzzer never destroyed a record by reason %d", i);
}

/* ===================================================================== */
/* 23. memory, and idle expiry exactness                                */
/* ===================================================================== */

/* The warm floor renews an idle record's expiry clock each idle_timeout;
 * the idle time validate_after_idle reads must stay exact however many
 * renewals (a float offset re-rounded at every renewal drifted by about
 * 1e-3 relative: validate was skipped for a client idle long enough). */
static void t_floor_renewals_keep_idle_time(void) {
  clientpool_config_t c = cfg_base();
  int32_t k, r, i;
  clientpool_grant_t g;
  double t = 0;
  c.min_idle = c.max_idle = c.max_live = 1;
  c.idle_timeout = 0.7;
  c.validate_after_idle = 0.7 * 3000 + 0.3;   /* the idle time at the acquire below */
  clientpool_t *p = POOL(c);
  k = UKEY(p);
  r = WARM_RECORD(p, k, 0);
  for (i = 1; i <= 3000; i++) {
    t = 0.7 * i;
    TICK(p, t);
  }
  CHECK_EQ(KSTATS(p, k).idle, 1);
  drain(p);
  CHECK_EQ(n_events(CLIENTPOOL_EV_DESTROY), 0);
  t += 0.3;
  CHECK_STATUS(ACQUIRE(p, k, t, &g), CLIENTPOOL_GRANT_IDLE);
  CHECK(g.record == r);
  CHECK(g.idle == t);               /* went idle at 0: exactly now */
  CHECK_EQ(g.validate, 1);
}

/* idle_timeout is a lower bound in the caller's own arithmetic too: 0.7 +
 * 0.1 rounds below 0.8, and a deadline of that sum closed the client after
 * 0.0999999999999999778 s of idle. */
static void t_idle_expiry_never_early_by_rounding(void) {
  clientpool_config_t c = cfg_base();
  c.idle_timeout = 0.1;
  clientpool_t *p = POOL(c);
  int32_t k = UKEY(p);
  hold_t h = NEW_LEASE(p, k, 0.7);
  RELEASE(p, h, 0.7);
  double d = clientpool_next_deadline(p);
  CHECK(d - 0.7 >= 0.1);
  TICK(p, nextafter(d, -HUGE_VAL));
  CHECK_EQ(KSTATS(p, k).idle, 1);
  TICK(p, d);
  CHECK_EQ(KSTATS(p, -1).idle, 0);   /* (the pool: the key is forgotten) */
}

/* B4: an idle record costs at most 64 bytes of C heap (the record and its
 * share of the slot array's spare room), measured with glibc's mallinfo2
 * over 100k records made by the warm floor.  Under ASan the allocator is
 * not glibc's and the reading is 0: the test then checks nothing. */
#ifdef __GLIBC__
static size_t heap_bytes(void) {   /* in use: arena chunks and mmap'd blocks */
  struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}
#endif

static void t_idle_record_bytes(void) {
#ifdef __GLIBC__
  enum { N = 100000 };
  clientpool_config_t c = cfg_base();
  clientpool_event_t e;
  int32_t k, kk, r, i;
  size_t before, after;
  c.max_live = c.max_idle = c.min_idle = N;
  c.max_concurrency = N;
  clientpool_t *p = POOL(c);
  k = UKEY(p);
  CHECK_EQ(KEY_PIN(p, k, 2), 0);
  clientpool_floor(p, 1, 0);
  before = heap_bytes();
  for (i = 0; i < N; i++) {
    r = clientpool_refill(p, 0, &kk);
    CHECK(r >= 0 && kk == k);
    CHECK_EQ(clientpool_created(p, r, 1, 0), 0);
    while (clientpool_next_event(p, &e) != CLIENTPOOL_EV_NONE) {}
  }
  after = heap_bytes();
  CHECK_EQ(KSTATS(p, k).idle, N);
  if (after > before) {
    double per = (double)(after - before) / N;
    printf("  (%s: %.1f bytes per idle record)\n", g_test, per);
    CHECK(per <= 64);
  }
#endif
}

const test_t tests_scale[] = {
  /* 17 scale */
  T(t_scale_100k_idle_1k_keys),
  /* 18 randomized */
  T(t_fuzz_random_ops),
  /* 20 edges */
  T(t_floor_renewals_keep_idle_time),
  T(t_idle_expiry_never_early_by_rounding),
  /* 23 memory */
  T(t_idle_record_bytes),
  { NULL, NULL }
};
