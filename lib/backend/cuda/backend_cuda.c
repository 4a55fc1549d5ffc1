/* The cuda backend: cuMemAlloc / cuMemFree in the primary context of the
 * block's device (pushed for the call and popped after, so frees may arrive
 * while any device, or none, is current), events for cross-stream reuse,
 * cuMemGetInfo; pages for expandable segments on CUDA's virtual memory
 * management API (vmm.c).
 *
 * Allocation and free run in the relaxed stream-capture mode
 * (cuThreadExchangeStreamCaptureMode, restored after): under the default
 * global mode, cuMemAlloc while any stream captures would invalidate that
 * capture (PyTorch's cudaMallocMaybeCapturing does the same). */
#include "backend/cuda/cu.h"
#include "backend/cuda/vmm.h"

#include <stdio.h>

static int cuda_init(const tally_options_t *opt, char *why, size_t whylen)
{
    (void)opt;
    return tally__cu_init(why, whylen);
}

static int cuda_device_count(void)
{
    return tally__cu_device_count();
}

static int cuda_alloc(int device, size_t size, void *stream, void **ptr, char *why, size_t whylen)
{
    (void)stream;
    tally_cu_guard_t g;
    int rc = tally__cu_enter(&g, device, why, whylen);
    if (rc)
        return TALLY_EBACKEND;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    tally__cu.cuThreadExchangeStreamCaptureMode(&mode);
    CUdeviceptr p = 0;
    CUresult r = tally__cu.cuMemAlloc(&p, size);
    tally__cu.cuThreadExchangeStreamCaptureMode(&mode);
    tally__cu_leave(&g);
    if (r == CUDA_SUCCESS) {
        *ptr = (void *)(uintptr_t)p;
        return 0;
    }
    return tally__cu_why(r, "cuMemAlloc", why, whylen);
}

static int cuda_free(int device, void *ptr, size_t size, void *stream)
{
    (void)size;
    (void)stream;
    tally_cu_guard_t g;
    if (tally__cu_enter_used(&g, device))
        return TALLY_EBACKEND;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    tally__cu.cuThreadExchangeStreamCaptureMode(&mode);
    CUresult r = tally__cu.cuMemFree((CUdeviceptr)(uintptr_t)ptr);
    tally__cu.cuThreadExchangeStreamCaptureMode(&mode);
    tally__cu_leave(&g);
    if (r != CUDA_SUCCESS) {
        tally__cu_fail(r, "cuMemFree", device);
        return TALLY_EBACKEND;
    }
    return 0;
}

static void cuda_shutdown(void)
{
}

const tally_backend_t tally__backend_cuda = {
    .name = "cuda",
    .can_exit_call = false,
    .init = cuda_init,
    .device_count = cuda_device_count,
    .alloc = cuda_alloc,
    .free = cuda_free,
    TALLY_CU_BACKEND_COMMON,
    TALLY_CU_BACKEND_VMM,
    .host_alloc = tally__cu_host_alloc,
    .host_free = tally__cu_host_free,
    .copy_to_host = tally__cu_copy_to_host,
    .copy_to_device = tally__cu_copy_to_device,
    .shutdown = cuda_shutdown,
};
