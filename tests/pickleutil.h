/* Writing PyTorch snapshot pickles from Python-like literals, for the tests
 * of tally tune on bad input (test_tune_bad_input,
 * test_tune_bad_input_command): pickle_of turns {'k': v, ...}, [v, ...],
 * 'text', integers, None, True and False into a protocol-2 pickle, so each
 * case reads as the data it holds; write_pickle puts one in the scratch
 * folder. Include after cmocka.h and tuneutil.h (scratch). */
#ifndef TALLY_TESTS_PICKLEUTIL_H
#define TALLY_TESTS_PICKLEUTIL_H

#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct pbuf {
    unsigned char *b;
    size_t n, cap;
} pbuf_t;

static inline void put(pbuf_t *o, const void *src, size_t n)
{
    if (o->n + n > o->cap) {
        o->cap = (o->n + n) * 2;
        o->b = realloc(o->b, o->cap);
        assert_non_null(o->b);
    }
    memcpy(o->b + o->n, src, n);
    o->n += n;
}

static inline void put1(pbuf_t *o, unsigned char c)
{
    put(o, &c, 1);
}

/* One value of the literal at *s: {'k': v, ...}, [v, ...], 'text', an
 * integer, None, True, False. Written with protocol-2 opcodes: EMPTY_DICT,
 * MARK, SETITEMS; EMPTY_LIST, MARK, APPENDS; SHORT_BINUNICODE; LONG1 of 8
 * bytes; NONE, NEWTRUE, NEWFALSE. */
static inline void pickle_value(pbuf_t *o, const char **s)
{
    while (isspace((unsigned char)**s))
        (*s)++;
    const char *p = *s;
    if (*p == '{' || *p == '[') {
        bool dict = *p == '{';
        put1(o, dict ? '}' : ']');
        put1(o, '(');
        (*s)++;
        for (;;) {
            while (isspace((unsigned char)**s) || **s == ',' || **s == ':')
                (*s)++;
            if (**s == (dict ? '}' : ']'))
                break;
            assert_true(**s != 0);
            pickle_value(o, s);
        }
        (*s)++;
        put1(o, dict ? 'u' : 'e');
    } else if (*p == '\'') {
        const char *end = strchr(p + 1, '\'');
        assert_non_null(end);
        assert_true(end - p - 1 < 256);
        put1(o, 0x8c);
        put1(o, (unsigned char)(end - p - 1));
        put(o, p + 1, (size_t)(end - p - 1));
        *s = end + 1;
    } else if (strncmp(p, "None", 4) == 0 || strncmp(p, "True", 4) == 0) {
        put1(o, *p == 'N' ? 'N' : 0x88);
        *s += 4;
    } else if (strncmp(p, "False", 5) == 0) {
        put1(o, 0x89);
        *s += 5;
    } else {
        char *end;
        long long v = strtoll(p, &end, 10);
        assert_true(end != p);
        put1(o, 0x8a);
        put1(o, 8);
        for (int i = 0; i < 8; i++)
            put1(o, (unsigned char)((unsigned long long)v >> (8 * i)));
        *s = end;
    }
}

/* The pickle of literal (malloc'd; its length in *len). */
static inline unsigned char *pickle_of(const char *literal, size_t *len)
{
    pbuf_t o = {0};
    put1(&o, 0x80);
    put1(&o, 2);
    pickle_value(&o, &literal);
    put1(&o, '.');
    *len = o.n;
    return o.b;
}

/* The pickle of literal written to scratch/name; its path in path. */
static inline void write_pickle(const char *name, const char *literal, char *path, size_t len)
{
    size_t n;
    unsigned char *data = pickle_of(literal, &n);
    snprintf(path, len, "%s/%s", scratch, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
    free(data);
}

#endif /* TALLY_TESTS_PICKLEUTIL_H */
