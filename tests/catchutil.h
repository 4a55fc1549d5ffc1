/* Shared by the tests that tally_check catches each broken invariant it
 * claims to check (test_cache_check_catches_structure,
 * test_cache_check_catches_counts).
 *
 * Every test builds a small real state through the public API on the host
 * backend, corrupts exactly one field through the internal structs, and
 * requires tally_check() to fail with the message of that very check (so a
 * check that fires for some other reason does not pass); then it restores
 * the field exactly and requires tally_check() to pass again. Where a check
 * compares, both sides of the boundary are tried (a peak equal to current
 * passes, one below fails; a block of 512 bytes passes, 511 and 513 fail).
 *
 * Here: the configuration, EXPECT_FAIL and EXPECT_FAIL_NOT, a sink that
 * keeps the expected failures off stderr, the device and a pointer's block
 * record, and the fixture (setup, teardown) most tests start from. */
#ifndef TALLY_TESTS_CATCHUTIL_H
#define TALLY_TESTS_CATCHUTIL_H

#include "testutil.h"

#include "cache/cache.h"
#include "core/internal.h"
#include "ledger/ledger.h"

#define CONF "backend:host,host_devices:1,host_capacity:8GiB,host_mode:virtual,leak_report:off,private_tags:priv"

#define S1 STREAM(1)
#define S2 STREAM(2)
#define S3 STREAM(3)
#define S4 STREAM(4)

/* tally_check() fails, naming the check whose text is msg. */
#define EXPECT_FAIL(msg)                                                                                           \
    do {                                                                                                           \
        int ef_rc_ = tally_check();                                                                                \
        if (ef_rc_ == 0)                                                                                           \
            fail_msg("%s:%d: tally_check passed, expected \"%s\"%s%s", __FILE__, __LINE__, (msg),                \
                     tu_context[0] ? " -- " : "", tu_context);                                                     \
        HAS(tally_last_error(), (msg));                                                                            \
    } while (0)

/* tally_check() fails, but not with msg (a boundary the check must let by). */
#define EXPECT_FAIL_NOT(msg)                                                                                       \
    do {                                                                                                           \
        if (tally_check() == 0)                                                                                    \
            fail_msg("%s:%d: tally_check passed", __FILE__, __LINE__);                                             \
        if (strstr(tally_last_error(), (msg)))                                                                     \
            fail_msg("%s:%d: \"%s\" fired: %s", __FILE__, __LINE__, (msg), tally_last_error());                  \
    } while (0)

/* The failures are expected: keep them off stderr. */
static inline void quiet(void *arg, const char *text, size_t len)
{
    (void)arg;
    (void)text;
    (void)len;
}

static inline tally_device_t *dev(void)
{
    return tally__g.dev[0];
}

static inline tally_block_t *blk(void *p)
{
    tally_block_t *b = tally__ptrmap_get(&dev()->map, (uintptr_t)p);
    assert_non_null(b);
    return b;
}

/* The fixture: a 512-byte small block (head of its segment, a free
 * remainder after it), a 20 MiB large block filling its segment, and a
 * 3 MiB large block on another stream with a free remainder. */
static void *small_p, *whole_p, *split_p;

static inline int setup(void **state)
{
    (void)state;
    tu_context[0] = 0;
    CHECK_OK();
    small_p = tally_malloc(512, 0, S1);
    whole_p = tally_malloc(20 * MiB, 0, S1);
    split_p = tally_malloc(3 * MiB, 0, S2);
    assert_non_null(small_p);
    assert_non_null(whole_p);
    assert_non_null(split_p);
    CHECK_OK();
    return 0;
}

static inline int teardown(void **state)
{
    (void)state;
    tally_free(small_p);
    tally_free(whole_p);
    tally_free(split_p);
    for (int i = 0; i < 8; i++)
        tally_host_stream_hold(STREAM(i), 0);
    tally_empty_cache(-1);
    CHECK_OK();
    return 0;
}

#endif /* TALLY_TESTS_CATCHUTIL_H */
