/*
 * engine.c - the clientpool state machine.
 *
 * No Lua, no I/O, no clock reads, no callbacks: see clientpool.h for the
 * contract and docs/decisions.md for the data-structure choices.
 */
#include "engine.h"
#include "fleet.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NONE (-1)

/* The fast path's helpers are inlined into it (issue 17: a call each was a
 * third of the engine's pair); elsewhere the compiler decides. */
#if defined(__GNUC__) || defined(__clang__)
#define HOT static inline __attribute__((always_inline))
#else
#define HOT static inline
#endif

enum { R_FREE = 0, R_CREATING, R_IDLE, R_LEASED, R_CLOSING, R_CHECKING };
enum { W_FREE = 0, W_QUEUED, W_DONE };
enum { H_LIFETIME = 0, H_WAITER, H_LEASE, H_BACKOFF, H_KEEPALIVE };
enum { RH_IDLE = 0, RH_CREATE = 1 };
enum { PROBE_NONE = 0, PROBE_READY, PROBE_OUT };
/* Create backoff of a key: none; a window in which it creates nothing;
 * after it, one create at a time until one succeeds (its deadline: when the
 * failures are forgotten, unless a create is in flight). */
enum { B_NONE = 0, B_WINDOW, B_PROBE };
/* What the fleet refused (the fleet section): the pool's marks, a key's. */
enum { FM_LIVE = CLIENTPOOL_BLOCKED_LIVE, FM_LEASE = CLIENTPOOL_BLOCKED_LEASE, FM_TURN = CLIENTPOOL_BLOCKED_TURN };
enum { KM_LIVE = 1, KM_FLOOR = 2 };

/* Admission gate of the pool or of a key: paused, or half-open (one probe
 * admitted, the rest held until its lease reports a continuing outcome);
 * fpaused: the fleet's gate, as the driver mirrors it (clientpool_gate_fleet);
 * flapsed (the pool's gate only): the fleet's validity passed (fl_lapse_check). */
typedef struct gate {
  int32_t paused;
  int32_t fpaused;
  int32_t flapsed;
  int32_t probe;
  int32_t probe_lease;
  uint32_t probe_gen;
} gate_t;

/* 56 bytes: B4 asks for at most 64 per idle client, and the slot array
 * grows by an eighth.  Fields that only one state needs share storage. */
typedef struct record {
  uint32_t gen;
  int32_t key;
  union {
    int32_t nleases;     /* R_LEASED, R_CREATING (0), R_CLOSING (0) */
    int32_t kpos;        /* R_IDLE, R_CHECKING: its keepalive entry (p->ka), or NONE */
  };
  int32_t hpos;          /* lifetime deadline entry (its time is the expiry), or NONE */
  float gl_ahead;        /* idle: how far the warm floor moved the idle-expiry clock past
                          * idle_since (rounded up: expiry is never early) */
  uint8_t state;
  uint8_t retire;        /* RETIRED | LIFETIME_OVER: no new leases; destroyed at release */
  uint8_t doomed;        /* a co-holder lost it (reason + 1): destroyed when the last lease ends */
  union {
    uint8_t refill;      /* R_CREATING: a warm-floor reservation (no lease) */
    uint8_t seen;        /* R_CLOSING: its EV_DESTROY has been read */
    uint8_t fidle;       /* R_IDLE, R_CHECKING: it holds a fleet IDLE unit (always, outside
                          * release(): see fl_keep_idle) */
  };
  double created;        /* strictly increasing, so it is also the creation order */
  union {
    struct {             /* R_IDLE, R_CHECKING (off its key's stack, on the pool's list) */
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

/* record_t.retire bits; IDLE_OVER: checking, past idle_timeout (off the
 * pool-wide list): destroyed when its keepalive is reported */
enum { RETIRED = 1, LIFETIME_OVER = 2, IDLE_OVER = 4 };

typedef struct lease {
  uint32_t gen;
  int32_t record;        /* NONE when free */
  int32_t hpos;          /* leak_threshold entry, or NONE */
  union {
    int32_t next_free;   /* free */
    int32_t checkout;    /* held: 1 when a checkout holds it (clientpool_lease_checkout) */
  };
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
  int32_t wpos;          /* position in its key's queue (a heap by place), or NONE */
  int32_t hpos;          /* deadline entry, or NONE */
  int32_t next_free;
  int32_t passed;        /* times a younger waiter of another key took an idle record first */
  int64_t seq;           /* its arrival number */
  int64_t order;         /* its place: seq - priority * CLIENTPOOL_PRIORITY_STEP, or below
                          * every place for a caller that kept its own (clientpool_regrant) */
  double enq, idle, waited;
} waiter_t;

typedef struct key {
  int32_t used, pinned;
  int32_t idle_top;      /* top of the LIFO idle stack */
  int32_t *wheap, wlen, wcap;  /* queued waiters, a heap by place (order, then seq) */
  int32_t rpos;          /* position in its ready heap, or NONE */
  int32_t rheap;         /* which ready heap: RH_IDLE, RH_CREATE or NONE */
  int32_t next_free;
  int32_t refilling;     /* warm-floor reservations in flight */
  int32_t wrefs;         /* waiter slots naming this key (queued or unclaimed) */
  int32_t fails;         /* creates failed in a row (create backoff) */
  int32_t bstate;        /* B_NONE, B_WINDOW, B_PROBE */
  int32_t bpos;          /* its backoff deadline entry, or NONE */
  int32_t cap_live;      /* clientpool_key_caps: this key's max_live, or NONE (the pool's) */
  int32_t cap_idle;      /* and its max_idle, or NONE */
  int32_t lim_live;      /* > cap after a cap was lowered: what the key held then (0: none) */
  int32_t nchecking;     /* its records out for a keepalive validate (counted idle) */
  int32_t *oheap, olen, ocap;  /* open records (capacity > 1) by fewest leases */
  int32_t fslot;         /* its fleet key slot (clientpool_key_fleet), or NONE */
  int32_t fmark;         /* KM_* : what the fleet refused it (see the fleet section) */
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

/* A binary heap of deadlines, earliest first; each entry's owner keeps its
 * position (hpos_of). */
typedef struct heap {
  hent_t *a;
  int32_t len, cap;
} heap_t;

struct clientpool {
  clientpool_config_t cfg;
  int32_t closed;
  double now;            /* the latest time seen: time never runs backwards */
  double armed;          /* the deadline the driver's timer is set for */
  uint64_t rng;
  int64_t seq;           /* arrivals so far */

  record_t *rec; int32_t nrec, rec_free;
  lease_t *lea; int32_t nlea, lea_free;
  waiter_t *wai; int32_t nwai, wai_free;
  int32_t wai_used;             /* waiter slots not free: queued, or ended and not yet claimed */
  key_t_ *keys; int32_t nkeys, key_free, keys_used;
  int32_t g_oldest, g_newest;   /* pool-wide idle list */
  int32_t hold_key;             /* the key an acquire works on: not forgotten meanwhile */
  int32_t kept;                 /* the key whose regrant caller keeps its place, or NONE */
  /* after clientpool_configure lowered a cap: the count then (0: none, or
   * back under the cap), for clientpool_check: nothing grows past a cap,
   * but what was there may stay until it ends */
  int32_t lim_live, lim_leases, lim_waiting, lim_keys, lim_any;
  int32_t *warm; int32_t nwarm, warmcap;  /* pinned keys: the warm floor's keys */
  int32_t floor_on, refill_signalled;
  int32_t refilling;            /* warm-floor reservations in flight, all keys */
  int32_t floor_held;           /* a warm key is short, but max_idle has no room (floor_deficit) */
  double retire_before, retire_upto;
  double last_created;          /* the latest record_t.created handed out */
  gate_t gate;

  heap_t dl;                          /* deadlines */
  heap_t ka;                          /* keepalive deadlines of idle records */
  int32_t nchecking;                  /* records out for a keepalive validate */
  int32_t *rheap[2]; int32_t rlen[2]; /* ready keys, each sized nkeys */

  clientpool_event_t *ev; int32_t evcap, evhead, evlen;
  clientpool_stats_t st;

  /* the fleet (clientpool_set_fleet), or NULL */
  clientpool_fleet_t *fl;
  int32_t fl_lease;             /* take LEASE units */
  int32_t fl_mark;              /* FM_* : what the fleet refused the pool */
  int32_t fl_kmarked;           /* keys with KM_LIVE */
  int32_t fl_signalled;         /* EV_BLOCKED queued since the last retry */
  uint64_t fl_gates;            /* the fleet's gates_gen last seen */

  int32_t fast_off;             /* tests only (whitebox.c): the fast path off */
  int32_t timed;                /* a duration option is set (cfg_timed): the untimed
                                   entry points decline */
  int32_t stale;                /* an untimed call stamped p->now (clientpool_acquire_untimed) */
  int32_t retiring;             /* a retire_before/retire_upto (the pool's or a key's) was ever
                                   set: until then no record is retired by age (retired_in) */
};

static void finish(clientpool_t *p, double now);
HOT int32_t closing_reason(const clientpool_t *p, const key_t_ *key, const record_t *x, double now);
HOT int over_cap(const clientpool_t *p, const key_t_ *key);
static void ka_pump(clientpool_t *p, double now);

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

/* ---- the fleet (clientpool.h "the fleet", docs/fleet.md section 10) ----
 * The fleet's units are taken and given where the engine counts its own,
 * so the member's shares equal the engine's holdings after every call
 * (clientpool_check).  These are the only calls into the shared segment:
 * atomics, never a clock, a system call or a wait.  A refusal leaves a
 * mark (FM_* on the pool, KM_* on a key) that stops the engine from trying
 * the same thing again in this or a later call: until a give of its own
 * (which clears the marks of what it gave), clientpool_retry, or the
 * moment no waiter is left (finish, key_refresh).  Marks hold back only
 * what was refused: with LIVE refused, idle grants go on; with a key's
 * LIVE refused, other keys create. */

static void km_set(clientpool_t *p, int32_t k, int32_t bit) {
  key_t_ *key = &p->keys[k];
  if (bit == KM_LIVE && !(key->fmark & KM_LIVE)) p->fl_kmarked++;
  key->fmark |= bit;
}

static void km_clear(clientpool_t *p, int32_t k, int32_t bits) {
  key_t_ *key = &p->keys[k];
  if ((bits & KM_LIVE) && (key->fmark & KM_LIVE)) p->fl_kmarked--;
  key->fmark &= ~bits;
}

/* Takes one unit of kind for key k (< 0: none) and returns 1, or marks
 * the refusal and returns 0.  IDLE refusals leave no mark: the caller
 * destroys the record instead (max_idle). */
static int fl_take(clientpool_t *p, int32_t kind, int32_t k) {
  int rc = clientpool_fleet_take(p->fl, kind, k >= 0 ? p->keys[k].fslot : NONE);
  if (rc == CLIENTPOOL_FLEET_TAKEN) return 1;
  if (kind == CLIENTPOOL_FLEET_IDLE) return 0;
  if (kind == CLIENTPOOL_FLEET_FLOOR) km_set(p, k, KM_FLOOR);
  else if (rc == CLIENTPOOL_FLEET_REFUSED_KEY && k >= 0) km_set(p, k, KM_LIVE);
  else {
    /* (an error, such as a handle that left, is a refusal too: the
     * driver's poll joins again and retries) */
    p->fl_mark |= kind == CLIENTPOOL_FLEET_LEASE ? FM_LEASE : FM_LIVE;
    if (rc == CLIENTPOOL_FLEET_REFUSED_TURN) p->fl_mark |= FM_TURN;
  }
  return 0;
}

/* Gives one unit back; what it frees is tried again (the caller refreshes
 * the key where that matters). */
static void fl_give(clientpool_t *p, int32_t kind, int32_t k) {
  clientpool_fleet_give(p->fl, kind, k >= 0 ? p->keys[k].fslot : NONE);
  if (kind == CLIENTPOOL_FLEET_LIVE) {
    p->fl_mark &= ~FM_LIVE;
    if (k >= 0) km_clear(p, k, KM_LIVE);
  } else if (kind == CLIENTPOOL_FLEET_LEASE) {
    p->fl_mark &= ~FM_LEASE;
  } else if (k >= 0) {
    km_clear(p, k, KM_FLOOR);           /* fewer idle or refilling: the floor may be short */
  }
}

/* A lease is admitted (the fleet's max_concurrency): 1, or 0 (marked). */
static int fl_lease_take(clientpool_t *p, int32_t k) {
  return !p->fl || !p->fl_lease || fl_take(p, CLIENTPOOL_FLEET_LEASE, k);
}

HOT void fl_lease_give(clientpool_t *p, int32_t k) {
  if (p->fl && p->fl_lease) fl_give(p, CLIENTPOOL_FLEET_LEASE, k);
}

/* A record that stays idle takes its fleet IDLE unit: 1, or 0 when the
 * fleet's max_idle (or the key's) is reached, or its validity passed, and
 * the caller destroys it. */
static int fl_keep_idle(clientpool_t *p, int32_t r) {
  if (p->gate.flapsed) return 0;
  if (!fl_take(p, CLIENTPOOL_FLEET_IDLE, p->rec[r].key)) return 0;
  p->rec[r].fidle = 1;
  return 1;
}

/* Whether a client released for reuse should go back to the fleet: other
 * members post demand, and the fleet's shed says this member holds more
 * than its fair share beyond what it is closing already (those units are
 * on their way).  One load while nobody waits. */
static int fl_shed_due(clientpool_t *p, int32_t k) {
  int32_t n, slot = p->keys[k].fslot;
  if (clientpool_fleet_waiting(p->fl) <= 0) return 0;
  n = clientpool_fleet_shed(p->fl, NONE);
  if (n > p->st.closing) return 1;
  if (slot >= 0 && clientpool_fleet_shed(p->fl, slot) > p->keys[k].st.closing) return 1;
  return 0;
}

/* The fleet's gates changed since the driver last mirrored them: tell it
 * (one load per acquisition; a pause another member made is applied from
 * the next acquisition after the driver read it). */
static void fl_gates_check(clientpool_t *p) {
  uint64_t g = clientpool_fleet_gates_gen(p->fl);
  if (g == p->fl_gates) return;
  p->fl_gates = g;
  push_event(p, CLIENTPOOL_EV_GATES, 0, 0, 0, 0);
}

/* The fleet's validity (clientpool_fleet_set_valid: a Redis fleet's lease,
 * which its agent renews).  Past the deadline the pool's gate is closed:
 * nothing is granted, idle or new, and waiters wait (availability, not
 * the cap), and no client is kept idle.  The engine cannot be told by the
 * agent (it may be another process, and stopped), so it looks itself: at
 * every acquisition, release, retry and rebalance (the driver's tick); the
 * call that sees it renewed serves the waiters at its end.  One load while
 * no deadline is set (a one-machine fleet). */
static void fl_lapse_check(clientpool_t *p) {
  p->gate.flapsed = clientpool_fleet_lapsed(p->fl) ? 1 : 0;
}

/* ---- deadline heap ---------------------------------------------------- */

static int32_t *hpos_of(clientpool_t *p, const hent_t *e) {
  switch (e->kind) {
  case H_LIFETIME: return &p->rec[e->idx].hpos;
  case H_WAITER: return &p->wai[e->idx].hpos;
  case H_BACKOFF: return &p->keys[e->idx].bpos;
  case H_KEEPALIVE: return &p->rec[e->idx].kpos;
  default: return &p->lea[e->idx].hpos;
  }
}

static void hset(clientpool_t *p, heap_t *h, int32_t i, hent_t e) {
  h->a[i] = e;
  *hpos_of(p, &h->a[i]) = i;
}

static void hup(clientpool_t *p, heap_t *h, int32_t i) {
  hent_t e = h->a[i];
  while (i > 0) {
    int32_t parent = (i - 1) / 2;
    if (h->a[parent].t <= e.t) break;
    hset(p, h, i, h->a[parent]);
    i = parent;
  }
  hset(p, h, i, e);
}

static void hdown(clientpool_t *p, heap_t *h, int32_t i) {
  hent_t e = h->a[i];
  for (;;) {
    int32_t c = 2 * i + 1;
    if (c >= h->len) break;
    if (c + 1 < h->len && h->a[c + 1].t < h->a[c].t) c++;
    if (e.t <= h->a[c].t) break;
    hset(p, h, i, h->a[c]);
    i = c;
  }
  hset(p, h, i, e);
}

static int hpush(clientpool_t *p, heap_t *h, double t, int32_t kind, int32_t idx) {
  hent_t e;
  if (h->len == h->cap) {
    hent_t *q = grow(h->a, &h->cap, sizeof *q, h->len + 1);
    if (!q) return CLIENTPOOL_ENOMEM;
    h->a = q;
  }
  e.t = t; e.kind = kind; e.idx = idx;
  h->a[h->len++] = e;
  hup(p, h, h->len - 1);
  return 0;
}

static void hremove_at(clientpool_t *p, heap_t *h, int32_t *pos) {
  int32_t i = *pos;
  *pos = NONE;
  h->len--;
  if (i == h->len) return;
  hset(p, h, i, h->a[h->len]);
  hup(p, h, i);
  hdown(p, h, *hpos_of(p, &h->a[i]));
}

/* Takes an entry (*pos) out of h, if it is in. */
HOT void hremove(clientpool_t *p, heap_t *h, int32_t *pos) {
  if (*pos != NONE) hremove_at(p, h, pos);
}

/* ---- ready keys ------------------------------------------------------
 * Keys with queued waiters that could be served, in two heaps ordered by
 * the arrival of each key's head waiter: RH_IDLE holds keys with an idle
 * record to hand out, RH_CREATE keys under their cap that must create.  An
 * idle record goes to its own key's waiters; a waiter that must create is
 * served in arrival order against the others that can use a free slot, and
 * evicts another key's idle record only when no waiter can take that one. */

/* Whether waiter a is served before waiter b: by place, then arrival. */
static int wbefore(const waiter_t *a, const waiter_t *b) {
  return a->order < b->order || (a->order == b->order && a->seq < b->seq);
}

/* The head of key k's queue, or NONE. */
static int32_t qhead(const key_t_ *key) {
  return key->wlen ? key->wheap[0] : NONE;
}

/* Whether the head waiter of key a comes before that of key b. */
static int kbefore(const clientpool_t *p, int32_t a, int32_t b) {
  return wbefore(&p->wai[p->keys[a].wheap[0]], &p->wai[p->keys[b].wheap[0]]);
}

static void rset(clientpool_t *p, int h, int32_t i, int32_t k) {
  p->rheap[h][i] = k;
  p->keys[k].rpos = i;
}

static void rup(clientpool_t *p, int h, int32_t i) {
  int32_t k = p->rheap[h][i];
  while (i > 0) {
    int32_t parent = (i - 1) / 2;
    if (!kbefore(p, k, p->rheap[h][parent])) break;
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
    if (c + 1 < n && kbefore(p, p->rheap[h][c + 1], p->rheap[h][c])) c++;
    if (!kbefore(p, p->rheap[h][c], k)) break;
    rset(p, h, i, p->rheap[h][c]);
    i = c;
  }
  rset(p, h, i, k);
}

/* Records of key k that count against its cap: the cap is physical, a
 * record counts from its reservation until its destroy is reported done. */
static int32_t key_held(const key_t_ *key) {
  return key->st.live + key->st.creating + key->st.closing;
}

/* A key's caps: its own (clientpool_key_caps), else the pool's per-key
 * ones; < 0 = none. */
HOT int32_t key_cap_live(const clientpool_t *p, const key_t_ *key) {
  return key->cap_live >= 0 ? key->cap_live : p->cfg.key_max_live;
}
HOT int32_t key_cap_idle(const clientpool_t *p, const key_t_ *key) {
  return key->cap_idle >= 0 ? key->cap_idle : p->cfg.key_max_idle;
}

/* Whether key k's cap lets one more record be reserved, and its create
 * backoff too: none, or after the window with no create in flight. */
static int key_room(const clientpool_t *p, int32_t k) {
  const key_t_ *key = &p->keys[k];
  int32_t cap = key_cap_live(p, key);
  if (key->bstate == B_WINDOW || (key->bstate == B_PROBE && key->st.creating > 0)) return 0;
  if (key->fmark & KM_LIVE) return 0;  /* the fleet's per-key cap refused it: until a retry */
  return cap < 0 || key_held(key) < cap;
}

/* Which heap key k belongs in: RH_IDLE, RH_CREATE or NONE. */
static int gate_blocked(const gate_t *g) {
  return g->paused || g->fpaused || g->flapsed || g->probe == PROBE_OUT;
}

static int key_ready(const clientpool_t *p, int32_t k) {
  const key_t_ *key = &p->keys[k];
  if (key->wlen == 0 || p->closed || gate_blocked(&key->gate)) return NONE;
  if (key->idle_top != NONE || key->olen > 0) return RH_IDLE;
  if (key_room(p, k)) return RH_CREATE;
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
  int want;
  if ((key->fmark & KM_LIVE) && key->wlen == 0) km_clear(p, k, KM_LIVE);   /* (lapses: see the fleet section) */
  want = key_ready(p, k);
  if (key->lim_live && key_held(key) <= key_cap_live(p, key)) key->lim_live = 0;
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
  return key->st.live == 0 && key->st.creating == 0 && key->st.closing == 0 &&
         key->st.leases == 0 && key->wrefs == 0 && key->bstate == B_NONE &&
         ((key->cap_live < 0 && key->cap_idle < 0) || p->closed);   /* (caps keep a key until close) */
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
  if (!key->used || key->pinned || k == p->hold_key || k == p->kept || !key_empty(p, k)) return 0;
  key->used = 0;
  p->keys_used--;
  push_event(p, CLIENTPOOL_EV_KEY_FREE, k, 0, 0, 0);
  return 1;
}

/* Whether the next acquisition for key k is the caller of a regrant that
 * kept its place; the place is used up by this call either way (see
 * clientpool_regrant: nothing is served while a place is kept). */
static int take_kept(clientpool_t *p, int32_t k) {
  int kept = p->kept == k;
  p->kept = NONE;
  return kept;
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
    int32_t *oh = key->oheap, ocap = key->ocap, *wh = key->wheap, wcap = key->wcap;
    memset(key, 0, sizeof *key);
    key->oheap = oh;
    key->ocap = ocap;
    key->wheap = wh;
    key->wcap = wcap;
  }
  key->used = 1;
  key->retire_before = key->retire_upto = -1;
  key->gate.probe_lease = NONE;
  key->idle_top = key->rpos = key->rheap = key->bpos = NONE;
  key->cap_live = key->cap_idle = NONE;
  key->next_free = NONE;
  p->keys_used++;
  return k;
}

HOT int key_ok(const clientpool_t *p, int32_t k) {
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
  if (p->kept != NONE) {             /* the caller that kept its place gave up, or forgets another key */
    int freed;
    take_kept(p, k);
    freed = key_maybe_free(p, k);
    finish(p, p->now);               /* what was held for it is served */
    return freed;
  }
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

/* Off its key's LIFO stack. */
HOT void stack_unlink(clientpool_t *p, int32_t r) {
  record_t *x = &p->rec[r];
  key_t_ *key = &p->keys[x->key];
  if (x->kprev != NONE) p->rec[x->kprev].knext = x->knext; else key->idle_top = x->knext;
  if (x->knext != NONE) p->rec[x->knext].kprev = x->kprev;
}

/* On top of its key's LIFO stack. */
HOT void stack_push(clientpool_t *p, int32_t r) {
  record_t *x = &p->rec[r];
  key_t_ *key = &p->keys[x->key];
  x->kprev = NONE;
  x->knext = key->idle_top;
  if (key->idle_top != NONE) p->rec[key->idle_top].kprev = r;
  key->idle_top = r;
}

/* Off the pool-wide idle list. */
HOT void gl_unlink(clientpool_t *p, int32_t r) {
  record_t *x = &p->rec[r];
  if (x->gprev != NONE) p->rec[x->gprev].gnext = x->gnext; else p->g_oldest = x->gnext;
  if (x->gnext != NONE) p->rec[x->gnext].gprev = x->gprev; else p->g_newest = x->gprev;
}

/* Keepalive: an idle record's next background validate is due `keepalive`
 * after it went idle or was last validated (a heap of its own: p->ka). */
static void ka_arm(clientpool_t *p, int32_t r, double now) {
  p->rec[r].kpos = NONE;
  if (has(p->cfg.keepalive) && hpush(p, &p->ka, now + p->cfg.keepalive, H_KEEPALIVE, r) != 0)
    p->rec[r].kpos = NONE;             /* out of memory: no keepalive for it */
}

HOT void idle_unlink(clientpool_t *p, int32_t r) {
  record_t *x = &p->rec[r];
  stack_unlink(p, r);
  gl_unlink(p, r);
  if (x->kpos != NONE) hremove(p, &p->ka, &x->kpos);
  BOTH(p, x->key, idle, -1);
  if (x->fidle) { x->fidle = 0; fl_give(p, CLIENTPOOL_FLEET_IDLE, x->key); }
}

HOT void idle_push(clientpool_t *p, int32_t r, double now) {
  record_t *x = &p->rec[r];
  x->state = R_IDLE;
  x->fidle = 0;                        /* (its IDLE unit: fl_keep_idle) */
  x->idle_since = now;
  x->gl_ahead = 0;
  stack_push(p, r);
  x->kpos = NONE;
  if (has(p->cfg.keepalive)) ka_arm(p, r, now);
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
 * read its EV_DESTROY (clientpool_next_event) too, for the reason given at
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

static void oremove_at(clientpool_t *p, int32_t r) {
  key_t_ *key = &p->keys[p->rec[r].key];
  int32_t i = p->rec[r].opos;
  p->rec[r].opos = NONE;
  if (i == --key->olen) return;
  oset(p, key, i, key->oheap[key->olen]);
  oup(p, key, i);
  odown(p, key, p->rec[key->oheap[i]].opos);
}

/* A leased record out of its key's open heap, if it is in. */
HOT void oremove(clientpool_t *p, int32_t r) {
  /* (opos is another state's field) */
  if (p->rec[r].state == R_LEASED && p->rec[r].opos != NONE) oremove_at(p, r);
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
  int32_t kcap = key_cap_idle(p, key);
  if (kcap >= 0 && kcap - key->st.idle - key->refilling < d) d = kcap - key->st.idle - key->refilling;
  if (d > 0 && room <= 0) p->floor_held = 1;
  return room < d ? room : d;
}

/* Signals the driver (once until it asks) that a warm key fell short: k,
 * or, while max_idle had no room for one, any (an idle record of k just
 * went: there may be room now). */
static void floor_check_at(clientpool_t *p, int32_t k) {
  int32_t i, found;
  /* (KM_FLOOR: the fleet's floor of the key is met: until a retry) */
  if (p->keys[k].pinned != 2 || (p->keys[k].fmark & KM_FLOOR) || floor_deficit(p, k) <= 0) {
    if (!p->floor_held) return;
    p->floor_held = 0;
    /* every warm key is looked at: floor_deficit sets floor_held again
     * for each that max_idle still has no room for */
    for (i = 0, found = NONE; i < p->nwarm; i++)
      if (!(p->keys[p->warm[i]].fmark & KM_FLOOR) && floor_deficit(p, p->warm[i]) > 0 && found == NONE) found = p->warm[i];
    if (found == NONE) return;
    k = found;
  }
  /* a key short with room: max_idle holds nothing short now (the refills'
   * own looks set it again once room runs out), whichever way k was found */
  p->floor_held = 0;
  p->refill_signalled = 1;
  push_event(p, CLIENTPOOL_EV_REFILL, k, 0, 0, 0);
}

HOT void floor_check(clientpool_t *p, int32_t k) {
  if (p->floor_on && !p->refill_signalled && !p->closed) floor_check_at(p, k);
}

/* Starts the destroy of a live record (idle, or leased with no lease
 * left): it is closing, and counts against max_live and its key's cap until
 * the driver reports the destroy done (clientpool_destroyed).  `closed`
 * counts it now, so opened - closed = live holds. */
static void destroy(clientpool_t *p, int32_t r, int32_t reason) {
  record_t *x = &p->rec[r];
  int32_t k = x->key;
  if (x->state == R_IDLE) idle_unlink(p, r);
  else if (x->state == R_CHECKING) {  /* (its keepalive was reported) */
    if (!(x->retire & IDLE_OVER)) gl_unlink(p, r);
    BOTH(p, k, idle, -1);
    if (x->fidle) { x->fidle = 0; fl_give(p, CLIENTPOOL_FLEET_IDLE, k); }
  }
  oremove(p, r);
  hremove(p, &p->dl, &x->hpos);
  BOTH(p, k, live, -1);
  BOTH(p, k, closed, 1);
  BOTH(p, k, closed_by[reason], 1);
  BOTH(p, k, closing, 1);
  push_event(p, CLIENTPOOL_EV_DESTROY, r, reason, k, 0);
  x->state = R_CLOSING;
  x->nleases = 0;
  x->retire = x->doomed = 0;
  x->seen = 0;
  key_refresh(p, k);
  floor_check(p, k);
}

/* Whether a record's creation predates a retire_before of its key or pool. */
/* (key: x's, which the fast path has at hand: one load less on its chain) */
HOT int retired_in(const clientpool_t *p, const key_t_ *key, const record_t *x) {
  return p->retiring && (x->created < p->retire_before || x->created < key->retire_before ||
                         x->created <= p->retire_upto || x->created <= key->retire_upto);
}
HOT int retired_by_age(const clientpool_t *p, const record_t *x) {
  return retired_in(p, &p->keys[x->key], x);
}

/* Whether a live record is past max_lifetime (or was found so by tick). */
HOT int lifetime_over(const clientpool_t *p, const record_t *x, double now) {
  return (x->retire & LIFETIME_OVER) || (x->hpos != NONE && now >= p->dl.a[x->hpos].t);
}

/* Whether the warm floor needs this idle record: idle_timeout spares it. */
static int floor_keeps(const clientpool_t *p, const record_t *x) {
  const key_t_ *key = &p->keys[x->key];
  if (!p->floor_on || key->pinned != 2) return 0;
  /* with a fleet the floor is the fleet's: its idle clients of the key, every member's */
  if (p->fl && key->fslot >= 0) return clientpool_fleet_count(p->fl, CLIENTPOOL_FLEET_IDLE, key->fslot) <= p->cfg.min_idle;
  return key->st.idle <= p->cfg.min_idle;
}

HOT int idle_expired(const clientpool_t *p, const key_t_ *key, const record_t *x, double now, int32_t *why) {
  if ((x->retire & RETIRED) || retired_in(p, key, x)) { *why = CLIENTPOOL_BY_RETIRED; return 1; }
  if (lifetime_over(p, x, now)) { *why = CLIENTPOOL_BY_LIFETIME; return 1; }
  if (has(p->cfg.idle_timeout) && now >= idle_deadline(x, p->cfg.idle_timeout) && !floor_keeps(p, x)) {
    *why = CLIENTPOOL_BY_IDLE; return 1;
  }
  return 0;
}

/* Whether max_live lets one more record be reserved: closing records count;
 * and the fleet's cap, unless it refused a create (FM_LIVE: until a retry). */
static int room(const clientpool_t *p) {
  return p->st.live + p->st.creating + p->st.closing < p->cfg.max_live && !(p->fl_mark & FM_LIVE);
}

/* The least recently used idle record that is not out for a keepalive
 * (at most CLIENTPOOL_KEEPALIVE_MAX are passed), or NONE. */
static int32_t lru_idle(const clientpool_t *p) {
  int32_t r = p->g_oldest;
  while (r != NONE && p->rec[r].state != R_IDLE) r = p->rec[r].gnext;
  return r;
}

/* Whether, at max_live, an idle record may be evicted to make room: there
 * is one, and no destroy is under way (its room comes first: evicting more
 * would close good clients for room already on its way). */
static int evict_ok(const clientpool_t *p) {
  return p->st.idle > p->nchecking && p->st.closing == 0;
}

/* ---- leases ----------------------------------------------------------- */

/* More lease slots, onto the free list: 1, or 0 out of memory. */
static int lease_grow(clientpool_t *p) {
  int32_t cap = p->nlea, i;
  lease_t *q = grow(p->lea, &cap, sizeof *q, p->nlea + 1);
  if (!q) return 0;
  p->lea = q;
  for (i = cap - 1; i >= p->nlea; i--) {
    memset(&q[i], 0, sizeof q[i]);
    q[i].record = NONE;
    q[i].hpos = NONE;
    q[i].next_free = p->lea_free;
    p->lea_free = i;
  }
  p->nlea = cap;
  return 1;
}

/* A lease of record r (the caller counts it in r's nleases). */
HOT int32_t lease_alloc(clientpool_t *p, int32_t r, double now) {
  int32_t l;
  lease_t *x;
  if (p->lea_free == NONE && !lease_grow(p)) return NONE;
  l = p->lea_free;
  x = &p->lea[l];
  p->lea_free = x->next_free;
  x->checkout = 0;
  x->record = r;
  x->since = now;
  x->hpos = NONE;
  BOTH(p, p->rec[r].key, leases, 1);
  if (has(p->cfg.leak_threshold) && hpush(p, &p->dl, now + p->cfg.leak_threshold, H_LEASE, l) != 0)
    x->hpos = NONE;    /* out of memory: the report is lost, the lease is not */
  return l;
}

HOT void lease_free(clientpool_t *p, int32_t l) {
  lease_t *x = &p->lea[l];
  record_t *r = &p->rec[x->record];
  hremove(p, &p->dl, &x->hpos);
  r->nleases--;
  BOTH(p, r->key, leases, -1);
  fl_lease_give(p, r->key);
  x->record = NONE;
  x->gen++;
  x->next_free = p->lea_free;
  p->lea_free = l;
}

HOT lease_t *lease_get(clientpool_t *p, int32_t l, uint32_t gen) {
  if (l < 0 || l >= p->nlea) return NULL;
  if (p->lea[l].record == NONE || p->lea[l].gen != gen) return NULL;
  return &p->lea[l];
}

/* ---- grants ----------------------------------------------------------- */

HOT void fill_idle(clientpool_t *p, int32_t r, int32_t l, double now, clientpool_grant_t *g) {
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
    if (idle_expired(p, &p->keys[k], x, now, &why)) { destroy(p, r, why); continue; }
    if (!fl_lease_take(p, k)) return 0;
    l = lease_alloc(p, r, now);
    if (l == NONE) { fl_lease_give(p, k); return 0; }
    idle_unlink(p, r);
    x->nleases = 1;                   /* (shares storage with the keepalive entry) */
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
    if (!fl_lease_take(p, k)) return 0;
    l = lease_alloc(p, r, now);
    if (l == NONE) { fl_lease_give(p, k); return 0; }
    x->nleases++;
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

/* The fleet's units of a reservation for k: LEASE (admission first), then
 * LIVE.  1, or 0 with nothing taken (the refusal marked). */
static int fl_reserve(clientpool_t *p, int32_t k) {
  if (!fl_lease_take(p, k)) return 0;
  if (fl_take(p, CLIENTPOOL_FLEET_LIVE, k)) return 1;
  fl_lease_give(p, k);                 /* (the LEASE was there: only LIVE is refused) */
  return 0;
}

static void fl_unreserve(clientpool_t *p, int32_t k) {
  if (!p->fl) return;
  fl_lease_give(p, k);
  fl_give(p, CLIENTPOOL_FLEET_LIVE, k);
}

/* Reserves a record for k.  At max_live, with no destroy under way that
 * will make room, it starts the eviction of the least recently used idle
 * record (of another key: k has none, or take_idle would have taken it),
 * and the room comes when that destroy is reported: nothing is reserved
 * now (the cap is physical).  Returns 1 with *g filled, or 0. */
static int reserve(clientpool_t *p, int32_t k, double now, clientpool_grant_t *g) {
  int32_t r, l;
  if (!key_room(p, k)) return 0;
  if (!room(p)) {
    if (evict_ok(p)) destroy(p, lru_idle(p), CLIENTPOOL_BY_EVICTED);
    return 0;
  }
  if (p->fl && !fl_reserve(p, k)) {
    /* the fleet's cap: as at max_live, an idle record of another key of
     * ours makes room (its LIVE unit comes back when its destroy is
     * reported); a key's cap: k's waiters wait */
    if (!room(p) && evict_ok(p)) destroy(p, lru_idle(p), CLIENTPOOL_BY_EVICTED);
    key_refresh(p, k);
    return 0;
  }
  r = rec_alloc(p);
  if (r == NONE) { fl_unreserve(p, k); return 0; }
  rec_init(p, r, k, now);
  l = lease_alloc(p, r, now);
  if (l == NONE) { rec_free(p, r); fl_unreserve(p, k); return 0; }
  p->rec[r].nleases = 1;
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

/* ---- a key's queue: a binary heap of its waiters by place ------------- */

static void wset(clientpool_t *p, key_t_ *key, int32_t i, int32_t w) {
  key->wheap[i] = w;
  p->wai[w].wpos = i;
}

static void wup(clientpool_t *p, key_t_ *key, int32_t i) {
  int32_t w = key->wheap[i];
  while (i > 0) {
    int32_t parent = (i - 1) / 2;
    if (!wbefore(&p->wai[w], &p->wai[key->wheap[parent]])) break;
    wset(p, key, i, key->wheap[parent]);
    i = parent;
  }
  wset(p, key, i, w);
}

static void wdown(clientpool_t *p, key_t_ *key, int32_t i) {
  int32_t w = key->wheap[i];
  for (;;) {
    int32_t c = 2 * i + 1;
    if (c >= key->wlen) break;
    if (c + 1 < key->wlen && wbefore(&p->wai[key->wheap[c + 1]], &p->wai[key->wheap[c]])) c++;
    if (!wbefore(&p->wai[key->wheap[c]], &p->wai[w])) break;
    wset(p, key, i, key->wheap[c]);
    i = c;
  }
  wset(p, key, i, w);
}

/* (room for one more ensured by the caller: queue_room) */
static void wpush(clientpool_t *p, key_t_ *key, int32_t w) {
  wset(p, key, key->wlen++, w);
  wup(p, key, key->wlen - 1);
}

static void wremove(clientpool_t *p, key_t_ *key, int32_t w) {
  int32_t i = p->wai[w].wpos;
  p->wai[w].wpos = NONE;
  if (i == --key->wlen) return;
  wset(p, key, i, key->wheap[key->wlen]);
  wup(p, key, i);
  wdown(p, key, p->wai[key->wheap[i]].wpos);
}

static int queue_room(key_t_ *key) {
  if (key->wlen < key->wcap) return 1;
  {
    int32_t *q = grow(key->wheap, &key->wcap, sizeof *q, key->wlen + 1);
    if (!q) return 0;
    key->wheap = q;
  }
  return 1;
}

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
  wremove(p, key, w);
  hremove(p, &p->dl, &x->hpos);
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
  p->wai_used--;
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
    if (!evict_ok(p)) {
      kc = NONE;
    } else if (ki != NONE) {
      if (kbefore(p, ki, kc)) kc = NONE;
      else if (p->wai[qhead(&p->keys[kc])].passed < p->cfg.max_live) { *held = kc; kc = NONE; }
    }
  }
  if (ki == NONE) return kc;
  if (kc == NONE) return ki;
  return kbefore(p, kc, ki) ? kc : ki;
}

/* Serves queued waiters in arrival order while anything they can use is free. */
static void dispatch(clientpool_t *p, double now) {
  if (p->kept != NONE) return;       /* the caller that kept its place comes first */
  while (p->st.leases < p->cfg.max_concurrency && !(p->fl_mark & FM_LEASE)) {
    int32_t held, held2, k = next_ready(p, &held), w;
    clientpool_grant_t g;
    waiter_t *x;
    if (k == NONE) break;
    w = qhead(&p->keys[k]);
    /* grant may meet only expired records: destroyed, k is re-sorted */
    if (!grant(p, k, now, &g)) {
      if (next_ready(p, &held2) == k && qhead(&p->keys[k]) == w) break;
      continue;
    }
    if (held != NONE) p->wai[qhead(&p->keys[held])].passed++;
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

HOT double next_deadline(const clientpool_t *p) {
  double d = -1;
  if (p->dl.len > 0) d = p->dl.a[0].t;
  if (has(p->cfg.idle_timeout) && p->g_oldest != NONE) {
    double t = idle_deadline(&p->rec[p->g_oldest], p->cfg.idle_timeout);
    if (d < 0 || t < d) d = t;
  }
  /* a keepalive due waits for a free slot: the report that frees one hands it out */
  if (p->ka.len > 0 && p->nchecking < CLIENTPOOL_KEEPALIVE_MAX && !p->closed && (d < 0 || p->ka.a[0].t < d))
    d = p->ka.a[0].t;
  return d;
}

double clientpool_next_deadline(const clientpool_t *p) { return next_deadline(p); }

/* After dispatch: marks lapse once no waiter is left (a later acquisition
 * tries the fleet again); waiters held back by a mark are announced once
 * (EV_BLOCKED) until the driver's retry. */
static void fl_finish(clientpool_t *p) {
  if (p->st.waiting == 0) {
    if (p->fl_mark) p->fl_mark = 0;
    p->fl_signalled = 0;
    return;
  }
  if (!p->fl_signalled && ((p->fl_mark & (FM_LIVE | FM_LEASE)) || p->fl_kmarked > 0)) {
    p->fl_signalled = 1;
    push_event(p, CLIENTPOOL_EV_BLOCKED, (p->fl_mark & (FM_LIVE | FM_LEASE | FM_TURN)) |
               (p->fl_kmarked > 0 ? CLIENTPOOL_BLOCKED_KEY : 0), 0, 0, 0);
  }
}

/* What was over a lowered cap (clientpool_configure) and is back under it. */
static void lim_update(clientpool_t *p) {
  if (p->lim_live && p->st.live + p->st.creating + p->st.closing <= p->cfg.max_live) p->lim_live = 0;
  if (p->lim_leases && p->st.leases <= p->cfg.max_concurrency) p->lim_leases = 0;
  if (p->lim_waiting && p->st.waiting <= p->cfg.max_waiting) p->lim_waiting = 0;
  if (p->lim_keys && p->keys_used <= p->cfg.max_keys) p->lim_keys = 0;
  p->lim_any = (p->lim_live | p->lim_leases | p->lim_waiting | p->lim_keys) != 0;
}

/* Ends every public mutating call: serves waiters and tells the driver about
 * a deadline earlier than its timer. */
/* Tells the driver about a deadline earlier than its timer (finish's end). */
HOT void arm(clientpool_t *p) {
  double d = next_deadline(p);
  if (d >= 0 && (p->armed < 0 || d < p->armed)) {
    p->armed = d;
    push_event(p, CLIENTPOOL_EV_TIMER, 0, 0, 0, d);
  }
}

static void finish(clientpool_t *p, double now) {
  dispatch(p, now);
  if (p->fl) fl_finish(p);
  if (p->lim_any) lim_update(p);
  arm(p);
}

HOT double clamp(clientpool_t *p, double now) {
  if (!(now >= p->now)) now = p->now;   /* also rejects NaN */
  p->now = now;
  return now;
}

/* ---- create backoff (see clientpool_created) ------------------------- */

/* Sets key k's backoff deadline to t.  Out of memory the window is skipped
 * (B_PROBE without a deadline: one create at a time, forgotten at success). */
static void backoff_arm(clientpool_t *p, int32_t k, double t) {
  key_t_ *key = &p->keys[k];
  if (key->bpos != NONE) {
    p->dl.a[key->bpos].t = t;
    hup(p, &p->dl, key->bpos);
    hdown(p, &p->dl, key->bpos);
  } else if (hpush(p, &p->dl, t, H_BACKOFF, k) != 0) {
    key->bpos = NONE;
    key->bstate = B_PROBE;
  }
}

/* A create of key k failed: a window of d/2 + d/2 * r opens ("equal
 * jitter": never shorter than half the step, spread over the other half). */
static void backoff_fail(clientpool_t *p, int32_t k, double now) {
  key_t_ *key = &p->keys[k];
  double d;
  if (!(p->cfg.create_backoff > 0) || p->closed) return;   /* (closed: nothing creates) */
  if (key->fails < INT32_MAX) key->fails++;
  d = ldexp(p->cfg.create_backoff, key->fails - 1 < 1000 ? key->fails - 1 : 1000);
  if (!(d <= p->cfg.create_backoff_max)) d = p->cfg.create_backoff_max;
  key->bstate = B_WINDOW;
  backoff_arm(p, k, now + d / 2 + d / 2 * rnd(p));
  key_refresh(p, k);
}

/* A create of key k succeeded (or the pool closed): no backoff. */
static void backoff_reset(clientpool_t *p, int32_t k) {
  key_t_ *key = &p->keys[k];
  if (key->bstate == B_NONE) return;
  key->fails = 0;
  key->bstate = B_NONE;
  hremove(p, &p->dl, &key->bpos);
  key_refresh(p, k);
}

/* Key k's backoff deadline passed (its entry is out of the heap): the
 * window ends, and one create may go; or, create_backoff_max later with no
 * create in flight, the failures are forgotten (with one in flight, its
 * outcome decides: the deadline is set again). */
static void backoff_due(clientpool_t *p, int32_t k, double now) {
  key_t_ *key = &p->keys[k];
  if (key->bstate == B_WINDOW) {
    key->bstate = B_PROBE;
    backoff_arm(p, k, now + p->cfg.create_backoff_max);
    key_refresh(p, k);                 /* its waiters may create again */
    floor_check(p, k);
  } else if (key->st.creating > 0) {
    backoff_arm(p, k, now + p->cfg.create_backoff_max);
  } else {
    key->fails = 0;
    key->bstate = B_NONE;
    key_refresh(p, k);
    key_maybe_free(p, k);
  }
}

/* An acquisition of k looks at the window before the timer did. */
static void backoff_check(clientpool_t *p, int32_t k, double now) {
  key_t_ *key = &p->keys[k];
  if (key->bstate == B_WINDOW && key->bpos != NONE && now >= p->dl.a[key->bpos].t) {
    hremove(p, &p->dl, &key->bpos);
    backoff_due(p, k, now);
  }
}

/* Whether an acquisition of k that found nothing to take fails fast: the
 * window is open and no client of k may come back soon (none leased, none
 * being created) to serve it instead. */
static int backoff_refuses(const clientpool_t *p, int32_t k) {
  const key_t_ *key = &p->keys[k];
  return key->bstate == B_WINDOW && key->st.active == 0 && key->st.creating == 0 &&
         key->idle_top == NONE && key->olen == 0 && key->nchecking == 0;
}

/* ---- keepalive (see clientpool_keepalive_done) ----------------------- */

/* Whether the pool or key holds more than a cap lowered by configure or
 * key_caps (open or being created: the closing ones' room is on its way). */
HOT int over_cap(const clientpool_t *p, const key_t_ *key) {
  int32_t cap = key_cap_live(p, key);
  return p->st.live + p->st.creating > p->cfg.max_live ||
         (cap >= 0 && key->st.live + key->st.creating > cap);
}

/* Hands the idle records whose keepalive is due to the driver, first due
 * first, while fewer than CLIENTPOOL_KEEPALIVE_MAX are out. */
static void ka_pump(clientpool_t *p, double now) {
  while (p->nchecking < CLIENTPOOL_KEEPALIVE_MAX && p->ka.len > 0 && p->ka.a[0].t <= now && !p->closed) {
    int32_t r = p->ka.a[0].idx, k = p->rec[r].key;
    record_t *x = &p->rec[r];
    hremove(p, &p->ka, &x->kpos);
    stack_unlink(p, r);                /* not granted meanwhile; still idle, on the pool's list */
    x->state = R_CHECKING;
    p->nchecking++;
    p->keys[k].nchecking++;
    BOTH(p, k, keepalive, 1);
    push_event(p, CLIENTPOOL_EV_KEEPALIVE, r, 0, k, now - x->idle_since);
    key_refresh(p, k);
  }
}

int clientpool_keepalive_done(clientpool_t *p, int32_t r, int32_t ok, double now) {
  record_t *x;
  int32_t k, why = -1;
  now = clamp(p, now);
  if (r < 0 || r >= p->nrec || p->rec[r].state != R_CHECKING) return CLIENTPOOL_STALE;
  x = &p->rec[r];
  k = x->key;
  p->nchecking--;
  p->keys[k].nchecking--;
  if (!ok) {
    BOTH(p, k, keepalive_failed, 1);
    why = CLIENTPOOL_BY_INVALID;
  } else if (p->closed) why = CLIENTPOOL_BY_DRAIN;
  else if ((x->retire & RETIRED) || retired_by_age(p, x)) why = CLIENTPOOL_BY_RETIRED;
  else if (lifetime_over(p, x, now)) why = CLIENTPOOL_BY_LIFETIME;
  else if ((x->retire & IDLE_OVER) ||
           (has(p->cfg.idle_timeout) && now >= idle_deadline(x, p->cfg.idle_timeout) && !floor_keeps(p, x)))
    why = CLIENTPOOL_BY_IDLE;
  else if (over_cap(p, &p->keys[k])) why = CLIENTPOOL_BY_RESIZED;
  /* (it still counts as idle: over a max_idle lowered while it was out) */
  else if (p->st.idle > p->cfg.max_idle ||
           (key_cap_idle(p, &p->keys[k]) >= 0 && p->keys[k].st.idle > key_cap_idle(p, &p->keys[k])))
    why = CLIENTPOOL_BY_MAX_IDLE;
  if (why >= 0) destroy(p, r, why);
  else {
    /* good: on top of its stack, its idle time and place on the pool's
     * list (idle_timeout) as they were, its keepalive clock started again */
    x->state = R_IDLE;
    stack_push(p, r);
    ka_arm(p, r, now);
    key_refresh(p, k);
  }
  ka_pump(p, now);
  finish(p, now);
  return 0;
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
  if (c->create_backoff != c->create_backoff) return 0;     /* NaN */
  if (!(c->keepalive < 0 || (c->keepalive > 0 && c->keepalive < HUGE_VAL))) return 0;
  if (c->create_backoff > 0 &&
      !(c->create_backoff < HUGE_VAL && c->create_backoff_max >= c->create_backoff &&
        c->create_backoff_max < HUGE_VAL)) return 0;
  return 1;
}

/* Whether a duration the fast path would stamp or test is configured: the
 * idle clock (idle_timeout, validate_after_idle, keepalive), lifetimes and
 * lease ages (leak_threshold).  Without one, a stamp's only later reader is
 * a configure that sets one (see clientpool_acquire_untimed). */
static int cfg_timed(const clientpool_config_t *c) {
  return has(c->idle_timeout) || has(c->max_lifetime) || has(c->validate_after_idle) || has(c->keepalive) ||
         has(c->leak_threshold);
}

int clientpool_new(const clientpool_config_t *cfg, clientpool_t **out) {
  clientpool_t *p;
  *out = NULL;
  if (!cfg || !config_ok(cfg)) return CLIENTPOOL_EINVAL;
  p = calloc(1, sizeof *p);
  if (!p) return CLIENTPOOL_ENOMEM;
  p->cfg = *cfg;
  p->timed = cfg_timed(cfg);
  p->armed = -1;
  p->rng = cfg->seed ? cfg->seed : 0x9E3779B97F4A7C15ULL;
  p->rec_free = p->lea_free = p->wai_free = p->key_free = NONE;
  p->g_oldest = p->g_newest = NONE;
  p->hold_key = p->kept = NONE;
  p->retire_before = p->retire_upto = p->last_created = -1;   /* (times are >= 0) */
  p->gate.probe_lease = NONE;
  *out = p;
  return CLIENTPOOL_OK;
}

/* The engine goes: every unit it still holds goes back to the fleet (its
 * clients are gone with it), then its reference to the handle. */
static void fl_release_all(clientpool_t *p) {
  int32_t i;
  for (i = 0; i < p->nrec; i++) {
    record_t *x = &p->rec[i];
    int32_t k = x->key;
    if (x->state == R_FREE) continue;
    if (x->state == R_CREATING && x->refill) fl_give(p, CLIENTPOOL_FLEET_FLOOR, k);
    if ((x->state == R_IDLE || x->state == R_CHECKING) && x->fidle) fl_give(p, CLIENTPOOL_FLEET_IDLE, k);
    fl_give(p, CLIENTPOOL_FLEET_LIVE, k);
  }
  for (i = 0; i < p->nlea; i++)
    if (p->lea[i].record != NONE) fl_lease_give(p, p->rec[p->lea[i].record].key);
  clientpool_fleet_close(p->fl);
  p->fl = NULL;
}

void clientpool_free(clientpool_t *p) {
  int32_t k;
  if (!p) return;
  if (p->fl) fl_release_all(p);
  for (k = 0; k < p->nkeys; k++) { free(p->keys[k].oheap); free(p->keys[k].wheap); }
  free(p->warm);
  free(p->rec); free(p->lea); free(p->wai); free(p->keys);
  free(p->dl.a); free(p->ka.a); free(p->rheap[0]); free(p->rheap[1]); free(p->ev);
  free(p);
}

/* ---- configure -------------------------------------------------------- */

/* Every position in heap h again, then heap order (after times changed or
 * entries were dropped). */
static void heap_rebuild(clientpool_t *p, heap_t *h) {
  int32_t i;
  for (i = 0; i < h->len; i++) *hpos_of(p, &h->a[i]) = i;
  for (i = h->len / 2 - 1; i >= 0; i--) hdown(p, h, i);
}

/* Drops the entries of one kind from heap h (heap_rebuild follows). */
static void heap_drop(clientpool_t *p, heap_t *h, int32_t kind) {
  int32_t i, n = 0;
  for (i = 0; i < h->len; i++) {
    if (h->a[i].kind == kind) *hpos_of(p, &h->a[i]) = NONE;
    else h->a[n++] = h->a[i];
  }
  h->len = n;
}

/* The bottom of key k's idle stack (its least recently released). */
static int32_t idle_bottom(const clientpool_t *p, int32_t k) {
  int32_t r = p->keys[k].idle_top;
  if (r != NONE) while (p->rec[r].knext != NONE) r = p->rec[r].knext;
  return r;
}

/* Key k over its caps: idle records go, oldest first (leased ones at their
 * release, closing_reason). */
static void shrink_key(clientpool_t *p, int32_t k) {
  key_t_ *key = &p->keys[k];
  int32_t r = idle_bottom(p, k), cap = key_cap_live(p, key), icap = key_cap_idle(p, key);
  if (cap >= 0 && key_held(key) > cap && key_held(key) > key->lim_live) key->lim_live = key_held(key);
  while (r != NONE && ((cap >= 0 && key->st.live + key->st.creating > cap) ||
                       (icap >= 0 && key->st.idle > icap))) {
    int32_t up = p->rec[r].kprev;
    destroy(p, r, cap >= 0 && key->st.live + key->st.creating > cap ? CLIENTPOOL_BY_RESIZED
                                                                      : CLIENTPOOL_BY_MAX_IDLE);
    r = up;
  }
  key_refresh(p, k);
}

typedef struct { double created; int32_t r; } by_age_t;
static int by_age_cmp(const void *a, const void *b) {
  double x = ((const by_age_t *)a)->created, y = ((const by_age_t *)b)->created;
  return x < y ? -1 : x > y;
}

int clientpool_configure(clientpool_t *p, const clientpool_config_t *cfg, double now) {
  clientpool_config_t old;
  by_age_t *fresh = NULL;
  int32_t i, nfresh = 0, k;
  now = clamp(p, now);
  if (!cfg || !config_ok(cfg) || cfg->capacity != p->cfg.capacity || cfg->seed != p->cfg.seed)
    return CLIENTPOOL_EINVAL;
  if (p->closed) return CLIENTPOOL_ECLOSED;
  if (has(cfg->max_lifetime) && !has(p->cfg.max_lifetime)) {
    /* records that had no lifetime get one, jittered in creation order */
    fresh = malloc((size_t)(p->nrec ? p->nrec : 1) * sizeof *fresh);
    if (!fresh) return CLIENTPOOL_ENOMEM;
    for (i = 0; i < p->nrec; i++)
      if (p->rec[i].state == R_IDLE || p->rec[i].state == R_LEASED || p->rec[i].state == R_CHECKING) {
        fresh[nfresh].created = p->rec[i].created;
        fresh[nfresh++].r = i;
      }
    if (p->dl.cap - p->dl.len < nfresh) {
      hent_t *q = grow(p->dl.a, &p->dl.cap, sizeof *q, p->dl.len + nfresh);
      if (!q) { free(fresh); return CLIENTPOOL_ENOMEM; }
      p->dl.a = q;
    }
    qsort(fresh, (size_t)nfresh, sizeof *fresh, by_age_cmp);
  }
  old = p->cfg;
  p->cfg = *cfg;
  p->timed = cfg_timed(cfg);
  /* durations held in the heap */
  if (!has(cfg->max_lifetime)) heap_drop(p, &p->dl, H_LIFETIME);
  else if (has(old.max_lifetime) && cfg->max_lifetime != old.max_lifetime) {
    double f = cfg->max_lifetime / old.max_lifetime;
    for (i = 0; i < p->dl.len; i++)
      if (p->dl.a[i].kind == H_LIFETIME) {
        const record_t *x = &p->rec[p->dl.a[i].idx];
        p->dl.a[i].t = x->created + (p->dl.a[i].t - x->created) * f;
      }
  }
  if (!has(cfg->leak_threshold)) heap_drop(p, &p->dl, H_LEASE);
  else if (has(old.leak_threshold)) {
    for (i = 0; i < p->dl.len; i++)
      if (p->dl.a[i].kind == H_LEASE) p->dl.a[i].t = p->lea[p->dl.a[i].idx].since + cfg->leak_threshold;
  }
  heap_rebuild(p, &p->dl);
  /* keepalive: each clock as it was, measured against the new value */
  if (!has(cfg->keepalive)) heap_drop(p, &p->ka, H_KEEPALIVE);
  else if (has(old.keepalive)) {
    for (i = 0; i < p->ka.len; i++) p->ka.a[i].t = p->ka.a[i].t - old.keepalive + cfg->keepalive;
  } else {
    for (i = 0; i < p->nrec; i++)
      if (p->rec[i].state == R_IDLE &&
          hpush(p, &p->ka, p->rec[i].idle_since + cfg->keepalive, H_KEEPALIVE, i) != 0) p->rec[i].kpos = NONE;
  }
  heap_rebuild(p, &p->ka);
  for (i = 0; i < nfresh; i++) {
    record_t *x = &p->rec[fresh[i].r];
    hpush(p, &p->dl, x->created + cfg->max_lifetime * (1.0 - cfg->lifetime_jitter * rnd(p)), H_LIFETIME, fresh[i].r);
  }
  free(fresh);
  if (has(cfg->leak_threshold) && !has(old.leak_threshold))
    for (i = 0; i < p->nlea; i++) {
      /* a stamp of an untimed call may be early: counted from now, a lease
       * is reported late, never early */
      if (p->stale && p->lea[i].record != NONE && p->lea[i].since < now) p->lea[i].since = now;
      if (p->lea[i].record != NONE && hpush(p, &p->dl, p->lea[i].since + cfg->leak_threshold, H_LEASE, i) != 0)
        p->lea[i].hpos = NONE;
    }
  /* caps: what is over stays until it ends, nothing grows past them */
  {
    int32_t total = p->st.live + p->st.creating + p->st.closing;
    if (total > cfg->max_live && total > p->lim_live) p->lim_live = total;
    if (p->st.leases > cfg->max_concurrency && p->st.leases > p->lim_leases) p->lim_leases = p->st.leases;
    if (p->st.waiting > cfg->max_waiting && p->st.waiting > p->lim_waiting) p->lim_waiting = p->st.waiting;
    if (cfg->max_keys >= 0 && p->keys_used > cfg->max_keys && p->keys_used > p->lim_keys)
      p->lim_keys = p->keys_used;
    p->lim_any = (p->lim_live | p->lim_leases | p->lim_waiting | p->lim_keys) != 0;
  }
  while (lru_idle(p) != NONE && p->st.live + p->st.creating > cfg->max_live)
    destroy(p, lru_idle(p), CLIENTPOOL_BY_RESIZED);
  while (lru_idle(p) != NONE && p->st.idle > cfg->max_idle) destroy(p, lru_idle(p), CLIENTPOOL_BY_MAX_IDLE);
  for (k = 0; k < p->nkeys; k++) {
    if (!p->keys[k].used) continue;
    if (!(cfg->create_backoff > 0)) backoff_reset(p, k);
    shrink_key(p, k);
    key_maybe_free(p, k);
  }
  p->refill_signalled = 0;
  for (i = 0; i < p->nwarm; i++) floor_check(p, p->warm[i]);
  ka_pump(p, now);
  finish(p, now);
  return 0;
}

int clientpool_key_caps(clientpool_t *p, int32_t k, int32_t max_live, int32_t max_idle, double now) {
  key_t_ *key;
  now = clamp(p, now);
  if (!key_ok(p, k) || max_live > p->cfg.max_live || max_idle > p->cfg.max_idle) return CLIENTPOOL_EINVAL;
  if (p->closed) return CLIENTPOOL_ECLOSED;
  key = &p->keys[k];
  key->cap_live = max_live < 0 ? NONE : max_live;
  key->cap_idle = max_idle < 0 ? NONE : max_idle;
  shrink_key(p, k);
  floor_check(p, k);
  key_maybe_free(p, k);
  finish(p, now);
  return 0;
}

/* ---- the fast path (issue 17) ------------------------------------------
 * The common pair: an idle record granted when nothing waits, and released
 * back to idle.  Each is taken only where the general path (clientpool_acquire,
 * release) would do exactly its steps and nothing else: no waiter anywhere
 * (no key in a ready heap: dispatch serves nobody), no place kept, no fleet,
 * no gate paused or probing, no backoff window, no lowered cap pending, no
 * leak_threshold (a lease's deadline), capacity 1, the record not expired
 * (acquire) nor to be closed (release: closing_reason, max_idle).  The
 * helpers are the general path's; what is skipped are the checks those
 * conditions make no-ops (key_refresh, dispatch, gate_*, close_past_max_idle).
 * The fuzz harness checks both paths against its model (spec/c/fuzz_engine.c:
 * the fast path on for odd seeds, off for even ones, wb_fast_path). */

/* Whether nothing in the pool is unusual for the fast path.  The integer
 * terms are ORed, not short-circuited: in the common case every one is
 * read anyway, and one test is fewer instructions than a branch each. */
HOT int fast_ok(const clientpool_t *p, const key_t_ *key) {
  int32_t unusual = (p->kept ^ NONE) | p->closed | p->fl_mark | p->lim_any | (p->cfg.capacity ^ 1) |
                    p->rlen[RH_IDLE] | p->rlen[RH_CREATE] | p->gate.paused | p->gate.fpaused | p->gate.probe |
                    p->fast_off | key->gate.paused | key->gate.fpaused | key->gate.probe | key->fmark |
                    key->lim_live | key->wlen | (key->rpos ^ NONE);
  return unusual == 0 && !p->fl && !has(p->cfg.leak_threshold);
}

/* clientpool_acquire's idle grant: 1 with *g filled (and the call done), or
 * 0 with nothing changed. */
HOT int fast_acquire(clientpool_t *p, int32_t k, double now, clientpool_grant_t *g, int timed) {
  key_t_ *key;
  record_t *x;
  int32_t r, l, why;
  if (!key_ok(p, k)) return 0;
  key = &p->keys[k];
  r = key->idle_top;
  if (r == NONE || !fast_ok(p, key) || key->bstate == B_WINDOW || p->st.leases >= p->cfg.max_concurrency) return 0;
  x = &p->rec[r];
  if (idle_expired(p, key, x, now, &why)) return 0;
  l = lease_alloc(p, r, now);
  if (l == NONE) return 0;
  /* (as take_idle) */
  idle_unlink(p, r);
  x->nleases = 1;
  x->state = R_LEASED;
  BOTH(p, k, active, 1);
  BOTH(p, k, reused, 1);
  fill_idle(p, r, l, now, g);
  x->opos = NONE;
  floor_check(p, k);
  if (timed) arm(p);                   /* (finish: nothing to dispatch; untimed: see below) */
  return 1;
}

/* clientpool_release's release to idle (lease l valid, reason < 0): 1 when
 * done, or 0 with nothing changed. */
HOT int fast_release(clientpool_t *p, int32_t l, double now, int timed) {
  int32_t r = p->lea[l].record, k, cap;
  record_t *x = &p->rec[r];
  key_t_ *key;
  k = x->key;
  key = &p->keys[k];
  if (x->nleases != 1 || !fast_ok(p, key) || closing_reason(p, key, x, now) >= 0) return 0;
  cap = key_cap_idle(p, key);
  if (p->st.idle >= p->cfg.max_idle || (cap >= 0 && key->st.idle >= cap)) return 0;   /* (close_past_max_idle) */
  /* (as release) */
  lease_free(p, l);
  BOTH(p, k, active, -1);
  oremove(p, r);
  idle_push(p, r, now);
  if (timed) arm(p);                   /* (finish: nothing to dispatch; untimed: see below) */
  return 1;
}

int clientpool_acquire(clientpool_t *p, int32_t k, double now, clientpool_grant_t *g) {
  int kept;
  memset(g, 0, sizeof *g);
  g->key = k;
  now = clamp(p, now);
  if (fast_acquire(p, k, now, g, 1)) return g->status;
  kept = take_kept(p, k);
  if (p->closed) { g->status = CLIENTPOOL_CLOSED; return g->status; }
  if (!key_ok(p, k)) { g->status = CLIENTPOOL_STALE; return g->status; }
  /* expired records destroyed on the way may empty k: it must survive this
   * call (and, on MUST_WAIT, until the driver queues or forgets) */
  p->hold_key = k;
  if (p->keys[k].bstate == B_WINDOW) backoff_check(p, k, now);
  if (p->fl) { fl_gates_check(p); fl_lapse_check(p); }
  if (!admits(p, k)) {
    gate_t own = p->gate;
    own.flapsed = 0;                   /* (a lapse is no pause: its callers wait, whatever pause_mode) */
    if (p->cfg.pause_fail && (gate_blocked(&own) || gate_blocked(&p->keys[k].gate))) {
      BOTH(p, k, rejected, 1);
      g->status = CLIENTPOOL_PAUSED;
    } else if (p->st.waiting >= p->cfg.max_waiting) {
      BOTH(p, k, rejected, 1);
      g->status = CLIENTPOOL_FULL;
    } else {
      g->status = CLIENTPOOL_MUST_WAIT;
    }
  /* never barge past queued waiters of this key (unless it kept its place
   * ahead of them), nor past the concurrency cap */
  } else if ((p->keys[k].wlen == 0 || kept) && p->st.leases < p->cfg.max_concurrency &&
             !(p->fl_mark & FM_LEASE) && grant(p, k, now, g)) {
    gate_granted(p, g);
    if (kept) key_refresh(p, k);     /* (granted past k's waiters: re-sorted) */
  } else if (backoff_refuses(p, k)) {
    g->status = CLIENTPOOL_BACKOFF;
  } else if (p->st.waiting >= p->cfg.max_waiting) {
    BOTH(p, k, rejected, 1);
    g->status = CLIENTPOOL_FULL;
  } else {
    g->status = CLIENTPOOL_MUST_WAIT;
  }
  if (kept && g->status == CLIENTPOOL_MUST_WAIT) p->kept = k;   /* its wait uses it */
  finish(p, now);
  p->hold_key = NONE;
  if (g->status == CLIENTPOOL_FULL || g->status == CLIENTPOOL_PAUSED || g->status == CLIENTPOOL_BACKOFF)
    key_maybe_free(p, k);
  return g->status;
}

int32_t clientpool_wait(clientpool_t *p, int32_t k, double deadline, double now, uint32_t *gen) {
  return clientpool_wait_priority(p, k, deadline, 0, now, gen);
}

int32_t clientpool_wait_priority(clientpool_t *p, int32_t k, double deadline, int32_t priority, double now,
                                 uint32_t *gen) {
  int32_t w;
  waiter_t *x;
  int kept, held;
  now = clamp(p, now);
  if (p->closed) return -CLIENTPOOL_CLOSED;
  if (!key_ok(p, k)) return -CLIENTPOOL_STALE;
  held = p->kept != NONE;
  kept = take_kept(p, k);
  if (p->st.waiting >= p->cfg.max_waiting) {
    BOTH(p, k, rejected, 1);
    key_maybe_free(p, k);
    /* a place kept (by this caller or another key's) held dispatch back:
     * now that it is dropped, the waiters it held are served */
    if (held) finish(p, now);
    return -CLIENTPOOL_FULL;
  }
  if (!queue_room(&p->keys[k])) return CLIENTPOOL_ENOMEM;
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
  p->wai_used++;
  x->state = W_QUEUED;
  x->key = k;
  p->keys[k].wrefs++;
  x->result = CLIENTPOOL_PENDING;
  x->record = x->lease = NONE;
  x->lease_gen = 0;
  x->validate = 0;
  x->seq = ++p->seq;
  /* priority: placed as if it arrived PRIORITY_STEP arrivals earlier per
   * step up, which bounds how long a lower one is passed over */
  x->order = kept ? INT64_MIN / 2 + x->seq : x->seq - (int64_t)priority * CLIENTPOOL_PRIORITY_STEP;
  x->passed = 0;
  x->enq = now;
  x->idle = x->waited = 0;
  x->hpos = NONE;
  wpush(p, &p->keys[k], w);
  BOTH(p, k, waiting, 1);
  if (has(deadline) && hpush(p, &p->dl, deadline, H_WAITER, w) != 0) x->hpos = NONE;
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
       (key_cap_idle(p, &p->keys[k]) >= 0 && p->keys[k].st.idle > key_cap_idle(p, &p->keys[k])) ||
       (p->fl && !fl_keep_idle(p, r))))   /* (the fleet's max_idle: it stays idle with its IDLE unit, or goes) */
    destroy(p, r, CLIENTPOOL_BY_MAX_IDLE);
}

/* Gives a reservation back: its lease and record slot are freed. */
static void forfeit(clientpool_t *p, int32_t r, int failed) {
  record_t *x = &p->rec[r];
  int32_t k = x->key;
  BOTH(p, k, creating, -1);
  if (failed) BOTH(p, k, create_failed, 1);
  if (x->refill) {
    p->keys[k].refilling--;
    p->refilling--;
    if (p->fl) fl_give(p, CLIENTPOOL_FLEET_FLOOR, k);
  } else {
    gate_lease_ended(p, k, x->res_lease, p->lea[x->res_lease].gen);
    lease_free(p, x->res_lease);
  }
  if (p->fl) fl_give(p, CLIENTPOOL_FLEET_LIVE, k);
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
    p->hold_key = k;
    forfeit(p, r, 1);
    backoff_fail(p, k, now);
    p->hold_key = NONE;
    key_maybe_free(p, k);
    finish(p, now);
    return 0;
  }
  backoff_reset(p, k);
  BOTH(p, k, creating, -1);
  /* same-instant records still get distinct times: retire_upto and
   * retire_before(-1) go by creation order */
  x->created = p->last_created = now > p->last_created ? now : nextafter(p->last_created, HUGE_VAL);
  x->res_lease = NONE;                 /* (its lease is the caller's now) */
  if (has(p->cfg.max_lifetime) &&
      hpush(p, &p->dl, now + p->cfg.max_lifetime * (1.0 - p->cfg.lifetime_jitter * rnd(p)), H_LIFETIME, r) != 0) {
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
    else if (over_cap(p, &p->keys[k])) destroy(p, r, CLIENTPOOL_BY_RESIZED);   /* a cap lowered meanwhile */
    else {
      uint32_t gen = x->gen;
      idle_push(p, r, now);
      key_refresh(p, k);
      /* releases may have filled max_idle while it was created */
      dispatch(p, now);
      close_past_max_idle(p, r, gen, k);
    }
    /* its FLOOR unit goes only now, once it holds its IDLE unit (or was
     * granted or closed): given before, another member's refill could pass
     * the floor's check between the two (the fleet's floor is exact) */
    if (p->fl) fl_give(p, CLIENTPOOL_FLEET_FLOOR, k);
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
HOT int32_t closing_reason(const clientpool_t *p, const key_t_ *key, const record_t *x, double now) {
  if (x->doomed) return x->doomed - 1;
  if (p->closed) return CLIENTPOOL_BY_DRAIN;
  if (lifetime_over(p, x, now)) return CLIENTPOOL_BY_LIFETIME;
  if (x->retire || retired_in(p, key, x)) return CLIENTPOOL_BY_RETIRED;
  /* a cap lowered by clientpool_configure or key_caps: over it, a client
   * whose last lease ends is closed */
  if (over_cap(p, key)) return CLIENTPOOL_BY_RESIZED;
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
  if (reason < 0) reason = closing_reason(p, &p->keys[k], x, now);
  /* other members wait and this one holds more than its share: the client
   * goes back to the fleet, even past a waiter of ours (no member starves) */
  if (reason < 0 && p->fl && fl_shed_due(p, k)) reason = CLIENTPOOL_BY_SHED;
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

/* The fast path without a clock (issue 17: the read was half a LuaJIT pair).
 * Taken only where no duration is configured (p->timed): nothing then reads
 * the time it would stamp (idle_since, a lease's since) but a later
 * configure that sets a duration, and the engine's latest time (p->now) is
 * never later than the true one: an idle time is counted long, so an
 * idle_timeout or validate_after_idle set later closes or validates early,
 * never late.  A lease's age is counted long too: a leak_threshold set
 * later counts every lease held from the configure at least (p->stale:
 * never reported early).  The grant's idle is not measured (0): the driver
 * uses these only without a validate hook, the one reader of it.
 * Nor does it arm: with no duration configured it adds no deadline (no
 * idle_timeout, keepalive or leak_threshold: ka_arm and lease_alloc push
 * nothing), and taking an idle record or a lease off a heap left from an
 * earlier configure only moves the next deadline later; the call before
 * armed the timer at or before it (arm), so it stays early enough: 28 of
 * 406 instructions of an untimed pair (the fuzz harness compares EV_TIMER
 * with its model; it fails when the timed path skips the arm too). */
int clientpool_acquire_untimed(clientpool_t *p, int32_t k, clientpool_grant_t *g) {
  if (p->timed) return CLIENTPOOL_UNTIMED;
  memset(g, 0, sizeof *g);
  g->key = k;
  if (!fast_acquire(p, k, p->now, g, 0)) return CLIENTPOOL_UNTIMED;
  p->stale = 1;
  g->idle = 0;
  return g->status;
}

int clientpool_release_untimed(clientpool_t *p, int32_t l, uint32_t gen, int32_t reason) {
  lease_t *x;
  if (p->timed || reason >= 0) return CLIENTPOOL_UNTIMED;
  x = lease_get(p, l, gen);
  if (!x || p->rec[x->record].state != R_LEASED) return CLIENTPOOL_STALE;
  if (!fast_release(p, l, p->now, 0)) return CLIENTPOOL_UNTIMED;
  p->stale = 1;
  return 0;
}

int clientpool_release(clientpool_t *p, int32_t l, uint32_t gen, int32_t reason, double now) {
  lease_t *x;
  now = clamp(p, now);
  x = lease_get(p, l, gen);
  if (!x || p->rec[x->record].state != R_LEASED) return CLIENTPOOL_STALE;
  if (reason >= CLIENTPOOL_BY_COUNT) reason = CLIENTPOOL_BY_ERROR;
  if (reason < 0 && fast_release(p, l, now, 1)) return 0;
  if (p->fl) fl_lapse_check(p);
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

int clientpool_destroyed(clientpool_t *p, int32_t r, double now) {
  record_t *x;
  int32_t k;
  now = clamp(p, now);
  if (r < 0 || r >= p->nrec || p->rec[r].state != R_CLOSING) return CLIENTPOOL_STALE;
  x = &p->rec[r];
  k = x->key;
  BOTH(p, k, closing, -1);
  if (p->fl) fl_give(p, CLIENTPOOL_FLEET_LIVE, k);   /* the cap is physical: only now */
  if (x->seen) rec_free(p, r);
  else rec_bury(p, r);               /* reused when its EV_DESTROY is read */
  key_refresh(p, k);                 /* its key's cap has room again */
  floor_check(p, k);
  key_maybe_free(p, k);
  finish(p, now);                    /* waiters are served from the room */
  return 0;
}

int clientpool_retire(clientpool_t *p, int32_t r, double now) {
  now = clamp(p, now);
  if (r < 0 || r >= p->nrec || p->rec[r].state == R_FREE || p->rec[r].state == R_CLOSING)
    return CLIENTPOOL_STALE;
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
  p->retiring = 1;
  if (k < 0) {
    if (before < 0) p->retire_upto = p->last_created;
    else if (before > p->retire_before) p->retire_before = before;
    for (r = p->g_oldest; r != NONE;) {
      int32_t next = p->rec[r].gnext;
      /* (one out for a keepalive: at its report) */
      if (p->rec[r].state == R_IDLE && retired_by_age(p, &p->rec[r])) destroy(p, r, CLIENTPOOL_BY_RETIRED);
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
  backoff_check(p, k, now);
  /* a destroy dispatches nothing: the room it frees is still there below */
  release(p, l, CLIENTPOOL_BY_INVALID, now);
  if (p->closed) g->status = CLIENTPOOL_CLOSED;
  /* paused meanwhile (validate may yield): the caller queues like anyone */
  else if (!admits(p, k)) g->status = CLIENTPOOL_MUST_WAIT;
  else if (grant(p, k, now, g)) gate_granted(p, g);
  else {
    /* nothing free now (at max_live the invalid record's room comes when
     * its destroy is reported): the caller keeps its place, its next wait
     * queues ahead of every waiter */
    g->status = CLIENTPOOL_MUST_WAIT;
    p->kept = k;
  }
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
  return closing_reason(p, &p->keys[x->key], x, now) >= 0;
}

int clientpool_retire_upto(clientpool_t *p, int32_t r, double now) {
  int32_t k, i;
  record_t *x;
  now = clamp(p, now);
  if (r < 0 || r >= p->nrec) return CLIENTPOOL_EINVAL;
  x = &p->rec[r];
  if (x->state != R_IDLE && x->state != R_LEASED) return CLIENTPOOL_EINVAL;
  k = x->key;
  p->retiring = 1;
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
  for (i = 0; i < p->nwarm; i++) backoff_check(p, p->warm[i], now);
  if (p->floor_on && !p->closed && room(p)) {
    for (i = 0; i < p->nwarm; i++) {
      int32_t k = p->warm[i], r;
      if (floor_deficit(p, k) <= 0) continue;
      if (!key_room(p, k)) continue;
      if (p->fl) {
        /* the floor is the fleet's: FLOOR refused, it is met elsewhere */
        if ((p->keys[k].fmark & KM_FLOOR) || !fl_take(p, CLIENTPOOL_FLEET_FLOOR, k)) continue;
        if (!fl_take(p, CLIENTPOOL_FLEET_LIVE, k)) {
          fl_give(p, CLIENTPOOL_FLEET_FLOOR, k);
          key_refresh(p, k);
          if (!room(p)) break;
          continue;
        }
      }
      r = rec_alloc(p);
      if (r == NONE) {
        if (p->fl) { fl_give(p, CLIENTPOOL_FLEET_FLOOR, k); fl_give(p, CLIENTPOOL_FLEET_LIVE, k); }
        break;
      }
      rec_init(p, r, k, now);
      p->rec[r].refill = 1;
      p->keys[k].refilling++;
      p->refilling++;
      BOTH(p, k, creating, 1);
      key_refresh(p, k);              /* k may have reached its cap */
      p->floor_held = 0;              /* (the next refill call looks at every warm key) */
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
      else if (p->rec[r].state == R_CHECKING) {   /* out for a keepalive: at its report */
        gl_unlink(p, r);
        p->rec[r].retire |= IDLE_OVER;
      } else destroy(p, r, CLIENTPOOL_BY_IDLE);
      continue;
    }
    if (p->dl.len > 0 && p->dl.a[0].t <= now) {
      hent_t e = p->dl.a[0];
      hremove(p, &p->dl, hpos_of(p, &p->dl.a[0]));
      if (e.kind == H_WAITER) {
        waiter_dequeue(p, e.idx, CLIENTPOOL_TIMEOUT, now);
        push_event(p, CLIENTPOOL_EV_WAKE, e.idx, (int32_t)p->wai[e.idx].gen, p->wai[e.idx].key, 0);
      } else if (e.kind == H_BACKOFF) {
        backoff_due(p, e.idx, now);
      } else if (e.kind == H_LIFETIME) {
        /* a leased record is retired at its release; a shared one takes
         * no new lease from now on */
        if (p->rec[e.idx].state == R_IDLE) destroy(p, e.idx, CLIENTPOOL_BY_LIFETIME);
        else if (p->rec[e.idx].state == R_LEASED) {
          p->rec[e.idx].retire |= LIFETIME_OVER;
          oremove(p, e.idx);
          key_refresh(p, p->rec[e.idx].key);
        } else p->rec[e.idx].retire |= LIFETIME_OVER;   /* out for a keepalive */
      } else {
        lease_t *x = &p->lea[e.idx];
        push_event(p, CLIENTPOOL_EV_LEAK, e.idx, (int32_t)x->gen, p->rec[x->record].key, x->since);
      }
      continue;
    }
    break;
  }
  ka_pump(p, now);
  finish(p, now);
}

void clientpool_close(clientpool_t *p, double now) {
  int32_t k;
  now = clamp(p, now);
  if (p->closed) return;
  p->closed = 1;
  p->floor_on = 0;
  p->nwarm = 0;
  p->kept = NONE;                    /* nobody is served any more */
  for (k = 0; k < p->nkeys; k++) {
    key_t_ *key = &p->keys[k];
    if (!key->used) continue;
    key->pinned = 0;
    backoff_reset(p, k);
    while (key->wlen > 0) {
      int32_t w = key->wheap[0];
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
  /* the driver knows now: the id may be reused (rec_bury, key_maybe_free);
   * a closing record's slot only once its destroy is reported done too */
  if (ev->type == CLIENTPOOL_EV_DESTROY) {
    if (p->rec[ev->a].state == R_CLOSING) p->rec[ev->a].seen = 1;
    else rec_reuse(p, ev->a);
  } else if (ev->type == CLIENTPOOL_EV_KEY_FREE) key_reuse(p, ev->a);
  return ev->type;
}

int32_t clientpool_pending(const clientpool_t *p) { return p->evlen; }

int clientpool_queue_full(const clientpool_t *p) {
  /* (waiter slots, not queued waiters: a waiter granted a client whose
   * coroutine died before it claimed it still holds the client, and only
   * the driver's reaping gives it back) */
  return p->wai_used > 0 && p->wai_used >= p->cfg.max_waiting;
}

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

int32_t clientpool_lease_record(const clientpool_t *p, int32_t l, uint32_t gen, int32_t *key) {
  int32_t r;
  if (l < 0 || l >= p->nlea || (r = p->lea[l].record) == NONE || p->lea[l].gen != gen) return NONE;
  if (key) *key = p->rec[r].key;
  return r;
}

int clientpool_lease_checkout(clientpool_t *p, int32_t l, uint32_t gen) {
  if (l < 0 || l >= p->nlea || p->lea[l].record == NONE || p->lea[l].gen != gen) return -1;
  p->lea[l].checkout = 1;
  return 0;
}

int32_t clientpool_checkout_record(const clientpool_t *p, int32_t l, uint32_t gen, int32_t *key) {
  if (l < 0 || l >= p->nlea || !p->lea[l].checkout) return NONE;
  return clientpool_lease_record(p, l, gen, key);
}

int clientpool_is_closed(const clientpool_t *p) { return p->closed; }

/* ---- the fleet, public ------------------------------------------------ */

int clientpool_set_fleet(clientpool_t *p, clientpool_fleet_t *f, int32_t flags) {
  if (!f || p->fl || p->keys_used > 0 || p->closed) return CLIENTPOOL_EINVAL;
  clientpool_fleet_retain(f);
  p->fl = f;
  p->fl_lease = (flags & CLIENTPOOL_FLEET_USE_LEASES) != 0;
  p->fl_gates = clientpool_fleet_gates_gen(f);
  return 0;
}

int clientpool_key_fleet(clientpool_t *p, int32_t k, int32_t slot) {
  const key_t_ *key;
  if (!p->fl || !key_ok(p, k)) return CLIENTPOOL_EINVAL;
  key = &p->keys[k];
  if (key->st.live || key->st.creating || key->st.closing || key->st.leases || key->wrefs) return CLIENTPOOL_EINVAL;
  p->keys[k].fslot = slot < 0 ? NONE : slot;
  return 0;
}

/* Waiters of key k that would create if the pool had room (paused ones
 * and those an idle record serves aside). */
static int32_t would_create(const clientpool_t *p, int32_t k) {
  const key_t_ *key = &p->keys[k];
  if (!key->used || key->wlen == 0 || gate_blocked(&key->gate)) return 0;
  if (key->idle_top != NONE || key->olen > 0 || !key_room(p, k)) return 0;
  return key->wlen;
}

int32_t clientpool_blocked(const clientpool_t *p, int32_t kind, int32_t k) {
  int64_t n = 0, room_left;
  int32_t i;
  if (!p->fl || p->closed || gate_blocked(&p->gate)) return 0;
  if (k >= 0) {
    const key_t_ *key;
    if (kind != CLIENTPOOL_FLEET_LIVE || !key_ok(p, k)) return 0;
    key = &p->keys[k];
    if (!(key->fmark & KM_LIVE) || gate_blocked(&key->gate)) return 0;
    n = key->wlen;
    if (key_cap_live(p, key) >= 0) {
      room_left = (int64_t)key_cap_live(p, key) - key_held(key);
      if (n > room_left) n = room_left;
    }
  } else if (kind == CLIENTPOOL_FLEET_LIVE) {
    if (!(p->fl_mark & FM_LIVE)) return 0;
    for (i = 0; i < p->nkeys; i++) n += would_create(p, i);
    room_left = (int64_t)p->cfg.max_live - (p->st.live + p->st.creating + p->st.closing);
    if (n > room_left) n = room_left;
  } else if (kind == CLIENTPOOL_FLEET_LEASE) {
    if (!(p->fl_mark & FM_LEASE)) return 0;
    n = p->st.waiting;
    room_left = (int64_t)p->cfg.max_concurrency - p->st.leases;
    if (n > room_left) n = room_left;
  }
  return n > 0 ? (int32_t)n : 0;
}

int32_t clientpool_retry(clientpool_t *p, double now) {
  int32_t was, k;
  now = clamp(p, now);
  if (!p->fl) return 0;
  was = p->fl_mark | (p->fl_kmarked > 0 ? CLIENTPOOL_BLOCKED_KEY : 0);
  fl_gates_check(p);
  fl_lapse_check(p);
  p->fl_mark = 0;
  p->fl_signalled = 0;
  for (k = 0; k < p->nkeys; k++) {
    if (!p->keys[k].used || !p->keys[k].fmark) continue;
    km_clear(p, k, KM_LIVE | KM_FLOOR);
    key_refresh(p, k);
  }
  p->refill_signalled = 0;
  for (k = 0; k < p->nwarm; k++) floor_check(p, p->warm[k]);
  finish(p, now);
  return was;
}

/* Destroys up to n idle records of key k (k < 0: of any key), least
 * recently used first, for the fleet.  Returns how many. */
static int32_t shed_idle(clientpool_t *p, int32_t k, int32_t n, int32_t why) {
  int32_t done = 0;
  while (done < n) {
    int32_t r = k < 0 ? lru_idle(p) : idle_bottom(p, k);
    if (r == NONE) break;
    destroy(p, r, why);
    done++;
  }
  return done;
}

int32_t clientpool_rebalance(clientpool_t *p, double now) {
  int32_t n, k, done = 0;
  now = clamp(p, now);
  if (!p->fl || p->closed) return 0;
  /* past the fleet's validity no client stays idle (as a release: the
   * machine's idle cap is nothing until its lease is renewed) */
  fl_lapse_check(p);
  if (p->gate.flapsed) done += shed_idle(p, NONE, INT32_MAX, CLIENTPOOL_BY_MAX_IDLE);
  n = clientpool_fleet_shed(p->fl, NONE) - p->st.closing;
  if (n > 0) done += shed_idle(p, NONE, n, CLIENTPOOL_BY_SHED);
  for (k = 0; k < p->nkeys; k++) {
    key_t_ *key = &p->keys[k];
    if (!key->used || key->fslot < 0) continue;   /* (each call renews the key's pledge) */
    n = clientpool_fleet_shed(p->fl, key->fslot) - key->st.closing;
    if (n > 0) {
      p->hold_key = k;
      done += shed_idle(p, k, n, CLIENTPOOL_BY_SHED);
      p->hold_key = NONE;
      key_maybe_free(p, k);
    }
  }
  /* The fleet's floor of a warm key was met elsewhere (KM_FLOOR), but the
   * member holding it may have died since, its idle units reclaimed (or
   * its idle clients leased or closed): nothing of this member's would
   * clear the mark, so the driver's tick looks again (two loads a key). */
  for (k = 0; k < p->nwarm; k++) {
    int32_t w = p->warm[k], fs = p->keys[w].fslot;
    if (!(p->keys[w].fmark & KM_FLOOR)) continue;
    if (fs >= 0 && (int64_t)clientpool_fleet_count(p->fl, CLIENTPOOL_FLEET_IDLE, fs) +
                   clientpool_fleet_count(p->fl, CLIENTPOOL_FLEET_FLOOR, fs) >= p->cfg.min_idle) continue;
    km_clear(p, w, KM_FLOOR);
    floor_check(p, w);
  }
  finish(p, now);
  return done;
}

int clientpool_gate_fleet(clientpool_t *p, int32_t k, int32_t paused, double now) {
  gate_t *gt = gate_of(p, k);
  now = clamp(p, now);
  if (!gt || !p->fl) return CLIENTPOOL_EINVAL;
  gt->fpaused = paused != 0;
  fl_lapse_check(p);
  if (k >= 0) key_refresh(p, k);
  finish(p, now);
  return 0;
}

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
  CHECK(a->closing == b->closing, "%s: closing %d, counted %d", what, a->closing, b->closing);
  CHECK(a->opened - a->closed == a->live, "%s: opened - closed != live", what);
  return 0;
}

/* The fleet's side: the member holds at least what this engine holds
 * (exactly, when it is the handle's only engine: the tests compare), every
 * idle record its IDLE unit, and marks only while waiters wait. */
static int fl_check(const clientpool_t *p, char *buf, size_t n) {
  int32_t i, k, kmarked = 0, refilling = 0;
  const clientpool_fleet_t *f = p->fl;
  for (i = 0; i < p->nrec; i++) {
    const record_t *x = &p->rec[i];
    CHECK(!((x->state == R_IDLE || x->state == R_CHECKING) && !x->fidle), "idle record %d holds no fleet IDLE unit", i);
  }
  for (k = 0; k < p->nkeys; k++) {
    const key_t_ *key = &p->keys[k];
    if (!key->used) continue;
    refilling += key->refilling;
    if (key->fmark & KM_LIVE) kmarked++;
    CHECK(!(key->fmark & KM_LIVE) || key->wlen > 0, "key %d marked refused by the fleet without waiters", k);
    if (key->fslot < 0) continue;
    CHECK(clientpool_fleet_held(f, CLIENTPOOL_FLEET_LIVE, key->fslot) >= key_held(key),
          "key %d: the fleet share LIVE %d < held %d", k, clientpool_fleet_held(f, CLIENTPOOL_FLEET_LIVE, key->fslot),
          key_held(key));
    CHECK(clientpool_fleet_held(f, CLIENTPOOL_FLEET_IDLE, key->fslot) >= key->st.idle,
          "key %d: the fleet share IDLE %d < idle %d", k, clientpool_fleet_held(f, CLIENTPOOL_FLEET_IDLE, key->fslot),
          key->st.idle);
    CHECK(clientpool_fleet_held(f, CLIENTPOOL_FLEET_FLOOR, key->fslot) >= key->refilling,
          "key %d: the fleet share FLOOR < refilling %d", k, key->refilling);
    CHECK(!p->fl_lease || clientpool_fleet_held(f, CLIENTPOOL_FLEET_LEASE, key->fslot) >= key->st.leases,
          "key %d: the fleet share LEASE < leases %d", k, key->st.leases);
  }
  CHECK(kmarked == p->fl_kmarked, "keys marked %d, counted %d", p->fl_kmarked, kmarked);
  CHECK(p->st.waiting > 0 || (p->fl_mark == 0 && kmarked == 0), "fleet marks %d without waiters", p->fl_mark);
  CHECK(clientpool_fleet_held(f, CLIENTPOOL_FLEET_LIVE, NONE) >= p->st.live + p->st.creating + p->st.closing,
        "the fleet share LIVE %d < held %d", clientpool_fleet_held(f, CLIENTPOOL_FLEET_LIVE, NONE),
        p->st.live + p->st.creating + p->st.closing);
  CHECK(clientpool_fleet_held(f, CLIENTPOOL_FLEET_IDLE, NONE) >= p->st.idle, "the fleet share IDLE < idle %d", p->st.idle);
  CHECK(clientpool_fleet_held(f, CLIENTPOOL_FLEET_FLOOR, NONE) >= refilling, "the fleet share FLOOR < refilling %d", refilling);
  CHECK(!p->fl_lease || clientpool_fleet_held(f, CLIENTPOOL_FLEET_LEASE, NONE) >= p->st.leases,
        "the fleet share LEASE < leases %d", p->st.leases);
  return 0;
}

int clientpool_check(const clientpool_t *p, char *buf, size_t n) {
  clientpool_stats_t tot, *per;
  int32_t i, k, used = 0, wused = 0, ready = 0, refilling = 0;
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
    if (x->state == R_CLOSING) {
      s->closing++; tot.closing++;
      if (x->hpos != NONE || x->nleases != 0) FAIL("closing record %d holds a deadline or leases", i);
      continue;
    }
    if (x->state == R_CREATING) {
      s->creating++; tot.creating++;
      if (x->refill) s->rejected++;      /* (used here to count refills) */
      continue;
    }
    if (x->state == R_LEASED && x->nleases > c->capacity)
      FAIL("record %d carries %d leases > capacity", i, x->nleases);
    {
      int open = x->state == R_LEASED && x->nleases < c->capacity && !x->doomed && !x->retire;
      int in_heap = x->state == R_LEASED && x->opos != NONE;
      if (open != in_heap && !(open && c->capacity == 1))
        FAIL("record %d open-heap membership wrong", i);
      if (in_heap && p->keys[x->key].oheap[x->opos] != i) FAIL("record %d open-heap position", i);
    }
    s->live++; tot.live++;
    if (x->state == R_IDLE || x->state == R_CHECKING) {
      s->idle++; tot.idle++;
      if (x->kpos != NONE && (x->state == R_CHECKING || x->kpos < 0 || x->kpos >= p->ka.len ||
                              p->ka.a[x->kpos].idx != i || p->ka.a[x->kpos].kind != H_KEEPALIVE))
        FAIL("idle record %d keepalive entry %d wrong", i, x->kpos);
      if (x->state == R_CHECKING) { s->keepalive++; tot.keepalive++; }   /* (counts those out) */
      else if (x->retire & IDLE_OVER) FAIL("idle record %d marked past idle_timeout", i);
    } else {
      if (x->nleases < 1) FAIL("leased record %d has no lease", i);
      s->active++; tot.active++;
    }
  }
  for (i = 0; i < p->nlea; i++) {
    const lease_t *x = &p->lea[i];
    if (x->record == NONE) continue;
    if (p->rec[x->record].state == R_FREE || p->rec[x->record].state == R_IDLE ||
        p->rec[x->record].state == R_CLOSING)
      FAIL("lease %d points at record %d in state %d", i, x->record, p->rec[x->record].state);
    per[p->rec[x->record].key].leases++; tot.leases++;
  }
  for (i = 0; i < p->nwai; i++) {
    const waiter_t *x = &p->wai[i];
    if (x->state != W_FREE) wused++;
    if (x->state != W_QUEUED) continue;
    per[x->key].waiting++; tot.waiting++;
  }
  if (wused != p->wai_used) FAIL("waiter slots used %d, counted %d", p->wai_used, wused);
  tot.opened = p->st.opened; tot.closed = p->st.closed;
  if (check_counts(&p->st, &tot, "pool", buf, n)) { free(per); return -1; }
  for (k = 0; k < p->nkeys; k++) {
    const key_t_ *key = &p->keys[k];
    int32_t w, cnt = 0;
    if (!key->used) continue;
    used++;
    if (per[k].rejected != key->refilling) FAIL("key %d refilling %d, counted %g", k, key->refilling, per[k].rejected);
    refilling += key->refilling;
    /* over max_idle only while all its idle records are out for a keepalive
     * (a cap lowered meanwhile: each is closed at its report) */
    if (key_cap_idle(p, key) >= 0 && key->st.idle > key_cap_idle(p, key) && key->st.idle != key->nchecking)
      FAIL("key %d over its max_idle", k);
    per[k].opened = key->st.opened; per[k].closed = key->st.closed;
    if (check_counts(&key->st, &per[k], "key", buf, n)) { free(per); return -1; }
    if (key_cap_live(p, key) >= 0 && key_held(key) > key_cap_live(p, key) && key_held(key) > key->lim_live)
      FAIL("key %d over its max_live", k);
    for (i = 0; i < key->wlen; i++) {
      w = key->wheap[i];
      if (p->wai[w].wpos != i || p->wai[w].state != W_QUEUED || p->wai[w].key != k)
        FAIL("key %d queue position %d broken", k, i);
      if (i > 0 && wbefore(&p->wai[w], &p->wai[key->wheap[(i - 1) / 2]])) FAIL("key %d queue out of order", k);
    }
    if (key->wlen != per[k].waiting) FAIL("key %d queue holds %d, counted %d", k, key->wlen, per[k].waiting);
    if (per[k].keepalive != key->nchecking)
      FAIL("key %d checking %d, counted %g", k, key->nchecking, per[k].keepalive);
    for (w = key->idle_top; w != NONE; w = p->rec[w].knext) {
      if (p->rec[w].state != R_IDLE || p->rec[w].key != k) FAIL("key %d idle stack broken", k);
      cnt++;
    }
    if (cnt + key->nchecking != key->st.idle)
      FAIL("key %d idle stack holds %d (+ %d checking), counted %d", k, cnt, key->nchecking, key->st.idle);
    if (key->rheap != key_ready(p, k) || (key->rpos == NONE) != (key->rheap == NONE))
      FAIL("key %d ready-heap membership wrong", k);
    if (key->rpos != NONE) ready++;
    if ((key->bstate == B_WINDOW && key->bpos == NONE) || (key->bstate == B_NONE && (key->bpos != NONE || key->fails)))
      FAIL("key %d backoff state %d, deadline %d, failures %d", k, key->bstate, key->bpos, key->fails);
  }
  free(per);
#undef FAIL
  CHECK(used == p->keys_used, "keys used %d, counted %d", p->keys_used, used);
  CHECK(c->max_keys < 0 || used <= c->max_keys || used <= p->lim_keys, "more than max_keys keys");
  CHECK(ready == p->rlen[0] + p->rlen[1], "ready heaps hold %d, counted %d",
        p->rlen[0] + p->rlen[1], ready);
  CHECK(p->st.live + p->st.creating + p->st.closing <= c->max_live ||
        p->st.live + p->st.creating + p->st.closing <= p->lim_live,
        "live %d + creating %d + closing %d > max_live %d",
        p->st.live, p->st.creating, p->st.closing, c->max_live);
  CHECK(p->st.leases <= c->max_concurrency || p->st.leases <= p->lim_leases,
        "leases %d > max_concurrency", p->st.leases);
  CHECK(p->st.waiting <= c->max_waiting || p->st.waiting <= p->lim_waiting,
        "waiting %d > max_waiting", p->st.waiting);
  CHECK(p->st.idle <= c->max_idle || p->st.idle == p->nchecking, "idle %d > max_idle %d", p->st.idle, c->max_idle);
  CHECK(refilling == p->refilling, "refills in flight %d, counted %d", p->refilling, refilling);
  for (h = 0; h < 2; h++) {
    const int32_t *a = p->rheap[h];
    for (i = 0; i < p->rlen[h]; i++) {
      int32_t l = 2 * i + 1;
      CHECK(p->keys[a[i]].rpos == i && p->keys[a[i]].rheap == h, "ready heap position wrong");
      if (l < p->rlen[h]) CHECK(!kbefore(p, a[l], a[i]), "ready heap order");
      if (l + 1 < p->rlen[h]) CHECK(!kbefore(p, a[l + 1], a[i]), "ready heap order");
    }
  }
  for (h = 0; h < 2; h++) {
    const heap_t *hp = h ? &p->ka : &p->dl;
    for (i = 0; i < hp->len; i++) {
      int32_t l = 2 * i + 1;
      CHECK(*hpos_of((clientpool_t *)p, &hp->a[i]) == i, "%s heap position wrong", h ? "keepalive" : "deadline");
      CHECK((hp->a[i].kind == H_KEEPALIVE) == (h == 1), "%s heap holds a wrong kind", h ? "keepalive" : "deadline");
      if (l < hp->len) CHECK(hp->a[i].t <= hp->a[l].t, "%s heap order", h ? "keepalive" : "deadline");
      if (l + 1 < hp->len) CHECK(hp->a[i].t <= hp->a[l + 1].t, "%s heap order", h ? "keepalive" : "deadline");
    }
  }
  CHECK(tot.keepalive == p->nchecking && p->nchecking <= CLIENTPOOL_KEEPALIVE_MAX,
        "checking %d, counted %g", p->nchecking, tot.keepalive);
  /* after dispatch nothing queued could have been served */
  {
    int32_t held;
    CHECK(p->closed || p->kept != NONE || p->st.leases >= c->max_concurrency || (p->fl_mark & FM_LEASE) ||
          next_ready(p, &held) == NONE,
          "a servable waiter is left queued");
  }
  if (p->fl) return fl_check(p, buf, n);
  return 0;
}
