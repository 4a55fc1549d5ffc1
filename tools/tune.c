/* `tally tune FILE`: replay a job's allocations under a grid of settings
 * and recommend the one that reserves least within a call budget (tune.h,
 * docs/tune.md). Prints a table, or with --json one JSON array of rows;
 * --plot draws reserved memory over the trace (x: event number) for the
 * recommendation and PyTorch's default as step lines in one SVG (the report
 * plot of cli_plot.c stacks a report's timeline by tag; this one compares
 * whole-device totals, so it is drawn here in a few lines). */
#include "tune.h"

#include "../tests/standin/cost.h"

#include <tally.h>

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define TUNE_MAX_ROWS 40
#define GIB ((uint64_t)1 << 30)

static const char tune_help[] =
    "usage: tally tune [OPTIONS] FILE\n"
    "\n"
    "Replay a job's allocations through tally (host backend, virtual memory: no\n"
    "GPU needed) under a grid of allocator settings, and recommend the one with\n"
    "the least peak reserved memory among those within a backend-call budget:\n"
    "one under PyTorch's own rules (the PYTORCH_ALLOC_CONF line, under both of\n"
    "its names) and one under tally's (the TALLY_CONF line).\n"
    "FILE is an allocation trace CSV (op,id,size,stream), a PyTorch memory\n"
    "snapshot pickle (torch.cuda.memory._dump_snapshot), or a tally JSON report\n"
    "recorded with trace:true. docs/tune.md explains the grid and the rules.\n"
    "\n"
    "  --capacity SIZE   device memory, e.g. 80GiB (default: the report's device\n"
    "                    total, else 80GiB); a setting that needs more does not fit\n"
    "  --max-calls N     call budget: backend calls (device allocations and frees)\n"
    "                    a recommendation may make (default: 4 x PyTorch's default,\n"
    "                    at least 64)\n"
    "  --max-driver-time T  modelled driver time a recommendation may spend\n"
    "                    (250ms, 1.5s, 800us; the cost table of tests/standin/cost.c)\n"
    "  --gpu NAME        the cost table's column: A100 (default) or Blackwell\n"
    "  --torch-version V the torch the job runs with (default: the installed\n"
    "                    torch's), to name the variable that version reads\n"
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

/* "250ms", "1.5s", "800us", "2000" (microseconds) into microseconds. */
static int parse_duration_us(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || v < 0 || !isdigit((unsigned char)s[0]))
        return -1;
    double mult = strcmp(end, "") == 0 || strcmp(end, "us") == 0 ? 1 : strcmp(end, "ms") == 0 ? 1e3
                                                                  : strcmp(end, "s") == 0  ? 1e6
                                                                                           : -1;
    if (mult < 0)
        return -1;
    *out = v * mult;
    return 0;
}

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

static const char *allocator_name(const tune_row_t *r)
{
    return r->engine == TUNE_TALLY ? "tally" : r->engine == TUNE_PT_EXPAND ? "PyTorch (model)" : "PyTorch/tally";
}

static bool fits(const tune_row_t *r)
{
    return r->ok && r->oom_event < 0;
}

/* A row a recommendation for PyTorch (pytorch) or for tally may take. */
static bool eligible(const tune_row_t *r, bool pytorch)
{
    return pytorch ? r->engine != TUNE_TALLY : r->engine != TUNE_PT_EXPAND;
}

/* The recommendation among the eligible rows that fit and keep within the
 * budget: the least peak reserved; ties go to fewer calls, then to the
 * earlier row (PyTorch's default first). -1 when no row qualifies. */
static long recommend(const tune_row_t *rows, size_t n, int64_t budget, double max_us, int gpu, bool pytorch)
{
    long best = -1;
    for (size_t i = 0; i < n; i++) {
        const tune_row_t *r = &rows[i];
        if (!eligible(r, pytorch) || !fits(r) || r->backend_calls > budget ||
            (max_us >= 0 && tune_driver_us(r, gpu) > max_us))
            continue;
        if (best < 0 || r->peak_reserved < rows[best].peak_reserved ||
            (r->peak_reserved == rows[best].peak_reserved && r->backend_calls < rows[best].backend_calls))
            best = (long)i;
    }
    return best;
}

/* ---- torch versions and the variable's name ------------------------------------ */

/* What each torch version reads (../shared/pytorch.md): PYTORCH_CUDA_ALLOC_CONF
 * in every version (from 2.10 with a deprecation warning, PR 167659);
 * PYTORCH_ALLOC_CONF from 2.9, but 2.9.x ignore expandable_segments under it
 * (pytorch#183387, seen on 2.9.1). vLLM reads only the old name. */
typedef struct torch_version {
    int major, minor;
    char text[64]; /* "" when unknown */
    const char *from; /* "--torch-version", "the installed torch" */
} torch_version_t;

static int parse_version(const char *s, torch_version_t *v)
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
static void installed_torch(torch_version_t *v)
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
    if (line[0] && parse_version(line, v) == 0)
        v->from = "the installed torch";
}

static bool version_before(const torch_version_t *v, int major, int minor)
{
    return v->major < major || (v->major == major && v->minor < minor);
}

/* Print both names, and which one this version should use. */
static void print_pytorch_lines(const tune_row_t *r, const torch_version_t *v)
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

typedef struct outcome {
    const tune_input_t *in;
    const tune_row_t *rows;
    size_t n;
    long rec_pt, rec_tally;
    uint64_t live, capacity;
    int64_t budget;
    const tune_row_t *replayed; /* the recorded setting from the recorded state, or NULL */
    const torch_version_t *torch;
    double max_driver_us;       /* --max-driver-time, < 0: none */
    int gpu;                    /* the cost table's column */
} outcome_t;

static void print_json(const outcome_t *o)
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
        json_str(allocator_name(r));
        printf(",\"peak_reserved_bytes\":%" PRId64 ",\"peak_live_bytes\":%" PRIu64 ",\"backend_calls\":%" PRId64
               ",\"device_allocs\":%" PRId64 ",\"fits\":%s,\"capacity_bytes\":%" PRIu64
               ",\"recommended\":%s,\"recommended_tally\":%s",
               r->peak_reserved, o->live, r->backend_calls, r->num_device_alloc, fits(r) ? "true" : "false",
               o->capacity, (long)i == o->rec_pt ? "true" : "false", (long)i == o->rec_tally ? "true" : "false");
        if (r->ok)
            printf(",\"driver_us_a100\":%.1f,\"driver_us_blackwell\":%.1f", tune_driver_us(r, SI_COST_A100),
                   tune_driver_us(r, SI_COST_BLACKWELL));
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

static const char *size_text(int64_t b, char *buf, size_t len)
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

static void print_recommendation(const outcome_t *o, bool pytorch)
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
    if (k == 0 || r->peak_reserved >= def->peak_reserved)
        printf("keep the default (no setting within the budget reserves less): %s", mib(r->peak_reserved, a, sizeof a));
    else
        printf("%s reserves %s, %s (%.1f%%) less than the default", name, mib(r->peak_reserved, a, sizeof a),
               mib(def->peak_reserved - r->peak_reserved, b, sizeof b),
               def->peak_reserved ? 100.0 * (double)(def->peak_reserved - r->peak_reserved) / (double)def->peak_reserved
                                  : 0.0);
    printf(", %" PRId64 " backend calls (default %" PRId64 "), %.1f ms of driver time on %s", r->backend_calls,
           def->backend_calls, tune_driver_us(r, o->gpu) / 1000.0, si_cost_column_name(o->gpu));
    if (r->min_bytes > 0)
        printf("; runs in %s", size_text(r->min_bytes, c, sizeof c));
    printf("\n");
    if (pytorch) {
        print_pytorch_lines(r, o->torch);
        if (r->engine == TUNE_PT_EXPAND)
            printf("  (PyTorch's own expandable segments, from the model of tools/pt_expand.c)\n");
    } else {
        printf("  TALLY_CONF=%s\n  (run the job under tally: python -m tally run)\n", r->setting);
    }
}

static void print_table(const char *file, const outcome_t *o)
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
    printf("%-*s %-15s %14s %9s %9s %*s %12s %4s  %s\n", w, "setting", "allocator", "peak reserved", "res/live", "calls",
           (int)strlen(dh), dh, "needs", "fits", "runs out with less (event: size, live then)");
    for (size_t i = 0; i < o->n; i++) {
        const tune_row_t *r = &rows[i];
        const char *name = r->setting[0] ? r->setting : "(default)";
        if (!r->ok) {
            printf("%-*s %-15s  error: %s\n", w, name, allocator_name(r), r->error);
            continue;
        }
        char need[40], out[96] = "-";
        if (r->min_bytes > 0)
            size_text(r->min_bytes, need, sizeof need);
        else if (r->min_lower < 0)
            snprintf(need, sizeof need, "(fraction)");
        else
            snprintf(need, sizeof need, ">%s", size_text(r->min_lower, c, sizeof c));
        if (r->out_event >= 0 && (size_t)r->out_event < t->nev)
            snprintf(out, sizeof out, "in %s at %ld: %s, %s", size_text(r->out_capacity, c, sizeof c), r->out_event,
                     size_text((int64_t)t->ev[r->out_event].size, d, sizeof d),
                     size_text((int64_t)live_before(t, (size_t)r->out_event), a, sizeof a));
        printf("%-*s %-15s %14s %9.3f %9" PRId64 " %*.1f %12s %4s  %s%s%s\n", w, name, allocator_name(r),
               mib(r->peak_reserved, b, sizeof b), o->live ? (double)r->peak_reserved / (double)o->live : 0.0,
               r->backend_calls, (int)strlen(dh), tune_driver_us(r, o->gpu) / 1000.0, need, fits(r) ? "yes" : "no", out,
               (long)i == o->rec_pt ? "  <- PyTorch" : "", (long)i == o->rec_tally ? "  <- tally" : "");
    }
    printf("\nneeds: the least device memory the setting runs in (replays bisected to 0.1%%; (fraction): a memory "
           "fraction caps at a share of the device, so it has no least); runs out: where a replay with less "
           "memory than that refused an allocation; driver ms: the modelled time of the row's driver calls "
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

/* The least memory any row needs, for the message when none fits. */
static const tune_row_t *least_needing(const tune_row_t *rows, size_t n)
{
    const tune_row_t *best = NULL;
    for (size_t i = 0; i < n; i++) {
        const tune_row_t *r = &rows[i];
        if (!r->ok)
            continue;
        int64_t need = r->min_bytes > 0 ? r->min_bytes : INT64_MAX;
        int64_t bneed = best && best->min_bytes > 0 ? best->min_bytes : INT64_MAX;
        if (!best || need < bneed || (need == bneed && need == INT64_MAX && r->min_lower < best->min_lower))
            best = r;
    }
    return best;
}

int tune_main(int argc, char **argv)
{
    const char *file = NULL, *plot = NULL;
    uint64_t capacity = 0;
    long long budget = -1;
    long jobs = sysconf(_SC_NPROCESSORS_ONLN), device = -1;
    bool json = false, quiet = false;
    torch_version_t torch = {0};
    double max_driver_us = -1;
    int gpu = SI_COST_A100;
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
                   strcmp(a, "--plot") == 0 || strcmp(a, "--device") == 0 || strcmp(a, "--torch-version") == 0 ||
                   strcmp(a, "--max-driver-time") == 0 || strcmp(a, "--gpu") == 0) {
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
            } else if (strcmp(a, "--max-driver-time") == 0) {
                if (parse_duration_us(v, &max_driver_us))
                    return tune_err(2, "--max-driver-time '%s' is not a duration (e.g. 250ms, 1.5s, 800us)", v);
            } else if (strcmp(a, "--gpu") == 0) {
                gpu = -1;
                for (int k = 0; k < SI_COST_COLUMNS; k++)
                    if (strcasecmp(v, si_cost_column_name(k)) == 0)
                        gpu = k;
                if (gpu < 0)
                    return tune_err(2, "--gpu '%s' is not a column of the driver cost table (A100, Blackwell)", v);
            } else if (strcmp(a, "--torch-version") == 0) {
                if (parse_version(v, &torch))
                    return tune_err(2, "--torch-version '%s' is not a torch version (e.g. 2.9.1, 2.11)", v);
                torch.from = "--torch-version";
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
    if (!torch.text[0])
        installed_torch(&torch);
    if (!capacity)
        capacity = in.capacity > 0 ? (uint64_t)in.capacity : 80 * GIB;
    tune_row_t rows[TUNE_MAX_ROWS];
    size_t n = tune_grid(&in.trace, capacity, rows, TUNE_MAX_ROWS);
    /* The setting the snapshot's job ran with, so its replay can be set beside PyTorch's figure: under
     * PyTorch's rules (the model for expandable segments). */
    bool recorded_expandable = in.has_recorded && (in.start.expandable || strstr(in.recorded_conf, "expandable_segments:True"));
    int recorded_engine = recorded_expandable ? TUNE_PT_EXPAND : TUNE_BOTH;
    bool have = !in.has_recorded;
    for (size_t i = 0; i < n && !have; i++)
        have = strcmp(rows[i].setting, in.recorded_conf) == 0 && rows[i].engine == recorded_engine;
    if (!have && n < TUNE_MAX_ROWS && strlen(in.recorded_conf) < sizeof rows[n].setting) {
        memset(&rows[n], 0, sizeof rows[n]);
        snprintf(rows[n].setting, sizeof rows[n].setting, "%s", in.recorded_conf);
        rows[n].why = "the setting the job ran with";
        rows[n].engine = recorded_engine;
        rows[n].oom_event = -1;
        rows[n].out_event = -1;
        n++;
    }
    uint64_t live = 0, cur = 0;
    for (size_t i = 0; i < in.trace.nev; i++) {
        cur = in.trace.ev[i].op == 'a' ? cur + in.trace.ev[i].size : in.trace.ev[i].op == 'f' ? cur - in.trace.ev[i].size : cur;
        live = cur > live ? cur : live;
    }
    size_t want[1] = {0};
    tune_series_t series[2] = {{0}};
    if (tune_run_ex(&in.trace, &in.start, capacity, true, rows, n, (int)jobs, quiet, plot ? want : NULL,
                    plot ? 1 : 0, series, err, sizeof err)) {
        tune_input_free(&in);
        return tune_err(1, "%s", err);
    }
    if (!rows[0].ok) {
        tune_err(1, "%s: the replay of PyTorch's default failed: %s", file, rows[0].error);
        tune_input_free(&in);
        return 1;
    }
    /* The recorded setting once more, from the state recording began in. */
    tune_row_t replayed;
    bool have_replayed = in.has_recorded && in.start.known && strlen(in.recorded_conf) < sizeof replayed.setting;
    if (have_replayed) {
        memset(&replayed, 0, sizeof replayed);
        snprintf(replayed.setting, sizeof replayed.setting, "%s", in.recorded_conf);
        replayed.engine = recorded_engine;
        replayed.from_start = true;
        replayed.oom_event = replayed.out_event = -1;
        replayed.why = "the recorded setting from the recorded state";
        if (tune_run_ex(&in.trace, &in.start, capacity, false, &replayed, 1, 1, true, NULL, 0, NULL, err, sizeof err)) {
            tune_input_free(&in);
            return tune_err(1, "%s", err);
        }
    }
    if (budget < 0)
        budget = rows[0].backend_calls * 4 > 64 ? rows[0].backend_calls * 4 : 64;
    outcome_t o = {.in = &in, .rows = rows, .n = n, .rec_pt = -1, .rec_tally = -1, .live = live,
                   .capacity = capacity, .budget = budget, .replayed = have_replayed ? &replayed : NULL,
                   .torch = &torch};
    o.max_driver_us = max_driver_us;
    o.gpu = gpu;
    o.rec_pt = recommend(rows, n, budget, max_driver_us, gpu, true);
    o.rec_tally = recommend(rows, n, budget, max_driver_us, gpu, false);
    if (json)
        print_json(&o);
    else
        print_table(file, &o);
    int rc = 0;
    bool any_fits = false;
    for (size_t i = 0; i < n; i++)
        any_fits = any_fits || fits(&rows[i]);
    char a[32], b[32];
    if (!any_fits) {
        const tune_row_t *least = least_needing(rows, n);
        if (least && least->min_bytes > 0)
            rc = tune_err(1, "no setting fits %s: the least needs %s (%s, %s)", size_text((int64_t)capacity, a, sizeof a),
                          size_text(least->min_bytes, b, sizeof b), least->setting[0] ? least->setting : "the default",
                          allocator_name(least));
        else
            rc = tune_err(1, "no setting fits %s: the least needs at least %s (%s; the peak of live bytes, or the most "
                          "memory tried)",
                          size_text((int64_t)capacity, a, sizeof a), size_text(least ? least->min_lower : 0, b, sizeof b),
                          least && least->setting[0] ? least->setting : "the default");
    } else if (o.rec_pt < 0 && o.rec_tally < 0 && max_driver_us >= 0 && recommend(rows, n, budget, -1, gpu, true) +
                                                                       recommend(rows, n, budget, -1, gpu, false) > -2) {
        /* Within the calls but not within the driver time. */
        const tune_row_t *least = NULL;
        for (size_t i = 0; i < n; i++)
            if (fits(&rows[i]) && (!least || tune_driver_us(&rows[i], gpu) < tune_driver_us(least, gpu)))
                least = &rows[i];
        rc = tune_err(1, "no setting keeps within %.1f ms of driver time (%s): the least any setting needs is %.1f ms (%s, %s)",
                      max_driver_us / 1000.0, si_cost_column_name(gpu), tune_driver_us(least, gpu) / 1000.0,
                      least->setting[0] ? least->setting : "the default", allocator_name(least));
    } else if (o.rec_pt < 0 && o.rec_tally < 0) {
        const tune_row_t *least = NULL;
        for (size_t i = 0; i < n; i++)
            if (fits(&rows[i]) && (!least || rows[i].backend_calls < least->backend_calls))
                least = &rows[i];
        rc = tune_err(1, "no setting keeps within %lld backend calls: the least any setting needs is %" PRId64
                      " (%s, %s)", budget, least->backend_calls, least->setting[0] ? least->setting : "the default",
                      allocator_name(least));
    }
    if (plot && rc == 0) {
        /* The recommendation's series: one more replay of that row alone. */
        tune_row_t best = rows[o.rec_pt >= 0 ? o.rec_pt : o.rec_tally];
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
