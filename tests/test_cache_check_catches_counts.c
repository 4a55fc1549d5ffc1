/* tally_check catches each count that disagrees with its recount: every
 * statistic (current, peak, the reserved total; and an accumulated reset,
 * after which the counts read from zero and the check still passes),
 * the ledger's rows, and an expandable segment's pages and handles; and it
 * says when it ran out of host memory for a recount. Each test corrupts one
 * field, requires the check's own message, puts the field back and
 * requires a pass (catchutil.h says how). (The cache's structure: block
 * chains, pools, the pointer map and the event queue:
 * test_cache_check_catches_structure.c.)
 *
 * The expandable-segment checks (tally__expand_check_locked) run in a
 * forked child configured with expandable_segments:true, since the
 * configuration is read once per process. */
#include "catchutil.h"

#include <sys/wait.h>
#include <unistd.h>

#define EXPAND_CONF                                                                                                \
    "backend:host,host_devices:1,host_capacity:8GiB,host_mode:virtual,leak_report:off,expandable_segments:true"

/* ---- statistics against the recount -------------------------------------- */

typedef struct stat_case {
    const char *name;
    size_t offset;
} stat_case_t;

#define STAT(n) {#n, offsetof(tally_stats_t, n)}
static const stat_case_t stat_cases[] = {
    STAT(allocation),     STAT(allocated_bytes),      STAT(active),          STAT(active_bytes),
    STAT(segment),        STAT(reserved_bytes),       STAT(inactive_split),  STAT(inactive_split_bytes),
    STAT(requested_bytes),
};
static const char *const pool_names[] = {"all", "small_pool", "large_pool"};

static tally_stat_t *stat_of(const stat_case_t *c, int pool)
{
    return (tally_stat_t *)((char *)&dev()->stats + c->offset) + pool;
}

/* Where a pool's count is kept: its entry, except for the active
 * statistics, which are allocation's plus the device's held counts
 * (lib/cache/cache.h). */
static tally_stat_t *count_of(const stat_case_t *c, int pool)
{
    if (!strcmp(c->name, "active"))
        return &dev()->held[pool];
    if (!strcmp(c->name, "active_bytes"))
        return &dev()->held_bytes[pool];
    return stat_of(c, pool);
}

/* The statistic's value now, as tally_get_stats reads it. */
static int64_t current_of(const stat_case_t *c, int pool)
{
    tally_stats_t st;
    assert_int_equal(tally_get_stats(0, &st), 0);
    return ((const tally_stat_t *)((const char *)&st + c->offset))[pool].current;
}

/* A statistic's current is its allocated less its freed, and the all
 * entries' totals are the sums of the pools' (lib/core/internal.h), not
 * state of their own: a pool's count is corrupted, and its own pool is
 * named. */
static void test_check_names_each_statistic_whose_current_is_off(void **state)
{
    (void)state;
    char want[96];
    for (size_t i = 0; i < sizeof stat_cases / sizeof stat_cases[0]; i++)
        for (int p = 1; p < 3; p++) {
            tally_stat_t *s = count_of(&stat_cases[i], p), keep = *s;
            tally_stat_t *pk = stat_of(&stat_cases[i], p), keep_pk = *pk;
            long long now = (long long)current_of(&stat_cases[i], p);
            tu_ctx("%s.%s", stat_cases[i].name, pool_names[p]);
            snprintf(want, sizeof want, "%s.%s.current is %lld, recount says %lld", stat_cases[i].name,
                     pool_names[p], now + 1, now);
            pk->peak++;
            s->allocated++;
            EXPECT_FAIL(want);
            *s = keep;
            *pk = keep_pk;
            CHECK_OK();
            snprintf(want, sizeof want, "%s.%s.current is %lld, recount says %lld", stat_cases[i].name,
                     pool_names[p], now - 1, now);
            s->freed++;
            EXPECT_FAIL(want);
            *s = keep;
            CHECK_OK();
        }
    /* The oversize counts (a max_split_size is not set: both are zero). */
    tally_stat_t *o[2] = {&dev()->stats.oversize_allocations, &dev()->stats.oversize_segments};
    const char *on[2] = {"oversize_allocations.all.current is 1", "oversize_segments.all.current is 1"};
    for (int i = 0; i < 2; i++) {
        tally_stat_t keep = *o[i];
        o[i]->peak++;
        o[i]->allocated++;
        EXPECT_FAIL(on[i]);
        *o[i] = keep;
        CHECK_OK();
    }
}

static void test_check_names_a_peak_below_current(void **state)
{
    (void)state;
    char want[96];
    for (size_t i = 0; i < sizeof stat_cases / sizeof stat_cases[0]; i++)
        for (int p = 0; p < 3; p++) {
            tally_stat_t *s = stat_of(&stat_cases[i], p), keep = *s;
            int64_t now = current_of(&stat_cases[i], p);
            tu_ctx("%s.%s", stat_cases[i].name, pool_names[p]);
            s->peak = now; /* equal passes */
            CHECK_OK();
            s->peak = now - 1; /* one below fails */
            snprintf(want, sizeof want, "%s.%s.peak %lld is below current %lld", stat_cases[i].name, pool_names[p],
                     (long long)now - 1, (long long)now);
            EXPECT_FAIL(want);
            *s = keep;
            CHECK_OK();
        }
    tally_stat_t *o = &dev()->stats.oversize_segments, keep = *o;
    o->peak = -1;
    EXPECT_FAIL("oversize_segments.all.peak -1 is below current 0");
    *o = keep;
    CHECK_OK();
}

/* PyTorch's accumulated reset: allocated and freed read 0, current and
 * peak stay, and counting goes on from there; the totals the check derives
 * current from are untouched, so it still passes. A block is allocated
 * between the last read and the reset, so that a reset working from totals
 * of that read (not synced again) would be seen. */
static void test_an_accumulated_reset_reads_zero_and_the_check_still_passes(void **state)
{
    (void)state;
    tally_stats_t before, after, later;
    assert_int_equal(tally_get_stats(0, &before), 0);
    assert_true(before.allocation[0].allocated > 0);
    void *held = tally_malloc(4096, 0, NULL);
    assert_non_null(held);
    assert_int_equal(tally_reset_accumulated_stats(0), 0);
    CHECK_OK();
    assert_int_equal(tally_get_stats(0, &after), 0);
    for (size_t i = 0; i < sizeof stat_cases / sizeof stat_cases[0]; i++)
        for (int p = 0; p < 3; p++) {
            const tally_stat_t *a = (const tally_stat_t *)((const char *)&after + stat_cases[i].offset) + p;
            tu_ctx("%s.%s", stat_cases[i].name, pool_names[p]);
            assert_int_equal(a->allocated, 0);
            assert_int_equal(a->freed, 0);
            assert_true(a->peak >= a->current);
        }
    assert_int_equal(after.allocation[0].current, before.allocation[0].current + 1);
    assert_int_equal(after.active[0].current, before.active[0].current + 1);
    assert_int_equal(after.active_bytes[1].current, before.active_bytes[1].current + 4096);
    tally_free(held);
    void *p = tally_malloc(4096, 0, NULL);
    assert_non_null(p);
    tally_free(p);
    CHECK_OK();
    assert_int_equal(tally_get_stats(0, &later), 0);
    assert_int_equal(later.allocation[0].allocated, 1);
    assert_int_equal(later.allocation[0].freed, 2);
    assert_int_equal(later.active[1].allocated, 1);
    assert_int_equal(later.active[1].freed, 2);
    assert_int_equal(later.allocated_bytes[0].allocated, 4096);
    assert_int_equal(later.allocation[0].current, before.allocation[0].current);
}

static void test_check_names_a_wrong_reserved_total(void **state)
{
    (void)state;
    tally_device_t *d = dev();
    uint64_t keep = d->reserved;
    d->reserved = keep + 512;
    EXPECT_FAIL("reserved total");
    HAS(tally_last_error(), "differs from the segments'");
    d->reserved = keep - 1;
    EXPECT_FAIL("reserved total");
    d->reserved = keep;
    CHECK_OK();
}

/* ---- the ledger ---------------------------------------------------------- */

static void test_check_names_a_block_with_the_wrong_ledger_row(void **state)
{
    (void)state;
    tally_ledger_dev_t *ld = dev()->ledger;
    tally_block_t *a = blk(small_p);
    uint32_t row = a->lentry;
    assert_true(row < ld->count);
    a->lentry = ld->count; /* past the rows: boundary */
    EXPECT_FAIL("does not match its tag/stage");
    /* The message names the block and the row it claims. */
    char want[96];
    a->lentry = ld->count + 40;
    snprintf(want, sizeof want, "block %p has ledger row %u that does not match", small_p, ld->count + 40);
    EXPECT_FAIL(want);
    a->lentry = row;
    CHECK_OK();
    a->tag++;
    EXPECT_FAIL("does not match its tag/stage");
    a->tag--;
    CHECK_OK();
    a->stage++;
    EXPECT_FAIL("does not match its tag/stage");
    a->stage--;
    CHECK_OK();
}

static void test_check_names_a_ledger_row_off_its_recount(void **state)
{
    (void)state;
    tally_ledger_dev_t *ld = dev()->ledger;
    tally_ledger_entry_t *e = &ld->entries[blk(small_p)->lentry];
    e->bytes.allocated++;
    EXPECT_FAIL("ledger row (tag");
    e->bytes.allocated--;
    CHECK_OK();
    e->blocks.freed++;
    EXPECT_FAIL("ledger row (tag");
    e->blocks.freed--;
    CHECK_OK();
}

static void test_check_says_it_ran_out_of_host_memory_for_the_ledger(void **state)
{
    (void)state;
    tally__meta_fail(1, 0);
    EXPECT_FAIL("out of host memory for the ledger recount");
    tally__meta_fail(0, 0);
    CHECK_OK();
}

/* ---- expandable segments (in a child) ------------------------------------ */

static void *ex_p, *ex_q;

static int ex_setup(void **state)
{
    (void)state;
    tu_context[0] = 0;
    ex_p = tally_malloc(3 * MiB, 0, S1);
    ex_q = tally_malloc(5 * MiB, 0, S1);
    assert_non_null(ex_p);
    assert_non_null(ex_q);
    tally_free(ex_q); /* its pages stay mapped, idle */
    ex_q = NULL;
    CHECK_OK();
    return 0;
}

static int ex_teardown(void **state)
{
    (void)state;
    tally_free(ex_p);
    tally_empty_cache(-1);
    CHECK_OK();
    return 0;
}

static tally_expand_t *ex_of(void)
{
    tally_expand_t *ex = blk(ex_p)->seg->ex;
    assert_non_null(ex);
    return ex;
}

static void flip_bit(uint64_t *bits, size_t p)
{
    bits[p >> 6] ^= (uint64_t)1 << (p & 63);
}

static size_t first_unmapped(const tally_expand_t *ex)
{
    for (size_t p = 0; p < ex->npages; p++)
        if (!ex->mapped[p])
            return p;
    fail_msg("no unmapped page");
    return 0;
}

/* One broken invariant of the pages: a field set to a bad value, or a bit
 * of a bitmap flipped; tally_check must fail naming msg (and also, when
 * given), then pass again once the field is put back. */
typedef struct page_case {
    const char *what; /* the invariant broken, for the failure message */
    void *at;         /* the field, or the bitmap's words */
    size_t width;     /* the field's bytes (1, 4 or 8); 0: bit `bit` of the bitmap */
    size_t bit;
    uint64_t bad;
    const char *msg, *also;
} page_case_t;

#define FIELD(what, lv, bad, msg, also) ((page_case_t){(what), &(lv), sizeof(lv), 0, (uint64_t)(bad), (msg), (also)})
#define BIT(what, bits, p, msg, also) ((page_case_t){(what), (bits), 0, (p), 0, (msg), (also)})
#define PAGE_CASES_MAX 24

/* Write v into the case's field and return what was there (a bit: flip
 * it, return 0; a second call flips it back). */
static uint64_t case_swap(const page_case_t *c, uint64_t v)
{
    uint8_t u8 = (uint8_t)v;
    uint32_t u32 = (uint32_t)v;
    uint64_t old = 0;
    switch (c->width) {
    case 0:
        flip_bit(c->at, c->bit);
        return 0;
    case 1:
        old = *(const uint8_t *)c->at;
        memcpy(c->at, &u8, 1);
        return old;
    case 4:
        old = *(const uint32_t *)c->at;
        memcpy(c->at, &u32, 4);
        return old;
    case 8:
        memcpy(&old, c->at, 8);
        memcpy(c->at, &v, 8);
        return old;
    default:
        fail_msg("%s: a field of %zu bytes", c->what, c->width);
        return 0;
    }
}

/* The broken invariants, on ex_setup's state: ex_p (3 MiB, pages 0-1) live
 * on the first handle, ex_q's pages idle after it, unmapped pages past it. */
static size_t page_cases(tally_expand_t *ex, tally_block_t *b, page_case_t *c)
{
    size_t n = 0, u = first_unmapped(ex), n0 = ex->hlen[0];
    assert_true(ex->mapped[0]);
    assert_int_equal(b->paged, 1);
    assert_true(n0 >= 1 && n0 < ex->npages);
    c[n++] = FIELD("a block on an unmapped page", ex->mapped[0], 0, "uses unmapped page 0", NULL);
    c[n++] = BIT("a live page marked idle", ex->idle_bits, 0, "page 0 of segment", "idle bit 1 is wrong");
    c[n++] = FIELD("a live count one too many", ex->live[0], ex->live[0] + 1, "live blocks, recount", NULL);
    c[n++] = FIELD("one page too many mapped", ex->nmapped, ex->nmapped + 1, "pages mapped (", NULL);
    c[n++] = FIELD("one page too many idle", ex->idle, ex->idle + 1, "pages mapped (", NULL);
    c[n++] = FIELD("an unmapped page that begins a handle", ex->hlen[u], 1, "is the first page of a handle", NULL);
    c[n++] = BIT("an unmapped page marked spare", ex->spare_bits, u, "is spare", NULL);
    c[n++] = FIELD("page 0 naming page 1 its handle's first", ex->hstart[0], ex->hstart[0] + 1,
                   "where one should begin", NULL);
    c[n++] = FIELD("a handle of no pages", ex->hlen[0], 0, "where one should begin", NULL);
    c[n++] = FIELD("a handle past the end of the range", ex->hlen[0], ex->npages + 1, "where one should begin", NULL);
    /* A handle of two pages or more: the page after its first. */
    size_t h = 0;
    while (h < ex->npages && ex->mapped[h] && ex->hlen[h] < 2)
        h += ex->hlen[h] ? ex->hlen[h] : 1;
    if (h < ex->npages && ex->mapped[h] && ex->hlen[h] >= 2) {
        c[n++] = FIELD("a page naming another first page of its handle", ex->hstart[h + 1], ex->hstart[h + 1] + 1,
                       "is not part of its handle", NULL);
        c[n++] = FIELD("a page inside a handle with a length of its own", ex->hlen[h + 1], 1,
                       "is not part of its handle", NULL);
    }
    /* Page 0's handle stretched over the page after it: that page (unmapped
     * or the start of a handle of its own) is not part of it. */
    c[n++] = FIELD("page 0's handle one page too long", ex->hlen[0], n0 + 1, "is not part of its handle at page 0",
                   NULL);
    if (n0 >= 2) /* a page of the handle with a spare bit its first page lacks */
        c[n++] = BIT("page 1 spare, its handle not", ex->spare_bits, 1, "is not part of its handle at page 0", NULL);
    c[n++] = FIELD("a handle's idle count one too many", ex->hidle[0], ex->hidle[0] + 1, "pages idle,", NULL);
    /* The recount first, then the count the segment keeps. */
    static char spare_both[64];
    snprintf(spare_both, sizeof spare_both, "%zu spare pages, %zu counted", (size_t)ex->spare, (size_t)ex->spare + 1);
    c[n++] = FIELD("one page too many spare", ex->spare, ex->spare + 1, "spare pages,", spare_both);
    c[n++] = FIELD("a block on the pages not counted on them", b->paged, 0, "page accounting flag is wrong", NULL);
    assert_true(n <= PAGE_CASES_MAX);
    return n;
}

static void test_check_names_each_broken_page_invariant(void **state)
{
    (void)state;
    page_case_t cases[PAGE_CASES_MAX];
    size_t n = page_cases(ex_of(), blk(ex_p), cases);
    for (size_t i = 0; i < n; i++) {
        const page_case_t *c = &cases[i];
        tu_ctx("%s", c->what);
        uint64_t keep = case_swap(c, c->bad);
        EXPECT_FAIL(c->msg);
        if (c->also)
            HAS(tally_last_error(), c->also);
        case_swap(c, keep);
        if (tally_check() != 0)
            fail_msg("%s:%d: %s, put back: tally_check failed: %s", __FILE__, __LINE__, c->what, tally_last_error());
    }
}

static void test_check_says_it_ran_out_of_host_memory_for_the_pages(void **state)
{
    (void)state;
    tally__meta_fail(1, 0);
    EXPECT_FAIL("out of host memory for the page recount");
    tally__meta_fail(0, 0);
    CHECK_OK();
}

static int run_expandable(void)
{
    tu_conf(EXPAND_CONF);
    tally_set_sink(quiet, NULL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_check_names_each_broken_page_invariant, ex_setup, ex_teardown),
        cmocka_unit_test_setup_teardown(test_check_says_it_ran_out_of_host_memory_for_the_pages, ex_setup,
                                        ex_teardown),
    };
    return cmocka_run_group_tests_name("expandable", tests, NULL, NULL);
}

int main(void)
{
    int child_failed = tu_run_child(run_expandable);

    tu_conf(CONF);
    tally_set_sink(quiet, NULL);
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_check_names_each_statistic_whose_current_is_off),
        T(test_check_names_a_peak_below_current),
        T(test_an_accumulated_reset_reads_zero_and_the_check_still_passes),
        T(test_check_names_a_wrong_reserved_total),
        T(test_check_names_a_block_with_the_wrong_ledger_row),
        T(test_check_names_a_ledger_row_off_its_recount),
        T(test_check_says_it_ran_out_of_host_memory_for_the_ledger),
    };
#undef T
    int failed = cmocka_run_group_tests_name("check_counts", tests, NULL, NULL);
    return failed || child_failed ? 1 : 0;
}
