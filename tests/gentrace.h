/* The bench's synthetic LLaMA traces in a test: bench/gen_trace.c is linked
 * beside the test with GEN_TRACE_NO_MAIN (its Makefile rule), and
 * gentrace_write runs it in a child, since the generator keeps its state in
 * globals and exits on an error. Include after cmocka.h. */
#ifndef TALLY_TEST_GENTRACE_H
#define TALLY_TEST_GENTRACE_H

#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

int gen_trace_run(int argc, char **argv);

/* Write `gen_trace --model model --out path` (model "7b" or "13b", the
 * bench's defaults otherwise); the test fails if the generator does. */
static inline void gentrace_write(const char *path, const char *model)
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char *argv[] = {"gen_trace", "--model", (char *)model, "--out", (char *)path, NULL};
        if (!freopen("/dev/null", "w", stderr))
            _exit(3);
        _exit(gen_trace_run(5, argv));
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

#endif
