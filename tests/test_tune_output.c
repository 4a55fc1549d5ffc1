/* tally tune's output helpers (tools/tune_output.c), called directly.
 *
 * The picture writer (tune_plot_svg), for what the command cannot show: the
 * command checks that the --plot path can be written before its replays
 * (test_tune_table test_plot), so the writer's own refusal is reached only
 * when the path goes away while they run. The torch-version reader
 * (tune_parse_version), over the forms torch's versions take and the ones
 * that are none (the command's --torch-version refusals are in
 * test_tune_table).
 *
 * The file is compiled in with the cost table it also uses; the row
 * helpers it would link against (tools/tune.c's tune_fits and
 * tune_kept_ratio, tools/tune_run_replay.c's tune_driver_us) are stubs
 * below: never called by these functions, they fail the test if they are. */
#include "../tools/tune_output.c"
#include "../tests/standin/cost.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <unistd.h>

bool tune_fits(const tune_row_t *r)
{
    (void)r;
    fail_msg("tune_fits was called");
    return false;
}

double tune_kept_ratio(const tune_row_t *r)
{
    (void)r;
    fail_msg("tune_kept_ratio was called");
    return 0;
}

double tune_driver_us(const tune_row_t *r, int column)
{
    (void)r, (void)column;
    fail_msg("tune_driver_us was called");
    return 0;
}

static const int64_t MIB = (int64_t)1 << 20;

/* A path that cannot be opened: -1, and one line naming the path and why. */
static void test_unwritable_path_is_named(void **state)
{
    (void)state;
    int64_t v[2] = {MIB, 2 * MIB};
    const tune_series_t two[2] = {{v, 2}, {v, 2}};
    const char *const names[2] = {"PyTorch's default", "expandable_segments:True"};
    char err[512] = "";
    assert_int_equal(tune_plot_svg("/nonexistent/dir/x.svg", "x.csv", two, names, 2, err, sizeof err), -1);
    assert_string_equal(err, "/nonexistent/dir/x.svg: cannot write: No such file or directory");
}

/* The same series written where it can be: 0, and a whole SVG naming both. */
static void test_writable_path_gets_the_picture(void **state)
{
    (void)state;
    char path[] = "/tmp/tally-tune-plot-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    int64_t v[2] = {MIB, 2 * MIB};
    const tune_series_t two[2] = {{v, 2}, {v, 2}};
    const char *const names[2] = {"PyTorch's default", "expandable_segments:True"};
    char err[512] = "";
    assert_int_equal(tune_plot_svg(path, "x.csv", two, names, 2, err, sizeof err), 0);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static char text[65536];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
    unlink(path);
    assert_non_null(strstr(text, "<svg "));
    assert_non_null(strstr(text, ">PyTorch's default</text>"));
    assert_non_null(strstr(text, ">expandable_segments:True</text>"));
    assert_non_null(strstr(text, "</svg>"));
}

/* A torch version is MAJOR.MINOR (1 to 99, 0 to 999), then nothing or what
 * torch's own versions put there: a patch (.1), a local tag (+cu130), a
 * pre-release (a0, rc1) or a dev mark (dev20250101); anything else is no
 * version, and v is left as it was. */
static void test_torch_version_forms(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        int major, minor;
    } good[] = {
        {"2.11", 2, 11}, {"2.9.1", 2, 9}, {"2.10+cu130", 2, 10}, {"2.6a0", 2, 6}, {"2.6rc1", 2, 6},
        {"2.7dev20250101", 2, 7}, {"1.0", 1, 0}, {"99.999", 99, 999},
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        tune_torch_version_t v = {0};
        if (tune_parse_version(good[i].s, &v) != 0)
            fail_msg("'%s' was refused", good[i].s);
        if (v.major != good[i].major || v.minor != good[i].minor || strcmp(v.text, good[i].s) != 0)
            fail_msg("'%s' read as %d.%d '%s'", good[i].s, v.major, v.minor, v.text);
    }
    static const char *const bad[] = {"", "2", "2.", "2x1", "0.4", "100.1", "2.1000", "2.-1", "2.x",
                                      "2.6b1", "2.11-cu130", "2.11 ", ".11", "two.1"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        tune_torch_version_t v = {7, 7, "kept", NULL};
        if (tune_parse_version(bad[i], &v) != -1)
            fail_msg("'%s' was taken for a version", bad[i]);
        if (v.major != 7 || v.minor != 7 || strcmp(v.text, "kept") != 0)
            fail_msg("'%s' changed the version it was refused into", bad[i]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unwritable_path_is_named),
        cmocka_unit_test(test_writable_path_gets_the_picture),
        cmocka_unit_test(test_torch_version_forms),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
