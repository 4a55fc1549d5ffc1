/* Randomised operations against a model that the library's statistics must
 * match exactly: a million mallocs, frees, record_streams on held streams,
 * stream releases, empty_cache and peak resets on two virtual 80 GiB devices.
 * tally_check() runs every 1000 operations and at the end.
 *
 * The model knows the documented rules, not the allocator's choices: a
 * block's size is the rounded request in the small pool, and in the large
 * pool the rounded request plus at most 1 MiB (an unsplit remainder); which
 * block is picked is not modelled. What it predicts exactly: allocation,
 * allocated_bytes (small pool: the sum of rounded sizes), active,
 * active_bytes, requested_bytes per pool with their peaks (per pool and
 * for both pools: the model takes a peak after every change, the library
 * takes the small fast path's peaks only before a statistic falls or is
 * read), and when a block with stream uses stops being active (its events
 * complete and a malloc on its device, empty_cache or the OOM path looks).
 *
 * TALLY_TEST_SCALE (0..1] scales the operation count (sanitizer builds);
 * TALLY_TEST_SEED picks another seed. */
#include "testutil.h"

#include <time.h>

#include "cache/cache.h"

#define NDEV 2
#define MAXLIVE 2000
#define NHOLD 4 /* streams that get held: bits 0..3 of a use mask */
#define MAXPEND 4096

static void *const alloc_streams[4] = {NULL, STREAM(1), STREAM(2), STREAM(3)};
/* Streams a block may be recorded on: 4 holdable, 1 never held, then the
 * allocation streams 1..3. */
static void *const use_streams[8] = {STREAM(10), STREAM(11), STREAM(12), STREAM(13),
                                     STREAM(14), STREAM(1),  STREAM(2),  STREAM(3)};

typedef struct live {
    void *p;
    size_t req, size;
    int dev, pool, stream; /* stream: index into alloc_streams */
    unsigned uses;         /* bit i: recorded on use_streams[i] */
} live_t;

typedef struct pend {
    int dev, pool;
    size_t req, size;
    int n;                    /* events still waiting on a hold */
    int hold[NHOLD];          /* which holdable stream */
    uint64_t ticket[NHOLD];   /* its generation at the free */
} pend_t;

typedef struct model {
    live_t live[MAXLIVE];
    int nlive;
    pend_t pend[MAXPEND];
    int npend;
    int held[NHOLD];
    uint64_t gen[NHOLD];
    /* per device and pool (index TALLY_POOL_*; 0 = sum) */
    int64_t alloc_n[NDEV][3], alloc_b[NDEV][3], active_n[NDEV][3], active_b[NDEV][3], req_b[NDEV][3];
    int64_t small_rounded[NDEV];
    int64_t peak_alloc_n[NDEV], peak_alloc_b[NDEV];
    int64_t peak[5][NDEV][3]; /* the five statistics of count(), in its order */
    /* The highest inactive_split (0) and inactive_split_bytes (1) seen
     * after an operation, per device and pool: the library's peaks are at
     * least these (a peak reached inside one operation, between a malloc's
     * pending frees and its own split, is not seen here). */
    int64_t split_seen[2][NDEV][3];
    int64_t mallocs[NDEV], frees[NDEV]; /* since the run began */
    tally_stats_t base[NDEV];           /* statistics when it began */
    int64_t retries[NDEV];              /* num_alloc_retries last seen */
    bool faults;
    int64_t empty_calls, records, toggles, resets, pend_peak, live_peak, checks;
    uint64_t rng;
} model_t;

static model_t M;

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

/* 60% small (512 B .. 1 MiB, some under 512), 30% 1..10 MiB, 10% 10..64 MiB;
 * log-uniform within each band, at odd byte counts. */
static size_t random_size(void)
{
    uint64_t band = below(100);
    if (band < 5)
        return 1 + below(511);
    int lo, hi;
    if (band < 60)
        lo = 9, hi = 20;
    else if (band < 90)
        lo = 20, hi = 24; /* 1 .. 16 MiB, folded below 10 MiB */
    else
        lo = 23, hi = 26; /* 8 .. 64 MiB, folded above 10 MiB */
    int e = lo + (int)below((uint64_t)(hi - lo));
    size_t base = (size_t)1 << e;
    size_t s = base + below(base);
    if (band >= 60 && band < 90 && s >= 10 * MiB)
        s = 8 * MiB + below(2 * MiB);
    if (band >= 90 && s < 10 * MiB)
        s = 10 * MiB + below(MiB);
    return s;
}

static int64_t *stat_cur(int k, int dev, int pool)
{
    int64_t(*cur[5])[3] = {M.alloc_n, M.alloc_b, M.active_n, M.active_b, M.req_b};
    return &cur[k][dev][pool];
}

static void count(int dev, int pool, int64_t n_alloc, int64_t b_alloc, int64_t n_act, int64_t b_act, int64_t req)
{
    int idx[2] = {0, pool};
    for (int k = 0; k < 2; k++) {
        M.alloc_n[dev][idx[k]] += n_alloc;
        M.alloc_b[dev][idx[k]] += b_alloc;
        M.active_n[dev][idx[k]] += n_act;
        M.active_b[dev][idx[k]] += b_act;
        M.req_b[dev][idx[k]] += req;
    }
    for (int k = 0; k < 5; k++)
        for (int p = 0; p < 3; p++)
            if (*stat_cur(k, dev, p) > M.peak[k][dev][p])
                M.peak[k][dev][p] = *stat_cur(k, dev, p);
}

/* Pending blocks of dev whose events are all complete leave the active set;
 * with all set, every pending block of dev does (a synchronisation). */
static void resolve(int dev, bool all)
{
    for (int i = 0; i < M.npend;) {
        pend_t *e = &M.pend[i];
        bool done = e->dev == dev;
        for (int k = 0; done && !all && k < e->n; k++)
            if (M.gen[e->hold[k]] == e->ticket[k])
                done = false;
        if (done) {
            count(dev, e->pool, 0, 0, -1, -(int64_t)e->size, -(int64_t)e->req);
            M.pend[i] = M.pend[--M.npend];
        } else {
            i++;
        }
    }
}

/* The split statistics of every device now, read from the device (which
 * takes no peak), into split_seen (reset: set to them). */
static void split_watch(bool reset)
{
    for (int d = 0; d < NDEV; d++)
        for (int k = 0; k < 2; k++) {
            const tally_stats_t *st = &tally__g.dev[d]->stats;
            const tally_stat_t *arr = k ? st->inactive_split_bytes : st->inactive_split;
            int64_t small = tally__stat_now(&arr[TALLY_POOL_SMALL]), large = tally__stat_now(&arr[TALLY_POOL_LARGE]);
            int64_t now[3] = {small + large, small, large};
            for (int p = 0; p < 3; p++)
                if (reset || now[p] > M.split_seen[k][d][p])
                    M.split_seen[k][d][p] = now[p];
        }
}

static void compare(int dev, const char *when, long op)
{
    tally_stats_t s = tu_stats(dev);
    tu_ctx("device %d, %s, op %ld", dev, when, op);
    for (int p = 0; p < 3; p++) {
        EQ(s.allocation[p].current, M.alloc_n[dev][p]);
        EQ(s.allocated_bytes[p].current, M.alloc_b[dev][p]);
        EQ(s.active[p].current, M.active_n[dev][p]);
        EQ(s.active_bytes[p].current, M.active_b[dev][p]);
        EQ(s.requested_bytes[p].current, M.req_b[dev][p]);
    }
    EQ(s.allocated_bytes[TALLY_POOL_SMALL].current, M.small_rounded[dev]);
    EQ(s.allocation[0].peak, M.peak_alloc_n[dev]);
    EQ(s.allocated_bytes[0].peak, M.peak_alloc_b[dev]);
    for (int p = 0; p < 3; p++) {
        EQ(s.allocation[p].peak, M.peak[0][dev][p]);
        EQ(s.allocated_bytes[p].peak, M.peak[1][dev][p]);
        EQ(s.active[p].peak, M.peak[2][dev][p]);
        EQ(s.active_bytes[p].peak, M.peak[3][dev][p]);
        EQ(s.requested_bytes[p].peak, M.peak[4][dev][p]);
    }
    EQ(s.allocation[0].allocated - M.base[dev].allocation[0].allocated, M.mallocs[dev]);
    EQ(s.allocation[0].freed - M.base[dev].allocation[0].freed, M.frees[dev]);
    EQ(s.inactive_split[0].current >= 0, 1);
    for (int p = 0; p < 3; p++) {
        tu_ctx("device %d, %s, op %ld, pool %d: split peaks %lld, %lld against %lld, %lld seen", dev, when, op, p,
               (long long)s.inactive_split[p].peak, (long long)s.inactive_split_bytes[p].peak,
               (long long)M.split_seen[0][dev][p], (long long)M.split_seen[1][dev][p]);
        EQ(s.inactive_split[p].peak >= M.split_seen[0][dev][p], 1);
        EQ(s.inactive_split_bytes[p].peak >= M.split_seen[1][dev][p], 1);
        EQ(s.inactive_split[p].peak >= s.inactive_split[p].current, 1);
    }
    assert_true(s.reserved_bytes[0].current >= s.active_bytes[0].current);
    tu_ctx("%s", "");
}

static void do_malloc(long op)
{
    int dev = (int)below(NDEV);
    int st = (int)below(4);
    size_t req = random_size();
    size_t rounded = tu_round(req, NULL);
    int pool = tu_pool(rounded);
    resolve(dev, false); /* malloc looks at events first */
    void *p = tally_malloc(req, dev, alloc_streams[st]);
    if (M.faults) {
        int64_t retries = tu_stats(dev).num_alloc_retries;
        if (retries != M.retries[dev])
            resolve(dev, true); /* the release_cached_blocks path synchronised */
        M.retries[dev] = retries;
    }
    if (!p)
        fail_msg("op %ld: malloc(%zu) on device %d failed: %s", op, req, dev, tally_last_error());
    tally_block_info_t info = tu_info(p);
    EQ((uintptr_t)p % 512, 0);
    EQ(info.requested_size, req);
    EQ(info.device, dev);
    assert_ptr_equal(info.stream, alloc_streams[st]);
    if (pool == TALLY_POOL_SMALL)
        EQ(info.size, rounded);
    else if (info.size < rounded || info.size > rounded + MiB)
        fail_msg("op %ld: request %zu (rounded %zu) got a block of %zu", op, req, rounded, info.size);
    live_t *l = &M.live[M.nlive++];
    if (M.nlive > M.live_peak)
        M.live_peak = M.nlive;
    *l = (live_t){p, req, info.size, dev, pool, st, 0};
    count(dev, pool, 1, (int64_t)info.size, 1, (int64_t)info.size, (int64_t)req);
    if (pool == TALLY_POOL_SMALL)
        M.small_rounded[dev] += (int64_t)rounded;
    M.mallocs[dev]++;
    if (M.alloc_n[dev][0] > M.peak_alloc_n[dev])
        M.peak_alloc_n[dev] = M.alloc_n[dev][0];
    if (M.alloc_b[dev][0] > M.peak_alloc_b[dev])
        M.peak_alloc_b[dev] = M.alloc_b[dev][0];
}

static void do_free(int i)
{
    live_t l = M.live[i];
    M.live[i] = M.live[--M.nlive];
    if (below(8) == 0)
        assert_int_equal(tally_free_checked(l.p, l.req, l.dev), 0);
    else
        tally_free(l.p);
    tally_block_info_t info;
    assert_true(tally_block_info(l.p, &info) < 0);
    count(l.dev, l.pool, -1, -(int64_t)l.size, 0, 0, 0);
    if (l.pool == TALLY_POOL_SMALL)
        M.small_rounded[l.dev] -= (int64_t)l.size;
    M.frees[l.dev]++;
    if (!l.uses) {
        count(l.dev, l.pool, 0, 0, -1, -(int64_t)l.size, -(int64_t)l.req);
        return;
    }
    assert_true(M.npend < MAXPEND);
    pend_t *e = &M.pend[M.npend++];
    if (M.npend > M.pend_peak)
        M.pend_peak = M.npend;
    *e = (pend_t){.dev = l.dev, .pool = l.pool, .req = l.req, .size = l.size, .n = 0};
    for (int h = 0; h < NHOLD; h++) {
        if ((l.uses >> h & 1) && M.held[h]) {
            e->hold[e->n] = h;
            e->ticket[e->n] = M.gen[h];
            e->n++;
        }
    }
}

static void do_record(void)
{
    live_t *l = &M.live[below((uint64_t)M.nlive)];
    int u = (int)below(8);
    assert_int_equal(tally_record_stream(l->p, use_streams[u]), 0);
    M.records++;
    if (use_streams[u] != alloc_streams[l->stream])
        l->uses |= 1u << u;
}

static void do_toggle_hold(void)
{
    int h = (int)below(NHOLD);
    int hold = !M.held[h];
    assert_int_equal(tally_host_stream_hold(use_streams[h], hold), 0);
    if (hold && M.gen[h] == 0)
        M.gen[h] = 1;
    if (!hold)
        M.gen[h]++;
    M.held[h] = hold;
    M.toggles++;
}

static void do_empty_cache(void)
{
    int64_t before = 0, after = 0;
    for (int d = 0; d < NDEV; d++)
        before += tu_stats(d).reserved_bytes[0].current;
    size_t released = tally_empty_cache(-1);
    for (int d = 0; d < NDEV; d++) {
        after += tu_stats(d).reserved_bytes[0].current;
        resolve(d, true);
    }
    EQ(released, before - after);
    M.empty_calls++;
}

static void do_reset_peak(void)
{
    int d = (int)below(NDEV);
    assert_int_equal(tally_reset_peak_stats(d), 0);
    for (int k = 0; k < 2; k++)
        for (int p = 0; p < 3; p++) {
            const tally_stat_t *arr = k ? tally__g.dev[d]->stats.inactive_split_bytes : tally__g.dev[d]->stats.inactive_split;
            M.split_seen[k][d][p] = p ? tally__stat_now(&arr[p]) : tally__stat_now(&arr[TALLY_POOL_SMALL]) +
                                                                     tally__stat_now(&arr[TALLY_POOL_LARGE]);
        }
    M.peak_alloc_n[d] = M.alloc_n[d][0];
    M.peak_alloc_b[d] = M.alloc_b[d][0];
    for (int k = 0; k < 5; k++)
        for (int p = 0; p < 3; p++)
            M.peak[k][d][p] = *stat_cur(k, d, p);
    M.resets++;
}

static void check_all(const char *when, long op)
{
    /* The statistics first: a read must take the pending peaks itself. */
    for (int d = 0; d < NDEV; d++)
        compare(d, when, op);
    if (tally_check() != 0)
        fail_msg("op %ld (%s): tally_check: %s", op, when, tally_last_error());
    M.checks++;
}

/* Run ops random operations; fault_every != 0 injects a backend failure
 * every fault_every backend allocations. */
static void run_random(long ops, uint64_t seed, uint64_t fault_every)
{
    tu_clean_all();
    memset(&M, 0, sizeof M);
    M.rng = seed ? seed : 1;
    for (int d = 0; d < NDEV; d++) {
        assert_int_equal(tally_reset_peak_stats(d), 0);
        M.base[d] = tu_stats(d);
        M.retries[d] = M.base[d].num_alloc_retries;
    }
    split_watch(true);
    M.faults = fault_every != 0;
    if (fault_every)
        assert_int_equal(tally_host_fail_alloc(fault_every, fault_every), 0);
    for (long op = 1; op <= ops; op++) {
        uint64_t r = below(10000);
        if (M.nlive == 0 || (r < 4500 && M.nlive < MAXLIVE))
            do_malloc(op);
        else if (r < 9000 || M.nlive == MAXLIVE)
            do_free((int)below((uint64_t)M.nlive));
        else if (r < 9600)
            do_record();
        else if (r < 9900)
            do_toggle_hold();
        else if (r < 9905)
            do_empty_cache();
        else if (r < 9915)
            do_reset_peak();
        /* else: nothing this time */
        split_watch(false);
        if (op % 1000 == 0)
            check_all("periodic", op);
    }
    check_all("end of run", ops);
    while (M.nlive)
        do_free(M.nlive - 1);
    for (int h = 0; h < NHOLD; h++)
        if (M.held[h])
            do_toggle_hold();
    check_all("all freed", ops);
    do_empty_cache();
    tally_host_fail_alloc(0, 0);
    int64_t retries = 0, dev_allocs = 0;
    for (int d = 0; d < NDEV; d++) {
        tally_stats_t s = tu_stats(d);
        const tally_stats_t *b = &M.base[d];
        for (int p = 0; p < 3; p++) {
            EQ(s.allocation[p].current, 0);
            EQ(s.active[p].current, 0);
            EQ(s.requested_bytes[p].current, 0);
            EQ(s.reserved_bytes[p].current, 0);
            EQ(s.inactive_split[p].current, 0);
        }
        EQ(s.num_ooms - b->num_ooms, 0);
        /* Every sync is an empty_cache or a retry after an injected failure. */
        EQ(s.num_sync_all_streams - b->num_sync_all_streams,
           M.empty_calls + s.num_alloc_retries - b->num_alloc_retries);
        EQ(s.num_device_alloc - b->num_device_alloc, s.num_device_free - b->num_device_free);
        retries += s.num_alloc_retries - b->num_alloc_retries;
        dev_allocs += s.num_device_alloc - b->num_device_alloc;
    }
    if (fault_every) /* one retry per injected failure, one failure per fault_every calls */
        EQ(retries, (dev_allocs + retries) / (int64_t)fault_every);
    else
        EQ(retries, 0);
    CHECK_OK();
    print_message("  %ld ops: %lld mallocs, %lld frees, %lld record_streams, %lld hold toggles, %lld empty_cache, "
                  "%lld peak resets, %lld checks; at most %lld live and %lld pending; %lld device allocations, "
                  "%lld injected failures\n",
                  ops, (long long)(M.mallocs[0] + M.mallocs[1]), (long long)(M.frees[0] + M.frees[1]),
                  (long long)M.records, (long long)M.toggles, (long long)M.empty_calls, (long long)M.resets,
                  (long long)M.checks, (long long)M.live_peak, (long long)M.pend_peak, (long long)dev_allocs,
                  (long long)retries);
}

static uint64_t seed_from_env(uint64_t dflt)
{
    const char *s = getenv("TALLY_TEST_SEED");
    return s && *s ? strtoull(s, NULL, 0) : dflt;
}

static void test_million_random_ops_match_the_model(void **state)
{
    (void)state;
    long ops = tu_scaled(1000000, 20000);
    uint64_t seed = seed_from_env(0x7a11ee5eedULL);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    run_random(ops, seed, 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    print_message("  %ld operations, seed %#llx, %.2f s\n", ops, (unsigned long long)seed,
                  (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
}

static void test_random_ops_with_injected_backend_failures(void **state)
{
    (void)state;
    long ops = tu_scaled(50000, 5000);
    run_random(ops, seed_from_env(0xfa17ed5eedULL) ^ 0x5555, 7);
}

/* The small fast path leaves five statistics' peaks pending until one of
 * them falls or is read (lib/cache/cache.h). Each reader takes them: a check
 * right after allocations, a peak reset, an accumulated reset, a read. */
static void test_pending_peaks_are_taken_by_every_reader(void **state)
{
    (void)state;
    tu_clean_all();
    assert_int_equal(tally_reset_peak_stats(0), 0);
    void *p[32];
    int n = 0;
    for (; n < 8; n++)
        p[n] = tally_malloc(1000, 0, NULL); /* 1 KiB blocks, small pool */
    assert_int_equal(tally_check(), 0);     /* its recount compares peak with current */
    tally_stats_t s = tu_stats(0);
    EQ(s.allocation[TALLY_POOL_SMALL].peak, 8);
    EQ(s.allocation[TALLY_POOL_ALL].peak, 8);
    EQ(s.active_bytes[TALLY_POOL_SMALL].peak, 8 * 1024);
    EQ(s.requested_bytes[TALLY_POOL_ALL].peak, 8 * 1000);
    for (; n < 12; n++)
        p[n] = tally_malloc(1000, 0, NULL);
    assert_int_equal(tally_reset_peak_stats(0), 0); /* the peak is the current: 12 */
    for (int k = 0; k < 6; k++)
        tally_free(p[--n]);
    for (int k = 0; k < 2; k++)
        p[n++] = tally_malloc(1000, 0, NULL);
    s = tu_stats(0);
    EQ(s.allocation[TALLY_POOL_SMALL].current, 8);
    EQ(s.allocation[TALLY_POOL_SMALL].peak, 12);
    for (; n < 11; n++)
        p[n] = tally_malloc(1000, 0, NULL);
    assert_int_equal(tally_reset_accumulated_stats(0), 0); /* keeps the peaks */
    for (; n < 16; n++)
        p[n] = tally_malloc(1000, 0, NULL);
    void *big = tally_malloc(4 * MiB, 0, NULL); /* the large pool: its all peak counts both */
    tally_free(p[--n]);
    s = tu_stats(0);
    EQ(s.allocation[TALLY_POOL_SMALL].peak, 16);
    EQ(s.allocation[TALLY_POOL_LARGE].peak, 1);
    EQ(s.allocation[TALLY_POOL_ALL].peak, 17);
    EQ(s.allocated_bytes[TALLY_POOL_ALL].peak, 16 * 1024 + 4 * MiB);
    EQ(s.allocation[TALLY_POOL_SMALL].allocated, 5); /* since the accumulated reset */
    EQ(s.allocation[TALLY_POOL_SMALL].freed, 1);
    tally_free(big);
    while (n)
        tally_free(p[--n]);
    assert_int_equal(tally_check(), 0);
}

int main(void)
{
    tu_conf("backend:host,host_devices:2,host_capacity:80GiB,host_mode:virtual");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_million_random_ops_match_the_model),
        cmocka_unit_test(test_random_ops_with_injected_backend_failures),
        cmocka_unit_test(test_pending_peaks_are_taken_by_every_reader),
    };
    return cmocka_run_group_tests_name("random", tests, NULL, NULL);
}
