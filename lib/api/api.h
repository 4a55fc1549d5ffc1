/* The API layer's own declarations: initialisation and the checked device
 * lookup that every public entry point starts with, and the process-wide
 * pieces (exit, fork) that reach across every layer. Lower layers never
 * include this header (tests/check_layers.sh). */
#ifndef TALLY_API_H
#define TALLY_API_H

#include "ledger/site.h"
#include "report/report.h"

/* Initialise once: options, backend, devices, the cache's hooks; returns 0
 * or the init error. Inline, as every entry point starts with it: one load
 * once initialised (api.c's flag), else the call that initialises. */
extern _Atomic int tally__initialised;
int tally__ensure_init_slow(void);
static inline int tally__ensure_init(void)
{
    if (TALLY_LIKELY(atomic_load_explicit(&tally__initialised, memory_order_acquire) == 1))
        return 0;
    return tally__ensure_init_slow();
}
bool tally__is_initialised(void);
/* The device, initialising first; NULL with an error naming fn and the
 * number. */
tally_device_t *tally__device(int device, const char *fn);

/* tally_malloc's body, in two halves, shared with tally_torch_alloc
 * (PyTorch's entry point, lib/torch/torch_abi.c), whose errors name
 * tally_malloc too. The fast half: a plain allocation (initialised, a
 * device in range, no site to capture and no private tag: fast_ok, inline
 * in both) goes to the cache's fast half (tally__cache_malloc_biased: the
 * lock by bias, the allocation, the unlock), which ends in the entry
 * point's miss where it cannot finish. Everything else is the slow half's
 * (slow_inline), which captures the allocation site: inline in
 * tally_malloc, whose miss answers "not done" so that tally_malloc runs it
 * in its own frame; for PyTorch's entry point in a function of its own,
 * reached by tail calls only, so that the entry point keeps nothing across
 * a call (issue 21, item 7) and the frame above the capture is PyTorch's
 * (or, without tail calls, as at -O1, ones in libtally.so, which the
 * capture skips). */
static inline __attribute__((always_inline)) bool tally__malloc_fast_ok(size_t size, int device);
static inline __attribute__((always_inline)) void *tally__malloc_slow_inline(size_t size, int device, void *stream);

/* sleep.c: private tags. At initialisation, the private_tags key (refused
 * with the reason on a backend without pages of its own); the number of
 * private tags; the private pool id (the tag) a tally_malloc on device goes
 * to, 0 for none, after refusing or waking a sleeping tag (sleep_alloc);
 * what a stage report says slept and woke. */
int tally__private_init_locked(const tally_backend_t *be, char *err, size_t errlen);
extern _Atomic int tally__nprivate;
/* api.c: non-zero when an allocation has more to do than the cache's part:
 * an allocation site to capture (backtrace_depth or python_stack, with the
 * ledger on) or private tags to look up. One load on the allocation path
 * instead of four; recomputed whenever one of them changes. */
extern _Atomic int tally__alloc_extra;
void tally__alloc_extra_update(void);
static inline int tally__private_any(void)
{
    return atomic_load_explicit(&tally__nprivate, memory_order_relaxed);
}
/* The lock of the private tags' list and notes (process.c takes it; never
 * held with a device lock; taken before the names and sink locks). */
tally_mutex_t *tally__private_lock(void);
int tally__private_for_alloc(int device, uint32_t *id);
void tally__private_note(uint32_t tag, bool slept, bool offload);
/* The number of sleeps and wakes so far: a stage's mark, kept in its frame. */
uint64_t tally__private_notes_mark(void);
/* The sleeps and wakes since mark from (the ended stage's report). */
void tally__private_write_notes(tally_out_t *o, const char *stage, uint64_t from);

/* pointers.c: lock the device holding a's live block, looking from device
 * start on (devices whose lock is biased to another thread last), and
 * return the block with that lock held, or NULL with none held; take
 * removes it from the map. */
tally_block_t *tally__find_live_from(int start, uintptr_t a, bool take, tally_device_t **out);

/* process.c: the report file and the leak report at process exit. */
void tally__exit_register(void);
int tally__exit_report(void);

/* process.c: registers the pthread_atfork handlers (once). api.c: in a forked
 * child, refuse a device backend the parent started. */
void tally__fork_register(void);
void tally__after_fork_child(void);

/* Every allocation the fast half does not take: size 0 or negative, before
 * initialisation, a bad device, a site to capture or a private tag to look
 * up, a lock this thread does not hold by bias. */
static inline __attribute__((always_inline)) void *tally__malloc_slow_inline(size_t size, int device, void *stream)
{
    if (size == 0)
        return NULL;
    if (TALLY_UNLIKELY((ssize_t)size < 0)) {
        tally__fail(TALLY_EINVAL, "tally_malloc: size %zu is negative as a signed size (%zd)", size, (ssize_t)size);
        return NULL;
    }
    if (tally__ensure_init())
        return NULL;
    tally_device_t *d = tally__device_lookup(device, "tally_malloc");
    if (!d)
        return NULL;
    void *site = NULL;
    uint32_t priv = 0;
    if (atomic_load_explicit(&tally__alloc_extra, memory_order_relaxed)) {
        /* The allocation site is unwound before the lock: it is slow. */
        int depth = TALLY_OPT(backtrace_depth), pydepth = TALLY_OPT(python_stack);
        if ((depth > 0 || pydepth > 0) && tally__opt.ledger)
            site = tally__site_capture(depth, pydepth);
        if (tally__private_any() && tally__private_for_alloc(device, &priv))
            return NULL;
    }
    tally__dev_lock(&d->lock);
    tally_block_t *b;
    if (TALLY_UNLIKELY(priv)) {
        tally_gpool_t *gp = tally__ppool_get_locked(d, priv, true);
        b = gp ? tally__cache_malloc_in_locked(d, size, stream, site, gp) : NULL;
    } else {
        b = tally__cache_malloc_locked(d, size, stream, site);
    }
    void *p = b ? (void *)b->addr : NULL;
    tally__dev_unlock(&d->lock);
    return p;
}

static inline __attribute__((always_inline)) bool tally__malloc_fast_ok(size_t size, int device)
{
    /* size - 1 < SIZE_MAX / 2: neither 0 nor negative as a signed size. */
    return TALLY_LIKELY(size - 1 < SIZE_MAX / 2) &&
           TALLY_LIKELY(atomic_load_explicit(&tally__initialised, memory_order_acquire) == 1) &&
           TALLY_LIKELY((unsigned)device < (unsigned)tally__g.ndev) &&
           TALLY_LIKELY(!atomic_load_explicit(&tally__alloc_extra, memory_order_relaxed));
}

#endif
