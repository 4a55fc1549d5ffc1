/* The caching core at its limits, against the PyTorch semantics in the
 * behaviour notes: the OOM retry sequence (release the cache, retry, then
 * count and report), the memory fraction and garbage collection.
 * (Rounding, pools, segment sizes, splitting, best fit and empty_cache:
 * test_cache_blocks.c.)
 *
 * Two simulated 80 GiB devices in virtual mode (memory is never touched).
 * Every test starts from an empty cache (setup) and frees what it takes. */
#include "testutil.h"

#include <math.h>

#define S1 STREAM(1)
#define S2 STREAM(2)
#define S3 STREAM(3)
#define S4 STREAM(4)

/* ---- out of memory ---------------------------------------------------------- */

static void test_oom_on_capacity_counts_and_reports(void **state)
{
    (void)state;
    void *live = tu_malloc(4096, 0, S1);
    tu_free(tu_malloc(30 * MiB, 0, S1)); /* cached, released by the retry path */
    tally_stats_t a = tu_stats(0);
    cap_begin();
    void *p = tu_malloc(81 * GiB, 0, S1);
    cap_end();
    assert_null(p);
    tally_stats_t b = tu_stats(0);
    EQ(b.num_ooms - a.num_ooms, 1);
    EQ(b.num_alloc_retries - a.num_alloc_retries, 1);
    EQ(b.num_sync_all_streams - a.num_sync_all_streams, 1);
    EQ(b.num_device_alloc - a.num_device_alloc, 0);
    EQ(b.num_device_free - a.num_device_free, 1);
    EQ(a.reserved_bytes[0].current - b.reserved_bytes[0].current, 30 * MiB);
    tu_expect_same_usage(&a, &b);
    HAS(tally_last_error(), "out of memory");
    HAS(cap_text(), "out of memory");
    HAS(cap_text(), "device 0");
    HAS(cap_text(), "86973087744"); /* the request, in bytes */
    assert_true(cap_lines() >= 2);
    EQ(tu_info(live).size, 4096);
    CHECK_OK();
    /* The device still works. */
    void *q = tu_malloc(40 * GiB, 0, S1);
    assert_non_null(q);
    tu_free(q);
    tu_free(live);
    CHECK_OK();
}

/* One injected failure: release_cached_blocks, then the retry succeeds. The
 * retry and the sync are counted, no OOM is. */
static void test_oom_injected_once_retry_succeeds(void **state)
{
    (void)state;
    tu_free(tu_malloc(12 * MiB, 0, S1)); /* a cached segment */
    tally_stats_t a = tu_stats(0);
    assert_int_equal(tally_host_fail_alloc(1, 0), 0);
    void *p = tu_malloc(4096, 0, S2);
    assert_non_null(p);
    tally_stats_t b = tu_stats(0);
    EQ(b.num_alloc_retries - a.num_alloc_retries, 1);
    EQ(b.num_sync_all_streams - a.num_sync_all_streams, 1);
    EQ(b.num_ooms - a.num_ooms, 0);
    EQ(b.num_device_alloc - a.num_device_alloc, 1);
    EQ(b.num_device_free - a.num_device_free, 1);
    EQ(b.reserved_bytes[0].current, 2 * MiB);
    /* The fault fired once: the next allocation needs no retry. */
    void *q = tu_malloc(12 * MiB, 0, S2);
    EQ(tu_stats(0).num_alloc_retries, b.num_alloc_retries);
    tu_free(p);
    tu_free(q);
    CHECK_OK();
}

static void test_oom_injected_always_fails_and_leaves_state(void **state)
{
    (void)state;
    void *live = tu_malloc(3 * MiB, 0, S1);
    tu_free(tu_malloc(4096, 0, S3)); /* cached small segment */
    tally_stats_t a = tu_stats(0);
    assert_int_equal(tally_host_fail_alloc(1, 1), 0);
    cap_begin();
    void *p = tu_malloc(4096, 0, S2);
    cap_end();
    assert_null(p);
    tally_host_fail_alloc(0, 0);
    tally_stats_t b = tu_stats(0);
    EQ(b.num_ooms - a.num_ooms, 1);
    EQ(b.num_alloc_retries - a.num_alloc_retries, 1);
    EQ(b.num_sync_all_streams - a.num_sync_all_streams, 1);
    EQ(b.num_device_alloc - a.num_device_alloc, 0);
    EQ(b.num_device_free - a.num_device_free, 1);
    tu_expect_same_usage(&a, &b);
    HAS(tally_last_error(), "out of memory");
    HAS(tally_last_error(), "injected");
    HAS(cap_text(), "out of memory");
    HAS(cap_text(), "4096");
    CHECK_OK();
    void *q = tu_malloc(4096, 0, S2);
    assert_non_null(q);
    EQ(tu_stats(0).num_ooms, b.num_ooms);
    tu_free(q);
    tu_free(live);
    CHECK_OK();
}

/* ---- memory fraction --------------------------------------------------------- */

static void test_memory_fraction_caps_reserved(void **state)
{
    (void)state;
    double f = -1;
    assert_int_equal(tally_get_memory_fraction(1, &f), 0);
    assert_true(f == 1.0); /* uncapped */
    assert_int_equal(tally_set_memory_fraction(0.5, 1), 0); /* 40 GiB of 80 */
    assert_int_equal(tally_get_memory_fraction(1, &f), 0);
    assert_true(f == 0.5);
    cap_begin();
    EQ(tally_get_memory_fraction(1, NULL), -TALLY_EINVAL);
    EQ(tally_get_memory_fraction(7, &f), -TALLY_EINVAL);
    cap_end();
    EQ(cap_lines(), 2);
    void *a = tu_malloc(30 * GiB, 1, S1);
    assert_non_null(a);
    tally_stats_t s0 = tu_stats(1);
    cap_begin();
    void *b = tu_malloc(11 * GiB, 1, S1);
    cap_end();
    assert_null(b);
    tally_stats_t s1 = tu_stats(1);
    EQ(s1.num_ooms - s0.num_ooms, 1);
    EQ(s1.num_alloc_retries - s0.num_alloc_retries, 1);
    EQ(s1.num_device_alloc - s0.num_device_alloc, 0); /* no backend call */
    HAS(tally_last_error(), "out of memory");
    HAS(tally_last_error(), "memory fraction");
    HAS(cap_text(), "out of memory");
    HAS(cap_text(), "device 1");
    /* Exactly at the limit is allowed (the test is strict >). */
    void *c = tu_malloc(10 * GiB, 1, S1);
    assert_non_null(c);
    EQ(tu_stats(1).reserved_bytes[0].current, 40 * GiB);
    cap_begin();
    assert_null(tu_malloc(512, 1, S1)); /* a 2 MiB segment is over */
    cap_end();
    tu_free(a);
    tu_free(c);
    /* A fraction failure frees the cache and the retry then succeeds. */
    void *d = tu_malloc(20 * GiB, 1, S2);
    assert_non_null(d);
    tally_stats_t s2 = tu_stats(1);
    EQ(s2.reserved_bytes[0].current, 20 * GiB);
    tu_free(d);
    /* 1.0 lifts the cap. */
    assert_int_equal(tally_set_memory_fraction(1.0, 1), 0);
    assert_int_equal(tally_get_memory_fraction(1, &f), 0);
    assert_true(f == 1.0);
    void *e = tu_malloc(50 * GiB, 1, S1);
    assert_non_null(e);
    tu_free(e);
    CHECK_OK();
}

static void test_memory_fraction_rejects_bad_values(void **state)
{
    (void)state;
    cap_begin();
    assert_true(tally_set_memory_fraction(-0.1, 0) < 0);
    HAS(tally_last_error(), "-0.1");
    assert_true(tally_set_memory_fraction(1.5, 0) < 0);
    HAS(tally_last_error(), "1.5");
    assert_true(tally_set_memory_fraction(NAN, 0) < 0);
    assert_true(tally_set_memory_fraction(0.5, 2) < 0);
    HAS(tally_last_error(), "device 2");
    EQ(cap_lines(), 4);
    cap_end();
    /* Nothing changed: 70 GiB still fits on device 0. */
    void *p = tu_malloc(70 * GiB, 0, S1);
    assert_non_null(p);
    tu_free(p);
}

/* tally.h / docs/configuration.md: fraction 0 is accepted (as PyTorch's
 * [0, 1]) and allows no new segments; cached blocks are still handed out. */
static void test_memory_fraction_zero_allows_no_new_segments(void **state)
{
    (void)state;
    void *a = tu_malloc(12 * MiB, 0, S1);
    tu_free(a);
    cap_begin();
    assert_int_equal(tally_set_memory_fraction(0.0, 0), 0);
    EQ(cap_lines(), 0);
    tally_stats_t s0 = tu_stats(0);
    void *b = tu_malloc(12 * MiB, 0, S1); /* the cached block */
    assert_ptr_equal(b, a);
    void *c = tu_malloc(4096, 0, S1); /* needs a 2 MiB segment */
    cap_end();
    assert_null(c);
    HAS(tally_last_error(), "memory fraction");
    tally_stats_t s1 = tu_stats(0);
    EQ(s1.num_device_alloc - s0.num_device_alloc, 0);
    EQ(s1.num_ooms - s0.num_ooms, 1);
    EQ(s1.reserved_bytes[0].current, 12 * MiB);
    assert_int_equal(tally_set_memory_fraction(1.0, 0), 0);
    c = tu_malloc(4096, 0, S1);
    assert_non_null(c);
    tu_free(b);
    tu_free(c);
    CHECK_OK();
}

/* ---- garbage collection (last: the threshold cannot be unset) ------------------ */

/* Threshold 0.5 of a 40 GiB fraction = 20 GiB. Ages count get_free_block
 * calls on the large pool since a block became free. */
static void test_gc_releases_old_cached_blocks_above_threshold(void **state)
{
    (void)state;
    assert_int_equal(tally_configure("garbage_collection_threshold:0.5"), 0);
    assert_int_equal(tally_set_memory_fraction(0.5, 0), 0);
    void *a = tu_malloc(4 * GiB, 0, S1); /* call 1 */
    void *b = tu_malloc(4 * GiB, 0, S1); /* call 2 */
    tu_free(a);                          /* age base 2 */
    for (int i = 0; i < 3; i++)             /* calls 3..5: a young 20 MiB segment */
        tu_free(tu_malloc(2 * MiB, 0, S2));
    tu_free(b);                           /* age base 5 */
    void *x = tu_malloc(13 * GiB, 0, S3); /* call 6: 8 GiB + 20 MiB reserved, below 20 GiB */
    tally_stats_t s0 = tu_stats(0);
    EQ(s0.reserved_bytes[0].current, 21 * GiB + 20 * MiB);
    /* Call 7: over 20 GiB; ages a 5, b 2, segment 2; mean 3: only a goes. */
    void *y = tu_malloc(1 * GiB, 0, S4);
    tally_stats_t s1 = tu_stats(0);
    EQ(s1.num_device_free - s0.num_device_free, 1);
    EQ(s1.reserved_bytes[0].current, 18 * GiB + 20 * MiB);
    /* b is still cached: reused without a device allocation. */
    void *b2 = tu_malloc(4 * GiB, 0, S1);
    assert_ptr_equal(b2, b);
    EQ(tu_stats(0).num_device_alloc, s1.num_device_alloc);
    CHECK_OK();
    tu_free(x);
    tu_free(y);
    tu_free(b2);
    tally_empty_cache(0);

    /* Equal ages: every block at the mean age goes in the same pass, even
     * past the target (8 GiB would do; both 8 GiB blocks are released). */
    a = tu_malloc(8 * GiB, 0, S1);
    b = tu_malloc(8 * GiB, 0, S1);
    tu_free(a);
    tu_free(b);
    x = tu_malloc(5 * GiB, 0, S3); /* 21 GiB reserved, gc not yet looking */
    s0 = tu_stats(0);
    y = tu_malloc(1 * GiB, 0, S4);
    s1 = tu_stats(0);
    EQ(s1.num_device_free - s0.num_device_free, 2);
    EQ(s1.reserved_bytes[0].current, 6 * GiB);
    tu_free(x);
    tu_free(y);
    tally_empty_cache(0);

    /* Without a fraction the threshold does nothing. */
    assert_int_equal(tally_set_memory_fraction(1.0, 0), 0);
    a = tu_malloc(4 * GiB, 0, S1);
    b = tu_malloc(4 * GiB, 0, S1);
    tu_free(a);
    tu_free(b);
    x = tu_malloc(13 * GiB, 0, S3);
    s0 = tu_stats(0);
    y = tu_malloc(1 * GiB, 0, S4);
    s1 = tu_stats(0);
    EQ(s1.num_device_free - s0.num_device_free, 0);
    EQ(s1.reserved_bytes[0].current, 22 * GiB);
    tu_free(x);
    tu_free(y);
    CHECK_OK();
}

/* The age rule: with ages 6, 4 and 2 (mean 4) a block exactly at the mean
 * age goes in the same pass as the older one, even though the older one
 * alone would cover the target; the youngest stays. Ages count large-pool
 * look-ups since the block became free. */
static void test_gc_releases_blocks_at_the_mean_age(void **state)
{
    (void)state;
    assert_int_equal(tally_configure("garbage_collection_threshold:0.5"), 0);
    assert_int_equal(tally_set_memory_fraction(0.5, 0), 0); /* threshold 20 GiB */
    void *a = tu_malloc(4 * GiB, 0, S1);                     /* look-up 1 */
    void *b = tu_malloc(4 * GiB, 0, S1);                     /* 2 */
    void *c = tu_malloc(4 * GiB, 0, S1);                     /* 3 */
    tu_free(a);                                              /* base 3 */
    void *x1 = tu_malloc(2 * MiB, 0, S3);                    /* 4: a split segment, never whole */
    void *x2 = tu_malloc(2 * MiB, 0, S3);                    /* 5 */
    tu_free(b);                                              /* base 5 */
    void *x3 = tu_malloc(2 * MiB, 0, S3);                    /* 6 */
    void *x4 = tu_malloc(2 * MiB, 0, S3);                    /* 7 */
    tu_free(c);                                              /* base 7 */
    void *y = tu_malloc(8 * GiB, 0, S4); /* 8: 12 GiB + 20 MiB reserved: under, nothing goes */
    tally_stats_t s0 = tu_stats(0);
    EQ(s0.reserved_bytes[0].current, 20 * GiB + 20 * MiB);
    EQ(s0.num_device_free, tu_stats(0).num_device_free);
    /* 9: 20 MiB over; ages a 6, b 4, c 2: a and b go. */
    void *z = tu_malloc(1 * GiB, 0, S4);
    tally_stats_t s1 = tu_stats(0);
    EQ(s1.num_device_free - s0.num_device_free, 2);
    EQ(s1.reserved_bytes[0].current, 13 * GiB + 20 * MiB);
    void *c2 = tu_malloc(4 * GiB, 0, S1); /* c is still cached */
    assert_ptr_equal(c2, c);
    EQ(tu_stats(0).num_device_alloc, s1.num_device_alloc);
    CHECK_OK();
    void *all[] = {x1, x2, x3, x4, y, z, c2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        tu_free(all[i]);
    assert_int_equal(tally_set_memory_fraction(1.0, 0), 0);
    tally_empty_cache(0);
    CHECK_OK();
}

/* Garbage collection stops once it has reclaimed its target, and not a
 * byte before: with the cap at 10 GiB - 2 bytes (a fraction of the 80 GiB
 * device that is exact in binary), the threshold is 5 GiB - 1, so 9 GiB
 * reserved is 4 GiB + 1 over. The older free 4 GiB segment goes in the
 * first pass, which leaves 1 byte to reclaim: a second pass takes the
 * younger one too. */
static void test_gc_reclaims_up_to_the_last_byte_of_its_target(void **state)
{
    (void)state;
    assert_int_equal(tally_configure("garbage_collection_threshold:0.5"), 0);
    assert_int_equal(tally_set_memory_fraction(0.9, 0), 0); /* ages count under a cap; 36 GiB: no collection yet */
    void *a = tu_malloc(4 * GiB, 0, S1);                    /* look-up 1 */
    void *b = tu_malloc(4 * GiB, 0, S1); /* 2 */
    tu_free(a);                          /* age base 2 */
    void *l = tu_malloc(1 * GiB, 0, S2); /* 3 (another stream: a new segment) */
    tu_free(b);                          /* age base 3 */
    /* The tight cap comes now: set earlier, collection would have run already. */
    assert_int_equal(tally_set_memory_fraction(137438953447.0 / 1099511627776.0, 0), 0); /* 10 GiB - 2 */
    tally_stats_t s0 = tu_stats(0);
    EQ(s0.reserved_bytes[0].current, 9 * GiB);
    /* 4: no cached block fits; a (age 2) is at or above the mean age 1.5,
     * b (1) is not; then b alone, the mean of one. */
    void *z = tu_malloc(4 * GiB + GiB / 2, 0, S1);
    assert_non_null(z);
    tally_stats_t s1 = tu_stats(0);
    EQ(s1.num_device_free - s0.num_device_free, 2);
    EQ(s1.reserved_bytes[0].current, 5 * GiB + GiB / 2);
    EQ(s1.num_alloc_retries, s0.num_alloc_retries);
    tu_free(z);
    tu_free(l);
    assert_int_equal(tally_set_memory_fraction(1.0, 0), 0);
    tally_empty_cache(0);
    CHECK_OK();
}

/* The age of a cached block counts look-ups only while garbage collection
 * is on (a memory fraction is set): blocks freed apart while it was off
 * are equally old, so all go in one pass once it is on. */
static void test_gc_ages_stand_still_without_a_fraction(void **state)
{
    (void)state;
    assert_int_equal(tally_configure("garbage_collection_threshold:0.5"), 0);
    void *a = tu_malloc(8 * GiB, 0, S1);
    void *b = tu_malloc(8 * GiB, 0, S1);
    tu_free(a);
    for (int i = 0; i < 8; i++) /* look-ups while gc is off */
        tu_free(tu_malloc(2 * MiB, 0, S2));
    tu_free(b);
    void *x = tu_malloc(5 * GiB, 0, S3);
    assert_int_equal(tally_set_memory_fraction(0.5, 0), 0); /* threshold 20 GiB */
    tally_stats_t s0 = tu_stats(0);
    EQ(s0.reserved_bytes[0].current, 21 * GiB + 20 * MiB);
    void *y = tu_malloc(1 * GiB, 0, S4); /* 1 GiB + 20 MiB over: every equal-aged block goes */
    tally_stats_t s1 = tu_stats(0);
    EQ(s1.num_device_free - s0.num_device_free, 3);
    EQ(s1.reserved_bytes[0].current, 6 * GiB);
    void *all[] = {x, y};
    assert_int_equal(tally_set_memory_fraction(1.0, 0), 0);
    free_then_empty(all, 2, 6 * GiB);
}

int main(void)
{
    tu_conf("backend:host,host_devices:2,host_capacity:80GiB,host_mode:virtual");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_oom_on_capacity_counts_and_reports, tu_setup_clean),
        cmocka_unit_test_setup(test_oom_injected_once_retry_succeeds, tu_setup_clean),
        cmocka_unit_test_setup(test_oom_injected_always_fails_and_leaves_state, tu_setup_clean),
        cmocka_unit_test_setup(test_memory_fraction_caps_reserved, tu_setup_clean),
        cmocka_unit_test_setup(test_memory_fraction_rejects_bad_values, tu_setup_clean),
        cmocka_unit_test_setup(test_memory_fraction_zero_allows_no_new_segments, tu_setup_clean),
        cmocka_unit_test_setup(test_gc_releases_old_cached_blocks_above_threshold, tu_setup_clean),
        cmocka_unit_test_setup(test_gc_releases_blocks_at_the_mean_age, tu_setup_clean),
        cmocka_unit_test_setup(test_gc_reclaims_up_to_the_last_byte_of_its_target, tu_setup_clean),
        cmocka_unit_test_setup(test_gc_ages_stand_still_without_a_fraction, tu_setup_clean),
    };
    return cmocka_run_group_tests_name("cache_limits", tests, NULL, NULL);
}
