/* Private pools: memory that no other pool shares, and that can sleep.
 *
 * A private pool is a tally_gpool_t on the device's ppools list, keyed by
 * an id the API layer derives from a private tag (the cache never sees the
 * tag). Its small and large pools hold only its own segments, as a graph
 * pool's do, so its blocks never sit on pages of another pool's blocks and
 * its free memory is never handed to anyone else.
 *
 * Its segments are made on the backend's virtual-memory path: one address
 * reservation per segment with the whole of it mapped as one physical
 * handle (tally__vm_segment_alloc_locked). So a sleep can unmap a segment
 * and keep its addresses, and a wake can map it back at the same place.
 *
 * Sleep (tally__ppool_sleep_locked):
 *   1. waits for the work tally knows uses the pool: each segment's stream
 *      (its blocks' allocation stream) and every stream recorded on a live
 *      block (record_stream), each on its own device, plus the device's
 *      pending events; or the whole device when asked to;
 *   2. gives whole free segments back (nothing in them to keep);
 *   3. with offload, copies every live block to host memory (pinned on
 *      CUDA); a failure here frees the copies made and changes nothing;
 *   4. unmaps each segment: reserved memory drops by its bytes, its
 *      addresses stay reserved (on the host backend the range becomes
 *      PROT_NONE, so a use while asleep faults).
 * Wake (tally__ppool_wake_locked) maps each sleeping segment back at its
 * address and copies the backups back; if a map or a copy fails, the
 * segments it had mapped are unmapped again and the pool stays asleep with
 * its backups intact.
 *
 * Work queued on a stream tally was never told about (no allocation on it,
 * no record_stream) is not waited for: it would race the unmap. Such
 * programs ask for the device-synchronise form (docs/sleep.md). */
#include "cache/cache.h"

#include <stdio.h>
#include <string.h>

typedef struct tally_backup {
    uintptr_t addr;
    size_t size;
    void *host;
} tally_backup_t;

struct tally_sleep {
    bool asleep, offloaded;
    tally_backup_t *items;
    size_t n, cap;
    uint64_t offload_bytes;
    /* Host buffers of the last wake, kept pinned for the next offload
     * (sleep_pinned_cache): taken by size, the rest freed by the sleep. */
    tally_backup_t *kept;
    size_t nkept, capkept;
    uint64_t kept_bytes;
    uint64_t sleeps, wakes;
};

bool tally__ppool_asleep(const tally_gpool_t *gp)
{
    return gp->sleep && gp->sleep->asleep;
}

tally_gpool_t *tally__ppool_get_locked(tally_device_t *d, uint32_t id, bool create)
{
    for (tally_gpool_t *gp = d->ppools; gp; gp = gp->next)
        if (gp->private_id == id)
            return gp;
    if (!create)
        return NULL;
    tally_gpool_t *gp = tally__meta_calloc(sizeof *gp);
    struct tally_sleep *st = gp ? tally__meta_calloc(sizeof *st) : NULL;
    if (!st) {
        tally__meta_free(gp);
        tally__fail(TALLY_ENOMEM, "tally_malloc: out of host memory for a private pool");
        return NULL;
    }
    gp->private_id = id;
    gp->sleep = st;
    gp->use_count = 1; /* never unlinked: the pool lives as long as the process */
    gp->small.kind = TALLY_POOL_SMALL;
    gp->large.kind = TALLY_POOL_LARGE;
    gp->next = d->ppools;
    d->ppools = gp;
    return gp;
}

int tally__vm_segment_alloc_locked(tally_device_t *d, size_t size, void **ptr, char *why, size_t whylen)
{
    const tally_backend_t *be = tally__g.backend;
    if (!be->reserve || !be->map) {
        snprintf(why, whylen, "backend %s has no virtual-memory path for private tags (host and cuda have)",
                 be->name);
        return TALLY_EBACKEND;
    }
    void *p = NULL;
    int rc = be->reserve(d->id, size, &p, why, whylen);
    if (rc)
        return rc;
    rc = be->map(d->id, p, size, size, why, whylen);
    if (rc) {
        be->unreserve(d->id, p, size);
        return rc;
    }
    *ptr = p;
    return 0;
}

void tally__vm_segment_free_locked(tally_device_t *d, tally_segment_t *s)
{
    const tally_backend_t *be = tally__g.backend;
    /* unmap waits for nothing (backend.h): the segment's stream may still
     * run kernels on its last freed block (other streams' uses were held
     * back by events until done). */
    if (!s->asleep && be->stream_sync)
        be->stream_sync(d->id, s->stream);
    if (!s->asleep)
        be->unmap(d->id, (void *)s->base, s->size);
    be->unreserve(d->id, (void *)s->base, s->size);
}

static void free_kept(tally_device_t *d, struct tally_sleep *st);

size_t tally__ppool_release_locked(tally_device_t *d)
{
    size_t released = 0;
    /* No unmap while a capture is under way (as expand.c): the next release. */
    if (tally__capture_on_locked(d))
        return 0;
    /* Counted by what reserved memory drops: a sleeping segment freed
     * while asleep gives back its addresses only. */
    uint64_t before = d->reserved;
    for (tally_gpool_t *gp = d->ppools; gp; gp = gp->next) {
        free_kept(d, gp->sleep); /* releasing memory: the kept pinned buffers too */
        tally__cache_release_pool_locked(d, &gp->large);
        tally__cache_release_pool_locked(d, &gp->small);
    }
    released = (size_t)(before - d->reserved);
    return released;
}

/* Append v to a list that grows by doubling; 0, or -1 out of host memory. */
static int push(tally_backup_t **items, size_t *n, size_t *cap, tally_backup_t v)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 16;
        tally_backup_t *grown = tally__meta_alloc(c * sizeof *grown);
        if (!grown)
            return -1;
        if (*n)
            memcpy(grown, *items, *n * sizeof *grown);
        tally__meta_free(*items);
        *items = grown;
        *cap = c;
    }
    (*items)[(*n)++] = v;
    return 0;
}

static void free_kept(tally_device_t *d, struct tally_sleep *st)
{
    for (size_t i = 0; i < st->nkept; i++)
        tally__g.backend->host_free(d->id, st->kept[i].host, st->kept[i].size);
    st->nkept = 0;
    st->kept_bytes = 0;
}

/* A kept buffer of exactly size bytes, or NULL. */
static void *take_kept(struct tally_sleep *st, size_t size)
{
    for (size_t i = 0; i < st->nkept; i++)
        if (st->kept[i].size == size) {
            void *host = st->kept[i].host;
            st->kept[i] = st->kept[--st->nkept];
            st->kept_bytes -= size;
            return host;
        }
    return NULL;
}

static void drop_backup(tally_device_t *d, struct tally_sleep *st, size_t i)
{
    tally__g.backend->host_free(d->id, st->items[i].host, st->items[i].size);
    st->offload_bytes -= st->items[i].size;
    st->items[i] = st->items[--st->n];
}

void tally__ppool_block_freed_locked(tally_device_t *d, tally_block_t *b)
{
    struct tally_sleep *st = b->seg->gp ? b->seg->gp->sleep : NULL;
    if (!st)
        return;
    for (size_t i = 0; i < st->n; i++)
        if (st->items[i].addr == b->addr) {
            drop_backup(d, st, i);
            return;
        }
}

static void drop_all_backups(tally_device_t *d, struct tally_sleep *st)
{
    while (st->n)
        drop_backup(d, st, st->n - 1);
    st->offloaded = false;
}

/* After a wake: the backups stay pinned for the next sleep when
 * sleep_pinned_cache is on (pinning costs about as much as the copy). */
static void keep_backups(tally_device_t *d, struct tally_sleep *st)
{
    while (TALLY_OPT(sleep_pinned_cache) && st->n) {
        tally_backup_t *b = &st->items[st->n - 1];
        if (push(&st->kept, &st->nkept, &st->capkept, *b))
            break;
        st->kept_bytes += b->size;
        st->offload_bytes -= b->size;
        st->n--;
    }
    drop_all_backups(d, st);
}

void tally__ppool_info_locked(tally_device_t *d, tally_gpool_t *gp, tally_ppool_info_t *out)
{
    memset(out, 0, sizeof *out);
    struct tally_sleep *st = gp->sleep;
    out->asleep = st->asleep;
    out->offloaded = st->offloaded;
    out->offload = st->offload_bytes;
    out->kept = st->kept_bytes;
    out->sleeps = st->sleeps;
    out->wakes = st->wakes;
    for (tally_segment_t *s = d->segments; s; s = s->next) {
        if (s->gp != gp)
            continue;
        if (!s->asleep) {
            out->reserved += s->size;
            continue;
        }
        out->unmapped += s->size;
        for (tally_block_t *b = s->head; b; b = b->next)
            if (b->state == BLOCK_ALLOCATED) {
                out->sleeping += b->size;
                out->sleeping_blocks++;
            }
    }
}

/* ---- sleep ------------------------------------------------------------------------------ */

typedef struct wait_set {
    tally_use_t items[64];
    int n;
    bool overflow;
    uint64_t devices; /* every device named, those past the 64 items too */
} wait_set_t;
_Static_assert(TALLY_MAX_DEVICES <= 64, "wait_set_t's device mask holds 64 devices");

static void wait_add(wait_set_t *w, void *stream, int device)
{
    if (device >= 0 && device < TALLY_MAX_DEVICES)
        w->devices |= 1ull << device;
    for (int i = 0; i < w->n; i++)
        if (w->items[i].stream == stream && w->items[i].device == device)
            return;
    if (w->n == (int)(sizeof w->items / sizeof w->items[0])) {
        w->overflow = true;
        return;
    }
    w->items[w->n++] = (tally_use_t){stream, device};
}

static void collect_streams(tally_device_t *d, tally_gpool_t *gp, wait_set_t *w)
{
    for (tally_segment_t *s = d->segments; s; s = s->next) {
        if (s->gp != gp || s->asleep)
            continue;
        bool live = false;
        for (tally_block_t *b = s->head; b; b = b->next) {
            if (b->state == BLOCK_FREE)
                continue;
            live = true;
            for (uint16_t i = 0; i < b->nuses; i++)
                wait_add(w, b->uses[i].stream, b->uses[i].device);
        }
        if (live)
            wait_add(w, s->stream, d->id);
    }
}

int tally__ppool_streams_locked(tally_device_t *d, tally_gpool_t *gp, tally_use_t *out, int max)
{
    wait_set_t w = {.n = 0};
    collect_streams(d, gp, &w);
    int n = w.n < max ? w.n : max;
    memcpy(out, w.items, (size_t)n * sizeof *out);
    return w.overflow || w.n > max ? -1 : n;
}

/* Wait for the streams the pool's blocks were allocated and recorded on:
 * each stream's queued work, never the whole device unless asked (or more
 * than 64 streams, where each device is synchronised instead). */
static void wait_for_pool(tally_device_t *d, tally_gpool_t *gp, bool sync_device)
{
    const tally_backend_t *be = tally__g.backend;
    if (d->events_head)
        tally__events_process_locked(d, true); /* pending frees: their events */
    if (sync_device) {
        d->stats.num_sync_all_streams++;
        be->synchronize(d->id);
        return;
    }
    wait_set_t w = {.n = 0};
    collect_streams(d, gp, &w);
    if (w.overflow) {
        /* Each device a use names, those past the set's 64 items too. */
        be->synchronize(d->id);
        for (int k = 0; k < TALLY_MAX_DEVICES; k++)
            if (k != d->id && ((w.devices >> k) & 1))
                be->synchronize(k);
        return;
    }
    for (int i = 0; i < w.n; i++)
        tally__events_sync_use(&w.items[i]);
}

static int backup_block(tally_device_t *d, struct tally_sleep *st, tally_block_t *b, char *why, size_t whylen)
{
    const tally_backend_t *be = tally__g.backend;
    void *host = take_kept(st, b->size);
    int rc = host ? 0 : be->host_alloc(d->id, b->size, &host, why, whylen);
    if (rc)
        return rc;
    rc = be->copy_to_host(d->id, host, (const void *)b->addr, b->size, why, whylen);
    if (!rc && push(&st->items, &st->n, &st->cap, (tally_backup_t){b->addr, b->size, host})) {
        snprintf(why, whylen, "out of host memory for the backup list");
        rc = TALLY_ENOMEM;
    }
    if (rc) {
        be->host_free(d->id, host, b->size);
        return rc;
    }
    st->offload_bytes += b->size;
    return 0;
}

int tally__ppool_sleep_locked(tally_device_t *d, tally_gpool_t *gp, bool offload, bool sync_device, char *why,
                              size_t whylen)
{
    const tally_backend_t *be = tally__g.backend;
    struct tally_sleep *st = gp->sleep;
    if (tally__capture_on_locked(d)) {
        snprintf(why, whylen, "a CUDA graph capture is under way on device %d (its pages may be captured work)",
                 d->id);
        return TALLY_ESTATE;
    }
    if (offload && (!be->host_alloc || !be->copy_to_host)) {
        snprintf(why, whylen, "backend %s cannot copy device memory to the host", be->name);
        return TALLY_EBACKEND;
    }
    wait_for_pool(d, gp, sync_device);
    /* Whole free segments hold nothing to keep: they go back now. */
    tally__cache_release_pool_locked(d, &gp->large);
    tally__cache_release_pool_locked(d, &gp->small);
    if (offload) {
        for (tally_segment_t *s = d->segments; s; s = s->next) {
            if (s->gp != gp)
                continue;
            for (tally_block_t *b = s->head; b; b = b->next) {
                if (b->state != BLOCK_ALLOCATED)
                    continue;
                int rc = backup_block(d, st, b, why, whylen);
                if (rc) {
                    drop_all_backups(d, st);
                    return rc;
                }
            }
        }
    }
    free_kept(d, st); /* what this sleep did not reuse */
    for (tally_segment_t *s = d->segments; s; s = s->next) {
        if (s->gp != gp || s->asleep)
            continue;
        if (be->unmap(d->id, (void *)s->base, s->size) != 0) {
            /* What went stays asleep (wake maps it back); the rest is awake. */
            snprintf(why, whylen, "unmap of [%p, +%zu) failed: %s", (void *)s->base, s->size, tally_last_error());
            st->asleep = true;
            return TALLY_EBACKEND;
        }
        s->asleep = 1;
        d->reserved -= s->size;
        tally__stat_pool_dec(d->stats.reserved_bytes, s->pool, (int64_t)s->size);
    }
    st->asleep = true;
    st->offloaded = offload;
    st->sleeps++;
    return 0;
}

/* ---- wake ------------------------------------------------------------------------------- */

int tally__ppool_wake_locked(tally_device_t *d, tally_gpool_t *gp, uint64_t *missing, char *why, size_t whylen)
{
    const tally_backend_t *be = tally__g.backend;
    struct tally_sleep *st = gp->sleep;
    *missing = 0;
    /* Segments whose blocks were all freed while asleep need no pages:
     * their addresses go back instead. */
    tally__cache_release_pool_locked(d, &gp->large);
    tally__cache_release_pool_locked(d, &gp->small);
    /* Map every sleeping segment; remember which, to undo on failure. */
    size_t nseg = 0;
    for (tally_segment_t *s = d->segments; s; s = s->next)
        nseg += s->gp == gp && s->asleep;
    tally_segment_t **mapped = tally__meta_alloc((nseg + 1) * sizeof *mapped);
    if (!mapped) {
        snprintf(why, whylen, "out of host memory");
        return TALLY_ENOMEM;
    }
    size_t nmapped = 0;
    uint64_t need = 0;
    int rc = 0;
    for (tally_segment_t *s = d->segments; s; s = s->next)
        if (s->gp == gp && s->asleep)
            need += s->size;
    for (tally_segment_t *s = d->segments; s && !rc; s = s->next) {
        if (s->gp != gp || !s->asleep)
            continue;
        if (d->allowed_max != UINT64_MAX && d->reserved + s->size > d->allowed_max) {
            snprintf(why, whylen, "memory fraction limit of %llu bytes reached", (unsigned long long)d->allowed_max);
            rc = TALLY_ENOMEM;
            break;
        }
        rc = be->map(d->id, (void *)s->base, s->size, s->size, why, whylen);
        if (rc)
            break;
        mapped[nmapped++] = s;
        d->reserved += s->size; /* for the fraction check of the next one */
    }
    /* Restore the contents; a failed copy undoes the wake too. */
    for (size_t i = 0; i < st->n && !rc; i++)
        rc = be->copy_to_device(d->id, (void *)st->items[i].addr, st->items[i].host, st->items[i].size, why,
                                whylen);
    if (rc) {
        for (size_t i = 0; i < nmapped; i++) {
            be->unmap(d->id, (void *)mapped[i]->base, mapped[i]->size);
            d->reserved -= mapped[i]->size;
        }
        tally__meta_free(mapped);
        if (rc == TALLY_ENOMEM) {
            size_t free_bytes = 0, total = 0;
            be->mem_info(d->id, &free_bytes, &total);
            uint64_t room = free_bytes;
            if (d->allowed_max != UINT64_MAX) {
                uint64_t cap_room = d->allowed_max > d->reserved ? d->allowed_max - d->reserved : 0;
                room = room < cap_room ? room : cap_room;
            }
            *missing = need > room ? need - room : 0;
        }
        return rc;
    }
    for (size_t i = 0; i < nmapped; i++) {
        mapped[i]->asleep = 0;
        tally__cache_reserved_rise_locked(d, mapped[i]->pool, (int64_t)mapped[i]->size);
    }
    tally__meta_free(mapped);
    keep_backups(d, st);
    st->asleep = false;
    st->wakes++;
    return 0;
}
