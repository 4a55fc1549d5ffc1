/* Running a command-line tool as a user runs it, for the tests of the
 * tally command (test_cli_*.c, test_tune_*.c): its exit status, stdout and
 * stderr, through the shell. Include after cmocka.h. */
#ifndef TALLY_TESTS_CLIUTIL_H
#define TALLY_TESTS_CLIUTIL_H

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

typedef struct run {
    int rc;
    char *out, *err;
} run_t;

/* The whole file, NUL-terminated; NULL when it cannot be read. */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (cap - n - 1 == 0) {
            cap *= 2;
            buf = realloc(buf, cap);
        }
    }
    fclose(f);
    if (buf)
        buf[n] = 0;
    return buf;
}

/* Run "'bin' args" with stdout and stderr captured in files of dir. */
static run_t run_tool(const char *bin, const char *dir, const char *args)
{
    char cmd[4096 + 3 * PATH_MAX + 64], out[PATH_MAX + 8], err[PATH_MAX + 8];
    snprintf(out, sizeof out, "%s/stdout", dir);
    snprintf(err, sizeof err, "%s/stderr", dir);
    snprintf(cmd, sizeof cmd, "'%s' %s >'%s' 2>'%s'", bin, args, out, err);
    int st = system(cmd);
    run_t r = {WIFEXITED(st) ? WEXITSTATUS(st) : -1, slurp(out), slurp(err)};
    assert_non_null(r.out);
    assert_non_null(r.err);
    return r;
}

static void run_free(run_t *r)
{
    free(r->out);
    free(r->err);
}

/* ---- the tally command's reports harness ---------------------------------- */
/* For the tests of tally's report commands (test_cli_usage, test_cli_summary,
 * test_cli_ledger_merge, test_cli_ledger_merge_ranks, test_cli_plot); define
 * CLIUTIL_REPORTS before including. The built binary (../bin/tally next to
 * the test's directory) runs under system(). Real reports come from the
 * test binary itself:
 * "--child MODE" runs a small workload on the host backend and exits,
 * writing its JSON report at exit (TALLY_CONF report_path, set by the parent
 * for the child only); the parent never initialises the library itself.
 * Fixtures with known values live in tests/fixtures. */
#ifdef CLIUTIL_REPORTS

#include <libgen.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tally.h"

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

/* ---- child workloads ------------------------------------------------------- */

static inline void *must(size_t size, int device)
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
static inline int child_train(void)
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
static inline int child_rank(void)
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

/* A rank whose number is not its home device (RANK 5, LOCAL_RANK 1) that
 * staged 64 MiB on device 0 and freed it: foreign memory held, freed since. */
static inline int child_rank_freed(void)
{
    tally_stage_begin("load");
    tally_tag_push("staging");
    tally_free(must(64 * MiB, 0));
    tally_tag_pop();
    tally_stage_end("load");
    tally_tag_push("weights");
    (void)must(16 * MiB, 1);
    tally_tag_pop();
    return 0;
}

/* ---- harness ------------------------------------------------------------- */

static char dir[PATH_MAX];     /* scratch directory of this run */
static char tally[PATH_MAX];   /* the binary under test */
static char fixtures[PATH_MAX];

/* Run "tally ARGS" (ARGS formatted, passed through the shell). */
__attribute__((format(printf, 1, 2))) static inline run_t tally_run(const char *fmt, ...)
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
static inline int spawn_child(const char *mode, const char *const *env)
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

static inline int teardown(void **state);

/* A failed setup leaves no scratch directory behind (cmocka skips the
 * teardown then). */
static inline int setup_failed(void)
{
    if (dir[0])
        teardown(NULL);
    return -1;
}

static inline int setup(void **state)
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
        fprintf(stderr, "%s is missing (make builds it)\n", tally);
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

static inline int teardown(void **state)
{
    char cmd[PATH_MAX + 16];
    (void)state;
    if (!getenv("TALLY_TEST_KEEP")) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        return system(cmd) == 0 ? 0 : -1;
    }
    fprintf(stderr, "tally command tests: kept %s\n", dir);
    return 0;
}

static inline void expect_text(const char *got, const char *want)
{
    if (strcmp(got, want) != 0)
        fail_msg("output differs.\n--- got:\n%s\n--- expected:\n%s", got, want);
}

/* A test_cli_* binary's main: "--child MODE" runs a workload, else the
 * tests run after setup (the reports of those workloads). */
static inline int cli_main(int argc, char **argv, const char *name, const struct CMUnitTest *tests, size_t n)
{
    if (argc == 3 && strcmp(argv[1], "--child") == 0) {
        if (strcmp(argv[2], "train") == 0)
            return child_train();
        if (strcmp(argv[2], "rank") == 0)
            return child_rank();
        if (strcmp(argv[2], "rank_freed") == 0)
            return child_rank_freed();
        return 2;
    }
    return _cmocka_run_group_tests(name, tests, n, setup, teardown);
}
#define CLI_MAIN(name, tests) cli_main(argc, argv, name, tests, sizeof(tests) / sizeof((tests)[0]))

#endif /* CLIUTIL_REPORTS */

#endif
