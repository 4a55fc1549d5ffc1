/* The memory_stats JSON writer and reader (stats_json.c): the keys of
 * torch.cuda.memory_stats() in its order, a round trip over the whole int64
 * range, the lenient input it accepts and the errors it reports. */
#include "testutil.h" /* tu_buf_t, tu_buf_write */

#include "report/json.h"
#include "report/report.h"

/* ---- stats JSON --------------------------------------------------------- */

/* torch.cuda.memory_stats() keys in the order it returns them (sorted). */
static const char *const torch_keys[] = {
    "active.all.allocated", "active.all.current",
    "active.all.freed", "active.all.peak",
    "active.large_pool.allocated", "active.large_pool.current",
    "active.large_pool.freed", "active.large_pool.peak",
    "active.small_pool.allocated", "active.small_pool.current",
    "active.small_pool.freed", "active.small_pool.peak",
    "active_bytes.all.allocated", "active_bytes.all.current",
    "active_bytes.all.freed", "active_bytes.all.peak",
    "active_bytes.large_pool.allocated", "active_bytes.large_pool.current",
    "active_bytes.large_pool.freed", "active_bytes.large_pool.peak",
    "active_bytes.small_pool.allocated", "active_bytes.small_pool.current",
    "active_bytes.small_pool.freed", "active_bytes.small_pool.peak",
    "allocated_bytes.all.allocated", "allocated_bytes.all.current",
    "allocated_bytes.all.freed", "allocated_bytes.all.peak",
    "allocated_bytes.large_pool.allocated", "allocated_bytes.large_pool.current",
    "allocated_bytes.large_pool.freed", "allocated_bytes.large_pool.peak",
    "allocated_bytes.small_pool.allocated", "allocated_bytes.small_pool.current",
    "allocated_bytes.small_pool.freed", "allocated_bytes.small_pool.peak",
    "allocation.all.allocated", "allocation.all.current",
    "allocation.all.freed", "allocation.all.peak",
    "allocation.large_pool.allocated", "allocation.large_pool.current",
    "allocation.large_pool.freed", "allocation.large_pool.peak",
    "allocation.small_pool.allocated", "allocation.small_pool.current",
    "allocation.small_pool.freed", "allocation.small_pool.peak",
    "inactive_split.all.allocated", "inactive_split.all.current",
    "inactive_split.all.freed", "inactive_split.all.peak",
    "inactive_split.large_pool.allocated", "inactive_split.large_pool.current",
    "inactive_split.large_pool.freed", "inactive_split.large_pool.peak",
    "inactive_split.small_pool.allocated", "inactive_split.small_pool.current",
    "inactive_split.small_pool.freed", "inactive_split.small_pool.peak",
    "inactive_split_bytes.all.allocated", "inactive_split_bytes.all.current",
    "inactive_split_bytes.all.freed", "inactive_split_bytes.all.peak",
    "inactive_split_bytes.large_pool.allocated", "inactive_split_bytes.large_pool.current",
    "inactive_split_bytes.large_pool.freed", "inactive_split_bytes.large_pool.peak",
    "inactive_split_bytes.small_pool.allocated", "inactive_split_bytes.small_pool.current",
    "inactive_split_bytes.small_pool.freed", "inactive_split_bytes.small_pool.peak",
    "max_split_size", "num_alloc_retries",
    "num_device_alloc", "num_device_free",
    "num_ooms", "num_sync_all_streams",
    "oversize_allocations.allocated", "oversize_allocations.current",
    "oversize_allocations.freed", "oversize_allocations.peak",
    "oversize_segments.allocated", "oversize_segments.current",
    "oversize_segments.freed", "oversize_segments.peak",
    "requested_bytes.all.allocated", "requested_bytes.all.current",
    "requested_bytes.all.freed", "requested_bytes.all.peak",
    "requested_bytes.large_pool.allocated", "requested_bytes.large_pool.current",
    "requested_bytes.large_pool.freed", "requested_bytes.large_pool.peak",
    "requested_bytes.small_pool.allocated", "requested_bytes.small_pool.current",
    "requested_bytes.small_pool.freed", "requested_bytes.small_pool.peak",
    "reserved_bytes.all.allocated", "reserved_bytes.all.current",
    "reserved_bytes.all.freed", "reserved_bytes.all.peak",
    "reserved_bytes.large_pool.allocated", "reserved_bytes.large_pool.current",
    "reserved_bytes.large_pool.freed", "reserved_bytes.large_pool.peak",
    "reserved_bytes.small_pool.allocated", "reserved_bytes.small_pool.current",
    "reserved_bytes.small_pool.freed", "reserved_bytes.small_pool.peak",
    "segment.all.allocated", "segment.all.current",
    "segment.all.freed", "segment.all.peak",
    "segment.large_pool.allocated", "segment.large_pool.current",
    "segment.large_pool.freed", "segment.large_pool.peak",
    "segment.small_pool.allocated", "segment.small_pool.current",
    "segment.small_pool.freed", "segment.small_pool.peak",
};

static char *stats_json(const tally_stats_t *s)
{
    tu_buf_t b = {0};
    tally_out_t o;
    tally__out_init(&o, tu_buf_write, &b);
    tally__stats_json(s, &o);
    tally__out_flush(&o);
    assert_non_null(b.p);
    return b.p;
}

/* Deterministic values over the whole int64 range, edges included. */
static int64_t next_value(uint64_t *seed)
{
    *seed = *seed * 6364136223846793005u + 1442695040888963407u;
    uint64_t r = *seed >> 11;
    switch (r % 6) {
    case 0: return (int64_t)(r % 1000);
    case 1: return -(int64_t)(r % 100000);
    case 2: return (int64_t)(*seed);
    case 3: return INT64_MAX;
    case 4: return INT64_MIN;
    default: return (int64_t)(r % (UINT64_C(1) << (r % 62)));
    }
}

static void fill_stats(tally_stats_t *s, uint64_t seed)
{
    memset(s, 0, sizeof *s);
    int64_t *f = (int64_t *)(void *)s;
    /* Every int64 field PyTorch has; the three tally-only figures stay 0. */
    size_t n = offsetof(tally_stats_t, largest_free_block) / sizeof(int64_t);
    for (size_t i = 0; i < n; i++)
        f[i] = next_value(&seed);
}

static void test_stats_json_keys_and_order(void **state)
{
    (void)state;
    tally_stats_t s;
    memset(&s, 0, sizeof s);
    s.max_split_size = -1;
    s.num_ooms = 2;
    s.largest_free_block = 99; /* not a memory_stats key: never written */
    char *t = stats_json(&s);
    size_t nkeys = sizeof torch_keys / sizeof torch_keys[0];
    assert_int_equal(nkeys, 122);
    /* Rebuild the expected text from the literal key list: json.dumps form. */
    tu_buf_t want = {0};
    for (size_t i = 0; i < nkeys; i++) {
        char piece[96];
        const char *v = strcmp(torch_keys[i], "max_split_size") == 0 ? "-1"
                        : strcmp(torch_keys[i], "num_ooms") == 0    ? "2"
                                                                    : "0";
        snprintf(piece, sizeof piece, "%s\"%s\": %s", i ? ", " : "{", torch_keys[i], v);
        tu_buf_write(&want, piece, strlen(piece));
    }
    tu_buf_write(&want, "}", 1);
    assert_string_equal(t, want.p);
    assert_null(strstr(t, "largest_free_block"));
    free(want.p);
    free(t);
}

static void test_stats_json_round_trip(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 50; seed++) {
        tally_stats_t s, back;
        char err[256];
        fill_stats(&s, seed);
        char *t = stats_json(&s);
        memset(&back, 0x5a, sizeof back);
        assert_int_equal(tally__stats_from_json(t, strlen(t), &back, err, sizeof err), 0);
        assert_string_equal(err, "");
        assert_memory_equal(&s, &back, sizeof s);
        free(t);
    }
}

static void test_stats_json_lenient_input(void **state)
{
    (void)state;
    static const char text[] =
        " {\"num_ooms\": 2.0, \"unknown\": [1, {\"x\": null}], \"num_alloc_retries\": 1,\n"
        "  \"allocation\": {\"all\": {\"current\": 5, \"peak\": 2e1}, \"huh\": \"ignored\"},\n"
        "  \"oversize_segments\": {\"freed\": -3},\n"
        "  \"reserved_bytes_by_private_pools.0_1.all.current\": 7,\n"
        "  \"num_alloc_retries\": 4} ";
    tally_stats_t s, want;
    char err[256];
    memset(&s, 0x77, sizeof s);
    assert_int_equal(tally__stats_from_json(text, strlen(text), &s, err, sizeof err), 0);
    memset(&want, 0, sizeof want);
    want.num_ooms = 2;
    want.num_alloc_retries = 4; /* the last of a repeated key wins */
    want.allocation[TALLY_POOL_ALL].current = 5;
    want.allocation[TALLY_POOL_ALL].peak = 20;
    want.oversize_segments.freed = -3;
    assert_memory_equal(&s, &want, sizeof s);

    /* Missing keys are 0, not left as they were. */
    memset(&s, 0x77, sizeof s);
    assert_int_equal(tally__stats_from_json("{}", 2, &s, err, sizeof err), 0);
    memset(&want, 0, sizeof want);
    assert_memory_equal(&s, &want, sizeof s);
}

static void expect_stats_error(const char *text, const char *message)
{
    tally_stats_t s, before;
    char err[256];
    memset(&s, 0x33, sizeof s);
    before = s;
    assert_int_equal(tally__stats_from_json(text, strlen(text), &s, err, sizeof err), -TALLY_EINVAL);
    assert_string_equal(err, message);
    assert_memory_equal(&s, &before, sizeof s);
}

static void test_stats_json_errors(void **state)
{
    (void)state;
    expect_stats_error("{\"num_ooms\": 1", "stats JSON: byte 14: unexpected end of input "
                                           "(expected ',' or '}' in the object that starts at byte 0)");
    expect_stats_error("{\"num_ooms\": tru}", "stats JSON: byte 13: invalid literal (expected 'true')");
    expect_stats_error("{\"num_ooms\": 1 2}", "stats JSON: byte 15: expected ',' or '}' in an object, found '2'");
    expect_stats_error("", "stats JSON: byte 0: unexpected end of input (expected a value)");
    expect_stats_error("[1, 2]", "stats JSON: byte 0: expected an object at the top level, got array");
    expect_stats_error("{\"num_ooms\": \"3\"}",
                       "stats JSON: byte 13: key \"num_ooms\": expected an integer, got string");
    expect_stats_error("{\"segment\": {\"all\": {\"peak\": null}}}",
                       "stats JSON: byte 29: key \"segment.all.peak\": expected an integer, got null");
    expect_stats_error("{\"num_ooms\": 1.5}",
                       "stats JSON: byte 13: key \"num_ooms\": expected an integer, got 1.5");
    expect_stats_error("{\"num_ooms\": 9223372036854775808}",
                       "stats JSON: byte 13: key \"num_ooms\": expected an integer, got 9.2233720368547758e+18");
    expect_stats_error("{\"allocation.all.current\": {\"a\": 1}}",
                       "stats JSON: byte 27: key \"allocation.all.current\": expected an integer, got object");
    /* No err buffer: still an error, no crash. */
    tally_stats_t s;
    assert_int_equal(tally__stats_from_json("{", 1, &s, NULL, 0), -TALLY_EINVAL);
    assert_int_equal(tally__stats_from_json(NULL, 0, &s, NULL, 0), -TALLY_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stats_json_keys_and_order),
        cmocka_unit_test(test_stats_json_round_trip),
        cmocka_unit_test(test_stats_json_lenient_input),
        cmocka_unit_test(test_stats_json_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
