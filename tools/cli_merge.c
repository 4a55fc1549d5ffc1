/* tally merge: the per-rank reports of one job as one picture. A table of
 * rank x device (current allocated bytes, the picture nvidia-smi gives, but
 * attributed), the same for reserved bytes, one line per piece of memory a
 * rank holds on a device other than its home device, and totals by stage and
 * by tag across ranks. --json writes the same as one object (docs/reports.md
 * gives its schema). */
#include "cli_merge.h"
#include "cli_report.h"

static const char merge_help[] =
    "usage: tally merge [--json] FILE.json...\n"
    "\n"
    "Merge the JSON reports of a job's ranks (report_path with %r or %p in it):\n"
    "  - current allocated and reserved bytes by rank x device (* marks memory on\n"
    "    a device that is not the rank's home device);\n"
    "  - one line per foreign holding: \"rank 2 holds 1.0 GiB on device 0: stage\n"
    "    load, tag checkpoint (its home device is 2)\", and what ranks held on a\n"
    "    foreign device earlier but have freed;\n"
    "  - totals by stage and by tag across ranks.\n"
    "Each rank may appear once. A rank's home device is LOCAL_RANK under\n"
    "torchrun, or home_device in TALLY_CONF; without one nothing is foreign.\n"
    "\n"
    "  --json       write the merge as JSON (schema: docs/reports.md)\n"
    "  -h, --help   this text\n";

typedef struct merge_total {
    const char *name;
    int64_t current, peak, blocks;
    uint64_t ranks_mask; /* ranks below 64 that hold some; for counting */
    int nranks;
} merge_total_t;

typedef struct merge {
    report_t *reps; /* sorted by rank */
    size_t n;
    int *devices; /* union of devices, ascending */
    size_t ndevices;
    merge_total_t *stages, *tags;
    size_t nstages, ntags;
} merge_t;

static int by_rank(const void *x, const void *y)
{
    const report_t *a = x, *b = y;
    return a->rank < b->rank ? -1 : a->rank > b->rank;
}

static void add_device(merge_t *m, size_t *cap, int d)
{
    for (size_t i = 0; i < m->ndevices; i++)
        if (m->devices[i] == d)
            return;
    cli_grow((void **)&m->devices, cap, m->ndevices + 1, sizeof *m->devices);
    size_t i = m->ndevices++;
    while (i > 0 && m->devices[i - 1] > d) {
        m->devices[i] = m->devices[i - 1];
        i--;
    }
    m->devices[i] = d;
}

static void add_total(merge_total_t **arr, size_t *n, size_t *cap, const char *name, const rep_row_t *row,
                      int64_t rank)
{
    merge_total_t *t = NULL;
    for (size_t i = 0; i < *n; i++)
        if (strcmp((*arr)[i].name, name) == 0)
            t = &(*arr)[i];
    if (!t) {
        cli_grow((void **)arr, cap, *n + 1, sizeof **arr);
        t = &(*arr)[(*n)++];
        t->name = name;
    }
    t->current = cli_add(t->current, row->current);
    t->peak = cli_add(t->peak, row->peak);
    t->blocks = cli_add(t->blocks, row->live_blocks);
    if (row->peak > 0 && rank >= 0 && rank < 64 && !(t->ranks_mask & ((uint64_t)1 << rank))) {
        t->ranks_mask |= (uint64_t)1 << rank;
        t->nranks++;
    } else if (row->peak > 0 && (rank < 0 || rank >= 64)) {
        t->nranks++; /* approximate beyond 64 ranks: counts rows */
    }
}

static int total_order(const void *x, const void *y)
{
    const merge_total_t *a = x, *b = y;
    if (a->current != b->current)
        return a->current < b->current ? 1 : -1;
    if (a->peak != b->peak)
        return a->peak < b->peak ? 1 : -1;
    return strcmp(a->name, b->name);
}

/* Current allocated / reserved bytes of report r on device d (0 if absent),
 * and the bytes its foreign ledger rows hold there. */
static int64_t dev_allocated(const report_t *r, int d)
{
    const rep_device_t *x = cli_report_device(r, d);
    return x ? x->stats.allocated_bytes[TALLY_POOL_ALL].current : 0;
}

static int64_t dev_reserved(const report_t *r, int d)
{
    const rep_device_t *x = cli_report_device(r, d);
    return x ? x->stats.reserved_bytes[TALLY_POOL_ALL].current : 0;
}

static int64_t dev_foreign(const report_t *r, int d)
{
    int64_t sum = 0;
    for (size_t i = 0; i < r->nrows; i++)
        if (r->rows[i].device == d && r->rows[i].foreign)
            sum = cli_add(sum, r->rows[i].current);
    return sum;
}

/* Foreign rows of every rank: holding now first (largest first), then those
 * freed since; within each, by rank. */
typedef struct finding {
    const report_t *r;
    const rep_row_t *row;
} finding_t;

static int finding_order(const void *x, const void *y)
{
    const finding_t *a = x, *b = y;
    bool ha = a->row->current > 0, hb = b->row->current > 0;
    if (ha != hb)
        return ha ? -1 : 1;
    if (a->r->rank != b->r->rank)
        return a->r->rank < b->r->rank ? -1 : 1;
    int64_t va = ha ? a->row->current : a->row->peak, vb = hb ? b->row->current : b->row->peak;
    if (va != vb)
        return va < vb ? 1 : -1;
    return a->row->device - b->row->device;
}

static finding_t *collect_findings(const merge_t *m, size_t *count)
{
    size_t n = 0, cap = 0;
    finding_t *f = NULL;
    for (size_t i = 0; i < m->n; i++)
        for (size_t k = 0; k < m->reps[i].nrows; k++) {
            const rep_row_t *row = &m->reps[i].rows[k];
            if (!row->foreign || row->peak <= 0)
                continue;
            cli_grow((void **)&f, &cap, n + 1, sizeof *f);
            f[n++] = (finding_t){&m->reps[i], row};
        }
    if (n)
        qsort(f, n, sizeof *f, finding_order);
    *count = n;
    return f;
}

static void finding_text(const finding_t *f, char *buf, size_t len)
{
    char b[32];
    const rep_row_t *row = f->row;
    if (row->current > 0)
        snprintf(buf, len, "rank %" PRId64 " holds %s on device %d: stage %s, tag %s (its home device is %" PRId64 ")",
                 f->r->rank, cli_bytes(row->current, b, sizeof b), row->device, row->stage, row->tag,
                 f->r->home_device);
    else
        snprintf(buf, len,
                 "rank %" PRId64 " held up to %s on device %d, freed since: stage %s, tag %s (its home device is %" PRId64
                 ")",
                 f->r->rank, cli_bytes(row->peak, b, sizeof b), row->device, row->stage, row->tag, f->r->home_device);
}

/* Ranks in [0, world_size) with no report, when every report agrees on the
 * world size; returns how many (their numbers in out, up to max). */
static size_t missing_ranks(const merge_t *m, int64_t *out, size_t max, int64_t *world)
{
    *world = m->reps[0].world_size;
    for (size_t i = 1; i < m->n; i++)
        if (m->reps[i].world_size != *world) {
            *world = -1;
            return 0;
        }
    size_t k = 0, j = 0;
    for (int64_t r = 0; r < *world; r++) {
        while (j < m->n && m->reps[j].rank < r)
            j++;
        if (j < m->n && m->reps[j].rank == r)
            continue;
        if (k < max)
            out[k] = r;
        k++;
    }
    return k;
}

/* ---- text -------------------------------------------------------------------- */

/* Print line (built in buf) without trailing blanks. */
static void put_line(char *buf)
{
    size_t n = strlen(buf);
    while (n && buf[n - 1] == ' ')
        buf[--n] = 0;
    puts(buf);
}

static void print_matrix(const merge_t *m, const char *title, int64_t (*value)(const report_t *, int), bool mark)
{
    char cell[48], b[32];
    size_t cap = 64 + m->ndevices * 48, n;
    char *line = cli_alloc(cap);
    int w = 10;
    for (size_t i = 0; i < m->n; i++)
        for (size_t d = 0; d < m->ndevices; d++)
            w = cli_width_of(w, cli_bytes(value(&m->reps[i], m->devices[d]), b, sizeof b));
    puts(title);
    n = (size_t)snprintf(line, cap, "%-6s %-5s %-9s", "rank", "home", "pid");
    for (size_t d = 0; d < m->ndevices; d++) {
        snprintf(cell, sizeof cell, "device %d", m->devices[d]);
        n += (size_t)snprintf(line + n, cap - n, " %*s%s", w, cell, mark ? " " : "");
    }
    put_line(line);
    for (size_t i = 0; i < m->n; i++) {
        const report_t *r = &m->reps[i];
        char home[24] = "-";
        if (r->home_device >= 0)
            snprintf(home, sizeof home, "%" PRId64, r->home_device);
        n = (size_t)snprintf(line, cap, "%-6" PRId64 " %-5s %-9" PRId64, r->rank, home, r->pid);
        for (size_t d = 0; d < m->ndevices; d++) {
            cli_bytes(value(r, m->devices[d]), b, sizeof b);
            bool foreign = mark && dev_foreign(r, m->devices[d]) > 0;
            n += (size_t)snprintf(line + n, cap - n, " %*s%s", w, b, mark ? (foreign ? "*" : " ") : "");
        }
        put_line(line);
    }
    n = (size_t)snprintf(line, cap, "%-6s %-5s %-9s", "total", "", "");
    for (size_t d = 0; d < m->ndevices; d++) {
        int64_t sum = 0;
        for (size_t i = 0; i < m->n; i++)
            sum = cli_add(sum, value(&m->reps[i], m->devices[d]));
        n += (size_t)snprintf(line + n, cap - n, " %*s%s", w, cli_bytes(sum, b, sizeof b), mark ? " " : "");
    }
    put_line(line);
    free(line);
}

static void print_totals(const char *title, const merge_total_t *t, size_t n)
{
    char c[32], p[32];
    int nw = 20;
    for (size_t i = 0; i < n; i++)
        nw = cli_width_of(nw, t[i].name);
    printf("\n%-*s %12s %12s %12s %6s\n", nw, title, "current", "peak (sum)", "live blocks", "ranks");
    for (size_t i = 0; i < n; i++)
        printf("%-*s %12s %12s %12" PRId64 " %6d\n", nw, t[i].name, cli_bytes(t[i].current, c, sizeof c),
               cli_bytes(t[i].peak, p, sizeof p), t[i].blocks, t[i].nranks);
    if (!n)
        printf("(none: the ledger was off or nothing was allocated)\n");
}

static void merge_text(const merge_t *m)
{
    char line[512];
    int64_t world, missing[16];
    size_t nmiss = missing_ranks(m, missing, 16, &world);
    printf("tally merge: %zu report%s, ranks", m->n, m->n == 1 ? "" : "s");
    for (size_t i = 0; i < m->n; i++)
        printf("%s%" PRId64, i ? ", " : " ", m->reps[i].rank);
    if (world >= 0)
        printf(" (world size %" PRId64 ")\n", world);
    else
        printf(" (the reports disagree on the world size)\n");
    if (nmiss) {
        printf("missing: rank%s", nmiss == 1 ? "" : "s");
        for (size_t i = 0; i < nmiss && i < 16; i++)
            printf("%s%" PRId64, i ? ", " : " ", missing[i]);
        printf("%s\n", nmiss > 16 ? ", ..." : "");
    }
    printf("\n");
    print_matrix(m, "allocated bytes now, by rank and device (* = held on a device other than the rank's home)",
                 dev_allocated, true);
    printf("\n");
    print_matrix(m, "reserved bytes now (what nvidia-smi counts, less each process's CUDA context)", dev_reserved,
                 false);

    size_t nf, holding = 0;
    finding_t *f = collect_findings(m, &nf);
    for (size_t i = 0; i < nf; i++)
        holding += f[i].row->current > 0;
    printf("\nforeign memory: %zu finding%s", holding, holding == 1 ? "" : "s");
    if (nf > holding)
        printf(", and %zu earlier holding%s since freed", nf - holding, nf - holding == 1 ? "" : "s");
    printf("\n");
    for (size_t i = 0; i < nf; i++) {
        finding_text(&f[i], line, sizeof line);
        printf("%s\n", line);
    }
    if (!nf)
        printf("(none: every rank kept to its home device, or no rank had one)\n");
    free(f);
    print_totals("by stage, all ranks", m->stages, m->nstages);
    print_totals("by tag, all ranks", m->tags, m->ntags);
}

/* ---- JSON -------------------------------------------------------------------- */

static void json_totals(const char *key, const char *name_key, const merge_total_t *t, size_t n)
{
    printf(",\n\"%s\":[", key);
    for (size_t i = 0; i < n; i++) {
        printf("%s\n {\"%s\":", i ? "," : "", name_key);
        cli_json_str(stdout, t[i].name);
        printf(",\"current_bytes\":%" PRId64 ",\"peak_bytes_sum\":%" PRId64 ",\"live_blocks\":%" PRId64
               ",\"ranks\":%d}",
               t[i].current, t[i].peak, t[i].blocks, t[i].nranks);
    }
    printf("]");
}

static void merge_json(const merge_t *m)
{
    char line[512];
    int64_t world, missing[4096];
    size_t nmiss = missing_ranks(m, missing, 4096, &world);
    printf("{\"format\":\"tally-merge\",\"version\":");
    cli_json_str(stdout, TALLY_VERSION);
    printf(",\"world_size\":%" PRId64 ",\"missing_ranks\":[", world);
    for (size_t i = 0; i < nmiss && i < 4096; i++)
        printf("%s%" PRId64, i ? "," : "", missing[i]);
    printf("],\n\"devices\":[");
    for (size_t d = 0; d < m->ndevices; d++) {
        int64_t a = 0, r = 0, f = 0;
        for (size_t i = 0; i < m->n; i++) {
            a = cli_add(a, dev_allocated(&m->reps[i], m->devices[d]));
            r = cli_add(r, dev_reserved(&m->reps[i], m->devices[d]));
            f = cli_add(f, dev_foreign(&m->reps[i], m->devices[d]));
        }
        printf("%s\n {\"device\":%d,\"allocated_bytes\":%" PRId64 ",\"reserved_bytes\":%" PRId64
               ",\"foreign_bytes\":%" PRId64 "}",
               d ? "," : "", m->devices[d], a, r, f);
    }
    printf("],\n\"ranks\":[");
    for (size_t i = 0; i < m->n; i++) {
        const report_t *r = &m->reps[i];
        printf("%s\n {\"rank\":%" PRId64 ",\"local_rank\":%" PRId64 ",\"world_size\":%" PRId64 ",\"pid\":%" PRId64
               ",\"home_device\":%" PRId64 ",\"backend\":",
               i ? "," : "", r->rank, r->local_rank, r->world_size, r->pid, r->home_device);
        cli_json_str(stdout, r->backend);
        printf(",\"file\":");
        cli_json_str(stdout, r->doc.path);
        printf(",\"devices\":[");
        for (size_t d = 0; d < m->ndevices; d++)
            printf("%s{\"device\":%d,\"allocated_bytes\":%" PRId64 ",\"reserved_bytes\":%" PRId64
                   ",\"foreign_bytes\":%" PRId64 "}",
                   d ? "," : "", m->devices[d], dev_allocated(r, m->devices[d]), dev_reserved(r, m->devices[d]),
                   dev_foreign(r, m->devices[d]));
        printf("]}");
    }
    printf("],\n\"foreign\":[");
    size_t nf;
    finding_t *f = collect_findings(m, &nf);
    for (size_t i = 0; i < nf; i++) {
        const rep_row_t *row = f[i].row;
        printf("%s\n {\"rank\":%" PRId64 ",\"home_device\":%" PRId64 ",\"device\":%d,\"stage\":", i ? "," : "",
               f[i].r->rank, f[i].r->home_device, row->device);
        cli_json_str(stdout, row->stage);
        printf(",\"tag\":");
        cli_json_str(stdout, row->tag);
        finding_text(&f[i], line, sizeof line);
        printf(",\"current_bytes\":%" PRId64 ",\"peak_bytes\":%" PRId64 ",\"live_blocks\":%" PRId64 ",\"message\":",
               row->current, row->peak, row->live_blocks);
        cli_json_str(stdout, line);
        printf("}");
    }
    free(f);
    printf("]");
    json_totals("stages", "stage", m->stages, m->nstages);
    json_totals("tags", "tag", m->tags, m->ntags);
    printf("}\n");
}

/* The world size the reports give (WORLD_SIZE when they ran, else 1) and
 * the ranks given disagree: a warning on stderr, the merge goes on (often a
 * launcher that set RANK but not WORLD_SIZE). */
static void world_size_warning(const merge_t *m)
{
    int64_t world = m->reps[0].world_size;
    for (size_t i = 1; i < m->n; i++)
        if (m->reps[i].world_size != world) {
            fprintf(stderr, "tally merge: warning: the reports disagree on the world size: %s says %" PRId64
                    ", %s says %" PRId64 "\n", m->reps[0].doc.path, world, m->reps[i].doc.path,
                    m->reps[i].world_size);
            return;
        }
    size_t outside = 0;
    for (size_t i = 0; i < m->n; i++)
        outside += m->reps[i].rank < 0 || m->reps[i].rank >= world;
    if (outside || (int64_t)m->n > world) {
        fprintf(stderr, "tally merge: warning: the reports say world size %" PRId64 ", but %zu rank%s given (", world,
                m->n, m->n == 1 ? " was" : "s were");
        for (size_t i = 0; i < m->n; i++)
            fprintf(stderr, "%s%" PRId64, i ? ", " : "", m->reps[i].rank);
        fprintf(stderr, "%s); was WORLD_SIZE set where they ran?\n",
                outside ? (outside == 1 ? ", one outside it" : ", some outside it") : "");
    }
}

int cli_merge_main(int argc, char **argv)
{
    bool json = false, options = true;
    const char **files = cli_alloc((size_t)argc * sizeof *files);
    size_t nfiles = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (options && a[0] == '-' && a[1]) {
            if (strcmp(a, "--") == 0)
                options = false;
            else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
                free(files);
                fputs(merge_help, stdout);
                return cli_finish(stdout, "the help");
            } else if (strcmp(a, "--json") == 0)
                json = true;
            else {
                free(files);
                return cli_usage("unknown option '%s'", a);
            }
        } else {
            files[nfiles++] = a;
        }
    }
    if (!nfiles) {
        free(files);
        return cli_usage("no FILE.json given (one per rank)");
    }
    merge_t m = {0};
    m.reps = cli_alloc(nfiles * sizeof *m.reps);
    int rc = 0;
    for (size_t i = 0; i < nfiles && !rc; i++) {
        rc = cli_report_load(&m.reps[i], files[i], false);
        if (!rc)
            m.n++;
    }
    if (!rc) {
        qsort(m.reps, m.n, sizeof *m.reps, by_rank);
        for (size_t i = 1; i < m.n && !rc; i++)
            if (m.reps[i].rank == m.reps[i - 1].rank)
                rc = cli_fail(EXIT_DATA,
                              "rank %" PRId64 " appears twice: %s and %s (give each rank's report once; "
                              "report_path:...%%r.json names one file per rank)",
                              m.reps[i].rank, m.reps[i - 1].doc.path, m.reps[i].doc.path);
    }
    if (!rc)
        world_size_warning(&m);
    if (!rc) {
        size_t dcap = 0, scap = 0, tcap = 0;
        for (size_t i = 0; i < m.n; i++) {
            const report_t *r = &m.reps[i];
            for (size_t d = 0; d < r->ndev; d++)
                add_device(&m, &dcap, r->devs[d].device);
            for (size_t k = 0; k < r->nrows; k++) {
                add_device(&m, &dcap, r->rows[k].device);
                add_total(&m.stages, &m.nstages, &scap, r->rows[k].stage, &r->rows[k], r->rank);
                add_total(&m.tags, &m.ntags, &tcap, r->rows[k].tag, &r->rows[k], r->rank);
            }
        }
        if (m.nstages)
            qsort(m.stages, m.nstages, sizeof *m.stages, total_order);
        if (m.ntags)
            qsort(m.tags, m.ntags, sizeof *m.tags, total_order);
        if (json)
            merge_json(&m);
        else
            merge_text(&m);
        rc = cli_finish(stdout, "the merge");
    }
    for (size_t i = 0; i < m.n; i++)
        cli_report_free(&m.reps[i]);
    free(m.reps);
    free(m.devices);
    free(m.stages);
    free(m.tags);
    free(files);
    return rc;
}
