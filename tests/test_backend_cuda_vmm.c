/* Expandable segments on the cuda backend (lib/backend/cuda/vmm.c: CUDA's virtual
 * memory management API). `make test` runs them against the CUDA stand-in;
 * with TALLY_REAL_CUDA=1 on a GPU machine they run against the real driver
 * (figures the stand-in fixes exactly, such as the driver's free memory
 * after a map, are compared exactly only on the stand-in).
 *
 *   map, unmap (a sub-range of one map call),            test_vmm_backend_*
 *   multi-page handles, unmaps that would cut one,
 *   handles kept through a move (keep_handles)
 *   peers granted access (tally_pool_peer_access)         test_vmm_peer_access
 *   idle pages moving, release by empty_cache             test_vmm_idle_pages_and_release
 *   out of memory inside a range                          test_vmm_oom_inside_range
 *   unmapping waits for the device's queued work          test_vmm_unmap_waits_for_work
 *   no unmap while a graph is captured (deferred)         test_vmm_no_unmap_during_capture
 *   the device full during a capture: OOM, capture kept   test_vmm_capture_oom_keeps_capture
 *
 * Refusals (a device without virtual memory management, driver calls that
 * fail) are in test_backend_cuda_vmm_refusals.c; the replay of the shared
 * traces is test_backend_cuda_vmm_replay.c; helpers are in vmmutil.h (each
 * body runs in a forked child) and vmmdriverutil.h. */
#include "vmmutil.h"
#include "vmmdriverutil.h"

#include "core/internal.h"

#include <pthread.h>
#include <stdatomic.h>

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
    NEED(be->map(0, p, 3 * PAGE, PAGE, why, sizeof why) == 0);
    NEED(used_since(base, 3 * PAGE));
    NEED(tally__cu_vmm_mapped_bytes(0) == 3 * PAGE);
    /* Give back the middle page of what one call mapped. */
    NEED(be->unmap(0, p + PAGE, PAGE) == 0);
    NEED(used_since(base, 2 * PAGE));
    NEED(tally__cu_vmm_mapped_bytes(0) == 2 * PAGE);
    /* Refusals, each one line naming the problem; nothing changes. */
    NEED(be->map(0, p, 2 * PAGE, PAGE, why, sizeof why) == TALLY_EBACKEND);
    NEED(strstr(why, "is already mapped") != NULL);
    NEED(be->map(0, p + 4096, PAGE, PAGE, why, sizeof why) == TALLY_EBACKEND);
    NEED(strstr(why, "whole number of 2 MiB pages") != NULL);
    NEED(be->map(0, p + 66 * MiB, PAGE, PAGE, why, sizeof why) == TALLY_EBACKEND);
    NEED(strstr(why, "not inside a reservation of device 0") != NULL);
    NEED(tally__cu_vmm_mapped_bytes(0) == 2 * PAGE);
    /* The hole maps again; the last page of the range too. */
    NEED(be->map(0, p + PAGE, PAGE, PAGE, why, sizeof why) == 0);
    NEED(be->map(0, p + 64 * MiB, PAGE, PAGE, why, sizeof why) == 0);
    NEED(used_since(base, 4 * PAGE));
    /* An unmap over mapped and unmapped pages unmaps the mapped ones. */
    NEED(be->unmap(0, p + 2 * PAGE, 10 * PAGE) == 0);
    NEED(tally__cu_vmm_mapped_bytes(0) == 3 * PAGE);
    /* Handles of several pages: one cuMemCreate + cuMemMap each (the
     * driver's free memory drops by whole handles); an unmap that would cut
     * one is refused before CUDA sees it (cuMemUnmap 'cannot unmap a
     * sub-range'; the stand-in refuses it too); whole handles go. */
    NEED(be->map(0, p + 8 * PAGE, 5 * PAGE, 3 * PAGE, why, sizeof why) == 0); /* handles of 3 and 2 pages */
    NEED(used_since(base, 8 * PAGE));
    NEED(be->map(0, p + 20 * PAGE, PAGE, 3 * MiB, why, sizeof why) == TALLY_EBACKEND);
    NEED(strstr(why, "not a whole number of 2 MiB pages") != NULL);
    NEED(be->unmap(0, p + 9 * PAGE, PAGE) == TALLY_EBACKEND);
    NEED(strstr(tally_last_error(), "would cut a physical handle") != NULL);
    NEED(be->unmap(0, p + 8 * PAGE, 4 * PAGE) == TALLY_EBACKEND);
    NEED(tally__cu_vmm_mapped_bytes(0) == 8 * PAGE);
    NEED(be->unmap(0, p + 11 * PAGE, 2 * PAGE) == 0); /* the second handle alone */
    NEED(used_since(base, 6 * PAGE));
    NEED(be->unmap(0, p + 8 * PAGE, 3 * PAGE) == 0);
    NEED(tally__cu_vmm_mapped_bytes(0) == 3 * PAGE);
    NEED(used_since(base, 3 * PAGE));
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

/* keep_handles: while on, the one-page handles an unmap takes down stay
 * unreleased (their memory still the device's) and the next maps use them
 * instead of cuMemCreate; off releases the rest. A handle of several pages
 * is released as ever. */
static void body_backend_keep_handles(int fd)
{
    (void)fd;
    start_driver();
    NEED(tally_init() == 0);
    const tally_backend_t *be = &tally__backend_cuda;
    NEED(be->keep_handles != NULL);
    char why[256] = "";
    size_t base = driver_free();
    void *r = NULL;
    NEED(be->reserve(0, 32 * MiB, &r, why, sizeof why) == 0);
    char *p = r;
    NEED(be->map(0, p, 3 * PAGE, PAGE, why, sizeof why) == 0);         /* pages 0-2, a handle each */
    NEED(be->map(0, p + 4 * PAGE, 2 * PAGE, 2 * PAGE, why, sizeof why) == 0); /* pages 4-5, one handle */
    NEED(used_since(base, 5 * PAGE));
    bool counted = cu_calls("cuMemCreate") >= 0;
    cu_calls_reset();
    be->keep_handles(0, true);
    NEED(be->unmap(0, p, 3 * PAGE) == 0);
    NEED(be->unmap(0, p + 4 * PAGE, 2 * PAGE) == 0);
    NEED(!counted || cu_calls("cuMemRelease") == 1); /* the two-page handle only */
    NEED(used_since(base, 3 * PAGE));                /* three kept pages */
    NEED(tally__cu_vmm_mapped_bytes(0) == 0);
    /* Two pages mapped elsewhere take two kept handles; the third waits. */
    NEED(be->map(0, p + 10 * PAGE, 2 * PAGE, PAGE, why, sizeof why) == 0);
    NEED(!counted || (cu_calls("cuMemCreate") == 0 && cu_calls("cuMemMap") == 2));
    NEED(used_since(base, 3 * PAGE));
    /* The new mapping has its access set: on the stand-in (host memory,
     * PROT_NONE until cuMemSetAccess) the program can write and read it. */
    if (cu_is_standin()) {
        memset(p + 10 * PAGE, 0x5a, 2 * PAGE);
        NEED(p[10 * PAGE] == 0x5a && p[12 * PAGE - 1] == 0x5a);
    }
    /* A handle of several pages is made anew, the kept one stays. */
    NEED(be->map(0, p + 14 * PAGE, 2 * PAGE, 2 * PAGE, why, sizeof why) == 0);
    NEED(!counted || cu_calls("cuMemCreate") == 1);
    NEED(used_since(base, 5 * PAGE));
    be->keep_handles(0, false); /* the last kept handle goes back */
    NEED(!counted || cu_calls("cuMemRelease") == 2);
    NEED(used_since(base, 4 * PAGE));
    /* Off: an unmap releases at once, a map creates. */
    NEED(be->unmap(0, p + 10 * PAGE, 2 * PAGE) == 0);
    NEED(!counted || cu_calls("cuMemRelease") == 4);
    NEED(used_since(base, 2 * PAGE));
    NEED(be->map(0, p, PAGE, PAGE, why, sizeof why) == 0);
    NEED(!counted || cu_calls("cuMemCreate") == 2);
    be->keep_handles(0, false); /* nothing kept: nothing to do */
    NEED(!counted || cu_calls("cuMemRelease") == 4);
    NEED(be->unreserve(0, r, 32 * MiB) == 0);
    NEED(used_since(base, 0) || !cu_is_standin());
}

static void test_vmm_backend_map_unmap(void **state)
{
    (void)state;
    expect_child_ok(env_cuda, body_backend_map_unmap);
}

/* The same on a driver whose cuMemUnmap takes one whole mapping per call
 * (the stand-in with CUDA_STANDIN_VMM_UNMAP_ONE=1 refuses a range of several
 * with CUDA_ERROR_INVALID_VALUE): each run is unmapped a handle at a time,
 * with the same mapped bytes, driver memory and refusals. */
static void test_vmm_backend_keep_handles(void **state)
{
    (void)state;
    expect_child_ok(env_cuda, body_backend_keep_handles);
}

static void test_vmm_backend_map_unmap_one_mapping_per_call(void **state)
{
    (void)state;
    if (getenv("TALLY_REAL_CUDA") && strcmp(getenv("TALLY_REAL_CUDA"), "1") == 0)
        SKIP("the real driver unmaps several mappings in one call");
    static const char *const one[] = {"CUDA_STANDIN_DEVICES", "1", "CUDA_STANDIN_VMM_UNMAP_ONE", "1", "TALLY_CONF",
                                      "backend:cuda,leak_report:off", NULL};
    expect_child_ok(one, body_backend_map_unmap);
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

/* Peers: tally_pool_peer_access grants a peer the pages mapped so far (one
 * cuMemSetAccess per run, for the peer alone) and every later map sets
 * access for the device and its peers in one call; a peer the driver says
 * cannot reach the device is refused; no peer gets a context from tally.
 * The stand-in checks access descriptors without enforcing them, so the
 * calls are watched through the library's entry-point table. */
static tally_pfn_cuDeviceCanAccessPeer real_can_access;

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
        SKIP("peer access needs 3 devices");
    }
    if (st != 0)
        fail_msg("child ended with status %d (see its line above)", st);
}

/* ---- through the cache ------------------------------------------------------------ */

/* Run body in a child on one stand-in device with expandable segments. */
static void expect_expandable_ok(void (*body)(int))
{
    const char *const env[] = {"CUDA_STANDIN_DEVICES", "1", "TALLY_CONF",
                               "backend:cuda,expandable_segments:true,leak_report:off", NULL};
    expect_child_ok(env, body);
}

/* A non-blocking stream of device 0, made in its primary context. */
static CUstream primary_stream(void)
{
    CUdevice d;
    CUcontext ctx, popped;
    CUstream s;
    NEED(cu.cuDeviceGet(&d, 0) == CUDA_SUCCESS);
    NEED(cu.cuDevicePrimaryCtxRetain(&ctx, d) == CUDA_SUCCESS);
    NEED(cu.cuCtxPushCurrent(ctx) == CUDA_SUCCESS);
    NEED(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    NEED(cu.cuCtxPopCurrent(&popped) == CUDA_SUCCESS);
    return s;
}

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
    /* Pages moving between holes: only within a move budget (none by
     * default, test_cache_expand_steady.c); this test is of the moves. */
    NEED(tally_configure("expandable_move_budget:-1") == 0);
    size_t base = driver_free();
    void *a = tally_malloc(40 * MiB, 0, NULL), *b = tally_malloc(40 * MiB, 0, NULL);
    NEED(a && b);
    agree(base);
    NEED(stats0().reserved_bytes[TALLY_POOL_LARGE].current == (int64_t)(80 * MiB));
    tally_free(a); /* its pages go idle and stay mapped */
    agree(base);
    NEED(stats0().reserved_bytes[TALLY_POOL_LARGE].current == (int64_t)(80 * MiB));
    /* 60 MiB does not fit a's hole: placed after b, a's idle pages are
     * unmapped to make room, so the peak stays under 80 + 60 MiB. Their
     * 20 handles are mapped again under c, as they are: 10 new ones, and
     * none released. */
    bool counted = cu_calls("cuMemCreate") >= 0;
    cu_calls_reset();
    void *c = tally_malloc(60 * MiB, 0, NULL);
    NEED(c != NULL && (char *)c >= (char *)b + 40 * MiB);
    NEED(!counted || (cu_calls("cuMemUnmap") == 1 && cu_calls("cuMemMap") == 30 && cu_calls("cuMemCreate") == 10 &&
                      cu_calls("cuMemRelease") == 0));
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
    expect_expandable_ok(body_idle_pages_and_release);
}

/* empty_cache unmaps each region's idle cells after a wait for its stream;
 * a region whose stream cannot be waited for (destroyed while a block on it
 * is live) keeps its pages, and the other regions' still go, whichever
 * comes first in the device's list: each stream is the dead one once. Each
 * region: a 100 MiB block (five 20 MiB handles) freed, then a 4 MiB block
 * on its first cell, so four handles are idle. */
static int dead_stream;

static void body_empty_cache_past_a_dead_stream(int fd)
{
    (void)fd;
    start_driver();
    size_t base = driver_free();
    CUstream s[2] = {primary_stream(), primary_stream()};
    void *keep[2];
    for (int i = 0; i < 2; i++) {
        void *big = tally_malloc(100 * MiB, 0, s[i]);
        NEED(big != NULL);
        tally_free(big);
        keep[i] = tally_malloc(4 * MiB, 0, s[i]);
        NEED(keep[i] == big);
    }
    agree(base);
    NEED(stats0().reserved_bytes[TALLY_POOL_LARGE].current == (int64_t)(200 * MiB));
    NEED(cu.cuStreamDestroy(s[dead_stream]) == CUDA_SUCCESS);
    tally_empty_cache(0);
    agree(base);
    /* The dead stream's region keeps its 100 MiB; the live one's 20. */
    NEED(stats0().reserved_bytes[TALLY_POOL_LARGE].current == (int64_t)(120 * MiB));
    tally_free(keep[0]);
    tally_free(keep[1]);
    NEED(tally_check() == 0);
}

static void test_vmm_empty_cache_past_a_dead_stream(void **state)
{
    (void)state;
    /* tally waits for the destroyed stream's handle: the stand-in refuses
     * it, as CUDA documents the handle invalid; what a real driver does
     * with it is not documented. (dlopen only: CUDA starts in the child.) */
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    bool standin = lib && dlsym(lib, "cuda_standin_version");
    if (lib)
        dlclose(lib);
    if (!standin)
        SKIP("a destroyed stream is waited for: checked on the CUDA stand-in only");
    for (dead_stream = 0; dead_stream < 2; dead_stream++)
        expect_expandable_ok(body_empty_cache_past_a_dead_stream);
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

/* Pages are unmapped only after the device's queued work has run (its
 * kernels may still use them): empty_cache waits while a stream that used
 * the freed block is held, and gives the pages back once it is released. */
static _Atomic int emptied;

static void *empty_in_thread(void *arg)
{
    (void)arg;
    tally_empty_cache(0);
    atomic_store(&emptied, 1);
    return NULL;
}

static void body_unmap_waits_for_work(int fd)
{
    (void)fd;
    start_driver();
    CUstream s = primary_stream();
    void *p = tally_malloc(4 * MiB, 0, s);
    NEED(p != NULL);
    struct cu_hold *h = cu_hold(s); /* work on s that may still use p */
    NEED(h != NULL);
    tally_free(p);
    pthread_t t;
    NEED(pthread_create(&t, NULL, empty_in_thread, NULL) == 0);
    usleep(100000);
    NEED(atomic_load(&emptied) == 0); /* waiting for s, pages still mapped */
    cu_release(h);
    NEED(pthread_join(t, NULL) == 0);
    NEED(atomic_load(&emptied) == 1);
    NEED(stats0().reserved_bytes[TALLY_POOL_ALL].current == 0);
    NEED(tally__cu_vmm_mapped_bytes(0) == 0);
}

static void test_vmm_unmap_waits_for_work(void **state)
{
    (void)state;
    expect_expandable_ok(body_unmap_waits_for_work);
}

/* While a stream of the device captures a CUDA graph nothing is unmapped
 * (the synchronise before cuMemUnmap would invalidate the capture): an
 * allocation past the mark maps new pages instead of taking idle ones, and
 * empty_cache leaves idle pages and a whole free region mapped; the first
 * empty_cache after the capture gives them back. */
static int only_stream(void *arg, void *stream)
{
    return stream == arg;
}

static void body_no_unmap_during_capture(int fd)
{
    (void)fd;
    start_driver();
    size_t base = driver_free();
    CUstream s = primary_stream();
    void *a = tally_malloc(40 * MiB, 0, NULL), *b = tally_malloc(40 * MiB, 0, NULL);
    NEED(a && b);
    tally_free(a); /* 40 MiB of idle pages, mapped */
    NEED(tally_graph_pool_begin(0, 3, 1, only_stream, s) == 0);
    NEED(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    void *g = tally_malloc(1 * MiB, 0, s); /* the capture is seen */
    NEED(g != NULL);
    /* Outside a capture a's idle pages would be unmapped to make room. */
    void *c = tally_malloc(60 * MiB, 0, NULL);
    NEED(c != NULL);
    tally_stats_t st = stats0();
    NEED(st.reserved_bytes[TALLY_POOL_LARGE].current == (int64_t)(140 * MiB));
    NEED(tally_empty_cache(0) == 0); /* a's idle pages stay */
    NEED(stats0().reserved_bytes[TALLY_POOL_LARGE].current == (int64_t)(140 * MiB));
    agree(base);
    tally_free(b);
    tally_free(c);
    NEED(tally_empty_cache(0) == 0); /* the whole free region stays too */
    NEED(stats0().reserved_bytes[TALLY_POOL_LARGE].current == (int64_t)(140 * MiB));
    agree(base);
    tally_free(g);
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
    NEED(cu.cuStreamIsCapturing(s, &cs) == CUDA_SUCCESS && cs == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    CUgraph graph = NULL;
    NEED(cu.cuStreamEndCapture(s, &graph) == CUDA_SUCCESS); /* not invalidated */
    NEED(graph != NULL);
    NEED(cu.cuGraphDestroy(graph) == CUDA_SUCCESS);
    NEED(tally_graph_pool_end(0, 3, 1) == 0);
    NEED(tally_graph_pool_release(0, 3, 1) == 0);
    /* After the capture the next empty_cache gives every page back. */
    NEED(tally_empty_cache(0) >= 140 * MiB);
    NEED(stats0().reserved_bytes[TALLY_POOL_ALL].current == 0);
    NEED(tally__cu_vmm_mapped_bytes(0) == 0);
    agree(base);
    NEED(used_since(base, 0));
}

static void test_vmm_no_unmap_during_capture(void **state)
{
    (void)state;
    expect_expandable_ok(body_no_unmap_during_capture);
}

/* During a capture, a block whose pages only fit once idle pages are
 * unmapped fails with OOM instead (the capture is kept); after the capture
 * the same request takes the idle pages. On a 1 GiB device; the block is
 * on another stream (a region of its own, so the idle pages are not in its
 * way). */
static void body_capture_oom_keeps_capture(int fd)
{
    (void)fd;
    start_driver();
    size_t base = driver_free();
    size_t half = base / 2 / PAGE * PAGE;
    CUstream s = primary_stream(), other = primary_stream();
    void *a = tally_malloc(half, 0, NULL);
    NEED(a != NULL);
    tally_free(a); /* idle pages, mapped */
    NEED(tally_graph_pool_begin(0, 4, 1, only_stream, s) == 0);
    NEED(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    void *g = tally_malloc(1 * MiB, 0, s);
    NEED(g != NULL);
    /* other's own region: its pages fit only once a's are unmapped. */
    NEED(tally_malloc(half + 64 * MiB, 0, other) == NULL);
    NEED(strstr(tally_last_error(), "out of memory on device 0") != NULL);
    agree(base);
    tally_free(g);
    CUgraph graph = NULL;
    NEED(cu.cuStreamEndCapture(s, &graph) == CUDA_SUCCESS); /* not invalidated */
    NEED(cu.cuGraphDestroy(graph) == CUDA_SUCCESS);
    NEED(tally_graph_pool_end(0, 4, 1) == 0);
    NEED(tally_graph_pool_release(0, 4, 1) == 0);
    void *b = tally_malloc(half + 64 * MiB, 0, other);
    NEED(b != NULL);
    agree(base);
    tally_free(b);
    tally_empty_cache(0);
    NEED(stats0().reserved_bytes[TALLY_POOL_ALL].current == 0);
    agree(base);
}

static void test_vmm_capture_oom_keeps_capture(void **state)
{
    (void)state;
    const char *const env[] = {"CUDA_STANDIN_DEVICES", "1", "CUDA_STANDIN_MEMORY", "1G", "TALLY_CONF",
                               "backend:cuda,expandable_segments:true,leak_report:off", NULL};
    expect_child_ok(env, body_capture_oom_keeps_capture);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vmm_backend_map_unmap),
        cmocka_unit_test(test_vmm_backend_keep_handles),
        cmocka_unit_test(test_vmm_backend_map_unmap_one_mapping_per_call),
        cmocka_unit_test(test_vmm_backend_accepted_by_cuda_only),
        cmocka_unit_test(test_vmm_peer_access),
        cmocka_unit_test(test_vmm_idle_pages_and_release),
        cmocka_unit_test(test_vmm_empty_cache_past_a_dead_stream),
        cmocka_unit_test(test_vmm_oom_inside_range),
        cmocka_unit_test(test_vmm_unmap_waits_for_work),
        cmocka_unit_test(test_vmm_no_unmap_during_capture),
        cmocka_unit_test(test_vmm_capture_oom_keeps_capture),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
