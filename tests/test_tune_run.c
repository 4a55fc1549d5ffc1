/* Tests for tally tune's replays called directly (tools/tune_run.c and
 * tune_run_replay.c, with the model of PyTorch's expandable segments,
 * tools/pt_expand.c, bench/trace.c and the stand-in's cost table compiled
 * in), on traces built in memory:
 * the grid's max_split_size_mb candidates, the worker processes (waiting
 * out a profiler's interrupting signals, the series handed back for a
 * wanted row, the shared table that cannot be mapped, the progress line on
 * a terminal), and the model
 * counting pages as PyTorch does. Nothing here runs the command; expected
 * figures are worked out by hand in the comments. */
#include "../bench/trace.c"
#include "../tools/pt_expand.c"
/* tune_run.c: the grid and the worker processes (its cmp_u64 is pt_expand.c's). */
#define cmp_u64 tune_run_cmp_u64
#include "../tools/tune_run.c"
#undef cmp_u64
#define rows si_cost_rows /* cost.c's table; the tests name their rows "rows" */
#include "../tests/standin/cost.c"
#undef rows

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "skip.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

/* The model of PyTorch's expandable segments counts pages as PyTorch's
 * num_device_alloc / num_device_free do: 20 MiB pages in the large pool,
 * mapped as a request needs them, unmapped (whole pages inside free blocks)
 * only by empty_cache. Worked by hand: A = 30 MiB maps pages 0-1 (one run);
 * B = 30 MiB takes the 10 MiB left in page 1 and maps page 2; after A is
 * freed, empty_cache unmaps page 0 (the only whole page in A's 0-30 MiB);
 * after B is freed, pages 1-2. */
static void test_pytorch_expandable_model_counts_pages(void **state)
{
    (void)state;
    trace_builder_t b;
    trace_t t;
    char err[256];
    assert_int_equal(trace_begin(&b, &t, "hand", err, sizeof err), 0);
    assert_int_equal(trace_add(&b, 'a', 1, 30u << 20, 0, err, sizeof err), 0);
    assert_int_equal(trace_add(&b, 'a', 2, 30u << 20, 0, err, sizeof err), 0);
    assert_int_equal(trace_add(&b, 'f', 1, 0, 0, err, sizeof err), 0);
    assert_int_equal(trace_add(&b, 'e', 0, 0, 0, err, sizeof err), 0);
    assert_int_equal(trace_add(&b, 'f', 2, 0, 0, err, sizeof err), 0);
    assert_int_equal(trace_add(&b, 'e', 0, 0, 0, err, sizeof err), 0);
    trace_end(&b);
    ptx_opts_t o = {.capacity = 80ull << 30};
    ptx_result_t r;
    int64_t reserved[6];
    assert_int_equal(ptx_replay(&t, &o, NULL, &r, reserved, err, sizeof err), 0);
    assert_int_equal(r.pages_mapped, 3);
    assert_int_equal(r.map_calls, 2);
    assert_int_equal(r.pages_unmapped, 3);
    assert_int_equal(r.unmap_calls, 2);
    assert_int_equal(r.segments, 1);
    assert_int_equal(r.peak_reserved, 60 << 20);
    assert_int_equal(r.oom_event, -1);
    static const int64_t want[6] = {40, 60, 60, 40, 40, 0};
    for (int i = 0; i < 6; i++)
        if (reserved[i] != want[i] << 20)
            fail_msg("after event %d: %lld MiB mapped, expected %lld", i, (long long)(reserved[i] >> 20),
                     (long long)want[i]);
    trace_free(&t);
}

/* Replays survive signals: a program that runs tune's replays under a
 * profiler's timer (SIGALRM here, with a handler and no SA_RESTART, every
 * 100 us) sees wait() interrupted over and over; each interruption is
 * waited out, and every row runs as without the timer. */
static volatile sig_atomic_t alarms;
static void count_alarm(int sig)
{
    (void)sig;
    alarms++;
}

/* A churning trace of n allocations of 64 KiB to about 6 MiB, each freed
 * eight allocations later (the last eight kept). */
static void churn_trace(trace_t *t, const char *name, int n)
{
    trace_builder_t b;
    char err[256];
    assert_int_equal(trace_begin(&b, t, name, err, sizeof err), 0);
    for (int k = 0; k < n; k++) {
        assert_int_equal(trace_add(&b, 'a', (uint64_t)(2 * k + 1), (uint64_t)(1 + k % 97) << 16, 0, err, sizeof err), 0);
        if (k > 8)
            assert_int_equal(trace_add(&b, 'f', (uint64_t)(2 * (k - 8) + 1), 0, 0, err, sizeof err), 0);
    }
    trace_end(&b);
}

static void test_replays_wait_out_interrupting_signals(void **state)
{
    (void)state;
    trace_t t;
    char err[256];
    churn_trace(&t, "signals", 600);
    tune_row_t rows[64];
    size_t n = tune_grid(&t, 80ull << 30, rows, 64);
    assert_true(n >= 8);
    n = 8; /* enough workers started and waited for */
    struct sigaction sa = {0}, old;
    sa.sa_handler = count_alarm; /* no SA_RESTART: wait() returns EINTR */
    assert_int_equal(sigaction(SIGALRM, &sa, &old), 0);
    struct itimerval every = {{0, 100}, {0, 100}}, off = {{0, 0}, {0, 0}};
    assert_int_equal(setitimer(ITIMER_REAL, &every, NULL), 0);
    int rc = tune_run(&t, 80ull << 30, rows, n, 2, true, NULL, 0, NULL, err, sizeof err);
    setitimer(ITIMER_REAL, &off, NULL);
    sigaction(SIGALRM, &old, NULL);
    if (rc != 0)
        fail_msg("tune_run under a 100 us timer: %s (%d alarms)", err, (int)alarms);
    assert_true(alarms > 0);
    for (size_t i = 0; i < n; i++)
        if (!rows[i].ok || rows[i].peak_reserved <= 0)
            fail_msg("row %zu (%s) did not run: %s", i, rows[i].setting, rows[i].error);
    /* The replay's own process is waited for the same way: a worker that
     * takes a signal while it waits (the timer above stays in this process,
     * so replay_fresh is called here) reads the row only once the replay has
     * ended, with the figures the run without the timer gave. */
    tune_row_t again[8];
    alarms = 0;
    assert_int_equal(sigaction(SIGALRM, &sa, &old), 0);
    assert_int_equal(setitimer(ITIMER_REAL, &every, NULL), 0);
    for (size_t i = 0; i < n; i++) {
        again[i] = rows[i];
        again[i].ok = false;
        again[i].peak_reserved = 0;
        replay_fresh(&t, NULL, 80ull << 30, &again[i], NULL);
    }
    setitimer(ITIMER_REAL, &off, NULL);
    sigaction(SIGALRM, &old, NULL);
    assert_true(alarms > 0);
    for (size_t i = 0; i < n; i++)
        if (!again[i].ok || again[i].peak_reserved != rows[i].peak_reserved)
            fail_msg("row %zu (%s) replayed under the timer: ok %d, peak %lld, want %lld: %s", i, rows[i].setting,
                     (int)again[i].ok, (long long)again[i].peak_reserved, (long long)rows[i].peak_reserved,
                     again[i].error);
    trace_free(&t);
}

/* The series tune_run hands back for a wanted row is that row's replay:
 * its highest point is the row's own peak reserved, also where other rows
 * of the run peak elsewhere. */
static void test_series_is_the_wanted_rows_own(void **state)
{
    (void)state;
    trace_t t;
    char err[256];
    churn_trace(&t, "series", 300);
    tune_row_t rows[64];
    size_t n = tune_grid(&t, 80ull << 30, rows, 64);
    assert_true(n >= 2);
    assert_int_equal(tune_run(&t, 80ull << 30, rows, n, 2, true, NULL, 0, NULL, err, sizeof err), 0);
    /* A row whose peak no other row shares. */
    size_t pick = n;
    for (size_t i = 0; i < n && pick == n; i++) {
        size_t same = 0;
        for (size_t j = 0; j < n; j++)
            same += rows[j].peak_reserved == rows[i].peak_reserved;
        if (same == 1)
            pick = i;
    }
    if (pick == n)
        fail_msg("no row of %zu peaks alone: the trace cannot tell their series apart", n);
    size_t want[1] = {pick};
    tune_series_t series[1];
    memset(series, 0, sizeof series);
    assert_int_equal(tune_run(&t, 80ull << 30, rows, n, 2, true, want, 1, series, err, sizeof err), 0);
    assert_int_equal(series[0].n, t.nev);
    assert_non_null(series[0].reserved);
    int64_t top = 0;
    for (size_t e = 0; e < series[0].n; e++)
        if (series[0].reserved[e] > top)
            top = series[0].reserved[e];
    if (top != rows[pick].peak_reserved)
        fail_msg("row %zu (%s) peaks at %lld, its series at %lld", pick, rows[pick].setting,
                 (long long)rows[pick].peak_reserved, (long long)top);
    free(series[0].reserved);
    trace_free(&t);
}

/* tune_run's shared table cannot be had (its size past the address
 * space: series of 2^44 rows asked): -1, as tune.h says, and err says
 * which mapping failed; no row is run. */
static void test_run_without_its_shared_table_returns_minus_one(void **state)
{
    (void)state;
    trace_builder_t b;
    trace_t t;
    char err[256] = "";
    assert_int_equal(trace_begin(&b, &t, "no-table", err, sizeof err), 0);
    assert_int_equal(trace_add(&b, 'a', 1, 1 << 20, 0, err, sizeof err), 0);
    assert_int_equal(trace_add(&b, 'f', 1, 0, 0, err, sizeof err), 0);
    trace_end(&b);
    tune_row_t row;
    memset(&row, 0, sizeof row);
    size_t want[1] = {0};
    tune_series_t series[1];
    memset(series, 0, sizeof series);
    int rc = tune_run(&t, 80ull << 30, &row, 1, 1, true, want, (size_t)1 << 44, series, err, sizeof err);
    assert_int_equal(rc, -1);
    if (strncmp(err, "mmap of ", 8) != 0)
        fail_msg("err is \"%s\", not the mapping's failure", err);
    assert_false(row.ok);
    trace_free(&t);
}

/* The grid's max_split_size_mb candidates are quantiles of the allocations
 * above 20 MiB (PyTorch's least allowed value): blocks of exactly 20 MiB do
 * not count. Ten of 20 MiB and one of 100 MiB give one candidate, 100 (the
 * ten counted would put every quantile on 20 MiB: 21); one of
 * 20 MiB + 512 B and one of 100 MiB give 21 (the value above 20 MiB, rounded
 * up to whole MiB). */
static void expect_split_candidates(int n20, bool just_above, const char *want)
{
    trace_builder_t b;
    trace_t t;
    char err[256], got[256] = "";
    assert_int_equal(trace_begin(&b, &t, "split", err, sizeof err), 0);
    uint64_t id = 1;
    for (int i = 0; i < n20; i++)
        assert_int_equal(trace_add(&b, 'a', id++, 20u << 20, 0, err, sizeof err), 0);
    if (just_above)
        assert_int_equal(trace_add(&b, 'a', id++, (20u << 20) + 512, 0, err, sizeof err), 0);
    assert_int_equal(trace_add(&b, 'a', id++, 100u << 20, 0, err, sizeof err), 0);
    trace_end(&b);
    tune_row_t grid[64];
    size_t n = tune_grid(&t, 80ull << 30, grid, 64);
    for (size_t i = 0; i < n; i++)
        if (strncmp(grid[i].setting, "max_split_size_mb:", 18) == 0 && !strchr(grid[i].setting, ','))
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%s", got[0] ? " " : "", grid[i].setting + 18);
    if (strcmp(got, want) != 0)
        fail_msg("%d blocks of 20 MiB%s and one of 100 MiB: candidates '%s', want '%s'", n20,
                 just_above ? ", one of 20 MiB + 512 B" : "", got, want);
    trace_free(&t);
}

/* On a terminal (stderr a tty, not quiet) tune_run redraws a progress line
 * as each replay ends, then prints its summary; both name the workers in
 * the right number: "1 worker", "2 workers". stderr is pointed at a
 * pseudo-terminal for the run and read back from its master side. */
static void progress_on_a_terminal(const trace_t *t, tune_row_t *rows, size_t n, int jobs, char *out, size_t cap)
{
    int master = posix_openpt(O_RDWR | O_NOCTTY);
    if (master < 0 || grantpt(master) || unlockpt(master))
        SKIP("no pseudo-terminal to point stderr at: %s", strerror(errno));
    int slave = open(ptsname(master), O_RDWR | O_NOCTTY);
    assert_true(slave >= 0);
    fflush(stderr);
    int saved = dup(2);
    assert_true(saved >= 0);
    assert_int_equal(dup2(slave, 2), 2);
    char err[256];
    int rc = tune_run(t, 80ull << 30, rows, n, jobs, false, NULL, 0, NULL, err, sizeof err);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(slave);
    if (rc != 0)
        fail_msg("tune_run on a terminal: %s", err);
    /* Everything written is in the master's buffer (a few hundred bytes). */
    assert_int_equal(fcntl(master, F_SETFL, O_NONBLOCK), 0);
    size_t len = 0;
    ssize_t got;
    while (len + 1 < cap && (got = read(master, out + len, cap - 1 - len)) > 0)
        len += (size_t)got;
    out[len] = 0;
    close(master);
}

static void test_progress_on_a_terminal_names_the_workers(void **state)
{
    (void)state;
    trace_t t;
    churn_trace(&t, "tty", 40); /* 40 allocations, 31 frees */
    tune_row_t rows[64];
    size_t n = tune_grid(&t, 80ull << 30, rows, 64);
    assert_true(n >= 2);
    n = 2;
    char out[4096];
    progress_on_a_terminal(&t, rows, n, 1, out, sizeof out);
    if (!strstr(out, "\rtally tune: 1/2 settings replayed (1 worker, ") ||
        !strstr(out, "\rtally tune: 2/2 settings replayed (1 worker, ") ||
        !strstr(out, "tally tune: 2 settings replayed, 71 events each, 1 worker, "))
        fail_msg("one worker, on the terminal:\n%s", out);
    progress_on_a_terminal(&t, rows, n, 2, out, sizeof out);
    if (!strstr(out, "\rtally tune: 2/2 settings replayed (2 workers, ") ||
        !strstr(out, "tally tune: 2 settings replayed, 71 events each, 2 workers, "))
        fail_msg("two workers, on the terminal:\n%s", out);
    trace_free(&t);
}

static void test_split_candidates_are_quantiles_above_20_mib(void **state)
{
    (void)state;
    expect_split_candidates(10, false, "100");
    expect_split_candidates(0, true, "21"); /* both quantiles fall on the lower: (n - 1) x q < 1 */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_run_without_its_shared_table_returns_minus_one),
        cmocka_unit_test(test_series_is_the_wanted_rows_own),
        cmocka_unit_test(test_pytorch_expandable_model_counts_pages),
        cmocka_unit_test(test_replays_wait_out_interrupting_signals),
        cmocka_unit_test(test_split_candidates_are_quantiles_above_20_mib),
        cmocka_unit_test(test_progress_on_a_terminal_names_the_workers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
