/* `tally tune FILE`: replay a job's allocations under a grid of settings
 * and recommend the one that reserves least within a call budget (tune.h,
 * docs/tune.md). Prints a table, or with --json one JSON array of rows;
 * --plot draws reserved memory over the trace for the recommendation and
 * PyTorch's default (what it writes: tune_output.c). */
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

bool tune_fits(const tune_row_t *r)
{
    return r->ok && r->oom_event < 0;
}

double tune_kept_ratio(const tune_row_t *r)
{
    return r->kept_live > 0 ? (double)r->kept / (double)r->kept_live : 0.0;
}

/* A row a recommendation for PyTorch (pytorch) or for tally may take. */
static bool eligible(const tune_row_t *r, bool pytorch)
{
    return pytorch ? r->engine != TUNE_TALLY : r->engine != TUNE_PT_EXPAND;
}

/* Within this factor of the least a tied row keeps after empty_cache, a
 * row counts as keeping as little (then calls decide): a difference under
 * 1% of what stays is not worth doubling the driver calls for. */
#define KEPT_SLACK 1.01

static bool qualifies(const tune_row_t *r, int64_t budget, double max_us, int gpu, bool pytorch)
{
    return eligible(r, pytorch) && tune_fits(r) && r->backend_calls <= budget &&
           (max_us < 0 || tune_driver_us(r, gpu) <= max_us);
}

/* The recommendation among the eligible rows that fit and keep within the
 * budget: the least peak reserved; among the rows at that peak, those that
 * keep within KEPT_SLACK of the least after an empty_cache (every one when
 * none was measured); of them the fewest calls, then the earlier row
 * (PyTorch's default first). -1 when no row qualifies. */
static long recommend(const tune_row_t *rows, size_t n, int64_t budget, double max_us, int gpu, bool pytorch)
{
    long best = -1;
    double least_kept = 0;
    for (size_t i = 0; i < n; i++)
        if (qualifies(&rows[i], budget, max_us, gpu, pytorch) &&
            (best < 0 || rows[i].peak_reserved < rows[best].peak_reserved))
            best = (long)i;
    if (best < 0)
        return -1;
    int64_t peak = rows[best].peak_reserved;
    for (size_t i = 0; i < n; i++)
        if (qualifies(&rows[i], budget, max_us, gpu, pytorch) && rows[i].peak_reserved == peak &&
            rows[i].kept_live > 0 && (least_kept == 0 || tune_kept_ratio(&rows[i]) < least_kept))
            least_kept = tune_kept_ratio(&rows[i]);
    best = -1;
    for (size_t i = 0; i < n; i++) {
        const tune_row_t *r = &rows[i];
        if (!qualifies(r, budget, max_us, gpu, pytorch) || r->peak_reserved != peak ||
            (least_kept > 0 && (r->kept_live <= 0 || tune_kept_ratio(r) > least_kept * KEPT_SLACK)))
            continue;
        if (best < 0 || r->backend_calls < rows[best].backend_calls)
            best = (long)i;
    }
    return best;
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
    tune_torch_version_t torch = {0};
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
                if (tune_parse_version(v, &torch))
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
        tune_installed_torch(&torch);
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
        memcpy(rows[n].setting, in.recorded_conf, strlen(in.recorded_conf) + 1); /* fits: checked above */
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
        memcpy(replayed.setting, in.recorded_conf, strlen(in.recorded_conf) + 1); /* fits: have_replayed checked it */
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
    tune_outcome_t o = {.in = &in, .rows = rows, .n = n, .rec_pt = -1, .rec_tally = -1, .live = live,
                   .capacity = capacity, .budget = budget, .replayed = have_replayed ? &replayed : NULL,
                   .torch = &torch};
    o.max_driver_us = max_driver_us;
    o.gpu = gpu;
    o.rec_pt = recommend(rows, n, budget, max_driver_us, gpu, true);
    o.rec_tally = recommend(rows, n, budget, max_driver_us, gpu, false);
    if (json)
        tune_print_json(&o);
    else
        tune_print_table(file, &o);
    int rc = 0;
    bool any_fits = false;
    for (size_t i = 0; i < n; i++)
        any_fits = any_fits || tune_fits(&rows[i]);
    char a[32], b[32];
    if (!any_fits) {
        const tune_row_t *least = least_needing(rows, n);
        if (least && least->min_bytes > 0)
            rc = tune_err(1, "no setting fits %s: the least needs %s (%s, %s)", tune_size_text((int64_t)capacity, a, sizeof a),
                          tune_size_text(least->min_bytes, b, sizeof b), least->setting[0] ? least->setting : "the default",
                          tune_allocator_name(least));
        else
            rc = tune_err(1, "no setting fits %s: the least needs at least %s (%s; the peak of live bytes, or the most "
                          "memory tried)",
                          tune_size_text((int64_t)capacity, a, sizeof a), tune_size_text(least ? least->min_lower : 0, b, sizeof b),
                          least && least->setting[0] ? least->setting : "the default");
    } else if (o.rec_pt < 0 && o.rec_tally < 0 && max_driver_us >= 0 && recommend(rows, n, budget, -1, gpu, true) +
                                                                       recommend(rows, n, budget, -1, gpu, false) > -2) {
        /* Within the calls but not within the driver time. */
        const tune_row_t *least = NULL;
        for (size_t i = 0; i < n; i++)
            if (tune_fits(&rows[i]) && (!least || tune_driver_us(&rows[i], gpu) < tune_driver_us(least, gpu)))
                least = &rows[i];
        rc = tune_err(1, "no setting keeps within %.1f ms of driver time (%s): the least any setting needs is %.1f ms (%s, %s)",
                      max_driver_us / 1000.0, si_cost_column_name(gpu), tune_driver_us(least, gpu) / 1000.0,
                      least->setting[0] ? least->setting : "the default", tune_allocator_name(least));
    } else if (o.rec_pt < 0 && o.rec_tally < 0) {
        const tune_row_t *least = NULL;
        for (size_t i = 0; i < n; i++)
            if (tune_fits(&rows[i]) && (!least || rows[i].backend_calls < least->backend_calls))
                least = &rows[i];
        rc = tune_err(1, "no setting keeps within %lld backend calls: the least any setting needs is %" PRId64
                      " (%s, %s)", budget, least->backend_calls, least->setting[0] ? least->setting : "the default",
                      tune_allocator_name(least));
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
