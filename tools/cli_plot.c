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
 * allocated memory was highest, so peaks survive. The model is declared in
 * cli_plot.h; the drawing is in cli_plot_draw.c. */
#include "cli_plot.h"
#include "cli_plot_draw.h"

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

double cli_plot_event_x(const plot_data_t *p, size_t k)
{
    return p->by_events ? (double)k : p->ev_us[k];
}

/* Each event's x by time, in doubles: time_us is any int64 in a report read
 * back, so the difference of two can overflow one. A stamp behind the
 * latest so far (the wall clock set back, or a hand-edited file) stays at
 * the latest, so x never decreases and every x lies in [0, the last x]. */
static void event_times(plot_data_t *p)
{
    p->ev_us = cli_alloc(p->nev * sizeof *p->ev_us);
    double t0 = (double)p->r->events[p->ev[0]].time_us, latest = 0;
    for (size_t k = 0; k < p->nev; k++) {
        double x = (double)p->r->events[p->ev[k]].time_us - t0;
        if (x > latest)
            latest = x;
        p->ev_us[k] = latest;
    }
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
    p->cur[TAG_BEFORE] = cli_add(first->allocated, -event_delta(first));
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
            p->cur[t] = cli_add(p->cur[t], e->size);
        } else if (e->action == EV_FREE) {
            t = addr_take(&map, (uint64_t)e->addr, TAG_BEFORE);
            p->cur[t] = cli_add(p->cur[t], -e->size);
        }
        if (t >= 0)
            p->moved[t] = cli_add(p->moved[t], e->size);
        if (t >= 0 && p->cur[t] > p->peak[t])
            p->peak[t] = p->cur[t];
        if (vals) {
            if (t >= 0)
                gcur[p->group_of[t]] = cli_add(gcur[p->group_of[t]], event_delta(e));
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
            p->gpeak[other] = cli_add(p->gpeak[other], p->peak[t]); /* an upper bound; shown as such */
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
    double span = cli_plot_event_x(p, p->nev - 1);
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
            add_point(p, cli_plot_event_x(p, k), vals + k * ng, p->r->events[p->ev[k]].reserved);
        free(vals);
        return;
    }
    double colw = p->x_end / columns;
    size_t k = 0;
    while (k < p->nev) {
        long col = (long)(cli_plot_event_x(p, k) / colw);
        size_t peak = k, last = k;
        int64_t resv_max = p->r->events[p->ev[k]].reserved;
        for (k++; k < p->nev && (long)(cli_plot_event_x(p, k) / colw) == col; k++) {
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
    free(p->ev_us);
    free(p->tags);
    free(p->cur);
    free(p->peak);
    free(p->moved);
    free(p->group_of);
    free(p->x);
    free(p->val);
    free(p->reserved);
}

/* ---- command ------------------------------------------------------------------ */

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcasecmp(s + n - k, suffix) == 0;
}

int cli_plot_main(int argc, char **argv)
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
            } else if (cli_is_opt(a, "-o") || cli_is_opt(a, "--output")) {
                out = cli_opt_value(argc, argv, &i, a, "--output");
                if (!out || !*out)
                    return cli_usage("%s needs a file name (OUT.svg or OUT.html)", a);
            } else if (cli_is_opt(a, "--device") || cli_is_opt(a, "-d")) {
                int rc = cli_parse_device(cli_opt_value(argc, argv, &i, a, "--device"), &device);
                if (rc)
                    return rc;
            } else if (cli_is_opt(a, "--x")) {
                const char *v = cli_opt_value(argc, argv, &i, a, "--x");
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
    int rc = cli_report_load(&r, file, true);
    if (rc)
        return rc;
    plot_data_t p = {0};
    p.r = &r;
    p.by_events = by_events;
    if (!r.nevents) {
        cli_report_free(&r);
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
        cli_report_free(&r);
        return EXIT_DATA;
    }
    const rep_device_t *dev = cli_report_device(&r, device);
    p.dropped = dev ? dev->timeline_dropped : 0;
    tag_index(&p, "(before timeline)"); /* index 0 */
    event_times(&p);
    replay(&p, NULL);
    make_groups(&p);
    make_points(&p, PR - PL);

    FILE *f = fopen(out, "w");
    if (!f) {
        rc = cli_fail(EXIT_DATA, "cannot write %s: %s", out, strerror(errno));
    } else {
        if (html)
            cli_plot_write_html(f, &p, file);
        else
            cli_plot_write_svg(f, &p, file, true);
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
    cli_report_free(&r);
    return rc ? rc : cli_finish(stdout, "the message");
}
