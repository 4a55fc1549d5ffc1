/* pair-ab: two or more builds of libtally.so on PyTorch's pair, in one
 * process, to tell a change's effect from the machine's noise.
 *
 *   pair-ab [--reps N] [--batches N] [--pattern NAME] [--conf KEYS] LIB.so LIB.so [LIB.so ...]
 *
 * Each library is opened with dlopen (RTLD_LOCAL: its own globals, its own
 * cache) and configured as torchpath configures tally (the host backend, leak
 * and stage reports off, then --conf); tally_torch_alloc and tally_torch_free
 * are called through pointers, as PyTorch calls a pluggable allocator. The
 * batches are torchpath's (pair_sets.c; --pattern, mix512-64k by default).
 * Each repetition times --batches batches (1000) of mimalloc's malloc/free,
 * then of every library, starting with a different library each time (so no
 * library always runs first); the time of each is divided by mimalloc's in
 * the same repetition, and by the first library's. Printed per library, over
 * the repetitions (41): the median ratio to mimalloc, and the median and
 * quartiles of the ratio to the first library:
 *   AB <path> mimalloc <ratio> first <median> q1 <q1> q3 <q3>
 * A change is measured by its ratio to the first library: the two builds
 * share every moment of the machine, so slow spells cancel out.
 *
 * Each library is opened from a fresh copy in memory (memfd_create), not
 * from its file: the same bytes opened from two files once ran 19% apart,
 * run after run, where fresh copies of one library run within 2% of each
 * other (docs/benchmarks.md, run AB): where the page cache held a file's
 * pages followed it into every run. A copy each time makes that a run's
 * chance, which another run does not repeat; and the same library may be
 * named twice, which gives the noise floor. */
#include "pair_sets.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXLIBS 8

typedef void *(*alloc_fn)(size_t, int, void *);
typedef void (*free_fn)(void *, size_t, int, void *);

static void *sink[PAIR_BATCH];

static void run_lib(alloc_fn a, free_fn f, long batches)
{
    for (long k = 0; k < batches; k++) {
        int set = (int)(k % PAIR_NSETS);
        for (int i = 0; i < PAIR_BATCH; i++)
            sink[i] = a(pair_sizes[set][i], 0, NULL);
        for (int i = 0; i < PAIR_BATCH; i++) {
            int j = pair_order[set][i];
            f(sink[j], pair_sizes[set][j], 0, NULL);
        }
    }
}

/* A copy of path in fresh memory, as a path dlopen takes (its descriptor
 * stays open for the process); -1 with the reason said. */
static int fresh_copy(const char *path, char *out, size_t outlen)
{
    int in = open(path, O_RDONLY | O_CLOEXEC);
    if (in < 0) {
        fprintf(stderr, "pair-ab: %s: %s\n", path, strerror(errno));
        return -1;
    }
    int fd = memfd_create("pair-ab-lib", 0);
    if (fd < 0) {
        fprintf(stderr, "pair-ab: memfd_create: %s\n", strerror(errno));
        close(in);
        return -1;
    }
    char buf[1 << 16];
    ssize_t got;
    while ((got = read(in, buf, sizeof buf)) > 0) {
        for (ssize_t off = 0; off < got;) {
            ssize_t put = write(fd, buf + off, (size_t)(got - off));
            if (put < 0) {
                fprintf(stderr, "pair-ab: copying %s: %s\n", path, strerror(errno));
                close(in);
                close(fd);
                return -1;
            }
            off += put;
        }
    }
    close(in);
    if (got < 0) {
        fprintf(stderr, "pair-ab: reading %s: %s\n", path, strerror(errno));
        close(fd);
        return -1;
    }
    snprintf(out, outlen, "/proc/self/fd/%d", fd);
    return 0;
}

static int open_lib(const char *path, const char *conf, alloc_fn *a, free_fn *f)
{
    char copy[64];
    if (fresh_copy(path, copy, sizeof copy))
        return -1;
    void *h = dlopen(copy, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "pair-ab: %s: %s\n", path, dlerror());
        return -1;
    }
    /* dlsym gives object pointers; copied into function pointers. */
    void *sym[5] = {dlsym(h, "tally_configure"), dlsym(h, "tally_init"), dlsym(h, "tally_last_error"),
                    dlsym(h, "tally_torch_alloc"), dlsym(h, "tally_torch_free")};
    int (*configure)(const char *);
    int (*init)(void);
    const char *(*last_error)(void);
    memcpy(&configure, &sym[0], sizeof configure);
    memcpy(&init, &sym[1], sizeof init);
    memcpy(&last_error, &sym[2], sizeof last_error);
    memcpy(a, &sym[3], sizeof *a);
    memcpy(f, &sym[4], sizeof *f);
    if (!sym[0] || !sym[1] || !sym[2] || !sym[3] || !sym[4]) {
        fprintf(stderr, "pair-ab: %s: not a libtally.so (a tally_* entry point is missing)\n", path);
        return -1;
    }
    if (configure("backend:host,host_mode:virtual,host_capacity:80GiB,leak_report:off,stage_report:false") ||
        (conf && configure(conf)) || init()) {
        fprintf(stderr, "pair-ab: %s: %s\n", path, last_error());
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    pair_opts_t o = {41, 1000, NULL, "mix512-64k"};
    const char *libs[MAXLIBS];
    int n = 0;
    for (int i = 1; i < argc && n >= 0; i++) {
        if (pair_option(argc, argv, &i, &o))
            continue;
        if (argv[i][0] != '-' && n < MAXLIBS)
            libs[n++] = argv[i];
        else
            n = -1;
    }
    int reps = o.reps;
    long batches = o.batches;
    const char *pattern = o.pattern, *conf = o.conf;
    if (n < 2 || reps < 3 || reps > 1001 || batches < 1 || !pair_pattern_known(pattern)) {
        fprintf(stderr, "usage: pair-ab [--reps N (3..1001)] [--batches N] [--pattern loguniform|mix16|mix512-64k|small4k]\n"
                        "               [--conf KEYS] LIB.so LIB.so [... up to %d]\n",
                MAXLIBS);
        return 2;
    }
    alloc_fn A[MAXLIBS];
    free_fn F[MAXLIBS];
    for (int i = 0; i < n; i++)
        if (open_lib(libs[i], conf, &A[i], &F[i]))
            return 1;
    pair_make_sets(pattern);
    pair_run_malloc(PAIR_NSETS); /* warm-up: every cache holds the pattern's blocks */
    for (int i = 0; i < n; i++)
        run_lib(A[i], F[i], PAIR_NSETS);
    double *ns = calloc((size_t)reps * (size_t)(n + 1), sizeof *ns), *v = calloc((size_t)reps, sizeof *v);
    if (!ns || !v)
        return 1;
    double pairs = (double)batches * PAIR_BATCH;
    for (int r = 0; r < reps; r++) {
        double *row = ns + (size_t)r * (size_t)(n + 1);
        double t0 = pair_cpu_ns();
        pair_run_malloc(batches);
        row[n] = (pair_cpu_ns() - t0) / pairs;
        for (int k = 0; k < n; k++) {
            int i = (k + r) % n;
            double t = pair_cpu_ns();
            run_lib(A[i], F[i], batches);
            row[i] = (pair_cpu_ns() - t) / pairs;
        }
    }
    for (int i = 0; i < n; i++) {
        for (int r = 0; r < reps; r++)
            v[r] = ns[(size_t)r * (size_t)(n + 1) + (size_t)i] / ns[(size_t)r * (size_t)(n + 1) + (size_t)n];
        pair_sort(v, (size_t)reps);
        double to_malloc = v[reps / 2];
        for (int r = 0; r < reps; r++)
            v[r] = ns[(size_t)r * (size_t)(n + 1) + (size_t)i] / ns[(size_t)r * (size_t)(n + 1)];
        pair_sort(v, (size_t)reps);
        printf("AB %s mimalloc %.3f first %.4f q1 %.4f q3 %.4f\n", libs[i], to_malloc, v[reps / 2], v[reps / 4],
               v[3 * reps / 4]);
    }
    free(ns);
    free(v);
    return 0;
}
