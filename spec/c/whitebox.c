/*
 * whitebox.c - csrc/engine.c compiled for the tests: allocation failures on
 * demand, and access to internals (see whitebox.h).  The engine's code is
 * included unchanged; only its malloc, calloc and realloc calls go through
 * the wrappers below, which behave exactly like the originals until a test
 * arms a failure.
 */
#include <stdlib.h>
#include <string.h>

static long wb_count;        /* allocations made */
static long wb_fail_n;       /* the n-th allocation from now fails (0: none) */
static int wb_fail_every;

static int wb_fails(void) {
  wb_count++;
  if (wb_fail_every) return 1;
  if (wb_fail_n > 0 && --wb_fail_n == 0) return 1;
  return 0;
}
static void *wb_malloc(size_t n) { return wb_fails() ? NULL : malloc(n); }
static void *wb_calloc(size_t a, size_t b) { return wb_fails() ? NULL : calloc(a, b); }
static void *wb_realloc(void *p, size_t n) { return wb_fails() ? NULL : realloc(p, n); }

#define malloc(n) wb_malloc(n)
#define calloc(a, b) wb_calloc((a), (b))
#define realloc(p, n) wb_realloc((p), (n))
#include "../../csrc/engine.c"
#undef malloc
#undef calloc
#undef realloc

#include "whitebox.h"

void wb_alloc_fail(long n) { wb_fail_n = n > 0 ? n : 0; }
void wb_alloc_fail_all(int on) { wb_fail_every = on; }
long wb_allocs(void) { return wb_count; }
void wb_fast_path(clientpool_t *p, int on) { p->fast_off = !on; }

/* ---- reading ---------------------------------------------------------- */

typedef char wb_states_match[((int)WB_FREE == (int)R_FREE && (int)WB_CREATING == (int)R_CREATING &&
                              (int)WB_IDLE == (int)R_IDLE && (int)WB_LEASED == (int)R_LEASED &&
                              (int)WB_CLOSING == (int)R_CLOSING && (int)WB_CHECKING == (int)R_CHECKING) ? 1 : -1];

int wb_rec_state(const clientpool_t *p, int32_t r) {
  return r < 0 || r >= p->nrec ? R_FREE : p->rec[r].state;
}
int wb_rec_nleases(const clientpool_t *p, int32_t r) {
  return p->rec[r].state == R_LEASED || p->rec[r].state == R_CREATING ? p->rec[r].nleases : 0;
}
int wb_rec_retire(const clientpool_t *p, int32_t r) { return p->rec[r].retire != 0; }
int wb_rec_doomed(const clientpool_t *p, int32_t r) { return p->rec[r].doomed; }
int32_t wb_rec_key(const clientpool_t *p, int32_t r) { return p->rec[r].key; }
int32_t wb_lease_record(const clientpool_t *p, int32_t l) {
  return l < 0 || l >= p->nlea ? NONE : p->lea[l].record;
}
int32_t wb_nrec(const clientpool_t *p) { return p->nrec; }
int32_t wb_span(const clientpool_t *p) {
  int32_t n = p->nrec;
  if (p->nlea > n) n = p->nlea;
  if (p->nwai > n) n = p->nwai;
  if (p->nkeys > n) n = p->nkeys;
  return n;
}
int wb_keys_used(const clientpool_t *p) { return p->keys_used; }

int32_t wb_closing(const clientpool_t *p, int32_t *out, int32_t n) {
  int32_t r, c = 0;
  for (r = 0; r < p->nrec; r++)
    if (p->rec[r].state == R_CLOSING) {
      if (c < n) out[c] = r;
      c++;
    }
  return c;
}

void wb_waiter(const clientpool_t *p, int32_t w, int *result, int32_t *rec, int32_t *lease, uint32_t *lgen) {
  const waiter_t *x = &p->wai[w];
  *result = x->state == W_DONE ? x->result : CLIENTPOOL_PENDING;
  *rec = x->record;
  *lease = x->lease;
  *lgen = x->lease_gen;
}

/* ---- corrupting ------------------------------------------------------- */

/* the first record in state st (and, if open >= 0, open or not), or NONE */
static int32_t wb_find_rec(const clientpool_t *p, int st, int open) {
  int32_t r;
  for (r = 0; r < p->nrec; r++)
    if (p->rec[r].state == st && (open < 0 || (st == R_LEASED && p->rec[r].opos != NONE) == open)) return r;
  return NONE;
}
static int32_t wb_find_free_rec(const clientpool_t *p) { return wb_find_rec(p, R_FREE, -1); }
/* a key with at least n queued waiters */
static int32_t wb_key_with_waiters(const clientpool_t *p, int n) {
  int32_t k;
  for (k = 0; k < p->nkeys; k++) {
    if (!p->keys[k].used) continue;
    if (p->keys[k].wlen >= n) return k;
  }
  return NONE;
}
static int32_t wb_key_without_idle(const clientpool_t *p) {
  int32_t k;
  for (k = 0; k < p->nkeys; k++) if (p->keys[k].used && p->keys[k].idle_top == NONE) return k;
  return NONE;
}
static void wb_rswap(clientpool_t *p, int h, int32_t i, int32_t j) {
  int32_t a = p->rheap[h][i], b = p->rheap[h][j];
  p->rheap[h][i] = b; p->keys[b].rpos = i;
  p->rheap[h][j] = a; p->keys[a].rpos = j;
}

/*
 * The pool the corruptions expect (spec/c/test_engine_faults.c builds it):
 * capacity 2; key A holds an idle record and two queued waiters; key B a
 * leased record with one lease (open); key C one with two leases;
 * max_concurrency is reached, so A sits in the idle ready heap and three
 * more keys with one waiter each sit in the create ready heap; every record
 * has a lifetime, every lease a leak_threshold and every waiter a deadline,
 * so the deadline heap holds at least three entries; keepalive is on and
 * another key holds two idle records (the keepalive heap holds three), and
 * one more a closing record.
 */
const char *wb_corrupt(clientpool_t *p, int what) {
  int32_t idle = wb_find_rec(p, R_IDLE, -1), open = wb_find_rec(p, R_LEASED, 1);
  int32_t full = wb_find_rec(p, R_LEASED, 0), ka = wb_key_with_waiters(p, 2), l, k;
  int32_t closing = wb_find_rec(p, R_CLOSING, -1);
  if (idle == NONE || open == NONE || full == NONE || ka == NONE || closing == NONE) return NULL;
  if (p->rlen[RH_CREATE] < 3 || p->rlen[RH_IDLE] < 1 || p->dl.len < 3 || p->ka.len < 3) return NULL;
  switch (what) {
  case 0:
    for (k = 0; k < p->nkeys && p->keys[k].used; k++) {}
    if (k == p->nkeys) return NULL;
    p->rec[idle].key = k;
    return "on dead key";
  case 1: p->rec[full].nleases = p->cfg.capacity + 1; return "> capacity";
  case 2: p->rec[open].retire = 1; return "open-heap membership wrong";
  case 3: p->keys[p->rec[open].key].oheap[p->rec[open].opos] = full; return "open-heap position";
  case 4: p->rec[idle].nleases = 1; return "idle record";
  case 5: p->rec[open].nleases = 0; return "has no lease";
  case 6:
    for (l = 0; l < p->nlea && p->lea[l].record == NONE; l++) {}
    p->lea[l].record = idle;
    return "points at record";
  case 7: p->st.live++; return "pool: live";
  case 8: p->st.idle++; return "pool: idle";
  case 9: p->st.active++; return "pool: active";
  case 10: p->st.leases++; return "pool: leases";
  case 11: p->st.creating++; return "pool: creating";
  case 12: p->st.waiting++; return "pool: waiting";
  case 13: p->st.opened++; return "opened - closed != live";
  case 14: p->keys[ka].refilling = 1; return "refilling";
  case 15: p->keys[ka].st.live++; return "key: live";
  case 16: p->cfg.key_max_live = 0; return "over its max_live";
  case 17: p->wai[p->keys[ka].wheap[1]].wpos = 0; return "queue position";
  case 18: {
    int32_t w = p->keys[ka].wheap[0];
    p->wai[p->keys[ka].wheap[1]].order = p->wai[w].order - 1;
    return "out of order";
  }
  case 19: p->keys[ka].wlen--; return "queue holds";
  case 20:
    k = wb_key_without_idle(p);
    if (k == NONE) return NULL;
    p->keys[k].idle_top = idle;
    return "idle stack broken";
  case 21: p->keys[p->rec[idle].key].idle_top = NONE; return "idle stack holds";
  case 22: p->keys[p->rheap[RH_CREATE][0]].rheap = RH_IDLE; return "ready-heap membership wrong";
  case 23: p->keys[p->rheap[RH_CREATE][0]].rpos = NONE; return "ready-heap membership wrong";
  case 24: p->keys_used++; return "keys used";
  case 25: p->cfg.max_keys = 1; return "more than max_keys";
  case 26: p->rlen[RH_CREATE]--; return "ready heaps hold";
  case 27: p->cfg.max_live = 1; return "> max_live";
  case 28: p->cfg.max_concurrency = 1; return "> max_concurrency";
  case 29: p->cfg.max_waiting = 0; return "> max_waiting";
  case 30: {
    int32_t a = p->rheap[RH_CREATE][0], b = p->rheap[RH_CREATE][1];
    p->keys[a].rpos = 1; p->keys[b].rpos = 0;
    return "ready heap position wrong";
  }
  case 31: wb_rswap(p, RH_CREATE, 0, 1); return "ready heap order";
  case 32: {
    /* the three keys by arrival s0 < s1 < s2, laid out [s1, s2, s0]: the
     * left child is in order, the right one is not */
    int32_t *a = p->rheap[RH_CREATE];
    if (kbefore(p, a[2], a[1])) wb_rswap(p, RH_CREATE, 1, 2);             /* [s0, s1, s2] */
    wb_rswap(p, RH_CREATE, 0, 1);                                        /* [s1, s0, s2] */
    wb_rswap(p, RH_CREATE, 1, 2);                                        /* [s1, s2, s0] */
    return "ready heap order";
  }
  case 33: *hpos_of(p, &p->dl.a[0]) = 1; return "deadline heap position wrong";
  case 34: p->dl.a[1].t = p->dl.a[0].t - 1; return "deadline heap order";
  case 35: p->dl.a[1].t = p->dl.a[0].t + 1; p->dl.a[2].t = p->dl.a[0].t - 1; return "deadline heap order";
  case 36: p->cfg.max_concurrency = 1000; return "servable waiter";
  case 37:
    for (l = 0; l < p->nlea && p->lea[l].record == NONE; l++) {}
    if (wb_find_free_rec(p) == NONE) return NULL;
    p->lea[l].record = wb_find_free_rec(p);
    return "points at record";
  case 38: p->keys[ka].st.waiting++; return "key: waiting";
  case 39: p->st.closing++; return "pool: closing";
  case 40: p->keys[ka].st.closing++; return "key: closing";
  case 41: p->rec[closing].hpos = 0; return "closing record";
  case 42: p->rec[closing].nleases = 1; return "closing record";
  case 43:
    for (l = 0; l < p->nlea && p->lea[l].record == NONE; l++) {}
    p->lea[l].record = closing;
    return "points at record";
  case 44: p->rec[idle].kpos = 99; return "keepalive entry";
  case 45: p->rec[idle].retire |= IDLE_OVER; return "marked past idle_timeout";
  case 46: p->keys[ka].nchecking++; return "checking";
  case 47: p->keys[ka].bstate = B_WINDOW; return "backoff state";
  case 48: p->keys[ka].fails = 1; return "backoff state";
  case 49: *hpos_of(p, &p->ka.a[0]) = 1; return "keepalive entry";   /* (the records are checked first) */
  case 50: p->ka.a[1].t = p->ka.a[0].t - 1; return "keepalive heap order";
  case 51: p->ka.a[1].t = p->ka.a[0].t + 1; p->ka.a[2].t = p->ka.a[0].t - 1; return "keepalive heap order";
  case 52: p->nchecking = 1; return "checking";
  case 53: p->rec[idle].kpos = -5; return "keepalive entry";
  default: return NULL;
  }
}
void wb_dump_keys(const clientpool_t *p) {
  int32_t k;
  for (k = 0; k < p->nkeys; k++) {
    const key_t_ *x = &p->keys[k];
    if (!x->used) continue;
    fprintf(stderr, "key %d: pinned %d live %d creating %d closing %d leases %d wrefs %d bstate %d caps %d/%d hold %d kept %d\n",
            k, x->pinned, x->st.live, x->st.creating, x->st.closing, x->st.leases, x->wrefs, x->bstate, x->cap_live,
            x->cap_idle, p->hold_key, p->kept);
  }
}
