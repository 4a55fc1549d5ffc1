/* What the tests of tally tune share (test_tune_*.c): the built command
 * beside the test binary, a scratch folder and the fixtures, running `tally
 * tune -q`, writing a trace or a snapshot pickle, reading the JSON rows (and
 * checking what holds for every row), a one-line error, and the three-block
 * trace worked by hand. Include after cmocka.h, cliutil.h and report/json.h. */
#ifndef TALLY_TESTS_TUNEUTIL_H
#define TALLY_TESTS_TUNEUTIL_H

#include <libgen.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MiB ((uint64_t)1 << 20)

static char tally_bin[PATH_MAX], scratch[PATH_MAX], fixtures[PATH_MAX];

/* The setup: tally_bin is ../bin/tally beside this binary (bin_dir gets its
 * folder, .../build/tests; PATH_MAX - 64 bytes hold it), fixtures the
 * repository's tests/fixtures/tune, and scratch a new folder made from tmpl (a
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
    snprintf(fixtures, sizeof fixtures, "%s/../../tests/fixtures/tune", dir);
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

/* An error: the given status, nothing on stdout, exactly one line on stderr
 * containing want. */
static inline void expect_one_line_error(run_t r, int rc, const char *want)
{
    if (r.rc != rc || r.out[0] || !strstr(r.err, want) || strchr(r.err, '\n') != r.err + strlen(r.err) - 1)
        fail_msg("status %d (want %d), stdout '%s', stderr '%s' (want one line with '%s')", r.rc, rc, r.out, r.err,
                 want);
    run_free(&r);
}

/* Run --json on path; check the rows' invariants; return the parsed array. */
static inline tally_json_t *tune_json(const char *path, const char *extra)
{
    run_t r = tune("--json %s '%s'", extra, path);
    if (r.rc != 0)
        fail_msg("tally tune --json %s: status %d: %s", path, r.rc, r.err);
    tally_json_t *rows = tally__json_parse(r.out, strlen(r.out), NULL, 0, NULL);
    assert_non_null(rows);
    assert_int_equal(rows->type, TALLY_JSON_ARRAY);
    assert_true(rows->len >= 10);
    const tally_json_t *def = &rows->items[0];
    assert_string_equal(tally__json_get(def, "setting")->s, "");
    assert_string_equal(tally__json_get(def, "why")->s, "PyTorch's default");
    assert_string_equal(tally__json_get(def, "line")->s, "PYTORCH_CUDA_ALLOC_CONF=");
    int recommended = 0, recommended_tally = 0;
    for (size_t i = 0; i < rows->len; i++) {
        const tally_json_t *row = &rows->items[i];
        assert_int_equal(jint(row, "peak_live_bytes"), jint(def, "peak_live_bytes"));
        assert_true(jint(row, "peak_reserved_bytes") >= jint(row, "peak_live_bytes") || !jtrue(row, "fits"));
        assert_true(jint(row, "backend_calls") >= 1);
        /* What stays after an empty_cache holds at least the bytes live then. */
        const tally_json_t *kept = tally__json_get(row, "empty_cache_kept_ratio");
        if (kept && kept->type != TALLY_JSON_NULL) {
            int64_t kb = jint(row, "empty_cache_kept_bytes"), lb = jint(row, "empty_cache_live_bytes");
            if (lb <= 0 || kb < lb || kept->d < 1.0 || kept->d > (double)kb / (double)lb + 1e-4 ||
                kept->d < (double)kb / (double)lb - 1e-4)
                fail_msg("row %zu (%s): kept %lld bytes over %lld live, ratio %g", i,
                         tally__json_get(row, "setting")->s, (long long)kb, (long long)lb, kept->d);
        } else if (!kept && jtrue(row, "fits")) {
            fail_msg("row %zu (%s) fits but has no empty_cache_kept_ratio", i, tally__json_get(row, "setting")->s);
        }
        const char *alloc = tally__json_get(row, "allocator")->s;
        if (strcmp(alloc, "PyTorch/tally") && strcmp(alloc, "tally") && strcmp(alloc, "PyTorch (model)"))
            fail_msg("row %zu: allocator '%s'", i, alloc);
        /* A row tally runs gives its TALLY_CONF line; the model's rows have none. */
        const tally_json_t *tline = tally__json_get(row, "tally_line");
        if (!strcmp(alloc, "PyTorch (model)")) {
            if (tline)
                fail_msg("row %zu (%s, the model) has a tally_line", i, tally__json_get(row, "setting")->s);
        } else {
            char want[256];
            snprintf(want, sizeof want, "TALLY_CONF=%s", tally__json_get(row, "setting")->s);
            if (!tline || tline->type != TALLY_JSON_STRING || strcmp(tline->s, want))
                fail_msg("row %zu (%s): tally_line %s, want %s", i, alloc, tline ? tline->s : "missing", want);
        }
        if (jtrue(row, "recommended_tally")) {
            recommended_tally++;
            assert_string_not_equal(alloc, "PyTorch (model)"); /* tally's recommendation runs under tally */
            assert_true(jtrue(row, "fits"));
        }
        if (jtrue(row, "recommended")) {
            recommended++;
            assert_string_not_equal(alloc, "tally"); /* PyTorch's recommendation keeps PyTorch's rules */
            assert_true(jtrue(row, "fits"));
            /* Never more than the default, and the least among the fitting rows within the budget it had. */
            assert_true(jint(row, "peak_reserved_bytes") <= jint(def, "peak_reserved_bytes"));
        }
    }
    assert_int_equal(recommended, 1);
    assert_int_equal(recommended_tally, 1);
    run_free(&r);
    return rows;
}

/* three.csv (three_csv writes it to scratch): 30 MiB, 1000 B and 5 MiB,
 * all live to the end (worked by hand):
 * - PyTorch's default placement: a 30 MiB segment, a 2 MiB small one, and
 *   20 MiB for the 5 MiB block (under 10 MiB): 52 MiB in 3 calls;
 *   large_segment_size_mb:4 gives the 5 MiB block 6 MiB (its size rounded
 *   to 2 MiB): 38 MiB; :10 gives it 10 MiB: 42 MiB.
 * - PyTorch's expandable segments (the model): 20 MiB large pages, so 30 MiB
 *   maps 2 pages and the 5 MiB block fits in the second one's rest: 40 MiB
 *   + one 2 MiB small page = 42 MiB in 3 page maps; with
 *   large_segment_size_mb:2, 15 + 3 + 1 pages = 38 MiB in 19 calls; with
 *   :10, 3 + 1 + 1 pages = 42 MiB in 5 calls.
 * PyTorch's recommendation: 38 MiB, and of the two, the fewer calls:
 * large_segment_size_mb:4. */
static const char three_blocks[] = "op,id,size,stream\na,1,31457280,0\na,2,1000,0\na,3,5242880,0\n";

static inline void three_csv(char *path, size_t len)
{
    snprintf(path, len, "%s/three.csv", scratch);
    write_text(path, three_blocks);
}

/* TALLY_TEST_FILTER=PATTERN runs only the tests whose names match it
 * (cmocka's pattern), for checking one test against a mutation. */
static inline void tune_test_filter(void)
{
    if (getenv("TALLY_TEST_FILTER"))
        cmocka_set_test_filter(getenv("TALLY_TEST_FILTER"));
}

#endif
