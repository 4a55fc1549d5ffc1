/* Fuzz target: the JSON reader (tally__json_parse, lib/report/json_reader.c), which the
 * tally command uses on files it is given.
 *
 * On every input: no crash, no read outside the input, nothing leaked.
 * On failure: the message is "byte N: ..." with N the reported offset, and
 * N <= the input's length. On success: every value's offset lies inside
 * the input, strings are NUL-terminated at their length, lookups agree with
 * the members; and the tree written out again (by the small writer below)
 * parses back to an equal tree. A violation aborts. */
#include "core/internal.h"
#include "report/json.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct text {
    char *p;
    size_t len, cap;
} text_t;

static void put(text_t *t, const char *s, size_t n)
{
    if (t->len + n + 1 > t->cap) {
        t->cap = (t->len + n + 1) * 2;
        t->p = realloc(t->p, t->cap);
        if (!t->p)
            abort();
    }
    memcpy(t->p + t->len, s, n);
    t->len += n;
    t->p[t->len] = 0;
}

static void puts_(text_t *t, const char *s)
{
    put(t, s, strlen(s));
}

static void write_string(text_t *t, const char *s, size_t n)
{
    put(t, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            put(t, esc, 2);
        } else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            put(t, esc, 6);
        } else {
            put(t, (const char *)&s[i], 1);
        }
    }
    put(t, "\"", 1);
}

static void write_value(text_t *t, const tally_json_t *v)
{
    char num[64];
    switch (v->type) {
    case TALLY_JSON_NULL: puts_(t, "null"); break;
    case TALLY_JSON_FALSE: puts_(t, "false"); break;
    case TALLY_JSON_TRUE: puts_(t, "true"); break;
    case TALLY_JSON_NUMBER:
        if (v->is_int)
            snprintf(num, sizeof num, "%" PRId64, v->i);
        else
            snprintf(num, sizeof num, "%.17g", v->d);
        puts_(t, num);
        break;
    case TALLY_JSON_STRING: write_string(t, v->s, v->len); break;
    case TALLY_JSON_ARRAY:
        put(t, "[", 1);
        for (size_t i = 0; i < v->len; i++) {
            if (i)
                put(t, ",", 1);
            write_value(t, &v->items[i]);
        }
        put(t, "]", 1);
        break;
    case TALLY_JSON_OBJECT:
        put(t, "{", 1);
        for (size_t i = 0; i < v->len; i++) {
            if (i)
                put(t, ",", 1);
            write_string(t, v->members[i].key, v->members[i].key_len);
            put(t, ":", 1);
            write_value(t, &v->members[i].value);
        }
        put(t, "}", 1);
        break;
    }
}

__attribute__((noreturn)) static void violated(const char *what)
{
    fprintf(stderr, "fuzz_json: %s\n", what);
    abort();
}

/* Structure: offsets inside the text, strings terminated, lookups right. */
static void check_tree(const tally_json_t *v, size_t size, int depth)
{
    if (depth > TALLY_JSON_MAX_DEPTH + 1)
        violated("tree deeper than TALLY_JSON_MAX_DEPTH");
    if (v->offset >= size)
        violated("a value's offset is outside the input");
    switch (v->type) {
    case TALLY_JSON_STRING:
        if (!v->s || v->s[v->len] != 0 || strlen(v->s) > v->len)
            violated("a string is not NUL-terminated at its length");
        break;
    case TALLY_JSON_NUMBER:
        if (v->is_int && (double)v->i != v->d)
            violated("an integer's double differs from it");
        break;
    case TALLY_JSON_ARRAY:
        for (size_t i = 0; i < v->len; i++) {
            check_tree(&v->items[i], size, depth + 1);
            if (tally__json_at(v, i) != &v->items[i])
                violated("tally__json_at gives another element");
        }
        if (tally__json_at(v, v->len) != NULL)
            violated("tally__json_at past the end is not NULL");
        break;
    case TALLY_JSON_OBJECT:
        for (size_t i = 0; i < v->len; i++) {
            const tally_json_member_t *m = &v->members[i];
            if (!m->key || m->key[m->key_len] != 0)
                violated("a key is not NUL-terminated at its length");
            check_tree(&m->value, size, depth + 1);
            /* the last member of that name wins */
            const tally_json_t *got = tally__json_getn(v, m->key, m->key_len);
            const tally_json_t *want = NULL;
            for (size_t k = 0; k < v->len; k++)
                if (v->members[k].key_len == m->key_len && memcmp(v->members[k].key, m->key, m->key_len) == 0)
                    want = &v->members[k].value;
            if (got != want)
                violated("tally__json_getn does not give the last member of a name");
        }
        break;
    default:
        break;
    }
    int64_t x;
    if (tally__json_int(v, &x) == 0 && v->type != TALLY_JSON_NUMBER)
        violated("tally__json_int accepted a non-number");
}

static bool same(const tally_json_t *a, const tally_json_t *b)
{
    if (a->type != b->type || (a->type >= TALLY_JSON_STRING && a->len != b->len))
        return false;
    switch (a->type) {
    case TALLY_JSON_NUMBER:
        return a->is_int && b->is_int ? a->i == b->i : a->d == b->d;
    case TALLY_JSON_STRING:
        return memcmp(a->s, b->s, a->len) == 0;
    case TALLY_JSON_ARRAY:
        for (size_t i = 0; i < a->len; i++)
            if (!same(&a->items[i], &b->items[i]))
                return false;
        return true;
    case TALLY_JSON_OBJECT:
        for (size_t i = 0; i < a->len; i++)
            if (a->members[i].key_len != b->members[i].key_len ||
                memcmp(a->members[i].key, b->members[i].key, a->members[i].key_len) != 0 ||
                !same(&a->members[i].value, &b->members[i].value))
                return false;
        return true;
    default:
        return true;
    }
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    char err[256];
    size_t at = (size_t)-1;
    tally_json_t *root = tally__json_parse((const char *)data, size, err, sizeof err, &at);
    if (!root) {
        char prefix[40];
        snprintf(prefix, sizeof prefix, "byte %zu: ", at);
        if (at > size)
            violated("the error offset is past the end of the input");
        if (strncmp(err, prefix, strlen(prefix)) != 0 || !err[strlen(prefix)])
            violated("the error message does not start with 'byte N: ' for the reported offset");
        return 0;
    }
    check_tree(root, size, 0);
    text_t t = {0};
    write_value(&t, root);
    tally_json_t *again = tally__json_parse(t.p, t.len, err, sizeof err, NULL);
    if (!again) {
        fprintf(stderr, "fuzz_json: written as: %.300s\n  error: %s\n", t.p, err);
        violated("the tree written out does not parse back");
    }
    if (!same(root, again))
        violated("the tree written out parses back to another tree");
    tally__json_free(again);
    tally__json_free(root);
    free(t.p);
    /* NULL and empty inputs are errors, not crashes. */
    if (size == 0 && tally__json_parse(NULL, 5, err, sizeof err, NULL) != NULL)
        violated("NULL text parsed");
    return 0;
}
