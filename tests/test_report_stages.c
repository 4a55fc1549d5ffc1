/* The ownership ledger: what a stage's end reports (survivors grouped
 * largest first, nested stages, peaks, persistent tags, size units), the
 * cache released at a stage's end, and blocks on a foreign device flagged.
 *
 * Two simulated 80 GiB devices in virtual mode (LU_LEDGER_CONF); every test
 * frees what it takes and leaves no tag pushed and no stage open. */
#include "ledgerutil.h"

#define MB LU_MiB

/* ---- stage-end reports ------------------------------------------------------ */

static void test_stage_survivors_grouped_largest_first(void **state)
{
    (void)state;
    lu_cap_begin();
    void *before = lu_malloc(7 * MB, 0); /* before the stage: never a survivor */
    LU_OK(tally_stage_begin("surv"));
    LU_OK(tally_tag_push("small-t"));
    void *s1 = lu_malloc(3 * MB, 0);
    LU_OK(tally_tag_pop());
    LU_OK(tally_tag_push("big-t"));
    void *b1 = lu_malloc(20 * MB, 1);
    void *b2 = lu_malloc(20 * MB, 1);
    void *b3 = lu_malloc(10 * MB, 0);
    LU_OK(tally_tag_pop());
    LU_OK(tally_tag_push("weights"));
    void *w = lu_malloc(40 * MB, 0);
    LU_OK(tally_tag_pop());
    LU_OK(tally_tag_push("optimizer"));
    void *o = lu_malloc(60 * MB, 1);
    LU_OK(tally_tag_pop());
    LU_OK(tally_tag_push("gone-t"));
    tally_free(lu_malloc(50 * MB, 0));
    LU_OK(tally_tag_pop());
    LU_OK(tally_stage_end("surv"));
    lu_cap_end();
    const char *t = lu_cap_text();
    LU_HAS(t, "tally: stage surv ended after ");
    LU_HAS(t, "; 53.0 MiB in 4 blocks outlive it\n");
    const char *l1 = "tally: stage surv ended with 40.0 MiB still live under tag big-t on device 1 (2 blocks)\n";
    const char *l2 = "tally: stage surv ended with 10.0 MiB still live under tag big-t on device 0 (1 block)\n";
    const char *l3 = "tally: stage surv ended with 3.0 MiB still live under tag small-t on device 0 (1 block)\n";
    LU_HAS(t, l1);
    LU_HAS(t, l2);
    LU_HAS(t, l3);
    assert_true(lu_pos(t, l1) < lu_pos(t, l2));
    assert_true(lu_pos(t, l2) < lu_pos(t, l3));
    LU_EQ(lu_count(t, "still live under tag"), 3);
    /* Persistent tags, freed blocks and blocks from before stay out. */
    LU_LACKS(t, "tag weights");
    LU_LACKS(t, "tag optimizer");
    LU_LACKS(t, "gone-t");
    LU_LACKS(t, "tag untagged");
    LU_LACKS(t, "released"); /* release_at_stage_end is off */
    /* The JSON history carries the same survivors, in the same order. */
    tally_json_t *root = lu_report_json("surv.json");
    const tally_json_t *stages = lu_jarr(root, "stages");
    const tally_json_t *st = &stages->items[stages->len - 1];
    LU_STREQ(lu_jstr(st, "name"), "surv");
    LU_EQ(lu_jint(st, "survivor_bytes"), 53 * MB);
    LU_EQ(lu_jint(st, "survivor_blocks"), 4);
    const tally_json_t *sv = lu_jarr(st, "survivors");
    LU_EQ(sv->len, 3);
    LU_STREQ(lu_jstr(&sv->items[0], "tag"), "big-t");
    LU_EQ(lu_jint(&sv->items[0], "device"), 1);
    LU_EQ(lu_jint(&sv->items[0], "bytes"), 40 * MB);
    LU_EQ(lu_jint(&sv->items[0], "blocks"), 2);
    LU_STREQ(lu_jstr(&sv->items[1], "tag"), "big-t");
    LU_EQ(lu_jint(&sv->items[1], "device"), 0);
    LU_STREQ(lu_jstr(&sv->items[2], "tag"), "small-t");
    LU_EQ(lu_jint(&sv->items[2], "bytes"), 3 * MB);
    tally__json_free(root);
    void *all[] = {before, s1, b1, b2, b3, w, o};
    lu_free_all(all, 7);
    LU_CHECK_OK();
}

/* Survivors of equal size are listed device by device, lower first,
 * whatever their tags: in each of two stages one tag leaves 5 MiB on device
 * 0 and the other 5 MiB on device 1, the tags swapped in the second stage
 * (so whichever tag sorts first, one stage has it on device 1). The text
 * lines and the JSON history's survivors read device 0, then device 1. */
static void test_stage_survivors_of_equal_size_go_by_device(void **state)
{
    (void)state;
    static const char *const tags[2][2] = {{"tie-second", "tie-first"}, {"tie-first", "tie-second"}};
    LU_OK(tally_tag_push("tie-first")); /* named in this order */
    LU_OK(tally_tag_push("tie-second"));
    LU_OK(tally_tag_pop());
    LU_OK(tally_tag_pop());
    for (int round = 0; round < 2; round++) {
        void *p[2];
        lu_cap_begin();
        LU_OK(tally_stage_begin("ties"));
        for (int dev = 1; dev >= 0; dev--) { /* device 1's block first */
            LU_OK(tally_tag_push(tags[round][dev]));
            p[dev] = lu_malloc(5 * MB, dev);
            LU_OK(tally_tag_pop());
        }
        LU_OK(tally_stage_end("ties"));
        lu_cap_end();
        const char *t = lu_cap_text();
        char l0[160], l1[160];
        snprintf(l0, sizeof l0, "tally: stage ties ended with 5.0 MiB still live under tag %s on device 0 (1 block)\n",
                 tags[round][0]);
        snprintf(l1, sizeof l1, "tally: stage ties ended with 5.0 MiB still live under tag %s on device 1 (1 block)\n",
                 tags[round][1]);
        LU_HAS(t, l0);
        LU_HAS(t, l1);
        if (lu_pos(t, l0) > lu_pos(t, l1))
            fail_msg("round %d: device 1's survivor listed before device 0's:\n%s", round, t);
        tally_json_t *root = lu_report_json("ties.json");
        const tally_json_t *stages = lu_jarr(root, "stages");
        const tally_json_t *sv = lu_jarr(&stages->items[stages->len - 1], "survivors");
        LU_EQ(sv->len, 2);
        LU_EQ(lu_jint(&sv->items[0], "device"), 0);
        LU_EQ(lu_jint(&sv->items[1], "device"), 1);
        tally__json_free(root);
        lu_free_all(p, 2);
    }
    LU_CHECK_OK();
}

static void test_persistent_tags_are_runtime_configurable(void **state)
{
    (void)state;
    LU_OK(tally_configure("persistent_tags:weights|optimizer|kv-cache"));
    lu_cap_begin();
    LU_OK(tally_stage_begin("pers"));
    LU_OK(tally_tag_push("kv-cache"));
    void *a = lu_malloc(2 * MB, 0);
    LU_OK(tally_tag_pop());
    LU_OK(tally_tag_push("weights-extra")); /* not "weights": a whole-name match */
    void *b = lu_malloc(MB, 0);
    LU_OK(tally_tag_pop());
    LU_OK(tally_tag_push("weight")); /* a prefix of "weights": not it either */
    void *c = lu_malloc(3 * MB, 0);
    LU_OK(tally_tag_pop());
    LU_OK(tally_stage_end("pers"));
    lu_cap_end();
    LU_LACKS(lu_cap_text(), "tag kv-cache");
    LU_HAS(lu_cap_text(), "stage pers ended with 1.0 MiB still live under tag weights-extra on device 0 (1 block)");
    LU_HAS(lu_cap_text(), "stage pers ended with 3.0 MiB still live under tag weight on device 0 (1 block)");
    LU_OK(tally_configure("persistent_tags:weights|optimizer"));
    tally_free(a);
    tally_free(b);
    tally_free(c);
}

/* One tag in 300 stages is 300 ledger rows: a row is found by tag and
 * stage, never by tag alone (the table probes past rows of the same tag). */
static void test_ledger_rows_are_per_tag_and_stage(void **state)
{
    (void)state;
    enum { N = 300 };
    static void *blocks[N];
    lu_cap_begin();
    LU_OK(tally_tag_push("one-tag"));
    for (int i = 0; i < N; i++) {
        char name[32];
        snprintf(name, sizeof name, "rows-%d", i);
        LU_OK(tally_stage_begin(name));
        blocks[i] = lu_malloc(512 * (size_t)(i + 1), 0);
        LU_OK(tally_stage_end(name));
    }
    LU_OK(tally_tag_pop());
    lu_cap_end();
    LU_CHECK_OK();
    for (int i = 0; i < N; i += 37) {
        char name[32];
        snprintf(name, sizeof name, "rows-%d", i);
        LU_STREQ(tally_stage_name(lu_info(blocks[i]).stage), name);
    }
    lu_free_all(blocks, N);
    LU_CHECK_OK();
}

/* Sizes in the text reports: bytes below 1 KiB, then one decimal in the
 * largest binary unit that keeps the number at least 1. */
static void test_text_reports_size_units(void **state)
{
    (void)state;
    static const struct {
        uint64_t bytes;
        const char *text;
    } cases[] = {
        {0, "0 B"},
        {1023, "1023 B"},
        {1024, "1.0 KiB"},
        {1000 * 1024, "1000.0 KiB"},
        {1536 * 1024, "1.5 MiB"},
        {(uint64_t)1023 << 20, "1023.0 MiB"},
        {(uint64_t)5 << 30, "5.0 GiB"},
        {(uint64_t)3 << 40, "3.0 TiB"},
        {(uint64_t)2 << 50, "2.0 PiB"},
        {(uint64_t)4096 << 50, "4096.0 PiB"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char buf[32];
        tally__fmt_bytes(cases[i].bytes, buf, sizeof buf);
        LU_STREQ(buf, cases[i].text);
    }
}

static void test_nested_stage_survivors_count_in_the_outer(void **state)
{
    (void)state;
    lu_cap_begin();
    LU_OK(tally_stage_begin("nouter"));
    LU_OK(tally_tag_push("outer-keep"));
    void *a = lu_malloc(2 * MB, 1);
    LU_OK(tally_tag_pop());
    LU_OK(tally_stage_begin("ninner"));
    LU_OK(tally_tag_push("inner-keep"));
    void *b = lu_malloc(5 * MB, 0);
    LU_OK(tally_tag_pop());
    LU_OK(tally_tag_push("inner-gone"));
    void *c = lu_malloc(MB, 0);
    LU_OK(tally_tag_pop());
    LU_OK(tally_stage_end("ninner"));
    const char *t = lu_cap_text();
    LU_HAS(t, "stage ninner ended with 5.0 MiB still live under tag inner-keep on device 0 (1 block)");
    LU_HAS(t, "stage ninner ended with 1.0 MiB still live under tag inner-gone on device 0 (1 block)");
    LU_LACKS(t, "outer-keep"); /* allocated before the inner stage began */
    tally_free(c);
    lu_cap_begin();
    LU_OK(tally_stage_end("nouter"));
    lu_cap_end();
    t = lu_cap_text();
    LU_HAS(t, "; 7.0 MiB in 2 blocks outlive it");
    LU_HAS(t, "stage nouter ended with 5.0 MiB still live under tag inner-keep on device 0 (1 block)");
    LU_HAS(t, "stage nouter ended with 2.0 MiB still live under tag outer-keep on device 1 (1 block)");
    assert_true(lu_pos(t, "inner-keep") < lu_pos(t, "outer-keep"));
    LU_LACKS(t, "inner-gone");
    tally_free(a);
    tally_free(b);
    LU_CHECK_OK();
}

/* A stage's survivors are found by walking device 0's pointer map, every
 * slot of it, the last one too (lu_fill_to_last_slot puts one of the
 * stage's blocks there), and the stage's end counts each of them. */
static void test_stage_survivor_in_the_maps_last_slot_counts(void **state)
{
    (void)state;
    enum { MAX = 4096 };
    static void *p[MAX];
    lu_cap_begin();
    LU_OK(tally_stage_begin("lastslot"));
    LU_OK(tally_tag_push("lastslot-t"));
    size_t size = 0, n = lu_fill_to_last_slot(p, MAX, &size);
    LU_OK(tally_tag_pop());
    LU_OK(tally_stage_end("lastslot"));
    lu_cap_end();
    char want[160];
    snprintf(want, sizeof want, "still live under tag lastslot-t on device 0 (%zu block%s)", n, n == 1 ? "" : "s");
    LU_HAS(lu_cap_text(), want);
    tally_json_t *root = lu_report_json("lastslot.json");
    const tally_json_t *stages = lu_jarr(root, "stages");
    const tally_json_t *st = &stages->items[stages->len - 1];
    LU_STREQ(lu_jstr(st, "name"), "lastslot");
    LU_EQ(lu_jint(st, "survivor_blocks"), n);
    LU_EQ(lu_jint(st, "survivor_bytes"), n * size);
    tally__json_free(root);
    lu_free_all(p, n);
    LU_CHECK_OK();
}

static void test_stage_peaks_include_nested_stages(void **state)
{
    (void)state;
    lu_cap_begin();
    LU_OK(tally_stage_begin("pk-outer"));
    void *a = lu_malloc(8 * MB, 0);
    LU_OK(tally_stage_begin("pk-inner"));
    void *b = lu_malloc(16 * MB, 0);
    void *c = lu_malloc(4 * MB, 1);
    tally_free(b);
    tally_free(c);
    LU_OK(tally_stage_end("pk-inner"));
    tally_free(a);
    void *d = lu_malloc(2 * MB, 1);
    LU_OK(tally_stage_end("pk-outer"));
    lu_cap_end();
    const char *t = lu_cap_text();
    /* Peaks are summed over devices: 24 MiB on device 0 plus 4 MiB on device 1,
     * in the inner stage and (through it) in the outer. */
    LU_HAS(t, "stage pk-inner ended after ");
    LU_HAS(t, "peak allocated 28.0 MiB");
    LU_HAS(t, "stage pk-outer ended after ");
    long outer = lu_pos(t, "stage pk-outer ended after ");
    LU_HAS(t + outer, "peak allocated 28.0 MiB");
    /* Reserved: a 20 MiB segment for 8 MiB, a 16 MiB one for 16 MiB (the 12 MiB
     * remainder is too small), 20 MiB on device 1. */
    LU_HAS(t, "peak reserved 56.0 MiB");
    LU_HAS(t + outer, "peak reserved 56.0 MiB");
    tally_free(d);
    /* An outer peak reached before the inner stage began is not lost when the
     * inner one (with a lower peak) ends. */
    tally_empty_cache(-1);
    lu_cap_begin();
    LU_OK(tally_stage_begin("pk2-outer"));
    tally_free(lu_malloc(30 * MB, 0));
    LU_OK(tally_stage_begin("pk2-inner"));
    tally_free(lu_malloc(5 * MB, 0)); /* split from the cached 30 MiB block */
    LU_OK(tally_stage_end("pk2-inner"));
    LU_OK(tally_stage_end("pk2-outer"));
    lu_cap_end();
    t = lu_cap_text();
    LU_HAS(t, "stage pk2-inner ended after ");
    LU_HAS(t + lu_pos(t, "stage pk2-inner ended after "), "peak allocated 5.0 MiB, peak reserved 30.0 MiB;");
    LU_HAS(t + lu_pos(t, "stage pk2-outer ended after "), "peak allocated 30.0 MiB, peak reserved 30.0 MiB;");
}

/* Small-pool allocations raise their statistics without comparing them
 * with their peaks (lib/cache/cache.h): the stage window's allocated peak is
 * taken with the others, before any of them falls (a free) and when a stage
 * begins or ends. Device 0 holds nothing when the test begins. */
static void test_stage_peaks_of_small_blocks(void **state)
{
    (void)state;
    void *p[8];
    lu_cap_begin();
    /* Allocations alone: the peak is taken at the stage's end. */
    LU_OK(tally_stage_begin("sm1"));
    for (int i = 0; i < 8; i++)
        p[i] = lu_malloc(128 * LU_KiB, 0);
    LU_OK(tally_stage_end("sm1"));
    for (int i = 0; i < 8; i++)
        tally_free(p[i]);
    /* A fall, then fewer: the peak is taken at the first free. */
    LU_OK(tally_stage_begin("sm2"));
    for (int i = 0; i < 8; i++)
        p[i] = lu_malloc(128 * LU_KiB, 0);
    for (int i = 0; i < 8; i++)
        tally_free(p[i]);
    for (int i = 0; i < 4; i++)
        p[i] = lu_malloc(128 * LU_KiB, 0);
    LU_OK(tally_stage_end("sm2"));
    for (int i = 0; i < 4; i++)
        tally_free(p[i]);
    /* Reserved bytes that rise and are released within the stage. */
    LU_OK(tally_stage_begin("sm3"));
    tally_empty_cache(-1);
    tally_free(lu_malloc(128 * LU_KiB, 0));
    tally_empty_cache(-1);
    LU_OK(tally_stage_end("sm3"));
    lu_cap_end();
    const char *t = lu_cap_text();
    static const char *const want[][2] = {
        {"stage sm1 ended after ", "peak allocated 1.0 MiB, peak reserved 2.0 MiB;"},
        {"stage sm2 ended after ", "peak allocated 1.0 MiB, peak reserved 2.0 MiB;"},
        {"stage sm3 ended after ", "peak allocated 128.0 KiB, peak reserved 2.0 MiB;"},
    };
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        /* The stage's own line: the next stage's says the same of itself. */
        const char *line = t + lu_pos(t, want[k][0]);
        size_t len = strcspn(line, "\n");
        char buf[512];
        snprintf(buf, sizeof buf, "%.*s", (int)len, line);
        if (!strstr(buf, want[k][1]))
            fail_msg("'%s' lacks '%s'", buf, want[k][1]);
    }
    LU_CHECK_OK();
}

static void test_release_at_stage_end_drops_reserved(void **state)
{
    (void)state;
    LU_EQ(lu_reserved_all(), 0);
    LU_OK(tally_configure("release_at_stage_end:true"));
    lu_cap_begin();
    LU_OK(tally_stage_begin("rel"));
    LU_OK(tally_tag_push("rel-keep"));
    void *keep0 = lu_malloc(30 * MB, 0); /* its own 30 MiB segment, stays */
    void *keep1 = lu_malloc(3 * MB, 1);  /* in a 20 MiB segment, stays */
    LU_OK(tally_tag_pop());
    LU_OK(tally_tag_push("rel-scratch"));
    void *s[5];
    s[0] = lu_malloc(40 * MB, 0);  /* 40 MiB segment */
    s[1] = lu_malloc(18 * MB, 1);  /* 18 MiB segment (keep1's has 17 MiB free) */
    s[2] = lu_malloc(100000, 0);   /* 2 MiB small segment */
    s[3] = lu_malloc(2 * MB, 1);   /* split from keep1's segment: not released */
    s[4] = lu_malloc(22 * MB, 1);  /* 22 MiB segment */
    LU_OK(tally_tag_pop());
    lu_free_all(s, 5);
    tally_stats_t before0 = lu_stats(0), before1 = lu_stats(1);
    int64_t before = before0.reserved_bytes[0].current + before1.reserved_bytes[0].current;
    LU_EQ(before, (30 + 20 + 40 + 18 + 2 + 22) * (int64_t)MB);
    LU_OK(tally_stage_end("rel"));
    lu_cap_end();
    tally_stats_t after0 = lu_stats(0), after1 = lu_stats(1);
    int64_t after = after0.reserved_bytes[0].current + after1.reserved_bytes[0].current;
    LU_EQ(after, 50 * (int64_t)MB);
    LU_EQ(before - after, 82 * (int64_t)MB);
    LU_EQ(after0.num_device_free - before0.num_device_free, 2);
    LU_EQ(after1.num_device_free - before1.num_device_free, 2);
    const char *t = lu_cap_text();
    LU_HAS(t, "tally: stage rel released 82.0 MiB of cached segments; 50.0 MiB stays reserved\n");
    /* The released line comes after the survivors. */
    assert_true(lu_pos(t, "under tag rel-keep") < lu_pos(t, "released"));
    LU_LACKS(t, "rel-scratch");
    tally_json_t *root = lu_report_json("release.json");
    const tally_json_t *stages = lu_jarr(root, "stages");
    const tally_json_t *st = &stages->items[stages->len - 1];
    LU_STREQ(lu_jstr(st, "name"), "rel");
    LU_EQ(lu_jint(st, "released_bytes"), 82 * MB);
    tally__json_free(root);
    /* Off again: a stage end leaves the cache alone. */
    LU_OK(tally_configure("release_at_stage_end:false"));
    tally_free(keep0);
    lu_cap_begin();
    LU_OK(tally_stage_begin("norel"));
    LU_OK(tally_stage_end("norel"));
    lu_cap_end();
    LU_EQ(lu_reserved_all(), 50 * (int64_t)MB);
    LU_LACKS(lu_cap_text(), "released");
    tally_free(keep1);
    LU_CHECK_OK();
}

static void test_stage_report_can_be_turned_off(void **state)
{
    (void)state;
    LU_OK(tally_configure("stage_report:false"));
    lu_cap_begin();
    LU_OK(tally_stage_begin("quiet"));
    void *p = lu_malloc(MB, 0);
    LU_OK(tally_stage_end("quiet"));
    lu_cap_end();
    LU_OK(tally_configure("stage_report:true"));
    LU_EQ(strlen(lu_cap_text()), 0);
    /* The history still records it. */
    tally_json_t *root = lu_report_json("quiet.json");
    const tally_json_t *stages = lu_jarr(root, "stages");
    const tally_json_t *st = &stages->items[stages->len - 1];
    LU_STREQ(lu_jstr(st, "name"), "quiet");
    LU_EQ(lu_jint(st, "survivor_bytes"), MB);
    tally__json_free(root);
    tally_free(p);
}

static void test_foreign_device_is_flagged(void **state)
{
    (void)state;
    LU_OK(tally_configure("home_device:1"));
    lu_cap_begin();
    LU_OK(tally_stage_begin("fgn"));
    LU_OK(tally_tag_push("fgn-tag"));
    void *a = lu_malloc(6 * MB, 0);
    void *b = lu_malloc(2 * MB, 1);
    LU_OK(tally_tag_pop());
    LU_OK(tally_stage_end("fgn"));
    lu_cap_end();
    const char *t = lu_cap_text();
    LU_HAS(t, "stage fgn ended with 6.0 MiB still live under tag fgn-tag on device 0 (1 block) (foreign: home device "
              "is 1)\n");
    LU_HAS(t, "stage fgn ended with 2.0 MiB still live under tag fgn-tag on device 1 (1 block)\n");
    tally_json_t *root = lu_report_json("foreign.json");
    LU_EQ(lu_jint(root, "home_device"), 1);
    const tally_json_t *r0 = lu_ledger_row(root, "fgn-tag", "fgn", 0);
    const tally_json_t *r1 = lu_ledger_row(root, "fgn-tag", "fgn", 1);
    assert_non_null(r0);
    assert_non_null(r1);
    LU_EQ(lu_jbool(r0, "foreign"), 1);
    LU_EQ(lu_jbool(r1, "foreign"), 0);
    tally__json_free(root);
    lu_buf_t b2 = {0};
    LU_OK(tally_write_ledger(lu_buf_write, &b2));
    LU_HAS(lu_buf_str(&b2), "home device 1");
    LU_HAS(lu_buf_str(&b2), "foreign");
    lu_buf_free(&b2);
    LU_OK(tally_configure("home_device:none"));
    tally_free(a);
    tally_free(b);
}

/* ---- main ------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    const struct CMUnitTest tests[] = {
        LU_T(test_stage_survivors_grouped_largest_first),
        LU_T(test_stage_survivors_of_equal_size_go_by_device),
        LU_T(test_persistent_tags_are_runtime_configurable),
        LU_T(test_ledger_rows_are_per_tag_and_stage),
        LU_T(test_text_reports_size_units),
        LU_T(test_nested_stage_survivors_count_in_the_outer),
        LU_T(test_stage_survivor_in_the_maps_last_slot_counts),
        LU_T(test_stage_peaks_include_nested_stages),
        LU_T(test_stage_peaks_of_small_blocks),
        LU_T(test_release_at_stage_end_drops_reserved),
        LU_T(test_stage_report_can_be_turned_off),
        LU_T(test_foreign_device_is_flagged),
    };
    return LU_LEDGER_RUN("stage_reports", tests);
}
