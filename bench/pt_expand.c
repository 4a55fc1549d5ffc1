/* pt-expand-model: replays traces through a model of PyTorch's own
 * expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,
 * CUDACachingAllocator.cpp, torch 2.4 to 2.11), to set its peak reserved
 * memory and map calls beside tally's. Not tally's placement: a separate,
 * small model of the rules below (docs/benchmarks.md describes them).
 *
 *   pt-expand-model TRACE.csv|DIR ...
 *
 * - Sizes round up to 512 B (minimum 512); <= 1 MiB goes to the small pool,
 *   larger to the large pool. Each pool of each stream has one segment: an
 *   address range of 1 1/8 x the device (80 GiB here) whose pages are 2 MiB
 *   (small pool) or 20 MiB (large pool), mapped on demand.
 * - A request first takes the best fit among the mapped free blocks of its
 *   pool and stream (smallest size, lowest address among equals), except
 *   that a candidate followed by unmapped space counts as its size plus
 *   that space, and the search walks forward past it while the next
 *   candidate's "expandable size" is smaller.
 * - Otherwise the segment grows: at the lowest-address unmapped block (or
 *   the free mapped block just before it), pages are mapped to cover the
 *   request, one map call (num_device_alloc) per unmapped block mapped,
 *   each call as many pages as needed (rounded up to whole pages).
 * - The chosen block is split when at least 512 B remain; a freed block
 *   merges with free neighbours in the same mapped state.
 * - Pages are unmapped only by empty_cache or on OOM (release of cached
 *   blocks, then a retry). A replay on an 80 GiB device never runs out of
 *   memory, so the model never unmaps; peak reserved = peak mapped.
 *
 * Driver calls, as ExpandableSegment makes them: cuMemAddressReserve once
 * per segment; a map of n pages n cuMemCreate + n cuMemMap + one
 * cuMemSetAccess (one per device given access: the device alone here),
 * 2n + 1; an unmap of n pages (never here) one stream synchronise + n
 * cuMemUnmap + n cuMemRelease, 2n + 1. Pages are 2 MiB in the small pool and
 * 20 MiB in the large one, so "pages mapped" mixes the two. */
#include "trace.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MiB ((uint64_t)1 << 20)
#define SMALL_SIZE MiB
#define DEVICE ((uint64_t)80 << 30)

typedef struct blk {
    uint64_t addr, size;
    bool mapped, allocated;
    struct blk *prev, *next;
} blk_t;

typedef struct seg {
    int pool; /* 0 small, 1 large */
    uint16_t stream;
    uint64_t page;
    blk_t *head;
    struct seg *next;
} seg_t;

typedef struct model {
    seg_t *segs;
    uint64_t reserved, peak;
    long maps, pages, segments;
} model_t;

static blk_t *blk(uint64_t addr, uint64_t size, bool mapped, blk_t *prev, blk_t *next)
{
    blk_t *b = calloc(1, sizeof *b);
    if (!b) {
        fprintf(stderr, "pt-expand-model: out of memory\n");
        exit(1);
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

static seg_t *segment(model_t *m, int pool, uint16_t stream)
{
    for (seg_t *s = m->segs; s; s = s->next)
        if (s->pool == pool && s->stream == stream)
            return s;
    seg_t *s = calloc(1, sizeof *s);
    if (!s)
        exit(1);
    s->pool = pool;
    s->stream = stream;
    s->page = pool ? 20 * MiB : 2 * MiB;
    uint64_t va = (DEVICE + DEVICE / 8 + s->page - 1) / s->page * s->page;
    s->head = blk(0, va, false, NULL, NULL);
    s->next = m->segs;
    m->segs = s;
    m->segments++;
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

/* Merge b with src when both are free and in the same mapped state. */
static void merge(seg_t *s, blk_t *b, blk_t *src)
{
    if (!src || src->allocated || src->mapped != b->mapped)
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

/* Map pages for the first `size` bytes of unmapped block b: one call. */
static blk_t *map_block(model_t *m, seg_t *s, blk_t *b, uint64_t size)
{
    uint64_t bytes = (size + s->page - 1) / s->page * s->page;
    if (bytes > b->size)
        bytes = b->size;
    if (bytes < b->size)
        blk(b->addr + bytes, b->size - bytes, false, b, b->next);
    b->size = bytes;
    b->mapped = true;
    m->maps++;
    m->pages += (long)(bytes / s->page);
    m->reserved += bytes;
    if (m->reserved > m->peak)
        m->peak = m->reserved;
    merge(s, b, b->prev);
    merge(s, b, b->next);
    return b;
}

static blk_t *best_fit(seg_t *s, uint64_t size)
{
    /* Candidates in (size, address) order; the first that fits, then the
     * walk forward while the next one's expandable size is smaller. */
    blk_t *best = NULL;
    for (blk_t *b = s->head; b; b = b->next)
        if (free_mapped(b) && b->size >= size && (!best || b->size < best->size))
            best = b;
    if (!best)
        return NULL;
    for (;;) {
        blk_t *next = NULL; /* the successor of best in (size, address) order */
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

static blk_t *grow(model_t *m, seg_t *s, uint64_t size)
{
    for (blk_t *c = s->head; c; c = c->next) {
        if (c->mapped || c->allocated)
            continue;
        blk_t *start = free_mapped(c->prev) ? c->prev : c;
        uint64_t room = 0;
        for (blk_t *b = start; b && room < size && !b->allocated; b = b->next)
            room += b->size;
        if (room < size)
            continue;
        blk_t *cand = start;
        if (!cand->mapped)
            cand = map_block(m, s, cand, size < cand->size ? size : cand->size);
        while (cand->size < size) {
            blk_t *n = cand->next;
            uint64_t rest = size - cand->size;
            cand = map_block(m, s, n, rest < n->size ? rest : n->size);
        }
        return cand;
    }
    return NULL;
}

static blk_t *model_alloc(model_t *m, uint64_t req, uint16_t stream)
{
    uint64_t size = req < 512 ? 512 : (req + 511) / 512 * 512;
    seg_t *s = segment(m, size > SMALL_SIZE, stream);
    blk_t *b = best_fit(s, size);
    if (!b)
        b = grow(m, s, size);
    if (!b)
        return NULL;
    if (b->size - size >= 512) {
        blk(b->addr + size, b->size - size, true, b, b->next);
        b->size = size;
    }
    b->allocated = true;
    return b;
}

static void model_free(model_t *m, blk_t *b, uint16_t stream)
{
    for (seg_t *s = m->segs; s; s = s->next) {
        if (s->stream != stream)
            continue;
        for (blk_t *x = s->head; x; x = x->next) {
            if (x != b)
                continue;
            b->allocated = false;
            merge(s, b, b->prev);
            merge(s, b, b->next);
            return;
        }
    }
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

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int run(const char *path)
{
    char err[1400];
    trace_t t;
    if (trace_load(path, &t, err, sizeof err)) {
        fprintf(stderr, "pt-expand-model: %s\n", err);
        return 1;
    }
    model_t m = {0};
    blk_t **ptrs = calloc(t.nalloc ? t.nalloc : 1, sizeof *ptrs);
    uint64_t live = 0, peak_live = 0;
    for (size_t i = 0; i < t.nev; i++) {
        const trace_event_t *e = &t.ev[i];
        if (e->op == 'a') {
            live += e->size;
            if (live > peak_live)
                peak_live = live;
            if (e->size)
                ptrs[e->slot] = model_alloc(&m, e->size, e->stream);
        } else {
            live -= e->size;
            if (ptrs[e->slot])
                model_free(&m, ptrs[e->slot], e->stream);
            ptrs[e->slot] = NULL;
        }
    }
    printf("| %s | %.1f | %.1f | %.3f | %ld | %ld | %ld | %ld |\n", t.name, (double)peak_live / MiB,
           (double)m.peak / MiB, peak_live ? (double)m.peak / (double)peak_live : 0.0, m.maps, m.pages, m.segments,
           m.segments + 2 * m.pages + m.maps);
    free(ptrs);
    model_clear(&m);
    trace_free(&t);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: pt-expand-model TRACE.csv|DIR ...\n");
        return 2;
    }
    printf("| trace | peak live MiB | PyTorch expandable reserved MiB | res/live | map calls | pages mapped "
           "| ranges reserved | CUDA driver calls |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|\n");
    int failures = 0;
    for (int i = 1; i < argc; i++) {
        if (is_dir(argv[i])) {
            char **list;
            char err[1400];
            int n = trace_dir_list(argv[i], &list, err, sizeof err);
            if (n < 0) {
                fprintf(stderr, "pt-expand-model: %s\n", err);
                return 1;
            }
            for (int k = 0; k < n; k++) {
                failures += run(list[k]);
                free(list[k]);
            }
            free(list);
        } else {
            failures += run(argv[i]);
        }
    }
    return failures ? 1 : 0;
}
