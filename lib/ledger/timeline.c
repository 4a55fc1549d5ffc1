/* The event timeline (timeline:true): a ring of the last N events per
 * device (allocations, frees, segment changes, OOMs, stage boundaries) with
 * the device totals after each, for plots and snapshot export. Off by
 * default; when off the hook is one predictable branch. */
#include "ledger/ledger.h"

#include <string.h>
#include <time.h>

typedef struct timeline {
    tally_event_rec_t *ring;
    size_t cap, next, count;
    uint64_t recorded; /* every event ever recorded; recorded - count were overwritten */
} timeline_t;

static timeline_t timelines[TALLY_MAX_DEVICES];

uint64_t tally__now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

void tally__timeline_record_locked(tally_device_t *d, int action, uintptr_t addr, size_t size, void *stream,
                                   uint32_t tag, uint32_t stage, const tally_site_t *site)
{
    timeline_t *t = &timelines[d->id];
    if (!t->ring) {
        size_t cap = (size_t)tally__opt.timeline_events;
        t->ring = tally__meta_alloc(cap * sizeof *t->ring);
        if (!t->ring)
            return;
        t->cap = cap;
    }
    tally_event_rec_t *e = &t->ring[t->next];
    t->next = (t->next + 1) % t->cap;
    if (t->count < t->cap)
        t->count++;
    t->recorded++;
    e->time_us = tally__now_us();
    e->action = (uint8_t)action;
    e->addr = addr;
    e->size = size;
    e->stream = stream;
    e->tag = tag;
    e->stage = stage;
    e->site = site;
    e->allocated = tally__stat_all_current(d->stats.allocated_bytes);
    e->reserved = tally__stat_all_current(d->stats.reserved_bytes);
}

uint64_t tally__timeline_dropped_locked(tally_device_t *d)
{
    timeline_t *t = &timelines[d->id];
    return t->recorded - t->count;
}

size_t tally__timeline_copy_locked(tally_device_t *d, tally_event_rec_t *out, size_t max)
{
    timeline_t *t = &timelines[d->id];
    if (!t->ring)
        return 0;
    size_t n = t->count < max ? t->count : max;
    size_t start = (t->next + t->cap - t->count) % (t->cap ? t->cap : 1);
    /* Oldest first; when max < count, the newest max events. */
    size_t skip = t->count - n;
    for (size_t i = 0; i < n; i++)
        out[i] = t->ring[(start + skip + i) % t->cap];
    return n;
}
