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

static void root_insert(tally_block_t **slot, tally_block_t *b)
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
        slot = block_cmp(b, *slot) < 0 ? &(*slot)->left : &(*slot)->right;
    split(*slot, b, &b->left, &b->right);
    *slot = b;
}

static bool root_erase(tally_block_t **slot, tally_block_t *b)
{
    if (*slot == b && !b->left && !b->right) {
        *slot = NULL;
        return true;
    }
    while (*slot && *slot != b)
        slot = block_cmp(b, *slot) < 0 ? &(*slot)->left : &(*slot)->right;
    if (!*slot)
        return false;
    *slot = merge(b->left, b->right);
    b->left = b->right = NULL;
    return true;
}

/* ---- the small pool: exact size bins per stream ---------------------------
 * Small-pool blocks are multiples of 512 B up to 2 MiB, so each stream gets
 * 4096 bins, one per size, each a treap ordered by address, and a two-level
 * bitmap of non-empty bins. The best fit is the lowest address in the first
 * non-empty bin at or above the request: the same block the ordered set
 * would give, found with two bit scans instead of a tree descent. */

static tally_binset_t *binset_find(tally_pool_t *p, void *stream)
{
    if (p->nsets && p->sets[p->last_set]->stream == stream)
        return p->sets[p->last_set];
    for (uint32_t i = 0; i < p->nsets; i++) {
        if (p->sets[i]->stream == stream) {
            p->last_set = i;
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
        tally_binset_t **grown = tally__meta_alloc(cap * sizeof *grown);
        if (!grown)
            return NULL;
        if (p->nsets)
            memcpy(grown, p->sets, p->nsets * sizeof *grown);
        tally__meta_free(p->sets);
        p->sets = grown;
        p->cap_sets = cap;
    }
    set = tally__meta_calloc(sizeof *set);
    if (!set)
        return NULL;
    set->stream = stream;
    p->sets[p->nsets] = set;
    p->last_set = p->nsets++;
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
    if (!set->roots[i]) {
        /* An empty bin (the common case): no descent, no call. */
        b->left = b->right = NULL;
        set->roots[i] = b;
    } else {
        root_insert(&set->roots[i], b);
    }
    set->bits[i >> 6] |= 1ull << (i & 63);
    set->summary |= 1ull << (i >> 6);
}

static inline void bin_erase(tally_binset_t *set, tally_block_t *b)
{
    uint32_t i = bin_of(b->size);
    if (set->roots[i] == b && !b->left && !b->right)
        set->roots[i] = NULL; /* the bin's only block */
    else
        root_erase(&set->roots[i], b);
    if (!set->roots[i]) {
        set->bits[i >> 6] &= ~(1ull << (i & 63));
        if (!set->bits[i >> 6])
            set->summary &= ~(1ull << (i >> 6));
    }
}

static tally_block_t *leftmost(tally_block_t *t)
{
    while (t && t->left)
        t = t->left;
    return t;
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

static tally_block_t *bin_lower_bound(tally_binset_t *set, size_t size)
{
    uint32_t i = size < 512 ? 0 : bin_of(size);
    if (i >= TALLY_SMALL_BINS || (i = bin_first_from(set, i)) == TALLY_SMALL_BINS)
        return NULL;
    return leftmost(set->roots[i]);
}

/* The small pool's best fit for size (>= 512 B, <= 2 MiB) on stream, taken
 * out of its bin in the same step: the lowest address of the first
 * non-empty bin at or above size, the block tally__pool_lower_bound gives,
 * unlinked as tally__pool_erase would (a treap's leftmost node gives way to
 * its right subtree). NULL when no block fits. */
tally_block_t *tally__pool_small_take(tally_pool_t *p, void *stream, size_t size)
{
    tally_binset_t *set = binset_find(p, stream);
    if (!set)
        return NULL;
    uint32_t i = bin_first_from(set, bin_of(size)), w = i >> 6;
    if (i == TALLY_SMALL_BINS)
        return NULL;
    tally_block_t **slot = &set->roots[i], *b = *slot;
    while (b->left) {
        slot = &b->left;
        b = b->left;
    }
    *slot = b->right;
    b->right = NULL;
    if (!set->roots[i]) {
        set->bits[w] &= ~(1ull << (i & 63));
        if (!set->bits[w])
            set->summary &= ~(1ull << w);
    }
    p->count--;
    return b;
}

void tally__pool_insert(tally_pool_t *p, tally_block_t *b)
{
    b->gc_base = p->get_free_calls;
    if (p->kind == TALLY_POOL_SMALL) {
        /* tally__pool_prepare gave the segment its stream's bin set. */
        bin_insert(b->seg->bins, b);
    } else {
        root_insert(&p->root, b);
    }
    p->count++;
}

void tally__pool_erase(tally_pool_t *p, tally_block_t *b)
{
    if (p->kind == TALLY_POOL_SMALL) {
        bin_erase(b->seg->bins, b);
    } else if (!root_erase(&p->root, b)) {
        return;
    }
    p->count--;
}

tally_block_t *tally__pool_lower_bound(tally_pool_t *p, void *stream, size_t size)
{
    if (p->kind == TALLY_POOL_SMALL) {
        tally_binset_t *set = binset_find(p, stream);
        return set ? bin_lower_bound(set, size) : NULL;
    }
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

size_t tally__pool_walk(const tally_pool_t *p, void (*fn)(tally_block_t *, void *), void *arg)
{
    if (p->kind != TALLY_POOL_SMALL)
        return walk(p->root, fn, arg);
    size_t n = 0;
    /* Only the non-empty bins, through the bitmap. */
    for (uint32_t s = 0; s < p->nsets; s++) {
        const tally_binset_t *set = p->sets[s];
        for (uint64_t words = set->summary; words; words &= words - 1) {
            uint32_t w = (uint32_t)__builtin_ctzll(words);
            for (uint64_t bits = set->bits[w]; bits; bits &= bits - 1)
                n += walk(set->roots[(w << 6) + (uint32_t)__builtin_ctzll(bits)], fn, arg);
        }
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

static long verify(const tally_block_t *t, const tally_block_t *lo, const tally_block_t *hi)
{
    if (!t)
        return 0;
    if ((lo && block_cmp(lo, t) >= 0) || (hi && block_cmp(t, hi) >= 0))
        return -1;
    uint32_t prio = prio_of(t->addr);
    if ((t->left && prio_of(t->left->addr) > prio) || (t->right && prio_of(t->right->addr) > prio))
        return -1;
    long l = verify(t->left, lo, t);
    long r = verify(t->right, t, hi);
    if (l < 0 || r < 0)
        return -1;
    return l + r + 1;
}

long tally__pool_verify(const tally_pool_t *p)
{
    long n = 0;
    if (p->kind != TALLY_POOL_SMALL) {
        n = verify(p->root, NULL, NULL);
    } else {
        /* Word by word: an empty word's 64 roots are compared with NULLs in
         * one memcmp, so a check costs little for the thousands of empty
         * bins of each stream. */
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
                    long c = verify(roots[k], NULL, NULL);
                    if (c < 0 || !bin_members_ok(roots[k], set->stream, ((size_t)(w << 6) + k + 1) << 9))
                        return -1;
                    n += c;
                }
            }
        }
    }
    if (n >= 0 && (size_t)n != p->count)
        return -1;
    return n;
}
