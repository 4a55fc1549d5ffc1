/* The tally command's model of a JSON report (docs/reports.md gives the
 * schema), read from its document: every field the commands use, read once
 * and checked, so a wrong file fails with one message naming the byte and
 * the field. cli_report.h declares the model. */
#include "cli_report.h"

/* The timeline's action names, in EV_* order. */
static const char *const ev_names[] = {"alloc", "free_requested", "segment_alloc", "segment_free",
                                       "oom", "stage_begin", "stage_end", "sleep", "wake"};

static const char *const stat_prefixes[] = {
    "allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes", "active_bytes",
    "inactive_split_bytes", "requested_bytes", "oversize_allocations", "oversize_segments",
    "num_alloc_retries", "num_ooms", "max_split_size", "num_sync_all_streams", "num_device_alloc",
    "num_device_free"};

static bool is_stat_key(const char *key)
{
    for (size_t i = 0; i < sizeof stat_prefixes / sizeof *stat_prefixes; i++) {
        size_t n = strlen(stat_prefixes[i]);
        if (strncmp(key, stat_prefixes[i], n) == 0 && (key[n] == 0 || key[n] == '.'))
            return true;
    }
    return false;
}

int cli_doc_kind(const tally_json_t *root)
{
    if (root->type != TALLY_JSON_OBJECT)
        return DOC_OTHER;
    const tally_json_t *fmt = tally__json_get(root, "format");
    if (fmt)
        return fmt->type == TALLY_JSON_STRING && strcmp(fmt->s, "tally-report") == 0 ? DOC_REPORT : DOC_OTHER;
    /* torch.cuda.memory_stats() is {} before CUDA is initialised. */
    if (root->len == 0)
        return DOC_STATS;
    for (size_t i = 0; i < root->len; i++)
        if (is_stat_key(root->members[i].key))
            return DOC_STATS;
    return DOC_OTHER;
}

/* A flat memory_stats object at obj (all of doc when obj is the root) into
 * *out; 0, or a schema error in doc. */
int cli_stats_from_obj(cli_doc_t *doc, const tally_json_t *obj, const char *where, tally_stats_t *out, int mode)
{
    /* Every value under a known key must be an integer; checked here so the
     * message carries the offset in the whole file. */
    for (size_t i = 0; i < obj->len; i++) {
        const tally_json_member_t *m = &obj->members[i];
        int64_t x;
        if (is_stat_key(m->key) && m->value.type != TALLY_JSON_OBJECT && tally__json_int(&m->value, &x) < 0) {
            cli_schema(doc, &m->value, where, "\"%s\" should be an integer, not %s", m->key,
                       m->value.type == TALLY_JSON_NUMBER ? "a fraction" : tally__json_type_name(m->value.type));
            return -1;
        }
    }
    char err[300];
    if (tally__stats_from_node(obj, out, mode, err, sizeof err) < 0) {
        /* "stats JSON: byte N: why" becomes the schema error "byte N: where: why". */
        tally_json_t at = *obj;
        const char *why = err;
        size_t n = 0;
        int used = 0;
        if (sscanf(err, "stats JSON: byte %zu: %n", &n, &used) == 1 && used > 0) {
            at.offset = n;
            why = err + used;
        } else if (strncmp(err, "stats JSON: ", 12) == 0) {
            why = err + 12;
        }
        cli_schema(doc, &at, where, "%s", why);
        return -1;
    }
    return 0;
}

static int action_of(const char *name)
{
    for (int i = 0; i < EV_OTHER; i++)
        if (strcmp(name, ev_names[i]) == 0)
            return i;
    return EV_OTHER;
}

static int device_of(cli_doc_t *doc, const tally_json_t *obj, const char *where)
{
    int64_t d = cli_int(doc, obj, where, "device");
    if (d < 0 || d > 1 << 20) {
        cli_schema(doc, tally__json_get(obj, "device"), where, "device %" PRId64 " is out of range", d);
        return 0;
    }
    return (int)d;
}

static void read_devices(report_t *r)
{
    cli_doc_t *doc = &r->doc;
    char w[64];
    const tally_json_t *arr = cli_array(doc, doc->root, "report", "devices", false);
    if (!arr)
        return;
    r->ndev = arr->len;
    r->devs = cli_alloc(arr->len * sizeof *r->devs);
    for (size_t i = 0; i < arr->len && !doc->err[0]; i++) {
        const tally_json_t *o = cli_obj_at(doc, arr, "devices", i, w, sizeof w);
        if (!o)
            return;
        rep_device_t *d = &r->devs[i];
        d->device = device_of(doc, o, w);
        d->largest_free_block = cli_int_opt(doc, o, w, "largest_free_block", true, 0);
        d->utilisation = cli_num(doc, o, w, "utilisation");
        d->timeline_dropped = cli_int_opt(doc, o, w, "timeline_dropped", true, 0);
        const tally_json_t *s = cli_need(doc, o, w, "stats");
        if (s && s->type != TALLY_JSON_OBJECT)
            cli_schema(doc, s, w, "\"stats\" should be an object, not %s", tally__json_type_name(s->type));
        else if (s) {
            char sw[80];
            snprintf(sw, sizeof sw, "%s.stats", w);
            cli_stats_from_obj(doc, s, sw, &d->stats, TALLY_STATS_STRICT);
        }
    }
}

static void read_rows(report_t *r)
{
    cli_doc_t *doc = &r->doc;
    char w[64];
    const tally_json_t *arr = cli_array(doc, doc->root, "report", "ledger", false);
    if (!arr)
        return;
    r->nrows = arr->len;
    r->rows = cli_alloc(arr->len * sizeof *r->rows);
    for (size_t i = 0; i < arr->len && !doc->err[0]; i++) {
        const tally_json_t *o = cli_obj_at(doc, arr, "ledger", i, w, sizeof w);
        if (!o)
            return;
        rep_row_t *x = &r->rows[i];
        x->tag = cli_str(doc, o, w, "tag", false);
        x->stage = cli_str(doc, o, w, "stage", false);
        x->device = device_of(doc, o, w);
        x->foreign = cli_bool(doc, o, w, "foreign");
        x->current = cli_int(doc, o, w, "current_bytes");
        x->peak = cli_int(doc, o, w, "peak_bytes");
        x->allocated = cli_int_opt(doc, o, w, "allocated_bytes", true, 0);
        x->freed = cli_int_opt(doc, o, w, "freed_bytes", true, 0);
        x->live_blocks = cli_int(doc, o, w, "live_blocks");
        x->peak_blocks = cli_int_opt(doc, o, w, "peak_blocks", true, 0);
        x->allocated_blocks = cli_int_opt(doc, o, w, "allocated_blocks", true, 0);
        /* The row's counts add up (a hand edit that breaks them is named). */
        if (doc->err[0])
            return;
        if (x->current < 0 || x->live_blocks < 0)
            cli_schema(doc, o, w, "\"%s\" is below 0", x->current < 0 ? "current_bytes" : "live_blocks");
        else if (x->current > x->peak)
            cli_schema(doc, o, w, "current_bytes %" PRId64 " is above peak_bytes %" PRId64, x->current, x->peak);
        else if (tally__json_get(o, "peak_blocks") && x->live_blocks > x->peak_blocks)
            cli_schema(doc, o, w, "live_blocks %" PRId64 " is above peak_blocks %" PRId64, x->live_blocks,
                       x->peak_blocks);
        else if (tally__json_get(o, "allocated_bytes") && tally__json_get(o, "freed_bytes") &&
                 x->current != x->allocated - x->freed)
            cli_schema(doc, o, w, "current_bytes %" PRId64 " is not allocated_bytes - freed_bytes (%" PRId64 ")",
                       x->current, x->allocated - x->freed);
    }
}

static void read_stages(report_t *r)
{
    cli_doc_t *doc = &r->doc;
    char w[64], sw[160];
    const tally_json_t *arr = cli_array(doc, doc->root, "report", "stages", false);
    if (!arr)
        return;
    r->nstages = arr->len;
    r->stages = cli_alloc(arr->len * sizeof *r->stages);
    for (size_t i = 0; i < arr->len && !doc->err[0]; i++) {
        const tally_json_t *o = cli_obj_at(doc, arr, "stages", i, w, sizeof w);
        if (!o)
            return;
        rep_stage_t *s = &r->stages[i];
        s->name = cli_str(doc, o, w, "name", false);
        s->seq = cli_int_opt(doc, o, w, "seq", true, (int64_t)i + 1);
        s->depth = cli_int_opt(doc, o, w, "depth", true, 1);
        /* tally nests stages at most 64 deep (lib/ledger/stage.c); the
         * summary indents by the depth, which must stay a small int. */
        if (s->depth < 1 || s->depth > 64)
            cli_schema(doc, tally__json_get(o, "depth"), w, "\"depth\" %" PRId64 " is out of range (1 to 64)",
                       s->depth);
        s->begin_us = cli_int_opt(doc, o, w, "begin_us", true, 0);
        s->wall_us = cli_int(doc, o, w, "wall_us");
        s->peak_allocated = cli_int(doc, o, w, "peak_allocated_bytes");
        s->peak_reserved = cli_int(doc, o, w, "peak_reserved_bytes");
        s->survivor_bytes = cli_int(doc, o, w, "survivor_bytes");
        s->survivor_blocks = cli_int(doc, o, w, "survivor_blocks");
        s->released = cli_int_opt(doc, o, w, "released_bytes", true, 0);
        const tally_json_t *sv = cli_array(doc, o, w, "survivors", true);
        if (!sv)
            return;
        s->nsurv = sv->len;
        s->surv = cli_alloc(sv->len * sizeof *s->surv);
        for (size_t k = 0; k < sv->len && !doc->err[0]; k++) {
            char name[96];
            snprintf(name, sizeof name, "%s.survivors", w);
            const tally_json_t *so = cli_obj_at(doc, sv, name, k, sw, sizeof sw);
            if (!so)
                return;
            s->surv[k].tag = cli_str(doc, so, sw, "tag", false);
            s->surv[k].device = device_of(doc, so, sw);
            s->surv[k].foreign = cli_bool(doc, so, sw, "foreign");
            s->surv[k].bytes = cli_int(doc, so, sw, "bytes");
            s->surv[k].blocks = cli_int(doc, so, sw, "blocks");
            if (s->surv[k].bytes < 0 || s->surv[k].blocks < 0)
                cli_schema(doc, so, sw, "\"%s\" is below 0", s->surv[k].bytes < 0 ? "bytes" : "blocks");
        }
        int64_t bytes = 0, blocks = 0;
        for (size_t k = 0; k < s->nsurv; k++) {
            bytes = cli_add(bytes, s->surv[k].bytes);
            blocks = cli_add(blocks, s->surv[k].blocks);
        }
        if (bytes != s->survivor_bytes || blocks != s->survivor_blocks)
            cli_schema(doc, o, w, "survivor_bytes %" PRId64 " and survivor_blocks %" PRId64
                       " are not the sums of its survivors (%" PRId64 ", %" PRId64 ")",
                       s->survivor_bytes, s->survivor_blocks, bytes, blocks);
    }
}

static void read_leaks(report_t *r)
{
    cli_doc_t *doc = &r->doc;
    char w[64];
    const tally_json_t *arr = cli_array(doc, doc->root, "report", "leaks", true);
    if (!arr)
        return;
    r->nleaks = arr->len;
    r->leaks = cli_alloc(arr->len * sizeof *r->leaks);
    for (size_t i = 0; i < arr->len && !doc->err[0]; i++) {
        const tally_json_t *o = cli_obj_at(doc, arr, "leaks", i, w, sizeof w);
        if (!o)
            return;
        rep_leak_t *l = &r->leaks[i];
        l->tag = cli_str(doc, o, w, "tag", false);
        l->stage = cli_str(doc, o, w, "stage", false);
        l->site = cli_str(doc, o, w, "site", true);
        l->device = device_of(doc, o, w);
        l->foreign = cli_bool(doc, o, w, "foreign");
        l->bytes = cli_int(doc, o, w, "bytes");
        l->blocks = cli_int(doc, o, w, "blocks");
        if (l->bytes < 0 || l->blocks < 0)
            cli_schema(doc, o, w, "\"%s\" is below 0", l->bytes < 0 ? "bytes" : "blocks");
    }
}

static void read_timeline(report_t *r)
{
    cli_doc_t *doc = &r->doc;
    char w[64];
    const tally_json_t *arr = cli_array(doc, doc->root, "report", "timeline", true);
    if (!arr)
        return;
    r->nevents = arr->len;
    r->events = cli_alloc(arr->len * sizeof *r->events);
    for (size_t i = 0; i < arr->len && !doc->err[0]; i++) {
        const tally_json_t *o = cli_obj_at(doc, arr, "timeline", i, w, sizeof w);
        if (!o)
            return;
        rep_event_t *e = &r->events[i];
        e->device = device_of(doc, o, w);
        e->action = action_of(cli_str(doc, o, w, "action", false));
        e->time_us = cli_int(doc, o, w, "time_us");
        e->addr = cli_int_opt(doc, o, w, "addr", true, 0);
        e->size = cli_int_opt(doc, o, w, "size", true, 0);
        e->allocated = cli_int(doc, o, w, "allocated");
        e->reserved = cli_int(doc, o, w, "reserved");
        e->tag = cli_str(doc, o, w, "tag", true);
        e->stage = cli_str(doc, o, w, "stage", true);
        if (e->size < 0 || e->allocated < 0 || e->reserved < 0)
            cli_schema(doc, o, w, "\"%s\" is below 0",
                       e->size < 0 ? "size" : e->allocated < 0 ? "allocated" : "reserved");
    }
}

void cli_report_free(report_t *r)
{
    for (size_t i = 0; i < r->nstages; i++)
        free(r->stages[i].surv);
    free(r->devs);
    free(r->rows);
    free(r->stages);
    free(r->leaks);
    free(r->events);
    cli_doc_free(&r->doc);
    memset(r, 0, sizeof *r);
}

/* Read the report fields of doc (already loaded, known to be a report)
 * into *r, which takes the document over. Returns 0, or EXIT_DATA after
 * printing the first schema problem. */
int cli_report_parse(report_t *r, cli_doc_t *doc, bool want_timeline)
{
    memset(r, 0, sizeof *r);
    r->doc = *doc;
    memset(doc, 0, sizeof *doc);
    doc = &r->doc;
    const tally_json_t *root = doc->root;
    r->version = cli_str(doc, root, "report", "version", true);
    /* A report of a newer tally may hold fields this one cannot check:
     * refused, naming both versions. Older ones are read (fields added
     * since are optional, docs/reports.md). */
    int vmaj, vmin, vpatch, used = 0, mine_maj = 0, mine_min = 0;
    bool has_version = tally__json_get(root, "version") != NULL; /* cli_str gives "" when it is absent */
    if (has_version && (sscanf(r->version, "%d.%d.%d%n", &vmaj, &vmin, &vpatch, &used) != 3 ||
                       r->version[used] != 0)) {
        cli_schema(doc, tally__json_get(root, "version"), "report", "\"version\" '%s' is not a tally version",
                   r->version);
    } else if (has_version && sscanf(TALLY_VERSION, "%d.%d", &mine_maj, &mine_min) == 2 &&
               (vmaj > mine_maj || (vmaj == mine_maj && vmin > mine_min))) {
        int rc = cli_fail(EXIT_DATA, "%s: written by tally %s, newer than this tally (%s): read it with tally %d.%d "
                          "or later", doc->path, r->version, TALLY_VERSION, vmaj, vmin);
        cli_report_free(r);
        return rc;
    }
    r->backend = cli_str(doc, root, "report", "backend", true);
    r->pid = cli_int_opt(doc, root, "report", "pid", true, 0);
    r->rank = cli_int_opt(doc, root, "report", "rank", true, 0);
    r->local_rank = cli_int_opt(doc, root, "report", "local_rank", true, 0);
    r->world_size = cli_int_opt(doc, root, "report", "world_size", true, 1);
    r->home_device = cli_int_opt(doc, root, "report", "home_device", true, -1);
    r->time_us = cli_int_opt(doc, root, "report", "time_us", true, 0);
    read_devices(r);
    read_rows(r);
    read_stages(r);
    r->stages_total = cli_int_opt(doc, root, "report", "stages_total", true, (int64_t)r->nstages);
    read_leaks(r);
    if (want_timeline)
        read_timeline(r);
    if (doc->err[0]) {
        cli_fail(EXIT_DATA, "%s: not a valid tally report: %s", doc->path, doc->err);
        cli_report_free(r);
        return EXIT_DATA;
    }
    return 0;
}

/* Load path as a tally report. Returns 0, or EXIT_DATA after printing why. */
int cli_report_load(report_t *r, const char *path, bool want_timeline)
{
    cli_doc_t doc;
    memset(r, 0, sizeof *r);
    int rc = cli_doc_load(&doc, path);
    if (rc)
        return rc;
    int kind = cli_doc_kind(doc.root);
    if (kind != DOC_REPORT) {
        cli_doc_free(&doc);
        if (kind == DOC_STATS)
            return cli_fail(EXIT_DATA,
                            "%s: a memory_stats object, not a tally report (only 'tally summary' reads those; "
                            "a process writes its report with TALLY_CONF=report_path:FILE)",
                            path);
        return cli_fail(EXIT_DATA, "%s: not a tally report or memory_stats object", path);
    }
    return cli_report_parse(r, &doc, want_timeline);
}

/* The report's entry for device, or NULL. */
const rep_device_t *cli_report_device(const report_t *r, int device)
{
    for (size_t i = 0; i < r->ndev; i++)
        if (r->devs[i].device == device)
            return &r->devs[i];
    return NULL;
}

/* "0-3" or "0, 2" or "none": the devices a report has, for messages; a
 * list longer than buf ends with " and N more". */
void cli_report_device_list(const report_t *r, char *buf, size_t len)
{
    size_t n = 0;
    buf[0] = 0;
    if (!r->ndev) {
        snprintf(buf, len, "none");
        return;
    }
    bool contiguous = true;
    for (size_t i = 0; i < r->ndev; i++)
        if (r->devs[i].device != r->devs[0].device + (int)i)
            contiguous = false;
    if (contiguous && r->ndev > 2) {
        snprintf(buf, len, "%d-%d", r->devs[0].device, r->devs[r->ndev - 1].device);
        return;
    }
    /* Each entry takes at most 13 bytes (", " and an int); the room kept
     * after the last one holds " and N more". */
    size_t i = 0;
    for (; i < r->ndev && n + 32 < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%d", i ? ", " : "", r->devs[i].device);
    if (i < r->ndev)
        snprintf(buf + n, len - n, " and %zu more", r->ndev - i);
}
