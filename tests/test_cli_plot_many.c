/* `tally plot` at scale: a timeline with thousands of blocks live at once.
 * The plot keeps a map from each live block's address to its tag while it
 * walks the events (tools/cli_plot.c); it must grow past its first sizes and
 * still find every block, so the plotted figures match the run's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cliutil.h"
#include "tally.h"

#define NBLOCKS 5000 /* past three doublings of the map's 1024 slots */

static char dir[64], tally_bin[PATH_MAX - 64];

/* The workload: NBLOCKS blocks of 4 KiB under two tags, all live at once,
 * then freed in the order they came; the report is written at the end. */
static int many_blocks(const char *report)
{
    char conf[400];
    snprintf(conf, sizeof conf,
             "backend:host,host_devices:1,timeline:true,leak_report:off,stage_report:false,report_path:%s", report);
    setenv("TALLY_CONF", conf, 1);
    static void *p[NBLOCKS];
    for (int i = 0; i < NBLOCKS; i++) {
        if (tally_tag_push(i % 2 ? "odd" : "even") != 0)
            return 2;
        p[i] = tally_malloc(4096, 0, NULL);
        tally_tag_pop();
        if (!p[i])
            return 3;
    }
    for (int i = 0; i < NBLOCKS; i++)
        tally_free(p[i]);
    return tally_write_report(report) == 0 ? 0 : 4;
}

static int setup(void **state)
{
    (void)state;
    char exe[PATH_MAX - 128];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return -1;
    exe[n] = 0;
    *strrchr(exe, '/') = 0; /* .../build/tests */
    snprintf(tally_bin, sizeof tally_bin, "%s/../bin/tally", exe);
    snprintf(dir, sizeof dir, "/tmp/tally-plot-many-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_plot_of_thousands_of_live_blocks(void **state)
{
    (void)state;
    char report[128], svg[128], args[300];
    snprintf(report, sizeof report, "%s/many.json", dir);
    snprintf(svg, sizeof svg, "%s/many.svg", dir);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(many_blocks(report));
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    snprintf(args, sizeof args, "plot '%s' -o '%s'", report, svg);
    run_t r = run_tool(tally_bin, dir, args);
    if (r.rc != 0)
        fail_msg("tally %s: exit status %d\n%s", args, r.rc, r.err);
    /* Every allocation and free is an event, and so is each of the 10
     * small-pool segments of 2 MiB they took; the peak is every block live
     * at once (5000 x 4 KiB). */
    char want[200];
    snprintf(want, sizeof want, "device 0, %d events, 2 tag groups, peak allocated 19.5 MiB", 2 * NBLOCKS + 10);
    if (!strstr(r.out, want))
        fail_msg("the plot's summary lacks '%s':\n%s", want, r.out);
    run_free(&r);
    char *text = slurp(svg);
    assert_non_null(text);
    /* Both tags are drawn: the map found each freed block's tag. */
    assert_non_null(strstr(text, ">even<"));
    assert_non_null(strstr(text, ">odd<"));
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plot_of_thousands_of_live_blocks),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
