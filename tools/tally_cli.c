/* tally: the command-line tool. Reads what tally-enabled processes wrote
 * (JSON reports, or PyTorch's memory_stats dumped as JSON) and prints or
 * draws it:
 *
 *   tally summary   the torch.cuda.memory_summary table
 *   tally ledger    the ledger by tag x stage x device, stages, live blocks
 *   tally merge     many ranks' reports as one rank x device picture
 *   tally plot      memory over time, stacked by tag, as SVG or HTML
 *   tally tune      replay a job's allocations under candidate settings (tune.c)
 *   tally version
 *
 * docs/reports.md describes every output. The tool never initialises the
 * allocator (TALLY_CONF is not read): it only uses the library's JSON
 * reader and report renderers. The pieces live in tools/cli_*.c, declared
 * in tools/cli_*.h. */
#include "cli_util.h"
#include "cli_report.h"
#include "cli_merge.h"
#include "cli_plot.h"
#include "tune.h"

/* ---- summary ----------------------------------------------------------------- */

static const char summary_help[] =
    "usage: tally summary [--device N] [--abbreviated] FILE.json\n"
    "\n"
    "Print the torch.cuda.memory_summary() table, byte for byte as PyTorch does.\n"
    "FILE is either a tally JSON report or a flat memory_stats object, as\n"
    "json.dump(torch.cuda.memory_stats(dev), f) writes it (nested dicts read too);\n"
    "- reads it from standard input.\n"
    "\n"
    "  -d, --device N      report: the device to show (default: the report's home\n"
    "                      device, else 0); memory_stats: the device ID printed\n"
    "  -a, --abbreviated   leave out the 'from large pool' / 'from small pool' rows\n"
    "  -h, --help          this text\n";

static void write_stdout(void *arg, const char *text, size_t len)
{
    fwrite(text, 1, len, (FILE *)arg);
}

static int cmd_summary(int argc, char **argv)
{
    int device = -1, abbreviated = 0;
    const char *file = NULL;
    bool options = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (options && a[0] == '-' && a[1]) {
            if (strcmp(a, "--") == 0) {
                options = false;
            } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
                fputs(summary_help, stdout);
                return cli_finish(stdout, "the help");
            } else if (cli_is_opt(a, "--device") || cli_is_opt(a, "-d")) {
                int rc = cli_parse_device(cli_opt_value(argc, argv, &i, a, "--device"), &device);
                if (rc)
                    return rc;
            } else if (strcmp(a, "--abbreviated") == 0 || strcmp(a, "-a") == 0) {
                abbreviated = 1;
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

    cli_doc_t doc;
    int rc = cli_doc_load(&doc, file);
    if (rc)
        return rc;
    tally_stats_t s;
    int kind = cli_doc_kind(doc.root);
    if (kind == DOC_OTHER) {
        cli_doc_free(&doc);
        return cli_fail(EXIT_DATA, "%s: not a tally report or memory_stats object", file);
    }
    if (kind == DOC_STATS) {
        rc = cli_stats_from_obj(&doc, doc.root, "memory_stats", &s, TALLY_STATS_DUMP);
        if (rc) {
            cli_fail(EXIT_DATA, "%s: not a valid memory_stats object: %s", file, doc.err);
            cli_doc_free(&doc);
            return EXIT_DATA;
        }
        cli_doc_free(&doc);
        if (device < 0)
            device = 0;
    } else {
        report_t r;
        rc = cli_report_parse(&r, &doc, false);
        if (rc)
            return rc;
        bool chosen = device >= 0;
        if (!chosen)
            device = r.home_device >= 0 ? (int)r.home_device : 0;
        const rep_device_t *d = cli_report_device(&r, device);
        if (!d) {
            char list[128];
            cli_report_device_list(&r, list, sizeof list);
            cli_fail(EXIT_DATA, "%s: no device %d in the report (%sit has device%s %s)", file, device,
                     chosen ? "" : "the home device, shown by default; pick another with --device; ",
                     r.ndev == 1 ? "" : "s", list);
            cli_report_free(&r);
            return EXIT_DATA;
        }
        s = d->stats;
        cli_report_free(&r);
    }
    tally__summary_render(&s, device, abbreviated, write_stdout, stdout);
    return cli_finish(stdout, "the summary");
}

/* ---- ledger ------------------------------------------------------------------ */

static const char ledger_help[] =
    "usage: tally ledger FILE.json\n"
    "\n"
    "Print what a tally report knows about ownership: the ledger by device x tag x\n"
    "stage (current and peak bytes, live blocks; rows on a device other than the\n"
    "process's home device are marked foreign), the stage timeline (per stage:\n"
    "seconds, peak allocated, peak reserved, survivors, released) with what\n"
    "outlived each stage, and the live blocks grouped as the leak report groups\n"
    "them.\n"
    "\n"
    "  -h, --help   this text\n";

static int row_order(const void *x, const void *y)
{
    const rep_row_t *a = x, *b = y;
    if (a->device != b->device)
        return a->device < b->device ? -1 : 1;
    if (a->current != b->current)
        return a->current < b->current ? 1 : -1;
    if (a->peak != b->peak)
        return a->peak < b->peak ? 1 : -1;
    int c = strcmp(a->tag, b->tag);
    return c ? c : strcmp(a->stage, b->stage);
}

static void print_ledger_rows(report_t *r)
{
    char c[32], p[32];
    int tw = 20, sw = 20;
    for (size_t i = 0; i < r->nrows; i++) {
        tw = cli_width_of(tw, r->rows[i].tag);
        sw = cli_width_of(sw, r->rows[i].stage);
    }
    qsort(r->rows, r->nrows, sizeof *r->rows, row_order);
    printf("%-6s %-*s %-*s %12s %12s %10s\n", "device", tw, "tag", sw, "stage", "current", "peak", "blocks");
    for (size_t i = 0; i < r->nrows; i++) {
        const rep_row_t *x = &r->rows[i];
        printf("%-6d %-*s %-*s %12s %12s %10" PRId64 "%s\n", x->device, tw, x->tag, sw, x->stage,
               cli_bytes(x->current, c, sizeof c), cli_bytes(x->peak, p, sizeof p), x->live_blocks,
               x->foreign ? "  foreign" : "");
    }
    if (!r->nrows)
        printf("(no rows: nothing was allocated, or the ledger was off)\n");
}

static void print_stage_rows(const report_t *r)
{
    char a[32], b[32], s[32], rel[32];
    int nw = 20;
    for (size_t i = 0; i < r->nstages; i++) {
        int w = (int)strlen(r->stages[i].name) + 2 * (int)(r->stages[i].depth > 1 ? r->stages[i].depth - 1 : 0);
        nw = w > nw ? w : nw;
    }
    printf("\nstages (%" PRId64 " ended, %zu in the report)\n", r->stages_total, r->nstages);
    printf("%-4s %-*s %10s %12s %12s %12s %12s\n", "#", nw, "stage", "seconds", "peak alloc", "peak resv",
           "survivors", "released");
    for (size_t i = 0; i < r->nstages; i++) {
        const rep_stage_t *st = &r->stages[i];
        int indent = 2 * (int)(st->depth > 1 ? st->depth - 1 : 0);
        printf("%-4" PRId64 " %*s%-*s %10.3f %12s %12s %12s %12s\n", st->seq, indent, "", nw - indent, st->name,
               (double)st->wall_us / 1e6, cli_bytes(st->peak_allocated, a, sizeof a),
               cli_bytes(st->peak_reserved, b, sizeof b), cli_bytes(st->survivor_bytes, s, sizeof s),
               cli_bytes(st->released, rel, sizeof rel));
        for (size_t k = 0; k < st->nsurv; k++) {
            const rep_survivor_t *v = &st->surv[k];
            printf("     outlived by tag %s on device %d: %s in %" PRId64 " block%s%s\n", v->tag, v->device,
                   cli_bytes(v->bytes, a, sizeof a), v->blocks, v->blocks == 1 ? "" : "s",
                   v->foreign ? " (foreign)" : "");
        }
    }
}

static void print_leaks(const report_t *r)
{
    char h[32];
    int64_t bytes = 0, blocks = 0;
    for (size_t i = 0; i < r->nleaks; i++) {
        bytes = cli_add(bytes, r->leaks[i].bytes);
        blocks = cli_add(blocks, r->leaks[i].blocks);
    }
    if (!r->nleaks) {
        printf("\nlive blocks: none when the report was written\n");
        return;
    }
    printf("\nlive blocks when the report was written (at exit: leaks): %" PRId64 " block%s, %s, in %zu group%s\n",
           blocks, blocks == 1 ? "" : "s", cli_bytes(bytes, h, sizeof h), r->nleaks, r->nleaks == 1 ? "" : "s");
    for (size_t i = 0; i < r->nleaks; i++) {
        const rep_leak_t *l = &r->leaks[i];
        printf("%" PRId64 " bytes (%s) in %" PRId64 " block%s: tag %s, stage %s, device %d%s\n", l->bytes,
               cli_bytes(l->bytes, h, sizeof h), l->blocks, l->blocks == 1 ? "" : "s", l->tag, l->stage, l->device,
               l->foreign ? " (foreign)" : "");
        if (l->site[0] && strcmp(l->site, "-") != 0)
            printf("    at %s\n", l->site);
    }
}

static int cmd_ledger(int argc, char **argv)
{
    const char *file = NULL;
    bool options = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (options && a[0] == '-' && a[1]) {
            if (strcmp(a, "--") == 0)
                options = false;
            else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
                fputs(ledger_help, stdout);
                return cli_finish(stdout, "the help");
            } else
                return cli_usage("unknown option '%s'", a);
        } else if (file) {
            return cli_usage("one FILE.json expected, got '%s' and '%s'", file, a);
        } else {
            file = a;
        }
    }
    if (!file)
        return cli_usage("FILE.json is missing");
    report_t r;
    int rc = cli_report_load(&r, file, false);
    if (rc)
        return rc;
    char home[32] = "none";
    if (r.home_device >= 0)
        snprintf(home, sizeof home, "%" PRId64, r.home_device);
    printf("tally ledger of %s\n", file);
    printf("rank %" PRId64 " of %" PRId64 ", pid %" PRId64 ", backend %s, home device %s, tally %s\n\n", r.rank,
           r.world_size, r.pid, r.backend[0] ? r.backend : "?", home, r.version[0] ? r.version : "?");
    print_ledger_rows(&r);
    print_stage_rows(&r);
    print_leaks(&r);
    cli_report_free(&r);
    return cli_finish(stdout, "the ledger");
}

/* ---- main ---------------------------------------------------------------------- */

static const char main_help[] =
    "usage: tally COMMAND [OPTIONS] FILE...\n"
    "\n"
    "Read what tally-enabled processes wrote (JSON reports from report_path, or\n"
    "PyTorch memory_stats dumped as JSON) and show it.\n"
    "\n"
    "commands:\n"
    "  summary [--device N] [--abbreviated] FILE.json\n"
    "                      the torch.cuda.memory_summary table\n"
    "  ledger FILE.json    ownership by tag x stage x device, stages, live blocks\n"
    "  merge [--json] FILE.json...\n"
    "                      per-rank reports as one rank x device picture, with\n"
    "                      memory on a foreign device named\n"
    "  plot FILE.json -o OUT.svg|OUT.html\n"
    "                      memory over time, stacked by tag (needs timeline:true)\n"
    "  tune [--capacity SIZE] [--json] [--plot OUT.svg] FILE\n"
    "                      replay a trace CSV, PyTorch snapshot or report under\n"
    "                      candidate settings; recommend the least reserving\n"
    "  version             print the version\n"
    "\n"
    "'tally COMMAND --help' explains each. Exit status: 0 success, 1 unusable\n"
    "input (missing file, malformed JSON, wrong schema, absent device), 2 bad\n"
    "command line. docs/reports.md describes every report.\n";

int main(int argc, char **argv)
{
    static char name[64];
    if (argc < 2) {
        fputs(main_help, stderr);
        return EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "help") == 0) {
        fputs(main_help, stdout);
        return cli_finish(stdout, "the help");
    }
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0 || strcmp(cmd, "-V") == 0) {
        printf("tally %s\n", tally_version());
        return cli_finish(stdout, "the version");
    }
    static const struct {
        const char *name;
        int (*fn)(int, char **);
    } cmds[] = {{"summary", cmd_summary}, {"ledger", cmd_ledger}, {"merge", cli_merge_main},
                  {"plot", cli_plot_main}, {"tune", tune_main}};
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
        if (strcmp(cmd, cmds[i].name) == 0) {
            snprintf(name, sizeof name, "tally %s", cmd);
            cli_cmd = name;
            return cmds[i].fn(argc - 1, argv + 1);
        }
    }
    /* The nearest command, when it is near enough to be a typo. */
    const char *near = NULL;
    size_t best = 3;
    static const char *const names[] = {"summary", "ledger", "merge", "plot", "tune", "version"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        size_t d = tally__edit_distance(cmd, names[i]);
        if (d < best) {
            best = d;
            near = names[i];
        }
    }
    if (near)
        return cli_usage("unknown command '%s' (did you mean '%s'? commands: summary, ledger, merge, plot, tune, "
                         "version)", cmd, near);
    return cli_usage("unknown command '%s' (commands: summary, ledger, merge, plot, tune, version)", cmd);
}
