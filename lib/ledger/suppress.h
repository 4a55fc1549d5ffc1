/* Leak suppressions (suppress.c) and the grouped leak report (report_leaks.c). */
#ifndef TALLY_SUPPRESS_H
#define TALLY_SUPPRESS_H

#include "ledger/site.h"
#include "ledger/stage.h"

#define TALLY_SUP_MAX 256

typedef struct tally_sup_rule {
    const char *pattern;
    int line;               /* in the file */
    uint64_t blocks, bytes; /* what it suppressed in this report */
} tally_sup_rule_t;

typedef struct tally_suppressions {
    char path[512];
    int n;
    tally_sup_rule_t rules[TALLY_SUP_MAX];
} tally_suppressions_t;

/* Whether pattern (`*` wildcard, optional `^` / `$` anchors, otherwise
 * matching anywhere) matches text; never matches NULL or "". */
bool tally__sup_pattern_match(const char *pattern, const char *text);
/* Validate a suppressions file (option setting): 0, or -TALLY_ECONF with
 * one line naming the file, the line and the problem. "" is valid (none). */
int tally__sup_check(const char *path);
/* The same as an option checker (tally__options_set_checker): checks the
 * value of leak_suppressions, passes every other key. */
int tally__sup_check_option(const char *key, const char *path);
/* Read the configured file (none: n = 0). 0, or -1 with why filled. */
int tally__sup_load(tally_suppressions_t *sup, char *why, size_t len);
void tally__sup_free(tally_suppressions_t *sup);
/* Index of the first rule matching the tag or a frame of the site, or -1. */
int tally__sup_match(const tally_suppressions_t *sup, const char *tag, const tally_site_t *site);

/* Mark each group of s suppressed (g->suppressed: rule index, or
 * TALLY_SUP_IGNORED for blocks passed to tally_ignore, or -1) and count
 * what each rule matched. */
#define TALLY_SUP_IGNORED (-2)
void tally__leaks_classify(leak_set_t *s, tally_suppressions_t *sup);

#endif
