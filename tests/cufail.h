/* Driver calls made to fail, for the tests of the cuda and async backends'
 * error paths (test_backend_cuda_refusals.c, test_backend_cuda_vmm_refusals.c). The
 * library's table of entry points (tally__cu, linked statically into the
 * test) gets a wrapper in place of one entry point; the wrapper returns
 * cf_error for the calls cf_fail_at names and passes the others through.
 * The stand-in's own rules are untouched: the driver itself never fails.
 *
 *   CF_WRAP(name, params, args)   define the wrapper of tally__cu.name
 *   CF_FAIL(name, at, error)      put it in place: call `at` (1: the next)
 *                                 fails with error, and with at < 0 every
 *                                 call from the next on
 *   CF_RESTORE(name)              the real entry point back
 * The count is shared: restore one wrapper before arming the next. Bodies
 * run in children (one process each). */
#ifndef TALLY_TESTS_CUFAIL_H
#define TALLY_TESTS_CUFAIL_H

#include "backend/cuda/cu.h"

static int cf_calls, cf_fail_at;
static CUresult cf_error = CUDA_ERROR_UNKNOWN;

static inline bool cf_failing(void)
{
    cf_calls++;
    return cf_fail_at < 0 || cf_calls == cf_fail_at;
}

#define CF_WRAP(name, params, args)                                                                                \
    static tally_pfn_##name cf_real_##name;                                                                        \
    static CUresult cf_##name params                                                                               \
    {                                                                                                              \
        return cf_failing() ? cf_error : cf_real_##name args;                                                      \
    }

#define CF_FAIL(name, at, error)                                                                                   \
    do {                                                                                                           \
        if (!cf_real_##name)                                                                                       \
            cf_real_##name = tally__cu.name;                                                                       \
        tally__cu.name = cf_##name;                                                                                \
        cf_calls = 0;                                                                                              \
        cf_fail_at = (at);                                                                                         \
        cf_error = (error);                                                                                        \
    } while (0)

#define CF_RESTORE(name) (tally__cu.name = cf_real_##name)

#endif
