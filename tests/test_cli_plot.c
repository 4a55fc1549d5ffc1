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

/* ---- plot ------------------------------------------------------------------ */

/* 0 when path parses as XML (python3's minidom, else xmllint); 77 when
 * neither is available. */
static int xml_check(const char *path)
{
    char cmd[PATH_MAX + 200];
    if (system("python3 -c 'import xml.dom.minidom' >/dev/null 2>&1") == 0) {
        snprintf(cmd, sizeof cmd,
                 "python3 -c \"import xml.dom.minidom,sys; xml.dom.minidom.parse(sys.argv[1])\" '%s'", path);
        return system(cmd) == 0 ? 0 : 1;
    }
    if (system("xmllint --version >/dev/null 2>&1") == 0) {
        snprintf(cmd, sizeof cmd, "xmllint --noout '%s'", path);
        return system(cmd) == 0 ? 0 : 1;
    }
    return 77;
}

static size_t count(const char *s, const char *sub)
{
    size_t n = 0;
    for (const char *p = strstr(s, sub); p; p = strstr(p + 1, sub))
        n++;
    return n;
}

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

/* The plot at path (an SVG file), and in *zero_y the y of memory 0: the
 * first grid line's. */
static char *slurp_plot(const char *path, double *zero_y)
{
    char *svg = slurp(path);
    assert_non_null(svg);
    const char *grid = strstr(svg, "<g class=\"grid\"");
    assert_non_null(grid);
    const char *y1 = strstr(grid, " y1=\"");
    assert_non_null(y1);
    assert_int_equal(sscanf(y1 + 5, "%lf", zero_y), 1);
    return svg;
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

/* The points of an SVG path "M x,y L x,y ...". */
typedef struct {
    double x[8192], y[8192];
    int n;
} pts_t;

static void read_pts(const char *d, pts_t *p)
{
    int used = 0;
    p->n = 0;
    while (p->n < 8192 && sscanf(d, " %*[ML]%lf,%lf%n", &p->x[p->n], &p->y[p->n], &used) == 2) {
        p->n++;
        d += used;
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

/* Open DIR/NAME.json for a report written by hand, up to the start of its
 * timeline array (home device 0, no devices, ledger, stages or leaks); out
 * gets DIR/NAME.svg, where the plot goes. The caller writes the events and
 * closes the array and the file. */
static FILE *open_timeline_report(const char *name, char path[PATH_MAX + 16], char out[PATH_MAX + 16])
{
    snprintf(path, PATH_MAX + 16, "%s/%s.json", dir, name);
    snprintf(out, PATH_MAX + 16, "%s/%s.svg", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"format\":\"tally-report\",\"version\":\"" TALLY_VERSION "\",\"home_device\":0,\"backend\":\"host\","
          "\"devices\":[],\"ledger\":[],\"stages\":[],\"leaks\":[],\"timeline\":[\n",
          f);
    return f;
}

/* By event number the x axis says how many events the device has, the
 * count the command prints, also when there are more events than pixel
 * columns (870) times two and the points drawn are per column, far fewer:
 * a report written by hand with 1000 allocations of 1 MiB, each freed at
 * once, one microsecond apart (2000 events). */
static void test_plot_by_events_axis_counts_the_devices_events(void **state)
{
    (void)state;
    char path[PATH_MAX + 16], out[PATH_MAX + 16];
    FILE *f = open_timeline_report("ev2k", path, out);
    static const char ev[] = "%s{\"device\":0,\"time_us\":%lld,\"action\":\"%s\",\"addr\":%zu,\"size\":%zu,"
                             "\"stream\":0,\"allocated\":%zu,\"reserved\":%zu,\"tag\":\"pair\",\"stage\":\"train\"}\n";
    for (int i = 0; i < 2000; i++) {
        bool alloc = i % 2 == 0;
        fprintf(f, ev, i ? "," : "", 1000LL + i, alloc ? "alloc" : "free_requested", 4 * MiB, MiB,
                alloc ? MiB : 0, 32 * MiB);
    }
    fputs("]}\n", f);
    assert_int_equal(fclose(f), 0);
    run_t r = tally_run("plot '%s' --x events -o '%s'", path, out);
    EXPECT_RC(r, 0);
    HAS(r.out, "ev2k.svg: device 0, 2000 events, 1 tag group");
    run_free(&r);
    char *svg = slurp(out);
    assert_non_null(svg);
    HAS(svg, ">event number (of 2000 on this device)</text>");
    free(svg);
    assert_int_equal(xml_check(out), 0);
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

/* ---- bursts narrower than a pixel ------------------------------------------- */

/* A burst within one pixel column shows, one pixel wide, at its height: 20
 * allocations of 1 MiB, then their 20 frees, all in the same microsecond,
 * and one more 1 MiB a second later (a report written by hand). Plotted by
 * time, the first column holds all 40 burst events (more than the plot's
 * tables start with room for); its point is at the column's peak (20 MiB) and
 * its state after the last event (0) follows one column later, so the
 * tag's top edge reaches its highest y at two x a pixel apart, not in a
 * vertical line of zero width at the left edge. */
static void test_plot_burst_in_one_column_shows_a_pixel_wide(void **state)
{
    (void)state;
    char path[PATH_MAX + 16], out[PATH_MAX + 16];
    FILE *f = open_timeline_report("burst", path, out);
    static const char ev[] = "%s{\"device\":0,\"time_us\":%lld,\"action\":\"%s\",\"addr\":%zu,\"size\":%zu,"
                             "\"stream\":0,\"allocated\":%zu,\"reserved\":%zu,\"tag\":\"burst\",\"stage\":\"train\"}\n";
    size_t allocated = 0;
    for (int i = 0; i < 40; i++) {
        bool alloc = i < 20;
        allocated = alloc ? allocated + MiB : allocated - MiB;
        fprintf(f, ev, i ? "," : "", 1000LL, alloc ? "alloc" : "free_requested", (size_t)(i % 20 + 1) * MiB, MiB,
                allocated, 32 * MiB);
    }
    fprintf(f, ev, ",", 1001000LL, "alloc", 100 * MiB, MiB, MiB, 32 * MiB);
    fputs("]}\n", f);
    assert_int_equal(fclose(f), 0);
    run_t r = tally_run("plot '%s' --x time -o '%s'", path, out);
    EXPECT_RC(r, 0);
    HAS(r.out, "burst.svg: device 0, 41 events, 1 tag group, peak allocated 20.0 MiB\n");
    run_free(&r);
    double zero_y;
    char *svg = slurp_plot(out, &zero_y);
    const char *at = strstr(svg, "<path class=\"tag\"");
    assert_non_null(at);
    const char *title = strstr(at, "<title>");
    assert_non_null(title);
    assert_int_equal(strncmp(title, "<title>burst</title>", 20), 0);
    static pts_t pts;
    read_pts(strstr(at, " d=\"") + 4, &pts);
    assert_true(pts.n >= 4);
    double top = pts.y[0], xmin = 1e9, xmax = -1e9;
    for (int i = 1; i < pts.n; i++)
        if (pts.y[i] < top)
            top = pts.y[i];
    for (int i = 0; i < pts.n; i++)
        if (pts.y[i] == top) {
            xmin = pts.x[i] < xmin ? pts.x[i] : xmin;
            xmax = pts.x[i] > xmax ? pts.x[i] : xmax;
        }
    /* The column starts at its peak, 20 MiB of the 32 MiB reserved. */
    if (pts.y[0] != top)
        fail_msg("the burst's column starts at y %.1f, not at its peak (y %.1f): %.300s", pts.y[0], top, at);
    assert_true(top < zero_y);
    if (xmax - xmin < 0.95)
        fail_msg("the burst's peak is %.1f pixels wide (x %.1f to %.1f), not a column: %.300s", xmax - xmin, xmin,
                 xmax, at);
    free(svg);
}

/* The tag area titled title in svg (its <path> element), or NULL. */
static const char *area_of(const char *svg, const char *title)
{
    char want[64];
    snprintf(want, sizeof want, "<title>%s</title>", title);
    for (const char *at = strstr(svg, "<path class=\"tag\""); at; at = strstr(at + 1, "<path class=\"tag\"")) {
        const char *t = strstr(at, "<title>");
        if (t && strncmp(t, want, strlen(want)) == 0)
            return at;
    }
    return NULL;
}

/* The highest point (least y) of the tag area titled title in svg. */
static double area_top(const char *svg, const char *title)
{
    const char *at = area_of(svg, title);
    if (at) {
        static pts_t pts;
        read_pts(strstr(at, " d=\"") + 4, &pts);
        assert_true(pts.n >= 4);
        double top = pts.y[0];
        for (int i = 1; i < pts.n; i++)
            top = pts.y[i] < top ? pts.y[i] : top;
        return top;
    }
    fail_msg("no tag area titled %s", title);
    return 0;
}

/* An area's colour: its fill, in the legend too. */
static void expect_area_color(const char *svg, const char *title, const char *color)
{
    const char *at = area_of(svg, title);
    assert_non_null(at);
    char want[96];
    snprintf(want, sizeof want, "<path class=\"tag\" fill=\"%s\"", color);
    if (strncmp(at, want, strlen(want)) != 0)
        fail_msg("the area of %s is not %s: %.80s", title, color, at);
    snprintf(want, sizeof want, "<title>%s</title><rect x=", title);
    const char *legend = strstr(svg, want);
    assert_non_null(legend);
    snprintf(want, sizeof want, "fill=\"%s\"/>", color);
    const char *fill = strstr(legend, "fill=\"");
    if (!fill || strncmp(fill, want, strlen(want)) != 0)
        fail_msg("the legend of %s is not %s: %.120s", title, color, legend);
}

/* More tags than the plot draws on their own (PLOT_TAGS, 9): eleven tags
 * t0..t10 of 1..11 MiB, allocated one after the other and kept. The nine
 * largest get areas of their own, stacked t2 (3 MiB) at the bottom to t10;
 * t0 and t1 go to "other tags" on top, 3 MiB, so the stack ends at 66 MiB:
 * 22 times t2's height, and "other tags" as tall as t2. */
static void test_plot_other_tags_on_top_of_nine(void **state)
{
    (void)state;
    char path[PATH_MAX + 16], out[PATH_MAX + 16];
    FILE *f = open_timeline_report("eleven", path, out);
    size_t allocated = 0;
    for (int k = 0; k < 11; k++) {
        allocated += (size_t)(k + 1) * MiB;
        fprintf(f,
                "%s{\"device\":0,\"time_us\":%d,\"action\":\"alloc\",\"addr\":%zu,\"size\":%zu,\"stream\":0,"
                "\"allocated\":%zu,\"reserved\":%zu,\"tag\":\"t%d\",\"stage\":\"s\"}\n",
                k ? "," : "", 1000 * (k + 1), (size_t)(k + 1) * 64 * MiB, (size_t)(k + 1) * MiB, allocated,
                128 * MiB, k);
    }
    fputs("]}\n", f);
    assert_int_equal(fclose(f), 0);
    run_t r = tally_run("plot '%s' -o '%s'", path, out);
    EXPECT_RC(r, 0);
    HAS(r.out, "eleven.svg: device 0, 11 events, 10 tag groups, peak allocated 66.0 MiB\n");
    run_free(&r);
    double zero_y;
    char *svg = slurp_plot(out, &zero_y);
    HAS(svg, "other tags (peaks add to 3.0 MiB)");
    /* "other tags" is grey-brown; the nine have the palette's colours from
     * the bottom of the stack up: t2 its first, t10 its ninth. */
    expect_area_color(svg, "other tags", "#bab0ab");
    expect_area_color(svg, "t2", "#4e79a7");
    expect_area_color(svg, "t10", "#9c755f");
    double unit = zero_y - area_top(svg, "t2"); /* 3 MiB */
    double all = zero_y - area_top(svg, "other tags"), below = zero_y - area_top(svg, "t10");
    assert_true(unit > 1);
    if (fabs(all / unit - 22) > 0.1 || fabs((all - below) / unit - 1) > 0.1)
        fail_msg("the stack's top is %.2f x t2's 3 MiB (want 22), other tags %.2f x (want 1)", all / unit,
                 (all - below) / unit);
    free(svg);
}

/* The legend gives a tag name of up to 24 characters whole, and a longer
 * one as its first 22 and "..." (the area's title keeps the whole name). */
static void test_plot_legend_shortens_names_past_24_characters(void **state)
{
    (void)state;
    char path[PATH_MAX + 16], out[PATH_MAX + 16];
    FILE *f = open_timeline_report("names", path, out);
    char n24[25], n25[26];
    memset(n24, 'w', 24);
    n24[24] = 0;
    memset(n25, 'y', 25);
    n25[25] = 0;
    const char *names[2] = {n24, n25};
    for (int k = 0; k < 2; k++)
        fprintf(f,
                "%s{\"device\":0,\"time_us\":%d,\"action\":\"alloc\",\"addr\":%zu,\"size\":%zu,\"stream\":0,"
                "\"allocated\":%zu,\"reserved\":%zu,\"tag\":\"%s\",\"stage\":\"s\"}\n",
                k ? "," : "", 1000 * (k + 1), (size_t)(k + 1) * 64 * MiB, MiB, (size_t)(k + 1) * MiB, 64 * MiB,
                names[k]);
    fputs("]}\n", f);
    assert_int_equal(fclose(f), 0);
    run_t r = tally_run("plot '%s' -o '%s'", path, out);
    EXPECT_RC(r, 0);
    run_free(&r);
    double zero_y;
    char *svg = slurp_plot(out, &zero_y);
    char want[64];
    snprintf(want, sizeof want, ">%s (peak 1.0 MiB)<", n24);
    HAS(svg, want);
    snprintf(want, sizeof want, ">%.22s... (peak 1.0 MiB)<", n25);
    HAS(svg, want);
    snprintf(want, sizeof want, "<title>%s</title>", n25);
    HAS(svg, want);
    free(svg);
}

/* A free belongs to the block allocated last at its address (docs/
 * reports.md: "the tag the block at that address was allocated under"):
 * with the free of an earlier block there lost, 1 MiB under tag a at 64 MiB
 * and then 1 MiB under b at the same address, the free that follows takes
 * b's bytes, not a's; b's next 1 MiB elsewhere then brings b back to 1 MiB
 * (its peak), where a stale owner would have left b at 2 MiB and a at 0. */
static void test_plot_free_takes_the_latest_alloc_at_its_address(void **state)
{
    (void)state;
    char path[PATH_MAX + 16], out[PATH_MAX + 16];
    FILE *f = open_timeline_report("readdr", path, out);
    static const char ev[] = "%s{\"device\":0,\"time_us\":%d,\"action\":\"%s\",\"addr\":%zu,\"size\":%zu,"
                             "\"stream\":0,\"allocated\":%zu,\"reserved\":%zu,\"tag\":\"%s\",\"stage\":\"s\"}\n";
    fprintf(f, ev, "", 1000, "alloc", 64 * MiB, MiB, MiB, 8 * MiB, "a");
    fprintf(f, ev, ",", 2000, "alloc", 64 * MiB, MiB, 2 * MiB, 8 * MiB, "b");
    fprintf(f, ev, ",", 3000, "free_requested", 64 * MiB, MiB, MiB, 8 * MiB, "b");
    fprintf(f, ev, ",", 4000, "alloc", 128 * MiB, MiB, 2 * MiB, 8 * MiB, "b");
    fputs("]}\n", f);
    assert_int_equal(fclose(f), 0);
    run_t r = tally_run("plot '%s' -o '%s'", path, out);
    EXPECT_RC(r, 0);
    HAS(r.out, "readdr.svg: device 0, 4 events, 2 tag groups");
    run_free(&r);
    double zero_y;
    char *svg = slurp_plot(out, &zero_y);
    HAS(svg, ">a (peak 1.0 MiB)<");
    HAS(svg, ">b (peak 1.0 MiB)<");
    free(svg);
}

/* The x of a legend key (a rect's or path's first coordinate) just before
 * the label text, and the label's own x: 20 px apart in every entry. */
static void expect_label_beside_key(const char *svg, const char *label)
{
    char want[128];
    snprintf(want, sizeof want, ">%s", label);
    const char *at = strstr(svg, want);
    if (!at)
        fail_msg("no legend label '%s'", label);
    const char *text = at;
    while (text > svg && strncmp(text, "<text x=\"", 9) != 0)
        text--;
    const char *key = text;
    while (key > svg && strncmp(key, "<rect x=\"", 9) != 0 && strncmp(key, "<path d=\"M", 10) != 0)
        key--;
    double kx = strtod(key + (key[1] == 'r' ? 9 : 10), NULL), tx = strtod(text + 9, NULL);
    if (fabs(tx - (kx + 20)) > 0.01)
        fail_msg("legend label '%s' at x %.1f, its key at %.1f: want the label 20 px right of the key", label, tx,
                 kx);
}

/* Each out-of-memory event is a red marker at the top of the plot, at its
 * time on the same scale as the areas (the first event at the left edge,
 * the axis 2% past the last), titled with the bytes asked; the legend then
 * has an "out of memory" entry, and a plot without one has none. */
static void test_plot_marks_each_out_of_memory(void **state)
{
    (void)state;
    char path[PATH_MAX + 16], out[PATH_MAX + 16];
    FILE *f = open_timeline_report("ooms", path, out);
    static const char ev[] = "%s{\"device\":0,\"time_us\":%d,\"action\":\"%s\",\"addr\":%zu,\"size\":%zu,"
                             "\"stream\":0,\"allocated\":%zu,\"reserved\":%zu,\"tag\":\"w\",\"stage\":\"s\"}\n";
    fprintf(f, ev, "", 1000, "alloc", 64 * MiB, MiB, MiB, 2 * MiB);
    fprintf(f, ev, ",", 2000, "oom", (size_t)0, 8192 * MiB, MiB, 2 * MiB);
    fprintf(f, ev, ",", 4000, "oom", (size_t)0, 3 * MiB, MiB, 2 * MiB);
    fprintf(f, ev, ",", 5000, "free", 64 * MiB, MiB, (size_t)0, 2 * MiB);
    fputs("]}\n", f);
    assert_int_equal(fclose(f), 0);
    run_t r = tally_run("plot '%s' -o '%s'", path, out);
    EXPECT_RC(r, 0);
    run_free(&r);
    double zero_y;
    char *svg = slurp_plot(out, &zero_y);
    assert_int_equal(count(svg, "<path class=\"oom\""), 2);
    /* Plot area x 90..960 (tools/cli_plot_draw.h); the axis spans 4000 us
     * times 1.02 from the first event. */
    char want[160];
    const int at[2] = {1000, 3000};
    const size_t asked[2] = {8192 * MiB, 3 * MiB};
    for (int k = 0; k < 2; k++) {
        snprintf(want, sizeof want,
                 "<path class=\"oom\" d=\"M%.1f,70 l-6,-10 h12 z\" fill=\"#d62728\"><title>out of memory: %zu bytes "
                 "asked</title></path>",
                 90 + at[k] / 4080.0 * 870, asked[k]);
        HAS(svg, want);
    }
    HAS(svg, ">out of memory</text>");
    expect_label_beside_key(svg, "out of memory<");
    expect_label_beside_key(svg, "reserved (peak ");
    expect_label_beside_key(svg, "stage (begin / end)<");
    expect_label_beside_key(svg, "w (peak 1.0 MiB)<");
    free(svg);
    /* Without an out-of-memory event: no marker, no legend entry. */
    f = open_timeline_report("no-ooms", path, out);
    fprintf(f, ev, "", 1000, "alloc", 64 * MiB, MiB, MiB, 2 * MiB);
    fprintf(f, ev, ",", 5000, "free", 64 * MiB, MiB, (size_t)0, 2 * MiB);
    fputs("]}\n", f);
    assert_int_equal(fclose(f), 0);
    r = tally_run("plot '%s' -o '%s'", path, out);
    EXPECT_RC(r, 0);
    run_free(&r);
    svg = slurp_plot(out, &zero_y);
    assert_int_equal(count(svg, "class=\"oom\""), 0);
    if (strstr(svg, "out of memory"))
        fail_msg("a plot without an out-of-memory event mentions one");
    free(svg);
}

/* Every event at the same microsecond: the time axis has no span, and the
 * plot still draws finite coordinates (an alloc and its free, one column). */
static void test_plot_events_at_one_time_stay_finite(void **state)
{
    (void)state;
    char path[PATH_MAX + 16], out[PATH_MAX + 16];
    FILE *f = open_timeline_report("instant", path, out);
    static const char ev[] = "%s{\"device\":0,\"time_us\":5000,\"action\":\"%s\",\"addr\":%zu,\"size\":%zu,"
                             "\"stream\":0,\"allocated\":%zu,\"reserved\":%zu,\"tag\":\"kv\",\"stage\":\"s\"}\n";
    fprintf(f, ev, "", "alloc", 4 * MiB, 2 * MiB, 2 * MiB, 4 * MiB);
    fprintf(f, ev, ",", "alloc", 8 * MiB, MiB, 3 * MiB, 4 * MiB);
    fprintf(f, ev, ",", "free_requested", 4 * MiB, 2 * MiB, MiB, 4 * MiB);
    fputs("]}\n", f);
    assert_int_equal(fclose(f), 0);
    run_t r = tally_run("plot '%s' --x time -o '%s'", path, out);
    EXPECT_RC(r, 0);
    HAS(r.out, "instant.svg: device 0, 3 events, 1 tag group, peak allocated 3.0 MiB\n");
    run_free(&r);
    double zero_y;
    char *svg = slurp_plot(out, &zero_y);
    if (strstr(svg, "nan") || strstr(svg, "inf"))
        fail_msg("a coordinate is not finite: %.400s", svg);
    const char *at = area_of(svg, "kv");
    assert_non_null(at);
    static pts_t pts;
    read_pts(strstr(at, " d=\"") + 4, &pts);
    assert_true(pts.n >= 4);
    for (int i = 0; i < pts.n; i++)
        if (!isfinite(pts.x[i]) || !isfinite(pts.y[i]) || pts.x[i] < 0 || pts.x[i] > 2000)
            fail_msg("point %d of the kv area is (%g, %g)", i, pts.x[i], pts.y[i]);
    free(svg);
}

/* The plot of a report written by hand: one 512-byte block allocated at
 * 1000 us and freed span_us later, under a reserved peak of peak bytes. */
static char *plot_two_events(size_t peak, int span_us)
{
    char path[PATH_MAX + 16], out[PATH_MAX + 16];
    FILE *f = open_timeline_report("unit", path, out);
    static const char ev[] = "%s{\"device\":0,\"time_us\":%d,\"action\":\"%s\",\"addr\":%zu,\"size\":%zu,"
                             "\"stream\":0,\"allocated\":%zu,\"reserved\":%zu,\"tag\":\"kv\",\"stage\":\"s\"}\n";
    fprintf(f, ev, "", 1000, "alloc", 4 * MiB, (size_t)512, (size_t)512, peak);
    fprintf(f, ev, ",", 1000 + span_us, "free_requested", 4 * MiB, (size_t)512, (size_t)0, peak);
    fputs("]}\n", f);
    assert_int_equal(fclose(f), 0);
    run_t r = tally_run("plot '%s' -o '%s'", path, out);
    EXPECT_RC(r, 0);
    run_free(&r);
    char *svg = slurp(out);
    assert_non_null(svg);
    return svg;
}

/* The labels of an axis's group (class cls), space-separated, into buf. */
static void axis_labels(const char *svg, const char *cls, char *buf, size_t cap)
{
    char open[64];
    snprintf(open, sizeof open, "<g class=\"%s\"", cls);
    const char *g = strstr(svg, open), *end = g ? strstr(g, "</g>") : NULL;
    assert_non_null(end);
    size_t n = 0;
    buf[0] = 0;
    for (const char *t = strstr(g, "<text "); t && t < end; t = strstr(t + 1, "<text ")) {
        const char *v = strchr(t, '>'), *ve = v ? strchr(v, '<') : NULL;
        assert_non_null(ve);
        n += (size_t)snprintf(buf + n, cap - n, "%s%.*s", n ? " " : "", (int)(ve - v - 1), v + 1);
        assert_true(n < cap);
    }
}

/* The y axis's unit is the largest whose count at the peak is at least 1: a
 * peak of exactly 1 MiB is drawn in MiB, one byte less in KiB. */
static void plot_unit_at_peak(size_t peak, const char *unit)
{
    char *svg = plot_two_events(peak, 1000);
    char want[64];
    snprintf(want, sizeof want, "memory (%s)</text>", unit);
    if (!strstr(svg, want))
        fail_msg("a peak of %zu bytes: no '%s' in the plot", peak, want);
    free(svg);
}

static void test_plot_axis_unit_changes_at_1024_of_it(void **state)
{
    (void)state;
    plot_unit_at_peak(MiB, "MiB");
    plot_unit_at_peak(MiB - 1, "KiB");
    plot_unit_at_peak(1024, "KiB");
}

/* The y axis is labelled from 0 up in its step, one label per grid line: a
 * peak of 1 MiB in steps of 0.2 MiB. */
static void test_plot_y_axis_labels_start_at_zero(void **state)
{
    (void)state;
    char *svg = plot_two_events(MiB, 1000);
    char labels[256];
    axis_labels(svg, "y-axis", labels, sizeof labels);
    assert_string_equal(labels, "0 0.2 0.4 0.6 0.8 1");
    const char *grid = strstr(svg, "<g class=\"grid\""), *grid_end = grid ? strstr(grid, "</g>") : NULL;
    assert_non_null(grid_end);
    size_t lines = 0;
    for (const char *l = strstr(grid, "<line "); l && l < grid_end; l = strstr(l + 1, "<line "))
        lines++;
    assert_int_equal(lines, 6);
    free(svg);
}

/* The time axis is in microseconds while it spans less than 2000 us, in
 * milliseconds from there and in seconds from 2 s. The axis runs 2% past the
 * last event, so an event span of 1960 us gives an axis of 1999.2 us, 1961 us
 * one of 2000.2 us (no whole number of microseconds gives exactly 2000). */
static void plot_time_unit(int span_us, const char *unit, const char *labels_want)
{
    char *svg = plot_two_events(MiB, span_us);
    char want[64], labels[256];
    snprintf(want, sizeof want, ">time since the first event (%s)</text>", unit);
    if (!strstr(svg, want))
        fail_msg("a span of %d us: no '%s' in the plot", span_us, want);
    axis_labels(svg, "x-axis", labels, sizeof labels);
    if (strcmp(labels, labels_want) != 0)
        fail_msg("a span of %d us: x labels '%s', expected '%s'", span_us, labels, labels_want);
    free(svg);
}

static void test_plot_time_unit_changes_at_an_axis_of_2000_of_it(void **state)
{
    (void)state;
    plot_time_unit(1960, "\xc2\xb5s", "0 500 1000 1500");
    plot_time_unit(1961, "ms", "0 0.5 1 1.5 2");
    plot_time_unit(1960784, "ms", "0 500 1000 1500");
    plot_time_unit(1960785, "s", "0 0.5 1 1.5 2");
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
        cmocka_unit_test(test_plot_axis_unit_changes_at_1024_of_it),
        cmocka_unit_test(test_plot_y_axis_labels_start_at_zero),
        cmocka_unit_test(test_plot_time_unit_changes_at_an_axis_of_2000_of_it),
        cmocka_unit_test(test_plot_says_how_many_events_were_dropped),
        cmocka_unit_test(test_plot_without_timeline),
        cmocka_unit_test(test_plot_stage_band_starts_at_stage_begin),
        cmocka_unit_test(test_plot_by_events_starts_at_the_first_event),
        cmocka_unit_test(test_plot_default_device_is_busiest_when_home_has_none),
        cmocka_unit_test(test_plot_by_events_axis_counts_the_devices_events),
        cmocka_unit_test(test_plot_default_device_without_allocations_is_the_timelines),
        cmocka_unit_test(test_plot_burst_in_one_column_shows_a_pixel_wide),
        cmocka_unit_test(test_plot_other_tags_on_top_of_nine),
        cmocka_unit_test(test_plot_legend_shortens_names_past_24_characters),
        cmocka_unit_test(test_plot_free_takes_the_latest_alloc_at_its_address),
        cmocka_unit_test(test_plot_marks_each_out_of_memory),
        cmocka_unit_test(test_plot_events_at_one_time_stay_finite),
    };
    return CLI_MAIN("cli_plot", tests);
}
