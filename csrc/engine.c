/*
 * engine.c - the clientpool state machine.
 *
 * No Lua, no I/O, no clock reads, no callbacks: see clientpool.h for the
 * contract and docs/decisions.md for the data-structure choices.
 */
#include "engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NONE (-1)

enum { R_FREE = 0, R_CREATING, R_IDLE, R_LEASED };
enum { W_FREE = 0, W_QUEUED, W_DONE };
enum { H_LIFETIME = 0, H_WAITER, H_LEASE };
enum { RH_IDLE = 0, RH_CREATE = 1 };
enum { PROBE_NONE = 0, PROBE_READY, PROBE_OUT };

/* Admission gate of the pool or of a key: paused, or half-open (one probe
 * admitted, the rest held until its lease reports a continuing outcome). */
typedef struct gate {
  int32_t paused;
  int32_t probe;
  int32_t probe_lease;
  uint32_t probe_gen;
} gate_t;

/* 56 bytes: B4 asks for at most 64 per idle client, and the slot array
 * grows by an eighth.  Fields that only one state needs share storage. */
typedef struct record {
  uint32_t gen;
  int32_t key;
  int32_t nleases;
  int32_t hpos;          /* lifetime deadline entry (its time is the expiry), or NONE */
  float gl_ahead;        /* idle: how far the warm floor moved the idle-expiry clock past
                          * idle_since (rounded up: expiry is never early) */
  uint8_t state;
  uint8_t retire;        /* RETIRED | LIFETIME_OVER: no new leases; destroyed at release */
  uint8_t doomed;        /* a co-holder lost it (reason + 1): destroyed when the last lease ends */
  uint8_t refill;        /* while creating: a warm-floor reservation (no lease) */
  double created;        /* strictly increasing, so it is also the creation order */
  union {
    struct {             /* R_IDLE */
      int32_t kprev, knext;  /* per-key idle stack; knext points down the stack */
      int32_t gprev, gnext;  /* pool-wide idle list, oldest first */
      double idle_since;     /* when it went idle (exact: validate_after_idle reads it) */
    };
    int32_t opos;        /* R_LEASED: position in its key's open heap (capacity > 1), or NONE */
    int32_t res_lease;   /* R_CREATING: the reservation's lease (NONE for a refill) */
    int32_t next_free;   /* R_FREE */
  };
} record_t;
_Static_assert(sizeof(record_t) <= 56, "record_t grew: B4 counts every byte of it");

enum { RETIRED = 1, LIFETIME_OVER = 2 };   /* record_t.retire bits */

typedef struct lease {
  uint32_t gen;
  int32_t record;        /* NONE when free */
  int32_t hpos;          /* leak_threshold entry, or NONE */
  int32_t next_free;
  double since;
} lease_t;

typedef struct waiter {
  uint32_t gen;
  int32_t state;
  int32_t key;
  int32_t result;        /* when W_DONE: a clientpool status */
  int32_t record, lease;
  uint32_t lease_gen;
  int32_t validate, shared;
  int32_t prev, next;    /* the key's FIFO queue */
  int32_t hpos;          /* deadline entry, or NONE */
  int32_t next_free;
  int32_t passed;        /* times a younger waiter of another key took an idle record first */
  uint64_t seq;
  double enq, idle, waited;
} waiter_t;

typedef struct key {
  int32_t used, pinned;
  int32_t idle_top;      /* top of the LIFO idle stack */
  int32_t wq_head, wq_tail;
  int32_t rpos;          /* position in its ready heap, or NONE */
  int32_t rheap;         /* which ready heap: RH_IDLE, RH_CREATE or NONE */
  int32_t next_free;
  int32_t refilling;     /* warm-floor reservations in flight */
  int32_t wrefs;         /* waiter slots naming this key (queued or unclaimed) */
  int32_t *oheap, olen, ocap;  /* open records (capacity > 1) by fewest leases */
  double retire_before;  /* records created earlier are retired */
  double retire_upto;    /* records created up to this instant are retired */
  gate_t gate;
  clientpool_stats_t st;
} key_t_;

typedef struct hent {
  double t;
  int32_t kind;
  int32_t idx;
} hent_t;

struct clientpool {
  clientpool_config_t cfg;
  int32_t closed;
  double now;            /* the latest time seen: time never runs backwards */
  double armed;          /* the deadline the driver's timer is set for */
  uint64_t rng;
  uint64_t seq;

  record_t *rec; int32_t nrec, rec_free;
  lease_t *lea; int32_t nlea, lea_free;
  waiter_t *wai; int32_t nwai, wai_free;
  key_t_ *keys; int32_t nkeys, key_free, keys_used;
  int32_t g_oldest, g_newest;   /* pool-wide idle list */
  int32_t hold_key;             /* the key an acquire works on: not forgotten meanwhile */
  int32_t *warm; int32_t nwarm, warmcap;  /* pinned keys: the warm floor's keys */
  int32_t floor_on, refill_signalled;
  int32_t refilling;            /* warm-floor reservations in flight, all keys */
  int32_t floor_held;           /* a warm key is short, but max_idle has no room (floor_deficit) */
  double retire_before, retire_upto;
  double last_created;          /* the latest record_t.created handed out */
  gate_t gate;

  hent_t *heap; int32_t hlen, hcap;   /* deadlines */
  int32_t *rheap[2]; int32_t rlen[2]; /* ready keys, each sized nkeys */

  clientpool_event_t *ev; int32_t evcap, evhead, evlen;
  clientpool_stats_t st;
};

/* ---- small helpers ---------------------------------------------------- */

static int has(double d) { return d >= 0; }

/* Slot arrays grow by an eighth (and 8), not by doubling: at most about 12%
 * of a large array is spare (B4), and glibc moves big blocks by remapping. */
static void *grow(void *ptr, int32_t *cap, size_t elem, int32_t min) {
  int32_t n = *cap ? *cap : 8;
  void *q;
  while (n < min) {
    if (n > INT32_MAX / 9 * 8 - 8) return NULL;   /* (as out of memory) */
    n += n / 8 + 8;
  }
  if (n == *cap) return ptr;
  q = realloc(ptr, (size_t)n * elem);
  if (q) *cap = n;
  return q;
}

static double rnd(clientpool_t *p) {   /* xorshift64*, [0,1) */
  uint64_t x = p->rng;
  x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
  p->rng = x;
  return (double)((x * 2685821657736338717ULL) >> 11) / 9007199254740992.0;
}

static void push_event(clientpool_t *p, int32_t type, int32_t a, int32_t b, int32_t c, double t) {
  clientpool_event_t *e;
  if (p->evlen == p->evcap) {
    int32_t ncap = p->evcap ? p->evcap * 2 : 64, i;
    clientpool_event_t *q = malloc((size_t)ncap * sizeof *q);
    if (!q) abort();   /* events cannot be dropped: losing one leaks a client */
    for (i = 0; i < p->evlen; i++) q[i] = p->ev[(p->evhead + i) % p->evcap];
    free(p->ev);
    p->ev = q; p->evcap = ncap; p->evhead = 0;
  }
  e = &p->ev[(p->evhead + p->evlen) % p->evcap];
  e->type = type; e->a = a; e->b = b; e->c = c; e->t = t;
  p->evlen++;
}

#define BOTH(p, k, field, delta) do { (p)->st.field += (delta); (p)->keys[k].st.field += (delta); } while (0)

/* ---- deadline heap ---------------------------------------------------- */

static int32_t *hpos_of(clientpool_t *p, const hent_t *e) {
  switch (e->kind) {
  case H_LIFETIME: return &p->rec[e->idx].hpos;
  case H_WAITER: return &p->wai[e->idx].hpos;
  default: return &p->lea[e->idx].hpos;
  }
}

static void hset(clientpool_t *p, int32_t i, hent_t e) {
  p->heap[i] = e;
  *hpos_of(p, &p->heap[i]) = i;
}

static void hup(clientpool_t *p, int32_t i) {
  hent_t e = p->heap[i];
  while (i > 0) {
    int32_t parent = (i - 1) / 2;
    if (p->heap[parent].t <= e.t) break;
    hset(p, i, p->heap[parent]);
    i = parent;
  }
  hset(p, i, e);
}

static void hdown(clientpool_t *p, int32_t i) {
  hent_t e = p->heap[i];
  for (;;) {
    int32_t c = 2 * i + 1;
    if (c >= p->hlen) break;
    if (c + 1 < p->hlen && p->heap[c + 1].t < p->heap[c].t) c++;
    if (e.t <= p->heap[c].t) break;
    hset(p, i, p->heap[c]);
    i = c;
  }
  hset(p, i, e);
}

static int hpush(clientpool_t *p, double t, int32_t kind, int32_t idx) {
  hent_t e;
  if (p->hlen == p->hcap) {
    hent_t *q = grow(p->heap, &p->hcap, sizeof *q, p->hlen + 1);
    if (!q) return CLIENTPOOL_ENOMEM;
    p->heap = q;
  }
  e.t = t; e.kind = kind; e.idx = idx;
  p->heap[p->hlen++] = e;
  hup(p, p->hlen - 1);
  return 0;
}

static void hremove(clientpool_t *p, int32_t *pos) {
  int32_t i = *pos;
  if (i == NONE) return;
  *pos = NONE;
  p->hlen--;
  if (i == p->hlen) return;
  hset(p, i, p->heap[p->hlen]);
  hup(p, i);
  hdown(p, *hpos_of(p, &p->heap[i]));
}

/* ---- ready keys ------------------------------------------------------
 * Keys with queued waiters that could be served, in two heaps ordered by
 * the arrival of each key's head waiter: RH_IDLE holds keys with an idle
 * record to hand out, RH_CREATE keys under their cap that must create.  An
 * idle record goes to its own key's waiters; a waiter that must create is
 * served in arrival order against the others that can use a free slot, and
 * evicts another key's idle record only when no waiter can take that one. */

static uint64_t kseq(const clientpool_t *p, int32_t k) {
  return p->wai[p->keys[k].wq_head].seq;
}

static void rset(clientpool_t *p, int h, int32_t i, int32_t k) {
  p->rheap[h][i] = k;
  p->keys[k].rpos = i;
}

static void rup(clientpool_t *p, int h, int32_t i) {
  int32_t k = p->rheap[h][i];
  while (i > 0) {
    int32_t parent = (i - 1) / 2;
    if (kseq(p, p->rheap[h][parent]) <= kseq(p, k)) break;
    rset(p, h, i, p->rheap[h][parent]);
    i = parent;
  }
  rset(p, h, i, k);
}

static void rdown(clientpool_t *p, int h, int32_t i) {
  int32_t k = p->rheap[h][i], n = p->rlen[h];
  for (;;) {
    int32_t c = 2 * i + 1;
    if (c >= n) break;
    if (c + 1 < n && kseq(p, p->rheap[h][c + 1]) < kseq(p, p->rheap[h][c])) c++;
    if (kseq(p, k) <= kseq(p, p->rheap[h][c])) break;
    rset(p, h, i, p->rheap[h][c]);
    i = c;
  }
  rset(p, h, i, k);
}

/* Which heap key k belongs in: RH_IDLE, RH_CREATE or NONE. */
static int gate_blocked(const gate_t *g) {
  return g->paused || g->probe == PROBE_OUT;
}

static int key_ready(const clientpool_t *p, int32_t k) {
  const key_t_ *key = &p->keys[k];
  if (key->wq_head == NONE || p->closed || gate_blocked(&key->gate)) return NONE;
  if (key->idle_top != NONE || key->olen > 0) return RH_IDLE;
  if (p->cfg.key_max_live < 0 || key->st.live + key->st.creating < p->cfg.key_max_live) return RH_CREATE;
  return NONE;
}

static void rremove(clientpool_t *p, int32_t k) {
  key_t_ *key = &p->keys[k];
  int h = key->rheap;
  int32_t i = key->rpos, last;
  key->rpos = NONE;
  key->rheap = NONE;
  last = --p->rlen[h];
  if (i == last) return;
  rset(p, h, i, p->rheap[h][last]);
  rup(p, h, i);
  rdown(p, h, p->keys[p->rheap[h][i]].rpos);
}

/* Puts key k where it belongs after any change to it. */
static void key_refresh(clientpool_t *p, int32_t k) {
  key_t_ *key = &p->keys[k];
  int want = key_ready(p, k);
  if (key->rpos != NONE && key->rheap != want) rremove(p, k);
  if (want == NONE) return;
  if (key->rpos == NONE) {
    int32_t i = p->rlen[want]++;
    key->rheap = want;
    rset(p, want, i, k);
    rup(p, want, i);
  } else {
    rup(p, want, key->rpos);
    rdown(p, want, key->rpos);
  }
}

/* ---- keys ------------------------------------------------------------- */

static int key_empty(const clientpool_t *p, int32_t k) {
  const key_t_ *key = &p->keys[k];
  return key->st.live == 0 && key->st.creating == 0 && key->st.leases == 0 &&
         key->wrefs == 0;
}

/* A forgotten key's id is reused only once the driver has read its
 * EV_KEY_FREE (clientpool_next_event): a finalizer (a leaked lease) can free
 * a key while the driver still maps a name to its id, and until the driver
 * drains the event that id must not name another key (calls with it are
 * STALE instead). */
/* Puts key slot k on the free list (its id may name another key now). */
static void key_reuse(clientpool_t *p, int32_t k) {
  p->keys[k].next_free = p->key_free;
  p->key_free = k;
}

static int key_maybe_free(clientpool_t *p, int32_t k) {
  key_t_ *key = &p->keys[k];
  if (!key->used || key->pinned || k == p->hold_key || !key_empty(p, k)) return 0;
  key->used = 0;
  p->keys_used--;
  push_event(p, CLIENTPOOL_EV_KEY_FREE, k, 0, 0, 0);
  return 1;
}

int32_t clientpool_key_open(clientpool_t *p) {
  int32_t k;
  key_t_ *key;
  if (p->closed) return CLIENTPOOL_ECLOSED;
  if (p->cfg.max_keys >= 0 && p->keys_used >= p->cfg.max_keys) return CLIENTPOOL_EKEYS;
  if (p->key_free == NONE) {
    int32_t cap = p->nkeys, i;
    key_t_ *q = grow(p->keys, &cap, sizeof *q, p->nkeys + 1);
    int32_t *rh;
    if (!q) return CLIENTPOOL_ENOMEM;
    p->keys = q;
    rh = realloc(p->rheap[RH_IDLE], (size_t)cap * sizeof *rh);
    if (!rh) return CLIENTPOOL_ENOMEM;
    p->rheap[RH_IDLE] = rh;
    rh = realloc(p->rheap[RH_CREATE], (size_t)cap * sizeof *rh);
    if (!rh) return CLIENTPOOL_ENOMEM;
    p->rheap[RH_CREATE] = rh;
    for (i = cap - 1; i >= p->nkeys; i--) {
      memset(&p->keys[i], 0, sizeof p->keys[i]);
      key_reuse(p, i);
    }
    p->nkeys = cap;
  }
  k = p->key_free;
  key = &p->keys[k];
  p->key_free = key->next_free;
  {
    int32_t *oh = key->oheap, ocap = key->ocap;
    memset(key, 0, sizeof *key);
    key->oheap = oh;
    key->ocap = ocap;
  }
  key->used = 1;
  key->retire_before = key->retire_upto = -1;
  key->gate.probe_lease = NONE;
  key->idle_top = key->wq_head = key->wq_tail = key->rpos = key->rheap = NONE;
  key->next_free = NONE;
  p->keys_used++;
  return k;
}

static int key_ok(const clientpool_t *p, int32_t k) {
  return k >= 0 && k < p->nkeys && p->keys[k].used;
}

int clientpool_key_pin(clientpool_t *p, int32_t k, int32_t pinned) {
  int32_t i;
  if (!key_ok(p, k)) return CLIENTPOOL_EINVAL;
  if (pinned < 0 || pinned > 2) pinned = 1;
  if (p->keys[k].pinned == pinned) return 0;
  if (p->keys[k].pinned == 2)            /* leaves the warm list */
    for (i = 0; i < p->nwarm; i++)
      if (p->warm[i] == k) { p->warm[i] = p->warm[--p->nwarm]; break; }
  p->keys[k].pinned = pinned;
  if (pinned == 2) {
    if (p->nwarm == p->warmcap) {
      int32_t *q = grow(p->warm, &p->warmcap, sizeof *q, p->nwarm + 1);
      if (!q) { p->keys[k].pinned = 0; return CLIENTPOOL_ENOMEM; }
      p->warm = q;
    }
    p->warm[p->nwarm++] = k;
    p->refill_signalled = 0;
  } else if (!pinned) {
    key_maybe_free(p, k);
  }
  return 0;
}

int clientpool_key_forget(clientpool_t *p, int32_t k) {
  if (!key_ok(p, k)) return 0;
  return key_maybe_free(p, k);
}

/* ---- records ---------------------------------------------------------- */

/* Puts record slot r on the free list. */
static void rec_reuse(clientpool_t *p, int32_t r) {
  p->rec[r].next_free = p->rec_free;
  p->rec_free = r;
}

static int32_t rec_alloc(clientpool_t *p) {
  int32_t r;
  if (p->rec_free == NONE) {
    int32_t cap = p->nrec, i;
    record_t *q = grow(p->rec, &cap, sizeof *q, p->nrec + 1);
    if (!q) return NONE;
    p->rec = q;
    for (i = cap - 1; i >= p->nrec; i--) {
      memset(&q[i], 0, sizeof q[i]);
      rec_reuse(p, i);
    }
    p->nrec = cap;
  }
  r = p->rec_free;
  p->rec_free = p->rec[r].next_free;
  return r;
}

/* When an idle record's idle_timeout runs out: one expression for the
 * timer, tick and take_idle, so they never disagree by a rounding, and
 * never before now - (its idle-expiry clock) >= idle_timeout holds (the
 * sum can round down by an ulp). */
static double idle_deadline(const record_t *x, double idle_timeout) {
  double since = x->idle_since + (double)x->gl_ahead, t = since + idle_timeout;
  while (t - since < idle_timeout) t = nextafter(t, HUGE_VAL);
  return t;
}

static void idle_unlink(clientpool_t *p, int32_t r) {
  record_t *x = &p->rec[r];
  key_t_ *key = &p->keys[x->key];
  /* per-key stack */
  if (x->kprev != NONE) p->rec[x->kprev].knext = x->knext; else key->idle_top = x->knext;
  if (x->knext != NONE) p->rec[x->knext].kprev = x->kprev;
  /* pool-wide list */
  if (x->gprev != NONE) p->rec[x->gprev].gnext = x->gnext; else p->g_oldest = x->gnext;
  if (x->gnext != NONE) p->rec[x->gnext].gprev = x->gprev; else p->g_newest = x->gprev;
  BOTH(p, x->key, idle, -1);
}

static void idle_push(clientpool_t *p, int32_t r, double now) {
  record_t *x = &p->rec[r];
  key_t_ *key = &p->keys[x->key];
  x->state = R_IDLE;
  x->idle_since = now;
  x->gl_ahead = 0;
  x->kprev = NONE;
  x->knext = key->idle_top;
  if (key->idle_top != NONE) p->rec[key->idle_top].kprev = r;
  key->idle_top = r;
  x->gnext = NONE;
  x->gprev = p->g_newest;
  if (p->g_newest != NONE) p->rec[p->g_newest].gnext = r; else p->g_oldest = r;
  p->g_newest = r;
  BOTH(p, x->key, idle, 1);
}

/* The warm floor keeps this idle record: it moves to the young end of the
 * pool-wide list, its idle-expiry clock renewed (validate still sees its
 * real idle time). */
static void glist_renew(clientpool_t *p, int32_t r, double now) {
  record_t *x = &p->rec[r];
  /* a float suffices: each renewal rounds once (up), relative to the span
   * from idle_since, and nothing accumulates */
  float f = (float)(now - x->idle_since);
  if ((double)f < now - x->idle_since) f = nextafterf(f, HUGE_VALF);
  x->gl_ahead = f;
  if (x->gnext == NONE) return;
  if (x->gprev != NONE) p->rec[x->gprev].gnext = x->gnext; else p->g_oldest = x->gnext;
  p->rec[x->gnext].gprev = x->gprev;
  x->gnext = NONE;
  x->gprev = p->g_newest;
  p->rec[p->g_newest].gnext = r;
  p->g_newest = r;
}

/* A destroyed record: free, but its slot is reused only once the driver has
 * read its EV_DESTROY (clientpool_next_event), for the reason given at
 * key_maybe_free: until then the driver still keeps the client under that
 * record id, and a new client there would be the one its destroy closes. */
static void rec_bury(clientpool_t *p, int32_t r) {
  record_t *x = &p->rec[r];
  x->state = R_FREE;
  x->gen++;
  x->next_free = NONE;
}

/* A record the driver never mapped (a reservation given up): free at once. */
static void rec_free(clientpool_t *p, int32_t r) {
  rec_bury(p, r);
  rec_reuse(p, r);
}

/* ---- open records (capacity > 1): per-key heap by fewest leases ------ */

static void oset(clientpool_t *p, key_t_ *key, int32_t i, int32_t r) {
  key->oheap[i] = r;
  p->rec[r].opos = i;
}

static void oup(clientpool_t *p, key_t_ *key, int32_t i) {
  int32_t r = key->oheap[i];
  while (i > 0) {
    int32_t parent = (i - 1) / 2;
    if (p->rec[key->oheap[parent]].nleases <= p->rec[r].nleases) break;
    oset(p, key, i, key->oheap[parent]);
    i = parent;
  }
  oset(p, key, i, r);
}

static void odown(clientpool_t *p, key_t_ *key, int32_t i) {
  int32_t r = key->oheap[i];
  for (;;) {
    int32_t c = 2 * i + 1;
    if (c >= key->olen) break;
    if (c + 1 < key->olen && p->rec[key->oheap[c + 1]].nleases < p->rec[key->oheap[c]].nleases) c++;
    if (p->rec[r].nleases <= p->rec[key->oheap[c]].nleases) break;
    oset(p, key, i, key->oheap[c]);
    i = c;
  }
  oset(p, key, i, r);
}

static void oremove(clientpool_t *p, int32_t r) {
  key_t_ *key = &p->keys[p->rec[r].key];
  int32_t i;
  if (p->rec[r].state != R_LEASED) return;   /* (opos is another state's field) */
  i = p->rec[r].opos;
  if (i == NONE) return;
  p->rec[r].opos = NONE;
  if (i == --key->olen) return;
  oset(p, key, i, key->oheap[key->olen]);
  oup(p, key, i);
  odown(p, key, p->rec[key->oheap[i]].opos);
}

/* Puts a leased record where it belongs: open while it can take a lease. */
static void orefresh(clientpool_t *p, int32_t r) {
  record_t *x = &p->rec[r];
  key_t_ *key = &p->keys[x->key];
  int want = x->state == R_LEASED && x->nleases < p->cfg.capacity && !x->doomed && !x->retire;
  if (!want) { oremove(p, r); return; }
  if (x->opos == NONE) {
    if (key->olen == key->ocap) {
      int32_t *q = grow(key->oheap, &key->ocap, sizeof *q, key->olen + 1);
      if (!q) return;             /* out of memory: the record just takes no more leases */
      key->oheap = q;
    }
    oset(p, key, key->olen++, r);
    oup(p, key, x->opos);
  } else {
    oup(p, key, x->opos);
    odown(p, key, x->opos);
  }
}

/* ---- warm floor ------------------------------------------------------- */

/* How many refills warm key k needs: min_idle less its idle records and
 * refills in flight, but no more than max_idle has room for (the idle
 * records of every key and all refills in flight count), nor the key's
 * max_idle: a refill past either would be closed as it became idle, and
 * the floor would open it again. Sets floor_held when max_idle has no room
 * for a key that is short (room comes when another key's idle record goes). */
static int32_t floor_deficit(clientpool_t *p, int32_t k) {
  const key_t_ *key = &p->keys[k];
  int32_t d = p->cfg.min_idle - key->st.idle - key->refilling;
  int32_t room = p->cfg.max_idle - p->st.idle - p->refilling;
  if (p->cfg.key_max_idle >= 0 && p->cfg.key_max_idle - key->st.idle - key->refilling < d)
    d = p->cfg.key_max_idle - key->st.idle - key->refilling;
  if (d > 0 && room <= 0) p->floor_held = 1;
  return room < d ? room : d;
}

/* Signals the driver (once until it asks) that a warm key fell short: k,
 * or, while max_idle had no room for one, any (an idle record of k just
 * went: there may be room now). */
static void floor_check(clientpool_t *p, int32_t k) {
  int32_t i;
  if (!p->floor_on || p->refill_signalled || p->closed) return;
  if (p->keys[k].pinned != 2 || floor_deficit(p, k) <= 0) {
    if (!p->floor_held) return;
    p->floor_held = 0;
    for (i = 0; i < p->nwarm && floor_deficit(p, p->warm[i]) <= 0; i++) continue;
    if (i == p->nwarm) return;
    k = p->warm[i];
  }
  p->refill_signalled = 1;
  push_event(p, CLIENTPOOL_EV_REFILL, k, 0, 0, 0);
}

/* Destroys a live record (idle, or leased with no lease left). */
static void destroy(clientpool_t *p, int32_t r, int32_t reason) {
  record_t *x = &p->rec[r];
  int32_t k = x->key;
  if (x->state == R_IDLE) idle_unlink(p, r);
  oremove(p, r);
  hremove(p, &x->hpos);
  BOTH(p, k, live, -1);
  BOTH(p, k, closed, 1);
  BOTH(p, k, closed_by[reason], 1);
  push_event(p, CLIENTPOOL_EV_DESTROY, r, reason, k, 0);
  rec_bury(p, r);
  key_refresh(p, k);
  floor_check(p, k);
  key_maybe_free(p, k);
}

/* Whether a record's creation predates a retire_before of its key or pool. */
static int retired_by_age(const clientpool_t *p, const record_t *x) {
  return x->created < p->retire_before || x->created < p->keys[x->key].retire_before ||
         x->created <= p->retire_upto || x->created <= p->keys[x->key].retire_upto;
}

/* Whether a live record is past max_lifetime (or was found so by tick). */
static int lifetime_over(const clientpool_t *p, const record_t *x, double now) {
  return (x->retire & LIFETIME_OVER) || (x->hpos != NONE && now >= p->heap[x->hpos].t);
}

/* Whether the warm floor needs this idle record: idle_timeout spares it. */
static int floor_keeps(const clientpool_t *p, const record_t *x) {
  return p->floor_on && p->keys[x->key].pinned == 2 && p->keys[x->key].st.idle <= p->cfg.min_idle;
}

static int idle_expired(const clientpool_t *p, const record_t *x, double now, int32_t *why) {
  if ((x->retire & RETIRED) || retired_by_age(p, x)) { *why = CLIENTPOOL_BY_RETIRED; return 1; }
  if (lifetime_over(p, x, now)) { *why = CLIENTPOOL_BY_LIFETIME; return 1; }
  if (has(p->cfg.idle_timeout) && now >= idle_deadline(x, p->cfg.idle_timeout) && !floor_keeps(p, x)) {
    *why = CLIENTPOOL_BY_IDLE; return 1;
  }
  return 0;
}

/* ---- leases ----------------------------------------------------------- */

static int32_t lease_alloc(clientpool_t *p, int32_t r, double now) {
  int32_t l;
  lease_t *x;
  if (p->lea_free == NONE) {
    int32_t cap = p->nlea, i;
    lease_t *q = grow(p->lea, &cap, sizeof *q, p->nlea + 1);
    if (!q) return NONE;
    p->lea = q;
    for (i = cap - 1; i >= p->nlea; i--) {
      memset(&q[i], 0, sizeof q[i]);
      q[i].record = NONE;
      q[i].hpos = NONE;
      q[i].next_free = p->lea_free;
      p->lea_free = i;
    }
    p->nlea = cap;
  }
  l = p->lea_free;
  x = &p->lea[l];
  p->lea_free = x->next_free;
  x->record = r;
  x->since = now;
  x->hpos = NONE;
  p->rec[r].nleases++;
  BOTH(p, p->rec[r].key, leases, 1);
  if (has(p->cfg.leak_threshold) && hpush(p, now + p->cfg.leak_threshold, H_LEASE, l) != 0)
    x->hpos = NONE;    /* out of memory: the report is lost, the lease is not */
  return l;
}

static void lease_free(clientpool_t *p, int32_t l) {
  lease_t *x = &p->lea[l];
  record_t *r = &p->rec[x->record];
  hremove(p, &x->hpos);
  r->nleases--;
  BOTH(p, r->key, leases, -1);
  x->record = NONE;
  x->gen++;
  x->next_free = p->lea_free;
  p->lea_free = l;
}

static lease_t *lease_get(clientpool_t *p, int32_t l, uint32_t gen) {
  if (l < 0 || l >= p->nlea) return NULL;
  if (p->lea[l].record == NONE || p->lea[l].gen != gen) return NULL;
  return &p->lea[l];
}

/* ---- grants ----------------------------------------------------------- */

static void fill_idle(clientpool_t *p, int32_t r, int32_t l, double now, clientpool_grant_t *g) {
  record_t *x = &p->rec[r];
  g->status = CLIENTPOOL_GRANT_IDLE;
  g->record = r;
  g->lease = l;
  g->lease_gen = p->lea[l].gen;
  g->key = x->key;
  g->idle = now - x->idle_since;
  g->validate = !has(p->cfg.validate_after_idle) || g->idle >= p->cfg.validate_after_idle;
  g->shared = 0;
}

/* Leases the top idle record of k that is still fresh; expired ones met on
 * the way are destroyed.  Returns 1 with *g filled, or 0. */
static int take_idle(clientpool_t *p, int32_t k, double now, clientpool_grant_t *g) {
  for (;;) {
    int32_t r = p->keys[k].idle_top, why, l;
    record_t *x;
    if (r == NONE) return 0;
    x = &p->rec[r];
    if (idle_expired(p, x, now, &why)) { destroy(p, r, why); continue; }
    l = lease_alloc(p, r, now);
    if (l == NONE) return 0;
    idle_unlink(p, r);
    x->state = R_LEASED;
    BOTH(p, k, active, 1);
    BOTH(p, k, reused, 1);
    fill_idle(p, r, l, now, g);
    x->opos = NONE;                   /* (shares storage with the idle links) */
    if (p->cfg.capacity > 1) orefresh(p, r);
    floor_check(p, k);
    return 1;
  }
}

/* capacity > 1: adds a lease to the open record of k with the fewest.
 * Returns 1 with *g filled, or 0. */
static int take_open(clientpool_t *p, int32_t k, double now, clientpool_grant_t *g) {
  key_t_ *key = &p->keys[k];
  while (key->olen > 0) {
    int32_t r = key->oheap[0], l;
    record_t *x = &p->rec[r];
    if (x->retire || lifetime_over(p, x, now) || retired_by_age(p, x)) {
      x->retire |= RETIRED;           /* no new leases; destroyed at its last release */
      oremove(p, r);
      key_refresh(p, k);              /* k may have nothing left to share */
      continue;
    }
    l = lease_alloc(p, r, now);
    if (l == NONE) return 0;
    orefresh(p, r);
    BOTH(p, k, reused, 1);
    g->status = CLIENTPOOL_GRANT_IDLE;
    g->record = r;
    g->lease = l;
    g->lease_gen = p->lea[l].gen;
    g->key = k;
    g->idle = 0;
    g->validate = 0;                  /* validate runs on idle reuse only */
    g->shared = 1;
    return 1;
  }
  return 0;
}

static int room_to_create(const clientpool_t *p, int32_t k) {
  const key_t_ *key = &p->keys[k];
  if (p->cfg.key_max_live >= 0 && key->st.live + key->st.creating >= p->cfg.key_max_live) return 0;
  return p->st.live + p->st.creating < p->cfg.max_live || p->st.idle > 0;
}

/* Reserves a record for k (evicting the least recently used idle record of
 * another key if max_live is reached).  Returns 1 with *g filled, or 0. */
static void rec_init(clientpool_t *p, int32_t r, int32_t k, double now) {
  record_t *x = &p->rec[r];
  x->state = R_CREATING;
  x->key = k;
  x->nleases = 0;
  x->retire = x->doomed = x->refill = 0;
  x->hpos = x->res_lease = NONE;
  x->gl_ahead = 0;
  x->created = now;                   /* (made strictly increasing at clientpool_created) */
}

static int reserve(clientpool_t *p, int32_t k, double now, clientpool_grant_t *g) {
  int32_t r, l;
  if (!room_to_create(p, k)) return 0;
  if (p->st.live + p->st.creating >= p->cfg.max_live) destroy(p, p->g_oldest, CLIENTPOOL_BY_EVICTED);
  r = rec_alloc(p);
  if (r == NONE) return 0;
  rec_init(p, r, k, now);
  l = lease_alloc(p, r, now);
  if (l == NONE) { rec_free(p, r); return 0; }
  p->rec[r].res_lease = l;
  BOTH(p, k, creating, 1);
  g->status = CLIENTPOOL_GRANT_CREATE;
  g->record = r;
  g->lease = l;
  g->lease_gen = p->lea[l].gen;
  g->key = k;
  g->validate = 0;
  g->shared = 0;
  g->idle = 0;
  return 1;
}

/* Any grant for k: an idle record, a share of an open one, a new one. */
static int grant(clientpool_t *p, int32_t k, double now, clientpool_grant_t *g) {
  return take_idle(p, k, now, g) || take_open(p, k, now, g) || reserve(p, k, now, g);
}

/* ---- waiters ---------------------------------------------------------- */

static waiter_t *waiter_get(clientpool_t *p, int32_t w, uint32_t gen) {
  if (w < 0 || w >= p->nwai) return NULL;
  if (p->wai[w].state == W_FREE || p->wai[w].gen != gen) return NULL;
  return &p->wai[w];
}

/* Takes a queued waiter out of its key's queue and ends it with status;
 * the caller fills in the grant fields. */
static void waiter_dequeue(clientpool_t *p, int32_t w, int32_t status, double now) {
  waiter_t *x = &p->wai[w];
  key_t_ *key = &p->keys[x->key];
  if (x->prev != NONE) p->wai[x->prev].next = x->next; else key->wq_head = x->next;
  if (x->next != NONE) p->wai[x->next].prev = x->prev; else key->wq_tail = x->prev;
  hremove(p, &x->hpos);
  x->state = W_DONE;
  x->result = status;
  x->waited = now - x->enq;
  BOTH(p, x->key, waiting, -1);
  BOTH(p, x->key, wait_count, 1);
  BOTH(p, x->key, wait_time, x->waited);
  if (status == CLIENTPOOL_TIMEOUT) BOTH(p, x->key, timeouts, 1);
  if (status == CLIENTPOOL_CANCELLED) BOTH(p, x->key, cancelled, 1);
  key_refresh(p, x->key);
}

static void waiter_free(clientpool_t *p, int32_t w) {
  waiter_t *x = &p->wai[w];
  int32_t k = x->key;
  x->state = W_FREE;
  x->gen++;
  x->next_free = p->wai_free;
  p->wai_free = w;
  p->keys[k].wrefs--;
  key_maybe_free(p, k);
}

static void fill_result(clientpool_t *p, int32_t w, clientpool_grant_t *g) {
  waiter_t *x = &p->wai[w];
  g->status = x->result;
  g->record = x->record;
  g->lease = x->lease;
  g->lease_gen = x->lease_gen;
  g->key = x->key;
  g->validate = x->validate;
  g->shared = x->shared;
  g->idle = x->idle;
  (void)p;
}

/* ---- gates ------------------------------------------------------------ */

static int admits(const clientpool_t *p, int32_t k) {
  return !gate_blocked(&p->gate) && !gate_blocked(&p->keys[k].gate);
}

static void gate_take(gate_t *gt, const clientpool_grant_t *g) {
  if (gt->probe != PROBE_READY) return;
  gt->probe = PROBE_OUT;
  gt->probe_lease = g->lease;
  gt->probe_gen = g->lease_gen;
}

/* A grant was made: a half-open gate lets it through as its probe. */
static void gate_granted(clientpool_t *p, const clientpool_grant_t *g) {
  gate_take(&p->gate, g);
  if (p->keys[g->key].gate.probe == PROBE_READY) {
    gate_take(&p->keys[g->key].gate, g);
    key_refresh(p, g->key);
  }
}

/* The probe lease l ended without a report: the next acquisition probes. */
static int is_probe(const gate_t *gt, int32_t l, uint32_t gen) {
  return gt->probe == PROBE_OUT && gt->probe_lease == l && gt->probe_gen == gen;
}

static void gate_lease_ended(clientpool_t *p, int32_t k, int32_t l, uint32_t gen) {
  if (is_probe(&p->gate, l, gen)) p->gate.probe = PROBE_READY;
  if (is_probe(&p->keys[k].gate, l, gen)) {
    p->keys[k].gate.probe = PROBE_READY;
    key_refresh(p, k);
  }
}

static int room(const clientpool_t *p) {
  return p->st.live + p->st.creating < p->cfg.max_live;
}

/* The key whose head waiter is served next, or NONE: the earliest of the
 * keys holding idle records and, when a slot is free, the keys that must
 * create.  With no slot free, a waiter that must create evicts only when no
 * waiter can take an idle record, or once younger waiters of other keys have
 * taken idle records max_live times while it waited (the bound on
 * starvation, docs/decisions.md).  *held is the key whose head waiter that
 * rule holds back while a younger waiter is served, else NONE. */
static int32_t next_ready(const clientpool_t *p, int32_t *held) {
  int32_t ki, kc;
  *held = NONE;
  if (gate_blocked(&p->gate)) return NONE;
  ki = p->rlen[RH_IDLE] ? p->rheap[RH_IDLE][0] : NONE;
  kc = p->rlen[RH_CREATE] ? p->rheap[RH_CREATE][0] : NONE;
  if (kc != NONE && !room(p)) {
    if (p->st.idle == 0) {
      kc = NONE;
    } else if (ki != NONE) {
      if (kseq(p, kc) > kseq(p, ki)) kc = NONE;
      else if (p->wai[p->keys[kc].wq_head].passed < p->cfg.max_live) { *held = kc; kc = NONE; }
    }
  }
  if (ki == NONE) return kc;
  if (kc == NONE) return ki;
  return kseq(p, kc) < kseq(p, ki) ? kc : ki;
}

/* Serves queued waiters in arrival order while anything they can use is free. */
static void dispatch(clientpool_t *p, double now) {
  while (p->st.leases < p->cfg.max_concurrency) {
    int32_t held, held2, k = next_ready(p, &held), w;
    clientpool_grant_t g;
    waiter_t *x;
    if (k == NONE) break;
    w = p->keys[k].wq_head;
    /* grant may meet only expired records: destroyed, k is re-sorted */
    if (!grant(p, k, now, &g)) {
      if (next_ready(p, &held2) == k && p->keys[k].wq_head == w) break;
      continue;
    }
    if (held != NONE) p->wai[p->keys[held].wq_head].passed++;
    waiter_dequeue(p, w, g.status, now);
    gate_granted(p, &g);
    x = &p->wai[w];
    x->record = g.record;
    x->lease = g.lease;
    x->lease_gen = g.lease_gen;
    x->validate = g.validate;
    x->shared = g.shared;
    x->idle = g.idle;
    push_event(p, CLIENTPOOL_EV_WAKE, w, (int32_t)x->gen, k, 0);
  }
}

/* ---- deadlines -------------------------------------------------------- */

double clientpool_next_deadline(const clientpool_t *p) {
  double d = -1;
  if (p->hlen > 0) d = p->heap[0].t;
  if (has(p->cfg.idle_timeout) && p->g_oldest != NONE) {
    double t = idle_deadline(&p->rec[p->g_oldest], p->cfg.idle_timeout);
    if (d < 0 || t < d) d = t;
  }
  return d;
}

/* Ends every public mutating call: serves waiters and tells the driver about
 * a deadline earlier than its timer. */
static void finish(clientpool_t *p, double now) {
  double d;
  dispatch(p, now);
  d = clientpool_next_deadline(p);
  if (d >= 0 && (p->armed < 0 || d < p->armed)) {
    p->armed = d;
    push_event(p, CLIENTPOOL_EV_TIMER, 0, 0, 0, d);
  }
}

static double clamp(clientpool_t *p, double now) {
  if (!(now >= p->now)) now = p->now;   /* also rejects NaN */
  p->now = now;
  return now;
}

/* ---- public API ------------------------------------------------------- */

static int config_ok(const clientpool_config_t *c) {
  if (c->max_live < 1 || c->max_concurrency < 1 || c->capacity < 1) return 0;
  if (c->min_idle < 0 || c->max_idle < c->min_idle || c->max_idle > c->max_live) return 0;
  if (c->max_waiting < 0) return 0;
  if (c->key_max_live >= 0 && (c->key_max_live < 1 || c->key_max_live > c->max_live)) return 0;
  if (c->key_max_idle >= 0 && c->key_max_idle > c->max_idle) return 0;
  if (c->max_keys == 0) return 0;
  if (!(c->lifetime_jitter >= 0 && c->lifetime_jitter < 1)) return 0;
  return 1;
}

int clientpool_new(const clientpool_config_t *cfg, clientpool_t **out) {
  clientpool_t *p;
  *out = NULL;
  if (!cfg || !config_ok(cfg)) return CLIENTPOOL_EINVAL;
  p = calloc(1, sizeof *p);
  if (!p) return CLIENTPOOL_ENOMEM;
  p->cfg = *cfg;
  p->armed = -1;
  p->rng = cfg->seed ? cfg->seed : 0x9E3779B97F4A7C15ULL;
  p->rec_free = p->lea_free = p->wai_free = p->key_free = NONE;
  p->g_oldest = p->g_newest = NONE;
  p->hold_key = NONE;
  p->retire_before = p->retire_upto = p->last_created = -1;   /* (times are >= 0) */
  p->gate.probe_lease = NONE;
  *out = p;
  return CLIENTPOOL_OK;
}

void clientpool_free(clientpool_t *p) {
  int32_t k;
  if (!p) return;
  for (k = 0; k < p->nkeys; k++) free(p->keys[k].oheap);
  free(p->warm);
  free(p->rec); free(p->lea); free(p->wai); free(p->keys);
  free(p->heap); free(p->rheap[0]); free(p->rheap[1]); free(p->ev);
  free(p);
}

int clientpool_acquire(clientpool_t *p, int32_t k, double now, clientpool_grant_t *g) {
  memset(g, 0, sizeof *g);
  g->key = k;
  now = clamp(p, now);
  if (p->closed) { g->status = CLIENTPOOL_CLOSED; return g->status; }
  if (!key_ok(p, k)) { g->status = CLIENTPOOL_STALE; return g->status; }
  /* expired records destroyed on the way may empty k: it must survive this
   * call (and, on MUST_WAIT, until the driver queues or forgets) */
  p->hold_key = k;
  if (!admits(p, k)) {
    if (p->cfg.pause_fail) {
      BOTH(p, k, rejected, 1);
      g->status = CLIENTPOOL_PAUSED;
    } else if (p->st.waiting >= p->cfg.max_waiting) {
      BOTH(p, k, rejected, 1);
      g->status = CLIENTPOOL_FULL;
    } else {
      g->status = CLIENTPOOL_MUST_WAIT;
    }
  /* never barge past queued waiters of this key, nor past the concurrency cap */
  } else if (p->keys[k].wq_head == NONE && p->st.leases < p->cfg.max_concurrency &&
             grant(p, k, now, g)) {
    gate_granted(p, g);
  } else if (p->st.waiting >= p->cfg.max_waiting) {
    BOTH(p, k, rejected, 1);
    g->status = CLIENTPOOL_FULL;
  } else {
    g->status = CLIENTPOOL_MUST_WAIT;
  }
  finish(p, now);
  p->hold_key = NONE;
  if (g->status == CLIENTPOOL_FULL || g->status == CLIENTPOOL_PAUSED) key_maybe_free(p, k);
  return g->status;
}

int32_t clientpool_wait(clientpool_t *p, int32_t k, double deadline, double now, uint32_t *gen) {
  int32_t w;
  waiter_t *x;
  key_t_ *key;
  now = clamp(p, now);
  if (p->closed) return -CLIENTPOOL_CLOSED;
  if (!key_ok(p, k)) return -CLIENTPOOL_STALE;
  if (p->st.waiting >= p->cfg.max_waiting) {
    BOTH(p, k, rejected, 1);
    key_maybe_free(p, k);
    return -CLIENTPOOL_FULL;
  }
  if (p->wai_free == NONE) {
    int32_t cap = p->nwai, i;
    waiter_t *q = grow(p->wai, &cap, sizeof *q, p->nwai + 1);
    if (!q) return CLIENTPOOL_ENOMEM;
    p->wai = q;
    for (i = cap - 1; i >= p->nwai; i--) {
      memset(&q[i], 0, sizeof q[i]);
      q[i].next_free = p->wai_free;
      p->wai_free = i;
    }
    p->nwai = cap;
  }
  w = p->wai_free;
  x = &p->wai[w];
  p->wai_free = x->next_free;
  x->state = W_QUEUED;
  x->key = k;
  p->keys[k].wrefs++;
  x->result = CLIENTPOOL_PENDING;
  x->record = x->lease = NONE;
  x->lease_gen = 0;
  x->validate = 0;
  x->seq = ++p->seq;
  x->passed = 0;
  x->enq = now;
  x->idle = x->waited = 0;
  x->hpos = NONE;
  key = &p->keys[k];
  x->next = NONE;
  x->prev = key->wq_tail;
  if (key->wq_tail != NONE) p->wai[key->wq_tail].next = w; else key->wq_head = w;
  key->wq_tail = w;
  BOTH(p, k, waiting, 1);
  if (has(deadline) && hpush(p, deadline, H_WAITER, w) != 0) x->hpos = NONE;
  key_refresh(p, k);
  *gen = x->gen;
  finish(p, now);
  return w;
}

/* Record r (generation gen, key k) just became idle, and dispatch served
 * whom it could: if it is still idle past max_idle (or its key's), it is
 * closed. A release and a refill that completes keep the same rule. */
static void close_past_max_idle(clientpool_t *p, int32_t r, uint32_t gen, int32_t k) {
  const record_t *x = &p->rec[r];      /* (dispatch may have grown the array) */
  if (x->state == R_IDLE && x->gen == gen &&
      (p->st.idle > p->cfg.max_idle ||
       (p->cfg.key_max_idle >= 0 && p->keys[k].st.idle > p->cfg.key_max_idle)))
    destroy(p, r, CLIENTPOOL_BY_MAX_IDLE);
}

/* Gives a reservation back: its lease and record slot are freed. */
static void forfeit(clientpool_t *p, int32_t r, int failed) {
  record_t *x = &p->rec[r];
  int32_t k = x->key;
  BOTH(p, k, creating, -1);
  if (failed) BOTH(p, k, create_failed, 1);
  if (x->refill) { p->keys[k].refilling--; p->refilling--; }
  else {
    gate_lease_ended(p, k, x->res_lease, p->lea[x->res_lease].gen);
    lease_free(p, x->res_lease);
  }
  rec_free(p, r);
  key_refresh(p, k);
  key_maybe_free(p, k);
}

int clientpool_created(clientpool_t *p, int32_t r, int32_t ok, double now) {
  record_t *x;
  int32_t k;
  now = clamp(p, now);
  if (r < 0 || r >= p->nrec || p->rec[r].state != R_CREATING) return CLIENTPOOL_STALE;
  x = &p->rec[r];
  k = x->key;
  if (!ok) {
    forfeit(p, r, 1);
    finish(p, now);
    return 0;
  }
  BOTH(p, k, creating, -1);
  /* same-instant records still get distinct times: retire_upto and
   * retire_before(-1) go by creation order */
  x->created = p->last_created = now > p->last_created ? now : nextafter(p->last_created, HUGE_VAL);
  x->res_lease = NONE;                 /* (its lease is the caller's now) */
  if (has(p->cfg.max_lifetime) &&
      hpush(p, now + p->cfg.max_lifetime * (1.0 - p->cfg.lifetime_jitter * rnd(p)), H_LIFETIME, r) != 0) {
    x->hpos = NONE;
    x->retire |= LIFETIME_OVER;        /* out of memory: its expiry is not kept, so it ends early */
  }
  BOTH(p, k, live, 1);
  BOTH(p, k, opened, 1);
  push_event(p, CLIENTPOOL_EV_CREATED, r, x->refill, k, 0);
  if (x->refill) {                     /* the warm floor's: straight to idle */
    p->keys[k].refilling--;
    p->refilling--;
    x->refill = 0;
    x->state = R_LEASED;               /* (not idle yet: destroy needs no unlink) */
    x->opos = NONE;
    if (p->closed) destroy(p, r, CLIENTPOOL_BY_DRAIN);
    else {
      uint32_t gen = x->gen;
      idle_push(p, r, now);
      key_refresh(p, k);
      /* releases may have filled max_idle while it was created */
      dispatch(p, now);
      close_past_max_idle(p, r, gen, k);
    }
  } else {
    x->state = R_LEASED;
    x->opos = NONE;
    BOTH(p, k, active, 1);
    if (p->cfg.capacity > 1) { orefresh(p, r); key_refresh(p, k); }
  }
  finish(p, now);
  return 0;
}

/* Ends lease l; reason < 0 asks for reuse. */
/* Why a record whose last lease ends for reuse is closed all the same (a
 * CLIENTPOOL_BY_* reason), or -1 when it is kept: release() and
 * clientpool_release_closes() decide alike. */
static int32_t closing_reason(const clientpool_t *p, const record_t *x, double now) {
  if (x->doomed) return x->doomed - 1;
  if (p->closed) return CLIENTPOOL_BY_DRAIN;
  if (lifetime_over(p, x, now)) return CLIENTPOOL_BY_LIFETIME;
  if (x->retire || retired_by_age(p, x)) return CLIENTPOOL_BY_RETIRED;
  return -1;
}

static void release(clientpool_t *p, int32_t l, int32_t reason, double now) {
  int32_t r = p->lea[l].record, k;
  uint32_t gen;
  record_t *x = &p->rec[r];
  k = x->key;
  gate_lease_ended(p, k, l, p->lea[l].gen);
  lease_free(p, l);
  if (x->nleases > 0) {                /* co-holders keep the record... */
    if (reason >= 0 && !x->doomed) {   /* ...but it is lost for all of them */
      x->doomed = reason + 1;
      push_event(p, CLIENTPOOL_EV_LOST, r, reason, k, 0);
    }
    orefresh(p, r);
    key_refresh(p, k);
    return;
  }
  BOTH(p, k, active, -1);
  if (reason < 0) reason = closing_reason(p, x, now);
  if (reason >= 0) {
    destroy(p, r, reason);
    return;
  }
  oremove(p, r);
  idle_push(p, r, now);
  key_refresh(p, k);
  gen = x->gen;
  dispatch(p, now);                     /* a waiter of k may take it at once */
  close_past_max_idle(p, r, gen, k);
}

int clientpool_release(clientpool_t *p, int32_t l, uint32_t gen, int32_t reason, double now) {
  lease_t *x;
  now = clamp(p, now);
  x = lease_get(p, l, gen);
  if (!x || p->rec[x->record].state != R_LEASED) return CLIENTPOOL_STALE;
  if (reason >= CLIENTPOOL_BY_COUNT) reason = CLIENTPOOL_BY_ERROR;
  release(p, l, reason, now);
  finish(p, now);
  return 0;
}

int clientpool_leak(clientpool_t *p, int32_t l, uint32_t gen, double now) {
  lease_t *x;
  int32_t k, r;
  now = clamp(p, now);
  x = lease_get(p, l, gen);
  if (!x) return CLIENTPOOL_STALE;
  r = x->record;
  k = p->rec[r].key;
  BOTH(p, k, leaked, 1);
  push_event(p, CLIENTPOOL_EV_LEAK, -1, 0, k, now);   /* one report per lease */
  /* a reservation whose creator died: give the capacity back */
  if (p->rec[r].state == R_CREATING) forfeit(p, r, 0);
  else release(p, l, CLIENTPOOL_BY_LEAKED, now);
  finish(p, now);
  return 0;
}

int clientpool_claim(clientpool_t *p, int32_t w, uint32_t gen, double now, clientpool_grant_t *g) {
  waiter_t *x = waiter_get(p, w, gen);
  (void)now;
  memset(g, 0, sizeof *g);
  if (!x) { g->status = CLIENTPOOL_STALE; return g->status; }
  if (x->state == W_QUEUED) {
    g->status = CLIENTPOOL_PENDING;
    g->key = x->key;
    return g->status;
  }
  fill_result(p, w, g);
  g->waited = x->waited;
  waiter_free(p, w);
  return g->status;
}

int clientpool_cancel(clientpool_t *p, int32_t w, uint32_t gen, int32_t status, double now,
                      clientpool_grant_t *g) {
  waiter_t *x = waiter_get(p, w, gen);
  now = clamp(p, now);
  if (x && x->state == W_QUEUED) {
    if (status != CLIENTPOOL_TIMEOUT) status = CLIENTPOOL_CANCELLED;
    waiter_dequeue(p, w, status, now);
  }
  clientpool_claim(p, w, gen, now, g);
  finish(p, now);
  return g->status;
}

int clientpool_abandon(clientpool_t *p, int32_t w, uint32_t gen, double now) {
  waiter_t *x = waiter_get(p, w, gen);
  now = clamp(p, now);
  if (!x) return CLIENTPOOL_STALE;
  if (x->state == W_QUEUED) {
    waiter_dequeue(p, w, CLIENTPOOL_CANCELLED, now);
  } else if (x->result == CLIENTPOOL_GRANT_IDLE || x->result == CLIENTPOOL_GRANT_CREATE) {
    BOTH(p, x->key, cancelled, 1);
    if (x->result == CLIENTPOOL_GRANT_CREATE) forfeit(p, x->record, 0);
    else if (lease_get(p, x->lease, x->lease_gen)) {
      BOTH(p, x->key, reused, -1);     /* handed back unused */
      release(p, x->lease, -1, now);
    }
  }
  waiter_free(p, w);
  finish(p, now);
  return 0;
}

int clientpool_retire(clientpool_t *p, int32_t r, double now) {
  now = clamp(p, now);
  if (r < 0 || r >= p->nrec || p->rec[r].state == R_FREE) return CLIENTPOOL_STALE;
  p->rec[r].retire |= RETIRED;
  if (p->rec[r].state == R_IDLE) destroy(p, r, CLIENTPOOL_BY_RETIRED);
  else if (p->rec[r].state == R_LEASED && p->rec[r].opos != NONE) {
    oremove(p, r);
    key_refresh(p, p->rec[r].key);
  }
  finish(p, now);
  return 0;
}

int clientpool_retire_before(clientpool_t *p, int32_t k, double before, double now) {
  int32_t r;
  now = clamp(p, now);
  if (k >= 0 && !key_ok(p, k)) return CLIENTPOOL_EINVAL;
  if (k < 0) {
    if (before < 0) p->retire_upto = p->last_created;
    else if (before > p->retire_before) p->retire_before = before;
    for (r = p->g_oldest; r != NONE;) {
      int32_t next = p->rec[r].gnext;
      if (retired_by_age(p, &p->rec[r])) destroy(p, r, CLIENTPOOL_BY_RETIRED);
      r = next;
    }
  } else {
    if (before < 0) p->keys[k].retire_upto = p->last_created;
    else if (before > p->keys[k].retire_before) p->keys[k].retire_before = before;
    p->hold_key = k;
    for (r = p->keys[k].idle_top; r != NONE;) {
      int32_t next = p->rec[r].knext;
      if (retired_by_age(p, &p->rec[r])) destroy(p, r, CLIENTPOOL_BY_RETIRED);
      r = next;
    }
    p->hold_key = NONE;
    key_maybe_free(p, k);
  }
  finish(p, now);
  return 0;
}

int clientpool_regrant(clientpool_t *p, int32_t l, uint32_t gen, double now, clientpool_grant_t *g) {
  lease_t *x;
  int32_t k;
  memset(g, 0, sizeof *g);
  now = clamp(p, now);
  x = lease_get(p, l, gen);
  if (!x || p->rec[x->record].state != R_LEASED) { g->status = CLIENTPOOL_STALE; return g->status; }
  k = p->rec[x->record].key;
  g->key = k;
  p->hold_key = k;
  /* a destroy dispatches nothing: the room it frees is still there below */
  release(p, l, CLIENTPOOL_BY_INVALID, now);
  if (p->closed) g->status = CLIENTPOOL_CLOSED;
  /* paused meanwhile (validate may yield): the caller queues like anyone */
  else if (!admits(p, k)) g->status = CLIENTPOOL_MUST_WAIT;
  else if (grant(p, k, now, g)) gate_granted(p, g);
  else g->status = CLIENTPOOL_MUST_WAIT;
  /* k may have waiters: the grant changed what it can take or create */
  key_refresh(p, k);
  finish(p, now);
  p->hold_key = NONE;
  if (g->status != CLIENTPOOL_GRANT_IDLE && g->status != CLIENTPOOL_GRANT_CREATE) key_maybe_free(p, k);
  return g->status;
}

int clientpool_release_closes(const clientpool_t *p, int32_t l, uint32_t gen, double now) {
  const record_t *x;
  if (l < 0 || l >= p->nlea || p->lea[l].record == NONE || p->lea[l].gen != gen) return -CLIENTPOOL_STALE;
  if (!(now >= p->now)) now = p->now;  /* as clamp(), without moving the clock */
  x = &p->rec[p->lea[l].record];
  if (x->state != R_LEASED || x->nleases > 1) return 0;   /* co-holders keep it */
  return closing_reason(p, x, now) >= 0;
}

int clientpool_retire_upto(clientpool_t *p, int32_t r, double now) {
  int32_t k, i;
  record_t *x;
  now = clamp(p, now);
  if (r < 0 || r >= p->nrec) return CLIENTPOOL_EINVAL;
  x = &p->rec[r];
  if (x->state != R_IDLE && x->state != R_LEASED) return CLIENTPOOL_EINVAL;
  k = x->key;
  if (x->created > p->keys[k].retire_upto) p->keys[k].retire_upto = x->created;
  p->hold_key = k;
  for (i = p->keys[k].idle_top; i != NONE;) {
    int32_t next = p->rec[i].knext;
    if (retired_by_age(p, &p->rec[i])) destroy(p, i, CLIENTPOOL_BY_RETIRED);
    i = next;
  }
  p->hold_key = NONE;
  key_maybe_free(p, k);
  finish(p, now);
  return 0;
}

static gate_t *gate_of(clientpool_t *p, int32_t k) {
  if (k < 0) return &p->gate;
  return key_ok(p, k) ? &p->keys[k].gate : NULL;
}

int clientpool_pause(clientpool_t *p, int32_t k, double now) {
  gate_t *gt = gate_of(p, k);
  now = clamp(p, now);
  if (!gt) return CLIENTPOOL_EINVAL;
  gt->paused = 1;
  gt->probe = PROBE_NONE;
  if (k >= 0) key_refresh(p, k);
  finish(p, now);
  return 0;
}

int clientpool_resume(clientpool_t *p, int32_t k, int32_t probe, double now) {
  gate_t *gt = gate_of(p, k);
  now = clamp(p, now);
  if (!gt) return CLIENTPOOL_EINVAL;
  if (gt->paused) {
    gt->paused = 0;
    gt->probe = probe ? PROBE_READY : PROBE_NONE;
  }
  if (k >= 0) key_refresh(p, k);
  finish(p, now);
  return 0;
}

int clientpool_probe_ok(clientpool_t *p, int32_t l, uint32_t gen, double now) {
  lease_t *x;
  int32_t k, was = 0;
  now = clamp(p, now);
  x = lease_get(p, l, gen);
  if (!x) return 0;
  k = p->rec[x->record].key;
  if (is_probe(&p->gate, l, gen)) { p->gate.probe = PROBE_NONE; was = 1; }
  if (is_probe(&p->keys[k].gate, l, gen)) { p->keys[k].gate.probe = PROBE_NONE; was = 1; key_refresh(p, k); }
  finish(p, now);
  return was;
}

int clientpool_gate(const clientpool_t *p, int32_t k) {
  const gate_t *gt = k < 0 ? &p->gate : (key_ok(p, k) ? &p->keys[k].gate : NULL);
  if (!gt) return 0;
  return gt->paused ? 1 : gt->probe != PROBE_NONE ? 2 : 0;
}

void clientpool_floor(clientpool_t *p, int32_t on, double now) {
  int32_t i;
  now = clamp(p, now);
  p->floor_on = on && !p->closed;
  p->refill_signalled = 0;
  for (i = 0; i < p->nwarm; i++) floor_check(p, p->warm[i]);
  finish(p, now);
}

int32_t clientpool_refill(clientpool_t *p, double now, int32_t *key) {
  int32_t i;
  now = clamp(p, now);
  *key = NONE;
  if (p->floor_on && !p->closed && room(p)) {
    for (i = 0; i < p->nwarm; i++) {
      int32_t k = p->warm[i], r;
      const key_t_ *kk = &p->keys[k];
      if (floor_deficit(p, k) <= 0) continue;
      if (p->cfg.key_max_live >= 0 && kk->st.live + kk->st.creating >= p->cfg.key_max_live) continue;
      r = rec_alloc(p);
      if (r == NONE) break;
      rec_init(p, r, k, now);
      p->rec[r].refill = 1;
      p->keys[k].refilling++;
      p->refilling++;
      BOTH(p, k, creating, 1);
      key_refresh(p, k);              /* k may have reached its cap */
      *key = k;
      finish(p, now);
      return r;
    }
  }
  p->refill_signalled = 0;
  finish(p, now);
  return NONE;
}

void clientpool_tick(clientpool_t *p, double now) {
  now = clamp(p, now);
  p->armed = -1;
  for (;;) {
    if (has(p->cfg.idle_timeout) && p->g_oldest != NONE &&
        now >= idle_deadline(&p->rec[p->g_oldest], p->cfg.idle_timeout)) {
      int32_t r = p->g_oldest;
      if (floor_keeps(p, &p->rec[r])) glist_renew(p, r, now);
      else destroy(p, r, CLIENTPOOL_BY_IDLE);
      continue;
    }
    if (p->hlen > 0 && p->heap[0].t <= now) {
      hent_t e = p->heap[0];
      hremove(p, hpos_of(p, &p->heap[0]));
      if (e.kind == H_WAITER) {
        waiter_dequeue(p, e.idx, CLIENTPOOL_TIMEOUT, now);
        push_event(p, CLIENTPOOL_EV_WAKE, e.idx, (int32_t)p->wai[e.idx].gen, p->wai[e.idx].key, 0);
      } else if (e.kind == H_LIFETIME) {
        /* a leased record is retired at its release; a shared one takes
         * no new lease from now on */
        if (p->rec[e.idx].state == R_IDLE) destroy(p, e.idx, CLIENTPOOL_BY_LIFETIME);
        else if (p->rec[e.idx].state == R_LEASED) {
          p->rec[e.idx].retire |= LIFETIME_OVER;
          oremove(p, e.idx);
          key_refresh(p, p->rec[e.idx].key);
        }
      } else {
        lease_t *x = &p->lea[e.idx];
        push_event(p, CLIENTPOOL_EV_LEAK, e.idx, (int32_t)x->gen, p->rec[x->record].key, x->since);
      }
      continue;
    }
    break;
  }
  finish(p, now);
}

void clientpool_close(clientpool_t *p, double now) {
  int32_t k;
  now = clamp(p, now);
  if (p->closed) return;
  p->closed = 1;
  p->floor_on = 0;
  p->nwarm = 0;
  for (k = 0; k < p->nkeys; k++) {
    key_t_ *key = &p->keys[k];
    if (!key->used) continue;
    key->pinned = 0;
    while (key->wq_head != NONE) {
      int32_t w = key->wq_head;
      waiter_dequeue(p, w, CLIENTPOOL_CLOSED, now);
      push_event(p, CLIENTPOOL_EV_WAKE, w, (int32_t)p->wai[w].gen, k, 0);
    }
    while (key->idle_top != NONE) destroy(p, key->idle_top, CLIENTPOOL_BY_DRAIN);
    key_maybe_free(p, k);
  }
  finish(p, now);
}

int clientpool_next_event(clientpool_t *p, clientpool_event_t *ev) {
  if (p->evlen == 0) { ev->type = CLIENTPOOL_EV_NONE; return ev->type; }
  *ev = p->ev[p->evhead];
  p->evhead = (p->evhead + 1) % p->evcap;
  p->evlen--;
  /* the driver knows now: the id may be reused (rec_bury, key_maybe_free) */
  if (ev->type == CLIENTPOOL_EV_DESTROY) rec_reuse(p, ev->a);
  else if (ev->type == CLIENTPOOL_EV_KEY_FREE) key_reuse(p, ev->a);
  return ev->type;
}

int32_t clientpool_pending(const clientpool_t *p) { return p->evlen; }

int clientpool_stats(const clientpool_t *p, int32_t k, clientpool_stats_t *s) {
  if (k < 0) { *s = p->st; return 0; }
  if (!key_ok(p, k)) return CLIENTPOOL_EINVAL;
  *s = p->keys[k].st;
  return 0;
}

int32_t clientpool_record_key(const clientpool_t *p, int32_t r) {
  if (r < 0 || r >= p->nrec || p->rec[r].state == R_FREE) return NONE;
  return p->rec[r].key;
}

double clientpool_record_created(const clientpool_t *p, int32_t r) {
  if (r < 0 || r >= p->nrec || p->rec[r].state == R_FREE) return -1;
  return p->rec[r].created;
}

double clientpool_lease_age(const clientpool_t *p, int32_t l, uint32_t gen, double now) {
  if (l < 0 || l >= p->nlea || p->lea[l].record == NONE || p->lea[l].gen != gen) return -1;
  return now - p->lea[l].since;
}

int clientpool_is_closed(const clientpool_t *p) { return p->closed; }

/* ---- invariants (tests and fuzzing) ----------------------------------- */

#define CHECK(cond, ...) do { if (!(cond)) { snprintf(buf, n, __VA_ARGS__); return -1; } } while (0)

static int check_counts(const clientpool_stats_t *a, const clientpool_stats_t *b,
                        const char *what, char *buf, size_t n) {
  CHECK(a->live == b->live, "%s: live %d, counted %d", what, a->live, b->live);
  CHECK(a->idle == b->idle, "%s: idle %d, counted %d", what, a->idle, b->idle);
  CHECK(a->active == b->active, "%s: active %d, counted %d", what, a->active, b->active);
  CHECK(a->leases == b->leases, "%s: leases %d, counted %d", what, a->leases, b->leases);
  CHECK(a->creating == b->creating, "%s: creating %d, counted %d", what, a->creating, b->creating);
  CHECK(a->waiting == b->waiting, "%s: waiting %d, counted %d", what, a->waiting, b->waiting);
  CHECK(a->opened - a->closed == a->live, "%s: opened - closed != live", what);
  return 0;
}

int clientpool_check(const clientpool_t *p, char *buf, size_t n) {
  clientpool_stats_t tot, *per;
  int32_t i, k, used = 0, ready = 0, refilling = 0;
  int h;
  const clientpool_config_t *c = &p->cfg;
  memset(&tot, 0, sizeof tot);
  per = calloc((size_t)(p->nkeys ? p->nkeys : 1), sizeof *per);
  CHECK(per != NULL, "out of memory");
#define FAIL(...) do { snprintf(buf, n, __VA_ARGS__); free(per); return -1; } while (0)
  for (i = 0; i < p->nrec; i++) {
    const record_t *x = &p->rec[i];
    clientpool_stats_t *s;
    if (x->state == R_FREE) continue;
    if (!key_ok(p, x->key)) FAIL("record %d on dead key %d", i, x->key);
    s = &per[x->key];
    if (x->state == R_CREATING) {
      s->creating++; tot.creating++;
      if (x->refill) s->rejected++;      /* (used here to count refills) */
      continue;
    }
    if (x->nleases > c->capacity) FAIL("record %d carries %d leases > capacity", i, x->nleases);
    {
      int open = x->state == R_LEASED && x->nleases < c->capacity && !x->doomed && !x->retire;
      int in_heap = x->state == R_LEASED && x->opos != NONE;
      if (open != in_heap && !(open && c->capacity == 1))
        FAIL("record %d open-heap membership wrong", i);
      if (in_heap && p->keys[x->key].oheap[x->opos] != i) FAIL("record %d open-heap position", i);
    }
    s->live++; tot.live++;
    if (x->state == R_IDLE) {
      s->idle++; tot.idle++;
      if (x->nleases != 0) FAIL("idle record %d has %d leases", i, x->nleases);
    } else {
      if (x->nleases < 1) FAIL("leased record %d has no lease", i);
      s->active++; tot.active++;
    }
  }
  for (i = 0; i < p->nlea; i++) {
    const lease_t *x = &p->lea[i];
    if (x->record == NONE) continue;
    if (p->rec[x->record].state == R_FREE || p->rec[x->record].state == R_IDLE)
      FAIL("lease %d points at record %d in state %d", i, x->record, p->rec[x->record].state);
    per[p->rec[x->record].key].leases++; tot.leases++;
  }
  for (i = 0; i < p->nwai; i++) {
    const waiter_t *x = &p->wai[i];
    if (x->state != W_QUEUED) continue;
    per[x->key].waiting++; tot.waiting++;
  }
  tot.opened = p->st.opened; tot.closed = p->st.closed;
  if (check_counts(&p->st, &tot, "pool", buf, n)) { free(per); return -1; }
  for (k = 0; k < p->nkeys; k++) {
    const key_t_ *key = &p->keys[k];
    int32_t w, last = NONE, cnt = 0;
    uint64_t prev = 0;
    if (!key->used) continue;
    used++;
    if (per[k].rejected != key->refilling) FAIL("key %d refilling %d, counted %g", k, key->refilling, per[k].rejected);
    refilling += key->refilling;
    if (c->key_max_idle >= 0 && key->st.idle > c->key_max_idle) FAIL("key %d over its max_idle", k);
    per[k].opened = key->st.opened; per[k].closed = key->st.closed;
    if (check_counts(&key->st, &per[k], "key", buf, n)) { free(per); return -1; }
    if (c->key_max_live >= 0 && key->st.live + key->st.creating > c->key_max_live)
      FAIL("key %d over its max_live", k);
    for (w = key->wq_head; w != NONE; w = p->wai[w].next) {
      if (p->wai[w].prev != last) FAIL("key %d queue broken", k);
      if (p->wai[w].seq <= prev) FAIL("key %d queue out of order", k);
      prev = p->wai[w].seq; last = w; cnt++;
    }
    if (last != key->wq_tail) FAIL("key %d queue tail wrong", k);
    cnt = 0;
    for (w = key->idle_top; w != NONE; w = p->rec[w].knext) {
      if (p->rec[w].state != R_IDLE || p->rec[w].key != k) FAIL("key %d idle stack broken", k);
      cnt++;
    }
    if (cnt != key->st.idle) FAIL("key %d idle stack holds %d, counted %d", k, cnt, key->st.idle);
    if (key->rheap != key_ready(p, k) || (key->rpos == NONE) != (key->rheap == NONE))
      FAIL("key %d ready-heap membership wrong", k);
    if (key->rpos != NONE) ready++;
  }
  free(per);
#undef FAIL
  CHECK(used == p->keys_used, "keys used %d, counted %d", p->keys_used, used);
  CHECK(c->max_keys < 0 || used <= c->max_keys, "more than max_keys keys");
  CHECK(ready == p->rlen[0] + p->rlen[1], "ready heaps hold %d, counted %d",
        p->rlen[0] + p->rlen[1], ready);
  CHECK(p->st.live + p->st.creating <= c->max_live, "live %d + creating %d > max_live %d",
        p->st.live, p->st.creating, c->max_live);
  CHECK(p->st.leases <= c->max_concurrency, "leases %d > max_concurrency", p->st.leases);
  CHECK(p->st.idle <= c->max_idle, "idle %d > max_idle %d", p->st.idle, c->max_idle);
  CHECK(refilling == p->refilling, "refills in flight %d, counted %d", p->refilling, refilling);
  CHECK(p->st.waiting <= c->max_waiting, "waiting %d > max_waiting", p->st.waiting);
  for (h = 0; h < 2; h++) {
    const int32_t *a = p->rheap[h];
    for (i = 0; i < p->rlen[h]; i++) {
      int32_t l = 2 * i + 1;
      CHECK(p->keys[a[i]].rpos == i && p->keys[a[i]].rheap == h, "ready heap position wrong");
      if (l < p->rlen[h]) CHECK(kseq(p, a[i]) <= kseq(p, a[l]), "ready heap order");
      if (l + 1 < p->rlen[h]) CHECK(kseq(p, a[i]) <= kseq(p, a[l + 1]), "ready heap order");
    }
  }
  for (i = 0; i < p->hlen; i++) {
    int32_t l = 2 * i + 1;
    CHECK(*hpos_of((clientpool_t *)p, &p->heap[i]) == i, "deadline heap position wrong");
    if (l < p->hlen) CHECK(p->heap[i].t <= p->heap[l].t, "deadline heap order");
    if (l + 1 < p->hlen) CHECK(p->heap[i].t <= p->heap[l + 1].t, "deadline heap order");
  }
  /* after dispatch nothing queued could have been served */
  {
    int32_t held;
    CHECK(p->closed || p->st.leases >= c->max_concurrency || next_ready(p, &held) == NONE,
          "a servable waiter is left queued");
  }
  return 0;
}
