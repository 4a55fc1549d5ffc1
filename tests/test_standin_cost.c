/* The CUDA stand-in's call counters and its driver cost model
 * (tests/standin/counts.c, cost.c): every call through the driver API is
 * counted per entry point, the per-mapping calls count the mappings they
 * touch, and the modelled driver time is the cost table applied to those
 * counts, in both columns. Stand-in only (a real driver has no counters). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cudautil.h"
#include "standin/cost.h"

#define MiB ((size_t)1 << 20)

typedef unsigned long long (*calls_fn)(const char *);
typedef double (*us_fn)(int);
typedef void (*reset_fn)(void);
typedef int (*write_fn)(char *, size_t);
static calls_fn calls, mappings;
static us_fn driver_us;
static reset_fn counts_reset;
static write_fn counts_write;

static int counters_setup(void **state)
{
    if (cu_ctx_setup(state))
        return -1;
    *(void **)&calls = dlsym(cu_lib, "cuda_standin_calls");
    *(void **)&mappings = dlsym(cu_lib, "cuda_standin_mappings");
    *(void **)&driver_us = dlsym(cu_lib, "cuda_standin_driver_us");
    *(void **)&counts_reset = dlsym(cu_lib, "cuda_standin_counts_reset");
    *(void **)&counts_write = dlsym(cu_lib, "cuda_standin_counts_write");
    return 0;
}

static void test_table_names_a_source_for_every_row(void **state)
{
    (void)state;
    size_t n;
    const si_cost_row_t *t = si_cost_table(&n);
    assert_true(n >= 10);
    for (size_t i = 0; i < n; i++) {
        assert_non_null(t[i].source);
        assert_true(strlen(t[i].source) > 10);
        for (int c = 0; c < SI_COST_COLUMNS; c++)
            assert_true(t[i].us[c] > 0);
        /* Each figure is either published (it names where) or says it is assumed. */
        assert_true(strstr(t[i].source, "assumed") || strstr(t[i].source, "kvcached") || strstr(t[i].source, "probe"));
        for (size_t j = 0; j < i; j++)
            assert_string_not_equal(t[i].entry, t[j].entry);
    }
    assert_true(si_cost_other_us > 0);
}

static void test_cost_law_is_per_call_or_per_mapping_never_per_byte(void **state)
{
    (void)state;
    /* cuMemCreate: per call (one handle, any size). */
    assert_true(fabs(si_cost_us("cuMemCreate", 10, 0, SI_COST_A100) - 1930.0) < 1e-6);
    assert_true(fabs(si_cost_us("cuMemCreate", 1, 999, SI_COST_BLACKWELL) - 13.8) < 1e-6);
    /* cuMemSetAccess: per mapping touched, however many calls. */
    assert_true(fabs(si_cost_us("cuMemSetAccess", 1, 10, SI_COST_BLACKWELL) - 690.0) < 1e-6);
    assert_true(fabs(si_cost_us("cuMemUnmap", 3, 0, SI_COST_A100)) < 1e-6);
    /* Outside the table: the stated per-call figure. */
    assert_true(fabs(si_cost_us("cuCtxPushCurrent", 4, 0, SI_COST_A100) - 4 * si_cost_other_us) < 1e-6);
    assert_true(si_cost_us("cuMemCreate", 1, 0, SI_COST_COLUMNS) == 0);
}

static void test_counts_calls_and_mappings(void **state)
{
    (void)state;
    CU_NEED_STANDIN();
    assert_non_null(calls);
    assert_non_null(driver_us);
    CU_OK(cu.cuCtxPushCurrent(cu_ctx[0]));
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    CUdeviceptr base = 0;
    CU_OK(cu.cuMemAddressReserve(&base, 8 * MiB, 0, 0, 0));
    counts_reset();
    assert_int_equal(calls(NULL), 0);
    CUmemGenericAllocationHandle h[3];
    for (int i = 0; i < 3; i++) {
        CU_OK(cu.cuMemCreate(&h[i], 2 * MiB, &prop, 0));
        CU_OK(cu.cuMemMap(base + (CUdeviceptr)i * 2 * MiB, 2 * MiB, 0, h[i], 0));
    }
    CUmemAccessDesc acc = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
                           .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CU_OK(cu.cuMemSetAccess(base, 6 * MiB, &acc, 1)); /* one call, three mappings */
    CU_OK(cu.cuMemUnmap(base, 4 * MiB));               /* one call, two mappings */
    /* A refused call still counts as a call. */
    CU_IS(cu.cuMemUnmap(base, 2 * MiB), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(calls("cuMemCreate"), 3);
    assert_int_equal(calls("cuMemMap"), 3);
    assert_int_equal(calls("cuMemSetAccess"), 1);
    assert_int_equal(mappings("cuMemSetAccess"), 3);
    assert_int_equal(calls("cuMemUnmap"), 2);
    assert_int_equal(mappings("cuMemUnmap"), 2);
    for (int c = 0; c < SI_COST_COLUMNS; c++) {
        double want = si_cost_us("cuMemCreate", 3, 0, c) + si_cost_us("cuMemMap", 3, 0, c) +
                      si_cost_us("cuMemSetAccess", 1, 3, c) + si_cost_us("cuMemUnmap", 2, 2, c);
        assert_true(fabs(driver_us(c) - want) < 1e-6);
    }
    char text[1024];
    assert_true(counts_write(text, sizeof text) > 0);
    assert_non_null(strstr(text, "cuMemSetAccess 1 3\n"));
    assert_null(strstr(text, "cuMemRelease"));
    CU_OK(cu.cuMemUnmap(base + 4 * MiB, 2 * MiB));
    for (int i = 0; i < 3; i++)
        CU_OK(cu.cuMemRelease(h[i]));
    CU_OK(cu.cuMemAddressFree(base, 8 * MiB));
    /* _v2 entry points are counted under their plain name. */
    counts_reset();
    size_t fr, total;
    CU_OK(cu.cuMemGetInfo(&fr, &total));
    assert_int_equal(calls("cuMemGetInfo"), 1);
    CU_OK(cu.cuCtxPopCurrent(NULL));
    assert_int_equal(calls("cuCtxPopCurrent"), 1);
}

int main(void)
{
    cu_test_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_names_a_source_for_every_row),
        cmocka_unit_test(test_cost_law_is_per_call_or_per_mapping_never_per_byte),
        cmocka_unit_test_setup_teardown(test_counts_calls_and_mappings, counters_setup, cu_ctx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
