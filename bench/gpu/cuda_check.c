/* GPU checks of the cuda and async backends (run by bench/gpu/run_all.sh on a
 * machine with a GPU; skipped elsewhere). Usage: cuda_check cuda|async
 * (the backend is also forced through TALLY_CONF by the script).
 *
 * Each check prints "ok NAME" or "FAIL NAME: why"; the exit status is the
 * number of failures. Streams are made busy with a host function that
 * sleeps, so "work still queued" is deterministic without kernels. */
#include "tally.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int failures;
static char sink_text[1 << 16];
static size_t sink_len;

static void sink(void *arg, const char *text, size_t len)
{
    (void)arg;
    fwrite(text, 1, len, stderr);
    if (sink_len + len < sizeof sink_text) {
        memcpy(sink_text + sink_len, text, len);
        sink_len += len;
        sink_text[sink_len] = 0;
    }
}

#define CHECK(name, cond, ...)                                                                                     \
    do {                                                                                                           \
        if (cond) {                                                                                                \
            printf("ok %s\n", name);                                                                               \
        } else {                                                                                                   \
            printf("FAIL %s: ", name);                                                                             \
            printf(__VA_ARGS__);                                                                                   \
            printf("\n");                                                                                          \
            failures++;                                                                                            \
        }                                                                                                          \
    } while (0)

static void CUDART_CB sleep_ms(void *arg)
{
    usleep((useconds_t)(uintptr_t)arg * 1000);
}

static tally_stats_t stats(void)
{
    tally_stats_t s;
    tally_get_stats(0, &s);
    return s;
}

int main(int argc, char **argv)
{
    const char *backend = argc > 1 ? argv[1] : "cuda";
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("skip: no CUDA device\n");
        return 0;
    }
    tally_set_sink(sink, NULL);
    CHECK("init", tally_init() == 0, "%s", tally_last_error());
    CHECK("backend", strcmp(tally_backend_name(), backend) == 0, "backend is %s", tally_backend_name());
    cudaStream_t s1, s2;
    cudaStreamCreate(&s1);
    cudaStreamCreate(&s2);

    /* Allocate, write, free on one stream; the same block comes back. */
    void *a = tally_malloc(3 << 20, 0, s1);
    CHECK("malloc", a != NULL, "%s", tally_last_error());
    CHECK("memset", cudaMemsetAsync(a, 1, 3 << 20, s1) == cudaSuccess, "cudaMemsetAsync failed");
    tally_free(a);
    void *b = tally_malloc(3 << 20, 0, s1);
    if (strcmp(backend, "cuda") == 0)
        CHECK("reuse same stream", a == b, "%p then %p", a, b);
    /* A block freed on s1 is not handed to s2 (cuda: cache; async: the pool orders it). */
    void *c = tally_malloc(3 << 20, 0, s2);
    CHECK("stream separation", c != b, "s2 got s1's live block %p", c);
    tally_free(b);
    tally_free(c);

    /* record_stream: s2 is busy for 300 ms; a block used there must not be
     * reused on s1 before that work completes. */
    void *d = tally_malloc(1 << 20, 0, s1);
    cudaLaunchHostFunc(s2, sleep_ms, (void *)(uintptr_t)300);
    CHECK("record_stream", tally_record_stream(d, s2) == 0, "%s", tally_last_error());
    tally_free(d);
    tally_stats_t st = stats();
    if (strcmp(backend, "cuda") == 0) {
        CHECK("pending stays active", st.active[0].current == 1 && st.allocation[0].current == 0,
              "active %lld allocation %lld", (long long)st.active[0].current, (long long)st.allocation[0].current);
        void *e = tally_malloc(1 << 20, 0, s1);
        CHECK("no reuse while pending", e != d, "got the pending block back");
        tally_free(e);
    }
    cudaStreamSynchronize(s2);
    void *f = tally_malloc(1 << 20, 0, s1);
    if (strcmp(backend, "cuda") == 0)
        CHECK("reuse after events", f == d, "%p vs %p", f, d);
    tally_free(f);

    /* Stage end with release: reserved drops (async: the pool's figure). */
    tally_configure("release_at_stage_end:true");
    tally_stage_begin("scratch");
    void *big[8];
    for (int i = 0; i < 8; i++)
        big[i] = tally_malloc((size_t)64 << 20, 0, s1);
    for (int i = 0; i < 8; i++)
        tally_free(big[i]);
    cudaStreamSynchronize(s1);
    tally_stats_t before = stats();
    tally_stage_end("scratch");
    tally_stats_t after = stats();
    CHECK("stage end releases", after.reserved_bytes[0].current < before.reserved_bytes[0].current,
          "reserved %lld -> %lld", (long long)before.reserved_bytes[0].current,
          (long long)after.reserved_bytes[0].current);

    /* OOM: more than the device has; NULL, a report, and nothing else moved. */
    size_t free_b, total;
    cudaMemGetInfo(&free_b, &total);
    tally_stats_t pre = stats();
    sink_len = 0;
    void *g = tally_malloc(total * 2, 0, s1);
    tally_stats_t post = stats();
    CHECK("oom returns NULL", g == NULL, "got %p", g);
    CHECK("oom reported", strstr(sink_text, "out of memory on device 0") != NULL, "no OOM report on the sink");
    CHECK("oom counted", post.num_ooms == pre.num_ooms + 1, "num_ooms %lld -> %lld", (long long)pre.num_ooms,
          (long long)post.num_ooms);
    CHECK("oom leaves allocations", post.allocation[0].current == pre.allocation[0].current, "allocation moved");

    /* The caller's current device is restored around every call. */
    if (n > 1) {
        void *h = tally_malloc(1 << 20, 1, NULL);
        cudaSetDevice(0);
        tally_free(h);
        int cur = -1;
        cudaGetDevice(&cur);
        CHECK("device restored", cur == 0, "current device %d", cur);
    }

    /* Timing: cached malloc+free pairs on the device. */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < 200000; i++)
        tally_free(tally_malloc((size_t)(512 << (i % 10)), 0, s1));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("info %s: %.1f ns per malloc+free pair\n", backend,
           ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) / 200000);
    CHECK("check", tally_check() == 0, "%s", tally_last_error());
    printf("%s: %d failure(s)\n", backend, failures);
    return failures;
}
