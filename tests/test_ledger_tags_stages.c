/* The ownership ledger: per-thread tags and process-wide stages: which
 * tag and stage own a block, the tag stack and stage nesting, name checks
 * (NULL, empty, overlong, control characters) and interning.
 *
 * Two simulated 80 GiB devices in virtual mode (LU_LEDGER_CONF); every test
 * frees what it takes and leaves no tag pushed and no stage open. */
#include "ledgerutil.h"

#define MB LU_MiB

/* ---- tags ---------------------------------------------------------------- */

static void test_untagged_blocks_show_untagged(void **state)
{
    (void)state;
    LU_STREQ(tally_tag_name(0), "untagged");
    LU_STREQ(tally_stage_name(0), "(none)");
    void *p = lu_malloc(1000, 0);
    tally_block_info_t i = lu_info(p);
    LU_EQ(i.tag, 0);
    LU_EQ(i.stage, 0);
    LU_STREQ(tally_tag_name(i.tag), "untagged");
    LU_STREQ(tally_stage_name(i.stage), "(none)");
    LU_OK(tally_tag_push("t-one"));
    void *q = lu_malloc(1000, 1);
    LU_STREQ(lu_tag_of(q), "t-one");
    LU_OK(tally_tag_pop());
    void *r = lu_malloc(1000, 0);
    LU_STREQ(lu_tag_of(r), "untagged");
    /* The ledger table names the untagged row too. */
    lu_buf_t b = {0};
    LU_OK(tally_write_ledger(lu_buf_write, &b));
    LU_HAS(lu_buf_str(&b), "untagged");
    LU_HAS(lu_buf_str(&b), "t-one");
    lu_buf_free(&b);
    void *all[] = {p, q, r};
    lu_free_all(all, 3);
    LU_CHECK_OK();
}

static void test_innermost_tag_owns_the_block(void **state)
{
    (void)state;
    LU_OK(tally_tag_push("outer-tag"));
    void *a = lu_malloc(4096, 0);
    LU_OK(tally_tag_push("inner-tag"));
    void *b = lu_malloc(4096, 0);
    void *c = lu_malloc(30 * MB, 1);
    LU_OK(tally_tag_pop());
    void *d = lu_malloc(4096, 1);
    LU_OK(tally_tag_pop());
    void *e = lu_malloc(4096, 0);
    LU_STREQ(lu_tag_of(a), "outer-tag");
    LU_STREQ(lu_tag_of(b), "inner-tag");
    LU_STREQ(lu_tag_of(c), "inner-tag");
    LU_STREQ(lu_tag_of(d), "outer-tag");
    LU_STREQ(lu_tag_of(e), "untagged");
    void *all[] = {a, b, c, d, e};
    lu_free_all(all, 5);
    LU_CHECK_OK();
}

typedef struct tag_thread {
    const char *tag;
    int device;
    pthread_barrier_t *barrier;
    void *before; /* allocated before pushing: untagged */
    void *tagged;
    void *after;  /* after popping: untagged again */
    int rc;
} tag_thread_t;

static void *tag_thread_main(void *arg)
{
    tag_thread_t *t = arg;
    t->before = tally_malloc(2048, t->device, NULL);
    t->rc |= tally_tag_push(t->tag);
    /* Both threads hold their own tag while both allocate. */
    pthread_barrier_wait(t->barrier);
    t->tagged = tally_malloc(3 * MB, t->device, NULL);
    pthread_barrier_wait(t->barrier);
    t->rc |= tally_tag_pop();
    t->after = tally_malloc(2048, t->device, NULL);
    return NULL;
}

static void test_tags_are_per_thread(void **state)
{
    (void)state;
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, 2);
    LU_OK(tally_tag_push("main-thread-tag"));
    tag_thread_t t[2] = {{"thread-a", 0, &barrier, NULL, NULL, NULL, 0},
                         {"thread-b", 1, &barrier, NULL, NULL, NULL, 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, tag_thread_main, &t[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&barrier);
    void *mine = lu_malloc(2048, 0);
    LU_OK(tally_tag_pop());
    for (int i = 0; i < 2; i++) {
        LU_EQ(t[i].rc, 0);
        assert_non_null(t[i].before);
        assert_non_null(t[i].tagged);
        assert_non_null(t[i].after);
        /* A new thread does not inherit the main thread's tag. */
        LU_STREQ(lu_tag_of(t[i].before), "untagged");
        LU_STREQ(lu_tag_of(t[i].tagged), t[i].tag);
        LU_STREQ(lu_tag_of(t[i].after), "untagged");
        LU_EQ(lu_info(t[i].tagged).device, t[i].device);
    }
    LU_STREQ(lu_tag_of(mine), "main-thread-tag");
    /* The ledger rows agree: one 3 MiB block per thread tag. */
    tally_json_t *root = lu_report_json("per-thread.json");
    const tally_json_t *ra = lu_ledger_row(root, "thread-a", NULL, 0);
    const tally_json_t *rb = lu_ledger_row(root, "thread-b", NULL, 1);
    assert_non_null(ra);
    assert_non_null(rb);
    LU_EQ(lu_jint(ra, "current_bytes"), 3 * MB);
    LU_EQ(lu_jint(rb, "current_bytes"), 3 * MB);
    LU_EQ(lu_jint(ra, "live_blocks"), 1);
    assert_null(lu_ledger_row(root, "thread-a", NULL, 1));
    assert_null(lu_ledger_row(root, "thread-b", NULL, 0));
    tally__json_free(root);
    for (int i = 0; i < 2; i++) {
        void *all[] = {t[i].before, t[i].tagged, t[i].after};
        lu_free_all(all, 3);
    }
    tally_free(mine);
    LU_CHECK_OK();
}

static void test_tag_pop_on_empty_stack_fails(void **state)
{
    (void)state;
    lu_cap_begin();
    LU_EQ(tally_tag_pop(), -TALLY_ESTATE);
    LU_HAS(tally_last_error(), "empty");
    LU_HAS(lu_cap_text(), "tally: ");
    LU_EQ(lu_cap_lines(), 1);
    /* Still empty, still failing; a push / pop pair works after. */
    LU_EQ(tally_tag_pop(), -TALLY_ESTATE);
    LU_OK(tally_tag_push("after-empty-pop"));
    LU_OK(tally_tag_pop());
    LU_EQ(tally_tag_pop(), -TALLY_ESTATE);
    lu_cap_end();
}

/* A bad push fails with EINVAL naming the problem, and leaves the stack as
 * it was ("kept" innermost). */
static void expect_bad_push(const char *name, const char *why)
{
    LU_OK(tally_tag_push("kept"));
    lu_cap_begin();
    LU_EQ(tally_tag_push(name), -TALLY_EINVAL);
    lu_cap_end();
    LU_HAS(tally_last_error(), "tally_tag_push");
    LU_HAS(tally_last_error(), why);
    LU_HAS(lu_cap_text(), why);
    void *p = lu_malloc(512, 0);
    LU_STREQ(lu_tag_of(p), "kept");
    tally_free(p);
    LU_OK(tally_tag_pop());
    lu_cap_begin();
    LU_EQ(tally_tag_pop(), -TALLY_ESTATE);
    lu_cap_end();
}

static void test_tag_push_rejects_null_and_empty(void **state)
{
    (void)state;
    lu_cap_begin();
    expect_bad_push(NULL, "NULL");
    expect_bad_push("", "empty");
    lu_cap_end();
}

static void test_tag_push_rejects_overlong_names(void **state)
{
    (void)state;
    char name[260];
    memset(name, 'x', sizeof name - 1);
    name[sizeof name - 1] = 0;
    expect_bad_push(name, "200");
    name[201] = 0;
    expect_bad_push(name, "200");
    /* Exactly 200 characters is allowed. */
    name[200] = 0;
    LU_OK(tally_tag_push(name));
    void *q = lu_malloc(512, 0);
    LU_STREQ(lu_tag_of(q), name);
    LU_EQ(strlen(lu_tag_of(q)), 200);
    LU_OK(tally_tag_pop());
    tally_free(q);
}

static void test_tag_push_rejects_control_characters(void **state)
{
    (void)state;
    expect_bad_push("tab\there", "control");
    expect_bad_push("new\nline", "control");
    expect_bad_push("esc\x1b[31m", "control");
    expect_bad_push("\x01", "control");
    /* DEL is a control character too: names are printable characters. */
    expect_bad_push("del\x7f", "control");
    /* Printable ASCII and UTF-8 text are fine. */
    LU_OK(tally_tag_push("kv-cache (layer 3) \xc3\xa9t\xc3\xa9 ~!@#$%^&*"));
    LU_OK(tally_tag_pop());
}

/* Every bad name gives one diagnostics line, "tally: ..." ending in '\n',
 * with no line break inside (the name is not echoed raw). */
static void test_bad_name_errors_are_one_line(void **state)
{
    (void)state;
    char longname[230];
    memset(longname, 'y', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    const char *bad[] = {NULL, "", longname, "two\nlines", "cr\rhere", "del\x7f"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        for (int which = 0; which < 2; which++) {
            lu_cap_begin();
            int rc = which ? tally_stage_begin(bad[i]) : tally_tag_push(bad[i]);
            lu_cap_end();
            if (rc == 0)
                fail_msg("%s accepted bad name #%zu", which ? "tally_stage_begin" : "tally_tag_push", i);
            const char *text = lu_cap_text();
            if (lu_cap_lines() != 1 || strncmp(text, "tally: ", 7) != 0 || text[strlen(text) - 1] != '\n' ||
                strchr(text, '\r'))
                fail_msg("%s(bad name #%zu) should write exactly one line \"tally: ...\\n\", got %d:\n%s",
                         which ? "tally_stage_begin" : "tally_tag_push", i, lu_cap_lines(), text);
            LU_LACKS(tally_last_error(), "\n");
            /* The line is the last error, as tally_last_error() gives it. */
            size_t n = strlen(tally_last_error());
            if (strncmp(text + 7, tally_last_error(), n) != 0 || strcmp(text + 7 + n, "\n") != 0)
                fail_msg("line \"%s\" is not the last error \"%s\"", text, tally_last_error());
        }
    }
}

static void test_tag_stack_depth_is_bounded(void **state)
{
    (void)state;
    int pushed = 0;
    lu_cap_begin();
    while (pushed < 1000 && tally_tag_push(pushed % 2 ? "deep-odd" : "deep-even") == 0)
        pushed++;
    LU_EQ(pushed, 64);
    LU_HAS(tally_last_error(), "full");
    void *p = lu_malloc(512, 0);
    LU_STREQ(lu_tag_of(p), "deep-odd");
    for (int i = 0; i < pushed; i++)
        LU_OK(tally_tag_pop());
    LU_EQ(tally_tag_pop(), -TALLY_ESTATE);
    lu_cap_end();
    tally_free(p);
}

static void test_names_are_interned(void **state)
{
    (void)state;
    lu_cap_begin();
    LU_OK(tally_tag_push("interned"));
    void *a = lu_malloc(512, 0);
    LU_OK(tally_tag_pop());
    LU_OK(tally_tag_push("other-name"));
    LU_OK(tally_tag_push("interned"));
    void *b = lu_malloc(512, 1);
    LU_OK(tally_tag_pop());
    void *c = lu_malloc(512, 1);
    LU_OK(tally_tag_pop());
    tally_block_info_t ia = lu_info(a), ib = lu_info(b), ic = lu_info(c);
    LU_EQ(ia.tag, ib.tag);
    assert_true(ia.tag != ic.tag);
    assert_true(ia.tag != 0);
    LU_STREQ(tally_tag_name(ia.tag), "interned");
    LU_STREQ(tally_tag_name(ic.tag), "other-name");
    /* The same string each time (interned once, never freed). */
    assert_ptr_equal(tally_tag_name(ia.tag), tally_tag_name(ib.tag));
    /* Stage names are interned the same way, separately from tags. */
    LU_OK(tally_stage_begin("interned"));
    void *d = lu_malloc(512, 0);
    LU_OK(tally_stage_end("interned"));
    LU_OK(tally_stage_begin("interned"));
    void *e = lu_malloc(512, 0);
    LU_OK(tally_stage_end("interned"));
    LU_EQ(lu_info(d).stage, lu_info(e).stage);
    LU_STREQ(tally_stage_name(lu_info(d).stage), "interned");
    /* Unknown ids give a placeholder, not a crash. */
    assert_non_null(tally_tag_name(999999));
    assert_non_null(tally_stage_name(UINT32_MAX));
    lu_cap_end();
    void *all[] = {a, b, c, d, e};
    lu_free_all(all, 5);
}

/* ---- stages --------------------------------------------------------------- */

static void test_blocks_record_the_innermost_stage(void **state)
{
    (void)state;
    lu_cap_begin();
    void *z = lu_malloc(512, 0);
    LU_OK(tally_stage_begin("st-outer"));
    void *a = lu_malloc(512, 0);
    LU_OK(tally_stage_begin("st-inner"));
    void *b = lu_malloc(512, 1);
    LU_OK(tally_stage_begin("st-innermost"));
    void *c = lu_malloc(25 * MB, 0);
    LU_OK(tally_stage_end("st-innermost"));
    void *d = lu_malloc(512, 1);
    LU_OK(tally_stage_end("st-inner"));
    void *e = lu_malloc(512, 0);
    LU_OK(tally_stage_end("st-outer"));
    void *f = lu_malloc(512, 0);
    lu_cap_end();
    LU_STREQ(lu_stage_of(z), "(none)");
    LU_STREQ(lu_stage_of(a), "st-outer");
    LU_STREQ(lu_stage_of(b), "st-inner");
    LU_STREQ(lu_stage_of(c), "st-innermost");
    LU_STREQ(lu_stage_of(d), "st-inner");
    LU_STREQ(lu_stage_of(e), "st-outer");
    LU_STREQ(lu_stage_of(f), "(none)");
    void *all[] = {z, a, b, c, d, e, f};
    lu_free_all(all, 7);
    LU_CHECK_OK();
}

typedef struct stage_thread {
    pthread_barrier_t *barrier;
    void *p;
} stage_thread_t;

static void *stage_thread_main(void *arg)
{
    stage_thread_t *t = arg;
    pthread_barrier_wait(t->barrier); /* the main thread has begun the stage */
    t->p = tally_malloc(4096, 1, NULL);
    pthread_barrier_wait(t->barrier);
    return NULL;
}

static void test_stage_applies_to_every_thread(void **state)
{
    (void)state;
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, 2);
    stage_thread_t t = {&barrier, NULL};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, stage_thread_main, &t), 0);
    lu_cap_begin();
    LU_OK(tally_stage_begin("st-shared"));
    pthread_barrier_wait(&barrier);
    pthread_barrier_wait(&barrier);
    pthread_join(th, NULL);
    pthread_barrier_destroy(&barrier);
    assert_non_null(t.p);
    LU_STREQ(lu_stage_of(t.p), "st-shared");
    LU_OK(tally_stage_end("st-shared"));
    lu_cap_end();
    /* Allocated in the stage by another thread: a survivor of it. */
    LU_HAS(lu_cap_text(), "stage st-shared ended with 4.0 KiB still live under tag untagged on device 1 (1 block)");
    tally_free(t.p);
}

static void test_ending_a_non_innermost_stage_fails(void **state)
{
    (void)state;
    lu_cap_begin();
    LU_OK(tally_stage_begin("nest-outer"));
    LU_OK(tally_stage_begin("nest-inner"));
    LU_EQ(tally_stage_end("nest-outer"), -TALLY_ESTATE);
    LU_HAS(tally_last_error(), "nest-outer");
    LU_HAS(tally_last_error(), "nest-inner");
    LU_HAS(lu_cap_text(), "nest-outer");
    LU_HAS(lu_cap_text(), "nest-inner");
    /* A name never begun fails the same way. */
    LU_EQ(tally_stage_end("never-begun"), -TALLY_ESTATE);
    LU_HAS(tally_last_error(), "never-begun");
    LU_HAS(tally_last_error(), "nest-inner");
    /* Nothing changed: allocations still record the inner stage, and the
     * stack unwinds in order. */
    void *p = lu_malloc(512, 0);
    LU_STREQ(lu_stage_of(p), "nest-inner");
    LU_OK(tally_stage_end("nest-inner"));
    LU_OK(tally_stage_end("nest-outer"));
    lu_cap_end();
    tally_free(p);
}

static void test_stage_end_without_a_stage_fails(void **state)
{
    (void)state;
    char longname[240];
    memset(longname, 's', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    lu_cap_begin();
    LU_EQ(tally_stage_end("nothing-open"), -TALLY_ESTATE);
    LU_HAS(tally_last_error(), "nothing-open");
    LU_HAS(tally_last_error(), "no stage");
    LU_EQ(tally_stage_end(NULL), -TALLY_EINVAL);
    LU_EQ(tally_stage_begin(NULL), -TALLY_EINVAL);
    LU_EQ(tally_stage_begin(""), -TALLY_EINVAL);
    LU_EQ(tally_stage_begin(longname), -TALLY_EINVAL);
    LU_EQ(tally_stage_begin("bad\nstage"), -TALLY_EINVAL);
    /* No failed begin opened a stage. */
    LU_EQ(tally_stage_end("nothing-open"), -TALLY_ESTATE);
    void *p = lu_malloc(512, 0);
    LU_STREQ(lu_stage_of(p), "(none)");
    lu_cap_end();
    tally_free(p);
}

/* ---- main ------------------------------------------------------------------------- */

/* The open stages, outermost first, as the tests' clean-up reads them
 * (tally__stage_open): at most max ids written, nothing past them. */
static void test_open_stages_fill_at_most_max(void **state)
{
    (void)state;
    static const char *const names[] = {"open-a", "open-b", "open-c"};
    for (int i = 0; i < 3; i++)
        LU_OK(tally_stage_begin(names[i]));
    uint32_t ids[5];
    for (int i = 0; i < 5; i++)
        ids[i] = 0xdeadbeefu;
    LU_EQ(tally__stage_open(ids, 2), 2);
    LU_STREQ(tally_stage_name(ids[0]), "open-a");
    LU_STREQ(tally_stage_name(ids[1]), "open-b");
    LU_EQ(ids[2], 0xdeadbeefu);
    LU_EQ(tally__stage_open(ids, 4), 3);
    LU_STREQ(tally_stage_name(ids[2]), "open-c");
    LU_EQ(ids[3], 0xdeadbeefu);
    LU_EQ(tally__stage_open(ids, 0), 0);
    for (int i = 2; i >= 0; i--)
        LU_OK(tally_stage_end(names[i]));
    LU_EQ(tally__stage_open(ids, 5), 0);
}

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    const struct CMUnitTest tests[] = {
        LU_T(test_untagged_blocks_show_untagged),
        LU_T(test_innermost_tag_owns_the_block),
        LU_T(test_tags_are_per_thread),
        LU_T(test_tag_pop_on_empty_stack_fails),
        LU_T(test_tag_push_rejects_null_and_empty),
        LU_T(test_tag_push_rejects_overlong_names),
        LU_T(test_tag_push_rejects_control_characters),
        LU_T(test_bad_name_errors_are_one_line),
        LU_T(test_tag_stack_depth_is_bounded),
        LU_T(test_names_are_interned),
        LU_T(test_blocks_record_the_innermost_stage),
        LU_T(test_stage_applies_to_every_thread),
        LU_T(test_ending_a_non_innermost_stage_fails),
        LU_T(test_stage_end_without_a_stage_fails),
        LU_T(test_open_stages_fill_at_most_max),
    };
    return LU_LEDGER_RUN("tags_stages", tests);
}
