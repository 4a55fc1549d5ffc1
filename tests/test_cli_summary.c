/* The tally command (tools/tally_cli.c), run as a user runs it, its stdout,
 * stderr and exit status checked (harness: cliutil.h, CLIUTIL_REPORTS): `tally
 * summary`, PyTorch's memory_summary table from memory_stats.json (flat,
 * nested, standard input, one device abbreviated) and from a tally report.
 * The expected tables were computed from tests/fixtures/memory_stats.json
 * with PyTorch's own memory_summary formatting rules, not with tally. */
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

#define CLIUTIL_REPORTS /* the children, setup, tally_run, HAS, EXPECT_RC */
#include "cliutil.h"
#include "report/json.h"
#include "report/report.h"

/* ---- expected tables (PyTorch's rules applied to memory_stats.json) ------------ */

#define TABLE_HEAD(dev)                                                                                            \
    "|===========================================================================|\n"                             \
    "|                  PyTorch CUDA memory summary, device ID " dev "                 |\n"                       \
    "|---------------------------------------------------------------------------|\n"                             \
    "|            CUDA OOMs: 1            |        cudaMalloc retries: 3         |\n"                             \
    "|===========================================================================|\n"                             \
    "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |\n"
#define RULE "|---------------------------------------------------------------------------|\n"
#define TAIL                                                                                                       \
    RULE "| Oversize allocations  |       2    |       5    |      17    |      15    |\n" RULE                      \
         "| Oversize GPU segments |       1    |       3    |       9    |       8    |\n"                           \
         "|===========================================================================|\n"

static const char full_table[] =
    TABLE_HEAD("0") RULE
    "| Allocated memory      |   3584 MiB |   5121 MiB |    821 GiB |    817 GiB |\n"
    "|       from large pool |   3584 MiB |   5120 MiB |    812 GiB |    808 GiB |\n"
    "|       from small pool |      0 MiB |      2 MiB |      9 GiB |      9 GiB |\n" RULE
    "| Active memory         |   3584 MiB |   5121 MiB |    821 GiB |    817 GiB |\n"
    "|       from large pool |   3584 MiB |   5120 MiB |    812 GiB |    808 GiB |\n"
    "|       from small pool |      0 MiB |      2 MiB |      9 GiB |      9 GiB |\n" RULE
    "| Requested memory      |   3572 MiB |   5117 MiB |    809 GiB |    805 GiB |\n"
    "|       from large pool |   3572 MiB |   5117 MiB |    800 GiB |    796 GiB |\n"
    "|       from small pool |      0 MiB |      1 MiB |      9 GiB |      8 GiB |\n" RULE
    "| GPU reserved memory   |   4100 MiB |   6149 MiB |   7176 MiB |   3076 MiB |\n"
    "|       from large pool |   4096 MiB |   6144 MiB |   7168 MiB |   3072 MiB |\n"
    "|       from small pool |      4 MiB |      6 MiB |      8 MiB |      4 MiB |\n" RULE
    "| Non-releasable memory | 205500 KiB |   1026 MiB |    905 GiB |    904 GiB |\n"
    "|       from large pool | 204800 KiB |   1024 MiB |    900 GiB |    899 GiB |\n"
    "|       from small pool |    700 KiB |      3 MiB |      5 GiB |      4 GiB |\n" RULE
    "| Allocations           |     157    |    1139    |    3260 K  |    3259 K  |\n"
    "|       from large pool |     120    |     340    |    2500 K  |    2499 K  |\n"
    "|       from small pool |      37    |     800    |     760 K  |     759 K  |\n" RULE
    "| Active allocs         |     157    |    1139    |    3260 K  |    3259 K  |\n"
    "|       from large pool |     120    |     340    |    2500 K  |    2499 K  |\n"
    "|       from small pool |      37    |     800    |     760 K  |     759 K  |\n" RULE
    "| GPU reserved segments |      42    |      63    |      99    |      57    |\n"
    "|       from large pool |      40    |      61    |      95    |      55    |\n"
    "|       from small pool |       2    |       3    |       4    |       2    |\n" RULE
    "| Non-releasable allocs |      14    |      38    |    1600 K  |    1599 K  |\n"
    "|       from large pool |      11    |      30    |    1200 K  |    1199 K  |\n"
    "|       from small pool |       3    |       9    |     400 K  |     399 K  |\n" TAIL;

static const char abbreviated_table[] =
    TABLE_HEAD("3") RULE
    "| Allocated memory      |   3584 MiB |   5121 MiB |    821 GiB |    817 GiB |\n" RULE
    "| Active memory         |   3584 MiB |   5121 MiB |    821 GiB |    817 GiB |\n" RULE
    "| Requested memory      |   3572 MiB |   5117 MiB |    809 GiB |    805 GiB |\n" RULE
    "| GPU reserved memory   |   4100 MiB |   6149 MiB |   7176 MiB |   3076 MiB |\n" RULE
    "| Non-releasable memory | 205500 KiB |   1026 MiB |    905 GiB |    904 GiB |\n" RULE
    "| Allocations           |     157    |    1139    |    3260 K  |    3259 K  |\n" RULE
    "| Active allocs         |     157    |    1139    |    3260 K  |    3259 K  |\n" RULE
    "| GPU reserved segments |      42    |      63    |      99    |      57    |\n" RULE
    "| Non-releasable allocs |      14    |      38    |    1600 K  |    1599 K  |\n" TAIL;

/* ---- summary ---------------------------------------------------------------- */

static void test_summary_flat_full(void **state)
{
    (void)state;
    run_t r = tally_run("summary '%s/memory_stats.json'", fixtures);
    EXPECT_RC(r, 0);
    expect_text(r.out, full_table);
    expect_text(r.err, "");
    run_free(&r);
}

/* "-" reads standard input, and messages name it. */
static void test_summary_reads_standard_input(void **state)
{
    (void)state;
    run_t r = tally_run("summary - < '%s/memory_stats.json'", fixtures);
    EXPECT_RC(r, 0);
    expect_text(r.out, full_table);
    expect_text(r.err, "");
    run_free(&r);
    r = tally_run("summary - < '%s/malformed.json'", fixtures);
    EXPECT_RC(r, 1);
    HAS(r.err, "tally summary: (standard input): ");
    run_free(&r);
}

static void test_summary_flat_abbreviated_device(void **state)
{
    (void)state;
    run_t r = tally_run("summary --abbreviated --device 3 '%s/memory_stats.json'", fixtures);
    EXPECT_RC(r, 0);
    expect_text(r.out, abbreviated_table);
    run_free(&r);
    r = tally_run("summary -a --device=3 '%s/memory_stats.json'", fixtures);
    EXPECT_RC(r, 0);
    expect_text(r.out, abbreviated_table);
    run_free(&r);
}

static void test_summary_nested_stats(void **state)
{
    (void)state;
    /* memory_stats_as_nested_dict() form of the same numbers */
    run_t r = tally_run("summary '%s/memory_stats_nested.json'", fixtures);
    EXPECT_RC(r, 0);
    expect_text(r.out, full_table);
    run_free(&r);
}

static void buf_write(void *arg, const char *text, size_t len)
{
    char **p = arg;
    size_t n = *p ? strlen(*p) : 0;
    *p = realloc(*p, n + len + 1);
    memcpy(*p + n, text, len);
    (*p)[n + len] = 0;
}

/* The table for device dev of a report, rendered in this process from the
 * report's stats object re-serialised as flat JSON. */
static char *expected_for_report(const char *path, int dev)
{
    char *text = slurp(path);
    assert_non_null(text);
    char err[256];
    tally_json_t *root = tally__json_parse(text, strlen(text), err, sizeof err, NULL);
    assert_non_null(root);
    const tally_json_t *devs = tally__json_get(root, "devices");
    const tally_json_t *stats = NULL;
    for (size_t i = 0; devs && i < devs->len; i++) {
        int64_t d;
        if (tally__json_int(tally__json_get(&devs->items[i], "device"), &d) == 0 && d == dev)
            stats = tally__json_get(&devs->items[i], "stats");
    }
    assert_non_null(stats);
    size_t cap = 64 + stats->len * 64, n = 0;
    char *flat = malloc(cap);
    n += (size_t)snprintf(flat + n, cap - n, "{");
    for (size_t i = 0; i < stats->len; i++)
        n += (size_t)snprintf(flat + n, cap - n, "%s\"%s\": %lld", i ? ", " : "", stats->members[i].key,
                              (long long)stats->members[i].value.i);
    snprintf(flat + n, cap - n, "}");
    tally_stats_t s;
    assert_int_equal(tally__stats_from_json(flat, strlen(flat), &s, err, sizeof err), 0);
    char *table = NULL;
    assert_int_equal(tally__summary_render(&s, dev, 0, buf_write, &table), 0);
    free(flat);
    tally__json_free(root);
    free(text);
    return table;
}

static void test_summary_report(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/train.json", dir);
    /* Default: the home device (0). Two model-init blocks live at exit. */
    run_t r = tally_run("summary '%s'", path);
    EXPECT_RC(r, 0);
    char *want = expected_for_report(path, 0);
    expect_text(r.out, want);
    free(want);
    HAS(r.out, "device ID 0 ");
    HAS(r.out, "| Allocations           |       2    |");
    HAS(r.out, "| Allocated memory      |   8192 KiB |");
    run_free(&r);
    /* Device 1: the one stray 1 MiB block. */
    r = tally_run("summary --device 1 '%s'", path);
    EXPECT_RC(r, 0);
    want = expected_for_report(path, 1);
    expect_text(r.out, want);
    free(want);
    HAS(r.out, "device ID 1 ");
    HAS(r.out, "| Allocated memory      |   1024 KiB |   1024 KiB |   1024 KiB |      0 B   |");
    run_free(&r);
}

static void test_summary_absent_device(void **state)
{
    (void)state;
    run_t r = tally_run("summary --device 7 '%s/train.json'", dir);
    EXPECT_RC(r, 1);
    HAS(r.err, "train.json: no device 7 in the report (it has devices 0, 1)");
    expect_text(r.out, "");
    run_free(&r);
}

/* ---- damage (docs/bad-input.md) ------------------------------------------ */

/* dir/NAME: train.json with the first `from` replaced by `to` (the whole
 * file when from is NULL, cut to `cut` bytes when cut > 0). */
static void edited(const char *name, const char *from, const char *to, size_t cut)
{
    char src[PATH_MAX + 32], dst[PATH_MAX + 32];
    snprintf(src, sizeof src, "%s/train.json", dir);
    snprintf(dst, sizeof dst, "%s/%s", dir, name);
    char *text = slurp(src);
    assert_non_null(text);
    FILE *f = fopen(dst, "w");
    assert_non_null(f);
    char *at = from ? strstr(text, from) : NULL;
    if (from)
        assert_non_null(at);
    if (cut)
        fwrite(text, 1, cut, f);
    else if (at)
        fprintf(f, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    else
        fputs(text, f);
    fclose(f);
    free(text);
}

/* Every report command refuses dir/NAME with one line holding want (tune
 * only where the damage is in what it reads: the version, the stats). */
static void refused(const char *name, const char *want, bool tune)
{
    static const char *const cmds[] = {"summary", "ledger", "merge", "plot -o '%s/x.svg'", "tune"};
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds - !tune; i++) {
        char cmd[PATH_MAX + 64];
        snprintf(cmd, sizeof cmd, cmds[i], dir);
        run_t r = tally_run("%s '%s/%s'", cmd, dir, name);
        if (r.rc != 1 || !strstr(r.err, want) || strchr(r.err, '\n') != r.err + strlen(r.err) - 1)
            fail_msg("tally %s %s: exit %d, expected 1 and one line with \"%s\"; stderr:\n%s", cmd, name, r.rc, want,
                     r.err);
        run_free(&r);
    }
}

/* A garbled, missing or inconsistent field of a report is named, never read
 * as 0 (issue: a garbled stats key printed 0 where 527 was right). */
static void test_damaged_report_is_named(void **state)
{
    (void)state;
    edited("garbled.json", "\"active.all.allocated\"", "\"active.all.alocated\"", 0);
    refused("garbled.json", "devices[0].stats: unknown key \"active.all.alocated\" (did you mean "
                                          "\"active.all.allocated\"?)", true);
    edited("missing.json", "\"num_ooms\": 0, ", "", 0);
    refused("missing.json", "devices[0].stats: key \"num_ooms\" is missing", true);
    /* One count changed by hand: all is no longer small_pool + large_pool. */
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/train.json", dir);
    char *text = slurp(path);
    char *at = strstr(text, "\"segment.all.allocated\": ");
    assert_non_null(at);
    long long n = atoll(at + strlen("\"segment.all.allocated\": "));
    char from[96], to[96], want[160];
    snprintf(from, sizeof from, "\"segment.all.allocated\": %lld,", n);
    snprintf(to, sizeof to, "\"segment.all.allocated\": %lld,", n + 1);
    snprintf(want, sizeof want, "\"segment.all.allocated\" is %lld, but small_pool + large_pool is %lld", n + 1, n);
    free(text);
    edited("sum.json", from, to, 0);
    refused("sum.json", want, true);
    /* Cut short: the byte where it ends. */
    edited("cut.json", NULL, NULL, 900);
    refused("cut.json", "malformed JSON: byte 900: unexpected end of input", true);
    /* A ledger row whose counts do not add up. */
    edited("row.json", "\"current_bytes\":0,", "\"current_bytes\":5,", 0);
    refused("row.json", "ledger[0]: current_bytes 5 is not allocated_bytes - freed_bytes", false);
    /* A newer tally's report is refused naming both versions; a version
     * that is not one is named. */
    edited("newer.json", "\"version\":\"" TALLY_VERSION "\"", "\"version\":\"9.0.0\"", 0);
    refused("newer.json", "written by tally 9.0.0, newer than this tally (" TALLY_VERSION ")", true);
    edited("nover.json", "\"version\":\"" TALLY_VERSION "\"", "\"version\":\"nine\"", 0);
    run_t r = tally_run("summary '%s/nover.json'", dir);
    EXPECT_RC(r, 1);
    HAS(r.err, "\"version\" 'nine' is not a tally version");
    run_free(&r);
    /* An older version, and a hand edit that keeps the counts, are read. */
    edited("older.json", "\"version\":\"" TALLY_VERSION "\"", "\"version\":\"0.0.1\"", 0);
    r = tally_run("summary '%s/older.json'", dir);
    EXPECT_RC(r, 0);
    run_free(&r);
    edited("renamed.json", "\"tag\":\"weights\"", "\"tag\":\"renamed-by-hand\"", 0);
    r = tally_run("ledger '%s/renamed.json'", dir);
    EXPECT_RC(r, 0);
    HAS(r.out, "renamed-by-hand");
    run_free(&r);
}

/* A PyTorch memory_stats dump: keys of other PyTorch versions are read
 * (extra ones skipped, scalars absent), a typo of a known key is not. */
static void test_pytorch_dump_versions(void **state)
{
    (void)state;
    char src[PATH_MAX + 32], dst[PATH_MAX + 32];
    snprintf(src, sizeof src, "%s/memory_stats.json", fixtures);
    char *text = slurp(src);
    assert_non_null(text);
    char *brace = strchr(text, '{');
    assert_non_null(brace);
    snprintf(dst, sizeof dst, "%s/newer_torch.json", dir);
    FILE *f = fopen(dst, "w");
    fprintf(f, "{\"reserved_bytes_by_private_pools.0_1.all.current\": 7, \"a_key_from_2030\": 1, %s", brace + 1);
    fclose(f);
    run_t r = tally_run("summary '%s'", dst);
    EXPECT_RC(r, 0);
    HAS(r.out, "PyTorch CUDA memory summary");
    run_free(&r);
    char *k = strstr(text, "\"num_alloc_retries\"");
    assert_non_null(k);
    snprintf(dst, sizeof dst, "%s/typo_torch.json", dir);
    f = fopen(dst, "w");
    fprintf(f, "%.*s\"num_alloc_retrys\"%s", (int)(k - text), text, k + strlen("\"num_alloc_retries\""));
    fclose(f);
    r = tally_run("summary '%s'", dst);
    EXPECT_RC(r, 1);
    HAS(r.err, "unknown key \"num_alloc_retrys\" (did you mean \"num_alloc_retries\"?)");
    run_free(&r);
    free(text);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_summary_flat_full),
        cmocka_unit_test(test_summary_reads_standard_input),
        cmocka_unit_test(test_summary_flat_abbreviated_device),
        cmocka_unit_test(test_summary_nested_stats),
        cmocka_unit_test(test_summary_report),
        cmocka_unit_test(test_summary_absent_device),
        cmocka_unit_test(test_damaged_report_is_named),
        cmocka_unit_test(test_pytorch_dump_versions),
    };
    return CLI_MAIN("cli_summary", tests);
}
