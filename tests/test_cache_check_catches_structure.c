/* tally_check catches each broken invariant of the cache's structure it
 * claims to check: segments and their block chains (the head block, the
 * order, sizes on the 512 grid, prev links, unmerged free neighbours, block
 * states, the page accounting flag, the pointer map's entries, coverage of
 * the segment, the segment count), the pools (small, large, a graph pool's,
 * a private tag's), the pointer map's count and shape, and the event queue.
 * Each test corrupts one field of catchutil.h's fixture, requires the
 * check's own message, puts the field back and requires a pass (catchutil.h
 * says how). (Counts against their recounts: statistics, the ledger and
 * expandable segments' pages: test_cache_check_catches_counts.c.) */
#include "catchutil.h"

/* ---- segments and block chains ------------------------------------------ */

static void test_check_names_a_wrong_head_block(void **state)
{
    (void)state;
    tally_block_t *a = blk(small_p);
    tally_segment_t *s = a->seg;
    assert_ptr_equal(s->head, a);
    /* a head with a prev link */
    s->head->prev = a->next;
    EXPECT_FAIL("head block is wrong");
    s->head->prev = NULL;
    CHECK_OK();
    /* a head not at the segment's base */
    s->head = a->next;
    EXPECT_FAIL("head block is wrong");
    s->head = a;
    CHECK_OK();
    /* no head at all */
    s->head = NULL;
    EXPECT_FAIL("head block is wrong");
    s->head = a;
    CHECK_OK();
}

static void test_check_names_a_block_chained_in_the_wrong_place(void **state)
{
    (void)state;
    tally_block_t *a = blk(small_p), *r = a->next, *w = blk(whole_p);
    assert_non_null(r);
    /* its segment */
    r->seg = w->seg;
    EXPECT_FAIL("not chained in segment");
    r->seg = a->seg;
    CHECK_OK();
    /* its address */
    r->addr += 512;
    EXPECT_FAIL("not chained in segment");
    r->addr -= 512;
    CHECK_OK();
    /* its pool */
    a->pool = TALLY_POOL_LARGE;
    EXPECT_FAIL("not chained in segment");
    a->pool = TALLY_POOL_SMALL;
    CHECK_OK();
    /* its stream */
    a->stream = S3;
    EXPECT_FAIL("not chained in segment");
    a->stream = S1;
    CHECK_OK();
}

static void test_check_names_a_block_size_off_the_512_grid(void **state)
{
    (void)state;
    tally_block_t *a = blk(small_p);
    assert_int_equal(a->size, 512); /* 512 itself passes: the fixture */
    static const size_t bad[] = {0, 1, 511, 513, 1023};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tu_ctx("size %zu", bad[i]);
        a->size = bad[i];
        EXPECT_FAIL("is not a positive multiple of 512");
        a->size = 512;
        CHECK_OK();
    }
    /* A multiple of 512 that is wrong is caught, but not by this check. */
    tu_ctx("size 1024");
    a->size = 1024;
    EXPECT_FAIL_NOT("multiple of 512");
    a->size = 512;
    CHECK_OK();
}

static void test_check_names_a_broken_prev_link(void **state)
{
    (void)state;
    tally_block_t *a = blk(small_p), *r = a->next;
    r->prev = NULL;
    EXPECT_FAIL("next block's prev link is wrong");
    r->prev = r;
    EXPECT_FAIL("next block's prev link is wrong");
    r->prev = a;
    CHECK_OK();
}

static void test_check_names_two_adjacent_free_blocks(void **state)
{
    (void)state;
    tally_block_t *a = blk(small_p);
    assert_int_equal(a->next->state, BLOCK_FREE);
    a->state = BLOCK_FREE;
    EXPECT_FAIL("are both free and adjacent (not merged)");
    a->state = BLOCK_ALLOCATED;
    CHECK_OK();
}

static void test_check_names_a_free_block_with_uses_or_events(void **state)
{
    (void)state;
    tally_block_t *r = blk(small_p)->next;
    r->event_count = 1;
    EXPECT_FAIL("still has stream uses or events");
    r->event_count = 0;
    CHECK_OK();
    r->nuses = 1;
    EXPECT_FAIL("still has stream uses or events");
    r->nuses = 0;
    CHECK_OK();
}

static void test_check_names_a_wrong_page_accounting_flag(void **state)
{
    (void)state;
    tally_block_t *a = blk(small_p);
    a->paged = 1; /* not on an expandable segment */
    EXPECT_FAIL("page accounting flag is wrong");
    a->paged = 0;
    CHECK_OK();
}

static void test_check_names_a_block_missing_from_the_pointer_map(void **state)
{
    (void)state;
    tally_device_t *d = dev();
    tally_block_t *a = blk(small_p), *w = blk(whole_p);
    size_t slot = SIZE_MAX;
    for (size_t i = 0; i <= d->map.mask; i++)
        if (d->map.slots[i].key == a->addr)
            slot = i;
    assert_true(slot != SIZE_MAX);
    d->map.slots[slot].val = w; /* the address maps to another block */
    EXPECT_FAIL("allocated block");
    HAS(tally_last_error(), "is missing from the pointer map");
    d->map.slots[slot].val = a;
    CHECK_OK();
}

static void test_check_names_an_invalid_block_state(void **state)
{
    (void)state;
    tally_block_t *w = blk(whole_p);
    w->state = BLOCK_LENT + 1;
    EXPECT_FAIL("has invalid state 4");
    /* Lent only ever from an expandable segment, never a plain one. */
    w->state = BLOCK_LENT;
    EXPECT_FAIL("not a mapped piece of an expandable segment");
    w->state = 200;
    EXPECT_FAIL("has invalid state 200");
    w->state = BLOCK_ALLOCATED;
    CHECK_OK();
}

static void test_check_names_blocks_that_do_not_cover_their_segment(void **state)
{
    (void)state;
    tally_segment_t *s = blk(small_p)->seg;
    size_t size = s->size;
    s->size = size + 512;
    EXPECT_FAIL("blocks cover");
    s->size = size - 512;
    EXPECT_FAIL("blocks cover");
    s->size = size;
    CHECK_OK();
}

static void test_check_names_a_wrong_segment_count(void **state)
{
    (void)state;
    tally_device_t *d = dev();
    d->nsegments++;
    EXPECT_FAIL("segment list holds 3 segments, count says 4");
    d->nsegments -= 2;
    EXPECT_FAIL("segment list holds 3 segments, count says 2");
    d->nsegments++;
    CHECK_OK();
}

/* ---- pools --------------------------------------------------------------- */

static void test_check_names_a_broken_small_pool(void **state)
{
    (void)state;
    tally_device_t *d = dev();
    d->small.count++;
    EXPECT_FAIL("small pool: tree order broken");
    d->small.count--;
    CHECK_OK();
    /* A free block the pool does not hold: the remainder of the small
     * segment, taken out (its bin bit with it). */
    tally_block_t *r = blk(small_p)->next;
    tally__pool_erase(&d->small, r);
    EXPECT_FAIL("small pool: tree order broken or it holds other than the 1 free blocks");
    tally__pool_insert(&d->small, r);
    CHECK_OK();
}

static void test_check_names_a_broken_large_pool(void **state)
{
    (void)state;
    tally_device_t *d = dev();
    d->large.count++;
    EXPECT_FAIL("large pool: tree order broken");
    d->large.count--;
    CHECK_OK();
    /* A block marked free that the pool does not hold (it fills its
     * segment, so nothing else notices). */
    tally_block_t *w = blk(whole_p);
    w->state = BLOCK_FREE;
    EXPECT_FAIL("large pool: tree order broken or it holds other than the 2 free blocks");
    w->state = BLOCK_ALLOCATED;
    CHECK_OK();
}

static int gp_filter_all(void *arg, void *stream)
{
    (void)arg;
    (void)stream;
    return 1;
}

static void test_check_names_a_broken_graph_pool(void **state)
{
    (void)state;
    tally_device_t *d = dev();
    assert_int_equal(tally_graph_pool_begin(0, 7, 9, gp_filter_all, NULL), 0);
    void *g = tally_malloc(20 * MiB, 0, S3);
    void *gs = tally_malloc(3 * MiB, 0, S3);
    assert_non_null(g);
    assert_non_null(gs);
    assert_int_equal(tally_graph_pool_end(0, 7, 9), 0);
    CHECK_OK();
    tally_gpool_t *gp = d->gpools;
    assert_non_null(gp);
    assert_ptr_equal(blk(g)->seg->gp, gp);

    gp->large.count++;
    EXPECT_FAIL("graph pool (7, 9): tree order broken");
    gp->large.count--;
    CHECK_OK();
    gp->small.count++;
    EXPECT_FAIL("graph pool (7, 9): tree order broken");
    gp->small.count--;
    CHECK_OK();

    /* A graph segment's block marked free, in no pool: only the graph
     * pools' count tells. */
    tally_block_t *b = blk(g);
    b->state = BLOCK_FREE;
    EXPECT_FAIL("graph pools hold 1 free blocks, their segments 2");
    b->state = BLOCK_ALLOCATED;
    CHECK_OK();

    tally_free(g);
    tally_free(gs);
    assert_int_equal(tally_graph_pool_release(0, 7, 9), 0);
    CHECK_OK();
}

static void test_check_names_a_broken_private_pool(void **state)
{
    (void)state;
    tally_device_t *d = dev();
    assert_int_equal(tally_tag_push("priv"), 0);
    void *p = tally_malloc(1 * MiB, 0, S3);
    tally_tag_pop();
    assert_non_null(p);
    CHECK_OK();
    tally_gpool_t *pp = d->ppools;
    assert_non_null(pp);
    tu_ctx("private pool %u", pp->private_id);
    char want[64];
    snprintf(want, sizeof want, "private pool %u: tree order broken", pp->private_id);
    pp->small.count++;
    EXPECT_FAIL(want);
    pp->small.count--;
    CHECK_OK();
    pp->large.count++;
    EXPECT_FAIL(want);
    pp->large.count--;
    CHECK_OK();
    tally_free(p);
    CHECK_OK();
}

/* ---- the pointer map and the event queue --------------------------------- */

static void test_check_names_a_wrong_pointer_map_count(void **state)
{
    (void)state;
    tally_device_t *d = dev();
    d->map.count++;
    EXPECT_FAIL("pointer map holds 4 entries for 3 allocated blocks");
    d->map.count -= 2;
    EXPECT_FAIL("pointer map holds 2 entries for 3 allocated blocks");
    d->map.count++;
    CHECK_OK();
}

/* The map's capacity is a power of two (its probes wrap with the mask) and
 * the map at most half full. */
static void test_check_names_a_pointer_map_of_the_wrong_shape(void **state)
{
    (void)state;
    tally_device_t *d = dev();
    size_t mask = d->map.mask, count = d->map.count;
    d->map.mask = mask - 1;
    EXPECT_FAIL("is not a power of two");
    d->map.mask = mask;
    d->map.count = (mask + 1) / 2 + 1;
    EXPECT_FAIL("more than half full");
    d->map.count = (mask + 1) / 2; /* half full passes this check (the recount then differs) */
    EXPECT_FAIL("pointer map holds");
    d->map.count = count;
    CHECK_OK();
}

/* A block freed while its use on a held stream is outstanding: pending,
 * with one event queued. */
static void *make_pending(void)
{
    void *p = tally_malloc(1000, 0, S3);
    assert_non_null(p);
    assert_int_equal(tally_host_stream_hold(S4, 1), 0);
    assert_int_equal(tally_record_stream(p, S4), 0);
    tally_block_t *b = blk(p);
    tally_free(p);
    assert_int_equal(b->state, BLOCK_PENDING);
    assert_int_equal(b->event_count, 1);
    assert_non_null(dev()->events_head);
    assert_ptr_equal(dev()->events_head->block, b);
    CHECK_OK();
    return b;
}

static void release_pending(void)
{
    assert_int_equal(tally_host_stream_hold(S4, 0), 0);
    tally_empty_cache(-1);
    CHECK_OK();
}

static void test_check_names_a_pending_block_without_events(void **state)
{
    (void)state;
    tally_block_t *b = make_pending();
    b->event_count = 0;
    EXPECT_FAIL("has no outstanding event");
    /* deferred (waiting for a capture to end) is a reason to have none:
     * then only the queue's count disagrees. */
    b->deferred = 1;
    EXPECT_FAIL("event queue holds 1 events, blocks count 0");
    b->deferred = 0;
    b->event_count = 1;
    CHECK_OK();
    release_pending();
}

static void test_check_names_an_event_for_a_block_not_pending(void **state)
{
    (void)state;
    tally_block_t *b = make_pending();
    tally_event_entry_t *e = dev()->events_head;
    e->block = blk(small_p);
    EXPECT_FAIL("which is not pending");
    e->block = b;
    CHECK_OK();
    release_pending();
}

static void test_check_names_a_wrong_event_queue_tail(void **state)
{
    (void)state;
    make_pending();
    tally_device_t *d = dev();
    tally_event_entry_t *t = d->events_tail;
    d->events_tail = NULL;
    EXPECT_FAIL("event queue tail is wrong");
    d->events_tail = t;
    CHECK_OK();
    release_pending();
}

static void test_check_names_a_wrong_event_count(void **state)
{
    (void)state;
    tally_block_t *b = make_pending();
    b->event_count = 2;
    EXPECT_FAIL("event queue holds 1 events, blocks count 2");
    b->event_count = 1;
    CHECK_OK();
    release_pending();
}

int main(void)
{
    tu_conf(CONF);
    tally_set_sink(quiet, NULL);
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_check_names_a_wrong_head_block),
        T(test_check_names_a_block_chained_in_the_wrong_place),
        T(test_check_names_a_block_size_off_the_512_grid),
        T(test_check_names_a_broken_prev_link),
        T(test_check_names_two_adjacent_free_blocks),
        T(test_check_names_a_free_block_with_uses_or_events),
        T(test_check_names_a_wrong_page_accounting_flag),
        T(test_check_names_a_block_missing_from_the_pointer_map),
        T(test_check_names_an_invalid_block_state),
        T(test_check_names_blocks_that_do_not_cover_their_segment),
        T(test_check_names_a_wrong_segment_count),
        T(test_check_names_a_broken_small_pool),
        T(test_check_names_a_broken_large_pool),
        T(test_check_names_a_broken_graph_pool),
        T(test_check_names_a_broken_private_pool),
        T(test_check_names_a_pointer_map_of_the_wrong_shape),
        T(test_check_names_a_wrong_pointer_map_count),
        T(test_check_names_a_pending_block_without_events),
        T(test_check_names_an_event_for_a_block_not_pending),
        T(test_check_names_a_wrong_event_queue_tail),
        T(test_check_names_a_wrong_event_count),
    };
#undef T
    return cmocka_run_group_tests_name("check_structure", tests, NULL, NULL);
}
