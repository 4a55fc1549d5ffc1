/* tally plot, drawing: the SVG (stacked tag areas, the reserved line, stage
 * bands, OOM marks, axes and legend) and the HTML page around it (the SVG
 * inline, then tables of peaks by tag, of the live blocks and of the
 * stages), from the points cli_plot.c rebuilt. */
#include "cli_plot_draw.h"

#include <math.h>

/* ---- drawing ----------------------------------------------------------------- */

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
        sum = cli_add(sum, p->val[i * (size_t)p->ngroups + h]);
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
            double xb = begun ? sx(sc, cli_plot_event_x(p, kb)) : PL;
            double xe = e ? sx(sc, cli_plot_event_x(p, k)) : sx(sc, p->x_end);
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
void cli_plot_write_svg(FILE *f, const plot_data_t *p, const char *file, bool xml_decl)
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
        double x = sx(&sc, cli_plot_event_x(p, k));
        fprintf(f, "<path class=\"oom\" d=\"M%.1f,%d l-6,-10 h12 z\" fill=\"#d62728\"><title>out of memory: %" PRId64
                   " bytes asked</title></path>\n",
                x, PT, e->size);
    }
    /* Private tags' sleeps and wakes: a marker under the plot, the tag and
     * the bytes unmapped or mapped back in its title. */
    for (size_t k = 0; k < p->nev; k++) {
        const rep_event_t *e = &p->r->events[p->ev[k]];
        if (e->action != EV_SLEEP && e->action != EV_WAKE)
            continue;
        double x = sx(&sc, cli_plot_event_x(p, k));
        bool sleep = e->action == EV_SLEEP;
        fprintf(f, "<path class=\"%s\" d=\"M%.1f,%d l-6,%d h12 z\" fill=\"%s\"><title>tag ", sleep ? "sleep" : "wake",
                x, PB + 2, 10, sleep ? "#1f77b4" : "#2ca02c");
        cli_xml_str(f, e->tag ? e->tag : "?");
        fprintf(f, " %s: %" PRId64 " bytes %s</title></path>\n", sleep ? "slept" : "woke", e->size,
                sleep ? "unmapped" : "mapped back");
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

void cli_plot_write_html(FILE *f, const plot_data_t *p, const char *file)
{
    char b1[32], b2[32], b3[32], b4[32];
    fputs("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>tally: ", f);
    cli_xml_str(f, file);
    fputs("</title>\n<style>\nbody { font-family: DejaVu Sans, Helvetica, Arial, sans-serif; margin: 20px; }\n"
          "table { border-collapse: collapse; margin-bottom: 1em; }\n"
          "th, td { padding: 2px 12px; text-align: right; border-bottom: 1px solid #ddd; }\n"
          "th:first-child, td:first-child { text-align: left; }\n</style>\n</head>\n<body>\n",
          f);
    cli_plot_write_svg(f, p, file, false);
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
