/* The leak report, in LeakSanitizer's shape. Live blocks are grouped by
 * (tag, stage, device, site); groups of one allocation site are printed
 * together under one "Direct leak of N bytes in K blocks allocated from:"
 * line and the site's frames, sites with the most bytes first. Leaks that a
 * suppression matches, and blocks passed to tally_ignore, are counted
 * apart and never count as leaked (so never set leak_exitcode). */
#include "ledger/suppress.h"
#include "report/report.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void leak_add(leak_set_t *s, const tally_block_t *b, int device)
{
    for (size_t i = 0; i < s->n; i++) {
        leak_group_t *g = &s->items[i];
        if (g->tag == b->tag && g->stage == b->stage && g->device == device && g->site == b->site &&
            g->ignored == (b->ignored != 0)) {
            g->bytes += b->size;
            g->blocks++;
            return;
        }
    }
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 32;
        leak_group_t *grown = tally__meta_alloc(cap * sizeof *grown);
        if (!grown)
            return;
        if (s->n)
            memcpy(grown, s->items, s->n * sizeof *grown);
        tally__meta_free(s->items);
        s->items = grown;
        s->cap = cap;
    }
    s->items[s->n++] = (leak_group_t){b->tag, b->stage, device, b->site, b->size, 1, b->ignored != 0, -1};
}

static int leak_cmp(const void *x, const void *y)
{
    const leak_group_t *a = x, *b = y;
    if (a->bytes != b->bytes)
        return a->bytes < b->bytes ? 1 : -1;
    if (a->device != b->device)
        return a->device < b->device ? -1 : 1;
    if (a->tag != b->tag)
        return a->tag < b->tag ? -1 : 1;
    if (a->stage != b->stage)
        return a->stage < b->stage ? -1 : 1;
    uint32_t sa = tally__site_id(a->site), sb = tally__site_id(b->site);
    return sa < sb ? -1 : sa > sb;
}

/* Live blocks of every device, grouped, largest first; the caller frees items. */
leak_set_t tally__collect_leaks(void)
{
    leak_set_t s = {0};
    for (int i = 0; i < tally__g.ndev; i++) {
        tally_device_t *d = tally__g.dev[i];
        tally__dev_lock(&d->lock);
        for (size_t k = 0; k <= d->map.mask; k++)
            if (d->map.slots[k].key && d->map.slots[k].val->seq > d->inherited_seq)
                leak_add(&s, d->map.slots[k].val, i);
        tally__dev_unlock(&d->lock);
    }
    if (s.n)
        qsort(s.items, s.n, sizeof *s.items, leak_cmp);
    return s;
}

void tally__leaks_classify(leak_set_t *s, tally_suppressions_t *sup)
{
    for (size_t i = 0; i < s->n; i++) {
        leak_group_t *g = &s->items[i];
        g->suppressed = g->ignored ? TALLY_SUP_IGNORED : tally__sup_match(sup, tally__tag_name(g->tag), g->site);
        if (g->suppressed >= 0) {
            sup->rules[g->suppressed].blocks += g->blocks;
            sup->rules[g->suppressed].bytes += g->bytes;
        }
    }
}

static void leak_line(tally_out_t *o, const void *item, void *arg)
{
    const leak_group_t *g = item;
    char h[32], f[64];
    tally__fmt_bytes(g->bytes, h, sizeof h);
    tally__foreign_note(g->device, f, sizeof f);
    tally__out_printf(o, "tally: %llu bytes (%s) in %llu block%s: tag %s, stage %s, device %d%s\n",
                      (unsigned long long)g->bytes, h, (unsigned long long)g->blocks, tally__plural(g->blocks),
                      tally__tag_name(g->tag), tally__stage_name(g->stage), g->device, f);
}

static void write_groups(tally_out_t *o, const leak_set_t *s)
{
    tally_site_row_t *rows = s->n ? tally__meta_alloc(s->n * sizeof *rows) : NULL;
    size_t n = 0;
    for (size_t i = 0; rows && i < s->n; i++) {
        const leak_group_t *g = &s->items[i];
        if (g->suppressed == -1)
            rows[n++] = (tally_site_row_t){g->site, g->bytes, g->blocks, g, 0, 0};
    }
    tally__write_by_site(o, rows, n, "Direct leak of ", leak_line, NULL);
    tally__meta_free(rows);
}

static void write_suppressed(tally_out_t *o, const leak_set_t *s, const tally_suppressions_t *sup)
{
    uint64_t ign_bytes = 0, ign_blocks = 0;
    char h[32];
    for (size_t i = 0; i < s->n; i++) {
        if (s->items[i].suppressed == TALLY_SUP_IGNORED) {
            ign_bytes += s->items[i].bytes;
            ign_blocks += s->items[i].blocks;
        }
    }
    for (int i = 0; i < sup->n; i++) {
        const tally_sup_rule_t *r = &sup->rules[i];
        if (!r->blocks) {
            tally__out_printf(o, "tally: suppression leak:%s (%s:%d) matched nothing\n", r->pattern, sup->path,
                              r->line);
            continue;
        }
        tally__fmt_bytes(r->bytes, h, sizeof h);
        tally__out_printf(o, "tally: suppressed by leak:%s (%s:%d): %llu bytes (%s) in %llu block%s\n", r->pattern,
                          sup->path, r->line, (unsigned long long)r->bytes, h, (unsigned long long)r->blocks,
                          tally__plural(r->blocks));
    }
    if (ign_blocks) {
        tally__fmt_bytes(ign_bytes, h, sizeof h);
        tally__out_printf(o, "tally: ignored (tally_ignore): %llu bytes (%s) in %llu block%s\n",
                          (unsigned long long)ign_bytes, h, (unsigned long long)ign_blocks, tally__plural(ign_blocks));
    }
}

/* At exit the live blocks are leaks; mid-run (tally_write_leaks without
 * TALLY_LEAKS_AT_EXIT) they are only live so far, and said so. */
uint64_t tally__report_leaks(tally_out_t *o, bool full, bool at_exit, uint64_t *blocks_out)
{
    tally_suppressions_t *sup = tally__meta_calloc(sizeof *sup);
    char why[700];
    if (sup && tally__sup_load(sup, why, sizeof why))
        tally__out_printf(o, "tally: leak_suppressions: %s; no leak is suppressed\n", why);
    leak_set_t s = tally__collect_leaks();
    if (sup)
        tally__leaks_classify(&s, sup);
    uint64_t bytes = 0, blocks = 0, sup_blocks = 0, groups = 0;
    for (size_t i = 0; i < s.n; i++) {
        if (s.items[i].suppressed != -1) {
            sup_blocks += s.items[i].blocks;
            continue;
        }
        bytes += s.items[i].bytes;
        blocks += s.items[i].blocks;
        groups++;
    }
    if (full && groups)
        tally__out_printf(o, "tally: %s: %llu block%s still live %s, in %llu group%s\n",
                          at_exit ? "leak report" : "live blocks", (unsigned long long)blocks, tally__plural(blocks),
                          at_exit ? "at exit" : "now", (unsigned long long)groups, tally__plural(groups));
    if (full) {
        write_groups(o, &s);
        if (sup)
            write_suppressed(o, &s, sup);
    }
    if (blocks || sup_blocks) {
        char extra[64] = "";
        if (sup_blocks)
            snprintf(extra, sizeof extra, " (%llu block%s suppressed)", (unsigned long long)sup_blocks,
                     tally__plural(sup_blocks));
        tally__out_printf(o, "tally: SUMMARY: %llu bytes %s in %llu block%s%s\n", (unsigned long long)bytes,
                          at_exit ? "leaked" : "still live", (unsigned long long)blocks, tally__plural(blocks),
                          extra);
        uint64_t sb = 0, sn = 0;
        tally__private_sleeping(&sb, &sn);
        if (sn)
            tally__out_printf(o, "tally: SUMMARY: %llu of those block%s (%llu bytes) %s asleep: private tags, owned "
                              "but not resident\n",
                              (unsigned long long)sn, tally__plural(sn), (unsigned long long)sb,
                              sn == 1 ? "is" : "are");
    }
    tally__meta_free(s.items);
    if (sup) {
        tally__sup_free(sup);
        tally__meta_free(sup);
    }
    if (blocks_out)
        *blocks_out = blocks;
    return bytes;
}
