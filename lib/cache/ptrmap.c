/* Map from a handed-out block's address to its record: open addressing with
 * linear probing, backward-shift deletion (no tombstones), doubling at half
 * load. Addresses are at least 512-byte aligned, so the hash drops the low
 * bits before mixing. Guarded by the owning device's lock. */
#include "cache/cache.h"

#include <string.h>

static inline size_t slot_of(uintptr_t key, size_t mask)
{
    uint64_t x = (uint64_t)(key >> 9) * 0x9E3779B97F4A7C15ull;
    return (size_t)(x >> 20) & mask;
}

int tally__ptrmap_init(tally_ptrmap_t *m, size_t capacity)
{
    size_t cap = 16;
    while (cap < capacity)
        cap <<= 1;
    m->keys = tally__meta_calloc(cap * sizeof *m->keys);
    m->vals = tally__meta_alloc(cap * sizeof *m->vals);
    if (!m->keys || !m->vals) {
        tally__meta_free(m->keys);
        tally__meta_free(m->vals);
        m->keys = NULL;
        m->vals = NULL;
        return -TALLY_ENOMEM;
    }
    m->mask = cap - 1;
    m->count = 0;
    return 0;
}

/* Out of line, so that put stays a leaf function on the hot path. */
__attribute__((noinline, cold)) static int grow(tally_ptrmap_t *m)
{
    tally_ptrmap_t bigger;
    if (tally__ptrmap_init(&bigger, (m->mask + 1) * 2))
        return -TALLY_ENOMEM;
    for (size_t i = 0; i <= m->mask; i++)
        if (m->keys[i])
            tally__ptrmap_put(&bigger, m->keys[i], m->vals[i]);
    tally__ptrmap_free(m);
    *m = bigger;
    return 0;
}

__attribute__((noinline, cold)) static int put_grown(tally_ptrmap_t *m, uintptr_t key, tally_block_t *b);

int tally__ptrmap_put(tally_ptrmap_t *m, uintptr_t key, tally_block_t *b)
{
    if (TALLY_UNLIKELY((m->count + 1) * 2 > m->mask + 1))
        return put_grown(m, key, b); /* a tail call: put itself stays a leaf */
    size_t i = slot_of(key, m->mask);
    while (m->keys[i]) {
        if (m->keys[i] == key) {
            m->vals[i] = b;
            return 0;
        }
        i = (i + 1) & m->mask;
    }
    m->keys[i] = key;
    m->vals[i] = b;
    m->count++;
    return 0;
}

static int put_grown(tally_ptrmap_t *m, uintptr_t key, tally_block_t *b)
{
    return grow(m) ? -TALLY_ENOMEM : tally__ptrmap_put(m, key, b);
}

tally_block_t *tally__ptrmap_get(const tally_ptrmap_t *m, uintptr_t key)
{
    if (!m->keys || !key)
        return NULL;
    size_t i = slot_of(key, m->mask);
    while (m->keys[i]) {
        if (m->keys[i] == key)
            return m->vals[i];
        i = (i + 1) & m->mask;
    }
    return NULL;
}

/* Backward shift from hole: pull later entries of the probe run into it.
 * Out of line, so that take stays a leaf function for the common case of
 * a run that ends right after the entry taken. */
__attribute__((noinline)) static void shift_back(tally_ptrmap_t *m, size_t hole)
{
    for (size_t j = (hole + 1) & m->mask; m->keys[j]; j = (j + 1) & m->mask) {
        size_t home = slot_of(m->keys[j], m->mask);
        /* Entry j may move to hole if hole lies cyclically in [home, j). */
        bool movable = hole <= j ? (home <= hole || home > j) : (home <= hole && home > j);
        if (movable) {
            m->keys[hole] = m->keys[j];
            m->vals[hole] = m->vals[j];
            hole = j;
        }
    }
    m->keys[hole] = 0;
}

tally_block_t *tally__ptrmap_take(tally_ptrmap_t *m, uintptr_t key)
{
    if (!m->keys || !key)
        return NULL;
    size_t i = slot_of(key, m->mask);
    while (m->keys[i] && m->keys[i] != key)
        i = (i + 1) & m->mask;
    if (!m->keys[i])
        return NULL;
    tally_block_t *b = m->vals[i];
    m->count--;
    if (TALLY_LIKELY(!m->keys[(i + 1) & m->mask]))
        m->keys[i] = 0; /* the run ends here: nothing to shift */
    else
        shift_back(m, i);
    return b;
}

void tally__ptrmap_free(tally_ptrmap_t *m)
{
    tally__meta_free(m->keys);
    tally__meta_free(m->vals);
    memset(m, 0, sizeof *m);
}
