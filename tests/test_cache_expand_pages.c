/* Expandable segments (expandable_segments:true) on the host backend: where
 * a block's pages are mapped and how idle pages move. The large pool of a
 * stream is one address range with 2 MiB pages mapped where blocks live;
 * best fit prefers a hole whose pages are mapped; idle pages move to where
 * they are needed instead of raising the peak (the longest run first; below
 * the high-water mark none move), for a new small-pool segment too, and room
 * under the mark or a growth chunk is mapped ahead; empty_cache unmaps idle pages (none while a capture is
 * announced); out of memory at capacity and under a memory fraction; every
 * invariant holds throughout. (Physical handles, the backend's call counts,
 * lent small segments and the random workloads: test_cache_expand_handles.c.) */
#include "expandutil.h"

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

/* When the best fit would need new pages, a slightly larger free block whose
 * pages are all mapped is taken instead (no map call). A 4 MiB, B 2 MiB, C
 * 3 MiB, D 2 MiB; C freed and empty_cache unmaps its one whole page; A freed
 * (its pages stay mapped): a 3 MiB request fits C's hole best but would map
 * a page, so it takes A's. */
static void test_mapped_larger_block_preferred_to_a_best_fit_needing_pages(void **state)
{
    (void)state;
    void *s = (void *)0x800;
    void *a = tally_malloc(4 * MiB, 0, s), *b = tally_malloc(2 * MiB, 0, s);
    void *c = tally_malloc(3 * MiB, 0, s), *d = tally_malloc(2 * MiB, 0, s);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    assert_non_null(d);
    EQ((uintptr_t)c, (uintptr_t)a + 6 * MiB);
    tally_free(c);
    tally_empty_cache(0);
    tally_free(a);
    tally_stats_t before = stats(0);
    void *q = tally_malloc(3 * MiB, 0, s);
    assert_ptr_equal(q, a);
    EQ(stats(0).num_device_alloc, before.num_device_alloc); /* no map call */
    EQ(stats(0).reserved_bytes[0].current, before.reserved_bytes[0].current);
    CHECK_OK();
    tally_free(q);
    tally_free(b);
    tally_free(d);
    tally_empty_cache(0);
}

/* How far the preference for mapped pages looks: the next four free blocks
 * after the best fit in (size, address) order (docs/architecture.md).
 * Holes of 2, 4, 6 ... MiB (whole pages, an allocated block after each),
 * all but the largest unmapped by empty_cache; a 2 MiB request. With holes
 * up to 10 MiB the mapped one is fourth after the best fit and is taken, no
 * page mapped; with one more hole it is fifth, and the request maps a page
 * of the best fit. Returns the hole taken (0: the best fit; -1: another)
 * and the map calls made for it. */
static int lookahead_case(void *stream, int nholes, int64_t *maps)
{
    void *hole[8], *sep[8];
    for (int i = 0; i < nholes; i++) {
        hole[i] = tally_malloc((size_t)(i + 1) * 2 * MiB, 0, stream);
        sep[i] = tally_malloc(2 * MiB, 0, stream);
        assert_non_null(hole[i]);
        assert_non_null(sep[i]);
    }
    for (int i = 0; i < nholes - 1; i++)
        tally_free(hole[i]);
    tally_empty_cache(0);
    tally_free(hole[nholes - 1]); /* its pages stay mapped */
    tally_stats_t before = stats(0);
    void *q = tally_malloc(2 * MiB, 0, stream);
    assert_non_null(q);
    *maps = stats(0).num_device_alloc - before.num_device_alloc;
    int took = -1;
    for (int i = 0; i < nholes; i++)
        if (q == hole[i])
            took = i;
    CHECK_OK();
    tally_free(q);
    for (int i = 0; i < nholes; i++)
        tally_free(sep[i]);
    tally_empty_cache(0);
    return took;
}

static void test_mapped_block_preferred_up_to_four_past_the_best_fit(void **state)
{
    (void)state;
    int64_t maps;
    EQ(lookahead_case((void *)0x880, 5, &maps), 4); /* the 10 MiB hole, fourth after the best fit */
    EQ(maps, 0);
    EQ(lookahead_case((void *)0x890, 6, &maps), 0); /* the 12 MiB hole is fifth: the best fit */
    EQ(maps, 1);
}

/* Among holes whose pages are all mapped, the best fit is the smallest that
 * fits: A 4 MiB, B 2 MiB, C 6 MiB, D 2 MiB, A and C freed (their pages stay
 * mapped): a 3 MiB request takes A's hole, not C's. */
static void test_best_fit_among_mapped_holes_is_the_smallest(void **state)
{
    (void)state;
    void *s = (void *)0x900;
    void *a = tally_malloc(4 * MiB, 0, s), *b = tally_malloc(2 * MiB, 0, s);
    void *c = tally_malloc(6 * MiB, 0, s), *d = tally_malloc(2 * MiB, 0, s);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    assert_non_null(d);
    tally_free(a);
    tally_free(c);
    void *q = tally_malloc(3 * MiB, 0, s);
    assert_ptr_equal(q, a);
    void *r = tally_malloc(5 * MiB, 0, s); /* C's hole is next */
    assert_ptr_equal(r, c);
    CHECK_OK();
    tally_free(q);
    tally_free(r);
    tally_free(b);
    tally_free(d);
    tally_empty_cache(0);
}

static char held_text[1024];
static void held_sink(void *arg, const char *text, size_t len)
{
    (void)arg;
    size_t have = strlen(held_text);
    if (have + len < sizeof held_text) {
        memcpy(held_text + have, text, len);
        held_text[have + len] = 0;
    }
}

/* empty_cache while a capture is announced unmaps nothing (an unmap would
 * synchronise the capturing stream), returns 0 and says nothing; the next
 * empty_cache after the capture gives the idle pages back. */
static void test_empty_cache_during_a_capture_keeps_idle_pages_mapped(void **state)
{
    (void)state;
    void *s = (void *)0xa00, *p[3];
    for (int i = 0; i < 3; i++)
        assert_non_null(p[i] = tally_malloc(2 * MiB, 0, s));
    for (int i = 0; i < 3; i++)
        tally_free(p[i]);
    int64_t mapped = stats(0).reserved_bytes[0].current;
    assert_true(mapped >= (int64_t)(6 * MiB));
    held_text[0] = 0;
    tally_set_sink(held_sink, NULL);
    assert_int_equal(tally_graph_pool_begin(0, 0, 77, NULL, NULL), 0);
    EQ(tally_empty_cache(0), 0);
    EQ(stats(0).reserved_bytes[0].current, mapped);
    assert_int_equal(tally_graph_pool_end(0, 0, 77), 0);
    tally_set_sink(NULL, NULL);
    assert_string_equal(held_text, "");
    assert_int_equal(tally_graph_pool_release(0, 0, 77), 0);
    EQ(tally_empty_cache(0), (size_t)mapped);
    EQ(stats(0).reserved_bytes[0].current, 0);
    CHECK_OK();
}

/* A stream's range is 1 1/8 of the device (as PyTorch's): a block placed
 * past a hole whose pages moved away still finds addresses. In the 256 MiB
 * device, 120 MiB then 4 MiB, the 120 MiB freed, then 150 MiB: it does not
 * fit the hole, so it goes at 124 MiB and ends at 274 MiB, past the device's
 * size but inside the range; its pages (154 MiB with the 4 MiB) fit. */
static void test_block_past_a_moved_hole_finds_addresses_in_the_range(void **state)
{
    (void)state;
    void *s = (void *)0x700;
    void *a = tally_malloc(120 * MiB, 0, s), *b = tally_malloc(4 * MiB, 0, s);
    assert_non_null(a);
    assert_non_null(b);
    EQ((uintptr_t)b, (uintptr_t)a + 120 * MiB);
    tally_free(a);
    void *c = tally_malloc(150 * MiB, 0, s);
    assert_non_null(c);
    EQ((uintptr_t)c, (uintptr_t)b + 4 * MiB);
    assert_true(stats(0).reserved_bytes[0].current <= (int64_t)(256 * MiB));
    CHECK_OK();
    tally_free(b);
    tally_free(c);
    tally_empty_cache(0);
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
    /* Its 2 pages, and mapped ahead in the same call the 2 free pages after
     * it that fit under the mark: 10 + 4 + 2 MiB, the mark itself. */
    EQ(s1.reserved_bytes[0].current, 16 * MiB);
    CHECK_OK();
    tally_free(a2);
    tally_free(small);
    tally_free(b1);
    assert_int_equal(tally_set_memory_fraction(1.0, 1), 0);
    assert_int_equal(tally_configure("garbage_collection_threshold:0"), 0);
    CHECK_OK();
}

static void test_idle_pages_below_the_mark_cost_no_call(void **state)
{
    (void)state;
    /* Hysteresis: a freed block's pages stay mapped while reserved memory
     * is under its high-water mark, so using the hole again costs nothing. */
    void *a = tally_malloc(10 * MiB, 0, stream_a);
    void *b = tally_malloc(10 * MiB, 0, stream_a);
    tally_free(a);
    tally_stats_t before = stats(0);
    void *c = tally_malloc(10 * MiB, 0, stream_a);
    assert_non_null(c);
    tally_stats_t s = stats(0);
    EQ(s.num_device_alloc, before.num_device_alloc);
    EQ(s.num_device_free, before.num_device_free);
    CHECK_OK();
    tally_free(b);
    tally_free(c);
}

/* Blocks of 2, 16 and 4 MiB between live 2 MiB guards g[0..3], the three
 * freed: idle runs of 1, 8 and 2 pages on stream_a. */
static void idle_runs_between_guards(void *g[4])
{
    void *x[3];
    size_t sizes[3] = {2 * MiB, 16 * MiB, 4 * MiB};
    g[0] = tally_malloc(2 * MiB, 0, stream_a);
    for (int i = 0; i < 3; i++) {
        x[i] = tally_malloc(sizes[i], 0, stream_a);
        g[i + 1] = tally_malloc(2 * MiB, 0, stream_a);
        assert_non_null(x[i]);
        assert_non_null(g[i + 1]);
    }
    for (int i = 0; i < 3; i++)
        tally_free(x[i]);
}

static void test_every_idle_run_goes_when_all_are_needed(void **state)
{
    (void)state;
    /* Blocks of 2, 16 and 4 MiB between live 2 MiB guards; free the three:
     * idle runs of 1, 8 and 2 pages. A block that needs 12 new pages at the
     * mark takes all three runs back (one unmap call each) and raises the
     * peak by the one page still missing. */
    void *g[4];
    idle_runs_between_guards(g);
    tally_stats_t before = stats(0);
    void *big = tally_malloc(24 * MiB, 0, stream_a); /* fits no hole: 12 new pages, 11 idle */
    assert_non_null(big);
    tally_stats_t s = stats(0);
    EQ(s.reserved_bytes[TALLY_POOL_ALL].peak, before.reserved_bytes[TALLY_POOL_ALL].peak + 1 * PAGE);
    EQ(s.num_device_free - before.num_device_free, 3);
    EQ(s.num_device_alloc - before.num_device_alloc, 1);
    tally_free(big);
    CHECK_OK();
    for (int i = 0; i < 4; i++)
        tally_free(g[i]);
    CHECK_OK();
}

/* A budget lowered to 0 at run time stops moves at once, though the step's
 * budget was given while it was 10 ms: after 1,001 allocations under
 * expandable_move_budget:10000 (the budget comes back every 1,000), the
 * budget is set to 0, and a block that needs new pages beside idle runs
 * maps them and unmaps nothing. */
static void test_budget_set_to_zero_at_run_time_moves_nothing(void **state)
{
    (void)state;
    assert_int_equal(tally_configure("expandable_move_budget:10000"), 0);
    for (int i = 0; i < 1001; i++)
        tally_free(tally_malloc(4 * MiB, 0, stream_a));
    void *g[4];
    idle_runs_between_guards(g);
    assert_int_equal(tally_configure("expandable_move_budget:0"), 0);
    tally_stats_t before = stats(0);
    void *big = tally_malloc(24 * MiB, 0, stream_a); /* fits no hole: 12 new pages, 11 idle */
    assert_non_null(big);
    tally_stats_t s = stats(0);
    EQ(s.num_device_free, before.num_device_free); /* no idle run unmapped */
    EQ(s.num_device_alloc - before.num_device_alloc, 1);
    tally_free(big);
    for (int i = 0; i < 4; i++)
        tally_free(g[i]);
    CHECK_OK();
    assert_int_equal(tally_configure("expandable_move_budget:-1"), 0);
}

static void test_steal_takes_the_longest_run_first(void **state)
{
    (void)state;
    /* Three single idle pages, then a 10-page idle run, between live guards. */
    void *g[5], *one[3];
    g[0] = tally_malloc(2 * MiB, 0, stream_a);
    for (int i = 0; i < 3; i++) {
        one[i] = tally_malloc(2 * MiB, 0, stream_a);
        g[i + 1] = tally_malloc(2 * MiB, 0, stream_a);
    }
    void *run = tally_malloc(20 * MiB, 0, stream_a);
    g[4] = tally_malloc(2 * MiB, 0, stream_a);
    assert_non_null(run);
    assert_non_null(g[4]);
    for (int i = 0; i < 3; i++)
        tally_free(one[i]);
    tally_free(run);
    tally_stats_t before = stats(0);
    /* 22 MiB fits no hole: it goes past the end and needs 11 new pages,
     * with 13 idle and no room under the mark. Longest first: the 10-page
     * run and one single page, two unmap calls (in address order it would
     * be the three singles and part of the run: four). */
    void *n = tally_malloc(22 * MiB, 0, stream_a);
    assert_non_null(n);
    tally_stats_t s = stats(0);
    EQ(s.reserved_bytes[TALLY_POOL_ALL].peak, before.reserved_bytes[TALLY_POOL_ALL].peak);
    EQ(s.num_device_free - before.num_device_free, 2);
    EQ(s.num_device_alloc - before.num_device_alloc, 1);
    CHECK_OK();
    tally_free(n);
    for (int i = 0; i < 5; i++)
        tally_free(g[i]);
    CHECK_OK();
}

static void test_idle_pages_right_below_the_block_are_taken(void **state)
{
    (void)state;
    /* A guard on page 0, q over pages 1 and 2 and a quarter of page 3,
     * then p (1.5 MiB) inside page 3. With q freed, pages 1 and 2 are idle
     * and page 3 is held by p. A 10 MiB block fits no hole: it starts
     * right after p, in page 3, and needs pages 4 to 8 at the mark. The
     * idle run just below its first page is not one of its pages: both of
     * its pages go back (one unmap call), so reserved grows by 3 pages, not
     * 4. */
    void *g = tally_malloc(2 * MiB, 0, stream_a);
    void *q = tally_malloc(4 * MiB + MiB / 4, 0, stream_a);
    void *p = tally_malloc(MiB + MiB / 2, 0, stream_a);
    assert_non_null(g);
    assert_non_null(q);
    assert_non_null(p);
    EQ((uintptr_t)q - (uintptr_t)g, 2 * MiB);
    EQ((uintptr_t)p - (uintptr_t)q, 4 * MiB + MiB / 4);
    tally_free(q);
    tally_stats_t before = stats(0);
    EQ(before.reserved_bytes[TALLY_POOL_ALL].current, 4 * PAGE);
    void *b = tally_malloc(10 * MiB, 0, stream_a);
    assert_non_null(b);
    EQ((uintptr_t)b - (uintptr_t)p, MiB + MiB / 2);
    tally_stats_t s = stats(0);
    EQ(s.num_device_free - before.num_device_free, 1);
    EQ(s.reserved_bytes[TALLY_POOL_ALL].current, 7 * PAGE);
    EQ(s.reserved_bytes[TALLY_POOL_ALL].peak, 7 * PAGE);
    CHECK_OK();
    tally_free(b);
    tally_free(p);
    tally_free(g);
    CHECK_OK();
}

static void test_room_under_the_mark_is_mapped_ahead_and_used(void **state)
{
    (void)state;
    /* Holes of 10 and 2 pages between guards. A 22 MiB block fits neither:
     * it needs 11 pages, takes back both runs (the second has one page too
     * many), and maps its 11 pages plus that page of room past its end in
     * one call: reserved memory ends where it was. */
    void *a = tally_malloc(20 * MiB, 0, stream_a);
    void *g1 = tally_malloc(2 * MiB, 0, stream_a);
    void *c = tally_malloc(4 * MiB, 0, stream_a);
    void *g2 = tally_malloc(2 * MiB, 0, stream_a);
    assert_non_null(g2);
    tally_free(a);
    tally_free(c);
    tally_stats_t before = stats(0);
    void *x = tally_malloc(22 * MiB, 0, stream_a);
    assert_non_null(x);
    tally_stats_t s = stats(0);
    EQ(s.num_device_free - before.num_device_free, 2);
    EQ(s.num_device_alloc - before.num_device_alloc, 1);
    EQ(s.reserved_bytes[TALLY_POOL_ALL].current, before.reserved_bytes[TALLY_POOL_ALL].current);
    EQ(s.reserved_bytes[TALLY_POOL_ALL].peak, before.reserved_bytes[TALLY_POOL_ALL].peak);
    /* A 2 MiB block: the best fit is the unmapped 4 MiB hole, which needs
     * a map call; the free space after x starts on the page mapped ahead,
     * so the block goes there and costs nothing. */
    void *y = tally_malloc(2 * MiB, 0, stream_a);
    assert_non_null(y);
    EQ(stats(0).num_device_alloc, s.num_device_alloc);
    EQ((uintptr_t)y, (uintptr_t)x + 22 * MiB);
    CHECK_OK();
    tally_free(x);
    tally_free(y);
    tally_free(g1);
    tally_free(g2);
}

static void test_free_small_segments_move_to_large_blocks(void **state)
{
    (void)state;
    /* Small-pool segments whose blocks are all free hold memory no large
     * block can use; at the mark they are released before the peak rises.
     * Segments of 2 MiB here (a run of pages goes only whole: its own test
     * is test_cache_small_run.c). */
    assert_int_equal(tally_configure("expandable_small_pages:false"), 0);
    void *big = tally_malloc(20 * MiB, 0, stream_a);
    void *smalls[16];
    for (int i = 0; i < 16; i++) {
        smalls[i] = tally_malloc(MiB, 0, stream_a); /* two to a 2 MiB small-pool segment */
        assert_non_null(smalls[i]);
    }
    for (int i = 0; i < 16; i++)
        tally_free(smalls[i]);
    tally_stats_t before = stats(0);
    EQ(before.segment[TALLY_POOL_SMALL].current, 8);
    void *more = tally_malloc(8 * MiB, 0, stream_a); /* 4 new pages, no idle large page */
    assert_non_null(more);
    tally_stats_t s = stats(0);
    EQ(s.segment[TALLY_POOL_SMALL].current, 4);
    EQ(s.reserved_bytes[TALLY_POOL_ALL].peak, before.reserved_bytes[TALLY_POOL_ALL].peak);
    EQ(s.reserved_bytes[TALLY_POOL_ALL].current, before.reserved_bytes[TALLY_POOL_ALL].current);
    CHECK_OK();
    tally_free(big);
    tally_free(more);
}

static void test_idle_large_pages_move_to_a_new_small_segment(void **state)
{
    (void)state;
    /* The other way: with moves unlimited, a new small-pool segment (2 MiB)
     * that would raise reserved memory past the mark takes an idle large
     * page's memory first, as a large block would; with no move budget, or
     * a finite one (where a step would move the same memory both ways), it
     * adds to the peak. */
    static const int budgets[] = {-1, 0, 1000000};
    for (size_t k = 0; k < sizeof budgets / sizeof budgets[0]; k++) {
        int budget = budgets[k];
        char conf[64];
        snprintf(conf, sizeof conf, "expandable_move_budget:%d,expandable_small_pages:false", budget);
        assert_int_equal(tally_configure(conf), 0);
        tally_empty_cache(0);
        tally_reset_peak_stats(0);
        void *big = tally_malloc(16 * MiB, 0, stream_a);
        assert_non_null(big);
        tally_free(big); /* 8 idle pages, the mark at 16 MiB */
        tally_stats_t before = stats(0);
        EQ(before.reserved_bytes[TALLY_POOL_ALL].current, 16 * MiB);
        void *small = tally_malloc(1000, 0, stream_a);
        assert_non_null(small);
        tally_stats_t s = stats(0);
        EQ(s.segment[TALLY_POOL_SMALL].current, 1);
        EQ(s.reserved_bytes[TALLY_POOL_SMALL].current, PAGE);
        if (budget < 0) {
            /* The idle pages are the region's last: only the one page
             * needed goes (its last handle, one unmap call); the large
             * pool would map the rest again when it grows. */
            EQ(s.reserved_bytes[TALLY_POOL_LARGE].current, 14 * MiB);
            EQ(s.reserved_bytes[TALLY_POOL_ALL].peak, 16 * MiB);
            EQ(s.num_device_free - before.num_device_free, 1);
        } else {
            EQ(s.reserved_bytes[TALLY_POOL_LARGE].current, 16 * MiB);
            EQ(s.reserved_bytes[TALLY_POOL_ALL].peak, 16 * MiB + PAGE);
            EQ(s.num_device_free - before.num_device_free, 0);
        }
        CHECK_OK();
        tally_free(small);
    }
}

static void test_a_new_small_segment_takes_an_inner_idle_run_before_the_region_end(void **state)
{
    (void)state;
    /* With moves unlimited, a new small-pool segment takes idle large pages
     * inside the region before the region's last ones (the pages a growing
     * large pool maps again): a 16 MiB hole, a live 4 MiB block, then a
     * 24 MiB idle end. The longest run is the end; the hole goes instead,
     * whole, in one unmap call. */
    assert_int_equal(tally_configure("expandable_move_budget:-1,expandable_small_pages:false"), 0);
    void *a = tally_malloc(16 * MiB, 0, stream_a);
    void *b = tally_malloc(4 * MiB, 0, stream_a);
    void *c = tally_malloc(24 * MiB, 0, stream_a);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    tally_free(a);
    tally_free(c);
    tally_stats_t before = stats(0);
    EQ(before.reserved_bytes[TALLY_POOL_LARGE].current, 44 * MiB);
    void *small = tally_malloc(1000, 0, stream_a);
    assert_non_null(small);
    tally_stats_t s = stats(0);
    EQ(s.reserved_bytes[TALLY_POOL_LARGE].current, 28 * MiB);
    EQ(s.reserved_bytes[TALLY_POOL_SMALL].current, PAGE);
    EQ(s.reserved_bytes[TALLY_POOL_ALL].peak, 44 * MiB);
    EQ(s.num_device_free - before.num_device_free, 1);
    /* The end's pages are still mapped: a 24 MiB block takes them with no
     * map call. */
    void *again = tally_malloc(24 * MiB, 0, stream_a);
    assert_ptr_equal(again, c);
    EQ(stats(0).num_device_alloc, s.num_device_alloc);
    CHECK_OK();
    tally_free(small);
    tally_free(b);
    tally_free(again);
}

static void test_small_blocks_growing_the_range_map_to_the_chunk(void **state)
{
    (void)state;
    assert_int_equal(tally_configure("expandable_grow_chunk_mb:20"), 0);
    void *base = tally_malloc(32 * MiB, 0, stream_a); /* >= 10 MiB: its own 16 pages */
    assert_non_null(base);
    EQ(stats(0).reserved_bytes[TALLY_POOL_ALL].current, 16 * PAGE);
    tally_stats_t before = stats(0);
    /* 3 MiB on pages 16-17: the call maps up to the 20 MiB boundary (page 20). */
    void *a = tally_malloc(3 * MiB, 0, stream_a);
    assert_non_null(a);
    tally_stats_t s = stats(0);
    EQ(s.num_device_alloc - before.num_device_alloc, 1);
    EQ(s.reserved_bytes[TALLY_POOL_ALL].current, 20 * PAGE);
    /* 4 MiB on pages 17-19: mapped already, no call. */
    void *b = tally_malloc(4 * MiB, 0, stream_a);
    assert_non_null(b);
    EQ(stats(0).num_device_alloc, s.num_device_alloc);
    /* 3 MiB on pages 19-20: page 20 is new; one call maps up to page 30. */
    void *c = tally_malloc(3 * MiB, 0, stream_a);
    assert_non_null(c);
    EQ(stats(0).num_device_alloc, s.num_device_alloc + 1);
    EQ(stats(0).reserved_bytes[TALLY_POOL_ALL].current, 30 * PAGE);
    CHECK_OK();
    /* A block of 10 MiB or more maps only its own pages. */
    tally_free(base);
    void *big = tally_malloc(40 * MiB, 0, stream_a); /* fits no hole: pages 21-40 */
    assert_non_null(big);
    tally_stats_t t = stats(0);
    /* Pages 21-29 were mapped ahead; 30-40 are new, and no more: base's 16
     * idle pages went back as one run to pay for them. */
    EQ(t.reserved_bytes[TALLY_POOL_ALL].current, 30 * PAGE - 16 * PAGE + 11 * PAGE);
    EQ(t.num_device_alloc, s.num_device_alloc + 2);
    CHECK_OK();
    /* Chunk of 2 MiB: a small block maps exactly its own new pages. */
    assert_int_equal(tally_configure("expandable_grow_chunk_mb:2"), 0);
    void *d = tally_malloc(3 * MiB, 0, stream_a);
    assert_non_null(d);
    EQ(stats(0).reserved_bytes[TALLY_POOL_ALL].current - t.reserved_bytes[TALLY_POOL_ALL].current, 2 * PAGE);
    CHECK_OK();
    tally_free(a);
    tally_free(b);
    tally_free(c);
    tally_free(big);
    tally_free(d);
}

static void test_empty_cache_gives_back_pages_mapped_ahead(void **state)
{
    (void)state;
    /* A 3 MiB block growing the range maps its 20 MiB chunk; empty_cache
     * unmaps the idle part (one call for the run) and keeps the block's two
     * pages; the high-water mark falls with it, so the next growth counts
     * from there. */
    assert_int_equal(tally_configure("expandable_grow_chunk_mb:20"), 0);
    void *a = tally_malloc(3 * MiB, 0, stream_a);
    assert_non_null(a);
    EQ(stats(0).reserved_bytes[TALLY_POOL_ALL].current, 10 * PAGE);
    tally_stats_t before = stats(0);
    size_t released = tally_empty_cache(0);
    tally_stats_t s = stats(0);
    EQ(released, 8 * PAGE);
    EQ(s.reserved_bytes[TALLY_POOL_ALL].current, 2 * PAGE);
    EQ(s.num_device_free - before.num_device_free, 1);
    CHECK_OK();
    assert_int_equal(tally_configure("expandable_grow_chunk_mb:2"), 0);
    tally_free(a);
    tally_empty_cache(0);
    EQ(stats(0).reserved_bytes[TALLY_POOL_ALL].current, 0);
    CHECK_OK();
}

static void test_chunk_past_capacity_does_not_fail_a_block_that_fits(void **state)
{
    (void)state;
    /* Device 1 has 256 MiB. After 200 MiB on another stream and 50 MiB on
     * this one, a 3 MiB block fits (254 MiB) but its 20 MiB chunk does
     * not: the retry after the failed map maps the block's own pages only,
     * so it is served, and the device can still be filled to the last page. */
    assert_int_equal(tally_configure("expandable_grow_chunk_mb:20"), 0);
    int64_t ooms = stats(1).num_ooms;
    void *other = tally_malloc(200 * MiB, 1, (void *)0x900);
    void *big = tally_malloc(50 * MiB, 1, stream_a);
    assert_non_null(other);
    assert_non_null(big);
    void *small = tally_malloc(3 * MiB, 1, stream_a);
    assert_non_null(small);
    EQ(stats(1).reserved_bytes[TALLY_POOL_ALL].current, 254 * MiB);
    EQ(stats(1).num_ooms, ooms);
    void *last = tally_malloc(MiB + 4096, 1, stream_a); /* large pool: the last page */
    assert_non_null(last);
    tally_set_sink(discard, NULL); /* the OOM report */
    void *none = tally_malloc(4 * MiB, 1, stream_a);
    tally_set_sink(NULL, NULL);
    assert_null(none);
    CHECK_OK();
    assert_int_equal(tally_configure("expandable_grow_chunk_mb:2"), 0);
    tally_free(other);
    tally_free(big);
    tally_free(small);
    tally_free(last);
    CHECK_OK();
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
    tu_conf(EXPAND_TEST_CONF);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_large_block_maps_only_its_pages, reset),
        cmocka_unit_test_setup(test_block_past_a_moved_hole_finds_addresses_in_the_range, reset),
        cmocka_unit_test_setup(test_mapped_larger_block_preferred_to_a_best_fit_needing_pages, reset),
        cmocka_unit_test_setup(test_best_fit_among_mapped_holes_is_the_smallest, reset),
        cmocka_unit_test_setup(test_mapped_block_preferred_up_to_four_past_the_best_fit, reset),
        cmocka_unit_test_setup(test_budget_set_to_zero_at_run_time_moves_nothing, reset),
        cmocka_unit_test_setup(test_empty_cache_during_a_capture_keeps_idle_pages_mapped, reset),
        cmocka_unit_test_setup(test_holes_are_reused_without_raising_the_peak, reset),
        cmocka_unit_test_setup(test_empty_cache_unmaps_idle_pages, reset),
        cmocka_unit_test_setup(test_streams_get_their_own_region, reset),
        cmocka_unit_test_setup(test_out_of_memory_at_capacity, reset),
        cmocka_unit_test_setup(test_memory_fraction_caps_mapped_pages, reset),
        cmocka_unit_test_setup(test_pages_below_the_mark_leave_idle_pages_alone, reset),
        cmocka_unit_test_setup(test_idle_pages_below_the_mark_cost_no_call, reset),
        cmocka_unit_test_setup(test_every_idle_run_goes_when_all_are_needed, reset),
        cmocka_unit_test_setup(test_steal_takes_the_longest_run_first, reset),
        cmocka_unit_test_setup(test_idle_pages_right_below_the_block_are_taken, reset),
        cmocka_unit_test_setup(test_room_under_the_mark_is_mapped_ahead_and_used, reset),
        cmocka_unit_test_setup(test_free_small_segments_move_to_large_blocks, reset),
        cmocka_unit_test_setup(test_idle_large_pages_move_to_a_new_small_segment, reset),
        cmocka_unit_test_setup(test_a_new_small_segment_takes_an_inner_idle_run_before_the_region_end, reset),
        cmocka_unit_test_setup(test_small_blocks_growing_the_range_map_to_the_chunk, reset),
        cmocka_unit_test_setup(test_empty_cache_gives_back_pages_mapped_ahead, reset),
        cmocka_unit_test_setup(test_chunk_past_capacity_does_not_fail_a_block_that_fits, reset),
        cmocka_unit_test(test_options_show_the_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
