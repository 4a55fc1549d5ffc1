/* tally tune's candidates and their replays (tune.h).
 *
 * The grid (docs/tune.md, "The grid"): PyTorch's default, expandable
 * segments, max_split_size_mb at quantiles of the trace's large allocation
 * sizes, roundup_power2_divisions, garbage collection under a memory
 * fraction sized from the trace's peak, and a few combinations. Every value
 * comes from the trace or from PyTorch's own ranges, never from one
 * particular file.
 *
 * The replays: one forked process per candidate, at most `jobs` at a time.
 * tally's options are process-wide and most are fixed at initialisation, so
 * each configuration gets a fresh allocator in its own process; the trace is
 * shared copy-on-write. Children write their results into a shared
 * anonymous mapping and leave with _exit. Per row of the table: the replay
 * at --capacity, its least memory (search_least, a bisection of replays)
 * and what an empty_cache keeps (measure_kept, nine partial replays). Each
 * replay itself, and the driver time it models, is tune_run_replay.c's. */
#include "tune.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- the grid ---------------------------------------------------------------------- */

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

static void vadd(grid_t *g, const char *why, int engine, const char *fmt, va_list ap)
{
    if (g->n == g->max)
        return;
    tune_row_t *r = &g->rows[g->n];
    memset(r, 0, sizeof *r);
    vsnprintf(r->setting, sizeof r->setting, fmt, ap);
    for (size_t i = 0; i < g->n; i++)
        if (strcmp(g->rows[i].setting, r->setting) == 0 && g->rows[i].engine == engine)
            return; /* already there */
    r->why = why;
    r->engine = engine;
    r->tally_only = engine == TUNE_TALLY;
    r->oom_event = -1;
    r->out_event = -1;
    g->n++;
}

/* A row of PyTorch's keys (tally_only false: both allocators place it
 * alike) or of tally's own (true). */
static void add(grid_t *g, const char *why, bool tally_only, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void add(grid_t *g, const char *why, bool tally_only, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vadd(g, why, tally_only ? TUNE_TALLY : TUNE_BOTH, fmt, ap);
    va_end(ap);
}

/* A row under PyTorch's own expandable segments (the model). */
static void add_pt(grid_t *g, const char *why, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void add_pt(grid_t *g, const char *why, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vadd(g, why, TUNE_PT_EXPAND, fmt, ap);
    va_end(ap);
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
        /* Sizes above 20 MiB: rounded up, at least 21 (PyTorch's minimum is 20). */
        uint64_t mb = (big[(size_t)(q[i] * (double)(n - 1))] + MIB - 1) / MIB;
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
    /* Growth in whole 2 MiB pages only: least memory, more map calls. */
    add(&g, "tally's placement, no growth chunk", true, "expandable_segments:True,expandable_grow_chunk_mb:2");
    /* Idle pages moved without a driver-time limit: the least memory, a handle per page. */
    add(&g, "tally's placement, idle pages moved", true, "expandable_segments:True,expandable_move_budget:-1");
    /* Moves within 10 ms of modelled driver time a step: what any finite
     * budget can give, with a handle per map call (docs/benchmarks.md, run X). */
    add(&g, "tally's placement, idle pages moved within 10 ms a step", true,
        "expandable_segments:True,expandable_move_budget:10000");
    /* The small pool's segments lent by the expandable segments (run L). */
    add(&g, "tally's placement, small pool on the same pages", true,
        "expandable_segments:True,expandable_small_shared:True");
    /* PyTorch's own expandable segments (tools/pt_expand.c): its 20 MiB
     * large pages, and large_segment_size_mb's smaller ones. */
    add_pt(&g, "PyTorch's expandable segments (model)", "expandable_segments:True");
    add_pt(&g, "PyTorch's expandable segments, 2 MiB large pages", "expandable_segments:True,large_segment_size_mb:2");
    add_pt(&g, "PyTorch's expandable segments, 10 MiB large pages",
           "expandable_segments:True,large_segment_size_mb:10");
    /* Smaller segments for large-pool requests under 10 MiB (PyTorch's 20 MiB default). */
    add(&g, "smaller large-pool segments", false, "large_segment_size_mb:%d", 4);
    add(&g, "smaller large-pool segments", false, "large_segment_size_mb:%d", 10);
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

/* ---- the replays ------------------------------------------------------------------- */

/* tune_replay_one in a forked process (tally engines), or here (the model). */
static void replay_fresh(const trace_t *t, const tune_start_t *start, uint64_t capacity, tune_row_t *r,
                         int64_t *series)
{
    if (r->engine == TUNE_PT_EXPAND) {
        tune_replay_one(t, start, capacity, r, series);
        return;
    }
    tune_row_t *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        snprintf(r->error, sizeof r->error, "mmap: %s", strerror(errno));
        return;
    }
    *sh = *r;
    pid_t pid = fork();
    if (pid == 0) {
        tune_replay_one(t, start, capacity, sh, series);
        _exit(0);
    }
    int status = 0;
    while (pid > 0 && waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    *r = *sh;
    if (pid < 0)
        snprintf(r->error, sizeof r->error, "fork: %s", strerror(errno));
    else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        snprintf(r->error, sizeof r->error, "the replay process %s %d",
                 WIFSIGNALED(status) ? "died of signal" : "exited with",
                 WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    if (r->error[0])
        r->ok = false;
    munmap(sh, sizeof *sh);
}

#define SEARCH_TOP ((uint64_t)1 << 46) /* 64 TiB: beyond it a search stops */

/* The least device memory r runs in: replays at decreasing capacities (a
 * bisection between the peak of live bytes, which no setting can go below,
 * and what it reserves with all the memory it wants), each in a fresh
 * allocator. Records the largest capacity found too small and where that
 * replay ran out. Assumes a setting that runs in C runs in more. */
static void search_least(const trace_t *t, const tune_start_t *start, uint64_t capacity, tune_row_t *r)
{
    uint64_t live = peak_live(t), lo = live, hi = 0;
    r->min_lower = (int64_t)live;
    if (strstr(r->setting, "memory_fraction:")) {
        r->min_lower = -1; /* a fraction caps at a share of the device: less memory, a lower cap */
        return;
    }
    if (r->oom_event < 0) {
        hi = (uint64_t)r->peak_reserved < capacity ? (uint64_t)r->peak_reserved : capacity;
        tune_row_t p = *r;
        p.error[0] = 0;
        if (hi < capacity) {
            replay_fresh(t, start, hi, &p, NULL);
            if (!p.ok || p.oom_event >= 0)
                hi = capacity;
        }
    } else {
        lo = capacity > lo ? capacity : lo;
        r->out_capacity = (int64_t)capacity;
        r->out_event = r->oom_event;
        for (uint64_t c = capacity * 2; c <= SEARCH_TOP && !hi; c *= 2) {
            if (c < live)
                continue;
            tune_row_t p = *r;
            p.error[0] = 0;
            replay_fresh(t, start, c, &p, NULL);
            if (p.ok && p.oom_event < 0)
                hi = c;
            else if (p.ok) {
                lo = c;
                r->out_capacity = (int64_t)c;
                r->out_event = p.oom_event;
            }
        }
        if (!hi) {
            r->min_lower = (int64_t)(lo > live ? lo : live);
            return;
        }
    }
    uint64_t step = hi / 1000 > 2 * MIB ? hi / 1000 : 2 * MIB;
    while (hi > lo && hi - lo > step) {
        uint64_t mid = lo + (hi - lo) / 2;
        mid = mid / (2 * MIB) * (2 * MIB);
        if (mid <= lo)
            break;
        tune_row_t p = *r;
        p.error[0] = 0;
        replay_fresh(t, start, mid, &p, NULL);
        if (p.ok && p.oom_event < 0) {
            hi = mid;
        } else {
            lo = mid;
            r->out_capacity = (int64_t)mid;
            r->out_event = p.oom_event;
        }
    }
    if (r->out_event < 0 && hi > 2 * MIB) {
        /* No replay ran out yet: where one with a little less than the least does. */
        tune_row_t p = *r;
        p.error[0] = 0;
        uint64_t less = (hi - 1) / (2 * MIB) * (2 * MIB);
        replay_fresh(t, start, less, &p, NULL);
        if (p.ok && p.oom_event >= 0) {
            r->out_capacity = (int64_t)less;
            r->out_event = p.oom_event;
        }
    }
    r->min_bytes = (int64_t)hi;
    r->min_lower = (int64_t)lo;
}

/* What an empty_cache in the middle of the job gives back under r's
 * setting: at each cut k/TUNE_KEPT_CUTS of the window, a fresh replay of
 * the events before it, then an empty_cache ('e'), and the reserved bytes
 * left. What stays beyond the live bytes is memory a live block pins: a
 * segment with one live block in it, a physical handle (tally's
 * expandable segments unmap a handle only whole) or a page (PyTorch's
 * expandable segments unmap 20 MiB pages) that a live block touches.
 * Summed over the cuts, so that one cut does not decide; a row that runs
 * out of memory at a cut is not measured. */
static void measure_kept(const trace_t *t, const tune_start_t *start, uint64_t capacity, tune_row_t *r)
{
    size_t skip = r->from_start && start && start->known ? start->nlive : 0;
    r->kept = r->kept_live = 0;
    if (t->nev < skip + TUNE_KEPT_CUTS)
        return;
    trace_t cut = *t;
    cut.ev = malloc((t->nev + 1) * sizeof *cut.ev);
    if (!cut.ev)
        return;
    int64_t kept = 0, live_sum = 0, live = 0;
    size_t done = 0;
    for (int k = 1; k < TUNE_KEPT_CUTS; k++) {
        size_t n = skip + (t->nev - skip) * (size_t)k / TUNE_KEPT_CUTS;
        for (; done < n; done++)
            live += t->ev[done].op == 'a' ? (int64_t)t->ev[done].size
                    : t->ev[done].op == 'f' ? -(int64_t)t->ev[done].size : 0;
        memcpy(cut.ev, t->ev, n * sizeof *cut.ev);
        cut.ev[n] = (trace_event_t){0, UINT32_MAX, 0, 'e'};
        cut.nev = n + 1;
        tune_row_t p = *r;
        p.error[0] = 0;
        p.ok = false;
        replay_fresh(&cut, start, capacity, &p, NULL);
        if (!p.ok || p.oom_event >= 0) {
            kept = live_sum = 0;
            break;
        }
        kept += p.reserved_end;
        live_sum += live;
    }
    free(cut.ev);
    r->kept = kept;
    r->kept_live = live_sum;
}

/* In the child: the row's replay at capacity, then (search: the table's
 * replays) its least memory and what empty_cache keeps. */
static void child(const trace_t *t, const tune_start_t *start, uint64_t capacity, bool search, tune_row_t *r,
                  int64_t *series)
{
    replay_fresh(t, start, capacity, r, series);
    if (r->ok && search)
        search_least(t, start, capacity, r);
    if (r->ok && search && r->oom_event < 0)
        measure_kept(t, start, capacity, r);
}

int tune_run(const trace_t *t, uint64_t capacity, tune_row_t *rows, size_t nrows, int jobs, bool quiet,
             const size_t *want, size_t nwant, tune_series_t *series, char *err, size_t errlen)
{
    return tune_run_ex(t, NULL, capacity, false, rows, nrows, jobs, quiet, want, nwant, series, err, errlen);
}

int tune_run_ex(const trace_t *t, const tune_start_t *start, uint64_t capacity, bool search, tune_row_t *rows,
                size_t nrows, int jobs, bool quiet, const size_t *want, size_t nwant, tune_series_t *series, char *err,
                size_t errlen)
{
    size_t row_bytes = nrows * sizeof *rows;
    size_t ser_bytes = nwant * (t->nev ? t->nev : 1) * sizeof(int64_t);
    size_t bytes = row_bytes + ser_bytes;
    unsigned char *shared = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED)
        return snprintf(err, errlen, "mmap of %zu bytes: %s", bytes, strerror(errno)), -1;
    tune_row_t *out = (tune_row_t *)shared;
    int64_t *ser = (int64_t *)(shared + row_bytes);
    memcpy(out, rows, row_bytes);
    pid_t *pids = calloc(nrows ? nrows : 1, sizeof *pids);
    if (!pids) {
        munmap(shared, bytes);
        return snprintf(err, errlen, "out of memory"), -1;
    }
    bool tty = !quiet && isatty(2);
    double t0 = tune_now_s();
    size_t next = 0, done = 0;
    int running = 0, rc = 0;
    fflush(NULL);
    while (done < nrows) {
        while (!rc && running < jobs && next < nrows) {
            int64_t *mine = NULL;
            for (size_t w = 0; w < nwant; w++)
                if (want[w] == next)
                    mine = ser + w * t->nev;
            pid_t pid = fork();
            if (pid < 0) {
                snprintf(err, errlen, "fork: %s", strerror(errno));
                rc = -1;
                break;
            }
            if (pid == 0) {
                child(t, start, capacity, search, &out[next], mine);
                _exit(0);
            }
            pids[next++] = pid;
            running++;
        }
        if (!running)
            break;
        int status;
        pid_t pid = wait(&status);
        if (pid < 0) {
            if (errno == EINTR)
                continue;
            snprintf(err, errlen, "wait: %s", strerror(errno));
            rc = -1;
            break;
        }
        for (size_t i = 0; i < next; i++)
            if (pids[i] == pid) {
                if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
                    snprintf(out[i].error, sizeof out[i].error, "the replay process %s %d",
                             WIFSIGNALED(status) ? "died of signal" : "exited with",
                             WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
                if (out[i].error[0])
                    out[i].ok = false;
            }
        running--;
        done++;
        if (tty)
            fprintf(stderr, "\rtally tune: %zu/%zu settings replayed (%d worker%s, %.1f s)", done, nrows, jobs,
                    jobs == 1 ? "" : "s", tune_now_s() - t0);
    }
    if (!quiet)
        fprintf(stderr, "%stally tune: %zu settings replayed, %zu events each, %d worker%s, %.2f s\n", tty ? "\r\33[K" : "",
                done, t->nev, jobs, jobs == 1 ? "" : "s", tune_now_s() - t0);
    memcpy(rows, out, row_bytes);
    for (size_t w = 0; series && w < nwant; w++) {
        series[w].n = t->nev;
        series[w].reserved = malloc((t->nev ? t->nev : 1) * sizeof(int64_t));
        if (series[w].reserved)
            memcpy(series[w].reserved, ser + w * t->nev, t->nev * sizeof(int64_t));
    }
    free(pids);
    munmap(shared, bytes);
    return rc;
}
