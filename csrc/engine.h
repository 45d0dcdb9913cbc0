/*
 * engine.h - engine entry points beyond the public ABI, for the C tests and
 * the fuzz harness.  The binding and the FFI use clientpool.h only.
 */
#ifndef CLIENTPOOL_ENGINE_H
#define CLIENTPOOL_ENGINE_H

#include "clientpool.h"

/* Checks every internal invariant (counts against the structures, budgets,
 * list and heap integrity).  Returns 0, or -1 with a description in buf. */
int clientpool_check(const clientpool_t *p, char *buf, size_t n);

#endif
