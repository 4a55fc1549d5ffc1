/* The ownership ledger: per-thread tags, process-wide stages, counters per
 * (tag, stage, device), stage-end survivor reports and cache release,
 * misuse reports, the OOM report, allocation sites, the JSON report and the
 * timeline.
 *
 * Two simulated 80 GiB devices in virtual mode (never touched), weights and
 * optimizer declared persistent. Every test frees what it takes and leaves
 * no tag pushed and no stage open. The OOM test runs in a child process
 * (this binary re-executed with a 64 MiB device). */
#include "ledgerutil.h"

#include "stage.h" /* tally__stage_open, tally__g: the setup's clean-up */

#define CONF "backend:host,host_devices:2,host_mode:virtual,host_capacity:80GiB,persistent_tags:weights|optimizer"

#define MB LU_MiB
#define GB LU_GiB

static void null_sink(void *arg, const char *text, size_t len)
{
    (void)arg;
    (void)text;
    (void)len;
}

/* Each test starts with no tag pushed, no stage open, nothing live and an
 * empty cache, even when an earlier test failed half-way. */
static int setup_clean(void **state)
{
    (void)state;
    tally_init();
    tally_set_sink(null_sink, NULL);
    while (tally_tag_pop() == 0)
        ;
    uint32_t open[64];
    int n = tally__stage_open(open, 64);
    for (int i = n - 1; i >= 0; i--)
        tally_stage_end(tally_stage_name(open[i]));
    for (int d = 0; d < tally__g.ndev; d++) {
        tally_ptrmap_t *m = &tally__g.dev[d]->map;
        size_t k = 0, cnt = 0;
        uintptr_t *left = malloc((m->count + 1) * sizeof *left);
        for (k = 0; k <= m->mask && left; k++)
            if (m->keys[k])
                left[cnt++] = m->keys[k];
        for (k = 0; k < cnt; k++)
            tally_free((void *)left[k]);
        free(left);
    }
    tally_set_sink(NULL, NULL);
    tally_empty_cache(-1);
    return 0;
}

static void free_all(void **ptrs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        tally_free(ptrs[i]);
}

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
    free_all(all, 3);
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
    free_all(all, 5);
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
        free_all(all, 3);
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
    free_all(all, 5);
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
    free_all(all, 7);
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

/* ---- counters against the cache statistics --------------------------------- */

typedef struct live {
    void *p;
    int device;
    int tag;   /* index into rw_tags */
    int stage; /* index into rw_stages */
    size_t size;
} live_t;

static const char *const rw_tags[] = {"rw-a", "rw-b", "rw-c", "untagged"};
static const char *const rw_stages[] = {"(none)", "rw-outer", "rw-mid", "rw-inner"};

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static size_t random_size(void)
{
    switch (rnd() % 10) {
    case 0: case 1: case 2: case 3: case 4:
        return 1 + rnd() % (64 * LU_KiB);
    case 5: case 6:
        return 1 + rnd() % MB;
    case 7: case 8:
        return MB + 1 + rnd() % (12 * MB);
    default:
        return 10 * MB + rnd() % (60 * MB);
    }
}

/* Sums over the report's ledger rows and the per-device statistics agree. */
static void expect_ledger_matches_stats(const tally_json_t *root, int ndev)
{
    const tally_json_t *rows = lu_jarr(root, "ledger");
    for (int dev = 0; dev < ndev; dev++) {
        int64_t cur = 0, live = 0, alloc = 0, freed = 0, ablocks = 0;
        for (size_t i = 0; i < rows->len; i++) {
            const tally_json_t *r = &rows->items[i];
            if (lu_jint(r, "device") != dev)
                continue;
            int64_t c = lu_jint(r, "current_bytes");
            cur += c;
            live += lu_jint(r, "live_blocks");
            alloc += lu_jint(r, "allocated_bytes");
            freed += lu_jint(r, "freed_bytes");
            ablocks += lu_jint(r, "allocated_blocks");
            /* Each row is consistent in itself. */
            LU_EQ(lu_jint(r, "allocated_bytes") - lu_jint(r, "freed_bytes"), c);
            assert_true(lu_jint(r, "peak_bytes") >= c);
            assert_true(lu_jint(r, "peak_blocks") >= lu_jint(r, "live_blocks"));
            assert_true(lu_jint(r, "allocated_blocks") >= lu_jint(r, "live_blocks"));
            assert_true(c >= 0);
        }
        LU_EQ(cur, lu_jstat(root, dev, "allocated_bytes.all.current"));
        LU_EQ(live, lu_jstat(root, dev, "allocation.all.current"));
        LU_EQ(alloc, lu_jstat(root, dev, "allocated_bytes.all.allocated"));
        LU_EQ(freed, lu_jstat(root, dev, "allocated_bytes.all.freed"));
        LU_EQ(ablocks, lu_jstat(root, dev, "allocation.all.allocated"));
        /* And the report's statistics are the live ones. */
        tally_stats_t s = lu_stats(dev);
        LU_EQ(cur, s.allocated_bytes[0].current);
        LU_EQ(live, s.allocation[0].current);
    }
}

static void test_counters_agree_with_cache_statistics(void **state)
{
    (void)state;
    enum { MAXLIVE = 400 };
    long ops = 4000;
    live_t live[MAXLIVE];
    int nlive = 0, depth = 0, tag = 3, tagpushed = 0;
    lu_cap_begin();
    for (long op = 0; op < ops; op++) {
        uint64_t r = rnd() % 100;
        if (r < 3 && depth < 3) {
            LU_OK(tally_stage_begin(rw_stages[depth + 1]));
            depth++;
        } else if (r < 6 && depth > 0) {
            LU_OK(tally_stage_end(rw_stages[depth]));
            depth--;
        } else if (r < 10) {
            if (tagpushed)
                LU_OK(tally_tag_pop());
            tag = (int)(rnd() % 4);
            tagpushed = tag != 3;
            if (tagpushed)
                LU_OK(tally_tag_push(rw_tags[tag]));
        } else if (r < 58 && nlive < MAXLIVE) {
            size_t size = random_size();
            int dev = (int)(rnd() % 2);
            void *p = lu_malloc(size, dev);
            tally_block_info_t info = lu_info(p);
            live[nlive++] = (live_t){p, dev, tag, depth, info.size};
            LU_EQ(info.device, dev);
            LU_STREQ(tally_tag_name(info.tag), rw_tags[tag]);
            LU_STREQ(tally_stage_name(info.stage), rw_stages[depth]);
        } else if (nlive > 0) {
            int k = (int)(rnd() % (uint64_t)nlive);
            tally_free(live[k].p);
            live[k] = live[--nlive];
        }
    }
    if (tagpushed)
        LU_OK(tally_tag_pop());
    while (depth > 0)
        LU_OK(tally_stage_end(rw_stages[depth--]));
    lu_cap_end();
    LU_CHECK_OK();
    tally_json_t *root = lu_report_json("random.json");
    expect_ledger_matches_stats(root, 2);
    /* Every rw-* row holds exactly the blocks this test still has. */
    for (int t = 0; t < 3; t++)
        for (int s = 0; s < 4; s++)
            for (int dev = 0; dev < 2; dev++) {
                int64_t bytes = 0, blocks = 0;
                for (int i = 0; i < nlive; i++)
                    if (live[i].tag == t && live[i].stage == s && live[i].device == dev) {
                        bytes += (int64_t)live[i].size;
                        blocks++;
                    }
                const tally_json_t *row = lu_ledger_row(root, rw_tags[t], rw_stages[s], dev);
                if (!row) {
                    LU_EQ(bytes, 0);
                    continue;
                }
                LU_EQ(lu_jint(row, "current_bytes"), bytes);
                LU_EQ(lu_jint(row, "live_blocks"), blocks);
                LU_EQ(lu_jbool(row, "foreign"), 0);
            }
    tally__json_free(root);
    for (int i = 0; i < nlive; i++)
        tally_free(live[i].p);
    LU_CHECK_OK();
    root = lu_report_json("random-after.json");
    expect_ledger_matches_stats(root, 2);
    for (int t = 0; t < 3; t++)
        for (int dev = 0; dev < 2; dev++) {
            const tally_json_t *row = lu_ledger_row(root, rw_tags[t], NULL, dev);
            if (row)
                LU_EQ(lu_jint(row, "current_bytes"), 0);
        }
    tally__json_free(root);
}

typedef struct mt_worker {
    int id;
    char tag[32];
    uint64_t seed;
    int64_t live_bytes[2];
    int64_t live_blocks[2];
    int errors;
} mt_worker_t;

static void *mt_worker_main(void *arg)
{
    mt_worker_t *w = arg;
    enum { N = 64 };
    void *p[N] = {0};
    int dev[N] = {0};
    size_t size[N] = {0};
    if (tally_tag_push(w->tag) != 0)
        w->errors++;
    uint64_t x = w->seed;
    for (int op = 0; op < 3000; op++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        int k = (int)(x % N);
        if (p[k]) {
            tally_free(p[k]);
            w->live_bytes[dev[k]] -= (int64_t)size[k];
            w->live_blocks[dev[k]]--;
            p[k] = NULL;
        } else {
            dev[k] = (int)((x >> 20) & 1);
            size_t want = (x >> 24) % 4 == 0 ? MB + (x >> 32) % (24 * MB) : 1 + (x >> 32) % (256 * LU_KiB);
            p[k] = tally_malloc(want, dev[k], NULL);
            tally_block_info_t info;
            if (!p[k] || tally_block_info(p[k], &info) != 0 || strcmp(tally_tag_name(info.tag), w->tag) != 0) {
                w->errors++;
                continue;
            }
            size[k] = info.size;
            w->live_bytes[dev[k]] += (int64_t)size[k];
            w->live_blocks[dev[k]]++;
        }
    }
    /* Keep half of what is live for the check; free the rest. */
    for (int k = 0; k < N; k += 2)
        if (p[k]) {
            tally_free(p[k]);
            w->live_bytes[dev[k]] -= (int64_t)size[k];
            w->live_blocks[dev[k]]--;
            p[k] = NULL;
        }
    if (tally_tag_pop() != 0)
        w->errors++;
    return NULL;
}

/* Threads with their own tags allocate and free on both devices while the
 * main thread begins and ends stages: per tag and device, the rows summed
 * over stages hold what each thread still has, and the sums agree with the
 * statistics. */
static void test_counters_agree_under_threads(void **state)
{
    (void)state;
    enum { W = 4 };
    mt_worker_t w[W];
    pthread_t th[W];
    lu_cap_begin();
    for (int i = 0; i < W; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].id = i;
        snprintf(w[i].tag, sizeof w[i].tag, "mt-tag-%d", i);
        w[i].seed = 0x1234567ull * (uint64_t)(i + 1) + 99;
        assert_int_equal(pthread_create(&th[i], NULL, mt_worker_main, &w[i]), 0);
    }
    for (int round = 0; round < 200; round++) {
        LU_OK(tally_stage_begin(round % 2 ? "mt-odd" : "mt-even"));
        LU_OK(tally_stage_begin("mt-nested"));
        LU_OK(tally_stage_end("mt-nested"));
        LU_OK(tally_stage_end(round % 2 ? "mt-odd" : "mt-even"));
    }
    for (int i = 0; i < W; i++)
        pthread_join(th[i], NULL);
    lu_cap_end();
    LU_CHECK_OK();
    tally_json_t *root = lu_report_json("threads.json");
    expect_ledger_matches_stats(root, 2);
    const tally_json_t *rows = lu_jarr(root, "ledger");
    for (int i = 0; i < W; i++) {
        LU_EQ(w[i].errors, 0);
        for (int dev = 0; dev < 2; dev++) {
            int64_t bytes = 0, blocks = 0;
            for (size_t r = 0; r < rows->len; r++)
                if (strcmp(lu_jstr(&rows->items[r], "tag"), w[i].tag) == 0 &&
                    lu_jint(&rows->items[r], "device") == dev) {
                    bytes += lu_jint(&rows->items[r], "current_bytes");
                    blocks += lu_jint(&rows->items[r], "live_blocks");
                }
            LU_EQ(bytes, w[i].live_bytes[dev]);
            LU_EQ(blocks, w[i].live_blocks[dev]);
        }
    }
    tally__json_free(root);
    setup_clean(NULL); /* frees what the threads kept */
}

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
    free_all(all, 7);
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
    free_all(blocks, N);
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
    free_all(s, 5);
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

/* A segment released to the backend lets the address come back, possibly on
 * another device. A double free must name the block that was last freed at
 * that address (device 1, new-owner), not an older record of another device. */
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
        b = lu_malloc(30 * MB, 1);
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
    LU_HAS(t, "device 1");
    LU_HAS(t, "tag new-owner");
    LU_HAS(t, "stage new-stage");
    LU_LACKS(t, "old-owner");
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

static void test_oom_report_names_the_holders(void **state)
{
    (void)state;
    lu_child_t c;
    lu_child_run(&c, "oom", "backend:host,host_devices:1,host_capacity:64MiB,host_mode:virtual,leak_report:off", NULL);
    LU_CHILD_EXIT(&c, 0);
    LU_HAS(c.out, "result=null\n");
    LU_HAS(c.out, "error=out of memory");
    LU_HAS(c.out, "num_ooms=1\n");
    LU_HAS(c.out, "check=0\n");
    LU_HAS(c.out, "after=non-null\n");
    const char *e = strstr(c.err, "--- before the failing allocation");
    assert_non_null(e);
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

/* ---- JSON report ------------------------------------------------------------------ */

static void test_json_report_has_the_documented_keys(void **state)
{
    (void)state;
    setenv("RANK", "5", 1);
    setenv("LOCAL_RANK", "1", 1);
    setenv("WORLD_SIZE", "8", 1);
    lu_cap_begin();
    LU_OK(tally_stage_begin("js-stage"));
    LU_OK(tally_tag_push("js-tag"));
    void *a = lu_malloc(3 * MB, 0);
    void *b = lu_malloc(700, 1);
    LU_OK(tally_tag_pop());
    LU_OK(tally_stage_end("js-stage"));
    lu_cap_end();
    tally_json_t *root = lu_report_json("keys.json");
    unsetenv("RANK");
    unsetenv("LOCAL_RANK");
    unsetenv("WORLD_SIZE");
    assert_int_equal(root->type, TALLY_JSON_OBJECT);
    LU_STREQ(lu_jstr(root, "format"), "tally-report");
    LU_STREQ(lu_jstr(root, "version"), TALLY_VERSION);
    LU_STREQ(lu_jstr(root, "backend"), "host");
    LU_EQ(lu_jint(root, "pid"), getpid());
    LU_EQ(lu_jint(root, "rank"), 5);
    LU_EQ(lu_jint(root, "local_rank"), 1);
    LU_EQ(lu_jint(root, "world_size"), 8);
    LU_EQ(lu_jint(root, "home_device"), -1); /* LOCAL_RANK was unset at initialisation */
    lu_jint(root, "time_us");
    /* devices[].stats: the 122 memory_stats keys, matching the live figures. */
    const tally_json_t *devs = lu_jarr(root, "devices");
    LU_EQ(devs->len, 2);
    for (size_t i = 0; i < devs->len; i++) {
        LU_EQ(lu_jint(&devs->items[i], "device"), i);
        const tally_json_t *st = lu_jget(&devs->items[i], "stats");
        assert_int_equal(st->type, TALLY_JSON_OBJECT);
        LU_EQ(st->len, 122);
        for (size_t k = 0; k < st->len; k++) {
            int64_t v;
            if (tally__json_int(&st->members[k].value, &v) != 0)
                fail_msg("stats key %s is not an integer", st->members[k].key);
            if (k && strcmp(st->members[k - 1].key, st->members[k].key) >= 0)
                fail_msg("stats keys not sorted: %s before %s", st->members[k - 1].key, st->members[k].key);
        }
        tally_stats_t s = lu_stats((int)i);
        const tally_json_t *u = lu_jget(&devs->items[i], "utilisation");
        assert_int_equal(u->type, TALLY_JSON_NUMBER);
        if (!(u->d > s.utilisation - 1e-6 && u->d < s.utilisation + 1e-6))
            fail_msg("device %zu: utilisation %.9f in the report, %.9f in the stats", i, u->d, s.utilisation);
        LU_EQ(lu_jint(st, "allocated_bytes.all.current"), s.allocated_bytes[0].current);
        LU_EQ(lu_jint(st, "reserved_bytes.all.current"), s.reserved_bytes[0].current);
        LU_EQ(lu_jint(st, "allocation.all.current"), s.allocation[0].current);
        lu_jint(st, "num_device_alloc");
        lu_jint(st, "requested_bytes.large_pool.peak");
    }
    /* ledger[]: every documented field, with its type. */
    const tally_json_t *rows = lu_jarr(root, "ledger");
    assert_true(rows->len >= 2);
    static const char *const int_fields[] = {"device", "current_bytes", "peak_bytes", "allocated_bytes",
                                             "freed_bytes", "live_blocks", "peak_blocks", "allocated_blocks"};
    for (size_t i = 0; i < rows->len; i++) {
        const tally_json_t *r = &rows->items[i];
        lu_jstr(r, "tag");
        lu_jstr(r, "stage");
        lu_jbool(r, "foreign");
        for (size_t k = 0; k < sizeof int_fields / sizeof int_fields[0]; k++)
            lu_jint(r, int_fields[k]);
    }
    const tally_json_t *ra = lu_ledger_row(root, "js-tag", "js-stage", 0);
    assert_non_null(ra);
    LU_EQ(lu_jint(ra, "current_bytes"), 3 * MB);
    LU_EQ(lu_jint(ra, "peak_bytes"), 3 * MB);
    LU_EQ(lu_jint(ra, "allocated_bytes"), 3 * MB);
    LU_EQ(lu_jint(ra, "freed_bytes"), 0);
    LU_EQ(lu_jint(ra, "live_blocks"), 1);
    LU_EQ(lu_jint(ra, "peak_blocks"), 1);
    LU_EQ(lu_jint(ra, "allocated_blocks"), 1);
    LU_EQ(lu_jbool(ra, "foreign"), 0);
    const tally_json_t *rb = lu_ledger_row(root, "js-tag", "js-stage", 1);
    assert_non_null(rb);
    LU_EQ(lu_jint(rb, "current_bytes"), 1024);
    /* stages[]: the history, with survivors. */
    const tally_json_t *stages = lu_jarr(root, "stages");
    assert_true(stages->len >= 1);
    int64_t total = lu_jint(root, "stages_total");
    LU_EQ(stages->len, total < 256 ? total : 256); /* the newest 256 are kept */
    const tally_json_t *st = &stages->items[stages->len - 1];
    LU_STREQ(lu_jstr(st, "name"), "js-stage");
    LU_EQ(lu_jint(st, "seq"), lu_jint(root, "stages_total"));
    LU_EQ(lu_jint(st, "depth"), 1);
    assert_true(lu_jint(st, "begin_us") > 0);
    assert_true(lu_jint(st, "wall_us") >= 0);
    LU_EQ(lu_jint(st, "peak_allocated_bytes"), 3 * MB + 1024);
    assert_true(lu_jint(st, "peak_reserved_bytes") >= 22 * (int64_t)MB);
    LU_EQ(lu_jint(st, "survivor_bytes"), 3 * MB + 1024);
    LU_EQ(lu_jint(st, "survivor_blocks"), 2);
    LU_EQ(lu_jint(st, "released_bytes"), 0);
    const tally_json_t *sv = lu_jarr(st, "survivors");
    LU_EQ(sv->len, 2);
    LU_STREQ(lu_jstr(&sv->items[0], "tag"), "js-tag");
    LU_EQ(lu_jint(&sv->items[0], "device"), 0);
    LU_EQ(lu_jbool(&sv->items[0], "foreign"), 0);
    LU_EQ(lu_jint(&sv->items[0], "bytes"), 3 * MB);
    LU_EQ(lu_jint(&sv->items[0], "blocks"), 1);
    /* leaks[]: live blocks grouped. */
    const tally_json_t *leaks = lu_jarr(root, "leaks");
    int found = 0;
    for (size_t i = 0; i < leaks->len; i++) {
        const tally_json_t *g = &leaks->items[i];
        lu_jstr(g, "site");
        lu_jbool(g, "foreign");
        if (strcmp(lu_jstr(g, "tag"), "js-tag") == 0 && strcmp(lu_jstr(g, "stage"), "js-stage") == 0 &&
            lu_jint(g, "device") == 0) {
            LU_EQ(lu_jint(g, "bytes"), 3 * MB);
            LU_EQ(lu_jint(g, "blocks"), 1);
            found++;
        }
    }
    LU_EQ(found, 1);
    /* segments[] and timeline[] are there (the timeline empty while off). */
    const tally_json_t *segs = lu_jarr(root, "segments");
    assert_true(segs->len >= 2);
    LU_EQ(lu_jarr(root, "timeline")->len, 0);
    tally__json_free(root);
    tally_free(a);
    tally_free(b);
}

static void test_json_report_unwritable_path_fails_cleanly(void **state)
{
    (void)state;
    char path[512];
    lu_cap_begin();
    /* A directory that does not exist. */
    snprintf(path, sizeof path, "%s/no-such-dir/report.json", lu_tmpdir());
    LU_EQ(tally_write_report(path), -TALLY_EIO);
    LU_HAS(tally_last_error(), "tally_write_report");
    LU_HAS(tally_last_error(), path);
    assert_false(lu_exists(path));
    /* A path that is a directory: written to a temporary, rename fails,
     * nothing is left behind. */
    snprintf(path, sizeof path, "%s/a-directory", lu_tmpdir());
    assert_int_equal(mkdir(path, 0755), 0);
    char inside[600];
    snprintf(inside, sizeof inside, "%s/keep", path);
    FILE *f = fopen(inside, "w");
    assert_non_null(f);
    fclose(f);
    LU_EQ(tally_write_report(path), -TALLY_EIO);
    LU_HAS(tally_last_error(), path);
    LU_EQ(lu_dir_count(lu_tmpdir(), ".tmp"), 0);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    /* No path at all: report_path is not set. */
    LU_EQ(tally_write_report(NULL), -TALLY_EINVAL);
    LU_HAS(tally_last_error(), "report_path");
    /* A too-long expansion. */
    char longpath[1100];
    memset(longpath, 'a', sizeof longpath - 1);
    longpath[0] = '/';
    longpath[sizeof longpath - 1] = 0;
    LU_EQ(tally_write_report(longpath), -TALLY_EINVAL);
    lu_cap_end();
    /* The errors went to the sink, one line each. */
    LU_EQ(lu_cap_lines(), 4);
}

static void test_json_report_path_expands_pid_and_rank(void **state)
{
    (void)state;
    char pattern[512], want[512];
    snprintf(pattern, sizeof pattern, "%s/r%%r-p%%p-%%%%.json", lu_tmpdir());
    snprintf(want, sizeof want, "%s/r0-p%d-%%.json", lu_tmpdir(), (int)getpid());
    LU_OK(tally_write_report(pattern));
    assert_true(lu_exists(want));
    tally_json_t *root = lu_json_file(want);
    LU_EQ(lu_jint(root, "pid"), getpid());
    LU_EQ(lu_jint(root, "rank"), 0);
    LU_EQ(lu_jint(root, "world_size"), 1);
    tally__json_free(root);
    /* Replaced atomically: writing again leaves one file, no temporary. */
    LU_OK(tally_write_report(pattern));
    LU_EQ(lu_dir_count(lu_tmpdir(), ".tmp"), 0);
    setenv("RANK", "3", 1);
    LU_OK(tally_write_report(pattern));
    unsetenv("RANK");
    snprintf(want, sizeof want, "%s/r3-p%d-%%.json", lu_tmpdir(), (int)getpid());
    assert_true(lu_exists(want));
    /* report_path is used when the path is NULL. */
    char conf[600];
    snprintf(conf, sizeof conf, "report_path:%s/configured-%%p.json", lu_tmpdir());
    LU_OK(tally_configure(conf));
    LU_OK(tally_write_report(NULL));
    LU_OK(tally_configure("report_path:"));
    snprintf(want, sizeof want, "%s/configured-%d.json", lu_tmpdir(), (int)getpid());
    assert_true(lu_exists(want));
}

/* ---- timeline ------------------------------------------------------------------- */

static int has_event(const tally_json_t *tl, const char *action, const char *tag, int device)
{
    for (size_t i = 0; i < tl->len; i++) {
        const tally_json_t *e = &tl->items[i];
        if (strcmp(lu_jstr(e, "action"), action) == 0 && (!tag || strcmp(lu_jstr(e, "tag"), tag) == 0) &&
            (device < 0 || lu_jint(e, "device") == device))
            return 1;
    }
    return 0;
}

static void test_timeline_records_events(void **state)
{
    (void)state;
    LU_OK(tally_configure("timeline:true"));
    lu_cap_begin();
    LU_OK(tally_stage_begin("tl-stage"));
    LU_OK(tally_tag_push("tl-tag"));
    void *a = lu_malloc(30 * MB, 1); /* a new segment */
    void *b = lu_malloc(1000, 0);
    LU_OK(tally_tag_pop());
    tally_free(a);
    LU_OK(tally_stage_end("tl-stage"));
    tally_empty_cache(1);
    lu_cap_end();
    tally_json_t *root = lu_report_json("timeline.json");
    LU_OK(tally_configure("timeline:false"));
    void *c = lu_malloc(1000, 0); /* not recorded */
    const tally_json_t *tl = lu_jarr(root, "timeline");
    assert_true(tl->len >= 6);
    assert_true(has_event(tl, "segment_alloc", "tl-tag", 1));
    assert_true(has_event(tl, "alloc", "tl-tag", 1));
    assert_true(has_event(tl, "alloc", "tl-tag", 0));
    assert_true(has_event(tl, "free_requested", NULL, 1));
    assert_true(has_event(tl, "segment_free", NULL, 1));
    assert_true(has_event(tl, "stage_begin", NULL, 0));
    assert_true(has_event(tl, "stage_end", NULL, 1));
    int allocs = 0;
    for (size_t i = 0; i < tl->len; i++) {
        const tally_json_t *e = &tl->items[i];
        lu_jint(e, "time_us");
        lu_jint(e, "addr");
        lu_jint(e, "size");
        lu_jint(e, "stream");
        lu_jint(e, "allocated");
        lu_jint(e, "reserved");
        lu_jstr(e, "stage");
        if (strcmp(lu_jstr(e, "action"), "alloc") == 0 && lu_jint(e, "device") == 1) {
            allocs++;
            LU_EQ(lu_jint(e, "addr"), (uintptr_t)a);
            LU_EQ(lu_jint(e, "size"), 30 * MB);
            LU_STREQ(lu_jstr(e, "stage"), "tl-stage");
            assert_true(lu_jint(e, "allocated") >= 30 * (int64_t)MB);
        }
    }
    LU_EQ(allocs, 1);
    /* Oldest first, per device. */
    int64_t last = 0;
    for (size_t i = 0; i < tl->len; i++) {
        if (lu_jint(&tl->items[i], "device") != 1)
            continue;
        assert_true(lu_jint(&tl->items[i], "time_us") >= last);
        last = lu_jint(&tl->items[i], "time_us");
    }
    tally__json_free(root);
    tally_free(b);
    tally_free(c);
}

/* ---- main ------------------------------------------------------------------------- */

static const lu_role_t roles[] = {
    {"oom", child_oom},
    {NULL, NULL},
};

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "--child") == 0)
        return lu_child_main(argv[2], roles);
    unsetenv("RANK");
    unsetenv("LOCAL_RANK");
    unsetenv("WORLD_SIZE");
    setenv("TALLY_CONF", CONF, 1);
#define T(f) cmocka_unit_test_setup(f, setup_clean)
    const struct CMUnitTest tests[] = {
        T(test_untagged_blocks_show_untagged),
        T(test_innermost_tag_owns_the_block),
        T(test_tags_are_per_thread),
        T(test_tag_pop_on_empty_stack_fails),
        T(test_tag_push_rejects_null_and_empty),
        T(test_tag_push_rejects_overlong_names),
        T(test_tag_push_rejects_control_characters),
        T(test_bad_name_errors_are_one_line),
        T(test_tag_stack_depth_is_bounded),
        T(test_names_are_interned),
        T(test_blocks_record_the_innermost_stage),
        T(test_stage_applies_to_every_thread),
        T(test_ending_a_non_innermost_stage_fails),
        T(test_stage_end_without_a_stage_fails),
        T(test_counters_agree_with_cache_statistics),
        T(test_counters_agree_under_threads),
        T(test_stage_survivors_grouped_largest_first),
        T(test_persistent_tags_are_runtime_configurable),
        T(test_ledger_rows_are_per_tag_and_stage),
        T(test_text_reports_size_units),
        T(test_nested_stage_survivors_count_in_the_outer),
        T(test_stage_peaks_include_nested_stages),
        T(test_release_at_stage_end_drops_reserved),
        T(test_stage_report_can_be_turned_off),
        T(test_foreign_device_is_flagged),
        T(test_double_free_names_pointer_tag_and_stage),
        T(test_double_free_after_address_reuse_names_the_latest_owner),
        T(test_free_of_unknown_pointer_changes_nothing),
        T(test_free_checked_wrong_size_or_device),
        T(test_oom_report_names_the_holders),
        T(test_backtrace_sites_split_leak_groups),
        T(test_one_frame_sites_are_the_callers),
        T(test_leak_report_without_sites_groups_by_owner),
        T(test_json_report_has_the_documented_keys),
        T(test_json_report_unwritable_path_fails_cleanly),
        T(test_json_report_path_expands_pid_and_rank),
        T(test_timeline_records_events),
    };
#undef T
    int failed = cmocka_run_group_tests_name("ledger", tests, NULL, NULL);
    lu_tmpdir_cleanup();
    return failed;
}
