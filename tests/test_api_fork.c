/* fork and tally (lib/api/process.c): pthread_atfork handlers take every lock of
 * the library around fork, so a child never inherits a lock held by another
 * thread; the child's leak report leaves out the blocks it inherited; a
 * child whose parent started a device backend (cuda, async) is refused the
 * backend with one line, while the host backend keeps working.
 *
 * Every case runs in a child process (tests/ledgerutil.h), which forks
 * grandchildren. Each child and grandchild dies with its parent
 * (tu_die_with_parent), so a run stopped by a timeout's SIGKILL leaves no
 * fork-hammer spinning; test_children_die_with_a_suite_killed_outright
 * checks it. */
#include "ledgerutil.h"
#include "cache/cache.h" /* tally__g and the host backend's table (tests link libtally.a) */

#include <signal.h>
#include <stdatomic.h>
#include <time.h>

#define MB LU_MiB
#define BASE "backend:host,host_devices:2,host_mode:virtual,host_capacity:8GiB"

static void quiet(void *arg, const char *text, size_t len)
{
    (void)arg;
    (void)text;
    (void)len;
}

/* ---- child: fork again and again while four threads hammer tally ----------------------- */

#define HAMMERS 4
#define FORKS 40
static atomic_int stop_hammers;
static atomic_long hammer_ops;

static void *hammer(void *arg)
{
    int id = (int)(intptr_t)arg;
    char tag[32];
    void *held[8] = {0};
    unsigned seed = (unsigned)id * 7919u + 1;
    long n = 0;
    while (!atomic_load(&stop_hammers)) {
        snprintf(tag, sizeof tag, "hammer-%d-%ld", id, n % 5);
        tally_tag_push(tag); /* the names lock */
        int k = (int)(n % 8);
        tally_free(held[k]);
        seed = seed * 1103515245u + 12345u;
        held[k] = tally_malloc((size_t)(seed % (3 * MB)) + 1, (int)(seed >> 8) % 2, (void *)(intptr_t)(id + 1));
        tally_tag_pop();
        if (id == 0 && n % 16 == 0) { /* the stage lock, and every device lock in turn */
            tally_stage_begin("hammer-stage");
            tally_stage_end("hammer-stage");
        }
        if (id == 1 && n % 32 == 0) /* reports: each device lock, the sink */
            tally_write_leaks(0, quiet, NULL);
        if (id == 2 && n % 64 == 0)
            tally_empty_cache(-1); /* the host backend's lock */
        n++;
    }
    for (int k = 0; k < 8; k++)
        tally_free(held[k]);
    atomic_fetch_add(&hammer_ops, n);
    return NULL;
}

/* The grandchild: everything works and the state it inherited is whole. */
static int hammered_grandchild(void)
{
    alarm(5); /* a lock left held would block here; the alarm ends it */
    if (tally_check() != 0) {
        printf("grandchild: check: %s\n", tally_last_error());
        return 10;
    }
    void *mine[16];
    for (int i = 0; i < 16; i++)
        if (!(mine[i] = tally_malloc((size_t)(i + 1) * 100000, i % 2, NULL)))
            return 11;
    if (tally_stage_begin("grandchild") != 0 || tally_tag_push("grandchild") != 0)
        return 12;
    for (int i = 0; i < 16; i++)
        tally_free(mine[i]);
    if (tally_tag_pop() != 0 || tally_stage_end("grandchild") != 0 || tally_write_leaks(1, quiet, NULL) != 0)
        return 13;
    tally_empty_cache(-1);
    return tally_check() == 0 ? 0 : 14;
}

static int child_fork_hammer(void)
{
    tally_set_sink(quiet, NULL);
    LU_REQUIRE(tally_init() == 0);
    pthread_t t[HAMMERS];
    for (int i = 0; i < HAMMERS; i++)
        LU_REQUIRE(pthread_create(&t[i], NULL, hammer, (void *)(intptr_t)i) == 0);
    int bad = 0;
    for (int k = 0; k < FORKS; k++) {
        struct timespec pause = {0, 2000000};
        nanosleep(&pause, NULL); /* let the hammers get going */
        pid_t self = getpid();
        pid_t pid = fork();
        LU_REQUIRE(pid >= 0);
        if (pid == 0) {
            tu_die_with_parent(self);
            _exit(hammered_grandchild());
        }
        int st = 0;
        LU_REQUIRE(waitpid(pid, &st, 0) == pid);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            printf("fork %d: grandchild %s %d\n", k, WIFEXITED(st) ? "exited with" : "killed by signal",
                   WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
            bad++;
        }
    }
    atomic_store(&stop_hammers, 1);
    for (int i = 0; i < HAMMERS; i++)
        pthread_join(t[i], NULL);
    LU_REQUIRE(tally_check() == 0);
    LU_REQUIRE(lu_stats(0).allocation[0].current == 0 && lu_stats(1).allocation[0].current == 0);
    printf("fork-hammer: %d forks, %d bad, %ld operations by the other threads\n", FORKS, bad,
           atomic_load(&hammer_ops));
    return bad ? 1 : 0;
}

/* ---- child: fork while no other thread is inside tally ----------------------------------- */

#define PARKED 3
static pthread_mutex_t park_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t park_cond = PTHREAD_COND_INITIALIZER;
static int parked, released;

static void *parker(void *arg)
{
    int id = (int)(intptr_t)arg;
    char tag[32];
    snprintf(tag, sizeof tag, "parker-%d", id);
    tally_tag_push(tag);
    void *mine[16];
    for (int i = 0; i < 16; i++)
        mine[i] = tally_malloc((size_t)(i + 1) * 10000, i % 2, NULL);
    for (int i = 0; i < 16; i += 2)
        tally_free(mine[i]);
    /* Park outside tally until the fork is done. */
    pthread_mutex_lock(&park_lock);
    parked++;
    pthread_cond_broadcast(&park_cond);
    while (!released)
        pthread_cond_wait(&park_cond, &park_lock);
    pthread_mutex_unlock(&park_lock);
    for (int i = 1; i < 16; i += 2)
        tally_free(mine[i]);
    tally_tag_pop();
    return NULL;
}

static int fork_grandchild(void)
{
    alarm(20);
    /* Everything the parent had is here. */
    if (tally_check() != 0) {
        printf("grandchild: check failed: %s\n", tally_last_error());
        return 10;
    }
    tally_stats_t s0 = lu_stats(0), s1 = lu_stats(1);
    if (s0.allocation[0].current + s1.allocation[0].current != 2 + PARKED * 8) {
        printf("grandchild: %lld blocks inherited\n", (long long)(s0.allocation[0].current + s1.allocation[0].current));
        return 11;
    }
    const char *owner = getenv("FORK_BLOCK");
    void *inherited = (void *)(uintptr_t)strtoull(owner, NULL, 16);
    if (strcmp(lu_tag_of(inherited), "parent-tag") != 0 || strcmp(lu_stage_of(inherited), "parent-stage") != 0) {
        printf("grandchild: inherited block has tag %s, stage %s\n", lu_tag_of(inherited), lu_stage_of(inherited));
        return 12;
    }
    /* It keeps working: new blocks on both devices, written to (backed). */
    void *mine[32];
    for (int i = 0; i < 32; i++) {
        mine[i] = tally_malloc((size_t)(i + 1) * 300000, i % 2, NULL);
        if (!mine[i]) {
            printf("grandchild: malloc failed: %s\n", tally_last_error());
            return 13;
        }
        memset(mine[i], 0x5a, (size_t)(i + 1) * 300000);
    }
    for (int i = 0; i < 32; i++)
        tally_free(mine[i]);
    /* Its copy of the parent's blocks is its own to free. */
    tally_free(inherited);
    if (tally_stage_end("parent-stage") != 0 || tally_tag_pop() != 0) {
        printf("grandchild: stage or tag: %s\n", tally_last_error());
        return 14;
    }
    /* One block of its own stays live: the only leak its report lists. */
    tally_tag_push("grandchild-own");
    void *own = tally_malloc(123456, 1, NULL);
    tally_tag_pop();
    if (!own)
        return 17;
    char path[400];
    snprintf(path, sizeof path, "%s", getenv("FORK_REPORT"));
    if (tally_write_report(path) != 0) {
        printf("grandchild: report: %s\n", tally_last_error());
        return 15;
    }
    if (tally_check() != 0) {
        printf("grandchild: check failed: %s\n", tally_last_error());
        return 16;
    }
    printf("grandchild ok\n");
    fflush(stdout);
    return 0;
}

static int child_fork_idle(void)
{
    LU_REQUIRE(tally_stage_begin("parent-stage") == 0);
    LU_REQUIRE(tally_tag_push("parent-tag") == 0);
    void *a = tally_malloc(6 * MB, 0, NULL);
    void *b = tally_malloc(70000, 1, NULL);
    LU_REQUIRE(a && b);
    memset(a, 0x11, 6 * MB);
    pthread_t t[PARKED];
    for (int i = 0; i < PARKED; i++)
        LU_REQUIRE(pthread_create(&t[i], NULL, parker, (void *)(intptr_t)i) == 0);
    pthread_mutex_lock(&park_lock);
    while (parked < PARKED)
        pthread_cond_wait(&park_cond, &park_lock);
    pthread_mutex_unlock(&park_lock);
    char hex[32];
    snprintf(hex, sizeof hex, "%llx", (unsigned long long)(uintptr_t)a);
    setenv("FORK_BLOCK", hex, 1);
    fflush(NULL);
    pid_t self = getpid();
    pid_t pid = fork();
    LU_REQUIRE(pid >= 0);
    if (pid == 0) {
        tu_die_with_parent(self);
        int rc = fork_grandchild();
        fflush(NULL);
        _exit(rc);
    }
    int st = 0;
    LU_REQUIRE(waitpid(pid, &st, 0) == pid);
    /* The parent is untouched by what the child did. */
    LU_REQUIRE(tally_check() == 0);
    LU_REQUIRE(((unsigned char *)a)[6 * MB - 1] == 0x11);
    LU_REQUIRE(strcmp(lu_tag_of(a), "parent-tag") == 0);
    pthread_mutex_lock(&park_lock);
    released = 1;
    pthread_cond_broadcast(&park_cond);
    pthread_mutex_unlock(&park_lock);
    for (int i = 0; i < PARKED; i++)
        pthread_join(t[i], NULL);
    tally_free(a);
    tally_free(b);
    LU_REQUIRE(tally_tag_pop() == 0);
    LU_REQUIRE(tally_stage_end("parent-stage") == 0);
    LU_REQUIRE(tally_check() == 0);
    LU_REQUIRE(lu_stats(0).allocation[0].current == 0 && lu_stats(1).allocation[0].current == 0);
    printf("parent ok, grandchild status %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st));
    return WIFEXITED(st) ? WEXITSTATUS(st) : 50;
}

/* ---- child: each process's leak report lists its own blocks only ------------------------ */

static void *leak_in(const char *tag, size_t size)
{
    tally_tag_push(tag);
    void *p = tally_malloc(size, 0, NULL);
    tally_tag_pop();
    return p;
}

static int child_fork_leaks(void)
{
    void *mine = leak_in("parent-leak", 2 * MB);
    LU_REQUIRE(mine != NULL);
    fflush(NULL);
    pid_t self = getpid();
    pid_t pid = fork();
    LU_REQUIRE(pid >= 0);
    if (pid == 0) {
        tu_die_with_parent(self);
        /* The child leaks 3 MiB of its own and forks a grandchild that leaks
         * 1 MiB; each exits normally, so each prints its exit report. */
        LU_REQUIRE(leak_in("child-leak", 3 * MB) != NULL);
        fflush(NULL);
        pid_t child = getpid();
        pid_t g = fork();
        if (g == 0) {
            tu_die_with_parent(child);
            LU_REQUIRE(leak_in("grandkid-leak", MB) != NULL);
            exit(0);
        }
        int gst = 0;
        waitpid(g, &gst, 0);
        exit(WIFEXITED(gst) ? WEXITSTATUS(gst) : 60);
    }
    int st = 0;
    LU_REQUIRE(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    tally_free(mine); /* the parent leaves clean */
    printf("parent exits clean\n");
    return 0;
}

/* ---- child: a device backend is refused in a forked child -------------------------------- */

/* The host backend's functions under another name: for the fork handler this
 * is a device backend (anything but host), which is all the refusal looks at. */
static tally_backend_t device_like;

static int child_fork_device(void)
{
    LU_REQUIRE(tally_init() == 0);
    void *inherited = tally_malloc(MB, 0, NULL);
    LU_REQUIRE(inherited != NULL);
    const tally_backend_t *real = tally__g.backend;
    device_like = *real;
    device_like.name = "cuda";
    tally__g.backend = &device_like;
    fflush(NULL);
    pid_t self = getpid();
    pid_t pid = fork();
    LU_REQUIRE(pid >= 0);
    if (pid == 0) {
        tu_die_with_parent(self);
        alarm(10);
        void *p = tally_malloc(MB, 1, NULL);
        char first[300];
        snprintf(first, sizeof first, "%s", tally_last_error());
        void *q = tally_malloc(MB, 0, NULL);
        tally_free(inherited); /* refused too, quietly: the memory is the parent's */
        printf("child: malloc %s, again %s, started=%d, error: %s\n", p ? "worked" : "refused",
               q ? "worked" : "refused", tally_backend_started(), first);
        fflush(NULL);
        _exit(p || q ? 1 : 0);
    }
    int st = 0;
    LU_REQUIRE(waitpid(pid, &st, 0) == pid);
    /* The parent keeps its backend. */
    void *more = tally_malloc(MB, 1, NULL);
    LU_REQUIRE(more != NULL);
    tally_free(more);
    tally_free(inherited);
    tally__g.backend = real;
    LU_REQUIRE(tally_check() == 0);
    printf("parent ok, child status %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st));
    return WIFEXITED(st) ? WEXITSTATUS(st) : 50;
}

/* ---- child: waits for a signal, never for its work to end --------------------------------- */

/* What fork-hammer's child does when a grandchild hangs: it would go on for
 * minutes. Here it only waits; the alarm ends it should nothing else. */
static int child_wait_forever(void)
{
    alarm(60);
    pause(); /* returns only for a signal that is caught, and none is */
    return 97;
}

/* ---- the tests (the parent) ----------------------------------------------------------------- */

static void test_fork_while_other_threads_are_inside_tally(void **state)
{
    (void)state;
    lu_child_t c;
    lu_child_run(&c, "fork-hammer", BASE ",leak_report:off,stage_report:false", NULL);
    LU_CHILD_EXIT(&c, 0);
    LU_HAS(c.out, ", 0 bad,");
    print_message("  %s", c.out);
    lu_child_free(&c);
}

static void test_forked_child_keeps_working(void **state)
{
    (void)state;
    char path[400], env[480];
    snprintf(path, sizeof path, "%s/fork-child.json", lu_tmpdir());
    snprintf(env, sizeof env, "FORK_REPORT=%s", path);
    const char *const envs[] = {env, NULL};
    lu_child_t c;
    lu_child_run(&c, "fork-idle", "backend:host,host_devices:2,host_mode:backed,host_capacity:8GiB,leak_report:off",
                 envs);
    LU_CHILD_EXIT(&c, 0);
    LU_HAS(c.out, "grandchild ok\n");
    LU_HAS(c.out, "parent ok, grandchild status 0\n");
    /* The grandchild's report is its own: its pid; its leaks are the block
     * it allocated and left live, not the blocks it inherited (the parked
     * threads' and the parent's), which its ledger still holds. */
    tally_json_t *root = lu_json_file(path);
    assert_true(lu_jint(root, "pid") != c.pid);
    const tally_json_t *leaks = lu_jarr(root, "leaks");
    LU_EQ(leaks->len, 1);
    LU_STREQ(lu_jstr(&leaks->items[0], "tag"), "grandchild-own");
    LU_EQ(lu_jint(&leaks->items[0], "blocks"), 1);
    const tally_json_t *parked_row = lu_ledger_row(root, "parker-0", "parent-stage", 1);
    assert_non_null(parked_row);
    tally__json_free(root);
    lu_child_free(&c);
}

static void test_leak_report_of_a_forked_child_leaves_out_inherited_blocks(void **state)
{
    (void)state;
    lu_child_t c;
    lu_child_run(&c, "fork-leaks", BASE ",leak_report:full", NULL);
    LU_CHILD_EXIT(&c, 0);
    LU_HAS(c.out, "parent exits clean\n");
    /* The child reports its 3 MiB, the grandchild its 1 MiB, the parent none. */
    LU_EQ(lu_count(c.err, "tally: SUMMARY: 3145728 bytes leaked in 1 block\n"), 1);
    LU_EQ(lu_count(c.err, "tally: SUMMARY: 1048576 bytes leaked in 1 block\n"), 1);
    LU_EQ(lu_count(c.err, "SUMMARY"), 2);
    LU_LACKS(c.err, "parent-leak");
    LU_EQ(lu_count(c.err, "child-leak"), 1); /* the grandchild does not list it */
    lu_child_free(&c);
}

static void test_forked_child_refuses_a_device_backend(void **state)
{
    (void)state;
    lu_child_t c;
    lu_child_run(&c, "fork-device", BASE ",leak_report:off", NULL);
    LU_CHILD_EXIT(&c, 0);
    const char *why = "backend cuda: CUDA cannot be used in a forked child (fork after CUDA started); start workers "
                      "with multiprocessing's 'spawn'";
    LU_HAS(c.out, "child: malloc refused, again refused, started=1, error: ");
    LU_HAS(c.out, why);
    LU_HAS(c.out, "parent ok, child status 0\n");
    /* One line on the sink, however many calls were refused. */
    LU_EQ(lu_count(c.err, "forked child"), 1);
    char line[400];
    snprintf(line, sizeof line, "tally: %s\n", why);
    LU_HAS(c.err, line);
    lu_child_free(&c);
}

/* A suite killed outright (a mutation run's timeout sends SIGKILL, which no
 * clean-up of the suite sees) leaves no child running: a child started by
 * lu_child_start dies with the process that started it. The test stands in
 * for the suite with a process of its own (the middle one), which starts a
 * child that would wait a minute and is then killed with SIGKILL; this
 * process adopts the orphan (a subreaper) and must see it killed at once. */
static void test_children_die_with_a_suite_killed_outright(void **state)
{
    (void)state;
    assert_int_equal(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(NULL);
    pid_t middle = fork();
    assert_true(middle >= 0);
    if (middle == 0) {
        close(fds[0]);
        lu_child_t c;
        lu_child_start(&c, "wait-forever", BASE ",leak_report:off", NULL);
        if (write(fds[1], &c.pid, sizeof c.pid) != (ssize_t)sizeof c.pid)
            _exit(1);
        struct timespec settle = {0, 100000000}; /* the child is waiting by now */
        nanosleep(&settle, NULL);
        raise(SIGKILL);
    }
    close(fds[1]);
    pid_t orphan = -1;
    assert_int_equal(read(fds[0], &orphan, sizeof orphan), (ssize_t)sizeof orphan);
    close(fds[0]);
    int st = 0;
    assert_int_equal(waitpid(middle, &st, 0), middle);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    /* The orphan is this process's now; it must be gone within 5 seconds
     * (it is killed the moment its parent dies). */
    pid_t got = 0;
    for (int i = 0; i < 500 && got == 0; i++) {
        got = waitpid(orphan, &st, WNOHANG);
        if (got == 0) {
            struct timespec tick = {0, 10000000};
            nanosleep(&tick, NULL);
        }
    }
    if (got == 0) {
        kill(orphan, SIGKILL);
        waitpid(orphan, &st, 0);
        fail_msg("the child of a process killed with SIGKILL was still running 5 s later");
    }
    assert_int_equal(got, orphan);
    assert_true(WIFSIGNALED(st));
    assert_int_equal(WTERMSIG(st), SIGKILL);
    assert_int_equal(prctl(PR_SET_CHILD_SUBREAPER, 0), 0);
}

static const lu_role_t roles[] = {
    {"fork-hammer", child_fork_hammer},
    {"fork-idle", child_fork_idle},
    {"fork-leaks", child_fork_leaks},
    {"fork-device", child_fork_device},
    {"wait-forever", child_wait_forever},
    {NULL, NULL},
};

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "--child") == 0)
        return lu_child_main(argv[2], roles);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fork_while_other_threads_are_inside_tally),
        cmocka_unit_test(test_forked_child_keeps_working),
        cmocka_unit_test(test_leak_report_of_a_forked_child_leaves_out_inherited_blocks),
        cmocka_unit_test(test_forked_child_refuses_a_device_backend),
        cmocka_unit_test(test_children_die_with_a_suite_killed_outright),
    };
    int failed = cmocka_run_group_tests_name("fork", tests, NULL, NULL);
    lu_tmpdir_cleanup();
    return failed;
}
