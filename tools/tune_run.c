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
 * anonymous mapping and leave with _exit. */
#include "tune.h"

#include <tally.h>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
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
    /* Growth in whole 2 MiB pages only: least memory, more map calls. */
    add(&g, "tally's placement, no growth chunk", true, "expandable_segments:True,expandable_grow_chunk_mb:2");
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

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef struct sampler {
    int64_t *out;
} sampler_t;

/* Reserved bytes after each event: the host backend's used capacity. */
static void sample(void *arg, size_t i)
{
    sampler_t *s = arg;
    size_t free_b = 0, total = 0;
    tally_mem_get_info(0, &free_b, &total);
    s->out[i] = (int64_t)(total - free_b);
}

/* The replays' diagnostics (an OOM report when a candidate does not fit)
 * would bury the table: the row says it. */
static void discard(void *arg, const char *text, size_t len)
{
    (void)arg, (void)text, (void)len;
}

/* In the child: configure, replay, fill r (and series when given). */
static void child(const trace_t *t, uint64_t capacity, tune_row_t *r, int64_t *series)
{
    char conf[512];
    unsetenv("TALLY_CONF");
    tally_set_sink(discard, NULL);
    snprintf(conf, sizeof conf,
             "backend:host,host_mode:virtual,host_devices:1,host_capacity:%llu,leak_report:off,stage_report:false,"
             "ledger:false",
             (unsigned long long)capacity);
    if (tally_configure(conf) || (r->setting[0] && tally_configure(r->setting)) || tally_init()) {
        snprintf(r->error, sizeof r->error, "%s", tally_last_error());
        return;
    }
    void **ptrs = calloc(t->nalloc ? t->nalloc : 1, sizeof *ptrs);
    if (!ptrs) {
        snprintf(r->error, sizeof r->error, "out of memory");
        return;
    }
    sampler_t s = {series};
    double t0 = now_s();
    r->oom_event = trace_run(t, ptrs, series ? sample : NULL, &s);
    r->seconds = now_s() - t0;
    tally_stats_t st;
    if (tally_get_stats(0, &st)) {
        snprintf(r->error, sizeof r->error, "tally_get_stats: %s", tally_last_error());
        return;
    }
    r->peak_reserved = st.reserved_bytes[0].peak;
    r->num_device_alloc = st.num_device_alloc;
    r->backend_calls = st.num_device_alloc + st.num_device_free;
    r->ok = true;
}

int tune_run(const trace_t *t, uint64_t capacity, tune_row_t *rows, size_t nrows, int jobs, bool quiet,
             const size_t *want, size_t nwant, tune_series_t *series, char *err, size_t errlen)
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
    double t0 = now_s();
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
                child(t, capacity, &out[next], mine);
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
                    jobs == 1 ? "" : "s", now_s() - t0);
    }
    if (!quiet)
        fprintf(stderr, "%stally tune: %zu settings replayed, %zu events each, %d worker%s, %.2f s\n", tty ? "\r\33[K" : "",
                done, t->nev, jobs, jobs == 1 ? "" : "s", now_s() - t0);
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
