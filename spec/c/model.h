/*
 * model.h - a reference model of the clientpool engine, for the fuzz harness
 * (spec/c/fuzz_engine.c).
 *
 * The model restates the rules of docs/api.md and docs/decisions.md
 * ("Engine and driver", "Acquire, wait, release", pause/probe, warm floor,
 * shared leases) as plainly as possible: objects live in small fixed arrays,
 * every count (live, idle, active, leases, creating, waiting) is recomputed
 * by a linear scan instead of being kept up to date, the idle stack and the
 * pool-wide idle order are sequence numbers, and the dispatcher looks at
 * every key on each turn.  There are no heaps and no incremental
 * bookkeeping, so there is little to get wrong.  It shares no code with
 * csrc/engine.c: only the public types and constants of clientpool.h.
 *
 * Its entry points mirror clientpool.h one for one, with the model's own ids
 * for keys, records, leases and waiters (slots with a generation, like the
 * engine's, but allocated independently); the harness maps ids between the
 * two.  Events are queued like the engine's, with model ids.
 *
 * Where the contract leaves the engine a free choice the model asks an
 * oracle (the harness answers from what the engine did, and the answer is
 * checked to be one the rules allow):
 *   M_ORACLE_SHARE    capacity > 1: which of the open records with the
 *                     fewest leases a share goes to (ties);
 *   M_ORACLE_RETIRED  capacity > 1: whether an open record past max_lifetime
 *                     or retired by age was already met (and retired) by the
 *                     engine's lazy scan, which stops at the first usable one;
 *   M_ORACLE_REFILL   which warm key below its floor a refill serves;
 *   M_ORACLE_KEEPALIVE which of the idle records whose keepalive is due at
 *                     the same earliest time goes out first (ties).
 */
#ifndef CLIENTPOOL_MODEL_H
#define CLIENTPOOL_MODEL_H

#include "clientpool.h"

#define M_MAXREC 32
#define M_MAXLEASE 96
#define M_MAXWAIT 96
#define M_MAXKEY 16
#define M_MAXEV 512

enum { MR_FREE = 0, MR_CREATING, MR_IDLE, MR_LEASED, MR_CLOSING, MR_CHECKING };
enum { MW_FREE = 0, MW_QUEUED, MW_DONE };
enum { MP_NONE = 0, MP_READY, MP_OUT };           /* probe state of a gate */
enum { MB_NONE = 0, MB_WINDOW, MB_PROBE };        /* create backoff of a key */
enum { M_ORACLE_SHARE = 0, M_ORACLE_RETIRED, M_ORACLE_REFILL, M_ORACLE_KEEPALIVE };

/* who:  M_ORACLE_SHARE: the waiter being served, or -1 for a direct acquire;
 *       M_ORACLE_RETIRED: the record in question (cand is empty).
 * Returns the chosen candidate (SHARE, REFILL) or 1/0 (RETIRED). */
typedef int (*m_oracle_fn)(void *ctx, int what, int who, const int *cand, int n);

typedef struct m_gate {
  int paused;
  int probe;            /* MP_* */
  int probe_lease;      /* while MP_OUT: the probe's lease (id and gen) */
  unsigned probe_gen;
} m_gate_t;

typedef struct m_record {
  int state;            /* MR_* */
  unsigned gen;
  int key;
  int nleases;
  int retire;           /* takes no new lease; destroyed at release */
  int doomed;           /* 0, or 1 + the reason a co-holder lost it */
  int refill;           /* while creating: a warm-floor reservation (no lease) */
  int res_lease;        /* while creating (not refill): the reservation's lease */
  int lifetime_armed;   /* its max_lifetime deadline has not been processed by tick */
  int lifetime_over;    /* tick found it past max_lifetime while leased or out */
  int retired;          /* model_retire was called on it */
  int idle_over;        /* out for a keepalive, past idle_timeout (off the pool's idle order) */
  int ka_armed;         /* idle: its keepalive is due at kdeadline */
  double kdeadline;
  double created, expires, idle_since, gl_since;
  unsigned long long cseq;       /* creation order (retire_before(-1)) */
  unsigned long long stack_seq;  /* when it went idle: the key's LIFO top is the highest */
  unsigned long long gl_seq;     /* pool-wide idle order: the least recently used is the lowest */
} m_record_t;

typedef struct m_lease {
  int alive;
  unsigned gen;
  int record;
  double since;
  int leak_armed;       /* leak_threshold report still due */
} m_lease_t;

typedef struct m_waiter {
  int state;            /* MW_* */
  unsigned gen;
  int key;
  long long seq;        /* arrival order, pool-wide */
  long long order;      /* its place: seq - priority * PRIORITY_STEP, or (kept) below every place */
  double enq, deadline;     /* deadline < 0: none */
  int result, record, lease;
  unsigned lease_gen;
  int validate, shared;
  int passed;           /* younger waiters of other keys served from idle records first */
  double idle, waited;
} m_waiter_t;

typedef struct m_key {
  int used;
  unsigned gen;
  int pinned;           /* 0, 1, or 2 (warm) */
  m_gate_t gate;
  double retire_before;
  unsigned long long retire_seq;
  int refilling;        /* warm-floor reservations in flight */
  int fails;            /* creates failed in a row */
  int bstate;           /* MB_* */
  double bdeadline;     /* the window's end, or when the failures are forgotten; < 0: none */
  int cap_live, cap_idle;   /* model_key_caps: the key's own caps, or -1 (the pool's) */
  clientpool_stats_t st;    /* counters only; the gauges are computed */
} m_key_t;

typedef struct model {
  clientpool_config_t cfg;
  m_oracle_fn oracle;
  void *octx;
  int closed;
  double now, armed;
  unsigned long long rng, cseq, idle_seq;
  long long seq;
  int hold_key;
  int kept;             /* the key whose regrant caller keeps its place, or -1 */
  int floor_on, refill_signalled;
  int floor_held;            /* max_idle had no room for a warm key that was short */
  double retire_before;
  unsigned long long retire_seq;
  double last_created;  /* creation times are made strictly increasing, as the engine does */
  m_gate_t gate;
  clientpool_stats_t st;    /* counters only */
  m_record_t rec[M_MAXREC];
  m_lease_t lea[M_MAXLEASE];
  m_waiter_t wai[M_MAXWAIT];
  m_key_t keys[M_MAXKEY];
  clientpool_event_t ev[M_MAXEV];
  int evhead, evlen;
  int nchecking;        /* records out for a keepalive */
  int overflow;         /* an array ran out: the run is not comparable any more */
  int stale;            /* the harness made an untimed call (clientpool_acquire_untimed): stamps
                           may be early, a leak_threshold set later counts from the configure */
} model_t;

/* The model's answer of acquire, claim and cancel (ids are the model's). */
typedef struct m_grant {
  int status, record, lease;
  unsigned lease_gen;
  int key, validate, shared;
  double idle, waited;
} m_grant_t;

void model_init(model_t *m, const clientpool_config_t *cfg, m_oracle_fn oracle, void *octx);

int model_key_open(model_t *m);
int model_key_pin(model_t *m, int key, int pinned);
int model_key_forget(model_t *m, int key);
int model_acquire(model_t *m, int key, double now, m_grant_t *g);
int model_wait(model_t *m, int key, double deadline, double now, unsigned *gen);
int model_wait_priority(model_t *m, int key, double deadline, int priority, double now, unsigned *gen);
int model_created(model_t *m, int record, int ok, double now);
int model_release(model_t *m, int lease, unsigned gen, int reason, double now);
int model_claim(model_t *m, int waiter, unsigned gen, double now, m_grant_t *g);
int model_cancel(model_t *m, int waiter, unsigned gen, int status, double now, m_grant_t *g);
int model_abandon(model_t *m, int waiter, unsigned gen, double now);
int model_leak(model_t *m, int lease, unsigned gen, double now);
int model_retire(model_t *m, int record, double now);
int model_destroyed(model_t *m, int record, double now);
int model_keepalive_done(model_t *m, int record, int ok, double now);
int model_configure(model_t *m, const clientpool_config_t *cfg, double now);
int model_key_caps(model_t *m, int key, int max_live, int max_idle, double now);
int model_retire_before(model_t *m, int key, double before, double now);
int model_retire_upto(model_t *m, int r, double now);
int model_regrant(model_t *m, int l, unsigned gen, double now, m_grant_t *g);
int model_pause(model_t *m, int key, double now);
int model_resume(model_t *m, int key, int probe, double now);
int model_probe_ok(model_t *m, int lease, unsigned gen, double now);
int model_gate(const model_t *m, int key);
void model_floor(model_t *m, int on, double now);
int model_refill(model_t *m, double now, int *key);
void model_tick(model_t *m, double now);
void model_close(model_t *m, double now);
double model_next_deadline(const model_t *m);
int model_next_event(model_t *m, clientpool_event_t *ev);
int model_stats(const model_t *m, int key, clientpool_stats_t *s);
int model_checking(const model_t *m, int key);   /* records of key (-1: all) out for a keepalive */

/* Whether a record is open: leased and able to take one more share. */
int model_open(const model_t *m, int record);

/* ---- the fleet's accounting (spec/c/fuzz_fleet.c) ----------------------
 *
 * Engines taking their budget from one fleet (csrc/fleet.h), one member
 * each.  The model keeps, from the driver's side alone, the physical
 * clients of every member and key (a reservation or refill adds one, a
 * forfeited reservation or a reported destroy removes it) and its refills
 * in flight; model_fleet_check compares that, the engines' own counts, the
 * members' shares and the fleet's aggregates, and checks the fleet's caps:
 *   - each engine's live + creating + closing (pool and key) is the model's;
 *   - each member's share (LIVE, IDLE, FLOOR, LEASE; fleet-wide and per key)
 *     is exactly what its engine holds: live + creating + closing, idle,
 *     the model's refills, leases (LEASE only when the engine takes them);
 *   - the fleet's aggregates are the sums of the members' shares;
 *   - no fleet cap is exceeded: LIVE <= max_live, IDLE <= max_idle,
 *     LEASE <= max_concurrency, and per key LIVE <= key_max_live, IDLE <=
 *     key_max_idle (the model's own sums too, for LIVE).
 */
#define MF_MEMBERS 2
#define MF_KEYS 3

typedef struct model_fleet {
  int32_t max_live, max_idle, max_concurrency, key_max_live, key_max_idle;   /* < 0: none */
  int32_t live[MF_MEMBERS][MF_KEYS];       /* physical clients, by the driver's count */
  int32_t refilling[MF_MEMBERS][MF_KEYS];  /* refills in flight */
} model_fleet_t;

/* What the check reads, filled by the harness. */
typedef struct mf_view {
  int32_t leases_taken[MF_MEMBERS];        /* 1: the engine takes LEASE units */
  clientpool_stats_t pool[MF_MEMBERS];     /* each engine's stats */
  clientpool_stats_t key[MF_MEMBERS][MF_KEYS];   /* per key (zero when the key is not open) */
  int32_t held[MF_MEMBERS][4];             /* the member's shares by kind (fleet.h's order) */
  int32_t kheld[MF_MEMBERS][MF_KEYS][4];   /* ... per key slot (LEASE: the cell's) */
  int32_t total[4];                        /* the fleet's aggregates by kind */
  int32_t ktotal[MF_KEYS][4];              /* per key slot (LEASE: unused) */
} mf_view_t;

void model_fleet_init(model_fleet_t *mf, int32_t max_live, int32_t max_idle, int32_t max_concurrency,
                      int32_t key_max_live, int32_t key_max_idle);
/* a reservation (refill = 1: a warm-floor refill) of member m's key k */
void model_fleet_reserve(model_fleet_t *mf, int m, int k, int refill);
/* a reservation's create reported: ok = 0 forfeits it */
void model_fleet_created(model_fleet_t *mf, int m, int k, int refill, int ok);
/* a destroy reported (clientpool_destroyed) */
void model_fleet_destroyed(model_fleet_t *mf, int m, int k);
/* 0, or -1 with a sentence in buf */
int model_fleet_check(const model_fleet_t *mf, const mf_view_t *v, char *buf, size_t n);

/* The harness's fleet mode: inputs of fuzz_engine.c whose first byte is
 * this go to fuzz_fleet_run (spec/c/fuzz_fleet.c), without it. */
#define FUZZ_FLEET_MARK 0xF1
int fuzz_fleet_run(const uint8_t *data, size_t size);

#endif
