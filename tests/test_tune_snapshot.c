/* Tests for how tally tune reads a PyTorch snapshot (tools/tune_input.c,
 * tools/pickle.c and bench/trace.c, compiled in): the events and the
 * recorded state it makes of one (the rules, worked by hand on
 * tests/fixtures/tune/small.pickle and on snapshots written here with
 * python3: no streams, live blocks without a size, a remainder under 512
 * bytes, segments the window frees), which device it reads when several
 * traced, and the read failing at each of its allocations while the host is
 * out of memory. With ../shared/traces beside the repository (or
 * $TALLY_TRACES), every shared snapshot is also checked against the CSV
 * converted from it and against reference.json, and on every shared trace
 * each recommendation is the least reserving fitting row (the built
 * ../bin/tally, run as a user runs it). */
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

static char shared[PATH_MAX];

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

/* Blocks live before recording inside a segment the window itself
 * allocated (its segment_alloc event undoes it: it was not there before)
 * lie outside the recorded state, so the replay starts from an empty cache
 * and says how many, as one line: "1 block ... lies", "2 blocks ... lie". */
static void test_snapshot_blocks_outside_the_recorded_segments_are_counted(void **state)
{
    (void)state;
    static const char *const bodies[2] = {
        "def blk(a):\n"
        "    return dict(address=a, size=512, requested_size=512, state=\"active_allocated\")\n"
        "d = {\"device_traces\": [[{\"action\": \"segment_alloc\", \"addr\": S, \"size\": 2 * M, \"stream\": 0}]],\n"
        " \"segments\": [{\"address\": S, \"device\": 0, \"segment_type\": \"small\", \"total_size\": 2 * M,\n"
        "   \"blocks\": [blk(S)]}]}",
        "def blk(a):\n"
        "    return dict(address=a, size=512, requested_size=512, state=\"active_allocated\")\n"
        "d = {\"device_traces\": [[{\"action\": \"segment_alloc\", \"addr\": S, \"size\": 2 * M, \"stream\": 0}]],\n"
        " \"segments\": [{\"address\": S, \"device\": 0, \"segment_type\": \"small\", \"total_size\": 2 * M,\n"
        "   \"blocks\": [blk(S), blk(S + 512)]}]}",
    };
    static const char *const want[2] = {
        "1 block live before recording lies outside the segments it had then; the replay starts from an empty cache",
        "2 blocks live before recording lie outside the segments it had then; the replay starts from an empty cache",
    };
    for (int k = 0; k < 2; k++) {
        char path[PATH_MAX + 32], name[32];
        tune_input_t in;
        snprintf(name, sizeof name, "outside%d.pickle", k + 1);
        load_snapshot(name, bodies[k], path, &in);
        assert_false(in.start.known);
        assert_string_equal(in.start.gap, want[k]);
        tune_input_free(&in);
    }
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
    if (tune_setup("test_tune_snapshot", "/tmp/tally-tune-snapshot-XXXXXX", bin, sizeof bin))
        return -1;
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_snapshot_rules),
        cmocka_unit_test(test_snapshot_read_out_of_host_memory_is_an_error),
        cmocka_unit_test(test_snapshot_without_streams_is_stream_0),
        cmocka_unit_test(test_snapshot_busiest_device_ties_go_to_the_first),
        cmocka_unit_test(test_snapshot_live_block_without_size_is_rounded),
        cmocka_unit_test(test_snapshot_blocks_outside_the_recorded_segments_are_counted),
        cmocka_unit_test(test_snapshot_remainder_under_512_stays_with_its_block),
        cmocka_unit_test(test_snapshot_freed_segments_join_their_pool),
        cmocka_unit_test(test_shared_snapshots),
        cmocka_unit_test(test_shared_recommendation),
    };
    tune_test_filter();
    return cmocka_run_group_tests(tests, setup, tune_teardown);
}
