/* The small pool on expandable segments (lib/cache/small_run.c): with
 * expandable_segments:true each stream's small pool is one run of 2 MiB
 * pages that grows at its end, as PyTorch's small expandable segment, so
 * blocks span pages and free blocks merge across them. Tested on the host
 * backend (its call counts stand for the driver's): placement across page
 * boundaries against 2 MiB segments (expandable_small_pages:false), growth
 * that extends a free end, merges past 2 MiB and where such blocks are kept,
 * no map call once a repeating job has run a step, empty_cache giving back
 * a wholly free run and the whole free pages at the end of a used one,
 * out of memory at capacity and under a memory fraction (no run left
 * behind), a run per stream, expandable_small_shared taking precedence, and
 * a run grown past max_split_size counted as no oversize segment.
 * Every invariant (tally_check) holds throughout. */
#include "expandutil.h"

static tally_host_calls_t calls(int dev)
{
    tally_host_calls_t c;
    assert_int_equal(tally_host_calls(dev, &c), 0);
    return c;
}

static int setup(void **state)
{
    if (reset(state))
        return -1;
    /* Pages never move here: the default policy. */
    return tally_configure("expandable_move_budget:0,expandable_small_pages:true,expandable_small_shared:false");
}

/* Five blocks of 768 KiB: in a run they lie end to end, the third across
 * the first page boundary, in two pages; in 2 MiB segments two fit in each,
 * so three segments. */
static void test_blocks_span_pages_where_segments_would_not(void **state)
{
    (void)state;
    void *p[5];
    tally_host_calls_t c0 = calls(0);
    for (int i = 0; i < 5; i++) {
        p[i] = tally_malloc(768 * KiB, 0, stream_a);
        assert_non_null(p[i]);
        tu_ctx("block %d", i);
        EQ((uintptr_t)p[i] - (uintptr_t)p[0], (uintptr_t)i * 768 * KiB);
    }
    tally_stats_t s = stats(0);
    EQ(s.reserved_bytes[TALLY_POOL_SMALL].current, 2 * PAGE);
    EQ(s.segment[TALLY_POOL_SMALL].current, 1);
    EQ(s.reserved_bytes[TALLY_POOL_LARGE].current, 0);
    /* One range, two map calls of one page each (the third block extended
     * the free end; the fifth fit in what was left). */
    tally_host_calls_t c1 = calls(0);
    EQ(c1.reserve - c0.reserve, 1);
    EQ(c1.map - c0.map, 2);
    EQ(c1.map_pages - c0.map_pages, 2);
    EQ(c1.alloc - c0.alloc, 0);
    CHECK_OK();
    for (int i = 0; i < 5; i++)
        tally_free(p[i]);
    CHECK_OK();
    tally_empty_cache(0);

    assert_int_equal(tally_configure("expandable_small_pages:false"), 0);
    c0 = calls(0);
    for (int i = 0; i < 5; i++)
        assert_non_null(p[i] = tally_malloc(768 * KiB, 0, stream_a));
    s = stats(0);
    EQ(s.reserved_bytes[TALLY_POOL_SMALL].current, 3 * PAGE);
    EQ(s.segment[TALLY_POOL_SMALL].current, 3);
    c1 = calls(0);
    EQ(c1.alloc - c0.alloc, 3);
    EQ(c1.map - c0.map, 0);
    CHECK_OK();
    for (int i = 0; i < 5; i++)
        tally_free(p[i]);
    CHECK_OK();
}

/* Freed, the blocks merge across the page boundary into one free block of
 * 4 MiB (kept beside the small pool's bins, which end at 2 MiB; a run's
 * frees take the general path, which can file it there); the next small
 * blocks take it from its lowest address with no map call. */
static void test_free_blocks_merge_across_pages(void **state)
{
    (void)state;
    void *p[5];
    for (int i = 0; i < 5; i++)
        assert_non_null(p[i] = tally_malloc(768 * KiB, 0, stream_a));
    for (int i = 4; i >= 0; i--)
        tally_free(p[i]);
    tally_stats_t s = stats(0);
    EQ(s.largest_free_block, 2 * PAGE);
    EQ(s.inactive_split[TALLY_POOL_SMALL].current, 0); /* one block: the run is not split */
    CHECK_OK();
    tally_host_calls_t c0 = calls(0);
    void *a = tally_malloc(512, 0, stream_a);
    EQ((uintptr_t)a, (uintptr_t)p[0]);
    s = stats(0);
    EQ(s.inactive_split[TALLY_POOL_SMALL].current, 1);
    EQ(s.inactive_split_bytes[TALLY_POOL_SMALL].current, 2 * PAGE - 512);
    CHECK_OK();
    void *b = tally_malloc(1 * MiB, 0, stream_a);
    EQ((uintptr_t)b, (uintptr_t)p[0] + 512);
    void *c = tally_malloc(2 * MiB + 512, 0, stream_a); /* large pool: no part of the run */
    assert_non_null(c);
    assert_true((uintptr_t)c < (uintptr_t)p[0] || (uintptr_t)c >= (uintptr_t)p[0] + 2 * PAGE);
    EQ(calls(0).map - c0.map, 1); /* the large block's own */
    CHECK_OK();
    tally_free(b);
    tally_free(a);
    tally_free(c);
    CHECK_OK();
}

/* A job that repeats a step of small allocations maps pages in its first
 * step only. */
static void test_no_map_call_after_the_first_step(void **state)
{
    (void)state;
    static const size_t sizes[] = {1 * MiB, 3 * KiB, 700 * KiB, 512, 1 * MiB, 96 * KiB, 900 * KiB, 4 * KiB};
    enum { N = sizeof sizes / sizeof sizes[0] };
    void *keep[4] = {0};
    uint64_t maps_after_first = 0;
    for (int step = 0; step < 6; step++) {
        void *p[N];
        for (int i = 0; i < N; i++)
            assert_non_null(p[i] = tally_malloc(sizes[i], 0, stream_a));
        /* Some outlive the step into the next, as activations do. */
        for (int i = 0; i < 4; i++) {
            if (keep[i])
                tally_free(keep[i]);
            keep[i] = p[2 * i];
        }
        for (int i = 1; i < N; i += 2)
            tally_free(p[i]);
        if (step == 1)
            maps_after_first = calls(0).map;
        if (step > 1) {
            tu_ctx("step %d", step);
            EQ(calls(0).map, maps_after_first);
        }
        CHECK_OK();
    }
    for (int i = 0; i < 4; i++)
        tally_free(keep[i]);
    CHECK_OK();
}

/* empty_cache: the whole free pages at the end of a run in use go back
 * (the free block at the end shrinks to the page boundary, or goes), and a
 * wholly free run goes with its range. */
static void test_empty_cache_trims_the_end_and_releases_a_free_run(void **state)
{
    (void)state;
    void *p[5];
    for (int i = 0; i < 5; i++)
        assert_non_null(p[i] = tally_malloc(768 * KiB, 0, stream_a));
    tally_free(p[4]);
    tally_free(p[3]);
    tally_free(p[2]); /* free from 1.5 MiB to the run's end at 4 MiB */
    tally_host_calls_t c0 = calls(0);
    tally_empty_cache(0);
    tally_stats_t s = stats(0);
    EQ(s.reserved_bytes[TALLY_POOL_SMALL].current, PAGE);
    EQ(s.segment[TALLY_POOL_SMALL].current, 1);
    EQ(s.inactive_split_bytes[TALLY_POOL_SMALL].current, 512 * KiB);
    tally_host_calls_t c1 = calls(0);
    EQ(c1.unmap - c0.unmap, 1);
    EQ(c1.unmap_pages - c0.unmap_pages, 1);
    CHECK_OK();
    /* The shrunken end grows again under the next block, at the same place. */
    void *q = tally_malloc(768 * KiB, 0, stream_a);
    EQ((uintptr_t)q, (uintptr_t)p[2]);
    EQ(calls(0).map - c1.map, 1);
    CHECK_OK();
    tally_free(q);

    /* A free end that starts on a page boundary goes whole. */
    void *r[2];
    for (int i = 0; i < 2; i++)
        assert_non_null(r[i] = tally_malloc(1 * MiB, 0, stream_a)); /* 1.5 MiB .. 3.5 MiB */
    void *t = tally_malloc(1 * MiB, 0, stream_a);                   /* 3.5 .. 4.5: a third page */
    EQ(stats(0).reserved_bytes[TALLY_POOL_SMALL].current, 3 * PAGE);
    tally_free(t);
    tally_free(r[1]);
    tally_free(r[0]);
    tally_empty_cache(0);
    s = stats(0);
    EQ(s.reserved_bytes[TALLY_POOL_SMALL].current, PAGE);
    CHECK_OK();
    tally_free(p[1]);
    tally_empty_cache(0); /* p[0] still holds the first page */
    EQ(stats(0).reserved_bytes[TALLY_POOL_SMALL].current, PAGE);
    CHECK_OK();

    tally_free(p[0]);
    c0 = calls(0);
    tally_empty_cache(0);
    s = stats(0);
    EQ(s.reserved_bytes[TALLY_POOL_SMALL].current, 0);
    EQ(s.segment[TALLY_POOL_SMALL].current, 0);
    c1 = calls(0);
    EQ(c1.unmap - c0.unmap, 1);
    EQ(c1.unreserve - c0.unreserve, 1);
    CHECK_OK();
}

/* At capacity (device 1: 256 MiB) the run cannot grow: the allocation
 * fails as out of memory, after giving back what is cached, and leaves no
 * run behind; under a memory fraction likewise. */
static void test_out_of_memory_leaves_no_run(void **state)
{
    (void)state;
    tally_set_sink(discard, NULL);
    void *big = tally_malloc(256 * MiB, 1, stream_a);
    assert_non_null(big);
    tally_stats_t before = stats(1);
    void *s = tally_malloc(4 * KiB, 1, stream_a);
    assert_null(s);
    HAS(tally_last_error(), "out of memory");
    tally_stats_t after = stats(1);
    EQ(after.num_ooms, before.num_ooms + 1);
    EQ(after.num_alloc_retries, before.num_alloc_retries + 1);
    EQ(after.segment[TALLY_POOL_SMALL].current, 0);
    EQ(after.reserved_bytes[TALLY_POOL_SMALL].current, 0);
    CHECK_OK();
    tally_free(big);
    tally_empty_cache(1);
    assert_non_null(s = tally_malloc(4 * KiB, 1, stream_a));
    CHECK_OK();
    tally_free(s);
    tally_empty_cache(1);

    /* A fraction of 1/128: 2 MiB, one page. */
    assert_int_equal(tally_set_memory_fraction(1.0 / 128, 1), 0);
    void *a = tally_malloc(768 * KiB, 1, stream_a);
    void *a2 = tally_malloc(768 * KiB, 1, stream_a);
    assert_non_null(a);
    assert_non_null(a2);
    void *b = tally_malloc(1 * MiB, 1, stream_a); /* would need a second page */
    assert_null(b);
    HAS(tally_last_error(), "out of memory");
    EQ(stats(1).reserved_bytes[TALLY_POOL_SMALL].current, PAGE);
    CHECK_OK();
    tally_free(a);
    tally_free(a2);
    assert_int_equal(tally_set_memory_fraction(1.0, 1), 0);
    tally_empty_cache(1);
    tally_set_sink(NULL, NULL);
    CHECK_OK();
}

/* Each stream has its own run; a block of one never lands in the other's. */
static void test_streams_get_their_own_run(void **state)
{
    (void)state;
    void *stream_b = (void *)0x200;
    void *a = tally_malloc(1 * MiB, 0, stream_a);
    void *b = tally_malloc(1 * MiB, 0, stream_b);
    void *a2 = tally_malloc(1 * MiB, 0, stream_a);
    assert_non_null(a);
    assert_non_null(b);
    EQ((uintptr_t)a2, (uintptr_t)a + 1 * MiB);
    tally_stats_t s = stats(0);
    EQ(s.segment[TALLY_POOL_SMALL].current, 2);
    EQ(s.reserved_bytes[TALLY_POOL_SMALL].current, 2 * PAGE);
    assert_true((uintptr_t)b < (uintptr_t)a || (uintptr_t)b >= (uintptr_t)a + PAGE);
    CHECK_OK();
    tally_free(a);
    tally_free(a2);
    tally_free(b);
    tally_empty_cache(0);
    EQ(stats(0).segment[TALLY_POOL_SMALL].current, 0);
    CHECK_OK();
}

/* expandable_small_shared takes precedence: its small segments are 2 MiB
 * pieces lent by the large pool's range, and no run is made. */
static void test_small_shared_takes_precedence(void **state)
{
    (void)state;
    assert_int_equal(tally_configure("expandable_small_shared:true"), 0);
    tally_host_calls_t c0 = calls(0);
    void *p[3];
    for (int i = 0; i < 3; i++)
        assert_non_null(p[i] = tally_malloc(768 * KiB, 0, stream_a));
    tally_stats_t s = stats(0);
    EQ(s.segment[TALLY_POOL_SMALL].current, 2); /* two lent pieces */
    EQ(calls(0).reserve - c0.reserve, 1);      /* the large pool's range */
    CHECK_OK();
    for (int i = 0; i < 3; i++)
        tally_free(p[i]);
    CHECK_OK();
}

/* A run that grows past max_split_size is still no oversize segment (PyTorch
 * counts those only for segments cudaMalloc made, never an expandable one),
 * and tally_check's recount agrees: found by fuzz_api_expand, whose recount
 * counted a run of 26 MiB as one (tests/fuzz/regressions/fuzz_api_expand/).
 * Run in a child configured with max_split_size_mb:20 (main). */
static void test_a_run_past_max_split_size_is_no_oversize_segment(void **state)
{
    (void)state;
    enum { N = 40 };
    void *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = tally_malloc(768 * KiB, 0, stream_a);
        assert_non_null(p[i]);
    }
    tally_stats_t s = stats(0);
    EQ(s.segment[TALLY_POOL_SMALL].current, 1);
    assert_true(s.reserved_bytes[TALLY_POOL_SMALL].current >= (int64_t)(30 * MiB));
    EQ(s.oversize_segments.current, 0);
    CHECK_OK();
    for (int i = 0; i < N; i++)
        tally_free(p[i]);
    CHECK_OK();
    tally_empty_cache(0);
    s = stats(0);
    EQ(s.oversize_segments.current, 0);
    EQ(s.reserved_bytes[TALLY_POOL_SMALL].current, 0);
    CHECK_OK();
}

static void test_options_show_the_key(void **state)
{
    (void)state;
    tu_buf_t buf = {0};
    assert_int_equal(tally_write_options(tu_buf_write, &buf), 0);
    HAS(buf.p, "expandable_small_pages:true");
    tu_buf_free(&buf);
    tally_set_sink(discard, NULL);
    assert_int_not_equal(tally_configure("expandable_small_pages:maybe"), 0);
    HAS(tally_last_error(), "expandable_small_pages");
    tally_set_sink(NULL, NULL);
}

/* max_split_size is set only before initialisation: the oversize test runs
 * in a child of its own, configured with it. */
static int run_with_max_split(void)
{
    tu_conf(EXPAND_TEST_CONF ",max_split_size_mb:20");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_a_run_past_max_split_size_is_no_oversize_segment, setup),
    };
    return cmocka_run_group_tests_name("small_run_max_split", tests, NULL, NULL);
}

int main(void)
{
    int child_failed = tu_run_child(run_with_max_split);

    tu_conf(EXPAND_TEST_CONF);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_blocks_span_pages_where_segments_would_not, setup),
        cmocka_unit_test_setup(test_free_blocks_merge_across_pages, setup),
        cmocka_unit_test_setup(test_no_map_call_after_the_first_step, setup),
        cmocka_unit_test_setup(test_empty_cache_trims_the_end_and_releases_a_free_run, setup),
        cmocka_unit_test_setup(test_out_of_memory_leaves_no_run, setup),
        cmocka_unit_test_setup(test_streams_get_their_own_run, setup),
        cmocka_unit_test_setup(test_small_shared_takes_precedence, setup),
        cmocka_unit_test_setup(test_options_show_the_key, setup),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    return failed || child_failed ? 1 : 0;
}
