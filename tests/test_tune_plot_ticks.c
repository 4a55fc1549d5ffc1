/* tally tune --plot: the ticks of the SVG chart's axes, read from the file
 * the command writes (the built ../bin/tally, run as a user runs it). The
 * step between ticks is 1, 2 or 5 times a power of ten, the smallest of
 * those at least the axis's range over its number of steps (5 for the y
 * axis, reserved MiB; 8 for the x axis, events), and the top tick is a
 * whole number of steps at or above the range, drawn at the axis's end.
 *
 * Each trace is one block of S MiB allocated and freed in turn, N events
 * in all: PyTorch's default placement gives a block of 10 MiB or more a
 * segment of its size rounded to 2 MiB (S is even), and the freed segment
 * is cached and serves the next allocation, so every replay reserves S MiB
 * from the first event on. The x axis counts the N events. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cliutil.h"
#include "report/json.h"
#include "tuneutil.h"

/* Layout of tools/tune_output.c's chart: 900 x 440 px, the plot area from
 * x 80 to 850 and from y 390 (memory 0) up to 64. */
#define X_LEFT 80.0
#define X_RIGHT 850.0
#define Y_BOTTOM 390.0
#define Y_TOP 64.0

/* Run "tally ARGS" (ARGS formatted, passed through the shell). */
__attribute__((format(printf, 1, 2))) static run_t tally_run(const char *fmt, ...)
{
    char args[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    return run_tool(tally_bin, scratch, args);
}

typedef struct ticks {
    double v[64], at[64]; /* the labels' values and where they sit */
    int n;
} ticks_t;

/* The chart of the trace "N events of an S MiB block", its two axes' tick
 * labels: y labels are anchored at their end, x labels in their middle
 * (the axis's name "event" is not a number, so it is left out). */
static void chart(int events, int mib, ticks_t *y, ticks_t *x)
{
    char csv[PATH_MAX + 32], svg[PATH_MAX + 32];
    snprintf(csv, sizeof csv, "%s/n%d-s%d.csv", scratch, events, mib);
    snprintf(svg, sizeof svg, "%s/n%d-s%d.svg", scratch, events, mib);
    FILE *f = fopen(csv, "w");
    assert_non_null(f);
    fputs("op,id,size,stream\n", f);
    for (int i = 0; i < events; i++)
        fprintf(f, "%c,%d,%llu,0\n", i % 2 ? 'f' : 'a', i / 2 + 1, (unsigned long long)mib << 20);
    assert_int_equal(fclose(f), 0);
    run_t r = tally_run("tune -q --plot '%s' '%s'", svg, csv);
    if (r.rc != 0)
        fail_msg("tally tune --plot %s: status %d, stderr:\n%s", svg, r.rc, r.err);
    run_free(&r);
    char *text = slurp(svg);
    assert_non_null(text);
    y->n = x->n = 0;
    for (const char *p = text; (p = strstr(p, "<text ")); p++) {
        double px, py, v;
        char anchor[16];
        if (sscanf(p, "<text x=\"%lf\" y=\"%lf\" text-anchor=\"%15[a-z]\">%lf<", &px, &py, anchor, &v) != 4)
            continue;
        ticks_t *t = strcmp(anchor, "end") == 0 ? y : strcmp(anchor, "middle") == 0 ? x : NULL;
        if (t && t->n < 64) {
            t->v[t->n] = v;
            t->at[t->n++] = t == y ? py - 4 : px; /* a y label sits 4 px below its grid line */
        }
    }
    free(text);
}

/* The ticks are exactly 0, step, 2 step, ... top, evenly spaced from one
 * end of the axis (from) to the other (to). */
static void expect_ticks(const char *axis, const ticks_t *t, double step, double top, double from, double to,
                         int events, int mib)
{
    int want = (int)(top / step) + 1;
    char got[512] = "";
    for (int i = 0, n = 0; i < t->n && n + 16 < (int)sizeof got; i++)
        n += snprintf(got + n, sizeof got - (size_t)n, "%s%g", i ? " " : "", t->v[i]);
    if (t->n != want)
        fail_msg("%d events of %d MiB: %s ticks %s, expected 0 to %g by %g", events, mib, axis, got, top, step);
    for (int i = 0; i < t->n; i++) {
        if (t->v[i] != step * i)
            fail_msg("%d events of %d MiB: %s ticks %s, expected 0 to %g by %g", events, mib, axis, got, top, step);
        double where = from + (to - from) * i / (want - 1);
        if (fabs(t->at[i] - where) > 0.06)
            fail_msg("%d events of %d MiB: %s tick %g at %.1f, expected at %.1f (ticks evenly spaced to the axis's "
                     "end)",
                     events, mib, axis, t->v[i], t->at[i], where);
    }
}

static void expect_chart(int events, int mib, double xstep, double xtop, double ystep, double ytop)
{
    ticks_t y, x;
    chart(events, mib, &y, &x);
    expect_ticks("y", &y, ystep, ytop, Y_BOTTOM, Y_TOP, events, mib);
    expect_ticks("x", &x, xstep, xtop, X_LEFT, X_RIGHT, events, mib);
}

/* A range over its steps whose leading figure is above 1, up to 2, gets a
 * step of 2 (not 1): 12 events / 8 = 1.5 -> 2; 60 MiB / 5 = 12 -> 20; and
 * at the bound, 16 / 8 = 2 -> 2, 100 MiB / 5 = 20 -> 20. */
static void test_tune_plot_tick_step_two(void **state)
{
    (void)state;
    expect_chart(12, 60, 2, 12, 20, 60);
    expect_chart(16, 100, 2, 16, 20, 100);
}

/* A leading figure of exactly 1 keeps a step of 1 times its power of ten:
 * 8 events / 8 = 1 -> 1; 50 MiB / 5 = 10 -> 10. */
static void test_tune_plot_tick_step_one(void **state)
{
    (void)state;
    expect_chart(8, 50, 1, 8, 10, 50);
}

/* Above 2, up to 5: a step of 5, the top tick rounded up to a whole step:
 * 24 events / 8 = 3 -> 5, top 25; 150 MiB / 5 = 30 -> 50; and at the
 * bound, 40 / 8 = 5 -> 5, 250 MiB / 5 = 50 -> 50. */
static void test_tune_plot_tick_step_five(void **state)
{
    (void)state;
    expect_chart(24, 150, 5, 25, 50, 150);
    expect_chart(40, 250, 5, 40, 50, 250);
}

/* Above 5: the next power of ten: 56 events / 8 = 7 -> 10, top 60;
 * 40 MiB / 5 = 8 -> 10. */
static void test_tune_plot_tick_step_ten(void **state)
{
    (void)state;
    expect_chart(56, 40, 10, 60, 10, 40);
}

static int setup(void **state)
{
    (void)state;
    char bin[PATH_MAX - 64];
    return tune_setup("test_tune_plot_ticks", "/tmp/tally-tune-ticks-XXXXXX", bin, sizeof bin);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tune_plot_tick_step_one),
        cmocka_unit_test(test_tune_plot_tick_step_two),
        cmocka_unit_test(test_tune_plot_tick_step_five),
        cmocka_unit_test(test_tune_plot_tick_step_ten),
    };
    return cmocka_run_group_tests(tests, setup, tune_teardown);
}
