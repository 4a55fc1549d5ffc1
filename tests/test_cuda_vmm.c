/* Expandable segments on the cuda backend (lib/cuda/vmm.c: CUDA's virtual
 * memory management API). `make test` runs them against the CUDA stand-in;
 * with TALLY_REAL_CUDA=1 on a GPU machine they run against the real driver
 * (figures the stand-in fixes exactly, such as the driver's free memory
 * after a map, are compared exactly only on the stand-in).
 *
 *   map, unmap (a sub-range of one map call), refusals   test_vmm_backend_*
 *   a device without virtual memory management            test_vmm_unsupported_device_refused
 *   peers granted access (tally_pool_peer_access)         test_vmm_peer_access
 *   idle pages moving, release by empty_cache             test_vmm_idle_pages_and_release
 *   out of memory inside a range                          test_vmm_oom_inside_range
 *   every trace of ../shared/traces (TALLY_TRACES to      test_vmm_replay_*
 *   choose another folder): the same peak reserved, to
 *   the byte, and the same backend calls, through the
 *   cuda backend on the stand-in as through the host
 *   backend (virtual mode), expandable and default.
 *
 * Each body runs in a forked child with its own environment: the backend
 * is chosen once per process and CUDA must not start before a fork. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cudautil.h"
#include "cuda/vmm.h"
#include "tally.h"
#include "trace.h"

#define MiB ((size_t)1 << 20)
#define PAGE (2 * MiB)

/* In a child: a failed expectation ends it with status 1 and one line. */
#define NEED(cond)                                                                                                 \
    do {                                                                                                           \
        if (!(cond)) {                                                                                             \
            fprintf(stderr, "test_cuda_vmm: line %d: %s (tally: %s)\n", __LINE__, #cond, tally_last_error());      \
            _exit(1);                                                                                              \
        }                                                                                                          \
    } while (0)

/* Run body in a child with the environment pairs env (NULL-ended) set;
 * returns its exit status (-1 for a signal). out: a pipe's write end the
 * child may write to, read back into buf (up to len bytes). */
static int run_child(const char *const *env, void (*body)(int fd), void *buf, size_t len)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        for (size_t i = 0; env[i]; i += 2)
            setenv(env[i], env[i + 1], 1);
        alarm(300);
        body(fds[1]);
        close(fds[1]);
        _exit(0);
    }
    close(fds[1]);
    size_t got = 0;
    ssize_t k;
    while (buf && got < len && (k = read(fds[0], (char *)buf + got, len - got)) > 0)
        got += (size_t)k;
    close(fds[0]);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void expect_child_ok(const char *const *env, void (*body)(int fd))
{
    int st = run_child(env, body, NULL, 0);
    if (st != 0)
        fail_msg("child ended with status %d (see its line above)", st);
}

static void start_driver(void)
{
    if (cu_load()) {
        fprintf(stderr, "test_cuda_vmm: %s\n", cu_load_error);
        _exit(1);
    }
    NEED(cu.cuInit(0) == CUDA_SUCCESS);
}

/* Device 0's free memory as the driver reports it (through tally, in its
 * primary context). */
static size_t driver_free(void)
{
    size_t free_b = 0, total = 0;
    NEED(tally_mem_get_info(0, &free_b, &total) == 0);
    return free_b;
}

/* The driver's free memory dropped by exactly `bytes` since `base` (on a
 * GPU: at least that much; page tables cost some too). */
static bool used_since(size_t base, size_t bytes)
{
    size_t now = driver_free();
    return cu_is_standin() ? base - now == bytes : base - now >= bytes;
}

static tally_stats_t stats0(void)
{
    tally_stats_t s;
    NEED(tally_get_stats(0, &s) == 0);
    return s;
}

/* ---- the backend functions themselves ----------------------------------------- */

static void body_backend_map_unmap(int fd)
{
    (void)fd;
    start_driver();
    NEED(tally_init() == 0);
    const tally_backend_t *be = &tally__backend_cuda;
    char why[256] = "";
    size_t base = driver_free();
    void *r = NULL;
    NEED(be->reserve(0, 64 * MiB + 1, &r, why, sizeof why) == 0); /* rounded up to 66 MiB */
    NEED(r != NULL && (uintptr_t)r % PAGE == 0);
    NEED(used_since(base, 0) || !cu_is_standin());
    char *p = r;
    NEED(be->map(0, p, 3 * PAGE, why, sizeof why) == 0);
    NEED(used_since(base, 3 * PAGE));
    NEED(tally__cu_vmm_mapped_bytes(0) == 3 * PAGE);
    /* Give back the middle page of what one call mapped. */
    NEED(be->unmap(0, p + PAGE, PAGE) == 0);
    NEED(used_since(base, 2 * PAGE));
    NEED(tally__cu_vmm_mapped_bytes(0) == 2 * PAGE);
    /* Refusals, each one line naming the problem; nothing changes. */
    NEED(be->map(0, p, 2 * PAGE, why, sizeof why) == TALLY_EBACKEND);
    NEED(strstr(why, "is already mapped") != NULL);
    NEED(be->map(0, p + 4096, PAGE, why, sizeof why) == TALLY_EBACKEND);
    NEED(strstr(why, "whole number of 2 MiB pages") != NULL);
    NEED(be->map(0, p + 66 * MiB, PAGE, why, sizeof why) == TALLY_EBACKEND);
    NEED(strstr(why, "not inside a reservation of device 0") != NULL);
    NEED(tally__cu_vmm_mapped_bytes(0) == 2 * PAGE);
    /* The hole maps again; the last page of the range too. */
    NEED(be->map(0, p + PAGE, PAGE, why, sizeof why) == 0);
    NEED(be->map(0, p + 64 * MiB, PAGE, why, sizeof why) == 0);
    NEED(used_since(base, 4 * PAGE));
    /* An unmap over mapped and unmapped pages unmaps the mapped ones. */
    NEED(be->unmap(0, p + 2 * PAGE, 10 * PAGE) == 0);
    NEED(tally__cu_vmm_mapped_bytes(0) == 3 * PAGE);
    /* The caller had no current context and still has none. */
    CUcontext cur = (CUcontext)1;
    NEED(cu.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == NULL);
    /* unreserve unmaps what is left: all the memory comes back. */
    NEED(be->unreserve(0, r, 66 * MiB) == 0);
    NEED(tally__cu_vmm_mapped_bytes(0) == 0);
    NEED(used_since(base, 0) || !cu_is_standin());
    NEED(be->unreserve(0, r, 66 * MiB) == TALLY_EBACKEND);
    NEED(strstr(tally_last_error(), "is not a reservation") != NULL);
}

static const char *const env_cuda[] = {"CUDA_STANDIN_DEVICES", "1", "TALLY_CONF", "backend:cuda,leak_report:off", NULL};

static void test_vmm_backend_map_unmap(void **state)
{
    (void)state;
    expect_child_ok(env_cuda, body_backend_map_unmap);
}

/* Without expandable_segments the async backend (no page mapping) is still
 * refused at initialisation; cuda is accepted. */
static void body_async_refused(int fd)
{
    (void)fd;
    NEED(tally_init() != 0);
    NEED(strstr(tally_last_error(), "expandable_segments: backend async cannot map pages") != NULL);
}

static void body_cuda_accepted(int fd)
{
    (void)fd;
    NEED(tally_init() == 0);
    NEED(strcmp(tally_backend_name(), "cuda") == 0);
}

static void test_vmm_backend_accepted_by_cuda_only(void **state)
{
    (void)state;
    const char *const async[] = {"TALLY_CONF", "backend:async,expandable_segments:true,leak_report:off", NULL};
    const char *const cuda[] = {"TALLY_CONF", "backend:cuda,expandable_segments:true,leak_report:off", NULL};
    expect_child_ok(async, body_async_refused);
    expect_child_ok(cuda, body_cuda_accepted);
}

/* A device without virtual memory management, or with a granularity that
 * does not divide the 2 MiB page: the driver's answer is replaced in the
 * library's own table of entry points (linked statically here). The first
 * large allocation fails with one line saying why; small ones still work. */
static tally_pfn_cuDeviceGetAttribute real_get_attribute;
static tally_pfn_cuMemGetAllocationGranularity real_granularity;

static CUresult no_vmm_attribute(int *value, CUdevice_attribute attrib, CUdevice dev)
{
    CUresult r = real_get_attribute(value, attrib, dev);
    if (r == CUDA_SUCCESS && attrib == CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)
        *value = 0;
    return r;
}

static CUresult odd_granularity(size_t *granularity, const CUmemAllocationProp *prop,
                                CUmemAllocationGranularity_flags option)
{
    CUresult r = real_granularity(granularity, prop, option);
    if (r == CUDA_SUCCESS)
        *granularity = 3 * MiB;
    return r;
}

static void refused_then_small_works(const char *reason)
{
    NEED(tally_malloc(40 * MiB, 0, NULL) == NULL);
    NEED(strstr(tally_last_error(), reason) != NULL);
    NEED(strstr(tally_last_error(), "expandable_segments cannot be used on device 0") != NULL);
    void *small = tally_malloc(1 * MiB, 0, NULL);
    NEED(small != NULL);
    tally_free(small);
    NEED(tally__cu_vmm_mapped_bytes(0) == 0);
    NEED(tally_check() == 0);
}

static void body_no_vmm(int fd)
{
    (void)fd;
    NEED(tally_init() == 0);
    real_get_attribute = tally__cu.cuDeviceGetAttribute;
    tally__cu.cuDeviceGetAttribute = no_vmm_attribute;
    refused_then_small_works("no virtual memory management (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED "
                             "is 0)");
}

static void body_odd_granularity(int fd)
{
    (void)fd;
    NEED(tally_init() == 0);
    real_granularity = tally__cu.cuMemGetAllocationGranularity;
    tally__cu.cuMemGetAllocationGranularity = odd_granularity;
    refused_then_small_works("allocation granularity 3145728 bytes does not divide the 2 MiB page");
}

static void test_vmm_unsupported_device_refused(void **state)
{
    (void)state;
    const char *const env[] = {"CUDA_STANDIN_DEVICES", "1", "TALLY_CONF",
                               "backend:cuda,expandable_segments:true,leak_report:off", NULL};
    expect_child_ok(env, body_no_vmm);
    expect_child_ok(env, body_odd_granularity);
}

/* Peers: tally_pool_peer_access grants a peer the pages mapped so far (one
 * cuMemSetAccess per run, for the peer alone) and every later map sets
 * access for the device and its peers in one call; a peer the driver says
 * cannot reach the device is refused; no peer gets a context from tally.
 * The stand-in checks access descriptors without enforcing them, so the
 * calls are watched through the library's entry-point table. */
static uint64_t access_mask;  /* devices of the last cuMemSetAccess */
static size_t access_bytes;   /* bytes covered since the count was reset */
static tally_pfn_cuMemSetAccess real_set_access;
static tally_pfn_cuDeviceCanAccessPeer real_can_access;

static CUresult watch_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    access_mask = 0;
    for (size_t i = 0; i < count; i++)
        access_mask |= (uint64_t)1 << desc[i].location.id;
    access_bytes += size;
    return real_set_access(ptr, size, desc, count);
}

static CUresult never_peer(int *can, CUdevice dev, CUdevice peer)
{
    CUresult r = real_can_access(can, dev, peer);
    if (r == CUDA_SUCCESS)
        *can = 0;
    return r;
}

static void body_peer_access(int fd)
{
    (void)fd;
    start_driver();
    NEED(tally_init() == 0);
    if (tally_device_count() < 3)
        _exit(77);
    real_set_access = tally__cu.cuMemSetAccess;
    tally__cu.cuMemSetAccess = watch_access;
    void *a = tally_malloc(40 * MiB, 0, NULL);
    NEED(a != NULL && access_mask == 1);
    access_bytes = 0;
    NEED(tally_pool_peer_access(0, 1) == 0);
    NEED(access_mask == 2 && access_bytes == tally__cu_vmm_mapped_bytes(0));
    void *b = tally_malloc(40 * MiB, 0, NULL);
    NEED(b != NULL && access_mask == 3);
    real_can_access = tally__cu.cuDeviceCanAccessPeer;
    tally__cu.cuDeviceCanAccessPeer = never_peer;
    NEED(tally_pool_peer_access(0, 2) == -TALLY_EBACKEND);
    NEED(strstr(tally_last_error(), "device 2 cannot access device 0's memory (cuDeviceCanAccessPeer is 0)") != NULL);
    tally_free(a);
    NEED(tally_empty_cache(0) > 0);
    void *c = tally_malloc(60 * MiB, 0, NULL);
    NEED(c != NULL && access_mask == 3); /* device 2 was not added */
    NEED(cu_ctx_active(1) == 0 && cu_ctx_active(2) == 0);
    tally_free(b);
    tally_free(c);
    NEED(tally_check() == 0);
}

static void test_vmm_peer_access(void **state)
{
    (void)state;
    const char *const env[] = {"CUDA_STANDIN_DEVICES", "3", "TALLY_CONF",
                               "backend:cuda,expandable_segments:true,leak_report:off", NULL};
    int st = run_child(env, body_peer_access, NULL, 0);
    if (st == 77) {
        fprintf(stderr, "test_cuda_vmm: skipped: peer access needs 3 devices\n");
        skip();
    }
    if (st != 0)
        fail_msg("child ended with status %d (see its line above)", st);
}

/* ---- through the cache ------------------------------------------------------------ */

/* tally's reserved memory, the pages vmm.c has mapped and (on the
 * stand-in) what the driver has handed out all agree. */
static void agree(size_t base)
{
    tally_stats_t s = stats0();
    NEED((size_t)s.reserved_bytes[TALLY_POOL_LARGE].current == tally__cu_vmm_mapped_bytes(0));
    NEED(used_since(base, (size_t)s.reserved_bytes[TALLY_POOL_ALL].current));
    NEED(tally_check() == 0);
}

static void body_idle_pages_and_release(int fd)
{
    (void)fd;
    start_driver();
    size_t base = driver_free();
    void *a = tally_malloc(40 * MiB, 0, NULL), *b = tally_malloc(40 * MiB, 0, NULL);
    NEED(a && b);
    agree(base);
    NEED(stats0().reserved_bytes[TALLY_POOL_LARGE].current == (int64_t)(80 * MiB));
    tally_free(a); /* its pages go idle and stay mapped */
    agree(base);
    NEED(stats0().reserved_bytes[TALLY_POOL_LARGE].current == (int64_t)(80 * MiB));
    /* 60 MiB does not fit a's hole: placed after b, a's idle pages are
     * unmapped to make room, so the peak stays under 80 + 60 MiB. */
    void *c = tally_malloc(60 * MiB, 0, NULL);
    NEED(c != NULL && (char *)c >= (char *)b + 40 * MiB);
    agree(base);
    tally_stats_t s = stats0();
    NEED(s.reserved_bytes[TALLY_POOL_LARGE].peak < (int64_t)(140 * MiB));
    NEED(s.reserved_bytes[TALLY_POOL_LARGE].current >= (int64_t)(100 * MiB));
    /* A block on idle pages needs no new pages. */
    int64_t maps = s.num_device_alloc;
    tally_free(c);
    void *d = tally_malloc(60 * MiB, 0, NULL);
    NEED(d == c);
    agree(base);
    NEED(stats0().num_device_alloc == maps);
    tally_free(b);
    tally_free(d);
    /* empty_cache gives every page back, and the range: the driver's free
     * memory is what it was. */
    NEED(tally_empty_cache(0) > 0);
    s = stats0();
    NEED(s.reserved_bytes[TALLY_POOL_ALL].current == 0);
    NEED(s.segment[TALLY_POOL_ALL].current == 0);
    agree(base);
    NEED(used_since(base, 0));
}

static void test_vmm_idle_pages_and_release(void **state)
{
    (void)state;
    const char *const env[] = {"CUDA_STANDIN_DEVICES", "1", "TALLY_CONF",
                               "backend:cuda,expandable_segments:true,leak_report:off", NULL};
    expect_child_ok(env, body_idle_pages_and_release);
}

/* The device fills up inside the range: cuMemCreate's out of memory is an
 * OOM (counted, retried after releasing the cache, reported naming the
 * call), nothing of the failed map stays mapped, and the memory of a freed
 * block serves the next request. */
static void body_oom_inside_range(int fd)
{
    (void)fd;
    start_driver();
    size_t base = driver_free();
    size_t half = base / 2 / PAGE * PAGE;
    void *p = tally_malloc(half, 0, NULL);
    NEED(p != NULL);
    agree(base);
    tally_stats_t before = stats0();
    NEED(tally_malloc(half + 64 * MiB, 0, NULL) == NULL);
    NEED(strstr(tally_last_error(), "out of memory on device 0") != NULL);
    NEED(strstr(tally_last_error(), "cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY") != NULL);
    tally_stats_t after = stats0();
    NEED(after.num_ooms == before.num_ooms + 1);
    NEED(after.num_alloc_retries == before.num_alloc_retries + 1);
    NEED(after.reserved_bytes[TALLY_POOL_ALL].current == before.reserved_bytes[TALLY_POOL_ALL].current);
    agree(base);
    tally_free(p);
    void *q = tally_malloc(half + 64 * MiB, 0, NULL);
    NEED(q != NULL);
    agree(base);
    tally_free(q);
    tally_empty_cache(0);
    agree(base);
}

static void test_vmm_oom_inside_range(void **state)
{
    (void)state;
    const char *const env[] = {"CUDA_STANDIN_DEVICES", "1", "CUDA_STANDIN_MEMORY", "1G", "TALLY_CONF",
                               "backend:cuda,expandable_segments:true,leak_report:off", NULL};
    expect_child_ok(env, body_oom_inside_range);
}

/* ---- replay of the shared traces ---------------------------------------------------- */

enum { MAX_TRACES = 32 };

typedef struct figures {
    int64_t peak_reserved, peak_allocated, backend_allocs, backend_frees, failed;
    /* cuda only: driver calls (cuMemCreate, cuMemMap, cuMemRelease,
     * cuMemSetAccess, cuMemUnmap, cuCtxSynchronize, cuMemAlloc, cuMemFree) */
    int64_t calls[8];
} figures_t;

/* Driver calls of the cuda child, counted by wrappers put in the library's
 * entry-point table over the driver's own. */
enum { C_CREATE, C_MAP, C_RELEASE, C_ACCESS, C_UNMAP, C_SYNC, C_ALLOC, C_FREE };
static int64_t calls[8];
static struct cu_api real;

static CUresult count_create(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                             unsigned long long flags)
{
    calls[C_CREATE]++;
    return real.cuMemCreate(h, size, prop, flags);
}

static CUresult count_map(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                          unsigned long long flags)
{
    calls[C_MAP]++;
    return real.cuMemMap(ptr, size, offset, h, flags);
}

static CUresult count_release(CUmemGenericAllocationHandle h)
{
    calls[C_RELEASE]++;
    return real.cuMemRelease(h);
}

static CUresult count_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    calls[C_ACCESS]++;
    return real.cuMemSetAccess(ptr, size, desc, count);
}

static CUresult count_unmap(CUdeviceptr ptr, size_t size)
{
    calls[C_UNMAP]++;
    return real.cuMemUnmap(ptr, size);
}

static CUresult count_sync(void)
{
    calls[C_SYNC]++;
    return real.cuCtxSynchronize();
}

static CUresult count_alloc(CUdeviceptr *p, size_t size)
{
    calls[C_ALLOC]++;
    return real.cuMemAlloc(p, size);
}

static CUresult count_free(CUdeviceptr p)
{
    calls[C_FREE]++;
    return real.cuMemFree(p);
}

static void count_driver_calls(void)
{
    real.cuMemCreate = tally__cu.cuMemCreate;
    real.cuMemMap = tally__cu.cuMemMap;
    real.cuMemRelease = tally__cu.cuMemRelease;
    real.cuMemSetAccess = tally__cu.cuMemSetAccess;
    real.cuMemUnmap = tally__cu.cuMemUnmap;
    real.cuCtxSynchronize = tally__cu.cuCtxSynchronize;
    real.cuMemAlloc = tally__cu.cuMemAlloc;
    real.cuMemFree = tally__cu.cuMemFree;
    tally__cu.cuMemCreate = count_create;
    tally__cu.cuMemMap = count_map;
    tally__cu.cuMemRelease = count_release;
    tally__cu.cuMemSetAccess = count_access;
    tally__cu.cuMemUnmap = count_unmap;
    tally__cu.cuCtxSynchronize = count_sync;
    tally__cu.cuMemAlloc = count_alloc;
    tally__cu.cuMemFree = count_free;
}

/* Stream of dense index i: on host any distinct pointer, on cuda a real
 * stream of device 0 (made once); the trace's stream 0 is NULL on both. */
static void *trace_stream(bool cuda, long long id, unsigned i)
{
    static CUstream made[64];
    if (id == 0)
        return NULL;
    if (!cuda)
        return (void *)(uintptr_t)(0x1000u + i);
    if (!made[i]) {
        CUdevice dev;
        CUcontext ctx, popped;
        start_driver();
        NEED(cu.cuDeviceGet(&dev, 0) == CUDA_SUCCESS && cu.cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS);
        NEED(cu.cuCtxPushCurrent(ctx) == CUDA_SUCCESS);
        NEED(cu.cuStreamCreate(&made[i], CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
        NEED(cu.cuCtxPopCurrent(&popped) == CUDA_SUCCESS);
    }
    return made[i];
}

static const char *traces_dir(void)
{
    const char *d = getenv("TALLY_TRACES");
    return d && *d ? d : "../shared/traces";
}

/* Replays every trace on device 0, one after the other from an empty
 * cache, writing one figures_t per trace to fd. */
static void body_replay(int fd)
{
    char **paths = NULL, err[512];
    int n = trace_dir_list(traces_dir(), &paths, err, sizeof err);
    if (n < 0) {
        fprintf(stderr, "test_cuda_vmm: %s\n", err);
        _exit(1);
    }
    bool cuda = strstr(getenv("TALLY_CONF"), "backend:cuda") != NULL;
    bool paged = strstr(getenv("TALLY_CONF"), "expandable_segments:true") != NULL;
    NEED(tally_init() == 0);
    if (cuda)
        count_driver_calls();
    for (int i = 0; i < n && i < MAX_TRACES; i++) {
        trace_t t;
        if (trace_load(paths[i], &t, err, sizeof err)) {
            fprintf(stderr, "test_cuda_vmm: %s\n", err);
            _exit(1);
        }
        void **live = calloc(t.nalloc ? t.nalloc : 1, sizeof *live);
        NEED(live != NULL);
        tally_empty_cache(0);
        NEED(tally_reset_peak_stats(0) == 0 && tally_reset_accumulated_stats(0) == 0);
        figures_t f = {0};
        void *streams[64];
        for (unsigned k = 0; k < t.nstreams && k < 64; k++)
            streams[k] = trace_stream(cuda, t.stream_ids[k], k);
        memset(calls, 0, sizeof calls);
        for (size_t e = 0; e < t.nev; e++) {
            const trace_event_t *ev = &t.ev[e];
            void *stream = streams[ev->stream];
            if (ev->op == 'a' && ev->size) {
                live[ev->slot] = tally_malloc(ev->size, 0, stream);
                f.failed += live[ev->slot] == NULL;
            } else if (ev->op == 'f') {
                tally_free(live[ev->slot]);
                live[ev->slot] = NULL;
            }
        }
        tally_stats_t s = stats0();
        if (cuda) /* pages only in the expandable mode */
            NEED(tally__cu_vmm_mapped_bytes(0) == (paged ? (size_t)s.reserved_bytes[TALLY_POOL_LARGE].current : 0));
        NEED(tally_check() == 0);
        f.peak_reserved = s.reserved_bytes[TALLY_POOL_ALL].peak;
        f.peak_allocated = s.allocated_bytes[TALLY_POOL_ALL].peak;
        f.backend_allocs = s.num_device_alloc;
        f.backend_frees = s.num_device_free;
        memcpy(f.calls, calls, sizeof calls);
        if (cuda) {
            /* The costs docs/architecture.md states: a page is one create,
             * map and release; a map call one cuMemSetAccess; an unmap call
             * one synchronise and (no fallback here) one cuMemUnmap. */
            NEED(calls[C_CREATE] == calls[C_MAP] && calls[C_MAP] == calls[C_RELEASE]);
            NEED(calls[C_ACCESS] + calls[C_ALLOC] == f.backend_allocs);
            NEED(calls[C_UNMAP] + calls[C_FREE] == f.backend_frees);
            NEED(calls[C_SYNC] >= calls[C_UNMAP]);
        }
        for (size_t k = 0; k < t.nalloc; k++)
            tally_free(live[k]);
        free(live);
        NEED(write(fd, &f, sizeof f) == (ssize_t)sizeof f);
        trace_free(&t);
        free(paths[i]);
    }
    free(paths);
    tally_empty_cache(0);
    NEED(stats0().reserved_bytes[TALLY_POOL_ALL].current == 0);
    if (cuda)
        NEED(tally__cu_vmm_mapped_bytes(0) == 0);
}

/* Same figures through host (virtual mode) and cuda (the stand-in with as
 * much memory as the host device: the expandable range is the device's
 * size on both). */
static void replay_both(const char *mode)
{
    struct stat st;
    if (stat(traces_dir(), &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "test_cuda_vmm: skipped: no trace folder %s (CI has ../shared/traces beside the repo)\n",
                traces_dir());
        skip();
    }
    char **paths = NULL, err[512];
    int n = trace_dir_list(traces_dir(), &paths, err, sizeof err);
    if (n < 0)
        fail_msg("%s", err);
    if (n > MAX_TRACES)
        n = MAX_TRACES;
    if (n == 0) {
        fprintf(stderr, "test_cuda_vmm: skipped: no .csv trace in %s\n", traces_dir());
        skip();
    }
    char host_conf[256], cuda_conf[256];
    snprintf(host_conf, sizeof host_conf, "backend:host,host_mode:virtual,host_capacity:32GiB,leak_report:off%s", mode);
    snprintf(cuda_conf, sizeof cuda_conf, "backend:cuda,leak_report:off%s", mode);
    const char *const host_env[] = {"TALLY_CONF", host_conf, NULL};
    const char *const cuda_env[] = {"CUDA_STANDIN_DEVICES", "1", "CUDA_STANDIN_MEMORY", "32G", "TALLY_CONF", cuda_conf,
                                    NULL};
    figures_t host[MAX_TRACES], dev[MAX_TRACES];
    memset(host, 0, sizeof host);
    memset(dev, 0, sizeof dev);
    int hs = run_child(host_env, body_replay, host, (size_t)n * sizeof host[0]);
    int cs = run_child(cuda_env, body_replay, dev, (size_t)n * sizeof dev[0]);
    if (hs != 0 || cs != 0)
        fail_msg("replay children ended with status %d (host) and %d (cuda)", hs, cs);
    int bad = 0;
    int64_t pages = 0, driver = 0;
    for (int i = 0; i < n; i++) {
        const char *name = strrchr(paths[i], '/') ? strrchr(paths[i], '/') + 1 : paths[i];
        fprintf(stderr, "test_cuda_vmm: %-36s%s peak reserved host %lld cuda %lld; backend allocs %lld / %lld, "
                        "frees %lld / %lld\n",
                name, mode, (long long)host[i].peak_reserved, (long long)dev[i].peak_reserved,
                (long long)host[i].backend_allocs, (long long)dev[i].backend_allocs, (long long)host[i].backend_frees,
                (long long)dev[i].backend_frees);
        /* Default mode: segments come at different addresses from mmap and
         * from the driver, and the best fit among equal sizes takes the
         * lowest address, so which block is split (and so allocated bytes)
         * may differ; reserved memory and backend calls may not. One
         * expandable range per stream: the same offsets, every figure. */
        bool same = host[i].peak_reserved == dev[i].peak_reserved &&
                    host[i].backend_allocs == dev[i].backend_allocs &&
                    host[i].backend_frees == dev[i].backend_frees &&
                    (!*mode || host[i].peak_allocated == dev[i].peak_allocated);
        const int64_t *c = dev[i].calls;
        fprintf(stderr,
                "test_cuda_vmm: %-36s%s driver calls: %lld pages (cuMemCreate + cuMemMap + cuMemRelease each), "
                "%lld cuMemSetAccess, %lld cuMemUnmap, %lld cuCtxSynchronize, %lld cuMemAlloc, %lld cuMemFree\n",
                name, mode, (long long)c[C_CREATE], (long long)c[C_ACCESS], (long long)c[C_UNMAP],
                (long long)c[C_SYNC], (long long)c[C_ALLOC], (long long)c[C_FREE]);
        pages += c[C_CREATE];
        for (int k = 0; k < 8; k++)
            driver += c[k];
        if (host[i].peak_reserved <= 0 || host[i].failed || dev[i].failed || !same) {
            fprintf(stderr,
                    "test_cuda_vmm: %s: host and cuda differ (peak allocated %lld / %lld, failed allocations %lld / "
                    "%lld)\n",
                    name, (long long)host[i].peak_allocated, (long long)dev[i].peak_allocated,
                    (long long)host[i].failed, (long long)dev[i].failed);
            bad++;
        }
    }
    fprintf(stderr, "test_cuda_vmm: all traces%s: %lld pages mapped, %lld driver calls\n", mode, (long long)pages,
            (long long)driver);
    for (int i = 0; i < n; i++)
        free(paths[i]);
    free(paths);
    if (bad)
        fail_msg("%d trace(s) replay differently through cuda and host", bad);
}

static void test_vmm_replay_expandable_same_as_host(void **state)
{
    (void)state;
    replay_both(",expandable_segments:true");
}

static void test_vmm_replay_default_same_as_host(void **state)
{
    (void)state;
    replay_both("");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vmm_backend_map_unmap),
        cmocka_unit_test(test_vmm_backend_accepted_by_cuda_only),
        cmocka_unit_test(test_vmm_unsupported_device_refused),
        cmocka_unit_test(test_vmm_peer_access),
        cmocka_unit_test(test_vmm_idle_pages_and_release),
        cmocka_unit_test(test_vmm_oom_inside_range),
        cmocka_unit_test(test_vmm_replay_expandable_same_as_host),
        cmocka_unit_test(test_vmm_replay_default_same_as_host),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
