/* Tests for the memory_summary table (report_summary.c), the memory_stats
 * JSON writer and reader (stats_json.c) and the JSON reader (json.c).
 *
 * Expected texts are written out literally: they follow PyTorch's
 * torch.cuda.memory_summary rules (75 columns between bars, 10-wide cells,
 * units picked from the "all" row of the same column with Python's floor
 * division), not whatever the renderer happens to print. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "report.h"

/* ---- helpers ------------------------------------------------------------ */

typedef struct text_buf {
    char *p;
    size_t len, cap;
    int calls;
} text_buf_t;

static void buf_write(void *arg, const char *text, size_t len)
{
    text_buf_t *b = arg;
    if (b->len + len + 1 > b->cap) {
        size_t cap = (b->len + len + 1) * 2;
        char *p = realloc(b->p, cap);
        assert_non_null(p);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, text, len);
    b->len += len;
    b->p[b->len] = 0;
    b->calls++;
}

static char *render(const tally_stats_t *s, int device, int abbreviated)
{
    text_buf_t b = {0};
    assert_int_equal(tally__summary_render(s, device, abbreviated, buf_write, &b), 0);
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
    text_buf_t b = {0}, diag = {0};
    memset(&s, 0, sizeof s);
    tally_set_sink(buf_write, &diag);
    assert_int_equal(tally__summary_render(NULL, 0, 0, buf_write, &b), -TALLY_EINVAL);
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
    text_buf_t b = {0}, diag = {0};
    tally_set_sink(buf_write, &diag);
    assert_true(tally_write_summary(-1, 0, buf_write, &b) < 0);
    tally_set_sink(NULL, NULL);
    free(diag.p);
    assert_int_equal(b.len, 0);
    assert_int_equal(tally_write_summary(0, 1, buf_write, &b), 0);
    assert_non_null(b.p);
    assert_int_equal(count_lines(b.p), 29);
    assert_string_equal(line_at(b.p, 1),
                        "|                  PyTorch CUDA memory summary, device ID 0                 |");
    free(b.p);
}

/* ---- stats JSON --------------------------------------------------------- */

/* torch.cuda.memory_stats() keys in the order it returns them (sorted). */
static const char *const torch_keys[] = {
    "active.all.allocated", "active.all.current",
    "active.all.freed", "active.all.peak",
    "active.large_pool.allocated", "active.large_pool.current",
    "active.large_pool.freed", "active.large_pool.peak",
    "active.small_pool.allocated", "active.small_pool.current",
    "active.small_pool.freed", "active.small_pool.peak",
    "active_bytes.all.allocated", "active_bytes.all.current",
    "active_bytes.all.freed", "active_bytes.all.peak",
    "active_bytes.large_pool.allocated", "active_bytes.large_pool.current",
    "active_bytes.large_pool.freed", "active_bytes.large_pool.peak",
    "active_bytes.small_pool.allocated", "active_bytes.small_pool.current",
    "active_bytes.small_pool.freed", "active_bytes.small_pool.peak",
    "allocated_bytes.all.allocated", "allocated_bytes.all.current",
    "allocated_bytes.all.freed", "allocated_bytes.all.peak",
    "allocated_bytes.large_pool.allocated", "allocated_bytes.large_pool.current",
    "allocated_bytes.large_pool.freed", "allocated_bytes.large_pool.peak",
    "allocated_bytes.small_pool.allocated", "allocated_bytes.small_pool.current",
    "allocated_bytes.small_pool.freed", "allocated_bytes.small_pool.peak",
    "allocation.all.allocated", "allocation.all.current",
    "allocation.all.freed", "allocation.all.peak",
    "allocation.large_pool.allocated", "allocation.large_pool.current",
    "allocation.large_pool.freed", "allocation.large_pool.peak",
    "allocation.small_pool.allocated", "allocation.small_pool.current",
    "allocation.small_pool.freed", "allocation.small_pool.peak",
    "inactive_split.all.allocated", "inactive_split.all.current",
    "inactive_split.all.freed", "inactive_split.all.peak",
    "inactive_split.large_pool.allocated", "inactive_split.large_pool.current",
    "inactive_split.large_pool.freed", "inactive_split.large_pool.peak",
    "inactive_split.small_pool.allocated", "inactive_split.small_pool.current",
    "inactive_split.small_pool.freed", "inactive_split.small_pool.peak",
    "inactive_split_bytes.all.allocated", "inactive_split_bytes.all.current",
    "inactive_split_bytes.all.freed", "inactive_split_bytes.all.peak",
    "inactive_split_bytes.large_pool.allocated", "inactive_split_bytes.large_pool.current",
    "inactive_split_bytes.large_pool.freed", "inactive_split_bytes.large_pool.peak",
    "inactive_split_bytes.small_pool.allocated", "inactive_split_bytes.small_pool.current",
    "inactive_split_bytes.small_pool.freed", "inactive_split_bytes.small_pool.peak",
    "max_split_size", "num_alloc_retries",
    "num_device_alloc", "num_device_free",
    "num_ooms", "num_sync_all_streams",
    "oversize_allocations.allocated", "oversize_allocations.current",
    "oversize_allocations.freed", "oversize_allocations.peak",
    "oversize_segments.allocated", "oversize_segments.current",
    "oversize_segments.freed", "oversize_segments.peak",
    "requested_bytes.all.allocated", "requested_bytes.all.current",
    "requested_bytes.all.freed", "requested_bytes.all.peak",
    "requested_bytes.large_pool.allocated", "requested_bytes.large_pool.current",
    "requested_bytes.large_pool.freed", "requested_bytes.large_pool.peak",
    "requested_bytes.small_pool.allocated", "requested_bytes.small_pool.current",
    "requested_bytes.small_pool.freed", "requested_bytes.small_pool.peak",
    "reserved_bytes.all.allocated", "reserved_bytes.all.current",
    "reserved_bytes.all.freed", "reserved_bytes.all.peak",
    "reserved_bytes.large_pool.allocated", "reserved_bytes.large_pool.current",
    "reserved_bytes.large_pool.freed", "reserved_bytes.large_pool.peak",
    "reserved_bytes.small_pool.allocated", "reserved_bytes.small_pool.current",
    "reserved_bytes.small_pool.freed", "reserved_bytes.small_pool.peak",
    "segment.all.allocated", "segment.all.current",
    "segment.all.freed", "segment.all.peak",
    "segment.large_pool.allocated", "segment.large_pool.current",
    "segment.large_pool.freed", "segment.large_pool.peak",
    "segment.small_pool.allocated", "segment.small_pool.current",
    "segment.small_pool.freed", "segment.small_pool.peak",
};

static char *stats_json(const tally_stats_t *s)
{
    text_buf_t b = {0};
    tally_out_t o;
    tally__out_init(&o, buf_write, &b);
    tally__stats_json(s, &o);
    tally__out_flush(&o);
    assert_non_null(b.p);
    return b.p;
}

/* Deterministic values over the whole int64 range, edges included. */
static int64_t next_value(uint64_t *seed)
{
    *seed = *seed * 6364136223846793005u + 1442695040888963407u;
    uint64_t r = *seed >> 11;
    switch (r % 6) {
    case 0: return (int64_t)(r % 1000);
    case 1: return -(int64_t)(r % 100000);
    case 2: return (int64_t)(*seed);
    case 3: return INT64_MAX;
    case 4: return INT64_MIN;
    default: return (int64_t)(r % (UINT64_C(1) << (r % 62)));
    }
}

static void fill_stats(tally_stats_t *s, uint64_t seed)
{
    memset(s, 0, sizeof *s);
    int64_t *f = (int64_t *)(void *)s;
    /* Every int64 field PyTorch has; the three tally-only figures stay 0. */
    size_t n = offsetof(tally_stats_t, largest_free_block) / sizeof(int64_t);
    for (size_t i = 0; i < n; i++)
        f[i] = next_value(&seed);
}

static void test_stats_json_keys_and_order(void **state)
{
    (void)state;
    tally_stats_t s;
    memset(&s, 0, sizeof s);
    s.max_split_size = -1;
    s.num_ooms = 2;
    s.largest_free_block = 99; /* not a memory_stats key: never written */
    char *t = stats_json(&s);
    size_t nkeys = sizeof torch_keys / sizeof torch_keys[0];
    assert_int_equal(nkeys, 122);
    /* Rebuild the expected text from the literal key list: json.dumps form. */
    text_buf_t want = {0};
    for (size_t i = 0; i < nkeys; i++) {
        char piece[96];
        const char *v = strcmp(torch_keys[i], "max_split_size") == 0 ? "-1"
                        : strcmp(torch_keys[i], "num_ooms") == 0    ? "2"
                                                                    : "0";
        snprintf(piece, sizeof piece, "%s\"%s\": %s", i ? ", " : "{", torch_keys[i], v);
        buf_write(&want, piece, strlen(piece));
    }
    buf_write(&want, "}", 1);
    assert_string_equal(t, want.p);
    assert_null(strstr(t, "largest_free_block"));
    free(want.p);
    free(t);
}

static void test_stats_json_round_trip(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 50; seed++) {
        tally_stats_t s, back;
        char err[256];
        fill_stats(&s, seed);
        char *t = stats_json(&s);
        memset(&back, 0x5a, sizeof back);
        assert_int_equal(tally__stats_from_json(t, strlen(t), &back, err, sizeof err), 0);
        assert_string_equal(err, "");
        assert_memory_equal(&s, &back, sizeof s);
        free(t);
    }
}

static void test_stats_json_lenient_input(void **state)
{
    (void)state;
    static const char text[] =
        " {\"num_ooms\": 2.0, \"unknown\": [1, {\"x\": null}], \"num_alloc_retries\": 1,\n"
        "  \"allocation\": {\"all\": {\"current\": 5, \"peak\": 2e1}, \"huh\": \"ignored\"},\n"
        "  \"oversize_segments\": {\"freed\": -3},\n"
        "  \"reserved_bytes_by_private_pools.0_1.all.current\": 7,\n"
        "  \"num_alloc_retries\": 4} ";
    tally_stats_t s, want;
    char err[256];
    memset(&s, 0x77, sizeof s);
    assert_int_equal(tally__stats_from_json(text, strlen(text), &s, err, sizeof err), 0);
    memset(&want, 0, sizeof want);
    want.num_ooms = 2;
    want.num_alloc_retries = 4; /* the last of a repeated key wins */
    want.allocation[TALLY_POOL_ALL].current = 5;
    want.allocation[TALLY_POOL_ALL].peak = 20;
    want.oversize_segments.freed = -3;
    assert_memory_equal(&s, &want, sizeof s);

    /* Missing keys are 0, not left as they were. */
    memset(&s, 0x77, sizeof s);
    assert_int_equal(tally__stats_from_json("{}", 2, &s, err, sizeof err), 0);
    memset(&want, 0, sizeof want);
    assert_memory_equal(&s, &want, sizeof s);
}

static void expect_stats_error(const char *text, const char *message)
{
    tally_stats_t s, before;
    char err[256];
    memset(&s, 0x33, sizeof s);
    before = s;
    assert_int_equal(tally__stats_from_json(text, strlen(text), &s, err, sizeof err), -TALLY_EINVAL);
    assert_string_equal(err, message);
    assert_memory_equal(&s, &before, sizeof s);
}

static void test_stats_json_errors(void **state)
{
    (void)state;
    expect_stats_error("{\"num_ooms\": 1", "stats JSON: byte 14: unexpected end of input "
                                           "(expected ',' or '}' in the object that starts at byte 0)");
    expect_stats_error("{\"num_ooms\": tru}", "stats JSON: byte 13: invalid literal (expected 'true')");
    expect_stats_error("{\"num_ooms\": 1 2}", "stats JSON: byte 15: expected ',' or '}' in an object, found '2'");
    expect_stats_error("", "stats JSON: byte 0: unexpected end of input (expected a value)");
    expect_stats_error("[1, 2]", "stats JSON: byte 0: expected an object at the top level, got array");
    expect_stats_error("{\"num_ooms\": \"3\"}",
                       "stats JSON: byte 13: key \"num_ooms\": expected an integer, got string");
    expect_stats_error("{\"segment\": {\"all\": {\"peak\": null}}}",
                       "stats JSON: byte 29: key \"segment.all.peak\": expected an integer, got null");
    expect_stats_error("{\"num_ooms\": 1.5}",
                       "stats JSON: byte 13: key \"num_ooms\": expected an integer, got 1.5");
    expect_stats_error("{\"num_ooms\": 9223372036854775808}",
                       "stats JSON: byte 13: key \"num_ooms\": expected an integer, got 9.2233720368547758e+18");
    expect_stats_error("{\"allocation.all.current\": {\"a\": 1}}",
                       "stats JSON: byte 27: key \"allocation.all.current\": expected an integer, got object");
    /* No err buffer: still an error, no crash. */
    tally_stats_t s;
    assert_int_equal(tally__stats_from_json("{", 1, &s, NULL, 0), -TALLY_EINVAL);
    assert_int_equal(tally__stats_from_json(NULL, 0, &s, NULL, 0), -TALLY_EINVAL);
}

/* ---- JSON reader -------------------------------------------------------- */

static tally_json_t *parse_ok(const char *text)
{
    char err[256];
    tally_json_t *v = tally__json_parse(text, strlen(text), err, sizeof err, NULL);
    if (!v)
        fail_msg("parse of <%s> failed: %s", text, err);
    return v;
}

static void test_json_values(void **state)
{
    (void)state;
    tally_json_t *v = parse_ok("\xef\xbb\xbf {\"a\": [1, -2, 3.5, -0, 1e2, true, false, null, \"x\"],"
                               " \"b\": {\"c\": {}}, \"d\": [], \"a2\": 9223372036854775807,"
                               " \"m\": -9223372036854775808, \"big\": 18446744073709551616, \"a\": 7}\r\n");
    assert_int_equal(v->type, TALLY_JSON_OBJECT);
    assert_int_equal(v->len, 7);
    /* A repeated key: the last one wins; the first is still in members. */
    const tally_json_t *a = tally__json_get(v, "a");
    assert_int_equal(a->type, TALLY_JSON_NUMBER);
    assert_int_equal(a->i, 7);
    const tally_json_t *arr = &v->members[0].value;
    assert_int_equal(arr->type, TALLY_JSON_ARRAY);
    assert_int_equal(arr->len, 9);
    assert_true(tally__json_at(arr, 0)->is_int);
    assert_int_equal(tally__json_at(arr, 1)->i, -2);
    assert_false(tally__json_at(arr, 2)->is_int);
    assert_true(tally__json_at(arr, 2)->d == 3.5);
    int64_t x;
    assert_int_equal(tally__json_int(tally__json_at(arr, 2), &x), -1);
    assert_int_equal(tally__json_int(tally__json_at(arr, 3), &x), 0);
    assert_int_equal(x, 0);
    assert_int_equal(tally__json_int(tally__json_at(arr, 4), &x), 0);
    assert_int_equal(x, 100);
    assert_int_equal(tally__json_at(arr, 5)->type, TALLY_JSON_TRUE);
    assert_int_equal(tally__json_at(arr, 6)->type, TALLY_JSON_FALSE);
    assert_int_equal(tally__json_at(arr, 7)->type, TALLY_JSON_NULL);
    assert_string_equal(tally__json_at(arr, 8)->s, "x");
    assert_null(tally__json_at(arr, 9));
    assert_null(tally__json_at(v, 0));
    assert_int_equal(tally__json_int(tally__json_at(arr, 8), &x), -1);
    const tally_json_t *c = tally__json_get(tally__json_get(v, "b"), "c");
    assert_non_null(c);
    assert_int_equal(c->type, TALLY_JSON_OBJECT);
    assert_int_equal(c->len, 0);
    assert_int_equal(tally__json_get(v, "d")->len, 0);
    assert_int_equal(tally__json_get(v, "a2")->i, INT64_MAX);
    assert_int_equal(tally__json_get(v, "m")->i, INT64_MIN);
    const tally_json_t *big = tally__json_get(v, "big");
    assert_false(big->is_int);
    assert_true(big->d == 18446744073709551616.0);
    assert_int_equal(tally__json_int(big, &x), -1);
    assert_null(tally__json_get(v, "nope"));
    assert_null(tally__json_get(arr, "a"));
    assert_string_equal(tally__json_type_name(big->type), "number");
    tally__json_free(v);
    tally__json_free(NULL);
}

static void test_json_strings(void **state)
{
    (void)state;
    tally_json_t *v = parse_ok("[\"q\\\"b\\\\s\\/\\b\\f\\n\\r\\t\", \"\\u00e9\\u20ac\\ud83d\\ude00\","
                               " \"a\\u0000b\", \"\xc3\xa9 raw\", \"\"]");
    assert_string_equal(v->items[0].s, "q\"b\\s/\b\f\n\r\t");
    assert_string_equal(v->items[1].s, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
    assert_int_equal(v->items[2].len, 3);
    assert_memory_equal(v->items[2].s, "a\0b", 4);
    assert_string_equal(v->items[3].s, "\xc3\xa9 raw");
    assert_int_equal(v->items[4].len, 0);
    tally__json_free(v);

    /* A key holding a NUL is found only through the length-taking lookup. */
    v = parse_ok("{\"k\\u0000z\": 1}");
    assert_null(tally__json_get(v, "k"));
    assert_non_null(tally__json_getn(v, "k\0z", 3));
    tally__json_free(v);
}

static void expect_json_error(const char *text, size_t len, size_t offset, const char *message)
{
    char err[256];
    size_t at = 12345;
    tally_json_t *v = tally__json_parse(text, len, err, sizeof err, &at);
    if (v)
        fail_msg("<%s> parsed, expected an error", text);
    assert_string_equal(err, message);
    assert_int_equal(at, offset);
}

#define JSON_ERR(text, offset, message) expect_json_error(text, sizeof text - 1, offset, message)

static void test_json_errors(void **state)
{
    (void)state;
    JSON_ERR("", 0, "byte 0: unexpected end of input (expected a value)");
    JSON_ERR("  \n", 3, "byte 3: unexpected end of input (expected a value)");
    JSON_ERR("{", 1, "byte 1: unexpected end of input (expected a key in the object that starts at byte 0)");
    JSON_ERR("[1,", 3, "byte 3: unexpected end of input (expected a value)");
    JSON_ERR("[1,]", 3, "byte 3: unexpected ']' (expected a value)");
    JSON_ERR("[1 2]", 3, "byte 3: expected ',' or ']' in an array, found '2'");
    JSON_ERR("{\"a\" 1}", 5, "byte 5: expected ':' after the key \"a\", found '1'");
    JSON_ERR("{\"a\"", 4, "byte 4: unexpected end of input (expected ':' after the key \"a\")");
    JSON_ERR("{a:1}", 1, "byte 1: expected a string key in an object, found 'a'");
    JSON_ERR("{\"a\":1,}", 7, "byte 7: expected a string key in an object, found '}'");
    JSON_ERR("\"abc", 4, "byte 4: unexpected end of input inside the string that starts at byte 0");
    JSON_ERR("\"ab\\", 4, "byte 4: unexpected end of input inside the string that starts at byte 0");
    JSON_ERR("\"a\\xb\"", 2, "byte 2: invalid escape \\'x' in a string");
    JSON_ERR("\"\\u12\"", 1, "byte 1: invalid \\u escape (four hex digits expected)");
    JSON_ERR("\"\\u12g4\"", 1, "byte 1: invalid \\u escape (four hex digits expected)");
    JSON_ERR("\"\\ud800\"", 1, "byte 1: unpaired high surrogate \\ud800");
    JSON_ERR("\"\\ud800\\u0041\"", 1, "byte 1: unpaired high surrogate \\ud800");
    JSON_ERR("\"\\udc00\"", 1, "byte 1: unpaired low surrogate \\udc00");
    JSON_ERR("\"a\tb\"", 2, "byte 2: control character 0x09 in a string (it must be escaped)");
    JSON_ERR("\"a\0b\"", 2, "byte 2: control character 0x00 in a string (it must be escaped)");
    JSON_ERR("01", 0, "byte 0: invalid number (leading zero)");
    JSON_ERR("-", 0, "byte 0: invalid number (a digit must follow '-')");
    JSON_ERR("-x", 0, "byte 0: invalid number (a digit must follow '-')");
    JSON_ERR("1.", 0, "byte 0: invalid number (a digit must follow '.')");
    JSON_ERR("1e+", 0, "byte 0: invalid number (a digit must follow the exponent)");
    JSON_ERR("1e999", 0, "byte 0: number out of range");
    JSON_ERR("+1", 0, "byte 0: unexpected '+' (expected a value)");
    JSON_ERR("tru", 3, "byte 3: unexpected end of input inside 'true'");
    JSON_ERR("nul!", 0, "byte 0: invalid literal (expected 'null')");
    JSON_ERR("NaN", 0, "byte 0: unexpected 'N' (expected a value)");
    JSON_ERR("[] x", 3, "byte 3: unexpected 'x' after the end of the JSON value");
    JSON_ERR("{} {}", 3, "byte 3: unexpected '{' after the end of the JSON value");
    JSON_ERR("\x01", 0, "byte 0: unexpected 0x01 (expected a value)");
    JSON_ERR("// c\n1", 0, "byte 0: unexpected '/' (expected a value)");

    /* The length is honoured: bytes after it are never looked at. */
    expect_json_error("[1, 2] trailing", 4, 4, "byte 4: unexpected end of input (expected a value)");
    char err[64];
    tally_json_t *v = tally__json_parse("123xyz", 3, err, sizeof err, NULL);
    assert_non_null(v);
    assert_int_equal(v->i, 123);
    tally__json_free(v);
    /* NULL text, tiny and absent error buffers. */
    assert_null(tally__json_parse(NULL, 10, err, sizeof err, NULL));
    assert_string_equal(err, "byte 0: unexpected end of input (expected a value)");
    assert_null(tally__json_parse("[", 1, err, 5, NULL));
    assert_string_equal(err, "byte");
    assert_null(tally__json_parse("[", 1, NULL, 0, NULL));
}

static void test_json_depth_limit(void **state)
{
    (void)state;
    enum { DEEP = TALLY_JSON_MAX_DEPTH };
    char text[2 * DEEP + 8];
    char err[128];
    /* Exactly the limit parses. */
    memset(text, '[', DEEP);
    memset(text + DEEP, ']', DEEP);
    tally_json_t *v = tally__json_parse(text, 2 * DEEP, err, sizeof err, NULL);
    assert_non_null(v);
    tally__json_free(v);
    /* One more level is refused, at the byte that opens it. */
    memset(text, '[', DEEP + 1);
    memset(text + DEEP + 1, ']', DEEP + 1);
    size_t at = 0;
    v = tally__json_parse(text, 2 * DEEP + 2, err, sizeof err, &at);
    assert_null(v);
    assert_int_equal(at, DEEP);
    assert_non_null(strstr(err, "nesting deeper than 256 levels"));
    /* A huge unclosed nesting is no threat to the stack either. */
    size_t n = 1000000;
    char *big = malloc(n);
    assert_non_null(big);
    memset(big, '{', n);
    assert_null(tally__json_parse(big, n, err, sizeof err, NULL));
    memset(big, '[', n);
    assert_null(tally__json_parse(big, n, err, sizeof err, NULL));
    free(big);
}

/* Every proper prefix of a document, and every single-byte change to it,
 * either parses or fails with a message and an offset within the input. */
static void test_json_mangled_input(void **state)
{
    (void)state;
    static const char doc[] =
        "{\"segments\": [{\"address\": 140234, \"size\": -2.5e-3, \"blocks\": [true, false, null]},"
        " {\"s\": \"\\u00e9\\ud83d\\ude00\\n\"}], \"n\": 12}";
    size_t len = sizeof doc - 1;
    char err[256], *copy = malloc(len);
    size_t at;
    assert_non_null(copy);
    for (size_t cut = 0; cut < len; cut++) {
        memcpy(copy, doc, cut);
        err[0] = 0;
        at = SIZE_MAX;
        assert_null(tally__json_parse(copy, cut, err, sizeof err, &at));
        assert_true(at <= cut);
        assert_true(strncmp(err, "byte ", 5) == 0);
    }
    static const char subst[] = "\"\\{}[],:0-eE.+tu\x01\x80 a";
    for (size_t i = 0; i < len; i++) {
        for (size_t k = 0; k < sizeof subst - 1; k++) {
            memcpy(copy, doc, len);
            copy[i] = subst[k];
            at = SIZE_MAX;
            tally_json_t *v = tally__json_parse(copy, len, err, sizeof err, &at);
            if (v)
                tally__json_free(v);
            else
                assert_true(at <= len && strncmp(err, "byte ", 5) == 0);
        }
    }
    free(copy);
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
        cmocka_unit_test(test_stats_json_keys_and_order),
        cmocka_unit_test(test_stats_json_round_trip),
        cmocka_unit_test(test_stats_json_lenient_input),
        cmocka_unit_test(test_stats_json_errors),
        cmocka_unit_test(test_json_values),
        cmocka_unit_test(test_json_strings),
        cmocka_unit_test(test_json_errors),
        cmocka_unit_test(test_json_depth_limit),
        cmocka_unit_test(test_json_mangled_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
