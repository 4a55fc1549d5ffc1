/* A process's life around tally: racing into lazy initialisation and the
 * time after the exit report (fork: tests/test_api_fork.c).
 *
 * Every case runs in a child: this binary re-executed (/proc/self/exe
 * --child ROLE, tests/ledgerutil.h) with its own TALLY_CONF, so tally starts
 * from nothing in each, and the parent reads the child's output and status.
 *
 * A tally_configure racing the first use is applied either before
 * initialisation or not at all (then refused as not a runtime key).
 *
 * The diagnostics sink must not call tally: it runs under the sink lock
 * (and, for an OOM report, the device's lock); the last test pins that. */
#include "ledgerutil.h"

#include <signal.h>
#include <stdatomic.h>
#include <time.h>

#define MB LU_MiB
#define BASE "backend:host,host_devices:2,host_mode:virtual,host_capacity:8GiB"

/* Processes of the lazy-initialisation race: 24, scaled by TALLY_TEST_SCALE. */
static long tu_runs(void)
{
    const char *s = getenv("TALLY_TEST_SCALE");
    double f = s && *s ? atof(s) : 1.0;
    if (!(f > 0) || f > 1)
        f = 1.0;
    long n = (long)(24 * f);
    return n < 4 ? 4 : n;
}

static void quiet(void *arg, const char *text, size_t len)
{
    (void)arg;
    (void)text;
    (void)len;
}

/* ---- child: eight threads race into lazy initialisation ----------------------------- */

#define RACERS 8
static pthread_barrier_t race_go;
static int race_rc[RACERS];
static void *race_ptr[RACERS];

static void *racer(void *arg)
{
    int id = (int)(intptr_t)arg;
    tally_stats_t s;
    pthread_barrier_wait(&race_go);
    /* Each thread's first call is a different entry point. */
    switch (id) {
    case 0: race_ptr[id] = tally_malloc(MB, 0, NULL); race_rc[id] = race_ptr[id] ? 0 : -1; break;
    case 1: race_ptr[id] = tally_malloc(4096, 1, (void *)0x10); race_rc[id] = race_ptr[id] ? 0 : -1; break;
    case 2: race_rc[id] = tally_device_count() == 2 ? 0 : -1; break;
    case 3:
        race_rc[id] = tally_tag_push("racer");
        race_ptr[id] = tally_malloc(100, 0, NULL);
        if (!race_ptr[id] || strcmp(lu_tag_of(race_ptr[id]), "racer") != 0)
            race_rc[id] = -1;
        tally_tag_pop();
        break;
    case 4: race_rc[id] = tally_stage_begin("race"); break;
    case 5: race_rc[id] = tally_get_stats(1, &s); break;
    case 6: race_rc[id] = strcmp(tally_backend_name(), "host") == 0 ? 0 : -1; break;
    default: race_rc[id] = tally_init(); break;
    }
    return NULL;
}

static int child_init_race(void)
{
    pthread_t t[RACERS];
    LU_REQUIRE(pthread_barrier_init(&race_go, NULL, RACERS) == 0);
    for (int i = 0; i < RACERS; i++)
        LU_REQUIRE(pthread_create(&t[i], NULL, racer, (void *)(intptr_t)i) == 0);
    for (int i = 0; i < RACERS; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < RACERS; i++)
        if (race_rc[i] != 0) {
            printf("racer %d failed: %d\n", i, race_rc[i]);
            return 1;
        }
    LU_REQUIRE(tally_device_count() == 2);
    LU_REQUIRE(tally_check() == 0);
    LU_REQUIRE(lu_stats(0).allocation[0].current == 2 && lu_stats(1).allocation[0].current == 1);
    LU_REQUIRE(strcmp(lu_stage_of(race_ptr[0]), "race") == 0 || strcmp(lu_stage_of(race_ptr[0]), "(none)") == 0);
    LU_REQUIRE(tally_stage_end("race") == 0);
    for (int i = 0; i < RACERS; i++)
        tally_free(race_ptr[i]);
    LU_REQUIRE(tally_check() == 0);
    printf("init-race ok\n");
    return 0;
}

/* With a bad TALLY_CONF every racing thread gets the same failure, and the
 * message is printed once. */
static void *bad_racer(void *arg)
{
    int id = (int)(intptr_t)arg;
    pthread_barrier_wait(&race_go);
    if (id % 2) {
        race_ptr[id] = tally_malloc(MB, 0, NULL);
        race_rc[id] = race_ptr[id] ? 0 : strstr(tally_last_error(), "TALLY_CONF") ? -TALLY_ECONF : -1;
    } else {
        race_rc[id] = tally_init();
    }
    return NULL;
}

static int child_init_race_bad_conf(void)
{
    pthread_t t[RACERS];
    LU_REQUIRE(pthread_barrier_init(&race_go, NULL, RACERS) == 0);
    for (int i = 0; i < RACERS; i++)
        LU_REQUIRE(pthread_create(&t[i], NULL, bad_racer, (void *)(intptr_t)i) == 0);
    for (int i = 0; i < RACERS; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < RACERS; i++)
        if (race_rc[i] != -TALLY_ECONF) {
            printf("racer %d: %d, expected %d (%s)\n", i, race_rc[i], -TALLY_ECONF, tally_last_error());
            return 1;
        }
    LU_REQUIRE(tally_malloc(1, 0, NULL) == NULL);
    LU_REQUIRE(tally_device_count() == -TALLY_ECONF);
    printf("init-race-bad-conf ok\n");
    return 0;
}

/* A TALLY_CONF whose error is longer than a message holds: the message is
 * cut to 511 characters (include/tally.h), its "TALLY_CONF: " prefix kept. */
static int child_long_bad_conf(void)
{
    tally_set_sink(quiet, NULL);
    LU_REQUIRE(tally_malloc(MB, 0, NULL) == NULL);
    const char *e = tally_last_error();
    printf("length %zu\n%.50s\n", strlen(e), e);
    return 0;
}

/* tally_configure before initialisation, racing another thread's first
 * tally_malloc: either the configuration lands before initialisation reads
 * the options (host_devices:3 applies, 3 devices) or after (refused, it is
 * not a runtime key; 1 device), never half-way. */
static int cfg_rc;
static void *cfg_racer(void *arg)
{
    (void)arg;
    pthread_barrier_wait(&race_go);
    cfg_rc = tally_configure("host_devices:3,stage_report:false,leak_report:off");
    return NULL;
}

static void *malloc_racer(void *arg)
{
    (void)arg;
    pthread_barrier_wait(&race_go);
    race_ptr[0] = tally_malloc(MB, 0, NULL);
    return NULL;
}

static int child_configure_race(void)
{
    tally_set_sink(quiet, NULL);
    pthread_t a, b;
    LU_REQUIRE(pthread_barrier_init(&race_go, NULL, 2) == 0);
    LU_REQUIRE(pthread_create(&a, NULL, cfg_racer, NULL) == 0);
    LU_REQUIRE(pthread_create(&b, NULL, malloc_racer, NULL) == 0);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    LU_REQUIRE(race_ptr[0] != NULL);
    int n = tally_device_count();
    tally_free(race_ptr[0]);
    LU_REQUIRE(tally_check() == 0);
    if (!((cfg_rc == 0 && n == 3) || (cfg_rc == -TALLY_ECONF && n == 1))) {
        printf("configure returned %d and there are %d devices\n", cfg_rc, n);
        return 1;
    }
    printf("configure-race ok: %s\n", cfg_rc == 0 ? "configured first" : "initialised first");
    return 0;
}

/* ---- child: what starts the backend ---------------------------------------------------- */

/* Loading, configuring, reading the options, tags and the sink leave the
 * backend unstarted (a program can still choose its GPUs), and so does
 * freeing NULL through either entry point; the first allocation starts it. */
static int child_lazy_start(void)
{
    tally_set_sink(quiet, NULL);
    LU_REQUIRE(tally_backend_started() == 0);
    LU_REQUIRE(strcmp(tally_version(), TALLY_VERSION) == 0);
    LU_REQUIRE(tally_configure("stage_report:false,leak_report:off") == 0);
    lu_buf_t opts = {0};
    LU_REQUIRE(tally_write_options(lu_buf_write, &opts) == 0 && strstr(lu_buf_str(&opts), "backend:host"));
    lu_buf_free(&opts);
    LU_REQUIRE(tally_tag_push("early") == 0 && tally_tag_pop() == 0);
    LU_REQUIRE(tally_configure("host_devices:nonsense") != 0); /* a refused key starts nothing either */
    LU_REQUIRE(tally_backend_started() == 0);
    /* Freeing NULL, as C code and PyTorch both may, is no allocation. */
    tally_free(NULL);
    tally_torch_free(NULL, 0, 0, NULL);
    tally_torch_free(NULL, 512, 1, (void *)0x10);
    LU_REQUIRE(tally_backend_started() == 0);
    void *p = tally_malloc(MB, 1, NULL);
    LU_REQUIRE(p != NULL);
    LU_REQUIRE(tally_backend_started() == 1);
    tally_free(p);
    LU_REQUIRE(tally_backend_started() == 1);
    printf("lazy-start ok\n");
    return 0;
}

/* ---- child: reports and frees after the exit report ------------------------------------ */

static void *after[3];
static int after_armed;

/* A destructor with a priority runs after the library's own (default
 * priority), that is after the exit report. */
__attribute__((destructor(101))) static void after_exit_report(void)
{
    if (!after_armed)
        return;
    lu_buf_t ledger = {0}, leaks = {0}, summary = {0}, diag = {0};
    tally_set_sink(lu_buf_write, &diag);
    char path[400];
    snprintf(path, sizeof path, "%s", getenv("AFTER_REPORT"));
    int report = tally_write_report(path);
    int wl = tally_write_ledger(lu_buf_write, &ledger);
    int wk = tally_write_leaks(1, lu_buf_write, &leaks);
    int ws = tally_write_summary(0, 0, lu_buf_write, &summary);
    int check1 = tally_check();
    tally_free(after[0]);
    int fc = tally_free_checked(after[1], 5000, 1);
    int stage = tally_stage_end("late");
    void *again = tally_malloc(2 * MB, 1, NULL);
    tally_free(again);
    tally_free(after[2]);
    tally_empty_cache(-1);
    int check2 = tally_check();
    tally_stats_t s0, s1;
    tally_get_stats(0, &s0);
    tally_get_stats(1, &s1);
    size_t fr = 0, total = 0;
    tally_mem_get_info(0, &fr, &total);
    tally_set_sink(NULL, NULL);
    char line[700];
    int n = snprintf(line, sizeof line,
                     "after-exit: report=%d ledger=%d:%d leaks=%d:%d summary=%d:%d check=%d,%d free_checked=%d "
                     "stage_end=%d again=%s live=%lld reserved=%lld device0-free-all=%d diag=%zu\n",
                     report, wl, strstr(lu_buf_str(&ledger), "weights") != NULL, wk,
                     strstr(lu_buf_str(&leaks), "3 blocks") != NULL, ws, (int)summary.len > 1000, check1, check2, fc,
                     stage, again ? "yes" : "no", (long long)(s0.allocation[0].current + s1.allocation[0].current),
                     (long long)(s0.reserved_bytes[0].current + s1.reserved_bytes[0].current), fr == total,
                     diag.len);
    if (write(2, line, (size_t)n) < 0)
        _exit(97);
    lu_buf_free(&ledger);
    lu_buf_free(&leaks);
    lu_buf_free(&summary);
    lu_buf_free(&diag);
}

static int child_after_exit(void)
{
    LU_REQUIRE(tally_stage_begin("late") == 0);
    LU_REQUIRE(tally_tag_push("weights") == 0);
    after[0] = tally_malloc(3 * MB, 0, NULL);
    after[1] = tally_malloc(5000, 1, NULL);
    after[2] = tally_malloc(40 * MB, 0, NULL);
    LU_REQUIRE(tally_tag_pop() == 0);
    LU_REQUIRE(after[0] && after[1] && after[2]);
    after_armed = 1;
    printf("main returns with 3 blocks live and stage 'late' open\n");
    return 0;
}

/* ---- child: a sink that calls back into tally -------------------------------------------- */

/* The sink is called with the sink lock held, and for an OOM report with
 * the device's lock held too: a sink that calls tally for that device
 * waits for itself. Documented ("the sink must not call tally"); the
 * child's alarm ends it. */
static void reentrant_sink(void *arg, const char *text, size_t len)
{
    (void)arg;
    (void)text;
    (void)len;
    tally_stats_t s;
    tally_get_stats(0, &s);
}

static int child_sink_reenters(void)
{
    LU_REQUIRE(tally_init() == 0);
    tally_set_sink(reentrant_sink, NULL);
    alarm(2);
    tally_malloc(16 * LU_GiB, 0, NULL); /* the OOM report goes to the sink */
    printf("the sink returned\n");
    return 0;
}

/* ---- the tests (the parent) ----------------------------------------------------------------- */

static void test_threads_race_into_lazy_init(void **state)
{
    (void)state;
    long runs = tu_runs();
    for (long i = 0; i < runs; i++) {
        lu_child_t c;
        lu_child_run(&c, "init-race", BASE ",leak_report:off", NULL);
        LU_CHILD_EXIT(&c, 0);
        LU_HAS(c.out, "init-race ok\n");
        lu_child_free(&c);
    }
    print_message("  %ld processes, 8 threads each racing into initialisation\n", runs);
}

static void test_configure_racing_lazy_init_is_all_or_nothing(void **state)
{
    (void)state;
    long runs = tu_runs(), first = 0;
    for (long i = 0; i < runs; i++) {
        lu_child_t c;
        lu_child_run(&c, "configure-race", "backend:host,host_devices:1,host_mode:virtual,leak_report:off", NULL);
        LU_CHILD_EXIT(&c, 0);
        LU_HAS(c.out, "configure-race ok");
        first += strstr(c.out, "configured first") != NULL;
        lu_child_free(&c);
    }
    print_message("  %ld processes: the configuration came first in %ld\n", runs, first);
}

static void test_bad_conf_fails_every_racing_thread_once(void **state)
{
    (void)state;
    lu_child_t c;
    lu_child_run(&c, "init-race-bad-conf", BASE ",host_devices:0", NULL);
    LU_CHILD_EXIT(&c, 0);
    LU_HAS(c.out, "init-race-bad-conf ok\n");
    /* One line on the sink, however many threads raced. */
    LU_EQ(lu_count(c.err, "host_devices"), 1);
    LU_HAS(c.err, "tally: config: host_devices: '0' is not an integer in [1, 64]\n");
    lu_child_free(&c);
}

static void test_overlong_conf_error_is_cut_to_511_characters(void **state)
{
    (void)state;
    char conf[900];
    int n = snprintf(conf, sizeof conf, "%s,", BASE);
    memset(conf + n, 'k', 600);
    snprintf(conf + n + 600, sizeof conf - (size_t)n - 600, ":1");
    lu_child_t c;
    lu_child_run(&c, "long-bad-conf", conf, NULL);
    LU_CHILD_EXIT(&c, 0);
    LU_HAS(c.out, "length 511\nTALLY_CONF: config: unknown key 'kkkkkkkkkk");
    lu_child_free(&c);
}

static void test_backend_starts_at_first_allocation(void **state)
{
    (void)state;
    lu_child_t c;
    lu_child_run(&c, "lazy-start", BASE, NULL);
    LU_CHILD_EXIT(&c, 0);
    LU_HAS(c.out, "lazy-start ok\n");
    lu_child_free(&c);
}

static void test_reports_and_frees_after_the_exit_report(void **state)
{
    (void)state;
    char path[400], env[480];
    snprintf(path, sizeof path, "%s/after-exit.json", lu_tmpdir());
    snprintf(env, sizeof env, "AFTER_REPORT=%s", path);
    const char *const envs[] = {env, NULL};
    lu_child_t c;
    lu_child_run(&c, "after-exit", BASE ",leak_report:summary", envs);
    LU_CHILD_EXIT(&c, 0);
    /* 3 MiB + 5000 B (5120 rounded) + 40 MiB */
    const char *summary = "tally: SUMMARY: 45093888 bytes leaked in 3 blocks\n";
    LU_HAS(c.err, summary);
    const char *late = "after-exit: report=0 ledger=0:1 leaks=0:1 summary=0:1 check=0,0 free_checked=0 stage_end=0 "
                       "again=yes live=0 reserved=0 device0-free-all=1 diag=";
    LU_HAS(c.err, late);
    assert_true(lu_pos(c.err, summary) < lu_pos(c.err, late));
    /* The report written after the exit report is whole, with the three
     * blocks still live at that moment. */
    tally_json_t *root = lu_json_file(path);
    const tally_json_t *leaks = lu_jarr(root, "leaks");
    int64_t blocks = 0;
    for (size_t i = 0; i < leaks->len; i++)
        blocks += lu_jint(&leaks->items[i], "blocks");
    LU_EQ(blocks, 3);
    tally__json_free(root);
    lu_child_free(&c);
}

static void test_sink_that_calls_tally_deadlocks(void **state)
{
    (void)state;
    lu_child_t c;
    lu_child_run(&c, "sink-reenters", BASE ",leak_report:off", NULL);
    if (c.code != -SIGALRM)
        fail_msg("child exited with %d, expected to be stopped by SIGALRM (%d); stdout:\n%s", c.code, -SIGALRM,
                 c.out);
    LU_LACKS(c.out, "the sink returned");
    lu_child_free(&c);
}

static const lu_role_t roles[] = {
    {"init-race", child_init_race},
    {"init-race-bad-conf", child_init_race_bad_conf},
    {"long-bad-conf", child_long_bad_conf},
    {"configure-race", child_configure_race},
    {"lazy-start", child_lazy_start},
    {"after-exit", child_after_exit},
    {"sink-reenters", child_sink_reenters},
    {NULL, NULL},
};

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "--child") == 0)
        return lu_child_main(argv[2], roles);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threads_race_into_lazy_init),
        cmocka_unit_test(test_configure_racing_lazy_init_is_all_or_nothing),
        cmocka_unit_test(test_bad_conf_fails_every_racing_thread_once),
        cmocka_unit_test(test_overlong_conf_error_is_cut_to_511_characters),
        cmocka_unit_test(test_backend_starts_at_first_allocation),
        cmocka_unit_test(test_reports_and_frees_after_the_exit_report),
        cmocka_unit_test(test_sink_that_calls_tally_deadlocks),
    };
    int failed = cmocka_run_group_tests_name("process", tests, NULL, NULL);
    lu_tmpdir_cleanup();
    return failed;
}
