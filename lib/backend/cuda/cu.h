/* The CUDA layer shared by the cuda and async backends (lib/backend/cuda/): the
 * driver's entry points loaded at run time (loader.c), the primary context
 * of each device tally uses and the guard that makes it current for one
 * call (context.c), streams' devices, events kept per device, and error
 * text that names the call and CUDA's name for the error.
 *
 * Nothing here links against CUDA: libcuda.so.1 is opened with dlopen the
 * first time a backend starts, and every call goes through tally__cu. */
#ifndef TALLY_CUDA_CU_H
#define TALLY_CUDA_CU_H

#include "backend/backend.h"
#include "backend/cuda/driver.h"

/* Every entry point of driver.h; optional ones may be NULL. */
typedef struct tally_cu {
#define TALLY_CU_FIELD(name, version, required, params) tally_pfn_##name name;
    TALLY_CU_ENTRY_POINTS(TALLY_CU_FIELD)
#undef TALLY_CU_FIELD
    tally_pfn_cuStreamGetCtx_v2 cuStreamGetCtx_v2; /* CUDA 12.5 form, NULL on older drivers */
    int driver_version; /* cuDriverGetVersion, e.g. 12080 */
    int ndev;           /* cuDeviceGetCount, capped at TALLY_MAX_DEVICES */
} tally_cu_t;

extern tally_cu_t tally__cu;

/* loader.c: open libcuda.so.1, take the entry points, cuInit, check the
 * driver version, count devices. Once per process; later calls return the
 * first result. Returns the device count (> 0), or 0 with why set (one
 * line, e.g. "no libcuda.so.1: no NVIDIA driver on this machine"). */
int tally__cu_load(char *why, size_t whylen);
/* Whether the driver library is loaded (it is never unloaded). */
bool tally__cu_loaded(void);
/* "call: CUDA_ERROR_NAME (description)" into why; returns TALLY_ENOMEM for
 * CUDA_ERROR_OUT_OF_MEMORY, else TALLY_EBACKEND. */
int tally__cu_why(CUresult r, const char *call, char *why, size_t whylen);
/* The same, also recorded as the thread's last error and written to the
 * diagnostics sink (a failure the caller sees). */
int tally__cu_fail(CUresult r, const char *call, int device);

/* context.c: the primary context of a device, retained the first time tally
 * uses that device (and only then). The guard makes it current for one call
 * and restores the caller's context: push when another context (or none) is
 * current, pop after. */
typedef struct tally_cu_guard {
    bool pushed;
} tally_cu_guard_t;
/* Retain (first use) and make current; 0, or a CUresult-derived error with
 * why set. */
int tally__cu_enter(tally_cu_guard_t *g, int device, char *why, size_t whylen);
/* As enter, but only for a device tally already uses: returns 1 (nothing
 * pushed, nothing created) when the device has no retained context. */
int tally__cu_enter_used(tally_cu_guard_t *g, int device);
void tally__cu_leave(tally_cu_guard_t *g);
/* Whether tally holds device's primary context. */
bool tally__cu_device_used(int device);

/* The device a stream belongs to. NULL, CU_STREAM_LEGACY and
 * CU_STREAM_PER_THREAD name the default stream of whatever context is
 * current, so they mean: the current context's device when the calling
 * thread has one, else fallback. Other streams: cuStreamGetCtx and that
 * context's device (it works during a capture); cuStreamGetDevice only when
 * there is no context to be had. -1 when the stream's device cannot be
 * found. */
int tally__cu_stream_device(void *stream, int fallback);

/* Events of a device, created with CU_EVENT_DISABLE_TIMING in its primary
 * context; put back ones are kept as spares of that device. */
int tally__cu_event_create(int device, void **event);
int tally__cu_event_record(int device, void *event, void *stream);
int tally__cu_event_query(int device, void *event);
int tally__cu_event_sync(int device, void *event);
int tally__cu_event_destroy(int device, void *event);
int tally__cu_stream_sync(int device, void *stream);
int tally__cu_synchronize(int device);
int tally__cu_mem_info(int device, size_t *free_bytes, size_t *total_bytes);
int tally__cu_capacity(int device, size_t *total_bytes);
/* 1 while stream (of device) is capturing, 0 if not, negative on error. */
int tally__cu_stream_capturing(int device, void *stream);
/* The backend table entries the cuda and async backends share. */
#define TALLY_CU_BACKEND_COMMON                                                                                    \
    .mem_info = tally__cu_mem_info, .capacity = tally__cu_capacity, .stream_device = tally__cu_stream_device,      \
    .stream_sync = tally__cu_stream_sync, .stream_capturing = tally__cu_stream_capturing,                          \
    .event_create = tally__cu_event_create, .event_record = tally__cu_event_record,                                \
    .event_query = tally__cu_event_query, .event_sync = tally__cu_event_sync,                                      \
    .event_destroy = tally__cu_event_destroy, .synchronize = tally__cu_synchronize

/* Backend init shared by cuda and async: load, count. */
int tally__cu_init(char *why, size_t whylen);
int tally__cu_device_count(void);

#endif
