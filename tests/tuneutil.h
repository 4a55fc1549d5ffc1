/* What the tests of tally tune share (test_tune.c, test_tune_replay.c,
 * test_tune_plot_ticks.c): the built command beside the test binary, a
 * scratch folder, running `tally tune -q`, writing a trace or a snapshot
 * pickle, and reading the JSON rows. Include after cmocka.h, cliutil.h and report/json.h. */
#ifndef TALLY_TESTS_TUNEUTIL_H
#define TALLY_TESTS_TUNEUTIL_H

#include <libgen.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tally_bin[PATH_MAX], scratch[PATH_MAX];

/* The setup: tally_bin is ../bin/tally beside this binary (bin_dir gets its
 * folder, .../build/tests; PATH_MAX - 64 bytes hold it) and scratch a new folder made from tmpl (a
 * mkdtemp template). -1, saying why, when the command is missing. */
static inline int tune_setup(const char *name, const char *tmpl, char *bin_dir, size_t len)
{
    char exe[PATH_MAX - 64]; /* room for what is appended to its folder */
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return -1;
    exe[n] = 0;
    const char *dir = dirname(exe);
    snprintf(bin_dir, len, "%s", dir);
    snprintf(tally_bin, sizeof tally_bin, "%s/../bin/tally", dir);
    if (access(tally_bin, X_OK) != 0) {
        fprintf(stderr, "%s: %s is missing (make builds it)\n", name, tally_bin);
        return -1;
    }
    snprintf(scratch, sizeof scratch, "%s", tmpl);
    return mkdtemp(scratch) ? 0 : -1;
}

/* Write a PyTorch snapshot pickle to path with python3: body is Python that
 * sets d, the snapshot's dict, with M (1 MiB) and S (1 GiB, an address) at
 * hand; no single quote in it (the program is quoted for the shell). 0, or
 * -1 when python3 is missing or the program fails (the caller skips). */
static inline int tune_write_pickle(const char *path, const char *body)
{
    size_t len = strlen(body) + strlen(path) + 256;
    char *cmd = malloc(len);
    if (!cmd)
        return -1;
    snprintf(cmd, len,
             "python3 -c 'import pickle, sys\nM, S = 1 << 20, 1 << 30\n%s\n"
             "pickle.dump(d, open(sys.argv[1], \"wb\"), protocol=2)' '%s' 2>/dev/null",
             body, path);
    int rc = system(cmd) == 0 ? 0 : -1;
    free(cmd);
    return rc;
}

static inline int tune_teardown(void **state)
{
    (void)state;
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", scratch);
    return system(cmd) == 0 ? 0 : -1;
}

/* Run "tally tune -q ARGS" (ARGS formatted, through the shell). */
__attribute__((format(printf, 1, 2))) static inline run_t tune(const char *fmt, ...)
{
    char args[2048] = "tune -q ";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args + strlen(args), sizeof args - strlen(args), fmt, ap);
    va_end(ap);
    return run_tool(tally_bin, scratch, args);
}

static inline void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

static inline int64_t jint(const tally_json_t *o, const char *key)
{
    int64_t v = -1;
    if (tally__json_int(tally__json_get(o, key), &v))
        fail_msg("no integer '%s'", key);
    return v;
}

static inline double jnum(const tally_json_t *o, const char *key)
{
    const tally_json_t *v = tally__json_get(o, key);
    if (!v || v->type != TALLY_JSON_NUMBER)
        fail_msg("no number '%s'", key);
    return v->d;
}

static inline bool jtrue(const tally_json_t *o, const char *key)
{
    const tally_json_t *v = tally__json_get(o, key);
    return v && v->type == TALLY_JSON_TRUE;
}

/* The row of setting under allocator; the test fails when there is none. */
static inline const tally_json_t *row_of(const tally_json_t *rows, const char *setting, const char *allocator)
{
    for (size_t k = 0; k < rows->len; k++)
        if (strcmp(tally__json_get(&rows->items[k], "setting")->s, setting) == 0 &&
            strcmp(tally__json_get(&rows->items[k], "allocator")->s, allocator) == 0)
            return &rows->items[k];
    fail_msg("no row '%s' (%s)", setting, allocator);
    return NULL;
}

#endif
