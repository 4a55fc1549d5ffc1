/* The CUDA stand-in: internal declarations shared by its files.
 *
 * The stand-in is a small libcuda.so.1 built by the project
 * (build/standin/libcuda.so.1) that implements, on host memory, every CUDA
 * driver entry point tally uses (lib/backend/cuda/driver.h, TALLY_CU_ENTRY_POINTS),
 * with the documented rules that matter to an allocator. Each rule cites
 * the CUDA documentation it encodes: the driver API reference as printed in
 * cuda.h's doc comments (quoted "cuName: '...'"), the CUDA C++ Programming
 * Guide, or the error code's own description in cuda.h. docs/standin.md
 * lists what is modelled and what is not.
 *
 * Simplifications (not CUDA rules, choices of the stand-in):
 * - One process-wide lock (si_lock) and one condition variable (si_cond),
 *   broadcast whenever a stream makes progress. The lock is never held while
 *   a host function runs.
 * - No implicit synchronisation of the legacy default stream with other
 *   blocking streams; streams of a context run independently.
 * - Stream, event and capture objects are never freed (destroy marks them
 *   dead), so a stale handle gives an error instead of a crash.
 * - Memory contents are not modelled: device addresses are backed by a large
 *   MAP_NORESERVE host mapping per device (writable, so tests may touch
 *   them). Virtual-memory handles are pieces of one memory file, so two
 *   mappings of a handle show the same bytes, as on CUDA (vmm.c).
 *
 * Exported names: the implementation of each entry point is defined under
 * the name the real libcuda.so.1 exports for the signature driver.h
 * declares (cuMemAlloc_v2 for cuMemAlloc at 3020, ...): the defines below
 * rename them as cuda.h does, and cuGetProcAddress maps the plain name to it. */
#ifndef TALLY_STANDIN_H
#define TALLY_STANDIN_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cuda/driver.h"

/* cuda.h's renames of the versioned entry points tally uses. */
#define cuDeviceTotalMem cuDeviceTotalMem_v2
#define cuDevicePrimaryCtxRelease cuDevicePrimaryCtxRelease_v2
#define cuCtxPushCurrent cuCtxPushCurrent_v2
#define cuCtxPopCurrent cuCtxPopCurrent_v2
#define cuMemAlloc cuMemAlloc_v2
#define cuMemFree cuMemFree_v2
#define cuMemGetInfo cuMemGetInfo_v2
#define cuStreamDestroy cuStreamDestroy_v2
#define cuEventDestroy cuEventDestroy_v2
#define cuStreamBeginCapture cuStreamBeginCapture_v2
#define cuMemcpyDtoH cuMemcpyDtoH_v2
#define cuMemcpyHtoD cuMemcpyHtoD_v2

#define SI_EXPORT __attribute__((visibility("default")))

/* Every entry point, exported (declared from driver.h's list). */
#define SI_DECLARE(name, version, required, params) SI_EXPORT CUresult name params;
TALLY_CU_ENTRY_POINTS(SI_DECLARE)
#undef SI_DECLARE

/* cuStreamGetCtx's CUDA 12.5 form (driver.h, TALLY_CU_STREAM_GET_CTX_V2):
 * cuGetProcAddress("cuStreamGetCtx", 12050 or later) returns it (lookup.c). */
SI_EXPORT CUresult cuStreamGetCtx_v2(CUstream stream, CUcontext *ctx, CUgreenCtx *green);

/* Not in driver.h's list: the stand-in's marker for cu_is_standin(). */
SI_EXPORT extern const int cuda_standin_version;
/* cuMemCreate calls that asked for gpuDirectRDMACapable memory (vmm.c). */
SI_EXPORT unsigned long long cuda_standin_rdma_creates(void);

#define SI_MAX_DEVICES 16
#define SI_GRANULARITY ((size_t)2 << 20) /* cuMemGetAllocationGranularity */
#define SI_ALIGN ((size_t)512)            /* cuMemAlloc's alignment and charge unit */

/* ---- configuration and process state (init.c) ---------------------------- */
struct si_config {
    int devices;            /* visible devices */
    int physical[SI_MAX_DEVICES]; /* CUDA_VISIBLE_DEVICES: visible -> physical */
    size_t memory;          /* bytes per device */
    int driver_version;     /* what cuDriverGetVersion reports */
    bool stream_device_in_capture; /* CUDA_STANDIN_STREAM_GET_DEVICE_IN_CAPTURE=1 */
    int vmm_rdma;           /* CUDA_STANDIN_VMM_RDMA: the device attribute's value */
    int vmm_unmap_one;      /* CUDA_STANDIN_VMM_UNMAP_ONE: cuMemUnmap takes one whole mapping per call */
};
extern struct si_config si_config;

extern pthread_mutex_t si_lock;
extern pthread_cond_t si_cond;

/* CUDA_SUCCESS when the driver may be used from this process: cuInit
 * succeeded and this is not a child forked after it. */
CUresult si_usable(void);
/* The first statement of every entry point that needs cuInit: counts the
 * call (counts.c), declares rc and returns the error when the driver is
 * unusable. */
#define SI_ENTER()                                                                                                 \
    static _Atomic int si_slot_ = -1;                                                                              \
    si_count_call(&si_slot_, __func__);                                                                            \
    CUresult rc = si_usable();                                                                                     \
    if (rc)                                                                                                        \
    return rc
/* counts.c: count a call of the entry point func (its __func__), once per
 * call; slot caches where its counter is. Add the mappings a per-mapping
 * call (cost.h) touched. */
void si_count_call(_Atomic int *slot, const char *func);
void si_count_mappings(const char *func, unsigned long long n);
/* The driver version before or after cuInit (CUDA_STANDIN_DRIVER_VERSION). */
int si_driver_version(void);
/* Parse a byte count with an optional K/M/G suffix; 0 when malformed. */
size_t si_parse_bytes(const char *text);

/* ---- address arenas (memory.c) -------------------------------------------- */
enum si_extent_kind { SI_EXTENT_ALLOC, SI_EXTENT_POOL, SI_EXTENT_RESERVE };

struct si_extent {
    uintptr_t addr;
    size_t size;
    enum si_extent_kind kind;
    struct CUctx_st *ctx; /* SI_EXTENT_ALLOC: the context that allocated it */
};

/* A range of host addresses handed out first fit, never touched unless the
 * program does: one per device, one for virtual-memory reservations. */
struct si_arena {
    char *base;
    size_t span;
    struct si_extent *live; /* sorted by address */
    size_t count, cap;
};

int si_arena_init(struct si_arena *a, size_t span);
/* Address of `size` bytes aligned to `align`, or 0 when the arena is full. */
uintptr_t si_arena_take(struct si_arena *a, size_t size, size_t align, enum si_extent_kind kind,
                        struct CUctx_st *ctx);
/* The live extent starting exactly at addr, or NULL. */
struct si_extent *si_arena_find(struct si_arena *a, uintptr_t addr);
void si_arena_give(struct si_arena *a, struct si_extent *e);
/* Forget extent e without touching its addresses (an arena of numbers that
 * are not addresses: vmm.c's offsets into its physical memory). */
void si_arena_drop(struct si_arena *a, struct si_extent *e);

/* vmm.c: whether [addr, addr + size) lies wholly in mappings whose access
 * was set (readable; writable when write is set). Called under si_lock. */
bool si_vmm_accessible(uintptr_t addr, size_t size, bool write);
/* memory.c: whether [addr, addr + size) lies wholly in one live cuMemAlloc
 * allocation. Called under si_lock. */
bool si_alloc_holds(uintptr_t addr, size_t size);

/* ---- devices and contexts (init.c, context.c) ----------------------------- */
struct CUctx_st {
    int dev;
    int refs;         /* cuDevicePrimaryCtxRetain count */
    bool active;
    unsigned gen;     /* bumped at each reset: handles of an older gen are dead */
    size_t charge;    /* device memory an active context costs */
    bool peer[SI_MAX_DEVICES]; /* cuCtxEnablePeerAccess */
    struct CUstream_st *legacy;
};

struct si_device {
    size_t capacity, used;
    struct si_arena arena;
    struct CUctx_st ctx; /* the primary context */
    struct CUmemPoolHandle_st *default_pool;
};
extern struct si_device si_devices[SI_MAX_DEVICES];

/* Device memory: charge `bytes` to dev (false when it does not fit). */
bool si_charge(int dev, size_t bytes);
void si_uncharge(int dev, size_t bytes);
bool si_valid_device(CUdevice dev);

/* The calling thread's current context, or NULL. */
struct CUctx_st *si_current(void);
/* The current context, checked: CUDA_ERROR_INVALID_CONTEXT without one,
 * CUDA_ERROR_CONTEXT_IS_DESTROYED when it was reset. Called under si_lock. */
CUresult si_need_current(struct CUctx_st **ctx);
/* Free everything a context owns (its reset). Called under si_lock. */
void si_memory_reset(struct CUctx_st *ctx);

/* ---- streams and events (stream.c, event.c) ------------------------------ */
enum si_op_kind { SI_OP_HOST, SI_OP_WAIT, SI_OP_MARK, SI_OP_POOL_FREE };

struct si_op {
    enum si_op_kind kind;
    CUhostFn fn;
    void *arg;
    struct CUstream_st *wait_stream; /* SI_OP_WAIT: wait until that stream... */
    unsigned long long wait_seq;     /* ...has completed this many operations */
    struct si_block *block;          /* SI_OP_POOL_FREE: the block, and wait_seq its free's number */
    struct si_op *next;
};

struct si_capture;

/* Streams one capture may span (the origin and those joined into it). */
#define SI_CAPTURE_STREAMS 16

struct CUstream_st {
    struct CUctx_st *ctx;
    unsigned gen;
    unsigned flags;
    bool legacy, per_thread, destroyed, worker;
    struct si_op *head, *tail;
    unsigned long long enqueued, completed;
    struct si_capture *capture; /* non-NULL while capturing (its origin or joined into it) */
    int cap_index;              /* its place in capture->streams */
    struct CUstream_st *next_all;
};

struct CUevent_st {
    struct CUctx_st *ctx;
    unsigned gen;
    bool destroyed;
    struct CUstream_st *stream; /* last record, NULL when never recorded */
    unsigned long long seq;
    struct si_capture *captured; /* recorded into this capture */
    /* Recorded in a capture: the captured work it stands for, as the
     * recording stream's clock at the time (capture.c). */
    unsigned long long clock[SI_CAPTURE_STREAMS];
};

/* Resolve a stream handle (NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD or a
 * created stream) under si_lock. */
CUresult si_stream_get(CUstream handle, struct CUstream_st **out);
/* Resolve an event handle under si_lock (CUDA_ERROR_INVALID_HANDLE when it
 * is not a live event). */
CUresult si_event_get(CUevent handle, struct CUevent_st **out);
/* A new operation of that kind (heap), or NULL. */
struct si_op *si_op_new(enum si_op_kind kind);
/* Resolve a stream that is to be queried or synchronised: the capture
 * rules for those (capture.c) included. */
CUresult si_stream_checked(CUstream handle, struct CUstream_st **out);
/* Queue an operation (taken from the heap) and return its sequence number. */
unsigned long long si_stream_push(struct CUstream_st *s, struct si_op *op);
/* Wait under si_lock until s has completed `seq` operations. */
void si_stream_wait(struct CUstream_st *s, unsigned long long seq);
bool si_stream_idle(struct CUstream_st *s);
/* Every stream ever created (for capture and context synchronisation). */
extern struct CUstream_st *si_all_streams;
/* Synchronisation point of a context: release pools over their threshold. */
void si_pool_sync_point(int dev);

/* ---- stream capture (capture.c) -------------------------------------------- */
struct si_capture {
    CUstreamCaptureMode mode;
    pthread_t thread;
    bool invalidated, ended;
    unsigned nodes;
    struct CUstream_st *origin;
    /* The streams of the capture: streams[0] is the origin, the others
     * joined through cuStreamWaitEvent. ops[i]: nodes captured on stream i;
     * clock[i][j]: how many of stream j's nodes stream i's next node depends
     * on (a vector clock: the capture is joined when the origin's clock
     * covers every stream's nodes). */
    int nstreams;
    struct CUstream_st *streams[SI_CAPTURE_STREAMS];
    unsigned long long ops[SI_CAPTURE_STREAMS];
    unsigned long long clock[SI_CAPTURE_STREAMS][SI_CAPTURE_STREAMS];
    struct si_capture *next_all; /* every capture, kept for stale events */
};

struct CUgraph_st {
    unsigned nodes;
    bool destroyed;
    struct si_capture *capture; /* the capture it came from (its graph allocations) */
    struct CUgraph_st *next_all; /* every graph, kept for stale handles */
};

/* Whether a "potentially unsafe" call from this thread is prohibited by a
 * capture under way; if so, invalidate the conflicting captures and return
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED. Called under si_lock. */
CUresult si_capture_unsafe_call(void);
/* Enqueueing on s: CUDA_SUCCESS to execute, SI_CAPTURED when the work is
 * captured instead, or the error (invalidated capture, implicit dependency
 * of the legacy stream on a capture). Called under si_lock. */
#define SI_CAPTURED (-1)
int si_capture_enqueue(struct CUstream_st *s);
/* Querying or synchronising s (cuStreamQuery / cuStreamSynchronize): the
 * error when s is capturing (and the capture is invalidated). */
CUresult si_capture_sync_check(struct CUstream_st *s);
/* Querying or synchronising an event last recorded in a capture. */
CUresult si_capture_event_check(struct CUevent_st *e);
/* Any capture under way on a stream of ctx (cuCtxSynchronize). */
CUresult si_capture_ctx_check(struct CUctx_st *ctx);
/* cuStreamWaitEvent on an event last recorded in a capture: join s into
 * that capture (or refuse). CUDA_SUCCESS when the wait is captured. */
CUresult si_capture_join(struct CUstream_st *s, struct CUevent_st *e);
/* cuEventRecord of e on s while s captures: e stands for s's captured work. */
void si_capture_event_recorded(struct CUstream_st *s, struct CUevent_st *e);
/* Invalidate s's capture (a refused call made with s). */
void si_capture_invalidate(struct CUstream_st *s);
/* The capture graph g came from (graph allocations freed in it go at its
 * destroy, pool.c). */
void si_pool_graph_destroyed(struct si_capture *c);

/* ---- pools (pool.c) ---------------------------------------------------------- */
/* SI_BLOCK_GRAPH_FREED: a graph allocation freed inside its capture (a free
 * node): owned by the graph until cuGraphDestroy. */
enum si_block_state { SI_BLOCK_LIVE, SI_BLOCK_FREEING, SI_BLOCK_FREE, SI_BLOCK_GONE, SI_BLOCK_GRAPH_FREED };

struct si_block {
    uintptr_t addr;
    size_t size;
    enum si_block_state state;
    unsigned long long frees;    /* how many times it was freed */
    unsigned long long free_seq; /* the last free's place on freed_on */
    struct CUstream_st *freed_on;
    struct CUmemPoolHandle_st *pool;
    struct si_capture *graph; /* a graph allocation: the capture that made it, else NULL */
    struct si_block *next;
};

/* A free queued on a stream has executed (stream worker, under si_lock). */
void si_pool_block_freed(struct si_block *b, unsigned long long nth_free);

#endif /* TALLY_STANDIN_H */
