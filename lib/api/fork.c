/* fork: pthread_atfork handlers, so that a child forked while other threads
 * were inside tally starts with every lock free and a consistent state.
 *
 * prepare takes every lock of the library in the documented lock order
 * (lib/core/internal.h: stage, config, each device in turn (through the
 * futex lock, revoking any other thread's bias), names, site, Python
 * frames, host backend, sink, heap; the private tags' lock after the devices). No other thread ever holds two device locks, so
 * holding all of them here cannot deadlock; once prepare returns, no other
 * thread is half-way through changing tally's state. The parent then
 * releases them in reverse order; the child, whose only thread is the one
 * that forked, resets them (their waiters are not in the child).
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

static pthread_once_t registered = PTHREAD_ONCE_INIT;

static void register_handlers(void)
{
    pthread_atfork(prepare, parent, child);
}

void tally__fork_register(void)
{
    pthread_once(&registered, register_handlers);
}
