/* tally's own declarations of the few CUDA driver API types, constants and
 * entry points it uses, so that the cuda and async backends build on a
 * machine without the CUDA toolkit and libtally.so has no link-time CUDA
 * dependency: libcuda.so.1 is opened with dlopen at first use and every
 * entry point is taken through cuGetProcAddress with the CUDA version whose
 * signature is declared here (lib/backend/cuda/loader.c).
 *
 * Values and layouts are those of CUDA 13.0's cuda.h; tests/test_backend_driver_h.c
 * checks each one against cuda.h wherever the toolkit is installed. The
 * project's CUDA stand-in (tests/standin/) is built from this header too.
 *
 * Names keep CUDA's spelling (CUresult, CU_STREAM_LEGACY, ...) so that code
 * reads like the CUDA documentation; the header is never installed and is
 * never included together with cuda.h (except by the check). */
#ifndef TALLY_CUDA_DRIVER_H
#define TALLY_CUDA_DRIVER_H

#include <stddef.h>
#include <stdint.h>

/* ---- handles --------------------------------------------------------------- */
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgreenCtx_st *CUgreenCtx;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef uint64_t cuuint64_t;
typedef void (*CUhostFn)(void *userData);

/* ---- results (CUresult) ------------------------------------------------------ */
enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_DEINITIALIZED = 4,
    CUDA_ERROR_STUB_LIBRARY = 34,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_ALREADY_MAPPED = 208,
    CUDA_ERROR_NOT_MAPPED = 211,
    CUDA_ERROR_CONTEXT_ALREADY_IN_USE = 216,
    CUDA_ERROR_OPERATING_SYSTEM = 304,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_ILLEGAL_STATE = 401,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704,
    CUDA_ERROR_PEER_ACCESS_NOT_ENABLED = 705,
    CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE = 708,
    CUDA_ERROR_CONTEXT_IS_DESTROYED = 709,
    CUDA_ERROR_LAUNCH_FAILED = 719,
    CUDA_ERROR_NOT_PERMITTED = 800,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_SYSTEM_DRIVER_MISMATCH = 803,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
    CUDA_ERROR_STREAM_CAPTURE_UNMATCHED = 903,
    CUDA_ERROR_STREAM_CAPTURE_UNJOINED = 904,
    CUDA_ERROR_STREAM_CAPTURE_ISOLATION = 905,
    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906,
    CUDA_ERROR_CAPTURED_EVENT = 907,
    CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908,
    CUDA_ERROR_UNKNOWN = 999
};

/* ---- special streams, flags ------------------------------------------------- */
#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)
enum { CU_STREAM_DEFAULT = 0x0, CU_STREAM_NON_BLOCKING = 0x1 };
enum { CU_EVENT_DEFAULT = 0x0, CU_EVENT_DISABLE_TIMING = 0x2 };
/* cuMemHostAlloc: pinned memory every context treats as pinned. */
enum { CU_MEMHOSTALLOC_PORTABLE = 0x01 };

/* cuGetProcAddress flags and query result */
enum { CU_GET_PROC_ADDRESS_DEFAULT = 0 };
typedef enum {
    CU_GET_PROC_ADDRESS_SUCCESS = 0,
    CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2
} CUdriverProcAddressQueryResult;

/* Device attributes used (cuDeviceGetAttribute) */
typedef enum {
    CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33,
    CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
    CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED = 110,
    CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 115
} CUdevice_attribute;

/* Stream capture */
typedef enum {
    CU_STREAM_CAPTURE_STATUS_NONE = 0,
    CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
    CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2
} CUstreamCaptureStatus;
typedef enum {
    CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
    CU_STREAM_CAPTURE_MODE_RELAXED = 2
} CUstreamCaptureMode;

/* ---- virtual memory management --------------------------------------------- */
typedef enum { CU_MEM_ALLOCATION_TYPE_INVALID = 0x0, CU_MEM_ALLOCATION_TYPE_PINNED = 0x1 } CUmemAllocationType;
typedef enum { CU_MEM_HANDLE_TYPE_NONE = 0x0 } CUmemAllocationHandleType;
typedef enum { CU_MEM_LOCATION_TYPE_INVALID = 0x0, CU_MEM_LOCATION_TYPE_DEVICE = 0x1 } CUmemLocationType;
typedef enum {
    CU_MEM_ACCESS_FLAGS_PROT_NONE = 0x0,
    CU_MEM_ACCESS_FLAGS_PROT_READ = 0x1,
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3
} CUmemAccess_flags;
typedef enum {
    CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0x0,
    CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 0x1
} CUmemAllocationGranularity_flags;

typedef struct CUmemLocation_st {
    CUmemLocationType type;
    int id;
} CUmemLocation;

typedef struct CUmemAllocationProp_st {
    CUmemAllocationType type;
    CUmemAllocationHandleType requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

typedef struct CUmemAccessDesc_st {
    CUmemLocation location;
    CUmemAccess_flags flags;
} CUmemAccessDesc;

/* ---- stream-ordered memory pools --------------------------------------------- */
typedef enum {
    CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES = 1,
    CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC = 2,
    CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES = 3,
    CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4,
    CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5,
    CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH = 6,
    CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7,
    CU_MEMPOOL_ATTR_USED_MEM_HIGH = 8
} CUmemPool_attribute;

typedef struct CUmemPoolProps_st {
    CUmemAllocationType allocType;
    CUmemAllocationHandleType handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;

/* ---- entry points ------------------------------------------------------------ */
/* X(name, cuda_version, required, parameters): the signature of `name` as
 * cuGetProcAddress returns it for that CUDA version (the version each
 * signature first appeared in; cudaTypedefs.h names them PFN_name_vVERSION).
 * required: 1 when the cuda backend cannot work without it; 0 when it is
 * used where the driver has it (stream device on drivers >= 12.8, pools for
 * the async backend, virtual memory for expandable segments, and the entry
 * points only tests use). The oldest version listed as required, and
 * cuGetProcAddress itself (CUDA 11.3), set the minimum driver. */
#define TALLY_CU_ENTRY_POINTS(X)                                                                                  \
    X(cuInit, 2000, 1, (unsigned int flags))                                                                       \
    X(cuDriverGetVersion, 2020, 1, (int *version))                                                                 \
    X(cuGetErrorName, 6000, 1, (CUresult error, const char **name))                                                \
    X(cuGetErrorString, 6000, 1, (CUresult error, const char **text))                                              \
    X(cuDeviceGetCount, 2000, 1, (int *count))                                                                     \
    X(cuDeviceGet, 2000, 1, (CUdevice * device, int ordinal))                                                      \
    X(cuDeviceGetAttribute, 2000, 1, (int *value, CUdevice_attribute attrib, CUdevice dev))                        \
    X(cuDeviceTotalMem, 3020, 1, (size_t * bytes, CUdevice dev))                                                   \
    X(cuDeviceCanAccessPeer, 4000, 0, (int *can_access, CUdevice dev, CUdevice peer))                              \
    X(cuDevicePrimaryCtxRetain, 7000, 1, (CUcontext * ctx, CUdevice dev))                                          \
    X(cuDevicePrimaryCtxRelease, 11000, 1, (CUdevice dev))                                                         \
    X(cuDevicePrimaryCtxGetState, 7000, 1, (CUdevice dev, unsigned int *flags, int *active))                       \
    X(cuCtxPushCurrent, 4000, 1, (CUcontext ctx))                                                                  \
    X(cuCtxPopCurrent, 4000, 1, (CUcontext * ctx))                                                                 \
    X(cuCtxGetCurrent, 4000, 1, (CUcontext * ctx))                                                                 \
    X(cuCtxSetCurrent, 4000, 0, (CUcontext ctx))                                                                   \
    X(cuCtxGetDevice, 2000, 1, (CUdevice * device))                                                                \
    X(cuCtxSynchronize, 2000, 1, (void))                                                                           \
    X(cuCtxEnablePeerAccess, 4000, 0, (CUcontext peer, unsigned int flags))                                        \
    X(cuMemAlloc, 3020, 1, (CUdeviceptr * dptr, size_t bytesize))                                                  \
    X(cuMemFree, 3020, 1, (CUdeviceptr dptr))                                                                      \
    X(cuMemGetInfo, 3020, 1, (size_t * free_bytes, size_t * total_bytes))                                          \
    X(cuStreamCreate, 2000, 0, (CUstream * stream, unsigned int flags))                                            \
    X(cuStreamDestroy, 4000, 0, (CUstream stream))                                                                 \
    X(cuStreamGetCtx, 9020, 1, (CUstream stream, CUcontext * ctx))                                                 \
    X(cuStreamGetDevice, 12080, 0, (CUstream stream, CUdevice * device))                                           \
    X(cuStreamQuery, 2000, 1, (CUstream stream))                                                                   \
    X(cuStreamSynchronize, 2000, 1, (CUstream stream))                                                             \
    X(cuStreamWaitEvent, 3020, 1, (CUstream stream, CUevent event, unsigned int flags))                            \
    X(cuStreamIsCapturing, 10000, 1, (CUstream stream, CUstreamCaptureStatus * status))                            \
    X(cuStreamBeginCapture, 10010, 0, (CUstream stream, CUstreamCaptureMode mode))                                 \
    X(cuStreamEndCapture, 10000, 0, (CUstream stream, CUgraph * graph))                                            \
    X(cuGraphDestroy, 10000, 0, (CUgraph graph))                                                                   \
    X(cuThreadExchangeStreamCaptureMode, 10010, 1, (CUstreamCaptureMode * mode))                                   \
    X(cuLaunchHostFunc, 10000, 0, (CUstream stream, CUhostFn fn, void *user_data))                                 \
    X(cuEventCreate, 2000, 1, (CUevent * event, unsigned int flags))                                               \
    X(cuEventRecord, 2000, 1, (CUevent event, CUstream stream))                                                    \
    X(cuEventQuery, 2000, 1, (CUevent event))                                                                      \
    X(cuEventSynchronize, 2000, 1, (CUevent event))                                                                \
    X(cuEventDestroy, 4000, 1, (CUevent event))                                                                    \
    X(cuMemAddressReserve, 10020, 0,                                                                               \
      (CUdeviceptr * ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags))              \
    X(cuMemAddressFree, 10020, 0, (CUdeviceptr ptr, size_t size))                                                  \
    X(cuMemCreate, 10020, 0,                                                                                       \
      (CUmemGenericAllocationHandle * handle, size_t size, const CUmemAllocationProp *prop,                        \
       unsigned long long flags))                                                                                  \
    X(cuMemRelease, 10020, 0, (CUmemGenericAllocationHandle handle))                                               \
    X(cuMemMap, 10020, 0,                                                                                          \
      (CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long flags)) \
    X(cuMemUnmap, 10020, 0, (CUdeviceptr ptr, size_t size))                                                        \
    X(cuMemSetAccess, 10020, 0, (CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count))          \
    X(cuMemGetAllocationGranularity, 10020, 0,                                                                     \
      (size_t * granularity, const CUmemAllocationProp *prop, CUmemAllocationGranularity_flags option))            \
    X(cuDeviceGetDefaultMemPool, 11020, 0, (CUmemoryPool * pool, CUdevice dev))                                    \
    X(cuMemPoolCreate, 11020, 0, (CUmemoryPool * pool, const CUmemPoolProps *props))                               \
    X(cuMemPoolDestroy, 11020, 0, (CUmemoryPool pool))                                                             \
    X(cuMemPoolSetAttribute, 11020, 0, (CUmemoryPool pool, CUmemPool_attribute attr, void *value))                 \
    X(cuMemPoolGetAttribute, 11020, 0, (CUmemoryPool pool, CUmemPool_attribute attr, void *value))                 \
    X(cuMemPoolTrimTo, 11020, 0, (CUmemoryPool pool, size_t min_bytes_to_keep))                                    \
    X(cuMemPoolSetAccess, 11020, 0, (CUmemoryPool pool, const CUmemAccessDesc *map, size_t count))                 \
    X(cuMemPoolGetAccess, 11020, 0, (CUmemAccess_flags * flags, CUmemoryPool pool, CUmemLocation *location))       \
    X(cuMemAllocFromPoolAsync, 11020, 0, (CUdeviceptr * dptr, size_t bytesize, CUmemoryPool pool, CUstream stream)) \
    X(cuMemFreeAsync, 11020, 0, (CUdeviceptr dptr, CUstream stream))                                              \
    X(cuMemcpyDtoH, 3020, 0, (void *dst_host, CUdeviceptr src_device, size_t bytes))                              \
    X(cuMemcpyHtoD, 3020, 0, (CUdeviceptr dst_device, const void *src_host, size_t bytes))                        \
    X(cuMemHostAlloc, 2020, 0, (void **pp, size_t bytesize, unsigned int flags))                                   \
    X(cuMemFreeHost, 2000, 0, (void *p))

/* Function pointer types: tally_pfn_cuMemAlloc and so on. */
#define TALLY_CU_PFN(name, version, required, params) typedef CUresult(*tally_pfn_##name) params;
TALLY_CU_ENTRY_POINTS(TALLY_CU_PFN)
#undef TALLY_CU_PFN

/* cuStreamGetCtx's CUDA 12.5 form (cudaTypedefs.h: PFN_cuStreamGetCtx_v12050),
 * which cuGetProcAddress("cuStreamGetCtx", 12050) returns: the list above has
 * one form per name, so this one is taken apart (lib/backend/cuda/loader.c).
 * For a stream of a green context it gives the green context and the
 * device's primary context, where the 9.2 form refuses such streams on
 * CUDA 12 drivers (../shared/cuda.md, "CUDA graph capture"). */
#define TALLY_CU_STREAM_GET_CTX_V2 12050
typedef CUresult (*tally_pfn_cuStreamGetCtx_v2)(CUstream stream, CUcontext *ctx, CUgreenCtx *green);

/* cuGetProcAddress itself, found with dlsym: the CUDA 12.0 form with a query
 * result, and the CUDA 11.3 form without. */
typedef CUresult (*tally_pfn_cuGetProcAddress_v2)(const char *symbol, void **pfn, int cuda_version,
                                                  cuuint64_t flags, CUdriverProcAddressQueryResult *status);
typedef CUresult (*tally_pfn_cuGetProcAddress)(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags);

/* The minimum driver tally's cuda backend runs on (cuGetProcAddress). */
#define TALLY_CUDA_MIN_DRIVER 11030

#endif /* TALLY_CUDA_DRIVER_H */
