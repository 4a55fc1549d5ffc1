/* Tests for tally tune on tally's own reports: one recorded with
 * trace:true by a child of this binary (run as "--child", on the host
 * backend), read with tools/tune_input.c (compiled in) and
 * tune_input_report.c (linked: its events, streams, the device's memory
 * and the events' times) and replayed by the command
 * (the built ../bin/tally, run as a user runs it); a trace switched on late
 * (frees of blocks from before it), the busiest device of a tie, and a
 * report without a trace, with a bad events string or with damaged stats,
 * each refused in one line (as tally summary refuses a damaged one). */
/* The readers under test first: cmocka.h defines a macro named fail. */
#include "../tools/pickle.c"
#include "../tools/tune_input.c"
#include "../bench/trace.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cliutil.h"
#include "report/json.h"
#include "tally.h"
#include "tuneutil.h"
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
        execl("/proc/self/exe", "test_tune_report", "--child", (char *)NULL);
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

static int setup(void **state)
{
    (void)state;
    char bin[PATH_MAX - 64]; /* .../build/tests */
    return tune_setup("test_tune_report", "/tmp/tally-tune-report-XXXXXX", bin, sizeof bin);
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--child") == 0)
        return child_workload();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_report_input),
        cmocka_unit_test(test_damaged_report_is_named_as_summary_names_it),
        cmocka_unit_test(test_report_trace_started_late),
        cmocka_unit_test(test_report_busiest_device_ties_go_to_the_first),
        cmocka_unit_test(test_report_without_trace),
    };
    tune_test_filter();
    return cmocka_run_group_tests(tests, setup, tune_teardown);
}
