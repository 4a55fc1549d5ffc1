/* Stages: a process-wide stack of named phases ("load", "train", "eval").
 * A block belongs to the innermost stage when it is allocated. When a stage
 * ends, its survivors (blocks allocated during it, nested stages included,
 * still live) are grouped by tag and device, largest first, leaving out
 * persistent tags; cached segments may be released; and a record (wall time,
 * peaks, survivors, released bytes) joins a bounded history.
 *
 * Lock order: stage_lock, then one device lock at a time. */
#include "ledger/stage.h"

#include <stdlib.h>
#include <string.h>

#define STAGE_DEPTH 64

typedef struct stage_frame {
    uint32_t id;
    uint64_t t0_us;
    uint32_t epoch;
    uint64_t mark; /* the caller's, from the begin (tally__stage_end gives it back) */
    int64_t saved_alloc[TALLY_MAX_DEVICES], saved_reserved[TALLY_MAX_DEVICES];
} stage_frame_t;

static tally_mutex_t stage_lock = TALLY_MUTEX_INIT;
tally_mutex_t *tally__stage_lock(void) { return &stage_lock; }
static stage_frame_t frames[STAGE_DEPTH];
static int depth;
static tally_stage_rec_t history[TALLY_STAGE_HISTORY];
static uint64_t history_total;
static uint32_t epochs; /* stage begins so far */

int tally__stage_begin(const char *name, uint64_t mark)
{
    uint32_t id;
    int rc = tally__intern_stage(name, &id);
    if (rc)
        return tally__fail(-rc, "tally_stage_begin: %s", tally_last_error());
    tally__mutex_lock(&stage_lock);
    if (depth == STAGE_DEPTH) {
        tally__mutex_unlock(&stage_lock);
        return tally__fail(TALLY_ESTATE, "tally_stage_begin: '%s': stages nested more than %d deep", name,
                           STAGE_DEPTH);
    }
    stage_frame_t *f = &frames[depth];
    f->id = id;
    f->t0_us = tally__now_us();
    f->epoch = ++epochs;
    f->mark = mark;
    /* From here on, new blocks carry this stage instance; survivors are the
     * live blocks with an epoch at or after it (nested stages begin later). */
    atomic_store(&tally__current_stage, (uint64_t)f->epoch << 32 | id);
    for (int i = 0; i < tally__g.ndev; i++) {
        tally_device_t *d = tally__g.dev[i];
        tally__dev_lock(&d->lock);
        /* The enclosing stage's running peaks are parked here and restored
         * (maxed with this stage's) when this one ends. */
        tally__cache_peaks_locked(d); /* the enclosing window's allocated peak, before it is parked */
        f->saved_alloc[i] = d->win_alloc;
        f->saved_reserved[i] = d->win_reserved;
        d->win_alloc = tally__stat_all_current(d->stats.allocated_bytes);
        d->win_reserved = tally__stat_all_current(d->stats.reserved_bytes);
        tally__timeline_locked(d, TALLY_EV_STAGE_BEGIN, 0, 0, NULL);
        tally__dev_unlock(&d->lock);
    }
    depth++;
    tally__mutex_unlock(&stage_lock);
    return 0;
}

typedef struct groups {
    tally_survivor_t *items;
    uint32_t n, cap;
    bool failed;
} groups_t;

static void group_add(groups_t *g, uint32_t tag, int device, const tally_site_t *site, uint64_t bytes)
{
    for (uint32_t i = 0; i < g->n; i++) {
        if (g->items[i].tag == tag && g->items[i].device == device && g->items[i].site == site) {
            g->items[i].bytes += bytes;
            g->items[i].blocks++;
            return;
        }
    }
    if (g->n == g->cap) {
        uint32_t cap = g->cap ? g->cap * 2 : 16;
        tally_survivor_t *grown = tally__meta_alloc(cap * sizeof *grown);
        if (!grown) {
            g->failed = true;
            return;
        }
        if (g->n)
            memcpy(grown, g->items, g->n * sizeof *grown);
        tally__meta_free(g->items);
        g->items = grown;
        g->cap = cap;
    }
    g->items[g->n++] = (tally_survivor_t){tag, device, site, bytes, 1};
}

static int by_bytes_desc(const void *a, const void *b)
{
    const tally_survivor_t *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes < y->bytes ? 1 : -1;
    if (x->device != y->device)
        return x->device < y->device ? -1 : 1;
    return x->tag < y->tag ? -1 : x->tag > y->tag;
}

int tally__stage_end(const char *name, void (*report)(const tally_stage_rec_t *rec), uint64_t *mark)
{
    tally__mutex_lock(&stage_lock);
    if (depth == 0) {
        tally__mutex_unlock(&stage_lock);
        return tally__fail(TALLY_ESTATE, "tally_stage_end: '%s': no stage has begun", name);
    }
    stage_frame_t *f = &frames[depth - 1];
    const char *inner = tally__stage_name(f->id);
    if (strcmp(inner, name) != 0) {
        tally__mutex_unlock(&stage_lock);
        return tally__fail(TALLY_ESTATE, "tally_stage_end: '%s' is not the innermost stage (that is '%s')", name,
                           inner);
    }
    tally_stage_rec_t rec;
    memset(&rec, 0, sizeof rec);
    rec.id = f->id;
    rec.depth = depth;
    rec.begin_us = f->t0_us;
    rec.seq = ++history_total;
    groups_t g = {0};
    for (int i = 0; i < tally__g.ndev; i++) {
        tally_device_t *d = tally__g.dev[i];
        tally__dev_lock(&d->lock);
        tally__cache_peaks_locked(d); /* the window's allocated peak, before it is read */
        rec.peak_allocated += d->win_alloc;
        rec.peak_reserved += d->win_reserved;
        if (f->saved_alloc[i] > d->win_alloc)
            d->win_alloc = f->saved_alloc[i];
        if (f->saved_reserved[i] > d->win_reserved)
            d->win_reserved = f->saved_reserved[i];
        for (size_t k = 0; k <= d->map.mask; k++) {
            tally_block_t *b = d->map.slots[k].key ? d->map.slots[k].val : NULL;
            if (b && b->epoch >= f->epoch)
                group_add(&g, b->tag, i, b->site, b->size);
        }
        tally__timeline_locked(d, TALLY_EV_STAGE_END, 0, 0, NULL);
        tally__dev_unlock(&d->lock);
    }
    /* Persistent tags are expected to outlive the stage. */
    uint32_t kept = 0;
    for (uint32_t i = 0; i < g.n; i++)
        if (!tally__tag_is_persistent(g.items[i].tag))
            g.items[kept++] = g.items[i];
    g.n = kept;
    if (g.n) /* items is NULL when nothing survived */
        qsort(g.items, g.n, sizeof *g.items, by_bytes_desc);
    for (uint32_t i = 0; i < g.n; i++) {
        rec.survivor_bytes += g.items[i].bytes;
        rec.survivor_blocks += g.items[i].blocks;
    }
    rec.surv = g.items;
    rec.nsurv = g.n;
    if (mark)
        *mark = f->mark;
    depth--;
    atomic_store(&tally__current_stage,
                 depth ? (uint64_t)frames[depth - 1].epoch << 32 | frames[depth - 1].id : TALLY_STAGE_NONE);
    if (TALLY_OPT(release_at_stage_end)) {
        for (int i = 0; i < tally__g.ndev; i++) {
            tally_device_t *d = tally__g.dev[i];
            tally__dev_lock(&d->lock);
            rec.released += tally__cache_release_all_locked(d);
            rec.reserved_after += (uint64_t)tally__stat_all_current(d->stats.reserved_bytes);
            tally__dev_unlock(&d->lock);
        }
    }
    rec.wall_us = tally__now_us() - rec.begin_us;
    tally_stage_rec_t *slot = &history[(rec.seq - 1) % TALLY_STAGE_HISTORY];
    tally__meta_free(slot->surv);
    *slot = rec;
    if (report)
        report(slot);
    tally__mutex_unlock(&stage_lock);
    return 0;
}

void tally__stage_history(void (*fn)(const tally_stage_rec_t *, void *), void *arg, uint64_t *total)
{
    tally__mutex_lock(&stage_lock);
    uint64_t n = history_total < TALLY_STAGE_HISTORY ? history_total : TALLY_STAGE_HISTORY;
    for (uint64_t k = history_total - n; k < history_total; k++)
        fn(&history[k % TALLY_STAGE_HISTORY], arg);
    if (total)
        *total = history_total;
    tally__mutex_unlock(&stage_lock);
}

int tally__stage_open(uint32_t *ids, int max)
{
    tally__mutex_lock(&stage_lock);
    int n = depth < max ? depth : max;
    for (int i = 0; i < n; i++)
        ids[i] = frames[i].id;
    tally__mutex_unlock(&stage_lock);
    return n;
}
