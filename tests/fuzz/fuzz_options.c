/* Fuzz target: the TALLY_CONF parser (tally__options_parse, lib/core/options.c)
 * on arbitrary bytes.
 *
 * Properties checked on every input (the input is one configuration
 * string; a NUL byte ends it, as it would in an environment variable):
 *  - no crash, no sanitizer report, no read past the string;
 *  - on failure the options are untouched, the error names "config:" and
 *    the seen mask is 0;
 *  - with runtime set (tally_configure after initialisation) a string is
 *    accepted only if it is also accepted before initialisation, with the
 *    same result: runtime keys are a subset;
 *  - on success the printed options (tally__options_write, one
 *    "key:value    # help" line per key) parse back, the way the Python
 *    package does it (text before the first "    #", stripped, joined with
 *    ','), to the same options, and print the same text again.
 * A violation aborts with a message naming the input and the field. */
#include "core/internal.h"
#include "ledger/suppress.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void quiet(void *arg, const char *text, size_t len)
{
    (void)arg;
    (void)text;
    (void)len;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    tally_set_sink(quiet, NULL);
    /* As the library does before it parses anything (lib/api/api.c,
     * load_options): leak_suppressions must name a file that parses. */
    tally__options_set_checker(tally__sup_check_option);
    return 0;
}

typedef struct text {
    char *p;
    size_t len, cap;
} text_t;

static void text_write(void *arg, const char *s, size_t len)
{
    text_t *t = arg;
    if (t->len + len + 1 > t->cap) {
        t->cap = (t->len + len + 1) * 2;
        t->p = realloc(t->p, t->cap);
        if (!t->p)
            abort();
    }
    memcpy(t->p + t->len, s, len);
    t->len += len;
    t->p[t->len] = 0;
}

static char *print_options(const tally_options_t *o)
{
    text_t t = {0};
    tally_out_t out;
    tally__out_init(&out, text_write, &t);
    if (tally__options_write(o, &out) != 0) {
        fprintf(stderr, "fuzz_options: tally__options_write failed\n");
        abort();
    }
    if (!t.p)
        text_write(&t, "", 0);
    return t.p;
}

/* The printed text as a TALLY_CONF string, as python/tally/_options.py
 * reads it: per line, the text before the first "    #", stripped of
 * blanks; lines with a ':' joined by ','. */
static char *conf_from_text(const char *text)
{
    text_t c = {0};
    text_write(&c, "", 0);
    const char *line = text;
    while (*line) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        const char *hash = NULL;
        for (size_t i = 0; i + 5 <= len; i++) {
            if (memcmp(line + i, "    #", 5) == 0) {
                hash = line + i;
                break;
            }
        }
        const char *b = line, *e = hash ? hash : line + len;
        while (b < e && (*b == ' ' || *b == '\t' || *b == '\r'))
            b++;
        while (e > b && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r'))
            e--;
        if (memchr(b, ':', (size_t)(e - b))) {
            if (c.len)
                text_write(&c, ",", 1);
            text_write(&c, b, (size_t)(e - b));
        }
        line += len + (nl ? 1 : 0);
    }
    return c.p;
}

/* Every string key: compared up to its NUL (the bytes after it are left
 * from earlier values), and each must print faithfully. */
static const struct {
    const char *name;
    size_t off, size;
} string_keys[] = {
#define STRING_KEY(f) {#f, offsetof(tally_options_t, f), sizeof((tally_options_t *)0)->f}
    STRING_KEY(persistent_tags), STRING_KEY(private_tags), STRING_KEY(report_path), STRING_KEY(leak_suppressions),
#undef STRING_KEY
};

/* Field by field (the string fields only up to their NUL), then the whole
 * struct, so that a key added later is compared too. */
static const char *options_differ(const tally_options_t *a, const tally_options_t *b)
{
#define SAME(f)                                                                                                    \
    if (memcmp(&a->f, &b->f, sizeof a->f) != 0)                                                                    \
        return #f;
    SAME(backend) SAME(host_devices) SAME(host_capacity) SAME(host_mode) SAME(max_split_size)
    SAME(max_non_split_rounding) SAME(gc_threshold) SAME(roundup_divisions) SAME(memory_fraction) SAME(ledger)
    SAME(backtrace_depth) SAME(release_at_stage_end) SAME(stage_report) SAME(leak_report) SAME(leak_exitcode)
    SAME(home_device) SAME(timeline) SAME(timeline_events) SAME(async_private_pool) SAME(async_release_threshold)
#undef SAME
    static tally_options_t x, y;
    x = *a;
    y = *b;
    for (size_t i = 0; i < sizeof string_keys / sizeof string_keys[0]; i++) {
        char *sx = (char *)&x + string_keys[i].off, *sy = (char *)&y + string_keys[i].off;
        if (strcmp(sx, sy) != 0)
            return string_keys[i].name;
        memset(sx, 0, string_keys[i].size);
        memset(sy, 0, string_keys[i].size);
    }
    if (memcmp(&x, &y, sizeof x) != 0)
        return "a field not named in fuzz_options.c";
    return NULL;
}

__attribute__((noreturn)) static void violated(const char *conf, const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_options: %s%s%s\n  input: \"", what, detail ? ": " : "", detail ? detail : "");
    for (const unsigned char *p = (const unsigned char *)conf; *p; p++)
        fprintf(stderr, *p >= 0x20 && *p < 0x7f && *p != '"' && *p != '\\' ? "%c" : "\\x%02x", *p);
    fprintf(stderr, "\"\n");
    abort();
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    char *conf = malloc(size + 1);
    if (!conf)
        return 0;
    memcpy(conf, data, size);
    conf[size] = 0;

    tally_options_t def, a, b;
    tally__options_default(&def);
    a = def;
    uint64_t seen = ~0ull;
    int rc = tally__options_parse(&a, conf, false, &seen);
    if (rc != 0) {
        if (rc != -TALLY_ECONF)
            violated(conf, "failure code is not -TALLY_ECONF", NULL);
        if (memcmp(&a, &def, sizeof a) != 0)
            violated(conf, "options changed by a failed parse", NULL);
        if (seen != 0)
            violated(conf, "seen mask not 0 after a failed parse", NULL);
        if (strncmp(tally_last_error(), "config: ", 8) != 0)
            violated(conf, "error message does not start with 'config: '", tally_last_error());
    }

    /* Runtime keys are a subset: accepted at runtime implies accepted. */
    b = def;
    uint64_t seen_rt = ~0ull;
    int rc_rt = tally__options_parse(&b, conf, true, &seen_rt);
    if (rc_rt == 0 && rc != 0)
        violated(conf, "accepted at runtime but not before initialisation", NULL);
    if (rc_rt == 0 && (options_differ(&a, &b) || seen_rt != seen))
        violated(conf, "runtime parse gives other options", options_differ(&a, &b));
    if (rc_rt != 0 && memcmp(&b, &def, sizeof b) != 0)
        violated(conf, "options changed by a failed runtime parse", NULL);

    if (rc == 0) {
        char *text = print_options(&a);
        char *back = conf_from_text(text);
        tally_options_t c = def;
        if (tally__options_parse(&c, back, false, NULL) != 0) {
            fprintf(stderr, "printed options:\n%s\nas a conf string: %s\nerror: %s\n", text, back,
                        tally_last_error());
            violated(conf, "the printed options do not parse back", tally_last_error());
        }
        const char *field = options_differ(&a, &c);
        if (field) {
            fprintf(stderr, "printed options:\n%s\n", text);
            violated(conf, "the printed options parse back to other options, field", field);
        }
        char *text2 = print_options(&c);
        if (strcmp(text, text2) != 0)
            violated(conf, "printing the re-parsed options gives other text", NULL);
        free(text2);
        free(back);
        free(text);
    }
    free(conf);
    return 0;
}
