/* A small JSON reader: parses one complete text into a tree of values.
 *
 * Strict RFC 8259 grammar (no comments, no trailing commas, no NaN), with two
 * allowances: a UTF-8 byte-order mark before the value is skipped, and bytes
 * of 0x80 and above inside strings are taken as they are. Nesting is limited
 * to TALLY_JSON_MAX_DEPTH levels so that hostile input cannot exhaust the
 * stack. Every failure is reported as "byte N: what was wrong", never a crash.
 * Memory comes from tally__meta_alloc. */
#ifndef TALLY_JSON_H
#define TALLY_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TALLY_JSON_MAX_DEPTH 256

typedef enum tally_json_type {
    TALLY_JSON_NULL,
    TALLY_JSON_FALSE,
    TALLY_JSON_TRUE,
    TALLY_JSON_NUMBER,
    TALLY_JSON_STRING,
    TALLY_JSON_ARRAY,
    TALLY_JSON_OBJECT
} tally_json_type_t;

typedef struct tally_json tally_json_t;
typedef struct tally_json_member tally_json_member_t;

struct tally_json {
    tally_json_type_t type;
    /* NUMBER: is_int when written without fraction or exponent and within
     * int64 range; then i is exact. d is always the nearest double. */
    bool is_int;
    int64_t i;
    double d;
    /* STRING: decoded UTF-8, NUL-terminated; len bytes (a \u0000 escape can
     * put a NUL inside). ARRAY / OBJECT: len is the number of entries. */
    char *s;
    size_t len;
    tally_json_t *items;          /* ARRAY: len values */
    tally_json_member_t *members; /* OBJECT: len members, in document order */
    size_t offset;                /* where the value starts in the text */
};

struct tally_json_member {
    char *key; /* decoded, NUL-terminated */
    size_t key_len;
    tally_json_t value;
};

/* Parse text[0..len). Returns the root value (free it with tally__json_free),
 * or NULL with a message "byte N: ..." in err (when err is not NULL) and the
 * byte offset in *err_offset (when not NULL). */
tally_json_t *tally__json_parse(const char *text, size_t len, char *err, size_t errlen,
                                size_t *err_offset);

/* Free a tree returned by tally__json_parse (NULL is ignored). */
void tally__json_free(tally_json_t *root);

/* The value of member key in object obj (the last one when a key repeats, as
 * Python's json module does), or NULL when obj is not an object or lacks it. */
const tally_json_t *tally__json_get(const tally_json_t *obj, const char *key);
const tally_json_t *tally__json_getn(const tally_json_t *obj, const char *key, size_t key_len);

/* Element index of array arr, or NULL when arr is not an array or too short. */
const tally_json_t *tally__json_at(const tally_json_t *arr, size_t index);

/* The value as an int64: 0 when it is a number with an integral value that
 * int64 holds exactly (1, -7, 3.0, 2e3), otherwise -1 and *out is untouched. */
int tally__json_int(const tally_json_t *v, int64_t *out);

/* "null", "false", "true", "number", "string", "array", "object". */
const char *tally__json_type_name(tally_json_type_t type);

#endif /* TALLY_JSON_H */
