/* The ledger's two recorders of events, both off by default (each hook is
 * then one predictable branch).
 *
 * The event timeline (timeline:true): a ring of the last N events per
 * device (allocations, frees, segment changes, OOMs, stage boundaries) with
 * the device totals after each, for plots and snapshot export.
 *
 * The allocation trace (trace:true): every allocation and free of each
 * device, in order, with time, size and stream, kept in full (not a ring)
 * so that `tally tune` can replay the whole job from the JSON report. One
 * 32-byte record per event, appended under the device lock; the array
 * doubles in tally's metadata heap. Its time: on x86 the record keeps the
 * time-stamp counter (about 20 ns to read here, against about 100 ns for
 * clock_gettime), converted to microseconds when the report is written,
 * from the counter and the clock read at the first event and again at
 * writing (an invariant TSC runs at a constant rate). Elsewhere it keeps
 * clock_gettime's microseconds. */
#include "ledger/ledger.h"

#include <string.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

/* ---- the event timeline -------------------------------------------------- */

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

/* ---- the allocation trace ------------------------------------------------ */

#if defined(__x86_64__) || defined(__i386__)
#define TICKS_ARE_US 0
static uint64_t ticks(void)
{
    return __rdtsc();
}
#else
#define TICKS_ARE_US 1
static uint64_t ticks(void)
{
    return tally__now_us();
}
#endif

typedef struct trace_rec {
    uint64_t ticks;
    uint64_t seq;  /* the block's allocation number (ids in the report) */
    uint64_t size; /* bytes asked for */
    uint32_t stream; /* index into the device's stream list */
    uint32_t op;     /* 1 allocate, 0 free */
} trace_rec_t;

#define TRACE_STREAMS 64

typedef struct dev_trace {
    trace_rec_t *rec;
    size_t n, cap;
    void *streams[TRACE_STREAMS]; /* the last slot takes every further stream */
    uint32_t nstreams;
    size_t total_bytes; /* the device's memory, asked at the first event */
    uint64_t tick0, us0; /* ticks() and the clock at the first event */
} dev_trace_t;

static dev_trace_t traces[TALLY_MAX_DEVICES];

static uint32_t stream_index(dev_trace_t *t, void *stream)
{
    for (uint32_t i = 0; i < t->nstreams; i++)
        if (t->streams[i] == stream)
            return i;
    if (t->nstreams == TRACE_STREAMS)
        return TRACE_STREAMS - 1;
    t->streams[t->nstreams] = stream;
    return t->nstreams++;
}

void tally__trace_record_locked(tally_device_t *d, int alloc, const tally_block_t *b)
{
    dev_trace_t *t = &traces[d->id];
    if (!t->n && !t->total_bytes) {
        t->us0 = tally__now_us();
        t->tick0 = ticks();
        size_t free_bytes = 0;
        if (tally__g.backend->mem_info(d->id, &free_bytes, &t->total_bytes))
            t->total_bytes = 0;
    }
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 4096;
        trace_rec_t *grown = tally__meta_alloc(cap * sizeof *grown);
        if (!grown)
            return; /* the report says how many events it holds; a gap shows there */
        if (t->n)
            memcpy(grown, t->rec, t->n * sizeof *grown);
        tally__meta_free(t->rec);
        t->rec = grown;
        t->cap = cap;
    }
    trace_rec_t *r = &t->rec[t->n++];
    r->ticks = ticks();
    r->seq = b->seq;
    r->size = b->requested;
    r->stream = stream_index(t, b->stream);
    r->op = alloc ? 1 : 0;
}

/* {"device":D,"total_bytes":M,"streams":[...],"start_us":T,"events":"dt,id,size,stream dt,id,..."}:
 * one string (a reader holds it as one value, not four per event), events
 * separated by spaces; dt in microseconds since the previous event, id > 0
 * allocates block id, id < 0 frees block -id. */
void tally__trace_write_locked(tally_device_t *d, tally_out_t *o, bool *first)
{
    dev_trace_t *t = &traces[d->id];
    if (!t->n)
        return;
    tally__out_printf(o, "%s\n {\"device\":%d,\"total_bytes\":%zu,\"streams\":[", *first ? "" : ",", d->id,
                      t->total_bytes);
    *first = false;
    for (uint32_t i = 0; i < t->nstreams; i++)
        tally__out_printf(o, "%s%llu", i ? "," : "", (unsigned long long)(uintptr_t)t->streams[i]);
    /* Microseconds per tick, from the first event to now. */
    uint64_t now_us = tally__now_us(), now_ticks = ticks();
    double rate = TICKS_ARE_US ? 1.0
                  : now_ticks > t->tick0 && now_us > t->us0 ? (double)(now_us - t->us0) / (double)(now_ticks - t->tick0)
                                                            : 0.0;
    uint64_t prev = 0;
    for (size_t i = 0; i < t->n; i++) {
        const trace_rec_t *r = &t->rec[i];
        /* Signed: another CPU's counter may lag the first event's by a little. */
        double off = (double)(int64_t)(r->ticks - t->tick0) * rate;
        uint64_t us = off > 0 ? t->us0 + (uint64_t)off : t->us0;
        if (i == 0)
            tally__out_printf(o, "],\"start_us\":%llu,\"events\":\"", (unsigned long long)us);
        uint64_t dt = i && us >= prev ? us - prev : 0;
        prev = us;
        tally__out_printf(o, "%s%llu,%s%llu,%llu,%u", i ? " " : "", (unsigned long long)dt, r->op ? "" : "-",
                          (unsigned long long)r->seq, (unsigned long long)r->size, r->stream);
    }
    tally__out_puts(o, "\"}");
}
