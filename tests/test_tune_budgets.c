/* Tests for tally tune's budgets and exit codes, run as a user runs it
 * (the built ../bin/tally) on CSV traces written here: each row's least
 * device memory, found by bisection (where the search stops, a row that
 * runs out in the device given or in every capacity tried, a least that is
 * a device the row runs in), --capacity, the call budget (its default and
 * --max-calls), --max-driver-time (priced by tests/standin/cost.c's table),
 * and the refusal when no row keeps to them: status 1 and one line naming
 * the least any setting needs (the first row of a tie). The slowest of
 * tally tune's tests (TALLY_TEST_FILTER runs some). Expected figures are
 * worked out by hand in the comments. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cliutil.h"
#include "report/json.h"
#include "tuneutil.h"

/* The default call budget is 4 x the default row's backend calls (device
 * allocations and frees), at least 64. Each trace takes N blocks of 30 MiB
 * and frees them, then M blocks of BIG MiB in 1 GiB: the default makes N + M
 * allocations and, when a BIG block does not fit, frees the N cached
 * segments. 20 and 20 x 50 MiB: 60 calls, a budget of 240 (allocations
 * alone would give 160); 8 and 4 x 200 MiB: 20 calls, 80 (12 allocations
 * alone stay under 64). */
static void expect_budget(int n, int m, int big, int64_t calls, int64_t allocs, int64_t budget)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/budget.csv", scratch);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("op,id,size,stream\n", f);
    for (int i = 1; i <= n; i++)
        fprintf(f, "a,%d,%d,0\n", i, 30 << 20);
    for (int i = 1; i <= n; i++)
        fprintf(f, "f,%d,%d,0\n", i, 30 << 20);
    for (int i = n + 1; i <= n + m; i++)
        fprintf(f, "a,%d,%d,0\n", i, big << 20);
    fclose(f);
    tally_json_t *rows = tune_json(path, "--capacity 1GiB");
    assert_int_equal(jint(&rows->items[0], "backend_calls"), calls);
    assert_int_equal(jint(&rows->items[0], "device_allocs"), allocs);
    tally__json_free(rows);
    run_t r = tune("--capacity 1GiB '%s'", path);
    assert_int_equal(r.rc, 0);
    char want[128];
    snprintf(want, sizeof want, "; capacity 1024.0 MiB; call budget %lld\n", (long long)budget);
    if (!strstr(r.out, want))
        fail_msg("want '%s' in the table:\n%s", want, r.out);
    run_free(&r);
}

static void test_default_call_budget_counts_allocations_and_frees(void **state)
{
    (void)state;
    expect_budget(20, 20, 50, 60, 40, 240);
    expect_budget(8, 4, 200, 20, 12, 80);
}

/* Each row's least device memory, by bisection: the default needs its
 * 52 MiB (every block is live to the end, nothing cached to release); with
 * 50 MiB it runs out at event 2, the 5 MiB block, with 30 MiB + 1000 B live. */
static void test_least_memory(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    three_csv(path, sizeof path);
    tally_json_t *rows = tune_json(path, "--capacity 1GiB");
    const tally_json_t *def = &rows->items[0];
    assert_int_equal(jint(def, "min_device_bytes"), 52 * MiB);
    const tally_json_t *out = tally__json_get(def, "runs_out");
    assert_non_null(out);
    assert_int_equal(jint(out, "capacity_bytes"), 50 * MiB);
    assert_int_equal(jint(out, "event"), 2);
    assert_int_equal(jint(out, "size"), 5242880);
    assert_int_equal(jint(out, "live_bytes"), 31457280 + 1000);
    assert_int_equal(jint(row_of(rows, "large_segment_size_mb:4", "PyTorch/tally"), "min_device_bytes"), 38 * MiB);
    /* A memory fraction caps at a share of the device, so no least memory is
     * searched: null, with no lower bound given. */
    size_t fractions = 0;
    for (size_t k = 0; k < rows->len; k++) {
        const tally_json_t *r = &rows->items[k];
        if (!strstr(tally__json_get(r, "setting")->s, "memory_fraction:"))
            continue;
        fractions++;
        const tally_json_t *m = tally__json_get(r, "min_device_bytes");
        assert_non_null(m);
        assert_int_equal(m->type, TALLY_JSON_NULL);
        assert_null(tally__json_get(r, "min_device_bytes_above"));
    }
    assert_true(fractions > 0);
    tally__json_free(rows);
}

/* The bisection stops once its bracket is within its step, 0.1% of the
 * upper end (2 MiB at least), as docs/tune.md says: tie.csv frees four
 * 1 MiB small blocks (4 MiB of cached small segments), then takes 3996 MiB.
 * The default reserves 4000 MiB and needs only 3996 (the cache is released
 * when memory runs short); the bracket 3996 to 4000 MiB is exactly 4 MiB
 * wide, 0.1% of 4000 MiB, so no replay inside it is made and the answer is
 * its upper end, 4000 MiB (the row ran out nowhere, so the replay a step
 * below, at 3998 MiB, only looks for where it would). */
static void test_least_memory_stops_at_a_bracket_as_wide_as_its_step(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/tie.csv", scratch);
    write_text(path, "op,id,size,stream\na,1,1048576,0\na,2,1048576,0\na,3,1048576,0\na,4,1048576,0\n"
                     "f,1,1048576,0\nf,2,1048576,0\nf,3,1048576,0\nf,4,1048576,0\na,5,4190109696,0\n"
                     "f,5,4190109696,0\n");
    tally_json_t *rows = tune_json(path, "");
    const tally_json_t *def = &rows->items[0];
    assert_int_equal(jint(def, "peak_live_bytes"), 3996 * MiB);
    assert_int_equal(jint(def, "peak_reserved_bytes"), 4000 * MiB);
    assert_int_equal(jint(def, "min_device_bytes"), 4000 * MiB);
    tally__json_free(rows);
}

/* A row that runs out in the device given (--capacity) says it ran out
 * there, with the least memory found above it: three.csv's default row
 * needs 52 MiB, so in 51 MiB it runs out at its third allocation (5 MiB,
 * with 30 MiB + 1000 B live), and the search finds 52 MiB, 1 MiB above.
 * The search's extra replay a step below the least (for a row that never
 * ran out) must not move it to 50 MiB, a capacity the user did not give. */
static void test_least_memory_just_above_the_device_given(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    three_csv(path, sizeof path);
    run_t r = tune("--json --capacity 51MiB '%s'", path);
    assert_int_equal(r.rc, 0);
    tally_json_t *rows = tally__json_parse(r.out, strlen(r.out), NULL, 0, NULL);
    assert_non_null(rows);
    run_free(&r);
    const tally_json_t *def = &rows->items[0];
    assert_false(jtrue(def, "fits"));
    assert_string_equal(tally__json_get(def, "setting")->s, "");
    assert_int_equal(jint(def, "oom_event"), 2);
    assert_int_equal(jint(def, "min_device_bytes"), 52 * MiB);
    const tally_json_t *out = tally__json_get(def, "runs_out");
    assert_non_null(out);
    assert_int_equal(jint(out, "capacity_bytes"), 51 * MiB);
    assert_int_equal(jint(out, "event"), 2);
    assert_int_equal(jint(out, "size"), 5242880);
    assert_int_equal(jint(out, "live_bytes"), 31457280 + 1000);
    tally__json_free(rows);
}

/* A row that runs out in the device given and in twice that says it ran
 * out in the larger of the two, the largest capacity found too small: one
 * allocation of 30 MiB + 1000 B (segments of 32 MiB) with --capacity of
 * 15.75 MiB runs out there and in 31.5 MiB (above its 30 MiB + 1000 B of
 * live bytes, so replayed), fits in 63 MiB; the search finds 32 MiB, with
 * no capacity it tries between 31.5 and 32 MiB (2 MiB steps). */
static void test_least_memory_runs_out_in_the_largest_capacity_tried(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/one-block.csv", scratch);
    write_text(path, "op,id,size,stream\na,1,31458280,0\n");
    run_t r = tune("--json --capacity 16515072 '%s'", path);
    assert_int_equal(r.rc, 1); /* nothing fits 15.75 MiB */
    tally_json_t *rows = tally__json_parse(r.out, strlen(r.out), NULL, 0, NULL);
    assert_non_null(rows);
    run_free(&r);
    const tally_json_t *def = &rows->items[0];
    assert_string_equal(tally__json_get(def, "setting")->s, "");
    assert_int_equal(jint(def, "oom_event"), 0);
    assert_int_equal(jint(def, "min_device_bytes"), 32 * MiB);
    const tally_json_t *out = tally__json_get(def, "runs_out");
    assert_non_null(out);
    assert_int_equal(jint(out, "capacity_bytes"), 33030144);
    assert_int_equal(jint(out, "event"), 0);
    assert_int_equal(jint(out, "size"), 31458280);
    tally__json_free(rows);
}

/* The least memory a row reports is a device it runs in: run again with
 * --capacity set to that figure, the row fits, without running out. The
 * trace has a row that needs more than its own peak: tally's expandable
 * segments with idle pages that may move (expandable_move_budget:-1)
 * reserve 102 MiB at most (the 60 MiB block's pages move to the 100 MiB
 * one), but the 100 MiB block goes past the 60 MiB hole, at 62 MiB, and the
 * stream's address range is 1 1/8 of the device: 102 MiB of memory hold the
 * pages, and only a device of 144 MiB has the addresses. The search must
 * not take the peak as the least without trying it. */
static void test_least_memory_of_every_row_is_a_device_it_runs_in(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/needs-more-than-its-peak.csv", scratch);
    write_text(path, "op,id,size,stream\na,7,62914560,0\na,17,2097152,0\nf,7,0,0\na,18,104857600,0\n");
    run_t r = tune("--json '%s'", path);
    assert_int_equal(r.rc, 0);
    tally_json_t *rows = tally__json_parse(r.out, strlen(r.out), NULL, 0, NULL);
    assert_non_null(rows);
    run_free(&r);
    int checked = 0;
    for (size_t i = 0; i < rows->len; i++) {
        const tally_json_t *row = &rows->items[i];
        const tally_json_t *least = tally__json_get(row, "min_device_bytes");
        if (!least || least->type == TALLY_JSON_NULL)
            continue;
        const char *setting = tally__json_get(row, "setting")->s, *alloc = tally__json_get(row, "allocator")->s;
        run_t again = tune("--json --capacity %lld '%s'", (long long)jint(row, "min_device_bytes"), path);
        assert_int_equal(again.rc == 0 || again.rc == 1, 1); /* 1: no row fits for PyTorch's or tally's pick */
        tally_json_t *in = tally__json_parse(again.out, strlen(again.out), NULL, 0, NULL);
        assert_non_null(in);
        const tally_json_t *same = row_of(in, setting, alloc);
        if (!jtrue(same, "fits") || tally__json_get(same, "oom_event"))
            fail_msg("row '%s' (%s) reports a least of %lld bytes, but does not run in a device of that size", setting,
                     alloc, (long long)jint(row, "min_device_bytes"));
        tally__json_free(in);
        run_free(&again);
        checked++;
    }
    assert_true(checked >= 10);
    const tally_json_t *moving = row_of(rows, "expandable_segments:True,expandable_move_budget:-1", "tally");
    if (!(jint(moving, "min_device_bytes") > jint(moving, "peak_reserved_bytes")))
        fail_msg("the moving row no longer needs more than its peak (%lld, least %lld): this trace does not test "
                 "the search's check of the peak any more",
                 (long long)jint(moving, "peak_reserved_bytes"), (long long)jint(moving, "min_device_bytes"));
    tally__json_free(rows);
}

/* tune's refusal when nothing qualifies: status 1, one line on stderr
 * holding want, and no row marked as recommended in the table. */
static void expect_refusal(run_t r, const char *want)
{
    if (r.rc != 1 || !strstr(r.err, want) || strchr(r.err, '\n') != r.err + strlen(r.err) - 1 ||
        strstr(r.out, "<- PyTorch") || strstr(r.out, "<- tally"))
        fail_msg("status %d (want 1), stderr '%s' (want one line with '%s'), stdout:\n%s", r.rc, r.err, want, r.out);
    run_free(&r);
}

/* --capacity: a row that does not fit is marked and never recommended;
 * when none fits, status 1 and one line naming the least any needs. */
static void test_capacity(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    three_csv(path, sizeof path);
    /* 40 MiB: the default (52 MiB) does not fit, large_segment_size_mb:4 (38 MiB) does. */
    run_t r = tune("--json --capacity 40MiB '%s'", path);
    assert_int_equal(r.rc, 0);
    tally_json_t *rows = tally__json_parse(r.out, strlen(r.out), NULL, 0, NULL);
    assert_non_null(rows);
    assert_false(jtrue(&rows->items[0], "fits"));
    assert_false(jtrue(&rows->items[0], "recommended"));
    assert_false(jtrue(&rows->items[0], "recommended_tally"));
    assert_true(jtrue(row_of(rows, "large_segment_size_mb:4", "PyTorch/tally"), "recommended"));
    for (size_t k = 0; k < rows->len; k++)
        if (!jtrue(&rows->items[k], "fits"))
            assert_false(jtrue(&rows->items[k], "recommended") || jtrue(&rows->items[k], "recommended_tally"));
    tally__json_free(rows);
    run_free(&r);
    r = tune("--capacity 40MiB '%s'", path);
    assert_int_equal(r.rc, 0);
    if (!strstr(r.out, "\n(default) ") || !strstr(r.out, "  no  in 40.0 MiB at 2: 5.0 MiB, 30.0 MiB"))
        fail_msg("the default row is not marked as not fitting:\n%s", r.out);
    run_free(&r);
    /* 30 MiB: less than the peak of live bytes (35 MiB); nothing fits. */
    expect_refusal(tune("--capacity 30MiB '%s'", path), "no setting fits 30.0 MiB: the least needs 38.0 MiB (");
    /* 1000 TiB in one allocation: no memory tried holds it. */
    snprintf(path, sizeof path, "%s/huge.csv", scratch);
    write_text(path, "op,id,size,stream\na,1,1099511627776000,0\nf,1,1099511627776000,0\n");
    expect_refusal(tune("'%s'", path), "no setting fits 80.00 GiB: the least needs at least 1000.0 TiB");
    /* The same after allocations that did fit (so every row made backend calls): still no least known. */
    snprintf(path, sizeof path, "%s/huge-late.csv", scratch);
    write_text(path, "op,id,size,stream\na,1,1048576,0\na,2,1099511627776000,0\nf,2,1099511627776000,0\nf,1,1048576,0\n");
    expect_refusal(tune("'%s'", path), "no setting fits 80.00 GiB: the least needs at least 1000.0 TiB");
}

/* --max-calls: kept to, or status 1 naming the least any setting needs
 * (0: even the default, 3 calls here, is over it; the least is the fewest
 * calls of any fitting row). */
static void test_max_calls(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    three_csv(path, sizeof path);
    /* The least calls any fitting row makes (3 for the default: its three segments). */
    tally_json_t *all = tune_json(path, "--capacity 1GiB");
    int64_t least = INT64_MAX;
    for (size_t k = 0; k < all->len; k++)
        if (jtrue(&all->items[k], "fits") && jint(&all->items[k], "backend_calls") < least)
            least = jint(&all->items[k], "backend_calls");
    assert_int_equal(jint(&all->items[0], "backend_calls"), 3);
    assert_true(least >= 1 && least <= 3);
    tally__json_free(all);
    char want[128];
    snprintf(want, sizeof want, "no setting keeps within 0 backend calls: the least any setting needs is %lld (",
             (long long)least);
    expect_refusal(tune("--capacity 1GiB --max-calls 0 '%s'", path), want);
    tally_json_t *rows = tune_json(path, "--capacity 1GiB --max-calls 3");
    for (size_t k = 0; k < rows->len; k++)
        if (jtrue(&rows->items[k], "recommended") || jtrue(&rows->items[k], "recommended_tally"))
            assert_true(jint(&rows->items[k], "backend_calls") <= 3);
    tally__json_free(rows);
    /* The count is decimal: 19 is nineteen, not refused for its 9. */
    rows = tune_json(path, "--capacity 1GiB --max-calls 19");
    assert_true(rows->len > 0);
    tally__json_free(rows);
}

/* When several rows tie at the least calls or the least driver time, the
 * refusal names the first of them in the table's order: one block of 30 MiB,
 * which most settings serve with one device allocation (the default first). */
static void test_refusal_names_the_first_row_of_a_tie(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/one.csv", scratch);
    write_text(path, "op,id,size,stream\na,1,31457280,0\n");
    tally_json_t *rows = tune_json(path, "--capacity 1GiB");
    static const char *const key[2] = {"backend_calls", "driver_us_a100"};
    for (int by = 0; by < 2; by++) {
        double least = 1e300;
        size_t first = 0, ties = 0;
        for (size_t k = 0; k < rows->len; k++) {
            if (!jtrue(&rows->items[k], "fits"))
                continue;
            double v = by ? jnum(&rows->items[k], key[by]) : (double)jint(&rows->items[k], key[by]);
            if (v < least)
                least = v, first = k, ties = 1;
            else if (v == least)
                ties++;
        }
        if (ties < 2)
            fail_msg("one.csv: no tie at the least %s (%g): the test needs one", key[by], least);
        const char *setting = tally__json_get(&rows->items[first], "setting")->s;
        const char *allocator = tally__json_get(&rows->items[first], "allocator")->s;
        char want[512];
        if (by)
            snprintf(want, sizeof want,
                     "no setting keeps within 0.0 ms of driver time (A100): the least any setting needs is %.1f ms "
                     "(%s, %s)\n",
                     least / 1000.0, setting[0] ? setting : "the default", allocator);
        else
            snprintf(want, sizeof want,
                     "no setting keeps within 0 backend calls: the least any setting needs is %.0f (%s, %s)\n", least,
                     setting[0] ? setting : "the default", allocator);
        run_t r = by ? tune("--capacity 1GiB --max-driver-time 0 '%s'", path)
                     : tune("--capacity 1GiB --max-calls 0 '%s'", path);
        if (r.rc != 1 || !strstr(r.err, want))
            fail_msg("status %d, stderr '%s'; want '%s'", r.rc, r.err, want);
        run_free(&r);
    }
    tally__json_free(rows);
}

/* --max-driver-time: the modelled driver time of tests/standin/cost.c's
 * table. three.csv's default makes 3 cuMemAlloc: 3 x 230.45 us on the A100,
 * 3 x 83.8 on the Blackwell. PyTorch's expandable segments (the model) map 3
 * pages in 3 runs over 2 ranges: 3 x (193 cuMemCreate + 1.45 cuMemMap + 36
 * cuMemSetAccess) + 2 x 19 cuMemAddressReserve = 729.35 us on the A100. */

static void test_max_driver_time(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    three_csv(path, sizeof path);
    tally_json_t *rows = tune_json(path, "--capacity 1GiB");
    assert_float_equal(jnum(&rows->items[0], "driver_us_a100"), 691.35, 0.06);
    assert_float_equal(jnum(&rows->items[0], "driver_us_blackwell"), 251.4, 0.06);
    assert_float_equal(jnum(row_of(rows, "expandable_segments:True", "PyTorch (model)"), "driver_us_a100"), 729.35, 0.06);
    /* A budget under every row's time: refused, naming the least (whichever row that is). */
    double least = 1e300;
    for (size_t k = 0; k < rows->len; k++)
        if (jtrue(&rows->items[k], "fits") && jnum(&rows->items[k], "driver_us_a100") < least)
            least = jnum(&rows->items[k], "driver_us_a100");
    tally__json_free(rows);
    assert_true(least > 100 && least <= 691.35 + 0.06);
    char want[160];
    snprintf(want, sizeof want,
             "no setting keeps within 0.1 ms of driver time (A100): the least any setting needs is %.1f ms (",
             least / 1000.0);
    expect_refusal(tune("--capacity 1GiB --max-driver-time 0.1ms '%s'", path), want);
    /* A budget of 0 (or anything under 1 us) is still a budget: the table's two "no setting fits" lines name
     * it, and without --max-driver-time they name only the calls. */
    run_t r = tune("--capacity 1GiB --max-driver-time 0 '%s'", path);
    if (r.rc != 1 ||
        !strstr(r.out, "\nPyTorch's allocator: no setting fits in 1024.0 MiB within 64 backend calls and 0.0 ms of "
                       "driver time\n") ||
        !strstr(r.out, "\ntally: no setting fits in 1024.0 MiB within 64 backend calls and 0.0 ms of driver time\n") ||
        !strstr(r.err, "no setting keeps within 0.0 ms of driver time (A100)"))
        fail_msg("--max-driver-time 0: status %d, stderr '%s', stdout:\n%s", r.rc, r.err, r.out);
    run_free(&r);
    r = tune("--capacity 1GiB --max-calls 0 '%s'", path);
    if (r.rc != 1 || !strstr(r.out, "\nPyTorch's allocator: no setting fits in 1024.0 MiB within 0 backend calls\n") ||
        !strstr(r.out, "\ntally: no setting fits in 1024.0 MiB within 0 backend calls\n"))
        fail_msg("--max-calls 0: status %d, stderr '%s', stdout:\n%s", r.rc, r.err, r.out);
    run_free(&r);
    rows = tune_json(path, "--capacity 1GiB --gpu Blackwell --max-driver-time 300us");
    assert_non_null(rows);
    for (size_t k = 0; k < rows->len; k++)
        if (jtrue(&rows->items[k], "recommended") || jtrue(&rows->items[k], "recommended_tally"))
            assert_true(jnum(&rows->items[k], "driver_us_blackwell") <= 300);
    tally__json_free(rows);
    expect_one_line_error(tune("--max-driver-time 5min '%s'", path), 2, "--max-driver-time '5min' is not a duration");
    expect_one_line_error(tune("--gpu H100 '%s'", path), 2, "--gpu 'H100' is not a column of the driver cost table");
    /* Numbers that are empty or end in something else are not numbers. */
    expect_one_line_error(tune("--max-calls '' '%s'", path), 2, "--max-calls '' is not a non-negative integer");
    expect_one_line_error(tune("--max-calls 3x '%s'", path), 2, "--max-calls '3x' is not a non-negative integer");
    expect_one_line_error(tune("--jobs '' '%s'", path), 2, "--jobs '' is not an integer from 1 to 256");
    expect_one_line_error(tune("--jobs 257 '%s'", path), 2, "--jobs '257' is not an integer from 1 to 256");
    /* An empty --device would read as device 0 (strtol of "" is 0); it is refused like any other non-number
     * (on a CSV trace, which takes no --device at all, the value is checked first). */
    expect_one_line_error(tune("--device '' '%s'", path), 2, "--device '' is not a device number");
    expect_one_line_error(tune("--device '' '%s/small.pickle'", fixtures), 2, "--device '' is not a device number");
}

/* The move budget's row (expandable_move_budget:10000) is the middle way a
 * driver-time limit finds: two 20 MiB holes around a live block, then a 40
 * MiB block that fits in neither. Expandable segments without moves map 10
 * new pages (80 MiB); with moves the first hole's pages go under the block
 * (60 MiB, the peak live). Unlimited moves make a handle per page (about 7
 * ms at A100 costs); within 10 ms a step one handle per map call and one
 * move (about 1 ms). Under a 2 ms limit tally's recommendation is the
 * budget's row, at the unlimited row's memory. */
static void test_move_budget_row_serves_a_driver_time_limit(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/holes.csv", scratch);
    write_text(path, "op,id,size,stream\na,1,20971520,0\na,2,20971520,0\na,3,20971520,0\nf,1,0,0\nf,3,0,0\n"
                     "a,4,41943040,0\n");
    tally_json_t *rows = tune_json(path, "--capacity 1GiB");
    const tally_json_t *still = row_of(rows, "expandable_segments:True", "tally");
    const tally_json_t *budget = row_of(rows, "expandable_segments:True,expandable_move_budget:10000", "tally");
    const tally_json_t *free_moves = row_of(rows, "expandable_segments:True,expandable_move_budget:-1", "tally");
    assert_int_equal(jint(still, "peak_reserved_bytes"), 80 * 1048576);
    assert_int_equal(jint(budget, "peak_reserved_bytes"), 60 * 1048576);
    assert_int_equal(jint(free_moves, "peak_reserved_bytes"), 60 * 1048576);
    assert_true(jnum(budget, "driver_us_a100") < 2000 && jnum(free_moves, "driver_us_a100") > 2000);
    tally__json_free(rows);
    rows = tune_json(path, "--capacity 1GiB --max-driver-time 2ms");
    assert_true(jtrue(row_of(rows, "expandable_segments:True,expandable_move_budget:10000", "tally"),
                      "recommended_tally"));
    tally__json_free(rows);
}

static int setup(void **state)
{
    (void)state;
    char bin[PATH_MAX - 64]; /* .../build/tests */
    return tune_setup("test_tune_budgets", "/tmp/tally-tune-budgets-XXXXXX", bin, sizeof bin);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_call_budget_counts_allocations_and_frees),
        cmocka_unit_test(test_least_memory),
        cmocka_unit_test(test_least_memory_just_above_the_device_given),
        cmocka_unit_test(test_least_memory_stops_at_a_bracket_as_wide_as_its_step),
        cmocka_unit_test(test_least_memory_runs_out_in_the_largest_capacity_tried),
        cmocka_unit_test(test_least_memory_of_every_row_is_a_device_it_runs_in),
        cmocka_unit_test(test_capacity),
        cmocka_unit_test(test_max_calls),
        cmocka_unit_test(test_refusal_names_the_first_row_of_a_tie),
        cmocka_unit_test(test_max_driver_time),
        cmocka_unit_test(test_move_budget_row_serves_a_driver_time_limit),
    };
    tune_test_filter();
    return cmocka_run_group_tests(tests, setup, tune_teardown);
}
