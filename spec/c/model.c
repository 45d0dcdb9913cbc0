/*
 * model.c - the reference model of the engine (see model.h).
 *
 * Read it next to docs/api.md and docs/decisions.md.  Each public
 * function follows the same steps as its clientpool.h counterpart; the
 * comments quote the rule being applied.  Clarity over speed: every count is
 * a scan, every "first" or "earliest" is a scan for the smallest sequence
 * number.
 */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>

#define NONE (-1)

static int has(double d) { return d >= 0; }

/* ---- events ----------------------------------------------------------- */

static void push(model_t *m, int type, int a, int b, int c, double t) {
  clientpool_event_t *e;
  if (m->evlen == M_MAXEV) { m->overflow = 1; return; }
  e = &m->ev[(m->evhead + m->evlen) % M_MAXEV];
  e->type = type; e->a = a; e->b = b; e->c = c; e->t = t;
  m->evlen++;
}

int model_next_event(model_t *m, clientpool_event_t *ev) {
  if (m->evlen == 0) { memset(ev, 0, sizeof *ev); return CLIENTPOOL_EV_NONE; }
  *ev = m->ev[m->evhead];
  m->evhead = (m->evhead + 1) % M_MAXEV;
  m->evlen--;
  return ev->type;
}

/* ---- counters: every counter of the pool is also counted on the key ---- */

#define COUNT(m, k, field, d) do { (m)->st.field += (d); (m)->keys[k].st.field += (d); } while (0)

/* ---- scans: the gauges ------------------------------------------------ */

static int key_ok(const model_t *m, int k) { return k >= 0 && k < M_MAXKEY && m->keys[k].used; }

/* k < 0: the whole pool */
static int n_records(const model_t *m, int k, int state) {
  int r, n = 0;
  for (r = 0; r < M_MAXREC; r++)
    if (m->rec[r].state == state && (k < 0 || m->rec[r].key == k)) n++;
  return n;
}
static int n_live(const model_t *m, int k) {
  return n_records(m, k, MR_IDLE) + n_records(m, k, MR_LEASED) + n_records(m, k, MR_CHECKING);
}
/* idle: those out for a keepalive too ("still counts as idle") */
static int n_idle(const model_t *m, int k) { return n_records(m, k, MR_IDLE) + n_records(m, k, MR_CHECKING); }
static int n_creating(const model_t *m, int k) { return n_records(m, k, MR_CREATING); }
static int n_closing(const model_t *m, int k) { return n_records(m, k, MR_CLOSING); }
/* "A record counts against max_live (and its key's cap) from its
 * reservation until its destroy hook has returned or failed" */
static int n_held(const model_t *m, int k) { return n_live(m, k) + n_creating(m, k) + n_closing(m, k); }
static int n_leases(const model_t *m, int k) {
  int l, n = 0;
  for (l = 0; l < M_MAXLEASE; l++)
    if (m->lea[l].alive && (k < 0 || m->rec[m->lea[l].record].key == k)) n++;
  return n;
}
static int n_waiting(const model_t *m, int k) {
  int w, n = 0;
  for (w = 0; w < M_MAXWAIT; w++)
    if (m->wai[w].state == MW_QUEUED && (k < 0 || m->wai[w].key == k)) n++;
  return n;
}
/* waiter slots naming k, queued or resolved but not yet claimed */
static int n_waiter_slots(const model_t *m, int k) {
  int w, n = 0;
  for (w = 0; w < M_MAXWAIT; w++) if (m->wai[w].state != MW_FREE && m->wai[w].key == k) n++;
  return n;
}

int model_checking(const model_t *m, int k) { return n_records(m, k, MR_CHECKING); }

int model_stats(const model_t *m, int k, clientpool_stats_t *s) {
  if (k >= 0 && !key_ok(m, k)) return CLIENTPOOL_EINVAL;
  *s = k < 0 ? m->st : m->keys[k].st;
  s->live = n_live(m, k);
  s->idle = n_idle(m, k);
  s->active = n_records(m, k, MR_LEASED);
  s->leases = n_leases(m, k);
  s->creating = n_creating(m, k);
  s->waiting = n_waiting(m, k);
  s->closing = n_closing(m, k);
  return 0;
}

/* ---- time ------------------------------------------------------------- */

/* "The engine clamps time so it never runs backwards: a now earlier than the
 * latest one seen (or negative, or NaN) means the latest time seen." */
static double clamp(model_t *m, double now) {
  if (!(now >= m->now)) now = m->now;
  m->now = now;
  return now;
}

/* lifetime_jitter: the per-pool xorshift64* stream seeded from `seed`
 * (decisions.md), one draw per created record. */
static double rnd(model_t *m) {
  uint64_t x = m->rng;
  x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
  m->rng = x;
  return (double)((x * 2685821657736338717ULL) >> 11) / 9007199254740992.0;
}

/* ---- keys ------------------------------------------------------------- */

/* "A key is forgotten once it holds no record, lease or waiter, unless it is
 * pinned"; a waiter slot counts until claimed; the key an acquire works on
 * is held until the call ends. */
static int key_maybe_free(model_t *m, int k) {
  m_key_t *key = &m->keys[k];
  if (!key->used || key->pinned || k == m->hold_key || k == m->kept || key->bstate != MB_NONE ||
      ((key->cap_live >= 0 || key->cap_idle >= 0) && !m->closed)) return 0;
  if (n_held(m, k) || n_leases(m, k) || n_waiter_slots(m, k)) return 0;
  key->used = 0;
  key->gen++;
  push(m, CLIENTPOOL_EV_KEY_FREE, k, 0, 0, 0);
  return 1;
}

int model_key_open(model_t *m) {
  int k, used = 0;
  if (m->closed) return CLIENTPOOL_ECLOSED;
  for (k = 0; k < M_MAXKEY; k++) used += m->keys[k].used;
  if (m->cfg.max_keys >= 0 && used >= m->cfg.max_keys) return CLIENTPOOL_EKEYS;
  for (k = 0; k < M_MAXKEY; k++)
    if (!m->keys[k].used) {
      m_key_t *key = &m->keys[k];
      unsigned gen = key->gen;
      memset(key, 0, sizeof *key);
      key->gen = gen;
      key->used = 1;
      key->retire_before = -1;
      key->cap_live = key->cap_idle = NONE;
      return k;
    }
  m->overflow = 1;
  return CLIENTPOOL_ENOMEM;
}

int model_key_pin(model_t *m, int k, int pinned) {
  if (!key_ok(m, k)) return CLIENTPOOL_EINVAL;
  if (pinned < 0 || pinned > 2) pinned = 1;
  if (m->keys[k].pinned == pinned) return 0;
  m->keys[k].pinned = pinned;
  if (pinned == 2) m->refill_signalled = 0;
  else if (!pinned) key_maybe_free(m, k);
  return 0;
}

/* The caller of a regrant that kept its place (model_regrant) is back, or
 * gave up: the place is used up whatever this call answers. */
static int take_kept(model_t *m, int k) {
  int kept = m->kept == k;
  m->kept = NONE;
  return kept;
}

static void finish(model_t *m, double now);
static void ka_pump(model_t *m, double now);

int model_key_forget(model_t *m, int k) {
  if (!key_ok(m, k)) return 0;
  if (m->kept != NONE) {
    int freed;
    take_kept(m, k);
    freed = key_maybe_free(m, k);
    finish(m, m->now);                 /* what was held for it is served */
    return freed;
  }
  return key_maybe_free(m, k);
}

/* ---- gates ------------------------------------------------------------ */

static int gate_blocked(const m_gate_t *g) { return g->paused || g->probe == MP_OUT; }

static int admits(const model_t *m, int k) {
  return !gate_blocked(&m->gate) && !gate_blocked(&m->keys[k].gate);
}

/* "after resuming, one acquisition is admitted alone": the first grant made
 * through a half-open gate is its probe. */
static void gate_take(m_gate_t *g, int lease, unsigned gen) {
  if (g->probe != MP_READY) return;
  g->probe = MP_OUT;
  g->probe_lease = lease;
  g->probe_gen = gen;
}
static void gate_granted(model_t *m, const m_grant_t *g) {
  gate_take(&m->gate, g->lease, g->lease_gen);
  gate_take(&m->keys[g->key].gate, g->lease, g->lease_gen);
}
/* "a probe lease released without a report lets the next one probe" */
static void gate_lease_ended(model_t *m, int k, int l) {
  m_gate_t *gs[2];
  int i;
  gs[0] = &m->gate; gs[1] = &m->keys[k].gate;
  for (i = 0; i < 2; i++)
    if (gs[i]->probe == MP_OUT && gs[i]->probe_lease == l && gs[i]->probe_gen == m->lea[l].gen)
      gs[i]->probe = MP_READY;
}

/* ---- records and leases ----------------------------------------------- */

int model_open(const model_t *m, int r) {
  const m_record_t *x = &m->rec[r];
  return x->state == MR_LEASED && x->nleases < m->cfg.capacity && !x->doomed && !x->retire;
}

static int rec_alloc(model_t *m) {
  int r;
  for (r = 0; r < M_MAXREC; r++) if (m->rec[r].state == MR_FREE) return r;
  m->overflow = 1;
  return NONE;
}

static int lease_alloc(model_t *m, int r, double now) {
  int l;
  for (l = 0; l < M_MAXLEASE; l++)
    if (!m->lea[l].alive) {
      m_lease_t *x = &m->lea[l];
      x->alive = 1;
      x->record = r;
      x->since = now;
      x->leak_armed = has(m->cfg.leak_threshold);
      m->rec[r].nleases++;
      return l;
    }
  m->overflow = 1;
  return NONE;
}

static void lease_free(model_t *m, int l) {
  m->rec[m->lea[l].record].nleases--;
  m->lea[l].alive = 0;
  m->lea[l].gen++;
}

static const m_lease_t *lease_get(const model_t *m, int l, unsigned gen) {
  if (l < 0 || l >= M_MAXLEASE || !m->lea[l].alive || m->lea[l].gen != gen) return NULL;
  return &m->lea[l];
}

/* The per-key LIFO: the key's idle record that went idle last. */
static int idle_top(const model_t *m, int k) {
  int r, best = NONE;
  for (r = 0; r < M_MAXREC; r++)
    if (m->rec[r].state == MR_IDLE && m->rec[r].key == k &&
        (best == NONE || m->rec[r].stack_seq > m->rec[best].stack_seq)) best = r;
  return best;
}

/* The pool-wide idle order: the least recently used idle record (by its
 * idle-expiry clock, which the warm floor renews). */
static int idle_oldest(const model_t *m) {
  int r, best = NONE;
  for (r = 0; r < M_MAXREC; r++)
    if (m->rec[r].state == MR_IDLE && (best == NONE || m->rec[r].gl_seq < m->rec[best].gl_seq)) best = r;
  return best;
}

static void idle_push(model_t *m, int r, double now) {
  m_record_t *x = &m->rec[r];
  x->state = MR_IDLE;
  x->idle_since = x->gl_since = now;
  x->stack_seq = x->gl_seq = ++m->idle_seq;
  x->ka_armed = has(m->cfg.keepalive);   /* "idle for keepalive seconds since it went idle" */
  x->kdeadline = now + m->cfg.keepalive;
}

/* The pool-wide idle order for idle_timeout: idle records and those out for
 * a keepalive that have not yet passed it. */
static int gl_oldest(const model_t *m) {
  int r, best = NONE;
  for (r = 0; r < M_MAXREC; r++)
    if ((m->rec[r].state == MR_IDLE || (m->rec[r].state == MR_CHECKING && !m->rec[r].idle_over)) &&
        (best == NONE || m->rec[r].gl_seq < m->rec[best].gl_seq)) best = r;
  return best;
}

/* ---- warm floor ------------------------------------------------------- */

/* "a warm key needs min_idle idle records less its idle records and
 * refills in flight, but no more than max_idle has room for (idle records
 * of every key and every refill in flight count), nor its key's max_idle";
 * floor_held is set when max_idle has no room for a key that is short. */
static int key_cap_idle(const model_t *m, int k);

static int floor_deficit(model_t *m, int k) {
  int d = m->cfg.min_idle - n_idle(m, k) - m->keys[k].refilling, room = m->cfg.max_idle - n_idle(m, -1), j;
  int kroom = key_cap_idle(m, k) - n_idle(m, k) - m->keys[k].refilling;
  for (j = 0; j < M_MAXKEY; j++) if (m->keys[j].used) room -= m->keys[j].refilling;
  if (key_cap_idle(m, k) >= 0 && kroom < d) d = kroom;
  if (d > 0 && room <= 0) m->floor_held = 1;
  return room < d ? room : d;
}

/* "the engine signals EV_REFILL when a pinned key holds fewer than min_idle
 * idle records (counting refills in flight, within max_idle)", once until
 * the driver asks; while max_idle had no room for a warm key, any key's
 * check looks at every warm key. */
static void floor_check(model_t *m, int k) {
  int j, found = 0;
  if (!m->floor_on || m->refill_signalled || m->closed) return;
  if (m->keys[k].pinned != 2 || floor_deficit(m, k) <= 0) {
    if (!m->floor_held) return;
    m->floor_held = 0;
    for (j = 0; j < M_MAXKEY; j++)
      if (m->keys[j].used && m->keys[j].pinned == 2 && floor_deficit(m, j) > 0) found = 1;
    if (!found) return;
  }
  m->floor_held = 0;                   /* "a key short with room: nothing is held" */
  m->refill_signalled = 1;
  push(m, CLIENTPOOL_EV_REFILL, k, 0, 0, 0);
}

/* "idle_timeout spares the idle records the floor needs" */
static int floor_keeps(const model_t *m, const m_record_t *x) {
  return m->floor_on && m->keys[x->key].pinned == 2 && n_idle(m, x->key) <= m->cfg.min_idle;
}

/* ---- destroy and expiry ----------------------------------------------- */

/* The destroy starts: the record is closing, and still counts against the
 * caps until the driver reports it done (model_destroyed). */
static void destroy(model_t *m, int r, int reason) {
  m_record_t *x = &m->rec[r];
  int k = x->key;
  COUNT(m, k, closed, 1);
  COUNT(m, k, closed_by[reason], 1);
  push(m, CLIENTPOOL_EV_DESTROY, r, reason, k, 0);
  x->state = MR_CLOSING;
  x->retire = x->doomed = 0;
  x->lifetime_armed = 0;
  floor_check(m, k);
}

/* retire_before: "every record created before `before` (before < 0: every
 * record created so far, by creation order)" */
static int retired_by_age(const model_t *m, const m_record_t *x) {
  return x->created < m->retire_before || x->created < m->keys[x->key].retire_before ||
         x->cseq <= m->retire_seq || x->cseq <= m->keys[x->key].retire_seq;
}

/* Why an idle record may not be handed out (retired, past max_lifetime, idle
 * past idle_timeout), in that order of precedence; 0 if it may. */
/* past max_lifetime: found so by tick, or its deadline has come */
static int life_over(const m_record_t *x, double now) {
  return x->lifetime_over || (x->lifetime_armed && now >= x->expires);
}

static int idle_expired(const model_t *m, const m_record_t *x, double now, int *why) {
  if (x->retire || retired_by_age(m, x)) { *why = CLIENTPOOL_BY_RETIRED; return 1; }
  if (life_over(x, now)) { *why = CLIENTPOOL_BY_LIFETIME; return 1; }
  if (has(m->cfg.idle_timeout) && now - x->gl_since >= m->cfg.idle_timeout && !floor_keeps(m, x)) {
    *why = CLIENTPOOL_BY_IDLE; return 1;
  }
  return 0;
}

/* ---- grants ----------------------------------------------------------- */

/* "take an eligible record of that key (LIFO: the most recently released idle
 * one), skipping and retiring records past idle_timeout or max_lifetime" */
static int take_idle(model_t *m, int k, double now, m_grant_t *g) {
  for (;;) {
    int r = idle_top(m, k), why, l;
    m_record_t *x;
    if (r == NONE) return 0;
    x = &m->rec[r];
    if (idle_expired(m, x, now, &why)) { destroy(m, r, why); continue; }
    l = lease_alloc(m, r, now);
    if (l == NONE) return 0;
    x->state = MR_LEASED;
    COUNT(m, k, reused, 1);
    g->status = CLIENTPOOL_GRANT_IDLE;
    g->record = r;
    g->lease = l;
    g->lease_gen = m->lea[l].gen;
    g->key = k;
    g->idle = now - x->idle_since;
    g->validate = !has(m->cfg.validate_after_idle) || g->idle >= m->cfg.validate_after_idle;
    g->shared = 0;
    floor_check(m, k);
    return 1;
  }
}

/* "with capacity > 1 the open record with the fewest leases" (no validate),
 * skipping and retiring records past max_lifetime or retired.  The engine
 * keeps open records in a heap and retires an expired one only when it finds
 * it on top: those the oracle says it met are retired here too. */
static int take_open(model_t *m, int k, double now, m_grant_t *g, int who) {
  for (;;) {
    int r, l, min = -1, n = 0, nfresh = 0, changed = 0;
    int fresh[M_MAXREC];
    m_record_t *x;
    for (r = 0; r < M_MAXREC; r++)
      if (m->rec[r].key == k && model_open(m, r) && (min < 0 || m->rec[r].nleases < min))
        min = m->rec[r].nleases;
    if (min < 0) return 0;
    for (r = 0; r < M_MAXREC; r++) {
      if (m->rec[r].key != k || !model_open(m, r) || m->rec[r].nleases != min) continue;
      x = &m->rec[r];
      n++;
      if (life_over(x, now) || retired_by_age(m, x)) {
        if (m->oracle(m->octx, M_ORACLE_RETIRED, r, NULL, 0)) { x->retire = 1; changed = 1; }
      } else {
        fresh[nfresh++] = r;
      }
    }
    if (changed) continue;
    if (nfresh == 0) {
      /* every candidate is stale: the engine meets them all */
      for (r = 0; r < M_MAXREC; r++)
        if (m->rec[r].key == k && model_open(m, r) && m->rec[r].nleases == min) m->rec[r].retire = 1;
      continue;
    }
    r = nfresh == 1 ? fresh[0] : m->oracle(m->octx, M_ORACLE_SHARE, who, fresh, nfresh);
    l = lease_alloc(m, r, now);
    if (l == NONE) return 0;
    COUNT(m, k, reused, 1);
    g->status = CLIENTPOOL_GRANT_IDLE;
    g->record = r;
    g->lease = l;
    g->lease_gen = m->lea[l].gen;
    g->key = k;
    g->idle = 0;
    g->validate = 0;
    g->shared = 1;
    return 1;
  }
}

static int room(const model_t *m) {
  return n_held(m, -1) < m->cfg.max_live;
}

/* clientpool.h, create backoff: "in which the key creates nothing ...
 * After the window only one create of the key is in flight at a time" */
static int backoff_allows(const model_t *m, int k) {
  const m_key_t *key = &m->keys[k];
  return key->bstate == MB_NONE || (key->bstate == MB_PROBE && n_creating(m, k) == 0);
}

/* "A key's caps: its own (clientpool_key_caps), else the pool's per-key ones" */
static int key_cap_live(const model_t *m, int k) {
  return m->keys[k].cap_live >= 0 ? m->keys[k].cap_live : m->cfg.key_max_live;
}
static int key_cap_idle(const model_t *m, int k) {
  return m->keys[k].cap_idle >= 0 ? m->keys[k].cap_idle : m->cfg.key_max_idle;
}

static int under_key_cap(const model_t *m, int k) {
  if (!backoff_allows(m, k)) return 0;
  return key_cap_live(m, k) < 0 || n_held(m, k) < key_cap_live(m, k);
}

/* "destroyed at release while [the pool or key holds] more than the cap
 * (open or being created)" */
static int over_cap(const model_t *m, int k) {
  return n_live(m, -1) + n_creating(m, -1) > m->cfg.max_live ||
         (key_cap_live(m, k) >= 0 && n_live(m, k) + n_creating(m, k) > key_cap_live(m, k));
}

/* decisions.md: at max_live an idle record of another key may be evicted
 * to make room, unless a destroy is under way (its room comes first). */
static int evict_ok(const model_t *m) {
  return n_records(m, -1, MR_IDLE) > 0 && n_closing(m, -1) == 0;   /* (not one out for a keepalive) */
}

static void rec_init(model_t *m, int r, int k, double now) {
  m_record_t *x = &m->rec[r];
  unsigned gen = x->gen;
  memset(x, 0, sizeof *x);
  x->gen = gen;
  x->state = MR_CREATING;
  x->key = k;
  x->res_lease = NONE;
  x->created = x->expires = x->idle_since = x->gl_since = now;
}

/* "Else, under max_live and the key's cap, reserve and call create"; at
 * max_live the least recently used idle record of another key is evicted
 * (decisions.md: the caller makes sure that is allowed). */
static int reserve(model_t *m, int k, double now, m_grant_t *g) {
  int r, l;
  if (!under_key_cap(m, k)) return 0;
  if (!room(m)) {
    /* the room comes when the evicted record's destroy is reported */
    if (evict_ok(m)) destroy(m, idle_oldest(m), CLIENTPOOL_BY_EVICTED);
    return 0;
  }
  r = rec_alloc(m);
  if (r == NONE) return 0;
  rec_init(m, r, k, now);
  l = lease_alloc(m, r, now);
  if (l == NONE) { m->rec[r].state = MR_FREE; return 0; }
  m->rec[r].res_lease = l;
  g->status = CLIENTPOOL_GRANT_CREATE;
  g->record = r;
  g->lease = l;
  g->lease_gen = m->lea[l].gen;
  g->key = k;
  g->validate = 0;
  g->shared = 0;
  g->idle = 0;
  return 1;
}

static int grant(model_t *m, int k, double now, m_grant_t *g, int who) {
  return take_idle(m, k, now, g) || take_open(m, k, now, g, who) || reserve(m, k, now, g);
}

/* ---- waiters ---------------------------------------------------------- */

/* "a higher priority is served first, arrival order within one priority":
 * by place, then by arrival */
static int before(const m_waiter_t *a, const m_waiter_t *b) {
  return a->order < b->order || (a->order == b->order && a->seq < b->seq);
}

/* the key's head: its queued waiter with the first place */
static int queue_head(const model_t *m, int k) {
  int w, best = NONE;
  for (w = 0; w < M_MAXWAIT; w++)
    if (m->wai[w].state == MW_QUEUED && m->wai[w].key == k &&
        (best == NONE || before(&m->wai[w], &m->wai[best]))) best = w;
  return best;
}

static void dequeue(model_t *m, int w, int status, double now) {
  m_waiter_t *x = &m->wai[w];
  x->state = MW_DONE;
  x->result = status;
  x->waited = now - x->enq;
  COUNT(m, x->key, wait_count, 1);
  COUNT(m, x->key, wait_time, x->waited);
  if (status == CLIENTPOOL_TIMEOUT) COUNT(m, x->key, timeouts, 1);
  if (status == CLIENTPOOL_CANCELLED) COUNT(m, x->key, cancelled, 1);
}

static void waiter_free(model_t *m, int w) {
  m->wai[w].state = MW_FREE;
  m->wai[w].gen++;
  key_maybe_free(m, m->wai[w].key);
}

static const m_waiter_t *waiter_get(const model_t *m, int w, unsigned gen) {
  if (w < 0 || w >= M_MAXWAIT || m->wai[w].state == MW_FREE || m->wai[w].gen != gen) return NULL;
  return &m->wai[w];
}

/* ---- dispatch --------------------------------------------------------- */

/* Whether key k's queued waiters could take something of k as it is: an idle
 * record (fresh or not: expiry is found out when it is taken) or, with
 * capacity > 1, an open record. */
static int has_takeable(const model_t *m, int k) {
  int r;
  for (r = 0; r < M_MAXREC; r++)
    if (m->rec[r].key == k && (m->rec[r].state == MR_IDLE || model_open(m, r))) return 1;
  return 0;
}

/* The key whose head waiter is served next, or NONE.  decisions.md: "The
 * earliest waiter that can use what was freed is served first: an idle
 * record goes to its own key's waiters; a free slot goes to the earliest
 * waiter among both [groups]; a waiter for key B blocked by its per-key cap
 * does not hold up key A", and a waiter that must create evicts another
 * key's idle record "only when no queued waiter can take an idle record as
 * it is" -- or once younger waiters of other keys have been served before it
 * max_live times (the starvation bound).  *held: the key whose head waiter
 * that bound holds back while a younger one is served, else NONE. */
static int next_ready(const model_t *m, int *held) {
  int k, best_take = NONE, best_create = NONE;
  *held = NONE;
  if (m->closed || gate_blocked(&m->gate)) return NONE;
  for (k = 0; k < M_MAXKEY; k++) {
    int h;
    if (!m->keys[k].used || gate_blocked(&m->keys[k].gate)) continue;
    h = queue_head(m, k);
    if (h == NONE) continue;
    if (has_takeable(m, k)) {
      if (best_take == NONE || before(&m->wai[h], &m->wai[queue_head(m, best_take)])) best_take = k;
    } else if (under_key_cap(m, k)) {
      if (best_create == NONE || before(&m->wai[h], &m->wai[queue_head(m, best_create)])) best_create = k;
    }
  }
  /* no free slot: creating means evicting, allowed only if nobody can take
   * an idle record as it is (and there is one to evict) */
  if (best_create != NONE && !room(m)) {
    if (!evict_ok(m)) {
      best_create = NONE;                /* nothing to evict, or room on its way */
    } else if (best_take != NONE) {
      const m_waiter_t *c = &m->wai[queue_head(m, best_create)];
      const m_waiter_t *t = &m->wai[queue_head(m, best_take)];
      if (before(c, t) && c->passed < m->cfg.max_live) *held = best_create;
      if (before(t, c) || c->passed < m->cfg.max_live) best_create = NONE;
    }
  }
  if (best_take == NONE) return best_create;
  if (best_create == NONE) return best_take;
  return before(&m->wai[queue_head(m, best_create)], &m->wai[queue_head(m, best_take)])
    ? best_create : best_take;
}

/* "Waiters are served strictly in arrival order among those that can use the
 * freed resource", while the concurrency cap allows. */
static void dispatch(model_t *m, double now) {
  if (m->kept != NONE) return;           /* the caller that kept its place comes first */
  while (n_leases(m, -1) < m->cfg.max_concurrency) {
    int held, held2, k = next_ready(m, &held), w;
    m_grant_t g;
    m_waiter_t *x;
    if (k == NONE) break;
    w = queue_head(m, k);
    memset(&g, 0, sizeof g);
    if (!grant(m, k, now, &g, w)) {
      if (next_ready(m, &held2) == k && queue_head(m, k) == w) break;
      continue;
    }
    if (held != NONE) m->wai[queue_head(m, held)].passed++;
    dequeue(m, w, g.status, now);
    gate_granted(m, &g);
    x = &m->wai[w];
    x->record = g.record;
    x->lease = g.lease;
    x->lease_gen = g.lease_gen;
    x->validate = g.validate;
    x->shared = g.shared;
    x->idle = g.idle;
    push(m, CLIENTPOOL_EV_WAKE, w, (int)x->gen, k, 0);
  }
}

/* ---- deadlines -------------------------------------------------------- */

double model_next_deadline(const model_t *m) {
  double d = -1;
  int i;
#define EARLIER(t) do { double t_ = (t); if (d < 0 || t_ < d) d = t_; } while (0)
  for (i = 0; i < M_MAXREC; i++) {
    const m_record_t *x = &m->rec[i];
    if (x->state != MR_FREE && x->lifetime_armed) EARLIER(x->expires);
    if ((x->state == MR_IDLE || (x->state == MR_CHECKING && !x->idle_over)) && has(m->cfg.idle_timeout))
      EARLIER(x->gl_since + m->cfg.idle_timeout);
    /* "the others wait their turn": a due keepalive needs a free slot */
    if (x->state == MR_IDLE && x->ka_armed && m->nchecking < CLIENTPOOL_KEEPALIVE_MAX && !m->closed)
      EARLIER(x->kdeadline);
  }
  for (i = 0; i < M_MAXWAIT; i++)
    if (m->wai[i].state == MW_QUEUED && has(m->wai[i].deadline)) EARLIER(m->wai[i].deadline);
  for (i = 0; i < M_MAXLEASE; i++)
    if (m->lea[i].alive && m->lea[i].leak_armed) EARLIER(m->lea[i].since + m->cfg.leak_threshold);
  for (i = 0; i < M_MAXKEY; i++)
    if (m->keys[i].used && m->keys[i].bstate != MB_NONE) EARLIER(m->keys[i].bdeadline);
#undef EARLIER
  return d;
}

/* Every mutating call ends here: serve waiters, then tell the driver about a
 * deadline earlier than the one its timer is armed for. */
static void finish(model_t *m, double now) {
  double d;
  dispatch(m, now);
  d = model_next_deadline(m);
  if (d >= 0 && (m->armed < 0 || d < m->armed)) {
    m->armed = d;
    push(m, CLIENTPOOL_EV_TIMER, 0, 0, 0, d);
  }
}

/* ---- create backoff ---------------------------------------------------- */

/* "a window ... d/2 + d/2 * r, with d = min(create_backoff_max,
 * create_backoff * 2^(failures in a row - 1))" */
static void backoff_fail(model_t *m, int k, double now) {
  m_key_t *key = &m->keys[k];
  double d;
  if (!(m->cfg.create_backoff > 0) || m->closed) return;
  key->fails++;
  d = ldexp(m->cfg.create_backoff, key->fails - 1 < 1000 ? key->fails - 1 : 1000);
  if (!(d <= m->cfg.create_backoff_max)) d = m->cfg.create_backoff_max;
  key->bstate = MB_WINDOW;
  key->bdeadline = now + d / 2 + d / 2 * rnd(m);
}

/* "a successful create ends the backoff" */
static void backoff_reset(model_t *m, int k) {
  m->keys[k].fails = 0;
  m->keys[k].bstate = MB_NONE;
  m->keys[k].bdeadline = -1;
}

/* The window ended; or "create_backoff_max seconds after the window without
 * a create in flight the failures are forgotten". */
static void backoff_due(model_t *m, int k, double now) {
  m_key_t *key = &m->keys[k];
  if (key->bstate == MB_WINDOW) {
    key->bstate = MB_PROBE;
    key->bdeadline = now + m->cfg.create_backoff_max;
    floor_check(m, k);
  } else if (n_creating(m, k) > 0) {
    key->bdeadline = now + m->cfg.create_backoff_max;
  } else {
    backoff_reset(m, k);
    key_maybe_free(m, k);
  }
}

/* an acquisition looks at the window's end before the timer did */
static void backoff_check(model_t *m, int k, double now) {
  if (m->keys[k].bstate == MB_WINDOW && now >= m->keys[k].bdeadline) backoff_due(m, k, now);
}

/* "an acquisition of the key that would create gets BACKOFF, unless a
 * client of the key may come back soon (a record of it is leased, or a
 * create of it is in flight)" */
static int backoff_refuses(const model_t *m, int k) {   /* (n_idle: one out for a keepalive may come back) */
  return m->keys[k].bstate == MB_WINDOW && n_records(m, k, MR_LEASED) == 0 &&
         n_creating(m, k) == 0 && n_idle(m, k) == 0;
}

/* ---- public API ------------------------------------------------------- */

void model_init(model_t *m, const clientpool_config_t *cfg, m_oracle_fn oracle, void *octx) {
  memset(m, 0, sizeof *m);
  m->cfg = *cfg;
  m->oracle = oracle;
  m->octx = octx;
  m->armed = -1;
  m->rng = cfg->seed ? cfg->seed : 0x9E3779B97F4A7C15ULL;
  m->hold_key = m->kept = NONE;
  m->retire_before = -1;
  m->last_created = -1;
}

/* "In order: closed -> closed.  Otherwise take an eligible record ... Else
 * ... reserve ... Else wait: join the FIFO queue if fewer than max_waiting
 * wait, otherwise full.  Admission under max_concurrency is checked first and
 * waits in the same queue.  A paused pool or key queues every new
 * acquisition" (or fails it with pause_fail); and it "never barges: if a key
 * has waiters, a new acquisition for it queues behind them". */
int model_acquire(model_t *m, int k, double now, m_grant_t *g) {
  int kept = take_kept(m, k);
  memset(g, 0, sizeof *g);
  g->key = k;
  now = clamp(m, now);
  if (m->closed) { g->status = CLIENTPOOL_CLOSED; return g->status; }
  if (!key_ok(m, k)) { g->status = CLIENTPOOL_STALE; return g->status; }
  m->hold_key = k;
  backoff_check(m, k, now);
  if (!admits(m, k)) {
    if (m->cfg.pause_fail) {
      COUNT(m, k, rejected, 1);
      g->status = CLIENTPOOL_PAUSED;
    } else if (n_waiting(m, -1) >= m->cfg.max_waiting) {
      COUNT(m, k, rejected, 1);
      g->status = CLIENTPOOL_FULL;
    } else {
      g->status = CLIENTPOOL_MUST_WAIT;
    }
  } else if ((queue_head(m, k) == NONE || kept) && n_leases(m, -1) < m->cfg.max_concurrency &&
             grant(m, k, now, g, NONE)) {
    gate_granted(m, g);
  } else if (backoff_refuses(m, k)) {
    g->status = CLIENTPOOL_BACKOFF;
  } else if (n_waiting(m, -1) >= m->cfg.max_waiting) {
    COUNT(m, k, rejected, 1);
    g->status = CLIENTPOOL_FULL;
  } else {
    g->status = CLIENTPOOL_MUST_WAIT;
  }
  if (kept && g->status == CLIENTPOOL_MUST_WAIT) m->kept = k;   /* its wait uses it */
  finish(m, now);
  m->hold_key = NONE;
  if (g->status == CLIENTPOOL_FULL || g->status == CLIENTPOOL_PAUSED || g->status == CLIENTPOOL_BACKOFF)
    key_maybe_free(m, k);
  return g->status;
}

int model_wait(model_t *m, int k, double deadline, double now, unsigned *gen) {
  return model_wait_priority(m, k, deadline, 0, now, gen);
}

int model_wait_priority(model_t *m, int k, double deadline, int priority, double now, unsigned *gen) {
  int w, kept, held;
  m_waiter_t *x;
  now = clamp(m, now);
  if (m->closed) return -CLIENTPOOL_CLOSED;
  if (!key_ok(m, k)) return -CLIENTPOOL_STALE;
  held = m->kept != NONE;
  kept = take_kept(m, k);
  if (n_waiting(m, -1) >= m->cfg.max_waiting) {
    COUNT(m, k, rejected, 1);
    key_maybe_free(m, k);
    /* "the caller that kept its place comes first": a full queue drops the
     * place, and whom it held back is served */
    if (held) finish(m, now);
    return -CLIENTPOOL_FULL;
  }
  for (w = 0; w < M_MAXWAIT && m->wai[w].state != MW_FREE; w++) {}
  if (w == M_MAXWAIT) { m->overflow = 1; return CLIENTPOOL_ENOMEM; }
  x = &m->wai[w];
  x->state = MW_QUEUED;
  x->key = k;
  x->seq = ++m->seq;
  /* "A waiter of priority n is placed as if it had arrived n *
   * CLIENTPOOL_PRIORITY_STEP acquisitions earlier"; a kept place ("without
   * losing its place") is ahead of every other */
  x->order = kept ? INT64_MIN / 2 + x->seq : x->seq - (long long)priority * CLIENTPOOL_PRIORITY_STEP;
  x->passed = 0;
  x->enq = now;
  x->deadline = has(deadline) ? deadline : -1;
  x->result = CLIENTPOOL_PENDING;
  x->record = x->lease = NONE;
  x->lease_gen = 0;
  x->validate = x->shared = 0;
  x->idle = x->waited = 0;
  *gen = x->gen;
  finish(m, now);
  return w;
}

/* "a record still idle past max_idle (or its key's) once waiters took what
 * they could is closed" */
static void close_past_max_idle(model_t *m, int r, unsigned gen, int k) {
  const m_record_t *x = &m->rec[r];
  if (x->state == MR_IDLE && x->gen == gen &&
      (n_idle(m, -1) > m->cfg.max_idle ||
       (key_cap_idle(m, k) >= 0 && n_idle(m, k) > key_cap_idle(m, k))))
    destroy(m, r, CLIENTPOOL_BY_MAX_IDLE);
}

/* A reservation given back: its lease and record are freed (no event). */
static void forfeit(model_t *m, int r, int failed) {
  m_record_t *x = &m->rec[r];
  int k = x->key;
  if (failed) COUNT(m, k, create_failed, 1);
  if (x->refill) m->keys[k].refilling--;
  else {
    gate_lease_ended(m, k, x->res_lease);
    lease_free(m, x->res_lease);
  }
  x->state = MR_FREE;
  x->gen++;
  key_maybe_free(m, k);
}

/* "create returning nil, err or throwing ...: the reservation is forfeited
 * and capacity handed to the next waiter." */
int model_created(model_t *m, int r, int ok, double now) {
  m_record_t *x;
  int k;
  now = clamp(m, now);
  if (r < 0 || r >= M_MAXREC || m->rec[r].state != MR_CREATING) return CLIENTPOOL_STALE;
  x = &m->rec[r];
  k = x->key;
  if (!ok) {
    m->hold_key = k;
    forfeit(m, r, 1);
    backoff_fail(m, k, now);
    m->hold_key = NONE;
    key_maybe_free(m, k);
    finish(m, now);
    return 0;
  }
  backoff_reset(m, k);
  x->created = m->last_created = now > m->last_created ? now : nextafter(m->last_created, HUGE_VAL);
  x->cseq = ++m->cseq;
  /* "lifetime_jitter shortens each record's lifetime by a random fraction up
   * to the jitter (never lengthens it)" */
  x->expires = has(m->cfg.max_lifetime)
    ? now + m->cfg.max_lifetime * (1.0 - m->cfg.lifetime_jitter * rnd(m)) : -1;
  x->lifetime_armed = has(m->cfg.max_lifetime);
  COUNT(m, k, opened, 1);
  push(m, CLIENTPOOL_EV_CREATED, r, x->refill, k, 0);
  if (x->refill) {                       /* the warm floor's: straight to idle */
    m->keys[k].refilling--;
    x->refill = 0;
    x->state = MR_LEASED;
    if (m->closed) destroy(m, r, CLIENTPOOL_BY_DRAIN);
    else if (over_cap(m, k)) destroy(m, r, CLIENTPOOL_BY_RESIZED);   /* a cap lowered meanwhile */
    else {
      /* "as for a release: past max_idle once waiters took what they could, it is closed" */
      unsigned gen = x->gen;
      idle_push(m, r, now);
      dispatch(m, now);
      close_past_max_idle(m, r, gen, k);
    }
  } else {
    x->state = MR_LEASED;
  }
  finish(m, now);
  return 0;
}

/* "lease:release() returns the client for reuse unless the pool is closed,
 * the client is past max_lifetime, or max_idle is reached: then it is
 * destroyed.  release(false)/destroy() always retire it."  Shared: "One
 * holder's release(false) loses the client for all ... destroyed when the
 * last holder releases." */
static void do_release(model_t *m, int l, int reason, double now) {
  int r = m->lea[l].record, k = m->rec[r].key;
  unsigned gen;
  m_record_t *x = &m->rec[r];
  gate_lease_ended(m, k, l);
  lease_free(m, l);
  if (x->nleases > 0) {
    if (reason >= 0 && !x->doomed) {
      x->doomed = reason + 1;
      push(m, CLIENTPOOL_EV_LOST, r, reason, k, 0);
    }
    return;
  }
  if (reason < 0 && x->doomed) reason = x->doomed - 1;
  if (reason < 0) {
    if (m->closed) reason = CLIENTPOOL_BY_DRAIN;
    else if (life_over(x, now)) reason = CLIENTPOOL_BY_LIFETIME;
    else if (x->retire || retired_by_age(m, x)) reason = CLIENTPOOL_BY_RETIRED;
    else if (over_cap(m, k)) reason = CLIENTPOOL_BY_RESIZED;
  }
  if (reason >= 0) { destroy(m, r, reason); return; }
  idle_push(m, r, now);
  gen = x->gen;
  dispatch(m, now);                      /* a waiter may take it at once */
  close_past_max_idle(m, r, gen, k);
}

int model_release(model_t *m, int l, unsigned gen, int reason, double now) {
  now = clamp(m, now);
  if (!lease_get(m, l, gen) || m->rec[m->lea[l].record].state != MR_LEASED) return CLIENTPOOL_STALE;
  if (reason >= CLIENTPOOL_BY_COUNT) reason = CLIENTPOOL_BY_ERROR;
  do_release(m, l, reason, now);
  finish(m, now);
  return 0;
}

/* "a failed or throwing validate retires the record and the same caller
 * looks again" (decisions.md: "without losing its place"): the record is
 * destroyed as invalid and the caller granted again before anyone queued. */
int model_regrant(model_t *m, int l, unsigned gen, double now, m_grant_t *g) {
  int k;
  memset(g, 0, sizeof *g);
  now = clamp(m, now);
  if (!lease_get(m, l, gen) || m->rec[m->lea[l].record].state != MR_LEASED) {
    g->status = CLIENTPOOL_STALE;
    return g->status;
  }
  k = m->rec[m->lea[l].record].key;
  g->key = k;
  m->hold_key = k;
  backoff_check(m, k, now);
  do_release(m, l, CLIENTPOOL_BY_INVALID, now);
  if (m->closed) g->status = CLIENTPOOL_CLOSED;
  else if (!admits(m, k)) g->status = CLIENTPOOL_MUST_WAIT;   /* "Pause stops later acquisitions" */
  else if (grant(m, k, now, g, NONE)) gate_granted(m, g);
  else {
    /* nothing free now (at max_live the room comes when the invalid
     * record's destroy is reported): the caller keeps its place */
    g->status = CLIENTPOOL_MUST_WAIT;
    m->kept = k;
  }
  finish(m, now);
  m->hold_key = NONE;
  if (g->status != CLIENTPOOL_GRANT_IDLE && g->status != CLIENTPOOL_GRANT_CREATE) key_maybe_free(m, k);
  return g->status;
}

/* "A lease collected ... while still held counts as leaked: its client is
 * destroyed"; a reservation whose creator died gives its capacity back. */
int model_leak(model_t *m, int l, unsigned gen, double now) {
  int r;
  now = clamp(m, now);
  if (!lease_get(m, l, gen)) return CLIENTPOOL_STALE;
  r = m->lea[l].record;
  COUNT(m, m->rec[r].key, leaked, 1);
  push(m, CLIENTPOOL_EV_LEAK, -1, 0, m->rec[r].key, now);   /* "a leak event fires" */
  if (m->rec[r].state == MR_CREATING) forfeit(m, r, 0);
  else do_release(m, l, CLIENTPOOL_BY_LEAKED, now);
  finish(m, now);
  return 0;
}

static void fill_result(const model_t *m, int w, m_grant_t *g) {
  const m_waiter_t *x = &m->wai[w];
  g->status = x->result;
  g->record = x->record;
  g->lease = x->lease;
  g->lease_gen = x->lease_gen;
  g->key = x->key;
  g->validate = x->validate;
  g->shared = x->shared;
  g->idle = x->idle;
  g->waited = x->waited;
}

int model_claim(model_t *m, int w, unsigned gen, double now, m_grant_t *g) {
  (void)now;
  memset(g, 0, sizeof *g);
  if (!waiter_get(m, w, gen)) { g->status = CLIENTPOOL_STALE; return g->status; }
  if (m->wai[w].state == MW_QUEUED) {
    g->status = CLIENTPOOL_PENDING;
    g->key = m->wai[w].key;
    return g->status;
  }
  fill_result(m, w, g);
  waiter_free(m, w);
  return g->status;
}

int model_cancel(model_t *m, int w, unsigned gen, int status, double now, m_grant_t *g) {
  now = clamp(m, now);
  if (waiter_get(m, w, gen) && m->wai[w].state == MW_QUEUED)
    dequeue(m, w, status == CLIENTPOOL_TIMEOUT ? CLIENTPOOL_TIMEOUT : CLIENTPOOL_CANCELLED, now);
  model_claim(m, w, gen, now, g);
  finish(m, now);
  return g->status;
}

/* "A killed or dead waiter must never swallow a grant": a granted waiter
 * whose caller is gone hands the grant back. */
int model_abandon(model_t *m, int w, unsigned gen, double now) {
  m_waiter_t *x;
  now = clamp(m, now);
  if (!waiter_get(m, w, gen)) return CLIENTPOOL_STALE;
  x = &m->wai[w];
  if (x->state == MW_QUEUED) {
    dequeue(m, w, CLIENTPOOL_CANCELLED, now);
  } else if (x->result == CLIENTPOOL_GRANT_IDLE || x->result == CLIENTPOOL_GRANT_CREATE) {
    COUNT(m, x->key, cancelled, 1);
    if (x->result == CLIENTPOOL_GRANT_CREATE) forfeit(m, x->record, 0);
    else if (lease_get(m, x->lease, x->lease_gen)) {
      COUNT(m, x->key, reused, -1);      /* handed back unused */
      do_release(m, x->lease, -1, now);
    }
  }
  waiter_free(m, w);
  finish(m, now);
  return 0;
}

/* "until its destroy hook has returned or failed": the room is free now. */
int model_destroyed(model_t *m, int r, double now) {
  int k;
  now = clamp(m, now);
  if (r < 0 || r >= M_MAXREC || m->rec[r].state != MR_CLOSING) return CLIENTPOOL_STALE;
  k = m->rec[r].key;
  m->rec[r].state = MR_FREE;
  m->rec[r].gen++;
  floor_check(m, k);
  key_maybe_free(m, k);
  finish(m, now);
  return 0;
}

int model_retire(model_t *m, int r, double now) {
  now = clamp(m, now);
  if (r < 0 || r >= M_MAXREC || m->rec[r].state == MR_FREE || m->rec[r].state == MR_CLOSING)
    return CLIENTPOOL_STALE;
  m->rec[r].retire = 1;
  m->rec[r].retired = 1;
  if (m->rec[r].state == MR_IDLE) destroy(m, r, CLIENTPOOL_BY_RETIRED);
  finish(m, now);
  return 0;
}

int model_retire_before(model_t *m, int k, double before, double now) {
  int r;
  now = clamp(m, now);
  if (k >= 0 && !key_ok(m, k)) return CLIENTPOOL_EINVAL;
  if (k < 0) {
    if (before < 0) m->retire_seq = m->cseq;
    else if (before > m->retire_before) m->retire_before = before;
  } else {
    if (before < 0) m->keys[k].retire_seq = m->cseq;
    else if (before > m->keys[k].retire_before) m->keys[k].retire_before = before;
    m->hold_key = k;
  }
  /* idle ones at once, leased ones at release */
  for (r = 0; r < M_MAXREC; r++)
    if (m->rec[r].state == MR_IDLE && (k < 0 || m->rec[r].key == k) && retired_by_age(m, &m->rec[r]))
      destroy(m, r, CLIENTPOOL_BY_RETIRED);
  if (k >= 0) {
    m->hold_key = NONE;
    key_maybe_free(m, k);
  }
  finish(m, now);
  return 0;
}

/* The record and every record of its key created before it (by creation
 * order): retired, idle ones at once, leased ones at release. */
int model_retire_upto(model_t *m, int r, double now) {
  int i, k;
  now = clamp(m, now);
  if (r < 0 || r >= M_MAXREC || (m->rec[r].state != MR_IDLE && m->rec[r].state != MR_LEASED))
    return CLIENTPOOL_EINVAL;
  k = m->rec[r].key;
  if (m->rec[r].cseq > m->keys[k].retire_seq) m->keys[k].retire_seq = m->rec[r].cseq;
  m->hold_key = k;
  for (i = 0; i < M_MAXREC; i++)
    if (m->rec[i].state == MR_IDLE && m->rec[i].key == k && retired_by_age(m, &m->rec[i]))
      destroy(m, i, CLIENTPOOL_BY_RETIRED);
  m->hold_key = NONE;
  key_maybe_free(m, k);
  finish(m, now);
  return 0;
}

static m_gate_t *gate_of(model_t *m, int k) {
  if (k < 0) return &m->gate;
  return key_ok(m, k) ? &m->keys[k].gate : NULL;
}

/* "Pause stops later acquisitions of the pool (or key) until resume; they
 * stay queued ... leases already held stay with their callers." */
int model_pause(model_t *m, int k, double now) {
  m_gate_t *g = gate_of(m, k);
  now = clamp(m, now);
  if (!g) return CLIENTPOOL_EINVAL;
  g->paused = 1;
  g->probe = MP_NONE;
  finish(m, now);
  return 0;
}

int model_resume(model_t *m, int k, int probe, double now) {
  m_gate_t *g = gate_of(m, k);
  now = clamp(m, now);
  if (!g) return CLIENTPOOL_EINVAL;
  if (g->paused) {
    g->paused = 0;
    g->probe = probe ? MP_READY : MP_NONE;
  }
  finish(m, now);
  return 0;
}

/* "the gate opens when that lease observes an outcome that continues" */
int model_probe_ok(model_t *m, int l, unsigned gen, double now) {
  int k, was = 0;
  m_gate_t *gs[2];
  int i;
  now = clamp(m, now);
  if (!lease_get(m, l, gen)) return 0;
  k = m->rec[m->lea[l].record].key;
  gs[0] = &m->gate; gs[1] = &m->keys[k].gate;
  for (i = 0; i < 2; i++)
    if (gs[i]->probe == MP_OUT && gs[i]->probe_lease == l && gs[i]->probe_gen == gen) {
      gs[i]->probe = MP_NONE;
      was = 1;
    }
  finish(m, now);
  return was;
}

int model_gate(const model_t *m, int k) {
  const m_gate_t *g = k < 0 ? &m->gate : key_ok(m, k) ? &m->keys[k].gate : NULL;
  if (!g) return 0;
  return g->paused ? 1 : g->probe != MP_NONE ? 2 : 0;
}

void model_floor(model_t *m, int on, double now) {
  int k;
  now = clamp(m, now);
  m->floor_on = on && !m->closed;
  m->refill_signalled = 0;
  for (k = 0; k < M_MAXKEY; k++) if (m->keys[k].used) floor_check(m, k);
  finish(m, now);
}

/* "Reserves a record for the warm floor of some pinned key below min_idle,
 * where max_live and the key's cap leave room." */
int model_refill(model_t *m, double now, int *key) {
  int cand[M_MAXKEY], n = 0, k, r;
  now = clamp(m, now);
  *key = NONE;
  for (k = 0; k < M_MAXKEY; k++)
    if (m->keys[k].used && m->keys[k].pinned == 2) backoff_check(m, k, now);
  if (m->floor_on && !m->closed && room(m))
    for (k = 0; k < M_MAXKEY; k++)
      if (m->keys[k].used && m->keys[k].pinned == 2 && floor_deficit(m, k) > 0 && under_key_cap(m, k))
        cand[n++] = k;
  if (n == 0) {
    m->refill_signalled = 0;
    finish(m, now);
    return NONE;
  }
  k = n == 1 ? cand[0] : m->oracle(m->octx, M_ORACLE_REFILL, NONE, cand, n);
  r = rec_alloc(m);
  if (r == NONE) return NONE;
  rec_init(m, r, k, now);
  m->rec[r].refill = 1;
  m->keys[k].refilling++;
  m->floor_held = 0;
  *key = k;
  finish(m, now);
  return r;
}

/* "Processes deadlines up to now: idle and lifetime expiry of idle records,
 * waiter timeouts, leak_threshold reports." */
void model_tick(model_t *m, double now) {
  now = clamp(m, now);
  m->armed = -1;
  /* idle expiry, least recently used first; the floor renews what it keeps */
  for (;;) {
    int r = gl_oldest(m);
    if (r == NONE || !has(m->cfg.idle_timeout) || !(now >= m->rec[r].gl_since + m->cfg.idle_timeout)) break;
    if (floor_keeps(m, &m->rec[r])) {
      m->rec[r].gl_since = now;
      m->rec[r].gl_seq = ++m->idle_seq;
    } else if (m->rec[r].state == MR_CHECKING) {   /* "destroyed at the report" */
      m->rec[r].idle_over = 1;
      m->rec[r].retire = 1;
    } else {
      destroy(m, r, CLIENTPOOL_BY_IDLE);
    }
  }
  /* the other deadlines, earliest first */
  for (;;) {
    int i, kind = -1, idx = -1;
    double t = -1;
    for (i = 0; i < M_MAXWAIT; i++)
      if (m->wai[i].state == MW_QUEUED && has(m->wai[i].deadline) && m->wai[i].deadline <= now &&
          (kind < 0 || m->wai[i].deadline < t)) { kind = 0; idx = i; t = m->wai[i].deadline; }
    for (i = 0; i < M_MAXREC; i++)
      if (m->rec[i].state != MR_FREE && m->rec[i].lifetime_armed && m->rec[i].expires <= now &&
          (kind < 0 || m->rec[i].expires < t)) { kind = 1; idx = i; t = m->rec[i].expires; }
    for (i = 0; i < M_MAXLEASE; i++)
      if (m->lea[i].alive && m->lea[i].leak_armed && m->lea[i].since + m->cfg.leak_threshold <= now &&
          (kind < 0 || m->lea[i].since + m->cfg.leak_threshold < t)) {
        kind = 2; idx = i; t = m->lea[i].since + m->cfg.leak_threshold;
      }
    for (i = 0; i < M_MAXKEY; i++)
      if (m->keys[i].used && m->keys[i].bstate != MB_NONE && m->keys[i].bdeadline <= now &&
          (kind < 0 || m->keys[i].bdeadline < t)) { kind = 3; idx = i; t = m->keys[i].bdeadline; }
    if (kind < 0) break;
    if (kind == 3) { backoff_due(m, idx, now); continue; }
    if (kind == 0) {                     /* "nil, timeout at its deadline" */
      dequeue(m, idx, CLIENTPOOL_TIMEOUT, now);
      push(m, CLIENTPOOL_EV_WAKE, idx, (int)m->wai[idx].gen, m->wai[idx].key, 0);
    } else if (kind == 1) {
      m_record_t *x = &m->rec[idx];
      x->lifetime_armed = 0;
      /* idle: destroyed; leased: retired at its release, no new share */
      if (x->state == MR_IDLE) destroy(m, idx, CLIENTPOOL_BY_LIFETIME);
      else { x->retire = 1; x->lifetime_over = 1; }
    } else {
      m_lease_t *x = &m->lea[idx];
      x->leak_armed = 0;
      push(m, CLIENTPOOL_EV_LEAK, idx, (int)x->gen, m->rec[x->record].key, x->since);
    }
  }
  ka_pump(m, now);
  finish(m, now);
}

/* ---- keepalive --------------------------------------------------------- */

/* "At most CLIENTPOOL_KEEPALIVE_MAX run at once: the others wait their turn
 * (first due first)"; among those due at the same instant the oracle says
 * which the engine took. */
static void ka_pump(model_t *m, double now) {
  while (m->nchecking < CLIENTPOOL_KEEPALIVE_MAX && !m->closed) {
    int cand[M_MAXREC], n = 0, r, best = NONE;
    m_record_t *x;
    for (r = 0; r < M_MAXREC; r++) {
      const m_record_t *y = &m->rec[r];
      if (y->state != MR_IDLE || !y->ka_armed || !(y->kdeadline <= now)) continue;
      if (best == NONE || y->kdeadline < m->rec[best].kdeadline) { best = r; n = 0; }
      if (y->kdeadline == m->rec[best].kdeadline) cand[n++] = r;
    }
    if (best == NONE) return;
    r = n == 1 ? cand[0] : m->oracle(m->octx, M_ORACLE_KEEPALIVE, NONE, cand, n);
    x = &m->rec[r];
    x->state = MR_CHECKING;              /* "not granted meanwhile and still counts as idle" */
    x->ka_armed = 0;
    m->nchecking++;
    COUNT(m, x->key, keepalive, 1);
    push(m, CLIENTPOOL_EV_KEEPALIVE, r, 0, x->key, now - x->idle_since);
  }
}

/* "ok = 1 puts the record back on top of its key's idle stack with a fresh
 * keepalive clock ... ok = 0 destroys it (BY_INVALID) ... retired, past its
 * lifetime or idle_timeout, over a lowered cap, or whose pool closed ... is
 * destroyed at the report for that reason" */
int model_keepalive_done(model_t *m, int r, int ok, double now) {
  m_record_t *x;
  int k, why = NONE;
  now = clamp(m, now);
  if (r < 0 || r >= M_MAXREC || m->rec[r].state != MR_CHECKING) return CLIENTPOOL_STALE;
  x = &m->rec[r];
  k = x->key;
  m->nchecking--;
  if (!ok) {
    COUNT(m, k, keepalive_failed, 1);
    why = CLIENTPOOL_BY_INVALID;
  } else if (m->closed) why = CLIENTPOOL_BY_DRAIN;
  else if (x->retired || retired_by_age(m, x)) why = CLIENTPOOL_BY_RETIRED;
  else if (life_over(x, now)) why = CLIENTPOOL_BY_LIFETIME;
  else if (x->idle_over ||
           (has(m->cfg.idle_timeout) && now - x->gl_since >= m->cfg.idle_timeout && !floor_keeps(m, x)))
    why = CLIENTPOOL_BY_IDLE;
  else if (over_cap(m, k)) why = CLIENTPOOL_BY_RESIZED;
  else if (n_idle(m, -1) > m->cfg.max_idle || (key_cap_idle(m, k) >= 0 && n_idle(m, k) > key_cap_idle(m, k)))
    why = CLIENTPOOL_BY_MAX_IDLE;       /* "over a max_idle lowered while it was out" */
  if (why != NONE) destroy(m, r, why);
  else {
    x->state = MR_IDLE;
    x->stack_seq = ++m->idle_seq;        /* on top; its place in the idle order kept */
    x->ka_armed = has(m->cfg.keepalive);
    x->kdeadline = now + m->cfg.keepalive;
  }
  ka_pump(m, now);
  finish(m, now);
  return 0;
}

/* ---- configure -------------------------------------------------------- */

/* clientpool_new's rules (DESIGN section 3, "Capacity envelope"), restated. */
static int config_valid(const clientpool_config_t *c) {
  if (c->max_live < 1 || c->max_concurrency < 1 || c->capacity < 1 || c->max_waiting < 0) return 0;
  if (c->min_idle < 0 || c->min_idle > c->max_idle || c->max_idle > c->max_live) return 0;
  if (c->key_max_live >= 0 && (c->key_max_live < 1 || c->key_max_live > c->max_live)) return 0;
  if (c->key_max_idle >= 0 && c->key_max_idle > c->max_idle) return 0;
  if (c->max_keys == 0) return 0;
  if (!(c->lifetime_jitter >= 0 && c->lifetime_jitter < 1)) return 0;
  if (c->create_backoff != c->create_backoff) return 0;
  if (c->create_backoff > 0 && !(c->create_backoff < HUGE_VAL && c->create_backoff_max >= c->create_backoff &&
                                 c->create_backoff_max < HUGE_VAL)) return 0;
  if (!(c->keepalive < 0 || (c->keepalive > 0 && c->keepalive < HUGE_VAL))) return 0;
  return 1;
}

/* the key's idle record released first (its LIFO stack's bottom) */
static int idle_bottom(const model_t *m, int k) {
  int r, best = NONE;
  for (r = 0; r < M_MAXREC; r++)
    if (m->rec[r].state == MR_IDLE && m->rec[r].key == k &&
        (best == NONE || m->rec[r].stack_seq < m->rec[best].stack_seq)) best = r;
  return best;
}

/* "A lower max_live or per-key max_live retires idle records at once (least
 * recently used first, BY_RESIZED) ... A lower max_idle or per-key max_idle
 * retires idle records the same way (BY_MAX_IDLE)." */
static void shrink_key(model_t *m, int k) {
  for (;;) {
    int r = idle_bottom(m, k), cap = key_cap_live(m, k), icap = key_cap_idle(m, k);
    int over = cap >= 0 && n_live(m, k) + n_creating(m, k) > cap;
    if (r == NONE || !(over || (icap >= 0 && n_idle(m, k) > icap))) return;
    destroy(m, r, over ? CLIENTPOOL_BY_RESIZED : CLIENTPOOL_BY_MAX_IDLE);
  }
}

int model_configure(model_t *m, const clientpool_config_t *cfg, double now) {
  clientpool_config_t old;
  int k, r;
  now = clamp(m, now);
  if (!config_valid(cfg) || cfg->capacity != m->cfg.capacity || cfg->seed != m->cfg.seed)
    return CLIENTPOOL_EINVAL;
  if (m->closed) return CLIENTPOOL_ECLOSED;
  old = m->cfg;
  m->cfg = *cfg;
  /* "max_lifetime: every record's lifetime deadline is scaled by new/old
   * (its jitter kept), set for records that had none (jitter drawn in
   * creation order), or dropped" */
  if (!has(cfg->max_lifetime)) {
    for (r = 0; r < M_MAXREC; r++) m->rec[r].lifetime_armed = 0;
  } else if (has(old.max_lifetime) && cfg->max_lifetime != old.max_lifetime) {
    double f = cfg->max_lifetime / old.max_lifetime;
    for (r = 0; r < M_MAXREC; r++) {
      m_record_t *x = &m->rec[r];
      if (x->state != MR_FREE && x->lifetime_armed) x->expires = x->created + (x->expires - x->created) * f;
    }
  } else if (!has(old.max_lifetime)) {
    double after = -HUGE_VAL;
    for (;;) {
      int next = NONE;
      for (r = 0; r < M_MAXREC; r++) {
        const m_record_t *x = &m->rec[r];
        if ((x->state == MR_IDLE || x->state == MR_LEASED || x->state == MR_CHECKING) && x->created > after &&
            (next == NONE || x->created < m->rec[next].created)) next = r;
      }
      if (next == NONE) break;
      m->rec[next].expires = m->rec[next].created + cfg->max_lifetime * (1.0 - cfg->lifetime_jitter * rnd(m));
      m->rec[next].lifetime_armed = 1;
      after = m->rec[next].created;
    }
  }
  /* "held leases are measured against the new value (a report already
   * made is not made again)" */
  for (r = 0; r < M_MAXLEASE; r++) {
    if (!has(cfg->leak_threshold)) m->lea[r].leak_armed = 0;
    else if (!has(old.leak_threshold) && m->lea[r].alive) {
      m->lea[r].leak_armed = 1;
      /* "a stamp of an untimed call may be early: counted from the
       * configure, a lease is reported late, never early" */
      if (m->stale && m->lea[r].since < now) m->lea[r].since = now;
    }
  }
  /* keepalive: each clock as it was, measured against the new value */
  for (r = 0; r < M_MAXREC; r++) {
    m_record_t *x = &m->rec[r];
    if (x->state != MR_IDLE) continue;
    if (!has(cfg->keepalive)) x->ka_armed = 0;
    else if (has(old.keepalive)) x->kdeadline = x->kdeadline - old.keepalive + cfg->keepalive;
    else { x->ka_armed = 1; x->kdeadline = x->idle_since + cfg->keepalive; }
  }
  for (;;) {
    int v = idle_oldest(m);
    if (v == NONE || n_live(m, -1) + n_creating(m, -1) <= cfg->max_live) break;
    destroy(m, v, CLIENTPOOL_BY_RESIZED);
  }
  for (;;) {
    int v = idle_oldest(m);
    if (v == NONE || n_idle(m, -1) <= cfg->max_idle) break;
    destroy(m, v, CLIENTPOOL_BY_MAX_IDLE);
  }
  for (k = 0; k < M_MAXKEY; k++) {
    if (!m->keys[k].used) continue;
    if (!(cfg->create_backoff > 0)) backoff_reset(m, k);   /* "backoff off ends every window" */
    shrink_key(m, k);
    key_maybe_free(m, k);
  }
  m->refill_signalled = 0;
  for (k = 0; k < M_MAXKEY; k++) if (m->keys[k].used) floor_check(m, k);
  ka_pump(m, now);
  finish(m, now);
  return 0;
}

int model_key_caps(model_t *m, int k, int max_live, int max_idle, double now) {
  now = clamp(m, now);
  if (!key_ok(m, k) || max_live > m->cfg.max_live || max_idle > m->cfg.max_idle) return CLIENTPOOL_EINVAL;
  if (m->closed) return CLIENTPOOL_ECLOSED;
  m->keys[k].cap_live = max_live < 0 ? NONE : max_live;
  m->keys[k].cap_idle = max_idle < 0 ? NONE : max_idle;
  shrink_key(m, k);
  floor_check(m, k);
  key_maybe_free(m, k);
  finish(m, now);
  return 0;
}

/* "close() ... stop admission, wake queued acquisitions with closed and
 * retire idle clients.  Held leases stay caller-owned." */
void model_close(model_t *m, double now) {
  int k, w, r;
  now = clamp(m, now);
  if (m->closed) return;
  m->closed = 1;
  m->floor_on = 0;
  m->kept = NONE;
  for (k = 0; k < M_MAXKEY; k++) {
    if (!m->keys[k].used) continue;
    m->keys[k].pinned = 0;
    backoff_reset(m, k);
    while ((w = queue_head(m, k)) != NONE) {
      dequeue(m, w, CLIENTPOOL_CLOSED, now);
      push(m, CLIENTPOOL_EV_WAKE, w, (int)m->wai[w].gen, k, 0);
    }
    for (r = 0; r < M_MAXREC; r++)
      if (m->rec[r].state == MR_IDLE && m->rec[r].key == k) destroy(m, r, CLIENTPOOL_BY_DRAIN);
    key_maybe_free(m, k);
  }
  finish(m, now);
}

/* ---- the fleet's accounting (model.h) --------------------------------- */

void model_fleet_init(model_fleet_t *mf, int32_t max_live, int32_t max_idle, int32_t max_concurrency,
                      int32_t key_max_live, int32_t key_max_idle) {
  memset(mf, 0, sizeof *mf);
  mf->max_live = max_live;
  mf->max_idle = max_idle;
  mf->max_concurrency = max_concurrency;
  mf->key_max_live = key_max_live;
  mf->key_max_idle = key_max_idle;
}

void model_fleet_reserve(model_fleet_t *mf, int m, int k, int refill) {
  mf->live[m][k]++;
  if (refill) mf->refilling[m][k]++;
}

void model_fleet_created(model_fleet_t *mf, int m, int k, int refill, int ok) {
  if (refill) mf->refilling[m][k]--;
  if (!ok) mf->live[m][k]--;
}

void model_fleet_destroyed(model_fleet_t *mf, int m, int k) { mf->live[m][k]--; }

#define MF_FAIL(...) do { snprintf(buf, n, __VA_ARGS__); return -1; } while (0)

int model_fleet_check(const model_fleet_t *mf, const mf_view_t *v, char *buf, size_t n) {
  /* kinds, as fleet.h numbers them */
  enum { LIVE = 0, IDLE = 1, LEASE = 2, FLOOR = 3 };
  int32_t sum[4] = { 0, 0, 0, 0 }, ksum[MF_KEYS][4], mlive = 0, kmlive[MF_KEYS];
  int m, k, kind;
  memset(ksum, 0, sizeof ksum);
  memset(kmlive, 0, sizeof kmlive);
  for (m = 0; m < MF_MEMBERS; m++) {
    const clientpool_stats_t *ps = &v->pool[m];
    int32_t plive = 0, prefill = 0;
    for (k = 0; k < MF_KEYS; k++) {
      const clientpool_stats_t *ks = &v->key[m][k];
      int32_t want[4];
      if (mf->live[m][k] < 0 || mf->refilling[m][k] < 0) MF_FAIL("member %d key %d: the model counts below 0", m, k);
      if (ks->live + ks->creating + ks->closing != mf->live[m][k])
        MF_FAIL("member %d key %d: the engine holds %d clients (live %d creating %d closing %d), the model %d",
                m, k, ks->live + ks->creating + ks->closing, ks->live, ks->creating, ks->closing, mf->live[m][k]);
      want[LIVE] = mf->live[m][k];
      want[IDLE] = ks->idle;
      want[LEASE] = v->leases_taken[m] ? ks->leases : 0;
      want[FLOOR] = mf->refilling[m][k];
      for (kind = 0; kind < 4; kind++) {
        if (v->kheld[m][k][kind] != want[kind])
          MF_FAIL("member %d key %d: its fleet share of kind %d is %d, its engine holds %d", m, k, kind,
                  v->kheld[m][k][kind], want[kind]);
        ksum[k][kind] += v->kheld[m][k][kind];
      }
      plive += mf->live[m][k];
      prefill += mf->refilling[m][k];
      kmlive[k] += mf->live[m][k];
    }
    if (ps->live + ps->creating + ps->closing != plive)
      MF_FAIL("member %d: the engine holds %d clients, the model %d", m, ps->live + ps->creating + ps->closing, plive);
    {
      int32_t want[4];
      want[LIVE] = plive;
      want[IDLE] = ps->idle;
      want[LEASE] = v->leases_taken[m] ? ps->leases : 0;
      want[FLOOR] = prefill;
      for (kind = 0; kind < 4; kind++) {
        if (v->held[m][kind] != want[kind])
          MF_FAIL("member %d: its fleet share of kind %d is %d, its engine holds %d", m, kind, v->held[m][kind],
                  want[kind]);
        sum[kind] += v->held[m][kind];
      }
    }
    mlive += plive;
  }
  for (kind = 0; kind < 4; kind++)
    if (v->total[kind] != sum[kind])
      MF_FAIL("the fleet's count of kind %d is %d, its members hold %d", kind, v->total[kind], sum[kind]);
  for (k = 0; k < MF_KEYS; k++)
    for (kind = 0; kind < 4; kind++)
      if (kind != LEASE && v->ktotal[k][kind] != ksum[k][kind])
        MF_FAIL("key %d: the fleet's count of kind %d is %d, its members hold %d", k, kind, v->ktotal[k][kind],
                ksum[k][kind]);
  if (v->total[LIVE] > mf->max_live || mlive > mf->max_live)
    MF_FAIL("the fleet's max_live %d exceeded: %d held (the model counts %d)", mf->max_live, v->total[LIVE], mlive);
  if (v->total[IDLE] > mf->max_idle) MF_FAIL("the fleet's max_idle %d exceeded: %d idle", mf->max_idle, v->total[IDLE]);
  if (mf->max_concurrency >= 0 && v->total[LEASE] > mf->max_concurrency)
    MF_FAIL("the fleet's max_concurrency %d exceeded: %d leases", mf->max_concurrency, v->total[LEASE]);
  for (k = 0; k < MF_KEYS; k++) {
    if (mf->key_max_live >= 0 && (v->ktotal[k][LIVE] > mf->key_max_live || kmlive[k] > mf->key_max_live))
      MF_FAIL("key %d: the fleet's per-key max_live %d exceeded: %d held (the model counts %d)", k, mf->key_max_live,
              v->ktotal[k][LIVE], kmlive[k]);
    if (mf->key_max_idle >= 0 && v->ktotal[k][IDLE] > mf->key_max_idle)
      MF_FAIL("key %d: the fleet's per-key max_idle %d exceeded: %d idle", k, mf->key_max_idle, v->ktotal[k][IDLE]);
  }
  return 0;
}
