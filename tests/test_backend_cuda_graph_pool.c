/* The cuda backend during CUDA graph capture, with and without a graph
 * pool (tally_graph_pool_begin, _end, _release): what a capture may
 * allocate and where, the events it neither queries nor records, a pool
 * that has ended or lost its last segment, and bad calls. On the CUDA
 * stand-in under `make test`, or the real driver with TALLY_REAL_CUDA=1;
 * every test runs in a forked child with its own TALLY_CONF
 * (tests/cudachild.h), as in test_backend_cuda.c. The defects of issue 20
 * (capture on the strict stand-in) are in test_backend_cuda_capture.c.
 *
 * Defects of issue 11 and their tests:
 *   capture                            test_cuda_capture_graph_pool,
 *                                      test_cuda_capture_without_pool_refused
 *
 * Gaps that mutation testing found (tests/mutate/mutations.txt):
 *   an ended graph pool still serving  test_cuda_graph_pool_ended_serves_nothing
 *   a graph pool freed while in use    test_cuda_graph_pool_outlives_its_last_segment
 *
 * And: test_cuda_graph_pool_bad_calls, one line naming the problem for each
 * bad call (a pool id of (0, 0), a device that does not exist, an end
 * without a begin, a begin twice, a release of no pool).
 *
 * Every test needs one device. test_cuda_graph_pool_outlives_its_last_segment
 * runs with max_split_size_mb:20 on a stand-in device of 1 GiB
 * (CUDA_STANDIN_MEMORY), so that its request fits only once the pool's
 * cached segment is released. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>

#include "cudachild.h"

/* ---- CUDA graph capture ------------------------------------------------------- */

static int only_stream(void *arg, void *stream)
{
    return stream == arg;
}

/* A capture in the global mode: tally allocates during it without
 * invalidating it (relaxed mode around cuMemAlloc), queries no event and
 * records none into it (a block freed with a use on the capturing stream
 * gets its event after the capture), and the graph's blocks stay in the
 * graph pool: an eager allocation afterwards never gets them. */
static void body_capture(void)
{
    driver_up();
    CUstream s = make_stream(0), side = make_stream(0);
    void *x = tally_malloc(1 << 20, 0, side); /* used on s below */
    EXPECT(x != NULL);
    EXPECT(tally_graph_pool_begin(0, 7, 1, only_stream, s) == 0);
    CU_EXPECT(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    void *g1 = tally_malloc(5 << 20, 0, s);
    EXPECT(g1 != NULL);
    EXPECT(tally_record_stream(x, s) == 0);
    tally_free(x);                            /* its event waits for the capture's end */
    void *g2 = tally_malloc(1 << 20, 0, s); /* no event is queried */
    EXPECT(g2 != NULL);
    tally_free(g1); /* back to the graph pool */
    void *g3 = tally_malloc(5 << 20, 0, s);
    EXPECT(g3 == g1); /* the graph pool serves the capture */
    tally_free(g3);
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    CU_EXPECT(cu.cuStreamIsCapturing(s, &st));
    EXPECT(st == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    CUgraph graph = NULL;
    CU_EXPECT(cu.cuStreamEndCapture(s, &graph)); /* not invalidated */
    EXPECT(graph != NULL);
    CU_EXPECT(cu.cuGraphDestroy(graph));
    EXPECT(tally_graph_pool_end(0, 7, 1) == 0);
    void *e = tally_malloc(5 << 20, 0, s);
    EXPECT(e != NULL);
    EXPECT(e != g1); /* eager code never gets the graph's memory */
    EXPECT(tally_check() == 0);
    tally_free(e);
    tally_free(g2);
    EXPECT(tally_graph_pool_release(0, 7, 1) == 0);
    EXPECT(tally_graph_pool_release(0, 7, 1) == -TALLY_EINVAL);
    tally_empty_cache(0);
    tally_stats_t st2;
    EXPECT(tally_get_stats(0, &st2) == 0);
    EXPECT(st2.reserved_bytes[0].current == 0);
    EXPECT(tally_check() == 0);
}

/* Without a graph pool, an allocation on a capturing stream is refused with
 * an error saying what to do, and the capture survives. */
static void body_capture_without_pool(void)
{
    driver_up();
    CUstream s = make_stream(0);
    void *warm = tally_malloc(1 << 20, 0, s);
    EXPECT(warm != NULL);
    CU_EXPECT(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    EXPECT(tally_malloc(1 << 20, 0, s) == NULL);
    EXPECT(strstr(tally_last_error(), "torch.cuda.graph") != NULL);
    EXPECT(strstr(tally_last_error(), "tally_graph_pool_begin") != NULL);
    CUgraph graph = NULL;
    CU_EXPECT(cu.cuStreamEndCapture(s, &graph));
    CU_EXPECT(cu.cuGraphDestroy(graph));
    tally_free(warm);
    EXPECT(tally_check() == 0);
}

/* A graph pool that has ended serves no more allocations, even while
 * another pool is open: an eager allocation on its stream never gets the
 * ended pool's cached block. Once released, the pool's last segment goes
 * at the next empty_cache, counted in what it released. */
static void body_graph_pool_ended(void)
{
    driver_up();
    CUstream a = make_stream(0), b = make_stream(0);
    EXPECT(tally_graph_pool_begin(0, 1, 1, only_stream, a) == 0);
    void *g = tally_malloc(1 << 20, 0, a);
    EXPECT(g != NULL);
    tally_free(g); /* cached in pool (1, 1) */
    void *kept = tally_malloc(4096, 0, a); /* keeps the pool's small segment past its release */
    EXPECT(kept != NULL);
    EXPECT(tally_graph_pool_end(0, 1, 1) == 0);
    EXPECT(tally_graph_pool_begin(0, 2, 1, only_stream, b) == 0);
    void *e = tally_malloc(1 << 20, 0, a);
    EXPECT(e != NULL);
    EXPECT(e != g);
    tally_free(e);
    EXPECT(tally_graph_pool_end(0, 2, 1) == 0);
    EXPECT(tally_graph_pool_release(0, 1, 1) == 0);
    EXPECT(tally_graph_pool_release(0, 2, 1) == 0);
    tally_free(kept);
    /* Released and counted: the released pool's small segment and the
     * eager one of e, 2 MiB each. */
    EXPECT(tally_empty_cache(0) == 4 << 20);
    EXPECT(tally_check() == 0);
}

/* A graph pool in use keeps its segments: while it is allocating (a capture
 * announced) the out-of-memory path releases nothing, not even the pool's
 * one cached (oversize) segment, and the allocation fails cleanly; once the
 * pool has ended and been released, its last segment goes (and the pool with
 * it) and the same request fits. On a 1 GiB device (the
 * stand-in; a real one is larger and the request fits). */
static void body_graph_pool_loses_last_segment(void)
{
    setenv("CUDA_STANDIN_MEMORY", "1G", 1);
    driver_up();
    CUstream a = make_stream(0);
    EXPECT(tally_graph_pool_begin(0, 1, 1, only_stream, a) == 0);
    void *g = tally_malloc(100 << 20, 0, a);
    EXPECT(g != NULL);
    tally_free(g); /* the pool's only segment, cached */
    size_t free_b = 0, total = 0;
    EXPECT(tally_mem_get_info(0, &free_b, &total) == 0);
    size_t want = free_b + (40 << 20); /* fits only once g's segment is released */
    EXPECT(tally_malloc(want, 0, a) == NULL);
    EXPECT(tally_graph_pool_end(0, 1, 1) == 0);
    EXPECT(tally_graph_pool_release(0, 1, 1) == 0);
    void *big = tally_malloc(want, 0, a);
    EXPECT(big != NULL);
    tally_free(big);
    EXPECT(tally_graph_pool_release(0, 1, 1) == -TALLY_EINVAL); /* gone with its last segment */
    EXPECT(tally_check() == 0);
}

/* Bad graph-pool calls: one line each, naming the problem. */
static void body_graph_pool_errors(void)
{
    driver_up();
    EXPECT(tally_graph_pool_begin(0, 0, 0, NULL, NULL) == -TALLY_EINVAL);
    EXPECT(strstr(tally_last_error(), "pool id (0, 0)") != NULL);
    EXPECT(tally_graph_pool_begin(9, 1, 1, NULL, NULL) == -TALLY_EINVAL);
    EXPECT(strstr(tally_last_error(), "device 9 does not exist") != NULL);
    EXPECT(tally_graph_pool_end(0, 1, 1) == -TALLY_ESTATE);
    EXPECT(strstr(tally_last_error(), "is not allocating") != NULL);
    EXPECT(tally_graph_pool_begin(0, 1, 1, NULL, NULL) == 0);
    EXPECT(tally_graph_pool_begin(0, 1, 1, NULL, NULL) == -TALLY_ESTATE);
    EXPECT(strstr(tally_last_error(), "begin twice") != NULL);
    EXPECT(tally_graph_pool_release(0, 2, 2) == -TALLY_EINVAL);
    EXPECT(strstr(tally_last_error(), "no pool (2, 2)") != NULL);
    EXPECT(tally_graph_pool_release(0, 1, 1) == 0);
}

/* ---- tests ------------------------------------------------------------------ */

CUDA_TEST(test_cuda_capture_graph_pool, "backend:cuda,leak_report:off", body_capture, 1)
CUDA_TEST(test_cuda_capture_without_pool_refused, "backend:cuda,leak_report:off", body_capture_without_pool, 1)
CUDA_TEST(test_cuda_graph_pool_bad_calls, "backend:cuda,leak_report:off", body_graph_pool_errors, 1)
CUDA_TEST(test_cuda_graph_pool_ended_serves_nothing, "backend:cuda,leak_report:off", body_graph_pool_ended, 1)
CUDA_TEST(test_cuda_graph_pool_outlives_its_last_segment, "backend:cuda,leak_report:off,max_split_size_mb:20",
          body_graph_pool_loses_last_segment, 1)

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_capture_graph_pool),
        cmocka_unit_test(test_cuda_capture_without_pool_refused),
        cmocka_unit_test(test_cuda_graph_pool_bad_calls),
        cmocka_unit_test(test_cuda_graph_pool_ended_serves_nothing),
        cmocka_unit_test(test_cuda_graph_pool_outlives_its_last_segment),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
