/* Interned names. A tag or stage name is hashed once, when pushed or begun,
 * and becomes a small integer; blocks and counters carry only the integer.
 * Tables only grow; an id stays valid for the life of the process.
 * (Allocation sites are interned in site.c.) */
#include "ledger/ledger.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct intern_table {
    char **names;     /* id -> name */
    uint32_t count, cap;
    uint32_t *index;  /* open addressing over ids, UINT32_MAX = empty */
    uint32_t mask;
} intern_table_t;

static tally_mutex_t names_lock = TALLY_MUTEX_INIT;
tally_mutex_t *tally__names_lock(void) { return &names_lock; }
static intern_table_t tags, stages;

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static int table_grow(intern_table_t *t)
{
    uint32_t cap = t->cap ? t->cap * 2 : 64;
    char **names = tally__meta_alloc(cap * sizeof *names);
    uint32_t *index = tally__meta_alloc(cap * 2 * sizeof *index);
    if (!names || !index) {
        tally__meta_free(names);
        tally__meta_free(index);
        return -TALLY_ENOMEM;
    }
    memset(index, 0xff, cap * 2 * sizeof *index);
    if (t->count)
        memcpy(names, t->names, t->count * sizeof *names);
    uint32_t mask = cap * 2 - 1;
    for (uint32_t id = 0; id < t->count; id++) {
        uint32_t i = (uint32_t)hash_str(names[id]) & mask;
        while (index[i] != UINT32_MAX)
            i = (i + 1) & mask;
        index[i] = id;
    }
    /* Readers may hold the old names array without the lock only through
     * name_of, which copies under the lock; safe to free. */
    tally__meta_free(t->names);
    tally__meta_free(t->index);
    t->names = names;
    t->index = index;
    t->cap = cap;
    t->mask = mask;
    return 0;
}

/* Errors are recorded quietly: the caller (tally_tag_push,
 * tally_stage_begin) reports them in its own single line. A name with a
 * control character is not echoed, so the line stays one line. */
/* Names go into JSON reports and Python strings: valid UTF-8 only. */
static bool valid_utf8(const unsigned char *s, size_t len, size_t *bad)
{
    for (size_t i = 0; i < len;) {
        unsigned c = s[i];
        size_t n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : 99;
        if (n == 99 || i + n >= len + (n ? 0 : 1)) {
            *bad = i;
            return false;
        }
        unsigned cp = n == 0 ? c : n == 1 ? c & 0x1f : n == 2 ? c & 0x0f : c & 0x07;
        for (size_t k = 1; k <= n; k++) {
            if ((s[i + k] & 0xc0) != 0x80) {
                *bad = i;
                return false;
            }
            cp = cp << 6 | (s[i + k] & 0x3f);
        }
        /* Overlong forms, surrogates and values past U+10FFFF. */
        if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10ffff ||
            (cp >= 0xd800 && cp <= 0xdfff)) {
            *bad = i;
            return false;
        }
        i += n + 1;
    }
    return true;
}

static int intern(intern_table_t *t, const char *name, uint32_t *id)
{
    if (!name || !*name)
        return tally__fail_quiet(TALLY_EINVAL, "name is empty");
    size_t len = strlen(name);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)name[i];
        if (c < 0x20 || c == 0x7f)
            return tally__fail_quiet(TALLY_EINVAL, "name contains a control character (0x%02x at offset %zu)", c, i);
    }
    size_t bad;
    if (!valid_utf8((const unsigned char *)name, len, &bad))
        return tally__fail_quiet(TALLY_EINVAL, "name is not valid UTF-8 (byte 0x%02x at offset %zu)",
                                 (unsigned char)name[bad], bad);
    if (len > 200)
        return tally__fail_quiet(TALLY_EINVAL, "name '%.40s...' is longer than 200 characters", name);
    tally__mutex_lock(&names_lock);
    if (t->count == t->cap && table_grow(t)) {
        tally__mutex_unlock(&names_lock);
        return tally__fail_quiet(TALLY_ENOMEM, "out of host memory for names");
    }
    uint32_t i = (uint32_t)hash_str(name) & t->mask;
    while (t->index[i] != UINT32_MAX) {
        if (strcmp(t->names[t->index[i]], name) == 0) {
            *id = t->index[i];
            tally__mutex_unlock(&names_lock);
            return 0;
        }
        i = (i + 1) & t->mask;
    }
    char *copy = tally__meta_strdup(name);
    if (!copy) {
        tally__mutex_unlock(&names_lock);
        return tally__fail_quiet(TALLY_ENOMEM, "out of host memory for names");
    }
    t->names[t->count] = copy;
    t->index[i] = t->count;
    *id = t->count++;
    tally__mutex_unlock(&names_lock);
    return 0;
}

static pthread_once_t reserved_once = PTHREAD_ONCE_INIT;

static void reserve_names(void)
{
    uint32_t id;
    /* Id 0 of each table is the name reports use for "none". */
    intern(&tags, "untagged", &id);
    intern(&stages, "(none)", &id);
}

static void ensure_reserved(void)
{
    pthread_once(&reserved_once, reserve_names);
}

int tally__intern_tag(const char *name, uint32_t *id)
{
    ensure_reserved();
    return intern(&tags, name, id);
}

int tally__intern_stage(const char *name, uint32_t *id)
{
    ensure_reserved();
    return intern(&stages, name, id);
}

static const char *name_of(intern_table_t *t, uint32_t id, const char *fallback)
{
    ensure_reserved();
    tally__mutex_lock(&names_lock);
    /* Name strings are never freed, so the pointer outlives the lock. */
    const char *s = id < t->count ? t->names[id] : fallback;
    tally__mutex_unlock(&names_lock);
    return s;
}

const char *tally__tag_name(uint32_t id)
{
    return name_of(&tags, id, "?");
}

const char *tally__stage_name(uint32_t id)
{
    return name_of(&stages, id, "?");
}

bool tally__tag_is_persistent(uint32_t id)
{
    const char *name = tally__tag_name(id);
    char list[512];
    tally__opt_string(tally__opt.persistent_tags, list);
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *end = strchr(p, '|');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0)
            return true;
        if (!end)
            break;
        p = end + 1;
    }
    return false;
}

const char *tally_tag_name(uint32_t id)
{
    return tally__tag_name(id);
}

const char *tally_stage_name(uint32_t id)
{
    return tally__stage_name(id);
}
