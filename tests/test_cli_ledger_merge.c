/* The tally command (tools/tally_cli.c), run as a user runs it, its stdout,
 * stderr and exit status checked (harness: cliutil.h, CLIUTIL_REPORTS): `tally
 * ledger` on a report (and its table's row order), and `tally merge` of the
 * reports of a 4-rank job (its tables and findings, text and JSON, device
 * columns in order). Which ranks merge counts, and reports of ranks given
 * twice, missing or beyond the world size, are in
 * test_cli_ledger_merge_ranks.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "skip.h"

#define CLIUTIL_REPORTS /* the children, setup, tally_run, HAS, EXPECT_RC */
#include "cliutil.h"
#include "report/json.h"
#include "report/report.h"

/* ---- ledger ----------------------------------------------------------------- */

/* One live block is "1 block" (train.json cut down to its one-block group). */
static void test_ledger_one_live_block_is_singular(void **state)
{
    (void)state;
    char one[PATH_MAX + 16], cmd[3 * PATH_MAX + 300];
    snprintf(one, sizeof one, "%s/one_leak.json", dir);
    snprintf(cmd, sizeof cmd,
             "python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))\n"
             "d[\"leaks\"] = [g for g in d[\"leaks\"] if g[\"blocks\"] == 1]\n"
             "json.dump(d, open(sys.argv[2], \"w\"))' '%s/train.json' '%s' 2>/dev/null",
             dir, one);
    if (system(cmd) != 0)
        SKIP("python3 is needed to cut the report down");
    run_t r = tally_run("ledger '%s'", one);
    EXPECT_RC(r, 0);
    HAS(r.out, "(at exit: leaks): 1 block, 1.0 MiB, in 1 group\n");
    run_free(&r);
}

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

/* The ledger table goes by device first: rows that differ only in their
 * device (same tag, stage, current and peak bytes) list device 0, then 1,
 * then 2, whatever order the report has them in, and a row's bytes do not
 * move it ahead of a lower device (a report written by hand, its rows on
 * devices 1, 2, 1, 0; device 1's activations hold the most, and come
 * before its weights, which hold less). */
static void test_ledger_rows_tied_but_for_device_go_by_device(void **state)
{
    (void)state;
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/tied_rows.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    static const char row[] = "{\"tag\":\"%s\",\"stage\":\"train\",\"device\":%d,\"foreign\":%s,\"current_bytes\":%d,"
                              "\"peak_bytes\":2097152,\"live_blocks\":1}%s\n";
    fputs("{\"format\":\"tally-report\",\"version\":\"" TALLY_VERSION "\",\"home_device\":0,\"backend\":\"host\","
          "\"devices\":[],\"ledger\":[\n",
          f);
    fprintf(f, row, "weights", 1, "true", 1048576, ",");
    fprintf(f, row, "weights", 2, "true", 1048576, ",");
    fprintf(f, row, "activations", 1, "true", 2097152, ",");
    fprintf(f, row, "weights", 0, "false", 1048576, "");
    fputs("],\"stages\":[],\"leaks\":[]}\n", f);
    assert_int_equal(fclose(f), 0);
    run_t r = tally_run("ledger '%s'", path);
    EXPECT_RC(r, 0);
    HAS(r.out, "device tag                  stage                     current         peak     blocks\n"
               "0      weights              train                     1.0 MiB      2.0 MiB          1\n"
               "1      activations          train                     2.0 MiB      2.0 MiB          1  foreign\n"
               "1      weights              train                     1.0 MiB      2.0 MiB          1  foreign\n"
               "2      weights              train                     1.0 MiB      2.0 MiB          1  foreign\n"
               "\n");
    expect_text(r.err, "");
    run_free(&r);
}

/* On one device, rows of equal current bytes go by peak, the highest first,
 * and only rows equal in both go by tag, then stage: a report written by
 * hand whose three rows of 1 MiB current are in tag order with the peaks
 * rising (a, b, c: peaks 1, 3 and 2 MiB), and two rows equal but for their
 * stage, the later stage first in the report. */
static void test_ledger_rows_of_equal_current_go_by_peak(void **state)
{
    (void)state;
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/peak_rows.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    static const char row[] = "{\"tag\":\"%s\",\"stage\":\"%s\",\"device\":0,\"foreign\":false,"
                              "\"current_bytes\":1048576,\"peak_bytes\":%d,\"live_blocks\":1}%s\n";
    fputs("{\"format\":\"tally-report\",\"version\":\"" TALLY_VERSION "\",\"home_device\":0,\"backend\":\"host\","
          "\"devices\":[],\"ledger\":[\n",
          f);
    fprintf(f, row, "a", "train", 1048576, ",");
    fprintf(f, row, "b", "train", 3145728, ",");
    fprintf(f, row, "c", "train", 2097152, ",");
    fprintf(f, row, "d", "warmup", 1048576, ",");
    fprintf(f, row, "d", "load", 1048576, "");
    fputs("],\"stages\":[],\"leaks\":[]}\n", f);
    assert_int_equal(fclose(f), 0);
    run_t r = tally_run("ledger '%s'", path);
    EXPECT_RC(r, 0);
    HAS(r.out, "device tag                  stage                     current         peak     blocks\n"
               "0      b                    train                     1.0 MiB      3.0 MiB          1\n"
               "0      c                    train                     1.0 MiB      2.0 MiB          1\n"
               "0      a                    train                     1.0 MiB      1.0 MiB          1\n"
               "0      d                    load                      1.0 MiB      1.0 MiB          1\n"
               "0      d                    warmup                    1.0 MiB      1.0 MiB          1\n"
               "\n");
    expect_text(r.err, "");
    run_free(&r);
}

/* A report keeps the last 256 stages that ended; the stage table numbers
 * each with its own "seq" from the report, not its place in the list: a
 * hand-written report of a job whose history wrapped (stages 299 and 300 of
 * 300 kept). */
static void test_ledger_stage_numbers_are_the_reports(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/wrapped_stages.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    static const char stage[] = "{\"name\":\"%s\",\"seq\":%d,\"depth\":1,\"begin_us\":0,\"wall_us\":1500000,"
                                "\"peak_allocated_bytes\":1048576,\"peak_reserved_bytes\":2097152,"
                                "\"survivor_bytes\":0,\"survivor_blocks\":0,\"released_bytes\":0,\"survivors\":[]}%s\n";
    fputs("{\"format\":\"tally-report\",\"version\":\"" TALLY_VERSION "\",\"home_device\":0,\"backend\":\"host\","
          "\"devices\":[],\"ledger\":[],\"stages_total\":300,\"stages\":[\n",
          f);
    fprintf(f, stage, "step-299", 299, ",");
    fprintf(f, stage, "step-300", 300, "");
    fputs("],\"leaks\":[]}\n", f);
    assert_int_equal(fclose(f), 0);
    run_t r = tally_run("ledger '%s'", path);
    EXPECT_RC(r, 0);
    HAS(r.out, "stages (300 ended, 2 in the report)\n");
    HAS(r.out, "\n299  step-299                  1.500      1.0 MiB      2.0 MiB          0 B          0 B\n"
               "300  step-300 ");
    expect_text(r.err, "");
    run_free(&r);
}

/* The ledger table's tag and stage columns are as wide as the longest tag
 * and stage of any row (at least 20), wherever that row is in the report: a
 * report written by hand (no devices listed) whose third row has a tag of
 * 30 characters and a stage of 24. */
static void test_ledger_columns_fit_the_longest_tag_and_stage(void **state)
{
    (void)state;
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/wide_rows.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    static const char row[] = "{\"tag\":\"%s\",\"stage\":\"%s\",\"device\":0,\"foreign\":false,\"current_bytes\":%d,"
                              "\"peak_bytes\":%d,\"live_blocks\":1}%s\n";
    fputs("{\"format\":\"tally-report\",\"version\":\"" TALLY_VERSION "\",\"home_device\":0,\"backend\":\"host\","
          "\"devices\":[],\"ledger\":[\n",
          f);
    fprintf(f, row, "a", "s", 3145728, 3145728, ",");
    fprintf(f, row, "b", "s", 2097152, 2097152, ",");
    fprintf(f, row, "a-tag-of-thirty-characters-xyz", "a-stage-of-24-characters", 1048576, 1048576, "");
    fputs("],\"stages\":[],\"leaks\":[]}\n", f);
    assert_int_equal(fclose(f), 0);
    run_t r = tally_run("ledger '%s'", path);
    EXPECT_RC(r, 0);
    HAS(r.out, "device tag                            stage                         current         peak     blocks\n"
               "0      a                              s                             3.0 MiB      3.0 MiB          1\n"
               "0      b                              s                             2.0 MiB      2.0 MiB          1\n"
               "0      a-tag-of-thirty-characters-xyz a-stage-of-24-characters      1.0 MiB      1.0 MiB          1\n"
               "\n");
    expect_text(r.err, "");
    run_free(&r);
}

/* Merge's totals by stage and by tag: the most current bytes first, then
 * the highest peak, then by name, whatever order the rows came in. */
static void test_merge_totals_in_order_of_bytes_then_name(void **state)
{
    (void)state;
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/unsorted.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    static const char row[] = "{\"tag\":\"%s\",\"stage\":\"%s\",\"device\":0,\"foreign\":false,\"current_bytes\":%d,"
                              "\"peak_bytes\":%d,\"live_blocks\":1}%s\n";
    fputs("{\"format\":\"tally-report\",\"version\":\"" TALLY_VERSION "\",\"home_device\":0,\"backend\":\"host\","
          "\"devices\":[],\"ledger\":[\n",
          f);
    fprintf(f, row, "t1", "b-small", 1048576, 1048576, ",");
    fprintf(f, row, "t5", "d-tie", 2097152, 2097152, ",");
    fprintf(f, row, "t2", "a-big", 4194304, 4194304, ",");
    fprintf(f, row, "t3", "aa-tie", 2097152, 2097152, ",");
    fprintf(f, row, "t4", "c-mid", 2097152, 3145728, "");
    fputs("],\"stages\":[],\"leaks\":[]}\n", f);
    assert_int_equal(fclose(f), 0);
    run_t r = tally_run("merge '%s'", path);
    EXPECT_RC(r, 0);
    HAS(r.out, "by stage, all ranks       current   peak (sum)  live blocks  ranks\n"
               "a-big                     4.0 MiB      4.0 MiB            1      1\n"
               "c-mid                     2.0 MiB      3.0 MiB            1      1\n"
               "aa-tie                    2.0 MiB      2.0 MiB            1      1\n"
               "d-tie                     2.0 MiB      2.0 MiB            1      1\n"
               "b-small                   1.0 MiB      1.0 MiB            1      1\n");
    HAS(r.out, "by tag, all ranks         current   peak (sum)  live blocks  ranks\n"
               "t2                        4.0 MiB      4.0 MiB            1      1\n"
               "t4                        2.0 MiB      3.0 MiB            1      1\n"
               "t3                        2.0 MiB      2.0 MiB            1      1\n"
               "t5                        2.0 MiB      2.0 MiB            1      1\n"
               "t1                        1.0 MiB      1.0 MiB            1      1\n");
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

/* Memory a rank held on another rank's device and freed is named with the
 * rank's own number and its home device, which here differ. */
static void test_merge_names_foreign_memory_freed_since(void **state)
{
    (void)state;
    char conf[PATH_MAX + 200];
    snprintf(conf, sizeof conf,
             "backend:host,host_devices:2,host_mode:virtual,host_capacity:8GiB,report_path:%s/staged%%r.json,"
             "leak_report:off,stage_report:false",
             dir);
    const char *env[] = {"TALLY_CONF", conf, "RANK", "5", "LOCAL_RANK", "1", "WORLD_SIZE", "8", NULL};
    assert_int_equal(spawn_child("rank_freed", env), 0);
    run_t r = tally_run("merge '%s/staged5.json'", dir);
    EXPECT_RC(r, 0);
    HAS(r.out, "tally merge: 1 report, ranks 5"); /* one report: singular */
    HAS(r.out, "rank 5 held up to 64.0 MiB on device 0, freed since: stage load, tag staging (its home device is 1)\n");
    run_free(&r);
}

/* The foreign findings' order: those still held first, then those freed
 * since; within each, by rank; within a rank, the most bytes first (current
 * bytes when held, the peak when freed). Two hand-written reports of a
 * 2-rank job, rank 1 named first, each with rows on the other's device in
 * an order that is neither the one wanted nor its reverse. */
static void test_merge_findings_held_first_then_by_rank_then_largest(void **state)
{
    (void)state;
    static const char head[] = "{\"format\":\"tally-report\",\"version\":\"" TALLY_VERSION "\",\"rank\":%d,"
                               "\"world_size\":2,\"home_device\":%d,\"backend\":\"host\",\"devices\":[],\"ledger\":[\n";
    static const char row[] = "{\"tag\":\"%s\",\"stage\":\"load\",\"device\":%d,\"foreign\":true,\"current_bytes\":%d,"
                              "\"peak_bytes\":%d,\"live_blocks\":%d}%s\n";
    char path[2][PATH_MAX + 32];
    for (int rank = 1; rank >= 0; rank--) {
        snprintf(path[rank], sizeof path[rank], "%s/order-rank%d.json", dir, rank);
        FILE *f = fopen(path[rank], "w");
        assert_non_null(f);
        int other = 1 - rank;
        fprintf(f, head, rank, rank);
        /* Neither in the order wanted nor in its reverse. */
        fprintf(f, row, "big", other, 3145728, 3145728, 1, ",");
        fprintf(f, row, "gone-big", other, 0, 4194304, 0, ",");
        fprintf(f, row, "small", other, 1048576, 1048576, 1, ",");
        fprintf(f, row, "gone-small", other, 0, 2097152, 0, ",");
        fprintf(f, row, "middle", other, 2097152, 2097152, 1, "");
        fputs("],\"stages\":[],\"leaks\":[]}\n", f);
        assert_int_equal(fclose(f), 0);
    }
    run_t r = tally_run("merge '%s' '%s'", path[1], path[0]);
    EXPECT_RC(r, 0);
    HAS(r.out, "foreign memory: 6 findings, and 4 earlier holdings since freed\n");
    static const char *const want[] = {
        "rank 0 holds 3.0 MiB on device 1: stage load, tag big",
        "rank 0 holds 2.0 MiB on device 1: stage load, tag middle",
        "rank 0 holds 1.0 MiB on device 1: stage load, tag small",
        "rank 1 holds 3.0 MiB on device 0: stage load, tag big",
        "rank 1 holds 2.0 MiB on device 0: stage load, tag middle",
        "rank 1 holds 1.0 MiB on device 0: stage load, tag small",
        "rank 0 held up to 4.0 MiB on device 1, freed since: stage load, tag gone-big",
        "rank 0 held up to 2.0 MiB on device 1, freed since: stage load, tag gone-small",
        "rank 1 held up to 4.0 MiB on device 0, freed since: stage load, tag gone-big",
        "rank 1 held up to 2.0 MiB on device 0, freed since: stage load, tag gone-small",
    };
    const char *at = r.out;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const char *next = strstr(at, want[i]);
        if (!next)
            fail_msg("finding %zu (\"%s\") is not after the one before it:\n%s", i + 1, want[i], r.out);
        at = next + strlen(want[i]);
    }
    run_free(&r);
}

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
        /* Every block is a whole large segment here: reserved is allocated. */
        assert_int_equal(jint(d0, "reserved_bytes"), (int64_t)(GiB + (i == 0 ? 256 * MiB : 0)));
    }
    const tally_json_t *devs = tally__json_get(root, "devices");
    assert_int_equal(devs->len, 4);
    assert_int_equal(jint(&devs->items[0], "allocated_bytes"), (int64_t)(4 * GiB + 256 * MiB));
    assert_int_equal(jint(&devs->items[0], "foreign_bytes"), (int64_t)(3 * GiB));
    assert_int_equal(jint(&devs->items[2], "allocated_bytes"), (int64_t)(256 * MiB));
    assert_int_equal(jint(&devs->items[0], "reserved_bytes"), (int64_t)(4 * GiB + 256 * MiB));
    assert_int_equal(jint(&devs->items[2], "reserved_bytes"), (int64_t)(256 * MiB));
    assert_int_equal(jint(&devs->items[2], "foreign_bytes"), 0);
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

/* merge --json writes a space in a name, a path and a message as a space,
 * not as an escape (\u0020): rank 1's report with its tag checkpoint
 * renamed "ckpt shard 0", in a directory whose name has a space. Checked
 * in the text itself, which a JSON reader would decode either way. */
static void test_merge_json_writes_spaces_as_spaces(void **state)
{
    (void)state;
    char from[PATH_MAX + 16], sub[PATH_MAX + 16], to[PATH_MAX + 32], want[2 * PATH_MAX + 64];
    snprintf(from, sizeof from, "%s/rank1.json", dir);
    snprintf(sub, sizeof sub, "%s/with space", dir);
    snprintf(to, sizeof to, "%s/rank1.json", sub);
    assert_int_equal(mkdir(sub, 0700), 0);
    char *s = slurp(from);
    assert_non_null(s);
    FILE *f = fopen(to, "w");
    assert_non_null(f);
    int renamed = 0;
    for (const char *p = s, *at; *p; p = at + strlen("\"checkpoint\"")) {
        at = strstr(p, "\"checkpoint\"");
        if (!at) {
            fputs(p, f);
            break;
        }
        fprintf(f, "%.*s\"ckpt shard 0\"", (int)(at - p), p);
        renamed++;
    }
    assert_int_equal(fclose(f), 0);
    free(s);
    assert_true(renamed > 0);
    run_t r = tally_run("merge --json '%s/rank0.json' '%s'", dir, to);
    EXPECT_RC(r, 0);
    HAS(r.out, "\"home_device\":1,\"backend\":\"host\",\"file\":\"");
    snprintf(want, sizeof want, "\"file\":\"%s\",", to);
    HAS(r.out, want);
    HAS(r.out, "\"stage\":\"load\",\"tag\":\"ckpt shard 0\",\"current_bytes\":1073741824,");
    HAS(r.out, "\"message\":\"rank 1 holds 1.0 GiB on device 0: stage load, tag ckpt shard 0 (its home device is "
               "1)\"}");
    HAS(r.out, "\n {\"tag\":\"ckpt shard 0\",\"current_bytes\":1073741824,\"peak_bytes_sum\":1073741824,"
               "\"live_blocks\":1,\"ranks\":1}");
    if (strstr(r.out, "\\u0020"))
        fail_msg("a space written as \\u0020:\n%s", r.out);
    expect_text(r.err, "");
    run_free(&r);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ledger_report),
        cmocka_unit_test(test_ledger_one_live_block_is_singular),
        cmocka_unit_test(test_ledger_rejects_stats),
        cmocka_unit_test(test_ledger_rows_tied_but_for_device_go_by_device),
        cmocka_unit_test(test_ledger_rows_of_equal_current_go_by_peak),
        cmocka_unit_test(test_ledger_stage_numbers_are_the_reports),
        cmocka_unit_test(test_ledger_columns_fit_the_longest_tag_and_stage),

        cmocka_unit_test(test_merge_totals_in_order_of_bytes_then_name),
        cmocka_unit_test(test_merge_four_ranks),
        cmocka_unit_test(test_merge_names_foreign_memory_freed_since),
        cmocka_unit_test(test_merge_findings_held_first_then_by_rank_then_largest),
        cmocka_unit_test(test_merge_json),
        cmocka_unit_test(test_merge_json_writes_spaces_as_spaces),
        cmocka_unit_test(test_merge_device_columns_in_order),
    };
    return CLI_MAIN("cli_ledger_merge", tests);
}
