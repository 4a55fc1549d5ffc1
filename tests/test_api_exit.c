/* What happens at process exit: the leak report (leak_report: off, summary,
 * full), the leak exit code, report_path with %p, and frees that arrive
 * after the report.
 *
 * Each case runs in a child process: this binary re-executed with
 * --child ROLE and its own TALLY_CONF, so the library's exit path runs for
 * real; the parent reads the child's stderr, exit status and files. The
 * last test calls the exit path (tally__exit_report) in this process. */
#include "ledgerutil.h"

/* The exit path (lib/api/process.c; internal, not in tally.h). */
int tally__exit_report(void);

#define MB LU_MiB

#define BASE "backend:host,host_devices:2,host_mode:virtual,host_capacity:8GiB"

/* ---- the children -------------------------------------------------------------- */

/* Leaves, largest first: 5 MiB (act, train, device 1), 3 x 1 MiB
 * (kv-cache, train, device 0), 1 KiB (untagged, (none), device 0). */
#define LEAK_BYTES (5 * MB + 3 * MB + 1024)
#define LEAK_BLOCKS 5

static void make_leaks(void)
{
    void *u = tally_malloc(1000, 0, NULL);
    LU_REQUIRE(u != NULL);
    LU_REQUIRE(tally_stage_begin("train") == 0);
    LU_REQUIRE(tally_tag_push("kv-cache") == 0);
    for (int i = 0; i < 3; i++)
        LU_REQUIRE(tally_malloc(MB, 0, NULL) != NULL);
    LU_REQUIRE(tally_tag_pop() == 0);
    LU_REQUIRE(tally_tag_push("act") == 0);
    LU_REQUIRE(tally_malloc(5 * MB, 1, NULL) != NULL);
    LU_REQUIRE(tally_tag_pop() == 0);
    LU_REQUIRE(tally_tag_push("freed") == 0);
    void *f = tally_malloc(2 * MB, 0, NULL);
    LU_REQUIRE(f != NULL);
    tally_free(f);
    LU_REQUIRE(tally_tag_pop() == 0);
    LU_REQUIRE(tally_stage_end("train") == 0);
}

static int child_leak(void)
{
    make_leaks();
    printf("main returns 0\n");
    return 0;
}

static int child_leak_exit7(void)
{
    make_leaks();
    printf("main returns 7\n");
    return 7;
}

__attribute__((noreturn)) static void bail_out(int code)
{
    printf("exit(%d) from deep inside\n", code);
    exit(code);
}

static int child_leak_exit_midway(void)
{
    make_leaks();
    bail_out(5);
}

static int child_clean_exit7(void)
{
    void *p[4];
    LU_REQUIRE(tally_stage_begin("train") == 0);
    LU_REQUIRE(tally_tag_push("kv-cache") == 0);
    for (int i = 0; i < 4; i++)
        LU_REQUIRE((p[i] = tally_malloc((size_t)(i + 1) * MB, i % 2, NULL)) != NULL);
    LU_REQUIRE(tally_tag_pop() == 0);
    for (int i = 0; i < 4; i++)
        tally_free(p[i]);
    LU_REQUIRE(tally_stage_end("train") == 0);
    printf("main returns 7\n");
    return 7;
}

static int child_no_tally(void)
{
    printf("never called tally\n");
    return 3;
}

/* Configured (a report path, leak exit code) through tally_configure, then
 * never used: the library never started, so exit writes and prints
 * nothing and starts nothing. */
static int child_configured_only(void)
{
    if (tally_configure(getenv("CONFIGURE_ONLY")) != 0) {
        printf("refused: %s\n", tally_last_error());
        return 1;
    }
    printf("configured, never allocated\n");
    return 3;
}

/* Started (one block allocated and freed), then a new report path given
 * at run time through tally_configure (report_path is a runtime key): exit
 * writes the report there. */
static int child_path_at_run_time(void)
{
    void *p = tally_malloc(MB, 0, NULL);
    LU_REQUIRE(p != NULL);
    tally_free(p);
    if (tally_configure(getenv("RUNTIME_CONF")) != 0) {
        printf("refused: %s\n", tally_last_error());
        return 1;
    }
    printf("report path set at run time\n");
    return 0;
}

/* Blocks freed by a destructor that runs after the library's exit report
 * (a destructor with a priority runs after the default-priority ones). */
static void *late[2];
static int late_armed;

__attribute__((destructor(101))) static void late_free(void)
{
    if (!late_armed)
        return;
    lu_buf_t b = {0};
    tally_set_sink(lu_buf_write, &b);
    tally_free(late[0]);
    tally_free(late[1]);
    tally_free(late[1]); /* a double free, reported, harmless */
    int check = tally_check();
    tally_stats_t s0, s1;
    tally_get_stats(0, &s0);
    tally_get_stats(1, &s1);
    void *again = tally_malloc(MB, 0, NULL);
    tally_free(again);
    tally_set_sink(NULL, NULL);
    char line[600];
    int n = snprintf(line, sizeof line, "late-free: check=%d live=%lld again=%s double-free-reported=%d\n", check,
                     (long long)(s0.allocation[0].current + s1.allocation[0].current), again ? "yes" : "no",
                     lu_buf_str(&b)[0] && strstr(lu_buf_str(&b), "double free") != NULL);
    if (write(2, line, (size_t)n) < 0)
        _exit(97);
    lu_buf_free(&b);
}

static int child_late_free(void)
{
    LU_REQUIRE(tally_tag_push("late") == 0);
    late[0] = tally_malloc(3 * MB, 0, NULL);
    late[1] = tally_malloc(700, 1, NULL);
    LU_REQUIRE(tally_tag_pop() == 0);
    LU_REQUIRE(late[0] && late[1]);
    late_armed = 1;
    return 0;
}

/* ---- leak_report:full ------------------------------------------------------------ */

static const char *const group_lines[] = {
    "tally: 5242880 bytes (5.0 MiB) in 1 block: tag act, stage train, device 1\n",
    "tally: 3145728 bytes (3.0 MiB) in 3 blocks: tag kv-cache, stage train, device 0\n",
    "tally: 1024 bytes (1.0 KiB) in 1 block: tag untagged, stage (none), device 0\n",
};

static void expect_full_report(const char *err)
{
    char summary[128];
    snprintf(summary, sizeof summary, "tally: SUMMARY: %zu bytes leaked in %d blocks\n", (size_t)LEAK_BYTES,
             LEAK_BLOCKS);
    LU_HAS(err, "tally: leak report: 5 blocks still live at exit, in 3 groups\n");
    long last = lu_pos(err, "tally: leak report:");
    for (int i = 0; i < 3; i++) {
        LU_HAS(err, group_lines[i]);
        assert_true(lu_pos(err, group_lines[i]) > last); /* largest first */
        last = lu_pos(err, group_lines[i]);
    }
    LU_HAS(err, summary);
    assert_true(lu_pos(err, summary) > last); /* the summary closes it */
    LU_EQ(lu_count(err, "tally: SUMMARY:"), 1);
    LU_LACKS(err, "tag freed");
}

static void test_full_leak_report_and_exit_code(void **state)
{
    (void)state;
    lu_child_t c;
    lu_child_run(&c, "leak", BASE ",leak_report:full,leak_exitcode:23", NULL);
    LU_CHILD_EXIT(&c, 23);
    LU_HAS(c.out, "main returns 0\n"); /* stdout was flushed before the exit */
    expect_full_report(c.err);
    lu_child_free(&c);
}

static void test_leak_exit_code_replaces_the_programs(void **state)
{
    (void)state;
    lu_child_t c;
    lu_child_run(&c, "leak-exit7", BASE ",leak_report:full,leak_exitcode:23", NULL);
    LU_CHILD_EXIT(&c, 23);
    expect_full_report(c.err);
    lu_child_free(&c);
    lu_child_run(&c, "leak-exit-midway", BASE ",leak_report:full,leak_exitcode:42", NULL);
    LU_CHILD_EXIT(&c, 42);
    LU_HAS(c.out, "exit(5) from deep inside\n");
    expect_full_report(c.err);
    lu_child_free(&c);
}

static void test_leaks_without_exit_code_keep_the_programs_status(void **state)
{
    (void)state;
    lu_child_t c;
    lu_child_run(&c, "leak-exit7", BASE ",leak_report:full", NULL);
    LU_CHILD_EXIT(&c, 7);
    expect_full_report(c.err);
    lu_child_free(&c);
    lu_child_run(&c, "leak-exit-midway", BASE ",leak_report:full,leak_exitcode:0", NULL);
    LU_CHILD_EXIT(&c, 5);
    expect_full_report(c.err);
    lu_child_free(&c);
}

/* ---- leak_report:summary / off ------------------------------------------------------ */

static void test_summary_leak_report_is_one_line(void **state)
{
    (void)state;
    lu_child_t c;
    lu_child_run(&c, "leak", BASE ",leak_report:summary,leak_exitcode:23", NULL);
    LU_CHILD_EXIT(&c, 23);
    char summary[128];
    snprintf(summary, sizeof summary, "tally: SUMMARY: %zu bytes leaked in %d blocks\n", (size_t)LEAK_BYTES,
             LEAK_BLOCKS);
    LU_HAS(c.err, summary);
    LU_LACKS(c.err, "leak report:");
    for (int i = 0; i < 3; i++)
        LU_LACKS(c.err, group_lines[i]);
    /* The summary is the last thing written, and the only tally line after
     * the stage report. */
    const char *tail = strstr(c.err, summary);
    LU_STREQ(tail, summary);
    lu_child_free(&c);
    /* summary is the default. */
    lu_child_run(&c, "leak", BASE, NULL);
    LU_CHILD_EXIT(&c, 0);
    LU_HAS(c.err, summary);
    LU_LACKS(c.err, "leak report:");
    lu_child_free(&c);
}

static void test_leak_report_off_prints_nothing(void **state)
{
    (void)state;
    lu_child_t c;
    lu_child_run(&c, "leak", BASE ",leak_report:off,stage_report:false", NULL);
    LU_CHILD_EXIT(&c, 0);
    LU_EQ(strlen(c.err), 0);
    lu_child_free(&c);
    /* Off with an exit code: silent, but the status still says "leaked". */
    lu_child_run(&c, "leak", BASE ",leak_report:off,stage_report:false,leak_exitcode:23", NULL);
    LU_CHILD_EXIT(&c, 23);
    LU_EQ(strlen(c.err), 0);
    lu_child_free(&c);
}

static void test_no_leaks_keep_the_programs_status(void **state)
{
    (void)state;
    lu_child_t c;
    lu_child_run(&c, "clean-exit7", BASE ",leak_report:full,leak_exitcode:23", NULL);
    LU_CHILD_EXIT(&c, 7);
    LU_HAS(c.out, "main returns 7\n");
    LU_LACKS(c.err, "SUMMARY");
    LU_LACKS(c.err, "leak report");
    lu_child_free(&c);
    /* A process that never called tally: nothing at all, its own status. */
    lu_child_run(&c, "no-tally", BASE ",leak_report:full,leak_exitcode:23", NULL);
    LU_CHILD_EXIT(&c, 3);
    LU_EQ(strlen(c.err), 0);
    LU_HAS(c.out, "never called tally\n");
    lu_child_free(&c);
    /* One that configured tally and never allocated: no report file either. */
    char conf[600], path[400];
    snprintf(path, sizeof path, "%s/configured-only.json", lu_tmpdir());
    snprintf(conf, sizeof conf, "CONFIGURE_ONLY=leak_report:full,leak_exitcode:23,report_path:%s", path);
    const char *const env[] = {conf, NULL};
    lu_child_run(&c, "configured-only", BASE ",leak_report:full,leak_exitcode:23", env);
    LU_CHILD_EXIT(&c, 3);
    LU_EQ(strlen(c.err), 0);
    LU_HAS(c.out, "configured, never allocated\n");
    if (lu_exists(path))
        fail_msg("a library that never started wrote %s at exit", path);
    lu_child_free(&c);
}

/* ---- frees after the report ------------------------------------------------------ */

static void test_frees_after_the_exit_report_are_safe(void **state)
{
    (void)state;
    lu_child_t c;
    lu_child_run(&c, "late-free", BASE ",leak_report:full", NULL);
    LU_CHILD_EXIT(&c, 0);
    const char *summary = "tally: SUMMARY: 3146752 bytes leaked in 2 blocks\n";
    LU_HAS(c.err, summary);
    LU_HAS(c.err, "tally: 3145728 bytes (3.0 MiB) in 1 block: tag late, stage (none), device 0\n");
    /* The late frees come after the report, succeed, and leave a sound state. */
    LU_HAS(c.err, "late-free: check=0 live=0 again=yes double-free-reported=1\n");
    assert_true(lu_pos(c.err, summary) < lu_pos(c.err, "late-free:"));
    lu_child_free(&c);
}

/* ---- report_path with %p at exit --------------------------------------------------- */

static void test_report_path_with_pid_is_written_at_exit(void **state)
{
    (void)state;
    char conf[600];
    snprintf(conf, sizeof conf, BASE ",leak_report:summary,leak_exitcode:23,report_path:%s/exit-%%p.json",
             lu_tmpdir());
    lu_child_t c;
    lu_child_run(&c, "leak", conf, NULL);
    LU_CHILD_EXIT(&c, 23);
    char path[400];
    snprintf(path, sizeof path, "%s/exit-%d.json", lu_tmpdir(), (int)c.pid);
    if (!lu_exists(path))
        fail_msg("no report at %s; child stderr:\n%s", path, c.err);
    LU_EQ(lu_dir_count(lu_tmpdir(), ".tmp"), 0);
    tally_json_t *root = lu_json_file(path);
    LU_EQ(lu_jint(root, "pid"), c.pid);
    LU_EQ(lu_jint(root, "rank"), 0);
    /* Its leaks are those the text report counts. */
    const tally_json_t *leaks = lu_jarr(root, "leaks");
    LU_EQ(leaks->len, 3);
    int64_t bytes = 0, blocks = 0;
    for (size_t i = 0; i < leaks->len; i++) {
        bytes += lu_jint(&leaks->items[i], "bytes");
        blocks += lu_jint(&leaks->items[i], "blocks");
    }
    LU_EQ(bytes, LEAK_BYTES);
    LU_EQ(blocks, LEAK_BLOCKS);
    LU_STREQ(lu_jstr(&leaks->items[0], "tag"), "act");
    LU_STREQ(lu_jstr(&leaks->items[0], "stage"), "train");
    LU_EQ(lu_jint(&leaks->items[0], "device"), 1);
    const tally_json_t *stages = lu_jarr(root, "stages");
    LU_EQ(stages->len, 1);
    LU_STREQ(lu_jstr(&stages->items[0], "name"), "train");
    tally__json_free(root);
    lu_child_free(&c);
}

/* A report path given after the library started replaces the one it
 * started with: the report is written at the new path only. */
static void test_report_path_set_at_run_time_is_the_one_written(void **state)
{
    (void)state;
    char conf[600], first[400], second[400], env0[500];
    snprintf(first, sizeof first, "%s/first-path.json", lu_tmpdir());
    snprintf(second, sizeof second, "%s/second-path.json", lu_tmpdir());
    snprintf(conf, sizeof conf, BASE ",leak_report:off,report_path:%s", first);
    snprintf(env0, sizeof env0, "RUNTIME_CONF=report_path:%s", second);
    const char *const env[] = {env0, NULL};
    lu_child_t c;
    lu_child_run(&c, "path-at-run-time", conf, env);
    LU_CHILD_EXIT(&c, 0);
    LU_HAS(c.out, "report path set at run time\n");
    if (!lu_exists(second))
        fail_msg("no report at %s, the path given at run time; child stderr:\n%s", second, c.err);
    if (lu_exists(first))
        fail_msg("a report at %s, the path replaced at run time", first);
    tally_json_t *root = lu_json_file(second);
    LU_EQ(lu_jint(root, "pid"), c.pid);
    tally__json_free(root);
    lu_child_free(&c);
}

/* ---- the exit path in this process --------------------------------------------------- */

static void test_exit_report_then_free_in_process(void **state)
{
    (void)state;
    LU_OK(tally_configure("leak_report:full,leak_exitcode:23"));
    LU_OK(tally_stage_begin("inproc"));
    LU_OK(tally_tag_push("inproc-tag"));
    void *a = lu_malloc(4 * MB, 0);
    void *b = lu_malloc(2000, 1);
    LU_OK(tally_tag_pop());
    lu_cap_begin();
    LU_OK(tally_stage_end("inproc"));
    lu_cap_begin();
    LU_EQ(tally__exit_report(), 23);
    const char *t = lu_cap_text();
    LU_HAS(t, "tally: leak report: 2 blocks still live at exit, in 2 groups\n");
    LU_HAS(t, "tally: 4194304 bytes (4.0 MiB) in 1 block: tag inproc-tag, stage inproc, device 0\n");
    LU_HAS(t, "tally: 2048 bytes (2.0 KiB) in 1 block: tag inproc-tag, stage inproc, device 1\n");
    LU_HAS(t, "tally: SUMMARY: 4196352 bytes leaked in 2 blocks\n");
    /* After the report: frees work, quietly; the state stays sound. */
    lu_cap_begin();
    tally_free(a);
    tally_free(b);
    LU_EQ(strlen(lu_cap_text()), 0);
    LU_CHECK_OK();
    LU_EQ(lu_stats(0).allocation[0].current, 0);
    LU_EQ(lu_stats(1).allocation[0].current, 0);
    void *p = lu_malloc(MB, 1);
    LU_EQ(tally_free_checked(p, MB, 1), 0);
    LU_CHECK_OK();
    /* The report runs once. */
    void *q = lu_malloc(MB, 0);
    LU_EQ(tally__exit_report(), 0);
    LU_EQ(strlen(lu_cap_text()), 0);
    tally_free(q);
    lu_cap_end();
    LU_OK(tally_configure("leak_report:off,leak_exitcode:0"));
    LU_CHECK_OK();
}

/* ---- main ------------------------------------------------------------------------- */

static const lu_role_t roles[] = {
    {"leak", child_leak},
    {"leak-exit7", child_leak_exit7},
    {"leak-exit-midway", child_leak_exit_midway},
    {"clean-exit7", child_clean_exit7},
    {"no-tally", child_no_tally},
    {"configured-only", child_configured_only},
    {"late-free", child_late_free},
    {"path-at-run-time", child_path_at_run_time},
    {NULL, NULL},
};

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "--child") == 0)
        return lu_child_main(argv[2], roles);
    unsetenv("RANK");
    unsetenv("LOCAL_RANK");
    unsetenv("WORLD_SIZE");
    setenv("TALLY_CONF", BASE ",leak_report:off", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_leak_report_and_exit_code),
        cmocka_unit_test(test_leak_exit_code_replaces_the_programs),
        cmocka_unit_test(test_leaks_without_exit_code_keep_the_programs_status),
        cmocka_unit_test(test_summary_leak_report_is_one_line),
        cmocka_unit_test(test_leak_report_off_prints_nothing),
        cmocka_unit_test(test_no_leaks_keep_the_programs_status),
        cmocka_unit_test(test_frees_after_the_exit_report_are_safe),
        cmocka_unit_test(test_report_path_with_pid_is_written_at_exit),
        cmocka_unit_test(test_report_path_set_at_run_time_is_the_one_written),
        /* Last: it uses up this process's one exit report. */
        cmocka_unit_test(test_exit_report_then_free_in_process),
    };
    int failed = cmocka_run_group_tests_name("exit", tests, NULL, NULL);
    lu_tmpdir_cleanup();
    return failed;
}
