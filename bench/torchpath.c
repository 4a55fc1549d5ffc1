/* torchpath-mimalloc: PyTorch's entry points (tally_torch_alloc /
 * tally_torch_free, with size, device and stream passed as PyTorch passes
 * them) against mimalloc's malloc / free, same process, same sizes, on a
 * batch pattern: 64 allocations of mixed sizes up to 192 KiB, then frees in
 * a scattered order, repeated.
 *
 *   torchpath-mimalloc [--reps N] [--batches N]
 *
 * Sizes: log-uniform in [1 B, 192 KiB] from a fixed seed; the free order of
 * each batch is a fixed permutation. A warm-up pass first (tally serves from
 * its cache). Each repetition times --batches batches with the thread's CPU
 * clock, mimalloc then tally; the median over repetitions of CPU ns per
 * allocate+free pair is printed, with the ratio. Output:
 *   T pattern batch64 mimalloc <ns> tally_torch <ns> ratio <r> */
#include <tally.h>

#include <dlfcn.h>

#include <math.h>
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

int main(int argc, char **argv)
{
    int reps = 15;
    long batches = 2000;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batches") && i + 1 < argc)
            batches = atol(argv[++i]);
        else {
            fprintf(stderr, "usage: torchpath-mimalloc [--reps N] [--batches N]\n");
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
        tally_init()) {
        fprintf(stderr, "torchpath: %s\n", tally_last_error());
        return 1;
    }
    const double top = log(192.0 * 1024);
    for (int s = 0; s < NSETS; s++) {
        for (int i = 0; i < BATCH; i++) {
            double u = (double)(next_rand() >> 11) / 9007199254740992.0;
            sizes[s][i] = (size_t)exp(u * top);
            order[s][i] = (uint8_t)i;
        }
        for (int i = BATCH - 1; i > 0; i--) {
            int j = (int)(next_rand() % (uint64_t)(i + 1));
            uint8_t t = order[s][i];
            order[s][i] = order[s][j];
            order[s][j] = t;
        }
    }
    run_malloc(NSETS);
    run_torch(NSETS);
    double *m = calloc((size_t)reps, sizeof *m), *t = calloc((size_t)reps, sizeof *t);
    if (!m || !t)
        return 1;
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
    printf("T pattern batch64 mimalloc %.1f tally_torch %.1f ratio %.2f\n", m[reps / 2], t[reps / 2],
           t[reps / 2] / m[reps / 2]);
    free(m);
    free(t);
    return 0;
}
