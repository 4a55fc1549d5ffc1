/* Allocation traces (op,id,size,stream CSV, /work/shared/traces/README.md):
 * reading, checking and turning them into a dense event list the replay and
 * the hot-path benchmark use. Shared by bench/replay.c and bench/hotpath.c. */
#ifndef TALLY_BENCH_TRACE_H
#define TALLY_BENCH_TRACE_H

#include <stddef.h>
#include <stdint.h>

typedef struct trace_event {
    uint64_t size;   /* bytes asked for (allocations; frees carry their block's) */
    uint32_t slot;   /* dense allocation number: frees name the slot they release */
    uint16_t stream; /* dense stream index (0 = the trace's stream id 0, if present) */
    char op;         /* 'a' or 'f' */
} trace_event_t;

typedef struct trace {
    char path[1024];
    const char *name;        /* file name part of path */
    trace_event_t *ev;
    size_t nev;
    size_t nalloc;           /* allocation events = slots */
    size_t nfree;
    size_t nstreams;
    long long stream_ids[64]; /* stream id of each dense index */
} trace_t;

/* Read and check path. On error returns -1 with "file:line: what" in err
 * (malformed line, unknown op, free of an id that is not live, allocation of
 * an id already live, a free whose size disagrees with its allocation). */
int trace_load(const char *path, trace_t *t, char *err, size_t errlen);
void trace_free(trace_t *t);

/* Sizes of every allocation event of the .csv files in dir (sorted by file
 * name), appended to *sizes / *n (grown with realloc). Returns the number of
 * files read, or -1 with err set. */
int trace_dir_sizes(const char *dir, uint64_t **sizes, size_t *n, size_t *cap, char *err, size_t errlen);

/* The .csv files of dir, sorted, as malloc'ed paths; returns the count or -1. */
int trace_dir_list(const char *dir, char ***paths, char *err, size_t errlen);

#endif
