/* What `tally tune` writes (tune.c runs the replays and picks the rows):
 * the table, the JSON array of rows, the recommendation lines (both of
 * PyTorch's variable names, and which one the torch version reads), and
 * --plot, reserved memory over the trace (x: event number) for the
 * recommendation and PyTorch's default as step lines in one SVG (the report
 * plot of cli_plot.c stacks a report's timeline by tag; this one compares
 * whole-device totals, so it is drawn here in a few lines). */
#include "tune.h"

#include "../tests/standin/cost.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *mib(int64_t b, char *buf, size_t len)
{
    snprintf(buf, len, "%.1f MiB", (double)b / 1048576.0);
    return buf;
}

/* The setting as PyTorch takes it, after "NAME=": a memory fraction is set
 * from Python, not in the configuration string. */
static void pt_value(const tune_row_t *r, char *buf, size_t len)
{
    const char *mf = strstr(r->setting, "memory_fraction:");
    if (mf) {
        size_t keep = (size_t)(mf - r->setting);
        while (keep && r->setting[keep - 1] == ',')
            keep--;
        snprintf(buf, len, "%.*s with torch.cuda.set_per_process_memory_fraction(%s)", (int)keep, r->setting,
                 mf + strlen("memory_fraction:"));
    } else {
        snprintf(buf, len, "%s", r->setting);
    }
}

/* The exact line for row r: PYTORCH_CUDA_ALLOC_CONF (every torch version
 * reads that name) for PyTorch's rules, TALLY_CONF for tally's own. */
static void conf_line(const tune_row_t *r, char *buf, size_t len)
{
    char v[512];
    if (r->engine == TUNE_TALLY) {
        snprintf(buf, len, "TALLY_CONF=%.159s", r->setting);
    } else {
        pt_value(r, v, sizeof v);
        snprintf(buf, len, "PYTORCH_CUDA_ALLOC_CONF=%s", v);
    }
}

const char *tune_allocator_name(const tune_row_t *r)
{
    return r->engine == TUNE_TALLY ? "tally" : r->engine == TUNE_PT_EXPAND ? "PyTorch (model)" : "PyTorch/tally";
}

/* ---- torch versions and the variable's name ------------------------------------ */

/* What each torch version reads (../shared/pytorch.md): PYTORCH_CUDA_ALLOC_CONF
 * in every version (from 2.10 with a deprecation warning, PR 167659);
 * PYTORCH_ALLOC_CONF from 2.9, but 2.9.x ignore expandable_segments under it
 * (pytorch#183387, seen on 2.9.1). vLLM reads only the old name. */
int tune_parse_version(const char *s, tune_torch_version_t *v)
{
    char *end;
    long ma = strtol(s, &end, 10);
    if (end == s || *end != '.' || ma < 1 || ma > 99)
        return -1;
    const char *m = end + 1;
    long mi = strtol(m, &end, 10);
    if (end == m || mi < 0 || mi > 999 || (*end && *end != '.' && *end != '+' && *end != 'a' && *end != 'r' &&
                                           *end != 'd'))
        return -1;
    v->major = (int)ma;
    v->minor = (int)mi;
    snprintf(v->text, sizeof v->text, "%.40s", s);
    return 0;
}

/* The installed torch's version: $TALLY_PYTHON (default python3) asked to
 * import torch; unknown when that fails. */
void tune_installed_torch(tune_torch_version_t *v)
{
    const char *py = getenv("TALLY_PYTHON");
    char cmd[300], line[128] = "";
    snprintf(cmd, sizeof cmd, "%s -c 'import torch; print(torch.__version__)' 2>/dev/null",
             py && *py ? py : "python3");
    FILE *f = popen(cmd, "r");
    if (!f)
        return;
    if (!fgets(line, sizeof line, f))
        line[0] = 0;
    pclose(f);
    line[strcspn(line, "\r\n")] = 0;
    if (line[0] && tune_parse_version(line, v) == 0)
        v->from = "the installed torch";
}

static bool version_before(const tune_torch_version_t *v, int major, int minor)
{
    return v->major < major || (v->major == major && v->minor < minor);
}

/* Print both names, and which one this version should use. */
static void print_pytorch_lines(const tune_row_t *r, const tune_torch_version_t *v)
{
    char val[512];
    pt_value(r, val, sizeof val);
    printf("  PYTORCH_ALLOC_CONF=%s\n  PYTORCH_CUDA_ALLOC_CONF=%s\n", val, val);
    bool expandable = strstr(r->setting, "expandable_segments:True") != NULL;
    if (!v->text[0]) {
        printf("  torch version unknown (give --torch-version): torch 2.10 and later read PYTORCH_ALLOC_CONF "
               "(the old name still works, with a deprecation warning); 2.9 reads both but ignores "
               "expandable_segments under PYTORCH_ALLOC_CONF (pytorch#183387); older versions and vLLM read only "
               "PYTORCH_CUDA_ALLOC_CONF\n");
    } else if (version_before(v, 2, 9)) {
        printf("  torch %s (%s): use PYTORCH_CUDA_ALLOC_CONF (versions before 2.9 do not read PYTORCH_ALLOC_CONF)\n",
               v->text, v->from);
    } else if (version_before(v, 2, 10)) {
        printf("  torch %s (%s): use PYTORCH_CUDA_ALLOC_CONF (2.9 reads PYTORCH_ALLOC_CONF but %s)\n", v->text,
               v->from,
               expandable ? "ignores expandable_segments under it, pytorch#183387"
                          : "ignores expandable_segments under it, pytorch#183387; the old name is safe in 2.9");
    } else {
        printf("  torch %s (%s): use PYTORCH_ALLOC_CONF (PYTORCH_CUDA_ALLOC_CONF still works, with a deprecation "
               "warning; vLLM reads only PYTORCH_CUDA_ALLOC_CONF)\n",
               v->text, v->from);
    }
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

/* Live bytes (the sum of requested sizes) just before event i. */
static uint64_t live_before(const trace_t *t, size_t i)
{
    uint64_t live = 0;
    for (size_t k = 0; k < i && k < t->nev; k++)
        live = t->ev[k].op == 'a' ? live + t->ev[k].size : t->ev[k].op == 'f' ? live - t->ev[k].size : live;
    return live;
}

void tune_print_json(const tune_outcome_t *o)
{
    char line[1024];
    const trace_t *t = &o->in->trace;
    printf("[");
    for (size_t i = 0; i < o->n; i++) {
        const tune_row_t *r = &o->rows[i];
        conf_line(r, line, sizeof line);
        printf("%s\n {\"setting\":", i ? "," : "");
        json_str(r->setting);
        printf(",\"allocator\":");
        json_str(tune_allocator_name(r));
        printf(",\"peak_reserved_bytes\":%" PRId64 ",\"peak_live_bytes\":%" PRIu64 ",\"backend_calls\":%" PRId64
               ",\"device_allocs\":%" PRId64 ",\"fits\":%s,\"capacity_bytes\":%" PRIu64
               ",\"recommended\":%s,\"recommended_tally\":%s",
               r->peak_reserved, o->live, r->backend_calls, r->num_device_alloc, tune_fits(r) ? "true" : "false",
               o->capacity, (long)i == o->rec_pt ? "true" : "false", (long)i == o->rec_tally ? "true" : "false");
        if (r->ok)
            printf(",\"driver_us_a100\":%.1f,\"driver_us_blackwell\":%.1f", tune_driver_us(r, SI_COST_A100),
                   tune_driver_us(r, SI_COST_BLACKWELL));
        if (r->kept_live > 0)
            printf(",\"empty_cache_kept_bytes\":%" PRId64 ",\"empty_cache_live_bytes\":%" PRId64
                   ",\"empty_cache_kept_ratio\":%.4f",
                   r->kept, r->kept_live, tune_kept_ratio(r));
        else if (r->ok)
            printf(",\"empty_cache_kept_ratio\":null");
        if (r->min_bytes > 0)
            printf(",\"min_device_bytes\":%" PRId64, r->min_bytes);
        else if (r->ok && r->min_lower >= 0)
            printf(",\"min_device_bytes\":null,\"min_device_bytes_above\":%" PRId64, r->min_lower);
        else if (r->ok)
            printf(",\"min_device_bytes\":null");
        if (r->out_event >= 0 && (size_t)r->out_event < t->nev)
            printf(",\"runs_out\":{\"capacity_bytes\":%" PRId64 ",\"event\":%ld,\"size\":%" PRIu64
                   ",\"live_bytes\":%" PRIu64 "}",
                   r->out_capacity, r->out_event, t->ev[r->out_event].size, live_before(t, (size_t)r->out_event));
        if (r->oom_event >= 0)
            printf(",\"oom_event\":%ld", r->oom_event);
        if (o->in->has_recorded)
            printf(",\"recorded_peak_reserved_bytes\":%" PRId64, o->in->recorded_peak);
        if (o->replayed && o->replayed->ok)
            printf(",\"recorded_replay_peak_reserved_bytes\":%" PRId64, o->replayed->peak_reserved);
        printf(",\"line\":");
        json_str(line);
        if (r->engine != TUNE_PT_EXPAND) {
            snprintf(line, sizeof line, "TALLY_CONF=%.159s", r->setting);
            printf(",\"tally_line\":");
            json_str(line);
        }
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

const char *tune_size_text(int64_t b, char *buf, size_t len)
{
    if (b < 100 * 1024)
        snprintf(buf, len, "%lld B", (long long)b);
    else if (b < ((int64_t)1 << 20))
        snprintf(buf, len, "%.1f KiB", (double)b / 1024.0);
    else if (b >= ((int64_t)1 << 40))
        snprintf(buf, len, "%.1f TiB", (double)b / 1099511627776.0);
    else if (b >= ((int64_t)1 << 30) * 10)
        snprintf(buf, len, "%.2f GiB", (double)b / 1073741824.0);
    else
        snprintf(buf, len, "%.1f MiB", (double)b / 1048576.0);
    return buf;
}

static void print_recommendation(const tune_outcome_t *o, bool pytorch)
{
    char a[32], b[32], c[32];
    long k = pytorch ? o->rec_pt : o->rec_tally;
    const tune_row_t *def = &o->rows[0];
    printf("\n%s: ", pytorch ? "PyTorch's allocator" : "tally");
    if (k < 0) {
        printf("no setting fits in %s within %" PRId64 " backend calls", mib((int64_t)o->capacity, a, sizeof a),
               o->budget);
        if (o->max_driver_us >= 0)
            printf(" and %.1f ms of driver time", o->max_driver_us / 1000.0);
        printf("\n");
        return;
    }
    const tune_row_t *r = &o->rows[k];
    const char *name = r->setting[0] ? r->setting : pytorch ? "PyTorch's default" : "tally's default";
    bool def_over_time = o->max_driver_us >= 0 && tune_driver_us(def, o->gpu) > o->max_driver_us;
    if (k == 0)
        printf("keep the default (no setting within the budget reserves less): %s", mib(r->peak_reserved, a, sizeof a));
    else if (!tune_fits(def))
        printf("%s reserves %s, where the default does not fit in %s", name, mib(r->peak_reserved, a, sizeof a),
               mib((int64_t)o->capacity, b, sizeof b));
    else if (def->backend_calls > o->budget || def_over_time)
        printf("%s reserves %s, where the default is over the %s budget", name, mib(r->peak_reserved, a, sizeof a),
               def_over_time ? "driver time" : "call");
    else if (r->peak_reserved >= def->peak_reserved)
        printf("%s reserves the same %s as the default", name,
               mib(r->peak_reserved, a, sizeof a));
    else
        printf("%s reserves %s, %s (%.1f%%) less than the default", name, mib(r->peak_reserved, a, sizeof a),
               mib(def->peak_reserved - r->peak_reserved, b, sizeof b),
               def->peak_reserved ? 100.0 * (double)(def->peak_reserved - r->peak_reserved) / (double)def->peak_reserved
                                  : 0.0);
    printf(", %" PRId64 " backend call%s (default %" PRId64 "), %.1f ms of driver time on %s", r->backend_calls,
           r->backend_calls == 1 ? "" : "s", def->backend_calls, tune_driver_us(r, o->gpu) / 1000.0,
           si_cost_column_name(o->gpu));
    if (r->min_bytes > 0)
        printf("; runs in %s", tune_size_text(r->min_bytes, c, sizeof c));
    if (r->kept_live > 0 && def->kept_live > 0)
        printf("; an empty_cache keeps %.3f x the live bytes (default %.3f)", tune_kept_ratio(r), tune_kept_ratio(def));
    printf("\n");
    if (pytorch) {
        print_pytorch_lines(r, o->torch);
        if (r->engine == TUNE_PT_EXPAND)
            printf("  (PyTorch's own expandable segments, from the model of tools/pt_expand.c)\n");
    } else {
        printf("  TALLY_CONF=%s\n  (run the job under tally: python -m tally run)\n", r->setting);
    }
}

void tune_print_table(const char *file, const tune_outcome_t *o)
{
    char a[32], b[32], c[32], d[32];
    const tune_input_t *in = o->in;
    const trace_t *t = &in->trace;
    const tune_row_t *rows = o->rows;
    printf("tally tune: %s (%s: %zu events, %zu allocations, %zu stream%s", file, in->kind, t->nev, t->nalloc,
           t->nstreams, t->nstreams == 1 ? "" : "s");
    if (in->prelive)
        printf(", %zu live before recording began", in->prelive);
    if (in->releases)
        printf(", %zu release%s of cached memory", in->releases, in->releases == 1 ? "" : "s");
    printf(")\npeak live %s; capacity %s; call budget %" PRId64 "\n", mib((int64_t)o->live, a, sizeof a),
           mib((int64_t)o->capacity, b, sizeof b), o->budget);
    if (strcmp(in->kind, "CSV trace") == 0)
        printf("(a CSV lists the blocks live before recording began, not the cached free segments PyTorch held "
               "then: every replay starts from an empty cache)\n");
    printf("\n");
    int w = 22;
    for (size_t i = 0; i < o->n; i++)
        w = (int)strlen(rows[i].setting) > w ? (int)strlen(rows[i].setting) : w;
    char dh[32];
    snprintf(dh, sizeof dh, "driver ms (%s)", si_cost_column_name(o->gpu));
    printf("%-*s %-15s %14s %9s %8s %9s %*s %12s %4s  %s\n", w, "setting", "allocator", "peak reserved", "res/live",
           "kept", "calls", (int)strlen(dh), dh, "needs", "fits", "runs out with less (event: size, live then)");
    for (size_t i = 0; i < o->n; i++) {
        const tune_row_t *r = &rows[i];
        const char *name = r->setting[0] ? r->setting : "(default)";
        if (!r->ok) {
            printf("%-*s %-15s  error: %s\n", w, name, tune_allocator_name(r), r->error);
            continue;
        }
        char need[40], out[96] = "-";
        if (r->min_bytes > 0)
            tune_size_text(r->min_bytes, need, sizeof need);
        else if (r->min_lower < 0)
            snprintf(need, sizeof need, "(fraction)");
        else
            snprintf(need, sizeof need, ">%s", tune_size_text(r->min_lower, c, sizeof c));
        if (r->out_event >= 0 && (size_t)r->out_event < t->nev)
            snprintf(out, sizeof out, "in %s at %ld: %s, %s", tune_size_text(r->out_capacity, c, sizeof c), r->out_event,
                     tune_size_text((int64_t)t->ev[r->out_event].size, d, sizeof d),
                     tune_size_text((int64_t)live_before(t, (size_t)r->out_event), a, sizeof a));
        char kept[16] = "-";
        if (r->kept_live > 0)
            snprintf(kept, sizeof kept, "%.3f", tune_kept_ratio(r));
        printf("%-*s %-15s %14s %9.3f %8s %9" PRId64 " %*.1f %12s %4s  %s%s%s\n", w, name, tune_allocator_name(r),
               mib(r->peak_reserved, b, sizeof b), o->live ? (double)r->peak_reserved / (double)o->live : 0.0, kept,
               r->backend_calls, (int)strlen(dh), tune_driver_us(r, o->gpu) / 1000.0, need, tune_fits(r) ? "yes" : "no", out,
               (long)i == o->rec_pt ? "  <- PyTorch" : "", (long)i == o->rec_tally ? "  <- tally" : "");
    }
    printf("\nneeds: the least device memory the setting runs in (replays bisected to 0.1%%; (fraction): a memory "
           "fraction caps at a share of the device, so it has no least); runs out: where a replay with less "
           "memory than that refused an allocation; kept: what stays reserved just after an empty_cache, over the "
           "bytes live then, summed over cuts at 10%%, 20%% ... 90%% of the events (a replay each; -: not "
           "measured), which breaks ties of peak reserved; driver ms: the modelled time of the row's driver calls "
           "(tests/standin/cost.c's table, this GPU's column)\n");
    printf("allocator: PyTorch/tally = PyTorch's keys on the default placement, which both follow (tally replays "
           "it); tally = tally's own placement (TALLY_CONF only); PyTorch (model) = PyTorch's own expandable "
           "segments, modelled (tools/pt_expand.c)\n");
    if (in->has_recorded) {
        printf("\nrecorded by PyTorch (PYTORCH_CUDA_ALLOC_CONF=\"%s\"): peak reserved %s (%s when recording began)\n",
               in->recorded_conf, mib(in->recorded_peak, a, sizeof a), mib(in->recorded_start, b, sizeof b));
        const tune_row_t *rp = o->replayed;
        if (rp && !rp->ok) {
            printf("replay of the same setting from the recorded state failed: %s\n", rp->error);
            rp = NULL; /* then the grid's row, from an empty cache */
        }
        if (rp) {
            int64_t df = rp->peak_reserved - in->recorded_peak;
            printf("replay of the same setting from the recorded state (%zu segment%s, %zu live block%s): %s; "
                   "difference %s%s (%+.2f%%)\n",
                   in->start.nranges, in->start.nranges == 1 ? "" : "s", in->start.nlive,
                   in->start.nlive == 1 ? "" : "s", mib(rp->peak_reserved, b, sizeof b), df >= 0 ? "+" : "",
                   mib(df, c, sizeof c), in->recorded_peak ? 100.0 * (double)df / (double)in->recorded_peak : 0.0);
        } else {
            /* No recorded state to start from: the grid's row of that setting, from an empty cache. */
            const tune_row_t *same = NULL;
            for (size_t i = 0; i < o->n && !same; i++)
                if (strcmp(rows[i].setting, in->recorded_conf) == 0 && rows[i].engine != TUNE_TALLY)
                    same = &rows[i];
            if (same && !same->ok) {
                if (!o->replayed) /* else it said so just above */
                    printf("replay of the same setting failed: %s\n", same->error);
            } else if (same) {
                int64_t df = same->peak_reserved - in->recorded_peak;
                printf("replay of the same setting (from an empty cache): %s; difference %s%s (%+.2f%%)\n",
                       mib(same->peak_reserved, b, sizeof b), df >= 0 ? "+" : "", mib(df, c, sizeof c),
                       in->recorded_peak ? 100.0 * (double)df / (double)in->recorded_peak : 0.0);
            } else {
                printf("(that setting is too long to replay, so there is no replay to compare)\n");
            }
        }
        if (in->start.gap[0])
            printf("(the snapshot cannot carry all of the recorded state: %s)\n", in->start.gap);
    }
    print_recommendation(o, true);
    print_recommendation(o, false);
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
