/* pt-expand-model: replays traces through the model of PyTorch's own
 * expandable segments (tools/pt_expand.c, whose comment gives the rules;
 * tally tune uses the same model for its PyTorch rows), to set its peak
 * reserved memory and driver calls beside tally's (docs/benchmarks.md).
 *
 *   pt-expand-model TRACE.csv|DIR ...
 *
 * The device is 80 GiB; a replay there never runs out of memory, so the
 * model never unmaps and peak reserved = peak mapped. Driver calls, as
 * ExpandableSegment makes them: cuMemAddressReserve once per segment; a map
 * of n pages n cuMemCreate + n cuMemMap + one cuMemSetAccess, 2n + 1 (the
 * "map calls" column counts those runs). Pages are 2 MiB in the small pool
 * and 20 MiB in the large one, so "pages mapped" mixes the two. The last
 * two columns charge those calls from the stand-in's cost table
 * (tests/standin/cost.c), as tally's are charged (bench/driver_cost.c):
 * per page cuMemCreate + cuMemMap, per map call one cuMemSetAccess touching
 * its pages, per range cuMemAddressReserve; and per page unmapped (none in
 * these replays) one cuMemUnmap mapping and one cuMemRelease. */
#include "../tools/pt_expand.h"
#include "../tests/standin/cost.h"

#include <stdio.h>
#include <stdlib.h>

#define MiB ((uint64_t)1 << 20)

static int run(const char *path)
{
    char err[1400];
    trace_t t;
    if (trace_load(path, &t, err, sizeof err)) {
        fprintf(stderr, "pt-expand-model: %s\n", err);
        return 1;
    }
    uint64_t peak_live = trace_peak_live(&t);
    ptx_opts_t o = {(uint64_t)80 << 30, 0};
    ptx_result_t r;
    if (ptx_replay(&t, &o, NULL, &r, NULL, err, sizeof err)) {
        fprintf(stderr, "pt-expand-model: %s: %s\n", path, err);
        trace_free(&t);
        return 1;
    }
    double ms[SI_COST_COLUMNS];
    for (int c = 0; c < SI_COST_COLUMNS; c++) {
        uint64_t pages = (uint64_t)r.pages_mapped, gone = (uint64_t)r.pages_unmapped;
        ms[c] = (si_cost_us("cuMemCreate", pages, 0, c) + si_cost_us("cuMemMap", pages, 0, c) +
                 si_cost_us("cuMemSetAccess", (uint64_t)r.map_calls, pages, c) +
                 si_cost_us("cuMemAddressReserve", (uint64_t)r.segments, 0, c) +
                 si_cost_us("cuMemUnmap", (uint64_t)r.unmap_calls, gone, c) + si_cost_us("cuMemRelease", gone, 0, c)) /
                1000;
    }
    printf("| %s | %.1f | %.1f | %.3f | %lld | %lld | %lld | %lld | %.1f | %.1f |\n", t.name, (double)peak_live / MiB,
           (double)r.peak_reserved / MiB, peak_live ? (double)r.peak_reserved / (double)peak_live : 0.0,
           (long long)r.map_calls, (long long)r.pages_mapped, (long long)r.segments,
           (long long)(r.segments + 2 * r.pages_mapped + r.map_calls), ms[SI_COST_A100], ms[SI_COST_BLACKWELL]);
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
           "| ranges reserved | CUDA driver calls | ms A100 | ms Blackwell |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    return trace_each_path("pt-expand-model", argv + 1, argc - 1, run) != 0;
}
