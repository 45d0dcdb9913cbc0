/*
 * count_clock.c - an LD_PRELOAD wrapper that counts the process's
 * clock_gettime calls and prints them per handoff at exit (HANDOFFS=N), for
 * bench/b2_count.lua (docs/performance.md "The handoff, counted"). Not part
 * of the module.
 *
 *   cc -O2 -shared -fPIC -o build/bench/count_clock.so bench/c/count_clock.c -ldl
 *   LD_PRELOAD=build/bench/count_clock.so HANDOFFS=20000 lua5.4 bench/b2_count.lua lease 20000
 *
 * (b2_count.lua runs the handoffs twice, timed then counted: divide by two.)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static unsigned long calls;   /* (a process-wide count is the point here) */
static int (*real_clock_gettime)(clockid_t, struct timespec *);

int clock_gettime(clockid_t id, struct timespec *ts) {
  if (!real_clock_gettime) *(void **)&real_clock_gettime = dlsym(RTLD_NEXT, "clock_gettime");
  calls++;
  return real_clock_gettime(id, ts);
}

__attribute__((destructor)) static void report(void) {
  const char *h = getenv("HANDOFFS");
  if (h && atof(h) > 0) fprintf(stderr, "clock_gettime calls per handoff: %.3f\n", (double)calls / atof(h));
}
