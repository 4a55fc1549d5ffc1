/* JSON reader (see json.h). A recursive-descent parser over a byte range that
 * is never assumed to be NUL-terminated; every read is checked against the
 * end. Containers are built in growing arrays and handed over whole, so a
 * failure at any point frees exactly what was built so far. */
#include "core/internal.h"
#include "report/json.h"

#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct parser {
    const unsigned char *p;
    size_t len;
    size_t pos;
    char *err;
    size_t errlen;
    size_t err_at;
} parser_t;

__attribute__((format(printf, 3, 4))) static int fail_at(parser_t *ps, size_t at,
                                                         const char *fmt, ...)
{
    ps->err_at = at;
    if (ps->err && ps->errlen) {
        int n = snprintf(ps->err, ps->errlen, "byte %zu: ", at);
        if (n >= 0 && (size_t)n < ps->errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(ps->err + n, ps->errlen - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return -1;
}

static int fail_oom(parser_t *ps)
{
    return fail_at(ps, ps->pos, "out of memory");
}

/* Describe the byte at pos for a message: 'x', or 0xNN when unprintable. */
static const char *describe_byte(const parser_t *ps, size_t pos, char buf[8])
{
    unsigned char c = ps->p[pos];
    if (c >= 0x20 && c < 0x7f)
        snprintf(buf, 8, "'%c'", c);
    else
        snprintf(buf, 8, "0x%02x", c);
    return buf;
}

static void skip_ws(parser_t *ps)
{
    while (ps->pos < ps->len) {
        unsigned char c = ps->p[ps->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        ps->pos++;
    }
}

/* ---- freeing ------------------------------------------------------------ */

static void free_contents(tally_json_t *v)
{
    switch (v->type) {
    case TALLY_JSON_STRING:
        tally__meta_free(v->s);
        break;
    case TALLY_JSON_ARRAY:
        for (size_t i = 0; i < v->len; i++)
            free_contents(&v->items[i]);
        tally__meta_free(v->items);
        break;
    case TALLY_JSON_OBJECT:
        for (size_t i = 0; i < v->len; i++) {
            tally__meta_free(v->members[i].key);
            free_contents(&v->members[i].value);
        }
        tally__meta_free(v->members);
        break;
    default:
        break;
    }
    v->s = NULL;
    v->items = NULL;
    v->members = NULL;
    v->len = 0;
}

void tally__json_free(tally_json_t *root)
{
    if (!root)
        return;
    free_contents(root);
    tally__meta_free(root);
}

/* Grow an array of elem-sized entries to hold at least need of them. */
static int grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t ncap = *cap ? *cap : 4;
    while (ncap < need) {
        if (ncap > SIZE_MAX / 2 / elem)
            return -1;
        ncap *= 2;
    }
    void *n = tally__meta_alloc(ncap * elem);
    if (!n)
        return -1;
    if (*arr) {
        memcpy(n, *arr, *cap * elem);
        tally__meta_free(*arr);
    }
    *arr = n;
    *cap = ncap;
    return 0;
}

/* ---- strings ------------------------------------------------------------ */

static int hex4(const unsigned char *s, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Parse the string whose opening quote is at ps->pos. The decoded text is
 * never longer than the raw text (every escape shrinks or keeps its length),
 * so one allocation of the raw length suffices. */
static int parse_string(parser_t *ps, char **out, size_t *out_len)
{
    size_t start = ps->pos;
    size_t i = start + 1;
    while (i < ps->len && ps->p[i] != '"')
        i += ps->p[i] == '\\' ? 2 : 1;
    if (i >= ps->len)
        return fail_at(ps, ps->len, "unexpected end of input inside the string that starts at byte %zu",
                       start);
    size_t end = i; /* the closing quote */

    char *buf = tally__meta_alloc(end - start);
    if (!buf)
        return fail_oom(ps);
    size_t n = 0;
    for (i = start + 1; i < end;) {
        unsigned char c = ps->p[i];
        if (c < 0x20) {
            tally__meta_free(buf);
            return fail_at(ps, i, "control character 0x%02x in a string (it must be escaped)", c);
        }
        if (c != '\\') {
            buf[n++] = (char)c;
            i++;
            continue;
        }
        unsigned char e = ps->p[i + 1]; /* i + 1 < end: the scan above skipped it */
        switch (e) {
        case '"': buf[n++] = '"'; break;
        case '\\': buf[n++] = '\\'; break;
        case '/': buf[n++] = '/'; break;
        case 'b': buf[n++] = '\b'; break;
        case 'f': buf[n++] = '\f'; break;
        case 'n': buf[n++] = '\n'; break;
        case 'r': buf[n++] = '\r'; break;
        case 't': buf[n++] = '\t'; break;
        case 'u': {
            unsigned cp, lo;
            if (end - i < 6 || hex4(ps->p + i + 2, &cp) < 0) {
                tally__meta_free(buf);
                return fail_at(ps, i, "invalid \\u escape (four hex digits expected)");
            }
            if (cp >= 0xdc00 && cp <= 0xdfff) {
                tally__meta_free(buf);
                return fail_at(ps, i, "unpaired low surrogate \\u%04x", cp);
            }
            if (cp >= 0xd800 && cp <= 0xdbff) {
                if (end - i < 12 || ps->p[i + 6] != '\\' || ps->p[i + 7] != 'u' ||
                    hex4(ps->p + i + 8, &lo) < 0 || lo < 0xdc00 || lo > 0xdfff) {
                    tally__meta_free(buf);
                    return fail_at(ps, i, "unpaired high surrogate \\u%04x", cp);
                }
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                i += 6;
            }
            n += put_utf8(buf + n, cp);
            i += 6;
            continue;
        }
        default: {
            char d[8];
            tally__meta_free(buf);
            return fail_at(ps, i, "invalid escape \\%s in a string",
                           describe_byte(ps, i + 1, d));
        }
        }
        i += 2;
    }
    buf[n] = 0;
    *out = buf;
    *out_len = n;
    ps->pos = end + 1;
    return 0;
}

/* ---- numbers ------------------------------------------------------------ */

/* Doubles are read in the C locale whatever the program set with setlocale. */
static locale_t c_locale;
static pthread_once_t c_locale_once = PTHREAD_ONCE_INIT;

static void c_locale_init(void)
{
    c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
}

static double to_double(const char *s)
{
    pthread_once(&c_locale_once, c_locale_init);
    if (c_locale)
        return strtod_l(s, NULL, c_locale);
    return strtod(s, NULL);
}

static int parse_number(parser_t *ps, tally_json_t *v)
{
    const unsigned char *p = ps->p;
    size_t start = ps->pos, i = start;
    bool neg = false, integral = true;

    if (p[i] == '-') {
        neg = true;
        i++;
    }
    if (i >= ps->len || p[i] < '0' || p[i] > '9')
        return fail_at(ps, start, "invalid number (a digit must follow '-')");
    if (p[i] == '0' && i + 1 < ps->len && p[i + 1] >= '0' && p[i + 1] <= '9')
        return fail_at(ps, start, "invalid number (leading zero)");
    while (i < ps->len && p[i] >= '0' && p[i] <= '9')
        i++;
    size_t int_end = i;
    if (i < ps->len && p[i] == '.') {
        integral = false;
        i++;
        if (i >= ps->len || p[i] < '0' || p[i] > '9')
            return fail_at(ps, start, "invalid number (a digit must follow '.')");
        while (i < ps->len && p[i] >= '0' && p[i] <= '9')
            i++;
    }
    if (i < ps->len && (p[i] == 'e' || p[i] == 'E')) {
        integral = false;
        i++;
        if (i < ps->len && (p[i] == '+' || p[i] == '-'))
            i++;
        if (i >= ps->len || p[i] < '0' || p[i] > '9')
            return fail_at(ps, start, "invalid number (a digit must follow the exponent)");
        while (i < ps->len && p[i] >= '0' && p[i] <= '9')
            i++;
    }

    v->type = TALLY_JSON_NUMBER;
    v->is_int = false;
    v->i = 0;
    if (integral) {
        /* Exact int64 when it fits; INT64_MIN needs the one extra unit. */
        uint64_t limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
        uint64_t acc = 0;
        bool fits = true;
        for (size_t k = start + (neg ? 1 : 0); k < int_end; k++) {
            unsigned d = (unsigned)(p[k] - '0');
            if (acc > (limit - d) / 10) {
                fits = false;
                break;
            }
            acc = acc * 10 + d;
        }
        if (fits) {
            v->is_int = true;
            v->i = neg ? (acc == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)acc)
                       : (int64_t)acc;
            v->d = (double)v->i;
            ps->pos = i;
            return 0;
        }
    }

    size_t n = i - start;
    char small[64];
    char *tmp = n < sizeof small ? small : tally__meta_alloc(n + 1);
    if (!tmp)
        return fail_oom(ps);
    memcpy(tmp, p + start, n);
    tmp[n] = 0;
    v->d = to_double(tmp);
    if (tmp != small)
        tally__meta_free(tmp);
    if (isinf(v->d))
        return fail_at(ps, start, "number out of range");
    ps->pos = i;
    return 0;
}

/* ---- values ------------------------------------------------------------- */

static int parse_value(parser_t *ps, tally_json_t *v, int depth);

static int parse_literal(parser_t *ps, tally_json_t *v, const char *word, tally_json_type_t type)
{
    size_t n = strlen(word), left = ps->len - ps->pos;
    if (left < n && memcmp(ps->p + ps->pos, word, left) == 0)
        return fail_at(ps, ps->len, "unexpected end of input inside '%s'", word);
    if (left < n || memcmp(ps->p + ps->pos, word, n) != 0)
        return fail_at(ps, ps->pos, "invalid literal (expected '%s')", word);
    v->type = type;
    ps->pos += n;
    return 0;
}

static int parse_array(parser_t *ps, tally_json_t *v, int depth)
{
    tally_json_t *items = NULL;
    size_t n = 0, cap = 0;
    ps->pos++; /* '[' */
    skip_ws(ps);
    if (ps->pos < ps->len && ps->p[ps->pos] == ']') {
        ps->pos++;
        goto done;
    }
    for (;;) {
        if (grow((void **)&items, &cap, n + 1, sizeof *items) < 0) {
            fail_oom(ps);
            goto bad;
        }
        if (parse_value(ps, &items[n], depth + 1) < 0)
            goto bad;
        n++;
        skip_ws(ps);
        if (ps->pos >= ps->len) {
            fail_at(ps, ps->len, "unexpected end of input (expected ',' or ']' in the array that starts at byte %zu)",
                    v->offset);
            goto bad;
        }
        unsigned char c = ps->p[ps->pos++];
        if (c == ']')
            break;
        if (c != ',') {
            char d[8];
            fail_at(ps, ps->pos - 1, "expected ',' or ']' in an array, found %s",
                    describe_byte(ps, ps->pos - 1, d));
            goto bad;
        }
    }
done:
    v->type = TALLY_JSON_ARRAY;
    v->items = items;
    v->len = n;
    return 0;
bad:
    for (size_t k = 0; k < n; k++)
        free_contents(&items[k]);
    tally__meta_free(items);
    return -1;
}

static int parse_object(parser_t *ps, tally_json_t *v, int depth)
{
    tally_json_member_t *members = NULL;
    size_t n = 0, cap = 0;
    char d[8];
    ps->pos++; /* '{' */
    skip_ws(ps);
    if (ps->pos < ps->len && ps->p[ps->pos] == '}') {
        ps->pos++;
        goto done;
    }
    for (;;) {
        skip_ws(ps);
        if (ps->pos >= ps->len) {
            fail_at(ps, ps->len, "unexpected end of input (expected a key in the object that starts at byte %zu)",
                    v->offset);
            goto bad;
        }
        if (ps->p[ps->pos] != '"') {
            fail_at(ps, ps->pos, "expected a string key in an object, found %s",
                    describe_byte(ps, ps->pos, d));
            goto bad;
        }
        if (grow((void **)&members, &cap, n + 1, sizeof *members) < 0) {
            fail_oom(ps);
            goto bad;
        }
        tally_json_member_t *m = &members[n];
        memset(m, 0, sizeof *m);
        if (parse_string(ps, &m->key, &m->key_len) < 0)
            goto bad;
        skip_ws(ps);
        if (ps->pos >= ps->len || ps->p[ps->pos] != ':') {
            if (ps->pos >= ps->len)
                fail_at(ps, ps->len, "unexpected end of input (expected ':' after the key \"%s\")", m->key);
            else
                fail_at(ps, ps->pos, "expected ':' after the key \"%s\", found %s", m->key,
                        describe_byte(ps, ps->pos, d));
            tally__meta_free(m->key);
            goto bad;
        }
        ps->pos++;
        if (parse_value(ps, &m->value, depth + 1) < 0) {
            tally__meta_free(m->key);
            goto bad;
        }
        n++;
        skip_ws(ps);
        if (ps->pos >= ps->len) {
            fail_at(ps, ps->len, "unexpected end of input (expected ',' or '}' in the object that starts at byte %zu)",
                    v->offset);
            goto bad;
        }
        unsigned char c = ps->p[ps->pos++];
        if (c == '}')
            break;
        if (c != ',') {
            fail_at(ps, ps->pos - 1, "expected ',' or '}' in an object, found %s",
                    describe_byte(ps, ps->pos - 1, d));
            goto bad;
        }
    }
done:
    v->type = TALLY_JSON_OBJECT;
    v->members = members;
    v->len = n;
    return 0;
bad:
    for (size_t k = 0; k < n; k++) {
        tally__meta_free(members[k].key);
        free_contents(&members[k].value);
    }
    tally__meta_free(members);
    return -1;
}

static int parse_value(parser_t *ps, tally_json_t *v, int depth)
{
    memset(v, 0, sizeof *v);
    v->type = TALLY_JSON_NULL;
    skip_ws(ps);
    v->offset = ps->pos;
    if (ps->pos >= ps->len)
        return fail_at(ps, ps->len, "unexpected end of input (expected a value)");
    unsigned char c = ps->p[ps->pos];
    switch (c) {
    case '{':
    case '[':
        if (depth >= TALLY_JSON_MAX_DEPTH)
            return fail_at(ps, ps->pos, "nesting deeper than %d levels", TALLY_JSON_MAX_DEPTH);
        return c == '{' ? parse_object(ps, v, depth) : parse_array(ps, v, depth);
    case '"': {
        char *s;
        size_t n;
        if (parse_string(ps, &s, &n) < 0)
            return -1;
        v->type = TALLY_JSON_STRING;
        v->s = s;
        v->len = n;
        return 0;
    }
    case 't':
        return parse_literal(ps, v, "true", TALLY_JSON_TRUE);
    case 'f':
        return parse_literal(ps, v, "false", TALLY_JSON_FALSE);
    case 'n':
        return parse_literal(ps, v, "null", TALLY_JSON_NULL);
    default:
        if (c == '-' || (c >= '0' && c <= '9'))
            return parse_number(ps, v);
        char d[8];
        return fail_at(ps, ps->pos, "unexpected %s (expected a value)", describe_byte(ps, ps->pos, d));
    }
}

tally_json_t *tally__json_parse(const char *text, size_t len, char *err, size_t errlen,
                                size_t *err_offset)
{
    parser_t ps = {(const unsigned char *)text, text ? len : 0, 0, err, errlen, 0};
    if (err && errlen)
        err[0] = 0;
    tally_json_t *root = tally__meta_alloc(sizeof *root);
    if (!root) {
        fail_oom(&ps);
        goto bad;
    }
    if (ps.len >= 3 && memcmp(ps.p, "\xef\xbb\xbf", 3) == 0)
        ps.pos = 3;
    if (parse_value(&ps, root, 0) < 0) {
        tally__meta_free(root);
        root = NULL;
        goto bad;
    }
    skip_ws(&ps);
    if (ps.pos < ps.len) {
        char d[8];
        fail_at(&ps, ps.pos, "unexpected %s after the end of the JSON value",
                describe_byte(&ps, ps.pos, d));
        tally__json_free(root);
        root = NULL;
        goto bad;
    }
    return root;
bad:
    if (err_offset)
        *err_offset = ps.err_at;
    return NULL;
}

/* ---- lookups ------------------------------------------------------------ */

const tally_json_t *tally__json_getn(const tally_json_t *obj, const char *key, size_t key_len)
{
    if (!obj || obj->type != TALLY_JSON_OBJECT || !key)
        return NULL;
    for (size_t i = obj->len; i-- > 0;) {
        const tally_json_member_t *m = &obj->members[i];
        if (m->key_len == key_len && memcmp(m->key, key, key_len) == 0)
            return &m->value;
    }
    return NULL;
}

const tally_json_t *tally__json_get(const tally_json_t *obj, const char *key)
{
    return key ? tally__json_getn(obj, key, strlen(key)) : NULL;
}

const tally_json_t *tally__json_at(const tally_json_t *arr, size_t index)
{
    if (!arr || arr->type != TALLY_JSON_ARRAY || index >= arr->len)
        return NULL;
    return &arr->items[index];
}

int tally__json_int(const tally_json_t *v, int64_t *out)
{
    if (!v || v->type != TALLY_JSON_NUMBER)
        return -1;
    if (v->is_int) {
        *out = v->i;
        return 0;
    }
    /* Integral doubles in [-2^63, 2^63) convert exactly. */
    if (v->d != floor(v->d) || v->d < -9223372036854775808.0 || v->d >= 9223372036854775808.0)
        return -1;
    *out = (int64_t)v->d;
    return 0;
}

const char *tally__json_type_name(tally_json_type_t type)
{
    switch (type) {
    case TALLY_JSON_NULL: return "null";
    case TALLY_JSON_FALSE: return "false";
    case TALLY_JSON_TRUE: return "true";
    case TALLY_JSON_NUMBER: return "number";
    case TALLY_JSON_STRING: return "string";
    case TALLY_JSON_ARRAY: return "array";
    case TALLY_JSON_OBJECT: return "object";
    }
    return "?";
}
