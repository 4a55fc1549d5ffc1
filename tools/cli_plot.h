/* tally plot: memory over time from a report's timeline (timeline:true), as
 * a self-contained SVG, or an HTML page holding that SVG and two tables.
 *
 * Allocated bytes are stacked by tag. The timeline records every alloc and
 * free_requested with its block address and size; a free is charged to the
 * tag its block was allocated under, found by address (older reports put
 * the freeing thread's tag on free events, which may differ). Bytes already
 * allocated when the timeline's oldest kept event happened, and frees of
 * blocks allocated before it, go to "(before timeline)". The device's
 * reserved bytes after each event are drawn as a line; stages are shaded
 * bands between their stage_begin and stage_end events, with their names.
 * With more events than pixels, each pixel column shows the event at which
 * allocated memory was highest, so peaks survive. Included once, by
 * tally_cli.c. */
#ifndef TALLY_CLI_PLOT_H
#define TALLY_CLI_PLOT_H

#include "cli_report.h"

#include <math.h>
#include <strings.h>

static const char plot_help[] =
    "usage: tally plot FILE.json -o OUT.svg|OUT.html [--device N] [--x time|events]\n"
    "\n"
    "Draw memory over time from the report's timeline: allocated bytes stacked by\n"
    "tag, reserved bytes as a line, stages as labelled bands, out-of-memory events\n"
    "marked. The output is self-contained (no scripts, no network); .svg writes an\n"
    "SVG image, .html a page with the image and tables of peaks by tag (largest\n"
    "first), of the blocks live when the report was written, and of the stages.\n"
    "The process must have run with TALLY_CONF=timeline:true (the ring keeps the\n"
    "newest timeline_events events per device).\n"
    "\n"
    "  -o, --output OUT     where to write; the extension picks the format\n"
    "  -d, --device N       the device to draw (default: the home device if it has\n"
    "                       events, else the device with the most events)\n"
    "      --x time|events  x axis: time since the first event (default), or the\n"
    "                       event number (evens out bursts)\n"
    "  -h, --help           this text\n";

/* ---- small maps --------------------------------------------------------------- */

/* Block address -> tag index, open addressing with backward-shift deletion. */
typedef struct addr_map {
    uint64_t *keys; /* 0 = empty (no block lives at address 0) */
    int *vals;
    size_t cap, count;
} addr_map_t;

static size_t addr_slot(uint64_t key, size_t mask)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return (size_t)key & mask;
}

static void addr_put(addr_map_t *m, uint64_t key, int val);

static void addr_grow(addr_map_t *m)
{
    addr_map_t old = *m;
    m->cap = old.cap ? old.cap * 2 : 1024;
    m->keys = cli_alloc(m->cap * sizeof *m->keys);
    m->vals = cli_alloc(m->cap * sizeof *m->vals);
    m->count = 0;
    for (size_t i = 0; i < old.cap; i++)
        if (old.keys[i])
            addr_put(m, old.keys[i], old.vals[i]);
    free(old.keys);
    free(old.vals);
}

static void addr_put(addr_map_t *m, uint64_t key, int val)
{
    if (!key)
        return;
    if (2 * (m->count + 1) > m->cap)
        addr_grow(m);
    size_t mask = m->cap - 1, i = addr_slot(key, mask);
    while (m->keys[i] && m->keys[i] != key)
        i = (i + 1) & mask;
    if (!m->keys[i])
        m->count++;
    m->keys[i] = key;
    m->vals[i] = val;
}

/* Remove key; its value, or fallback when absent. */
static int addr_take(addr_map_t *m, uint64_t key, int fallback)
{
    if (!m->cap || !key)
        return fallback;
    size_t mask = m->cap - 1, i = addr_slot(key, mask);
    while (m->keys[i] && m->keys[i] != key)
        i = (i + 1) & mask;
    if (!m->keys[i])
        return fallback;
    int val = m->vals[i];
    m->keys[i] = 0;
    m->count--;
    /* Shift back the entries of the run after the hole. */
    for (size_t j = (i + 1) & mask; m->keys[j]; j = (j + 1) & mask) {
        size_t home = addr_slot(m->keys[j], mask);
        bool movable = i <= j ? (home <= i || home > j) : (home <= i && home > j);
        if (movable) {
            m->keys[i] = m->keys[j];
            m->vals[i] = m->vals[j];
            m->keys[j] = 0;
            i = j;
        }
    }
    return val;
}

static void addr_clear(addr_map_t *m)
{
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

/* ---- reconstruction --------------------------------------------------------- */

#define PLOT_TAGS 9     /* tags drawn on their own; the rest are "other tags" */
#define TAG_BEFORE 0    /* "(before timeline)" */

typedef struct plot_data {
    const report_t *r;
    int device;
    bool by_events;
    size_t *ev; /* indices into r->events of this device's events, oldest first */
    size_t nev;
    /* tags: index 0 is "(before timeline)" */
    const char **tags;
    int64_t *cur, *peak, *moved; /* moved: bytes allocated plus bytes freed */
    size_t ntags, tcap;
    int *group_of; /* tag -> group */
    /* groups in stacking order, bottom first */
    const char *gname[PLOT_TAGS + 2];
    int64_t gpeak[PLOT_TAGS + 2];
    int ngroups;
    /* points */
    double *x;
    int64_t *val; /* npts x ngroups */
    int64_t *reserved;
    size_t npts;
    double x0, x_end;
    int64_t ymax, peak_alloc, peak_reserved;
    size_t nooms;
    int64_t dropped; /* older events of the device the ring had overwritten */
} plot_data_t;

static int tag_index(plot_data_t *p, const char *tag)
{
    for (size_t i = 1; i < p->ntags; i++)
        if (strcmp(p->tags[i], tag) == 0)
            return (int)i;
    size_t c1 = p->tcap, c2 = p->tcap, c3 = p->tcap, c4 = p->tcap;
    cli_grow((void **)&p->tags, &c1, p->ntags + 1, sizeof *p->tags);
    cli_grow((void **)&p->cur, &c2, p->ntags + 1, sizeof *p->cur);
    cli_grow((void **)&p->peak, &c3, p->ntags + 1, sizeof *p->peak);
    cli_grow((void **)&p->moved, &c4, p->ntags + 1, sizeof *p->moved);
    p->tcap = c1;
    p->moved[p->ntags] = 0;
    p->tags[p->ntags] = tag;
    return (int)p->ntags++;
}

static double event_x(const plot_data_t *p, size_t k)
{
    return p->by_events ? (double)k : (double)(p->r->events[p->ev[k]].time_us - p->r->events[p->ev[0]].time_us);
}

static int64_t event_delta(const rep_event_t *e)
{
    return e->action == EV_ALLOC ? e->size : e->action == EV_FREE ? -e->size : 0;
}

/* Replay the device's events; with vals, also fill the per-group state after
 * each event into vals[k * ngroups + g]. */
static void replay(plot_data_t *p, int64_t *vals)
{
    addr_map_t map = {0};
    const rep_event_t *first = &p->r->events[p->ev[0]];
    memset(p->cur, 0, p->ntags * sizeof *p->cur);
    memset(p->moved, 0, p->ntags * sizeof *p->moved);
    p->cur[TAG_BEFORE] = first->allocated - event_delta(first);
    if (p->cur[TAG_BEFORE] > p->peak[TAG_BEFORE])
        p->peak[TAG_BEFORE] = p->cur[TAG_BEFORE];
    int64_t gcur[PLOT_TAGS + 2] = {0};
    if (vals)
        gcur[p->group_of[TAG_BEFORE]] = p->cur[TAG_BEFORE];
    for (size_t k = 0; k < p->nev; k++) {
        const rep_event_t *e = &p->r->events[p->ev[k]];
        int t = -1;
        if (e->action == EV_ALLOC) {
            t = tag_index(p, e->tag);
            addr_put(&map, (uint64_t)e->addr, t);
            p->cur[t] += e->size;
        } else if (e->action == EV_FREE) {
            t = addr_take(&map, (uint64_t)e->addr, TAG_BEFORE);
            p->cur[t] -= e->size;
        }
        if (t >= 0)
            p->moved[t] += e->size;
        if (t >= 0 && p->cur[t] > p->peak[t])
            p->peak[t] = p->cur[t];
        if (vals) {
            if (t >= 0)
                gcur[p->group_of[t]] += event_delta(e);
            memcpy(vals + k * (size_t)p->ngroups, gcur, (size_t)p->ngroups * sizeof *gcur);
        }
    }
    addr_clear(&map);
}

/* How much a tag's bytes churn: bytes moved (allocated plus freed) per byte
 * of its peak. A tag allocated once and kept (weights, optimizer state)
 * moves about its peak once or twice; activations many times. */
static double churn(const plot_data_t *p, int t)
{
    return p->peak[t] > 0 ? (double)p->moved[t] / (double)p->peak[t] : 0;
}

/* Which tags get a group of their own: the PLOT_TAGS largest by peak.
 * Stacked steadiest first (least churn; ties in order of first appearance),
 * so a constant tag lies flat at the bottom rather than riding on tags that
 * come and go; "(before timeline)" below them all, "other tags" on top. */
static void make_groups(plot_data_t *p)
{
    int chosen[PLOT_TAGS];
    int nchosen = 0;
    p->group_of = cli_alloc(p->ntags * sizeof *p->group_of);
    for (size_t pass = 0; pass < PLOT_TAGS; pass++) {
        int best = -1;
        for (size_t t = 1; t < p->ntags; t++) {
            bool taken = false;
            for (int c = 0; c < nchosen; c++)
                taken |= chosen[c] == (int)t;
            if (!taken && p->peak[t] > 0 && (best < 0 || p->peak[t] > p->peak[best]))
                best = (int)t;
        }
        if (best < 0)
            break;
        chosen[nchosen++] = best;
    }
    /* least churn first; tag index order = order of first appearance */
    for (int a = 1; a < nchosen; a++)
        for (int b = a; b > 0; b--) {
            double cb = churn(p, chosen[b]), ca = churn(p, chosen[b - 1]);
            if (ca < cb || (ca == cb && chosen[b - 1] < chosen[b]))
                break;
            int tmp = chosen[b];
            chosen[b] = chosen[b - 1];
            chosen[b - 1] = tmp;
        }
    int g = 0;
    p->gname[g] = "(before timeline)";
    p->gpeak[g] = p->peak[TAG_BEFORE];
    p->group_of[TAG_BEFORE] = g++;
    for (int c = 0; c < nchosen; c++) {
        p->gname[g] = p->tags[chosen[c]];
        p->gpeak[g] = p->peak[chosen[c]];
        p->group_of[chosen[c]] = g++;
    }
    int other = g++;
    p->gname[other] = "other tags";
    p->gpeak[other] = 0;
    for (size_t t = 1; t < p->ntags; t++) {
        bool mine = false;
        for (int c = 0; c < nchosen; c++)
            mine |= chosen[c] == (int)t;
        if (!mine) {
            p->group_of[t] = other;
            p->gpeak[other] += p->peak[t]; /* an upper bound; shown as such */
        }
    }
    p->ngroups = g;
}

static void add_point(plot_data_t *p, double x, const int64_t *vals, int64_t reserved)
{
    size_t i = p->npts++, ng = (size_t)p->ngroups;
    p->x[i] = x;
    memcpy(p->val + i * ng, vals, ng * sizeof *vals);
    p->reserved[i] = reserved;
}

/* The points to draw. By event number with few events: one per event. By
 * time, or with more events than pixels: per pixel column, the state at the
 * column's highest allocated total (and the column's highest reserved) for
 * one pixel, then the state after the column's last event until the next
 * column. So a spike narrower than a pixel (an alloc freed in the same
 * microsecond) still shows, and what a column ends with is what follows. */
static void make_points(plot_data_t *p, int columns)
{
    size_t ng = (size_t)p->ngroups;
    int64_t *vals = cli_alloc(p->nev * ng * sizeof *vals);
    replay(p, vals);
    double span = event_x(p, p->nev - 1);
    if (span <= 0)
        span = 1;
    p->x0 = 0;
    p->x_end = span + span * 0.02;
    p->x = cli_alloc(2 * p->nev * sizeof *p->x);
    p->val = cli_alloc(2 * p->nev * ng * sizeof *p->val);
    p->reserved = cli_alloc(2 * p->nev * sizeof *p->reserved);
    for (size_t k = 0; k < p->nev; k++) {
        const rep_event_t *e = &p->r->events[p->ev[k]];
        if (e->allocated > p->peak_alloc)
            p->peak_alloc = e->allocated;
        if (e->reserved > p->peak_reserved)
            p->peak_reserved = e->reserved;
        p->nooms += e->action == EV_OOM;
    }
    p->ymax = p->peak_alloc > p->peak_reserved ? p->peak_alloc : p->peak_reserved;
    bool bucket = !p->by_events || p->nev > (size_t)columns * 2;
    if (!bucket) {
        for (size_t k = 0; k < p->nev; k++)
            add_point(p, event_x(p, k), vals + k * ng, p->r->events[p->ev[k]].reserved);
        free(vals);
        return;
    }
    double colw = p->x_end / columns;
    size_t k = 0;
    while (k < p->nev) {
        long col = (long)(event_x(p, k) / colw);
        size_t peak = k, last = k;
        int64_t resv_max = p->r->events[p->ev[k]].reserved;
        for (k++; k < p->nev && (long)(event_x(p, k) / colw) == col; k++) {
            const rep_event_t *e = &p->r->events[p->ev[k]];
            if (e->allocated >= p->r->events[p->ev[peak]].allocated)
                peak = k;
            if (e->reserved > resv_max)
                resv_max = e->reserved;
            last = k;
        }
        add_point(p, (double)col * colw, vals + peak * ng, resv_max);
        int64_t resv_last = p->r->events[p->ev[last]].reserved;
        if (resv_last != resv_max || memcmp(vals + peak * ng, vals + last * ng, ng * sizeof *vals) != 0)
            add_point(p, (double)(col + 1) * colw, vals + last * ng, resv_last);
    }
    free(vals);
}

static void plot_data_free(plot_data_t *p)
{
    free(p->ev);
    free(p->tags);
    free(p->cur);
    free(p->peak);
    free(p->moved);
    free(p->group_of);
    free(p->x);
    free(p->val);
    free(p->reserved);
}

/* ---- drawing ----------------------------------------------------------------- */

enum { SVG_W = 1260, SVG_H = 660, PL = 90, PR = 960, PT = 70, PB = 590 }; /* plot area */

static const char *const palette[] = {"#4e79a7", "#f28e2c", "#e15759", "#76b7b2", "#59a14f",
                                      "#edc949", "#af7aa1", "#ff9da7", "#9c755f"};

static const char *group_color(const plot_data_t *p, int g)
{
    if (g == 0)
        return "#d9d9d9";
    if (g == p->ngroups - 1)
        return "#bab0ab";
    return palette[(g - 1) % 9];
}

typedef struct svg_path {
    FILE *f;
    double lx, ly;
    bool started;
} svg_path_t;

static void path_pt(svg_path_t *s, double x, double y)
{
    x = round(x * 10) / 10;
    y = round(y * 10) / 10;
    if (s->started && x == s->lx && y == s->ly)
        return;
    fprintf(s->f, "%s%.1f,%.1f", s->started ? " L" : "M", x, y);
    s->started = true;
    s->lx = x;
    s->ly = y;
}

typedef struct scale {
    double x0, x1, ymax; /* data ranges */
} scale_t;

static double sx(const scale_t *s, double x)
{
    return PL + (x - s->x0) / (s->x1 - s->x0) * (PR - PL);
}

static double sy(const scale_t *s, double v)
{
    if (v < 0)
        v = 0;
    return PB - v / s->ymax * (PB - PT);
}

/* Stacked value of groups 0..g at point i (g < 0: zero). */
static int64_t cum(const plot_data_t *p, size_t i, int g)
{
    int64_t sum = 0;
    for (int h = 0; h <= g; h++)
        sum += p->val[i * (size_t)p->ngroups + h];
    return sum < 0 ? 0 : sum;
}

/* Value i of a series: the given one, or the stack top of groups 0..g. */
static int64_t series_at(const plot_data_t *p, int g, const int64_t *series, size_t i)
{
    return series ? series[i] : cum(p, i, g);
}

/* The step edge of a series, left to right: each value holds until the
 * next point, the last one until the end of the axis. */
static void step_forward(svg_path_t *s, const scale_t *sc, const plot_data_t *p, int g, const int64_t *series)
{
    path_pt(s, sx(sc, p->x[0]), sy(sc, (double)series_at(p, g, series, 0)));
    for (size_t i = 1; i < p->npts; i++) {
        int64_t prev = series_at(p, g, series, i - 1), v = series_at(p, g, series, i);
        if (v != prev) {
            path_pt(s, sx(sc, p->x[i]), sy(sc, (double)prev));
            path_pt(s, sx(sc, p->x[i]), sy(sc, (double)v));
        }
    }
    path_pt(s, sx(sc, p->x_end), sy(sc, (double)series_at(p, g, series, p->npts - 1)));
}

/* The same edge of the stack top of groups 0..g, right to left. */
static void step_backward(svg_path_t *s, const scale_t *sc, const plot_data_t *p, int g)
{
    path_pt(s, sx(sc, p->x_end), sy(sc, (double)cum(p, p->npts - 1, g)));
    for (size_t i = p->npts - 1; i >= 1; i--) {
        int64_t v = cum(p, i, g), prev = cum(p, i - 1, g);
        if (v != prev) {
            path_pt(s, sx(sc, p->x[i]), sy(sc, (double)v));
            path_pt(s, sx(sc, p->x[i]), sy(sc, (double)prev));
        }
    }
    path_pt(s, sx(sc, p->x[0]), sy(sc, (double)cum(p, 0, g)));
}

static double nice_step(double range, int target)
{
    double raw = range / target;
    double mag = pow(10, floor(log10(raw)));
    double f = raw / mag;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
}

static void svg_text(FILE *f, double x, double y, const char *attrs, const char *text)
{
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\"%s%s>", x, y, attrs[0] ? " " : "", attrs);
    cli_xml_str(f, text);
    fputs("</text>\n", f);
}

static void draw_axes(FILE *f, const plot_data_t *p, scale_t *sc)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    char buf[64];
    /* y: bytes in the unit that keeps the top below 1024 of it */
    double ymax = p->ymax > 0 ? (double)p->ymax : 1024.0 * 1024.0;
    int u = 0;
    while (u < 4 && ymax >= pow(1024, u + 1))
        u++;
    double unit = pow(1024, u), top_u = ymax / unit;
    double step = nice_step(top_u, 6);
    double axis_top = ceil(top_u / step - 1e-9) * step;
    sc->ymax = axis_top * unit;
    fputs("<g class=\"grid\" stroke=\"#e6e6e6\" stroke-width=\"1\">\n", f);
    for (double v = 0; v <= axis_top + step / 2; v += step)
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>\n", PL, sy(sc, v * unit), PR,
                sy(sc, v * unit));
    fputs("</g>\n<g class=\"y-axis\" font-size=\"11\" text-anchor=\"end\">\n", f);
    for (double v = 0; v <= axis_top + step / 2; v += step) {
        snprintf(buf, sizeof buf, "%g", v);
        svg_text(f, PL - 6, sy(sc, v * unit) + 4, "", buf);
    }
    fputs("</g>\n", f);
    snprintf(buf, sizeof buf, "memory (%s)", units[u]);
    fprintf(f, "<text x=\"22\" y=\"%d\" text-anchor=\"middle\" transform=\"rotate(-90 22 %d)\">", (PT + PB) / 2,
            (PT + PB) / 2);
    cli_xml_str(f, buf);
    fputs("</text>\n", f);

    /* x: time since the first event, or event number */
    double span = p->x_end - p->x0, xdiv = 1;
    const char *xunit = "events";
    if (!p->by_events) {
        xunit = span < 2e3 ? "\xc2\xb5s" : span < 2e6 ? "ms" : "s";
        xdiv = span < 2e3 ? 1 : span < 2e6 ? 1e3 : 1e6;
    }
    double xstep = nice_step(span / xdiv, 8);
    fputs("<g class=\"x-axis\" font-size=\"11\" text-anchor=\"middle\">\n", f);
    for (double v = 0; v * xdiv <= span + 1e-9; v += xstep) {
        double x = sx(sc, v * xdiv);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#333\"/>\n", x, PB, x, PB + 5);
        snprintf(buf, sizeof buf, "%g", v);
        svg_text(f, x, PB + 18, "", buf);
    }
    fputs("</g>\n", f);
    if (p->by_events)
        snprintf(buf, sizeof buf, "event number (of %zu on this device)", p->nev);
    else
        snprintf(buf, sizeof buf, "time since the first event (%s)", xunit);
    svg_text(f, (PL + PR) / 2.0, PB + 42, "text-anchor=\"middle\"", buf);
    fprintf(f, "<path d=\"M%d,%d V%d H%d\" fill=\"none\" stroke=\"#333\" stroke-width=\"1\"/>\n", PL, PT, PB, PR);
}

/* Stage bands: a shaded span per stage (nested ones lower), dashed lines at
 * begin and end, the name at the top. */
static void draw_stages(FILE *f, const plot_data_t *p, const scale_t *sc)
{
    enum { MAXD = 32 };
    size_t open_k[MAXD];
    int open_n[MAXD];
    int depth = 0, begun_count = 0;
    fputs("<g class=\"stages\">\n", f);
    for (size_t k = 0; k <= p->nev; k++) {
        const rep_event_t *e = k < p->nev ? &p->r->events[p->ev[k]] : NULL;
        if (e && e->action == EV_STAGE_BEGIN) {
            if (depth < MAXD) {
                open_k[depth] = k;
                open_n[depth] = begun_count;
            }
            begun_count++;
            depth++;
            continue;
        }
        /* stage_end, or the end of the timeline closing what is still open */
        int closing = e ? (e->action == EV_STAGE_END ? 1 : 0) : depth;
        for (int c = 0; c < closing; c++) {
            bool begun = depth > 0;
            int d = begun ? depth - 1 : 0;
            size_t kb = begun && d < MAXD ? open_k[d] : 0;
            int band = begun && d < MAXD ? open_n[d] : 1;
            const char *name = e ? e->stage : p->r->events[p->ev[kb]].stage;
            double xb = begun ? sx(sc, event_x(p, kb)) : PL;
            double xe = e ? sx(sc, event_x(p, k)) : sx(sc, p->x_end);
            double y = PT + 14 + 13 * (d % 4);
            fprintf(f, "<g class=\"stage\"><title>stage ");
            cli_xml_str(f, name);
            fprintf(f, "%s</title>\n", e ? "" : " (still open when the report was written)");
            fprintf(f, "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\" fill-opacity=\"0.07\"/>\n",
                    xb, PT, xe - xb < 0.5 ? 0.5 : xe - xb, PB - PT, band % 2 ? "#4e79a7" : "#59a14f");
            fprintf(f,
                    "<path d=\"M%.1f,%d V%d M%.1f,%d V%d\" stroke=\"#555\" stroke-width=\"1\" "
                    "stroke-dasharray=\"4 3\" fill=\"none\"/>\n",
                    xb, PT, PB, xe, PT, PB);
            svg_text(f, xb + 3, y, "font-size=\"11\" fill=\"#333\"", name);
            fputs("</g>\n", f);
            if (begun)
                depth--;
        }
    }
    fputs("</g>\n", f);
}

static void draw_legend(FILE *f, const plot_data_t *p)
{
    char label[96], b[32];
    double y = PT + 4;
    int x = PR + 24;
    svg_text(f, x, y, "font-weight=\"bold\"", "allocated, by tag");
    y += 10;
    for (int g = p->ngroups - 1; g >= 0; g--) {
        if (p->gpeak[g] <= 0)
            continue;
        const char *name = p->gname[g];
        size_t n = strlen(name);
        snprintf(label, sizeof label, "%.*s%s (%s %s)", n > 24 ? 22 : (int)n, name, n > 24 ? "..." : "",
                 g == p->ngroups - 1 ? "peaks add to" : "peak", cli_bytes(p->gpeak[g], b, sizeof b));
        fprintf(f, "<g class=\"legend-entry\"><title>");
        cli_xml_str(f, name);
        fprintf(f, "</title><rect x=\"%d\" y=\"%.1f\" width=\"14\" height=\"12\" fill=\"%s\"/>", x, y,
                group_color(p, g));
        svg_text(f, x + 20, y + 10, "font-size=\"11\"", label);
        fputs("</g>\n", f);
        y += 18;
    }
    y += 8;
    fprintf(f, "<path d=\"M%d,%.1f h14\" stroke=\"#000\" stroke-width=\"2\"/>", x, y + 6);
    snprintf(label, sizeof label, "reserved (peak %s)", cli_bytes(p->peak_reserved, b, sizeof b));
    svg_text(f, x + 20, y + 10, "font-size=\"11\"", label);
    y += 18;
    fprintf(f, "<rect x=\"%d\" y=\"%.1f\" width=\"14\" height=\"12\" fill=\"#59a14f\" fill-opacity=\"0.15\" "
               "stroke=\"#555\" stroke-dasharray=\"4 3\"/>",
            x, y);
    svg_text(f, x + 20, y + 10, "font-size=\"11\"", "stage (begin / end)");
    y += 18;
    if (p->nooms) {
        fprintf(f, "<path d=\"M%d,%.1f l7,-10 l7,10 z\" fill=\"#d62728\"/>", x, y + 12);
        svg_text(f, x + 20, y + 10, "font-size=\"11\"", "out of memory");
    }
}

/* The SVG element; xml_decl for a standalone .svg file. */
static void write_svg(FILE *f, const plot_data_t *p, const char *file, bool xml_decl)
{
    char b1[32], b2[32], line[512];
    scale_t sc = {p->x0, p->x_end, 1};
    if (xml_decl)
        fputs("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n", f);
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
            "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n",
            SVG_W, SVG_H, SVG_W, SVG_H);
    snprintf(line, sizeof line, "tally: memory over time, device %d, rank %" PRId64 " (pid %" PRId64 ")", p->device,
             p->r->rank, p->r->pid);
    fputs("<title>", f);
    cli_xml_str(f, line);
    fputs("</title>\n", f);
    fprintf(f, "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n", SVG_W, SVG_H);
    svg_text(f, PL, 26, "font-size=\"16\" font-weight=\"bold\"", line);
    int n = snprintf(line, sizeof line, "%s: %zu events, peak allocated %s, peak reserved %s", file, p->nev,
                     cli_bytes(p->peak_alloc, b1, sizeof b1), cli_bytes(p->peak_reserved, b2, sizeof b2));
    if (p->dropped > 0 && n > 0 && (size_t)n < sizeof line)
        snprintf(line + n, sizeof line - (size_t)n, "; %" PRId64 " older events dropped (timeline_events)",
                 p->dropped);
    svg_text(f, PL, 46, "font-size=\"12\" fill=\"#555\"", line);

    draw_axes(f, p, &sc);
    draw_stages(f, p, &sc);
    fputs("<g class=\"allocated\">\n", f);
    for (int g = 0; g < p->ngroups; g++) {
        if (p->gpeak[g] <= 0)
            continue;
        fprintf(f, "<path class=\"tag\" fill=\"%s\" fill-opacity=\"0.9\" stroke=\"none\" d=\"", group_color(p, g));
        svg_path_t s = {f, 0, 0, false};
        step_forward(&s, &sc, p, g, NULL);
        step_backward(&s, &sc, p, g - 1);
        fputs(" Z\"><title>", f);
        cli_xml_str(f, p->gname[g]);
        fputs("</title></path>\n", f);
    }
    fputs("</g>\n<path class=\"reserved\" fill=\"none\" stroke=\"#000\" stroke-width=\"1.5\" d=\"", f);
    svg_path_t s = {f, 0, 0, false};
    step_forward(&s, &sc, p, 0, p->reserved);
    fputs("\"><title>reserved</title></path>\n", f);
    for (size_t k = 0; k < p->nev; k++) {
        const rep_event_t *e = &p->r->events[p->ev[k]];
        if (e->action != EV_OOM)
            continue;
        double x = sx(&sc, event_x(p, k));
        fprintf(f, "<path class=\"oom\" d=\"M%.1f,%d l-6,-10 h12 z\" fill=\"#d62728\"><title>out of memory: %" PRId64
                   " bytes asked</title></path>\n",
                x, PT, e->size);
    }
    draw_legend(f, p);
    fputs("</svg>\n", f);
}

/* Tag indexes with a peak, largest peak first. */
static size_t tags_by_peak(const plot_data_t *p, size_t *order)
{
    size_t n = 0;
    for (size_t t = 0; t < p->ntags; t++) {
        if (p->peak[t] <= 0)
            continue;
        size_t k = n++;
        for (; k > 0 && p->peak[order[k - 1]] < p->peak[t]; k--)
            order[k] = order[k - 1];
        order[k] = t;
    }
    return n;
}

/* The report's live blocks, grouped as the leak report groups them. */
static void html_live_blocks(FILE *f, const report_t *r)
{
    char b1[32];
    fputs("<h2>Live blocks when the report was written (at exit: the leaks)</h2>\n", f);
    if (!r->nleaks) {
        fputs("<p>None: every block had been freed.</p>\n", f);
        return;
    }
    fputs("<table>\n<tr><th>tag</th><th>stage</th><th>device</th><th>blocks</th><th>bytes</th></tr>\n", f);
    for (size_t i = 0; i < r->nleaks; i++) {
        const rep_leak_t *l = &r->leaks[i];
        fputs("<tr><td>", f);
        cli_xml_str(f, l->tag);
        fputs("</td><td>", f);
        cli_xml_str(f, l->stage);
        fprintf(f, "</td><td>%d%s</td><td>%" PRId64 "</td><td>%s</td></tr>\n", l->device,
                l->foreign ? " (foreign)" : "", l->blocks, cli_bytes(l->bytes, b1, sizeof b1));
    }
    fputs("</table>\n", f);
}

static void write_html(FILE *f, const plot_data_t *p, const char *file)
{
    char b1[32], b2[32], b3[32], b4[32];
    fputs("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>tally: ", f);
    cli_xml_str(f, file);
    fputs("</title>\n<style>\nbody { font-family: DejaVu Sans, Helvetica, Arial, sans-serif; margin: 20px; }\n"
          "table { border-collapse: collapse; margin-bottom: 1em; }\n"
          "th, td { padding: 2px 12px; text-align: right; border-bottom: 1px solid #ddd; }\n"
          "th:first-child, td:first-child { text-align: left; }\n</style>\n</head>\n<body>\n",
          f);
    write_svg(f, p, file, false);
    if (p->dropped > 0)
        fprintf(f, "<p>The timeline holds the newest %zu events of device %d: the %" PRId64 " before them were "
                   "dropped (timeline_events), so bytes allocated earlier show as \"(before timeline)\".</p>\n",
                p->nev, p->device, p->dropped);
    fputs("<h2>Peak allocated by tag (this device's timeline), largest first</h2>\n<table>\n<tr><th>tag</th>"
          "<th>peak</th></tr>\n",
          f);
    size_t *order = cli_alloc((p->ntags + 1) * sizeof *order);
    size_t n = tags_by_peak(p, order);
    for (size_t i = 0; i < n; i++) {
        size_t t = order[i];
        fputs("<tr><td>", f);
        cli_xml_str(f, t == TAG_BEFORE ? "(before timeline)" : p->tags[t]);
        fprintf(f, "</td><td>%s</td></tr>\n", cli_bytes(p->peak[t], b1, sizeof b1));
    }
    free(order);
    fputs("</table>\n", f);
    html_live_blocks(f, p->r);
    fputs("<h2>Stages (whole process)</h2>\n<table>\n<tr><th>stage</th><th>seconds</th><th>peak "
          "allocated</th><th>peak reserved</th><th>survivors</th><th>released</th></tr>\n",
          f);
    for (size_t i = 0; i < p->r->nstages; i++) {
        const rep_stage_t *st = &p->r->stages[i];
        fputs("<tr><td>", f);
        cli_xml_str(f, st->name);
        fprintf(f, "</td><td>%.3f</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>\n", (double)st->wall_us / 1e6,
                cli_bytes(st->peak_allocated, b1, sizeof b1), cli_bytes(st->peak_reserved, b2, sizeof b2),
                cli_bytes(st->survivor_bytes, b3, sizeof b3), cli_bytes(st->released, b4, sizeof b4));
    }
    fputs("</table>\n</body>\n</html>\n", f);
}

/* ---- command ------------------------------------------------------------------ */

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcasecmp(s + n - k, suffix) == 0;
}

static int cmd_plot(int argc, char **argv)
{
    const char *file = NULL, *out = NULL;
    int device = -1;
    bool by_events = false, options = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (options && a[0] == '-' && a[1]) {
            if (strcmp(a, "--") == 0) {
                options = false;
            } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
                fputs(plot_help, stdout);
                return cli_finish(stdout, "the help");
            } else if (is_opt(a, "-o") || is_opt(a, "--output")) {
                out = opt_value(argc, argv, &i, a, "--output");
                if (!out || !*out)
                    return cli_usage("%s needs a file name (OUT.svg or OUT.html)", a);
            } else if (is_opt(a, "--device") || is_opt(a, "-d")) {
                int rc = parse_device(opt_value(argc, argv, &i, a, "--device"), &device);
                if (rc)
                    return rc;
            } else if (is_opt(a, "--x")) {
                const char *v = opt_value(argc, argv, &i, a, "--x");
                if (v && strcmp(v, "time") == 0)
                    by_events = false;
                else if (v && strcmp(v, "events") == 0)
                    by_events = true;
                else
                    return cli_usage("--x takes 'time' or 'events', not '%s'", v ? v : "");
            } else {
                return cli_usage("unknown option '%s'", a);
            }
        } else if (file) {
            return cli_usage("one FILE.json expected, got '%s' and '%s'", file, a);
        } else {
            file = a;
        }
    }
    if (!file)
        return cli_usage("FILE.json is missing");
    if (!out)
        return cli_usage("no output given: -o OUT.svg or -o OUT.html");
    bool html = ends_with(out, ".html") || ends_with(out, ".htm");
    if (!html && !ends_with(out, ".svg"))
        return cli_usage("the output must end in .svg or .html, not '%s'", out);

    report_t r;
    int rc = report_load(&r, file, true);
    if (rc)
        return rc;
    plot_data_t p = {0};
    p.r = &r;
    p.by_events = by_events;
    if (!r.nevents) {
        report_free(&r);
        return cli_fail(EXIT_DATA,
                        "%s: the report has no timeline to plot; run the process with "
                        "TALLY_CONF=timeline:true (and report_path) to record one",
                        file);
    }
    /* Events per device; the default device is the home device if it has
     * any, else the busiest. */
    size_t counts[64] = {0};
    int busiest = -1;
    for (size_t i = 0; i < r.nevents; i++) {
        int d = r.events[i].device;
        if (d < 64 && r.events[i].action != EV_STAGE_BEGIN && r.events[i].action != EV_STAGE_END)
            counts[d]++;
    }
    for (int d = 0; d < 64; d++)
        if (counts[d] && (busiest < 0 || counts[d] > counts[busiest]))
            busiest = d;
    if (device < 0)
        device = r.home_device >= 0 && r.home_device < 64 && counts[r.home_device] ? (int)r.home_device
                 : busiest >= 0                                                   ? busiest
                                                                                  : r.events[0].device;
    p.device = device;
    p.ev = cli_alloc(r.nevents * sizeof *p.ev);
    for (size_t i = 0; i < r.nevents; i++)
        if (r.events[i].device == device)
            p.ev[p.nev++] = i;
    if (!p.nev) {
        char list[256] = "";
        size_t n = 0;
        for (int d = 0; d < 64 && n + 8 < sizeof list; d++)
            if (counts[d])
                n += (size_t)snprintf(list + n, sizeof list - n, "%s%d", n ? ", " : "", d);
        cli_fail(EXIT_DATA, "%s: no timeline events for device %d (the timeline has allocations on device%s %s)",
                 file, device, strchr(list, ',') ? "s" : "", n ? list : "none");
        plot_data_free(&p);
        report_free(&r);
        return EXIT_DATA;
    }
    const rep_device_t *dev = report_device(&r, device);
    p.dropped = dev ? dev->timeline_dropped : 0;
    tag_index(&p, "(before timeline)"); /* index 0 */
    replay(&p, NULL);
    make_groups(&p);
    make_points(&p, PR - PL);

    FILE *f = fopen(out, "w");
    if (!f) {
        rc = cli_fail(EXIT_DATA, "cannot write %s: %s", out, strerror(errno));
    } else {
        if (html)
            write_html(f, &p, file);
        else
            write_svg(f, &p, file, true);
        bool bad = ferror(f) != 0;
        if (fclose(f) != 0 || bad)
            rc = cli_fail(EXIT_DATA, "writing %s failed: %s", out, strerror(errno));
    }
    if (!rc) {
        int drawn = 0;
        for (int g = 0; g < p.ngroups; g++)
            drawn += p.gpeak[g] > 0;
        printf("wrote %s: device %d, %zu events, %d tag group%s, peak allocated %s\n", out, device, p.nev, drawn,
               drawn == 1 ? "" : "s", cli_bytes(p.peak_alloc, (char[32]){0}, 32));
        if (p.dropped > 0)
            printf("the timeline had dropped the %" PRId64 " oldest events of device %d (it keeps the newest "
                   "timeline_events per device; bytes from before show as \"(before timeline)\")\n",
                   p.dropped, device);
    }
    plot_data_free(&p);
    report_free(&r);
    return rc ? rc : cli_finish(stdout, "the message");
}

#endif /* TALLY_CLI_PLOT_H */
