/* Expandable segments (expandable_segments:true): the large pool of each
 * stream lives in one reserved address range the size of the device, and
 * physical memory is mapped into it in 2 MiB pages only where blocks are in
 * use. Blocks split and merge as usual, so holes merge across what would
 * have been segment boundaries; and a page that no live block touches is
 * "idle". When new pages would take reserved memory above its high-water
 * mark, idle pages are unmapped first, so the memory a hole holds moves to
 * where it is needed instead of adding to the peak; below the mark, idle
 * pages stay mapped (fewer map calls when the hole is used again). Peak
 * reserved memory is then about the peak of the pages live blocks touch,
 * not of the sum of segments. Every segment here belongs to the large pool.
 *
 * Backend calls: idle pages are taken back in whole runs, the longest
 * first, so one unmap call frees many pages; when no idle page is left,
 * whole free small-pool segments are released instead (their memory moves
 * too). A block that maps new pages also maps, in the same call, the free
 * unmapped pages after it that fit under the mark (the room a whole run
 * left); a block under 10 MiB that grows the range maps up to the next
 * expandable_grow_chunk_mb boundary (20 MiB: what PyTorch's default
 * placement would give it as a segment; those pages do not raise the mark).
 * cache.c prefers a free block already on mapped pages among the few after
 * the best fit.
 *
 * Moves cost driver calls (an unmap there, a map here), and a repeating job
 * made them every step (issue 21: about 1,000 per ddp step). So they are
 * made only within expandable_move_budget, the modelled driver time a step
 * may spend on them; 0 (the default) makes none: reserved memory then grows
 * to what the step's placement touches, after which a step maps nothing.
 * Unless moves are unlimited (-1) each map call is one physical handle
 * (moves take whole idle handles), which also cuts the driver calls of
 * growth to one cuMemCreate per call.
 *
 * Physical handles: a map call lays its pages out in handles (backend.h),
 * and a handle can only be unmapped whole (CUDA's cuMemUnmap). Small blocks
 * get a handle per 2 MiB page; a block of at least expandable_handle_mb
 * (64 MiB) maps each run of its new pages as one handle, so a large block
 * costs one cuMemCreate + cuMemMap instead of one per page (pages mapped
 * ahead of it go in a call of their own, a handle per page). Per page the
 * region knows its handle (first page, length, idle pages); a handle is
 * "spare" when every page of it is idle, and only spare handles are ever
 * unmapped: stealing, trimming and the undo of a failed map take whole
 * spare handles, and the idle pages of a handle that still holds a live
 * block stay mapped until it is spare.
 *
 * CUDA graph capture: nothing is unmapped while a capture may be under way
 * (tally__capture_on_locked: one announced, or a stream of the device seen
 * capturing; tests of counters when none is): cuMemUnmap needs the
 * segment's stream synchronised first, which a capture forbids (it would
 * invalidate it). A block that needs pages then maps new
 * ones instead of taking idle ones, past the high-water mark if need be;
 * when the device has no room for them the allocation fails with OOM (the
 * capture survives). empty_cache, stage-end release and the release of a
 * whole region leave their pages mapped (a diagnostic says so; the figure
 * released counts only what went); the next release after the capture
 * gives them back, and stealing resumes at the next allocation.
 *
 * Requires a backend with reserve / map / unmap (host and cuda). Runs with
 * the device lock held. */
#include "ledger/ledger.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PAGE ((size_t)2 << 20)

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

static inline void idle_set(tally_expand_t *ex, size_t p)
{
    ex->idle_bits[p >> 6] |= 1ull << (p & 63);
}

static inline void idle_clear(tally_expand_t *ex, size_t p)
{
    ex->idle_bits[p >> 6] &= ~(1ull << (p & 63));
}

static inline bool is_spare(const tally_expand_t *ex, size_t p)
{
    return ex->spare_bits[p >> 6] >> (p & 63) & 1;
}

/* Mark handle h (its first page) spare or not. */
static void spare_handle(tally_expand_t *ex, size_t h, bool on)
{
    size_t n = ex->hlen[h];
    for (size_t q = h; q < h + n; q++) {
        if (on)
            ex->spare_bits[q >> 6] |= 1ull << (q & 63);
        else
            ex->spare_bits[q >> 6] &= ~(1ull << (q & 63));
    }
    if (on)
        ex->spare += n;
    else
        ex->spare -= n;
}

/* Mapped page p: the last live block on it went (idle) or the first came. */
static void page_idle(tally_expand_t *ex, size_t p)
{
    ex->idle++;
    idle_set(ex, p);
    size_t h = ex->hstart[p];
    if (++ex->hidle[h] == ex->hlen[h])
        spare_handle(ex, h, true);
}

static void page_live(tally_expand_t *ex, size_t p)
{
    ex->idle--;
    idle_clear(ex, p);
    size_t h = ex->hstart[p];
    if (ex->hidle[h]-- == ex->hlen[h])
        spare_handle(ex, h, false);
}

/* The first spare page at or after p, or npages. A scan of words. */
static size_t next_spare(const tally_expand_t *ex, size_t p)
{
    size_t words = ex->npages / 64 + 1, w = p >> 6;
    if (p >= ex->npages)
        return ex->npages;
    uint64_t m = ex->spare_bits[w] & (~0ull << (p & 63));
    while (!m && ++w < words)
        m = ex->spare_bits[w];
    if (!m)
        return ex->npages;
    size_t q = w * 64 + (size_t)__builtin_ctzll(m);
    return q < ex->npages ? q : ex->npages;
}

/* ---- steady state: is the job repeating its step? ------------------------
 * A training job allocates the same sizes in the same order every step, and
 * its live bytes come back to the same figure at the same point of each
 * step. The allocation stream is kept in a ring (rounded size, requested
 * bytes before the allocation); a candidate period P comes from the last
 * place the last KGRAM sizes were seen, and it holds while each new
 * allocation has the size and the live bytes of the one P before it (the
 * live-bytes test tells a step from a layer: layers repeat sizes, but each
 * keeps its activations, so live bytes grow from one to the next; earlier
 * places of the same sizes are tried, nearest first). After STEADY_RUN
 * allocations that hold (or a whole period, if shorter), the job is steady
 * and its step is P allocations; any mismatch ends it. The step is what
 * expandable_move_budget is per: the budget comes back every P allocations
 * (every MOVE_WINDOW until a period is known). Learned only with a budget
 * above 0; with 0 nothing moves and nothing needs learning. */
#define LEARN ((size_t)1 << 15) /* allocations remembered: periods up to this */
#define KGRAM 8
#define KG_SLOTS ((size_t)1 << 14)
#define MIN_PERIOD 16
#define STEADY_RUN 256
#define CHAIN_WALK 64
#define MOVE_WINDOW 1000 /* allocations per budget until a period is known */

typedef struct steady {
    uint64_t n; /* allocations seen */
    uint64_t *size, *live; /* rings of LEARN */
    uint64_t *kg;          /* KGRAM hash -> index + 1 of its last end */
    uint64_t *chain;       /* ring: index + 1 of the previous end of the same hash */
    uint64_t period, run;
    bool on;
    double tokens;      /* move budget left in this step (microseconds) */
    uint64_t refill_at; /* allocation count at which it comes back */
} steady_t;

static steady_t steady[TALLY_MAX_DEVICES];

static uint64_t kgram_hash(const steady_t *st)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t k = 0; k < KGRAM; k++)
        h = (h ^ st->size[(st->n - 1 - k) % LEARN]) * 1099511628211ull;
    return h;
}

/* One allocation of rounded size, with live: the bytes requested by the
 * blocks live before it. Called only with a move budget (cache.c). */
void tally__expand_note_alloc_locked(tally_device_t *d, size_t size, uint64_t live)
{
    steady_t *st = &steady[d->id];
    if (!st->size) {
        st->size = tally__meta_calloc(LEARN * sizeof *st->size);
        st->live = tally__meta_calloc(LEARN * sizeof *st->live);
        st->kg = tally__meta_calloc(KG_SLOTS * sizeof *st->kg);
        st->chain = tally__meta_calloc(LEARN * sizeof *st->chain);
        if (!st->size || !st->live || !st->kg || !st->chain) {
            tally__meta_free(st->size);
            tally__meta_free(st->live);
            tally__meta_free(st->kg);
            tally__meta_free(st->chain);
            st->size = NULL;
            return; /* no learning: moves stay on */
        }
    }
    uint64_t i = st->n;
    bool holds = st->period && i >= st->period && st->size[(i - st->period) % LEARN] == size &&
                 st->live[(i - st->period) % LEARN] == live;
    st->size[i % LEARN] = size;
    st->live[i % LEARN] = live;
    st->n++;
    if (holds) {
        st->run++;
    } else {
        st->period = st->run = 0;
        if (st->n >= KGRAM) {
            /* Earlier ends of the same KGRAM sizes, nearest first: the
             * nearest whose sizes and live bytes agree gives the period. */
            uint64_t j = st->kg[kgram_hash(st) % KG_SLOTS];
            for (int walk = 0; j && walk < CHAIN_WALK && i + 1 - j < LEARN; walk++) {
                uint64_t p = i + 1 - j;
                bool same = p >= MIN_PERIOD;
                for (size_t k = 0; k < KGRAM && same; k++)
                    same = st->size[(i - k) % LEARN] == st->size[(i - k - p) % LEARN] &&
                           st->live[(i - k) % LEARN] == st->live[(i - k - p) % LEARN];
                if (same) {
                    st->period = p, st->run = KGRAM;
                    break;
                }
                j = st->chain[(j - 1) % LEARN];
            }
        }
    }
    if (st->n >= KGRAM) {
        uint64_t *slot = &st->kg[kgram_hash(st) % KG_SLOTS];
        st->chain[i % LEARN] = *slot;
        *slot = st->n;
    }
    st->on = st->period && st->run >= (st->period < STEADY_RUN ? st->period : STEADY_RUN);
    /* The move budget comes back at each step: every period once steady,
     * every MOVE_WINDOW allocations until then. */
    if (st->n >= st->refill_at) {
        st->tokens = (double)TALLY_OPT(expandable_move_budget);
        st->refill_at = st->n + (st->on ? st->period : MOVE_WINDOW);
    }
}

bool tally__expand_steady(const tally_device_t *d)
{
    return steady[d->id].on;
}

uint64_t tally__expand_period(const tally_device_t *d)
{
    return steady[d->id].on ? steady[d->id].period : 0;
}

/* Modelled driver microseconds of moving n pages (A100 column of
 * tests/standin/cost.c, a handle per page as a move maps them): a
 * synchronise and cuMemUnmap of the pages taken, then cuMemCreate +
 * cuMemMap + cuMemRelease + cuMemSetAccess per page mapped. */
static double move_us(size_t n)
{
    return 20.0 + (double)n * (25.6 + 193.0 + 1.45 + 25.6 + 36.0);
}

/* Pages that could move: spare pages of every region, and the pages of
 * the free small-pool segments. */
static size_t movable(const tally_device_t *d)
{
    size_t n = 0;
    for (const tally_segment_t *s = d->segments; s; s = s->next)
        n += s->ex ? s->ex->spare : 0;
    return n + d->small.count;
}

/* Whether pages may move now to spare want new ones (expandable_move_budget),
 * charging the move of what can move; nothing movable costs nothing. */
static bool move_allowed(tally_device_t *d, size_t want, size_t avail)
{
    int budget = TALLY_OPT(expandable_move_budget);
    if (budget < 0)
        return true;
    steady_t *st = &steady[d->id];
    size_t n = want < avail ? want : avail;
    if (budget == 0 || !n || !st->size || st->tokens < move_us(n))
        return false;
    st->tokens -= move_us(n);
    return true;
}

/* Highest reserved bytes each device has reached (never reset). */
static uint64_t high_water[TALLY_MAX_DEVICES];

bool tally__expand_on(void)
{
    return tally__opt.expandable_segments && tally__g.backend->map != NULL;
}

static void page_span(const tally_segment_t *s, const tally_block_t *b, size_t *first, size_t *last)
{
    *first = (b->addr - s->base) / PAGE;
    *last = (b->addr - s->base + b->size - 1) / PAGE;
}

/* The stream's region, created on first use: one free block spanning it,
 * in the large pool. Returns 0, or TALLY_ENOMEM / TALLY_EBACKEND. */
int tally__expand_region_locked(tally_device_t *d, void *stream, tally_block_t *(*new_block)(tally_device_t *),
                                char *why, size_t whylen)
{
    for (tally_segment_t *s = d->segments; s; s = s->next)
        if (s->ex && s->stream == stream)
            return 0;
    size_t free_b = 0, total = 0;
    tally__g.backend->mem_info(d->id, &free_b, &total);
    size_t va = (total + PAGE - 1) / PAGE * PAGE;
    void *base = NULL;
    int rc = tally__g.backend->reserve(d->id, va, &base, why, whylen);
    if (rc)
        return rc;
    tally_segment_t *s = tally__meta_calloc(sizeof *s);
    tally_expand_t *ex = tally__meta_calloc(sizeof *ex);
    size_t npages = va / PAGE;
    uint8_t *mapped = tally__meta_calloc(npages);
    uint32_t *live = tally__meta_calloc(npages * sizeof *live);
    uint64_t *idle_bits = tally__meta_calloc((npages / 64 + 1) * sizeof *idle_bits);
    uint64_t *spare_bits = tally__meta_calloc((npages / 64 + 1) * sizeof *spare_bits);
    uint32_t *hstart = tally__meta_calloc(npages * sizeof *hstart);
    uint32_t *hlen = tally__meta_calloc(npages * sizeof *hlen);
    uint32_t *hidle = tally__meta_calloc(npages * sizeof *hidle);
    bool meta = s && ex && mapped && live && idle_bits && spare_bits && hstart && hlen && hidle;
    tally_block_t *b = meta ? new_block(d) : NULL;
    if (!b) {
        tally__meta_free(s);
        tally__meta_free(ex);
        tally__meta_free(mapped);
        tally__meta_free(live);
        tally__meta_free(idle_bits);
        tally__meta_free(spare_bits);
        tally__meta_free(hstart);
        tally__meta_free(hlen);
        tally__meta_free(hidle);
        tally__g.backend->unreserve(d->id, base, va);
        snprintf(why, whylen, "out of host memory for an expandable segment");
        return TALLY_ENOMEM;
    }
    ex->npages = npages;
    ex->mapped = mapped;
    ex->live = live;
    ex->idle_bits = idle_bits;
    ex->spare_bits = spare_bits;
    ex->hstart = hstart;
    ex->hlen = hlen;
    ex->hidle = hidle;
    s->base = (uintptr_t)base;
    s->size = va;
    s->stream = stream;
    s->pool = TALLY_POOL_LARGE;
    s->device = d->id;
    s->head = b;
    s->ex = ex;
    tally__segment_link_locked(d, s);
    b->addr = s->base;
    b->size = va;
    b->stream = stream;
    b->seg = s;
    b->pool = TALLY_POOL_LARGE;
    b->prev = b->next = NULL;
    b->state = BLOCK_FREE;
    tally__pool_insert(&d->large, b);
    tally__stat_pool_inc(d->stats.segment, TALLY_POOL_LARGE, 1);
    return 0;
}

/* Map pages [p, p + n) in one backend call, in handles of hp pages (the
 * last may be shorter); the last `ahead` of them are mapped ahead of need
 * and do not raise the high-water mark. The new pages are idle (spare). */
static int map_run(tally_device_t *d, tally_segment_t *s, size_t p, size_t n, size_t hp, size_t ahead, char *why,
                   size_t whylen)
{
    size_t bytes = n * PAGE;
    if (d->allowed_max != UINT64_MAX && d->reserved + bytes > d->allowed_max) {
        snprintf(why, whylen, "memory fraction limit of %llu bytes reached", (unsigned long long)d->allowed_max);
        return TALLY_ENOMEM;
    }
    int rc = tally__g.backend->map(d->id, (void *)(s->base + p * PAGE), bytes, hp * PAGE, why, whylen);
    if (rc)
        return rc;
    tally_expand_t *ex = s->ex;
    memset(ex->mapped + p, 1, n);
    for (size_t h = p; h < p + n; h += hp) {
        size_t k = p + n - h < hp ? p + n - h : hp;
        ex->hlen[h] = ex->hidle[h] = (uint32_t)k;
        for (size_t q = h; q < h + k; q++) {
            ex->hstart[q] = (uint32_t)h;
            idle_set(ex, q);
        }
        spare_handle(ex, h, true);
    }
    ex->idle += n;
    ex->nmapped += n;
    d->reserved += bytes;
    if (d->reserved - ahead * PAGE > high_water[d->id])
        high_water[d->id] = d->reserved - ahead * PAGE;
    d->stats.num_device_alloc++;
    tally__stat_pool_inc(d->stats.reserved_bytes, TALLY_POOL_LARGE, (int64_t)bytes);
    return 0;
}

/* Whether unmapping is held back: a capture is under way on the device. */
bool tally__expand_unmap_held_locked(tally_device_t *d)
{
    return tally__capture_on_locked(d);
}

/* Unmap pages [p, p + n) in one backend call: whole spare handles only,
 * after the work queued on the segment's stream (the one stream whose blocks
 * the region holds; another stream's uses of a block held it back with
 * events until done), never after the whole device: an unrelated stream
 * (NCCL's) is not waited for. Returns false (nothing changed) when the
 * backend refused. */
static bool unmap_run(tally_device_t *d, tally_segment_t *s, size_t p, size_t n)
{
    size_t bytes = n * PAGE;
    tally_expand_t *ex = s->ex;
    const tally_backend_t *be = tally__g.backend;
    if (be->stream_sync && be->stream_sync(d->id, s->stream))
        return false; /* not known to be done: still mapped, still spare */
    if (be->unmap(d->id, (void *)(s->base + p * PAGE), bytes))
        return false; /* still mapped, still spare */
    d->stats.num_device_free++;
    for (size_t h = p; h < p + n;) {
        size_t k = ex->hlen[h] ? ex->hlen[h] : 1; /* h is a handle's first page */
        if (is_spare(ex, h))
            spare_handle(ex, h, false);
        ex->hlen[h] = ex->hidle[h] = 0;
        h += k;
    }
    for (size_t q = p; q < p + n; q++)
        idle_clear(ex, q);
    memset(ex->mapped + p, 0, n);
    ex->idle -= n; /* only idle pages are ever unmapped while mapped blocks live */
    ex->nmapped -= n;
    d->reserved -= bytes;
    tally__stat_pool_dec(d->stats.reserved_bytes, TALLY_POOL_LARGE, (int64_t)bytes);
    return true;
}

/* Whether handle h (its first page) of segment s has a page in [lo, hi]
 * of segment keep: the pages of the block being placed stay. */
static inline bool kept(const tally_expand_t *ex, const tally_segment_t *s, size_t h, const tally_segment_t *keep,
                        size_t lo, size_t hi)
{
    return s == keep && h <= hi && h + ex->hlen[h] > lo;
}

/* Unmap at least want idle pages (fewer if there are not enough) of every
 * region, in address order, in runs of neighbouring spare handles; handles
 * with a page in [keep_lo, keep_hi] of segment keep stay. Returns the
 * pages unmapped. The spare bitmap makes this a scan of words, not pages. */
static size_t unmap_idle(tally_device_t *d, size_t want, const tally_segment_t *keep, size_t keep_lo, size_t keep_hi)
{
    size_t done = 0;
    for (tally_segment_t *s = d->segments; s && done < want; s = s->next) {
        tally_expand_t *ex = s->ex;
        if (!ex || !ex->spare)
            continue;
        size_t p = 0;
        while (done < want && (p = next_spare(ex, p)) < ex->npages) {
            p = ex->hstart[p];
            size_t n = 0;
            while (p + n < ex->npages && done + n < want && is_spare(ex, p + n) &&
                   !kept(ex, s, p + n, keep, keep_lo, keep_hi))
                n += ex->hlen[p + n];
            if (!n) { /* a handle of the block being placed */
                p += ex->hlen[p];
                continue;
            }
            if (!unmap_run(d, s, p, n))
                return done;
            done += n;
            p += n;
        }
    }
    return done;
}

typedef struct idle_run {
    tally_segment_t *s;
    size_t p, n;
} idle_run_t;

static int run_longer(const void *a, const void *b)
{
    const idle_run_t *x = a, *y = b;
    if (x->n != y->n)
        return x->n < y->n ? 1 : -1;
    return (x->p > y->p) - (x->p < y->p);
}

/* Take back at least want idle pages (fewer if there are not enough) in
 * whole runs of neighbouring spare handles, the longest runs first: one
 * unmap call each. Handles with a page in [keep_lo, keep_hi] of segment
 * keep are left alone. Returns the pages unmapped. */
static size_t steal_runs(tally_device_t *d, size_t want, const tally_segment_t *keep, size_t keep_lo, size_t keep_hi)
{
    size_t cap = 0, nr = 0;
    for (tally_segment_t *s = d->segments; s; s = s->next)
        if (s->ex)
            cap += s->ex->spare;
    if (!cap || !want)
        return 0;
    idle_run_t *runs = tally__meta_alloc(cap * sizeof *runs);
    if (!runs) /* no room to sort: take runs in address order */
        return unmap_idle(d, want, keep, keep_lo, keep_hi);
    for (tally_segment_t *s = d->segments; s; s = s->next) {
        tally_expand_t *ex = s->ex;
        if (!ex || !ex->spare)
            continue;
        size_t p = 0;
        while ((p = next_spare(ex, p)) < ex->npages) {
            p = ex->hstart[p];
            size_t n = 0;
            while (p + n < ex->npages && is_spare(ex, p + n) && !kept(ex, s, p + n, keep, keep_lo, keep_hi))
                n += ex->hlen[p + n];
            if (!n) {
                p += ex->hlen[p];
                continue;
            }
            runs[nr++] = (idle_run_t){s, p, n};
            p += n;
        }
    }
    qsort(runs, nr, sizeof *runs, run_longer);
    size_t done = 0;
    for (size_t i = 0; i < nr && done < want; i++) {
        if (!unmap_run(d, runs[i].s, runs[i].p, runs[i].n))
            break;
        done += runs[i].n;
    }
    tally__meta_free(runs);
    return done;
}

/* Requests under this size get a 20 MiB segment in PyTorch's default
 * placement; here they grow the range by expandable_grow_chunk_mb. When
 * each map call is one handle (expandable_move_budget not -1), blocks
 * under GROW_ONE_HANDLE do: fewer, larger handles, and on the recorded
 * traces the same peak (docs/benchmarks.md, run I: 10, 20, 40 and 64 MiB
 * measured; 64 raised resnet50's). */
#define GROW_SMALL ((size_t)10 << 20)
#define GROW_ONE_HANDLE ((size_t)40 << 20)

/* Pages to map past the block's last page in the same call, over free,
 * unmapped pages of the block after it: as many as fit under the
 * high-water mark (free: the peak does not move); and when the block is
 * under 10 MiB and grows the range (the free block after it is the
 * region's last), up to the next expandable_grow_chunk_mb boundary, so the
 * next small blocks find pages mapped: those are returned in *ahead, and
 * may raise reserved memory but not the mark (under 40 MiB when each map
 * call is one handle). run: the pages this call
 * maps for the block itself. */
static size_t map_ahead_pages(const tally_device_t *d, const tally_block_t *b, size_t last, size_t run,
                              size_t *ahead)
{
    const tally_segment_t *s = b->seg;
    const tally_block_t *rest = b->next;
    *ahead = 0;
    if (!rest || rest->state != BLOCK_FREE)
        return 0;
    uint64_t after = d->reserved + run * PAGE;
    size_t under_mark = high_water[d->id] > after ? (high_water[d->id] - after) / PAGE : 0;
    size_t want = under_mark;
    size_t chunk = (size_t)TALLY_OPT(expandable_grow_chunk_mb) * ((size_t)1 << 20) / PAGE;
    size_t grow_below = TALLY_OPT(expandable_move_budget) < 0 ? GROW_SMALL : GROW_ONE_HANDLE;
    if (chunk > 1 && b->size < grow_below && !rest->next)
        want += (last / chunk + 1) * chunk - last - 1; /* to the next chunk boundary */
    size_t end = (rest->addr + rest->size - s->base) / PAGE; /* pages wholly inside rest end here */
    size_t n = 0;
    while (n < want && last + 1 + n < end && !s->ex->mapped[last + 1 + n])
        n++;
    *ahead = n > under_mark ? n - under_mark : 0;
    return n;
}

/* Pages per physical handle for a run of n new pages of block b: the
 * whole run when b is at least expandable_handle_mb, else 1 (a handle per
 * page). */
static size_t handle_pages(const tally_block_t *b, size_t n)
{
    size_t min_mb = (size_t)TALLY_OPT(expandable_handle_mb);
    return min_mb && n > 1 && b->size >= min_mb << 20 ? n : 1;
}

/* Back the block's pages with memory and count it on them. Spare handles
 * elsewhere are unmapped first, as many pages as are needed. map_more:
 * also map pages past the block (map_ahead_pages); the retry after an OOM
 * maps the block's own pages only. Returns 0 or the backend's error; on
 * error nothing changed. */
int tally__expand_map_locked(tally_device_t *d, tally_block_t *b, bool map_more, char *why, size_t whylen)
{
    tally_segment_t *s = b->seg;
    tally_expand_t *ex = s->ex;
    size_t first, last, need = 0;
    page_span(s, b, &first, &last);
    for (size_t p = first; p <= last; p++)
        need += !ex->mapped[p];
    uint64_t room = high_water[d->id] > d->reserved ? (high_water[d->id] - d->reserved) / PAGE : 0;
    /* Moving idle pages here keeps reserved memory under the mark, at the
     * price of driver calls (unmap there, map here) that a repeating job
     * would make every step; within expandable_move_budget only. Otherwise
     * (and during a capture) new pages: past the mark, or OOM. */
    if (need > room && !tally__expand_unmap_held_locked(d) && move_allowed(d, need - room, movable(d))) {
        size_t got = steal_runs(d, need - room, s, first, last);
        if (got < need - room)
            tally__cache_release_small_locked(d, (need - room - got) * PAGE);
    }
    for (size_t p = first; p <= last;) {
        if (ex->mapped[p]) {
            p++;
            continue;
        }
        size_t n = 1;
        while (p + n <= last && !ex->mapped[p + n])
            n++;
        size_t ahead = 0, more = 0;
        if (p + n > last && map_more)
            more = map_ahead_pages(d, b, last, n, &ahead);
        size_t hp = handle_pages(b, n);
        int rc;
        if (TALLY_OPT(expandable_move_budget) >= 0) {
            /* Pages move rarely or never: the run and the pages ahead of it
             * in one handle (one cuMemCreate); a move takes whole idle
             * handles. Without limit (-1), the handle policy below. */
            rc = map_run(d, s, p, n + more, n + more, ahead, why, whylen);
        } else if (hp > 1) {
            /* The block's pages in large handles; pages mapped ahead in a
             * call of their own, a handle per page (a failure there only
             * leaves them unmapped). */
            rc = map_run(d, s, p, n, hp, 0, why, whylen);
            if (!rc && more) {
                char ignored[128];
                map_run(d, s, p + n, more, 1, ahead, ignored, sizeof ignored);
            }
        } else {
            rc = map_run(d, s, p, n + more, 1, ahead, why, whylen);
        }
        if (rc) {
            /* Undo this block's new pages: the spare handles on its pages
             * before p (no live block touches them). */
            for (size_t q = first; q < p && !tally__expand_unmap_held_locked(d);) {
                if (!is_spare(ex, q)) {
                    q++;
                    continue;
                }
                size_t h = ex->hstart[q], k = ex->hlen[h];
                unmap_run(d, s, h, k);
                q = h + k;
            }
            return rc;
        }
        /* Newly mapped: idle until the loop below counts the block. */
        p += n + more;
    }
    for (size_t p = first; p <= last; p++)
        if (ex->live[p]++ == 0)
            page_live(ex, p);
    return 0;
}

/* Whether the first size bytes of free block b lie on mapped pages. */
bool tally__expand_mapped_locked(const tally_block_t *b, size_t size)
{
    const tally_segment_t *s = b->seg;
    size_t first = (b->addr - s->base) / PAGE, last = (b->addr - s->base + size - 1) / PAGE;
    for (size_t p = first; p <= last; p++)
        if (!s->ex->mapped[p])
            return false;
    return true;
}

/* The block no longer needs its pages (called before it merges). */
void tally__expand_unref_locked(tally_block_t *b)
{
    tally_segment_t *s = b->seg;
    size_t first, last;
    page_span(s, b, &first, &last);
    for (size_t p = first; p <= last; p++)
        if (--s->ex->live[p] == 0)
            page_idle(s->ex, p);
}

/* Unmap every idle page (empty_cache, stage-end release); none while a
 * capture is under way (the next release after it does). */
size_t tally__expand_trim_locked(tally_device_t *d)
{
    if (tally__expand_unmap_held_locked(d)) {
        size_t held = 0;
        for (const tally_segment_t *s = d->segments; s; s = s->next)
            held += s->ex ? s->ex->spare : 0;
        if (held)
            tally__diag("device %d: %zu idle pages (%zu MiB) stay mapped while a CUDA graph is captured; "
                        "the next empty_cache after the capture gives them back",
                        d->id, held, held * (PAGE >> 20));
        return 0;
    }
    size_t bytes = unmap_idle(d, SIZE_MAX, NULL, 0, 0) * PAGE;
    /* An explicit release also resets the mark idle pages are kept under. */
    high_water[d->id] = d->reserved;
    return bytes;
}

/* Give the whole region back (its only block is free): unmap, unreserve.
 * Returns the bytes of memory that were mapped. */
size_t tally__expand_release_locked(tally_device_t *d, tally_segment_t *s)
{
    tally_expand_t *ex = s->ex;
    size_t bytes = ex->nmapped * PAGE;
    for (size_t p = 0; p < ex->npages;) {
        if (!ex->mapped[p]) {
            p++;
            continue;
        }
        size_t n = 1;
        while (p + n < ex->npages && ex->mapped[p + n])
            n++;
        unmap_run(d, s, p, n);
        p += n;
    }
    tally__g.backend->unreserve(d->id, (void *)s->base, s->size);
    tally__meta_free(ex->mapped);
    tally__meta_free(ex->live);
    tally__meta_free(ex->idle_bits);
    tally__meta_free(ex->spare_bits);
    tally__meta_free(ex->hstart);
    tally__meta_free(ex->hlen);
    tally__meta_free(ex->hidle);
    tally__meta_free(ex);
    s->ex = NULL;
    return bytes;
}

size_t tally__expand_mapped_bytes(const tally_segment_t *s)
{
    return s->ex->nmapped * PAGE;
}

/* Pages and counts against the blocks: every active block's pages mapped,
 * live counts equal a recount, idle equals mapped pages nobody touches,
 * handles tile the mapped pages and the spare ones are wholly idle. */
int tally__expand_check_locked(const tally_segment_t *s, char *why, size_t whylen)
{
    const tally_expand_t *ex = s->ex;
    uint32_t *live = tally__meta_calloc(ex->npages * sizeof *live);
    if (!live) {
        snprintf(why, whylen, "out of host memory for the page recount");
        return -1;
    }
    int rc = 0;
    for (const tally_block_t *b = s->head; b; b = b->next) {
        if (b->state == BLOCK_FREE)
            continue;
        size_t first, last;
        page_span(s, b, &first, &last);
        for (size_t p = first; p <= last; p++) {
            live[p]++;
            if (!ex->mapped[p] && !rc) {
                snprintf(why, whylen, "block %p uses unmapped page %zu", (void *)b->addr, p);
                rc = -1;
            }
        }
    }
    size_t mapped = 0, idle = 0;
    for (size_t p = 0; p < ex->npages && !rc; p++) {
        mapped += ex->mapped[p];
        idle += ex->mapped[p] && !live[p];
        bool bit = ex->idle_bits[p >> 6] >> (p & 63) & 1;
        if (bit != (ex->mapped[p] && !live[p]) && !rc) {
            snprintf(why, whylen, "page %zu of segment %p: idle bit %d is wrong", p, (void *)s->base, bit);
            rc = -1;
        }
        if (live[p] != ex->live[p]) {
            snprintf(why, whylen, "page %zu of segment %p counts %u live blocks, recount %u", p, (void *)s->base,
                     ex->live[p], live[p]);
            rc = -1;
        }
    }
    if (!rc && (mapped != ex->nmapped || idle != ex->idle)) {
        snprintf(why, whylen, "segment %p: %zu pages mapped (%zu counted), %zu idle (%zu counted)", (void *)s->base,
                 mapped, ex->nmapped, idle, ex->idle);
        rc = -1;
    }
    /* Handles: mapped pages tile into handles (first page, length, idle
     * pages); a page is spare exactly when its whole handle is idle. */
    size_t spare = 0;
    for (size_t h = 0; h < ex->npages && !rc;) {
        bool bit = is_spare(ex, h);
        if (!ex->mapped[h]) {
            if (bit || ex->hlen[h]) {
                snprintf(why, whylen, "unmapped page %zu of segment %p is %s", h, (void *)s->base,
                         bit ? "spare" : "the first page of a handle");
                rc = -1;
            }
            h++;
            continue;
        }
        size_t n = ex->hlen[h], idle_pages = 0;
        if (ex->hstart[h] != h || n == 0 || h + n > ex->npages) {
            snprintf(why, whylen, "page %zu of segment %p: handle at page %u of %zu pages where one should begin", h,
                     (void *)s->base, ex->hstart[h], n);
            rc = -1;
            break;
        }
        for (size_t q = h; q < h + n && !rc; q++) {
            if (!ex->mapped[q] || ex->hstart[q] != h || (q > h && ex->hlen[q]) || is_spare(ex, q) != bit) {
                snprintf(why, whylen, "page %zu of segment %p is not part of its handle at page %zu (%zu pages)",
                         q, (void *)s->base, h, n);
                rc = -1;
            }
            idle_pages += !live[q];
        }
        if (!rc && (idle_pages != ex->hidle[h] || bit != (idle_pages == n))) {
            snprintf(why, whylen, "handle at page %zu of segment %p: %zu of %zu pages idle, %u counted, spare %d",
                     h, (void *)s->base, idle_pages, n, ex->hidle[h], bit);
            rc = -1;
        }
        spare += bit ? n : 0;
        h += n;
    }
    if (!rc && spare != ex->spare) {
        snprintf(why, whylen, "segment %p: %zu spare pages, %zu counted", (void *)s->base, spare, ex->spare);
        rc = -1;
    }
    tally__meta_free(live);
    return rc;
}
