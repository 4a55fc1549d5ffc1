/* The ledger: who owns each live block. Interned tag and stage names, the
 * per-thread tag stack, the process-wide stage stack, counters per
 * (tag, stage, device), allocation sites, the stage history, and the
 * bounded event timeline. Hooks named _locked run under the device lock. */
#ifndef TALLY_LEDGER_H
#define TALLY_LEDGER_H

#include "cache/cache.h"

#include <stdatomic.h>

#define TALLY_TAG_NONE 0   /* "untagged" */
#define TALLY_STAGE_NONE 0 /* "(none)" */

/* One counter row: what a (tag, stage) holds on a device. */
typedef struct tally_ledger_entry {
    uint32_t tag, stage;
    tally_stat_t bytes;
    tally_stat_t blocks;
} tally_ledger_entry_t;

typedef struct tally_ledger_dev {
    tally_ledger_entry_t *entries;
    uint32_t count, cap;
    uint32_t *index; /* open addressing over entries, UINT32_MAX = empty */
    uint32_t index_mask;
    uint64_t last_key;
    uint32_t last_idx;
} tally_ledger_dev_t;

/* The calling thread's innermost tag, and the process's innermost stage. */
uint32_t tally__current_tag(void);
/* The innermost stage as (epoch << 32 | id): the epoch counts stage begins,
 * so a block records which instance of a stage it was born in. */
extern _Atomic uint64_t tally__current_stage;
static inline uint32_t tally__stage_now(void)
{
    return (uint32_t)atomic_load_explicit(&tally__current_stage, memory_order_relaxed);
}

/* The cache's hooks (tally_cache_hooks_t): a block's owner counters, its
 * timeline event and its trace record (b->site is set by the caller,
 * captured before the lock); a device event on the timeline. */
void tally__ledger_block_alloc_locked(tally_device_t *d, tally_block_t *b);
void tally__ledger_block_free_locked(tally_device_t *d, tally_block_t *b);
void tally__ledger_device_event_locked(tally_device_t *d, int action, uintptr_t addr, size_t size, void *stream);
int tally__ledger_device_init(tally_device_t *d);
/* The hooks' gate: called whenever the ledger, timeline or trace option
 * changes (initialisation, tally_configure). */
void tally__ledger_options_update(void);

/* Names (interned once; ids are stable for the process). */
const char *tally__tag_name(uint32_t id);
const char *tally__stage_name(uint32_t id);
int tally__intern_tag(const char *name, uint32_t *id);
int tally__intern_stage(const char *name, uint32_t *id);
bool tally__tag_is_persistent(uint32_t id);

/* Allocation sites, interned; NULL when off (site.h). */
typedef struct tally_site tally_site_t;

/* Timeline (recorders.c): a bounded ring of events per device. */
typedef struct tally_event_rec {
    uint64_t time_us;
    uintptr_t addr;
    uint64_t size;
    void *stream;
    uint32_t tag, stage;
    const tally_site_t *site; /* alloc and free events: the block's site */
    uint8_t action;
    int64_t allocated, reserved; /* device totals after the event */
} tally_event_rec_t;
void tally__timeline_record_locked(tally_device_t *d, int action, uintptr_t addr, size_t size, void *stream,
                                   uint32_t tag, uint32_t stage, const tally_site_t *site);
/* An event of the device (segments, OOM, stage boundaries): the current
 * thread's tag and the current stage. */
static inline void tally__timeline_locked(tally_device_t *d, int action, uintptr_t addr, size_t size, void *stream)
{
    if (TALLY_UNLIKELY(TALLY_OPT(timeline)))
        tally__timeline_record_locked(d, action, addr, size, stream, tally__current_tag(), tally__stage_now(), NULL);
}
/* An event of a block (alloc, free): the block's own tag and stage. */
static inline void tally__timeline_block_locked(tally_device_t *d, int action, const tally_block_t *b)
{
    if (TALLY_UNLIKELY(TALLY_OPT(timeline)))
        tally__timeline_record_locked(d, action, b->addr, b->size, b->stream, b->tag, b->stage,
                                      (const tally_site_t *)b->site);
}
/* Allocation trace (recorders.c, trace:true): every alloc and free in full. */
void tally__trace_record_locked(tally_device_t *d, int alloc, const tally_block_t *b);
void tally__trace_write_locked(tally_device_t *d, tally_out_t *o, bool *first);
static inline void tally__trace_block_locked(tally_device_t *d, int alloc, const tally_block_t *b)
{
    if (TALLY_UNLIKELY(TALLY_OPT(trace)))
        tally__trace_record_locked(d, alloc, b);
}
/* Copy out up to max events, oldest first; returns the count. */
size_t tally__timeline_copy_locked(tally_device_t *d, tally_event_rec_t *out, size_t max);
/* Events of the device that the ring no longer holds (timeline_events). */
uint64_t tally__timeline_dropped_locked(tally_device_t *d);
uint64_t tally__now_us(void);

#endif
