/* Sleep and wake of a private tag (docs/sleep.md, issue 24): how long they
 * take and which driver calls they make.
 *
 *   tally-sleep-bench host GIB [BLOCK_MIB]
 *       on the host backend (backed: real memory, real copies): GIB of
 *       blocks of BLOCK_MIB (default 64) under a private tag, written once;
 *       wall time of a sleep with offload, its wake (restore checked), a
 *       sleep with discard and its wake.
 *   LD_LIBRARY_PATH=<build>/standin tally-sleep-bench cuda GIB [BLOCK_MIB]
 *       on backend:cuda against the CUDA stand-in (CUDA_STANDIN_MEMORY must
 *       hold GIB): the driver calls of a sleep and a wake, and their
 *       modelled time from the stand-in's cost table (tests/standin/cost.c,
 *       A100 and Blackwell columns). The sleep runs with discard (the
 *       stand-in would copy real bytes); the copies and pinned memory of an
 *       offload are added from the table's per-MiB rows, since they are the
 *       live bytes exactly: the first cycle pins, later cycles reuse the
 *       buffers kept pinned (sleep_pinned_cache) and only copy. Beside it, vLLM's CuMemAllocator modelled on the
 *       same table: one cuMemCreate + cuMemMap + cuMemSetAccess per
 *       allocation kept as a handle, so a sleep is cuMemUnmap + cuMemRelease
 *       per allocation (plus the copies) and a wake cuMemCreate + cuMemMap +
 *       cuMemSetAccess per allocation (plus the copies; its pinned CPU
 *       tensors taken as cached by PyTorch's pinned-memory allocator after
 *       the first cycle, as tally's are).
 * One line per run, "key=value" pairs (bench/run.sh tabulates them). */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../tests/standin/cost.h"
#include "tally.h"

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static const char *TAG[] = {"bench-weights"};

static void die(const char *what)
{
    fprintf(stderr, "tally-sleep-bench: %s: %s\n", what, tally_last_error());
    exit(1);
}

typedef unsigned long long (*calls_fn)(const char *);
typedef double (*us_fn)(int);
typedef void (*reset_fn)(void);

static const char *const ENTRIES[] = {"cuMemCreate", "cuMemMap", "cuMemRelease", "cuMemSetAccess", "cuMemUnmap",
                                      "cuCtxSynchronize", "cuStreamSynchronize", "cuMemcpyDtoH", "cuMemcpyHtoD"};
#define NENTRIES (sizeof ENTRIES / sizeof ENTRIES[0])

int main(int argc, char **argv)
{
    if (argc < 3 || (strcmp(argv[1], "host") && strcmp(argv[1], "cuda"))) {
        fprintf(stderr, "usage: tally-sleep-bench host|cuda GIB [BLOCK_MIB]\n");
        return 2;
    }
    bool cuda = strcmp(argv[1], "cuda") == 0;
    double gib = atof(argv[2]);
    size_t block = (size_t)(argc > 3 ? atoi(argv[3]) : 64) << 20;
    size_t total = (size_t)(gib * (double)(1ull << 30));
    size_t n = total / block;
    char conf[256];
    if (cuda)
        snprintf(conf, sizeof conf, "backend:cuda,private_tags:%s,leak_report:off", TAG[0]);
    else
        snprintf(conf, sizeof conf, "backend:host,host_mode:backed,host_capacity:%zuGiB,private_tags:%s,leak_report:off",
                 (size_t)gib * 2 + 2, TAG[0]);
    if (tally_configure(conf) || tally_init())
        die("init");
    void **blocks = calloc(n, sizeof *blocks);
    if (tally_tag_push(TAG[0]))
        die("tag");
    for (size_t i = 0; i < n; i++)
        if (!(blocks[i] = tally_malloc(block, 0, NULL)))
            die("malloc");
    tally_tag_pop();
    if (!cuda) {
        for (size_t i = 0; i < n; i++)
            memset(blocks[i], (int)(i * 7 + 1), block);
        double t0 = now_ms();
        if (tally_sleep(TAG, 1, TALLY_SLEEP_OFFLOAD))
            die("sleep offload");
        double t1 = now_ms();
        if (tally_wake(TAG, 1))
            die("wake");
        double t2 = now_ms();
        for (size_t i = 0; i < n; i++)
            if (((unsigned char *)blocks[i])[block - 1] != (unsigned char)(i * 7 + 1))
                die("restore differs");
        /* A second cycle reuses the buffers kept pinned (sleep_pinned_cache). */
        double u0 = now_ms();
        if (tally_sleep(TAG, 1, TALLY_SLEEP_OFFLOAD) || tally_wake(TAG, 1))
            die("second cycle");
        double u1 = now_ms();
        tally_empty_cache(0);
        double t3 = now_ms();
        if (tally_sleep(TAG, 1, TALLY_SLEEP_DISCARD))
            die("sleep discard");
        double t4 = now_ms();
        if (tally_wake(TAG, 1))
            die("wake");
        double t5 = now_ms();
        printf("backend=host gib=%.0f blocks=%zu block_mib=%zu sleep_offload_ms=%.1f wake_restore_ms=%.1f "
               "second_cycle_ms=%.1f sleep_discard_ms=%.1f wake_empty_ms=%.1f offload_gb_s=%.2f\n",
               gib, n, block >> 20, t1 - t0, t2 - t1, u1 - u0, t4 - t3, t5 - t4,
               (double)total / 1e9 / ((t1 - t0) / 1e3));
        return 0;
    }
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    calls_fn calls = NULL;
    us_fn driver_us = NULL;
    if (h) {
        *(void **)&calls = dlsym(h, "cuda_standin_calls");
        *(void **)&driver_us = dlsym(h, "cuda_standin_driver_us");
    }
    if (!calls || !driver_us) {
        fprintf(stderr, "tally-sleep-bench: cuda needs the CUDA stand-in first on LD_LIBRARY_PATH\n");
        return 1;
    }
    unsigned long long c0[NENTRIES], c1[NENTRIES], c2[NENTRIES];
    double us0[SI_COST_COLUMNS], us1[SI_COST_COLUMNS], us2[SI_COST_COLUMNS];
    for (size_t k = 0; k < NENTRIES; k++)
        c0[k] = calls(ENTRIES[k]);
    for (int c = 0; c < SI_COST_COLUMNS; c++)
        us0[c] = driver_us(c);
    double t0 = now_ms();
    if (tally_sleep(TAG, 1, TALLY_SLEEP_DISCARD))
        die("sleep");
    double t1 = now_ms();
    for (size_t k = 0; k < NENTRIES; k++)
        c1[k] = calls(ENTRIES[k]);
    for (int c = 0; c < SI_COST_COLUMNS; c++)
        us1[c] = driver_us(c);
    if (tally_wake(TAG, 1))
        die("wake");
    double t2 = now_ms();
    for (size_t k = 0; k < NENTRIES; k++)
        c2[k] = calls(ENTRIES[k]);
    for (int c = 0; c < SI_COST_COLUMNS; c++)
        us2[c] = driver_us(c);
    uint64_t mib = (uint64_t)n * (block >> 20);
    for (int c = 0; c < SI_COST_COLUMNS; c++) {
        /* Offload adds its copies and pinned memory: the live bytes. */
        /* First cycle: pin, copy out; copy back (the buffers stay pinned,
         * sleep_pinned_cache). Later cycles copy only. */
        double off_sleep = si_cost_us("cuMemHostAlloc", n, mib, c) + si_cost_us("cuMemcpyDtoH", n, mib, c);
        double off_next = si_cost_us("cuMemcpyDtoH", n, mib, c);
        double off_wake = si_cost_us("cuMemcpyHtoD", n, mib, c);
        double sleep_ms = (us1[c] - us0[c]) / 1e3, wake_ms = (us2[c] - us1[c]) / 1e3;
        /* vLLM: a handle per allocation, released at sleep, created at wake;
         * torch.cuda.synchronize() once per sleep (its free callback). */
        double v_sleep = (si_cost_us("cuMemUnmap", n, n, c) + si_cost_us("cuMemRelease", n, n, c) +
                          si_cost_us("cuCtxSynchronize", 1, 0, c)) / 1e3;
        double v_wake = (si_cost_us("cuMemCreate", n, n, c) + si_cost_us("cuMemMap", n, n, c) +
                         si_cost_us("cuMemSetAccess", n, n, c)) / 1e3;
        printf("backend=cuda-standin column=%s gib=%.0f blocks=%zu block_mib=%zu tally_sleep_discard_ms=%.1f "
               "tally_wake_discard_ms=%.1f tally_sleep_offload_ms=%.1f tally_sleep_offload_next_ms=%.1f "
               "tally_wake_offload_ms=%.1f vllm_sleep_discard_ms=%.1f vllm_wake_discard_ms=%.1f "
               "vllm_sleep_offload_ms=%.1f vllm_wake_offload_ms=%.1f\n",
               si_cost_column_name(c), gib, n, block >> 20, sleep_ms, wake_ms, sleep_ms + off_sleep / 1e3,
               sleep_ms + off_next / 1e3, wake_ms + off_wake / 1e3, v_sleep, v_wake, v_sleep + off_sleep / 1e3,
               v_wake + off_wake / 1e3);
    }
    printf("backend=cuda-standin gib=%.0f sleep_wall_ms=%.1f wake_wall_ms=%.1f calls_sleep:", gib, t1 - t0, t2 - t1);
    for (size_t k = 0; k < NENTRIES; k++)
        if (c1[k] - c0[k])
            printf(" %s=%llu", ENTRIES[k], c1[k] - c0[k]);
    printf(" calls_wake:");
    for (size_t k = 0; k < NENTRIES; k++)
        if (c2[k] - c1[k])
            printf(" %s=%llu", ENTRIES[k], c2[k] - c1[k]);
    printf("\n");
    return 0;
}
