/* coarse_lag.c - what CLOCK_MONOTONIC_COARSE would save and cost (issue 17,
 * docs/performance.md "The coarse clock"): the cost of a read of each
 * clock, the coarse clock's resolution (clock_getres), and how far it lags
 * CLOCK_MONOTONIC (read right after it) over a couple of seconds, as a
 * histogram in whole milliseconds. A diagnostic of the machine, printed by
 * `make bench`: absolute figures, no target. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <time.h>

static double read_clock(clockid_t c) {
  struct timespec t;
  clock_gettime(c, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ns per read of clock c, the fastest of 5 rounds */
static double cost(clockid_t c) {
  double best = 1e9;
  int round, i;
  for (round = 0; round < 5; round++) {
    volatile double sink = 0;
    double t0 = read_clock(CLOCK_MONOTONIC), ns;
    for (i = 0; i < 1000000; i++) sink += read_clock(c);
    ns = (read_clock(CLOCK_MONOTONIC) - t0) * 1e3;
    if (ns < best) best = ns;
  }
  return best;
}

int main(void) {
  enum { BINS = 64 };
  static long bins[BINS];
  struct timespec res;
  long n = 0, seen = 0;
  double worst = 0, end;
  int i, p50 = -1, p99 = -1;
  clock_getres(CLOCK_MONOTONIC_COARSE, &res);
  printf("clock read: CLOCK_MONOTONIC %.1f ns, CLOCK_MONOTONIC_COARSE %.1f ns\n", cost(CLOCK_MONOTONIC),
         cost(CLOCK_MONOTONIC_COARSE));
  end = read_clock(CLOCK_MONOTONIC) + 2;
  while (read_clock(CLOCK_MONOTONIC) < end) {
    for (i = 0; i < 100000; i++) {
      double coarse = read_clock(CLOCK_MONOTONIC_COARSE), lag = read_clock(CLOCK_MONOTONIC) - coarse;
      int b = (int)(lag * 1e3);
      if (lag > worst) worst = lag;
      bins[b < 0 ? 0 : b >= BINS ? BINS - 1 : b]++;
      n++;
    }
  }
  for (i = 0; i < BINS; i++) {
    seen += bins[i];
    if (p50 < 0 && seen * 2 >= n) p50 = i + 1;
    if (p99 < 0 && seen * 100 >= n * 99) p99 = i + 1;
  }
  printf("CLOCK_MONOTONIC_COARSE: resolution %.3f ms; lag behind CLOCK_MONOTONIC over 2 s (%ld reads): "
         "p50 < %d ms, p99 < %d ms, max %.3f ms\n", (double)res.tv_nsec * 1e-6, n, p50, p99, worst * 1e3);
  return 0;
}
