/* tally tune's third input: a tally JSON report written with trace:true.
 * Its "alloc_trace" array holds, per device, every allocation and free as
 * four integers (dt_us, id, size, stream index; id < 0 frees block -id),
 * docs/reports.md. The device with the most events is replayed; its
 * total_bytes becomes the default --capacity. */
#include "tune.h"

#include "json.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *report_text(const char *path, size_t *len, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0, got;
    char *buf = malloc(cap);
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *g = realloc(buf, cap *= 2);
            if (!g) {
                free(buf);
                buf = NULL;
            }
            buf = g;
        }
    }
    fclose(f);
    if (!buf)
        snprintf(err, errlen, "%s: out of memory", path);
    *len = n;
    return buf;
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
    /* The device asked for, else the one with the most events. */
    const tally_json_t *dev = NULL;
    for (size_t i = 0; i < traces->len; i++) {
        const tally_json_t *ev = tally__json_get(&traces->items[i], "events");
        const tally_json_t *best = dev ? tally__json_get(dev, "events") : NULL;
        int64_t id = -1;
        tally__json_int(tally__json_get(&traces->items[i], "device"), &id);
        if (want >= 0 ? id == want : ev && ev->type == TALLY_JSON_ARRAY && (!best || ev->len > best->len))
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
    if (!events || !streams || streams->type != TALLY_JSON_ARRAY || events->len % 4 ||
        tally__json_int(tally__json_get(dev, "device"), &device)) {
        snprintf(err, errlen, "%s: alloc_trace: each entry needs device, streams and events (4 integers per event)",
                 path);
        return -1;
    }
    if (tally__json_int(tally__json_get(dev, "total_bytes"), &total) == 0)
        in->capacity = total;
    in->device = (int)device;
    trace_builder_t b;
    if (trace_begin(&b, &in->trace, path, err, errlen))
        return -1;
    char why[400];
    int rc = 0;
    for (size_t k = 0; k < events->len / 4 && !rc; k++) {
        int64_t v[4];
        for (int j = 0; j < 4; j++)
            if (tally__json_int(&events->items[4 * k + (size_t)j], &v[j])) {
                snprintf(err, errlen, "%s: alloc_trace event %zu: field %d is not an integer", path, k, j + 1);
                rc = -1;
                break;
            }
        if (rc)
            break;
        const tally_json_t *sv = tally__json_at(streams, (size_t)(v[3] < 0 ? 0 : v[3]));
        int64_t stream = 0;
        if (v[1] == 0 || v[2] < 0 || v[3] < 0 || !sv || tally__json_int(sv, &stream)) {
            snprintf(err, errlen, "%s: alloc_trace event %zu: bad id, size or stream index (%lld, %lld, %lld)", path, k,
                     (long long)v[1], (long long)v[2], (long long)v[3]);
            rc = -1;
            break;
        }
        uint64_t id = (uint64_t)(v[1] < 0 ? -v[1] : v[1]);
        if (trace_add(&b, v[1] > 0 ? 'a' : 'f', id, (uint64_t)v[2], (uint64_t)stream, why, sizeof why)) {
            snprintf(err, errlen, "%s: alloc_trace event %zu: %s", path, k, why);
            rc = -1;
        }
    }
    trace_end(&b);
    return rc;
}

int tune_report_load(const char *path, int device, tune_input_t *in, char *err, size_t errlen)
{
    size_t len;
    char *text = report_text(path, &len, err, errlen);
    if (!text)
        return -1;
    char why[256];
    size_t at = 0;
    tally_json_t *root = tally__json_parse(text, len, why, sizeof why, &at);
    int rc;
    if (!root) {
        snprintf(err, errlen, "%s: malformed JSON: %s", path, why);
        rc = -1;
    } else {
        rc = convert(path, root, device, in, err, errlen);
    }
    tally__json_free(root);
    free(text);
    return rc;
}
