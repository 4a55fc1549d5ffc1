/* The candidate settings tally tune replays (docs/tune.md, "The grid"):
 * PyTorch's default, expandable segments, max_split_size_mb at quantiles of
 * the trace's large allocation sizes, roundup_power2_divisions, garbage
 * collection under a memory fraction sized from the trace's peak, and a few
 * combinations. Every value comes from the trace or from PyTorch's own
 * ranges, never from one particular file. */
#include "tune.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB ((uint64_t)1 << 20)

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

typedef struct grid {
    tune_row_t *rows;
    size_t n, max;
} grid_t;

static void add(grid_t *g, const char *why, bool tally_only, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void add(grid_t *g, const char *why, bool tally_only, const char *fmt, ...)
{
    if (g->n == g->max)
        return;
    tune_row_t *r = &g->rows[g->n];
    memset(r, 0, sizeof *r);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->setting, sizeof r->setting, fmt, ap);
    va_end(ap);
    for (size_t i = 0; i < g->n; i++)
        if (strcmp(g->rows[i].setting, r->setting) == 0)
            return; /* already there */
    r->why = why;
    r->tally_only = tally_only;
    r->oom_event = -1;
    g->n++;
}

/* Peak of the sum of requested sizes of live allocations. */
static uint64_t peak_live(const trace_t *t)
{
    uint64_t live = 0, peak = 0;
    for (size_t i = 0; i < t->nev; i++) {
        live = t->ev[i].op == 'a' ? live + t->ev[i].size : live - t->ev[i].size;
        peak = live > peak ? live : peak;
    }
    return peak;
}

/* Distinct max_split_size_mb values at quantiles of the allocation sizes
 * above 20 MiB (PyTorch's minimum): blocks at or above the value are not
 * split, so each candidate keeps the largest allocations whole. */
static size_t split_values(const trace_t *t, uint64_t *out, size_t max)
{
    size_t n = 0;
    uint64_t *big = malloc((t->nalloc ? t->nalloc : 1) * sizeof *big);
    if (!big)
        return 0;
    for (size_t i = 0; i < t->nev; i++)
        if (t->ev[i].op == 'a' && t->ev[i].size > 20 * MIB)
            big[n++] = t->ev[i].size;
    qsort(big, n, sizeof *big, cmp_u64);
    static const double q[] = {0.25, 0.5, 0.75, 0.9, 0.99};
    size_t k = 0;
    for (size_t i = 0; n && i < sizeof q / sizeof q[0] && k < max; i++) {
        uint64_t mb = (big[(size_t)(q[i] * (double)(n - 1))] + MIB - 1) / MIB;
        if (mb <= 20)
            mb = 21;
        if (!k || out[k - 1] != mb)
            out[k++] = mb;
    }
    free(big);
    return k;
}

size_t tune_grid(const trace_t *t, uint64_t capacity, tune_row_t *rows, size_t max)
{
    grid_t g = {rows, 0, max};
    add(&g, "PyTorch's default", false, "%s", "");
    add(&g, "tally's page-granular placement", true, "expandable_segments:True");
    uint64_t split[5];
    size_t ns = split_values(t, split, 5);
    for (size_t i = 0; i < ns; i++)
        add(&g, "quantile of allocations > 20 MiB", false, "max_split_size_mb:%llu", (unsigned long long)split[i]);
    static const int div[] = {2, 4, 8, 16};
    for (size_t i = 0; i < sizeof div / sizeof div[0]; i++)
        add(&g, "power-of-two size classes", false, "roundup_power2_divisions:%d", div[i]);
    add(&g, "size classes coarser for large sizes", false, "roundup_power2_divisions:[256:1,1024:4,>:8]");
    /* Garbage collection acts only under a memory fraction: one that leaves
     * 10%, 25% or 50% above the trace's peak live bytes. */
    uint64_t live = peak_live(t);
    static const double headroom[] = {1.10, 1.25, 1.50};
    double tight = 0;
    for (size_t i = 0; capacity && i < sizeof headroom / sizeof headroom[0]; i++) {
        double f = (double)live * headroom[i] / (double)capacity;
        f = (double)(long long)(f * 1000.0 + 0.999) / 1000.0; /* up to 0.001 */
        if (f <= 0 || f >= 1)
            continue;
        add(&g, "collection under a memory fraction", false, "garbage_collection_threshold:0.8,memory_fraction:%.3f", f);
        if (tight == 0) {
            tight = f;
            add(&g, "collection under a memory fraction", false,
                "garbage_collection_threshold:0.6,memory_fraction:%.3f", f);
            add(&g, "collection under a memory fraction", false,
                "garbage_collection_threshold:0.95,memory_fraction:%.3f", f);
        }
    }
    /* Combinations of the single keys. */
    if (ns) {
        uint64_t mid = split[ns / 2];
        add(&g, "split limit with size classes", false, "max_split_size_mb:%llu,roundup_power2_divisions:4",
            (unsigned long long)mid);
        add(&g, "split limit, tighter reuse of unsplit blocks", false,
            "max_split_size_mb:%llu,max_non_split_rounding_mb:%llu", (unsigned long long)mid,
            (unsigned long long)(mid / 4 > 20 ? mid / 4 : 20));
    }
    if (ns && tight > 0)
        add(&g, "split limit with collection", false,
            "max_split_size_mb:%llu,garbage_collection_threshold:0.8,memory_fraction:%.3f",
            (unsigned long long)split[ns - 1], tight);
    if (tight > 0)
        add(&g, "tally's placement with collection", true,
            "expandable_segments:True,garbage_collection_threshold:0.8,memory_fraction:%.3f", tight);
    add(&g, "tally's placement with size classes", true, "expandable_segments:True,roundup_power2_divisions:4");
    add(&g, "tally's placement, unsplit large blocks", true, "expandable_segments:True,max_split_size_mb:%llu",
        (unsigned long long)(ns ? split[ns - 1] : 512));
    return g.n;
}
