/* The ownership ledger: the OOM report names who holds the device (in
 * a child process, this binary re-executed with a 64 MiB device), and the
 * leak report groups blocks by allocation site (backtraces) or by owner.
 *
 * Two simulated 80 GiB devices in virtual mode (LU_LEDGER_CONF); every test
 * frees what it takes and leaves no tag pushed and no stage open. */
#include "ledgerutil.h"

#define MB LU_MiB

/* ---- out of memory (in a child with a 64 MiB device) ------------------------- */

static int child_oom(void)
{
    LU_REQUIRE(tally_stage_begin("fill") == 0);
    LU_REQUIRE(tally_tag_push("big-holder") == 0);
    void *big = tally_malloc(30 * MB, 0, NULL); /* 30 MiB segment */
    LU_REQUIRE(tally_tag_pop() == 0);
    LU_REQUIRE(tally_stage_begin("inner-fill") == 0);
    LU_REQUIRE(tally_tag_push("scratch") == 0);
    void *scratch = tally_malloc(12 * MB, 0, NULL); /* 12 MiB segment, freed: released on retry */
    LU_REQUIRE(tally_tag_pop() == 0);
    LU_REQUIRE(tally_tag_push("small-holder") == 0);
    void *small = tally_malloc(5 * MB, 0, NULL); /* 20 MiB segment, 15 cached */
    LU_REQUIRE(tally_tag_pop() == 0);
    LU_REQUIRE(big && small && scratch);
    tally_free(scratch);
    LU_REQUIRE(tally_stage_end("inner-fill") == 0);
    fprintf(stderr, "--- before the failing allocation\n");
    void *p = tally_malloc(16 * MB, 0, NULL);
    tally_stats_t s;
    tally_get_stats(0, &s);
    printf("result=%s\n", p ? "non-null" : "null");
    printf("error=%s\n", tally_last_error());
    printf("num_ooms=%lld\n", (long long)s.num_ooms);
    printf("check=%d\n", tally_check());
    void *q = tally_malloc(MB, 0, NULL); /* still serves what fits */
    printf("after=%s\n", q ? "non-null" : "null");
    tally_free(q);
    tally_free(small);
    tally_free(big);
    LU_REQUIRE(tally_stage_end("fill") == 0);
    return 0;
}

/* Run child role on one host device of capacity_mib MiB (no leak report):
 * it exits 0 after an allocation that failed (result=null). */
static void run_oom_child(lu_child_t *c, const char *role, int capacity_mib)
{
    char conf[128];
    snprintf(conf, sizeof conf, "backend:host,host_devices:1,host_capacity:%dMiB,host_mode:virtual,leak_report:off",
             capacity_mib);
    lu_child_run(c, role, conf, NULL);
    LU_CHILD_EXIT(c, 0);
    LU_HAS(c->out, "result=null\n");
}

/* The same for a child that writes a marker before its failing allocation:
 * the report from there on. */
static const char *oom_child_report(lu_child_t *c, const char *role, int capacity_mib)
{
    run_oom_child(c, role, capacity_mib);
    const char *e = strstr(c->err, "--- before the failing allocation");
    assert_non_null(e);
    return e;
}

static void test_oom_report_names_the_holders(void **state)
{
    (void)state;
    lu_child_t c;
    const char *e = oom_child_report(&c, "oom", 64);
    LU_HAS(c.out, "error=out of memory");
    LU_HAS(c.out, "num_ooms=1\n");
    LU_HAS(c.out, "check=0\n");
    LU_HAS(c.out, "after=non-null\n");
    LU_HAS(e, "tally: out of memory on device 0: asked 16777216 bytes (16.0 MiB");
    LU_HAS(e, "simulated device 0 is full");
    LU_HAS(e, "tally:   reserved 50.0 MiB, of which 15.0 MiB cached and unallocated");
    LU_HAS(e, "of 64.0 MiB");
    LU_HAS(e, "tally:   who holds device 0:");
    const char *l1 = "tally:     30.0 MiB in 1 block: tag big-holder, stage fill\n";
    const char *l2 = "tally:     5.0 MiB in 1 block: tag small-holder, stage inner-fill\n";
    LU_HAS(e, l1);
    LU_HAS(e, l2);
    assert_true(lu_pos(e, l1) < lu_pos(e, l2));
    LU_LACKS(e, "tag scratch"); /* it holds nothing now */
    lu_child_free(&c);
}

/* A request whose segment is larger than its rounded size: 3 MiB needs a
 * 20 MiB segment (the large pool's rule for 1 to 10 MiB), which a 16 MiB
 * device cannot give; the report names all three sizes. */
static int child_oom_segment(void)
{
    void *p = tally_malloc(3 * MB, 0, NULL);
    printf("result=%s\n", p ? "non-null" : "null");
    return 0;
}

static void test_oom_report_names_the_segment_it_needed(void **state)
{
    (void)state;
    lu_child_t c;
    run_oom_child(&c, "oom-segment", 16);
    LU_HAS(c.err, "tally: out of memory on device 0: asked 3145728 bytes (3.0 MiB, rounded to 3145728, needing a "
                  "20.0 MiB segment): ");
    lu_child_free(&c);
}

/* The report lists at most ten owners, the largest first: eleven tags
 * holding 64 KiB times 1 to 11, then a request the 64 MiB device cannot
 * give. */
static int child_oom_eleven_holders(void)
{
    void *held[11];
    LU_REQUIRE(tally_stage_begin("crowd") == 0);
    for (int i = 0; i < 11; i++) {
        char tag[32];
        snprintf(tag, sizeof tag, "holder-%d", i + 1);
        LU_REQUIRE(tally_tag_push(tag) == 0);
        held[i] = tally_malloc((size_t)(i + 1) * 64 * 1024, 0, NULL);
        LU_REQUIRE(tally_tag_pop() == 0);
        LU_REQUIRE(held[i] != NULL);
    }
    fprintf(stderr, "--- before the failing allocation\n");
    void *p = tally_malloc(100 * MB, 0, NULL);
    printf("result=%s\n", p ? "non-null" : "null");
    for (int i = 0; i < 11; i++)
        tally_free(held[i]);
    LU_REQUIRE(tally_stage_end("crowd") == 0);
    return 0;
}

/* Two holders of 1 MiB each: tag tie-named-first is named before
 * tie-used-first, but the ledger's row of tie-used-first is made first. */
static int child_oom_ties(void)
{
    LU_REQUIRE(tally_tag_push("tie-named-first") == 0);
    LU_REQUIRE(tally_tag_pop() == 0);
    LU_REQUIRE(tally_tag_push("tie-used-first") == 0);
    void *a = tally_malloc(MB, 0, NULL);
    LU_REQUIRE(tally_tag_pop() == 0);
    LU_REQUIRE(tally_tag_push("tie-named-first") == 0);
    void *b = tally_malloc(MB, 0, NULL);
    LU_REQUIRE(tally_tag_pop() == 0);
    LU_REQUIRE(a && b);
    fprintf(stderr, "--- before the failing allocation\n");
    void *p = tally_malloc(100 * MB, 0, NULL);
    printf("result=%s\n", p ? "non-null" : "null");
    tally_free(a);
    tally_free(b);
    return 0;
}

/* Holders of equal size go by tag, in the order the tags were first named
 * (as the leak report's groups), not in the order their rows were made. */
static void test_oom_report_orders_equal_holders_by_tag(void **state)
{
    (void)state;
    lu_child_t c;
    const char *e = oom_child_report(&c, "oom-ties", 64);
    const char *first = strstr(e, "tally:     1.0 MiB in 1 block: tag tie-named-first, stage ");
    const char *second = strstr(e, "tally:     1.0 MiB in 1 block: tag tie-used-first, stage ");
    if (!first || !second || first > second)
        fail_msg("the holders of 1.0 MiB are missing or not in the order their tags were named:\n%s", e);
    lu_child_free(&c);
}

static void test_oom_report_lists_the_ten_largest_holders(void **state)
{
    (void)state;
    lu_child_t c;
    const char *e = oom_child_report(&c, "oom-eleven", 64);
    e = strstr(e, "tally:   who holds device 0:\n");
    assert_non_null(e);
    const char *at = e;
    for (int k = 11; k >= 2; k--) {
        char line[128];
        snprintf(line, sizeof line, "tally:     %d.0 KiB in 1 block: tag holder-%d, stage crowd\n", k * 64, k);
        const char *next = strstr(at, line);
        if (!next)
            fail_msg("holder-%d (\"%s\") is missing or out of order:\n%s", k, line, e);
        at = next + strlen(line);
    }
    LU_LACKS(e, "tag holder-1,"); /* the eleventh largest */
    lu_child_free(&c);
}

/* ---- allocation sites ---------------------------------------------------------- */

/* Two allocation sites. Each allocates n blocks from one call instruction
 * (the same full backtrace for all n). */
__attribute__((noinline)) static void site_one(size_t size, int n, void **out)
{
    for (int i = 0; i < n; i++) {
        out[i] = tally_malloc(size, 0, NULL);
        __asm__ volatile("" ::: "memory");
    }
}

static volatile int site_two_calls;

/* Different code from site_one, so the compiler cannot fold the two. */
__attribute__((noinline)) static void site_two(size_t size, int n, void **out)
{
    for (int i = 0; i < n; i++) {
        site_two_calls++;
        out[i] = tally_malloc(size, 0, NULL);
        __asm__ volatile("" ::: "memory");
    }
}

static volatile int two = 2, one = 1;

static void sites_case(int depth, const char *stage)
{
    char conf[64];
    snprintf(conf, sizeof conf, "backtrace_depth:%d", depth);
    LU_OK(tally_configure(conf));
    LU_OK(tally_stage_begin(stage));
    LU_OK(tally_tag_push("bt-tag"));
    void *ab[2], *c;
    site_one(4 * MB, two, ab);
    site_two(2 * MB, one, &c);
    void *a = ab[0], *b = ab[1];
    LU_OK(tally_tag_pop());
    lu_cap_begin();
    LU_OK(tally_stage_end(stage));
    lu_cap_end();
    LU_OK(tally_configure("backtrace_depth:0"));
    assert_true(a && b && c);
    lu_buf_t buf = {0};
    LU_OK(tally_write_leaks(1, lu_buf_write, &buf));
    const char *t = lu_buf_str(&buf);
    char g1[128], g2[128];
    snprintf(g1, sizeof g1, "tally: 8388608 bytes (8.0 MiB) in 2 blocks: tag bt-tag, stage %s, device 0\n", stage);
    snprintf(g2, sizeof g2, "tally: 2097152 bytes (2.0 MiB) in 1 block: tag bt-tag, stage %s, device 0\n", stage);
    LU_HAS(t, g1);
    LU_HAS(t, g2);
    assert_true(lu_pos(t, g1) < lu_pos(t, g2));
    /* Each site prints its frames once, under its "Direct leak" line, before
     * its groups (LeakSanitizer's shape). */
    const char *h1 = "tally: Direct leak of 8388608 bytes (8.0 MiB) in 2 blocks allocated from:\ntally:     #0 ";
    const char *h2 = "tally: Direct leak of 2097152 bytes (2.0 MiB) in 1 block allocated from:\ntally:     #0 ";
    LU_HAS(t, h1);
    LU_HAS(t, h2);
    assert_true(lu_pos(t, h1) < lu_pos(t, g1) && lu_pos(t, g1) < lu_pos(t, h2) && lu_pos(t, h2) < lu_pos(t, g2));
    const char *f1 = strstr(t, h1) + strlen(h1);
    if (depth > 1)
        LU_HAS(f1, "tally:     #1 ");
    /* The JSON leaks name the two sites differently. */
    tally_json_t *root = lu_report_json("sites.json");
    const tally_json_t *leaks = lu_jarr(root, "leaks");
    const char *s1 = NULL, *s2 = NULL;
    for (size_t i = 0; i < leaks->len; i++) {
        const tally_json_t *g = &leaks->items[i];
        if (strcmp(lu_jstr(g, "stage"), stage) != 0)
            continue;
        if (lu_jint(g, "blocks") == 2)
            s1 = lu_jstr(g, "site");
        else
            s2 = lu_jstr(g, "site");
    }
    assert_non_null(s1);
    assert_non_null(s2);
    if (strcmp(s1, s2) == 0)
        fail_msg("two allocation sites have the same label \"%s\" (the label should be the first frame "
                 "outside tally, i.e. the caller of tally_malloc)",
                 s1);
    tally__json_free(root);
    lu_buf_free(&buf);
    tally_free(a);
    tally_free(b);
    tally_free(c);
}

static void test_backtrace_sites_split_leak_groups(void **state)
{
    (void)state;
    sites_case(8, "bt-stage");
}

static void test_one_frame_sites_are_the_callers(void **state)
{
    (void)state;
    /* With a single frame recorded, that frame must be the caller's: the
     * two sites then still give two groups. */
    sites_case(1, "bt1-stage");
}

static void test_leak_report_without_sites_groups_by_owner(void **state)
{
    (void)state;
    LU_OK(tally_stage_begin("lk-stage"));
    LU_OK(tally_tag_push("lk-tag"));
    void *a, *b;
    site_one(MB, one, &a);
    site_two(MB, one, &b);
    void *c = lu_malloc(MB, 1);
    LU_OK(tally_tag_pop());
    lu_cap_begin();
    LU_OK(tally_stage_end("lk-stage"));
    lu_cap_end();
    lu_buf_t buf = {0};
    LU_OK(tally_write_leaks(1, lu_buf_write, &buf));
    const char *t = lu_buf_str(&buf);
    LU_HAS(t, "tally: 2097152 bytes (2.0 MiB) in 2 blocks: tag lk-tag, stage lk-stage, device 0\n");
    LU_HAS(t, "tally: 1048576 bytes (1.0 MiB) in 1 block: tag lk-tag, stage lk-stage, device 1\n");
    LU_LACKS(t, "#0 ");
    LU_HAS(t, "tally: SUMMARY: ");
    lu_buf_free(&buf);
    /* Summary only: one line. */
    LU_OK(tally_write_leaks(0, lu_buf_write, &buf));
    LU_EQ(lu_count(lu_buf_str(&buf), "\n"), 1);
    LU_HAS(lu_buf_str(&buf), "tally: SUMMARY: 3145728 bytes still live in 3 blocks\n");
    lu_buf_free(&buf);
    /* On demand, the report says what is live now, not what is left at
     * exit; TALLY_LEAKS_AT_EXIT words it as the report at exit. */
    LU_OK(tally_write_leaks(TALLY_LEAKS_FULL, lu_buf_write, &buf));
    LU_HAS(lu_buf_str(&buf), "tally: live blocks: 3 blocks still live now, in 2 groups\n");
    LU_LACKS(lu_buf_str(&buf), "at exit");
    LU_LACKS(lu_buf_str(&buf), "leaked");
    lu_buf_free(&buf);
    LU_OK(tally_write_leaks(TALLY_LEAKS_FULL | TALLY_LEAKS_AT_EXIT, lu_buf_write, &buf));
    LU_HAS(lu_buf_str(&buf), "tally: leak report: 3 blocks still live at exit, in 2 groups\n");
    LU_HAS(lu_buf_str(&buf), "tally: SUMMARY: 3145728 bytes leaked in 3 blocks\n");
    lu_buf_free(&buf);
    tally_free(a);
    tally_free(b);
    tally_free(c);
    LU_OK(tally_write_leaks(1, lu_buf_write, &buf));
    LU_EQ(strlen(lu_buf_str(&buf)), 0);
    lu_buf_free(&buf);
}

/* The leak report walks device 0's whole pointer map, its last slot too:
 * each of a tag's blocks, one of them in that slot, is counted. */
static void test_leak_report_counts_a_block_in_the_maps_last_slot(void **state)
{
    (void)state;
    enum { MAX = 4096 };
    static void *p[MAX];
    LU_OK(tally_tag_push("lk-last"));
    size_t size = 0, n = lu_fill_to_last_slot(p, MAX, &size);
    LU_OK(tally_tag_pop());
    lu_buf_t buf = {0};
    LU_OK(tally_write_leaks(1, lu_buf_write, &buf));
    char want[160];
    snprintf(want, sizeof want, "tally: %zu bytes (", n * size);
    LU_HAS(lu_buf_str(&buf), want);
    snprintf(want, sizeof want, " in %zu block%s: tag lk-last, ", n, n == 1 ? "" : "s");
    LU_HAS(lu_buf_str(&buf), want);
    lu_buf_free(&buf);
    lu_free_all(p, n);
}

/* More groups than the report's first array holds (32): each of 40 tags is
 * its own group, every one named once, largest first. */
static void test_leak_report_names_every_one_of_forty_groups(void **state)
{
    (void)state;
    enum { NT = 40 };
    void *p[NT];
    char tag[32], want[160];
    for (int i = 0; i < NT; i++) {
        snprintf(tag, sizeof tag, "many-%02d", i);
        LU_OK(tally_tag_push(tag));
        p[i] = lu_malloc((size_t)(i + 1) * 4096, 0);
        LU_OK(tally_tag_pop());
    }
    lu_buf_t buf = {0};
    LU_OK(tally_write_leaks(1, lu_buf_write, &buf));
    const char *t = lu_buf_str(&buf), *at = t;
    for (int i = NT - 1; i >= 0; i--) {
        snprintf(want, sizeof want, "in 1 block: tag many-%02d, stage ", i);
        LU_EQ(lu_count(t, want), 1);
        const char *here = strstr(t, want);
        if (here < at)
            fail_msg("tag many-%02d's group is out of order (largest first):\n%s", i, t);
        at = here;
    }
    lu_buf_free(&buf);
    for (int i = 0; i < NT; i++)
        tally_free(p[i]);
}

/* Groups of equal size are listed device by device, lower first, whatever
 * their tags: two tags, each with one 3 MiB block on each device, allocated
 * in an order that puts a device 1 block first. */
static void test_leak_groups_of_equal_size_go_by_device(void **state)
{
    (void)state;
    static const struct {
        const char *tag;
        int device;
    } order[] = {{"eq-first", 1}, {"eq-second", 0}, {"eq-first", 0}, {"eq-second", 1}};
    void *p[4];
    for (int i = 0; i < 4; i++) {
        LU_OK(tally_tag_push(order[i].tag));
        p[i] = lu_malloc(3 * MB, order[i].device);
        LU_OK(tally_tag_pop());
    }
    lu_buf_t buf = {0};
    LU_OK(tally_write_leaks(1, lu_buf_write, &buf));
    const char *t = lu_buf_str(&buf);
    static const char group[] = "tally: 3145728 bytes (3.0 MiB) in 1 block: tag eq-";
    char devices[8] = "";
    int n = 0;
    for (const char *at = strstr(t, group); at && n < 7; at = strstr(at + 1, group)) {
        const char *eol = strchr(at, '\n');
        assert_non_null(eol);
        if (eol - at < 10 || strncmp(eol - 10, ", device ", 9) != 0)
            fail_msg("a group line that does not end with its device:\n%s", t);
        devices[n++] = eol[-1];
    }
    devices[n] = 0;
    if (strcmp(devices, "0011") != 0)
        fail_msg("groups of 3 MiB by device %s, expected 0011:\n%s", devices, t);
    lu_buf_free(&buf);
    for (int i = 0; i < 4; i++)
        tally_free(p[i]);
}

/* Groups of equal size on one device go by tag, then by stage, each in the
 * order its name was first used (docs/reports.md): tag lt-one is named
 * before lt-two and stage ls-one begins before ls-two, but lt-two's block is
 * taken in ls-one and lt-one's in ls-two, so ordering by stage first would
 * swap them; lt-one's second block, in ls-one, comes before its ls-two one. */
static void test_leak_groups_of_equal_size_go_by_tag_then_stage(void **state)
{
    (void)state;
    LU_OK(tally_tag_push("lt-one"));
    LU_OK(tally_tag_pop());
    LU_OK(tally_tag_push("lt-two"));
    LU_OK(tally_tag_pop());
    void *p[3];
    lu_cap_begin();
    LU_OK(tally_stage_begin("ls-one"));
    LU_OK(tally_tag_push("lt-two"));
    p[0] = lu_malloc(5 * MB, 0);
    LU_OK(tally_tag_pop());
    LU_OK(tally_tag_push("lt-one"));
    p[1] = lu_malloc(5 * MB, 0);
    LU_OK(tally_tag_pop());
    LU_OK(tally_stage_end("ls-one"));
    LU_OK(tally_stage_begin("ls-two"));
    LU_OK(tally_tag_push("lt-one"));
    p[2] = lu_malloc(5 * MB, 0);
    LU_OK(tally_tag_pop());
    LU_OK(tally_stage_end("ls-two"));
    lu_cap_end();
    lu_buf_t buf = {0};
    LU_OK(tally_write_leaks(1, lu_buf_write, &buf));
    const char *t = lu_buf_str(&buf);
    static const char *const want[] = {"tag lt-one, stage ls-one, device 0\n", "tag lt-one, stage ls-two, device 0\n",
                                       "tag lt-two, stage ls-one, device 0\n"};
    const char *at = t;
    for (int i = 0; i < 3; i++) {
        const char *here = strstr(t, want[i]);
        if (!here || here < at)
            fail_msg("group '%.*s' missing or out of order (tag, then stage):\n%s", (int)strlen(want[i]) - 1, want[i], t);
        at = here;
    }
    lu_buf_free(&buf);
    for (int i = 0; i < 3; i++)
        tally_free(p[i]);
}

/* ---- main ------------------------------------------------------------------------- */

static const lu_role_t roles[] = {
    {"oom", child_oom},
    {"oom-segment", child_oom_segment},
    {"oom-eleven", child_oom_eleven_holders},
    {"oom-ties", child_oom_ties},
    {NULL, NULL},
};

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "--child") == 0)
        return lu_child_main(argv[2], roles);
    const struct CMUnitTest tests[] = {
        LU_T(test_oom_report_names_the_holders),
        LU_T(test_oom_report_names_the_segment_it_needed),
        LU_T(test_oom_report_lists_the_ten_largest_holders),
        LU_T(test_oom_report_orders_equal_holders_by_tag),
        LU_T(test_backtrace_sites_split_leak_groups),
        LU_T(test_one_frame_sites_are_the_callers),
        LU_T(test_leak_report_without_sites_groups_by_owner),
        LU_T(test_leak_report_counts_a_block_in_the_maps_last_slot),
        LU_T(test_leak_report_names_every_one_of_forty_groups),
        LU_T(test_leak_groups_of_equal_size_go_by_device),
        LU_T(test_leak_groups_of_equal_size_go_by_tag_then_stage),
    };
    return LU_LEDGER_RUN("oom_and_leak_reports", tests);
}
