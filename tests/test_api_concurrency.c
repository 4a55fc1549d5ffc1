/* Concurrency: eight threads on two devices and several streams, a million
 * operations in all (TALLY_TEST_SCALE scales them), while the process-wide
 * parts of tally change underneath:
 *  - six workers allocate (three streams each), free, push and pop their
 *    own tags, record their blocks on other streams, hold and release a
 *    private stream, and hand blocks to the next worker, which records the
 *    block on its own stream and frees it (record_stream and free across
 *    threads; the hand-off is a mutex-protected mailbox, so the block has
 *    one owner at a time). Every new block's block_info must show the
 *    worker's device, stream, size and innermost tag, and a stage that the
 *    stage thread has begun (or "(none)");
 *  - the stage thread owns the stage stack: it begins and ends stages
 *    (nested up to three deep) with release_at_stage_end and stage_report
 *    on, so each end walks every device and releases their caches while the
 *    workers allocate; the survivor reports go to the sink;
 *  - the reporter thread writes the JSON report, the ledger, the leak
 *    report, the summary and the stats JSON, reads statistics (which must
 *    be self-consistent) and runs tally_check() (which must pass while
 *    everything moves).
 * At the end every block is freed, every stream released, and each device
 * must be back to zero with tally_check() == 0. Run it under `make tsan`. */
#include "testutil.h"

#include <stdatomic.h>
#include <unistd.h>

#define NWORKERS 6
#define NDEV 2
#define MAXLIVE 96
#define MAILBOX 64
#define NSTAGE_NAMES 6

static const char *const stage_names[NSTAGE_NAMES] = {"load", "train", "forward", "backward", "eval", "save"};

typedef struct handoff {
    void *p;
    size_t req;
    int dev;
} handoff_t;

typedef struct mailbox {
    pthread_mutex_t lock;
    handoff_t items[MAILBOX];
    int n;
} mailbox_t;

typedef struct worker {
    pthread_t tid;
    int id;
    long ops;
    /* results */
    long mallocs, frees, records, handed, taken, tags, holds;
    long failures;
    char error[256];
} worker_t;

static mailbox_t mailboxes[NWORKERS];
static pthread_barrier_t go;
static atomic_int workers_running;
static atomic_long stage_ops, report_ops, checks;
static char report_path[256];

#define WFAIL(errbuf, count, ...)                                                                                  \
    do {                                                                                                           \
        if (!(errbuf)[0])                                                                                          \
            snprintf((errbuf), sizeof(errbuf), __VA_ARGS__);                                                       \
        (count)++;                                                                                                 \
    } while (0)

static uint64_t next_rand(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

static size_t worker_size(uint64_t *rng)
{
    uint64_t r = next_rand(rng) % 100;
    if (r < 75)
        return 1 + next_rand(rng) % (128 * KiB);
    if (r < 97)
        return MiB + next_rand(rng) % (4 * MiB);
    return 10 * MiB + next_rand(rng) % (8 * MiB);
}

static bool known_stage(const char *name)
{
    if (strcmp(name, "(none)") == 0)
        return true;
    for (int i = 0; i < NSTAGE_NAMES; i++)
        if (strcmp(name, stage_names[i]) == 0)
            return true;
    return false;
}

static void discard(void *arg, const char *text, size_t len)
{
    (void)arg;
    (void)text;
    (void)len;
}

static atomic_long sink_lines;
static void counting_sink(void *arg, const char *text, size_t len)
{
    (void)arg;
    long n = 0;
    for (size_t i = 0; i < len; i++)
        n += text[i] == '\n';
    atomic_fetch_add(&sink_lines, n);
}

/* ---- workers --------------------------------------------------------------- */

static bool mailbox_put(mailbox_t *m, handoff_t h)
{
    pthread_mutex_lock(&m->lock);
    bool ok = m->n < MAILBOX;
    if (ok)
        m->items[m->n++] = h;
    pthread_mutex_unlock(&m->lock);
    return ok;
}

static bool mailbox_take(mailbox_t *m, handoff_t *h)
{
    pthread_mutex_lock(&m->lock);
    bool ok = m->n > 0;
    if (ok)
        *h = m->items[--m->n];
    pthread_mutex_unlock(&m->lock);
    return ok;
}

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    uint64_t rng = 0x9E3779B97F4A7C15ull * (uint64_t)(w->id + 7);
    handoff_t live[MAXLIVE];
    int n = 0;
    void *const my_streams[3] = {NULL, STREAM(1 + w->id), STREAM(1 + (w->id + 1) % NWORKERS)};
    void *const private_stream = STREAM(20 + w->id);
    char tags[3][32];
    snprintf(tags[0], sizeof tags[0], "untagged");
    snprintf(tags[1], sizeof tags[1], "worker-%d", w->id);
    snprintf(tags[2], sizeof tags[2], "worker-%d-inner", w->id);
    int depth = 0;
    bool held = false;
    pthread_barrier_wait(&go);
    for (long op = 0; op < w->ops; op++) {
        uint64_t r = next_rand(&rng) % 1000;
        if (n == 0 || (r < 460 && n < MAXLIVE)) {
            handoff_t h;
            h.req = worker_size(&rng);
            h.dev = (int)(next_rand(&rng) % NDEV);
            void *s = my_streams[next_rand(&rng) % 3];
            h.p = tally_malloc(h.req, h.dev, s);
            if (!h.p) {
                WFAIL(w->error, w->failures, "malloc(%zu, %d) failed: %s", h.req, h.dev, tally_last_error());
                continue;
            }
            w->mallocs++;
            live[n++] = h;
            if (op % 8 == 0) {
                tally_block_info_t info;
                if (tally_block_info(h.p, &info) || info.device != h.dev || info.stream != s ||
                    info.requested_size != h.req || info.size < h.req || (uintptr_t)h.p % 512)
                    WFAIL(w->error, w->failures, "block_info of %p is wrong", h.p);
                else if (strcmp(tally_tag_name(info.tag), tags[depth]) != 0)
                    WFAIL(w->error, w->failures, "block %p has tag %s, expected %s", h.p, tally_tag_name(info.tag),
                          tags[depth]);
                else if (!known_stage(tally_stage_name(info.stage)))
                    WFAIL(w->error, w->failures, "block %p has stage '%s'", h.p, tally_stage_name(info.stage));
            }
        } else if (r < 880) {
            int i = (int)(next_rand(&rng) % (uint64_t)n);
            if (r % 7 == 0) {
                if (tally_free_checked(live[i].p, live[i].req, live[i].dev))
                    WFAIL(w->error, w->failures, "free_checked: %s", tally_last_error());
            } else {
                tally_free(live[i].p);
            }
            live[i] = live[--n];
            w->frees++;
        } else if (r < 920) {
            /* hand a block to the next worker, which records and frees it */
            int i = (int)(next_rand(&rng) % (uint64_t)n);
            if (mailbox_put(&mailboxes[(w->id + 1) % NWORKERS], live[i])) {
                live[i] = live[--n];
                w->handed++;
            }
        } else if (r < 955) {
            handoff_t h;
            if (mailbox_take(&mailboxes[w->id], &h)) {
                if (tally_record_stream(h.p, my_streams[1 + r % 2]) ||
                    (r % 3 == 0 && tally_record_stream(h.p, private_stream)))
                    WFAIL(w->error, w->failures, "record_stream of a handed block: %s", tally_last_error());
                if (r % 2 ? tally_free_checked(h.p, h.req, h.dev) != 0 : (tally_free(h.p), false))
                    WFAIL(w->error, w->failures, "free of a handed block: %s", tally_last_error());
                w->taken++;
                w->records++;
            }
        } else if (r < 975) {
            int i = (int)(next_rand(&rng) % (uint64_t)n);
            void *s = r % 2 ? private_stream : my_streams[r % 3];
            if (tally_record_stream(live[i].p, s))
                WFAIL(w->error, w->failures, "record_stream: %s", tally_last_error());
            w->records++;
        } else if (r < 985) {
            held = !held;
            if (tally_host_stream_hold(private_stream, held))
                WFAIL(w->error, w->failures, "stream hold: %s", tally_last_error());
            w->holds++;
        } else {
            if (depth < 2 && (depth == 0 || r % 2)) {
                if (tally_tag_push(tags[depth + 1]))
                    WFAIL(w->error, w->failures, "tag_push: %s", tally_last_error());
                depth++;
            } else if (depth > 0) {
                if (tally_tag_pop())
                    WFAIL(w->error, w->failures, "tag_pop: %s", tally_last_error());
                depth--;
            }
            w->tags++;
        }
    }
    while (n) {
        tally_free(live[--n].p);
        w->frees++;
    }
    while (depth--)
        tally_tag_pop();
    if (held)
        tally_host_stream_hold(private_stream, 0);
    atomic_fetch_sub(&workers_running, 1);
    return NULL;
}

/* ---- the stage thread -------------------------------------------------------- */

static char stage_error[256];
static long stage_failures;

static void *stage_main(void *arg)
{
    (void)arg;
    uint64_t rng = 0x5ea6e5ull;
    const char *stack[3];
    int depth = 0;
    pthread_barrier_wait(&go);
    while (atomic_load(&workers_running) > 0) {
        uint64_t r = next_rand(&rng) % 100;
        if (depth == 0 || (depth < 3 && r < 50)) {
            const char *name = stage_names[next_rand(&rng) % NSTAGE_NAMES];
            if (tally_stage_begin(name))
                WFAIL(stage_error, stage_failures, "stage_begin(%s): %s", name, tally_last_error());
            else
                stack[depth++] = name;
        } else {
            if (tally_stage_end(stack[depth - 1]))
                WFAIL(stage_error, stage_failures, "stage_end(%s): %s", stack[depth - 1], tally_last_error());
            depth--;
        }
        atomic_fetch_add(&stage_ops, 1);
        usleep(50);
    }
    while (depth > 0) {
        if (tally_stage_end(stack[depth - 1]))
            WFAIL(stage_error, stage_failures, "stage_end(%s): %s", stack[depth - 1], tally_last_error());
        depth--;
    }
    return NULL;
}

/* ---- the reporter thread ----------------------------------------------------- */

static char report_error[256];
static long report_failures;

static void *report_main(void *arg)
{
    (void)arg;
    long round = 0;
    pthread_barrier_wait(&go);
    while (atomic_load(&workers_running) > 0) {
        int d = (int)(round % NDEV);
        tally_stats_t s;
        switch (round % 8) {
        case 0:
            if (tally_write_report(report_path))
                WFAIL(report_error, report_failures, "write_report: %s", tally_last_error());
            break;
        case 1:
            if (tally_write_ledger(discard, NULL))
                WFAIL(report_error, report_failures, "write_ledger: %s", tally_last_error());
            break;
        case 2:
            if (tally_write_leaks(1, discard, NULL))
                WFAIL(report_error, report_failures, "write_leaks: %s", tally_last_error());
            break;
        case 3:
            if (tally_write_summary(d, 0, discard, NULL))
                WFAIL(report_error, report_failures, "write_summary: %s", tally_last_error());
            break;
        case 4:
            if (tally_write_stats_json(d, discard, NULL))
                WFAIL(report_error, report_failures, "write_stats_json: %s", tally_last_error());
            break;
        case 5:
            if (tally_check()) /* each device is consistent under its lock */
                WFAIL(report_error, report_failures, "tally_check while running: %s", tally_last_error());
            atomic_fetch_add(&checks, 1);
            break;
        default:
            if (tally_get_stats(d, &s))
                WFAIL(report_error, report_failures, "get_stats: %s", tally_last_error());
            else if (s.allocation[0].current < 0 || s.active[0].current < s.allocation[0].current ||
                     s.reserved_bytes[0].current < s.active_bytes[0].current ||
                     s.active_bytes[0].current < s.allocated_bytes[0].current ||
                     s.allocation[0].peak < s.allocation[0].current)
                WFAIL(report_error, report_failures,
                      "device %d statistics inconsistent: %lld allocations, %lld active, reserved %lld, active "
                      "bytes %lld, allocated bytes %lld",
                      d, (long long)s.allocation[0].current, (long long)s.active[0].current,
                      (long long)s.reserved_bytes[0].current, (long long)s.active_bytes[0].current,
                      (long long)s.allocated_bytes[0].current);
            break;
        }
        round++;
        atomic_fetch_add(&report_ops, 1);
        usleep(100);
    }
    return NULL;
}

/* ---- tally_configure at runtime while other threads allocate ----------- */

/* Runtime keys change while allocations, frees, stage ends and reports read
 * them: they are stored and read as relaxed atomics, and the two strings
 * (persistent_tags, report_path) are copied under the configuration lock
 * (lib/core/internal.h, TALLY_OPT). Meaningful under `make tsan`. The
 * memory fraction is applied under each device's lock in turn, which the
 * allocating thread takes too: a lock left held stops it. */
static atomic_int configure_stop;

static void *configure_main(void *arg)
{
    (void)arg;
    for (long i = 0; !atomic_load(&configure_stop); i++) {
        if (tally_configure(i % 2 ? "persistent_tags:weights|act,stage_report:false,backtrace_depth:0,memory_fraction:0.9"
                                  : "persistent_tags:optimizer,stage_report:true,backtrace_depth:0,memory_fraction:0"))
            return (void *)1;
    }
    return NULL;
}

static void *alloc_main(void *arg)
{
    long n = (long)(intptr_t)arg;
    uint64_t rng = 99;
    for (long i = 0; i < n; i++) {
        void *p = tally_malloc(worker_size(&rng), (int)(i % NDEV), NULL);
        tally_free(p);
        if (i % 1000 == 0) {
            tally_stage_begin("load");
            tally_stage_end("load");
        }
    }
    return NULL;
}

static void test_configure_while_allocating(void **state)
{
    (void)state;
    tally_set_sink(counting_sink, NULL);
    atomic_store(&configure_stop, 0);
    pthread_t c, a;
    assert_int_equal(pthread_create(&c, NULL, configure_main, NULL), 0);
    assert_int_equal(pthread_create(&a, NULL, alloc_main, (void *)(intptr_t)tu_scaled(100000, 10000)), 0);
    pthread_join(a, NULL);
    atomic_store(&configure_stop, 1);
    void *rc;
    pthread_join(c, &rc);
    assert_null(rc);
    assert_int_equal(tally_configure("persistent_tags:,stage_report:true"), 0);
    tally_set_sink(NULL, NULL);
    CHECK_OK();
}

/* ---- the test ---------------------------------------------------------------- */

static void test_eight_threads_with_stages_reports_and_handoffs(void **state)
{
    (void)state;
    long total = tu_scaled(1000000, 20000);
    worker_t w[NWORKERS];
    pthread_t stage_tid, report_tid;
    snprintf(report_path, sizeof report_path, "%s/tally-concurrency-%d.json",
             getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
    tally_set_sink(counting_sink, NULL);
    for (int i = 0; i < NWORKERS; i++) {
        pthread_mutex_init(&mailboxes[i].lock, NULL);
        mailboxes[i].n = 0;
    }
    assert_int_equal(pthread_barrier_init(&go, NULL, NWORKERS + 2), 0);
    atomic_store(&workers_running, NWORKERS);
    for (int i = 0; i < NWORKERS; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].id = i;
        w[i].ops = total / NWORKERS;
        assert_int_equal(pthread_create(&w[i].tid, NULL, worker_main, &w[i]), 0);
    }
    assert_int_equal(pthread_create(&stage_tid, NULL, stage_main, NULL), 0);
    assert_int_equal(pthread_create(&report_tid, NULL, report_main, NULL), 0);
    long mallocs = 0, frees = 0, records = 0, handed = 0, taken = 0, tags = 0, holds = 0, ops = 0;
    for (int i = 0; i < NWORKERS; i++) {
        pthread_join(w[i].tid, NULL);
        if (w[i].failures)
            fail_msg("worker %d: %ld failures, the first: %s", i, w[i].failures, w[i].error);
        mallocs += w[i].mallocs;
        frees += w[i].frees;
        records += w[i].records;
        handed += w[i].handed;
        taken += w[i].taken;
        tags += w[i].tags;
        holds += w[i].holds;
        ops += w[i].ops;
    }
    pthread_join(stage_tid, NULL);
    pthread_join(report_tid, NULL);
    pthread_barrier_destroy(&go);
    if (stage_failures)
        fail_msg("stage thread: %ld failures, the first: %s", stage_failures, stage_error);
    if (report_failures)
        fail_msg("reporter thread: %ld failures, the first: %s", report_failures, report_error);
    /* What is left in the mailboxes goes back from this thread. */
    long leftover = 0;
    for (int i = 0; i < NWORKERS; i++) {
        handoff_t h;
        while (mailbox_take(&mailboxes[i], &h)) {
            tally_free(h.p);
            leftover++;
        }
        pthread_mutex_destroy(&mailboxes[i].lock);
    }
    EQ(handed, taken + leftover);
    tally_empty_cache(-1);
    CHECK_OK();
    for (int d = 0; d < NDEV; d++) {
        tally_stats_t s = tu_stats(d);
        tu_ctx("device %d after the run", d);
        for (int p = 0; p < TALLY_POOL_COUNT; p++) {
            EQ(s.allocation[p].current, 0);
            EQ(s.active[p].current, 0);
            EQ(s.allocated_bytes[p].current, 0);
            EQ(s.requested_bytes[p].current, 0);
            EQ(s.reserved_bytes[p].current, 0);
            EQ(s.segment[p].current, 0);
        }
        EQ(s.num_ooms, 0);
        EQ(s.num_device_alloc, s.num_device_free);
        size_t fr = 0, tot = 0;
        assert_int_equal(tally_mem_get_info(d, &fr, &tot), 0);
        EQ(fr, tot);
    }
    tu_ctx("%s", "");
    /* The report the reporter wrote last is whole JSON. */
    FILE *f = fopen(report_path, "r");
    assert_non_null(f);
    char head[32] = "";
    assert_true(fread(head, 1, sizeof head - 1, f) > 0);
    fclose(f);
    HAS(head, "{\"format\":\"tally-report\"");
    unlink(report_path);
    tally_set_sink(NULL, NULL);
    long all = ops + atomic_load(&stage_ops) + atomic_load(&report_ops);
    assert_true(all >= total);
    print_message("  %ld operations: workers %ld (%ld mallocs, %ld frees, %ld record_streams, %ld blocks handed "
                  "over, %ld tag changes, %ld stream holds), stage thread %ld, reporter %ld (%ld concurrent "
                  "checks); %ld sink lines\n",
                  all, ops, mallocs, frees, records, handed, tags, holds, atomic_load(&stage_ops),
                  atomic_load(&report_ops), atomic_load(&checks), atomic_load(&sink_lines));
}

int main(void)
{
    tu_conf("backend:host,host_devices:2,host_capacity:64GiB,host_mode:virtual,release_at_stage_end:true,"
            "stage_report:true,timeline:true,timeline_events:4096,leak_report:off");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_eight_threads_with_stages_reports_and_handoffs),
        cmocka_unit_test(test_configure_while_allocating),
    };
    return cmocka_run_group_tests_name("concurrency", tests, NULL, NULL);
}
