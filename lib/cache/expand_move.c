/* Moves of expandable segments' memory (expand.c): idle pages unmapped where
 * they lie so that a block elsewhere can map new ones under the high-water
 * mark. Holds the steady-state detector (is the job repeating its step, and
 * how long is the step), the move budget it refills each step
 * (expandable_move_budget, in modelled driver microseconds), and the taking
 * back of idle pages: in address order (empty_cache) or in whole runs of
 * spare handles, the longest first (a steal). Runs with the device lock
 * held. */
#include "cache/cache.h"

#include <math.h>
#include <stdlib.h>

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

/* FNV-1a over the last KGRAM sizes, its high half folded into the low: a product's low bits
 * depend only on its operands' low bits, and sizes are multiples of 512 B
 * (of 2 MiB for most large ones), so without the high half every window would
 * fall in the same few of the KG_SLOTS slots (taken modulo), and a period
 * whose last match lies more than CHAIN_WALK ends back would not be found. */
static uint64_t kgram_hash(const steady_t *st)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t k = 0; k < KGRAM; k++)
        h = (h ^ st->size[(st->n - 1 - k) % LEARN]) * 1099511628211ull;
    return h ^ (h >> 32); /* the slot's low bits from the high half too */
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

/* What a move costs, in modelled driver microseconds (the A100 column of
 * tests/standin/cost.c; the driver's cost law is per call and per mapping,
 * not per page, so a handle of many pages costs what a handle of one
 * does). In a job that moves the same memory every step, these are the
 * calls each move adds to a step:
 * - each run of idle handles taken: a cuStreamSynchronize before its
 *   cuMemUnmap, then per handle the unmap's mapping and a cuMemRelease;
 * - the block's map call, which a job that moved nothing would have made
 *   once and kept: cuMemCreate + cuMemMap + cuMemSetAccess of one mapping;
 * - each free small-pool segment released: its cuMemFree, and the
 *   cuMemAlloc that makes it again when the small pool wants it back. */
#define MOVE_RUN_US 20.0
#define MOVE_HANDLE_US (25.6 + 25.6)
#define MOVE_MAP_US (193.0 + 1.45 + 36.0)
#define MOVE_SEGMENT_US (51.2 + 230.45)
#define MOVE_PAGE ((size_t)2 << 20) /* a small-pool segment */

/* Pages that could move: spare pages of every region, and the pages of
 * the free small-pool segments. */
size_t tally__expand_movable_locked(const tally_device_t *d)
{
    size_t n = 0;
    for (const tally_segment_t *s = d->segments; s; s = s->next)
        n += s->ex ? s->ex->spare : 0;
    return n + d->small.count;
}

static double move_cost_us(const tally_move_t *m)
{
    return (double)m->runs * MOVE_RUN_US + (double)m->handles * MOVE_HANDLE_US + (double)m->segments * MOVE_SEGMENT_US;
}

void tally__expand_move_locked(tally_device_t *d, size_t want, const tally_segment_t *keep, size_t lo, size_t hi,
                               bool ends_last)
{
    int budget = TALLY_OPT(expandable_move_budget);
    steady_t *st = &steady[d->id];
    if (!want || budget == 0 || (budget > 0 && !st->size) || !tally__expand_movable_locked(d))
        return;
    /* What the runs, handles and segments taken may cost: the step's budget
     * left, less the block's map call that any move brings. */
    double cap = budget < 0 ? HUGE_VAL : st->tokens - MOVE_MAP_US;
    if (cap <= 0)
        return;
    tally_move_t m = {0, 0, 0};
    size_t got = tally__expand_steal_runs_locked(d, want, keep, lo, hi, ends_last, cap, &m);
    if (got < want) {
        size_t segs = want - got;
        double left = cap - move_cost_us(&m);
        if (left < (double)segs * MOVE_SEGMENT_US)
            segs = (size_t)(left / MOVE_SEGMENT_US);
        m.segments = segs ? tally__cache_release_small_locked(d, segs * MOVE_PAGE) / MOVE_PAGE : 0;
    }
    if (budget > 0 && (m.runs || m.segments))
        st->tokens -= MOVE_MAP_US + move_cost_us(&m);
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
size_t tally__expand_unmap_idle_locked(tally_device_t *d, size_t want, const tally_segment_t *keep, size_t keep_lo,
                                       size_t keep_hi)
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
            while (p + n < ex->npages && done + n < want && tally__expand_is_spare(ex, p + n) &&
                   !kept(ex, s, p + n, keep, keep_lo, keep_hi))
                n += ex->hlen[p + n];
            if (!n) { /* a handle of the block being placed */
                p += ex->hlen[p];
                continue;
            }
            if (!tally__expand_unmap_run_locked(d, s, p, n))
                break; /* its stream could not be waited for: the next region's pages */
            done += n;
            p += n;
        }
    }
    return done;
}

typedef struct idle_run {
    tally_segment_t *s;
    size_t p, n;
    bool end; /* the region's last mapped pages (mapped ahead of need) */
} idle_run_t;

static int run_longer(const void *a, const void *b)
{
    const idle_run_t *x = a, *y = b;
    if (x->end != y->end)
        return x->end ? 1 : -1;
    if (x->n != y->n)
        return x->n < y->n ? 1 : -1;
    return (x->p > y->p) - (x->p < y->p);
}

static size_t take_runs(tally_device_t *d, const idle_run_t *runs, size_t nr, size_t want, double cap_us,
                        tally_move_t *m)
{
    size_t done = 0;
    for (size_t i = 0; i < nr && done < want; i++) {
        size_t p = runs[i].p, n = runs[i].n;
        const tally_expand_t *ex = runs[i].s->ex;
        if (runs[i].end) {
            /* The run's last handles, as few as cover what is left. */
            size_t q = p;
            for (size_t h = p; h < p + n; h += ex->hlen[h])
                if (p + n - h >= want - done)
                    q = h;
            n -= q - p;
            p = q;
        }
        /* Its handles, the first ones, as many as the cap pays for. Within a
         * budget, not a run whose first handle is larger than what is still
         * wanted: the pages beyond the need would be mapped again where they
         * were, and on synth-7b that raised the peak (docs/benchmarks.md,
         * run X). */
        if (!isinf(cap_us) && ex->hlen[p] > want - done)
            continue;
        size_t h = 0, take = 0;
        for (size_t q = p; q < p + n; q += ex->hlen[q], h++) {
            if (MOVE_RUN_US + (double)(h + 1) * MOVE_HANDLE_US > cap_us)
                break;
            take += ex->hlen[q];
        }
        if (!take)
            break;
        if (!tally__expand_unmap_run_locked(d, runs[i].s, p, take))
            continue; /* its stream could not be waited for: another run */
        cap_us -= MOVE_RUN_US + (double)h * MOVE_HANDLE_US;
        m->runs++;
        m->handles += h;
        done += take;
    }
    return done;
}

/* Take back at least want idle pages (fewer if there are not enough) in
 * whole runs of neighbouring spare handles, the longest runs first: one
 * unmap call each. Handles with a page in [keep_lo, keep_hi] of segment
 * keep are left alone. ends_last (a new small-pool segment's steal): a
 * region's last idle run (the pages mapped ahead of its growth, which the
 * large pool would map again when it grows) goes after every other run,
 * and only its last handles, as few as cover what is still wanted: with
 * moves unlimited, 12% fewer driver calls on the nine shared traces for
 * the same peaks but one (docs/benchmarks.md, run V). cap_us: what the
 * runs and handles taken may cost (MOVE_RUN_US each run, MOVE_HANDLE_US
 * each handle; HUGE_VAL: no limit), counted in *m. Returns the pages
 * unmapped. */
size_t tally__expand_steal_runs_locked(tally_device_t *d, size_t want, const tally_segment_t *keep, size_t keep_lo,
                                       size_t keep_hi, bool ends_last, double cap_us, tally_move_t *m)
{
    size_t cap = 0, nr = 0;
    for (tally_segment_t *s = d->segments; s; s = s->next)
        if (s->ex)
            cap += s->ex->spare;
    if (!cap || !want)
        return 0;
    idle_run_t *runs = tally__meta_alloc(cap * sizeof *runs);
    if (!runs) /* no room to sort: runs in address order, without limit only */
        return isinf(cap_us) ? tally__expand_unmap_idle_locked(d, want, keep, keep_lo, keep_hi) : 0;
    for (tally_segment_t *s = d->segments; s; s = s->next) {
        tally_expand_t *ex = s->ex;
        if (!ex || !ex->spare)
            continue;
        size_t top = ex->npages; /* one past the region's last mapped page */
        while (ends_last && top && !ex->mapped[top - 1])
            top--;
        size_t p = 0;
        while ((p = next_spare(ex, p)) < ex->npages) {
            p = ex->hstart[p];
            size_t n = 0;
            while (p + n < ex->npages && tally__expand_is_spare(ex, p + n) &&
                   !kept(ex, s, p + n, keep, keep_lo, keep_hi))
                n += ex->hlen[p + n];
            if (!n) {
                p += ex->hlen[p];
                continue;
            }
            runs[nr++] = (idle_run_t){s, p, n, ends_last && p + n == top};
            p += n;
        }
    }
    qsort(runs, nr, sizeof *runs, run_longer);
    size_t done = take_runs(d, runs, nr, want, cap_us, m);
    tally__meta_free(runs);
    return done;
}
