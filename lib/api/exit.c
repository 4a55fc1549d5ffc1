/* What happens when the process exits: the JSON report (report_path), the
 * leak report (leak_report) and the leak exit code (leak_exitcode). This
 * runs as a library destructor, so after the program's atexit handlers and
 * after Python's finalisation; it reads only tally's own metadata and never
 * calls the backend (CUDA may be gone). Metadata is never torn down, so
 * frees that arrive later still work. */
#include "api/api.h"

#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

static _Atomic int registered, done;

void tally__exit_register(void)
{
    atomic_store(&registered, 1);
}

int tally__exit_report(void)
{
    if (!atomic_load(&registered) || atomic_exchange(&done, 1))
        return 0;
    char path[512];
    tally__opt_string(tally__opt.report_path, path);
    if (path[0])
        tally_write_report(path);
    int leak_report = TALLY_OPT(leak_report), leak_exitcode = TALLY_OPT(leak_exitcode);
    uint64_t blocks = 0, bytes = 0;
    tally_out_t o;
    tally__out_init(&o, tally__sink_writer, NULL);
    if (leak_report != TALLY_LEAK_OFF || leak_exitcode) {
        tally_out_t quiet;
        tally__out_init(&quiet, NULL, NULL);
        bytes = tally__report_leaks(leak_report == TALLY_LEAK_OFF ? &quiet : &o, leak_report == TALLY_LEAK_FULL, true,
                                    &blocks);
        tally__out_flush(&o);
    }
    return bytes && leak_exitcode ? leak_exitcode : 0;
}

__attribute__((destructor)) static void at_exit(void)
{
    int code = tally__exit_report();
    if (code) {
        fflush(NULL);
        _exit(code);
    }
}
