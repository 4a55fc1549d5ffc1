/* The tally command (tools/tally_cli.c), run as a user runs it, its stdout,
 * stderr and exit status checked (harness: cliutil.h, CLIUTIL_REPORTS):
 * which ranks `tally merge` counts and what it makes of the ranks it is
 * given. 48 reports merged with the command's open files limited to 32; a
 * rank counted in a total's ranks column only where its row held memory
 * (ranks below 64 and from 64 on); the total row over fewer ranks than
 * devices; a rank given twice (refused), ranks missing (named) and a world
 * size the ranks given do not fit (merged, with a warning). The reports
 * are those of a 4-rank job (cliutil.h's children) and some written or
 * edited by hand. `tally ledger` and the rest of `tally merge` are in
 * test_cli_ledger_merge.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "skip.h"

#define CLIUTIL_REPORTS /* the children, setup, tally_run, HAS, EXPECT_RC */
#include "cliutil.h"
#include "report/json.h"
#include "report/report.h"

/* ---- merge: the ranks ---------------------------------------------------- */

/* Merge reads each report and closes it before the next: 48 reports (ranks
 * 0 to 47 of 48, written by hand) merge with the command's open files
 * limited to 32, which a file left open per report would run out of. */
static void test_merge_closes_each_report_it_reads(void **state)
{
    (void)state;
    enum { N = 48 };
    static char args[N * (PATH_MAX + 40) + 64];
    snprintf(args, sizeof args, "merge");
    size_t len = strlen(args);
    for (int i = 0; i < N; i++) {
        char path[PATH_MAX + 32];
        snprintf(path, sizeof path, "%s/r%02d.json", dir, i);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fprintf(f,
                "{\"format\":\"tally-report\",\"version\":\"" TALLY_VERSION "\",\"rank\":%d,\"world_size\":%d,"
                "\"home_device\":0,\"backend\":\"host\",\"devices\":[],\"ledger\":[],\"stages\":[],\"leaks\":[]}\n",
                i, N);
        assert_int_equal(fclose(f), 0);
        len += (size_t)snprintf(args + len, sizeof args - len, " '%s'", path);
    }
    struct rlimit was, low;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &was), 0);
    low = was;
    low.rlim_cur = 32;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
    run_t r = tally_run("%s", args);
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &was), 0);
    EXPECT_RC(r, 0);
    HAS(r.out, "tally merge: 48 reports, ranks 0, 1, 2,");
    HAS(r.out, ", 47 (world size 48)\n");
    run_free(&r);
}

/* A rank counts in a total's ranks column only where the row held memory:
 * the second rank's row of tag t with a peak of 0 (the tag pushed, nothing
 * taken under it) leaves t at one rank, and the third's real row makes two.
 * Ranks 0 to 63 are counted once each, ranks from 64 on by row: both kept. */
static void merge_ranks_from(int first)
{
    static const char head[] = "{\"format\":\"tally-report\",\"version\":\"" TALLY_VERSION "\",\"rank\":%d,"
                               "\"home_device\":0,\"backend\":\"host\",\"devices\":[],\"ledger\":[\n"
                               "{\"tag\":\"t\",\"stage\":\"s\",\"device\":0,\"foreign\":false,"
                               "\"current_bytes\":%d,\"peak_bytes\":%d,\"live_blocks\":%d}\n"
                               "],\"stages\":[],\"leaks\":[]}\n";
    static const int rows[3][3] = {{1048576, 1048576, 1}, {0, 0, 0}, {0, 2097152, 0}};
    char path[3][PATH_MAX + 32];
    for (int k = 0; k < 3; k++) {
        snprintf(path[k], sizeof path[k], "%s/peak0-rank%d.json", dir, first + k);
        FILE *f = fopen(path[k], "w");
        assert_non_null(f);
        fprintf(f, head, first + k, rows[k][0], rows[k][1], rows[k][2]);
        assert_int_equal(fclose(f), 0);
    }
    run_t r = tally_run("merge '%s' '%s'", path[0], path[1]);
    EXPECT_RC(r, 0);
    HAS(r.out, "by tag, all ranks         current   peak (sum)  live blocks  ranks\n"
               "t                         1.0 MiB      1.0 MiB            1      1\n");
    run_free(&r);
    r = tally_run("merge '%s' '%s' '%s'", path[0], path[1], path[2]);
    EXPECT_RC(r, 0);
    HAS(r.out, "by tag, all ranks         current   peak (sum)  live blocks  ranks\n"
               "t                         1.0 MiB      3.0 MiB            1      2\n");
    run_free(&r);
}

static void test_merge_ranks_count_only_rows_that_held_memory(void **state)
{
    (void)state;
    merge_ranks_from(0);
    merge_ranks_from(100);
}

/* The total row sums every rank given, when there are fewer ranks than
 * devices (3 of the 4 ranks: three checkpoints on device 0, nothing on
 * device 3, whose rank is missing). */
static void test_merge_totals_every_rank_with_fewer_ranks_than_devices(void **state)
{
    (void)state;
    run_t r = tally_run("merge '%s/rank2.json' '%s/rank0.json' '%s/rank1.json'", dir, dir, dir);
    EXPECT_RC(r, 0);
    HAS(r.out, "tally merge: 3 reports, ranks 0, 1, 2 (world size 4)\nmissing: rank 3\n");
    HAS(r.out, "\ntotal                     3.2 GiB   256.0 MiB   256.0 MiB         0 B\n"); /* allocated */
    HAS(r.out, "\ntotal                     3.2 GiB  256.0 MiB  256.0 MiB        0 B\n");     /* reserved */
    HAS(r.out, "checkpoint                3.0 GiB      3.0 GiB            3      3\n");
    /* Each rank's row of the matrices names its home device and its pid, as
     * its report has them. */
    for (int k = 0; k < 3; k++) {
        char path[PATH_MAX + 32], want[64];
        snprintf(path, sizeof path, "%s/rank%d.json", dir, k);
        char *text = slurp(path);
        assert_non_null(text);
        const char *pid = strstr(text, "\"pid\":");
        assert_non_null(pid);
        snprintf(want, sizeof want, "\n%-6d %-5d %-9lld", k, k, strtoll(pid + 6, NULL, 10));
        HAS(r.out, want);
        free(text);
    }
    run_free(&r);
    /* The JSON form lists every device too, not one per report. */
    r = tally_run("merge --json '%s/rank2.json' '%s/rank0.json' '%s/rank1.json'", dir, dir, dir);
    EXPECT_RC(r, 0);
    HAS(r.out, "\n {\"device\":1,\"allocated_bytes\":268435456,");
    HAS(r.out, "\n {\"device\":3,\"allocated_bytes\":0,\"reserved_bytes\":0,\"foreign_bytes\":0}],\n\"ranks\":[");
    run_free(&r);
}

static void test_merge_duplicate_rank(void **state)
{
    (void)state;
    run_t r = tally_run("merge '%s/rank0.json' '%s/rank1.json' '%s/rank1.json'", dir, dir, dir);
    EXPECT_RC(r, 1);
    HAS(r.err, "tally merge: rank 1 appears twice: ");
    expect_text(r.out, "");
    run_free(&r);
    /* The training report is rank 0 too. */
    r = tally_run("merge --json '%s/rank0.json' '%s/train.json'", dir, dir);
    EXPECT_RC(r, 1);
    HAS(r.err, "rank 0 appears twice");
    run_free(&r);
}

static void test_merge_missing_rank(void **state)
{
    (void)state;
    run_t r = tally_run("merge '%s/rank0.json' '%s/rank2.json'", dir, dir);
    EXPECT_RC(r, 0);
    HAS(r.out, "tally merge: 2 reports, ranks 0, 2 (world size 4)\nmissing: ranks 1, 3\n");
    HAS(r.out, "rank 2 holds 1.0 GiB on device 0");
    run_free(&r);
}

/* dir/wsN.json: dir/rankN.json as if written without WORLD_SIZE (world size 1). */
static void world_size_one(int rank)
{
    char from[PATH_MAX + 32], to[PATH_MAX + 32];
    snprintf(from, sizeof from, "%s/rank%d.json", dir, rank);
    snprintf(to, sizeof to, "%s/ws%d.json", dir, rank);
    char *s = slurp(from);
    assert_non_null(s);
    char *at = strstr(s, "\"world_size\":4,");
    assert_non_null(at);
    FILE *f = fopen(to, "w");
    assert_non_null(f);
    fprintf(f, "%.*s\"world_size\":1,%s", (int)(at - s), s, at + strlen("\"world_size\":4,"));
    fclose(f);
    free(s);
}

/* The world size and the ranks given disagree: merged, with a warning. */
static void test_merge_warns_on_world_size(void **state)
{
    (void)state;
    for (int i = 0; i < 3; i++)
        world_size_one(i);
    run_t r = tally_run("merge '%s/ws0.json' '%s/ws1.json' '%s/ws2.json'", dir, dir, dir);
    EXPECT_RC(r, 0);
    HAS(r.out, "tally merge: 3 reports, ranks 0, 1, 2 (world size 1)");
    HAS(r.err, "tally merge: warning: the reports say world size 1, but 3 ranks were given (0, 1, 2, some outside "
               "it); was WORLD_SIZE set where they ran?\n");
    run_free(&r);
    r = tally_run("merge '%s/rank0.json' '%s/ws1.json'", dir, dir);
    EXPECT_RC(r, 0);
    HAS(r.err, "tally merge: warning: the reports disagree on the world size: ");
    HAS(r.err, "rank0.json says 4, ");
    run_free(&r);
    /* Ranks that fit the world size: no warning, missing ones named. */
    r = tally_run("merge '%s/rank0.json' '%s/rank2.json'", dir, dir);
    EXPECT_RC(r, 0);
    assert_string_equal(r.err, "");
    run_free(&r);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_merge_closes_each_report_it_reads),
        cmocka_unit_test(test_merge_ranks_count_only_rows_that_held_memory),
        cmocka_unit_test(test_merge_totals_every_rank_with_fewer_ranks_than_devices),
        cmocka_unit_test(test_merge_duplicate_rank),
        cmocka_unit_test(test_merge_missing_rank),
        cmocka_unit_test(test_merge_warns_on_world_size),
    };
    return CLI_MAIN("cli_ledger_merge_ranks", tests);
}
