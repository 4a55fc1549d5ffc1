/* The caching layer's data: segments (one backend allocation each), blocks
 * (pieces of a segment, chained by address), pools of free blocks ordered by
 * (stream, size, address), the pointer map of handed-out blocks, and the
 * per-device state that one lock protects. Functions ending in _locked need
 * that device's lock held. */
#ifndef TALLY_CACHE_H
#define TALLY_CACHE_H

#include "backend/backend.h"
#include "core/internal.h"
#include "cache/ptrmap.h"

/* BLOCK_LENT: a piece of an expandable segment that the small pool holds
 * as one of its 2 MiB segments (segment.c): its pages stay mapped, it is
 * neither free nor handed out. */
enum { BLOCK_FREE = 0, BLOCK_ALLOCATED = 1, BLOCK_PENDING = 2, BLOCK_LENT = 3 };

typedef struct tally_segment tally_segment_t;
typedef struct tally_expand tally_expand_t;
typedef struct tally_block tally_block_t;
typedef struct tally_gpool tally_gpool_t;

/* A stream a block was used on (record_stream), with the device that
 * stream belongs to: events for the use are made on that device. */
typedef struct tally_use {
    void *stream;
    int device;
} tally_use_t;

struct tally_block {
    uintptr_t addr;
    size_t size;      /* bytes of the block (rounded) */
    size_t requested; /* bytes asked for */
    void *stream;
    tally_segment_t *seg;
    tally_block_t *prev, *next;  /* address neighbours in the segment */
    tally_block_t *left, *right; /* free-pool treap links (priority: a hash of addr, tree.c) */
    uint8_t pool;                /* TALLY_POOL_SMALL or TALLY_POOL_LARGE */
    uint8_t state;               /* BLOCK_* */
    uint8_t paged;               /* counted on its expandable segment's pages */
    uint8_t deferred;            /* pending: events wait for a capture to end */
    uint8_t ignored;             /* tally_ignore: kept on purpose, not a leak */
    uint8_t in_capture;          /* pass-through: allocated on a capturing stream (a graph allocation) */
    uint16_t event_count;        /* outstanding stream events */
    uint16_t nuses, cap_uses;    /* streams recorded by record_stream */
    tally_use_t *uses;
    uint64_t gc_base; /* pool's get-free call count when it became free (read by
                       * the large pool's garbage collection only: the small
                       * pool's fast paths leave it) */
    /* Ledger facts (ledger.c). */
    uint32_t tag, stage;
    uint32_t lentry; /* index of its ledger row */
    uint32_t epoch;  /* stage instance it was born in (ledger.h) */
    uint64_t seq;
    void *site;
};

struct tally_segment {
    uintptr_t base;
    size_t size;
    void *stream;
    uint8_t pool;
    int device;
    tally_segment_t *prev, *next; /* device's segment list */
    tally_block_t *head;          /* lowest-address block */
    struct tally_binset *bins;    /* small pool: its stream's bin set */
    tally_expand_t *ex;           /* expandable segment: its pages (expand.c) */
    tally_block_t *lender;        /* small segment lent by an expandable one: the piece it lies on */
    size_t run_va;                /* small pool's run of pages (small_run.c): bytes of addresses reserved
                                   * (size is the mapped part, from base); 0 for any other segment */
    tally_gpool_t *gp;            /* graph pool it belongs to, or NULL (graph_pool.c) */
    uint8_t vm;                   /* reserved and mapped whole (private pools, private.c) */
    union {
        struct {
            uint8_t asleep; /* vm: its pages are unmapped, its addresses kept (private.c) */
            uint8_t run;    /* a small pool's run of pages (small_run.c) */
            uint8_t direct; /* from a pass-through backend, which caches nothing (cache.c) */
            uint8_t spare;
        };
        uint32_t slow_free; /* any: a small block's free takes the general path (the fast one
                             * reads them in one load; a run's merges may pass 2 MiB) */
    };
};

/* Small-pool free blocks of one stream, binned by exact size (tree.c), up
 * to 2 MiB; the larger ones (only a run of pages has them, small_run.c) in
 * one treap by size and address, which the fast paths never see. */
#define TALLY_SMALL_BINS 4096
#define TALLY_SMALL_BIN_MAX ((size_t)TALLY_SMALL_BINS * 512) /* the last bin's size: 2 MiB */
typedef struct tally_binset {
    void *stream;
    uint64_t summary;  /* bit w: bits[w] != 0 */
    uint64_t bits[TALLY_SMALL_BINS / 64];
    tally_block_t *roots[TALLY_SMALL_BINS];
    tally_block_t *over; /* free blocks over TALLY_SMALL_BIN_MAX */
} tally_binset_t;

/* Free blocks: the large pool is one treap ordered by (stream, size,
 * address); the small pool is a bin set per stream. */
typedef struct tally_pool {
    tally_block_t *root;
    tally_binset_t **sets;
    uint32_t nsets, cap_sets;
    struct tally_binset *last_set; /* the set found last, or NULL */
    size_t count;
    uint64_t get_free_calls;
    uint8_t kind;
} tally_pool_t;

typedef struct tally_event_entry {
    void *event;
    void *stream;   /* the stream it was recorded on */
    int device;     /* the device of that stream (and of the event) */
    tally_block_t *block;
    struct tally_event_entry *next;
} tally_event_entry_t;

/* A private pool for the blocks allocated during one CUDA graph capture
 * (PyTorch's MempoolId_t is the pair hi, lo): its free blocks serve only
 * allocations routed to it, never eager ones (graph_pool.c). */
struct tally_gpool {
    uint64_t hi, lo;
    int (*filter)(void *arg, void *stream); /* which allocations go here; NULL: all */
    void *arg;
    bool allocating;   /* between begin and end */
    int use_count;     /* begins not yet released */
    tally_pool_t small, large;
    size_t nsegments;
    tally_gpool_t *next;
    /* A private pool (private.c) instead of a graph pool: the id the API
     * gave it (never 0), and its sleep state. */
    uint32_t private_id;
    struct tally_sleep *sleep;
};

#define TALLY_MAX_CAPTURING 8

/* Recently freed blocks, kept to name the owner in a double-free report. */
#define TALLY_FREED_RING 1024
typedef struct tally_freed {
    uintptr_t addr;
    size_t size;
    uint32_t tag, stage;
    uint64_t seq;
} tally_freed_t;

typedef struct tally_device {
    tally_devlock_t lock;
    int id;
    tally_pool_t small, large;
    tally_stats_t stats;
    /* The small fast path's allocation statistics have risen since their
     * peaks were last taken (tally__cache_peaks_locked). */
    uint8_t peaks_pending;
    /* The highest values the small pool's inactive_split and
     * inactive_split_bytes reached since their peaks (pool and all) were
     * last folded in (tally__cache_split_fold_locked), -1 when neither has
     * changed since: the small pool's fast paths compare with these alone. */
    int64_t split_hi[2];
    /* The highest allocated and reserved bytes (all pools) since they were
     * last set: the ledger's stage window (lib/ledger/stage.c sets them when
     * a stage begins and ends). The allocated one is taken with the peaks
     * above (read it after tally__cache_peaks_locked), the reserved one at
     * every rise (tally__cache_reserved_rise_locked). */
    int64_t win_alloc, win_reserved;
    tally_segment_t *segments;
    size_t nsegments;
    tally_ptrmap_t map;
    tally_block_t *spare_blocks;        /* free list of block records */
    tally_event_entry_t *events_head, *events_tail;
    tally_event_entry_t *spare_entries;
    void **spare_events;
    size_t nspare_events, cap_spare_events;
    uint64_t reserved;                  /* bytes obtained from the backend */
    uint64_t allowed_max;               /* memory-fraction cap, UINT64_MAX if none */
    double fraction;
    uint64_t seq;
    uint64_t inherited_seq;             /* blocks numbered up to it came from the parent at fork (process.c) */
    tally_stats_t stats_base;           /* totals at the accumulated reset (tally__stats_read) */
    /* stats.active and stats.active_bytes are allocation and allocated_bytes
     * plus these (pool entries), which PyTorch's pair never touches: a block
     * is active from its allocation until it is back in its pool, and on the
     * fast paths that is its free. held counts what differs: a block freed
     * by its user while it waits for events (freed goes down at the free,
     * up when the block is back in its pool), and a block taken and handed
     * back unused (tally__cache_undo_take_locked). Their totals are written
     * into stats.active by tally__cache_stats_sync_locked; the peaks are
     * stats.active's own. */
    tally_stat_t held[TALLY_POOL_COUNT], held_bytes[TALLY_POOL_COUNT];
    tally_freed_t freed[TALLY_FREED_RING];
    uint32_t freed_next;
    void *ledger;                       /* ledger.c's per-device counters */
    /* CUDA graph capture (graph_pool.c): streams seen capturing, blocks
     * whose events wait for the captures to end, private pools. */
    void *capturing[TALLY_MAX_CAPTURING];
    int ncapturing;
    tally_block_t **deferred;
    size_t ndeferred, cap_deferred;
    tally_gpool_t *gpools;
    int nallocating;                    /* graph pools between begin and end */
    tally_gpool_t *ppools;              /* private pools (private.c) */
    tally_segment_t *lent_kept;         /* a wholly free lent small segment kept for the next (segment.c) */
} tally_device_t;

typedef struct tally_global {
    pthread_once_t once;
    int init_rc;
    char init_error[512];
    const tally_backend_t *backend;
    int ndev;
    tally_device_t *dev[TALLY_MAX_DEVICES];
    /* Captures announced (graph_pool.c): graph pools between begin and end,
     * on every device together (a global-mode capture forbids unsafe calls
     * from every thread, whatever the device); and whether any ever was (from
     * then on tally relies on announcements and asks the driver nothing on
     * the cached path outside them). */
    _Atomic int announced;
    _Atomic bool announces;
    /* The small pool's fast allocation may run (small.c): a backend that
     * caches, PyTorch's default rounding, no move budget. The API sets it at
     * initialisation and when tally_configure changes a key. */
    _Atomic bool small_fast;
} tally_global_t;

extern tally_global_t tally__g;

/* The device of an initialised library, or NULL with an error naming fn
 * and the number (the API's tally__device initialises first). */
tally_device_t *tally__device_lookup(int device, const char *fn);

/* What the cache tells the layers above it, under the device lock. The API
 * installs the table at initialisation (the ledger's accounting, timeline
 * and trace; the OOM report); until then, and for a NULL entry, nothing is
 * told. The cache never names those layers. */
enum {
    TALLY_EV_ALLOC,
    TALLY_EV_FREE,
    TALLY_EV_SEGMENT_ALLOC,
    TALLY_EV_SEGMENT_FREE,
    TALLY_EV_OOM,
    TALLY_EV_STAGE_BEGIN,
    TALLY_EV_STAGE_END,
    TALLY_EV_SLEEP, /* a private tag slept (size: bytes unmapped) / woke (size: bytes mapped back) */
    TALLY_EV_WAKE
};
typedef struct tally_cache_hooks {
    /* A block was handed out (b->site already set) / is being freed. */
    void (*block_alloc)(tally_device_t *d, tally_block_t *b);
    void (*block_free)(tally_device_t *d, tally_block_t *b);
    /* A segment came or went, or an allocation ran out of memory
     * (TALLY_EV_SEGMENT_ALLOC, TALLY_EV_SEGMENT_FREE, TALLY_EV_OOM). */
    void (*device_event)(tally_device_t *d, int action, uintptr_t addr, size_t size, void *stream);
    /* An allocation failed for lack of memory: asked, rounded, the segment
     * size it needed, and why. */
    void (*oom)(tally_device_t *d, size_t asked, size_t rounded, size_t segment, const char *why);
} tally_cache_hooks_t;
extern tally_cache_hooks_t tally__cache_hooks;
void tally__cache_set_hooks(const tally_cache_hooks_t *h);

/* Peaks taken when they are needed. The small fast path raises five
 * statistics of an allocation (allocation, allocated_bytes, active,
 * active_bytes, requested_bytes) without comparing them with their peaks,
 * and marks the device. Between two marks those statistics only rise (every
 * decrease, and every read of a peak, takes the peaks first), so the highest
 * value each reached is the one it holds now: taking the peaks then gives
 * the same peaks as comparing at every step, with one comparison per run
 * of allocations instead of one per allocation. (A peak reset needs none:
 * it makes every peak the value now, which is what taking them would.) */
void tally__cache_peaks_take_locked(tally_device_t *d);
static inline void tally__cache_peaks_locked(tally_device_t *d)
{
    if (d->peaks_pending)
        tally__cache_peaks_take_locked(d);
}
/* The split statistics' peaks (pool and all) of the small pool, taken
 * from split_hi. Between two folds the large pool's entries do not change
 * (each change of them folds first), so the highest all reached is
 * split_hi plus the large pool's value now. Before a read (the sync), a
 * reset and a change of the large pool's split statistics. */
void tally__cache_split_fold_locked(tally_device_t *d);
/* The window's allocated peak, taken now (with the peaks, and after an
 * allocation whose statistics took theirs at once). */
static inline void tally__cache_window_alloc_locked(tally_device_t *d)
{
    int64_t all = tally__stat_all_current(d->stats.allocated_bytes);
    if (all > d->win_alloc)
        d->win_alloc = all;
}
/* The active statistics' peaks (pool and all), taken now: allocation plus
 * held (above). */
static inline void tally__cache_active_peak_one(tally_stat_t *act, const tally_stat_t *alloc, const tally_stat_t *held,
                                                int pool)
{
    int64_t now = tally__stat_now(&alloc[pool]) + tally__stat_now(&held[pool]);
    if (now > act[pool].peak)
        act[pool].peak = now;
    int64_t all = tally__stat_all_current(alloc) + tally__stat_all_current(held);
    if (all > act[TALLY_POOL_ALL].peak)
        act[TALLY_POOL_ALL].peak = all;
}
static inline void tally__cache_active_peak_locked(tally_device_t *d, int pool)
{
    tally__cache_active_peak_one(d->stats.active, d->stats.allocation, d->held, pool);
    tally__cache_active_peak_one(d->stats.active_bytes, d->stats.allocated_bytes, d->held_bytes, pool);
}
/* A block of pool with bytes stops (n = -1) or goes on (n = 1) being
 * active apart from its allocation: freed by its user while it waits, or
 * back in its pool after that wait (or after an undone take). */
static inline void tally__cache_held_locked(tally_device_t *d, int pool, int64_t n, int64_t bytes)
{
    d->held[pool].freed += n;
    d->held_bytes[pool].freed += n * bytes;
}
/* Write the active statistics' totals (allocation plus held) and the all
 * entries into d->stats (tally__stats_sync_all), before it is read or
 * reset. */
void tally__cache_stats_sync_locked(tally_device_t *d);
/* Reserved bytes of pool rise by bytes (a segment made, pages mapped, a
 * sleeping tag woken): the statistic, its peaks and the window's. */
static inline void tally__cache_reserved_rise_locked(tally_device_t *d, int pool, int64_t bytes)
{
    tally__stat_pool_inc(d->stats.reserved_bytes, pool, bytes);
    int64_t all = tally__stat_all_current(d->stats.reserved_bytes);
    if (all > d->win_reserved)
        d->win_reserved = all;
}

/* The statistics and records of a block handed out (in the pointer map),
 * and the hook: the last step of both allocation paths (cache.c, small.c),
 * inline in each. The small fast path's statistics leave their peaks
 * pending (above). */
static inline __attribute__((always_inline)) tally_block_t *tally__cache_hand_out(tally_device_t *d, tally_block_t *b, int kind,
                                                                                 size_t orig, void *site, bool in_capture)
{
    b->state = BLOCK_ALLOCATED;
    b->requested = orig;
    b->seq = ++d->seq;
    if (kind == TALLY_POOL_SMALL) {
        tally__stat_rise(&d->stats.allocation[TALLY_POOL_SMALL], 1);
        tally__stat_rise(&d->stats.allocated_bytes[TALLY_POOL_SMALL], (int64_t)b->size);
        tally__stat_rise(&d->stats.requested_bytes[TALLY_POOL_SMALL], (int64_t)orig);
        d->peaks_pending = 1;
    } else {
        tally__stat_pool_inc(d->stats.allocation, kind, 1);
        tally__stat_pool_inc(d->stats.allocated_bytes, kind, (int64_t)b->size);
        tally__cache_active_peak_locked(d, kind);
        tally__stat_pool_inc(d->stats.requested_bytes, kind, (int64_t)orig);
        tally__cache_window_alloc_locked(d);
    }
    /* A small-pool block (at most 2 MiB) is never oversize: max_split_size
     * is at least 20 MiB (options.c), so the fast path skips the test. */
    if (kind == TALLY_POOL_LARGE && b->size >= tally__opt.max_split_size)
        tally__stat_inc(&d->stats.oversize_allocations, 1);
    b->site = site;
    b->ignored = 0;
    b->in_capture = in_capture;
    tally__cache_hooks.block_alloc(d, b);
    return b;
}

/* tree.c: free-block pools */
/* Make room for blocks of stream (before its first segment); 0 or -1. */
int tally__pool_prepare(tally_pool_t *p, void *stream, struct tally_binset **set);
void tally__pool_insert(tally_pool_t *p, tally_block_t *b);
void tally__pool_erase(tally_pool_t *p, tally_block_t *b);
/* Best fit: the smallest block of this stream with size >= size (lowest
 * address among equals), or NULL. */
tally_block_t *tally__pool_lower_bound(tally_pool_t *p, void *stream, size_t size);
/* Largest block with key < (stream, size, addr), or NULL. */
tally_block_t *tally__pool_before(tally_pool_t *p, void *stream, size_t size, uintptr_t addr);
/* Large pool: the next block after b in (stream, size, address) order on
 * b's stream, or NULL. */
tally_block_t *tally__pool_after(tally_pool_t *p, const tally_block_t *b);
/* In-order walk; fn may not modify the pool. Returns the number visited. */
size_t tally__pool_walk(const tally_pool_t *p, void (*fn)(tally_block_t *, void *), void *arg);
/* Verify order and heap property; returns node count or -1. */
long tally__pool_verify(const tally_pool_t *p);

/* tree.c: the treap operations behind the small pool's bins. */
void tally__treap_insert(tally_block_t **slot, tally_block_t *b);
void tally__treap_erase(tally_block_t **slot, tally_block_t *b);
size_t tally__treap_walk(tally_block_t *t, void (*fn)(tally_block_t *, void *), void *arg);
long tally__treap_verify(const tally_block_t *t); /* node count, or -1 (in address order, as a bin) */
/* The same for a treap ordered as the large pool's (size, then address). */
void tally__treap_insert_sized(tally_block_t **slot, tally_block_t *b);
void tally__treap_erase_sized(tally_block_t **slot, tally_block_t *b);
long tally__treap_verify_sized(const tally_block_t *t);

/* small.c: the small pool's bins, for tree.c's pool functions. */
void tally__bins_insert(struct tally_binset *set, tally_block_t *b);
void tally__bins_erase(struct tally_binset *set, tally_block_t *b);
tally_block_t *tally__bins_lower_bound(tally_pool_t *p, void *stream, size_t size);
size_t tally__bins_walk(const tally_pool_t *p, void (*fn)(tally_block_t *, void *), void *arg);
long tally__bins_verify(const tally_pool_t *p); /* free blocks in the bins, or -1 */
/* Requests of at most this many bytes go to the small pool. */
#define TALLY_SMALL_SIZE ((size_t)1 << 20)
/* small.c: the small pool's fast paths. The free of a small-pool block
 * whose user and events are done: merged, put in its bin and counted
 * (tally__cache_free_block_locked for the small pool). */
void tally__small_free_block_locked(tally_device_t *d, tally_block_t *b);

/* small.c: an allocation, through the small pool's fast path when it
 * applies (issue 21, item 7), else cache.c's general path; a free, the same
 * way. */
tally_block_t *tally__cache_malloc_locked(tally_device_t *d, size_t size, void *stream, void *site);
void tally__cache_free_locked(tally_device_t *d, tally_block_t *b);
/* small.c: the fast halves of the entry points (tally_malloc, tally_free's
 * PyTorch form), each one function with the lock: d's lock taken by bias,
 * the cache's allocation or free, the unlock. Each ends in a tail call of
 * its entry point's miss where it cannot finish, so that the entry point
 * keeps nothing across it (issue 21, item 7):
 *  - the allocation: miss(orig, device, stream, false) with nothing done
 *    when the lock is not this thread's by bias; miss(..., true) when the
 *    cache failed (its reason set), whose answer is returned;
 *  - the free: miss(ptr, size, device) with nothing done when the lock is
 *    not this thread's by bias, or d's map holds no block at ptr whose
 *    requested size is size. */
typedef void *(*tally_alloc_miss_fn)(size_t orig, int device, void *stream, bool failed);
typedef void (*tally_free_miss_fn)(void *ptr, size_t size, int device);
void *tally__cache_malloc_biased(tally_device_t *d, size_t orig, int device, void *stream, tally_alloc_miss_fn miss);
void tally__cache_free_biased(tally_device_t *d, void *ptr, size_t size, int device, tally_free_miss_fn miss);
/* cache.c: the general paths, for what the fast ones do not take
 * (capturing: tally__cache_alloc_begin_locked's answer). */
tally_block_t *tally__cache_malloc_general_locked(tally_device_t *d, size_t size, void *stream, void *site,
                                                  bool capturing);
void tally__cache_free_general_locked(tally_device_t *d, tally_block_t *b);
/* The same, from private pool priv (never NULL) when no graph pool takes
 * it. */
tally_block_t *tally__cache_malloc_in_locked(tally_device_t *d, size_t size, void *stream, void *site,
                                             tally_gpool_t *priv);
int tally__cache_record_stream_locked(tally_device_t *d, tally_block_t *b, void *stream);
int tally__cache_check_locked(tally_device_t *d, char *why, size_t whylen);
void tally__cache_fill_derived_locked(tally_device_t *d, tally_stats_t *out);
/* expand.c: expandable segments (large pool, 2 MiB pages mapped on demand) */
bool tally__expand_on(void);
int tally__expand_region_locked(tally_device_t *d, void *stream, tally_block_t *(*new_block)(tally_device_t *),
                                char *why, size_t whylen);
int tally__expand_map_locked(tally_device_t *d, tally_block_t *b, bool map_more, char *why, size_t whylen);
void tally__expand_unref_locked(tally_block_t *b);
bool tally__expand_mapped_locked(const tally_block_t *b, size_t size);
/* A new small-pool segment of bytes: with moves unlimited, idle pages pay
 * for what would pass the high-water mark. */
void tally__expand_make_room_locked(tally_device_t *d, size_t bytes);
/* expand_move.c: the allocation stream, for the steady-state detector and
 * the move budget (size rounded; live: requested bytes before it). */
void tally__expand_note_alloc_locked(tally_device_t *d, size_t size, uint64_t live);
/* Whether the device's job repeats its step, and the step's length in
 * allocations (0 when not steady). */
bool tally__expand_steady(const tally_device_t *d);
uint64_t tally__expand_period(const tally_device_t *d);
/* Whether unmapping is held back on d: a CUDA graph capture is under way. */
bool tally__expand_unmap_held_locked(tally_device_t *d);
size_t tally__expand_trim_locked(tally_device_t *d);
size_t tally__expand_release_locked(tally_device_t *d, tally_segment_t *s);
size_t tally__expand_mapped_bytes(const tally_segment_t *s);
int tally__expand_check_locked(const tally_segment_t *s, char *why, size_t whylen);
/* expand.c and expand_move.c: a region's pages, and what the moves of
 * expand_move.c take from expand.c and give it. */
struct tally_expand {
    size_t npages, nmapped, idle; /* idle: mapped pages no live block touches */
    size_t spare;                 /* pages of handles whose every page is idle */
    uint8_t *mapped;
    uint32_t *live;       /* live (active) blocks touching each page */
    uint64_t *idle_bits;  /* bit p: page p is mapped and no live block touches it */
    uint64_t *spare_bits; /* bit p: page p is mapped and its whole handle is idle */
    uint32_t *hstart;     /* mapped page: the first page of its handle */
    uint32_t *hlen;       /* first page of a handle: its pages */
    uint32_t *hidle;      /* first page of a handle: its idle pages */
};

static inline bool tally__expand_is_spare(const tally_expand_t *ex, size_t p)
{
    return ex->spare_bits[p >> 6] >> (p & 63) & 1;
}
/* Unmap pages [p, p + n) of s in one backend call (whole spare handles);
 * false, nothing changed, when the backend refused (expand.c). */
bool tally__expand_unmap_run_locked(tally_device_t *d, tally_segment_t *s, size_t p, size_t n);
/* expand_move.c: pages that could move; a move of up to want pages to
 * where a block needs them, within the move budget (idle handles first,
 * then free small-pool segments; its cost charged to the step); unmap at
 * least want idle pages in address order, or steal them in whole runs, the
 * longest first (ends_last: a region's last run after the others, and only
 * the part wanted), leaving the handles with a page in [keep_lo, keep_hi]
 * of keep. */
typedef struct tally_move {
    size_t runs, handles, segments; /* unmap calls, handles they took down, small segments released */
} tally_move_t;
size_t tally__expand_movable_locked(const tally_device_t *d);
void tally__expand_move_locked(tally_device_t *d, size_t want, const tally_segment_t *keep, size_t lo, size_t hi,
                               bool ends_last);
size_t tally__expand_unmap_idle_locked(tally_device_t *d, size_t want, const tally_segment_t *keep, size_t keep_lo,
                                       size_t keep_hi);
size_t tally__expand_steal_runs_locked(tally_device_t *d, size_t want, const tally_segment_t *keep, size_t keep_lo,
                                       size_t keep_hi, bool ends_last, double cap_us, tally_move_t *m);

/* segment.c: with expandable_small_shared the device's small pool takes its
 * 2 MiB segments from the stream's expandable segment (no driver call when
 * the pages are mapped), and gives each back there once it is wholly free,
 * keeping one. Segment s over the lent piece c (out of the large pool, its
 * pages mapped and counted): made a small segment of d, or NULL out of host
 * memory (c unchanged). */
bool tally__lend_on(void); /* expandable segments with expandable_small_shared */
/* small_run.c: with expandable segments (and expandable_small_pages, not
 * expandable_small_shared) the small pool of each stream is one run of
 * 2 MiB pages that grows at its end, as PyTorch's small expandable segment. */
bool tally__small_run_on(void);
tally_segment_t *tally__small_run_of_locked(tally_device_t *d, void *stream); /* or NULL */
/* A free block of at least size bytes at the end of the stream's run, out
 * of the pool, mapping pages (and making the run) as needed: true, or false
 * with *err and why set. */
bool tally__small_run_grow_locked(tally_device_t *d, void *stream, size_t size, tally_block_t **out, int *err,
                                  char *why, size_t whylen);
/* Give a wholly free run's pages and addresses back (its record stays, for
 * the caller): false, with nothing changed, when the backend refused. */
bool tally__small_run_release_locked(tally_device_t *d, tally_segment_t *s);
/* Unmap the whole free pages at the end of every run: the bytes given back. */
size_t tally__small_run_trim_locked(tally_device_t *d);
tally_segment_t *tally__lend_segment_locked(tally_device_t *d, tally_block_t *c, struct tally_binset *bins);
/* s, wholly free (its block out of the pool), goes back to the expandable
 * segment it came from; its record and block are for the caller to drop. */
void tally__lend_return_locked(tally_device_t *d, tally_segment_t *s);
/* The small-pool block b of a lent segment became wholly free: keep the
 * segment for the next allocation, or, when one is kept already, give it
 * back. */
void tally__lend_idle_locked(tally_device_t *d, tally_block_t *b);
/* cache.c, for segment.c: give back a block taken from its pool but
 * never handed out. */
void tally__cache_undo_take_locked(tally_device_t *d, tally_block_t *b);

/* graph_pool.c: capture tracking and graph pools */
/* Note stream when it captures; re-check the streams seen capturing.
 * Returns whether any capture is under way on the device. */
bool tally__capture_check_locked(tally_device_t *d, void *stream);
/* Whether stream is among the streams known to capture. */
bool tally__capture_listed(const tally_device_t *d, void *stream);
/* Re-check known capturing streams only. */
bool tally__capture_underway_locked(tally_device_t *d);
/* Whether a capture may be under way, so that no potentially unsafe call
 * (event query or synchronise, stream or device synchronise, cuMemFree,
 * unmap) may be made: one is announced on any device, or a stream of d is
 * known to capture. Makes no driver call unless d has streams listed. */
bool tally__capture_on_locked(tally_device_t *d);
/* Remember a block whose events must wait for the capture to end. */
int tally__capture_defer_locked(tally_device_t *d, tally_block_t *b);
/* The graph pool an allocation on stream goes to, or NULL. */
tally_gpool_t *tally__gpool_match_locked(tally_device_t *d, void *stream);
/* The bodies of tally_graph_pool_begin, _end and _release (include/tally.h),
 * for an initialised library (lib/api/graph.c initialises first). */
int tally__graph_pool_begin(int device, uint64_t id_hi, uint64_t id_lo, int (*filter)(void *arg, void *stream),
                            void *arg);
int tally__graph_pool_end(int device, uint64_t id_hi, uint64_t id_lo);
int tally__graph_pool_release(int device, uint64_t id_hi, uint64_t id_lo);
/* Release the whole free segments of graph pools no longer in use. */
size_t tally__gpool_release_freeable_locked(tally_device_t *d);
/* The pool of kind for allocations to gp (NULL: the device's own). */
tally_pool_t *tally__pool_for(tally_device_t *d, tally_gpool_t *gp, int kind);
/* The pool a free block of b's segment belongs in. */
static inline tally_pool_t *tally__pool_of(tally_device_t *d, const tally_block_t *b)
{
    return tally__pool_for(d, b->seg->gp, b->pool);
}
/* A segment of gp goes back to the backend. */
void tally__gpool_segment_gone_locked(tally_device_t *d, tally_gpool_t *gp);
/* segment.c, for graph_pool.c and events.c */
size_t tally__cache_release_pool_locked(tally_device_t *d, tally_pool_t *p);
/* Put a block whose user is done (and whose events completed) in its pool. */
void tally__cache_free_block_locked(tally_device_t *d, tally_block_t *b);

/* private.c: private pools, whose segments are reserved and mapped whole so
 * that they can sleep (pages unmapped, addresses kept) and wake. */
/* The private pool id on d, created when create is set; NULL if none (or
 * out of host memory, with an error when create was set). */
tally_gpool_t *tally__ppool_get_locked(tally_device_t *d, uint32_t id, bool create);
/* A segment of size bytes for a private pool: reserve and map (0,
 * TALLY_ENOMEM or TALLY_EBACKEND with why). */
int tally__vm_segment_alloc_locked(tally_device_t *d, size_t size, void **ptr, char *why, size_t whylen);
/* Whether the pool sleeps. */
bool tally__ppool_asleep(const tally_gpool_t *gp);
/* Give a private pool's segment back: unmap (unless asleep), unreserve. */
void tally__vm_segment_free_locked(tally_device_t *d, tally_segment_t *s);
/* Release the whole free segments of every private pool. */
size_t tally__ppool_release_locked(tally_device_t *d);
/* A sleeping block is freed: its backup goes. */
void tally__ppool_block_freed_locked(tally_device_t *d, tally_block_t *b);
/* What one pool's sleep and wake did and hold (sizes in bytes). */
typedef struct tally_ppool_info {
    bool asleep, offloaded;
    uint64_t reserved;       /* mapped now */
    uint64_t sleeping;       /* live bytes whose pages are unmapped */
    uint64_t sleeping_blocks;
    uint64_t unmapped;       /* reserved bytes given back by the sleep */
    uint64_t offload;        /* host bytes holding backups */
    uint64_t kept;           /* host bytes kept pinned for the next offload */
    uint64_t sleeps, wakes;
} tally_ppool_info_t;
void tally__ppool_info_locked(tally_device_t *d, tally_gpool_t *gp, tally_ppool_info_t *out);
/* The streams (with their devices) the pool's live blocks were allocated
 * and recorded on, up to max; -1 when there are more. */
int tally__ppool_streams_locked(tally_device_t *d, tally_gpool_t *gp, tally_use_t *out, int max);
/* Sleep: wait for the pool's work (its blocks' streams and uses; the whole
 * device with sync_device), back the live blocks up when offload is set,
 * release free segments, unmap the rest. 0, or a TALLY_E* code with why
 * (nothing changed). */
int tally__ppool_sleep_locked(tally_device_t *d, tally_gpool_t *gp, bool offload, bool sync_device, char *why,
                              size_t whylen);
/* Wake: map every segment back at its address and restore the backups. On
 * failure what was mapped is unmapped again, the pool stays asleep with its
 * backups, and *missing says the bytes that could not be had. */
int tally__ppool_wake_locked(tally_device_t *d, tally_gpool_t *gp, uint64_t *missing, char *why, size_t whylen);

/* events.c: stream uses and events */
/* Record one event per use (on each use's stream and device). */
void tally__cache_insert_events_locked(tally_device_t *d, tally_block_t *b);
/* Resolve completed events (all, waiting, when wait is set). */
void tally__events_process_locked(tally_device_t *d, bool wait);
/* Wait for every pending event (counted as a sync of all streams). */
void tally__events_wait_all_locked(tally_device_t *d);
/* Whether a capture is under way (check_stream: look at stream too); when
 * none is, deferred blocks get their events. */
bool tally__events_capture_on_locked(tally_device_t *d, void *stream, bool check_stream);
/* Whether a capture is under way on the device or on a use of b. */
bool tally__events_uses_captured_locked(tally_device_t *d, tally_block_t *b);
/* Pass-through free (cache.c): the backend frees, after the block's uses. */
void tally__cache_passthrough_free_locked(tally_device_t *d, tally_block_t *b);
/* Wait (the host thread) for the work queued on u's stream: that stream
 * only, or u's device where the backend cannot wait for one stream. */
void tally__events_sync_use(const tally_use_t *u);
/* Make stream (of d) wait for the work queued so far on u's stream. */
void tally__events_wait_for_use_locked(tally_device_t *d, void *stream, const tally_use_t *u);

/* segment.c: the device's segments and their release */
/* Put a new segment on the device's list. */
void tally__segment_link_locked(tally_device_t *d, tally_segment_t *s);
/* b becomes the piece [addr, addr + size) of s (its stream and pool), after
 * prev (NULL: s's first block) and last in s. */
void tally__block_place(tally_block_t *b, tally_segment_t *s, uintptr_t addr, size_t size, tally_block_t *prev);
void tally__segment_unlink_locked(tally_device_t *d, tally_segment_t *s);
/* The device's segment containing addr, or NULL. */
tally_segment_t *tally__cache_segment_of_locked(tally_device_t *d, uintptr_t addr);
/* Release every whole free segment and the idle pages of expandable ones
 * (empty_cache; the retry before an OOM): the bytes given back. */
size_t tally__cache_release_all_locked(tally_device_t *d);
size_t tally__cache_release_small_locked(tally_device_t *d, size_t want);
/* Return a whole segment (its one block b) to the backend; in_pool: b sits
 * in its pool. release_block: one that does. */
void tally__cache_release_segment_locked(tally_device_t *d, tally_block_t *b, bool in_pool);
void tally__cache_release_block_locked(tally_device_t *d, tally_block_t *b);
/* Garbage collection under a memory fraction: release whole free large-pool
 * segments at least as old as the mean until reserved memory is down to
 * gc_threshold of the cap. */
void tally__cache_garbage_collect_locked(tally_device_t *d);
/* small.c: a new block record (every field but addr, size, stream, seg,
 * pool, prev and next set as for a free block), or NULL out of memory. */
tally_block_t *tally__cache_block_new(tally_device_t *d);
/* Split b (out of its pool) after its first size bytes: the rest goes to a
 * new free record linked after b, returned in no pool; NULL, b unchanged,
 * out of memory. */
tally_block_t *tally__cache_cut_front(tally_device_t *d, tally_block_t *b, size_t size);
/* cache.c, for segment.c: a block record goes back to the free list. */
void tally__cache_block_delete_locked(tally_device_t *d, tally_block_t *b);

/* What every allocation does first: the capture check (a driver query
 * unless captures are announced), then, outside a capture, the completed
 * events. Returns whether stream is capturing. */
static inline __attribute__((always_inline)) bool tally__cache_alloc_begin_locked(tally_device_t *d, void *stream)
{
    /* While a capture is under way no event is looked at. */
    bool capturing = tally__g.backend->stream_capturing && tally__events_capture_on_locked(d, stream, true);
    if (!capturing && d->events_head)
        tally__events_process_locked(d, false);
    return capturing;
}

/* What every free does first, both paths (cache.c, small.c): the
 * statistics of the allocation, the hook, and the freed-block ring (which
 * names a double free's first free). */
static inline __attribute__((always_inline)) void tally__cache_free_begin_locked(tally_device_t *d, tally_block_t *b)
{
    tally__cache_peaks_locked(d);
    tally__stat_pool_dec(d->stats.allocation, b->pool, 1);
    tally__stat_pool_dec(d->stats.allocated_bytes, b->pool, (int64_t)b->size);
    if (b->pool == TALLY_POOL_LARGE && b->size >= tally__opt.max_split_size) /* as in hand_out */
        tally__stat_dec(&d->stats.oversize_allocations, 1);
    tally__cache_hooks.block_free(d, b);
    tally_freed_t *f = &d->freed[d->freed_next++ % TALLY_FREED_RING];
    f->addr = b->addr;
    f->size = b->requested;
    f->tag = b->tag;
    f->stage = b->stage;
    f->seq = b->seq;
}

#endif
