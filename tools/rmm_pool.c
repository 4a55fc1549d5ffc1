/* The model of RMM's pool_memory_resource (tools/rmm_pool.h). The rules,
 * as read in rapidsai/rmm at 5d50a37 (2026-07-02); the file and function
 * each comes from in brackets:
 *
 *  1. Sizes are rounded up to 256 bytes, in an allocation and in a
 *     deallocation; size 0 allocates nothing (nullptr) and frees nothing
 *     [stream_ordered_memory_resource.hpp: allocate, deallocate].
 *  2. Each stream has its own free list, ordered by address, made at the
 *     stream's first use with one CUDA event [get_event]. A deallocation
 *     records that event (cudaEventRecord) and inserts the block into its
 *     stream's list [deallocate].
 *  3. An insert merges the block with the free block just before it and the
 *     one just after when they touch, except across the start of an
 *     upstream allocation: a block that begins one (its "head") never merges
 *     with the one before it [coalescing_free_list.hpp: insert,
 *     is_contiguous_before].
 *  4. The fit is the best fit: the smallest free block that holds the
 *     request, the lowest address among equals (std::min_element keeps the
 *     first of equal minima) [coalescing_free_list.hpp: get_block,
 *     is_better_fit]. The request is cut from the block's front; the rest,
 *     when any, goes back into the list it came from
 *     [pool_memory_resource_impl.cpp: allocate_from_block;
 *     stream_ordered_memory_resource.hpp: allocate_and_insert_remainder].
 *  5. An allocation looks in its own stream's list; then in each other
 *     stream's list in turn, taking a fit there with a cudaStreamWaitEvent
 *     on that stream's event (the rest stays in that list); then again
 *     through the other lists, each merged into its own list first (one
 *     cudaStreamWaitEvent, the other list then gone) and searched after
 *     each merge; then it grows the pool [get_block,
 *     get_block_from_other_stream, merge_lists]. The other lists are visited
 *     in a std::map's order of their event handles, which the model takes
 *     to be the order the streams were first used.
 *  6. Growing asks upstream for max(size, the pool's size) with no maximum,
 *     else for max(size, half the room left) when the size fits in the room
 *     left, else fails; a refused request is halved (never below the size)
 *     and tried again [pool_memory_resource_impl.cpp: size_to_grow,
 *     try_to_expand]. An initial pool is one upstream allocation made at
 *     construction [initialize_pool]. Nothing goes back upstream until the
 *     pool is destroyed [release], so there is no empty_cache: the trace's
 *     'e' events are ignored.
 *
 * Upstream (cudaMalloc in the model) refuses when the device's memory, each
 * upstream allocation rounded up to 2 MiB as the driver maps it, would pass
 * o->capacity. Upstream allocations are laid out one after another from
 * 2^40, each at a 2 MiB boundary, as cudaMalloc often places them: two can
 * touch, and rule 3 is what keeps them apart. */
#include "rmm_pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ALIGN 256u
#define DEVICE_GRAIN ((uint64_t)2 << 20)

typedef struct rblock {
    uint64_t addr, size;
    bool head; /* the start of an upstream allocation */
} rblock_t;

typedef struct rlist {
    rblock_t *b;
    size_t n, cap;
    bool live;     /* in the map of free lists (a merged-away list is not) */
    int order;     /* when its stream was first used, -1 before */
} rlist_t;

typedef struct pool {
    const rmm_opts_t *o;
    rmm_result_t *r;
    rlist_t lists[64];
    int nseen;        /* streams used so far */
    int by_order[64]; /* stream index of each first use */
    uint64_t size;    /* the pool's size: bytes from upstream */
    uint64_t device;  /* the same, each upstream allocation rounded up to 2 MiB */
    uint64_t next_va; /* where the next upstream allocation goes */
    bool nomem;       /* the host ran out of memory */
} pool_t;

static uint64_t align_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

/* Rule 2: a stream's list, made (with its event) at its first use. */
static rlist_t *list_of(pool_t *p, int s)
{
    rlist_t *l = &p->lists[s];
    if (l->order < 0) {
        l->order = p->nseen;
        p->by_order[p->nseen++] = s;
        p->r->streams++;
    }
    l->live = true;
    return l;
}

static void list_put(pool_t *p, rlist_t *l, size_t at, rblock_t b)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        rblock_t *g = realloc(l->b, cap * sizeof *g);
        if (!g) {
            p->nomem = true;
            return;
        }
        l->b = g;
        l->cap = cap;
    }
    memmove(&l->b[at + 1], &l->b[at], (l->n - at) * sizeof *l->b);
    l->b[at] = b;
    l->n++;
    if (l->n > p->r->most_free)
        p->r->most_free = l->n;
}

static void list_erase(rlist_t *l, size_t at)
{
    memmove(&l->b[at], &l->b[at + 1], (l->n - at - 1) * sizeof *l->b);
    l->n--;
}

static bool touches(const rblock_t *a, const rblock_t *b)
{
    return a->addr + a->size == b->addr && !b->head;
}

/* Rule 3. */
static void list_insert(pool_t *p, rlist_t *l, rblock_t b)
{
    size_t next = 0;
    while (next < l->n && l->b[next].addr < b.addr)
        next++;
    bool prev = next > 0 && touches(&l->b[next - 1], &b);
    bool after = next < l->n && touches(&b, &l->b[next]);
    if (prev && after) {
        l->b[next - 1].size += b.size + l->b[next].size;
        list_erase(l, next);
    } else if (prev) {
        l->b[next - 1].size += b.size;
    } else if (after) {
        l->b[next].addr = b.addr;
        l->b[next].size += b.size;
        l->b[next].head = b.head;
    } else {
        list_put(p, l, next, b);
    }
}

/* Rule 4: the best fit's index, or l->n. */
static size_t best_fit(const rlist_t *l, uint64_t size)
{
    size_t best = l->n;
    for (size_t i = 0; i < l->n; i++)
        if (l->b[i].size >= size && (best == l->n || l->b[i].size < l->b[best].size))
            best = i;
    return best;
}

/* Rule 4: cut size bytes from the front of l's block i; the rest stays in l. */
static rblock_t take(pool_t *p, rlist_t *l, size_t i, uint64_t size)
{
    rblock_t b = l->b[i];
    list_erase(l, i);
    if (b.size > size)
        list_insert(p, l, (rblock_t){b.addr + size, b.size - size, false});
    b.size = size;
    return b;
}

/* Rule 6: one upstream allocation of want bytes; false when refused. */
static bool upstream(pool_t *p, uint64_t want, rblock_t *out)
{
    uint64_t dev = align_up(want, DEVICE_GRAIN);
    if (p->device + dev > p->o->capacity || dev < want) {
        p->r->upstream_failed++;
        return false;
    }
    p->r->upstream_allocs++;
    *out = (rblock_t){p->next_va, want, true};
    p->next_va += dev;
    p->size += want;
    p->device += dev;
    if ((int64_t)p->size > p->r->peak_reserved)
        p->r->peak_reserved = (int64_t)p->size;
    return true;
}

/* Rule 6: try_to_expand. */
static bool expand(pool_t *p, uint64_t try_size, uint64_t min_size, rblock_t *out)
{
    while (try_size >= min_size && try_size > 0) {
        if (upstream(p, try_size, out))
            return true;
        if (try_size == min_size)
            return false;
        try_size = try_size / 2 > min_size ? try_size / 2 : min_size;
    }
    return false;
}

static uint64_t size_to_grow(const pool_t *p, uint64_t size)
{
    if (p->o->maximum) {
        uint64_t remaining = align_up(p->o->maximum - p->size, ALIGN);
        return size <= remaining ? (size > remaining / 2 ? size : remaining / 2) : 0;
    }
    return size > p->size ? size : p->size;
}

/* Rules 4 to 6: the block for an allocation of size bytes on stream s. */
static bool get_block(pool_t *p, int s, uint64_t size, rblock_t *out)
{
    rlist_t *own = list_of(p, s);
    size_t i = best_fit(own, size);
    if (i < own->n) {
        *out = take(p, own, i, size);
        return true;
    }
    for (int k = 0; k < p->nseen; k++) {
        rlist_t *other = &p->lists[p->by_order[k]];
        if (other == own || !other->live || (i = best_fit(other, size)) == other->n)
            continue;
        p->r->stream_waits++;
        *out = take(p, other, i, size);
        return true;
    }
    for (int k = 0; k < p->nseen; k++) {
        rlist_t *other = &p->lists[p->by_order[k]];
        if (other == own || !other->live)
            continue;
        p->r->stream_waits++;
        for (size_t j = 0; j < other->n && !p->nomem; j++)
            list_insert(p, own, other->b[j]);
        other->n = 0;
        other->live = false;
        if ((i = best_fit(own, size)) < own->n) {
            *out = take(p, own, i, size);
            return true;
        }
    }
    rblock_t grown;
    if (!expand(p, size_to_grow(p, size), size, &grown))
        return false;
    list_insert(p, own, grown);
    i = best_fit(own, size);
    *out = take(p, own, i, size);
    return true;
}

int rmm_replay(const trace_t *t, const rmm_opts_t *o, rmm_result_t *r, uint64_t *where, char *err, size_t errlen)
{
    memset(r, 0, sizeof *r);
    r->oom_event = -1;
    if (o->initial % ALIGN || o->maximum % ALIGN) {
        snprintf(err, errlen, "RMM pool: the initial (%llu) and maximum (%llu) pool sizes must be multiples of 256 bytes",
                 (unsigned long long)o->initial, (unsigned long long)o->maximum);
        return -1;
    }
    if (o->maximum && o->initial > o->maximum) {
        snprintf(err, errlen, "RMM pool: the initial pool size (%llu) exceeds the maximum (%llu)",
                 (unsigned long long)o->initial, (unsigned long long)o->maximum);
        return -1;
    }
    /* The initial pool goes to the legacy default stream's list: the
     * trace's stream 0 when it has one, else a list of its own. */
    int legacy = t->nstreams > 0 && t->stream_ids[0] == 0 ? 0 : (int)t->nstreams;
    if (legacy >= 64) {
        snprintf(err, errlen, "RMM pool: more than 63 streams besides the legacy default stream");
        return -1;
    }
    pool_t p = {.o = o, .r = r, .next_va = (uint64_t)1 << 40};
    for (int s = 0; s < 64; s++)
        p.lists[s].order = -1;
    rblock_t *held = calloc(t->nalloc ? t->nalloc : 1, sizeof *held);
    int rc = 0;
    if (!held) {
        snprintf(err, errlen, "RMM pool: out of host memory");
        return -1;
    }
    if (o->initial) {
        rblock_t first;
        if (!expand(&p, o->initial, o->initial, &first)) {
            snprintf(err, errlen, "RMM pool: an initial pool of %llu bytes does not fit in the device's %llu",
                     (unsigned long long)o->initial, (unsigned long long)o->capacity);
            rc = -1;
        } else {
            list_insert(&p, list_of(&p, legacy), first);
        }
    }
    for (size_t e = 0; !rc && e < t->nev && !p.nomem; e++) {
        const trace_event_t *ev = &t->ev[e];
        if (ev->op == 'a') {
            if (ev->size == 0)
                continue;
            uint64_t size = align_up(ev->size, ALIGN);
            if (size < ev->size || !get_block(&p, ev->stream, size, &held[ev->slot])) {
                r->oom_event = (long)e;
                break;
            }
            if (where)
                where[ev->slot] = held[ev->slot].addr;
        } else if (ev->op == 'f') {
            rblock_t b = held[ev->slot];
            if (b.size == 0)
                continue;
            held[ev->slot].size = 0;
            r->event_records++;
            list_insert(&p, list_of(&p, ev->stream), b);
        }
    }
    if (p.nomem && !rc) {
        snprintf(err, errlen, "RMM pool: out of host memory");
        rc = -1;
    }
    for (int s = 0; s < 64; s++)
        free(p.lists[s].b);
    free(held);
    return rc;
}

int64_t rmm_least_pool(const trace_t *t, uint64_t step, uint64_t capacity, char *err, size_t errlen)
{
    uint64_t live = 0, peak = 0;
    for (size_t i = 0; i < t->nev; i++) {
        if (t->ev[i].op == 'a')
            live += align_up(t->ev[i].size, ALIGN);
        else if (t->ev[i].op == 'f')
            live -= align_up(t->ev[i].size, ALIGN);
        peak = live > peak ? live : peak;
    }
    rmm_result_t r;
    uint64_t lo = align_up(peak, step), hi = 0; /* lo - step fails (it is under the live bytes) or is 0 */
    if (lo == 0)
        return 0;
    uint64_t top = capacity / DEVICE_GRAIN * DEVICE_GRAIN / step * step; /* the driver maps 2 MiB at a time */
    for (uint64_t s = lo; s <= top;) {
        rmm_opts_t o = {s, s, capacity};
        if (rmm_replay(t, &o, &r, NULL, err, errlen))
            return -1;
        if (r.oom_event < 0) {
            hi = s;
            break;
        }
        lo = s + step;
        if (s == top)
            break;
        s = s > top / 2 ? top : s * 2; /* doubling, the device's memory last */
    }
    if (!hi) {
        snprintf(err, errlen, "RMM pool: no pool up to the device's %llu bytes serves the trace",
                 (unsigned long long)capacity);
        return 0;
    }
    /* hi serves it; the least that does lies in [lo, hi]. */
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / step / 2 * step;
        rmm_opts_t o = {mid, mid, capacity};
        if (rmm_replay(t, &o, &r, NULL, err, errlen))
            return -1;
        if (r.oom_event < 0)
            hi = mid;
        else
            lo = mid + step;
    }
    return (int64_t)hi;
}
