/* tally-driver-cost: replay allocation traces through tally's cuda backend
 * on the CUDA stand-in and say what the driver calls they make would cost
 * on a real GPU (the stand-in's cost table, tests/standin/cost.c).
 *
 *   LD_LIBRARY_PATH=<build>/standin tally-driver-cost [--conf KEYS] [--table] TRACE.csv|DIR ...
 *   tally-driver-cost --cost-table     the cost table itself, as Markdown
 *
 * tally runs with backend:cuda,leak_report:off,stage_report:false, then
 * --conf, with captures announced (tally_graph_captures_announced, as
 * tally.install() does under PyTorch) unless --unannounced. The stand-in's device is sized from the traces (one and a half
 * times the largest peak live, at least 16 GiB; address space only), set
 * before tally starts the driver. Each trace is replayed once from an empty
 * cache on device 0 (stream id 0 is the default stream, NULL; every other
 * id a stream made on the stand-in, non-blocking); only the
 * replay's own calls are counted: the blocks still live after it are then
 * freed and the cache emptied, uncounted.
 *
 * One line per trace, or with --table a Markdown row:
 *   trace, peak reserved bytes, peak live bytes, backend calls (segment or
 *   page allocations + frees), then per entry point the calls (and for the
 *   per-mapping ones, the mappings touched), every driver call, and the
 *   modelled driver time in ms for each column of the cost table; without
 *   --table, then every entry point called, one "  name calls mappings" line
 *   each. */
#include "trace.h"

#include <tally.h>

#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tests/standin/cost.h"

/* The entry points reported in their own column, in this order. */
static const char *const shown[] = {"cuMemCreate", "cuMemMap",   "cuMemSetAccess",   "cuMemUnmap",
                                    "cuMemRelease", "cuMemAlloc", "cuMemFree",        "cuMemAddressReserve",
                                    "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize"};
enum { NSHOWN = sizeof shown / sizeof shown[0] };

typedef struct standin {
    unsigned long long (*calls)(const char *);
    unsigned long long (*mappings)(const char *);
    double (*driver_us)(int);
    void (*reset)(void);
    int (*write)(char *, size_t);
} standin_t;

static int standin_open(standin_t *s)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h)
        return -1;
    *(void **)&s->calls = dlsym(h, "cuda_standin_calls");
    *(void **)&s->mappings = dlsym(h, "cuda_standin_mappings");
    *(void **)&s->driver_us = dlsym(h, "cuda_standin_driver_us");
    *(void **)&s->reset = dlsym(h, "cuda_standin_counts_reset");
    *(void **)&s->write = dlsym(h, "cuda_standin_counts_write");
    return s->calls && s->mappings && s->driver_us && s->reset && s->write ? 0 : -1;
}

static int usage(void)
{
    fprintf(stderr, "usage: tally-driver-cost [--conf KEYS] [--table] [--unannounced] TRACE.csv|DIR ... | --cost-table\n");
    return 2;
}

int main(int argc, char **argv)
{
    const char *conf = NULL;
    bool table = false, announced = true;
    char **paths = NULL;
    int npaths = 0;
    char err[1024];
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--conf") == 0 && i + 1 < argc) {
            conf = argv[++i];
        } else if (strcmp(argv[i], "--table") == 0) {
            table = true;
        } else if (strcmp(argv[i], "--unannounced") == 0) {
            announced = false;
        } else if (strcmp(argv[i], "--cost-table") == 0) {
            size_t n;
            const si_cost_row_t *r = si_cost_table(&n);
            printf("| entry point | charged per | us %s | us %s | source |\n|---|---|---:|---:|---|\n",
                   si_cost_column_name(0), si_cost_column_name(1));
            for (size_t k = 0; k < n; k++)
                printf("| %s | %s | %.2f | %.2f | %s |\n", r[k].entry, r[k].law == SI_PER_MAPPING ? "mapping" : r[k].law == SI_PER_MIB ? "MiB" : "call",
                       r[k].us[0], r[k].us[1], r[k].source);
            printf("| any other entry point | call | %.2f | %.2f | assumed: context, stream and event queries |\n",
                   si_cost_other_us, si_cost_other_us);
            return 0;
        } else if (argv[i][0] == '-') {
            return usage();
        } else {
            size_t len = strlen(argv[i]);
            char **more = NULL;
            int n = len > 4 && strcmp(argv[i] + len - 4, ".csv") == 0 ? 0 : trace_dir_list(argv[i], &more, err, sizeof err);
            if (n < 0) {
                fprintf(stderr, "tally-driver-cost: %s\n", err);
                return 1;
            }
            paths = realloc(paths, (size_t)(npaths + (n ? n : 1)) * sizeof *paths);
            if (!paths)
                return 1;
            if (n == 0)
                paths[npaths++] = strdup(argv[i]);
            for (int k = 0; k < n; k++)
                paths[npaths++] = more[k];
            free(more);
        }
    }
    if (npaths == 0)
        return usage();
    /* Size the stand-in's device from the traces before the driver starts. */
    uint64_t peak = 0;
    for (int i = 0; i < npaths; i++) {
        trace_t t;
        if (trace_load(paths[i], &t, err, sizeof err)) {
            fprintf(stderr, "tally-driver-cost: %s\n", err);
            return 1;
        }
        uint64_t p = trace_peak_live(&t);
        peak = p > peak ? p : peak;
        trace_free(&t);
    }
    uint64_t gib = (peak + peak / 2 + (1ull << 30) - 1) >> 30;
    char mem[32];
    snprintf(mem, sizeof mem, "%lluG", (unsigned long long)(gib < 16 ? 16 : gib));
    setenv("CUDA_STANDIN_MEMORY", mem, 0);
    setenv("CUDA_STANDIN_DEVICES", "1", 0);
    char full[1024];
    snprintf(full, sizeof full, "backend:cuda,leak_report:off,stage_report:false%s%s", conf ? "," : "", conf ? conf : "");
    if (announced)
        tally_graph_captures_announced();
    if (tally_configure(full) != 0 || tally_init() != 0) {
        fprintf(stderr, "tally-driver-cost: %s\n", tally_last_error());
        return 1;
    }
    standin_t si;
    if (standin_open(&si)) {
        fprintf(stderr, "tally-driver-cost: the libcuda.so.1 loaded is not the CUDA stand-in (put <build>/standin first "
                        "on LD_LIBRARY_PATH)\n");
        return 1;
    }
    if (table) {
        printf("| trace | peak reserved MiB | res/live | backend calls |");
        for (int k = 0; k < NSHOWN; k++)
            printf(" %s |", shown[k]);
        printf(" all driver calls | ms %s | ms %s |\n|---|", si_cost_column_name(0), si_cost_column_name(1));
        for (int k = 0; k < NSHOWN + 6; k++)
            printf("---:|");
        printf("\n");
    }
    for (int i = 0; i < npaths; i++) {
        trace_t t;
        if (trace_load(paths[i], &t, err, sizeof err)) {
            fprintf(stderr, "tally-driver-cost: %s\n", err);
            return 1;
        }
        void **ptrs = calloc(t.nalloc ? t.nalloc : 1, sizeof *ptrs);
        if (!ptrs)
            return 1;
        tally_empty_cache(0);
        tally_reset_peak_stats(0);
        tally_reset_accumulated_stats(0);
        void *streams[64] = {0};
        for (size_t k = 0; k < t.nstreams && k < 64; k++)
            if (t.stream_ids[k] != 0 && !(streams[k] = trace_cuda_stream())) {
                fprintf(stderr, "tally-driver-cost: %s: cannot make a stream on the stand-in\n", t.name);
                return 1;
            }
        si.reset();
        long failed = -1;
        for (size_t e = 0; e < t.nev && failed < 0; e++) {
            const trace_event_t *ev = &t.ev[e];
            if (ev->op == 'a' && ev->size) {
                ptrs[ev->slot] = tally_malloc(ev->size, 0, streams[ev->stream < 64 ? ev->stream : 0]);
                if (!ptrs[ev->slot])
                    failed = (long)e;
            } else if (ev->op == 'f') {
                tally_free(ptrs[ev->slot]);
                ptrs[ev->slot] = NULL;
            }
        }
        tally_stats_t s;
        tally_get_stats(0, &s);
        unsigned long long c[NSHOWN], m[NSHOWN], all = si.calls(NULL);
        for (int k = 0; k < NSHOWN; k++) {
            c[k] = si.calls(shown[k]);
            m[k] = si.mappings(shown[k]);
        }
        double a100 = si.driver_us(SI_COST_A100) / 1000, bw = si.driver_us(SI_COST_BLACKWELL) / 1000;
        if (failed >= 0)
            fprintf(stderr, "tally-driver-cost: %s: allocation %ld refused: %s\n", t.name, failed, tally_last_error());
        if (tally_check() != 0) {
            fprintf(stderr, "tally-driver-cost: %s: tally_check: %s\n", t.name, tally_last_error());
            return 1;
        }
        uint64_t live = trace_peak_live(&t);
        long long backend = (long long)(s.num_device_alloc + s.num_device_free);
        if (table) {
            printf("| %s | %.1f | %.4f | %lld |", t.name, s.reserved_bytes[TALLY_POOL_ALL].peak / 1048576.0,
                   live ? (double)s.reserved_bytes[TALLY_POOL_ALL].peak / (double)live : 0, backend);
            for (int k = 0; k < NSHOWN; k++) {
                const si_cost_row_t *r = si_cost_row(shown[k]);
                if (r && r->law == SI_PER_MAPPING)
                    printf(" %llu (%llu) |", c[k], m[k]);
                else
                    printf(" %llu |", c[k]);
            }
            printf(" %llu | %.1f | %.1f |\n", all, a100, bw);
        } else {
            printf("%s peak_reserved %lld peak_live %llu backend_calls %lld", t.name,
                   (long long)s.reserved_bytes[TALLY_POOL_ALL].peak, (unsigned long long)live, backend);
            for (int k = 0; k < NSHOWN; k++)
                printf(" %s %llu/%llu", shown[k], c[k], m[k]);
            printf(" driver_calls %llu ms_a100 %.3f ms_blackwell %.3f%s\n", all, a100, bw, failed >= 0 ? " FAILED" : "");
            char every[4096];
            if (si.write(every, sizeof every) > 0)
                for (char *line = strtok(every, "\n"); line; line = strtok(NULL, "\n"))
                    printf("  %s\n", line);
        }
        for (size_t k = 0; k < t.nalloc; k++)
            tally_free(ptrs[k]);
        free(ptrs);
        trace_free(&t);
        if (failed >= 0)
            return 1;
    }
    tally_empty_cache(0);
    for (int i = 0; i < npaths; i++)
        free(paths[i]);
    free(paths);
    return 0;
}
