/* Thread stress: many threads allocating and freeing at once on two devices
 * and several streams, with per-thread tags, record_stream on shared held
 * streams, empty_cache, statistics reads and tally_check running alongside.
 * Blocks are backed by host memory: each thread stamps its blocks and checks
 * the stamp before freeing, so a block handed to two owners is caught.
 * At the end every statistic must be back to zero and tally_check clean.
 *
 * TALLY_TEST_SCALE (0..1] scales the operation counts (sanitizer builds). */
#include "testutil.h"

#define NTHREADS 8
#define NDEV 2
#define MAXLIVE 128

static void *const streams[4] = {NULL, STREAM(1), STREAM(2), STREAM(3)};
static void *const held_streams[2] = {STREAM(20), STREAM(21)};

typedef struct worker {
    pthread_t tid;
    int id;
    long ops;
    pthread_barrier_t *go;
    /* results */
    long mallocs, frees, failures;
    char error[256];
} worker_t;

typedef struct owned {
    unsigned char *p;
    size_t req;
    int dev;
} owned_t;

static uint64_t next_rand(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

static size_t thread_size(uint64_t *rng)
{
    uint64_t r = next_rand(rng) % 100;
    if (r < 70)
        return 1 + next_rand(rng) % (64 * KiB);
    if (r < 95)
        return MiB + next_rand(rng) % (3 * MiB);
    return 10 * MiB + next_rand(rng) % (6 * MiB);
}

/* Stamp the first and last 16 bytes of a block with its owner's byte. */
static void stamp(owned_t *o, unsigned char mark)
{
    size_t n = o->req < 16 ? o->req : 16;
    memset(o->p, mark, n);
    memset(o->p + o->req - n, mark, n);
}

static bool stamp_ok(const owned_t *o, unsigned char mark)
{
    size_t n = o->req < 16 ? o->req : 16;
    for (size_t i = 0; i < n; i++)
        if (o->p[i] != mark || o->p[o->req - 1 - i] != mark)
            return false;
    return true;
}

#define WFAIL(w, ...)                                                                                              \
    do {                                                                                                           \
        if (!(w)->error[0])                                                                                        \
            snprintf((w)->error, sizeof (w)->error, __VA_ARGS__);                                                  \
        (w)->failures++;                                                                                           \
    } while (0)

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    uint64_t rng = 0x9E3779B97F4A7C15ull * (uint64_t)(w->id + 1);
    owned_t live[MAXLIVE];
    unsigned char stamps[MAXLIVE];
    int n = 0;
    char tag[32], inner[32];
    snprintf(tag, sizeof tag, "thread-%d", w->id);
    snprintf(inner, sizeof inner, "thread-%d-inner", w->id);
    if (tally_tag_push(tag))
        WFAIL(w, "tag_push: %s", tally_last_error());
    int depth = 1;
    pthread_barrier_wait(w->go);
    for (long op = 0; op < w->ops; op++) {
        uint64_t r = next_rand(&rng) % 1000;
        if (n == 0 || (r < 480 && n < MAXLIVE)) {
            owned_t o;
            o.req = thread_size(&rng);
            o.dev = (int)(next_rand(&rng) % NDEV);
            void *s = streams[next_rand(&rng) % 4];
            o.p = tally_malloc(o.req, o.dev, s);
            if (!o.p) {
                WFAIL(w, "malloc(%zu, %d) failed: %s", o.req, o.dev, tally_last_error());
                continue;
            }
            tally_block_info_t info;
            if (tally_block_info(o.p, &info) || info.device != o.dev || info.stream != s ||
                info.requested_size != o.req || info.size < o.req || (uintptr_t)o.p % 512)
                WFAIL(w, "block_info of %p is wrong", (void *)o.p);
            else if (strcmp(tally_tag_name(info.tag), depth == 2 ? inner : tag) != 0)
                WFAIL(w, "block %p has tag %s, expected %s", (void *)o.p, tally_tag_name(info.tag),
                      depth == 2 ? inner : tag);
            stamps[n] = (unsigned char)(1 + (w->id * 31 + op) % 255);
            live[n] = o;
            stamp(&live[n], stamps[n]);
            n++;
            w->mallocs++;
        } else if (r < 950) {
            int i = (int)(next_rand(&rng) % (uint64_t)n);
            if (!stamp_ok(&live[i], stamps[i]))
                WFAIL(w, "block %p was overwritten by someone else", (void *)live[i].p);
            if (r % 5 == 0) {
                if (tally_free_checked(live[i].p, live[i].req, live[i].dev))
                    WFAIL(w, "free_checked: %s", tally_last_error());
            } else {
                tally_free(live[i].p);
            }
            live[i] = live[n - 1];
            stamps[i] = stamps[n - 1];
            n--;
            w->frees++;
        } else if (r < 980) {
            int i = (int)(next_rand(&rng) % (uint64_t)n);
            void *s = r % 2 ? held_streams[r % 4 / 2] : streams[r % 4];
            if (tally_record_stream(live[i].p, s))
                WFAIL(w, "record_stream: %s", tally_last_error());
        } else if (r < 988) {
            tally_host_stream_hold(held_streams[r % 2], (int)(r / 2 % 2));
        } else if (r < 992) {
            if (depth == 1 && tally_tag_push(inner) == 0)
                depth = 2;
            else if (depth == 2 && tally_tag_pop() == 0)
                depth = 1;
        } else if (r < 996) {
            tally_stats_t s;
            if (tally_get_stats((int)(r % NDEV), &s) || s.allocation[0].current < 0 || s.active[0].current < 0)
                WFAIL(w, "get_stats: %s", tally_last_error());
        } else if (r < 998) {
            tally_empty_cache((int)(r % NDEV));
        } else if (op % 64 == 0) {
            if (tally_check())
                WFAIL(w, "tally_check: %s", tally_last_error());
        }
    }
    while (n) {
        n--;
        if (!stamp_ok(&live[n], stamps[n]))
            WFAIL(w, "block %p was overwritten by someone else", (void *)live[n].p);
        tally_free(live[n].p);
        w->frees++;
    }
    while (depth--)
        tally_tag_pop();
    return NULL;
}

static int64_t total_allocated(void)
{
    int64_t sum = 0;
    for (int d = 0; d < NDEV; d++)
        sum += tu_stats(d).allocation[0].allocated;
    return sum;
}

static void expect_all_back_to_zero(void)
{
    for (int i = 0; i < 2; i++)
        tally_host_stream_hold(held_streams[i], 0);
    tally_empty_cache(-1);
    CHECK_OK();
    for (int d = 0; d < NDEV; d++) {
        tally_stats_t s = tu_stats(d);
        tu_ctx("device %d", d);
        for (int p = 0; p < 3; p++) {
            EQ(s.allocation[p].current, 0);
            EQ(s.allocated_bytes[p].current, 0);
            EQ(s.active[p].current, 0);
            EQ(s.active_bytes[p].current, 0);
            EQ(s.requested_bytes[p].current, 0);
            EQ(s.reserved_bytes[p].current, 0);
            EQ(s.segment[p].current, 0);
            EQ(s.inactive_split[p].current, 0);
        }
        EQ(s.num_ooms, 0);
        EQ(s.num_device_alloc, s.num_device_free);
        tu_ctx("%s", "");
    }
}

static void test_eight_threads_random_malloc_free(void **state)
{
    (void)state;
    tu_clean_all();
    long ops = tu_scaled(50000, 2000);
    int64_t before = total_allocated();
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, NTHREADS);
    worker_t w[NTHREADS];
    memset(w, 0, sizeof w);
    cap_begin();
    assert_int_equal(tally_stage_begin("threads"), 0);
    for (int i = 0; i < NTHREADS; i++) {
        w[i].id = i;
        w[i].ops = ops;
        w[i].go = &go;
        assert_int_equal(pthread_create(&w[i].tid, NULL, worker_main, &w[i]), 0);
    }
    long mallocs = 0;
    for (int i = 0; i < NTHREADS; i++) {
        pthread_join(w[i].tid, NULL);
        if (w[i].failures)
            fail_msg("thread %d: %ld failures, first: %s", i, w[i].failures, w[i].error);
        EQ(w[i].mallocs, w[i].frees);
        mallocs += w[i].mallocs;
    }
    assert_int_equal(tally_stage_end("threads"), 0);
    cap_end();
    pthread_barrier_destroy(&go);
    EQ(total_allocated() - before, mallocs);
    print_message("  %d threads x %ld ops: %ld mallocs\n", NTHREADS, ops, mallocs);
    expect_all_back_to_zero();
}

/* ---- cross-thread frees: producers allocate, consumers free ---------------- */

#define QCAP 1024
typedef struct queue {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    void *items[QCAP];
    size_t sizes[QCAP];
    int head, count, producers_left;
} queue_t;

typedef struct pc_arg {
    queue_t *q;
    int id;
    long n;
    long done;
    char error[200];
} pc_arg_t;

static void *producer(void *arg)
{
    pc_arg_t *a = arg;
    char tag[32];
    snprintf(tag, sizeof tag, "producer-%d", a->id);
    tally_tag_push(tag);
    uint64_t rng = 77 + (uint64_t)a->id;
    for (long i = 0; i < a->n; i++) {
        size_t size = 1 + next_rand(&rng) % (2 * MiB);
        void *p = tally_malloc(size, (int)(i % NDEV), streams[i % 4]);
        if (!p) {
            snprintf(a->error, sizeof a->error, "malloc: %s", tally_last_error());
            break;
        }
        pthread_mutex_lock(&a->q->lock);
        while (a->q->count == QCAP)
            pthread_cond_wait(&a->q->cond, &a->q->lock);
        int slot = (a->q->head + a->q->count) % QCAP;
        a->q->items[slot] = p;
        a->q->sizes[slot] = size;
        a->q->count++;
        pthread_cond_broadcast(&a->q->cond);
        pthread_mutex_unlock(&a->q->lock);
        a->done++;
    }
    tally_tag_pop();
    pthread_mutex_lock(&a->q->lock);
    a->q->producers_left--;
    pthread_cond_broadcast(&a->q->cond);
    pthread_mutex_unlock(&a->q->lock);
    return NULL;
}

static void *consumer(void *arg)
{
    pc_arg_t *a = arg;
    for (;;) {
        pthread_mutex_lock(&a->q->lock);
        while (a->q->count == 0 && a->q->producers_left > 0)
            pthread_cond_wait(&a->q->cond, &a->q->lock);
        if (a->q->count == 0) {
            pthread_mutex_unlock(&a->q->lock);
            return NULL;
        }
        void *p = a->q->items[a->q->head];
        size_t size = a->q->sizes[a->q->head];
        a->q->head = (a->q->head + 1) % QCAP;
        a->q->count--;
        pthread_cond_broadcast(&a->q->cond);
        pthread_mutex_unlock(&a->q->lock);
        tally_block_info_t info;
        memset(&info, 0, sizeof info);
        if (tally_block_info(p, &info) || info.requested_size != size ||
            strncmp(tally_tag_name(info.tag), "producer-", 9) != 0) {
            snprintf(a->error, sizeof a->error, "block %p: wrong info", p);
        }
        if (tally_free_checked(p, size, info.device))
            snprintf(a->error, sizeof a->error, "free_checked: %s", tally_last_error());
        a->done++;
    }
}

static void test_blocks_freed_by_other_threads(void **state)
{
    (void)state;
    tu_clean_all();
    enum { NP = 4, NC = 4 };
    long per = tu_scaled(20000, 1000);
    queue_t q;
    memset(&q, 0, sizeof q);
    pthread_mutex_init(&q.lock, NULL);
    pthread_cond_init(&q.cond, NULL);
    q.producers_left = NP;
    pc_arg_t args[NP + NC];
    pthread_t tids[NP + NC];
    memset(args, 0, sizeof args);
    for (int i = 0; i < NP + NC; i++) {
        args[i].q = &q;
        args[i].id = i;
        args[i].n = per;
        assert_int_equal(pthread_create(&tids[i], NULL, i < NP ? producer : consumer, &args[i]), 0);
    }
    long produced = 0, consumed = 0;
    for (int i = 0; i < NP + NC; i++) {
        pthread_join(tids[i], NULL);
        if (args[i].error[0])
            fail_msg("thread %d: %s", i, args[i].error);
        if (i < NP)
            produced += args[i].done;
        else
            consumed += args[i].done;
    }
    EQ(produced, NP * per);
    EQ(consumed, produced);
    pthread_cond_destroy(&q.cond);
    pthread_mutex_destroy(&q.lock);
    expect_all_back_to_zero();
}

/* ---- tally_configure from two threads ---------------------------------------
 * "Every function is thread-safe": a runtime key set by one thread must not
 * be lost because another thread set a different key at the same time. */

static _Atomic int configure_stop;

static void *toggle_stage_report(void *arg)
{
    (void)arg;
    for (long i = 0; !configure_stop; i++)
        tally_configure(i % 2 ? "stage_report:true" : "stage_report:false");
    return NULL;
}

static long option_value(const char *key)
{
    char *t = tu_options_text();
    size_t n = strlen(key);
    long v = -1;
    for (const char *l = t; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (strncmp(l, key, n) == 0 && l[n] == ':') {
            v = strtol(l + n + 1, NULL, 10);
            break;
        }
    }
    free(t);
    return v;
}

static void test_concurrent_configure_keeps_every_update(void **state)
{
    (void)state;
    long iterations = tu_scaled(20000, 2000), lost = 0, first_lost = -1;
    configure_stop = 0;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, toggle_stage_report, NULL), 0);
    for (long i = 0; i < iterations && lost < 10; i++) {
        char conf[48];
        long v = 1 + i % 200;
        snprintf(conf, sizeof conf, "leak_exitcode:%ld", v);
        assert_int_equal(tally_configure(conf), 0);
        if (option_value("leak_exitcode") != v) {
            lost++;
            if (first_lost < 0)
                first_lost = i;
        }
    }
    configure_stop = 1;
    pthread_join(t, NULL);
    assert_int_equal(tally_configure("leak_exitcode:0,stage_report:true"), 0);
    if (lost)
        fail_msg("%ld updates of leak_exitcode lost to a concurrent tally_configure (first at iteration %ld)", lost,
                 first_lost);
}

int main(void)
{
    tu_conf("backend:host,host_devices:2,host_capacity:64GiB,host_mode:backed");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_eight_threads_random_malloc_free),
        cmocka_unit_test(test_blocks_freed_by_other_threads),
        cmocka_unit_test(test_concurrent_configure_keeps_every_update),
    };
    return cmocka_run_group_tests_name("threads", tests, NULL, NULL);
}
