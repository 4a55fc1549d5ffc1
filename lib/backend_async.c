/* The async backend: CUDA's stream-ordered allocator. One cudaMemPool_t per
 * device (the device's default pool, or a private one with
 * async_pool:private), cudaMallocAsync / cudaFreeAsync on the block's
 * stream, the pool's release threshold from async_release_threshold, and
 * cudaMemPoolTrimTo for empty_cache and stage-end release. The driver does
 * the caching, so the cache layer runs in pass-through mode (one record per
 * allocation, no splitting) and keeps the ledger and statistics; reserved
 * memory is read from the pool's own attributes. */
#ifdef TALLY_HAVE_CUDA
#include "backend.h"

#include <cuda_runtime_api.h>
#include <stdio.h>

static int ndev;
static cudaMemPool_t pools[TALLY_MAX_DEVICES];

static int async_init(const tally_options_t *opt, char *why, size_t whylen)
{
    ndev = tally__cuda_probe(why, whylen);
    if (ndev <= 0)
        return TALLY_EBACKEND;
    if (ndev > TALLY_MAX_DEVICES)
        ndev = TALLY_MAX_DEVICES;
    for (int d = 0; d < ndev; d++) {
        int supported = 0;
        cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, d);
        if (!supported) {
            snprintf(why, whylen, "device %d does not support stream-ordered memory pools", d);
            return TALLY_EBACKEND;
        }
        cudaError_t e;
        if (opt->async_private_pool) {
            struct cudaMemPoolProps props = {0};
            props.allocType = cudaMemAllocationTypePinned;
            props.location.type = cudaMemLocationTypeDevice;
            props.location.id = d;
            e = cudaMemPoolCreate(&pools[d], &props);
        } else {
            e = cudaDeviceGetDefaultMemPool(&pools[d], d);
        }
        if (e != cudaSuccess) {
            snprintf(why, whylen, "device %d: cannot get a memory pool: %s", d, cudaGetErrorString(e));
            return TALLY_EBACKEND;
        }
        uint64_t threshold = opt->async_release_threshold;
        cudaMemPoolSetAttribute(pools[d], cudaMemPoolAttrReleaseThreshold, &threshold);
    }
    return 0;
}

static int async_device_count(void)
{
    return ndev;
}

static int async_alloc(int device, size_t size, void *stream, void **ptr, char *why, size_t whylen)
{
    tally_cuda_guard_t g;
    if (tally__cuda_guard_enter(&g, device)) {
        snprintf(why, whylen, "cannot select CUDA device %d", device);
        return TALLY_EBACKEND;
    }
    cudaError_t e = cudaMallocFromPoolAsync(ptr, size, pools[device], (cudaStream_t)stream);
    tally__cuda_guard_leave(&g);
    if (e == cudaSuccess)
        return 0;
    cudaGetLastError();
    snprintf(why, whylen, "cudaMallocFromPoolAsync(%zu) on device %d: %s", size, device, cudaGetErrorString(e));
    return e == cudaErrorMemoryAllocation ? TALLY_ENOMEM : TALLY_EBACKEND;
}

static int async_free(int device, void *ptr, size_t size, void *stream)
{
    (void)size;
    tally_cuda_guard_t g;
    if (tally__cuda_guard_enter(&g, device))
        return TALLY_EBACKEND;
    cudaError_t e = cudaFreeAsync(ptr, (cudaStream_t)stream);
    tally__cuda_guard_leave(&g);
    return e == cudaSuccess ? 0 : TALLY_EBACKEND;
}

static int async_stream_wait(int device, void *stream, void *event)
{
    tally_cuda_guard_t g;
    if (tally__cuda_guard_enter(&g, device))
        return TALLY_EBACKEND;
    cudaError_t e = cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0);
    tally__cuda_guard_leave(&g);
    return e == cudaSuccess ? 0 : TALLY_EBACKEND;
}

static int async_trim(int device, size_t keep)
{
    return cudaMemPoolTrimTo(pools[device], keep) == cudaSuccess ? 0 : TALLY_EBACKEND;
}

static int async_pool_usage(int device, uint64_t usage[4])
{
    static const enum cudaMemPoolAttr attrs[4] = {cudaMemPoolAttrReservedMemCurrent, cudaMemPoolAttrReservedMemHigh,
                                                  cudaMemPoolAttrUsedMemCurrent, cudaMemPoolAttrUsedMemHigh};
    for (int i = 0; i < 4; i++) {
        uint64_t v = 0;
        if (cudaMemPoolGetAttribute(pools[device], attrs[i], &v) != cudaSuccess)
            return TALLY_EBACKEND;
        usage[i] = v;
    }
    return 0;
}

static int async_pool_reset_peak(int device)
{
    uint64_t zero = 0;
    cudaMemPoolSetAttribute(pools[device], cudaMemPoolAttrReservedMemHigh, &zero);
    cudaMemPoolSetAttribute(pools[device], cudaMemPoolAttrUsedMemHigh, &zero);
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
    .mem_info = tally__cuda_mem_info,
    .event_create = tally__cuda_event_create,
    .event_record = tally__cuda_event_record,
    .event_query = tally__cuda_event_query,
    .event_sync = tally__cuda_event_sync,
    .event_destroy = tally__cuda_event_destroy,
    .stream_wait = async_stream_wait,
    .synchronize = tally__cuda_synchronize,
    .trim = async_trim,
    .pool_usage = async_pool_usage,
    .pool_reset_peak = async_pool_reset_peak,
    .shutdown = async_shutdown,
};
#else
/* Without CUDA headers this file is empty by design. */
typedef int tally_backend_async_absent;
#endif
