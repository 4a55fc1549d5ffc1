/* Tests of the CUDA stand-in's streams, events, virtual memory and memory
 * pools through the driver API (tests/cudautil.h), one documented rule at
 * a time (docs/standin.md). With TALLY_REAL_CUDA=1 on a GPU machine they
 * run against the real driver; exact stand-in figures are checked only
 * when cu_is_standin(). Initialisation, contexts and device memory are in
 * test_standin.c; stream capture in test_standin_capture.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "standinutil.h"

/* ---- streams and events ------------------------------------------------------------------ */
struct delayed {
    struct cu_hold *hold;
    useconds_t us;
};

static void *release_later(void *arg)
{
    struct delayed *d = arg;
    usleep(d->us);
    cu_release(d->hold);
    return NULL;
}

static void test_stream_hold_query_sync(void **state)
{
    CU_NEED_DRIVER();
    CUstream s = NULL;
    CUevent done = NULL, never = NULL;
    CUcontext owner = NULL;
    int flag = 0;
    CU_OK(cu.cuCtxPushCurrent(cu_ctx[0]));
    CU_OK(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CU_OK(cu.cuEventCreate(&done, CU_EVENT_DISABLE_TIMING));
    CU_OK(cu.cuEventCreate(&never, CU_EVENT_DISABLE_TIMING));
    CU_OK(cu.cuStreamGetCtx(s, &owner));
    assert_ptr_equal(owner, cu_ctx[0]);
    CU_OK(cu.cuStreamGetCtx(NULL, &owner)); /* legacy: the current context's */
    assert_ptr_equal(owner, cu_ctx[0]);
    CU_OK(cu.cuStreamQuery(s));
    CU_OK(cu.cuEventQuery(never)); /* never recorded: complete */
    struct cu_hold *h = cu_hold(s);
    assert_non_null(h);
    CU_OK(cu.cuLaunchHostFunc(s, set_flag, &flag));
    CU_OK(cu.cuEventRecord(done, s));
    CU_IS(cu.cuStreamQuery(s), CUDA_ERROR_NOT_READY);
    CU_IS(cu.cuEventQuery(done), CUDA_ERROR_NOT_READY);
    assert_int_equal(__atomic_load_n(&flag, __ATOMIC_SEQ_CST), 0);
    cu_release(h);
    CU_OK(cu.cuEventSynchronize(done));
    assert_int_equal(__atomic_load_n(&flag, __ATOMIC_SEQ_CST), 1);
    CU_OK(cu.cuStreamSynchronize(s));
    CU_OK(cu.cuStreamQuery(s));
    /* cuCtxSynchronize waits for every stream of the context. */
    struct delayed d = {.hold = cu_hold(s), .us = 50000};
    assert_non_null(d.hold);
    CU_OK(cu.cuEventRecord(done, s));
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, release_later, &d), 0);
    CU_OK(cu.cuCtxSynchronize());
    CU_OK(cu.cuEventQuery(done));
    pthread_join(th, NULL);
    CU_OK(cu.cuEventDestroy(done));
    CU_OK(cu.cuEventDestroy(never));
    CU_OK(cu.cuStreamDestroy(s));
    CU_IS(cu.cuStreamDestroy(NULL), CUDA_ERROR_INVALID_HANDLE);
    CU_OK(cu.cuCtxPopCurrent(NULL));
}

static void test_events_cross_context(void **state)
{
    CU_NEED_TWO();
    CUstream s0 = NULL, s1 = NULL;
    CUevent e0 = NULL, e1 = NULL;
    CUdevice dev = -1;
    CU_OK(cu.cuCtxPushCurrent(cu_ctx[1]));
    CU_OK(cu.cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    CU_OK(cu.cuEventCreate(&e1, CU_EVENT_DISABLE_TIMING));
    CU_OK(cu.cuCtxPopCurrent(NULL));
    CU_OK(cu.cuCtxPushCurrent(cu_ctx[0]));
    CU_OK(cu.cuStreamCreate(&s0, CU_STREAM_NON_BLOCKING));
    CU_OK(cu.cuEventCreate(&e0, CU_EVENT_DISABLE_TIMING));
    if (cu.cuStreamGetDevice) {
        CU_OK(cu.cuStreamGetDevice(s1, &dev));
        assert_int_equal(dev, 1);
    }
    /* cuEventRecord: event and stream of different contexts. */
    CU_IS(cu.cuEventRecord(e1, s0), CUDA_ERROR_INVALID_HANDLE);
    CU_IS(cu.cuEventRecord(e0, s1), CUDA_ERROR_INVALID_HANDLE);
    /* cuStreamWaitEvent: an event of another device is fine, and waited for. */
    struct cu_hold *h = cu_hold(s1);
    assert_non_null(h);
    CU_OK(cu.cuEventRecord(e1, s1));
    CU_OK(cu.cuStreamWaitEvent(s0, e1, 0));
    CU_OK(cu.cuEventRecord(e0, s0));
    usleep(20000);
    CU_IS(cu.cuEventQuery(e0), CUDA_ERROR_NOT_READY);
    cu_release(h);
    CU_OK(cu.cuEventSynchronize(e0));
    CU_OK(cu.cuEventQuery(e1));
    CU_OK(cu.cuStreamDestroy(s0));
    CU_OK(cu.cuEventDestroy(e0));
    CU_OK(cu.cuCtxPopCurrent(NULL));
    CU_OK(cu.cuStreamDestroy(s1));
    CU_OK(cu.cuEventDestroy(e1));
}

/* ---- call counts ------------------------------------------------------------------------------------ */
/* The stand-in counts each entry point's calls under its plain name, the
 * versioned ones (cuMemAlloc is cuMemAlloc_v2) included. */
static void test_call_counts(void **state)
{
    CU_NEED_STANDIN();
    CUcontext c = NULL;
    CUdeviceptr d = 0;
    cu_calls_reset();
    assert_int_equal(cu_calls(NULL), 0);
    CU_OK(cu.cuCtxPushCurrent(cu_ctx[0]));
    CU_OK(cu.cuCtxGetCurrent(&c));
    CU_OK(cu.cuCtxGetCurrent(&c));
    CU_OK(cu.cuMemAlloc(&d, 4096));
    CU_OK(cu.cuMemFree(d));
    CU_OK(cu.cuCtxPopCurrent(NULL));
    assert_int_equal(cu_calls("cuCtxGetCurrent"), 2);
    assert_int_equal(cu_calls("cuMemAlloc"), 1);
    assert_int_equal(cu_calls("cuMemFree"), 1);
    assert_int_equal(cu_calls("cuCtxPushCurrent"), 1);
    assert_int_equal(cu_calls("cuCtxPopCurrent"), 1);
    assert_int_equal(cu_calls("cuStreamSynchronize"), 0);
    assert_int_equal(cu_calls("noSuchEntryPoint"), 0);
    assert_int_equal(cu_calls(NULL), 6);
}

/* ---- virtual memory ------------------------------------------------------------------------ */
static void test_virtual_memory(void **state)
{
    CU_NEED_DRIVER();
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    size_t gran = 0, free0 = 0, free1 = 0, total = 0;
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle h = 0;
    CU_OK(cu.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    assert_true(gran >= 4096 && (gran & (gran - 1)) == 0);
    if (cu_is_standin())
        assert_int_equal(gran, 2 * MiB);
    CU_OK(cu.cuCtxPushCurrent(cu_ctx[0]));
    CU_OK(cu.cuMemGetInfo(&free0, &total));
    CU_OK(cu.cuMemAddressReserve(&va, 8 * gran, 0, 0, 0));
    CU_IS(cu.cuMemCreate(&h, gran + gran / 2, &prop, 0), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cu.cuMemCreate(&h, 2 * gran, &prop, 0));
    CU_OK(cu.cuMemGetInfo(&free1, &total));
    if (cu_is_standin())
        assert_int_equal(free0 - free1, 2 * gran);
    CU_OK(cu.cuMemMap(va, 2 * gran, 0, h, 0));
    assert_true(cu.cuMemMap(va + gran, 2 * gran, 0, h, 0) != CUDA_SUCCESS); /* already mapped */
    assert_true(cu.cuMemMap(va + 7 * gran, 2 * gran, 0, h, 0) != CUDA_SUCCESS); /* past the reservation */
    CUmemAccessDesc acc = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
                           .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CU_OK(cu.cuMemSetAccess(va, 2 * gran, &acc, 1));
    assert_true(cu.cuMemSetAccess(va, 3 * gran, &acc, 1) != CUDA_SUCCESS); /* not all mapped */
    /* Released while mapped: the memory stays until unmapped. */
    CU_OK(cu.cuMemRelease(h));
    CU_OK(cu.cuMemGetInfo(&free1, &total));
    if (cu_is_standin()) {
        assert_int_equal(free0 - free1, 2 * gran);
        assert_true(cu.cuMemUnmap(va, gran) != CUDA_SUCCESS); /* a sub-range */
    }
    CU_OK(cu.cuMemUnmap(va, 2 * gran));
    CU_OK(cu.cuMemGetInfo(&free1, &total));
    if (cu_is_standin())
        assert_int_equal(free1, free0);
    CU_OK(cu.cuMemAddressFree(va, 8 * gran));
    CU_OK(cu.cuCtxPopCurrent(NULL));
}

/* ---- pools ---------------------------------------------------------------------------------- */
static cuuint64_t pool_attr(CUmemoryPool pool, CUmemPool_attribute attr)
{
    cuuint64_t v = 0;
    CU_OK(cu.cuMemPoolGetAttribute(pool, attr, &v));
    return v;
}

static void test_pool_stream_order_and_release(void **state)
{
    CU_NEED_DRIVER();
    CUmemoryPool pool = NULL, again = NULL;
    CUstream a = NULL, b = NULL;
    CUdeviceptr p = 0, q = 0, r = 0;
    CUevent after = NULL;
    CU_OK(cu.cuCtxPushCurrent(cu_ctx[0]));
    CU_OK(cu.cuEventCreate(&after, CU_EVENT_DISABLE_TIMING));
    CU_OK(cu.cuDeviceGetDefaultMemPool(&pool, 0));
    CU_OK(cu.cuDeviceGetDefaultMemPool(&again, 0));
    assert_ptr_equal(pool, again);
    CU_IS(cu.cuMemPoolDestroy(pool), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cu.cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
    CU_OK(cu.cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
    cuuint64_t keep = UINT64_MAX;
    CU_OK(cu.cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
    CU_OK(cu.cuMemAllocFromPoolAsync(&p, 4 * MiB, pool, a));
    assert_true(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) >= 4 * MiB);
    assert_true(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) >= 4 * MiB);
    /* Without internal dependencies, a free not yet executed on `a` is not
     * reused by `b`. */
    int off = 0, on = 1;
    CU_OK(cu.cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, &off));
    struct cu_hold *h = cu_hold(a);
    assert_non_null(h);
    CU_OK(cu.cuMemFreeAsync(p, a));
    CU_OK(cu.cuMemAllocFromPoolAsync(&q, 4 * MiB, pool, b));
    assert_true(q != p);
    /* With them (the default), `b` may take it, but only after the free. */
    CU_OK(cu.cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, &on));
    CU_OK(cu.cuMemAllocFromPoolAsync(&r, 4 * MiB, pool, b));
    CU_OK(cu.cuEventRecord(after, b));
    if (cu_is_standin())
        assert_true(r == p);
    if (r == p) {
        usleep(20000);
        CU_IS(cu.cuEventQuery(after), CUDA_ERROR_NOT_READY);
    }
    cu_release(h);
    CU_OK(cu.cuEventSynchronize(after));
    CU_OK(cu.cuStreamSynchronize(a));
    CU_OK(cu.cuMemFreeAsync(q, b));
    CU_OK(cu.cuMemFreeAsync(r, b));
    CU_OK(cu.cuStreamSynchronize(b));
    /* Above threshold UINT64_MAX nothing is released; trimming releases. */
    assert_true(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) >= 8 * MiB);
    assert_int_equal(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
    CU_OK(cu.cuMemPoolTrimTo(pool, 0));
    assert_int_equal(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
    /* Threshold 0: released at the next synchronisation. */
    keep = 0;
    CU_OK(cu.cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
    CU_OK(cu.cuMemAllocFromPoolAsync(&p, 2 * MiB, pool, a));
    CU_OK(cu.cuMemFreeAsync(p, a));
    CU_OK(cu.cuStreamSynchronize(a));
    assert_int_equal(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
    /* High watermarks: reset with 0, a non-zero value is refused. */
    assert_true(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH) >= 8 * MiB);
    cuuint64_t zero = 0, one = 1;
    CU_OK(cu.cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero));
    assert_int_equal(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH), 0);
    CU_IS(cu.cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &one), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cu.cuEventDestroy(after));
    CU_OK(cu.cuStreamDestroy(a));
    CU_OK(cu.cuStreamDestroy(b));
    CU_OK(cu.cuCtxPopCurrent(NULL));
}

static void test_pool_and_peer_access(void **state)
{
    CU_NEED_TWO();
    CUmemoryPool pool = NULL, mine = NULL;
    CUmemAccess_flags flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CUmemLocation peer = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 1};
    CUmemLocation own = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0};
    int can = 0;
    CU_OK(cu.cuDeviceCanAccessPeer(&can, 0, 1));
    if (cu_is_standin())
        assert_int_equal(can, 1);
    CU_OK(cu.cuDeviceGetDefaultMemPool(&pool, 0));
    CU_OK(cu.cuMemPoolGetAccess(&flags, pool, &own));
    assert_int_equal(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED, .location = own};
    CU_OK(cu.cuMemPoolCreate(&mine, &props));
    CU_OK(cu.cuMemPoolGetAccess(&flags, mine, &peer));
    assert_int_equal(flags, CU_MEM_ACCESS_FLAGS_PROT_NONE); /* not until granted */
    if (can) {
        /* Context peer access does not reach pools. */
        CU_OK(cu.cuCtxPushCurrent(cu_ctx[1]));
        CU_OK(cu.cuCtxEnablePeerAccess(cu_ctx[0], 0));
        CU_IS(cu.cuCtxEnablePeerAccess(cu_ctx[0], 0), CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
        CU_IS(cu.cuCtxEnablePeerAccess(cu_ctx[1], 0), CUDA_ERROR_INVALID_CONTEXT);
        CU_IS(cu.cuCtxEnablePeerAccess(cu_ctx[0], 1), CUDA_ERROR_INVALID_VALUE);
        CU_OK(cu.cuCtxPopCurrent(NULL));
        CU_OK(cu.cuMemPoolGetAccess(&flags, mine, &peer));
        assert_int_equal(flags, CU_MEM_ACCESS_FLAGS_PROT_NONE);
        CUmemAccessDesc grant = {.location = peer, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        CU_OK(cu.cuMemPoolSetAccess(mine, &grant, 1));
        CU_OK(cu.cuMemPoolGetAccess(&flags, mine, &peer));
        assert_int_equal(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    }
    CU_OK(cu.cuMemPoolDestroy(mine));
}

int main(void)
{
    cu_test_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_stream_hold_query_sync, cu_ctx_setup, cu_ctx_teardown),
        cmocka_unit_test_setup_teardown(test_events_cross_context, cu_ctx_setup, cu_ctx_teardown),
        cmocka_unit_test_setup_teardown(test_call_counts, cu_ctx_setup, cu_ctx_teardown),
        cmocka_unit_test_setup_teardown(test_virtual_memory, cu_ctx_setup, cu_ctx_teardown),
        cmocka_unit_test_setup_teardown(test_pool_stream_order_and_release, cu_ctx_setup, cu_ctx_teardown),
        cmocka_unit_test_setup_teardown(test_pool_and_peer_access, cu_ctx_setup, cu_ctx_teardown),
    };
    return cmocka_run_group_tests_name("standin_streams", tests, NULL, NULL);
}
