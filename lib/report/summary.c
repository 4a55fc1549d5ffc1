/* torch.cuda.memory_summary() text, reproduced byte for byte from a stats
 * snapshot, so tools that read PyTorch's table read ours (PyTorch's own
 * function refuses to run under a pluggable allocator).
 *
 * The layout, as PyTorch prints it: 75 columns between '|' bars, each line
 * ending "|\n"; every cell is 10 wide. Numbers are scaled by a unit picked
 * from a reference value: the "all" row of the same metric and column (so
 * the pool rows below it share its unit), or the value itself for the
 * oversize rows. A number wider than its cell is not cut: the line grows. */
#include "report/report.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>

#define CELL_MAX 32

/* Python's floor division (PyTorch scales with //), which rounds toward
 * minus infinity where C's '/' truncates toward zero. */
static int64_t floor_div(int64_t a, int64_t b)
{
    int64_t q = a / b;
    if (a % b != 0 && a < 0)
        q--;
    return q;
}

/* The unit is raised while the reference, as a double, is at least
 * 768 * 1024 in the current unit. Python divides the reference with '/', so
 * from the first step on it is a float: converting to double here and then
 * halving by 1024 gives the very same numbers (scaling by a power of two is
 * exact, and int-to-double rounds to nearest-even as Python's int / int
 * does), including the rare case of a reference just under a threshold that
 * rounds up to it near 2^60. */
static void format_size(char *buf, int64_t value, int64_t ref)
{
    static const char *const units[] = {"B  ", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double r = (double)ref;
    int u = 0;
    while (u < 5 && !(r < 768.0 * 1024.0)) {
        value = floor_div(value, 1024);
        r /= 1024.0;
        u++;
    }
    snprintf(buf, CELL_MAX, "%6" PRId64 " %s", value, units[u]);
}

/* Counts: steps of 1000 while the reference is at least 750 * 1000, up to
 * "M"; 7 digits, a space, the unit, a space. Dividing by 1000 is inexact,
 * but only references far beyond the next threshold (above 2^53) could round
 * differently from Python, and they step up either way. */
static void format_count(char *buf, int64_t value, int64_t ref)
{
    static const char *const units[] = {" ", "K", "M"};
    double r = (double)ref;
    int u = 0;
    while (u < 2 && !(r < 750.0 * 1000.0)) {
        value = floor_div(value, 1000);
        r /= 1000.0;
        u++;
    }
    snprintf(buf, CELL_MAX, "%7" PRId64 " %s ", value, units[u]);
}

typedef void (*cell_fn)(char *buf, int64_t value, int64_t ref);

static void row(tally_out_t *o, const char *name, const tally_stat_t *v, const tally_stat_t *ref,
                cell_fn cell)
{
    char c[4][CELL_MAX];
    cell(c[0], v->current, ref->current);
    cell(c[1], v->peak, ref->peak);
    cell(c[2], v->allocated, ref->allocated);
    cell(c[3], v->freed, ref->freed);
    tally__out_printf(o, "| %-21s | %s | %s | %s | %s |\n", name, c[0], c[1], c[2], c[3]);
}

static void rule(tally_out_t *o, char c)
{
    char line[80];
    line[0] = '|';
    for (int i = 1; i <= 75; i++)
        line[i] = c;
    line[76] = '|';
    line[77] = '\n';
    tally__out_write(o, line, 78);
}

/* The pool-indexed metrics in the table's order (not the stats' order). */
static const struct {
    size_t off;
    const char *name;
    int bytes;
} metrics[] = {
    {offsetof(tally_stats_t, allocated_bytes), "Allocated memory", 1},
    {offsetof(tally_stats_t, active_bytes), "Active memory", 1},
    {offsetof(tally_stats_t, requested_bytes), "Requested memory", 1},
    {offsetof(tally_stats_t, reserved_bytes), "GPU reserved memory", 1},
    {offsetof(tally_stats_t, inactive_split_bytes), "Non-releasable memory", 1},
    {offsetof(tally_stats_t, allocation), "Allocations", 0},
    {offsetof(tally_stats_t, active), "Active allocs", 0},
    {offsetof(tally_stats_t, segment), "GPU reserved segments", 0},
    {offsetof(tally_stats_t, inactive_split), "Non-releasable allocs", 0},
};

int tally__summary_render(const tally_stats_t *s, int device, int abbreviated,
                          tally_write_fn write, void *arg)
{
    if (!s || !write)
        return tally__fail(TALLY_EINVAL, "memory summary: %s is NULL", s ? "write" : "stats");
    tally_out_t o;
    tally__out_init(&o, write, arg);

    rule(&o, '=');
    tally__out_printf(&o, "|%18sPyTorch CUDA memory summary, device ID %-17d |\n", "", device);
    rule(&o, '-');
    tally__out_printf(&o, "|%12sCUDA OOMs: %-12" PRId64 " |%8scudaMalloc retries: %-8" PRId64 "  |\n",
                      "", s->num_ooms, "", s->num_alloc_retries);
    rule(&o, '=');
    tally__out_puts(&o, "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |\n");

    for (size_t m = 0; m < sizeof metrics / sizeof metrics[0]; m++) {
        const tally_stat_t *arr = (const tally_stat_t *)(const void *)((const char *)s + metrics[m].off);
        cell_fn cell = metrics[m].bytes ? format_size : format_count;
        rule(&o, '-');
        row(&o, metrics[m].name, &arr[TALLY_POOL_ALL], &arr[TALLY_POOL_ALL], cell);
        if (!abbreviated) {
            row(&o, "      from large pool", &arr[TALLY_POOL_LARGE], &arr[TALLY_POOL_ALL], cell);
            row(&o, "      from small pool", &arr[TALLY_POOL_SMALL], &arr[TALLY_POOL_ALL], cell);
        }
    }
    rule(&o, '-');
    row(&o, "Oversize allocations", &s->oversize_allocations, &s->oversize_allocations, format_count);
    rule(&o, '-');
    row(&o, "Oversize GPU segments", &s->oversize_segments, &s->oversize_segments, format_count);
    rule(&o, '=');

    tally__out_flush(&o);
    if (o.failed)
        return tally__fail(TALLY_ENOMEM, "memory summary: out of memory while formatting");
    return 0;
}
