/* The cuda backend's side of a private tag's sleep with offload: pinned
 * host memory for the backups (cuMemHostAlloc with CU_MEMHOSTALLOC_PORTABLE,
 * so any context may copy to and from it; cuMemFreeHost) and the copies
 * (cuMemcpyDtoH before the unmap, cuMemcpyHtoD after the wake's map). Each
 * call runs in the device's primary context (pushed and popped) and in the
 * relaxed capture mode; the copies are synchronous: when they return the
 * bytes are there. A driver without these entry points refuses offload
 * with the reason (discard still works). */
#include "backend/cuda/cu.h"
#include "backend/cuda/vmm.h"

#include <stdio.h>

static int missing(const char *name, char *why, size_t whylen)
{
    snprintf(why, whylen, "this CUDA driver has no %s: offload cannot be used (discard can)", name);
    return TALLY_EBACKEND;
}

int tally__cu_host_alloc(int device, size_t size, void **ptr, char *why, size_t whylen)
{
    if (!tally__cu.cuMemHostAlloc || !tally__cu.cuMemFreeHost)
        return missing("cuMemHostAlloc", why, whylen);
    tally_cu_guard_t g;
    if (tally__cu_enter(&g, device, why, whylen))
        return TALLY_EBACKEND;
    CUresult r = tally__cu.cuMemHostAlloc(ptr, size, CU_MEMHOSTALLOC_PORTABLE);
    tally__cu_leave(&g);
    return r == CUDA_SUCCESS ? 0 : tally__cu_why(r, "cuMemHostAlloc", why, whylen);
}

void tally__cu_host_free(int device, void *ptr, size_t size)
{
    (void)size;
    tally_cu_guard_t g;
    if (tally__cu_enter_used(&g, device))
        return;
    CUresult r = tally__cu.cuMemFreeHost(ptr);
    tally__cu_leave(&g);
    if (r != CUDA_SUCCESS)
        tally__cu_fail(r, "cuMemFreeHost", device);
}

static int copy(int device, void *host, uintptr_t dev, size_t size, bool to_host, char *why, size_t whylen)
{
    if (!tally__cu.cuMemcpyDtoH || !tally__cu.cuMemcpyHtoD)
        return missing("cuMemcpyDtoH", why, whylen);
    tally_cu_guard_t g;
    if (tally__cu_enter(&g, device, why, whylen))
        return TALLY_EBACKEND;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    tally__cu.cuThreadExchangeStreamCaptureMode(&mode);
    CUresult r = to_host ? tally__cu.cuMemcpyDtoH(host, (CUdeviceptr)dev, size)
                         : tally__cu.cuMemcpyHtoD((CUdeviceptr)dev, host, size);
    tally__cu.cuThreadExchangeStreamCaptureMode(&mode);
    tally__cu_leave(&g);
    if (r == CUDA_SUCCESS)
        return 0;
    tally__cu_why(r, to_host ? "cuMemcpyDtoH" : "cuMemcpyHtoD", why, whylen);
    return TALLY_EBACKEND; /* not an OOM: the memory is there */
}

int tally__cu_copy_to_host(int device, void *host, const void *dev, size_t size, char *why, size_t whylen)
{
    return copy(device, host, (uintptr_t)dev, size, true, why, whylen);
}

int tally__cu_copy_to_device(int device, void *dev, const void *host, size_t size, char *why, size_t whylen)
{
    return copy(device, (void *)host, (uintptr_t)dev, size, false, why, whylen);
}
