/* The batches of PyTorch's pair benchmarks: see pair_sets.h. Patterns:
 *   loguniform  log-uniform in [1 B, 192 KiB]: half the sizes are under 600 B
 *   mix16       a fixed mix of 16 sizes from 4 B to 192 KiB, drawn with
 *               weights so most are 512 B to 64 KiB (tensor-sized requests)
 *   mix512-64k  the same kind of mix with every size from 512 B to 64 KiB: the
 *               pattern issue 21's goal (at most 2x mimalloc) is stated on
 *   small4k     log-uniform in [1 B, 4 KiB] */
#include "pair_sets.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

size_t pair_sizes[PAIR_NSETS][PAIR_BATCH];
uint8_t pair_order[PAIR_NSETS][PAIR_BATCH];

const char *const pair_patterns[4] = {"loguniform", "mix16", "mix512-64k", "small4k"};

static uint64_t rng;

static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
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

int pair_pattern_known(const char *name)
{
    for (size_t k = 0; k < sizeof pair_patterns / sizeof pair_patterns[0]; k++)
        if (!strcmp(name, pair_patterns[k]))
            return 1;
    return 0;
}

void pair_make_sets(const char *pattern)
{
    rng = 0x9e3779b97f4a7c15ull;
    for (int s = 0; s < PAIR_NSETS; s++) {
        for (int i = 0; i < PAIR_BATCH; i++) {
            double u = (double)(next_rand() >> 11) / 9007199254740992.0;
            if (!strcmp(pattern, "loguniform"))
                pair_sizes[s][i] = (size_t)exp(u * log(192.0 * 1024));
            else if (!strcmp(pattern, "small4k"))
                pair_sizes[s][i] = (size_t)exp(u * log(4096.0));
            else if (!strcmp(pattern, "mix16"))
                pair_sizes[s][i] = from_mix(mix16_sizes, mix16_weights);
            else
                pair_sizes[s][i] = from_mix(mix64k_sizes, mix64k_weights);
            pair_order[s][i] = (uint8_t)i;
        }
        for (int i = PAIR_BATCH - 1; i > 0; i--) {
            int j = (int)(next_rand() % (uint64_t)(i + 1));
            uint8_t t = pair_order[s][i];
            pair_order[s][i] = pair_order[s][j];
            pair_order[s][j] = t;
        }
    }
}

int pair_option(int argc, char **argv, int *i, pair_opts_t *o)
{
    if (*i + 1 >= argc)
        return 0;
    const char *name = argv[*i], *value = argv[*i + 1];
    if (!strcmp(name, "--reps"))
        o->reps = atoi(value);
    else if (!strcmp(name, "--batches"))
        o->batches = atol(value);
    else if (!strcmp(name, "--conf"))
        o->conf = value;
    else if (!strcmp(name, "--pattern"))
        o->pattern = value;
    else
        return 0;
    (*i)++;
    return 1;
}

void pair_run_malloc(long batches)
{
    static void *sink[PAIR_BATCH];
    for (long k = 0; k < batches; k++) {
        int set = (int)(k % PAIR_NSETS);
        for (int i = 0; i < PAIR_BATCH; i++)
            sink[i] = malloc(pair_sizes[set][i]);
        for (int i = 0; i < PAIR_BATCH; i++)
            free(sink[pair_order[set][i]]);
    }
}

double pair_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

void pair_sort(double *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp);
}
