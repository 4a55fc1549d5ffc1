/* torchpath-mimalloc: PyTorch's entry points (tally_torch_alloc /
 * tally_torch_free, with size, device and stream passed as PyTorch passes
 * them) against mimalloc's malloc / free, same process, same sizes, on
 * batches: 64 allocations, then frees in a scattered order, repeated over
 * 256 fixed batches.
 *
 *   torchpath-mimalloc [--reps N] [--batches N] [--conf KEYS] [--pattern NAME]
 *
 * Patterns (pair_sets.c: sizes from a fixed seed; each batch's free order a
 * fixed permutation), every one printed unless --pattern names one:
 * loguniform, mix16, mix512-64k (the pattern issue 21's goal, at most 2x
 * mimalloc, is stated on), small4k.
 * A warm-up pass first (tally serves from its cache). Each repetition times
 * --batches batches with the thread's CPU clock, mimalloc then tally; the
 * median over repetitions of CPU ns per allocate+free pair is printed, with
 * the ratio. tally's configuration: the host backend, leak and stage reports
 * off, then --conf (e.g. ledger:false). Output, one line per pattern:
 *   T pattern <name> mimalloc <ns> tally_torch <ns> ratio <r> */
#include <tally.h>

#include "pair_sets.h"

#include <dlfcn.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *sink[PAIR_BATCH];

static void run_torch(long batches)
{
    void *stream = NULL; /* the default stream, as PyTorch passes it */
    for (long k = 0; k < batches; k++) {
        int set = (int)(k % PAIR_NSETS);
        for (int i = 0; i < PAIR_BATCH; i++)
            sink[i] = tally_torch_alloc(pair_sizes[set][i], 0, stream);
        for (int i = 0; i < PAIR_BATCH; i++) {
            int j = pair_order[set][i];
            tally_torch_free(sink[j], pair_sizes[set][j], 0, stream);
        }
    }
}

int main(int argc, char **argv)
{
    pair_opts_t o = {15, 2000, NULL, NULL};
    for (int i = 1; i < argc; i++) {
        if (!pair_option(argc, argv, &i, &o)) {
            fprintf(stderr, "usage: torchpath-mimalloc [--reps N] [--batches N] [--conf KEYS] [--pattern NAME]\n");
            return 2;
        }
    }
    int reps = o.reps;
    long batches = o.batches;
    const char *conf = o.conf, *only = o.pattern;
    if (only && !pair_pattern_known(only)) {
        fprintf(stderr, "torchpath: unknown pattern '%s' (loguniform, mix16, mix512-64k, small4k)\n", only);
        return 2;
    }
    if (reps < 1 || reps > 101 || batches < 1)
        return 2;
    Dl_info info;
    if (!dladdr((void *)(uintptr_t)malloc, &info) || !info.dli_fname || !strstr(info.dli_fname, "mimalloc")) {
        fprintf(stderr, "torchpath: malloc does not come from mimalloc (%s)\n", info.dli_fname ? info.dli_fname : "?");
        return 1;
    }
    if (tally_configure("backend:host,host_mode:virtual,host_capacity:80GiB,leak_report:off,stage_report:false") ||
        (conf && tally_configure(conf)) || tally_init()) {
        fprintf(stderr, "torchpath: %s\n", tally_last_error());
        return 1;
    }
    double *m = calloc((size_t)reps, sizeof *m), *t = calloc((size_t)reps, sizeof *t);
    if (!m || !t)
        return 1;
    for (size_t p = 0; p < sizeof pair_patterns / sizeof pair_patterns[0]; p++) {
        if (only && strcmp(only, pair_patterns[p]))
            continue;
        pair_make_sets(pair_patterns[p]);
        pair_run_malloc(PAIR_NSETS);
        run_torch(PAIR_NSETS);
        double pairs = (double)batches * PAIR_BATCH;
        for (int r = 0; r < reps; r++) {
            double t0 = pair_cpu_ns();
            pair_run_malloc(batches);
            double t1 = pair_cpu_ns();
            run_torch(batches);
            double t2 = pair_cpu_ns();
            m[r] = (t1 - t0) / pairs;
            t[r] = (t2 - t1) / pairs;
        }
        pair_sort(m, (size_t)reps);
        pair_sort(t, (size_t)reps);
        printf("T pattern %s mimalloc %.1f tally_torch %.1f ratio %.2f\n", pair_patterns[p], m[reps / 2], t[reps / 2],
               t[reps / 2] / m[reps / 2]);
        fflush(stdout);
    }
    free(m);
    free(t);
    return 0;
}
