/*
 * whitebox.h - the engine compiled for tests (spec/c/whitebox.c): the same
 * csrc/engine.c, plus allocation-failure injection and read/write access to
 * a few internals.  The C test runner and the fuzz harness link it instead of
 * csrc/engine.c; the Lua module never does (except the coverage build, where
 * the injection stays disarmed).
 */
#ifndef CLIENTPOOL_WHITEBOX_H
#define CLIENTPOOL_WHITEBOX_H

#include "engine.h"

/* ---- allocation failures ----------------------------------------------
 * wb_alloc_fail(n): the n-th allocation (malloc, calloc or realloc) from
 * now fails, the others succeed; n <= 0 disarms.  wb_alloc_fail_all(1): every
 * allocation fails until wb_alloc_fail_all(0).  wb_allocs() counts the
 * allocations the engine made. */
void wb_alloc_fail(long n);
void wb_alloc_fail_all(int on);
long wb_allocs(void);

/* ---- the engine's fast path (csrc/engine.c, "the fast path") -----------
 * wb_fast_path(p, 0): every call takes the general path (the fast path
 * is on by default); the fuzz harness runs half its inputs each way. */
void wb_fast_path(clientpool_t *p, int on);

/* ---- reading ---------------------------------------------------------- */
enum { WB_FREE = 0, WB_CREATING, WB_IDLE, WB_LEASED, WB_CLOSING, WB_CHECKING };   /* record states */
int wb_rec_state(const clientpool_t *p, int32_t r);
int wb_rec_nleases(const clientpool_t *p, int32_t r);
int wb_rec_retire(const clientpool_t *p, int32_t r);
int wb_rec_doomed(const clientpool_t *p, int32_t r);
int32_t wb_rec_key(const clientpool_t *p, int32_t r);
int32_t wb_lease_record(const clientpool_t *p, int32_t l);
int32_t wb_nrec(const clientpool_t *p);
int32_t wb_span(const clientpool_t *p);                 /* the largest slot array */
int wb_keys_used(const clientpool_t *p);
/* the closing records (destroy started, not reported done): up to n in out;
 * returns how many there are */
int32_t wb_closing(const clientpool_t *p, int32_t *out, int32_t n);
/* what a waiter holds: PENDING while queued, else its result and grant */
void wb_waiter(const clientpool_t *p, int32_t w, int *result, int32_t *rec, int32_t *lease, uint32_t *lgen);

/* what holds each key that is in use, on stderr (a failure's context) */
void wb_dump_keys(const clientpool_t *p);

/* ---- corrupting (tests of clientpool_check) ---------------------------
 * Applies corruption `what` (0 .. WB_CORRUPTIONS - 1) to a pool in the shape
 * wb_corrupt documents, and returns the text clientpool_check must report,
 * or NULL if the pool lacks what the corruption needs. */
#define WB_CORRUPTIONS 54
const char *wb_corrupt(clientpool_t *p, int what);

#endif
