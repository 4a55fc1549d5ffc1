/* Map from a handed-out block's address to its record: open addressing with
 * linear probing, backward-shift deletion (no tombstones), doubling at half
 * load. A slot holds the key and the record together. The hash and the two
 * operations of PyTorch's pair (a put with room, a take) are inline in
 * ptrmap.h; here are the rest. Guarded by the owning device's lock. */
#include "cache/cache.h"

#include <string.h>

int tally__ptrmap_init(tally_ptrmap_t *m, size_t capacity)
{
    size_t cap = 16;
    while (cap < capacity)
        cap <<= 1;
    m->slots = tally__meta_calloc(cap * sizeof *m->slots);
    if (!m->slots)
        return -TALLY_ENOMEM;
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
        if (m->slots[i].key)
            tally__ptrmap_put_room(&bigger, m->slots[i].key, m->slots[i].val);
    tally__ptrmap_free(m);
    *m = bigger;
    return 0;
}

int tally__ptrmap_put(tally_ptrmap_t *m, uintptr_t key, tally_block_t *b)
{
    if (TALLY_UNLIKELY((m->count + 1) * 2 > m->mask + 1) && grow(m))
        return -TALLY_ENOMEM;
    tally__ptrmap_put_room(m, key, b);
    return 0;
}

tally_block_t *tally__ptrmap_get(const tally_ptrmap_t *m, uintptr_t key)
{
    if (!m->slots || !key)
        return NULL;
    size_t i = tally__ptrmap_slot(key, m->mask);
    while (m->slots[i].key) {
        if (m->slots[i].key == key)
            return m->slots[i].val;
        i = (i + 1) & m->mask;
    }
    return NULL;
}

/* Backward shift from hole: pull later entries of the probe run into it. */
__attribute__((noinline)) void tally__ptrmap_shift_back(tally_ptrmap_t *m, size_t hole)
{
    for (size_t j = (hole + 1) & m->mask; m->slots[j].key; j = (j + 1) & m->mask) {
        size_t home = tally__ptrmap_slot(m->slots[j].key, m->mask);
        /* Entry j may move to hole if hole lies cyclically in [home, j). */
        bool movable = hole <= j ? (home <= hole || home > j) : (home <= hole && home > j);
        if (movable) {
            m->slots[hole] = m->slots[j];
            hole = j;
        }
    }
    m->slots[hole].key = 0;
}

tally_block_t *tally__ptrmap_take(tally_ptrmap_t *m, uintptr_t key)
{
    if (!m->slots || !key)
        return NULL;
    return tally__ptrmap_take_inline(m, key);
}

void tally__ptrmap_free(tally_ptrmap_t *m)
{
    tally__meta_free(m->slots);
    memset(m, 0, sizeof *m);
}
