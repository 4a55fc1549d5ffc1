/* The cuda and async backends when a driver call fails (tests/cufail.h puts
 * a failing wrapper in the library's table of entry points): the call that
 * needed it fails with one line naming the driver call and its error, nothing
 * is lost, and once the driver answers again the same call works.
 *
 *   a context that cannot be had or made current   test_cuda_context_refused_then_taken
 *   error names and unnamed errors                  test_cuda_error_without_a_name_or_text
 *   a stream whose device cannot be asked directly  test_cuda_stream_device_fallbacks(_before_cuda_12_8)
 *   peer access without expandable segments         test_cuda_peer_access_follows_the_program
 *   an async pool that cannot be set up             test_async_pool_setup_refused_then_taken
 *   a peer refused access to the async pool         test_async_peer_refused_pool_access_is_said
 *   the async pool's peaks reset                    test_async_reset_peak_resets_the_pool_highs
 *   a free whose streams get no event               test_async_free_without_events_waits_for_its_streams */
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

#include "cudachild.h"
#include "cufail.h"

#define MiB ((size_t)1 << 20)

/* A block of device dev comes and goes cleanly. */
static void block_works(int dev)
{
    void *p = tally_malloc(MiB, dev, NULL);
    EXPECT(p != NULL);
    tally_free(p);
    EXPECT(tally_check() == 0);
}

/* ---- contexts ------------------------------------------------------------------- */

CF_WRAP(cuDevicePrimaryCtxRetain, (CUcontext * ctx, CUdevice dev), (ctx, dev))
CF_WRAP(cuCtxPushCurrent, (CUcontext ctx), (ctx))

static void body_context_refused(void)
{
    driver_up();
    EXPECT(tally_init() == 0);
    CF_FAIL(cuDevicePrimaryCtxRetain, 1, CUDA_ERROR_INVALID_DEVICE);
    EXPECT(tally_malloc(MiB, 0, NULL) == NULL);
    EXPECT(strstr(tally_last_error(), "cuDevicePrimaryCtxRetain: CUDA_ERROR_INVALID_DEVICE") != NULL);
    block_works(0); /* retained now */
    CF_FAIL(cuCtxPushCurrent, -1, CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(tally_malloc(4 * MiB, 0, NULL) == NULL);
    EXPECT(strstr(tally_last_error(), "cuCtxPushCurrent: CUDA_ERROR_INVALID_CONTEXT") != NULL);
    CF_RESTORE(cuCtxPushCurrent);
    block_works(0);
}

/* An error the driver has no name for (cuGetErrorName gives NULL) is said
 * by its number; one with a name but no description, by its name. */
static void body_unnamed_error(void)
{
    driver_up();
    EXPECT(tally_init() == 0);
    block_works(0);
    CF_FAIL(cuCtxPushCurrent, -1, (CUresult)9999);
    EXPECT(tally_malloc(4 * MiB, 0, NULL) == NULL);
    EXPECT(strstr(tally_last_error(), "cuCtxPushCurrent: CUDA error 9999") != NULL);
    tally__cu.cuGetErrorString = NULL;
    cf_error = CUDA_ERROR_INVALID_CONTEXT;
    EXPECT(tally_malloc(4 * MiB, 0, NULL) == NULL);
    EXPECT(strstr(tally_last_error(), "cuCtxPushCurrent: CUDA_ERROR_INVALID_CONTEXT") != NULL);
    EXPECT(strstr(tally_last_error(), "CUDA_ERROR_INVALID_CONTEXT (") == NULL);
    CF_RESTORE(cuCtxPushCurrent);
    block_works(0);
}

/* ---- the device of a stream ------------------------------------------------------ */

CF_WRAP(cuStreamGetCtx, (CUstream s, CUcontext *ctx), (s, ctx))
CF_WRAP(cuStreamGetCtx_v2, (CUstream s, CUcontext *ctx, CUgreenCtx *green), (s, ctx, green))
CF_WRAP(cuStreamGetDevice, (CUstream s, CUdevice *dev), (s, dev))
CF_WRAP(cuCtxGetDevice, (CUdevice * dev), (dev))

/* A use recorded on stream s for a block of device 0: whether tally said it
 * could not tell the stream's device. */
static bool use_unplaced(CUstream s)
{
    void *p = tally_malloc(MiB, 0, NULL);
    EXPECT(p != NULL);
    child_said_clear();
    EXPECT(tally_record_stream(p, s) == 0);
    bool unplaced = strstr(child_said, "cannot tell which device stream") != NULL;
    tally_free(p);
    CU_EXPECT(cu.cuStreamSynchronize(s));
    return unplaced;
}

/* The stream's context cannot be had: its device comes from
 * cuStreamGetDevice; neither answering, the use stays on the block's device
 * and tally says so. A stream of another device's primary context (one tally
 * never used) is placed by making that context current for one call; that
 * refused, the same (first: a use recorded there makes tally retain it). */
static void body_stream_device(void)
{
    driver_up();
    tally_set_sink(child_said_sink, NULL);
    EXPECT(tally_init() == 0);
    CUstream s1 = make_stream(1), s2 = make_stream(2);
    block_works(1); /* device 1's primary context is tally's */
    EXPECT(!use_unplaced(s1));
    CF_FAIL(cuStreamGetCtx, -1, CUDA_ERROR_INVALID_HANDLE);
    CF_FAIL(cuStreamGetCtx_v2, -1, CUDA_ERROR_INVALID_HANDLE);
    EXPECT(use_unplaced(s1) == !tally__cu.cuStreamGetDevice); /* placed by cuStreamGetDevice, where it is */
    if (tally__cu.cuStreamGetDevice) /* CUDA 12.8 */
        CF_FAIL(cuStreamGetDevice, -1, CUDA_ERROR_INVALID_HANDLE);
    EXPECT(use_unplaced(s1));
    CF_RESTORE(cuStreamGetCtx);
    CF_RESTORE(cuStreamGetCtx_v2);
    CF_FAIL(cuCtxPushCurrent, -1, CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(use_unplaced(s2));
    CF_RESTORE(cuCtxPushCurrent);
    EXPECT(!use_unplaced(s2)); /* and now device 2's context is tally's too */
    /* The NULL stream is the current context's device's: that device not
     * to be had, or no context current, the block's own (no word of another
     * device). */
    void *p = tally_malloc(MiB, 1, s1); /* a NULL-stream use is another stream's */
    EXPECT(p != NULL);
    CUdevice d1;
    CUcontext ctx1, popped;
    CU_EXPECT(cu.cuDeviceGet(&d1, 1));
    CU_EXPECT(cu.cuDevicePrimaryCtxRetain(&ctx1, d1));
    CU_EXPECT(cu.cuCtxPushCurrent(ctx1));
    CF_FAIL(cuCtxGetDevice, -1, CUDA_ERROR_INVALID_CONTEXT);
    child_said_clear();
    EXPECT(tally_record_stream(p, NULL) == 0);
    EXPECT(child_said_len == 0);
    CF_RESTORE(cuCtxGetDevice);
    CU_EXPECT(cu.cuCtxPopCurrent(&popped));
    /* No context current at all: the block's device too. */
    void *q = tally_malloc(MiB, 1, s1);
    EXPECT(q != NULL);
    EXPECT(tally_record_stream(q, NULL) == 0);
    EXPECT(child_said_len == 0);
    tally_free(p);
    tally_free(q);
    EXPECT(tally_check() == 0);
}

/* The same on a CUDA 12.0 driver: no cuStreamGetDevice, and cuStreamGetCtx
 * in its first form. */
static void body_stream_device_cuda12(void)
{
    setenv("CUDA_STANDIN_DRIVER_VERSION", "12000", 1);
    body_stream_device();
}

/* ---- the driver as a whole --------------------------------------------------------- */

/* Without expandable segments, cuMemAlloc memory follows the program's own
 * cuCtxEnablePeerAccess: tally has nothing to do and says yes. */
static void body_peer_access_follows(void)
{
    driver_up();
    EXPECT(tally_init() == 0);
    block_works(0);
    cu_calls_reset();
    EXPECT(tally_pool_peer_access(0, 1) == 0);
    EXPECT(tally_pool_peer_access(1, 0) == 0);
    /* Not even a question to the driver (the stand-in counts every call). */
    EXPECT(cu_calls("cuDeviceCanAccessPeer") == 0);
    EXPECT(cu_calls("cuDeviceGet") == 0);
    block_works(0);
}

/* ---- the async backend's pools --------------------------------------------------- */

static tally_pfn_cuDeviceGetAttribute real_attribute;
static int pools_supported = 1;
static CUresult pools_error = CUDA_SUCCESS;
static CUresult pools_attribute(int *value, CUdevice_attribute attrib, CUdevice dev)
{
    if (attrib != CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)
        return real_attribute(value, attrib, dev);
    if (pools_error != CUDA_SUCCESS)
        return pools_error;
    *value = pools_supported;
    return CUDA_SUCCESS;
}

CF_WRAP(cuDeviceGetDefaultMemPool, (CUmemoryPool * pool, CUdevice dev), (pool, dev))
CF_WRAP(cuMemPoolSetAccess, (CUmemoryPool pool, const CUmemAccessDesc *map, size_t count), (pool, map, count))

/* The pool is set up at the device's first allocation; each way that can
 * fail fails the allocation with its reason, and the next one, the driver
 * answering again, sets it up. */
static void body_pool_setup_refused(void)
{
    driver_up();
    EXPECT(tally_init() == 0);
    real_attribute = tally__cu.cuDeviceGetAttribute;
    tally__cu.cuDeviceGetAttribute = pools_attribute;
    pools_error = CUDA_ERROR_INVALID_DEVICE;
    EXPECT(tally_malloc(MiB, 0, NULL) == NULL);
    EXPECT(strstr(tally_last_error(), "cuDeviceGetAttribute: CUDA_ERROR_INVALID_DEVICE") != NULL);
    pools_error = CUDA_SUCCESS;
    pools_supported = 0;
    EXPECT(tally_malloc(MiB, 1, NULL) == NULL);
    EXPECT(strstr(tally_last_error(), "device 1 does not support stream-ordered memory pools") != NULL);
    pools_supported = 1;
    CF_FAIL(cuDeviceGetDefaultMemPool, 1, CUDA_ERROR_NOT_SUPPORTED);
    EXPECT(tally_malloc(MiB, 0, NULL) == NULL);
    EXPECT(strstr(tally_last_error(), "cuDeviceGetDefaultMemPool: CUDA_ERROR_NOT_SUPPORTED") != NULL);
    block_works(0);
    block_works(1);
}

/* Access asked for before the pool exists and refused when it is made:
 * one line naming the device, the peer and why; the device still allocates. */
static void body_peer_refused(void)
{
    driver_up();
    tally_set_sink(child_said_sink, NULL);
    EXPECT(tally_init() == 0);
    EXPECT(tally_pool_peer_access(0, 2) == 0);
    CF_FAIL(cuMemPoolSetAccess, 1, CUDA_ERROR_NOT_SUPPORTED);
    child_said_clear();
    block_works(0);
    EXPECT(strstr(child_said, "tally: device 0: peer 2 gets no access to the pool: cuMemPoolSetAccess: "
                        "CUDA_ERROR_NOT_SUPPORTED") != NULL);
}

/* tally_reset_peak_stats resets the pool's own highs (reserved and used) to
 * what is held now; on a device whose pool was never set up it does nothing. */
static void body_reset_peak(void)
{
    driver_up();
    EXPECT(tally_init() == 0);
    EXPECT(tally_reset_peak_stats(1) == 0); /* no pool yet */
    void *p = tally_malloc(64 * MiB, 0, NULL);
    EXPECT(p != NULL);
    tally_free(p);
    CUdevice d0;
    CUmemoryPool pool;
    CU_EXPECT(cu.cuDeviceGet(&d0, 0));
    CU_EXPECT(cu.cuDeviceGetDefaultMemPool(&pool, d0));
    cuuint64_t used_high = 0, used = 0;
    CU_EXPECT(cu.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &used_high));
    EXPECT(used_high >= 64 * MiB);
    EXPECT(tally_reset_peak_stats(0) == 0);
    CU_EXPECT(cu.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &used_high));
    CU_EXPECT(cu.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used));
    EXPECT(used_high == used);
    cuuint64_t reserved_high = 0, reserved = 0;
    CU_EXPECT(cu.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &reserved_high));
    CU_EXPECT(cu.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved));
    EXPECT(reserved_high == reserved);
    /* tally's statistics give the pool's own figures for reserved memory:
     * the freed 64 MiB the pool keeps (async_release_threshold defaults to
     * keeping all) is reserved now and its high after the reset, where
     * tally's own count of live pass-through blocks fell to 0. */
    EXPECT(reserved >= 64 * MiB);
    tally_stats_t st;
    EXPECT(tally_get_stats(0, &st) == 0);
    EXPECT(st.reserved_bytes[0].current == (int64_t)reserved);
    EXPECT(st.reserved_bytes[0].peak == (int64_t)reserved_high);
}

/* ---- a free whose streams cannot be waited for with events ------------------ */

CF_WRAP(cuEventRecord, (CUevent event, CUstream stream), (event, stream))

static tally_pfn_cuStreamSynchronize real_sync;
static CUstream synced[16];
static int nsynced;
static CUresult counting_sync(CUstream stream)
{
    if (nsynced < 16)
        synced[nsynced] = stream;
    nsynced++;
    return real_sync(stream);
}

static bool was_synced(CUstream s)
{
    for (int i = 0; i < nsynced && i < 16; i++)
        if (synced[i] == s)
            return true;
    return false;
}

/* The async backend frees a block used on a second stream on its free
 * stream, which waits for the block's stream and the use through events.
 * With every event record refused, it waits for each of those streams
 * instead (cuStreamSynchronize on each), and the block is still freed. */
static void body_free_without_events(void)
{
    driver_up();
    EXPECT(tally_init() == 0);
    CUstream s1 = make_stream(0), s2 = make_stream(0);
    void *c = tally_malloc(MiB, 0, s1);
    EXPECT(c != NULL);
    EXPECT(tally_record_stream(c, s2) == 0);
    real_sync = tally__cu.cuStreamSynchronize;
    tally__cu.cuStreamSynchronize = counting_sync;
    CF_FAIL(cuEventRecord, -1, CUDA_ERROR_LAUNCH_FAILED);
    tally_free(c);
    CF_RESTORE(cuEventRecord);
    tally__cu.cuStreamSynchronize = real_sync;
    EXPECT(was_synced(s1)); /* the block's own stream */
    EXPECT(was_synced(s2)); /* its use */
    tally_stats_t st;
    EXPECT(tally_get_stats(0, &st) == 0);
    EXPECT(st.active_bytes[0].current == 0);
    EXPECT(tally_check() == 0);
    block_works(0);
}

#define CUDA_CONF "backend:cuda,leak_report:off"
#define ASYNC_CONF "backend:async,leak_report:off"
CUDA_TEST(test_cuda_context_refused_then_taken, CUDA_CONF, body_context_refused, 1)
CUDA_TEST(test_cuda_error_without_a_name_or_text, CUDA_CONF, body_unnamed_error, 1)
CUDA_TEST(test_cuda_stream_device_fallbacks, CUDA_CONF, body_stream_device, 3)
CUDA_TEST(test_cuda_stream_device_fallbacks_before_cuda_12_8, CUDA_CONF, body_stream_device_cuda12, 3)
CUDA_TEST(test_cuda_peer_access_follows_the_program, CUDA_CONF, body_peer_access_follows, 2)
CUDA_TEST(test_async_pool_setup_refused_then_taken, ASYNC_CONF, body_pool_setup_refused, 2)
CUDA_TEST(test_async_peer_refused_pool_access_is_said, ASYNC_CONF, body_peer_refused, 3)
CUDA_TEST(test_async_reset_peak_resets_the_pool_highs, ASYNC_CONF, body_reset_peak, 2)
CUDA_TEST(test_async_free_without_events_waits_for_its_streams, ASYNC_CONF, body_free_without_events, 1)

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_context_refused_then_taken),
        cmocka_unit_test(test_cuda_error_without_a_name_or_text),
        cmocka_unit_test(test_cuda_stream_device_fallbacks),
        cmocka_unit_test(test_cuda_stream_device_fallbacks_before_cuda_12_8),
        cmocka_unit_test(test_cuda_peer_access_follows_the_program),
        cmocka_unit_test(test_async_pool_setup_refused_then_taken),
        cmocka_unit_test(test_async_peer_refused_pool_access_is_said),
        cmocka_unit_test(test_async_reset_peak_resets_the_pool_highs),
        cmocka_unit_test(test_async_free_without_events_waits_for_its_streams),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
