/* bench/alias_model.c: the model of mapping idle handles at second
 * addresses (tally-steps --alias-model; docs/benchmarks.md, run N). Small
 * page patterns whose handles and driver calls are known by hand: a handle
 * reused at a second page, a conflict (the page unmapped and given another
 * handle), the own policy settling where lowest keeps moving handles, the
 * static assignment's count, pages of several 2 MiB, and the modelled time
 * from the cost table. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "alias_model.h"
#include "../tests/standin/cost.h"

#define MiB ((uintptr_t)1 << 20)
#define PG (2 * MiB)
/* Page n of an address range far from 0 (the model keys on page numbers). */
#define AT(n) ((uintptr_t)0x140000000000ull + (uintptr_t)(n) * PG) /* a multiple of 20 MiB */

static alias_counts_t counts(const alias_model_t *m)
{
    alias_counts_t c;
    alias_model_counts(m, &c);
    return c;
}

static uint64_t calls(const alias_counts_t *c)
{
    return c->create + c->map + c->access + c->unmap + c->sync;
}

/* Pages A and B busy at different times share one handle: B maps A's idle
 * handle (a map and an access, no create), and A and B then take turns with
 * no call at all. */
static void test_idle_handle_serves_a_second_page(void **state)
{
    (void)state;
    alias_model_t *m = alias_model_new(ALIAS_OWN, 1);
    assert_non_null(m);
    assert_int_equal(alias_model_take(m, AT(0), PG), 0);
    alias_counts_t c = counts(m);
    assert_int_equal(c.create, 1);
    assert_int_equal(c.map, 1);
    assert_int_equal(c.access, 1);
    alias_model_give(m, AT(0), PG);
    assert_int_equal(alias_model_take(m, AT(5), PG), 0);
    c = counts(m);
    assert_int_equal(c.handles, 1);
    assert_int_equal(c.create, 1);
    assert_int_equal(c.map, 2);
    alias_model_give(m, AT(5), PG);
    uint64_t before = calls(&c);
    for (int round = 0; round < 3; round++) {
        assert_int_equal(alias_model_take(m, AT(0), PG), 0);
        alias_model_give(m, AT(0), PG);
        assert_int_equal(alias_model_take(m, AT(5), PG), 0);
        alias_model_give(m, AT(5), PG);
    }
    c = counts(m);
    assert_int_equal(calls(&c), before);
    assert_int_equal(c.handles, 1);
    alias_model_note_small(m, 3 * MiB);
    assert_int_equal(counts(m).peak_reserved, PG + 3 * MiB);
    assert_int_equal(alias_model_static(m), 1);
    alias_model_free(m);
}

/* A block over two pages makes both busy (two handles); a second block on
 * one of them does not count it twice: the page stays busy until both go. */
static void test_pages_a_block_touches(void **state)
{
    (void)state;
    alias_model_t *m = alias_model_new(ALIAS_OWN, 1);
    assert_int_equal(alias_model_take(m, AT(1) + PG / 2, PG), 0); /* pages 1 and 2 */
    assert_int_equal(counts(m).handles, 2);
    assert_int_equal(alias_model_take(m, AT(2) + PG / 2, 4096), 0); /* page 2 again */
    assert_int_equal(counts(m).handles, 2);
    alias_model_give(m, AT(1) + PG / 2, PG); /* page 2 still busy: its handle is not idle */
    assert_int_equal(alias_model_take(m, AT(9), PG), 0);
    assert_int_equal(counts(m).handles, 2); /* page 1's idle handle */
    assert_int_equal(alias_model_take(m, AT(10), PG), 0);
    assert_int_equal(counts(m).handles, 3); /* page 2's is still in use */
    alias_model_free(m);
}

/* A's handle went to B; A busy again while B is: A is unmapped (a
 * synchronise and an unmap) and, under own, gets a new handle of its own;
 * from then on A and B busy together or apart make no call. */
static void test_conflict_unmaps_and_own_settles(void **state)
{
    (void)state;
    alias_model_t *m = alias_model_new(ALIAS_OWN, 1);
    alias_model_take(m, AT(0), PG);
    alias_model_give(m, AT(0), PG);
    alias_model_take(m, AT(1), PG); /* B takes A's idle handle */
    alias_model_take(m, AT(0), PG); /* A: conflict */
    alias_counts_t c = counts(m);
    assert_int_equal(c.sync, 1);
    assert_int_equal(c.unmap, 1);
    assert_int_equal(c.create, 2);
    assert_int_equal(c.map, 3);
    uint64_t settled = calls(&c);
    for (int round = 0; round < 4; round++) {
        alias_model_give(m, AT(0), PG);
        alias_model_give(m, AT(1), PG);
        alias_model_take(m, AT(round % 2), PG);
        alias_model_take(m, AT(1 - round % 2), PG);
    }
    c = counts(m);
    assert_int_equal(calls(&c), settled);
    assert_int_equal(c.handles, 2);
    alias_model_free(m);
}

/* Three pages, two busy at a time in a repeating pattern (A+B, B+C, C+A):
 * lowest hands the idle handle to whichever page comes next and keeps
 * unmapping; own stops once each page has a handle no other page needs at
 * the same time. Both reach the same peak of 2 handles first. */
static void pattern(alias_model_t *m, int rounds)
{
    for (int r = 0; r < rounds; r++) {
        alias_model_take(m, AT(0), PG);
        alias_model_take(m, AT(1), PG);
        alias_model_give(m, AT(0), PG);
        alias_model_take(m, AT(2), PG);
        alias_model_give(m, AT(1), PG);
        alias_model_take(m, AT(0), PG);
        alias_model_give(m, AT(2), PG);
        alias_model_give(m, AT(0), PG);
    }
}

static void test_own_settles_where_lowest_keeps_moving(void **state)
{
    (void)state;
    alias_model_t *low = alias_model_new(ALIAS_LOWEST, 1), *own = alias_model_new(ALIAS_OWN, 1);
    pattern(low, 2);
    pattern(own, 2);
    alias_counts_t l2 = counts(low), o2 = counts(own);
    pattern(low, 3);
    pattern(own, 3);
    alias_counts_t l5 = counts(low), o5 = counts(own);
    assert_true(calls(&l5) > calls(&l2)); /* still remapping */
    assert_int_equal(calls(&o5), calls(&o2)); /* settled */
    assert_int_equal(l5.handles, 2);
    assert_int_equal(o5.handles, 3);
    /* Offline, the three pages pairwise overlap: three handles. */
    assert_int_equal(alias_model_static(own), 3);
    alias_model_free(low);
    alias_model_free(own);
}

/* Pages of 10 x 2 MiB: two blocks in one 20 MiB page are one page and one
 * handle; the peak counts whole handles. */
static void test_pages_of_several_granules(void **state)
{
    (void)state;
    alias_model_t *m = alias_model_new(ALIAS_OWN, 10);
    assert_int_equal(alias_model_page(m), 10 * PG);
    alias_model_take(m, AT(0), PG);
    alias_model_take(m, AT(3), PG);
    assert_int_equal(counts(m).handles, 1);
    alias_model_take(m, AT(10), PG);
    assert_int_equal(counts(m).handles, 2);
    alias_model_note_small(m, 0);
    assert_int_equal(counts(m).peak_reserved, 2 * 10 * PG);
    alias_model_free(m);
}

/* The modelled time is the cost table's, call by call. */
static void test_time_from_the_cost_table(void **state)
{
    (void)state;
    alias_counts_t c = {.create = 2, .map = 3, .access = 3, .unmap = 1, .sync = 1};
    for (int col = 0; col < SI_COST_COLUMNS; col++) {
        double want = 2 * si_cost_row("cuMemCreate")->us[col] + 3 * si_cost_row("cuMemMap")->us[col] +
                      3 * si_cost_row("cuMemSetAccess")->us[col] + si_cost_row("cuMemUnmap")->us[col] +
                      si_cost_row("cuStreamSynchronize")->us[col];
        assert_float_equal(alias_model_us(&c, col), want, 1e-9);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_idle_handle_serves_a_second_page),
        cmocka_unit_test(test_pages_a_block_touches),
        cmocka_unit_test(test_conflict_unmaps_and_own_settles),
        cmocka_unit_test(test_own_settles_where_lowest_keeps_moving),
        cmocka_unit_test(test_pages_of_several_granules),
        cmocka_unit_test(test_time_from_the_cost_table),
    };
    return cmocka_run_group_tests_name("bench_alias_model", tests, NULL, NULL);
}
