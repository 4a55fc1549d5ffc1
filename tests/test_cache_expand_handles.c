/* Expandable segments (expandable_segments:true) on the host backend: what
 * the backend is asked for. The host backend's counts of map and unmap
 * calls, pages, runs and handles; physical handles (expandable_handle_mb: a
 * large block maps one handle, given back only whole and taken only whole,
 * and a handle a small block pins makes an OOM inside the range); small-pool
 * segments lent from idle pages (expandable_small_shared); and a random
 * workload and injected map failures that keep every invariant, with a
 * handle per page, with larger handles and with lent segments. (Where pages
 * are mapped and how idle pages move: test_cache_expand_pages.c.) */
#include "expandutil.h"

#include "backend/backend.h"

#include <unistd.h>

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

static void test_random_workload_keeps_invariants(void **state)
{
    (void)state;
    tally_set_sink(discard, NULL); /* the OOM reports of a full device */
    enum { SLOTS = 128 };
    void *live[SLOTS] = {0};
    unsigned seed = 12345;
    long ops = tu_scaled(60000, 2000);
    for (long i = 0; i < ops; i++) {
        unsigned draw = next_draw(&seed);
        toggle_slot(&live[(draw >> 8) % SLOTS], draw, (int)((draw >> 20) & 1),
                    (void *)(uintptr_t)(0x100 + 0x100 * ((draw >> 21) & 1)));
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

/* What the host backend counts for a replay's driver calls: map calls and
 * pages, unmap calls, pages and runs, reservations; tally's own counters
 * agree with it. */
static void test_host_backend_counts_calls_pages_and_runs(void **state)
{
    (void)state;
    tally_host_calls_t c0 = host_calls();
    tally_stats_t s0 = stats(0);
    void *p = tally_malloc(5 * MiB + 1, 0, stream_a); /* a new range, three pages in one call */
    assert_non_null(p);
    tally_host_calls_t c1 = host_calls();
    EQ(c1.reserve - c0.reserve, 1);
    EQ(c1.map - c0.map, 1);
    EQ(c1.map_pages - c0.map_pages, 3);
    EQ(c1.unmap - c0.unmap, 0);
    tally_free(p);
    tally_empty_cache(0); /* the range is free: its one run unmapped, the range given back */
    tally_host_calls_t c2 = host_calls();
    EQ(c2.unmap - c1.unmap, 1);
    EQ(c2.unmap_pages - c1.unmap_pages, 3);
    EQ(c2.unmap_runs - c1.unmap_runs, 1);
    EQ(c2.unreserve - c1.unreserve, 1);
    tally_stats_t s = stats(0);
    EQ(s.num_device_alloc - s0.num_device_alloc, (int64_t)(c2.map - c0.map + c2.alloc - c0.alloc));
    EQ(s.num_device_free - s0.num_device_free, (int64_t)(c2.unmap - c0.unmap + c2.free - c0.free));
    /* A small block: a segment allocation, no page. */
    void *q = tally_malloc(4096, 0, stream_a);
    assert_non_null(q);
    tally_free(q);
    tally_empty_cache(0);
    tally_host_calls_t c3 = host_calls();
    EQ(c3.alloc - c2.alloc, 1);
    EQ(c3.free - c2.free, 1);
    EQ(c3.map - c2.map, 0);
    assert_int_equal(tally_host_calls(0, NULL), -TALLY_EINVAL);
    assert_int_equal(tally_host_calls(7, &c3), -TALLY_EINVAL);
}

/* Runs are counted over the pages actually mapped, as the cuda backend
 * makes one cuMemUnmap per run: an unmap over two mapped runs with a hole
 * between is two runs, and pages never mapped are not counted; handles are
 * counted and never cut. */
static void test_host_backend_counts_unmap_runs_over_holes(void **state)
{
    (void)state;
    const tally_backend_t *b = &tally__backend_host;
    char why[200];
    void *base = NULL;
    assert_int_equal(b->reserve(1, 8 * PAGE, &base, why, sizeof why), 0);
    char *at = base;
    tally_host_calls_t c0;
    assert_int_equal(tally_host_calls(1, &c0), 0);
    size_t free0, free1, total;
    assert_int_equal(tally_mem_get_info(1, &free0, &total), 0);
    assert_int_equal(b->map(1, at, 2 * PAGE, PAGE, why, sizeof why), 0);
    assert_int_equal(b->map(1, at + 3 * PAGE, 2 * PAGE, PAGE, why, sizeof why), 0);
    assert_int_equal(b->unmap(1, at, 8 * PAGE), 0);
    /* Only the four mapped pages go back to the device's capacity. */
    assert_int_equal(tally_mem_get_info(1, &free1, &total), 0);
    EQ(free1, free0);
    tally_host_calls_t c;
    assert_int_equal(tally_host_calls(1, &c), 0);
    EQ(c.map - c0.map, 2);
    EQ(c.map_pages - c0.map_pages, 4);
    EQ(c.unmap - c0.unmap, 1);
    EQ(c.unmap_pages - c0.unmap_pages, 4);
    EQ(c.unmap_runs - c0.unmap_runs, 2);
    /* Handles of several pages: counted per map call; the backend, as CUDA,
     * refuses an unmap that would cut one. */
    assert_int_equal(b->map(1, at, 5 * PAGE, 2 * PAGE, why, sizeof why), 0); /* handles of 2, 2, 1 pages */
    assert_int_equal(b->map(1, at + 6 * PAGE, PAGE, 3 * PAGE / 2, why, sizeof why), TALLY_EBACKEND);
    HAS(why, "not a whole number of 2 MiB pages");
    /* As CUDA (and lib/backend/cuda/vmm.c), maps and unmaps of whole pages
     * inside the reservation only: past its end, off a page boundary, a part
     * of a page, nothing, or outside any reservation are refused, and
     * nothing is mapped, unmapped or counted. */
    tally_host_calls_t cr;
    assert_int_equal(tally_host_calls(1, &cr), 0);
    assert_int_equal(b->map(1, at + 7 * PAGE, 2 * PAGE, PAGE, why, sizeof why), TALLY_EBACKEND);
    HAS(why, "is not inside a reservation of device 1");
    assert_int_equal(b->map(1, at + 8 * PAGE, PAGE, PAGE, why, sizeof why), TALLY_EBACKEND);
    assert_int_equal(b->map(1, at + 4096, PAGE, PAGE, why, sizeof why), TALLY_EBACKEND);
    HAS(why, "is not a whole number of 2 MiB pages");
    assert_int_equal(b->map(1, at + 6 * PAGE, PAGE / 2, PAGE, why, sizeof why), TALLY_EBACKEND);
    assert_int_equal(b->map(1, at + 6 * PAGE, 0, PAGE, why, sizeof why), TALLY_EBACKEND);
    static char outside[64];
    assert_int_equal(b->map(1, outside, PAGE, PAGE, why, sizeof why), TALLY_EBACKEND);
    assert_int_equal(b->unmap(1, at + 4 * PAGE, 5 * PAGE), TALLY_EBACKEND);
    HAS(tally_last_error(), "is not inside a reservation of device 1");
    assert_int_equal(b->unmap(1, at + 4096, PAGE), TALLY_EBACKEND);
    HAS(tally_last_error(), "is not a whole number of 2 MiB pages");
    assert_int_equal(b->unmap(1, outside, PAGE), TALLY_EBACKEND);
    tally_host_calls_t cr1;
    assert_int_equal(tally_host_calls(1, &cr1), 0);
    EQ(cr1.map - cr.map, 0);
    EQ(cr1.map_pages - cr.map_pages, 0);
    EQ(cr1.unmap - cr.unmap, 0);
    EQ(cr1.unmap_pages - cr.unmap_pages, 0);
    tally_host_calls_t c1;
    assert_int_equal(tally_host_calls(1, &c1), 0);
    EQ(c1.map_handles - c.map_handles, 3);
    assert_int_equal(b->unmap(1, at + PAGE, 2 * PAGE), TALLY_EBACKEND); /* cuts two */
    HAS(tally_last_error(), "would cut a physical handle");
    assert_int_equal(b->unmap(1, at, PAGE), TALLY_EBACKEND);
    assert_int_equal(b->unmap(1, at + 2 * PAGE, 3 * PAGE), 0); /* the last two handles */
    assert_int_equal(b->unmap(1, at, 2 * PAGE), 0);
    tally_host_calls_t c2;
    assert_int_equal(tally_host_calls(1, &c2), 0);
    EQ(c2.unmap - c1.unmap, 2);
    EQ(c2.unmap_pages - c1.unmap_pages, 5);
    assert_int_equal(b->unreserve(1, base, 8 * PAGE), 0);
}

/* ---- physical handles: large blocks map one handle, given back only whole ---- */

static void handles_from(int mb)
{
    char conf[64];
    snprintf(conf, sizeof conf, "expandable_handle_mb:%d", mb);
    assert_int_equal(tally_configure(conf), 0);
}

/* End of a handle test: every block of dev freed, empty_cache gives all
 * back; the default threshold again. */
static void all_back(int dev)
{
    tally_empty_cache(dev);
    EQ(stats(dev).reserved_bytes[TALLY_POOL_ALL].current, 0);
    handles_from(64);
}

/* A block of at least expandable_handle_mb maps its pages as one handle;
 * a smaller one gets a handle per page. */
static void test_large_block_maps_one_handle(void **state)
{
    (void)state;
    handles_from(8);
    tally_host_calls_t c0 = host_calls();
    void *big = tally_malloc(10 * MiB, 0, stream_a); /* five pages, one handle */
    assert_non_null(big);
    tally_host_calls_t c1 = host_calls();
    EQ(c1.map - c0.map, 1);
    EQ(c1.map_pages - c0.map_pages, 5);
    EQ(c1.map_handles - c0.map_handles, 1);
    void *small = tally_malloc(6 * MiB, 0, stream_a); /* three pages, three handles */
    assert_non_null(small);
    tally_host_calls_t c2 = host_calls();
    EQ(c2.map_pages - c1.map_pages, 3);
    EQ(c2.map_handles - c1.map_handles, 3);
    CHECK_OK();
    tally_free(big);
    tally_free(small);
    all_back(0);
}

/* A large block's own pages are one handle; the pages mapped ahead of it
 * (here to the next growth chunk) are mapped too, in a call of their own
 * with a handle per page, so that each can be given back alone. */
static void test_pages_mapped_ahead_of_a_large_block_get_a_handle_each(void **state)
{
    (void)state;
    handles_from(4);
    assert_int_equal(tally_configure("expandable_grow_chunk_mb:16"), 0); /* chunks of 8 pages */
    tally_host_calls_t c0 = host_calls();
    void *big = tally_malloc(8 * MiB, 0, stream_a); /* pages 0-3, then 4-7 ahead to the chunk's end */
    assert_non_null(big);
    tally_host_calls_t c1 = host_calls();
    EQ(c1.map - c0.map, 2);
    EQ(c1.map_pages - c0.map_pages, 8);
    EQ(c1.map_handles - c0.map_handles, 5);
    EQ(stats(0).reserved_bytes[TALLY_POOL_ALL].current, 8 * PAGE);
    void *next = tally_malloc(8 * MiB, 0, stream_a); /* on the pages mapped ahead: no call */
    assert_non_null(next);
    EQ((uintptr_t)next - (uintptr_t)big, 8 * MiB);
    EQ(host_calls().map, c1.map);
    CHECK_OK();
    tally_free(big);
    tally_free(next);
    all_back(0);
}

/* A handle whose pages are partly idle stays mapped, through empty_cache
 * too; once all its pages are idle it goes in one unmap, and the range at
 * empty_cache when every block is free. */
static void test_partly_idle_handle_stays_mapped(void **state)
{
    (void)state;
    handles_from(8);
    void *a = tally_malloc(16 * MiB, 0, stream_a); /* pages 0-7: one handle */
    assert_non_null(a);
    tally_free(a);
    void *b = tally_malloc(4 * MiB, 0, stream_a); /* best fit: a's hole, pages 0-1 */
    assert_ptr_equal(b, a);
    tally_host_calls_t c0 = host_calls();
    tally_empty_cache(0);
    tally_host_calls_t c1 = host_calls();
    /* With a handle per page, pages 2-7 would go here. */
    EQ(c1.unmap - c0.unmap, 0);
    EQ(stats(0).reserved_bytes[TALLY_POOL_LARGE].current, 16 * MiB);
    CHECK_OK();
    tally_free(b);
    CHECK_OK();
    tally_empty_cache(0); /* all free: the handle goes whole, then the range */
    tally_host_calls_t c2 = host_calls();
    EQ(c2.unmap - c1.unmap, 1);
    EQ(c2.unmap_pages - c1.unmap_pages, 8);
    EQ(c2.unreserve - c1.unreserve, 1);
    all_back(0);
}

/* Pages are taken from holes in whole spare handles only: a spare handle
 * goes in one unmap call; the idle pages of a handle still holding a live
 * block are not taken, and reserved memory grows instead. */
static void test_steal_takes_whole_handles_only(void **state)
{
    (void)state;
    handles_from(8);
    void *a = tally_malloc(16 * MiB, 0, stream_a); /* pages 0-7: one handle */
    void *x = tally_malloc(4 * MiB, 0, stream_a);  /* pages 8-9 */
    assert_non_null(a);
    assert_non_null(x);
    tally_free(a); /* the handle is spare */
    tally_host_calls_t c0 = host_calls();
    void *d = tally_malloc(20 * MiB, 0, stream_a); /* past x: 10 new pages over the mark */
    assert_non_null(d);
    tally_host_calls_t c1 = host_calls();
    EQ(c1.unmap - c0.unmap, 1);
    EQ(c1.unmap_pages - c0.unmap_pages, 8);
    CHECK_OK();
    tally_free(d);
    tally_free(x);
    tally_empty_cache(0);
    /* Again, with a small block left in the handle's first pages. */
    a = tally_malloc(16 * MiB, 0, stream_a);
    x = tally_malloc(4 * MiB, 0, stream_a);
    tally_free(a);
    void *b = tally_malloc(4 * MiB, 0, stream_a); /* pages 0-1 of the handle */
    assert_ptr_equal(b, a);
    tally_host_calls_t c2 = host_calls();
    d = tally_malloc(20 * MiB, 0, stream_a);
    assert_non_null(d);
    tally_host_calls_t c3 = host_calls();
    EQ(c3.unmap - c2.unmap, 0); /* pages 2-7 are idle but their handle is not */
    EQ(stats(0).reserved_bytes[TALLY_POOL_LARGE].current, (16 + 4 + 20) * MiB);
    CHECK_OK();
    tally_free(b);
    tally_free(d);
    tally_free(x);
    all_back(0);
}

/* Out of memory inside a range: a handle pinned by a small live block
 * cannot be given back, so a request that needs its memory in another
 * stream's range fails (state intact); once the small block is freed the
 * handle goes and the request fits. Device 1 has 256 MiB. */
static void test_oom_inside_range_with_handles(void **state)
{
    (void)state;
    handles_from(8);
    tally_set_sink(discard, NULL);
    void *a = tally_malloc(100 * MiB, 1, stream_a); /* pages 0-49: one handle */
    void *x = tally_malloc(4 * MiB, 1, stream_a);   /* pages 50-51 */
    assert_non_null(a);
    assert_non_null(x);
    tally_free(a);
    void *b = tally_malloc(4 * MiB, 1, stream_a); /* pins the handle */
    assert_ptr_equal(b, a);
    tally_stats_t before = stats(1);
    void *stream_b = (void *)0x200;
    void *q = tally_malloc(160 * MiB, 1, stream_b); /* 100 + 4 + 160 MiB > 256 */
    tally_stats_t after = stats(1);
    tally_free(q);
    assert_null(q);
    EQ(after.num_ooms, before.num_ooms + 1);
    EQ(after.reserved_bytes[TALLY_POOL_LARGE].current, 104 * MiB);
    CHECK_OK();
    tally_free(b);
    q = tally_malloc(160 * MiB, 1, stream_b);
    assert_non_null(q);
    CHECK_OK();
    tally_free(q);
    tally_free(x);
    tally_set_sink(NULL, NULL);
    all_back(1);
}

/* The random workload and injected map failures with handles from 4 MiB:
 * tally_check verifies the handle invariants after every step. */
static void test_random_workload_with_handles(void **state)
{
    handles_from(4);
    test_random_workload_keeps_invariants(state);
    test_injected_map_failures_leave_state_intact(state);
    handles_from(64);
}

/* expandable_small_shared: a small block's new segment is cut from idle
 * mapped pages of its stream's expandable segment (no backend allocation,
 * reserved memory unchanged, its 2 MiB moved from the large pool's figure to
 * the small pool's); of two wholly free lent segments one goes back, and
 * the large pool then uses its pages. */
static void test_shared_small_segments_use_idle_pages(void **state)
{
    (void)state;
    assert_int_equal(tally_configure("expandable_small_shared:true,expandable_move_budget:0"), 0);
    char *big = tally_malloc(20 * MiB, 0, stream_a);
    assert_non_null(big);
    tally_free(big); /* ten pages, idle, under the high-water mark */
    tally_stats_t before = stats(0);
    void *s1 = tally_malloc(MiB, 0, stream_a), *s2 = tally_malloc(MiB, 0, stream_a);
    void *s3 = tally_malloc(MiB, 0, stream_a);
    assert_true(s1 && s2 && s3);
    tally_stats_t s = stats(0);
    EQ(s.reserved_bytes[TALLY_POOL_ALL].current, before.reserved_bytes[TALLY_POOL_ALL].current);
    /* Nor its peak: the pages move from one pool's figure to the other's,
     * and the total never counts them twice. */
    EQ(s.reserved_bytes[TALLY_POOL_ALL].peak, before.reserved_bytes[TALLY_POOL_ALL].peak);
    EQ(s.segment[TALLY_POOL_SMALL].current, 2);
    EQ(s.reserved_bytes[TALLY_POOL_SMALL].current, 2 * PAGE);
    EQ(s.reserved_bytes[TALLY_POOL_LARGE].current, before.reserved_bytes[TALLY_POOL_LARGE].current - 2 * PAGE);
    EQ(s.num_device_alloc, before.num_device_alloc);
    assert_true((char *)s1 >= big && (char *)s3 < big + 20 * MiB);
    CHECK_OK();
    tally_free(s1);
    tally_free(s2);
    EQ(stats(0).segment[TALLY_POOL_SMALL].current, 2); /* the first wholly free one is kept */
    tally_free(s3);
    s = stats(0);
    EQ(s.segment[TALLY_POOL_SMALL].current, 1);
    EQ(s.reserved_bytes[TALLY_POOL_SMALL].current, PAGE);
    EQ(s.reserved_bytes[TALLY_POOL_ALL].current, before.reserved_bytes[TALLY_POOL_ALL].current);
    EQ(s.num_device_free, before.num_device_free);
    CHECK_OK();
    /* The returned piece is the large pool's again: 18 MiB fits, no page more. */
    void *b2 = tally_malloc(18 * MiB, 0, stream_a);
    assert_non_null(b2);
    EQ(stats(0).reserved_bytes[TALLY_POOL_ALL].current, before.reserved_bytes[TALLY_POOL_ALL].current);
    CHECK_OK();
    tally_free(b2);
    tally_empty_cache(0);
    s = stats(0);
    EQ(s.segment[TALLY_POOL_SMALL].current, 0);
    EQ(s.reserved_bytes[TALLY_POOL_ALL].current, 0);
    CHECK_OK();
    assert_int_equal(tally_configure("expandable_small_shared:false"), 0);
}

/* A lent segment is listed once: the report lists it as a small segment at
 * its addresses and leaves its piece out of the expandable segment's blocks;
 * base_alloc refuses it (pages of the virtual memory API, which CUDA IPC
 * cannot share). */
static void test_shared_small_segment_listed_once(void **state)
{
    (void)state;
    assert_int_equal(tally_configure("expandable_small_shared:true,expandable_move_budget:0"), 0);
    void *big = tally_malloc(20 * MiB, 0, stream_a);
    tally_free(big);
    void *small = tally_malloc(4096, 0, stream_a);
    assert_non_null(small);
    size_t size = 1;
    EQ((uintptr_t)tally_torch_base_alloc(small, &size), 0);
    EQ(size, 0);
    assert_non_null(strstr(tally_last_error(), "expandable segments"));
    char path[] = "/tmp/tally-lent-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(tally_write_report(path), 0);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static char text[1 << 20];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    unlink(path);
    text[n] = 0;
    char key[64];
    /* The small segment, at the piece's address... */
    snprintf(key, sizeof key, "{\"device\":0,\"address\":%llu,\"total_size\":%zu,", (unsigned long long)(uintptr_t)small,
             (size_t)PAGE);
    HAS(text, key);
    /* ...and no 2 MiB block there in the expandable segment's list. */
    snprintf(key, sizeof key, "\"address\":%llu,\"size\":%zu,", (unsigned long long)(uintptr_t)small, (size_t)PAGE);
    assert_null(strstr(text, key));
    HAS(text, "\"segment_type\":\"small\"");
    tally_free(small);
    tally_empty_cache(0);
    CHECK_OK();
    assert_int_equal(tally_configure("expandable_small_shared:false"), 0);
}

/* base_alloc (PyTorch asks it before cudaIpcGetMemHandle, which takes
 * cudaMalloc memory only) refuses every kind of expandable segments'
 * memory with the reason: a large block in the stream's range, a small one
 * in the small pool's run of pages; and hands out nothing. */
static void test_base_alloc_refuses_expandable_memory(void **state)
{
    (void)state;
    /* No move budget: the small pool is a run of pages (small_run.c). */
    assert_int_equal(tally_configure("expandable_small_shared:false,expandable_small_pages:true,"
                                     "expandable_move_budget:0"), 0);
    void *big = tally_malloc(20 * MiB, 0, stream_a), *small = tally_malloc(4096, 0, stream_a);
    assert_true(big && small);
    void *const ptrs[] = {big, (char *)big + 12345, small};
    for (int i = 0; i < 3; i++) {
        size_t size = 1;
        EQ((uintptr_t)tally_torch_base_alloc(ptrs[i], &size), 0);
        EQ(size, 0);
        HAS(tally_last_error(), "which CUDA IPC (cudaIpcGetMemHandle) cannot share");
        HAS(tally_last_error(), "expandable_segments:false");
    }
    tally_free(small);
    tally_free(big);
    /* With a move budget the small pool takes 2 MiB segments of the
     * backend's own allocation, which IPC can share: handed out. */
    tally_empty_cache(0); /* the run goes */
    assert_int_equal(tally_configure("expandable_move_budget:-1"), 0);
    small = tally_malloc(4096, 0, stream_a);
    size_t size = 0;
    void *base = tally_torch_base_alloc(small, &size);
    assert_true(base && (char *)small >= (char *)base && (char *)small < (char *)base + size);
    EQ(size, PAGE);
    tally_free(small);
    tally_empty_cache(0);
    CHECK_OK();
}

/* expandable_small_shared: the small pool's segments are lent by the
 * expandable segments; the random workload and injected failures keep every
 * invariant (tally_check knows lent pieces), and everything goes back. */
static void test_random_workload_with_shared_small_segments(void **state)
{
    assert_int_equal(tally_configure("expandable_small_shared:true"), 0);
    test_random_workload_keeps_invariants(state);
    test_injected_map_failures_leave_state_intact(state);
    assert_int_equal(tally_configure("expandable_small_shared:false"), 0);
}

int main(void)
{
    tu_conf(EXPAND_TEST_CONF);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_injected_map_failures_leave_state_intact, reset),
        cmocka_unit_test_setup(test_random_workload_keeps_invariants, reset),
        cmocka_unit_test_setup(test_host_backend_counts_calls_pages_and_runs, reset),
        cmocka_unit_test_setup(test_host_backend_counts_unmap_runs_over_holes, reset),
        cmocka_unit_test_setup(test_large_block_maps_one_handle, reset),
        cmocka_unit_test_setup(test_pages_mapped_ahead_of_a_large_block_get_a_handle_each, reset),
        cmocka_unit_test_setup(test_partly_idle_handle_stays_mapped, reset),
        cmocka_unit_test_setup(test_steal_takes_whole_handles_only, reset),
        cmocka_unit_test_setup(test_oom_inside_range_with_handles, reset),
        cmocka_unit_test_setup(test_random_workload_with_handles, reset),
        cmocka_unit_test_setup(test_random_workload_with_shared_small_segments, reset),
        cmocka_unit_test_setup(test_shared_small_segments_use_idle_pages, reset),
        cmocka_unit_test_setup(test_shared_small_segment_listed_once, reset),
        cmocka_unit_test_setup(test_base_alloc_refuses_expandable_memory, reset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
