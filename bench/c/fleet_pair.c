/*
 * bench/c/fleet_pair.c - what the fleet adds to the engine's hot path, in C,
 * no Lua: an idle acquire+release pair of the engine alone, and the same
 * pair with the four fleet calls docs/fleet.md's integration plan puts on
 * it (acquire: give IDLE, take LEASE; release: give LEASE, take IDLE), in
 * one process, then with a second process doing the same on the same
 * segment (the counters' cache lines move between cores).  A diagnostic for
 * B7 (`make bench` prints it); ratios are what to read, the machine is
 * shared.
 */
#define _POSIX_C_SOURCE 200809L
#include "clientpool.h"
#include "fleet.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The fastest of 15 runs of n pairs, in ns per pair; f == NULL: the engine alone. */
static double pairs(clientpool_t *p, int32_t k, clientpool_fleet_t *f, int32_t fk, long n) {
  double best = 1e30;
  int run;
  for (run = 0; run < 15; run++) {
    clientpool_grant_t g;
    double t0 = cpu_now(), t;
    long i;
    for (i = 0; i < n; i++) {
      clientpool_acquire(p, k, 1.0, &g);
      if (f) {
        clientpool_fleet_give(f, CLIENTPOOL_FLEET_IDLE, fk);
        clientpool_fleet_take(f, CLIENTPOOL_FLEET_LEASE, fk);
      }
      clientpool_release(p, g.lease, g.lease_gen, -1, 1.0);
      if (f) {
        clientpool_fleet_give(f, CLIENTPOOL_FLEET_LEASE, fk);
        clientpool_fleet_take(f, CLIENTPOOL_FLEET_IDLE, fk);
      }
    }
    t = (cpu_now() - t0) / (double)n * 1e9;
    if (t < best) best = t;
  }
  return best;
}

static clientpool_t *engine(int32_t *k) {
  clientpool_config_t c;
  clientpool_t *p;
  clientpool_grant_t g;
  memset(&c, 0, sizeof c);
  c.max_live = 16; c.max_idle = 16; c.max_concurrency = 16; c.max_waiting = 1024; c.capacity = 1;
  c.key_max_live = -1; c.key_max_idle = -1; c.max_keys = -1;
  c.idle_timeout = -1; c.max_lifetime = -1; c.validate_after_idle = -1; c.leak_threshold = -1;
  c.keepalive = -1;   /* (0 is refused: "none" is < 0) */
  if (clientpool_new(&c, &p) != CLIENTPOOL_OK) return NULL;
  *k = clientpool_key_open(p);
  clientpool_key_pin(p, *k, 1);
  clientpool_acquire(p, *k, 0, &g);
  clientpool_created(p, g.record, 1, 0);
  clientpool_release(p, g.lease, g.lease_gen, -1, 0);
  return p;
}

static clientpool_fleet_t *member(const char *name, const char *key, int32_t *fk) {
  clientpool_fleet_limits_t l;
  clientpool_fleet_t *f = NULL;
  memset(&l, 0, sizeof l);
  l.max_live = 1000; l.max_idle = 1000; l.min_idle = 0; l.max_concurrency = 1000;
  l.key_max_live = -1; l.key_max_idle = -1; l.max_keys = 16; l.members = 8; l.attempts = 3;
  if (clientpool_fleet_open(name, strlen(name), &l, &f, NULL, 0) < 0 || clientpool_fleet_join(f) != 0) return NULL;
  *fk = clientpool_fleet_key_open(f, key, strlen(key));
  clientpool_fleet_take(f, CLIENTPOOL_FLEET_LIVE, *fk);
  clientpool_fleet_take(f, CLIENTPOOL_FLEET_IDLE, *fk);   /* the engine's one idle client */
  return f;
}

/* A second process doing pairs on the same fleet until killed. */
static pid_t rival(const char *name, const char *key) {
  pid_t pid = fork();
  if (pid == 0) {
    int32_t k, fk;
    clientpool_t *p = engine(&k);
    clientpool_fleet_t *f = member(name, key, &fk);
    if (!p || !f) _exit(1);
    for (;;) pairs(p, k, f, fk, 100000);
  }
  return pid;
}

int main(void) {
  char name[64];
  int32_t k, fk;
  clientpool_t *p = engine(&k);
  clientpool_fleet_t *f;
  double alone, with, other_key, same_key;
  pid_t r;
  snprintf(name, sizeof name, "bench-pair-%d", (int)getpid());
  f = member(name, "k", &fk);
  if (!p || !f) { fprintf(stderr, "fleet_pair: setup failed\n"); return 1; }
  alone = pairs(p, k, NULL, -1, 200000);
  with = pairs(p, k, f, fk, 200000);
  r = rival(name, "other");
  clientpool_sleep(0.02);
  other_key = pairs(p, k, f, fk, 100000);
  kill(r, SIGKILL);
  waitpid(r, NULL, 0);
  clientpool_fleet_scan(f, 1);
  r = rival(name, "k");
  clientpool_sleep(0.02);
  same_key = pairs(p, k, f, fk, 100000);
  kill(r, SIGKILL);
  waitpid(r, NULL, 0);
  printf("  C.fleet_alone   engine idle acquire+release pair, no fleet            %8.1f ns\n", alone);
  printf("  C.fleet_pair    the same + 4 fleet calls (idle->lease->idle)          %8.1f ns  (x%.2f)\n", with, with / alone);
  printf("  C.fleet_rival   ... while another process does the same, another key %8.1f ns  (x%.2f)\n",
         other_key, other_key / alone);
  printf("  C.fleet_rival_k ... while another process does the same, same key    %8.1f ns  (x%.2f)\n",
         same_key, same_key / alone);
  clientpool_fleet_close(f);
  clientpool_fleet_remove(name, strlen(name), NULL, 0);
  clientpool_free(p);
  return 0;
}
