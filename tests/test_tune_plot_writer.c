/* tally tune's picture writer (tools/tune_output.c's tune_plot_svg), called
 * directly, for what the command cannot show: the command checks that the
 * --plot path can be written before its replays (test_tune test_plot), so
 * the writer's own refusal is reached only when the path goes away while
 * they run. The writer is compiled in with the cost table its file also
 * uses; the two row helpers it links against (tools/tune_run.c) are never
 * called by it, and fail the test if they are. */
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
    fail_msg("tune_plot_svg called tune_fits");
    return false;
}

double tune_driver_us(const tune_row_t *r, int column)
{
    (void)r, (void)column;
    fail_msg("tune_plot_svg called tune_driver_us");
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unwritable_path_is_named),
        cmocka_unit_test(test_writable_path_gets_the_picture),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
