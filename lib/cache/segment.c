/* Segments (one backend allocation each, or with expandable segments a
 * small one lent by an expandable one, below): the device's list of them,
 * and their release: a whole free segment goes back to the backend (an
 * expandable segment's mapped pages, a private pool's mapping), from one
 * pool (empty_cache, graph pools, the small pool whose memory expandable
 * segments take), by garbage collection under a memory fraction, and for
 * all the device's pools together (tally__cache_release_all_locked, the
 * last step before an OOM). A new segment is made where an allocation
 * needs one (cache.c). Every function here runs with the device's lock
 * held. */
#include "cache/cache.h"

/* ---- segments ------------------------------------------------------------ */

void tally__segment_link_locked(tally_device_t *d, tally_segment_t *s)
{
    s->prev = NULL;
    s->next = d->segments;
    if (d->segments)
        d->segments->prev = s;
    d->segments = s;
    d->nsegments++;
}

/* b becomes the piece [addr, addr + size) of segment s (its stream and
 * pool), after prev (NULL: s's first block) and last in s. */
void tally__block_place(tally_block_t *b, tally_segment_t *s, uintptr_t addr, size_t size, tally_block_t *prev)
{
    b->addr = addr;
    b->size = size;
    b->stream = s->stream;
    b->seg = s;
    b->pool = s->pool;
    b->prev = prev;
    b->next = NULL;
}

void tally__segment_unlink_locked(tally_device_t *d, tally_segment_t *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        d->segments = s->next;
    if (s->next)
        s->next->prev = s->prev;
    d->nsegments--;
}

tally_segment_t *tally__cache_segment_of_locked(tally_device_t *d, uintptr_t addr)
{
    /* A small segment lent by an expandable one lies inside it: the
     * innermost segment holding addr is the one named. */
    tally_segment_t *outer = NULL;
    for (tally_segment_t *s = d->segments; s; s = s->next)
        if (addr >= s->base && addr - s->base < s->size) {
            if (!s->ex)
                return s;
            outer = s;
        }
    return outer;
}

/* Return a whole segment (one block) to the backend; in_pool says whether
 * the block sits in its pool (pass-through blocks never do). */
void tally__cache_release_segment_locked(tally_device_t *d, tally_block_t *b, bool in_pool)
{
    tally_segment_t *s = b->seg;
    if (TALLY_UNLIKELY(s->run_va) && !tally__small_run_release_locked(d, s))
        return; /* the backend kept its pages: it stays cached */
    if (in_pool)
        tally__pool_erase(tally__pool_of(d, b), b);
    if (s->run_va) {
        /* Unmapped and counted above (small_run.c). */
    } else if (s->lender) {
        /* A piece of an expandable segment: it goes back there (no driver call). */
        tally__lend_return_locked(d, s);
    } else if (s->ex) {
        /* Its pages are unmapped (and counted) one by one. */
        tally__expand_release_locked(d, s);
    } else {
        d->stats.num_device_free++;
        bool asleep = s->asleep; /* its bytes left reserved when it slept */
        if (TALLY_UNLIKELY(s->vm))
            tally__vm_segment_free_locked(d, s);
        else
            tally__g.backend->free(d->id, (void *)b->addr, b->size, b->stream);
        if (!asleep) {
            d->reserved -= b->size;
            tally__stat_pool_dec(d->stats.reserved_bytes, b->pool, (int64_t)b->size);
        }
        if (b->size >= tally__opt.max_split_size)
            tally__stat_dec(&d->stats.oversize_segments, 1);
    }
    tally__stat_pool_dec(d->stats.segment, b->pool, 1);
    tally__cache_hooks.device_event(d, TALLY_EV_SEGMENT_FREE, b->addr, b->size, b->stream);
    tally__segment_unlink_locked(d, s);
    if (TALLY_UNLIKELY(s->gp != NULL))
        tally__gpool_segment_gone_locked(d, s->gp);
    tally__meta_free(s);
    tally__cache_block_delete_locked(d, b);
}

void tally__cache_release_block_locked(tally_device_t *d, tally_block_t *b)
{
    tally__cache_release_segment_locked(d, b, true);
}

/* Blocks are collected first: releasing changes the pool being walked. */
typedef struct collect {
    tally_block_t **items;
    size_t n, cap;
} collect_t;

static void collect_whole(tally_block_t *b, void *arg)
{
    collect_t *c = arg;
    if (b->prev || b->next)
        return;
    if (c->n < c->cap)
        c->items[c->n++] = b;
}

/* Release whole free segments of pool p until want bytes are given back
 * (SIZE_MAX: all of them). */
static size_t release_pool(tally_device_t *d, tally_pool_t *p, size_t want)
{
    /* Nothing is released while a capture may be under way: cuMemFree may
     * synchronise (PyTorch releases nothing then either). */
    if (!p->count || tally__capture_on_locked(d))
        return 0;
    collect_t c = {tally__meta_alloc(p->count * sizeof(tally_block_t *)), 0, p->count};
    if (!c.items)
        return 0;
    tally__pool_walk(p, collect_whole, &c);
    size_t released = 0;
    for (size_t i = 0; i < c.n && released < want; i++) {
        /* An expandable segment gives back its mapped pages, not its range. */
        tally_block_t *b = c.items[i];
        if (b->seg->ex && tally__expand_unmap_held_locked(d))
            continue; /* no unmap during a capture: the next release */
        /* A lent small segment's memory stays mapped in its expandable
         * segment, whose trim gives it back (tally__cache_release_all_locked). */
        released += b->seg->ex ? tally__expand_mapped_bytes(b->seg) : b->seg->lender ? 0 : b->size;
        tally__cache_release_block_locked(d, b);
    }
    tally__meta_free(c.items);
    return released;
}

/* Release every whole free segment of pool p (graph pools, release_all). */
size_t tally__cache_release_pool_locked(tally_device_t *d, tally_pool_t *p)
{
    return release_pool(d, p, SIZE_MAX);
}

/* Release whole free small-pool segments until at least want bytes are
 * given back (expandable segments move this memory to where large blocks
 * need pages, as they move idle pages). Returns the bytes released. */
size_t tally__cache_release_small_locked(tally_device_t *d, size_t want)
{
    /* Lent small segments (the only ones when small segments are shared) go
     * back to their expandable segment as soon as they are free: none to
     * release here. */
    return want && !tally__lend_on() ? release_pool(d, &d->small, want) : 0;
}

void tally__cache_garbage_collect_locked(tally_device_t *d)
{
    uint64_t threshold = (uint64_t)(tally__opt_double(&tally__opt.gc_threshold) * (double)d->allowed_max);
    if (d->reserved <= threshold || tally__capture_on_locked(d))
        return; /* nothing is released during a capture (release_pool) */
    uint64_t target = d->reserved - threshold, reclaimed = 0;
    tally_pool_t *pool = &d->large;
    collect_t c = {tally__meta_alloc((pool->count + 1) * sizeof(tally_block_t *)), 0, pool->count};
    if (!c.items)
        return;
    tally__pool_walk(pool, collect_whole, &c);
    double total_age = 0;
    size_t n = c.n;
    for (size_t i = 0; i < c.n; i++)
        total_age += (double)(pool->get_free_calls - c.items[i]->gc_base);
    bool freed = true;
    while (reclaimed < target && freed && n > 0) {
        double age_threshold = total_age / (double)n;
        freed = false;
        for (size_t i = 0; i < c.n; i++) {
            tally_block_t *b = c.items[i];
            if (!b)
                continue;
            double age = (double)(pool->get_free_calls - b->gc_base);
            if (age >= age_threshold) {
                freed = true;
                reclaimed += b->size;
                total_age -= age;
                n--;
                c.items[i] = NULL;
                tally__cache_release_block_locked(d, b);
            }
        }
    }
    tally__meta_free(c.items);
}

size_t tally__cache_release_all_locked(tally_device_t *d)
{
    const tally_backend_t *be = tally__g.backend;
    if (be->passthrough) {
        /* The pool holds the cache: wait for the device, then trim it
         * (not while a capture may be under way: that would end it). */
        uint64_t before[4] = {0}, after[4] = {0};
        if (tally__capture_on_locked(d))
            return 0;
        d->stats.num_sync_all_streams++;
        be->synchronize(d->id);
        be->pool_usage(d->id, before);
        be->trim(d->id, 0);
        be->pool_usage(d->id, after);
        return before[0] > after[0] ? (size_t)(before[0] - after[0]) : 0;
    }
    if (tally__capture_on_locked(d))
        return 0; /* no event synchronised, nothing released during a capture */
    tally__events_wait_all_locked(d);
    /* Lent small segments first: their pieces then free their expandable
     * segment's pages. */
    bool lent = tally__lend_on();
    size_t released = lent ? tally__cache_release_pool_locked(d, &d->small) : 0;
    released += tally__cache_release_pool_locked(d, &d->large);
    if (!lent)
        released += tally__cache_release_pool_locked(d, &d->small);
    if (TALLY_UNLIKELY(d->gpools != NULL))
        released += tally__gpool_release_freeable_locked(d);
    if (TALLY_UNLIKELY(d->ppools != NULL))
        released += tally__ppool_release_locked(d);
    if (tally__expand_on())
        released += tally__expand_trim_locked(d);
    released += tally__small_run_trim_locked(d);
    return released;
}

/* ---- the small pool on expandable segments ------------------------------ */

/* With expandable_segments:true and expandable_small_shared:true (off by
 * default).
 *
 * Without expandable segments each small-pool segment is a 2 MiB backend
 * allocation (cudaMalloc), as in PyTorch. PyTorch's expandable mode gives
 * the small pool an expandable segment of its own per stream, mapped in
 * 2 MiB pages. Either way the small pool keeps its high-water mark apart
 * from the large pool's: memory the small pool holds free cannot serve a
 * large block, and pages the large pool holds mapped but idle cannot serve
 * a small one. On the shared traces that split was most of tally's excess
 * over peak live on opt125m (32 MiB of free small segments at the peak) and
 * gpt2 (56 MiB), and at 4steps-cold's peak the small pool grew by 70 MiB
 * while the large one held 860 MiB of idle mapped pages.
 *
 * So here the small pool borrows. Its new segment on a stream is a 2 MiB
 * piece of the stream's expandable segment, chosen as a large block of 2 MiB
 * would be (best fit, preferring mapped pages) and backed the same way; the
 * piece stays out of the large pool as a BLOCK_LENT block, counted on its
 * pages so that they stay mapped. Taking idle mapped pages costs no driver
 * call at all. When the small segment is wholly free again it is given back
 * at once: the piece returns to the large pool (merged with its free
 * neighbours) and no driver call is made either; one wholly free lent
 * segment per device is kept (d->lent_kept), so a job that takes and frees
 * one small block does not lend and return a piece on every pair.
 *
 * Statistics: a lent segment is a small-pool segment (segment.small, its
 * 2 MiB in reserved_bytes.small) and its bytes leave reserved_bytes.large
 * while it is lent; the device's reserved total does not change (the pages
 * were, or are, mapped by the expandable segment). No cudaMalloc or
 * cudaFree is counted (num_device_alloc / _free). Graph pools and private
 * pools keep their own small segments. Reports list a lent segment as a
 * small segment at its addresses and leave its piece out of the expandable
 * segment's blocks (json_report.c), so no byte is listed twice. */
bool tally__lend_on(void)
{
    return TALLY_OPT(expandable_small_shared) && tally__expand_on();
}

tally_segment_t *tally__lend_segment_locked(tally_device_t *d, tally_block_t *c, struct tally_binset *bins)
{
    tally_segment_t *s = tally__meta_calloc(sizeof *s);
    tally_block_t *b = s ? tally__cache_block_new(d) : NULL;
    if (!b) {
        tally__meta_free(s);
        return NULL;
    }
    s->base = c->addr;
    s->size = c->size;
    s->stream = c->stream;
    s->pool = TALLY_POOL_SMALL;
    s->device = d->id;
    s->head = b;
    s->bins = bins;
    s->lender = c;
    tally__segment_link_locked(d, s);
    tally__block_place(b, s, c->addr, c->size, NULL);
    tally__stat_pool_inc(d->stats.segment, TALLY_POOL_SMALL, 1);
    /* The large pool's figure first: the all entry's peak is taken at the
     * rise, and the pages must not count twice there. */
    tally__stat_pool_dec(d->stats.reserved_bytes, TALLY_POOL_LARGE, (int64_t)c->size);
    tally__stat_pool_inc(d->stats.reserved_bytes, TALLY_POOL_SMALL, (int64_t)c->size);
    tally__cache_hooks.device_event(d, TALLY_EV_SEGMENT_ALLOC, b->addr, b->size, b->stream);
    return s;
}

void tally__lend_return_locked(tally_device_t *d, tally_segment_t *s)
{
    tally_block_t *c = s->lender;
    if (d->lent_kept == s)
        d->lent_kept = NULL;
    tally__stat_pool_dec(d->stats.reserved_bytes, TALLY_POOL_SMALL, (int64_t)s->size);
    tally__stat_pool_inc(d->stats.reserved_bytes, TALLY_POOL_LARGE, (int64_t)s->size);
    s->lender = NULL;
    tally__cache_undo_take_locked(d, c);
}

void tally__lend_idle_locked(tally_device_t *d, tally_block_t *b)
{
    if (!d->lent_kept || d->lent_kept == b->seg) {
        d->lent_kept = b->seg;
        return;
    }
    tally__cache_release_block_locked(d, b);
}
