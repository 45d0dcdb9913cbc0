/*
 * fleet.c - the machine-local fleet (csrc/fleet.h; design in docs/fleet.md).
 *
 * Everything shared lives in one named POSIX shared-memory segment; the
 * only process state is the caller-owned handle (no C globals).  No call
 * blocks: the admin lock is a bounded try-lock, waiting is the caller's.
 *
 * Crash safety in one rule.  Every counter step is ordered so that a
 * process killed between two steps can only leave an aggregate HIGHER than
 * the sum of the member rows (take: aggregate first, row after; give: row
 * first, aggregate after; reclaim: exchange the row to zero, then subtract).
 * So a crash never lets a cap be exceeded; it can only strand a unit.  The
 * stranded remainder is given back by a repair that recomputes every
 * aggregate from the rows while no live member is inside an operation
 * (each row's opseq is odd inside one: a seqlock-style snapshot), under
 * the admin lock.  A member that dies outside an operation needs no repair:
 * its row is exact, and reclaiming it subtracts exactly its share.
 */
#define _POSIX_C_SOURCE 200809L
#include "fleet.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Shared-memory atomics must not be lock-based (a lock in the process's
 * own memory would not be shared). */
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "int atomics must be lock-free");
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "64-bit atomics must be lock-free");

#define FL_MAGIC 0x31544c4650504c43ULL     /* "CLPPFLT1" */
#define FL_VERSION 3u                      /* 2: the validity deadline (valid_ns); 3: a key slot's own LIVE cap */
#define FL_READY UINT64_MAX                /* init word once initialized */
#define FL_LINE 64
#define FL_MAX_ROWS 4096
#define FL_MAX_KEYS 65536
#define FL_MAX_CELLS (1 << 21)
#define FL_CAP_MAX (1 << 30)               /* larger caps mean "none" (no overflow) */
#define FL_REASON_WORDS 15                 /* 120 bytes of reason */
#define FL_HB_STALE_NS 500000000ULL        /* rows with an older heartbeat get a liveness check */
#define FL_TURN_TTL_NS 250000000ULL        /* a waiter that stopped polling loses its turn */
#define FL_ADMIN_SPINS 4096
#define FL_INIT_WAIT_MS 1000               /* for a live initializer to finish */
#define FL_SIZE_WAIT_MS 250                /* for a creator to size the segment it made */

#define LDR(x) atomic_load_explicit(&(x), memory_order_relaxed)
#define LD(x) atomic_load(&(x))
#define STR(x, v) atomic_store_explicit(&(x), (v), memory_order_relaxed)
#define STL(x, v) atomic_store_explicit(&(x), (v), memory_order_release)
#define ST(x, v) atomic_store(&(x), (v))
#define ADD(x, v) atomic_fetch_add(&(x), (v))
#define SUB(x, v) atomic_fetch_sub(&(x), (v))
#define XCHG(x, v) atomic_exchange(&(x), (v))

enum { L_MAX_LIVE, L_MAX_IDLE, L_MIN_IDLE, L_MAX_CONC, L_KEY_MAX_LIVE, L_KEY_MAX_IDLE,
       L_MAX_KEYS, L_MEMBERS, L_ATTEMPTS, L_N };

/* Row states, in the low byte of the row's state word; bits 8-31 hold the
 * join serial while JOINING or ALIVE (so a CAS that read an earlier member
 * of the row cannot succeed on a later one, even with a reused pid) and the
 * reclaimer's row + 1 while RECLAIMING (0: a reclaim under the admin lock);
 * bits 32-63 the member's pid.  One CAS changes owner and state at once. */
enum { ST_FREE = 0, ST_JOINING = 1, ST_ALIVE = 2, ST_RECLAIMING = 3 };
#define W_ST(w) ((int)((w) & 0xffu))
#define W_AUX(w) ((int32_t)(((w) >> 8) & 0xffffffu))
#define W_PID(w) ((int32_t)((w) >> 32))
#define W_MAKE(st, aux, pid) ((uint64_t)(st) | ((uint64_t)(uint32_t)(aux) << 8) | ((uint64_t)(uint32_t)(pid) << 32))

enum { LIVE = CLIENTPOOL_FLEET_LIVE, IDLE = CLIENTPOOL_FLEET_IDLE, LEASE = CLIENTPOOL_FLEET_LEASE,
       FLOOR = CLIENTPOOL_FLEET_FLOOR, KINDS = CLIENTPOOL_FLEET_KINDS };

typedef struct { _Atomic int32_t v; char pad[FL_LINE - sizeof(int32_t)]; } fl_i32line;

/* A pause gate.  `paused` is the authority; until and reason are written
 * under the admin lock inside a seqlock (wseq odd while written) and read
 * without it.  The reason is kept in atomic words so readers race nothing. */
typedef struct fl_gate {
  _Atomic int32_t paused;
  _Atomic uint32_t wseq;
  _Atomic uint64_t until;            /* double bits; negative = none */
  _Atomic uint32_t rlen;
  _Atomic uint32_t pad;
  _Atomic uint64_t reason[FL_REASON_WORDS];
} fl_gate;

typedef struct fl_hdr {
  /* identity: written once by the initializer, before init = FL_READY */
  uint64_t magic;
  uint32_t version, hdr_size;
  uint64_t total_size;
  uint32_t uid, rows, keys_cap, index_cap;
  uint64_t off_rows, off_keys, off_index, off_cells;
  uint64_t pidns;
  uint64_t created;                  /* double bits */
  uint32_t name_len, pad0;
  char name[CLIENTPOOL_FLEET_NAME_MAX + 8];
  _Atomic uint64_t init;             /* 0, an initializer's identity, or FL_READY */
  char pad1[FL_LINE];
  /* limits: read-mostly */
  _Atomic int32_t lim[L_N];
  _Atomic uint32_t lim_gen;
  char pad2[FL_LINE];
  /* hot counters, a line each */
  fl_i32line total[KINDS];
  _Atomic uint64_t seq;
  char pad3[FL_LINE - sizeof(uint64_t)];
  /* waiting */
  _Atomic int32_t demand_all;        /* every posted demand, fleet- and key-level */
  _Atomic int32_t demand[KINDS];     /* fleet-level */
  _Atomic int32_t demanders[KINDS];  /* rows holding a turn ticket */
  _Atomic int32_t pledged;
  _Atomic uint64_t ticket;
  char pad4[FL_LINE];
  /* administration */
  _Atomic uint64_t admin;            /* lock: holder's identity, 0 free */
  _Atomic int32_t members, nkeys;
  _Atomic uint32_t hiwater;          /* rows ever used (scan bound) */
  _Atomic uint32_t repair_needed, gc_needed, timed;   /* timed: some gate has a deadline */
  _Atomic uint64_t reclaimed, repairs, repaired_units, resets, joins, repair_negative;
  _Atomic uint64_t gates_gen;
  _Atomic uint64_t valid_ns;         /* CLOCK_MONOTONIC ns past which admission is closed; 0: none */
  _Atomic uint64_t agent;            /* epoch << 32 | holder's pid (0: vacant) */
  _Atomic uint64_t agent_beat;       /* the holder's last beat, CLOCK_MONOTONIC ns */
  fl_gate gate;
} fl_hdr;

typedef struct fl_row {
  _Atomic uint64_t state;
  _Atomic uint64_t start;            /* process start time (ticks since boot), 0 unknown */
  _Atomic uint64_t heartbeat;        /* CLOCK_MONOTONIC ns */
  _Atomic uint32_t opseq;            /* odd inside an operation */
  _Atomic uint32_t serial;
  _Atomic int32_t share[KINDS];
  _Atomic int32_t demand[KINDS];     /* fleet-level */
  _Atomic uint64_t ticket[KINDS];    /* turn ticket while fleet-level demand is posted */
  _Atomic int32_t pledged;
  _Atomic int32_t nrefs;
  char pad[128 - 104];
} fl_row;

typedef struct fl_key {
  _Atomic uint32_t state;            /* 0 free, 1 in use */
  uint32_t len;                      /* identity: under the admin lock */
  uint64_t hash;
  _Atomic int32_t refs;
  _Atomic int32_t pinned;            /* paused: kept while nobody uses it */
  _Atomic int32_t count[KINDS];      /* LIVE, IDLE, FLOOR (LEASE: in the cells) */
  _Atomic int32_t demand[KINDS];     /* key-level */
  _Atomic int32_t pledged;
  _Atomic int32_t cap;               /* its own LIVE cap (a Redis fleet's share), < 0: key_max_live */
  fl_gate gate;
  unsigned char bytes[CLIENTPOOL_FLEET_KEY_MAX];
} fl_key;

typedef struct fl_cell {
  _Atomic int32_t ref;
  _Atomic int32_t share[KINDS];
  _Atomic int32_t demand[KINDS];     /* key-level */
  _Atomic int32_t pledged;
} fl_cell;

_Static_assert(sizeof(fl_row) == 128, "row is two cache lines");
_Static_assert(sizeof(fl_key) % 8 == 0, "key slot alignment");
_Static_assert(offsetof(fl_key, gate) == FL_LINE, "a key slot's counters fill its first line");

struct clientpool_fleet {
  unsigned char *base;
  size_t size;
  fl_hdr *h;
  fl_row *rows;
  fl_key *keys;
  _Atomic int32_t *index;
  fl_cell *cells;
  int32_t nrows, keys_cap, index_cap;
  int32_t row;                       /* own row, -1: not a member */
  fl_row *me;
  fl_cell *mycells;
  int32_t pid;                       /* the process that opened (or joined) */
  uint64_t start;
  uint64_t ident;                    /* lock stamp: pid | start << 32 */
  /* test hook: called once a reclaim has won its row, before any counter
   * is given back (first = 0 when it continues a dead reclaimer's) */
  void (*on_reclaim)(void *ud, int32_t row, int32_t pid, uint64_t start, int first);
  void *on_reclaim_ud;
  uint32_t name_len;
  char name[CLIENTPOOL_FLEET_NAME_MAX + 8];
  int32_t refs;                      /* clientpool_fleet_retain: closed when the last goes */
  int32_t detached;                  /* clientpool_fleet_detach: holdings stay until the process dies */
};

/* ---- small helpers ---------------------------------------------------- */

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static double mono_s(void) { return (double)mono_ns() * 1e-9; }

static uint64_t dbits(double d) { uint64_t u; memcpy(&u, &d, sizeof u); return u; }
static double bitsd(uint64_t u) { double d; memcpy(&d, &u, sizeof d); return d; }

/* +1 / -1 without signed overflow, whatever a corrupt segment holds */
static int32_t inc32(int32_t v) { return (int32_t)((uint32_t)v + 1u); }
static int32_t dec32(int32_t v) { return (int32_t)((uint32_t)v - 1u); }

static void msg(char *err, size_t n, const char *fmt, ...) {
  va_list ap;
  if (!err || n == 0) return;
  va_start(ap, fmt);
  vsnprintf(err, n, fmt, ap);
  va_end(ap);
}

static void nap_ms(int ms) {
  struct timespec ts;
  ts.tv_sec = 0;
  ts.tv_nsec = (long)ms * 1000000L;
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* FNV-1a, then a 64-bit finalizer so the low bits (the index) mix well. */
static uint64_t hash_bytes(const unsigned char *p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ULL;
  size_t i;
  for (i = 0; i < n; i++) { h ^= p[i]; h *= 0x100000001b3ULL; }
  h ^= h >> 33; h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33; h *= 0xc4ceb9fe1a85ec53ULL;
  h ^= h >> 33;
  return h;
}

/* Reads /proc/<pid>/stat: the state letter (field 3) and the start time
 * (field 22).  Returns 1, 0 when the process does not exist, -1 when /proc
 * cannot tell. */
static int read_stat(int32_t pid, char *state, uint64_t *start) {
  char path[48], buf[1024];
  const char *p;
  ssize_t n;
  int fd, field;
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return (errno == ENOENT || errno == ESRCH) ? 0 : -1;
  do { n = read(fd, buf, sizeof buf - 1); } while (n < 0 && errno == EINTR);
  close(fd);
  if (n <= 0) return n == 0 ? 0 : (errno == ESRCH ? 0 : -1);
  buf[n] = 0;
  p = strrchr(buf, ')');               /* the command name may hold spaces and ')' */
  if (!p || p[1] != ' ' || !p[2]) return -1;
  p += 2;
  *state = *p;
  for (field = 3; field < 22 && *p; p++) if (*p == ' ') field++;
  if (field != 22) return -1;
  *start = 0;
  while (*p >= '0' && *p <= '9') *start = *start * 10 + (uint64_t)(*p++ - '0');
  return 1;
}

/* Whether process pid exists, has not exited (a zombie's sockets are
 * closed) and, when start != 0, started at `start` in the bits of `mask`
 * (else the pid was reused by another process). */
static int proc_match(int32_t pid, uint64_t start, uint64_t mask) {
  char st = 0;
  uint64_t t = 0;
  int r;
  if (pid <= 0) return 0;
  r = read_stat(pid, &st, &t);
  if (r == 0) return 0;
  if (r < 0) return kill((pid_t)pid, 0) == 0 || errno == EPERM;
  if (st == 'Z' || st == 'X' || st == 'x') return 0;
  return !start || (t & mask) == start;
}

static int proc_alive(int32_t pid, uint64_t start) { return proc_match(pid, start, UINT64_MAX); }

/* A lock or init stamp: pid in the low half, the start time's low 32 bits in the high half. */
static int ident_alive(uint64_t id) {
  return proc_match((int32_t)(id & 0xffffffffu), id >> 32, 0xffffffffu);
}

static uint64_t self_start(void) {
  char st;
  uint64_t t = 0;
  return read_stat((int32_t)getpid(), &st, &t) == 1 ? t : 0;
}

static uint64_t self_pidns(void) {
  struct stat sb;
  return stat("/proc/self/ns/pid", &sb) == 0 ? (uint64_t)sb.st_ino : 0;
}

static void set_identity(clientpool_fleet_t *f) {
  f->pid = (int32_t)getpid();
  f->start = self_start();
  f->ident = (uint64_t)(uint32_t)f->pid | ((f->start & 0xffffffffu) << 32);
}

/* ---- names and layout ------------------------------------------------- */

static int name_ok(const char *name, size_t len) {
  return name && len > 0 && len <= CLIENTPOOL_FLEET_NAME_MAX && !memchr(name, 0, len);
}

int clientpool_fleet_shm_name(const char *name, size_t len, char *buf, size_t n) {
  size_t i;
  int plain = 1, w;
  if (!name_ok(name, len) || !buf) return CLIENTPOOL_FLEET_EINVAL;
  for (i = 0; i < len; i++) {
    unsigned char c = (unsigned char)name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
          c == '.' || c == '_' || c == '-')) plain = 0;
  }
  if (len > 40) plain = 0;             /* keep segment names short and bounded */
  if (plain)
    w = snprintf(buf, n, "/clientpool.%u.n.%.*s", (unsigned)geteuid(), (int)len, name);
  else
    w = snprintf(buf, n, "/clientpool.%u.h.%016llx", (unsigned)geteuid(),
                 (unsigned long long)hash_bytes((const unsigned char *)name, len));
  if (w < 0 || (size_t)w >= n) return CLIENTPOOL_FLEET_EINVAL;
  return w;
}

typedef struct layout {
  uint64_t rows, keys, index, cells, total;
  uint32_t index_cap;
} layout_t;

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

static int layout_of(int64_t nrows, int64_t nkeys, layout_t *L) {
  uint32_t ic = 2;
  if (nrows < 1 || nrows > FL_MAX_ROWS || nkeys < 1 || nkeys > FL_MAX_KEYS ||
      nrows * nkeys > FL_MAX_CELLS) return 0;
  while (ic < 2 * (uint64_t)nkeys) ic <<= 1;
  L->index_cap = ic;
  L->rows = align_up(sizeof(fl_hdr), 4096);
  L->keys = align_up(L->rows + (uint64_t)nrows * sizeof(fl_row), FL_LINE);
  L->index = align_up(L->keys + (uint64_t)nkeys * sizeof(fl_key), FL_LINE);
  L->cells = align_up(L->index + (uint64_t)ic * sizeof(int32_t), FL_LINE);
  L->total = align_up(L->cells + (uint64_t)nrows * (uint64_t)nkeys * sizeof(fl_cell), 4096);
  return 1;
}

static void bind_layout(clientpool_fleet_t *f, const layout_t *L, int32_t nrows, int32_t nkeys) {
  f->rows = (fl_row *)(void *)(f->base + L->rows);
  f->keys = (fl_key *)(void *)(f->base + L->keys);
  f->index = (_Atomic int32_t *)(void *)(f->base + L->index);
  f->cells = (fl_cell *)(void *)(f->base + L->cells);
  f->nrows = nrows;
  f->keys_cap = nkeys;
  f->index_cap = (int32_t)L->index_cap;
}

static fl_cell *cell_of(const clientpool_fleet_t *f, int32_t row, int32_t key) {
  return &f->cells[(size_t)row * (size_t)f->keys_cap + (size_t)key];
}

/* ---- limits ------------------------------------------------------------ */

static int limits_ok(const clientpool_fleet_limits_t *l, char *err, size_t n) {
#define BAD(...) do { msg(err, n, __VA_ARGS__); return 0; } while (0)
  /* 0 admits nothing: the Redis backend's machine-local share before (or
   * after) its lease (docs/fleet.md section 14), of max_live and of
   * max_concurrency; fleet.new wants >= 1 */
  if (l->max_live < 0) BAD("max_live must be >= 0, got %d", (int)l->max_live);
  if (l->min_idle < 0) BAD("min_idle must be >= 0, got %d", (int)l->min_idle);
  if (l->max_idle < l->min_idle) BAD("min_idle (%d) must be <= max_idle (%d)", (int)l->min_idle, (int)l->max_idle);
  if (l->max_idle > l->max_live) BAD("max_idle (%d) must be <= max_live (%d)", (int)l->max_idle, (int)l->max_live);
  if (l->max_concurrency < 0) BAD("max_concurrency must be >= 0, got %d", (int)l->max_concurrency);
  /* (0: a Redis fleet's keys admit nothing until their share is set,
   * clientpool_fleet_key_cap; fleet.new wants >= 1) */
  if (l->key_max_live >= 0 && l->key_max_live > l->max_live)
    BAD("per_key.max_live (%d) must be in [0, max_live (%d)]", (int)l->key_max_live, (int)l->max_live);
  if (l->key_max_idle >= 0 && l->key_max_idle > l->max_idle)
    BAD("per_key.max_idle (%d) must be <= max_idle (%d)", (int)l->key_max_idle, (int)l->max_idle);
  if (l->max_keys < 1 || l->max_keys > FL_MAX_KEYS) BAD("max_keys must be in [1, %d], got %d", FL_MAX_KEYS, (int)l->max_keys);
  if (l->members < 1 || l->members > FL_MAX_ROWS) BAD("members must be in [1, %d], got %d", FL_MAX_ROWS, (int)l->members);
  if ((int64_t)l->members * l->max_keys > FL_MAX_CELLS)
    BAD("members x max_keys (%d x %d) must be <= %d", (int)l->members, (int)l->max_keys, FL_MAX_CELLS);
  if (l->attempts < 1) BAD("attempts must be >= 1, got %d", (int)l->attempts);
#undef BAD
  return 1;
}

static int32_t capped(int32_t v) { return v > FL_CAP_MAX ? FL_CAP_MAX : v; }

static void limits_store(fl_hdr *h, const clientpool_fleet_limits_t *l) {
  ST(h->lim[L_MAX_LIVE], capped(l->max_live));
  ST(h->lim[L_MAX_IDLE], capped(l->max_idle));
  ST(h->lim[L_MIN_IDLE], capped(l->min_idle));
  ST(h->lim[L_MAX_CONC], capped(l->max_concurrency));
  ST(h->lim[L_KEY_MAX_LIVE], l->key_max_live < 0 ? -1 : capped(l->key_max_live));
  ST(h->lim[L_KEY_MAX_IDLE], l->key_max_idle < 0 ? -1 : capped(l->key_max_idle));
  ST(h->lim[L_MAX_KEYS], l->max_keys);
  ST(h->lim[L_MEMBERS], l->members);
  ST(h->lim[L_ATTEMPTS], l->attempts > 64 ? 64 : l->attempts);
  ADD(h->lim_gen, 1);
}

static int32_t fleet_cap(const fl_hdr *h, int32_t kind) {
  switch (kind) {
  case LIVE: return LDR(h->lim[L_MAX_LIVE]);
  case IDLE: return LDR(h->lim[L_MAX_IDLE]);
  case LEASE: return LDR(h->lim[L_MAX_CONC]);
  default: return FL_CAP_MAX;
  }
}

static int32_t key_cap(const fl_hdr *h, int32_t kind) {
  switch (kind) {
  case LIVE: return LDR(h->lim[L_KEY_MAX_LIVE]);
  case IDLE: return LDR(h->lim[L_KEY_MAX_IDLE]);
  case FLOOR: return LDR(h->lim[L_MIN_IDLE]);
  default: return -1;
  }
}

/* ---- the admin lock ---------------------------------------------------- */

static void rebuild_index(clientpool_fleet_t *f);

/* A bounded try-lock.  A holder that died is detected (its identity is
 * checked every 64 spins) and the lock stolen; whatever it left half done
 * is made consistent again (rebuild_index).  Returns 0 or EBUSY. */
static int admin_lock(clientpool_fleet_t *f, int spins) {
  fl_hdr *h = f->h;
  int i;
  for (i = 0; i < spins; i++) {
    uint64_t cur = 0;
    if (atomic_compare_exchange_strong(&h->admin, &cur, f->ident)) return 0;
    if ((i & 63) == 63 && cur != f->ident && !ident_alive(cur) &&
        atomic_compare_exchange_strong(&h->admin, &cur, f->ident)) {
      rebuild_index(f);
      ST(h->repair_needed, 1);         /* what it changed under the lock is recounted */
      return 0;
    }
    if ((i & 15) == 15) sched_yield();
  }
  return CLIENTPOOL_FLEET_EBUSY;
}

static void admin_unlock(clientpool_fleet_t *f) { ST(f->h->admin, 0); }

/* ---- gates ------------------------------------------------------------- */

static void gate_write(fl_gate *g, int32_t paused, const char *reason, size_t len, double until) {
  uint64_t w[FL_REASON_WORDS];
  int i;
  if (len > CLIENTPOOL_FLEET_REASON_MAX) len = CLIENTPOOL_FLEET_REASON_MAX;
  memset(w, 0, sizeof w);
  if (len) memcpy(w, reason, len);
  ADD(g->wseq, 1);
  ST(g->until, dbits(until < 0 ? -1.0 : until));
  ST(g->rlen, (uint32_t)len);
  for (i = 0; i < FL_REASON_WORDS; i++) ST(g->reason[i], w[i]);
  ADD(g->wseq, 1);
  ST(g->paused, paused);
}

/* Reads a gate; the reason and deadline are best effort if a writer died
 * in the middle (the lock's next holder rewrites the gate). */
static int gate_read(const fl_gate *g, char *reason, size_t n, double *until) {
  int32_t paused = LD(g->paused);
  uint64_t w[FL_REASON_WORDS];
  uint32_t s1, s2, len = 0;
  double u = -1;
  int tries, i;
  memset(w, 0, sizeof w);
  for (tries = 0; tries < 16; tries++) {
    s1 = LD(g->wseq);
    u = bitsd(LD(g->until));
    len = LD(g->rlen);
    for (i = 0; i < FL_REASON_WORDS; i++) w[i] = LD(g->reason[i]);
    s2 = LD(g->wseq);
    if (s1 == s2 && !(s1 & 1)) break;
  }
  if (len > CLIENTPOOL_FLEET_REASON_MAX) len = CLIENTPOOL_FLEET_REASON_MAX;
  if (!(u >= 0)) u = -1;               /* also a NaN from a torn or corrupt word */
  if (paused && u >= 0 && mono_s() >= u) paused = 0;
  if (!paused) { len = 0; u = -1; }
  if (reason && n > 0) {
    size_t k = len < n - 1 ? len : n - 1;
    memcpy(reason, w, k);
    reason[k] = 0;
  }
  if (until) *until = u;
  return paused ? 1 : 0;
}

/* ---- keys -------------------------------------------------------------- */

static int key_matches(const fl_key *k, uint64_t hash, const char *bytes, size_t len) {
  return k->hash == hash && k->len == len && (len == 0 || memcmp(k->bytes, bytes, len) == 0);
}

/* Under the admin lock.  The slot holding the key, or -1. */
static int32_t index_find(const clientpool_fleet_t *f, uint64_t hash, const char *bytes, size_t len) {
  uint32_t mask = (uint32_t)f->index_cap - 1, i = (uint32_t)hash & mask, n;
  for (n = 0; n < (uint32_t)f->index_cap; n++, i = (i + 1) & mask) {
    int32_t e = LD(f->index[i]);
    if (e == 0) return -1;
    if (e > 0 && e <= f->keys_cap) {
      const fl_key *k = &f->keys[e - 1];
      if (LD(k->state) == 1 && key_matches(k, hash, bytes, len)) return e - 1;
    }
  }
  return -1;
}

static void index_insert(clientpool_fleet_t *f, int32_t slot) {
  uint32_t mask = (uint32_t)f->index_cap - 1, i = (uint32_t)f->keys[slot].hash & mask, n;
  for (n = 0; n < (uint32_t)f->index_cap; n++, i = (i + 1) & mask)
    if (LD(f->index[i]) == 0) { ST(f->index[i], slot + 1); return; }
}

/* Linear probing deletion by backward shift (no tombstones). */
static void index_delete(clientpool_fleet_t *f, int32_t slot) {
  uint32_t mask = (uint32_t)f->index_cap - 1, i = (uint32_t)f->keys[slot].hash & mask, j, n;
  for (n = 0; n < (uint32_t)f->index_cap; n++, i = (i + 1) & mask) {
    int32_t e = LD(f->index[i]);
    if (e == 0) return;
    if (e == slot + 1) break;
  }
  if (n == (uint32_t)f->index_cap) return;
  for (j = (i + 1) & mask;; j = (j + 1) & mask) {
    int32_t e = LD(f->index[j]);
    uint32_t home;
    if (e == 0 || j == i) break;
    if (e < 1 || e > f->keys_cap) { ST(f->index[j], 0); continue; }
    home = (uint32_t)f->keys[e - 1].hash & mask;
    /* e may move to the hole at i unless its home lies cyclically in (i, j] */
    if ((j > i && (home <= i || home > j)) || (j < i && home <= i && home > j)) {
      ST(f->index[i], e);
      i = j;
    }
  }
  ST(f->index[i], 0);
}

static int key_empty(const fl_key *k) {
  int kind;
  if (LD(k->refs) != 0 || LD(k->pinned) || LD(k->pledged)) return 0;
  for (kind = 0; kind < KINDS; kind++) if (LD(k->count[kind]) || LD(k->demand[kind])) return 0;
  return 1;
}

/* Under the admin lock: frees slot s if nobody uses it. */
static void key_maybe_free(clientpool_fleet_t *f, int32_t s) {
  fl_key *k = &f->keys[s];
  if (LD(k->state) != 1 || !key_empty(k)) return;
  index_delete(f, s);
  ST(k->state, 0);
  SUB(f->h->nkeys, 1);
}

static void keys_gc(clientpool_fleet_t *f) {
  int32_t s;
  ST(f->h->gc_needed, 0);
  for (s = 0; s < f->keys_cap; s++) key_maybe_free(f, s);
}

/* Under the admin lock: the index and the key count again from the slots
 * (after stealing the lock from a holder that died mid-change), and every
 * gate's seqlock even. */
static void rebuild_index(clientpool_fleet_t *f) {
  int32_t s, n = 0, i;
  for (i = 0; i < f->index_cap; i++) ST(f->index[i], 0);
  for (s = 0; s < f->keys_cap; s++) {
    fl_key *k = &f->keys[s];
    uint32_t st = LD(k->state);
    if (st != 0 && st != 1) { ST(k->state, 0); st = 0; }
    if (st == 1 && (k->len > CLIENTPOOL_FLEET_KEY_MAX ||
                    index_find(f, k->hash, (const char *)k->bytes, k->len) >= 0)) {
      ST(k->state, 0);                 /* a torn or duplicate identity: drop it */
      st = 0;
    }
    if (st == 1) { index_insert(f, s); n++; }
    if (LD(k->gate.wseq) & 1) ADD(k->gate.wseq, 1);
  }
  if (LD(f->h->gate.wseq) & 1) ADD(f->h->gate.wseq, 1);
  ST(f->h->nkeys, n);
}

/* Under the admin lock: the slot of the key, claiming a free one if it is
 * new.  Slot, or EKEYS. */
static int32_t key_get(clientpool_fleet_t *f, const char *bytes, size_t len, uint64_t hash) {
  int32_t s = index_find(f, hash, bytes, len), i;
  fl_key *k;
  if (s >= 0) return s;
  if (LD(f->h->nkeys) >= LDR(f->h->lim[L_MAX_KEYS])) {
    keys_gc(f);
    if (LD(f->h->nkeys) >= LDR(f->h->lim[L_MAX_KEYS])) return CLIENTPOOL_FLEET_EKEYS;
  }
  for (i = 0; i < f->keys_cap; i++) {
    s = (int32_t)(((uint32_t)hash + (uint32_t)i) % (uint32_t)f->keys_cap);
    if (LD(f->keys[s].state) == 0) break;
  }
  if (i == f->keys_cap) return CLIENTPOOL_FLEET_EKEYS;
  k = &f->keys[s];
  k->len = (uint32_t)len;
  k->hash = hash;
  if (len) memcpy(k->bytes, bytes, len);
  ST(k->refs, 0);
  ST(k->pinned, 0);
  for (i = 0; i < KINDS; i++) { ST(k->count[i], 0); ST(k->demand[i], 0); }
  ST(k->pledged, 0);
  ST(k->cap, -1);
  gate_write(&k->gate, 0, NULL, 0, -1);
  ST(k->state, 1);
  index_insert(f, s);
  ADD(f->h->nkeys, 1);
  return s;
}

/* ---- opening ----------------------------------------------------------- */

static void init_segment(clientpool_fleet_t *f, const clientpool_fleet_limits_t *lim, const layout_t *L) {
  fl_hdr *h = f->h;
  /* everything but the init word: a re-initialization after a dead
   * initializer may find anything there */
  memset(f->base, 0, offsetof(fl_hdr, init));
  memset(f->base + offsetof(fl_hdr, init) + sizeof h->init, 0,
         L->total - offsetof(fl_hdr, init) - sizeof h->init);
  h->version = FL_VERSION;
  h->hdr_size = (uint32_t)sizeof(fl_hdr);
  h->total_size = L->total;
  h->uid = (uint32_t)geteuid();
  h->rows = (uint32_t)lim->members;
  h->keys_cap = (uint32_t)lim->max_keys;
  h->index_cap = L->index_cap;
  h->off_rows = L->rows;
  h->off_keys = L->keys;
  h->off_index = L->index;
  h->off_cells = L->cells;
  h->pidns = self_pidns();
  h->created = dbits(mono_s());
  h->name_len = f->name_len;
  memcpy(h->name, f->name, f->name_len);
  limits_store(h, lim);
  ST(h->seq, 1);
  ST(h->gates_gen, 1);
  gate_write(&h->gate, 0, NULL, 0, -1);
  h->magic = FL_MAGIC;
  ST(h->init, FL_READY);
}

/* Checks a READY segment of st_size bytes against this build and process. */
static int check_header(const clientpool_fleet_t *f, const fl_hdr *h, uint64_t st_size,
                        const char *shm, char *err, size_t n, layout_t *L) {
  uint64_t ns;
  if (h->magic != FL_MAGIC) {
    msg(err, n, "segment %s is not a clientpool fleet (bad magic): refused", shm);
    return CLIENTPOOL_FLEET_ECORRUPT;
  }
  if (h->version != FL_VERSION || h->hdr_size != sizeof(fl_hdr)) {
    msg(err, n, "segment %s has layout version %u (header %u bytes); this build reads version %u "
        "(%u bytes): refused (stop its users and remove it, or use the same build)",
        shm, (unsigned)h->version, (unsigned)h->hdr_size, FL_VERSION, (unsigned)sizeof(fl_hdr));
    return CLIENTPOOL_FLEET_EVERSION;
  }
  if (h->uid != (uint32_t)geteuid()) {
    msg(err, n, "segment %s was made by uid %u, not %u: refused", shm, (unsigned)h->uid, (unsigned)geteuid());
    return CLIENTPOOL_FLEET_EACCES;
  }
  if (!layout_of(h->rows, h->keys_cap, L) || L->index_cap != h->index_cap || L->rows != h->off_rows ||
      L->keys != h->off_keys || L->index != h->off_index || L->cells != h->off_cells ||
      L->total != h->total_size || h->total_size != st_size) {
    msg(err, n, "segment %s is %llu bytes, which does not match its layout (members %u, max_keys %u): "
        "refused as corrupt", shm, (unsigned long long)st_size, (unsigned)h->rows, (unsigned)h->keys_cap);
    return CLIENTPOOL_FLEET_ECORRUPT;
  }
  if (h->name_len != f->name_len || memcmp(h->name, f->name, f->name_len) != 0) {
    msg(err, n, "segment %s holds another fleet (its name hashes alike): refused", shm);
    return CLIENTPOOL_FLEET_ENAME;
  }
  ns = self_pidns();
  if (h->pidns && ns && h->pidns != ns) {
    msg(err, n, "segment %s was made in another pid namespace (its members' pids mean nothing here): refused", shm);
    return CLIENTPOOL_FLEET_EACCES;
  }
  return 0;
}

static int live_rows(clientpool_fleet_t *f);
static void reset_stale(clientpool_fleet_t *f);

static int map_fd(int fd, size_t size, unsigned char **base) {
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return -1;
  *base = p;
  return 0;
}

/* Opens (creating when lim != NULL) and maps; f->base/size/h set on success. */
static int open_segment(clientpool_fleet_t *f, const char *shm, const clientpool_fleet_limits_t *lim,
                        char *err, size_t n, layout_t *L) {
  int tries;
  for (tries = 0; tries < 8; tries++) {
    struct stat sb;
    int fd = -1, created = 0, waited, rc;
    if (lim) {
      fd = shm_open(shm, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      if (fd >= 0) created = 1;
      else if (errno != EEXIST) {
        msg(err, n, "cannot create segment %s: %s", shm, strerror(errno));
        return CLIENTPOOL_FLEET_ESYS;
      }
    }
    if (!created) {
      fd = shm_open(shm, O_RDWR | O_CLOEXEC, 0);
      if (fd < 0) {
        if (errno == ENOENT && lim) continue;      /* removed between the two opens */
        if (errno == ENOENT) { msg(err, n, "no fleet (segment %s does not exist)", shm); return CLIENTPOOL_FLEET_ENOENT; }
        if (errno == EACCES) {
          msg(err, n, "segment %s belongs to another user: refused (%s)", shm, strerror(errno));
          return CLIENTPOOL_FLEET_EACCES;
        }
        msg(err, n, "cannot open segment %s: %s", shm, strerror(errno));
        return CLIENTPOOL_FLEET_ESYS;
      }
    }
    if (created && fchmod(fd, 0600) != 0) { /* the umask may have taken bits */ }
    if (fstat(fd, &sb) != 0) {
      msg(err, n, "cannot stat segment %s: %s", shm, strerror(errno));
      close(fd);
      return CLIENTPOOL_FLEET_ESYS;
    }
    if (!S_ISREG(sb.st_mode) || sb.st_uid != geteuid()) {
      msg(err, n, "segment %s is owned by uid %u, not %u: refused", shm, (unsigned)sb.st_uid, (unsigned)geteuid());
      close(fd);
      return CLIENTPOOL_FLEET_EACCES;
    }
    if ((sb.st_mode & 07777) != 0600) {
      msg(err, n, "segment %s has mode %04o, not 0600: refused", shm, (unsigned)(sb.st_mode & 07777));
      close(fd);
      return CLIENTPOOL_FLEET_EACCES;
    }
    /* a creator may not have sized it yet (its creator, when we made it,
     * sizes it below: it does not wait for itself) */
    for (waited = 0; !created && sb.st_size == 0 && waited < FL_SIZE_WAIT_MS; waited += 5) {
      nap_ms(5);
      if (fstat(fd, &sb) != 0) break;
    }
    if (sb.st_size == 0 && lim && !created) {
      /* its creator died before sizing it: it is ours to initialize */
      created = 1;
    }
    if (created) {
      if (!layout_of(lim->members, lim->max_keys, L)) { close(fd); return CLIENTPOOL_FLEET_EINVAL; }
      if (ftruncate(fd, (off_t)L->total) != 0) {
        msg(err, n, "cannot size segment %s to %llu bytes: %s", shm, (unsigned long long)L->total, strerror(errno));
        close(fd);
        return CLIENTPOOL_FLEET_ESYS;
      }
      sb.st_size = (off_t)L->total;
    }
    if ((uint64_t)sb.st_size < sizeof(fl_hdr)) {
      msg(err, n, sb.st_size == 0 ? "segment %s stayed empty (its creator never sized it): refused"
                                  : "segment %s is too small to be a fleet: refused as corrupt", shm);
      close(fd);
      return sb.st_size == 0 ? CLIENTPOOL_FLEET_ETIMEDOUT : CLIENTPOOL_FLEET_ECORRUPT;
    }
    if (map_fd(fd, (size_t)sb.st_size, &f->base) != 0) {
      msg(err, n, "cannot map segment %s: %s", shm, strerror(errno));
      close(fd);
      return CLIENTPOOL_FLEET_ESYS;
    }
    close(fd);
    f->size = (size_t)sb.st_size;
    f->h = (fl_hdr *)(void *)f->base;
    /* initialization: claimed by a CAS on the init word, waited for by the others */
    for (waited = 0;; waited += 5) {
      uint64_t init = LD(f->h->init);
      if (init == FL_READY) break;
      if (lim && (init == 0 || !ident_alive(init)) &&
          atomic_compare_exchange_strong(&f->h->init, &init, f->ident)) {
        layout_t mine;
        if (!layout_of(lim->members, lim->max_keys, &mine) || mine.total != f->size) {
          /* a dead initializer's segment of another size: remake it at ours */
          ST(f->h->init, 0);
          munmap(f->base, f->size);
          f->base = NULL;
          fd = shm_open(shm, O_RDWR | O_CLOEXEC, 0);
          if (fd < 0 || !layout_of(lim->members, lim->max_keys, &mine) ||
              ftruncate(fd, (off_t)mine.total) != 0) {
            if (fd >= 0) close(fd);
            msg(err, n, "cannot resize half-initialized segment %s", shm);
            return CLIENTPOOL_FLEET_ESYS;
          }
          close(fd);
          break;                                  /* map it again from the top */
        }
        init_segment(f, lim, &mine);
        *L = mine;
        return 1;
      }
      if (waited >= FL_INIT_WAIT_MS) {
        msg(err, n, "segment %s is still being initialized by process %u: gave up after %d ms",
            shm, (unsigned)(init & 0xffffffffu), FL_INIT_WAIT_MS);
        munmap(f->base, f->size);
        f->base = NULL;
        return CLIENTPOOL_FLEET_ETIMEDOUT;
      }
      nap_ms(5);
    }
    if (!f->base) continue;
    rc = check_header(f, f->h, (uint64_t)f->size, shm, err, n, L);
    if (rc != 0) {
      munmap(f->base, f->size);
      f->base = NULL;
      return rc;
    }
    return 0;
  }
  msg(err, n, "segment %s kept changing while it was opened: gave up", shm);
  return CLIENTPOOL_FLEET_EBUSY;
}

int clientpool_fleet_open(const char *name, size_t len, const clientpool_fleet_limits_t *lim,
                          clientpool_fleet_t **out, char *err, size_t errlen) {
  clientpool_fleet_t *f;
  char shm[96], why[160];
  layout_t L;
  int rc, created;
  if (out) *out = NULL;
  if (err && errlen) err[0] = 0;
  if (!out || clientpool_fleet_shm_name(name, len, shm, sizeof shm) < 0) {
    msg(err, errlen, "bad fleet name: a non-empty string of at most %d bytes without NUL", CLIENTPOOL_FLEET_NAME_MAX);
    return CLIENTPOOL_FLEET_EINVAL;
  }
  if (lim && !limits_ok(lim, why, sizeof why)) {
    msg(err, errlen, "%s", why);
    return CLIENTPOOL_FLEET_EINVAL;
  }
  f = calloc(1, sizeof *f);
  if (!f) { msg(err, errlen, "out of memory"); return CLIENTPOOL_FLEET_ENOMEM; }
  f->row = -1;
  f->name_len = (uint32_t)len;
  memcpy(f->name, name, len);
  set_identity(f);
  rc = open_segment(f, shm, lim, err, errlen, &L);
  if (rc < 0) { free(f); return rc; }
  created = rc == 1;
  bind_layout(f, &L, (int32_t)f->h->rows, (int32_t)f->h->keys_cap);
  if (!created && lim) {
    rc = clientpool_fleet_update(f, lim, err, errlen);
    if (rc < 0) {
      clientpool_fleet_close(f);
      return rc;
    }
  }
  if (!created && live_rows(f) == 0) reset_stale(f);
  *out = f;
  return created;
}

int clientpool_fleet_remove(const char *name, size_t len, char *err, size_t errlen) {
  char shm[96];
  if (err && errlen) err[0] = 0;
  if (clientpool_fleet_shm_name(name, len, shm, sizeof shm) < 0) {
    msg(err, errlen, "bad fleet name: a non-empty string of at most %d bytes without NUL", CLIENTPOOL_FLEET_NAME_MAX);
    return CLIENTPOOL_FLEET_EINVAL;
  }
  if (shm_unlink(shm) == 0) return 0;
  if (errno == ENOENT) { msg(err, errlen, "no fleet (segment %s does not exist)", shm); return CLIENTPOOL_FLEET_ENOENT; }
  msg(err, errlen, "cannot remove segment %s: %s", shm, strerror(errno));
  return CLIENTPOOL_FLEET_ESYS;
}

void clientpool_fleet_detach(clientpool_fleet_t *f) {
  if (f) f->detached = 1;
}

void clientpool_fleet_retain(clientpool_fleet_t *f) {
  if (f) f->refs++;
}

void clientpool_fleet_close(clientpool_fleet_t *f) {
  if (!f) return;
  if (f->refs > 0) { f->refs--; return; }   /* an engine still uses it (clientpool_set_fleet) */
  if (f->base) {
    if (f->row >= 0 && f->pid == (int32_t)getpid() && !f->detached) clientpool_fleet_leave(f);
    munmap(f->base, f->size);
  }
  free(f);
}

/* ---- members ----------------------------------------------------------- */

static void op_begin(fl_row *r) { STR(r->opseq, LDR(r->opseq) + 1); }
static void op_end(fl_row *r) { STL(r->opseq, LDR(r->opseq) + 1); }

static void notify(fl_hdr *h) {
  if (LD(h->demand_all) > 0) ADD(h->seq, 1);
}

static int key_level(int32_t kind) { return kind != LEASE; }

/* Gives back everything row r holds (it is RECLAIMING, by us).  Each value
 * leaves the row (exchange) before it leaves the aggregate, so dying here
 * strands units, never double-frees them. */
static void drain_row(clientpool_fleet_t *f, int32_t r) {
  fl_hdr *h = f->h;
  fl_row *row = &f->rows[r];
  int32_t k, v, kind;
  for (kind = 0; kind < KINDS; kind++) {
    v = XCHG(row->share[kind], 0);
    if (v) SUB(h->total[kind].v, v);
    v = XCHG(row->demand[kind], 0);
    if (v) { SUB(h->demand[kind], v); SUB(h->demand_all, v); }
    if (XCHG(row->ticket[kind], 0)) SUB(h->demanders[kind], 1);
  }
  v = XCHG(row->pledged, 0);
  if (v) SUB(h->pledged, v);
  for (k = 0; k < f->keys_cap; k++) {
    fl_cell *c = cell_of(f, r, k);
    fl_key *ks = &f->keys[k];
    if (!LD(c->ref) && !LD(c->pledged) && !LD(c->share[LIVE]) && !LD(c->share[IDLE]) &&
        !LD(c->share[LEASE]) && !LD(c->share[FLOOR]) && !LD(c->demand[LIVE]) && !LD(c->demand[LEASE]))
      continue;
    for (kind = 0; kind < KINDS; kind++) {
      v = XCHG(c->share[kind], 0);
      if (v && key_level(kind)) SUB(ks->count[kind], v);
      v = XCHG(c->demand[kind], 0);
      if (v) { SUB(ks->demand[kind], v); SUB(h->demand_all, v); }
    }
    v = XCHG(c->pledged, 0);
    if (v) SUB(ks->pledged, v);
    if (XCHG(c->ref, 0)) SUB(ks->refs, 1);
  }
  ST(row->nrefs, 0);
  ST(h->gc_needed, 1);
  ADD(h->seq, 1);                      /* budget came back: waiters look again */
}

/* Frees a row we hold RECLAIMING (word w).  Its start time goes first: once
 * FREE, a joiner writes its own.  Only the CAS winner counts the member out,
 * so a reclaim continued by someone else is counted once. */
static void release_row(clientpool_fleet_t *f, fl_row *row, uint64_t w) {
  ST(row->start, 0);
  if (atomic_compare_exchange_strong(&row->state, &w, W_MAKE(ST_FREE, 0, 0))) SUB(f->h->members, 1);
}

/* Reclaims row r, observed with state word w (dead, or RECLAIMING by a dead
 * reclaimer).  The CAS makes one caller win.  Returns 1 if this call
 * reclaimed a member, else 0. */
static int reclaim_row(clientpool_fleet_t *f, int32_t r, uint64_t w) {
  fl_row *row = &f->rows[r];
  int first = W_ST(w) != ST_RECLAIMING;
  uint64_t mine = W_MAKE(ST_RECLAIMING, f->row >= 0 ? f->row + 1 : 0, W_PID(w));
  int mid_op;
  if (f->me) op_begin(f->me);
  if (!atomic_compare_exchange_strong(&row->state, &w, mine)) {
    if (f->me) op_end(f->me);
    return 0;
  }
  /* inside an operation, in the middle of joining, or reclaimed by someone
   * who died: the aggregates may hold a remainder only a repair can find */
  mid_op = (LD(row->opseq) & 1) || !first || W_ST(w) == ST_JOINING;
  if (first) ADD(f->h->reclaimed, 1);
  if (f->on_reclaim) f->on_reclaim(f->on_reclaim_ud, r, W_PID(w), LD(row->start), first);
  drain_row(f, r);
  if (mid_op) ST(f->h->repair_needed, 1);
  if (LDR(row->opseq) & 1) STR(row->opseq, LDR(row->opseq) + 1);
  release_row(f, row, mine);
  if (f->me) op_end(f->me);
  return first;
}

/* A JOINING row's start time may not be written yet (or be its previous
 * member's): only its pid is checked.  Joins are short and under the admin
 * lock, so a joiner that stays JOINING with a live pid is merely slow. */
static int row_dead(const clientpool_fleet_t *f, int32_t r, uint64_t w) {
  int32_t pid = W_PID(w);
  if (r == f->row) return 0;
  return !proc_alive(pid, W_ST(w) == ST_JOINING ? 0 : LD(f->rows[r].start));
}

/* Whether the reclaimer named in a RECLAIMING word is gone.  The reclaimer
 * is ALIVE in its own row, or (a member leaving) RECLAIMING it itself. */
static int reclaimer_dead(const clientpool_fleet_t *f, uint64_t w) {
  int32_t rr = W_AUX(w) - 1;
  uint64_t rw;
  if (rr < 0) return 0;                /* an admin-lock reclaim: finished by the lock's next holder */
  if (rr >= f->nrows) return 1;        /* nonsense: treat as abandoned */
  if (rr == f->row) return 0;
  rw = LD(f->rows[rr].state);
  if (W_ST(rw) == ST_ALIVE || (W_ST(rw) == ST_RECLAIMING && W_AUX(rw) == rr + 1))
    return !proc_alive(W_PID(rw), LD(f->rows[rr].start));
  return 1;
}

static int32_t hiwater(const clientpool_fleet_t *f) {
  uint32_t hi = LD(f->h->hiwater);
  return hi > (uint32_t)f->nrows ? f->nrows : (int32_t)hi;
}

/* Rows whose process lives (the caller's own included). */
static int live_rows(clientpool_fleet_t *f) {
  int32_t r, hi = hiwater(f), n = 0;
  for (r = 0; r < hi; r++) {
    uint64_t w = LD(f->rows[r].state);
    int st = W_ST(w);
    if (st == ST_FREE) continue;
    if (st == ST_RECLAIMING) { if (!reclaimer_dead(f, w) && W_AUX(w) > 0) n++; continue; }
    if (!row_dead(f, r, w)) n++;
  }
  return n;
}

int clientpool_fleet_join(clientpool_fleet_t *f) {
  fl_hdr *h;
  int32_t r, kind;
  uint32_t serial = 0;
  int rc;
  if (!f || !f->base) return CLIENTPOOL_FLEET_EINVAL;
  if (f->row >= 0) {
    if (f->pid == (int32_t)getpid()) return 0;
    f->row = -1;                       /* the parent's row stays the parent's */
    f->me = NULL;
    f->mycells = NULL;
  }
  h = f->h;
  set_identity(f);                     /* a handle opened before a fork joins as the child */
  rc = admin_lock(f, FL_ADMIN_SPINS);
  if (rc) return rc;
  if (LD(h->members) >= LDR(h->lim[L_MEMBERS])) {
    /* rows of dead members come back first */
    int32_t hi = hiwater(f);
    for (r = 0; r < hi; r++) {
      uint64_t w = LD(f->rows[r].state);
      int st = W_ST(w);
      if ((st == ST_ALIVE || st == ST_JOINING) && row_dead(f, r, w)) reclaim_row(f, r, w);
      else if (st == ST_RECLAIMING && (W_AUX(w) == 0 || reclaimer_dead(f, w))) reclaim_row(f, r, w);
    }
    if (LD(h->members) >= LDR(h->lim[L_MEMBERS])) { admin_unlock(f); return CLIENTPOOL_FLEET_EMEMBERS; }
  }
  for (r = 0; r < f->nrows; r++) {
    uint64_t w = W_MAKE(ST_FREE, 0, 0);
    serial = (LD(f->rows[r].serial) + 1) & 0xffffffu;
    if (atomic_compare_exchange_strong(&f->rows[r].state, &w, W_MAKE(ST_JOINING, serial, f->pid))) break;
  }
  if (r == f->nrows) { admin_unlock(f); return CLIENTPOOL_FLEET_EMEMBERS; }
  {
    fl_row *row = &f->rows[r];
    uint64_t w = W_MAKE(ST_JOINING, serial, f->pid);
    ST(row->start, f->start);
    ST(row->heartbeat, mono_ns());
    if (LD(row->opseq) & 1) ADD(row->opseq, 1);
    for (kind = 0; kind < KINDS; kind++) {
      ST(row->share[kind], 0);
      ST(row->demand[kind], 0);
      ST(row->ticket[kind], 0);
    }
    ST(row->pledged, 0);
    ST(row->nrefs, 0);
    ST(row->serial, serial);
    ADD(h->members, 1);
    ADD(h->joins, 1);
    if (LD(h->hiwater) < (uint32_t)r + 1) ST(h->hiwater, (uint32_t)r + 1);
    if (!atomic_compare_exchange_strong(&row->state, &w, W_MAKE(ST_ALIVE, serial, f->pid))) {
      admin_unlock(f);                 /* taken from us meanwhile: cannot happen to a live joiner */
      return CLIENTPOOL_FLEET_EBUSY;
    }
    f->row = r;
    f->me = row;
    f->mycells = cell_of(f, r, 0);
  }
  admin_unlock(f);
  return 0;
}

int clientpool_fleet_leave(clientpool_fleet_t *f) {
  fl_row *row;
  uint64_t w;
  if (!f || !f->me) return CLIENTPOOL_FLEET_ENOTMEMBER;
  if (f->pid != (int32_t)getpid()) return CLIENTPOOL_FLEET_ENOTMEMBER;
  row = f->me;
  w = LD(row->state);
  op_begin(row);
  if (W_ST(w) == ST_ALIVE && W_PID(w) == f->pid &&
      atomic_compare_exchange_strong(&row->state, &w, W_MAKE(ST_RECLAIMING, f->row + 1, f->pid))) {
    drain_row(f, f->row);
    op_end(row);
    release_row(f, row, W_MAKE(ST_RECLAIMING, f->row + 1, f->pid));
  } else {
    op_end(row);
  }
  f->row = -1;
  f->me = NULL;
  f->mycells = NULL;
  if (admin_lock(f, 64) == 0) { keys_gc(f); admin_unlock(f); }
  return 0;
}

int32_t clientpool_fleet_row(const clientpool_fleet_t *f) { return f ? f->row : -1; }

/* ---- keys, public ------------------------------------------------------ */

int32_t clientpool_fleet_key_open(clientpool_fleet_t *f, const char *key, size_t len) {
  int32_t s;
  fl_cell *c;
  int rc;
  if (!f || !f->me) return CLIENTPOOL_FLEET_ENOTMEMBER;
  if ((!key && len) || len > CLIENTPOOL_FLEET_KEY_MAX) return CLIENTPOOL_FLEET_EINVAL;
  rc = admin_lock(f, FL_ADMIN_SPINS);
  if (rc) return rc;
  s = key_get(f, key, len, hash_bytes((const unsigned char *)key, len));
  if (s >= 0) {
    c = &f->mycells[s];
    if (!LD(c->ref)) {
      ST(c->ref, 1);
      ADD(f->keys[s].refs, 1);
      ST(f->me->nrefs, inc32(LDR(f->me->nrefs)));
    }
  }
  admin_unlock(f);
  return s;
}

int clientpool_fleet_key_close(clientpool_fleet_t *f, int32_t key) {
  fl_cell *c;
  int kind;
  if (!f || !f->me) return CLIENTPOOL_FLEET_ENOTMEMBER;
  if (key < 0 || key >= f->keys_cap) return CLIENTPOOL_FLEET_EINVAL;
  c = &f->mycells[key];
  if (!LDR(c->ref)) return CLIENTPOOL_FLEET_ENOTHELD;
  for (kind = 0; kind < KINDS; kind++)
    if (LDR(c->share[kind]) || LDR(c->demand[kind])) return CLIENTPOOL_FLEET_EINVAL;
  op_begin(f->me);
  {
    /* a pledge to shed on this key lapses with the member's use of it */
    int32_t pl = LDR(c->pledged);
    if (pl) { ST(c->pledged, 0); SUB(f->keys[key].pledged, pl); }
  }
  ST(c->ref, 0);
  SUB(f->keys[key].refs, 1);
  ST(f->me->nrefs, dec32(LDR(f->me->nrefs)));
  op_end(f->me);
  if (admin_lock(f, 64) == 0) {
    key_maybe_free(f, key);
    admin_unlock(f);
  } else {
    ST(f->h->gc_needed, 1);
  }
  return 0;
}

int32_t clientpool_fleet_key_cap(clientpool_fleet_t *f, const char *key, size_t len, int32_t cap) {
  int32_t s, old;
  int rc;
  if (!f || !f->base || (!key && len) || len > CLIENTPOOL_FLEET_KEY_MAX) return CLIENTPOOL_FLEET_EINVAL;
  rc = admin_lock(f, FL_ADMIN_SPINS);   /* (the slot is this key's while the lock is held) */
  if (rc) return rc;
  s = index_find(f, hash_bytes((const unsigned char *)key, len), key, len);
  if (s >= 0) {
    old = LD(f->keys[s].cap);
    ST(f->keys[s].cap, cap < 0 ? -1 : capped(cap));
    if (cap < 0 || old < 0 || cap > old) ADD(f->h->seq, 1);   /* room: the key's waiters look again */
  }
  admin_unlock(f);
  return s >= 0 ? s : CLIENTPOOL_FLEET_ENOENT;
}

int32_t clientpool_fleet_key_find(clientpool_fleet_t *f, const char *key, size_t len) {
  int32_t s;
  int rc;
  if (!f || !f->base || (!key && len) || len > CLIENTPOOL_FLEET_KEY_MAX) return CLIENTPOOL_FLEET_EINVAL;
  rc = admin_lock(f, FL_ADMIN_SPINS);
  if (rc) return rc;
  s = index_find(f, hash_bytes((const unsigned char *)key, len), key, len);
  admin_unlock(f);
  return s >= 0 ? s : CLIENTPOOL_FLEET_ENOENT;
}

/* ---- budgets ----------------------------------------------------------- */

/* While members wait, room goes to them in turn: a take is allowed only if
 * the room exceeds the number of members whose turn ticket is older (a
 * member without a ticket is younger than all of them).  Members that
 * stopped polling (stale heartbeat) lose their turn. */
static int turn_ok(clientpool_fleet_t *f, int32_t kind, int32_t cap) {
  fl_hdr *h = f->h;
  int64_t room = (int64_t)cap - LD(h->total[kind].v);
  int32_t r, hi, older = 0;
  uint64_t mine, now;
  if (room <= 0) return 1;             /* the cap check refuses anyway */
  mine = LDR(f->me->ticket[kind]);
  /* "now" is the taker's own last heartbeat (poll, demand, scan), not a
   * clock read: the engine calls take, and reads no clock.  An old one
   * only makes stale waiters look fresh (the taker defers, posts its
   * demand, which refreshes it, and retries) */
  now = LDR(f->me->heartbeat);
  hi = hiwater(f);
  for (r = 0; r < hi; r++) {
    const fl_row *row = &f->rows[r];
    uint64_t t, hb;
    if (r == f->row) continue;
    t = LD(row->ticket[kind]);
    if (!t || (mine && t > mine)) continue;
    hb = LD(row->heartbeat);
    if (now > hb && now - hb > FL_TURN_TTL_NS) continue;
    if (W_ST(LD(row->state)) != ST_ALIVE) continue;
    if (++older >= room) return 0;
  }
  return 1;
}

int clientpool_fleet_take(clientpool_fleet_t *f, int32_t kind, int32_t key) {
  fl_hdr *h;
  fl_row *me;
  fl_key *ks = NULL;
  fl_cell *c = NULL;
  int32_t cap, kcap = -1, attempts, a, o, rc;
  int kl;
  if (!f || !(me = f->me)) return CLIENTPOOL_FLEET_ENOTMEMBER;
  if ((uint32_t)kind >= KINDS) return CLIENTPOOL_FLEET_EINVAL;
  if (f->detached) return CLIENTPOOL_FLEET_REFUSED;   /* nothing new: this process is on its way out */
  h = f->h;
  if (key >= 0) {
    if (key >= f->keys_cap) return CLIENTPOOL_FLEET_EINVAL;
    c = &f->mycells[key];
    if (!LDR(c->ref)) return CLIENTPOOL_FLEET_ENOTHELD;
    ks = &f->keys[key];
  } else if (kind == FLOOR) {
    return CLIENTPOOL_FLEET_EINVAL;
  }
  kl = ks && key_level(kind);
  cap = fleet_cap(h, kind);
  if (kl) {
    kcap = kind == LIVE ? LDR(ks->cap) : -1;
    if (kcap < 0) kcap = key_cap(h, kind);
  }
  attempts = LDR(h->lim[L_ATTEMPTS]);
  op_begin(me);
  if ((kind == LIVE || kind == LEASE) && LDR(h->demanders[kind]) > 0 && !turn_ok(f, kind, cap)) {
    rc = CLIENTPOOL_FLEET_REFUSED_TURN;
    goto out;
  }
  for (a = 1;; a++) {
    if (kl) {
      o = ADD(ks->count[kind], 1);
      if (kind == FLOOR ? (int64_t)o + 1 + LD(ks->count[IDLE]) > kcap : (kcap >= 0 && o >= kcap)) {
        o = SUB(ks->count[kind], 1);
        if (kind != FLOOR && (int64_t)o - 1 < kcap) {   /* room appeared as we backed off: a lost race */
          if (a < attempts) continue;
          notify(h);
        }
        rc = CLIENTPOOL_FLEET_REFUSED_KEY;
        goto out;
      }
    }
    o = ADD(h->total[kind].v, 1);
    if (kind != FLOOR && o >= cap) {
      o = SUB(h->total[kind].v, 1);
      if (kl) SUB(ks->count[kind], 1);
      if ((int64_t)o - 1 < cap) {
        if (a < attempts) continue;
        notify(h);
      } else if (kl) {
        notify(h);                       /* our key unit may have refused someone */
      }
      rc = CLIENTPOOL_FLEET_REFUSED;
      goto out;
    }
    break;
  }
  STL(me->share[kind], inc32(LDR(me->share[kind])));
  if (c) STL(c->share[kind], inc32(LDR(c->share[kind])));
  if ((kind == LIVE || kind == LEASE) && LDR(me->ticket[kind]))
    STL(me->ticket[kind], ADD(h->ticket, 1) + 1);     /* served: to the back of the turn order */
  rc = CLIENTPOOL_FLEET_TAKEN;
out:
  op_end(me);
  return rc;
}

int clientpool_fleet_give(clientpool_fleet_t *f, int32_t kind, int32_t key) {
  fl_hdr *h;
  fl_row *me;
  fl_key *ks = NULL;
  fl_cell *c = NULL;
  if (!f || !(me = f->me)) return CLIENTPOOL_FLEET_ENOTMEMBER;
  if ((uint32_t)kind >= KINDS) return CLIENTPOOL_FLEET_EINVAL;
  if (f->detached) return 0;           /* held until the process is dead and reclaimed */
  h = f->h;
  if (key >= 0) {
    if (key >= f->keys_cap) return CLIENTPOOL_FLEET_EINVAL;
    c = &f->mycells[key];
    if (!LDR(c->ref) || LDR(c->share[kind]) <= 0) return CLIENTPOOL_FLEET_ENOTHELD;
    ks = &f->keys[key];
  } else if (kind == FLOOR) {
    return CLIENTPOOL_FLEET_EINVAL;
  }
  if (LDR(me->share[kind]) <= 0) return CLIENTPOOL_FLEET_ENOTHELD;
  op_begin(me);
  STL(me->share[kind], dec32(LDR(me->share[kind])));
  if (c) STL(c->share[kind], dec32(LDR(c->share[kind])));
  SUB(h->total[kind].v, 1);
  if (ks && key_level(kind)) SUB(ks->count[kind], 1);
  if (kind == LIVE) {
    if (c && LDR(c->pledged) > 0) { STL(c->pledged, dec32(LDR(c->pledged))); SUB(ks->pledged, 1); }
    if (LDR(me->pledged) > 0) { STL(me->pledged, dec32(LDR(me->pledged))); SUB(h->pledged, 1); }
  }
  op_end(me);
  notify(h);
  return 0;
}

uint64_t clientpool_fleet_demand(clientpool_fleet_t *f, int32_t kind, int32_t key, int32_t n) {
  fl_hdr *h;
  fl_row *me;
  int32_t old;
  if (!f || !(me = f->me) || (kind != LIVE && kind != LEASE) || n < 0) return 0;
  h = f->h;
  if (key >= f->keys_cap || (key >= 0 && !LDR(f->mycells[key].ref))) return 0;
  STL(me->heartbeat, mono_ns());
  op_begin(me);
  if (key < 0) {
    old = LDR(me->demand[kind]);
    if (n != old) {
      STL(me->demand[kind], n);
      if (old == 0) { STL(me->ticket[kind], ADD(h->ticket, 1) + 1); ADD(h->demanders[kind], 1); }
      else if (n == 0) { STL(me->ticket[kind], 0); SUB(h->demanders[kind], 1); }
      ADD(h->demand[kind], (int32_t)((uint32_t)n - (uint32_t)old));
      ADD(h->demand_all, (int32_t)((uint32_t)n - (uint32_t)old));
    }
  } else {
    fl_cell *c = &f->mycells[key];
    old = LDR(c->demand[kind]);
    if (n != old) {
      STL(c->demand[kind], n);
      ADD(f->keys[key].demand[kind], (int32_t)((uint32_t)n - (uint32_t)old));
      ADD(h->demand_all, (int32_t)((uint32_t)n - (uint32_t)old));
    }
  }
  op_end(me);
  return LD(h->seq);
}

uint64_t clientpool_fleet_seq(const clientpool_fleet_t *f) { return LD(f->h->seq); }

int32_t clientpool_fleet_held(const clientpool_fleet_t *f, int32_t kind, int32_t key) {
  if (!f || !f->me) return CLIENTPOOL_FLEET_ENOTMEMBER;
  if ((uint32_t)kind >= KINDS || key >= f->keys_cap) return CLIENTPOOL_FLEET_EINVAL;
  if (key < 0) return LDR(f->me->share[kind]);
  return LDR(f->mycells[key].share[kind]);
}

int32_t clientpool_fleet_waiting(const clientpool_fleet_t *f) { return LD(f->h->demand_all); }

uint64_t clientpool_fleet_poll(clientpool_fleet_t *f) {
  if (f->me) STL(f->me->heartbeat, mono_ns());
  return LD(f->h->seq);
}

/* How many of `held` units to shed so that `others` waiting units are met
 * beyond the free `room`, counting every pledge already made (`pledged`,
 * the caller's own withdrawn first) and keeping a fair share of `cap` among
 * `active` members.  Claims the pledges: increment, then check. */
static int32_t shed_claim(_Atomic int32_t *pledged, int64_t others, int64_t room, int64_t held,
                          int64_t cap, int64_t active) {
  int64_t target, fair, n, o;
  if (room < 0) room = 0;
  target = others - room;
  if (target <= 0 || active < 1 || cap < 1) return 0;
  fair = (cap + active - 1) / active;
  n = held - fair;
  if (n > target - LD(*pledged)) n = target - LD(*pledged);
  if (n <= 0) return 0;
  if (n > FL_CAP_MAX) n = FL_CAP_MAX;
  o = atomic_fetch_add(pledged, (int32_t)n);
  if (o + n > target) {
    int64_t back = o + n - target;
    if (back > n) back = n;
    atomic_fetch_sub(pledged, (int32_t)back);
    n -= back;
  }
  return (int32_t)n;
}

int32_t clientpool_fleet_shed(clientpool_fleet_t *f, int32_t key) {
  fl_hdr *h;
  fl_row *me;
  int32_t r, hi, n = 0, active = 0, p;
  if (!f || !(me = f->me)) return CLIENTPOOL_FLEET_ENOTMEMBER;
  if (key >= f->keys_cap) return CLIENTPOOL_FLEET_EINVAL;
  h = f->h;
  hi = hiwater(f);
  op_begin(me);
  if (key < 0) {
    int64_t others;
    p = LDR(me->pledged);                /* a fresh assessment: the last one's pledges lapse */
    if (p) { STL(me->pledged, 0); SUB(h->pledged, p); }
    others = (int64_t)LD(h->demand[LIVE]) - LDR(me->demand[LIVE]);
    if (others > 0) {
      for (r = 0; r < hi; r++) {
        const fl_row *row = &f->rows[r];
        if (W_ST(LD(row->state)) == ST_ALIVE && (LD(row->share[LIVE]) > 0 || LD(row->demand[LIVE]) > 0)) active++;
      }
      n = shed_claim(&h->pledged, others, (int64_t)LDR(h->lim[L_MAX_LIVE]) - LD(h->total[LIVE].v),
                     LDR(me->share[LIVE]), LDR(h->lim[L_MAX_LIVE]), active);
      STL(me->pledged, n);
    }
  } else {
    fl_cell *c = &f->mycells[key];
    fl_key *ks = &f->keys[key];
    int32_t kcap = LDR(h->lim[L_KEY_MAX_LIVE]);
    int64_t others;
    if (!LDR(c->ref)) { op_end(me); return CLIENTPOOL_FLEET_ENOTHELD; }
    p = LDR(c->pledged);
    if (p) { STL(c->pledged, 0); SUB(ks->pledged, p); }
    others = (int64_t)LD(ks->demand[LIVE]) - LDR(c->demand[LIVE]);
    if (others > 0 && kcap > 0) {
      for (r = 0; r < hi; r++) {
        const fl_cell *rc = cell_of(f, r, key);
        if (W_ST(LD(f->rows[r].state)) == ST_ALIVE && (LD(rc->share[LIVE]) > 0 || LD(rc->demand[LIVE]) > 0)) active++;
      }
      n = shed_claim(&ks->pledged, others, (int64_t)kcap - LD(ks->count[LIVE]),
                     LDR(c->share[LIVE]), kcap, active);
      STL(c->pledged, n);
    }
  }
  op_end(me);
  return n;
}

/* ---- scan, repair, reset ---------------------------------------------- */

typedef struct agg {
  int64_t total[KINDS], demand[KINDS], demanders[KINDS], demand_all, pledged, members;
} agg_t;

/* The repair: every aggregate recomputed from the rows and cells, from a
 * snapshot taken while no live member is inside an operation (each live
 * row's state and opseq read before and after, unchanged and even), and
 * the differences applied as deltas (what a dead process stranded does
 * not change afterwards).  Under the admin lock.  Returns 1 if done, 0 if
 * the snapshot was not quiet (try again at a later scan). */
static int repair(clientpool_fleet_t *f) {
  fl_hdr *h = f->h;
  int32_t hi = hiwater(f), r, k, kind;
  uint64_t *w1;
  uint32_t *q1;
  agg_t want, have;
  int ok = 1;
  int64_t fixed = 0, neg = 0;
  int64_t *kc = NULL;                  /* per key: count[KINDS], demand[KINDS], pledged, refs */
  enum { KF = 2 * KINDS + 2 };
  w1 = malloc(sizeof *w1 * (size_t)(hi ? hi : 1));
  q1 = malloc(sizeof *q1 * (size_t)(hi ? hi : 1));
  kc = calloc((size_t)f->keys_cap * KF, sizeof *kc);
  if (!w1 || !q1 || !kc) { free(w1); free(q1); free(kc); return 0; }
  memset(&want, 0, sizeof want);
  memset(&have, 0, sizeof have);
  for (r = 0; r < hi && ok; r++) {
    w1[r] = LD(f->rows[r].state);
    q1[r] = LD(f->rows[r].opseq);
    if (W_ST(w1[r]) == ST_RECLAIMING || W_ST(w1[r]) == ST_JOINING) ok = 0;
    else if (W_ST(w1[r]) == ST_ALIVE && (q1[r] & 1)) ok = 0;
  }
  if (ok) {
    for (kind = 0; kind < KINDS; kind++) {
      have.total[kind] = LD(h->total[kind].v);
      have.demand[kind] = LD(h->demand[kind]);
      have.demanders[kind] = LD(h->demanders[kind]);
    }
    have.demand_all = LD(h->demand_all);
    have.pledged = LD(h->pledged);
    have.members = LD(h->members);
    for (k = 0; k < f->keys_cap; k++) {
      fl_key *ks = &f->keys[k];
      int64_t *o = &kc[(size_t)k * KF];
      if (LD(ks->state) != 1) continue;
      for (kind = 0; kind < KINDS; kind++) { o[kind] = LD(ks->count[kind]); o[KINDS + kind] = LD(ks->demand[kind]); }
      o[2 * KINDS] = LD(ks->pledged);
      o[2 * KINDS + 1] = LD(ks->refs);
    }
    for (r = 0; r < hi; r++) {
      const fl_row *row = &f->rows[r];
      if (W_ST(w1[r]) == ST_FREE) continue;
      want.members++;
      for (kind = 0; kind < KINDS; kind++) {
        want.total[kind] += LD(row->share[kind]);
        want.demand[kind] += LD(row->demand[kind]);
        want.demand_all += LD(row->demand[kind]);
        if (LD(row->ticket[kind])) want.demanders[kind]++;
      }
      want.pledged += LD(row->pledged);
      for (k = 0; k < f->keys_cap; k++) {
        const fl_cell *c = cell_of(f, r, k);
        int64_t *o = &kc[(size_t)k * KF];
        if (LD(f->keys[k].state) != 1) continue;
        for (kind = 0; kind < KINDS; kind++) {
          if (key_level(kind)) o[kind] -= LD(c->share[kind]);
          o[KINDS + kind] -= LD(c->demand[kind]);
          want.demand_all += LD(c->demand[kind]);
        }
        o[2 * KINDS] -= LD(c->pledged);
        o[2 * KINDS + 1] -= LD(c->ref);
      }
    }
    for (r = 0; r < hi && ok; r++)
      if (LD(f->rows[r].state) != w1[r] || (W_ST(w1[r]) != ST_FREE && LD(f->rows[r].opseq) != q1[r])) ok = 0;
  }
  if (ok) {
    for (kind = 0; kind < KINDS; kind++) {
      int64_t d = have.total[kind] - want.total[kind];
      if (d > 0) fixed += d; else neg -= d;
      if (d) SUB(h->total[kind].v, (int32_t)d);
      d = have.demand[kind] - want.demand[kind];
      if (d) SUB(h->demand[kind], (int32_t)d);
      d = have.demanders[kind] - want.demanders[kind];
      if (d) SUB(h->demanders[kind], (int32_t)d);
    }
    if (have.demand_all != want.demand_all) SUB(h->demand_all, (int32_t)(have.demand_all - want.demand_all));
    if (have.pledged != want.pledged) SUB(h->pledged, (int32_t)(have.pledged - want.pledged));
    if (have.members != want.members) SUB(h->members, (int32_t)(have.members - want.members));
    for (k = 0; k < f->keys_cap; k++) {
      fl_key *ks = &f->keys[k];
      int64_t *o = &kc[(size_t)k * KF];
      if (LD(ks->state) != 1) continue;
      for (kind = 0; kind < KINDS; kind++) {
        if (o[kind]) { if (o[kind] > 0) fixed += o[kind]; else neg -= o[kind]; SUB(ks->count[kind], (int32_t)o[kind]); }
        if (o[KINDS + kind]) SUB(ks->demand[kind], (int32_t)o[KINDS + kind]);
      }
      if (o[2 * KINDS]) SUB(ks->pledged, (int32_t)o[2 * KINDS]);
      if (o[2 * KINDS + 1]) SUB(ks->refs, (int32_t)o[2 * KINDS + 1]);
    }
    ADD(h->repairs, 1);
    ADD(h->repaired_units, (uint64_t)fixed);
    if (neg) ADD(h->repair_negative, (uint64_t)neg);
    ST(h->repair_needed, 0);
    keys_gc(f);
    if (fixed) ADD(h->seq, 1);
  }
  free(w1);
  free(q1);
  free(kc);
  return ok;
}

/* Every member row is dead: reclaim them all under the admin lock and
 * repair (a stale segment left by a stopped process set).  Pauses and the
 * keys they pin survive. */
static void reset_stale(clientpool_fleet_t *f) {
  fl_hdr *h = f->h;
  int32_t r, hi, n = 0;
  if (admin_lock(f, FL_ADMIN_SPINS) != 0) return;
  hi = hiwater(f);
  if (live_rows(f) == 0) {
    for (r = 0; r < hi; r++) {
      uint64_t w = LD(f->rows[r].state);
      if (W_ST(w) != ST_FREE) { reclaim_row(f, r, w); n++; }
    }
    if (n || LD(h->repair_needed) || LD(h->total[LIVE].v) || LD(h->total[IDLE].v) || LD(h->total[LEASE].v) ||
        LD(h->total[FLOOR].v) || LD(h->demand_all)) {
      ST(h->repair_needed, 1);
      if (repair(f)) ADD(h->resets, 1);
    }
  }
  admin_unlock(f);
}

/* Under the admin lock: opens the gates whose deadline passed. */
static void expire_gates(clientpool_fleet_t *f) {
  double now = mono_s();
  int32_t s;
  int changed = 0, left = 0;
  fl_gate *g = &f->h->gate;
  double u = bitsd(LD(g->until));
  ST(f->h->timed, 0);
  if (LD(g->paused) && u >= 0) {
    if (now >= u) { gate_write(g, 0, NULL, 0, -1); changed = 1; } else left = 1;
  }
  for (s = 0; s < f->keys_cap; s++) {
    fl_key *k = &f->keys[s];
    if (LD(k->state) != 1 || !LD(k->gate.paused)) continue;
    u = bitsd(LD(k->gate.until));
    if (u >= 0 && now >= u) {
      gate_write(&k->gate, 0, NULL, 0, -1);
      ST(k->pinned, 0);
      key_maybe_free(f, s);
      changed = 1;
    } else if (u >= 0) {
      left = 1;
    }
  }
  if (left) ST(f->h->timed, 1);
  if (changed) ADD(f->h->gates_gen, 1);
}

int32_t clientpool_fleet_scan(clientpool_fleet_t *f, int32_t full) {
  fl_hdr *h;
  int32_t r, hi, n = 0;
  uint64_t now;
  int locked = 0;
  if (!f || !f->base) return CLIENTPOOL_FLEET_EINVAL;
  h = f->h;
  now = mono_ns();
  if (f->me) {
    uint64_t w = LD(f->me->state);
    if (f->pid != (int32_t)getpid() || W_ST(w) != ST_ALIVE || W_PID(w) != f->pid) {
      f->row = -1;                       /* forked, or the row was taken from us */
      f->me = NULL;
      f->mycells = NULL;
      return CLIENTPOOL_FLEET_ENOTMEMBER;
    }
    STL(f->me->heartbeat, now);
  } else {
    /* a reclaim outside any member's operation must not overlap a repair */
    if (admin_lock(f, FL_ADMIN_SPINS) != 0) return CLIENTPOOL_FLEET_EBUSY;
    locked = 1;
  }
  hi = hiwater(f);
  for (r = 0; r < hi; r++) {
    fl_row *row = &f->rows[r];
    uint64_t w = LD(row->state), hb;
    int st = W_ST(w);
    if (st == ST_FREE || r == f->row) continue;
    if (st == ST_RECLAIMING) {
      if ((W_AUX(w) > 0 && reclaimer_dead(f, w)) || (W_AUX(w) == 0 && locked)) n += reclaim_row(f, r, w);
      continue;
    }
    hb = LD(row->heartbeat);
    if (!full && hb <= now && now - hb < FL_HB_STALE_NS) continue;
    if (row_dead(f, r, w)) n += reclaim_row(f, r, w);
  }
  if (LD(h->repair_needed) || LD(h->gc_needed) || LD(h->timed)) {
    if (!locked && admin_lock(f, 64) == 0) {
      locked = 1;
      /* admin-lock reclaims whose holder died are finished by the lock's next holder */
      for (r = 0; r < hi; r++) {
        uint64_t w = LD(f->rows[r].state);
        if (W_ST(w) == ST_RECLAIMING && W_AUX(w) == 0) reclaim_row(f, r, w);
      }
    }
    if (locked) {
      if (LD(h->repair_needed)) repair(f);
      if (LD(h->gc_needed)) keys_gc(f);
      if (LD(h->timed)) expire_gates(f);
    }
  }
  if (locked) admin_unlock(f);
  return n;
}

/* ---- pause ------------------------------------------------------------- */

int clientpool_fleet_pause(clientpool_fleet_t *f, const char *key, size_t keylen,
                           const char *reason, size_t len, double until) {
  fl_gate *g;
  int32_t s = -1;
  int rc;
  if (!f || !f->base || (!reason && len) || (key == NULL && keylen) || keylen > CLIENTPOOL_FLEET_KEY_MAX)
    return CLIENTPOOL_FLEET_EINVAL;
  if (until != until) return CLIENTPOOL_FLEET_EINVAL;
  rc = admin_lock(f, FL_ADMIN_SPINS);
  if (rc) return rc;
  if (key) {
    s = key_get(f, key, keylen, hash_bytes((const unsigned char *)key, keylen));
    if (s < 0) { admin_unlock(f); return s; }
    ST(f->keys[s].pinned, 1);
    g = &f->keys[s].gate;
  } else {
    g = &f->h->gate;
  }
  gate_write(g, 1, reason, len, until);
  if (until >= 0) ST(f->h->timed, 1);
  ADD(f->h->gates_gen, 1);
  admin_unlock(f);
  return 0;
}

int clientpool_fleet_resume(clientpool_fleet_t *f, const char *key, size_t keylen) {
  int rc;
  if (!f || !f->base || (key == NULL && keylen) || keylen > CLIENTPOOL_FLEET_KEY_MAX) return CLIENTPOOL_FLEET_EINVAL;
  rc = admin_lock(f, FL_ADMIN_SPINS);
  if (rc) return rc;
  if (key) {
    int32_t s = index_find(f, hash_bytes((const unsigned char *)key, keylen), key, keylen);
    if (s >= 0) {
      gate_write(&f->keys[s].gate, 0, NULL, 0, -1);
      ST(f->keys[s].pinned, 0);
      key_maybe_free(f, s);
    }
  } else {
    gate_write(&f->h->gate, 0, NULL, 0, -1);
  }
  ADD(f->h->gates_gen, 1);
  admin_unlock(f);
  return 0;
}

int clientpool_fleet_gate(clientpool_fleet_t *f, int32_t slot, char *reason, size_t n, double *until) {
  if (!f || !f->base || slot >= f->keys_cap) return CLIENTPOOL_FLEET_EINVAL;
  if (slot >= 0 && LD(f->keys[slot].state) != 1) {
    if (reason && n) reason[0] = 0;
    if (until) *until = -1;
    return 0;
  }
  return gate_read(slot < 0 ? &f->h->gate : &f->keys[slot].gate, reason, n, until);
}

uint64_t clientpool_fleet_gates_gen(const clientpool_fleet_t *f) { return LD(f->h->gates_gen); }

/* ---- validity ----------------------------------------------------------
 * The reverse of a gate's `until`: closed past the deadline unless it is
 * moved.  A Redis fleet's agent writes its lease's validity here at every
 * renewal, so that every member's engine stops granting once the lease may
 * have lapsed, even when the agent's process is stopped and cannot lower
 * the cap.  One word: the deadline needs no reason, and a reader must
 * never see a torn one. */

int clientpool_fleet_set_valid(clientpool_fleet_t *f, double until) {
  uint64_t v, was;
  if (!f || !f->base || until != until) return CLIENTPOOL_FLEET_EINVAL;
  if (until < 0) v = 0;
  else if (until >= 1.8e10) v = UINT64_MAX;         /* (about 570 years: never) */
  else { v = (uint64_t)(until * 1e9); if (v == 0) v = 1; }
  was = XCHG(f->h->valid_ns, v);
  /* reopened: members look again at their next acquisition or tick (they
   * compare gates_gen), so waiters held at the closed gate are served */
  if (was != 0 && mono_ns() >= was && (v == 0 || mono_ns() < v)) ADD(f->h->gates_gen, 1);
  return 0;
}

int32_t clientpool_fleet_lapsed(const clientpool_fleet_t *f) {
  uint64_t v = LD(f->h->valid_ns);
  return v != 0 && mono_ns() >= v;
}

double clientpool_fleet_valid_until(const clientpool_fleet_t *f) {
  uint64_t v = LD(f->h->valid_ns);
  return v == 0 ? -1.0 : (double)v * 1e-9;
}

/* ---- figures ----------------------------------------------------------- */

int clientpool_fleet_limits(const clientpool_fleet_t *f, clientpool_fleet_limits_t *o) {
  const fl_hdr *h;
  if (!f || !f->base || !o) return CLIENTPOOL_FLEET_EINVAL;
  h = f->h;
  o->max_live = LD(h->lim[L_MAX_LIVE]);
  o->max_idle = LD(h->lim[L_MAX_IDLE]);
  o->min_idle = LD(h->lim[L_MIN_IDLE]);
  o->max_concurrency = LD(h->lim[L_MAX_CONC]);
  o->key_max_live = LD(h->lim[L_KEY_MAX_LIVE]);
  o->key_max_idle = LD(h->lim[L_KEY_MAX_IDLE]);
  o->max_keys = LD(h->lim[L_MAX_KEYS]);
  o->members = LD(h->lim[L_MEMBERS]);
  o->attempts = LD(h->lim[L_ATTEMPTS]);
  return 0;
}

/* The checks of an update (no lock taken): 0 or an error, in err. */
static int update_ok(const clientpool_fleet_t *f, const clientpool_fleet_limits_t *lim, char *err, size_t errlen) {
  char why[160];
  if (!limits_ok(lim, why, sizeof why)) {
    msg(err, errlen, "%s", why);
    return CLIENTPOOL_FLEET_EINVAL;
  }
  if (lim->members > f->nrows || lim->max_keys > f->keys_cap) {
    msg(err, errlen, "fleet was created with members = %d, max_keys = %d; members = %d, max_keys = %d "
        "need a new segment (fleet.remove it while no process uses it)",
        (int)f->nrows, (int)f->keys_cap, (int)lim->members, (int)lim->max_keys);
    return CLIENTPOOL_FLEET_EGEOMETRY;
  }
  return 0;
}

int clientpool_fleet_update(clientpool_fleet_t *f, const clientpool_fleet_limits_t *lim, char *err, size_t errlen) {
  int rc;
  if (err && errlen) err[0] = 0;
  if (!f || !f->base || !lim) return CLIENTPOOL_FLEET_EINVAL;
  rc = update_ok(f, lim, err, errlen);
  if (rc) return rc;
  if (admin_lock(f, FL_ADMIN_SPINS * 4) != 0) {
    msg(err, errlen, "the fleet's admin lock is held by a live process: limits not updated");
    return CLIENTPOOL_FLEET_EBUSY;
  }
  limits_store(f->h, lim);
  admin_unlock(f);
  ADD(f->h->seq, 1);                   /* a raised cap is room: waiters look again */
  return 0;
}

/* ---- the agent's place ------------------------------------------------
 * A Redis fleet's machine has one agent.  A dead holder stops beating; so
 * does a stopped one (SIGSTOP, a paused VM), which is still alive and may
 * resume in the middle of anything.  So the place is taken by epoch, not
 * by liveness: a claim bumps the epoch, and every write the agent makes to
 * the segment checks its epoch under the admin lock that claims also take,
 * so a resumed holder's write either lands before the claim (it was the
 * agent then) or not at all. */

#define AG_WORD(e, pid) (((uint64_t)(e) << 32) | (uint32_t)(pid))
#define AG_EPOCH(w) ((uint32_t)((w) >> 32))
#define AG_PID(w) ((int32_t)(uint32_t)((w) & 0xffffffffu))

uint32_t clientpool_fleet_agent(const clientpool_fleet_t *f, int32_t *pid, double *age) {
  uint64_t w = LD(f->h->agent), b = LD(f->h->agent_beat), now = mono_ns();
  if (pid) *pid = AG_PID(w);
  if (age) *age = AG_PID(w) == 0 ? -1.0 : (now > b ? (double)(now - b) * 1e-9 : 0.0);
  return AG_EPOCH(w);
}

uint32_t clientpool_fleet_agent_claim(clientpool_fleet_t *f, uint32_t epoch, double stale) {
  uint64_t w, now;
  double age;
  uint32_t e = 0;
  if (!f || !f->base || !(stale >= 0)) return 0;
  if (admin_lock(f, FL_ADMIN_SPINS) != 0) return 0;
  w = LD(f->h->agent);
  now = mono_ns();
  age = (double)(now - LD(f->h->agent_beat)) * 1e-9;
  /* vacant, silent for `stale`, or silent as a dead member row is and dead */
  if (AG_EPOCH(w) == epoch && epoch != UINT32_MAX &&
      (AG_PID(w) == 0 || age >= stale ||
       (age * 1e9 >= (double)FL_HB_STALE_NS && !proc_alive(AG_PID(w), 0)))) {
    e = epoch + 1;
    ST(f->h->agent_beat, now);
    ST(f->h->agent, AG_WORD(e, getpid()));
  }
  admin_unlock(f);
  return e;
}

int clientpool_fleet_agent_beat(clientpool_fleet_t *f, uint32_t epoch) {
  if (!f || !f->base) return CLIENTPOOL_FLEET_EINVAL;
  if (LD(f->h->agent) != AG_WORD(epoch, getpid())) return CLIENTPOOL_FLEET_ESTALE;
  /* (a beat that lands just after a claim only refreshes the new holder's) */
  ST(f->h->agent_beat, mono_ns());
  return 0;
}

int clientpool_fleet_agent_update(clientpool_fleet_t *f, uint32_t epoch, const clientpool_fleet_limits_t *lim,
                                  double until, char *err, size_t errlen) {
  int rc;
  if (err && errlen) err[0] = 0;
  if (!f || !f->base) return CLIENTPOOL_FLEET_EINVAL;
  if (lim && (rc = update_ok(f, lim, err, errlen)) != 0) return rc;
  if (admin_lock(f, FL_ADMIN_SPINS * 4) != 0) {
    msg(err, errlen, "the fleet's admin lock is held by a live process: not updated");
    return CLIENTPOOL_FLEET_EBUSY;
  }
  if (LD(f->h->agent) != AG_WORD(epoch, getpid())) {
    admin_unlock(f);
    msg(err, errlen, "%s", clientpool_fleet_strerror(CLIENTPOOL_FLEET_ESTALE));
    return CLIENTPOOL_FLEET_ESTALE;
  }
  if (lim) limits_store(f->h, lim);
  if (until == until) clientpool_fleet_set_valid(f, until);
  ST(f->h->agent_beat, mono_ns());
  admin_unlock(f);
  if (lim) ADD(f->h->seq, 1);
  return 0;
}

int clientpool_fleet_agent_release(clientpool_fleet_t *f, uint32_t epoch) {
  uint64_t w;
  if (!f || !f->base) return CLIENTPOOL_FLEET_EINVAL;
  w = AG_WORD(epoch, getpid());
  return atomic_compare_exchange_strong(&f->h->agent, &w, AG_WORD(epoch, 0)) ? 0 : CLIENTPOOL_FLEET_ESTALE;
}

int32_t clientpool_fleet_count(const clientpool_fleet_t *f, int32_t kind, int32_t key) {
  if (!f || !f->base || (uint32_t)kind >= KINDS || key >= f->keys_cap) return CLIENTPOOL_FLEET_EINVAL;
  if (key < 0) return LD(f->h->total[kind].v);
  if (kind == LEASE || LD(f->keys[key].state) != 1) return kind == LEASE ? CLIENTPOOL_FLEET_EINVAL : 0;
  return LD(f->keys[key].count[kind]);
}

int clientpool_fleet_stats(const clientpool_fleet_t *f, clientpool_fleet_stats_t *s) {
  const fl_hdr *h;
  if (!f || !f->base || !s) return CLIENTPOOL_FLEET_EINVAL;
  h = f->h;
  memset(s, 0, sizeof *s);
  clientpool_fleet_limits(f, &s->limits);
  s->live = LD(h->total[LIVE].v);
  s->idle = LD(h->total[IDLE].v);
  s->leases = LD(h->total[LEASE].v);
  s->refilling = LD(h->total[FLOOR].v);
  s->demand_live = LD(h->demand[LIVE]);
  s->demand_lease = LD(h->demand[LEASE]);
  s->waiting_members = LD(h->demanders[LIVE]) > LD(h->demanders[LEASE]) ? LD(h->demanders[LIVE]) : LD(h->demanders[LEASE]);
  s->pledged = LD(h->pledged);
  s->members = LD(h->members);
  s->keys = LD(h->nkeys);
  s->rows = f->nrows;
  s->keys_cap = f->keys_cap;
  s->paused = gate_read(&h->gate, NULL, 0, NULL);
  s->repair_pending = LD(h->repair_needed) ? 1 : 0;
  s->seq = LD(h->seq);
  s->gates_gen = LD(h->gates_gen);
  s->limits_gen = LD(h->lim_gen);
  s->reclaimed = (double)LD(h->reclaimed);
  s->repairs = (double)LD(h->repairs);
  s->repaired_units = (double)LD(h->repaired_units);
  s->resets = (double)LD(h->resets);
  s->joins = (double)LD(h->joins);
  s->created = bitsd(h->created);
  return 0;
}

int clientpool_fleet_key_stats(clientpool_fleet_t *f, int32_t slot, clientpool_fleet_key_stats_t *s,
                               char *name, size_t n) {
  fl_key *k;
  int32_t r, hi;
  int rc;
  if (!f || !f->base || !s || slot < 0 || slot >= f->keys_cap) return CLIENTPOOL_FLEET_EINVAL;
  memset(s, 0, sizeof *s);
  k = &f->keys[slot];
  if (LD(k->state) != 1) return 0;
  rc = admin_lock(f, FL_ADMIN_SPINS);    /* the identity is read under the lock */
  if (rc) return rc;
  if (LD(k->state) != 1) { admin_unlock(f); return 0; }
  s->len = (int32_t)(k->len > CLIENTPOOL_FLEET_KEY_MAX ? CLIENTPOOL_FLEET_KEY_MAX : k->len);
  if (name) memcpy(name, k->bytes, (size_t)s->len < n ? (size_t)s->len : n);
  admin_unlock(f);
  s->live = LD(k->count[LIVE]);
  s->idle = LD(k->count[IDLE]);
  s->refilling = LD(k->count[FLOOR]);
  s->demand_live = LD(k->demand[LIVE]);
  s->refs = LD(k->refs);
  s->paused = gate_read(&k->gate, NULL, 0, NULL);
  hi = hiwater(f);
  {
    int64_t sum = 0;
    for (r = 0; r < hi; r++) sum += LD(cell_of(f, r, slot)->share[LEASE]);
    s->leases = (int32_t)(sum > INT32_MAX ? INT32_MAX : sum < INT32_MIN ? INT32_MIN : sum);
  }
  return 1;
}

int clientpool_fleet_member_stats(clientpool_fleet_t *f, int32_t r, clientpool_fleet_member_stats_t *s) {
  fl_row *row;
  uint64_t w, hb, now;
  if (!f || !f->base || !s || r < 0 || r >= f->nrows) return CLIENTPOOL_FLEET_EINVAL;
  memset(s, 0, sizeof *s);
  row = &f->rows[r];
  w = LD(row->state);
  if (W_ST(w) == ST_FREE) return 0;
  s->state = W_ST(w);
  s->pid = W_PID(w);
  s->self = r == f->row;
  s->alive = s->self || (s->state != ST_RECLAIMING && proc_alive(s->pid, LD(row->start)));
  s->live = LD(row->share[LIVE]);
  s->idle = LD(row->share[IDLE]);
  s->leases = LD(row->share[LEASE]);
  s->refilling = LD(row->share[FLOOR]);
  s->demand_live = LD(row->demand[LIVE]);
  s->demand_lease = LD(row->demand[LEASE]);
  s->pledged = LD(row->pledged);
  s->keys = LD(row->nrefs);
  s->start = (double)LD(row->start);
  hb = LD(row->heartbeat);
  now = mono_ns();
  s->heartbeat_age = now > hb ? (double)(now - hb) * 1e-9 : 0;
  return 1;
}

const char *clientpool_fleet_strerror(int code) {
  switch (code) {
  case CLIENTPOOL_FLEET_TAKEN: return "ok";
  case CLIENTPOOL_FLEET_REFUSED: return "refused: the fleet's cap is reached";
  case CLIENTPOOL_FLEET_REFUSED_KEY: return "refused: the key's cap is reached";
  case CLIENTPOOL_FLEET_REFUSED_TURN: return "refused: other members wait and it is their turn";
  case CLIENTPOOL_FLEET_EINVAL: return "invalid argument";
  case CLIENTPOOL_FLEET_ENOMEM: return "out of memory";
  case CLIENTPOOL_FLEET_ENOENT: return "no such fleet or key";
  case CLIENTPOOL_FLEET_EACCES: return "foreign segment (owner, mode or pid namespace)";
  case CLIENTPOOL_FLEET_ECORRUPT: return "corrupt segment";
  case CLIENTPOOL_FLEET_EVERSION: return "segment of another layout version";
  case CLIENTPOOL_FLEET_EGEOMETRY: return "members or max_keys above the segment's size";
  case CLIENTPOOL_FLEET_ENAME: return "segment holds another fleet";
  case CLIENTPOOL_FLEET_EMEMBERS: return "every member row is taken";
  case CLIENTPOOL_FLEET_EKEYS: return "max_keys keys are in use";
  case CLIENTPOOL_FLEET_EBUSY: return "the admin lock is held: try later";
  case CLIENTPOOL_FLEET_ENOTMEMBER: return "not a member";
  case CLIENTPOOL_FLEET_ESYS: return "system call failed";
  case CLIENTPOOL_FLEET_ENOTHELD: return "not held";
  case CLIENTPOOL_FLEET_ETIMEDOUT: return "segment still being initialized";
  case CLIENTPOOL_FLEET_ESTALE: return "another process took the agent's place";
  default: return "unknown error";
  }
}
