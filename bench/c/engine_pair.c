/*
 * bench/c/engine_pair.c - the engine alone, no Lua: what an acquire+release
 * pair costs in C, with and without a clock read per call, and through the
 * untimed entry points (issue 17).  A diagnostic for
 * docs/performance.md (`make bench` prints it): it bounds what any binding
 * can reach.
 */
#define _POSIX_C_SOURCE 200809L
#include "clientpool.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The fastest of 15 runs of n pairs, in ns per pair. */
static double pairs(clientpool_t *p, int32_t k, long n, int clock_each) {
  double best = 1e30;
  int run;
  for (run = 0; run < 15; run++) {
    clientpool_grant_t g;
    double t0 = cpu_now(), t;
    long i;
    for (i = 0; i < n; i++) {
      double now;
      if (clock_each == 2) {             /* the untimed entry points, as the bindings call them */
        if (clientpool_acquire_untimed(p, k, &g) != CLIENTPOOL_GRANT_IDLE)
          clientpool_acquire(p, k, clientpool_monotime(), &g);
        if (clientpool_release_untimed(p, g.lease, g.lease_gen, -1) == CLIENTPOOL_UNTIMED)
          clientpool_release(p, g.lease, g.lease_gen, -1, clientpool_monotime());
        continue;
      }
      now = clock_each ? clientpool_monotime() : 1.0;
      clientpool_acquire(p, k, now, &g);
      if (clock_each) now = clientpool_monotime();
      clientpool_release(p, g.lease, g.lease_gen, -1, now);
    }
    t = (cpu_now() - t0) / (double)n * 1e9;
    if (t < best) best = t;
  }
  return best;
}

static volatile double sink;   /* keeps the clock reads from being optimized out */

static double clock_reads(long n) {
  double best = 1e30;
  int run;
  for (run = 0; run < 15; run++) {
    double t0 = cpu_now(), t;
    long i;
    for (i = 0; i < n; i++) sink += clientpool_monotime();
    t = (cpu_now() - t0) / (double)n * 1e9;
    if (t < best) best = t;
  }
  return best;
}

int main(void) {
  clientpool_config_t c;
  clientpool_t *p;
  clientpool_grant_t g;
  int32_t k;
  memset(&c, 0, sizeof c);
  c.max_live = 16; c.max_idle = 16; c.max_concurrency = 16; c.max_waiting = 1024; c.capacity = 1;
  c.key_max_live = -1; c.key_max_idle = -1; c.max_keys = -1;
  c.idle_timeout = -1; c.max_lifetime = -1; c.validate_after_idle = -1; c.leak_threshold = -1;
  c.create_backoff = c.create_backoff_max = -1; c.keepalive = -1;
  if (clientpool_new(&c, &p) != CLIENTPOOL_OK) return 1;
  k = clientpool_key_open(p);
  clientpool_key_pin(p, k, 1);
  clientpool_acquire(p, k, 0, &g);
  clientpool_created(p, g.record, 1, 0);
  clientpool_release(p, g.lease, g.lease_gen, -1, 0);
  printf("  C.engine_pair   engine acquire+release pair in C, time given       %8.1f ns\n", pairs(p, k, 200000, 0));
  printf("  C.engine_clock  the same, CLOCK_MONOTONIC read for each call       %8.1f ns\n", pairs(p, k, 200000, 1));
  printf("  C.engine_untimed the same, the untimed calls (no duration option)  %8.1f ns\n", pairs(p, k, 200000, 2));
  printf("  C.clock         one clientpool_monotime() (CLOCK_MONOTONIC)        %8.1f ns\n", clock_reads(1000000));
  clientpool_free(p);
  return 0;
}
