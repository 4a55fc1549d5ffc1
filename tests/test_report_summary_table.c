/* The memory_summary table (report_summary.c): tally__summary_render and
 * tally_write_summary.
 *
 * Expected texts are written out literally: they follow PyTorch's
 * torch.cuda.memory_summary rules (75 columns between bars, 10-wide cells,
 * units picked from the "all" row of the same column with Python's floor
 * division), not whatever the renderer happens to print. */
#include "testutil.h" /* tu_buf_t, tu_buf_write */

#include "report/report.h"

/* ---- helpers ------------------------------------------------------------ */

static char *render(const tally_stats_t *s, int device, int abbreviated)
{
    tu_buf_t b = {0};
    assert_int_equal(tally__summary_render(s, device, abbreviated, tu_buf_write, &b), 0);
    assert_non_null(b.p);
    return b.p;
}

/* Line n (from 0) of text, without its '\n', in a static buffer. */
static const char *line_at(const char *text, int n)
{
    static char line[512];
    const char *p = text;
    for (int i = 0; i < n; i++) {
        p = strchr(p, '\n');
        assert_non_null(p);
        p++;
    }
    const char *e = strchr(p, '\n');
    assert_non_null(e);
    assert_true((size_t)(e - p) < sizeof line);
    memcpy(line, p, (size_t)(e - p));
    line[e - p] = 0;
    return line;
}

static int count_lines(const char *text)
{
    int n = 0;
    for (; *text; text++)
        n += *text == '\n';
    return n;
}

/* Rows of the full table: metric m (0 = Allocated memory ... 8 =
 * Non-releasable allocs) has its "all" row at 7 + 4m, then large, small. */
enum { ROW_ALLOCATED = 7, ROW_ALLOCATIONS = 7 + 4 * 5, ROW_OVERSIZE_ALLOCS = 43, ROW_OVERSIZE_SEGS = 45 };

static const char *cur_cell_of(const tally_stats_t *s, int row)
{
    char *t = render(s, 0, 0);
    static char cell[64];
    const char *l = line_at(t, row);
    /* "| <21> | cell | ..." : the first cell starts at column 26. */
    const char *end = strstr(l + 26, " | ");
    assert_non_null(end);
    memcpy(cell, l + 26, (size_t)(end - (l + 26)));
    cell[end - (l + 26)] = 0;
    free(t);
    return cell;
}

static const char *size_cell(int64_t bytes)
{
    tally_stats_t s;
    memset(&s, 0, sizeof s);
    s.allocated_bytes[TALLY_POOL_ALL].current = bytes;
    return cur_cell_of(&s, ROW_ALLOCATED);
}

static const char *count_cell(int64_t n)
{
    tally_stats_t s;
    memset(&s, 0, sizeof s);
    s.allocation[TALLY_POOL_ALL].current = n;
    return cur_cell_of(&s, ROW_ALLOCATIONS);
}

/* ---- the table ---------------------------------------------------------- */

static const char zero_full[] =
    "|===========================================================================|\n"
    "|                  PyTorch CUDA memory summary, device ID 0                 |\n"
    "|---------------------------------------------------------------------------|\n"
    "|            CUDA OOMs: 0            |        cudaMalloc retries: 0         |\n"
    "|===========================================================================|\n"
    "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Allocated memory      |      0 B   |      0 B   |      0 B   |      0 B   |\n"
    "|       from large pool |      0 B   |      0 B   |      0 B   |      0 B   |\n"
    "|       from small pool |      0 B   |      0 B   |      0 B   |      0 B   |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Active memory         |      0 B   |      0 B   |      0 B   |      0 B   |\n"
    "|       from large pool |      0 B   |      0 B   |      0 B   |      0 B   |\n"
    "|       from small pool |      0 B   |      0 B   |      0 B   |      0 B   |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Requested memory      |      0 B   |      0 B   |      0 B   |      0 B   |\n"
    "|       from large pool |      0 B   |      0 B   |      0 B   |      0 B   |\n"
    "|       from small pool |      0 B   |      0 B   |      0 B   |      0 B   |\n"
    "|---------------------------------------------------------------------------|\n"
    "| GPU reserved memory   |      0 B   |      0 B   |      0 B   |      0 B   |\n"
    "|       from large pool |      0 B   |      0 B   |      0 B   |      0 B   |\n"
    "|       from small pool |      0 B   |      0 B   |      0 B   |      0 B   |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Non-releasable memory |      0 B   |      0 B   |      0 B   |      0 B   |\n"
    "|       from large pool |      0 B   |      0 B   |      0 B   |      0 B   |\n"
    "|       from small pool |      0 B   |      0 B   |      0 B   |      0 B   |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Allocations           |       0    |       0    |       0    |       0    |\n"
    "|       from large pool |       0    |       0    |       0    |       0    |\n"
    "|       from small pool |       0    |       0    |       0    |       0    |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Active allocs         |       0    |       0    |       0    |       0    |\n"
    "|       from large pool |       0    |       0    |       0    |       0    |\n"
    "|       from small pool |       0    |       0    |       0    |       0    |\n"
    "|---------------------------------------------------------------------------|\n"
    "| GPU reserved segments |       0    |       0    |       0    |       0    |\n"
    "|       from large pool |       0    |       0    |       0    |       0    |\n"
    "|       from small pool |       0    |       0    |       0    |       0    |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Non-releasable allocs |       0    |       0    |       0    |       0    |\n"
    "|       from large pool |       0    |       0    |       0    |       0    |\n"
    "|       from small pool |       0    |       0    |       0    |       0    |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Oversize allocations  |       0    |       0    |       0    |       0    |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Oversize GPU segments |       0    |       0    |       0    |       0    |\n"
    "|===========================================================================|\n";

static const char zero_abbreviated[] =
    "|===========================================================================|\n"
    "|                  PyTorch CUDA memory summary, device ID 0                 |\n"
    "|---------------------------------------------------------------------------|\n"
    "|            CUDA OOMs: 0            |        cudaMalloc retries: 0         |\n"
    "|===========================================================================|\n"
    "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Allocated memory      |      0 B   |      0 B   |      0 B   |      0 B   |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Active memory         |      0 B   |      0 B   |      0 B   |      0 B   |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Requested memory      |      0 B   |      0 B   |      0 B   |      0 B   |\n"
    "|---------------------------------------------------------------------------|\n"
    "| GPU reserved memory   |      0 B   |      0 B   |      0 B   |      0 B   |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Non-releasable memory |      0 B   |      0 B   |      0 B   |      0 B   |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Allocations           |       0    |       0    |       0    |       0    |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Active allocs         |       0    |       0    |       0    |       0    |\n"
    "|---------------------------------------------------------------------------|\n"
    "| GPU reserved segments |       0    |       0    |       0    |       0    |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Non-releasable allocs |       0    |       0    |       0    |       0    |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Oversize allocations  |       0    |       0    |       0    |       0    |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Oversize GPU segments |       0    |       0    |       0    |       0    |\n"
    "|===========================================================================|\n";

static void test_zero_full_exact(void **state)
{
    (void)state;
    tally_stats_t s;
    memset(&s, 0, sizeof s);
    char *t = render(&s, 0, 0);
    assert_string_equal(t, zero_full);
    free(t);
}

static void test_zero_abbreviated_exact(void **state)
{
    (void)state;
    tally_stats_t s;
    memset(&s, 0, sizeof s);
    char *t = render(&s, 0, 1);
    assert_string_equal(t, zero_abbreviated);
    free(t);
    /* Any non-zero flag means abbreviated. */
    t = render(&s, 0, 42);
    assert_string_equal(t, zero_abbreviated);
    free(t);
}

/* Every line is 77 bytes plus '\n' while the numbers fit their cells. */
static void test_line_shape(void **state)
{
    (void)state;
    tally_stats_t s;
    memset(&s, 0, sizeof s);
    s.reserved_bytes[TALLY_POOL_ALL].peak = 123456789;
    s.segment[TALLY_POOL_LARGE].current = 12;
    s.num_ooms = 5;
    for (int ab = 0; ab <= 1; ab++) {
        char *t = render(&s, 3, ab);
        assert_int_equal(count_lines(t), ab ? 29 : 47);
        for (int i = 0; i < count_lines(t); i++) {
            const char *l = line_at(t, i);
            assert_int_equal(strlen(l), 77);
            assert_int_equal(l[0], '|');
            assert_int_equal(l[76], '|');
        }
        assert_int_equal(t[strlen(t) - 1], '\n');
        free(t);
    }
}

static void test_device_in_title(void **state)
{
    (void)state;
    tally_stats_t s;
    memset(&s, 0, sizeof s);
    static const struct {
        int device;
        const char *line;
    } cases[] = {
        {0, "|                  PyTorch CUDA memory summary, device ID 0                 |"},
        {7, "|                  PyTorch CUDA memory summary, device ID 7                 |"},
        {12, "|                  PyTorch CUDA memory summary, device ID 12                |"},
        {123456789, "|                  PyTorch CUDA memory summary, device ID 123456789         |"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *t = render(&s, cases[i].device, 0);
        assert_string_equal(line_at(t, 1), cases[i].line);
        free(t);
    }
}

static void test_ooms_and_retries(void **state)
{
    (void)state;
    tally_stats_t s;
    memset(&s, 0, sizeof s);
    s.num_ooms = 3;
    s.num_alloc_retries = 12345;
    char *t = render(&s, 0, 1);
    assert_string_equal(line_at(t, 3),
                        "|            CUDA OOMs: 3            |        cudaMalloc retries: 12345     |");
    free(t);
    /* Too wide for the 8 columns: the line grows, nothing is cut. */
    s.num_ooms = -2;
    s.num_alloc_retries = 1234567890123;
    t = render(&s, 0, 1);
    assert_string_equal(line_at(t, 3),
                        "|            CUDA OOMs: -2           |        cudaMalloc retries: 1234567890123  |");
    free(t);
}

/* 768 KiB is where a size starts to print in KiB; likewise each unit up. */
static void test_size_units_b_kib(void **state)
{
    (void)state;
    assert_string_equal(size_cell(0), "     0 B  ");
    assert_string_equal(size_cell(512), "   512 B  ");
    assert_string_equal(size_cell(786431), "786431 B  ");
    assert_string_equal(size_cell(786432), "   768 KiB");
    assert_string_equal(size_cell(786432 + 1023), "   768 KiB");
    assert_string_equal(size_cell(1048576), "  1024 KiB");
}

static void test_size_units_kib_mib(void **state)
{
    (void)state;
    assert_string_equal(size_cell(INT64_C(805306367)), "786431 KiB");
    assert_string_equal(size_cell(INT64_C(805306368)), "   768 MiB");
}

static void test_size_units_mib_gib_tib(void **state)
{
    (void)state;
    assert_string_equal(size_cell(INT64_C(824633720831)), "786431 MiB");
    assert_string_equal(size_cell(INT64_C(824633720832)), "   768 GiB");
    assert_string_equal(size_cell(INT64_C(844424930131967)), "786431 GiB");
    assert_string_equal(size_cell(INT64_C(844424930131968)), "   768 TiB");
}

/* PiB is the last unit: values beyond 768 PiB stay in PiB. Near the TiB ->
 * PiB step PyTorch compares a float, and (2^60 * 3/4) - 64 rounds up to the
 * threshold: 64 values just under it already print as 767 PiB. */
static void test_size_units_pib_and_beyond(void **state)
{
    (void)state;
    int64_t tib_to_pib = INT64_C(3) << 58; /* 768 * 2^50 */
    assert_string_equal(size_cell(tib_to_pib - 65), "786431 TiB");
    assert_string_equal(size_cell(tib_to_pib - 64), "   767 PiB");
    assert_string_equal(size_cell(tib_to_pib - 1), "   767 PiB");
    assert_string_equal(size_cell(tib_to_pib), "   768 PiB");
    assert_string_equal(size_cell(INT64_MAX), "  8191 PiB");
}

static void test_count_units(void **state)
{
    (void)state;
    assert_string_equal(count_cell(0), "      0   ");
    assert_string_equal(count_cell(749999), " 749999   ");
    assert_string_equal(count_cell(750000), "    750 K ");
    assert_string_equal(count_cell(749999999), " 749999 K ");
    assert_string_equal(count_cell(750000000), "    750 M ");
    /* M is the last unit. */
    assert_string_equal(count_cell(INT64_C(9999999000000)), "9999999 M ");
}

/* A number wider than its cell is printed whole and pushes the line out. */
static void test_too_wide_for_cell(void **state)
{
    (void)state;
    tally_stats_t s;
    memset(&s, 0, sizeof s);
    s.allocation[TALLY_POOL_ALL].current = INT64_C(10000000000000);
    s.allocated_bytes[TALLY_POOL_ALL].current = 0;
    s.allocated_bytes[TALLY_POOL_LARGE].current = INT64_C(5497558138880); /* 5 TiB under a 0 B "all" */
    char *t = render(&s, 0, 0);
    assert_string_equal(line_at(t, ROW_ALLOCATIONS),
                        "| Allocations           | 10000000 M  |       0    |       0    |       0    |");
    assert_string_equal(line_at(t, ROW_ALLOCATED + 1),
                        "|       from large pool | 5497558138880 B   |      0 B   |      0 B   |      0 B   |");
    free(t);
    assert_string_equal(count_cell(INT64_MAX), "9223372036854 M ");
    assert_string_equal(size_cell(INT64_MIN), "-9223372036854775808 B  ");
}

/* Pool rows are scaled by the unit of the "all" row above them, column by
 * column, and may then print 0. */
static void test_pool_rows_share_unit(void **state)
{
    (void)state;
    tally_stats_t s;
    memset(&s, 0, sizeof s);
    tally_stat_t *a = s.active_bytes;
    a[TALLY_POOL_ALL] = (tally_stat_t){3145728, 3145728, INT64_C(1073741824), 1000};
    a[TALLY_POOL_LARGE] = (tally_stat_t){2097152 + 1023, 2097152, INT64_C(1073741824) - 1000, 0};
    a[TALLY_POOL_SMALL] = (tally_stat_t){1023, 1048576 + 1023, 1000, 1000};
    char *t = render(&s, 0, 0);
    int row = ROW_ALLOCATED + 4; /* Active memory */
    assert_string_equal(line_at(t, row),
                        "| Active memory         |   3072 KiB |   3072 KiB |   1024 MiB |   1000 B   |");
    assert_string_equal(line_at(t, row + 1),
                        "|       from large pool |   2048 KiB |   2048 KiB |   1023 MiB |      0 B   |");
    assert_string_equal(line_at(t, row + 2),
                        "|       from small pool |      0 KiB |   1024 KiB |      0 MiB |   1000 B   |");
    free(t);

    /* The same for counts. */
    memset(&s, 0, sizeof s);
    s.segment[TALLY_POOL_ALL].allocated = 2500000;
    s.segment[TALLY_POOL_LARGE].allocated = 1999;
    s.segment[TALLY_POOL_SMALL].allocated = 2498001;
    t = render(&s, 0, 0);
    row = ROW_ALLOCATED + 4 * 7; /* GPU reserved segments */
    assert_string_equal(line_at(t, row),
                        "| GPU reserved segments |       0    |       0    |    2500 K  |       0    |");
    assert_string_equal(line_at(t, row + 1),
                        "|       from large pool |       0    |       0    |       1 K  |       0    |");
    assert_string_equal(line_at(t, row + 2),
                        "|       from small pool |       0    |       0    |    2498 K  |       0    |");
    free(t);
}

/* Current values can dip below zero transiently. A negative reference never
 * reaches a threshold, so it prints in B (or plain counts); a negative pool
 * value under a scaled "all" is floor-divided, as Python's // does. */
static void test_negative_values(void **state)
{
    (void)state;
    assert_string_equal(size_cell(-4096), " -4096 B  ");
    assert_string_equal(size_cell(-1048576), "-1048576 B  ");
    assert_string_equal(count_cell(-5), "     -5   ");
    assert_string_equal(count_cell(-750000), "-750000   ");

    tally_stats_t s;
    memset(&s, 0, sizeof s);
    s.allocated_bytes[TALLY_POOL_ALL].current = 1048576;
    s.allocated_bytes[TALLY_POOL_LARGE].current = -1025;
    s.allocated_bytes[TALLY_POOL_SMALL].current = -1;
    s.allocation[TALLY_POOL_ALL].current = 750000;
    s.allocation[TALLY_POOL_SMALL].current = -1;
    char *t = render(&s, 0, 0);
    assert_string_equal(line_at(t, ROW_ALLOCATED + 1),
                        "|       from large pool |     -2 KiB |      0 B   |      0 B   |      0 B   |");
    assert_string_equal(line_at(t, ROW_ALLOCATED + 2),
                        "|       from small pool |     -1 KiB |      0 B   |      0 B   |      0 B   |");
    assert_string_equal(line_at(t, ROW_ALLOCATIONS + 2),
                        "|       from small pool |      -1 K  |       0    |       0    |       0    |");
    free(t);
    /* An exact multiple divides exactly: -1024 B is -1 KiB and -1000 is -1 K, not one lower. */
    memset(&s, 0, sizeof s);
    s.active_bytes[TALLY_POOL_ALL].current = 1048576;
    s.active_bytes[TALLY_POOL_LARGE].current = -1024;
    s.allocation[TALLY_POOL_ALL].current = 750000;
    s.allocation[TALLY_POOL_LARGE].current = -1000;
    t = render(&s, 0, 0);
    assert_string_equal(line_at(t, ROW_ALLOCATED + 4 + 1),
                        "|       from large pool |     -1 KiB |      0 B   |      0 B   |      0 B   |");
    assert_string_equal(line_at(t, ROW_ALLOCATIONS + 1),
                        "|       from large pool |      -1 K  |       0    |       0    |       0    |");
    free(t);
}

/* The oversize rows have no pools; each value is its own reference. */
static void test_oversize_rows(void **state)
{
    (void)state;
    tally_stats_t s;
    memset(&s, 0, sizeof s);
    s.oversize_allocations = (tally_stat_t){750000, 3, 749999999, 750000000};
    s.oversize_segments = (tally_stat_t){1, 2, 1500, 1499};
    char *t = render(&s, 0, 0);
    assert_string_equal(line_at(t, ROW_OVERSIZE_ALLOCS),
                        "| Oversize allocations  |     750 K  |       3    |  749999 K  |     750 M  |");
    assert_string_equal(line_at(t, ROW_OVERSIZE_SEGS),
                        "| Oversize GPU segments |       1    |       2    |    1500    |    1499    |");
    free(t);
    /* The abbreviated table keeps them. */
    t = render(&s, 0, 1);
    assert_string_equal(line_at(t, 25),
                        "| Oversize allocations  |     750 K  |       3    |  749999 K  |     750 M  |");
    free(t);
}

/* Each metric reads its own stat: give each a distinct value and check the
 * row order of the table (which is not the order of the stats struct). */
static void test_rows_map_to_stats(void **state)
{
    (void)state;
    tally_stats_t s;
    memset(&s, 0, sizeof s);
    s.allocated_bytes[TALLY_POOL_ALL].current = 1;
    s.active_bytes[TALLY_POOL_ALL].current = 2;
    s.requested_bytes[TALLY_POOL_ALL].current = 3;
    s.reserved_bytes[TALLY_POOL_ALL].current = 4;
    s.inactive_split_bytes[TALLY_POOL_ALL].current = 5;
    s.allocation[TALLY_POOL_ALL].current = 6;
    s.active[TALLY_POOL_ALL].current = 7;
    s.segment[TALLY_POOL_ALL].current = 8;
    s.inactive_split[TALLY_POOL_ALL].current = 9;
    s.allocation[TALLY_POOL_LARGE].peak = 10;
    s.allocation[TALLY_POOL_SMALL].freed = 11;
    char *t = render(&s, 0, 1);
    static const char *const rows[] = {
        "| Allocated memory      |      1 B   |      0 B   |      0 B   |      0 B   |",
        "| Active memory         |      2 B   |      0 B   |      0 B   |      0 B   |",
        "| Requested memory      |      3 B   |      0 B   |      0 B   |      0 B   |",
        "| GPU reserved memory   |      4 B   |      0 B   |      0 B   |      0 B   |",
        "| Non-releasable memory |      5 B   |      0 B   |      0 B   |      0 B   |",
        "| Allocations           |       6    |       0    |       0    |       0    |",
        "| Active allocs         |       7    |       0    |       0    |       0    |",
        "| GPU reserved segments |       8    |       0    |       0    |       0    |",
        "| Non-releasable allocs |       9    |       0    |       0    |       0    |",
    };
    for (int i = 0; i < 9; i++)
        assert_string_equal(line_at(t, 7 + 2 * i), rows[i]);
    free(t);
    t = render(&s, 0, 0);
    assert_string_equal(line_at(t, ROW_ALLOCATIONS + 1),
                        "|       from large pool |       0    |      10    |       0    |       0    |");
    assert_string_equal(line_at(t, ROW_ALLOCATIONS + 2),
                        "|       from small pool |       0    |       0    |       0    |      11    |");
    free(t);
}

static void test_render_bad_arguments(void **state)
{
    (void)state;
    tally_stats_t s;
    tu_buf_t b = {0}, diag = {0};
    memset(&s, 0, sizeof s);
    tally_set_sink(tu_buf_write, &diag);
    assert_int_equal(tally__summary_render(NULL, 0, 0, tu_buf_write, &b), -TALLY_EINVAL);
    assert_string_equal(tally_last_error(), "memory summary: stats is NULL");
    assert_int_equal(tally__summary_render(&s, 0, 0, NULL, NULL), -TALLY_EINVAL);
    assert_string_equal(tally_last_error(), "memory summary: write is NULL");
    assert_int_equal(tally_write_summary(0, 0, NULL, NULL), -TALLY_EINVAL);
    assert_string_equal(tally_last_error(), "tally_write_summary: write is NULL");
    tally_set_sink(NULL, NULL);
    assert_int_equal(b.len, 0);
    /* Each failure also went to the diagnostics sink, one line each. */
    assert_int_equal(count_lines(diag.p), 3);
    free(diag.p);
}

static void test_write_summary_public(void **state)
{
    (void)state;
    tu_buf_t b = {0}, diag = {0};
    tally_set_sink(tu_buf_write, &diag);
    assert_true(tally_write_summary(-1, 0, tu_buf_write, &b) < 0);
    tally_set_sink(NULL, NULL);
    free(diag.p);
    assert_int_equal(b.len, 0);
    assert_int_equal(tally_write_summary(0, 1, tu_buf_write, &b), 0);
    assert_non_null(b.p);
    assert_int_equal(count_lines(b.p), 29);
    assert_string_equal(line_at(b.p, 1),
                        "|                  PyTorch CUDA memory summary, device ID 0                 |");
    free(b.p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_zero_full_exact),
        cmocka_unit_test(test_zero_abbreviated_exact),
        cmocka_unit_test(test_line_shape),
        cmocka_unit_test(test_device_in_title),
        cmocka_unit_test(test_ooms_and_retries),
        cmocka_unit_test(test_size_units_b_kib),
        cmocka_unit_test(test_size_units_kib_mib),
        cmocka_unit_test(test_size_units_mib_gib_tib),
        cmocka_unit_test(test_size_units_pib_and_beyond),
        cmocka_unit_test(test_count_units),
        cmocka_unit_test(test_too_wide_for_cell),
        cmocka_unit_test(test_pool_rows_share_unit),
        cmocka_unit_test(test_negative_values),
        cmocka_unit_test(test_oversize_rows),
        cmocka_unit_test(test_rows_map_to_stats),
        cmocka_unit_test(test_render_bad_arguments),
        cmocka_unit_test(test_write_summary_public),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
