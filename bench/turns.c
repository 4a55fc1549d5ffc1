/* turns: the cost and the gain of the device lock's bias (lib/core/lock.c)
 * when threads take turns on one device, as PyTorch's forward pass (the
 * Python thread) and backward pass (the autograd engine's device thread) do.
 *
 *   turns [--pairs N] [--reps N] [--threads T]
 *
 * T threads (default 2) take turns on device 0 of the host backend: the
 * thread whose turn it is makes P allocate+free pairs (batches of 16
 * allocations, then their frees; sizes from 512 B to 64 KiB, fixed seed),
 * then hands the turn to the next, which was waiting (spinning, then
 * yielding). P runs from 1 (a hand-over every pair: the bias should never be
 * granted) to N (default 1,048,576: one thread at a time, for long).
 * Each P runs with lock_bias:true then lock_bias:false, each in a fresh
 * process (so one's policy state cannot help the other), --reps times
 * (default 5); the median wall ns per pair is printed, with the ratio and
 * the biases granted and revoked (bias on). First, what one revocation's
 * membarrier costs here, with one other thread running (the median of 5
 * batches of 1,000 calls). Output:
 *   T membarrier <us per call>
 *   T turns <P> bias <ns> nobias <ns> ratio <r> grants <g> revokes <r>   (one line per P) */
#include <tally.h>

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Internal counters (lib/core/lock.c), linked from libtally.a. */
void tally__bias_counts(uint64_t *grants, uint64_t *revokes);

#define BATCH 16
#define MAXT 8

static long per_turn, total_pairs;
static int nthreads;
static _Atomic int turn;
static _Atomic long done_pairs;

static double wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static void *worker(void *arg)
{
    int id = (int)(intptr_t)arg;
    uint64_t rng = 0x9e3779b97f4a7c15ull ^ (uint64_t)(id + 1) * 0x1234567ull;
    void *live[BATCH];
    for (;;) {
        for (int spin = 0; atomic_load_explicit(&turn, memory_order_acquire) != id; spin++) {
            if (atomic_load_explicit(&done_pairs, memory_order_relaxed) >= total_pairs)
                return NULL;
            if (spin > 100)
                sched_yield();
        }
        if (atomic_load_explicit(&done_pairs, memory_order_relaxed) >= total_pairs) {
            atomic_store_explicit(&turn, (id + 1) % nthreads, memory_order_release);
            return NULL;
        }
        for (long made = 0; made < per_turn;) {
            int n = per_turn - made < BATCH ? (int)(per_turn - made) : BATCH;
            for (int i = 0; i < n; i++) {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                live[i] = tally_malloc(512 + (size_t)(rng % (64 * 1024 - 512)), 0, NULL);
                if (!live[i]) {
                    fprintf(stderr, "turns: allocation failed: %s\n", tally_last_error());
                    exit(1);
                }
            }
            for (int i = n - 1; i >= 0; i--)
                tally_free(live[i]);
            made += n;
        }
        atomic_fetch_add_explicit(&done_pairs, per_turn, memory_order_relaxed);
        atomic_store_explicit(&turn, (id + 1) % nthreads, memory_order_release);
    }
}

/* One run in a child process: prints "<ns per pair> <grants> <revokes>". */
static void run_child(int fd, long p, int bias)
{
    char conf[128];
    snprintf(conf, sizeof conf, "backend:host,leak_report:off,stage_report:off,lock_bias:%s",
             bias ? "true" : "false");
    setenv("TALLY_CONF", conf, 1);
    if (tally_init() != 0) {
        fprintf(stderr, "turns: %s\n", tally_last_error());
        _exit(1);
    }
    per_turn = p;
    /* Warm the cache on this thread (32 takes: no bias yet), then count. */
    void *w[BATCH];
    for (int i = 0; i < BATCH; i++)
        w[i] = tally_malloc(64 * 1024, 0, NULL);
    for (int i = 0; i < BATCH; i++)
        tally_free(w[i]);
    uint64_t g0, r0, g1, r1;
    tally__bias_counts(&g0, &r0);
    pthread_t t[MAXT];
    double t0 = wall_ns();
    for (int i = 0; i < nthreads; i++)
        pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i);
    for (int i = 0; i < nthreads; i++)
        pthread_join(t[i], NULL);
    double ns = (wall_ns() - t0) / (double)atomic_load(&done_pairs);
    tally__bias_counts(&g1, &r1);
    dprintf(fd, "%.2f %llu %llu\n", ns, (unsigned long long)(g1 - g0), (unsigned long long)(r1 - r0));
    _exit(0);
}

static int run(long p, int bias, double *ns, unsigned long long *g, unsigned long long *r)
{
    int fds[2];
    if (pipe(fds) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        run_child(fds[1], p, bias);
    }
    close(fds[1]);
    char buf[128] = {0};
    ssize_t n = read(fds[0], buf, sizeof buf - 1);
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    if (n <= 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0 || sscanf(buf, "%lf %llu %llu", ns, g, r) != 3)
        return -1;
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static _Atomic int spin_stop;

static void *spinner(void *arg)
{
    (void)arg;
    while (!atomic_load_explicit(&spin_stop, memory_order_relaxed))
        ;
    return NULL;
}

/* Microseconds per MEMBARRIER_CMD_PRIVATE_EXPEDITED with one other thread
 * running; a negative value when the kernel refuses it. */
static double membarrier_us(void)
{
    if (syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) != 0)
        return -1;
    pthread_t t;
    pthread_create(&t, NULL, spinner, NULL);
    double us[5];
    for (int k = 0; k < 5; k++) {
        double t0 = wall_ns();
        for (int i = 0; i < 1000; i++)
            syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
        us[k] = (wall_ns() - t0) / 1000 / 1000;
    }
    atomic_store(&spin_stop, 1);
    pthread_join(t, NULL);
    qsort(us, 5, sizeof us[0], cmp_double);
    return us[2];
}

int main(int argc, char **argv)
{
    long max_p = 1L << 20;
    int reps = 5;
    nthreads = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--pairs") == 0)
            max_p = atol(argv[i + 1]);
        else if (strcmp(argv[i], "--reps") == 0)
            reps = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--threads") == 0)
            nthreads = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "turns: unknown option '%s' (--pairs, --reps, --threads)\n", argv[i]);
            return 2;
        }
    }
    if (max_p < 1 || reps < 1 || reps > 99 || nthreads < 1 || nthreads > MAXT) {
        fprintf(stderr, "turns: --pairs >= 1, --reps 1..99, --threads 1..%d\n", MAXT);
        return 2;
    }
    printf("T membarrier %.2f\n", membarrier_us());
    fflush(stdout);
    for (long p = 1; p <= max_p; p *= 16) {
        /* At least 2^20 pairs a run, and at least four turns each. */
        total_pairs = p * 4 * nthreads > (1L << 20) ? p * 4 * nthreads : 1L << 20;
        double on[99], off[99];
        unsigned long long g = 0, r = 0, g2, r2;
        for (int k = 0; k < reps; k++) {
            if (run(p, 1, &on[k], &g, &r) || run(p, 0, &off[k], &g2, &r2)) {
                fprintf(stderr, "turns: a run failed (P = %ld)\n", p);
                return 1;
            }
        }
        qsort(on, (size_t)reps, sizeof on[0], cmp_double);
        qsort(off, (size_t)reps, sizeof off[0], cmp_double);
        printf("T turns %ld bias %.1f nobias %.1f ratio %.3f grants %llu revokes %llu\n", p, on[reps / 2],
               off[reps / 2], on[reps / 2] / off[reps / 2], g, r);
        fflush(stdout);
    }
    return 0;
}
