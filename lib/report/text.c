/* Text reports built from the ledger: the stage-end survivor report, the
 * leak report at exit, the OOM report, and the ledger table. Each line that
 * goes to the diagnostics sink starts with "tally: ". */
#include "ledger/site.h"
#include "report/report.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tally__foreign_note(int device, char *buf, size_t len)
{
    int home = TALLY_OPT(home_device);
    if (home >= 0 && device != home)
        snprintf(buf, len, " (foreign: home device is %d)", home);
    else
        buf[0] = 0;
}

static void survivor_line(tally_out_t *o, const void *item, void *stage)
{
    const tally_survivor_t *s = item;
    char a[32], f[64];
    tally__fmt_bytes(s->bytes, a, sizeof a);
    tally__foreign_note(s->device, f, sizeof f);
    tally__out_printf(o, "tally: stage %s ended with %s still live under tag %s on device %d (%llu block%s)%s\n",
                      (const char *)stage, a, tally__tag_name(s->tag), s->device, (unsigned long long)s->blocks,
                      tally__plural(s->blocks), f);
}

void tally__report_stage(const tally_stage_rec_t *rec, tally_out_t *o)
{
    char a[32], b[32], c[32];
    const char *name = tally__stage_name(rec->id);
    tally__fmt_bytes((uint64_t)rec->peak_allocated, a, sizeof a);
    tally__fmt_bytes((uint64_t)rec->peak_reserved, b, sizeof b);
    tally__fmt_bytes(rec->survivor_bytes, c, sizeof c);
    if (rec->survivor_blocks)
        tally__out_printf(o, "tally: stage %s ended after %.3f s: peak allocated %s, peak reserved %s; %s in %llu "
                             "block%s outlive%s it\n",
                          name, (double)rec->wall_us / 1e6, a, b, c, (unsigned long long)rec->survivor_blocks,
                          tally__plural(rec->survivor_blocks), rec->survivor_blocks == 1 ? "s" : "");
    else
        tally__out_printf(o, "tally: stage %s ended after %.3f s: peak allocated %s, peak reserved %s; nothing "
                             "outlives it\n",
                          name, (double)rec->wall_us / 1e6, a, b);
    tally_site_row_t *rows = rec->nsurv ? tally__meta_alloc(rec->nsurv * sizeof *rows) : NULL;
    for (uint32_t i = 0; rows && i < rec->nsurv; i++) {
        const tally_survivor_t *s = &rec->surv[i];
        rows[i] = (tally_site_row_t){s->site, s->bytes, s->blocks, s, 0, 0};
    }
    tally__write_by_site(o, rows, rows ? rec->nsurv : 0, "", survivor_line, (void *)name);
    tally__meta_free(rows);
    if (TALLY_OPT(release_at_stage_end)) {
        tally__fmt_bytes(rec->released, a, sizeof a);
        tally__fmt_bytes(rec->reserved_after, b, sizeof b);
        tally__out_printf(o, "tally: stage %s released %s of cached segments; %s stays reserved\n", name, a, b);
    }
}

/* ---- OOM ----------------------------------------------------------------- */

/* Copies of the ledger's rows keep totals only (internal.h): their current,
 * which the reports read, is written in here. */
static void rows_now(tally_ledger_entry_t *rows, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        rows[i].bytes.current = tally__stat_now(&rows[i].bytes);
        rows[i].blocks.current = tally__stat_now(&rows[i].blocks);
    }
}

/* The largest first; equal sizes by tag, then by stage, each in the order
 * its name was first used (as the leak report orders its groups), so that
 * the order does not hang on the sort's handling of ties. */
static int row_cmp(const void *x, const void *y)
{
    const tally_ledger_entry_t *a = x, *b = y;
    if (a->bytes.current != b->bytes.current)
        return a->bytes.current < b->bytes.current ? 1 : -1;
    if (a->tag != b->tag)
        return a->tag < b->tag ? -1 : 1;
    if (a->stage != b->stage)
        return a->stage < b->stage ? -1 : 1;
    return 0;
}

void tally__report_oom_locked(tally_device_t *d, size_t asked, size_t rounded, size_t segment, const char *why)
{
    char a[32], r[32], c[32], s[32], fb[32], tb[32];
    tally_out_t o;
    tally__out_init(&o, tally__sink_writer, NULL);
    size_t free_b = 0, total = 0;
    tally__g.backend->mem_info(d->id, &free_b, &total);
    tally__cache_stats_sync_locked(d);
    const tally_stats_t *st = &d->stats;
    tally__fmt_bytes(asked, a, sizeof a);
    tally__fmt_bytes(segment, s, sizeof s);
    tally__fmt_bytes((uint64_t)st->reserved_bytes[0].current, r, sizeof r);
    tally__fmt_bytes((uint64_t)(st->reserved_bytes[0].current - st->allocated_bytes[0].current), c, sizeof c);
    tally__fmt_bytes(free_b, fb, sizeof fb);
    tally__fmt_bytes(total, tb, sizeof tb);
    tally__out_printf(&o,
                      "tally: out of memory on device %d: asked %zu bytes (%s, rounded to %zu, needing a %s segment): "
                      "%s\n",
                      d->id, asked, a, rounded, s, why && *why ? why : "backend refused");
    tally__out_printf(&o, "tally:   reserved %s, of which %s cached and unallocated; device free %s of %s\n", r, c, fb,
                      tb);
    tally_ledger_dev_t *ld = d->ledger;
    if (tally__opt.ledger && ld->count) {
        tally_ledger_entry_t *rows = tally__meta_alloc(ld->count * sizeof *rows);
        if (rows) {
            memcpy(rows, ld->entries, ld->count * sizeof *rows);
            rows_now(rows, ld->count);
            qsort(rows, ld->count, sizeof *rows, row_cmp);
            tally__out_printf(&o, "tally:   who holds device %d:\n", d->id);
            for (uint32_t i = 0; i < ld->count && i < 10 && rows[i].bytes.current > 0; i++) {
                tally__fmt_bytes((uint64_t)rows[i].bytes.current, a, sizeof a);
                tally__out_printf(&o, "tally:     %s in %lld block%s: tag %s, stage %s\n", a,
                                  (long long)rows[i].blocks.current, tally__plural((uint64_t)rows[i].blocks.current),
                                  tally__tag_name(rows[i].tag), tally__stage_name(rows[i].stage));
            }
            tally__meta_free(rows);
        }
    }
    tally__out_flush(&o);
}

/* ---- ledger table -------------------------------------------------------- */

static void stage_line(const tally_stage_rec_t *rec, void *arg)
{
    tally_out_t *o = arg;
    char a[32], r[32], s[32], rel[32];
    tally__fmt_bytes((uint64_t)rec->peak_allocated, a, sizeof a);
    tally__fmt_bytes((uint64_t)rec->peak_reserved, r, sizeof r);
    tally__fmt_bytes(rec->survivor_bytes, s, sizeof s);
    tally__fmt_bytes(rec->released, rel, sizeof rel);
    tally__out_printf(o, "%-4llu %-*s%-20s %10.3f %12s %12s %12s %12s\n", (unsigned long long)rec->seq,
                      2 * (rec->depth - 1), "", tally__stage_name(rec->id), (double)rec->wall_us / 1e6, a, r, s, rel);
}

void tally__report_ledger(tally_out_t *o)
{
    int home = TALLY_OPT(home_device);
    char homebuf[16] = "none";
    if (home >= 0)
        snprintf(homebuf, sizeof homebuf, "%d", home);
    /* Under async, reserved figures are the driver pool's: the default pool
     * is shared with every other user of it in the process. */
    const char *from = !tally__g.backend->passthrough ? ""
                       : tally__opt.async_private_pool ? ", reserved: tally's private pool"
                                                       : ", reserved: the device's default pool, shared with other users";
    tally__out_printf(o, "tally ledger (backend %s%s, home device %s)\n", tally__g.backend->name, from, homebuf);
    tally__out_printf(o, "%-6s %-20s %-20s %12s %12s %10s %s\n", "device", "tag", "stage", "current", "peak",
                      "blocks", "");
    for (int i = 0; i < tally__g.ndev; i++) {
        tally_device_t *d = tally__g.dev[i];
        tally__dev_lock(&d->lock);
        tally_ledger_dev_t *ld = d->ledger;
        tally_ledger_entry_t *rows = ld->count ? tally__meta_alloc(ld->count * sizeof *rows) : NULL;
        uint32_t n = rows ? ld->count : 0;
        if (rows) {
            memcpy(rows, ld->entries, n * sizeof *rows);
            rows_now(rows, n);
        }
        tally__dev_unlock(&d->lock);
        if (n)
            qsort(rows, n, sizeof *rows, row_cmp);
        for (uint32_t k = 0; k < n; k++) {
            char c[32], p[32];
            tally__fmt_bytes((uint64_t)rows[k].bytes.current, c, sizeof c);
            tally__fmt_bytes((uint64_t)rows[k].bytes.peak, p, sizeof p);
            tally__out_printf(o, "%-6d %-20s %-20s %12s %12s %10lld %s\n", i, tally__tag_name(rows[k].tag),
                              tally__stage_name(rows[k].stage), c, p, (long long)rows[k].blocks.current,
                              home >= 0 && i != home ? "foreign" : "");
        }
        tally__meta_free(rows);
    }
    tally__report_private_text(o, -1);
    tally__out_printf(o, "\nstages (newest %d kept)\n%-4s %-20s %10s %12s %12s %12s %12s\n", TALLY_STAGE_HISTORY, "#",
                      "stage", "seconds", "peak alloc", "peak resv", "survivors", "released");
    tally__stage_history(stage_line, o, NULL);
}

void tally__report_stage_to_sink(const tally_stage_rec_t *rec)
{
    tally_out_t o;
    tally__out_init(&o, tally__sink_writer, NULL);
    tally__report_stage(rec, &o);
    tally__out_flush(&o);
}
