/* The ownership ledger: misused frees (a double free, also after the
 * address was reused; a pointer tally never gave; tally_free_checked with
 * the wrong size or device) are reported and change nothing.
 *
 * Two simulated 80 GiB devices in virtual mode (LU_LEDGER_CONF); every test
 * frees what it takes and leaves no tag pushed and no stage open. */
#include "ledgerutil.h"

#define MB LU_MiB

/* ---- misuse ------------------------------------------------------------------ */

typedef struct snapshot {
    tally_stats_t s[2];
    lu_buf_t ledger;
} snapshot_t;

static void snap(snapshot_t *x)
{
    x->s[0] = lu_stats(0);
    x->s[1] = lu_stats(1);
    memset(&x->ledger, 0, sizeof x->ledger);
    LU_OK(tally_write_ledger(lu_buf_write, &x->ledger));
}

static void expect_same(snapshot_t *a, snapshot_t *b)
{
    for (int d = 0; d < 2; d++)
        if (memcmp(&a->s[d], &b->s[d], sizeof a->s[d]) != 0)
            fail_msg("statistics of device %d changed", d);
    LU_STREQ(lu_buf_str(&b->ledger), lu_buf_str(&a->ledger));
    lu_buf_free(&a->ledger);
    lu_buf_free(&b->ledger);
}

static void test_double_free_names_pointer_tag_and_stage(void **state)
{
    (void)state;
    LU_OK(tally_stage_begin("df-stage"));
    LU_OK(tally_tag_push("df-tag"));
    void *p = lu_malloc(3000, 0);
    void *keep = lu_malloc(3000, 0);
    LU_OK(tally_tag_pop());
    lu_cap_begin();
    LU_OK(tally_stage_end("df-stage"));
    tally_free(p);
    snapshot_t a, b;
    snap(&a);
    lu_cap_begin();
    tally_free(p);
    lu_cap_end();
    snap(&b);
    expect_same(&a, &b);
    char ptr[64];
    snprintf(ptr, sizeof ptr, "%p", p);
    const char *t = lu_cap_text();
    LU_EQ(lu_cap_lines(), 1);
    LU_HAS(t, "double free");
    LU_HAS(t, ptr);
    LU_HAS(t, "tag df-tag");
    LU_HAS(t, "stage df-stage");
    LU_HAS(t, "device 0");
    LU_HAS(t, "3000 bytes");
    LU_HAS(tally_last_error(), "double free");
    /* The checked free reports it too, and returns an error. */
    lu_cap_begin();
    LU_EQ(tally_free_checked(p, 3000, 0), -TALLY_EINVAL);
    lu_cap_end();
    LU_HAS(tally_last_error(), "double free");
    LU_HAS(tally_last_error(), "df-tag");
    LU_CHECK_OK();
    tally_free(keep);
}

/* A segment released to the backend lets the address come back (the host
 * backend, like the stand-in's cuMemAlloc, hands out the lowest free address
 * of the device first: lib/backend/host_arena.c). A double free must name
 * the block that was last freed at that address (new-owner, new-stage), not
 * the older record of the same address. */
static void test_double_free_after_address_reuse_names_the_latest_owner(void **state)
{
    (void)state;
    lu_cap_begin();
    void *a = NULL, *b = NULL;
    for (int attempt = 0; attempt < 8 && (!b || a != b); attempt++) {
        if (b)
            tally_free(b);
        LU_OK(tally_stage_begin("old-stage"));
        LU_OK(tally_tag_push("old-owner"));
        a = lu_malloc(30 * MB, 0);
        LU_OK(tally_tag_pop());
        LU_OK(tally_stage_end("old-stage"));
        tally_free(a);
        LU_EQ(tally_empty_cache(0), 30 * MB); /* its segment goes back */
        LU_OK(tally_stage_begin("new-stage"));
        LU_OK(tally_tag_push("new-owner"));
        b = lu_malloc(30 * MB, 0);
        LU_OK(tally_tag_pop());
        LU_OK(tally_stage_end("new-stage"));
    }
    lu_cap_end();
    if (a != b) {
        tally_free(b);
        SKIP("the host backend never reused the address; nothing to check");
    }
    tally_free(b);
    snapshot_t x, y;
    snap(&x);
    lu_cap_begin();
    tally_free(b);
    lu_cap_end();
    snap(&y);
    expect_same(&x, &y);
    const char *t = lu_cap_text();
    LU_HAS(t, "double free");
    LU_HAS(t, "device 0");
    LU_HAS(t, "tag new-owner");
    LU_HAS(t, "stage new-stage");
    LU_LACKS(t, "old-owner");
    LU_CHECK_OK();
}

/* Once the block's segment has gone back to the backend (empty_cache), a
 * second free is still named a double free, with the block's tag, stage,
 * device and size, and any other use of the pointer a use after free. */
static void test_double_free_after_its_segment_was_released(void **state)
{
    (void)state;
    lu_cap_begin();
    LU_OK(tally_stage_begin("gone-stage"));
    LU_OK(tally_tag_push("gone-tag"));
    void *p = lu_malloc(26 * MB, 1);
    LU_OK(tally_tag_pop());
    LU_OK(tally_stage_end("gone-stage"));
    tally_free(p);
    LU_EQ(tally_empty_cache(1), 26 * MB);
    lu_cap_end();
    snapshot_t x, y;
    snap(&x);
    lu_cap_begin();
    tally_free(p);
    lu_cap_end();
    snap(&y);
    expect_same(&x, &y);
    char ptr[64];
    snprintf(ptr, sizeof ptr, "%p", p);
    const char *t = lu_cap_text();
    LU_EQ(lu_cap_lines(), 1);
    LU_HAS(t, "tally_free: ");
    LU_HAS(t, "double free");
    LU_HAS(t, ptr);
    LU_HAS(t, "tag gone-tag");
    LU_HAS(t, "stage gone-stage");
    LU_HAS(t, "device 1");
    lu_cap_begin();
    LU_EQ(tally_record_stream(p, (void *)0x1234), -TALLY_EINVAL);
    lu_cap_end();
    LU_HAS(tally_last_error(), "use after free");
    LU_HAS(tally_last_error(), "gone-tag");
    LU_CHECK_OK();
}

static void test_free_of_unknown_pointer_changes_nothing(void **state)
{
    (void)state;
    LU_OK(tally_tag_push("unk-tag"));
    void *p = lu_malloc(5 * MB, 0);
    LU_OK(tally_tag_pop());
    int on_stack = 0;
    void *heap = malloc(64);
    snapshot_t a, b;
    snap(&a);
    lu_cap_begin();
    tally_free(&on_stack);
    LU_HAS(tally_last_error(), "not allocated by tally");
    tally_free(heap);
    LU_HAS(tally_last_error(), "not allocated by tally");
    /* Not 512-aligned, so never an address freed before (no double free). */
    tally_free((char *)p + 100); /* inside a live block */
    LU_HAS(tally_last_error(), "inside a segment");
    tally_free((char *)p + 6 * MB + 100); /* in the segment's free remainder */
    LU_HAS(tally_last_error(), "inside a segment");
    LU_EQ(tally_free_checked(&on_stack, 4, 0), -TALLY_EINVAL);
    LU_EQ(tally_record_stream(&on_stack, NULL), -TALLY_EINVAL);
    lu_cap_end();
    snap(&b);
    expect_same(&a, &b);
    char ptr[64];
    snprintf(ptr, sizeof ptr, "%p", (void *)&on_stack);
    LU_HAS(lu_cap_text(), ptr);
    LU_EQ(lu_cap_lines(), 6);
    free(heap);
    /* The block is intact and still owned by its tag. */
    LU_STREQ(lu_tag_of(p), "unk-tag");
    LU_EQ(lu_info(p).requested_size, 5 * MB);
    LU_CHECK_OK();
    tally_free(NULL); /* ignored, silently */
    tally_free(p);
    LU_CHECK_OK();
}

static void test_free_checked_wrong_size_or_device(void **state)
{
    (void)state;
    LU_OK(tally_tag_push("chk-tag"));
    void *a = lu_malloc(1000, 0);
    void *b = lu_malloc(7 * MB, 1);
    void *c = lu_malloc(4096, 1);
    LU_OK(tally_tag_pop());
    tally_stats_t s0 = lu_stats(0), s1 = lu_stats(1);
    lu_cap_begin();
    LU_EQ(tally_free_checked(a, 999, 0), -TALLY_EINVAL);
    LU_HAS(tally_last_error(), "1000");
    LU_HAS(tally_last_error(), "999");
    LU_EQ(tally_free_checked(b, 7 * MB, 0), -TALLY_EINVAL);
    LU_HAS(tally_last_error(), "device 1");
    LU_HAS(tally_last_error(), "not 0");
    LU_EQ(lu_cap_lines(), 2);
    /* Matching facts: no error, no line. */
    LU_OK(tally_free_checked(c, 4096, 1));
    LU_EQ(lu_cap_lines(), 2);
    lu_cap_end();
    /* Mismatches are freed anyway, from the record's facts. */
    tally_stats_t t0 = lu_stats(0), t1 = lu_stats(1);
    LU_EQ(s0.allocation[0].current - t0.allocation[0].current, 1);
    LU_EQ(s0.allocated_bytes[0].current - t0.allocated_bytes[0].current, 1024);
    LU_EQ(s0.requested_bytes[0].current - t0.requested_bytes[0].current, 1000);
    LU_EQ(s1.allocation[0].current - t1.allocation[0].current, 2);
    LU_EQ(s1.allocated_bytes[0].current - t1.allocated_bytes[0].current, 7 * MB + 4096);
    assert_int_not_equal(tally_block_info(a, &(tally_block_info_t){0}), 0);
    assert_int_not_equal(tally_block_info(b, &(tally_block_info_t){0}), 0);
    tally_json_t *root = lu_report_json("checked.json");
    LU_EQ(lu_jint(lu_ledger_row(root, "chk-tag", NULL, 0), "current_bytes"), 0);
    LU_EQ(lu_jint(lu_ledger_row(root, "chk-tag", NULL, 1), "current_bytes"), 0);
    tally__json_free(root);
    LU_CHECK_OK();
}

/* ---- main ------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    const struct CMUnitTest tests[] = {
        LU_T(test_double_free_names_pointer_tag_and_stage),
        LU_T(test_double_free_after_address_reuse_names_the_latest_owner),
        LU_T(test_double_free_after_its_segment_was_released),
        LU_T(test_free_of_unknown_pointer_changes_nothing),
        LU_T(test_free_checked_wrong_size_or_device),
    };
    return LU_LEDGER_RUN("free_misuse", tests);
}
