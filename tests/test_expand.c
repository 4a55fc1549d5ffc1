/* Expandable segments (expandable_segments:true) on the host backend: the
 * large pool of a stream is one address range with 2 MiB pages mapped where
 * blocks live; idle pages move to where they are needed instead of raising
 * the peak; empty_cache unmaps them; every invariant holds throughout. */
#include "testutil.h"

#define PAGE (2 * MiB)

static void *stream_a = (void *)0x100;

static tally_stats_t stats(int dev)
{
    tally_stats_t s;
    assert_int_equal(tally_get_stats(dev, &s), 0);
    return s;
}

static int reset(void **state)
{
    (void)state;
    tally_empty_cache(-1);
    return 0;
}

static void test_large_block_maps_only_its_pages(void **state)
{
    (void)state;
    tally_stats_t before = stats(0);
    void *p = tally_malloc(5 * MiB + 1, 0, stream_a); /* rounds to 5 MiB + 512: three pages */
    assert_non_null(p);
    tally_stats_t s = stats(0);
    EQ(s.reserved_bytes[TALLY_POOL_LARGE].current - before.reserved_bytes[TALLY_POOL_LARGE].current, 3 * PAGE);
    EQ(s.segment[TALLY_POOL_LARGE].current - before.segment[TALLY_POOL_LARGE].current, 1);
    /* No 20 MiB segment as without expandable segments. */
    EQ(s.inactive_split_bytes[TALLY_POOL_ALL].current, 0);
    CHECK_OK();
    tally_free(p);
    CHECK_OK();
}

static void test_holes_are_reused_without_raising_the_peak(void **state)
{
    (void)state;
    /* Three 20 MiB blocks, free the first and last: 20 pages idle. A 40 MiB
     * block fits in no hole, but the idle pages move under it, so reserved
     * memory does not pass its high-water mark. */
    void *a = tally_malloc(20 * MiB, 0, stream_a);
    void *b = tally_malloc(20 * MiB, 0, stream_a);
    void *c = tally_malloc(20 * MiB, 0, stream_a);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    tally_stats_t full = stats(0);
    tally_free(a);
    tally_free(c);
    CHECK_OK();
    void *d = tally_malloc(40 * MiB, 0, stream_a);
    assert_non_null(d);
    tally_stats_t s = stats(0);
    EQ(s.reserved_bytes[TALLY_POOL_ALL].peak, full.reserved_bytes[TALLY_POOL_ALL].peak);
    EQ(s.reserved_bytes[TALLY_POOL_ALL].current, 60 * MiB);
    CHECK_OK();
    tally_free(b);
    tally_free(d);
    CHECK_OK();
}

static void test_empty_cache_unmaps_idle_pages(void **state)
{
    (void)state;
    void *keep = tally_malloc(8 * MiB, 0, stream_a);
    void *gone = tally_malloc(30 * MiB, 0, stream_a);
    tally_free(gone);
    tally_stats_t before = stats(0);
    size_t released = tally_empty_cache(0);
    tally_stats_t after = stats(0);
    EQ(released, before.reserved_bytes[TALLY_POOL_ALL].current - after.reserved_bytes[TALLY_POOL_ALL].current);
    EQ(after.reserved_bytes[TALLY_POOL_LARGE].current, 4 * PAGE);
    CHECK_OK();
    tally_free(keep);
    /* Everything free: the region itself goes back. */
    tally_empty_cache(0);
    EQ(stats(0).reserved_bytes[TALLY_POOL_LARGE].current, 0);
    EQ(stats(0).segment[TALLY_POOL_LARGE].current, 0);
    CHECK_OK();
}

static void test_streams_get_their_own_region(void **state)
{
    (void)state;
    void *x = tally_malloc(12 * MiB, 0, (void *)0x200);
    void *y = tally_malloc(12 * MiB, 0, (void *)0x300);
    assert_non_null(x);
    assert_non_null(y);
    EQ(stats(0).segment[TALLY_POOL_LARGE].current, 2);
    tally_free(x);
    /* x's memory is not handed to the other stream. */
    void *z = tally_malloc(12 * MiB, 0, (void *)0x300);
    assert_true(z != x);
    CHECK_OK();
    tally_free(y);
    tally_free(z);
}

static void test_out_of_memory_at_capacity(void **state)
{
    (void)state;
    /* Device 1 has 256 MiB (host_capacity). */
    void *p = tally_malloc(200 * MiB, 1, stream_a);
    assert_non_null(p);
    tally_stats_t before = stats(1);
    void *q = tally_malloc(100 * MiB, 1, stream_a);
    assert_null(q);
    HAS(tally_last_error(), "out of memory");
    tally_stats_t after = stats(1);
    EQ(after.num_ooms, before.num_ooms + 1);
    EQ(after.allocation[0].current, before.allocation[0].current);
    CHECK_OK();
    /* Freed memory serves the next request. */
    tally_free(p);
    q = tally_malloc(100 * MiB, 1, stream_a);
    assert_non_null(q);
    CHECK_OK();
    tally_free(q);
}

/* A memory fraction caps what the pages take: 64 MiB of device 1's 256. */
static void test_memory_fraction_caps_mapped_pages(void **state)
{
    (void)state;
    assert_int_equal(tally_set_memory_fraction(0.25, 1), 0);
    void *p = tally_malloc(48 * MiB, 1, stream_a);
    assert_non_null(p);
    tally_stats_t before = stats(1);
    void *q = tally_malloc(32 * MiB, 1, stream_a); /* 48 + 32 > 64 */
    assert_null(q);
    HAS(tally_last_error(), "out of memory");
    tally_stats_t after = stats(1);
    EQ(after.num_ooms, before.num_ooms + 1);
    assert_true(after.reserved_bytes[0].current <= (int64_t)(64 * MiB));
    q = tally_malloc(16 * MiB, 1, stream_a); /* 48 + 16 = 64: fits */
    assert_non_null(q);
    EQ(stats(1).reserved_bytes[0].current, 64 * MiB);
    CHECK_OK();
    tally_free(p);
    tally_free(q);
    assert_int_equal(tally_set_memory_fraction(1.0, 1), 0);
}

/* Reserved memory can fall below its high-water mark without empty_cache:
 * garbage collection (run for a small-pool request) gives back a whole free
 * region. Up to the mark, new pages are then mapped without taking the idle
 * pages of other regions. */
static void test_pages_below_the_mark_leave_idle_pages_alone(void **state)
{
    (void)state;
    void *stream_b = (void *)0x200, *stream_c = (void *)0x300;
    assert_int_equal(tally_configure("garbage_collection_threshold:0.1"), 0);
    assert_int_equal(tally_set_memory_fraction(0.25, 1), 0); /* 64 MiB; gc above 6.4 MiB */
    void *b1 = tally_malloc(4 * MiB, 1, stream_b);
    void *b2 = tally_malloc(4 * MiB, 1, stream_b);
    void *a = tally_malloc(8 * MiB, 1, stream_a);
    assert_true(b1 && b2 && a);
    tally_free(a);  /* stream a's region: whole and free, 4 idle pages */
    tally_free(b2); /* stream b: 2 idle pages behind b1 */
    EQ(stats(1).reserved_bytes[0].current, 16 * MiB);
    void *small = tally_malloc(1000, 1, stream_c); /* gc gives region a back */
    assert_non_null(small);
    tally_stats_t s0 = stats(1);
    EQ(s0.reserved_bytes[0].current, 8 * MiB + 2 * MiB);
    void *a2 = tally_malloc(4 * MiB, 1, stream_a); /* 2 new pages, under the mark of 16 MiB */
    assert_non_null(a2);
    tally_stats_t s1 = stats(1);
    EQ(s1.num_device_free - s0.num_device_free, 0); /* b's idle pages stay */
    EQ(s1.reserved_bytes[0].current, 14 * MiB);
    CHECK_OK();
    tally_free(a2);
    tally_free(small);
    tally_free(b1);
    assert_int_equal(tally_set_memory_fraction(1.0, 1), 0);
    CHECK_OK();
}

static void test_injected_map_failures_leave_state_intact(void **state)
{
    (void)state;
    for (uint64_t n = 1; n <= 6; n++) {
        tally_empty_cache(-1);
        assert_int_equal(tally_host_fail_alloc(n, n), 0);
        void *live[24] = {0};
        for (int i = 0; i < 24; i++) {
            live[i] = tally_malloc((size_t)(3 + i % 7) * MiB + 4096 * (size_t)i, 0, stream_a);
            if (i % 3 == 2) {
                tally_free(live[i - 1]);
                live[i - 1] = NULL;
            }
            CHECK_OK();
        }
        tally_host_fail_alloc(0, 0);
        for (int i = 0; i < 24; i++)
            tally_free(live[i]);
        CHECK_OK();
    }
    tally_empty_cache(-1);
    size_t free_b, total;
    assert_int_equal(tally_mem_get_info(0, &free_b, &total), 0);
    EQ(free_b, total);
}

static void discard(void *arg, const char *text, size_t len)
{
    (void)arg;
    (void)text;
    (void)len;
}

static void test_random_workload_keeps_invariants(void **state)
{
    (void)state;
    tally_set_sink(discard, NULL); /* the OOM reports of a full device */
    enum { SLOTS = 128 };
    void *live[SLOTS] = {0};
    unsigned seed = 12345;
    long ops = tu_scaled(60000, 2000);
    for (long i = 0; i < ops; i++) {
        seed = seed * 1103515245u + 12345u;
        unsigned k = (seed >> 8) % SLOTS;
        if (live[k]) {
            tally_free(live[k]);
            live[k] = NULL;
        } else {
            size_t size = (seed >> 4) % 4 == 0 ? (size_t)((seed >> 12) % 64 + 1) * MiB + (seed & 0xfff)
                                                : (size_t)((seed >> 12) % (2 * MiB)) + 1;
            live[k] = tally_malloc(size, (int)((seed >> 20) & 1), (void *)(uintptr_t)(0x100 + 0x100 * ((seed >> 21) & 1)));
        }
        if (i % 5000 == 0)
            tally_empty_cache(-1);
        if (i % 500 == 0)
            CHECK_OK();
    }
    tally_set_sink(NULL, NULL);
    for (int k = 0; k < SLOTS; k++)
        tally_free(live[k]);
    CHECK_OK();
    EQ(stats(0).allocation[0].current, 0);
    EQ(stats(1).allocation[0].current, 0);
}

static void test_options_show_the_key(void **state)
{
    (void)state;
    tu_buf_t buf = {0};
    assert_int_equal(tally_write_options(tu_buf_write, &buf), 0);
    HAS(buf.p, "expandable_segments:true");
    tu_buf_free(&buf);
}

int main(void)
{
    tu_conf("backend:host,host_devices:2,host_mode:virtual,host_capacity:256MiB,expandable_segments:true,"
            "leak_report:off");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_large_block_maps_only_its_pages, reset),
        cmocka_unit_test_setup(test_holes_are_reused_without_raising_the_peak, reset),
        cmocka_unit_test_setup(test_empty_cache_unmaps_idle_pages, reset),
        cmocka_unit_test_setup(test_streams_get_their_own_region, reset),
        cmocka_unit_test_setup(test_out_of_memory_at_capacity, reset),
        cmocka_unit_test_setup(test_memory_fraction_caps_mapped_pages, reset),
        cmocka_unit_test_setup(test_pages_below_the_mark_leave_idle_pages_alone, reset),
        cmocka_unit_test_setup(test_injected_map_failures_leave_state_intact, reset),
        cmocka_unit_test_setup(test_random_workload_keeps_invariants, reset),
        cmocka_unit_test(test_options_show_the_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
