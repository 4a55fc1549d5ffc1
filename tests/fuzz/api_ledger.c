/* fuzz_api's operations on the ledger, the configuration and the reports
 * (tests/fuzz/fuzz_api.h): tag push / pop and stage begin / end with names
 * from the input, valid or not, runtime tally_configure, and every report
 * writer, the JSON report read back. */
#include "fuzz_api.h"
#include "report/json.h"

#include <stdio.h>
#include <string.h>

#define REPORT_EVERY 64  /* inputs between JSON reports read back (op_reports) */
static long report_input; /* the input that last read the JSON report back */

static void discard(void *arg, const char *text, size_t len)
{
    (void)arg;
    (void)text;
    (void)len;
}

/* Well-formed UTF-8 (Unicode table 3-7): what the library accepts in a name. */
static bool name_utf8(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned c = s[i], lo = 0x80, hi = 0xbf;
        size_t k;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xc2 && c <= 0xdf) {
            k = 1;
        } else if (c >= 0xe0 && c <= 0xef) {
            k = 2;
            lo = c == 0xe0 ? 0xa0 : 0x80;
            hi = c == 0xed ? 0x9f : 0xbf;
        } else if (c >= 0xf0 && c <= 0xf4) {
            k = 3;
            lo = c == 0xf0 ? 0x90 : 0x80;
            hi = c == 0xf4 ? 0x8f : 0xbf;
        } else {
            return false;
        }
        if (i + k >= n)
            return false;
        if (s[i + 1] < lo || s[i + 1] > hi)
            return false;
        for (size_t j = 2; j <= k; j++)
            if ((s[i + j] & 0xc0) != 0x80)
                return false;
        i += k + 1;
    }
    return true;
}

static bool name_valid(const name_t *n)
{
    size_t len = strlen(n->s);
    if (n->null || len == 0 || len > 200)
        return false;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)n->s[i] < 0x20 || n->s[i] == 0x7f)
            return false;
    return name_utf8((const unsigned char *)n->s, len);
}

void op_tag_push(reader_t *r)
{
    name_t n;
    read_name(r, &n);
    say("tag_push(%s)", n.null ? "NULL" : n.s);
    int want = n.null ? -TALLY_EINVAL : M.ntags == DEPTH ? -TALLY_ESTATE : !name_valid(&n) ? -TALLY_EINVAL : 0;
    RC(tally_tag_push(n.null ? NULL : n.s), want);
    if (want == 0)
        snprintf(M.tags[M.ntags++], 256, "%s", n.s);
}

void op_tag_pop(reader_t *r)
{
    (void)r;
    say("tag_pop");
    RC(tally_tag_pop(), M.ntags ? 0 : -TALLY_ESTATE);
    if (M.ntags)
        M.ntags--;
}

void op_stage_begin(reader_t *r)
{
    name_t n;
    read_name(r, &n);
    say("stage_begin(%s)", n.null ? "NULL" : n.s);
    int want = n.null || !name_valid(&n) ? -TALLY_EINVAL : M.nstages == DEPTH ? -TALLY_ESTATE : 0;
    RC(tally_stage_begin(n.null ? NULL : n.s), want);
    if (want == 0)
        snprintf(M.stages[M.nstages++], 256, "%s", n.s);
}

void op_stage_end(reader_t *r)
{
    unsigned how = u8(r);
    name_t n;
    if (how % 4 < 3 && M.nstages) {
        memset(&n, 0, sizeof n);
        snprintf(n.s, sizeof n.s, "%s", top_stage());
    } else {
        read_name(r, &n);
    }
    say("stage_end(%s)", n.null ? "NULL" : n.s);
    int want = n.null ? -TALLY_EINVAL
               : !M.nstages ? -TALLY_ESTATE
               : strcmp(M.stages[M.nstages - 1], n.s) != 0 ? -TALLY_ESTATE
                                                           : 0;
    RC(tally_stage_end(n.null ? NULL : n.s), want);
    if (want == 0)
        M.nstages--;
}

static const char *const confs[] = {
    "release_at_stage_end:true", "release_at_stage_end:false", "stage_report:false", "stage_report:true",
    "timeline:true", "timeline:false", "backtrace_depth:3", "backtrace_depth:0", "persistent_tags:weights|act",
    "persistent_tags:", "memory_fraction:0.5", "leak_report:full", "leak_report:off",
    /* refused: not runtime keys, or bad values; nothing changes */
    "host_devices:2", "ledger:false", "memory_fraction:2", "stage_report:maybe", "release_at_stage_end:true,bogus:1",
};
#define NCONF_GOOD 13
const char restore_conf[] = "release_at_stage_end:false,stage_report:true,timeline:false,backtrace_depth:0,"
                            "persistent_tags:,leak_report:off";

void op_configure(reader_t *r)
{
    unsigned b = u8(r) % (sizeof confs / sizeof confs[0]);
    say("configure(%s)", confs[b]);
    long lines = S.lines;
    int rc = tally_configure(confs[b]);
    if (b < NCONF_GOOD)
        REQUIRE(rc == 0, "configure(%s) returned %d", confs[b], rc);
    else
        expect_reported(rc, TALLY_ECONF, lines, "config:");
}

/* Bytes are valid UTF-8 (RFC 8259: a JSON text is UTF-8). */
static bool utf8_ok(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        int k = c < 0x80 ? 0 : (c & 0xe0) == 0xc0 ? 1 : (c & 0xf0) == 0xe0 ? 2 : (c & 0xf8) == 0xf0 ? 3 : -1;
        if (k < 0 || (k == 1 && c < 0xc2) || i + (size_t)k >= n + (k ? 0 : 1))
            return false;
        for (int j = 1; j <= k; j++)
            if ((s[i + (size_t)j] & 0xc0) != 0x80)
                return false;
        i += (size_t)k + 1;
    }
    return true;
}

void op_reports(reader_t *r)
{
    unsigned b = u8(r);
    int dev = read_device(r);
    bool ok = dev >= 0 && dev < NDEV;
    say("report %u (device %d)", b % 8, dev);
    switch (b % 8) {
    case 0: RC(tally_write_ledger(discard, NULL), 0); break;
    case 1: RC(tally_write_leaks((int)(b >> 3) & 1, discard, NULL), 0); break;
    case 2: RC(tally_write_summary(dev, (int)(b >> 3) & 1, discard, NULL), ok ? 0 : -TALLY_EINVAL); break;
    case 3: RC(tally_write_stats_json(dev, discard, NULL), ok ? 0 : -TALLY_EINVAL); break;
    case 4: RC(tally_write_options(discard, NULL), 0); break;
    case 5: { /* the writers refuse a NULL callback */
        RC(tally_write_ledger(NULL, NULL), -TALLY_EINVAL);
        RC(tally_write_leaks(1, NULL, NULL), -TALLY_EINVAL);
        RC(tally_write_summary(0, 0, NULL, NULL), -TALLY_EINVAL);
        RC(tally_write_stats_json(0, NULL, NULL), -TALLY_EINVAL);
        RC(tally_write_options(NULL, NULL), -TALLY_EINVAL);
        break;
    }
    case 6: { /* a path that cannot be written */
        RC(tally_write_report("/nonexistent-dir-of-tally/r.json"), -TALLY_EIO);
        break;
    }
    default: { /* the JSON report, read back */
        /* The report holds every ledger row (tag, stage) the process has
         * made, so it grows to tens of KB and writing and parsing it took
         * 3.6 ms, longer than the rest of an input. It is written and read
         * back at most once per REPORT_EVERY inputs (the first input of the
         * process included, so a replay does it): the rows it shows then
         * hold every name the inputs in between used. */
        if (!tmpdir[0] || (report_input && inputs - report_input < REPORT_EVERY))
            break;
        report_input = inputs;
        char path[300];
        snprintf(path, sizeof path, "%s/report.json", tmpdir);
        RC(tally_write_report(path), 0);
        FILE *f = fopen(path, "rb");
        REQUIRE(f != NULL, "report not written");
        static char buf[1 << 22];
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        static const char head[] = "{\"format\":\"tally-report\"";
        REQUIRE(n > sizeof head && memcmp(buf, head, sizeof head - 1) == 0, "the JSON report does not start %s",
                head);
        char err[200];
        tally_json_t *root = tally__json_parse(buf, n, err, sizeof err, NULL);
        REQUIRE(root != NULL, "the JSON report does not parse: %s", err);
        REQUIRE(root->type == TALLY_JSON_OBJECT, "the JSON report is not an object");
        tally__json_free(root);
        if (utf8_strict)
            REQUIRE(utf8_ok((const unsigned char *)buf, n), "the JSON report is not valid UTF-8");
        break;
    }
    }
}
