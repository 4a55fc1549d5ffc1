/* tally tune: replay a job's allocations under candidate settings and
 * recommend the one that reserves least (docs/tune.md).
 *
 *   tune_input.c    the three inputs (CSV trace, PyTorch snapshot pickle,
 *                   tally JSON report with trace:true) as one trace_t
 *   tune_input_report.c
 *                   a tally report's alloc_trace read into that trace_t
 *   tune_run.c      the candidate settings, chosen from the trace, and
 *                   their replays in forked worker processes
 *   tune_run_replay.c
 *                   one replay in this process, and its driver time
 *   tune.c          the command: options, the replays, the recommendation
 *   tune_output.c   what it writes: table, JSON, recommendation lines, plot
 *   pickle.c        the plain-data pickle reader */
#ifndef TALLY_TOOLS_TUNE_H
#define TALLY_TOOLS_TUNE_H

#include "../bench/trace.h"
#include "pickle.h"
#include "pt_expand.h"

#include <tally.h>

#include <stdbool.h>
#include <stdint.h>

/* What a snapshot says was reserved when recording began (docs/tune.md,
 * "The recorded state"): the segments then, their pools and streams, and
 * the blocks live in them, by address. */
typedef struct tune_start {
    ptx_range_t *ranges; /* segments (or an expandable recording's mapped ranges) at the start */
    size_t nranges;
    ptx_live_t *live;    /* blocks live at the start: address, rounded size, the trace's slot */
    size_t nlive;
    bool expandable;     /* recorded with expandable segments */
    bool known;          /* the snapshot carried the state (a snapshot); false: CSV or report */
    char gap[240];       /* what the snapshot could not carry, "" when nothing */
} tune_start_t;

typedef struct tune_input {
    trace_t trace;
    const char *kind;         /* "CSV trace", "PyTorch snapshot", "tally report" */
    size_t prelive;           /* allocations live before recording started (snapshot) */
    bool has_recorded;        /* a PyTorch snapshot: PyTorch's own reserved figures */
    int64_t recorded_peak;    /* recorded_peak_reserved_bytes (docs/tune.md) */
    int64_t recorded_start;   /* reserved when recording began */
    int64_t recorded_segment_allocs;
    char recorded_conf[512];  /* allocator_settings.PYTORCH_CUDA_ALLOC_CONF */
    int64_t capacity;         /* device memory from a report; 0 if unknown */
    int device;               /* the device whose allocations were taken */
    size_t releases;          /* 'e' events: segment_free runs replayed as releases */
    tune_start_t start;       /* the recorded state (snapshots) */
} tune_input_t;

/* Read FILE, whichever of the three it is (by its first bytes), taking the
 * allocations of device (-1: the device with the most events). On error
 * -1 with one line in err naming the file and the problem. */
int tune_input_load(const char *path, int device, tune_input_t *in, char *err, size_t errlen);
void tune_input_free(tune_input_t *in);
/* A PyTorch snapshot pickle already in memory (data is taken over and
 * freed); name is for messages. The fuzz target's entry (fuzz_tune_input). */
int tune_snapshot_parse(unsigned char *data, size_t len, const char *name, tune_input_t *in, char *err,
                        size_t errlen);

/* Which allocator's rules a row replays. */
enum {
    TUNE_BOTH,      /* PyTorch's keys on the default placement: PyTorch and tally place alike (tally runs it) */
    TUNE_TALLY,     /* tally's own placement or keys: only tally (TALLY_CONF) */
    TUNE_PT_EXPAND, /* PyTorch's own expandable segments: the model of tools/pt_expand.c */
};

/* One candidate and what its replay gave. */
typedef struct tune_row {
    char setting[160];     /* PYTORCH_CUDA_ALLOC_CONF / TALLY_CONF keys; "" = PyTorch's default */
    bool tally_only;       /* a key PyTorch does not have (write it as TALLY_CONF) */
    int engine;            /* TUNE_BOTH, TUNE_TALLY or TUNE_PT_EXPAND */
    bool from_start;       /* replayed from the recorded state (tune_input_t.start) */
    const char *why;       /* one phrase: where the candidate comes from */
    /* results */
    bool ok;               /* the replay ran (false: the worker failed) */
    long oom_event;        /* first refused allocation at --capacity, -1 if none */
    int64_t peak_reserved, peak_live, backend_calls, num_device_alloc;
    /* What the driver did, for its modelled time (tune_driver_us). tally's
     * rows: the calls its host backend was asked over the replayed window
     * (tally_host_calls, after less before), which give the cuda backend's
     * driver calls one for one (bench/replay.c). PyTorch's model rows
     * (TUNE_PT_EXPAND): runs of pages mapped and unmapped, the pages in
     * them, and the ranges reserved. */
    tally_host_calls_t host;
    int64_t map_runs, unmap_runs, pages_mapped, pages_unmapped, ranges;
    /* The least device memory it runs in (bisection of replays), and where
     * it runs out with less: at out_capacity, event out_event of out_size. */
    int64_t min_bytes;     /* 0: not found (min_lower is then a lower bound) */
    int64_t min_lower;
    int64_t out_capacity;
    long out_event;        /* -1: none known */
    /* What empty_cache gives back (tune_run.c, measure_kept): the reserved
     * bytes just after an empty_cache at each cut k/TUNE_KEPT_CUTS of the
     * window (k = 1 .. TUNE_KEPT_CUTS - 1), each a replay of its own,
     * summed; and the bytes live at those cuts, summed. kept_live 0: not
     * measured (the row ran out of memory, or the window is too short). */
    int64_t kept, kept_live;
    int64_t reserved_end; /* reserved bytes after the replay's last event */
    double seconds;
    char error[200];
} tune_row_t;

#define TUNE_KEPT_CUTS 10

/* A row's kept / kept_live, or 0 when not measured. */
double tune_kept_ratio(const tune_row_t *r);

/* The modelled driver time of r's calls in microseconds, on column
 * (SI_COST_A100 or SI_COST_BLACKWELL of tests/standin/cost.h). */
double tune_driver_us(const tune_row_t *r, int column);

/* The grid for t: PyTorch's default first. Returns the count (<= max). */
size_t tune_grid(const trace_t *t, uint64_t capacity, tune_row_t *rows, size_t max);

/* Reserved over time of one replay, for --plot: one point per event. */
typedef struct tune_series {
    int64_t *reserved; /* nev values */
    size_t n;
} tune_series_t;

/* Replay t under each row's setting in up to jobs worker processes (each
 * configuration needs its own allocator, options being process-wide),
 * with a progress line on stderr unless quiet. series, when given, receives
 * the reserved-over-time of rows want[0..nwant). Returns 0, or -1 with err. */
int tune_run(const trace_t *t, uint64_t capacity, tune_row_t *rows, size_t nrows, int jobs, bool quiet,
             const size_t *want, size_t nwant, tune_series_t *series, char *err, size_t errlen);
/* As tune_run, with the recorded state for rows with from_start, and with
 * the least memory of each row searched for, and what empty_cache keeps
 * measured (kept), when search is set. */
int tune_run_ex(const trace_t *t, const tune_start_t *start, uint64_t capacity, bool search, tune_row_t *rows,
                size_t nrows, int jobs, bool quiet, const size_t *want, size_t nwant, tune_series_t *series, char *err,
                size_t errlen);
/* tune_run_replay.c, for tune_run.c's workers: one replay of r's setting
 * with capacity bytes of device memory in this process (from the recorded
 * state when r->from_start; the reserved bytes after each event into
 * series when given), and a monotonic clock in seconds. */
void tune_replay_one(const trace_t *t, const tune_start_t *start, uint64_t capacity, tune_row_t *r, int64_t *series);
double tune_now_s(void);

/* A tally JSON report's alloc_trace (tune_input_report.c; _load reads the
 * file in tune_input.c); as tune_input_load. _parse reads text[0..len)
 * (not taken over); name is for messages. */
int tune_report_load(const char *path, int device, tune_input_t *in, char *err, size_t errlen);
int tune_report_parse(const char *text, size_t len, const char *name, int device, tune_input_t *in, char *err,
                      size_t errlen);

/* tune_input.c's, shared with tune_input_report.c: a device's events and
 * the allocations live before recording began (a snapshot's frees of
 * addresses not live, a report's frees of blocks never allocated), which
 * the readers place first. */
typedef struct tune_prelive {
    uint64_t addr, size, stream;
    uint64_t block; /* the block's rounded size where the snapshot gives it, else 0 */
} tune_prelive_t;

typedef struct tune_snap_events {
    const pk_value_t *ev; /* the device's trace list */
    tune_prelive_t *pre;
    size_t npre, cappre;
    /* Frees PyTorch completed later than the user asked (a block used on
     * another stream: reusable only once that stream's work was done):
     * defer[i] on the free_requested, fire[j] on its free_completed, where
     * the replay frees it. NULL when there are none. */
    unsigned char *defer, *fire;
} tune_snap_events_t;
/* One more allocation live before recording in s; -1 when out of memory. */
int tune_add_prelive(tune_snap_events_t *s, uint64_t addr, uint64_t size, uint64_t stream);
/* An input reader's error: fmt into err; returns -1. */
int tune_fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* tune_output.c: what the command writes. A torch version (--torch-version,
 * or the installed torch's; text "" when unknown), which says the variable
 * name to use. */
typedef struct tune_torch_version {
    int major, minor;
    char text[64]; /* "" when unknown */
    const char *from; /* "--torch-version", "the installed torch" */
} tune_torch_version_t;
/* "2.9.1", "2.11", "2.10.0+cu128": 0, or -1 when s is not a version. */
int tune_parse_version(const char *s, tune_torch_version_t *v);
/* The installed torch's version ($TALLY_PYTHON, default python3), if any. */
void tune_installed_torch(tune_torch_version_t *v);
/* What the table and the JSON show: the rows, the two recommendations
 * (-1: none), and the figures they are measured against. */
typedef struct tune_outcome {
    const tune_input_t *in;
    const tune_row_t *rows;
    size_t n;
    long rec_pt, rec_tally;
    uint64_t live, capacity;
    int64_t budget;
    const tune_row_t *replayed; /* the recorded setting from the recorded state, or NULL */
    const tune_torch_version_t *torch;
    double max_driver_us;       /* --max-driver-time, < 0: none */
    int gpu;                    /* the cost table's column */
} tune_outcome_t;
void tune_print_json(const tune_outcome_t *o);
void tune_print_table(const char *file, const tune_outcome_t *o);
/* "512 B", "1.5 KiB", "80.0 MiB", "12.00 GiB", "1.0 TiB" into buf. */
const char *tune_size_text(int64_t b, char *buf, size_t len);
/* The allocator a row replays, as the table names it. */
const char *tune_allocator_name(const tune_row_t *r);
/* --plot: the n series as step lines in one SVG at path. */
int tune_plot_svg(const char *path, const char *title, const tune_series_t *s, const char *const *names, size_t n,
                  char *err, size_t errlen);

/* tune.c: the command (tally tune ...); whether a row's replay ran and
 * fit in --capacity. */
int tune_main(int argc, char **argv);
bool tune_fits(const tune_row_t *r);

#endif
