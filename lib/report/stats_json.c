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
        if (plen + m->key_len + 1 >= KEY_MAX || strlen(m->key) != m->key_len)
            continue;
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
            memcpy((char *)r->out + k->off, &x, sizeof x);
        } else if (v->type == TALLY_JSON_OBJECT) {
            size_t n = plen + m->key_len;
            name[n++] = '.';
            name[n] = 0;
            int rc = read_object(r, v, name, n);
            if (rc < 0)
                return rc;
        }
    }
    return 0;
}

int tally__stats_from_json(const char *text, size_t len, tally_stats_t *out, char *err,
                           size_t errlen)
{
    char jerr[200];
    reader_t r = {NULL, NULL, err, errlen};
    if (err && errlen)
        err[0] = 0;
    if (!out)
        return read_fail(&r, "no output given");
    tally_json_t *root = tally__json_parse(text, len, jerr, sizeof jerr, NULL);
    if (!root)
        return read_fail(&r, "%s", jerr);
    if (root->type != TALLY_JSON_OBJECT) {
        int rc = read_fail(&r, "byte %zu: expected an object at the top level, got %s",
                           root->offset, tally__json_type_name(root->type));
        tally__json_free(root);
        return rc;
    }
    stat_key_t keys[KEY_COUNT];
    tally_stats_t s;
    build_keys(keys);
    memset(&s, 0, sizeof s);
    r.keys = keys;
    r.out = &s;
    int rc = read_object(&r, root, "", 0);
    tally__json_free(root);
    if (rc == 0)
        *out = s;
    return rc;
}
