/* CUDA graph capture in the cache.
 *
 * Capture tracking. A capture is announced by tally_graph_pool_begin (PyTorch
 * calls its graph-pool begin hook before cudaStreamBeginCapture, and the end
 * hook, in 2.6-2.9, after cudaStreamEndCapture): from begin to end a capture
 * may be under way, on any device (tally__g.announced counts the pools
 * between begin and end on all devices: a global-mode capture forbids the
 * potentially unsafe calls from every thread, whatever the device). Besides,
 * a stream seen capturing at an allocation (cuStreamIsCapturing through the
 * backend) is remembered, and the streams remembered are re-checked at each
 * allocation and free until none captures any more. While a capture may be
 * under way (tally__capture_on_locked) the cache makes no potentially unsafe
 * call: it queries and synchronises no event, releases no cached memory
 * (cuMemFree may synchronise; the OOM path and empty_cache free nothing,
 * as PyTorch's allocator does), unmaps nothing, and a block freed with uses
 * on other streams gets its events only once the capture has ended
 * (deferred); under a pass-through backend (async) a free of a block
 * allocated outside the capture, or used on other streams, waits for the
 * end too (cuMemFreeAsync in a capture takes only graph allocations).
 * Once any capture has been announced, tally relies on announcements: the
 * cached malloc/free path outside them asks the driver nothing (no
 * cuStreamIsCapturing); before that it spends one call per allocation.
 *
 * Graph pools: between tally_graph_pool_begin and tally_graph_pool_end,
 * allocations on the device that the pool's filter accepts (PyTorch passes
 * one that accepts the capturing stream) are served from the pool's own
 * segments, and their free blocks go back to that pool only: eager
 * allocations never receive memory a graph may still use on replay. A pool
 * lives until tally_graph_pool_release has been called as often as begin
 * (PyTorch shares one pool between graphs); its whole free segments are then
 * returned at once and at every later empty_cache. */
#include "cache/cache.h"

#include <string.h>

static bool listed(const tally_device_t *d, void *stream)
{
    for (int i = 0; i < d->ncapturing; i++)
        if (d->capturing[i] == stream)
            return true;
    return false;
}

bool tally__capture_listed(const tally_device_t *d, void *stream)
{
    return listed(d, stream);
}

bool tally__capture_underway_locked(tally_device_t *d)
{
    const tally_backend_t *be = tally__g.backend;
    for (int i = 0; i < d->ncapturing;) {
        if (be->stream_capturing(d->id, d->capturing[i]) > 0) {
            i++;
            continue;
        }
        d->capturing[i] = d->capturing[--d->ncapturing];
    }
    return d->ncapturing > 0;
}

bool tally__capture_on_locked(tally_device_t *d)
{
    if (atomic_load_explicit(&tally__g.announced, memory_order_acquire) > 0)
        return true;
    return TALLY_UNLIKELY(d->ncapturing != 0) && tally__capture_underway_locked(d);
}

bool tally__capture_check_locked(tally_device_t *d, void *stream)
{
    bool was_listed = listed(d, stream);
    if (d->ncapturing && tally__capture_underway_locked(d))
        return true; /* stream re-checked too if it was listed */
    if (was_listed)
        return false;
    if (tally__g.backend->stream_capturing(d->id, stream) <= 0)
        return false;
    if (d->ncapturing < TALLY_MAX_CAPTURING)
        d->capturing[d->ncapturing++] = stream;
    return true;
}

int tally__capture_defer_locked(tally_device_t *d, tally_block_t *b)
{
    if (d->ndeferred == d->cap_deferred) {
        size_t cap = d->cap_deferred ? d->cap_deferred * 2 : 16;
        tally_block_t **grown = tally__meta_alloc(cap * sizeof *grown);
        if (!grown)
            return -1;
        if (d->ndeferred)
            memcpy(grown, d->deferred, d->ndeferred * sizeof *grown);
        tally__meta_free(d->deferred);
        d->deferred = grown;
        d->cap_deferred = cap;
    }
    b->deferred = 1;
    d->deferred[d->ndeferred++] = b;
    return 0;
}

tally_gpool_t *tally__gpool_match_locked(tally_device_t *d, void *stream)
{
    for (tally_gpool_t *gp = d->gpools; gp; gp = gp->next)
        if (gp->allocating && (!gp->filter || gp->filter(gp->arg, stream)))
            return gp;
    return NULL;
}

static tally_gpool_t *find(tally_device_t *d, uint64_t hi, uint64_t lo, tally_gpool_t ***link)
{
    tally_gpool_t **l = &d->gpools;
    for (; *l; l = &(*l)->next)
        if ((*l)->hi == hi && (*l)->lo == lo)
            break;
    if (link)
        *link = l;
    return *l;
}

static void unlink_pool(tally_device_t *d, tally_gpool_t *gp)
{
    tally_gpool_t **l;
    if (find(d, gp->hi, gp->lo, &l) == gp)
        *l = gp->next;
    for (uint32_t i = 0; i < gp->small.nsets; i++)
        tally__meta_free(gp->small.sets[i]);
    tally__meta_free(gp->small.sets);
    tally__meta_free(gp);
}

void tally__gpool_segment_gone_locked(tally_device_t *d, tally_gpool_t *gp)
{
    if (--gp->nsegments == 0 && gp->use_count == 0)
        unlink_pool(d, gp);
}

size_t tally__gpool_release_freeable_locked(tally_device_t *d)
{
    size_t released = 0;
    tally_gpool_t *gp = d->gpools;
    while (gp) {
        tally_gpool_t *next = gp->next;
        if (gp->use_count == 0) {
            /* Held by one extra count while its pools are walked: the
             * last segment released frees gp itself. */
            gp->nsegments++;
            released += tally__cache_release_pool_locked(d, &gp->large);
            released += tally__cache_release_pool_locked(d, &gp->small);
            tally__gpool_segment_gone_locked(d, gp);
        }
        gp = next;
    }
    return released;
}

/* ---- the public API's bodies (lib/api/graph.c initialises, then calls them) ---- */

/* The device, or NULL with *rc set to the error. Under a pass-through
 * backend the pools are kept as records (begin, end and release pair up, and
 * announce the capture) but never serve memory: the driver's pool follows
 * CUDA's own graph memory rules. */
static tally_device_t *graph_device(int device, const char *fn, uint64_t hi, uint64_t lo, int *rc)
{
    *rc = -TALLY_EINVAL;
    tally_device_t *d = tally__device_lookup(device, fn);
    if (!d)
        return NULL;
    if (hi == 0 && lo == 0) {
        *rc = tally__fail(TALLY_EINVAL, "%s: pool id (0, 0) is not a graph pool (PyTorch's ids are never both 0)",
                          fn);
        return NULL;
    }
    return d;
}

int tally__graph_pool_begin(int device, uint64_t id_hi, uint64_t id_lo, int (*filter)(void *arg, void *stream),
                           void *arg)
{
    int rc;
    tally_device_t *d = graph_device(device, "tally_graph_pool_begin", id_hi, id_lo, &rc);
    if (!d)
        return rc;
    rc = 0;
    tally__dev_lock(&d->lock);
    tally_gpool_t *gp = find(d, id_hi, id_lo, NULL);
    if (gp && gp->allocating) {
        tally__dev_unlock(&d->lock);
        return tally__fail(TALLY_ESTATE, "tally_graph_pool_begin: pool (%llu, %llu) on device %d is already "
                           "allocating (begin twice without end)",
                           (unsigned long long)id_hi, (unsigned long long)id_lo, device);
    }
    if (!gp) {
        gp = tally__meta_calloc(sizeof *gp);
        if (!gp) {
            tally__dev_unlock(&d->lock);
            return tally__fail(TALLY_ENOMEM, "tally_graph_pool_begin: out of host memory");
        }
        gp->hi = id_hi;
        gp->lo = id_lo;
        gp->small.kind = TALLY_POOL_SMALL;
        gp->large.kind = TALLY_POOL_LARGE;
        gp->next = d->gpools;
        d->gpools = gp;
    }
    gp->filter = filter;
    gp->arg = arg;
    gp->allocating = true;
    gp->use_count++;
    d->nallocating++;
    atomic_store(&tally__g.announces, true);
    atomic_fetch_add(&tally__g.announced, 1);
    tally__dev_unlock(&d->lock);
    return 0;
}

int tally__graph_pool_end(int device, uint64_t id_hi, uint64_t id_lo)
{
    int rc;
    tally_device_t *d = graph_device(device, "tally_graph_pool_end", id_hi, id_lo, &rc);
    if (!d)
        return rc;
    rc = 0;
    tally__dev_lock(&d->lock);
    tally_gpool_t *gp = find(d, id_hi, id_lo, NULL);
    if (!gp || !gp->allocating) {
        rc = tally__fail(TALLY_ESTATE, "tally_graph_pool_end: pool (%llu, %llu) on device %d is not allocating",
                         (unsigned long long)id_hi, (unsigned long long)id_lo, device);
    } else {
        gp->allocating = false;
        gp->filter = NULL;
        gp->arg = NULL;
        d->nallocating--;
        atomic_fetch_sub(&tally__g.announced, 1);
        tally__events_capture_on_locked(d, NULL, false); /* deferred frees go now, if no capture is left */
    }
    tally__dev_unlock(&d->lock);
    return rc;
}

int tally__graph_pool_release(int device, uint64_t id_hi, uint64_t id_lo)
{
    int rc;
    tally_device_t *d = graph_device(device, "tally_graph_pool_release", id_hi, id_lo, &rc);
    if (!d)
        return rc;
    rc = 0;
    tally__dev_lock(&d->lock);
    tally_gpool_t *gp = find(d, id_hi, id_lo, NULL);
    if (!gp || gp->use_count == 0) {
        rc = tally__fail(TALLY_EINVAL, "tally_graph_pool_release: no pool (%llu, %llu) on device %d",
                         (unsigned long long)id_hi, (unsigned long long)id_lo, device);
    } else {
        if (gp->allocating) {
            gp->allocating = false;
            d->nallocating--;
            atomic_fetch_sub(&tally__g.announced, 1);
        }
        if (--gp->use_count == 0) {
            if (gp->nsegments == 0)
                unlink_pool(d, gp);
            else
                tally__gpool_release_freeable_locked(d);
        }
    }
    tally__dev_unlock(&d->lock);
    return rc;
}
