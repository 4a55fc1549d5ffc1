/* The library's JSON reader (json.c): values, strings and their escapes,
 * errors with their offsets, the nesting limit, and mangled input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/internal.h" /* tally__meta_fail */
#include "report/json.h"
#include "skip.h"

/* ---- JSON reader -------------------------------------------------------- */

static tally_json_t *parse_ok(const char *text)
{
    char err[256];
    tally_json_t *v = tally__json_parse(text, strlen(text), err, sizeof err, NULL);
    if (!v)
        fail_msg("parse of <%s> failed: %s", text, err);
    return v;
}

static void test_json_values(void **state)
{
    (void)state;
    tally_json_t *v = parse_ok("\xef\xbb\xbf {\"a\": [1, -2, 3.5, -0, 1e2, true, false, null, \"x\"],"
                               " \"b\": {\"c\": {}}, \"d\": [], \"a2\": 9223372036854775807,"
                               " \"m\": -9223372036854775808, \"big\": 18446744073709551616, \"a\": 7}\r\n");
    assert_int_equal(v->type, TALLY_JSON_OBJECT);
    assert_int_equal(v->len, 7);
    /* A repeated key: the last one wins; the first is still in members. */
    const tally_json_t *a = tally__json_get(v, "a");
    assert_int_equal(a->type, TALLY_JSON_NUMBER);
    assert_int_equal(a->i, 7);
    const tally_json_t *arr = &v->members[0].value;
    assert_int_equal(arr->type, TALLY_JSON_ARRAY);
    assert_int_equal(arr->len, 9);
    assert_true(tally__json_at(arr, 0)->is_int);
    assert_int_equal(tally__json_at(arr, 1)->i, -2);
    assert_false(tally__json_at(arr, 2)->is_int);
    assert_true(tally__json_at(arr, 2)->d == 3.5);
    int64_t x;
    assert_int_equal(tally__json_int(tally__json_at(arr, 2), &x), -1);
    assert_int_equal(tally__json_int(tally__json_at(arr, 3), &x), 0);
    assert_int_equal(x, 0);
    assert_int_equal(tally__json_int(tally__json_at(arr, 4), &x), 0);
    assert_int_equal(x, 100);
    assert_int_equal(tally__json_at(arr, 5)->type, TALLY_JSON_TRUE);
    assert_int_equal(tally__json_at(arr, 6)->type, TALLY_JSON_FALSE);
    assert_int_equal(tally__json_at(arr, 7)->type, TALLY_JSON_NULL);
    assert_string_equal(tally__json_at(arr, 8)->s, "x");
    assert_null(tally__json_at(arr, 9));
    assert_null(tally__json_at(v, 0));
    assert_int_equal(tally__json_int(tally__json_at(arr, 8), &x), -1);
    const tally_json_t *c = tally__json_get(tally__json_get(v, "b"), "c");
    assert_non_null(c);
    assert_int_equal(c->type, TALLY_JSON_OBJECT);
    assert_int_equal(c->len, 0);
    assert_int_equal(tally__json_get(v, "d")->len, 0);
    assert_int_equal(tally__json_get(v, "a2")->i, INT64_MAX);
    assert_int_equal(tally__json_get(v, "m")->i, INT64_MIN);
    const tally_json_t *big = tally__json_get(v, "big");
    assert_false(big->is_int);
    assert_true(big->d == 18446744073709551616.0);
    assert_int_equal(tally__json_int(big, &x), -1);
    assert_null(tally__json_get(v, "nope"));
    assert_null(tally__json_get(arr, "a"));
    assert_string_equal(tally__json_type_name(big->type), "number");
    tally__json_free(v);
    tally__json_free(NULL);
}

static void test_json_strings(void **state)
{
    (void)state;
    tally_json_t *v = parse_ok("[\"q\\\"b\\\\s\\/\\b\\f\\n\\r\\t\", \"\\u00e9\\u20ac\\ud83d\\ude00\","
                               " \"a\\u0000b\", \"\xc3\xa9 raw\", \"\"]");
    assert_string_equal(v->items[0].s, "q\"b\\s/\b\f\n\r\t");
    assert_string_equal(v->items[1].s, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
    assert_int_equal(v->items[2].len, 3);
    assert_memory_equal(v->items[2].s, "a\0b", 4);
    assert_string_equal(v->items[3].s, "\xc3\xa9 raw");
    assert_int_equal(v->items[4].len, 0);
    tally__json_free(v);

    /* Every hex digit, in both cases. */
    v = parse_ok("\"\\u0123\\u4567\\u89ab\\ucdef\\u89AB\\uCDEF\"");
    assert_string_equal(v->s, "\xc4\xa3\xe4\x95\xa7\xe8\xa6\xab\xec\xb7\xaf\xe8\xa6\xab\xec\xb7\xaf");
    tally__json_free(v);

    /* The edges of each UTF-8 length: U+007F is one byte, U+0080 two,
     * U+07FF two, U+0800 three, U+FFFF three, U+10000 four. */
    v = parse_ok("\"\\u007f|\\u0080|\\u07ff|\\u0800|\\uffff|\\ud800\\udc00\"");
    assert_string_equal(v->s, "\x7f|\xc2\x80|\xdf\xbf|\xe0\xa0\x80|\xef\xbf\xbf|\xf0\x90\x80\x80");
    tally__json_free(v);

    /* The edges of the surrogate ranges: U+D7FF and U+E000 stand alone;
     * \udbff, the last high surrogate, pairs with \udfff, the last low
     * one, into U+10FFFF, the last code point. */
    v = parse_ok("\"\\ud7ff|\\ue000|\\udbff\\udfff|\\udbff\\udc00|\\ud800\\udfff\"");
    assert_string_equal(v->s, "\xed\x9f\xbf|\xee\x80\x80|\xf4\x8f\xbf\xbf|\xf4\x8f\xb0\x80|\xf0\x90\x8f\xbf");
    tally__json_free(v);

    /* A key holding a NUL is found only through the length-taking lookup. */
    v = parse_ok("{\"k\\u0000z\": 1}");
    assert_null(tally__json_get(v, "k"));
    assert_non_null(tally__json_getn(v, "k\0z", 3));
    tally__json_free(v);
}

/* Numbers by RFC 8259's grammar: each valid form with its value (an exact
 * integer when it is one and fits int64), and digits bounded on both sides
 * ('/' sorts just below '0', ':' just above '9'). */
static void test_json_number_grammar(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        int is_int;
        int64_t i;
        double d;
    } ok[] = {
        {"0", 1, 0, 0},
        {"-0", 1, 0, 0},
        {"7", 1, 7, 0},
        {"-7", 1, -7, 0},
        {"90", 1, 90, 0},
        {"109", 1, 109, 0},
        {"9223372036854775807", 1, INT64_MAX, 0},
        {"-9223372036854775808", 1, INT64_MIN, 0},
        {"9223372036854775808", 0, 0, 9223372036854775808.0},
        {"-9223372036854775809", 0, 0, -9223372036854775809.0},
        {"1000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000", 0, 0,
         1e96},
        {"0.5", 0, 0, 0.5},
        {"-0.25", 0, 0, -0.25},
        {"10.09", 0, 0, 10.09},
        {"1e2", 0, 0, 100},
        {"1E2", 0, 0, 100},
        {"1e+2", 0, 0, 100},
        {"25e-1", 0, 0, 2.5},
        {"2.5E3", 0, 0, 2500},
        {"0e0", 0, 0, 0},
        {"9.9", 0, 0, 9.9},
    };
    for (size_t k = 0; k < sizeof ok / sizeof *ok; k++) {
        char text[160];
        snprintf(text, sizeof text, "[%s]", ok[k].text);
        tally_json_t *v = parse_ok(text);
        const tally_json_t *n = &v->items[0];
        if (v->len != 1 || n->type != TALLY_JSON_NUMBER || n->is_int != (ok[k].is_int != 0))
            fail_msg("%s: %zu items, type %d, is_int %d", text, v->len, n->type, n->is_int);
        if (ok[k].is_int && n->i != ok[k].i)
            fail_msg("%s read as %lld", text, (long long)n->i);
        double want = ok[k].is_int ? (double)ok[k].i : ok[k].d;
        if (n->d != want)
            fail_msg("%s read as %.17g, not %.17g", text, n->d, want);
        tally__json_free(v);
    }
    static const struct {
        const char *text;
        const char *error;
    } bad[] = {
        {"[/]", "byte 1: unexpected '/' (expected a value)"},
        {"[-/]", "byte 1: invalid number (a digit must follow '-')"},
        {"[-:]", "byte 1: invalid number (a digit must follow '-')"},
        {"[0/]", "byte 2: expected ',' or ']' in an array, found '/'"},
        {"[1:]", "byte 2: expected ',' or ']' in an array, found ':'"},
        {"[00]", "byte 1: invalid number (leading zero)"},
        {"[09]", "byte 1: invalid number (leading zero)"},
        {"[-01]", "byte 1: invalid number (leading zero)"},
        {"[1./]", "byte 1: invalid number (a digit must follow '.')"},
        {"[1.:]", "byte 1: invalid number (a digit must follow '.')"},
        {"[1.5/]", "byte 4: expected ',' or ']' in an array, found '/'"},
        {"[1.5:]", "byte 4: expected ',' or ']' in an array, found ':'"},
        {"[1e/]", "byte 1: invalid number (a digit must follow the exponent)"},
        {"[1e:]", "byte 1: invalid number (a digit must follow the exponent)"},
        {"[1e-/]", "byte 1: invalid number (a digit must follow the exponent)"},
        {"[1e5/]", "byte 4: expected ',' or ']' in an array, found '/'"},
        {"[1e5:]", "byte 4: expected ',' or ']' in an array, found ':'"},
        {"[+1]", "byte 1: unexpected '+' (expected a value)"},
        {"[.5]", "byte 1: unexpected '.' (expected a value)"},
    };
    /* A number that is not an integer is copied out to be converted: into a
     * 64-byte buffer when it and its terminator fit, else into one of its
     * own; lengths about that edge read the same (ASan sees an overrun). */
    for (size_t len = 60; len <= 68; len++) {
        char num[80], text[90];
        memset(num, '0', len);
        num[1] = '.';
        num[len - 1] = '7';
        num[len] = 0;
        snprintf(text, sizeof text, "[%s]", num);
        tally_json_t *v = parse_ok(text);
        if (v->len != 1 || v->items[0].is_int || v->items[0].d != strtod(num, NULL))
            fail_msg("%zu digits: %s read as %.17g", len, num, v->items[0].d);
        tally__json_free(v);
    }
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        char err[256] = "";
        tally_json_t *v = tally__json_parse(bad[k].text, strlen(bad[k].text), err, sizeof err, NULL);
        if (v)
            fail_msg("%s parsed", bad[k].text);
        if (strcmp(err, bad[k].error) != 0)
            fail_msg("%s: \"%s\", expected \"%s\"", bad[k].text, err, bad[k].error);
    }
}

/* The parser reads only the len bytes it is given: a buffer that goes on
 * (a file read into a larger buffer, an mmap) never lends it a digit, a '.',
 * an exponent or a sign past the end. */
static void test_json_numbers_end_at_the_given_length(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        size_t len;
        int64_t value; /* an integer, when error is NULL */
        const char *error;
    } cases[] = {
        {"12", 1, 1, NULL},
        {"05", 1, 0, NULL},
        {"-05", 2, 0, NULL},
        {"7.5", 1, 7, NULL},
        {"7e3", 1, 7, NULL},
        {"-5", 1, 0, "byte 0: invalid number (a digit must follow '-')"},
        {"1.5", 2, 0, "byte 0: invalid number (a digit must follow '.')"},
        {"1e5", 2, 0, "byte 0: invalid number (a digit must follow the exponent)"},
        {"1e+5", 3, 0, "byte 0: invalid number (a digit must follow the exponent)"},
        {"1.25", 3, 0, NULL}, /* 1.2 */
        {"2e15", 3, 0, NULL}, /* 2e1 */
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char err[256] = "";
        tally_json_t *v = tally__json_parse(cases[k].text, cases[k].len, err, sizeof err, NULL);
        if (cases[k].error) {
            if (v || strcmp(err, cases[k].error) != 0)
                fail_msg("<%.*s>: \"%s\", expected \"%s\"", (int)cases[k].len, cases[k].text, err, cases[k].error);
            continue;
        }
        if (!v)
            fail_msg("<%.*s> failed: %s", (int)cases[k].len, cases[k].text, err);
        if (k == 9 || k == 10) {
            double want = k == 9 ? 1.2 : 20;
            if (v->is_int || v->d != want)
                fail_msg("<%.*s> read as %.17g", (int)cases[k].len, cases[k].text, v->d);
        } else if (!v->is_int || v->i != cases[k].value) {
            fail_msg("<%.*s> read as %lld", (int)cases[k].len, cases[k].text, (long long)v->i);
        }
        tally__json_free(v);
    }
    /* Strings too: an escape cut by the end of the buffer is an error. */
    char err[256] = "";
    assert_null(tally__json_parse("\"\\u00e9\"", 6, err, sizeof err, NULL));
    assert_null(tally__json_parse("\"ab\"", 3, err, sizeof err, NULL));
}

static void expect_json_error(const char *text, size_t len, size_t offset, const char *message)
{
    char err[256];
    size_t at = 12345;
    tally_json_t *v = tally__json_parse(text, len, err, sizeof err, &at);
    if (v)
        fail_msg("<%s> parsed, expected an error", text);
    assert_string_equal(err, message);
    assert_int_equal(at, offset);
}

#define JSON_ERR(text, offset, message) expect_json_error(text, sizeof text - 1, offset, message)

/* The parser reads only the bytes it is given: every prefix of a document,
 * passed as the whole text with a shorter length (so the next byte is the
 * document's own, a ':' or a digit that would let the parse go on), fails
 * with the same message at the same byte as that prefix copied alone. */
static void test_json_reads_nothing_past_its_length(void **state)
{
    (void)state;
    static const char doc[] = "{\"a\":1,\"bc\":[2.5,-3e2,true,false,null],\"d\":{\"e\":\"f\\u00e9\"}}";
    size_t n = sizeof doc - 1;
    for (size_t k = 0; k < n; k++) {
        char *copy = malloc(k + 1);
        assert_non_null(copy);
        memcpy(copy, doc, k);
        copy[k] = 0;
        char err_full[256] = "", err_copy[256] = "";
        size_t at_full = 1, at_copy = 2;
        tally_json_t *a = tally__json_parse(doc, k, err_full, sizeof err_full, &at_full);
        tally_json_t *b = tally__json_parse(copy, k, err_copy, sizeof err_copy, &at_copy);
        if (a || b || strcmp(err_full, err_copy) != 0 || at_full != at_copy)
            fail_msg("the first %zu bytes: <%s> at %zu in the longer text, <%s> at %zu alone", k, err_full, at_full,
                     err_copy, at_copy);
        free(copy);
    }
}

/* Nor does it read the byte after them where no byte is there: every
 * prefix of the document and of a few cut strings, numbers and literals,
 * placed to end at a page whose next page cannot be read (a read past the
 * length faults, whatever that byte would have held). */
static void test_json_reads_no_byte_past_its_length_at_a_page_end(void **state)
{
    (void)state;
    long page = sysconf(_SC_PAGESIZE);
    char *map = mmap(NULL, (size_t)page * 2, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(map != MAP_FAILED);
    assert_int_equal(mprotect(map + page, (size_t)page, PROT_NONE), 0);
    static const char *const docs[] = {
        "{\"a\":1,\"bc\":[2.5,-3e2,true,false,null],\"d\":{\"e\":\"f\\u00e9\"}}",
        "\"ab\\\"cd\\\\\"", "[12345678901234567890.5e-3]", "-0.0e+00", "[nul]", "[tru", "\"\\ud83d\\ude00\"",
    };
    for (size_t d = 0; d < sizeof docs / sizeof *docs; d++) {
        size_t n = strlen(docs[d]);
        for (size_t k = 0; k <= n; k++) {
            char *at = map + page - k;
            memcpy(at, docs[d], k);
            char err[256] = "";
            tally_json_t *v = tally__json_parse(at, k, err, sizeof err, NULL);
            if (!v && !err[0])
                fail_msg("<%.*s>: no value and no message", (int)k, docs[d]);
            tally__json_free(v);
        }
    }
    munmap(map, (size_t)page * 2);
}

static void test_json_errors(void **state)
{
    (void)state;
    JSON_ERR("", 0, "byte 0: unexpected end of input (expected a value)");
    JSON_ERR("  \n", 3, "byte 3: unexpected end of input (expected a value)");
    JSON_ERR("{", 1, "byte 1: unexpected end of input (expected a key in the object that starts at byte 0)");
    JSON_ERR("[1,", 3, "byte 3: unexpected end of input (expected a value)");
    JSON_ERR("[1,]", 3, "byte 3: unexpected ']' (expected a value)");
    JSON_ERR("[1 2]", 3, "byte 3: expected ',' or ']' in an array, found '2'");
    JSON_ERR("{\"a\" 1}", 5, "byte 5: expected ':' after the key \"a\", found '1'");
    JSON_ERR("{\"a\"", 4, "byte 4: unexpected end of input (expected ':' after the key \"a\")");
    JSON_ERR("{a:1}", 1, "byte 1: expected a string key in an object, found 'a'");
    JSON_ERR("{\"a\":1,}", 7, "byte 7: expected a string key in an object, found '}'");
    JSON_ERR("\"abc", 4, "byte 4: unexpected end of input inside the string that starts at byte 0");
    JSON_ERR("\"ab\\", 4, "byte 4: unexpected end of input inside the string that starts at byte 0");
    JSON_ERR("\"a\\xb\"", 2, "byte 2: invalid escape \\'x' in a string");
    JSON_ERR("\"\\u12\"", 1, "byte 1: invalid \\u escape (four hex digits expected)");
    JSON_ERR("\"\\u12g4\"", 1, "byte 1: invalid \\u escape (four hex digits expected)");
    /* The characters just outside each range of hex digits. */
    JSON_ERR("\"\\u00/0\"", 1, "byte 1: invalid \\u escape (four hex digits expected)");
    JSON_ERR("\"\\u00:0\"", 1, "byte 1: invalid \\u escape (four hex digits expected)");
    JSON_ERR("\"\\u00@0\"", 1, "byte 1: invalid \\u escape (four hex digits expected)");
    JSON_ERR("\"\\u00G0\"", 1, "byte 1: invalid \\u escape (four hex digits expected)");
    JSON_ERR("\"\\u00`0\"", 1, "byte 1: invalid \\u escape (four hex digits expected)");
    JSON_ERR("\"\\ud800\"", 1, "byte 1: unpaired high surrogate \\ud800");
    JSON_ERR("\"\\ud800\\u0041\"", 1, "byte 1: unpaired high surrogate \\ud800");
    JSON_ERR("\"\\udc00\"", 1, "byte 1: unpaired low surrogate \\udc00");
    JSON_ERR("\"\\udbff\"", 1, "byte 1: unpaired high surrogate \\udbff");
    JSON_ERR("\"\\udfff\"", 1, "byte 1: unpaired low surrogate \\udfff");
    JSON_ERR("\"\\udbff\\ue000\"", 1, "byte 1: unpaired high surrogate \\udbff");
    JSON_ERR("\"\\ud800\\udbff\"", 1, "byte 1: unpaired high surrogate \\ud800");
    JSON_ERR("\"a\tb\"", 2, "byte 2: control character 0x09 in a string (it must be escaped)");
    JSON_ERR("\"a\0b\"", 2, "byte 2: control character 0x00 in a string (it must be escaped)");
    JSON_ERR("01", 0, "byte 0: invalid number (leading zero)");
    JSON_ERR("-", 0, "byte 0: invalid number (a digit must follow '-')");
    JSON_ERR("-x", 0, "byte 0: invalid number (a digit must follow '-')");
    JSON_ERR("1.", 0, "byte 0: invalid number (a digit must follow '.')");
    JSON_ERR("1e+", 0, "byte 0: invalid number (a digit must follow the exponent)");
    JSON_ERR("1e999", 0, "byte 0: number out of range");
    JSON_ERR("+1", 0, "byte 0: unexpected '+' (expected a value)");
    JSON_ERR("tru", 3, "byte 3: unexpected end of input inside 'true'");
    JSON_ERR("nul!", 0, "byte 0: invalid literal (expected 'null')");
    JSON_ERR("NaN", 0, "byte 0: unexpected 'N' (expected a value)");
    JSON_ERR("[] x", 3, "byte 3: unexpected 'x' after the end of the JSON value");
    JSON_ERR("{} {}", 3, "byte 3: unexpected '{' after the end of the JSON value");
    JSON_ERR("\x01", 0, "byte 0: unexpected 0x01 (expected a value)");
    JSON_ERR("// c\n1", 0, "byte 0: unexpected '/' (expected a value)");

    /* The length is honoured: bytes after it are never looked at. */
    expect_json_error("[1, 2] trailing", 4, 4, "byte 4: unexpected end of input (expected a value)");
    char err[64];
    tally_json_t *v = tally__json_parse("123xyz", 3, err, sizeof err, NULL);
    assert_non_null(v);
    assert_int_equal(v->i, 123);
    tally__json_free(v);
    /* NULL text, tiny and absent error buffers. */
    assert_null(tally__json_parse(NULL, 10, err, sizeof err, NULL));
    assert_string_equal(err, "byte 0: unexpected end of input (expected a value)");
    assert_null(tally__json_parse("[", 1, err, 5, NULL));
    assert_string_equal(err, "byte");
    assert_null(tally__json_parse("[", 1, NULL, 0, NULL));
}

/* A bad separator after an object's member is named as the byte found there,
 * not the byte before it ("1" of the value, or the space before "x"). */
static void test_json_object_separator_error_names_the_byte_found(void **state)
{
    (void)state;
    JSON_ERR("{\"a\":1x}", 6, "byte 6: expected ',' or '}' in an object, found 'x'");
    JSON_ERR("{\"a\":12 :}", 8, "byte 8: expected ',' or '}' in an object, found ':'");
    JSON_ERR("{\"a\":\"s\"]", 8, "byte 8: expected ',' or '}' in an object, found ']'");
}

/* An unexpected byte is quoted when printable ASCII, from ' ' to '~', and
 * written in hex otherwise (below ' ', DEL and above). */
static void test_json_error_quotes_printable_bytes_and_hex_for_others(void **state)
{
    (void)state;
    JSON_ERR(" ~", 1, "byte 1: unexpected '~' (expected a value)");
    JSON_ERR("[1 ~]", 3, "byte 3: expected ',' or ']' in an array, found '~'");
    JSON_ERR("\x7f", 0, "byte 0: unexpected 0x7f (expected a value)");
    JSON_ERR("\x1f", 0, "byte 0: unexpected 0x1f (expected a value)");
    JSON_ERR("\x80", 0, "byte 0: unexpected 0x80 (expected a value)");
    JSON_ERR("{\"a\" !}", 5, "byte 5: expected ':' after the key \"a\", found '!'");
    JSON_ERR("\"\\ \"", 1, "byte 1: invalid escape \\' ' in a string"); /* ' ', the first printable byte */
}

/* tally__json_int of a member that is not there (tally__json_get's NULL) is
 * "not a number", so callers may pass a lookup straight in. */
static void test_json_int_of_a_missing_member_is_not_a_number(void **state)
{
    (void)state;
    tally_json_t *v = parse_ok("{\"a\":5}");
    int64_t x = 77;
    assert_int_equal(tally__json_int(tally__json_get(v, "b"), &x), -1);
    assert_int_equal(x, 77);
    assert_int_equal(tally__json_int(NULL, &x), -1);
    assert_int_equal(tally__json_int(tally__json_get(v, "a"), &x), 0);
    assert_int_equal(x, 5);
    tally__json_free(v);
}

/* A double converts to an integer when it is integral and in [-2^63, 2^63):
 * both ends written as doubles (an exponent makes the reader keep a double). */
static void test_json_int_of_doubles_at_the_int64_bounds(void **state)
{
    (void)state;
    tally_json_t *v = parse_ok("[-9.223372036854775808e18, 9.223372036854775808e18, -9.2233720368547758e18, 4.0e0]");
    int64_t x = 77;
    assert_false(tally__json_at(v, 0)->is_int);
    assert_int_equal(tally__json_int(tally__json_at(v, 0), &x), 0); /* -2^63 exactly */
    assert_true(x == INT64_MIN);
    x = 77;
    assert_int_equal(tally__json_int(tally__json_at(v, 1), &x), -1); /* 2^63 */
    assert_int_equal(x, 77);
    assert_int_equal(tally__json_int(tally__json_at(v, 2), &x), 0); /* rounds to -2^63 as a double */
    assert_true(x == INT64_MIN);
    assert_int_equal(tally__json_int(tally__json_at(v, 3), &x), 0);
    assert_int_equal(x, 4);
    tally__json_free(v);
}

/* Doubles are read in the C locale whatever the program set: under a locale
 * whose decimal separator is a comma (de_DE, made with localedef into a
 * scratch LOCPATH when the system has none), "2.5" is still 2.5, where the
 * C library's strtod would stop at the point and read 2. */
static void test_json_doubles_read_in_the_c_locale(void **state)
{
    (void)state;
    char dir[] = "/tmp/tally-locale-XXXXXX";
    bool made = false;
    if (!setlocale(LC_NUMERIC, "de_DE.UTF-8")) {
        if (!mkdtemp(dir))
            SKIP("no scratch folder for a locale");
        made = true;
        char cmd[256];
        snprintf(cmd, sizeof cmd, "localedef -i de_DE -f UTF-8 %s/de_DE.UTF-8 >/dev/null 2>&1", dir);
        int rc = system(cmd);
        setenv("LOCPATH", dir, 1);
        if (rc != 0 || !setlocale(LC_NUMERIC, "de_DE.UTF-8")) {
            unsetenv("LOCPATH");
            snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
            if (system(cmd) != 0)
                fprintf(stderr, "could not remove %s\n", dir);
            SKIP("no de_DE locale and localedef could not make one (Debian's locales package has it)");
        }
    }
    char shown[16];
    snprintf(shown, sizeof shown, "%.1f", 2.5);
    assert_string_equal(shown, "2,5"); /* the locale is in force */
    tally_json_t *v = parse_ok("{\"util\": 2.5, \"e\": 1.25e1, \"neg\": -0.75}");
    setlocale(LC_NUMERIC, "C");
    if (made) {
        unsetenv("LOCPATH");
        char cmd[256];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", dir);
    }
    assert_true(tally__json_get(v, "util")->d == 2.5);
    assert_true(tally__json_get(v, "e")->d == 12.5);
    assert_true(tally__json_get(v, "neg")->d == -0.75);
    tally__json_free(v);
}

static void test_json_depth_limit(void **state)
{
    (void)state;
    enum { DEEP = TALLY_JSON_MAX_DEPTH };
    char text[2 * DEEP + 8];
    char err[128];
    /* Exactly the limit parses. */
    memset(text, '[', DEEP);
    memset(text + DEEP, ']', DEEP);
    tally_json_t *v = tally__json_parse(text, 2 * DEEP, err, sizeof err, NULL);
    assert_non_null(v);
    tally__json_free(v);
    /* One more level is refused, at the byte that opens it. */
    memset(text, '[', DEEP + 1);
    memset(text + DEEP + 1, ']', DEEP + 1);
    size_t at = 0;
    v = tally__json_parse(text, 2 * DEEP + 2, err, sizeof err, &at);
    assert_null(v);
    assert_int_equal(at, DEEP);
    assert_non_null(strstr(err, "nesting deeper than 256 levels"));
    /* A huge unclosed nesting is no threat to the stack either. */
    size_t n = 1000000;
    char *big = malloc(n);
    assert_non_null(big);
    memset(big, '{', n);
    assert_null(tally__json_parse(big, n, err, sizeof err, NULL));
    memset(big, '[', n);
    assert_null(tally__json_parse(big, n, err, sizeof err, NULL));
    free(big);
}

/* Every proper prefix of a document, and every single-byte change to it,
 * either parses or fails with a message and an offset within the input. */
static void test_json_mangled_input(void **state)
{
    (void)state;
    static const char doc[] =
        "{\"segments\": [{\"address\": 140234, \"size\": -2.5e-3, \"blocks\": [true, false, null]},"
        " {\"s\": \"\\u00e9\\ud83d\\ude00\\n\"}], \"n\": 12}";
    size_t len = sizeof doc - 1;
    char err[256], *copy = malloc(len);
    size_t at;
    assert_non_null(copy);
    for (size_t cut = 0; cut < len; cut++) {
        memcpy(copy, doc, cut);
        err[0] = 0;
        at = SIZE_MAX;
        assert_null(tally__json_parse(copy, cut, err, sizeof err, &at));
        assert_true(at <= cut);
        assert_true(strncmp(err, "byte ", 5) == 0);
    }
    static const char subst[] = "\"\\{}[],:0-eE.+tu\x01\x80 a";
    for (size_t i = 0; i < len; i++) {
        for (size_t k = 0; k < sizeof subst - 1; k++) {
            memcpy(copy, doc, len);
            copy[i] = subst[k];
            at = SIZE_MAX;
            tally_json_t *v = tally__json_parse(copy, len, err, sizeof err, &at);
            if (v)
                tally__json_free(v);
            else
                assert_true(at <= len && strncmp(err, "byte ", 5) == 0);
        }
    }
    free(copy);
}

/* Out of memory at each of the reader's allocations in turn: the parse
 * fails with "byte N: out of memory", N the byte it was reading (the start
 * of the value, string or element it needed the memory for, inside the
 * text) and the same N in *err_offset; once memory is back the same text
 * parses whole. */
static void test_json_out_of_memory_names_the_byte_being_read(void **state)
{
    (void)state;
    const char *text = "{\"tag\": \"x\", \"list\": [1, 2, 3, 4, 5, 6, 7, 8, 9, 1.00000000000000000000000000000000"
                       "0000000000000000000000000000000000000000000000000005]}";
    size_t len = strlen(text);
    int failures = 0, past_start = 0;
    for (uint64_t nth = 1; nth < 100; nth++) {
        char err[256], want[64];
        size_t at = (size_t)-1;
        tally__meta_fail(nth, 0);
        tally_json_t *v = tally__json_parse(text, len, err, sizeof err, &at);
        uint64_t hits = tally__meta_fail_hits();
        tally__meta_fail(0, 0);
        if (!hits) {
            assert_non_null(v);
            break;
        }
        assert_null(v);
        failures++;
        assert_true(at < len);
        assert_non_null(strchr("{[\" 0123456789", text[at])); /* a value, or the blank before one */
        snprintf(want, sizeof want, "byte %zu: out of memory", at);
        assert_string_equal(err, want);
        past_start += at > 0;
    }
    assert_true(failures >= 5); /* the root, members, strings, items grown past 4, a long number */
    assert_true(past_start >= 4);
    tally_json_t *v = parse_ok(text);
    assert_int_equal(tally__json_get(v, "list")->len, 10);
    tally__json_free(v);
}

/* A literal that ends the document is whole, not cut short: each of the
 * three, alone, parses to its type (a literal is only cut when fewer bytes
 * are left than it has). */
static void test_json_literal_at_the_end_of_input(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        tally_json_type_t type;
    } lit[] = {{"true", TALLY_JSON_TRUE}, {"false", TALLY_JSON_FALSE}, {"null", TALLY_JSON_NULL}};
    for (size_t k = 0; k < sizeof lit / sizeof lit[0]; k++) {
        char err[256] = "";
        tally_json_t *v = tally__json_parse(lit[k].text, strlen(lit[k].text), err, sizeof err, NULL);
        if (!v)
            fail_msg("'%s': %s", lit[k].text, err);
        assert_int_equal(v->type, lit[k].type);
        tally__json_free(v);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_out_of_memory_names_the_byte_being_read),
        cmocka_unit_test(test_json_values),
        cmocka_unit_test(test_json_literal_at_the_end_of_input),
        cmocka_unit_test(test_json_strings),
        cmocka_unit_test(test_json_number_grammar),
        cmocka_unit_test(test_json_numbers_end_at_the_given_length),
        cmocka_unit_test(test_json_errors),
        cmocka_unit_test(test_json_reads_nothing_past_its_length),
        cmocka_unit_test(test_json_reads_no_byte_past_its_length_at_a_page_end),
        cmocka_unit_test(test_json_object_separator_error_names_the_byte_found),
        cmocka_unit_test(test_json_int_of_a_missing_member_is_not_a_number),
        cmocka_unit_test(test_json_error_quotes_printable_bytes_and_hex_for_others),
        cmocka_unit_test(test_json_depth_limit),
        cmocka_unit_test(test_json_int_of_doubles_at_the_int64_bounds),
        cmocka_unit_test(test_json_doubles_read_in_the_c_locale),
        cmocka_unit_test(test_json_mangled_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
