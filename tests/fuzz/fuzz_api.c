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
 * reserved byte, the backend's free memory equal to its total, and its
 * calls balanced (allocations and frees, reserves and unreserves, pages
 * mapped and unmapped).
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
#include "fuzz_api.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAXOPS 4000
#define CHECK_EVERY 16 /* calls between tally_check()s (see above) */

#ifndef CONF /* fuzz_api_expand.c sets its own */
#define CONF                                                                                                       \
    "backend:host,host_devices:3,host_capacity:96MiB,host_mode:virtual,max_split_size_mb:24,"                      \
    "roundup_power2_divisions:[1:2,4:4,>:1],garbage_collection_threshold:0.7,timeline_events:64,"                  \
    "leak_report:off,stage_report:true"
#endif

void *const streams[6] = {NULL, (void *)0x1010, (void *)0x1020, (void *)0x1030, (void *)0x1040,
                          (void *)0x1050};

bool trace;
static long check_every = CHECK_EVERY;
long inputs;       /* inputs run by this process */
bool utf8_strict; /* FUZZ_STRICT=1: known bugs fail too */
char tmpdir[256];

/* ---- reading the input ------------------------------------------------- */

unsigned u8(reader_t *r)
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
int read_device(reader_t *r)
{
    unsigned b = u8(r);
    switch (b % 16) {
    case 13: return -1;
    case 14: return NDEV;
    case 15: return b & 0x80 ? INT_MAX : INT_MIN;
    default: return (int)(b % 16 % NDEV);
    }
}

size_t read_size(reader_t *r)
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
void *read_alloc_stream(reader_t *r)
{
    return streams[u8(r) % 3];
}

void *read_stream(reader_t *r)
{
    return streams[u8(r) % 6];
}

static const char *const fixed_names[] = {"weights", "act", "grad", "optimizer", "kv-cache", "untagged",
                                          "(none)",  "train", "eval", "load"};

void read_name(reader_t *r, name_t *n)
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
