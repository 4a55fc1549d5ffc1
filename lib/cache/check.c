/* Invariant checks (tally_check) and derived statistics. The check walks
 * every segment of a device and verifies the block chains, the pools, the
 * pointer map, the event queue, and every statistic and ledger counter
 * against a recount from the blocks themselves. */
#include "ledger/ledger.h"

#include <stdio.h>
#include <string.h>

typedef struct recount {
    int64_t allocation, allocated_bytes, active, active_bytes, segment, reserved_bytes;
    int64_t inactive_split, inactive_split_bytes, requested_bytes;
    int64_t free_blocks;
} recount_t;

#define FAIL(...)                                                                                                  \
    do {                                                                                                           \
        snprintf(why, whylen, __VA_ARGS__);                                                                        \
        return -1;                                                                                                 \
    } while (0)

static int compare_stat(const char *name, int pool, const tally_stat_t *s, int64_t want, char *why, size_t whylen)
{
    static const char *const pools[] = {"all", "small_pool", "large_pool"};
    if (s->current != want)
        FAIL("%s.%s.current is %lld, recount says %lld", name, pools[pool], (long long)s->current, (long long)want);
    if (s->peak < s->current)
        FAIL("%s.%s.peak %lld is below current %lld", name, pools[pool], (long long)s->peak, (long long)s->current);
    return 0;
}

static int check_ledger(tally_device_t *d, char *why, size_t whylen)
{
    tally_ledger_dev_t *ld = d->ledger;
    if (!tally__opt.ledger)
        return 0;
    int64_t *bytes = tally__meta_calloc((ld->count + 1) * sizeof(int64_t) * 2);
    if (!bytes)
        FAIL("out of host memory for the ledger recount");
    int64_t *blocks = bytes + ld->count + 1;
    int rc = 0;
    for (size_t i = 0; i <= d->map.mask; i++) {
        tally_block_t *b = d->map.slots[i].key ? d->map.slots[i].val : NULL;
        if (!b || b->lentry == UINT32_MAX)
            continue;
        if (b->lentry >= ld->count || ld->entries[b->lentry].tag != b->tag || ld->entries[b->lentry].stage != b->stage) {
            snprintf(why, whylen, "block %p has ledger row %u that does not match its tag/stage", (void *)b->addr,
                     b->lentry);
            rc = -1;
            goto out;
        }
        bytes[b->lentry] += (int64_t)b->size;
        blocks[b->lentry] += 1;
    }
    for (uint32_t r = 0; r < ld->count; r++) {
        const tally_ledger_entry_t *e = &ld->entries[r];
        int64_t nb = tally__stat_now(&e->bytes), nk = tally__stat_now(&e->blocks);
        if (nb != bytes[r] || nk != blocks[r]) {
            snprintf(why, whylen, "ledger row (tag %u, stage %u) holds %lld bytes in %lld blocks, recount %lld in %lld",
                     e->tag, e->stage, (long long)nb, (long long)nk, (long long)bytes[r],
                     (long long)blocks[r]);
            rc = -1;
            goto out;
        }
    }
out:
    tally__meta_free(bytes);
    return rc;
}

int tally__cache_check_locked(tally_device_t *d, char *why, size_t whylen)
{
    recount_t rc[3];
    memset(rc, 0, sizeof rc);
    int64_t over_alloc = 0, over_seg = 0, pending = 0, allocated_total = 0;
    int64_t graph_free = 0; /* free blocks of graph pools' segments */
    uint64_t msplit = tally__opt.max_split_size;
    size_t nseg = 0;
    int64_t lent_pieces = 0; /* lent blocks less lent segments: 0 */
    /* The pointer map's probing wraps with its mask: a power of two, at
     * most half full (ptrmap.c). */
    if ((d->map.mask + 1) & d->map.mask)
        FAIL("pointer map capacity %zu is not a power of two", d->map.mask + 1);
    if (d->map.count * 2 > d->map.mask + 1)
        FAIL("pointer map holds %zu entries in %zu slots: more than half full", d->map.count, d->map.mask + 1);
    for (tally_segment_t *s = d->segments; s; s = s->next) {
        nseg++;
        recount_t *r = &rc[s->pool];
        r->segment++;
        if (s->lender) {
            /* Lent by an expandable segment: its piece, lent, of its size. */
            const tally_block_t *c = s->lender;
            if (c->state != BLOCK_LENT || c->addr != s->base || c->size != s->size || !c->seg->ex ||
                c->stream != s->stream || s->pool != TALLY_POOL_SMALL || s->gp)
                FAIL("lent small segment %p: its piece of the expandable segment is wrong", (void *)s->base);
            r->reserved_bytes += (int64_t)s->size;
            lent_pieces--;
        } else if (s->ex) {
            r->reserved_bytes += (int64_t)tally__expand_mapped_bytes(s);
            if (tally__expand_check_locked(s, why, whylen))
                return -1;
        } else {
            /* A sleeping private segment keeps its addresses, not its bytes. */
            r->reserved_bytes += s->asleep ? 0 : (int64_t)s->size;
            /* A run of pages (small_run.c) is PyTorch's small expandable
             * segment, which is never an oversize segment however far it
             * grows: PyTorch counts oversize_segments only for a segment
             * cudaMalloc made, its expandable path returning before the
             * count, and tally's run grows by pages, never counted. */
            if (s->size >= msplit && !s->run_va)
                over_seg++;
        }
        if (!s->head || s->head->prev || s->head->addr != s->base)
            FAIL("segment %p: head block is wrong", (void *)s->base);
        uintptr_t at = s->base;
        bool split = s->head->next != NULL && !s->ex;
        for (tally_block_t *b = s->head; b; b = b->next) {
            if (b->seg != s || b->addr != at || b->pool != s->pool || b->stream != s->stream)
                FAIL("block %p: not chained in segment %p at %p", (void *)b->addr, (void *)s->base, (void *)at);
            if (b->size == 0 || b->size % 512)
                FAIL("block %p: size %zu is not a positive multiple of 512", (void *)b->addr, b->size);
            if (b->next && b->next->prev != b)
                FAIL("block %p: next block's prev link is wrong", (void *)b->addr);
            at += b->size;
            switch (b->state) {
            case BLOCK_FREE:
                if (s->gp)
                    graph_free++;
                else
                    r->free_blocks++;
                if (b->next && b->next->state == BLOCK_FREE)
                    FAIL("blocks %p and %p are both free and adjacent (not merged)", (void *)b->addr,
                         (void *)b->next->addr);
                if (split) {
                    r->inactive_split++;
                    r->inactive_split_bytes += (int64_t)b->size;
                }
                if (b->event_count || b->nuses)
                    FAIL("free block %p still has stream uses or events", (void *)b->addr);
                break;
            case BLOCK_ALLOCATED:
                if ((b->paged != 0) != (s->ex != NULL))
                    FAIL("block %p: page accounting flag is wrong", (void *)b->addr);
                if (tally__ptrmap_get(&d->map, b->addr) != b)
                    FAIL("allocated block %p is missing from the pointer map", (void *)b->addr);
                r->allocation++;
                r->allocated_bytes += (int64_t)b->size;
                allocated_total++;
                if (b->size >= msplit)
                    over_alloc++;
                /* allocated blocks are active too */
                __attribute__((fallthrough));
            case BLOCK_PENDING:
                if (b->state == BLOCK_PENDING) {
                    pending++;
                    if (!b->event_count && !b->deferred)
                        FAIL("pending block %p has no outstanding event", (void *)b->addr);
                }
                r->active++;
                r->active_bytes += (int64_t)b->size;
                r->requested_bytes += (int64_t)b->requested;
                break;
            case BLOCK_LENT:
                /* Its bytes are the lent small segment's (counted there). */
                if (!s->ex || !b->paged || tally__ptrmap_get(&d->map, b->addr) == b)
                    FAIL("lent block %p: not a mapped piece of an expandable segment", (void *)b->addr);
                r->reserved_bytes -= (int64_t)b->size;
                lent_pieces++;
                break;
            default:
                FAIL("block %p has invalid state %d", (void *)b->addr, b->state);
            }
        }
        if (at != s->base + s->size)
            FAIL("segment %p: blocks cover %zu of %zu bytes", (void *)s->base, (size_t)(at - s->base), s->size);
    }
    if (lent_pieces)
        FAIL("%lld lent pieces of expandable segments have no small segment (or one piece two)",
             (long long)lent_pieces);
    if (d->lent_kept && (!d->lent_kept->lender || d->lent_kept->head->next || d->lent_kept->head->state != BLOCK_FREE))
        FAIL("kept lent segment %p is not a wholly free lent segment", (void *)d->lent_kept->base);
    if (nseg != d->nsegments)
        FAIL("segment list holds %zu segments, count says %zu", nseg, d->nsegments);
    if (tally__pool_verify(&d->small) != rc[TALLY_POOL_SMALL].free_blocks)
        FAIL("small pool: tree order broken or it holds other than the %lld free blocks",
             (long long)rc[TALLY_POOL_SMALL].free_blocks);
    if (tally__pool_verify(&d->large) != rc[TALLY_POOL_LARGE].free_blocks)
        FAIL("large pool: tree order broken or it holds other than the %lld free blocks",
             (long long)rc[TALLY_POOL_LARGE].free_blocks);
    int64_t in_graph_pools = 0;
    for (tally_gpool_t *gp = d->gpools; gp; gp = gp->next) {
        long ns = tally__pool_verify(&gp->small), nl = tally__pool_verify(&gp->large);
        if (ns < 0 || nl < 0)
            FAIL("graph pool (%llu, %llu): tree order broken", (unsigned long long)gp->hi, (unsigned long long)gp->lo);
        in_graph_pools += ns + nl;
    }
    for (tally_gpool_t *gp = d->ppools; gp; gp = gp->next) {
        long ns = tally__pool_verify(&gp->small), nl = tally__pool_verify(&gp->large);
        if (ns < 0 || nl < 0)
            FAIL("private pool %u: tree order broken", gp->private_id);
        in_graph_pools += ns + nl;
    }
    if (in_graph_pools != graph_free)
        FAIL("graph pools hold %lld free blocks, their segments %lld", (long long)in_graph_pools,
             (long long)graph_free);
    if ((int64_t)d->map.count != allocated_total)
        FAIL("pointer map holds %zu entries for %lld allocated blocks", d->map.count, (long long)allocated_total);
    int64_t queued = 0;
    for (tally_event_entry_t *e = d->events_head; e; e = e->next) {
        if (e->block->state != BLOCK_PENDING)
            FAIL("event queued for block %p which is not pending", (void *)e->block->addr);
        queued++;
        if (!e->next && e != d->events_tail)
            FAIL("event queue tail is wrong");
    }
    int64_t want_events = 0;
    for (tally_segment_t *s = d->segments; s; s = s->next)
        for (tally_block_t *b = s->head; b; b = b->next)
            want_events += b->event_count;
    if (queued != want_events)
        FAIL("event queue holds %lld events, blocks count %lld", (long long)queued, (long long)want_events);
    for (int p = 1; p <= 2; p++) {
        rc[0].allocation += rc[p].allocation;
        rc[0].allocated_bytes += rc[p].allocated_bytes;
        rc[0].active += rc[p].active;
        rc[0].active_bytes += rc[p].active_bytes;
        rc[0].segment += rc[p].segment;
        rc[0].reserved_bytes += rc[p].reserved_bytes;
        rc[0].inactive_split += rc[p].inactive_split;
        rc[0].inactive_split_bytes += rc[p].inactive_split_bytes;
        rc[0].requested_bytes += rc[p].requested_bytes;
    }
    tally__cache_peaks_locked(d);
    tally__cache_stats_sync_locked(d);
    const tally_stats_t *st = &d->stats;
    /* The pools first: a pool's error is named with its pool, not only
     * with the sum it is part of. */
    for (int k = 1; k <= 3; k++) {
        int p = k % 3;
#define CMP(name)                                                                                                  \
    if (compare_stat(#name, p, &st->name[p], rc[p].name, why, whylen))                                             \
        return -1;
        CMP(allocation) CMP(allocated_bytes) CMP(active) CMP(active_bytes) CMP(segment) CMP(reserved_bytes)
        CMP(inactive_split) CMP(inactive_split_bytes) CMP(requested_bytes)
#undef CMP
    }
    if (compare_stat("oversize_allocations", 0, &st->oversize_allocations, over_alloc, why, whylen) ||
        compare_stat("oversize_segments", 0, &st->oversize_segments, over_seg, why, whylen))
        return -1;
    if ((int64_t)d->reserved != rc[0].reserved_bytes)
        FAIL("reserved total %llu differs from the segments' %lld", (unsigned long long)d->reserved,
             (long long)rc[0].reserved_bytes);
    (void)pending;
    return check_ledger(d, why, whylen);
}

static void largest(tally_block_t *b, void *arg)
{
    int64_t *max = arg;
    if ((int64_t)b->size > *max)
        *max = (int64_t)b->size;
}

void tally__cache_fill_derived_locked(tally_device_t *d, tally_stats_t *out)
{
    tally__cache_peaks_locked(d);
    tally__cache_stats_sync_locked(d);
    tally__stats_read(&d->stats, &d->stats_base, out);
    out->largest_free_block = 0;
    tally__pool_walk(&d->small, largest, &out->largest_free_block);
    tally__pool_walk(&d->large, largest, &out->largest_free_block);
    const tally_backend_t *be = tally__g.backend;
    uint64_t usage[4];
    if (be->passthrough && be->pool_usage && be->pool_usage(d->id, usage) == 0) {
        /* The pool's own figures: reserved = memory the pool holds from the
         * driver (current, high-water mark); docs/architecture.md. */
        out->reserved_bytes[TALLY_POOL_ALL].current = (int64_t)usage[0];
        out->reserved_bytes[TALLY_POOL_ALL].peak = (int64_t)usage[1];
    }
    out->cached_free_bytes = out->reserved_bytes[0].current - out->active_bytes[0].current;
    int64_t pr = out->reserved_bytes[0].peak;
    out->utilisation = pr > 0 ? (double)out->allocated_bytes[0].peak / (double)pr : 0.0;
}
