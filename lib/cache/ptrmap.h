/* The pointer map: from a handed-out block's address to its record (ptrmap.c
 * has the design). Its type, the out-of-line operations, and the hash and
 * the two operations of PyTorch's pair, inline in the hot paths that use
 * them (small.c, lib/torch/torch_abi.c). */
#ifndef TALLY_PTRMAP_H
#define TALLY_PTRMAP_H

#include "core/internal.h"

typedef struct tally_block tally_block_t;

/* Open-addressing map from block address to block (handed-out blocks). A
 * key and its block share a slot, so a look-up reads one cache line. */
typedef struct tally_ptrslot {
    uintptr_t key; /* 0: empty */
    tally_block_t *val;
} tally_ptrslot_t;
typedef struct tally_ptrmap {
    tally_ptrslot_t *slots;
    size_t mask; /* capacity - 1 */
    size_t count;
} tally_ptrmap_t;

/* ptrmap.c */
int tally__ptrmap_init(tally_ptrmap_t *m, size_t capacity);
int tally__ptrmap_put(tally_ptrmap_t *m, uintptr_t key, tally_block_t *b);
tally_block_t *tally__ptrmap_get(const tally_ptrmap_t *m, uintptr_t key);
tally_block_t *tally__ptrmap_take(tally_ptrmap_t *m, uintptr_t key);
void tally__ptrmap_free(tally_ptrmap_t *m);
/* The home slot of key. Addresses are at least 512-byte aligned, so the
 * hash drops the low bits before mixing. */
static inline size_t tally__ptrmap_slot(uintptr_t key, size_t mask)
{
    uint64_t x = (uint64_t)(key >> 9) * 0x9E3779B97F4A7C15ull;
    return (size_t)(x >> 20) & mask;
}
/* The two halves of PyTorch's pair, inline there: a put into a map with
 * room for one more entry (the caller checked, so it cannot fail), and a
 * take from an allocated map (key not 0), whose backward shift, when the
 * probe run goes on after the entry, is out of line. */
static inline void tally__ptrmap_put_room(tally_ptrmap_t *m, uintptr_t key, tally_block_t *b)
{
    size_t i = tally__ptrmap_slot(key, m->mask);
    while (m->slots[i].key) {
        if (m->slots[i].key == key) {
            m->slots[i].val = b;
            return;
        }
        i = (i + 1) & m->mask;
    }
    m->slots[i].key = key;
    m->slots[i].val = b;
    m->count++;
}
void tally__ptrmap_shift_back(tally_ptrmap_t *m, size_t hole);
/* A take in two steps, for a caller that checks the block before taking
 * it: the slot of key (an allocated map, key not 0), or NULL; then the
 * removal of that slot's entry. */
static inline tally_ptrslot_t *tally__ptrmap_find_inline(tally_ptrmap_t *m, uintptr_t key)
{
    size_t i = tally__ptrmap_slot(key, m->mask);
    while (m->slots[i].key && m->slots[i].key != key)
        i = (i + 1) & m->mask;
    return m->slots[i].key ? &m->slots[i] : NULL;
}
static inline void tally__ptrmap_remove_inline(tally_ptrmap_t *m, tally_ptrslot_t *slot)
{
    size_t i = (size_t)(slot - m->slots);
    m->count--;
    if (TALLY_LIKELY(!m->slots[(i + 1) & m->mask].key))
        slot->key = 0; /* the run ends here: nothing to shift */
    else
        tally__ptrmap_shift_back(m, i);
}
static inline tally_block_t *tally__ptrmap_take_inline(tally_ptrmap_t *m, uintptr_t key)
{
    tally_ptrslot_t *slot = tally__ptrmap_find_inline(m, key);
    if (!slot)
        return NULL;
    tally_block_t *b = slot->val;
    tally__ptrmap_remove_inline(m, slot);
    return b;
}

#endif
