/* Declarations shared between the library's files (never installed).
 * Names: public tally_*, cross-file internals tally__*, the rest static.
 *
 * Lock order: a device lock (tally_device_t.lock) may be held while taking
 * the ledger's name lock or the sink lock; never the other way round, and
 * never two device locks at once (except the fork handlers, which hold
 * them all, in device order, while no other thread holds two). The whole
 * order is stage, config, devices, private tags (lib/api/sleep.c), names, site, python frames, host backend,
 * sink, heap. */
#ifndef TALLY_INTERNAL_H
#define TALLY_INTERNAL_H

#define TALLY_BUILDING_LIBRARY 1
#include "tally.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define TALLY_INTERNAL __attribute__((visibility("hidden")))
#define TALLY_LIKELY(x) __builtin_expect(!!(x), 1)
#define TALLY_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* ---- locks ---------------------------------------------------------------- */
/* A small futex lock (0 free, 1 held, 2 held with waiters): one atomic
 * exchange to take it uncontended, a short spin, then sleep in the kernel.
 * Cheaper than pthread_mutex_t on the hot path; see lock.c. */
typedef struct tally_mutex {
    _Atomic int state;
} tally_mutex_t;
#define TALLY_MUTEX_INIT {0}
void tally__mutex_wait(tally_mutex_t *m);
/* A hint to the CPU that this is a spin-wait loop: x86's pause, aarch64's
 * yield; elsewhere nothing (the loops are short and still correct). */
static inline void tally__cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}
void tally__mutex_wake(tally_mutex_t *m);
static inline void tally__mutex_lock(tally_mutex_t *m)
{
    int expected = 0;
    if (TALLY_LIKELY(atomic_compare_exchange_strong_explicit(&m->state, &expected, 1, memory_order_acquire,
                                                             memory_order_relaxed)))
        return;
    tally__mutex_wait(m);
}
static inline void tally__mutex_unlock(tally_mutex_t *m)
{
    if (TALLY_UNLIKELY(atomic_exchange_explicit(&m->state, 0, memory_order_release) == 2))
        tally__mutex_wake(m);
}

/* ---- the device lock: the futex lock above, biased to one thread (lock.c) --
 * A device lock is usually taken over and over by one thread (the thread of
 * a training loop, then PyTorch's autograd thread for a while). After a run
 * of uncontended takes by one thread, the lock is biased to it: that thread
 * then takes and drops it with plain stores, no locked instruction, setting
 * a flag of its own (busy). Any other thread takes the futex lock, then
 * revokes the bias: a process-wide memory barrier (membarrier(2)) so that
 * the owner's busy store and its check of the futex word cannot both miss
 * the other side's, then waits for the owner to leave. Only device locks are
 * biased: busy is one flag per thread, which is sound because no thread holds
 * two device locks (fork's prepare takes them all through the slow path). */
typedef struct tally_bias {
    _Atomic int busy;                   /* inside a device lock taken through the bias */
    _Atomic uintptr_t thread;           /* tally__thread_id() of the thread it belongs to; 0 when free */
    struct tally_bias *next;            /* free list of records of exited threads */
    /* Its thread's innermost tag, mirrored there by the ledger (tag push and
     * pop) so that an allocation under a biased lock reads it without
     * thread-local storage (a call in a shared library); TALLY_BIAS_TAG_UNSET
     * until the ledger first writes it. Read and written by its thread only. */
    uint32_t tag;
} tally_bias_t;
#define TALLY_BIAS_TAG_UNSET UINT32_MAX
typedef struct tally_devlock {
    tally_mutex_t m;
    int fast;                           /* held through the bias (read and written by the holder only) */
    _Atomic(tally_bias_t *) owner;      /* the record of the thread the lock is biased to; NULL if none */
    uintptr_t last;                     /* the thread of the last slow take, and its run of them: */
    uint32_t streak, need;              /* a run of need earns the bias */
    uint64_t served;                    /* takes through the current bias */
} tally_devlock_t;
/* The calling thread, as a number no other live thread has: its thread
 * pointer (one register read; no thread-local variable, so libtally.so
 * needs no static TLS to be dlopen'ed), else pthread_self. */
static inline uintptr_t tally__thread_id(void)
{
    uintptr_t tp;
#if defined(__x86_64__)
    __asm__("mov %%fs:0, %0" : "=r"(tp));
#elif defined(__aarch64__)
    __asm__("mrs %0, tpidr_el0" : "=r"(tp));
#else
    tp = (uintptr_t)pthread_self();
#endif
    return tp;
}
void tally__devlock_init(tally_devlock_t *l);
void tally__devlock_slow(tally_devlock_t *l);
/* The child of fork: the lock free and unbiased (process.c). */
void tally__devlock_reset(tally_devlock_t *l);
void tally__bias_after_fork(void);
/* Biases granted and revoked since the start (tests). */
void tally__bias_counts(uint64_t *grants, uint64_t *revokes);
/* Tests: the run of slow takes that earns a bias (0: the default) and the
 * takes a bias must serve not to make the next harder to earn (0: none),
 * for locks made or reset from now on. */
void tally__bias_policy(uint32_t first, uint64_t payback);
/* The calling thread's record, NULL before its first bias (the ledger's
 * tag mirror, tests). */
tally_bias_t *tally__bias_mine(void);
/* Whether l is biased to a thread other than the calling one: a read that
 * may be stale at once, a hint for a caller that looks through every
 * device's lock and would rather take such a lock last, since taking it
 * revokes the bias (a process-wide barrier). */
static inline bool tally__dev_lock_biased_away(const tally_devlock_t *l)
{
    tally_bias_t *o = atomic_load_explicit(&l->owner, memory_order_relaxed);
    return o && atomic_load_explicit(&o->thread, memory_order_relaxed) != tally__thread_id();
}
/* The record through which the calling thread holds l (which it must
 * hold): its own, or NULL when it took l through the futex. */
static inline tally_bias_t *tally__dev_lock_record(const tally_devlock_t *l)
{
    return l->fast ? atomic_load_explicit(&l->owner, memory_order_relaxed) : NULL;
}
/* The biased fast path alone: true with the lock held (released by
 * tally__dev_unlock), false with nothing held, for a caller whose slow path
 * is elsewhere (the allocation entry points: their fast path then keeps
 * fewer registers across its one call). */
static inline bool tally__dev_lock_biased(tally_devlock_t *l)
{
    tally_bias_t *o = atomic_load_explicit(&l->owner, memory_order_relaxed);
    /* A record whose thread is this one is this thread's own: a record
     * changes thread only when its thread exits (lock.c). */
    if (o && TALLY_LIKELY(atomic_load_explicit(&o->thread, memory_order_relaxed) == tally__thread_id())) {
        atomic_store_explicit(&o->busy, 1, memory_order_relaxed);
        /* The compiler may not move the check above the store; the CPU may,
         * and the revoker's membarrier is what orders the two (lock.c). */
        atomic_signal_fence(memory_order_seq_cst);
        if (TALLY_LIKELY(atomic_load_explicit(&l->m.state, memory_order_acquire) == 0) &&
            TALLY_LIKELY(atomic_load_explicit(&l->owner, memory_order_relaxed) == o)) {
            l->fast = 1;
            l->served++;
            return true;
        }
        atomic_store_explicit(&o->busy, 0, memory_order_release);
    }
    return false;
}
static inline void tally__dev_lock(tally_devlock_t *l)
{
    if (!tally__dev_lock_biased(l))
        tally__devlock_slow(l);
}
/* The unlock of a lock taken by tally__dev_lock_biased and not let go
 * since: tally__dev_unlock without its test of how it was taken. */
static inline void tally__dev_unlock_biased(tally_devlock_t *l)
{
    l->fast = 0;
    atomic_store_explicit(&atomic_load_explicit(&l->owner, memory_order_relaxed)->busy, 0, memory_order_release);
}
static inline void tally__dev_unlock(tally_devlock_t *l)
{
    if (TALLY_LIKELY(l->fast)) {
        /* The owner cannot change while its thread holds the lock. */
        l->fast = 0;
        atomic_store_explicit(&atomic_load_explicit(&l->owner, memory_order_relaxed)->busy, 0, memory_order_release);
        return;
    }
    tally__mutex_unlock(&l->m);
}

/* The library's other locks, for the fork handlers (process.c), which take
 * them all in this order: stage, config, every device, names, site, host,
 * sink, heap. */
tally_mutex_t *tally__stage_lock(void);
tally_mutex_t *tally__config_lock(void);
tally_mutex_t *tally__names_lock(void);
tally_mutex_t *tally__site_lock(void);
tally_mutex_t *tally__pystack_lock(void);
tally_mutex_t *tally__host_lock(void);
tally_mutex_t *tally__sink_lock(void);
tally_mutex_t *tally__heap_lock(void);

/* ---- host-side metadata memory (jemalloc private arena, meta.c) ----------- */
void *tally__meta_alloc(size_t size);
void *tally__meta_calloc(size_t size);
void tally__meta_free(void *p);
char *tally__meta_strdup(const char *s);
/* An array grown: a new block of cap items of elem bytes holding the n items
 * of old, which is freed; NULL (old kept as it was) when out of memory. */
void *tally__meta_grow(void *old, size_t n, size_t cap, size_t elem);
/* Tests: make the nth metadata allocation from now fail (1 = the next), and
 * every `every`-th one after it when every != 0; nth 0 disarms.
 * tally__meta_fail_hits() counts the failures made since arming. */
void tally__meta_fail(uint64_t nth, uint64_t every);
uint64_t tally__meta_fail_hits(void);
/* Tests: with in_heap, the failures tally__meta_fail arms happen inside the
 * tally-heap, as the kernel refusing its mapping (its free lists passed
 * over), instead of at tally__meta_alloc's entry; nothing fails there under
 * jemalloc (tally__meta_source). */
void tally__meta_fail_in_heap(bool in_heap);
/* Bytes of metadata currently held (for docs / tests). */
size_t tally__meta_bytes(void);
/* "jemalloc" when a private jemalloc arena is in use, else "tally-heap". */
const char *tally__meta_source(void);

/* ---- output and diagnostics (out.c) -------------------------------------- */
typedef struct tally_out {
    tally_write_fn write;
    void *arg;
    size_t len;
    int failed;
    char buf[4096];
} tally_out_t;
void tally__out_init(tally_out_t *o, tally_write_fn write, void *arg);
void tally__out_write(tally_out_t *o, const char *text, size_t len);
void tally__out_puts(tally_out_t *o, const char *text);
void tally__out_printf(tally_out_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void tally__out_json_str(tally_out_t *o, const char *s);
void tally__out_flush(tally_out_t *o);
void tally__write_file(void *arg, const char *text, size_t len);
/* A temporary file beside dest, created exclusively (never through a
 * planted symlink) under an unpredictable name left in tmp. */
FILE *tally__create_beside(const char *dest, char *tmp, size_t tmplen);

/* One line "tally: ..." to the sink. */
void tally__diag(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Record the message as this thread's last error, write it to the sink, and
 * return -code. fail_quiet records without writing. */
int tally__fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int tally__fail_quiet(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void tally__clear_error(void);
void tally__sink_write(const char *text, size_t len);
void tally__sink_writer(void *arg, const char *text, size_t len);
/* "1.5 GiB" (bytes under 1 KiB as "N B"). */
void tally__fmt_bytes(uint64_t bytes, char *buf, size_t len);
/* "" for 1, "s" otherwise. */
const char *tally__plural(uint64_t n);

/* ---- options (options.c) ------------------------------------------------- */
size_t tally__edit_distance(const char *a, const char *b);
void tally__env_hints(void); /* LEAK_REPORT=..., TALLY_CONFIG=...: "did you mean TALLY_CONF" */
enum { TALLY_BACKEND_AUTO, TALLY_BACKEND_HOST, TALLY_BACKEND_CUDA, TALLY_BACKEND_ASYNC };
enum { TALLY_HOST_BACKED, TALLY_HOST_VIRTUAL };
enum { TALLY_SLEEP_ALLOC_REFUSE, TALLY_SLEEP_ALLOC_WAKE };
enum { TALLY_LEAK_OFF, TALLY_LEAK_SUMMARY, TALLY_LEAK_FULL };
enum { TALLY_UNWIND_AUTO, TALLY_UNWIND_GLIBC, TALLY_UNWIND_FP };
#define TALLY_ROUNDUP_INTERVALS 16
#define TALLY_MAX_DEVICES 64

typedef struct tally_options {
    int backend;
    int host_devices;
    uint64_t host_capacity;
    int host_mode;
    uint64_t max_split_size;            /* UINT64_MAX: unlimited */
    uint64_t max_non_split_rounding;    /* oversize reuse slack, bytes */
    double gc_threshold;                /* 0: off */
    uint32_t roundup_divisions[TALLY_ROUNDUP_INTERVALS];
    double memory_fraction;             /* 0: none; applies to every device */
    int ledger;                         /* record tags / stages per block */
    int lock_bias;                      /* device locks may be biased to one thread (lock.c) */
    int backtrace_depth;
    int python_stack;                   /* Python frames per allocation site */
    int unwinder;                       /* TALLY_UNWIND_* (unwind.c) */
    int release_at_stage_end;
    int stage_report;
    int leak_report;
    int leak_exitcode;
    int home_device;                    /* in effect: -1 none, else a device number */
    int home_setting;                   /* as configured: -2 auto, -1 none, or a number */
    int timeline;
    int timeline_events;
    int trace;                          /* record every alloc and free (recorders.c) */
    int expandable_segments;            /* large pool in one growing range per stream */
    int large_segment_size_mb;          /* large pool segment for requests under 10 MiB */
    int expandable_small_shared;        /* small-pool segments lent by expandable segments (segment.c) */
    int expandable_small_pages;         /* the small pool one run of pages per stream (small_run.c) */
    int expandable_grow_chunk_mb;       /* a small block growing its range maps up to this boundary */
    int expandable_handle_grid_mb;      /* moves limited: a handle per cell of this many MiB a map crosses (0: one per call) */
    int expandable_handle_mb;           /* blocks at least this large map their new pages as one handle (0: off) */
    int expandable_move_budget;         /* us of driver time a step may spend moving pages (0: none, -1: no limit) */
    int async_private_pool;             /* async backend: own pool, not the device default */
    uint64_t async_release_threshold;   /* bytes the async pool keeps cached */
    int sleep_alloc;                    /* TALLY_SLEEP_ALLOC_REFUSE or _WAKE (docs/sleep.md) */
    int sleep_pinned_cache;             /* keep offload buffers pinned from a wake to the next sleep */
    char persistent_tags[512];
    char private_tags[512];             /* tags with private pools, | separated (fixed at init) */
    char report_path[512];
    char leak_suppressions[512];        /* LeakSanitizer-style suppressions file */
} tally_options_t;

extern tally_options_t tally__opt;
/* Options marked runtime may change while other threads run: read them
 * with TALLY_OPT (a relaxed atomic load; tally_configure stores them the
 * same way), and the two strings with tally__opt_string (under the
 * configuration lock). The other options are fixed once initialised. */
#define TALLY_OPT(field) __atomic_load_n(&tally__opt.field, __ATOMIC_RELAXED)
static inline double tally__opt_double(const double *field)
{
    double v;
    __atomic_load(field, &v, __ATOMIC_RELAXED);
    return v;
}
/* Copy a runtime string option (persistent_tags, report_path) into buf[512]. */
void tally__opt_string(const char *field, char *buf);
/* A further check of string values (today leak_suppressions: the file must
 * parse), called by tally__options_parse with the key and the value; it
 * returns 0 or a negative code after tally__fail. NULL: no check. */
void tally__options_set_checker(int (*fn)(const char *key, const char *value));
/* Parse conf into opt (validating every key); when runtime is set, reject
 * keys that cannot change after initialisation. On error opt is unchanged. */
int tally__options_parse(tally_options_t *opt, const char *conf, bool runtime, uint64_t *seen);
/* Bit of a key in the seen mask of tally__options_parse. */
uint64_t tally__option_bit(const char *key);
void tally__options_default(tally_options_t *opt);
/* Parse a size with optional suffix (B, KB, KiB, MB, MiB, GB, GiB, TB, TiB):
 * whether s is one (then *out holds it). */
bool tally__parse_size(const char *s, uint64_t *out);
/* -1 with the escape in bad (3 bytes) when path has a % escape other than
 * %p, %r, %% (report_path's). */
int tally__check_path_escapes(const char *path, char *bad);
/* The options as key:value lines with their help. */
int tally__options_write(const tally_options_t *o, tally_out_t *out);
/* Rounded block size and segment size for a request (cache.c). */
size_t tally__round_size(size_t size);
size_t tally__segment_size(size_t rounded);

/* ---- statistics (stats.c) ------------------------------------------------ */
/* The statistics the library keeps (a device's tally_stats_t, the ledger's
 * rows) hold two totals that only grow, allocated and freed, and the peak;
 * the value now is their difference. The hot path adds to one total per
 * update, where keeping current as well took a second read-modify-write of
 * memory on every update (docs/benchmarks.md, run AB). current is written in only by tally__stats_sync_all, for readers
 * of the struct; PyTorch's accumulated reset is a base subtracted when the
 * statistics are read (tally__stats_reset_accumulated). */
static inline int64_t tally__stat_now(const tally_stat_t *s)
{
    return s->allocated - s->freed;
}
static inline void tally__stat_peak(tally_stat_t *s)
{
    int64_t now = tally__stat_now(s);
    if (now > s->peak)
        s->peak = now;
}
/* Known-sign updates. */
static inline void tally__stat_inc(tally_stat_t *s, int64_t n)
{
    s->allocated += n;
    tally__stat_peak(s);
}
/* A rise whose peak is taken later (tally__cache_peaks_locked). */
static inline void tally__stat_rise(tally_stat_t *s, int64_t n)
{
    s->allocated += n;
}
static inline void tally__stat_dec(tally_stat_t *s, int64_t n)
{
    s->freed += n;
}
/* The pool-indexed statistics (the arrays of tally_stats_t) are kept per
 * pool: the small and large entries hold every field, the all entry only
 * its peak (kept live); its totals are the sums of the two pools', written
 * in by tally__stats_sync_all before anything reads them. An update then
 * touches one entry, not two. */
static inline int64_t tally__stat_all_current(const tally_stat_t *arr)
{
    return tally__stat_now(&arr[TALLY_POOL_SMALL]) + tally__stat_now(&arr[TALLY_POOL_LARGE]);
}
/* The peaks of a pool's entry of the pool-indexed array arr and of its all
 * entry, taken now. */
static inline void tally__stat_pool_peak(tally_stat_t *arr, int pool)
{
    tally__stat_peak(&arr[pool]);
    int64_t all = tally__stat_all_current(arr);
    if (all > arr[TALLY_POOL_ALL].peak)
        arr[TALLY_POOL_ALL].peak = all;
}
static inline void tally__stat_pool_inc(tally_stat_t *arr, int pool, int64_t n)
{
    tally__stat_rise(&arr[pool], n);
    tally__stat_pool_peak(arr, pool);
}
static inline void tally__stat_pool_dec(tally_stat_t *arr, int pool, int64_t n)
{
    tally__stat_dec(&arr[pool], n);
}
/* A signed change of a pool's entry (amount may be 0), branch-free but for
 * the peaks: the sign follows the job's free order, which no predictor
 * learns. */
static inline void tally__stat_pool(tally_stat_t *arr, int pool, int64_t amount)
{
    tally_stat_t *s = &arr[pool];
    int64_t up = amount > 0 ? amount : 0;
    s->allocated += up;
    s->freed += up - amount;
    tally__stat_pool_peak(arr, pool);
}
/* Write the all entries' totals (the sums of the pools') and every
 * entry's current into s, before s is read or reset. */
void tally__stats_sync_all(tally_stats_t *s);
/* The resets take s synced (a device's: tally__cache_stats_sync_locked). */
void tally__stats_reset_peak(tally_stats_t *s);
/* PyTorch's accumulated reset: the totals now become base's, which
 * tally__stats_read subtracts (the totals themselves never go back, since
 * current is their difference); the event counters are zeroed. */
void tally__stats_reset_accumulated(tally_stats_t *s, tally_stats_t *base);
/* *out = s (synced) as PyTorch reports it: allocated and freed since the
 * accumulated reset recorded in base. */
void tally__stats_read(const tally_stats_t *s, const tally_stats_t *base, tally_stats_t *out);
/* Flat JSON of memory_stats keys for s. */
void tally__stats_json(const tally_stats_t *s, tally_out_t *o);

#endif /* TALLY_INTERNAL_H */
