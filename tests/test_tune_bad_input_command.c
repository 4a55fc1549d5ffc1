/* Tests for tally tune on what goes wrong, the command itself run as a user
 * runs it (the built ../bin/tally):
 *
 *   an unknown option, two files, a capacity, a driver time
 *   or a torch version that is none (a development
 *   build's version is one)                        test_command_refuses_bad_arguments
 *   the table, or the picture, to a full device    test_command_output_that_cannot_be_written
 *   a picture's title for a long trace name        test_plot_title_of_a_long_name_keeps_its_end
 *   a JSON row that fits in no capacity tried      test_json_row_that_fits_nowhere_gives_the_least_above
 *   recorded states the recorded setting cannot
 *   be replayed from (overlapping blocks, a free
 *   gap, a segment over the capacity)              test_command_names_a_recorded_state_it_cannot_start_from
 *
 * A refused argument is checked whole (expect_error below: the status,
 * nothing on stdout, and stderr exactly "tally tune: " and the message),
 * which tuneutil.h's expect_one_line_error (one line containing the text)
 * does not. Snapshots are written from Python-like literals
 * (tests/pickleutil.h). setup makes a scratch folder (tune_teardown
 * removes it) holding small.csv, a trace of two blocks (1 MB and 30 MB),
 * both freed, for the tests that need a trace that works.
 *
 * Nothing of tools/ is compiled in here: the command is run. The readers on
 * bad input (compiled in, and out of host memory) are in
 * test_tune_bad_input.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "cliutil.h"
#include "report/json.h"
#include "tuneutil.h"
#include "pickleutil.h"

/* ---- the command ------------------------------------------------------------------ */

/* An error: the given status, nothing on stdout, and stderr exactly
 * "tally tune: " want and a newline. */
static void expect_error(run_t r, int rc, const char *want)
{
    char full[PATH_MAX + 512];
    snprintf(full, sizeof full, "tally tune: %s\n", want);
    if (r.rc != rc || r.out[0] || strcmp(r.err, full) != 0)
        fail_msg("status %d (want %d), stdout '%s', stderr '%s' (want '%s')", r.rc, rc, r.out, r.err, full);
    run_free(&r);
}

static char small_csv[PATH_MAX + 32];

static void test_command_refuses_bad_arguments(void **state)
{
    (void)state;
    expect_error(tune("--frobnicate '%s'", small_csv), 2, "unknown option '--frobnicate' (tally tune --help lists them)");
    expect_error(tune("-z '%s'", small_csv), 2, "unknown option '-z' (tally tune --help lists them)");
    expect_error(tune("a.csv b.csv"), 2, "one FILE expected, got 'a.csv' and 'b.csv'");
    expect_error(tune("--capacity 0.5 a.csv"), 2, "--capacity '0.5' is not a size (e.g. 80GiB, 40960MiB, 85899345920)");
    expect_error(tune("--capacity 2000000TB a.csv"), 2,
                 "--capacity '2000000TB' is not a size (e.g. 80GiB, 40960MiB, 85899345920)");
    /* Units are us, ms and s; a unit one letter from ms is none of them. */
    expect_error(tune("--max-driver-time 5ns a.csv"), 2,
                 "--max-driver-time '5ns' is not a duration (e.g. 250ms, 1.5s, 800us)");
    expect_error(tune("--max-driver-time 5mt a.csv"), 2,
                 "--max-driver-time '5mt' is not a duration (e.g. 250ms, 1.5s, 800us)");
    expect_error(tune("--max-driver-time x a.csv"), 2,
                 "--max-driver-time 'x' is not a duration (e.g. 250ms, 1.5s, 800us)");
    expect_error(tune("--torch-version 2.9x a.csv"), 2, "--torch-version '2.9x' is not a torch version (e.g. 2.9.1, 2.11)");
    /* A development build's version is one. */
    run_t r = tune("--torch-version 2.10dev0 '%s'", small_csv);
    assert_int_equal(r.rc, 0);
    assert_non_null(strstr(r.out, "torch 2.10dev0"));
    run_free(&r);
}

/* Output that cannot be written is an error, not a silent loss: the table
 * to a full device, the picture to one. */
static void test_command_output_that_cannot_be_written(void **state)
{
    (void)state;
    char cmd[4 * PATH_MAX], err[PATH_MAX + 16];
    snprintf(err, sizeof err, "%s/stderr", scratch);
    snprintf(cmd, sizeof cmd, "'%s' tune -q '%s' >/dev/full 2>'%s'", tally_bin, small_csv, err);
    int st = system(cmd);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 1);
    char *text = slurp(err);
    assert_string_equal(text, "tally tune: writing the output failed\n");
    free(text);
    run_t r = tune("--plot /dev/full '%s'", small_csv);
    assert_int_equal(r.rc, 1);
    assert_string_equal(r.err, "tally tune: /dev/full: write failed\n");
    run_free(&r);
}

/* A picture of a trace whose name is longer than the title has room for
 * shows its last 67 characters after "...". */
static void test_plot_title_of_a_long_name_keeps_its_end(void **state)
{
    (void)state;
    char name[128], path[PATH_MAX + 160], svg[PATH_MAX + 32];
    memset(name, 'n', 80);
    snprintf(name + 80, sizeof name - 80, "-end.csv");
    snprintf(path, sizeof path, "%s/%s", scratch, name);
    write_text(path, "op,id,size,stream\na,1,1000000,0\nf,1,0,0\n");
    snprintf(svg, sizeof svg, "%s/long.svg", scratch);
    run_t r = tune("--plot '%s' '%s'", svg, path);
    assert_int_equal(r.rc, 0);
    run_free(&r);
    char *text = slurp(svg);
    assert_non_null(text);
    char want[160];
    snprintf(want, sizeof want, "over the trace ...%s</text>", name + strlen(name) - 67);
    if (!strstr(text, want))
        fail_msg("no '%s' in the picture's title", want);
    free(text);
}

/* A row that runs out in every capacity the search tries (up to 64 TiB)
 * says in JSON the least it could need: above its live peak. */
static void test_json_row_that_fits_nowhere_gives_the_least_above(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/huge.csv", scratch);
    write_text(path, "op,id,size,stream\na,1,109951162777600,0\n"); /* 100 TiB */
    run_t r = tune("--json '%s'", path);
    assert_int_equal(r.rc, 1);
    assert_non_null(strstr(r.err, "no setting fits"));
    tally_json_t *rows = tally__json_parse(r.out, strlen(r.out), NULL, 0, NULL);
    assert_non_null(rows);
    const tally_json_t *def = &rows->items[0];
    assert_string_equal(tally__json_get(def, "setting")->s, "");
    assert_int_equal(tally__json_get(def, "min_device_bytes")->type, TALLY_JSON_NULL);
    assert_int_equal(jint(def, "min_device_bytes_above"), 109951162777600);
    tally__json_free(rows);
    run_free(&r);
}

/* A recorded state the recorded setting cannot be replayed from: the
 * table says why (status 0: the grid's replays start from an empty cache). */
static void expect_start_refused(const char *name, const char *segments, const char *extra, const char *why)
{
    char path[PATH_MAX + 32], lit[2048], want[512];
    snprintf(lit, sizeof lit,
             "{'segments': [%s], 'device_traces': [[{'action': 'alloc', 'addr': 1073741824, 'size': 1000, "
             "'stream': 0}]]}",
             segments);
    write_pickle(name, lit, path, sizeof path);
    snprintf(want, sizeof want, "\nreplay of the same setting from the recorded state failed: %s\n", why);
    run_t r = tune("%s '%s'", extra, path);
    if (r.rc != 0 || !strstr(r.out, want))
        fail_msg("%s: status %d, expected 0 and '%s' in:\n%s%s", name, r.rc, want, r.out, r.err);
    run_free(&r);
}

#define SEG20(blocks)                                                                                           \
    "{'device': 0, 'address': 16777216, 'total_size': 20971520, 'stream': 0, 'segment_type': 'large', "        \
    "'blocks': [" blocks "]}"
#define BLOCK(addr, size) "{'address': " addr ", 'size': " size ", 'requested_size': " size ", 'state': 'active_allocated'}"

static void test_command_names_a_recorded_state_it_cannot_start_from(void **state)
{
    (void)state;
    expect_start_refused("overlap.pickle", SEG20(BLOCK("16777216", "4194304") ", " BLOCK("17825792", "4194304")), "",
                         "blocks live before recording overlap at address 16777216");
    expect_start_refused("gap.pickle", SEG20(BLOCK("17301504", "4194304")), "",
                         "a free gap of 524288 bytes in a large segment (address 16777216)");
    expect_start_refused("big.pickle", SEG20(BLOCK("16777216", "4194304")), "--capacity 18MiB",
                         "a 20971520-byte segment of the recorded state did not fit");
}

static int setup(void **state)
{
    (void)state;
    char bin[PATH_MAX - 64];
    if (tune_setup("test_tune_bad_input_command", "/tmp/tally-tune-bad-command-XXXXXX", bin, sizeof bin))
        return -1;
    snprintf(small_csv, sizeof small_csv, "%s/small.csv", scratch);
    FILE *f = fopen(small_csv, "w");
    if (!f)
        return -1;
    fputs("op,id,size,stream\na,1,1000000,0\na,2,30000000,0\nf,1,0,0\nf,2,0,0\n", f);
    return fclose(f) ? -1 : 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_command_refuses_bad_arguments),
        cmocka_unit_test(test_command_output_that_cannot_be_written),
        cmocka_unit_test(test_plot_title_of_a_long_name_keeps_its_end),
        cmocka_unit_test(test_json_row_that_fits_nowhere_gives_the_least_above),
        cmocka_unit_test(test_command_names_a_recorded_state_it_cannot_start_from),
    };
    return cmocka_run_group_tests(tests, setup, tune_teardown);
}
