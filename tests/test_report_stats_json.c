/* The memory_stats JSON writer and reader (stats_json.c): the keys of
 * torch.cuda.memory_stats() in its order, a round trip over the whole int64
 * range, the lenient input it accepts and the errors it reports. */
#include "testutil.h" /* tu_buf_t, tu_buf_write */
#include <inttypes.h>

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

static int64_t nonneg(uint64_t *seed)
{
    int64_t v = next_value(seed);
    return v == INT64_MIN ? INT64_MAX / 4 : (v < 0 ? -v : v) / 4; /* sums of two stay in range */
}

/* One stat: current <= peak, nothing negative. */
static void fill_stat(tally_stat_t *t, uint64_t *seed)
{
    t->current = nonneg(seed);
    t->peak = t->current + nonneg(seed) % (INT64_MAX / 4);
    t->allocated = nonneg(seed);
    t->freed = nonneg(seed);
}

/* Statistics that add up (what the reader checks): per pool stat, all =
 * small_pool + large_pool for current, allocated and freed, all's peak
 * between the larger pool peak and their sum; the values otherwise drawn
 * widely (0, large, INT64_MAX / 4). The three tally-only figures stay 0. */
static void fill_stats(tally_stats_t *s, uint64_t seed)
{
    memset(s, 0, sizeof *s);
#define TALLY_X_(stat)                                                                          \
    {                                                                                           \
        tally_stat_t *p = s->stat;                                                              \
        fill_stat(&p[TALLY_POOL_SMALL], &seed);                                                 \
        fill_stat(&p[TALLY_POOL_LARGE], &seed);                                                 \
        p[TALLY_POOL_ALL].current = p[TALLY_POOL_SMALL].current + p[TALLY_POOL_LARGE].current;  \
        p[TALLY_POOL_ALL].allocated = p[TALLY_POOL_SMALL].allocated + p[TALLY_POOL_LARGE].allocated; \
        p[TALLY_POOL_ALL].freed = p[TALLY_POOL_SMALL].freed + p[TALLY_POOL_LARGE].freed;        \
        int64_t a = p[TALLY_POOL_SMALL].peak, b = p[TALLY_POOL_LARGE].peak, hi = a > b ? a : b; \
        int64_t lo = p[TALLY_POOL_ALL].current > hi ? p[TALLY_POOL_ALL].current : hi;           \
        p[TALLY_POOL_ALL].peak = lo + nonneg(&seed) % (a + b - lo + 1);                          \
    }
    TALLY_POOL_STATS(TALLY_X_)
#undef TALLY_X_
    fill_stat(&s->oversize_allocations, &seed);
    fill_stat(&s->oversize_segments, &seed);
    s->num_alloc_retries = nonneg(&seed);
    s->num_ooms = nonneg(&seed);
    s->max_split_size = seed % 3 ? nonneg(&seed) : -1;
    s->num_sync_all_streams = nonneg(&seed);
    s->num_device_alloc = nonneg(&seed);
    s->num_device_free = nonneg(&seed);
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
        for (int mode = TALLY_STATS_DUMP; mode <= TALLY_STATS_STRICT; mode++) {
            memset(&back, 0x5a, sizeof back);
            assert_int_equal(tally__stats_from_json_mode(t, strlen(t), &back, mode, err, sizeof err), 0);
            assert_string_equal(err, "");
            assert_memory_equal(&s, &back, sizeof s);
        }
        free(t);
    }
}

static void test_stats_json_lenient_input(void **state)
{
    (void)state;
    /* A PyTorch dump (TALLY_STATS_DUMP): keys of other versions skipped, a
     * family read whole, scalars optional, nested or flat. */
    static const char text[] =
        " {\"num_ooms\": 2.0, \"unknown\": [1, {\"x\": null}], \"num_alloc_retries\": 4,\n"
        "  \"allocation\": {\"all\": {\"current\": 5, \"peak\": 2e1, \"allocated\": 9, \"freed\": 4},\n"
        "                 \"small_pool\": {\"current\": 5, \"peak\": 20, \"allocated\": 9, \"freed\": 4},\n"
        "                 \"large_pool\": {\"current\": 0, \"peak\": 0, \"allocated\": 0, \"freed\": 0},\n"
        "                 \"huh\": \"ignored\"},\n"
        "  \"reserved_bytes_by_private_pools.0_1.all.current\": 7} ";
    tally_stats_t s, want;
    char err[256];
    memset(&s, 0x77, sizeof s);
    assert_int_equal(tally__stats_from_json(text, strlen(text), &s, err, sizeof err), 0);
    memset(&want, 0, sizeof want);
    want.num_ooms = 2;
    want.num_alloc_retries = 4;
    want.allocation[TALLY_POOL_ALL] = (tally_stat_t){5, 20, 9, 4};
    want.allocation[TALLY_POOL_SMALL] = (tally_stat_t){5, 20, 9, 4};
    assert_memory_equal(&s, &want, sizeof s);
    /* The same is damage in a report's own stats (TALLY_STATS_STRICT). */
    assert_int_equal(tally__stats_from_json_mode(text, strlen(text), &s, TALLY_STATS_STRICT, err, sizeof err),
                     -TALLY_EINVAL);
    assert_string_equal(err, "stats JSON: byte 30: unknown key \"unknown\"");

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
    /* Damage in a dump: a typo of a known key, a family cut short, a key
     * twice, counts that do not add up, a negative count. */
    expect_stats_error("{\"num_oom\": 1}", "stats JSON: byte 12: unknown key \"num_oom\" (did you mean \"num_ooms\"?)");
    expect_stats_error("{\"num_ooms\": 1, \"num_ooms\": 2}", "stats JSON: byte 28: key \"num_ooms\" given twice");
    expect_stats_error("{\"segment\": {\"all\": {\"current\": 1}}}",
                       "stats JSON: key \"segment.all.allocated\" is missing (\"segment.all.current\" is there)");
    expect_stats_error("{\"oversize_segments\": {\"current\": 3, \"peak\": 2, \"allocated\": 0, \"freed\": 0}}",
                       "stats JSON: \"oversize_segments.current\" is 3, above \"oversize_segments.peak\" (2)");
    expect_stats_error("{\"num_ooms\": -1}", "stats JSON: \"num_ooms\" is -1, below 0");
    {
        tally_stats_t s;
        fill_stats(&s, 7);
        char *t = stats_json(&s);
        /* One count off by one: all no longer small_pool + large_pool. */
        s.active_bytes[TALLY_POOL_ALL].current += 1;
        char *bad = stats_json(&s);
        char want[200];
        snprintf(want, sizeof want, "stats JSON: \"active_bytes.all.current\" is %" PRId64 ", but small_pool + "
                 "large_pool is %" PRId64, s.active_bytes[TALLY_POOL_ALL].current,
                 s.active_bytes[TALLY_POOL_ALL].current - 1);
        expect_stats_error(bad, want);
        free(bad);
        /* Strict: a key left out is named. */
        char *cut = strstr(t, "\"num_ooms\"");
        assert_non_null(cut);
        memmove(cut, strchr(cut, ',') + 2, strlen(strchr(cut, ',') + 2) + 1);
        tally_stats_t back;
        char err[256];
        assert_int_equal(tally__stats_from_json_mode(t, strlen(t), &back, TALLY_STATS_DUMP, err, sizeof err), 0);
        assert_int_equal(tally__stats_from_json_mode(t, strlen(t), &back, TALLY_STATS_STRICT, err, sizeof err),
                         -TALLY_EINVAL);
        assert_string_equal(err, "stats JSON: key \"num_ooms\" is missing");
        free(t);
    }
    /* The all-pools peak out of its range, above the pools' sum or below the
     * larger pool's peak, with either pool the larger: the message gives
     * the value, the larger peak and the sum. */
    {
        static const struct {
            int64_t small, large, all;
        } peaks[] = {{3000, 5000, 9000}, {3000, 5000, 4000}, {5000, 3000, 4000}, {5000, 3000, 8001}};
        for (size_t i = 0; i < sizeof peaks / sizeof peaks[0]; i++) {
            tally_stats_t s;
            fill_stats(&s, 11);
            for (int p = 0; p < TALLY_POOL_COUNT; p++)
                s.reserved_bytes[p] = (tally_stat_t){0};
            s.reserved_bytes[TALLY_POOL_SMALL].peak = peaks[i].small;
            s.reserved_bytes[TALLY_POOL_LARGE].peak = peaks[i].large;
            s.reserved_bytes[TALLY_POOL_ALL].peak = peaks[i].all;
            char *bad = stats_json(&s);
            char want[200];
            snprintf(want, sizeof want,
                     "stats JSON: \"reserved_bytes.all.peak\" is %" PRId64 ", not between the larger pool peak (%" PRId64
                     ") and their sum (%" PRId64 ")",
                     peaks[i].all, peaks[i].small > peaks[i].large ? peaks[i].small : peaks[i].large,
                     peaks[i].small + peaks[i].large);
            expect_stats_error(bad, want);
            free(bad);
        }
    }
    /* No err buffer: still an error, no crash. */
    tally_stats_t s;
    assert_int_equal(tally__stats_from_json("{", 1, &s, NULL, 0), -TALLY_EINVAL);
    assert_int_equal(tally__stats_from_json(NULL, 0, &s, NULL, 0), -TALLY_EINVAL);
}

/* A key longer than every statistic, or one holding a NUL, matches none:
 * a report's own stats (strict) name it, cut to 40 characters of its
 * family and 40 of its own name; a PyTorch dump skips it, and whatever is
 * nested under it. */
static void test_stats_json_key_too_long_or_holding_a_nul(void **state)
{
    (void)state;
    char a40[41];
    memset(a40, 'a', 40);
    a40[40] = 0;
    char text[200], want[200], err[256];
    tally_stats_t s;
    /* Nested: the family's name is the prefix the message shows. */
    snprintf(text, sizeof text, "{\"allocation\": {\"%sbbb\": 1}}", a40);
    size_t at = (size_t)(strstr(text, ": 1") + 2 - text);
    assert_int_equal(tally__stats_from_json_mode(text, strlen(text), &s, TALLY_STATS_STRICT, err, sizeof err),
                     -TALLY_EINVAL);
    snprintf(want, sizeof want, "stats JSON: byte %zu: key \"allocation.%s...\" is not a statistic", at, a40);
    assert_string_equal(err, want);
    memset(&s, 0x77, sizeof s);
    assert_int_equal(tally__stats_from_json_mode(text, strlen(text), &s, TALLY_STATS_DUMP, err, sizeof err), 0);
    assert_int_equal(s.allocation[TALLY_POOL_ALL].current, 0);
    /* At the top level, an object under the long name is not read either. */
    snprintf(text, sizeof text, "{\"%saaaaaaaaaa\": {\"num_ooms\": 3}, \"num_ooms\": 1}", a40);
    assert_int_equal(tally__stats_from_json_mode(text, strlen(text), &s, TALLY_STATS_DUMP, err, sizeof err), 0);
    assert_int_equal(s.num_ooms, 1);
    assert_int_equal(tally__stats_from_json_mode(text, strlen(text), &s, TALLY_STATS_STRICT, err, sizeof err),
                     -TALLY_EINVAL);
    snprintf(want, sizeof want, "stats JSON: byte %d: key \"%s...\" is not a statistic", 55, a40);
    assert_string_equal(err, want);
    /* A NUL inside a key: the message shows the name up to it. */
    static const char nul[] = "{\"num\\u0000ooms\": 2}";
    memset(&s, 0x77, sizeof s);
    assert_int_equal(tally__stats_from_json_mode(nul, strlen(nul), &s, TALLY_STATS_DUMP, err, sizeof err), 0);
    assert_int_equal(s.num_ooms, 0);
    assert_int_equal(tally__stats_from_json_mode(nul, strlen(nul), &s, TALLY_STATS_STRICT, err, sizeof err),
                     -TALLY_EINVAL);
    assert_string_equal(err, "stats JSON: byte 18: key \"num...\" is not a statistic");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stats_json_keys_and_order),
        cmocka_unit_test(test_stats_json_round_trip),
        cmocka_unit_test(test_stats_json_lenient_input),
        cmocka_unit_test(test_stats_json_errors),
        cmocka_unit_test(test_stats_json_key_too_long_or_holding_a_nul),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
