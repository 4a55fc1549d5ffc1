/* Tests for tally tune's replays following what was recorded, through the
 * command (the built ../bin/tally, run as a user runs it), with
 * tools/tune_input.c compiled in to look at what it read: a snapshot's
 * recorded setting replayed from the recorded state and set beside
 * PyTorch's own figure (a setting outside the grid, one tally cannot run,
 * one with quotes and backslashes), the cached segments PyTorch held when
 * recording began, releases of cached memory (empty_cache), recordings made
 * with expandable segments, and streams: each keeps its pools, and a block
 * freed from another stream goes back to its own (hand traces, a snapshot
 * whose frees complete late, a two-stream trace). Expected figures are
 * worked out by hand in the comments. */
/* The readers under test first: cmocka.h defines a macro named fail. */
#include "../tools/pickle.c"
#include "../tools/tune_input.c"
#include "../bench/trace.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "skip.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cliutil.h"
#include "report/json.h"
#include "tuneutil.h"

/* ---- the recorded setting beside PyTorch's figure ---------------------------------- */

/* The table of `tally tune FIXTURE` (status 0) holds both texts. */
static void expect_table(const char *fixture, const char *want1, const char *want2)
{
    run_t r = tune("'%s/%s'", fixtures, fixture);
    assert_int_equal(r.rc, 0);
    if (!strstr(r.out, want1) || !strstr(r.out, want2) || !strstr(r.out, "PyTorch's allocator:"))
        fail_msg("table of %s lacks '%s' or '%s':\n%s", fixture, want1, want2, r.out);
    run_free(&r);
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

static int setup(void **state)
{
    (void)state;
    char bin[PATH_MAX - 64]; /* .../build/tests */
    return tune_setup("test_tune_recorded", "/tmp/tally-tune-recorded-XXXXXX", bin, sizeof bin);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_snapshot_command),
        cmocka_unit_test(test_snapshot_recorded_setting),
        cmocka_unit_test(test_snapshot_unsupported_setting),
        cmocka_unit_test(test_snapshot_unsupported_setting_json_errors_only_where_a_row_failed),
        cmocka_unit_test(test_recorded_state),
        cmocka_unit_test(test_recorded_setting_with_quotes_and_backslashes_reads_back),
        cmocka_unit_test(test_release),
        cmocka_unit_test(test_expandable_recording),
        cmocka_unit_test(test_stream_pools),
        cmocka_unit_test(test_cross_stream_snapshot),
        cmocka_unit_test(test_multistream_trace),
    };
    tune_test_filter();
    return cmocka_run_group_tests(tests, setup, tune_teardown);
}
