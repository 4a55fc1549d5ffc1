/* Tests for tally tune's replays called directly (tools/tune_run.c and
 * tune_run_replay.c, with the model of PyTorch's expandable segments,
 * tools/pt_expand.c, bench/trace.c and the stand-in's cost table compiled
 * in), on traces built in memory:
 * the grid's max_split_size_mb candidates, the worker processes (waiting
 * out a profiler's interrupting signals, the series handed back for a
 * wanted row, the shared table that cannot be mapped, the progress line on
 * a terminal), the model
 * counting pages as PyTorch does, and each row's modelled driver time: the
 * cost of the calls tally's host backend counted, or of the model's pages.
 * Nothing here runs the command; expected figures are worked out by hand in
 * the comments. */
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
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

/* r's modelled driver time is a100 and blackwell microseconds. */
static void expect_driver_us(const tune_row_t *r, double a100, double blackwell)
{
    double a = tune_driver_us(r, SI_COST_A100), bw = tune_driver_us(r, SI_COST_BLACKWELL);
    const tally_host_calls_t *c = &r->host;
    if (fabs(a - a100) > 1e-6 || fabs(bw - blackwell) > 1e-6)
        fail_msg("[%s]: driver time %.2f us (A100), %.2f us (Blackwell); expected %.2f and %.2f. Host calls (tally's rows): %llu "
                 "allocs, %llu frees, %llu reserves, %llu unreserves, %llu maps of %llu handles, %llu unmaps of %llu "
                 "runs and %llu handles, %llu handles reused",
                 r->setting, a, bw, a100, blackwell, (unsigned long long)c->alloc, (unsigned long long)c->free,
                 (unsigned long long)c->reserve, (unsigned long long)c->unreserve, (unsigned long long)c->map,
                 (unsigned long long)c->map_handles, (unsigned long long)c->unmap, (unsigned long long)c->unmap_runs,
                 (unsigned long long)c->unmap_handles, (unsigned long long)c->reused_handles);
}

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
    /* Its row's driver time, a handle per page (tests/standin/cost.c, A100 |
     * Blackwell us): 1 cuMemAddressReserve (19 | 19); 3 cuMemCreate (193 |
     * 13.8) and cuMemMap (1.45 | 1); cuMemSetAccess over 3 mappings (36 |
     * 69); 2 synchronises (20 | 20); cuMemUnmap of 3 mappings (25.6 | 39);
     * 3 cuMemRelease (25.6 | 39). */
    tune_row_t row = {.setting = "expandable_segments:True", .engine = TUNE_PT_EXPAND, .map_runs = r.map_calls, .unmap_runs = r.unmap_calls,
                      .pages_mapped = r.pages_mapped, .pages_unmapped = r.pages_unmapped, .ranges = r.segments};
    expect_driver_us(&row, 19 + 579 + 4.35 + 108 + 40 + 76.8 + 76.8, 19 + 41.4 + 3 + 207 + 40 + 117 + 117);
    trace_free(&t);
}

/* A trace of allocations (size > 0) and frees (size 0) of ids, then an
 * empty_cache ('e'), on stream 0. */
static void hand_trace(trace_t *t, const char *name, const uint64_t (*ev)[2], size_t n, bool release)
{
    trace_builder_t b;
    char err[256];
    assert_int_equal(trace_begin(&b, t, name, err, sizeof err), 0);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(trace_add(&b, ev[i][1] ? 'a' : 'f', ev[i][0], ev[i][1], 0, err, sizeof err), 0);
    if (release)
        assert_int_equal(trace_add(&b, 'e', 0, 0, 0, err, sizeof err), 0);
    trace_end(&b);
}

/* tally's row replayed (in a worker process, as tune runs it), with its peak. */
static tune_row_t replay_tally(const trace_t *t, const char *setting, int64_t peak_mib)
{
    tune_row_t r;
    memset(&r, 0, sizeof r);
    snprintf(r.setting, sizeof r.setting, "%s", setting);
    r.engine = TUNE_TALLY;
    replay_fresh(t, NULL, 80ull << 30, &r, NULL);
    if (!r.ok)
        fail_msg("[%s] did not run: %s", setting, r.error);
    if (r.peak_reserved != peak_mib << 20)
        fail_msg("[%s] peaks at %lld MiB, expected %lld", setting, (long long)(r.peak_reserved >> 20),
                 (long long)peak_mib);
    return r;
}

/* tally's rows cost the driver calls the cuda backend makes for what the
 * host backend was asked (cost.c's figures, A100 | Blackwell us: cuMemAlloc
 * 230.45 | 83.8, cuMemFree 51.2 | 78, cuMemAddressReserve and
 * cuMemAddressFree 19 | 19, cuMemCreate 193 | 13.8, cuMemMap 1.45 | 1, per
 * mapping cuMemSetAccess 36 | 69 and cuMemUnmap 25.6 | 39, cuMemRelease
 * 25.6 | 39, a synchronise 20 | 20), whatever the reserved bytes show.
 *
 * Five blocks of 1 MiB and one of 30 MiB, freed, then empty_cache. The
 * default: 2 MiB small segments for 1+2, 3+4 and 5 and a 30 MiB one, 4
 * cuMemAlloc and 4 cuMemFree. Expandable segments: the small pool's run
 * reserves its range and maps pages 0, 1 and 2 (for blocks 1, 3 and 5) in
 * three calls, a handle per page; the 30 MiB block reserves the large
 * range and maps 20 pages (its growth chunk, 40 MiB) as two handles, one
 * per 20 MiB cell of expandable_handle_grid_mb, in two calls; empty_cache
 * unmaps the run's 3 pages in one call (one run, 3 handles) and the large
 * range's 20 pages (one run, two handles), and gives both ranges back. 2
 * reserves and address frees, 5 handles created and mapped, access over 5
 * mappings in 5 calls, 2 synchronises, cuMemUnmap of 5 mappings, 5
 * releases. Counted as the reserved bytes' steps with a
 * handle per map call and a range per stream, as tune did, it would be 2
 * releases, 2 mappings unmapped, 1 range and no address free.
 *
 * Moves unlimited: 10 MiB blocks 1 and 2 map pages 0-4 and 5-9 (two calls,
 * a handle per page); block 1 freed leaves 0-4 idle and mapped; the 14 MiB
 * block 3 fits no free block, goes at 20 MiB and needs 7 pages with no room
 * under the 20 MiB high-water mark, so a move unmaps the idle run (one
 * call, 5 handles kept) and one call maps the 7 pages, 5 of them on the
 * kept handles: 24 MiB at the peak. 1 reserve, 17 handles mapped in 3 calls
 * of which 12 created, 1 synchronise, cuMemUnmap of 5 mappings, no
 * release. The reserved bytes rose by 12 pages and never fell: the move's
 * unmap and remap net out there. */
static void test_tally_driver_time_is_its_host_calls(void **state)
{
    (void)state;
    static const uint64_t mixed[][2] = {{1, 1 << 20}, {2, 1 << 20}, {3, 1 << 20}, {4, 1 << 20}, {5, 1 << 20},
                                        {6, 30 << 20}, {1, 0}, {2, 0}, {3, 0}, {4, 0}, {5, 0}, {6, 0}};
    trace_t t;
    hand_trace(&t, "mixed", mixed, sizeof mixed / sizeof mixed[0], true);
    tune_row_t r = replay_tally(&t, "", 36);
    expect_driver_us(&r, 4 * 230.45 + 4 * 51.2, 4 * 83.8 + 4 * 78.0);
    r = replay_tally(&t, "expandable_segments:True", 46);
    expect_driver_us(&r, 38 + 38 + 5 * 193 + 5 * 1.45 + 5 * 36 + 40 + 5 * 25.6 + 5 * 25.6,
                     38 + 38 + 5 * 13.8 + 5 * 1.0 + 5 * 69 + 40 + 5 * 39 + 5 * 39);
    trace_free(&t);
    static const uint64_t move[][2] = {{1, 10 << 20}, {2, 10 << 20}, {1, 0}, {3, 14 << 20}};
    hand_trace(&t, "move", move, sizeof move / sizeof move[0], false);
    r = replay_tally(&t, "expandable_segments:True,expandable_move_budget:-1", 24);
    expect_driver_us(&r, 19 + 12 * 193 + 17 * 1.45 + 17 * 36 + 20 + 5 * 25.6,
                     19 + 12 * 13.8 + 17 * 1.0 + 17 * 69 + 20 + 5 * 39);
    trace_free(&t);
}

/* A replay from the recorded state charges the window's calls only: the
 * segments the state stands for were PyTorch's, made before it. The state:
 * a 20 MiB segment with a live 4 MiB block at its base (the trace's first
 * allocation); the window's 12 MiB block fits in the rest, its 30 MiB one
 * takes a new segment. One cuMemAlloc (230.45 | 83.8 us), where counting
 * from before the state was made would charge its 20 MiB segment too. */
static void test_recorded_state_is_not_charged(void **state)
{
    (void)state;
    static const uint64_t ev[][2] = {{1, 4 << 20}, {2, 12 << 20}, {3, 30 << 20}};
    trace_t t;
    hand_trace(&t, "recorded", ev, sizeof ev / sizeof ev[0], false);
    ptx_range_t range = {.addr = 1ull << 30, .size = 20 << 20, .stream = 0, .small = false};
    ptx_live_t live = {.addr = 1ull << 30, .size = 4 << 20, .slot = 0};
    tune_start_t start = {.ranges = &range, .nranges = 1, .live = &live, .nlive = 1, .known = true};
    tune_row_t r;
    memset(&r, 0, sizeof r);
    r.engine = TUNE_BOTH;
    r.from_start = true;
    replay_fresh(&t, &start, 80ull << 30, &r, NULL);
    if (!r.ok)
        fail_msg("the replay from the recorded state did not run: %s", r.error);
    assert_int_equal(r.peak_reserved, 50 << 20);
    expect_driver_us(&r, 230.45, 83.8);
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
        cmocka_unit_test(test_tally_driver_time_is_its_host_calls),
        cmocka_unit_test(test_recorded_state_is_not_charged),
        cmocka_unit_test(test_replays_wait_out_interrupting_signals),
        cmocka_unit_test(test_split_candidates_are_quantiles_above_20_mib),
        cmocka_unit_test(test_progress_on_a_terminal_names_the_workers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
