/* A model of PyTorch's own expandable segments (pt_expand.h): the rules of
 * CUDACachingAllocator.cpp's ExpandableSegment as torch 2.4 to 2.11 apply
 * them, small enough to read in one sitting. Moved here from bench/ so that
 * tally tune can replay PyTorch's expandable rows; bench/pt_expand.c (the
 * pt-expand-model benchmark) is built from it.
 *
 * - Sizes round up to 512 B (minimum 512); <= 1 MiB goes to the small pool,
 *   larger to the large pool. Each pool of each stream has one segment: an
 *   address range of 1 1/8 x the device whose pages are 2 MiB (small pool)
 *   or large_segment_size_mb (default 20 MiB, large pool), mapped on demand.
 * - A request first takes the best fit among the mapped free blocks of its
 *   pool and stream (smallest size, lowest address among equals), except
 *   that a candidate followed by unmapped space counts as its size plus
 *   that space, and the search walks forward past it while the next
 *   candidate's "expandable size" is smaller.
 * - Otherwise the segment grows: at the lowest-address unmapped block (or
 *   the free mapped block just before it), pages are mapped to cover the
 *   request, each unmapped block mapped in one run of whole pages.
 * - The chosen block is split when at least 512 B remain; a freed block
 *   merges with free neighbours in the same mapped state.
 * - Mapping past the device's capacity first releases every cached page
 *   (the whole pages of free blocks are unmapped, as PyTorch's retry after
 *   release_cached_blocks does), then retries; a second failure is an OOM.
 *   An 'e' event of the trace (a release the recording holds: empty_cache
 *   or an OOM retry) does the same release.
 *
 * Driver calls, as ExpandableSegment makes them: one page is one cuMemMap
 * (PyTorch's num_device_alloc) and one cuMemUnmap (num_device_free). */
#include "pt_expand.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB ((uint64_t)1 << 20)
#define SMALL_SIZE MiB

typedef struct seg seg_t;

typedef struct blk {
    uint64_t addr, size;
    bool mapped, allocated;
    struct blk *prev, *next;
    seg_t *seg; /* allocated blocks: their segment */
} blk_t;

struct seg {
    int pool; /* 0 small, 1 large */
    unsigned stream;
    uint64_t page;
    blk_t *head;
    struct seg *next;
};

typedef struct model {
    seg_t *segs;
    uint64_t capacity, large_page, reserved, peak;
    int64_t pages, unpages, maps, unmaps, nsegs;
    bool nomem;
} model_t;

static blk_t *blk_new(model_t *m, uint64_t addr, uint64_t size, bool mapped, blk_t *prev, blk_t *next)
{
    blk_t *b = calloc(1, sizeof *b);
    if (!b) {
        m->nomem = true;
        return NULL;
    }
    b->addr = addr;
    b->size = size;
    b->mapped = mapped;
    b->prev = prev;
    b->next = next;
    if (prev)
        prev->next = b;
    if (next)
        next->prev = b;
    return b;
}

static seg_t *segment(model_t *m, int pool, unsigned stream)
{
    for (seg_t *s = m->segs; s; s = s->next)
        if (s->pool == pool && s->stream == stream)
            return s;
    seg_t *s = calloc(1, sizeof *s);
    if (!s) {
        m->nomem = true;
        return NULL;
    }
    s->pool = pool;
    s->stream = stream;
    s->page = pool ? m->large_page : 2 * MiB;
    uint64_t va = (m->capacity + m->capacity / 8 + s->page - 1) / s->page * s->page;
    s->head = blk_new(m, 0, va, false, NULL, NULL);
    if (!s->head) {
        free(s);
        return NULL;
    }
    s->next = m->segs;
    m->segs = s;
    m->nsegs++;
    return s;
}

static bool free_mapped(const blk_t *b)
{
    return b && !b->allocated && b->mapped;
}

static uint64_t expandable_size(const blk_t *b)
{
    return b->size + (b->next && !b->next->mapped ? b->next->size : 0);
}

/* Merge src into b when both are free and in the same mapped state. */
static void merge(seg_t *s, blk_t *b, blk_t *src)
{
    if (!src || src->allocated || b->allocated || src->mapped != b->mapped)
        return;
    if (src == b->prev) {
        b->addr = src->addr;
        b->prev = src->prev;
        if (b->prev)
            b->prev->next = b;
        else
            s->head = b;
    } else {
        b->next = src->next;
        if (b->next)
            b->next->prev = b;
    }
    b->size += src->size;
    free(src);
}

/* Split b at offset off (0 < off < size); returns the upper part. */
static blk_t *split_at(model_t *m, blk_t *b, uint64_t off)
{
    blk_t *up = blk_new(m, b->addr + off, b->size - off, b->mapped, b, b->next);
    if (up)
        b->size = off;
    return up;
}

/* Map the first `size` bytes (whole pages) of unmapped block b. */
static blk_t *map_block(model_t *m, seg_t *s, blk_t *b, uint64_t size)
{
    uint64_t bytes = (size + s->page - 1) / s->page * s->page;
    if (bytes > b->size)
        bytes = b->size;
    if (bytes < b->size && !split_at(m, b, bytes))
        return NULL;
    b->mapped = true;
    m->maps++;
    m->pages += (int64_t)(bytes / s->page);
    m->reserved += bytes;
    if (m->reserved > m->peak)
        m->peak = m->reserved;
    merge(s, b, b->prev);
    merge(s, b, b->next);
    return b;
}

/* Unmap the whole pages inside every free mapped block of s. */
static void release_segment(model_t *m, seg_t *s)
{
    for (blk_t *b = s->head; b; b = b->next) {
        if (!free_mapped(b))
            continue;
        uint64_t lo = (b->addr + s->page - 1) / s->page * s->page, hi = (b->addr + b->size) / s->page * s->page;
        if (hi <= lo)
            continue;
        blk_t *mid = b;
        if (lo > b->addr && !(mid = split_at(m, b, lo - b->addr)))
            return;
        if (hi < mid->addr + mid->size && !split_at(m, mid, hi - mid->addr))
            return;
        mid->mapped = false;
        m->unpages += (int64_t)((hi - lo) / s->page);
        m->unmaps++;
        m->reserved -= hi - lo;
        merge(s, mid, mid->next);
        merge(s, mid, mid->prev);
        b = mid;
    }
}

static void release_all(model_t *m)
{
    for (seg_t *s = m->segs; s; s = s->next)
        release_segment(m, s);
}

static blk_t *best_fit(seg_t *s, uint64_t size)
{
    blk_t *best = NULL;
    for (blk_t *b = s->head; b; b = b->next)
        if (free_mapped(b) && b->size >= size && (!best || b->size < best->size))
            best = b;
    if (!best)
        return NULL;
    for (;;) {
        blk_t *next = NULL; /* best's successor in (size, address) order */
        for (blk_t *b = s->head; b; b = b->next)
            if (free_mapped(b) && b != best &&
                (b->size > best->size || (b->size == best->size && b->addr > best->addr)) &&
                (!next || b->size < next->size || (b->size == next->size && b->addr < next->addr)))
                next = b;
        if (!next || expandable_size(next) >= expandable_size(best))
            return best;
        best = next;
    }
}

/* Where the segment grows for size bytes, and how many bytes that maps. */
static blk_t *grow_site(seg_t *s, uint64_t size, uint64_t *bytes)
{
    for (blk_t *c = s->head; c; c = c->next) {
        if (c->mapped || c->allocated)
            continue;
        blk_t *start = free_mapped(c->prev) ? c->prev : c;
        uint64_t room = 0, need = 0;
        for (blk_t *b = start; b && room < size && !b->allocated; b = b->next) {
            uint64_t take = size - room < b->size ? size - room : b->size;
            if (!b->mapped) {
                uint64_t pages = (take + s->page - 1) / s->page * s->page;
                need += pages < b->size ? pages : b->size;
            }
            room += b->size;
        }
        if (room >= size) {
            *bytes = need;
            return start;
        }
    }
    return NULL;
}

static blk_t *grow(model_t *m, seg_t *s, uint64_t size)
{
    uint64_t bytes = 0;
    blk_t *cand = grow_site(s, size, &bytes);
    if (cand && m->reserved + bytes > m->capacity) {
        release_all(m); /* the retry after releasing cached memory */
        cand = grow_site(s, size, &bytes);
    }
    if (!cand || m->reserved + bytes > m->capacity)
        return NULL;
    if (!cand->mapped)
        cand = map_block(m, s, cand, size < cand->size ? size : cand->size);
    while (cand && cand->size < size) {
        blk_t *n = cand->next;
        uint64_t rest = size - cand->size;
        cand = map_block(m, s, n, rest < n->size ? rest : n->size);
    }
    return cand;
}

static uint64_t round_size(uint64_t req)
{
    return req < 512 ? 512 : (req + 511) / 512 * 512;
}

static blk_t *model_alloc(model_t *m, uint64_t req, unsigned stream)
{
    uint64_t size = round_size(req);
    seg_t *s = segment(m, size > SMALL_SIZE, stream);
    if (!s)
        return NULL;
    blk_t *b = best_fit(s, size);
    if (!b)
        b = grow(m, s, size);
    if (!b)
        return NULL;
    if (b->size - size >= 512 && !split_at(m, b, size))
        return NULL;
    b->allocated = true;
    b->seg = s;
    return b;
}

static void model_free(blk_t *b)
{
    b->allocated = false;
    merge(b->seg, b, b->prev);
    merge(b->seg, b, b->next);
}

static void model_clear(model_t *m)
{
    while (m->segs) {
        seg_t *s = m->segs;
        m->segs = s->next;
        while (s->head) {
            blk_t *b = s->head;
            s->head = b->next;
            free(b);
        }
        free(s);
    }
}

static unsigned dense_stream(const trace_t *t, uint64_t id)
{
    for (size_t i = 0; i < t->nstreams; i++)
        if ((uint64_t)t->stream_ids[i] == id)
            return (unsigned)i;
    return 1000u + (unsigned)(id % 1000u); /* a stream with no events in the window */
}

/* The recorded state: each range mapped at its offset from the lowest
 * range of its pool and stream, its live blocks allocated in it. */
static int seed(model_t *m, const trace_t *t, const ptx_start_t *st, blk_t **ptrs, char *err, size_t errlen)
{
    for (size_t i = 0; i < st->nranges; i++) {
        const ptx_range_t *r = &st->ranges[i];
        unsigned stream = dense_stream(t, r->stream);
        seg_t *s = segment(m, r->small ? 0 : 1, stream);
        if (!s)
            return snprintf(err, errlen, "out of memory"), -1;
        uint64_t base = r->addr;
        for (size_t k = 0; k < st->nranges; k++)
            if (st->ranges[k].small == r->small && dense_stream(t, st->ranges[k].stream) == stream &&
                st->ranges[k].addr < base)
                base = st->ranges[k].addr;
        uint64_t off = r->addr - base;
        blk_t *b = s->head;
        while (b && !(b->addr <= off && off < b->addr + b->size))
            b = b->next;
        if (!b || b->mapped || off + r->size > b->addr + b->size)
            return snprintf(err, errlen, "expandable range at %llu overlaps another or exceeds the device",
                            (unsigned long long)r->addr), -1;
        if (off > b->addr && !(b = split_at(m, b, off - b->addr)))
            return snprintf(err, errlen, "out of memory"), -1;
        if (r->size < b->size && !split_at(m, b, r->size))
            return snprintf(err, errlen, "out of memory"), -1;
        b->mapped = true;
        m->reserved += r->size;
        m->pages += (int64_t)(r->size / s->page);
        merge(s, b, b->prev);
        merge(s, b, b->next);
        /* The live blocks inside this range. */
        for (size_t k = 0; k < st->nlive; k++) {
            const ptx_live_t *l = &st->live[k];
            if (l->addr < r->addr || l->addr >= r->addr + r->size)
                continue;
            uint64_t lo = l->addr - base;
            blk_t *x = s->head;
            while (x && !(x->addr <= lo && lo < x->addr + x->size))
                x = x->next;
            if (!x || !free_mapped(x) || lo + l->size > x->addr + x->size)
                return snprintf(err, errlen, "a block live before recording (address %llu, %llu bytes) does not fit "
                                "in its expandable range",
                                (unsigned long long)l->addr, (unsigned long long)l->size), -1;
            if (lo > x->addr && !(x = split_at(m, x, lo - x->addr)))
                return snprintf(err, errlen, "out of memory"), -1;
            if (l->size < x->size && !split_at(m, x, l->size))
                return snprintf(err, errlen, "out of memory"), -1;
            x->allocated = true;
            x->seg = s;
            if (l->slot < t->nalloc)
                ptrs[l->slot] = x;
        }
    }
    m->peak = m->reserved;
    m->pages = 0; /* mapped before the window: not this replay's calls */
    return 0;
}

int ptx_replay(const trace_t *t, const ptx_opts_t *o, const ptx_start_t *start, ptx_result_t *r, int64_t *reserved,
               char *err, size_t errlen)
{
    model_t m = {0};
    m.capacity = o->capacity ? o->capacity : (uint64_t)80 << 30;
    m.large_page = o->large_page ? o->large_page : 20 * MiB;
    memset(r, 0, sizeof *r);
    r->oom_event = -1;
    blk_t **ptrs = calloc(t->nalloc ? t->nalloc : 1, sizeof *ptrs);
    if (!ptrs)
        return snprintf(err, errlen, "out of memory"), -1;
    int rc = start ? seed(&m, t, start, ptrs, err, errlen) : 0;
    for (size_t i = start ? start->skip : 0; !rc && i < t->nev; i++) {
        const trace_event_t *e = &t->ev[i];
        if (e->op == 'a') {
            if (e->size) {
                ptrs[e->slot] = model_alloc(&m, e->size, e->stream);
                if (!ptrs[e->slot] && r->oom_event < 0)
                    r->oom_event = (long)i;
            }
        } else if (e->op == 'f') {
            if (ptrs[e->slot])
                model_free(ptrs[e->slot]);
            ptrs[e->slot] = NULL;
        } else if (e->op == 'e') {
            release_all(&m);
        }
        if (m.nomem)
            rc = -1, snprintf(err, errlen, "out of memory");
        if (reserved)
            reserved[i] = (int64_t)m.reserved;
    }
    if (reserved && start) {
        /* The events the recorded state stands for: what was mapped after
         * the first event of the window, or, with none, the state's own. */
        int64_t first = start->skip < t->nev ? reserved[start->skip] : (int64_t)m.reserved;
        for (size_t i = 0; i < start->skip && i < t->nev; i++)
            reserved[i] = first;
    }
    r->peak_reserved = (int64_t)m.peak;
    r->pages_mapped = m.pages;
    r->pages_unmapped = m.unpages;
    r->map_calls = m.maps;
    r->unmap_calls = m.unmaps;
    r->segments = m.nsegs;
    free(ptrs);
    model_clear(&m);
    return rc;
}
