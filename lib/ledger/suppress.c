/* Leak suppressions (leak_suppressions:FILE), read as LeakSanitizer reads
 * its own: one `leak:PATTERN` per line, `#` starts a comment line, blank
 * lines are skipped. A pattern matches a leak when it matches the leak's
 * tag, or the function or file (module, without line information) of any
 * frame of its allocation site. `*` matches any run of characters; the
 * pattern may match anywhere in the text unless it starts with `^` (anchored
 * at the start) or ends with `$` (anchored at the end).
 *
 * The file is checked when the option is set (a bad file fails the setting
 * with one line naming the file, the line and the problem) and read again
 * when the leak report is written. */
#include "ledger/suppress.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#define SUP_LINE 1024

/* `*` wildcard, anchored at both ends of text and pattern. */
static bool glob_full(const char *p, const char *pend, const char *t, const char *tend)
{
    const char *star = NULL, *back = NULL;
    while (t < tend) {
        if (p < pend && *p == '*') {
            star = ++p;
            back = t;
        } else if (p < pend && *p == *t) {
            p++;
            t++;
        } else if (star) {
            p = star;
            t = ++back;
        } else {
            return false;
        }
    }
    while (p < pend && *p == '*')
        p++;
    return p == pend;
}

bool tally__sup_pattern_match(const char *pattern, const char *text)
{
    if (!text || !*text)
        return false;
    /* An unanchored side is an implied `*`. */
    char p[SUP_LINE + 3];
    size_t n = strlen(pattern);
    bool head = n && pattern[0] == '^', tail = n > (size_t)head && pattern[n - 1] == '$';
    size_t core = n - head - tail;
    if (core > SUP_LINE)
        return false;
    size_t k = 0;
    if (!head)
        p[k++] = '*';
    memcpy(p + k, pattern + head, core);
    k += core;
    if (!tail)
        p[k++] = '*';
    return glob_full(p, p + k, text, text + strlen(text));
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r'))
        s[--n] = 0;
    return s;
}

/* Parse path into sup (which may be NULL: check only). 0, or -1 with why. */
static int parse(const char *path, tally_suppressions_t *sup, char *why, size_t len)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(why, len, "cannot open '%s': %s", path, strerror(errno));
        return -1;
    }
    /* A FIFO or a terminal could block the caller for ever. */
    if (!S_ISREG(st.st_mode)) {
        snprintf(why, len, "'%s' is not a regular file", path);
        return -1;
    }
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(why, len, "cannot open '%s': %s", path, strerror(errno));
        return -1;
    }
    char line[SUP_LINE + 2];
    int lineno = 0, rc = 0, n = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        if (!strchr(line, '\n') && !feof(f)) {
            snprintf(why, len, "%s:%d: line longer than %d characters", path, lineno, SUP_LINE);
            rc = -1;
            break;
        }
        char *s = trim(line);
        if (!*s || *s == '#')
            continue;
        if (strncmp(s, "leak:", 5) != 0) {
            snprintf(why, len, "%s:%d: '%.60s' is not leak:PATTERN", path, lineno, s);
            rc = -1;
            break;
        }
        char *pat = trim(s + 5);
        if (!*pat || strcmp(pat, "^") == 0 || strcmp(pat, "$") == 0) {
            snprintf(why, len, "%s:%d: empty pattern", path, lineno);
            rc = -1;
            break;
        }
        if (n == TALLY_SUP_MAX) {
            snprintf(why, len, "%s:%d: more than %d suppressions", path, lineno, TALLY_SUP_MAX);
            rc = -1;
            break;
        }
        if (sup) {
            size_t pl = strlen(pat) + 1;
            char *copy = tally__meta_alloc(pl);
            if (!copy) {
                snprintf(why, len, "%s: out of memory", path);
                rc = -1;
                break;
            }
            memcpy(copy, pat, pl);
            sup->rules[n] = (tally_sup_rule_t){copy, lineno, 0, 0};
        }
        n++;
    }
    fclose(f);
    if (sup)
        sup->n = rc ? 0 : n;
    return rc;
}

int tally__sup_check_option(const char *key, const char *path)
{
    if (strcmp(key, "leak_suppressions") != 0)
        return 0;
    return tally__sup_check(path);
}

int tally__sup_check(const char *path)
{
    char why[700];
    if (!*path)
        return 0;
    if (parse(path, NULL, why, sizeof why))
        return tally__fail(TALLY_ECONF, "config: leak_suppressions: %s", why);
    return 0;
}

int tally__sup_load(tally_suppressions_t *sup, char *why, size_t len)
{
    char path[512];
    memset(sup, 0, sizeof *sup);
    tally__opt_string(tally__opt.leak_suppressions, path);
    if (!path[0])
        return 0;
    snprintf(sup->path, sizeof sup->path, "%s", path);
    return parse(path, sup, why, len);
}

void tally__sup_free(tally_suppressions_t *sup)
{
    for (int i = 0; i < sup->n; i++)
        tally__meta_free((void *)sup->rules[i].pattern);
    sup->n = 0;
}

static bool frame_matches(const char *func, const char *file, void *arg)
{
    const char *pattern = arg;
    return tally__sup_pattern_match(pattern, func) || tally__sup_pattern_match(pattern, file);
}

int tally__sup_match(const tally_suppressions_t *sup, const char *tag, const tally_site_t *site)
{
    for (int i = 0; i < sup->n; i++) {
        const char *pat = sup->rules[i].pattern;
        if (tally__sup_pattern_match(pat, tag) || tally__site_any_frame(site, frame_matches, (void *)pat))
            return i;
    }
    return -1;
}
