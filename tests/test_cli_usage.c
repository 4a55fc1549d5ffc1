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
    /* The first of the statistics' names is one too: a file whose only key
     * is allocation's is a memory_stats object with a bad value. */
    r = tally_run("summary '%s/stats_bad_allocation.json'", fixtures);
    EXPECT_RC(r, 1);
    HAS(r.err, "stats_bad_allocation.json: not a valid memory_stats object: byte 27: memory_stats: "
               "\"allocation.all.current\" should be an integer, not string\n");
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
        /* An option one letter from -a is not -a. */
        {"summary -b x.json", "tally summary: unknown option '-b'\nTry 'tally summary --help'.\n"},
        {"summary --device", "--device needs a device number"},
        {"summary --device -1 x.json", "--device needs a device number (0, 1, ...), not '-1'"},
        {"summary --device two x.json", "not 'two'"},
        /* Device numbers are below 2^20 (cli_util.c). */
        {"summary --device 1048576 x.json", "--device needs a device number (0, 1, ...), not '1048576'"},
        {"summary", "tally summary: FILE.json is missing"},
        {"summary a.json b.json", "one FILE.json expected, got 'a.json' and 'b.json'"},
        {"ledger --json x.json", "tally ledger: unknown option '--json'"},
        {"ledger a.json b.json", "tally ledger: one FILE.json expected, got 'a.json' and 'b.json'"},
        {"merge", "tally merge: no FILE.json given"},
        {"merge --csv a.json", "unknown option '--csv'"},
        {"plot x.json", "no output given: -o OUT.svg or -o OUT.html"},
        {"plot x.json -o out.png", "the output must end in .svg or .html, not 'out.png'"},
        {"plot a.json b.json -o x.svg", "tally plot: one FILE.json expected, got 'a.json' and 'b.json'"},
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
    /* The last device number taken: the command goes on to its file. */
    run_t r = tally_run("summary --device 1048575 '%s/no-such-report.json'", dir);
    EXPECT_RC(r, 1);
    HAS(r.err, "no-such-report.json");
    run_free(&r);
}


/* ---- damaged reports: each field the commands read, named with its byte ------ */

/* A report written by hand into dir/damaged.json: a minimal valid header,
 * then body (its devices and ledger members, and its stages, leaks or
 * timeline when it has them), then empty sections. Its text in text. */
static void write_report(const char *body, char *path, size_t len, char *text, size_t tlen)
{
    snprintf(text, tlen,
             "{\"format\":\"tally-report\",\"version\":\"0.1.0\",\"home_device\":0,\"backend\":\"host\",\n%s,\n"
             "%s%s\"segments\":[],%s}\n",
             body, strstr(body, "\"stages\":") ? "" : "\"stages\":[],", strstr(body, "\"leaks\":") ? "" : "\"leaks\":[],",
             strstr(body, "\"timeline\":") ? "\"sites\":[]" : "\"timeline\":[]");
    assert_true((size_t)snprintf(path, len, "%s/damaged.json", dir) < len);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

/* `tally CMD` on the report of body fails (status 1, nothing on stdout)
 * with "FILE: not a valid tally report: byte N: WHY", N the offset of the
 * first occurrence of at in the report's text (0 when at is NULL). */
static void expect_damaged(const char *cmd, const char *body, const char *at, const char *why)
{
    char path[PATH_MAX], text[2048], want[PATH_MAX + 512];
    write_report(body, path, sizeof path, text, sizeof text);
    const char *hit = at ? strstr(text, at) : text;
    if (!hit)
        fail_msg("'%s' is not in the report:\n%s", at, text);
    snprintf(want, sizeof want, "%s: not a valid tally report: byte %zu: %s\n", path, (size_t)(hit - text), why);
    run_t r = tally_run("%s '%s'", cmd, path);
    if (r.rc != 1 || r.out[0] || !strstr(r.err, want))
        fail_msg("tally %s on\n%s: status %d, stdout '%s', stderr '%s'; expected status 1 and '%s'", cmd, text, r.rc,
                 r.out, r.err, want);
    run_free(&r);
}

/* A report's body with no devices and one ledger entry: the counts of a
 * valid entry (30 allocated - 20 freed = 10 current, 7 blocks allocated,
 * 2 at the peak) but for the tag member and the three counts given. */
#define ROW(tag, cur, peak, blocks)                                                                                 \
    "\"devices\":[],\"ledger\":[{" tag "\"stage\":\"load\",\"device\":0,\"foreign\":false,\"current_bytes\":" cur \
    ",\"peak_bytes\":" peak ",\"allocated_bytes\":30,\"freed_bytes\":20,\"live_blocks\":" blocks                \
    ",\"peak_blocks\":2,\"allocated_blocks\":7}]"
#define ROW_FIELDS(b)                                                                                                \
    "{\"tag\":\"w\",\"stage\":\"load\",\"device\":0,\"foreign\":false,\"current_bytes\":" b ",\"peak_bytes\":" b   \
    ",\"allocated_bytes\":" b ",\"freed_bytes\":0,\"live_blocks\":1,\"peak_blocks\":1,\"allocated_blocks\":1}"
#define ENTRY(fields) "\"devices\":[],\"ledger\":[{\"tag\":\"w\",\"stage\":\"s\"," fields "}]"

static void test_error_damaged_ledger_entry_names_field_and_byte(void **state)
{
    (void)state;
    /* Counts that cannot be: the entry is named. */
    expect_damaged("ledger", ROW("\"tag\":\"w\",", "0", "20", "-1"), "{\"tag\"", "ledger[0]: \"live_blocks\" is below 0");
    expect_damaged("ledger", ROW("\"tag\":\"w\",", "-1", "20", "0"), "{\"tag\"",
                   "ledger[0]: \"current_bytes\" is below 0");
    expect_damaged("ledger", ROW("\"tag\":\"w\",", "10", "3", "1"), "{\"tag\"",
                   "ledger[0]: current_bytes 10 is above peak_bytes 3");
    expect_damaged("ledger", ROW("\"tag\":\"w\",", "10", "20", "3"), "{\"tag\"",
                   "ledger[0]: live_blocks 3 is above peak_blocks 2");
    /* A field missing (the entry is named) or of the wrong type (the value is). */
    expect_damaged("ledger", ROW("", "10", "20", "1"), "{\"stage\"", "ledger[0]: missing \"tag\"");
    expect_damaged("ledger", ROW("\"tag\":7,", "10", "20", "1"), "7,", "ledger[0]: \"tag\" should be a string, not number");
    expect_damaged("ledger", ENTRY("\"device\":0,\"foreign\":1"), "1}", "ledger[0]: \"foreign\" should be true or false, not number");
    expect_damaged("ledger", ENTRY("\"device\":0,\"current_bytes\":0"), "{\"tag\"", "ledger[0]: missing \"peak_bytes\"");
    expect_damaged("ledger", ENTRY("\"device\":-3"), "-3", "ledger[0]: device -3 is out of range");
}

static void test_error_damaged_report_section_names_field_and_byte(void **state)
{
    (void)state;
    expect_damaged("ledger", "\"devices\":[]", NULL, "report: missing \"ledger\"");
    expect_damaged("ledger", "\"devices\":[],\"ledger\":{}", "{}", "report: \"ledger\" should be an array, not object");
    expect_damaged("summary", "\"devices\":[{\"device\":0}],\"ledger\":[]", "{\"device\"", "devices[0]: missing \"stats\"");
    expect_damaged("summary", "\"devices\":[{\"device\":0,\"stats\":[]}],\"ledger\":[]", "[]}",
                   "devices[0]: \"stats\" should be an object, not array");
    expect_damaged("summary", "\"devices\":[{\"device\":0,\"utilisation\":\"x\"}],\"ledger\":[]", "\"x\"",
                   "devices[0]: \"utilisation\" should be a number, not string");
    expect_damaged("summary", "\"devices\":[{\"device\":2000000}],\"ledger\":[]", "2000000",
                   "devices[0]: device 2000000 is out of range");
}

/* A stage's depth is 1 to 64, as tally nests them (lib/ledger/stage.c):
 * the summary indents each stage by its depth. */
#define STAGE_AT(depth)                                                                                              \
    "\"devices\":[],\"ledger\":[],\"stages\":[{\"name\":\"load\",\"depth\":" depth ",\"wall_us\":9,"                 \
    "\"peak_allocated_bytes\":0,\"peak_reserved_bytes\":0,\"survivor_bytes\":0,\"survivor_blocks\":0,\"survivors\":[]}]"

static void test_error_damaged_stage_depth_names_field_and_byte(void **state)
{
    (void)state;
    expect_damaged("ledger", STAGE_AT("0"), "0,\"wall", "stages[0]: \"depth\" 0 is out of range (1 to 64)");
    expect_damaged("ledger", STAGE_AT("65"), "65", "stages[0]: \"depth\" 65 is out of range (1 to 64)");
    expect_damaged("ledger", STAGE_AT("2147483649"), "2147483649",
                   "stages[0]: \"depth\" 2147483649 is out of range (1 to 64)");
    /* The deepest stage tally writes is read and indented: 63 levels of two
     * spaces before its name. */
    char path[PATH_MAX], text[2048], want[160];
    write_report(STAGE_AT("64"), path, sizeof path, text, sizeof text);
    run_t r = tally_run("ledger '%s'", path);
    EXPECT_RC(r, 0);
    snprintf(want, sizeof want, "\n1    %126sload ", "");
    HAS(r.out, want);
    run_free(&r);
}

/* Byte and block counts of events, leaks and survivors are never below 0:
 * plot negates an event's size and every command sums them. */
#define EVENT(size, allocated)                                                                                       \
    "\"devices\":[],\"ledger\":[],\"timeline\":[{\"device\":0,\"time_us\":1,\"action\":\"alloc\",\"addr\":4096,"          \
    "\"size\":" size ",\"allocated\":" allocated ",\"reserved\":0}]"
#define LEAK(bytes, blocks)                                                                                          \
    "\"devices\":[],\"ledger\":[],\"leaks\":[{\"tag\":\"w\",\"stage\":\"s\",\"device\":0,\"foreign\":false,"              \
    "\"bytes\":" bytes ",\"blocks\":" blocks "}]"

static void test_error_negative_counts_name_field_and_byte(void **state)
{
    (void)state;
    expect_damaged("plot --x events -o /dev/null.svg", EVENT("-1", "0"), "{\"device\":0,\"time_us\"",
                   "timeline[0]: \"size\" is below 0");
    expect_damaged("plot --x events -o /dev/null.svg", EVENT("0", "-9223372036854775808"), "{\"device\":0,\"time_us\"",
                   "timeline[0]: \"allocated\" is below 0");
    expect_damaged("ledger", LEAK("-5", "1"), "{\"tag\"", "leaks[0]: \"bytes\" is below 0");
    expect_damaged("ledger", LEAK("5", "-1"), "{\"tag\"", "leaks[0]: \"blocks\" is below 0");
}

/* Merged totals add counts read from the ranks' files: where two ranks'
 * 6e18 bytes would pass INT64_MAX, the total stops there instead of
 * wrapping below 0. */
static void test_merge_totals_stop_at_int64_max(void **state)
{
    (void)state;
    char path[2][PATH_MAX + 16];
    for (int k = 0; k < 2; k++) {
        snprintf(path[k], sizeof path[k], "%s/huge%d.json", dir, k);
        FILE *f = fopen(path[k], "w");
        assert_non_null(f);
        fprintf(f,
                "{\"format\":\"tally-report\",\"version\":\"0.1.0\",\"rank\":%d,\"world_size\":2,\"home_device\":0,"
                "\"backend\":\"host\",\"devices\":[],\"ledger\":[" ROW_FIELDS("6000000000000000000") "],"
                "\"stages\":[],\"leaks\":[],\"timeline\":[]}\n",
                k);
        assert_int_equal(fclose(f), 0);
    }
    run_t r = tally_run("merge --json '%s' '%s'", path[0], path[1]);
    EXPECT_RC(r, 0);
    HAS(r.out, "{\"tag\":\"w\",\"current_bytes\":9223372036854775807,\"peak_bytes_sum\":9223372036854775807,"
               "\"live_blocks\":2,\"ranks\":2}");
    run_free(&r);
}

/* A report without a version (optional: older reports) is read; one
 * without devices lists none when the one asked for is missing. */
static void test_report_without_version_or_devices(void **state)
{
    (void)state;
    char path[PATH_MAX], text[2048];
    write_report(ROW("\"tag\":\"w\",", "10", "20", "1"), path, sizeof path, text, sizeof text);
    char *v = strstr(text, "\"version\":\"0.1.0\",");
    memmove(v, v + 18, strlen(v + 18) + 1);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
    run_t r = tally_run("ledger '%s'", path);
    EXPECT_RC(r, 0);
    HAS(r.out, "load");
    run_free(&r);
    r = tally_run("summary '%s'", path);
    EXPECT_RC(r, 1);
    char want[PATH_MAX + 200];
    snprintf(want, sizeof want,
             "%s: no device 0 in the report (the home device, shown by default; pick another with --device; it has "
             "devices none)\n", path);
    HAS(r.err, want);
    run_free(&r);
}

/* The devices a report has, when the one asked for is not among them: a
 * run of three or more as first-last, else each. */
static void test_missing_device_lists_those_the_report_has(void **state)
{
    (void)state;
    run_t r = tally_run("summary --device 7 '%s/rank0.json'", dir);
    EXPECT_RC(r, 1);
    HAS(r.err, "rank0.json: no device 7 in the report (it has devices 0-3)\n");
    run_free(&r);
    r = tally_run("summary --device 7 '%s/train.json'", dir);
    EXPECT_RC(r, 1);
    HAS(r.err, "train.json: no device 7 in the report (it has devices 0, 1)\n");
    run_free(&r);
}

/* A report of 27 devices, not a run: 0, 2, then 10 to 58 in steps of 2.
 * The message lists what fits (the first 25, up to 54) and says how many
 * more there are. The devices are copies of rank0.json's device 0 with
 * their numbers changed. */
static void test_missing_device_list_says_how_many_more(void **state)
{
    (void)state;
    char src[PATH_MAX + 32], path[PATH_MAX + 32];
    snprintf(src, sizeof src, "%s/rank0.json", dir);
    snprintf(path, sizeof path, "%s/many_devices.json", dir);
    FILE *f = fopen(src, "r");
    assert_non_null(f);
    static char text[1 << 20];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = 0;
    /* The first device object: from its '{' to the matching '}'. */
    char *start = strstr(text, "\"devices\":[");
    assert_non_null(start);
    start = strchr(start, '{');
    char *end = start;
    for (int depth = 0; *end; end++) {
        depth += *end == '{' ? 1 : *end == '}' ? -1 : 0;
        if (!depth)
            break;
    }
    assert_int_equal(*end, '}');
    const char *rest = strstr(start, "\"device\":0,");
    assert_true(rest == start + 1);
    rest += strlen("\"device\":0,");
    int devs[27] = {0, 2};
    for (int k = 2; k < 27; k++)
        devs[k] = 10 + 2 * (k - 2);
    f = fopen(path, "w");
    assert_non_null(f);
    fwrite(text, 1, (size_t)(strstr(text, "\"devices\":[") - text), f);
    fputs("\"devices\":[", f);
    for (int k = 0; k < 27; k++) {
        fprintf(f, "%s{\"device\":%d,", k ? "," : "", devs[k]);
        fwrite(rest, 1, (size_t)(end + 1 - rest), f);
    }
    /* What follows rank0's devices array: from its matching ']' on. */
    const char *after = strchr(strstr(text, "\"devices\":["), '[');
    for (int depth = 0; *after; after++) {
        depth += *after == '[' || *after == '{' ? 1 : *after == ']' || *after == '}' ? -1 : 0;
        if (!depth)
            break;
    }
    assert_int_equal(*after, ']');
    fputs(after, f);
    assert_int_equal(fclose(f), 0);
    run_t r = tally_run("summary --device 7 '%s'", path);
    EXPECT_RC(r, 1);
    HAS(r.err, "many_devices.json: no device 7 in the report (it has devices 0, 2, 10, 12, 14, 16, 18, 20, 22, 24, "
               "26, 28, 30, 32, 34, 36, 38, 40, 42, 44, 46, 48, 50, 52, 54 and 2 more)\n");
    run_free(&r);
    r = tally_run("summary --device 58 '%s'", path); /* the list's last one is there */
    EXPECT_RC(r, 0);
    run_free(&r);
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
        cmocka_unit_test(test_error_damaged_ledger_entry_names_field_and_byte),
        cmocka_unit_test(test_error_damaged_report_section_names_field_and_byte),
        cmocka_unit_test(test_error_damaged_stage_depth_names_field_and_byte),
        cmocka_unit_test(test_error_negative_counts_name_field_and_byte),
        cmocka_unit_test(test_merge_totals_stop_at_int64_max),
        cmocka_unit_test(test_report_without_version_or_devices),
        cmocka_unit_test(test_missing_device_lists_those_the_report_has),
        cmocka_unit_test(test_missing_device_list_says_how_many_more),
    };
    return CLI_MAIN("cli_usage", tests);
}
