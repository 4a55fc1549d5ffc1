/* A model of PyTorch's own expandable segments (expandable_segments:True in
 * PyTorch's CUDACachingAllocator, torch 2.4 to 2.11), for tally tune's
 * PyTorch rows and bench's pt-expand-model (tools/pt_expand.c has the rules).
 * Not tally's placement: tally's expandable segments map 2 MiB pages and
 * move idle pages under pressure; this is what PyTorch itself would do. */
#ifndef TALLY_TOOLS_PT_EXPAND_H
#define TALLY_TOOLS_PT_EXPAND_H

#include "../bench/trace.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct ptx_opts {
    uint64_t capacity;   /* device memory: mapping past it releases cached pages, then fails */
    uint64_t large_page; /* the large pool's page (large_segment_size_mb); 0: 20 MiB */
} ptx_opts_t;

/* Memory mapped before the replay begins (a snapshot's recorded state):
 * ranges of one pool and stream, and the blocks live in them. */
typedef struct ptx_range {
    uint64_t addr, size;
    uint64_t stream; /* the trace's stream id */
    bool small;      /* small pool (2 MiB pages) */
} ptx_range_t;

typedef struct ptx_live {
    uint64_t addr, size; /* the block: its address and rounded size */
    uint32_t slot;       /* the trace's allocation it is */
} ptx_live_t;

typedef struct ptx_start {
    const ptx_range_t *ranges;
    size_t nranges;
    const ptx_live_t *live;
    size_t nlive;
    size_t skip; /* the trace's first events that those blocks stand for */
} ptx_start_t;

typedef struct ptx_result {
    int64_t peak_reserved;
    int64_t pages_mapped, pages_unmapped; /* PyTorch's num_device_alloc / num_device_free */
    int64_t map_calls;                    /* runs of pages mapped in one go */
    int64_t unmap_calls;                  /* runs of pages unmapped in one go */
    int64_t segments;                     /* address ranges reserved (one per pool and stream) */
    long oom_event;                       /* first refused allocation, -1 if none */
} ptx_result_t;

/* Replay t through the model. reserved, when given, gets the mapped bytes
 * after each event (t->nev values). start may be NULL (an empty device).
 * Returns 0, or -1 when a start block lies outside its ranges or the host
 * runs out of memory (err says which). */
int ptx_replay(const trace_t *t, const ptx_opts_t *o, const ptx_start_t *start, ptx_result_t *r, int64_t *reserved,
               char *err, size_t errlen);

#endif
