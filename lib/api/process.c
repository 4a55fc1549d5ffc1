/* The process's two edges, which reach across every layer: its exit and
 * its forks.
 *
 * Exit: the JSON report (report_path), the leak report (leak_report) and the
 * leak exit code (leak_exitcode). They are written by a library destructor,
 * so after the program's atexit handlers and after Python's finalisation;
 * it reads only tally's own metadata and never calls the backend (CUDA may
 * be gone). Metadata is never torn down, so frees that arrive later still
 * work.
 *
 * Fork: pthread_atfork handlers, so that a child forked while other threads
 * were inside tally starts with every lock free and a consistent state.
 * prepare takes every lock of the library in the documented lock order
 * (lib/core/internal.h: stage, config, each device in turn (through the
 * futex lock, revoking any other thread's bias), names, site, Python
 * frames, host backend, sink, heap; the private tags' lock after the
 * devices). No other thread ever holds two device locks, so holding all of
 * them here cannot deadlock; once prepare returns, no other thread is
 * half-way through changing tally's state. The parent then releases them in
 * reverse order; the child, whose only thread is the one that forked,
 * resets them (their waiters are not in the child).
 *
 * The child also:
 *  - notes each device's allocation count at fork: blocks numbered up to it
 *    were inherited from the parent and are left out of its leak report
 *    (the parent reports them, or frees them; a child reporting them too
 *    would count every block once per worker);
 *  - with a device backend started in the parent (cuda, async), refuses any
 *    further use of the backend with one line (api.c): CUDA state does not
 *    survive fork. The host backend keeps working (its segments are private
 *    copies of the parent's mappings).
 * The handlers are registered once, at the library's first use (api.c's
 * option loading), before any lock can be held. */
#include "api/api.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

/* ---- exit ---------------------------------------------------------------- */

static _Atomic int exit_registered, exit_done;

void tally__exit_register(void)
{
    atomic_store(&exit_registered, 1);
}

int tally__exit_report(void)
{
    if (!atomic_load(&exit_registered) || atomic_exchange(&exit_done, 1))
        return 0;
    char path[512];
    tally__opt_string(tally__opt.report_path, path);
    if (path[0])
        tally_write_report(path);
    int leak_report = TALLY_OPT(leak_report), leak_exitcode = TALLY_OPT(leak_exitcode);
    uint64_t blocks = 0, bytes = 0;
    tally_out_t o;
    tally__out_init(&o, tally__sink_writer, NULL);
    if (leak_report != TALLY_LEAK_OFF || leak_exitcode) {
        tally_out_t quiet;
        tally__out_init(&quiet, NULL, NULL);
        bytes = tally__report_leaks(leak_report == TALLY_LEAK_OFF ? &quiet : &o, leak_report == TALLY_LEAK_FULL, true,
                                    &blocks);
        tally__out_flush(&o);
    }
    return bytes && leak_exitcode ? leak_exitcode : 0;
}

__attribute__((destructor)) static void at_exit(void)
{
    int code = tally__exit_report();
    if (code) {
        fflush(NULL);
        _exit(code);
    }
}

/* ---- fork ---------------------------------------------------------------- */

static int locked_devices;

static void prepare(void)
{
    tally__mutex_lock(tally__stage_lock());
    tally__mutex_lock(tally__config_lock());
    /* Initialisation runs under the config lock: the device table is fixed
     * from here until the handlers release it. */
    locked_devices = tally__g.ndev;
    for (int i = 0; i < locked_devices; i++)
        tally__devlock_slow(&tally__g.dev[i]->lock);
    tally__mutex_lock(tally__private_lock());
    tally__mutex_lock(tally__names_lock());
    tally__mutex_lock(tally__site_lock());
    tally__mutex_lock(tally__pystack_lock());
    tally__mutex_lock(tally__host_lock());
    tally__mutex_lock(tally__sink_lock());
    tally__mutex_lock(tally__heap_lock());
}

static void parent(void)
{
    tally__mutex_unlock(tally__heap_lock());
    tally__mutex_unlock(tally__sink_lock());
    tally__mutex_unlock(tally__host_lock());
    tally__mutex_unlock(tally__pystack_lock());
    tally__mutex_unlock(tally__site_lock());
    tally__mutex_unlock(tally__names_lock());
    tally__mutex_unlock(tally__private_lock());
    for (int i = locked_devices - 1; i >= 0; i--)
        tally__dev_unlock(&tally__g.dev[i]->lock);
    tally__mutex_unlock(tally__config_lock());
    tally__mutex_unlock(tally__stage_lock());
}

/* A lock of the child's copy: free, with no waiters (they stayed behind). */
static void reset(tally_mutex_t *m)
{
    atomic_store_explicit(&m->state, 0, memory_order_relaxed);
}

static void child(void)
{
    for (int i = 0; i < locked_devices; i++) {
        tally__g.dev[i]->inherited_seq = tally__g.dev[i]->seq;
        tally__devlock_reset(&tally__g.dev[i]->lock);
    }
    tally__bias_after_fork();
    reset(tally__heap_lock());
    reset(tally__sink_lock());
    reset(tally__host_lock());
    reset(tally__pystack_lock());
    reset(tally__site_lock());
    reset(tally__names_lock());
    reset(tally__private_lock());
    reset(tally__config_lock());
    reset(tally__stage_lock());
    tally__after_fork_child();
}

static pthread_once_t handlers_registered = PTHREAD_ONCE_INIT;

static void register_handlers(void)
{
    pthread_atfork(prepare, parent, child);
}

void tally__fork_register(void)
{
    pthread_once(&handlers_registered, register_handlers);
}
