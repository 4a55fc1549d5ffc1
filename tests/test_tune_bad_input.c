/* Tests for tally tune's readers on what goes wrong: the pickle reader on
 * every opcode it takes or refuses, snapshots and reports with a field
 * missing or of the wrong type, and reading while the host is out of
 * memory (the readers are compiled in from tools/ with realloc counted, and
 * made to fail at each call in turn). Snapshots are written from
 * Python-like literals (pickle_of, tests/pickleutil.h), so each case reads
 * as the data it holds. The command itself on bad input, run as a user
 * runs it, is in test_tune_bad_input_command.c. */
#include <stdlib.h>
/* The realloc numbered realloc_fail_at (0: the first; -1: none) returns
 * NULL, as when the host is out of memory; reallocs counts them. */
static long realloc_fail_at = -1, reallocs;
static void *counted_realloc(void *p, size_t n)
{
    if (reallocs++ == realloc_fail_at)
        return NULL;
    return realloc(p, n);
}
#define realloc counted_realloc
#include "../tools/pickle.c"
#include "../tools/tune_input.c"
#include "../bench/trace.c"
#undef realloc
/* pt_expand.c has static helpers of the same names as pickle.c's. */
#define grow ptx_test_grow
#include "../tools/pt_expand.c"
#undef grow

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "cliutil.h"
#include "report/json.h"
#include "tuneutil.h"
#include "pickleutil.h"

#define MiB ((uint64_t)1 << 20)

/* ---- the pickle reader ---------------------------------------------------------- */

static void expect_pickle_error(const unsigned char *src, size_t len, const char *want)
{
    unsigned char *data = malloc(len);
    memcpy(data, src, len);
    pk_doc_t doc;
    char err[512];
    if (pk_parse(data, len, &doc, "bad.pickle", err, sizeof err) == 0)
        fail_msg("parsed; expected '%s'", want);
    if (strcmp(err, want) != 0)
        fail_msg("error '%s', expected '%s'", err, want);
}

/* Each opcode that would construct an object is refused by its name. */
static void test_pickle_names_each_opcode_that_constructs_an_object(void **state)
{
    (void)state;
    static const struct {
        unsigned char op;
        const char *name;
    } ops[] = {{0x93, "STACK_GLOBAL"}, {0x81, "NEWOBJ"}, {0x92, "NEWOBJ_EX"}, {0x82, "EXT"},
               {0x83, "EXT"},          {0x84, "EXT"},    {'b', "BUILD"},      {'o', "OBJ"}};
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
        const unsigned char src[] = {0x80, 0x02, 'N', 'N', ops[i].op, '.'};
        char want[256];
        snprintf(want, sizeof want,
                 "bad.pickle: not a readable pickle: opcode %s would construct an object; only plain data (dicts, "
                 "lists, strings, numbers) is read (at byte 4)",
                 ops[i].name);
        expect_pickle_error(src, sizeof src, want);
    }
}

/* Strings and bytes under each length width: BINUNICODE8 (8-byte length),
 * SHORT_BINBYTES (1), BINBYTES (4), BINBYTES8 (8), in a list built with
 * MARK ... LIST. */
static void test_pickle_reads_strings_and_bytes_of_every_length_width(void **state)
{
    (void)state;
    static const unsigned char src[] = {0x80, 0x04, '(', 0x8d, 2, 0, 0, 0, 0, 0, 0, 0, 'a', 'b',
                                        'C',  3,    'c', 'd', 'e', 'B', 4, 0, 0, 0, 'f', 'g', 'h', 'i',
                                        0x8e, 1,    0,   0,   0,   0,   0, 0, 0, 'j', 'l', '.'};
    unsigned char *data = malloc(sizeof src);
    memcpy(data, src, sizeof src);
    pk_doc_t doc;
    char err[256];
    if (pk_parse(data, sizeof src, &doc, "widths.pickle", err, sizeof err))
        fail_msg("%s", err);
    const pk_value_t *l = doc.root;
    assert_int_equal(l->type, PK_LIST);
    assert_int_equal(l->n, 4);
    static const struct {
        pk_type_t type;
        const char *text;
    } want[] = {{PK_STR, "ab"}, {PK_BYTES, "cde"}, {PK_BYTES, "fghi"}, {PK_BYTES, "j"}};
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(l->items[i]->type, want[i].type);
        assert_int_equal(l->items[i]->len, strlen(want[i].text));
        assert_memory_equal(l->items[i]->s, want[i].text, strlen(want[i].text));
    }
    pk_free(&doc);
}

/* The errors of the protocol and of the marks, each with its byte. */
static void test_pickle_refuses_bad_protocol_and_unmarked_items(void **state)
{
    (void)state;
    static const unsigned char proto1[] = {0x80, 0x01, 'N', '.'};
    expect_pickle_error(proto1, sizeof proto1, "bad.pickle: not a readable pickle: protocol 1 (2 to 5 are read) (at byte 2)");
    static const unsigned char proto6[] = {0x80, 0x06, 'N', '.'};
    expect_pickle_error(proto6, sizeof proto6, "bad.pickle: not a readable pickle: protocol 6 (2 to 5 are read) (at byte 2)");
    static const unsigned char list[] = {0x80, 0x02, 'N', 'l', '.'};
    expect_pickle_error(list, sizeof list, "bad.pickle: not a readable pickle: items without a MARK (at byte 4)");
    static const unsigned char pop_mark[] = {0x80, 0x02, 'N', '1', '.'};
    expect_pickle_error(pop_mark, sizeof pop_mark, "bad.pickle: not a readable pickle: items without a MARK (at byte 4)");
}

/* A pickle cut right after an opcode's whole argument lacks only its STOP;
 * one cut inside the argument names the opcode cut short. */
static void test_pickle_cut_after_an_argument_lacks_only_its_stop(void **state)
{
    (void)state;
    static const char stop[] = "bad.pickle: not a readable pickle: truncated: the file ends before the STOP opcode";
    static const struct {
        unsigned char src[12];
        size_t len;
        const char *cut; /* the error one byte shorter */
    } cases[] = {
        {{0x80, 0x02}, 2, "truncated PROTO (at byte 1)"},
        {{0x80, 0x02, 'K', 5}, 4, "truncated BININT1 (at byte 3)"},
        {{0x80, 0x02, 'M', 5, 0}, 5, "truncated BININT2 (at byte 3)"},
        {{0x80, 0x02, 'J', 5, 0, 0, 0}, 7, "truncated BININT (at byte 3)"},
        {{0x80, 0x02, 'N', 'q', 1}, 5, "truncated BINPUT (at byte 4)"},
        {{0x80, 0x04, 0x95, 1, 0, 0, 0, 0, 0, 0, 0}, 11, "truncated FRAME (at byte 3)"},
        {{0x80, 0x02, 'X', 2, 0, 0, 0, 'a', 'b'}, 9, NULL},
        {{0x80, 0x02, 'C', 3, 'c', 'd', 'e'}, 7, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char want[256];
        snprintf(want, sizeof want, "%s (at byte %zu)", stop, cases[i].len);
        expect_pickle_error(cases[i].src, cases[i].len, want);
        if (cases[i].cut) {
            snprintf(want, sizeof want, "bad.pickle: not a readable pickle: %s", cases[i].cut);
            expect_pickle_error(cases[i].src, cases[i].len - 1, want);
        }
    }
}

/* A file that cannot be opened, and one that cannot be read (a folder). */
static void test_pickle_file_that_cannot_be_opened_or_read(void **state)
{
    (void)state;
    pk_doc_t doc;
    char err[PATH_MAX + 128], path[PATH_MAX + 32], want[PATH_MAX + 128];
    snprintf(path, sizeof path, "%s/missing.pickle", scratch);
    assert_int_not_equal(pk_load(path, &doc, err, sizeof err), 0);
    snprintf(want, sizeof want, "%s: cannot open: No such file or directory", path);
    assert_string_equal(err, want);
    assert_int_not_equal(pk_load(scratch, &doc, err, sizeof err), 0);
    snprintf(want, sizeof want, "%s: read error", scratch);
    assert_string_equal(err, want);
}

/* ---- snapshots ------------------------------------------------------------------- */

/* tune_snapshot_parse on the pickle of literal fails with exactly want
 * ("hand.pickle: PyTorch snapshot: " before it). */
static void expect_snapshot_error(const char *literal, const char *want)
{
    size_t n;
    unsigned char *data = pickle_of(literal, &n);
    tune_input_t in;
    char err[512], full[600];
    snprintf(full, sizeof full, "hand.pickle: PyTorch snapshot: %s", want);
    if (tune_snapshot_parse(data, n, "hand.pickle", &in, err, sizeof err) == 0)
        fail_msg("read %s; expected '%s'", literal, full);
    tune_input_free(&in);
    if (strcmp(err, full) != 0)
        fail_msg("%s:\nerror '%s'\nexpected '%s'", literal, err, full);
}

#define TRACE_OF(ev) "'device_traces': [[" ev "]]}"
#define ONE_ALLOC "{'action': 'alloc', 'addr': 4096, 'size': 512, 'stream': 0}"

/* A segment or block with a field missing or not an integer, and the other
 * parts a snapshot needs, each named. */
static void test_snapshot_names_each_bad_segment_field(void **state)
{
    (void)state;
    expect_snapshot_error("{'segments': [{'device': 'x'}], " TRACE_OF(ONE_ALLOC),
                          "segments[0]: 'device' is a str, not an integer");
    expect_snapshot_error("{'segments': [{'device': 0}], " TRACE_OF(ONE_ALLOC), "segments[0]: 'total_size' is missing");
    expect_snapshot_error("{'segments': [{'total_size': 2097152, 'stream': None}], " TRACE_OF(ONE_ALLOC),
                          "segments[0]: 'stream' is a None, not an integer");
    expect_snapshot_error("{'segments': [{'total_size': 2097152, 'blocks': 7}], " TRACE_OF(ONE_ALLOC),
                          "'segments[].blocks' is int, not a list");
    expect_snapshot_error("{'segments': [{'total_size': 2097152, 'blocks': [{'state': 'active_allocated'}]}], "
                          TRACE_OF(ONE_ALLOC), "segments[].blocks[0]: 'address' is missing");
    expect_snapshot_error("{'segments': [{'total_size': 2097152, 'blocks': [{'state': 'active_allocated', "
                          "'address': 0}]}], " TRACE_OF(ONE_ALLOC),
                          "segments[].blocks[0]: 'requested_size' is missing");
    expect_snapshot_error("{'segments': [{'total_size': 2097152, 'blocks': [{'state': 'active_allocated', "
                          "'address': 0, 'requested_size': 8, 'size': 'big'}]}], " TRACE_OF(ONE_ALLOC),
                          "segments[].blocks[0]: 'size' is a str, not an integer");
    /* A block smaller than what was asked for (PyTorch's never is). */
    expect_snapshot_error("{'segments': [{'total_size': 2097152, 'blocks': [{'state': 'active_allocated', "
                          "'address': 0, 'requested_size': 8, 'size': 1}]}], " TRACE_OF(ONE_ALLOC),
                          "segments[].blocks[0]: 'size' 1 is smaller than its 'requested_size' 8");
    expect_snapshot_error("{'segments': [{'total_size': 2097152, 'blocks': [{'state': 'active_allocated', "
                          "'address': 0, 'requested_size': 1024, 'size': 512}]}], " TRACE_OF(ONE_ALLOC),
                          "segments[].blocks[0]: 'size' 512 is smaller than its 'requested_size' 1024");
    /* A segment of another device is not read. */
    expect_snapshot_error("{'segments': [{'device': 1}], " TRACE_OF(ONE_ALLOC ", {'action': 'alloc'}"),
                          "device_traces event[1]: 'addr' is missing");
}

static void test_snapshot_names_bad_traces_and_events(void **state)
{
    (void)state;
    expect_snapshot_error("{'device_traces': []}", "'segments' is missing, not a list");
    expect_snapshot_error("{'segments': [], 'device_traces': []}", "'device_traces' is empty");
    expect_snapshot_error("{'segments': [], 'device_traces': [5]}", "'device_traces[]' is int, not a list");
    expect_snapshot_error("{'segments': [], " TRACE_OF("{'action': 'alloc', 'addr': 0, 'size': 8, 'stream': 'x'}"),
                          "device_traces event[0]: 'stream' is a str, not an integer");
    /* An event's action is a string, or the event is refused. */
    expect_snapshot_error("{'segments': [], " TRACE_OF(ONE_ALLOC ", {'action': 5, 'addr': 4096, 'size': 512}"),
                          "device_traces event[1]: 'action' is an int, not a string");
    expect_snapshot_error("{'segments': [], " TRACE_OF("{'addr': 4096, 'size': 512}"),
                          "device_traces event[0]: 'action' is missing");
}

#define I63 "9223372036854775807" /* 2^63 - 1 */
#define I62 "4611686018427387904" /* 2^62 */

/* Sizes that add up past 2^63 - 1 (every figure of a replay is an int64_t)
 * are refused, each where it happens: tally tune printed a negative peak
 * live for two allocations of 2^62, and the reserved bytes' sums overflowed
 * (found by fuzz_tune_input in a CI run of 2026-12-03). Up to 2^63 - 1 is read. */
static void test_snapshot_refuses_sizes_past_int64(void **state)
{
    (void)state;
    expect_snapshot_error("{'segments': [], " TRACE_OF("{'action': 'alloc', 'addr': 0, 'size': " I62 "}, "
                                                       "{'action': 'alloc', 'addr': 4096, 'size': " I62 "}"),
                          "device_traces event 1 (alloc at address 4096): allocation of id 4096 (" I62
                          " bytes) takes the live bytes past 2^63 - 1 (" I62 " live before it)");
    expect_snapshot_error("{'segments': [{'total_size': -1, 'blocks': []}], " TRACE_OF(ONE_ALLOC),
                          "segments[0]: 'total_size' is negative");
    expect_snapshot_error("{'segments': [{'total_size': " I63 ", 'blocks': []}, {'total_size': 1, 'blocks': []}], "
                          TRACE_OF(ONE_ALLOC),
                          "segments[1]: device 0's segments add up past 2^63 - 1 bytes");
    expect_snapshot_error("{'segments': [], " TRACE_OF("{'action': 'segment_alloc', 'addr': 0, 'size': " I63 "}, "
                                                       "{'action': 'segment_map', 'addr': 0, 'size': 1}, " ONE_ALLOC),
                          "the segment events' sizes add up past 2^63 - 1 bytes");
    expect_snapshot_error("{'segments': [{'total_size': " I63 ", 'blocks': []}], "
                          TRACE_OF("{'action': 'segment_alloc', 'addr': 0, 'size': 1}, "
                                   "{'action': 'segment_free', 'addr': 0, 'size': 1}, " ONE_ALLOC),
                          "device_traces event 0: the reserved bytes go past 2^63 - 1");
    expect_snapshot_error("{'segments': [{'total_size': " I63 ", 'blocks': ["
                          "{'state': 'active_allocated', 'address': 0, 'requested_size': " I62 "}, "
                          "{'state': 'active_allocated', 'address': 8192, 'requested_size': " I62 "}]}], "
                          TRACE_OF(ONE_ALLOC),
                          "the blocks live before recording began: allocation of id 8192 (" I62
                          " bytes) takes the live bytes past 2^63 - 1 (" I62 " live before it)");
    /* Up to 2^63 - 1 live is read, and a free gives its bytes back. */
    size_t n;
    unsigned char *data = pickle_of("{'segments': [{'address': 0, 'total_size': " I63 ", 'blocks': []}], "
                     TRACE_OF("{'action': 'alloc', 'addr': 0, 'size': 4611686018427387903}, "
                              "{'action': 'alloc', 'addr': 4096, 'size': " I62 "}, "
                              "{'action': 'free_requested', 'addr': 4096, 'size': " I62 "}, "
                              "{'action': 'alloc', 'addr': 8192, 'size': " I62 "}"),
                     &n);
    tune_input_t in;
    char err[512];
    if (tune_snapshot_parse(data, n, "hand.pickle", &in, err, sizeof err) != 0)
        fail_msg("2^63 - 1 live bytes refused: %s", err);
    assert_int_equal(in.trace.nalloc, 3);
    assert_int_equal(in.recorded_start, INT64_MAX);
    tune_input_free(&in);
}

/* The snapshot of every path through the reader that grows a table: a free
 * of a block allocated before recording (a live block noted from the
 * trace), an active block no allocation explains (one noted from the
 * segments), a map inside a dump segment (cut out of it, leaving a tail),
 * and an unmap (a release, and a range added back). */
#define EVERY_TABLE                                                                                             \
    "{'segments': [{'device': 0, 'address': 16777216, 'total_size': 20971520, 'stream': 0,"                     \
    " 'segment_type': 'large', 'blocks': [{'address': 16777216, 'size': 4194304, 'requested_size': 4000000,"    \
    " 'state': 'active_allocated'}]}],"                                                                         \
    " 'device_traces': [[{'action': 'free_requested', 'addr': 20971520, 'size': 3000000, 'stream': 0},"         \
    " {'action': 'segment_map', 'addr': 31457280, 'size': 2097152, 'stream': 0},"                               \
    " {'action': 'alloc', 'addr': 31457280, 'size': 1000, 'stream': 0},"                                        \
    " {'action': 'free_requested', 'addr': 31457280, 'size': 1000, 'stream': 0},"                               \
    " {'action': 'segment_unmap', 'addr': 31457280, 'size': 2097152, 'stream': 0}]]}"

/* Each realloc of a read failing in turn (the file's buffer, the pickle's
 * tables, the trace, the live blocks and ranges of the recorded state):
 * the read fails with "PATH: ... out of memory", never a crash and never a
 * trace with something missing; once memory is back it reads as before. */
static void test_snapshot_read_out_of_host_memory_at_each_realloc(void **state)
{
    (void)state;
    char path[PATH_MAX + 32], err[PATH_MAX + 512], want[PATH_MAX + 40];
    write_pickle("every.pickle", EVERY_TABLE, path, sizeof path);
    tune_input_t in;
    reallocs = 0;
    if (tune_input_load(path, -1, &in, err, sizeof err))
        fail_msg("%s", err);
    long total = reallocs;
    assert_true(total >= 10);
    assert_int_equal(in.prelive, 2);
    assert_int_equal(in.trace.nev, 6); /* the two live before, the free of one, alloc, free, release */
    assert_int_equal(in.releases, 1);
    assert_int_equal(in.start.nranges, 2); /* 16-30 MiB and 32-36 MiB */
    assert_int_equal(in.start.ranges[0].size, 14 * MiB);
    assert_int_equal(in.start.ranges[1].addr, 32 * MiB);
    /* Reserved when recording began: the 20 MiB dump segment less the window's
     * net segment change (a 2 MiB map, then its unmap: none); the peak is
     * reached after the map. */
    assert_true(in.has_recorded);
    assert_int_equal(in.recorded_start, 20 * MiB);
    assert_int_equal(in.recorded_peak, 22 * MiB);
    tune_input_free(&in);
    snprintf(want, sizeof want, "%s: ", path);
    for (long k = 0; k < total; k++) {
        realloc_fail_at = k;
        reallocs = 0;
        err[0] = 0;
        int rc = tune_input_load(path, -1, &in, err, sizeof err);
        realloc_fail_at = -1;
        if (rc == 0)
            fail_msg("realloc %ld of %ld failed, yet the snapshot was read", k, total);
        if (strncmp(err, want, strlen(want)) != 0 || !strstr(err, "out of memory"))
            fail_msg("realloc %ld of %ld failed: '%s'", k, total, err);
        tune_input_free(&in);
    }
}

/* ---- reports --------------------------------------------------------------------- */

/* A report recorded with trace:true, written by hand: one block freed
 * that was allocated before tracing began (id 5), then one allocated and
 * freed; pad spaces before the closing brace. */
static void write_traced_report(const char *name, size_t pad, char *path, size_t len)
{
    snprintf(path, len, "%s/%s", scratch, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"format\":\"tally-report\",\"version\":\"0.1.0\",\"alloc_trace\":[{\"device\":0,\"streams\":[0],"
          "\"events\":\"0,-5,100,0 0,1,1000,0 0,-1,0,0\"}]",
          f);
    for (size_t i = 0; i < pad; i++)
        fputc(' ', f);
    fputs("}\n", f);
    assert_int_equal(fclose(f), 0);
}

/* A report longer than the first read (64 KiB) is read whole. */
static void test_report_longer_than_one_read_is_read_whole(void **state)
{
    (void)state;
    char path[PATH_MAX + 32], err[PATH_MAX + 256];
    write_traced_report("long.json", 200000, path, sizeof path);
    tune_input_t in;
    if (tune_input_load(path, -1, &in, err, sizeof err))
        fail_msg("%s", err);
    assert_string_equal(in.kind, "tally report");
    assert_int_equal(in.prelive, 1);
    assert_int_equal(in.trace.nev, 4);
    tune_input_free(&in);
}

/* A report is known by its first character past white space (space, tab,
 * CR, LF: JSON's own), each alone before the brace: a file that starts
 * "\r\n{" is a report, not a CSV trace. */
static void test_report_after_white_space_is_a_report(void **state)
{
    (void)state;
    static const char *const lead[] = {" ", "\t", "\r", "\n", "\r\n \t"};
    for (size_t i = 0; i < sizeof lead / sizeof *lead; i++) {
        char path[PATH_MAX + 32], err[PATH_MAX + 256];
        snprintf(path, sizeof path, "%s/lead%zu.json", scratch, i);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fprintf(f, "%s{\"format\":\"tally-report\",\"version\":\"0.1.0\",\"alloc_trace\":[{\"device\":0,"
                   "\"streams\":[0],\"events\":\"0,1,1000,0 0,-1,0,0\"}]}\n",
                lead[i]);
        assert_int_equal(fclose(f), 0);
        tune_input_t in;
        if (tune_input_load(path, -1, &in, err, sizeof err))
            fail_msg("lead %zu: %s", i, err);
        assert_string_equal(in.kind, "tally report");
        assert_int_equal(in.trace.nev, 2);
        tune_input_free(&in);
    }
}

static void test_report_read_out_of_host_memory_at_each_realloc(void **state)
{
    (void)state;
    char path[PATH_MAX + 32], err[PATH_MAX + 256], want[PATH_MAX + 64];
    write_traced_report("long.json", 70000, path, sizeof path);
    tune_input_t in;
    reallocs = 0;
    if (tune_input_load(path, -1, &in, err, sizeof err))
        fail_msg("%s", err);
    tune_input_free(&in);
    long total = reallocs;
    assert_true(total >= 2);
    for (long k = 0; k < total; k++) {
        realloc_fail_at = k;
        reallocs = 0;
        int rc = tune_input_load(path, -1, &in, err, sizeof err);
        realloc_fail_at = -1;
        assert_int_not_equal(rc, 0);
        snprintf(want, sizeof want, "%s: ", path);
        if (strncmp(err, want, strlen(want)) != 0 || !strstr(err, "out of memory"))
            fail_msg("realloc %ld of %ld failed: '%s'", k, total, err);
        tune_input_free(&in);
    }
}

static void expect_report_error(const char *text, const char *want)
{
    tune_input_t in;
    char err[512];
    if (tune_report_parse(text, strlen(text), "hand.json", -1, &in, err, sizeof err) == 0)
        fail_msg("read %s; expected '%s'", text, want);
    tune_input_free(&in);
    if (strcmp(err, want) != 0)
        fail_msg("%s:\nerror '%s'\nexpected '%s'", text, err, want);
}

/* A device entry may leave out "stats" (a report of tally's own always has
 * them; tune needs only the trace): it is read, not refused, and stats
 * that are there are still checked. */
static void test_report_devices_without_stats_are_read(void **state)
{
    (void)state;
    static const char ok[] = "{\"format\":\"tally-report\",\"version\":\"0.1.0\",\"devices\":[{\"device\":0},"
                             "{\"device\":1}],\"alloc_trace\":[{\"device\":0,\"streams\":[0],"
                             "\"events\":\"0,1,1000,0 0,-1,0,0\"}]}";
    tune_input_t in;
    char err[512];
    if (tune_report_parse(ok, strlen(ok), "hand.json", -1, &in, err, sizeof err) != 0)
        fail_msg("a device entry without stats refused: %s", err);
    assert_int_equal(in.trace.nev, 2);
    tune_input_free(&in);
    expect_report_error("{\"format\":\"tally-report\",\"version\":\"0.1.0\",\"devices\":[{\"device\":0},"
                        "{\"device\":1,\"stats\":[]}],\"alloc_trace\":[]}",
                        "hand.json: not a valid tally report: byte 87: devices[1].stats: expected an object at the "
                        "top level, got array");
}

static void test_report_names_bad_version_and_trace_entries(void **state)
{
    (void)state;
    /* "format" must be the string "tally-report": missing, of another type
     * (a number, an array holding it) or another string is no report. */
    static const char *const not_reports[] = {
        "{}", "{\"format\":1}", "{\"format\":[\"tally-report\"]}", "{\"format\":\"tally-reports\"}",
        "{\"format\":null,\"alloc_trace\":[{\"device\":0,\"streams\":[0],\"events\":\"0,1,512,0\"}]}",
    };
    for (size_t i = 0; i < sizeof not_reports / sizeof *not_reports; i++)
        expect_report_error(not_reports[i], "hand.json: not a tally report (no \"format\":\"tally-report\")");
    static const char *const no_trace[] = {
        "{\"format\":\"tally-report\"}",
        "{\"format\":\"tally-report\",\"alloc_trace\":{}}",
        "{\"format\":\"tally-report\",\"alloc_trace\":{\"device\":0,\"streams\":[0],\"events\":\"0,1,512,0\"}}",
        "{\"format\":\"tally-report\",\"alloc_trace\":[]}",
    };
    for (size_t i = 0; i < sizeof no_trace / sizeof *no_trace; i++)
        expect_report_error(no_trace[i],
                            "hand.json: the report holds no allocation trace (record it with TALLY_CONF=trace:true)");
    expect_report_error("{\"format\":\"tally-report\",\"version\":\"one\"}",
                        "hand.json: byte 35: \"version\" is not a tally version");
    expect_report_error("{\"format\":\"tally-report\",\"alloc_trace\":[{\"device\":0,\"events\":\"\"}]}",
                        "hand.json: alloc_trace: each entry needs device, streams and an events string");
    /* And a report that is not there. */
    tune_input_t in;
    char err[PATH_MAX + 128], path[PATH_MAX + 32], want[PATH_MAX + 128];
    snprintf(path, sizeof path, "%s/missing.json", scratch);
    assert_int_not_equal(tune_report_load(path, -1, &in, err, sizeof err), 0);
    snprintf(want, sizeof want, "%s: cannot open: No such file or directory", path);
    assert_string_equal(err, want);
}

static int setup(void **state)
{
    (void)state;
    char bin[PATH_MAX - 64];
    return tune_setup("test_tune_bad_input", "/tmp/tally-tune-bad-XXXXXX", bin, sizeof bin);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pickle_names_each_opcode_that_constructs_an_object),
        cmocka_unit_test(test_pickle_reads_strings_and_bytes_of_every_length_width),
        cmocka_unit_test(test_pickle_refuses_bad_protocol_and_unmarked_items),
        cmocka_unit_test(test_pickle_cut_after_an_argument_lacks_only_its_stop),
        cmocka_unit_test(test_pickle_file_that_cannot_be_opened_or_read),
        cmocka_unit_test(test_snapshot_names_each_bad_segment_field),
        cmocka_unit_test(test_snapshot_names_bad_traces_and_events),
        cmocka_unit_test(test_snapshot_refuses_sizes_past_int64),
        cmocka_unit_test(test_snapshot_read_out_of_host_memory_at_each_realloc),
        cmocka_unit_test(test_report_longer_than_one_read_is_read_whole),
        cmocka_unit_test(test_report_read_out_of_host_memory_at_each_realloc),
        cmocka_unit_test(test_report_after_white_space_is_a_report),
        cmocka_unit_test(test_report_devices_without_stats_are_read),
        cmocka_unit_test(test_report_names_bad_version_and_trace_entries),
    };
    return cmocka_run_group_tests(tests, setup, tune_teardown);
}
