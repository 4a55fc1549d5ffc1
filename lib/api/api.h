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

/* sleep.c: private tags. At initialisation, the private_tags key (refused
 * with the reason on a backend without pages of its own); the number of
 * private tags; the private pool id (the tag) a tally_malloc on device goes
 * to, 0 for none, after refusing or waking a sleeping tag (sleep_alloc);
 * what a stage report says slept and woke. */
int tally__private_init_locked(const tally_backend_t *be, char *err, size_t errlen);
int tally__private_any(void);
/* The lock of the private tags' list and notes (fork.c takes it; never
 * held with a device lock; taken before the names and sink locks). */
tally_mutex_t *tally__private_lock(void);
int tally__private_for_alloc(int device, uint32_t *id);
void tally__private_note(uint32_t tag, bool slept, bool offload);
/* The sleeps and wakes since the innermost open stage began (its report). */
void tally__private_write_notes(tally_out_t *o, const char *stage);
/* A stage began: its report starts from here. */
void tally__private_stage_begin(void);

/* exit.c: the report file and the leak report at process exit. */
void tally__exit_register(void);
int tally__exit_report(void);

/* fork.c: registers the pthread_atfork handlers (once). api.c: in a forked
 * child, refuse a device backend the parent started. */
void tally__fork_register(void);
void tally__after_fork_child(void);

#endif
