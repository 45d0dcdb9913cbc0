/*
 * test_engine_fleet.c - section 30: engines taking their budget from a
 * fleet (clientpool_set_fleet; csrc/fleet.h), two members of one segment in
 * this process (two handles, two rows), driven as the Lua driver drives
 * them (lua/clientpool/fleetlink.lua): the fleet's cap across engines,
 * EV_BLOCKED and clientpool_blocked, the retry after a give elsewhere, the
 * fleet's max_idle, rebalance (BY_SHED), the fleet's gates and validity, and every unit
 * given back when an engine is freed.  After every wrapped call
 * clientpool_check (fl_check) compares the engine with its member's
 * shares; here each handle has one engine, so they must be equal.
 */
#include "test_engine.h"
#include "fleet.h"

#include <unistd.h>

static char g_fname[64];
static clientpool_fleet_t *g_fh[2];
static int32_t g_min_idle;            /* the next fleet_up's min_idle */

/* A fresh fleet with these limits, and `n` joined handles on it. */
static void fleet_up(int32_t max_live, int32_t max_idle, int n) {
  clientpool_fleet_limits_t lim;
  char err[200];
  int i;
  memset(&lim, 0, sizeof lim);
  lim.max_live = max_live;
  lim.max_idle = max_idle;
  lim.min_idle = g_min_idle;
  lim.max_concurrency = 1 << 30;
  lim.key_max_live = -1;
  lim.key_max_idle = -1;
  lim.max_keys = 16;
  lim.members = 8;
  lim.attempts = 3;
  snprintf(g_fname, sizeof g_fname, "ctest-engine-%ld-%u", (long)getpid(), (unsigned)rng_u32());
  for (i = 0; i < n; i++) {
    g_fh[i] = NULL;
    if (clientpool_fleet_open(g_fname, strlen(g_fname), &lim, &g_fh[i], err, sizeof err) < 0)
      fail_at(__FILE__, __LINE__, "fleet open: %s", err);
    CHECK_EQ(clientpool_fleet_join(g_fh[i]), 0);
  }
}

static void fleet_down(int n) {
  int i;
  for (i = 0; i < n; i++) { clientpool_fleet_close(g_fh[i]); g_fh[i] = NULL; }
  clientpool_fleet_remove(g_fname, strlen(g_fname), NULL, 0);
}

/* A pool of config c on handle i, its default key given its fleet slot. */
static clientpool_t *fleet_pool(clientpool_config_t c, int i, int32_t *key) {
  clientpool_t *p = POOL(c);
  int32_t slot;
  CHECK_EQ(clientpool_set_fleet(p, g_fh[i], 0), 0);
  *key = UKEY(p);
  slot = clientpool_fleet_key_open(g_fh[i], "", 0);
  CHECK(slot >= 0);
  CHECK_EQ(clientpool_key_fleet(p, *key, slot), 0);
  return p;
}

/* The member's shares equal what its only engine holds. */
static void same_as_row(clientpool_t *p, int i) {
  clientpool_stats_t s = pstats(p);
  CHECK_EQ(clientpool_fleet_held(g_fh[i], CLIENTPOOL_FLEET_LIVE, -1), s.live + s.creating + s.closing);
  CHECK_EQ(clientpool_fleet_held(g_fh[i], CLIENTPOOL_FLEET_IDLE, -1), s.idle);
}

static void t_fleet_cap_across_engines(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *a, *b;
  int32_t ka, kb;
  hold_t h[3];
  clientpool_grant_t g;
  int i;
  fleet_up(3, 3, 2);
  c.max_live = 3;                     /* each engine alone could hold 3 */
  c.max_idle = 3;
  c.max_concurrency = 3;
  a = fleet_pool(c, 0, &ka);
  b = fleet_pool(c, 1, &kb);
  for (i = 0; i < 3; i++) h[i] = NEW_LEASE(a, ka, 1);
  same_as_row(a, 0);
  CHECK_EQ(clientpool_fleet_count(g_fh[0], CLIENTPOOL_FLEET_LIVE, -1), 3);
  /* b is refused by the fleet: its caller waits, the driver is told */
  MUST_WAIT(b, kb, 2);
  waiter_h w = WAIT(b, kb, -1, 2);
  drain(b);
  CHECK_EQ(n_events(CLIENTPOOL_EV_BLOCKED), 1);
  CHECK(g_ev[find_ev(CLIENTPOOL_EV_BLOCKED, -1, -1, -1)].a & CLIENTPOOL_BLOCKED_LIVE);
  CHECK_EQ(clientpool_blocked(b, CLIENTPOOL_FLEET_LIVE, -1), 1);
  CHECK(clientpool_fleet_demand(g_fh[1], CLIENTPOOL_FLEET_LIVE, -1, 1) > 0);
  /* a retry with nothing freed: still blocked, announced again */
  clientpool_retry(b, 3);
  after(b, __FILE__, __LINE__, "retry");
  drain(b);
  CHECK_EQ(n_events(CLIENTPOOL_EV_BLOCKED), 1);
  EXPECT_NO_WAKE(w);
  /* a releases one for reuse while b waits and a holds more than its fair
   * share (ceil(3 / 2 members)): it goes back to the fleet (BY_SHED); once
   * its destroy is reported the unit is b's */
  RELEASE(a, h[0], 4);
  drain(a);
  CHECK_EQ(g_evby[CLIENTPOOL_BY_SHED], 1);
  same_as_row(a, 0);
  CHECK_EQ(clientpool_fleet_count(g_fh[0], CLIENTPOOL_FLEET_LIVE, -1), 2);
  clientpool_retry(b, 5);
  after(b, __FILE__, __LINE__, "retry");
  drain(b);
  EXPECT_WAKE(w);
  CHECK_STATUS(CLAIM(b, w, 5, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK_EQ(CREATED(b, g.record, 1, 5), 0);
  same_as_row(b, 1);
  CHECK_EQ(clientpool_fleet_count(g_fh[0], CLIENTPOOL_FLEET_LIVE, -1), 3);
  /* nobody waits: a release keeps its client idle */
  clientpool_fleet_demand(g_fh[1], CLIENTPOOL_FLEET_LIVE, -1, 0);
  RELEASE(a, h[1], 6);
  drain(a);
  CHECK_EQ(g_evby[CLIENTPOOL_BY_SHED], 0);
  CHECK_EQ(pstats(a).idle, 1);
  same_as_row(a, 0);
  RELEASE_AS(a, h[2], CLIENTPOOL_BY_ERROR, 6);
  same_as_row(a, 0);
  clientpool_fleet_demand(g_fh[1], CLIENTPOOL_FLEET_LIVE, -1, 0);
  /* freeing the engines gives everything back */
  free_pool(a);
  free_pool(b);
  CHECK_EQ(clientpool_fleet_count(g_fh[0], CLIENTPOOL_FLEET_LIVE, -1), 0);
  CHECK_EQ(clientpool_fleet_count(g_fh[0], CLIENTPOOL_FLEET_IDLE, -1), 0);
  CHECK_EQ(clientpool_fleet_held(g_fh[1], CLIENTPOOL_FLEET_LIVE, -1), 0);
  fleet_down(2);
}

static void t_fleet_max_idle_and_shed(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *a, *b;
  int32_t ka, kb;
  hold_t h[3];
  clientpool_grant_t g;
  fleet_up(2, 1, 2);
  c.max_live = 2;
  c.max_idle = 2;                     /* the fleet's max_idle (1) is lower */
  c.max_concurrency = 2;
  a = fleet_pool(c, 0, &ka);
  b = fleet_pool(c, 1, &kb);
  h[0] = NEW_LEASE(a, ka, 1);
  h[1] = NEW_LEASE(a, ka, 1);
  RELEASE(a, h[0], 2);
  drain(a);
  RELEASE(a, h[1], 2);                /* over the fleet's max_idle: destroyed */
  drain(a);
  CHECK_EQ(g_evby[CLIENTPOOL_BY_MAX_IDLE], 1);
  same_as_row(a, 0);
  CHECK_EQ(pstats(a).idle, 1);
  h[2] = REUSE(a, ka, 3, NULL);       /* a holds the fleet's 2, both leased */
  h[0] = NEW_LEASE(a, ka, 3);
  /* b waits, posts its demand; a's rebalance sheds what is above its share */
  MUST_WAIT(b, kb, 4);
  waiter_h w = WAIT(b, kb, -1, 4);
  drain(b);
  clientpool_fleet_demand(g_fh[1], CLIENTPOOL_FLEET_LIVE, -1, clientpool_blocked(b, CLIENTPOOL_FLEET_LIVE, -1));
  RELEASE(a, h[2], 5);                /* a release while b waits and a holds more than 1: shed */
  drain(a);
  CHECK_EQ(g_evby[CLIENTPOOL_BY_SHED], 1);
  same_as_row(a, 0);
  clientpool_retry(b, 5);
  after(b, __FILE__, __LINE__, "retry");
  drain(b);
  EXPECT_WAKE(w);
  CHECK_STATUS(CLAIM(b, w, 5, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK_EQ(CREATED(b, g.record, 1, 5), 0);
  clientpool_fleet_demand(g_fh[1], CLIENTPOOL_FLEET_LIVE, -1, 0);
  RELEASE(a, h[0], 6);
  /* an idle client of a, nobody waiting: rebalance sheds nothing */
  CHECK_EQ(clientpool_rebalance(a, 7), 0);
  after(a, __FILE__, __LINE__, "rebalance");
  same_as_row(a, 0);
  same_as_row(b, 1);
  free_pool(a);
  free_pool(b);
  CHECK_EQ(clientpool_fleet_count(g_fh[0], CLIENTPOOL_FLEET_LIVE, -1), 0);
  fleet_down(2);
}

static void t_fleet_rebalance_idle(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *a, *b;
  int32_t ka, kb, n;
  hold_t h[4];
  waiter_h w[2];
  int i;
  fleet_up(4, 4, 2);
  a = fleet_pool(c, 0, &ka);
  b = fleet_pool(c, 1, &kb);
  for (i = 0; i < 4; i++) h[i] = NEW_LEASE(a, ka, 1);
  for (i = 0; i < 4; i++) RELEASE(a, h[i], 2);
  CHECK_EQ(pstats(a).idle, 4);
  for (i = 0; i < 2; i++) { MUST_WAIT(b, kb, 3); w[i] = WAIT(b, kb, -1, 3); }
  drain(b);
  CHECK_EQ(clientpool_blocked(b, CLIENTPOOL_FLEET_LIVE, -1), 2);
  clientpool_fleet_demand(g_fh[1], CLIENTPOOL_FLEET_LIVE, -1, 2);
  n = clientpool_rebalance(a, 4);     /* the driver's tick: down to ceil(4 / 2 members) */
  after(a, __FILE__, __LINE__, "rebalance");   /* (their destroys reported) */
  CHECK_EQ(n, 2);
  drain(a);
  CHECK_EQ(g_evby[CLIENTPOOL_BY_SHED], 2);
  same_as_row(a, 0);
  clientpool_retry(b, 4);
  after(b, __FILE__, __LINE__, "retry");
  drain(b);
  EXPECT_WAKE(w[0]);
  EXPECT_WAKE(w[1]);
  free_pool(a);
  free_pool(b);
  fleet_down(2);
}

/* The fleet's warm floor is kept once: a member whose refill was refused
 * (the floor met by another) refills at its tick once that other member's
 * idle clients are gone (here its engine freed: as a reclaim of a dead
 * member gives them back), not only after a give of its own. */
static void t_fleet_floor_after_holder_gone(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *a, *b;
  int32_t ka, kb, kk, r, i;
  g_min_idle = 2;
  fleet_up(4, 4, 2);
  g_min_idle = 0;
  c.max_live = 4; c.max_idle = 4; c.min_idle = 2;
  a = fleet_pool(c, 0, &ka);
  b = fleet_pool(c, 1, &kb);
  CHECK_EQ(KEY_PIN(a, ka, 2), 0);
  CHECK_EQ(KEY_PIN(b, kb, 2), 0);
  clientpool_floor(a, 1, 0);
  for (i = 0; i < 2; i++) {
    r = clientpool_refill(a, 0, &kk);
    CHECK(r >= 0 && kk == ka);
    CHECK_EQ(CREATED(a, r, 1, 0), 0);
  }
  CHECK_EQ(clientpool_refill(a, 0, &kk), -1);
  drain(a);
  CHECK_EQ(clientpool_fleet_count(g_fh[0], CLIENTPOOL_FLEET_IDLE, -1), 2);
  /* b's floor is the fleet's: met by a */
  clientpool_floor(b, 1, 0);
  CHECK_EQ(clientpool_refill(b, 0, &kk), -1);
  drain(b);
  clientpool_rebalance(b, 1);         /* (a tick while it is met: nothing) */
  after(b, __FILE__, __LINE__, "rebalance");
  drain(b);
  CHECK_EQ(n_events(CLIENTPOOL_EV_REFILL), 0);
  CHECK_EQ(clientpool_refill(b, 1, &kk), -1);
  drain(b);
  free_pool(a);                       /* a's idle clients gone */
  CHECK_EQ(clientpool_fleet_count(g_fh[0], CLIENTPOOL_FLEET_IDLE, -1), 0);
  clientpool_rebalance(b, 2);         /* b's tick: the floor is short again */
  after(b, __FILE__, __LINE__, "rebalance");
  drain(b);
  CHECK_EQ(n_events(CLIENTPOOL_EV_REFILL), 1);
  for (i = 0; i < 2; i++) {
    r = clientpool_refill(b, 2, &kk);
    CHECK(r >= 0 && kk == kb);
    CHECK_EQ(CREATED(b, r, 1, 2), 0);
  }
  CHECK_EQ(clientpool_refill(b, 2, &kk), -1);
  drain(b);
  same_as_row(b, 1);
  CHECK_EQ(clientpool_fleet_count(g_fh[1], CLIENTPOOL_FLEET_IDLE, -1), 2);
  free_pool(b);
  fleet_down(2);
}

static void t_fleet_gates(void) {
  clientpool_config_t c = cfg_base();
  int32_t ka;
  clientpool_grant_t g;
  char reason[130];
  fleet_up(2, 2, 1);
  c.pause_fail = 1;
  clientpool_t *a = fleet_pool(c, 0, &ka);
  CHECK_EQ(clientpool_fleet_pause(g_fh[0], NULL, 0, "maintenance", 11, -1), 0);
  /* the engine sees the gates moved at an acquire and tells the driver */
  NEW_LEASE(a, ka, 1);
  drain(a);
  CHECK_EQ(n_events(CLIENTPOOL_EV_GATES), 1);
  CHECK_EQ(clientpool_fleet_gate(g_fh[0], -1, reason, sizeof reason, NULL), 1);
  CHECK(strcmp(reason, "maintenance") == 0);
  CHECK_EQ(clientpool_gate_fleet(a, -1, 1, 2), 0);
  CHECK_STATUS(ACQUIRE(a, ka, 2, &g), CLIENTPOOL_PAUSED);
  /* the pool's own resume does not open the fleet's gate */
  CHECK_EQ(clientpool_resume(a, -1, 0, 2), 0);
  CHECK_STATUS(ACQUIRE(a, ka, 2, &g), CLIENTPOOL_PAUSED);
  CHECK_EQ(clientpool_fleet_resume(g_fh[0], NULL, 0), 0);
  CHECK_EQ(clientpool_gate_fleet(a, -1, 0, 3), 0);
  CHECK_STATUS(ACQUIRE(a, ka, 3, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK_EQ(CREATED(a, g.record, 1, 3), 0);
  free_pool(a);
  fleet_down(1);
}

/* The fleet's validity (clientpool_fleet_set_valid, a Redis fleet's lease
 * written by its agent, possibly another process): past the deadline the
 * engine grants nothing (its callers wait, pause_fail or not), closes a
 * released client instead of keeping it idle and its idle ones at the
 * driver's tick; moving the deadline reopens the gate (gates_gen moved)
 * and the next call serves the waiter.  No deadline: no gate. */
static void t_fleet_validity(void) {
  clientpool_config_t c = cfg_base();
  clientpool_t *a;
  int32_t ka;
  hold_t h[2];
  clientpool_grant_t g;
  waiter_h w;
  uint64_t gen;
  fleet_up(4, 4, 2);
  c.max_live = 4; c.max_idle = 4; c.max_concurrency = 4;
  c.pause_fail = 1;
  a = fleet_pool(c, 0, &ka);
  CHECK_EQ(clientpool_fleet_lapsed(g_fh[0]), 0);      /* none set: never lapsed */
  CHECK(clientpool_fleet_valid_until(g_fh[0]) < 0);
  h[0] = NEW_LEASE(a, ka, 1);
  h[1] = NEW_LEASE(a, ka, 1);
  RELEASE(a, h[0], 2);
  CHECK_EQ(pstats(a).idle, 1);
  /* a deadline ahead: open */
  CHECK_EQ(clientpool_fleet_set_valid(g_fh[1], clientpool_monotime() + 3600), 0);
  CHECK_EQ(clientpool_fleet_lapsed(g_fh[0]), 0);
  CHECK(clientpool_fleet_valid_until(g_fh[0]) > clientpool_monotime() + 3000);
  h[0] = REUSE(a, ka, 3, NULL);
  RELEASE(a, h[0], 3);
  /* the deadline passed (written through the other member's handle): an
   * idle client is there, yet the caller waits (not PAUSED: a lapse is
   * not a pause) */
  gen = clientpool_fleet_gates_gen(g_fh[0]);
  CHECK_EQ(clientpool_fleet_set_valid(g_fh[1], clientpool_monotime() - 1), 0);
  CHECK_EQ(clientpool_fleet_lapsed(g_fh[0]), 1);
  CHECK_EQ(clientpool_fleet_gates_gen(g_fh[0]), gen);  /* (closing moves nothing) */
  MUST_WAIT(a, ka, 4);
  w = WAIT(a, ka, -1, 4);
  drain(a);
  EXPECT_NO_WAKE(w);
  CHECK_EQ(clientpool_blocked(a, CLIENTPOOL_FLEET_LIVE, -1), 0);   /* (no demand posted for it) */
  /* a release is not kept idle nor handed to the waiter: closed */
  RELEASE(a, h[1], 5);
  drain(a);
  EXPECT_NO_WAKE(w);
  CHECK_EQ(g_evby[CLIENTPOOL_BY_MAX_IDLE], 1);
  CHECK_EQ(pstats(a).idle, 1);
  /* the driver's tick closes the idle one */
  CHECK_EQ(clientpool_rebalance(a, 6), 1);
  after(a, __FILE__, __LINE__, "rebalance");
  drain(a);
  EXPECT_NO_WAKE(w);
  CHECK_EQ(pstats(a).idle, 0);
  CHECK_EQ(pstats(a).live, 0);
  same_as_row(a, 0);
  CHECK_EQ(clientpool_fleet_count(g_fh[0], CLIENTPOOL_FLEET_LIVE, -1), 0);
  /* renewed: gates_gen moved, the next call serves the waiter */
  CHECK_EQ(clientpool_fleet_set_valid(g_fh[1], clientpool_monotime() + 3600), 0);
  CHECK_EQ(clientpool_fleet_lapsed(g_fh[0]), 0);
  CHECK(clientpool_fleet_gates_gen(g_fh[0]) != gen);
  clientpool_retry(a, 7);
  after(a, __FILE__, __LINE__, "retry");
  drain(a);
  EXPECT_WAKE(w);
  CHECK_STATUS(CLAIM(a, w, 7, &g), CLIENTPOOL_GRANT_CREATE);
  CHECK_EQ(CREATED(a, g.record, 1, 7), 0);
  h[0] = hold_of(&g);
  RELEASE(a, h[0], 8);
  CHECK_EQ(pstats(a).idle, 1);
  /* cleared: no gate; a NaN is refused and changes nothing */
  CHECK_EQ(clientpool_fleet_set_valid(g_fh[1], -1), 0);
  CHECK(clientpool_fleet_valid_until(g_fh[0]) < 0);
  CHECK_EQ(clientpool_fleet_set_valid(g_fh[1], 0.0 / 0.0), CLIENTPOOL_FLEET_EINVAL);
  CHECK(clientpool_fleet_valid_until(g_fh[0]) < 0);
  CHECK_EQ(clientpool_fleet_set_valid(NULL, 1), CLIENTPOOL_FLEET_EINVAL);
  h[0] = REUSE(a, ka, 9, NULL);
  RELEASE(a, h[0], 9);
  same_as_row(a, 0);
  free_pool(a);
  fleet_down(2);
}

static void t_fleet_refusals(void) {
  clientpool_config_t c = cfg_base();
  fleet_up(2, 2, 1);
  clientpool_t *a = POOL(c);
  CHECK_EQ(clientpool_set_fleet(a, NULL, 0), CLIENTPOOL_EINVAL);
  CHECK_EQ(clientpool_key_fleet(a, 0, 0), CLIENTPOOL_EINVAL);     /* no fleet */
  CHECK_EQ(clientpool_blocked(a, CLIENTPOOL_FLEET_LIVE, -1), 0);
  CHECK_EQ(clientpool_retry(a, 1), 0);
  CHECK_EQ(clientpool_rebalance(a, 1), 0);
  CHECK_EQ(clientpool_gate_fleet(a, -1, 1, 1), CLIENTPOOL_EINVAL);
  int32_t k = UKEY(a);
  CHECK_EQ(clientpool_set_fleet(a, g_fh[0], 0), CLIENTPOOL_EINVAL);   /* a key is open already */
  (void)k;
  free_pool(a);
  fleet_down(1);
}

const test_t tests_fleet[] = {
  /* 30 the fleet */
  T(t_fleet_cap_across_engines),
  T(t_fleet_max_idle_and_shed),
  T(t_fleet_rebalance_idle),
  T(t_fleet_floor_after_holder_gone),
  T(t_fleet_gates),
  T(t_fleet_validity),
  T(t_fleet_refusals),
  { NULL, NULL }
};
