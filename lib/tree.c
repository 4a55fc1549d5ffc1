/* Pools of free blocks: an intrusive treap ordered by (stream, size,
 * address), the order PyTorch's allocator searches in, so the lower bound of
 * (stream, size) is the best fit on that stream with the lowest address among
 * equals. Priorities come from the block's address, so the shape is
 * deterministic for a given history. No allocation happens here. */
#include "cache.h"

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

static inline uint32_t prio_of(uintptr_t addr)
{
    uint64_t x = (uint64_t)addr * 0x9E3779B97F4A7C15ull;
    x ^= x >> 29;
    return (uint32_t)(x >> 32) | 1u;
}

/* Split t into nodes less than b (*l) and the rest (*r). */
static void split(tally_block_t *t, const tally_block_t *b, tally_block_t **l, tally_block_t **r)
{
    while (t) {
        if (block_cmp(t, b) < 0) {
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
        if (a->prio > b->prio) {
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

void tally__pool_insert(tally_pool_t *p, tally_block_t *b)
{
    b->prio = prio_of(b->addr);
    b->gc_base = p->get_free_calls;
    tally_block_t **slot = &p->root;
    /* Descend while the existing nodes have higher priority. */
    while (*slot && (*slot)->prio > b->prio)
        slot = block_cmp(b, *slot) < 0 ? &(*slot)->left : &(*slot)->right;
    split(*slot, b, &b->left, &b->right);
    *slot = b;
    p->count++;
}

void tally__pool_erase(tally_pool_t *p, tally_block_t *b)
{
    tally_block_t **slot = &p->root;
    while (*slot && *slot != b)
        slot = block_cmp(b, *slot) < 0 ? &(*slot)->left : &(*slot)->right;
    if (!*slot)
        return;
    *slot = merge(b->left, b->right);
    b->left = b->right = NULL;
    p->count--;
}

tally_block_t *tally__pool_lower_bound(tally_pool_t *p, void *stream, size_t size)
{
    tally_block_t *t = p->root, *best = NULL;
    while (t) {
        if (key_cmp((uintptr_t)t->stream, t->size, t->addr, (uintptr_t)stream, size, 0) >= 0) {
            best = t;
            t = t->left;
        } else {
            t = t->right;
        }
    }
    return best;
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

size_t tally__pool_walk(const tally_pool_t *p, void (*fn)(tally_block_t *, void *), void *arg)
{
    return walk(p->root, fn, arg);
}

static long verify(const tally_block_t *t, const tally_block_t *lo, const tally_block_t *hi)
{
    if (!t)
        return 0;
    if ((lo && block_cmp(lo, t) >= 0) || (hi && block_cmp(t, hi) >= 0))
        return -1;
    if ((t->left && t->left->prio > t->prio) || (t->right && t->right->prio > t->prio))
        return -1;
    long l = verify(t->left, lo, t);
    long r = verify(t->right, t, hi);
    if (l < 0 || r < 0)
        return -1;
    return l + r + 1;
}

long tally__pool_verify(const tally_pool_t *p)
{
    long n = verify(p->root, NULL, NULL);
    if (n >= 0 && (size_t)n != p->count)
        return -1;
    return n;
}
