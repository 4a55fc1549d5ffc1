/* Expandable segments when pages move rarely or never (expandable_move_budget
 * 0, the default, or a finite budget), on the host backend: how a run of new
 * pages is laid out in physical handles. A handle per cell of
 * expandable_handle_grid_mb (20 MiB, PyTorch's large page) that the run
 * crosses, cells counted from the region's base, a short piece at either end
 * joining its neighbour; so empty_cache unmaps every cell no live block
 * touches, where one handle per map call kept a whole freed run mapped under
 * a small block placed on it (docs/benchmarks.md, run Z). Also: a map that
 * fails part way takes down the handles it made, and the key's bounds. */
#include "expandutil.h"

static int cells(void **state)
{
    (void)state;
    if (tally_configure("garbage_collection_threshold:0,expandable_grow_chunk_mb:2,expandable_handle_mb:0,"
                        "expandable_move_budget:0,expandable_handle_grid_mb:20,expandable_small_pages:true"))
        return -1;
    tally_empty_cache(-1);
    return 0;
}

static void all_back(void)
{
    CHECK_OK();
    tally_empty_cache(0);
    EQ(stats(0).reserved_bytes[TALLY_POOL_ALL].current, 0);
    tally_host_calls_t c = host_calls();
    EQ(c.map_handles, c.unmap_handles);
}

static void *must(size_t size)
{
    void *p = tally_malloc(size, 0, stream_a);
    if (!p)
        fail_msg("tally_malloc(%zu) failed: %s", size, tally_last_error());
    return p;
}

/* Pages 0-49 (100 MiB) from the region's base: five whole cells, five
 * handles. Pages 50-64 (30 MiB): under two cells, one handle. Pages 65-89
 * (50 MiB): the head 65-69 joins cell 70-79, then cell 80-89: two. Each
 * handle is a backend call of its own. */
static void test_long_run_maps_a_handle_per_cell(void **state)
{
    (void)state;
    tally_host_calls_t c0 = host_calls();
    void *a = must(100 * MiB);
    tally_host_calls_t c1 = host_calls();
    EQ(c1.map_pages - c0.map_pages, 50);
    EQ(c1.map_handles - c0.map_handles, 5);
    EQ(c1.map - c0.map, 5);
    void *b = must(30 * MiB);
    tally_host_calls_t c2 = host_calls();
    EQ(c2.map_pages - c1.map_pages, 15);
    EQ(c2.map_handles - c1.map_handles, 1);
    void *c = must(50 * MiB);
    tally_host_calls_t c3 = host_calls();
    EQ(c3.map_pages - c2.map_pages, 25);
    EQ(c3.map_handles - c2.map_handles, 2);
    EQ((char *)b - (char *)a, 100 * MiB);
    EQ((char *)c - (char *)b, 30 * MiB);
    CHECK_OK();
    tally_free(a);
    tally_free(b);
    tally_free(c);
    all_back();
}

/* A 200 MiB block, freed; a 4 MiB block takes the start of its hole (best
 * fit). empty_cache keeps the one cell the small block touches and unmaps
 * the other nine; with one handle per map call (grid 0) all 200 MiB stay,
 * as before this key. */
static void test_empty_cache_keeps_only_the_cells_live_blocks_touch(void **state)
{
    (void)state;
    for (int grid = 20; grid >= 0; grid -= 20) {
        char conf[64];
        snprintf(conf, sizeof conf, "expandable_handle_grid_mb:%d", grid);
        assert_int_equal(tally_configure(conf), 0);
        void *big = must(200 * MiB);
        tally_free(big);
        void *small = must(4 * MiB);
        assert_ptr_equal(small, big);
        tally_host_calls_t c0 = host_calls();
        tally_empty_cache(0);
        tally_host_calls_t c1 = host_calls();
        CHECK_OK();
        if (grid) {
            EQ(stats(0).reserved_bytes[TALLY_POOL_LARGE].current, 20 * MiB);
            EQ(c1.unmap_handles - c0.unmap_handles, 9);
            EQ(c1.unmap_pages - c0.unmap_pages, 90);
        } else {
            EQ(stats(0).reserved_bytes[TALLY_POOL_LARGE].current, 200 * MiB);
            EQ(c1.unmap_handles - c0.unmap_handles, 0);
        }
        tally_free(small);
        all_back();
    }
}

/* The third handle of a five-handle run fails: the two made before it go
 * back (nothing of the call stays mapped), the cache's retry after the
 * failure maps the run whole, and every handle made is accounted for. */
static void test_a_failed_cell_takes_down_the_run(void **state)
{
    (void)state;
    tally_set_sink(discard, NULL);
    tally_host_calls_t c0 = host_calls();
    assert_int_equal(tally_host_fail_alloc(3, 0), 0);
    void *a = must(100 * MiB);
    tally_host_fail_alloc(0, 0);
    tally_set_sink(NULL, NULL);
    tally_host_calls_t c1 = host_calls();
    CHECK_OK();
    EQ(stats(0).reserved_bytes[TALLY_POOL_LARGE].current, 100 * MiB);
    EQ(c1.map_handles - c0.map_handles, 2 + 5);   /* two before the failure, five on the retry */
    EQ(c1.unmap_handles - c0.unmap_handles, 2);   /* the two, taken down */
    EQ(c1.map_pages - c0.map_pages, 20 + 50);
    tally_free(a);
    all_back();
}

/* Other cell sizes: 64 MiB cells (32 pages) lay 100 pages out as 0-31,
 * 32-63 and 64-99 (the 4-page tail joins); 1 MiB is under a page, which is
 * one handle per map call, as 0 is. Within a finite move budget a run is one
 * handle whatever the grid. Values outside 0..1048576 are refused with the
 * key named, and the setting is unchanged. */
static void test_grid_key(void **state)
{
    (void)state;
    static const struct {
        const char *conf;
        uint64_t handles;
    } cases[] = {{"expandable_handle_grid_mb:64", 3},
                 {"expandable_handle_grid_mb:1", 1},
                 {"expandable_handle_grid_mb:0", 1},
                 {"expandable_handle_grid_mb:20,expandable_move_budget:10000", 1}, /* moves take whole handles */
                 {"expandable_move_budget:0", 10}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(tally_configure(cases[i].conf), 0);
        tally_host_calls_t c0 = host_calls();
        void *p = must(200 * MiB);
        tally_host_calls_t c1 = host_calls();
        if (c1.map_handles - c0.map_handles != cases[i].handles)
            fail_msg("%s: %llu handles, expected %llu", cases[i].conf,
                     (unsigned long long)(c1.map_handles - c0.map_handles), (unsigned long long)cases[i].handles);
        tally_free(p);
        all_back();
    }
    tally_set_sink(discard, NULL);
    assert_int_equal(tally_configure("expandable_handle_grid_mb:-1"), -TALLY_ECONF);
    if (!strstr(tally_last_error(), "expandable_handle_grid_mb"))
        fail_msg("the error does not name the key: %s", tally_last_error());
    assert_int_equal(tally_configure("expandable_handle_grid_mb:1048577"), -TALLY_ECONF);
    assert_int_equal(tally_configure("expandable_handle_grid_mb:20x"), -TALLY_ECONF);
    tally_set_sink(NULL, NULL);
    tally_host_calls_t c0 = host_calls();
    void *p = must(200 * MiB); /* still 20 */
    EQ(host_calls().map_handles - c0.map_handles, 10);
    tally_free(p);
    all_back();
}

/* A random workload with the grid keeps every invariant (tally_check's
 * handles tile the mapped pages, spare ones wholly idle), and empty_cache
 * leaves mapped only cells that hold a live block. */
static void test_random_workload_with_cells(void **state)
{
    (void)state;
    tally_set_sink(discard, NULL); /* the OOM reports of a full device */
    enum { SLOTS = 64 };
    void *live[SLOTS] = {0};
    size_t size[SLOTS] = {0};
    unsigned seed = 777;
    long ops = tu_scaled(20000, 2000);
    for (long i = 0; i < ops; i++) {
        unsigned draw = next_draw(&seed), k = (draw >> 8) % SLOTS;
        size[k] = toggle_slot(&live[k], draw, 0, stream_a);
        if (i % 1000 == 999) {
            tally_empty_cache(0);
            CHECK_OK();
            /* Mapped large-pool memory is at most the handles live large
             * blocks touch: a block overlaps at most one cell more than its
             * size covers, and a handle is at most two cells (a joined
             * end). */
            int64_t bound = 0;
            for (int s = 0; s < SLOTS; s++)
                if (live[s] && size[s] > MiB)
                    bound += (int64_t)((size[s] + 20 * MiB - 1) / (20 * MiB) + 1) * 40 * MiB;
            int64_t res = stats(0).reserved_bytes[TALLY_POOL_LARGE].current;
            if (res > bound)
                fail_msg("after empty_cache %lld bytes of the large pool mapped, over %lld", (long long)res,
                         (long long)bound);
        }
    }
    tally_set_sink(NULL, NULL);
    for (int k = 0; k < SLOTS; k++)
        tally_free(live[k]);
    all_back();
}

int main(void)
{
    tu_conf(EXPAND_TEST_CONF);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_long_run_maps_a_handle_per_cell, cells),
        cmocka_unit_test_setup(test_empty_cache_keeps_only_the_cells_live_blocks_touch, cells),
        cmocka_unit_test_setup(test_a_failed_cell_takes_down_the_run, cells),
        cmocka_unit_test_setup(test_grid_key, cells),
        cmocka_unit_test_setup(test_random_workload_with_cells, cells),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
