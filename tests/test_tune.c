/* Tests for tally tune: the pickle reader and the snapshot rules (compiled
 * in from tools/, on fixtures whose expected values are worked out by hand
 * in the comments), and the command itself run as a user runs it (the
 * built ../bin/tally): CSV, snapshot and report inputs, the JSON rows, the
 * recommendation, and one-line errors for bad input. With ../shared/traces
 * beside the repository, every shared snapshot is also checked against the
 * CSV converted from it and against reference.json. */
/* The readers under test first: cmocka.h defines a macro named fail. */
#include "../tools/pickle.c"
/* tune_input.c's callocs can be made to fail: the one numbered input_fail_at
 * (0: the first; -1: none) returns NULL, as when the host is out of memory;
 * input_callocs counts them. */
#include <stdlib.h>
static long input_fail_at = -1, input_callocs;
static void *input_calloc(size_t n, size_t size)
{
    if (input_callocs++ == input_fail_at)
        return NULL;
    return calloc(n, size);
}
#define calloc input_calloc
#include "../tools/tune_input.c"
#undef calloc
#include "../bench/trace.c"
/* pt_expand.c has static helpers of the same names as pickle.c's. */
#define grow ptx_test_grow
#include "../tools/pt_expand.c"
#undef grow
/* tune_run.c: the grid and the worker processes (its cmp_u64 is pt_expand.c's). */
#define cmp_u64 tune_run_cmp_u64
#include "../tools/tune_run.c"
#undef cmp_u64
#define rows si_cost_rows /* cost.c's table; the tests name their rows "rows" */
#include "../tests/standin/cost.c"
#undef rows

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "skip.h"

#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <sys/time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cliutil.h"
#include "report/json.h"
#include "tuneutil.h"

#define MiB ((uint64_t)1 << 20)

static char fixtures[PATH_MAX], shared[PATH_MAX];

/* ---- running the command ------------------------------------------------------- */


/* An error: the given status, nothing on stdout, exactly one line on stderr
 * containing want. */
static void expect_one_line_error(run_t r, int rc, const char *want)
{
    if (r.rc != rc || r.out[0] || !strstr(r.err, want) || strchr(r.err, '\n') != r.err + strlen(r.err) - 1)
        fail_msg("status %d (want %d), stdout '%s', stderr '%s' (want one line with '%s')", r.rc, rc, r.out, r.err,
                 want);
    run_free(&r);
}



/* Run --json on path; check the rows' invariants; return the parsed array. */
static tally_json_t *tune_json(const char *path, const char *extra)
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

/* ---- the pickle reader -------------------------------------------------------- */

/* Parse a pickle held in a constant (pk_parse takes over a copy; pk_free frees it). */
static void parse_inline(const unsigned char *src, size_t len, pk_doc_t *doc)
{
    unsigned char *data = malloc(len);
    memcpy(data, src, len);
    char err[256];
    if (pk_parse(data, len, doc, "inline", err, sizeof err))
        fail_msg("%s", err);
}

/* Sizes in tune's table are bytes below 100 KiB, KiB from there: a row that
 * runs out with less memory names the event's size (a 30 MB block, then a
 * small one that needs a segment of its own). */
static void test_table_sizes_below_100_kib_are_bytes(void **state)
{
    (void)state;
    static const struct {
        const char *size, *text;
    } cases[] = {{"101376", "101376 B"}, {"102399", "102399 B"}, {"102400", "100.0 KiB"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[PATH_MAX + 32], want[128];
        snprintf(path, sizeof path, "%s/small_event_%zu.csv", scratch, i);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fprintf(f, "op,id,size,stream\na,1,30000000,0\na,2,%s,0\nf,1,0,0\nf,2,0,0\n", cases[i].size);
        assert_int_equal(fclose(f), 0);
        run_t r = tune("'%s'", path);
        snprintf(want, sizeof want, "in 30.0 MiB at 1: %s, 28.6 MiB", cases[i].text);
        if (r.rc != 0 || !strstr(r.out, want))
            fail_msg("%s bytes: status %d, expected '%s' in:\n%s%s", cases[i].size, r.rc, want, r.out, r.err);
        run_free(&r);
    }
}

static void test_pickle_plain_data(void **state)
{
    (void)state;
    /* {'a': [1, -2, 300, 2**40], 'b': ('x', None, True), 'c': 0.5}, written by
     * hand with protocol-2 opcodes; the list is memoised and fetched again. */
    static const unsigned char src[] = {
        0x80, 0x02, '}', '(', 0x8c, 1, 'a', ']', 'q', 0, '(', 'K', 1, 'J', 0xfe, 0xff, 0xff, 0xff, 'M', 0x2c, 0x01,
        0x8a, 6, 0, 0, 0, 0, 0, 1, 'e', 0x8c, 1, 'b', 0x8c, 1, 'x', 'N', 0x88, 0x87, 0x8c, 1, 'c', 'G', 0x3f, 0xe0,
        0, 0, 0, 0, 0, 0, 0x8c, 1, 'd', 'h', 0, 'u', '.'};
    pk_doc_t doc;
    parse_inline(src, sizeof src, &doc);
    const pk_value_t *a = pk_get(doc.root, "a");
    assert_non_null(a);
    assert_int_equal(a->type, PK_LIST);
    assert_int_equal(a->n, 4);
    assert_int_equal(a->items[0]->i, 1);
    assert_int_equal(a->items[1]->i, -2);
    assert_int_equal(a->items[2]->i, 300);
    assert_int_equal(a->items[3]->i, (int64_t)1 << 40);
    const pk_value_t *b = pk_get(doc.root, "b");
    assert_int_equal(b->type, PK_TUPLE);
    assert_int_equal(b->n, 3);
    assert_true(pk_str_is(b->items[0], "x"));
    assert_int_equal(b->items[1]->type, PK_NONE);
    assert_int_equal(b->items[2]->type, PK_BOOL);
    assert_true(pk_get(doc.root, "c")->f == 0.5);
    assert_ptr_equal(pk_get(doc.root, "d"), a); /* the memo gives the same list */
    assert_null(pk_get(doc.root, "e"));
    pk_free(&doc);
}

static void expect_pickle_error(const unsigned char *src, size_t len, const char *want)
{
    unsigned char *data = malloc(len ? len : 1);
    memcpy(data, src, len);
    pk_doc_t doc;
    char err[512];
    if (pk_parse(data, len, &doc, "bad.pickle", err, sizeof err) == 0)
        fail_msg("parsed; expected an error with '%s'", want);
    if (!strstr(err, want) || !strstr(err, "bad.pickle") || strchr(err, '\n'))
        fail_msg("error '%s' lacks '%s'", err, want);
}

/* DICT ('d'): a dict from the items above the mark, in key, value pairs
 * (older protocols and hand-written pickles use it); an odd number of items
 * is refused. */
static void test_pickle_dict_from_marked_items(void **state)
{
    (void)state;
    static const unsigned char src[] = {0x80, 0x02, '(', 0x8c, 1, 'a', 'K', 1, 0x8c, 1, 'b', 'K', 2, 'd', '.'};
    pk_doc_t doc;
    parse_inline(src, sizeof src, &doc);
    assert_int_equal(doc.root->type, PK_DICT);
    assert_int_equal(pk_get(doc.root, "a")->i, 1);
    assert_int_equal(pk_get(doc.root, "b")->i, 2);
    pk_free(&doc);
    static const unsigned char empty[] = {0x80, 0x02, '(', 'd', '.'}; /* {} */
    parse_inline(empty, sizeof empty, &doc);
    assert_int_equal(doc.root->type, PK_DICT);
    pk_free(&doc);
    static const unsigned char odd[] = {0x80, 0x02, '(', 0x8c, 1, 'a', 'd', '.'};
    expect_pickle_error(odd, sizeof odd, "odd number of items");
}

/* The stack opcodes, as pickle's own machine runs them (Lib/pickle.py):
 * POP, POP_MARK, DUP, TUPLE1..3, APPEND(S) and SETITEM(S) onto an existing
 * container, LONG1's sign, and the error each misuse gives. */
static void test_pickle_stack_opcodes(void **state)
{
    (void)state;
    pk_doc_t doc;
    static const unsigned char pop[] = {0x80, 0x02, 'K', 1, 'K', 2, '0', '.'}; /* 1 */
    parse_inline(pop, sizeof pop, &doc);
    assert_int_equal(doc.root->type, PK_INT);
    assert_int_equal(doc.root->i, 1);
    pk_free(&doc);
    static const unsigned char pop_mark[] = {0x80, 0x02, 'K', 5, '(', 'K', 1, 'K', 2, '1', '.'}; /* 5 */
    parse_inline(pop_mark, sizeof pop_mark, &doc);
    assert_int_equal(doc.root->i, 5);
    pk_free(&doc);
    static const unsigned char dup[] = {0x80, 0x02, 'K', 7, '2', 0x86, '.'}; /* (7, 7) */
    parse_inline(dup, sizeof dup, &doc);
    assert_int_equal(doc.root->type, PK_TUPLE);
    assert_int_equal(doc.root->n, 2);
    assert_int_equal(doc.root->items[0]->i, 7);
    assert_int_equal(doc.root->items[1]->i, 7);
    pk_free(&doc);
    static const unsigned char t3[] = {0x80, 0x02, 'K', 9, 0x85, 'K', 1, 'K', 2, 'K', 3, 0x87, 0x86, '.'};
    parse_inline(t3, sizeof t3, &doc); /* ((9,), (1, 2, 3)) */
    assert_int_equal(doc.root->n, 2);
    assert_int_equal(doc.root->items[0]->n, 1);
    assert_int_equal(doc.root->items[0]->items[0]->i, 9);
    assert_int_equal(doc.root->items[1]->n, 3);
    for (int k = 0; k < 3; k++)
        assert_int_equal(doc.root->items[1]->items[k]->i, k + 1);
    pk_free(&doc);
    static const unsigned char list[] = {0x80, 0x02, ']', 'K', 1, 'a', '(', 'K', 2, 'K', 3, 'e', '.'};
    parse_inline(list, sizeof list, &doc); /* [1, 2, 3] */
    assert_int_equal(doc.root->type, PK_LIST);
    assert_int_equal(doc.root->n, 3);
    for (int k = 0; k < 3; k++)
        assert_int_equal(doc.root->items[k]->i, k + 1);
    pk_free(&doc);
    static const unsigned char dict[] = {0x80, 0x02, '}', 0x8c, 1, 'a', 'K', 1, 's', '(', 0x8c, 1, 'b', 'K', 2,
                                         0x8c, 1, 'c', 'K', 3, 'u', '.'};
    parse_inline(dict, sizeof dict, &doc); /* {'a': 1, 'b': 2, 'c': 3} */
    assert_int_equal(doc.root->type, PK_DICT);
    assert_int_equal(doc.root->n, 3);
    assert_int_equal(pk_get(doc.root, "a")->i, 1);
    assert_int_equal(pk_get(doc.root, "b")->i, 2);
    assert_int_equal(pk_get(doc.root, "c")->i, 3);
    pk_free(&doc);
    static const unsigned char longs[] = {0x80, 0x02, 0x8a, 1, 0xff, 0x8a, 2, 0x00, 0x80, 0x8a, 2, 0xff, 0x7f, 0x87, '.'};
    parse_inline(longs, sizeof longs, &doc); /* (-1, -32768, 32767) */
    assert_int_equal(doc.root->items[0]->i, -1);
    assert_int_equal(doc.root->items[1]->i, -32768);
    assert_int_equal(doc.root->items[2]->i, 32767);
    pk_free(&doc);
    static const unsigned char e1[] = {0x80, 0x02, '0', '.'};
    expect_pickle_error(e1, sizeof e1, "POP on an empty stack");
    static const unsigned char e2[] = {0x80, 0x02, '2', '.'};
    expect_pickle_error(e2, sizeof e2, "DUP on an empty stack");
    static const unsigned char e3[] = {0x80, 0x02, ']', 'a', '.'};
    expect_pickle_error(e3, sizeof e3, "APPEND with 1 items on the stack");
    static const unsigned char e4[] = {0x80, 0x02, '}', 'K', 1, 's', '.'};
    expect_pickle_error(e4, sizeof e4, "SETITEM with 2 items on the stack");
    static const unsigned char e5[] = {0x80, 0x02, 'K', 1, 0x86, '.'};
    expect_pickle_error(e5, sizeof e5, "TUPLE2 with 1 items on the stack");
    static const unsigned char e6[] = {0x80, 0x02, '}', '(', 'K', 1, 'e', '.'};
    expect_pickle_error(e6, sizeof e6, "APPENDS on a dict");
    static const unsigned char e7[] = {0x80, 0x02, '(', 'K', 1, 'u', '.'};
    expect_pickle_error(e7, sizeof e7, "SETITEMS with nothing to add to");
    static const unsigned char e8[] = {0x80, 0x02, 'K', 1, 't', '.'};
    expect_pickle_error(e8, sizeof e8, "without a MARK");
    static const unsigned char e9[] = {0x80, 0x02, 0x94, '.'};
    expect_pickle_error(e9, sizeof e9, "memo store with an empty stack");
    static const unsigned char e10[] = {0x80, 0x02, 0x8a, 5, 1, '.'};
    expect_pickle_error(e10, sizeof e10, "truncated LONG1");
    static const unsigned char e11[] = {0x80};
    expect_pickle_error(e11, sizeof e11, "truncated PROTO");
    static const unsigned char e12[] = {0x80, 0x02, 'G', 0, 0};
    expect_pickle_error(e12, sizeof e12, "truncated BINFLOAT");
    static const unsigned char e13[] = {0x80, 0x02, 'X', 1};
    expect_pickle_error(e13, sizeof e13, "truncated string length");
    static const unsigned char e14[] = {0x80, 0x02, ']', '(', 'K', 1, 'u', '.'};
    expect_pickle_error(e14, sizeof e14, "SETITEMS on a list");
}

/* The model of PyTorch's expandable segments counts pages as PyTorch's
 * num_device_alloc / num_device_free do: 20 MiB pages in the large pool,
 * mapped as a request needs them, unmapped (whole pages inside free blocks)
 * only by empty_cache. Worked by hand: A = 30 MiB maps pages 0-1 (one run);
 * B = 30 MiB takes the 10 MiB left in page 1 and maps page 2; after A is
 * freed, empty_cache unmaps page 0 (the only whole page in A's 0-30 MiB);
 * after B is freed, pages 1-2. */
static void test_pytorch_expandable_model_counts_pages(void **state)
{
    (void)state;
    trace_builder_t b;
    trace_t t;
    char err[256];
    assert_int_equal(trace_begin(&b, &t, "hand", err, sizeof err), 0);
    assert_int_equal(trace_add(&b, 'a', 1, 30u << 20, 0, err, sizeof err), 0);
    assert_int_equal(trace_add(&b, 'a', 2, 30u << 20, 0, err, sizeof err), 0);
    assert_int_equal(trace_add(&b, 'f', 1, 0, 0, err, sizeof err), 0);
    assert_int_equal(trace_add(&b, 'e', 0, 0, 0, err, sizeof err), 0);
    assert_int_equal(trace_add(&b, 'f', 2, 0, 0, err, sizeof err), 0);
    assert_int_equal(trace_add(&b, 'e', 0, 0, 0, err, sizeof err), 0);
    trace_end(&b);
    ptx_opts_t o = {.capacity = 80ull << 30};
    ptx_result_t r;
    int64_t reserved[6];
    assert_int_equal(ptx_replay(&t, &o, NULL, &r, reserved, err, sizeof err), 0);
    assert_int_equal(r.pages_mapped, 3);
    assert_int_equal(r.map_calls, 2);
    assert_int_equal(r.pages_unmapped, 3);
    assert_int_equal(r.unmap_calls, 2);
    assert_int_equal(r.segments, 1);
    assert_int_equal(r.peak_reserved, 60 << 20);
    assert_int_equal(r.oom_event, -1);
    static const int64_t want[6] = {40, 60, 60, 40, 40, 0};
    for (int i = 0; i < 6; i++)
        if (reserved[i] != want[i] << 20)
            fail_msg("after event %d: %lld MiB mapped, expected %lld", i, (long long)(reserved[i] >> 20),
                     (long long)want[i]);
    trace_free(&t);
}

/* Replays survive signals: a program that runs tune's replays under a
 * profiler's timer (SIGALRM here, with a handler and no SA_RESTART, every
 * 100 us) sees wait() interrupted over and over; each interruption is
 * waited out, and every row runs as without the timer. */
static volatile sig_atomic_t alarms;
static void count_alarm(int sig)
{
    (void)sig;
    alarms++;
}

/* A churning trace of n allocations of 64 KiB to about 6 MiB, each freed
 * eight allocations later (the last eight kept). */
static void churn_trace(trace_t *t, const char *name, int n)
{
    trace_builder_t b;
    char err[256];
    assert_int_equal(trace_begin(&b, t, name, err, sizeof err), 0);
    for (int k = 0; k < n; k++) {
        assert_int_equal(trace_add(&b, 'a', (uint64_t)(2 * k + 1), (uint64_t)(1 + k % 97) << 16, 0, err, sizeof err), 0);
        if (k > 8)
            assert_int_equal(trace_add(&b, 'f', (uint64_t)(2 * (k - 8) + 1), 0, 0, err, sizeof err), 0);
    }
    trace_end(&b);
}

static void test_replays_wait_out_interrupting_signals(void **state)
{
    (void)state;
    trace_t t;
    char err[256];
    churn_trace(&t, "signals", 600);
    tune_row_t rows[64];
    size_t n = tune_grid(&t, 80ull << 30, rows, 64);
    assert_true(n >= 8);
    n = 8; /* enough workers started and waited for */
    struct sigaction sa = {0}, old;
    sa.sa_handler = count_alarm; /* no SA_RESTART: wait() returns EINTR */
    assert_int_equal(sigaction(SIGALRM, &sa, &old), 0);
    struct itimerval every = {{0, 100}, {0, 100}}, off = {{0, 0}, {0, 0}};
    assert_int_equal(setitimer(ITIMER_REAL, &every, NULL), 0);
    int rc = tune_run(&t, 80ull << 30, rows, n, 2, true, NULL, 0, NULL, err, sizeof err);
    setitimer(ITIMER_REAL, &off, NULL);
    sigaction(SIGALRM, &old, NULL);
    if (rc != 0)
        fail_msg("tune_run under a 100 us timer: %s (%d alarms)", err, (int)alarms);
    assert_true(alarms > 0);
    for (size_t i = 0; i < n; i++)
        if (!rows[i].ok || rows[i].peak_reserved <= 0)
            fail_msg("row %zu (%s) did not run: %s", i, rows[i].setting, rows[i].error);
    /* The replay's own process is waited for the same way: a worker that
     * takes a signal while it waits (the timer above stays in this process,
     * so replay_fresh is called here) reads the row only once the replay has
     * ended, with the figures the run without the timer gave. */
    tune_row_t again[8];
    alarms = 0;
    assert_int_equal(sigaction(SIGALRM, &sa, &old), 0);
    assert_int_equal(setitimer(ITIMER_REAL, &every, NULL), 0);
    for (size_t i = 0; i < n; i++) {
        again[i] = rows[i];
        again[i].ok = false;
        again[i].peak_reserved = 0;
        replay_fresh(&t, NULL, 80ull << 30, &again[i], NULL);
    }
    setitimer(ITIMER_REAL, &off, NULL);
    sigaction(SIGALRM, &old, NULL);
    assert_true(alarms > 0);
    for (size_t i = 0; i < n; i++)
        if (!again[i].ok || again[i].peak_reserved != rows[i].peak_reserved)
            fail_msg("row %zu (%s) replayed under the timer: ok %d, peak %lld, want %lld: %s", i, rows[i].setting,
                     (int)again[i].ok, (long long)again[i].peak_reserved, (long long)rows[i].peak_reserved,
                     again[i].error);
    trace_free(&t);
}

/* The series tune_run hands back for a wanted row is that row's replay:
 * its highest point is the row's own peak reserved, also where other rows
 * of the run peak elsewhere. */
static void test_series_is_the_wanted_rows_own(void **state)
{
    (void)state;
    trace_t t;
    char err[256];
    churn_trace(&t, "series", 300);
    tune_row_t rows[64];
    size_t n = tune_grid(&t, 80ull << 30, rows, 64);
    assert_true(n >= 2);
    assert_int_equal(tune_run(&t, 80ull << 30, rows, n, 2, true, NULL, 0, NULL, err, sizeof err), 0);
    /* A row whose peak no other row shares. */
    size_t pick = n;
    for (size_t i = 0; i < n && pick == n; i++) {
        size_t same = 0;
        for (size_t j = 0; j < n; j++)
            same += rows[j].peak_reserved == rows[i].peak_reserved;
        if (same == 1)
            pick = i;
    }
    if (pick == n)
        fail_msg("no row of %zu peaks alone: the trace cannot tell their series apart", n);
    size_t want[1] = {pick};
    tune_series_t series[1];
    memset(series, 0, sizeof series);
    assert_int_equal(tune_run(&t, 80ull << 30, rows, n, 2, true, want, 1, series, err, sizeof err), 0);
    assert_int_equal(series[0].n, t.nev);
    assert_non_null(series[0].reserved);
    int64_t top = 0;
    for (size_t e = 0; e < series[0].n; e++)
        if (series[0].reserved[e] > top)
            top = series[0].reserved[e];
    if (top != rows[pick].peak_reserved)
        fail_msg("row %zu (%s) peaks at %lld, its series at %lld", pick, rows[pick].setting,
                 (long long)rows[pick].peak_reserved, (long long)top);
    free(series[0].reserved);
    trace_free(&t);
}

/* tune_run's shared table cannot be had (its size past the address
 * space: series of 2^44 rows asked): -1, as tune.h says, and err says
 * which mapping failed; no row is run. */
static void test_run_without_its_shared_table_returns_minus_one(void **state)
{
    (void)state;
    trace_builder_t b;
    trace_t t;
    char err[256] = "";
    assert_int_equal(trace_begin(&b, &t, "no-table", err, sizeof err), 0);
    assert_int_equal(trace_add(&b, 'a', 1, 1 << 20, 0, err, sizeof err), 0);
    assert_int_equal(trace_add(&b, 'f', 1, 0, 0, err, sizeof err), 0);
    trace_end(&b);
    tune_row_t row;
    memset(&row, 0, sizeof row);
    size_t want[1] = {0};
    tune_series_t series[1];
    memset(series, 0, sizeof series);
    int rc = tune_run(&t, 80ull << 30, &row, 1, 1, true, want, (size_t)1 << 44, series, err, sizeof err);
    assert_int_equal(rc, -1);
    if (strncmp(err, "mmap of ", 8) != 0)
        fail_msg("err is \"%s\", not the mapping's failure", err);
    assert_false(row.ok);
    trace_free(&t);
}

/* The recommendation gives the least memory its setting runs in whenever
 * the search found it, also when no replay with less ran out (a 2 MiB
 * small segment is the least: nothing below it is tried, so the table's
 * "runs out" is "-"). */
static void test_recommendation_says_what_it_runs_in_without_a_replay_running_out(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/tiny.csv", scratch);
    write_text(path, "op,id,size,stream\na,1,1000,0\na,2,5000,0\nf,1,1000,0\nf,2,5000,0\n");
    tally_json_t *rows = tune_json(path, "");
    const tally_json_t *def = &rows->items[0];
    assert_int_equal(jint(def, "min_device_bytes"), 2 * MiB);
    assert_null(tally__json_get(def, "runs_out")); /* no replay ran out */
    tally__json_free(rows);
    run_t r = tune("'%s'", path);
    if (r.rc != 0 || !strstr(r.out, "\nPyTorch's allocator: keep the default (no setting within the budget reserves "
                                    "less): 2.0 MiB, 1 backend call (default 1), ") ||
        !strstr(r.out, " of driver time on A100; runs in 2.0 MiB\n  PYTORCH_ALLOC_CONF=\n"))
        fail_msg("status %d, table:\n%s", r.rc, r.out);
    run_free(&r);
}

/* The grid's max_split_size_mb candidates are quantiles of the allocations
 * above 20 MiB (PyTorch's least allowed value): blocks of exactly 20 MiB do
 * not count. Ten of 20 MiB and one of 100 MiB give one candidate, 100 (the
 * ten counted would put every quantile on 20 MiB: 21); one of
 * 20 MiB + 512 B and one of 100 MiB give 21 (the value above 20 MiB, rounded
 * up to whole MiB). */
static void expect_split_candidates(int n20, bool just_above, const char *want)
{
    trace_builder_t b;
    trace_t t;
    char err[256], got[256] = "";
    assert_int_equal(trace_begin(&b, &t, "split", err, sizeof err), 0);
    uint64_t id = 1;
    for (int i = 0; i < n20; i++)
        assert_int_equal(trace_add(&b, 'a', id++, 20u << 20, 0, err, sizeof err), 0);
    if (just_above)
        assert_int_equal(trace_add(&b, 'a', id++, (20u << 20) + 512, 0, err, sizeof err), 0);
    assert_int_equal(trace_add(&b, 'a', id++, 100u << 20, 0, err, sizeof err), 0);
    trace_end(&b);
    tune_row_t grid[64];
    size_t n = tune_grid(&t, 80ull << 30, grid, 64);
    for (size_t i = 0; i < n; i++)
        if (strncmp(grid[i].setting, "max_split_size_mb:", 18) == 0 && !strchr(grid[i].setting, ','))
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%s", got[0] ? " " : "", grid[i].setting + 18);
    if (strcmp(got, want) != 0)
        fail_msg("%d blocks of 20 MiB%s and one of 100 MiB: candidates '%s', want '%s'", n20,
                 just_above ? ", one of 20 MiB + 512 B" : "", got, want);
    trace_free(&t);
}

static void test_split_candidates_are_quantiles_above_20_mib(void **state)
{
    (void)state;
    expect_split_candidates(10, false, "100");
    expect_split_candidates(0, true, "21"); /* both quantiles fall on the lower: (n - 1) x q < 1 */
}

static void test_pickle_refuses_bad_input(void **state)
{
    (void)state;
    static const unsigned char global[] = {0x80, 0x02, 'c', 'p', 'o', 's', 'i', 'x', '\n', 's', 'y', 's', '\n', '.'};
    expect_pickle_error(global, sizeof global, "GLOBAL would construct an object");
    static const unsigned char reduce[] = {0x80, 0x02, ')', ')', 'R', '.'};
    expect_pickle_error(reduce, sizeof reduce, "REDUCE");
    static const unsigned char truncated[] = {0x80, 0x04, ']', '(', 'K', 1, 'K'};
    expect_pickle_error(truncated, sizeof truncated, "truncated");
    static const unsigned char no_stop[] = {0x80, 0x04, ']'};
    expect_pickle_error(no_stop, sizeof no_stop, "before the STOP opcode");
    static const unsigned char long_str[] = {0x80, 0x04, 'X', 0xff, 0xff, 0, 0, 'a', '.'};
    expect_pickle_error(long_str, sizeof long_str, "runs past the end");
    static const unsigned char bad_memo[] = {0x80, 0x04, 'h', 7, '.'};
    expect_pickle_error(bad_memo, sizeof bad_memo, "memo index 7 was never stored");
    static const unsigned char huge_memo[] = {0x80, 0x04, 'N', 'r', 0xff, 0xff, 0xff, 0x0f, '.'};
    expect_pickle_error(huge_memo, sizeof huge_memo, "memo index 268435455 out of range for a file of 9 bytes");
    static const unsigned char two_left[] = {0x80, 0x04, 'N', 'N', '.'};
    expect_pickle_error(two_left, sizeof two_left, "2 values on the stack");
    static const unsigned char text[] = {'o', 'p', ','};
    expect_pickle_error(text, sizeof text, "no PROTO opcode");
    expect_pickle_error(text, 0, "empty file");
    static const unsigned char huge_int[] = {0x80, 0x04, 0x8a, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, '.'};
    expect_pickle_error(huge_int, sizeof huge_int, "does not fit in 64 bits");
    static const unsigned char unknown[] = {0x80, 0x04, 'N', 0xff, '.'};
    expect_pickle_error(unknown, sizeof unknown, "opcode 0xff is not one plain-data pickles of protocol 2 to 5 use");
}

/* A memo slot below the highest stored one that was itself never stored
 * (BINPUT 2, then BINGET 1) is refused as never stored, like one past the end. */
static void test_pickle_memo_slot_in_a_gap_was_never_stored(void **state)
{
    (void)state;
    static const unsigned char memo_gap[] = {0x80, 0x04, 'N', 'q', 2, '0', 'h', 1, '.'};
    expect_pickle_error(memo_gap, sizeof memo_gap, "memo index 1 was never stored");
    static const unsigned char stored[] = {0x80, 0x04, 'N', 'q', 2, '0', 'h', 2, '.'};
    pk_doc_t doc;
    parse_inline(stored, sizeof stored, &doc);
    assert_int_equal(doc.root->type, PK_NONE);
    pk_free(&doc);
}

/* ---- the snapshot rules ---------------------------------------------------------- */

/* tests/fixtures/tune/small.pickle (made with Python's pickle from a dict):
 *   segments: A at 16 MiB, 20 MiB, block A (4 MiB, requested 4000000) active,
 *             never allocated in the window: live before recording;
 *             B at 64 MiB, 2 MiB, block B (requested 1000) active, allocated in the window
 *   trace: free_requested A+4MiB size 3000000   (allocated before recording)
 *          free_completed (ignored), segment_alloc 2 MiB, alloc B 1000, alloc B+1024 500,
 *          free_requested B+1024, segment_free 2 MiB
 * Events: a 3000000, a 4000000 (the two live before recording, first), then
 * f 3000000, a 1000, a 500, f 500, and e (the segment_free: a release). Reserved at the start: 22 MiB at dump less
 * 2 MiB allocated plus 2 MiB freed in the window = 22 MiB; peak 24 MiB. */
static void test_snapshot_rules(void **state)
{
    (void)state;
    char path[PATH_MAX + 32], err[512];
    snprintf(path, sizeof path, "%s/small.pickle", fixtures);
    tune_input_t in;
    if (tune_input_load(path, -1, &in, err, sizeof err))
        fail_msg("%s", err);
    assert_string_equal(in.kind, "PyTorch snapshot");
    assert_int_equal(in.prelive, 2);
    static const struct {
        char op;
        uint64_t size;
        uint32_t slot;
    } want[] = {{'a', 3000000, 0}, {'a', 4000000, 1}, {'f', 3000000, 0}, {'a', 1000, 2},
                {'a', 500, 3},     {'f', 500, 3},     {'e', 0, UINT32_MAX}};
    assert_int_equal(in.trace.nev, 7);
    for (size_t i = 0; i < 7; i++) {
        assert_int_equal(in.trace.ev[i].op, want[i].op);
        assert_int_equal(in.trace.ev[i].size, want[i].size);
        assert_int_equal(in.trace.ev[i].slot, want[i].slot);
    }
    assert_int_equal(in.releases, 1);
    /* At the start: A's 20 MiB segment and the 2 MiB one the window frees; in A, the block freed in the
     * window (3000000 rounded to 512: 3000320 B at A + 4 MiB) and A's own block (its 4 MiB). */
    assert_true(in.start.known);
    assert_int_equal(in.start.nranges, 2);
    assert_int_equal(in.start.ranges[0].addr, 16 * MiB);
    assert_int_equal(in.start.ranges[0].size, 20 * MiB);
    assert_false(in.start.ranges[0].small);
    assert_int_equal(in.start.ranges[1].addr, 80 * MiB);
    assert_true(in.start.ranges[1].small);
    assert_int_equal(in.start.nlive, 2);
    assert_int_equal(in.start.live[0].addr, 20 * MiB);
    assert_int_equal(in.start.live[0].size, 3000320);
    assert_int_equal(in.start.live[1].addr, 16 * MiB);
    assert_int_equal(in.start.live[1].size, 4 * MiB);
    assert_true(in.has_recorded);
    assert_int_equal(in.recorded_start, 22 * MiB);
    assert_int_equal(in.recorded_peak, 24 * MiB);
    assert_string_equal(in.recorded_conf, "");
    tune_input_free(&in);
}

/* The table of `tally tune FIXTURE` (status 0) holds both texts. */

/* A snapshot read while the host is out of memory, failing at each of
 * tune_input.c's allocations in turn (the cross-stream bookkeeping's five
 * tables, the live blocks of the recorded state): the read fails with "out of
 * memory", never a crash, and reads as before once memory is back. */
static void test_snapshot_read_out_of_host_memory_is_an_error(void **state)
{
    (void)state;
    char path[PATH_MAX + 32], err[512];
    snprintf(path, sizeof path, "%s/small.pickle", fixtures);
    tune_input_t in;
    input_callocs = 0;
    if (tune_input_load(path, -1, &in, err, sizeof err))
        fail_msg("%s", err);
    tune_input_free(&in);
    long total = input_callocs;
    assert_int_equal(total, 6);
    for (long k = 0; k < total; k++) {
        input_fail_at = k;
        input_callocs = 0;
        err[0] = 0;
        int rc = tune_input_load(path, -1, &in, err, sizeof err);
        input_fail_at = -1;
        if (rc == 0)
            fail_msg("allocation %ld of %ld failed, yet the snapshot was read", k, total);
        if (!strstr(err, "out of memory"))
            fail_msg("allocation %ld of %ld failed: '%s'", k, total, err);
        tune_input_free(&in);
    }
    input_callocs = 0;
    if (tune_input_load(path, -1, &in, err, sizeof err))
        fail_msg("%s", err);
    assert_int_equal(in.trace.nev, 7);
    tune_input_free(&in);
}
static void expect_table(const char *fixture, const char *want1, const char *want2)
{
    run_t r = tune("'%s/%s'", fixtures, fixture);
    assert_int_equal(r.rc, 0);
    if (!strstr(r.out, want1) || !strstr(r.out, want2) || !strstr(r.out, "PyTorch's allocator:"))
        fail_msg("table of %s lacks '%s' or '%s':\n%s", fixture, want1, want2, r.out);
    run_free(&r);
}


/* A row's figure is the peak of reserved memory, not what is reserved at
 * the end: two 400 MiB blocks, freed, then 700 MiB on a 1 GiB device
 * (the cached 800 MiB released to make room) peak at 800 MiB. */
static void test_rows_give_peak_reserved(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/drop.csv", scratch);
    write_text(path, "op,id,size,stream\na,1,419430400,0\na,2,419430400,0\nf,1,419430400,0\nf,2,419430400,0\n"
                     "a,3,734003200,0\nf,3,734003200,0\n");
    tally_json_t *rows = tune_json(path, "--capacity 1GiB");
    assert_int_equal(jint(&rows->items[0], "peak_reserved_bytes"), 800 << 20);
    tally__json_free(rows);
    /* The table's heading counts the trace: one stream is "1 stream". */
    run_t t = tune("--capacity 1GiB '%s'", path);
    if (t.rc != 0 || !strstr(t.out, "(CSV trace: 6 events, 3 allocations, 1 stream)"))
        fail_msg("status %d, stdout:\n%s", t.rc, t.out);
    run_free(&t);
    /* A CSV trace has no devices to pick from: --device is refused, not ignored. */
    expect_one_line_error(tune("--device 0 '%s'", path), 2,
                          "is a CSV trace, which holds one device's allocations (--device picks a device of a "
                          "PyTorch snapshot or a report)");
}

static void test_snapshot_command(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/small.pickle", fixtures);
    tally_json_t *rows = tune_json(path, "");
    for (size_t i = 0; i < rows->len; i++) {
        assert_int_equal(jint(&rows->items[i], "recorded_peak_reserved_bytes"), 24 * MiB);
        assert_int_equal(jint(&rows->items[i], "peak_live_bytes"), 7000000);
    }
    tally__json_free(rows);
    /* PyTorch's figure next to the replay of the same setting, and the difference: the made-up window
     * allocates a 2 MiB small segment while the one it frees later is cached and free since before
     * recording; the replay, by PyTorch's rules, serves the 1000 B block from that one. */
    expect_table("small.pickle", "recorded by PyTorch (PYTORCH_CUDA_ALLOC_CONF=\"\"): peak reserved 24.0 MiB",
                 "replay of the same setting from the recorded state (2 segments, 2 live blocks): 22.0 MiB; "
                 "difference -2.0 MiB (-8.33%)");
    /* The recommendation keeps within the call budget: with --max-calls 2
     * the row that reserves least (3 calls) is left out. */
    rows = tune_json(path, "--max-calls 2");
    int64_t def = jint(&rows->items[0], "peak_reserved_bytes");
    bool left_out = false;
    for (size_t k = 0; k < rows->len; k++) {
        const tally_json_t *row = &rows->items[k];
        if (jtrue(row, "fits") && jint(row, "backend_calls") > 2 && jint(row, "peak_reserved_bytes") < def)
            left_out = true;
        if (jtrue(row, "recommended"))
            assert_true(jint(row, "backend_calls") <= 2);
    }
    assert_true(left_out); /* else the budget decided nothing */
    tally__json_free(rows);
}

/* A snapshot recorded under a setting outside the grid: that setting is
 * replayed too, as the last row, and set beside PyTorch's figure
 * (small_conf.pickle is small.pickle with max_split_size_mb:33). */
static void test_snapshot_recorded_setting(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/small_conf.pickle", fixtures);
    tally_json_t *rows = tune_json(path, "");
    const tally_json_t *last = &rows->items[rows->len - 1];
    assert_string_equal(tally__json_get(last, "setting")->s, "max_split_size_mb:33");
    assert_int_equal(jint(last, "peak_reserved_bytes"), 22 * MiB);
    tally__json_free(rows);
    expect_table("small_conf.pickle", "(PYTORCH_CUDA_ALLOC_CONF=\"max_split_size_mb:33\"): peak reserved 24.0 MiB",
                 "replay of the same setting from the recorded state (2 segments, 2 live blocks): 22.0 MiB; "
                 "difference -2.0 MiB");
}

/* A job recorded with a key tally cannot replay: that row fails, the
 * comparison says so, and the rest of the grid still gives a recommendation. */
static void test_snapshot_unsupported_setting(void **state)
{
    (void)state;
    expect_table("small_unsupported.pickle",
                 "replay of the same setting from the recorded state failed: config: key 'pinned_use_cuda_host_register'",
                 "tally: expandable_segments:True");
}

/* The same in --json: the row of the setting tally cannot run has an
 * "error" (and is the only one: a row that ran has none), and since the
 * replay of the recorded setting from the recorded state failed, no row
 * gives that replay's peak; each gives the recorded peak (24 MiB). */
static void test_snapshot_unsupported_setting_json_errors_only_where_a_row_failed(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/small_unsupported.pickle", fixtures);
    run_t r = tune("--json '%s'", path);
    assert_int_equal(r.rc, 0);
    tally_json_t *rows = tally__json_parse(r.out, strlen(r.out), NULL, 0, NULL);
    assert_non_null(rows);
    run_free(&r);
    assert_int_equal(rows->type, TALLY_JSON_ARRAY);
    assert_true(rows->len > 10);
    size_t errors = 0;
    for (size_t k = 0; k < rows->len; k++) {
        const tally_json_t *row = &rows->items[k];
        const char *setting = tally__json_get(row, "setting")->s;
        const tally_json_t *e = tally__json_get(row, "error");
        if (e) {
            errors++;
            assert_string_equal(setting, "pinned_use_cuda_host_register:True");
            assert_non_null(strstr(e->s, "is not supported by tally"));
        }
        if (tally__json_get(row, "recorded_replay_peak_reserved_bytes"))
            fail_msg("row '%s' gives the peak of a replay that failed", setting);
        assert_int_equal(jint(row, "recorded_peak_reserved_bytes"), 24 * MiB);
    }
    assert_int_equal(errors, 1);
    tally__json_free(rows);
}

/* --plot draws the default and the recommendation, named in the legend. */
/* A step of 1, 2 or 5 times a power of ten. */
static bool round_step(double step)
{
    double m = step;
    while (m >= 10)
        m /= 10;
    return step >= 1 && (fabs(m - 1) < 1e-9 || fabs(m - 2) < 1e-9 || fabs(m - 5) < 1e-9);
}

/* The chart's layout (issue: the title cut off, the legend over the curves,
 * the last x label clipped, ticks not round): the title holds the file's
 * base name only and fits the width; the legend lies above the plot area
 * (its top is at y 64); axis ticks are 0, s, 2s, ... with s round; the
 * last x label ends inside the 900 px width. */
static void check_plot_layout(const char *svg)
{
    const char *t = strstr(svg, "font-size=\"14\">");
    assert_non_null(t);
    const char *te = strstr(t, "</text>");
    if (memchr(t, '/', (size_t)(te - t)) || te - t > 130)
        fail_msg("title: %.*s", (int)(te - t), t);
    double yv[16], xv[16], xpos[16];
    int ny = 0, nx = 0;
    for (const char *p = svg; (p = strstr(p, "<text ")); p++) {
        double x, y, v;
        char anchor[16];
        if (sscanf(p, "<text x=\"%lf\" y=\"%lf\" text-anchor=\"%15[a-z]\">%lf<", &x, &y, anchor, &v) == 4) {
            if (strcmp(anchor, "end") == 0 && ny < 16)
                yv[ny++] = v;
            else if (strcmp(anchor, "middle") == 0 && nx < 16) {
                xpos[nx] = x;
                xv[nx++] = v;
            }
        }
        if (strstr(p, " fill=\"#") && strstr(p, " fill=\"#") < strchr(p, '>') && sscanf(p, "<text x=\"%lf\" y=\"%lf\"", &x, &y) == 2 &&
            y > 64)
            fail_msg("a legend entry inside the plot area at y %.0f", y);
    }
    assert_true(ny >= 3 && nx >= 3);
    for (int k = 0; k < 2; k++) {
        double *v = k ? xv : yv;
        int n = k ? nx : ny;
        double step = v[1] - v[0];
        if (v[0] != 0 || !round_step(step))
            fail_msg("%s ticks start %.0f, step %.0f", k ? "x" : "y", v[0], step);
        for (int i = 1; i < n; i++)
            if (fabs(v[i] - v[0] - step * i) > 1e-6)
                fail_msg("%s tick %d is %.0f, not %.0f", k ? "x" : "y", i, v[i], step * i);
    }
    char last[32];
    int w = snprintf(last, sizeof last, "%.0f", xv[nx - 1]);
    if (xpos[nx - 1] + 4.0 * w > 900)
        fail_msg("the last x label (%s at x %.0f) runs past the 900 px width", last, xpos[nx - 1]);
}

static void test_plot(void **state)
{
    (void)state;
    char svg[PATH_MAX + 32];
    snprintf(svg, sizeof svg, "%s/tune.svg", scratch);
    run_t r = tune("--plot '%s' '%s/small.pickle'", svg, fixtures);
    assert_int_equal(r.rc, 0);
    /* The table ends by naming the picture. */
    char said[PATH_MAX + 48];
    snprintf(said, sizeof said, "\nplot: %s\n", svg);
    if (!strstr(r.out, said))
        fail_msg("the table does not name the plot (%s):\n%s", said, r.out);
    run_free(&r);
    /* With --json the output stays one JSON array, the picture written all the same. */
    remove(svg);
    r = tune("--json --plot '%s' '%s/small.pickle'", svg, fixtures);
    assert_int_equal(r.rc, 0);
    tally_json_t *rows = tally__json_parse(r.out, strlen(r.out), NULL, 0, NULL);
    if (!rows || strstr(r.out, "plot: "))
        fail_msg("--json --plot output is not one JSON array:\n%s", r.out);
    tally__json_free(rows);
    run_free(&r);
    char *text = slurp(svg);
    assert_non_null(text);
    int paths = 0;
    for (const char *p = text; (p = strstr(p, "<path")); p++)
        paths++;
    assert_int_equal(paths, 2);
    if (!strstr(text, ">PyTorch's default</text>") || !strstr(text, "</svg>"))
        fail_msg("svg:\n%s", text);
    check_plot_layout(text);
    free(text);
    expect_one_line_error(tune("--plot /nonexistent/dir/x.svg '%s/small.pickle'", fixtures), 1, "cannot write");
}

/* ---- two recommendations ----------------------------------------------------------- */

/* 30 MiB, 1000 B and 5 MiB, all live to the end (worked by hand):
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

static void three_csv(char *path, size_t len)
{
    snprintf(path, len, "%s/three.csv", scratch);
    write_text(path, three_blocks);
}


static void test_two_recommendations(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    three_csv(path, sizeof path);
    tally_json_t *rows = tune_json(path, "--capacity 1GiB");
    static const struct {
        const char *setting, *allocator;
        int64_t reserved, calls;
    } want[] = {
        {"", "PyTorch/tally", 52, 3},
        {"large_segment_size_mb:4", "PyTorch/tally", 38, 3},
        {"large_segment_size_mb:10", "PyTorch/tally", 42, 3},
        {"expandable_segments:True", "PyTorch (model)", 42, 3},
        {"expandable_segments:True,large_segment_size_mb:2", "PyTorch (model)", 38, 19},
        {"expandable_segments:True,large_segment_size_mb:10", "PyTorch (model)", 42, 5},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        const tally_json_t *row = row_of(rows, want[i].setting, want[i].allocator);
        if (jint(row, "peak_reserved_bytes") != want[i].reserved * (int64_t)MiB ||
            jint(row, "backend_calls") != want[i].calls)
            fail_msg("%s (%s): %lld bytes, %lld calls; want %lld MiB, %lld calls", want[i].setting,
                     want[i].allocator, (long long)jint(row, "peak_reserved_bytes"),
                     (long long)jint(row, "backend_calls"), (long long)want[i].reserved, (long long)want[i].calls);
    }
    assert_true(jtrue(row_of(rows, "large_segment_size_mb:4", "PyTorch/tally"), "recommended"));
    /* tally's own expandable row is tally's, never PyTorch's. */
    const tally_json_t *tex = row_of(rows, "expandable_segments:True", "tally");
    assert_false(jtrue(tex, "recommended"));
    assert_string_equal(tally__json_get(tex, "line")->s, "TALLY_CONF=expandable_segments:True");
    assert_string_equal(tally__json_get(row_of(rows, "expandable_segments:True", "PyTorch (model)"), "line")->s,
                        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True");
    tally__json_free(rows);
    /* The table: both names of PyTorch's line, tally's line, and which allocator each row models. */
    run_t r = tune("--capacity 1GiB --torch-version 2.11 '%s'", path);
    assert_int_equal(r.rc, 0);
    if (!strstr(r.out, "PyTorch's allocator: large_segment_size_mb:4 reserves 38.0 MiB") ||
        !strstr(r.out, "\n  PYTORCH_ALLOC_CONF=large_segment_size_mb:4\n") ||
        !strstr(r.out, "\n  PYTORCH_CUDA_ALLOC_CONF=large_segment_size_mb:4\n") || !strstr(r.out, "\n  TALLY_CONF=") ||
        !strstr(r.out, "allocator") || !strstr(r.out, "PyTorch (model)") || !strstr(r.out, "<- PyTorch") ||
        !strstr(r.out, "<- tally"))
        fail_msg("table:\n%s", r.out);
    run_free(&r);
}

/* Ties on peak reserved go to fewer backend calls (a device free counts as
 * one, not only the allocations). tie.csv: 32 MiB, freed, then 40 MiB, in
 * 40 MiB of device memory. PyTorch's default makes a 32 MiB segment, frees
 * it to fit the 40 MiB one and makes that: 40 MiB in 2 allocations and 1
 * free, 3 calls. PyTorch's expandable segments map two 20 MiB pages for the
 * 32 MiB and serve the 40 MiB from them: 40 MiB in 2 calls, which is the
 * recommendation; it reserves no less, and the summary says so. With the
 * default over --max-calls, or not fitting at all, the summary names why it
 * was passed over. */
static void test_tie_goes_to_fewer_calls(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/tie.csv", scratch);
    write_text(path, "op,id,size,stream\na,1,33554432,0\nf,1,0,0\na,2,41943040,0\n");
    tally_json_t *rows = tune_json(path, "--capacity 40MiB");
    const tally_json_t *def = &rows->items[0], *model = row_of(rows, "expandable_segments:True", "PyTorch (model)");
    assert_int_equal(jint(def, "peak_reserved_bytes"), 40 * MiB);
    assert_int_equal(jint(def, "backend_calls"), 3);
    assert_int_equal(jint(def, "device_allocs"), 2);
    assert_int_equal(jint(model, "peak_reserved_bytes"), 40 * MiB);
    assert_int_equal(jint(model, "backend_calls"), 2);
    assert_false(jtrue(def, "recommended"));
    assert_true(jtrue(model, "recommended"));
    tally__json_free(rows);
    /* The JSON escapes only what JSON needs: text with blanks reads as it is
     * written, for a grep or a diff of the output as much as for a parser. */
    run_t r = tune("--json --capacity 40MiB '%s'", path);
    if (r.rc != 0 || !strstr(r.out, "\"why\":\"PyTorch's default\"") ||
        !strstr(r.out, "\"allocator\":\"PyTorch (model)\"") || strstr(r.out, "\\u"))
        fail_msg("status %d, JSON:\n%s", r.rc, r.out);
    run_free(&r);
    r = tune("--capacity 40MiB '%s'", path);
    assert_int_equal(r.rc, 0);
    if (!strstr(r.out, "PyTorch's allocator: expandable_segments:True reserves the same 40.0 MiB as the default, "
                       "2 backend calls (default 3),") ||
        !strstr(r.out, "\ntally: expandable_segments:True reserves the same 40.0 MiB as the default, 1 backend call "
                       "(default 3),") ||
        strstr(r.out, "keep the default"))
        fail_msg("table:\n%s", r.out);
    run_free(&r);
    r = tune("--capacity 40MiB --max-calls 2 '%s'", path);
    if (r.rc != 0 || !strstr(r.out, "PyTorch's allocator: expandable_segments:True reserves 40.0 MiB, where the "
                                    "default is over the call budget, 2 backend calls (default 3)"))
        fail_msg("table:\n%s", r.out);
    run_free(&r);
    /* 5 MiB and 25 MiB: the default's 20 MiB segment for the 5 MiB block
     * leaves too little for the 26 MiB one. */
    write_text(path, "op,id,size,stream\na,1,5242880,0\na,2,26214400,0\n");
    r = tune("--capacity 40MiB '%s'", path);
    if (r.rc != 0 || !strstr(r.out, " reserves 30.0 MiB, where the default does not fit in 40.0 MiB, "))
        fail_msg("table:\n%s", r.out);
    run_free(&r);
}

/* Which name to use, by torch version: --torch-version, else the installed
 * torch's ($TALLY_PYTHON asked to import it), else both rules. */
static void expect_version(const char *args, const char *want)
{
    char path[PATH_MAX + 32];
    three_csv(path, sizeof path);
    run_t r = tune("--capacity 1GiB %s '%s'", args, path);
    if (r.rc != 0 || !strstr(r.out, want))
        fail_msg("tune %s: status %d, output lacks '%s':\n%s", args, r.rc, want, r.out);
    run_free(&r);
}

static void test_torch_version(void **state)
{
    (void)state;
    expect_version("--torch-version 2.8.0",
                   "torch 2.8.0 (--torch-version): use PYTORCH_CUDA_ALLOC_CONF (versions before 2.9 do not read");
    expect_version("--torch-version 2.9.1", "torch 2.9.1 (--torch-version): use PYTORCH_CUDA_ALLOC_CONF (2.9 reads "
                                            "PYTORCH_ALLOC_CONF but ignores expandable_segments");
    expect_version("--torch-version 2.11", "torch 2.11 (--torch-version): use PYTORCH_ALLOC_CONF");
    /* torch 1.x is a version too (1.13 is still run), and there is no 0.x form to name. */
    expect_version("--torch-version 1.13.1",
                   "torch 1.13.1 (--torch-version): use PYTORCH_CUDA_ALLOC_CONF (versions before 2.9 do not read");
    /* No torch to import. */
    setenv("TALLY_PYTHON", "false", 1);
    expect_version("", "torch version unknown (give --torch-version)");
    /* An installed torch (a stand-in python that prints a version). */
    char py[PATH_MAX + 32], cmd[PATH_MAX + 64];
    snprintf(py, sizeof py, "%s/python-torch", scratch);
    write_text(py, "#!/bin/sh\necho 2.10.0+cu130\n");
    snprintf(cmd, sizeof cmd, "chmod +x '%s'", py);
    assert_int_equal(system(cmd), 0);
    setenv("TALLY_PYTHON", py, 1);
    expect_version("", "torch 2.10.0+cu130 (the installed torch): use PYTORCH_ALLOC_CONF");
    expect_version("--torch-version 2.9.0", "torch 2.9.0 (--torch-version)"); /* the flag wins */
    unsetenv("TALLY_PYTHON");
    expect_one_line_error(tune("--torch-version two '%s/small.pickle'", fixtures), 2,
                          "--torch-version 'two' is not a torch version");
    expect_one_line_error(tune("--torch-version 2 '%s/small.pickle'", fixtures), 2,
                          "--torch-version '2' is not a torch version");
    expect_one_line_error(tune("--torch-version 0.4.1 '%s/small.pickle'", fixtures), 2,
                          "--torch-version '0.4.1' is not a torch version");
}

/* ---- the replay follows the recording ------------------------------------------------ */

/* warm.pickle, recorded after warm-up: PyTorch held a free 40 MiB segment
 * and a 20 MiB one with a live 4 MiB block, and served the window's three
 * 12 MiB blocks from the 40 MiB: 60 MiB all along. From that state the
 * replay reserves the same; from an empty cache (the rows) 44 MiB: 20 for
 * the 4 MiB block, then 12 MiB segments (the first fits in the 20's rest). */
static void test_recorded_state(void **state)
{
    (void)state;
    char path[PATH_MAX + 32], err[512];
    snprintf(path, sizeof path, "%s/warm.pickle", fixtures);
    tune_input_t in;
    if (tune_input_load(path, -1, &in, err, sizeof err))
        fail_msg("%s", err);
    assert_true(in.start.known);
    assert_int_equal(in.start.nranges, 2);
    assert_int_equal(in.start.ranges[0].size, 40 * MiB);
    assert_int_equal(in.start.ranges[1].size, 20 * MiB);
    assert_int_equal(in.start.nlive, 1);
    assert_int_equal(in.start.live[0].size, 4 * MiB);
    assert_int_equal(in.start.live[0].slot, 0);
    tune_input_free(&in);
    tally_json_t *rows = tune_json(path, "");
    assert_int_equal(jint(&rows->items[0], "recorded_peak_reserved_bytes"), 60 * MiB);
    assert_int_equal(jint(&rows->items[0], "recorded_replay_peak_reserved_bytes"), 60 * MiB);
    assert_int_equal(jint(&rows->items[0], "peak_reserved_bytes"), 44 * MiB);
    tally__json_free(rows);
    expect_table("warm.pickle", "replay of the same setting from the recorded state (2 segments, 1 live block): "
                                "60.0 MiB; difference +0.0 MiB (+0.00%)", "recorded by PyTorch");
    /* warm_rounded.pickle: the same under roundup_power2_divisions:2, which cannot make its 40 MiB segment
     * (40 MiB rounds to 48): the replay from the recorded state says so, and the comparison falls back to
     * the replay from an empty cache. */
    expect_table("warm_rounded.pickle",
                 "replay of the same setting from the recorded state failed: the setting makes a 50331648-byte "
                 "segment where PyTorch had 41943040 bytes (address 1073741824)",
                 "replay of the same setting (from an empty cache): 44.0 MiB; difference -16.0 MiB");
}

/* Write the snapshot body (tune_write_pickle's Python) to scratch/name and
 * read it as tally tune reads a snapshot (every device: the busiest), into
 * in; the path goes to path (PATH_MAX + 32 bytes). Skips without python3. */
static void load_snapshot(const char *name, const char *body, char *path, tune_input_t *in)
{
    char err[512];
    snprintf(path, PATH_MAX + 32, "%s/%s", scratch, name);
    if (tune_write_pickle(path, body) != 0)
        SKIP("python3 is needed to write the snapshot");
    if (tune_input_load(path, -1, in, err, sizeof err))
        fail_msg("%s: %s", name, err);
}

/* A snapshot whose segments and events carry no "stream" (PyTorch leaves it
 * out of no version we know, but the parser takes it as optional): all of
 * it is stream 0. nostream.pickle, made here: a 20 MiB segment holding a
 * 4 MiB block live since before recording, and the window's 8 MiB block
 * allocated and freed beside it. The live block, its segment and the
 * window's block are one stream, so the replay from the recorded state
 * serves the 8 MiB from the segment's free 16 MiB: 20 MiB, as recorded. */
static void test_snapshot_without_streams_is_stream_0(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    tune_input_t in;
    load_snapshot("nostream.pickle",
                  "d = {\"allocator_settings\": {\"PYTORCH_CUDA_ALLOC_CONF\": \"\"},\n"
                  " \"device_traces\": [[{\"action\": \"alloc\", \"addr\": S + 4 * M, \"size\": 8 * M},\n"
                  "   {\"action\": \"free_requested\", \"addr\": S + 4 * M, \"size\": 8 * M}]],\n"
                  " \"segments\": [{\"address\": S, \"device\": 0, \"segment_type\": \"large\", \"total_size\": 20 * M,\n"
                  "   \"blocks\": [{\"address\": S, \"requested_size\": 4 * M, \"size\": 4 * M, \"state\": \"active_allocated\"},\n"
                  "   {\"address\": S + 4 * M, \"requested_size\": 0, \"size\": 16 * M, \"state\": \"inactive\"}]}]}",
                  path, &in);
    assert_int_equal(in.trace.nev, 3); /* the live block, then the window's alloc and free */
    assert_int_equal(in.trace.nstreams, 1);
    assert_int_equal(in.trace.stream_ids[0], 0);
    assert_int_equal(in.start.nranges, 1);
    assert_int_equal(in.start.ranges[0].stream, 0);
    assert_int_equal(in.start.nlive, 1);
    tune_input_free(&in);
    tally_json_t *rows = tune_json(path, "");
    assert_int_equal(jint(&rows->items[0], "recorded_peak_reserved_bytes"), 20 * MiB);
    assert_int_equal(jint(&rows->items[0], "recorded_replay_peak_reserved_bytes"), 20 * MiB);
    tally__json_free(rows);
}

/* A block live before recording whose 'size' the snapshot leaves out is
 * placed at its requested size rounded as PyTorch's small pool rounds it:
 * up to a multiple of 512, at least 512 (100 -> 512, 1000 -> 1024, 3000 ->
 * 3072); a block with its size keeps it. */
static void test_snapshot_live_block_without_size_is_rounded(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    tune_input_t in;
    load_snapshot("nosize.pickle",
                  "def blk(a, r, **k):\n"
                  "    return dict(address=a, requested_size=r, state=\"active_allocated\", **k)\n"
                  "d = {\"device_traces\": [[{\"action\": \"alloc\", \"addr\": S + M, \"size\": 512, \"stream\": 0},\n"
                  "   {\"action\": \"free_requested\", \"addr\": S + M, \"size\": 512, \"stream\": 0}]],\n"
                  " \"segments\": [{\"address\": S, \"device\": 0, \"segment_type\": \"small\", \"total_size\": 2 * M,\n"
                  "   \"blocks\": [blk(S, 100), blk(S + 512, 1000), blk(S + 1536, 3000), blk(S + 4608, 700, size=1536)]}]}",
                  path, &in);
    assert_int_equal(in.start.nlive, 4);
    static const uint64_t want[][2] = {{0, 512}, {512, 1024}, {1536, 3072}, {4608, 1536}};
    for (size_t i = 0; i < 4; i++) {
        const ptx_live_t *l = NULL;
        for (size_t k = 0; k < in.start.nlive; k++)
            if (in.start.live[k].addr == ((uint64_t)1 << 30) + want[i][0])
                l = &in.start.live[k];
        if (!l || l->size != want[i][1])
            fail_msg("the block at S + %llu: %s %llu bytes, want %llu", (unsigned long long)want[i][0],
                     l ? "placed at" : "missing,", l ? (unsigned long long)l->size : 0ull,
                     (unsigned long long)want[i][1]);
    }
    tune_input_free(&in);
}

/* A live block whose size the snapshot gives as 513 bytes (no PyTorch block
 * has it: they are multiples of 512) with the next live block 511 bytes
 * after its end: the remainder is too small to split off, so the replay from
 * the recorded state places 1024 bytes there, as a PyTorch allocator that
 * rounds to 512 would have, and the next block then sits where it was
 * recorded (odd.pickle: 2 MiB, as recorded). Were the 511 bytes a gap of
 * their own, the next block would land 511 bytes early and the replay from
 * the recorded state could not start. */
static void test_snapshot_remainder_under_512_stays_with_its_block(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    tune_input_t in;
    load_snapshot("odd.pickle",
                  "def blk(a, s):\n"
                  "    return dict(address=a, requested_size=s, size=s, state=\"active_allocated\")\n"
                  "d = {\"device_traces\": [[{\"action\": \"alloc\", \"addr\": S + 1536, \"size\": 512, \"stream\": 0},\n"
                  "   {\"action\": \"free_requested\", \"addr\": S + 1536, \"size\": 512, \"stream\": 0}]],\n"
                  " \"segments\": [{\"address\": S, \"device\": 0, \"segment_type\": \"small\", \"total_size\": 2 * M,\n"
                  "   \"blocks\": [blk(S, 513), blk(S + 1024, 512)]}]}",
                  path, &in);
    assert_int_equal(in.start.nranges, 1);
    assert_int_equal(in.start.nlive, 2);
    tune_input_free(&in);
    tally_json_t *rows = tune_json(path, "");
    const tally_json_t *got = tally__json_get(&rows->items[0], "recorded_replay_peak_reserved_bytes");
    if (!got)
        fail_msg("the replay from the recorded state did not start");
    assert_int_equal(jint(&rows->items[0], "recorded_replay_peak_reserved_bytes"), 2 * MiB);
    tally__json_free(rows);
}

/* A segment the window frees (segment_free) was there when recording began:
 * it joins the recorded state, in the small pool when it is 2 MiB (PyTorch's
 * small segments' size) or less, else in the large pool: 2 MiB, 2 MiB + 512 B
 * and 3 MiB freed give one small range and two large ones. */
static void test_snapshot_freed_segments_join_their_pool(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    tune_input_t in;
    load_snapshot("freed.pickle",
                  "def ev(a, s, act):\n"
                  "    return {\"action\": act, \"addr\": a, \"size\": s, \"stream\": 0}\n"
                  "d = {\"device_traces\": [[ev(S, 2 * M, \"segment_free\"), ev(S + 4 * M, 2 * M + 512, \"segment_free\"),\n"
                  "   ev(S + 8 * M, 3 * M, \"segment_free\"), ev(S + 16 * M, 512, \"alloc\")]], \"segments\": []}",
                  path, &in);
    assert_int_equal(in.start.nranges, 3);
    static const bool small[3] = {true, false, false};
    for (size_t i = 0; i < 3; i++)
        if (in.start.ranges[i].small != small[i])
            fail_msg("range %zu (%llu bytes): small %d", i, (unsigned long long)in.start.ranges[i].size,
                     (int)in.start.ranges[i].small);
    tune_input_free(&in);
}

/* A recorded PYTORCH_CUDA_ALLOC_CONF is the user's text, quotes and
 * backslashes included: --json escapes them, so the row reads back as the
 * setting recorded (quoted.pickle: the nostream snapshot's shape, under a
 * setting tally refuses, whose row fails and says why). */
static void test_recorded_setting_with_quotes_and_backslashes_reads_back(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/quoted.pickle", scratch);
    if (tune_write_pickle(path,
                          "d = {\"allocator_settings\": {\"PYTORCH_CUDA_ALLOC_CONF\": \"max_split_size_mb:40,x\\x22y\\x5cz\"},\n"
                          " \"device_traces\": [[{\"action\": \"alloc\", \"addr\": S, \"size\": 8 * M, \"stream\": 0},\n"
                          "   {\"action\": \"free_requested\", \"addr\": S, \"size\": 8 * M, \"stream\": 0}]],\n"
                          " \"segments\": []}") != 0)
        SKIP("python3 is needed to write the snapshot");
    run_t r = tune("--json '%s'", path);
    assert_int_equal(r.rc, 0);
    tally_json_t *rows = tally__json_parse(r.out, strlen(r.out), NULL, 0, NULL);
    if (!rows)
        fail_msg("not JSON:\n%s", r.out);
    const tally_json_t *last = &rows->items[rows->len - 1];
    assert_string_equal(tally__json_get(last, "setting")->s, "max_split_size_mb:40,x\"y\\z");
    assert_string_equal(tally__json_get(last, "line")->s, "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:40,x\"y\\z");
    tally__json_free(rows);
    run_free(&r);
}

/* release.pickle: 4 MiB in a 20 MiB segment, freed, empty_cache (its
 * segment_free), then 30 MiB. Replayed as a release, the 20 MiB goes back
 * before the 30 MiB segment: 30 MiB, as PyTorch; kept, it would be 50. */
static void test_release(void **state)
{
    (void)state;
    char path[PATH_MAX + 32], err[512];
    snprintf(path, sizeof path, "%s/release.pickle", fixtures);
    tune_input_t in;
    if (tune_input_load(path, -1, &in, err, sizeof err))
        fail_msg("%s", err);
    assert_int_equal(in.trace.nev, 4);
    assert_int_equal(in.trace.ev[2].op, 'e');
    assert_int_equal(in.releases, 1);
    tune_input_free(&in);
    tally_json_t *rows = tune_json(path, "");
    assert_int_equal(jint(&rows->items[0], "peak_reserved_bytes"), 30 * MiB);
    assert_int_equal(jint(&rows->items[0], "recorded_replay_peak_reserved_bytes"), 30 * MiB);
    /* The model of PyTorch's expandable segments releases too: 20 MiB page, unmapped, then 40 MiB (two pages). */
    assert_int_equal(jint(row_of(rows, "expandable_segments:True", "PyTorch (model)"), "peak_reserved_bytes"), 40 * MiB);
    tally__json_free(rows);
    expect_table("release.pickle", "1 release of cached memory", "difference +0.0 MiB");
}

/* A recording made with expandable segments is replayed under PyTorch's
 * expandable rules from the pages mapped when it began: in
 * expandable_warm.pickle 100 MiB (the 20 MiB block fits in them), where
 * the model from nothing maps 60; in expandable.pickle the dump's 60 MiB
 * less the window's one 20 MiB map, 40 MiB, then that map again: 60 MiB. */
static void test_expandable_recording(void **state)
{
    (void)state;
    char path[PATH_MAX + 32], err[512];
    snprintf(path, sizeof path, "%s/expandable_warm.pickle", fixtures);
    tally_json_t *rows = tune_json(path, "");
    assert_int_equal(jint(&rows->items[0], "recorded_peak_reserved_bytes"), 100 * MiB);
    assert_int_equal(jint(&rows->items[0], "recorded_replay_peak_reserved_bytes"), 100 * MiB);
    assert_int_equal(jint(row_of(rows, "expandable_segments:True", "PyTorch (model)"), "peak_reserved_bytes"), 60 * MiB);
    tally__json_free(rows);
    /* The window maps nothing there: the recorded state is the dump's, with no note about map events. */
    tune_input_t in;
    if (tune_input_load(path, -1, &in, err, sizeof err))
        fail_msg("%s", err);
    assert_true(in.start.expandable);
    if (in.start.gap[0])
        fail_msg("expandable_warm.pickle's recorded state has a note: %s", in.start.gap);
    tune_input_free(&in);
    snprintf(path, sizeof path, "%s/expandable.pickle", fixtures);
    if (tune_input_load(path, -1, &in, err, sizeof err))
        fail_msg("%s", err);
    assert_true(in.start.expandable);
    assert_int_equal(in.start.nranges, 1);
    assert_int_equal(in.start.ranges[0].size, 40 * MiB);
    assert_int_equal(in.recorded_start, 40 * MiB);
    tune_input_free(&in);
    expect_table("expandable.pickle", "replay of the same setting from the recorded state (1 segment, 1 live block): "
                                      "60.0 MiB; difference +0.0 MiB",
                 "the pages mapped at the start are the dump's less the 1 map event of the window");
}

/* A CSV says what it cannot carry. */
static void test_csv_start_unknown(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    three_csv(path, sizeof path);
    run_t r = tune("--capacity 1GiB '%s'", path);
    assert_int_equal(r.rc, 0);
    if (!strstr(r.out, "(a CSV lists the blocks live before recording began, not the cached free segments PyTorch "
                       "held then: every replay starts from an empty cache)"))
        fail_msg("table:\n%s", r.out);
    run_free(&r);
}

/* The default call budget is 4 x the default row's backend calls (device
 * allocations and frees), at least 64. Each trace takes N blocks of 30 MiB
 * and frees them, then M blocks of BIG MiB in 1 GiB: the default makes N + M
 * allocations and, when a BIG block does not fit, frees the N cached
 * segments. 20 and 20 x 50 MiB: 60 calls, a budget of 240 (allocations
 * alone would give 160); 8 and 4 x 200 MiB: 20 calls, 80 (12 allocations
 * alone stay under 64). */
static void expect_budget(int n, int m, int big, int64_t calls, int64_t allocs, int64_t budget)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/budget.csv", scratch);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("op,id,size,stream\n", f);
    for (int i = 1; i <= n; i++)
        fprintf(f, "a,%d,%d,0\n", i, 30 << 20);
    for (int i = 1; i <= n; i++)
        fprintf(f, "f,%d,%d,0\n", i, 30 << 20);
    for (int i = n + 1; i <= n + m; i++)
        fprintf(f, "a,%d,%d,0\n", i, big << 20);
    fclose(f);
    tally_json_t *rows = tune_json(path, "--capacity 1GiB");
    assert_int_equal(jint(&rows->items[0], "backend_calls"), calls);
    assert_int_equal(jint(&rows->items[0], "device_allocs"), allocs);
    tally__json_free(rows);
    run_t r = tune("--capacity 1GiB '%s'", path);
    assert_int_equal(r.rc, 0);
    char want[128];
    snprintf(want, sizeof want, "; capacity 1024.0 MiB; call budget %lld\n", (long long)budget);
    if (!strstr(r.out, want))
        fail_msg("want '%s' in the table:\n%s", want, r.out);
    run_free(&r);
}

static void test_default_call_budget_counts_allocations_and_frees(void **state)
{
    (void)state;
    expect_budget(20, 20, 50, 60, 40, 240);
    expect_budget(8, 4, 200, 20, 12, 80);
}

/* ---- streams ------------------------------------------------------------------------ */

/* Each stream keeps its pool: 20 MiB on stream 0, freed, then 20 MiB on
 * stream 7 cannot take the cached block (40 MiB, 2 segments); on one stream
 * it does (20 MiB). A block freed from another stream than its own goes back
 * to its own pool at the free: allocated on 7, freed from 0, then 20 MiB on
 * 7 again takes it (20 MiB). */
static void expect_reserved(const char *csv, int64_t mib_default, int64_t mib_model)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/streams.csv", scratch);
    write_text(path, csv);
    tally_json_t *rows = tune_json(path, "--capacity 1GiB");
    if (jint(&rows->items[0], "peak_reserved_bytes") != mib_default * (int64_t)MiB ||
        jint(row_of(rows, "expandable_segments:True", "PyTorch (model)"), "peak_reserved_bytes") !=
            mib_model * (int64_t)MiB)
        fail_msg("%s: default %lld, model %lld bytes; want %lld and %lld MiB", csv,
                 (long long)jint(&rows->items[0], "peak_reserved_bytes"),
                 (long long)jint(row_of(rows, "expandable_segments:True", "PyTorch (model)"), "peak_reserved_bytes"),
                 (long long)mib_default, (long long)mib_model);
    tally__json_free(rows);
}

static void test_stream_pools(void **state)
{
    (void)state;
    expect_reserved("op,id,size,stream\na,1,20971520,0\nf,1,20971520,0\na,2,20971520,7\n", 40, 40);
    expect_reserved("op,id,size,stream\na,1,20971520,0\nf,1,20971520,0\na,2,20971520,0\n", 20, 20);
    expect_reserved("op,id,size,stream\na,1,20971520,7\nf,1,20971520,0\na,2,20971520,7\n", 20, 20);
}

/* cross_stream.pickle: X (stream 0) is used on side stream 7 too, so
 * PyTorch completes its free only after Y is allocated: Y gets a segment of
 * its own; then 20 MiB on stream 7 gets a third (Y is stream 0's). 60 MiB.
 * The replay frees X at its free_completed: after Y's allocation. */
static void test_cross_stream_snapshot(void **state)
{
    (void)state;
    char path[PATH_MAX + 32], err[512];
    snprintf(path, sizeof path, "%s/cross_stream.pickle", fixtures);
    tune_input_t in;
    if (tune_input_load(path, -1, &in, err, sizeof err))
        fail_msg("%s", err);
    static const struct {
        char op;
        uint32_t slot;
        uint16_t stream;
    } want[] = {{'a', 0, 0}, {'a', 1, 0}, {'f', 0, 0}, {'f', 1, 0}, {'a', 2, 0}, {'a', 3, 1}};
    assert_int_equal(in.trace.nev, 6);
    assert_int_equal(in.trace.nstreams, 2);
    assert_int_equal(in.trace.stream_ids[1], 7);
    for (size_t i = 0; i < 6; i++)
        if (in.trace.ev[i].op != want[i].op || in.trace.ev[i].slot != want[i].slot ||
            in.trace.ev[i].stream != want[i].stream)
            fail_msg("event %zu: %c slot %u stream %u", i, in.trace.ev[i].op, in.trace.ev[i].slot,
                     in.trace.ev[i].stream);
    tune_input_free(&in);
    tally_json_t *rows = tune_json(path, "");
    assert_int_equal(jint(&rows->items[0], "recorded_peak_reserved_bytes"), 60 * MiB);
    assert_int_equal(jint(&rows->items[0], "recorded_replay_peak_reserved_bytes"), 60 * MiB);
    assert_int_equal(jint(&rows->items[0], "peak_reserved_bytes"), 60 * MiB);
    tally__json_free(rows);
}

/* multistream.csv: `gen_trace --model 7b --steps 1 --seq 64 --batch 1
 * --cross-free 1`, gradient buckets on stream 1 freed from stream 0. Its
 * replay equals that of the same trace with each free on its block's own
 * stream (the free returns the block to its own pool, where it was freed
 * from does not matter), and differs from the trace on one stream (the
 * pools are per stream). */
static tally_json_t *tune_restreamed(const char *src, const char *name, bool frees_own, bool one_stream)
{
    char *text = slurp(src), path[PATH_MAX + 32];
    assert_non_null(text);
    snprintf(path, sizeof path, "%s/%s", scratch, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    /* Each block's stream, by id, for frees_own. */
    static unsigned char stream_of[1 << 16];
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char op;
        unsigned long id;
        unsigned long long size;
        int stream;
        if (sscanf(line, "%c,%lu,%llu,%d", &op, &id, &size, &stream) != 4 || id >= sizeof stream_of) {
            fprintf(f, "%s\n", line);
            continue;
        }
        if (op == 'a')
            stream_of[id] = (unsigned char)stream;
        else if (frees_own)
            stream = stream_of[id];
        fprintf(f, "%c,%lu,%llu,%d\n", op, id, size, one_stream ? 0 : stream);
    }
    assert_int_equal(fclose(f), 0);
    free(text);
    return tune_json(path, "");
}

static void test_multistream_trace(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/multistream.csv", fixtures);
    run_t r = tune("'%s'", path);
    assert_int_equal(r.rc, 0);
    assert_non_null(strstr(r.out, "(CSV trace: 4305 events, 2589 allocations, 2 streams)"));
    run_free(&r);
    tally_json_t *cross = tune_json(path, ""), *own = tune_restreamed(path, "own.csv", true, false),
                 *one = tune_restreamed(path, "one.csv", false, true);
    assert_int_equal(cross->len, own->len);
    for (size_t k = 0; k < cross->len; k++)
        assert_int_equal(jint(&cross->items[k], "peak_reserved_bytes"), jint(&own->items[k], "peak_reserved_bytes"));
    assert_true(jint(&cross->items[0], "peak_reserved_bytes") != jint(&one->items[0], "peak_reserved_bytes"));
    assert_true(jint(row_of(cross, "expandable_segments:True", "PyTorch (model)"), "peak_reserved_bytes") !=
                jint(row_of(one, "expandable_segments:True", "PyTorch (model)"), "peak_reserved_bytes"));
    tally__json_free(cross);
    tally__json_free(own);
    tally__json_free(one);
}

/* ---- budgets and exit codes ------------------------------------------------------- */

/* Each row's least device memory, by bisection: the default needs its
 * 52 MiB (every block is live to the end, nothing cached to release); with
 * 50 MiB it runs out at event 2, the 5 MiB block, with 30 MiB + 1000 B live. */
static void test_least_memory(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    three_csv(path, sizeof path);
    tally_json_t *rows = tune_json(path, "--capacity 1GiB");
    const tally_json_t *def = &rows->items[0];
    assert_int_equal(jint(def, "min_device_bytes"), 52 * MiB);
    const tally_json_t *out = tally__json_get(def, "runs_out");
    assert_non_null(out);
    assert_int_equal(jint(out, "capacity_bytes"), 50 * MiB);
    assert_int_equal(jint(out, "event"), 2);
    assert_int_equal(jint(out, "size"), 5242880);
    assert_int_equal(jint(out, "live_bytes"), 31457280 + 1000);
    assert_int_equal(jint(row_of(rows, "large_segment_size_mb:4", "PyTorch/tally"), "min_device_bytes"), 38 * MiB);
    /* A memory fraction caps at a share of the device, so no least memory is
     * searched: null, with no lower bound given. */
    size_t fractions = 0;
    for (size_t k = 0; k < rows->len; k++) {
        const tally_json_t *r = &rows->items[k];
        if (!strstr(tally__json_get(r, "setting")->s, "memory_fraction:"))
            continue;
        fractions++;
        const tally_json_t *m = tally__json_get(r, "min_device_bytes");
        assert_non_null(m);
        assert_int_equal(m->type, TALLY_JSON_NULL);
        assert_null(tally__json_get(r, "min_device_bytes_above"));
    }
    assert_true(fractions > 0);
    tally__json_free(rows);
}

/* The bisection stops once its bracket is within its step, 0.1% of the
 * upper end (2 MiB at least), as docs/tune.md says: tie.csv frees four
 * 1 MiB small blocks (4 MiB of cached small segments), then takes 3996 MiB.
 * The default reserves 4000 MiB and needs only 3996 (the cache is released
 * when memory runs short); the bracket 3996 to 4000 MiB is exactly 4 MiB
 * wide, 0.1% of 4000 MiB, so no replay inside it is made and the answer is
 * its upper end, 4000 MiB (the row ran out nowhere, so the replay a step
 * below, at 3998 MiB, only looks for where it would). */
static void test_least_memory_stops_at_a_bracket_as_wide_as_its_step(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/tie.csv", scratch);
    write_text(path, "op,id,size,stream\na,1,1048576,0\na,2,1048576,0\na,3,1048576,0\na,4,1048576,0\n"
                     "f,1,1048576,0\nf,2,1048576,0\nf,3,1048576,0\nf,4,1048576,0\na,5,4190109696,0\n"
                     "f,5,4190109696,0\n");
    tally_json_t *rows = tune_json(path, "");
    const tally_json_t *def = &rows->items[0];
    assert_int_equal(jint(def, "peak_live_bytes"), 3996 * MiB);
    assert_int_equal(jint(def, "peak_reserved_bytes"), 4000 * MiB);
    assert_int_equal(jint(def, "min_device_bytes"), 4000 * MiB);
    tally__json_free(rows);
}

/* A row that runs out in the device given (--capacity) says it ran out
 * there, with the least memory found above it: three.csv's default row
 * needs 52 MiB, so in 51 MiB it runs out at its third allocation (5 MiB,
 * with 30 MiB + 1000 B live), and the search finds 52 MiB, 1 MiB above.
 * The search's extra replay a step below the least (for a row that never
 * ran out) must not move it to 50 MiB, a capacity the user did not give. */
static void test_least_memory_just_above_the_device_given(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    three_csv(path, sizeof path);
    run_t r = tune("--json --capacity 51MiB '%s'", path);
    assert_int_equal(r.rc, 0);
    tally_json_t *rows = tally__json_parse(r.out, strlen(r.out), NULL, 0, NULL);
    assert_non_null(rows);
    run_free(&r);
    const tally_json_t *def = &rows->items[0];
    assert_false(jtrue(def, "fits"));
    assert_string_equal(tally__json_get(def, "setting")->s, "");
    assert_int_equal(jint(def, "oom_event"), 2);
    assert_int_equal(jint(def, "min_device_bytes"), 52 * MiB);
    const tally_json_t *out = tally__json_get(def, "runs_out");
    assert_non_null(out);
    assert_int_equal(jint(out, "capacity_bytes"), 51 * MiB);
    assert_int_equal(jint(out, "event"), 2);
    assert_int_equal(jint(out, "size"), 5242880);
    assert_int_equal(jint(out, "live_bytes"), 31457280 + 1000);
    tally__json_free(rows);
}

/* A row that runs out in the device given and in twice that says it ran
 * out in the larger of the two, the largest capacity found too small: one
 * allocation of 30 MiB + 1000 B (segments of 32 MiB) with --capacity of
 * 15.75 MiB runs out there and in 31.5 MiB (above its 30 MiB + 1000 B of
 * live bytes, so replayed), fits in 63 MiB; the search finds 32 MiB, with
 * no capacity it tries between 31.5 and 32 MiB (2 MiB steps). */
static void test_least_memory_runs_out_in_the_largest_capacity_tried(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/one-block.csv", scratch);
    write_text(path, "op,id,size,stream\na,1,31458280,0\n");
    run_t r = tune("--json --capacity 16515072 '%s'", path);
    assert_int_equal(r.rc, 1); /* nothing fits 15.75 MiB */
    tally_json_t *rows = tally__json_parse(r.out, strlen(r.out), NULL, 0, NULL);
    assert_non_null(rows);
    run_free(&r);
    const tally_json_t *def = &rows->items[0];
    assert_string_equal(tally__json_get(def, "setting")->s, "");
    assert_int_equal(jint(def, "oom_event"), 0);
    assert_int_equal(jint(def, "min_device_bytes"), 32 * MiB);
    const tally_json_t *out = tally__json_get(def, "runs_out");
    assert_non_null(out);
    assert_int_equal(jint(out, "capacity_bytes"), 33030144);
    assert_int_equal(jint(out, "event"), 0);
    assert_int_equal(jint(out, "size"), 31458280);
    tally__json_free(rows);
}

/* The least memory a row reports is a device it runs in: run again with
 * --capacity set to that figure, the row fits, without running out. The
 * trace has a row that needs more than its own peak: tally's expandable
 * segments with idle pages that may move (expandable_move_budget:-1)
 * reserve 102 MiB at most (the 60 MiB block's pages move to the 100 MiB
 * one), but the 100 MiB block goes past the 60 MiB hole, at 62 MiB, and the
 * stream's address range is 1 1/8 of the device: 102 MiB of memory hold the
 * pages, and only a device of 144 MiB has the addresses. The search must
 * not take the peak as the least without trying it. */
static void test_least_memory_of_every_row_is_a_device_it_runs_in(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/needs-more-than-its-peak.csv", scratch);
    write_text(path, "op,id,size,stream\na,7,62914560,0\na,17,2097152,0\nf,7,0,0\na,18,104857600,0\n");
    run_t r = tune("--json '%s'", path);
    assert_int_equal(r.rc, 0);
    tally_json_t *rows = tally__json_parse(r.out, strlen(r.out), NULL, 0, NULL);
    assert_non_null(rows);
    run_free(&r);
    int checked = 0;
    for (size_t i = 0; i < rows->len; i++) {
        const tally_json_t *row = &rows->items[i];
        const tally_json_t *least = tally__json_get(row, "min_device_bytes");
        if (!least || least->type == TALLY_JSON_NULL)
            continue;
        const char *setting = tally__json_get(row, "setting")->s, *alloc = tally__json_get(row, "allocator")->s;
        run_t again = tune("--json --capacity %lld '%s'", (long long)jint(row, "min_device_bytes"), path);
        assert_int_equal(again.rc == 0 || again.rc == 1, 1); /* 1: no row fits for PyTorch's or tally's pick */
        tally_json_t *in = tally__json_parse(again.out, strlen(again.out), NULL, 0, NULL);
        assert_non_null(in);
        const tally_json_t *same = row_of(in, setting, alloc);
        if (!jtrue(same, "fits") || tally__json_get(same, "oom_event"))
            fail_msg("row '%s' (%s) reports a least of %lld bytes, but does not run in a device of that size", setting,
                     alloc, (long long)jint(row, "min_device_bytes"));
        tally__json_free(in);
        run_free(&again);
        checked++;
    }
    assert_true(checked >= 10);
    const tally_json_t *moving = row_of(rows, "expandable_segments:True,expandable_move_budget:-1", "tally");
    if (!(jint(moving, "min_device_bytes") > jint(moving, "peak_reserved_bytes")))
        fail_msg("the moving row no longer needs more than its peak (%lld, least %lld): this trace does not test "
                 "the search's check of the peak any more",
                 (long long)jint(moving, "peak_reserved_bytes"), (long long)jint(moving, "min_device_bytes"));
    tally__json_free(rows);
}

/* tune's refusal when nothing qualifies: status 1, one line on stderr
 * holding want, and no row marked as recommended in the table. */
static void expect_refusal(run_t r, const char *want)
{
    if (r.rc != 1 || !strstr(r.err, want) || strchr(r.err, '\n') != r.err + strlen(r.err) - 1 ||
        strstr(r.out, "<- PyTorch") || strstr(r.out, "<- tally"))
        fail_msg("status %d (want 1), stderr '%s' (want one line with '%s'), stdout:\n%s", r.rc, r.err, want, r.out);
    run_free(&r);
}

/* --capacity: a row that does not fit is marked and never recommended;
 * when none fits, status 1 and one line naming the least any needs. */
static void test_capacity(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    three_csv(path, sizeof path);
    /* 40 MiB: the default (52 MiB) does not fit, large_segment_size_mb:4 (38 MiB) does. */
    run_t r = tune("--json --capacity 40MiB '%s'", path);
    assert_int_equal(r.rc, 0);
    tally_json_t *rows = tally__json_parse(r.out, strlen(r.out), NULL, 0, NULL);
    assert_non_null(rows);
    assert_false(jtrue(&rows->items[0], "fits"));
    assert_false(jtrue(&rows->items[0], "recommended"));
    assert_false(jtrue(&rows->items[0], "recommended_tally"));
    assert_true(jtrue(row_of(rows, "large_segment_size_mb:4", "PyTorch/tally"), "recommended"));
    for (size_t k = 0; k < rows->len; k++)
        if (!jtrue(&rows->items[k], "fits"))
            assert_false(jtrue(&rows->items[k], "recommended") || jtrue(&rows->items[k], "recommended_tally"));
    tally__json_free(rows);
    run_free(&r);
    r = tune("--capacity 40MiB '%s'", path);
    assert_int_equal(r.rc, 0);
    if (!strstr(r.out, "\n(default) ") || !strstr(r.out, "  no  in 40.0 MiB at 2: 5.0 MiB, 30.0 MiB"))
        fail_msg("the default row is not marked as not fitting:\n%s", r.out);
    run_free(&r);
    /* 30 MiB: less than the peak of live bytes (35 MiB); nothing fits. */
    expect_refusal(tune("--capacity 30MiB '%s'", path), "no setting fits 30.0 MiB: the least needs 38.0 MiB (");
    /* 1000 TiB in one allocation: no memory tried holds it. */
    snprintf(path, sizeof path, "%s/huge.csv", scratch);
    write_text(path, "op,id,size,stream\na,1,1099511627776000,0\nf,1,1099511627776000,0\n");
    expect_refusal(tune("'%s'", path), "no setting fits 80.00 GiB: the least needs at least 1000.0 TiB");
    /* The same after allocations that did fit (so every row made backend calls): still no least known. */
    snprintf(path, sizeof path, "%s/huge-late.csv", scratch);
    write_text(path, "op,id,size,stream\na,1,1048576,0\na,2,1099511627776000,0\nf,2,1099511627776000,0\nf,1,1048576,0\n");
    expect_refusal(tune("'%s'", path), "no setting fits 80.00 GiB: the least needs at least 1000.0 TiB");
}

/* --max-calls: kept to, or status 1 naming the least any setting needs
 * (0: even the default, 3 calls here, is over it; the least is the fewest
 * calls of any fitting row). */
static void test_max_calls(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    three_csv(path, sizeof path);
    /* The least calls any fitting row makes (3 for the default: its three segments). */
    tally_json_t *all = tune_json(path, "--capacity 1GiB");
    int64_t least = INT64_MAX;
    for (size_t k = 0; k < all->len; k++)
        if (jtrue(&all->items[k], "fits") && jint(&all->items[k], "backend_calls") < least)
            least = jint(&all->items[k], "backend_calls");
    assert_int_equal(jint(&all->items[0], "backend_calls"), 3);
    assert_true(least >= 1 && least <= 3);
    tally__json_free(all);
    char want[128];
    snprintf(want, sizeof want, "no setting keeps within 0 backend calls: the least any setting needs is %lld (",
             (long long)least);
    expect_refusal(tune("--capacity 1GiB --max-calls 0 '%s'", path), want);
    tally_json_t *rows = tune_json(path, "--capacity 1GiB --max-calls 3");
    for (size_t k = 0; k < rows->len; k++)
        if (jtrue(&rows->items[k], "recommended") || jtrue(&rows->items[k], "recommended_tally"))
            assert_true(jint(&rows->items[k], "backend_calls") <= 3);
    tally__json_free(rows);
}

/* When several rows tie at the least calls or the least driver time, the
 * refusal names the first of them in the table's order: one block of 30 MiB,
 * which most settings serve with one device allocation (the default first). */
static void test_refusal_names_the_first_row_of_a_tie(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/one.csv", scratch);
    write_text(path, "op,id,size,stream\na,1,31457280,0\n");
    tally_json_t *rows = tune_json(path, "--capacity 1GiB");
    static const char *const key[2] = {"backend_calls", "driver_us_a100"};
    for (int by = 0; by < 2; by++) {
        double least = 1e300;
        size_t first = 0, ties = 0;
        for (size_t k = 0; k < rows->len; k++) {
            if (!jtrue(&rows->items[k], "fits"))
                continue;
            double v = by ? jnum(&rows->items[k], key[by]) : (double)jint(&rows->items[k], key[by]);
            if (v < least)
                least = v, first = k, ties = 1;
            else if (v == least)
                ties++;
        }
        if (ties < 2)
            fail_msg("one.csv: no tie at the least %s (%g): the test needs one", key[by], least);
        const char *setting = tally__json_get(&rows->items[first], "setting")->s;
        const char *allocator = tally__json_get(&rows->items[first], "allocator")->s;
        char want[512];
        if (by)
            snprintf(want, sizeof want,
                     "no setting keeps within 0.0 ms of driver time (A100): the least any setting needs is %.1f ms "
                     "(%s, %s)\n",
                     least / 1000.0, setting[0] ? setting : "the default", allocator);
        else
            snprintf(want, sizeof want,
                     "no setting keeps within 0 backend calls: the least any setting needs is %.0f (%s, %s)\n", least,
                     setting[0] ? setting : "the default", allocator);
        run_t r = by ? tune("--capacity 1GiB --max-driver-time 0 '%s'", path)
                     : tune("--capacity 1GiB --max-calls 0 '%s'", path);
        if (r.rc != 1 || !strstr(r.err, want))
            fail_msg("status %d, stderr '%s'; want '%s'", r.rc, r.err, want);
        run_free(&r);
    }
    tally__json_free(rows);
}

/* --max-driver-time: the modelled driver time of tests/standin/cost.c's
 * table. three.csv's default makes 3 cuMemAlloc: 3 x 230.45 us on the A100,
 * 3 x 83.8 on the Blackwell. PyTorch's expandable segments (the model) map 3
 * pages in 3 runs over 2 ranges: 3 x (193 cuMemCreate + 1.45 cuMemMap + 36
 * cuMemSetAccess) + 2 x 19 cuMemAddressReserve = 729.35 us on the A100. */

static void test_max_driver_time(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    three_csv(path, sizeof path);
    tally_json_t *rows = tune_json(path, "--capacity 1GiB");
    assert_float_equal(jnum(&rows->items[0], "driver_us_a100"), 691.35, 0.06);
    assert_float_equal(jnum(&rows->items[0], "driver_us_blackwell"), 251.4, 0.06);
    assert_float_equal(jnum(row_of(rows, "expandable_segments:True", "PyTorch (model)"), "driver_us_a100"), 729.35, 0.06);
    /* A budget under every row's time: refused, naming the least (whichever row that is). */
    double least = 1e300;
    for (size_t k = 0; k < rows->len; k++)
        if (jtrue(&rows->items[k], "fits") && jnum(&rows->items[k], "driver_us_a100") < least)
            least = jnum(&rows->items[k], "driver_us_a100");
    tally__json_free(rows);
    assert_true(least > 100 && least <= 691.35 + 0.06);
    char want[160];
    snprintf(want, sizeof want,
             "no setting keeps within 0.1 ms of driver time (A100): the least any setting needs is %.1f ms (",
             least / 1000.0);
    expect_refusal(tune("--capacity 1GiB --max-driver-time 0.1ms '%s'", path), want);
    /* A budget of 0 (or anything under 1 us) is still a budget: the table's two "no setting fits" lines name
     * it, and without --max-driver-time they name only the calls. */
    run_t r = tune("--capacity 1GiB --max-driver-time 0 '%s'", path);
    if (r.rc != 1 ||
        !strstr(r.out, "\nPyTorch's allocator: no setting fits in 1024.0 MiB within 64 backend calls and 0.0 ms of "
                       "driver time\n") ||
        !strstr(r.out, "\ntally: no setting fits in 1024.0 MiB within 64 backend calls and 0.0 ms of driver time\n") ||
        !strstr(r.err, "no setting keeps within 0.0 ms of driver time (A100)"))
        fail_msg("--max-driver-time 0: status %d, stderr '%s', stdout:\n%s", r.rc, r.err, r.out);
    run_free(&r);
    r = tune("--capacity 1GiB --max-calls 0 '%s'", path);
    if (r.rc != 1 || !strstr(r.out, "\nPyTorch's allocator: no setting fits in 1024.0 MiB within 0 backend calls\n") ||
        !strstr(r.out, "\ntally: no setting fits in 1024.0 MiB within 0 backend calls\n"))
        fail_msg("--max-calls 0: status %d, stderr '%s', stdout:\n%s", r.rc, r.err, r.out);
    run_free(&r);
    rows = tune_json(path, "--capacity 1GiB --gpu Blackwell --max-driver-time 300us");
    assert_non_null(rows);
    for (size_t k = 0; k < rows->len; k++)
        if (jtrue(&rows->items[k], "recommended") || jtrue(&rows->items[k], "recommended_tally"))
            assert_true(jnum(&rows->items[k], "driver_us_blackwell") <= 300);
    tally__json_free(rows);
    expect_one_line_error(tune("--max-driver-time 5min '%s'", path), 2, "--max-driver-time '5min' is not a duration");
    expect_one_line_error(tune("--gpu H100 '%s'", path), 2, "--gpu 'H100' is not a column of the driver cost table");
    /* Numbers that are empty or end in something else are not numbers. */
    expect_one_line_error(tune("--max-calls '' '%s'", path), 2, "--max-calls '' is not a non-negative integer");
    expect_one_line_error(tune("--max-calls 3x '%s'", path), 2, "--max-calls '3x' is not a non-negative integer");
    expect_one_line_error(tune("--jobs '' '%s'", path), 2, "--jobs '' is not an integer from 1 to 256");
    expect_one_line_error(tune("--jobs 257 '%s'", path), 2, "--jobs '257' is not an integer from 1 to 256");
    /* An empty --device would read as device 0 (strtol of "" is 0); it is refused like any other non-number
     * (on a CSV trace, which takes no --device at all, the value is checked first). */
    expect_one_line_error(tune("--device '' '%s'", path), 2, "--device '' is not a device number");
    expect_one_line_error(tune("--device '' '%s/small.pickle'", fixtures), 2, "--device '' is not a device number");
}

/* ---- bad input --------------------------------------------------------------------- */

static void test_api_bad_input(void **state)
{
    (void)state;
    expect_one_line_error(tune("'%s/empty.csv'", fixtures), 1, "empty.csv: empty trace: no allocations to replay");
    expect_one_line_error(tune("'%s/truncated.csv'", fixtures), 1,
                          "truncated.csv:5: expected 4 fields op,id,size,stream, got fewer");
    /* The fixture snapshot cut short. */
    char src[PATH_MAX + 32], cut[PATH_MAX + 32];
    snprintf(src, sizeof src, "%s/small.pickle", fixtures);
    snprintf(cut, sizeof cut, "%s/cut.pickle", scratch);
    char *data = slurp(src);
    assert_non_null(data);
    FILE *f = fopen(cut, "wb");
    assert_non_null(f);
    fwrite(data, 1, 300, f);
    fclose(f);
    free(data);
    expect_one_line_error(tune("'%s'", cut), 1, "cut.pickle: not a readable pickle: truncated");
    /* A pickle of plain data that is not a snapshot. */
    snprintf(cut, sizeof cut, "%s/list.pickle", scratch);
    f = fopen(cut, "wb");
    fwrite("\x80\x04]\x94.", 1, 5, f);
    fclose(f);
    expect_one_line_error(tune("'%s'", cut), 1, "PyTorch snapshot: the pickle holds a list, not a dict");
    expect_one_line_error(tune("'%s/no_size.pickle'", fixtures), 1,
                          "no_size.pickle: PyTorch snapshot: device_traces event[0]: 'size' is missing");
    expect_one_line_error(tune("--device 1 '%s/small.pickle'", fixtures), 1,
                          "small.pickle: PyTorch snapshot: no device 1 (device_traces has 1 device)");
    expect_one_line_error(tune("--device x '%s/small.pickle'", fixtures), 2, "--device 'x' is not a device number");
    /* Device numbers run from 0 to 1024: the last is looked for in the trace, past it and below 0 are no numbers. */
    expect_one_line_error(tune("--device 1024 '%s/small.pickle'", fixtures), 1,
                          "small.pickle: PyTorch snapshot: no device 1024 (device_traces has 1 device)");
    expect_one_line_error(tune("--device 1025 '%s/small.pickle'", fixtures), 2,
                          "--device '1025' is not a device number");
    expect_one_line_error(tune("--device -1 '%s/small.pickle'", fixtures), 2, "--device '-1' is not a device number");
    expect_one_line_error(tune("--capacity 80XB '%s/small.pickle'", fixtures), 2, "--capacity '80XB' is not a size");
    expect_one_line_error(tune("--capacity 0 '%s/small.pickle'", fixtures), 2, "--capacity '0' is not a size");
    expect_one_line_error(tune("--jobs 0 '%s/small.pickle'", fixtures), 2, "--jobs '0'");
    expect_one_line_error(tune("'%s/missing.csv'", fixtures), 1, "missing.csv: cannot open");
    expect_one_line_error(tune("%s", ""), 2, "FILE is missing");
    /* A JSON file that is not a report, and a report without a trace. */
    expect_one_line_error(tune("'%s/../memory_stats.json'", fixtures), 1, "not a tally report");
    expect_one_line_error(tune("'%s/../bad_report.json'", fixtures), 1, "bad_report.json");
}

/* ---- a report recorded with trace:true ------------------------------------------------ */

/* The child: 3 x (allocate 30 MB, 5 MB, 100 kB on the default stream and
 * 1 MB on another stream; free them in a different order); live peak
 * 30000000 + 5000000 + 100000 + 1000000 = 36100000 bytes. */
static int child_workload(void)
{
    void *s1 = (void *)0x5000;
    for (int step = 0; step < 3; step++) {
        void *a = tally_malloc(30000000, 0, NULL), *b = tally_malloc(5000000, 0, NULL);
        void *c = tally_malloc(100000, 0, NULL), *d = tally_malloc(1000000, 0, s1);
        if (!a || !b || !c || !d)
            return 3;
        tally_free(b);
        tally_free(a);
        tally_free(d);
        tally_free(c);
        usleep(20000); /* the report's times must show these pauses */
    }
    return 0;
}

/* Run the child workload with trace:true, its report written to path. */
static void record_traced(const char *path)
{
    char conf[PATH_MAX + 256];
    snprintf(conf, sizeof conf,
             "backend:host,host_mode:virtual,host_capacity:1GiB,trace:true,leak_report:off,stage_report:false,"
             "report_path:%s",
             path);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("TALLY_CONF", conf, 1);
        execl("/proc/self/exe", "test_tune", "--child", (char *)NULL);
        _exit(127);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void test_report_input(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/traced.json", scratch);
    record_traced(path);
    tune_input_t in;
    char err[512];
    if (tune_input_load(path, -1, &in, err, sizeof err))
        fail_msg("%s", err);
    assert_string_equal(in.kind, "tally report");
    assert_int_equal(in.trace.nev, 24);
    assert_int_equal(in.trace.nalloc, 12);
    assert_int_equal(in.trace.nstreams, 2);
    assert_int_equal(in.capacity, (int64_t)1 << 30); /* the device's memory, from the report */
    assert_int_equal(in.trace.ev[0].size, 30000000);
    assert_int_equal(in.trace.ev[4].op, 'f');
    assert_int_equal(in.trace.ev[4].size, 5000000);
    tune_input_free(&in);
    /* Times: start_us a moment ago; the events span the two 20 ms pauses between steps. */
    char *text = slurp(path);
    assert_non_null(text);
    tally_json_t *doc = tally__json_parse(text, strlen(text), NULL, 0, NULL);
    assert_non_null(doc);
    const tally_json_t *dev = tally__json_at(tally__json_get(doc, "alloc_trace"), 0);
    const tally_json_t *streams = tally__json_get(dev, "streams");
    assert_non_null(streams);
    assert_int_equal(streams->len, 2); /* one index per stream, not one per event */
    const tally_json_t *ev = tally__json_get(dev, "events");
    assert_non_null(ev);
    assert_int_equal(ev->type, TALLY_JSON_STRING);
    int64_t span = 0, start = jint(dev, "start_us");
    int nev = 0;
    for (const char *p = ev->s; p && *p; p = strchr(p, ' '), p = p ? p + 1 : NULL, nev++)
        span += strtoll(p, NULL, 10); /* each event's first field: µs since the previous one */
    assert_int_equal(nev, 24);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    int64_t now_us = (int64_t)now.tv_sec * 1000000 + now.tv_nsec / 1000;
    if (span < 40000 || span > 10000000 || start > now_us || start < now_us - 60000000)
        fail_msg("events span %lld us from %lld (now %lld)", (long long)span, (long long)start, (long long)now_us);
    tally__json_free(doc);
    free(text);
    tally_json_t *rows = tune_json(path, "");
    assert_int_equal(jint(&rows->items[0], "peak_live_bytes"), 36100000);
    assert_int_equal(jint(&rows->items[0], "capacity_bytes"), (int64_t)1 << 30);
    assert_null(tally__json_get(&rows->items[0], "recorded_peak_reserved_bytes"));
    tally__json_free(rows);
    /* Device 0 by name gives the same replay; a device that never allocated is named in the error. */
    rows = tune_json(path, "--device 0");
    assert_int_equal(jint(&rows->items[0], "peak_live_bytes"), 36100000);
    tally__json_free(rows);
    expect_one_line_error(tune("--device 3 '%s'", path), 1, "traced.json: alloc_trace has no device 3");
}

/* A traced report whose stats are damaged (a key misspelt) is refused in the
 * shape the other commands use, "byte N: devices[0].stats: why", N the byte
 * of the damage: tune's message ends exactly as tally summary's does. */
static void test_damaged_report_is_named_as_summary_names_it(void **state)
{
    (void)state;
    char path[PATH_MAX + 32], bad[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/traced-ok.json", scratch);
    snprintf(bad, sizeof bad, "%s/traced-bad.json", scratch);
    record_traced(path);
    char *text = slurp(path);
    assert_non_null(text);
    char *key = strstr(text, "\"active.all.allocated\"");
    assert_non_null(key);
    memmove(key + 13, key + 14, strlen(key + 14) + 1); /* "active.all.alocated" */
    write_text(bad, text);
    free(text);
    char args[PATH_MAX + 64];
    snprintf(args, sizeof args, "summary '%s'", bad);
    run_t s = run_tool(tally_bin, scratch, args);
    const char *shape = strstr(s.err, ": byte ");
    if (s.rc == 0 || !shape || !strstr(shape, ": devices[0].stats: unknown key \"active.all.alocated\""))
        fail_msg("tally summary: status %d, stderr '%s'", s.rc, s.err);
    run_t t = tune("'%s'", bad);
    const char *tail = strstr(t.err, ": byte ");
    if (t.rc == 0 || !tail || strcmp(tail, shape) != 0 || !strstr(t.err, "not a valid tally report"))
        fail_msg("tally tune: status %d, stderr '%s'; tally summary's ends '%s'", t.rc, t.err, shape);
    run_free(&t);
    run_free(&s);
}

/* Tracing switched on at run time: frees of blocks allocated before it
 * began become allocations placed first (as a snapshot's are). Events:
 * free 7 (100 B, from before), allocate 8 (50 B), free 8. */
static void test_report_trace_started_late(void **state)
{
    (void)state;
    char path[PATH_MAX + 32], err[512];
    snprintf(path, sizeof path, "%s/late.json", scratch);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"format\":\"tally-report\",\"alloc_trace\":[{\"device\":0,\"total_bytes\":1073741824,"
          "\"streams\":[0],\"events\":\"0,-7,100,0 3,8,50,0 1,-8,50,0\"}]}\n",
          f);
    fclose(f);
    tune_input_t in;
    if (tune_input_load(path, -1, &in, err, sizeof err))
        fail_msg("%s", err);
    assert_int_equal(in.prelive, 1);
    assert_int_equal(in.trace.nev, 4);
    static const char ops[] = "afaf";
    static const uint64_t sizes[] = {100, 100, 50, 50};
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(in.trace.ev[i].op, ops[i]);
        assert_int_equal(in.trace.ev[i].size, sizes[i]);
    }
    assert_int_equal(in.capacity, 1073741824);
    tune_input_free(&in);
}

/* Without --device, the device with the most events is replayed; of two
 * with as many (event strings of one length), the first listed. */
static void test_report_busiest_device_ties_go_to_the_first(void **state)
{
    (void)state;
    char path[PATH_MAX + 32], err[512];
    snprintf(path, sizeof path, "%s/tie.json", scratch);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"format\":\"tally-report\",\"alloc_trace\":["
          "{\"device\":0,\"streams\":[0],\"events\":\"0,1,100,0\"},"
          "{\"device\":1,\"streams\":[0],\"events\":\"0,1,200,0\"},"
          "{\"device\":2,\"streams\":[0],\"events\":\"0,1,30,0\"}]}\n",
          f);
    fclose(f);
    tune_input_t in;
    if (tune_input_load(path, -1, &in, err, sizeof err))
        fail_msg("%s", err);
    assert_int_equal(in.trace.nev, 1);
    assert_int_equal(in.trace.ev[0].size, 100); /* device 0's */
    tune_input_free(&in);
    /* Device 0 asked for where only device 1 traced: said so (0 is a device
     * like any other, not "none asked for"). */
    snprintf(path, sizeof path, "%s/dev1.json", scratch);
    write_text(path, "{\"format\":\"tally-report\",\"alloc_trace\":["
                     "{\"device\":1,\"streams\":[0],\"events\":\"0,1,200,0\"}]}\n");
    assert_int_not_equal(tune_input_load(path, 0, &in, err, sizeof err), 0);
    if (!strstr(err, "dev1.json: alloc_trace has no device 0"))
        fail_msg("--device 0 without a trace of it: %s", err);
}

/* A snapshot's busiest device is chosen the same way: of two devices with as
 * many trace events, the first listed; a device with more wins wherever it
 * stands. The sizes say which device's trace was read. */
static void test_snapshot_busiest_device_ties_go_to_the_first(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    static const struct {
        const char *traces;
        uint64_t first_size;
    } cases[] = {
        /* one event each: device 0's 1 MiB */
        {"[[ev(S, 1 * M)], [ev(S, 2 * M)], []]", 1 * MiB},
        /* device 0 and 2 tie with one event, device 1 has two */
        {"[[ev(S, 1 * M)], [ev(S, 2 * M), ev(S + 2 * M, M)], [ev(S, 3 * M)]]", 2 * MiB},
        /* devices 1 and 2 tie with two, ahead of device 0 */
        {"[[ev(S, 1 * M)], [ev(S, 2 * M), ev(S + 2 * M, M)], [ev(S, 3 * M), ev(S + 3 * M, M)]]", 2 * MiB},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char body[1024];
        snprintf(body, sizeof body,
                 "def ev(a, s):\n    return {\"action\": \"alloc\", \"addr\": a, \"size\": s, \"stream\": 0}\n"
                 "d = {\"device_traces\": %s, \"segments\": []}",
                 cases[i].traces);
        tune_input_t in;
        load_snapshot("tie.pickle", body, path, &in);
        if (in.trace.nev < 1 || in.trace.ev[0].size != cases[i].first_size)
            fail_msg("case %zu (%s): read device %d, first size %llu", i, cases[i].traces, in.device,
                     in.trace.nev ? (unsigned long long)in.trace.ev[0].size : 0ull);
        tune_input_free(&in);
    }
}

/* A report written without trace:true says how to get one. */
static void test_report_without_trace(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/plain.json", scratch);
    write_text(path, "{\"format\":\"tally-report\",\"alloc_trace\":[]}\n");
    FILE *f;
    expect_one_line_error(tune("'%s'", path), 1, "no allocation trace (record it with TALLY_CONF=trace:true)");
    /* An events string cut short, and a free of a block never allocated. */
    static const char *const bad[][2] = {
        {"0,1,100,0 5,2,200", "alloc_trace event 1: not 'dt,id,size,stream'"},
        {"0,-2,100,0 5,-2,100,0", "alloc_trace: block 2 freed twice before any allocation of it"},
        {"0,1,100,0 5,1,100,0", "alloc_trace event 1: allocation of id 1, which is already live"},
        {"0,1,100,7", "alloc_trace event 0: not 'dt,id,size,stream'"}, /* stream index 7 of 1 */
        /* Live bytes past 2^63 - 1 (every replayed figure is an int64_t); up to it is read. */
        {"0,1,9223372036854775807,0 5,2,1,0",
         "alloc_trace event 1: allocation of id 2 (1 bytes) takes the live bytes past 2^63 - 1 "
         "(9223372036854775807 live before it)"},
        {"0,1,18446744073709551615,0", "alloc_trace event 0: not 'dt,id,size,stream' with dt, size >= 0"},
        /* The same limit met only once block 7, freed at event 1 and so live
         * since before tracing began, is placed first (the second reading). */
        {"0,8,4611686018427387904,0 5,-7,4611686018427387904,0",
         "alloc_trace event 0: allocation of id 8 (4611686018427387904 bytes) takes the live bytes past 2^63 - 1 "
         "(4611686018427387904 live before it)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        f = fopen(path, "w");
        assert_non_null(f);
        fprintf(f, "{\"format\":\"tally-report\",\"alloc_trace\":[{\"device\":0,\"streams\":[0],\"events\":\"%s\"}]}\n",
                bad[i][0]);
        fclose(f);
        expect_one_line_error(tune("'%s'", path), 1, bad[i][1]);
    }
}

/* ---- the shared traces, when present ----------------------------------------------------- */

static const char *const snapshots[] = {"transformer-d768-l12-train",    "gpt2-small-compiled-train",
                                        "transformer-forward-ctx128",    "opt125m-zeroth-order-finetune",
                                        "transformer-train-4steps-cold", "transformer-xl-forward-ctx512-expandable",
                                        "transformer-medium-ctx1024-train"};

/* reference.json's figure for trace (a tiny look-up: the member after the
 * object whose "trace" is name). */
static int64_t reference(const tally_json_t *ref, const char *name, const char *key)
{
    for (size_t i = 0; i < ref->len; i++) {
        const tally_json_t *t = tally__json_get(&ref->items[i], "trace");
        if (t && strncmp(t->s, name, strlen(name)) == 0)
            return jint(&ref->items[i], key);
    }
    fail_msg("%s not in reference.json", name);
    return -1;
}

static void test_shared_snapshots(void **state)
{
    (void)state;
    if (!shared[0])
        SKIP("no shared traces: set TALLY_TRACES, or put them in ../shared/traces beside the repository");
    char path[PATH_MAX + 128], err[1024];
    snprintf(path, sizeof path, "%s/reference.json", shared);
    char *text = slurp(path);
    assert_non_null(text);
    tally_json_t *ref = tally__json_parse(text, strlen(text), NULL, 0, NULL);
    assert_non_null(ref);
    for (size_t k = 0; k < sizeof snapshots / sizeof *snapshots; k++) {
        tune_input_t snap;
        trace_t csv;
        snprintf(path, sizeof path, "%s/snapshots/%s.pickle", shared, snapshots[k]);
        if (tune_input_load(path, -1, &snap, err, sizeof err))
            fail_msg("%s", err);
        snprintf(path, sizeof path, "%s/%s.csv", shared, snapshots[k]);
        if (trace_load(path, &csv, err, sizeof err))
            fail_msg("%s", err);
        /* The same events as the CSV converted from it (ids aside). */
        assert_int_equal(snap.trace.nev, csv.nev);
        for (size_t i = 0; i < csv.nev; i++)
            if (snap.trace.ev[i].op != csv.ev[i].op || snap.trace.ev[i].size != csv.ev[i].size ||
                snap.trace.ev[i].slot != csv.ev[i].slot)
                fail_msg("%s: event %zu differs from the CSV", snapshots[k], i);
        /* PyTorch's own reserved peak as reference.json has it. */
        assert_int_equal(snap.recorded_peak, reference(ref, snapshots[k], "pytorch_native_peak_reserved_bytes"));
        assert_int_equal(snap.recorded_start, reference(ref, snapshots[k], "pytorch_native_reserved_at_start_bytes"));
        assert_int_equal(snap.recorded_segment_allocs,
                         reference(ref, snapshots[k], "pytorch_native_segment_allocs_in_window"));
        trace_free(&csv);
        tune_input_free(&snap);
        /* The replay of the recorded setting from the recorded state: PyTorch's peak, within 0.1%
         * (to the byte on all seven at this writing; docs/tune.md). */
        snprintf(path, sizeof path, "%s/snapshots/%s.pickle", shared, snapshots[k]);
        tally_json_t *rows = tune_json(path, "");
        int64_t want = reference(ref, snapshots[k], "pytorch_native_peak_reserved_bytes");
        int64_t got = jint(&rows->items[0], "recorded_replay_peak_reserved_bytes");
        if (llabs(got - want) * 1000 > want)
            fail_msg("%s: replay from the recorded state %lld, PyTorch %lld", snapshots[k], (long long)got,
                     (long long)want);
        tally__json_free(rows);
    }
    tally__json_free(ref);
    free(text);
}

/* On every shared trace, the recommendation reserves less than the default
 * whenever any fitting candidate within the budget does (tune_json checks
 * the rest of each row). */
static void test_shared_recommendation(void **state)
{
    (void)state;
    if (!shared[0])
        SKIP("no shared traces: set TALLY_TRACES, or put them in ../shared/traces beside the repository");
    char path[PATH_MAX + 128], err[512];
    char **list;
    int n = trace_dir_list(shared, &list, err, sizeof err);
    assert_true(n > 0);
    for (int i = 0; i < n; i++) {
        tally_json_t *rows = tune_json(list[i], "--max-calls 1000000");
        /* Each recommendation is the least reserving fitting row its allocator can run. */
        for (int pytorch = 0; pytorch < 2; pytorch++) {
            const char *other = pytorch ? "tally" : "PyTorch (model)";
            int64_t least = INT64_MAX;
            for (size_t k = 0; k < rows->len; k++)
                if (jtrue(&rows->items[k], "fits") && strcmp(tally__json_get(&rows->items[k], "allocator")->s, other) &&
                    jint(&rows->items[k], "peak_reserved_bytes") < least)
                    least = jint(&rows->items[k], "peak_reserved_bytes");
            for (size_t k = 0; k < rows->len; k++)
                if (jtrue(&rows->items[k], pytorch ? "recommended" : "recommended_tally"))
                    assert_int_equal(jint(&rows->items[k], "peak_reserved_bytes"), least);
        }
        tally__json_free(rows);
        free(list[i]);
    }
    free(list);
    (void)path;
}

static int setup(void **state)
{
    (void)state;
    char bin[PATH_MAX - 64]; /* .../build/tests */
    if (tune_setup("test_tune", "/tmp/tally-tune-XXXXXX", bin, sizeof bin))
        return -1;
    snprintf(fixtures, sizeof fixtures, "%s/../../tests/fixtures/tune", bin);
    /* ../shared/traces beside the repository (CI and here), or $TALLY_TRACES. */
    const char *env = getenv("TALLY_TRACES");
    char cand[PATH_MAX + 64];
    snprintf(cand, sizeof cand, "%s", env && *env ? env : "");
    if (!cand[0])
        snprintf(cand, sizeof cand, "%s/../../../shared/traces", bin);
    char real[PATH_MAX], ref[PATH_MAX + 32];
    if (realpath(cand, real)) {
        snprintf(ref, sizeof ref, "%s/reference.json", real);
        if (access(ref, R_OK) == 0)
            snprintf(shared, sizeof shared, "%s", real);
    }
    return 0;
}


int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--child") == 0)
        return child_workload();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_sizes_below_100_kib_are_bytes),
        cmocka_unit_test(test_run_without_its_shared_table_returns_minus_one),
        cmocka_unit_test(test_series_is_the_wanted_rows_own),
        cmocka_unit_test(test_recommendation_says_what_it_runs_in_without_a_replay_running_out),
        cmocka_unit_test(test_pickle_plain_data),
        cmocka_unit_test(test_pickle_refuses_bad_input),
        cmocka_unit_test(test_pickle_memo_slot_in_a_gap_was_never_stored),
        cmocka_unit_test(test_pickle_dict_from_marked_items),
        cmocka_unit_test(test_pickle_stack_opcodes),
        cmocka_unit_test(test_pytorch_expandable_model_counts_pages),
        cmocka_unit_test(test_replays_wait_out_interrupting_signals),
        cmocka_unit_test(test_split_candidates_are_quantiles_above_20_mib),
        cmocka_unit_test(test_snapshot_rules),
        cmocka_unit_test(test_snapshot_read_out_of_host_memory_is_an_error),
        cmocka_unit_test(test_snapshot_command),
        cmocka_unit_test(test_rows_give_peak_reserved),
        cmocka_unit_test(test_snapshot_recorded_setting),
        cmocka_unit_test(test_snapshot_unsupported_setting),
        cmocka_unit_test(test_snapshot_unsupported_setting_json_errors_only_where_a_row_failed),
        cmocka_unit_test(test_plot),
        cmocka_unit_test(test_two_recommendations),
        cmocka_unit_test(test_tie_goes_to_fewer_calls),
        cmocka_unit_test(test_torch_version),
        cmocka_unit_test(test_recorded_state),
        cmocka_unit_test(test_snapshot_without_streams_is_stream_0),
        cmocka_unit_test(test_recorded_setting_with_quotes_and_backslashes_reads_back),
        cmocka_unit_test(test_release),
        cmocka_unit_test(test_expandable_recording),
        cmocka_unit_test(test_csv_start_unknown),
        cmocka_unit_test(test_default_call_budget_counts_allocations_and_frees),
        cmocka_unit_test(test_stream_pools),
        cmocka_unit_test(test_cross_stream_snapshot),
        cmocka_unit_test(test_multistream_trace),
        cmocka_unit_test(test_least_memory),
        cmocka_unit_test(test_least_memory_just_above_the_device_given),
        cmocka_unit_test(test_least_memory_stops_at_a_bracket_as_wide_as_its_step),
        cmocka_unit_test(test_least_memory_runs_out_in_the_largest_capacity_tried),
        cmocka_unit_test(test_least_memory_of_every_row_is_a_device_it_runs_in),
        cmocka_unit_test(test_capacity),
        cmocka_unit_test(test_max_calls),
        cmocka_unit_test(test_refusal_names_the_first_row_of_a_tie),
        cmocka_unit_test(test_max_driver_time),
        cmocka_unit_test(test_api_bad_input),
        cmocka_unit_test(test_report_input),
        cmocka_unit_test(test_damaged_report_is_named_as_summary_names_it),
        cmocka_unit_test(test_report_trace_started_late),
        cmocka_unit_test(test_report_busiest_device_ties_go_to_the_first),
        cmocka_unit_test(test_snapshot_busiest_device_ties_go_to_the_first),
        cmocka_unit_test(test_snapshot_live_block_without_size_is_rounded),
        cmocka_unit_test(test_snapshot_remainder_under_512_stays_with_its_block),
        cmocka_unit_test(test_snapshot_freed_segments_join_their_pool),
        cmocka_unit_test(test_report_without_trace),
        cmocka_unit_test(test_shared_snapshots),
        cmocka_unit_test(test_shared_recommendation),
    };
    /* The slowest suite: TALLY_TEST_FILTER=test_max_* runs only the tests named (cmocka's pattern). */
    if (getenv("TALLY_TEST_FILTER"))
        cmocka_set_test_filter(getenv("TALLY_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, tune_teardown);
}
