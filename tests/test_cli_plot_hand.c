/* `tally plot` of reports written by hand (harness: cliutil.h,
 * CLIUTIL_REPORTS; SVG readers: plotutil.h): timelines no run gives on
 * demand, such as 2000 events in one microsecond each, ten tags, a burst
 * narrower than a pixel, out-of-memory events, a clock that steps back, and
 * the axis units at their bounds. test_cli_plot plots the children's runs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define CLIUTIL_REPORTS /* the children, setup, tally_run, HAS, EXPECT_RC */
#include "cliutil.h"

#include "plotutil.h"

/* Open DIR/NAME.json for a report written by hand, up to the start of its
 * timeline array: home device home, the stages array stages (JSON), no
 * devices, ledger or leaks; out gets DIR/NAME.EXT, where the plot goes. The
 * caller writes the events and closes the array and the file. */
static FILE *open_report_with(const char *name, const char *ext, int home, const char *stages,
                              char path[PATH_MAX + 16], char out[PATH_MAX + 16])
{
    snprintf(path, PATH_MAX + 16, "%s/%s.json", dir, name);
    snprintf(out, PATH_MAX + 16, "%s/%s.%s", dir, name, ext);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f,
            "{\"format\":\"tally-report\",\"version\":\"" TALLY_VERSION "\",\"home_device\":%d,\"backend\":\"host\","
            "\"devices\":[],\"ledger\":[],\"stages\":%s,\"leaks\":[],\"timeline\":[\n",
            home, stages);
    return f;
}

/* The same with home device 0, no stages, and an SVG. */
static FILE *open_timeline_report(const char *name, char path[PATH_MAX + 16], char out[PATH_MAX + 16])
{
    return open_report_with(name, "svg", 0, "[]", path, out);
}

/* By event number the x axis says how many events the device has, the
 * count the command prints, also when there are more events than pixel
 * columns (870) times two and the points drawn are per column, far fewer:
 * a report written by hand with 1000 allocations of 1 MiB, each freed at
 * once, one microsecond apart (2000 events). */
/* Close the report f holds (at path), plot it into out with the options
 * opts ("" for none, else ending in a space), and expect tally plot's line
 * to hold want (NULL: any). */
static void plot_report(FILE *f, const char *path, const char *out, const char *opts, const char *want)
{
    fputs("]}\n", f);
    assert_int_equal(fclose(f), 0);
    run_t r = tally_run("plot '%s' %s-o '%s'", path, opts, out);
    EXPECT_RC(r, 0);
    if (want)
        HAS(r.out, want);
    run_free(&r);
}

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
    plot_report(f, path, out, "--x events ", "ev2k.svg: device 0, 2000 events, 1 tag group");
    char *svg = slurp(out);
    assert_non_null(svg);
    HAS(svg, ">event number (of 2000 on this device)</text>");
    /* Bucketed by column: the area's edge has at most two points a column
     * each way (870 columns), not two for every one of the 2000 changes. */
    const char *area = strstr(svg, "<path class=\"tag\"");
    assert_non_null(area);
    area = strstr(area, " d=\"");
    assert_non_null(area);
    static pts_t pts;
    read_pts(area + 4, &pts);
    if (pts.n < 4 || pts.n > 4 * 870 + 8)
        fail_msg("the area's edge has %d points: want at most two per column each way", pts.n);
    free(svg);
    assert_int_equal(xml_check(out), 0);
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
    plot_report(f, path, out, "--x time ", "burst.svg: device 0, 41 events, 1 tag group, peak allocated 20.0 MiB\n");
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
    plot_report(f, path, out, "", "eleven.svg: device 0, 11 events, 10 tag groups, peak allocated 66.0 MiB\n");
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
    plot_report(f, path, out, "", NULL);
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
    plot_report(f, path, out, "", "readdr.svg: device 0, 4 events, 2 tag groups");
    double zero_y;
    char *svg = slurp_plot(out, &zero_y);
    HAS(svg, ">a (peak 1.0 MiB)<");
    HAS(svg, ">b (peak 1.0 MiB)<");
    free(svg);
}

/* The plot finds each freed block's tag in a map from address to tag
 * (open addressing, entries shifted back over a freed slot). With 300
 * blocks live under one tag, at addresses as an allocator gives them
 * (each block as long as a pseudo-random multiple of 512 B, the next right
 * after it), many addresses share a home slot; each free must still find
 * its block, or the tag keeps bytes it gave back. Freed in the order they
 * came, then one 400 MiB block under the same tag, whose peak is that
 * block alone: a free that missed would have gone to "(before timeline)"
 * and lifted the tag's peak past 400 MiB. */
static void test_plot_frees_find_their_tags_among_hundreds_live(void **state)
{
    (void)state;
    enum { N = 300 };
    char path[PATH_MAX + 16], out[PATH_MAX + 16];
    FILE *f = open_timeline_report("crowd", path, out);
    static const char ev[] = "%s{\"device\":0,\"time_us\":%d,\"action\":\"%s\",\"addr\":%zu,\"size\":%zu,"
                             "\"stream\":0,\"allocated\":%zu,\"reserved\":%zu,\"tag\":\"a\",\"stage\":\"s\"}\n";
    static size_t addr[N], size[N];
    const size_t reserved = 1024 * MiB;
    size_t at = (size_t)0x7f0000000000ull, live = 0;
    uint32_t x = 12345;
    for (size_t i = 0; i < N; i++) {
        x = (x * 1103515245u + 12345u) & 0x7fffffffu;
        addr[i] = at;
        size[i] = ((x >> 8) % 2048 + 1) * 512; /* 512 B to 1 MiB */
        at += size[i];
    }
    int t = 1000;
    for (size_t i = 0; i < N; i++) {
        live += size[i];
        fprintf(f, ev, i ? "," : "", t++, "alloc", addr[i], size[i], live, reserved);
    }
    for (size_t i = 0; i < N; i++) {
        live -= size[i];
        fprintf(f, ev, ",", t++, "free_requested", addr[i], size[i], live, reserved);
    }
    assert_true(at - addr[0] < 400 * MiB); /* so the last block sets the peak */
    fprintf(f, ev, ",", t++, "alloc", at, 400 * MiB, 400 * MiB, reserved);
    plot_report(f, path, out, "", "crowd.svg: device 0, 601 events, 1 tag group, peak allocated 400.0 MiB");
    double zero_y;
    char *svg = slurp_plot(out, &zero_y);
    HAS(svg, ">a (peak 400.0 MiB)<");
    /* Every event is there: the subtitle says nothing of dropped ones. */
    if (strstr(svg, "older events dropped"))
        fail_msg("a timeline with no event dropped is said to have dropped some (%s)", out);
    free(svg);
}

/* A report from before stages said what they released (no
 * "released_bytes"): the page's stage table says 0 B released, not a byte
 * more, beside the figures the stage has. */
static void test_plot_html_stage_without_released_bytes_released_nothing(void **state)
{
    (void)state;
    char path[PATH_MAX + 16], out[PATH_MAX + 16];
    FILE *f = open_report_with("old-stage", "html", 0,
                               "[{\"name\":\"load\",\"wall_us\":1500000,\"peak_allocated_bytes\":1048576,"
                               "\"peak_reserved_bytes\":2097152,\"survivor_bytes\":0,\"survivor_blocks\":0,"
                               "\"survivors\":[]}]",
                               path, out);
    fputs("{\"device\":0,\"time_us\":1000,\"action\":\"alloc\",\"addr\":67108864,\"size\":1048576,\"stream\":0,"
          "\"allocated\":1048576,\"reserved\":2097152,\"tag\":\"a\",\"stage\":\"load\"},\n"
          "{\"device\":0,\"time_us\":2000,\"action\":\"free_requested\",\"addr\":67108864,\"size\":1048576,"
          "\"stream\":0,\"allocated\":0,\"reserved\":2097152,\"tag\":\"a\",\"stage\":\"load\"}]}\n",
          f);
    assert_int_equal(fclose(f), 0);
    run_t r = tally_run("plot '%s' -o '%s'", path, out);
    EXPECT_RC(r, 0);
    run_free(&r);
    char *html = slurp(out);
    assert_non_null(html);
    HAS(html, "<tr><td>load</td><td>1.500</td><td>1.0 MiB</td><td>2.0 MiB</td><td>0 B</td><td>0 B</td></tr>");
    free(html);
}

/* Without --device and with a home device that has no events, the plot
 * draws the busiest device, counting what it drew, not stage marks: device
 * 0 has three stages begun and ended (its ring kept them, device 1's did
 * not) and one allocation, device 1 two allocations: device 1 it is. */
static void test_plot_busiest_device_counts_no_stage_marks(void **state)
{
    (void)state;
    char path[PATH_MAX + 16], out[PATH_MAX + 16];
    FILE *f = open_report_with("marks", "svg", 5, "[]", path, out);
    static const char ev[] = "%s{\"device\":%d,\"time_us\":%d,\"action\":\"%s\",\"addr\":%zu,\"size\":%zu,"
                             "\"stream\":0,\"allocated\":%zu,\"reserved\":%zu,\"tag\":\"a\",\"stage\":\"s%d\"}\n";
    int t = 1000;
    for (int k = 0; k < 3; k++) {
        fprintf(f, ev, k ? "," : "", 0, t++, "stage_begin", (size_t)0, (size_t)0, (size_t)0, 2 * MiB, k);
        fprintf(f, ev, ",", 0, t++, "stage_end", (size_t)0, (size_t)0, (size_t)0, 2 * MiB, k);
    }
    fprintf(f, ev, ",", 0, t++, "alloc", 64 * MiB, MiB, MiB, 2 * MiB, 0);
    fprintf(f, ev, ",", 1, t++, "alloc", 96 * MiB, MiB, MiB, 2 * MiB, 0);
    fprintf(f, ev, ",", 1, t++, "alloc", 97 * MiB, MiB, 2 * MiB, 2 * MiB, 0);
    plot_report(f, path, out, "", "marks.svg: device 1, 2 events");
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
    plot_report(f, path, out, "", NULL);
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
    plot_report(f, path, out, "", NULL);
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
    plot_report(f, path, out, "--x time ", "instant.svg: device 0, 3 events, 1 tag group, peak allocated 3.0 MiB\n");
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
    plot_report(f, path, out, "", NULL);
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

/* The y axis's step is the nice number (1, 2 or 5 times a power of ten) at
 * or above a sixth of its top, and a sixth that is a power of ten exactly
 * is its own step: a peak of 6 MiB gives steps of 1 MiB, labels 0 to 6 and
 * seven grid lines (a step of 0 there gave a top of NaN and no labels).
 * The command runs under a 16 MiB file-size limit, so a step too small to
 * advance the axis loop stops it at once instead of filling the disk. */
static void test_plot_y_step_of_an_exact_power_of_ten(void **state)
{
    (void)state;
    struct rlimit old, small;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    small = old;
    small.rlim_cur = 16 << 20;
    if (old.rlim_cur != RLIM_INFINITY && old.rlim_cur < small.rlim_cur)
        small.rlim_cur = old.rlim_cur;
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &small), 0);
    char *svg = plot_two_events(6 * MiB, 1000);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    char labels[256];
    axis_labels(svg, "y-axis", labels, sizeof labels);
    assert_string_equal(labels, "0 1 2 3 4 5 6");
    HAS(svg, "memory (MiB)</text>");
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
    /* An eighth of the span over 5 of its power of ten (75 us) rounds up to
     * the next power of ten: ticks 100 us apart. */
    plot_time_unit(588, "\xc2\xb5s", "0 100 200 300 400 500");
}

/* The timeline's clock is the wall clock (lib/ledger/recorders.c), which a
 * clock step can set back, and a report read back may hold any int64 as a
 * time: events stamped far before the first (and one far after the last)
 * are drawn at the latest time so far, so the plot by time stays inside its
 * frame and every coordinate is finite. The fuzz_report target found the
 * plot's columns computed from such a time overflowing a long. */
static void test_plot_by_time_when_the_clock_steps_back(void **state)
{
    (void)state;
    char path[PATH_MAX + 16], out[PATH_MAX + 16];
    FILE *f = open_timeline_report("clock", path, out);
    static const char ev[] = "%s{\"device\":0,\"time_us\":%lld,\"action\":\"%s\",\"addr\":%zu,\"size\":%zu,"
                             "\"stream\":0,\"allocated\":%zu,\"reserved\":%zu,\"tag\":\"kv\",\"stage\":\"s\"}\n";
    fprintf(f, ev, "", 5000LL, "alloc", 4 * MiB, 2 * MiB, 2 * MiB, 4 * MiB);
    fprintf(f, ev, ",", -9000000000000000000LL, "alloc", 8 * MiB, MiB, 3 * MiB, 4 * MiB);
    fprintf(f, ev, ",", 9000000000000000000LL, "free_requested", 8 * MiB, MiB, 2 * MiB, 4 * MiB);
    fprintf(f, ev, ",", 6000LL, "free_requested", 4 * MiB, 2 * MiB, (size_t)0, 4 * MiB);
    plot_report(f, path, out, "--x time ", "clock.svg: device 0, 4 events, 1 tag group, peak allocated 3.0 MiB\n");
    double zero_y;
    char *svg = slurp_plot(out, &zero_y);
    if (strstr(svg, "nan") || strstr(svg, "inf"))
        fail_msg("a coordinate is not finite: %.400s", svg);
    static const char *const paths[] = {"<path class=\"tag\"", "<path class=\"reserved\""};
    for (int k = 0; k < 2; k++) {
        const char *at = strstr(svg, paths[k]);
        assert_non_null(at);
        static pts_t pts;
        read_pts(strstr(at, " d=\"") + 4, &pts);
        assert_true(pts.n >= 2);
        for (int i = 0; i < pts.n; i++)
            if (!isfinite(pts.x[i]) || !isfinite(pts.y[i]) || pts.x[i] < 0 || pts.x[i] > 2000)
                fail_msg("point %d of %s is (%g, %g)", i, paths[k], pts.x[i], pts.y[i]);
    }
    free(svg);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plot_by_events_axis_counts_the_devices_events),
        cmocka_unit_test(test_plot_burst_in_one_column_shows_a_pixel_wide),
        cmocka_unit_test(test_plot_other_tags_on_top_of_nine),
        cmocka_unit_test(test_plot_legend_shortens_names_past_24_characters),
        cmocka_unit_test(test_plot_free_takes_the_latest_alloc_at_its_address),
        cmocka_unit_test(test_plot_frees_find_their_tags_among_hundreds_live),
        cmocka_unit_test(test_plot_html_stage_without_released_bytes_released_nothing),
        cmocka_unit_test(test_plot_busiest_device_counts_no_stage_marks),
        cmocka_unit_test(test_plot_marks_each_out_of_memory),
        cmocka_unit_test(test_plot_events_at_one_time_stay_finite),
        cmocka_unit_test(test_plot_by_time_when_the_clock_steps_back),
        cmocka_unit_test(test_plot_axis_unit_changes_at_1024_of_it),
        cmocka_unit_test(test_plot_y_axis_labels_start_at_zero),
        cmocka_unit_test(test_plot_y_step_of_an_exact_power_of_ten),
        cmocka_unit_test(test_plot_time_unit_changes_at_an_axis_of_2000_of_it),
    };
    return CLI_MAIN("cli_plot_hand", tests);
}
