/* What the reports say about private tags (docs/sleep.md): per device and
 * private tag, whether it sleeps, its mapped bytes, its sleeping bytes (live
 * blocks owned but not resident), its offload bytes in host memory, and how
 * often it slept and woke. The ledger text and memory_summary print a table,
 * the JSON report a "private_tags" array, the leak report how many of the
 * blocks still live sleep. The cache names each private pool by the id the
 * API gave it, which is the tag's id. */
#include "report/report.h"

#include <stdio.h>

typedef void (*row_fn)(tally_out_t *o, int device, uint32_t tag, const tally_ppool_info_t *in, bool *first);

static void each(tally_out_t *o, int device, row_fn fn, bool *first)
{
    for (int i = 0; i < tally__g.ndev; i++) {
        if (device >= 0 && i != device)
            continue;
        tally_device_t *d = tally__g.dev[i];
        tally_ppool_info_t rows[64];
        uint32_t tags[64];
        int n = 0;
        tally__dev_lock(&d->lock);
        for (tally_gpool_t *gp = d->ppools; gp && n < 64; gp = gp->next, n++) {
            tags[n] = gp->private_id;
            tally__ppool_info_locked(d, gp, &rows[n]);
        }
        tally__dev_unlock(&d->lock);
        for (int k = 0; k < n; k++)
            fn(o, i, tags[k], &rows[k], first);
    }
}

static const char *state(const tally_ppool_info_t *in)
{
    return !in->asleep ? "awake" : in->offloaded ? "asleep, offloaded" : "asleep, discarded";
}

static void text_row(tally_out_t *o, int device, uint32_t tag, const tally_ppool_info_t *in, bool *first)
{
    if (*first)
        tally__out_printf(o, "\nprivate tags (sleep and wake)\n%-6s %-20s %-18s %12s %12s %8s %12s %6s %6s\n",
                          "device", "tag", "state", "mapped", "sleeping", "blocks", "offload", "sleeps", "wakes");
    *first = false;
    char m[32], s[32], f[32];
    tally__fmt_bytes(in->reserved, m, sizeof m);
    tally__fmt_bytes(in->sleeping, s, sizeof s);
    tally__fmt_bytes(in->offload, f, sizeof f);
    tally__out_printf(o, "%-6d %-20s %-18s %12s %12s %8llu %12s %6llu %6llu\n", device, tally__tag_name(tag),
                      state(in), m, s, (unsigned long long)in->sleeping_blocks, f, (unsigned long long)in->sleeps,
                      (unsigned long long)in->wakes);
}

void tally__report_private_text(tally_out_t *o, int device)
{
    bool first = true;
    each(o, device, text_row, &first);
}

static void json_row(tally_out_t *o, int device, uint32_t tag, const tally_ppool_info_t *in, bool *first)
{
    tally__out_printf(o, "%s\n {\"device\":%d,\"tag\":", *first ? "" : ",", device);
    tally__out_json_str(o, tally__tag_name(tag));
    tally__out_printf(o,
                      ",\"private\":true,\"asleep\":%s,\"offloaded\":%s,\"mapped_bytes\":%llu,\"sleeping_bytes\":%llu,"
                      "\"sleeping_blocks\":%llu,\"unmapped_bytes\":%llu,\"offload_bytes\":%llu,\"kept_pinned_bytes\":%llu,"
                      "\"sleeps\":%llu,\"wakes\":%llu}",
                      in->asleep ? "true" : "false", in->offloaded ? "true" : "false",
                      (unsigned long long)in->reserved, (unsigned long long)in->sleeping,
                      (unsigned long long)in->sleeping_blocks, (unsigned long long)in->unmapped,
                      (unsigned long long)in->offload, (unsigned long long)in->kept, (unsigned long long)in->sleeps,
                      (unsigned long long)in->wakes);
    *first = false;
}

void tally__report_private_json(tally_out_t *o)
{
    bool first = true;
    tally__out_puts(o, "\"private_tags\":[");
    each(o, -1, json_row, &first);
    tally__out_puts(o, "],\n");
}

static void count_row(tally_out_t *o, int device, uint32_t tag, const tally_ppool_info_t *in, bool *first)
{
    (void)device, (void)tag, (void)first;
    uint64_t *acc = (uint64_t *)(void *)o;
    acc[0] += in->sleeping;
    acc[1] += in->sleeping_blocks;
}

void tally__private_sleeping(uint64_t *bytes, uint64_t *blocks)
{
    uint64_t acc[2] = {0, 0};
    bool first = true;
    each((tally_out_t *)(void *)acc, -1, count_row, &first);
    *bytes = acc[0];
    *blocks = acc[1];
}
