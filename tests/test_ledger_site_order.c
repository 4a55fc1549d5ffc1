/* The order of sites in the reports grouped by site (lib/ledger/site.c's
 * tally__write_by_site): the leak report at exit and the stage report's
 * survivors. Sites with the most bytes come first; sites with equal bytes
 * in the order they were first seen (their site ids); each site's groups
 * under its one heading, largest first.
 *
 * The blocks are made by a child (this binary re-executed with --child
 * ROLE), so the stage end and the exit path write their reports for real. */
#include "ledgerutil.h"

#define MB LU_MiB
#define SITES "backend:host,host_devices:2,host_mode:virtual,host_capacity:8GiB,backtrace_depth:8,leak_report:full"

/* ---- the child: two sites of equal bytes -------------------------------------- */

static void *volatile keep[8];
static int nkeep;

__attribute__((noinline)) static void tied_site_a(size_t size)
{
    keep[nkeep++] = tally_malloc(size, 0, NULL);
    LU_REQUIRE(keep[nkeep - 1] != NULL);
}

__attribute__((noinline)) static void tied_site_b(size_t size)
{
    keep[nkeep++] = tally_malloc(size, 0, NULL);
    LU_REQUIRE(keep[nkeep - 1] != NULL);
}

/* 4 MiB from each site, each in two groups (tags) of unequal bytes, made
 * inside stage "tie" and left live: tied_site_a is seen first (the lower
 * site id). Each site's smaller group first, so that the order of the
 * report is not the order of allocation. */
static int child_tied_sites(void)
{
    static const char *const a_tags[] = {"a-small", "a-big"}, *const b_tags[] = {"b-small", "b-big"};
    static const size_t a_size[] = {1 * MB, 3 * MB}, b_size[] = {3 * MB / 2, 5 * MB / 2};
    LU_REQUIRE(tally_stage_begin("tie") == 0);
    for (volatile int i = 0; i < 2; i++) { /* (volatile: one call site per site) */
        LU_REQUIRE(tally_tag_push(a_tags[i]) == 0);
        tied_site_a(a_size[i]);
        LU_REQUIRE(tally_tag_pop() == 0);
    }
    for (volatile int i = 0; i < 2; i++) {
        LU_REQUIRE(tally_tag_push(b_tags[i]) == 0);
        tied_site_b(b_size[i]);
        LU_REQUIRE(tally_tag_pop() == 0);
    }
    LU_REQUIRE(tally_stage_end("tie") == 0);
    return 0;
}

/* ---- the tests ---------------------------------------------------------------- */

/* Each of the n strings occurs in text, in this order (each after the end
 * of the one before); returns where the last one ends. line: the caller's. */
static const char *expect_in_order(int line, const char *text, const char *const *want, size_t n)
{
    const char *at = text;
    for (size_t i = 0; i < n; i++) {
        const char *next = strstr(at, want[i]);
        if (!next)
            fail_msg("%s:%d: expected \"%s\" (item %zu of the order) after offset %ld in:\n%s", __FILE__, line,
                     want[i], i, (long)(at - text), text);
        at = next + strlen(want[i]);
    }
    return at;
}

/* Leaks: two sites of 4 MiB each. The one seen first (tied_site_a) comes
 * first, each site under one heading with its groups largest first. A tie
 * broken by a group's bytes instead would put b's 2.5 MiB group before a's
 * 1 MiB one and give a a second heading. */
static void test_equal_byte_sites_leak_in_first_seen_order(void **state)
{
    (void)state;
    lu_child_t c;
    lu_child_run(&c, "tied-sites", SITES, NULL);
    LU_CHILD_EXIT(&c, 0);
    const char *leaks = strstr(c.err, "tally: leak report: 4 blocks still live at exit, in 4 groups\n");
    assert_non_null(leaks);
    const char *heading = "tally: Direct leak of 4194304 bytes (4.0 MiB) in 2 blocks allocated from:\n";
    LU_EQ(lu_count(leaks, heading), 2);
    const char *const order[] = {
        heading,
        " in tied_site_a ",
        "tally: 3145728 bytes (3.0 MiB) in 1 block: tag a-big, stage tie, device 0\n",
        "tally: 1048576 bytes (1.0 MiB) in 1 block: tag a-small, stage tie, device 0\n",
        heading,
        " in tied_site_b ",
        "tally: 2621440 bytes (2.5 MiB) in 1 block: tag b-big, stage tie, device 0\n",
        "tally: 1572864 bytes (1.5 MiB) in 1 block: tag b-small, stage tie, device 0\n",
        "tally: SUMMARY: 8388608 bytes leaked in 4 blocks\n",
    };
    expect_in_order(__LINE__, leaks, order, sizeof order / sizeof order[0]);
    lu_child_free(&c);
}

/* The stage report's survivors of the same blocks, in the same order. */
static void test_equal_byte_sites_survive_in_first_seen_order(void **state)
{
    (void)state;
    lu_child_t c;
    lu_child_run(&c, "tied-sites", SITES, NULL);
    LU_CHILD_EXIT(&c, 0);
    const char *stage = strstr(c.err, "tally: stage tie ended after ");
    assert_non_null(stage);
    const char *end = strstr(stage, "tally: leak report:");
    assert_non_null(end);
    const char *heading = "tally: 4194304 bytes (4.0 MiB) in 2 blocks allocated from:\n";
    const char *const order[] = {
        heading,
        " in tied_site_a ",
        "tally: stage tie ended with 3.0 MiB still live under tag a-big on device 0 (1 block)\n",
        "tally: stage tie ended with 1.0 MiB still live under tag a-small on device 0 (1 block)\n",
        heading,
        " in tied_site_b ",
        "tally: stage tie ended with 2.5 MiB still live under tag b-big on device 0 (1 block)\n",
        "tally: stage tie ended with 1.5 MiB still live under tag b-small on device 0 (1 block)\n",
    };
    assert_true(expect_in_order(__LINE__, stage, order, sizeof order / sizeof order[0]) <= end);
    LU_EQ(lu_count(stage, heading), 2);
    lu_child_free(&c);
}

/* ---- main --------------------------------------------------------------------- */

static const lu_role_t roles[] = {
    {"tied-sites", child_tied_sites},
    {NULL, NULL},
};

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "--child") == 0)
        return lu_child_main(argv[2], roles);
    setenv("TALLY_CONF", "backend:host,leak_report:off", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_equal_byte_sites_leak_in_first_seen_order),
        cmocka_unit_test(test_equal_byte_sites_survive_in_first_seen_order),
    };
    int failed = cmocka_run_group_tests_name("site order", tests, NULL, NULL);
    lu_tmpdir_cleanup();
    return failed;
}
