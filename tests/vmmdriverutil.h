/* Shared by the tests of expandable segments on the cuda backend
 * (test_backend_cuda_vmm, test_backend_cuda_vmm_refusals): what the driver
 * did, read back. Device 0's free memory as the driver gives it and whether
 * a number of bytes went since; the cuMemSetAccess calls tally makes,
 * watched through the library's table of entry points (the stand-in checks
 * access descriptors without enforcing them): put watch_access in place of
 * tally__cu.cuMemSetAccess after keeping the real one in real_set_access.
 * Include after vmmutil.h. */
#ifndef TALLY_TESTS_VMMDRIVERUTIL_H
#define TALLY_TESTS_VMMDRIVERUTIL_H

#include "vmmutil.h"

/* Device 0's free memory as the driver reports it (through tally, in its
 * primary context). */
static inline size_t driver_free(void)
{
    size_t free_b = 0, total = 0;
    NEED(tally_mem_get_info(0, &free_b, &total) == 0);
    return free_b;
}

/* The driver's free memory dropped by exactly `bytes` since `base` (on a
 * GPU: at least that much; page tables cost some too). */
static inline bool used_since(size_t base, size_t bytes)
{
    size_t now = driver_free();
    return cu_is_standin() ? base - now == bytes : base - now >= bytes;
}

static uint64_t access_mask;  /* devices of the last cuMemSetAccess */
static size_t access_bytes;   /* bytes covered since the count was reset */
static tally_pfn_cuMemSetAccess real_set_access;

static inline CUresult watch_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    access_mask = 0;
    for (size_t i = 0; i < count; i++)
        access_mask |= (uint64_t)1 << desc[i].location.id;
    access_bytes += size;
    return real_set_access(ptr, size, desc, count);
}

#endif /* TALLY_TESTS_VMMDRIVERUTIL_H */
