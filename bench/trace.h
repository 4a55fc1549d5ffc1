/* Allocation traces (op,id,size,stream CSV, /work/shared/traces/README.md):
 * reading, checking and turning them into a dense event list the replay and
 * the hot-path benchmark use. Shared by bench/replay.c and bench/hotpath.c. */
#ifndef TALLY_BENCH_TRACE_H
#define TALLY_BENCH_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include <tally.h>

typedef struct trace_event {
    uint64_t size;   /* bytes asked for (allocations; frees carry their block's) */
    uint32_t slot;   /* dense allocation number: frees name the slot they release */
    uint16_t stream; /* dense stream index (0 = the trace's stream id 0, if present) */
    char op;         /* 'a', 'f', or 'e': a release of cached memory (empty_cache; tally tune's snapshots) */
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

/* Building a trace event by event (what trace_load does for a CSV; tally
 * tune does it for PyTorch snapshots and tally reports): trace_begin, then
 * trace_add per event, then trace_end (or trace_free on error). */
typedef struct trace_builder {
    trace_t *t;
    void *live; /* live ids: id -> (slot, size) */
    size_t cap; /* events allocated in t->ev */
    uint64_t live_bytes; /* bytes live after the events so far (at most INT64_MAX) */
} trace_builder_t;

int trace_begin(trace_builder_t *b, trace_t *t, const char *path, char *err, size_t errlen);
/* One event: op 'a' (allocate id with size), 'f' (free id; size 0 or the
 * allocation's) or 'e' (release cached memory; id, size, stream ignored).
 * An allocation that takes the live bytes past INT64_MAX is refused: every
 * figure a replay derives from the trace is an int64_t. On error returns -1
 * with "what" in err (no file or line). */
int trace_add(trace_builder_t *b, char op, uint64_t id, uint64_t size, uint64_t stream, char *err, size_t errlen);
/* Whether id is live in the trace built so far. */
int trace_is_live(const trace_builder_t *b, uint64_t id);
void trace_end(trace_builder_t *b);

/* Read and check path. On error returns -1 with "file:line: what" in err
 * (malformed line, unknown op, free of an id that is not live, allocation of
 * an id already live, a free whose size disagrees with its allocation). */
int trace_load(const char *path, trace_t *t, char *err, size_t errlen);
void trace_free(trace_t *t);

/* A new non-blocking stream of device 0, made in its primary context through
 * the CUDA driver this process has loaded (the stand-in, or a real driver,
 * under the cuda backend), as a program would make one; NULL when no
 * driver is loaded or it refuses. */
void *trace_cuda_stream(void);

/* Replay t once through tally on device 0 (tally_replay and tally tune):
 * each 'a' is tally_malloc(size, 0, stream) (stream id 0 is the default
 * stream, NULL; others distinct fake pointers, or under the cuda backend
 * real streams, trace_cuda_stream, made once per index and process, so that
 * tally can wait for them), each 'f' a tally_free, each
 * 'e' a tally_empty_cache(0).
 * ptrs holds t->nalloc pointers, NULL on entry; blocks left live stay in it.
 * after(arg, i), when given, runs after event i. Returns the index of the
 * first allocation tally refused, or -1. */
long trace_run(const trace_t *t, void **ptrs, void (*after)(void *arg, size_t i), void *arg);

/* What the host backend was asked between two readings of tally_host_calls
 * (after - before, field by field). */
tally_host_calls_t trace_calls_since(const tally_host_calls_t *before, const tally_host_calls_t *after);

/* Sizes of every allocation event of the .csv files in dir (sorted by file
 * name), appended to *sizes / *n (grown with realloc). Returns the number of
 * files read, or -1 with err set. */
int trace_dir_sizes(const char *dir, uint64_t **sizes, size_t *n, size_t *cap, char *err, size_t errlen);

/* The step of a repeating trace, in allocations: the smallest shift P at
 * which the sequence of allocation sizes agrees with itself shifted by P
 * nearly as often as at the best shift (within 2 points of the best
 * fraction, which must be at least one half; P <= half the allocations).
 * 0 when the trace does not repeat. */
size_t trace_period(const trace_t *t);

/* The most bytes live at once over t (its allocations' sizes as asked). */
uint64_t trace_peak_live(const trace_t *t);

/* The .csv files of dir, sorted, as malloc'ed paths; returns the count or -1. */
int trace_dir_list(const char *dir, char ***paths, char *err, size_t errlen);

/* run(path) for each of paths[0..n-1], a directory standing for its .csv
 * files (trace_dir_list). Returns how many runs failed (run returned
 * nonzero), or -1 when a directory cannot be read ("prog: why" on stderr). */
int trace_each_path(const char *prog, char **paths, int n, int (*run)(const char *path));

#endif
