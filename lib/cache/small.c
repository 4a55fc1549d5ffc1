/* The small pool: free blocks of at most 2 MiB binned by exact size per
 * stream, and the fast paths of a small allocation and of its free, which
 * work on the bins directly (issue 21, item 7).
 *
 * Small-pool blocks are multiples of 512 B up to 2 MiB, so each stream gets
 * 4096 bins, one per size, each a treap ordered by address (tree.c), and a
 * two-level bitmap of non-empty bins. The best fit is the lowest address in
 * the first non-empty bin at or above the request: the block PyTorch's
 * ordered set would give, found with two bit scans instead of a tree
 * descent. A run of pages (small_run.c) can hold free blocks over 2 MiB:
 * those sit beside the bins in one treap by size and address, whose first
 * block the allocation takes when no bin has a fit; a run's frees, whose
 * merges can make them, file them there.
 *
 * The fast paths do what the general ones in cache.c do for such a block
 * (best fit, split, merge with free neighbours, PyTorch's statistics, the
 * pointer map, the hooks), in one function each, with the pool's kind, the
 * bin set and the split rule known: the same placement and the same
 * statistics, fewer steps. Block records come from here too: the device's
 * spare list, filled 64 at a time, which the fast allocation takes from
 * inline. */
#include "cache/cache.h"

#include <string.h>

#define MIN_BLOCK 512u

/* ---- bins ----------------------------------------------------------------- */

static inline tally_binset_t *binset_find(tally_pool_t *p, void *stream)
{
    /* The set found last is kept by address, not index: one load fewer
     * before the bins of an allocation can be read. */
    if (TALLY_LIKELY(p->last_set != NULL) && p->last_set->stream == stream)
        return p->last_set;
    for (uint32_t i = 0; i < p->nsets; i++) {
        if (p->sets[i]->stream == stream) {
            p->last_set = p->sets[i];
            return p->sets[i];
        }
    }
    return NULL;
}

static tally_binset_t *binset_make(tally_pool_t *p, void *stream)
{
    tally_binset_t *set = binset_find(p, stream);
    if (set)
        return set;
    if (p->nsets == p->cap_sets) {
        uint32_t cap = p->cap_sets ? p->cap_sets * 2 : 4;
        tally_binset_t **grown = tally__meta_grow(p->sets, p->nsets, cap, sizeof *grown);
        if (!grown)
            return NULL;
        p->sets = grown;
        p->cap_sets = cap;
    }
    set = tally__meta_calloc(sizeof *set);
    if (!set)
        return NULL;
    set->stream = stream;
    p->sets[p->nsets++] = set;
    p->last_set = set;
    return set;
}

int tally__pool_prepare(tally_pool_t *p, void *stream, tally_binset_t **set)
{
    *set = NULL;
    if (p->kind != TALLY_POOL_SMALL)
        return 0;
    *set = binset_make(p, stream);
    return *set ? 0 : -1;
}

static inline uint32_t bin_of(size_t size)
{
    return (uint32_t)(size >> 9) - 1;
}

static inline void bin_insert(tally_binset_t *set, tally_block_t *b)
{
    uint32_t i = bin_of(b->size);
    /* The bitmap says whether the bin is empty: its word is in cache, the
     * bin's root (one of 4096) often is not. */
    if (!(set->bits[i >> 6] & (1ull << (i & 63)))) {
        /* An empty bin (the common case): no descent, no call. */
        b->left = b->right = NULL;
        set->roots[i] = b;
    } else {
        tally__treap_insert(&set->roots[i], b);
    }
    set->bits[i >> 6] |= 1ull << (i & 63);
    set->summary |= 1ull << (i >> 6);
}

/* Clear bin i's bit (and its word's summary bit) if the bin is empty, without
 * a branch: whether it is depends on the free order, which no predictor
 * learns. */
static inline void bin_clear_if_empty(tally_binset_t *set, uint32_t i)
{
    uint64_t empty = set->roots[i] == NULL;
    uint32_t w = i >> 6;
    uint64_t bits = set->bits[w] & ~(empty << (i & 63));
    set->bits[w] = bits;
    set->summary &= ~((uint64_t)(bits == 0) << w);
}

static inline void bin_erase(tally_binset_t *set, tally_block_t *b)
{
    uint32_t i = bin_of(b->size);
    if (set->roots[i] == b && !b->left && !b->right)
        set->roots[i] = NULL; /* the bin's only block */
    else
        tally__treap_erase(&set->roots[i], b);
    bin_clear_if_empty(set, i);
}

/* Any free small-pool block, over 2 MiB ones included (those of a run of
 * pages: beside the bins, by size and address). */
static inline void any_insert(tally_binset_t *set, tally_block_t *b)
{
    if (TALLY_UNLIKELY(b->size > TALLY_SMALL_BIN_MAX))
        tally__treap_insert_sized(&set->over, b);
    else
        bin_insert(set, b);
}

static inline void any_erase(tally_binset_t *set, tally_block_t *b)
{
    if (TALLY_UNLIKELY(b->size > TALLY_SMALL_BIN_MAX))
        tally__treap_erase_sized(&set->over, b);
    else
        bin_erase(set, b);
}

void tally__bins_insert(tally_binset_t *set, tally_block_t *b)
{
    any_insert(set, b);
}

void tally__bins_erase(tally_binset_t *set, tally_block_t *b)
{
    any_erase(set, b);
}

/* The first non-empty bin at or above bin i, or TALLY_SMALL_BINS. */
static inline uint32_t bin_first_from(const tally_binset_t *set, uint32_t i)
{
    uint32_t w = i >> 6;
    uint64_t m = set->bits[w] & (~0ull << (i & 63));
    if (!m) {
        uint64_t rest = w == 63 ? 0 : set->summary & (~0ull << (w + 1));
        if (!rest)
            return TALLY_SMALL_BINS;
        w = (uint32_t)__builtin_ctzll(rest);
        m = set->bits[w];
    }
    return (w << 6) + (uint32_t)__builtin_ctzll(m);
}

tally_block_t *tally__bins_lower_bound(tally_pool_t *p, void *stream, size_t size)
{
    tally_binset_t *set = binset_find(p, stream);
    if (!set)
        return NULL;
    uint32_t i = size < 512 ? 0 : bin_of(size);
    if (i < TALLY_SMALL_BINS && (i = bin_first_from(set, i)) < TALLY_SMALL_BINS) {
        tally_block_t *t = set->roots[i];
        while (t->left)
            t = t->left;
        return t;
    }
    /* Past the bins: the smallest block over 2 MiB that fits, the lowest
     * address among equals. */
    tally_block_t *best = NULL;
    for (tally_block_t *t = set->over; t;) {
        if (t->size >= size) {
            best = t;
            t = t->left;
        } else {
            t = t->right;
        }
    }
    return best;
}

/* The lowest address of non-empty bin i, unlinked as an erase would (a
 * treap's leftmost node gives way to its right subtree). */
static inline tally_block_t *bin_take_first(tally_binset_t *set, uint32_t i)
{
    tally_block_t **slot = &set->roots[i], *b = *slot;
    while (b->left) {
        slot = &b->left;
        b = b->left;
    }
    *slot = b->right;
    b->right = NULL;
    bin_clear_if_empty(set, i);
    return b;
}

size_t tally__bins_walk(const tally_pool_t *p, void (*fn)(tally_block_t *, void *), void *arg)
{
    size_t n = 0;
    /* Only the non-empty bins, through the bitmap. */
    for (uint32_t s = 0; s < p->nsets; s++) {
        const tally_binset_t *set = p->sets[s];
        for (uint64_t words = set->summary; words; words &= words - 1) {
            uint32_t w = (uint32_t)__builtin_ctzll(words);
            for (uint64_t bits = set->bits[w]; bits; bits &= bits - 1)
                n += tally__treap_walk(set->roots[(w << 6) + (uint32_t)__builtin_ctzll(bits)], fn, arg);
        }
        n += tally__treap_walk(set->over, fn, arg);
    }
    return n;
}

static bool bin_members_ok(const tally_block_t *t, void *stream, size_t size)
{
    if (!t)
        return true;
    return t->stream == stream && t->size == size && bin_members_ok(t->left, stream, size) &&
           bin_members_ok(t->right, stream, size);
}

static bool over_members_ok(const tally_block_t *t, void *stream)
{
    if (!t)
        return true;
    return t->stream == stream && t->size > TALLY_SMALL_BIN_MAX && t->seg->run && over_members_ok(t->left, stream) &&
           over_members_ok(t->right, stream);
}

long tally__bins_verify(const tally_pool_t *p)
{
    long n = 0;
    /* Word by word: an empty word's 64 roots are compared with NULLs in one
     * memcmp, so a check costs little for the thousands of empty bins of
     * each stream. */
    static tally_block_t *const none[64];
    for (uint32_t s = 0; s < p->nsets; s++) {
        const tally_binset_t *set = p->sets[s];
        for (uint32_t w = 0; w < TALLY_SMALL_BINS / 64; w++) {
            uint64_t bits = set->bits[w];
            tally_block_t *const *roots = &set->roots[w << 6];
            if (((set->summary >> w) & 1) != (bits != 0))
                return -1;
            if (!bits) {
                if (memcmp(roots, none, sizeof none) != 0)
                    return -1;
                continue;
            }
            for (uint32_t k = 0; k < 64; k++) {
                bool bit = (bits >> k) & 1;
                if (bit != (roots[k] != NULL))
                    return -1;
                if (!bit)
                    continue;
                long c = tally__treap_verify(roots[k]);
                if (c < 0 || !bin_members_ok(roots[k], set->stream, ((size_t)(w << 6) + k + 1) << 9))
                    return -1;
                n += c;
            }
        }
        long c = tally__treap_verify_sized(set->over);
        if (c < 0 || !over_members_ok(set->over, set->stream))
            return -1;
        n += c;
    }
    return n;
}

/* ---- the split statistics ------------------------------------------------ */

/* A change of the small pool's entry of a split statistic (k: 0 for
 * inactive_split, 1 for inactive_split_bytes), its peak taken into
 * split_hi. */
static inline void split_small(tally_device_t *d, int k, int64_t amount)
{
    tally_stat_t *s = k ? &d->stats.inactive_split_bytes[TALLY_POOL_SMALL] : &d->stats.inactive_split[TALLY_POOL_SMALL];
    int64_t up = amount > 0 ? amount : 0;
    s->allocated += up;
    s->freed += up - amount;
    int64_t now = tally__stat_now(s);
    if (now > d->split_hi[k])
        d->split_hi[k] = now;
}

/* ---- the fast allocation -------------------------------------------------- */

/* A spare block record made ready for a free piece (d->spare_blocks is not
 * empty): every field but those the caller sets (addr, size, stream, seg,
 * pool, prev and next) as a new free block has them, except the pool links
 * (left, right), which going into a pool sets, and the owner fields
 * (requested, tag, stage, lentry, seq, site): nothing reads those of a free
 * block (a snapshot prints none of them for one, tally_check and every
 * report read them of handed-out blocks only), and the hand-out and the
 * ledger's hook write each of them before the block is handed out. They
 * keep what they held: the values a batch of records starts with
 * (records_ready), or those of the block's last allocation. Five stores
 * fewer on the fast path's split (issue 21, item 7). */
static inline tally_block_t *record_take_free(tally_device_t *d)
{
    tally_block_t *r = d->spare_blocks;
    d->spare_blocks = r->next;
    r->state = BLOCK_FREE;
    r->paged = 0;
    r->deferred = 0;
    r->event_count = 0;
    r->nuses = r->cap_uses = 0;
    r->uses = NULL;
    return r;
}

/* The owner fields as a block that was never handed out has them. */
static inline void owner_clear(tally_block_t *r)
{
    r->requested = 0;
    r->tag = r->stage = 0;
    r->lentry = UINT32_MAX;
    r->seq = 0;
    r->site = NULL;
}

/* The same, the owner fields cleared too: for every record the general
 * paths take, whatever they make of it. */
static inline tally_block_t *record_take(tally_device_t *d)
{
    tally_block_t *r = record_take_free(d);
    owner_clear(r);
    return r;
}

/* Refill an empty list of spare records; false out of memory. */
static bool records_ready(tally_device_t *d)
{
    if (!d->spare_blocks) {
        enum { BATCH = 64 };
        tally_block_t *batch = tally__meta_alloc(BATCH * sizeof *batch);
        if (!batch)
            return NULL;
        for (int i = 0; i < BATCH; i++) {
            owner_clear(&batch[i]);
            batch[i].next = d->spare_blocks;
            d->spare_blocks = &batch[i];
        }
    }
    return true;
}

tally_block_t *tally__cache_block_new(tally_device_t *d)
{
    if (!records_ready(d))
        return NULL;
    tally_block_t *r = record_take(d);
    r->left = r->right = NULL;
    return r;
}

/* b, out of its pool, keeps its first size bytes; a new free record (d's
 * spare list is not empty) takes the rest and is linked after it, in no
 * pool yet. Returns that record, its owner fields cleared when owners is
 * set (the general path's: it may make the record something else). */
static inline __attribute__((always_inline)) tally_block_t *cut_front(tally_device_t *d, tally_block_t *b,
                                                                      size_t size, bool owners)
{
    tally_block_t *rest = owners ? record_take(d) : record_take_free(d);
    rest->addr = b->addr + size;
    rest->size = b->size - size;
    rest->stream = b->stream;
    rest->seg = b->seg;
    rest->pool = b->pool;
    rest->prev = b;
    rest->next = b->next;
    if (rest->next)
        rest->next->prev = rest;
    b->next = rest;
    b->size = size;
    return rest;
}

tally_block_t *tally__cache_cut_front(tally_device_t *d, tally_block_t *b, size_t size)
{
    if (!records_ready(d))
        return NULL;
    tally_block_t *rest = cut_front(d, b, size, true);
    rest->left = rest->right = NULL;
    return rest;
}

/* Free block b, out of its bin (any: or out of the blocks over 2 MiB, so
 * that the rest may be one of those too), handed out from its front. */
static inline __attribute__((always_inline)) tally_block_t *small_take(tally_device_t *d, tally_binset_t *set,
                                                                       tally_block_t *b, size_t size, size_t orig,
                                                                       void *site, bool any)
{
    tally_pool_t *pool = &d->small;
    bool already_split = b->prev || b->next;
    b->state = BLOCK_ALLOCATED;
    tally_stat_t *split_bytes = &d->stats.inactive_split_bytes[TALLY_POOL_SMALL];
    if (b->size - size >= MIN_BLOCK) {
        /* The rest stays free, in its own bin: the pool's count is unchanged. */
        tally_block_t *rest = cut_front(d, b, size, false);
        if (any)
            any_insert(set, rest);
        else
            bin_insert(set, rest); /* sets its pool links */
        if (already_split) {
            tally__stat_dec(split_bytes, (int64_t)size);
        } else {
            split_small(d, 1, (int64_t)rest->size);
            split_small(d, 0, 1);
            if (TALLY_UNLIKELY(b->seg == d->lent_kept)) /* a wholly free segment is in use again */
                d->lent_kept = NULL;
        }
    } else {
        pool->count--;
        if (already_split) {
            tally__stat_dec(split_bytes, (int64_t)b->size);
            tally__stat_dec(&d->stats.inactive_split[TALLY_POOL_SMALL], 1);
        } else if (TALLY_UNLIKELY(b->seg == d->lent_kept)) {
            d->lent_kept = NULL;
        }
    }
    tally__ptrmap_put_room(&d->map, b->addr, b); /* room was checked */
    return tally__cache_hand_out(d, b, TALLY_POOL_SMALL, orig, site, false);
}

/* The smallest free block over 2 MiB (a run of pages' free end, most
 * often), when no bin has a fit: the block the general path's best fit
 * would take. */
__attribute__((noinline)) static tally_block_t *small_alloc_over(tally_device_t *d, tally_binset_t *set, size_t size,
                                                                 size_t orig, void *site)
{
    tally_block_t *b = set->over;
    while (b->left)
        b = b->left;
    tally__treap_erase_sized(&set->over, b);
    return small_take(d, set, b, size, orig, site, true);
}

/* An allocation of size bytes (rounded; orig asked) from the device's own
 * small pool, when a cached block fits and a block record and room in the
 * pointer map are at hand; NULL, with nothing changed, sends it down the
 * general path. */
static inline __attribute__((always_inline)) tally_block_t *small_alloc(tally_device_t *d, size_t size, size_t orig,
                                                                        void *stream, void *site)
{
    if (TALLY_UNLIKELY(!d->spare_blocks || (d->map.count + 1) * 2 > d->map.mask + 1))
        return NULL; /* the general path makes records and grows the map */
    tally_binset_t *set = binset_find(&d->small, stream);
    if (TALLY_UNLIKELY(!set))
        return NULL;
    uint32_t i = bin_first_from(set, bin_of(size));
    if (i == TALLY_SMALL_BINS)
        return set->over ? small_alloc_over(d, set, size, orig, site) : NULL;
    return small_take(d, set, bin_take_first(set, i), size, orig, site, false);
}

/* ---- the fast free -------------------------------------------------------- */

/* Merge free neighbour n into b (n is the lower one when low is set). The
 * neighbour links are chosen, not branched on (a merge happens in whatever
 * order the job frees). */
static inline __attribute__((always_inline)) void absorb(tally_device_t *d, tally_binset_t *set, tally_block_t *b,
                                                        tally_block_t *n, bool low, bool any)
{
    if (any)
        any_erase(set, n);
    else
        bin_erase(set, n);
    b->size += n->size;
    if (low) {
        b->addr = n->addr;
        b->prev = n->prev;
        tally_block_t **head = &b->seg->head;
        tally_block_t **up = b->prev ? &b->prev->next : head;
        *up = b;
    } else {
        tally_block_t *sink;
        b->next = n->next;
        tally_block_t **down = b->next ? &b->next->prev : &sink;
        *down = b;
    }
    if (TALLY_UNLIKELY(n->uses != NULL))
        tally__meta_free(n->uses);
    n->uses = NULL;
    n->next = d->spare_blocks;
    d->spare_blocks = n;
}

/* any: b may be a run's block, whose merges may pass 2 MiB (the general
 * path's free); else it is not (the fast path's). */
static inline __attribute__((always_inline)) void small_free(tally_device_t *d, tally_block_t *b, bool any)
{
    tally_pool_t *pool = TALLY_UNLIKELY(b->seg->gp != NULL) ? &b->seg->gp->small : &d->small; /* tally__pool_for */
    tally_binset_t *set = b->seg->bins;
    tally_block_t *prev = b->prev, *next = b->next;
    int64_t dblocks = 0, dbytes = 0;
    if (prev && prev->state == BLOCK_FREE) {
        dblocks -= 1;
        dbytes -= (int64_t)prev->size;
        absorb(d, set, b, prev, true, any);
        pool->count--;
    }
    if (next && next->state == BLOCK_FREE) {
        dblocks -= 1;
        dbytes -= (int64_t)next->size;
        absorb(d, set, b, next, false, any);
        pool->count--;
    }
    b->state = BLOCK_FREE;
    if (any)
        any_insert(set, b);
    else
        bin_insert(set, b);
    pool->count++;
    /* The split statistics' changes, summed without branches. */
    bool whole = (b->prev == NULL) & (b->next == NULL);
    int64_t split = !whole;
    dblocks += split;
    dbytes += (int64_t)b->size & -split;
    split_small(d, 0, dblocks);
    split_small(d, 1, dbytes);
    tally__stat_dec(&d->stats.requested_bytes[TALLY_POOL_SMALL], (int64_t)b->requested);
    if (TALLY_UNLIKELY(whole) && b->seg->lender != NULL)
        tally__lend_idle_locked(d, b);
}

void tally__small_free_block_locked(tally_device_t *d, tally_block_t *b)
{
    tally__cache_held_locked(d, TALLY_POOL_SMALL, 1, (int64_t)b->size); /* back in its pool */
    small_free(d, b, true); /* its callers took the pending peaks */
}

/* ---- the entry points ----------------------------------------------------- */

/* Whether a request of orig bytes may take the fast path: the device's own
 * small pool (no graph pool, no capture), no memory fraction (so no garbage
 * collection), and the options and backend that allow it
 * (tally__g.small_fast: no pass-through backend, PyTorch's default
 * rounding, no move budget, which watches every request). */
static inline bool fast_ok(const tally_device_t *d, size_t orig, bool capturing)
{
    return orig <= TALLY_SMALL_SIZE && !capturing && !d->nallocating && d->allowed_max == UINT64_MAX &&
           atomic_load_explicit(&tally__g.small_fast, memory_order_relaxed);
}

/* PyTorch's small-pool rounding (no divisions): 512 B multiples. */
static inline size_t round_small(size_t orig)
{
    return orig < MIN_BLOCK ? MIN_BLOCK : (orig + MIN_BLOCK - 1) & ~(size_t)(MIN_BLOCK - 1);
}

/* An allocation's first steps (the capture check, the event queue) and the
 * small fast path: the block, or NULL with nothing handed out (*capturing
 * then says what the general path needs to know). */
static inline __attribute__((always_inline)) tally_block_t *malloc_fast(tally_device_t *d, size_t orig, void *stream,
                                                                        void *site, bool *capturing)
{
    *capturing = tally__cache_alloc_begin_locked(d, stream);
    if (TALLY_LIKELY(fast_ok(d, orig, *capturing)))
        return small_alloc(d, round_small(orig), orig, stream, site);
    return NULL;
}

tally_block_t *tally__cache_malloc_locked(tally_device_t *d, size_t orig, void *stream, void *site)
{
    bool capturing;
    tally_block_t *b = malloc_fast(d, orig, stream, site, &capturing);
    if (b)
        return b;
    return tally__cache_malloc_general_locked(d, orig, stream, site, capturing);
}

/* A small block of the device's own pool, never shared with another stream,
 * not asleep, not in a run of pages and not from a pass-through backend
 * (slow_free): nothing to wait for, and no merge past 2 MiB. */
static inline bool free_fast_ok(const tally_block_t *b)
{
    return b->pool == TALLY_POOL_SMALL && !b->nuses && !b->seg->slow_free;
}

/* Every free free_fast_ok does not take. */
static void free_other(tally_device_t *d, tally_block_t *b)
{
    /* A block of a run of pages (never asleep: runs are no private pool's):
     * the same, its merges filed past the bins when they pass 2 MiB. */
    if (b->seg->run && b->pool == TALLY_POOL_SMALL && !b->nuses && !tally__g.backend->passthrough) {
        tally__cache_free_begin_locked(d, b);
        small_free(d, b, true);
        return;
    }
    tally__cache_free_general_locked(d, b);
}

/* The fast free of b (out of the pointer map): true when it took it. */
static inline __attribute__((always_inline)) bool free_fast(tally_device_t *d, tally_block_t *b)
{
    if (TALLY_UNLIKELY(!free_fast_ok(b)))
        return false;
    tally__cache_free_begin_locked(d, b);
    small_free(d, b, false);
    return true;
}

void tally__cache_free_locked(tally_device_t *d, tally_block_t *b)
{
    if (TALLY_LIKELY(free_fast(d, b)))
        return;
    free_other(d, b);
}

/* The fast halves: the same, with the lock. On their fast paths nothing but
 * the function itself and the ledger's hooks ran under the lock, so it is
 * still held by bias. */
void *tally__cache_malloc_biased(tally_device_t *d, size_t orig, int device, void *stream, tally_alloc_miss_fn miss)
{
    if (TALLY_UNLIKELY(!tally__dev_lock_biased(&d->lock)))
        return miss(orig, device, stream, false);
    bool capturing;
    tally_block_t *b = malloc_fast(d, orig, stream, NULL, &capturing);
    if (TALLY_LIKELY(b != NULL)) {
        tally__dev_unlock_biased(&d->lock);
        return (void *)b->addr;
    }
    b = tally__cache_malloc_general_locked(d, orig, stream, NULL, capturing);
    tally__dev_unlock(&d->lock); /* after the general allocation */
    if (TALLY_UNLIKELY(!b))
        return miss(orig, device, stream, true);
    return (void *)b->addr;
}

void tally__cache_free_biased(tally_device_t *d, void *ptr, size_t size, int device, tally_free_miss_fn miss)
{
    uintptr_t a = (uintptr_t)ptr;
    if (TALLY_LIKELY(tally__dev_lock_biased(&d->lock))) {
        tally_ptrslot_t *slot =
            TALLY_LIKELY(d->map.slots != NULL && a != 0) ? tally__ptrmap_find_inline(&d->map, a) : NULL;
        if (TALLY_LIKELY(slot != NULL) && TALLY_LIKELY(slot->val->requested == size)) {
            tally_block_t *b = slot->val;
            tally__ptrmap_remove_inline(&d->map, slot);
            if (TALLY_LIKELY(free_fast(d, b))) {
                tally__dev_unlock_biased(&d->lock);
                return;
            }
            free_other(d, b);
            tally__dev_unlock(&d->lock); /* after the general free */
            return;
        }
        tally__dev_unlock_biased(&d->lock);
    }
    miss(ptr, size, device);
}
