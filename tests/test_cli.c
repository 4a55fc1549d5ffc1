/* Tests for the tally command (tools/tally_cli.c), run as a user runs it:
 * the built binary (../bin/tally next to this test's directory) under
 * system(), its stdout, stderr and exit status checked.
 *
 * Real reports come from this same binary: "test_cli --child MODE" runs a
 * small workload on the host backend and exits, writing its JSON report at
 * exit (TALLY_CONF report_path, set by the parent for the child only). The
 * parent never initialises the library itself. Fixtures with known values
 * live in tests/fixtures; the expected memory_summary tables below were
 * computed from tests/fixtures/memory_stats.json with PyTorch's own
 * memory_summary formatting rules, not with tally. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "skip.h"

#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cliutil.h"
#include "json.h"
#include "report.h"
#include "tally.h"

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

/* ---- child workloads ------------------------------------------------------- */

static void *must(size_t size, int device)
{
    void *p = tally_malloc(size, device, NULL);
    if (!p) {
        fprintf(stderr, "child: allocating %zu bytes on device %d failed: %s\n", size, device, tally_last_error());
        exit(3);
    }
    return p;
}

/* Stages load (weights, a model-init copy never freed, a scratch buffer),
 * train (with a nested warmup; activations and gradients per step; one
 * block on device 1, foreign to home device 0, kept). */
static int child_train(void)
{
    void *w[4], *m[2], *a[4], *g[4];
    tally_stage_begin("load");
    tally_tag_push("weights");
    for (int i = 0; i < 4; i++)
        w[i] = must(8 * MiB, 0);
    tally_tag_pop();
    tally_tag_push("model-init");
    for (int i = 0; i < 2; i++)
        m[i] = must(4 * MiB, 0);
    tally_tag_pop();
    tally_tag_push("scratch");
    tally_free(must(32 * MiB, 0));
    tally_tag_pop();
    tally_stage_end("load");

    tally_stage_begin("train");
    tally_stage_begin("warmup");
    tally_tag_push("activations");
    tally_free(must(2 * MiB, 0));
    tally_tag_pop();
    tally_stage_end("warmup");
    for (int step = 0; step < 3; step++) {
        tally_tag_push("activations");
        for (int i = 0; i < 4; i++)
            a[i] = must(2 * MiB, 0);
        tally_tag_pop();
        tally_tag_push("gradients");
        for (int i = 0; i < 4; i++)
            g[i] = must(8 * MiB, 0);
        for (int i = 0; i < 4; i++) {
            tally_free(a[i]);
            tally_free(g[i]);
        }
        tally_tag_pop();
    }
    tally_tag_push("stray");
    (void)must(1 * MiB, 1);
    tally_tag_pop();
    tally_stage_end("train");
    for (int i = 0; i < 4; i++)
        tally_free(w[i]);
    (void)m;
    return 0;
}

/* One rank of a 4-rank job: the checkpoint is loaded onto device 0 by every
 * rank (the torch.load-without-map_location bug), then each rank's weights
 * go to its own device. Everything stays live. */
static int child_rank(void)
{
    const char *lr = getenv("LOCAL_RANK");
    int home = lr ? atoi(lr) : 0;
    tally_stage_begin("load");
    tally_tag_push("checkpoint");
    (void)must(1 * GiB, 0);
    tally_tag_pop();
    tally_stage_end("load");
    tally_stage_begin("train");
    tally_tag_push("weights"); /* two blocks, so live blocks and rows differ */
    (void)must(128 * MiB, home);
    (void)must(128 * MiB, home);
    tally_tag_pop();
    tally_stage_end("train");
    return 0;
}

/* ---- harness ------------------------------------------------------------- */

static char dir[PATH_MAX];     /* scratch directory of this run */
static char tally[PATH_MAX];   /* the binary under test */
static char fixtures[PATH_MAX];

/* Run "tally ARGS" (ARGS formatted, passed through the shell). */
__attribute__((format(printf, 1, 2))) static run_t tally_run(const char *fmt, ...)
{
    char args[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    return run_tool(tally, dir, args);
}

#define HAS(s, sub)                                                                                                \
    do {                                                                                                           \
        const char *has_s_ = (s);                                                                                  \
        if (!has_s_ || !strstr(has_s_, (sub)))                                                                     \
            fail_msg("%s:%d: expected \"%s\" in:\n%s", __FILE__, __LINE__, (sub), has_s_ ? has_s_ : "(null)");    \
    } while (0)

#define EXPECT_RC(r, code)                                                                                         \
    do {                                                                                                           \
        if ((r).rc != (code))                                                                                      \
            fail_msg("%s:%d: exit status %d, expected %d; stdout:\n%s\nstderr:\n%s", __FILE__, __LINE__, (r).rc,   \
                     (code), (r).out, (r).err);                                                                    \
    } while (0)

/* Run this binary as "--child mode" with the given environment additions
 * (NULL-terminated name, value pairs); fails the setup unless it exits 0. */
static int spawn_child(const char *mode, const char *const *env)
{
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        for (size_t i = 0; env[i]; i += 2)
            setenv(env[i], env[i + 1], 1);
        execl("/proc/self/exe", "test_cli", "--child", mode, (char *)NULL);
        _exit(127);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "child %s failed (status %d)\n", mode, st);
        return -1;
    }
    return 0;
}

static int teardown(void **state);

/* A failed setup leaves no scratch directory behind (cmocka skips the
 * teardown then). */
static int setup_failed(void)
{
    if (dir[0])
        teardown(NULL);
    return -1;
}

static int setup(void **state)
{
    char exe[PATH_MAX], conf[PATH_MAX + 256];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return -1;
    exe[n] = 0;
    char *bin_dir = dirname(exe); /* .../build/tests */
    snprintf(tally, sizeof tally, "%s/../bin/tally", bin_dir);
    snprintf(fixtures, sizeof fixtures, "%s/../../tests/fixtures", bin_dir);
    if (access(tally, X_OK) != 0) {
        fprintf(stderr, "test_cli: %s is missing (make builds it)\n", tally);
        return -1;
    }
    snprintf(dir, sizeof dir, "/tmp/tally-cli-XXXXXX");
    if (!mkdtemp(dir))
        return -1;
    /* The training-like workload, with a timeline and without. */
    snprintf(conf, sizeof conf,
             "backend:host,host_devices:2,home_device:0,timeline:true,report_path:%s/train.json,leak_report:off,"
             "stage_report:false,persistent_tags:weights",
             dir);
    const char *env1[] = {"TALLY_CONF", conf, NULL};
    if (spawn_child("train", env1))
        return setup_failed();
    snprintf(conf, sizeof conf,
             "backend:host,host_devices:2,home_device:0,report_path:%s/plain.json,leak_report:off,stage_report:false",
             dir);
    if (spawn_child("train", env1))
        return setup_failed();
    /* Four ranks, each LOCAL_RANK = RANK, with four simulated devices. */
    snprintf(conf, sizeof conf,
             "backend:host,host_devices:4,host_mode:virtual,host_capacity:80GiB,report_path:%s/rank%%r.json,"
             "leak_report:off,stage_report:false",
             dir);
    for (int r = 0; r < 4; r++) {
        char rank[16];
        snprintf(rank, sizeof rank, "%d", r);
        const char *env[] = {"TALLY_CONF", conf, "RANK", rank, "LOCAL_RANK", rank, "WORLD_SIZE", "4", NULL};
        if (spawn_child("rank", env))
            return setup_failed();
    }
    (void)state;
    return 0;
}

static int teardown(void **state)
{
    char cmd[PATH_MAX + 16];
    (void)state;
    if (!getenv("TALLY_TEST_KEEP")) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        return system(cmd) == 0 ? 0 : -1;
    }
    fprintf(stderr, "test_cli: kept %s\n", dir);
    return 0;
}

/* ---- expected tables (PyTorch's rules applied to memory_stats.json) ------------ */

#define TABLE_HEAD(dev)                                                                                            \
    "|===========================================================================|\n"                             \
    "|                  PyTorch CUDA memory summary, device ID " dev "                 |\n"                       \
    "|---------------------------------------------------------------------------|\n"                             \
    "|            CUDA OOMs: 1            |        cudaMalloc retries: 3         |\n"                             \
    "|===========================================================================|\n"                             \
    "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |\n"
#define RULE "|---------------------------------------------------------------------------|\n"
#define TAIL                                                                                                       \
    RULE "| Oversize allocations  |       2    |       5    |      17    |      15    |\n" RULE                      \
         "| Oversize GPU segments |       1    |       3    |       9    |       8    |\n"                           \
         "|===========================================================================|\n"

static const char full_table[] =
    TABLE_HEAD("0") RULE
    "| Allocated memory      |   3584 MiB |   5121 MiB |    821 GiB |    817 GiB |\n"
    "|       from large pool |   3584 MiB |   5120 MiB |    812 GiB |    808 GiB |\n"
    "|       from small pool |      0 MiB |      2 MiB |      9 GiB |      9 GiB |\n" RULE
    "| Active memory         |   3584 MiB |   5121 MiB |    821 GiB |    817 GiB |\n"
    "|       from large pool |   3584 MiB |   5120 MiB |    812 GiB |    808 GiB |\n"
    "|       from small pool |      0 MiB |      2 MiB |      9 GiB |      9 GiB |\n" RULE
    "| Requested memory      |   3572 MiB |   5117 MiB |    809 GiB |    805 GiB |\n"
    "|       from large pool |   3572 MiB |   5117 MiB |    800 GiB |    796 GiB |\n"
    "|       from small pool |      0 MiB |      1 MiB |      9 GiB |      8 GiB |\n" RULE
    "| GPU reserved memory   |   4100 MiB |   6149 MiB |   7176 MiB |   3076 MiB |\n"
    "|       from large pool |   4096 MiB |   6144 MiB |   7168 MiB |   3072 MiB |\n"
    "|       from small pool |      4 MiB |      6 MiB |      8 MiB |      4 MiB |\n" RULE
    "| Non-releasable memory | 205500 KiB |   1026 MiB |    905 GiB |    904 GiB |\n"
    "|       from large pool | 204800 KiB |   1024 MiB |    900 GiB |    899 GiB |\n"
    "|       from small pool |    700 KiB |      3 MiB |      5 GiB |      4 GiB |\n" RULE
    "| Allocations           |     157    |    1139    |    3260 K  |    3259 K  |\n"
    "|       from large pool |     120    |     340    |    2500 K  |    2499 K  |\n"
    "|       from small pool |      37    |     800    |     760 K  |     759 K  |\n" RULE
    "| Active allocs         |     157    |    1139    |    3260 K  |    3259 K  |\n"
    "|       from large pool |     120    |     340    |    2500 K  |    2499 K  |\n"
    "|       from small pool |      37    |     800    |     760 K  |     759 K  |\n" RULE
    "| GPU reserved segments |      42    |      63    |      99    |      57    |\n"
    "|       from large pool |      40    |      61    |      95    |      55    |\n"
    "|       from small pool |       2    |       3    |       4    |       2    |\n" RULE
    "| Non-releasable allocs |      14    |      38    |    1600 K  |    1599 K  |\n"
    "|       from large pool |      11    |      30    |    1200 K  |    1199 K  |\n"
    "|       from small pool |       3    |       9    |     400 K  |     399 K  |\n" TAIL;

static const char abbreviated_table[] =
    TABLE_HEAD("3") RULE
    "| Allocated memory      |   3584 MiB |   5121 MiB |    821 GiB |    817 GiB |\n" RULE
    "| Active memory         |   3584 MiB |   5121 MiB |    821 GiB |    817 GiB |\n" RULE
    "| Requested memory      |   3572 MiB |   5117 MiB |    809 GiB |    805 GiB |\n" RULE
    "| GPU reserved memory   |   4100 MiB |   6149 MiB |   7176 MiB |   3076 MiB |\n" RULE
    "| Non-releasable memory | 205500 KiB |   1026 MiB |    905 GiB |    904 GiB |\n" RULE
    "| Allocations           |     157    |    1139    |    3260 K  |    3259 K  |\n" RULE
    "| Active allocs         |     157    |    1139    |    3260 K  |    3259 K  |\n" RULE
    "| GPU reserved segments |      42    |      63    |      99    |      57    |\n" RULE
    "| Non-releasable allocs |      14    |      38    |    1600 K  |    1599 K  |\n" TAIL;

static void expect_text(const char *got, const char *want)
{
    if (strcmp(got, want) != 0)
        fail_msg("output differs.\n--- got:\n%s\n--- expected:\n%s", got, want);
}

/* ---- version and help ------------------------------------------------------- */

static void test_version(void **state)
{
    (void)state;
    const char *forms[] = {"version", "--version", "-V"};
    for (size_t i = 0; i < 3; i++) {
        run_t r = tally_run("%s", forms[i]);
        EXPECT_RC(r, 0);
        expect_text(r.out, "tally " TALLY_VERSION "\n");
        run_free(&r);
    }
}

static void test_help(void **state)
{
    (void)state;
    run_t r = tally_run("--help");
    EXPECT_RC(r, 0);
    HAS(r.out, "usage: tally COMMAND");
    HAS(r.out, "summary");
    HAS(r.out, "merge");
    run_free(&r);
    const char *cmds[] = {"summary", "ledger", "merge", "plot"};
    for (size_t i = 0; i < 4; i++) {
        r = tally_run("%s --help", cmds[i]);
        EXPECT_RC(r, 0);
        char want[64];
        snprintf(want, sizeof want, "usage: tally %s", cmds[i]);
        HAS(r.out, want);
        run_free(&r);
    }
    r = tally_run("%s", "");
    EXPECT_RC(r, 2);
    HAS(r.err, "usage: tally COMMAND");
    run_free(&r);
}

/* ---- summary ---------------------------------------------------------------- */

static void test_summary_flat_full(void **state)
{
    (void)state;
    run_t r = tally_run("summary '%s/memory_stats.json'", fixtures);
    EXPECT_RC(r, 0);
    expect_text(r.out, full_table);
    expect_text(r.err, "");
    run_free(&r);
}

/* "-" reads standard input, and messages name it. */
static void test_summary_reads_standard_input(void **state)
{
    (void)state;
    run_t r = tally_run("summary - < '%s/memory_stats.json'", fixtures);
    EXPECT_RC(r, 0);
    expect_text(r.out, full_table);
    expect_text(r.err, "");
    run_free(&r);
    r = tally_run("summary - < '%s/malformed.json'", fixtures);
    EXPECT_RC(r, 1);
    HAS(r.err, "tally summary: (standard input): ");
    run_free(&r);
}

static void test_summary_flat_abbreviated_device(void **state)
{
    (void)state;
    run_t r = tally_run("summary --abbreviated --device 3 '%s/memory_stats.json'", fixtures);
    EXPECT_RC(r, 0);
    expect_text(r.out, abbreviated_table);
    run_free(&r);
    r = tally_run("summary -a --device=3 '%s/memory_stats.json'", fixtures);
    EXPECT_RC(r, 0);
    expect_text(r.out, abbreviated_table);
    run_free(&r);
}

static void test_summary_nested_stats(void **state)
{
    (void)state;
    /* memory_stats_as_nested_dict() form of the same numbers */
    run_t r = tally_run("summary '%s/memory_stats_nested.json'", fixtures);
    EXPECT_RC(r, 0);
    expect_text(r.out, full_table);
    run_free(&r);
}

static void buf_write(void *arg, const char *text, size_t len)
{
    char **p = arg;
    size_t n = *p ? strlen(*p) : 0;
    *p = realloc(*p, n + len + 1);
    memcpy(*p + n, text, len);
    (*p)[n + len] = 0;
}

/* The table for device dev of a report, rendered in this process from the
 * report's stats object re-serialised as flat JSON. */
static char *expected_for_report(const char *path, int dev)
{
    char *text = slurp(path);
    assert_non_null(text);
    char err[256];
    tally_json_t *root = tally__json_parse(text, strlen(text), err, sizeof err, NULL);
    assert_non_null(root);
    const tally_json_t *devs = tally__json_get(root, "devices");
    const tally_json_t *stats = NULL;
    for (size_t i = 0; devs && i < devs->len; i++) {
        int64_t d;
        if (tally__json_int(tally__json_get(&devs->items[i], "device"), &d) == 0 && d == dev)
            stats = tally__json_get(&devs->items[i], "stats");
    }
    assert_non_null(stats);
    size_t cap = 64 + stats->len * 64, n = 0;
    char *flat = malloc(cap);
    n += (size_t)snprintf(flat + n, cap - n, "{");
    for (size_t i = 0; i < stats->len; i++)
        n += (size_t)snprintf(flat + n, cap - n, "%s\"%s\": %lld", i ? ", " : "", stats->members[i].key,
                              (long long)stats->members[i].value.i);
    snprintf(flat + n, cap - n, "}");
    tally_stats_t s;
    assert_int_equal(tally__stats_from_json(flat, strlen(flat), &s, err, sizeof err), 0);
    char *table = NULL;
    assert_int_equal(tally__summary_render(&s, dev, 0, buf_write, &table), 0);
    free(flat);
    tally__json_free(root);
    free(text);
    return table;
}

static void test_summary_report(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/train.json", dir);
    /* Default: the home device (0). Two model-init blocks live at exit. */
    run_t r = tally_run("summary '%s'", path);
    EXPECT_RC(r, 0);
    char *want = expected_for_report(path, 0);
    expect_text(r.out, want);
    free(want);
    HAS(r.out, "device ID 0 ");
    HAS(r.out, "| Allocations           |       2    |");
    HAS(r.out, "| Allocated memory      |   8192 KiB |");
    run_free(&r);
    /* Device 1: the one stray 1 MiB block. */
    r = tally_run("summary --device 1 '%s'", path);
    EXPECT_RC(r, 0);
    want = expected_for_report(path, 1);
    expect_text(r.out, want);
    free(want);
    HAS(r.out, "device ID 1 ");
    HAS(r.out, "| Allocated memory      |   1024 KiB |   1024 KiB |   1024 KiB |      0 B   |");
    run_free(&r);
}

static void test_summary_absent_device(void **state)
{
    (void)state;
    run_t r = tally_run("summary --device 7 '%s/train.json'", dir);
    EXPECT_RC(r, 1);
    HAS(r.err, "train.json: no device 7 in the report (it has devices 0, 1)");
    expect_text(r.out, "");
    run_free(&r);
}

/* ---- ledger ----------------------------------------------------------------- */

static void test_ledger_report(void **state)
{
    (void)state;
    run_t r = tally_run("ledger '%s/train.json'", dir);
    EXPECT_RC(r, 0);
    HAS(r.out, "rank 0 of 1, pid ");
    HAS(r.out, "backend host, home device 0");
    HAS(r.out, "device tag                  stage                     current         peak     blocks\n");
    HAS(r.out, "0      model-init           load                      8.0 MiB      8.0 MiB          2\n");
    HAS(r.out, "0      gradients            train                         0 B     32.0 MiB          0\n");
    HAS(r.out, "0      weights              load                          0 B     32.0 MiB          0\n");
    HAS(r.out, "0      activations          warmup                        0 B      2.0 MiB          0\n");
    HAS(r.out, "1      stray                train                     1.0 MiB      1.0 MiB          1  foreign\n");
    /* Stage timeline: load ended first, then the nested warmup, then train. */
    HAS(r.out, "stages (3 ended, 3 in the report)\n");
    HAS(r.out, "#    stage                   seconds   peak alloc    peak resv    survivors     released\n");
    HAS(r.out, "\n1    load                 ");
    HAS(r.out, "\n2      warmup             ");
    HAS(r.out, "\n3    train                ");
    HAS(r.out, "     outlived by tag model-init on device 0: 8.0 MiB in 2 blocks\n");
    HAS(r.out, "     outlived by tag stray on device 1: 1.0 MiB in 1 block (foreign)\n");
    /* Live blocks, grouped as the leak report groups them. */
    HAS(r.out, "3 blocks, 9.0 MiB, in 2 groups\n");
    HAS(r.out, "8388608 bytes (8.0 MiB) in 2 blocks: tag model-init, stage load, device 0\n");
    HAS(r.out, "1048576 bytes (1.0 MiB) in 1 block: tag stray, stage train, device 1 (foreign)\n");
    expect_text(r.err, "");
    run_free(&r);
}

static void test_ledger_rejects_stats(void **state)
{
    (void)state;
    run_t r = tally_run("ledger '%s/memory_stats.json'", fixtures);
    EXPECT_RC(r, 1);
    HAS(r.err, "memory_stats.json: a memory_stats object, not a tally report");
    run_free(&r);
}

/* ---- merge ----------------------------------------------------------------- */

static void test_merge_four_ranks(void **state)
{
    (void)state;
    run_t r = tally_run("merge '%s/rank3.json' '%s/rank1.json' '%s/rank0.json' '%s/rank2.json'", dir, dir, dir, dir);
    EXPECT_RC(r, 0);
    HAS(r.out, "tally merge: 4 reports, ranks 0, 1, 2, 3 (world size 4)\n");
    HAS(r.out, "device 0");
    HAS(r.out, "device 3");
    /* Device 0 holds four checkpoints and rank 0's weights. */
    HAS(r.out, "\ntotal                     4.2 GiB   256.0 MiB   256.0 MiB   256.0 MiB\n");
    HAS(r.out, " 1.0 GiB*  256.0 MiB         0 B         0 B\n");
    HAS(r.out, "foreign memory: 3 findings\n");
    HAS(r.out, "rank 1 holds 1.0 GiB on device 0: stage load, tag checkpoint (its home device is 1)\n");
    HAS(r.out, "rank 2 holds 1.0 GiB on device 0: stage load, tag checkpoint (its home device is 2)\n");
    HAS(r.out, "rank 3 holds 1.0 GiB on device 0: stage load, tag checkpoint (its home device is 3)\n");
    if (strstr(r.out, "rank 0 holds"))
        fail_msg("rank 0's checkpoint is on its home device, yet it is flagged:\n%s", r.out);
    /* Totals across ranks. */
    HAS(r.out, "load                      4.0 GiB      4.0 GiB            4      4\n");
    HAS(r.out, "weights                   1.0 GiB      1.0 GiB            8      4\n");
    HAS(r.out, "checkpoint                4.0 GiB      4.0 GiB            4      4\n");
    run_free(&r);
}

static int64_t jint(const tally_json_t *obj, const char *key)
{
    int64_t v = -1;
    const tally_json_t *x = tally__json_get(obj, key);
    if (!x || tally__json_int(x, &v) != 0)
        fail_msg("no integer \"%s\"", key);
    return v;
}

static const char *jstr(const tally_json_t *obj, const char *key)
{
    const tally_json_t *x = tally__json_get(obj, key);
    if (!x || x->type != TALLY_JSON_STRING)
        fail_msg("no string \"%s\"", key);
    return x->s;
}

static void test_merge_json(void **state)
{
    (void)state;
    run_t r = tally_run("merge --json '%s'/rank*.json", dir);
    EXPECT_RC(r, 0);
    char err[256];
    tally_json_t *root = tally__json_parse(r.out, strlen(r.out), err, sizeof err, NULL);
    if (!root)
        fail_msg("merge --json is not JSON: %s\n%s", err, r.out);
    assert_string_equal(jstr(root, "format"), "tally-merge");
    assert_int_equal(jint(root, "world_size"), 4);
    assert_int_equal(tally__json_get(root, "missing_ranks")->len, 0);
    const tally_json_t *ranks = tally__json_get(root, "ranks");
    assert_int_equal(ranks->len, 4);
    for (size_t i = 0; i < 4; i++) {
        const tally_json_t *rk = &ranks->items[i];
        assert_int_equal(jint(rk, "rank"), (int64_t)i);
        assert_int_equal(jint(rk, "home_device"), (int64_t)i);
        const tally_json_t *d0 = tally__json_at(tally__json_get(rk, "devices"), 0);
        assert_int_equal(jint(d0, "device"), 0);
        assert_int_equal(jint(d0, "allocated_bytes"), (int64_t)(GiB + (i == 0 ? 256 * MiB : 0)));
        assert_int_equal(jint(d0, "foreign_bytes"), (int64_t)(i == 0 ? 0 : GiB));
    }
    const tally_json_t *devs = tally__json_get(root, "devices");
    assert_int_equal(devs->len, 4);
    assert_int_equal(jint(&devs->items[0], "allocated_bytes"), (int64_t)(4 * GiB + 256 * MiB));
    assert_int_equal(jint(&devs->items[0], "foreign_bytes"), (int64_t)(3 * GiB));
    assert_int_equal(jint(&devs->items[2], "allocated_bytes"), (int64_t)(256 * MiB));
    const tally_json_t *foreign = tally__json_get(root, "foreign");
    assert_int_equal(foreign->len, 3);
    for (size_t i = 0; i < 3; i++) {
        const tally_json_t *f = &foreign->items[i];
        assert_int_equal(jint(f, "rank"), (int64_t)i + 1);
        assert_int_equal(jint(f, "device"), 0);
        assert_int_equal(jint(f, "home_device"), (int64_t)i + 1);
        assert_int_equal(jint(f, "current_bytes"), (int64_t)GiB);
        assert_string_equal(jstr(f, "stage"), "load");
        assert_string_equal(jstr(f, "tag"), "checkpoint");
        HAS(jstr(f, "message"), "holds 1.0 GiB on device 0: stage load, tag checkpoint");
    }
    const tally_json_t *stages = tally__json_get(root, "stages");
    assert_int_equal(stages->len, 2);
    assert_string_equal(jstr(&stages->items[0], "stage"), "load");
    assert_int_equal(jint(&stages->items[0], "current_bytes"), (int64_t)(4 * GiB));
    assert_int_equal(jint(&stages->items[0], "ranks"), 4);
    const tally_json_t *tags = tally__json_get(root, "tags");
    assert_string_equal(jstr(&tags->items[1], "tag"), "weights");
    assert_int_equal(jint(&tags->items[1], "current_bytes"), (int64_t)GiB);
    tally__json_free(root);
    run_free(&r);
}

static void test_merge_duplicate_rank(void **state)
{
    (void)state;
    run_t r = tally_run("merge '%s/rank0.json' '%s/rank1.json' '%s/rank1.json'", dir, dir, dir);
    EXPECT_RC(r, 1);
    HAS(r.err, "tally merge: rank 1 appears twice: ");
    expect_text(r.out, "");
    run_free(&r);
    /* The training report is rank 0 too. */
    r = tally_run("merge --json '%s/rank0.json' '%s/train.json'", dir, dir);
    EXPECT_RC(r, 1);
    HAS(r.err, "rank 0 appears twice");
    run_free(&r);
}

static void test_merge_missing_rank(void **state)
{
    (void)state;
    run_t r = tally_run("merge '%s/rank0.json' '%s/rank2.json'", dir, dir);
    EXPECT_RC(r, 0);
    HAS(r.out, "tally merge: 2 reports, ranks 0, 2 (world size 4)\nmissing: ranks 1, 3\n");
    HAS(r.out, "rank 2 holds 1.0 GiB on device 0");
    run_free(&r);
}

/* Copy the report from, with its "devices" array listed last to first (a
 * report another writer could make; the schema does not fix the order). */
static void write_reversed_devices(const char *from, const char *to)
{
    char *s = slurp(from);
    assert_non_null(s);
    char *a = strstr(s, "\"devices\":[");
    assert_non_null(a);
    a += strlen("\"devices\":[");
    char *end = strstr(a, "],\n\"ledger\"");
    assert_non_null(end);
    const char *items[16];
    size_t lens[16];
    int n = 0;
    for (char *p = a; n < 16;) {
        char *next = strstr(p + 1, ",\n {\"device\":");
        if (!next || next > end)
            next = end;
        items[n] = p == a ? p : p + 1;
        lens[n] = (size_t)(next - items[n]);
        n++;
        if (next == end)
            break;
        p = next;
    }
    FILE *f = fopen(to, "w");
    assert_non_null(f);
    fwrite(s, 1, (size_t)(a - s), f);
    for (int i = n - 1; i >= 0; i--) {
        if (i != n - 1)
            fputc(',', f);
        fwrite(items[i], 1, lens[i], f);
    }
    fputs(end, f);
    fclose(f);
    free(s);
}

/* The device columns are in device order whatever order the reports list
 * their devices in. */
static void test_merge_device_columns_in_order(void **state)
{
    (void)state;
    char from[PATH_MAX + 16], sub[PATH_MAX + 16], to[PATH_MAX + 32];
    snprintf(from, sizeof from, "%s/rank0.json", dir);
    snprintf(sub, sizeof sub, "%s/reversed", dir);
    snprintf(to, sizeof to, "%s/rank0.json", sub);
    assert_int_equal(mkdir(sub, 0700), 0);
    write_reversed_devices(from, to);
    run_t r = tally_run("merge '%s' '%s/rank1.json'", to, dir);
    if (r.rc != 0)
        fail_msg("exit status %d; stderr:\n%s", r.rc, r.err);
    const char *d0 = strstr(r.out, "device 0"), *d3 = strstr(r.out, "device 3");
    if (!d0 || !d3 || d0 > d3)
        fail_msg("device columns out of order:\n%s", r.out);
    HAS(r.out, "rank 1 holds 1.0 GiB on device 0: stage load, tag checkpoint (its home device is 1)\n");
    run_free(&r);
}

/* ---- plot ------------------------------------------------------------------ */

/* 0 when path parses as XML (python3's minidom, else xmllint); 77 when
 * neither is available. */
static int xml_check(const char *path)
{
    char cmd[PATH_MAX + 200];
    if (system("python3 -c 'import xml.dom.minidom' >/dev/null 2>&1") == 0) {
        snprintf(cmd, sizeof cmd,
                 "python3 -c \"import xml.dom.minidom,sys; xml.dom.minidom.parse(sys.argv[1])\" '%s'", path);
        return system(cmd) == 0 ? 0 : 1;
    }
    if (system("xmllint --version >/dev/null 2>&1") == 0) {
        snprintf(cmd, sizeof cmd, "xmllint --noout '%s'", path);
        return system(cmd) == 0 ? 0 : 1;
    }
    return 77;
}

static size_t count(const char *s, const char *sub)
{
    size_t n = 0;
    for (const char *p = strstr(s, sub); p; p = strstr(p + 1, sub))
        n++;
    return n;
}

static void test_plot_svg(void **state)
{
    (void)state;
    char out[PATH_MAX + 16];
    snprintf(out, sizeof out, "%s/plot.svg", dir);
    run_t r = tally_run("plot '%s/train.json' -o '%s'", dir, out);
    EXPECT_RC(r, 0);
    HAS(r.out, "plot.svg: device 0, ");
    run_free(&r);
    int x = xml_check(out);
    if (x == 77)
        SKIP("neither python3's xml.dom.minidom nor xmllint is installed to check the SVG");
    if (x != 0)
        fail_msg("%s is not well-formed XML", out);
    char *svg = slurp(out);
    assert_non_null(svg);
    HAS(svg, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\"");
    /* One filled area per tag on device 0, the reserved line, stage bands. */
    assert_true(count(svg, "<path class=\"tag\"") == 5);
    HAS(svg, "<path class=\"reserved\"");
    for (const char *const *t = (const char *const[]){"weights", "model-init", "scratch", "activations",
                                                       "gradients", NULL};
         *t; t++) {
        char want[64];
        snprintf(want, sizeof want, "<title>%s</title></path>", *t);
        HAS(svg, want);
    }
    /* Stacked steadiest first: model-init (allocated once, kept), weights and
     * scratch (each allocated once, freed once), then the tags that churn. */
    const char *order[] = {"model-init", "weights", "scratch", "gradients", "activations"};
    const char *at = svg;
    for (size_t i = 0; i < sizeof order / sizeof *order; i++) {
        char want[64];
        snprintf(want, sizeof want, "<title>%s</title></path>", order[i]);
        const char *next = strstr(at, want);
        if (!next)
            fail_msg("tag areas are not stacked model-init, weights, scratch, gradients, activations: %s is "
                     "out of order",
                     order[i]);
        at = next;
    }
    HAS(svg, ">load</text>");
    HAS(svg, ">train</text>");
    HAS(svg, ">warmup</text>");
    HAS(svg, "<text");
    HAS(svg, "memory (MiB)</text>");
    HAS(svg, "time since the first event (");
    HAS(svg, "reserved (peak ");
    if (strstr(svg, "<script") || strstr(svg, "href="))
        fail_msg("the SVG should be self-contained");
    free(svg);
    /* Device 1 has its one stray block. */
    r = tally_run("plot '%s/train.json' --device 1 --x events -o '%s'", dir, out);
    EXPECT_RC(r, 0);
    run_free(&r);
    svg = slurp(out);
    assert_true(count(svg, "<path class=\"tag\"") == 1);
    HAS(svg, "<title>stray</title></path>");
    HAS(svg, "event number (of ");
    free(svg);
    assert_int_equal(xml_check(out), 0);
}

static void test_plot_html(void **state)
{
    (void)state;
    char out[PATH_MAX + 16];
    snprintf(out, sizeof out, "%s/plot.html", dir);
    run_t r = tally_run("plot --output '%s' '%s/train.json'", out, dir);
    EXPECT_RC(r, 0);
    run_free(&r);
    char *html = slurp(out);
    assert_non_null(html);
    HAS(html, "<!DOCTYPE html>");
    HAS(html, "<svg xmlns=\"http://www.w3.org/2000/svg\"");
    HAS(html, "<h2>Stages (whole process)</h2>");
    HAS(html, "<tr><td>gradients</td><td>32.0 MiB</td></tr>");
    /* Peaks largest first (ties in order of first appearance). */
    HAS(html, "<tr><th>tag</th><th>peak</th></tr>\n<tr><td>weights</td><td>32.0 MiB</td></tr>\n"
              "<tr><td>scratch</td><td>32.0 MiB</td></tr>\n<tr><td>gradients</td><td>32.0 MiB</td></tr>\n"
              "<tr><td>model-init</td><td>8.0 MiB</td></tr>\n<tr><td>activations</td><td>8.0 MiB</td></tr>\n"
              "</table>");
    /* The blocks live when the report was written: the leaks, at exit. */
    HAS(html, "<h2>Live blocks when the report was written (at exit: the leaks)</h2>");
    HAS(html, "<tr><td>model-init</td><td>load</td><td>0</td><td>2</td><td>8.0 MiB</td></tr>");
    HAS(html, "<tr><td>stray</td><td>train</td><td>1 (foreign)</td><td>1</td><td>1.0 MiB</td></tr>");
    if (strstr(html, "<?xml") || strstr(html, "<script") || strstr(html, "https://"))
        fail_msg("the HTML should be self-contained, with the SVG inline");
    free(html);
}

/* A timeline cut by timeline_events: the plot says how many of the oldest
 * events were dropped (the full run's device-0 events less the 16 kept). */
static void test_plot_says_how_many_events_were_dropped(void **state)
{
    (void)state;
    char conf[PATH_MAX + 256], out[PATH_MAX + 16];
    snprintf(conf, sizeof conf,
             "backend:host,host_devices:2,home_device:0,timeline:true,timeline_events:16,report_path:%s/cut.json,"
             "leak_report:off,stage_report:false,persistent_tags:weights",
             dir);
    const char *env[] = {"TALLY_CONF", conf, NULL};
    assert_int_equal(spawn_child("train", env), 0);
    snprintf(out, sizeof out, "%s/train.json", dir);
    char *full = slurp(out);
    assert_non_null(full);
    int all = (int)count(full, "{\"device\":0,\"time_us\"");
    free(full);
    assert_true(all > 16);
    snprintf(out, sizeof out, "%s/cut.html", dir);
    run_t r = tally_run("plot '%s/cut.json' -o '%s'", dir, out);
    EXPECT_RC(r, 0);
    char want[200];
    snprintf(want, sizeof want, "the timeline had dropped the %d oldest events of device 0", all - 16);
    HAS(r.out, want);
    run_free(&r);
    char *html = slurp(out);
    assert_non_null(html);
    snprintf(want, sizeof want, "16 events, peak allocated");
    HAS(html, want);
    snprintf(want, sizeof want, "; %d older events dropped (timeline_events)", all - 16);
    HAS(html, want);
    free(html);
    r = tally_run("plot '%s/train.json' -o '%s'", dir, out); /* nothing dropped: nothing said */
    EXPECT_RC(r, 0);
    if (strstr(r.out, "dropped"))
        fail_msg("a whole timeline is reported as cut: %s", r.out);
    run_free(&r);
}

static void test_plot_without_timeline(void **state)
{
    (void)state;
    run_t r = tally_run("plot '%s/plain.json' -o '%s/none.svg'", dir, dir);
    EXPECT_RC(r, 1);
    HAS(r.err, "plain.json: the report has no timeline to plot; run the process with TALLY_CONF=timeline:true");
    run_free(&r);
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/none.svg", dir);
    assert_int_not_equal(access(path, F_OK), 0);
    r = tally_run("plot '%s/train.json' --device 3 -o '%s/none.svg'", dir, dir);
    EXPECT_RC(r, 1);
    HAS(r.err, "no timeline events for device 3 (the timeline has allocations on devices 0, 1)");
    run_free(&r);
}

/* ---- errors ------------------------------------------------------------------ */

static void test_error_missing_file(void **state)
{
    (void)state;
    const char *cmds[] = {"summary", "ledger", "merge", "plot -o x.svg"};
    for (size_t i = 0; i < 4; i++) {
        run_t r = tally_run("%s '%s/no-such-report.json'", cmds[i], dir);
        EXPECT_RC(r, 1);
        HAS(r.err, "no-such-report.json: cannot open: No such file or directory\n");
        expect_text(r.out, "");
        run_free(&r);
    }
}

static void test_error_malformed_json(void **state)
{
    (void)state;
    run_t r = tally_run("summary '%s/malformed.json'", fixtures);
    EXPECT_RC(r, 1);
    HAS(r.err, "malformed.json: malformed JSON: byte 49: unexpected '}' (expected a value) (line 2, column 14)\n");
    run_free(&r);
    /* A report cut short. */
    char cut[PATH_MAX + 16];
    snprintf(cut, sizeof cut, "%s/cut.json", dir);
    char cmd[3 * PATH_MAX];
    snprintf(cmd, sizeof cmd, "head -c 300 '%s/train.json' > '%s'", dir, cut);
    assert_int_equal(system(cmd), 0);
    r = tally_run("ledger '%s'", cut);
    EXPECT_RC(r, 1);
    HAS(r.err, "cut.json: malformed JSON: byte 300: ");
    run_free(&r);
}

static void test_error_wrong_schema(void **state)
{
    (void)state;
    run_t r = tally_run("summary '%s/not_stats.json'", fixtures);
    EXPECT_RC(r, 1);
    HAS(r.err, "tally summary: ");
    HAS(r.err, "not_stats.json: not a tally report or memory_stats object\n");
    run_free(&r);
    r = tally_run("merge '%s/not_stats.json'", fixtures);
    EXPECT_RC(r, 1);
    HAS(r.err, "not_stats.json: not a tally report or memory_stats object\n");
    run_free(&r);
    r = tally_run("summary '%s/stats_bad_value.json'", fixtures);
    EXPECT_RC(r, 1);
    HAS(r.err, "stats_bad_value.json: not a valid memory_stats object: byte 66: memory_stats: "
               "\"allocated_bytes.all.peak\" should be an integer, not string\n");
    run_free(&r);
    r = tally_run("ledger '%s/bad_report.json'", fixtures);
    EXPECT_RC(r, 1);
    HAS(r.err, "bad_report.json: not a valid tally report: byte 331: ledger[0]: \"current_bytes\" should be an "
               "integer, not string\n");
    run_free(&r);
}

static void test_error_bad_flags(void **state)
{
    (void)state;
    struct {
        const char *args, *msg;
    } cases[] = {
        {"summary --bogus x.json", "tally summary: unknown option '--bogus'\nTry 'tally summary --help'.\n"},
        {"summary --device", "--device needs a device number"},
        {"summary --device -1 x.json", "--device needs a device number (0, 1, ...), not '-1'"},
        {"summary --device two x.json", "not 'two'"},
        {"summary", "tally summary: FILE.json is missing"},
        {"summary a.json b.json", "one FILE.json expected, got 'a.json' and 'b.json'"},
        {"ledger --json x.json", "tally ledger: unknown option '--json'"},
        {"merge", "tally merge: no FILE.json given"},
        {"merge --csv a.json", "unknown option '--csv'"},
        {"plot x.json", "no output given: -o OUT.svg or -o OUT.html"},
        {"plot x.json -o out.png", "the output must end in .svg or .html, not 'out.png'"},
        {"plot x.json -o out.svg --x frames", "--x takes 'time' or 'events', not 'frames'"},
        {"frobnicate", "tally: unknown command 'frobnicate'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        run_t r = tally_run("%s", cases[i].args);
        if (r.rc != 2)
            fail_msg("'tally %s' exited %d, expected 2", cases[i].args, r.rc);
        HAS(r.err, cases[i].msg);
        expect_text(r.out, "");
        run_free(&r);
    }
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--child") == 0) {
        if (strcmp(argv[2], "train") == 0)
            return child_train();
        if (strcmp(argv[2], "rank") == 0)
            return child_rank();
        return 2;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_summary_flat_full),
        cmocka_unit_test(test_summary_reads_standard_input),
        cmocka_unit_test(test_summary_flat_abbreviated_device),
        cmocka_unit_test(test_summary_nested_stats),
        cmocka_unit_test(test_summary_report),
        cmocka_unit_test(test_summary_absent_device),
        cmocka_unit_test(test_ledger_report),
        cmocka_unit_test(test_ledger_rejects_stats),
        cmocka_unit_test(test_merge_four_ranks),
        cmocka_unit_test(test_merge_json),
        cmocka_unit_test(test_merge_device_columns_in_order),
        cmocka_unit_test(test_merge_duplicate_rank),
        cmocka_unit_test(test_merge_missing_rank),
        cmocka_unit_test(test_plot_svg),
        cmocka_unit_test(test_plot_html),
        cmocka_unit_test(test_plot_says_how_many_events_were_dropped),
        cmocka_unit_test(test_plot_without_timeline),
        cmocka_unit_test(test_error_missing_file),
        cmocka_unit_test(test_error_malformed_json),
        cmocka_unit_test(test_error_wrong_schema),
        cmocka_unit_test(test_error_bad_flags),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
