/* The caching allocator, with PyTorch's native semantics as the baseline
 * (docs/architecture.md): 512-byte rounding (optionally power-of-two
 * divisions), a small pool (<= 1 MiB, 2 MiB segments) and a large pool
 * (20 MiB segments under 10 MiB, else 2 MiB-rounded), best fit per stream,
 * splitting and merging, max_split_size, garbage collection under a memory
 * fraction, the release-and-retry sequence before an OOM, and stream events
 * that hold a block back until other streams are done with it. The
 * segment list and the release of whole segments are in segment.c.
 * Every function here runs with the device's lock held. */
#include "cache/cache.h"

#include <stdio.h>
#include <string.h>

tally_global_t tally__g = {.once = PTHREAD_ONCE_INIT};

/* Until the API installs the layers above (tally__cache_set_hooks), the
 * cache tells nobody. */
static void no_block(tally_device_t *d, tally_block_t *b) { (void)d; (void)b; }
static void no_event(tally_device_t *d, int action, uintptr_t addr, size_t size, void *stream)
{
    (void)d, (void)action, (void)addr, (void)size, (void)stream;
}
static void no_oom(tally_device_t *d, size_t asked, size_t rounded, size_t segment, const char *why)
{
    (void)d, (void)asked, (void)rounded, (void)segment, (void)why;
}
tally_cache_hooks_t tally__cache_hooks = {no_block, no_block, no_event, no_oom};

void tally__cache_set_hooks(const tally_cache_hooks_t *h)
{
    tally__cache_hooks = (tally_cache_hooks_t){h->block_alloc ? h->block_alloc : no_block,
                                               h->block_free ? h->block_free : no_block,
                                               h->device_event ? h->device_event : no_event,
                                               h->oom ? h->oom : no_oom};
}

tally_device_t *tally__device_lookup(int device, const char *fn)
{
    if (device < 0 || device >= tally__g.ndev) {
        tally__fail(TALLY_EINVAL, "%s: device %d does not exist (backend %s has %d device%s)", fn, device,
                    tally__g.backend ? tally__g.backend->name : "none", tally__g.ndev, tally__g.ndev == 1 ? "" : "s");
        return NULL;
    }
    return tally__g.dev[device];
}

#define MIN_BLOCK 512u
#define SMALL_SIZE TALLY_SMALL_SIZE
#define SMALL_BUFFER ((size_t)2 << 20)
#define MIN_LARGE_ALLOC ((size_t)10 << 20)
#define ROUND_LARGE ((size_t)2 << 20)

static inline int floor_log2(size_t x)
{
    return 63 - __builtin_clzll((unsigned long long)x);
}

/* The small pool's sizes without the interval table's divisions (the
 * default): a multiple of 512 B, inline on the allocation path. Below 2 MiB
 * the table's first interval applies. */
static inline size_t round_size(size_t size)
{
    if (size <= SMALL_SIZE && tally__opt.roundup_divisions[0] <= 1)
        return size < MIN_BLOCK ? MIN_BLOCK : (size + MIN_BLOCK - 1) & ~(size_t)(MIN_BLOCK - 1);
    return tally__round_size(size);
}

size_t tally__round_size(size_t size)
{
    if (size < MIN_BLOCK)
        return MIN_BLOCK;
    int idx = floor_log2(size) - 20;
    if (idx < 0)
        idx = 0;
    if (idx >= TALLY_ROUNDUP_INTERVALS)
        idx = TALLY_ROUNDUP_INTERVALS - 1;
    size_t div = tally__opt.roundup_divisions[idx];
    if (div > 1 && size > (size_t)MIN_BLOCK * div) {
        if ((size & (size - 1)) == 0)
            return size;
        /* size > 512 * div, so floor2 > 256 * div and step > 256: never 0. */
        size_t floor2 = (size_t)1 << floor_log2(size);
        size_t step = floor2 >> floor_log2(div);
        size_t r = size & ~(step - 1);
        return r == size ? size : r + step;
    }
    return (size + MIN_BLOCK - 1) / MIN_BLOCK * MIN_BLOCK;
}

size_t tally__segment_size(size_t rounded)
{
    if (rounded <= SMALL_SIZE)
        return SMALL_BUFFER;
    if (rounded < MIN_LARGE_ALLOC) {
        /* large_segment_size_mb (PyTorch's key, default 20), never less than the block. */
        size_t large = (size_t)tally__opt.large_segment_size_mb << 20;
        size_t need = (rounded + ROUND_LARGE - 1) / ROUND_LARGE * ROUND_LARGE;
        return large > need ? large : need;
    }
    return (rounded + ROUND_LARGE - 1) / ROUND_LARGE * ROUND_LARGE;
}

tally_pool_t *tally__pool_for(tally_device_t *d, tally_gpool_t *gp, int kind)
{
    if (TALLY_UNLIKELY(gp != NULL))
        return kind == TALLY_POOL_SMALL ? &gp->small : &gp->large;
    return kind == TALLY_POOL_SMALL ? &d->small : &d->large;
}

/* ---- block records ------------------------------------------------------- */

void tally__cache_block_delete_locked(tally_device_t *d, tally_block_t *b)
{
    if (b->uses) {
        tally__meta_free(b->uses);
        b->uses = NULL;
    }
    b->next = d->spare_blocks;
    d->spare_blocks = b;
}

/* ---- free ---------------------------------------------------------------- */

void tally__cache_split_fold_locked(tally_device_t *d)
{
    for (int k = 0; k < 2; k++) {
        tally_stat_t *arr = k ? d->stats.inactive_split_bytes : d->stats.inactive_split;
        int64_t hi = d->split_hi[k];
        if (hi < 0)
            continue; /* no change since the last fold */
        if (hi > arr[TALLY_POOL_SMALL].peak)
            arr[TALLY_POOL_SMALL].peak = hi;
        int64_t all = hi + tally__stat_now(&arr[TALLY_POOL_LARGE]);
        if (all > arr[TALLY_POOL_ALL].peak)
            arr[TALLY_POOL_ALL].peak = all;
        /* The value now is in the peaks: each change taken since without
         * its peak wrote it here, and each taken with it wrote the peaks. */
        d->split_hi[k] = -1;
    }
}

void tally__cache_stats_sync_locked(tally_device_t *d)
{
    tally__cache_split_fold_locked(d); /* the split peaks, before they are read */
    for (int p = TALLY_POOL_SMALL; p <= TALLY_POOL_LARGE; p++) {
        d->stats.active[p].allocated = d->stats.allocation[p].allocated + d->held[p].allocated;
        d->stats.active[p].freed = d->stats.allocation[p].freed + d->held[p].freed;
        d->stats.active_bytes[p].allocated = d->stats.allocated_bytes[p].allocated + d->held_bytes[p].allocated;
        d->stats.active_bytes[p].freed = d->stats.allocated_bytes[p].freed + d->held_bytes[p].freed;
    }
    tally__stats_sync_all(&d->stats);
}

void tally__cache_peaks_take_locked(tally_device_t *d)
{
    tally__stat_pool_peak(d->stats.allocation, TALLY_POOL_SMALL);
    tally__stat_pool_peak(d->stats.allocated_bytes, TALLY_POOL_SMALL);
    tally__cache_active_peak_locked(d, TALLY_POOL_SMALL);
    tally__stat_pool_peak(d->stats.requested_bytes, TALLY_POOL_SMALL);
    tally__cache_window_alloc_locked(d);
    d->peaks_pending = 0;
}

/* Put a block whose user is done (and whose events completed) into its pool,
 * merging with free neighbours (the lower one first). */
void tally__cache_free_block_locked(tally_device_t *d, tally_block_t *b)
{
    tally__cache_peaks_locked(d); /* before the active statistics fall */
    if (b->pool == TALLY_POOL_SMALL) {
        tally__small_free_block_locked(d, b);
        return;
    }
    size_t original = b->size;
    if (TALLY_UNLIKELY(b->paged)) {
        tally__expand_unref_locked(b);
        b->paged = 0;
    }
    tally_segment_t *seg = b->seg;
    tally_pool_t *pool = tally__pool_for(d, seg->gp, b->pool);
    tally_block_t *prev = b->prev, *next = b->next;
    int64_t dblocks = 0, dbytes = 0;
    if (prev && prev->state == BLOCK_FREE) {
        /* A neighbour: the same segment, the same pool. */
        tally__pool_erase(pool, prev);
        b->addr = prev->addr;
        b->size += prev->size;
        b->prev = prev->prev;
        if (b->prev)
            b->prev->next = b;
        else
            seg->head = b;
        dblocks -= 1;
        dbytes -= (int64_t)prev->size;
        tally__cache_block_delete_locked(d, prev);
    }
    if (next && next->state == BLOCK_FREE) {
        tally__pool_erase(pool, next);
        b->size += next->size;
        b->next = next->next;
        if (b->next)
            b->next->prev = b;
        dblocks -= 1;
        dbytes -= (int64_t)next->size;
        tally__cache_block_delete_locked(d, next);
    }
    b->state = BLOCK_FREE;
    tally__pool_insert(pool, b);
    if (b->prev || b->next) {
        dblocks += 1;
        dbytes += (int64_t)b->size;
    }
    /* Free pieces of an expandable segment can always be released (their
     * pages unmapped), so they are not "non-releasable" (PyTorch agrees). */
    if (!seg->ex) {
        if (b->pool == TALLY_POOL_LARGE && (dblocks || dbytes))
            tally__cache_split_fold_locked(d);
        if (dblocks)
            tally__stat_pool(d->stats.inactive_split, b->pool, dblocks);
        if (dbytes)
            tally__stat_pool(d->stats.inactive_split_bytes, b->pool, dbytes);
    }
    tally__cache_held_locked(d, b->pool, 1, (int64_t)original);
    tally__stat_pool_dec(d->stats.requested_bytes, b->pool, (int64_t)b->requested);
}

/* Pass-through free of a block used on other streams: the device's free
 * stream (when the backend has one) waits for the block's stream and every
 * use, and the free is queued there, so the block's own (compute) stream
 * never waits for side streams (PyTorch's async allocator does the same);
 * else the block's stream waits for the uses. */
void tally__cache_passthrough_free_locked(tally_device_t *d, tally_block_t *b)
{
    const tally_backend_t *be = tally__g.backend;
    void *fs = b->nuses && be->free_stream ? be->free_stream(d->id) : NULL;
    if (fs) {
        tally_use_t own = {b->stream, d->id};
        tally__events_wait_for_use_locked(d, fs, &own);
    }
    for (uint16_t i = 0; i < b->nuses; i++)
        tally__events_wait_for_use_locked(d, fs ? fs : b->stream, &b->uses[i]);
    if (fs)
        b->stream = fs; /* the free is queued on the free stream */
    b->nuses = 0;
    tally__cache_peaks_locked(d);
    tally__cache_held_locked(d, b->pool, 1, (int64_t)b->size);
    tally__stat_pool_dec(d->stats.requested_bytes, b->pool, (int64_t)b->requested);
    b->state = BLOCK_FREE;
    tally__cache_release_segment_locked(d, b, false);
}

void tally__cache_free_general_locked(tally_device_t *d, tally_block_t *b)
{
    tally__cache_free_begin_locked(d, b);
    tally__cache_held_locked(d, b->pool, -1, (int64_t)b->size); /* active until it is back in its pool */
    if (TALLY_UNLIKELY(b->seg->asleep))
        tally__ppool_block_freed_locked(d, b);
    if (TALLY_UNLIKELY(tally__g.backend->passthrough)) {
        /* During a capture only a graph allocation with no other stream's
         * use is freed at once (a free node on its own stream): any other
         * free waits for the capture to end (cuMemFreeAsync in a capture
         * takes only graph allocations, and a free through the free stream
         * would join that stream into the capture, unjoined). */
        if (TALLY_UNLIKELY(tally__g.backend->stream_capturing != NULL) && !(b->in_capture && !b->nuses) &&
            (tally__events_uses_captured_locked(d, b) || tally__events_capture_on_locked(d, b->stream, true)) &&
            tally__capture_defer_locked(d, b) == 0) {
            b->state = BLOCK_PENDING;
            return;
        }
        tally__cache_passthrough_free_locked(d, b);
        return;
    }
    if (b->nuses) {
        b->state = BLOCK_PENDING;
        /* During a capture the uses may be captured work: their events
         * are inserted once the capture has ended. */
        if (TALLY_UNLIKELY(tally__g.backend->stream_capturing != NULL) && tally__events_uses_captured_locked(d, b) &&
            tally__capture_defer_locked(d, b) == 0)
            return;
        tally__cache_insert_events_locked(d, b);
        if (b->event_count)
            return;
    }
    if (TALLY_LIKELY(b->pool == TALLY_POOL_SMALL))
        tally__small_free_block_locked(d, b);
    else
        tally__cache_free_block_locked(d, b);
}

/* ---- allocate ------------------------------------------------------------ */

typedef struct alloc_params {
    void *stream;
    size_t size;       /* rounded request */
    size_t alloc_size; /* segment size if a new one is needed */
    int pool;
    tally_gpool_t *gp; /* graph pool it goes to, or NULL */
    tally_block_t *block;
    int err;           /* TALLY_ENOMEM or TALLY_EBACKEND after a failed backend call */
    char why[256];
} alloc_params_t;

static bool gc_enabled(tally_device_t *d)
{
    return d->allowed_max != UINT64_MAX && tally__opt_double(&tally__opt.gc_threshold) > 0;
}

static bool get_free_block(tally_device_t *d, alloc_params_t *p)
{
    tally_pool_t *pool = tally__pool_for(d, p->gp, p->pool);
    if (gc_enabled(d))
        pool->get_free_calls++;
    tally_block_t *b = tally__pool_lower_bound(pool, p->stream, p->size);
    if (!b)
        return false;
    uint64_t msplit = tally__opt.max_split_size;
    /* (A small pool's run of pages may hold a free block that large: it is
     * not an oversize block, small_run.c.) */
    if (!b->seg->ex && !b->seg->run_va && p->size < msplit && b->size >= msplit)
        return false;
    if (!b->seg->ex && p->size >= msplit && b->size >= p->size + tally__opt.max_non_split_rounding)
        return false;
    if (b->seg->ex && !tally__expand_mapped_locked(b, p->size)) {
        /* Expandable segments: the best fit needs new pages (a map call);
         * one of the next few larger free blocks may not. */
        tally_block_t *c = b;
        for (int k = 4; k > 0 && (c = tally__pool_after(pool, c)); k--) {
            if (c->seg->ex && tally__expand_mapped_locked(c, p->size)) {
                b = c;
                break;
            }
        }
    }
    tally__pool_erase(pool, b);
    p->block = b;
    return true;
}

static bool alloc_block(tally_device_t *d, alloc_params_t *p, bool retry)
{
    size_t size = p->alloc_size;
    if (retry)
        d->stats.num_alloc_retries++;
    if (d->allowed_max != UINT64_MAX && d->reserved + size > d->allowed_max) {
        p->err = TALLY_ENOMEM;
        snprintf(p->why, sizeof p->why, "memory fraction limit of %llu bytes reached",
                 (unsigned long long)d->allowed_max);
        return false;
    }
    struct tally_binset *bins;
    if (tally__pool_prepare(tally__pool_for(d, p->gp, p->pool), p->stream, &bins)) {
        p->err = TALLY_ENOMEM;
        snprintf(p->why, sizeof p->why, "out of host memory for metadata");
        return false;
    }
    void *ptr = NULL;
    /* A private pool's segments are reserved and mapped, so they can sleep. */
    bool vm = TALLY_UNLIKELY(p->gp != NULL) && p->gp->private_id;
    int rc = vm ? tally__vm_segment_alloc_locked(d, size, &ptr, p->why, sizeof p->why)
                : tally__g.backend->alloc(d->id, size, p->stream, &ptr, p->why, sizeof p->why);
    if (rc) {
        p->err = rc;
        return false;
    }
    tally_segment_t *s = tally__meta_calloc(sizeof *s);
    tally_block_t *b = s ? tally__cache_block_new(d) : NULL;
    if (!b) {
        /* Back the way it came, with or without its record: a private
         * pool's segment unmapped and unreserved, any other freed. */
        if (vm) {
            tally_segment_t gone = {.base = (uintptr_t)ptr, .size = size, .stream = p->stream};
            tally__vm_segment_free_locked(d, &gone);
        } else {
            tally__g.backend->free(d->id, ptr, size, p->stream);
        }
        tally__meta_free(s);
        p->err = TALLY_ENOMEM;
        snprintf(p->why, sizeof p->why, "out of host memory for metadata");
        return false;
    }
    s->base = (uintptr_t)ptr;
    s->size = size;
    s->stream = p->stream;
    s->pool = (uint8_t)p->pool;
    s->device = d->id;
    s->gp = p->gp;
    s->vm = vm;
    s->direct = tally__g.backend->passthrough; /* its frees go back to the backend (small.c) */
    if (p->gp)
        p->gp->nsegments++;
    s->head = b;
    s->bins = bins;
    tally__segment_link_locked(d, s);
    tally__block_place(b, s, (uintptr_t)ptr, size, NULL);
    d->reserved += size;
    tally__stat_pool_inc(d->stats.segment, p->pool, 1);
    tally__cache_reserved_rise_locked(d, p->pool, (int64_t)size);
    if (size >= tally__opt.max_split_size)
        tally__stat_inc(&d->stats.oversize_segments, 1);
    d->stats.num_device_alloc++;
    tally__cache_hooks.device_event(d, TALLY_EV_SEGMENT_ALLOC, b->addr, size, p->stream);
    p->block = b;
    return true;
}

/* With max_split_size set: free one cached oversize block big enough for the
 * request, or several of the largest ones that together are. */
static bool release_available_cached_blocks(tally_device_t *d, alloc_params_t *p)
{
    uint64_t msplit = tally__opt.max_split_size;
    /* Small-pool blocks (<= 2 MiB) are never oversize (max_split_size >= 20 MiB);
     * nothing is released during a capture (release_pool). */
    if (msplit == UINT64_MAX || p->pool == TALLY_POOL_SMALL || tally__capture_on_locked(d))
        return false;
    tally_pool_t *pool = tally__pool_for(d, p->gp, p->pool);
    size_t want = p->size < msplit ? (size_t)msplit : p->size;
    tally_block_t *b = tally__pool_lower_bound(pool, p->stream, want);
    if (b) {
        tally__cache_release_block_locked(d, b);
        return true;
    }
    /* No single block is big enough: release the largest ones of this
     * stream, from the top down, until together they are. */
    size_t released = 0;
    tally_block_t *cur = tally__pool_before(pool, p->stream, want, 0);
    while (released < want && cur && cur->size >= msplit && cur->stream == p->stream) {
        tally_block_t *prev = tally__pool_before(pool, cur->stream, cur->size, cur->addr);
        if (cur->prev || cur->next) {
            cur = prev;
            continue;
        }
        released += cur->size;
        tally__cache_release_block_locked(d, cur);
        cur = prev;
    }
    return released >= want;
}

/* Hand a block taken from its pool (chosen by tally__cache_malloc_locked,
 * or lent to the small pool) back to it. */
void tally__cache_undo_take_locked(tally_device_t *d, tally_block_t *b)
{
    b->requested = 0;
    d->held[b->pool].allocated += 1;
    d->held_bytes[b->pool].allocated += (int64_t)b->size;
    tally__cache_active_peak_locked(d, b->pool);
    tally__cache_free_block_locked(d, b);
}

static bool lend_block(tally_device_t *d, alloc_params_t *p);

/* A cached block, else a new segment, with PyTorch's retry sequence; for a
 * pass-through backend always a new allocation (the backend's pool caches). */
static bool find_block(tally_device_t *d, alloc_params_t *p)
{
    if (TALLY_UNLIKELY(tally__g.backend->passthrough)) {
        p->alloc_size = p->size;
        return alloc_block(d, p, false) ||
               (p->err == TALLY_ENOMEM && (tally__cache_release_all_locked(d), true) && alloc_block(d, p, true));
    }
    if (get_free_block(d, p))
        return true;
    if (p->pool == TALLY_POOL_LARGE && tally__expand_on() && !p->gp) {
        /* The stream's region holds every large block; memory is mapped
         * once the block is chosen (tally__cache_malloc_locked). */
        int rc = tally__expand_region_locked(d, p->stream, tally__cache_block_new, p->why, sizeof p->why);
        if (rc) {
            p->err = rc;
            return false;
        }
        if (get_free_block(d, p))
            return true;
        p->err = TALLY_ENOMEM;
        snprintf(p->why, sizeof p->why, "no free range of %zu bytes in the expandable segment", p->size);
        return false;
    }
    if (p->pool == TALLY_POOL_SMALL && !p->gp && tally__lend_on())
        return lend_block(d, p);
    if (p->pool == TALLY_POOL_SMALL && !p->gp && tally__small_run_on()) {
        /* The stream's run of pages grows at its end (small_run.c), after
         * the garbage collection a new segment would have; on OOM everything
         * cached goes back and it tries once more. */
        if (gc_enabled(d))
            tally__cache_garbage_collect_locked(d);
        if (tally__small_run_grow_locked(d, p->stream, p->size, &p->block, &p->err, p->why, sizeof p->why))
            return true;
        if (p->err == TALLY_ENOMEM) {
            tally__cache_release_all_locked(d);
            d->stats.num_alloc_retries++;
            return tally__small_run_grow_locked(d, p->stream, p->size, &p->block, &p->err, p->why, sizeof p->why);
        }
        /* A device whose driver gives no address range or page (no virtual
         * memory management) keeps 2 MiB segments for its small pool, as
         * without expandable segments; a run that exists fails here. */
        if (tally__small_run_of_locked(d, p->stream))
            return false;
        p->err = 0;
    }
    if (gc_enabled(d))
        tally__cache_garbage_collect_locked(d);
    if (p->pool == TALLY_POOL_SMALL && !p->gp && tally__expand_on())
        tally__expand_make_room_locked(d, p->alloc_size);
    return alloc_block(d, p, false) ||
           (p->err == TALLY_ENOMEM && release_available_cached_blocks(d, p) && alloc_block(d, p, false)) ||
           (p->err == TALLY_ENOMEM && (tally__cache_release_all_locked(d), true) && alloc_block(d, p, true));
}

static bool should_split(const tally_block_t *b, size_t size)
{
    size_t remaining = b->size - size;
    if (b->pool == TALLY_POOL_SMALL || b->seg->ex)
        return remaining >= MIN_BLOCK;
    return size < tally__opt.max_split_size && remaining > SMALL_SIZE;
}

/* An allocation that cannot be served: OOM (counted, reported with who holds
 * the memory) or a backend error. */
static void report_failure(tally_device_t *d, size_t orig, alloc_params_t *p)
{
    if (p->err == TALLY_ENOMEM) {
        d->stats.num_ooms++;
        tally__cache_hooks.device_event(d, TALLY_EV_OOM, 0, p->alloc_size, p->stream);
        tally__cache_hooks.oom(d, orig, p->size, p->alloc_size, p->why);
        tally__fail_quiet(TALLY_ENOMEM, "out of memory on device %d: %zu bytes asked (%s)", d->id, orig, p->why);
    } else {
        tally__fail(TALLY_EBACKEND, "device %d: backend error: %s", d->id, p->why);
    }
}

/* Hand out size bytes from the front of b, which is out of its pool: with
 * split, the rest (when a record can be had) goes back to pool as a free
 * block of its own. counted: the segment's free pieces count as inactive
 * splits (any but an expandable one's). kind is b's pool kind. */
static inline __attribute__((always_inline)) void take_front(tally_device_t *d, tally_pool_t *pool, tally_block_t *b, size_t size, bool split,
                              bool counted, int kind)
{
    bool already_split = b->prev || b->next;
    if (kind == TALLY_POOL_LARGE && counted)
        tally__cache_split_fold_locked(d);
    tally_block_t *rest = split ? tally__cache_cut_front(d, b, size) : NULL;
    if (rest) {
        tally__pool_insert(pool, rest);
        if (counted && already_split) {
            tally__stat_pool_dec(d->stats.inactive_split_bytes, kind, (int64_t)b->size);
        } else if (counted) {
            tally__stat_pool_inc(d->stats.inactive_split_bytes, kind, (int64_t)rest->size);
            tally__stat_pool_inc(d->stats.inactive_split, kind, 1);
        }
    } else if (already_split && counted) {
        /* Not split, or no record for the remainder: the whole block goes. */
        tally__stat_pool_dec(d->stats.inactive_split_bytes, kind, (int64_t)b->size);
        tally__stat_pool_dec(d->stats.inactive_split, kind, 1);
    }
}


/* Shared small segments: a new small-pool segment is a 2 MiB piece of the
 * stream's expandable segment, chosen as a large block of that size would
 * be and backed the same way (segment.c). */
/* Expandable segments: the free block a new small-pool segment is cut
 * from, its last 2 MiB on mapped pages (no driver call), the smallest such
 * of the stream (lowest address among equals), among the first
 * LEND_LOOKAHEAD from the best fit; NULL when none is. */
#define LEND_LOOKAHEAD 64
static tally_block_t *lend_pick(tally_device_t *d, void *stream)
{
    tally_block_t *b = tally__pool_lower_bound(&d->large, stream, SMALL_BUFFER);
    for (int k = LEND_LOOKAHEAD; b && k > 0; b = tally__pool_after(&d->large, b), k--) {
        if (!b->seg->ex)
            continue;
        tally_block_t back = *b;
        back.addr = b->addr + b->size - SMALL_BUFFER;
        if (tally__expand_mapped_locked(&back, SMALL_BUFFER))
            return b;
    }
    return NULL;
}

static bool lend_block(tally_device_t *d, alloc_params_t *p)
{
    struct tally_binset *bins;
    if (tally__pool_prepare(&d->small, p->stream, &bins)) {
        p->err = TALLY_ENOMEM;
        snprintf(p->why, sizeof p->why, "out of host memory for metadata");
        return false;
    }
    alloc_params_t q = {.stream = p->stream, .size = SMALL_BUFFER, .alloc_size = SMALL_BUFFER,
                        .pool = TALLY_POOL_LARGE};
    /* On mapped pages: the back of a free block, so that its front stays
     * joined to what lies below it. Else a 2 MiB large block's place. */
    tally_block_t *c = lend_pick(d, p->stream);
    if (c) {
        tally__pool_erase(&d->large, c);
        if (c->size > SMALL_BUFFER) {
            tally_block_t *back = tally__cache_cut_front(d, c, c->size - SMALL_BUFFER);
            tally__pool_insert(&d->large, c);
            if (!back) {
                p->err = TALLY_ENOMEM;
                snprintf(p->why, sizeof p->why, "out of host memory for metadata");
                return false;
            }
            c = back;
        }
        c->state = BLOCK_LENT;
    } else {
        if (!find_block(d, &q)) {
            p->err = q.err;
            memcpy(p->why, q.why, sizeof p->why);
            return false;
        }
        c = q.block;
        c->state = BLOCK_LENT;
        take_front(d, &d->large, c, SMALL_BUFFER, should_split(c, SMALL_BUFFER), false, TALLY_POOL_LARGE);
    }
    int rc = tally__expand_map_locked(d, c, true, p->why, sizeof p->why);
    if (rc == TALLY_ENOMEM) {
        tally__cache_release_all_locked(d);
        d->stats.num_alloc_retries++;
        rc = tally__expand_map_locked(d, c, false, p->why, sizeof p->why);
    }
    tally_segment_t *s = NULL;
    if (!rc) {
        c->paged = 1;
        if (!(s = tally__lend_segment_locked(d, c, bins))) {
            rc = TALLY_ENOMEM;
            snprintf(p->why, sizeof p->why, "out of host memory for metadata");
        }
    }
    if (rc) {
        tally__cache_undo_take_locked(d, c);
        p->err = rc;
        return false;
    }
    p->block = s->head;
    return true;
}

/* Everything after the capture check and the event queue. */
static tally_block_t *malloc_general(tally_device_t *d, size_t orig, void *stream, void *site, tally_gpool_t *priv,
                                     bool capturing);

tally_block_t *tally__cache_malloc_general_locked(tally_device_t *d, size_t orig, void *stream, void *site,
                                                  bool capturing)
{
    return malloc_general(d, orig, stream, site, NULL, capturing);
}

tally_block_t *tally__cache_malloc_in_locked(tally_device_t *d, size_t orig, void *stream, void *site,
                                             tally_gpool_t *priv)
{
    return malloc_general(d, orig, stream, site, priv, tally__cache_alloc_begin_locked(d, stream));
}

static tally_block_t *malloc_general(tally_device_t *d, size_t orig, void *stream, void *site, tally_gpool_t *priv,
                                     bool capturing)
{
    alloc_params_t p;
    /* Pass-through: graph pools are records only (graph_pool.c). */
    p.gp = TALLY_UNLIKELY(d->nallocating) && !tally__g.backend->passthrough ? tally__gpool_match_locked(d, stream)
                                                                             : NULL;
    if (TALLY_UNLIKELY(priv != NULL) && !p.gp) {
        if (priv->sleep && tally__ppool_asleep(priv)) {
            tally__fail(TALLY_ESTATE, "tally_malloc: private pool %u of device %d is asleep", priv->private_id, d->id);
            return NULL;
        }
        p.gp = priv;
    }
    if (TALLY_UNLIKELY(capturing) && !p.gp && tally__capture_listed(d, stream) && !tally__g.backend->passthrough) {
        /* Memory the graph would use on replay must not go back to eager
         * code: without a graph pool there is no safe place for it. */
        tally__fail(TALLY_ESTATE,
                    "tally_malloc: stream %p of device %d is capturing a CUDA graph and no graph pool is open for it: "
                    "under PyTorch, torch.cuda.graph needs tally's graph-pool hooks (tally.install() sets them; "
                    "PyTorch 2.3 or newer); from C, call tally_graph_pool_begin before the capture",
                    stream, d->id);
        return NULL;
    }
    p.stream = stream;
    p.size = round_size(orig);
    p.pool = p.size <= SMALL_SIZE ? TALLY_POOL_SMALL : TALLY_POOL_LARGE;
    p.alloc_size = tally__segment_size(p.size);
    if (TALLY_OPT(expandable_move_budget) > 0 && tally__expand_on())
        tally__expand_note_alloc_locked(d, p.size, (uint64_t)tally__stat_all_current(d->stats.requested_bytes));
    p.block = NULL;
    p.err = 0;
    p.why[0] = 0;
    if (!find_block(d, &p)) {
        report_failure(d, orig, &p);
        return NULL;
    }
    tally_block_t *b = p.block;
    if (TALLY_UNLIKELY(b->seg == d->lent_kept))
        d->lent_kept = NULL;
    /* Out of the pool from here on: no merge may take it. */
    b->state = BLOCK_ALLOCATED;
    take_front(d, tally__pool_of(d, b), b, p.size, !tally__g.backend->passthrough && should_split(b, p.size),
               !b->seg->ex, b->pool);
    if (b->seg->ex) {
        /* Back the block with pages; on OOM release what is cached and
         * retry once, as for a new segment. */
        int rc = tally__expand_map_locked(d, b, true, p.why, sizeof p.why);
        if (rc == TALLY_ENOMEM) {
            tally__cache_release_all_locked(d);
            d->stats.num_alloc_retries++;
            rc = tally__expand_map_locked(d, b, false, p.why, sizeof p.why);
        }
        if (rc) {
            tally__cache_undo_take_locked(d, b);
            p.err = rc;
            report_failure(d, orig, &p);
            return NULL;
        }
        b->paged = 1;
    }
    if (tally__ptrmap_put(&d->map, b->addr, b)) {
        /* Cannot track it: put it back and fail cleanly. */
        tally__cache_undo_take_locked(d, b);
        tally__fail(TALLY_ENOMEM, "out of host memory for the pointer map");
        return NULL;
    }
    /* Pass-through: a graph allocation may be freed inside its capture. */
    return tally__cache_hand_out(d, b, b->pool, orig, site, TALLY_UNLIKELY(capturing) && tally__capture_listed(d, stream));
}
