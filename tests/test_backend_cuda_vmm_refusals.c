/* Expandable segments on the cuda backend (lib/backend/cuda/vmm.c) when the
 * device or the driver refuses: a device without virtual memory management
 * or with a granularity that does not divide the 2 MiB page (the driver's
 * answers replaced in the library's table of entry points), and driver
 * calls made to fail (tests/cufail.h) in the device check, the backend's
 * reserve, map, unmap and unreserve, and peer access. Each refusal is one
 * line naming the call, nothing stays mapped or counted, and small
 * allocations (or the same call, once the driver answers) still work.
 * `make test` runs them against the CUDA stand-in; with TALLY_REAL_CUDA=1
 * on a GPU machine against the real driver.
 *
 *   a device without virtual memory management            test_vmm_unsupported_device_refused
 *   the device check's driver calls refused               test_vmm_device_check_refusals_name_the_call
 *   reserve, map, unmap, unreserve refused                test_vmm_backend_refusals_name_the_call_and_keep_nothing
 *   peer access refused                                   test_vmm_peer_access_refusals
 *
 * The async backend refused with expandable_segments and the rest of
 * expandable segments on the cuda backend are in test_backend_cuda_vmm.c;
 * helpers are in vmmutil.h (each body runs in a forked child) and
 * vmmdriverutil.h. */
#include "vmmutil.h"
#include "vmmdriverutil.h"

#include "core/internal.h" /* tally__meta_fail */
#include "cufail.h"

/* A device without virtual memory management, or with a granularity that
 * does not divide the 2 MiB page: the driver's answer is replaced in the
 * library's own table of entry points (linked statically here). The first
 * large allocation fails with one line saying why; small ones still work. */
static tally_pfn_cuDeviceGetAttribute real_get_attribute;
static tally_pfn_cuMemGetAllocationGranularity real_granularity;
static size_t odd_granularity_bytes; /* what odd_granularity answers */

static CUresult no_vmm_attribute(int *value, CUdevice_attribute attrib, CUdevice dev)
{
    CUresult r = real_get_attribute(value, attrib, dev);
    if (r == CUDA_SUCCESS && attrib == CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)
        *value = 0;
    return r;
}

static CUresult odd_granularity(size_t *granularity, const CUmemAllocationProp *prop,
                                CUmemAllocationGranularity_flags option)
{
    CUresult r = real_granularity(granularity, prop, option);
    if (r == CUDA_SUCCESS)
        *granularity = odd_granularity_bytes;
    return r;
}

static void refused_then_small_works(const char *reason)
{
    NEED(tally_malloc(40 * MiB, 0, NULL) == NULL);
    NEED(strstr(tally_last_error(), reason) != NULL);
    NEED(strstr(tally_last_error(), "expandable_segments cannot be used on device 0") != NULL);
    void *small = tally_malloc(1 * MiB, 0, NULL);
    NEED(small != NULL);
    tally_free(small);
    NEED(tally__cu_vmm_mapped_bytes(0) == 0);
    NEED(tally_check() == 0);
}

static void body_no_vmm(int fd)
{
    (void)fd;
    NEED(tally_init() == 0);
    real_get_attribute = tally__cu.cuDeviceGetAttribute;
    tally__cu.cuDeviceGetAttribute = no_vmm_attribute;
    refused_then_small_works("no virtual memory management (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED "
                             "is 0)");
}

static void body_odd_granularity(int fd)
{
    (void)fd;
    NEED(tally_init() == 0);
    real_granularity = tally__cu.cuMemGetAllocationGranularity;
    tally__cu.cuMemGetAllocationGranularity = odd_granularity;
    odd_granularity_bytes = 3 * MiB;
    refused_then_small_works("allocation granularity 3145728 bytes does not divide the 2 MiB page");
}

/* A driver that answers a granularity of 0 bytes (no page size at all) is
 * refused as one that does not divide the page, never divided by. */
static void body_zero_granularity(int fd)
{
    (void)fd;
    NEED(tally_init() == 0);
    real_granularity = tally__cu.cuMemGetAllocationGranularity;
    tally__cu.cuMemGetAllocationGranularity = odd_granularity;
    odd_granularity_bytes = 0;
    refused_then_small_works("allocation granularity 0 bytes does not divide the 2 MiB page");
}

static void test_vmm_unsupported_device_refused(void **state)
{
    (void)state;
    const char *const env[] = {"CUDA_STANDIN_DEVICES", "1", "TALLY_CONF",
                               "backend:cuda,expandable_segments:true,leak_report:off", NULL};
    expect_child_ok(env, body_no_vmm);
    expect_child_ok(env, body_odd_granularity);
    expect_child_ok(env, body_zero_granularity);
}

/* ---- driver calls that fail (tests/cufail.h) ------------------------------------ */

CF_WRAP(cuMemGetAllocationGranularity,
        (size_t * granularity, const CUmemAllocationProp *prop, CUmemAllocationGranularity_flags option),
        (granularity, prop, option))
CF_WRAP(cuMemAddressReserve, (CUdeviceptr * ptr, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags),
        (ptr, size, align, addr, flags))
CF_WRAP(cuMemMap, (CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h, unsigned long long flags),
        (ptr, size, offset, h, flags))
CF_WRAP(cuMemSetAccess, (CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count),
        (ptr, size, desc, count))
CF_WRAP(cuMemUnmap, (CUdeviceptr ptr, size_t size), (ptr, size))
CF_WRAP(cuMemAddressFree, (CUdeviceptr ptr, size_t size), (ptr, size))
CF_WRAP(cuDeviceCanAccessPeer, (int *can, CUdevice dev, CUdevice peer), (can, dev, peer))
CF_WRAP(cuCtxPushCurrent, (CUcontext ctx), (ctx))

static CUresult vmm_attribute_refused(int *value, CUdevice_attribute attrib, CUdevice dev)
{
    if (attrib == CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)
        return CUDA_ERROR_INVALID_DEVICE;
    return real_get_attribute(value, attrib, dev);
}

static void body_driver_lacks_vmm(int fd)
{
    (void)fd;
    NEED(tally_init() == 0);
    tally__cu.cuMemCreate = NULL;
    refused_then_small_works("the driver lacks CUDA's virtual memory management (cuMemCreate)");
}

static void body_vmm_attribute_refused(int fd)
{
    (void)fd;
    NEED(tally_init() == 0);
    real_get_attribute = tally__cu.cuDeviceGetAttribute;
    tally__cu.cuDeviceGetAttribute = vmm_attribute_refused;
    refused_then_small_works("cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED): CUDA_ERROR_INVALID_DEVICE");
}

static void body_granularity_refused(int fd)
{
    (void)fd;
    NEED(tally_init() == 0);
    CF_FAIL(cuMemGetAllocationGranularity, -1, CUDA_ERROR_NOT_SUPPORTED);
    refused_then_small_works("cuMemGetAllocationGranularity: CUDA_ERROR_NOT_SUPPORTED");
}

/* Why the device cannot have expandable segments, whatever the driver said:
 * the whole reason, then "expandable_segments cannot be used on device 0". */
static void test_vmm_device_check_refusals_name_the_call(void **state)
{
    (void)state;
    const char *const env[] = {"CUDA_STANDIN_DEVICES", "1", "TALLY_CONF",
                               "backend:cuda,expandable_segments:true,leak_report:off", NULL};
    expect_child_ok(env, body_driver_lacks_vmm);
    expect_child_ok(env, body_vmm_attribute_refused);
    expect_child_ok(env, body_granularity_refused);
}

/* The backend's reserve, map, unmap and unreserve when the driver (or host
 * memory) refuses: each fails with the call named, nothing stays mapped or
 * counted, and the same call works once the driver answers. */
static void body_backend_refusals(int fd)
{
    (void)fd;
    start_driver();
    NEED(tally_init() == 0);
    const tally_backend_t *be = &tally__backend_cuda;
    char why[256] = "";
    void *r = NULL;
    for (uint64_t nth = 1; nth <= 4; nth++) { /* each of its four tables: range, bits, starts, handles */
        why[0] = 0;
        tally__meta_fail(nth, 0);
        int rc = be->reserve(0, 8 * PAGE, &r, why, sizeof why);
        uint64_t hits = tally__meta_fail_hits();
        tally__meta_fail(0, 0);
        NEED(hits == 1 && rc == TALLY_ENOMEM && strstr(why, "out of host memory for a reservation of 16777216 bytes"));
    }
    CF_FAIL(cuMemAddressReserve, 1, CUDA_ERROR_OUT_OF_MEMORY);
    NEED(be->reserve(0, 8 * PAGE, &r, why, sizeof why) == TALLY_ENOMEM);
    NEED(strstr(why, "cuMemAddressReserve: CUDA_ERROR_OUT_OF_MEMORY") != NULL);
    CF_RESTORE(cuMemAddressReserve);
    NEED(be->reserve(0, 8 * PAGE, &r, why, sizeof why) == 0);
    char *p = r;
    size_t base = driver_free();
    CF_FAIL(cuMemMap, 2, CUDA_ERROR_INVALID_VALUE); /* the second handle of three */
    NEED(be->map(0, p, 3 * PAGE, PAGE, why, sizeof why) == TALLY_EBACKEND);
    NEED(strstr(why, "cuMemMap: CUDA_ERROR_INVALID_VALUE") != NULL);
    NEED(tally__cu_vmm_mapped_bytes(0) == 0 && used_since(base, 0));
    CF_RESTORE(cuMemMap);
    CF_FAIL(cuMemSetAccess, 1, CUDA_ERROR_INVALID_DEVICE);
    NEED(be->map(0, p, 3 * PAGE, PAGE, why, sizeof why) == TALLY_EBACKEND);
    NEED(strstr(why, "cuMemSetAccess: CUDA_ERROR_INVALID_DEVICE") != NULL);
    NEED(tally__cu_vmm_mapped_bytes(0) == 0 && used_since(base, 0));
    CF_RESTORE(cuMemSetAccess);
    NEED(be->map(0, p, 3 * PAGE, PAGE, why, sizeof why) == 0);
    NEED(tally__cu_vmm_mapped_bytes(0) == 3 * PAGE);
    /* An unmap outside every reservation: one line, device first. */
    char want[160];
    snprintf(want, sizeof want, "device 0: unmap: [%p, +%zu) is not inside a reservation of device 0",
             (void *)(p + 8 * PAGE), PAGE);
    NEED(be->unmap(0, p + 8 * PAGE, PAGE) == TALLY_EBACKEND);
    NEED(strcmp(tally_last_error(), want) == 0);
    NEED(tally__cu_vmm_mapped_bytes(-1) == 0 && tally__cu_vmm_mapped_bytes(TALLY_MAX_DEVICES) == 0);
    /* One mapping's unmap refused (a driver taking one mapping per call,
     * CUDA_STANDIN_VMM_UNMAP_ONE=1: call 1 is the whole run, refused by the
     * driver itself, 2 the first page, 3 the second): the others go. */
    CF_FAIL(cuMemUnmap, 3, CUDA_ERROR_UNKNOWN);
    NEED(be->unmap(0, p, 3 * PAGE) == TALLY_EBACKEND);
    NEED(strstr(tally_last_error(), "device 0: cuMemUnmap: CUDA_ERROR_UNKNOWN") == tally_last_error());
    NEED(tally__cu_vmm_mapped_bytes(0) == PAGE);
    CF_RESTORE(cuMemUnmap);
    /* The addresses not given back: the reservation stays, said once. */
    CF_FAIL(cuMemAddressFree, 1, CUDA_ERROR_INVALID_VALUE);
    NEED(be->unreserve(0, r, 8 * PAGE) == TALLY_EBACKEND);
    NEED(strstr(tally_last_error(), "device 0: cuMemAddressFree: CUDA_ERROR_INVALID_VALUE") == tally_last_error());
    NEED(tally__cu_vmm_mapped_bytes(0) == 0);
    NEED(be->unreserve(0, r, 8 * PAGE) == 0);
    NEED(used_since(base, 0) || !cu_is_standin());
}

static void test_vmm_backend_refusals_name_the_call_and_keep_nothing(void **state)
{
    (void)state;
    if (getenv("TALLY_REAL_CUDA") && strcmp(getenv("TALLY_REAL_CUDA"), "1") == 0)
        SKIP("the real driver unmaps several mappings in one call");
    static const char *const one[] = {"CUDA_STANDIN_DEVICES", "1", "CUDA_STANDIN_VMM_UNMAP_ONE", "1", "TALLY_CONF",
                                      "backend:cuda,leak_report:off", NULL};
    expect_child_ok(one, body_backend_refusals);
}

/* Peer access asked for before any page is mapped is kept for the maps to
 * come; the driver refusing to say whether the peer can, the context, or
 * the access itself: the call fails naming it. */
static void body_peer_refusals(int fd)
{
    (void)fd;
    start_driver();
    NEED(tally_init() == 0);
    real_set_access = tally__cu.cuMemSetAccess;
    tally__cu.cuMemSetAccess = watch_access;
    NEED(tally_pool_peer_access(0, 1) == 0); /* nothing mapped yet */
    void *a = tally_malloc(40 * MiB, 0, NULL);
    NEED(a != NULL && access_mask == 3);
    CF_FAIL(cuDeviceCanAccessPeer, 1, CUDA_ERROR_INVALID_DEVICE);
    NEED(tally_pool_peer_access(0, 2) == -TALLY_EBACKEND);
    NEED(strstr(tally_last_error(), "device 0, peer 2: cuDeviceCanAccessPeer: CUDA_ERROR_INVALID_DEVICE") != NULL);
    CF_RESTORE(cuDeviceCanAccessPeer);
    CF_FAIL(cuCtxPushCurrent, -1, CUDA_ERROR_INVALID_CONTEXT);
    NEED(tally_pool_peer_access(0, 2) == -TALLY_EBACKEND);
    NEED(strstr(tally_last_error(), "device 0, peer 2: no context of device 0 to set access in") != NULL);
    CF_RESTORE(cuCtxPushCurrent);
    CF_FAIL(cuMemSetAccess, 1, CUDA_ERROR_INVALID_VALUE);
    NEED(tally_pool_peer_access(0, 2) == -TALLY_EBACKEND);
    NEED(strstr(tally_last_error(), "device 0, peer 2: cuMemSetAccess: CUDA_ERROR_INVALID_VALUE") != NULL);
    tally_free(a);
    NEED(tally_check() == 0);
}

static void test_vmm_peer_access_refusals(void **state)
{
    (void)state;
    const char *const env[] = {"CUDA_STANDIN_DEVICES", "3", "TALLY_CONF",
                               "backend:cuda,expandable_segments:true,leak_report:off", NULL};
    int st = run_child(env, body_peer_refusals, NULL, 0);
    if (st != 0)
        fail_msg("child ended with status %d (see its line above)", st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vmm_unsupported_device_refused),
        cmocka_unit_test(test_vmm_device_check_refusals_name_the_call),
        cmocka_unit_test(test_vmm_backend_refusals_name_the_call_and_keep_nothing),
        cmocka_unit_test(test_vmm_peer_access_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
