/* Helpers for the tests of expandable segments on the cuda backend
 * (test_backend_cuda_vmm.c, test_backend_cuda_vmm_refusals.c,
 * test_backend_cuda_vmm_replay.c): each test body runs in a forked child
 * with its own environment (the backend is chosen once per
 * process, and CUDA must not start before a fork).
 *
 * - NEED(cond): in a child, a failed expectation ends it with status 1 and
 *   one line naming the file, the line and tally's last error.
 * - run_child(env, body, buf, len): run body(fd) in a child with the
 *   environment pairs env set; what the child writes to fd comes back in
 *   buf; returns the child's exit status. expect_child_ok: it must be 0.
 * - start_driver(): load libcuda.so.1 in the child (cudautil.h) and cuInit.
 * - stats0(): device 0's statistics.
 *
 * Bodies are static inline: this header is included by test programs only. */
#ifndef TALLY_TESTS_VMMUTIL_H
#define TALLY_TESTS_VMMUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cudautil.h"
#include "orphan.h" /* tu_die_with_parent */
#include "backend/cuda/vmm.h"
#include "tally.h"

#define MiB ((size_t)1 << 20)
#define PAGE (2 * MiB)

/* In a child: a failed expectation ends it with status 1 and one line. */
#define NEED(cond)                                                                                                 \
    do {                                                                                                           \
        if (!(cond)) {                                                                                             \
            fprintf(stderr, "%s:%d: %s (tally: %s)\n", __FILE__, __LINE__, #cond, tally_last_error());        \
            _exit(1);                                                                                              \
        }                                                                                                          \
    } while (0)

/* Run body in a child with the environment pairs env (NULL-ended) set;
 * returns its exit status (-1 for a signal). out: a pipe's write end the
 * child may write to, read back into buf (up to len bytes). */
static inline int run_child(const char *const *env, void (*body)(int fd), void *buf, size_t len)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(NULL);
    pid_t parent = getpid();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        tu_die_with_parent(parent);
        close(fds[0]);
        for (size_t i = 0; env[i]; i += 2)
            setenv(env[i], env[i + 1], 1);
        alarm(300);
        body(fds[1]);
        close(fds[1]);
        _exit(0);
    }
    close(fds[1]);
    size_t got = 0;
    ssize_t k;
    while (buf && got < len && (k = read(fds[0], (char *)buf + got, len - got)) > 0)
        got += (size_t)k;
    close(fds[0]);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static inline void expect_child_ok(const char *const *env, void (*body)(int fd))
{
    int st = run_child(env, body, NULL, 0);
    if (st != 0)
        fail_msg("child ended with status %d (see its line above)", st);
}

static inline void start_driver(void)
{
    if (cu_load()) {
        fprintf(stderr, "%s\n", cu_load_error);
        _exit(1);
    }
    NEED(cu.cuInit(0) == CUDA_SUCCESS);
}

static inline tally_stats_t stats0(void)
{
    tally_stats_t s;
    NEED(tally_get_stats(0, &s) == 0);
    return s;
}

#endif /* TALLY_TESTS_VMMUTIL_H */
