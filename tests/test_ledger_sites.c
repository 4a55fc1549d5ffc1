/* Who allocated it: native frames symbolised in the leak report (function,
 * file:line from this binary's debug information), leaks grouped by site
 * in LeakSanitizer's shape, leak suppressions and tally_ignore, and the
 * sites in the JSON report. (The symbolizer on its own, frame text and
 * sites from many threads: test_ledger_sites_symbolizer.c.)
 *
 * The leaks are made by children (this binary re-executed with --child
 * ROLE), so the exit path and leak_exitcode run for real. Their frames name
 * this file, test_ledger_sites.c, which the tests look for by name. */
#include "ledgerutil.h"

bool tally__sup_pattern_match(const char *pattern, const char *text);

#define MB LU_MiB
#define BASE "backend:host,host_devices:2,host_mode:virtual,host_capacity:8GiB"
#define SITES BASE ",backtrace_depth:8,leak_report:full"

/* ---- the children: allocation sites at known lines ---------------------------- */

static void *volatile keep[16];
static int nkeep;

/* The tally_malloc call of make_model is on the line model_line names. */
static const int model_line = __LINE__ + 3;
__attribute__((noinline)) static void make_model(void)
{
    keep[nkeep++] = tally_malloc(4 * MB, 0, NULL);
    LU_REQUIRE(keep[nkeep - 1] != NULL);
}

static const int cache_line = __LINE__ + 3;
__attribute__((noinline)) static void make_cache(void)
{
    keep[nkeep++] = tally_malloc(1 * MB, 1, NULL);
    LU_REQUIRE(keep[nkeep - 1] != NULL);
}

/* An allocation in a function inlined into make_inlined: the report shows
 * both, as LeakSanitizer does, the inlined one first. */
static const int inlined_line = __LINE__ + 3;
static inline __attribute__((always_inline)) void *alloc_inlined(void)
{
    return tally_malloc(2 * MB, 0, NULL);
}

static const int inlined_call_line = __LINE__ + 3;
__attribute__((noinline)) static void make_inlined(void)
{
    keep[nkeep++] = alloc_inlined();
    LU_REQUIRE(keep[nkeep - 1] != NULL);
}

static int child_inlined(void)
{
    make_inlined();
    return 0;
}

static int child_one_leak(void)
{
    LU_REQUIRE(tally_tag_push("weights") == 0);
    make_model();
    LU_REQUIRE(tally_tag_pop() == 0);
    return 0;
}

/* Two models from one site (8 MiB, the bigger site), a cache from another. */
static int child_two_sites(void)
{
    LU_REQUIRE(tally_tag_push("weights") == 0);
    for (volatile int i = 0; i < 2; i++) /* (volatile: one call site, not unrolled) */
        make_model();
    LU_REQUIRE(tally_tag_pop() == 0);
    LU_REQUIRE(tally_tag_push("kv-cache") == 0);
    make_cache();
    LU_REQUIRE(tally_tag_pop() == 0);
    return 0;
}

/* A chain of callers deeper than the depth kept: the site's frames are the
 * innermost ones outside the library, as many as backtrace_depth asks. The
 * chain keeps its frame pointers (this file is built without), so that
 * unwinder:fp can walk it too. */
#define FP_KEPT __attribute__((noinline, optimize("no-omit-frame-pointer")))
static volatile int deep_calls;
FP_KEPT static void deep1(void)
{
    keep[nkeep++] = tally_malloc(MB, 0, NULL);
    LU_REQUIRE(keep[nkeep - 1] != NULL);
    deep_calls++; /* (no tail call: every function keeps its frame) */
}
FP_KEPT static void deep2(void)
{
    deep1();
    deep_calls++;
}
FP_KEPT static void deep3(void)
{
    deep2();
    deep_calls++;
}
FP_KEPT static void deep4(void)
{
    deep3();
    deep_calls++;
}

static int child_deep(void)
{
    deep4();
    return 0;
}

/* One site, two groups: make_model's blocks under two tags. */
static int child_one_site_two_tags(void)
{
    static const char *const tags[] = {"weights", "optimizer"};
    for (volatile int i = 0; i < 2; i++) { /* (volatile: one call site) */
        LU_REQUIRE(tally_tag_push(tags[i]) == 0);
        make_model();
        LU_REQUIRE(tally_tag_pop() == 0);
    }
    return 0;
}

/* The two-sites allocations made inside stage "load", then freed after it. */
static int child_stage(void)
{
    LU_REQUIRE(tally_stage_begin("load") == 0);
    child_two_sites();
    LU_REQUIRE(tally_stage_end("load") == 0);
    LU_REQUIRE(tally_write_report(NULL) == 0);
    for (int i = 0; i < nkeep; i++)
        tally_free(keep[i]);
    return 0;
}

/* A caller whose frame-pointer register holds garbage (code built without
 * frame pointers may use it for anything): unwinder:fp must stop, not fault. */
__attribute__((noinline, optimize("omit-frame-pointer"))) static void *garbage_fp_malloc(size_t size)
{
    void *p;
    __asm__ volatile("mov $0x5a5a5a5a5a5a5a50, %%rbp\n\t"
                     "call tally_malloc"
                     : "=a"(p), "+D"(size)
                     : "S"(0), "d"(0)
                     : "rbp", "rcx", "r8", "r9", "r10", "r11", "memory", "cc");
    return p;
}

static int child_garbage_fp(void)
{
    keep[nkeep++] = garbage_fp_malloc(MB);
    LU_REQUIRE(keep[0] != NULL);
    make_model();
    return 0;
}

static int child_ignored(void)
{
    make_model();
    LU_REQUIRE(tally_ignore(keep[0]) == 0);
    return 0;
}

/* ---- native frames ------------------------------------------------------------ */

static void expect_frame(const char *text, const char *func, int line)
{
    char want[128];
    snprintf(want, sizeof want, " in %s ", func);
    LU_HAS(text, want);
    snprintf(want, sizeof want, "test_ledger_sites.c:%d\n", line);
    LU_HAS(text, want);
    /* On one line: "#0 0x... in make_model /path/tests/test_ledger_sites.c:LINE". */
    const char *at = strstr(text, " in ");
    while (at && strncmp(at + 4, func, strlen(func)) != 0)
        at = strstr(at + 1, " in ");
    assert_non_null(at);
    const char *eol = strchr(at, '\n');
    snprintf(want, sizeof want, "test_ledger_sites.c:%d", line);
    const char *file = strstr(at, want);
    assert_true(file && file < eol);
}

static void test_leak_report_names_function_file_and_line(void **state)
{
    (void)state;
    lu_child_t c;
    lu_child_run(&c, "one-leak", SITES, NULL);
    LU_CHILD_EXIT(&c, 0);
    LU_HAS(c.err, "tally: Direct leak of 4194304 bytes (4.0 MiB) in 1 block allocated from:\n");
    LU_HAS(c.err, "tally:     #0 0x");
    expect_frame(c.err, "make_model", model_line);
    /* The caller's frame follows. */
    LU_HAS(c.err, " in child_one_leak ");
    assert_true(lu_pos(c.err, " in child_one_leak ") > lu_pos(c.err, " in make_model "));
    LU_HAS(c.err, "tally: 4194304 bytes (4.0 MiB) in 1 block: tag weights, stage (none), device 0\n");
    /* The C library's start-up frame: its function and module, no file and
     * line (lib/ledger/symbolize.c: its line table is costly and names glibc's
     * build tree). */
    const char *libc = strstr(c.err, " in __libc_start");
    if (libc) {
        const char *eol = strchr(libc, '\n');
        const char *mod = strstr(libc, "(libc.so");
        if (!mod || mod > eol)
            fail_msg("libc frame with a file and line: %.*s", (int)(eol - libc), libc);
    }
    lu_child_free(&c);
}

static void test_inlined_functions_get_their_own_frames(void **state)
{
    (void)state;
    lu_child_t c;
    lu_child_run(&c, "inlined", SITES, NULL);
    LU_CHILD_EXIT(&c, 0);
    expect_frame(c.err, "alloc_inlined", inlined_line);
    expect_frame(c.err, "make_inlined", inlined_call_line);
    /* Same return address, two functions: #0 the inlined one, #1 its caller. */
    assert_true(lu_pos(c.err, "#0 0x") < lu_pos(c.err, " in alloc_inlined "));
    assert_true(lu_pos(c.err, " in alloc_inlined ") < lu_pos(c.err, "#1 0x"));
    assert_true(lu_pos(c.err, "#1 0x") < lu_pos(c.err, " in make_inlined "));
    assert_true(lu_pos(c.err, " in make_inlined ") < lu_pos(c.err, "#2 0x"));
    lu_child_free(&c);
}

/* backtrace_depth:2 under a chain of four callers keeps exactly the two
 * innermost, deep1 and deep2, under every unwinder: the frames the library
 * itself adds (the unwinder, the capture, the hooks, the entry point) are
 * unwound beyond the depth asked and dropped, never counted in it. */
static void test_depth_counts_the_callers_frames_only(void **state)
{
    (void)state;
    static const char *const unwinders[] = {"auto", "glibc", "fp"};
    for (int i = 0; i < 3; i++) {
        char conf[256];
        snprintf(conf, sizeof conf, BASE ",backtrace_depth:2,leak_report:full,unwinder:%s", unwinders[i]);
        lu_child_t c;
        lu_child_run(&c, "deep", conf, NULL);
        LU_CHILD_EXIT(&c, 0);
        if (!strstr(c.err, "#0 0x") || !strstr(c.err, " in deep1 ") || !strstr(c.err, "#1 0x") ||
            !strstr(c.err, " in deep2 ") || strstr(c.err, "#2 0x") || strstr(c.err, " in deep3 "))
            fail_msg("unwinder:%s: want deep1 and deep2 as #0 and #1, nothing more:\n%s", unwinders[i], c.err);
        assert_true(lu_pos(c.err, " in deep1 ") < lu_pos(c.err, "#1 0x"));
        lu_child_free(&c);
    }
}

static void test_each_unwinder_names_the_caller(void **state)
{
    (void)state;
    static const char *const unwinders[] = {"auto", "glibc", "fp"};
    for (int i = 0; i < 3; i++) {
        char conf[256];
        snprintf(conf, sizeof conf, SITES ",unwinder:%s", unwinders[i]);
        lu_child_t c;
        lu_child_run(&c, "one-leak", conf, NULL);
        LU_CHILD_EXIT(&c, 0);
        expect_frame(c.err, "make_model", model_line);
        lu_child_free(&c);
    }
}

static void test_frame_pointer_walk_survives_garbage(void **state)
{
    (void)state;
    lu_child_t c;
    lu_child_run(&c, "garbage-fp", SITES ",unwinder:fp", NULL);
    LU_CHILD_EXIT(&c, 0);
    /* The garbage caller's own frame is still named (its return address is
     * in tally_malloc's frame); the walk stops at the garbage. */
    LU_HAS(c.err, "tally:     #0 0x");
    LU_HAS(c.err, " in garbage_fp_malloc");
    expect_frame(c.err, "make_model", model_line);
    LU_HAS(c.err, "tally: SUMMARY: 5242880 bytes leaked in 2 blocks\n");
    lu_child_free(&c);
}

static void test_python_stack_without_an_interpreter_records_nothing(void **state)
{
    (void)state;
    lu_child_t c;
    /* No Python in this process: no site at all with python_stack alone ... */
    lu_child_run(&c, "one-leak", BASE ",leak_report:full,python_stack:8", NULL);
    LU_CHILD_EXIT(&c, 0);
    LU_LACKS(c.err, "allocated from:");
    LU_HAS(c.err, "tally: 4194304 bytes (4.0 MiB) in 1 block: tag weights, stage (none), device 0\n");
    lu_child_free(&c);
    /* ... and native frames only with both. */
    lu_child_run(&c, "one-leak", SITES ",python_stack:8", NULL);
    LU_CHILD_EXIT(&c, 0);
    expect_frame(c.err, "make_model", model_line);
    LU_LACKS(c.err, "(python)");
    lu_child_free(&c);
}

/* Without Python in the process the interpreter is looked for once, and
 * every later allocation still finds it missing: three allocations (the
 * two-sites child) with python_stack and native frames run and report their
 * two sites as without it, with no Python frame. */
static void test_python_stack_without_an_interpreter_stays_off_for_later_allocations(void **state)
{
    (void)state;
    lu_child_t c;
    lu_child_run(&c, "two-sites", SITES ",python_stack:8", NULL);
    LU_CHILD_EXIT(&c, 0);
    LU_HAS(c.err, "tally: Direct leak of 8388608 bytes (8.0 MiB) in 2 blocks allocated from:\n");
    LU_HAS(c.err, "tally: Direct leak of 1048576 bytes (1.0 MiB) in 1 block allocated from:\n");
    LU_LACKS(c.err, "(python)");
    lu_child_free(&c);
}

static void test_sites_grouped_biggest_first_frames_once(void **state)
{
    (void)state;
    lu_child_t c;
    lu_child_run(&c, "two-sites", SITES, NULL);
    LU_CHILD_EXIT(&c, 0);
    const char *model = "tally: Direct leak of 8388608 bytes (8.0 MiB) in 2 blocks allocated from:\n";
    const char *cache = "tally: Direct leak of 1048576 bytes (1.0 MiB) in 1 block allocated from:\n";
    LU_HAS(c.err, model);
    LU_HAS(c.err, cache);
    assert_true(lu_pos(c.err, model) < lu_pos(c.err, cache));
    /* Each site's frames once: two #0 lines for two sites. */
    LU_EQ(lu_count(c.err, "tally:     #0 "), 2);
    LU_EQ(lu_count(c.err, " in make_model "), 1);
    expect_frame(c.err, "make_cache", cache_line);
    /* The group lines follow their site's frames. */
    long g = lu_pos(c.err, "tally: 8388608 bytes (8.0 MiB) in 2 blocks: tag weights");
    assert_true(g > lu_pos(c.err, " in make_model ") && g < lu_pos(c.err, cache));
    LU_HAS(c.err, "tally: 1048576 bytes (1.0 MiB) in 1 block: tag kv-cache, stage (none), device 1\n");
    LU_HAS(c.err, "tally: SUMMARY: 9437184 bytes leaked in 3 blocks\n");
    lu_child_free(&c);
}

/* Groups of one site (two tags) share one heading, with the site's total,
 * and the site's frames once. */
static void test_groups_of_one_site_share_a_heading(void **state)
{
    (void)state;
    lu_child_t c;
    lu_child_run(&c, "one-site-two-tags", SITES, NULL);
    LU_CHILD_EXIT(&c, 0);
    LU_EQ(lu_count(c.err, "allocated from:\n"), 1);
    LU_HAS(c.err, "tally: Direct leak of 8388608 bytes (8.0 MiB) in 2 blocks allocated from:\n");
    LU_EQ(lu_count(c.err, "tally:     #0 "), 1);
    LU_HAS(c.err, "tally: 4194304 bytes (4.0 MiB) in 1 block: tag weights");
    LU_HAS(c.err, "tally: 4194304 bytes (4.0 MiB) in 1 block: tag optimizer");
    lu_child_free(&c);
}

static void test_json_report_has_whole_sites(void **state)
{
    (void)state;
    char path[512], conf[700];
    snprintf(path, sizeof path, "%s/sites.json", lu_tmpdir());
    snprintf(conf, sizeof conf, SITES ",report_path:%s", path);
    lu_child_t c;
    lu_child_run(&c, "one-leak", conf, NULL);
    LU_CHILD_EXIT(&c, 0);
    tally_json_t *root = lu_json_file(path);
    const tally_json_t *leaks = lu_jarr(root, "leaks");
    LU_EQ(leaks->len, 1);
    int64_t id = lu_jint(&leaks->items[0], "site_id");
    assert_true(id > 0);
    LU_HAS(lu_jstr(&leaks->items[0], "site"), "make_model ");
    const tally_json_t *sites = lu_jarr(root, "sites");
    LU_EQ(sites->len, 1);
    LU_EQ(lu_jint(&sites->items[0], "id"), id);
    const tally_json_t *frames = lu_jarr(&sites->items[0], "frames");
    assert_true(frames->len >= 2);
    LU_STREQ(lu_jstr(&frames->items[0], "name"), "make_model");
    LU_HAS(lu_jstr(&frames->items[0], "filename"), "test_ledger_sites.c");
    LU_EQ(lu_jint(&frames->items[0], "line"), model_line);
    LU_STREQ(lu_jstr(&frames->items[1], "name"), "child_one_leak");
    /* A frame with no line names its module as its filename: the C
     * library's own frames (its start-up, below main) have no line. */
    size_t no_line = 0;
    for (size_t i = 0; i < frames->len; i++)
        if (lu_jint(&frames->items[i], "line") == 0) {
            LU_HAS(lu_jstr(&frames->items[i], "filename"), "/");
            no_line += strstr(lu_jstr(&frames->items[i], "filename"), "libc.so") != NULL;
        }
    assert_true(no_line >= 1);
    tally__json_free(root);
    lu_child_free(&c);
}

static void test_stage_survivors_grouped_by_site(void **state)
{
    (void)state;
    char path[512], conf[700];
    snprintf(path, sizeof path, "%s/stage.json", lu_tmpdir());
    snprintf(conf, sizeof conf, SITES ",report_path:%s", path);
    lu_child_t c;
    lu_child_run(&c, "stage", conf, NULL);
    LU_CHILD_EXIT(&c, 0);
    const char *model = "tally: 8388608 bytes (8.0 MiB) in 2 blocks allocated from:\ntally:     #0 0x";
    const char *line = "tally: stage load ended with 8.0 MiB still live under tag weights on device 0 (2 blocks)\n";
    const char *cache = "tally: 1048576 bytes (1.0 MiB) in 1 block allocated from:\ntally:     #0 0x";
    LU_HAS(c.err, model);
    LU_HAS(c.err, line);
    LU_HAS(c.err, cache);
    assert_true(lu_pos(c.err, model) < lu_pos(c.err, line) && lu_pos(c.err, line) < lu_pos(c.err, cache));
    expect_frame(c.err, "make_cache", cache_line);
    LU_LACKS(c.err, "SUMMARY"); /* freed after the stage */
    /* The JSON survivors name their sites, which the report lists. */
    tally_json_t *root = lu_json_file(path);
    const tally_json_t *stage = &lu_jarr(root, "stages")->items[0];
    const tally_json_t *surv = lu_jarr(stage, "survivors");
    LU_EQ(surv->len, 2);
    const tally_json_t *sites = lu_jarr(root, "sites");
    for (size_t i = 0; i < surv->len; i++) {
        int64_t id = lu_jint(&surv->items[i], "site_id");
        bool found = false;
        for (size_t k = 0; k < sites->len; k++)
            found |= lu_jint(&sites->items[k], "id") == id;
        assert_true(found);
    }
    tally__json_free(root);
    lu_child_free(&c);
}

/* ---- suppressions ------------------------------------------------------------- */

static const char *write_supp(const char *name, const char *text)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", lu_tmpdir(), name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

/* Run the two-sites child with conf plus leak_suppressions:path. */
static void run_suppressed(lu_child_t *c, const char *conf, const char *path)
{
    char full[800];
    snprintf(full, sizeof full, "%s,leak_exitcode:23,leak_suppressions:%s", conf, path);
    lu_child_run(c, "two-sites", full, NULL);
}

static void test_suppression_silences_one_site_not_the_other(void **state)
{
    (void)state;
    const char *p = write_supp("one.supp", "# the cache is kept on purpose\n\nleak:make_cache\nleak:no_such_*_fn\n");
    lu_child_t c;
    run_suppressed(&c, SITES, p);
    LU_CHILD_EXIT(&c, 23); /* make_model still leaks */
    LU_HAS(c.err, "in 2 blocks allocated from:\n");
    LU_LACKS(c.err, "Direct leak of 1048576 bytes");
    LU_LACKS(c.err, " in make_cache ");
    char want[700];
    snprintf(want, sizeof want, "tally: suppressed by leak:make_cache (%s:3): 1048576 bytes (1.0 MiB) in 1 block\n",
             p);
    LU_HAS(c.err, want);
    snprintf(want, sizeof want, "tally: suppression leak:no_such_*_fn (%s:4) matched nothing\n", p);
    LU_HAS(c.err, want);
    LU_HAS(c.err, "tally: SUMMARY: 8388608 bytes leaked in 2 blocks (1 block suppressed)\n");
    lu_child_free(&c);
}

static void test_suppressed_leaks_never_set_the_exit_code(void **state)
{
    (void)state;
    /* One by function (wildcard), one by tag: nothing is left. */
    const char *p = write_supp("all.supp", "leak:^make_mod*\nleak:kv-cache$\n");
    lu_child_t c;
    run_suppressed(&c, SITES, p);
    LU_CHILD_EXIT(&c, 0);
    LU_LACKS(c.err, "Direct leak");
    LU_LACKS(c.err, "matched nothing");
    LU_HAS(c.err, "tally: SUMMARY: 0 bytes leaked in 0 blocks (3 blocks suppressed)\n");
    /* Each rule counts the blocks it suppressed (make_model's two in one group). */
    char want[700];
    snprintf(want, sizeof want, "tally: suppressed by leak:^make_mod* (%s:1): 8388608 bytes (8.0 MiB) in 2 blocks\n", p);
    LU_HAS(c.err, want);
    lu_child_free(&c);
    /* Summary only: the one line, still counting them apart. */
    run_suppressed(&c, BASE ",backtrace_depth:8", p);
    LU_CHILD_EXIT(&c, 0);
    LU_EQ(lu_count(c.err, "\n"), 1);
    LU_HAS(c.err, "(3 blocks suppressed)\n");
    lu_child_free(&c);
    /* A pattern matches a frame's source file as well as its function. */
    p = write_supp("file.supp", "leak:/test_ledger_sites.c$\n");
    run_suppressed(&c, SITES, p);
    LU_CHILD_EXIT(&c, 0);
    LU_LACKS(c.err, "matched nothing");
    LU_HAS(c.err, "tally: SUMMARY: 0 bytes leaked in 0 blocks (3 blocks suppressed)\n");
    lu_child_free(&c);
}

static void test_ignored_block_is_counted_apart(void **state)
{
    (void)state;
    lu_child_t c;
    lu_child_run(&c, "ignored", SITES ",leak_exitcode:23", NULL);
    LU_CHILD_EXIT(&c, 0);
    LU_LACKS(c.err, "Direct leak");
    LU_HAS(c.err, "tally: ignored (tally_ignore): 4194304 bytes (4.0 MiB) in 1 block\n");
    LU_HAS(c.err, "(1 block suppressed)\n");
    lu_child_free(&c);
    /* Only live blocks can be ignored. */
    int x;
    assert_int_equal(tally_ignore(&x), -TALLY_EINVAL);
    LU_HAS(tally_last_error(), "tally_ignore: pointer");
    assert_int_equal(tally_ignore(NULL), -TALLY_EINVAL);
}

static void expect_bad_file(const char *path, const char *why)
{
    char conf[700], want[700];
    snprintf(conf, sizeof conf, "leak_suppressions:%s", path);
    assert_int_equal(tally_configure(conf), -TALLY_ECONF);
    snprintf(want, sizeof want, "config: leak_suppressions: %s", why);
    LU_HAS(tally_last_error(), want);
    LU_LACKS(tally_last_error(), "\n");
}

static void test_bad_suppressions_file_is_one_line(void **state)
{
    (void)state;
    char dir[600];
    snprintf(dir, sizeof dir, "%s/none.supp", lu_tmpdir());
    char want[700];
    snprintf(want, sizeof want, "cannot open '%s': No such file or directory", dir);
    expect_bad_file(dir, want);
    snprintf(want, sizeof want, "'%s' is not a regular file", lu_tmpdir());
    expect_bad_file(lu_tmpdir(), want);
    expect_bad_file("/dev/null", "'/dev/null' is not a regular file");
    const char *p = write_supp("bad.supp", "# ok\nleak:x\nfun:malloc\n");
    snprintf(want, sizeof want, "%s:3: 'fun:malloc' is not leak:PATTERN", p);
    expect_bad_file(p, want);
    /* The whole "leak:" prefix is required, its colon too. */
    p = write_supp("leaky.supp", "leaky:x\n");
    snprintf(want, sizeof want, "%s:1: 'leaky:x' is not leak:PATTERN", p);
    expect_bad_file(p, want);
    p = write_supp("empty.supp", "leak:   \n");
    snprintf(want, sizeof want, "%s:1: empty pattern", p);
    expect_bad_file(p, want);
    char longline[1100];
    memset(longline, 'x', sizeof longline - 2);
    longline[sizeof longline - 2] = '\n';
    longline[sizeof longline - 1] = 0;
    p = write_supp("long.supp", longline);
    snprintf(want, sizeof want, "%s:1: line longer than 1024 characters", p);
    expect_bad_file(p, want);
    /* At most 256 patterns: the 256th is taken, a 257th is refused at its
     * line (comments and blank lines between them do not count). */
    static char many[257 * 12 + 64];
    size_t n = (size_t)snprintf(many, sizeof many, "# many\n\n");
    for (int i = 0; i < 256; i++)
        n += (size_t)snprintf(many + n, sizeof many - n, "leak:f%d\n", i);
    p = write_supp("max.supp", many);
    snprintf(want, sizeof want, "leak_suppressions:%s", p);
    LU_OK(tally_configure(want));
    LU_OK(tally_configure("leak_suppressions:"));
    snprintf(many + n, sizeof many - n, "# one more\nleak:f256\n");
    p = write_supp("over.supp", many);
    snprintf(want, sizeof want, "%s:260: more than 256 suppressions", p);
    expect_bad_file(p, want);
    /* A good file is taken; made bad later, the report says so in one line
     * and suppresses nothing; "" turns them off. */
    p = write_supp("good.supp", "leak:x\n");
    snprintf(want, sizeof want, "leak_suppressions:%s", p);
    LU_OK(tally_configure(want));
    write_supp("good.supp", "bad line\n");
    void *b = lu_malloc(MB, 0);
    lu_buf_t buf = {0};
    LU_OK(tally_write_leaks(TALLY_LEAKS_AT_EXIT, lu_buf_write, &buf));
    snprintf(want, sizeof want, "tally: leak_suppressions: %s:1: 'bad line' is not leak:PATTERN; no leak is suppressed\n",
             p);
    LU_HAS(lu_buf_str(&buf), want);
    LU_HAS(lu_buf_str(&buf), "tally: SUMMARY: 1048576 bytes leaked in 1 block\n");
    lu_buf_free(&buf);
    tally_free(b);
    LU_OK(tally_configure("leak_suppressions:"));
}

static void test_pattern_matching(void **state)
{
    (void)state;
    assert_true(tally__sup_pattern_match("model", "make_model"));
    assert_true(tally__sup_pattern_match("make_*l", "make_model"));
    assert_true(tally__sup_pattern_match("^make", "make_model"));
    assert_false(tally__sup_pattern_match("^model", "make_model"));
    assert_true(tally__sup_pattern_match("model$", "make_model"));
    assert_false(tally__sup_pattern_match("make$", "make_model"));
    assert_true(tally__sup_pattern_match("^make_model$", "make_model"));
    assert_false(tally__sup_pattern_match("^make_mode$", "make_model"));
    assert_true(tally__sup_pattern_match("*", "x"));
    assert_true(tally__sup_pattern_match("a*b*c", "xxaYYbZZcxx"));
    assert_false(tally__sup_pattern_match("a*b*c", "xxaYYcZZbxx"));
    assert_false(tally__sup_pattern_match("x", ""));
    assert_false(tally__sup_pattern_match("x", NULL));
}

/* A pattern anchored at the end, whose last character also comes earlier in
 * the name: the first try runs out of pattern while the name goes on, and the
 * match must start again one character on, never read past the pattern. The
 * pattern is copied into a buffer on the stack; a long pattern first leaves
 * its characters there, past where the short one ends, so a match that read
 * on would meet them (the same character as the name's next one). */
static void test_pattern_ending_early_while_the_name_goes_on(void **state)
{
    (void)state;
    static const char chars[] = "a_m.";
    for (const char *c = chars; *c; c++) {
        char primer[301], one[3], two[4], name[8], ends[8], not_ends[8];
        memset(primer, *c, 300);
        primer[300] = 0;
        snprintf(one, sizeof one, "%c$", *c);            /* "c$" */
        snprintf(two, sizeof two, "%c%c$", *c, *c);      /* "cc$" */
        snprintf(name, sizeof name, "x%c%c", *c, *c);    /* "xcc" */
        snprintf(ends, sizeof ends, "x%c%c%c", *c, *c, *c);       /* "xccc" */
        snprintf(not_ends, sizeof not_ends, "x%c%cy%c", *c, *c, *c); /* "xccyc" */
        assert_false(tally__sup_pattern_match(primer, name)); /* the primer is longer than the name */
        if (!tally__sup_pattern_match(one, name))
            fail_msg("pattern %s does not match %s", one, name);
        assert_false(tally__sup_pattern_match(primer, name));
        if (!tally__sup_pattern_match(two, ends))
            fail_msg("pattern %s does not match %s", two, ends);
        assert_false(tally__sup_pattern_match(primer, name));
        if (tally__sup_pattern_match(two, not_ends))
            fail_msg("pattern %s matches %s", two, not_ends);
        assert_false(tally__sup_pattern_match(primer, name));
        if (!tally__sup_pattern_match(one, not_ends))
            fail_msg("pattern %s does not match %s", one, not_ends);
    }
    /* The same with a star left past the pattern's end: a match that took it
     * for one of the pattern's would never come back to the pattern's end.
     * "b$" meets "bb" only on its second try, "a*b$" "abb" too. */
    char stars[301];
    memset(stars, '*', 300);
    stars[300] = 0;
    static const char *const tail[][2] = {{"b$", "bb"}, {"a*b$", "abb"}, {"^*b$", "xbb"}, {"a$", "aa"}};
    for (size_t i = 0; i < sizeof tail / sizeof tail[0]; i++) {
        assert_true(tally__sup_pattern_match(stars, tail[i][1]));
        if (!tally__sup_pattern_match(tail[i][0], tail[i][1]))
            fail_msg("pattern %s does not match %s after a pattern of stars", tail[i][0], tail[i][1]);
    }
}

/* ---- main ------------------------------------------------------------------------- */

static const lu_role_t roles[] = {
    {"one-leak", child_one_leak},
    {"two-sites", child_two_sites},
    {"one-site-two-tags", child_one_site_two_tags},
    {"ignored", child_ignored},
    {"inlined", child_inlined},
    {"deep", child_deep},
    {"garbage-fp", child_garbage_fp},
    {"stage", child_stage},
    {NULL, NULL},
};

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "--child") == 0)
        return lu_child_main(argv[2], roles);
    setenv("TALLY_CONF", BASE ",leak_report:off", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_leak_report_names_function_file_and_line),
        cmocka_unit_test(test_inlined_functions_get_their_own_frames),
        cmocka_unit_test(test_each_unwinder_names_the_caller),
        cmocka_unit_test(test_depth_counts_the_callers_frames_only),
        cmocka_unit_test(test_frame_pointer_walk_survives_garbage),
        cmocka_unit_test(test_python_stack_without_an_interpreter_records_nothing),
        cmocka_unit_test(test_python_stack_without_an_interpreter_stays_off_for_later_allocations),
        cmocka_unit_test(test_sites_grouped_biggest_first_frames_once),
        cmocka_unit_test(test_json_report_has_whole_sites),
        cmocka_unit_test(test_stage_survivors_grouped_by_site),
        cmocka_unit_test(test_suppression_silences_one_site_not_the_other),
        cmocka_unit_test(test_groups_of_one_site_share_a_heading),
        cmocka_unit_test(test_suppressed_leaks_never_set_the_exit_code),
        cmocka_unit_test(test_ignored_block_is_counted_apart),
        cmocka_unit_test(test_bad_suppressions_file_is_one_line),
        cmocka_unit_test(test_pattern_matching),
        cmocka_unit_test(test_pattern_ending_early_while_the_name_goes_on),
    };
    int failed = cmocka_run_group_tests_name("sites", tests, NULL, NULL);
    lu_tmpdir_cleanup();
    return failed;
}
