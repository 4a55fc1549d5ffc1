/* Backend failures.
 *
 * Backend failures: the host backend fails every Nth allocation call
 * (tally_host_fail_alloc(N, N)) for N = 1..50 and some large N, under a
 * randomised workload on two devices (mallocs of every size class on three
 * streams, frees, free_checked, record_stream on held streams, hold
 * releases, empty_cache). For each N:
 *  - nothing crashes, and every 20 operations the allocation counts of
 *    both devices equal the model's live blocks (tally_check() every 100
 *    operations and at the end: the statistics equal a recount);
 *  - every failed backend call is one the injection made (the devices have
 *    80 GiB, far more than the workload uses): injected = floor(calls / N)
 *    where calls = num_device_alloc + num_alloc_retries + num_ooms, and each
 *    injected failure is either retried (num_alloc_retries) or, when the
 *    retry fails too, an OOM;
 *  - every malloc that returned NULL is one OOM in num_ooms and one
 *    "out of memory on device" report on the sink, and the reverse;
 *  - after freeing everything, releasing the streams and empty_cache, the
 *    host backend has all its memory back (tally_mem_get_info: free ==
 *    total), so no segment leaked or was given back twice, and its calls
 *    balance (tally_host_calls: allocations and frees, reserves and
 *    unreserves, pages mapped and unmapped), so no address range was left
 *    reserved with nothing mapped.
 * A second test mixes injected failures with requests larger than the
 * device (real OOMs) and one-shot failures (tally_host_fail_alloc(k, 0)).
 *
 * A third runs the first two again with expandable_segments:true.
 *
 * TALLY_TEST_SCALE (0..1] scales the operation counts. */
#include "testutil.h"

#include <sys/stat.h>
#include <unistd.h>

#define NDEV 2
#define MAXLIVE 160
#define CAPACITY (expandable ? 16 * GiB : 80 * GiB)

static bool expandable; /* this process runs with expandable_segments:true */

static void *const alloc_streams[3] = {NULL, STREAM(1), STREAM(2)};
static void *const use_streams[4] = {STREAM(10), STREAM(11), STREAM(1), STREAM(2)};
#define NHOLD 2 /* use_streams[0..1] get held */

typedef struct live {
    void *p;
    size_t req;
    int dev;
} live_t;

static struct model {
    live_t live[MAXLIVE];
    int nlive;
    int64_t count[NDEV];
    int64_t mallocs, frees, nulls[NDEV], records, empties;
    bool held[NHOLD];
    uint64_t rng;
} M;

/* ---- the sink: counts OOM reports per device ----------------------------- */

static struct {
    pthread_mutex_t lock;
    long oom_reports[NDEV];
    long lines;
} sink_state = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void counting_sink(void *arg, const char *text, size_t len)
{
    (void)arg;
    static const char prefix[] = "tally: out of memory on device ";
    pthread_mutex_lock(&sink_state.lock);
    for (size_t i = 0; i < len; i++)
        sink_state.lines += text[i] == '\n';
    /* A report's first line starts a write (the report is buffered). */
    for (const char *p = text; p + sizeof prefix - 1 < text + len; p++) {
        if (memcmp(p, prefix, sizeof prefix - 1) == 0) {
            int d = p[sizeof prefix - 1] - '0';
            if (d >= 0 && d < NDEV)
                sink_state.oom_reports[d]++;
        }
    }
    pthread_mutex_unlock(&sink_state.lock);
}

static void sink_reset(void)
{
    pthread_mutex_lock(&sink_state.lock);
    memset(sink_state.oom_reports, 0, sizeof sink_state.oom_reports);
    sink_state.lines = 0;
    pthread_mutex_unlock(&sink_state.lock);
    tally_set_sink(counting_sink, NULL);
}

/* ---- random numbers -------------------------------------------------------- */

static uint64_t rnd(void)
{
    uint64_t x = M.rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    M.rng = x;
    return x * 0x2545F4914F6CDD1Dull;
}

static uint64_t below(uint64_t n)
{
    return rnd() % n;
}

/* Small (70%), 1..10 MiB (20 MiB segments), 10..40 MiB (own segments). */
static size_t random_size(void)
{
    uint64_t band = below(100);
    if (band < 70)
        return 1 + below(MiB);
    if (band < 96)
        return MiB + below(9 * MiB);
    return 10 * MiB + below(30 * MiB);
}

/* ---- operations ---------------------------------------------------------- */

static void compare_counts(long op)
{
    for (int d = 0; d < NDEV; d++) {
        tally_stats_t s = tu_stats(d);
        tu_ctx("device %d, operation %ld", d, op);
        EQ(s.allocation[0].current, M.count[d]);
    }
    tu_ctx("%s", "");
}

static void do_malloc(size_t size)
{
    int dev = (int)below(NDEV);
    void *p = tally_malloc(size, dev, alloc_streams[below(3)]);
    M.mallocs++;
    if (!p) {
        if (!strstr(tally_last_error(), "out of memory"))
            fail_msg("malloc(%zu) on device %d failed, not for memory: %s", size, dev, tally_last_error());
        M.nulls[dev]++;
        return;
    }
    if ((uintptr_t)p % 512)
        fail_msg("malloc returned %p, not 512-byte aligned", p);
    assert_true(M.nlive < MAXLIVE);
    M.live[M.nlive++] = (live_t){p, size, dev};
    M.count[dev]++;
}

static void do_free(int i)
{
    live_t l = M.live[i];
    M.live[i] = M.live[--M.nlive];
    if (below(4) == 0)
        assert_int_equal(tally_free_checked(l.p, l.req, l.dev), 0);
    else
        tally_free(l.p);
    M.count[l.dev]--;
    M.frees++;
}

static void do_record(void)
{
    live_t *l = &M.live[below((uint64_t)M.nlive)];
    assert_int_equal(tally_record_stream(l->p, use_streams[below(4)]), 0);
    M.records++;
}

static void do_hold(void)
{
    int h = (int)below(NHOLD);
    M.held[h] = !M.held[h];
    assert_int_equal(tally_host_stream_hold(use_streams[h], M.held[h]), 0);
}

/* empty_cache says how many bytes went back: what reserved fell by. */
static void do_empty_cache(void)
{
    int dev = below(3) == 0 ? -1 : (int)below(NDEV);
    int64_t before = 0, after = 0;
    for (int d = 0; d < NDEV; d++)
        before += tu_stats(d).reserved_bytes[0].current;
    size_t released = tally_empty_cache(dev);
    for (int d = 0; d < NDEV; d++)
        after += tu_stats(d).reserved_bytes[0].current;
    tu_ctx("empty_cache(%d)", dev);
    EQ(released, before - after);
    tu_ctx("%s", "");
    M.empties++;
}

static void free_everything(void)
{
    while (M.nlive)
        do_free(M.nlive - 1);
    for (int h = 0; h < NHOLD; h++) {
        if (M.held[h]) {
            M.held[h] = false;
            assert_int_equal(tally_host_stream_hold(use_streams[h], 0), 0);
        }
    }
}

/* After everything went back: no block, no segment, the backend full. */
static void expect_empty_devices(const char *when)
{
    tally_empty_cache(-1);
    CHECK_OK();
    for (int d = 0; d < NDEV; d++) {
        tally_stats_t s = tu_stats(d);
        tu_ctx("device %d, %s", d, when);
        EQ(s.allocation[0].current, 0);
        EQ(s.active[0].current, 0);
        EQ(s.segment[0].current, 0);
        EQ(s.reserved_bytes[0].current, 0);
        /* (With expandable segments these count map and unmap calls, whose
         * page runs need not pair up.) */
        if (!expandable)
            EQ(s.num_device_alloc - s.num_device_free, 0);
        size_t fr = 0, total = 0;
        assert_int_equal(tally_mem_get_info(d, &fr, &total), 0);
        EQ(total, CAPACITY);
        EQ(fr, total);
        /* The backend's own count: every allocation freed, every range
         * unreserved, every page mapped unmapped (failed calls are not
         * counted there). */
        tally_host_calls_t c;
        assert_int_equal(tally_host_calls(d, &c), 0);
        EQ(c.alloc, c.free);
        EQ(c.reserve, c.unreserve);
        EQ(c.map_pages, c.unmap_pages);
    }
    tu_ctx("%s", "");
}

typedef struct totals {
    int64_t device_alloc, retries, ooms;
} totals_t;

static totals_t totals(void)
{
    totals_t t = {0, 0, 0};
    for (int d = 0; d < NDEV; d++) {
        tally_stats_t s = tu_stats(d);
        t.device_alloc += s.num_device_alloc;
        t.retries += s.num_alloc_retries;
        t.ooms += s.num_ooms;
    }
    return t;
}

/* ops random operations; huge != 0 mixes in requests larger than the
 * device. Returns nothing; checks as it goes. */
static void workload(long ops, bool huge)
{
    for (long op = 1; op <= ops; op++) {
        uint64_t r = below(1000);
        if (M.nlive == 0 || (r < 450 && M.nlive < MAXLIVE))
            do_malloc(huge && below(40) == 0 ? CAPACITY + below(GiB) : random_size());
        else if (r < 880 || M.nlive == MAXLIVE)
            do_free((int)below((uint64_t)M.nlive));
        else if (r < 950)
            do_record();
        else if (r < 990)
            do_hold();
        else
            do_empty_cache();
        if (op % 20 == 0)
            compare_counts(op);
        if (op % 100 == 0)
            CHECK_OK();
    }
    compare_counts(ops);
    CHECK_OK();
}

/* The OOMs the workload saw (NULL returns) against num_ooms and the sink. */
static void expect_ooms_reported(const tally_stats_t before[NDEV], const char *when)
{
    for (int d = 0; d < NDEV; d++) {
        tally_stats_t s = tu_stats(d);
        tu_ctx("device %d, %s", d, when);
        EQ(s.num_ooms - before[d].num_ooms, M.nulls[d]);
        pthread_mutex_lock(&sink_state.lock);
        long reports = sink_state.oom_reports[d];
        pthread_mutex_unlock(&sink_state.lock);
        EQ(reports, M.nulls[d]);
    }
    tu_ctx("%s", "");
}

static void test_fail_every_nth_backend_call(void **state)
{
    (void)state;
    static const uint64_t large[] = {97, 500, 4096, 100000};
    enum { NSMALL = 50, NLARGE = sizeof large / sizeof large[0] };
    long ops = tu_scaled(5000, 400);
    int64_t all_injected = 0, all_ooms = 0, all_retries = 0, all_calls = 0;
    memset(&M, 0, sizeof M);
    M.rng = 0xfa17c0de5eedULL;
    for (int k = 0; k < NSMALL + NLARGE; k++) {
        uint64_t n = k < NSMALL ? (uint64_t)k + 1 : large[k - NSMALL];
        char when[64];
        snprintf(when, sizeof when, "failing every %llu calls", (unsigned long long)n);
        sink_reset();
        memset(M.nulls, 0, sizeof M.nulls);
        /* Live blocks first, so that even N = 1 (every backend call
         * fails) has blocks to free and split pieces to reuse. */
        while (M.nlive < 60)
            do_malloc(random_size());
        tally_stats_t before[NDEV];
        for (int d = 0; d < NDEV; d++)
            before[d] = tu_stats(d);
        totals_t t0 = totals();
        assert_int_equal(tally_host_fail_alloc(n, n), 0);
        workload(ops, false);
        totals_t t1 = totals();
        assert_int_equal(tally_host_fail_alloc(0, 0), 0);
        int64_t calls = (t1.device_alloc - t0.device_alloc) + (t1.retries - t0.retries) + (t1.ooms - t0.ooms);
        int64_t injected = calls / (int64_t)n;
        tu_ctx("%s: %lld backend calls", when, (long long)calls);
        /* Every failed call was injected, and each was retried or, when the
         * retry failed too, ended as an OOM (only N = 1 fails a retry). */
        EQ((t1.retries - t0.retries) + (t1.ooms - t0.ooms), injected);
        EQ(t1.ooms - t0.ooms, n == 1 ? t1.retries - t0.retries : 0);
        expect_ooms_reported(before, when);
        free_everything();
        expect_empty_devices(when);
        all_injected += injected;
        all_ooms += t1.ooms - t0.ooms;
        all_retries += t1.retries - t0.retries;
        all_calls += calls;
    }
    assert_true(all_ooms > 0);
    assert_true(all_injected > 10 * (NSMALL + NLARGE));
    print_message("  %d values of N, %ld operations each: %lld mallocs, %lld frees, %lld record_streams, "
                  "%lld empty_cache; %lld backend calls, %lld injected failures, %lld retries, %lld OOMs\n",
                  NSMALL + NLARGE, ops, (long long)M.mallocs, (long long)M.frees, (long long)M.records,
                  (long long)M.empties, (long long)all_calls, (long long)all_injected, (long long)all_retries,
                  (long long)all_ooms);
    tally_set_sink(NULL, NULL);
}

static void test_injected_and_real_ooms_mixed(void **state)
{
    (void)state;
    long ops = tu_scaled(6000, 600);
    memset(&M, 0, sizeof M);
    M.rng = 0x0bad5eedULL;
    sink_reset();
    tally_stats_t before[NDEV];
    for (int d = 0; d < NDEV; d++)
        before[d] = tu_stats(d);
    static const uint64_t every[] = {1, 2, 3, 7, 0};
    int64_t oneshots = 0;
    for (int round = 0; round < 10; round++) {
        uint64_t e = every[round % 5];
        /* every 0: one failure at the round-th call from now */
        assert_int_equal(tally_host_fail_alloc(e ? e : (uint64_t)round, e), 0);
        oneshots += e == 0;
        workload(ops / 10, true);
    }
    assert_int_equal(tally_host_fail_alloc(0, 0), 0);
    int64_t nulls = M.nulls[0] + M.nulls[1];
    assert_true(nulls > 0);
    expect_ooms_reported(before, "mixed failures");
    free_everything();
    expect_empty_devices("mixed failures");
    print_message("  %ld operations: %lld mallocs (%lld failed), %lld one-shot failures armed\n", ops,
                  (long long)M.mallocs, (long long)nulls, (long long)oneshots);
    tally_set_sink(NULL, NULL);
}

/* A failure while the cache holds free segments: the retry releases them
 * (the backend gets them back) and succeeds; the freed cache is counted. */
static void test_failure_releases_the_cache_then_retries(void **state)
{
    (void)state;
    sink_reset();
    void *p[8];
    for (int i = 0; i < 8; i++)
        assert_non_null(p[i] = tally_malloc(3 * MiB, 0, NULL)); /* 20 MiB segments */
    for (int i = 0; i < 8; i++)
        tally_free(p[i]);
    tally_stats_t s0 = tu_stats(0);
    assert_true(s0.reserved_bytes[0].current > 0);
    assert_int_equal(tally_host_fail_alloc(1, 0), 0);
    void *big = tally_malloc(30 * MiB, 0, NULL); /* needs a new segment */
    assert_non_null(big);
    tally_stats_t s1 = tu_stats(0);
    EQ(s1.num_alloc_retries - s0.num_alloc_retries, 1);
    EQ(s1.num_ooms - s0.num_ooms, 0);
    EQ(s1.num_sync_all_streams - s0.num_sync_all_streams, 1);
    EQ(s1.reserved_bytes[0].current, 30 * MiB); /* the cached segments went back first */
    EQ(sink_state.lines, 0);                    /* a retry that succeeds is silent */
    CHECK_OK();
    tally_free(big);
    memset(&M, 0, sizeof M);
    expect_empty_devices("release then retry");
    tally_set_sink(NULL, NULL);
}

/* With expandable segments (run in the child below): a map call that fails
 * while idle pages are cached unmaps them, retries once and succeeds; the
 * retry is counted, and no OOM. */
static void test_expandable_map_failure_unmaps_idle_pages_then_retries(void **state)
{
    (void)state;
    sink_reset();
    void *p[8];
    for (int i = 0; i < 8; i++)
        assert_non_null(p[i] = tally_malloc(3 * MiB, 0, NULL));
    for (int i = 0; i < 8; i++)
        tally_free(p[i]);
    tally_stats_t s0 = tu_stats(0);
    assert_true(s0.reserved_bytes[0].current > 0); /* idle pages stay mapped */
    assert_int_equal(tally_host_fail_alloc(1, 0), 0);
    void *big = tally_malloc(100 * MiB, 0, NULL); /* more pages than are mapped */
    assert_int_equal(tally_host_fail_alloc(0, 0), 0);
    assert_non_null(big);
    tally_stats_t s1 = tu_stats(0);
    EQ(s1.num_alloc_retries - s0.num_alloc_retries, 1);
    EQ(s1.num_ooms - s0.num_ooms, 0);
    EQ(sink_state.lines, 0); /* a retry that succeeds is silent */
    CHECK_OK();
    tally_free(big);
    memset(&M, 0, sizeof M);
    expect_empty_devices("expandable: release then retry");
    tally_set_sink(NULL, NULL);
}

/* The same workloads with expandable_segments:true (lib/cache/expand.c): the
 * large pool maps 2 MiB pages into one reserved range per stream, and the
 * injected failures hit those map calls. expandable_segments is read at
 * initialisation, so this runs the binary again in a child process. */
static void test_fail_every_nth_with_expandable_segments(void **state)
{
    (void)state;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "/proc/%d/exe --expandable-segments 2>&1", (int)getpid());
    fflush(NULL);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char line[1024], last[1024] = "";
    while (fgets(line, sizeof line, p)) {
        if (strstr(line, "operations") || strstr(line, "ERROR") || strstr(line, "FAILED") || strstr(line, "error"))
            print_message("  [expandable] %s", line);
        snprintf(last, sizeof last, "%s", line);
    }
    int st = pclose(p);
    if (st != 0)
        fail_msg("the expandable_segments run failed (status %d); its last line: %s", st, last);
}

int main(int argc, char **argv)
{
    expandable = argc > 1 && strcmp(argv[1], "--expandable-segments") == 0;
    /* 16 GiB with expandable segments: each stream's region spans the
     * device, and its page tables are walked in full. */
    tu_conf(expandable ? "backend:host,host_devices:2,host_capacity:16GiB,host_mode:virtual,leak_report:off,"
                         "expandable_segments:true"
                       : "backend:host,host_devices:2,host_capacity:80GiB,host_mode:virtual,leak_report:off");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_failure_releases_the_cache_then_retries),
        cmocka_unit_test(test_fail_every_nth_backend_call),
        cmocka_unit_test(test_injected_and_real_ooms_mixed),
        cmocka_unit_test(test_fail_every_nth_with_expandable_segments),
    };
    const struct CMUnitTest expandable_tests[] = {
        cmocka_unit_test(test_expandable_map_failure_unmaps_idle_pages_then_retries),
        cmocka_unit_test(test_fail_every_nth_backend_call),
        cmocka_unit_test(test_injected_and_real_ooms_mixed),
    };
    if (expandable)
        return cmocka_run_group_tests_name("backend_failures (expandable segments)", expandable_tests, NULL, NULL);
    return cmocka_run_group_tests_name("backend_failures", tests, NULL, NULL);
}
