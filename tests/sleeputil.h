/* Helpers for the sleep and wake tests (test_api_sleep.c,
 * test_api_sleep_errors.c, test_api_sleep_cuda.c, test_standin_copy.c):
 * whether touching an address faults (in a forked child, with the default
 * signal actions: cmocka's handler would carry on with the tests there),
 * and a seeded byte pattern to fill and compare. */
#ifndef TALLY_TESTS_SLEEPUTIL_H
#define TALLY_TESTS_SLEEPUTIL_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

static inline bool su_faults(void *p)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL);
        signal(SIGBUS, SIG_DFL);
        *(volatile char *)p = 1;
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFSIGNALED(st) && (WTERMSIG(st) == SIGSEGV || WTERMSIG(st) == SIGBUS);
}

static inline void su_fill(void *p, size_t n, unsigned seed)
{
    unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        c[i] = (unsigned char)((i * 131u + seed) >> 3);
}

static inline bool su_same(const void *p, size_t n, unsigned seed)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        if (c[i] != (unsigned char)((i * 131u + seed) >> 3))
            return false;
    return true;
}

#endif
