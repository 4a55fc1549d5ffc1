/* Running a command-line tool as a user runs it, for the tests of the
 * tally command (test_cli.c, test_tune.c): its exit status, stdout and
 * stderr, through the shell. Include after cmocka.h. */
#ifndef TALLY_TESTS_CLIUTIL_H
#define TALLY_TESTS_CLIUTIL_H

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

typedef struct run {
    int rc;
    char *out, *err;
} run_t;

/* The whole file, NUL-terminated; NULL when it cannot be read. */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (cap - n - 1 == 0) {
            cap *= 2;
            buf = realloc(buf, cap);
        }
    }
    fclose(f);
    if (buf)
        buf[n] = 0;
    return buf;
}

/* Run "'bin' args" with stdout and stderr captured in files of dir. */
static run_t run_tool(const char *bin, const char *dir, const char *args)
{
    char cmd[4096 + 3 * PATH_MAX + 64], out[PATH_MAX + 8], err[PATH_MAX + 8];
    snprintf(out, sizeof out, "%s/stdout", dir);
    snprintf(err, sizeof err, "%s/stderr", dir);
    snprintf(cmd, sizeof cmd, "'%s' %s >'%s' 2>'%s'", bin, args, out, err);
    int st = system(cmd);
    run_t r = {WIFEXITED(st) ? WEXITSTATUS(st) : -1, slurp(out), slurp(err)};
    assert_non_null(r.out);
    assert_non_null(r.err);
    return r;
}

static void run_free(run_t *r)
{
    free(r->out);
    free(r->err);
}

#endif
