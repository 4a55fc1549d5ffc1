/* The CUDA stand-in's rules for what a sleep with offload uses
 * (tests/standin/vmm.c, copy.c; docs/standin.md): reserved addresses hold no
 * memory; a mapping is usable once cuMemSetAccess gave access; what is
 * unmapped is lost (scrubbed, inaccessible until mapped again); copies
 * between host and device memory check their device range; pinned host
 * memory comes from cuMemHostAlloc and goes back only through cuMemFreeHost.
 * Through the driver API, as tally uses it (tests/cudautil.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cudautil.h"
#include "sleeputil.h"

#define MiB ((size_t)1 << 20)
#define PAGE (2 * MiB)

static CUmemAllocationProp prop0(void)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = 0;
    return p;
}

static CUmemGenericAllocationHandle map_page(CUdeviceptr at)
{
    CUmemAllocationProp p = prop0();
    CUmemGenericAllocationHandle h;
    CU_OK(cu.cuMemCreate(&h, PAGE, &p, 0));
    CU_OK(cu.cuMemMap(at, PAGE, 0, h, 0));
    CU_OK(cu.cuMemRelease(h));
    return h;
}

static void set_access(CUdeviceptr at, size_t size, CUmemAccess_flags flags)
{
    CUmemAccessDesc d;
    memset(&d, 0, sizeof d);
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = 0;
    d.flags = flags;
    CU_OK(cu.cuMemSetAccess(at, size, &d, 1));
}

/* Unmapped pages lose their contents and cannot be touched; a mapping is
 * usable only after cuMemSetAccess. */
static void test_unmapped_pages_are_lost(void **state)
{
    (void)state;
    CU_NEED_STANDIN();
    CU_OK(cu.cuCtxPushCurrent(cu_ctx[0]));
    CUdeviceptr r = 0;
    CU_OK(cu.cuMemAddressReserve(&r, 2 * PAGE, 0, 0, 0));
    char *p = (char *)(uintptr_t)r;
    assert_true(su_faults(p)); /* reserved, not mapped */
    map_page(r);
    assert_true(su_faults(p)); /* mapped, no access yet */
    set_access(r, PAGE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    memset(p, 0x3c, PAGE);
    CU_OK(cu.cuMemUnmap(r, PAGE));
    assert_true(su_faults(p));
    map_page(r);
    set_access(r, PAGE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    for (size_t i = 0; i < PAGE; i += 4096)
        assert_int_equal((unsigned char)p[i], 0);
    CU_OK(cu.cuMemUnmap(r, PAGE));
    CU_OK(cu.cuMemAddressFree(r, 2 * PAGE));
    CUcontext c;
    cu.cuCtxPopCurrent(&c);
}

static void test_copies_check_the_device_range(void **state)
{
    (void)state;
    CU_NEED_DRIVER();
    CU_OK(cu.cuCtxPushCurrent(cu_ctx[0]));
    void *host = NULL;
    CU_OK(cu.cuMemHostAlloc(&host, PAGE, CU_MEMHOSTALLOC_PORTABLE));
    memset(host, 0x5e, PAGE);
    CUdeviceptr r = 0;
    CU_OK(cu.cuMemAddressReserve(&r, 2 * PAGE, 0, 0, 0));
    map_page(r);
    set_access(r, PAGE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CU_OK(cu.cuMemcpyHtoD(r, host, PAGE));
    memset(host, 0, PAGE);
    CU_OK(cu.cuMemcpyDtoH(host, r, PAGE));
    assert_int_equal(((unsigned char *)host)[PAGE - 1], 0x5e);
    if (cu_is_standin()) {
        /* The second page is reserved, not mapped: no copy reaches it. */
        CU_IS(cu.cuMemcpyDtoH(host, r + PAGE, 4096), CUDA_ERROR_INVALID_VALUE);
        CU_IS(cu.cuMemcpyHtoD(r + PAGE - 4096, host, 8192), CUDA_ERROR_INVALID_VALUE);
        CU_IS(cu.cuMemcpyDtoH(NULL, r, 4096), CUDA_ERROR_INVALID_VALUE);
    }
    /* cuMemAlloc memory copies too. */
    CUdeviceptr a = 0;
    CU_OK(cu.cuMemAlloc(&a, 8192));
    CU_OK(cu.cuMemcpyHtoD(a, host, 8192));
    CU_OK(cu.cuMemFree(a));
    CU_OK(cu.cuMemUnmap(r, PAGE));
    CU_OK(cu.cuMemAddressFree(r, 2 * PAGE));
    CU_OK(cu.cuMemFreeHost(host));
    CUcontext c;
    cu.cuCtxPopCurrent(&c);
    /* Without a current context. */
    CU_IS(cu.cuMemHostAlloc(&host, PAGE, 0), CUDA_ERROR_INVALID_CONTEXT);
    char buf[16];
    CU_IS(cu.cuMemcpyDtoH(buf, r, sizeof buf), CUDA_ERROR_INVALID_CONTEXT);
}

static void test_pinned_memory_rules(void **state)
{
    (void)state;
    CU_NEED_STANDIN();
    CU_OK(cu.cuCtxPushCurrent(cu_ctx[0]));
    void *host = NULL;
    CU_IS(cu.cuMemHostAlloc(&host, PAGE, 0x8), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cu.cuMemHostAlloc(NULL, PAGE, 0), CUDA_ERROR_INVALID_VALUE);
    char local[64];
    CU_IS(cu.cuMemFreeHost(local), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cu.cuMemHostAlloc(&host, 4096, 0));
    CU_OK(cu.cuMemFreeHost(host));
    CU_IS(cu.cuMemFreeHost(host), CUDA_ERROR_INVALID_VALUE); /* twice */
    CUcontext c;
    cu.cuCtxPopCurrent(&c);
}

int main(void)
{
    cu_test_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_unmapped_pages_are_lost, cu_ctx_setup, cu_ctx_teardown),
        cmocka_unit_test_setup_teardown(test_copies_check_the_device_range, cu_ctx_setup, cu_ctx_teardown),
        cmocka_unit_test_setup_teardown(test_pinned_memory_rules, cu_ctx_setup, cu_ctx_teardown),
    };
    return cmocka_run_group_tests_name("standin_copy", tests, NULL, NULL);
}
