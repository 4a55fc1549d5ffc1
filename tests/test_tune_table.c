/* Tests for what tally tune prints, run as a user runs it (the built
 * ../bin/tally) on CSV traces written here and the fixtures: the table
 * (sizes in the "runs out" column, the heading's count of the trace, the
 * note on what a CSV cannot carry, each row's peak reserved, the needs of
 * memory-fraction rows), the JSON rows, the two recommendations (PyTorch's
 * and tally's; a tie goes to fewer backend calls), the least memory the
 * recommendation runs in, the name of PyTorch's line by torch version, the
 * --plot picture and its layout, and one-line errors for bad input.
 * Expected figures are worked out by hand in the comments. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cliutil.h"
#include "report/json.h"
#include "tuneutil.h"

/* Sizes in tune's table are bytes below 100 KiB, KiB from there: a row that
 * runs out with less memory names the event's size (a 30 MB block, then a
 * small one that needs a segment of its own). */
static void test_table_sizes_below_100_kib_are_bytes(void **state)
{
    (void)state;
    static const struct {
        const char *size, *text;
    } cases[] = {{"101376", "101376 B"}, {"102399", "102399 B"}, {"102400", "100.0 KiB"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[PATH_MAX + 32], want[128];
        snprintf(path, sizeof path, "%s/small_event_%zu.csv", scratch, i);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fprintf(f, "op,id,size,stream\na,1,30000000,0\na,2,%s,0\nf,1,0,0\nf,2,0,0\n", cases[i].size);
        assert_int_equal(fclose(f), 0);
        run_t r = tune("'%s'", path);
        snprintf(want, sizeof want, "in 30.0 MiB at 1: %s, 28.6 MiB", cases[i].text);
        if (r.rc != 0 || !strstr(r.out, want))
            fail_msg("%s bytes: status %d, expected '%s' in:\n%s%s", cases[i].size, r.rc, want, r.out, r.err);
        run_free(&r);
    }
}

/* The recommendation gives the least memory its setting runs in whenever
 * the search found it, also when no replay with less ran out (a 2 MiB
 * small segment is the least: nothing below it is tried, so the table's
 * "runs out" is "-"). */
static void test_recommendation_says_what_it_runs_in_without_a_replay_running_out(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/tiny.csv", scratch);
    write_text(path, "op,id,size,stream\na,1,1000,0\na,2,5000,0\nf,1,1000,0\nf,2,5000,0\n");
    tally_json_t *rows = tune_json(path, "");
    const tally_json_t *def = &rows->items[0];
    assert_int_equal(jint(def, "min_device_bytes"), 2 * MiB);
    assert_null(tally__json_get(def, "runs_out")); /* no replay ran out */
    tally__json_free(rows);
    run_t r = tune("'%s'", path);
    if (r.rc != 0 || !strstr(r.out, "\nPyTorch's allocator: keep the default (no setting within the budget reserves "
                                    "less): 2.0 MiB, 1 backend call (default 1), ") ||
        !strstr(r.out, " of driver time on A100; runs in 2.0 MiB\n  PYTORCH_ALLOC_CONF=\n"))
        fail_msg("status %d, table:\n%s", r.rc, r.out);
    run_free(&r);
}

/* A row's figure is the peak of reserved memory, not what is reserved at
 * the end: two 400 MiB blocks, freed, then 700 MiB on a 1 GiB device
 * (the cached 800 MiB released to make room) peak at 800 MiB. */
static void test_rows_give_peak_reserved(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/drop.csv", scratch);
    write_text(path, "op,id,size,stream\na,1,419430400,0\na,2,419430400,0\nf,1,419430400,0\nf,2,419430400,0\n"
                     "a,3,734003200,0\nf,3,734003200,0\n");
    tally_json_t *rows = tune_json(path, "--capacity 1GiB");
    assert_int_equal(jint(&rows->items[0], "peak_reserved_bytes"), 800 << 20);
    tally__json_free(rows);
    /* The table's heading counts the trace: one stream is "1 stream". */
    run_t t = tune("--capacity 1GiB '%s'", path);
    if (t.rc != 0 || !strstr(t.out, "(CSV trace: 6 events, 3 allocations, 1 stream)"))
        fail_msg("status %d, stdout:\n%s", t.rc, t.out);
    /* A memory-fraction row has no least memory (its cap is a share of the
     * device): its "needs" column says so, every other row's does not. */
    int fraction_rows = 0;
    for (const char *line = t.out; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char row[512];
        snprintf(row, sizeof row, "%.*s", (int)(len < sizeof row ? len : sizeof row - 1), line);
        bool fraction_setting = strstr(row, "memory_fraction:") != NULL;
        if (fraction_setting != (strstr(row, " (fraction) ") != NULL))
            fail_msg("row '%s': a memory_fraction setting %s (fraction) in its needs column", row,
                     fraction_setting ? "without" : "is the only one with");
        fraction_rows += fraction_setting;
    }
    if (fraction_rows < 1)
        fail_msg("no memory_fraction row in:\n%s", t.out);
    run_free(&t);
    /* A CSV trace has no devices to pick from: --device is refused, not ignored. */
    expect_one_line_error(tune("--device 0 '%s'", path), 2,
                          "is a CSV trace, which holds one device's allocations (--device picks a device of a "
                          "PyTorch snapshot or a report)");
}

/* --plot draws the default and the recommendation, named in the legend. */
/* A step of 1, 2 or 5 times a power of ten. */
static bool round_step(double step)
{
    double m = step;
    while (m >= 10)
        m /= 10;
    return step >= 1 && (fabs(m - 1) < 1e-9 || fabs(m - 2) < 1e-9 || fabs(m - 5) < 1e-9);
}

/* The chart's layout (issue: the title cut off, the legend over the curves,
 * the last x label clipped, ticks not round): the title holds the file's
 * base name only and fits the width; the legend lies above the plot area
 * (its top is at y 64); axis ticks are 0, s, 2s, ... with s round; the
 * last x label ends inside the 900 px width. */
static void check_plot_layout(const char *svg)
{
    const char *t = strstr(svg, "font-size=\"14\">");
    assert_non_null(t);
    const char *te = strstr(t, "</text>");
    if (memchr(t, '/', (size_t)(te - t)) || te - t > 130)
        fail_msg("title: %.*s", (int)(te - t), t);
    double yv[16], xv[16], xpos[16];
    int ny = 0, nx = 0;
    for (const char *p = svg; (p = strstr(p, "<text ")); p++) {
        double x, y, v;
        char anchor[16];
        if (sscanf(p, "<text x=\"%lf\" y=\"%lf\" text-anchor=\"%15[a-z]\">%lf<", &x, &y, anchor, &v) == 4) {
            if (strcmp(anchor, "end") == 0 && ny < 16)
                yv[ny++] = v;
            else if (strcmp(anchor, "middle") == 0 && nx < 16) {
                xpos[nx] = x;
                xv[nx++] = v;
            }
        }
        if (strstr(p, " fill=\"#") && strstr(p, " fill=\"#") < strchr(p, '>') && sscanf(p, "<text x=\"%lf\" y=\"%lf\"", &x, &y) == 2 &&
            y > 64)
            fail_msg("a legend entry inside the plot area at y %.0f", y);
    }
    assert_true(ny >= 3 && nx >= 3);
    for (int k = 0; k < 2; k++) {
        double *v = k ? xv : yv;
        int n = k ? nx : ny;
        double step = v[1] - v[0];
        if (v[0] != 0 || !round_step(step))
            fail_msg("%s ticks start %.0f, step %.0f", k ? "x" : "y", v[0], step);
        for (int i = 1; i < n; i++)
            if (fabs(v[i] - v[0] - step * i) > 1e-6)
                fail_msg("%s tick %d is %.0f, not %.0f", k ? "x" : "y", i, v[i], step * i);
    }
    char last[32];
    int w = snprintf(last, sizeof last, "%.0f", xv[nx - 1]);
    if (xpos[nx - 1] + 4.0 * w > 900)
        fail_msg("the last x label (%s at x %.0f) runs past the 900 px width", last, xpos[nx - 1]);
}

static void test_plot(void **state)
{
    (void)state;
    char svg[PATH_MAX + 32];
    snprintf(svg, sizeof svg, "%s/tune.svg", scratch);
    run_t r = tune("--plot '%s' '%s/small.pickle'", svg, fixtures);
    assert_int_equal(r.rc, 0);
    /* The table ends by naming the picture. */
    char said[PATH_MAX + 48];
    snprintf(said, sizeof said, "\nplot: %s\n", svg);
    if (!strstr(r.out, said))
        fail_msg("the table does not name the plot (%s):\n%s", said, r.out);
    run_free(&r);
    /* With --json the output stays one JSON array, the picture written all the same. */
    remove(svg);
    r = tune("--json --plot '%s' '%s/small.pickle'", svg, fixtures);
    assert_int_equal(r.rc, 0);
    tally_json_t *rows = tally__json_parse(r.out, strlen(r.out), NULL, 0, NULL);
    if (!rows || strstr(r.out, "plot: "))
        fail_msg("--json --plot output is not one JSON array:\n%s", r.out);
    tally__json_free(rows);
    run_free(&r);
    char *text = slurp(svg);
    assert_non_null(text);
    int paths = 0;
    for (const char *p = text; (p = strstr(p, "<path")); p++)
        paths++;
    assert_int_equal(paths, 2);
    if (!strstr(text, ">PyTorch's default</text>") || !strstr(text, "</svg>"))
        fail_msg("svg:\n%s", text);
    /* Each curve is a staircase: M x y, then a step (H x V y) only where
     * reserved memory changes, to a new height each time, and a last H.
     * small.pickle's reserved memory changes, so each curve steps. */
    for (const char *p = text; (p = strstr(p, "<path fill=\"none\"")); p++) {
        const char *d = strstr(p, " d=\"");
        assert_non_null(d);
        d += 4;
        double x, y, prev;
        int n = 0, steps = 0;
        if (sscanf(d, "M%lf %lf%n", &x, &prev, &n) != 2)
            fail_msg("a curve does not start with M x y: %.60s", d);
        d += n;
        while (sscanf(d, "H%lfV%lf%n", &x, &y, &n) == 2) {
            if (y == prev)
                fail_msg("a step of a curve to the height it is at (%.1f): %.80s", y, d);
            prev = y;
            steps++;
            d += n;
        }
        n = 0;
        if (sscanf(d, "H%lf\"%n", &x, &n) != 1 || n == 0)
            fail_msg("a curve does not end with one H x: %.60s", d);
        if (steps < 1)
            fail_msg("a curve of small.pickle has no step");
    }
    check_plot_layout(text);
    free(text);
    expect_one_line_error(tune("--plot /nonexistent/dir/x.svg '%s/small.pickle'", fixtures), 1, "cannot write");
}

/* ---- two recommendations ----------------------------------------------------------- */

/* three.csv's rows, worked by hand at three_blocks (tuneutil.h). */
static void test_two_recommendations(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    three_csv(path, sizeof path);
    tally_json_t *rows = tune_json(path, "--capacity 1GiB");
    static const struct {
        const char *setting, *allocator;
        int64_t reserved, calls;
    } want[] = {
        {"", "PyTorch/tally", 52, 3},
        {"large_segment_size_mb:4", "PyTorch/tally", 38, 3},
        {"large_segment_size_mb:10", "PyTorch/tally", 42, 3},
        {"expandable_segments:True", "PyTorch (model)", 42, 3},
        {"expandable_segments:True,large_segment_size_mb:2", "PyTorch (model)", 38, 19},
        {"expandable_segments:True,large_segment_size_mb:10", "PyTorch (model)", 42, 5},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        const tally_json_t *row = row_of(rows, want[i].setting, want[i].allocator);
        if (jint(row, "peak_reserved_bytes") != want[i].reserved * (int64_t)MiB ||
            jint(row, "backend_calls") != want[i].calls)
            fail_msg("%s (%s): %lld bytes, %lld calls; want %lld MiB, %lld calls", want[i].setting,
                     want[i].allocator, (long long)jint(row, "peak_reserved_bytes"),
                     (long long)jint(row, "backend_calls"), (long long)want[i].reserved, (long long)want[i].calls);
    }
    assert_true(jtrue(row_of(rows, "large_segment_size_mb:4", "PyTorch/tally"), "recommended"));
    /* tally's own expandable row is tally's, never PyTorch's. */
    const tally_json_t *tex = row_of(rows, "expandable_segments:True", "tally");
    assert_false(jtrue(tex, "recommended"));
    assert_string_equal(tally__json_get(tex, "line")->s, "TALLY_CONF=expandable_segments:True");
    assert_string_equal(tally__json_get(row_of(rows, "expandable_segments:True", "PyTorch (model)"), "line")->s,
                        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True");
    tally__json_free(rows);
    /* The table: both names of PyTorch's line, tally's line, and which allocator each row models. */
    run_t r = tune("--capacity 1GiB --torch-version 2.11 '%s'", path);
    assert_int_equal(r.rc, 0);
    if (!strstr(r.out, "PyTorch's allocator: large_segment_size_mb:4 reserves 38.0 MiB") ||
        !strstr(r.out, "\n  PYTORCH_ALLOC_CONF=large_segment_size_mb:4\n") ||
        !strstr(r.out, "\n  PYTORCH_CUDA_ALLOC_CONF=large_segment_size_mb:4\n") || !strstr(r.out, "\n  TALLY_CONF=") ||
        !strstr(r.out, "allocator") || !strstr(r.out, "PyTorch (model)") || !strstr(r.out, "<- PyTorch") ||
        !strstr(r.out, "<- tally"))
        fail_msg("table:\n%s", r.out);
    run_free(&r);
}

/* Ties on peak reserved go to fewer backend calls (a device free counts as
 * one, not only the allocations). tie.csv: 32 MiB, freed, then 40 MiB, in
 * 40 MiB of device memory. PyTorch's default makes a 32 MiB segment, frees
 * it to fit the 40 MiB one and makes that: 40 MiB in 2 allocations and 1
 * free, 3 calls. PyTorch's expandable segments map two 20 MiB pages for the
 * 32 MiB and serve the 40 MiB from them: 40 MiB in 2 calls, which is the
 * recommendation; it reserves no less, and the summary says so. Among
 * tally's rows the tie goes the same way: its expandable segments map the
 * 40 MiB as two handles (one per 20 MiB cell, expandable_handle_grid_mb: 2
 * calls), and with a move budget as one (1 call), which is tally's
 * recommendation. With the
 * default over --max-calls, or not fitting at all, the summary names why it
 * was passed over. */
static void test_tie_goes_to_fewer_calls(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/tie.csv", scratch);
    write_text(path, "op,id,size,stream\na,1,33554432,0\nf,1,0,0\na,2,41943040,0\n");
    tally_json_t *rows = tune_json(path, "--capacity 40MiB");
    const tally_json_t *def = &rows->items[0], *model = row_of(rows, "expandable_segments:True", "PyTorch (model)");
    assert_int_equal(jint(def, "peak_reserved_bytes"), 40 * MiB);
    assert_int_equal(jint(def, "backend_calls"), 3);
    assert_int_equal(jint(def, "device_allocs"), 2);
    assert_int_equal(jint(model, "peak_reserved_bytes"), 40 * MiB);
    assert_int_equal(jint(model, "backend_calls"), 2);
    assert_false(jtrue(def, "recommended"));
    assert_true(jtrue(model, "recommended"));
    tally__json_free(rows);
    /* The JSON escapes only what JSON needs: text with blanks reads as it is
     * written, for a grep or a diff of the output as much as for a parser. */
    run_t r = tune("--json --capacity 40MiB '%s'", path);
    if (r.rc != 0 || !strstr(r.out, "\"why\":\"PyTorch's default\"") ||
        !strstr(r.out, "\"allocator\":\"PyTorch (model)\"") || strstr(r.out, "\\u"))
        fail_msg("status %d, JSON:\n%s", r.rc, r.out);
    run_free(&r);
    r = tune("--capacity 40MiB '%s'", path);
    assert_int_equal(r.rc, 0);
    if (!strstr(r.out, "PyTorch's allocator: expandable_segments:True reserves the same 40.0 MiB as the default, "
                       "2 backend calls (default 3),") ||
        !strstr(r.out, "\ntally: expandable_segments:True,expandable_move_budget:10000 reserves the same 40.0 MiB as "
                       "the default, 1 backend call (default 3),") ||
        strstr(r.out, "keep the default"))
        fail_msg("table:\n%s", r.out);
    run_free(&r);
    r = tune("--capacity 40MiB --max-calls 2 '%s'", path);
    if (r.rc != 0 || !strstr(r.out, "PyTorch's allocator: expandable_segments:True reserves 40.0 MiB, where the "
                                    "default is over the call budget, 2 backend calls (default 3)"))
        fail_msg("table:\n%s", r.out);
    run_free(&r);
    /* 5 MiB and 25 MiB: the default's 20 MiB segment for the 5 MiB block
     * leaves too little for the 26 MiB one. */
    write_text(path, "op,id,size,stream\na,1,5242880,0\na,2,26214400,0\n");
    r = tune("--capacity 40MiB '%s'", path);
    if (r.rc != 0 || !strstr(r.out, " reserves 30.0 MiB, where the default does not fit in 40.0 MiB, "))
        fail_msg("table:\n%s", r.out);
    run_free(&r);
}

/* Which name to use, by torch version: --torch-version, else the installed
 * torch's ($TALLY_PYTHON asked to import it), else both rules. */
static void expect_version(const char *args, const char *want)
{
    char path[PATH_MAX + 32];
    three_csv(path, sizeof path);
    run_t r = tune("--capacity 1GiB %s '%s'", args, path);
    if (r.rc != 0 || !strstr(r.out, want))
        fail_msg("tune %s: status %d, output lacks '%s':\n%s", args, r.rc, want, r.out);
    run_free(&r);
}

static void test_torch_version(void **state)
{
    (void)state;
    expect_version("--torch-version 2.8.0",
                   "torch 2.8.0 (--torch-version): use PYTORCH_CUDA_ALLOC_CONF (versions before 2.9 do not read");
    expect_version("--torch-version 2.9.1", "torch 2.9.1 (--torch-version): use PYTORCH_CUDA_ALLOC_CONF (2.9 reads "
                                            "PYTORCH_ALLOC_CONF but ignores expandable_segments");
    expect_version("--torch-version 2.11", "torch 2.11 (--torch-version): use PYTORCH_ALLOC_CONF");
    /* torch 1.x is a version too (1.13 is still run), and there is no 0.x form to name. */
    expect_version("--torch-version 1.13.1",
                   "torch 1.13.1 (--torch-version): use PYTORCH_CUDA_ALLOC_CONF (versions before 2.9 do not read");
    /* No torch to import. */
    setenv("TALLY_PYTHON", "false", 1);
    expect_version("", "torch version unknown (give --torch-version)");
    /* An installed torch (a stand-in python that prints a version). */
    char py[PATH_MAX + 32], cmd[PATH_MAX + 64];
    snprintf(py, sizeof py, "%s/python-torch", scratch);
    write_text(py, "#!/bin/sh\necho 2.10.0+cu130\n");
    snprintf(cmd, sizeof cmd, "chmod +x '%s'", py);
    assert_int_equal(system(cmd), 0);
    setenv("TALLY_PYTHON", py, 1);
    expect_version("", "torch 2.10.0+cu130 (the installed torch): use PYTORCH_ALLOC_CONF");
    expect_version("--torch-version 2.9.0", "torch 2.9.0 (--torch-version)"); /* the flag wins */
    unsetenv("TALLY_PYTHON");
    expect_one_line_error(tune("--torch-version two '%s/small.pickle'", fixtures), 2,
                          "--torch-version 'two' is not a torch version");
    expect_one_line_error(tune("--torch-version 2 '%s/small.pickle'", fixtures), 2,
                          "--torch-version '2' is not a torch version");
    expect_one_line_error(tune("--torch-version 0.4.1 '%s/small.pickle'", fixtures), 2,
                          "--torch-version '0.4.1' is not a torch version");
}

/* A CSV says what it cannot carry. */
static void test_csv_start_unknown(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    three_csv(path, sizeof path);
    run_t r = tune("--capacity 1GiB '%s'", path);
    assert_int_equal(r.rc, 0);
    if (!strstr(r.out, "(a CSV lists the blocks live before recording began, not the cached free segments PyTorch "
                       "held then: every replay starts from an empty cache)"))
        fail_msg("table:\n%s", r.out);
    run_free(&r);
}

/* ---- bad input --------------------------------------------------------------------- */

static void test_api_bad_input(void **state)
{
    (void)state;
    expect_one_line_error(tune("'%s/empty.csv'", fixtures), 1, "empty.csv: empty trace: no allocations to replay");
    expect_one_line_error(tune("'%s/truncated.csv'", fixtures), 1,
                          "truncated.csv:5: expected 4 fields op,id,size,stream, got fewer");
    /* The fixture snapshot cut short. */
    char src[PATH_MAX + 32], cut[PATH_MAX + 32];
    snprintf(src, sizeof src, "%s/small.pickle", fixtures);
    snprintf(cut, sizeof cut, "%s/cut.pickle", scratch);
    char *data = slurp(src);
    assert_non_null(data);
    FILE *f = fopen(cut, "wb");
    assert_non_null(f);
    fwrite(data, 1, 300, f);
    fclose(f);
    free(data);
    expect_one_line_error(tune("'%s'", cut), 1, "cut.pickle: not a readable pickle: truncated");
    /* A pickle of plain data that is not a snapshot. */
    snprintf(cut, sizeof cut, "%s/list.pickle", scratch);
    f = fopen(cut, "wb");
    fwrite("\x80\x04]\x94.", 1, 5, f);
    fclose(f);
    expect_one_line_error(tune("'%s'", cut), 1, "PyTorch snapshot: the pickle holds a list, not a dict");
    expect_one_line_error(tune("'%s/no_size.pickle'", fixtures), 1,
                          "no_size.pickle: PyTorch snapshot: device_traces event[0]: 'size' is missing");
    expect_one_line_error(tune("--device 1 '%s/small.pickle'", fixtures), 1,
                          "small.pickle: PyTorch snapshot: no device 1 (device_traces has 1 device)");
    expect_one_line_error(tune("--device x '%s/small.pickle'", fixtures), 2, "--device 'x' is not a device number");
    /* Device numbers run from 0 to 1024: the last is looked for in the trace, past it and below 0 are no numbers. */
    expect_one_line_error(tune("--device 1024 '%s/small.pickle'", fixtures), 1,
                          "small.pickle: PyTorch snapshot: no device 1024 (device_traces has 1 device)");
    expect_one_line_error(tune("--device 1025 '%s/small.pickle'", fixtures), 2,
                          "--device '1025' is not a device number");
    expect_one_line_error(tune("--device -1 '%s/small.pickle'", fixtures), 2, "--device '-1' is not a device number");
    expect_one_line_error(tune("--capacity 80XB '%s/small.pickle'", fixtures), 2, "--capacity '80XB' is not a size");
    expect_one_line_error(tune("--capacity 0 '%s/small.pickle'", fixtures), 2, "--capacity '0' is not a size");
    expect_one_line_error(tune("--jobs 0 '%s/small.pickle'", fixtures), 2, "--jobs '0'");
    expect_one_line_error(tune("'%s/missing.csv'", fixtures), 1, "missing.csv: cannot open");
    expect_one_line_error(tune("%s", ""), 2, "FILE is missing");
    /* A JSON file that is not a report, and a report without a trace. */
    expect_one_line_error(tune("'%s/../memory_stats.json'", fixtures), 1, "not a tally report");
    expect_one_line_error(tune("'%s/../bad_report.json'", fixtures), 1, "bad_report.json");
}

static int setup(void **state)
{
    (void)state;
    char bin[PATH_MAX - 64]; /* .../build/tests */
    return tune_setup("test_tune_table", "/tmp/tally-tune-table-XXXXXX", bin, sizeof bin);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_sizes_below_100_kib_are_bytes),
        cmocka_unit_test(test_recommendation_says_what_it_runs_in_without_a_replay_running_out),
        cmocka_unit_test(test_rows_give_peak_reserved),
        cmocka_unit_test(test_plot),
        cmocka_unit_test(test_two_recommendations),
        cmocka_unit_test(test_tie_goes_to_fewer_calls),
        cmocka_unit_test(test_torch_version),
        cmocka_unit_test(test_csv_start_unknown),
        cmocka_unit_test(test_api_bad_input),
    };
    tune_test_filter();
    return cmocka_run_group_tests(tests, setup, tune_teardown);
}
