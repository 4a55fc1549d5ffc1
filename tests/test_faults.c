/* Backend failures, and bad input the other test files leave out.
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
 *    total), so no segment leaked or was given back twice.
 * A second test mixes injected failures with requests larger than the
 * device (real OOMs) and one-shot failures (tally_host_fail_alloc(k, 0)).
 *
 * TALLY_TEST_SCALE (0..1] scales the operation counts. */
#include <dirent.h>
#include "testutil.h"
#include "internal.h" /* tally__options_parse, for the known-bug test */

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

/* ---- bad input the other test files do not cover (docs/bad-input.md) ---- */


/* Sizes that are not negative but no device has: an OOM each, counted
 * and reported once, nothing else changes (no overflow in the rounding). */
static void test_bad_input_huge_sizes_are_out_of_memory(void **state)
{
    (void)state;
    static const size_t sizes[] = {(size_t)INT64_MAX, (size_t)1 << 62, (size_t)1 << 40, 80 * GiB + 1};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        tally_stats_t a = tu_stats(1);
        cap_begin();
        assert_null(tally_malloc(sizes[i], 1, NULL));
        cap_end();
        tally_stats_t b = tu_stats(1);
        tu_ctx("size %zu", sizes[i]);
        EQ(b.num_ooms, a.num_ooms + 1);
        EQ(b.reserved_bytes[0].current, a.reserved_bytes[0].current);
        EQ(b.allocation[0].current, a.allocation[0].current);
        HAS(tally_last_error(), "out of memory on device 1");
        char want[96];
        snprintf(want, sizeof want, "tally: out of memory on device 1: asked %zu bytes", sizes[i]);
        HAS(cap_text(), want);
    }
    tu_ctx("%s", "");
    CHECK_OK();
}

/* NULL where a result must go, and bad devices in the calls test_api.c
 * does not try: refused with -TALLY_EINVAL and one line each. */
static void test_bad_input_null_outputs_and_bad_devices(void **state)
{
    (void)state;
    size_t fr = 0, total = 0;
    tally_block_info_t info;
    void *p = tally_malloc(1000, 0, NULL);
    assert_non_null(p);
    cap_begin();
    EQ(tally_mem_get_info(0, NULL, &total), -TALLY_EINVAL);
    EQ(tally_mem_get_info(0, &fr, NULL), -TALLY_EINVAL);
    EQ(tally_mem_get_info(-1, &fr, &total), -TALLY_EINVAL);
    EQ(tally_mem_get_info(2, &fr, &total), -TALLY_EINVAL);
    EQ(tally_block_info(NULL, &info), -TALLY_EINVAL);
    EQ(tally_block_info(p, NULL), -TALLY_EINVAL);
    EQ(tally_set_memory_fraction(0.5, 2), -TALLY_EINVAL);
    EQ(tally_set_memory_fraction(0.5, -1), -TALLY_EINVAL);
    EQ(tally_empty_cache(-2), 0);
    EQ(tally_empty_cache(2), 0);
    EQ(tally_write_summary(2, 0, tu_buf_write, &(tu_buf_t){0}), -TALLY_EINVAL);
    EQ(tally_write_ledger(NULL, NULL), -TALLY_EINVAL);
    EQ(tally_write_leaks(1, NULL, NULL), -TALLY_EINVAL);
    EQ(tally_write_options(NULL, NULL), -TALLY_EINVAL);
    EQ(tally_write_stats_json(0, NULL, NULL), -TALLY_EINVAL);
    EQ(tally_record_stream(NULL, STREAM(1)), -TALLY_EINVAL);
    cap_end();
    EQ(cap_lines(), 16);
    HAS(cap_text(), "tally_mem_get_info: NULL argument");
    HAS(cap_text(), "tally_empty_cache: device -2 does not exist");
    HAS(cap_text(), "tally_write_ledger: write is NULL");
    /* block_info of a pointer that is not a live block is quiet: it is how
     * callers ask "is this tally's?" */
    cap_begin();
    int on_stack;
    EQ(tally_block_info(&on_stack, &info), -TALLY_EINVAL);
    cap_end();
    EQ(cap_lines(), 0);
    HAS(tally_last_error(), "is not a live block");
    tally_free(p);
    CHECK_OK();
}

/* record_stream: the block's own stream and a repeated stream are no-ops;
 * 4096 other streams are remembered, the 4097th is refused. */
static void test_bad_input_record_stream_limits(void **state)
{
    (void)state;
    void *p = tally_malloc(4096, 0, STREAM(1));
    assert_non_null(p);
    EQ(tally_record_stream(p, STREAM(1)), 0);
    EQ(tally_record_stream(p, STREAM(2)), 0);
    EQ(tally_record_stream(p, STREAM(2)), 0);
    for (int i = 0; i < 4095; i++)
        EQ(tally_record_stream(p, STREAM(1000 + i)), 0);
    cap_begin();
    EQ(tally_record_stream(p, STREAM(9000)), -TALLY_EINVAL);
    cap_end();
    EQ(cap_lines(), 1);
    HAS(cap_text(), "already used on 4096 streams");
    tally_free(p); /* 4096 events, none pending: reusable at the next malloc */
    tally_stats_t s = tu_stats(0);
    EQ(s.active[0].current, 1);
    void *q = tally_malloc(4096, 0, STREAM(1));
    EQ(tu_stats(0).active[0].current, 1);
    tally_free(q);
    CHECK_OK();
}

/* The host backend holds at most 64 streams at once. */
static void test_bad_input_too_many_held_streams(void **state)
{
    (void)state;
    for (int i = 0; i < 64; i++)
        EQ(tally_host_stream_hold(STREAM(200 + i), 1), 0);
    EQ(tally_host_stream_hold(STREAM(200), 1), 0); /* again: no new slot */
    cap_begin();
    EQ(tally_host_stream_hold(STREAM(300), 1), -TALLY_ENOMEM);
    cap_end();
    HAS(cap_text(), "more than 64 streams held at once");
    EQ(tally_host_stream_hold(STREAM(301), 0), 0); /* releasing one never held */
    for (int i = 0; i < 64; i++)
        EQ(tally_host_stream_hold(STREAM(200 + i), 0), 0);
    EQ(tally_host_stream_hold(STREAM(300), 1), 0);
    EQ(tally_host_stream_hold(STREAM(300), 0), 0);
}

/* Stages nest at most 64 deep; the 65th begin is refused and changes
 * nothing. */
static void test_bad_input_stage_nesting_limit(void **state)
{
    (void)state;
    char name[32];
    for (int i = 0; i < 64; i++) {
        snprintf(name, sizeof name, "level-%d", i);
        EQ(tally_stage_begin(name), 0);
    }
    cap_begin();
    EQ(tally_stage_begin("one-too-deep"), -TALLY_ESTATE);
    cap_end();
    HAS(cap_text(), "stages nested more than 64 deep");
    void *p = tally_malloc(100, 0, NULL);
    EQ(strcmp(tally_stage_name(tu_info(p).stage), "level-63"), 0);
    tally_free(p);
    cap_begin(); /* the survivor reports */
    for (int i = 63; i >= 0; i--) {
        snprintf(name, sizeof name, "level-%d", i);
        EQ(tally_stage_end(name), 0);
    }
    cap_end();
    EQ(tally_stage_end("level-0"), -TALLY_ESTATE);
}

/* The names reports use for "none" can be pushed: they are the same ids. */
static void test_bad_input_reserved_names_alias_the_defaults(void **state)
{
    (void)state;
    EQ(tally_tag_push("untagged"), 0);
    EQ(tally_stage_begin("(none)"), 0);
    void *p = tally_malloc(100, 0, NULL);
    tally_block_info_t i = tu_info(p);
    EQ(i.tag, 0);
    EQ(i.stage, 0);
    tally_free(p);
    cap_begin();
    EQ(tally_stage_end("(none)"), 0);
    cap_end();
    EQ(tally_tag_pop(), 0);
}

typedef struct fifo_reader {
    char path[300];
    char head[64];
    size_t total;
} fifo_reader_t;

static void *read_fifo(void *arg)
{
    fifo_reader_t *r = arg;
    FILE *f = fopen(r->path, "r");
    if (!f)
        return NULL;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        if (!r->total)
            snprintf(r->head, sizeof r->head, "%.*s", (int)(n < 40 ? n : 40), buf);
        r->total += n;
    }
    fclose(f);
    return NULL;
}

/* Report paths: none set, too long, a directory, a missing directory; a
 * FIFO (or /dev/null, /dev/stdout) is written in place rather than
 * replaced by a file; a symlink is followed and stays a symlink. */
static void test_bad_input_report_paths(void **state)
{
    (void)state;
    char dir[] = "/tmp/tally-faults-XXXXXX";
    assert_non_null(mkdtemp(dir));
    cap_begin();
    EQ(tally_write_report(NULL), -TALLY_EINVAL);
    HAS(tally_last_error(), "report_path is not set");
    /* The limit applies to the expanded path. %r is the rank: with RANK at
     * 1000000 (7 digits, whatever the process id) 200 copies of it take
     * 1400 bytes and do not fit in 1024; with RANK 0 the same 400-byte
     * pattern gives a 200-byte name that does. */
    const char *rank0 = getenv("RANK");
    char saved_rank[32] = "";
    if (rank0)
        snprintf(saved_rank, sizeof saved_rank, "%s", rank0);
    char longpath[700];
    int at = snprintf(longpath, sizeof longpath, "%s/%%p", dir);
    for (int i = 0; i < 200; i++)
        at += snprintf(longpath + at, sizeof longpath - (size_t)at, "%%r");
    setenv("RANK", "1000000", 1);
    EQ(tally_write_report(longpath), -TALLY_EINVAL);
    HAS(tally_last_error(), "tally_write_report: path '");
    HAS(tally_last_error(), "/%p%r%r");
    HAS(tally_last_error(), "is too long");
    setenv("RANK", "0", 1);
    EQ(tally_write_report(longpath), 0);
    char written[320];
    at = snprintf(written, sizeof written, "%s/%d", dir, (int)getpid());
    for (int i = 0; i < 200; i++)
        at += snprintf(written + at, sizeof written - (size_t)at, "0");
    assert_int_equal(unlink(written), 0);
    if (rank0)
        setenv("RANK", saved_rank, 1);
    else
        unsetenv("RANK");
    EQ(tally_write_report(dir), -TALLY_EIO);
    EQ(tally_write_report("/nonexistent-tally-dir/r.json"), -TALLY_EIO);
    cap_end();
    EQ(cap_lines(), 4);

    fifo_reader_t r = {.total = 0};
    snprintf(r.path, sizeof r.path, "%s/fifo", dir);
    assert_int_equal(mkfifo(r.path, 0600), 0);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, read_fifo, &r), 0);
    EQ(tally_write_report(r.path), 0);
    pthread_join(t, NULL);
    struct stat st;
    assert_int_equal(lstat(r.path, &st), 0);
    if (!S_ISFIFO(st.st_mode))
        fail_msg("tally_write_report replaced the FIFO %s with a file (it would replace /dev/null too)", r.path);
    assert_true(r.total > 100);
    HAS(r.head, "{\"format\":\"tally-report\"");

    char target[320], link[320];
    snprintf(target, sizeof target, "%s/target.json", dir);
    snprintf(link, sizeof link, "%s/link.json", dir);
    FILE *f = fopen(target, "w");
    assert_non_null(f);
    fputs("old", f);
    fclose(f);
    assert_int_equal(symlink("target.json", link), 0);
    EQ(tally_write_report(link), 0);
    assert_int_equal(lstat(link, &st), 0);
    if (!S_ISLNK(st.st_mode))
        fail_msg("tally_write_report replaced the symlink %s with a file", link);
    f = fopen(target, "r");
    char head[40] = "";
    assert_non_null(f);
    assert_true(fread(head, 1, sizeof head - 1, f) > 0);
    fclose(f);
    HAS(head, "{\"format\":\"tally-report\"");
    remove(link);
    remove(target);
    remove(r.path);
    rmdir(dir);
}

/* The report's temporary file is created exclusively under a name nobody
 * can predict: a symlink planted at the old name (REPORT.tmpPID) in a shared
 * directory, pointing at another file, is left alone, the linked file is
 * not written, and no temporary file is left behind. */
static void test_report_temp_file_ignores_planted_links(void **state)
{
    (void)state;
    char dir[] = "/tmp/tally-plant-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char victim[320], report[320], planted[360];
    snprintf(victim, sizeof victim, "%s/victim", dir);
    snprintf(report, sizeof report, "%s/report.json", dir);
    snprintf(planted, sizeof planted, "%s.tmp%d", report, (int)getpid());
    FILE *f = fopen(victim, "w");
    assert_non_null(f);
    fputs("precious", f);
    fclose(f);
    assert_int_equal(symlink(victim, planted), 0);
    EQ(tally_write_report(report), 0);
    EQ(tally_write_report(report), 0);
    char head[40] = "";
    f = fopen(victim, "r");
    assert_non_null(f);
    assert_true(fread(head, 1, sizeof head - 1, f) > 0);
    fclose(f);
    if (strcmp(head, "precious") != 0)
        fail_msg("the report was written through the planted link %s into %s: %s", planted, victim, head);
    struct stat st;
    assert_int_equal(lstat(planted, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    f = fopen(report, "r");
    assert_non_null(f);
    memset(head, 0, sizeof head);
    assert_true(fread(head, 1, sizeof head - 1, f) > 0);
    fclose(f);
    HAS(head, "{\"format\":\"tally-report\"");
    /* Only the three names: the victim, the link, the report. */
    DIR *d = opendir(dir);
    assert_non_null(d);
    int names = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.') {
            names++;
            if (strstr(e->d_name, ".tmp-"))
                fail_msg("a temporary file was left behind: %s", e->d_name);
        }
    closedir(d);
    EQ(names, 3);
    remove(planted);
    remove(victim);
    remove(report);
    rmdir(dir);
}

/* Configuration strings test_api.c does not try: PyTorch keys tally has
 * no use for, strings and values over their limits, blanks. */
static void test_bad_input_configuration_strings(void **state)
{
    (void)state;
    char *before = tu_options_text();
    cap_begin();
    EQ(tally_configure("pinned_use_cuda_host_register:True"), -TALLY_ECONF);
    HAS(tally_last_error(), "'pinned_use_cuda_host_register' (a PyTorch setting) is not supported by tally");
    EQ(tally_configure("release_lock_on_cudamalloc:true"), -TALLY_ECONF);
    HAS(tally_last_error(), "not supported by tally");
    static char big[5000];
    memset(big, 'x', sizeof big - 1);
    memcpy(big, "stage_report:", 13);
    EQ(tally_configure(big), -TALLY_ECONF);
    HAS(tally_last_error(), "longer than 4096 characters");
    static char path[600] = "report_path:/tmp/";
    memset(path + strlen(path), 'r', sizeof path - 1 - strlen(path));
    EQ(tally_configure(path), -TALLY_ECONF);
    HAS(tally_last_error(), "report_path: value longer than 511 characters");
    cap_end();
    EQ(cap_lines(), 4);
    char *after = tu_options_text();
    assert_string_equal(before, after);
    free(after);
    /* Blanks around items and empty items are fine. */
    EQ(tally_configure("  stage_report:false , ,leak_report:off  ,"), 0);
    after = tu_options_text();
    HAS(after, "stage_report:false");
    free(after);
    EQ(tally_configure("stage_report:true"), 0);
    free(before);
}

/* Names go into JSON reports: one that is not valid UTF-8 is refused, so
 * every report stays JSON that Python's json module (or any strict reader)
 * accepts (docs/bad-input.md, "Fixed while writing this table"). */
static void test_non_utf8_names_are_refused(void **state)
{
    (void)state;
    char path[] = "/tmp/tally-utf8-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    int rc = tally_tag_push("bad\xff\xfename");
    void *p = tally_malloc(100, 0, NULL);
    if (rc == 0)
        tally_tag_pop();
    EQ(tally_write_report(path), 0);
    tally_free(p);
    size_t n = 0;
    FILE *f = fopen(path, "rb");
    static unsigned char buf[1 << 20];
    n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    remove(path);
    for (size_t i = 0; i < n; i++) {
        unsigned c = buf[i];
        int k = c < 0x80 ? 0 : (c & 0xe0) == 0xc0 && c >= 0xc2 ? 1 : (c & 0xf0) == 0xe0 ? 2
              : (c & 0xf8) == 0xf0 && c <= 0xf4 ? 3 : -1;
        if (k < 0)
            fail_msg("the report is not UTF-8: byte 0x%02x at offset %zu (the name was accepted: %d)", c, i, rc);
        for (int j = 1; j <= k; j++)
            if (i + (size_t)j >= n || (buf[i + (size_t)j] & 0xc0) != 0x80)
                fail_msg("the report is not UTF-8 at offset %zu", i);
        i += (size_t)k;
    }
}

/* tally_write_options promises a form that parses back: the defaults
 * (garbage_collection_threshold and memory_fraction at 0, meaning off)
 * included (docs/bad-input.md, "Fixed while writing this table"). */
static void test_printed_configuration_parses_back(void **state)
{
    (void)state;
    char *text = tu_options_text();
    /* As python/tally/_options.py reads it: text before "    #", joined. */
    tu_buf_t conf = {0};
    tu_buf_write(&conf, "", 0);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        char *hash = strstr(line, "    #");
        if (hash)
            *hash = 0;
        if (conf.len)
            tu_buf_write(&conf, ",", 1);
        tu_buf_write(&conf, line, strlen(line));
    }
    tally_options_t o;
    tally__options_default(&o);
    cap_begin();
    int rc = tally__options_parse(&o, conf.p, false, NULL);
    cap_end();
    if (rc != 0)
        fail_msg("the printed configuration does not parse back: %s", tally_last_error());
    tu_buf_free(&conf);
    free(text);
}

/* The same workloads with expandable_segments:true (lib/expand.c): the
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
        cmocka_unit_test(test_bad_input_huge_sizes_are_out_of_memory),
        cmocka_unit_test(test_bad_input_null_outputs_and_bad_devices),
        cmocka_unit_test(test_bad_input_record_stream_limits),
        cmocka_unit_test(test_bad_input_too_many_held_streams),
        cmocka_unit_test(test_bad_input_stage_nesting_limit),
        cmocka_unit_test(test_bad_input_reserved_names_alias_the_defaults),
        cmocka_unit_test(test_bad_input_report_paths),
        cmocka_unit_test(test_report_temp_file_ignores_planted_links),
        cmocka_unit_test(test_bad_input_configuration_strings),
        cmocka_unit_test(test_non_utf8_names_are_refused),
        cmocka_unit_test(test_printed_configuration_parses_back),
    };
    const struct CMUnitTest expandable_tests[] = {
        cmocka_unit_test(test_fail_every_nth_backend_call),
        cmocka_unit_test(test_injected_and_real_ooms_mixed),
    };
    if (expandable)
        return cmocka_run_group_tests_name("faults (expandable segments)", expandable_tests, NULL, NULL);
    return cmocka_run_group_tests_name("faults", tests, NULL, NULL);
}
