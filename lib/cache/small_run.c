/* The small pool on expandable segments (expandable_segments:true with
 * expandable_small_pages, the default, and not expandable_small_shared):
 * each stream's small pool is one run of 2 MiB pages, as PyTorch's own
 * expandable mode gives it an expandable segment.
 *
 * Without it each small-pool segment is a 2 MiB backend allocation, and a
 * block never crosses from one into the next: the free tail of one segment
 * and the free head of the next stay two blocks, and a request that fits
 * in neither takes a new segment. In a run, the pages lie end to end in one
 * reserved address range (1 1/8 of the device's memory, as the large
 * pool's), blocks split and merge as in any segment, and a free block can
 * span pages; so the small pool holds fewer free bytes. On the shared
 * traces this was the whole of opt125m's excess over PyTorch's expandable
 * segments: its small pool peaked at 34 MiB in 2 MiB segments and at 26 in
 * PyTorch's pages (docs/benchmarks.md, run T).
 *
 * The run is one segment whose size is its mapped part, from its base, so
 * everything that walks a segment's blocks (merges, checks, reports) works
 * on it unchanged; the addresses after it are reserved but not a block.
 * It grows only at its end, as PyTorch's: a request no free block fits
 * takes the free block at the run's end, if there is one, and maps the
 * pages it lacks after it (one backend call, a physical handle per page),
 * or a new block of whole pages after an allocated end. Pages are never
 * unmapped in a step: an empty_cache (or the release before an OOM) gives
 * back a wholly free run (its pages and its range), and the whole free pages
 * at the end of any other (tally__small_run_trim_locked); free pages inside
 * a run stay mapped until the blocks around them are free (PyTorch unmaps
 * those too; here a run only ever shrinks from its end, so that the run
 * stays one mapped stretch from its base).
 *
 * Statistics are a segment's: one segment per run (segment.small), its
 * mapped bytes in reserved_bytes.small, its free pieces counted as inactive
 * splits when it holds more than one block; a map call is a
 * num_device_alloc, an unmap a num_device_free. Free blocks over 2 MiB
 * are kept beside the small pool's bins, by size and address (small.c), and
 * a run's frees take the general path (which can file them there), so the
 * fast paths are those of 2 MiB segments.
 * Graph pools and private pools keep their own 2 MiB segments. Runs with
 * the device lock held. */
#include "cache/cache.h"

#include <stdio.h>

#define PAGE ((size_t)2 << 20)

/* With a move budget the small pool keeps 2 MiB segments: a move may
 * release a wholly free one to pay for a large block's pages (expand.c),
 * where a run goes back only whole (on the shared traces, gpt2 with
 * unlimited moves peaks at 3,678 MiB with segments, 3,730 with a run). */
bool tally__small_run_on(void)
{
    return TALLY_OPT(expandable_small_pages) && !TALLY_OPT(expandable_small_shared) &&
           TALLY_OPT(expandable_move_budget) == 0 && tally__expand_on();
}

tally_segment_t *tally__small_run_of_locked(tally_device_t *d, void *stream)
{
    for (tally_segment_t *s = d->segments; s; s = s->next)
        if (s->run_va && s->stream == stream)
            return s;
    return NULL;
}

/* A new, empty run for stream (no block yet: the caller maps its first
 * pages at once, or takes it back with run_drop). */
static int run_make(tally_device_t *d, void *stream, tally_segment_t **out, char *why, size_t whylen)
{
    size_t free_b = 0, total = 0;
    if (tally__g.backend->mem_info(d->id, &free_b, &total) || total == 0) {
        snprintf(why, whylen, "cannot read the memory of device %d for the small pool's pages", d->id);
        return TALLY_EBACKEND;
    }
    struct tally_binset *bins;
    tally_segment_t *s = tally__meta_calloc(sizeof *s);
    if (!s || tally__pool_prepare(&d->small, stream, &bins)) {
        tally__meta_free(s);
        snprintf(why, whylen, "out of host memory for metadata");
        return TALLY_ENOMEM;
    }
    size_t va = (total + total / 8 + PAGE - 1) / PAGE * PAGE;
    void *base = NULL;
    int rc = tally__g.backend->reserve(d->id, va, &base, why, whylen);
    if (rc) {
        tally__meta_free(s);
        return rc;
    }
    s->base = (uintptr_t)base;
    s->run_va = va;
    s->run = 1;
    s->stream = stream;
    s->pool = TALLY_POOL_SMALL;
    s->device = d->id;
    s->bins = bins;
    tally__segment_link_locked(d, s);
    tally__stat_pool_inc(d->stats.segment, TALLY_POOL_SMALL, 1);
    *out = s;
    return 0;
}

/* Take back a run that never got a page. */
static void run_drop(tally_device_t *d, tally_segment_t *s)
{
    tally__g.backend->unreserve(d->id, (void *)s->base, s->run_va);
    tally__stat_pool_dec(d->stats.segment, TALLY_POOL_SMALL, 1);
    tally__segment_unlink_locked(d, s);
    tally__meta_free(s);
}

bool tally__small_run_grow_locked(tally_device_t *d, void *stream, size_t size, tally_block_t **out, int *err,
                                  char *why, size_t whylen)
{
    tally_segment_t *s = tally__small_run_of_locked(d, stream);
    bool made = false;
    if (!s) {
        int rc = run_make(d, stream, &s, why, whylen);
        if (rc) {
            *err = rc;
            return false;
        }
        made = true;
    }
    tally_block_t *tail = s->head;
    while (tail && tail->next)
        tail = tail->next;
    size_t have = tail && tail->state == BLOCK_FREE ? tail->size : 0;
    size_t bytes = (size - (have < size ? have : size) + PAGE - 1) / PAGE * PAGE;
    /* The record first: nothing to undo after the map. */
    tally_block_t *nb = have ? NULL : tally__cache_block_new(d);
    int rc = 0;
    if (!have && !nb) {
        rc = TALLY_ENOMEM;
        snprintf(why, whylen, "out of host memory for metadata");
    } else if (s->size + bytes > s->run_va) {
        rc = TALLY_ENOMEM;
        snprintf(why, whylen, "the small pool's address range of device %d is full", d->id);
    } else if (d->allowed_max != UINT64_MAX && d->reserved + bytes > d->allowed_max) {
        rc = TALLY_ENOMEM;
        snprintf(why, whylen, "memory fraction limit of %llu bytes reached", (unsigned long long)d->allowed_max);
    } else {
        rc = tally__g.backend->map(d->id, (void *)(s->base + s->size), bytes, PAGE, why, whylen);
    }
    if (rc) {
        if (nb)
            tally__cache_block_delete_locked(d, nb);
        if (made)
            run_drop(d, s);
        *err = rc;
        return false;
    }
    uintptr_t at = s->base + s->size;
    s->size += bytes;
    d->reserved += bytes;
    d->stats.num_device_alloc++;
    tally__cache_reserved_rise_locked(d, TALLY_POOL_SMALL, (int64_t)bytes);
    tally__cache_hooks.device_event(d, TALLY_EV_SEGMENT_ALLOC, at, bytes, stream);
    if (have) {
        /* The free end grows: out of its bin at its old size. */
        tally__pool_erase(&d->small, tail);
        tail->size += bytes;
        if (tail->prev)
            tally__stat_pool_inc(d->stats.inactive_split_bytes, TALLY_POOL_SMALL, (int64_t)bytes);
        *out = tail;
        return true;
    }
    tally__block_place(nb, s, at, bytes, tail);
    nb->state = BLOCK_FREE;
    if (tail) {
        tail->next = nb;
        /* The run now holds more than one block: its free piece is a split. */
        tally__stat_pool_inc(d->stats.inactive_split, TALLY_POOL_SMALL, 1);
        tally__stat_pool_inc(d->stats.inactive_split_bytes, TALLY_POOL_SMALL, (int64_t)bytes);
    } else {
        s->head = nb;
    }
    *out = nb;
    return true;
}

/* Unmap [at, at + bytes) of run s after its stream's work; false (nothing
 * changed) when the backend refused. */
static bool run_unmap(tally_device_t *d, tally_segment_t *s, uintptr_t at, size_t bytes)
{
    const tally_backend_t *be = tally__g.backend;
    if (be->stream_sync && be->stream_sync(d->id, s->stream))
        return false;
    if (be->unmap(d->id, (void *)at, bytes))
        return false;
    d->stats.num_device_free++;
    d->reserved -= bytes;
    tally__stat_pool_dec(d->stats.reserved_bytes, TALLY_POOL_SMALL, (int64_t)bytes);
    return true;
}

bool tally__small_run_release_locked(tally_device_t *d, tally_segment_t *s)
{
    /* Its pages in one call (a handle per page, every one mapped), then its
     * range. */
    if (!run_unmap(d, s, s->base, s->size))
        return false;
    tally__g.backend->unreserve(d->id, (void *)s->base, s->run_va);
    return true;
}

size_t tally__small_run_trim_locked(tally_device_t *d)
{
    if (tally__capture_on_locked(d))
        return 0;
    size_t released = 0;
    for (tally_segment_t *s = d->segments; s; s = s->next) {
        if (!s->run_va || !s->head || !s->head->next)
            continue; /* a wholly free run goes whole (segment.c) */
        tally_block_t *tail = s->head->next;
        while (tail->next)
            tail = tail->next;
        if (tail->state != BLOCK_FREE)
            continue;
        uintptr_t end = s->base + s->size;
        uintptr_t from = (tail->addr + PAGE - 1 - s->base) / PAGE * PAGE + s->base;
        if (from >= end)
            continue;
        size_t bytes = end - from;
        tally__pool_erase(&d->small, tail);
        if (!run_unmap(d, s, from, bytes)) {
            tally__pool_insert(&d->small, tail);
            continue;
        }
        s->size -= bytes;
        released += bytes;
        tally__cache_hooks.device_event(d, TALLY_EV_SEGMENT_FREE, from, bytes, s->stream);
        if (from > tail->addr) {
            tally__stat_pool_dec(d->stats.inactive_split_bytes, TALLY_POOL_SMALL, (int64_t)bytes);
            tail->size = from - tail->addr;
            tally__pool_insert(&d->small, tail);
            continue;
        }
        /* The whole tail went; the block before it (allocated: free
         * neighbours merge) is the end now. */
        tally__stat_pool_dec(d->stats.inactive_split_bytes, TALLY_POOL_SMALL, (int64_t)bytes);
        tally__stat_pool_dec(d->stats.inactive_split, TALLY_POOL_SMALL, 1);
        tail->prev->next = NULL;
        tally__cache_block_delete_locked(d, tail);
    }
    return released;
}
