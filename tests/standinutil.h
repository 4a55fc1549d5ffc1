/* Shared by the tests of the CUDA stand-in's streams and stream capture
 * (test_standin_streams, test_standin_capture): MiB, and a host function
 * that sets a flag (queued with cuLaunchHostFunc, whether it ran shows
 * whether the stream executed its work). Include after cmocka.h. */
#ifndef TALLY_TESTS_STANDINUTIL_H
#define TALLY_TESTS_STANDINUTIL_H

#include "cudautil.h"

#define MiB ((size_t)1 << 20)

static inline void set_flag(void *arg)
{
    __atomic_store_n((int *)arg, 1, __ATOMIC_SEQ_CST);
}

#endif /* TALLY_TESTS_STANDINUTIL_H */
