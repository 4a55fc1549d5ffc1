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

/* The stage boundary (the API's tally_stage_begin / tally_stage_end, which
 * initialise first). Ending a stage records it in the history, releases the
 * caches when release_at_stage_end is set, and hands the record to report
 * (when not NULL) while it is still the newest. The stage's frame keeps the
 * caller's mark from its begin, given back by its end (when mark is not NULL):
 * one locked step each, so a mark cannot drift from its stage when threads
 * begin and end stages at once. */
int tally__stage_begin(const char *name, uint64_t mark);
int tally__stage_end(const char *name, void (*report)(const tally_stage_rec_t *rec), uint64_t *mark);

#endif
