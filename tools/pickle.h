/* A safe reader for the subset of Python's pickle format that plain data
 * uses (dicts, lists, tuples, strings, bytes, integers, floats, booleans,
 * None): what torch.cuda.memory._dump_snapshot writes. Every opcode that
 * would name a class or call a function (GLOBAL, REDUCE, BUILD, ...) is
 * refused, so reading a pickle never runs anything. Used by tally tune. */
#ifndef TALLY_TOOLS_PICKLE_H
#define TALLY_TOOLS_PICKLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum pk_type { PK_NONE, PK_BOOL, PK_INT, PK_FLOAT, PK_STR, PK_BYTES, PK_LIST, PK_TUPLE, PK_DICT } pk_type_t;

typedef struct pk_value pk_value_t;
struct pk_value {
    pk_type_t type;
    int64_t i;          /* PK_BOOL, PK_INT */
    double f;           /* PK_FLOAT */
    const char *s;      /* PK_STR (UTF-8), PK_BYTES: into the document's data, not NUL-terminated */
    size_t len;         /* of s */
    pk_value_t **items; /* PK_LIST, PK_TUPLE: n items; PK_DICT: n pairs as key, value, key, value... */
    size_t n, cap;
};

typedef struct pk_doc {
    unsigned char *data; /* the file's bytes (strings point into them) */
    size_t len;
    pk_value_t *root;
    pk_value_t **all; /* every value made, for pk_free */
    size_t nall, capall;
} pk_doc_t;

/* Read path and parse it. On error returns -1 with one line in err naming
 * the file, the byte offset and what is wrong. */
int pk_load(const char *path, pk_doc_t *doc, char *err, size_t errlen);
/* Parse data[0..len) (taken over by doc: freed by pk_free). */
int pk_parse(unsigned char *data, size_t len, pk_doc_t *doc, const char *name, char *err, size_t errlen);
void pk_free(pk_doc_t *doc);

/* The value of dict under the string key, or NULL (also when dict is not one). */
const pk_value_t *pk_get(const pk_value_t *dict, const char *key);
/* Whether v is a string equal to s. */
bool pk_str_is(const pk_value_t *v, const char *s);
/* Python's name for v's type, for messages ("dict", "list", "int", ...). */
const char *pk_type_name(const pk_value_t *v);

#endif
