/* max_split_size_mb:40, the configuration that changes the caching rules
 * for large blocks: oversize blocks (never split, counted), the reuse
 * allowance of max_non_split_rounding, release_available_cached_blocks
 * under a memory fraction, and, in children with their own TALLY_CONF, the
 * limit with expandable segments and with a large segment of 100 MiB. The
 * other caching options are in test_core_options.c; what both share is in
 * optionsutil.h.
 *
 * This process runs with CONF_MAIN (optionsutil.h): one host device of
 * 80 GiB, max_split_size_mb:40. */
#include "optionsutil.h"

/* 100 MiB of the 80 GiB device: 5/4096, exact in binary. */
#define FRACTION_100MiB 0.001220703125

/* ---- max_split_size_mb, in children with their own TALLY_CONF ------------ */

/* max_split_size_mb with expandable segments: a stream's region is one
 * free block far above any max_split_size, yet its pieces are never
 * oversize (PyTorch's expandable segments split them as any other), so a
 * request under the limit and one over it are both served from it. */
static void test_max_split_size_leaves_expandable_blocks_alone_in_a_child(void **state)
{
    (void)state;
    static const child_case_t cases[] = {
        {3 * MiB, 3 * MiB},
        {30 * MiB, 30 * MiB},
        {21 * MiB + 1, 21 * MiB + 512},
    };
    child_rounding("backend:host,host_mode:virtual,host_capacity:8GiB,expandable_segments:true,max_split_size_mb:20",
                   cases, sizeof cases / sizeof cases[0]);
}

/* max_split_size_mb with a 100 MiB large segment (large_segment_size_mb): an
 * 8 MiB block is split from it (under the limit), leaving a free tail of
 * 92 MiB, far above the limit but part of a segment with a live block. A
 * request that does not fit under the capacity makes the allocator release
 * oversize cached blocks first (release_available_cached_blocks): only whole
 * free segments may go, so the tail stays, the request fails as out of
 * memory, and the live block, its segment and the cache stay intact. */
static void test_oversize_release_leaves_a_split_segment_alone_in_a_child(void **state)
{
    (void)state;
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        tu_buf_t diag = {0};
        tally_set_sink(tu_buf_write, &diag); /* the out-of-memory report is expected */
        tu_conf("backend:host,host_mode:virtual,host_devices:1,host_capacity:200MiB,max_split_size_mb:40,"
                "large_segment_size_mb:100,leak_report:off");
        CHILD_REQUIRE(tally_init() == 0);
        void *a = tu_malloc(8 * MiB, 0, NULL);
        CHILD_REQUIRE(a != NULL);
        tally_stats_t s0;
        CHILD_REQUIRE(tally_get_stats(0, &s0) == 0);
        CHILD_REQUIRE(s0.reserved_bytes[0].current == 100 * MiB && s0.inactive_split_bytes[0].current == 92 * MiB);
        void *big = tally_malloc(150 * MiB, 0, NULL); /* 100 + 150 > 200 */
        CHILD_REQUIRE(big == NULL);
        tally_stats_t s1;
        CHILD_REQUIRE(tally_get_stats(0, &s1) == 0);
        CHILD_REQUIRE(s1.num_device_free == s0.num_device_free);
        CHILD_REQUIRE(s1.reserved_bytes[0].current == 100 * MiB && s1.segment[0].current == 1);
        CHILD_REQUIRE(s1.num_ooms - s0.num_ooms == 1);
        CHILD_REQUIRE(tally_check() == 0);
        tally_block_info_t i;
        CHILD_REQUIRE(tally_block_info(a, &i) == 0 && i.size == 8 * MiB);
        /* The tail still serves a request of its size class. */
        void *c = tu_malloc(80 * MiB, 0, NULL);
        CHILD_REQUIRE(c == (char *)a + 8 * MiB);
        tu_free(c);
        tu_free(a);
        CHILD_REQUIRE(tally_check() == 0);
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("child failed: status %d (its message is above)", status);
}

/* ---- max_split_size_mb:40 -------------------------------------------------- */

static void test_oversize_block_not_split_and_counted(void **state)
{
    (void)state;
    int64_t freed0 = tu_stats(0).oversize_allocations.freed;
    void *a = tu_malloc(50 * MiB, 0, S1);
    tally_stats_t s = tu_stats(0);
    EQ(tu_info(a).size, 50 * MiB);
    EQ(s.oversize_allocations.current, 1);
    EQ(s.oversize_segments.current, 1);
    EQ(s.inactive_split[0].current, 0);
    tu_free(a);
    s = tu_stats(0);
    EQ(s.oversize_allocations.current, 0);
    EQ(s.oversize_allocations.freed - freed0, 1);
    EQ(s.oversize_segments.current, 1); /* still cached */

    /* 39.5 MiB: below the limit, but its 40 MiB segment is at it; the
     * remainder (0.5 MiB) is too small to split, so the block is 40 MiB and
     * counts as an oversize allocation. */
    void *b = tu_malloc(39 * MiB + 512 * KiB, 0, S1);
    EQ(tu_info(b).size, 40 * MiB);
    s = tu_stats(0);
    EQ(s.oversize_allocations.current, 1);
    EQ(s.oversize_segments.current, 2);
    tu_free(b);

    /* 38.5 MiB: a 40 MiB (oversize) segment that is split. */
    void *c = tu_malloc(38 * MiB + 512 * KiB, 0, S2);
    EQ(tu_info(c).size, 38 * MiB + 512 * KiB);
    s = tu_stats(0);
    EQ(s.oversize_allocations.current, 0);
    EQ(s.oversize_segments.current, 3);
    EQ(s.inactive_split_bytes[TALLY_POOL_LARGE].current, 1536 * KiB);
    tu_free(c);
    EQ(tu_stats(0).oversize_segments.current, 3);
    CHECK_OK();
    EQ(tally_empty_cache(0), 130 * MiB);
    EQ(tu_stats(0).oversize_segments.current, 0);
}

static void test_cached_oversize_block_not_used_for_smaller_request(void **state)
{
    (void)state;
    void *a = tu_malloc(50 * MiB, 0, S1);
    tu_free(a);
    int64_t allocs = tu_stats(0).num_device_alloc;
    void *b = tu_malloc(30 * MiB, 0, S1); /* below max_split: never an oversize block */
    assert_ptr_not_equal(b, a);
    EQ(tu_stats(0).num_device_alloc - allocs, 1);
    void *c = tu_malloc(2 * MiB, 0, S1);
    assert_true((uintptr_t)c < (uintptr_t)a || (uintptr_t)c >= (uintptr_t)a + 50 * MiB);
    EQ(tu_stats(0).num_device_alloc - allocs, 2);
    /* A request at or above max_split takes it. */
    void *d = tu_malloc(40 * MiB, 0, S1);
    assert_ptr_equal(d, a);
    EQ(tu_info(d).size, 50 * MiB);
    EQ(tu_stats(0).num_device_alloc - allocs, 2);
    tu_free(b);
    tu_free(c);
    tu_free(d);
    CHECK_OK();
}

/* The limit itself is oversize: a cached free block of exactly 40 MiB is not
 * used for a 30 MiB request (and so never split); a 40 MiB request takes it. */
static void test_block_of_exactly_max_split_is_oversize(void **state)
{
    (void)state;
    void *a = tu_malloc(40 * MiB, 0, S2);
    EQ(tu_info(a).size, 40 * MiB);
    EQ(tu_stats(0).oversize_allocations.current, 1);
    tu_free(a);
    int64_t allocs = tu_stats(0).num_device_alloc;
    void *b = tu_malloc(30 * MiB, 0, S2);
    assert_ptr_not_equal(b, a);
    EQ(tu_info(b).size, 30 * MiB);
    EQ(tu_stats(0).num_device_alloc - allocs, 1);
    EQ(tu_stats(0).inactive_split[0].current, 0);
    void *c = tu_malloc(40 * MiB, 0, S2);
    assert_ptr_equal(c, a);
    EQ(tu_stats(0).num_device_alloc - allocs, 1);
    tu_free(b);
    tu_free(c);
    CHECK_OK();
}

/* A cached oversize block serves a request at most
 * max_non_split_rounding (20 MiB) smaller than itself, whole. */
static void test_oversize_reuse_allowance_is_20MiB(void **state)
{
    (void)state;
    void *a = tu_malloc(62 * MiB, 0, S1);
    tu_free(a);
    int64_t allocs = tu_stats(0).num_device_alloc;
    void *b = tu_malloc(42 * MiB, 0, S1); /* 62 >= 42 + 20: not reused */
    assert_ptr_not_equal(b, a);
    EQ(tu_stats(0).num_device_alloc - allocs, 1);
    void *c = tu_malloc(42 * MiB + 1, 0, S1); /* 62 < 42 MiB + 512 + 20: reused whole */
    assert_ptr_equal(c, a);
    EQ(tu_info(c).size, 62 * MiB);
    EQ(tu_info(c).requested_size, 42 * MiB + 1);
    tally_stats_t s = tu_stats(0);
    EQ(s.num_device_alloc - allocs, 1);
    EQ(s.inactive_split[0].current, 0);
    EQ(s.allocated_bytes[0].current, 104 * MiB);
    EQ(s.requested_bytes[0].current, 84 * MiB + 1);
    EQ(s.oversize_allocations.current, 2);
    tu_free(b);
    tu_free(c);
    CHECK_OK();
}

/* Under a 100 MiB fraction: a failed allocation first frees one cached
 * oversize block big enough (no sync, no retry counted). */
static void test_release_available_frees_one_oversize_block(void **state)
{
    (void)state;
    assert_int_equal(tally_set_memory_fraction(FRACTION_100MiB, 0), 0);
    void *a = tu_malloc(50 * MiB, 0, S1);
    tu_free(a);
    void *b = tu_malloc(30 * MiB, 0, S1);
    tally_stats_t s0 = tu_stats(0);
    EQ(s0.reserved_bytes[0].current, 80 * MiB);
    void *c = tu_malloc(30 * MiB, 0, S1); /* 80 + 30 > 100 */
    assert_non_null(c);
    tally_stats_t s1 = tu_stats(0);
    EQ(s1.num_device_free - s0.num_device_free, 1);
    EQ(s1.num_device_alloc - s0.num_device_alloc, 1);
    EQ(s1.num_sync_all_streams - s0.num_sync_all_streams, 0);
    EQ(s1.num_alloc_retries - s0.num_alloc_retries, 0);
    EQ(s1.num_ooms - s0.num_ooms, 0);
    EQ(s1.reserved_bytes[0].current, 60 * MiB);
    EQ(s1.oversize_segments.current, 0);
    tu_free(b);
    tu_free(c);
    CHECK_OK();
}

static void test_release_available_frees_several_largest_blocks(void **state)
{
    (void)state;
    assert_int_equal(tally_set_memory_fraction(FRACTION_100MiB, 0), 0);
    void *a = tu_malloc(42 * MiB, 0, S1);
    void *b = tu_malloc(44 * MiB, 0, S1);
    tu_free(a);
    tu_free(b);
    tally_stats_t s0 = tu_stats(0);
    void *c = tu_malloc(60 * MiB, 0, S1); /* 86 + 60 > 100; no single block is 60: both go */
    assert_non_null(c);
    tally_stats_t s1 = tu_stats(0);
    EQ(s1.num_device_free - s0.num_device_free, 2);
    EQ(s1.num_sync_all_streams - s0.num_sync_all_streams, 0);
    EQ(s1.num_alloc_retries - s0.num_alloc_retries, 0);
    EQ(s1.reserved_bytes[0].current, 60 * MiB);
    tu_free(c);
    CHECK_OK();
}

/* The largest blocks go only until together they are enough: under a
 * 200 MiB cap with 42, 44 and 46 MiB cached, 80 MiB more (212 > 200) frees
 * 46 and 44 (90 >= 80), and 42 stays cached, as PyTorch's loop stops. */
static void test_release_available_stops_when_enough(void **state)
{
    (void)state;
    assert_int_equal(tally_set_memory_fraction(2 * FRACTION_100MiB, 0), 0);
    void *a = tu_malloc(42 * MiB, 0, S1);
    void *b = tu_malloc(44 * MiB, 0, S1);
    void *c = tu_malloc(46 * MiB, 0, S1);
    tu_free(a);
    tu_free(b);
    tu_free(c);
    tally_stats_t s0 = tu_stats(0);
    EQ(s0.reserved_bytes[0].current, 132 * MiB);
    void *d = tu_malloc(80 * MiB, 0, S1);
    assert_non_null(d);
    tally_stats_t s1 = tu_stats(0);
    EQ(s1.num_device_free - s0.num_device_free, 2);
    EQ(s1.num_sync_all_streams - s0.num_sync_all_streams, 0);
    EQ(s1.num_alloc_retries - s0.num_alloc_retries, 0);
    EQ(s1.reserved_bytes[0].current, (42 + 80) * MiB);
    tu_free(d);
    CHECK_OK();
}

/* Not enough oversize blocks: they are released anyway, then the full
 * release_cached_blocks (sync) and the counted retry, then the OOM. */
static void test_release_available_not_enough_then_oom(void **state)
{
    (void)state;
    assert_int_equal(tally_set_memory_fraction(FRACTION_100MiB, 0), 0);
    void *a = tu_malloc(44 * MiB, 0, S1);
    void *live = tu_malloc(50 * MiB, 0, S1);
    tu_free(a);
    tally_stats_t s0 = tu_stats(0);
    cap_begin();
    void *c = tu_malloc(60 * MiB, 0, S1); /* 94 + 60 > 100, and 50 + 60 still is */
    cap_end();
    assert_null(c);
    tally_stats_t s1 = tu_stats(0);
    EQ(s1.num_device_free - s0.num_device_free, 1);
    EQ(s1.num_sync_all_streams - s0.num_sync_all_streams, 1);
    EQ(s1.num_alloc_retries - s0.num_alloc_retries, 1);
    EQ(s1.num_ooms - s0.num_ooms, 1);
    EQ(s1.reserved_bytes[0].current, 50 * MiB);
    HAS(tally_last_error(), "out of memory");
    HAS(cap_text(), "out of memory");
    tu_free(live);
    CHECK_OK();
}

/* Oversize blocks cached on another stream are not candidates; the full
 * release path frees them. */
/* What the full release path leaves in the statistics between s0 and s1:
 * one segment freed, one sync of all streams, one counted retry, no OOM. */
static void expect_full_release(const tally_stats_t *s0, const tally_stats_t *s1)
{
    EQ(s1->num_device_free - s0->num_device_free, 1);
    EQ(s1->num_sync_all_streams - s0->num_sync_all_streams, 1);
    EQ(s1->num_alloc_retries - s0->num_alloc_retries, 1);
    EQ(s1->num_ooms - s0->num_ooms, 0);
}

/* A cached oversize block on cached_on; 30 MiB twice on asked_on under the
 * 100 MiB cap: the second needs the block released, which only the full
 * release does (release_available_cached_blocks keeps to the stream). */
static void other_stream_case(void *cached_on, void *asked_on)
{
    tu_free(tu_malloc(50 * MiB, 0, cached_on));
    void *b = tu_malloc(30 * MiB, 0, asked_on);
    tally_stats_t s0 = tu_stats(0);
    void *c = tu_malloc(30 * MiB, 0, asked_on);
    assert_non_null(c);
    tally_stats_t s1 = tu_stats(0);
    expect_full_release(&s0, &s1);
    tu_free(b);
    tu_free(c);
    CHECK_OK();
    tally_empty_cache(0);
}

static void test_release_available_ignores_other_streams(void **state)
{
    (void)state;
    assert_int_equal(tally_set_memory_fraction(FRACTION_100MiB, 0), 0);
    other_stream_case(S2, S1);
    /* The other way round: the cached block's stream orders before the
     * request's, where the search for the largest blocks starts. */
    other_stream_case(S1, S2);
}

/* Releasing oversize blocks that together fall short is not a success: the
 * allocation goes on to the full release (sync) and the counted retry even
 * though, after an injected OOM, the backend would now have room. */
static void test_release_available_short_goes_on_to_full_release(void **state)
{
    (void)state;
    tu_free(tu_malloc(50 * MiB, 0, S1));
    tally_stats_t s0 = tu_stats(0);
    assert_int_equal(tally_host_fail_alloc(1, 0), 0);
    void *c = tu_malloc(60 * MiB, 0, S1); /* no 60 MiB block; 50 is not enough */
    assert_non_null(c);
    tally_stats_t s1 = tu_stats(0);
    expect_full_release(&s0, &s1);
    tu_free(c);
    CHECK_OK();
}

int main(void)
{
    tu_conf(CONF_MAIN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_max_split_size_leaves_expandable_blocks_alone_in_a_child), /* first: fork before init */
        cmocka_unit_test(test_oversize_release_leaves_a_split_segment_alone_in_a_child), /* before init */
        cmocka_unit_test_setup(test_oversize_block_not_split_and_counted, tu_setup_clean),
        cmocka_unit_test_setup(test_cached_oversize_block_not_used_for_smaller_request, tu_setup_clean),
        cmocka_unit_test_setup(test_block_of_exactly_max_split_is_oversize, tu_setup_clean),
        cmocka_unit_test_setup(test_oversize_reuse_allowance_is_20MiB, tu_setup_clean),
        cmocka_unit_test_setup(test_release_available_frees_one_oversize_block, tu_setup_clean),
        cmocka_unit_test_setup(test_release_available_frees_several_largest_blocks, tu_setup_clean),
        cmocka_unit_test_setup(test_release_available_stops_when_enough, tu_setup_clean),
        cmocka_unit_test_setup(test_release_available_not_enough_then_oom, tu_setup_clean),
        cmocka_unit_test_setup(test_release_available_ignores_other_streams, tu_setup_clean),
        cmocka_unit_test_setup(test_release_available_short_goes_on_to_full_release, tu_setup_clean),
    };
    return cmocka_run_group_tests_name("options_max_split", tests, NULL, NULL);
}
