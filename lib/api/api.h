/* The API layer's own declarations: initialisation and the checked device
 * lookup that every public entry point starts with, and the process-wide
 * pieces (exit, fork) that reach across every layer. Lower layers never
 * include this header (tests/check_layers.sh). */
#ifndef TALLY_API_H
#define TALLY_API_H

#include "report/report.h"

/* Initialise once: options, backend, devices, the cache's hooks; returns 0
 * or the init error. */
int tally__ensure_init(void);
bool tally__is_initialised(void);
/* The device, initialising first; NULL with an error naming fn and the
 * number. */
tally_device_t *tally__device(int device, const char *fn);

/* exit.c: the report file and the leak report at process exit. */
void tally__exit_register(void);
int tally__exit_report(void);

/* fork.c: registers the pthread_atfork handlers (once). api.c: in a forked
 * child, refuse a device backend the parent started. */
void tally__fork_register(void);
void tally__after_fork_child(void);

#endif
