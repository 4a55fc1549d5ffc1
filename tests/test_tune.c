/* Tests for tally tune: the pickle reader and the snapshot rules (compiled
 * in from tools/, on fixtures whose expected values are worked out by hand
 * in the comments), and the command itself run as a user runs it (the
 * built ../bin/tally): CSV, snapshot and report inputs, the JSON rows, the
 * recommendation, and one-line errors for bad input. With ../shared/traces
 * beside the repository, every shared snapshot is also checked against the
 * CSV converted from it and against reference.json. */
/* The readers under test first: cmocka.h defines a macro named fail. */
#include "../tools/pickle.c"
#include "../tools/tune_input.c"
#include "../bench/trace.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cliutil.h"
#include "json.h"

#define MiB ((uint64_t)1 << 20)

static char tally_bin[PATH_MAX], fixtures[PATH_MAX], shared[PATH_MAX], scratch[PATH_MAX];

/* ---- running the command ------------------------------------------------------- */

__attribute__((format(printf, 1, 2))) static run_t tune(const char *fmt, ...)
{
    char args[2048] = "tune -q ";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args + strlen(args), sizeof args - strlen(args), fmt, ap);
    va_end(ap);
    return run_tool(tally_bin, scratch, args);
}

/* An error: the given status, nothing on stdout, exactly one line on stderr
 * containing want. */
static void expect_one_line_error(run_t r, int rc, const char *want)
{
    if (r.rc != rc || r.out[0] || !strstr(r.err, want) || strchr(r.err, '\n') != r.err + strlen(r.err) - 1)
        fail_msg("status %d (want %d), stdout '%s', stderr '%s' (want one line with '%s')", r.rc, rc, r.out, r.err,
                 want);
    run_free(&r);
}

static int64_t jint(const tally_json_t *o, const char *key)
{
    int64_t v = -1;
    if (tally__json_int(tally__json_get(o, key), &v))
        fail_msg("no integer '%s'", key);
    return v;
}

static bool jtrue(const tally_json_t *o, const char *key)
{
    const tally_json_t *v = tally__json_get(o, key);
    return v && v->type == TALLY_JSON_TRUE;
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
    int recommended = 0;
    for (size_t i = 0; i < rows->len; i++) {
        const tally_json_t *row = &rows->items[i];
        assert_int_equal(jint(row, "peak_live_bytes"), jint(def, "peak_live_bytes"));
        assert_true(jint(row, "peak_reserved_bytes") >= jint(row, "peak_live_bytes") || !jtrue(row, "fits"));
        assert_true(jint(row, "backend_calls") >= 1);
        if (jtrue(row, "recommended")) {
            recommended++;
            /* Never more than the default, and the least among the fitting rows within the budget it had. */
            assert_true(jint(row, "peak_reserved_bytes") <= jint(def, "peak_reserved_bytes"));
        }
    }
    assert_int_equal(recommended, 1);
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

/* ---- the snapshot rules ---------------------------------------------------------- */

/* tests/fixtures/tune/small.pickle (made with Python's pickle from a dict):
 *   segments: A at 16 MiB, 20 MiB, block A (4 MiB, requested 4000000) active,
 *             never allocated in the window: live before recording;
 *             B at 64 MiB, 2 MiB, block B (requested 1000) active, allocated in the window
 *   trace: free_requested A+4MiB size 3000000   (allocated before recording)
 *          free_completed (ignored), segment_alloc 2 MiB, alloc B 1000, alloc B+1024 500,
 *          free_requested B+1024, segment_free 2 MiB
 * Events: a 3000000, a 4000000 (the two live before recording, first), then
 * f 3000000, a 1000, a 500, f 500. Reserved at the start: 22 MiB at dump less
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
    } want[] = {{'a', 3000000, 0}, {'a', 4000000, 1}, {'f', 3000000, 0}, {'a', 1000, 2}, {'a', 500, 3}, {'f', 500, 3}};
    assert_int_equal(in.trace.nev, 6);
    for (size_t i = 0; i < 6; i++) {
        assert_int_equal(in.trace.ev[i].op, want[i].op);
        assert_int_equal(in.trace.ev[i].size, want[i].size);
        assert_int_equal(in.trace.ev[i].slot, want[i].slot);
    }
    assert_true(in.has_recorded);
    assert_int_equal(in.recorded_start, 22 * MiB);
    assert_int_equal(in.recorded_peak, 24 * MiB);
    assert_string_equal(in.recorded_conf, "");
    tune_input_free(&in);
}

/* The table of `tally tune FIXTURE` (status 0) holds both texts. */
static void expect_table(const char *fixture, const char *want1, const char *want2)
{
    run_t r = tune("'%s/%s'", fixtures, fixture);
    assert_int_equal(r.rc, 0);
    if (!strstr(r.out, want1) || !strstr(r.out, want2) || !strstr(r.out, "recommendation:"))
        fail_msg("table of %s lacks '%s' or '%s':\n%s", fixture, want1, want2, r.out);
    run_free(&r);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
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
    /* PyTorch's figure next to the replay of the same setting, and the difference. */
    expect_table("small.pickle", "recorded by PyTorch (PYTORCH_CUDA_ALLOC_CONF=\"\"): peak reserved 24.0 MiB",
                 "replay of the same setting: 22.0 MiB; difference -2.0 MiB (-8.33%)");
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
                 "replay of the same setting: 22.0 MiB; difference -2.0 MiB");
}

/* A job recorded with a key tally cannot replay: that row fails, the
 * comparison says so, and the rest of the grid still gives a recommendation. */
static void test_snapshot_unsupported_setting(void **state)
{
    (void)state;
    expect_table("small_unsupported.pickle",
                 "replay of the same setting failed: config: key 'pinned_use_cuda_host_register'",
                 "recommendation: expandable_segments:True");
}

/* --plot draws the default and the recommendation, named in the legend. */
static void test_plot(void **state)
{
    (void)state;
    char svg[PATH_MAX + 32];
    snprintf(svg, sizeof svg, "%s/tune.svg", scratch);
    run_t r = tune("--plot '%s' '%s/small.pickle'", svg, fixtures);
    assert_int_equal(r.rc, 0);
    run_free(&r);
    char *text = slurp(svg);
    assert_non_null(text);
    int paths = 0;
    for (const char *p = text; (p = strstr(p, "<path")); p++)
        paths++;
    assert_int_equal(paths, 2);
    if (!strstr(text, ">PyTorch's default</text>") || !strstr(text, "</svg>"))
        fail_msg("svg:\n%s", text);
    free(text);
    expect_one_line_error(tune("--plot /nonexistent/dir/x.svg '%s/small.pickle'", fixtures), 1, "cannot write");
}

/* ---- bad input --------------------------------------------------------------------- */

static void test_bad_input(void **state)
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

static void test_report_input(void **state)
{
    (void)state;
    char conf[PATH_MAX + 256], path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/traced.json", scratch);
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

static const char *const snapshots[] = {"transformer-d768-l12-train", "gpt2-small-compiled-train",
                                        "transformer-forward-ctx128", "opt125m-zeroth-order-finetune"};

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
        skip();
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
        skip();
    char path[PATH_MAX + 128], err[512];
    char **list;
    int n = trace_dir_list(shared, &list, err, sizeof err);
    assert_true(n > 0);
    for (int i = 0; i < n; i++) {
        tally_json_t *rows = tune_json(list[i], "--max-calls 1000000");
        const tally_json_t *def = &rows->items[0];
        int64_t least = jint(def, "peak_reserved_bytes");
        for (size_t k = 0; k < rows->len; k++)
            if (jtrue(&rows->items[k], "fits") && jint(&rows->items[k], "peak_reserved_bytes") < least)
                least = jint(&rows->items[k], "peak_reserved_bytes");
        for (size_t k = 0; k < rows->len; k++)
            if (jtrue(&rows->items[k], "recommended"))
                assert_int_equal(jint(&rows->items[k], "peak_reserved_bytes"), least);
        tally__json_free(rows);
        free(list[i]);
    }
    free(list);
    (void)path;
}

static int setup(void **state)
{
    (void)state;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return -1;
    exe[n] = 0;
    char *bin = dirname(exe); /* .../build/tests */
    snprintf(tally_bin, sizeof tally_bin, "%s/../bin/tally", bin);
    snprintf(fixtures, sizeof fixtures, "%s/../../tests/fixtures/tune", bin);
    if (access(tally_bin, X_OK) != 0) {
        fprintf(stderr, "test_tune: %s is missing (make builds it)\n", tally_bin);
        return -1;
    }
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
    snprintf(scratch, sizeof scratch, "/tmp/tally-tune-XXXXXX");
    return mkdtemp(scratch) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", scratch);
    return system(cmd) == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--child") == 0)
        return child_workload();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pickle_plain_data),
        cmocka_unit_test(test_pickle_refuses_bad_input),
        cmocka_unit_test(test_pickle_dict_from_marked_items),
        cmocka_unit_test(test_snapshot_rules),
        cmocka_unit_test(test_snapshot_command),
        cmocka_unit_test(test_rows_give_peak_reserved),
        cmocka_unit_test(test_snapshot_recorded_setting),
        cmocka_unit_test(test_snapshot_unsupported_setting),
        cmocka_unit_test(test_plot),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_report_input),
        cmocka_unit_test(test_report_trace_started_late),
        cmocka_unit_test(test_report_without_trace),
        cmocka_unit_test(test_shared_snapshots),
        cmocka_unit_test(test_shared_recommendation),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
