/* One replay of a tally tune row, in this process (tune.h): tally on its
 * host backend, a virtual device of the row's capacity configured with the
 * row's setting, or the model of PyTorch's expandable segments
 * (tools/pt_expand.c); from the trace's start or from the recorded state
 * (the snapshot's segments and live blocks made first); with the reserved
 * bytes after each event sampled for --plot. Then the driver time of what
 * it did, priced by the stand-in's cost table (tune_driver_us): for tally,
 * the calls its host backend counted in the window. tune_run.c runs each
 * replay of tally in a fresh process: its options are fixed at
 * initialisation. */
#include "tune.h"

#include "../tests/standin/cost.h"

#include <tally.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MIB ((uint64_t)1 << 20)

double tune_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef struct sampler {
    int64_t *out;
    size_t skip; /* events the recorded state stands for */
} sampler_t;

/* Reserved bytes after each event (--plot): the host backend's used capacity. */
static void sample(void *arg, size_t i)
{
    sampler_t *s = arg;
    size_t free_b = 0, total = 0;
    tally_mem_get_info(0, &free_b, &total);
    s->out[s->skip + i] = (int64_t)(total - free_b);
}

/* The replays' diagnostics (an OOM report when a candidate does not fit)
 * would bury the table: the row says it. */
static void discard(void *arg, const char *text, size_t len)
{
    (void)arg, (void)text, (void)len;
}

static void *stream_ptr(const trace_t *t, uint64_t id)
{
    for (size_t s = 0; s < t->nstreams; s++)
        if ((uint64_t)t->stream_ids[s] == id)
            return id == 0 ? NULL : (void *)(uintptr_t)(0x100000u + 0x100u * (unsigned)s);
    return id == 0 ? NULL : (void *)(uintptr_t)(0x200000u + (uintptr_t)(id & 0xffff) * 0x100u);
}

/* The recorded state under tally's default placement: each segment made
 * by one allocation of its size (a small one by its first piece), then cut
 * in address order into its live blocks and the free gaps between them,
 * every gap freed at the end so that it merges back. Each piece's address
 * is checked against the segment's base: a setting whose rules would place
 * them otherwise (rounding, a split limit) cannot start there. */
typedef struct piece {
    void *p;
    bool gap;
} piece_t;

static int seed_tally(const trace_t *t, const tune_start_t *st, void **ptrs, char *why, size_t whylen)
{
    size_t cap = 64, n = 0;
    piece_t *pcs = malloc(cap * sizeof *pcs);
    if (!pcs)
        return snprintf(why, whylen, "out of memory"), -1;
    int rc = 0;
    for (size_t i = 0; !rc && i < st->nranges; i++) {
        const ptx_range_t *r = &st->ranges[i];
        void *sp = stream_ptr(t, r->stream);
        uint64_t piece_max = r->small ? MIB : r->size, tiny = r->small ? 512 : MIB;
        unsigned char *base = NULL;
        tally_stats_t before, made;
        tally_get_stats(0, &before);
        if (!r->small) {
            base = tally_malloc(r->size, 0, sp);
            if (!base) {
                rc = -1; snprintf(why, whylen, "a %llu-byte segment of the recorded state did not fit",
                              (unsigned long long)r->size);
                break;
            }
            tally_free(base);
        }
        uint64_t cur = r->addr, end = r->addr + r->size;
        while (!rc && cur < end) {
            /* The next live block at or after cur in this segment. */
            const ptx_live_t *next = NULL;
            for (size_t k = 0; k < st->nlive; k++)
                if (st->live[k].addr >= cur && st->live[k].addr < end && (!next || st->live[k].addr < next->addr))
                    next = &st->live[k];
            uint64_t size;
            bool gap = !next || next->addr > cur;
            if (gap) {
                size = (next ? next->addr : end) - cur;
                if (size > piece_max)
                    size = piece_max;
            } else {
                size = next->size;
                /* A remainder too small to split stays with the block, as it did in PyTorch. */
                uint64_t after = cur + size;
                const ptx_live_t *nn = NULL;
                for (size_t k = 0; k < st->nlive; k++)
                    if (st->live[k].addr > cur && st->live[k].addr < end && (!nn || st->live[k].addr < nn->addr))
                        nn = &st->live[k];
                uint64_t stop = nn ? nn->addr : end;
                if (stop < after) {
                    rc = -1; snprintf(why, whylen, "blocks live before recording overlap at address %llu",
                                  (unsigned long long)cur);
                    break;
                }
                if (stop - after < (r->small ? 512 : MIB + 1))
                    size = stop - cur;
            }
            if (!r->small && size <= tiny) {
                rc = -1; snprintf(why, whylen, "a free gap of %llu bytes in a large segment (address %llu)",
                              (unsigned long long)size, (unsigned long long)cur);
                break;
            }
            unsigned char *p = tally_malloc(size, 0, sp);
            if (p && !base && cur == r->addr)
                base = p;
            if (p && cur == r->addr) {
                /* The segment made is the recorded one's size, or the setting makes another. */
                tally_get_stats(0, &made);
                if (made.reserved_bytes[0].current - before.reserved_bytes[0].current != (int64_t)r->size) {
                    rc = -1;
                    snprintf(why, whylen, "the setting makes a %lld-byte segment where PyTorch had %llu bytes "
                             "(address %llu)", (long long)(made.reserved_bytes[0].current -
                                                           before.reserved_bytes[0].current),
                             (unsigned long long)r->size, (unsigned long long)r->addr);
                    tally_free(p);
                    break;
                }
            }
            if (!p || p != base + (cur - r->addr)) {
                rc = -1; snprintf(why, whylen, "the setting does not lay out the recorded segment at address %llu "
                              "as PyTorch had it", (unsigned long long)r->addr);
                if (p)
                    tally_free(p);
                break;
            }
            if (n == cap) {
                piece_t *g = realloc(pcs, (cap *= 2) * sizeof *pcs);
                if (!g) {
                    rc = -1; snprintf(why, whylen, "out of memory");
                    tally_free(p);
                    break;
                }
                pcs = g;
            }
            pcs[n++] = (piece_t){p, gap};
            if (!gap && next->slot < t->nalloc)
                ptrs[next->slot] = p;
            cur += size;
        }
    }
    for (size_t i = 0; i < n; i++)
        if (pcs[i].gap || rc)
            tally_free(pcs[i].p);
    if (rc)
        for (size_t i = 0; i < t->nalloc; i++)
            ptrs[i] = NULL;
    free(pcs);
    return rc;
}

/* "large_segment_size_mb:N" in a setting, in bytes; 0 if absent. */
static uint64_t large_page_of(const char *setting)
{
    const char *k = strstr(setting, "large_segment_size_mb:");
    return k ? (uint64_t)strtoull(k + strlen("large_segment_size_mb:"), NULL, 10) * MIB : 0;
}

/* The model's keys are expandable_segments and large_segment_size_mb only. */
static bool model_understands(const char *setting, char *why, size_t whylen)
{
    char buf[160];
    snprintf(buf, sizeof buf, "%s", setting);
    for (char *save = NULL, *k = strtok_r(buf, ",", &save); k; k = strtok_r(NULL, ",", &save))
        if (strncmp(k, "expandable_segments:", 20) != 0 && strncmp(k, "large_segment_size_mb:", 22) != 0) {
            snprintf(why, whylen, "the model of PyTorch's expandable segments has no key '%.60s'", k);
            return false;
        }
    return true;
}

/* One replay of r's setting with capacity bytes of device memory, in this
 * process (a fresh one for tally: its options are fixed at initialisation). */
void tune_replay_one(const trace_t *t, const tune_start_t *start, uint64_t capacity, tune_row_t *r,
                     int64_t *series)
{
    bool seeded = r->from_start && start && start->known;
    size_t skip = seeded ? start->nlive : 0;
    if (r->engine == TUNE_PT_EXPAND) {
        if (!model_understands(r->setting, r->error, sizeof r->error))
            return;
        ptx_opts_t o = {capacity, large_page_of(r->setting)};
        ptx_start_t ps = {start ? start->ranges : NULL, start ? start->nranges : 0, start ? start->live : NULL,
                          start ? start->nlive : 0, skip};
        ptx_result_t res;
        double t0 = tune_now_s();
        int64_t *mapped = series ? series : malloc((t->nev ? t->nev : 1) * sizeof *mapped);
        if (!mapped) {
            snprintf(r->error, sizeof r->error, "out of memory");
            return;
        }
        int rc = ptx_replay(t, &o, seeded ? &ps : NULL, &res, mapped, r->error, sizeof r->error);
        r->reserved_end = t->nev ? mapped[t->nev - 1] : 0;
        if (mapped != series)
            free(mapped);
        if (rc)
            return;
        r->seconds = tune_now_s() - t0;
        r->oom_event = res.oom_event;
        r->peak_reserved = res.peak_reserved;
        r->num_device_alloc = res.pages_mapped;
        r->backend_calls = res.pages_mapped + res.pages_unmapped;
        r->map_runs = res.map_calls;
        r->unmap_runs = res.unmap_calls;
        r->pages_mapped = res.pages_mapped;
        r->pages_unmapped = res.pages_unmapped;
        r->ranges = res.segments;
        r->ok = true;
        return;
    }
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
    tally_stats_t st0 = {0};
    if (seeded) {
        if (start->expandable) {
            snprintf(r->error, sizeof r->error, "an expandable recording starts under PyTorch's expandable rules");
            return;
        }
        if (seed_tally(t, start, ptrs, r->error, sizeof r->error))
            return;
        tally_get_stats(0, &st0);
    }
    trace_t view = *t;
    view.ev += skip;
    view.nev -= skip;
    sampler_t s = {series, skip};
    /* The driver calls are the window's: the recorded state's were PyTorch's, before it. */
    tally_host_calls_t c0, c1;
    if (tally_host_calls(0, &c0)) {
        snprintf(r->error, sizeof r->error, "tally_host_calls: %s", tally_last_error());
        return;
    }
    double t0 = tune_now_s();
    long oom = trace_run(&view, ptrs, series ? sample : NULL, &s);
    r->oom_event = oom < 0 ? -1 : oom + (long)skip;
    r->seconds = tune_now_s() - t0;
    if (tally_host_calls(0, &c1)) {
        snprintf(r->error, sizeof r->error, "tally_host_calls: %s", tally_last_error());
        return;
    }
    r->host = trace_calls_since(&c0, &c1);
    for (size_t i = 0; series && i < skip; i++)
        series[i] = skip < t->nev ? series[skip] : 0;
    tally_stats_t st;
    if (tally_get_stats(0, &st)) {
        snprintf(r->error, sizeof r->error, "tally_get_stats: %s", tally_last_error());
        return;
    }
    r->peak_reserved = st.reserved_bytes[0].peak;
    r->reserved_end = st.reserved_bytes[0].current;
    /* The recorded state's segments were PyTorch's calls before the window, not this replay's. */
    r->num_device_alloc = st.num_device_alloc - st0.num_device_alloc;
    r->backend_calls = r->num_device_alloc + st.num_device_free - st0.num_device_free;
    r->ok = true;
}

/* The driver calls the cuda backend makes for the host backend's calls c
 * (lib/backend/cuda/vmm.c; bench/replay.c counts them the same way and
 * tests/test_backend_cuda_vmm_replay.c holds them to the calls made on every
 * shared trace), priced by the cost table as the stand-in charges them:
 * cuMemAlloc / cuMemFree per segment; cuMemAddressReserve / cuMemAddressFree
 * per range; per physical handle mapped a cuMemMap and, unless it is one a
 * move took down and maps again (reused_handles), a cuMemCreate; per map
 * call one cuMemSetAccess, charged per mapping (handle) it covers; per
 * unmap call a stream synchronise, then one cuMemUnmap per run of mapped
 * pages, charged per mapping (handle) it takes down, and a cuMemRelease per
 * handle taken down, less the reused ones. */
static double cuda_calls_us(const tally_host_calls_t *c, int column)
{
    uint64_t made = c->map_handles - c->reused_handles, gone = c->unmap_handles - c->reused_handles;
    return si_cost_us("cuMemAlloc", c->alloc, 0, column) + si_cost_us("cuMemFree", c->free, 0, column) +
           si_cost_us("cuMemAddressReserve", c->reserve, 0, column) +
           si_cost_us("cuMemAddressFree", c->unreserve, 0, column) + si_cost_us("cuMemCreate", made, 0, column) +
           si_cost_us("cuMemMap", c->map_handles, 0, column) +
           si_cost_us("cuMemSetAccess", c->map, c->map_handles, column) +
           si_cost_us("cuStreamSynchronize", c->unmap, 0, column) +
           si_cost_us("cuMemUnmap", c->unmap_runs, c->unmap_handles, column) +
           si_cost_us("cuMemRelease", gone, 0, column);
}

/* tally's rows: the calls its host backend counted. PyTorch's model rows
 * (PyTorch's ExpandableSegment): the same calls with a physical handle per
 * page, a range per pool and stream, each run unmapped in a call of its own
 * after a stream synchronise, no segment allocations and no handle reused. */
double tune_driver_us(const tune_row_t *r, int column)
{
    if (r->engine != TUNE_PT_EXPAND)
        return cuda_calls_us(&r->host, column);
    tally_host_calls_t c = {
        .reserve = (uint64_t)r->ranges,
        .map = (uint64_t)r->map_runs,
        .map_pages = (uint64_t)r->pages_mapped,
        .map_handles = (uint64_t)r->pages_mapped,
        .unmap = (uint64_t)r->unmap_runs,
        .unmap_runs = (uint64_t)r->unmap_runs,
        .unmap_pages = (uint64_t)r->pages_unmapped,
        .unmap_handles = (uint64_t)r->pages_unmapped,
    };
    return cuda_calls_us(&c, column);
}
