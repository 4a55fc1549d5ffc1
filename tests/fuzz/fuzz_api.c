/* Fuzz target: the public API as a sequence of calls decoded from the input,
 * checked against a small model after every call.
 *
 * Three simulated devices (host backend, virtual mode, 96 MiB each, so
 * out-of-memory is common), max_split_size and power-of-two rounding on,
 * garbage collection under a memory fraction. Operations: malloc (sizes,
 * devices and streams from the input, including 0, negative and huge sizes
 * and bad devices), free, free_checked (right and wrong size / device),
 * double free, interior-pointer and foreign-pointer free, record_stream,
 * host stream hold / release, tag push / pop and stage begin / end (names
 * from the input, valid or not), empty_cache, set_memory_fraction (good and
 * bad fractions), peak and accumulated resets, backend fault injection
 * (tally_host_fail_alloc), runtime tally_configure, every report writer
 * (ledger, leaks, summary, stats JSON, options: discarded; the JSON report
 * to a temporary file, then parsed, once per 64 inputs), block_info and
 * mem_get_info.
 *
 * After every call: each device's allocation.all.current equals the model's
 * live blocks on it; the call's return value and error are the ones the
 * model predicts (bad arguments are refused with the right
 * code and change nothing; a failed malloc of a valid request is an OOM,
 * counted once in num_ooms and reported on the sink). A new block is
 * 512-aligned and overlaps no live block; block_info gives its size, device,
 * stream, tag and stage. At the end of each input everything is freed and
 * undone, and each device must be empty: no allocation, no active block, no
 * reserved byte, and the backend's free memory equal to its total.
 *
 * tally_check() (every segment, every non-empty pool bin, every ledger row)
 * runs after every CHECK_EVERY-th call, after the last call of an input and
 * after the clean-up. Run after every call it was three quarters of the
 * time (docs/testing.md); a broken invariant stays broken, so checking every
 * few calls still catches it, a few calls later. FUZZ_API_CHECK_EVERY=N
 * overrides the interval (1: after every call, to find the exact call).
 *
 * A violation prints the operation number and aborts (a libFuzzer crash).
 * FUZZ_API_TRACE=1 prints each operation (for minimising a crash by hand). */
#include "core/internal.h"
#include "report/json.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NDEV 3
#define CAPACITY ((size_t)96 << 20)
#define MAXLIVE 256
#define MAXFREED 64
#define DEPTH 64 /* tag stack (lib/ledger/ledger.c) and stage stack (lib/ledger/stage.c) */
#define MAXOPS 4000
#define CHECK_EVERY 16 /* calls between tally_check()s (see above) */

#ifndef CONF /* fuzz_api_expand.c sets its own */
#define CONF                                                                                                       \
    "backend:host,host_devices:3,host_capacity:96MiB,host_mode:virtual,max_split_size_mb:24,"                      \
    "roundup_power2_divisions:[1:2,4:4,>:1],garbage_collection_threshold:0.7,timeline_events:64,"                  \
    "leak_report:off,stage_report:true"
#endif

static void *const streams[6] = {NULL, (void *)0x1010, (void *)0x1020, (void *)0x1030, (void *)0x1040,
                                 (void *)0x1050};
#define NHOLD 4 /* streams[2..5] may be held */

typedef struct live {
    void *p;
    size_t req, size;
    int dev;
    void *stream;
} live_t;

typedef struct name {
    char s[256];
    bool null;
} name_t;

static struct model {
    live_t live[MAXLIVE];
    int nlive;
    struct freed {
        void *p;
        int dev;
        long seq; /* frees on dev before it */
    } freed[MAXFREED];
    int nfreed;
    long frees[NDEV];
    char tags[DEPTH][256];
    int ntags;
    char stages[DEPTH][256];
    int nstages;
    bool held[NHOLD];
    long op;
    int opcode;
} M;

static bool trace;
static long check_every = CHECK_EVERY;
static long last_check; /* the call after which tally_check() last ran */
#define REPORT_EVERY 64  /* inputs between JSON reports read back (op_reports) */
static long inputs;       /* inputs run by this process */
static long report_input; /* the input that last read the JSON report back */
static bool utf8_strict; /* FUZZ_STRICT=1: known bugs fail too */
static char tmpdir[256];

/* ---- the sink: counts lines; keeps the text of the current operation ---- */

static struct sink {
    long lines;
    char text[16384];
    size_t len;
} S;

static void sink(void *arg, const char *text, size_t len)
{
    (void)arg;
    for (size_t i = 0; i < len; i++)
        S.lines += text[i] == '\n';
    size_t room = sizeof S.text - 1 - S.len;
    if (len > room)
        len = room;
    memcpy(S.text + S.len, text, len);
    S.len += len;
    S.text[S.len] = 0;
}

static void sink_clear(void)
{
    S.len = 0;
    S.text[0] = 0;
}

static void discard(void *arg, const char *text, size_t len)
{
    (void)arg;
    (void)text;
    (void)len;
}

/* ---- failing ------------------------------------------------------------- */

__attribute__((noreturn, format(printf, 1, 2))) static void violated(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "fuzz_api: op %ld (opcode %d): ", M.op, M.opcode);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n  last error: %s\n  sink (this operation): %.2000s\n", tally_last_error(), S.text);
    abort();
}

#define REQUIRE(cond, ...)                                                                                         \
    do {                                                                                                           \
        if (!(cond))                                                                                               \
            violated(__VA_ARGS__);                                                                                 \
    } while (0)

#define RC(call, want)                                                                                             \
    do {                                                                                                           \
        int rc_ = (call);                                                                                          \
        if (rc_ != (want))                                                                                         \
            violated("%s returned %d, expected %d", #call, rc_, (want));                                          \
    } while (0)

static void say(const char *fmt, ...)
{
    if (!trace)
        return;
    va_list ap;
    fprintf(stderr, "op %ld: ", M.op);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* ---- reading the input ------------------------------------------------- */

typedef struct reader {
    const unsigned char *p;
    size_t n, i;
} reader_t;

static unsigned u8(reader_t *r)
{
    return r->i < r->n ? r->p[r->i++] : 0;
}

static uint32_t u32(reader_t *r)
{
    uint32_t v = 0;
    for (int k = 0; k < 4; k++)
        v = v << 8 | u8(r);
    return v;
}

/* 0..2 mostly; sometimes -1, 3 or an extreme. */
static int read_device(reader_t *r)
{
    unsigned b = u8(r);
    switch (b % 16) {
    case 13: return -1;
    case 14: return NDEV;
    case 15: return b & 0x80 ? INT_MAX : INT_MIN;
    default: return (int)(b % 16 % NDEV);
    }
}

static size_t read_size(reader_t *r)
{
    unsigned kind = u8(r);
    uint32_t x = u32(r);
    switch (kind % 16) {
    case 0: return 0;
    case 1: case 2: case 3: case 4: case 5: return 1 + x % 4096;                  /* tiny */
    case 6: case 7: case 8: return 1 + x % ((size_t)1 << 20);                      /* small pool */
    case 9: case 10: return ((size_t)1 << 20) + x % ((size_t)9 << 20);            /* 1..10 MiB */
    case 11: case 12: return ((size_t)10 << 20) + x % ((size_t)30 << 20);         /* 10..40 MiB */
    case 13: return ((size_t)40 << 20) + x % ((size_t)80 << 20);                  /* maybe over capacity */
    case 14: return (size_t)x << (kind >> 4);                                       /* up to 2^47 */
    default: return kind & 0x80 ? SIZE_MAX - x : ((size_t)1 << 63) + x;             /* negative as ssize_t */
    }
}

/* Allocation streams: NULL and two others (each stream a block is
 * allocated on gets a small-pool bin set on its device, which every
 * tally_check and tally_get_stats walks in full); record_stream and holds
 * use all six. */
static void *read_alloc_stream(reader_t *r)
{
    return streams[u8(r) % 3];
}

static void *read_stream(reader_t *r)
{
    return streams[u8(r) % 6];
}

static const char *const fixed_names[] = {"weights", "act", "grad", "optimizer", "kv-cache", "untagged",
                                          "(none)",  "train", "eval", "load"};

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

static void read_name(reader_t *r, name_t *n)
{
    unsigned spec = u8(r);
    memset(n, 0, sizeof *n);
    switch (spec % 13) {
    case 10: { /* 1..3 raw bytes from the input (a NUL ends it early) */
        int len = 1 + (int)(spec >> 4) % 3;
        for (int i = 0; i < len; i++)
            n->s[i] = (char)u8(r);
        break;
    }
    case 11:
        break; /* "" */
    case 12:
        if (spec >> 4 < 5)
            n->null = true;
        else
            memset(n->s, 'x', spec >> 4 < 10 ? 200 : 201);
        break;
    default:
        snprintf(n->s, sizeof n->s, "%s", fixed_names[spec % 13]);
    }
}

/* ---- model helpers --------------------------------------------------------- */

static int live_find(const void *p)
{
    for (int i = 0; i < M.nlive; i++)
        if (M.live[i].p == p)
            return i;
    return -1;
}

static void forget_freed(const void *p)
{
    for (int i = 0; i < M.nfreed;) {
        if (M.freed[i].p == p)
            M.freed[i] = M.freed[--M.nfreed];
        else
            i++;
    }
}

static void model_free(int i)
{
    void *p = M.live[i].p;
    int dev = M.live[i].dev;
    M.live[i] = M.live[--M.nlive];
    forget_freed(p);
    int slot = M.nfreed == MAXFREED ? rand() % MAXFREED : M.nfreed++;
    M.freed[slot].p = p;
    M.freed[slot].dev = dev;
    M.freed[slot].seq = M.frees[dev]++;
}

static tally_stats_t stats(int dev)
{
    tally_stats_t s;
    RC(tally_get_stats(dev, &s), 0);
    return s;
}

static int64_t live_on(int dev)
{
    int64_t n = 0;
    for (int i = 0; i < M.nlive; i++)
        n += M.live[i].dev == dev;
    return n;
}

static const char *top_tag(void)
{
    return M.ntags ? M.tags[M.ntags - 1] : "untagged";
}

static const char *top_stage(void)
{
    return M.nstages ? M.stages[M.nstages - 1] : "(none)";
}

static void expect_info(const live_t *l, bool check_names, const char *tag, const char *stage)
{
    tally_block_info_t info;
    RC(tally_block_info(l->p, &info), 0);
    REQUIRE(info.device == l->dev, "block %p: device %d, expected %d", l->p, info.device, l->dev);
    REQUIRE(info.requested_size == l->req, "block %p: requested %zu, expected %zu", l->p, info.requested_size, l->req);
    REQUIRE(info.size == l->size, "block %p: size %zu, was %zu", l->p, info.size, l->size);
    REQUIRE(info.stream == l->stream, "block %p: stream %p, expected %p", l->p, info.stream, l->stream);
    if (check_names) {
        REQUIRE(strcmp(tally_tag_name(info.tag), tag) == 0, "block %p: tag '%s', expected '%s'", l->p,
                tally_tag_name(info.tag), tag);
        REQUIRE(strcmp(tally_stage_name(info.stage), stage) == 0, "block %p: stage '%s', expected '%s'", l->p,
                tally_stage_name(info.stage), stage);
    }
}

static void check_all(bool full, bool every_block)
{
    if (full) {
        if (tally_check() != 0)
            violated("tally_check (last clean after op %ld): %s", last_check, tally_last_error());
        last_check = M.op;
    }
    for (int d = 0; d < NDEV; d++) {
        tally_stats_t s = stats(d);
        REQUIRE(s.allocation[0].current == live_on(d), "device %d: allocation.all.current %lld, model has %lld", d,
                (long long)s.allocation[0].current, (long long)live_on(d));
        REQUIRE(s.reserved_bytes[0].current <= (int64_t)CAPACITY, "device %d: reserved %lld over capacity", d,
                (long long)s.reserved_bytes[0].current);
    }
    if (every_block)
        for (int i = 0; i < M.nlive; i++)
            expect_info(&M.live[i], false, NULL, NULL);
}

/* Nothing but a report on the sink may come of a bad pointer. */
typedef struct snapshot {
    int64_t alloc[NDEV], active[NDEV], reserved[NDEV], ooms[NDEV];
} snapshot_t;

static snapshot_t snap(void)
{
    snapshot_t x;
    for (int d = 0; d < NDEV; d++) {
        tally_stats_t s = stats(d);
        x.alloc[d] = s.allocation[0].current;
        x.active[d] = s.active[0].current;
        x.reserved[d] = s.reserved_bytes[0].current;
        x.ooms[d] = s.num_ooms;
    }
    return x;
}

static void expect_unchanged(const snapshot_t *a, const char *what)
{
    snapshot_t b = snap();
    for (int d = 0; d < NDEV; d++)
        REQUIRE(a->alloc[d] == b.alloc[d] && a->active[d] == b.active[d] && a->reserved[d] == b.reserved[d],
                "%s changed device %d: allocations %lld -> %lld, active %lld -> %lld, reserved %lld -> %lld", what,
                d, (long long)a->alloc[d], (long long)b.alloc[d], (long long)a->active[d], (long long)b.active[d],
                (long long)a->reserved[d], (long long)b.reserved[d]);
}

/* A call that must fail with code and one new sink line naming fn. */
static void expect_reported(int rc, int code, long lines_before, const char *fn)
{
    REQUIRE(rc == -code, "%s returned %d, expected %d", fn, rc, -code);
    REQUIRE(S.lines == lines_before + 1, "%s: %ld sink lines, expected 1", fn, S.lines - lines_before);
    REQUIRE(strstr(S.text, fn) != NULL, "%s: the sink line does not name it", fn);
}

/* ---- operations ----------------------------------------------------------- */

static void op_malloc(reader_t *r)
{
    int dev = read_device(r);
    size_t size = read_size(r);
    void *stream = read_alloc_stream(r);
    say("malloc(%zu, %d, %p)", size, dev, stream);
    bool refused = size == 0 || (ssize_t)size < 0 || dev < 0 || dev >= NDEV;
    snapshot_t before;
    int64_t ooms = 0;
    if (refused)
        before = snap();
    else
        ooms = stats(dev).num_ooms;
    long lines = S.lines;
    void *p = tally_malloc(size, dev, stream);
    if (size == 0) {
        REQUIRE(p == NULL, "malloc(0) returned %p", p);
        REQUIRE(S.lines == lines, "malloc(0) wrote to the sink");
        expect_unchanged(&before, "malloc(0)");
        return;
    }
    if (refused) {
        REQUIRE(p == NULL, "malloc(%zu, %d) of a bad argument returned %p", size, dev, p);
        expect_reported(-TALLY_EINVAL, TALLY_EINVAL, lines, "tally_malloc");
        expect_unchanged(&before, "a refused malloc");
        return;
    }
    if (!p) {
        /* The only way a valid request fails on the host backend; the
         * allocation counts are compared after every operation. */
        REQUIRE(strstr(tally_last_error(), "out of memory on device") != NULL,
                "malloc(%zu, %d) failed other than out of memory", size, dev);
        tally_stats_t s = stats(dev);
        REQUIRE(s.num_ooms == ooms + 1, "device %d: num_ooms %lld -> %lld after one OOM", dev, (long long)ooms,
                (long long)s.num_ooms);
        char want[80];
        snprintf(want, sizeof want, "tally: out of memory on device %d: asked %zu bytes", dev, size);
        REQUIRE(S.lines > lines && strstr(S.text, want), "OOM not reported on the sink (want '%s')", want);
        return;
    }
    REQUIRE((uintptr_t)p % 512 == 0, "malloc returned %p, not 512-byte aligned", p);
    REQUIRE(M.nlive < MAXLIVE, "model full");
    REQUIRE(S.lines == lines, "a successful malloc wrote to the sink");
    tally_block_info_t info;
    RC(tally_block_info(p, &info), 0);
    REQUIRE(info.size >= size, "block %p of %zu bytes for a request of %zu", p, info.size, size);
    for (int i = 0; i < M.nlive; i++) {
        const live_t *o = &M.live[i];
        REQUIRE((uintptr_t)p + info.size <= (uintptr_t)o->p || (uintptr_t)o->p + o->size <= (uintptr_t)p,
                "new block [%p, +%zu) overlaps live block [%p, +%zu)", p, info.size, o->p, o->size);
    }
    live_t *l = &M.live[M.nlive++];
    *l = (live_t){p, size, info.size, dev, stream};
    forget_freed(p);
    expect_info(l, true, top_tag(), top_stage());
}

static void op_free(reader_t *r)
{
    unsigned how = u8(r), which = u8(r);
    if (!M.nlive)
        return;
    int i = (int)(which % (unsigned)M.nlive);
    live_t l = M.live[i];
    say("free(%p) how %u", l.p, how % 4);
    long lines = S.lines;
    switch (how % 4) {
    case 0:
    case 1:
        tally_free(l.p);
        REQUIRE(S.lines == lines, "a good free wrote to the sink");
        break;
    case 2:
        RC(tally_free_checked(l.p, l.req, l.dev), 0);
        break;
    default: { /* wrong size or device: refused with a report, freed anyway */
        bool wrong_dev = how & 4;
        int rc = tally_free_checked(l.p, wrong_dev ? l.req : l.req + 1, wrong_dev ? (l.dev + 1) % NDEV : l.dev);
        expect_reported(rc, TALLY_EINVAL, lines, "tally_free");
        break;
    }
    }
    model_free(i);
    tally_block_info_t info;
    REQUIRE(tally_block_info(l.p, &info) == -TALLY_EINVAL, "block_info of a freed block succeeded");
}

static void op_bad_pointer(reader_t *r)
{
    unsigned kind = u8(r), which = u8(r), off = u8(r);
    void *p = NULL;
    const struct freed *fr = NULL;
    int stack_var;
    switch (kind % 5) {
    case 0: /* double free of a block freed earlier and not live again */
        if (!M.nfreed)
            return;
        fr = &M.freed[which % (unsigned)M.nfreed];
        p = fr->p;
        if (live_find(p) >= 0)
            return;
        break;
    case 1: /* interior pointer */
        if (!M.nlive)
            return;
        {
            const live_t *l = &M.live[which % (unsigned)M.nlive];
            if (l->size <= 512)
                return;
            size_t k = 1 + off % (l->size / 512 - 1);
            p = (char *)l->p + (kind & 0x80 ? k * 512 : k);
        }
        break;
    case 2:
        p = &stack_var;
        break;
    case 3:
        p = (void *)(uintptr_t)(0x1000 + 512 * (uintptr_t)off);
        break;
    default:
        p = NULL;
        break;
    }
    unsigned call = (kind >> 3) % 4;
    say("bad pointer %p kind %u call %u", p, kind % 5, call);
    snapshot_t before = snap();
    long lines = S.lines;
    if (!p) {
        tally_free(NULL);
        RC(tally_free_checked(NULL, 1, 0), 0);
        RC(tally_record_stream(NULL, streams[1]), -TALLY_EINVAL);
        REQUIRE(S.lines == lines + 1, "free(NULL) or record_stream(NULL): %ld lines", S.lines - lines);
        return;
    }
    switch (call) {
    case 0:
        tally_free(p);
        REQUIRE(S.lines == lines + 1, "bad free of %p: %ld sink lines, expected 1", p, S.lines - lines);
        REQUIRE(strstr(S.text, "tally_free"), "bad free not reported");
        break;
    case 1:
        expect_reported(tally_free_checked(p, 512, 0), TALLY_EINVAL, lines, "tally_free");
        break;
    case 2:
        expect_reported(tally_record_stream(p, streams[2]), TALLY_EINVAL, lines, "tally_record_stream");
        break;
    default: {
        tally_block_info_t info;
        RC(tally_block_info(p, &info), -TALLY_EINVAL);
        REQUIRE(S.lines == lines, "block_info wrote to the sink");
        break;
    }
    }
    /* The device remembers its last 1024 frees (TALLY_FREED_RING). */
    if (fr && call < 2 && M.frees[fr->dev] - fr->seq <= 1000)
        REQUIRE(strstr(S.text, "double free"), "a double free of %p is not called one", p);
    expect_unchanged(&before, "a bad pointer");
}

static void op_record(reader_t *r)
{
    unsigned which = u8(r);
    void *s = read_stream(r);
    if (!M.nlive)
        return;
    live_t *l = &M.live[which % (unsigned)M.nlive];
    say("record_stream(%p, %p)", l->p, s);
    RC(tally_record_stream(l->p, s), 0);
}

static void op_hold(reader_t *r)
{
    unsigned b = u8(r);
    int h = (int)(b % NHOLD);
    int on = (b >> 2) & 1;
    say("hold(%p, %d)", streams[2 + h], on);
    RC(tally_host_stream_hold(streams[2 + h], on), 0);
    M.held[h] = on;
}

static void op_tag_push(reader_t *r)
{
    name_t n;
    read_name(r, &n);
    say("tag_push(%s)", n.null ? "NULL" : n.s);
    int want = n.null ? -TALLY_EINVAL : M.ntags == DEPTH ? -TALLY_ESTATE : !name_valid(&n) ? -TALLY_EINVAL : 0;
    RC(tally_tag_push(n.null ? NULL : n.s), want);
    if (want == 0)
        snprintf(M.tags[M.ntags++], 256, "%s", n.s);
}

static void op_tag_pop(reader_t *r)
{
    (void)r;
    say("tag_pop");
    RC(tally_tag_pop(), M.ntags ? 0 : -TALLY_ESTATE);
    if (M.ntags)
        M.ntags--;
}

static void op_stage_begin(reader_t *r)
{
    name_t n;
    read_name(r, &n);
    say("stage_begin(%s)", n.null ? "NULL" : n.s);
    int want = n.null || !name_valid(&n) ? -TALLY_EINVAL : M.nstages == DEPTH ? -TALLY_ESTATE : 0;
    RC(tally_stage_begin(n.null ? NULL : n.s), want);
    if (want == 0)
        snprintf(M.stages[M.nstages++], 256, "%s", n.s);
}

static void op_stage_end(reader_t *r)
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

static void op_empty_cache(reader_t *r)
{
    int dev = read_device(r);
    say("empty_cache(%d)", dev);
    int64_t before[NDEV], total_before = 0, total_after = 0;
    for (int d = 0; d < NDEV; d++)
        total_before += before[d] = stats(d).reserved_bytes[0].current;
    long lines = S.lines;
    size_t released = tally_empty_cache(dev);
    for (int d = 0; d < NDEV; d++) {
        int64_t after = stats(d).reserved_bytes[0].current;
        total_after += after;
        if (dev != -1 && dev != d)
            REQUIRE(after == before[d], "empty_cache(%d) changed device %d", dev, d);
    }
    if (dev != -1 && (dev < 0 || dev >= NDEV)) {
        REQUIRE(released == 0, "empty_cache of a bad device released %zu", released);
        expect_reported(-TALLY_EINVAL, TALLY_EINVAL, lines, "tally_empty_cache");
    }
    REQUIRE((int64_t)released == total_before - total_after, "empty_cache says %zu released, reserved fell by %lld",
            released, (long long)(total_before - total_after));
}

static void op_fraction(reader_t *r)
{
    static const double fractions[] = {0.0, 0.05, 0.25, 0.5, 0.9, 1.0, -0.1, 1.5, NAN, INFINITY, 1e-300, -0.0};
    unsigned b = u8(r);
    int dev = read_device(r);
    double f = fractions[b % (sizeof fractions / sizeof fractions[0])];
    say("set_memory_fraction(%g, %d)", f, dev);
    bool ok = f >= 0.0 && f <= 1.0 && dev >= 0 && dev < NDEV;
    long lines = S.lines;
    int rc = tally_set_memory_fraction(f, dev);
    if (ok)
        REQUIRE(rc == 0, "set_memory_fraction(%g, %d) returned %d", f, dev, rc);
    else
        expect_reported(rc, TALLY_EINVAL, lines, "tally_set_memory_fraction");
}

static void op_resets(reader_t *r)
{
    unsigned b = u8(r);
    int dev = read_device(r);
    bool ok = dev >= 0 && dev < NDEV;
    say("reset %s(%d)", b & 1 ? "accumulated" : "peak", dev);
    int rc = b & 1 ? tally_reset_accumulated_stats(dev) : tally_reset_peak_stats(dev);
    REQUIRE(rc == (ok ? 0 : -TALLY_EINVAL), "reset(%d) returned %d", dev, rc);
    if (ok && !(b & 1)) {
        tally_stats_t s = stats(dev);
        REQUIRE(s.allocation[0].peak == s.allocation[0].current, "peak not reset");
    }
}

static void op_fail_alloc(reader_t *r)
{
    unsigned b = u8(r);
    uint64_t nth = b % 8, every = (b >> 3) % 8;
    say("host_fail_alloc(%llu, %llu)", (unsigned long long)nth, (unsigned long long)every);
    RC(tally_host_fail_alloc(nth, every), 0);
}

static const char *const confs[] = {
    "release_at_stage_end:true", "release_at_stage_end:false", "stage_report:false", "stage_report:true",
    "timeline:true", "timeline:false", "backtrace_depth:3", "backtrace_depth:0", "persistent_tags:weights|act",
    "persistent_tags:", "memory_fraction:0.5", "leak_report:full", "leak_report:off",
    /* refused: not runtime keys, or bad values; nothing changes */
    "host_devices:2", "ledger:false", "memory_fraction:2", "stage_report:maybe", "release_at_stage_end:true,bogus:1",
};
#define NCONF_GOOD 13
static const char restore_conf[] = "release_at_stage_end:false,stage_report:true,timeline:false,backtrace_depth:0,"
                                   "persistent_tags:,leak_report:off";

static void op_configure(reader_t *r)
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

static void op_reports(reader_t *r)
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

static void op_info(reader_t *r)
{
    unsigned b = u8(r);
    int dev = read_device(r);
    say("info %u (device %d)", b % 3, dev);
    switch (b % 3) {
    case 0:
        if (M.nlive)
            expect_info(&M.live[(b >> 2) % (unsigned)M.nlive], false, NULL, NULL);
        break;
    case 1: {
        size_t fr = 0, total = 0;
        bool ok = dev >= 0 && dev < NDEV;
        RC(tally_mem_get_info(dev, &fr, &total), ok ? 0 : -TALLY_EINVAL);
        if (ok)
            REQUIRE(total == CAPACITY && fr <= total, "mem_get_info(%d): free %zu of %zu", dev, fr, total);
        RC(tally_mem_get_info(0, NULL, &total), -TALLY_EINVAL);
        break;
    }
    default: {
        tally_block_info_t info;
        RC(tally_get_stats(0, NULL), -TALLY_EINVAL);
        RC(tally_block_info(NULL, &info), -TALLY_EINVAL);
        if (M.nlive)
            RC(tally_block_info(M.live[0].p, NULL), -TALLY_EINVAL);
        break;
    }
    }
}

/* ---- undo everything ---------------------------------------------------- */

static void cleanup(void)
{
    M.opcode = -1;
    sink_clear();
    RC(tally_host_fail_alloc(0, 0), 0);
    while (M.nlive) {
        tally_free(M.live[M.nlive - 1].p);
        model_free(M.nlive - 1);
    }
    while (M.ntags) {
        RC(tally_tag_pop(), 0);
        M.ntags--;
    }
    RC(tally_tag_pop(), -TALLY_ESTATE);
    while (M.nstages) {
        RC(tally_stage_end(M.stages[M.nstages - 1]), 0);
        M.nstages--;
    }
    for (int h = 0; h < NHOLD; h++)
        RC(tally_host_stream_hold(streams[2 + h], 0), 0);
    RC(tally_configure(restore_conf), 0);
    for (int d = 0; d < NDEV; d++)
        RC(tally_set_memory_fraction(1.0, d), 0);
    tally_empty_cache(-1);
    check_all(true, false);
    for (int d = 0; d < NDEV; d++) {
        tally_stats_t s = stats(d);
        REQUIRE(s.allocation[0].current == 0 && s.active[0].current == 0 && s.reserved_bytes[0].current == 0 &&
                    s.segment[0].current == 0 && s.inactive_split[0].current == 0,
                "device %d not empty after freeing everything: %lld allocations, %lld active, %lld bytes reserved", d,
                (long long)s.allocation[0].current, (long long)s.active[0].current,
                (long long)s.reserved_bytes[0].current);
        size_t fr = 0, total = 0;
        RC(tally_mem_get_info(d, &fr, &total), 0);
        REQUIRE(fr == total, "device %d: the backend has %zu of %zu bytes free after everything went back", d, fr,
                total);
    }
}

/* ---- libFuzzer entry points ------------------------------------------------ */

static void remove_tmpdir(void)
{
    char path[300];
    snprintf(path, sizeof path, "%s/report.json", tmpdir);
    unlink(path);
    rmdir(tmpdir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *conf = getenv("FUZZ_API_CONF");
    setenv("TALLY_CONF", conf && *conf ? conf : CONF, 1);
    trace = getenv("FUZZ_API_TRACE") != NULL;
    const char *every = getenv("FUZZ_API_CHECK_EVERY");
    if (every && atol(every) > 0)
        check_every = atol(every);
    const char *s = getenv("FUZZ_STRICT");
    utf8_strict = s && *s == '1';
    tally_set_sink(sink, NULL);
    if (tally_init() != 0 || tally_device_count() != NDEV) {
        fprintf(stderr, "fuzz_api: cannot initialise: %s\n", tally_last_error());
        abort();
    }
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/tally-fuzz-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(tmpdir))
        tmpdir[0] = 0;
    else
        atexit(remove_tmpdir);
    return 0;
}

typedef void (*op_fn)(reader_t *);
static const op_fn ops[] = {
    op_malloc, op_malloc, op_malloc, op_malloc, op_free,        op_free,     op_free,       op_bad_pointer,
    op_record, op_hold,   op_tag_push, op_tag_pop, op_stage_begin, op_stage_end, op_empty_cache, op_fraction,
    op_resets, op_fail_alloc, op_configure, op_reports, op_info,
};
#define NOPS (sizeof ops / sizeof ops[0])

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    reader_t r = {data, size, 0};
    memset(&M, 0, sizeof M);
    last_check = 0;
    inputs++;
    srand(1);
    while (r.i < r.n && M.op < MAXOPS) {
        M.op++;
        M.opcode = (int)(u8(&r) % NOPS);
        sink_clear();
        ops[M.opcode](&r);
        check_all(M.op % check_every == 0, M.op % 64 == 0);
    }
    check_all(true, true);
    cleanup();
    if (tmpdir[0]) {
        char path[300];
        snprintf(path, sizeof path, "%s/report.json", tmpdir);
        unlink(path);
    }
    return 0;
}
