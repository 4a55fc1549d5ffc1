/* The allocation trace (trace:true): every allocation and free of each
 * device, in order, with time, size and stream, kept in full (not a ring)
 * so that `tally tune` can replay the whole job from the JSON report. One
 * 32-byte record per event, appended under the device lock; the array
 * doubles in tally's metadata heap. Off by default: the hook is then one
 * predictable branch. */
#include "ledger.h"

#include <string.h>

typedef struct trace_rec {
    uint64_t time_us;
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
    r->time_us = tally__now_us();
    r->seq = b->seq;
    r->size = b->requested;
    r->stream = stream_index(t, b->stream);
    r->op = alloc ? 1 : 0;
}

/* {"device":D,"total_bytes":M,"streams":[...],"start_us":T,"events":[dt,id,size,stream,...]}:
 * dt in microseconds since the previous event, id > 0 allocates block id,
 * id < 0 frees block -id. */
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
    tally__out_printf(o, "],\"start_us\":%llu,\"events\":[", (unsigned long long)t->rec[0].time_us);
    uint64_t prev = t->rec[0].time_us;
    for (size_t i = 0; i < t->n; i++) {
        const trace_rec_t *r = &t->rec[i];
        uint64_t dt = r->time_us >= prev ? r->time_us - prev : 0;
        prev = r->time_us;
        tally__out_printf(o, "%s%llu,%s%llu,%llu,%u", i ? (i % 8 ? "," : ",\n") : "", (unsigned long long)dt,
                          r->op ? "" : "-", (unsigned long long)r->seq, (unsigned long long)r->size, r->stream);
    }
    tally__out_puts(o, "]}");
}
