/* The caching core's blocks against the PyTorch semantics in the behaviour
 * notes: rounding and pool choice, segment sizes, splitting and merging,
 * best fit per stream and per device, and empty_cache. (Out of memory, the
 * memory fraction and garbage collection: test_cache_limits.c; statistics
 * resets and JSON: test_api.c; options that change the rules:
 * test_core_options.c; stream events: test_cache_events.c.)
 *
 * Two simulated 80 GiB devices in virtual mode (memory is never touched).
 * Every test starts from an empty cache (setup) and frees what it takes. */
#include "testutil.h"

#define S1 STREAM(1)
#define S2 STREAM(2)
#define S3 STREAM(3)
#define S4 STREAM(4)

/* ---- rounding, pools, segment sizes --------------------------------------- */

typedef struct size_case {
    size_t request;
    size_t block;   /* rounded size = size of the block handed out */
    int pool;
    size_t segment; /* reserved by the new segment */
    int split;      /* the segment's remainder stays as a free piece */
} size_case_t;

static const size_case_t size_cases[] = {
    {1, 512, TALLY_POOL_SMALL, 2 * MiB, 1},
    {511, 512, TALLY_POOL_SMALL, 2 * MiB, 1},
    {512, 512, TALLY_POOL_SMALL, 2 * MiB, 1},
    {513, 1024, TALLY_POOL_SMALL, 2 * MiB, 1},
    {1000000, 1000448, TALLY_POOL_SMALL, 2 * MiB, 1},
    {MiB, MiB, TALLY_POOL_SMALL, 2 * MiB, 1},
    {MiB + 1, MiB + 512, TALLY_POOL_LARGE, 20 * MiB, 1},
    {10 * MiB - 512, 10 * MiB - 512, TALLY_POOL_LARGE, 20 * MiB, 1},
    {10 * MiB - 1, 10 * MiB, TALLY_POOL_LARGE, 10 * MiB, 0},
    {10 * MiB, 10 * MiB, TALLY_POOL_LARGE, 10 * MiB, 0},
    {10 * MiB + 1, 10 * MiB + 512, TALLY_POOL_LARGE, 12 * MiB, 1},
    {70 * GiB, 70 * GiB, TALLY_POOL_LARGE, 70 * GiB, 0},
};

static void test_rounding_pools_and_segment_sizes(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof size_cases / sizeof size_cases[0]; i++) {
        const size_case_t *c = &size_cases[i];
        int other = c->pool == TALLY_POOL_SMALL ? TALLY_POOL_LARGE : TALLY_POOL_SMALL;
        tu_ctx("request %zu", c->request);
        EQ(tally_empty_cache(-1), 0);
        tally_stats_t a = tu_stats(0);
        void *p = tu_malloc(c->request, 0, S1);
        assert_non_null(p);
        EQ((uintptr_t)p % 512, 0);
        tally_block_info_t info = tu_info(p);
        EQ(info.size, c->block);
        EQ(info.requested_size, c->request);
        EQ(info.device, 0);
        assert_ptr_equal(info.stream, S1);
        tally_stats_t b = tu_stats(0);
        EQ(b.allocation[c->pool].current - a.allocation[c->pool].current, 1);
        EQ(b.allocation[other].current - a.allocation[other].current, 0);
        EQ(b.allocation[TALLY_POOL_ALL].current - a.allocation[TALLY_POOL_ALL].current, 1);
        EQ(b.allocated_bytes[c->pool].current - a.allocated_bytes[c->pool].current, c->block);
        EQ(b.allocated_bytes[other].current, a.allocated_bytes[other].current);
        EQ(b.requested_bytes[c->pool].current - a.requested_bytes[c->pool].current, c->request);
        EQ(b.active_bytes[c->pool].current - a.active_bytes[c->pool].current, c->block);
        EQ(b.reserved_bytes[c->pool].current - a.reserved_bytes[c->pool].current, c->segment);
        EQ(b.reserved_bytes[other].current, a.reserved_bytes[other].current);
        EQ(b.segment[c->pool].current - a.segment[c->pool].current, 1);
        EQ(b.num_device_alloc - a.num_device_alloc, 1);
        EQ(b.inactive_split[c->pool].current, c->split);
        EQ(b.inactive_split_bytes[c->pool].current, c->split ? c->segment - c->block : 0);
        EQ(b.oversize_allocations.current, 0); /* max_split_size is unlimited */
        EQ(b.oversize_segments.current, 0);
        CHECK_OK();
        tu_free(p);
        tally_stats_t f = tu_stats(0);
        EQ(f.allocation[TALLY_POOL_ALL].current, a.allocation[TALLY_POOL_ALL].current);
        EQ(f.inactive_split[TALLY_POOL_ALL].current, 0);
        EQ(f.requested_bytes[TALLY_POOL_ALL].current, 0);
        CHECK_OK();
        EQ(tally_empty_cache(0), c->segment);
    }
    tu_ctx("%s", "");
}

/* The independent rounding helper agrees with the table (it drives the
 * model in test_cache_random). */
static void test_model_rounding_matches_table(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof size_cases / sizeof size_cases[0]; i++) {
        tu_ctx("request %zu", size_cases[i].request);
        EQ(tu_round(size_cases[i].request, NULL), size_cases[i].block);
        EQ(tu_pool(size_cases[i].block), size_cases[i].pool);
        EQ(tu_segment(size_cases[i].block), size_cases[i].segment);
    }
    tu_ctx("%s", "");
}

/* ---- split and merge ------------------------------------------------------- */

/* The small pool's split statistics take their peaks in a running high
 * that is folded into the pool's and the all entries' peaks before a read
 * and before the large pool's entries change (lib/cache/cache.h). Here the
 * small pool's highs (2 blocks, 1.5 MiB) are reached on the fast paths,
 * fall, and then the large pool's entry rises: folded at the read instead,
 * the all peaks would add the old small highs to the large value of now
 * (3 blocks, 17.5 MiB). No statistic is read in between. */
static void test_split_peaks_fold_before_the_large_pool_changes(void **state)
{
    (void)state;
    assert_int_equal(tally_reset_peak_stats(0), 0);
    void *a = tu_malloc(512 * 1024, 0, S1); /* a 2 MiB small segment: 1.5 MiB free after it */
    void *b = tu_malloc(512 * 1024, 0, S1);
    void *c = tu_malloc(512 * 1024, 0, S1);
    tu_free(b);                                 /* 2 pieces, 1 MiB */
    tu_free(a);                                 /* a and b merge: 2 pieces, 1.5 MiB */
    void *ab = tu_malloc(MiB, 0, S1);           /* takes a and b: 1 piece, 512 KiB */
    assert_ptr_equal(ab, a);
    void *big = tu_malloc(4 * MiB, 0, S1);      /* a 20 MiB large segment: 1 piece, 16 MiB */
    tally_stats_t s = tu_stats(0);
    EQ(s.inactive_split[TALLY_POOL_SMALL].current, 1);
    EQ(s.inactive_split[TALLY_POOL_SMALL].peak, 2);
    EQ(s.inactive_split_bytes[TALLY_POOL_SMALL].current, 512 * 1024);
    EQ(s.inactive_split_bytes[TALLY_POOL_SMALL].peak, 3 * MiB / 2);
    EQ(s.inactive_split[TALLY_POOL_LARGE].peak, 1);
    EQ(s.inactive_split_bytes[TALLY_POOL_LARGE].peak, 16 * MiB);
    EQ(s.inactive_split[TALLY_POOL_ALL].peak, 2);
    EQ(s.inactive_split_bytes[TALLY_POOL_ALL].peak, 16 * MiB + 512 * 1024);
    /* The large piece goes, then the small pool rises again on its own:
     * the all peaks stay where they were until the small pool passes them
     * with the large pool at 0. */
    tu_free(big);
    tu_free(ab); /* 2 pieces, 1.5 MiB */
    s = tu_stats(0);
    EQ(s.inactive_split[TALLY_POOL_ALL].peak, 2);
    EQ(s.inactive_split_bytes[TALLY_POOL_ALL].peak, 16 * MiB + 512 * 1024);
    EQ(s.inactive_split[TALLY_POOL_SMALL].current, 2);
    EQ(s.inactive_split_bytes[TALLY_POOL_SMALL].current, 3 * MiB / 2);
    tu_free(c);
    CHECK_OK();
}

/* The same when the large pool's entry falls: the large piece is there
 * while the small pool reaches its highs, and goes before anything reads
 * the statistics. The all peaks are the sums of that moment (3 blocks,
 * 17.5 MiB); folded at the read, they would be the small highs alone. */
static void test_split_peaks_fold_before_a_large_free(void **state)
{
    (void)state;
    assert_int_equal(tally_reset_peak_stats(0), 0);
    void *big = tu_malloc(4 * MiB, 0, S1); /* a 20 MiB large segment: 1 piece, 16 MiB */
    void *a = tu_malloc(512 * 1024, 0, S1);
    void *b = tu_malloc(512 * 1024, 0, S1);
    void *c = tu_malloc(512 * 1024, 0, S1);
    tu_free(b);
    tu_free(a);                       /* small: 2 pieces, 1.5 MiB */
    void *ab = tu_malloc(MiB, 0, S1); /* small: 1 piece, 512 KiB */
    tu_free(big);                     /* large: whole again, no piece */
    tally_stats_t s = tu_stats(0);
    EQ(s.inactive_split[TALLY_POOL_LARGE].current, 0);
    EQ(s.inactive_split[TALLY_POOL_ALL].peak, 3);
    EQ(s.inactive_split_bytes[TALLY_POOL_ALL].peak, 16 * MiB + 3 * MiB / 2);
    EQ(s.inactive_split[TALLY_POOL_SMALL].peak, 2);
    EQ(s.inactive_split_bytes[TALLY_POOL_SMALL].peak, 3 * MiB / 2);
    tu_free(ab);
    tu_free(c);
    CHECK_OK();
}

static void test_small_split_merge_and_segment_reuse(void **state)
{
    (void)state;
    void *a = tu_malloc(1000, 0, S1);
    void *b = tu_malloc(1000, 0, S1);
    void *c = tu_malloc(1000, 0, S1);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    /* All three come from one 2 MiB segment, one after another. */
    EQ((uintptr_t)b, (uintptr_t)a + 1024);
    EQ((uintptr_t)c, (uintptr_t)b + 1024);
    tally_stats_t s = tu_stats(0);
    EQ(s.segment[TALLY_POOL_SMALL].current, 1);
    int64_t dev_allocs = s.num_device_alloc;
    EQ(s.inactive_split[TALLY_POOL_SMALL].current, 1);
    EQ(s.inactive_split_bytes[TALLY_POOL_SMALL].current, 2 * MiB - 3 * 1024);

    tu_free(b); /* a hole between two live blocks */
    s = tu_stats(0);
    EQ(s.inactive_split[TALLY_POOL_SMALL].current, 2);
    EQ(s.inactive_split_bytes[TALLY_POOL_SMALL].current, 2 * MiB - 2 * 1024);
    EQ(s.inactive_split[TALLY_POOL_ALL].current, 2);
    EQ(s.active[TALLY_POOL_SMALL].current, 2);
    CHECK_OK();

    /* The hole is reused first (best fit, lowest address). */
    void *b2 = tu_malloc(700, 0, S1);
    assert_ptr_equal(b2, b);
    s = tu_stats(0);
    EQ(s.inactive_split[TALLY_POOL_SMALL].current, 1);
    tu_free(b2);

    tu_free(a); /* merges with the hole after it */
    s = tu_stats(0);
    EQ(s.inactive_split[TALLY_POOL_SMALL].current, 2);
    EQ(s.inactive_split_bytes[TALLY_POOL_SMALL].current, 2 * MiB - 1024);
    CHECK_OK();

    tu_free(c); /* merges both sides: the segment is whole again */
    s = tu_stats(0);
    EQ(s.inactive_split[TALLY_POOL_SMALL].current, 0);
    EQ(s.inactive_split_bytes[TALLY_POOL_SMALL].current, 0);
    EQ(s.segment[TALLY_POOL_SMALL].current, 1);
    EQ(s.reserved_bytes[TALLY_POOL_SMALL].current, 2 * MiB);
    EQ(s.active[TALLY_POOL_ALL].current, 0);
    EQ(s.largest_free_block, 2 * MiB);
    CHECK_OK();

    /* The merged segment is reused from its start, without a new one. */
    void *d = tu_malloc(MiB, 0, S1);
    assert_ptr_equal(d, a);
    s = tu_stats(0);
    EQ(s.num_device_alloc, dev_allocs);
    tu_free(d);
    CHECK_OK();
}

/* Small pool best fit: the smallest free block that is big enough (holes
 * of 3 KiB, 1.5 KiB, 2 KiB, 40 KiB, 300 KiB between live 512 B blocks). */
/* The small pool's best fit and split, on the path a request takes: the
 * fast path (lib/cache/cache.c small_fast), or, with a memory fraction set,
 * the general one. */
static void small_best_fit_picks_smallest_hole(void)
{
    static const size_t hole[5] = {3 * KiB, 1536, 2 * KiB, 40 * KiB, 300 * KiB};
    void *h[5], *g[5];
    for (int i = 0; i < 5; i++) {
        h[i] = tu_malloc(hole[i], 0, S1);
        g[i] = tu_malloc(512, 0, S1);
        EQ((uintptr_t)g[i], (uintptr_t)h[i] + hole[i]);
    }
    for (int i = 0; i < 5; i++)
        tu_free(h[i]);
    tally_stats_t s = tu_stats(0);
    EQ(s.inactive_split[TALLY_POOL_SMALL].current, 6); /* five holes and the tail */
    void *r1 = tu_malloc(1600, 0, S1); /* 2 KiB: the exact hole */
    assert_ptr_equal(r1, h[2]);
    void *r2 = tu_malloc(1000, 0, S1); /* 1 KiB: the 1.5 KiB hole, split */
    assert_ptr_equal(r2, h[1]);
    void *r3 = tu_malloc(10 * KiB, 0, S1); /* the 40 KiB hole */
    assert_ptr_equal(r3, h[3]);
    void *r4 = tu_malloc(100 * KiB, 0, S1); /* the 300 KiB hole */
    assert_ptr_equal(r4, h[4]);
    void *r5 = tu_malloc(3 * KiB, 0, S1);
    assert_ptr_equal(r5, h[0]);
    void *r6 = tu_malloc(512, 0, S1); /* the 512 B left of the 1.5 KiB hole */
    EQ((uintptr_t)r6, (uintptr_t)h[1] + 1024);
    s = tu_stats(0);
    EQ(s.segment[TALLY_POOL_SMALL].current, 1);
    EQ(s.inactive_split_bytes[TALLY_POOL_SMALL].current, (30 + 200) * KiB + s.largest_free_block); /* + the tail */
    CHECK_OK();
    void *all[] = {r1, r2, r3, r4, r5, r6, g[0], g[1], g[2], g[3], g[4]};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        tu_free(all[i]);
    EQ(tu_stats(0).inactive_split[0].current, 0);
    CHECK_OK();
}

static void test_small_best_fit_picks_smallest_hole(void **state)
{
    (void)state;
    small_best_fit_picks_smallest_hole();
}

/* A memory fraction (garbage collection may need the pool's call count)
 * sends small requests down the general path: the same blocks, the same
 * splits, the same statistics. */
static void test_small_best_fit_the_same_under_a_memory_fraction(void **state)
{
    (void)state;
    assert_int_equal(tally_set_memory_fraction(0.99, 0), 0);
    small_best_fit_picks_smallest_hole();
    assert_int_equal(tally_set_memory_fraction(1.0, 0), 0);
}

static void test_large_split_and_merge(void **state)
{
    (void)state;
    void *l1 = tu_malloc(3 * MiB, 0, S1);
    void *l2 = tu_malloc(3 * MiB, 0, S1);
    EQ((uintptr_t)l2, (uintptr_t)l1 + 3 * MiB);
    tally_stats_t s = tu_stats(0);
    EQ(s.segment[TALLY_POOL_LARGE].current, 1);
    EQ(s.reserved_bytes[TALLY_POOL_LARGE].current, 20 * MiB);
    EQ(s.inactive_split[TALLY_POOL_LARGE].current, 1);
    EQ(s.inactive_split_bytes[TALLY_POOL_LARGE].current, 14 * MiB);
    tu_free(l1);
    s = tu_stats(0);
    EQ(s.inactive_split[TALLY_POOL_LARGE].current, 2);
    EQ(s.inactive_split_bytes[TALLY_POOL_LARGE].current, 17 * MiB);
    tu_free(l2);
    s = tu_stats(0);
    EQ(s.inactive_split[TALLY_POOL_LARGE].current, 0);
    EQ(s.inactive_split_bytes[TALLY_POOL_LARGE].current, 0);
    EQ(s.largest_free_block, 20 * MiB);
    CHECK_OK();
}

/* Large pool: split only when the remainder is MORE than 1 MiB. */
static void test_large_split_needs_remainder_over_1MiB(void **state)
{
    (void)state;
    /* 19 MiB: 20 MiB segment, remainder exactly 1 MiB: not split. */
    void *p = tu_malloc(19 * MiB, 0, S1);
    tally_block_info_t i = tu_info(p);
    EQ(i.size, 20 * MiB);
    EQ(i.requested_size, 19 * MiB);
    tally_stats_t s = tu_stats(0);
    EQ(s.allocated_bytes[TALLY_POOL_LARGE].current, 20 * MiB);
    EQ(s.requested_bytes[TALLY_POOL_LARGE].current, 19 * MiB);
    EQ(s.inactive_split[TALLY_POOL_LARGE].current, 0);
    tu_free(p);
    EQ(tally_empty_cache(0), 20 * MiB);

    /* 19 MiB - 512: remainder 1 MiB + 512: split. */
    p = tu_malloc(19 * MiB - 512, 0, S1);
    i = tu_info(p);
    EQ(i.size, 19 * MiB - 512);
    s = tu_stats(0);
    EQ(s.inactive_split[TALLY_POOL_LARGE].current, 1);
    EQ(s.inactive_split_bytes[TALLY_POOL_LARGE].current, MiB + 512);
    CHECK_OK();
    tu_free(p);
    CHECK_OK();
}

/* Best fit: the smallest cached block of the stream that is big enough,
 * lowest address among equals. */
static void test_best_fit_smallest_then_lowest_address(void **state)
{
    (void)state;
    void *a = tu_malloc(30 * MiB, 0, S1);
    void *b = tu_malloc(12 * MiB, 0, S1);
    void *c = tu_malloc(20 * MiB, 0, S1);
    void *b2 = tu_malloc(12 * MiB, 0, S1);
    int64_t allocs = tu_stats(0).num_device_alloc;
    tu_free(a);
    tu_free(b);
    tu_free(c);
    tu_free(b2);
    void *low12 = (uintptr_t)b < (uintptr_t)b2 ? b : b2;

    void *x = tu_malloc(11 * MiB, 0, S1); /* 12 MiB block, remainder 1 MiB: whole */
    assert_ptr_equal(x, low12);
    EQ(tu_info(x).size, 12 * MiB);
    void *y = tu_malloc(13 * MiB, 0, S1); /* 20 MiB block, split */
    assert_ptr_equal(y, c);
    EQ(tu_info(y).size, 13 * MiB);
    tally_stats_t s = tu_stats(0);
    EQ(s.num_device_alloc, allocs);
    EQ(s.allocated_bytes[TALLY_POOL_LARGE].current, 25 * MiB);
    EQ(s.inactive_split_bytes[TALLY_POOL_LARGE].current, 7 * MiB);
    CHECK_OK();
    tu_free(x);
    tu_free(y);
    CHECK_OK();
}

/* ---- streams ---------------------------------------------------------------- */

static void test_block_freed_on_one_stream_not_reused_on_another(void **state)
{
    (void)state;
    void *p1 = tu_malloc(4096, 0, S1);
    tu_free(p1);
    tally_stats_t a = tu_stats(0);
    void *p2 = tu_malloc(4096, 0, S2);
    tally_stats_t b = tu_stats(0);
    assert_ptr_not_equal(p2, p1);
    EQ(b.num_device_alloc - a.num_device_alloc, 1);
    EQ(b.segment[TALLY_POOL_SMALL].current, 2);
    EQ((uintptr_t)tu_info(p2).stream, (uintptr_t)S2);
    void *p0 = tu_malloc(4096, 0, NULL); /* the default stream is a stream too */
    assert_ptr_not_equal(p0, p1);
    EQ(tu_stats(0).num_device_alloc - a.num_device_alloc, 2);
    void *p3 = tu_malloc(4096, 0, S1);
    assert_ptr_equal(p3, p1);
    EQ(tu_stats(0).num_device_alloc - a.num_device_alloc, 2);

    void *l1 = tu_malloc(12 * MiB, 0, S1);
    tu_free(l1);
    void *l2 = tu_malloc(12 * MiB, 0, S2);
    assert_ptr_not_equal(l2, l1);
    void *l3 = tu_malloc(12 * MiB, 0, S1);
    assert_ptr_equal(l3, l1);
    CHECK_OK();
    /* The other direction: blocks cached on S2 are not used for S1. */
    tu_free(p2);
    tu_free(l2);
    void *p4 = tu_malloc(4096, 0, S1);
    void *l4 = tu_malloc(12 * MiB, 0, S1);
    assert_ptr_not_equal(p4, p2);
    assert_ptr_not_equal(l4, l2);
    EQ((uintptr_t)tu_info(p4).stream, (uintptr_t)S1);
    EQ((uintptr_t)tu_info(l4).stream, (uintptr_t)S1);
    tu_free(p0);
    tu_free(p3);
    tu_free(p4);
    tu_free(l3);
    tu_free(l4);
    CHECK_OK();
}

/* Devices have separate caches and statistics. */
static void test_devices_are_independent(void **state)
{
    (void)state;
    tally_stats_t a0 = tu_stats(0);
    void *p = tu_malloc(5 * MiB, 1, S1);
    EQ(tu_info(p).device, 1);
    tally_stats_t b0 = tu_stats(0), b1 = tu_stats(1);
    EQ(b0.num_device_alloc, a0.num_device_alloc);
    EQ(b0.reserved_bytes[0].current, 0);
    EQ(b1.reserved_bytes[TALLY_POOL_LARGE].current, 20 * MiB);
    tu_free(p);
    void *q = tu_malloc(5 * MiB, 0, S1); /* the cached block of device 1 is not used */
    assert_ptr_not_equal(q, p);
    EQ(tu_stats(0).num_device_alloc - a0.num_device_alloc, 1);
    tu_free(q);
    CHECK_OK();
}

/* ---- empty_cache -------------------------------------------------------------- */

static void test_empty_cache_releases_whole_segments_only(void **state)
{
    (void)state;
    void *a = tu_malloc(1000, 0, S1);
    void *b = tu_malloc(1000, 0, S1);
    tu_free(b);                           /* small segment: split, stays */
    tu_free(tu_malloc(5 * MiB, 0, S1)); /* whole 20 MiB segment */
    tu_free(tu_malloc(30 * MiB, 0, S2)); /* whole 30 MiB segment */
    tally_stats_t s0 = tu_stats(0);
    EQ(s0.reserved_bytes[0].current, 52 * MiB);
    size_t released = tally_empty_cache(0);
    tally_stats_t s1 = tu_stats(0);
    EQ(released, 50 * MiB);
    EQ(s0.reserved_bytes[0].current - s1.reserved_bytes[0].current, (int64_t)released);
    EQ(s1.segment[0].current, 1);
    EQ(s1.reserved_bytes[TALLY_POOL_SMALL].current, 2 * MiB);
    EQ(s1.num_device_free - s0.num_device_free, 2);
    EQ(s1.num_sync_all_streams - s0.num_sync_all_streams, 1);
    CHECK_OK();
    /* Nothing left to release; the sync is counted anyway. */
    EQ(tally_empty_cache(0), 0);
    EQ(tu_stats(0).num_sync_all_streams - s0.num_sync_all_streams, 2);
    /* -1: every device, one sync each. */
    int64_t sync1 = tu_stats(1).num_sync_all_streams;
    EQ(tally_empty_cache(-1), 0);
    EQ(tu_stats(1).num_sync_all_streams - sync1, 1);
    tu_free(a);
    EQ(tally_empty_cache(-1), 2 * MiB);
    CHECK_OK();
}

/* A free block at the head of a segment whose next block is live is not a
 * whole segment: empty_cache keeps it (small and large pool). */
static void test_empty_cache_keeps_segment_with_free_head(void **state)
{
    (void)state;
    void *a = tu_malloc(1000, 0, S1);
    void *b = tu_malloc(1000, 0, S1);
    void *p = tu_malloc(5 * MiB, 0, S1);
    void *q = tu_malloc(5 * MiB, 0, S1);
    EQ((uintptr_t)b - (uintptr_t)a, 1024);
    EQ((uintptr_t)q - (uintptr_t)p, 5 * MiB);
    tu_free(a);
    tu_free(p);
    tally_stats_t s0 = tu_stats(0);
    EQ(s0.reserved_bytes[0].current, 22 * MiB);
    EQ(tally_empty_cache(0), 0);
    tally_stats_t s1 = tu_stats(0);
    EQ(s1.reserved_bytes[0].current, 22 * MiB);
    EQ(s1.num_device_free, s0.num_device_free);
    CHECK_OK();
    /* Both heads are reused in place. */
    void *a2 = tu_malloc(1000, 0, S1);
    void *p2 = tu_malloc(5 * MiB, 0, S1);
    assert_ptr_equal(a2, a);
    assert_ptr_equal(p2, p);
    void *all[] = {a2, p2, b, q};
    free_then_empty(all, 4, 22 * MiB);
}

/* Segment sizes either side of 10 MiB, seen through reuse: a request under
 * 10 MiB takes a 20 MiB segment that serves a second one; a request of
 * 10 MiB takes a segment of its own size, so a second needs a new one. */
static void test_segment_size_boundary_at_10MiB(void **state)
{
    (void)state;
    tally_stats_t s0 = tu_stats(0);
    void *a = tu_malloc(10 * MiB - 512, 0, S1);
    void *b = tu_malloc(10 * MiB - 512, 0, S1);
    tally_stats_t s1 = tu_stats(0);
    EQ(s1.num_device_alloc - s0.num_device_alloc, 1);
    EQ(s1.reserved_bytes[0].current - s0.reserved_bytes[0].current, 20 * MiB);
    EQ((uintptr_t)b - (uintptr_t)a, 10 * MiB - 512);
    void *c = tu_malloc(10 * MiB, 0, S2);
    void *d = tu_malloc(10 * MiB, 0, S2);
    tally_stats_t s2 = tu_stats(0);
    EQ(s2.num_device_alloc - s1.num_device_alloc, 2);
    EQ(s2.reserved_bytes[0].current - s1.reserved_bytes[0].current, 20 * MiB);
    EQ(tu_info(b).size, 10 * MiB + 512); /* the 1 KiB tail is too small to split off */
    void *all[] = {a, b, c, d};
    free_then_empty(all, 4, 40 * MiB);
}

/* Among free small blocks of one size the lowest address is taken, however
 * the bin's tree is shaped: 16 holes of 1 KiB are refilled in address order;
 * on the fast path, and under a memory fraction on the general one. */
static void small_best_fit_lowest_address_in_a_bin(void)
{
    void *p[32];
    for (int i = 0; i < 32; i++)
        p[i] = tu_malloc(1000, 0, S3);
    for (int i = 0; i < 32; i += 2)
        tu_free(p[i]);
    for (int i = 0; i < 32; i += 2) {
        tu_ctx("hole %d", i);
        void *q = tu_malloc(1000, 0, S3);
        assert_ptr_equal(q, p[i]);
        p[i] = q;
    }
    tu_ctx("%s", "");
    free_then_empty(p, 32, 2 * MiB);
}

static void test_small_best_fit_lowest_address_in_a_bin(void **state)
{
    (void)state;
    small_best_fit_lowest_address_in_a_bin();
}

static void test_small_best_fit_lowest_address_in_a_bin_under_a_memory_fraction(void **state)
{
    (void)state;
    assert_int_equal(tally_set_memory_fraction(0.99, 0), 0);
    small_best_fit_lowest_address_in_a_bin();
    assert_int_equal(tally_set_memory_fraction(1.0, 0), 0);
}

int main(void)
{
    tu_conf("backend:host,host_devices:2,host_capacity:80GiB,host_mode:virtual");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_rounding_matches_table),
        cmocka_unit_test_setup(test_rounding_pools_and_segment_sizes, tu_setup_clean),
        cmocka_unit_test_setup(test_small_split_merge_and_segment_reuse, tu_setup_clean),
        cmocka_unit_test_setup(test_small_best_fit_picks_smallest_hole, tu_setup_clean),
        cmocka_unit_test_setup(test_small_best_fit_the_same_under_a_memory_fraction, tu_setup_clean),
        cmocka_unit_test_setup(test_large_split_and_merge, tu_setup_clean),
        cmocka_unit_test_setup(test_large_split_needs_remainder_over_1MiB, tu_setup_clean),
        cmocka_unit_test_setup(test_best_fit_smallest_then_lowest_address, tu_setup_clean),
        cmocka_unit_test_setup(test_block_freed_on_one_stream_not_reused_on_another, tu_setup_clean),
        cmocka_unit_test_setup(test_devices_are_independent, tu_setup_clean),
        cmocka_unit_test_setup(test_empty_cache_releases_whole_segments_only, tu_setup_clean),
        cmocka_unit_test_setup(test_empty_cache_keeps_segment_with_free_head, tu_setup_clean),
        cmocka_unit_test_setup(test_segment_size_boundary_at_10MiB, tu_setup_clean),
        cmocka_unit_test_setup(test_split_peaks_fold_before_the_large_pool_changes, tu_setup_clean),
        cmocka_unit_test_setup(test_split_peaks_fold_before_a_large_free, tu_setup_clean),
        cmocka_unit_test_setup(test_small_best_fit_lowest_address_in_a_bin, tu_setup_clean),
        cmocka_unit_test_setup(test_small_best_fit_lowest_address_in_a_bin_under_a_memory_fraction, tu_setup_clean),
    };
    return cmocka_run_group_tests_name("cache_blocks", tests, NULL, NULL);
}
