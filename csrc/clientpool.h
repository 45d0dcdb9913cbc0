/*
 * clientpool.h - the public C ABI of the clientpool engine.
 *
 * The engine is a pure state machine: it owns the accounting of records
 * (physical clients), leases, waiters, keys, budgets and deadlines.  It does
 * no I/O, reads no clock and calls no callbacks.  Every call takes the
 * current time as an argument, returns a decision, and may queue events
 * (wake a waiter, destroy a record, arm a timer, forget a key) that the
 * driver drains with clientpool_next_event() and carries out.
 *
 * This header is parsed by LuaJIT's ffi.cdef (see `make cdef`): outside the
 * include guard and the two standard includes it holds plain declarations
 * only: no macros, no bool, no long.
 *
 * Identities.  Records, leases and waiters live in slot arrays; a slot is an
 * int32 index and each slot carries a uint32 generation that changes every
 * time the slot is reused.  A (slot, gen) pair that no longer matches is
 * stale: calls that take one are no-ops and say so, so a second release can
 * never touch another holder's lease.
 *
 * Time.  Seconds as double, from any monotonic clock the driver chooses.
 * The engine clamps time so it never runs backwards: a `now` earlier than
 * the latest one seen (or negative, or NaN) means "the latest time seen".
 * A negative duration or deadline means "none".
 *
 * Memory.  Slot arrays grow by an eighth when more objects exist at once than
 * ever before; a steady-state acquire/release pair allocates nothing.  No
 * call blocks.
 */
#ifndef CLIENTPOOL_H
#define CLIENTPOOL_H

#include <stdint.h>
#include <stddef.h>

typedef struct clientpool clientpool_t;

/* A fleet handle (csrc/fleet.h): one process's mapping of a shared budget.
 * Only its tag here, so this header needs no other. */
struct clientpool_fleet;

/* Counts are int32; durations are seconds, < 0 = none. */
typedef struct clientpool_config {
  int32_t min_idle;            /* warm floor per warm key */
  int32_t max_idle;            /* idle records, whole pool */
  int32_t max_live;            /* records open, being created or being closed, whole pool */
  int32_t max_concurrency;     /* leases held at once, whole pool */
  int32_t max_waiting;         /* queued acquisitions, 0 = fail fast */
  int32_t capacity;            /* leases one record may carry at once */
  int32_t key_max_live;        /* per-key cap on records (as max_live), < 0 = none */
  int32_t key_max_idle;        /* per-key cap on idle records, < 0 = none */
  int32_t max_keys;            /* keys that may exist at once, < 0 = none */
  int32_t pause_fail;          /* 1: a paused gate fails acquisitions (PAUSED) */
  double idle_timeout;         /* retire records idle this long */
  double max_lifetime;         /* retire records this old */
  double lifetime_jitter;      /* fraction in [0,1): lifetime shortened by up to it */
  double validate_after_idle;  /* validate only if idle at least this long */
  double leak_threshold;       /* report leases held longer */
  double create_backoff;       /* after a failed create, a key's creates wait a window of
                                  about this (doubling per failure in a row); <= 0 = off */
  double create_backoff_max;   /* the window's bound (>= create_backoff when on) */
  double keepalive;            /* validate idle records idle this long in the background
                                  (EV_KEEPALIVE); < 0 = none, 0 is refused */
  uint64_t seed;               /* seed of the per-pool jitter generator */
} clientpool_config_t;

/* Return codes of clientpool_new / clientpool_key_open. */
enum {
  CLIENTPOOL_OK = 0,
  CLIENTPOOL_EINVAL = -1,      /* bad config or argument */
  CLIENTPOOL_ENOMEM = -2,      /* allocation failed */
  CLIENTPOOL_EKEYS = -3,       /* max_keys keys exist already */
  CLIENTPOOL_ECLOSED = -4      /* the pool is closed */
};

/* Decisions returned in clientpool_grant_t.status. */
enum {
  CLIENTPOOL_GRANT_IDLE = 1,   /* an idle record is leased to the caller */
  CLIENTPOOL_GRANT_CREATE = 2, /* a record is reserved: create its client */
  CLIENTPOOL_MUST_WAIT = 3,    /* acquire: nothing free, a waiter may queue */
  CLIENTPOOL_PENDING = 4,      /* claim: the waiter is still queued */
  CLIENTPOOL_FULL = 5,         /* max_waiting acquisitions wait already */
  CLIENTPOOL_CLOSED = 6,       /* the pool is closed */
  CLIENTPOOL_TIMEOUT = 7,      /* the waiter's deadline passed */
  CLIENTPOOL_CANCELLED = 8,    /* the waiter was cancelled */
  CLIENTPOOL_STALE = 9,        /* the (slot, gen) handle is no longer valid */
  CLIENTPOOL_PAUSED = 10,      /* a paused gate refused the acquisition (pause_fail) */
  CLIENTPOOL_BACKOFF = 11,     /* acquire: it would create, the key is backing off after
                                  failed creates and no client of it may come back soon */
  CLIENTPOOL_UNTIMED = 12      /* *_untimed: the call needs the time; nothing was done */
};

/* Why a record was destroyed: the index into clientpool_stats_t.closed_by. */
enum {
  CLIENTPOOL_BY_IDLE = 0,      /* idle past idle_timeout */
  CLIENTPOOL_BY_LIFETIME = 1,  /* past max_lifetime */
  CLIENTPOOL_BY_INVALID = 2,   /* validate or unpark failed */
  CLIENTPOOL_BY_ERROR = 3,     /* released with reuse = false */
  CLIENTPOOL_BY_MAX_IDLE = 4,  /* released while max_idle were idle */
  CLIENTPOOL_BY_DRAIN = 5,     /* pool closed or draining */
  CLIENTPOOL_BY_LEAKED = 6,    /* its lease was collected while held */
  CLIENTPOOL_BY_RETIRED = 7,   /* retired by the driver */
  CLIENTPOOL_BY_EVICTED = 8,   /* idle, destroyed to make room for another key */
  CLIENTPOOL_BY_RESIZED = 9,   /* over a cap lowered by clientpool_configure / key_caps */
  CLIENTPOOL_BY_SHED = 10,     /* given back to the fleet for another member's waiters */
  CLIENTPOOL_BY_COUNT = 11
};

/* Event types returned by clientpool_next_event.  The id of a forgotten key
 * is reused only after its EV_KEY_FREE has been read, and the slot of a
 * destroyed record only after both its EV_DESTROY has been read and the
 * driver reported the destroy done (clientpool_destroyed): a driver that
 * drains events later (after a finalizer's clientpool_leak) never sees its
 * ids renamed; until then calls with the forgotten key id return STALE.
 *
 * The cap is physical.  A record counts against max_live and its key's cap
 * from its reservation until the driver reports, with clientpool_destroyed,
 * that its destroy hook returned or failed: EV_DESTROY starts a destroy
 * (the record is `closing`), it does not free anything.  Waiters are served
 * from that capacity only then.  A driver without a destroy hook calls
 * clientpool_destroyed at once when it reads EV_DESTROY.  A generation in
 * an event (EV_WAKE's and EV_LEAK's b) is the uint32 cast to the int32
 * field: negative past 2^31 reuses of the slot, so compare it modulo 2^32. */
enum {
  CLIENTPOOL_EV_NONE = 0,
  CLIENTPOOL_EV_WAKE = 1,      /* a = waiter slot, b = its gen: it has a result */
  CLIENTPOOL_EV_DESTROY = 2,   /* a = record slot, b = reason, c = key: run its destroy
                                  hook, then call clientpool_destroyed(a) */
  CLIENTPOOL_EV_TIMER = 3,     /* t = the earliest deadline, earlier than armed */
  CLIENTPOOL_EV_KEY_FREE = 4,  /* a = key id: it is empty and forgotten */
  CLIENTPOOL_EV_LEAK = 5,      /* a = lease slot, b = gen, c = key: held past leak_threshold;
                                  a = -1, c = key: a lease was collected (clientpool_leak) */
  CLIENTPOOL_EV_CREATED = 6,   /* a = record slot, c = key: reservation turned live */
  CLIENTPOOL_EV_REFILL = 7,    /* a warm key is below min_idle: call clientpool_refill */
  CLIENTPOOL_EV_LOST = 8,      /* a = record slot, c = key: lost while shared; its
                                * other leases end with it */
  CLIENTPOOL_EV_KEEPALIVE = 9, /* a = record slot, c = key, t = seconds idle: validate its
                                * client in the background, then clientpool_keepalive_done */
  CLIENTPOOL_EV_BLOCKED = 10,  /* fleet: waiters wait for the fleet's budget; a = what was
                                * refused (CLIENTPOOL_BLOCKED_* bits): post the demand
                                * (clientpool_blocked), then clientpool_retry */
  CLIENTPOOL_EV_GATES = 11     /* fleet: its pause gates changed (gates_gen moved): read them
                                * and set them with clientpool_gate_fleet */
};

/* The answer of acquire, claim and cancel. */
typedef struct clientpool_grant {
  int32_t status;              /* one of the decisions above */
  int32_t record;              /* GRANT_*: the record slot */
  int32_t lease;               /* GRANT_*: the lease slot */
  uint32_t lease_gen;          /* GRANT_*: the lease generation */
  int32_t key;                 /* the key id */
  int32_t validate;            /* GRANT_IDLE: 1 if the driver should validate */
  int32_t shared;              /* GRANT_IDLE: 1 if the record already carries leases */
  double idle;                 /* GRANT_IDLE: seconds the record sat idle */
  double waited;               /* claim/cancel: seconds spent queued */
} clientpool_grant_t;

typedef struct clientpool_event {
  int32_t type;
  int32_t a;
  int32_t b;
  int32_t c;
  double t;
} clientpool_event_t;

/* Counters of the whole pool or of one key. */
typedef struct clientpool_stats {
  double opened;               /* records created successfully */
  double reused;               /* idle records granted */
  double closed;               /* records destroyed after opening (counted when the
                                  destroy starts: see closing) */
  double leaked;               /* leases collected while held */
  double timeouts;             /* waiters that reached their deadline */
  double rejected;             /* acquisitions refused: full */
  double cancelled;            /* waiters cancelled or abandoned */
  double create_failed;        /* reservations forfeited by a failed create */
  double wait_count;           /* waits that ended, whatever the outcome */
  double wait_time;            /* seconds spent in those waits */
  double keepalive;            /* background validates started (EV_KEEPALIVE) */
  double keepalive_failed;     /* of those, reported not ok (the record destroyed, invalid) */
  double closed_by[11];        /* indexed by CLIENTPOOL_BY_* */
  int32_t live;                /* records open (opened - closed): idle or active */
  int32_t idle;                /* records idle (those out for a keepalive validate too) */
  int32_t active;              /* records carrying leases */
  int32_t leases;              /* leases held */
  int32_t creating;            /* reservations whose client is being created */
  int32_t waiting;             /* queued waiters */
  int32_t closing;             /* records whose destroy started and is not reported
                                  done: live + creating + closing <= max_live */
} clientpool_stats_t;

/* Creates an engine.  Returns CLIENTPOOL_OK and sets *out, or EINVAL for a
 * config outside the envelope, or ENOMEM. */
int clientpool_new(const clientpool_config_t *cfg, clientpool_t **out);

/* Frees the engine and everything it holds.  NULL is accepted. */
void clientpool_free(clientpool_t *p);

/* Changes the config of a running engine: every count and duration,
 * pause_fail and the backoff; capacity and seed cannot change.  Returns 0,
 * EINVAL (a config clientpool_new would refuse, or another capacity or
 * seed: nothing changes), ENOMEM (nothing changes) or ECLOSED.
 *   A lower max_live or per-key max_live retires idle records at once
 *   (least recently used first, BY_RESIZED) while the pool or key holds
 *   more than the cap (open or being created); leased ones finish and are
 *   destroyed at release while it still does (BY_RESIZED); new creates
 *   wait until live + creating + closing is under the cap.  A lower max_idle
 *   or per-key max_idle retires idle records the same way (BY_MAX_IDLE).
 *   A higher cap serves waiters at once.  A lower max_waiting refuses new
 *   waiters and keeps the queued ones; a lower max_concurrency or max_keys
 *   lets held leases and open keys stay.
 *   max_lifetime: every record's lifetime deadline is scaled by new/old
 *   (its jitter kept), set for records that had none (jitter drawn in
 *   creation order), or dropped; leak_threshold: held leases are measured
 *   against the new value (a report already made is not made again);
 *   idle_timeout, validate_after_idle, lifetime_jitter and the backoff
 *   apply from now (backoff off ends every window).  A deadline that moved
 *   earlier is announced (EV_TIMER). */
int clientpool_configure(clientpool_t *p, const clientpool_config_t *cfg, double now);

/* Opens a new key and returns its id (>= 0), or EKEYS when max_keys keys
 * exist, or ECLOSED.  Key ids are small integers reused after the key is
 * forgotten (EV_KEY_FREE).  A key is forgotten once it holds no record, lease
 * or waiter, unless it is pinned. */
int32_t clientpool_key_open(clientpool_t *p);

/* Pins (1) or unpins (0) a key: a pinned key is never forgotten; 2 pins it
 * as a warm key, whose min_idle floor the engine signals (EV_REFILL). */
int clientpool_key_pin(clientpool_t *p, int32_t key, int32_t pinned);

/* Gives key its own caps, in place of the pool's per-key ones (< 0: the
 * pool's again): max_live in [0, cfg max_live], max_idle in [0, cfg
 * max_idle] (a later configure may lower the pool's below them: the
 * pool's caps still bound everything).  Lowering retires and destroys as
 * clientpool_configure does; raising serves waiters at once.  A key with
 * caps of its own is not forgotten until they are cleared (or the pool is
 * closed: then as any key).  For the fleet:
 * each process's share of a key's budget.  Returns 0, EINVAL or ECLOSED. */
int clientpool_key_caps(clientpool_t *p, int32_t key, int32_t max_live, int32_t max_idle, double now);

/* Forgets a key that holds nothing (for the driver, after an acquisition
 * that could not wait); a key in use or pinned is left alone.  Returns 1 if
 * the key was forgotten (an EV_KEY_FREE is queued), else 0. */
int clientpool_key_forget(clientpool_t *p, int32_t key);

/* Acquire for key at time now.  Fills *g with GRANT_IDLE, GRANT_CREATE,
 * MUST_WAIT, FULL or CLOSED and returns g->status.  MUST_WAIT: the driver
 * then calls clientpool_wait or gives up (clientpool_key_forget).  Expired
 * idle records met on the way are destroyed (events).  At max_live, with
 * an idle record of another key and no destroy under way, the acquisition
 * starts that record's eviction and returns MUST_WAIT (or FULL): the room is
 * there once the destroy is reported, and the waiter is served then. */
int clientpool_acquire(clientpool_t *p, int32_t key, double now, clientpool_grant_t *g);

/* clientpool_acquire's common case without the time, for a driver whose
 * time is a clock read (a plain script): when the pool has no duration
 * option (idle_timeout, max_lifetime, validate_after_idle, keepalive,
 * leak_threshold) and an idle record of key is granted on the engine's fast
 * path, fills *g and returns GRANT_IDLE, stamped with the engine's latest
 * time; else returns UNTIMED with nothing done (then read the clock and call
 * clientpool_acquire).  g->idle is 0 (not measured): not for a driver that
 * hands it to a validate hook.  A duration configured later counts such
 * stamps long (an idle client closed or validated early, never late; a
 * lease reported late, never early).  Never blocks. */
int clientpool_acquire_untimed(clientpool_t *p, int32_t key, clientpool_grant_t *g);

/* Queues a waiter for key with an absolute deadline (< 0 = none), priority
 * 0.  Returns the waiter slot (>= 0) and sets *gen, or CLIENTPOOL_FULL, or
 * CLIENTPOOL_CLOSED (as a negative number: -status), or ENOMEM. */
int32_t clientpool_wait(clientpool_t *p, int32_t key, double deadline, double now, uint32_t *gen);

/* Priorities.  Among the waiters that can use what is freed, a higher
 * priority is served first, arrival order within one priority, the
 * cross-key rule and max_waiting as ever.  A waiter of priority n is
 * placed as if it had arrived n * CLIENTPOOL_PRIORITY_STEP acquisitions
 * earlier: so a waiter is passed over by at most (P - n) *
 * CLIENTPOOL_PRIORITY_STEP waiters that queued after it, P the highest
 * priority among them (the aging bound: every PRIORITY_STEP arrivals after
 * it count as one step up).  O(log n) per wait and grant. */
enum { CLIENTPOOL_PRIORITY_STEP = 64 };

/* As clientpool_wait, with a priority (any int32; default 0). */
int32_t clientpool_wait_priority(clientpool_t *p, int32_t key, double deadline, int32_t priority, double now,
                                 uint32_t *gen);

/* Reports the outcome of a GRANT_CREATE reservation: ok = 1 makes the record
 * live and its lease valid; ok = 0 forfeits the reservation and hands the
 * capacity on.  Returns 0, or STALE.
 *
 * Create backoff (create_backoff > 0).  Each failed create of a key (a
 * refill's too) opens a window in which the key creates nothing: its
 * length is d/2 + d/2 * r, with d = min(create_backoff_max, create_backoff
 * * 2^(failures in a row - 1)) and r from the pool's seeded generator
 * ("equal jitter").  Meanwhile an acquisition of the key that would create
 * gets BACKOFF, unless a client of the key may come back soon (a record of
 * it is leased, or a create of it is in flight): then it waits as usual.
 * Waiters queued meanwhile are served when the window ends (a deadline of
 * the engine's, EV_TIMER).  After the window only one create of the key is
 * in flight at a time until one succeeds; a successful create ends the
 * backoff, and create_backoff_max seconds after the window without a
 * create in flight the failures are forgotten.  A key is not forgotten
 * while it backs off. */
int clientpool_created(clientpool_t *p, int32_t record, int32_t ok, double now);

/* Ends a lease.  reason < 0 returns the record for reuse (it is destroyed
 * anyway when the pool is closed, the record is past max_lifetime or retired,
 * or max_idle records are idle); reason >= 0 (CLIENTPOOL_BY_*) destroys it.
 * Returns 0, or STALE for a lease already ended (a no-op). */
int clientpool_release(clientpool_t *p, int32_t lease, uint32_t gen, int32_t reason, double now);

/* clientpool_release's release to idle (reason < 0) without the time, as
 * clientpool_acquire_untimed: returns 0 when done, STALE for a lease
 * already ended (a no-op), or UNTIMED with nothing done (then read the
 * clock and call clientpool_release). */
int clientpool_release_untimed(clientpool_t *p, int32_t lease, uint32_t gen, int32_t reason);

/* Reads a waiter's result.  Fills *g: PENDING while queued; otherwise the
 * final result (GRANT_*, TIMEOUT, CANCELLED, CLOSED), and the waiter slot is
 * freed.  STALE for an unknown handle. */
int clientpool_claim(clientpool_t *p, int32_t waiter, uint32_t gen, double now, clientpool_grant_t *g);

/* Ends a waiter on the caller's behalf: a queued waiter leaves the queue with
 * `status` (TIMEOUT or CANCELLED); a waiter already resolved keeps its result.
 * Either way *g is filled as by claim and the slot is freed. */
int clientpool_cancel(clientpool_t *p, int32_t waiter, uint32_t gen, int32_t status, double now, clientpool_grant_t *g);

/* Ends a waiter whose caller is gone: queued, it is cancelled; granted, the
 * grant goes back to the pool (an idle record to the next waiter or the idle
 * stack, a reservation is forfeited).  Returns 0 or STALE. */
int clientpool_abandon(clientpool_t *p, int32_t waiter, uint32_t gen, double now);

/* A lease was collected while held: its record is destroyed (BY_LEAKED) and
 * the leaked counter rises.  Returns 0 or STALE. */
int clientpool_leak(clientpool_t *p, int32_t lease, uint32_t gen, double now);

/* The driver carried out the EV_DESTROY of record: its destroy hook
 * returned or failed (or there is none).  The record stops counting against
 * max_live and its key's cap, waiters are served from the room, and its
 * slot is reused once its EV_DESTROY has been read too.  Call it once per
 * EV_DESTROY.  Returns 0, or STALE when record is not closing. */
int clientpool_destroyed(clientpool_t *p, int32_t record, double now);

/* Keepalive (cfg keepalive >= 0).  An idle record that has sat idle for
 * `keepalive` seconds since it went idle or was last validated is handed to
 * the driver (EV_KEEPALIVE, at the exact time through EV_TIMER/tick) for a
 * background validate; meanwhile it is not granted and still counts as
 * idle.  At most CLIENTPOOL_KEEPALIVE_MAX run at once: the others wait their
 * turn (first due first) and are handed out as those end.  The driver
 * reports each with clientpool_keepalive_done: ok = 1 puts the record back
 * on top of its key's idle stack with a fresh keepalive clock (its idle time
 * and idle_timeout still count from its last use); ok = 0 destroys it
 * (BY_INVALID, stats keepalive_failed).  A record retired, past its
 * lifetime or idle_timeout, over a lowered cap, or whose pool closed while
 * it was out is destroyed at the report for that reason.  Returns 0, or
 * STALE when record is not out for a keepalive. */
enum { CLIENTPOOL_KEEPALIVE_MAX = 2 };
int clientpool_keepalive_done(clientpool_t *p, int32_t record, int32_t ok, double now);

/* Marks a record so it is destroyed at release (or at once if idle). */
int clientpool_retire(clientpool_t *p, int32_t record, double now);

/* Retires every record of key (key < 0: of the pool) created before
 * `before` (before < 0: every record created so far, by creation order, so
 * one created later at the same instant survives): idle ones at once,
 * leased ones at release.  Returns 0 or EINVAL. */
int clientpool_retire_before(clientpool_t *p, int32_t key, double before, double now);

/* Retires record and every record of its key created before it, by
 * creation order (records created at the same instant are ordered too):
 * idle ones at once, leased ones at release.  For a server that reports it
 * was demoted: the connections made before this one reach the same place.
 * Returns 0, or EINVAL when record is not a live record. */
int clientpool_retire_upto(clientpool_t *p, int32_t record, double now);

/* The client of a lease could not be used (validate or unpark failed on
 * idle reuse): its record is destroyed (BY_INVALID) and the same caller is
 * granted again at once, ahead of any queued waiter, so it keeps its place:
 * another idle record of the key, or a reservation where there is room.
 * Returns the grant's status (*g filled as by acquire): GRANT_IDLE,
 * GRANT_CREATE, CLOSED if the pool was closed meanwhile (the record is
 * destroyed all the same), MUST_WAIT if nothing can be granted now.
 *   MUST_WAIT after a pause that came meanwhile: the caller queues as a new
 *   acquisition, like anyone.
 *   Any other MUST_WAIT (at max_live the invalid record's room comes only
 *   when its destroy is reported; with capacity > 1 a co-holder keeps the
 *   record and nothing else is free; out of memory): the caller keeps its
 *   place.  Its next clientpool_acquire for the key may take what is free
 *   ahead of the key's waiters, and if that says MUST_WAIT its
 *   clientpool_wait queues it ahead of every waiter.  Until that next call
 *   nothing is served (a destroy reported meanwhile keeps its room for the
 *   caller), so the driver acquires again at once; the place ends at its
 *   next clientpool_acquire or clientpool_wait (whatever key) or
 *   clientpool_key_forget, and at close.
 * STALE for an unknown lease. */
int clientpool_regrant(clientpool_t *p, int32_t lease, uint32_t gen, double now, clientpool_grant_t *g);

/* Whether releasing the lease for reuse at `now` would close its record for
 * certain: the pool is closed, a co-holder lost the record, it is past
 * max_lifetime, or it was retired. (Whether max_idle closes it is decided at
 * the release: a waiter may take it first.) 1 or 0; -STALE for an unknown
 * lease. Lets a driver skip parking a client that is about to be closed. */
int clientpool_release_closes(const clientpool_t *p, int32_t lease, uint32_t gen, double now);

/* Pauses admission of the pool (key < 0) or of a key: new acquisitions wait
 * (or fail with PAUSED under pause_fail); queued ones stay queued; leases
 * already held are untouched.  Returns 0 or EINVAL. */
int clientpool_pause(clientpool_t *p, int32_t key, double now);

/* Resumes admission.  probe = 1 resumes half-open: one acquisition is
 * admitted alone until clientpool_probe_ok reports its lease continued (a
 * probe lease released without a report lets the next one probe). */
int clientpool_resume(clientpool_t *p, int32_t key, int32_t probe, double now);

/* The probe lease observed an outcome that continues: the gate opens.
 * Returns 1 if the lease was a probe, else 0. */
int clientpool_probe_ok(clientpool_t *p, int32_t lease, uint32_t gen, double now);

/* Whether the pool (key < 0) or a key is paused (1), half-open (2) or open (0). */
int clientpool_gate(const clientpool_t *p, int32_t key);

/* Turns the warm floor on or off.  On, the engine signals EV_REFILL when a
 * pinned key holds fewer than min_idle idle records (counting refills in
 * flight), and idle_timeout spares the idle records the floor needs. */
void clientpool_floor(clientpool_t *p, int32_t on, double now);

/* Reserves a record for the warm floor of some pinned key below min_idle,
 * where max_live and the key's cap leave room.  Returns the record and sets
 * *key, or -1 when nothing is due (the next shortfall signals again).  The
 * driver creates the client and reports it with clientpool_created: the
 * record then joins the idle stack (no lease). */
int32_t clientpool_refill(clientpool_t *p, double now, int32_t *key);

/* Processes deadlines up to now: idle and lifetime expiry of idle records,
 * waiter timeouts, leak_threshold reports. */
void clientpool_tick(clientpool_t *p, double now);

/* The earliest pending deadline, or -1 when there is none. */
double clientpool_next_deadline(const clientpool_t *p);

/* Stops admission: queued waiters end with CLOSED, idle records are
 * destroyed (BY_DRAIN); leases stay with their holders and their records are
 * destroyed at release.  Idempotent. */
void clientpool_close(clientpool_t *p, double now);

/* Pops the next queued event into *ev.  Returns its type, EV_NONE when the
 * queue is empty. */
int clientpool_next_event(clientpool_t *p, clientpool_event_t *ev);

/* The number of queued events. */
int32_t clientpool_pending(const clientpool_t *p);

/* Whether waiters, max_waiting of them or more, are queued or have ended
 * and not been claimed (or abandoned) yet: a caller that died meanwhile
 * may hold a place in the queue, or a client granted to it, until the
 * driver reaps it.  (The binding's fast path hands its calls to the driver
 * then, which reaps dead waiters first, before the engine could refuse a
 * wait as full or find the client taken.) */
int clientpool_queue_full(const clientpool_t *p);

/* Fills *s with the pool's counters (key < 0) or one key's.  Returns 0, or
 * EINVAL for an unknown key. */
int clientpool_stats(const clientpool_t *p, int32_t key, clientpool_stats_t *s);

/* The key of a record, or -1. */
int32_t clientpool_record_key(const clientpool_t *p, int32_t record);

/* When a record's client was created, or -1 for a free slot. */
double clientpool_record_created(const clientpool_t *p, int32_t record);

/* Seconds since a lease was granted, or -1 for a stale handle. */
double clientpool_lease_age(const clientpool_t *p, int32_t lease, uint32_t gen, double now);

/* The record a lease holds, and its key in *key (if key is not NULL), or -1
 * for a stale handle (*key untouched): the driver keeps neither per lease. */
int32_t clientpool_lease_record(const clientpool_t *p, int32_t lease, uint32_t gen, int32_t *key);

/* Marks a held lease as a checkout's (the driver's checkout form, whose
 * handle is a plain number: a forged one must not end a lease of the
 * acquire form).  0, or -1 for a stale handle.  The mark ends with the
 * lease. */
int clientpool_lease_checkout(clientpool_t *p, int32_t lease, uint32_t gen);

/* As clientpool_lease_record, for a lease marked by clientpool_lease_checkout
 * only (-1 for any other). */
int32_t clientpool_checkout_record(const clientpool_t *p, int32_t lease, uint32_t gen, int32_t *key);

/* Whether the pool is closed (1) or not (0). */
int clientpool_is_closed(const clientpool_t *p);

/* ---- the fleet (docs/fleet.md) ----------------------------------------
 *
 * With a fleet the pool takes its budget from a shared segment (csrc/
 * fleet.h) as well as from its own config: the engine takes and gives the
 * fleet's units at the points where it counts its own, in the same call,
 * so the member's shares always equal what the engine holds:
 *   LIVE   a record, from its reservation until its destroy is reported
 *          (clientpool_destroyed) or the reservation is forfeited;
 *   IDLE   an idle record (one out for a keepalive too), taken when a
 *          released record stays idle, refused: it is destroyed (max_idle);
 *   LEASE  a lease, only with CLIENTPOOL_FLEET_USE_LEASES (the fleet has a
 *          max_concurrency);
 *   FLOOR  a warm-floor refill in flight (the floor is kept once across
 *          the fleet: a refused FLOOR means the fleet's floor of the key is
 *          met).
 * The config's caps still apply: they bound this process's share.  These
 * calls are atomics on the shared segment, nothing else: no I/O, no clock
 * read, no blocking.  A refusal is never retried inside a call: the engine
 * marks what was refused (LIVE fleet-wide or for a key, LEASE) and stops
 * trying it; waiters stay queued (acquire says MUST_WAIT as at max_live),
 * EV_BLOCKED tells the driver, which posts the demand (clientpool_blocked
 * gives the numbers), polls the fleet and calls clientpool_retry.  A give
 * of the pool's own clears the marks of what it gave.  The marks lapse when
 * no waiter is left.  max_waiting, deadlines, idle_timeout and max_lifetime
 * stay this engine's own.
 *
 * Rebalance: a release for reuse while other members wait asks the fleet
 * how much this member should shed (clientpool_fleet_shed) and destroys
 * the record (BY_SHED) instead of keeping it; clientpool_rebalance does
 * the same for idle records (the driver's periodic tick).  The fleet's
 * pause gates are mirrored by the driver (clientpool_gate_fleet), apart
 * from the pool's own. */

/* Flags of clientpool_set_fleet. */
enum { CLIENTPOOL_FLEET_USE_LEASES = 1 };

/* Bits of EV_BLOCKED's a and of clientpool_retry's result. */
enum {
  CLIENTPOOL_BLOCKED_LIVE = 1,     /* a create was refused by the fleet-wide cap */
  CLIENTPOOL_BLOCKED_LEASE = 2,    /* a lease was refused by the fleet's max_concurrency */
  CLIENTPOOL_BLOCKED_TURN = 4,     /* a refusal was a turn (members that waited longer come
                                    * first): retry at every poll */
  CLIENTPOOL_BLOCKED_KEY = 8       /* a key's create was refused by the fleet's per-key cap */
};

/* Makes the engine take its budget from fleet f (a joined handle; the
 * engine retains it and closes it at clientpool_free, after giving back
 * whatever it still holds).  flags: CLIENTPOOL_FLEET_USE_LEASES.  Only before
 * any key is opened.  Returns 0 or EINVAL. */
int clientpool_set_fleet(clientpool_t *p, struct clientpool_fleet *f, int32_t flags);

/* The fleet key slot of key (clientpool_fleet_key_open), set right after
 * clientpool_key_open, before the key is used (< 0: the key has no per-key
 * accounting in the fleet).  Returns 0 or EINVAL (no fleet, unknown key, or
 * a key that holds something already). */
int clientpool_key_fleet(clientpool_t *p, int32_t key, int32_t slot);

/* The demand to post (clientpool_fleet_demand): how many waiters wait for
 * the fleet's `kind` (CLIENTPOOL_FLEET_LIVE = 0 or CLIENTPOOL_FLEET_LEASE = 2 of fleet.h) at the fleet level
 * (key < 0) or for key's fleet cap (LIVE only), bounded by what this
 * engine's own caps would let it use.  0 when nothing is refused there. */
int32_t clientpool_blocked(const clientpool_t *p, int32_t kind, int32_t key);

/* Clears the refusal marks and serves waiters from whatever the fleet has
 * now; re-signals the warm floor.  Also reads the fleet's gates_gen (one
 * load) and queues EV_GATES if it moved.  Returns the marks it cleared
 * (CLIENTPOOL_BLOCKED_* bits).  For the driver's poll. */
int32_t clientpool_retry(clientpool_t *p, double now);

/* Rebalance (the driver's periodic tick): asks the fleet how many clients
 * this member should give back, fleet-wide and for each of its keys
 * (clientpool_fleet_shed, less what is closing already), and destroys that
 * many idle records, least recently used first (BY_SHED).  Returns how many
 * it destroyed.  Also looks again at a warm key whose fleet floor was met
 * elsewhere, if the fleet's idle clients and refills of the key fell below
 * min_idle since (their holder died, or leased or closed them): the floor
 * is signalled again (EV_REFILL). */
int32_t clientpool_rebalance(clientpool_t *p, double now);

/* Sets the fleet's gate of the pool (key < 0) or of a key as the driver
 * read it from the fleet: paused = 1 holds admission like clientpool_pause
 * (pause_fail fails with PAUSED), 0 opens it.  Separate from the pool's own
 * gates: clientpool_resume does not open it.  Returns 0 or EINVAL. */
int clientpool_gate_fleet(clientpool_t *p, int32_t key, int32_t paused, double now);

/* CLOCK_MONOTONIC in seconds: a convenience for drivers, not used by the
 * engine itself. */
double clientpool_monotime(void);

/* Sleeps s seconds (nanosleep, resumed after signals): blocks the thread;
 * for the built-in loop when nothing is ready. */
void clientpool_sleep(double s);

#endif
