/* rmm-pool-model: replays traces through the model of RAPIDS RMM's
 * pool_memory_resource (tools/rmm_pool.c, whose comment gives the rules and
 * where each is read in RMM's source), to set the memory it reserves and the
 * driver calls it makes beside tally's and PyTorch's (docs/benchmarks.md).
 *
 *   rmm-pool-model TRACE.csv|DIR ...
 *
 * Two ways a user sets the pool up, on an 80 GiB device:
 *  - grown: no initial pool and no maximum, so that the pool grows as the
 *    job needs (each growth asks for at least the pool's size again);
 *  - least: the least pool, on a 2 MiB grid, that serves the whole trace
 *    when made at the start (initial_pool_size = maximum_pool_size): the
 *    pool a user who knows the job's memory gives it, RMM at its best.
 * Driver calls, grown: one cudaMalloc (cuMemAlloc) per upstream allocation,
 * refused ones included; one cudaEventRecord per deallocation; one
 * cudaStreamWaitEvent per block taken from (or list merged from) another
 * stream; one cudaEventCreate per stream. Charged from the stand-in's cost
 * table (tests/standin/cost.c), as tally's and PyTorch's are. */
#include "../tools/rmm_pool.h"
#include "../tests/standin/cost.h"

#include <stdio.h>
#include <stdlib.h>

#define MiB ((uint64_t)1 << 20)
#define CAPACITY ((uint64_t)80 << 30)

static int run(const char *path)
{
    char err[1400];
    trace_t t;
    if (trace_load(path, &t, err, sizeof err)) {
        fprintf(stderr, "rmm-pool-model: %s\n", err);
        return 1;
    }
    uint64_t peak_live = trace_peak_live(&t);
    rmm_opts_t o = {0, 0, CAPACITY};
    rmm_result_t r;
    if (rmm_replay(&t, &o, &r, NULL, err, sizeof err) || r.oom_event >= 0) {
        fprintf(stderr, "rmm-pool-model: %s: %s\n", path, r.oom_event >= 0 ? "out of memory at 80 GiB" : err);
        trace_free(&t);
        return 1;
    }
    int64_t least = rmm_least_pool(&t, 2 * MiB, CAPACITY, err, sizeof err);
    if (least <= 0) {
        fprintf(stderr, "rmm-pool-model: %s: %s\n", path, err);
        trace_free(&t);
        return 1;
    }
    double ms[SI_COST_COLUMNS];
    for (int c = 0; c < SI_COST_COLUMNS; c++)
        ms[c] = (si_cost_us("cuMemAlloc", (uint64_t)(r.upstream_allocs + r.upstream_failed), 0, c) +
                 si_cost_us("cuEventRecord", (uint64_t)r.event_records, 0, c) +
                 si_cost_us("cuStreamWaitEvent", (uint64_t)r.stream_waits, 0, c) +
                 si_cost_us("cuEventCreate", (uint64_t)r.streams, 0, c)) /
                1000;
    double pl = peak_live ? (double)peak_live : 1;
    printf("| %s | %.1f | %.1f | %.3f | %lld | %.1f | %.3f | %lld | %lld | %zu | %.1f | %.1f |\n", t.name,
           (double)peak_live / MiB, (double)r.peak_reserved / MiB, (double)r.peak_reserved / pl,
           (long long)r.upstream_allocs, (double)least / MiB, (double)least / pl, (long long)r.event_records,
           (long long)r.stream_waits, r.most_free, ms[SI_COST_A100], ms[SI_COST_BLACKWELL]);
    trace_free(&t);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: rmm-pool-model TRACE.csv|DIR ...\n");
        return 2;
    }
    printf("| trace | peak live MiB | RMM grown: reserved MiB | res/live | upstream allocations "
           "| RMM least pool MiB | least/live | events recorded | stream waits | longest free list "
           "| ms A100 | ms Blackwell |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    return trace_each_path("rmm-pool-model", argv + 1, argc - 1, run) != 0;
}
