/* clock.c - the monotonic clock and sleep for drivers (the engine reads no
 * clock: it is handed the time). */
#define _POSIX_C_SOURCE 200809L
#include "clientpool.h"

#include <errno.h>
#include <time.h>

double clientpool_monotime(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void clientpool_sleep(double s) {
  struct timespec ts;
  if (!(s > 0)) return;
  ts.tv_sec = (time_t)s;
  ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}
