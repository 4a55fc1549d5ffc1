/* The slow halves of tally's locks (the fast halves are inline in
 * internal.h): the futex lock every lock is built on, and the bias that lets
 * one thread skip a device's lock.
 *
 * The futex lock. Spin briefly, then sleep on the futex. State 2 means
 * "held, and someone may be asleep", so the holder knows to wake one waiter
 * on release.
 *
 * The bias.
 *
 * Why it is sound. The owner takes the lock by storing busy = 1, then
 * loading the futex word: if it is 0 (no one holds the futex lock) and the
 * lock is still biased to it, it is in. Another thread takes the futex lock
 * (a locked instruction, a full barrier on its side), then calls
 * membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED), which makes every running
 * thread of the process pass a full memory barrier before it returns (a
 * thread not running passes one when it is switched in), then loads the
 * owner's busy. Either the owner's load of the futex word came after its
 * barrier, and then it sees the word taken and backs off; or it came before,
 * and then its earlier busy store was visible by the time the barrier
 * returned, so the revoker sees busy = 1 and waits for the release store
 * that clears it. This is the asymmetric fence pattern of membarrier(2)'s
 * manual page: the rare side pays for the common one.
 *
 * Records. busy lives in a record per thread (tally_bias_t), never freed: a
 * revoker may read the record of a thread that has just exited. The lock
 * points at its owner's record, and the record names its thread by its
 * thread pointer (tally__thread_id): a thread finds that a lock is biased
 * to it with two loads and a register read, and no thread-local variable
 * (one in initial-exec model would make libtally.so need static TLS, which
 * a dlopen into a process that has used it up is refused). A thread's
 * record is found on the slow path by thread-specific data; at thread exit
 * its destructor clears the record's thread (before the thread pointer can
 * be reused) and puts it on a free list, and the next thread to earn a bias
 * takes it over, with any bias the dead thread still held: still one live
 * thread per record, so still one thread that may take those locks through
 * the bias.
 *
 * When to bias. A bias is earned by `need` takes in a row by one thread
 * through the slow path with no bias in place (64 at first). Revoking one
 * costs a membarrier (about 20 us on the 2-core VM, docs/benchmarks.md run
 * Q) and saves about 3 ns per take, so a bias revoked before it served
 * BIAS_PAYBACK takes did not pay for itself: then `need` grows fourfold (up
 * to BIAS_NEED_MAX), and one that did shrinks it by half. Two threads that
 * take turns on a device quickly thus settle on the plain futex lock, and
 * one thread that keeps a device to itself keeps its bias.
 *
 * Where the bias is off: lock_bias:false, a kernel or sandbox that refuses
 * membarrier's registration, and ThreadSanitizer builds (TSan cannot see the
 * ordering membarrier gives, and would report the fast path as a race). */
#include "core/internal.h"

#include <errno.h>
#include <linux/futex.h>
#include <linux/membarrier.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__SANITIZE_THREAD__)
#define TALLY_BIAS_OFF 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TALLY_BIAS_OFF 1
#endif
#endif

/* ---- the futex lock ------------------------------------------------------ */

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

/* ---- the bias ------------------------------------------------------------ */

enum { BIAS_NEED_FIRST = 64, BIAS_NEED_MAX = 1 << 20, BIAS_PAYBACK = 8192 };
/* The policy in force: the constants above, unless a test set its own. */
static uint32_t need_first = BIAS_NEED_FIRST;
static uint64_t payback = BIAS_PAYBACK;

/* 0 not tried, 1 registered, -1 refused (then never biased). */
static _Atomic int registered;
static tally_bias_t *spare;             /* records of exited threads; under the heap lock */
static pthread_key_t exit_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static bool key_made;
static _Atomic uint64_t n_grants, n_revokes;

void tally__devlock_init(tally_devlock_t *l)
{
    atomic_init(&l->m.state, 0);
    atomic_init(&l->owner, NULL);
    l->fast = 0;
    l->last = 0;
    l->streak = 0;
    l->need = need_first;
    l->served = 0;
}

static bool bias_usable(void)
{
#ifdef TALLY_BIAS_OFF
    return false;
#else
    if (!TALLY_OPT(lock_bias))
        return false;
    int r = atomic_load_explicit(&registered, memory_order_relaxed);
    if (r == 0) {
        r = syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0 ? 1 : -1;
        atomic_store_explicit(&registered, r, memory_order_relaxed);
    }
    return r == 1;
#endif
}

/* A thread with a record exits: the record, belonging to no thread, waits
 * for the next. The locks still biased to it stay so until another thread
 * revokes them or the record's next thread takes them. */
static void on_exit_thread(void *p)
{
    tally_bias_t *r = p;
    atomic_store_explicit(&r->thread, 0, memory_order_relaxed);
    tally__mutex_lock(tally__heap_lock());
    r->next = spare;
    spare = r;
    tally__mutex_unlock(tally__heap_lock());
}

static void make_key(void)
{
    key_made = pthread_key_create(&exit_key, on_exit_thread) == 0;
}

tally_bias_t *tally__bias_mine(void)
{
    return key_made ? pthread_getspecific(exit_key) : NULL;
}

/* The calling thread's record, made or taken over on its first bias; NULL
 * when none can be had (then the thread stays on the slow path). */
static tally_bias_t *self_record(void)
{
    pthread_once(&key_once, make_key);
    if (!key_made)
        return NULL;
    tally_bias_t *r = pthread_getspecific(exit_key);
    if (r)
        return r;
    tally__mutex_lock(tally__heap_lock());
    r = spare;
    if (r)
        spare = r->next;
    tally__mutex_unlock(tally__heap_lock());
    if (!r) {
        /* A cache line of its own: busy is written on every fast take. */
        _Static_assert(sizeof(tally_bias_t) <= 64, "a bias record fits its cache line");
        r = tally__meta_calloc(64);
        if (!r)
            return NULL;
    }
    if (pthread_setspecific(exit_key, r) != 0) {
        on_exit_thread(r);
        return NULL;
    }
    r->next = NULL;
    r->tag = TALLY_BIAS_TAG_UNSET; /* not this thread's tag yet (the ledger writes it) */
    atomic_store_explicit(&r->thread, tally__thread_id(), memory_order_relaxed);
    return r;
}

/* Wait for the owner to leave a lock it took through the bias: it holds it
 * for one cache operation, or for a driver call (milliseconds), so spin a
 * little, then yield, then sleep in growing steps. */
static void wait_idle(tally_bias_t *o)
{
    long ns = 1000;
    for (int i = 0; atomic_load_explicit(&o->busy, memory_order_acquire); i++) {
        if (i < 64) {
            tally__cpu_relax();
            continue;
        }
        if (i < 128) {
            sched_yield();
            continue;
        }
        struct timespec ts = {0, ns};
        nanosleep(&ts, NULL);
        if (ns < 1000000)
            ns *= 2;
    }
}

/* Called with the futex lock held and o, not the caller, the owner. */
static void take_from(tally_devlock_t *l, tally_bias_t *o)
{
    /* Registered before any grant, so this cannot fail with EPERM; EINTR is
     * not among its errors. */
    syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
    wait_idle(o);
    atomic_store_explicit(&l->owner, NULL, memory_order_relaxed);
    if (l->served < payback)
        l->need = l->need >= BIAS_NEED_MAX / 4 ? BIAS_NEED_MAX : l->need * 4;
    else if (l->need > need_first)
        l->need /= 2;
    atomic_fetch_add_explicit(&n_revokes, 1, memory_order_relaxed);
}

void tally__devlock_slow(tally_devlock_t *l)
{
    tally__mutex_lock(&l->m);
    tally_bias_t *o = atomic_load_explicit(&l->owner, memory_order_relaxed);
    uintptr_t self = tally__thread_id();
    if (o) {
        if (atomic_load_explicit(&o->thread, memory_order_relaxed) != self)
            take_from(l, o);
        return;
    }
    if (l->last != self) {
        l->last = self;
        l->streak = 0;
    }
    if (++l->streak < l->need || !bias_usable())
        return;
    tally_bias_t *me = self_record();
    if (!me)
        return;
    l->streak = 0;
    l->served = 0;
    /* Published by the futex unlock's release: a thread that then finds the
     * word 0 with its acquire load sees this store. */
    atomic_store_explicit(&l->owner, me, memory_order_relaxed);
    atomic_fetch_add_explicit(&n_grants, 1, memory_order_relaxed);
}

void tally__devlock_reset(tally_devlock_t *l)
{
    uint32_t need = l->need;
    tally__devlock_init(l);
    l->need = need ? need : need_first;
}

void tally__bias_after_fork(void)
{
    /* The child's one thread keeps its record; the other threads' records
     * are lost with them (a few bytes each; no lock points at them any more,
     * and none is handed out again, so a child thread that gets a dead
     * thread's thread pointer finds no bias). membarrier's registration is
     * made again before the child's first bias. */
    spare = NULL;
    atomic_store_explicit(&registered, 0, memory_order_relaxed);
}

void tally__bias_counts(uint64_t *grants, uint64_t *revokes)
{
    *grants = atomic_load_explicit(&n_grants, memory_order_relaxed);
    *revokes = atomic_load_explicit(&n_revokes, memory_order_relaxed);
}

void tally__bias_policy(uint32_t first, uint64_t pay)
{
    need_first = first ? first : BIAS_NEED_FIRST;
    payback = pay;
}
