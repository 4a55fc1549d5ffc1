/* Statistics as JSON in torch.cuda.memory_stats() form, and back.
 *
 * PyTorch flattens its nested stats dict into "a.b.c" keys and sorts them as
 * strings, so the key set and order come from one table built here from the
 * TALLY_POOL_STATS list and sorted with strcmp (byte order, which for these
 * ASCII names is Python's order too). The writer uses json.dumps' default
 * separators, so its text equals json.dumps(torch.cuda.memory_stats()). */
#include "report/report.h"
#include "report/json.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEY_MAX 48
/* 9 pool stats x 3 pools x 4 fields, 2 pool-less stats x 4, 6 scalars. */
#define KEY_COUNT (9 * TALLY_POOL_COUNT * 4 + 2 * 4 + 6)

typedef struct stat_key {
    char name[KEY_MAX];
    size_t off; /* byte offset of the int64_t in tally_stats_t */
} stat_key_t;

static const char *const pool_names[TALLY_POOL_COUNT] = {"all", "small_pool", "large_pool"};

static const struct {
    const char *name;
    size_t off;
} stat_fields[4] = {
    {"current", offsetof(tally_stat_t, current)},
    {"peak", offsetof(tally_stat_t, peak)},
    {"allocated", offsetof(tally_stat_t, allocated)},
    {"freed", offsetof(tally_stat_t, freed)},
};

static int key_cmp(const void *a, const void *b)
{
    return strcmp(((const stat_key_t *)a)->name, ((const stat_key_t *)b)->name);
}

static void add_stat(stat_key_t *keys, size_t *n, const char *prefix, size_t off)
{
    for (int f = 0; f < 4; f++) {
        snprintf(keys[*n].name, KEY_MAX, "%s.%s", prefix, stat_fields[f].name);
        keys[*n].off = off + stat_fields[f].off;
        (*n)++;
    }
}

/* Fill keys[KEY_COUNT] in PyTorch's order. */
static void build_keys(stat_key_t *keys)
{
    size_t n = 0;
    char prefix[KEY_MAX];
#define TALLY_X_(stat)                                                                     \
    for (int p = 0; p < TALLY_POOL_COUNT; p++) {                                          \
        snprintf(prefix, sizeof prefix, "%s.%s", #stat, pool_names[p]);                   \
        add_stat(keys, &n, prefix,                                                         \
                 offsetof(tally_stats_t, stat) + (size_t)p * sizeof(tally_stat_t));       \
    }
    TALLY_POOL_STATS(TALLY_X_)
#undef TALLY_X_
    add_stat(keys, &n, "oversize_allocations", offsetof(tally_stats_t, oversize_allocations));
    add_stat(keys, &n, "oversize_segments", offsetof(tally_stats_t, oversize_segments));
#define SCALAR_(field)                                                                     \
    snprintf(keys[n].name, KEY_MAX, "%s", #field);                                         \
    keys[n++].off = offsetof(tally_stats_t, field);
    SCALAR_(num_alloc_retries)
    SCALAR_(num_ooms)
    SCALAR_(max_split_size)
    SCALAR_(num_sync_all_streams)
    SCALAR_(num_device_alloc)
    SCALAR_(num_device_free)
#undef SCALAR_
    qsort(keys, n, sizeof *keys, key_cmp);
}

static int64_t get_field(const tally_stats_t *s, size_t off)
{
    int64_t v;
    memcpy(&v, (const char *)s + off, sizeof v);
    return v;
}

void tally__stats_json(const tally_stats_t *s, tally_out_t *o)
{
    stat_key_t keys[KEY_COUNT];
    build_keys(keys);
    for (size_t i = 0; i < KEY_COUNT; i++)
        tally__out_printf(o, "%s\"%s\": %" PRId64, i ? ", " : "{", keys[i].name,
                          get_field(s, keys[i].off));
    tally__out_write(o, "}", 1);
}

/* ---- reading ------------------------------------------------------------ */

typedef struct reader {
    const stat_key_t *keys;
    tally_stats_t *out;
    char *err;
    size_t errlen;
    int mode;
    bool seen[KEY_COUNT];
} reader_t;

__attribute__((format(printf, 2, 3))) static int read_fail(reader_t *r, const char *fmt, ...)
{
    if (r->err && r->errlen) {
        int n = snprintf(r->err, r->errlen, "stats JSON: ");
        if (n >= 0 && (size_t)n < r->errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(r->err + n, r->errlen - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return -TALLY_EINVAL;
}

static int read_object(reader_t *r, const tally_json_t *obj, const char *prefix, size_t plen)
{
    char name[KEY_MAX];
    for (size_t i = 0; i < obj->len; i++) {
        const tally_json_member_t *m = &obj->members[i];
        const tally_json_t *v = &m->value;
        /* A name longer than every known key (or holding a NUL) matches
         * nothing, nor does anything nested under it. */
        if (plen + m->key_len + 1 >= KEY_MAX || strlen(m->key) != m->key_len) {
            if (r->mode == TALLY_STATS_STRICT)
                return read_fail(r, "byte %zu: key \"%.40s%.40s...\" is not a statistic", v->offset, prefix, m->key);
            continue;
        }
        memcpy(name, prefix, plen);
        memcpy(name + plen, m->key, m->key_len + 1);
        stat_key_t probe;
        memcpy(probe.name, name, plen + m->key_len + 1);
        const stat_key_t *k = bsearch(&probe, r->keys, KEY_COUNT, sizeof *r->keys, key_cmp);
        if (k) {
            int64_t x;
            if (tally__json_int(v, &x) < 0) {
                if (v->type == TALLY_JSON_NUMBER)
                    return read_fail(r, "byte %zu: key \"%s\": expected an integer, got %.17g",
                                     v->offset, name, v->d);
                return read_fail(r, "byte %zu: key \"%s\": expected an integer, got %s", v->offset,
                                 name, tally__json_type_name(v->type));
            }
            if (r->seen[k - r->keys])
                return read_fail(r, "byte %zu: key \"%s\" given twice", v->offset, name);
            r->seen[k - r->keys] = true;
            memcpy((char *)r->out + k->off, &x, sizeof x);
        } else if (v->type == TALLY_JSON_OBJECT) {
            size_t n = plen + m->key_len;
            name[n++] = '.';
            name[n] = 0;
            int rc = read_object(r, v, name, n);
            if (rc < 0)
                return rc;
        } else {
            /* A report's own stats have no other key; in a PyTorch dump a
             * key of a newer version is skipped, a typo of a known one is
             * not (its value would silently read as 0). */
            const char *near = NULL;
            size_t best = 64;
            for (size_t j = 0; j < KEY_COUNT; j++) {
                size_t d = tally__edit_distance(name, r->keys[j].name);
                if (d < best) {
                    best = d;
                    near = r->keys[j].name;
                }
            }
            if (r->mode == TALLY_STATS_STRICT || best <= 2) {
                if (near && best <= 2)
                    return read_fail(r, "byte %zu: unknown key \"%s\" (did you mean \"%s\"?)", v->offset, name,
                                     near);
                return read_fail(r, "byte %zu: unknown key \"%s\"", v->offset, name);
            }
        }
    }
    return 0;
}

static const stat_key_t *key_named(const stat_key_t *keys, const char *name, size_t *index)
{
    stat_key_t probe;
    snprintf(probe.name, KEY_MAX, "%s", name);
    const stat_key_t *k = bsearch(&probe, keys, KEY_COUNT, sizeof *keys, key_cmp);
    if (k && index)
        *index = (size_t)(k - keys);
    return k;
}

/* The family of a key: its name up to the pool ("active_bytes" of
 * "active_bytes.all.peak"), or the whole name of a scalar. */
static size_t family_len(const char *name)
{
    const char *dot = strchr(name, '.');
    return dot ? (size_t)(dot - name) : strlen(name);
}

/* Keys missing (strict: any; a dump: one of a family it has), then the
 * counts: all = small_pool + large_pool (current, allocated, freed), the
 * peak of all between the larger pool peak and their sum, current <= peak,
 * nothing negative. */
static int check_read(reader_t *r, const tally_stats_t *s)
{
    for (size_t i = 0; i < KEY_COUNT; i++) {
        if (r->seen[i])
            continue;
        const char *name = r->keys[i].name;
        if (r->mode == TALLY_STATS_STRICT)
            return read_fail(r, "key \"%s\" is missing", name);
        size_t fl = family_len(name);
        if (fl == strlen(name))
            continue; /* a scalar: older PyTorch versions lack some */
        for (size_t j = 0; j < KEY_COUNT; j++)
            if (r->seen[j] && family_len(r->keys[j].name) == fl && strncmp(r->keys[j].name, name, fl) == 0)
                return read_fail(r, "key \"%s\" is missing (\"%s\" is there)", name, r->keys[j].name);
    }
    for (size_t i = 0; i < KEY_COUNT; i++) {
        const char *name = r->keys[i].name;
        int64_t v = get_field(s, r->keys[i].off);
        if (r->seen[i] && v < 0 && strcmp(name, "max_split_size") != 0)
            return read_fail(r, "\"%s\" is %" PRId64 ", below 0", name, v);
        size_t n = strlen(name);
        if (!r->seen[i] || n < 8 || strcmp(name + n - 8, ".current") != 0)
            continue;
        char peak[KEY_MAX];
        size_t pi;
        snprintf(peak, sizeof peak, "%.*s.peak", (int)(n - 8), name);
        if (key_named(r->keys, peak, &pi) && r->seen[pi] && get_field(s, r->keys[pi].off) < v)
            return read_fail(r, "\"%s\" is %" PRId64 ", above \"%s\" (%" PRId64 ")", name, v, peak,
                             get_field(s, r->keys[pi].off));
    }
    static const char *const fields[] = {"current", "allocated", "freed", "peak"};
#define TALLY_X_(stat)                                                                                     \
    for (int f = 0; f < 4; f++) {                                                                          \
        char k3[3][KEY_MAX];                                                                               \
        size_t ix[3];                                                                                      \
        int64_t x[3];                                                                                      \
        bool all = true;                                                                                   \
        for (int p = 0; p < TALLY_POOL_COUNT; p++) {                                                       \
            snprintf(k3[p], KEY_MAX, "%s.%s.%s", #stat, pool_names[p], fields[f]);                         \
            all = all && key_named(r->keys, k3[p], &ix[p]) && r->seen[ix[p]];                              \
            x[p] = all ? get_field(s, r->keys[ix[p]].off) : 0;                                             \
        }                                                                                                  \
        if (!all)                                                                                          \
            continue;                                                                                      \
        if (f < 3 && x[0] != x[1] + x[2])                                                                  \
            return read_fail(r, "\"%s\" is %" PRId64 ", but small_pool + large_pool is %" PRId64, k3[0],  \
                             x[0], x[1] + x[2]);                                                           \
        if (f == 3 && (x[0] > x[1] + x[2] || x[0] < x[1] || x[0] < x[2]))                                  \
            return read_fail(r,                                                                            \
                             "\"%s\" is %" PRId64 ", not between the larger pool peak (%" PRId64          \
                             ") and their sum (%" PRId64 ")",                                              \
                             k3[0], x[0], x[1] > x[2] ? x[1] : x[2], x[1] + x[2]);                         \
    }
    TALLY_POOL_STATS(TALLY_X_)
#undef TALLY_X_
    return 0;
}

int tally__stats_from_json(const char *text, size_t len, tally_stats_t *out, char *err,
                           size_t errlen)
{
    return tally__stats_from_json_mode(text, len, out, TALLY_STATS_DUMP, err, errlen);
}

int tally__stats_from_json_mode(const char *text, size_t len, tally_stats_t *out, int mode, char *err,
                                size_t errlen)
{
    char jerr[200];
    reader_t r = {.err = err, .errlen = errlen, .mode = mode};
    if (err && errlen)
        err[0] = 0;
    if (!out)
        return read_fail(&r, "no output given");
    tally_json_t *root = tally__json_parse(text, len, jerr, sizeof jerr, NULL);
    if (!root)
        return read_fail(&r, "%s", jerr);
    int rc = tally__stats_from_node(root, out, mode, err, errlen);
    tally__json_free(root);
    return rc;
}

int tally__stats_from_node(const tally_json_t *root, tally_stats_t *out, int mode, char *err, size_t errlen)
{
    reader_t r = {.err = err, .errlen = errlen, .mode = mode};
    if (err && errlen)
        err[0] = 0;
    if (!out)
        return read_fail(&r, "no output given");
    if (root->type != TALLY_JSON_OBJECT)
        return read_fail(&r, "byte %zu: expected an object at the top level, got %s", root->offset,
                         tally__json_type_name(root->type));
    stat_key_t keys[KEY_COUNT];
    tally_stats_t s;
    build_keys(keys);
    memset(&s, 0, sizeof s);
    r.keys = keys;
    r.out = &s;
    int rc = read_object(&r, root, "", 0);
    if (rc == 0)
        rc = check_read(&r, &s);
    if (rc == 0)
        *out = s;
    return rc;
}
