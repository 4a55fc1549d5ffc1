/* Pools of free blocks: an intrusive treap ordered by (stream, size,
 * address), the order PyTorch's allocator searches in, so the lower bound of
 * (stream, size) is the best fit on that stream with the lowest address among
 * equals. Priorities come from the block's address, so the shape is
 * deterministic for a given history; they are computed where they are compared,
 * so a block going into an empty bin (the common case) computes none. No
 * allocation happens here. */
#include "cache/cache.h"

#include <string.h>

static inline int key_cmp(uintptr_t s1, size_t z1, uintptr_t a1, uintptr_t s2, size_t z2, uintptr_t a2)
{
    if (s1 != s2)
        return s1 < s2 ? -1 : 1;
    if (z1 != z2)
        return z1 < z2 ? -1 : 1;
    if (a1 != a2)
        return a1 < a2 ? -1 : 1;
    return 0;
}

static inline int block_cmp(const tally_block_t *a, const tally_block_t *b)
{
    return key_cmp((uintptr_t)a->stream, a->size, a->addr, (uintptr_t)b->stream, b->size, b->addr);
}

/* Whether a sorts before b: by address alone inside one of the small pool's
 * bins (one stream, one size), else by the whole key. */
static inline __attribute__((always_inline)) bool before(const tally_block_t *a, const tally_block_t *b, bool by_addr)
{
    return by_addr ? a->addr < b->addr : block_cmp(a, b) < 0;
}

static inline uint32_t prio_of(uintptr_t addr)
{
    uint64_t x = (uint64_t)addr * 0x9E3779B97F4A7C15ull;
    x ^= x >> 29;
    return (uint32_t)(x >> 32) | 1u;
}

/* Split t into nodes less than b (*l) and the rest (*r). */
static inline __attribute__((always_inline)) void split(tally_block_t *t, const tally_block_t *b, tally_block_t **l,
                                                        tally_block_t **r, bool by_addr)
{
    while (t) {
        if (before(t, b, by_addr)) {
            *l = t;
            l = &t->right;
            t = t->right;
        } else {
            *r = t;
            r = &t->left;
            t = t->left;
        }
    }
    *l = NULL;
    *r = NULL;
}

static tally_block_t *merge(tally_block_t *a, tally_block_t *b)
{
    tally_block_t *root = NULL, **slot = &root;
    while (a && b) {
        if (prio_of(a->addr) > prio_of(b->addr)) {
            *slot = a;
            slot = &a->right;
            a = a->right;
        } else {
            *slot = b;
            slot = &b->left;
            b = b->left;
        }
    }
    *slot = a ? a : b;
    return root;
}

static inline __attribute__((always_inline)) void root_insert(tally_block_t **slot, tally_block_t *b, bool by_addr)
{
    if (!*slot) {
        /* An empty bin: the common case for exact-size bins. */
        b->left = b->right = NULL;
        *slot = b;
        return;
    }
    /* Descend while the existing nodes have higher priority. */
    uint32_t prio = prio_of(b->addr);
    while (*slot && prio_of((*slot)->addr) > prio)
        slot = before(b, *slot, by_addr) ? &(*slot)->left : &(*slot)->right;
    split(*slot, b, &b->left, &b->right, by_addr);
    *slot = b;
}

static inline __attribute__((always_inline)) bool root_erase(tally_block_t **slot, tally_block_t *b, bool by_addr)
{
    if (*slot == b && !b->left && !b->right) {
        *slot = NULL;
        return true;
    }
    while (*slot && *slot != b)
        slot = before(b, *slot, by_addr) ? &(*slot)->left : &(*slot)->right;
    if (!*slot)
        return false;
    *slot = merge(b->left, b->right);
    b->left = b->right = NULL;
    return true;
}

/* The treap operations the small pool's bins use (small.c). */
void tally__treap_insert(tally_block_t **slot, tally_block_t *b)
{
    root_insert(slot, b, true);
}

void tally__treap_erase(tally_block_t **slot, tally_block_t *b)
{
    root_erase(slot, b, true);
}

void tally__treap_insert_sized(tally_block_t **slot, tally_block_t *b)
{
    root_insert(slot, b, false);
}

void tally__treap_erase_sized(tally_block_t **slot, tally_block_t *b)
{
    root_erase(slot, b, false);
}

void tally__pool_insert(tally_pool_t *p, tally_block_t *b)
{
    b->gc_base = p->get_free_calls;
    if (p->kind == TALLY_POOL_SMALL) {
        /* tally__pool_prepare gave the segment its stream's bin set. */
        tally__bins_insert(b->seg->bins, b);
    } else {
        root_insert(&p->root, b, false);
    }
    p->count++;
}

void tally__pool_erase(tally_pool_t *p, tally_block_t *b)
{
    if (p->kind == TALLY_POOL_SMALL) {
        tally__bins_erase(b->seg->bins, b);
    } else if (!root_erase(&p->root, b, false)) {
        return;
    }
    p->count--;
}

tally_block_t *tally__pool_lower_bound(tally_pool_t *p, void *stream, size_t size)
{
    if (p->kind == TALLY_POOL_SMALL)
        return tally__bins_lower_bound(p, stream, size);
    tally_block_t *t = p->root, *best = NULL;
    while (t) {
        if (key_cmp((uintptr_t)t->stream, t->size, t->addr, (uintptr_t)stream, size, 0) >= 0) {
            best = t;
            t = t->left;
        } else {
            t = t->right;
        }
    }
    /* Only a block of this stream is a fit. */
    return best && best->stream == stream ? best : NULL;
}

tally_block_t *tally__pool_before(tally_pool_t *p, void *stream, size_t size, uintptr_t addr)
{
    tally_block_t *t = p->root, *best = NULL;
    while (t) {
        if (key_cmp((uintptr_t)t->stream, t->size, t->addr, (uintptr_t)stream, size, addr) < 0) {
            best = t;
            t = t->right;
        } else {
            t = t->left;
        }
    }
    return best;
}

tally_block_t *tally__pool_after(tally_pool_t *p, const tally_block_t *b)
{
    tally_block_t *t = p->root, *best = NULL;
    while (t) {
        if (block_cmp(t, b) > 0) {
            best = t;
            t = t->left;
        } else {
            t = t->right;
        }
    }
    return best && best->stream == b->stream ? best : NULL;
}

static size_t walk(tally_block_t *t, void (*fn)(tally_block_t *, void *), void *arg)
{
    size_t n = 0;
    /* Iterative in-order walk with an explicit stack (depth is bounded by
     * the treap's height; 128 levels covers any realistic pool). */
    tally_block_t *stack[128];
    int top = 0;
    while (t || top) {
        while (t) {
            if (top == 128)
                return n + walk(t, fn, arg);
            stack[top++] = t;
            t = t->left;
        }
        t = stack[--top];
        tally_block_t *right = t->right;
        fn(t, arg);
        n++;
        t = right;
    }
    return n;
}

size_t tally__treap_walk(tally_block_t *t, void (*fn)(tally_block_t *, void *), void *arg)
{
    return walk(t, fn, arg);
}

size_t tally__pool_walk(const tally_pool_t *p, void (*fn)(tally_block_t *, void *), void *arg)
{
    return p->kind == TALLY_POOL_SMALL ? tally__bins_walk(p, fn, arg) : walk(p->root, fn, arg);
}

/* Node count of the treap at t, ordered as its pool orders (by_addr: a
 * small-pool bin), or -1. */
static long verify(const tally_block_t *t, const tally_block_t *lo, const tally_block_t *hi, bool by_addr)
{
    if (!t)
        return 0;
    if ((lo && !before(lo, t, by_addr)) || (hi && !before(t, hi, by_addr)))
        return -1;
    uint32_t prio = prio_of(t->addr);
    if ((t->left && prio_of(t->left->addr) > prio) || (t->right && prio_of(t->right->addr) > prio))
        return -1;
    long l = verify(t->left, lo, t, by_addr);
    long r = verify(t->right, t, hi, by_addr);
    if (l < 0 || r < 0)
        return -1;
    return l + r + 1;
}

long tally__treap_verify(const tally_block_t *t)
{
    return verify(t, NULL, NULL, true);
}

long tally__treap_verify_sized(const tally_block_t *t)
{
    return verify(t, NULL, NULL, false);
}

long tally__pool_verify(const tally_pool_t *p)
{
    long n = p->kind == TALLY_POOL_SMALL ? tally__bins_verify(p) : verify(p->root, NULL, NULL, false);
    if (n >= 0 && (size_t)n != p->count)
        return -1;
    return n;
}
