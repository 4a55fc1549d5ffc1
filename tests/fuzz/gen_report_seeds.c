/* Writes the seed corpus of fuzz_report (tests/fuzz/corpus/fuzz_report/):
 * JSON reports of small workloads (tags, stages, two streams, an OOM, a
 * timeline, live blocks, a foreign device), a flat and a nested
 * memory_stats object. Run from the repository root:
 *   cc -std=c11 -D_GNU_SOURCE -Iinclude -Ilib -o /tmp/gen tests/fuzz/gen_report_seeds.c \
 *      build/lib/libtally.a -lpthread -ldl -lm && /tmp/gen tests/fuzz/corpus/fuzz_report
 * (each report is written by this process, so RANK picks the rank). */
#include "tally.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB ((size_t)1 << 20)

static void to_file(void *arg, const char *text, size_t len)
{
    fwrite(text, 1, len, (FILE *)arg);
}

static void quiet(void *arg, const char *text, size_t len)
{
    (void)arg;
    (void)text;
    (void)len;
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : ".";
    char path[512];
    setenv("TALLY_CONF",
           "backend:host,host_devices:2,host_capacity:256MiB,host_mode:virtual,timeline:true,timeline_events:40,"
           "home_device:0,backtrace_depth:2,leak_report:off",
           1);
    tally_set_sink(quiet, NULL);
    void *keep[8];
    /* 1: a load stage that leaves weights, a train stage with activations */
    tally_stage_begin("load");
    tally_tag_push("weights");
    keep[0] = tally_malloc(20 * MiB, 0, NULL);
    keep[1] = tally_malloc(3 * MiB + 17, 0, NULL);
    tally_tag_pop();
    tally_stage_end("load");
    snprintf(path, sizeof path, "%s/report-load.json", dir);
    if (tally_write_report(path) != 0)
        return 1;
    tally_stage_begin("train");
    tally_tag_push("act");
    void *a[6];
    for (int i = 0; i < 6; i++)
        a[i] = tally_malloc((size_t)(i + 1) * 700000, i % 2, i % 3 ? (void *)0x10 : NULL);
    tally_record_stream(a[0], (void *)0x20);
    tally_tag_pop();
    tally_tag_push("checkpoint");
    keep[2] = tally_malloc(5 * MiB, 1, NULL); /* foreign: home is 0 */
    tally_tag_pop();
    if (tally_malloc(1024 * MiB, 0, NULL) != NULL) /* an OOM in the timeline */
        return 1;
    for (int i = 0; i < 6; i++)
        tally_free(a[i]);
    tally_stage_end("train");
    snprintf(path, sizeof path, "%s/report-train.json", dir);
    if (tally_write_report(path) != 0)
        return 1;
    /* memory_stats, flat */
    snprintf(path, sizeof path, "%s/stats-flat.json", dir);
    FILE *f = fopen(path, "w");
    if (!f || tally_write_stats_json(0, to_file, f) != 0)
        return 1;
    fclose(f);
    for (int i = 0; i < 3; i++)
        tally_free(keep[i]);
    tally_empty_cache(-1);
    snprintf(path, sizeof path, "%s/report-empty.json", dir);
    return tally_write_report(path) != 0;
}
