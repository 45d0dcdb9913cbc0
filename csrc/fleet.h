/*
 * fleet.h - the machine-local fleet: one budget shared by the processes of a
 * machine (nginx workers, a game server's forked workers, unrelated plain
 * Lua programs), kept in a named POSIX shared-memory segment.
 *
 * The design, the segment layout, the protocol of every operation, the
 * bounds and the plan for calling this from the engine are in docs/fleet.md.
 * In short:
 *
 * - A fleet is a named segment ("/clientpool.<uid>.n.<name>", or
 *   ".h.<hash>" for names with other characters), created O_EXCL mode 0600
 *   by its owner.  Opening it checks owner, mode, magic, version, size,
 *   geometry, the stored full name and the pid namespace; a segment that
 *   fails a check is refused, never repaired or trusted.
 * - A handle (clientpool_fleet_t) is one process's mapping; the caller owns
 *   it and frees it with clientpool_fleet_close.  A handle that joined is a
 *   member: it has a row in the segment holding its pid, its process start
 *   time (so a reused pid is not mistaken for it), a heartbeat, and its own
 *   share of every counter, fleet-wide and per key.  A handle is used by one
 *   thread at a time and never across fork() once joined.
 * - Budgets are units of a kind (LIVE, IDLE, LEASE, FLOOR) taken and given
 *   one at a time, increment-then-check on the fleet total and on the key's
 *   total (never read-then-increment).  A dead member's share is reclaimed
 *   exactly once, by the first member that sees it dead (a CAS on its row).
 * - Nothing here blocks: no futex, no sleep.  Waiting is the caller's: it
 *   posts demand, polls the sequence number (a plain load) on its own
 *   scheduler's timer, and retries.
 *
 * This header is parsed by LuaJIT's ffi.cdef (`make cdef` writes
 * lua/clientpool/fleet_cdef.lua from it): outside the include guard and the
 * two standard includes it holds plain declarations only: no macros, no
 * bool, no long.
 *
 * Return codes.  Calls return 0 (or a count, or a slot) on success and a
 * negative CLIENTPOOL_FLEET_E* on error; take returns TAKEN (0), REFUSED or
 * REFUSED_KEY.  clientpool_fleet_strerror names a code.
 */
#ifndef CLIENTPOOL_FLEET_H
#define CLIENTPOOL_FLEET_H

#include <stdint.h>
#include <stddef.h>

typedef struct clientpool_fleet clientpool_fleet_t;

/* Budget kinds: what a unit is a unit of. */
enum {
  CLIENTPOOL_FLEET_LIVE = 0,   /* a physical client, from reservation until its destroy returned */
  CLIENTPOOL_FLEET_IDLE = 1,   /* a client sitting idle */
  CLIENTPOOL_FLEET_LEASE = 2,  /* an admitted lease (max_concurrency) */
  CLIENTPOOL_FLEET_FLOOR = 3,  /* a warm-floor refill in flight (min_idle, per key) */
  CLIENTPOOL_FLEET_KINDS = 4
};

/* Results of clientpool_fleet_take. */
enum {
  CLIENTPOOL_FLEET_TAKEN = 0,       /* the unit is the member's */
  CLIENTPOOL_FLEET_REFUSED = 1,     /* the fleet-wide cap (or another member's turn) */
  CLIENTPOOL_FLEET_REFUSED_KEY = 2, /* the key's cap (FLOOR: the key's floor is met) */
  CLIENTPOOL_FLEET_REFUSED_TURN = 3 /* room exists, but members that waited longer come first:
                                     * retry at the next poll even if the sequence did not move */
};

/* Errors (negative). */
enum {
  CLIENTPOOL_FLEET_EINVAL = -1,     /* bad argument or limits */
  CLIENTPOOL_FLEET_ENOMEM = -2,     /* allocation failed */
  CLIENTPOOL_FLEET_ENOENT = -3,     /* no such fleet, or no such key */
  CLIENTPOOL_FLEET_EACCES = -4,     /* foreign segment: owner, mode, pid namespace */
  CLIENTPOOL_FLEET_ECORRUPT = -5,   /* bad magic, size or layout */
  CLIENTPOOL_FLEET_EVERSION = -6,   /* made by another layout version */
  CLIENTPOOL_FLEET_EGEOMETRY = -7,  /* members or max_keys above what it was created with */
  CLIENTPOOL_FLEET_ENAME = -8,      /* the segment holds another fleet (name hash collision) */
  CLIENTPOOL_FLEET_EMEMBERS = -9,   /* every member row is taken */
  CLIENTPOOL_FLEET_EKEYS = -10,     /* max_keys keys are in use */
  CLIENTPOOL_FLEET_EBUSY = -11,     /* the admin lock is held by a live process: try later */
  CLIENTPOOL_FLEET_ENOTMEMBER = -12,/* the handle has not joined (or its row was lost) */
  CLIENTPOOL_FLEET_ESYS = -13,      /* a system call failed (errno in the message) */
  CLIENTPOOL_FLEET_ENOTHELD = -14,  /* give of a unit the member does not hold; key not open */
  CLIENTPOOL_FLEET_ETIMEDOUT = -15, /* the segment stayed half-initialized by a live creator */
  CLIENTPOOL_FLEET_ESTALE = -16     /* the agent's place was taken by another process (a newer epoch) */
};

/* Bounds of names, keys and pause reasons, in bytes. */
enum {
  CLIENTPOOL_FLEET_NAME_MAX = 200,
  CLIENTPOOL_FLEET_KEY_MAX = 256,
  CLIENTPOOL_FLEET_REASON_MAX = 120
};

/* Limits.  Counts are fleet-wide, never multiplied by the member count.
 * key_max_live / key_max_idle < 0: none.  members and max_keys also size
 * the segment when it is created: attaching later may lower them (or raise
 * them back up to the created size), never raise them beyond. */
typedef struct clientpool_fleet_limits {
  int32_t max_live;            /* physical clients of the whole fleet, >= 1 */
  int32_t max_idle;            /* idle clients, min_idle <= max_idle <= max_live */
  int32_t min_idle;            /* warm floor of each warm key, fleet-wide */
  int32_t max_concurrency;     /* leases at once, >= 0 (0: a Redis share) */
  int32_t key_max_live;        /* per key, <= max_live, or < 0 */
  int32_t key_max_idle;        /* per key, <= max_idle, or < 0 */
  int32_t max_keys;            /* keys in use at once, >= 1 */
  int32_t members;             /* processes attached at once, >= 1 */
  int32_t attempts;            /* retries of a take that lost a race, >= 1 */
} clientpool_fleet_limits_t;

/* Fleet-wide figures (clientpool_fleet_stats). */
typedef struct clientpool_fleet_stats {
  clientpool_fleet_limits_t limits;
  int32_t live;                /* LIVE units held, all members */
  int32_t idle;
  int32_t leases;
  int32_t refilling;           /* FLOOR units */
  int32_t demand_live;         /* units members wait for (posted demand) */
  int32_t demand_lease;
  int32_t waiting_members;     /* members with fleet-level demand posted */
  int32_t pledged;             /* LIVE units members pledged to shed (rebalance) */
  int32_t members;             /* rows in use */
  int32_t keys;                /* key slots in use */
  int32_t rows;                /* member rows the segment has (its created size) */
  int32_t keys_cap;            /* key slots the segment has */
  int32_t paused;              /* the fleet-wide gate: 1 paused */
  int32_t repair_pending;      /* 1: a member died inside an operation; its remainder is repaired at a quiet scan */
  uint64_t seq;                /* bumped when budget is freed while someone waits */
  uint64_t gates_gen;          /* bumped at every pause/resume */
  uint64_t limits_gen;         /* bumped at every limits update */
  double reclaimed;            /* dead members reclaimed */
  double repairs;              /* repairs done */
  double repaired_units;       /* units those repairs gave back */
  double resets;               /* stale segments recovered (no live member) */
  double joins;                /* members that ever joined */
  double created;              /* CLOCK_MONOTONIC seconds at creation */
} clientpool_fleet_stats_t;

/* One key (clientpool_fleet_key_stats). */
typedef struct clientpool_fleet_key_stats {
  int32_t live;
  int32_t idle;
  int32_t leases;              /* summed over members */
  int32_t refilling;
  int32_t demand_live;         /* key-level demand */
  int32_t refs;                /* members that have the key open */
  int32_t paused;              /* the key's gate */
  int32_t len;                 /* bytes of the key's name */
} clientpool_fleet_key_stats_t;

/* One member row (clientpool_fleet_member_stats). */
typedef struct clientpool_fleet_member_stats {
  int32_t state;               /* 1 joining, 2 alive, 3 being reclaimed */
  int32_t pid;
  int32_t alive;               /* the process exists and its start time matches */
  int32_t self;                /* 1: this handle's own row */
  int32_t live;
  int32_t idle;
  int32_t leases;
  int32_t refilling;
  int32_t demand_live;         /* fleet-level demand posted */
  int32_t demand_lease;
  int32_t pledged;
  int32_t keys;                /* keys it has open */
  double start;                /* process start time, clock ticks since boot (/proc/<pid>/stat field 22) */
  double heartbeat_age;        /* seconds since its last heartbeat */
} clientpool_fleet_member_stats_t;

/* Writes the segment name of fleet `name` (len bytes) into buf (n bytes,
 * NUL-terminated) and returns its length, or EINVAL for a bad name (empty,
 * longer than NAME_MAX, holding a NUL) or a buffer too small (64 is
 * enough).  Does no I/O. */
int clientpool_fleet_shm_name(const char *name, size_t len, char *buf, size_t n);

/* Opens fleet `name`.  lim != NULL: creates it (O_EXCL, mode 0600) or
 * attaches to it and updates its limits; lim == NULL: attaches only
 * (ENOENT if it does not exist).  A stale segment (every member row dead)
 * is recovered on the way.  On success sets *out (caller-owned, free with
 * clientpool_fleet_close) and returns 0 (1 when this call created it);
 * else returns an error and writes a sentence into err (errlen bytes,
 * NUL-terminated; err may be NULL).  May wait up to about a second for a
 * creator that is still initializing the segment. */
int clientpool_fleet_open(const char *name, size_t len, const clientpool_fleet_limits_t *lim,
                          clientpool_fleet_t **out, char *err, size_t errlen);

/* Leaves (if joined: every unit still held is given back) and unmaps.
 * NULL is accepted.  A handle retained n times is closed by the (n+1)-th
 * call: an engine that takes its budget from the handle retains it
 * (clientpool_set_fleet) and closes it when it is freed, so the handle
 * outlives every engine that uses it, whatever order their owners go in. */
void clientpool_fleet_close(clientpool_fleet_t *f);

/* One more owner of the handle: see clientpool_fleet_close. */
void clientpool_fleet_retain(clientpool_fleet_t *f);

/* For a process about to exit whose clients the kernel will close (an
 * nginx worker that exits after a reload): the member keeps its row and
 * every unit it holds until the process is dead, when the others reclaim
 * them (so the budget never comes back while a socket may still be open).
 * From now on takes are refused, gives do nothing, and close unmaps
 * without leaving.  No system call. */
void clientpool_fleet_detach(clientpool_fleet_t *f);

/* Unlinks the named segment.  Processes attached keep their mapping until
 * they close it; the next open creates a new one.  0, ENOENT, or an error
 * (message in err). */
int clientpool_fleet_remove(const char *name, size_t len, char *err, size_t errlen);

/* Makes the handle a member (takes a free row; dead members are reclaimed
 * first if none is free).  0, EMEMBERS or EBUSY.  A handle opened (or
 * joined) before a fork joins afresh in the child; until it has, the child
 * must not use it for anything else. */
int clientpool_fleet_join(clientpool_fleet_t *f);

/* Gives back every unit and posted demand, closes its keys, frees the row.
 * 0 or ENOTMEMBER. */
int clientpool_fleet_leave(clientpool_fleet_t *f);

/* The handle's row, or -1 when it is not a member. */
int32_t clientpool_fleet_row(const clientpool_fleet_t *f);

/* Opens key `key` (len bytes, <= KEY_MAX; may be empty) for the member:
 * finds its slot (hash, then the bytes compared) or claims a free one.
 * Returns the slot (>= 0), the same for every member while the key is in
 * use, or EKEYS, EINVAL, EBUSY, ENOTMEMBER.  Opening an open key again
 * returns its slot. */
int32_t clientpool_fleet_key_open(clientpool_fleet_t *f, const char *key, size_t len);

/* Closes the member's use of a key.  The slot is freed once no member has
 * it open, nothing is held on it and it is not paused.  0, ENOTHELD (not
 * open), or EINVAL while the member still holds units or demand on it
 * (give and withdraw them first). */
int clientpool_fleet_key_close(clientpool_fleet_t *f, int32_t key);

/* Looks a key up without opening it (any handle).  Slot or ENOENT. */
int32_t clientpool_fleet_key_find(clientpool_fleet_t *f, const char *key, size_t len);

/* Sets a key's own LIVE cap (any handle): the Redis backend's share of the
 * key for this machine (docs/fleet.md section 14); < 0 goes back to the
 * fleet's key_max_live.  A raised cap moves the sequence (waiters look
 * again).  The slot, or ENOENT when no slot holds the key. */
int32_t clientpool_fleet_key_cap(clientpool_fleet_t *f, const char *key, size_t len, int32_t cap);

/* Takes one unit of `kind` for key (an open key's slot; < 0: no per-key
 * accounting).  Increment-then-check on the key's total, then on the fleet
 * total (FLOOR: on the key's refills + idle against min_idle); a take that
 * lost a race (room appeared as it backed off) is retried up to `attempts`
 * times.  While other members wait (posted demand) a LIVE or LEASE take is
 * served in turn: it is refused unless the room exceeds the members whose
 * demand is older (each member goes to the back once served).  TAKEN,
 * REFUSED, REFUSED_KEY; EINVAL, ENOTHELD (key not open), ENOTMEMBER.  Never
 * blocks. */
int clientpool_fleet_take(clientpool_fleet_t *f, int32_t kind, int32_t key);

/* Gives one unit back.  0, or ENOTHELD when the member holds none of that
 * kind on that key (nothing changes).  When anyone waits, the sequence
 * number is bumped.  A LIVE give also settles one pledge to shed. */
int clientpool_fleet_give(clientpool_fleet_t *f, int32_t kind, int32_t key);

/* Posts the member's demand: n (>= 0) of its callers wait for `kind` (LIVE
 * or LEASE) on the fleet-wide cap (key < 0) or on the key's cap.  Absolute,
 * not a delta; 0 withdraws.  The first fleet-level post takes a turn
 * ticket.  Returns the sequence number to poll against (0 on error).  After
 * posting, the caller retries its take once before it waits (a give that
 * came between the refusal and the post did not bump the sequence). */
uint64_t clientpool_fleet_demand(clientpool_fleet_t *f, int32_t kind, int32_t key, int32_t n);

/* Units members wait for, all posted demand (fleet- and key-level): one
 * load.  A releasing member reads it to decide whether to shed (and a give
 * bumps the sequence only when it is > 0). */
int32_t clientpool_fleet_waiting(const clientpool_fleet_t *f);

/* The units of `kind` this member holds: its whole share (key < 0) or its
 * share on a key slot.  One load.  ENOTMEMBER, EINVAL. */
int32_t clientpool_fleet_held(const clientpool_fleet_t *f, int32_t kind, int32_t key);

/* The sequence number: a plain atomic load, no system call. */
uint64_t clientpool_fleet_seq(const clientpool_fleet_t *f);

/* What a waiting member calls at each poll: refreshes its heartbeat (its
 * turn lapses if it stops polling) and returns the sequence number.  One
 * clock read (vDSO), no system call. */
uint64_t clientpool_fleet_poll(clientpool_fleet_t *f);

/* Rebalance: how many LIVE units of key (< 0: of any key, for the fleet
 * cap) this member should give back now so that members waiting elsewhere
 * are served: other members' posted demand beyond the free room, limited
 * to this member's holdings above its fair share (the cap divided among
 * the members holding or waiting) and to what no other member pledged.
 * The result is pledged (seen by the others) until the member's next shed
 * call; each LIVE give settles one.  The driver retires that many clients,
 * idle ones first. */
int32_t clientpool_fleet_shed(clientpool_fleet_t *f, int32_t key);

/* Scans the member rows (a handle that is not a member scans under the
 * admin lock: EBUSY if it is held): refreshes the caller's heartbeat; checks the
 * liveness of every other row whose heartbeat is older than 0.5 s (full =
 * 1: of every row) through /proc/<pid>/stat (the pid exists, is not a
 * zombie, and its start time matches); reclaims the dead (a CAS on the row
 * makes each reclaim happen once); completes reclaims whose reclaimer died;
 * repairs the remainder of a member that died inside an operation when no
 * live member is inside one; clears pauses whose deadline passed; frees
 * keys left empty.  Returns the number of members this call reclaimed, or
 * an error.  Costs a few microseconds per row checked; rows with a fresh
 * heartbeat cost a load. */
int32_t clientpool_fleet_scan(clientpool_fleet_t *f, int32_t full);

/* Pauses admission of the whole fleet (key NULL) or of one key (created
 * and pinned while paused), with a reason (<= REASON_MAX bytes, longer is
 * cut) and an optional deadline `until` (CLOCK_MONOTONIC seconds, as
 * clientpool_monotime; < 0: none) after which the gate reads open.  Any
 * handle may pause.  0, EKEYS, EBUSY, EINVAL. */
int clientpool_fleet_pause(clientpool_fleet_t *f, const char *key, size_t keylen,
                           const char *reason, size_t len, double until);

/* Resumes the fleet (key NULL) or a key.  0 (also when it was not paused). */
int clientpool_fleet_resume(clientpool_fleet_t *f, const char *key, size_t keylen);

/* Reads a gate: the fleet's (slot < 0) or a key slot's.  Returns 1 paused,
 * 0 open (a gate past its deadline reads open), or EINVAL; copies the
 * reason into reason (n bytes, NUL-terminated; may be NULL) and the
 * deadline into *until (may be NULL; -1 none). */
int clientpool_fleet_gate(clientpool_fleet_t *f, int32_t slot, char *reason, size_t n, double *until);

/* Bumped at every pause and resume: a member compares it to the value it
 * last saw (a plain load) and reads the gates only when it moved. */
uint64_t clientpool_fleet_gates_gen(const clientpool_fleet_t *f);

/* The validity deadline (CLOCK_MONOTONIC seconds, as clientpool_monotime):
 * past it the fleet reads lapsed, and every member's engine admits
 * nothing, keeps no released client idle and closes its idle ones, until
 * the deadline is moved.  until < 0 clears it: no deadline, never lapsed
 * (a fleet that never had one, as every one-machine fleet).  A Redis
 * fleet's agent writes its lease's validity here at each renewal.  Moving
 * the deadline of a lapsed fleet bumps gates_gen (members look again).
 * Any handle.  0, EINVAL (NaN). */
int clientpool_fleet_set_valid(clientpool_fleet_t *f, double until);

/* 1 past the validity deadline, 0 before it or without one: one load, and
 * a clock read (vDSO) only when a deadline is set. */
int32_t clientpool_fleet_lapsed(const clientpool_fleet_t *f);

/* The validity deadline, or -1 when none is set: one load. */
double clientpool_fleet_valid_until(const clientpool_fleet_t *f);

/* The machine's agent (a Redis fleet's machine-local fleet: the one process
 * that leases for the machine).  The place is one word: an epoch, bumped by
 * every claim, and the holder's pid, with the holder's beat (its last sign
 * of life, CLOCK_MONOTONIC).  Whoever holds the current epoch may write
 * the limits and the validity through agent_update; a holder that was
 * stopped and replaced finds its epoch stale there (ESTALE), atomically
 * with the write, so two agents never both set the machine's share. */

/* The current epoch (0: never claimed); *pid the holder (0: vacant), *age
 * seconds since its last beat (-1 vacant).  pid and age may be NULL. */
uint32_t clientpool_fleet_agent(const clientpool_fleet_t *f, int32_t *pid, double *age);

/* Claims the place for this process if `epoch` is still current and the
 * place is vacant, or its beat is at least `stale` seconds old (a stopped
 * holder), or half a second old with its process gone (a dead one).  Returns the new epoch (> 0), or 0 when the place is
 * not claimable or another claim came first.  Under the admin lock. */
uint32_t clientpool_fleet_agent_claim(clientpool_fleet_t *f, uint32_t epoch, double stale);

/* The holder's beat.  0, or ESTALE when epoch is no longer this process's. */
int clientpool_fleet_agent_beat(clientpool_fleet_t *f, uint32_t epoch);

/* As clientpool_fleet_update (lim; NULL: unchanged) and
 * clientpool_fleet_set_valid (until; NaN: unchanged), both only while
 * `epoch` is this process's, checked under the admin lock that claims
 * take.  0, ESTALE (nothing written), EINVAL, EGEOMETRY, EBUSY. */
int clientpool_fleet_agent_update(clientpool_fleet_t *f, uint32_t epoch, const clientpool_fleet_limits_t *lim,
                                  double until, char *err, size_t errlen);

/* Leaves the place vacant (the epoch stays).  0, or ESTALE. */
int clientpool_fleet_agent_release(clientpool_fleet_t *f, uint32_t epoch);

/* The current limits.  0. */
int clientpool_fleet_limits(const clientpool_fleet_t *f, clientpool_fleet_limits_t *out);

/* Updates the limits (the rules of open; members and max_keys up to the
 * segment's size), as attaching with limits does.  Units already held
 * stay held: a lower cap admits nothing new until holdings are under it.
 * 0, EINVAL or EGEOMETRY (message in err), EBUSY. */
int clientpool_fleet_update(clientpool_fleet_t *f, const clientpool_fleet_limits_t *lim, char *err, size_t errlen);

/* Units of `kind` held fleet-wide (key < 0) or on a key slot (LEASE: the
 * fleet total only): one plain load, for decisions such as "is the
 * fleet's idle floor of this key met".  EINVAL for a bad kind or slot. */
int32_t clientpool_fleet_count(const clientpool_fleet_t *f, int32_t kind, int32_t key);

/* Fleet-wide figures.  0. */
int clientpool_fleet_stats(const clientpool_fleet_t *f, clientpool_fleet_stats_t *s);

/* One key slot's figures and name (name: n bytes, not NUL-terminated; the
 * length is s->len; may be NULL).  1 if the slot is in use, 0 if free,
 * EINVAL for a slot out of range. */
int clientpool_fleet_key_stats(clientpool_fleet_t *f, int32_t slot, clientpool_fleet_key_stats_t *s,
                               char *name, size_t n);

/* One member row's figures.  1 if the row is in use, 0 if free, EINVAL out
 * of range.  Checks the row's process (alive): a read of /proc. */
int clientpool_fleet_member_stats(clientpool_fleet_t *f, int32_t row, clientpool_fleet_member_stats_t *s);

/* A static sentence naming an error code. */
const char *clientpool_fleet_strerror(int code);

#endif
