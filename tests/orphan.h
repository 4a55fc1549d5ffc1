/* A test's child processes die with the process that forked them: a suite
 * stopped by a timeout's SIGKILL (make mutate, a screen), which no clean-up
 * of its own sees, must leave no child running on, holding a core. */
#ifndef TALLY_TESTS_ORPHAN_H
#define TALLY_TESTS_ORPHAN_H

#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <unistd.h>

/* Call in a child right after fork, with the pid of the process that forked
 * it (taken before the fork): the child is killed (SIGKILL) when that
 * process dies; the setting survives an exec. If the parent died before the
 * setting took effect, the child is already someone else's (getppid()
 * differs) and leaves at once. The fork must come from a thread that lives
 * as long as the child should (the signal follows the forking thread). */
static inline void tu_die_with_parent(pid_t parent)
{
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
        _exit(125);
}

#endif
