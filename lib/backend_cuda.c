/* The cuda backend: cudaMalloc / cudaFree, events for cross-stream reuse,
 * cudaMemGetInfo. Every call selects the block's device first and restores
 * the caller's current device afterwards, so frees may arrive while any
 * device is current. The device guard, events, memory info and
 * synchronisation here serve the async backend too (backend.h). Compiled
 * only when CUDA's headers were found. */
#ifdef TALLY_HAVE_CUDA
#include "backend.h"

#include <cuda_runtime_api.h>
#include <stdio.h>

int tally__cuda_guard_enter(tally_cuda_guard_t *g, int device)
{
    g->switched = false;
    if (cudaGetDevice(&g->prev) != cudaSuccess)
        return -1;
    if (g->prev != device) {
        if (cudaSetDevice(device) != cudaSuccess)
            return -1;
        g->switched = true;
    }
    return 0;
}

void tally__cuda_guard_leave(tally_cuda_guard_t *g)
{
    if (g->switched)
        cudaSetDevice(g->prev);
}

int tally__cuda_probe(char *why, size_t whylen)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(why, whylen, "cudaGetDeviceCount: %s", cudaGetErrorString(e));
        cudaGetLastError();
        return 0;
    }
    if (n <= 0) {
        snprintf(why, whylen, "no CUDA device visible");
        return 0;
    }
    snprintf(why, whylen, "%d CUDA device%s visible", n, n == 1 ? "" : "s");
    return n;
}

static int ndev;

static int cuda_init(const tally_options_t *opt, char *why, size_t whylen)
{
    (void)opt;
    ndev = tally__cuda_probe(why, whylen);
    return ndev > 0 ? 0 : TALLY_EBACKEND;
}

static int cuda_device_count(void)
{
    return ndev;
}

static int cuda_alloc(int device, size_t size, void *stream, void **ptr, char *why, size_t whylen)
{
    (void)stream;
    tally_cuda_guard_t g;
    if (tally__cuda_guard_enter(&g, device)) {
        snprintf(why, whylen, "cannot select CUDA device %d", device);
        return TALLY_EBACKEND;
    }
    cudaError_t e = cudaMalloc(ptr, size);
    tally__cuda_guard_leave(&g);
    if (e == cudaSuccess)
        return 0;
    cudaGetLastError(); /* clear the sticky-free error state */
    snprintf(why, whylen, "cudaMalloc(%zu) on device %d: %s", size, device, cudaGetErrorString(e));
    return e == cudaErrorMemoryAllocation ? TALLY_ENOMEM : TALLY_EBACKEND;
}

static int cuda_free(int device, void *ptr, size_t size, void *stream)
{
    (void)size;
    (void)stream;
    tally_cuda_guard_t g;
    if (tally__cuda_guard_enter(&g, device))
        return TALLY_EBACKEND;
    cudaError_t e = cudaFree(ptr);
    tally__cuda_guard_leave(&g);
    return e == cudaSuccess ? 0 : TALLY_EBACKEND;
}

int tally__cuda_mem_info(int device, size_t *free_bytes, size_t *total_bytes)
{
    tally_cuda_guard_t g;
    if (tally__cuda_guard_enter(&g, device))
        return TALLY_EBACKEND;
    cudaError_t e = cudaMemGetInfo(free_bytes, total_bytes);
    tally__cuda_guard_leave(&g);
    return e == cudaSuccess ? 0 : TALLY_EBACKEND;
}

int tally__cuda_event_create(int device, void **event)
{
    tally_cuda_guard_t g;
    if (tally__cuda_guard_enter(&g, device))
        return TALLY_EBACKEND;
    cudaEvent_t ev;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    tally__cuda_guard_leave(&g);
    if (e != cudaSuccess)
        return TALLY_EBACKEND;
    *event = ev;
    return 0;
}

int tally__cuda_event_record(int device, void *event, void *stream)
{
    tally_cuda_guard_t g;
    if (tally__cuda_guard_enter(&g, device))
        return TALLY_EBACKEND;
    cudaError_t e = cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream);
    tally__cuda_guard_leave(&g);
    return e == cudaSuccess ? 0 : TALLY_EBACKEND;
}

int tally__cuda_event_query(int device, void *event)
{
    (void)device;
    cudaError_t e = cudaEventQuery((cudaEvent_t)event);
    if (e == cudaSuccess)
        return 0;
    if (e == cudaErrorNotReady) {
        cudaGetLastError();
        return 1;
    }
    return -TALLY_EBACKEND;
}

int tally__cuda_event_sync(int device, void *event)
{
    (void)device;
    return cudaEventSynchronize((cudaEvent_t)event) == cudaSuccess ? 0 : TALLY_EBACKEND;
}

int tally__cuda_event_destroy(int device, void *event)
{
    tally_cuda_guard_t g;
    if (tally__cuda_guard_enter(&g, device))
        return TALLY_EBACKEND;
    cudaError_t e = cudaEventDestroy((cudaEvent_t)event);
    tally__cuda_guard_leave(&g);
    return e == cudaSuccess ? 0 : TALLY_EBACKEND;
}

int tally__cuda_synchronize(int device)
{
    tally_cuda_guard_t g;
    if (tally__cuda_guard_enter(&g, device))
        return TALLY_EBACKEND;
    cudaError_t e = cudaDeviceSynchronize();
    tally__cuda_guard_leave(&g);
    return e == cudaSuccess ? 0 : TALLY_EBACKEND;
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
    .mem_info = tally__cuda_mem_info,
    .event_create = tally__cuda_event_create,
    .event_record = tally__cuda_event_record,
    .event_query = tally__cuda_event_query,
    .event_sync = tally__cuda_event_sync,
    .event_destroy = tally__cuda_event_destroy,
    .synchronize = tally__cuda_synchronize,
    .shutdown = cuda_shutdown,
};
#else
/* Without CUDA headers this file is empty by design. */
typedef int tally_backend_cuda_absent;
#endif
