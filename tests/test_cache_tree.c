/* The free-block pools' ordered queries against a sorted list kept beside
 * them (lib/cache/tree.c, lib/cache/small.c).
 *
 * Block records are built by hand and put into a large pool (one treap over
 * (stream, size, address)) or a small pool (per-stream bins of exact sizes),
 * then erased at random; after every step each query is compared with a
 * brute-force answer over the blocks the test knows are in the pool:
 *   - lower bound: the smallest block of the stream at or above a size, the
 *     lowest address among equal sizes (PyTorch's best fit);
 *   - before (large pool): the greatest block strictly below a key, so that
 *     a walk down from a block never meets the block itself;
 *   - after (large pool): the next block of the same stream;
 *   - walk and verify: every block once, in order, and the count.
 * Nothing here goes through a device: the pools are the structures alone. */
#include "testutil.h"

#include "cache/cache.h"

#define NBLOCKS 400
#define NSTREAMS 3

static void *stream_of(int k)
{
    return STREAM(k + 1);
}

static int key_cmp(const tally_block_t *a, void *stream, size_t size, uintptr_t addr)
{
    if ((uintptr_t)a->stream != (uintptr_t)stream)
        return (uintptr_t)a->stream < (uintptr_t)stream ? -1 : 1;
    if (a->size != size)
        return a->size < size ? -1 : 1;
    if (a->addr != addr)
        return a->addr < addr ? -1 : 1;
    return 0;
}

typedef struct {
    tally_block_t *b[NBLOCKS];
    bool in[NBLOCKS];
} model_t;

/* Brute force: the least block in the pool with key >= (stream, size, 0) on
 * that stream, or NULL. */
static tally_block_t *want_lower_bound(const model_t *m, void *stream, size_t size)
{
    tally_block_t *best = NULL;
    for (int i = 0; i < NBLOCKS; i++)
        if (m->in[i] && m->b[i]->stream == stream && m->b[i]->size >= size &&
            (!best || key_cmp(m->b[i], best->stream, best->size, best->addr) < 0))
            best = m->b[i];
    return best;
}

/* The greatest block with key < (stream, size, addr), any stream, or NULL. */
static tally_block_t *want_before(const model_t *m, void *stream, size_t size, uintptr_t addr)
{
    tally_block_t *best = NULL;
    for (int i = 0; i < NBLOCKS; i++)
        if (m->in[i] && key_cmp(m->b[i], stream, size, addr) < 0 &&
            (!best || key_cmp(m->b[i], best->stream, best->size, best->addr) > 0))
            best = m->b[i];
    return best;
}

/* The least block above b on b's stream, or NULL. */
static tally_block_t *want_after(const model_t *m, const tally_block_t *b)
{
    tally_block_t *best = NULL;
    for (int i = 0; i < NBLOCKS; i++)
        if (m->in[i] && m->b[i]->stream == b->stream && key_cmp(m->b[i], b->stream, b->size, b->addr) > 0 &&
            (!best || key_cmp(m->b[i], best->stream, best->size, best->addr) < 0))
            best = m->b[i];
    return best;
}

typedef struct {
    const tally_block_t *last;
    size_t n;
    bool ordered;
} walk_t;

static void visit(tally_block_t *b, void *arg)
{
    walk_t *w = arg;
    if (w->last && key_cmp(w->last, b->stream, b->size, b->addr) >= 0)
        w->ordered = false;
    w->last = b;
    w->n++;
}

static size_t count_in(const model_t *m)
{
    size_t n = 0;
    for (int i = 0; i < NBLOCKS; i++)
        n += m->in[i];
    return n;
}

/* Every query on pool p agrees with the model; small: a small pool (no
 * before/after, which only the large pool has; its walk is ordered per
 * bin, not overall). */
static void check_queries(tally_pool_t *p, const model_t *m, bool small)
{
    size_t n = count_in(m);
    assert_int_equal(tally__pool_verify(p), (long)n);
    walk_t w = {NULL, 0, true};
    assert_int_equal(tally__pool_walk(p, visit, &w), n);
    assert_int_equal(w.n, n);
    if (!small)
        assert_true(w.ordered);
    for (int q = 0; q < 40; q++) {
        void *stream = stream_of((int)(tu_rand() % NSTREAMS));
        size_t size = (size_t)(tu_rand() % 4096 + 1) * 512;
        if (!small)
            size *= 4;
        tally_block_t *got = tally__pool_lower_bound(p, stream, size), *want = want_lower_bound(m, stream, size);
        if (got != want)
            fail_msg("lower bound of (%p, %zu): got %p, want %p", stream, size, (void *)got, (void *)want);
    }
    if (small)
        return;
    for (int i = 0; i < NBLOCKS; i++) {
        const tally_block_t *b = m->b[i];
        /* Below a block's own key: never the block itself. */
        tally_block_t *got = tally__pool_before(p, b->stream, b->size, b->addr);
        tally_block_t *want = want_before(m, b->stream, b->size, b->addr);
        if (got != want)
            fail_msg("before block %d (%zu bytes at %#lx): got %p, want %p", i, b->size, (unsigned long)b->addr,
                     (void *)got, (void *)want);
        if (m->in[i] && tally__pool_after(p, b) != want_after(m, b))
            fail_msg("after block %d: got %p, want %p", i, (void *)tally__pool_after(p, b), (void *)want_after(m, b));
    }
}

/* Insert every block, then erase them in a random order, checking the
 * queries after each tenth step. Sizes come from a few values, so that many
 * blocks tie on size and only the address orders them. */
static void churn(tally_pool_t *p, model_t *m, bool small)
{
    for (int i = 0; i < NBLOCKS; i++) {
        tally__pool_insert(p, m->b[i]);
        m->in[i] = true;
        if (i % 10 == 9)
            check_queries(p, m, small);
    }
    int order[NBLOCKS];
    for (int i = 0; i < NBLOCKS; i++)
        order[i] = i;
    for (int i = NBLOCKS - 1; i > 0; i--) {
        int j = (int)(tu_rand() % (uint64_t)(i + 1)), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (int k = 0; k < NBLOCKS; k++) {
        tally__pool_erase(p, m->b[order[k]]);
        m->in[order[k]] = false;
        if (k % 10 == 9)
            check_queries(p, m, small);
    }
    assert_int_equal(p->count, 0);
}

static void test_large_pool_queries_match_a_sorted_list(void **state)
{
    (void)state;
    static tally_block_t blocks[NBLOCKS];
    tally_pool_t pool = {.kind = TALLY_POOL_LARGE};
    model_t m = {0};
    static const size_t sizes[] = {2 * MiB, 4 * MiB, 20 * MiB, 22 * MiB, 64 * MiB};
    for (int i = 0; i < NBLOCKS; i++) {
        tally_block_t *b = &blocks[i];
        memset(b, 0, sizeof *b);
        b->stream = stream_of((int)(tu_rand() % NSTREAMS));
        b->size = sizes[tu_rand() % 5];
        b->addr = ((uintptr_t)i * 7919 % NBLOCKS + 1) << 30; /* distinct, not in insertion order */
        b->pool = TALLY_POOL_LARGE;
        m.b[i] = b;
    }
    churn(&pool, &m, false);
}

static void test_small_pool_bins_match_a_sorted_list(void **state)
{
    (void)state;
    static tally_block_t blocks[NBLOCKS];
    static tally_segment_t segs[NSTREAMS];
    tally_pool_t pool = {.kind = TALLY_POOL_SMALL};
    model_t m = {0};
    for (int s = 0; s < NSTREAMS; s++) {
        segs[s].stream = stream_of(s);
        assert_int_equal(tally__pool_prepare(&pool, segs[s].stream, &segs[s].bins), 0);
        assert_non_null(segs[s].bins);
    }
    static const size_t sizes[] = {512, 1024, 1536, 64 * KiB, 1 * MiB, 2 * MiB};
    for (int i = 0; i < NBLOCKS; i++) {
        tally_block_t *b = &blocks[i];
        memset(b, 0, sizeof *b);
        int s = (int)(tu_rand() % NSTREAMS);
        b->stream = segs[s].stream;
        b->seg = &segs[s];
        b->size = sizes[tu_rand() % 6];
        b->addr = ((uintptr_t)i * 7919 % NBLOCKS + 1) << 22;
        b->pool = TALLY_POOL_SMALL;
        m.b[i] = b;
    }
    churn(&pool, &m, true);
}

/* The bins' verifier returns -1 when any bin's treap is out of order,
 * whatever the other bins hold: one bin of four 512-byte blocks and one of
 * three 1 KiB blocks, each broken in turn by swapping its root's children. */
static void test_bins_verify_fails_on_any_broken_bin(void **state)
{
    (void)state;
    static tally_block_t blocks[7];
    static tally_segment_t seg;
    tally_pool_t pool = {.kind = TALLY_POOL_SMALL};
    seg.stream = stream_of(0);
    assert_int_equal(tally__pool_prepare(&pool, seg.stream, &seg.bins), 0);
    for (int i = 0; i < 7; i++) {
        tally_block_t *b = &blocks[i];
        memset(b, 0, sizeof *b);
        b->stream = seg.stream;
        b->seg = &seg;
        b->size = i < 4 ? 512 : 1024;
        b->addr = (uintptr_t)(i + 1) << 22;
        b->pool = TALLY_POOL_SMALL;
        tally__pool_insert(&pool, b);
    }
    assert_int_equal(tally__bins_verify(&pool), 7);
    for (int k = 0; k < 2; k++) { /* bin k holds blocks of (k + 1) * 512 bytes */
        tally_block_t *root = pool.sets[0]->roots[k];
        assert_non_null(root);
        assert_true(root->left || root->right);
        tally_block_t *l = root->left;
        root->left = root->right;
        root->right = l;
        if (tally__bins_verify(&pool) != -1)
            fail_msg("bin %d out of order: the verifier returned %ld, not -1", k, tally__bins_verify(&pool));
        root->right = root->left;
        root->left = l;
        assert_int_equal(tally__bins_verify(&pool), 7);
    }
    for (int i = 0; i < 7; i++)
        tally__pool_erase(&pool, &blocks[i]);
    assert_int_equal(tally__bins_verify(&pool), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_large_pool_queries_match_a_sorted_list),
        cmocka_unit_test(test_small_pool_bins_match_a_sorted_list),
        cmocka_unit_test(test_bins_verify_fails_on_any_broken_bin),
    };
    return cmocka_run_group_tests_name("cache_tree", tests, NULL, NULL);
}
