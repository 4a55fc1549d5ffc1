/* lib/backend/cuda/driver.h against CUDA's own cuda.h: every constant, enum value
 * and type size, and the layout (offsetof) of every structure driver.h
 * declares, compared by static assertions, so a mistake fails the build of
 * this test. The Makefile builds it with TALLY_CUDA_H_CHECK and cuda.h's
 * directory when $(CUDA_HOME)/include/cuda.h exists (CUDA_HOME defaults to
 * /usr/local/cuda); without a toolkit the test says so and is skipped.
 *
 * cuda.h's constants and types are first kept as tally_cu_..., then
 * driver.h is included with every name renamed to tally_dh_...
 * ($(BUILD)/tests/driver_h_cuda.h and driver_h_names.h, written by
 * tests/driver_h_names.sh, which also writes the per-name assertions
 * TALLY_DH_ASSERTS). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include "skip.h"

#include <stdio.h>

#ifdef TALLY_CUDA_H_CHECK
#include <cuda.h>

static const uintptr_t cuda_legacy = (uintptr_t)CU_STREAM_LEGACY;
static const uintptr_t cuda_per_thread = (uintptr_t)CU_STREAM_PER_THREAD;
#undef CU_STREAM_LEGACY
#undef CU_STREAM_PER_THREAD

#include "driver_h_cuda.h"
#include "driver_h_names.h"
#include "backend/cuda/driver.h"

TALLY_DH_ASSERTS;

#define SAME_FIELD(type, field)                                                                                    \
    _Static_assert(offsetof(tally_dh_##type, field) == offsetof(tally_cu_##type, field),                        \
                   #type "." #field " is misplaced");                                                              \
    _Static_assert(sizeof(((tally_dh_##type *)0)->field) == sizeof(((tally_cu_##type *)0)->field),                 \
                   #type "." #field " size")

SAME_FIELD(CUmemLocation, type);
SAME_FIELD(CUmemLocation, id);
SAME_FIELD(CUmemAllocationProp, type);
SAME_FIELD(CUmemAllocationProp, requestedHandleTypes);
SAME_FIELD(CUmemAllocationProp, location);
SAME_FIELD(CUmemAllocationProp, win32HandleMetaData);
SAME_FIELD(CUmemAllocationProp, allocFlags);
SAME_FIELD(CUmemAllocationProp, allocFlags.compressionType);
SAME_FIELD(CUmemAllocationProp, allocFlags.gpuDirectRDMACapable);
SAME_FIELD(CUmemAllocationProp, allocFlags.usage);
SAME_FIELD(CUmemAccessDesc, location);
SAME_FIELD(CUmemAccessDesc, flags);
SAME_FIELD(CUmemPoolProps, allocType);
SAME_FIELD(CUmemPoolProps, handleTypes);
SAME_FIELD(CUmemPoolProps, location);
SAME_FIELD(CUmemPoolProps, win32SecurityAttributes);
SAME_FIELD(CUmemPoolProps, maxSize);
SAME_FIELD(CUmemPoolProps, usage);

/* The two stream handles are macros in both headers: compared at run time. */
static void test_driver_h_matches_cuda_h(void **state)
{
    (void)state;
    assert_int_equal((uintptr_t)CU_STREAM_LEGACY, cuda_legacy);
    assert_int_equal((uintptr_t)CU_STREAM_PER_THREAD, cuda_per_thread);
    printf("driver.h: %d names and 18 structure fields agree with cuda.h (CUDA %d)\n", tally_dh_checked,
           CUDA_VERSION);
}
#else
static void test_driver_h_matches_cuda_h(void **state)
{
    (void)state;
    SKIP("no CUDA toolkit (cuda.h) at $CUDA_HOME/include, nothing to compare with");
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_driver_h_matches_cuda_h)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
