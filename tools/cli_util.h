/* The tally command's plumbing (tools/cli_util.c): error messages and exit
 * codes, reading a file into a JSON tree, schema-checked field access that
 * names the byte offset of whatever is wrong, byte formatting, and a JSON
 * string writer.
 *
 * Exit codes: 0 success, 1 the input could not be used (missing file,
 * malformed JSON, wrong schema, absent device, no timeline, unwritable
 * output), 2 the command line itself is wrong. */
#ifndef TALLY_CLI_UTIL_H
#define TALLY_CLI_UTIL_H

#include "report/json.h"
#include "report/report.h"
#include "ledger/stage.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { EXIT_DATA = 1, EXIT_USAGE = 2 };

extern const char *cli_cmd; /* "tally summary" etc., for messages */

/* "tally CMD: message\n" on stderr; returns code so callers can `return`. */
__attribute__((format(printf, 2, 3))) int cli_fail(int code, const char *fmt, ...);
/* A usage error: the message, then where help is. */
__attribute__((format(printf, 1, 2))) int cli_usage(const char *fmt, ...);

/* calloc that exits with a message when memory runs out. */
void *cli_alloc(size_t n);
/* Grow *arr (of *cap elements of size elem) to hold at least need. */
void cli_grow(void **arr, size_t *cap, size_t need, size_t elem);
/* "1.5 MiB" as the library's text reports write it; negatives keep a sign. */
const char *cli_bytes(int64_t v, char *buf, size_t len);
/* a + b, held at INT64_MAX (or INT64_MIN) where the sum would pass it: the
 * totals over ranks add counts read from files, which may be anything. */
int64_t cli_add(int64_t a, int64_t b);
/* The larger of w and the length of s: column widths. */
int cli_width_of(int w, const char *s);

/* ---- options ---------------------------------------------------------------- */

/* Value of an option that takes one: "--name=V", or the next argument. */
const char *cli_opt_value(int argc, char **argv, int *i, const char *arg, const char *name);
bool cli_is_opt(const char *arg, const char *name);
int cli_parse_device(const char *v, int *device);

/* ---- documents ----------------------------------------------------------- */

/* One JSON file, read and parsed. Strings in the tree stay valid while the
 * document lives, so the report model points into it. */
typedef struct cli_doc {
    const char *path;
    char *text;
    size_t len;
    tally_json_t *root;
    char err[400]; /* the first schema problem found, "" if none */
} cli_doc_t;

/* Read and parse path into doc ("-": standard input). Returns 0, or
 * EXIT_DATA after printing why. */
int cli_doc_load(cli_doc_t *doc, const char *path);
void cli_doc_free(cli_doc_t *doc);

/* Record the first schema problem of doc: "byte N: where: what". */
__attribute__((format(printf, 4, 5))) void cli_schema(cli_doc_t *doc, const tally_json_t *at, const char *where,
                                                      const char *fmt, ...);
/* Member key of obj, which must be present (else a schema error, NULL). */
const tally_json_t *cli_need(cli_doc_t *doc, const tally_json_t *obj, const char *where, const char *key);
/* Integer member; 0 with a schema error when missing or not an integer.
 * Missing is allowed (returns fallback) when optional. */
int64_t cli_int_opt(cli_doc_t *doc, const tally_json_t *obj, const char *where, const char *key, bool optional,
                    int64_t fallback);
#define cli_int(doc, obj, where, key) cli_int_opt(doc, obj, where, key, false, 0)
double cli_num(cli_doc_t *doc, const tally_json_t *obj, const char *where, const char *key);
const char *cli_str(cli_doc_t *doc, const tally_json_t *obj, const char *where, const char *key, bool optional);
bool cli_bool(cli_doc_t *doc, const tally_json_t *obj, const char *where, const char *key);
/* Array member (an empty one when optional and absent); NULL on error. */
const tally_json_t *cli_array(cli_doc_t *doc, const tally_json_t *obj, const char *where, const char *key,
                              bool optional);
/* Element i of arr, which must be an object; NULL (and an error) if not. */
const tally_json_t *cli_obj_at(cli_doc_t *doc, const tally_json_t *arr, const char *name, size_t i, char *where,
                               size_t wlen);

/* ---- output ----------------------------------------------------------------- */

/* s as a JSON string, quoted. */
void cli_json_str(FILE *f, const char *s);
/* Text for XML / HTML character data and attribute values. */
void cli_xml_str(FILE *f, const char *s);
/* Close stdout (or f) and report a failed write. */
int cli_finish(FILE *f, const char *what);

#endif /* TALLY_CLI_UTIL_H */
