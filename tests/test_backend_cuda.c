/* The cuda and async backends on CUDA's driver API. `make test` runs them
 * against the CUDA stand-in (build/standin/libcuda.so.1 through
 * LD_LIBRARY_PATH); with TALLY_REAL_CUDA=1 on a GPU machine the same tests
 * run unchanged against the real driver. Every test runs in a forked child
 * (the backend is chosen once per process, and CUDA must not be initialised
 * before a fork), with its configuration in TALLY_CONF; the stand-in gets
 * three devices (CUDA_STANDIN_DEVICES, ignored by a real driver). Tests that
 * need more devices than the machine has are skipped, saying so.
 *
 * Defects of issue 11 and their tests:
 *   contexts on unused devices        test_*_contexts_only_on_used_devices
 *   caller's context changed           test_cuda_caller_context_kept
 *   cross-device record_stream         test_cuda_cross_device_record_stream,
 *                                      test_async_cross_device_record_stream
 *   async free not waiting on uses     test_async_free_waits_on_uses (through a free stream)
 *   error state / error names          test_*_oom_and_release (names),
 *                                      test_no_cuda_runtime_in_process,
 *                                      test_init_failure_names_call
 *   capture                            test_cuda_capture_graph_pool,
 *                                      test_cuda_capture_without_pool_refused
 *   lazy start                         test_cuda_lazy_start
 *   failed sync                        test_cuda_failed_event_frees_block
 *   failed record syncs the device     test_cuda_failed_record_waits_for_stream_only
 *   completed events kept for reuse    test_cuda_completed_events_are_reused
 *   64 spare events per device         test_cuda_cross_device_events_kept_up_to_64
 *
 * Gaps that mutation testing found (tests/mutate/mutations.txt):
 *   segment from the current device    test_cuda_caller_context_kept (device 1's free memory)
 *   a driver older than CUDA 11.3      test_cuda_old_driver_refused
 *   async_pool:private's own pool      test_async_private_pool_labelled (the default pool holds nothing)
 *   free not waiting on its own stream test_async_free_waits_on_own_stream
 *   an ended graph pool still serving  test_cuda_graph_pool_ended_serves_nothing
 *   a graph pool freed while in use    test_cuda_graph_pool_outlives_its_last_segment */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cudautil.h"
#include "skip.h"
#include "tally.h"

#include "cudachild.h"

static bool is_cuda(void)
{
    return strcmp(tally_backend_name(), "cuda") == 0;
}

/* ---- basic use -------------------------------------------------------------- */

/* Lines tally wrote on its sink (diagnostics). */
static atomic_int sink_lines;
static void count_sink(void *arg, const char *text, size_t len)
{
    (void)arg;
    (void)text;
    (void)len;
    atomic_fetch_add(&sink_lines, 1);
}

/* Allocation, reuse from the cache and release: all silent, no error set
 * (a driver call that worked is not a failure). */
static void body_malloc_free(void)
{
    tally_set_sink(count_sink, NULL);
    driver_up();
    EXPECT(tally_init() == 0);
    CUstream s = make_stream(0);
    void *a = tally_malloc(3 << 20, 0, s);
    EXPECT(a != NULL);
    tally_free(a);
    void *b = tally_malloc(3 << 20, 0, s);
    EXPECT(b != NULL);
    if (is_cuda())
        EXPECT(a == b); /* served from the cache */
    tally_free(b);
    EXPECT(tally_check() == 0);
    CU_EXPECT(cu.cuStreamSynchronize(s));
    tally_stats_t before, after;
    EXPECT(tally_get_stats(0, &before) == 0);
    size_t released = tally_empty_cache(0);
    if (is_cuda())
        EXPECT(released == 20 << 20); /* the 3 MiB block's 20 MiB segment: cuMemFree */
    /* Emptying the cache waits for the device once, as PyTorch counts it (the async pool's trim too). */
    EXPECT(tally_get_stats(0, &after) == 0);
    EXPECT(after.num_sync_all_streams - before.num_sync_all_streams == 1);
    EXPECT(tally_check() == 0);
    if (atomic_load(&sink_lines) != 0 || tally_last_error()[0]) {
        fprintf(stderr, "%d lines on the sink; last error '%s'\n", atomic_load(&sink_lines), tally_last_error());
        exit(1);
    }
}

static void body_streams(void)
{
    driver_up();
    CUstream s1 = make_stream(0), s2 = make_stream(0);
    void *c = tally_malloc(1 << 20, 0, s1);
    EXPECT(c != NULL);
    struct cu_hold *h = cu_hold(s2);
    EXPECT(h != NULL);
    EXPECT(tally_record_stream(c, s2) == 0);
    tally_free(c);
    void *d = tally_malloc(1 << 20, 0, s1);
    EXPECT(d != NULL);
    if (is_cuda())
        EXPECT(d != c); /* s2 may still use c */
    tally_free(d);
    cu_release(h);
    CU_EXPECT(cu.cuStreamSynchronize(s2));
    void *e = tally_malloc(1 << 20, 0, s1);
    if (is_cuda())
        EXPECT(e == c); /* s2 is done: c is reused */
    tally_free(e);
    EXPECT(tally_check() == 0);
}

static void body_oom_and_release(void)
{
    driver_up();
    size_t free_b = 0, total = 0;
    EXPECT(tally_mem_get_info(0, &free_b, &total) == 0);
    tally_stats_t before, after;
    EXPECT(tally_get_stats(0, &before) == 0);
    EXPECT(tally_malloc(total * 2, 0, NULL) == NULL);
    /* The error names the CUDA call and CUDA's name for the error. */
    EXPECT(strstr(tally_last_error(), is_cuda() ? "cuMemAlloc: " : "cuMemAllocFromPoolAsync: ") != NULL);
    EXPECT(strstr(tally_last_error(), "CUDA_ERROR_OUT_OF_MEMORY") != NULL);
    EXPECT(tally_get_stats(0, &after) == 0);
    EXPECT(after.num_ooms == before.num_ooms + 1);
    void *p = tally_malloc(256 << 20, 0, NULL);
    EXPECT(p != NULL);
    tally_free(p);
    EXPECT(tally_get_stats(0, &before) == 0);
    EXPECT(tally_empty_cache(0) > 0);
    EXPECT(tally_get_stats(0, &after) == 0);
    EXPECT(after.reserved_bytes[0].current < before.reserved_bytes[0].current);
    EXPECT(tally_check() == 0);
}

/* ---- contexts --------------------------------------------------------------- */

static void *free_in_thread(void *p)
{
    tally_free(p);
    CUcontext cur = (CUcontext)1;
    if (cu.cuCtxGetCurrent(&cur) != CUDA_SUCCESS || cur != NULL)
        return (void *)1; /* the fresh thread got a context */
    return NULL;
}

/* Only device 0 is used: no other device ever gets a context, whatever
 * tally does (memory fraction at start, a free from a fresh thread,
 * empty_cache of every device, stage-end release, PyTorch's reset hook). */
static void body_contexts(void)
{
    driver_up();
    int n = tally_device_count();
    EXPECT(n >= 2);
    for (int i = 0; i < n; i++)
        EXPECT(cu_ctx_active(i) == 0);
    tally_stage_begin("s");
    void *p = tally_malloc(1 << 20, 0, NULL);
    EXPECT(p != NULL);
    void *q = tally_malloc(5 << 20, 0, NULL);
    EXPECT(q != NULL);
    EXPECT(cu_ctx_active(0) == 1);
    pthread_t t;
    void *got = (void *)2;
    EXPECT(pthread_create(&t, NULL, free_in_thread, p) == 0);
    EXPECT(pthread_join(t, &got) == 0);
    EXPECT(got == NULL);
    tally_free(q);
    tally_stage_end("s");
    tally_empty_cache(-1);
    tally_torch_empty_cache();
    EXPECT(tally_check() == 0);
    for (int i = 1; i < n; i++)
        EXPECT(cu_ctx_active(i) == 0);
    /* The fraction (0.5) holds on device 0, set without touching others. */
    size_t free_b = 0, total = 0;
    EXPECT(tally_mem_get_info(0, &free_b, &total) == 0);
    EXPECT(tally_malloc(total / 2 + (64 << 20), 0, NULL) == NULL);
    for (int i = 1; i < n; i++)
        EXPECT(cu_ctx_active(i) == 0);
}

/* The caller's current context is the same after every call. */
static void body_caller_context(void)
{
    driver_up();
    CUdevice d1;
    CUcontext c1, cur = NULL, popped;
    CU_EXPECT(cu.cuDeviceGet(&d1, 1));
    CU_EXPECT(cu.cuDevicePrimaryCtxRetain(&c1, d1));
    CU_EXPECT(cu.cuCtxPushCurrent(c1));
    size_t free1 = 0, free1_after = 0, total1 = 0;
    CU_EXPECT(cu.cuMemGetInfo(&free1, &total1));
    void *p = tally_malloc(1 << 20, 0, NULL);
    EXPECT(p != NULL);
    CU_EXPECT(cu.cuCtxGetCurrent(&cur));
    EXPECT(cur == c1);
    /* The segment came from device 0 (its primary context pushed over the
     * caller's device-1 context), not from the current device 1. */
    CU_EXPECT(cu.cuMemGetInfo(&free1_after, &total1));
    EXPECT(free1_after == free1);
    tally_free(p);
    tally_empty_cache(0);
    CU_EXPECT(cu.cuCtxGetCurrent(&cur));
    EXPECT(cur == c1);
    CU_EXPECT(cu.cuCtxPopCurrent(&popped));
    EXPECT(cu_ctx_active(2) == 0);
}

/* A driver call is not free: when the caller already has the device's
 * primary context current, tally pushes nothing; with another device's
 * context current it pushes the one it needs and pops it again, once per
 * call that reaches the driver. */
static void body_no_push_when_current(void)
{
    driver_up();
    CUdevice d0, d1;
    CUcontext c0, c1, popped;
    CU_EXPECT(cu.cuDeviceGet(&d0, 0));
    CU_EXPECT(cu.cuDeviceGet(&d1, 1));
    CU_EXPECT(cu.cuDevicePrimaryCtxRetain(&c0, d0));
    CU_EXPECT(cu.cuDevicePrimaryCtxRetain(&c1, d1));
    void *warm = tally_malloc(1 << 20, 0, NULL); /* device 0's context is tally's from here */
    EXPECT(warm != NULL);
    tally_free(warm);
    tally_empty_cache(0);
    CU_EXPECT(cu.cuCtxPushCurrent(c0));
    cu_calls_reset();
    void *p = tally_malloc(3 << 20, 0, NULL); /* a new segment: cuMemAlloc */
    EXPECT(p != NULL);
    tally_free(p);
    EXPECT(tally_empty_cache(0) > 0); /* cuMemFree */
    EXPECT(cu_calls("cuMemAlloc") >= 1);
    EXPECT(cu_calls("cuCtxPushCurrent") == 0);
    EXPECT(cu_calls("cuCtxPopCurrent") == 0);
    CU_EXPECT(cu.cuCtxPopCurrent(&popped));
    CU_EXPECT(cu.cuCtxPushCurrent(c1));
    cu_calls_reset();
    p = tally_malloc(3 << 20, 0, NULL);
    EXPECT(p != NULL);
    tally_free(p);
    EXPECT(tally_empty_cache(0) > 0);
    EXPECT(cu_calls("cuCtxPushCurrent") >= 2); /* the allocation and the release */
    EXPECT(cu_calls("cuCtxPushCurrent") == cu_calls("cuCtxPopCurrent"));
    CUcontext cur = NULL;
    CU_EXPECT(cu.cuCtxGetCurrent(&cur));
    EXPECT(cur == c1);
    CU_EXPECT(cu.cuCtxPopCurrent(&popped));
}

/* ---- streams of other devices ------------------------------------------------ */

/* A block of device 0 used on a stream of device 1: its event is recorded on
 * device 1 and the block is not reused while that stream still works. NULL
 * with device 1's context current means device 1's default stream. */
static void body_cross_device(void)
{
    driver_up();
    CUstream s1 = make_stream(1);
    void *p = tally_malloc(1 << 20, 0, NULL);
    EXPECT(p != NULL);
    struct cu_hold *h = cu_hold(s1);
    EXPECT(h != NULL);
    EXPECT(tally_record_stream(p, s1) == 0);
    tally_free(p);
    void *q = tally_malloc(1 << 20, 0, NULL);
    EXPECT(q != NULL);
    if (is_cuda())
        EXPECT(q != p);
    cu_release(h);
    CU_EXPECT(cu.cuStreamSynchronize(s1));
    tally_free(q);
    void *r = tally_malloc(1 << 20, 0, NULL);
    if (is_cuda())
        EXPECT(r == p);
    /* NULL: the default stream of the current context's device (1). */
    CUdevice d1;
    CUcontext c1, popped;
    CU_EXPECT(cu.cuDeviceGet(&d1, 1));
    CU_EXPECT(cu.cuDevicePrimaryCtxRetain(&c1, d1));
    CU_EXPECT(cu.cuCtxPushCurrent(c1));
    h = cu_hold(NULL);
    EXPECT(h != NULL);
    EXPECT(tally_record_stream(r, NULL) == 0);
    CU_EXPECT(cu.cuCtxPopCurrent(&popped));
    tally_free(r);
    void *t = tally_malloc(1 << 20, 0, NULL);
    EXPECT(t != NULL);
    if (is_cuda())
        EXPECT(t != r);
    cu_release(h);
    tally_free(t);
    EXPECT(tally_check() == 0);
    EXPECT(cu_ctx_active(2) == 0);
}

/* async: a block used on another stream is freed on the device's free
 * stream, which waits for that stream (hold_own false: s1 held) and for the
 * block's own stream (hold_own true: s0 held); until the held work has run,
 * another stream gets the block only by waiting for it. */
static void async_free_waits(bool hold_own)
{
    driver_up();
    CUstream s0 = make_stream(0), s2 = make_stream(0), s1 = make_stream(1);
    CUstream held = hold_own ? s0 : s1;
    void *p = tally_malloc(1 << 20, 0, s0);
    EXPECT(p != NULL);
    struct cu_hold *h = cu_hold(held);
    EXPECT(h != NULL);
    EXPECT(tally_record_stream(p, s1) == 0);
    tally_free(p);
    if (!hold_own) {
        /* The compute stream is not held back by s1. */
        for (int i = 0; i < 100 && cu.cuStreamQuery(s0) == CUDA_ERROR_NOT_READY; i++)
            usleep(2000);
        EXPECT(cu.cuStreamQuery(s0) == CUDA_SUCCESS);
    }
    usleep(20000); /* a free that did not wait for the held stream would have run by now */
    void *q = tally_malloc(1 << 20, 0, s2);
    EXPECT(q != NULL);
    if (q == p)
        EXPECT(cu.cuStreamQuery(s2) == CUDA_ERROR_NOT_READY); /* s2 waits for the held stream */
    cu_release(h);
    CU_EXPECT(cu.cuStreamSynchronize(held));
    CU_EXPECT(cu.cuStreamSynchronize(s2));
    tally_free(q);
    EXPECT(tally_check() == 0);
}

static void body_async_free_waits(void)
{
    async_free_waits(false);
}

static void body_async_free_waits_own(void)
{
    async_free_waits(true);
}

/* async: reserved figures come from the driver's pool; reports say whose. */
static void body_async_reports_pool(void)
{
    driver_up();
    void *p = tally_malloc(1 << 20, 0, NULL);
    EXPECT(p != NULL);
    const char *want = getenv("WANT_POOL");
    /* The block comes from the device's default pool, or with
     * async_pool:private from a pool of tally's own (the default one holds
     * none of it). */
    CUdevice d0;
    CUmemoryPool dflt = NULL;
    cuuint64_t used = 0;
    CU_EXPECT(cu.cuDeviceGet(&d0, 0));
    CU_EXPECT(cu.cuDeviceGetDefaultMemPool(&dflt, d0));
    CU_EXPECT(cu.cuMemPoolGetAttribute(dflt, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used));
    EXPECT(strcmp(want, "private pool") == 0 ? used == 0 : used >= (1 << 20));
    /* The ledger's first line names the backend, then whose pool. */
    child_said_clear();
    EXPECT(tally_write_ledger(child_said_sink, NULL) == 0);
    const char *head = strcmp(want, "private pool") == 0
                           ? "tally ledger (backend async, reserved: tally's private pool, home device "
                           : "tally ledger (backend async, reserved: the device's default pool, shared with other "
                             "users, home device ";
    EXPECT(strncmp(child_said, head, strlen(head)) == 0);
    char path[] = "/tmp/tally-cuda-report-XXXXXX";
    int fd = mkstemp(path);
    EXPECT(fd >= 0);
    close(fd);
    EXPECT(tally_write_report(path) == 0);
    FILE *f = fopen(path, "r");
    EXPECT(f != NULL);
    child_said_len = fread(child_said, 1, sizeof child_said - 1, f);
    child_said[child_said_len] = 0;
    fclose(f);
    unlink(path);
    EXPECT(strstr(child_said, strcmp(want, "default pool, shared") == 0 ? "\"reserved_from\":\"default pool, shared\""
                                                                  : "\"reserved_from\":\"private pool\"") != NULL);
    tally_free(p);
}

static void body_async_default_pool_report(void)
{
    setenv("WANT_POOL", "default pool, shared", 1);
    body_async_reports_pool();
}

static void body_async_private_pool_report(void)
{
    setenv("WANT_POOL", "private pool", 1);
    body_async_reports_pool();
}

/* async: a peer reaches pool memory only once tally grants it, asked before
 * the pool exists (applied at its set-up) or after. */
static void body_async_peer_access(void)
{
    driver_up();
    EXPECT(tally_pool_peer_access(0, 0) == -TALLY_EINVAL);
    EXPECT(strstr(tally_last_error(), "is the device itself") != NULL);
    EXPECT(tally_pool_peer_access(0, 7) == -TALLY_EINVAL);
    EXPECT(tally_pool_peer_access(0, 1) == 0); /* before the pool exists */
    void *p = tally_malloc(1 << 20, 0, NULL);
    void *q = tally_malloc(1 << 20, 2, NULL);
    EXPECT(p != NULL && q != NULL);
    CUmemoryPool pool0, pool2;
    CUdevice d0, d2;
    CU_EXPECT(cu.cuDeviceGet(&d0, 0));
    CU_EXPECT(cu.cuDeviceGet(&d2, 2));
    CU_EXPECT(cu.cuDeviceGetDefaultMemPool(&pool0, d0));
    CU_EXPECT(cu.cuDeviceGetDefaultMemPool(&pool2, d2));
    CUmemLocation peer1 = {CU_MEM_LOCATION_TYPE_DEVICE, 1};
    CUmemAccess_flags flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
    CU_EXPECT(cu.cuMemPoolGetAccess(&flags, pool0, &peer1));
    EXPECT(flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CU_EXPECT(cu.cuMemPoolGetAccess(&flags, pool2, &peer1));
    EXPECT(flags == CU_MEM_ACCESS_FLAGS_PROT_NONE); /* not asked for */
    EXPECT(tally_pool_peer_access(2, 1) == 0);   /* after */
    CU_EXPECT(cu.cuMemPoolGetAccess(&flags, pool2, &peer1));
    EXPECT(flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    tally_free(p);
    tally_free(q);
}

/* ---- errors --------------------------------------------------------------- */

static void body_no_runtime(void)
{
    driver_up();
    void *p = tally_malloc(1 << 20, 0, NULL);
    EXPECT(p != NULL);
    EXPECT(tally_malloc((size_t)1 << 50, 0, NULL) == NULL);
    tally_free(p);
    tally_empty_cache(-1);
    FILE *f = fopen("/proc/self/maps", "r");
    EXPECT(f != NULL);
    char line[512];
    bool runtime = false, driver = false;
    while (fgets(line, sizeof line, f)) {
        runtime = runtime || strstr(line, "libcudart") != NULL;
        driver = driver || strstr(line, "libcuda.so") != NULL;
    }
    fclose(f);
    EXPECT(driver);
    EXPECT(!runtime);
}

static void body_init_failure(void)
{
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    EXPECT(tally_init() != 0);
    EXPECT(strstr(tally_last_error(), "backend cuda unusable: cuInit: CUDA_ERROR_NO_DEVICE") != NULL);
    EXPECT(tally_malloc(1 << 20, 0, NULL) == NULL);
}

/* A driver older than CUDA 11.3 is refused, naming both versions. Only the
 * stand-in can pose as one (CUDA_STANDIN_DRIVER_VERSION=11000: every entry
 * point tally needs is still found, so only the version check refuses it);
 * on a real driver there is nothing to check. */
static void body_old_driver(void)
{
    if (cu_load() != 0 || !cu_is_standin())
        return;
    setenv("CUDA_STANDIN_DRIVER_VERSION", "11000", 1);
    EXPECT(tally_init() != 0);
    EXPECT(strstr(tally_last_error(), "the NVIDIA driver supports CUDA 11.0; tally needs 11.3 or newer") != NULL);
    EXPECT(tally_malloc(1 << 20, 0, NULL) == NULL);
}

/* An event whose query fails does not leave its block pending for ever:
 * tally synchronises the event's device and frees the block. The query is
 * made to fail by resetting device 1's primary context under tally (the
 * test releases every reference, tally's included): tally's event of that
 * device becomes an invalid handle. */
static void body_failed_event(void)
{
    driver_up();
    CUstream s1 = make_stream(1); /* one reference to device 1's context */
    void *p = tally_malloc(1 << 20, 0, NULL);
    EXPECT(p != NULL);
    EXPECT(tally_record_stream(p, s1) == 0);
    tally_free(p); /* tally records its event on device 1 (a second reference) */
    CU_EXPECT(cu.cuStreamSynchronize(s1));
    CU_EXPECT(cu.cuDevicePrimaryCtxRelease(1));
    CU_EXPECT(cu.cuDevicePrimaryCtxRelease(1));
    EXPECT(cu_ctx_active(1) == 0);
    tally_stats_t st;
    EXPECT(tally_get_stats(0, &st) == 0);
    EXPECT(st.active[0].current == 1); /* p is still pending */
    long long device_syncs = cu_calls("cuCtxSynchronize");
    void *q = tally_malloc(1 << 20, 0, NULL);
    EXPECT(q != NULL);
    EXPECT(q == p); /* the failed query freed it */
    if (device_syncs >= 0) /* after waiting for the event's device (the stand-in counts calls) */
        EXPECT(cu_calls("cuCtxSynchronize") - device_syncs == 1);
    EXPECT(tally_get_stats(0, &st) == 0);
    EXPECT(st.active[0].current == 1);
    tally_free(q);
    EXPECT(tally_check() == 0);
}

/* An event tally recorded for a freed block is kept once it has completed
 * and serves the next free that needs one: twenty rounds of allocate,
 * record_stream, free and wait create one event, not twenty (on a real
 * driver, which counts nothing, only the frees are checked). */
static void body_events_reused(void)
{
    driver_up();
    CUstream s1 = make_stream(0);
    long long made = cu_calls("cuEventCreate");
    for (int i = 0; i < 20; i++) {
        void *p = tally_malloc(1 << 20, 0, NULL);
        EXPECT(p != NULL);
        EXPECT(tally_record_stream(p, s1) == 0);
        tally_free(p); /* an event on s1 holds the block */
        CU_EXPECT(cu.cuStreamSynchronize(s1));
    }
    if (made >= 0)
        EXPECT(cu_calls("cuEventCreate") - made == 1);
    tally_stats_t st;
    EXPECT(tally_get_stats(0, &st) == 0);
    EXPECT(st.allocation[0].allocated == 20);
    EXPECT(tally_check() == 0);
}

/* Events of another device go back to the backend, which keeps 64 spares
 * per device and destroys the rest: 70 blocks of device 0 used on a
 * stream of device 1 and freed take 70 events of device 1; once they have
 * completed, 64 are kept and 6 destroyed, and the next 64 such frees
 * create none. */
static void body_cross_device_spares(void)
{
    driver_up();
    CUstream s1 = make_stream(1);
    void *p[70];
    long long made = cu_calls("cuEventCreate"), gone = cu_calls("cuEventDestroy");
    for (int i = 0; i < 70; i++) {
        p[i] = tally_malloc(1 << 20, 0, NULL);
        EXPECT(p[i] != NULL);
        EXPECT(tally_record_stream(p[i], s1) == 0);
    }
    for (int i = 0; i < 70; i++)
        tally_free(p[i]);
    CU_EXPECT(cu.cuStreamSynchronize(s1));
    tally_empty_cache(0); /* completed events are collected first */
    if (made >= 0) {
        EXPECT(cu_calls("cuEventCreate") - made == 70);
        EXPECT(cu_calls("cuEventDestroy") - gone == 6);
    }
    made = cu_calls("cuEventCreate");
    for (int i = 0; i < 64; i++) {
        p[i] = tally_malloc(1 << 20, 0, NULL);
        EXPECT(p[i] != NULL);
        EXPECT(tally_record_stream(p[i], s1) == 0);
    }
    for (int i = 0; i < 64; i++)
        tally_free(p[i]);
    if (made >= 0)
        EXPECT(cu_calls("cuEventCreate") == made);
    CU_EXPECT(cu.cuStreamSynchronize(s1));
    EXPECT(tally_check() == 0);
}

struct watchdog {
    struct cu_hold *hold;
    _Atomic int fired; /* read by the test while the watchdog may write it */
};

static void *watchdog_main(void *arg)
{
    struct watchdog *w = arg;
    usleep(2000000);
    atomic_store(&w->fired, 1);
    cu_release(w->hold);
    return NULL;
}

/* An event that cannot be recorded (its stream was destroyed since
 * record_stream) makes tally wait for that stream only: not for the
 * block's device, whose other stream is held here (waiting for the device
 * would last until the watchdog lets it go). */
static void body_failed_record_waits_for_stream_only(void)
{
    driver_up();
    CUstream s1 = make_stream(1), busy = make_stream(0);
    void *p = tally_malloc(1 << 20, 0, NULL);
    EXPECT(p != NULL);
    EXPECT(tally_record_stream(p, s1) == 0);
    CU_EXPECT(cu.cuStreamDestroy(s1));
    struct watchdog w = {cu_hold(busy), 0};
    EXPECT(w.hold != NULL);
    pthread_t t;
    EXPECT(pthread_create(&t, NULL, watchdog_main, &w) == 0);
    tally_free(p); /* the record on s1 fails */
    EXPECT(!atomic_load(&w.fired));
    EXPECT(pthread_join(t, NULL) == 0);
    CU_EXPECT(cu.cuStreamSynchronize(busy));
    EXPECT(tally_check() == 0);
}

/* ---- lazy start --------------------------------------------------------------- */

static void discard(void *arg, const char *text, size_t len)
{
    (void)arg;
    (void)text;
    (void)len;
}

static void body_lazy_start(void)
{
    EXPECT(tally_configure("stage_report:false") == 0);
    EXPECT(tally_write_options(discard, NULL) == 0);
    EXPECT(tally_version() != NULL);
    /* Nothing so far needed a device: the driver is not even loaded. */
    EXPECT(dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD) == NULL);
    void *p = tally_malloc(1 << 20, 1, NULL);
    EXPECT(p != NULL);
    driver_up();
    EXPECT(cu_ctx_active(0) == 0);
    EXPECT(cu_ctx_active(1) == 1);
    tally_free(p);
}

/* ---- CUDA graph capture ------------------------------------------------------- */

static int only_stream(void *arg, void *stream)
{
    return stream == arg;
}

/* A capture in the global mode: tally allocates during it without
 * invalidating it (relaxed mode around cuMemAlloc), queries no event and
 * records none into it (a block freed with a use on the capturing stream
 * gets its event after the capture), and the graph's blocks stay in the
 * graph pool: an eager allocation afterwards never gets them. */
static void body_capture(void)
{
    driver_up();
    CUstream s = make_stream(0), side = make_stream(0);
    void *x = tally_malloc(1 << 20, 0, side); /* used on s below */
    EXPECT(x != NULL);
    EXPECT(tally_graph_pool_begin(0, 7, 1, only_stream, s) == 0);
    CU_EXPECT(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    void *g1 = tally_malloc(5 << 20, 0, s);
    EXPECT(g1 != NULL);
    EXPECT(tally_record_stream(x, s) == 0);
    tally_free(x);                            /* its event waits for the capture's end */
    void *g2 = tally_malloc(1 << 20, 0, s); /* no event is queried */
    EXPECT(g2 != NULL);
    tally_free(g1); /* back to the graph pool */
    void *g3 = tally_malloc(5 << 20, 0, s);
    EXPECT(g3 == g1); /* the graph pool serves the capture */
    tally_free(g3);
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    CU_EXPECT(cu.cuStreamIsCapturing(s, &st));
    EXPECT(st == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    CUgraph graph = NULL;
    CU_EXPECT(cu.cuStreamEndCapture(s, &graph)); /* not invalidated */
    EXPECT(graph != NULL);
    CU_EXPECT(cu.cuGraphDestroy(graph));
    EXPECT(tally_graph_pool_end(0, 7, 1) == 0);
    void *e = tally_malloc(5 << 20, 0, s);
    EXPECT(e != NULL);
    EXPECT(e != g1); /* eager code never gets the graph's memory */
    EXPECT(tally_check() == 0);
    tally_free(e);
    tally_free(g2);
    EXPECT(tally_graph_pool_release(0, 7, 1) == 0);
    EXPECT(tally_graph_pool_release(0, 7, 1) == -TALLY_EINVAL);
    tally_empty_cache(0);
    tally_stats_t st2;
    EXPECT(tally_get_stats(0, &st2) == 0);
    EXPECT(st2.reserved_bytes[0].current == 0);
    EXPECT(tally_check() == 0);
}

/* Without a graph pool, an allocation on a capturing stream is refused with
 * an error saying what to do, and the capture survives. */
static void body_capture_without_pool(void)
{
    driver_up();
    CUstream s = make_stream(0);
    void *warm = tally_malloc(1 << 20, 0, s);
    EXPECT(warm != NULL);
    CU_EXPECT(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    EXPECT(tally_malloc(1 << 20, 0, s) == NULL);
    EXPECT(strstr(tally_last_error(), "torch.cuda.graph") != NULL);
    EXPECT(strstr(tally_last_error(), "tally_graph_pool_begin") != NULL);
    CUgraph graph = NULL;
    CU_EXPECT(cu.cuStreamEndCapture(s, &graph));
    CU_EXPECT(cu.cuGraphDestroy(graph));
    tally_free(warm);
    EXPECT(tally_check() == 0);
}

/* A graph pool that has ended serves no more allocations, even while
 * another pool is open: an eager allocation on its stream never gets the
 * ended pool's cached block. Once released, the pool's last segment goes
 * at the next empty_cache, counted in what it released. */
static void body_graph_pool_ended(void)
{
    driver_up();
    CUstream a = make_stream(0), b = make_stream(0);
    EXPECT(tally_graph_pool_begin(0, 1, 1, only_stream, a) == 0);
    void *g = tally_malloc(1 << 20, 0, a);
    EXPECT(g != NULL);
    tally_free(g); /* cached in pool (1, 1) */
    void *kept = tally_malloc(4096, 0, a); /* keeps the pool's small segment past its release */
    EXPECT(kept != NULL);
    EXPECT(tally_graph_pool_end(0, 1, 1) == 0);
    EXPECT(tally_graph_pool_begin(0, 2, 1, only_stream, b) == 0);
    void *e = tally_malloc(1 << 20, 0, a);
    EXPECT(e != NULL);
    EXPECT(e != g);
    tally_free(e);
    EXPECT(tally_graph_pool_end(0, 2, 1) == 0);
    EXPECT(tally_graph_pool_release(0, 1, 1) == 0);
    EXPECT(tally_graph_pool_release(0, 2, 1) == 0);
    tally_free(kept);
    /* Released and counted: the released pool's small segment and the
     * eager one of e, 2 MiB each. */
    EXPECT(tally_empty_cache(0) == 4 << 20);
    EXPECT(tally_check() == 0);
}

/* A graph pool in use keeps its segments: while it is allocating (a capture
 * announced) the out-of-memory path releases nothing, not even the pool's
 * one cached (oversize) segment, and the allocation fails cleanly; once the
 * pool has ended and been released, its last segment goes (and the pool with
 * it) and the same request fits. On a 1 GiB device (the
 * stand-in; a real one is larger and the request fits). */
static void body_graph_pool_loses_last_segment(void)
{
    setenv("CUDA_STANDIN_MEMORY", "1G", 1);
    driver_up();
    CUstream a = make_stream(0);
    EXPECT(tally_graph_pool_begin(0, 1, 1, only_stream, a) == 0);
    void *g = tally_malloc(100 << 20, 0, a);
    EXPECT(g != NULL);
    tally_free(g); /* the pool's only segment, cached */
    size_t free_b = 0, total = 0;
    EXPECT(tally_mem_get_info(0, &free_b, &total) == 0);
    size_t want = free_b + (40 << 20); /* fits only once g's segment is released */
    EXPECT(tally_malloc(want, 0, a) == NULL);
    EXPECT(tally_graph_pool_end(0, 1, 1) == 0);
    EXPECT(tally_graph_pool_release(0, 1, 1) == 0);
    void *big = tally_malloc(want, 0, a);
    EXPECT(big != NULL);
    tally_free(big);
    EXPECT(tally_graph_pool_release(0, 1, 1) == -TALLY_EINVAL); /* gone with its last segment */
    EXPECT(tally_check() == 0);
}

/* Bad graph-pool calls: one line each, naming the problem. */
static void body_graph_pool_errors(void)
{
    driver_up();
    EXPECT(tally_graph_pool_begin(0, 0, 0, NULL, NULL) == -TALLY_EINVAL);
    EXPECT(strstr(tally_last_error(), "pool id (0, 0)") != NULL);
    EXPECT(tally_graph_pool_begin(9, 1, 1, NULL, NULL) == -TALLY_EINVAL);
    EXPECT(strstr(tally_last_error(), "device 9 does not exist") != NULL);
    EXPECT(tally_graph_pool_end(0, 1, 1) == -TALLY_ESTATE);
    EXPECT(strstr(tally_last_error(), "is not allocating") != NULL);
    EXPECT(tally_graph_pool_begin(0, 1, 1, NULL, NULL) == 0);
    EXPECT(tally_graph_pool_begin(0, 1, 1, NULL, NULL) == -TALLY_ESTATE);
    EXPECT(strstr(tally_last_error(), "begin twice") != NULL);
    EXPECT(tally_graph_pool_release(0, 2, 2) == -TALLY_EINVAL);
    EXPECT(strstr(tally_last_error(), "no pool (2, 2)") != NULL);
    EXPECT(tally_graph_pool_release(0, 1, 1) == 0);
}

/* ---- tests ------------------------------------------------------------------ */

CUDA_TEST(test_cuda_malloc_free, "backend:cuda,leak_report:off", body_malloc_free, 1)
CUDA_TEST(test_async_malloc_free, "backend:async,leak_report:off", body_malloc_free, 1)
CUDA_TEST(test_cuda_streams_and_record_stream, "backend:cuda,leak_report:off", body_streams, 1)
CUDA_TEST(test_async_streams_and_record_stream, "backend:async,leak_report:off", body_streams, 1)
CUDA_TEST(test_cuda_oom_and_release, "backend:cuda,leak_report:off", body_oom_and_release, 1)
CUDA_TEST(test_async_oom_and_release, "backend:async,leak_report:off", body_oom_and_release, 1)
CUDA_TEST(test_cuda_contexts_only_on_used_devices,
          "backend:cuda,leak_report:off,memory_fraction:0.5,release_at_stage_end:true,stage_report:false",
          body_contexts, 2)
CUDA_TEST(test_async_contexts_only_on_used_devices,
          "backend:async,leak_report:off,memory_fraction:0.5,release_at_stage_end:true,stage_report:false",
          body_contexts, 2)
CUDA_TEST(test_cuda_caller_context_kept, "backend:cuda,leak_report:off", body_caller_context, 3)
CUDA_TEST(test_cuda_no_context_push_when_already_current, "backend:cuda,leak_report:off", body_no_push_when_current, 2)
CUDA_TEST(test_cuda_cross_device_record_stream, "backend:cuda,leak_report:off", body_cross_device, 3)
CUDA_TEST(test_async_cross_device_record_stream, "backend:async,leak_report:off", body_cross_device, 3)
CUDA_TEST(test_async_free_waits_on_uses, "backend:async,leak_report:off", body_async_free_waits, 2)
CUDA_TEST(test_async_free_waits_on_own_stream, "backend:async,leak_report:off", body_async_free_waits_own, 2)
CUDA_TEST(test_async_default_pool_labelled_shared, "backend:async,leak_report:off", body_async_default_pool_report, 1)
CUDA_TEST(test_async_private_pool_labelled, "backend:async,async_pool:private,leak_report:off",
          body_async_private_pool_report, 1)
CUDA_TEST(test_async_pool_peer_access, "backend:async,leak_report:off", body_async_peer_access, 3)
CUDA_TEST(test_no_cuda_runtime_in_process, "backend:cuda,leak_report:off", body_no_runtime, 1)
CUDA_TEST(test_init_failure_names_call, "backend:cuda,leak_report:off", body_init_failure, 1)
CUDA_TEST(test_cuda_old_driver_refused, "backend:cuda,leak_report:off", body_old_driver, 1)
CUDA_TEST(test_cuda_lazy_start, "backend:cuda,leak_report:off", body_lazy_start, 2)
CUDA_TEST(test_cuda_failed_event_frees_block, "backend:cuda,leak_report:off", body_failed_event, 2)
CUDA_TEST(test_cuda_completed_events_are_reused, "backend:cuda,leak_report:off", body_events_reused, 1)
CUDA_TEST(test_cuda_cross_device_events_kept_up_to_64, "backend:cuda,leak_report:off", body_cross_device_spares, 2)
CUDA_TEST(test_cuda_failed_record_waits_for_stream_only, "backend:cuda,leak_report:off",
          body_failed_record_waits_for_stream_only, 2)
CUDA_TEST(test_cuda_capture_graph_pool, "backend:cuda,leak_report:off", body_capture, 1)
CUDA_TEST(test_cuda_capture_without_pool_refused, "backend:cuda,leak_report:off", body_capture_without_pool, 1)
CUDA_TEST(test_cuda_graph_pool_bad_calls, "backend:cuda,leak_report:off", body_graph_pool_errors, 1)
CUDA_TEST(test_cuda_graph_pool_ended_serves_nothing, "backend:cuda,leak_report:off", body_graph_pool_ended, 1)
CUDA_TEST(test_cuda_graph_pool_outlives_its_last_segment, "backend:cuda,leak_report:off,max_split_size_mb:20",
          body_graph_pool_loses_last_segment, 1)

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_malloc_free),
        cmocka_unit_test(test_async_malloc_free),
        cmocka_unit_test(test_cuda_streams_and_record_stream),
        cmocka_unit_test(test_async_streams_and_record_stream),
        cmocka_unit_test(test_cuda_oom_and_release),
        cmocka_unit_test(test_async_oom_and_release),
        cmocka_unit_test(test_cuda_contexts_only_on_used_devices),
        cmocka_unit_test(test_async_contexts_only_on_used_devices),
        cmocka_unit_test(test_cuda_caller_context_kept),
        cmocka_unit_test(test_cuda_no_context_push_when_already_current),
        cmocka_unit_test(test_cuda_cross_device_record_stream),
        cmocka_unit_test(test_async_cross_device_record_stream),
        cmocka_unit_test(test_async_free_waits_on_uses),
        cmocka_unit_test(test_async_free_waits_on_own_stream),
        cmocka_unit_test(test_async_default_pool_labelled_shared),
        cmocka_unit_test(test_async_private_pool_labelled),
        cmocka_unit_test(test_async_pool_peer_access),
        cmocka_unit_test(test_no_cuda_runtime_in_process),
        cmocka_unit_test(test_init_failure_names_call),
        cmocka_unit_test(test_cuda_old_driver_refused),
        cmocka_unit_test(test_cuda_lazy_start),
        cmocka_unit_test(test_cuda_failed_event_frees_block),
        cmocka_unit_test(test_cuda_completed_events_are_reused),
        cmocka_unit_test(test_cuda_cross_device_events_kept_up_to_64),
        cmocka_unit_test(test_cuda_failed_record_waits_for_stream_only),
        cmocka_unit_test(test_cuda_capture_graph_pool),
        cmocka_unit_test(test_cuda_capture_without_pool_refused),
        cmocka_unit_test(test_cuda_graph_pool_bad_calls),
        cmocka_unit_test(test_cuda_graph_pool_ended_serves_nothing),
        cmocka_unit_test(test_cuda_graph_pool_outlives_its_last_segment),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
