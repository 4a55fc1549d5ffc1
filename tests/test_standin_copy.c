/* The CUDA stand-in's rules for the contents of device memory, what a sleep
 * with offload uses (tests/standin/vmm.c, copy.c; docs/standin.md): reserved
 * addresses hold no memory; a mapping is usable once cuMemSetAccess gave
 * access; what is unmapped and released is lost (inaccessible until mapped
 * again, zeros then); a handle's memory is its own wherever it is mapped (two
 * mappings of one handle alias, and a handle kept unreleased keeps its bytes
 * across an unmap); copies between host and device memory check their device
 * range; pinned host memory comes from cuMemHostAlloc and goes back only
 * through cuMemFreeHost. Through the driver API, as tally uses it
 * (tests/cudautil.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
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

static size_t free_bytes(void)
{
    size_t free = 0, total = 0;
    CU_OK(cu.cuMemGetInfo(&free, &total));
    return free;
}

/* Bytes [off, off + n) of device memory at at, through a copy (what runs on
 * the stand-in and on a GPU alike), into buf. */
static void read_back(unsigned char *buf, CUdeviceptr at, size_t off, size_t n)
{
    memset(buf, 0xee, n);
    CU_OK(cu.cuMemcpyDtoH(buf, at + off, n));
}

/* CUDA C++ Programming Guide, "Virtual Aliasing Support": one allocation may
 * be mapped at several virtual addresses, each a proxy of the same memory;
 * a write through one is seen through another once the writing operation
 * has completed (a synchronous copy has). So what is copied in through one
 * mapping is copied out through the other, and the memory stays charged to
 * the device until the last mapping of a released handle goes. Through
 * copies, so that `TALLY_REAL_CUDA=1` proves the rule on a GPU. */
static void test_two_mappings_of_one_handle_alias(void **state)
{
    (void)state;
    CU_NEED_DRIVER();
    CU_OK(cu.cuCtxPushCurrent(cu_ctx[0]));
    bool standin = cu_is_standin();
    size_t before = free_bytes();
    CUdeviceptr r = 0;
    CU_OK(cu.cuMemAddressReserve(&r, 4 * PAGE, 0, 0, 0));
    CUmemAllocationProp p = prop0();
    CUmemGenericAllocationHandle h;
    CU_OK(cu.cuMemCreate(&h, PAGE, &p, 0));
    CUdeviceptr a = r, b = r + 2 * PAGE;
    CU_OK(cu.cuMemMap(a, PAGE, 0, h, 0));
    CU_OK(cu.cuMemMap(b, PAGE, 0, h, 0));
    set_access(a, PAGE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    set_access(b, PAGE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    unsigned char *buf = malloc(PAGE);
    assert_non_null(buf);
    memset(buf, 0x11, PAGE);
    buf[12345] = 0x77;
    CU_OK(cu.cuMemcpyHtoD(a, buf, PAGE));
    read_back(buf, b, 0, PAGE);
    assert_int_equal(buf[0], 0x11);
    assert_int_equal(buf[PAGE - 1], 0x11);
    assert_int_equal(buf[12345], 0x77);
    unsigned char v = 0x99; /* and back */
    CU_OK(cu.cuMemcpyHtoD(b + PAGE / 2, &v, 1));
    read_back(buf, a, PAGE / 2, 1);
    assert_int_equal(buf[0], 0x99);
    if (standin) /* the stand-in's charge is exact: one page of memory, mapped twice */
        assert_int_equal(before - free_bytes(), PAGE);
    /* One mapping gone, the other still shows the bytes. */
    CU_OK(cu.cuMemUnmap(a, PAGE));
    if (standin)
        assert_true(su_faults((void *)(uintptr_t)a));
    read_back(buf, b, 12345, 1);
    assert_int_equal(buf[0], 0x77);
    /* Released while mapped: the memory lives until the last mapping goes. */
    CU_OK(cu.cuMemRelease(h));
    read_back(buf, b, PAGE / 2, 1);
    assert_int_equal(buf[0], 0x99);
    if (standin)
        assert_int_equal(before - free_bytes(), PAGE);
    CU_OK(cu.cuMemUnmap(b, PAGE));
    if (standin)
        assert_int_equal(free_bytes(), before);
    free(buf);
    CU_OK(cu.cuMemAddressFree(r, 4 * PAGE));
    CUcontext c;
    cu.cuCtxPopCurrent(&c);
}

/* A handle kept unreleased keeps its memory, and so its bytes, while it is
 * mapped nowhere: mapped again (here at another address) it shows what was
 * copied in before the unmap, and a mapping of its first page alone shows
 * that page. A released one does not (test_unmapped_pages_are_lost). */
static void test_kept_handle_keeps_its_bytes(void **state)
{
    (void)state;
    CU_NEED_DRIVER();
    CU_OK(cu.cuCtxPushCurrent(cu_ctx[0]));
    CUdeviceptr r = 0;
    CU_OK(cu.cuMemAddressReserve(&r, 4 * PAGE, 0, 0, 0));
    CUmemAllocationProp p = prop0();
    CUmemGenericAllocationHandle h;
    CU_OK(cu.cuMemCreate(&h, 2 * PAGE, &p, 0));
    CU_OK(cu.cuMemMap(r, 2 * PAGE, 0, h, 0));
    set_access(r, 2 * PAGE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    unsigned char *buf = malloc(2 * PAGE);
    assert_non_null(buf);
    for (size_t i = 0; i < 2 * PAGE; i++)
        buf[i] = (unsigned char)(i >> 12);
    CU_OK(cu.cuMemcpyHtoD(r, buf, 2 * PAGE));
    CU_OK(cu.cuMemUnmap(r, 2 * PAGE));
    if (cu_is_standin())
        assert_true(su_faults((void *)(uintptr_t)r));
    CU_OK(cu.cuMemMap(r + 2 * PAGE, 2 * PAGE, 0, h, 0));
    set_access(r + 2 * PAGE, 2 * PAGE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    read_back(buf, r + 2 * PAGE, 0, 2 * PAGE);
    for (size_t i = 0; i < 2 * PAGE; i += 4096)
        assert_int_equal(buf[i], (unsigned char)(i >> 12));
    CU_OK(cu.cuMemMap(r, PAGE, 0, h, 0));
    set_access(r, PAGE, CU_MEM_ACCESS_FLAGS_PROT_READ);
    read_back(buf, r, PAGE - 4096, 1);
    assert_int_equal(buf[0], (unsigned char)((PAGE - 4096) >> 12));
    CU_OK(cu.cuMemUnmap(r, PAGE));
    CU_OK(cu.cuMemUnmap(r + 2 * PAGE, 2 * PAGE));
    CU_OK(cu.cuMemRelease(h));
    free(buf);
    CU_OK(cu.cuMemAddressFree(r, 4 * PAGE));
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
        cmocka_unit_test_setup_teardown(test_two_mappings_of_one_handle_alias, cu_ctx_setup, cu_ctx_teardown),
        cmocka_unit_test_setup_teardown(test_kept_handle_keeps_its_bytes, cu_ctx_setup, cu_ctx_teardown),
        cmocka_unit_test_setup_teardown(test_copies_check_the_device_range, cu_ctx_setup, cu_ctx_teardown),
        cmocka_unit_test_setup_teardown(test_pinned_memory_rules, cu_ctx_setup, cu_ctx_teardown),
    };
    return cmocka_run_group_tests_name("standin_copy", tests, NULL, NULL);
}
