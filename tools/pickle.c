/* The plain-data pickle reader (see pickle.h). A stack machine over the
 * opcodes of protocols 2 to 5 that build values; each other opcode is an
 * error naming it. Values live on the heap and are listed in the document,
 * so memo references (the same dict reached twice) need no ownership. */
#include "pickle.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct pk_parser {
    pk_doc_t *doc;
    const unsigned char *p, *end, *start;
    const char *name;
    char *err;
    size_t errlen;
    pk_value_t **stack;
    size_t sp, scap;
    size_t *marks;
    size_t nmarks, mcap;
    pk_value_t **memo;
    size_t nmemo, memocap;
} pk_parser_t;

static int pk_fail(pk_parser_t *q, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int pk_fail(pk_parser_t *q, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(q->err, q->errlen, "%s: not a readable pickle: %s (at byte %zu)", q->name, what,
             (size_t)(q->p - q->start));
    return -1;
}

/* Grow *arr (elements of size elem) to hold need; 0 or -1. */
static int grow(void *arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : 16;
    while (n < need)
        n *= 2;
    void *g = realloc(*(void **)arr, n * elem);
    if (!g)
        return -1;
    *(void **)arr = g;
    *cap = n;
    return 0;
}

static pk_value_t *new_value(pk_parser_t *q, pk_type_t type)
{
    pk_doc_t *d = q->doc;
    if (grow(&d->all, &d->capall, d->nall + 1, sizeof *d->all))
        return NULL;
    pk_value_t *v = calloc(1, sizeof *v);
    if (!v)
        return NULL;
    v->type = type;
    d->all[d->nall++] = v;
    return v;
}

static int push(pk_parser_t *q, pk_value_t *v)
{
    if (!v || grow(&q->stack, &q->scap, q->sp + 1, sizeof *q->stack))
        return pk_fail(q, "out of memory");
    q->stack[q->sp++] = v;
    return 0;
}

static int push_new(pk_parser_t *q, pk_type_t type, pk_value_t **out)
{
    pk_value_t *v = new_value(q, type);
    if (push(q, v))
        return -1;
    if (out)
        *out = v;
    return 0;
}

static int add_item(pk_parser_t *q, pk_value_t *c, pk_value_t *v)
{
    if (grow(&c->items, &c->cap, c->n + 1, sizeof *c->items))
        return pk_fail(q, "out of memory");
    c->items[c->n++] = v;
    return 0;
}

/* Read n bytes of argument. */
static const unsigned char *take(pk_parser_t *q, size_t n)
{
    if ((size_t)(q->end - q->p) < n)
        return NULL;
    const unsigned char *a = q->p;
    q->p += n;
    return a;
}

static uint64_t le(const unsigned char *a, size_t n)
{
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;)
        v = v << 8 | a[i];
    return v;
}

/* The top of the mark stack: index in the value stack where the items begin. */
static int pop_mark(pk_parser_t *q, size_t *at)
{
    if (!q->nmarks)
        return pk_fail(q, "items without a MARK");
    *at = q->marks[--q->nmarks];
    return 0;
}

static int memo_put(pk_parser_t *q, uint64_t idx)
{
    if (!q->sp)
        return pk_fail(q, "memo store with an empty stack");
    /* Each memoised value took at least one byte of input: a larger index
     * is made up (and would make the memo table huge). */
    if (idx > (uint64_t)(q->end - q->start))
        return pk_fail(q, "memo index %llu out of range for a file of %zu bytes", (unsigned long long)idx,
                       (size_t)(q->end - q->start));
    size_t old = q->memocap;
    if (grow(&q->memo, &q->memocap, (size_t)idx + 1, sizeof *q->memo))
        return pk_fail(q, "out of memory");
    if (q->memocap > old)
        memset(q->memo + old, 0, (q->memocap - old) * sizeof *q->memo);
    q->memo[idx] = q->stack[q->sp - 1];
    if (idx >= q->nmemo)
        q->nmemo = (size_t)idx + 1;
    return 0;
}

static int memo_get(pk_parser_t *q, uint64_t idx)
{
    if (idx >= q->nmemo || !q->memo[idx])
        return pk_fail(q, "memo index %llu was never stored", (unsigned long long)idx);
    return push(q, q->memo[idx]);
}

static int push_str(pk_parser_t *q, pk_type_t type, size_t lenbytes)
{
    const unsigned char *a = take(q, lenbytes);
    if (!a)
        return pk_fail(q, "truncated string length");
    uint64_t n = le(a, lenbytes);
    const unsigned char *s = take(q, n > (uint64_t)(q->end - q->p) ? (size_t)-1 : (size_t)n);
    if (!s)
        return pk_fail(q, "string of %llu bytes runs past the end of the file", (unsigned long long)n);
    pk_value_t *v;
    if (push_new(q, type, &v))
        return -1;
    v->s = (const char *)s;
    v->len = (size_t)n;
    return 0;
}

static int push_int(pk_parser_t *q, int64_t i, pk_type_t type)
{
    pk_value_t *v;
    if (push_new(q, type, &v))
        return -1;
    v->i = i;
    return 0;
}

/* LONG1: n little-endian two's-complement bytes. */
static int push_long1(pk_parser_t *q)
{
    const unsigned char *a = take(q, 1);
    if (!a)
        return pk_fail(q, "truncated LONG1");
    size_t n = a[0];
    const unsigned char *b = take(q, n);
    if (!b)
        return pk_fail(q, "truncated LONG1");
    if (n > 8)
        return pk_fail(q, "integer of %zu bytes does not fit in 64 bits", n);
    uint64_t u = le(b, n);
    if (n && n < 8 && (b[n - 1] & 0x80))
        u |= ~(uint64_t)0 << (8 * n);
    return push_int(q, (int64_t)u, PK_INT);
}

/* TUPLE, TUPLE1..3, LIST, DICT: build from the top n items. */
static int collect(pk_parser_t *q, pk_type_t type, size_t from)
{
    size_t n = q->sp - from;
    if (type == PK_DICT && n % 2)
        return pk_fail(q, "dict with an odd number of items");
    pk_value_t *v = new_value(q, type);
    if (!v)
        return pk_fail(q, "out of memory");
    for (size_t i = from; i < q->sp; i++)
        if (add_item(q, v, q->stack[i]))
            return -1;
    if (type == PK_DICT)
        v->n /= 2; /* pairs; items holds 2n pointers */
    q->sp = from;
    return push(q, v);
}

/* APPEND(S) and SETITEM(S): add the items above `from` to the container below it. */
static int extend(pk_parser_t *q, size_t from, bool dict)
{
    if (from == 0)
        return pk_fail(q, "%s with nothing to add to", dict ? "SETITEMS" : "APPENDS");
    pk_value_t *c = q->stack[from - 1];
    if (c->type != (dict ? PK_DICT : PK_LIST))
        return pk_fail(q, "%s on a %s", dict ? "SETITEMS" : "APPENDS", pk_type_name(c));
    size_t n = q->sp - from;
    if (dict && n % 2)
        return pk_fail(q, "SETITEMS with an odd number of items");
    if (dict) {
        for (size_t i = from; i + 1 < q->sp; i += 2) {
            if (grow(&c->items, &c->cap, c->n * 2 + 2, sizeof *c->items))
                return pk_fail(q, "out of memory");
            c->items[c->n * 2] = q->stack[i];
            c->items[c->n * 2 + 1] = q->stack[i + 1];
            c->n++;
        }
    } else {
        for (size_t i = from; i < q->sp; i++)
            if (add_item(q, c, q->stack[i]))
                return -1;
    }
    q->sp = from;
    return 0;
}

static const char *refused_name(unsigned char op)
{
    switch (op) {
    case 'c': return "GLOBAL";
    case 0x93: return "STACK_GLOBAL";
    case 'R': return "REDUCE";
    case 'b': return "BUILD";
    case 'i': return "INST";
    case 'o': return "OBJ";
    case 0x81: return "NEWOBJ";
    case 0x92: return "NEWOBJ_EX";
    case 'P': return "PERSID";
    case 'Q': return "BINPERSID";
    case 0x82: case 0x83: case 0x84: return "EXT";
    default: return NULL;
    }
}

static int step(pk_parser_t *q, unsigned char op, bool *stop)
{
    const unsigned char *a;
    size_t from = 0;
    switch (op) {
    case 0x80: /* PROTO */
        if (!(a = take(q, 1)))
            return pk_fail(q, "truncated PROTO");
        if (a[0] < 2 || a[0] > 5)
            return pk_fail(q, "protocol %u (2 to 5 are read)", a[0]);
        return 0;
    case 0x95: /* FRAME: a length hint */
        return take(q, 8) ? 0 : pk_fail(q, "truncated FRAME");
    case '.':
        *stop = true;
        return 0;
    case '(':
        if (grow(&q->marks, &q->mcap, q->nmarks + 1, sizeof *q->marks))
            return pk_fail(q, "out of memory");
        q->marks[q->nmarks++] = q->sp;
        return 0;
    case '}': return push_new(q, PK_DICT, NULL);
    case ']': return push_new(q, PK_LIST, NULL);
    case ')': return push_new(q, PK_TUPLE, NULL);
    case 'N': return push_new(q, PK_NONE, NULL);
    case 0x88: return push_int(q, 1, PK_BOOL);
    case 0x89: return push_int(q, 0, PK_BOOL);
    case 'K':
        return (a = take(q, 1)) ? push_int(q, a[0], PK_INT) : pk_fail(q, "truncated BININT1");
    case 'M':
        return (a = take(q, 2)) ? push_int(q, (int64_t)le(a, 2), PK_INT) : pk_fail(q, "truncated BININT2");
    case 'J':
        return (a = take(q, 4)) ? push_int(q, (int32_t)(uint32_t)le(a, 4), PK_INT) : pk_fail(q, "truncated BININT");
    case 0x8a: return push_long1(q);
    case 'G': {
        if (!(a = take(q, 8)))
            return pk_fail(q, "truncated BINFLOAT");
        uint64_t u = 0;
        for (int i = 0; i < 8; i++)
            u = u << 8 | a[i];
        pk_value_t *v;
        if (push_new(q, PK_FLOAT, &v))
            return -1;
        memcpy(&v->f, &u, sizeof v->f);
        return 0;
    }
    case 0x8c: return push_str(q, PK_STR, 1);
    case 'X': return push_str(q, PK_STR, 4);
    case 0x8d: return push_str(q, PK_STR, 8);
    case 'C': return push_str(q, PK_BYTES, 1);
    case 'B': return push_str(q, PK_BYTES, 4);
    case 0x8e: return push_str(q, PK_BYTES, 8);
    case 0x94: return memo_put(q, q->nmemo);
    case 'q': return (a = take(q, 1)) ? memo_put(q, a[0]) : pk_fail(q, "truncated BINPUT");
    case 'r': return (a = take(q, 4)) ? memo_put(q, le(a, 4)) : pk_fail(q, "truncated LONG_BINPUT");
    case 'h': return (a = take(q, 1)) ? memo_get(q, a[0]) : pk_fail(q, "truncated BINGET");
    case 'j': return (a = take(q, 4)) ? memo_get(q, le(a, 4)) : pk_fail(q, "truncated LONG_BINGET");
    case 0x85: case 0x86: case 0x87: {
        size_t n = (size_t)(op - 0x84);
        if (q->sp < n)
            return pk_fail(q, "TUPLE%zu with %zu items on the stack", n, q->sp);
        return collect(q, PK_TUPLE, q->sp - n);
    }
    case 't': return pop_mark(q, &from) ? -1 : collect(q, PK_TUPLE, from);
    case 'l': return pop_mark(q, &from) ? -1 : collect(q, PK_LIST, from);
    case 'd': return pop_mark(q, &from) ? -1 : collect(q, PK_DICT, from);
    case 'a':
        if (q->sp < 2)
            return pk_fail(q, "APPEND with %zu items on the stack", q->sp);
        return extend(q, q->sp - 1, false);
    case 'e': return pop_mark(q, &from) ? -1 : extend(q, from, false);
    case 's':
        if (q->sp < 3)
            return pk_fail(q, "SETITEM with %zu items on the stack", q->sp);
        return extend(q, q->sp - 2, true);
    case 'u': return pop_mark(q, &from) ? -1 : extend(q, from, true);
    case '0':
        if (!q->sp)
            return pk_fail(q, "POP on an empty stack");
        q->sp--;
        return 0;
    case '1':
        if (pop_mark(q, &from))
            return -1;
        q->sp = from;
        return 0;
    case '2':
        if (!q->sp)
            return pk_fail(q, "DUP on an empty stack");
        return push(q, q->stack[q->sp - 1]);
    default: {
        const char *name = refused_name(op);
        q->p--;
        if (name)
            return pk_fail(q, "opcode %s would construct an object; only plain data (dicts, lists, strings, numbers) is read",
                           name);
        return pk_fail(q, "opcode 0x%02x is not one plain-data pickles of protocol 2 to 5 use", op);
    }
    }
}

int pk_parse(unsigned char *data, size_t len, pk_doc_t *doc, const char *name, char *err, size_t errlen)
{
    memset(doc, 0, sizeof *doc);
    doc->data = data;
    doc->len = len;
    pk_parser_t q = {.doc = doc, .p = data, .end = data + len, .start = data, .name = name, .err = err,
                     .errlen = errlen};
    int rc = 0;
    bool stop = false;
    if (len == 0)
        rc = pk_fail(&q, "empty file");
    else if (data[0] != 0x80)
        rc = pk_fail(&q, "no PROTO opcode at the start (first byte 0x%02x)", data[0]);
    while (!rc && !stop) {
        if (q.p >= q.end) {
            rc = pk_fail(&q, "truncated: the file ends before the STOP opcode");
            break;
        }
        rc = step(&q, *q.p++, &stop);
    }
    if (!rc && q.sp != 1)
        rc = pk_fail(&q, "STOP with %zu values on the stack (1 expected)", q.sp);
    if (!rc)
        doc->root = q.stack[0];
    free(q.stack);
    free(q.marks);
    free(q.memo);
    if (rc)
        pk_free(doc);
    return rc;
}

int pk_load(const char *path, pk_doc_t *doc, char *err, size_t errlen)
{
    memset(doc, 0, sizeof *doc);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    unsigned char *data = NULL;
    size_t len = 0, cap = 0, got;
    int rc = 0;
    do {
        if (grow(&data, &cap, len + 65536, 1)) {
            snprintf(err, errlen, "%s: out of memory", path);
            rc = -1;
            break;
        }
        got = fread(data + len, 1, cap - len, f);
        len += got;
    } while (got);
    if (!rc && ferror(f)) {
        snprintf(err, errlen, "%s: read error", path);
        rc = -1;
    }
    fclose(f);
    if (rc) {
        free(data);
        return rc;
    }
    return pk_parse(data, len, doc, path, err, errlen);
}

void pk_free(pk_doc_t *doc)
{
    for (size_t i = 0; i < doc->nall; i++) {
        free(doc->all[i]->items);
        free(doc->all[i]);
    }
    free(doc->all);
    free(doc->data);
    memset(doc, 0, sizeof *doc);
}

bool pk_str_is(const pk_value_t *v, const char *s)
{
    size_t n = strlen(s);
    return v && v->type == PK_STR && v->len == n && memcmp(v->s, s, n) == 0;
}

const pk_value_t *pk_get(const pk_value_t *dict, const char *key)
{
    if (!dict || dict->type != PK_DICT)
        return NULL;
    for (size_t i = 0; i < dict->n; i++)
        if (pk_str_is(dict->items[2 * i], key))
            return dict->items[2 * i + 1];
    return NULL;
}

const char *pk_type_name(const pk_value_t *v)
{
    static const char *const names[] = {"None", "bool", "int", "float", "str", "bytes", "list", "tuple", "dict"};
    return v ? names[v->type] : "nothing";
}
