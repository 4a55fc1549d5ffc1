/* Tests for tally tune's pickle reader (tools/pickle.c, compiled in), on
 * pickles written by hand with protocol-2 opcodes in constants: plain data
 * (a dict of a list, a tuple and a float, the memo fetching a list again),
 * DICT from marked items, the stack opcodes as pickle's own machine runs
 * them, and the one-line error each bad input gets (an opcode that would
 * construct an object, a file cut short, a memo slot never stored, values
 * left on the stack). Nothing here runs the command; the reader's refusals
 * named opcode by opcode are in test_tune_bad_input.c. */
#include "../tools/pickle.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

/* Parse a pickle held in a constant (pk_parse takes over a copy; pk_free frees it). */
static void parse_inline(const unsigned char *src, size_t len, pk_doc_t *doc)
{
    unsigned char *data = malloc(len);
    memcpy(data, src, len);
    char err[256];
    if (pk_parse(data, len, doc, "inline", err, sizeof err))
        fail_msg("%s", err);
}

static void test_pickle_plain_data(void **state)
{
    (void)state;
    /* {'a': [1, -2, 300, 2**40], 'b': ('x', None, True), 'c': 0.5}, written by
     * hand with protocol-2 opcodes; the list is memoised and fetched again. */
    static const unsigned char src[] = {
        0x80, 0x02, '}', '(', 0x8c, 1, 'a', ']', 'q', 0, '(', 'K', 1, 'J', 0xfe, 0xff, 0xff, 0xff, 'M', 0x2c, 0x01,
        0x8a, 6, 0, 0, 0, 0, 0, 1, 'e', 0x8c, 1, 'b', 0x8c, 1, 'x', 'N', 0x88, 0x87, 0x8c, 1, 'c', 'G', 0x3f, 0xe0,
        0, 0, 0, 0, 0, 0, 0x8c, 1, 'd', 'h', 0, 'u', '.'};
    pk_doc_t doc;
    parse_inline(src, sizeof src, &doc);
    const pk_value_t *a = pk_get(doc.root, "a");
    assert_non_null(a);
    assert_int_equal(a->type, PK_LIST);
    assert_int_equal(a->n, 4);
    assert_int_equal(a->items[0]->i, 1);
    assert_int_equal(a->items[1]->i, -2);
    assert_int_equal(a->items[2]->i, 300);
    assert_int_equal(a->items[3]->i, (int64_t)1 << 40);
    const pk_value_t *b = pk_get(doc.root, "b");
    assert_int_equal(b->type, PK_TUPLE);
    assert_int_equal(b->n, 3);
    assert_true(pk_str_is(b->items[0], "x"));
    assert_int_equal(b->items[1]->type, PK_NONE);
    assert_int_equal(b->items[2]->type, PK_BOOL);
    assert_true(pk_get(doc.root, "c")->f == 0.5);
    assert_ptr_equal(pk_get(doc.root, "d"), a); /* the memo gives the same list */
    assert_null(pk_get(doc.root, "e"));
    pk_free(&doc);
}

static void expect_pickle_error(const unsigned char *src, size_t len, const char *want)
{
    unsigned char *data = malloc(len ? len : 1);
    memcpy(data, src, len);
    pk_doc_t doc;
    char err[512];
    if (pk_parse(data, len, &doc, "bad.pickle", err, sizeof err) == 0)
        fail_msg("parsed; expected an error with '%s'", want);
    if (!strstr(err, want) || !strstr(err, "bad.pickle") || strchr(err, '\n'))
        fail_msg("error '%s' lacks '%s'", err, want);
}

/* DICT ('d'): a dict from the items above the mark, in key, value pairs
 * (older protocols and hand-written pickles use it); an odd number of items
 * is refused. */
static void test_pickle_dict_from_marked_items(void **state)
{
    (void)state;
    static const unsigned char src[] = {0x80, 0x02, '(', 0x8c, 1, 'a', 'K', 1, 0x8c, 1, 'b', 'K', 2, 'd', '.'};
    pk_doc_t doc;
    parse_inline(src, sizeof src, &doc);
    assert_int_equal(doc.root->type, PK_DICT);
    assert_int_equal(pk_get(doc.root, "a")->i, 1);
    assert_int_equal(pk_get(doc.root, "b")->i, 2);
    pk_free(&doc);
    static const unsigned char empty[] = {0x80, 0x02, '(', 'd', '.'}; /* {} */
    parse_inline(empty, sizeof empty, &doc);
    assert_int_equal(doc.root->type, PK_DICT);
    pk_free(&doc);
    static const unsigned char odd[] = {0x80, 0x02, '(', 0x8c, 1, 'a', 'd', '.'};
    expect_pickle_error(odd, sizeof odd, "odd number of items");
}

/* The stack opcodes, as pickle's own machine runs them (Lib/pickle.py):
 * POP, POP_MARK, DUP, TUPLE1..3, APPEND(S) and SETITEM(S) onto an existing
 * container, LONG1's sign, and the error each misuse gives. */
static void test_pickle_stack_opcodes(void **state)
{
    (void)state;
    pk_doc_t doc;
    static const unsigned char pop[] = {0x80, 0x02, 'K', 1, 'K', 2, '0', '.'}; /* 1 */
    parse_inline(pop, sizeof pop, &doc);
    assert_int_equal(doc.root->type, PK_INT);
    assert_int_equal(doc.root->i, 1);
    pk_free(&doc);
    static const unsigned char pop_mark[] = {0x80, 0x02, 'K', 5, '(', 'K', 1, 'K', 2, '1', '.'}; /* 5 */
    parse_inline(pop_mark, sizeof pop_mark, &doc);
    assert_int_equal(doc.root->i, 5);
    pk_free(&doc);
    static const unsigned char dup[] = {0x80, 0x02, 'K', 7, '2', 0x86, '.'}; /* (7, 7) */
    parse_inline(dup, sizeof dup, &doc);
    assert_int_equal(doc.root->type, PK_TUPLE);
    assert_int_equal(doc.root->n, 2);
    assert_int_equal(doc.root->items[0]->i, 7);
    assert_int_equal(doc.root->items[1]->i, 7);
    pk_free(&doc);
    static const unsigned char t3[] = {0x80, 0x02, 'K', 9, 0x85, 'K', 1, 'K', 2, 'K', 3, 0x87, 0x86, '.'};
    parse_inline(t3, sizeof t3, &doc); /* ((9,), (1, 2, 3)) */
    assert_int_equal(doc.root->n, 2);
    assert_int_equal(doc.root->items[0]->n, 1);
    assert_int_equal(doc.root->items[0]->items[0]->i, 9);
    assert_int_equal(doc.root->items[1]->n, 3);
    for (int k = 0; k < 3; k++)
        assert_int_equal(doc.root->items[1]->items[k]->i, k + 1);
    pk_free(&doc);
    static const unsigned char list[] = {0x80, 0x02, ']', 'K', 1, 'a', '(', 'K', 2, 'K', 3, 'e', '.'};
    parse_inline(list, sizeof list, &doc); /* [1, 2, 3] */
    assert_int_equal(doc.root->type, PK_LIST);
    assert_int_equal(doc.root->n, 3);
    for (int k = 0; k < 3; k++)
        assert_int_equal(doc.root->items[k]->i, k + 1);
    pk_free(&doc);
    static const unsigned char dict[] = {0x80, 0x02, '}', 0x8c, 1, 'a', 'K', 1, 's', '(', 0x8c, 1, 'b', 'K', 2,
                                         0x8c, 1, 'c', 'K', 3, 'u', '.'};
    parse_inline(dict, sizeof dict, &doc); /* {'a': 1, 'b': 2, 'c': 3} */
    assert_int_equal(doc.root->type, PK_DICT);
    assert_int_equal(doc.root->n, 3);
    assert_int_equal(pk_get(doc.root, "a")->i, 1);
    assert_int_equal(pk_get(doc.root, "b")->i, 2);
    assert_int_equal(pk_get(doc.root, "c")->i, 3);
    pk_free(&doc);
    static const unsigned char longs[] = {0x80, 0x02, 0x8a, 1, 0xff, 0x8a, 2, 0x00, 0x80, 0x8a, 2, 0xff, 0x7f, 0x87, '.'};
    parse_inline(longs, sizeof longs, &doc); /* (-1, -32768, 32767) */
    assert_int_equal(doc.root->items[0]->i, -1);
    assert_int_equal(doc.root->items[1]->i, -32768);
    assert_int_equal(doc.root->items[2]->i, 32767);
    pk_free(&doc);
    static const unsigned char e1[] = {0x80, 0x02, '0', '.'};
    expect_pickle_error(e1, sizeof e1, "POP on an empty stack");
    static const unsigned char e2[] = {0x80, 0x02, '2', '.'};
    expect_pickle_error(e2, sizeof e2, "DUP on an empty stack");
    static const unsigned char e3[] = {0x80, 0x02, ']', 'a', '.'};
    expect_pickle_error(e3, sizeof e3, "APPEND with 1 items on the stack");
    static const unsigned char e4[] = {0x80, 0x02, '}', 'K', 1, 's', '.'};
    expect_pickle_error(e4, sizeof e4, "SETITEM with 2 items on the stack");
    static const unsigned char e5[] = {0x80, 0x02, 'K', 1, 0x86, '.'};
    expect_pickle_error(e5, sizeof e5, "TUPLE2 with 1 items on the stack");
    static const unsigned char e6[] = {0x80, 0x02, '}', '(', 'K', 1, 'e', '.'};
    expect_pickle_error(e6, sizeof e6, "APPENDS on a dict");
    static const unsigned char e7[] = {0x80, 0x02, '(', 'K', 1, 'u', '.'};
    expect_pickle_error(e7, sizeof e7, "SETITEMS with nothing to add to");
    static const unsigned char e8[] = {0x80, 0x02, 'K', 1, 't', '.'};
    expect_pickle_error(e8, sizeof e8, "without a MARK");
    static const unsigned char e9[] = {0x80, 0x02, 0x94, '.'};
    expect_pickle_error(e9, sizeof e9, "memo store with an empty stack");
    static const unsigned char e10[] = {0x80, 0x02, 0x8a, 5, 1, '.'};
    expect_pickle_error(e10, sizeof e10, "truncated LONG1");
    static const unsigned char e11[] = {0x80};
    expect_pickle_error(e11, sizeof e11, "truncated PROTO");
    static const unsigned char e12[] = {0x80, 0x02, 'G', 0, 0};
    expect_pickle_error(e12, sizeof e12, "truncated BINFLOAT");
    static const unsigned char e13[] = {0x80, 0x02, 'X', 1};
    expect_pickle_error(e13, sizeof e13, "truncated string length");
    static const unsigned char e14[] = {0x80, 0x02, ']', '(', 'K', 1, 'u', '.'};
    expect_pickle_error(e14, sizeof e14, "SETITEMS on a list");
}

static void test_pickle_refuses_bad_input(void **state)
{
    (void)state;
    static const unsigned char global[] = {0x80, 0x02, 'c', 'p', 'o', 's', 'i', 'x', '\n', 's', 'y', 's', '\n', '.'};
    expect_pickle_error(global, sizeof global, "GLOBAL would construct an object");
    static const unsigned char reduce[] = {0x80, 0x02, ')', ')', 'R', '.'};
    expect_pickle_error(reduce, sizeof reduce, "REDUCE");
    static const unsigned char truncated[] = {0x80, 0x04, ']', '(', 'K', 1, 'K'};
    expect_pickle_error(truncated, sizeof truncated, "truncated");
    static const unsigned char no_stop[] = {0x80, 0x04, ']'};
    expect_pickle_error(no_stop, sizeof no_stop, "before the STOP opcode");
    /* An argument that ends the file is read whole: what is missing is the STOP. */
    static const unsigned char arg_at_end[] = {0x80, 0x04, 'J', 1, 2, 3, 4};
    expect_pickle_error(arg_at_end, sizeof arg_at_end, "before the STOP opcode");
    static const unsigned char long_str[] = {0x80, 0x04, 'X', 0xff, 0xff, 0, 0, 'a', '.'};
    expect_pickle_error(long_str, sizeof long_str, "runs past the end");
    static const unsigned char bad_memo[] = {0x80, 0x04, 'h', 7, '.'};
    expect_pickle_error(bad_memo, sizeof bad_memo, "memo index 7 was never stored");
    static const unsigned char huge_memo[] = {0x80, 0x04, 'N', 'r', 0xff, 0xff, 0xff, 0x0f, '.'};
    expect_pickle_error(huge_memo, sizeof huge_memo, "memo index 268435455 out of range for a file of 9 bytes");
    static const unsigned char two_left[] = {0x80, 0x04, 'N', 'N', '.'};
    expect_pickle_error(two_left, sizeof two_left, "2 values on the stack");
    static const unsigned char text[] = {'o', 'p', ','};
    expect_pickle_error(text, sizeof text, "no PROTO opcode");
    expect_pickle_error(text, 0, "empty file");
    static const unsigned char huge_int[] = {0x80, 0x04, 0x8a, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, '.'};
    expect_pickle_error(huge_int, sizeof huge_int, "does not fit in 64 bits");
    static const unsigned char unknown[] = {0x80, 0x04, 'N', 0xff, '.'};
    expect_pickle_error(unknown, sizeof unknown, "opcode 0xff is not one plain-data pickles of protocol 2 to 5 use");
}

/* A memo slot below the highest stored one that was itself never stored
 * (BINPUT 2, then BINGET 1) is refused as never stored, like one past the end. */
static void test_pickle_memo_slot_in_a_gap_was_never_stored(void **state)
{
    (void)state;
    static const unsigned char memo_gap[] = {0x80, 0x04, 'N', 'q', 2, '0', 'h', 1, '.'};
    expect_pickle_error(memo_gap, sizeof memo_gap, "memo index 1 was never stored");
    static const unsigned char stored[] = {0x80, 0x04, 'N', 'q', 2, '0', 'h', 2, '.'};
    pk_doc_t doc;
    parse_inline(stored, sizeof stored, &doc);
    assert_int_equal(doc.root->type, PK_NONE);
    pk_free(&doc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pickle_plain_data),
        cmocka_unit_test(test_pickle_refuses_bad_input),
        cmocka_unit_test(test_pickle_memo_slot_in_a_gap_was_never_stored),
        cmocka_unit_test(test_pickle_dict_from_marked_items),
        cmocka_unit_test(test_pickle_stack_opcodes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
