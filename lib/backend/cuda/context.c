/* Contexts, streams and events on the driver API, shared by the cuda and
 * async backends.
 *
 * Each device tally is asked to use gets its primary context (the one the
 * CUDA runtime and PyTorch use too) retained at its first use, and only
 * then: no other device ever gets a context from tally. Every call that
 * needs a context goes through a guard that pushes the device's primary
 * context when it is not already current and pops it afterwards, so the
 * caller's current context (and current device) never changes, and a thread
 * that never selected a device (a fresh thread freeing memory) gets no
 * context of its own.
 *
 * Events are created in the primary context of the device whose stream they
 * are recorded on (CUDA refuses to record an event on a stream of another
 * context); spare events are kept per device. */
#include "backend/cuda/cu.h"

#include <pthread.h>
#include <stdio.h>

static CUcontext primary[TALLY_MAX_DEVICES];
static _Atomic int used[TALLY_MAX_DEVICES];
static pthread_mutex_t retain_lock = PTHREAD_MUTEX_INITIALIZER;

/* Spare events of one device (a leaf lock: taken with no other held, or
 * under a device lock). */
enum { SPARE_EVENTS = 64 };
typedef struct spare {
    tally_mutex_t lock;
    int n;
    CUevent ev[SPARE_EVENTS];
} spare_t;
static spare_t spares[TALLY_MAX_DEVICES];

bool tally__cu_device_used(int device)
{
    return device >= 0 && device < TALLY_MAX_DEVICES && atomic_load(&used[device]) != 0;
}

static int retain(int device, char *why, size_t whylen)
{
    int rc = 0;
    pthread_mutex_lock(&retain_lock);
    if (!atomic_load(&used[device])) {
        CUdevice dev = 0;
        CUcontext ctx = NULL;
        const char *call = "cuDeviceGet";
        CUresult r = tally__cu.cuDeviceGet(&dev, device);
        if (r == CUDA_SUCCESS) {
            call = "cuDevicePrimaryCtxRetain";
            r = tally__cu.cuDevicePrimaryCtxRetain(&ctx, dev);
        }
        if (r != CUDA_SUCCESS) {
            rc = tally__cu_why(r, call, why, whylen);
        } else {
            primary[device] = ctx;
            atomic_store(&used[device], 1);
        }
    }
    pthread_mutex_unlock(&retain_lock);
    return rc;
}

static int push(tally_cu_guard_t *g, int device, char *why, size_t whylen)
{
    CUcontext cur = NULL;
    g->pushed = false;
    if (tally__cu.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == primary[device])
        return 0;
    CUresult r = tally__cu.cuCtxPushCurrent(primary[device]);
    if (r != CUDA_SUCCESS)
        return tally__cu_why(r, "cuCtxPushCurrent", why, whylen);
    g->pushed = true;
    return 0;
}

int tally__cu_enter(tally_cu_guard_t *g, int device, char *why, size_t whylen)
{
    g->pushed = false;
    if (!atomic_load_explicit(&used[device], memory_order_acquire)) {
        int rc = retain(device, why, whylen);
        if (rc)
            return rc;
    }
    return push(g, device, why, whylen);
}

int tally__cu_enter_used(tally_cu_guard_t *g, int device)
{
    char why[160];
    g->pushed = false;
    if (!tally__cu_device_used(device))
        return 1;
    return push(g, device, why, sizeof why) ? -1 : 0;
}

void tally__cu_leave(tally_cu_guard_t *g)
{
    if (g->pushed) {
        CUcontext popped;
        tally__cu.cuCtxPopCurrent(&popped);
        g->pushed = false;
    }
}

static bool special_stream(void *stream)
{
    return stream == NULL || stream == (void *)CU_STREAM_LEGACY || stream == (void *)CU_STREAM_PER_THREAD;
}

/* The device of the calling thread's current context, or -1 if none. */
static int current_device(void)
{
    CUcontext cur = NULL;
    CUdevice dev = -1;
    if (tally__cu.cuCtxGetCurrent(&cur) != CUDA_SUCCESS || !cur)
        return -1;
    return tally__cu.cuCtxGetDevice(&dev) == CUDA_SUCCESS ? (int)dev : -1;
}

/* The device of a stream: from its context (cuStreamGetCtx, its CUDA 12.5
 * form where the driver has it, which also answers for a green context's
 * stream with the device's primary context; it works in every capture
 * mode; a primary context tally retained names its device with no further
 * call, another is made current for one cuCtxGetDevice, which is no
 * synchronising call either). cuStreamGetDevice only where the context
 * cannot be had (cuStreamGetCtx refuses green-context streams on CUDA 12
 * drivers): some drivers refuse it during a capture, and the refusal
 * invalidates the capture (../shared/cuda.md, "CUDA graph capture"). */
int tally__cu_stream_device(void *stream, int fallback)
{
    if (special_stream(stream)) {
        int cur = current_device();
        return cur >= 0 ? cur : fallback;
    }
    CUdevice dev = -1;
    CUcontext ctx = NULL;
    CUgreenCtx green = NULL;
    CUresult got = tally__cu.cuStreamGetCtx_v2 ? tally__cu.cuStreamGetCtx_v2((CUstream)stream, &ctx, &green)
                                               : tally__cu.cuStreamGetCtx((CUstream)stream, &ctx);
    if (got != CUDA_SUCCESS || !ctx) {
        if (tally__cu.cuStreamGetDevice && tally__cu.cuStreamGetDevice((CUstream)stream, &dev) == CUDA_SUCCESS)
            return (int)dev;
        return -1;
    }
    for (int i = 0; i < TALLY_MAX_DEVICES; i++)
        if (atomic_load_explicit(&used[i], memory_order_acquire) && primary[i] == ctx)
            return i;
    /* The context's device: make it current for one call. */
    if (tally__cu.cuCtxPushCurrent(ctx) != CUDA_SUCCESS)
        return -1;
    CUresult r = tally__cu.cuCtxGetDevice(&dev);
    CUcontext popped;
    tally__cu.cuCtxPopCurrent(&popped);
    return r == CUDA_SUCCESS ? (int)dev : -1;
}

int tally__cu_event_create(int device, void **event)
{
    spare_t *s = &spares[device];
    tally__mutex_lock(&s->lock);
    CUevent ev = s->n ? s->ev[--s->n] : NULL;
    tally__mutex_unlock(&s->lock);
    if (ev) {
        *event = ev;
        return 0;
    }
    char why[160];
    tally_cu_guard_t g;
    if (tally__cu_enter(&g, device, why, sizeof why))
        return TALLY_EBACKEND;
    CUresult r = tally__cu.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING);
    tally__cu_leave(&g);
    if (r != CUDA_SUCCESS)
        return TALLY_EBACKEND;
    *event = ev;
    return 0;
}

/* Put an event back among the device's spares (destroyed when full). */
int tally__cu_event_destroy(int device, void *event)
{
    spare_t *s = &spares[device];
    tally__mutex_lock(&s->lock);
    bool kept = s->n < SPARE_EVENTS;
    if (kept)
        s->ev[s->n++] = event;
    tally__mutex_unlock(&s->lock);
    if (kept)
        return 0;
    tally_cu_guard_t g;
    if (tally__cu_enter_used(&g, device))
        return TALLY_EBACKEND;
    CUresult r = tally__cu.cuEventDestroy((CUevent)event);
    tally__cu_leave(&g);
    return r == CUDA_SUCCESS ? 0 : TALLY_EBACKEND;
}

int tally__cu_event_record(int device, void *event, void *stream)
{
    char why[160];
    tally_cu_guard_t g;
    if (tally__cu_enter(&g, device, why, sizeof why))
        return TALLY_EBACKEND;
    CUresult r = tally__cu.cuEventRecord((CUevent)event, (CUstream)stream);
    tally__cu_leave(&g);
    return r == CUDA_SUCCESS ? 0 : TALLY_EBACKEND;
}

int tally__cu_event_query(int device, void *event)
{
    (void)device;
    CUresult r = tally__cu.cuEventQuery((CUevent)event);
    if (r == CUDA_SUCCESS)
        return 0;
    return r == CUDA_ERROR_NOT_READY ? 1 : -TALLY_EBACKEND;
}

int tally__cu_event_sync(int device, void *event)
{
    (void)device;
    return tally__cu.cuEventSynchronize((CUevent)event) == CUDA_SUCCESS ? 0 : TALLY_EBACKEND;
}

int tally__cu_stream_sync(int device, void *stream)
{
    char why[160];
    tally_cu_guard_t g;
    if (tally__cu_enter(&g, device, why, sizeof why))
        return TALLY_EBACKEND;
    CUresult r = tally__cu.cuStreamSynchronize((CUstream)stream);
    tally__cu_leave(&g);
    return r == CUDA_SUCCESS ? 0 : TALLY_EBACKEND;
}

/* Only a device tally uses has work of tally's to wait for. */
int tally__cu_synchronize(int device)
{
    tally_cu_guard_t g;
    int rc = tally__cu_enter_used(&g, device);
    if (rc)
        return rc > 0 ? 0 : TALLY_EBACKEND;
    CUresult r = tally__cu.cuCtxSynchronize();
    tally__cu_leave(&g);
    return r == CUDA_SUCCESS ? 0 : TALLY_EBACKEND;
}

int tally__cu_mem_info(int device, size_t *free_bytes, size_t *total_bytes)
{
    char why[160];
    tally_cu_guard_t g;
    if (tally__cu_enter(&g, device, why, sizeof why))
        return TALLY_EBACKEND;
    CUresult r = tally__cu.cuMemGetInfo(free_bytes, total_bytes);
    tally__cu_leave(&g);
    return r == CUDA_SUCCESS ? 0 : TALLY_EBACKEND;
}

/* The device's memory size, with no context (for memory fractions). */
int tally__cu_capacity(int device, size_t *total_bytes)
{
    CUdevice dev = 0;
    if (tally__cu.cuDeviceGet(&dev, device) != CUDA_SUCCESS)
        return TALLY_EBACKEND;
    return tally__cu.cuDeviceTotalMem(total_bytes, dev) == CUDA_SUCCESS ? 0 : TALLY_EBACKEND;
}

/* A legacy default stream cannot be queried while another stream of its
 * context captures in global mode (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT):
 * that too means a capture is under way on the device. A created stream
 * names its context: one driver call, no context switch; a default-stream
 * handle means the current context's, so the device's is made current. */
int tally__cu_stream_capturing(int device, void *stream)
{
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult r;
    if (!tally__cu_device_used(device))
        return 0;
    if (!special_stream(stream)) {
        r = tally__cu.cuStreamIsCapturing((CUstream)stream, &st);
    } else {
        tally_cu_guard_t g;
        if (tally__cu_enter_used(&g, device))
            return -TALLY_EBACKEND;
        r = tally__cu.cuStreamIsCapturing((CUstream)stream, &st);
        tally__cu_leave(&g);
    }
    if (r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
        return 1;
    if (r != CUDA_SUCCESS)
        return -TALLY_EBACKEND;
    return st != CU_STREAM_CAPTURE_STATUS_NONE;
}
