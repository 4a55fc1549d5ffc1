/* torchpath-mimalloc: PyTorch's entry points (tally_torch_alloc /
 * tally_torch_free, with size, device and stream passed as PyTorch passes
 * them) against mimalloc's malloc / free, same process, same sizes, on
 * batches: 64 allocations, then frees in a scattered order, repeated over
 * 256 fixed batches.
 *
 *   torchpath-mimalloc [--reps N] [--batches N] [--conf KEYS] [--pattern NAME]
 *
 * Patterns (sizes from a fixed seed; each batch's free order a fixed
 * permutation), every one printed unless --pattern names one:
 *   loguniform  log-uniform in [1 B, 192 KiB]: half the sizes are under 600 B
 *   mix16       a fixed mix of 16 sizes from 4 B to 192 KiB, drawn with
 *               weights so most are 512 B to 64 KiB (tensor-sized requests)
 *   mix512-64k  the same kind of mix with every size from 512 B to 64 KiB: the
 *               pattern issue 21's goal (at most 2x mimalloc) is stated on
 *   small4k     log-uniform in [1 B, 4 KiB]
 * A warm-up pass first (tally serves from its cache). Each repetition times
 * --batches batches with the thread's CPU clock, mimalloc then tally; the
 * median over repetitions of CPU ns per allocate+free pair is printed, with
 * the ratio. tally's configuration: the host backend, leak and stage reports
 * off, then --conf (e.g. ledger:false). Output, one line per pattern:
 *   T pattern <name> mimalloc <ns> tally_torch <ns> ratio <r> */
#include <tally.h>

#include <dlfcn.h>

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BATCH 64
#define NSETS 256 /* distinct batches of sizes and free orders */

static size_t sizes[NSETS][BATCH];
static uint8_t order[NSETS][BATCH];

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static double cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static void *sink[BATCH];

static void run_malloc(long batches)
{
    for (long k = 0; k < batches; k++) {
        int set = (int)(k % NSETS);
        for (int i = 0; i < BATCH; i++)
            sink[i] = malloc(sizes[set][i]);
        for (int i = 0; i < BATCH; i++)
            free(sink[order[set][i]]);
    }
}

static void run_torch(long batches)
{
    void *stream = NULL; /* the default stream, as PyTorch passes it */
    for (long k = 0; k < batches; k++) {
        int set = (int)(k % NSETS);
        for (int i = 0; i < BATCH; i++)
            sink[i] = tally_torch_alloc(sizes[set][i], 0, stream);
        for (int i = 0; i < BATCH; i++) {
            int j = order[set][i];
            tally_torch_free(sink[j], sizes[set][j], 0, stream);
        }
    }
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The 16-size mixes: sizes and weights (out of 100). */
static const size_t mix16_sizes[16] = {4,     64,    512,   768,   1024,  2048,  3072,  4096,
                                       8192,  12288, 16384, 24576, 32768, 49152, 65536, 196608};
static const int mix16_weights[16] = {3, 3, 8, 6, 8, 8, 6, 8, 8, 6, 8, 6, 8, 5, 6, 3};
static const size_t mix64k_sizes[16] = {512,  768,   1024,  1536,  2048,  3072,  4096,  6144,
                                        8192, 12288, 16384, 24576, 32768, 40960, 49152, 65536};
static const int mix64k_weights[16] = {8, 6, 8, 5, 8, 6, 8, 5, 8, 6, 8, 6, 6, 4, 4, 4};

static size_t from_mix(const size_t *sz, const int *w)
{
    int r = (int)(next_rand() % 100);
    for (int k = 0; k < 16; k++) {
        if (r < w[k])
            return sz[k];
        r -= w[k];
    }
    return sz[15];
}

static void make_sets(const char *pattern)
{
    rng = 0x9e3779b97f4a7c15ull;
    for (int s = 0; s < NSETS; s++) {
        for (int i = 0; i < BATCH; i++) {
            double u = (double)(next_rand() >> 11) / 9007199254740992.0;
            if (!strcmp(pattern, "loguniform"))
                sizes[s][i] = (size_t)exp(u * log(192.0 * 1024));
            else if (!strcmp(pattern, "small4k"))
                sizes[s][i] = (size_t)exp(u * log(4096.0));
            else if (!strcmp(pattern, "mix16"))
                sizes[s][i] = from_mix(mix16_sizes, mix16_weights);
            else
                sizes[s][i] = from_mix(mix64k_sizes, mix64k_weights);
            order[s][i] = (uint8_t)i;
        }
        for (int i = BATCH - 1; i > 0; i--) {
            int j = (int)(next_rand() % (uint64_t)(i + 1));
            uint8_t t = order[s][i];
            order[s][i] = order[s][j];
            order[s][j] = t;
        }
    }
}

static const char *const patterns[] = {"loguniform", "mix16", "mix512-64k", "small4k"};

int main(int argc, char **argv)
{
    int reps = 15;
    long batches = 2000;
    const char *conf = NULL, *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batches") && i + 1 < argc)
            batches = atol(argv[++i]);
        else if (!strcmp(argv[i], "--conf") && i + 1 < argc)
            conf = argv[++i];
        else if (!strcmp(argv[i], "--pattern") && i + 1 < argc)
            only = argv[++i];
        else {
            fprintf(stderr, "usage: torchpath-mimalloc [--reps N] [--batches N] [--conf KEYS] [--pattern NAME]\n");
            return 2;
        }
    }
    if (only) {
        bool known = false;
        for (size_t k = 0; k < sizeof patterns / sizeof patterns[0]; k++)
            known |= !strcmp(only, patterns[k]);
        if (!known) {
            fprintf(stderr, "torchpath: unknown pattern '%s' (loguniform, mix16, mix512-64k, small4k)\n", only);
            return 2;
        }
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
    for (size_t p = 0; p < sizeof patterns / sizeof patterns[0]; p++) {
        if (only && strcmp(only, patterns[p]))
            continue;
        make_sets(patterns[p]);
        run_malloc(NSETS);
        run_torch(NSETS);
        double pairs = (double)batches * BATCH;
        for (int r = 0; r < reps; r++) {
            double t0 = cpu_ns();
            run_malloc(batches);
            double t1 = cpu_ns();
            run_torch(batches);
            double t2 = cpu_ns();
            m[r] = (t1 - t0) / pairs;
            t[r] = (t2 - t1) / pairs;
        }
        qsort(m, (size_t)reps, sizeof *m, cmp);
        qsort(t, (size_t)reps, sizeof *t, cmp);
        printf("T pattern %s mimalloc %.1f tally_torch %.1f ratio %.2f\n", patterns[p], m[reps / 2], t[reps / 2],
               t[reps / 2] / m[reps / 2]);
        fflush(stdout);
    }
    free(m);
    free(t);
    return 0;
}
