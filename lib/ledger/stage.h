/* Stage records and the text and JSON reports built from the ledger. */
#ifndef TALLY_STAGE_H
#define TALLY_STAGE_H

#include "ledger/ledger.h"

/* Ended stages kept for the reports (a ring). The fuzz build keeps fewer
 * (Makefile: FUZZ_CFLAGS), so the ring wraps within a few inputs and the
 * JSON report fuzz_api reads back stays small. */
#ifndef TALLY_STAGE_HISTORY
#define TALLY_STAGE_HISTORY 256
#endif

/* Live bytes of one (tag, device, allocation site) that outlived a stage. */
typedef struct tally_survivor {
    uint32_t tag;
    int device;
    const tally_site_t *site; /* NULL without backtrace_depth / python_stack */
    uint64_t bytes;
    uint64_t blocks;
} tally_survivor_t;

/* What one ended stage left behind. Peaks are the sum over devices of each
 * device's peak during the stage. */
typedef struct tally_stage_rec {
    uint64_t seq; /* 1 for the first stage that ended */
    uint32_t id;
    int depth;
    uint64_t begin_us, wall_us;
    int64_t peak_allocated, peak_reserved;
    uint64_t released, reserved_after;
    uint64_t survivor_bytes, survivor_blocks;
    tally_survivor_t *surv;
    uint32_t nsurv;
} tally_stage_rec_t;

/* Visit the kept stage records, oldest first; *total = stages ever ended. */
void tally__stage_history(void (*fn)(const tally_stage_rec_t *, void *), void *arg, uint64_t *total);
/* Ids of the stages open now, outermost first; returns how many. */
int tally__stage_open(uint32_t *ids, int max);

/* Live blocks grouped by (tag, stage, device, site), largest first. */
typedef struct leak_group {
    uint32_t tag, stage;
    int device;
    const tally_site_t *site;
    uint64_t bytes, blocks;
    bool ignored;   /* blocks passed to tally_ignore (a grouping key) */
    int suppressed; /* suppress.h: rule index, TALLY_SUP_IGNORED, or -1 */
} leak_group_t;
typedef struct leak_set {
    leak_group_t *items; /* free with tally__meta_free */
    size_t n, cap;
} leak_set_t;
leak_set_t tally__collect_leaks(void);

/* report_text.c */
void tally__fmt_bytes(uint64_t bytes, char *buf, size_t len);
/* "" for 1, "s" otherwise. */
const char *tally__plural(uint64_t n);
/* " (foreign: home device is H)" for a device other than the home device, else "". */
void tally__foreign_note(int device, char *buf, size_t len);
void tally__report_stage(const tally_stage_rec_t *rec, tally_out_t *o);
/* The leak report: live blocks grouped by (tag, stage, device, site). full
 * lists the groups; otherwise only the summary line. Returns live bytes. */
uint64_t tally__report_leaks(tally_out_t *o, bool full, bool at_exit, uint64_t *blocks_out);
/* The ledger table and stage timeline, as text. */
void tally__report_ledger(tally_out_t *o);

/* report_json.c */
int tally__report_json(tally_out_t *o);

#endif
