/* `tally tune FILE`: replay a job's allocations under a grid of settings
 * and recommend the one that reserves least within a call budget (tune.h,
 * docs/tune.md). Prints a table, or with --json one JSON array of rows;
 * --plot draws reserved memory over the trace (x: event number) for the
 * recommendation and PyTorch's default as step lines in one SVG (the report
 * plot of cli_plot.c stacks a report's timeline by tag; this one compares
 * whole-device totals, so it is drawn here in a few lines). */
#include "tune.h"

#include <tally.h>

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TUNE_MAX_ROWS 32
#define GIB ((uint64_t)1 << 30)

static const char tune_help[] =
    "usage: tally tune [OPTIONS] FILE\n"
    "\n"
    "Replay a job's allocations through tally (host backend, virtual memory: no\n"
    "GPU needed) under a grid of allocator settings, and recommend the one with\n"
    "the least peak reserved memory among those within a backend-call budget,\n"
    "written as the PYTORCH_CUDA_ALLOC_CONF or TALLY_CONF line to use.\n"
    "FILE is an allocation trace CSV (op,id,size,stream), a PyTorch memory\n"
    "snapshot pickle (torch.cuda.memory._dump_snapshot), or a tally JSON report\n"
    "recorded with trace:true. docs/tune.md explains the grid and the rules.\n"
    "\n"
    "  --capacity SIZE   device memory, e.g. 80GiB (default: the report's device\n"
    "                    total, else 80GiB); a setting that needs more does not fit\n"
    "  --max-calls N     call budget: backend calls (device allocations and frees)\n"
    "                    a recommendation may make (default: 4 x PyTorch's default,\n"
    "                    at least 64)\n"
    "  --device N        the device whose allocations to replay (default: the\n"
    "                    one with the most events); snapshots and reports only\n"
    "  --jobs N          worker processes (default: the online CPUs)\n"
    "  --json            print one JSON array of rows instead of the table\n"
    "  --plot OUT.svg    draw reserved memory over the trace, recommendation and\n"
    "                    default\n"
    "  -q, --quiet       no progress line on stderr\n"
    "  -h, --help        this text\n";

static int tune_err(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int tune_err(int code, const char *fmt, ...)
{
    va_list ap;
    fputs("tally tune: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return code;
}

/* "80GiB", "81920MiB", "85899345920", "80G" (binary), "80GB" (decimal). */
static int parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || v <= 0 || !isdigit((unsigned char)s[0]))
        return -1;
    static const struct {
        const char *suffix;
        double mult;
    } units[] = {{"", 1},       {"B", 1},           {"K", 1024.0},      {"KiB", 1024.0}, {"KB", 1e3},
                 {"M", 1048576.0}, {"MiB", 1048576.0}, {"MB", 1e6},     {"G", 1073741824.0},
                 {"GiB", 1073741824.0}, {"GB", 1e9}, {"T", 1099511627776.0}, {"TiB", 1099511627776.0},
                 {"TB", 1e12}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcmp(end, units[i].suffix) == 0) {
            double b = v * units[i].mult;
            if (b < 1 || b > 1e18)
                return -1;
            *out = (uint64_t)b;
            return 0;
        }
    return -1;
}

static const char *mib(int64_t b, char *buf, size_t len)
{
    snprintf(buf, len, "%.1f MiB", (double)b / 1048576.0);
    return buf;
}

/* The exact line to use for row r. */
static void conf_line(const tune_row_t *r, char *buf, size_t len)
{
    const char *mf = strstr(r->setting, "memory_fraction:");
    if (r->tally_only) {
        snprintf(buf, len, "TALLY_CONF=%s", r->setting);
    } else if (mf) {
        /* PyTorch sets the fraction from Python, not in its configuration string. */
        size_t keep = (size_t)(mf - r->setting);
        while (keep && r->setting[keep - 1] == ',')
            keep--;
        snprintf(buf, len, "PYTORCH_CUDA_ALLOC_CONF=%.*s with torch.cuda.set_per_process_memory_fraction(%s)",
                 (int)keep, r->setting, mf + strlen("memory_fraction:"));
    } else {
        snprintf(buf, len, "PYTORCH_CUDA_ALLOC_CONF=%s", r->setting);
    }
}

/* The recommendation: the least peak reserved among the rows that fit and
 * keep within the budget; ties go to fewer calls, then to the earlier row
 * (PyTorch's default first). */
static size_t recommend(const tune_row_t *rows, size_t n, int64_t budget)
{
    size_t best = 0;
    bool have = false;
    for (size_t i = 0; i < n; i++) {
        const tune_row_t *r = &rows[i];
        if (!r->ok || r->oom_event >= 0 || r->backend_calls > budget)
            continue;
        if (!have || r->peak_reserved < rows[best].peak_reserved ||
            (r->peak_reserved == rows[best].peak_reserved && r->backend_calls < rows[best].backend_calls)) {
            best = i;
            have = true;
        }
    }
    return best;
}

static void json_str(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            printf("\\u%04x", *s);
        else
            putchar(*s);
    }
    putchar('"');
}

static void print_json(const tune_input_t *in, const tune_row_t *rows, size_t n, size_t rec, uint64_t live,
                       uint64_t capacity)
{
    char line[400];
    printf("[");
    for (size_t i = 0; i < n; i++) {
        const tune_row_t *r = &rows[i];
        conf_line(r, line, sizeof line);
        printf("%s\n {\"setting\":", i ? "," : "");
        json_str(r->setting);
        printf(",\"peak_reserved_bytes\":%" PRId64 ",\"peak_live_bytes\":%" PRIu64 ",\"backend_calls\":%" PRId64
               ",\"device_allocs\":%" PRId64 ",\"fits\":%s,\"capacity_bytes\":%" PRIu64 ",\"recommended\":%s",
               r->peak_reserved, live, r->backend_calls, r->num_device_alloc,
               r->ok && r->oom_event < 0 ? "true" : "false", capacity, i == rec ? "true" : "false");
        if (r->oom_event >= 0)
            printf(",\"oom_event\":%ld", r->oom_event);
        if (in->has_recorded)
            printf(",\"recorded_peak_reserved_bytes\":%" PRId64, in->recorded_peak);
        printf(",\"line\":");
        json_str(line);
        printf(",\"why\":");
        json_str(r->why ? r->why : "");
        if (!r->ok) {
            printf(",\"error\":");
            json_str(r->error);
        }
        printf("}");
    }
    printf("\n]\n");
}

static void print_table(const char *file, const tune_input_t *in, const tune_row_t *rows, size_t n, size_t rec,
                        uint64_t live, uint64_t capacity, int64_t budget)
{
    char a[32], b[32], c[32], line[400];
    const trace_t *t = &in->trace;
    printf("tally tune: %s (%s: %zu events, %zu allocations, %zu stream%s", file, in->kind, t->nev, t->nalloc,
           t->nstreams, t->nstreams == 1 ? "" : "s");
    if (in->prelive)
        printf(", %zu live before recording began", in->prelive);
    printf(")\npeak live %s; capacity %s; call budget %" PRId64 "\n\n", mib((int64_t)live, a, sizeof a),
           mib((int64_t)capacity, b, sizeof b), budget);
    int w = 22;
    for (size_t i = 0; i < n; i++)
        w = (int)strlen(rows[i].setting) > w ? (int)strlen(rows[i].setting) : w;
    printf("%-*s %16s %14s %13s %5s\n", w, "setting", "peak reserved", "reserved/live", "backend calls", "fits");
    for (size_t i = 0; i < n; i++) {
        const tune_row_t *r = &rows[i];
        const char *name = r->setting[0] ? r->setting : "(PyTorch's default)";
        if (!r->ok) {
            printf("%-*s  error: %s\n", w, name, r->error);
            continue;
        }
        printf("%-*s %16s %14.3f %13" PRId64 " %5s%s\n", w, name, mib(r->peak_reserved, a, sizeof a),
               live ? (double)r->peak_reserved / (double)live : 0.0, r->backend_calls, r->oom_event < 0 ? "yes" : "no",
               i == rec ? "  <- recommended" : r->oom_event >= 0 ? "  (out of memory: peak so far)" : "");
    }
    if (in->has_recorded) {
        /* The row replaying the setting the job ran with, when the grid has it. */
        const tune_row_t *same = NULL;
        for (size_t i = 0; i < n && !same; i++)
            if (strcmp(rows[i].setting, in->recorded_conf) == 0)
                same = &rows[i];
        printf("\nrecorded by PyTorch (PYTORCH_CUDA_ALLOC_CONF=\"%s\"): peak reserved %s (%s when recording began)",
               in->recorded_conf, mib(in->recorded_peak, a, sizeof a), mib(in->recorded_start, b, sizeof b));
        if (same && !same->ok) {
            printf("\nreplay of the same setting failed: %s\n", same->error);
        } else if (same) {
            int64_t d = same->peak_reserved - in->recorded_peak;
            printf("\nreplay of the same setting: %s; difference %s%s (%+.2f%%)\n", mib(same->peak_reserved, b, sizeof b),
                   d >= 0 ? "+" : "", mib(d, c, sizeof c), in->recorded_peak ? 100.0 * (double)d / (double)in->recorded_peak : 0.0);
        } else {
            printf("\n(that setting is too long to replay as a row, so there is no replay to compare)\n");
        }
    }
    const tune_row_t *r = &rows[rec];
    conf_line(r, line, sizeof line);
    printf("\n");
    if (!r->ok || r->oom_event >= 0) {
        printf("no setting fits in %s within the budget\n", mib((int64_t)capacity, a, sizeof a));
    } else if (rec == 0 || r->peak_reserved >= rows[0].peak_reserved) {
        printf("recommendation: keep PyTorch's default (no setting within the budget reserves less)\n  "
               "PYTORCH_CUDA_ALLOC_CONF=\n");
    } else {
        int64_t d = rows[0].peak_reserved - r->peak_reserved;
        printf("recommendation: %s reserves %s, %s (%.1f%%) less than PyTorch's default, with %" PRId64
               " backend calls (default %" PRId64 ")\n  %s\n",
               r->setting, mib(r->peak_reserved, a, sizeof a), mib(d, b, sizeof b),
               rows[0].peak_reserved ? 100.0 * (double)d / (double)rows[0].peak_reserved : 0.0, r->backend_calls,
               rows[0].backend_calls, line);
        if (r->tally_only)
            printf("  (tally's own placement: PyTorch's expandable_segments maps 20 MiB pages and would differ)\n");
    }
}

static void xml_text(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '<')
            fputs("&lt;", f);
        else if (*s == '>')
            fputs("&gt;", f);
        else if (*s == '&')
            fputs("&amp;", f);
        else if (*s == '"')
            fputs("&quot;", f);
        else
            fputc(*s, f);
    }
}

/* A round tick step for an axis from 0 to max with about n steps: 1, 2 or 5
 * times a power of ten. */
static double nice_step(double max, int n)
{
    double raw = max > 0 ? max / n : 1, mag = 1;
    while (mag * 10 <= raw)
        mag *= 10;
    while (mag > raw)
        mag /= 10;
    double f = raw / mag;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
}

/* Layout: the title on its own line (the file's base name, cut to fit),
 * the legend on the line below it, outside the plot so it never covers a
 * curve; axes with round ticks, the top tick at the axis's end; the right
 * margin wide enough for the last x label. */
int tune_plot_svg(const char *path, const char *title, const tune_series_t *s, const char *const *names, size_t n,
                  char *err, size_t errlen)
{
    static const char *const colors[] = {"#e15759", "#4e79a7", "#59a14f", "#f28e2c"};
    const double W = 900, H = 440, L = 80, R = 50, T = 64, B = 50;
    int64_t top = 1;
    size_t len = 1;
    for (size_t k = 0; k < n; k++) {
        len = s[k].n > len ? s[k].n : len;
        for (size_t i = 0; i < s[k].n; i++)
            top = s[k].reserved[i] > top ? s[k].reserved[i] : top;
    }
    FILE *f = fopen(path, "w");
    if (!f)
        return snprintf(err, errlen, "%s: cannot write: %s", path, strerror(errno)), -1;
    double ystep = nice_step((double)top / 1048576.0, 5);
    double ymax = ystep * ceil((double)top / 1048576.0 / ystep);
    double xstep = nice_step((double)len, 8);
    double xmax = xstep * ceil((double)len / xstep);
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
               "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            W, H);
    /* About 7 px a character at 14 px: what fits beside the fixed words. */
    const char *base = strrchr(title, '/') ? strrchr(title, '/') + 1 : title;
    char shown[128];
    size_t room = 70, bl = strlen(base);
    if (bl > room)
        snprintf(shown, sizeof shown, "...%s", base + bl - (room - 3));
    else
        snprintf(shown, sizeof shown, "%s", base);
    fprintf(f, "<text x=\"%.0f\" y=\"22\" font-size=\"14\">reserved memory (MiB) over the trace ", L);
    xml_text(f, shown);
    fputs("</text>\n", f);
    double lx = L;
    for (size_t k = 0; k < n; k++) {
        fprintf(f, "<line x1=\"%.0f\" y1=\"42\" x2=\"%.0f\" y2=\"42\" stroke=\"%s\" stroke-width=\"2\"/>\n", lx,
                lx + 20, colors[k % 4]);
        fprintf(f, "<text x=\"%.0f\" y=\"46\" fill=\"%s\">", lx + 26, colors[k % 4]);
        xml_text(f, names[k]);
        fputs("</text>\n", f);
        lx += 26 + 7.0 * (double)strlen(names[k]) + 24;
    }
    fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", L, H - B, W - R, H - B);
    fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", L, T, L, H - B);
    for (double v = 0; v <= ymax + ystep / 2; v += ystep) {
        double y = H - B - (H - T - B) * v / ymax;
        fprintf(f, "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%.0f</text>\n", L - 6, y + 4, v);
        fprintf(f, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L + 1, y, W - R, y);
    }
    for (double v = 0; v <= xmax + xstep / 2; v += xstep)
        fprintf(f, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%.0f</text>\n", L + (W - L - R) * v / xmax,
                H - B + 18, v);
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">event</text>\n", L + (W - L - R) / 2, H - 8);
    for (size_t k = 0; k < n; k++) {
        fprintf(f, "<path fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" d=\"", colors[k % 4]);
        double prev_y = -1, x = L;
        for (size_t i = 0; i < s[k].n; i++) {
            x = L + (W - L - R) * (double)i / xmax;
            double y = H - B - (H - T - B) * ((double)s[k].reserved[i] / 1048576.0) / ymax;
            if (i == 0)
                fprintf(f, "M%.1f %.1f", x, y);
            else if (y != prev_y)
                fprintf(f, "H%.1fV%.1f", x, y);
            prev_y = y;
        }
        fprintf(f, "H%.1f\"/>\n", L + (W - L - R) * (double)len / xmax);
    }
    fputs("</svg>\n", f);
    if (fclose(f))
        return snprintf(err, errlen, "%s: write failed", path), -1;
    return 0;
}

int tune_main(int argc, char **argv)
{
    const char *file = NULL, *plot = NULL;
    uint64_t capacity = 0;
    long long budget = -1;
    long jobs = sysconf(_SC_NPROCESSORS_ONLN), device = -1;
    bool json = false, quiet = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(tune_help, stdout);
            return 0;
        } else if (strcmp(a, "--json") == 0) {
            json = true;
        } else if (strcmp(a, "-q") == 0 || strcmp(a, "--quiet") == 0) {
            quiet = true;
        } else if (strcmp(a, "--capacity") == 0 || strcmp(a, "--max-calls") == 0 || strcmp(a, "--jobs") == 0 ||
                   strcmp(a, "--plot") == 0 || strcmp(a, "--device") == 0) {
            if (!v)
                return tune_err(2, "%s needs a value", a);
            i++;
            char *end = NULL;
            if (strcmp(a, "--capacity") == 0) {
                if (parse_size(v, &capacity))
                    return tune_err(2, "--capacity '%s' is not a size (e.g. 80GiB, 40960MiB, 85899345920)", v);
            } else if (strcmp(a, "--max-calls") == 0) {
                budget = strtoll(v, &end, 10);
                if (budget < 0 || *end || !*v)
                    return tune_err(2, "--max-calls '%s' is not a non-negative integer", v);
            } else if (strcmp(a, "--jobs") == 0) {
                jobs = strtol(v, &end, 10);
                if (jobs < 1 || jobs > 256 || *end || !*v)
                    return tune_err(2, "--jobs '%s' is not an integer from 1 to 256", v);
            } else if (strcmp(a, "--device") == 0) {
                device = strtol(v, &end, 10);
                if (device < 0 || device > 1024 || *end || !*v)
                    return tune_err(2, "--device '%s' is not a device number", v);
            } else {
                plot = v;
            }
        } else if (a[0] == '-' && a[1]) {
            return tune_err(2, "unknown option '%s' (tally tune --help lists them)", a);
        } else if (file) {
            return tune_err(2, "one FILE expected, got '%s' and '%s'", file, a);
        } else {
            file = a;
        }
    }
    if (!file)
        return tune_err(2, "FILE is missing (a trace CSV, a PyTorch snapshot pickle or a tally report)");
    if (jobs < 1)
        jobs = 1;

    if (plot) {
        /* Say now, before the replays, when the picture cannot be written. */
        FILE *pf = fopen(plot, "w");
        if (!pf)
            return tune_err(1, "%s: cannot write: %s", plot, strerror(errno));
        fclose(pf);
    }
    char err[1024];
    tune_input_t in;
    if (tune_input_load(file, (int)device, &in, err, sizeof err))
        return tune_err(1, "%s", err);
    /* A CSV trace has no device column: --device would silently do nothing. */
    if (device >= 0 && strcmp(in.kind, "CSV trace") == 0) {
        tune_input_free(&in);
        return tune_err(2, "--device %ld: %s is a CSV trace, which holds one device's allocations (--device picks "
                        "a device of a PyTorch snapshot or a report)", device, file);
    }
    if (!capacity)
        capacity = in.capacity > 0 ? (uint64_t)in.capacity : 80 * GIB;
    tune_row_t rows[TUNE_MAX_ROWS];
    size_t n = tune_grid(&in.trace, capacity, rows, TUNE_MAX_ROWS);
    /* The setting the snapshot's job ran with, so its replay can be set beside PyTorch's figure. */
    bool have = !in.has_recorded;
    for (size_t i = 0; i < n && !have; i++)
        have = strcmp(rows[i].setting, in.recorded_conf) == 0;
    if (!have && n < TUNE_MAX_ROWS && strlen(in.recorded_conf) < sizeof rows[n].setting) {
        memset(&rows[n], 0, sizeof rows[n]);
        snprintf(rows[n].setting, sizeof rows[n].setting, "%s", in.recorded_conf);
        rows[n].why = "the setting the job ran with";
        rows[n].oom_event = -1;
        n++;
    }
    uint64_t live = 0, cur = 0;
    for (size_t i = 0; i < in.trace.nev; i++) {
        cur = in.trace.ev[i].op == 'a' ? cur + in.trace.ev[i].size : cur - in.trace.ev[i].size;
        live = cur > live ? cur : live;
    }
    size_t want[1] = {0};
    tune_series_t series[2] = {{0}};
    if (tune_run(&in.trace, capacity, rows, n, (int)jobs, quiet, plot ? want : NULL, plot ? 1 : 0, series, err,
                 sizeof err)) {
        tune_input_free(&in);
        return tune_err(1, "%s", err);
    }
    if (!rows[0].ok) {
        tune_err(1, "%s: the replay of PyTorch's default failed: %s", file, rows[0].error);
        tune_input_free(&in);
        return 1;
    }
    if (budget < 0)
        budget = rows[0].backend_calls * 4 > 64 ? rows[0].backend_calls * 4 : 64;
    size_t rec = recommend(rows, n, budget);
    if (json)
        print_json(&in, rows, n, rec, live, capacity);
    else
        print_table(file, &in, rows, n, rec, live, capacity, budget);
    int rc = 0;
    if (plot) {
        /* The recommendation's series: one more replay of that row alone. */
        tune_row_t best = rows[rec];
        size_t zero = 0;
        if (tune_run(&in.trace, capacity, &best, 1, 1, true, &zero, 1, &series[1], err, sizeof err)) {
            rc = tune_err(1, "%s", err);
        } else {
            const char *names[2] = {"PyTorch's default", best.setting[0] ? best.setting : "PyTorch's default"};
            const tune_series_t both[2] = {series[0], series[1]};
            if (tune_plot_svg(plot, file, both, names, 2, err, sizeof err))
                rc = tune_err(1, "%s", err);
            else if (!json)
                printf("\nplot: %s\n", plot);
        }
    }
    free(series[0].reserved);
    free(series[1].reserved);
    tune_input_free(&in);
    if (fflush(stdout) || ferror(stdout))
        return tune_err(1, "writing the output failed");
    return rc;
}
