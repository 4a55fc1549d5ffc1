/* The batches of PyTorch's pair benchmarks (torchpath.c, pair_ab.c): 256
 * fixed batches of 64 request sizes, each with a fixed free order, drawn
 * from one of four size patterns with a fixed seed, so every program and
 * every build sees the same requests in the same order. */
#ifndef BENCH_PAIR_SETS_H
#define BENCH_PAIR_SETS_H

#include <stddef.h>
#include <stdint.h>

#define PAIR_BATCH 64
#define PAIR_NSETS 256 /* distinct batches of sizes and free orders */

extern size_t pair_sizes[PAIR_NSETS][PAIR_BATCH];
extern uint8_t pair_order[PAIR_NSETS][PAIR_BATCH];

/* The pattern names, in the order the benchmarks print them. */
extern const char *const pair_patterns[4];
/* 1 when name is one of them. */
int pair_pattern_known(const char *name);
/* Fill the batches for a pattern (one of pair_patterns). */
void pair_make_sets(const char *pattern);
/* The options both benchmarks take: --reps N, --batches N, --conf KEYS,
 * --pattern NAME. pair_option reads argv[*i] (and its value, advancing *i)
 * when it is one of them and returns 1; else 0. */
typedef struct pair_opts {
    int reps;
    long batches;
    const char *conf, *pattern;
} pair_opts_t;
int pair_option(int argc, char **argv, int *i, pair_opts_t *o);
/* batches batches (cycling through the sets) of malloc then free: the
 * process's malloc, mimalloc in both benchmarks. */
void pair_run_malloc(long batches);
/* The calling thread's CPU time, ns. */
double pair_cpu_ns(void);
/* Sort n doubles (for medians and quartiles). */
void pair_sort(double *v, size_t n);

#endif
