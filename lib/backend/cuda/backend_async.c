/* The async backend: CUDA's stream-ordered allocator on the driver API.
 * One memory pool per device, set up the first time tally allocates on that
 * device (no context-creating call at initialisation): the device's default
 * pool, or a private one with async_pool:private, with the release threshold
 * async_release_threshold. cuMemAllocFromPoolAsync on the caller's stream;
 * cuMemFreeAsync on the block's stream, or, for a block used on other
 * streams, on the device's free stream after it waited on an event recorded
 * on the block's stream and on every stream the block was used on (cache.c:
 * the compute stream never waits on side streams); cuMemPoolTrimTo
 * for empty_cache and stage-end release, only on devices with a pool. The
 * driver does the caching, so the cache layer runs in pass-through mode and
 * keeps the ledger and statistics; reserved memory is read from the pool. */
#include "backend/cuda/cu.h"

#include <pthread.h>
#include <stdio.h>

static CUmemoryPool pools[TALLY_MAX_DEVICES];
static CUstream free_streams[TALLY_MAX_DEVICES]; /* per-device unifying stream for frees */
static _Atomic int ready[TALLY_MAX_DEVICES];
static pthread_mutex_t setup_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t peers[TALLY_MAX_DEVICES]; /* bit p: peer p is to access the pool */
static int private_pool;
static uint64_t release_threshold;

static int async_init(const tally_options_t *opt, char *why, size_t whylen)
{
    if (tally__cu_init(why, whylen))
        return TALLY_EBACKEND;
    if (!tally__cu.cuMemAllocFromPoolAsync || !tally__cu.cuMemFreeAsync || !tally__cu.cuDeviceGetDefaultMemPool ||
        !tally__cu.cuMemPoolCreate || !tally__cu.cuMemPoolTrimTo || !tally__cu.cuMemPoolGetAttribute ||
        !tally__cu.cuMemPoolSetAttribute) {
        snprintf(why, whylen, "the NVIDIA driver (CUDA %d.%d) has no stream-ordered memory pools (CUDA 11.2+)",
                 tally__cu.driver_version / 1000, tally__cu.driver_version % 1000 / 10);
        return TALLY_EBACKEND;
    }
    private_pool = opt->async_private_pool;
    release_threshold = opt->async_release_threshold;
    return 0;
}

static int async_device_count(void)
{
    return tally__cu_device_count();
}

/* Grant peer read-write access to device's pool (pool ready). */
static int grant(int device, int peer, char *why, size_t whylen)
{
    CUmemAccessDesc desc = {{CU_MEM_LOCATION_TYPE_DEVICE, peer}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CUresult r = tally__cu.cuMemPoolSetAccess ? tally__cu.cuMemPoolSetAccess(pools[device], &desc, 1)
                                              : CUDA_ERROR_NOT_SUPPORTED;
    return r == CUDA_SUCCESS ? 0 : tally__cu_why(r, "cuMemPoolSetAccess", why, whylen);
}

/* The device's pool, set up at its first use (context current). */
static int pool_setup(int device, char *why, size_t whylen)
{
    int rc = 0;
    pthread_mutex_lock(&setup_lock);
    if (!atomic_load(&ready[device])) {
        int supported = 0;
        CUdevice dev = 0;
        CUresult r = tally__cu.cuDeviceGet(&dev, device);
        if (r == CUDA_SUCCESS)
            r = tally__cu.cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, dev);
        if (r != CUDA_SUCCESS) {
            rc = tally__cu_why(r, "cuDeviceGetAttribute", why, whylen);
        } else if (!supported) {
            snprintf(why, whylen, "device %d does not support stream-ordered memory pools", device);
            rc = TALLY_EBACKEND;
        } else {
            if (private_pool) {
                CUmemPoolProps props = {0};
                props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
                props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
                props.location.id = device;
                r = tally__cu.cuMemPoolCreate(&pools[device], &props);
            } else {
                r = tally__cu.cuDeviceGetDefaultMemPool(&pools[device], dev);
            }
            if (r != CUDA_SUCCESS) {
                rc = tally__cu_why(r, private_pool ? "cuMemPoolCreate" : "cuDeviceGetDefaultMemPool", why, whylen);
            } else {
                cuuint64_t threshold = release_threshold;
                tally__cu.cuMemPoolSetAttribute(pools[device], CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold);
                /* Access asked for before the pool existed; a refusal is
                 * reported and does not stop allocation on the device. */
                char refused[200];
                for (int p = 0; p < TALLY_MAX_DEVICES; p++)
                    if (peers[device] >> p & 1 && grant(device, p, refused, sizeof refused))
                        tally__diag("device %d: peer %d gets no access to the pool: %s", device, p, refused);
                /* Where the driver cannot make it, frees stay on the block's stream. */
                if (!tally__cu.cuStreamCreate ||
                    tally__cu.cuStreamCreate(&free_streams[device], CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
                    free_streams[device] = NULL;
                atomic_store(&ready[device], 1);
            }
        }
    }
    pthread_mutex_unlock(&setup_lock);
    return rc;
}

/* Pool memory ignores cuCtxEnablePeerAccess: a peer reaches it only through
 * cuMemPoolSetAccess. Remembered, and applied when the pool is set up. */
static int async_pool_peer_access(int device, int peer, char *why, size_t whylen)
{
    int rc = 0;
    pthread_mutex_lock(&setup_lock);
    peers[device] |= (uint64_t)1 << peer;
    if (atomic_load(&ready[device])) {
        tally_cu_guard_t g;
        rc = tally__cu_enter(&g, device, why, whylen);
        if (!rc) {
            rc = grant(device, peer, why, whylen);
            tally__cu_leave(&g);
        }
    }
    pthread_mutex_unlock(&setup_lock);
    return rc;
}

static int async_alloc(int device, size_t size, void *stream, void **ptr, char *why, size_t whylen)
{
    tally_cu_guard_t g;
    if (tally__cu_enter(&g, device, why, whylen))
        return TALLY_EBACKEND;
    int rc = atomic_load(&ready[device]) ? 0 : pool_setup(device, why, whylen);
    if (rc) {
        tally__cu_leave(&g);
        return TALLY_EBACKEND;
    }
    CUdeviceptr p = 0;
    CUresult r = tally__cu.cuMemAllocFromPoolAsync(&p, size, pools[device], (CUstream)stream);
    tally__cu_leave(&g);
    if (r == CUDA_SUCCESS) {
        *ptr = (void *)(uintptr_t)p;
        return 0;
    }
    return tally__cu_why(r, "cuMemAllocFromPoolAsync", why, whylen);
}

static int async_free(int device, void *ptr, size_t size, void *stream)
{
    (void)size;
    tally_cu_guard_t g;
    if (tally__cu_enter_used(&g, device))
        return TALLY_EBACKEND;
    CUresult r = tally__cu.cuMemFreeAsync((CUdeviceptr)(uintptr_t)ptr, (CUstream)stream);
    tally__cu_leave(&g);
    if (r != CUDA_SUCCESS) {
        tally__cu_fail(r, "cuMemFreeAsync", device);
        return TALLY_EBACKEND;
    }
    return 0;
}

/* stream (of device) waits for event (which may belong to another device:
 * cuStreamWaitEvent accepts that). */
static int async_stream_wait(int device, void *stream, void *event)
{
    tally_cu_guard_t g;
    if (tally__cu_enter_used(&g, device))
        return TALLY_EBACKEND;
    CUresult r = tally__cu.cuStreamWaitEvent((CUstream)stream, (CUevent)event, 0);
    tally__cu_leave(&g);
    return r == CUDA_SUCCESS ? 0 : TALLY_EBACKEND;
}

static void *async_free_stream(int device)
{
    return atomic_load(&ready[device]) ? free_streams[device] : NULL;
}

static int async_trim(int device, size_t keep)
{
    if (!atomic_load(&ready[device]))
        return 0;
    return tally__cu.cuMemPoolTrimTo(pools[device], keep) == CUDA_SUCCESS ? 0 : TALLY_EBACKEND;
}

static int async_pool_usage(int device, uint64_t usage[4])
{
    static const CUmemPool_attribute attrs[4] = {CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
                                                 CU_MEMPOOL_ATTR_USED_MEM_CURRENT, CU_MEMPOOL_ATTR_USED_MEM_HIGH};
    for (int i = 0; i < 4; i++) {
        cuuint64_t v = 0;
        if (atomic_load(&ready[device]) &&
            tally__cu.cuMemPoolGetAttribute(pools[device], attrs[i], &v) != CUDA_SUCCESS)
            return TALLY_EBACKEND;
        usage[i] = v;
    }
    return 0;
}

static int async_pool_reset_peak(int device)
{
    if (!atomic_load(&ready[device]))
        return 0;
    cuuint64_t zero = 0;
    tally__cu.cuMemPoolSetAttribute(pools[device], CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &zero);
    tally__cu.cuMemPoolSetAttribute(pools[device], CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero);
    return 0;
}

static void async_shutdown(void)
{
}

const tally_backend_t tally__backend_async = {
    .name = "async",
    .can_exit_call = false,
    .passthrough = true,
    .init = async_init,
    .device_count = async_device_count,
    .alloc = async_alloc,
    .free = async_free,
    TALLY_CU_BACKEND_COMMON,
    .stream_wait = async_stream_wait,
    .free_stream = async_free_stream,
    .pool_peer_access = async_pool_peer_access,
    .trim = async_trim,
    .pool_usage = async_pool_usage,
    .pool_reset_peak = async_pool_reset_peak,
    .shutdown = async_shutdown,
};
