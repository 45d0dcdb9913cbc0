/*
 * fuzz_fleet.c - the fuzz harness's fleet mode (spec/c/fuzz_engine.c hands
 * it every input whose first byte is FUZZ_FLEET_MARK): two engines on one
 * fleet (a real shared segment, two member rows of this process), driven
 * as lua/clientpool/fleetlink.lua drives them, against the fleet's
 * accounting model (spec/c/model.c, model_fleet_*).
 *
 * The single-engine model of fuzz_engine.c does not apply here: the
 * fleet's refusals depend on the other engine.  What is checked instead,
 * after every step: clientpool_check of both engines; the model's count of
 * physical clients per member and key (kept from the grants and reports
 * alone) against each engine's; every member share against what its
 * engine holds, the fleet's aggregates against the sums of the shares, and
 * no fleet cap exceeded (model_fleet_check).  At the end both engines are
 * closed and settled: every count of the fleet is back to zero.
 *
 * Input (after the mark): 8 config bytes (the fleet's max_live 1..6,
 * max_idle, min_idle 0..2, max_concurrency or none, per-key caps or none;
 * each engine's own max_live, max_idle, capacity, max_waiting, idle_timeout),
 * then steps of an opcode byte and an argument byte, whose low bit picks
 * the engine.  Three key names, the same on both.  The segment is unlinked
 * as soon as it is made, so nothing is left in /dev/shm, whatever happens.
 */
#include "clientpool.h"
#include "engine.h"
#include "fleet.h"
#include "model.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int fuzz_fleet_run(const uint8_t *data, size_t size);

#define M 2                        /* engines (members) */
#define NK MF_KEYS                 /* key names */
#define FH 24                      /* handles of each kind the harness holds per engine */
#define STEPS 800
#define NONE_CAP (1 << 30)

typedef struct { int32_t l; uint32_t gen; } f_lease;
typedef struct { int32_t r; int32_t l; uint32_t gen; int k; int refill; } f_res;
typedef struct { int32_t w; uint32_t gen; } f_wait;
typedef struct { int32_t r; int k; } f_closing;

typedef struct {
  clientpool_t *p;
  clientpool_fleet_t *h;
  clientpool_config_t cfg;
  int use_leases;
  int32_t ek[NK];                  /* name -> engine key (-1: not open) */
  int32_t kname[64];               /* engine key -> name (-1) */
  int32_t slot[NK];                /* name -> fleet slot this member opened (-1) */
  f_lease L[FH]; int nl;
  f_res R[FH]; int nr;
  f_wait W[FH]; int nw;
  f_closing D[256]; int nd;
} f_eng;

static struct {
  const uint8_t *in;
  size_t n, pos;
  int trace;
  long step;
  const char *op;
  double now;
  char name[64];
  clientpool_fleet_t *obs;         /* a third handle, not a member: reads the aggregates */
  clientpool_fleet_limits_t lim;
  model_fleet_t mf;
  f_eng E[M];
} F;

static void ff_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void ff_fail(const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "\nfuzz_fleet: step %ld (%s): ", F.step, F.op ? F.op : "-");
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n  fleet: max_live %d max_idle %d min_idle %d max_concurrency %d key_max_live %d "
          "key_max_idle %d\n", F.lim.max_live, F.lim.max_idle, F.lim.min_idle, F.lim.max_concurrency,
          F.lim.key_max_live, F.lim.key_max_idle);
  for (int m = 0; m < M; m++)
    fprintf(stderr, "  engine %d: max_live %d max_idle %d min_idle %d capacity %d max_waiting %d idle_timeout %g "
            "leases %d\n", m, F.E[m].cfg.max_live, F.E[m].cfg.max_idle, F.E[m].cfg.min_idle, F.E[m].cfg.capacity,
            F.E[m].cfg.max_waiting, F.E[m].cfg.idle_timeout, F.E[m].use_leases);
  abort();
}

static void trace(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void trace(const char *fmt, ...) {
  va_list ap;
  if (!F.trace) return;
  fprintf(stderr, "[fleet %ld t=%g] ", F.step, F.now);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}

static int byte(void) { return F.pos < F.n ? F.in[F.pos++] : 0; }

static const char *const KNAMES[NK] = { "k0", "k1", "k2" };

/* ---- keys --------------------------------------------------------------- */

/* Engine m's key of name k, opened (and given its fleet slot) if need be;
 * -1 when the engine refuses (closed). */
static int32_t key_of(int m, int k) {
  f_eng *e = &F.E[m];
  int32_t ek, slot;
  if (e->ek[k] >= 0) return e->ek[k];
  ek = clientpool_key_open(e->p);
  if (ek < 0) return -1;
  if (ek >= 64) ff_fail("engine key %d beyond the harness's map", ek);
  if (e->slot[k] < 0) {
    slot = clientpool_fleet_key_open(e->h, KNAMES[k], strlen(KNAMES[k]));
    if (slot < 0) ff_fail("clientpool_fleet_key_open(%s) = %d", KNAMES[k], slot);
    e->slot[k] = slot;
  }
  if (clientpool_key_fleet(e->p, ek, e->slot[k]) != 0) ff_fail("clientpool_key_fleet refused a new key");
  e->ek[k] = ek;
  e->kname[ek] = k;
  return ek;
}

static int name_of(int m, int32_t ek) {
  if (ek < 0 || ek >= 64 || F.E[m].kname[ek] < 0) ff_fail("engine %d key %d is not one the harness opened", m, ek);
  return F.E[m].kname[ek];
}

/* ---- the driver's side of the fleet ------------------------------------ */

/* Posts what the engine's waiters wait for (fleetlink.lua's post). */
static void post(int m) {
  f_eng *e = &F.E[m];
  int k;
  clientpool_fleet_demand(e->h, CLIENTPOOL_FLEET_LIVE, -1, clientpool_blocked(e->p, CLIENTPOOL_FLEET_LIVE, -1));
  if (e->use_leases)
    clientpool_fleet_demand(e->h, CLIENTPOOL_FLEET_LEASE, -1, clientpool_blocked(e->p, CLIENTPOOL_FLEET_LEASE, -1));
  for (k = 0; k < NK; k++)
    if (e->ek[k] >= 0 && e->slot[k] >= 0)
      clientpool_fleet_demand(e->h, CLIENTPOOL_FLEET_LIVE, e->slot[k], clientpool_blocked(e->p, CLIENTPOOL_FLEET_LIVE, e->ek[k]));
}

/* Mirrors the fleet's gates into engine m. */
static void gates(int m) {
  f_eng *e = &F.E[m];
  int k;
  clientpool_gate_fleet(e->p, -1, clientpool_fleet_gate(e->h, -1, NULL, 0, NULL) == 1, F.now);
  for (k = 0; k < NK; k++)
    if (e->ek[k] >= 0 && e->slot[k] >= 0)
      clientpool_gate_fleet(e->p, e->ek[k], clientpool_fleet_gate(e->h, e->slot[k], NULL, 0, NULL) == 1, F.now);
}

static void hold_grant(int m, const clientpool_grant_t *g) {
  f_eng *e = &F.E[m];
  int k;
  if (g->status != CLIENTPOOL_GRANT_IDLE && g->status != CLIENTPOOL_GRANT_CREATE) return;
  k = name_of(m, g->key);
  if (g->status == CLIENTPOOL_GRANT_IDLE) {
    if (e->nl == FH) { clientpool_release(e->p, g->lease, g->lease_gen, -1, F.now); return; }
    e->L[e->nl].l = g->lease; e->L[e->nl].gen = g->lease_gen; e->nl++;
  } else if (g->status == CLIENTPOOL_GRANT_CREATE) {
    model_fleet_reserve(&F.mf, m, k, 0);
    if (e->nr == FH) {
      clientpool_created(e->p, g->record, 0, F.now);
      model_fleet_created(&F.mf, m, k, 0, 0);
      return;
    }
    e->R[e->nr].r = g->record; e->R[e->nr].l = g->lease; e->R[e->nr].gen = g->lease_gen;
    e->R[e->nr].k = k; e->R[e->nr].refill = 0; e->nr++;
  }
}

/* Drains engine m's events as the driver does; loops until both queues
 * are empty (an event's handling may queue more). */
static void drain(void) {
  int busy = 1;
  while (busy) {
    busy = 0;
    for (int m = 0; m < M; m++) {
      f_eng *e = &F.E[m];
      clientpool_event_t ev;
      while (clientpool_next_event(e->p, &ev) != CLIENTPOOL_EV_NONE) {
        busy = 1;
        switch (ev.type) {
        case CLIENTPOOL_EV_WAKE: {
          clientpool_grant_t g;
          int i;
          for (i = 0; i < e->nw; i++) if (e->W[i].w == ev.a && e->W[i].gen == (uint32_t)ev.b) break;
          if (i == e->nw) ff_fail("engine %d: EV_WAKE of waiter %d/%d the harness does not hold", m, ev.a, ev.b);
          e->W[i] = e->W[--e->nw];
          memset(&g, 0, sizeof g);
          clientpool_claim(e->p, ev.a, (uint32_t)ev.b, F.now, &g);
          trace("engine %d: wake %d -> %d", m, ev.a, g.status);
          hold_grant(m, &g);
          break;
        }
        case CLIENTPOOL_EV_DESTROY:
          if (e->nd == 256) ff_fail("harness: too many closing records");
          e->D[e->nd].r = ev.a; e->D[e->nd].k = name_of(m, ev.c); e->nd++;
          break;
        case CLIENTPOOL_EV_KEY_FREE: {
          int k = name_of(m, ev.a);
          e->kname[ev.a] = -1;
          e->ek[k] = -1;
          if (e->slot[k] >= 0) {
            clientpool_fleet_demand(e->h, CLIENTPOOL_FLEET_LIVE, e->slot[k], 0);
            if (clientpool_fleet_key_close(e->h, e->slot[k]) != 0)
              ff_fail("engine %d: the fleet key %s would not close once the engine forgot it", m, KNAMES[k]);
            e->slot[k] = -1;
          }
          break;
        }
        case CLIENTPOOL_EV_BLOCKED: post(m); break;
        case CLIENTPOOL_EV_GATES: gates(m); break;
        default: break;            /* TIMER, CREATED, REFILL, LOST, LEAK, KEEPALIVE: nothing to do here */
        }
      }
    }
  }
}

/* ---- checks ------------------------------------------------------------ */

static void check(void) {
  mf_view_t v;
  char buf[512];
  int m, k, kind;
  memset(&v, 0, sizeof v);
  for (m = 0; m < M; m++) {
    f_eng *e = &F.E[m];
    buf[0] = 0;
    if (clientpool_check(e->p, buf, sizeof buf) != 0) ff_fail("engine %d: clientpool_check: %s", m, buf);
    v.leases_taken[m] = e->use_leases;
    clientpool_stats(e->p, -1, &v.pool[m]);
    for (kind = 0; kind < 4; kind++) v.held[m][kind] = clientpool_fleet_held(e->h, kind, -1);
    for (k = 0; k < NK; k++) {
      if (e->ek[k] >= 0) clientpool_stats(e->p, e->ek[k], &v.key[m][k]);
      if (e->slot[k] >= 0)
        for (kind = 0; kind < 4; kind++) v.kheld[m][k][kind] = clientpool_fleet_held(e->h, kind, e->slot[k]);
    }
  }
  for (kind = 0; kind < 4; kind++) v.total[kind] = clientpool_fleet_count(F.obs, kind, -1);
  for (k = 0; k < NK; k++) {
    int32_t slot = clientpool_fleet_key_find(F.obs, KNAMES[k], strlen(KNAMES[k]));
    if (slot < 0) continue;
    for (kind = 0; kind < 4; kind++) if (kind != CLIENTPOOL_FLEET_LEASE) v.ktotal[k][kind] = clientpool_fleet_count(F.obs, kind, slot);
  }
  if (model_fleet_check(&F.mf, &v, buf, sizeof buf) != 0) ff_fail("%s", buf);
}

/* ---- steps ------------------------------------------------------------- */

static void op_acquire(int m, int b) {
  f_eng *e = &F.E[m];
  clientpool_grant_t g;
  int k = (b >> 1) % NK;
  int32_t ek = key_of(m, k);
  if (ek < 0) return;
  memset(&g, 0, sizeof g);
  clientpool_acquire(e->p, ek, F.now, &g);
  trace("engine %d: acquire %s -> %d", m, KNAMES[k], g.status);
  if (g.status == CLIENTPOOL_MUST_WAIT && e->nw < FH && (b & 8) == 0) {
    uint32_t gen;
    double deadline = (b & 16) ? -1 : F.now + 0.5 * (double)((b >> 5) + 1);
    int32_t w = clientpool_wait(e->p, ek, deadline, F.now, &gen);
    if (w >= 0) { e->W[e->nw].w = w; e->W[e->nw].gen = gen; e->nw++; return; }
  }
  if (g.status == CLIENTPOOL_GRANT_IDLE || g.status == CLIENTPOOL_GRANT_CREATE) hold_grant(m, &g);
  else clientpool_key_forget(e->p, ek);
}

static void op_created(int m, int b) {
  f_eng *e = &F.E[m];
  f_res x;
  int i, ok = (b & 2) == 0 || (b & 4) == 0;   /* (3 in 4 succeed) */
  if (e->nr == 0) return;
  i = (b >> 3) % e->nr;
  x = e->R[i];
  e->R[i] = e->R[--e->nr];
  if (clientpool_created(e->p, x.r, ok, F.now) != 0) ff_fail("engine %d: created(%d) refused", m, x.r);
  model_fleet_created(&F.mf, m, x.k, x.refill, ok);
  trace("engine %d: created %d ok %d refill %d", m, x.r, ok, x.refill);
  if (ok && !x.refill) {
    if (e->nl == FH) { clientpool_release(e->p, x.l, x.gen, -1, F.now); return; }
    e->L[e->nl].l = x.l; e->L[e->nl].gen = x.gen; e->nl++;
  }
}

static void op_release(int m, int b) {
  f_eng *e = &F.E[m];
  f_lease x;
  int i;
  if (e->nl == 0) return;
  i = (b >> 2) % e->nl;
  x = e->L[i];
  e->L[i] = e->L[--e->nl];
  clientpool_release(e->p, x.l, x.gen, (b & 2) && (b & 4) ? CLIENTPOOL_BY_ERROR : -1, F.now);
  trace("engine %d: release %d", m, x.l);
}

static void op_cancel(int m, int b) {
  f_eng *e = &F.E[m];
  clientpool_grant_t g;
  f_wait x;
  int i;
  if (e->nw == 0) return;
  i = (b >> 1) % e->nw;
  x = e->W[i];
  e->W[i] = e->W[--e->nw];
  memset(&g, 0, sizeof g);
  if (b & 2) {
    clientpool_abandon(e->p, x.w, x.gen, F.now);
  } else {
    clientpool_cancel(e->p, x.w, x.gen, CLIENTPOOL_CANCELLED, F.now, &g);
    hold_grant(m, &g);         /* (a waiter resolved already keeps its grant) */
  }
}

static void op_destroyed(int m, int b) {
  f_eng *e = &F.E[m];
  f_closing x;
  int i;
  if (e->nd == 0) return;
  i = (b >> 1) % e->nd;
  x = e->D[i];
  e->D[i] = e->D[--e->nd];
  if (clientpool_destroyed(e->p, x.r, F.now) != 0) ff_fail("engine %d: destroyed(%d) refused", m, x.r);
  model_fleet_destroyed(&F.mf, m, x.k);
}

static void op_refill(int m) {
  f_eng *e = &F.E[m];
  int32_t ek, r;
  if (e->nr == FH) return;
  r = clientpool_refill(e->p, F.now, &ek);
  if (r < 0) return;
  e->R[e->nr].r = r; e->R[e->nr].l = -1; e->R[e->nr].gen = 0;
  e->R[e->nr].k = name_of(m, ek); e->R[e->nr].refill = 1; e->nr++;
  model_fleet_reserve(&F.mf, m, name_of(m, ek), 1);
}

static void op_gate(int m, int b) {
  f_eng *e = &F.E[m];
  int k = (b >> 2) % (NK + 1) - 1;   /* -1: the fleet's own gate */
  const char *kn = k >= 0 ? KNAMES[k] : NULL;
  size_t kl = kn ? strlen(kn) : 0;
  if (b & 2) clientpool_fleet_pause(e->h, kn, kl, "fuzz", 4, -1);
  else clientpool_fleet_resume(e->h, kn, kl);
}

/* ---- the run ----------------------------------------------------------- */

static void settle(void) {
  int m, k, rounds;
  for (m = 0; m < M; m++) clientpool_close(F.E[m].p, F.now);
  drain();
  for (rounds = 0; rounds < 64; rounds++) {
    int left = 0;
    for (m = 0; m < M; m++) {
      f_eng *e = &F.E[m];
      while (e->nw > 0) op_cancel(m, 0);
      while (e->nl > 0) op_release(m, 0);
      while (e->nr > 0) op_created(m, 2 | 4);     /* (fails: a closed pool would destroy it anyway) */
      while (e->nd > 0) op_destroyed(m, 0);
      drain();
      left += e->nw + e->nl + e->nr + e->nd;
    }
    check();
    if (left == 0) break;
  }
  for (m = 0; m < M; m++) {
    clientpool_stats_t s;
    clientpool_stats(F.E[m].p, -1, &s);
    if (s.live || s.creating || s.closing || s.leases || s.waiting)
      ff_fail("engine %d closed and settled holds live %d creating %d closing %d leases %d waiting %d", m, s.live,
              s.creating, s.closing, s.leases, s.waiting);
  }
  /* the gates the run left closed pin their keys: opened again */
  clientpool_fleet_resume(F.obs, NULL, 0);
  for (k = 0; k < NK; k++) clientpool_fleet_resume(F.obs, KNAMES[k], strlen(KNAMES[k]));
  for (m = 0; m < M; m++) {
    clientpool_free(F.E[m].p);
    clientpool_fleet_close(F.E[m].h);   /* (the engine retained it: this closes it) */
  }
  {
    clientpool_fleet_stats_t s;
    clientpool_fleet_stats(F.obs, &s);
    if (s.live || s.idle || s.leases || s.refilling || s.demand_live || s.demand_lease || s.members || s.keys ||
        s.pledged)
      ff_fail("the fleet after both engines: live %d idle %d leases %d refilling %d demand %d/%d members %d keys %d "
              "pledged %d", s.live, s.idle, s.leases, s.refilling, s.demand_live, s.demand_lease, s.members, s.keys,
              s.pledged);
  }
  clientpool_fleet_close(F.obs);
}

static void decode(void) {
  clientpool_fleet_limits_t *l = &F.lim;
  int b, m;
  memset(l, 0, sizeof *l);
  b = byte();
  l->max_live = 1 + b % 6;
  l->max_idle = (b >> 3) % (l->max_live + 1);
  b = byte();
  l->min_idle = b % 3;
  if (l->min_idle > l->max_idle) l->min_idle = l->max_idle;
  l->max_concurrency = (b & 8) ? 1 + (b >> 4) % 8 : NONE_CAP;
  b = byte();
  l->key_max_live = (b & 1) ? 1 + (b >> 1) % l->max_live : -1;
  l->key_max_idle = (b & 16) ? (b >> 5) % (l->max_idle + 1) : -1;
  l->max_keys = 4;
  l->members = 4;
  l->attempts = 1 + (b >> 4) % 2;
  for (m = 0; m < M; m++) {
    clientpool_config_t *c = &F.E[m].cfg;
    memset(c, 0, sizeof *c);
    b = byte();
    c->max_live = 1 + b % 6;
    c->max_idle = (b >> 3) % (c->max_live + 1);
    c->min_idle = l->min_idle < c->max_idle ? l->min_idle : c->max_idle;
    c->capacity = (b & 128) ? 2 : 1;
    b = byte();
    c->max_waiting = 1 + b % 6;
    c->max_concurrency = c->max_live * c->capacity;
    c->key_max_live = -1;
    c->key_max_idle = -1;
    c->max_keys = -1;
    c->idle_timeout = (b & 8) ? 0.5 + (double)((b >> 4) % 4) : -1;
    c->max_lifetime = -1;
    c->lifetime_jitter = 0;
    c->validate_after_idle = -1;
    c->leak_threshold = -1;
    c->create_backoff = -1;
    c->create_backoff_max = -1;
    c->keepalive = -1;
    c->seed = 1;
    F.E[m].use_leases = l->max_concurrency < NONE_CAP;
  }
}

int fuzz_fleet_run(const uint8_t *data, size_t size) {
  char err[200];
  int m, k;
  memset(&F, 0, sizeof F);
  F.in = data;
  F.n = size;
  F.trace = getenv("FUZZ_TRACE") != NULL;
  F.now = 1;
  decode();
  model_fleet_init(&F.mf, F.lim.max_live, F.lim.max_idle, F.lim.max_concurrency < NONE_CAP ? F.lim.max_concurrency : -1,
                   F.lim.key_max_live, F.lim.key_max_idle);
  snprintf(F.name, sizeof F.name, "fuzz-fleet-%ld", (long)getpid());
  clientpool_fleet_remove(F.name, strlen(F.name), NULL, 0);   /* (a segment a crashed run left) */
  if (clientpool_fleet_open(F.name, strlen(F.name), &F.lim, &F.obs, err, sizeof err) < 0)
    ff_fail("fleet open: %s", err);
  for (m = 0; m < M; m++) {
    f_eng *e = &F.E[m];
    if (clientpool_fleet_open(F.name, strlen(F.name), NULL, &e->h, err, sizeof err) < 0) ff_fail("fleet attach: %s", err);
    if (clientpool_fleet_join(e->h) != 0) ff_fail("fleet join failed");
  }
  clientpool_fleet_remove(F.name, strlen(F.name), NULL, 0);   /* the mappings stay; /dev/shm is clean */
  for (m = 0; m < M; m++) {
    f_eng *e = &F.E[m];
    if (clientpool_new(&e->cfg, &e->p) != CLIENTPOOL_OK) ff_fail("clientpool_new refused engine %d's config", m);
    if (clientpool_set_fleet(e->p, e->h, e->use_leases ? CLIENTPOOL_FLEET_USE_LEASES : 0) != 0)
      ff_fail("clientpool_set_fleet refused");
    for (k = 0; k < NK; k++) { e->ek[k] = -1; e->slot[k] = -1; }
    for (k = 0; k < 64; k++) e->kname[k] = -1;
    if (e->cfg.min_idle > 0) {         /* the warm key: k0 */
      int32_t ek = key_of(m, 0);
      clientpool_key_pin(e->p, ek, 2);
    }
  }
  while (F.pos < F.n && F.step < STEPS) {
    int op = byte() % 16, b = byte(), mm = b & 1;
    f_eng *e = &F.E[mm];
    F.step++;
    switch (op) {
    case 0: case 1: F.op = "acquire"; op_acquire(mm, b); break;
    case 2: case 3: F.op = "created"; op_created(mm, b); break;
    case 4: case 5: F.op = "release"; op_release(mm, b); break;
    case 6: F.op = "cancel"; op_cancel(mm, b); break;
    case 7: F.op = "tick"; F.now += 0.25 * (double)((b >> 1) % 8); clientpool_tick(F.E[0].p, F.now);
      clientpool_tick(F.E[1].p, F.now); break;
    case 8: F.op = "retry"; post(mm); clientpool_retry(e->p, F.now); break;
    case 9: F.op = "rebalance"; clientpool_fleet_scan(e->h, 0); clientpool_rebalance(e->p, F.now); break;
    case 10: case 11: F.op = "destroyed"; op_destroyed(mm, b); break;
    case 12: F.op = "floor"; clientpool_floor(e->p, (b & 2) == 0, F.now); break;
    case 13: F.op = "refill"; op_refill(mm); break;
    case 14: F.op = "gate"; op_gate(mm, b); break;
    case 15: F.op = "close"; if ((b >> 1) % 32 == 0) clientpool_close(e->p, F.now); break;
    }
    drain();
    check();
  }
  F.op = "settle";
  settle();
  return 0;
}
