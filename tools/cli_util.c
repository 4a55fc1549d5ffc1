/* The tally command's plumbing: error messages and exit codes, reading a
 * file into a JSON tree, schema-checked field access that names the byte
 * offset of whatever is wrong, byte formatting, and the JSON and XML string
 * writers. cli_util.h declares them and says what the exit codes mean. */
#include "cli_util.h"

const char *cli_cmd = "tally"; /* "tally summary" etc., for messages */

/* "tally CMD: message\n" on stderr; returns code so callers can `return`. */
__attribute__((format(printf, 2, 3))) int cli_fail(int code, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s: ", cli_cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return code;
}

/* A usage error: the message, then where help is. */
__attribute__((format(printf, 1, 2))) int cli_usage(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s: ", cli_cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry '%s --help'.\n", cli_cmd);
    return EXIT_USAGE;
}

void *cli_alloc(size_t n)
{
    void *p = calloc(1, n ? n : 1);
    if (!p) {
        cli_fail(EXIT_DATA, "out of memory");
        exit(EXIT_DATA);
    }
    return p;
}

/* Grow *arr (of *cap elements of size elem) to hold at least need. */
void cli_grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return;
    size_t c = *cap ? *cap * 2 : 16;
    while (c < need)
        c *= 2;
    void *p = realloc(*arr, c * elem);
    if (!p) {
        cli_fail(EXIT_DATA, "out of memory");
        exit(EXIT_DATA);
    }
    memset((char *)p + *cap * elem, 0, (c - *cap) * elem);
    *arr = p;
    *cap = c;
}

/* "1.5 MiB" as the library's text reports write it; negatives keep a sign. */
const char *cli_bytes(int64_t v, char *buf, size_t len)
{
    if (v < 0) {
        buf[0] = '-';
        tally__fmt_bytes((uint64_t)0 - (uint64_t)v, buf + 1, len - 1);
    } else {
        tally__fmt_bytes((uint64_t)v, buf, len);
    }
    return buf;
}

int64_t cli_add(int64_t a, int64_t b)
{
    if (b > 0 && a > INT64_MAX - b)
        return INT64_MAX;
    if (b < 0 && a < INT64_MIN - b)
        return INT64_MIN;
    return a + b;
}

/* Parse a non-negative decimal integer below limit; -1 if it is not one. */
static long cli_parse_uint(const char *s, long limit)
{
    char *end;
    if (!s || !*s || *s == '-' || *s == '+')
        return -1;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (*end || errno || v < 0 || v >= limit)
        return -1;
    return v;
}

/* The larger of w and the length of s: column widths. */
int cli_width_of(int w, const char *s)
{
    int n = (int)strlen(s);
    return n > w ? n : w;
}

/* ---- options ---------------------------------------------------------------- */

/* Value of an option that takes one: "--name=V", or the next argument. */
const char *cli_opt_value(int argc, char **argv, int *i, const char *arg, const char *name)
{
    size_t n = strlen(name);
    if (strncmp(arg, name, n) == 0 && arg[n] == '=')
        return arg + n + 1;
    if (*i + 1 >= argc)
        return NULL;
    return argv[++*i];
}

bool cli_is_opt(const char *arg, const char *name)
{
    size_t n = strlen(name);
    return strncmp(arg, name, n) == 0 && (arg[n] == 0 || (arg[n] == '=' && name[1] == '-'));
}

int cli_parse_device(const char *v, int *device)
{
    long d = v ? cli_parse_uint(v, 1 << 20) : -1;
    if (d < 0)
        return cli_usage("--device needs a device number (0, 1, ...), not '%s'", v ? v : "");
    *device = (int)d;
    return 0;
}

/* ---- documents ----------------------------------------------------------- */

/* Line and column (from 1) of byte offset at in text. */
static void cli_line_col(const char *text, size_t len, size_t at, size_t *line, size_t *col)
{
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < at && i < len; i++) {
        if (text[i] == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

/* Read and parse path into doc ("-": standard input). Returns 0, or
 * EXIT_DATA after printing why. */
int cli_doc_load(cli_doc_t *doc, const char *path)
{
    memset(doc, 0, sizeof *doc);
    bool from_stdin = strcmp(path, "-") == 0;
    doc->path = from_stdin ? "(standard input)" : path;
    path = doc->path;
    FILE *f = from_stdin ? stdin : fopen(path, "rb");
    if (!f)
        return cli_fail(EXIT_DATA, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = cli_alloc(cap);
    for (;;) {
        if (n == cap) {
            size_t c2 = cap;
            cli_grow((void **)&buf, &c2, cap * 2, 1);
            cap = c2;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    int bad = ferror(f);
    int saved = errno;
    if (!from_stdin)
        fclose(f);
    if (bad) {
        free(buf);
        return cli_fail(EXIT_DATA, "%s: cannot read: %s", path, strerror(saved));
    }
    char err[256];
    size_t at = 0;
    doc->root = tally__json_parse(buf, n, err, sizeof err, &at);
    if (!doc->root) {
        size_t line, col;
        cli_line_col(buf, n, at, &line, &col);
        free(buf);
        return cli_fail(EXIT_DATA, "%s: malformed JSON: %s (line %zu, column %zu)", path, err, line, col);
    }
    doc->text = buf;
    doc->len = n;
    return 0;
}

void cli_doc_free(cli_doc_t *doc)
{
    tally__json_free(doc->root);
    free(doc->text);
    doc->root = NULL;
    doc->text = NULL;
}

/* Record the first schema problem of doc: "byte N: where: what". */
__attribute__((format(printf, 4, 5))) void cli_schema(cli_doc_t *doc, const tally_json_t *at,
                                                      const char *where, const char *fmt, ...)
{
    if (doc->err[0])
        return;
    int n = snprintf(doc->err, sizeof doc->err, "byte %zu: %s: ", at ? at->offset : (size_t)0, where);
    if (n < 0 || (size_t)n >= sizeof doc->err)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(doc->err + n, sizeof doc->err - (size_t)n, fmt, ap);
    va_end(ap);
}

/* Member key of obj, which must be present (else a schema error, NULL). */
const tally_json_t *cli_need(cli_doc_t *doc, const tally_json_t *obj, const char *where, const char *key)
{
    const tally_json_t *v = tally__json_get(obj, key);
    if (!v)
        cli_schema(doc, obj, where, "missing \"%s\"", key);
    return v;
}

/* Integer member; 0 with a schema error when missing or not an integer.
 * Missing is allowed (returns fallback) when optional. */
int64_t cli_int_opt(cli_doc_t *doc, const tally_json_t *obj, const char *where, const char *key,
                    bool optional, int64_t fallback)
{
    const tally_json_t *v = tally__json_get(obj, key);
    int64_t x;
    if (!v) {
        if (!optional)
            cli_schema(doc, obj, where, "missing \"%s\"", key);
        return fallback;
    }
    if (tally__json_int(v, &x) < 0) {
        cli_schema(doc, v, where, "\"%s\" should be an integer, not %s", key,
                   v->type == TALLY_JSON_NUMBER ? "a fraction" : tally__json_type_name(v->type));
        return fallback;
    }
    return x;
}

double cli_num(cli_doc_t *doc, const tally_json_t *obj, const char *where, const char *key)
{
    const tally_json_t *v = tally__json_get(obj, key);
    if (!v)
        return 0; /* only used for informative fields */
    if (v->type != TALLY_JSON_NUMBER) {
        cli_schema(doc, v, where, "\"%s\" should be a number, not %s", key, tally__json_type_name(v->type));
        return 0;
    }
    return v->d;
}

const char *cli_str(cli_doc_t *doc, const tally_json_t *obj, const char *where, const char *key,
                    bool optional)
{
    const tally_json_t *v = tally__json_get(obj, key);
    if (!v) {
        if (!optional)
            cli_schema(doc, obj, where, "missing \"%s\"", key);
        return "";
    }
    if (v->type != TALLY_JSON_STRING) {
        cli_schema(doc, v, where, "\"%s\" should be a string, not %s", key, tally__json_type_name(v->type));
        return "";
    }
    return v->s;
}

bool cli_bool(cli_doc_t *doc, const tally_json_t *obj, const char *where, const char *key)
{
    const tally_json_t *v = tally__json_get(obj, key);
    if (!v)
        return false;
    if (v->type != TALLY_JSON_TRUE && v->type != TALLY_JSON_FALSE) {
        cli_schema(doc, v, where, "\"%s\" should be true or false, not %s", key, tally__json_type_name(v->type));
        return false;
    }
    return v->type == TALLY_JSON_TRUE;
}

/* Array member (an empty one when optional and absent); NULL on error. */
const tally_json_t *cli_array(cli_doc_t *doc, const tally_json_t *obj, const char *where, const char *key,
                              bool optional)
{
    static const tally_json_t empty = {.type = TALLY_JSON_ARRAY};
    const tally_json_t *v = tally__json_get(obj, key);
    if (!v) {
        if (!optional)
            cli_schema(doc, obj, where, "missing \"%s\"", key);
        return optional ? &empty : NULL;
    }
    if (v->type != TALLY_JSON_ARRAY) {
        cli_schema(doc, v, where, "\"%s\" should be an array, not %s", key, tally__json_type_name(v->type));
        return NULL;
    }
    return v;
}

/* Element i of arr, which must be an object; NULL (and an error) if not. */
const tally_json_t *cli_obj_at(cli_doc_t *doc, const tally_json_t *arr, const char *name, size_t i,
                               char *where, size_t wlen)
{
    const tally_json_t *v = tally__json_at(arr, i);
    snprintf(where, wlen, "%s[%zu]", name, i);
    if (!v || v->type != TALLY_JSON_OBJECT) {
        cli_schema(doc, v ? v : arr, where, "should be an object, not %s",
                   v ? tally__json_type_name(v->type) : "missing");
        return NULL;
    }
    return v;
}

/* ---- JSON output ----------------------------------------------------------- */

void cli_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"':
            fputs("\\\"", f);
            break;
        case '\\':
            fputs("\\\\", f);
            break;
        case '\n':
            fputs("\\n", f);
            break;
        case '\t':
            fputs("\\t", f);
            break;
        case '\r':
            fputs("\\r", f);
            break;
        default:
            if (*p < 0x20)
                fprintf(f, "\\u%04x", *p);
            else
                fputc(*p, f);
        }
    }
    fputc('"', f);
}

/* Text for XML / HTML character data and attribute values. */
void cli_xml_str(FILE *f, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '&':
            fputs("&amp;", f);
            break;
        case '<':
            fputs("&lt;", f);
            break;
        case '>':
            fputs("&gt;", f);
            break;
        case '"':
            fputs("&quot;", f);
            break;
        case '\'':
            fputs("&apos;", f);
            break;
        default:
            /* Control characters are not allowed in XML 1.0. */
            fputc(*p < 0x20 && *p != '\t' && *p != '\n' ? '?' : *p, f);
        }
    }
}

/* Close stdout (or f) and report a failed write. */
int cli_finish(FILE *f, const char *what)
{
    if (fflush(f) != 0 || ferror(f))
        return cli_fail(EXIT_DATA, "writing %s failed: %s", what, strerror(errno));
    return 0;
}
