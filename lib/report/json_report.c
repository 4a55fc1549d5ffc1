/* The JSON report: one document per process with its identity (pid, rank,
 * home device), each device's memory_stats, the ledger rows, the stage
 * history, the live blocks grouped as leaks, the segments and blocks (for
 * snapshot export) and, when recorded, the timeline. docs/reports.md gives
 * the schema. Written at exit when report_path is set, or on demand. */
#include "ledger/suppress.h"
#include "report/report.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int env_int(const char *name, int fallback)
{
    const char *v = getenv(name);
    char *end;
    if (!v || !*v)
        return fallback;
    long x = strtol(v, &end, 10);
    return *end || x < 0 || x > 1 << 20 ? fallback : (int)x;
}

static bool is_foreign(int device)
{
    int home = TALLY_OPT(home_device);
    return home >= 0 && device != home;
}

static void write_ledger(tally_out_t *o)
{
    bool first = true;
    tally__out_puts(o, "\"ledger\":[");
    for (int i = 0; i < tally__g.ndev; i++) {
        tally_device_t *d = tally__g.dev[i];
        tally__dev_lock(&d->lock);
        tally_ledger_dev_t *ld = d->ledger;
        for (uint32_t r = 0; r < ld->count; r++) {
            const tally_ledger_entry_t *e = &ld->entries[r];
            tally__out_puts(o, first ? "\n {\"tag\":" : ",\n {\"tag\":");
            first = false;
            tally__out_json_str(o, tally__tag_name(e->tag));
            tally__out_puts(o, ",\"stage\":");
            tally__out_json_str(o, tally__stage_name(e->stage));
            tally__out_printf(o,
                              ",\"device\":%d,\"foreign\":%s,\"current_bytes\":%lld,\"peak_bytes\":%lld,"
                              "\"allocated_bytes\":%lld,\"freed_bytes\":%lld,\"live_blocks\":%lld,\"peak_blocks\":%lld,"
                              "\"allocated_blocks\":%lld}",
                              i, is_foreign(i) ? "true" : "false", (long long)tally__stat_now(&e->bytes), (long long)e->bytes.peak,
                              (long long)e->bytes.allocated, (long long)e->bytes.freed, (long long)tally__stat_now(&e->blocks),
                              (long long)e->blocks.peak, (long long)e->blocks.allocated);
        }
        tally__dev_unlock(&d->lock);
    }
    tally__out_puts(o, "],\n");
}

typedef struct stage_ctx {
    tally_out_t *o;
    bool first;
    struct site_list *sites;
} stage_ctx_t;

/* The sites the report names (stage survivors, leaks), each once. */
typedef struct site_list {
    const tally_site_t **items;
    size_t n, cap;
} site_list_t;

static void site_note(site_list_t *l, const tally_site_t *site)
{
    if (!site)
        return;
    for (size_t i = 0; i < l->n; i++)
        if (l->items[i] == site)
            return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        const tally_site_t **grown = tally__meta_grow(l->items, l->n, cap, sizeof *grown);
        if (!grown)
            return;
        l->items = grown;
        l->cap = cap;
    }
    l->items[l->n++] = site;
}

static void write_site_id(tally_out_t *o, const tally_site_t *site)
{
    if (site)
        tally__out_printf(o, ",\"site_id\":%u", tally__site_id(site));
}

static void write_stage(const tally_stage_rec_t *rec, void *arg)
{
    stage_ctx_t *c = arg;
    tally_out_t *o = c->o;
    tally__out_puts(o, c->first ? "\n {\"name\":" : ",\n {\"name\":");
    c->first = false;
    tally__out_json_str(o, tally__stage_name(rec->id));
    tally__out_printf(o,
                      ",\"seq\":%llu,\"depth\":%d,\"begin_us\":%llu,\"wall_us\":%llu,\"peak_allocated_bytes\":%lld,"
                      "\"peak_reserved_bytes\":%lld,\"survivor_bytes\":%llu,\"survivor_blocks\":%llu,"
                      "\"released_bytes\":%llu,\"survivors\":[",
                      (unsigned long long)rec->seq, rec->depth, (unsigned long long)rec->begin_us,
                      (unsigned long long)rec->wall_us, (long long)rec->peak_allocated, (long long)rec->peak_reserved,
                      (unsigned long long)rec->survivor_bytes, (unsigned long long)rec->survivor_blocks,
                      (unsigned long long)rec->released);
    for (uint32_t i = 0; i < rec->nsurv; i++) {
        const tally_survivor_t *s = &rec->surv[i];
        tally__out_puts(o, i ? ",{\"tag\":" : "{\"tag\":");
        tally__out_json_str(o, tally__tag_name(s->tag));
        tally__out_printf(o, ",\"device\":%d,\"foreign\":%s,\"bytes\":%llu,\"blocks\":%llu", s->device,
                          is_foreign(s->device) ? "true" : "false", (unsigned long long)s->bytes,
                          (unsigned long long)s->blocks);
        write_site_id(o, s->site);
        site_note(c->sites, s->site);
        tally__out_puts(o, "}");
    }
    tally__out_puts(o, "]}");
}

/* The live blocks grouped as the leak report groups them, each with its
 * site's id and whether a suppression (or tally_ignore) covers it; then
 * every site those groups name, with its whole frames. */
static void write_leaks(tally_out_t *o, site_list_t *sites)
{
    tally_suppressions_t *sup = tally__meta_calloc(sizeof *sup);
    char why[700];
    if (sup && tally__sup_load(sup, why, sizeof why))
        sup->n = 0;
    leak_set_t s = tally__collect_leaks();
    if (sup)
        tally__leaks_classify(&s, sup);
    tally__out_puts(o, "\"leaks\":[");
    for (size_t i = 0; i < s.n; i++) {
        const leak_group_t *g = &s.items[i];
        char label[1400];
        tally__out_puts(o, i ? ",\n {\"tag\":" : "\n {\"tag\":");
        tally__out_json_str(o, tally__tag_name(g->tag));
        tally__out_puts(o, ",\"stage\":");
        tally__out_json_str(o, tally__stage_name(g->stage));
        tally__out_printf(o, ",\"device\":%d,\"foreign\":%s,\"bytes\":%llu,\"blocks\":%llu,\"site\":", g->device,
                          is_foreign(g->device) ? "true" : "false", (unsigned long long)g->bytes,
                          (unsigned long long)g->blocks);
        tally__site_label(g->site, label, sizeof label);
        tally__out_json_str(o, label);
        tally__out_printf(o, ",\"site_id\":%u,\"suppressed\":%s}", tally__site_id(g->site),
                          g->suppressed == -1 ? "false" : "true");
    }
    for (size_t i = 0; i < s.n; i++)
        site_note(sites, s.items[i].site);
    tally__out_puts(o, "],\n");
    tally__meta_free(s.items);
    if (sup) {
        tally__sup_free(sup);
        tally__meta_free(sup);
    }
}

static const char *const state_names[] = {"inactive", "active_allocated", "active_pending_free"};

static void write_segments(tally_out_t *o, tally_device_t *d, bool *first, site_list_t *sites)
{
    for (tally_segment_t *s = d->segments; s; s = s->next) {
        tally__out_printf(o,
                          "%s\n {\"device\":%d,\"address\":%llu,\"total_size\":%zu,\"stream\":%llu,"
                          "\"segment_type\":\"%s\",\"blocks\":[",
                          *first ? "" : ",", d->id, (unsigned long long)s->base, s->size,
                          (unsigned long long)(uintptr_t)s->stream, s->pool == TALLY_POOL_SMALL ? "small" : "large");
        *first = false;
        bool none = true;
        for (tally_block_t *b = s->head; b; b = b->next) {
            /* A piece lent to the small pool is listed as that small segment. */
            if (b->state == BLOCK_LENT)
                continue;
            tally__out_printf(o, "%s{\"address\":%llu,\"size\":%zu,\"requested_size\":%zu,\"state\":\"%s\"",
                              none ? "" : ",", (unsigned long long)b->addr, b->size,
                              b->state == BLOCK_FREE ? (size_t)0 : b->requested, state_names[b->state]);
            none = false;
            if (b->state != BLOCK_FREE) {
                tally__out_puts(o, ",\"tag\":");
                tally__out_json_str(o, tally__tag_name(b->tag));
                tally__out_puts(o, ",\"stage\":");
                tally__out_json_str(o, tally__stage_name(b->stage));
                write_site_id(o, b->site);
                site_note(sites, b->site);
            }
            tally__out_puts(o, "}");
        }
        tally__out_puts(o, "]}");
    }
}

static const char *const action_names[] = {"alloc", "free_requested", "segment_alloc", "segment_free", "oom",
                                           "stage_begin", "stage_end", "sleep", "wake"};

static void write_timeline(tally_out_t *o, tally_device_t *d, bool *first, site_list_t *sites)
{
    size_t cap = (size_t)tally__opt.timeline_events;
    tally_event_rec_t *ev = tally__meta_alloc(cap * sizeof *ev);
    if (!ev)
        return;
    /* (copy returns 0 when nothing was recorded on this device) */
    size_t n = tally__timeline_copy_locked(d, ev, cap);
    for (size_t i = 0; i < n; i++) {
        tally__out_printf(o,
                          "%s\n {\"device\":%d,\"time_us\":%llu,\"action\":\"%s\",\"addr\":%llu,\"size\":%llu,"
                          "\"stream\":%llu,\"allocated\":%lld,\"reserved\":%lld,\"tag\":",
                          *first ? "" : ",", d->id, (unsigned long long)ev[i].time_us, action_names[ev[i].action],
                          (unsigned long long)ev[i].addr, (unsigned long long)ev[i].size,
                          (unsigned long long)(uintptr_t)ev[i].stream, (long long)ev[i].allocated,
                          (long long)ev[i].reserved);
        *first = false;
        tally__out_json_str(o, tally__tag_name(ev[i].tag));
        tally__out_puts(o, ",\"stage\":");
        tally__out_json_str(o, tally__stage_name(ev[i].stage));
        write_site_id(o, ev[i].site);
        site_note(sites, ev[i].site);
        tally__out_puts(o, "}");
    }
    tally__meta_free(ev);
}

int tally__report_json(tally_out_t *o)
{
    tally__out_puts(o, "{\"format\":\"tally-report\",\"version\":");
    tally__out_json_str(o, TALLY_VERSION);
    tally__out_printf(o, ",\"pid\":%d,\"rank\":%d,\"local_rank\":%d,\"world_size\":%d,\"home_device\":%d,",
                      (int)getpid(), env_int("RANK", 0), env_int("LOCAL_RANK", 0), env_int("WORLD_SIZE", 1),
                      TALLY_OPT(home_device));
    tally__out_puts(o, "\"backend\":");
    tally__out_json_str(o, tally__g.backend->name);
    if (tally__g.backend->passthrough) /* whose memory reserved_bytes counts */
        tally__out_printf(o, ",\"reserved_from\":\"%s\"",
                          tally__opt.async_private_pool ? "private pool" : "default pool, shared");
    tally__out_printf(o, ",\"time_us\":%llu,\n\"devices\":[", (unsigned long long)tally__now_us());
    for (int i = 0; i < tally__g.ndev; i++) {
        tally_stats_t s;
        tally_device_t *d = tally__g.dev[i];
        tally__dev_lock(&d->lock);
        tally__cache_fill_derived_locked(d, &s);
        uint64_t dropped = tally__timeline_dropped_locked(d);
        tally__dev_unlock(&d->lock);
        tally__out_printf(o,
                          "%s\n {\"device\":%d,\"largest_free_block\":%lld,\"utilisation\":%.6f,"
                          "\"timeline_dropped\":%llu,\"stats\":",
                          i ? "," : "", i, (long long)s.largest_free_block, s.utilisation,
                          (unsigned long long)dropped);
        tally__stats_json(&s, o);
        tally__out_puts(o, "}");
    }
    tally__out_puts(o, "],\n");
    write_ledger(o);
    tally__report_private_json(o);
    site_list_t sites = {0};
    stage_ctx_t c = {o, true, &sites};
    uint64_t total = 0;
    tally__out_puts(o, "\"stages\":[");
    tally__stage_history(write_stage, &c, &total);
    tally__out_printf(o, "],\n\"stages_total\":%llu,\n", (unsigned long long)total);
    write_leaks(o, &sites);
    bool first = true;
    tally__out_puts(o, "\"segments\":[");
    for (int i = 0; i < tally__g.ndev; i++) {
        tally__dev_lock(&tally__g.dev[i]->lock);
        write_segments(o, tally__g.dev[i], &first, &sites);
        tally__dev_unlock(&tally__g.dev[i]->lock);
    }
    tally__out_puts(o, "],\n\"timeline\":[");
    first = true;
    /* Whatever was recorded, even if timeline has since been turned off. */
    for (int i = 0; i < tally__g.ndev; i++) {
        tally__dev_lock(&tally__g.dev[i]->lock);
        write_timeline(o, tally__g.dev[i], &first, &sites);
        tally__dev_unlock(&tally__g.dev[i]->lock);
    }
    /* Every site named above (symbolised here, with no lock held). */
    tally__out_puts(o, "],\n\"sites\":[");
    for (size_t i = 0; i < sites.n; i++) {
        tally__out_printf(o, "%s\n {\"id\":%u,\"frames\":", i ? "," : "", tally__site_id(sites.items[i]));
        tally__site_json(sites.items[i], o);
        tally__out_puts(o, "}");
    }
    tally__meta_free(sites.items);
    tally__out_puts(o, "],\n\"alloc_trace\":[");
    first = true;
    for (int i = 0; i < tally__g.ndev; i++) {
        tally__dev_lock(&tally__g.dev[i]->lock);
        tally__trace_write_locked(tally__g.dev[i], o, &first);
        tally__dev_unlock(&tally__g.dev[i]->lock);
    }
    tally__out_puts(o, "]}\n");
    tally__out_flush(o);
    return o->failed ? -TALLY_ENOMEM : 0;
}

/* Expand %p (pid) and %r (rank) in a report path. */
int tally__expand_path(const char *pattern, char *out, size_t len)
{
    size_t n = 0;
    for (const char *p = pattern; *p; p++) {
        char piece[32];
        const char *add = piece;
        if (p[0] == '%' && p[1] == 'p') {
            snprintf(piece, sizeof piece, "%d", (int)getpid());
            p++;
        } else if (p[0] == '%' && p[1] == 'r') {
            snprintf(piece, sizeof piece, "%d", env_int("RANK", 0));
            p++;
        } else if (p[0] == '%' && p[1] == '%') {
            add = "%";
            p++;
        } else {
            piece[0] = *p;
            piece[1] = 0;
        }
        size_t k = strlen(add);
        if (n + k >= len)
            return -1;
        memcpy(out + n, add, k);
        n += k;
    }
    out[n] = 0;
    return 0;
}

int tally__write_report(const char *path)
{
    int rc;
    char configured[512];
    tally__opt_string(tally__opt.report_path, configured);
    const char *pattern = path ? path : configured;
    if (!*pattern)
        return tally__fail(TALLY_EINVAL, "tally_write_report: no path given and report_path is not set");
    char bad[3];
    if (tally__check_path_escapes(pattern, bad))
        return tally__fail(TALLY_EINVAL, "tally_write_report: unknown escape '%s' in '%s' (valid: %%p pid, %%r rank, %%%% a %%)",
                           bad, pattern);
    char real[1024];
    if (tally__expand_path(pattern, real, sizeof real))
        return tally__fail(TALLY_EINVAL, "tally_write_report: path '%s' is too long", pattern);
    /* A symlink is followed (the link stays a link). A path that exists and
     * is not a regular file (a FIFO, /dev/null, /dev/stdout) is written in
     * place: renaming over it would replace it with a file. */
    char resolved[4096];
    struct stat st;
    const char *dest = real;
    if (lstat(real, &st) == 0 && S_ISLNK(st.st_mode) && realpath(real, resolved))
        dest = resolved;
    if (stat(dest, &st) == 0 && !S_ISREG(st.st_mode)) {
        FILE *f = fopen(dest, "w");
        if (!f)
            return tally__fail(TALLY_EIO, "tally_write_report: cannot open '%s' for writing", real);
        tally_out_t *o = tally__meta_alloc(sizeof *o);
        rc = -TALLY_ENOMEM;
        if (o) {
            tally__out_init(o, tally__write_file, f);
            rc = tally__report_json(o);
            tally__meta_free(o);
        }
        if (fclose(f) != 0 || rc)
            return tally__fail(TALLY_EIO, "tally_write_report: writing '%s' failed", real);
        return 0;
    }
    char tmp[4200];
    FILE *f = tally__create_beside(dest, tmp, sizeof tmp);
    if (!f)
        return tally__fail(TALLY_EIO, "tally_write_report: cannot open '%s' for writing", real);
    tally_out_t *o = tally__meta_alloc(sizeof *o);
    if (!o) {
        fclose(f);
        remove(tmp);
        return tally__fail(TALLY_ENOMEM, "tally_write_report: out of host memory");
    }
    tally__out_init(o, tally__write_file, f);
    rc = tally__report_json(o);
    tally__meta_free(o);
    /* Written to a temporary name first so a reader never sees half a file. */
    if (fclose(f) != 0 || rc) {
        remove(tmp);
        return tally__fail(TALLY_EIO, "tally_write_report: writing '%s' failed", real);
    }
    if (rename(tmp, dest) != 0) {
        remove(tmp);
        return tally__fail(TALLY_EIO, "tally_write_report: cannot rename the report to '%s'", real);
    }
    return 0;
}
