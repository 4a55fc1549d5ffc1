/* The tally command's model of a JSON report (docs/reports.md gives the
 * schema): every field the commands use, read once and checked, so a wrong
 * file fails with one message naming the byte and the field. Strings point
 * into the document's tree. Read by tools/cli_report.c. */
#ifndef TALLY_CLI_REPORT_H
#define TALLY_CLI_REPORT_H

#include "cli_util.h"

typedef struct rep_device {
    int device;
    int64_t largest_free_block;
    double utilisation;
    int64_t timeline_dropped; /* events the ring no longer held (0 in older reports) */
    tally_stats_t stats;
} rep_device_t;

typedef struct rep_row {
    const char *tag, *stage;
    int device;
    bool foreign;
    int64_t current, peak, allocated, freed, live_blocks, peak_blocks, allocated_blocks;
} rep_row_t;

typedef struct rep_survivor {
    const char *tag;
    int device;
    bool foreign;
    int64_t bytes, blocks;
} rep_survivor_t;

typedef struct rep_stage {
    const char *name;
    int64_t seq, depth, begin_us, wall_us, peak_allocated, peak_reserved;
    int64_t survivor_bytes, survivor_blocks, released;
    rep_survivor_t *surv;
    size_t nsurv;
} rep_stage_t;

typedef struct rep_leak {
    const char *tag, *stage, *site;
    int device;
    bool foreign;
    int64_t bytes, blocks;
} rep_leak_t;

enum { EV_ALLOC, EV_FREE, EV_SEGMENT_ALLOC, EV_SEGMENT_FREE, EV_OOM, EV_STAGE_BEGIN, EV_STAGE_END, EV_OTHER };

typedef struct rep_event {
    int device, action;
    int64_t time_us, addr, size, allocated, reserved;
    const char *tag, *stage;
} rep_event_t;

typedef struct report {
    cli_doc_t doc;
    const char *version, *backend;
    int64_t pid, rank, local_rank, world_size, home_device, time_us, stages_total;
    rep_device_t *devs;
    size_t ndev;
    rep_row_t *rows;
    size_t nrows;
    rep_stage_t *stages;
    size_t nstages;
    rep_leak_t *leaks;
    size_t nleaks;
    rep_event_t *events;
    size_t nevents;
} report_t;

/* What a JSON document is: a tally report, a flat (or nested) memory_stats
 * object, or neither. */
enum { DOC_REPORT, DOC_STATS, DOC_OTHER };

/* What the document root is: DOC_REPORT, DOC_STATS or DOC_OTHER. */
int cli_doc_kind(const tally_json_t *root);
/* A flat memory_stats object at obj (all of doc when obj is the root) into
 * *out; 0, or a schema error in doc. mode: TALLY_STATS_STRICT for a tally
 * report's stats, TALLY_STATS_DUMP for a bare memory_stats dump
 * (lib/report/report.h). */
int cli_stats_from_obj(cli_doc_t *doc, const tally_json_t *obj, const char *where, tally_stats_t *out, int mode);

/* Read the report fields of doc (already loaded, known to be a report)
 * into *r, which takes the document over. Returns 0, or EXIT_DATA after
 * printing the first schema problem. */
int cli_report_parse(report_t *r, cli_doc_t *doc, bool want_timeline);
/* Load path as a tally report. Returns 0, or EXIT_DATA after printing why. */
int cli_report_load(report_t *r, const char *path, bool want_timeline);
void cli_report_free(report_t *r);
/* The report's entry for device, or NULL. */
const rep_device_t *cli_report_device(const report_t *r, int device);
/* "0-3" or "0, 2" or "none": the devices a report has, for messages. */
void cli_report_device_list(const report_t *r, char *buf, size_t len);

#endif /* TALLY_CLI_REPORT_H */
