/* The cuda and async backends on CUDA's driver API. `make test` runs them
 * against the CUDA stand-in (build/standin/libcuda.so.1 through
 * LD_LIBRARY_PATH); with TALLY_REAL_CUDA=1 on a GPU machine the same tests
 * run unchanged against the real driver. Every test runs in a forked child
 * (the backend is chosen once per process, and CUDA must not be initialised
 * before a fork), with its configuration in TALLY_CONF; the stand-in gets
 * three devices (CUDA_STANDIN_DEVICES, ignored by a real driver). Tests that
 * need more devices than the machine has are skipped, saying so.
 *
 * Here: basic use, contexts, the async backend's pool, errors and the lazy
 * start. A block's uses on other streams and the events tally records for
 * them are in test_backend_cuda_events.c; CUDA graph capture and graph
 * pools in test_backend_cuda_graph_pool.c.
 *
 * Defects of issue 11 and their tests (the others are in those two files):
 *   contexts on unused devices        test_*_contexts_only_on_used_devices
 *   caller's context changed           test_cuda_caller_context_kept
 *   error state / error names          test_*_oom_and_release (names),
 *                                      test_no_cuda_runtime_in_process,
 *                                      test_init_failure_names_call
 *   lazy start                         test_cuda_lazy_start
 *
 * Gaps that mutation testing found (tests/mutate/mutations.txt):
 *   segment from the current device    test_cuda_caller_context_kept (device 1's free memory)
 *   a driver older than CUDA 11.3      test_cuda_old_driver_refused
 *   async_pool:private's own pool      test_async_private_pool_labelled (the default pool holds nothing) */
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
    if (!is_cuda()) {
        /* A small block of the async backend goes back to the driver's pool
         * at its free (the general free, never the small fast path's bins):
         * tally holds no segment of it after. */
        tally_stats_t st0, st1;
        EXPECT(tally_get_stats(0, &st0) == 0);
        void *c = tally_malloc(4096, 0, s);
        EXPECT(c != NULL);
        tally_free(c);
        EXPECT(tally_get_stats(0, &st1) == 0);
        EXPECT(st1.segment[TALLY_POOL_SMALL].current == st0.segment[TALLY_POOL_SMALL].current);
        EXPECT(st1.num_device_free == st0.num_device_free + 1);
        EXPECT(tally_check() == 0);
    }
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

/* base_alloc (PyTorch asks it before cudaIpcGetMemHandle) hands out the
 * cudaMalloc segment of a block on the cuda backend, and refuses a block of
 * the async backend's stream-ordered pool (legacy IPC cannot share pool
 * memory) with one line naming the reason and the backend that can. */
static void body_base_alloc(void)
{
    driver_up();
    EXPECT(tally_init() == 0);
    void *a = tally_malloc(3 << 20, 0, NULL);
    EXPECT(a != NULL);
    size_t size = 1;
    void *base = tally_torch_base_alloc(a, &size);
    if (is_cuda()) {
        EXPECT(base == a && size == 20 << 20);
    } else {
        EXPECT(base == NULL && size == 0);
        EXPECT(strstr(tally_last_error(), "stream-ordered pool (backend:async), which CUDA IPC") != NULL);
        EXPECT(strstr(tally_last_error(), "backend:cuda") != NULL);
    }
    tally_free(a);
}

/* ---- tests ------------------------------------------------------------------ */

CUDA_TEST(test_cuda_malloc_free, "backend:cuda,leak_report:off", body_malloc_free, 1)
CUDA_TEST(test_async_malloc_free, "backend:async,leak_report:off", body_malloc_free, 1)
CUDA_TEST(test_cuda_base_alloc_is_the_segment, "backend:cuda,leak_report:off", body_base_alloc, 1)
CUDA_TEST(test_async_base_alloc_refused, "backend:async,leak_report:off", body_base_alloc, 1)
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
CUDA_TEST(test_async_default_pool_labelled_shared, "backend:async,leak_report:off", body_async_default_pool_report, 1)
CUDA_TEST(test_async_private_pool_labelled, "backend:async,async_pool:private,leak_report:off",
          body_async_private_pool_report, 1)
CUDA_TEST(test_async_pool_peer_access, "backend:async,leak_report:off", body_async_peer_access, 3)
CUDA_TEST(test_no_cuda_runtime_in_process, "backend:cuda,leak_report:off", body_no_runtime, 1)
CUDA_TEST(test_init_failure_names_call, "backend:cuda,leak_report:off", body_init_failure, 1)
CUDA_TEST(test_cuda_old_driver_refused, "backend:cuda,leak_report:off", body_old_driver, 1)
CUDA_TEST(test_cuda_lazy_start, "backend:cuda,leak_report:off", body_lazy_start, 2)

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_malloc_free),
        cmocka_unit_test(test_async_malloc_free),
        cmocka_unit_test(test_cuda_base_alloc_is_the_segment),
        cmocka_unit_test(test_async_base_alloc_refused),
        cmocka_unit_test(test_cuda_streams_and_record_stream),
        cmocka_unit_test(test_async_streams_and_record_stream),
        cmocka_unit_test(test_cuda_oom_and_release),
        cmocka_unit_test(test_async_oom_and_release),
        cmocka_unit_test(test_cuda_contexts_only_on_used_devices),
        cmocka_unit_test(test_async_contexts_only_on_used_devices),
        cmocka_unit_test(test_cuda_caller_context_kept),
        cmocka_unit_test(test_cuda_no_context_push_when_already_current),
        cmocka_unit_test(test_async_default_pool_labelled_shared),
        cmocka_unit_test(test_async_private_pool_labelled),
        cmocka_unit_test(test_async_pool_peer_access),
        cmocka_unit_test(test_no_cuda_runtime_in_process),
        cmocka_unit_test(test_init_failure_names_call),
        cmocka_unit_test(test_cuda_old_driver_refused),
        cmocka_unit_test(test_cuda_lazy_start),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
