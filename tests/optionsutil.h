/* Shared by the tests of the configuration that changes the caching rules
 * (test_core_options: roundup_power2_divisions, host_capacity, runtime keys;
 * test_core_options_max_split: max_split_size_mb): the configuration each
 * process runs with, two streams, and the children that initialise with
 * their own TALLY_CONF and check the block size of each request. */
#ifndef TALLY_TESTS_OPTIONSUTIL_H
#define TALLY_TESTS_OPTIONSUTIL_H

#include "testutil.h"

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define S1 STREAM(1)
#define S2 STREAM(2)

/* What each process runs with (tu_conf in main); the divisions table it
 * gives is in test_core_options.c's opening comment. */
#define CONF_MAIN                                                                                                  \
    "backend:host,host_devices:1,host_capacity:80GiB,host_mode:virtual,max_split_size_mb:40,"                      \
    "roundup_power2_divisions:[1:4,2:0,64:8,>:2]"

/* ---- children with their own TALLY_CONF ----------------------------------- */

/* In a child: on failure, say what failed and exit with 1. */
#define CHILD_REQUIRE(c)                                                                                           \
    do {                                                                                                           \
        if (!(c)) {                                                                                                \
            fprintf(stderr, "child: %s:%d: %s failed (%s)\n", __FILE__, __LINE__, #c, tally_last_error());        \
            _exit(1);                                                                                              \
        }                                                                                                          \
    } while (0)

/* The block size a request gets, in a child. */
static inline size_t child_block_size(size_t request)
{
    void *p = tu_malloc(request, 0, NULL);
    CHILD_REQUIRE(p != NULL);
    tally_block_info_t i;
    CHILD_REQUIRE(tally_block_info(p, &i) == 0);
    tu_free(p);
    return i.size;
}

typedef struct child_case {
    size_t request, block;
} child_case_t;

/* Fork a child that initialises with conf and checks each block size. */
static inline void child_rounding(const char *conf, const child_case_t *cases, size_t n)
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        tu_conf(conf);
        CHILD_REQUIRE(tally_init() == 0);
        for (size_t i = 0; i < n; i++) {
            size_t got = child_block_size(cases[i].request);
            if (got != cases[i].block) {
                fprintf(stderr, "child (%s): request %zu gave a block of %zu, expected %zu\n", conf,
                        cases[i].request, got, cases[i].block);
                _exit(1);
            }
        }
        CHILD_REQUIRE(tally_check() == 0);
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("child with TALLY_CONF=%s failed: status %d (its message is above)", conf, status);
}

#endif /* TALLY_TESTS_OPTIONSUTIL_H */
