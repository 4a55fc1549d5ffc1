/* tally during CUDA graph capture, on the strict stand-in (docs/standin.md,
 * "Stream capture"), or on a GPU with TALLY_REAL_CUDA=1. Every body runs
 * in a forked child (tests/vmmutil.h). One test per defect of issue 20:
 *   1a another thread allocates during a capture     test_capture_other_thread_allocates
 *   1b the capturing thread, on another stream first  test_capture_same_thread_other_stream
 *   2  backend:async frees during a capture            test_async_capture_defers_frees
 *   2b backend:cuda: events of a freed block after it   test_cuda_capture_defers_events_to_its_end
 *   3  record_stream on a capturing stream             test_capture_record_stream_keeps_capture
 *   4  an OOM during a capture frees nothing           test_capture_oom_frees_nothing
 *   5  unmaps wait only for the pages' streams         test_unmap_waits_only_for_users
 *   6  no driver call on the cached path               test_cached_path_makes_no_driver_call
 *   7  RDMA-capable pages where the device can         test_vmm_pages_ask_for_rdma
 *   8  record_stream(NULL) of another device's block   test_record_null_stream_other_device_warns */
#include "vmmutil.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

static CUstream new_stream(int dev)
{
    CUcontext ctx = NULL, popped = NULL;
    CUstream s = NULL;
    NEED(cu.cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS);
    NEED(cu.cuCtxPushCurrent(ctx) == CUDA_SUCCESS);
    NEED(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    NEED(cu.cuCtxPopCurrent(&popped) == CUDA_SUCCESS);
    return s;
}

static int only_stream(void *arg, void *stream)
{
    return stream == arg;
}

static CUstreamCaptureStatus status_of(CUstream s)
{
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    NEED(cu.cuStreamIsCapturing(s, &st) == CUDA_SUCCESS);
    return st;
}

/* End the capture on s: it must give a graph (not invalidated, all joined). */
static void end_ok(CUstream s)
{
    CUgraph g = NULL;
    CUresult r = cu.cuStreamEndCapture(s, &g);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "%s:%d: cuStreamEndCapture returned %s\n", __FILE__, __LINE__, cu_err_name(r));
        _exit(1);
    }
    NEED(g != NULL);
    NEED(cu.cuGraphDestroy(g) == CUDA_SUCCESS);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A block freed with a use on a held stream: its event is pending, so the
 * next malloc on the device has an event to look at. Returns the hold. */
static struct cu_hold *pending_event(CUstream on, CUstream held)
{
    void *x = tally_malloc(1 << 20, 0, on);
    NEED(x != NULL);
    struct cu_hold *h = cu_hold(held);
    NEED(h != NULL);
    NEED(tally_record_stream(x, held) == 0);
    tally_free(x);
    return h;
}

/* A test: body in a child under env (name, value pairs). */
#define CAPTURE_TEST(name, env, body)                                                                              \
    static void name(void **state)                                                                                 \
    {                                                                                                              \
        (void)state;                                                                                               \
        expect_child_ok(env, body);                                                                                \
    }

static const char *const cuda_env[] = {"CUDA_STANDIN_DEVICES", "2", "TALLY_CONF", "backend:cuda,leak_report:off",
                                       NULL};

/* The driver's device count, learnt in a child (CUDA must not start in
 * this process before it forks). */
static void body_count(int fd)
{
    int n = 0;
    if (cu_load() != 0 || cu.cuInit(0) != CUDA_SUCCESS || cu.cuDeviceGetCount(&n) != CUDA_SUCCESS)
        n = 0;
    NEED(write(fd, &n, sizeof n) == (ssize_t)sizeof n);
}

static int driver_devices(void)
{
    static int n = -1;
    if (n < 0 && run_child(cuda_env, body_count, &n, sizeof n) != 0)
        n = 0;
    return n;
}

/* ---- 1a: another thread allocates while the graph is captured ------------------------------------ */
struct other_args {
    CUstream stream;
    void *got;
    size_t released;
};

static void *malloc_elsewhere(void *arg)
{
    struct other_args *a = arg;
    a->got = tally_malloc(1 << 20, 0, a->stream); /* the thread is in the global mode */
    a->released = tally_empty_cache(0);
    return NULL;
}

/* torch.cuda.graph announces the capture (the graph-pool begin hook) before
 * cuStreamBeginCapture; another thread then allocates on the same device,
 * and empties the cache, while a block's event is pending. No event may be
 * queried or synchronised and nothing released: in the global mode either
 * would invalidate the capture. */
static void body_other_thread(int fd)
{
    (void)fd;
    start_driver();
    CUstream s = new_stream(0), t = new_stream(0), held = new_stream(0);
    struct cu_hold *h = pending_event(t, held);
    NEED(tally_graph_pool_begin(0, 1, 1, only_stream, s) == 0);
    NEED(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    struct other_args a = {.stream = t};
    pthread_t th;
    NEED(pthread_create(&th, NULL, malloc_elsewhere, &a) == 0);
    NEED(pthread_join(th, NULL) == 0);
    NEED(a.got != NULL);
    NEED(a.released == 0);
    NEED(status_of(s) == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    void *g = tally_malloc(1 << 20, 0, s);
    NEED(g != NULL);
    end_ok(s);
    NEED(tally_graph_pool_end(0, 1, 1) == 0);
    cu_release(h);
    tally_free(a.got);
    tally_free(g);
    NEED(tally_graph_pool_release(0, 1, 1) == 0);
    NEED(tally_check() == 0);
}

CAPTURE_TEST(test_capture_other_thread_allocates, cuda_env, body_other_thread)

/* ---- 1b: the capturing thread allocates on another stream first ------------------------------------ */
static void body_same_thread(int fd)
{
    (void)fd;
    start_driver();
    CUstream s = new_stream(0), t = new_stream(0), held = new_stream(0);
    struct cu_hold *h = pending_event(t, held);
    NEED(tally_graph_pool_begin(0, 1, 1, only_stream, s) == 0);
    NEED(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    void *side = tally_malloc(1 << 20, 0, t); /* before any allocation on s */
    NEED(side != NULL);
    NEED(tally_empty_cache(0) == 0);
    NEED(status_of(s) == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    void *g = tally_malloc(1 << 20, 0, s);
    NEED(g != NULL);
    end_ok(s);
    NEED(tally_graph_pool_end(0, 1, 1) == 0);
    cu_release(h);
    NEED(cu.cuStreamSynchronize(held) == CUDA_SUCCESS);
    tally_free(side);
    tally_free(g);
    NEED(tally_graph_pool_release(0, 1, 1) == 0);
    NEED(tally_check() == 0);
}

CAPTURE_TEST(test_capture_same_thread_other_stream, cuda_env, body_same_thread)

/* ---- 2: backend:async during a capture ------------------------------------------------------------ */
/* Blocks allocated before the capture and freed during it (on the capturing
 * stream, and one with a use on a side stream) are freed only once the
 * capture has ended: cuMemFreeAsync in a capture takes only graph
 * allocations, and a free through the free stream would join it into the
 * capture unjoined. A block allocated inside the capture is freed inside
 * it (a free node). After the capture the side stream's work still holds
 * its block: the pool may not give that memory to another stream before
 * that work is done. */
static void body_async_capture(int fd)
{
    (void)fd;
    start_driver();
    CUstream s = new_stream(0), side = new_stream(0), other = new_stream(0);
    void *before = tally_malloc(4 << 20, 0, s);
    void *used = tally_malloc(4 << 20, 0, s);
    NEED(before != NULL && used != NULL);
    struct cu_hold *h = cu_hold(side);
    NEED(h != NULL);
    NEED(tally_record_stream(used, side) == 0);
    NEED(tally_graph_pool_begin(0, 1, 1, only_stream, s) == 0);
    NEED(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    NEED(tally_empty_cache(0) == 0); /* no device synchronise, no trim during the capture */
    void *inside = tally_malloc(4 << 20, 0, s);
    NEED(inside != NULL);
    tally_free(inside); /* a graph allocation: freed in the graph */
    tally_free(before);
    tally_free(used);
    NEED(status_of(s) == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    end_ok(s);
    NEED(tally_graph_pool_end(0, 1, 1) == 0);
    /* The side stream still runs: used's memory is not another stream's yet. */
    void *again = tally_malloc(4 << 20, 0, other);
    NEED(again != NULL);
    if (again == used)
        NEED(cu.cuStreamQuery(other) == CUDA_ERROR_NOT_READY); /* reused, but behind the side stream's work */
    cu_release(h);
    NEED(cu.cuStreamSynchronize(side) == CUDA_SUCCESS);
    tally_free(again);
    NEED(tally_graph_pool_release(0, 1, 1) == 0);
    NEED(tally_check() == 0);
}

static const char *const body_async_capture_env[] = {"CUDA_STANDIN_DEVICES", "2", "TALLY_CONF",
                                                     "backend:async,leak_report:off", NULL};
CAPTURE_TEST(test_async_capture_defers_frees, body_async_capture_env, body_async_capture)

/* ---- 2b: backend:cuda: a block freed during a capture gets its events after it ------------------------ */
/* A block used on another stream and freed while a capture is under way
 * keeps its uses until the capture has ended: tally records no event for it
 * while the capture runs, however many calls tally makes meanwhile (each
 * checks for the capture), and records one per use when the capture's pool
 * ends (lib/cache/events.c, flush_deferred). The stand-in counts the
 * records; a real driver counts nothing, and only the reuse is checked. */
static void body_cuda_capture_defers_events(int fd)
{
    (void)fd;
    start_driver();
    CUstream s = new_stream(0), side = new_stream(0), u1 = new_stream(0);
    void *x = tally_malloc(1 << 20, 0, side);
    NEED(x != NULL);
    NEED(tally_record_stream(x, u1) == 0);
    NEED(tally_graph_pool_begin(0, 3, 1, only_stream, s) == 0);
    NEED(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    void *g = tally_malloc(2 << 20, 0, s); /* tally sees the capture */
    NEED(g != NULL);
    tally_free(x); /* deferred: its use's event waits for the capture's end */
    long long records = cu_calls("cuEventRecord");
    for (int i = 0; i < 4; i++) {
        void *h = tally_malloc(2 << 20, 0, s);
        NEED(h != NULL);
        tally_free(h);
    }
    void *other = tally_malloc(1 << 20, 0, side); /* x's size and stream: not x, still deferred */
    NEED(other != NULL && other != x);
    NEED(cu_calls("cuEventRecord") == records);
    tally_free(g);
    end_ok(s);
    NEED(cu_calls("cuEventRecord") == records);
    NEED(tally_graph_pool_end(0, 3, 1) == 0);
    NEED(records < 0 || cu_calls("cuEventRecord") == records + 1); /* x's one use, on u1 */
    NEED(cu.cuStreamSynchronize(u1) == CUDA_SUCCESS);
    void *again = tally_malloc(1 << 20, 0, side);
    NEED(again == x); /* back in its pool once u1's work is done */
    tally_free(again);
    tally_free(other);
    NEED(tally_graph_pool_release(0, 3, 1) == 0);
    NEED(tally_check() == 0);
}

CAPTURE_TEST(test_cuda_capture_defers_events_to_its_end, cuda_env, body_cuda_capture_defers_events)

/* ---- 3: record_stream on a capturing stream ---------------------------------------------------------- */
/* The stream's device comes from cuStreamGetCtx, not cuStreamGetDevice
 * (refused during a capture on some drivers, invalidating it); the use is
 * kept: the block is not reused before the stream's work is done. */
static void body_record_in_capture(int fd)
{
    (void)fd;
    start_driver();
    CUstream s = new_stream(0), t = new_stream(0);
    void *x = tally_malloc(1 << 20, 0, t);
    NEED(x != NULL);
    NEED(tally_graph_pool_begin(0, 1, 1, only_stream, s) == 0);
    NEED(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    cu_calls_reset();
    NEED(tally_record_stream(x, s) == 0);
    if (cu_is_standin()) /* cuStreamGetCtx only: the primary context names device 0 */
        NEED(cu_calls("cuStreamGetDevice") == 0 && cu_calls(NULL) == 1);
    /* Its CUDA 12.5 form where the driver has it (green contexts' streams too). */
    NEED((tally__cu.cuStreamGetCtx_v2 != NULL) == (cu_driver_version >= TALLY_CU_STREAM_GET_CTX_V2));
    tally_free(x); /* its use is captured work: held until the capture ends */
    NEED(status_of(s) == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    end_ok(s);
    NEED(tally_graph_pool_end(0, 1, 1) == 0);
    NEED(tally_graph_pool_release(0, 1, 1) == 0);
    NEED(tally_check() == 0);
}

static const char *const old_driver_env[] = {"CUDA_STANDIN_DEVICES", "2", "CUDA_STANDIN_DRIVER_VERSION", "12000",
                                            "TALLY_CONF", "backend:cuda,leak_report:off", NULL};

static void test_capture_record_stream_keeps_capture(void **state)
{
    (void)state;
    expect_child_ok(cuda_env, body_record_in_capture);
    expect_child_ok(old_driver_env, body_record_in_capture); /* the 9.2 form (a real driver ignores the variable) */
}

/* ---- 4: out of memory during a capture ------------------------------------------------------------------ */
/* An allocation that does not fit while a graph is captured fails cleanly
 * (an OOM), frees no cached segment (cuMemFree may synchronise; PyTorch
 * releases nothing during a capture) and keeps the capture; neither
 * empty_cache nor the release of an earlier graph's pool frees anything
 * then. */
static void body_capture_oom(int fd)
{
    (void)fd;
    start_driver();
    CUstream s = new_stream(0), other = new_stream(0);
    void *cached = tally_malloc(100 << 20, 0, s);
    NEED(cached != NULL);
    tally_free(cached); /* a cached segment an OOM could release */
    NEED(tally_graph_pool_begin(0, 2, 2, only_stream, other) == 0); /* an earlier graph's pool */
    void *old = tally_malloc(1 << 20, 0, other);
    NEED(old != NULL);
    tally_free(old);
    NEED(tally_graph_pool_end(0, 2, 2) == 0);
    size_t free_b = 0, total = 0;
    NEED(tally_mem_get_info(0, &free_b, &total) == 0);
    tally_stats_t before = stats0();
    NEED(tally_graph_pool_begin(0, 1, 1, only_stream, s) == 0);
    NEED(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    cu_calls_reset();
    NEED(tally_malloc(free_b + (40 << 20), 0, s) == NULL); /* fits only if the cached segment went */
    NEED(tally_empty_cache(0) == 0);
    NEED(tally_graph_pool_release(0, 2, 2) == 0); /* the earlier graph destroyed: its segment stays for now */
    if (cu_is_standin())
        NEED(cu_calls("cuMemFree") == 0);
    tally_stats_t after = stats0();
    NEED(after.reserved_bytes[TALLY_POOL_ALL].current == before.reserved_bytes[TALLY_POOL_ALL].current);
    NEED(status_of(s) == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    end_ok(s);
    NEED(tally_graph_pool_end(0, 1, 1) == 0);
    NEED(tally_graph_pool_release(0, 1, 1) == 0);
    NEED(tally_empty_cache(0) >= (102 << 20)); /* after the capture both go */
    NEED(tally_check() == 0);
}

static const char *const body_capture_oom_env[] = {"CUDA_STANDIN_DEVICES", "2", "CUDA_STANDIN_MEMORY", "1G",
                                                   "TALLY_CONF", "backend:cuda,leak_report:off", NULL};
CAPTURE_TEST(test_capture_oom_frees_nothing, body_capture_oom_env, body_capture_oom)

/* ---- 5: unmaps wait for the pages' streams only --------------------------------------------------------- */
static atomic_int emptied;

static void *empty_in_thread(void *arg)
{
    (void)arg;
    tally_empty_cache(0);
    atomic_store(&emptied, 1);
    return NULL;
}

/* Expandable pages are given back while an unrelated non-blocking stream of
 * the device (NCCL's, say) still has work queued: the unmap waits for the
 * stream that used the pages, not for the whole device. */
static void body_unmap_users_only(int fd)
{
    (void)fd;
    start_driver();
    CUstream s = new_stream(0), unrelated = new_stream(0);
    void *p = tally_malloc(4 * MiB, 0, s);
    NEED(p != NULL);
    tally_free(p);
    struct cu_hold *h = cu_hold(unrelated);
    NEED(h != NULL);
    cu_calls_reset();
    pthread_t t;
    NEED(pthread_create(&t, NULL, empty_in_thread, NULL) == 0);
    double until = now_s() + 5;
    while (!atomic_load(&emptied) && now_s() < until)
        usleep(10000);
    bool done = atomic_load(&emptied) != 0;
    cu_release(h);
    NEED(pthread_join(t, NULL) == 0);
    NEED(done); /* it did not wait for the unrelated stream */
    if (cu_is_standin())
        NEED(cu_calls("cuCtxSynchronize") == 0);
    NEED(stats0().reserved_bytes[TALLY_POOL_ALL].current == 0);
}

static const char *const body_unmap_users_only_env[] = {"CUDA_STANDIN_DEVICES", "2", "TALLY_CONF",
                               "backend:cuda,expandable_segments:true,leak_report:off", NULL};
CAPTURE_TEST(test_unmap_waits_only_for_users, body_unmap_users_only_env, body_unmap_users_only)

/* ---- 6: the cached path makes no driver call -------------------------------------------------------------- */
/* Once captures are announced (PyTorch's graph-pool hooks, or
 * tally_graph_pool_begin from C), a malloc and free served from the cache
 * outside a capture make no driver call at all, whichever context is
 * current; before any announcement, one (cuStreamIsCapturing). */
static void body_cached_path(int fd)
{
    (void)fd;
    start_driver();
    CUstream s = new_stream(0);
    void *warm = tally_malloc(1 << 20, 0, s);
    NEED(warm != NULL);
    tally_free(warm);
    /* No capture announced yet: tally looks for one itself, one call per
     * allocation (docs/pytorch.md, "CUDA graphs"). */
    cu_calls_reset();
    for (int i = 0; i < 100; i++) {
        void *p = tally_malloc(1 << 20, 0, s);
        NEED(p == warm);
        tally_free(p);
    }
    if (cu_is_standin())
        NEED(cu_calls(NULL) == 100 && cu_calls("cuStreamIsCapturing") == 100);
    NEED(tally_graph_pool_begin(0, 1, 1, only_stream, s) == 0);
    NEED(tally_graph_pool_end(0, 1, 1) == 0);
    NEED(tally_graph_pool_release(0, 1, 1) == 0);
    CUcontext other = NULL;
    int ndev = 0;
    NEED(cu.cuDeviceGetCount(&ndev) == CUDA_SUCCESS);
    if (ndev > 1)
        NEED(cu.cuDevicePrimaryCtxRetain(&other, 1) == CUDA_SUCCESS);
    for (int round = 0; round < (other ? 2 : 1); round++) {
        if (round == 1)
            NEED(cu.cuCtxPushCurrent(other) == CUDA_SUCCESS); /* another device's context current */
        cu_calls_reset();
        for (int i = 0; i < 100; i++) {
            void *p = tally_malloc(1 << 20, 0, s);
            NEED(p == warm);
            tally_free(p);
        }
        long long calls = cu_calls(NULL);
        if (calls > 0)
            fprintf(stderr, "round %d: %lld driver calls (cuCtxGetCurrent %lld, cuStreamIsCapturing %lld)\n", round,
                    calls, cu_calls("cuCtxGetCurrent"), cu_calls("cuStreamIsCapturing"));
        NEED(calls <= 0);
    }
    if (other)
        NEED(cu.cuCtxPopCurrent(&other) == CUDA_SUCCESS);
    NEED(tally_check() == 0);
}

CAPTURE_TEST(test_cached_path_makes_no_driver_call, cuda_env, body_cached_path)

/* tally_graph_captures_announced (what tally.install() calls once PyTorch's
 * graph-pool hooks are set): from the first allocation on, the cached path
 * makes no driver call, on the NULL stream (before: four per allocation,
 * cuCtxGetCurrent, push, cuStreamIsCapturing, pop) as on a created one. */
static void body_announced_from_the_start(int fd)
{
    (void)fd;
    tally_graph_captures_announced();
    NEED(!tally_backend_started()); /* a promise, not a start */
    start_driver();
    CUstream s = new_stream(0);
    void *streams[2] = {NULL, s};
    for (int k = 0; k < 2; k++) {
        void *warm = tally_malloc(1 << 20, 0, streams[k]);
        NEED(warm != NULL);
        tally_free(warm);
        cu_calls_reset();
        for (int i = 0; i < 100; i++) {
            void *p = tally_malloc(1 << 20, 0, streams[k]);
            NEED(p == warm);
            tally_free(p);
        }
        long long calls = cu_calls(NULL);
        if (calls > 0)
            fprintf(stderr, "%s stream: %lld driver calls (cuCtxGetCurrent %lld, cuStreamIsCapturing %lld)\n",
                    k ? "a created" : "the NULL", calls, cu_calls("cuCtxGetCurrent"), cu_calls("cuStreamIsCapturing"));
        NEED(calls <= 0);
    }
    NEED(tally_check() == 0);
}

CAPTURE_TEST(test_announced_captures_cached_path_makes_no_driver_call, cuda_env, body_announced_from_the_start)

/* ---- 7: RDMA-capable pages ---------------------------------------------------------------------------------- */
static void body_rdma(int fd)
{
    (void)fd;
    start_driver();
    CUstream s = new_stream(0);
    void *p = tally_malloc(4 * MiB, 0, s);
    NEED(p != NULL);
    void *sym = dlsym(cu_lib, "cuda_standin_rdma_creates");
    NEED(sym != NULL);
    unsigned long long (*creates)(void) = NULL;
    memcpy(&creates, &sym, sizeof sym);
    int rdma = -1;
    NEED(cu.cuDeviceGetAttribute(&rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, 0) ==
         CUDA_SUCCESS);
    if (rdma)
        NEED(creates() > 0); /* cuMemCreate asked for gpuDirectRDMACapable */
    else
        NEED(creates() == 0);
    tally_free(p);
}

static void test_vmm_pages_ask_for_rdma(void **state)
{
    (void)state;
    if (!getenv("TALLY_REAL_CUDA") || strcmp(getenv("TALLY_REAL_CUDA"), "1") != 0) {
        const char *const yes[] = {"CUDA_STANDIN_DEVICES", "2", "TALLY_CONF",
                                   "backend:cuda,expandable_segments:true,leak_report:off", NULL};
        expect_child_ok(yes, body_rdma);
        const char *const no[] = {"CUDA_STANDIN_DEVICES", "2", "CUDA_STANDIN_VMM_RDMA", "0", "TALLY_CONF",
                                  "backend:cuda,expandable_segments:true,leak_report:off", NULL};
        expect_child_ok(no, body_rdma);
        return;
    }
    SKIP("the real driver counts no cuMemCreate flags (the stand-in does)");
}

/* ---- 8: record_stream with the NULL stream ------------------------------------------------------------------- */
static char sunk[4096];
static size_t nsunk;

static void sink(void *arg, const char *text, size_t len)
{
    (void)arg;
    if (nsunk + len < sizeof sunk) {
        memcpy(sunk + nsunk, text, len);
        nsunk += len;
        sunk[nsunk] = 0;
    }
}

/* The NULL stream is the default stream of whichever device is current: a
 * block of device 0 recorded on it while device 1 is current is used on
 * device 1's stream, which is said. */
static void body_null_stream(int fd)
{
    (void)fd;
    start_driver();
    tally_set_sink(sink, NULL);
    CUstream s = new_stream(0);
    void *x = tally_malloc(1 << 20, 0, s);
    NEED(x != NULL);
    CUcontext c1 = NULL, popped = NULL;
    NEED(cu.cuDevicePrimaryCtxRetain(&c1, 1) == CUDA_SUCCESS);
    NEED(cu.cuCtxPushCurrent(c1) == CUDA_SUCCESS);
    NEED(tally_record_stream(x, NULL) == 0);
    NEED(cu.cuCtxPopCurrent(&popped) == CUDA_SUCCESS);
    if (!strstr(sunk, "NULL stream") || !strstr(sunk, "device 1")) {
        fprintf(stderr, "no warning; the sink had: '%s'\n", sunk);
        _exit(1);
    }
    tally_free(x);
    tally_set_sink(NULL, NULL);
}

static void test_record_null_stream_other_device_warns(void **state)
{
    (void)state;
    if (driver_devices() < 2)
        SKIP("needs 2 devices, the driver has %d", driver_devices());
    expect_child_ok(cuda_env, body_null_stream);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_capture_other_thread_allocates),
        cmocka_unit_test(test_capture_same_thread_other_stream),
        cmocka_unit_test(test_async_capture_defers_frees),
        cmocka_unit_test(test_cuda_capture_defers_events_to_its_end),
        cmocka_unit_test(test_capture_record_stream_keeps_capture),
        cmocka_unit_test(test_capture_oom_frees_nothing),
        cmocka_unit_test(test_unmap_waits_only_for_users),
        cmocka_unit_test(test_cached_path_makes_no_driver_call),
        cmocka_unit_test(test_announced_captures_cached_path_makes_no_driver_call),
        cmocka_unit_test(test_vmm_pages_ask_for_rdma),
        cmocka_unit_test(test_record_null_stream_other_device_warns),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
