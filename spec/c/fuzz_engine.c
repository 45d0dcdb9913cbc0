/*
 * fuzz_engine.c - libFuzzer harness: the engine (csrc/engine.c) against the
 * reference model (spec/c/model.c).
 *
 *   make fuzz                      FUZZ_TIME seconds (default 60) over the
 *                                  committed corpus and regressions
 *   make fuzz-ci                   the short bounded run of `make test`
 *   build/fuzz/fuzz_engine FILE    replays one input (FUZZ_TRACE=1 prints
 *                                  every step)
 *
 * Input.  The first 17 bytes are the config (max_live 1..6, capacity 1..3,
 * max_concurrency, max_idle, min_idle, max_waiting 0..6, per-key caps,
 * max_keys, pause_fail, idle_timeout, max_lifetime, jitter,
 * validate_after_idle, leak_threshold, seed, create backoff); then each step is an opcode
 * byte and an argument byte: acquire (and wait or give up), wait, created
 * ok/fail, release for reuse or with a reason, claim, cancel, abandon, leak
 * (of a lease or a reservation), tick with a clock advance, advance, close,
 * pause/resume (probe) of the pool or a key, probe_ok, retire,
 * retire_before, key pin (0/1/2)/forget, floor on/off, refill, stale handles,
 * destroyed (a destroy hook returned: of a closing record whose EV_DESTROY was
 * read, of one whose event is still queued, or of a record that is not
 * closing), keepalive_done (good, bad, stale), configure (one group of fields changed, the envelope broken now
 * and then, or what cannot change), key_caps, and a skewed clock (an
 * earlier time or NaN) for the next call.  Up to six
 * key names.  Bytes past the end read as 0.
 *
 * Each step calls the engine, then the model with the same arguments, and
 * checks: the same return values and grants (mapped between the engine's
 * slots and the model's ids), the same events (as multisets: the order of
 * events with equal deadlines is the engine's business), the same stats of
 * the pool and of every key, the same next deadline and gates, every record's
 * state, key and lease count; clientpool_check(); and, independently of the
 * model: live + creating + closing <= max_live (and per key), leases <=
 * max_concurrency, waiting <= max_waiting, per-key grants in FIFO order,
 * opened - closed = live, sum(closed_by) = closed, live = idle + active, the
 * per-key gauges summing to the pool's, and every lease the harness holds
 * valid and on a leased record.  At the end the pool is closed, every waiter,
 * reservation and lease settled, and nothing may be left.
 *
 * Inputs whose first byte is FUZZ_FLEET_MARK (0xF1) go to the fleet mode
 * instead (spec/c/fuzz_fleet.c: two engines on one shared fleet segment,
 * against the fleet's accounting model).
 *
 * The engine is linked in through spec/c/whitebox.c, so that the harness can
 * read what a woken waiter was granted before it is claimed and each
 * record's lease count, retire and loss marks (the wb_* accessors).
 */
#include "whitebox.h"
#include "model.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NAMES 6
#define MAXH 40           /* handles of each kind the harness holds at once */
#define MAXSTEPS 1500
#define EMAP 1024         /* engine slots the maps cover */
#define DEAD 8
#define FZ_NONE (-1)

/* ---- harness state ---------------------------------------------------- */

typedef struct { int32_t l; uint32_t gen; int ml; unsigned mgen; } h_lease;
typedef struct { int32_t r; int32_t l; uint32_t gen; int mr; int ml; unsigned mgen; int refill; } h_res;
typedef struct {
  int32_t w; uint32_t gen; int mw; unsigned mgen; int mk; int queued;
  long arrival;
  long long place;        /* arrival - priority * PRIORITY_STEP, or (a kept place) below all */
} h_waiter;
typedef struct { int32_t e; uint32_t egen; int m; unsigned mgen; } h_dead;
typedef struct { int valid; int m; unsigned mgen; } h_map;
typedef struct { int32_t r; int mr; } h_closing;

static struct {
  const uint8_t *in;
  size_t n, pos;
  int trace;
  clientpool_t *p;
  model_t m;
  clientpool_config_t cfg;
  double now;
  int skew;
  int untimed;     /* acquire and release try the untimed calls first (seed & 2) */
  long step, arrivals;
  const char *op;
  int floor_used;
  /* names and keys */
  int name_mk[NAMES];
  int32_t mk_ek[M_MAXKEY];
  h_map ek[EMAP];                 /* engine key -> model key */
  /* slot maps: engine -> model */
  h_map er[EMAP];
  h_map el[EMAP]; uint32_t el_gen[EMAP];
  h_map ew[EMAP]; uint32_t ew_gen[EMAP];
  /* what the harness holds, as a driver would */
  h_lease L[MAXH]; int nl;
  h_res R[MAXH]; int nr;
  h_waiter W[MAXH]; int nw;
  h_dead deadl[DEAD]; int ndl;
  h_dead deadw[DEAD]; int ndw;
  h_closing D[EMAP]; int nd;      /* closing records whose EV_DESTROY was read */
  h_closing KA[EMAP]; int nka;    /* records out for a keepalive (EV_KEEPALIVE read) */
  /* after a cap was lowered: what was there then, and may stay until it
   * ends (0: none); each step checks it never grows */
  long hi_live, hi_leases, hi_waiting, hi_key[M_MAXKEY];
  /* this step */
  clientpool_grant_t eg; int eg_valid; m_grant_t mg;    /* a direct grant */
  int32_t new_er; int new_mr;                            /* a refill reservation */
  int32_t cur_ew; uint32_t cur_egen;                     /* the waiter a wait() queues */
  int32_t refill_ek;
  char oracle_err[256];
} H;

static void fz_fail(const char *fmt, ...) {
  va_list ap;
  const clientpool_config_t *c = &H.cfg;
  fprintf(stderr, "\nfuzz_engine: step %ld (%s): ", H.step, H.op ? H.op : "-");
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n  config: max_live %d capacity %d max_concurrency %d max_idle %d min_idle %d "
          "max_waiting %d key_max_live %d key_max_idle %d max_keys %d pause_fail %d idle_timeout %g "
          "max_lifetime %g jitter %g validate_after_idle %g leak_threshold %g create_backoff %g..%g "
          "seed %llu; now %g\n",
          c->max_live, c->capacity, c->max_concurrency, c->max_idle, c->min_idle, c->max_waiting,
          c->key_max_live, c->key_max_idle, c->max_keys, c->pause_fail, c->idle_timeout,
          c->max_lifetime, c->lifetime_jitter, c->validate_after_idle, c->leak_threshold,
          c->create_backoff, c->create_backoff_max, (unsigned long long)c->seed, H.now);
  abort();
}

#define EXPECT(cond) do { if (!(cond)) fz_fail("expected %s (%s:%d)", #cond, __FILE__, __LINE__); } while (0)
#define EXPECT_EQ(a, b) do { long x_ = (long)(a), y_ = (long)(b); \
    if (x_ != y_) fz_fail("expected %s == %s: engine/left %ld, model/right %ld (%s:%d)", \
                          #a, #b, x_, y_, __FILE__, __LINE__); } while (0)
#define EXPECT_DEQ(a, b) do { double x_ = (a), y_ = (b); \
    if (!(x_ == y_)) fz_fail("expected %s == %s: %.17g vs %.17g (%s:%d)", \
                             #a, #b, x_, y_, __FILE__, __LINE__); } while (0)

static void trace(const char *fmt, ...) {
  va_list ap;
  if (!H.trace) return;
  fprintf(stderr, "[%ld t=%g] ", H.step, H.now);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}

static int byte(void) { return H.pos < H.n ? H.in[H.pos++] : 0; }
static int at_end(void) { return H.pos >= H.n; }

/* the time passed to the next call: now, or (skewed) an earlier time or NaN */
static double t_call(void) {
  int s = H.skew;
  H.skew = 0;
  if (s == 1) return H.now - 1.5;
  if (s == 2) return NAN;
  return H.now;
}

/* ---- maps ------------------------------------------------------------- */

/* how far the engine's slot arrays reach: the maps need look no further */
static int32_t span(void) { return wb_span(H.p) < EMAP ? wb_span(H.p) : EMAP; }

static int map_get(const h_map *map, int32_t e) {
  if (e < 0 || e >= EMAP || !map[e].valid) return FZ_NONE;
  return map[e].m;
}
static void map_set(h_map *map, int32_t e, int m, unsigned mgen) {
  if (e < 0 || e >= EMAP) fz_fail("engine slot %d beyond the harness's maps", (int)e);
  map[e].valid = 1; map[e].m = m; map[e].mgen = mgen;
}
static int32_t rec_engine_slot(int mr) {
  int32_t e;
  for (e = 0; e < span(); e++)
    if (H.er[e].valid && H.er[e].m == mr && H.er[e].mgen == H.m.rec[mr].gen) return e;
  return FZ_NONE;
}
static int lease_model(int32_t l, uint32_t gen) {
  if (l < 0 || l >= EMAP || !H.el[l].valid || H.el_gen[l] != gen) return FZ_NONE;
  return H.el[l].m;
}
static int waiter_model(int32_t w, uint32_t gen) {
  if (w < 0 || w >= EMAP || !H.ew[w].valid || H.ew_gen[w] != gen) return FZ_NONE;
  return H.ew[w].m;
}
static int32_t waiter_engine(int mw, uint32_t *gen) {
  int32_t e;
  for (e = 0; e < span(); e++)
    if (H.ew[e].valid && H.ew[e].m == mw && H.ew[e].mgen == H.m.wai[mw].gen) { *gen = H.ew_gen[e]; return e; }
  return FZ_NONE;
}

/* ---- the oracle: the engine's free choices, checked ------------------- */

static int oracle(void *ctx, int what, int who, const int *cand, int n) {
  int i, mr = FZ_NONE;
  (void)ctx;
  if (what == M_ORACLE_RETIRED) {
    int32_t e = rec_engine_slot(who);
    return e >= 0 && wb_rec_retire(H.p, e);
  }
  if (what == M_ORACLE_SHARE) {
    int32_t er = FZ_NONE;
    if (who < 0) {
      if (H.eg_valid) er = H.eg.record;
    } else {
      uint32_t gen = 0;
      int32_t w = waiter_engine(who, &gen);
      if (w < 0 && H.cur_ew >= 0) w = H.cur_ew;
      if (w >= 0) {
        int res; int32_t rec, lease; uint32_t lg;
        wb_waiter(H.p, w, &res, &rec, &lease, &lg);
        if (res == CLIENTPOOL_GRANT_IDLE) er = rec;
      }
    }
    mr = map_get(H.er, er);
  } else if (what == M_ORACLE_REFILL) {
    mr = map_get(H.ek, H.refill_ek);
  } else if (what == M_ORACLE_KEEPALIVE) {
    /* the engine took its pick already: the candidate it has out */
    for (i = 0; i < n; i++) {
      int32_t e = rec_engine_slot(cand[i]);
      if (e >= 0 && wb_rec_state(H.p, e) == WB_CHECKING) return cand[i];
    }
  }
  for (i = 0; i < n; i++) if (cand[i] == mr) return mr;
  if (!H.oracle_err[0])
    snprintf(H.oracle_err, sizeof H.oracle_err,
             "the engine chose %d (model id) where the rules allow only %d candidate(s), first %d (%s)",
             mr, n, n ? cand[0] : -1, what == M_ORACLE_SHARE ? "shared record" :
             what == M_ORACLE_REFILL ? "refill key" : "keepalive record");
  return cand[0];
}

/* ---- events ----------------------------------------------------------- */

#define EVMAX 1024
static clientpool_event_t ev_e[EVMAX], ev_m[EVMAX];

static int ev_cmp(const void *a, const void *b) {
  const clientpool_event_t *x = a, *y = b;
  if (x->type != y->type) return x->type - y->type;
  if (x->a != y->a) return x->a < y->a ? -1 : 1;
  if (x->b != y->b) return x->b < y->b ? -1 : 1;
  if (x->c != y->c) return x->c < y->c ? -1 : 1;
  if (x->t != y->t) return x->t < y->t ? -1 : 1;
  return 0;
}

static const char *ev_name(int t) {
  static const char *const names[] = { "NONE", "WAKE", "DESTROY", "TIMER", "KEY_FREE", "LEAK",
                                       "CREATED", "REFILL", "LOST", "KEEPALIVE" };
  return t >= 0 && t <= 9 ? names[t] : "?";
}

static void ev_dump(const char *who, const clientpool_event_t *v, int n) {
  int i;
  fprintf(stderr, "  %s events (model ids):", who);
  for (i = 0; i < n; i++)
    fprintf(stderr, " %s(%d,%d,%d,%g)", ev_name(v[i].type), v[i].a, v[i].b, v[i].c, v[i].t);
  fprintf(stderr, "\n");
}

static int h_waiter_index(int mw) {
  int i;
  for (i = 0; i < H.nw; i++) if (H.W[i].mw == mw && H.W[i].mgen == H.m.wai[mw].gen) return i;
  return FZ_NONE;
}

/* Drains both queues, translates the engine's events into model ids (with
 * the maps as they were before this step), checks FIFO per key on the
 * engine's own order, and compares the two as multisets. */
static void compare_events(void) {
  clientpool_event_t e;
  int ne = 0, nm = 0, i;
  while (clientpool_next_event(H.p, &e) != CLIENTPOOL_EV_NONE) {
    clientpool_event_t t = e;
    if (ne == EVMAX) fz_fail("too many engine events in one step");
    switch (e.type) {
    case CLIENTPOOL_EV_WAKE: {
      int mw = waiter_model(e.a, (uint32_t)e.b), hi, res, j;
      int32_t rec, lease; uint32_t lg;
      if (mw < 0) fz_fail("EV_WAKE of engine waiter %d/%d, which is not queued", e.a, e.b);
      t.a = mw; t.b = (int)H.ew[e.a].mgen; t.c = map_get(H.ek, e.c);
      hi = h_waiter_index(mw);
      if (hi < 0 || !H.W[hi].queued) fz_fail("EV_WAKE of waiter %d that the driver does not see queued", mw);
      wb_waiter(H.p, e.a, &res, &rec, &lease, &lg);
      /* per key: a grant never overtakes a waiter of its key with an earlier
       * place (priority, then arrival) */
      if (res == CLIENTPOOL_GRANT_IDLE || res == CLIENTPOOL_GRANT_CREATE)
        for (j = 0; j < H.nw; j++)
          if (j != hi && H.W[j].queued && H.W[j].mk == H.W[hi].mk &&
              (H.W[j].place < H.W[hi].place || (H.W[j].place == H.W[hi].place && H.W[j].arrival < H.W[hi].arrival)))
            fz_fail("order: waiter %d (arrival %ld, place %lld) granted while waiter %d (arrival %ld, place %lld) "
                    "of its key waits", mw, H.W[hi].arrival, H.W[hi].place, H.W[j].mw, H.W[j].arrival, H.W[j].place);
      H.W[hi].queued = 0;
      break;
    }
    case CLIENTPOOL_EV_KEEPALIVE:
      t.a = map_get(H.er, e.a);
      if (t.a < 0) fz_fail("EV_KEEPALIVE of engine record %d, which the harness never saw", e.a);
      t.c = map_get(H.ek, e.c);
      if (H.nka == EMAP) fz_fail("harness: too many keepalives");
      H.KA[H.nka].r = e.a; H.KA[H.nka].mr = t.a; H.nka++;
      break;
    case CLIENTPOOL_EV_DESTROY:
    case CLIENTPOOL_EV_CREATED:
    case CLIENTPOOL_EV_LOST:
      t.a = map_get(H.er, e.a);
      if (t.a < 0) fz_fail("%s of engine record %d, which the harness never saw", ev_name(e.type), e.a);
      t.c = map_get(H.ek, e.c);
      /* the driver runs the destroy hook and reports it done later (op_destroyed),
       * unless the harness reported it already, before reading the event */
      if (e.type == CLIENTPOOL_EV_DESTROY && wb_rec_state(H.p, e.a) == WB_CLOSING) {
        if (H.nd == EMAP) fz_fail("harness: too many closing records");
        H.D[H.nd].r = e.a; H.D[H.nd].mr = t.a; H.nd++;
      }
      break;
    case CLIENTPOOL_EV_KEY_FREE: {
      int n;
      t.a = map_get(H.ek, e.a);
      if (t.a < 0) fz_fail("EV_KEY_FREE of engine key %d, which is not open", e.a);
      for (n = 0; n < NAMES; n++) if (H.name_mk[n] == t.a) H.name_mk[n] = FZ_NONE;
      break;
    }
    case CLIENTPOOL_EV_LEAK:
      if (e.a == -1) {               /* a collected lease: only its key */
        t.c = map_get(H.ek, e.c);
        break;
      }
      t.a = lease_model(e.a, (uint32_t)e.b);
      if (t.a < 0) fz_fail("EV_LEAK of engine lease %d/%d, which the harness never saw", e.a, e.b);
      t.b = (int)H.el[e.a].mgen;
      t.c = map_get(H.ek, e.c);
      break;
    case CLIENTPOOL_EV_REFILL:
      t.a = 0;                       /* which warm key is signalled first is the engine's order */
      break;
    case CLIENTPOOL_EV_TIMER:
      break;
    default:
      fz_fail("unknown engine event type %d", e.type);
    }
    ev_e[ne++] = t;
  }
  while (model_next_event(&H.m, &e) != CLIENTPOOL_EV_NONE) {
    if (nm == EVMAX) fz_fail("too many model events in one step");
    if (e.type == CLIENTPOOL_EV_REFILL) e.a = 0;
    ev_m[nm++] = e;
  }
  qsort(ev_e, (size_t)ne, sizeof ev_e[0], ev_cmp);
  qsort(ev_m, (size_t)nm, sizeof ev_m[0], ev_cmp);
  for (i = 0; i < ne || i < nm; i++)
    if (i >= ne || i >= nm || ev_cmp(&ev_e[i], &ev_m[i]) != 0) {
      ev_dump("engine", ev_e, ne);
      ev_dump("model ", ev_m, nm);
      fz_fail("the engine's events differ from the model's");
    }
}

/* ---- per-step checks -------------------------------------------------- */

static void compare_stats(const clientpool_stats_t *a, const clientpool_stats_t *b, const char *what) {
  int i;
#define SAME(f) do { if (!(a->f == b->f)) fz_fail("stats(%s).%s: engine %g, model %g", what, #f, \
                                                  (double)a->f, (double)b->f); } while (0)
  SAME(opened); SAME(reused); SAME(closed); SAME(leaked); SAME(timeouts); SAME(rejected);
  SAME(cancelled); SAME(create_failed); SAME(wait_count); SAME(wait_time);
  SAME(live); SAME(idle); SAME(active); SAME(leases); SAME(creating); SAME(waiting); SAME(closing);
#undef SAME
  for (i = 0; i < CLIENTPOOL_BY_COUNT; i++)
    if (a->closed_by[i] != b->closed_by[i])
      fz_fail("stats(%s).closed_by[%d]: engine %g, model %g", what, i, a->closed_by[i], b->closed_by[i]);
}

/* identities that hold whatever the model says */
static void check_identities(const clientpool_stats_t *s, const char *what) {
  double by = 0;
  int i;
  for (i = 0; i < CLIENTPOOL_BY_COUNT; i++) by += s->closed_by[i];
  if (s->opened - s->closed != s->live) fz_fail("stats(%s): opened - closed != live", what);
  if (by != s->closed) fz_fail("stats(%s): sum(closed_by) != closed", what);
  if (s->live != s->idle + s->active) fz_fail("stats(%s): live != idle + active", what);
  if (s->leases < s->active) fz_fail("stats(%s): fewer leases than active records", what);
  if (s->leases > s->active * H.cfg.capacity + s->creating) fz_fail("stats(%s): too many leases", what);
  if (s->live < 0 || s->idle < 0 || s->creating < 0 || s->waiting < 0 || s->closing < 0)
    fz_fail("stats(%s): negative", what);
}

static void unmap_dead(void) {
  int32_t e;
  for (e = 0; e < span(); e++) {
    if (H.er[e].valid && (H.m.rec[H.er[e].m].gen != H.er[e].mgen || H.m.rec[H.er[e].m].state == MR_FREE))
      H.er[e].valid = 0;
    if (H.el[e].valid && (H.m.lea[H.el[e].m].gen != H.el[e].mgen || !H.m.lea[H.el[e].m].alive))
      H.el[e].valid = 0;
    if (H.ew[e].valid && (H.m.wai[H.ew[e].m].gen != H.ew[e].mgen || H.m.wai[H.ew[e].m].state == MW_FREE))
      H.ew[e].valid = 0;
    if (H.ek[e].valid && (H.m.keys[H.ek[e].m].gen != H.ek[e].mgen || !H.m.keys[H.ek[e].m].used))
      H.ek[e].valid = 0;
  }
}

/* A grant the engine made (record and lease slots) and the model's (ids):
 * a reuse names the record both already know; a reservation maps a new one. */
static void map_grant(int status, int32_t er, int32_t el, uint32_t elgen, int mr, int ml, unsigned mlgen) {
  if (status == CLIENTPOOL_GRANT_IDLE) {
    if (map_get(H.er, er) != mr)
      fz_fail("the engine granted record %d (model id %d), the model record %d", er, map_get(H.er, er), mr);
  } else {
    if (map_get(H.er, er) >= 0) fz_fail("reservation in engine record %d, which is still in use", er);
    map_set(H.er, er, mr, H.m.rec[mr].gen);
  }
  if (lease_model(el, elgen) >= 0 || (el >= 0 && el < EMAP && H.el[el].valid))
    fz_fail("engine lease %d/%u handed out while still held", el, (unsigned)elgen);
  map_set(H.el, el, ml, mlgen);
  H.el_gen[el] = elgen;
}

static void step_end(void) {
  clientpool_stats_t se, sm, sum;
  char buf[512];
  int mk, i, nlive = 0;
  int32_t r;
  compare_events();
  if (H.oracle_err[0]) fz_fail("%s", H.oracle_err);
  if (H.m.overflow) fz_fail("the model ran out of room (harness limits too loose)");
  unmap_dead();
  if (H.eg_valid)
    map_grant(H.eg.status, H.eg.record, H.eg.lease, H.eg.lease_gen, H.mg.record, H.mg.lease, H.mg.lease_gen);
  H.eg_valid = 0;
  if (H.new_er >= 0) {
    if (map_get(H.er, H.new_er) >= 0) fz_fail("refill reservation in engine record %d, still in use", H.new_er);
    map_set(H.er, H.new_er, H.new_mr, H.m.rec[H.new_mr].gen);
    H.new_er = FZ_NONE;
  }
  /* grants of waiters woken in this step */
  for (i = 0; i < H.nw; i++) {
    h_waiter *x = &H.W[i];
    const m_waiter_t *mx = &H.m.wai[x->mw];
    int res; int32_t rec, lease; uint32_t lg;
    if (x->queued) continue;
    wb_waiter(H.p, x->w, &res, &rec, &lease, &lg);
    if (res != mx->result) fz_fail("waiter %d: engine result %d, model %d", x->mw, res, mx->result);
    if ((res == CLIENTPOOL_GRANT_IDLE || res == CLIENTPOOL_GRANT_CREATE) && lease_model(lease, lg) < 0)
      map_grant(res, rec, lease, lg, mx->record, mx->lease, mx->lease_gen);
  }
  /* stats of the pool and of every key */
  clientpool_stats(H.p, -1, &se);
  model_stats(&H.m, -1, &sm);
  compare_stats(&se, &sm, "pool");
  check_identities(&se, "pool");
  memset(&sum, 0, sizeof sum);
  for (mk = 0; mk < M_MAXKEY; mk++) {
    clientpool_stats_t ke, km;
    char what[32];
    if (!H.m.keys[mk].used) continue;
    snprintf(what, sizeof what, "key %d", mk);
    if (clientpool_stats(H.p, H.mk_ek[mk], &ke) != 0) fz_fail("model key %d is open, engine key %d is not", mk, H.mk_ek[mk]);
    model_stats(&H.m, mk, &km);
    compare_stats(&ke, &km, what);
    check_identities(&ke, what);
    {
      int cap = H.m.keys[mk].cap_live >= 0 ? H.m.keys[mk].cap_live : H.cfg.key_max_live;
      int icap = H.m.keys[mk].cap_idle >= 0 ? H.m.keys[mk].cap_idle : H.cfg.key_max_idle;
      long held = ke.live + ke.creating + ke.closing;
      if (cap >= 0 && held > cap && held > H.hi_key[mk])
        fz_fail("key %d: live %d + creating %d + closing %d > its max_live %d (was %ld when lowered)", mk,
                ke.live, ke.creating, ke.closing, cap, H.hi_key[mk]);
      H.hi_key[mk] = cap >= 0 && held > cap ? held : 0;
      /* (over only while each idle record is out for a keepalive: a cap
       * lowered meanwhile closes each at its report) */
      if (!H.floor_used && icap >= 0 && ke.idle > icap && ke.idle != model_checking(&H.m, mk))
        fz_fail("key %d: idle %d > its max_idle", mk, ke.idle);
    }
    EXPECT_EQ(clientpool_gate(H.p, H.mk_ek[mk]), model_gate(&H.m, mk));
    sum.live += ke.live; sum.idle += ke.idle; sum.active += ke.active;
    sum.leases += ke.leases; sum.creating += ke.creating; sum.waiting += ke.waiting;
    sum.closing += ke.closing;
  }
  {
    int used = 0;
    for (mk = 0; mk < M_MAXKEY; mk++) used += H.m.keys[mk].used;
    EXPECT_EQ(wb_keys_used(H.p), used);
  }
  if (sum.live != se.live || sum.idle != se.idle || sum.active != se.active || sum.leases != se.leases ||
      sum.creating != se.creating || sum.waiting != se.waiting || sum.closing != se.closing)
    fz_fail("per-key gauges do not sum to the pool's");
  /* the cap is physical: closing records count until their destroy is reported */
  /* ... and after a lower cap, never more than there was when it was lowered */
  {
    long total = se.live + se.creating + se.closing;
    if (total > H.cfg.max_live && total > H.hi_live)
      fz_fail("live %d + creating %d + closing %d > max_live (%ld when lowered)", se.live, se.creating,
              se.closing, H.hi_live);
    if (se.leases > H.cfg.max_concurrency && se.leases > H.hi_leases)
      fz_fail("leases %d > max_concurrency", se.leases);
    if (se.waiting > H.cfg.max_waiting && se.waiting > H.hi_waiting)
      fz_fail("waiting %d > max_waiting", se.waiting);
    H.hi_live = total > H.cfg.max_live ? total : 0;
    H.hi_leases = se.leases > H.cfg.max_concurrency ? se.leases : 0;
    H.hi_waiting = se.waiting > H.cfg.max_waiting ? se.waiting : 0;
  }
  if (!H.floor_used && se.idle > H.cfg.max_idle && se.idle != model_checking(&H.m, -1)) fz_fail("idle %d > max_idle", se.idle);
  EXPECT_DEQ(clientpool_next_deadline(H.p), model_next_deadline(&H.m));
  EXPECT_EQ(clientpool_gate(H.p, -1), model_gate(&H.m, -1));
  EXPECT_EQ(clientpool_is_closed(H.p), H.m.closed);
  /* every record: state, key, leases, retire and loss marks */
  for (r = 0; r < wb_nrec(H.p); r++) {
    int mr, st = wb_rec_state(H.p, r);
    if (st == WB_FREE) continue;
    nlive++;
    mr = map_get(H.er, r);
    if (mr < 0) fz_fail("engine record %d (state %d) is unknown to the harness", r, st);
    EXPECT_EQ(st, H.m.rec[mr].state);
    EXPECT_EQ(map_get(H.ek, wb_rec_key(H.p, r)), H.m.rec[mr].key);
    EXPECT_EQ(wb_rec_nleases(H.p, r), H.m.rec[mr].nleases);
    EXPECT_EQ(wb_rec_retire(H.p, r), H.m.rec[mr].retire);
    EXPECT_EQ(wb_rec_doomed(H.p, r), H.m.rec[mr].doomed);
  }
  for (i = 0; i < M_MAXREC; i++) if (H.m.rec[i].state != MR_FREE) nlive--;
  if (nlive != 0) fz_fail("the engine and the model hold different numbers of records");
  /* the leases the harness holds are valid and on leased records */
  for (i = 0; i < H.nl; i++) {
    if (clientpool_lease_age(H.p, H.L[i].l, H.L[i].gen, H.now) < 0)
      fz_fail("held lease %d/%u is not valid in the engine", H.L[i].l, (unsigned)H.L[i].gen);
    if (wb_rec_state(H.p, wb_lease_record(H.p, H.L[i].l)) != WB_LEASED) fz_fail("held lease on a record not leased");
  }
  buf[0] = 0;
  if (clientpool_check(H.p, buf, sizeof buf) != 0) fz_fail("clientpool_check: %s", buf);
}

/* ---- handles ---------------------------------------------------------- */

static void dead_lease(int32_t l, uint32_t gen, int ml, unsigned mgen) {
  h_dead *d = &H.deadl[H.ndl++ % DEAD];
  d->e = l; d->egen = gen; d->m = ml; d->mgen = mgen;
}
static void dead_waiter(int32_t w, uint32_t gen, int mw, unsigned mgen) {
  h_dead *d = &H.deadw[H.ndw++ % DEAD];
  d->e = w; d->egen = gen; d->m = mw; d->mgen = mgen;
}

static void hold_lease(int32_t l, uint32_t gen, int ml, unsigned mgen) {
  h_lease *x;
  if (H.nl == MAXH) fz_fail("harness: too many leases");
  x = &H.L[H.nl++];
  x->l = l; x->gen = gen; x->ml = ml; x->mgen = mgen;
}
static void hold_res(int32_t r, int32_t l, uint32_t gen, int mr, int ml, unsigned mgen, int refill) {
  h_res *x;
  if (H.nr == MAXH) fz_fail("harness: too many reservations");
  x = &H.R[H.nr++];
  x->r = r; x->l = l; x->gen = gen; x->mr = mr; x->ml = ml; x->mgen = mgen; x->refill = refill;
}

/* a grant the driver now owns (from acquire, claim or cancel) */
static void take_grant(const clientpool_grant_t *g, const m_grant_t *mg) {
  if (g->status == CLIENTPOOL_GRANT_IDLE) hold_lease(g->lease, g->lease_gen, mg->lease, mg->lease_gen);
  else hold_res(g->record, g->lease, g->lease_gen, mg->record, mg->lease, mg->lease_gen, 0);
}

static void compare_grant(const clientpool_grant_t *g, const m_grant_t *mg) {
  EXPECT_EQ(g->status, mg->status);
  EXPECT_EQ(map_get(H.ek, g->key), mg->key);
  if (g->status == CLIENTPOOL_GRANT_IDLE || g->status == CLIENTPOOL_GRANT_CREATE) {
    EXPECT_EQ(g->validate, mg->validate);
    EXPECT_EQ(g->shared, mg->shared);
    EXPECT_DEQ(g->idle, mg->idle);
  }
}

/* ---- operations ------------------------------------------------------- */

static void destroy_unread(void);

static void begin(const char *op) {
  H.op = op;
  H.step++;
  H.eg_valid = 0;
  H.cur_ew = FZ_NONE;
  H.oracle_err[0] = 0;
}

/* The model key of a name, opening a key if needed; -1 when none can be. */
static int key_of(int name) {
  int32_t ek;
  int mk;
  if (H.name_mk[name] >= 0) return H.name_mk[name];
  begin("key_open");
  ek = clientpool_key_open(H.p);
  mk = model_key_open(&H.m);
  trace("key_open -> engine %d, model %d", (int)ek, mk);
  if (ek < 0 || mk < 0) {
    EXPECT_EQ(ek, mk);
    step_end();
    return FZ_NONE;
  }
  map_set(H.ek, ek, mk, H.m.keys[mk].gen);
  H.mk_ek[mk] = ek;
  H.name_mk[name] = mk;
  step_end();
  return mk;
}

static double deadline_of(int b) {
  if (b % 3 == 0) return -1;
  if (b % 32 == 31) return H.now - 0.5;      /* already past */
  return H.now + (double)(b % 24) * 0.25;
}

/* a waiter's priority: mostly 0, some small ones, now and then an extreme */
static int32_t priority_of(int b) {
  switch (b % 8) {
  case 0: case 1: case 2: case 3: return 0;
  case 4: return 1;
  case 5: return 2;
  case 6: return -1;
  default: return (b / 8) % 3 == 0 ? INT32_MAX : (b / 8) % 3 == 1 ? INT32_MIN : 3;
  }
}

static void op_wait(int mk, int b) {
  double dl = deadline_of(b), t = t_call();
  uint32_t egen = 0;
  unsigned mgen = 0;
  int32_t ew, prio = priority_of(byte());
  int mw;
  h_waiter *x = &H.W[H.nw];
  if (H.nw >= MAXH) return;
  begin("wait");
  ew = prio ? clientpool_wait_priority(H.p, H.mk_ek[mk], dl, prio, t, &egen)
            : clientpool_wait(H.p, H.mk_ek[mk], dl, t, &egen);
  if (ew >= 0) {
    H.cur_ew = ew; H.cur_egen = egen;
    /* the waiter is known before the model's dispatch can wake it */
    x->w = ew; x->gen = egen; x->mk = mk; x->queued = 1; x->arrival = ++H.arrivals;
    x->place = x->arrival - (long long)prio * CLIENTPOOL_PRIORITY_STEP;
  }
  mw = model_wait_priority(&H.m, mk, dl, prio, t, &mgen);
  trace("wait key %d deadline %g priority %d -> engine %d, model %d", mk, dl, (int)prio, (int)ew, mw);
  if (ew < 0 || mw < 0) {
    EXPECT_EQ(ew, mw);
    step_end();
    return;
  }
  x->mw = mw; x->mgen = mgen;
  if (H.m.wai[mw].order < INT64_MIN / 4) x->place = INT64_MIN / 2 + x->arrival;   /* a kept place */
  H.nw++;
  if (H.ew[ew].valid) fz_fail("engine waiter slot %d handed out while in use", ew);
  map_set(H.ew, ew, mw, mgen);
  H.ew_gen[ew] = egen;
  step_end();
}

static void op_acquire(int b) {
  int name = b % NAMES, mk = key_of(name);
  int est, mst, untimed = 0;
  double t;
  if (mk < 0 || H.nl + H.nr >= MAXH - 2) return;
  begin("acquire");
  t = t_call();
  if (H.untimed && (est = clientpool_acquire_untimed(H.p, H.mk_ek[mk], &H.eg)) != CLIENTPOOL_UNTIMED) {
    EXPECT_EQ(est, CLIENTPOOL_GRANT_IDLE);
    EXPECT_DEQ(H.eg.idle, 0);
    H.m.stale = untimed = 1;
    t = NAN;                               /* the engine's latest time */
  } else {
    est = clientpool_acquire(H.p, H.mk_ek[mk], t, &H.eg);
  }
  H.eg_valid = est == CLIENTPOOL_GRANT_IDLE || est == CLIENTPOOL_GRANT_CREATE;
  mst = model_acquire(&H.m, mk, t, &H.mg);
  if (untimed) H.mg.idle = 0;              /* (not measured) */
  trace("acquire key %d -> engine %d, model %d", mk, est, mst);
  EXPECT_EQ(est, mst);
  compare_grant(&H.eg, &H.mg);
  if (H.eg_valid) {
    clientpool_grant_t g = H.eg;
    m_grant_t mg = H.mg;
    step_end();
    take_grant(&g, &mg);
    return;
  }
  step_end();
  if (est == CLIENTPOOL_MUST_WAIT) {
    int c = byte();
    if (c % 5 == 0) {                          /* the driver gives up */
      begin("key_forget");
      EXPECT_EQ(clientpool_key_forget(H.p, H.mk_ek[mk]), model_key_forget(&H.m, mk));
      step_end();
    } else {
      op_wait(mk, c);
    }
  }
}

static void op_created(int b) {
  h_res x;
  int ok = (b & 7) != 0, erc, mrc;
  double t;
  if (!H.nr) return;
  x = H.R[(b >> 3) % H.nr];
  H.R[(b >> 3) % H.nr] = H.R[--H.nr];
  begin(ok ? "created(ok)" : "created(fail)");
  t = t_call();
  erc = clientpool_created(H.p, x.r, ok, t);
  mrc = model_created(&H.m, x.mr, ok, t);
  trace("created record %d (model %d) ok %d -> %d/%d", x.r, x.mr, ok, erc, mrc);
  EXPECT_EQ(erc, 0);
  EXPECT_EQ(mrc, 0);
  step_end();
  if (x.refill) return;
  if (ok) hold_lease(x.l, x.gen, x.ml, x.mgen);
  else dead_lease(x.l, x.gen, x.ml, x.mgen);
}

static void op_release(int b, int c) {
  h_lease x;
  int reason, erc, mrc;
  double t;
  if (!H.nl) return;
  x = H.L[b % H.nl];
  H.L[b % H.nl] = H.L[--H.nl];
  reason = c % 8 < 5 ? -1 : c % 8 < 7 ? CLIENTPOOL_BY_ERROR : (c / 8) % (CLIENTPOOL_BY_COUNT + 2);
  if (c % 16 == 15 && H.nl + H.nr < MAXH - 2) {   /* validate failed: the same caller again */
    clientpool_grant_t g;
    m_grant_t mg;
    int est, mst;
    begin("regrant");
    t = t_call();
    /* the engine's grant first: the model's oracle reads it (shared records) */
    est = clientpool_regrant(H.p, x.l, x.gen, t, &H.eg);
    H.eg_valid = est == CLIENTPOOL_GRANT_IDLE || est == CLIENTPOOL_GRANT_CREATE;
    mst = model_regrant(&H.m, x.ml, x.mgen, t, &H.mg);
    trace("regrant lease %d/%u (model %d) -> engine %d, model %d", x.l, (unsigned)x.gen, x.ml, est, mst);
    EXPECT_EQ(est, mst);
    dead_lease(x.l, x.gen, x.ml, x.mgen);
    g = H.eg;
    mg = H.mg;
    compare_grant(&g, &mg);
    step_end();
    if (est == CLIENTPOOL_GRANT_IDLE || est == CLIENTPOOL_GRANT_CREATE) take_grant(&g, &mg);
    /* MUST_WAIT: the caller keeps its place and acquires again at once (as
     * the driver does; now and then it does not, and the next call of any
     * key ends the place) */
    else if (est == CLIENTPOOL_MUST_WAIT && byte() % 4 != 3) {
      int n;
      for (n = 0; n < NAMES; n++)
        if (H.name_mk[n] >= 0 && H.mk_ek[H.name_mk[n]] == g.key) { op_acquire(n); break; }
    }
    return;
  }
  begin("release");
  t = t_call();
  if (H.untimed && (erc = clientpool_release_untimed(H.p, x.l, x.gen, reason)) != CLIENTPOOL_UNTIMED) {
    H.m.stale = 1;
    t = NAN;                               /* the engine's latest time */
  } else {
    erc = clientpool_release(H.p, x.l, x.gen, reason, t);
  }
  mrc = model_release(&H.m, x.ml, x.mgen, reason, t);
  trace("release lease %d/%u (model %d) reason %d -> %d/%d", x.l, (unsigned)x.gen, x.ml, reason, erc, mrc);
  EXPECT_EQ(erc, 0);
  EXPECT_EQ(mrc, 0);
  dead_lease(x.l, x.gen, x.ml, x.mgen);
  if (c % 32 == 31) destroy_unread();
  step_end();
}

/* claim (mode 0) or cancel (mode 1) a waiter */
static void op_claim(int b, int mode) {
  h_waiter x;
  clientpool_grant_t g;
  m_grant_t mg;
  int i = H.nw ? b % H.nw : 0, st = CLIENTPOOL_CANCELLED;
  double t;
  if (!H.nw) return;
  x = H.W[i];
  if (mode == 1) st = (b >> 4) % 3 == 0 ? 999 : (b >> 4) % 3 == 1 ? CLIENTPOOL_TIMEOUT : CLIENTPOOL_CANCELLED;
  begin(mode ? "cancel" : "claim");
  t = t_call();
  if (mode == 0) {
    clientpool_claim(H.p, x.w, x.gen, t, &g);
    model_claim(&H.m, x.mw, x.mgen, t, &mg);
  } else {
    H.W[i].queued = 0;
    clientpool_cancel(H.p, x.w, x.gen, st, t, &g);
    model_cancel(&H.m, x.mw, x.mgen, st, t, &mg);
  }
  trace("%s waiter %d/%u (model %d) -> %d/%d", H.op, x.w, (unsigned)x.gen, x.mw, g.status, mg.status);
  EXPECT_EQ(g.status, mg.status);
  if (g.status == CLIENTPOOL_PENDING) { step_end(); return; }
  compare_grant(&g, &mg);
  EXPECT_DEQ(g.waited, mg.waited);
  if (g.status == CLIENTPOOL_GRANT_IDLE || g.status == CLIENTPOOL_GRANT_CREATE) {
    if (map_get(H.er, g.record) != mg.record) fz_fail("claimed record %d is not the model's %d", g.record, mg.record);
    if (lease_model(g.lease, g.lease_gen) != mg.lease) fz_fail("claimed lease is not the model's");
  }
  H.W[i] = H.W[--H.nw];
  dead_waiter(x.w, x.gen, x.mw, x.mgen);
  step_end();
  if (g.status == CLIENTPOOL_GRANT_IDLE || g.status == CLIENTPOOL_GRANT_CREATE) take_grant(&g, &mg);
}

static void op_abandon(int b) {
  h_waiter x;
  int i = H.nw ? b % H.nw : 0;
  double t;
  if (!H.nw) return;
  x = H.W[i];
  H.W[i] = H.W[--H.nw];
  begin("abandon");
  t = t_call();
  EXPECT_EQ(clientpool_abandon(H.p, x.w, x.gen, t), model_abandon(&H.m, x.mw, x.mgen, t));
  trace("abandon waiter %d/%u (model %d)", x.w, (unsigned)x.gen, x.mw);
  dead_waiter(x.w, x.gen, x.mw, x.mgen);
  step_end();
}

static void op_leak(int b) {
  double t;
  if ((b & 1) && H.nr) {                    /* a reservation whose creator died */
    int i = (b >> 1) % H.nr;
    h_res x = H.R[i];
    if (x.refill) return;
    H.R[i] = H.R[--H.nr];
    begin("leak(reservation)");
    t = t_call();
    EXPECT_EQ(clientpool_leak(H.p, x.l, x.gen, t), model_leak(&H.m, x.ml, x.mgen, t));
    dead_lease(x.l, x.gen, x.ml, x.mgen);
    step_end();
  } else if (H.nl) {
    int i = (b >> 1) % H.nl;
    h_lease x = H.L[i];
    H.L[i] = H.L[--H.nl];
    begin("leak");
    t = t_call();
    EXPECT_EQ(clientpool_leak(H.p, x.l, x.gen, t), model_leak(&H.m, x.ml, x.mgen, t));
    dead_lease(x.l, x.gen, x.ml, x.mgen);
    step_end();
  }
}

/* The driver reports a destroy done (its hook returned or failed). */
static void op_destroyed(int b) {
  h_closing x;
  double t;
  if ((b & 128) || !H.nd) {                 /* a record that is not closing: STALE */
    int32_t e = (int32_t)((b & 127) % (span() + 1)) - 1;
    int mr = map_get(H.er, e);
    if (e >= 0 && wb_rec_state(H.p, e) == WB_CLOSING) return;
    begin("destroyed(stale)");
    t = t_call();
    EXPECT_EQ(clientpool_destroyed(H.p, e, t), CLIENTPOOL_STALE);
    EXPECT_EQ(model_destroyed(&H.m, mr, t), CLIENTPOOL_STALE);   /* (mr -1: none; the clock moves) */
    step_end();
    return;
  }
  x = H.D[b % H.nd];
  H.D[b % H.nd] = H.D[--H.nd];
  begin("destroyed");
  t = t_call();
  trace("destroyed record %d (model %d)", x.r, x.mr);
  EXPECT_EQ(clientpool_destroyed(H.p, x.r, t), 0);
  EXPECT_EQ(model_destroyed(&H.m, x.mr, t), 0);
  step_end();
}

/* A driver whose destroy hook returns at once, before it reads the event:
 * every closing record whose EV_DESTROY is still queued is reported done
 * within the step that destroyed it. */
static void destroy_unread(void) {
  int32_t c[EMAP];
  int32_t n = wb_closing(H.p, c, EMAP), i;
  int j;
  for (i = 0; i < n && i < EMAP; i++) {
    int known = 0, mr;
    for (j = 0; j < H.nd; j++) if (H.D[j].r == c[i]) known = 1;
    if (known) continue;
    mr = map_get(H.er, c[i]);
    if (mr < 0) fz_fail("closing engine record %d is unknown to the harness", c[i]);
    trace("destroyed (unread) record %d (model %d)", c[i], mr);
    EXPECT_EQ(clientpool_destroyed(H.p, c[i], H.now), 0);
    EXPECT_EQ(model_destroyed(&H.m, mr, H.now), 0);
  }
}

/* Remembers the counts before a cap may be lowered (see hi_live). */
static void hold_counts(void) {
  clientpool_stats_t s;
  int mk;
  clientpool_stats(H.p, -1, &s);
  H.hi_live = s.live + s.creating + s.closing;
  H.hi_leases = s.leases;
  H.hi_waiting = s.waiting;
  for (mk = 0; mk < M_MAXKEY; mk++)
    if (H.m.keys[mk].used && clientpool_stats(H.p, H.mk_ek[mk], &s) == 0)
      H.hi_key[mk] = s.live + s.creating + s.closing;
}

/* configure: a new config made from the current one, valid or not */
static void op_configure(int b) {
  clientpool_config_t c = H.cfg;
  int v = byte(), w = byte(), erc, mrc;
  double t;
  switch (b % 12) {
  case 0: c.max_live = 1 + v % 6; if (c.max_idle > c.max_live) c.max_idle = c.max_live;
          if (c.min_idle > c.max_idle) c.min_idle = c.max_idle;
          if (c.key_max_live > c.max_live) c.key_max_live = c.max_live;
          if (c.key_max_idle > c.max_idle) c.key_max_idle = c.max_idle; break;
  case 1: c.max_idle = v % (c.max_live + 1); if (c.min_idle > c.max_idle) c.min_idle = c.max_idle;
          if (c.key_max_idle > c.max_idle) c.key_max_idle = c.max_idle; break;
  case 2: c.min_idle = v % (c.max_idle + 1); break;
  case 3: c.max_concurrency = 1 + v % (c.max_live * c.capacity + 2); break;
  case 4: c.max_waiting = v % 7; break;
  case 5: c.key_max_live = v % 2 ? -1 : 1 + (v / 2) % c.max_live;
          c.key_max_idle = w % 3 ? -1 : (w / 3) % (c.max_idle + 1); break;
  case 6: c.idle_timeout = v % 3 == 0 ? -1 : (1 + (v / 3) % 32) * 0.25;
          c.validate_after_idle = w % 2 ? -1 : ((w / 2) % 16) * 0.25; break;
  case 7: c.max_lifetime = v % 3 == 0 ? -1 : (1 + (v / 3) % 64) * 0.25;
          c.lifetime_jitter = w % 2 ? 0 : ((w / 2) % 8) / 16.0; break;
  case 8: c.leak_threshold = v % 3 == 0 ? -1 : (1 + (v / 3) % 32) * 0.25; c.pause_fail = w % 4 == 0;
          c.keepalive = w % 3 == 0 ? -1 : (w / 3) % 5 == 0 ? 0 : (1 + (w / 3) % 16) * 0.25; break;
  case 9: if (v % 3 == 0) c.create_backoff = c.create_backoff_max = -1;
          else { c.create_backoff = (1 + (v / 3) % 8) * 0.125; c.create_backoff_max = c.create_backoff * (1 << (w % 4)); }
          c.max_keys = w % 3 ? c.max_keys : 1 + (w / 3) % NAMES; break;
  case 10: c.max_live = 1 + v % 6; c.max_idle = 1 + w % 6;   /* may break the envelope */
           c.min_idle = (v * w) % 3; break;
  default:                                  /* what cannot change */
    if (v % 2) c.capacity = c.capacity % 3 + 1; else c.seed ^= 1 + (uint64_t)w;
  }
  begin("configure");
  hold_counts();
  t = t_call();
  erc = clientpool_configure(H.p, &c, t);
  mrc = model_configure(&H.m, &c, t);
  trace("configure (change %d) -> %d/%d: max_live %d max_idle %d min_idle %d key_max_live %d", b % 12, erc,
        mrc, c.max_live, c.max_idle, c.min_idle, c.key_max_live);
  EXPECT_EQ(erc, mrc);
  if (erc == 0) H.cfg = c;
  step_end();
}

/* key_caps: a key's own caps (some out of range) */
static void op_key_caps(int b) {
  int name = b % NAMES, mk = H.name_mk[name], ml, mi;
  int v = byte();
  double t;
  if (mk < 0) return;
  ml = v % 4 == 0 ? -1 : (v / 4) % (H.cfg.max_live + 2);
  mi = (v / 16) % 3 == 0 ? -1 : (b / NAMES) % (H.cfg.max_idle + 2);
  begin("key_caps");
  hold_counts();
  t = t_call();
  trace("key_caps key %d max_live %d max_idle %d", mk, ml, mi);
  EXPECT_EQ(clientpool_key_caps(H.p, H.mk_ek[mk], ml, mi, t), model_key_caps(&H.m, mk, ml, mi, t));
  step_end();
}

/* The driver reports a keepalive validate: good or not, or (b & 64) one of
 * a record that is not out (STALE). */
static void op_keepalive_done(int b) {
  h_closing x;
  int ok = (b & 3) != 0;
  double t;
  if ((b & 64) || !H.nka) {
    int32_t e = (int32_t)((b & 63) % (span() + 1)) - 1;
    if (e >= 0 && wb_rec_state(H.p, e) == WB_CHECKING) return;
    begin("keepalive_done(stale)");
    t = t_call();
    EXPECT_EQ(clientpool_keepalive_done(H.p, e, ok, t), CLIENTPOOL_STALE);
    EXPECT_EQ(model_keepalive_done(&H.m, map_get(H.er, e), ok, t), CLIENTPOOL_STALE);
    step_end();
    return;
  }
  x = H.KA[(b >> 2) % H.nka];
  H.KA[(b >> 2) % H.nka] = H.KA[--H.nka];
  begin(ok ? "keepalive_done(ok)" : "keepalive_done(bad)");
  t = t_call();
  trace("keepalive_done record %d (model %d) ok %d", x.r, x.mr, ok);
  EXPECT_EQ(clientpool_keepalive_done(H.p, x.r, ok, t), 0);
  EXPECT_EQ(model_keepalive_done(&H.m, x.mr, ok, t), 0);
  step_end();
}

static void op_tick(int b) {
  double t;
  H.now += (double)(b % 64) * 0.125;
  begin("tick");
  t = t_call();
  trace("tick");
  clientpool_tick(H.p, t);
  model_tick(&H.m, t);
  step_end();
}

static void op_close(void) {
  double t;
  begin("close");
  t = t_call();
  trace("close");
  clientpool_close(H.p, t);
  model_close(&H.m, t);
  step_end();
}

/* the engine and model key of a target byte: the pool (-1), a name's key,
 * or a key that does not exist */
static void target_of(int b, int32_t *ek, int *mk) {
  int name = b % (NAMES + 1) - 1;
  if (name < 0) { *ek = -1; *mk = -1; return; }
  if (H.name_mk[name] < 0) { *ek = 999; *mk = 999; return; }
  *mk = H.name_mk[name];
  *ek = H.mk_ek[*mk];
}

static void op_gate(int b, int resume) {
  int32_t ek;
  int mk, probe = (b >> 4) & 1;
  double t;
  target_of(b, &ek, &mk);
  begin(resume ? "resume" : "pause");
  t = t_call();
  trace("%s %d probe %d", H.op, mk, probe);
  if (resume) EXPECT_EQ(clientpool_resume(H.p, ek, probe, t), model_resume(&H.m, mk, probe, t));
  else EXPECT_EQ(clientpool_pause(H.p, ek, t), model_pause(&H.m, mk, t));
  step_end();
}

static void op_probe_ok(int b) {
  double t;
  begin("probe_ok");
  t = t_call();
  if ((b & 3) == 0 && H.ndl) {               /* a lease that ended */
    h_dead *d = &H.deadl[(b >> 2) % (H.ndl < DEAD ? H.ndl : DEAD)];
    EXPECT_EQ(clientpool_probe_ok(H.p, d->e, d->egen, t), model_probe_ok(&H.m, d->m, d->mgen, t));
  } else if (H.nl) {
    h_lease *x = &H.L[(b >> 2) % H.nl];
    EXPECT_EQ(clientpool_probe_ok(H.p, x->l, x->gen, t), model_probe_ok(&H.m, x->ml, x->mgen, t));
  }
  step_end();
}

static void op_retire(int b) {
  int32_t cand[EMAP], e;
  int n = 0;
  double t;
  for (e = 0; e < span(); e++) if (H.er[e].valid) cand[n++] = e;
  if (!n) return;
  e = cand[(b >> 1) % n];
  begin(b & 1 ? "retire_upto" : "retire");
  t = t_call();
  if (b & 1) {           /* the record and every older one of its key */
    trace("retire_upto record %d (model %d)", e, H.er[e].m);
    EXPECT_EQ(clientpool_retire_upto(H.p, e, t), model_retire_upto(&H.m, H.er[e].m, t));
  } else {
    trace("retire record %d (model %d)", e, H.er[e].m);
    EXPECT_EQ(clientpool_retire(H.p, e, t), model_retire(&H.m, H.er[e].m, t));
  }
  step_end();
}

static void op_retire_before(int b) {
  int32_t ek;
  int mk;
  double before = (b >> 3) & 1 ? -1 : H.now - (double)((b >> 4) % 8) * 0.5, t;
  target_of(b & 7, &ek, &mk);
  begin("retire_before");
  t = t_call();
  trace("retire_before key %d before %g", mk, before);
  EXPECT_EQ(clientpool_retire_before(H.p, ek, before, t), model_retire_before(&H.m, mk, before, t));
  step_end();
}

static void op_keys(int b) {
  int name = b % NAMES, act = (b / NAMES) % 5, mk = H.name_mk[name];
  int32_t ek;
  if (mk < 0) return;
  ek = H.mk_ek[mk];
  if (act < 4) {
    int pin = act == 3 ? 7 : act;            /* 7: out of range, means 1 */
    begin("key_pin");
    trace("key_pin key %d %d", mk, pin);
    if (pin == 2) H.floor_used = 1;
    EXPECT_EQ(clientpool_key_pin(H.p, ek, pin), model_key_pin(&H.m, mk, pin));
  } else {
    begin("key_forget");
    trace("key_forget key %d", mk);
    EXPECT_EQ(clientpool_key_forget(H.p, ek), model_key_forget(&H.m, mk));
  }
  step_end();
}

static void op_floor(int b) {
  double t;
  begin("floor");
  t = t_call();
  trace("floor %d", b & 1);
  clientpool_floor(H.p, b & 1, t);
  model_floor(&H.m, b & 1, t);
  step_end();
}

static void op_refill(void) {
  int32_t er, ek = -1;
  int mr, mk = -1;
  double t;
  if (H.nr >= MAXH) return;
  begin("refill");
  t = t_call();
  er = clientpool_refill(H.p, t, &ek);
  H.refill_ek = ek;
  mr = model_refill(&H.m, t, &mk);
  trace("refill -> engine %d key %d, model %d key %d", er, ek, mr, mk);
  if (er < 0 || mr < 0) {
    EXPECT_EQ(er, mr);
    step_end();
    return;
  }
  EXPECT_EQ(map_get(H.ek, ek), mk);
  H.new_er = er;
  H.new_mr = mr;
  step_end();
  hold_res(er, -1, 0, mr, -1, 0, 1);
}

static void op_stale(int b) {
  clientpool_grant_t g;
  m_grant_t mg;
  double t;
  if ((b & 1) && H.ndl) {
    h_dead *d = &H.deadl[(b >> 2) % (H.ndl < DEAD ? H.ndl : DEAD)];
    begin("stale lease");
    t = t_call();
    if (b & 2) EXPECT_EQ(clientpool_leak(H.p, d->e, d->egen, t), model_leak(&H.m, d->m, d->mgen, t));
    else EXPECT_EQ(clientpool_release(H.p, d->e, d->egen, -1, t), model_release(&H.m, d->m, d->mgen, -1, t));
    step_end();
  } else if (H.ndw) {
    h_dead *d = &H.deadw[(b >> 2) % (H.ndw < DEAD ? H.ndw : DEAD)];
    begin("stale waiter");
    t = t_call();
    switch ((b >> 1) % 3) {
    case 0:
      clientpool_claim(H.p, d->e, d->egen, t, &g);
      model_claim(&H.m, d->m, d->mgen, t, &mg);
      EXPECT_EQ(g.status, mg.status);
      EXPECT_EQ(g.status, CLIENTPOOL_STALE);
      break;
    case 1:
      clientpool_cancel(H.p, d->e, d->egen, CLIENTPOOL_CANCELLED, t, &g);
      model_cancel(&H.m, d->m, d->mgen, CLIENTPOOL_CANCELLED, t, &mg);
      EXPECT_EQ(g.status, mg.status);
      EXPECT_EQ(g.status, CLIENTPOOL_STALE);
      break;
    default:
      EXPECT_EQ(clientpool_abandon(H.p, d->e, d->egen, t), model_abandon(&H.m, d->m, d->mgen, t));
    }
    step_end();
  }
}

enum { OP_ACQUIRE, OP_ACQUIRE2, OP_ACQUIRE3, OP_WAIT, OP_CREATED, OP_CREATED2, OP_RELEASE,
       OP_RELEASE2, OP_RELEASE3, OP_CLAIM, OP_CLAIM2, OP_CANCEL, OP_ABANDON, OP_LEAK, OP_TICK,
       OP_TICK2, OP_ADVANCE, OP_CLOSE, OP_PAUSE, OP_RESUME, OP_PROBE_OK, OP_RETIRE,
       OP_RETIRE_BEFORE, OP_KEYS, OP_FLOOR, OP_REFILL, OP_STALE, OP_SKEW, OP_DESTROYED,
       OP_DESTROYED2, OP_CONFIGURE, OP_KEY_CAPS, OP_KEEPALIVE_DONE, OP_COUNT };

/* ---- a run ------------------------------------------------------------ */

static void decode_config(clientpool_config_t *c) {
  int b;
  memset(c, 0, sizeof *c);
  c->max_live = 1 + byte() % 6;
  b = byte(); c->capacity = b % 4 == 3 ? 2 + (b / 4) % 2 : 1;
  c->max_concurrency = 1 + byte() % (c->max_live * c->capacity + 2);
  b = byte(); c->max_idle = b % 3 ? c->max_live : (b / 3) % (c->max_live + 1);
  c->min_idle = byte() % (c->max_idle + 1);
  c->max_waiting = byte() % 7;
  b = byte(); c->key_max_live = b % 2 ? -1 : 1 + (b / 2) % c->max_live;
  b = byte(); c->key_max_idle = b % 3 ? -1 : (b / 3) % (c->max_idle + 1);
  b = byte(); c->max_keys = b % 3 ? -1 : 1 + (b / 3) % NAMES;
  c->pause_fail = byte() % 4 == 0;
  b = byte(); c->idle_timeout = b % 3 == 0 ? -1 : (1 + (b / 3) % 32) * 0.25;
  b = byte(); c->max_lifetime = b % 3 == 0 ? -1 : (1 + (b / 3) % 64) * 0.25;
  b = byte(); c->lifetime_jitter = b % 2 ? 0 : ((b / 2) % 8) / 16.0;
  b = byte(); c->validate_after_idle = b % 2 ? -1 : ((b / 2) % 16) * 0.25;
  b = byte(); c->leak_threshold = b % 3 ? -1 : (1 + (b / 3) % 32) * 0.25;
  c->seed = (uint64_t)byte();
  b = byte();
  c->keepalive = b % 2 ? -1 : (1 + (b / 2) % 16) * 0.25;
  b = byte();
  if (b % 3 == 0) c->create_backoff = c->create_backoff_max = -1;
  else {
    c->create_backoff = (1 + (b / 3) % 8) * 0.125;
    c->create_backoff_max = c->create_backoff * (1 << ((b / 24) % 4));
  }
}

/* Closes the pool, settles every waiter, reservation and lease, and checks
 * that nothing is left: no record, lease, waiter or key. */
static void settle(void) {
  clientpool_stats_t s;
  int i = 0;
  H.now += 1;
  op_close();
  /* close unpins every key; one pinned again after close stays until unpinned */
  for (i = 0; i < M_MAXKEY; i++)
    if (H.m.keys[i].used && H.m.keys[i].pinned) {
      begin("key_pin");
      EXPECT_EQ(clientpool_key_pin(H.p, H.mk_ek[i], 0), model_key_pin(&H.m, i, 0));
      step_end();
    }
  while (H.nw) {
    int before = H.nw;
    op_claim(0, 0);
    if (H.nw == before) fz_fail("a waiter is still queued after close");
  }
  while (H.nr) op_created(H.nr % 2 ? 1 : 0);   /* alternately ok and failed */
  while (H.nl) op_release(0, 0);
  while (H.nka) op_keepalive_done(1);
  while (H.nd) op_destroyed(0);
  clientpool_stats(H.p, -1, &s);
  if (s.live || s.idle || s.active || s.leases || s.creating || s.waiting || s.closing)
    fz_fail("after settling: live %d idle %d active %d leases %d creating %d waiting %d closing %d",
            s.live, s.idle, s.active, s.leases, s.creating, s.waiting, s.closing);
  if (wb_keys_used(H.p) != 0) wb_dump_keys(H.p);
  if (wb_keys_used(H.p) != 0) fz_fail("after settling: %d keys left", wb_keys_used(H.p));
  for (i = 0; i < M_MAXKEY; i++) if (H.m.keys[i].used) fz_fail("after settling: model key %d left", i);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int i;
  /* two engines on one fleet, against the fleet's accounting model */
  if (size > 0 && data[0] == FUZZ_FLEET_MARK) return fuzz_fleet_run(data + 1, size - 1);
  memset(&H, 0, sizeof H);
  H.in = data;
  H.n = size;
  H.trace = getenv("FUZZ_TRACE") != NULL;
  H.new_er = FZ_NONE;
  H.cur_ew = FZ_NONE;
  for (i = 0; i < NAMES; i++) H.name_mk[i] = FZ_NONE;
  decode_config(&H.cfg);
  if (clientpool_new(&H.cfg, &H.p) != CLIENTPOOL_OK) fz_fail("clientpool_new refused the config");
  /* the engine's fast path on odd seeds, off on even ones: both paths
   * against the model, on the same inputs otherwise */
  wb_fast_path(H.p, (int)(H.cfg.seed & 1));
  /* issue 17: the untimed calls first, as the bindings make them, on half
   * the seeds; the model then runs at its latest time (NaN: clamped) */
  H.untimed = (H.cfg.seed & 2) != 0;
  model_init(&H.m, &H.cfg, oracle, NULL);
  H.now = 1;
  while (!at_end() && H.step < MAXSTEPS) {
    int op = byte() % OP_COUNT, b = byte();
    switch (op) {
    case OP_ACQUIRE: case OP_ACQUIRE2: case OP_ACQUIRE3: op_acquire(b); break;
    case OP_WAIT: {
      int mk = key_of(b % NAMES);
      if (mk >= 0) op_wait(mk, b / NAMES);
      break;
    }
    case OP_CREATED: case OP_CREATED2: op_created(b); break;
    case OP_RELEASE: case OP_RELEASE2: case OP_RELEASE3: op_release(b, b >> 3); break;
    case OP_CLAIM: case OP_CLAIM2: op_claim(b, 0); break;
    case OP_CANCEL: op_claim(b, 1); break;
    case OP_ABANDON: op_abandon(b); break;
    case OP_LEAK: op_leak(b); break;
    case OP_TICK: case OP_TICK2: op_tick(b); break;
    case OP_ADVANCE: H.now += (double)(b % 16) * 0.25; break;
    case OP_CLOSE: if (b % 8 == 0) op_close(); break;
    case OP_PAUSE: op_gate(b, 0); break;
    case OP_RESUME: op_gate(b, 1); break;
    case OP_PROBE_OK: op_probe_ok(b); break;
    case OP_RETIRE: op_retire(b); break;
    case OP_RETIRE_BEFORE: op_retire_before(b); break;
    case OP_KEYS: op_keys(b); break;
    case OP_FLOOR: H.floor_used = 1; op_floor(b); break;
    case OP_REFILL: op_refill(); break;
    case OP_STALE: op_stale(b); break;
    case OP_SKEW: H.skew = 1 + b % 2; break;
    case OP_DESTROYED: case OP_DESTROYED2: op_destroyed(b); break;
    case OP_CONFIGURE: op_configure(b); break;
    case OP_KEY_CAPS: op_key_caps(b); break;
    case OP_KEEPALIVE_DONE: op_keepalive_done(b); break;
    }
  }
  H.skew = 0;
  settle();
  clientpool_free(H.p);
  return 0;
}
