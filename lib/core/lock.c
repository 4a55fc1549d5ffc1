/* The slow half of tally's lock (the fast half is inline in internal.h):
 * spin briefly, then sleep on a futex. State 2 means "held, and someone may
 * be asleep", so the holder knows to wake one waiter on release. */
#include "core/internal.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

void tally__mutex_wait(tally_mutex_t *m)
{
    for (int spin = 0; spin < 100; spin++) {
        int expected = 0;
        if (atomic_load_explicit(&m->state, memory_order_relaxed) == 0 &&
            atomic_compare_exchange_weak_explicit(&m->state, &expected, 1, memory_order_acquire,
                                                  memory_order_relaxed))
            return;
        tally__cpu_relax();
    }
    /* Mark the lock contended, then sleep until it is released. */
    while (atomic_exchange_explicit(&m->state, 2, memory_order_acquire) != 0)
        syscall(SYS_futex, &m->state, FUTEX_WAIT_PRIVATE, 2, NULL, NULL, 0);
}

void tally__mutex_wake(tally_mutex_t *m)
{
    syscall(SYS_futex, &m->state, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}
