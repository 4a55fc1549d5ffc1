/* The ledger's hot half: the per-thread tag stack and the counters per
 * (tag, stage, device) that every allocation and free updates. A block
 * carries its row index, so a free touches one row without any lookup; an
 * allocation finds its row through a one-entry cache, else a small hash on
 * the integer pair. No string is hashed here. */
#include "ledger/ledger.h"

#include <stdatomic.h>
#include <string.h>

#define TAG_STACK 64
/* One thread-local object, so the hot path resolves one TLS address. */
typedef struct tag_state {
    int depth;
    uint32_t stack[TAG_STACK];
} tag_state_t;
static _Thread_local tag_state_t tags;

/* Innermost stage (stage.c writes it; allocations read it). */
_Atomic uint64_t tally__current_stage;

/* The innermost tag of t, and its mirror in the calling thread's bias
 * record (when it has one), which the allocation path reads. */
static uint32_t tag_top(const tag_state_t *t)
{
    return t->depth ? t->stack[t->depth - 1] : TALLY_TAG_NONE;
}

static void tag_mirror(const tag_state_t *t)
{
    tally_bias_t *r = tally__bias_mine();
    if (r)
        r->tag = tag_top(t);
}

int tally_tag_push(const char *tag)
{
    uint32_t id;
    if (!tag)
        return tally__fail(TALLY_EINVAL, "tally_tag_push: tag is NULL");
    tag_state_t *t = &tags;
    if (t->depth == TAG_STACK)
        return tally__fail(TALLY_ESTATE, "tally_tag_push: '%s': tag stack is full (%d deep)", tag, TAG_STACK);
    int rc = tally__intern_tag(tag, &id);
    if (rc)
        return tally__fail(-rc, "tally_tag_push: %s", tally_last_error());
    t->stack[t->depth++] = id;
    tag_mirror(t);
    return 0;
}

int tally_tag_pop(void)
{
    tag_state_t *t = &tags;
    if (t->depth == 0)
        return tally__fail(TALLY_ESTATE, "tally_tag_pop: the tag stack of this thread is empty");
    t->depth--;
    tag_mirror(t);
    return 0;
}

uint32_t tally__current_tag(void)
{
    return tag_top(&tags);
}

int tally__ledger_device_init(tally_device_t *d)
{
    tally_ledger_dev_t *ld = tally__meta_calloc(sizeof *ld);
    if (!ld)
        return -TALLY_ENOMEM;
    ld->last_key = UINT64_MAX;
    d->ledger = ld;
    return 0;
}

static inline uint32_t key_slot(uint64_t key, uint32_t mask)
{
    return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 40) & mask;
}

__attribute__((noinline, cold)) static int rows_grow(tally_ledger_dev_t *ld)
{
    uint32_t cap = ld->cap ? ld->cap * 2 : 32;
    tally_ledger_entry_t *rows = tally__meta_alloc(cap * sizeof *rows);
    uint32_t *index = tally__meta_alloc(cap * 2 * sizeof *index);
    if (!rows || !index) {
        tally__meta_free(rows);
        tally__meta_free(index);
        return -1;
    }
    if (ld->count)
        memcpy(rows, ld->entries, ld->count * sizeof *rows);
    memset(index, 0xff, cap * 2 * sizeof *index);
    uint32_t mask = cap * 2 - 1;
    for (uint32_t r = 0; r < ld->count; r++) {
        uint64_t k = (uint64_t)rows[r].tag << 32 | rows[r].stage;
        uint32_t i = key_slot(k, mask);
        while (index[i] != UINT32_MAX)
            i = (i + 1) & mask;
        index[i] = r;
    }
    tally__meta_free(ld->entries);
    tally__meta_free(ld->index);
    ld->entries = rows;
    ld->index = index;
    ld->cap = cap;
    ld->index_mask = mask;
    return 0;
}

/* Row of (tag, stage), created on first use; UINT32_MAX without memory. */
__attribute__((noinline)) static uint32_t row_find(tally_ledger_dev_t *ld, uint32_t tag, uint32_t stage)
{
    uint64_t key = (uint64_t)tag << 32 | stage;
    if (ld->count == ld->cap && rows_grow(ld))
        return UINT32_MAX;
    uint32_t i = key_slot(key, ld->index_mask);
    while (ld->index[i] != UINT32_MAX) {
        tally_ledger_entry_t *e = &ld->entries[ld->index[i]];
        if (e->tag == tag && e->stage == stage)
            break;
        i = (i + 1) & ld->index_mask;
    }
    if (ld->index[i] == UINT32_MAX) {
        uint32_t r = ld->count++;
        memset(&ld->entries[r], 0, sizeof ld->entries[r]);
        ld->entries[r].tag = tag;
        ld->entries[r].stage = stage;
        ld->index[i] = r;
    }
    ld->last_key = key;
    ld->last_idx = ld->index[i];
    return ld->last_idx;
}

/* The owner counters of an allocation: row r takes block b. */
static inline void count_in(tally_ledger_dev_t *ld, uint32_t r, tally_block_t *b)
{
    tally__stat_inc(&ld->entries[r].bytes, (int64_t)b->size);
    tally__stat_inc(&ld->entries[r].blocks, 1);
    b->lentry = r;
}

/* The owner counters' free: the block's own row, no lookup. */
static inline __attribute__((always_inline)) void on_free(tally_device_t *d, tally_block_t *b)
{
    if (b->lentry == UINT32_MAX)
        return;
    tally_ledger_dev_t *ld = d->ledger;
    tally__stat_dec(&ld->entries[b->lentry].bytes, (int64_t)b->size);
    tally__stat_dec(&ld->entries[b->lentry].blocks, 1);
}

/* The hooks' rare halves, out of line so that the common case (the row
 * of the allocation before, no timeline, no trace) is a leaf function. */
__attribute__((noinline)) static void record_events(tally_device_t *d, int alloc, tally_block_t *b)
{
    tally__timeline_block_locked(d, alloc ? TALLY_EV_ALLOC : TALLY_EV_FREE, b);
    tally__trace_block_locked(d, alloc, b);
}

/* The owner counters of an allocation whose row is not the one of the
 * allocation before. */
__attribute__((noinline)) static void alloc_other_row(tally_device_t *d, tally_block_t *b)
{
    tally_ledger_dev_t *ld = d->ledger;
    uint32_t r = row_find(ld, b->tag, b->stage);
    if (TALLY_LIKELY(r != UINT32_MAX))
        count_in(ld, r, b);
}

/* The owner counters once b's tag and stage are set: the row of the
 * allocation before inline, any other row out of line. b has no row until
 * one is found (the fast split leaves a record's last row in it). */
static inline __attribute__((always_inline)) void alloc_count(tally_device_t *d, tally_ledger_dev_t *ld,
                                                              tally_block_t *b)
{
    if (TALLY_UNLIKELY(((uint64_t)b->tag << 32 | b->stage) != ld->last_key)) {
        b->lentry = UINT32_MAX; /* no row until alloc_other_row finds one */
        alloc_other_row(d, b);
        return;
    }
    count_in(ld, ld->last_idx, b);
}

/* The allocating thread's tag when the hot half cannot read it from its
 * bias record: from thread-local storage, written to the record for the
 * next allocation when there is one. Then the owner counters. */
__attribute__((noinline)) static void alloc_tag_unread(tally_device_t *d, tally_block_t *b, tally_bias_t *o)
{
    b->tag = tally__current_tag();
    if (o)
        o->tag = b->tag;
    alloc_count(d, d->ledger, b);
}

/* The ledger's part of an allocation: b's stage, epoch and tag, and its
 * row. The tag is read from the bias record of the thread that holds the
 * device lock (its own), not from thread-local storage: in libtally.so that
 * is a call to __tls_get_addr, and a call makes the hook save registers.
 * (The stage window's peaks are the cache's: d->win_alloc, d->win_reserved.) */
static inline __attribute__((always_inline)) void alloc_owner(tally_device_t *d, tally_block_t *b)
{
    uint64_t st = atomic_load_explicit(&tally__current_stage, memory_order_relaxed);
    tally_bias_t *o = tally__dev_lock_record(&d->lock);
    b->stage = (uint32_t)st;
    b->epoch = (uint32_t)(st >> 32);
    if (TALLY_UNLIKELY(!o) || TALLY_UNLIKELY(o->tag == TALLY_BIAS_TAG_UNSET)) {
        alloc_tag_unread(d, b, o);
        return;
    }
    b->tag = o->tag;
    alloc_count(d, d->ledger, b);
}

/* Whether the hooks have their common case only: the ledger on, no
 * timeline and no trace. One load at the top of each hook instead of three
 * (issue 21, item 7); written whenever one of them changes. */
static _Atomic bool plain;

void tally__ledger_options_update(void)
{
    atomic_store_explicit(&plain, tally__opt.ledger && !TALLY_OPT(timeline) && !TALLY_OPT(trace),
                          memory_order_relaxed);
}

/* The allocation hook's every case: the ledger off, or a timeline or trace
 * to record. */
__attribute__((noinline)) static void alloc_general(tally_device_t *d, tally_block_t *b)
{
    b->lentry = UINT32_MAX;
    b->epoch = 0;
    if (tally__opt.ledger)
        alloc_owner(d, b);
    if (TALLY_UNLIKELY(TALLY_OPT(timeline) | TALLY_OPT(trace)))
        record_events(d, 1, b);
}

void tally__ledger_block_alloc_locked(tally_device_t *d, tally_block_t *b)
{
    /* The common case (the plain flag) is a leaf function: the owner
     * counters of the row of the allocation before; any other row, the
     * ledger off, the timeline and the trace are out of line. */
    if (TALLY_UNLIKELY(!atomic_load_explicit(&plain, memory_order_relaxed))) {
        alloc_general(d, b);
        return;
    }
    alloc_owner(d, b);
}

void tally__ledger_block_free_locked(tally_device_t *d, tally_block_t *b)
{
    on_free(d, b);
    if (TALLY_UNLIKELY(!atomic_load_explicit(&plain, memory_order_relaxed)) &&
        TALLY_UNLIKELY(TALLY_OPT(timeline) | TALLY_OPT(trace)))
        record_events(d, 0, b);
}

void tally__ledger_device_event_locked(tally_device_t *d, int action, uintptr_t addr, size_t size, void *stream)
{
    tally__timeline_locked(d, action, addr, size, stream);
}
