/* tally tune's third input (tune.h): a tally JSON report recorded with
 * trace:true, whose alloc_trace becomes the trace (tune_input.c reads the
 * file and tells the three inputs apart).
 *
 * alloc_trace holds one entry per device that allocated while tracing: the
 * device, its streams and one events string, the events separated by
 * spaces, each four integers "dt,id,size,stream" (us since the previous
 * event; id > 0 allocates block id, id < 0 frees block -id; bytes asked
 * for; an index into streams: docs/reports.md). The device asked for is
 * read, else the one with the most events.
 *
 * A damaged report is refused first, as by the other commands
 * (tools/cli_report.h). Frees of blocks allocated before tracing began
 * (trace switched on at run time) become allocations placed first, as a
 * snapshot's blocks live before recording do (tune_add_prelive). */
#include "tune.h"

#include "report/json.h"
#include "report/report.h" /* the strict stats reader */

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One decimal field of an events string, ending at sep (or the string's end). */
static int event_field(const char **p, const char *end, char sep, int64_t *out)
{
    const char *q = *p;
    bool neg = q < end && *q == '-';
    q += neg;
    uint64_t v = 0;
    const char *digits = q;
    while (q < end && *q >= '0' && *q <= '9' && v <= (uint64_t)INT64_MAX / 10)
        v = v * 10 + (uint64_t)(*q++ - '0');
    if (q == digits || v > (uint64_t)INT64_MAX || (q < end && *q != sep) || (q == end && sep != ' '))
        return -1;
    *out = neg ? -(int64_t)v : (int64_t)v;
    *p = q < end ? q + 1 : q;
    return 0;
}

/* Feed the events string to b. With pre (first pass) a free of a block not
 * live is noted there instead (allocated before tracing began). */
static int report_feed(const char *path, const tally_json_t *events, const tally_json_t *streams,
                       trace_builder_t *b, tune_snap_events_t *pre, char *err, size_t errlen)
{
    char why[400];
    const char *p = events->s, *end = events->s + events->len;
    for (size_t k = 0; p < end; k++) {
        int64_t v[4], stream = 0;
        const tally_json_t *sv = NULL;
        int bad = 0;
        for (int j = 0; j < 4 && !bad; j++)
            bad = event_field(&p, end, j < 3 ? ',' : ' ', &v[j]);
        if (!bad)
            sv = tally__json_at(streams, (size_t)(v[3] < 0 ? 0 : v[3]));
        if (bad || v[0] < 0 || v[1] == 0 || v[2] < 0 || v[3] < 0 || !sv || tally__json_int(sv, &stream))
            return tune_fail(err, errlen,
                             "%s: alloc_trace event %zu: not 'dt,id,size,stream' with dt, size >= 0, id != 0 and a "
                             "known stream index",
                             path, k);
        uint64_t id = (uint64_t)(v[1] < 0 ? -v[1] : v[1]);
        if (pre && v[1] < 0 && !trace_is_live(b, id)) {
            if (tune_add_prelive(pre, id, (uint64_t)v[2], (uint64_t)stream))
                return tune_fail(err, errlen, "%s: out of memory", path);
            continue;
        }
        if (trace_add(b, v[1] > 0 ? 'a' : 'f', id, (uint64_t)v[2], (uint64_t)stream, why, sizeof why))
            return tune_fail(err, errlen, "%s: alloc_trace event %zu: %s", path, k, why);
    }
    return 0;
}

static int convert(const char *path, const tally_json_t *root, int want, tune_input_t *in, char *err,
                   size_t errlen)
{
    const tally_json_t *format = tally__json_get(root, "format");
    if (!format || format->type != TALLY_JSON_STRING || strcmp(format->s, "tally-report") != 0) {
        snprintf(err, errlen, "%s: not a tally report (no \"format\":\"tally-report\")", path);
        return -1;
    }
    const tally_json_t *traces = tally__json_get(root, "alloc_trace");
    if (!traces || traces->type != TALLY_JSON_ARRAY || traces->len == 0) {
        snprintf(err, errlen, "%s: the report holds no allocation trace (record it with TALLY_CONF=trace:true)", path);
        return -1;
    }
    /* The device asked for, else the one with the most events (the longest string). */
    const tally_json_t *dev = NULL;
    for (size_t i = 0; i < traces->len; i++) {
        const tally_json_t *ev = tally__json_get(&traces->items[i], "events");
        const tally_json_t *best = dev ? tally__json_get(dev, "events") : NULL;
        int64_t id = -1;
        tally__json_int(tally__json_get(&traces->items[i], "device"), &id);
        if (want >= 0 ? id == want : ev && ev->type == TALLY_JSON_STRING && (!best || ev->len > best->len))
            dev = &traces->items[i];
    }
    if (want >= 0 && !dev) {
        snprintf(err, errlen, "%s: alloc_trace has no device %d (devices that allocated while tracing: %zu)", path,
                 want, traces->len);
        return -1;
    }
    const tally_json_t *events = dev ? tally__json_get(dev, "events") : NULL;
    const tally_json_t *streams = dev ? tally__json_get(dev, "streams") : NULL;
    int64_t device = 0, total = 0;
    if (!events || events->type != TALLY_JSON_STRING || !streams || streams->type != TALLY_JSON_ARRAY ||
        tally__json_int(tally__json_get(dev, "device"), &device)) {
        snprintf(err, errlen, "%s: alloc_trace: each entry needs device, streams and an events string", path);
        return -1;
    }
    if (tally__json_int(tally__json_get(dev, "total_bytes"), &total) == 0)
        in->capacity = total;
    in->device = (int)device;
    /* As with snapshots: frees of blocks allocated before tracing began
     * (trace switched on at run time) become allocations placed first. */
    tune_snap_events_t pre = {0};
    trace_t scratch;
    trace_builder_t b;
    int rc = trace_begin(&b, &scratch, path, err, errlen);
    if (!rc)
        rc = report_feed(path, events, streams, &b, &pre, err, errlen);
    trace_end(&b);
    trace_free(&scratch);
    if (!rc)
        rc = trace_begin(&b, &in->trace, path, err, errlen);
    if (!rc) {
        char why[400];
        for (size_t i = 0; !rc && i < pre.npre; i++)
            if (trace_add(&b, 'a', pre.pre[i].addr, pre.pre[i].size, pre.pre[i].stream, why, sizeof why))
                rc = !trace_is_live(&b, pre.pre[i].addr) /* out of memory, not a second free */
                         ? tune_fail(err, errlen, "%s: %s", path, why)
                         : tune_fail(err, errlen, "%s: alloc_trace: block %llu freed twice before any allocation of it",
                                     path, (unsigned long long)pre.pre[i].addr);
        if (!rc)
            rc = report_feed(path, events, streams, &b, NULL, err, errlen);
        trace_end(&b);
    }
    in->prelive = pre.npre;
    free(pre.pre);
    return rc;
}

/* A damaged report is refused here as by the other commands
 * (tools/cli_report.h): a version newer than this tally, or device stats
 * that are not the report's own strict set. */
static int check_report(const char *path, const tally_json_t *root, char *err, size_t errlen)
{
    const tally_json_t *ver = tally__json_get(root, "version");
    int maj, min, patch, used = 0, mine_maj = 0, mine_min = 0;
    if (ver && (ver->type != TALLY_JSON_STRING || sscanf(ver->s, "%d.%d.%d%n", &maj, &min, &patch, &used) != 3 ||
                ver->s[used] != 0))
        return tune_fail(err, errlen, "%s: byte %zu: \"version\" is not a tally version", path, ver->offset);
    if (ver && sscanf(TALLY_VERSION, "%d.%d", &mine_maj, &mine_min) == 2 &&
        (maj > mine_maj || (maj == mine_maj && min > mine_min)))
        return tune_fail(err, errlen, "%s: written by tally %s, newer than this tally (%s): read it with tally %d.%d or later",
                         path, ver->s, TALLY_VERSION, maj, min);
    const tally_json_t *devs = tally__json_get(root, "devices");
    for (size_t i = 0; devs && devs->type == TALLY_JSON_ARRAY && i < devs->len; i++) {
        const tally_json_t *st = tally__json_get(&devs->items[i], "stats");
        tally_stats_t s;
        char why[300];
        if (st && tally__stats_from_node(st, &s, TALLY_STATS_STRICT, why, sizeof why) < 0) {
            /* The other commands' shape: "byte N: devices[i].stats: why". */
            size_t at = st->offset;
            int skip = 0;
            const char *w = why;
            if (sscanf(why, "stats JSON: byte %zu: %n", &at, &skip) == 1 && skip > 0)
                w = why + skip;
            else if (strncmp(why, "stats JSON: ", 12) == 0)
                w = why + 12;
            return tune_fail(err, errlen, "%s: not a valid tally report: byte %zu: devices[%zu].stats: %s", path, at, i,
                             w);
        }
    }
    return 0;
}

int tune_report_parse(const char *text, size_t len, const char *name, int device, tune_input_t *in, char *err,
                      size_t errlen)
{
    memset(in, 0, sizeof *in);
    in->kind = "tally report";
    char why[256];
    size_t at = 0;
    tally_json_t *root = tally__json_parse(text, len, why, sizeof why, &at);
    if (!root) {
        /* The reader's message can quote a key from the input, control characters and all: one line. */
        for (char *c = why; *c; c++)
            if ((unsigned char)*c < 0x20)
                *c = '?';
        return tune_fail(err, errlen, "%s: malformed JSON: %s", name, why);
    }
    const tally_json_t *format = tally__json_get(root, "format");
    int rc = 0;
    if (format && format->type == TALLY_JSON_STRING && strcmp(format->s, "tally-report") == 0)
        rc = check_report(name, root, err, errlen);
    if (!rc)
        rc = convert(name, root, device, in, err, errlen);
    tally__json_free(root);
    return rc;
}
