/* The tally command (tools/tally_cli.c), run as a user runs it, its stdout,
 * stderr and exit status checked (harness: cliutil.h, CLIUTIL_REPORTS): `tally
 * plot`, the timeline as SVG and HTML (well-formed XML, dropped events said,
 * a report without a timeline, a burst narrower than a pixel). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "skip.h"

#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CLIUTIL_REPORTS /* the children, setup, tally_run, HAS, EXPECT_RC */
#include "cliutil.h"
#include "report/json.h"
#include "report/report.h"

#include "plotutil.h"

/* ---- plot ------------------------------------------------------------------ */

static void test_plot_svg(void **state)
{
    (void)state;
    char out[PATH_MAX + 16];
    snprintf(out, sizeof out, "%s/plot.svg", dir);
    run_t r = tally_run("plot '%s/train.json' -o '%s'", dir, out);
    EXPECT_RC(r, 0);
    HAS(r.out, "plot.svg: device 0, ");
    run_free(&r);
    int x = xml_check(out);
    if (x == 77)
        SKIP("neither python3's xml.dom.minidom nor xmllint is installed to check the SVG");
    if (x != 0)
        fail_msg("%s is not well-formed XML", out);
    char *svg = slurp(out);
    assert_non_null(svg);
    HAS(svg, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\"");
    /* One filled area per tag on device 0, the reserved line, stage bands. */
    assert_true(count(svg, "<path class=\"tag\"") == 5);
    HAS(svg, "<path class=\"reserved\"");
    for (const char *const *t = (const char *const[]){"weights", "model-init", "scratch", "activations",
                                                       "gradients", NULL};
         *t; t++) {
        char want[64];
        snprintf(want, sizeof want, "<title>%s</title></path>", *t);
        HAS(svg, want);
    }
    /* Stacked steadiest first: model-init (allocated once, kept), weights and
     * scratch (each allocated once, freed once), then the tags that churn. */
    const char *order[] = {"model-init", "weights", "scratch", "gradients", "activations"};
    const char *at = svg;
    for (size_t i = 0; i < sizeof order / sizeof *order; i++) {
        char want[64];
        snprintf(want, sizeof want, "<title>%s</title></path>", order[i]);
        const char *next = strstr(at, want);
        if (!next)
            fail_msg("tag areas are not stacked model-init, weights, scratch, gradients, activations: %s is "
                     "out of order",
                     order[i]);
        at = next;
    }
    HAS(svg, ">load</text>");
    HAS(svg, ">train</text>");
    HAS(svg, ">warmup</text>");
    HAS(svg, "<text");
    HAS(svg, "memory (MiB)</text>");
    HAS(svg, "time since the first event (");
    HAS(svg, "reserved (peak ");
    if (strstr(svg, "<script") || strstr(svg, "href="))
        fail_msg("the SVG should be self-contained");
    free(svg);
    /* Device 1 has its one stray block. */
    r = tally_run("plot '%s/train.json' --device 1 --x events -o '%s'", dir, out);
    EXPECT_RC(r, 0);
    run_free(&r);
    svg = slurp(out);
    assert_true(count(svg, "<path class=\"tag\"") == 1);
    HAS(svg, "<title>stray</title></path>");
    HAS(svg, "event number (of ");
    free(svg);
    assert_int_equal(xml_check(out), 0);
}

/* The top of the reserved line (its smallest y) in a plot of device 0. */
static double reserved_top(const char *x_mode)
{
    char out[PATH_MAX + 16];
    snprintf(out, sizeof out, "%s/top-%s.svg", dir, x_mode);
    run_t r = tally_run("plot '%s/train.json' --x %s -o '%s'", dir, x_mode, out);
    EXPECT_RC(r, 0);
    run_free(&r);
    char *svg = slurp(out);
    assert_non_null(svg);
    const char *d = strstr(svg, "<path class=\"reserved\"");
    assert_non_null(d);
    d = strstr(d, " d=\"");
    assert_non_null(d);
    d += 4;
    double top = 1e9, x, y;
    int used = 0;
    while (sscanf(d, " %*[ML]%lf,%lf%n", &x, &y, &used) == 2) {
        if (y < top)
            top = y;
        d += used;
    }
    free(svg);
    assert_true(top < 1e9);
    return top;
}

/* Memory is a step function of time: every edge of every tag's area and of
 * the reserved line is horizontal or vertical, by time and by event number,
 * including the edge an area closes along (the top of the areas below);
 * and no memory is below 0 (segment events move no tag's area). */
static void test_plot_outlines_are_steps(void **state)
{
    (void)state;
    static const char *const modes[] = {"time", "events"};
    for (int m = 0; m < 2; m++) {
        char out[PATH_MAX + 16];
        snprintf(out, sizeof out, "%s/steps-%s.svg", dir, modes[m]);
        run_t r = tally_run("plot '%s/train.json' --x %s -o '%s'", dir, modes[m], out);
        EXPECT_RC(r, 0);
        run_free(&r);
        double zero_y; /* nothing is drawn below memory 0 */
        char *svg = slurp_plot(out, &zero_y);
        int paths = 0;
        for (const char *at = strstr(svg, "<path class=\""); at; at = strstr(at + 1, "<path class=\"")) {
            const char *d = strstr(at, " d=\"");
            assert_non_null(d);
            d += 4;
            double x, y, px = 0, py = 0;
            int used = 0, pts = 0;
            while (sscanf(d, " %*[ML]%lf,%lf%n", &x, &y, &used) == 2) {
                if (y > zero_y + 0.05)
                    fail_msg("plot by %s: a point at y %.1f, below memory 0 (y %.1f), in %.60s", modes[m], y, zero_y,
                             at);
                if (pts && x != px && y != py)
                    fail_msg("plot by %s: a diagonal edge from (%.1f, %.1f) to (%.1f, %.1f) in %.60s", modes[m], px,
                             py, x, y, at);
                px = x;
                py = y;
                pts++;
                d += used;
            }
            assert_true(pts >= 2);
            paths++;
        }
        assert_true(paths >= 6); /* five tags and the reserved line */
        free(svg);
    }
}

/* The areas stack: each tag's area closes along exactly the top edge of the
 * area below it (the areas neither overlap nor leave a gap), and the lowest
 * along memory 0. */
static void test_plot_areas_close_along_the_area_below(void **state)
{
    (void)state;
    static const char *const modes[] = {"time", "events"};
    static pts_t cur, top_below;
    for (int m = 0; m < 2; m++) {
        char out[PATH_MAX + 16];
        snprintf(out, sizeof out, "%s/stack-%s.svg", dir, modes[m]);
        run_t r = tally_run("plot '%s/train.json' --x %s -o '%s'", dir, modes[m], out);
        EXPECT_RC(r, 0);
        run_free(&r);
        double zero_y;
        char *svg = slurp_plot(out, &zero_y);
        int areas = 0;
        for (const char *at = strstr(svg, "<path class=\"tag\""); at; at = strstr(at + 1, "<path class=\"tag\"")) {
            read_pts(strstr(at, " d=\"") + 4, &cur);
            double xmax = cur.x[0];
            for (int i = 1; i < cur.n; i++)
                if (cur.x[i] > xmax)
                    xmax = cur.x[i];
            int j = 0;
            while (cur.x[j] != xmax)
                j++;
            /* cur[0..j] is the top edge; the rest, reversed, the bottom. */
            pts_t bottom = {.n = 0};
            if (j + 1 >= cur.n || cur.x[j + 1] != xmax) { /* the bottom's first point merged into the top's last */
                bottom.x[0] = xmax;
                bottom.y[0] = cur.y[j];
                bottom.n = 1;
            }
            for (int i = j + 1; i < cur.n; i++) {
                bottom.x[bottom.n] = cur.x[i];
                bottom.y[bottom.n++] = cur.y[i];
            }
            if (areas == 0) {
                for (int i = 0; i < bottom.n; i++)
                    if (bottom.y[i] != zero_y)
                        fail_msg("plot by %s: the lowest area's bottom edge leaves memory 0 at (%.1f, %.1f)",
                                 modes[m], bottom.x[i], bottom.y[i]);
            } else {
                bool same = bottom.n == top_below.n;
                for (int i = 0; same && i < bottom.n; i++)
                    same = bottom.x[bottom.n - 1 - i] == top_below.x[i] && bottom.y[bottom.n - 1 - i] == top_below.y[i];
                if (!same)
                    fail_msg("plot by %s: area %d does not close along the top of area %d (%d points against %d)",
                             modes[m], areas, areas - 1, bottom.n, top_below.n);
            }
            top_below.n = j + 1;
            memcpy(top_below.x, cur.x, sizeof(double) * (size_t)(j + 1));
            memcpy(top_below.y, cur.y, sizeof(double) * (size_t)(j + 1));
            areas++;
        }
        assert_true(areas >= 5);
        free(svg);
    }
}

/* Plotted by time (one point per pixel column) the reserved line reaches
 * the same peak as plotted by event number (one point per event): the
 * columns cover every event. */
static void test_plot_by_time_covers_every_event(void **state)
{
    (void)state;
    double by_events = reserved_top("events"), by_time = reserved_top("time");
    if (by_time != by_events)
        fail_msg("the reserved line tops out at y %.1f by time, %.1f by events", by_time, by_events);
}

/* The y axis's unit stops at TiB: a device that reached petabytes is
 * drawn in TiB (train.json's timeline scaled by 2^25: peaks of PiB). */
static void test_plot_axis_unit_stops_at_tib(void **state)
{
    (void)state;
    char big[PATH_MAX + 16], out[PATH_MAX + 16], cmd[3 * PATH_MAX + 400];
    snprintf(big, sizeof big, "%s/huge.json", dir);
    snprintf(out, sizeof out, "%s/huge.svg", dir);
    snprintf(cmd, sizeof cmd,
             "python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))\n"
             "for e in d[\"timeline\"]:\n"
             "    e.update({k: e[k] << 25 for k in (\"allocated\", \"reserved\", \"size\") if k in e})\n"
             "json.dump(d, open(sys.argv[2], \"w\"))' '%s/train.json' '%s' 2>/dev/null",
             dir, big);
    if (system(cmd) != 0)
        SKIP("python3 is needed to scale the report");
    run_t r = tally_run("plot '%s' -o '%s'", big, out);
    EXPECT_RC(r, 0);
    run_free(&r);
    char *svg = slurp(out);
    assert_non_null(svg);
    HAS(svg, "memory (TiB)</text>");
    free(svg);
}

static void test_plot_html(void **state)
{
    (void)state;
    char out[PATH_MAX + 16];
    snprintf(out, sizeof out, "%s/plot.html", dir);
    run_t r = tally_run("plot --output '%s' '%s/train.json'", out, dir);
    EXPECT_RC(r, 0);
    run_free(&r);
    char *html = slurp(out);
    assert_non_null(html);
    HAS(html, "<!DOCTYPE html>");
    HAS(html, "<svg xmlns=\"http://www.w3.org/2000/svg\"");
    HAS(html, "<h2>Stages (whole process)</h2>");
    HAS(html, "<tr><td>gradients</td><td>32.0 MiB</td></tr>");
    /* Peaks largest first (ties in order of first appearance). */
    HAS(html, "<tr><th>tag</th><th>peak</th></tr>\n<tr><td>weights</td><td>32.0 MiB</td></tr>\n"
              "<tr><td>scratch</td><td>32.0 MiB</td></tr>\n<tr><td>gradients</td><td>32.0 MiB</td></tr>\n"
              "<tr><td>model-init</td><td>8.0 MiB</td></tr>\n<tr><td>activations</td><td>8.0 MiB</td></tr>\n"
              "</table>");
    /* The blocks live when the report was written: the leaks, at exit. */
    HAS(html, "<h2>Live blocks when the report was written (at exit: the leaks)</h2>");
    HAS(html, "<tr><td>model-init</td><td>load</td><td>0</td><td>2</td><td>8.0 MiB</td></tr>");
    HAS(html, "<tr><td>stray</td><td>train</td><td>1 (foreign)</td><td>1</td><td>1.0 MiB</td></tr>");
    if (strstr(html, "<?xml") || strstr(html, "<script") || strstr(html, "https://"))
        fail_msg("the HTML should be self-contained, with the SVG inline");
    free(html);
}

/* A timeline cut by timeline_events: the plot says how many of the oldest
 * events were dropped (the full run's device-0 events less the 16 kept). */
static void test_plot_says_how_many_events_were_dropped(void **state)
{
    (void)state;
    char conf[PATH_MAX + 256], out[PATH_MAX + 16];
    snprintf(conf, sizeof conf,
             "backend:host,host_devices:2,home_device:0,timeline:true,timeline_events:16,report_path:%s/cut.json,"
             "leak_report:off,stage_report:false,persistent_tags:weights",
             dir);
    const char *env[] = {"TALLY_CONF", conf, NULL};
    assert_int_equal(spawn_child("train", env), 0);
    snprintf(out, sizeof out, "%s/train.json", dir);
    char *full = slurp(out);
    assert_non_null(full);
    int all = (int)count(full, "{\"device\":0,\"time_us\"");
    free(full);
    assert_true(all > 16);
    snprintf(out, sizeof out, "%s/cut.html", dir);
    run_t r = tally_run("plot '%s/cut.json' -o '%s'", dir, out);
    EXPECT_RC(r, 0);
    char want[200];
    snprintf(want, sizeof want, "the timeline had dropped the %d oldest events of device 0", all - 16);
    HAS(r.out, want);
    run_free(&r);
    char *html = slurp(out);
    assert_non_null(html);
    snprintf(want, sizeof want, "16 events, peak allocated");
    HAS(html, want);
    snprintf(want, sizeof want, "; %d older events dropped (timeline_events)", all - 16);
    HAS(html, want);
    free(html);
    r = tally_run("plot '%s/train.json' -o '%s'", dir, out); /* nothing dropped: nothing said */
    EXPECT_RC(r, 0);
    if (strstr(r.out, "dropped"))
        fail_msg("a whole timeline is reported as cut: %s", r.out);
    run_free(&r);
}

static void test_plot_without_timeline(void **state)
{
    (void)state;
    run_t r = tally_run("plot '%s/plain.json' -o '%s/none.svg'", dir, dir);
    EXPECT_RC(r, 1);
    HAS(r.err, "plain.json: the report has no timeline to plot; run the process with TALLY_CONF=timeline:true");
    run_free(&r);
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/none.svg", dir);
    assert_int_not_equal(access(path, F_OK), 0);
    r = tally_run("plot '%s/train.json' --device 3 -o '%s/none.svg'", dir, dir);
    EXPECT_RC(r, 1);
    HAS(r.err, "no timeline events for device 3 (the timeline has allocations on devices 0, 1)");
    run_free(&r);
}

/* ---- the timeline as the report writes it ---------------------------------- */

/* An event of a report's timeline: the report writes one object a line,
 * "device", "time_us" and "action" first. */
typedef struct tl_event {
    int device;
    char action[32], stage[64];
    const char *at; /* its object's text in the report, len bytes from "{" */
    size_t len;
} tl_event_t;

static bool is_stage_event(const tl_event_t *e)
{
    return strcmp(e->action, "stage_begin") == 0 || strcmp(e->action, "stage_end") == 0;
}

/* The events of the timeline in json, oldest first; how many (at most max). */
static int read_timeline(const char *json, tl_event_t *ev, int max)
{
    const char *p = strstr(json, "\"timeline\":[\n");
    assert_non_null(p);
    p += strlen("\"timeline\":[\n");
    int n = 0;
    while (n < max && (p = strchr(p, '{')) && strncmp(p, "{\"device\":", 10) == 0) {
        tl_event_t *e = &ev[n++];
        e->stage[0] = 0;
        if (sscanf(p, "{\"device\":%d,\"time_us\":%*[0-9],\"action\":\"%31[^\"]\"", &e->device, e->action) != 2)
            fail_msg("timeline event %d: %.80s", n - 1, p);
        const char *end = strchr(p, '}'), *st = strstr(p, "\"stage\":\"");
        assert_non_null(end);
        if (st && st < end)
            assert_int_equal(sscanf(st, "\"stage\":\"%63[^\"]\"", e->stage), 1);
        e->at = p;
        e->len = (size_t)(end + 1 - p);
        p = end + 1;
        if (*p != ',')
            break; /* "]": the last one */
    }
    return n;
}

/* train.json with its timeline cut to the events on device dev (only its
 * stage_begin and stage_end events with stages_only), written to dst. */
static void write_cut_timeline(const char *dst, int dev, bool stages_only)
{
    static tl_event_t ev[1024];
    char src[PATH_MAX + 16];
    snprintf(src, sizeof src, "%s/train.json", dir);
    char *json = slurp(src);
    assert_non_null(json);
    int n = read_timeline(json, ev, 1024);
    assert_true(n > 0 && n < 1024);
    FILE *f = fopen(dst, "w");
    assert_non_null(f);
    fwrite(json, 1, (size_t)(ev[0].at - json), f);
    int kept = 0;
    for (int i = 0; i < n; i++)
        if (ev[i].device == dev && (!stages_only || is_stage_event(&ev[i])))
            fprintf(f, "%s%.*s", kept++ ? ",\n " : "", (int)ev[i].len, ev[i].at);
    fputs(ev[n - 1].at + ev[n - 1].len, f);
    assert_int_equal(fclose(f), 0);
    free(json);
    assert_true(kept > 0);
}

/* ---- stage bands --------------------------------------------------------------- */

/* The timeline of train.json, oldest first (at least one event, fewer
 * than max); how many. The text is freed: the events' `at` is not to be
 * read. */
static int train_timeline(tl_event_t *ev, int max)
{
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/train.json", dir);
    char *json = slurp(path);
    assert_non_null(json);
    int n = read_timeline(json, ev, max);
    free(json);
    assert_true(n > 0 && n < max);
    return n;
}

/* Where the x axis puts 0 and how many pixels one unit of it takes, from
 * its ticks: tick 0, and the last tick's value and place. */
static void x_axis(const char *svg, double *x0, double *px_per_unit)
{
    const char *axis = strstr(svg, "<g class=\"x-axis\""), *axis_end = axis ? strstr(axis, "</g>") : NULL;
    assert_non_null(axis_end);
    double xl = 0, vl = 0;
    *x0 = -1;
    for (const char *t = strstr(axis, "<text x=\""); t && t < axis_end; t = strstr(t + 1, "<text x=\"")) {
        double x, v;
        assert_int_equal(sscanf(t, "<text x=\"%lf\" y=\"%*f\">%lf<", &x, &v), 2);
        if (v == 0)
            *x0 = x;
        xl = x;
        vl = v;
    }
    assert_true(*x0 >= 0 && vl > 0);
    *px_per_unit = (xl - *x0) / vl;
}

/* train.json plotted by event number into dir/name: the SVG's text (to be
 * freed), with where its x axis puts event 0 and the pixels per event. */
static char *plot_train_by_events(const char *name, double *x0, double *px_per_event)
{
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    run_t r = tally_run("plot '%s/train.json' --x events -o '%s'", dir, path);
    EXPECT_RC(r, 0);
    run_free(&r);
    char *svg = slurp(path);
    assert_non_null(svg);
    x_axis(svg, x0, px_per_event);
    return svg;
}

/* By event number with a point per event, every outline (each tag's area
 * and the reserved line) starts at event 0, on the axis's 0, and reaches
 * the last event: none leaves out the first event's memory. Past the last
 * event it has no point but its end at the plot's edge. */
static void test_plot_by_events_starts_at_the_first_event(void **state)
{
    (void)state;
    static tl_event_t ev[1024];
    int n = train_timeline(ev, 1024), last = -1;
    for (int i = 0; i < n; i++)
        last += ev[i].device == 0;
    assert_true(last > 0);
    double x0, px;
    char *svg = plot_train_by_events("first.svg", &x0, &px);
    static pts_t line;
    int paths = 0;
    for (const char *at = strstr(svg, "<path class=\""); at; at = strstr(at + 1, "<path class=\"")) {
        read_pts(strstr(at, " d=\"") + 4, &line);
        assert_true(line.n >= 2);
        double lo = line.x[0], hi = line.x[0];
        for (int i = 1; i < line.n; i++) {
            lo = line.x[i] < lo ? line.x[i] : lo;
            hi = line.x[i] > hi ? line.x[i] : hi;
        }
        if (fabs(lo - x0) > 0.25)
            fail_msg("an outline (%.40s) starts at x %.1f, not at event 0 (x %.1f)", at, lo, x0);
        double xlast = x0 + px * last;
        if (hi + 0.25 < xlast)
            fail_msg("an outline (%.40s) ends at x %.1f, before the last event (%d, x %.1f)", at, hi, last, xlast);
        /* After the last event it only runs on flat to the plot's edge. */
        for (int i = 0; i < line.n; i++)
            if (line.x[i] > xlast + 0.25 && line.x[i] < hi - 0.25)
                fail_msg("an outline (%.40s) has a point at x %.1f, past the last event (%d, x %.1f)", at,
                         line.x[i], last, xlast);
        paths++;
    }
    assert_true(paths >= 6); /* five tags and the reserved line */
    free(svg);
}

/* Each stage's band spans its stage_begin event to its stage_end event,
 * and only stages have bands: by event number, on device 0 of train.json
 * (load, then train with a nested warmup), one band per stage_begin, in
 * the order the stages ended, its shaded rect and its dashed lines at the
 * x of its begin and end events (the x axis's ticks give where event k
 * is: tick 0, and the last tick's value and place). */
static void test_plot_stage_band_starts_at_stage_begin(void **state)
{
    (void)state;
    static tl_event_t ev[1024];
    int n = train_timeline(ev, 1024);
    /* The bands wanted: stage_end k closes the innermost open stage. */
    struct {
        char name[64];
        int kb, ke;
    } want[16];
    int nwant = 0, open[16], depth = 0, k = 0;
    for (int i = 0; i < n; i++) {
        if (ev[i].device != 0)
            continue;
        if (strcmp(ev[i].action, "stage_begin") == 0) {
            assert_true(depth < 16);
            open[depth++] = k;
        } else if (strcmp(ev[i].action, "stage_end") == 0) {
            assert_true(depth > 0 && nwant < 16);
            snprintf(want[nwant].name, sizeof want[nwant].name, "%s", ev[i].stage);
            want[nwant].kb = open[--depth];
            want[nwant++].ke = k;
        }
        k++;
    }
    assert_int_equal(depth, 0);
    assert_int_equal(nwant, 3);

    double x0, px_per_event;
    char *svg = plot_train_by_events("bands.svg", &x0, &px_per_event);

    int bands = 0;
    for (const char *g = strstr(svg, "<g class=\"stage\">"); g; g = strstr(g + 1, "<g class=\"stage\">")) {
        char name[64];
        double rx, rw, lb, le;
        assert_int_equal(sscanf(g, "<g class=\"stage\"><title>stage %63[^<]<", name), 1);
        const char *rect = strstr(g, "<rect x=\""), *dash = strstr(g, "<path d=\"M");
        assert_non_null(rect);
        assert_non_null(dash);
        assert_int_equal(sscanf(rect, "<rect x=\"%lf\" y=\"%*d\" width=\"%lf\"", &rx, &rw), 2);
        assert_int_equal(sscanf(dash, "<path d=\"M%lf,%*d V%*d M%lf,", &lb, &le), 2);
        if (bands >= nwant) {
            fail_msg("%d stage bands, but the timeline has %d stages: band %d (\"%s\") at x %.1f is drawn from "
                     "an event that begins no stage",
                     bands + 1, nwant, bands + 1, name, rx);
        }
        double xb = x0 + px_per_event * want[bands].kb, xe = x0 + px_per_event * want[bands].ke;
        if (strcmp(name, want[bands].name) != 0)
            fail_msg("band %d is stage \"%s\", expected \"%s\"", bands + 1, name, want[bands].name);
        if (fabs(rx - xb) > 0.25 || fabs(lb - xb) > 0.25)
            fail_msg("stage %s's band starts at x %.1f (dashed line at %.1f), not at its stage_begin (event %d, "
                     "x %.1f)",
                     name, rx, lb, want[bands].kb, xb);
        if (fabs(rx + rw - xe) > 0.25 || fabs(le - xe) > 0.25)
            fail_msg("stage %s's band ends at x %.1f (dashed line at %.1f), not at its stage_end (event %d, x %.1f)",
                     name, rx + rw, le, want[bands].ke, xe);
        bands++;
    }
    free(svg);
    assert_int_equal(bands, nwant);
}

/* ---- the default device ------------------------------------------------------- */

/* Without --device, a report whose home device (0) has no events on the
 * timeline is drawn for the device with the most (train.json cut to
 * device 1's events: its stages and its one stray block). */
static void test_plot_default_device_is_busiest_when_home_has_none(void **state)
{
    (void)state;
    char cut[PATH_MAX + 16], out[PATH_MAX + 16];
    snprintf(cut, sizeof cut, "%s/device1.json", dir);
    snprintf(out, sizeof out, "%s/device1.svg", dir);
    write_cut_timeline(cut, 1, false);
    run_t r = tally_run("plot '%s' -o '%s'", cut, out);
    EXPECT_RC(r, 0);
    HAS(r.out, "device1.svg: device 1, 8 events, 1 tag group");
    run_free(&r);
    char *svg = slurp(out);
    assert_non_null(svg);
    HAS(svg, "<title>tally: memory over time, device 1, rank 0");
    HAS(svg, "<title>stray</title></path>");
    free(svg);
}

/* Without --device, a timeline with no allocations at all (only stage
 * events, all on device 1: train.json cut to them) is drawn for the device
 * it is on, not for device 0, which has nothing to draw. */
static void test_plot_default_device_without_allocations_is_the_timelines(void **state)
{
    (void)state;
    char cut[PATH_MAX + 16], out[PATH_MAX + 16];
    snprintf(cut, sizeof cut, "%s/stages1.json", dir);
    snprintf(out, sizeof out, "%s/stages1.svg", dir);
    write_cut_timeline(cut, 1, true);
    run_t r = tally_run("plot '%s' -o '%s'", cut, out);
    EXPECT_RC(r, 0);
    HAS(r.out, "stages1.svg: device 1, 6 events, 0 tag groups");
    run_free(&r);
    char *svg = slurp(out);
    assert_non_null(svg);
    HAS(svg, "<title>tally: memory over time, device 1, rank 0");
    assert_int_equal(count(svg, "<g class=\"stage\">"), 3);
    free(svg);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plot_svg),
        cmocka_unit_test(test_plot_html),
        cmocka_unit_test(test_plot_outlines_are_steps),
        cmocka_unit_test(test_plot_areas_close_along_the_area_below),
        cmocka_unit_test(test_plot_by_time_covers_every_event),
        cmocka_unit_test(test_plot_axis_unit_stops_at_tib),
        cmocka_unit_test(test_plot_says_how_many_events_were_dropped),
        cmocka_unit_test(test_plot_without_timeline),
        cmocka_unit_test(test_plot_stage_band_starts_at_stage_begin),
        cmocka_unit_test(test_plot_by_events_starts_at_the_first_event),
        cmocka_unit_test(test_plot_default_device_is_busiest_when_home_has_none),
        cmocka_unit_test(test_plot_default_device_without_allocations_is_the_timelines),
    };
    return CLI_MAIN("cli_plot", tests);
}
