/* A model of RAPIDS RMM's pool_memory_resource (the pool a RAPIDS user puts
 * under PyTorch with rmm_torch_allocator), for bench's rmm-pool-model: its
 * placement and its growth, replayed on an allocation trace, so that the
 * memory it reserves can be set beside tally's and PyTorch's without a GPU
 * (RMM is not packaged in Debian, so it cannot run here or in CI).
 * tools/rmm_pool.c gives the rules and the RMM source each one is read from. */
#ifndef TALLY_TOOLS_RMM_POOL_H
#define TALLY_TOOLS_RMM_POOL_H

#include "../bench/trace.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct rmm_opts {
    uint64_t initial;  /* initial_pool_size (bytes, a multiple of 256; 0: none) */
    uint64_t maximum;  /* maximum_pool_size (a multiple of 256); 0: none (RMM's std::nullopt) */
    uint64_t capacity; /* device memory: an upstream allocation past it fails */
} rmm_opts_t;

typedef struct rmm_result {
    int64_t peak_reserved;   /* the pool's size at its largest (RMM's pool_size()) */
    int64_t upstream_allocs; /* upstream allocations made (cudaMalloc under cuda_memory_resource) */
    int64_t upstream_failed; /* upstream allocations refused (a larger try, halved after) */
    int64_t event_records;   /* cudaEventRecord: one per deallocation */
    int64_t stream_waits;    /* cudaStreamWaitEvent: a block taken from, or a list merged from, another stream */
    int64_t streams;         /* events made: one per stream seen */
    size_t most_free;        /* the longest free list walked (RMM's lists are searched end to end) */
    long oom_event;          /* first refused allocation, -1 if none */
} rmm_result_t;

/* Replay t through the model with o. where, when given, gets the address
 * of each allocation (t->nalloc values; the first upstream allocation
 * starts at 2^40). Returns 0 (an allocation the pool cannot serve ends the
 * replay with r->oom_event set), or -1 when o is not a setting RMM accepts
 * or the host runs out of memory (err says which). */
int rmm_replay(const trace_t *t, const rmm_opts_t *o, rmm_result_t *r, uint64_t *where, char *err, size_t errlen);

/* The least pool, a multiple of step bytes, that serves all of t when made
 * whole at the start (initial_pool_size = maximum_pool_size): the setting a
 * user who knows the job's memory gives RMM, its best case. Found by
 * bisection from the peak live bytes up, then checked. 0 with err set when
 * no pool up to o->capacity serves it, -1 on a bad setting or out of host
 * memory. */
int64_t rmm_least_pool(const trace_t *t, uint64_t step, uint64_t capacity, char *err, size_t errlen);

#endif
