/* The tally command (tools/tally_cli.c), run as a user runs it, its stdout,
 * stderr and exit status checked (harness: cliutil.h, CLIUTIL_REPORTS): its
 * version and help, and its errors: a missing file, malformed JSON, the
 * wrong schema, bad flags. */
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

/* ---- version and help ------------------------------------------------------- */

static void test_version(void **state)
{
    (void)state;
    const char *forms[] = {"version", "--version", "-V"};
    for (size_t i = 0; i < 3; i++) {
        run_t r = tally_run("%s", forms[i]);
        EXPECT_RC(r, 0);
        expect_text(r.out, "tally " TALLY_VERSION "\n");
        run_free(&r);
    }
}

static void test_help(void **state)
{
    (void)state;
    run_t r = tally_run("--help");
    EXPECT_RC(r, 0);
    HAS(r.out, "usage: tally COMMAND");
    HAS(r.out, "summary");
    HAS(r.out, "merge");
    run_free(&r);
    const char *cmds[] = {"summary", "ledger", "merge", "plot"};
    for (size_t i = 0; i < 4; i++) {
        r = tally_run("%s --help", cmds[i]);
        EXPECT_RC(r, 0);
        char want[64];
        snprintf(want, sizeof want, "usage: tally %s", cmds[i]);
        HAS(r.out, want);
        run_free(&r);
    }
    r = tally_run("%s", "");
    EXPECT_RC(r, 2);
    HAS(r.err, "usage: tally COMMAND");
    run_free(&r);
}

/* ---- errors ------------------------------------------------------------------ */

static void test_error_missing_file(void **state)
{
    (void)state;
    const char *cmds[] = {"summary", "ledger", "merge", "plot -o x.svg"};
    for (size_t i = 0; i < 4; i++) {
        run_t r = tally_run("%s '%s/no-such-report.json'", cmds[i], dir);
        EXPECT_RC(r, 1);
        HAS(r.err, "no-such-report.json: cannot open: No such file or directory\n");
        expect_text(r.out, "");
        run_free(&r);
    }
}

static void test_error_malformed_json(void **state)
{
    (void)state;
    run_t r = tally_run("summary '%s/malformed.json'", fixtures);
    EXPECT_RC(r, 1);
    HAS(r.err, "malformed.json: malformed JSON: byte 49: unexpected '}' (expected a value) (line 2, column 14)\n");
    run_free(&r);
    /* On the first line too, columns count from 1. */
    char one[PATH_MAX + 16];
    snprintf(one, sizeof one, "%s/line1.json", dir);
    FILE *f = fopen(one, "w");
    assert_non_null(f);
    fputs("{\"a\" 1}", f);
    fclose(f);
    r = tally_run("summary '%s'", one);
    EXPECT_RC(r, 1);
    HAS(r.err, "(line 1, column 6)\n");
    run_free(&r);
    /* A report cut short. */
    char cut[PATH_MAX + 16];
    snprintf(cut, sizeof cut, "%s/cut.json", dir);
    char cmd[3 * PATH_MAX];
    snprintf(cmd, sizeof cmd, "head -c 300 '%s/train.json' > '%s'", dir, cut);
    assert_int_equal(system(cmd), 0);
    r = tally_run("ledger '%s'", cut);
    EXPECT_RC(r, 1);
    HAS(r.err, "cut.json: malformed JSON: byte 300: ");
    run_free(&r);
}

static void test_error_wrong_schema(void **state)
{
    (void)state;
    run_t r = tally_run("summary '%s/not_stats.json'", fixtures);
    EXPECT_RC(r, 1);
    HAS(r.err, "tally summary: ");
    HAS(r.err, "not_stats.json: not a tally report or memory_stats object\n");
    run_free(&r);
    r = tally_run("merge '%s/not_stats.json'", fixtures);
    EXPECT_RC(r, 1);
    HAS(r.err, "not_stats.json: not a tally report or memory_stats object\n");
    run_free(&r);
    r = tally_run("summary '%s/stats_bad_value.json'", fixtures);
    EXPECT_RC(r, 1);
    HAS(r.err, "stats_bad_value.json: not a valid memory_stats object: byte 66: memory_stats: "
               "\"allocated_bytes.all.peak\" should be an integer, not string\n");
    run_free(&r);
    r = tally_run("ledger '%s/bad_report.json'", fixtures);
    EXPECT_RC(r, 1);
    HAS(r.err, "bad_report.json: not a valid tally report: byte 235: ledger[0]: \"current_bytes\" should be an "
               "integer, not string\n");
    run_free(&r);
}

static void test_error_bad_flags(void **state)
{
    (void)state;
    struct {
        const char *args, *msg;
    } cases[] = {
        {"summary --bogus x.json", "tally summary: unknown option '--bogus'\nTry 'tally summary --help'.\n"},
        {"summary --device", "--device needs a device number"},
        {"summary --device -1 x.json", "--device needs a device number (0, 1, ...), not '-1'"},
        {"summary --device two x.json", "not 'two'"},
        {"summary", "tally summary: FILE.json is missing"},
        {"summary a.json b.json", "one FILE.json expected, got 'a.json' and 'b.json'"},
        {"ledger --json x.json", "tally ledger: unknown option '--json'"},
        {"merge", "tally merge: no FILE.json given"},
        {"merge --csv a.json", "unknown option '--csv'"},
        {"plot x.json", "no output given: -o OUT.svg or -o OUT.html"},
        {"plot x.json -o out.png", "the output must end in .svg or .html, not 'out.png'"},
        {"plot x.json -o out.svg --x frames", "--x takes 'time' or 'events', not 'frames'"},
        {"frobnicate", "tally: unknown command 'frobnicate' (commands: summary,"},
        {"sumary x.json", "tally: unknown command 'sumary' (did you mean 'summary'? commands: summary,"},
        {"legder", "(did you mean 'ledger'?"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        run_t r = tally_run("%s", cases[i].args);
        if (r.rc != 2)
            fail_msg("'tally %s' exited %d, expected 2", cases[i].args, r.rc);
        HAS(r.err, cases[i].msg);
        expect_text(r.out, "");
        run_free(&r);
    }
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_error_missing_file),
        cmocka_unit_test(test_error_malformed_json),
        cmocka_unit_test(test_error_wrong_schema),
        cmocka_unit_test(test_error_bad_flags),
    };
    return CLI_MAIN("cli_usage", tests);
}
