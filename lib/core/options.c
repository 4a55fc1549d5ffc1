/* Configuration: one table of options, parsed from TALLY_CONF
 * ("key:value,key:value", PyTorch's PYTORCH_CUDA_ALLOC_CONF style) and from
 * tally_configure(). Every key and value is validated; a bad one fails the
 * whole string with a message naming it, and nothing changes. */
#include "core/internal.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

tally_options_t tally__opt;

enum { T_BOOL, T_INT, T_SIZE, T_DOUBLE, T_ENUM, T_STRING, T_SPLIT_MB, T_ROUNDUP, T_HOME };

typedef struct option_row {
    const char *name;
    int type;
    size_t offset;
    double min, max;         /* T_INT, T_DOUBLE (inclusive unless noted in help) */
    const char *const *enums; /* T_ENUM: names, index = value */
    bool runtime;             /* may change after initialisation */
    const char *help;
} option_row_t;

/* Serialises tally_configure, initialisation and readers of the whole
 * option set. */
static tally_mutex_t config_lock = TALLY_MUTEX_INIT;
tally_mutex_t *tally__config_lock(void) { return &config_lock; }

void tally__opt_string(const char *field, char *buf)
{
    tally__mutex_lock(&config_lock);
    memcpy(buf, field, 512);
    tally__mutex_unlock(&config_lock);
    buf[511] = 0;
}

/* A check of a value that needs a layer above (the suppressions file is
 * read by the ledger's suppress.c); installed by the API. */
static int (*_Atomic checker)(const char *key, const char *value);

void tally__options_set_checker(int (*fn)(const char *key, const char *value))
{
    checker = fn;
}

static const char *const backend_names[] = {"auto", "host", "cuda", "async", NULL};
static const char *const host_mode_names[] = {"backed", "virtual", NULL};
static const char *const leak_names[] = {"off", "summary", "full", NULL};
static const char *const pool_names[] = {"default", "private", NULL};
static const char *const unwinder_names[] = {"auto", "glibc", "fp", NULL};
static const char *const sleep_alloc_names[] = {"refuse", "wake", NULL};

#define OFF(f) offsetof(tally_options_t, f)
static const option_row_t rows[] = {
    {"backend", T_ENUM, OFF(backend), 0, 0, backend_names, false,
     "where device memory comes from: auto (cuda if a device is visible, else host), host, cuda, async"},
    {"host_devices", T_INT, OFF(host_devices), 1, TALLY_MAX_DEVICES, NULL, false,
     "number of simulated devices of the host backend"},
    {"host_capacity", T_SIZE, OFF(host_capacity), 0, 0, NULL, false,
     "capacity of each simulated device (size with suffix, e.g. 80GiB)"},
    {"host_mode", T_ENUM, OFF(host_mode), 0, 0, host_mode_names, false,
     "backed: real host memory; virtual: address space only, never touched"},
    {"async_pool", T_ENUM, OFF(async_private_pool), 0, 0, pool_names, false,
     "async backend: the device's default memory pool, or a private one"},
    {"async_release_threshold", T_SIZE, OFF(async_release_threshold), 0, 0, NULL, false,
     "async backend: bytes the pool keeps cached after synchronisation ('all' keeps everything)"},
    {"max_split_size_mb", T_SPLIT_MB, OFF(max_split_size), 0, 0, NULL, false,
     "blocks at or above this size (MiB, >= 20) are never split; 'none' for unlimited"},
    {"large_segment_size_mb", T_INT, OFF(large_segment_size_mb), 2, 1024, NULL, false,
     "the large pool's segment for a request under 10 MiB (MiB; PyTorch's key, default 20)"},
    {"max_non_split_rounding_mb", T_SPLIT_MB, OFF(max_non_split_rounding), 0, 0, NULL, false,
     "a cached oversize block is reused for a request at most this much (MiB, >= 20) smaller"},
    {"expandable_segments", T_BOOL, OFF(expandable_segments), 0, 0, NULL, false,
     "large pool: one address range per stream, 2 MiB pages mapped where blocks live (host backend)"},
    {"expandable_small_shared", T_BOOL, OFF(expandable_small_shared), 0, 0, NULL, true,
     "expandable segments: the small pool's 2 MiB segments are pieces of the stream's expandable segment, "
     "given back there when free (one kept), so neither pool's idle memory is closed to the other"},
    {"expandable_small_pages", T_BOOL, OFF(expandable_small_pages), 0, 0, NULL, true,
     "expandable segments: the small pool of each stream is one range mapped in 2 MiB pages, grown at its end, "
     "whose free blocks merge across pages (PyTorch's); false: a 2 MiB segment each"},
    {"expandable_grow_chunk_mb", T_INT, OFF(expandable_grow_chunk_mb), 2, 1024, NULL, true,
     "expandable segments: a block under 10 MiB that grows its range maps pages up to the next multiple "
     "of this many MiB, in one call (2: only its own pages)"},
    {"expandable_handle_mb", T_INT, OFF(expandable_handle_mb), 0, 1 << 20, NULL, true,
     "expandable segments: a block of at least this many MiB maps its new pages as one physical handle "
     "(0: a handle per 2 MiB page everywhere)"},
    {"expandable_handle_grid_mb", T_INT, OFF(expandable_handle_grid_mb), 0, 1 << 20, NULL, true,
     "expandable segments with no moves (expandable_move_budget:0): a run of new pages is one physical "
     "handle per cell of this many MiB it crosses (short ends joining their neighbour), so empty_cache can "
     "unmap what no live block touches (0: one handle per map call)"},
    {"expandable_move_budget", T_INT, OFF(expandable_move_budget), -1, 1 << 30, NULL, true,
     "expandable segments: modelled driver microseconds a step may spend moving idle pages to lower the "
     "peak (0: never move, no driver call in a steady step; -1: no limit, the least memory)"},
    {"garbage_collection_threshold", T_DOUBLE, OFF(gc_threshold), 0, 1, NULL, true,
     "with a memory fraction set, reclaim old cached blocks above this share of it (0 < t < 1)"},
    {"roundup_power2_divisions", T_ROUNDUP, OFF(roundup_divisions), 0, 0, NULL, false,
     "round sizes to N power-of-two divisions: N, or [256:1,512:2,>:4] per size interval (MiB)"},
    {"memory_fraction", T_DOUBLE, OFF(memory_fraction), 0, 1, NULL, true,
     "cap each device's reserved memory at this fraction of its capacity (0 < f <= 1)"},
    {"ledger", T_BOOL, OFF(ledger), 0, 0, NULL, false,
     "record tag, stage and device of every block"},
    {"lock_bias", T_BOOL, OFF(lock_bias), 0, 0, NULL, true,
     "a device lock taken over and over by one thread is biased to it: taken with no atomic instruction "
     "until another thread takes it (needs membarrier(2); off where that is refused; false: no new bias)"},
    {"backtrace_depth", T_INT, OFF(backtrace_depth), 0, 64, NULL, true,
     "frames of native backtrace recorded per allocation (0: off)"},
    {"unwinder", T_ENUM, OFF(unwinder), 0, 0, unwinder_names, true,
     "native unwinder for backtrace_depth: auto (libunwind if installed, else glibc), glibc, fp (frame pointers)"},
    {"python_stack", T_INT, OFF(python_stack), 0, 64, NULL, true,
     "frames of the Python stack recorded per allocation (0: off)"},
    {"persistent_tags", T_STRING, OFF(persistent_tags), 0, 0, NULL, true,
     "tags left out of stage survivor reports, separated by |"},
    {"private_tags", T_STRING, OFF(private_tags), 0, 0, NULL, false,
     "tags whose blocks get pages of their own, so they can sleep and wake (docs/sleep.md), separated by |"},
    {"sleep_alloc", T_ENUM, OFF(sleep_alloc), 0, 0, sleep_alloc_names, true,
     "an allocation under a sleeping private tag: refuse (an error) or wake (the tag wakes first)"},
    {"sleep_pinned_cache", T_BOOL, OFF(sleep_pinned_cache), 0, 0, NULL, true,
     "keep a private tag's offload buffers pinned from its wake to its next sleep (freed by empty_cache)"},
    {"release_at_stage_end", T_BOOL, OFF(release_at_stage_end), 0, 0, NULL, true,
     "release cached free segments when a stage ends"},
    {"stage_report", T_BOOL, OFF(stage_report), 0, 0, NULL, true,
     "write the survivor report to the diagnostics sink at each stage end"},
    {"leak_report", T_ENUM, OFF(leak_report), 0, 0, leak_names, true,
     "report at exit: off, summary (one line), full (grouped live blocks)"},
    {"leak_exitcode", T_INT, OFF(leak_exitcode), 0, 255, NULL, true,
     "exit status when blocks are live at exit (0: keep the program's)"},
    {"report_path", T_STRING, OFF(report_path), 0, 0, NULL, true,
     "JSON report written at exit; %p becomes the pid, %r the rank, %% a %"},
    {"leak_suppressions", T_STRING, OFF(leak_suppressions), 0, 0, NULL, true,
     "file of leak:PATTERN lines; matching leaks are counted apart and never set leak_exitcode"},
    {"home_device", T_HOME, OFF(home_setting), 0, 0, NULL, true,
     "this process's device: auto (LOCAL_RANK, else none), none, or a number"},
    {"timeline", T_BOOL, OFF(timeline), 0, 0, NULL, true,
     "record a bounded timeline of allocation events for plots and snapshots"},
    {"timeline_events", T_INT, OFF(timeline_events), 16, 1 << 24, NULL, false,
     "events kept in the timeline ring"},
    {"trace", T_BOOL, OFF(trace), 0, 0, NULL, true,
     "record every allocation and free (time, size, stream) in the JSON report, for tally tune"},
};
#define NROWS (sizeof rows / sizeof rows[0])
_Static_assert(NROWS <= 64, "the seen mask of tally__options_parse holds 64 keys");

void tally__options_default(tally_options_t *o)
{
    memset(o, 0, sizeof *o);
    o->backend = TALLY_BACKEND_AUTO;
    o->host_devices = 1;
    o->host_capacity = (uint64_t)80 << 30;
    o->host_mode = TALLY_HOST_BACKED;
    o->max_split_size = UINT64_MAX;
    o->max_non_split_rounding = (uint64_t)20 << 20;
    o->gc_threshold = 0;
    o->expandable_grow_chunk_mb = 20;
    o->expandable_small_pages = 1;
    o->large_segment_size_mb = 20;
    o->expandable_handle_grid_mb = 20; /* PyTorch's large page (docs/benchmarks.md, run Z) */
    o->expandable_handle_mb = 0; /* off: least memory (docs/benchmarks.md, run G) */
    o->expandable_move_budget = 0; /* no page moves: no driver call in a steady step (issue 21) */
    /* roundup_divisions stay 0 (the memset): PyTorch's default rounding. */
    o->ledger = 1;
    o->lock_bias = 1;
    o->stage_report = 1;
    o->sleep_pinned_cache = 1;
    o->leak_report = TALLY_LEAK_SUMMARY;
    o->home_device = -1;
    o->home_setting = -2;
    o->timeline_events = 65536;
    o->async_release_threshold = UINT64_MAX;
}

bool tally__parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    if (!*s || *s == '-' || *s == '+')
        return false;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0)
        return false;
    static const struct { const char *suffix; double mult; } units[] = {
        {"", 1}, {"B", 1}, {"K", 1024.0}, {"KB", 1e3}, {"KiB", 1024.0}, {"M", 1048576.0}, {"MB", 1e6},
        {"MiB", 1048576.0}, {"G", 1073741824.0}, {"GB", 1e9}, {"GiB", 1073741824.0},
        {"T", 1099511627776.0}, {"TB", 1e12}, {"TiB", 1099511627776.0},
    };
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(end, units[i].suffix) == 0) {
            double b = v * units[i].mult;
            if (b >= 18446744073709551615.0 || b != floor(b))
                return false;
            *out = (uint64_t)b;
            return true;
        }
    }
    return false;
}

static int parse_bool(const char *v, int *out)
{
    static const char *const yes[] = {"1", "true", "yes", "on"};
    static const char *const no[] = {"0", "false", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(v, yes[i]) == 0) {
            *out = 1;
            return 0;
        }
        if (strcasecmp(v, no[i]) == 0) {
            *out = 0;
            return 0;
        }
    }
    return -1;
}

static int parse_long(const char *v, long long *out)
{
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end)
        return -1;
    *out = x;
    return 0;
}

static bool is_pow2(long long x)
{
    return x > 0 && (x & (x - 1)) == 0;
}

/* A list entry K (MiB) governs sizes in [K MiB, 2K MiB): slot floor(log2 K). */
static int interval_index(long long mib)
{
    int i = 0;
    while ((2LL << i) <= mib)
        i++;
    return i < TALLY_ROUNDUP_INTERVALS ? i : TALLY_ROUNDUP_INTERVALS - 1;
}

/* "N" or "[256:1,512:2,>:4]" (sizes in MiB, powers of two; divisions 0/1 or
 * powers of two). The list is comma-separated inside brackets, so the caller
 * splits the configuration string bracket-aware. */
static int parse_roundup(const char *key, const char *v, uint32_t *div)
{
    long long n;
    uint32_t tmp[TALLY_ROUNDUP_INTERVALS];
    if (v[0] != '[') {
        /* 0 (off) is accepted too, so the printed form always parses back. */
        if (parse_long(v, &n) || (n != 0 && !is_pow2(n)) || n > 65536)
            return tally__fail(TALLY_ECONF, "config: %s: '%s' is not a power of two", key, v);
        for (int i = 0; i < TALLY_ROUNDUP_INTERVALS; i++)
            div[i] = (uint32_t)n;
        return 0;
    }
    size_t len = strlen(v);
    if (len < 2 || v[len - 1] != ']')
        return tally__fail(TALLY_ECONF, "config: %s: '%s' lacks a closing ']'", key, v);
    memset(tmp, 0, sizeof tmp);
    char buf[256];
    if (len - 2 >= sizeof buf)
        return tally__fail(TALLY_ECONF, "config: %s: value too long", key);
    memcpy(buf, v + 1, len - 2);
    buf[len - 2] = 0;
    int last = -1;
    char *save = NULL;
    for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(item, ':');
        if (!colon)
            return tally__fail(TALLY_ECONF, "config: %s: entry '%s' is not SIZE:DIVISIONS", key, item);
        *colon = 0;
        long long d;
        if (parse_long(colon + 1, &d) || (d != 0 && d != 1 && !is_pow2(d)) || d > 65536)
            return tally__fail(TALLY_ECONF, "config: %s: divisions '%s' is not a power of two", key, colon + 1);
        if (strcmp(item, ">") == 0) {
            for (int i = last + 1; i < TALLY_ROUNDUP_INTERVALS; i++)
                tmp[i] = (uint32_t)d;
            last = TALLY_ROUNDUP_INTERVALS - 1;
            continue;
        }
        long long mib;
        if (parse_long(item, &mib) || !is_pow2(mib))
            return tally__fail(TALLY_ECONF, "config: %s: size '%s' is not a power of two (MiB)", key, item);
        int idx = interval_index(mib);
        if (idx <= last)
            return tally__fail(TALLY_ECONF, "config: %s: sizes must increase ('%s')", key, item);
        /* The first entry also covers every smaller size; later entries set
         * their own slot only (as PyTorch does). */
        if (last < 0)
            for (int i = 0; i < idx; i++)
                tmp[i] = (uint32_t)d;
        tmp[idx] = (uint32_t)d;
        last = idx;
    }
    memcpy(div, tmp, sizeof tmp);
    return 0;
}

uint64_t tally__option_bit(const char *key)
{
    for (size_t i = 0; i < NROWS; i++)
        if (strcmp(rows[i].name, key) == 0)
            return 1ull << i;
    return 0;
}

/* Edits (insert, delete, substitute, swap two neighbours) from a to b
 * (also the stats reader's "did you mean", stats_json.c). */
size_t tally__edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64 || lb > 64)
        return 64;
    size_t d[65][65];
    for (size_t i = 0; i <= la; i++)
        d[i][0] = i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = j;
    for (size_t i = 1; i <= la; i++) {
        for (size_t j = 1; j <= lb; j++) {
            size_t best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < best)
                best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best)
                best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    }
    return d[la][lb];
}

/* Environment variables that look like configuration tally never reads:
 * a key as its own variable (LEAK_REPORT=full, TALLY_LEAK_REPORT=full) or a
 * misspelt TALLY_CONF (TALLY_CONFIG, TALLY_CNF). One line each on the sink,
 * naming the TALLY_CONF item meant; nothing changes. A bare name counts only
 * in capitals and with an underscore (LEAK_REPORT, not BACKEND or TRACE,
 * which other programs use). */
extern char **environ;
void tally__env_hints(void)
{
    for (char **e = environ; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        size_t n = eq ? (size_t)(eq - *e) : 0;
        if (n == 0 || n >= 64)
            continue;
        char name[64], key[64];
        memcpy(name, *e, n);
        name[n] = 0;
        bool upper = true;
        for (size_t i = 0; i < n; i++)
            upper = upper && ((name[i] >= 'A' && name[i] <= 'Z') || (name[i] >= '0' && name[i] <= '9') || name[i] == '_');
        if (!upper)
            continue;
        bool prefixed = strncmp(name, "TALLY_", 6) == 0;
        const char *k = prefixed ? name + 6 : name;
        size_t kn = strlen(k);
        for (size_t i = 0; i <= kn; i++)
            key[i] = k[i] >= 'A' && k[i] <= 'Z' ? (char)(k[i] - 'A' + 'a') : k[i];
        if (prefixed && strcmp(key, "conf") != 0 && kn >= 3 && kn <= 7 && tally__edit_distance(key, "conf") <= 2) {
            tally__diag("%s is not read (did you mean TALLY_CONF?)", name);
            continue;
        }
        if (!prefixed && !strchr(key, '_'))
            continue;
        for (size_t i = 0; i < NROWS; i++)
            if (strcmp(rows[i].name, key) == 0) {
                tally__diag("%s in the environment is not read (did you mean TALLY_CONF=%s:%s?)", name, key, eq + 1);
                break;
            }
    }
}

/* The key nearest to an unknown one, when it is near enough to be a typo
 * (at most a third of its letters wrong, at least 2 allowed); else NULL. */
static const char *nearest_key(const char *key)
{
    const char *best = NULL;
    size_t best_d = 64, len = strlen(key);
    for (size_t i = 0; i < NROWS; i++) {
        size_t d = tally__edit_distance(key, rows[i].name);
        if (d < best_d) {
            best_d = d;
            best = rows[i].name;
        }
    }
    size_t allowed = len / 3 > 2 ? len / 3 : 2;
    return best_d <= allowed ? best : NULL;
}

/* "a, b, c": an enum's values, for an error message. */
static void list_values(const char *const *names, char *buf, size_t len)
{
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; names[i] && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%s", i ? ", " : "", names[i]);
}

/* report_path's escapes are %p, %r and %%; anything else after a % is a
 * mistake worth naming now rather than a file name found at exit. */
int tally__check_path_escapes(const char *path, char *bad)
{
    for (const char *c = path; *c; c++) {
        if (*c != '%')
            continue;
        if (c[1] == 'p' || c[1] == 'r' || c[1] == '%') {
            c++;
            continue;
        }
        bad[0] = '%';
        bad[1] = c[1];
        bad[2] = 0;
        return -1;
    }
    return 0;
}

static int set_one(tally_options_t *o, const char *key, const char *val, bool runtime, uint64_t *seen)
{
    const option_row_t *r = NULL;
    for (size_t i = 0; i < NROWS; i++) {
        if (strcmp(rows[i].name, key) == 0) {
            r = &rows[i];
            *seen |= 1ull << i;
        }
    }
    if (!r) {
        /* PyTorch keys that have no meaning here are named as such. */
        if (strcmp(key, "pinned_use_cuda_host_register") == 0 ||
            strcmp(key, "release_lock_on_cudamalloc") == 0)
            return tally__fail(TALLY_ECONF, "config: key '%s' (a PyTorch setting) is not supported by tally", key);
        const char *near = nearest_key(key);
        if (near)
            return tally__fail(TALLY_ECONF, "config: unknown key '%s' (did you mean '%s'?)", key, near);
        return tally__fail(TALLY_ECONF, "config: unknown key '%s' (tally_write_options lists the keys)", key);
    }
    if (runtime && !r->runtime)
        return tally__fail(TALLY_ECONF, "config: key '%s' can only be set before initialisation (in TALLY_CONF)",
                           key);
    char *field = (char *)o + r->offset;
    long long n;
    double d;
    char *end;
    switch (r->type) {
    case T_BOOL:
        if (parse_bool(val, (int *)field))
            return tally__fail(TALLY_ECONF, "config: %s: '%s' is not a boolean (true/false)", key, val);
        return 0;
    case T_INT:
        if (parse_long(val, &n) || n < (long long)r->min || n > (long long)r->max)
            return tally__fail(TALLY_ECONF, "config: %s: '%s' is not an integer in [%lld, %lld]", key, val,
                               (long long)r->min, (long long)r->max);
        *(int *)field = (int)n;
        return 0;
    case T_SIZE: {
        uint64_t b;
        if (strcmp(key, "async_release_threshold") == 0 && strcmp(val, "all") == 0) {
            *(uint64_t *)field = UINT64_MAX;
            return 0;
        }
        if (!tally__parse_size(val, &b) || b == 0)
            return tally__fail(TALLY_ECONF, "config: %s: '%s' is not a size (e.g. 80GiB)", key, val);
        *(uint64_t *)field = b;
        return 0;
    }
    case T_DOUBLE:
        errno = 0;
        d = strtod(val, &end);
        /* 0 is each key's "off" (its default), so the printed form parses back. */
        if (errno || end == val || *end || !(d > r->min || d == 0) || d > r->max ||
            (strcmp(key, "garbage_collection_threshold") == 0 && d >= 1.0))
            return tally__fail(TALLY_ECONF, "config: %s: '%s' is not 0 (off) or a number in (%g, %g%s", key, val,
                               r->min, r->max, strcmp(key, "garbage_collection_threshold") == 0 ? ")" : "]");
        *(double *)field = d;
        return 0;
    case T_ENUM: {
        /* Any case, as booleans. */
        for (int i = 0; r->enums[i]; i++) {
            if (strcasecmp(val, r->enums[i]) == 0) {
                *(int *)field = i;
                return 0;
            }
        }
        bool backend = strcmp(key, "backend") == 0;
        if (backend && strcasecmp(val, "native") == 0) {
            *(int *)field = TALLY_BACKEND_CUDA;
            return 0;
        }
        if (backend && strcasecmp(val, "cudaMallocAsync") == 0) {
            *(int *)field = TALLY_BACKEND_ASYNC;
            return 0;
        }
        char valid[128];
        list_values(r->enums, valid, sizeof valid);
        return tally__fail(TALLY_ECONF, "config: %s: unknown value '%s' (valid: %s%s)", key, val, valid,
                           backend ? "; PyTorch's native, cudaMallocAsync" : "");
    }
    case T_STRING:
        if (strlen(val) >= 512)
            return tally__fail(TALLY_ECONF, "config: %s: value longer than 511 characters", key);
        /* What would not read back from the printed configuration: a
         * control character ends the line, a bracket joins items, and
         * four blanks before '#' start the line's help text. */
        for (const char *c = val; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == '[' || *c == ']')
                return tally__fail(TALLY_ECONF, "config: %s: value may not contain control characters or brackets",
                                   key);
        if (strstr(val, "    #"))
            return tally__fail(TALLY_ECONF, "config: %s: value may not contain four blanks before '#' "
                                            "(the printed configuration's help mark)", key);
        if (strcmp(key, "leak_suppressions") == 0 && checker && checker(key, val))
            return -TALLY_ECONF;
        if (strcmp(key, "report_path") == 0) {
            char bad[3];
            if (tally__check_path_escapes(val, bad))
                return tally__fail(TALLY_ECONF,
                                   "config: report_path: unknown escape '%s' in '%s' (valid: %%p pid, %%r rank, %%%% a %%)",
                                   bad, val);
        }
        strcpy(field, val);
        return 0;
    case T_SPLIT_MB:
        if (strcmp(key, "max_split_size_mb") == 0 && strcmp(val, "none") == 0) {
            *(uint64_t *)field = UINT64_MAX;
            return 0;
        }
        if (parse_long(val, &n) || n < 20 || n > (long long)(UINT64_MAX >> 21))
            return tally__fail(TALLY_ECONF, "config: %s: '%s' must be an integer >= 20 (MiB)%s", key, val,
                               strcmp(key, "max_split_size_mb") == 0 ? ", or none" : "");
        *(uint64_t *)field = (uint64_t)n << 20;
        return 0;
    case T_ROUNDUP:
        return parse_roundup(key, val, (uint32_t *)field);
    case T_HOME:
        if (strcasecmp(val, "auto") == 0) {
            *(int *)field = -2;
            return 0;
        }
        if (strcasecmp(val, "none") == 0) {
            *(int *)field = -1;
            return 0;
        }
        if (parse_long(val, &n) || n < 0 || n >= TALLY_MAX_DEVICES)
            return tally__fail(TALLY_ECONF, "config: %s: '%s' is not auto, none or a device number", key, val);
        *(int *)field = (int)n;
        return 0;
    }
    return tally__fail(TALLY_ECONF, "config: %s: internal error", key);
}

static bool is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

int tally__options_parse(tally_options_t *opt, const char *conf, bool runtime, uint64_t *seen_out)
{
    uint64_t seen = 0;
    if (seen_out)
        *seen_out = 0;
    if (!conf)
        return 0;
    tally_options_t work = *opt;
    size_t len = strlen(conf);
    if (len > 4096)
        return tally__fail(TALLY_ECONF, "config: longer than 4096 characters");
    char buf[4097];
    memcpy(buf, conf, len + 1);
    char *p = buf;
    while (*p) {
        /* One item ends at a comma outside brackets. */
        char *item = p;
        int depth = 0;
        while (*p && (*p != ',' || depth > 0)) {
            if (*p == '[')
                depth++;
            else if (*p == ']')
                depth--;
            p++;
        }
        if (*p)
            *p++ = 0;
        while (is_blank(*item))
            item++;
        char *e = item + strlen(item);
        while (e > item && is_blank(e[-1]))
            *--e = 0;
        if (!*item)
            continue;
        char *colon = strchr(item, ':');
        if (!colon)
            return tally__fail(TALLY_ECONF, "config: item '%s' is not key:value", item);
        /* Blanks around the key and around the value do not count, for
         * every key alike ("leak_report : full" is leak_report:full). */
        char *val = colon + 1;
        for (e = colon; e > item && is_blank(e[-1]); e--)
            ;
        *e = 0;
        while (is_blank(*val))
            val++;
        if (!*item)
            return tally__fail(TALLY_ECONF, "config: item '%s:%s' has no key", item, val);
        int rc = set_one(&work, item, val, runtime, &seen);
        if (rc)
            return rc;
    }
    *opt = work;
    if (seen_out)
        *seen_out = seen;
    return 0;
}

int tally__options_write(const tally_options_t *o, tally_out_t *out)
{
    for (size_t i = 0; i < NROWS; i++) {
        const option_row_t *r = &rows[i];
        const char *field = (const char *)o + r->offset;
        tally__out_printf(out, "%s:", r->name);
        switch (r->type) {
        case T_BOOL:
            tally__out_puts(out, *(const int *)field ? "true" : "false");
            break;
        case T_INT:
            tally__out_printf(out, "%d", *(const int *)field);
            break;
        case T_SIZE: {
            /* The largest binary unit that divides it, as written in TALLY_CONF. */
            static const char *const units[] = {"", "KiB", "MiB", "GiB", "TiB"};
            uint64_t v = *(const uint64_t *)field;
            int u = 0;
            while (v && u < 4 && v % 1024 == 0) {
                v /= 1024;
                u++;
            }
            if (*(const uint64_t *)field == UINT64_MAX)
                tally__out_puts(out, "all");
            else
                tally__out_printf(out, "%llu%s", (unsigned long long)v, units[u]);
            break;
        }
        case T_DOUBLE: {
            /* The shortest form that reads back as the same double. */
            double v = *(const double *)field;
            char num[40];
            for (int prec = 6; prec <= 17; prec++) {
                snprintf(num, sizeof num, "%.*g", prec, v);
                if (strtod(num, NULL) == v)
                    break;
            }
            tally__out_puts(out, num);
            break;
        }
        case T_ENUM:
            tally__out_puts(out, r->enums[*(const int *)field]);
            break;
        case T_STRING:
            tally__out_puts(out, field);
            break;
        case T_SPLIT_MB: {
            uint64_t v = *(const uint64_t *)field;
            if (v == UINT64_MAX)
                tally__out_puts(out, "none");
            else
                tally__out_printf(out, "%llu", (unsigned long long)(v >> 20));
            break;
        }
        case T_ROUNDUP: {
            const uint32_t *d = (const uint32_t *)field;
            bool same = true;
            for (int k = 1; k < TALLY_ROUNDUP_INTERVALS; k++)
                same = same && d[k] == d[0];
            if (same) {
                tally__out_printf(out, "%u", d[0]);
                break;
            }
            /* Slot k governs [2^k MiB, 2^(k+1) MiB); slot 0 also everything below. */
            tally__out_puts(out, "[");
            for (int k = 0; k < TALLY_ROUNDUP_INTERVALS; k++)
                tally__out_printf(out, "%s%lld:%u", k ? "," : "", 1LL << k, d[k]);
            tally__out_puts(out, "]");
            break;
        }
        case T_HOME: {
            int h = *(const int *)field;
            if (h == -2)
                tally__out_puts(out, "auto");
            else if (h == -1)
                tally__out_puts(out, "none");
            else
                tally__out_printf(out, "%d", h);
            break;
        }
        }
        tally__out_printf(out, "    # %s%s\n", r->help, r->runtime ? " (runtime)" : "");
    }
    tally__out_flush(out);
    return out->failed ? -TALLY_ENOMEM : 0;
}
