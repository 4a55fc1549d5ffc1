// PyTorch's CUDA graph pool hooks (lib/torch/torch_graph.cc) called as PyTorch
// calls them: with a std::pair pool id and a std::function filter built
// here, on the host backend (graph pools are part of the cache, not of a
// device). Checks that allocations the filter claims go to the pool and
// never come back to other allocations, that the filter is kept alive from
// begin to end, that a throwing filter claims nothing, and that release
// gives the pool's memory back.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <utility>

#include "tally.h"

namespace {

CUstream_st *const capture_stream = reinterpret_cast<CUstream_st *>(0x1000);
CUstream_st *const other_stream = reinterpret_cast<CUstream_st *>(0x2000);

int64_t reserved(void)
{
    tally_stats_t s;
    assert_int_equal(tally_get_stats(0, &s), 0);
    return s.reserved_bytes[0].current;
}

void begin_with_local_filter(tally_mempool_id_t id, int *calls)
{
    // The std::function dies when this returns: the hook must keep a copy.
    std::function<bool(CUstream_st *)> filter = [calls](CUstream_st *s) {
        ++*calls;
        return s == capture_stream;
    };
    tally_torch_begin_allocate_to_pool(0, id, filter);
}

void test_pool_gets_claimed_allocations(void **state)
{
    (void)state;
    tally_empty_cache(-1);
    int64_t before = reserved();
    tally_mempool_id_t id(3, 4);
    int calls = 0;
    begin_with_local_filter(id, &calls);
    void *g = tally_malloc(3 << 20, 0, capture_stream);
    assert_non_null(g);
    assert_true(calls > 0); // the filter decided
    void *e = tally_malloc(3 << 20, 0, other_stream);
    assert_non_null(e);
    tally_free(g);
    void *g2 = tally_malloc(3 << 20, 0, capture_stream);
    assert_ptr_equal(g2, g); // the pool serves its own allocations again
    tally_free(g2);
    tally_torch_end_allocate_to_pool(0, id);
    // After end, the same stream and size are eager: never the pool's block.
    void *after = tally_malloc(3 << 20, 0, capture_stream);
    assert_non_null(after);
    assert_ptr_not_equal(after, g);
    assert_int_equal(tally_check(), 0);
    tally_free(after);
    tally_free(e);
    tally_torch_release_pool(0, id);
    tally_empty_cache(-1);
    assert_int_equal(reserved(), before);
    assert_int_equal(tally_check(), 0);
}

void test_throwing_filter_claims_nothing(void **state)
{
    (void)state;
    tally_mempool_id_t id(5, 6);
    std::function<bool(CUstream_st *)> filter = [](CUstream_st *) -> bool {
        throw std::runtime_error("cudaStreamGetCaptureInfo failed");
    };
    tally_torch_begin_allocate_to_pool(0, id, filter);
    void *p = tally_malloc(1 << 20, 0, capture_stream);
    assert_non_null(p);
    tally_free(p);
    tally_torch_end_allocate_to_pool(0, id);
    tally_torch_release_pool(0, id);
    // The block was eager: it serves an eager allocation again.
    void *q = tally_malloc(1 << 20, 0, capture_stream);
    assert_ptr_equal(q, p);
    tally_free(q);
    assert_int_equal(tally_check(), 0);
}

void test_shared_pool_lives_until_last_release(void **state)
{
    (void)state;
    tally_empty_cache(-1);
    int64_t before = reserved();
    tally_mempool_id_t id(7, 8);
    int calls = 0;
    begin_with_local_filter(id, &calls);
    void *g = tally_malloc(1 << 20, 0, capture_stream);
    assert_non_null(g);
    tally_torch_end_allocate_to_pool(0, id);
    begin_with_local_filter(id, &calls); // a second graph shares the pool
    tally_torch_end_allocate_to_pool(0, id);
    tally_free(g);
    tally_torch_release_pool(0, id);
    tally_empty_cache(-1);
    assert_true(reserved() > before); // one graph still uses the pool
    tally_torch_release_pool(0, id);
    tally_empty_cache(-1);
    assert_int_equal(reserved(), before);
    assert_int_equal(tally_check(), 0);
}

} // namespace

int main(void)
{
    setenv("TALLY_CONF", "backend:host,leak_report:off,stage_report:false", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_gets_claimed_allocations),
        cmocka_unit_test(test_throwing_filter_claims_nothing),
        cmocka_unit_test(test_shared_pool_lives_until_last_release),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
